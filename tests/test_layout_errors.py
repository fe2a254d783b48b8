"""Bad input: every case raises its typed error from ``rankmesh.errors``, naming the offending
field and holding the offending value itself (an int, a tuple of sizes, a name; never prose), and
a Rust panic never crosses into Python as anything but InternalError."""

from __future__ import annotations

import ast
import itertools
import pickle
import random
import re

import numpy as np
import pytest
import rankmesh
import torch
from rankmesh import MAX_WORLD_SIZE, MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DimOutOfRangeError,
    DuplicateNameError,
    EmptySliceError,
    IncompatibleLayoutError,
    InternalError,
    InvalidLayoutError,
    InvalidNameError,
    InvalidRankMapError,
    InvalidSizeError,
    LayoutOverflowError,
    RankmeshError,
    RankOutOfRangeError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)

HUGE = 2**200  # does not fit 128 bits
_UNSET = object()


def same(a, b) -> bool:
    """``a == b`` with the same types all the way down (a tuple is not a list, True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def raises(exc: type[RankmeshError], fn, field: str, *mentions, value=_UNSET) -> RankmeshError:
    """Calls ``fn``; asserts it raises exactly ``exc`` with ``.field == field``, ``.value ==
    value`` (same types) when given, and a message that mentions every item of ``mentions``."""
    with pytest.raises(RankmeshError) as info:
        fn()
    e = info.value
    assert type(e) is exc, f"expected {exc.__name__}, got {type(e).__name__}: {e}"
    assert isinstance(e, ValueError)
    assert e.field == field, (e.field, str(e))
    message = str(e)
    for m in mentions:
        assert str(m) in message, f"{m!r} not in {message!r}"
    if value is not _UNSET:
        assert same(e.value, value), (e.value, value)
    return e


@pytest.fixture
def w8():
    return MeshLayout.world(8)


@pytest.fixture
def dp_tp(w8):
    return w8.unflatten("world", (2, 4), ("dp", "tp"))


# ------------------------------------------------------------------------------ sizes


@pytest.mark.parametrize("size", [0, -1, -8])
def test_world_size_not_positive(size):
    raises(InvalidSizeError, lambda: MeshLayout.world(size), "world_size", f"got {size}", value=size)


@pytest.mark.parametrize(
    ("sizes", "field", "bad"),
    [
        ((0, 8), "sizes[0]", 0),
        ((2, 0, 4), "sizes[1]", 0),
        ((2, -4), "sizes[1]", -4),
        ((-2, -4), "sizes[0]", -2),
        ((8, 1, -1), "sizes[2]", -1),
    ],
)
def test_unflatten_size_not_positive(w8, sizes, field, bad):
    names = [f"d{i}" for i in range(len(sizes))]
    raises(InvalidSizeError, lambda: w8.unflatten(0, sizes, names), field, field, f"got {bad}", value=bad)


def test_product_mismatch(w8, dp_tp):
    raises(
        SizeMismatchError,
        lambda: w8.unflatten(0, (2, 2), ("a", "b")),
        "sizes",
        "[2, 2]",
        "is 4",
        "size 8",
        value=(2, 2),
    )
    raises(
        SizeMismatchError,
        lambda: dp_tp.unflatten("tp", [2, 3], ("a", "b")),
        "sizes",
        "[2, 3]",
        "is 6",
        '"tp"',
        "size 4",
        value=(2, 3),
    )
    raises(SizeMismatchError, lambda: w8.unflatten(0, (16,), ("a",)), "sizes", "[16]", "16", "size 8", value=(16,))
    # numpy integers are ints; the value is plain Python ints
    raises(SizeMismatchError, lambda: w8.unflatten(0, np.array([2, 2]), ("a", "b")), "sizes", value=(2, 2))


def test_empty_sizes(w8):
    raises(SizeMismatchError, lambda: w8.unflatten(0, (), ()), "sizes", "sizes is empty", value=())


@pytest.mark.parametrize(("sizes", "names"), [((2, 4), ("a",)), ((2, 4), ("a", "b", "c")), ((8,), ())])
def test_sizes_and_names_lengths_differ(w8, sizes, names):
    raises(
        SizeMismatchError,
        lambda: w8.unflatten(0, sizes, list(names)),
        "names",
        f"{len(sizes)} sizes but {len(names)} names",
        value=names,
    )


# ------------------------------------------------------------------------------ names


def test_duplicate_names(w8, dp_tp):
    raises(DuplicateNameError, lambda: w8.unflatten(0, (2, 4), ("a", "a")), "names", '"a"', value="a")
    # a new name that clashes with a dim the mesh keeps
    raises(DuplicateNameError, lambda: dp_tp.unflatten("tp", (2, 2), ("dp", "x")), "names", '"dp"', value="dp")
    raises(DuplicateNameError, lambda: dp_tp["dp", "dp"], "names", '"dp"', value="dp")


def test_unknown_names(dp_tp):
    for fn in (
        lambda: dp_tp["pp"],
        lambda: dp_tp["dp", "pp"],
        lambda: dp_tp.unflatten("pp", (2,), ("x",)),
        lambda: dp_tp.group(0, "pp"),
        lambda: dp_tp.modes("pp"),
        lambda: dp_tp.size("pp"),
    ):
        e = raises(UnknownNameError, fn, "names", '"pp"', '["dp", "tp"]', value="pp")
        # torch raises KeyError for an unknown dim name; code catching that keeps working
        assert isinstance(e, KeyError)
        assert str(e).startswith("unknown mesh dimension name")  # not KeyError's repr-quoting
    with pytest.raises(KeyError):
        dp_tp["pp"]


def test_empty_name(w8, dp_tp):
    raises(InvalidNameError, lambda: w8.unflatten(0, (2, 4), ("a", "")), "names", 'name ""', "non-empty", value="")
    raises(InvalidNameError, lambda: dp_tp.flatten(""), "name", 'name ""', value="")
    # a str Python holds but that is not valid UTF-8 text: the wrong kind of argument, as for
    # every name (tests/test_malformed_classes.py covers every place)
    raises(ArgumentTypeError, lambda: w8.unflatten(0, (2, 4), ("a", "\ud800")), "names[1]", "surrogate", value="\ud800")


def wrong_type(fn, field: str, value, *mentions) -> ArgumentTypeError:
    """``fn`` raises ArgumentTypeError (also a TypeError) on ``field`` holding ``value``."""
    e = raises(ArgumentTypeError, fn, field, field, *mentions, value=value)
    assert isinstance(e, TypeError)
    return e


def test_arguments_of_wrong_type(w8, dp_tp):
    wrong_type(lambda: w8.unflatten(0, (2, 4), "ab"), "names", "ab", "wrap it")  # a str is not a sequence
    wrong_type(lambda: w8.unflatten(0, (2, 4), ("a", 1)), "names[1]", 1, "got int 1")
    wrong_type(lambda: w8.unflatten(0, (2, 4), None), "names", None)
    wrong_type(lambda: w8.unflatten(0, (2.0, 4), ("a", "b")), "sizes[0]", 2.0, "got float 2.0")
    wrong_type(lambda: w8.unflatten(0, "24", ("a", "b")), "sizes", "24")
    wrong_type(lambda: w8.unflatten(0, 8, ("a",)), "sizes", 8)
    wrong_type(lambda: MeshLayout.world("8"), "world_size", "8", "got str '8'")
    wrong_type(lambda: dp_tp[0], "names", 0)
    wrong_type(lambda: dp_tp["dp", 1], "names[1]", 1)
    wrong_type(lambda: dp_tp.flatten(3), "name", 3)
    wrong_type(lambda: dp_tp.group(0.0, 0), "rank", 0.0)
    wrong_type(lambda: dp_tp.group(0, 1.0), "dim", 1.0)
    wrong_type(lambda: dp_tp.mesh_of(None), "rank", None)


@pytest.mark.parametrize("bad", [True, False, 2.0, 8.0, np.float64(8.0), np.bool_(True), "8", b"8", None, 8j])
def test_int_arguments_follow_the_one_rule(bad):
    """rankmesh._check's rule: ints are what has __index__, except bool; floats (even integral),
    bools and strings are refused, with ArgumentTypeError naming the field and holding the value."""
    w8 = MeshLayout.world(8)
    wrong_type(lambda: MeshLayout.world(bad), "world_size", bad)
    wrong_type(lambda: w8.unflatten(0, (bad, 8), ("a", "b")), "sizes[0]", bad)
    wrong_type(lambda: w8.group(bad, 0), "rank", bad)
    if not isinstance(bad, str):  # a str dim is a name
        wrong_type(lambda: w8.group(0, bad), "dim", bad)
    if isinstance(bad, bool):
        with pytest.raises(ArgumentTypeError, match="write the number itself"):
            MeshLayout.world(bad)


@pytest.mark.parametrize("int_type", [int, np.int8, np.int32, np.int64, np.uint16, np.uint64])
def test_numpy_integers_are_ints(int_type):
    m = MeshLayout.world(int_type(8)).unflatten(int_type(0), (int_type(2), int_type(4)), ("dp", "tp"))
    assert m.shape == (2, 4)
    assert m.group(int_type(6), int_type(1)).tolist() == [4, 5, 6, 7]
    assert m.coordinate_of(torch.tensor(6)) == (1, 2)  # torch ints have __index__ too


# ------------------------------------------------------------------------------ slices


def suggested_order(e: SliceOrderError) -> tuple[str, ...]:
    """The order a SliceOrderError's message suggests (``... e.g. ["dp", "tp"]``)."""
    hint = re.search(r"e\.g\. (\[.*\])$", str(e))
    assert hint, str(e)
    return tuple(ast.literal_eval(hint.group(1)))


