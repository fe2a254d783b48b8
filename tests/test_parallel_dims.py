"""rankmesh.ParallelDims against the stock-torch torchtitan build (torchtitan 183a0d2) as oracle.

On the fake backend, one process stands in for one rank at a time. The oracle is torchtitan's
construction on plain torch: ``init_device_mesh(device_type, (W,), ("world",))``, three
``_unflatten`` with a fake ``backend_override`` for disabled dims and ``batch``, and
``dataloading["batch", "cp"]._flatten("loss_mesh")``. For sampled ranks (first, last, random),
every 1-D mesh, every global mesh and every valid combination of names must have the same local
mesh, group ranks, coordinate and local ranks as stock torch. Stock torch costs O(W) per rank
(~5 s at 2**17), so the large world is checked on two ranks only.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rankmesh._stock import mesh_exists
from rankmesh._stock import stock_build as _stock_build
from rankmesh.errors import ParallelDimsError, RankmeshError, SliceOrderError, UnknownNameError
from rankmesh.parallel_dims import ParallelDims
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import fake_world

NAMES = ("pp", "batch", "loss", "dp_replicate", "fsdp", "cp", "tp", "ep", "efsdp", "etp")
GLOBAL = {
    "dataloading": ("pp", "batch", "cp", "tp"),
    "dense": ("pp", "dp_replicate", "fsdp", "tp"),
    "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
}


# -- the oracle: torchtitan's build on stock torch -----------------------------------------------


def stock_build(cfg: dict[str, int], world_size: int):
    """torchtitan 183a0d2's meshes, built by stock torch (rankmesh._stock, also the benchmark's
    baseline). Returns (world, globals, 1-D meshes, torchtitan's mesh-exists predicate)."""
    b = _stock_build(**cfg, world_size=world_size, device_type="cpu")
    return b.world_mesh, b.global_meshes, b.meshes, lambda name, degree: mesh_exists(name, degree, cfg["ep"])


def ranks(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


def assert_same_mesh(ours: DeviceMesh, theirs: DeviceMesh, what: str) -> None:
    assert ours.mesh_dim_names == theirs.mesh_dim_names, what
    assert ours.shape == theirs.shape, what
    assert torch.equal(ours.mesh, theirs.mesh), what
    assert ours.get_coordinate() == theirs.get_coordinate(), what
    assert ours.device_type == theirs.device_type, what
    for i in range(ours.ndim):
        assert ranks(ours.get_group(i)) == ranks(theirs.get_group(i)), (what, i)
        assert ours.get_local_rank(i) == theirs.get_local_rank(i), (what, i)
        assert ours.size(i) == theirs.size(i), (what, i)


def combinations():
    """Every ordered (mesh-order) combination of >= 2 names of each global mesh."""
    out = set()
    for names in GLOBAL.values():
        for k in range(2, len(names) + 1):
            out.update(itertools.combinations(names, k))
    return sorted(out)


def compare_with_stock(cfg: dict[str, int], world_size: int, rank: int, *, combos: bool = True) -> None:
    with fake_world(world_size, rank):
        world, stock_globals, stock, exists = stock_build(cfg, world_size)
        pd = ParallelDims(**cfg, world_size=world_size)
        ours_world = pd.build_mesh(device_type="cpu")
        assert_same_mesh(ours_world, world, "world")
        assert set(pd._meshes) == set(NAMES)
        for name in NAMES:
            assert_same_mesh(pd._meshes[name], stock[name], name)
            opt = pd.get_optional_mesh(name)
            if exists(name, stock[name].size()):
                assert opt is pd._meshes[name]
            else:
                assert opt is None
        for gname, mesh in pd._global_meshes.items():
            assert_same_mesh(mesh, stock_globals[gname], gname)
        if not combos:
            return
        for combo in combinations():
            got = pd.get_optional_mesh(list(combo))
            if not all(exists(n, stock[n].size()) for n in combo):
                assert got is None, combo
                continue
            assert got is not None, combo
            holders = [g for g, names in GLOBAL.items() if set(combo) <= set(names)]
            for g in holders:  # equal to the slice of every global mesh that holds the names
                assert_same_mesh(got, stock_globals[g][combo], f"{combo} vs {g}")


CONFIGS = [
    # (config, world size)
    (dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1), 8),  # torchtitan's test
    (dict(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1), 1),
    (dict(dp_replicate=2, dp_shard=-1, cp=2, tp=2, pp=2, ep=4, etp=1), 64),
    (dict(dp_replicate=1, dp_shard=2, cp=2, tp=4, pp=3, ep=4, etp=4), 48),
    (dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=4, etp=1), 8),  # efsdp of size 1
    (dict(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1), 16),  # pure FSDP, batch = W
    (dict(dp_replicate=3, dp_shard=1, cp=1, tp=1, pp=5, ep=1, etp=1), 15),  # DDP x PP
]


