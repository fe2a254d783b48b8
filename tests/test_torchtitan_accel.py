"""``rankmesh.torchtitan.accelerate()`` against the installed torchtitan 0.3.0, stock torch being
the oracle: the same ``ParallelDims`` is built twice in one simulated world, once by torchtitan on
torch's DeviceMesh and once by torchtitan on rankmesh's, and everything torchtitan hands out is
compared: every 1-D mesh, every multi-axis request (existing or not), ``spmd_meshes()``,
``get_all_one_dimensional_meshes()``, ``get_activated_mesh``/``resolve_mesh``, mesh names, mesh
tensors, coordinates, group ranks and group backends, for all three ``spmd_backend``s.

Backends: the worlds run on ``meshfake`` (tests/conftest.py), the fake process group registered
under another name, so that a group on the default backend (``titanfake``) and one torchtitan overrode to ``fake`` can
be told apart.

No timing is asserted; the benchmarks measure speed.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh import _dependencies, _mesh_check, _once
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

tpd = pytest.importorskip("torchtitan.distributed.parallel_dims", reason="torchtitan 0.3.0 is a test dependency")
import rankmesh.torchtitan as rt  # noqa: E402
from rankmesh.mesh import FastDeviceMesh  # noqa: E402

from tests.conftest import MESHFAKE, fake_world  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _mesh_check.fast_meshes_available(),
    reason=f"rankmesh falls back to torch's own DeviceMesh on torch {torch.__version__}",
)

BACKENDS = ("spmd_types", "partial_dtensor", "full_dtensor")
DEFAULT_BACKEND = MESHFAKE
ALL_AXES = ("pp", "dp", "dp_replicate", "dp_shard", "fsdp", "cp", "tp", "ep", "efsdp", "batch", "loss")


@pytest.fixture(autouse=True)
def _cpu_and_restored(monkeypatch):
    # torchtitan picks "cuda" when it finds no accelerator; its own tests patch this the same way.
    monkeypatch.setattr(tpd, "device_type", "cpu")
    yield
    assert not rt.is_accelerated(), "a test left torchtitan accelerated"


def titan_world(world_size: int, rank: int):
    return fake_world(world_size, rank, DEFAULT_BACKEND)


def make_pd(cfg: dict, world: int, backend: str):
    return tpd.ParallelDims(**cfg, world_size=world, spmd_backend=backend)


def build(cfg: dict, world: int, backend: str, *, accelerated: bool):
    """One torchtitan ParallelDims with its meshes built, and the process groups that took."""
    before = set(c10d._world.pg_map)
    pd = make_pd(cfg, world, backend)
    if accelerated:
        with rt.accelerate() as acc:
            assert acc.active
            pd.build_mesh()
    else:
        pd.build_mesh()
    created = [pg for pg in c10d._world.pg_map if pg not in before]
    return pd, created


def backend_of(pg) -> str:
    return str(dist.get_backend(pg))


def describe_mesh(mesh):
    """Everything torchtitan's callers read from a mesh, on this rank."""
    if mesh is None:
        return None
    groups = [mesh.get_group(i) for i in range(mesh.ndim)]
    return {
        "names": mesh.mesh_dim_names,
        "shape": tuple(mesh.shape),
        "mesh": mesh.mesh.tolist(),
        "coordinate": mesh.get_coordinate(),
        "local_ranks": [mesh.get_local_rank(i) for i in range(mesh.ndim)],
        "group_ranks": [dist.get_process_group_ranks(g) for g in groups],
        "backends": [backend_of(g) for g in groups],
        "device_type": mesh.device_type,
    }


def outcome(fn, *args, **kwargs):
    """A call's mesh description, or the error it raised (type and message)."""
    try:
        return ("ok", describe_mesh(fn(*args, **kwargs)))
    except Exception as e:  # noqa: BLE001 - compared between stock and accelerated
        return ("raised", tuple(c.__name__ for c in type(e).__mro__), str(e.args[0]) if e.args else "")


def same_outcome(stock, ours) -> bool:
    """Equal, or the same error: rankmesh raises a subclass of torch's class (e.g. SliceOrderError
    is a KeyError) whose message is torch's, followed by how to fix it."""
    if stock == ours:
        return True
    if not (isinstance(stock, tuple) and isinstance(ours, tuple) and ours[0] == "raised"):
        return False
    if ours[1][0] == "DuplicateNameError":
        # A request that names one axis twice (resolve_mesh(["dp", "dp_shard"]) under
        # full_dtensor unfolds to dp_replicate, dp_shard, dp_shard): torch slices a mesh with a
        # repeated dim, which torchtitan then rejects with a ValueError, or hands out. rankmesh
        # refuses the slice itself, with a ValueError that says so (a deliberate difference).
        if stock[0] == "ok":
            names = stock[1]["names"]
            return len(set(names)) < len(names)
        return "ValueError" in stock[1]
    if stock[0] != "raised":
        return False
    return stock[1][0] in ours[1] and ours[2].startswith(stock[2].rstrip("."))