def test_slice_out_of_mesh_order(dp_tp):
    raises(SliceOrderError, lambda: dp_tp["tp", "dp"], "names", '["tp", "dp"]', 'e.g. ["dp", "tp"]', value=("tp", "dp"))
    m = MeshLayout.world(24).unflatten(0, (2, 3, 4), ("pp", "dp", "tp"))
    raises(
        SliceOrderError,
        lambda: m["tp", "pp", "dp"],
        "names",
        '["tp", "pp", "dp"]',
        '["pp", "dp", "tp"]',
        value=("tp", "pp", "dp"),
    )
    raises(SliceOrderError, lambda: m[["tp", "pp"]], "names", value=("tp", "pp"))  # a list: the names as a tuple
    # also when a dim has size 1 (torch lets that one through; see test_layout_vs_torch)
    m = MeshLayout.world(8).unflatten(0, (2, 1, 4), ("dp", "pp", "tp"))
    raises(SliceOrderError, lambda: m["pp", "dp"], "names", '["pp", "dp"]', value=("pp", "dp"))


def _layouts_for_slice_hints() -> list[MeshLayout]:
    w = MeshLayout.world(24)
    m = w.unflatten(0, (2, 3, 4), ("pp", "dp", "tp"))
    return [
        m,
        # mesh order is the dims' order, not their strides': tp (innermost) first, then a dim
        # flattened from pp and dp
        w.with_modes([[(4, 1)], [(2, 12), (3, 4)]], ["tp", "pp_dp"]),
        w.with_modes([[(4, 1)], [(2, 12)], [(3, 4)]], ["tp", "pp", "dp"]),
        # dims from a non-adjacent flatten, unflattened again
        m["pp", "tp"].flatten().unflatten("pp_tp", (2, 2, 2), ("x", "y", "z")),
        m.unflatten("tp", (2, 2), ("tp0", "tp1")),
    ]


