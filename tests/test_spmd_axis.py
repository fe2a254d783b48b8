"""``spmd_types``' ``MeshAxis.__le__`` by (size, stride) modes (``rankmesh.torchtitan.spmd_axis``),
the installed spmd_types' own ``__le__`` being the oracle (its rank sets, ``all_ranks_from_zero``):

- random modes, overlapping, repeated, stride 0 or size 1 included: :func:`contains` is None or
  the set answer;
- axes of one mesh (a random world, unflattened, sliced and flattened with torch's layouts) take
  the mode path, never the fallback, and agree with spmd_types; axes of two different unflattens
  of one world agree too, through the fallback where their cut points are no chain;
- at 2^20 ranks the (tp 8:1) / (dp W/8:8) comparisons take the mode path and answer what
  spmd_types answers at 2^12 (no timing asserted: docs/upstream_spmd_types_le.md measures it);
- the patch: installed through ``rankmesh.patches`` and by ``rankmesh.torchtitan.accelerate()``,
  stock ``__le__`` back after restore; an unknown body warns once and stays; ``RANKMESH_DISABLE``
  keeps it out silently; no spmd_types, no patch and no warning.
"""

from __future__ import annotations

import itertools
import math
import sys
import warnings

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rankmesh import _once

_mesh_axis = pytest.importorskip("spmd_types._mesh_axis", reason="spmd_types (torchtitan 0.3.0's) is a test dependency")
from rankmesh import patches  # noqa: E402
from rankmesh.torchtitan import spmd_axis  # noqa: E402
from spmd_types._mesh_axis import MeshAxis  # noqa: E402
from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout  # noqa: E402

PATCH = patches.get("spmd_axis_le")


def _stock_le():
    le = MeshAxis.__dict__["__le__"]
    return getattr(le, "__wrapped__", le)


STOCK = _stock_le()
FAST = spmd_axis.make_le(STOCK)


@pytest.fixture(autouse=True)
def _patch_out():
    PATCH.restore()
    yield
    PATCH.restore()
    assert MeshAxis.__dict__["__le__"] is STOCK, "a test left MeshAxis.__le__ replaced"


def counted(fn, *args):
    """``fn(*args)`` and how many times each path of rankmesh's ``__le__`` ran meanwhile."""
    before = dict(spmd_axis.COUNTS)
    out = fn(*args)
    return out, {k: spmd_axis.COUNTS[k] - before[k] for k in before}


def ranks(modes) -> set[int]:
    return {sum(c * d for c, (_, d) in zip(coord, modes)) for coord in itertools.product(*(range(s) for s, _ in modes))}


def a_chain(*layouts) -> bool:
    """Whether the modes decide it, worked out from the rank sets: every layout is one-to-one on its
    modes that move (size > 1, stride > 0), and all their cut points divide one another in order:
    where each run of free digits starts and ends (``stride``, ``size * stride`` of the moving
    modes sorted by stride, a run that ends where the next starts merged with it)."""
    moving = [[(s, d) for s, d in modes if s > 1 and d > 0] for modes in layouts]
    if any(len(ranks(m)) != math.prod(s for s, _ in m) for m in moving):
        return False
    cuts = {1}
    for m in moving:
        runs: list[list[int]] = []
        for d, end in sorted((d, s * d) for s, d in m):
            if runs and runs[-1][1] == d:
                runs[-1][1] = end
            else:
                runs.append([d, end])
        cuts.update(c for run in runs for c in run)
    cuts = sorted(cuts)
    return all(b % a == 0 for a, b in zip(cuts, cuts[1:]))


# -- contains() on raw modes -----------------------------------------------------------------------

modes_lists = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 12)), max_size=3)


@settings(max_examples=400, deadline=None)
@given(modes_lists, modes_lists)
def test_contains_is_none_or_the_rank_set_answer(small, big):
    verdict = spmd_axis.contains(small, big)
    event("undecided" if verdict is None else "decided")
    assert (verdict is not None) == a_chain(small, big), (small, big)
    if verdict is not None:
        assert verdict == (ranks(small) <= ranks(big)), (small, big)


def test_contains_on_hand_picked_modes():
    c = spmd_axis.contains
    assert c([], [(4, 1)]) is True  # {0}
    assert c([(4, 1)], []) is False
    assert c([(2, 4), (2, 1)], [(8, 1)]) is True  # {0,1,4,5} in {0..7}, modes in any order
    assert c([(8, 1)], [(2, 4), (2, 1)]) is False
    assert c([(3, 0), (2, 4)], [(2, 4)]) is True  # stride 0 adds nothing
    assert c([(2, 1), (2, 2)], [(2, 2), (2, 1)]) is True  # not coalesced: still {0..3}
    assert c([(2, 3)], [(4, 1)]) is None  # 3 and 4: no chain
    assert c([(2, 1), (3, 2)], [(3, 1)]) is False  # {0..5}: one run of digits 1..6, so cuts 1 | 3 | 6
    assert c([(3, 1)], [(2, 1), (3, 2)]) is True
    assert c([(2, 2)], [(4, 1), (2, 2)]) is None  # the big layout overlaps itself: {0..5}
    assert c([(2, -1)], [(4, 1)]) is None


