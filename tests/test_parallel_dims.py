"""rankmesh.ParallelDims against ``rankmesh.bench.stock``, rankmesh's own transcription of torchtitan
183a0d2's mesh construction on stock torch.

What the oracle is: not torchtitan. ``rankmesh.bench.stock`` (also the benchmarks' baseline) is code
inside rankmesh that writes torchtitan's recipe against plain ``torch.distributed.DeviceMesh``:
``init_device_mesh(device_type, (W,), ("world",))``, three ``_unflatten`` with a fake
``backend_override`` for disabled dims and ``batch``, and
``dataloading["batch", "cp"]._flatten("loss_mesh")``. Comparing with it checks rankmesh's meshes
and process groups against stock torch's, but its reading of torchtitan (which dims exist, which
are fake, how big each is) is rankmesh's, shared with ``rankmesh.torchtitan.layouts``: a misreading of
torchtitan made in both would pass here. The independent torchtitan checks come from torchtitan
itself: tests/test_torchtitan_accel.py builds the installed torchtitan 0.3.0's own
``ParallelDims`` on stock torch and on rankmesh and compares everything it hands out;
scripts/torchtitan_upstream_tests.sh runs torchtitan's own unit tests on rankmesh; and
``test_backends_match_installed_torchtitan`` below compares backends with torchtitan 0.3.0's own
build for the dims whose rule both versions share.

On the fake backend, one process stands in for one rank at a time. For sampled ranks (first,
last, random), every 1-D mesh, every global mesh and every valid combination of names must have
the same local mesh, group ranks, coordinate and local ranks as the transcription's stock-torch
build, and every mesh dim the same backend (up to rankmesh's documented size-1 rule). Stock torch
costs O(W) per rank (~5 s at 2**17), so the large world is checked on two ranks only.
"""

from __future__ import annotations

import ast
import itertools
import random
import re

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rankmesh.bench.stock import mesh_exists
from rankmesh.bench.stock import stock_build as _stock_build
from rankmesh.errors import (
    ArgumentTypeError,
    MeshArgumentError,
    ParallelConfigError,
    ParallelDimsError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.torchtitan.parallel_dims import ParallelDims
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import MESHFAKE, fake_world

NAMES = ("pp", "batch", "loss", "dp_replicate", "fsdp", "cp", "tp", "ep", "efsdp", "etp")
GLOBAL = {
    "dataloading": ("pp", "batch", "cp", "tp"),
    "dense": ("pp", "dp_replicate", "fsdp", "tp"),
    "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
}


# -- the oracle: rankmesh.bench.stock, rankmesh's transcription of torchtitan's build on stock torch ---


def transcribed_build(cfg: dict[str, int], world_size: int):
    """torchtitan 183a0d2's meshes as rankmesh.bench.stock transcribes them, built by stock torch
    (also the benchmarks' baseline). Returns (world, globals, 1-D meshes, the transcription's
    mesh-exists predicate)."""
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


def compare_with_transcription(cfg: dict[str, int], world_size: int, rank: int, *, combos: bool = True) -> None:
    with fake_world(world_size, rank):
        world, stock_globals, stock, exists = transcribed_build(cfg, world_size)
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
def test_equals_the_transcription_on_stock_torch(cfg, W):
    rng = random.Random(W)
    sample = {0, W - 1} | {rng.randrange(W) for _ in range(6)}
    if W <= 16:
        sample = set(range(W))
    for rank in sorted(sample):
        compare_with_transcription(cfg, W, rank)


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
def test_random_configs_equal_the_transcription(deg, ep, etp_is_tp, rng):
    W = deg["dp_replicate"] * deg["dp_shard"] * deg["cp"] * deg["tp"] * deg["pp"]
    etp = deg["tp"] if (etp_is_tp and ep > 1) else 1
    fsdp_tp = deg["dp_shard"] * deg["cp"] * deg["tp"]
    if fsdp_tp % (ep * etp):
        pd = ParallelDims(**deg, ep=ep, etp=etp, world_size=W)  # accepted, as torchtitan does
        with pytest.raises(ParallelDimsError, match="must divide"):
            pd.layouts  # noqa: B018 - the first use of the degrees (build_mesh reads them too)
        return
    cfg = {**deg, "ep": ep, "etp": etp}
    compare_with_transcription(cfg, W, rng.randrange(W))


@pytest.mark.parametrize("rank", [2**17 - 1, 77_777])
def test_equals_the_transcription_at_2_17(rank):
    """The benchmark config (docs/design.md) at W = 131,072 (stock torch takes ~5 s per rank here)."""
    cfg = dict(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1)
    compare_with_transcription(cfg, 2**17, rank, combos=False)


def test_large_world_many_ranks_cheaply():
    """At 2**17, many ranks: our meshes against numpy (no stock-torch build, ~5 s each)."""
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


# -- backends: which dims are fake --------------------------------------------------------------
#
# The worlds run on ``meshfake`` (tests/conftest.py), the fake process group under another name, so
# a group on the default backend (``meshfake``) and one made fake (``fake``) can be told apart.

BACKEND_CONFIGS = [
    # (config, world size)
    (dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1), 8),  # efsdp = 4 does not exist (ep 1)
    (dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=4, etp=1), 8),  # efsdp of size 1 exists (ep > 1)
    (dict(dp_replicate=1, dp_shard=1, cp=1, tp=8, pp=1, ep=1, etp=1), 8),  # batch, loss, fsdp of size 1
    (dict(dp_replicate=1, dp_shard=2, cp=2, tp=2, pp=2, ep=1, etp=1), 16),  # cp, pp real; efsdp = 8 fake
    (dict(dp_replicate=2, dp_shard=-1, cp=2, tp=2, pp=2, ep=4, etp=1), 64),
    (dict(dp_replicate=1, dp_shard=2, cp=2, tp=4, pp=3, ep=4, etp=4), 48),  # etp real, efsdp of size 1
    (dict(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1), 16),  # batch = fsdp = world
    (dict(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, etp=1), 1),  # one rank: every dim is the world
]
BACKEND_IDS = [f"W{w}-{i}" for i, (_, w) in enumerate(BACKEND_CONFIGS)]