@pytest.mark.parametrize("layout", _layouts_for_slice_hints(), ids=repr)
def test_slice_order_hint_is_an_order_that_slices(layout):
    tried = 0
    for k in range(2, layout.ndim + 1):
        for names in itertools.permutations(layout.names, k):
            try:
                layout[names]
                continue
            except SliceOrderError as e:
                assert e.value == names
                fix = suggested_order(e)
            tried += 1
            assert sorted(fix) == sorted(names)
            assert layout[fix].names == fix  # the hint works as written
    assert tried > 0


def test_empty_slice(dp_tp):
    for key in [(), []]:
        raises(EmptySliceError, lambda: dp_tp[key], "names", '["dp", "tp"]', value=())


# ------------------------------------------------------------------------------ ranks and dims


@pytest.mark.parametrize("rank", [-1, -8, 8, 9, 2**31 - 1, 2**100])
def test_rank_out_of_range(dp_tp, rank):
    calls = {
        "mesh_of": lambda: dp_tp.mesh_of(rank),
        "coordinate_of": lambda: dp_tp.coordinate_of(rank),
        "group": lambda: dp_tp.group(rank, "tp"),
        "copy_index_of": lambda: dp_tp.copy_index_of(rank),
    }
    for name, fn in calls.items():
        e = raises(RankOutOfRangeError, fn, "rank", f"rank = {rank}", "world of 8 ranks", value=rank)
        assert isinstance(e, IndexError), name


def test_rank_out_of_range_with_rank_map():
    m = MeshLayout.world(4, [3, 1, 0, 2])
    raises(RankOutOfRangeError, lambda: m.group(4, 0), "rank", "rank = 4", value=4)
    raises(RankOutOfRangeError, lambda: m.mesh_of(np.int64(-1)), "rank", "rank = -1", value=-1)


@pytest.mark.parametrize("dim", [2, 3, -3, 100])
def test_dim_out_of_range(dp_tp, dim):
    calls = [
        lambda: dp_tp.group(0, dim),
        lambda: dp_tp.modes(dim),
        lambda: dp_tp.size(dim),
        lambda: dp_tp.unflatten(dim, (1,), ("x",)),
    ]
    for fn in calls:
        e = raises(DimOutOfRangeError, fn, "dim", f"dim = {dim}", "2 dimensions", '["dp", "tp"]', value=dim)
        assert isinstance(e, IndexError)


