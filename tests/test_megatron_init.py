"""rankmesh.megatron.initialize_model_parallel and HyperCommGrid against megatron-core 0.16's own,
in one process on the fake backend (one process stands in for any rank of any world).

Each case runs megatron-core's ``initialize_model_parallel`` and rankmesh's for the same rank and
configuration, one after the other in fresh worlds, and compares everything ``parallel_state``
answers afterwards (tests/mp/megatron_snapshot.py: every state global, every accessor, group
ranks and backends). The world runs on ``meshfake`` (tests/conftest.py) and gloo twins are
redirected to a second renamed fake backend, ``fakegloo``, so backends are compared too.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
from rankmesh import _once
from torch.distributed import distributed_c10d as c10d
from torch.testing._internal.distributed.fake_pg import FakeStore

from tests.conftest import MESHFAKE, SPLITFAKE, _create_meshfake_pg, fake_group_splits, fake_world
from tests.mp import megatron_snapshot as snap

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ps = pytest.importorskip("megatron.core.parallel_state")
    pytest.importorskip("einops")  # megatron's partial-DistOpt and hierarchical-cp paths
    from megatron.core import hyper_comm_grid as mgrid

import rankmesh.megatron as rm  # noqa: E402
from rankmesh import process_groups  # noqa: E402
from rankmesh.errors import (  # noqa: E402
    ArgumentTypeError,
    DistributedStateError,
    DuplicateNameError,
    GroupExistsError,
    GroupNotCreatedError,
    InvalidSizeError,
    MegatronConfigError,
    MegatronStateError,
    ParallelConfigError,
    RankmeshError,
    SizeMismatchError,
    UnknownNameError,
)
from rankmesh.megatron import model_parallel_layout  # noqa: E402
from rankmesh.megatron import parallel_state as _megatron_init  # noqa: E402

FAKEGLOO = "fakegloo"


@pytest.fixture(autouse=True)
def gloo_is_fakegloo(monkeypatch):
    """Gloo twins on a fake world: ``new_group(backend="gloo")`` -> the ``fakegloo`` backend."""
    for name in (FAKEGLOO, SPLITFAKE):
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _create_meshfake_pg, extended_api=True, devices=["cpu", "cuda"])
    real = dist.new_group

    def new_group(*args, backend=None, **kw):
        return real(*args, backend=FAKEGLOO if backend == "gloo" else backend, **kw)

    monkeypatch.setattr(dist, "new_group", new_group)
    # rankmesh's own member-only groups (rankmesh._fast_groups) take the same detour
    real_member = process_groups.new_member_group

    def new_member_group(ranks, *, backend=None, **kw):
        return real_member(ranks, backend=FAKEGLOO if backend == "gloo" else backend, **kw)

    monkeypatch.setattr(process_groups, "new_member_group", new_member_group)
    snap.reset()
    yield
    snap.reset()
    if dist.is_initialized():
        dist.destroy_process_group()


def _can_split() -> bool:
    return fake_group_splits(c10d._get_default_group())


def run(fn, world: int, rank: int, kw: dict, *, split: bool = False):
    """``fn(**kw)`` on ``rank`` of a fresh fake world: (snapshot, groups registered, counters)."""
    dist.init_process_group(SPLITFAKE if split else MESHFAKE, store=FakeStore(), rank=rank, world_size=world)
    try:
        if split:
            if not _can_split():
                pytest.skip(f"the fake backend of torch {torch.__version__} cannot split (2.15's can)")
            c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
        before = len(c10d._world.pg_map)
        fn(**kw)
        created = len(c10d._world.pg_map) - before
        counters = (c10d._world.group_count, len(c10d._world.pg_names))
        return snap.snapshot(), created, counters
    finally:
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        snap.reset()
        dist.destroy_process_group()


def compare(world: int, rank: int, kw: dict) -> tuple[int, int]:
    stock, n_stock, _ = run(ps.initialize_model_parallel, world, rank, kw)
    ours, n_ours, _ = run(rm.initialize_model_parallel, world, rank, kw)
    d = snap.diff(stock, ours)
    assert not d, (world, rank, kw, d[:10])
    assert stock["model_parallel_is_initialized"] is True
    assert n_ours < n_stock, (world, rank, kw, n_ours, n_stock)
    return n_stock, n_ours


def _first_and_last_two(pp_ranks):  # a custom embedding placement
    return sorted({pp_ranks[0], *pp_ranks[-2:]})


CASES = [
    # world, kwargs
    (
        64,
        dict(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=2,
            context_parallel_size=2,
            expert_model_parallel_size=4,
        ),
    ),
    (
        64,
        dict(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=2,
            context_parallel_size=2,
            expert_model_parallel_size=4,
            expert_tensor_parallel_size=1,
            num_distributed_optimizer_instances=2,
            hierarchical_context_parallel_sizes=[2, 1],
            create_all_gather_group=True,
            virtual_pipeline_model_parallel_size=2,
        ),
    ),
    (32, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=4, order="tp-cp-pp-ep-dp")),
    (
        48,
        dict(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=3,
            context_parallel_size=2,
            expert_model_parallel_size=2,
            expert_tensor_parallel_size=2,
            num_distributed_optimizer_instances=2,
        ),
    ),
    (
        64,
        dict(
            tensor_model_parallel_size=4,
            pipeline_model_parallel_size=2,
            context_parallel_size=4,
            expert_model_parallel_size=8,
            expert_tensor_parallel_size=1,
            hierarchical_context_parallel_sizes=[2, 2],
        ),
    ),
    (16, dict(num_distributed_optimizer_instances=4, hybrid_context_parallel=True)),
    (
        32,
        dict(
            tensor_model_parallel_size=4,
            context_parallel_size=2,
            expert_model_parallel_size=2,
            expert_tensor_parallel_size=2,
            order="tp-pp-dp-cp-ep",
            num_distributed_optimizer_instances=2,
        ),
    ),
    (
        24,
        dict(
            pipeline_model_parallel_size=2,
            context_parallel_size=3,
            expert_model_parallel_size=2,
            expert_tensor_parallel_size=1,
            num_distributed_optimizer_instances=3,
            hierarchical_context_parallel_sizes=[3],
        ),
    ),
    (
        64,
        dict(
            pipeline_model_parallel_size=8,
            context_parallel_size=2,
            hybrid_context_parallel=True,
            get_embedding_ranks=_first_and_last_two,
            create_gloo_process_groups=False,
        ),
    ),
    (8, dict()),
    (1, dict()),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_state_as_megatron(case):
    world, kw = CASES[case]
    rng = np.random.default_rng(case)
    for rank in sorted({0, world - 1, int(rng.integers(world))}):
        compare(world, rank, kw)


def _random_config(rng: np.random.Generator) -> tuple[int, dict]:
    while True:
        tp, pp, cp = (int(rng.choice(c)) for c in ([1, 2, 4], [1, 2, 3, 4], [1, 2, 4]))
        dp = int(rng.choice([1, 2, 4, 8]))
        world = tp * pp * cp * dp
        ep = int(rng.choice([1, 2, 4, 8]))
        etp = None if rng.random() < 0.5 else int(rng.choice([1, 2, 4]))
        names = ["tp", "cp", "ep", "dp", "pp"]
        pp_last = rng.permutation(names[:4]).tolist() + ["pp"]
        order = "-".join(pp_last) if rng.random() < 0.7 else "-".join(rng.permutation(names))
        kw = dict(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
            order=order,
            create_gloo_process_groups=bool(rng.random() < 0.7),
            create_all_gather_group=bool(rng.random() < 0.3),
        )
        try:
            m = model_parallel_layout(world, tp, pp, cp, ep, etp, order)
        except RankmeshError:
            continue
        n = [d for d in (1, 2, 4) if (m.dp * m.cp) % d == 0 and m.expert_dp % d == 0]
        kw["num_distributed_optimizer_instances"] = int(rng.choice(n))
        if cp > 1 and rng.random() < 0.5:
            kw["hierarchical_context_parallel_sizes"] = [2, cp // 2] if cp == 4 else [cp]
        if (m.dp * m.cp) % 2 == 0 and rng.random() < 0.3:
            kw["hybrid_context_parallel"] = True
        if pp > 1 and rng.random() < 0.3:
            kw["virtual_pipeline_model_parallel_size"] = 2
        return world, kw


@pytest.mark.parametrize("seed", range(12))
def test_random_configs_and_ranks(seed):
    rng = np.random.default_rng(1000 + seed)
    world, kw = _random_config(rng)
    for rank in sorted({0, world - 1, *map(int, rng.integers(0, world, 2))}):
        compare(world, rank, kw)


def test_2_17_ranks():
    """131,072 ranks: the same state as megatron-core's (8-15 s per rank there), on two ranks."""
    world = 2**17
    kw = dict(
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=4,
        context_parallel_size=2,
        expert_model_parallel_size=8,
        expert_tensor_parallel_size=1,
    )
    for rank in (world - 1, 77_777):
        compare(world, rank, kw)  # same state, fewer process groups


