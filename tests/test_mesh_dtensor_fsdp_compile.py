"""The fast meshes where torch uses them: DTensor (values equal to torch's on a one-rank gloo
world), FSDP2 and torch.compile (no more graph breaks than torch's own meshes)
(helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.mesh import init_device_mesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    assert_same_mesh,
    build_both,
    ranks_of,
)
from tests.mp.rankmesh_mp import free_port

pytestmark = MESH_MARKS


@pytest.fixture
def gloo_world_of_one(monkeypatch):
    """A real one-process gloo world on loopback."""
    if not dist.is_gloo_available():
        pytest.skip("needs gloo")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
@pytest.mark.parametrize("override", [None, {0: FAKE}])
def test_dtensor_on_our_mesh_gives_torchs_values_on_a_one_rank_gloo_world(gloo_world_of_one, shape, override):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    names = tuple(f"d{i}" for i in range(len(shape)))
    o, t = build_both(shape, names, backend_override=override)
    assert_same_mesh(o, t, o, t)
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    shard = [Shard(0)] + [Shard(1)] * (len(shape) - 1)
    rep = [Replicate()] * len(shape)
    results = []
    for mesh in (o, t):
        dt = distribute_tensor(full, mesh, shard)
        assert dt.device_mesh is mesh
        r = dt.redistribute(mesh, rep)
        s = (dt * 2 + 1).sum()
        results.append((dt.to_local(), r.to_local(), dt.full_tensor(), s.full_tensor(), r.placements))
    for a, b in zip(*results):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert torch.equal(results[0][2], full)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def test_fsdp2_hsdp_and_tp_build_on_our_meshes_as_on_torchs():
    # The fake backend runs no real collective, so only structure is checked here; values are
    # checked by the 8-rank gloo tests in test_multiprocess.py.
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def build(mesh_2d, mesh_3d):
        hsdp = _mlp()
        fully_shard(hsdp, mesh=mesh_2d)
        tp = _mlp()
        parallelize_module(tp, mesh_3d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(tp, mesh=mesh_3d["dp_replicate", "dp_shard"])
        return hsdp, tp

    with fake_world(8, 5):
        o2, t2 = build_both((2, 4), ("dp_replicate", "dp_shard"))
        o3, t3 = build_both((2, 2, 2), ("dp_replicate", "dp_shard", "tp"))
        ours, theirs = build(o2, o3), build(t2, t3)
        for om, tm in zip(ours, theirs):
            for (name, p), (tname, tp) in zip(om.named_parameters(), tm.named_parameters()):
                assert name == tname
                assert isinstance(p, DTensor) and isinstance(tp, DTensor)
                assert p.placements == tp.placements
                assert p.to_local().shape == tp.to_local().shape
                assert p.device_mesh == tp.device_mesh and hash(p.device_mesh) == hash(tp.device_mesh)
                assert p.device_mesh.mesh.tolist() == tp.device_mesh.mesh.tolist()
                assert p.device_mesh.mesh_dim_names == tp.device_mesh.mesh_dim_names
                assert ranks_of(p.device_mesh.get_group(0)) == ranks_of(tp.device_mesh.get_group(0))
        # HSDP: the parameters live on our mesh itself
        for p in ours[0].parameters():
            assert p.device_mesh is o2
        # TP + HSDP: FSDP2 joins the dp and tp meshes (DeviceMesh._concatenate) into a mesh whose
        # root equals ours. (Not asserted by identity: DTensor's sharding-propagation cache keys
        # on mesh equality, so an equal mesh met earlier in the process may stand in for it; the
        # same happens to torch's own meshes.)
        for p in ours[1].parameters():
            assert p.device_mesh._get_root_mesh() == o3
            assert p.device_mesh == o3
            assert [ranks_of(g) for g in p.device_mesh.get_all_groups()] == [ranks_of(g) for g in o3.get_all_groups()]


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _compile_run(fn, *args):
    """fn compiled (eager backend, counted) and run once; (result, frames, ops, graph breaks)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cnt = CompileCounter()
    try:
        out = torch.compile(fn, backend=cnt)(*args)
        return out, cnt.frame_count, cnt.op_count, _graph_breaks()
    finally:
        torch._dynamo.reset()


# DTensor caches (sharding propagation, redistribute plans) key on mesh equality, and meshes are
# equal across worlds: an equal mesh compiled earlier in the process can stand in for ours. So
# the compile tests use dim names no other test uses, and run our mesh first.


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_compiled_dtensor_function_on_our_mesh_matches_torchs_without_more_graph_breaks(gloo_world_of_one, shape):
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    names = tuple(f"compiled{len(shape)}_{i}" for i in range(len(shape)))
    o, t = build_both(shape, names)

    def fn(x):
        mesh = x.device_mesh
        y = (x * 2 + mesh.size(0)).redistribute(placements=[Replicate()] * mesh.ndim)
        z = DTensor.from_local(y.to_local() - 1, mesh, [Replicate()] * mesh.ndim)
        sub = mesh[mesh.mesh_dim_names[-1]]
        return z.full_tensor() + mesh.get_coordinate()[0] + mesh.get_local_rank(0) + sub.size() + mesh.ndim

    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    results = {}
    for label, mesh in (("ours", o), ("torch", t)):
        x = distribute_tensor(full, mesh, [Shard(0)] + [Shard(1)] * (mesh.ndim - 1))
        got, frames, ops, breaks = _compile_run(fn, x)
        assert torch.equal(got, fn(x))  # compiled == eager
        results[label] = (got, frames, ops, breaks)
    ours, theirs = results["ours"], results["torch"]
    assert torch.equal(ours[0], theirs[0])
    assert torch.equal(ours[0], full * 2 + 1 - 1 + 1 + len(shape))
    assert ours[1] >= 1  # something was compiled at all
    assert ours[1] <= theirs[1]  # frames compiled
    assert ours[3] <= theirs[3]  # graph breaks
    assert ours[2] == theirs[2]  # the same graph


def _compiled_redistribute(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    x = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    got, *_ = _compile_run(lambda x: x.redistribute(x.device_mesh, [Replicate(), Replicate()]).to_local(), x)
    assert torch.equal(got, full)


def test_compiled_redistribute_onto_our_mesh_works_like_torchs(gloo_world_of_one):
    _compiled_redistribute(init_device_mesh("cpu", (1, 1), mesh_dim_names=("redist_a", "redist_b")))


def test_compiled_redistribute_onto_torchs_mesh_works(gloo_world_of_one):
    # The oracle of the test above: torch's own mesh, same dims, other names.
    _compiled_redistribute(torch_init_device_mesh("cpu", (1, 1), mesh_dim_names=("oracle_a", "oracle_b")))


def _compiled_flatten(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    x = distribute_tensor(torch.ones(4, 3), mesh, [Shard(0), Shard(1)])
    got, *_ = _compile_run(lambda x: x.to_local() + x.device_mesh._flatten("cflat").size(), x)
    assert torch.equal(got, torch.full((4, 3), 2.0))
    assert mesh._flatten_mapping["cflat"].mesh_dim_names == ("cflat",)


def test_compiled_flatten_of_our_mesh_works_like_torchs(gloo_world_of_one):
    _compiled_flatten(init_device_mesh("cpu", (1, 1), mesh_dim_names=("cflat_a", "cflat_b")))


def test_compiled_flatten_of_torchs_mesh_works(gloo_world_of_one):
    # The oracle of the test above.
    _compiled_flatten(torch_init_device_mesh("cpu", (1, 1), mesh_dim_names=("tflat_a", "tflat_b")))
