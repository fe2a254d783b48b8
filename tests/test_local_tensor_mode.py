"""``rankmesh.init_device_mesh`` under torch's ``LocalTensorMode`` (one process simulating every
rank, as torch's own DTensor tests use it): the mesh torch builds under the mode, with no error and
no warning. On torch 2.15 the mode makes ``dist.get_rank()`` a per-rank ``SymInt`` and rankmesh hands
the call to torch's own ``init_device_mesh``; on 2.13 the rank stays an int and the fast mesh, which
the mode answers for every rank, is built. Oracle: torch's ``init_device_mesh`` / ``DeviceMesh``
under the same mode, set up as torch's tests do (fake process group on rank 0, then the mode).
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch.distributed as dist
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from tests.conftest import fake_world
from tests.mesh_helpers import MESH_MARKS

local_tensor = pytest.importorskip("torch.distributed._local_tensor")
LocalTensorMode = local_tensor.LocalTensorMode

pytestmark = MESH_MARKS

WORLD = 8


def _on_ranks(v) -> dict[int, int]:
    """A value under the mode (a SymInt holding a value per simulated rank, or an int) as a dict."""
    return {r: local_tensor._int_on_rank(v.node if isinstance(v, torch.SymInt) else v, r) for r in range(WORLD)}


def _per_rank(values) -> list[dict[int, int]]:
    """A coordinate under the mode (one value per dim) as plain dicts."""
    return [_on_ranks(v) for v in values]


# torch 2.13's mode caches coordinates by id(mesh): every mesh a test asks stays alive until the end
# of the test, so that no later mesh reuses the id of a freed one (2.15 keys the cache by content).
_ALIVE: list[DeviceMesh] = []


def _assert_same(m: DeviceMesh, tm: DeviceMesh) -> None:
    _ALIVE.extend((m, tm))
    assert m == tm and tm == m
    assert m.mesh.tolist() == tm.mesh.tolist()
    assert m.mesh_dim_names == tm.mesh_dim_names and m._layout == tm._layout and m.shape == tm.shape
    assert _per_rank(m.get_coordinate()) == _per_rank(tm.get_coordinate())
    for i in range(m.ndim):
        assert _on_ranks(m.get_local_rank(i)) == _on_ranks(tm.get_local_rank(i))


@pytest.fixture
def quiet(caplog):
    """Fails the test on any warning, or any log record at WARNING or above; keeps meshes alive."""
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    _ALIVE.clear()
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in caplog.records] == []


def test_init_device_mesh_under_local_tensor_mode_builds_torchs_mesh_quietly(quiet):
    with fake_world(WORLD, 0):
        with LocalTensorMode(WORLD):
            symbolic = not isinstance(dist.get_rank(), int)  # torch 2.15: a SymInt per rank
            names = ("dp", "cp", "tp")
            m = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
            tm = torch_init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
            assert type(m) is (DeviceMesh if symbolic else FastDeviceMesh)
            _assert_same(m, tm)
            assert _per_rank(m.get_coordinate())[2] == {r: r % 2 for r in range(WORLD)}
            # derived meshes, as torch derives them
            _assert_same(m["dp", "tp"], tm["dp", "tp"])
            _assert_same(m["dp", "cp"]._flatten("dp_cp"), tm["dp", "cp"]._flatten("dp_cp"))
            _assert_same(m._unflatten(2, (2, 1), ("t0", "t1")), tm._unflatten(2, (2, 1), ("t0", "t1")))
            # a permuted rank map and a 1-D world, as torch's tests build them under the mode
            perm = [3, 0, 6, 1, 7, 2, 4, 5]
            pm = init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "b"), rank_map=perm)
            _assert_same(pm, DeviceMesh("cpu", torch.tensor(perm).reshape(2, 4), mesh_dim_names=("a", "b")))
            _assert_same(init_device_mesh("cpu", (WORLD,)), torch_init_device_mesh("cpu", (WORLD,)))
            # DTensor runs on it for every simulated rank, as on torch's
            x = torch.arange(64, dtype=torch.float32).reshape(8, 8)
            for mesh in (m, tm):
                dt = distribute_tensor(x, mesh, [Shard(0), Replicate(), Shard(1)])
                assert torch.equal(dt.full_tensor(), x)
                assert torch.equal((dt * 2).redistribute(mesh, [Replicate()] * 3).to_local(), x * 2)
        # out of the mode again: rankmesh's own fast mesh
        assert type(init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))) is FastDeviceMesh


def test_a_fast_mesh_built_outside_the_mode_answers_inside_it(quiet):
    with fake_world(WORLD, 0):
        m = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        assert type(m) is FastDeviceMesh
        with LocalTensorMode(WORLD):
            tm = torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
            _assert_same(m, tm)
            _assert_same(m["tp"], tm["tp"])
            x = torch.arange(32, dtype=torch.float32).reshape(8, 4)
            assert torch.equal(distribute_tensor(x, m, [Shard(0), Shard(1)]).full_tensor(), x)


def test_under_the_mode_with_torchs_init_device_mesh_replaced_by_rankmeshs_nothing_recurses(quiet):
    """``rankmesh.accelerate()``'s ``init_device_mesh`` patch puts rankmesh's function in torch's
    place; handing a symbolic rank back to torch must reach torch's own, not the replacement."""
    import rankmesh.patches
    import torch.distributed.device_mesh as torch_device_mesh

    patch = rankmesh.patches.get("init_device_mesh")
    if patch.installed:  # RANKMESH_ACCELERATE=1: torch_init_device_mesh above is rankmesh's already
        pytest.skip("rankmesh's init_device_mesh patch was installed at start-up")
    with fake_world(WORLD, 0):
        assert patch.install() and torch_device_mesh.init_device_mesh is not torch_init_device_mesh
        try:
            with LocalTensorMode(WORLD):
                tm = torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))  # torch's own
                _assert_same(torch_device_mesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp")), tm)
                _assert_same(init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp")), tm)
        finally:
            patch.restore()
    assert torch_device_mesh.init_device_mesh is torch_init_device_mesh
