"""Bad input: every case raises its typed error from ``rankmesh.errors``, naming the offending
field and value, and a Rust panic never crosses into Python as anything but InternalError."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import rankmesh
import torch
from rankmesh import MAX_WORLD_SIZE, MeshLayout
from rankmesh.errors import (
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


def raises(exc: type[RankmeshError], fn, field: str, *mentions) -> RankmeshError:
    """Calls ``fn``; asserts it raises exactly ``exc`` with ``.field == field`` and a message
    that mentions every item of ``mentions``."""
    with pytest.raises(RankmeshError) as info:
        fn()
    e = info.value
    assert type(e) is exc, f"expected {exc.__name__}, got {type(e).__name__}: {e}"
    assert isinstance(e, ValueError)
    assert e.field == field, (e.field, str(e))
    message = str(e)
    for m in mentions:
        assert str(m) in message, f"{m!r} not in {message!r}"
    assert isinstance(e.value, str)
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
    e = raises(InvalidSizeError, lambda: MeshLayout.world(size), "world_size", f"got {size}")
    assert e.value == str(size)


@pytest.mark.parametrize(
    ("sizes", "field", "bad"),
    [((0, 8), "sizes[0]", 0), ((2, 0, 4), "sizes[1]", 0), ((2, -4), "sizes[1]", -4), ((-2, -4), "sizes[0]", -2),
     ((8, 1, -1), "sizes[2]", -1)],
)
def test_unflatten_size_not_positive(w8, sizes, field, bad):
    names = [f"d{i}" for i in range(len(sizes))]
    e = raises(InvalidSizeError, lambda: w8.unflatten(0, sizes, names), field, field, f"got {bad}")
    assert e.value == str(bad)


def test_product_mismatch(w8, dp_tp):
    raises(SizeMismatchError, lambda: w8.unflatten(0, (2, 2), ("a", "b")), "sizes", "[2, 2]", "is 4", "size 8")
    raises(SizeMismatchError, lambda: dp_tp.unflatten("tp", (2, 3), ("a", "b")), "sizes", "[2, 3]", "is 6", '"tp"', "size 4")
    raises(SizeMismatchError, lambda: w8.unflatten(0, (16,), ("a",)), "sizes", "[16]", "16", "size 8")


def test_empty_sizes(w8):
    raises(SizeMismatchError, lambda: w8.unflatten(0, (), ()), "sizes", "sizes is empty")


@pytest.mark.parametrize(("sizes", "names"), [((2, 4), ("a",)), ((2, 4), ("a", "b", "c")), ((8,), ())])
def test_sizes_and_names_lengths_differ(w8, sizes, names):
    raises(SizeMismatchError, lambda: w8.unflatten(0, sizes, names), "names",
           f"{len(sizes)} sizes but {len(names)} names")


# ------------------------------------------------------------------------------ names


def test_duplicate_names(w8, dp_tp):
    e = raises(DuplicateNameError, lambda: w8.unflatten(0, (2, 4), ("a", "a")), "names", '"a"')
    assert e.value == "a"
    # a new name that clashes with a dim the mesh keeps
    raises(DuplicateNameError, lambda: dp_tp.unflatten("tp", (2, 2), ("dp", "x")), "names", '"dp"')
    raises(DuplicateNameError, lambda: dp_tp["dp", "dp"], "names", '"dp"')


def test_unknown_names(dp_tp):
    for fn in (lambda: dp_tp["pp"], lambda: dp_tp["dp", "pp"], lambda: dp_tp.unflatten("pp", (2,), ("x",)),
               lambda: dp_tp.group(0, "pp"), lambda: dp_tp.modes("pp"), lambda: dp_tp.size("pp")):
        e = raises(UnknownNameError, fn, "names", '"pp"', '["dp", "tp"]')
        assert e.value == "pp"
        # torch raises KeyError for an unknown dim name; code catching that keeps working
        assert isinstance(e, KeyError)
        assert str(e).startswith("unknown mesh dimension name")  # not KeyError's repr-quoting
    with pytest.raises(KeyError):
        dp_tp["pp"]


def test_empty_name(w8, dp_tp):
    e = raises(InvalidNameError, lambda: w8.unflatten(0, (2, 4), ("a", "")), "names", 'name ""', "non-empty")
    assert e.value == ""
    raises(InvalidNameError, lambda: dp_tp.flatten(""), "name", 'name ""')


def test_names_of_wrong_type(w8, dp_tp):
    with pytest.raises(TypeError, match="names"):
        w8.unflatten(0, (2, 4), "ab")  # a str is not a sequence of names
    with pytest.raises(TypeError, match="names"):
        w8.unflatten(0, (2, 4), ("a", 1))
    with pytest.raises(TypeError, match=r"sizes\[0\]"):
        w8.unflatten(0, (2.0, 4), ("a", "b"))
    with pytest.raises(TypeError, match="world_size"):
        MeshLayout.world("8")
    with pytest.raises(TypeError):
        dp_tp[0]


# ------------------------------------------------------------------------------ slices


def test_slice_out_of_mesh_order(dp_tp):
    e = raises(SliceOrderError, lambda: dp_tp["tp", "dp"], "names", '["tp", "dp"]', 'e.g. ["dp", "tp"]')
    assert e.value == '["tp", "dp"]'
    m = MeshLayout.world(24).unflatten(0, (2, 3, 4), ("pp", "dp", "tp"))
    raises(SliceOrderError, lambda: m["tp", "pp", "dp"], "names", '["tp", "pp", "dp"]', '["pp", "dp", "tp"]')
    # also when a dim has size 1 (torch lets that one through; see test_layout_vs_torch)
    m = MeshLayout.world(8).unflatten(0, (2, 1, 4), ("dp", "pp", "tp"))
    raises(SliceOrderError, lambda: m["pp", "dp"], "names", '["pp", "dp"]')


def test_empty_slice(dp_tp):
    for key in [(), []]:
        e = raises(EmptySliceError, lambda: dp_tp[key], "names", '["dp", "tp"]')
        assert e.value == "()"


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
        e = raises(RankOutOfRangeError, fn, "rank", f"rank = {rank}", "world of 8 ranks")
        assert e.value == str(rank), name
        assert isinstance(e, IndexError)


def test_rank_out_of_range_with_rank_map():
    m = MeshLayout.world(4, [3, 1, 0, 2])
    raises(RankOutOfRangeError, lambda: m.group(4, 0), "rank", "rank = 4")
    raises(RankOutOfRangeError, lambda: m.mesh_of(-1), "rank", "rank = -1")


@pytest.mark.parametrize("dim", [2, 3, -3, 100])
def test_dim_out_of_range(dp_tp, dim):
    calls = [lambda: dp_tp.group(0, dim), lambda: dp_tp.modes(dim), lambda: dp_tp.size(dim),
             lambda: dp_tp.unflatten(dim, (1,), ("x",))]
    for fn in calls:
        e = raises(DimOutOfRangeError, fn, "dim", f"dim = {dim}", "2 dimensions", '["dp", "tp"]')
        assert e.value == str(dim)
        assert isinstance(e, IndexError)


def test_negative_dims_count_from_the_end(dp_tp):
    assert dp_tp.modes(-1) == dp_tp.modes("tp") == dp_tp.modes(1)
    assert dp_tp.size(-2) == 2


# ------------------------------------------------------------------------------ rank maps


@pytest.mark.parametrize(
    ("rank_map", "mentions"),
    [
        ([0, 1, 1, 3], ["rank 1 appears at indices 1 and 2", "rank 2 is missing"]),
        ([2, 0, 2, 1], ["rank 2 appears at indices 0 and 2", "rank 3 is missing"]),
        ([0, 1, 2, 4], ["rank_map[3] = 4", "outside 0..4"]),
        ([0, -1, 2, 3], ["rank_map[1] = -1", "outside 0..4"]),
        ([0, 1, 2], ["3 entries", "world_size = 4"]),
        ([0, 1, 2, 3, 4], ["5 entries", "world_size = 4"]),
        (np.array([], dtype=np.int64), ["0 entries"]),
        ([0.0, 1.0, 2.0, 3.0], ["dtype float64"]),
        (np.arange(4, dtype=np.float32), ["dtype float32"]),
        ([True, False, True, False], ["dtype bool"]),
        ([[0, 1], [2, 3]], ["1-D", "2 dimensions"]),
        (np.arange(4).reshape(2, 2), ["2 dimensions"]),
        (torch.tensor([0, 0, 1, 2]), ["rank 0 appears at indices 0 and 1", "rank 3 is missing"]),
        (torch.arange(4).reshape(2, 2), ["2 dimensions"]),
        ([0, 1, 2, 2**70], ["dtype object"]),
        (np.array([0, 1, 2, 2**40]), ["rank_map[3] = 1099511627776"]),
    ],
)
def test_rank_map_not_a_permutation(rank_map, mentions):
    e = raises(InvalidRankMapError, lambda: MeshLayout.world(4, rank_map), "rank_map",
               "not a permutation of range(4)", *mentions)
    for m in mentions:
        assert m in e.value


# ------------------------------------------------------------------------------ overflow


def test_world_size_over_int32():
    e = raises(LayoutOverflowError, lambda: MeshLayout.world(MAX_WORLD_SIZE + 1), "world_size", "2147483648", "int32")
    assert e.value == "2147483648"
    assert isinstance(e, OverflowError)
    raises(LayoutOverflowError, lambda: MeshLayout.world(2**64), "world_size", str(2**64))
    # the largest world is fine (nothing world-sized is allocated without a rank map)
    assert MeshLayout.world(MAX_WORLD_SIZE).world_size == 2**31 - 1 == MAX_WORLD_SIZE


def test_sizes_product_overflows_64_bits(w8):
    big = MAX_WORLD_SIZE
    e = raises(LayoutOverflowError, lambda: w8.unflatten(0, (big, big, big), ("a", "b", "c")), "sizes",
               str(big), "64 bits")
    assert str(big) in e.value


def test_size_over_int32(w8):
    raises(LayoutOverflowError, lambda: w8.unflatten(0, (2**31, 4), ("a", "b")), "sizes[0]", "2147483648")
    raises(LayoutOverflowError, lambda: w8.unflatten(0, (4, 2**100), ("a", "b")), "sizes[1]", str(2**100))


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**127, -(2**127) - 1])
def test_ints_beyond_128_bits(dp_tp, value):
    raises(LayoutOverflowError, lambda: MeshLayout.world(value), "world_size", str(value), "128-bit")
    raises(LayoutOverflowError, lambda: dp_tp.unflatten("tp", (2, value), ("a", "b")), "sizes[1]", str(value))
    raises(LayoutOverflowError, lambda: dp_tp.mesh_of(value), "rank", str(value))
    raises(LayoutOverflowError, lambda: dp_tp.group(value, 0), "rank", str(value))
    raises(LayoutOverflowError, lambda: dp_tp.group(0, value), "dim", str(value))


def test_ints_at_the_128_bit_edge_are_range_errors(dp_tp):
    raises(InvalidSizeError, lambda: MeshLayout.world(-(2**127)), "world_size")
    raises(RankOutOfRangeError, lambda: dp_tp.mesh_of(2**127 - 1), "rank", str(2**127 - 1))


# ------------------------------------------------------------------------------ incompatible unflatten


def test_incompatible_unflatten_of_non_adjacent_flatten():
    # dims a, c of (2,3,3) over 18 ranks: strides (9, 1), which (3, 2) cannot split
    ac = MeshLayout.world(18).unflatten(0, (2, 3, 3), ("a", "b", "c"))["a", "c"].flatten()
    assert ac.modes("a_c") == [(2, 9), (3, 1)]
    e = raises(IncompatibleLayoutError, lambda: ac.unflatten("a_c", (3, 2), ("x", "y")), "sizes",
               "[3, 2]", '"a_c"', "(2,3):(9,1)", "non-adjacent")
    assert "(2,3):(9,1)" in e.value
    # the sizes that follow the modes work
    assert ac.unflatten("a_c", (2, 3), ("x", "y")).shape == (2, 3)


# ------------------------------------------------------------------------------ corrupted pickles


def test_restore_validates_every_part():
    restore = rankmesh._native._restore
    ok = restore(8, None, [[(2, 4)], [(4, 1)]], ["dp", "tp"])
    assert ok == MeshLayout.world(8).unflatten(0, (2, 4), ("dp", "tp"))
    raises(InvalidLayoutError, lambda: restore(8, None, [[(2, 4)], [(4, 2)]], ["a", "b"]), "axes",
           "(2,4):(4,2)", "overlap")
    raises(InvalidLayoutError, lambda: restore(8, None, [[(2, 4)], [(8, 1)]], ["a", "b"]), "axes", "(2,8):(4,1)")
    raises(InvalidLayoutError, lambda: restore(6, None, [[(4, 1)]], ["a"]), "axes", "(4):(1)", "world of 6")
    raises(InvalidLayoutError, lambda: restore(8, None, [[(2, 4)], [(4, 1)], [(2, 8)]], ["a", "b", "c"]),
           "axes", "world of 8")
    raises(InvalidLayoutError, lambda: restore(8, None, [[(2, 4)], [(0, 1)]], ["a", "b"]), "axes[1]", "0:1")
    raises(InvalidLayoutError, lambda: restore(8, None, [[(2, 0)], [(4, 1)]], ["a", "b"]), "axes[0]", "2:0")
    raises(SizeMismatchError, lambda: restore(8, None, [[(2, 4)]], ["a", "b"]), "names", "1 axes but 2 names")
    raises(DuplicateNameError, lambda: restore(8, None, [[(2, 4)], [(4, 1)]], ["a", "a"]), "names", '"a"')
    raises(InvalidNameError, lambda: restore(8, None, [[(8, 1)]], [""]), "names")
    raises(InvalidRankMapError, lambda: restore(4, [0, 0, 1, 2], [[(4, 1)]], ["a"]), "rank_map", "rank 0 appears")
    raises(InvalidSizeError, lambda: restore(0, None, [], []), "world_size")
    # strides so large their span overflows 64 bits
    raises(InvalidLayoutError, lambda: restore(8, None, [[(4, 2**63)], [(2, 1)]], ["a", "b"]), "axes")


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
    world, rank_map, axes, names = args
    bad_modes = pickle.dumps(_Tampered(world, rank_map, [[(2, 4)], [(4, 2)]], names))
    raises(InvalidLayoutError, lambda: pickle.loads(bad_modes), "axes", "(2,4):(4,2)")
    bad_world = pickle.dumps(_Tampered(12, None, axes, names))
    raises(InvalidLayoutError, lambda: pickle.loads(bad_world), "axes", "world of 12")
    broken_map = rank_map.copy()
    broken_map[0] = broken_map[1]
    bad_map = pickle.dumps(_Tampered(world, broken_map, axes, names))
    raises(InvalidRankMapError, lambda: pickle.loads(bad_map), "rank_map", "appears at indices 0 and 1")


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
    assert isinstance(e, rankmesh.InternalError) and isinstance(e, RankmeshError)
    assert type(e).__name__ != "PanicException"
    assert "deliberate panic for the FFI test" in str(e)
    assert "please report" in str(e)
    assert e.value == "deliberate panic for the FFI test"
    assert e.field == ""
    # the extension keeps working afterwards
    assert MeshLayout.world(4).group(1, 0).tolist() == [0, 1, 2, 3]


LAYOUT_ERRORS = [
    InvalidSizeError, SizeMismatchError, LayoutOverflowError, UnknownNameError, DuplicateNameError,
    InvalidNameError, SliceOrderError, EmptySliceError, RankOutOfRangeError, DimOutOfRangeError,
    InvalidRankMapError, IncompatibleLayoutError, InvalidLayoutError, InternalError,
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
    for cls in LAYOUT_ERRORS:  # every class the Rust core maps an error kind to
        assert cls.__name__ in errors.__all__
        assert getattr(rankmesh, cls.__name__) is cls