@pytest.mark.parametrize("split", [False, True], ids=["new_group", "split_group"])
def test_ranks_outside_embedding_groups_keep_torchs_group_names_in_step(split):
    """With pp = 4, middle stages hold no embedding: they must still take the same group-naming
    steps as the members (torch salts hashed names with a per-rank counter), or every later group
    would get a different name on different ranks, a rendezvous that never meets."""
    world, kw = 32, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=4)
    m = model_parallel_layout(world, 2, 4)
    counters = {}
    for rank in range(world):
        _, _, counters[rank] = run(rm.initialize_model_parallel, world, rank, kw, split=split)
    first_stage, middle = 0, int(m.decoder.my_group(0, "pp")[1])
    assert m.group(middle, "embd") is None and m.group(first_stage, "embd") is not None
    key = 0 if split else slice(None)  # split_group registers only members (the name counter agrees)
    assert len({c[key] if split else c for c in counters.values()}) == 1, counters


def test_split_group_path_same_state():
    """Default group bound to a device: groups by split_group (fake backend, torch 2.15)."""
    world, kw = (
        32,
        dict(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=4,
            context_parallel_size=2,
            create_gloo_process_groups=True,
        ),
    )
    for rank in (0, 9, 31):
        stock, _, _ = run(ps.initialize_model_parallel, world, rank, kw)
        ours, _, _ = run(rm.initialize_model_parallel, world, rank, kw, split=True)
        ours = json.loads(json.dumps(ours).replace(SPLITFAKE, MESHFAKE))  # the world's backend name
        assert not snap.diff(stock, ours)