# -- rankmesh's __le__ against spmd_types' on MeshAxis ---------------------------------------------


def factorizations(n: int):
    """Strategy: ``n`` split into factors (a random grouping of its prime factors, in random order)."""
    primes, k, p = [], n, 2
    while k > 1:
        while k % p == 0:
            primes.append(p)
            k //= p
        p += 1
    return st.permutations(primes).flatmap(
        lambda ps: st.lists(st.booleans(), min_size=max(len(ps) - 1, 0), max_size=max(len(ps) - 1, 0)).map(
            lambda cuts: _group(ps, cuts)
        )
    )


def _group(ps, cuts) -> tuple[int, ...]:
    out, cur = [], 1
    for i, p in enumerate(ps):
        cur *= p
        if i == len(ps) - 1 or cuts[i]:
            out.append(cur)
            cur = 1
    return tuple(out) or (1,)


worlds = st.lists(st.sampled_from([2, 3, 4, 5, 6, 8]), min_size=1, max_size=3).filter(lambda s: math.prod(s) <= 960)


@st.composite
def unflattened(draw, shape, at_least: int = 0):
    """``shape``'s world after ``at_least``-3 unflattens of random dims: one mesh's ``_MeshLayout``."""
    layout = _MeshLayout.from_sizes_strides(tuple(shape))
    for _ in range(draw(st.integers(at_least, 3))):
        d = draw(st.integers(0, len(layout) - 1))
        sizes = draw(factorizations(layout[d].numel()))
        if len(sizes) > 1:
            layout = layout.splice(d, d + 1, layout[d].composition(_MeshLayout.from_sizes_strides(sizes)))
    return layout