def backend_of(mesh: DeviceMesh, dim: int) -> str:
    return str(dist.get_backend(mesh.get_group(dim)))


def expected_backend(stock: str, size: int, world_size: int) -> str:
    """The stock build's backend for a dim, with rankmesh's one documented difference: a dim of
    size 1 in a world of more than one rank is served by a ``fake`` group (it never communicates,
    and the fake backend's collectives are exact for one rank) where stock torch creates a
    one-rank group on the default backend."""
    return "fake" if size == 1 and world_size > 1 else stock


def every_dim(pd: ParallelDims, build) -> list[tuple[str, DeviceMesh, DeviceMesh]]:
    """(label, ours, theirs) for the world mesh, every 1-D mesh and every global mesh."""
    out = [("world", pd.world_mesh, build.world_mesh)]
    out += [(name, pd._meshes[name], build.meshes[name]) for name in NAMES]
    out += [(name, mesh, build.global_meshes[name]) for name, mesh in pd._global_meshes.items()]
    return out


@pytest.mark.parametrize("cfg, W", BACKEND_CONFIGS, ids=BACKEND_IDS)
def test_every_dim_has_the_stock_builds_backend(cfg, W):
    """For every dim of every mesh, the backend of the group rankmesh gives is the one the
    transcription's stock-torch build gives (torch honouring torchtitan's fake overrides for
    ``batch`` and for dims that do not exist), up to rankmesh's size-1 rule."""
    for rank in sorted({0, W - 1, W // 3}):
        with fake_world(W, rank, MESHFAKE):
            build = _stock_build(**cfg, world_size=W, device_type="cpu")
            pd = ParallelDims(**cfg, world_size=W)
            pd.build_mesh(device_type="cpu")
            for label, ours, theirs in every_dim(pd, build):
                assert ours.mesh_dim_names == theirs.mesh_dim_names, label
                for i, dim in enumerate(ours.mesh_dim_names):
                    got, stock = backend_of(ours, i), backend_of(theirs, i)
                    want = expected_backend(stock, ours.size(i), W)
                    assert got == want, f"{label}.{dim} (size {ours.size(i)}, rank {rank}): {got}, stock {stock}"
            # the rule, spelled out: batch and the unflattened dims that do not exist are fake
            # (loss is flattened on the default backend, as torchtitan does)
            for name in NAMES:
                size = pd._meshes[name].size()
                if name == "batch" or (name != "loss" and not mesh_exists(name, size, cfg["ep"])):
                    assert backend_of(pd._meshes[name], 0) == "fake", name


#: Dims whose fake-or-real rule the installed torchtitan 0.3.0 shares with 183a0d2 (0.3.0 keeps
#: fsdp real at size 1, makes batch fake only at size 1 and has no etp dim).
SHARED_RULE = ("pp", "loss", "dp_replicate", "cp", "tp", "ep", "efsdp")


ETP1 = [(c, i) for c, i in zip(BACKEND_CONFIGS, BACKEND_IDS) if c[0]["etp"] == 1]  # 0.3.0 has no etp


@pytest.mark.parametrize("cfg, W", [c for c, _ in ETP1], ids=[i for _, i in ETP1])
def test_backends_match_installed_torchtitan(cfg, W, monkeypatch):
    """The same comparison against torchtitan 0.3.0's own ParallelDims.build_mesh on stock torch
    (not rankmesh's transcription), for the dims whose rule both versions share."""
    tpd = pytest.importorskip("torchtitan.distributed.parallel_dims", reason="torchtitan 0.3.0 is a test dependency")
    monkeypatch.setattr(tpd, "device_type", "cpu")  # as torchtitan's own tests do
    titan_cfg = {k: v for k, v in cfg.items() if k != "etp"}
    for rank in sorted({0, W - 1, W // 3}):
        with fake_world(W, rank, MESHFAKE):
            titan = tpd.ParallelDims(**titan_cfg, world_size=W, spmd_backend="partial_dtensor")
            titan.build_mesh()
            pd = ParallelDims(**cfg, world_size=W)
            pd.build_mesh(device_type="cpu")
            for name in SHARED_RULE:
                ours, theirs = pd._meshes[name], titan._single_axis_meshes[name]
                assert ours.size() == theirs.size(), name
                got, stock = backend_of(ours, 0), backend_of(theirs, 0)
                want = expected_backend(stock, ours.size(), W)
                assert got == want, f"{name} (rank {rank}): {got}, torchtitan {stock}"


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
    ],
)
def test_validation(kw, match):
    with pytest.raises(ParallelDimsError, match=match) as ei:
        make(**kw)
    # torchtitan raises AssertionError; rankmesh's errors are ValueErrors
    assert isinstance(ei.value, AssertionError) and isinstance(ei.value, ValueError)
    assert ei.value.field


@pytest.mark.parametrize(
    "kw, field, value",
    [
        (dict(dp_replicate=2, dp_shard=2, tp=2, world_size=10), "world_size", 10),
        (dict(dp_replicate=3, dp_shard=-1, world_size=8), "world_size", 8),  # dp_shard = 2: 6 != 8
        (dict(dp_shard=-1, tp=4, world_size=2), "dp_shard", -1),  # -1 leaves no rank
    ],
)
def test_degrees_that_do_not_fit_the_world_raise_the_one_class(kw, field, value):
    """rankmesh's one class for degrees that do not fit the world, in every convention, is
    SizeMismatchError; ParallelDims' subclass is also torchtitan's AssertionError."""
    with pytest.raises(SizeMismatchError) as ei:
        make(**kw)
    e = ei.value
    assert isinstance(e, ParallelDimsError) and isinstance(e, AssertionError) and isinstance(e, RuntimeError)
    assert (e.field, e.value) == (field, value)
    assert "dp_shard=-1" in str(e) or "lower those degrees" in str(e)  # says how to fix it


@pytest.mark.parametrize("bad", [2.0, True, "2", None])
def test_degrees_follow_the_one_integer_rule(bad):
    """rankmesh._check's rule: bool, float, str (and None) are refused with ArgumentTypeError, a
    TypeError; numpy and torch integers pass."""
    with pytest.raises(ArgumentTypeError, match="tp must be an int") as ei:
        make(tp=bad, world_size=2)
    assert isinstance(ei.value, TypeError) and (ei.value.field, ei.value.value) == ("tp", bad)
    import numpy as np

    pd = make(tp=np.int64(2), dp_shard=torch.tensor(-1), world_size=4)
    assert (pd.tp, pd.dp_shard) == (2, 2) and type(pd.tp) is int and type(pd.dp_shard) is int


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
    with pytest.raises(MeshArgumentError, match="already built") as ei:
        pd.build_mesh(device_type="cuda")
    assert (ei.value.field, ei.value.value) == ("device_type", "cuda")
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
    with pytest.raises(ValueError, match="Invalid mesh name combinations") as ei:
        built.get_mesh(["batch", "fsdp"])
    assert isinstance(ei.value, UnknownNameError) and (ei.value.field, ei.value.value) == ("dims", ["batch", "fsdp"])
    with pytest.raises(ValueError, match="Invalid mesh name combinations"):
        built.get_optional_mesh(["loss", "tp"])
    # out of mesh order: torch's slicing error, as in torchtitan
    with pytest.raises(KeyError):
        built.get_mesh(["tp", "fsdp"])


def test_disabled_dims(built):
    built.build_mesh(device_type="cpu")
    for name in ("pp", "cp", "ep", "etp"):
        assert built.get_optional_mesh(name) is None
        with pytest.raises(ValueError, match="not available.*enabled \\(size > 1\\)") as ei:
            built.get_mesh(name)
        assert isinstance(ei.value, ParallelConfigError) and (ei.value.field, ei.value.value) == ("dims", name)
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
        # overrides to fake (torch honours the override too): a 1-rank fake group per dim name
        rep = pd.build_report
        assert rep.created == rep.fake == len({g[0] for g in rep.groups}) == 9


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
    torch's message (rankmesh's SliceOrderError appends the order that works, and it does)."""
    cfg = dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=2, etp=1)
    with fake_world(8, 5):
        _, stock_globals, _, _ = transcribed_build(cfg, 8)
        pd = ParallelDims(**cfg, world_size=8)
        pd.build_mesh(device_type="cpu")
        owner = next(m for m in stock_globals.values() if set(request_names) <= set(m.mesh_dim_names))
        with pytest.raises(KeyError) as theirs:
            owner[tuple(request_names)]
        with pytest.raises(KeyError) as ours:
            pd.get_mesh(request_names)
        assert isinstance(ours.value, SliceOrderError)
        assert ours.value.args[0].startswith(theirs.value.args[0].rstrip(".")), (ours.value, theirs.value)
        # the suggested order, applied as written, gives the mesh stock torch slices in that order
        tuples = [ast.literal_eval(t) for t in re.findall(r"\('[^()]*\)", str(ours.value).split("ascending order")[1])]
        (suggested,) = [t for t in tuples if sorted(t) == sorted(request_names) and list(t) != request_names]
        assert_same_mesh(pd.get_mesh(list(suggested)), owner[suggested], f"suggested {suggested}")
