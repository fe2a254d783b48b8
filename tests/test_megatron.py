"""rankmesh.megatron against megatron-core itself (the oracle).

megatron-core is installed from PyPI (requirements-dev.txt) and imported plainly: its
``parallel_state`` needs only torch, numpy and packaging on CPU. ``RankGenerator`` is compared on
megatron's own test matrix (``test_rank_generator_for_tp_dp_pp``, up to 1344 nodes x 8 GPUs), every
token, several orders, ``rank_offset`` and the error cases; ``model_parallel_layout`` is compared
with the groups a real ``initialize_model_parallel`` creates on the fake backend, in a subprocess
(so no process group leaks into the other tests).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from rankmesh import MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DuplicateNameError,
    InvalidNameError,
    InvalidSizeError,
    LayoutOverflowError,
    MegatronConfigError,
    ParallelConfigError,
    RankmeshError,
    RankOutOfRangeError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.megatron import RankGenerator, model_parallel_layout

from tests.conftest import fake_world

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on CPU
    warnings.simplefilter("ignore")
    ps = pytest.importorskip("megatron.core.parallel_state")

DIMS = ("tp", "ep", "dp", "pp", "cp")
ALL_TOKENS = ["-".join(c) for k in range(1, 6) for c in itertools.combinations(DIMS, k)]

# megatron-core's tests/unit_tests/test_parallel_state.py::test_rank_generator_for_tp_dp_pp
MEGATRON_MATRIX = [
    (1, 1, 1, 1, 1, 1),
    (1, 8, 8, 1, 1, 1),
    (1, 8, 2, 2, 1, 1),
    (1, 8, 2, 4, 1, 1),
    (3, 8, 8, 3, 1, 1),
    (4, 8, 2, 4, 1, 1),
    (8, 8, 8, 8, 1, 1),
    (8, 8, 2, 1, 1, 4),
    (8, 8, 2, 2, 2, 4),
    (8, 8, 2, 1, 4, 8),
    (8, 8, 2, 2, 2, 8),
    (16, 8, 4, 8, 1, 1),
    (16, 8, 4, 8, 1, 4),
    (16, 8, 4, 8, 4, 1),
    (16, 8, 8, 8, 1, 1),
    (32, 8, 4, 8, 1, 1),
    (32, 8, 8, 8, 1, 1),
    (32, 8, 4, 8, 1, 4),
    (32, 8, 8, 8, 4, 1),
    (64, 8, 4, 2, 8, 8),
    (64, 8, 4, 8, 1, 1),
    (64, 8, 8, 8, 1, 1),
    (96, 8, 4, 8, 1, 1),
    (128, 8, 4, 2, 8, 8),
    (128, 8, 4, 8, 1, 1),
    (256, 8, 4, 8, 1, 1),
    (316, 8, 4, 8, 1, 1),
    (384, 8, 4, 8, 1, 1),
    (512, 8, 4, 8, 1, 1),
    (768, 8, 4, 8, 1, 1),
    (1024, 8, 4, 8, 1, 1),
    (1280, 8, 4, 8, 1, 1),
    (1344, 8, 4, 8, 1, 1),
]


def assert_same(ours: RankGenerator, theirs, token: str, rng: np.random.Generator, samples: int = 16) -> None:
    expected = theirs.get_ranks(token)
    assert ours.get_ranks(token) == expected, token
    arr = np.asarray(expected, dtype=np.int64)
    got = ours.groups(token)
    assert got.dtype == np.int32 and got.flags.c_contiguous
    assert np.array_equal(got, arr), token
    # my_group: the row holding the rank, for every rank of small worlds, a sample of large ones
    lo = ours.rank_offset
    row_of = np.empty(ours.world_size, dtype=np.int64)
    row_of[arr - lo] = np.arange(arr.shape[0])[:, None]
    hi = lo + ours.world_size
    ranks = range(lo, hi) if ours.world_size <= 64 else rng.integers(lo, hi, samples)
    for r in ranks:
        assert np.array_equal(ours.my_group(int(r), token), arr[row_of[int(r) - lo]]), (token, int(r))


def both(tp, ep, dp, pp, cp, order, rank_offset=0):
    args = (tp, ep, dp, pp, cp, order, rank_offset)
    return RankGenerator(*args), ps.RankGenerator(*args)


@pytest.mark.parametrize("nodes, gpus, tp, pp, cp, ep", MEGATRON_MATRIX, ids=lambda v: str(v))
def test_megatron_matrix_every_token(nodes, gpus, tp, pp, cp, ep):
    """Megatron's own configs: dense (tp-cp-dp-pp) and expert (tp-ep-dp-pp) generators, all tokens."""
    rng = np.random.default_rng(nodes * 1000 + tp * 100 + pp * 10 + cp + ep)
    world = nodes * gpus
    dp, edp = world // (tp * pp * cp), world // (tp * ep * pp)
    for ours, theirs in (both(tp, 1, dp, pp, cp, "tp-cp-dp-pp"), both(tp, ep, edp, pp, 1, "tp-ep-dp-pp")):
        for token in ALL_TOKENS:
            assert_same(ours, theirs, token, rng)