@pytest.mark.parametrize("cfg, W", CONFIGS, ids=[f"W{w}-{i}" for i, (_, w) in enumerate(CONFIGS)])
def test_equals_stock_torch(cfg, W):
    rng = random.Random(W)
    sample = {0, W - 1} | {rng.randrange(W) for _ in range(6)}
    if W <= 16:
        sample = set(range(W))
    for rank in sorted(sample):
        compare_with_stock(cfg, W, rank)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {
            "dp_replicate": st.sampled_from([1, 2, 3]),
            "dp_shard": st.sampled_from([1, 2, 4]),
            "cp": st.sampled_from([1, 2]),
            "tp": st.sampled_from([1, 2, 4]),
            "pp": st.sampled_from([1, 2]),
        }
    ),
    st.sampled_from([1, 2, 4, 8]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_random_configs_equal_stock_torch(deg, ep, etp_is_tp, rng):
    W = deg["dp_replicate"] * deg["dp_shard"] * deg["cp"] * deg["tp"] * deg["pp"]
    etp = deg["tp"] if (etp_is_tp and ep > 1) else 1
    fsdp_tp = deg["dp_shard"] * deg["cp"] * deg["tp"]
    if fsdp_tp % (ep * etp):
        pd = ParallelDims(**deg, ep=ep, etp=etp, world_size=W)  # accepted, as torchtitan does
        with pytest.raises(ParallelDimsError, match="must divide"):
            pd.layouts  # noqa: B018 - the first use of the degrees (build_mesh reads them too)
        return
    cfg = {**deg, "ep": ep, "etp": etp}
    compare_with_stock(cfg, W, rng.randrange(W))


@pytest.mark.parametrize("rank", [2**17 - 1, 77_777])
def test_equals_stock_torch_at_2_17(rank):
    """The benchmark config (docs/design.md) at W = 131,072 (stock torch takes ~5 s per rank here)."""
    cfg = dict(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1)
    compare_with_stock(cfg, 2**17, rank, combos=False)


def test_large_world_many_ranks_cheaply():
    """At 2**17, many ranks: our meshes against numpy (no stock build, which costs ~5 s each)."""
    import numpy as np

    W = 2**17
    cfg = dict(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1)
    pd = ParallelDims(**cfg, world_size=W)
    order = GLOBAL["dense"]
    sizes = [pd.pp, pd.dp_replicate, pd.dp_shard * pd.cp, pd.tp]
    grid = np.arange(W).reshape(sizes)
    rng = random.Random(0)
    for rank in [0, W - 1] + [rng.randrange(W) for _ in range(8)]:
        with fake_world(W, rank):
            pd = ParallelDims(**cfg, world_size=W)
            pd.build_mesh(device_type="cpu")
            coord = tuple(int(c) for c in np.argwhere(grid == rank)[0])
            for i, name in enumerate(order):
                index = tuple(slice(None) if j == i else c for j, c in enumerate(coord))
                assert ranks(pd._meshes[name].get_group()) == sorted(grid[index].tolist()), name
                assert pd._meshes[name].get_coordinate() == (coord[i],)
            hsdp = pd.get_mesh(["dp_replicate", "fsdp"])
            assert hsdp.mesh.tolist() == grid[coord[0], :, :, coord[3]].tolist()


# -- validation --------------------------------------------------------------------------------


def make(**kw):
    cfg = dict(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    cfg.update(kw)
    return ParallelDims(**cfg)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(dp_replicate=0), "dp_replicate = 0"),
        (dict(tp=-2), "tp = -2"),
        (dict(cp=0), "cp = 0"),
        (dict(pp=0), "pp = 0"),
        (dict(ep=0), "ep = 0"),
        (dict(etp=0), "etp = 0"),
        (dict(dp_shard=0), "dp_shard must -1 or >=1"),
        (dict(dp_shard=-2), "dp_shard must -1 or >=1"),
        (dict(dp_shard=-1, tp=4, world_size=2), "leaves no rank"),
        (dict(dp_replicate=2, dp_shard=2, tp=2, world_size=10), r"Invalid parallel dims.*WORLD_SIZE\(10\)"),
        (dict(tp=4, ep=2, etp=2, world_size=4), "ETP=TP or ETP=1"),
        (dict(tp=2.0, world_size=2), "tp must be an int"),
    ],
)
def test_validation(kw, match):
    with pytest.raises(ParallelDimsError, match=match) as ei:
        make(**kw)
    # torchtitan raises AssertionError; rankmesh's errors are ValueErrors
    assert isinstance(ei.value, AssertionError) and isinstance(ei.value, ValueError)
    assert ei.value.field


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(dp_shard=2, ep=3, world_size=2), "ep \\* etp = 3 \\* 1 = 3 must divide"),
        (dict(dp_shard=1, tp=2, ep=2, etp=2, world_size=2), "must divide dp_shard \\* cp \\* tp"),
    ],
)
def test_sparse_mesh_that_does_not_divide_fails_at_first_use(kw, match):
    """torchtitan's constructor accepts these (its own tests build one, ep=3 over 4 ranks, and
    never mesh it); rankmesh raises where the degrees are first used, before any group exists."""
    pd = make(**kw)
    with pytest.raises(ParallelDimsError, match=match):
        pd.layouts  # noqa: B018
    with fake_world(kw["world_size"], 0):
        with pytest.raises(ParallelDimsError, match=match):
            pd.build_mesh(device_type="cpu")
        assert pd._meshes == {}


