"""``rankmesh.Slice``, the one value of placement arithmetic (offset + (size, stride) modes), and the
layout queries built on it (``MeshLayout.group_slice``, ``MeshLayout.same_groups``), against
brute force over the rank sets; malformed arguments get typed errors naming the field.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rankmesh import MeshLayout, Slice
from rankmesh.errors import ArgumentTypeError, InvalidLayoutError, RankOutOfRangeError


def ranks_of(offset: int, modes: list[tuple[int, int]]) -> list[int]:
    """The ranks in index order, last mode fastest: the definition, by brute force."""
    coords = itertools.product(*(range(s) for s, _ in modes))
    return [offset + sum(c * d for c, (_, d) in zip(coord, modes)) for coord in coords]


@st.composite
def slices(draw) -> tuple[int, list[tuple[int, int]]]:
    """Offset and modes that nest (each stride at least the span of the smaller ones), in a random order."""
    modes, span = [], 1
    for _ in range(draw(st.integers(0, 3))):
        size = draw(st.integers(1, 4))
        stride = span * draw(st.integers(1, 3)) + draw(st.integers(0, span))
        modes.append((size, stride))
        span += (size - 1) * stride
    order = draw(st.permutations(range(len(modes))))
    return draw(st.integers(0, 30)), [modes[i] for i in order]


@settings(max_examples=300, deadline=None)
@given(slices())
def test_a_slice_holds_its_ranks_in_index_order(sl):
    offset, modes = sl
    s = Slice(offset, modes)
    want = ranks_of(offset, modes)
    assert s.ranks().tolist() == want
    assert (len(s), s.offset, s.last) == (len(want), want[0] if not modes else min(want), max(want))
    for i, r in enumerate(want):
        assert s.rank_at(i) == r and s.index_of(r) == i and r in s
    outside = set(range(max(want) + 3)) - set(want)
    assert all(r not in s and s.index_of(r) is None and s.coordinates(r) is None for r in outside)
    assert Slice.recognise(np.array(want, dtype=np.int64)) == s
    assert hash(Slice.recognise(np.array(want, dtype=np.int64))) == hash(s)
    r = s.as_range()
    assert r is None or list(r) == sorted(want)


@settings(max_examples=300, deadline=None)
@given(slices(), slices())
def test_two_slices_meet_as_their_rank_sets(a, b):
    x, y = Slice(*a), Slice(*b)
    sx, sy = set(ranks_of(*a)), set(ranks_of(*b))
    assert x.first_shared_rank(y) == (min(sx & sy) if sx & sy else None)
    assert x.intersects(y) == bool(sx & sy)
    x0, y0 = Slice(0, a[1]), Slice(0, b[1])
    verdict = x0.subset_by_modes(y0)
    assert verdict is None or verdict == (set(ranks_of(0, a[1])) <= set(ranks_of(0, b[1])))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12))
def test_recognise_answers_only_for_a_slice(ranks):
    s = Slice.recognise(np.array(ranks, dtype=np.int64))
    if s is not None:
        assert s.ranks().tolist() == ranks


def test_recognise_on_hand_picked_ranks():
    r = lambda xs: Slice.recognise(np.array(xs, dtype=np.int64))  # noqa: E731
    assert r([8, 9, 12, 13]) == Slice(8, [(2, 4), (2, 1)])
    assert r([0, 2, 1, 3]) == Slice(0, [(2, 1), (2, 2)])  # a transposed 2x2: modes not by stride
    assert r([0, 1, 3]) is None and r([2, 1]) is None and r([1, 1]) is None and r([-1, 0]) is None
    assert r([5]) == Slice(5) and Slice(5).modes == []


def test_ranges_are_slices():
    assert Slice.of_range(range(3, 20, 4)) == Slice(3, [(5, 4)])
    assert Slice.of_range(range(7, 6, -1)) == Slice(7)  # one rank: any step
    assert Slice.of_range(range(3, 20, 4)).as_range() == range(3, 23, 4)


@pytest.mark.parametrize(
    "make, cls, field",
    [
        (lambda: Slice(-1), RankOutOfRangeError, "rank"),
        (lambda: Slice(0, [(2, 2), (4, 1)]), InvalidLayoutError, "modes"),  # {0..3} + {0, 2}: overlap
        (lambda: Slice(0, [(0, 1)]), InvalidLayoutError, "modes[0]"),
        (lambda: Slice(0, [(2, -1)]), InvalidLayoutError, "modes[0]"),
        (lambda: Slice(0, [(2, 1, 3)]), InvalidLayoutError, "axes[0][0]"),
        (lambda: Slice(2**31 - 2, [(4, 1)]), RankOutOfRangeError, "rank"),
        (lambda: Slice(1.5), ArgumentTypeError, "offset"),
        (lambda: Slice(0, "ab"), ArgumentTypeError, "axes[0]"),
        (lambda: Slice.of_range(range(4, 4)), InvalidLayoutError, "ranks"),
        (lambda: Slice.of_range(range(8, 0, -2)), InvalidLayoutError, "ranks"),
        (lambda: Slice.of_range([0, 1]), ArgumentTypeError, "ranks"),
        (lambda: Slice(0).intersects([0]), ArgumentTypeError, "other"),
        (lambda: Slice(0).index_of("0"), ArgumentTypeError, "rank"),
    ],
)
def test_malformed_slices_are_typed_errors(make, cls, field):
    with pytest.raises(cls) as e:
        make()
    assert e.value.field == field, e.value


def test_rank_at_outside_is_an_index_error():
    with pytest.raises(IndexError):
        Slice(0, [(4, 1)]).rank_at(4)


@pytest.mark.parametrize("seed", range(30))
def test_group_slice_is_the_group_as_a_set(seed):
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.choice([1, 2, 3, 4], size=int(rng.integers(1, 4)))]
    names = [f"d{i}" for i in range(len(sizes))]
    world = int(np.prod(sizes))
    m = MeshLayout.world(world).unflatten(0, sizes, names)
    if len(names) > 1:
        pick = sorted(rng.choice(len(names), size=2, replace=False).tolist())
        m = m[tuple(names[i] for i in pick)].flatten("f")
    for rank in range(world):
        for d in range(m.ndim):
            assert m.group_slice(rank, d).ranks().tolist() == sorted(m.group(rank, d).tolist())
    if world > 1:
        mapped = MeshLayout.world(world, np.roll(np.arange(world), 1))
        assert mapped.group_slice(0, 0) is None  # not in rank order: read group()


def test_same_groups_compares_partitions():
    m = MeshLayout.world(12).unflatten(0, (2, 3, 2), ("a", "b", "c"))
    n = MeshLayout.world(12).unflatten(0, (2, 6), ("x", "y"))
    assert m["b", "c"].flatten("f").same_groups(n["y"])
    assert not m["a"].same_groups(m["c"])
    assert m["a", "b", "c"].flatten("f").same_groups(MeshLayout.world(12))
    # the same groups over different worlds (a rank map): decided by each rank's least group-mate
    plain = MeshLayout.world(4).unflatten(0, (2, 2), ("p", "q"))  # p: {0, 2}, {1, 3}
    mapped = MeshLayout.world(4, [0, 2, 1, 3]).unflatten(0, (2, 2), ("p", "q"))  # q: {0, 2}, {1, 3}
    assert plain["p"].same_groups(mapped["q"]) and not plain["p"].same_groups(mapped["p"])
    with pytest.raises(ArgumentTypeError):
        m.same_groups("a")
