"""The general patches (rankmesh.devicemesh): torch's own DeviceMesh built through
``DeviceMesh._init_process_groups`` and ``init_device_mesh`` with rankmesh's process groups must
answer exactly as stock torch does. torch is the oracle: every recipe is built twice in the same
fake world, stock and patched, and every mesh derived from it (unflattens, flattens, slices) is
compared on the mesh tensor, coordinate, local ranks, names, layout and every dim's group ranks and
backend, for random shapes, rank maps (identity, permutations, offset-plus-modes subsets and subsets
that are no layout), backend overrides and size-1 dims, seen from sampled ranks.

The worlds run on ``meshfake`` (tests/conftest.py): groups on the default backend report
``"meshfake"`` and ``"fake"`` overrides ``"fake"``, so a wrong backend is visible.
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed.device_mesh as tdm
from rankmesh import _devicemesh_torch, _torch_compat, devicemesh, patches
from rankmesh.mesh import FastDeviceMesh
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import MESHFAKE, fake_world, plant_body
from tests.mesh_helpers import outcome, ranks_of

pytestmark = [
    pytest.mark.skipif(devicemesh.INIT_PROCESS_GROUPS.recognise() is not None, reason="torch not read by the patch"),
    pytest.mark.filterwarnings("ignore:Slicing a flattened dim from root mesh"),
]


@pytest.fixture(autouse=True)
def _restored():
    devicemesh.restore()
    yield
    devicemesh.restore()


def _factor(n: int, parts: int, rnd: random.Random) -> tuple[int, ...]:
    """``n`` as a product of ``parts`` sizes (some of them 1)."""
    sizes = [1] * parts
    for p in (2, 3, 5, 7):
        while n % p == 0:
            n //= p
            sizes[rnd.randrange(parts)] *= p
    sizes[rnd.randrange(parts)] *= n
    return tuple(sizes)


def _recipe(seed: int):
    rnd = random.Random(seed)
    world = rnd.choice([8, 12, 16, 24, 32])
    kind = rnd.choice(["init", "init", "perm", "subset_layout", "subset_other"])
    numel = world
    rank_map = None
    if kind == "perm":
        rank_map = list(range(world))
        rnd.shuffle(rank_map)
    elif kind.startswith("subset"):
        numel = world // 2
        if kind == "subset_layout":
            start = rnd.choice([0, 1])
            rank_map = list(range(start, world, 2)) if rnd.random() < 0.5 else list(range(world // 2, world))
        else:
            rank_map = rnd.sample(range(world), numel)
            rank_map[0], rank_map[1] = max(rank_map[:2]), min(rank_map[:2])  # never an affine layout
    ndim = rnd.choice([1, 2, 3])
    shape = _factor(numel, ndim, rnd)
    names = tuple(f"d{i}" for i in range(ndim))
    override = {names[i]: "fake" for i in range(ndim) if rnd.random() < 0.25} or None
    steps = []
    for _ in range(rnd.randint(1, 3)):
        steps.append(rnd.random())
    return world, kind, rank_map, shape, names, override, steps, rnd.randrange(world)


def _build(kind, rank_map, shape, names, override, steps):
    """The recipe through torch's API (stock or patched): the root, then derived meshes; where
    torch raises (a non-member slicing a mesh over part of the world), the error ends the list."""
    if kind == "init":
        root = tdm.init_device_mesh(
            "cpu", shape, mesh_dim_names=names, backend_override=None if override is None else dict(override)
        )  # torch empties the dict it is given
    else:
        bo = None if override is None else tuple(tdm._normalize_backend_override(dict(override), len(shape), names))
        root = DeviceMesh(
            "cpu", torch.tensor(rank_map, dtype=torch.int).reshape(shape), mesh_dim_names=names, backend_override=bo
        )
    meshes = [root]
    current = root
    try:
        for i, r in enumerate(steps):
            dims = current.mesh_dim_names
            if r < 0.5:  # unflatten the largest dim in two
                d = max(range(len(dims)), key=lambda k: current.size(k))
                size = current.size(d)
                a = next((p for p in (2, 3, 5) if size % p == 0), 1)
                new = (f"u{i}a", f"u{i}b")
                bo = {new[0]: "fake"} if r < 0.1 else None
                current = current._unflatten(d, (a, size // a), new, backend_override=bo)
                meshes.append(current)
            elif len(dims) >= 2:  # flatten two dims (adjacent or not) of the current mesh
                sub = current[dims[0], dims[-1]]
                meshes.append(sub)
                meshes.append(sub._flatten(f"f{i}"))
            else:
                meshes.append(current[dims[0]])
    except Exception as e:  # noqa: BLE001 - compared with the other side's
        meshes.append(e)
    return meshes


def _answers(mesh) -> dict:
    if isinstance(mesh, Exception):
        return {"error": (type(mesh), str(mesh))}
    out = {
        "names": mesh.mesh_dim_names,
        "shape": tuple(mesh.shape),
        "layout": mesh._layout,
        "coordinate": mesh.get_coordinate(),
        "mesh": outcome(lambda: mesh.mesh.tolist())[0],
        "type": type(mesh).__name__,
    }
    if mesh.get_coordinate() is not None:
        groups = [mesh.get_group(i) for i in range(mesh.ndim)]
        out["groups"] = [(ranks_of(g), str(dist.get_backend(g)), g.group_desc) for g in groups]
        out["local"] = [mesh.get_local_rank(i) for i in range(mesh.ndim)]
    return out


@pytest.mark.parametrize("seed", range(48))
def test_patched_torch_meshes_answer_as_stock(seed):
    world, kind, rank_map, shape, names, override, steps, rnd_rank = _recipe(seed)
    for rank in sorted({0, world - 1, rnd_rank}):
        with fake_world(world, rank, MESHFAKE):
            stock = [_answers(m) for m in _build(kind, rank_map, shape, names, override, steps)]
        with fake_world(world, rank, MESHFAKE):
            assert devicemesh.INIT_PROCESS_GROUPS.install()
            patched_meshes = _build(kind, rank_map, shape, names, override, steps)
            patched = [_answers(m) for m in patched_meshes]
            made = devicemesh.created_groups()
            devicemesh.restore()
        assert patched == stock, (kind, shape, names, override, steps, rank)
        if kind != "subset_other":  # a rank map that is no layout: torch's own method, every group
            # only this rank's groups: at most one per dim of each mesh that made groups
            assert made <= sum(len(m.get("names") or ()) for m in stock), made


def test_init_device_mesh_patch_gives_fast_meshes_that_answer_as_stock():
    recipe = (16, "init", None, (2, 2, 4), ("pp", "dp", "tp"), {"pp": "fake"}, [0.3, 0.7, 0.9], 5)
    _, kind, rank_map, shape, names, override, steps, _ = recipe
    for rank in (0, 5, 15):
        with fake_world(16, rank, MESHFAKE):
            stock = [_answers(m) for m in _build(kind, rank_map, shape, names, override, steps)]
        with fake_world(16, rank, MESHFAKE):
            assert sorted(devicemesh.accelerate()) == ["init_device_mesh", "init_process_groups"]
            assert dist.init_device_mesh is tdm.init_device_mesh  # the re-export follows
            meshes = _build(kind, rank_map, shape, names, override, steps)
            patched = [_answers(m) for m in meshes]
            devicemesh.restore()
        assert all(type(m) is FastDeviceMesh for m in meshes)
        for s, p in zip(stock, patched):
            s.pop("type"), p.pop("type")
        assert patched == stock


def test_restore_puts_torch_back_everywhere():
    original_ipg = DeviceMesh.__dict__["_init_process_groups"]
    original_init = tdm.init_device_mesh
    assert dist.init_device_mesh is original_init
    devicemesh.accelerate()
    assert DeviceMesh.__dict__["_init_process_groups"] is not original_ipg
    assert tdm.init_device_mesh is not original_init and dist.init_device_mesh is tdm.init_device_mesh
    assert set(patches.installed()) >= {"init_process_groups", "init_device_mesh"}
    patches.restore_all()
    assert DeviceMesh.__dict__["_init_process_groups"] is original_ipg
    assert tdm.init_device_mesh is original_init and dist.init_device_mesh is original_init


def test_rankmesh_accelerate_is_the_one_line():
    import rankmesh
    from rankmesh import switch

    assert rankmesh.accelerate is switch.accelerate and rankmesh.restore is switch.restore
    try:
        assert set(rankmesh.accelerate()) >= {"init_process_groups", "init_device_mesh"}
    finally:
        rankmesh.restore()
    assert not devicemesh.INIT_PROCESS_GROUPS.installed and not devicemesh.INIT_DEVICE_MESH.installed


def test_disable_keeps_each_patch_out(disable, monkeypatch):
    disable("init_process_groups")
    assert devicemesh.accelerate() == ["init_device_mesh"]
    devicemesh.restore()
    disable("init_device_mesh,init_process_groups")
    assert devicemesh.accelerate() == []


def test_an_unread_body_keeps_torch_with_one_warning(monkeypatch):
    from rankmesh import _once

    _once.forget()
    plant_body(monkeypatch, "torch", "torch.distributed.device_mesh.DeviceMesh._init_process_groups")
    with pytest.warns(RuntimeWarning, match="init_process_groups.*body rankmesh does not know"):
        assert devicemesh.INIT_PROCESS_GROUPS.install() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert devicemesh.INIT_PROCESS_GROUPS.install() is False  # once per process
    assert not devicemesh.INIT_PROCESS_GROUPS.installed


def _torch_compat_release() -> str:
    from rankmesh._dependencies import release_of

    return release_of("torch")


def test_an_unread_release_keeps_torch(monkeypatch):
    from rankmesh import _dependencies, _once

    _once.forget()
    monkeypatch.setattr(_dependencies, "_versions", {"torch": "2.16.0"})
    reason = devicemesh.INIT_PROCESS_GROUPS.recognise()
    assert reason == "torch 2.16.0 is not a version this patch has read (supported: 2.13, 2.14, 2.15)"
    with pytest.warns(RuntimeWarning, match="not a version this patch has read"):
        assert devicemesh.INIT_PROCESS_GROUPS.install() is False


def _count_new_groups(monkeypatch) -> list:
    calls: list = []
    real = dist.new_group

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "new_group", counting)
    monkeypatch.setattr(dist.distributed_c10d, "new_group", counting)
    monkeypatch.setattr(tdm, "new_group", counting)
    return calls


def test_rank_maps_that_are_no_layout_get_torchs_own_method(monkeypatch):
    devicemesh.INIT_PROCESS_GROUPS.install()
    calls = _count_new_groups(monkeypatch)
    with fake_world(16, 3, MESHFAKE):
        DeviceMesh("cpu", torch.tensor([[3, 0], [5, 9]]), mesh_dim_names=("a", "b"))  # no layout
        assert len(calls) == 2 + 2  # torch: every group of both dims
        assert devicemesh.created_groups() == 0
        calls.clear()
        DeviceMesh("cpu", torch.tensor([[3, 5], [7, 9]]), mesh_dim_names=("a", "b"))  # 3 + (2, 4), (2, 2)
        assert len(calls) <= 2 and devicemesh.created_groups() == 2  # this rank's two groups only


def test_preserve_rank_order_gets_torchs_own_method(monkeypatch):
    if "preserve_rank_order" not in DeviceMesh.__init__.__code__.co_varnames:
        pytest.skip("torch without preserve_rank_order")
    devicemesh.INIT_PROCESS_GROUPS.install()
    calls = _count_new_groups(monkeypatch)
    with fake_world(8, 3, MESHFAKE):
        ranks = torch.tensor([[7, 6, 5, 4], [3, 2, 1, 0]])
        m = DeviceMesh("cpu", ranks, mesh_dim_names=("a", "b"), preserve_rank_order=True)
        assert calls and devicemesh.created_groups() == 0  # torch's new_group loop, not rankmesh's groups
        assert ranks_of(m.get_group("b")) == [3, 2, 1, 0]


def test_a_backend_c10d_does_not_know_raises_torchs_error():
    devicemesh.INIT_PROCESS_GROUPS.install()
    with fake_world(8, 3, MESHFAKE):
        stock_error = outcome(
            devicemesh.INIT_PROCESS_GROUPS.original(),
            tdm._MeshLayout.from_sizes_strides((2, 4)),
            torch.arange(8, dtype=torch.int),
            ("a", "b"),
            ((None, None), ("nosuchbackend", None)),
        )[1]
    with fake_world(8, 3, MESHFAKE):
        with pytest.raises(type(stock_error)) as e:
            tdm.init_device_mesh("cpu", (2, 4), mesh_dim_names=("a", "b"), backend_override={"b": "nosuchbackend"})
        assert str(e.value) == str(stock_error)


def test_later_calls_get_the_same_group_objects():
    devicemesh.INIT_PROCESS_GROUPS.install()
    with fake_world(64, 37, MESHFAKE):
        a = tdm.init_device_mesh("cpu", (4, 16), mesh_dim_names=("dp", "tp"))
        b = tdm.init_device_mesh("cpu", (4, 16), mesh_dim_names=("dp", "tp"))
        assert a.get_group("tp") is b.get_group("tp") and a.get_group("dp") is b.get_group("dp")
        assert devicemesh.created_groups() == 2
        c = tdm.init_device_mesh("cpu", (4, 16), mesh_dim_names=("dp", "sp"))  # another name: its own group
        assert c.get_group("sp") is not a.get_group("tp")
        assert ranks_of(c.get_group("sp")) == ranks_of(a.get_group("tp"))
    with fake_world(64, 37, MESHFAKE):  # a new default group: new groups
        d = tdm.init_device_mesh("cpu", (4, 16), mesh_dim_names=("dp", "tp"))
        assert devicemesh.created_groups() == 2 and ranks_of(d.get_group("tp")) == list(range(32, 48))


def test_size_one_dims_get_a_real_one_rank_group_as_in_torch():
    devicemesh.INIT_PROCESS_GROUPS.install()
    with fake_world(8, 6, MESHFAKE):
        m = tdm.init_device_mesh("cpu", (1, 8, 1), mesh_dim_names=("pp", "dp", "tp"))
        for name in ("pp", "tp"):
            assert ranks_of(m.get_group(name)) == [6] and str(dist.get_backend(m.get_group(name))) == MESHFAKE
        assert m.get_group("dp") is dist.group.WORLD  # a world-sized dim: the default group, as torch


def test_non_members_of_a_mesh_over_part_of_the_world_take_the_same_steps():
    """Members and non-members of a partial mesh draw the same group names afterwards (torch's
    hashed names count every group a rank created): a later world-wide mesh agrees on every rank."""
    devicemesh.INIT_PROCESS_GROUPS.install()
    names = {}
    for rank in (1, 9):  # rank 1 is outside ranks 8..15, rank 9 inside
        with fake_world(16, rank, MESHFAKE):
            half = DeviceMesh("cpu", torch.arange(8, 16).reshape(2, 4), mesh_dim_names=("dp", "tp"))
            assert (half.get_coordinate() is None) == (rank == 1)
            later = tdm.init_device_mesh("cpu", (2, 8), mesh_dim_names=("a", "b"))
            names[rank] = later.get_group("a").group_name if rank in (1, 9) else None
        devicemesh.restore()
        devicemesh.INIT_PROCESS_GROUPS.install()
    assert names[1] == names[9]  # ranks 1 and 9 are in one 'a' group: [1, 9]


def test_symbolic_ranks_and_tensor_subclasses_get_torchs_own_method(monkeypatch):
    devicemesh.INIT_PROCESS_GROUPS.install()
    with fake_world(8, 3, MESHFAKE):
        layout = tdm._MeshLayout.from_sizes_strides((2, 4))
        rank_map = torch.arange(8, dtype=torch.int)
        assert _devicemesh_torch._plan(layout, rank_map, ("a", "b"), ((None, None),) * 2, False) is not None
        monkeypatch.setattr(dist, "get_rank", lambda *a, **k: np.int64(3))  # not a plain int
        assert _devicemesh_torch._plan(layout, rank_map, ("a", "b"), ((None, None),) * 2, False) is None
        monkeypatch.undo()

        class Sub(torch.Tensor):
            pass

        assert (
            _devicemesh_torch._plan(layout, rank_map.as_subclass(Sub), ("a", "b"), ((None, None),) * 2, False) is None
        )


def test_an_in_place_change_of_a_rank_map_is_read_again():
    with fake_world(8, 3, MESHFAKE):
        rank_map = torch.arange(8, dtype=torch.int)
        first = _devicemesh_torch._rank_map_world(rank_map, 8)
        assert _devicemesh_torch._rank_map_world(rank_map, 8) is first  # read once
        rank_map[0], rank_map[1] = 1, 0
        again = _devicemesh_torch._rank_map_world(rank_map, 8)
        assert again is not first and again.rank_map().tolist()[:2] == [1, 0]


@pytest.mark.skipif(not hasattr(dist, "split_group"), reason="torch without split_group")
def test_a_bound_device_takes_the_split_road(monkeypatch):
    if _torch_compat.TORCH_VERSION < (2, 15):
        pytest.skip("torch 2.13's and 2.14's fake groups cannot split")
    devicemesh.INIT_PROCESS_GROUPS.install()
    with fake_world(16, 6, MESHFAKE) as default:
        default.bound_device_id = torch.device("cpu", 0)  # as device_id= binds one (nccl2 always does)
        m = tdm.init_device_mesh("cpu", (2, 2, 4), mesh_dim_names=("pp", "dp", "tp"))
        assert [ranks_of(m.get_group(n)) for n in ("pp", "dp", "tp")] == [[6, 14], [2, 6], [4, 5, 6, 7]]
        assert all(b.method == "split_group" for b in _devicemesh_torch._BUILDERS.values())


def test_the_body_check_is_kept_once_per_install(tmp_path, monkeypatch):
    """Patch.recognise() hashes torch's bodies once per install (rankmesh._verdicts): a later process
    with the same files reads the verdict; another known hash is another key."""
    from rankmesh import _patch, _verdicts

    monkeypatch.setenv(_verdicts.ENV, str(tmp_path))
    _verdicts.forget()
    hashed = []
    real = _patch.source_hash
    monkeypatch.setattr(_patch, "source_hash", lambda fn: hashed.append(fn) or real(fn))
    patch = devicemesh.INIT_PROCESS_GROUPS
    assert patch.recognise() is None and len(hashed) == 2
    _verdicts.forget()  # a new process
    assert patch.recognise() is None and len(hashed) == 2
    plant_body(monkeypatch, "torch", "torch.distributed.device_mesh.DeviceMesh._init_process_groups")
    assert patch.recognise() is not None and len(hashed) == 3  # another known hash: another key, hashed again
    _verdicts.forget()


def test_the_general_patches_and_torchtitans_install_together_in_either_order():
    pytest.importorskip("torchtitan.distributed.parallel_dims")
    import rankmesh.torchtitan as rt

    for general_first in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "something else replaced it"
            if general_first:
                devicemesh.accelerate()
            handle = rt.accelerate()
            if not general_first:
                devicemesh.accelerate()
            assert rt.PATCH.installed and devicemesh.INIT_DEVICE_MESH.installed
        handle.restore()
        devicemesh.restore()
        assert not rt.PATCH.installed and not devicemesh.INIT_DEVICE_MESH.installed


def test_bad_arguments_raise_under_the_patch_and_never_hang():
    """torch's own argument errors (duplicate names, a device index, names and dims that differ)
    through the patched name: rankmesh asks torch's own function for its text, which must be the
    unwrapped one (the replacement would come back into rankmesh and wait on its own lock). In a
    child with a deadline, so a regression fails instead of hanging the suite."""
    import subprocess
    import sys

    code = """
import torch.distributed as dist, torch.distributed.device_mesh as dm, rankmesh
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", rank=1, world_size=4, store=FakeStore())
assert sorted(rankmesh.accelerate()) == ["init_device_mesh", "init_process_groups"]
for args, kw in [(("cpu", (2, 2)), dict(mesh_dim_names=("a", "a"))), (("cuda:0", (4,)), {}),
                 (("cpu", (4,)), dict(mesh_dim_names=("a", "b")))]:
    try:
        dm.init_device_mesh(*args, **kw)
    except Exception as e:
        print(type(e).__name__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["DuplicateNameError", "MeshArgumentError", "SizeMismatchError"]