def test_negative_dims_count_from_the_end(dp_tp):
    assert dp_tp.modes(-1) == dp_tp.modes("tp") == dp_tp.modes(1)
    assert dp_tp.size(-2) == 2


# ------------------------------------------------------------------------------ rank maps


@pytest.mark.parametrize(
    ("rank_map", "value", "mentions"),
    [
        # the value is the rank that appears twice, the entry outside the world, the length, or
        # the shape of a map that is not 1-D
        ([0, 1, 1, 3], 1, ["rank 1 appears at indices 1 and 2", "rank 2 is missing"]),
        ([2, 0, 2, 1], 2, ["rank 2 appears at indices 0 and 2", "rank 3 is missing"]),
        ([0, 1, 2, 4], 4, ["rank_map[3] = 4", "outside 0..4"]),
        ([0, -1, 2, 3], -1, ["rank_map[1] = -1", "outside 0..4"]),
        ([0, 1, 2], 3, ["3 entries", "world_size = 4"]),
        ([0, 1, 2, 3, 4], 5, ["5 entries", "world_size = 4"]),
        (np.array([], dtype=np.int64), 0, ["0 entries"]),
        ([], 0, ["0 entries"]),
        ([[0, 1], [2, 3]], (2, 2), ["1-D", "2 dimensions"]),
        (np.arange(4).reshape(2, 2), (2, 2), ["2 dimensions"]),
        (torch.tensor([0, 0, 1, 2]), 0, ["rank 0 appears at indices 0 and 1", "rank 3 is missing"]),
        (torch.arange(4).reshape(2, 2), (2, 2), ["2 dimensions"]),
        ([0, 1, 2, 2**70], 2**70, ["rank_map[3] = 1180591620717411303424", "outside 0..4"]),
        ([0, 1, 2**200, 3], 2**200, ["rank_map[2] = " + str(2**200)]),
        (np.array([0, 1, 2, 2**40]), 2**40, ["rank_map[3] = 1099511627776"]),
        (np.array([0, 1, 2**64 - 1, 3], dtype=np.uint64), 2**64 - 1, ["rank_map[2] = 18446744073709551615"]),
        (np.array([0, 0, 1, 2], dtype=np.uint8), 0, ["rank 0 appears"]),
    ],
)
def test_rank_map_not_a_permutation(rank_map, value, mentions):
    raises(
        InvalidRankMapError,
        lambda: MeshLayout.world(4, rank_map),
        "rank_map",
        "not a permutation of range(4)",
        *mentions,
        value=value,
    )


@pytest.mark.parametrize(
    ("rank_map", "value", "mentions"),
    [
        # entries that are not ints: the value is the first of them (numpy reads a list as one dtype)
        ([0.0, 1.0, 2.0, 3.0], 0.0, ["float64 entries", "rank_map[0] = 0.0"]),
        (np.arange(4, dtype=np.float32), 0.0, ["float32"]),
        ([True, False, True, False], True, ["bool entries"]),
        ([0, 1, 2, "3"], "0", ["rank_map[0] = '0'"]),
        ([0, 1, None, 3], None, ["NoneType None at rank_map[2]"]),
        (np.array([0, 1, True, 3], dtype=object), True, ["bool True at rank_map[2]"]),
        # not a sequence of ranks at all: the value is the argument
        ("0123", "0123", ["got str '0123'"]),
        (4, 4, ["got int 4"]),
        (4.0, 4.0, ["got float 4.0"]),
        ([[0, 1], [2]], [[0, 1], [2]], ["numpy cannot read"]),
    ],
)
def test_rank_map_of_wrong_type(rank_map, value, mentions):
    wrong_type(lambda: MeshLayout.world(4, rank_map), "rank_map", value, "permutation of range(4)", *mentions)


def test_rank_maps_of_any_integer_type_work():
    perm = [3, 1, 0, 2]
    want = MeshLayout.world(4, perm)
    for form in [
        tuple(perm),
        np.array(perm, dtype=np.uint8),
        np.array(perm[::-1], dtype=np.int32)[::-1],
        np.array(perm, dtype=object),
        np.array(perm, dtype=np.uint64),
        torch.tensor(perm, dtype=torch.int16),
    ]:
        assert MeshLayout.world(4, form) == want
    assert MeshLayout.world(4, range(4)) == MeshLayout.world(4)


def test_world_size_is_checked_before_the_rank_map():
    raises(InvalidSizeError, lambda: MeshLayout.world(0, [[0]]), "world_size", value=0)
    raises(LayoutOverflowError, lambda: MeshLayout.world(2**40, "x"), "world_size", value=2**40)