ORDERS = ["tp-cp-ep-dp-pp", "tp-cp-pp-ep-dp", "tp-pp-dp", "pp-dp-tp", "dp-tp-pp", "cp-tp-ep-pp-dp"]


@pytest.mark.parametrize("order", ORDERS)
def test_orders_and_token_spellings(order):
    """Several orders (megatron's test orders and others), tokens in any spelling and case."""
    rng = np.random.default_rng(7)
    configs = [(2, 1, 3, 4, 2), (4, 2, 2, 2, 1), (1, 4, 3, 2, 1), (8, 1, 4, 4, 1), (2, 1, 5, 1, 3)]
    for tp, ep, dp, pp, cp in configs:
        names = order.split("-")
        if any(s > 1 and n not in names for n, s in zip(("tp", "ep", "dp", "pp", "cp"), (tp, ep, dp, pp, cp))):
            with pytest.raises(RuntimeError):
                ps.RankGenerator(tp, ep, dp, pp, cp, order)
            with pytest.raises(ParallelConfigError):
                RankGenerator(tp, ep, dp, pp, cp, order)
            continue
        ours, theirs = both(tp, ep, dp, pp, cp, order)
        assert ours.order == theirs.order and ours.ordered_size == theirs.ordered_size
        for token in ALL_TOKENS:
            assert_same(ours, theirs, token, rng)
            # megatron's mask ignores the spelling order of a token; so do we (and case)
            rev = "-".join(reversed(token.split("-")))
            assert ours.get_ranks(rev) == theirs.get_ranks(token)
            assert ours.get_ranks(token.upper()) == theirs.get_ranks(token)
            assert ours.get_mask(ours.order, token) == theirs.get_mask(theirs.order, token)
    up = RankGenerator(2, 1, 2, 2, 1, order.upper())  # megatron lower-cases the order
    assert up.get_ranks("tp-dp") == ps.RankGenerator(2, 1, 2, 2, 1, order.upper()).get_ranks("tp-dp")


@pytest.mark.parametrize("offset", [1, 7, 64, 4096])
def test_rank_offset(offset):
    rng = np.random.default_rng(offset)
    configs = [(2, 1, 4, 2, 2, "tp-cp-ep-dp-pp"), (2, 4, 2, 2, 1, "tp-ep-dp-pp"), (4, 1, 8, 4, 1, "tp-pp-dp")]
    for tp, ep, dp, pp, cp, order in configs:
        ours, theirs = both(tp, ep, dp, pp, cp, order, offset)
        for token in ALL_TOKENS:
            assert_same(ours, theirs, token, rng)
    g = RankGenerator(2, 1, 2, 1, 1, "tp-dp", rank_offset=offset)
    assert g.my_group(offset + 3, "tp").tolist() == [offset + 2, offset + 3]
    for bad in (offset - 1, offset + 4):
        with pytest.raises(RankOutOfRangeError):
            g.my_group(bad, "tp")


def test_repeated_names_in_token_are_one():
    ours, theirs = both(2, 1, 2, 2, 1, "tp-dp-pp")
    assert ours.get_ranks("tp-tp-dp") == theirs.get_ranks("tp-tp-dp") == theirs.get_ranks("tp-dp")