def requests(pd, *, max_len: int | None) -> list[tuple[str, ...]]:
    """Every ordered request of axis names that torchtitan knows (global meshes' dims and the
    1-D names), up to ``max_len`` names, in and out of mesh order."""
    names = sorted(set(pd._single_axis_meshes) | {n for m in pd._global_meshes.values() for n in m.mesh_dim_names})
    out = []
    for k in range(1, (max_len or len(names)) + 1):
        for combo in itertools.permutations(names, k):
            out.append(combo)
    return out


def snapshot(pd, *, max_len: int | None = 3, orders: bool = True) -> dict:
    """What torchtitan's ParallelDims answers, in comparable form."""
    snap: dict = {}
    snap["world"] = describe_mesh(pd.world_mesh)
    snap["single"] = {k: describe_mesh(v) for k, v in pd._single_axis_meshes.items()}
    snap["global"] = {k: describe_mesh(v) for k, v in pd._global_meshes.items()}
    snap["one_d"] = {k: describe_mesh(v) for k, v in pd.get_all_one_dimensional_meshes().items()}
    snap["spmd"] = [describe_mesh(m) for m in pd.spmd_meshes()]
    snap["spmd_dense"] = outcome(pd.spmd_dense_mesh) if pd.spmd_backend == "spmd_types" else None
    snap["spmd_sparse"] = outcome(pd.spmd_sparse_mesh) if pd.spmd_backend == "spmd_types" else None
    snap["dense_tp"] = outcome(pd.get_dense_tp_mesh)
    reqs = requests(pd, max_len=max_len)
    if not orders:
        reqs = [r for r in reqs if list(r) == sorted(r)]
    for r in reqs:
        key = ",".join(r)
        snap[f"optional:{key}"] = outcome(pd.get_optional_mesh, list(r))
        snap[f"singleton:{key}"] = outcome(pd.get_optional_mesh, list(r), include_singleton_axes=True)
        snap[f"get:{key}"] = outcome(pd.get_mesh, list(r))
    for k in (1, 2, 3):
        for axes in itertools.combinations(ALL_AXES, k):
            snap[f"activated:{axes}"] = outcome(pd.get_activated_mesh, list(axes))
            snap[f"resolve:{axes}"] = outcome(pd.resolve_mesh, list(axes))
    # Which requests torchtitan cached (those that gave a mesh); repeated names aside (see above).
    snap["multi_cache"] = sorted(k for k in pd._multi_axis_meshes if len(set(k)) == len(k))
    return snap


def assert_same(stock: dict, ours: dict) -> None:
    assert stock.keys() == ours.keys()
    diffs = [k for k in stock if not same_outcome(stock[k], ours[k])]
    assert not diffs, "\n".join(f"{k}:\n  stock: {stock[k]}\n  ours:  {ours[k]}" for k in diffs[:5])


def partitions(created) -> set:
    """The distinct (sorted member ranks, backend, description ``mesh_<dim name>``) of process
    groups created on this rank: rankmesh shares a group between dims of the same name only
    (FSDP2 needs distinct groups for distinct meshes)."""
    return {(tuple(dist.get_process_group_ranks(pg)), backend_of(pg), pg.group_desc) for pg in created}


def check_config(cfg: dict, world: int, rank: int, backend: str, *, max_len: int | None = 3) -> None:
    with titan_world(world, rank):
        stock_pd, stock_pgs = build(cfg, world, backend, accelerated=False)
        ours_pd, our_pgs = build(cfg, world, backend, accelerated=True)
        assert type(ours_pd.world_mesh) is FastDeviceMesh
        assert type(stock_pd.world_mesh) is not FastDeviceMesh
        assert_same(snapshot(stock_pd, max_len=max_len), snapshot(ours_pd, max_len=max_len))
        # One process group per distinct partition (and backend) and dim name on this rank; stock
        # torch creates one per dim per unflatten.
        assert len(our_pgs) == len(partitions(our_pgs)), [dist.get_process_group_ranks(p) for p in our_pgs]
        assert partitions(our_pgs) <= partitions(stock_pgs) | {(tuple(range(world)), DEFAULT_BACKEND, "mesh_default")}
        assert len(our_pgs) <= len(stock_pgs)