def test_dp_shard_auto_and_properties():
    pd = make(dp_replicate=2, dp_shard=-1, tp=2, world_size=8)
    assert pd.dp_shard == 2
    assert (pd.dp_enabled, pd.dp_replicate_enabled, pd.dp_shard_enabled, pd.fsdp_enabled) == (True,) * 4
    assert (pd.cp_enabled, pd.pp_enabled, pd.ep_enabled, pd.etp_enabled) == (False,) * 4
    assert pd.tp_enabled and pd.dp_cp_enabled
    pd = make(cp=2, world_size=2)
    assert not pd.dp_enabled and pd.cp_enabled and pd.dp_cp_enabled and pd.fsdp_enabled
    pd = make(dp_replicate=2, dp_shard=3, cp=2, world_size=12)
    assert pd.fsdp_gradient_divide_factor == 12
    pd = make(dp_replicate=2, dp_shard=2, cp=2, tp=3, pp=2, world_size=48)
    assert pd.non_data_parallel_size == 12
    pd = make(dp_replicate=2, cp=2, tp=4, world_size=16)
    assert pd.seq_len_divisor == 16
    pd = make(dp_shard=2, ep=2, world_size=2)
    assert pd.ep_enabled and not pd.etp_enabled
    # a dataclass like torchtitan's
    assert ParallelDims(1, 1, 1, 1, 1, 1, 1, 1) == make()
    assert "dp_replicate=1" in repr(make())


def test_fingerprint_is_a_function_of_the_config():
    a = make(dp_replicate=2, dp_shard=-1, tp=2, world_size=8)
    b = make(dp_replicate=2, dp_shard=2, tp=2, world_size=8)
    c = make(dp_replicate=1, dp_shard=4, tp=2, world_size=8)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert 0 <= a.fingerprint < 2**64


# -- access semantics (torchtitan's) ------------------------------------------------------------


@pytest.fixture
def built():
    cfg = dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1)
    with fake_world(8, 5):
        pd = ParallelDims(**cfg, world_size=8)
        yield pd


def test_lazy_build_and_idempotence(built):
    pd = built
    assert pd._meshes == {} and pd._world_mesh is None and pd.build_report is None
    assert pd.get_optional_mesh("tp") is not None  # builds on first use
    assert set(pd._meshes) == set(NAMES)
    world, report, meshes = pd.world_mesh, pd.build_report, dict(pd._meshes)
    assert pd.build_mesh() is world
    assert pd.build_mesh(device_type="cpu") is world
    assert pd.build_report == report and pd._meshes == meshes
    with pytest.raises(RankmeshError, match="already built"):
        pd.build_mesh(device_type="cuda")
    assert world.size() == 8 and world.mesh_dim_names == ("world",)
    assert world.device_type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_world_mesh_property_builds(built):
    assert built.world_mesh.size() == 8
    assert built._meshes


def test_sizes_and_one_dimensional_meshes(built):
    pd = built
    pd.build_mesh(device_type="cpu")
    sizes = {k: v.size() for k, v in pd._meshes.items()}
    assert sizes == dict(pp=1, batch=4, loss=4, dp_replicate=2, fsdp=2, cp=1, tp=2, ep=1, efsdp=4, etp=1)
    assert set(pd.get_all_one_dimensional_meshes()) == {"dp_replicate", "fsdp", "tp", "batch", "loss", "efsdp"}
    assert pd._meshes["loss"].mesh_dim_names == ("loss_mesh",)
    assert pd.get_mesh(["dp_replicate", "fsdp"]).shape == (2, 2)
    assert pd.get_optional_mesh(["dp_replicate", "efsdp"]) is None  # efsdp disabled while ep == 1
    assert pd.get_optional_mesh(["ep", "etp"]) is None
    assert dist.get_backend(pd._meshes["batch"].get_group()) == "fake"