# ------------------------------------------------------------------------------ overflow


def test_world_size_over_int32():
    e = raises(
        LayoutOverflowError,
        lambda: MeshLayout.world(MAX_WORLD_SIZE + 1),
        "world_size",
        "2147483648",
        "int32",
        value=2**31,
    )
    assert isinstance(e, OverflowError)
    raises(LayoutOverflowError, lambda: MeshLayout.world(2**64), "world_size", str(2**64), value=2**64)
    # the largest world is fine (nothing world-sized is allocated without a rank map)
    assert MeshLayout.world(MAX_WORLD_SIZE).world_size == 2**31 - 1 == MAX_WORLD_SIZE


def test_sizes_product_overflow_blames_the_size_that_overflows(w8):
    big = MAX_WORLD_SIZE
    # big * big fits 64 bits; the third factor overflows: it is the culprit, not "the product"
    raises(
        LayoutOverflowError,
        lambda: w8.unflatten(0, (big, big, big), ("a", "b", "c")),
        "sizes[2]",
        "sizes[2] = 2147483647 overflows",
        "64 bits",
        "multiply to exactly 8",
        value=big,
    )
    raises(
        LayoutOverflowError,
        lambda: w8.unflatten(0, (2, big, big, big, 1), tuple("abcde")),
        "sizes[3]",
        "sizes[3] = 2147483647",
        value=big,
    )


def test_size_over_int32(w8):
    raises(LayoutOverflowError, lambda: w8.unflatten(0, (2**31, 4), ("a", "b")), "sizes[0]", "2147483648", value=2**31)
    raises(LayoutOverflowError, lambda: w8.unflatten(0, (4, 2**100), ("a", "b")), "sizes[1]", str(2**100), value=2**100)


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**127, -(2**127) - 1])
def test_ints_beyond_128_bits(dp_tp, value):
    raises(LayoutOverflowError, lambda: MeshLayout.world(value), "world_size", str(value), "128-bit", value=value)
    raises(
        LayoutOverflowError, lambda: dp_tp.unflatten("tp", (2, value), ("a", "b")), "sizes[1]", str(value), value=value
    )
    raises(LayoutOverflowError, lambda: dp_tp.mesh_of(value), "rank", str(value), value=value)
    raises(LayoutOverflowError, lambda: dp_tp.group(value, 0), "rank", str(value), value=value)
    raises(LayoutOverflowError, lambda: dp_tp.group(0, value), "dim", str(value), value=value)


def test_ints_too_long_to_print():
    # str() of an int of more than 4300 digits raises; the message gives its size instead
    value = 10**5000
    e = raises(LayoutOverflowError, lambda: MeshLayout.world(value), "world_size", "an int of 16610 bits")
    assert e.value is value


def test_ints_at_the_128_bit_edge_are_range_errors(dp_tp):
    raises(InvalidSizeError, lambda: MeshLayout.world(-(2**127)), "world_size", value=-(2**127))
    raises(RankOutOfRangeError, lambda: dp_tp.mesh_of(2**127 - 1), "rank", str(2**127 - 1), value=2**127 - 1)


# ------------------------------------------------------------------------------ incompatible unflatten


def test_incompatible_unflatten_of_non_adjacent_flatten():
    # dims a, c of (2,3,3) over 18 ranks: strides (9, 1), which (3, 2) cannot split
    ac = MeshLayout.world(18).unflatten(0, (2, 3, 3), ("a", "b", "c"))["a", "c"].flatten()
    assert ac.modes("a_c") == [(2, 9), (3, 1)]
    raises(
        IncompatibleLayoutError,
        lambda: ac.unflatten("a_c", (3, 2), ("x", "y")),
        "sizes",
        "[3, 2]",
        '"a_c"',
        "(2,3):(9,1)",
        "non-adjacent",
        value=(3, 2),
    )
    # the sizes that follow the modes work
    assert ac.unflatten("a_c", (2, 3), ("x", "y")).shape == (2, 3)


# ------------------------------------------------------------------------------ corrupted pickles