def test_layout_is_the_flattened_slice():
    g = RankGenerator(tp=2, ep=1, dp=3, pp=2, cp=2, order="tp-cp-ep-dp-pp")
    assert g.mesh_layout.names == ("pp", "dp", "ep", "cp", "tp")
    assert g.mesh_layout.shape == (2, 3, 1, 2, 2)
    lay = g.layout("dp-cp")
    assert lay.names == ("dp_cp",) and lay.shape == (6,)
    assert lay == g.mesh_layout["dp", "cp"].flatten("dp_cp")
    assert g.token_dims("tp-pp") == ("pp", "tp")
    assert g.group_size("dp-cp") == 6 and g.num_groups("dp-cp") == 4
    assert g.coordinate_of(23) == {"tp": 1, "cp": 1, "ep": 0, "dp": 2, "pp": 1}


def test_dims_layout_for_device_meshes():
    g = RankGenerator(tp=2, ep=1, dp=3, pp=2, cp=2, order="tp-cp-ep-dp-pp")
    m = g.dims_layout(["pp", "dp-cp", "tp"])
    assert m.names == ("pp", "dp_cp", "tp") and m.shape == (2, 6, 2)
    for r in range(g.world_size):
        assert m.group(r, "dp_cp").tolist() == g.my_group(r, "dp-cp").tolist()
        assert m.group(r, "tp").tolist() == g.my_group(r, "tp").tolist()
        assert m.group(r, "pp").tolist() == g.my_group(r, "pp").tolist()
    assert g.dims_layout(["tp-pp"]).names == ("tp_pp",)  # one token: any token
    assert g.dims_layout(["dp", "tp"], names=["data", "tensor"]).names == ("data", "tensor")
    with pytest.raises(ParallelConfigError):  # tp and pp are not adjacent in this order
        g.dims_layout(["dp", "tp-pp"])
    with pytest.raises(SliceOrderError):
        g.dims_layout(["tp", "pp"])
    with pytest.raises(DuplicateNameError):
        g.dims_layout(["dp-cp", "cp"])


def test_world_with_rank_map():
    perm = np.random.default_rng(3).permutation(16)
    g = RankGenerator(2, 1, 2, 4, 1, "tp-dp-pp", world=MeshLayout.world(16, rank_map=perm))
    plain = RankGenerator(2, 1, 2, 4, 1, "tp-dp-pp")
    for token in ("tp", "dp", "pp", "tp-pp"):
        assert np.array_equal(g.groups(token), perm[plain.groups(token)])
    with pytest.raises(SizeMismatchError):  # 8 ranks for degrees that multiply to 16
        RankGenerator(2, 1, 2, 4, 1, "tp-dp-pp", world=MeshLayout.world(8))
    with pytest.raises(ArgumentTypeError):
        RankGenerator(2, 1, 2, 4, 1, "tp-dp-pp", world=16)


# -- errors: every one a RankmeshError, and where megatron raises, the same builtin class ------------