def test_unknown_names(built):
    built.build_mesh(device_type="cpu")
    with pytest.raises(ValueError, match="Invalid mesh dim: 'invalid_mesh'") as ei:
        built.get_mesh("invalid_mesh")
    assert isinstance(ei.value, UnknownNameError)
    with pytest.raises(ValueError, match="Invalid mesh dim"):
        built.get_optional_mesh(["tp", "nope"])
    with pytest.raises(ValueError, match="Invalid mesh dim"):
        built.get_optional_mesh(["loss_mesh"])  # the dim's name is not a mesh name


def test_invalid_combinations(built):
    built.build_mesh(device_type="cpu")
    with pytest.raises(ValueError, match="Invalid mesh name combinations"):
        built.get_mesh(["batch", "fsdp"])
    with pytest.raises(ValueError, match="Invalid mesh name combinations"):
        built.get_optional_mesh(["loss", "tp"])
    # out of mesh order: torch's slicing error, as in torchtitan
    with pytest.raises(KeyError):
        built.get_mesh(["tp", "fsdp"])


def test_disabled_dims(built):
    built.build_mesh(device_type="cpu")
    for name in ("pp", "cp", "ep", "etp"):
        assert built.get_optional_mesh(name) is None
        with pytest.raises(ValueError, match="not available.*enabled \\(size > 1\\)"):
            built.get_mesh(name)
    with pytest.raises(ValueError, match="all enabled"):
        built.get_mesh(["pp", "tp"])
    assert built.get_optional_mesh(["dp_replicate"]) is built._meshes["dp_replicate"]


def test_efsdp_exists_whenever_ep_gt_1():
    with fake_world(8, 0):
        pd = ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=4, etp=1, world_size=8)
        pd.build_mesh(device_type="cpu")
        efsdp = pd.get_mesh("efsdp")
        assert efsdp.size() == 1
        assert pd.get_mesh(["dp_replicate", "efsdp", "ep"]).shape == (2, 1, 4)
        assert "efsdp" not in pd.get_all_one_dimensional_meshes()  # size 1


def test_single_rank():
    with fake_world(1, 0):
        pd = ParallelDims(1, 1, 1, 1, 1, 1, 1, 1)
        world = pd.build_mesh(device_type="cpu")
        assert world.size() == 1
        assert all(m.size() == 1 for m in pd._meshes.values())
        assert pd.get_all_one_dimensional_meshes() == {}
        assert pd.get_optional_mesh(["dp_replicate", "fsdp"]) is None
        # every dim is world-sized: the default group, except the disabled dims torchtitan
        # overrides to fake, which share one 1-rank fake group (torch honours the override too)
        rep = pd.build_report
        assert (rep.created, rep.fake) == (1, 1)


def test_build_needs_the_right_world():
    from rankmesh.errors import DistributedStateError

    with fake_world(16, 0):
        pd = ParallelDims(2, 2, 1, 2, 1, 1, 1, 8)
        with pytest.raises(DistributedStateError, match="16 ranks"):
            pd.build_mesh(device_type="cpu")
        assert pd._meshes == {}


@pytest.mark.parametrize(
    "request_names",
    [["fsdp", "dp_replicate"], ["tp", "dp_replicate", "fsdp"], ["ep", "efsdp"], ["tp", "batch"]],
)
def test_get_mesh_out_of_mesh_order_raises_torchs_error(request_names):
    """torchtitan users see torch's error for a request out of mesh order: a KeyError with
    torch's message (rankmesh's SliceOrderError appends the order that works)."""
    cfg = dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=2, etp=1)
    with fake_world(8, 5):
        _, stock_globals, _, _ = stock_build(cfg, 8)
        pd = ParallelDims(**cfg, world_size=8)
        pd.build_mesh(device_type="cpu")
        owner = next(m for m in stock_globals.values() if set(request_names) <= set(m.mesh_dim_names))
        with pytest.raises(KeyError) as theirs:
            owner[tuple(request_names)]
        with pytest.raises(KeyError) as ours:
            pd.get_mesh(request_names)
        assert isinstance(ours.value, SliceOrderError)
        assert ours.value.args[0].startswith(theirs.value.args[0].rstrip(".")), (ours.value, theirs.value)