def test_restore_validates_every_part():
    restore = rankmesh._native._restore
    ok = restore(8, None, [[(2, 4)], [(4, 1)]], ["dp", "tp"])
    assert ok == MeshLayout.world(8).unflatten(0, (2, 4), ("dp", "tp"))
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(2, 4)], [(4, 2)]], ["a", "b"]),
        "axes",
        "(2,4):(4,2)",
        "overlap",
        value=[[(2, 4)], [(4, 2)]],
    )
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(2, 4)], [(8, 1)]], ["a", "b"]),
        "axes",
        "(2,8):(4,1)",
        value=[[(2, 4)], [(8, 1)]],
    )
    raises(
        InvalidLayoutError,
        lambda: restore(6, None, [[(4, 1)]], ["a"]),
        "axes",
        "(4):(1)",
        "world of 6",
        value=[[(4, 1)]],
    )
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(2, 4)], [(4, 1)], [(2, 8)]], ["a", "b", "c"]),
        "axes[2][0]",
        "spans 16",
        "world of 8",
        value=(2, 8),
    )
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(2, 4)], [(0, 1)]], ["a", "b"]),
        "axes[1][0]",
        "(0, 1)",
        value=(0, 1),
    )
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(2, 0)], [(4, 1)]], ["a", "b"]),
        "axes[0][0]",
        "(2, 0)",
        value=(2, 0),
    )
    raises(
        SizeMismatchError,
        lambda: restore(8, None, [[(2, 4)]], ["a", "b"]),
        "names",
        "1 axes but 2 names",
        value=("a", "b"),
    )
    raises(DuplicateNameError, lambda: restore(8, None, [[(2, 4)], [(4, 1)]], ["a", "a"]), "names", '"a"', value="a")
    raises(InvalidNameError, lambda: restore(8, None, [[(8, 1)]], [""]), "names", value="")
    raises(
        InvalidRankMapError, lambda: restore(4, [0, 0, 1, 2], [[(4, 1)]], ["a"]), "rank_map", "rank 0 appears", value=0
    )
    raises(InvalidSizeError, lambda: restore(0, None, [], []), "world_size", value=0)
    # strides so large their span overflows 64 bits: the mode spans more than the world
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(4, 2**63)], [(2, 1)]], ["a", "b"]),
        "axes[0][0]",
        "spans 36893488147419103232",
        value=(4, 2**63),
    )
    # a stride, or a size, beyond 64 bits: an overflow that names it
    raises(
        LayoutOverflowError,
        lambda: restore(8, None, [[(2, 4)], [(4, 2**64)]], ["a", "b"]),
        "axes[1][0][1]",
        "stride",
        value=2**64,
    )
    raises(
        LayoutOverflowError,
        lambda: restore(8, None, [[(2**70, 4)], [(4, 1)]], ["a", "b"]),
        "axes[0][0][0]",
        "size",
        value=2**70,
    )
    raises(
        LayoutOverflowError,
        lambda: restore(8, None, [[(2, 4)], [(4, HUGE)]], ["a", "b"]),
        "axes[1][0][1]",
        "128-bit",
        value=HUGE,
    )
    # wrong types and lengths
    raises(
        InvalidLayoutError,
        lambda: restore(8, None, [[(2, 4)], [(4, 1, 1)]], ["a", "b"]),
        "axes[1][0]",
        "(size, stride) pair",
        value=(4, 1, 1),
    )
    wrong_type(lambda: restore(8, None, [[(2, 4)], [(4, 1.0)]], ["a", "b"]), "axes[1][0][1]", 1.0)
    wrong_type(lambda: restore(8, None, [[(2, 4)], 5], ["a", "b"]), "axes[1]", 5)
    wrong_type(lambda: restore(8, None, "axes", ["a", "b"]), "axes", "axes")
    wrong_type(lambda: restore(8, None, [[(2, 4)], [(4, 1)]], ["a", b"b"]), "names[1]", b"b")
    raises(InvalidLayoutError, lambda: restore(8, None, [[(8, 1)]]), "state", "4 parts", value=3)