def _raises(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.mark.parametrize(
    "args, ours_cls, megatron_cls",
    [
        ((2, 1, 2, 2, 1, "tp-dp"), ParallelConfigError, RuntimeError),  # pp=2 missing from order
        ((2, 1, 2, 1, 1, "tp-xp-dp"), UnknownNameError, KeyError),  # unknown name in order
        ((2, 2, 2, 1, 2, "tp-cp-ep-dp-pp"), MegatronConfigError, AssertionError),  # ep and cp > 1
        ((0, 1, 2, 1, 1, "tp-dp"), InvalidSizeError, None),  # megatron: no groups at all
        ((2, 1, -2, 1, 1, "tp-dp"), InvalidSizeError, None),
        ((2, 1, 2, 1, 1, "tp-tp-dp"), DuplicateNameError, None),
        ((2, 1, 2, 1, 1, "tp--dp"), InvalidNameError, None),
        ((2, 1, 2, 1, 1, ""), InvalidNameError, None),
    ],
)
def test_constructor_errors(args, ours_cls, megatron_cls):
    err = _raises(lambda: RankGenerator(*args))
    assert isinstance(err, ours_cls) and isinstance(err, RankmeshError), err
    assert str(err) and err.field
    theirs = _raises(lambda: ps.RankGenerator(*args).get_ranks("dp"))
    if megatron_cls is not None:
        assert isinstance(theirs, megatron_cls), theirs
        assert isinstance(err, megatron_cls)


def test_same_builtin_class_as_megatron_where_it_raises():
    for args in [(2, 1, 2, 2, 1, "tp-dp"), (2, 1, 2, 1, 1, "tp-xp-dp")]:
        err, theirs = _raises(lambda: RankGenerator(*args)), _raises(lambda: ps.RankGenerator(*args))
        assert isinstance(err, type(theirs))
    g, m = both(2, 1, 2, 1, 1, "tp-dp")
    err, theirs = _raises(lambda: g.get_ranks("tp-zz")), _raises(lambda: m.get_ranks("tp-zz"))
    assert isinstance(theirs, ValueError) and isinstance(err, ValueError) and isinstance(err, UnknownNameError)


def test_other_errors():
    with pytest.raises(InvalidSizeError):  # megatron ignores a negative offset; we refuse it
        RankGenerator(2, 1, 2, 1, 1, "tp-dp", rank_offset=-1)
    with pytest.raises(LayoutOverflowError):
        RankGenerator(2, 1, 2, 1, 1, "tp-dp", rank_offset=2**31 - 2)
    with pytest.raises(TypeError):
        RankGenerator(2.0, 1, 2, 1, 1, "tp-dp")
    with pytest.raises(TypeError):
        RankGenerator(2, 1, 2, 1, 1, ["tp", "dp"])
    g = RankGenerator(2, 1, 2, 1, 1, "tp-dp")
    for bad in ("", "tp-", "xx"):
        with pytest.raises(RankmeshError):
            g.get_ranks(bad)
    with pytest.raises(RankOutOfRangeError):
        g.my_group(4, "tp")
    with pytest.raises(RankOutOfRangeError):
        g.my_group(-1, "tp")
    groups = pytest.importorskip("rankmesh.megatron.groups")
    with pytest.raises(ParallelConfigError):  # torch objects need the whole world
        groups.mesh_builder(RankGenerator(2, 1, 2, 1, 1, "tp-dp", rank_offset=4))


def test_integers_follow_the_one_rule():
    """rankmesh._check's rule: index-able ints pass, bool/float/str are ArgumentTypeErrors (a
    TypeError, what megatron-core would hit for a float), never truncated."""
    assert RankGenerator(np.int64(2), 1, 2, 1, 1, "tp-dp").tp == 2
    for bad in (True, 2.0, "2"):
        with pytest.raises(ArgumentTypeError) as e:
            RankGenerator(bad, 1, 2, 1, 1, "tp-dp")
        assert isinstance(e.value, TypeError) and (e.value.field, e.value.value) == ("tp", bad)
        with pytest.raises(ArgumentTypeError):
            model_parallel_layout(8, tensor_model_parallel_size=bad)
    with pytest.raises(ArgumentTypeError):
        model_parallel_layout(8.0)
    with pytest.raises(ArgumentTypeError):
        RankGenerator(2, 1, 2, 1, 1, "tp-dp").my_group(1.0, "tp")


def test_rank_comes_first():
    """rankmesh's own methods take (rank, name), as MeshLayout.group(rank, dim); the old order
    is refused with the call to write instead."""
    g = RankGenerator(2, 1, 2, 2, 1, "tp-dp-pp")
    m = model_parallel_layout(8, 2, 2)
    assert g.my_group(5, "tp-pp").tolist() == [0, 1, 4, 5]
    assert m.group(5, "tp").tolist() == g.my_group(5, "tp").tolist()
    old_order = [
        (lambda: g.my_group("tp-pp", 5), "my_group(rank, 'tp-pp')"),
        (lambda: m.group("tp", 5), "group(rank, 'tp')"),
    ]
    for call, fix in old_order:
        with pytest.raises(ArgumentTypeError, match="takes the rank first") as e:
            call()
        assert fix in str(e.value) and e.value.field == "rank"


# -- model_parallel_layout vs megatron's initialize_model_parallel --------------------------------

MP_CONFIGS = [
    # world, tp, pp, cp, ep, etp, order, n_dist_opt, hierarchical cp
    (64, 2, 2, 2, 4, None, "tp-cp-ep-dp-pp", 1, None),
    (64, 2, 2, 2, 4, 1, "tp-cp-ep-dp-pp", 2, [2, 1]),
    (32, 2, 4, 1, 1, None, "tp-cp-pp-ep-dp", 1, None),  # megatron's second test order
    (64, 2, 2, 2, 1, 4, "tp-cp-pp-ep-dp", 2, None),
    (48, 2, 3, 2, 2, 2, "tp-cp-ep-dp-pp", 2, None),
    (64, 4, 2, 4, 8, 1, "tp-cp-ep-dp-pp", 1, [2, 2]),
    (16, 1, 1, 1, 1, None, "tp-cp-ep-dp-pp", 4, None),
    (32, 4, 1, 2, 2, 2, "tp-pp-dp-cp-ep", 2, None),
    (24, 1, 2, 3, 2, 1, "tp-cp-ep-dp-pp", 3, [3]),
]

_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import megatron.core.parallel_state as ps
    pg = dist.get_process_group_ranks
    out = []
    for (world, tp, pp, cp, ep, etp, order, ndo, hcp), ranks in json.loads(sys.argv[1]):
        for rank in ranks:
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
            ps.initialize_model_parallel(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
                expert_model_parallel_size=ep, expert_tensor_parallel_size=etp, order=order,
                num_distributed_optimizer_instances=ndo, hierarchical_context_parallel_sizes=hcp,
                create_gloo_process_groups=False)
            g = {
                "dp_cp": ps._DATA_PARALLEL_GLOBAL_RANKS_WITH_CP, "dp": ps._DATA_PARALLEL_GLOBAL_RANKS,
                "cp": ps._CONTEXT_PARALLEL_GLOBAL_RANKS, "mp": ps._MODEL_PARALLEL_GLOBAL_RANKS,
                "tp": ps._TENSOR_MODEL_PARALLEL_GLOBAL_RANKS, "pp": ps._PIPELINE_GLOBAL_RANKS,
                "embd": ps._EMBEDDING_GLOBAL_RANKS, "pos_embd": ps._POSITION_EMBEDDING_GLOBAL_RANKS,
                "ep": ps._EXPERT_MODEL_PARALLEL_RANKS,
            }
            sets = {
                "intra_dp_cp": pg(ps._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP),
                "tp_dp_cp": pg(ps._TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP),
                "tp_dp": pg(ps._TENSOR_AND_DATA_PARALLEL_GROUP),
                "tp_cp": pg(ps._TENSOR_AND_CONTEXT_PARALLEL_GROUP),
                "ep_tp": pg(ps._EXPERT_TENSOR_PARALLEL_GROUP),
                "tp_ep_mp": pg(ps._EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP),
                "tp_ep_pp": pg(ps._EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP),
                "ep_dp": pg(ps._EXPERT_DATA_PARALLEL_GROUP),
                "intra_ep_dp": pg(ps._INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP),
                "intra_dist_opt_instance": pg(ps._INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP),
            }
            if ndo > 1:
                sets["inter_ep_dp"] = pg(ps._INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP)
            for i, h in enumerate(ps._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS if hcp else []):
                sets[f"hcp_l{i}"] = pg(h)
            out.append({"rank": rank, "lists": g, "sets": sets})
            ps.destroy_model_parallel()
            ps._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS = None  # destroy_model_parallel keeps it
            dist.destroy_process_group()
    errors = []
    for kw in json.loads(sys.argv[2]):
        world = kw.pop("world")
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        try:
            ps.initialize_model_parallel(create_gloo_process_groups=False, **kw)
            errors.append(None)
        except Exception as e:
            errors.append(type(e).__name__)
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    print(json.dumps({"groups": out, "errors": errors}))
    """
)

MP_ERRORS = [
    dict(world=16, tensor_model_parallel_size=32),
    dict(world=16, pipeline_model_parallel_size=3),
    dict(world=16, virtual_pipeline_model_parallel_size=2),
    dict(world=16, tensor_model_parallel_size=2, expert_model_parallel_size=3),
    dict(
        world=32,
        pipeline_model_parallel_size=2,
        tensor_model_parallel_size=2,
        expert_model_parallel_size=4,
        expert_tensor_parallel_size=1,
        order="tp-cp-pp-ep-dp",
    ),  # dp sizes differ, pp not last
    dict(
        world=32,
        pipeline_model_parallel_size=4,
        tensor_model_parallel_size=2,
        expert_model_parallel_size=2,
        expert_tensor_parallel_size=1,
        order="tp-cp-pp-ep-dp",
    ),  # pp groups differ
]


def test_model_parallel_layout_vs_initialize_model_parallel():
    pytest.importorskip("einops")  # megatron's partial-DistOpt and hierarchical-cp paths need it
    plan = []
    rng = np.random.default_rng(0)
    for cfg in MP_CONFIGS:
        world = cfg[0]
        plan.append([list(cfg), sorted({0, world - 1, *map(int, rng.integers(0, world, 2))})])
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(plan), json.dumps(MP_ERRORS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    got = iter(result["groups"])
    for cfg, ranks in plan:
        world, tp, pp, cp, ep, etp, order, ndo, hcp = cfg
        m = model_parallel_layout(
            world,
            tp,
            pp,
            cp,
            ep,
            etp,
            order,
            num_distributed_optimizer_instances=ndo,
            hierarchical_context_parallel_sizes=hcp,
        )
        for rank in ranks:
            theirs = next(got)
            assert theirs["rank"] == rank
            for name, expected in theirs["lists"].items():  # megatron keeps these lists: exact order
                mine = m.group(rank, name)
                assert (None if mine is None else mine.tolist()) == expected, (cfg, rank, name)
            for name, expected in theirs["sets"].items():  # process-group ranks (sorted by torch)
                assert sorted(m.group(rank, name).tolist()) == expected, (cfg, rank, name)
                lay = m.layout(name)
                assert lay is not None and sorted(lay.group(rank, 0).tolist()) == expected, (cfg, rank, name)
            assert set(theirs["lists"]) | set(theirs["sets"]) == set(m.group_names)
    for kw, their_err in zip(MP_ERRORS, result["errors"]):
        kw = dict(kw)
        world = kw.pop("world")
        err = _raises(lambda: model_parallel_layout(world, **kw))
        assert their_err is not None, kw
        assert isinstance(err, (ParallelConfigError, SizeMismatchError)), (kw, err)
        assert their_err in {c.__name__ for c in type(err).__mro__}, (kw, err, their_err)


@pytest.mark.parametrize(
    "world, kw",
    [
        (16, dict(tensor_model_parallel_size=32)),
        (16, dict(pipeline_model_parallel_size=3)),
        (12, dict(tensor_model_parallel_size=2, context_parallel_size=4)),
        (16, dict(tensor_model_parallel_size=2, expert_model_parallel_size=3)),  # the expert product
    ],
)
def test_degrees_that_do_not_fit_the_world_raise_the_one_class(world, kw):
    """rankmesh's one class for "the degrees do not fit the world", in every convention:
    SizeMismatchError (a RuntimeError, megatron-core's class here), field world_size, value the
    world size, and a message that says what to change."""
    err = _raises(lambda: model_parallel_layout(world, **kw))
    assert isinstance(err, SizeMismatchError) and isinstance(err, RuntimeError), err
    assert (err.field, err.value) == ("world_size", world)
    assert f"world_size ({world}) is not divisible" in str(err) and "use a world that is a multiple" in str(err)
    wrong = MeshLayout.world(8)
    err = _raises(lambda: RankGenerator(2, 1, 2, 1, 1, "tp-dp", world=wrong))  # 4 ranks, not 8
    assert isinstance(err, SizeMismatchError) and (err.field, err.value) == ("world", wrong)


def test_model_parallel_layout_checks():
    with pytest.raises(ParallelConfigError):  # dp*cp = 8 not divisible by 3 instances
        model_parallel_layout(16, 2, num_distributed_optimizer_instances=3)
    with pytest.raises(ParallelConfigError):  # expert dp = 2 not divisible by 4 instances
        model_parallel_layout(16, 2, 1, 1, 4, num_distributed_optimizer_instances=4)
    with pytest.raises(ParallelConfigError):
        model_parallel_layout(16, 1, 1, 4, hierarchical_context_parallel_sizes=[2, 3])
    with pytest.raises(InvalidSizeError):
        model_parallel_layout(0)
    with pytest.raises(UnknownNameError):
        model_parallel_layout(8).group(0, "nope")
    m = model_parallel_layout(16, 2, 2)
    assert m.group(9, "pos_embd") is None and m.group(1, "pos_embd").tolist() == [1]
    assert m.group(9, "embd").tolist() == [1, 9]
    assert m.layout("embd") is None


def test_model_parallel_layout_large_world_is_per_rank():
    """1M ranks: every group of one rank, without O(world) work per group."""
    m = model_parallel_layout(2**20, 8, 16, 2, 8, 1, num_distributed_optimizer_instances=2)
    rank = 987_654
    groups = m.groups_of(rank)
    coord = m.decoder.coordinate_of(rank)
    assert groups["tp"].tolist() == list(range(rank - coord["tp"], rank - coord["tp"] + 8))
    assert len(groups["dp"]) == m.dp == 2**20 // (8 * 16 * 2)
    assert len(groups["ep_dp"]) == m.expert_dp == 2**20 // (1 * 8 * 16)
    assert len(groups["intra_dist_opt_instance"]) == 2**19
    for name, g in groups.items():
        if g is not None:
            assert rank in g, name


def test_docstring_examples_run():
    import doctest

    import rankmesh.megatron as module

    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0


# -- process groups and DeviceMeshes through the torch layer (fake backend, in this process) --------


@pytest.mark.parametrize("rank", [0, 13, 63])
def test_process_groups_and_device_mesh(rank):
    dist = pytest.importorskip("torch.distributed")
    groups = pytest.importorskip("rankmesh.megatron.groups")

    m = model_parallel_layout(64, 2, 2, 2, 4, num_distributed_optimizer_instances=2)
    with fake_world(64, rank):
        builder = groups.mesh_builder(m)
        pgs = groups.process_groups(m, builder)
        assert list(pgs) == [n for n in m.group_names if n not in ("embd", "pos_embd")]
        for name, pg in pgs.items():
            assert dist.get_process_group_ranks(pg) == sorted(m.group(rank, name).tolist()), name
        assert pgs["tp"] is pgs["ep_tp"]  # same partition, one process group
        report = builder.report()
        assert report.created == len({id(pg) for pg in pgs.values()})
        with pytest.raises(ParallelConfigError, match=r"groups.group\(builder, m, rank, 'embd'\) on every rank"):
            groups.process_groups(m, builder, names=["embd"])
        embd = groups.group(builder, m, rank, "embd")  # the way the message names
        assert (embd is None) == (m.group(rank, "embd") is None)
        with pytest.raises(ArgumentTypeError, match="RankGenerator or a ModelParallelLayout"):
            groups.mesh_builder(m.layout("tp"))
        dm = groups.device_mesh(m.decoder, ["pp", "dp-cp", "tp"], builder)
        assert tuple(dm.mesh_dim_names) == ("pp", "dp_cp", "tp") and tuple(dm.shape) == (2, 16, 2)
        assert dist.get_process_group_ranks(dm.get_group("dp_cp")) == m.group(rank, "dp_cp").tolist()
        assert dm["dp_cp"].mesh.tolist() == m.group(rank, "dp_cp").tolist()
        assert groups.process_group(m.decoder, "dp-cp", builder) is pgs["dp_cp"]
        # A DeviceMesh's dims share groups by (partition, dim name) only: its pp, dp_cp and tp are
        # groups of their own (FSDP2 needs distinct groups for distinct meshes); asking again
        # makes nothing new.
        assert builder.report().created == report.created + 3
        groups.device_mesh(m.decoder, ["pp", "dp-cp", "tp"], builder)
        assert builder.report().created == report.created + 3
        em = groups.device_mesh(m.expert, ["pp", "dp", "ep", "tp"], builder)
        assert tuple(em.shape) == (2, 4, 4, 2)
        assert em.get_coordinate() is not None


def test_all_groups_partition_the_world():
    m = model_parallel_layout(
        48, 2, 2, 2, 2, 1, num_distributed_optimizer_instances=2, hierarchical_context_parallel_sizes=[2]
    )
    for name in m.group_names:
        if name in ("embd", "pos_embd"):
            with pytest.raises(ParallelConfigError):
                m.all_groups(name)
            continue
        rows = m.all_groups(name)
        assert rows.dtype == np.int32 and sorted(rows.reshape(-1).tolist()) == list(range(48)), name
        by_rank = {r: sorted(row.tolist()) for row in rows for r in row.tolist()}
        for r in range(48):
            assert sorted(m.group(r, name).tolist()) == by_rank[r], (name, r)
    assert set(m.groups_of(5)) == set(m.group_names)
