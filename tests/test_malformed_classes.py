"""The five classes of malformed input of issue 19, each refused everywhere it occurs: one test
per class, each covering every place the class occurs and pinning the exact class, ``e.field``
and ``e.value`` (the offending object itself).

1. a flatten name that already names a dim of the root: ``DuplicateNameError``;
2. a hint that suggests an order: the order is applied and works, or the message says none does;
3. a dim name no mesh holds: ``UnknownNameError``, never silently ignored (strict or not);
4. a name that is not valid UTF-8 text (a lone surrogate): ``ArgumentTypeError`` naming the field;
5. an overflow: ``LayoutOverflowError`` naming the degree that overflows the running product.

And the decision for ``ParallelDims.get_mesh(["tp", "tp"])``: a ``DuplicateNameError``, which is
also the ``RuntimeError`` torch raises there.
"""

from __future__ import annotations

import ast
import itertools
import pickle
import re

import numpy as np
import pytest
import rankmesh
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rankmesh import MAX_WORLD_SIZE, MeshLayout
from rankmesh.cli import main as cli_main
from rankmesh.errors import (
    ArgumentTypeError,
    DuplicateNameError,
    InvalidSizeError,
    LayoutOverflowError,
    MegatronConfigError,
    ParallelConfigError,
    ParallelDimsError,
    ParallelDimsOverflowError,
    RankmeshError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.megatron import RankGenerator, groups, model_parallel_layout
from rankmesh.megatron import order as order_module
from rankmesh.megatron.hyper_comm_grid import HyperCommGrid
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from rankmesh.plan import build_plan
from rankmesh.single import single_mesh
from rankmesh.topology import topology_report
from rankmesh.torchtitan.parallel_dims import ParallelDims

from tests.conftest import fake_world

ANY = object()  # a field this test does not pin (a layer of another issue names it)
BAD = "\ud800"  # a lone surrogate: a str Python holds, with no UTF-8 form
W, RANK = 8, 3


def expect(fn, cls, field, value) -> RankmeshError:
    """``fn()`` raises exactly ``cls`` (a RankmeshError) with ``field`` and ``value`` (same type)."""
    with pytest.raises(Exception) as ei:
        fn()
    e = ei.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert isinstance(e, RankmeshError) and isinstance(e, ValueError)
    assert field is ANY or e.field == field, (e.field, str(e))
    assert type(e.value) is type(value) and e.value == value, (e.value, value)
    assert str(e) and str(e) != str(value)  # a message that says what to do
    return e


def _dp_tp() -> MeshLayout:
    return MeshLayout.world(W).unflatten("world", (2, 4), ("dp", "tp"))


# -- 1. a flatten name the root already uses ----------------------------------------------------


def test_1_flatten_name_taken_by_the_root_is_a_duplicate_name_error(small_world):
    m = _dp_tp()
    # the case, and every layout derived from the world, however deep: the root is the
    # world, named "world" (as torch's DeviceMesh._unflatten keeps the root)
    deep = m.flatten("all").unflatten(0, (4, 2), ("a", "b"))["b"]
    pickled = pickle.loads(pickle.dumps(m["dp"]))  # the root's names travel through pickling
    for lay in (m["dp"], m["tp"], m["dp", "tp"], m, deep, pickled):
        e = expect(lambda: lay.flatten("world"), DuplicateNameError, "name", "world")
        assert "root" in str(e) and "world_flat" in str(e)
        assert lay.flatten("world_flat").names == ("world_flat",)  # the suggested name works
    # a root of raw modes (with_modes) has its own names, the default name included
    raw = m.with_modes([m.modes(0), m.modes(1), [(1, 1)]], ["dp", "tp", "dp_tp"])
    expect(lambda: raw["dp", "tp"].flatten(), DuplicateNameError, "name", "dp_tp")
    expect(lambda: raw["dp"].flatten("tp"), DuplicateNameError, "name", "tp")
    assert raw["dp"].flatten("world").names == ("world",)
    # as in torch: a 1-D layout flattened into its own name is itself; names of the mesh (not of
    # the root) are free
    assert MeshLayout.world(W).flatten("world") == MeshLayout.world(W) == MeshLayout.world(W).flatten()
    assert m["dp"].flatten("dp") == m["dp"] and m["dp"].flatten("tp").names == ("tp",)
    # torch refuses the same (a ValueError, which DuplicateNameError also is)
    from torch.distributed.device_mesh import DeviceMesh

    root = DeviceMesh("cpu", torch.arange(W), mesh_dim_names=("world",))
    with pytest.raises(ValueError, match="already exists"):
        root._unflatten(0, (2, 4), ("dp", "tp"))["dp"]._flatten("world")
    # the fast DeviceMesh (rankmesh.mesh) refuses the root's names too
    fast = init_device_mesh("cpu", (W,), mesh_dim_names=("world",))._unflatten(0, (2, 4), ("dp", "tp"))
    expect(lambda: fast["dp"]._flatten("world"), DuplicateNameError, "mesh_dim_name", "world")
    expect(lambda: small_world["mesh"]["dp"]._flatten("tp"), DuplicateNameError, "mesh_dim_name", "tp")
    # torchtitan's flattened loss dim is chosen under the same rule
    from rankmesh.torchtitan import layouts as tt

    deg = tt.degrees(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1)
    expect(lambda: tt.layouts(W, deg, loss_name="world"), DuplicateNameError, "name", "world")
    # megatron's dims_layout renames without flattening: one token takes any name, as several do
    g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
    assert g.dims_layout(["tp"], names=["world"]).names == ("world",)
    assert g.dims_layout(["pp", "tp"], names=["world", "x"]).names == ("world", "x")


# -- 2. every order a hint suggests was applied first --------------------------------------------


def _suggested(message: str, pattern: str):
    m = re.search(pattern, message)
    assert m, message
    return ast.literal_eval(m.group(1))


def test_2_every_suggested_order_is_applied_and_works(capsys):
    # the case: RankGenerator.dims_layout, tokens out of mesh order (and with names)
    g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp-ep-cp")
    e = expect(lambda: g.dims_layout(["tp", "pp"]), SliceOrderError, "dims", ["tp", "pp"])
    fix = _suggested(str(e), r"list them as (\[.*?\])")
    assert fix == ["pp", "tp"] and g.dims_layout(fix).names == ("pp", "tp")
    e = expect(lambda: g.dims_layout(["tp", "dp-pp"], names=["t", "x"]), SliceOrderError, "dims", ["tp", "dp-pp"])
    fix, names = _suggested(str(e), r"list them as (\[.*?\]) with"), _suggested(str(e), r"with names (\[.*?\])")
    assert g.dims_layout(fix, names=names).names == ("x", "t")
    # the core's own slice hint (MeshLayout.__getitem__)
    m = MeshLayout.world(24).unflatten(0, (2, 3, 4), ("a", "b", "c"))
    e = expect(lambda: m["c", "a"], SliceOrderError, "names", ("c", "a"))
    fix = _suggested(str(e), r"e\.g\. (\[.*?\])")
    assert m[tuple(fix)].names == ("a", "c")
    # RankGenerator: a dim of size > 1 missing from the order, every order and every dim
    for order in ("tp-dp", "dp-tp", "pp-tp", "tp-pp", "dp"):
        e = expect(
            lambda: RankGenerator(tp=2, ep=2, dp=2, pp=2, cp=1, order=order), ParallelConfigError, "order", order
        )
        fix = _suggested(str(e), r"e\.g\. ('[a-z-]+')")
        assert RankGenerator(tp=2, ep=2, dp=2, pp=2, cp=1, order=fix).order.startswith(fix)
    # model_parallel_layout: a hint from its generators is proved against the whole call, and
    # so are its own "put pp last" hints
    cases = [
        dict(
            world_size=16,
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=2,
            context_parallel_size=2,
            order="tp-dp-pp",
        ),  # cp missing: it goes in before pp
        dict(
            world_size=16,
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=2,
            expert_model_parallel_size=4,
            order="tp-pp-ep-dp",
        ),  # dp sizes differ: pp goes last
        dict(
            world_size=32,
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=2,
            expert_model_parallel_size=2,
            expert_tensor_parallel_size=1,
            order="tp-pp-ep-dp",
        ),
    ]
    for kw in cases:
        order = kw["order"]
        with pytest.raises((ParallelConfigError, MegatronConfigError)) as ei:
            model_parallel_layout(**kw)
        assert ei.value.field == "order" and ei.value.value == order
        fix = _suggested(str(ei.value), r"e\.g\. (?:order=)?('[a-z-]+')")
        assert model_parallel_layout(**{**kw, "order": fix}).order.startswith(fix)
    # where no order works, the message says so (and suggests none)
    hopeless = dict(
        world_size=16,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        expert_model_parallel_size=4,
        num_distributed_optimizer_instances=3,
    )
    for order, cls in (("tp-pp-ep-dp", MegatronConfigError), ("tp-ep-dp", ParallelConfigError)):
        e = expect(lambda: model_parallel_layout(**hopeless, order=order), cls, "order", order)
        assert "no order" in str(e) and "e.g." not in str(e), str(e)
    # the command line's --order fix: an order is named only once the same plan built with it
    base = ["plan", "--world-size", "16", "--tp", "2", "--pp", "2", "--convention", "megatron"]
    for order in ("tp-dp", "tp-xp-pp", "tp-pp-dp"):
        assert cli_main([*base, "--ep", "4", "--order", order]) == 2
        fix = re.search(r"e\.g\. --order (\S+)", capsys.readouterr().err).group(1)
        build_plan("megatron", 16, tp=2, pp=2, ep=4, order=fix)
    assert cli_main([*base, "--ep", "3", "--order", "tp-dp"]) == 2  # etp*ep*pp = 12 never divides 16
    assert "no order works" in capsys.readouterr().err
    # the fast DeviceMesh's slice hint: applied, it slices
    with fake_world(W, RANK):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
        e = expect(lambda: mesh["tp", "pp"], SliceOrderError, "mesh_dim_names", ("tp", "pp"))
        fix = _suggested(str(e), r"in this order: (\(.*?\))")
        assert mesh[fix].mesh_dim_names == ("pp", "tp")


# the order every hint suggests comes from one pure check, rankmesh.megatron.order.working_order

ORDER_NAMES = ("tp", "pp", "dp", "ep", "cp")
BAD_ORDERS = ["", "-", "tp--dp", "tp-xp-pp", "tp-tp-pp", "tp-dp-pp-", BAD, " tp", 3, None, b"tp", ["tp", "pp"]]
orders = (
    st.permutations(ORDER_NAMES).map("-".join)  # every name: the degrees and pp's place decide
    | st.lists(st.sampled_from(ORDER_NAMES), unique=True, min_size=1, max_size=4).map("-".join)
    | st.sampled_from([*BAD_ORDERS, "TP-CP-EP-DP-PP", "Tp-Dp-Pp"])
)


def _builds(fn) -> bool:
    try:
        fn()
    except RankmeshError:
        return False
    return True


@st.composite
def megatron_calls(draw):
    """model_parallel_layout's arguments over small worlds (the degrees valid, not always fitting)."""
    tp, pp, cp, ep = (draw(st.sampled_from([1, 1, 2, 3, 4])) for _ in range(4))
    fits = draw(st.integers(0, 5))  # mostly a world the dense degrees divide, often the expert ones too
    world_size = tp * pp * cp * draw(st.sampled_from([1, 2, 4, 6])) if fits else draw(st.integers(1, 48))
    kw = dict(
        world_size=world_size,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=draw(st.sampled_from([None, 1, 2])),
        num_distributed_optimizer_instances=draw(st.sampled_from([1, 1, 1, 2, 3])),
        hierarchical_context_parallel_sizes=draw(st.sampled_from([None, None, [cp], [1, cp], [2], [0, cp]])),
        world=draw(
            st.sampled_from(
                [
                    None,
                    None,
                    MeshLayout.world(world_size),
                    MeshLayout.world(world_size, rank_map=list(range(world_size))[::-1]),
                    MeshLayout.world(world_size + 1),
                ]
            )
        ),
    )
    return kw, draw(st.lists(orders, max_size=4))


def _layout(kw: dict, order):
    return lambda: model_parallel_layout(
        kw["world_size"],
        kw["tp"],
        kw["pp"],
        kw["cp"],
        kw["ep"],
        kw["etp"],
        order,
        kw["num_distributed_optimizer_instances"],
        kw["hierarchical_context_parallel_sizes"],
        world=kw["world"],
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(megatron_calls())
def test_2_working_order_is_the_first_candidate_model_parallel_layout_builds_with(call):
    kw, candidates = call
    for order in candidates:
        builds = _builds(_layout(kw, order))
        problem = order_module.order_problem(order, **kw)
        assert (problem is None) == builds, (order, problem)
    works = order_module.working_order(candidates, **kw)
    assert works == next((c for c in candidates if _builds(_layout(kw, c))), None)
    assert works is None or any(works is c for c in candidates)  # one of them, never an order of its own


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(*[st.integers(1, 3)] * 5), st.lists(orders, max_size=4), st.sampled_from([None, "fits", "mapped", 7]))
def test_2_working_order_of_one_rank_generator_is_the_first_it_builds_with(degrees, candidates, world):
    tp, ep, dp, pp, cp = degrees
    n = tp * ep * dp * pp * cp
    world = {
        "fits": MeshLayout.world(n),
        "mapped": MeshLayout.world(n, rank_map=list(range(n))[::-1]),
        7: MeshLayout.world(n + 7),
    }.get(world)
    for order in candidates:
        builds = _builds(lambda: RankGenerator(tp, ep, dp, pp, cp, order, world=world))
        assert (order_module.order_problem(order, tp=tp, ep=ep, dp=dp, pp=pp, cp=cp, world=world) is None) == builds
    works = order_module.working_order(candidates, tp=tp, ep=ep, dp=dp, pp=pp, cp=cp, world=world)
    built = (c for c in candidates if _builds(lambda: RankGenerator(tp, ep, dp, pp, cp, c, world=world)))
    assert works == next(built, None)


def test_2_working_order_is_pure(monkeypatch):
    """It builds no generator, raises for no candidate (of any type) and holds no context state."""
    from contextvars import ContextVar

    def refuse(*args, **kwargs):
        raise AssertionError("working_order built a generator")

    from rankmesh.megatron import layout as layout_module

    assert not [k for k, v in vars(order_module).items() if isinstance(v, ContextVar)]
    for gone in ("_ORDER_PROVER", "_PROVING", "_orders_proved_by", "_first_that_works", "_proved_order"):
        assert not hasattr(order_module, gone) and not hasattr(layout_module, gone)
    # one home per order rule: the calls raise from the same checks that order_problem renders
    for copy in ("_names_problem", "_missing_problem", "_missing_dim_error", "_is_degree", "_names_error"):
        assert not hasattr(order_module, copy) and not hasattr(layout_module, copy)
    assert not hasattr(order_module, "RankGenerator")  # the rules sit below the generator
    monkeypatch.setattr(RankGenerator, "__init__", refuse)
    monkeypatch.setattr(RankGenerator, "_checked", refuse)
    monkeypatch.setattr(layout_module, "model_parallel_layout", refuse)
    every = BAD_ORDERS + ["tp-cp-ep-dp-pp", "tp-pp-ep-dp", "pp", object()]
    for world_size in (1, 12, 16, 17):
        for degrees in (dict(tp=2, pp=2), dict(tp=2, pp=2, ep=4), dict(pp=4, ep=2, etp=1), dict(cp=2, ep=3)):
            assert order_module.working_order(BAD_ORDERS, world_size, **degrees) is None
            works = order_module.working_order(every, world_size, **degrees)
            assert works is None or works in ("tp-cp-ep-dp-pp", "tp-pp-ep-dp", "pp"), works
            for order in every:
                assert isinstance(order_module.order_problem(order, world_size, **degrees), (str, type(None)))
    assert order_module.working_order(iter(["tp-dp", "tp-dp-pp"]), tp=2, dp=2, pp=2) == "tp-dp-pp"
    # pp need not be last where the dense and expert pipeline groups agree; where they differ it must
    same, differ = dict(tp=2, pp=2, ep=2, etp=1), dict(tp=2, pp=4, ep=2, etp=1)
    assert order_module.working_order(["tp-pp-ep-dp", "tp-ep-pp-dp"], 16, **same) == "tp-ep-pp-dp"
    assert order_module.order_problem("tp-pp-ep-dp", 32, **differ) == (
        "the order does not end with pp and the dense and expert pipeline groups differ"
    )
    assert order_module.working_order(["tp-pp-ep-dp", "tp-ep-pp-dp"], 32, **differ) == "tp-ep-pp-dp"
    assert order_module.working_order([], 8) is None
    # invalid degrees raise as the call does; world_size and dp say which call
    with pytest.raises(InvalidSizeError):
        order_module.working_order(["tp"], 8, tp=0)
    with pytest.raises(ArgumentTypeError):
        order_module.working_order(["tp"], 8, tp=2, dp=4)


def test_2_each_call_checks_its_order_once(monkeypatch):
    """model_parallel_layout checks the order once for both generators, which it builds from the
    degrees that check has read; RankGenerator checks its own once."""
    seen = []
    real = order_module._OrderCheck.fault
    monkeypatch.setattr(order_module._OrderCheck, "fault", lambda self, order: seen.append(order) or real(self, order))
    m = model_parallel_layout(16, 2, 2, expert_model_parallel_size=2, order="TP-cp-ep-dp-pp")
    assert seen == ["TP-cp-ep-dp-pp"] and m.decoder.order == m.expert.order == "tp-cp-ep-dp-pp"
    seen.clear()
    RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
    assert seen == ["tp-dp-pp"]


def test_2_every_order_error_carries_the_order_that_works():
    """order_misses_dim and order_pp_not_last carry working_order's answer in ctx["works"], the
    order their message suggests; None exactly where the message says no order works."""
    seen = set()
    for world_size, tp, pp, ep, etp in itertools.product((8, 12, 16, 32), (1, 2), (1, 2, 4), (1, 2, 3, 4), (None, 1)):
        for order in ("tp-dp", "tp-pp-dp", "tp-pp-ep-dp", "dp-pp-tp-ep", "tp-dp-pp", "pp"):
            kw = dict(
                tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp,
                expert_model_parallel_size=ep,
                expert_tensor_parallel_size=etp,
            )
            try:
                model_parallel_layout(world_size, order=order, **kw)
            except RankmeshError as e:
                if e.field != "order":
                    continue
                seen.add(e.kind)
                works = e.ctx["works"]
                if e.kind == "order_pp_not_last":  # the candidates: the order, pp moved last, the default
                    candidates = order_module._order_candidates(order.split("-"))
                    assert works == order_module.working_order(candidates, world_size, tp, pp, 1, ep, etp)
                if works is None:
                    assert "no order" in str(e) and "e.g." not in str(e), str(e)
                else:
                    assert f"e.g. {works!r}" in str(e) or f"e.g. order={works!r}" in str(e), str(e)
                    model_parallel_layout(world_size, order=works, **kw)
    assert seen == {"order_misses_dim", "order_pp_not_last"}


# -- 3. a dim name that no mesh holds is never ignored -------------------------------------------


def test_3_unknown_dim_names_are_unknown_name_errors_everywhere(small_world, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(W))  # HyperCommGrid's world
    lay, builder = small_world["layout"], small_world["builder"]
    g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
    m = model_parallel_layout(8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    places = {
        # topology: strict on or off, and the report's own check
        "topology_report strict": lambda: topology_report(lay, 0, 4, strict=True, strict_dims=("bogus",)),
        "topology_report not strict": lambda: topology_report(lay, 0, 4, strict=False, strict_dims=("bogus",)),
        "topology_report default": lambda: topology_report(lay, 0, 4, strict_dims=("ep", "bogus")),
        "TopologyReport.violations": lambda: topology_report(lay, 0, 4).violations(("bogus",)),
        # the torch layer's fake dims, from every convention that takes them
        "FastDeviceMesh.from_layout": lambda: FastDeviceMesh.from_layout(builder, lay, fake_dims=("tp", "bogus")),
        "megatron.groups.device_mesh": lambda: groups.device_mesh(g, ["pp", "tp"], builder, fake_dims=["bogus"]),
    }
    fields = {k: "strict_dims" if "opology" in k else "fake_dims" for k in places}
    for name, fn in places.items():
        e = expect(fn, UnknownNameError, fields[name], "bogus")
        assert isinstance(e, KeyError)
    # the other arguments that take names refuse them as before
    expect(lambda: lay.size("bogus"), UnknownNameError, "names", "bogus")
    expect(lambda: lay["dp", "bogus"], UnknownNameError, "names", "bogus")
    expect(lambda: builder.process_group(lay, "bogus"), UnknownNameError, "names", "bogus")
    expect(lambda: g.my_group(0, "tp-bogus"), UnknownNameError, "token", "bogus")
    expect(lambda: g.get_mask(g.order, ["bogus"]), UnknownNameError, "token", "bogus")
    expect(lambda: m.group(0, "bogus"), UnknownNameError, "name", "bogus")
    expect(lambda: groups.process_groups(m, builder, names=["tp", "bogus"]), UnknownNameError, "name", "bogus")
    expect(lambda: grid.get_rank_enum(["tp", "bogus"]), UnknownNameError, "dims", "bogus")
    expect(lambda: build_plan("torchtitan", 64).find_dim("bogus"), UnknownNameError, "dim", "bogus")
    pd = ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=W)
    for dims in ("bogus", ["tp", "bogus"], ["pp", "bogus"]):  # pp is disabled: still checked
        expect(lambda: pd.get_optional_mesh(dims), UnknownNameError, "dims", "bogus")
    # megatron-core ignores an unknown high-priority group; rankmesh refuses it before any group
    from rankmesh.megatron import initialize_model_parallel

    expect(
        lambda: initialize_model_parallel(2, 2, high_priority_stream_groups=["dp_cp", "bogus"]),
        UnknownNameError,
        "high_priority_stream_groups",
        "bogus",
    )
    for text in ("dp", ""):  # a str is a list with its brackets missing, even an empty one
        e = expect(
            lambda: initialize_model_parallel(2, 2, high_priority_stream_groups=text),
            ArgumentTypeError,
            "high_priority_stream_groups",
            text,
        )
        assert f"write [{text!r}]" in str(e)
    # the command line: --strict with a family that does not exist
    assert cli_main(["plan", "--world-size", "64", "--strict", "ep,bogus"]) == 2
    assert "unknown bandwidth-hungry family 'bogus'" in capsys.readouterr().err


# -- 4. names that are not valid UTF-8 text -------------------------------------------------------


def test_4_a_name_that_is_not_utf8_text_is_an_argument_type_error_naming_the_field(small_world, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(W))  # HyperCommGrid's world
    lay, builder, mesh = small_world["layout"], small_world["builder"], small_world["mesh"]
    g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
    m = model_parallel_layout(8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    pd = ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=W)
    _, state = lay.__reduce__()
    restore = rankmesh._native._restore
    places = [
        # the Rust core: every argument that takes a name or a dim
        (lambda: lay.unflatten("tp", (2, 2), ("a", BAD)), "names[1]", BAD),
        (lambda: lay.unflatten(BAD, (2,), ("a",)), "dim", BAD),
        (lambda: lay[BAD], "names", BAD),
        (lambda: lay["dp", BAD], "names[1]", BAD),
        (lambda: lay.flatten(BAD), "name", BAD),
        (lambda: lay.with_modes([lay.modes(0)], [BAD]), "names[0]", BAD),
        (lambda: lay.size(BAD), "dim", BAD),
        (lambda: lay.group(0, BAD), "dim", BAD),
        (lambda: lay.modes(BAD), "dim", BAD),
        (lambda: lay.partition_key(BAD), "dim", BAD),
        (lambda: restore(state[0], state[1], state[2], ["dp", BAD], *state[4:]), "names[1]", BAD),
        (lambda: restore(state[0], state[1], state[2], state[3], [BAD]), "root_names[0]", BAD),
        # megatron
        (lambda: RankGenerator(2, 1, 2, 1, 1, f"tp-{BAD}"), "order", f"tp-{BAD}"),
        (lambda: model_parallel_layout(8, 2, order=f"tp-{BAD}-pp"), "order", f"tp-{BAD}-pp"),
        (lambda: g.my_group(0, BAD), "token", BAD),
        (lambda: g.layout(["tp", BAD]), "token", BAD),
        (lambda: g.get_mask(f"{BAD}-tp", "tp"), "order", f"{BAD}-tp"),
        (lambda: g.dims_layout(["pp", "tp"], names=["p", BAD]), "names[1]", BAD),
        (lambda: g.dims_layout(["tp"], names=[BAD]), "names[0]", BAD),
        (lambda: m.group(0, BAD), "name", BAD),
        (lambda: m.layout(BAD), "name", BAD),
        (lambda: HyperCommGrid([2, 4], ["tp", BAD]), "dim_names[1]", BAD),
        (lambda: grid.get_rank_enum(BAD), "dims", BAD),
        (lambda: grid.my_ranks(0, ["tp", BAD]), "dims", BAD),
        # topology, plan, torchtitan
        (lambda: topology_report(lay, 0, 4, strict_dims=("ep", BAD)), "strict_dims[1]", BAD),
        (lambda: build_plan("torchtitan", 64).find_dim(BAD), "dim", BAD),
        (lambda: pd.get_mesh(BAD), "dims", BAD),
        (lambda: pd.get_mesh(["tp", BAD]), "dims[1]", BAD),
        # the torch layer and the fast DeviceMesh
        (lambda: FastDeviceMesh.from_layout(builder, lay, fake_dims=[BAD]), "fake_dims[0]", BAD),
        (lambda: builder.process_group(lay, BAD), "dim", BAD),
        (lambda: builder.process_group(lay, "tp", group_desc=BAD), "group_desc", BAD),
        (lambda: builder.process_group(lay, "tp", tag=BAD), "tag", BAD),
        (lambda: builder.subset_group("k", [RANK], name=BAD), "name", BAD),
        (lambda: mesh["dp"]._flatten(BAD), "mesh_dim_name", BAD),
        (lambda: init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", BAD)), ANY, BAD),  # mesh.py's field
    ]
    for fn, field, value in places:
        e = expect(fn, ArgumentTypeError, field, value)
        assert isinstance(e, TypeError) and "UTF-8" in str(e), str(e)
    # what is valid text passes, non-ASCII included
    assert lay.unflatten("tp", (2, 2), ("ä", "τ")).names == ("dp", "ä", "τ")


# -- 5. an overflow names the degree that overflows the running product ----------------------------


def test_5_every_overflow_names_the_degree_that_overflows_the_running_product(monkeypatch):
    big, over = 2**64, 2**31  # over: the first world size beyond MAX_WORLD_SIZE
    assert over == MAX_WORLD_SIZE + 1
    monkeypatch.setenv("WORLD_SIZE", "8")  # HyperCommGrid's world
    places = [
        # the core, the model every convention follows
        (lambda: MeshLayout.world(big), LayoutOverflowError, "world_size", big),
        (
            lambda: MeshLayout.world(8).unflatten(0, (2, over, 4), ("a", "b", "c")),
            LayoutOverflowError,
            "sizes[1]",
            over,
        ),
        # megatron's RankGenerator: the case, a degree in the middle, then rank_offset
        (lambda: RankGenerator(tp=big, ep=1, dp=1, pp=1, cp=1, order="tp-dp-pp-ep-cp"), LayoutOverflowError, "tp", big),
        (lambda: RankGenerator(tp=2, ep=1, dp=2**29, pp=2, cp=1, order="tp-dp-pp"), LayoutOverflowError, "pp", 2),
        (
            lambda: RankGenerator(2, 1, 2, 1, 1, "tp-dp", rank_offset=over - 3),
            LayoutOverflowError,
            "rank_offset",
            over - 3,
        ),
        # model_parallel_layout
        (lambda: model_parallel_layout(big), LayoutOverflowError, "world_size", big),
        (
            lambda: model_parallel_layout(8, tensor_model_parallel_size=big),
            LayoutOverflowError,
            "tensor_model_parallel_size",
            big,
        ),
        (lambda: model_parallel_layout(8, 2**16, 2**16), LayoutOverflowError, "pipeline_model_parallel_size", 2**16),
        (
            lambda: model_parallel_layout(8, expert_tensor_parallel_size=big),
            LayoutOverflowError,
            "expert_tensor_parallel_size",
            big,
        ),
        (
            lambda: model_parallel_layout(8, expert_model_parallel_size=big),
            LayoutOverflowError,
            "expert_model_parallel_size",
            big,
        ),
        # HyperCommGrid
        (lambda: HyperCommGrid([2, big], ["tp", "dp"]), LayoutOverflowError, "shape[1]", big),
        (lambda: HyperCommGrid([2**16, 2**16], ["tp", "dp"]), LayoutOverflowError, "shape[1]", 2**16),
        # the single mesh
        (lambda: single_mesh(big), LayoutOverflowError, "world_size", big),
        (lambda: single_mesh(8, tp=big), LayoutOverflowError, "tp", big),
        (lambda: single_mesh(8, pp=2**16, ep=2**16), LayoutOverflowError, "ep", 2**16),
        # torchtitan's ParallelDims (and `rankmesh plan`): also a ParallelDimsError (AssertionError)
        (lambda: ParallelDims(1, -1, 1, big, 1, 1, 1, 8), ParallelDimsOverflowError, "tp", big),
        (lambda: ParallelDims(2**16, 2**16, 1, 1, 1, 1, 1, 8), ParallelDimsOverflowError, "dp_shard", 2**16),
        (lambda: ParallelDims(1, -1, 1, 1, 1, 1, 1, big), ParallelDimsOverflowError, "world_size", big),
        (lambda: build_plan("torchtitan", 8, tp=big), ParallelDimsOverflowError, "tp", big),
    ]
    for fn, cls, field, value in places:
        e = expect(fn, cls, field, value)
        assert isinstance(e, LayoutOverflowError) and isinstance(e, OverflowError)
        assert field in str(e), str(e)
        if cls is ParallelDimsOverflowError:
            assert isinstance(e, ParallelDimsError) and isinstance(e, AssertionError)
    # the largest world still fits (ranks up to MAX_WORLD_SIZE - 1), and so does its last rank
    assert RankGenerator(tp=MAX_WORLD_SIZE, ep=1, dp=1, pp=1, cp=1, order="tp").world_size == MAX_WORLD_SIZE
    assert RankGenerator(2, 1, 2, 1, 1, "tp-dp", rank_offset=over - 4).my_group(over - 1, "tp").tolist() == [
        over - 2,
        over - 1,
    ]


# -- ParallelDims.get_mesh with a repeated name ------------------------------------------------------


def test_get_mesh_with_a_repeated_name_is_a_duplicate_name_error_and_still_torchs_runtime_error():
    with fake_world(W, 5):
        pd = ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=W)
        pd.build_mesh(device_type="cpu")
        torchs = pd._global_meshes["dense"]
        with pytest.raises(RuntimeError, match="overlapping"):  # torch's own slicing
            torch.distributed.device_mesh.DeviceMesh.__getitem__(torchs, ("tp", "tp"))
        for dims in (["tp", "tp"], ["fsdp", "tp", "fsdp"], ["pp", "pp"]):  # pp is disabled: still refused
            for get in (pd.get_mesh, pd.get_optional_mesh):
                e = expect(lambda: get(dims), DuplicateNameError, "dims", dims[-1])
                assert isinstance(e, RuntimeError)  # what torchtitan users catch today
        assert np.array_equal(pd.get_mesh(["fsdp", "tp"]).mesh.numpy(), torchs["fsdp", "tp"].mesh.numpy())