def valid_configs(world: int, rnd: random.Random, n: int) -> list[dict]:
    """Random torchtitan 0.3.0 configurations of ``world`` ranks (ep divides dp_shard*cp*tp)."""
    out = []
    while len(out) < n:
        rest = world
        cfg = {}
        for name in ("pp", "tp", "cp", "dp_replicate"):
            divs = [d for d in (1, 2, 4, 8) if rest % d == 0]
            cfg[name] = rnd.choice(divs)
            rest //= cfg[name]
        cfg["dp_shard"] = rnd.choice([rest, -1])
        sparse = rest * cfg["cp"] * cfg["tp"]
        cfg["ep"] = rnd.choice([d for d in (1, 2, 4, 8, 16) if sparse % d == 0])
        out.append(cfg)
    return out


# -- fidelity: fake backend, sampled ranks -----------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "cfg",
    [
        dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1),  # torchtitan's docstring example
        dict(dp_replicate=1, dp_shard=1, cp=1, tp=8, pp=1, ep=1),  # size-1 fsdp / dp_shard stay real
        dict(dp_replicate=1, dp_shard=2, cp=2, tp=1, pp=2, ep=4),  # ep over dp_shard x cp
        dict(dp_replicate=2, dp_shard=1, cp=1, tp=2, pp=2, ep=2),  # size-1 efsdp with ep > 1
    ],
    ids=["hsdp_tp", "tp_only", "pp_cp_ep", "efsdp1"],
)
def test_small_worlds_every_rank(cfg, backend):
    world = 8
    for rank in range(world):
        check_config(cfg, world, rank, backend, max_len=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_configs_sampled_ranks(backend):
    rnd = random.Random(f"titan-{backend}")
    for world in (16, 64, 512, 4096):
        for cfg in valid_configs(world, rnd, 3):
            for rank in sorted({0, world - 1, rnd.randrange(world)}):
                check_config(cfg, world, rank, backend, max_len=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_world_2_to_17(backend):
    """The issue's scale: 131,072 ranks, first, last and a random rank, one layout per backend."""
    world = 1 << 17
    cfg = dict(dp_replicate=4, dp_shard=-1, cp=2, tp=8, pp=8, ep=16)
    rnd = random.Random(f"2^17-{backend}")
    for rank in sorted({0, world - 1, rnd.randrange(world)}):
        check_config(cfg, world, rank, backend, max_len=2)


def test_process_group_counts_at_2_to_17():
    """torchtitan's default backend at 2^17: stock torch makes 18 groups on every rank."""
    world = 1 << 17
    cfg = dict(dp_replicate=4, dp_shard=-1, cp=2, tp=8, pp=8, ep=16)
    with titan_world(world, 12345):
        _, stock = build(cfg, world, "spmd_types", accelerated=False)
        _, ours = build(cfg, world, "spmd_types", accelerated=True)
        real = [p for p in ours if backend_of(p) != "fake"]
        assert len(stock) == 18
        assert len(ours) == len(partitions(ours)) < len(stock)
        # pp, dp_replicate, dp_shard, cp, tp, loss, dp, efsdp, ep, and no (ranks, dim name) twice
        assert len(real) == len({(tuple(dist.get_process_group_ranks(p)), p.group_desc) for p in real})


# -- the switch itself ---------------------------------------------------------------------------


def test_accelerate_as_call_and_context():
    assert not rt.is_accelerated()
    assert tpd.init_device_mesh is torch_init_device_mesh
    handle = rt.accelerate()
    try:
        assert handle.active and rt.is_accelerated()
        assert tpd.init_device_mesh is not torch_init_device_mesh
        again = rt.accelerate()  # harmless: no second patch, and closing it changes nothing
        assert not again.active and again.reason == "already accelerated"
        with rt.accelerate() as inner:
            assert not inner.active
        assert rt.is_accelerated()
        again.restore()
        assert rt.is_accelerated()
    finally:
        handle.restore()
    assert not rt.is_accelerated()
    assert tpd.init_device_mesh is torch_init_device_mesh
    handle.restore()  # twice is harmless
    assert tpd.init_device_mesh is torch_init_device_mesh


def test_context_restores_on_error():
    with pytest.raises(ZeroDivisionError):
        with rt.accelerate():
            assert rt.is_accelerated()
            1 / 0  # noqa: B018
    assert tpd.init_device_mesh is torch_init_device_mesh


def test_build_after_restore_is_stock():
    with titan_world(8, 3):
        with rt.accelerate():
            pass
        pd = make_pd(dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1), 8, "spmd_types")
        pd.build_mesh()
        assert type(pd.world_mesh) is not FastDeviceMesh


def test_unknown_torchtitan_version_warns_once_and_leaves_torch(monkeypatch):
    monkeypatch.setitem(_dependencies._versions, "torchtitan", "0.9.9")
    monkeypatch.setattr(_once, "_seen", set())
    unread = r"torchtitan 0\.9\.9 is not a version rankmesh has read \(supported: 0\.3\.0\)"
    with pytest.warns(RuntimeWarning, match=unread):
        acc = rt.accelerate()
    assert not acc.active and "0.9.9" in acc.reason
    assert tpd.init_device_mesh is torch_init_device_mesh
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rt.accelerate() as again:  # warned once only
            assert not again.active
    assert tpd.init_device_mesh is torch_init_device_mesh


def test_foreign_patch_is_left_alone(monkeypatch):
    def someone_elses(*a, **k):  # pragma: no cover - never called
        raise AssertionError

    monkeypatch.setattr(tpd, "init_device_mesh", someone_elses)
    monkeypatch.setattr(_once, "_seen", set())
    with pytest.warns(RuntimeWarning, match="something else replaced it"):
        acc = rt.accelerate()
    assert not acc.active
    assert tpd.init_device_mesh is someone_elses


def test_config_route_module_reexports_the_registry():
    import importlib

    import torchtitan.models.llama3.config_registry as registry

    name = "rankmesh.torchtitan.models.llama3"
    sys.modules.pop(name, None)
    try:
        mod = importlib.import_module(name)
        assert rt.is_accelerated()
        assert mod.llama3_debugmodel is registry.llama3_debugmodel
        assert mod.__wrapped_registry__ is registry
    finally:
        sys.modules.pop(name, None)
        rt.restore()
    with pytest.raises(ModuleNotFoundError, match="torchtitan has no model named 'no_such_model'"):
        importlib.import_module("rankmesh.torchtitan.models.no_such_model")


def test_config_route_through_torchtitans_config_manager():
    """torchtitan's own ConfigManager, as ``torchtitan.train`` runs it, in a fresh process: the
    ``--module`` flag alone switches the acceleration on, before any mesh exists."""
    code = (
        "from torchtitan.config import ConfigManager\n"
        "import rankmesh.torchtitan as rt\n"
        "assert not rt.is_accelerated()\n"
        "cfg = ConfigManager().parse_args(['--module', 'rankmesh.torchtitan.models.llama3', "
        "'--config', 'llama3_debugmodel'])\n"
        "assert rt.is_accelerated()\n"
        "import torchtitan.distributed.parallel_dims as p\n"
        "print('ACCELERATED', p.init_device_mesh.__module__, type(cfg).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ACCELERATED rankmesh.torchtitan" in out.stdout


def test_an_old_handle_does_not_undo_a_newer_acceleration():
    first = rt.accelerate()
    rt.restore()  # e.g. the --module route turned off by hand
    second = rt.accelerate()
    try:
        first.restore()  # belongs to a patch that is gone: must not remove the new one
        assert second.active and rt.is_accelerated()
    finally:
        second.restore()
    assert not rt.is_accelerated()


def test_the_acceleration_is_the_registrys_torchtitan_patch(disable, monkeypatch):
    """accelerate() installs the registry's "torchtitan" patch: listed while in place, undone by
    rankmesh.patches.restore_all() (torch's own init_device_mesh is back and its builds are stock),
    kept out by RANKMESH_DISABLE=torchtitan without a warning."""
    from rankmesh import patches

    assert patches.get("torchtitan") is rt.PATCH and rt.PATCH.target == f"{tpd.__name__}.init_device_mesh"
    acc = rt.accelerate()
    assert acc.active and "torchtitan" in patches.installed()
    assert tpd.init_device_mesh.__wrapped__ is torch_init_device_mesh
    patches.restore_all()
    assert tpd.init_device_mesh is torch_init_device_mesh and not rt.is_accelerated() and not acc.active
    assert "torchtitan" not in patches.installed()
    acc.restore()  # harmless now
    with titan_world(8, 3):
        pd = make_pd(dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1), 8, "spmd_types")
        pd.build_mesh()
        assert type(pd.world_mesh) is not FastDeviceMesh
    disable("torchtitan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = rt.accelerate()
    assert not off.active and "RANKMESH_DISABLE" in off.reason and tpd.init_device_mesh is torch_init_device_mesh


def test_an_old_handle_touches_nothing_after_restore_all():
    """After restore_all(), what someone installs again is theirs: an old handle's restore() leaves
    it, and the handle does not call itself active again."""
    from rankmesh import patches

    pytest.importorskip("spmd_types")
    acc = rt.accelerate()
    assert acc.active and patches.get("spmd_axis_le").installed
    patches.restore_all()
    assert patches.get("spmd_axis_le").install() and rt.PATCH.install()  # someone else's, now
    try:
        assert not acc.active
        acc.restore()
        assert patches.get("spmd_axis_le").installed and rt.PATCH.installed
    finally:
        patches.restore_all()