@st.composite
def axis_of(draw, layout):
    """One dim of ``layout`` (a slice) or several flattened, in mesh order or not."""
    dims = draw(st.permutations(range(len(layout))))[: draw(st.integers(1, len(layout)))]
    if draw(st.booleans()):
        dims = sorted(dims)
    return MeshAxis(_MeshLayout([layout[i] for i in dims]).collapse())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_axes_of_one_mesh_take_the_mode_path_and_agree(data):
    layout = data.draw(worlds.flatmap(unflattened))
    a, b = data.draw(axis_of(layout)), data.draw(axis_of(layout))
    for x, y in ((a, b), (b, a)):
        got, moved = counted(FAST, x, y)
        assert got == STOCK(x, y), (x.layout, y.layout)
        assert moved["fallback"] == 0, (x.layout, y.layout)
        assert moved["modes"] == (0 if x == y else 1)
        event(f"a <= b: {got}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_axes_of_two_unflattens_of_one_world_agree(data):
    shape = data.draw(st.sampled_from([[6], [12], [30], [60], [6, 6], [12, 5]]))
    one, two = data.draw(unflattened(shape, 1)), data.draw(unflattened(shape, 1))
    a, b = data.draw(axis_of(one)), data.draw(axis_of(two))
    got, moved = counted(FAST, a, b)
    assert got == STOCK(a, b), (a.layout, b.layout)
    if a != b:
        chain = a_chain(tuple(a.layout.sizes_and_strides), tuple(b.layout.sizes_and_strides))
        assert moved == {"modes": int(chain), "fallback": int(not chain)}, (a.layout, b.layout)
        event("modes" if chain else "fallback")


@settings(max_examples=200, deadline=None)
@given(modes_lists, modes_lists)
def test_any_layouts_agree(small, big):
    """Layouts no mesh makes (overlapping, stride 0): the answer is still spmd_types'."""
    a = MeshAxis(_FlatLayout(tuple(s for s, _ in small), tuple(d for _, d in small)))
    b = MeshAxis(_FlatLayout(tuple(s for s, _ in big), tuple(d for _, d in big)))
    got, moved = counted(FAST, a, b)
    assert got == STOCK(a, b)
    if a != b:
        chain = a_chain(tuple(a.layout.sizes_and_strides), tuple(b.layout.sizes_and_strides))
        assert moved == {"modes": int(chain), "fallback": int(not chain)}, (small, big)
    event("fallback" if moved["fallback"] else "modes")


def test_two_unflattens_with_no_chain_take_the_fallback():
    world = _MeshLayout.from_sizes_strides((6,))
    two_three = world[0].composition(_MeshLayout.from_sizes_strides((2, 3)))  # (2:3, 3:1)
    three_two = world[0].composition(_MeshLayout.from_sizes_strides((3, 2)))  # (3:2, 2:1)
    inner3, inner2 = MeshAxis(two_three[1]), MeshAxis(three_two[1])  # {0,1,2}, {0,1}
    assert counted(FAST, inner3, inner2) == (False, {"modes": 0, "fallback": 1})
    assert counted(FAST, inner2, inner3) == (True, {"modes": 0, "fallback": 1})
    assert counted(FAST, inner2, MeshAxis(world[0])) == (True, {"modes": 1, "fallback": 0})


def test_not_an_axis_is_not_implemented():
    tp = MeshAxis.of(4, 1)
    assert FAST(tp, (4, 1)) is NotImplemented and STOCK(tp, (4, 1)) is NotImplemented
    assert FAST(tp, tp) is True


def test_at_2_20_ranks_the_mode_path_answers_what_spmd_types_answers_at_2_12():
    def axes(world: int):
        tp, dp, full = MeshAxis.of(8, 1), MeshAxis.of(world // 8, 8), MeshAxis.of(world, 1)
        return [(tp, dp), (dp, tp), (tp, full), (dp, full), (full, dp), (MeshAxis.of(2, 8), dp)]

    small = [STOCK(x, y) for x, y in axes(1 << 12)]
    assert small == [False, False, True, True, False, True]
    big, moved = counted(lambda: [FAST(x, y) for x, y in axes(1 << 20)])
    assert big == small
    assert moved == {"modes": len(small), "fallback": 0}


# -- the patch -------------------------------------------------------------------------------------


def test_the_installed_spmd_types_is_recognised():
    assert PATCH.recognise() is None
    assert patches.source_hash(STOCK) == PATCH.gate.known()["spmd_types._mesh_axis.MeshAxis.__le__"]


def test_an_unknown_version_is_named(monkeypatch):
    monkeypatch.setattr(PATCH.gate, "releases", ("9.9.9",))
    assert "spmd_types 0.2.3 is not a version rankmesh has read (supported: 9.9.9)" in PATCH.recognise()


def test_install_and_restore_bring_back_the_stock_le():
    tp, dp = MeshAxis.of(8, 1), MeshAxis.of(4, 8)
    assert PATCH.install()
    assert "spmd_axis_le" in patches.installed()
    assert MeshAxis.__dict__["__le__"] is not STOCK and MeshAxis.__le__.__wrapped__ is STOCK
    assert counted(lambda: (tp <= dp, MeshAxis.of(2, 8) <= dp, dp >= MeshAxis.of(2, 8))) == (
        (False, True, True),
        {"modes": 3, "fallback": 0},
    )
    PATCH.restore()
    assert "spmd_axis_le" not in patches.installed()
    assert MeshAxis.__dict__["__le__"] is STOCK
    assert counted(lambda: tp <= dp)[1] == {"modes": 0, "fallback": 0}


def test_an_unknown_body_warns_once_and_the_original_runs(monkeypatch):
    calls = []

    def someone_elses_le(self, other):
        calls.append(other)
        return STOCK(self, other)

    monkeypatch.setattr(MeshAxis, "__le__", someone_elses_le)
    monkeypatch.setattr(_once, "_seen", set())
    unknown_body = "spmd_axis_le.*MeshAxis.__le__ has a body rankmesh does not know"
    with pytest.warns(RuntimeWarning, match=unknown_body) as record:
        assert not PATCH.install()
    assert len(record) == 1
    assert MeshAxis.__dict__["__le__"] is someone_elses_le and "spmd_axis_le" not in patches.installed()
    assert (MeshAxis.of(2, 8) <= MeshAxis.of(4, 8)) is True and len(calls) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not PATCH.install()  # warned once only


def test_rankmesh_disable_keeps_it_out_without_a_warning(disable, monkeypatch):
    disable("spmd_axis_le")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not PATCH.install()
    assert MeshAxis.__dict__["__le__"] is STOCK and "spmd_axis_le" not in patches.installed()


# -- through rankmesh.torchtitan.accelerate() ------------------------------------------------------


@pytest.fixture
def rt():
    pytest.importorskip("torchtitan.distributed.parallel_dims", reason="torchtitan 0.3.0 is a test dependency")
    import rankmesh.torchtitan as rt

    yield rt
    rt.restore()


def test_accelerate_installs_it_and_restore_takes_it_out(rt):
    with rt.accelerate() as acc:
        assert acc.active and "spmd_axis_le" in patches.installed()
        assert MeshAxis.__le__.__wrapped__ is STOCK
    assert MeshAxis.__dict__["__le__"] is STOCK and "spmd_axis_le" not in patches.installed()
    rt.accelerate()
    assert "spmd_axis_le" in patches.installed()
    rt.restore()
    assert MeshAxis.__dict__["__le__"] is STOCK and not rt.is_accelerated()


def test_accelerate_leaves_a_patch_it_did_not_install(rt):
    assert PATCH.install()
    with rt.accelerate() as acc:
        assert acc.active
    assert "spmd_axis_le" in patches.installed()


def test_accelerate_without_spmd_types_installs_nothing_and_says_nothing(rt, monkeypatch):
    monkeypatch.setitem(sys.modules, "spmd_types", None)  # find_spec("spmd_types") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rt.accelerate() as acc:
            assert acc.active and rt.is_accelerated()
            assert MeshAxis.__dict__["__le__"] is STOCK