def test_destroy_and_reinitialise():
    dist.init_process_group(MESHFAKE, store=FakeStore(), rank=5, world_size=16)
    try:
        report = rm.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
        assert ps.model_parallel_is_initialized() and report.created == rm.last_build_report().created
        with pytest.raises(MegatronStateError) as e:  # megatron asserts; so do we, before any group
            rm.initialize_model_parallel(tensor_model_parallel_size=2)
        assert isinstance(e.value, AssertionError) and e.value.field == "_DATA_PARALLEL_GROUP"
        assert e.value.value is ps._DATA_PARALLEL_GROUP  # the offending value itself: the group that is set
        gloo = ps.get_data_parallel_group_gloo()
        rm.destroy_model_parallel()
        assert not ps.model_parallel_is_initialized() and rm.last_build_report() is None
        assert c10d._world.pg_map.get(gloo) is None  # megatron's destroy removed the gloo twin
        rm.initialize_model_parallel(tensor_model_parallel_size=4)
        assert ps.get_tensor_model_parallel_world_size() == 4
        ps.destroy_model_parallel()  # megatron's own destroy works after ours
        assert not ps.model_parallel_is_initialized()
    finally:
        snap.reset()
        dist.destroy_process_group()


ERRORS = [
    # kwargs, world; megatron-core's exception class for the same call
    (dict(tensor_model_parallel_size=32), 16),
    (dict(pipeline_model_parallel_size=3), 16),
    (dict(virtual_pipeline_model_parallel_size=2), 16),
    (dict(tensor_model_parallel_size=2, expert_model_parallel_size=3), 16),
    (
        dict(
            pipeline_model_parallel_size=2,
            tensor_model_parallel_size=2,
            expert_model_parallel_size=4,
            expert_tensor_parallel_size=1,
            order="tp-cp-pp-ep-dp",
        ),
        32,
    ),
    (dict(tensor_model_parallel_size=2, num_distributed_optimizer_instances=3), 16),
    (dict(context_parallel_size=4, hierarchical_context_parallel_sizes=[2, 3]), 16),
    (dict(use_sharp=True, sharp_enabled_group="tp"), 16),
    (dict(sharp_enabled_group="dp"), 16),
    (dict(use_sharp=True, sharp_enabled_group="dp_replica"), 16),
    (dict(context_parallel_size=3, hybrid_context_parallel=True), 3),
    (dict(order="tp-xx-dp"), 16),
    (dict(tensor_model_parallel_size=0), 16),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_errors_are_typed_and_megatrons_class_before_any_group(case):
    kw, world = ERRORS[case]
    dist.init_process_group(MESHFAKE, store=FakeStore(), rank=0, world_size=world)
    try:
        try:
            ps.initialize_model_parallel(**kw)
            theirs = None
        except Exception as e:  # noqa: BLE001
            theirs = e
        ps.destroy_model_parallel()
        snap.reset()
        before = len(c10d._world.pg_map)
        with pytest.raises(RankmeshError) as e:
            rm.initialize_model_parallel(**kw)
        assert len(c10d._world.pg_map) == before  # nothing created
        assert not ps.model_parallel_is_initialized()
        assert e.value.field and str(e.value)
        if theirs is not None and not isinstance(theirs, ZeroDivisionError):
            assert isinstance(e.value, type(theirs)), (kw, e.value, theirs)
    finally:
        snap.reset()
        dist.destroy_process_group()


def test_other_refusals():
    with pytest.raises(MegatronStateError) as e:  # no default group
        rm.initialize_model_parallel()
    assert isinstance(e.value, AssertionError) and (e.value.field, e.value.value) == ("default_group", None)
    with fake_world(8, 0, MESHFAKE):
        with pytest.raises(MegatronConfigError, match="pipeline group"):  # a rank of another group
            rm.initialize_model_parallel(pipeline_model_parallel_size=2, get_embedding_ranks=lambda r: [r[0] + 1, 99])
        with pytest.raises(MegatronConfigError):
            rm.initialize_model_parallel(pipeline_model_parallel_comm_backend="mpi")


def test_ucc_pipeline_refused_before_any_group(monkeypatch):
    """The UCC pipeline backend with CUDA_DEVICE_MAX_CONNECTIONS=1 is refused by the checks,
    before the first group (megatron-core raises it after making its dp/cp/tp groups)."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    with fake_world(8, 0, MESHFAKE):
        before = len(c10d._world.pg_map)
        with pytest.raises(MegatronConfigError, match="CUDA_DEVICE_MAX_CONNECTIONS") as e:
            rm.initialize_model_parallel(pipeline_model_parallel_comm_backend="ucc")
        assert (e.value.field, e.value.value) == ("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        assert len(c10d._world.pg_map) == before and not ps.model_parallel_is_initialized()


def test_an_unsupported_megatron_core_gets_its_own_function_after_one_warning(monkeypatch):
    """The one policy for a version rankmesh has not read (rankmesh._dependencies): warn once and
    run megatron-core's own initialize_model_parallel, with the caller's arguments."""

    monkeypatch.setattr(_megatron_init, "megatron_core_version", lambda: "0.15.2")
    monkeypatch.setattr(_once, "_seen", set())
    calls = []
    monkeypatch.setattr(ps, "initialize_model_parallel", lambda **kw: calls.append(kw))
    with fake_world(8, 0, MESHFAKE):
        unread = r"megatron-core 0\.15\.2 is not a version rankmesh has read \(supported: 0\.16\)"
        with pytest.warns(RuntimeWarning, match=unread):
            assert rm.initialize_model_parallel(tensor_model_parallel_size=2, order="tp-dp-pp") is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once
            rm.initialize_model_parallel(hybrid_context_parallel=True)
    assert calls[0] == {"tensor_model_parallel_size": 2, "order": "tp-dp-pp"}  # megatron keeps its defaults
    assert calls[1] == {"hybrid_context_parallel": True}  # a non-default argument always reaches it
    monkeypatch.setattr(_megatron_init, "megatron_core_version", lambda: None)
    with pytest.raises(ImportError, match=r"megatron-core 0\.16 \(pip install 'rankmesh\[megatron\]'\)"):
        rm.initialize_model_parallel()


# -- HyperCommGrid -----------------------------------------------------------------------------------


def _random_grid(rng):
    ndim = int(rng.integers(1, 5))
    shape = [int(rng.choice([1, 2, 3, 4])) for _ in range(ndim)]
    names = rng.permutation(["tp", "cp", "ep", "dp", "pp", "x"])[:ndim].tolist()
    dims = rng.permutation(names)[: int(rng.integers(1, ndim + 1))].tolist()
    return shape, names, dims if len(dims) > 1 or rng.random() < 0.5 else dims[0]


@pytest.mark.parametrize("seed", range(40))
def test_grid_rank_enum_equals_megatrons(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    shape, names, dims = _random_grid(rng)
    offset = int(rng.integers(0, 5))
    monkeypatch.setenv("WORLD_SIZE", str(int(np.prod(shape)) + offset))
    ours = rm.HyperCommGrid(shape, names, rank_offset=offset)
    theirs = mgrid.HyperCommGrid(shape, names, rank_offset=offset)
    assert ours.get_rank_enum(dims) == theirs.get_rank_enum(dims)
    assert ours._order_dims(dims) == theirs._order_dims(dims)
    for rank in range(offset + ours.size):
        mine = ours.my_ranks(rank, dims)
        want = next((g for g in theirs.get_rank_enum(dims) if rank in g), None)
        assert mine == want


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("split", [False, True], ids=["new_group", "split_group"])
def test_grid_create_pg_equals_megatrons(seed, split, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rng = np.random.default_rng(100 + seed)
    shape, names, _ = _random_grid(rng)
    size = int(np.prod(shape))
    offset = 0 if seed % 2 == 0 else int(rng.integers(1, 4))
    world = size + offset + (0 if seed % 4 < 2 else 2)
    combos = [names[i:] for i in range(len(names))] + [[n] for n in names]
    for rank in sorted({0, world - 1, int(rng.integers(world))}):
        got = {}
        for impl in (mgrid.HyperCommGrid, rm.HyperCommGrid):
            backend = SPLITFAKE if split and impl is rm.HyperCommGrid else MESHFAKE
            with fake_world(world, rank, backend):
                if split and impl is rm.HyperCommGrid:
                    if not _can_split():
                        pytest.skip("the fake backend of this torch cannot split")
                    c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
                grid = impl(shape, names, rank_offset=offset)
                before = set(c10d._world.pg_map)
                out = []
                for dims in combos:
                    _, key = grid._order_dims(dims)
                    if key in grid._pgs:
                        continue
                    pg = grid.create_pg(dims, group_desc="TEST")
                    assert grid.get_pg(dims) is pg
                    out.append((key, None if pg is None else dist.get_process_group_ranks(pg)))
                with pytest.raises(KeyError):
                    grid.create_pg(combos[0])
                # rankmesh's one-rank fake placeholders (ranks outside the grid) are not counted
                real = [pg for pg in c10d._world.pg_map if pg not in before and dist.get_backend(pg) != "fake"]
                got[impl] = (out, len(real))
        (theirs, n_theirs), (ours, n_ours) = got[mgrid.HyperCommGrid], got[rm.HyperCommGrid]
        assert ours == theirs, (shape, names, offset, world, rank)
        assert n_ours <= n_theirs


def test_grid_errors_are_typed_and_megatrons_class(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "16")

    def both(*args, **kw):
        out = []
        for impl in (rm.HyperCommGrid, mgrid.HyperCommGrid):
            try:
                impl(*args, **kw)
                out.append(None)
            except Exception as e:  # noqa: BLE001
                out.append(e)
        return out

    for args, kw, cls in [
        (([2, 2], ["a"]), {}, SizeMismatchError),
        (([2, 2], ["a", "b"]), {"rank_offset": -1}, InvalidSizeError),
        (([4, 8], ["a", "b"]), {}, SizeMismatchError),  # 32 ranks > 16
        (([4, 4], ["a", "b"]), {"rank_offset": 1}, SizeMismatchError),
    ]:
        ours, theirs = both(*args, **kw)
        assert isinstance(ours, cls) and isinstance(ours, type(theirs)), (args, kw, ours, theirs)
    with pytest.raises(DuplicateNameError):
        rm.HyperCommGrid([2, 2], ["a", "a"])
    with pytest.raises(InvalidSizeError):
        rm.HyperCommGrid([0, 2], ["a", "b"])
    grid = rm.HyperCommGrid([2, 2], ["a", "b"])
    with pytest.raises(UnknownNameError) as e:
        grid.get_rank_enum(["a", "zz"])
    assert isinstance(e.value, ValueError)  # megatron's list.index raises ValueError
    with pytest.raises(GroupNotCreatedError) as e:
        grid.get_pg("a")
    assert isinstance(e.value, KeyError)
    for bad in (2.0, True, "2"):  # rankmesh._check's rule; megatron-core's grid would take them
        with pytest.raises(ArgumentTypeError) as e:
            rm.HyperCommGrid([bad, 2], ["a", "b"])
        assert (e.value.field, e.value.value) == ("shape[0]", bad)
    assert grid.my_ranks(3, "a") == [2, 3]  # rank first, as MeshLayout.group(rank, dim)
    with pytest.raises(ArgumentTypeError, match="takes the rank first"):
        grid.my_ranks("a", 3)
    for text in ("zero", "0", "-4"):  # environment text, parsed where it is read
        monkeypatch.setenv("WORLD_SIZE", text)
        with pytest.raises(DistributedStateError, match="set WORLD_SIZE to the number of ranks") as e:
            rm.HyperCommGrid([2], ["a"])
        assert (e.value.field, e.value.value) == ("WORLD_SIZE", text)
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(DistributedStateError) as e:  # no WORLD_SIZE, no process group
        rm.HyperCommGrid([2], ["a"])
    assert isinstance(e.value, RuntimeError) and (e.value.field, e.value.value) == ("WORLD_SIZE", None)
    assert issubclass(GroupExistsError, KeyError) and issubclass(ParallelConfigError, RuntimeError)


def test_an_unsupported_megatron_core_after_the_documented_assignment_runs_megatrons_own(monkeypatch):
    """The assignment route (parallel_state.initialize_model_parallel = rankmesh's) on a release
    rankmesh has not read, or with an argument of a newer release: megatron-core's own function,
    found again from its source (rankmesh.megatron.route.megatron_own), gives its own answers and its
    own exceptions; never rankmesh's refusal, never a recursion."""
    kw = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, context_parallel_size=2)
    stock, n_stock, _ = run(ps.initialize_model_parallel, 8, 5, kw)
    own = ps.initialize_model_parallel
    monkeypatch.setattr(_once, "_seen", set())
    monkeypatch.setattr(ps, "initialize_model_parallel", rm.initialize_model_parallel)
    with pytest.warns(RuntimeWarning, match="gtp_remat_size, which rankmesh does not model"):
        with fake_world(8, 0, MESHFAKE), pytest.raises(TypeError, match="gtp_remat_size") as e:
            ps.initialize_model_parallel(tensor_model_parallel_size=2, gtp_remat_size=1)
    with pytest.raises(TypeError) as stock_error:
        own(gtp_remat_size=1)
    assert str(e.value) == str(stock_error.value)  # megatron-core 0.16's own refusal of 0.19's keyword
    monkeypatch.setattr(_megatron_init, "megatron_core_version", lambda: "0.19.1")
    with pytest.warns(RuntimeWarning, match=r"megatron-core 0\.19\.1 is not a version rankmesh has read"):
        routed, n_routed, _ = run(lambda **k: ps.initialize_model_parallel(**k), 8, 5, kw)
    assert not snap.diff(stock, routed) and n_routed == n_stock  # megatron-core's answers, all its groups
    with fake_world(8, 0, MESHFAKE), pytest.raises(RuntimeError) as e:
        ps.initialize_model_parallel(tensor_model_parallel_size=3)  # megatron-core's own check
    assert not isinstance(e.value, RankmeshError)
    assert not ps.model_parallel_is_initialized()


def test_create_pg_takes_megatrons_keywords_only(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    grid = rm.HyperCommGrid([2, 4], ["tp", "dp"])
    with pytest.raises(TypeError, match="unexpected keyword argument 'backend'"):
        grid.create_pg("tp", backend="gloo")  # megatron-core's create_pg refuses it too
