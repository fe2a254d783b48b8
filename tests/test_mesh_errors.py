"""Errors of the fast meshes: rankmesh's class, and the builtin class torch raises in the same
situation too, for every argument torch checks (helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.errors import (
    ArgumentTypeError,
    DimOutOfRangeError,
    DuplicateNameError,
    InvalidSizeError,
    MeshArgumentError,
    RankmeshError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.mesh import init_device_mesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    assert_same_mesh,
    build_both,
)

pytestmark = MESH_MARKS


def _raises(fn):
    with pytest.raises(Exception) as e:
        fn()
    return e.value


def _check_error(ours_fn, theirs_fn, rankmesh_cls, builtin):
    """ours raises ``rankmesh_cls``; torch raises ``builtin``, which ours also is."""
    ours = _raises(ours_fn)
    assert isinstance(ours, rankmesh_cls), repr(ours)
    assert isinstance(ours, RankmeshError)
    theirs = _raises(theirs_fn)
    assert isinstance(theirs, builtin), repr(theirs)
    assert isinstance(ours, builtin), repr(ours)
    return ours


@pytest.mark.parametrize(
    "kwargs, cls, builtin",
    [
        (dict(mesh_shape=(2, 8)), SizeMismatchError, RuntimeError),  # bigger than the world
        (dict(mesh_shape=(2, 4), mesh_dim_names=("a", "a")), DuplicateNameError, RuntimeError),
        (dict(mesh_shape=(2, 4), mesh_dim_names=("a",)), SizeMismatchError, RuntimeError),
        (dict(mesh_shape=(2, 4), mesh_dim_names=("a", "b", "c")), SizeMismatchError, RuntimeError),
        (dict(device_type="cuda:0", mesh_shape=(8,)), MeshArgumentError, RuntimeError),
        (dict(device_type="cpu:1", mesh_shape=(2, 4), mesh_dim_names=("a", "b")), MeshArgumentError, RuntimeError),
        (
            dict(mesh_shape=(2, 4), mesh_dim_names=("a", "b"), backend_override={"c": FAKE}),
            MeshArgumentError,
            RuntimeError,
        ),
        (dict(mesh_shape=(2, 4), backend_override={2: FAKE}), MeshArgumentError, RuntimeError),
        (
            dict(mesh_shape=(2, 4), mesh_dim_names=("a", "b"), backend_override={"a": FAKE, 0: FAKE}),
            MeshArgumentError,
            RuntimeError,
        ),
    ],
)
def test_bad_init_arguments_raise_rankmesh_errors_that_are_torchs_class_too(kwargs, cls, builtin):
    kwargs = dict(kwargs)
    device = kwargs.pop("device_type", "cpu")
    shape = kwargs.pop("mesh_shape")

    def call(fn):
        kw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()}
        return lambda: fn(device, shape, **kw)

    with fake_world(8, 3):
        _check_error(call(init_device_mesh), call(torch_init_device_mesh), cls, builtin)


def test_mesh_shape_larger_than_the_world_raises_size_mismatch():
    # A mesh over part of the world is torch's semantics (tests/test_partial_meshes.py); one with
    # more ranks than the world is a SizeMismatchError naming mesh_shape (torch fails later).
    with fake_world(8, 3):
        with pytest.raises(SizeMismatchError, match="multiply to at most 8") as e:
            init_device_mesh("cpu", (4, 4), mesh_dim_names=("a", "b"))
        assert e.value.field == "mesh_shape"


@pytest.mark.parametrize("shape", [(True, 8), (2, 4.0), (np.float64(2.0), 4), (2, "4")], ids=repr)
def test_sizes_that_are_not_ints_raise_argument_type_error_which_is_torchs_value_error_too(shape):
    # The decision (rankmesh._check): a type fault is an ArgumentTypeError (a TypeError, as torch's
    # view() raises for a float size), not MeshArgumentError (a RuntimeError, kept for what torch
    # rejects with one). torch's init_device_mesh raises ValueError for these (its layout check):
    # an ArgumentTypeError is a ValueError too, so code written against torch keeps catching it.
    with fake_world(8, 3):
        e = _check_error(
            lambda: init_device_mesh("cpu", shape, mesh_dim_names=("a", "b")),
            lambda: torch_init_device_mesh("cpu", shape, mesh_dim_names=("a", "b")),
            ArgumentTypeError,
            ValueError,
        )
        assert isinstance(e, TypeError) and not isinstance(e, MeshArgumentError)
        i = 0 if not isinstance(shape[0], int) or isinstance(shape[0], bool) else 1
        assert e.field == f"mesh_shape[{i}]" and e.value is shape[i]


@pytest.mark.parametrize("shape", [(0, 8), (2, -4), (-1, 8), (8, 0)])
def test_non_positive_sizes_raise_invalid_size_error(shape):
    with fake_world(8, 3):
        with pytest.raises(InvalidSizeError) as e:
            init_device_mesh("cpu", shape, mesh_dim_names=("a", "b"))
        assert e.value.field.startswith("mesh_shape[")
        # torch rejects them as well, but with no consistent class (AssertionError for 0,
        # RuntimeError from reshape for -1, ...), so there is no builtin class to share here.
        _raises(lambda: torch_init_device_mesh("cpu", shape, mesh_dim_names=("a", "b")))


@pytest.fixture
def eight():
    with fake_world(8, 6):
        o = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        t = torch_init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        yield o, t


def test_slicing_out_of_order_raises_slice_order_error_naming_the_order_that_works(eight):
    o, t = eight
    e = _check_error(lambda: o["tp", "dp"], lambda: t["tp", "dp"], SliceOrderError, KeyError)
    assert "('dp', 'tp')" in str(e)
    assert o["dp", "tp"] == t["dp", "tp"]  # the suggested order works
    e = _check_error(lambda: o["tp", "cp", "dp"], lambda: t["tp", "cp", "dp"], SliceOrderError, KeyError)
    suggested = re.search(r"this order: (\([^)]*\))", str(e)).group(1)
    assert suggested == "('dp', 'cp', 'tp')"
    assert o[ast.literal_eval(suggested)] is o


def test_the_suggested_slice_order_works_also_with_flattened_names():
    """Every SliceOrderError's hint, applied, slices; where it says no order works, none does.
    Flattened dims (sliced from the root) interleave with plain dims, so mesh order is not enough."""
    import itertools
    import warnings

    with fake_world(32, 5), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: slicing a flattened dim from the root is deprecated
        m = init_device_mesh("cpu", (2, 2, 2, 4), mesh_dim_names=("pp", "dp", "cp", "tp"))
        m["dp", "cp"]._flatten("dp_cp")
        m["pp", "tp"]._flatten("pp_tp")
        m["pp", "dp", "cp"]._flatten("pdc")
        names = ("pp", "dp", "cp", "tp", "dp_cp", "pp_tp", "pdc")
        hinted = hopeless = 0
        for k in (2, 3):
            for combo in itertools.permutations(names, k):
                try:
                    m[combo]
                    continue
                except SliceOrderError as e:
                    found = re.search(r"this order: (\([^)]*\))", str(e))
                except RuntimeError:
                    continue  # torch's own "overlapping dim_names" for an order it accepts
                if found:
                    hinted += 1
                    assert m[ast.literal_eval(found.group(1))].mesh_dim_names == ast.literal_eval(found.group(1))
                else:
                    hopeless += 1
                    for perm in itertools.permutations(combo):
                        with pytest.raises((SliceOrderError, RuntimeError)):
                            m[perm]
        assert hinted > 20 and hopeless > 20, (hinted, hopeless)


def test_slicing_an_unknown_name_raises_unknown_name_error(eight):
    o, t = eight
    e = _check_error(lambda: o["pp"], lambda: t["pp"], UnknownNameError, KeyError)
    assert "pp" in str(e) and "dp" in str(e)
    _check_error(lambda: o["dp", "pp"], lambda: t["dp", "pp"], UnknownNameError, KeyError)
    _check_error(lambda: o["dp", "cp"]["tp"], lambda: t["dp", "cp"]["tp"], UnknownNameError, KeyError)
    # a flattened name is only valid sliced from the root
    o["dp", "cp"]._flatten("dp_cp")
    t["dp", "cp"]._flatten("dp_cp")
    sub_o, sub_t = o["cp", "tp"], t["cp", "tp"]
    _check_error(lambda: sub_o["dp_cp"], lambda: sub_t["dp_cp"], UnknownNameError, KeyError)


def test_unflatten_errors_are_rankmesh_errors_and_torchs_class(eight):
    o, t = eight
    # sizes whose product is not the dim's size
    _check_error(
        lambda: o._unflatten("tp", (2, 2), ("a", "b")),
        lambda: t._unflatten("tp", (2, 2), ("a", "b")),
        SizeMismatchError,
        ValueError,
    )
    # a dim index out of range
    e = _check_error(
        lambda: o._unflatten(3, (2,), ("a",)), lambda: t._unflatten(3, (2,), ("a",)), DimOutOfRangeError, ValueError
    )
    assert isinstance(e, IndexError)
    # an unknown dim name
    _check_error(
        lambda: o._unflatten("pp", (2,), ("a",)), lambda: t._unflatten("pp", (2,), ("a",)), UnknownNameError, ValueError
    )
    # as many names as sizes
    _check_error(
        lambda: o._unflatten("tp", (2, 1), ("a",)),
        lambda: t._unflatten("tp", (2, 1), ("a",)),
        SizeMismatchError,
        RuntimeError,
    )
    # a backend_override naming no new dim
    _check_error(
        lambda: o._unflatten("tp", (2, 1), ("a", "b"), backend_override={"tp": FAKE}),
        lambda: t._unflatten("tp", (2, 1), ("a", "b"), backend_override={"tp": FAKE}),
        MeshArgumentError,
        RuntimeError,
    )


def test_unflatten_to_a_name_the_mesh_has_raises_duplicate_name_error(eight):
    # torch does not check (it returns a mesh with two dims called "dp", which it cannot slice
    # unambiguously); rankmesh refuses, like init_device_mesh does for repeated names.
    o, _ = eight
    with pytest.raises(DuplicateNameError, match="dp") as e:
        o._unflatten("tp", (2, 1), ("dp", "x"))
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(DuplicateNameError):
        o._unflatten("tp", (1, 2), ("y", "y"))


def test_negative_unflatten_dim_raises_dim_out_of_range():
    # torch does not check negative dims: its splice(-1, 0) inserts instead of replacing, and
    # the DeviceMesh constructor then fails an assertion on the overlapping layout. rankmesh
    # names the problem.
    with fake_world(8, 1):
        o, t = build_both((2, 4), ("dp", "tp"))
        with pytest.raises(AssertionError, match="non-overlapping"):
            t._unflatten(-1, (2, 2), ("a", "b"))
        with pytest.raises(DimOutOfRangeError, match="out of range"):
            o._unflatten(-1, (2, 2), ("a", "b"))


def test_flatten_name_taken_by_a_root_dim_raises_duplicate_name_error(eight):
    o, t = eight
    e = _check_error(
        lambda: o["cp", "tp"]._flatten("dp"), lambda: t["cp", "tp"]._flatten("dp"), DuplicateNameError, ValueError
    )
    assert "dp" in str(e)
    # also from a mesh made by unflatten (its root is still the 3-D mesh)
    uo, ut = o._unflatten("tp", (2, 1), ("t1", "t2")), t._unflatten("tp", (2, 1), ("t1", "t2"))
    _check_error(lambda: uo._flatten("cp"), lambda: ut._flatten("cp"), DuplicateNameError, ValueError)


def test_flatten_name_used_by_a_different_flatten_raises_and_the_same_flatten_is_the_same_object(eight):
    o, t = eight
    a, ta = o["dp", "cp"]._flatten("x"), t["dp", "cp"]._flatten("x")
    assert_same_mesh(a, ta, o, t)
    assert o["dp", "cp"]._flatten("x") is a  # the same flatten twice: the same object
    assert o._unflatten("dp", (2,), ("dp2",))["dp2", "cp"]._flatten("x") is a  # same layout, other path
    e = _check_error(
        lambda: o["cp", "tp"]._flatten("x"), lambda: t["cp", "tp"]._flatten("x"), DuplicateNameError, ValueError
    )
    assert "x" in str(e)
    # the default name, twice
    assert o["cp", "tp"]._flatten() is o["cp", "tp"]._flatten()
    assert o["cp", "tp"]._flatten().mesh_dim_names == t["cp", "tp"]._flatten().mesh_dim_names == ("cp_tp",)


def test_flatten_and_slice_of_an_unnamed_mesh_raise_like_torch():
    with fake_world(8, 4):
        o, t = build_both((2, 4))
        assert_same_mesh(o, t, o, t)
        for fn in (lambda m: m["dim_0"], lambda m: m._flatten("z")):
            ours, theirs = _raises(lambda: fn(o)), _raises(lambda: fn(t))
            assert type(theirs) is RuntimeError and isinstance(ours, RuntimeError)


@pytest.mark.parametrize(
    "world, shape, key, want",
    [
        (1, (1, 1), ("b", "a"), [[0]]),
        (4, (2, 1, 2), ("b", "a"), [[0, 2]]),
        (2, (1, 2, 1), ("c", "b", "a"), [[[0], [1]]]),
    ],
)
def test_slicing_size_one_dims_out_of_mesh_order_works_like_torch(world, shape, key, want):
    names = tuple("abc"[: len(shape)])
    with fake_world(world, 0):
        o, t = build_both(shape, names)
        assert t[key].mesh.tolist() == want  # torch accepts: only size-1 dims are out of order
        assert_same_mesh(o[key], t[key], o, t)


def test_unflatten_of_an_unnamed_mesh_raises_like_torch():
    with fake_world(8, 4):
        o, t = build_both((2, 4))
        _raises(lambda: t._unflatten(1, (2, 2), ("x", "y")))
        _raises(lambda: o._unflatten(1, (2, 2), ("x", "y")))