class _Tampered:
    """Pickles as a MeshLayout whose payload was altered in transit."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (rankmesh._native._restore, self.args)


def test_corrupted_pickle_payload():
    good = MeshLayout.world(8, [7, 6, 5, 4, 3, 2, 1, 0]).unflatten(0, (2, 4), ("dp", "tp"))
    fn, args = good.__reduce__()
    assert pickle.loads(pickle.dumps(good)) == good
    world, rank_map, axes, names, root_names = args  # derived from the world: its root's names travel
    assert root_names == ["world"]
    bad_modes = pickle.dumps(_Tampered(world, rank_map, [[(2, 4)], [(4, 2)]], names))
    raises(InvalidLayoutError, lambda: pickle.loads(bad_modes), "axes", "(2,4):(4,2)", value=[[(2, 4)], [(4, 2)]])
    bad_world = pickle.dumps(_Tampered(12, None, axes, names))
    raises(InvalidLayoutError, lambda: pickle.loads(bad_world), "axes", "world of 12")
    broken_map = rank_map.copy()
    broken_map[0] = broken_map[1]
    bad_map = pickle.dumps(_Tampered(world, broken_map, axes, names))
    raises(InvalidRankMapError, lambda: pickle.loads(bad_map), "rank_map", "appears at indices 0 and 1", value=6)
    huge_world = pickle.dumps(_Tampered(2**64, None, axes, names))
    raises(LayoutOverflowError, lambda: pickle.loads(huge_world), "world_size", value=2**64)


# the classes a corrupted payload may raise, each naming its field
PAYLOAD_ERRORS = (
    InvalidLayoutError,
    ArgumentTypeError,
    LayoutOverflowError,
    InvalidSizeError,
    InvalidRankMapError,
    SizeMismatchError,
    DuplicateNameError,
    InvalidNameError,
)
_JUNK = [
    None,
    True,
    1.5,
    -1,
    0,
    2**31,
    2**64,
    2**130,
    -(2**200),
    "x",
    b"x",
    "",
    (),
    [],
    {},
    object(),
    (1, 2, 3),
    [(1, 2)],
    np.float64(2.0),
    np.int64(-3),
    np.array([1, 2]),
]


def _corruptions(part):
    """Corrupted variants of one part of a payload: junk in its place and, for sequences, junk in
    place of an item, an item dropped or added, nested down to the ints of the modes."""
    yield from _JUNK
    if isinstance(part, (list, tuple)) and not isinstance(part, str):
        items = list(part)
        for i, item in enumerate(items):
            yield items[:i] + items[i + 1 :]
            yield items + [item]
            for bad in _corruptions(item):
                yield items[:i] + [bad] + items[i + 1 :]


def test_fuzzed_pickle_payloads_raise_typed_errors():
    """Whatever a corrupted payload holds (huge or negative ints, wrong types, wrong lengths), the
    failure is a typed rankmesh error naming its field: never a bare OverflowError or TypeError."""
    good = MeshLayout.world(8, [7, 6, 5, 4, 3, 2, 1, 0]).unflatten(0, (2, 2, 2), ("a", "b", "c"))["a", "c"]
    _, args = good.__reduce__()
    args = (args[0], args[1].tolist(), args[2], args[3])
    payloads = []
    for p, part in enumerate(args):
        for bad in _corruptions(part):
            payloads.append(args[:p] + (bad,) + args[p + 1 :])
    rng = random.Random(0)
    for _ in range(300):  # several parts corrupted at once
        payload = list(args)
        for p in rng.sample(range(4), rng.randint(2, 4)):
            payload[p] = rng.choice(list(_corruptions(args[p])))
        payloads.append(tuple(payload))
    payloads += [args[:3], args + (None,), ()]
    assert len(payloads) > 500
    failures = 0
    for payload in payloads:
        try:
            data = pickle.dumps(_Tampered(*payload))
        except (pickle.PicklingError, TypeError, AttributeError):  # junk that cannot be pickled (object())
            continue
        try:
            back = pickle.loads(data)
        except RankmeshError as e:
            failures += 1
            assert isinstance(e, PAYLOAD_ERRORS), (type(e).__name__, str(e), payload)
            assert e.field, (str(e), payload)
            assert not (isinstance(e.value, str) and " " in e.value), (e.value, payload)  # a value, not prose
        except BaseException as e:  # noqa: BLE001 - the point: nothing untyped escapes
            pytest.fail(f"{type(e).__name__} escaped for payload {payload!r}: {e}")
        else:
            assert isinstance(back, MeshLayout)  # e.g. an int-like junk that still makes a layout
    assert failures > 400


def test_errors_pickle_with_field_and_value(w8):
    with pytest.raises(InvalidSizeError) as info:
        w8.unflatten(0, (2, 0, 4), ("a", "b", "c"))
    e = pickle.loads(pickle.dumps(info.value))
    assert type(e) is InvalidSizeError
    assert (e.field, e.value, str(e)) == (info.value.field, info.value.value, str(info.value))


# ------------------------------------------------------------------------------ panics


def test_panic_becomes_internal_error():
    with pytest.raises(BaseException) as info:
        rankmesh._native._panic_for_test()
    e = info.value
    assert type(e) is InternalError, f"{type(e).__module__}.{type(e).__name__}: {e}"
    assert isinstance(e, rankmesh.errors.InternalError) and isinstance(e, RankmeshError)
    assert type(e).__name__ != "PanicException"
    assert "deliberate panic for the FFI test" in str(e)
    assert "please report" in str(e)
    assert e.value == "deliberate panic for the FFI test"
    assert e.field == ""
    # the extension keeps working afterwards
    assert MeshLayout.world(4).group(1, 0).tolist() == [0, 1, 2, 3]


LAYOUT_ERRORS = [
    InvalidSizeError,
    SizeMismatchError,
    LayoutOverflowError,
    UnknownNameError,
    DuplicateNameError,
    InvalidNameError,
    SliceOrderError,
    EmptySliceError,
    RankOutOfRangeError,
    DimOutOfRangeError,
    InvalidRankMapError,
    IncompatibleLayoutError,
    InvalidLayoutError,
    InternalError,
    ArgumentTypeError,
]


def test_every_error_class_is_a_rankmesh_error():
    import rankmesh.errors as errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, RankmeshError) and issubclass(cls, ValueError)
        e = cls("message", field="field", value=(2, 3))
        assert (str(e), e.field, e.value) == ("message", "field", (2, 3))
        copy = pickle.loads(pickle.dumps(e))
        assert (type(copy), str(copy), copy.field, copy.value) == (cls, "message", "field", (2, 3))
        with pytest.raises(TypeError):  # field and value are keyword-only
            cls("message", "field", "value")
    for cls in LAYOUT_ERRORS:  # every class the native module raises
        assert cls.__name__ in errors.__all__
    # the top level exports the base class and the errors a job catches around its init; the rest
    # are rankmesh.errors' (each also a ValueError, TypeError or KeyError, as Python's would be)
    top = {name for name in rankmesh.__all__ if name.endswith("Error")}
    assert top == {
        "RankmeshError",
        "ConfigMismatchError",
        "ConsistencyTimeoutError",
        "DistributedStateError",
        "ReformError",
    }
    assert all(getattr(rankmesh, name) is getattr(errors, name) for name in top)


def test_an_error_whose_value_cannot_be_pickled_still_pickles_with_its_repr():
    """e.g. MegatronStateError carries the ProcessGroup already installed; errors cross processes."""
    from rankmesh.errors import MegatronStateError

    def unpicklable():  # a local function cannot be pickled
        pass

    e = MegatronStateError("already initialised", field="_TENSOR_MODEL_PARALLEL_GROUP", value=unpicklable)
    copy = pickle.loads(pickle.dumps(e))
    assert (type(copy), str(copy), copy.field) == (MegatronStateError, "already initialised", e.field)
    assert copy.value == repr(unpicklable)


# -- kind, ctx and fix: what a program (and the CLI) reads instead of the message -----------------


def test_every_error_class_has_its_own_stable_kind():
    from rankmesh import errors

    classes = [getattr(errors, n) for n in errors.__all__]
    kinds = {c.kind for c in classes}
    assert len(kinds) == len(classes), "two classes share a kind"
    assert errors.SizeMismatchError.kind == "size_mismatch"
    assert errors.ParallelDimsOverflowError.kind == "parallel_dims_overflow"
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in kinds), kinds


def test_kind_ctx_and_fix_survive_pickling_and_render_both_ways():
    from rankmesh.errors import ConfigMismatchError, InvalidSizeError

    e = InvalidSizeError(
        "tp must be >= 1, got 0",
        field="tp",
        value=0,
        kind="degree_not_positive",
        ctx={"world_size": 8},
        fix="use {tp=1}, or a degree that divides {world_size}",
    )
    back = pickle.loads(pickle.dumps(e))
    assert (back.kind, back.ctx, back.fix, back.field, back.value) == (e.kind, e.ctx, e.fix, "tp", 0)
    assert e.fix_text() == "use tp=1, or a degree that divides world_size"
    flags = {"tp": "--tp", "world_size": "--world-size"}.get
    assert e.fix_text(flags) == "use --tp 1, or a degree that divides --world-size"
    plain = InvalidSizeError("x", field="tp", value=0)
    assert (plain.kind, plain.ctx, plain.fix, plain.fix_text()) == ("invalid_size", {}, None, None)
    c = ConfigMismatchError("differ", field="fingerprint", fingerprint=3, kind="config_differs", fix="see {rank}")
    back = pickle.loads(pickle.dumps(c))
    assert (back.kind, back.fingerprint, back.fix_text()) == ("config_differs", 3, "see rank")


def test_a_degree_error_carries_a_kind_and_a_fix_from_every_convention():
    from rankmesh import model_parallel_layout
    from rankmesh.torchtitan.layouts import resolve_degrees

    with pytest.raises(rankmesh.RankmeshError) as tt:
        resolve_degrees(dp_replicate=1, dp_shard=-1, cp=1, tp=0, pp=1, ep=1, etp=1, world_size=8)
    with pytest.raises(rankmesh.RankmeshError) as mc:
        model_parallel_layout(8, 0)
    for e, field in ((tt.value, "tp"), (mc.value, "tensor_model_parallel_size")):
        assert e.kind == "degree_not_positive" and e.field == field
        assert e.fix_text() == f"use {field}=1 to disable tensor parallelism, or a degree that divides world_size"
