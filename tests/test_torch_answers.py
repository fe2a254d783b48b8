"""rankmesh answers as torch does (issue 29): backend overrides, their options, error texts and
the order of torch's checks.

The oracle is torch itself: ``torch.distributed.device_mesh.init_device_mesh``, and
``DeviceMesh._unflatten`` / ``_flatten`` of the mesh it returns, called in the same world as
rankmesh's. The world is on ``meshfake`` (tests/conftest.py: the fake process group under another
name), so a group on the default backend (``"meshfake"``) and a ``"fake"`` override look different.

For every input drawn:

- torch raises: rankmesh raises an instance of torch's class, and its message starts with torch's
  ``str(e)`` (rankmesh's hint and typed fields come after it);
- torch builds a mesh: rankmesh builds one too, and every dim's group has torch's ranks, backend
  name and backend options (``pg._get_backend(device).options``, the very object passed in).

The deliberate differences, each checked as rankmesh's rule rather than skipped:

- ``size_one_fake=True`` (rankmesh's default): a size-1 dim is a ``fake`` group without options,
  unless its override is itself ``fake`` (then its options are kept). The oracle for that case is
  torch with the override ``"fake"`` on those dims, once torch's key checks have passed.
- A backend name c10d does not know: torch raises an ``AssertionError`` while it creates the
  groups (after those of the dims before it); rankmesh raises :class:`MeshArgumentError` (a
  ``RuntimeError``) before creating any, with torch's message first.
- torch's ``init_device_mesh`` empties the caller's ``backend_override`` dict; rankmesh's leaves it.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rankmesh import MeshBuilder, MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DimOutOfRangeError,
    DuplicateNameError,
    MeshArgumentError,
    SizeMismatchError,
    UnknownNameError,
)
from rankmesh.mesh import init_device_mesh
from torch._C._distributed_c10d import Backend as C10dBackend
from torch._C._distributed_c10d import FakeProcessGroup
from torch.distributed.device_mesh import _normalize_backend_override
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE, MESHFAKE, fake_world
from tests.mesh_helpers import MESH_MARKS, outcome

pytestmark = MESH_MARKS

W = 8
CPU = torch.device("cpu")
UNKNOWN = ("foo", "nosuch")
KNOWN = (FAKE, MESHFAKE)


def fake_options(error_on_collective: bool = True) -> FakeProcessGroup.Options:
    opts = FakeProcessGroup.Options()
    opts.error_on_collective = error_on_collective
    return opts


def backend_options(pg):
    return pg._get_backend(CPU).options


# -- the cases, one by one ---------------------------------------------------------------


@pytest.mark.parametrize("key", ["pp", 0])
def test_a_fake_override_keeps_its_options_as_in_torch(key):
    with fake_world(W, 0):
        opts = fake_options()
        for init in (torch_init_device_mesh, init_device_mesh):
            m = init("cpu", (2, 4), mesh_dim_names=("pp", "dp"), backend_override={key: (FAKE, opts)})
            pg = m.get_group("pp")
            assert backend_options(pg) is opts, init
            with pytest.raises(RuntimeError, match="error_on_collective"):
                dist.all_reduce(torch.ones(1), group=pg)
            dist.all_reduce(torch.ones(1), group=m.get_group("dp"))  # the other dim communicates


def test_fake_options_reach_flattened_and_unflattened_dims():
    with fake_world(W, 5):
        opts = fake_options()
        m = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        flat = m["dp", "cp"]._flatten("dp_cp", backend_override=(FAKE, opts))
        assert backend_options(flat.get_group()) is opts
        u = m._unflatten("tp", (2, 1), ("x", "one"), backend_override={1: (FAKE, opts)})
        assert backend_options(u.get_group("one")) is opts  # size 1: the user's fake keeps its options
        assert backend_options(u.get_group("x")) is None
        with pytest.raises(RuntimeError, match="error_on_collective"):
            dist.all_reduce(torch.ones(1), group=flat.get_group())


def test_a_fake_group_with_options_is_not_shared_with_one_without():
    with fake_world(W, 3):
        opts = fake_options()
        layout = MeshLayout.world(W).unflatten("world", (2, 4), ("dp", "tp"))
        b = MeshBuilder(MeshLayout.world(W))
        with_opts = b.process_group(layout, "tp", backend=FAKE, pg_options=opts)
        plain = b.process_group(layout, "tp", backend=FAKE)
        assert with_opts is not plain and backend_options(with_opts) is opts and backend_options(plain) is None
        assert b.process_group(layout, "tp", backend=FAKE, pg_options=opts) is with_opts
        # made fake by rankmesh's own rule: no options, shared with the options-less fake group
        assert b.process_group(layout, "tp", fake=True) is plain


def test_size_one_dims_made_fake_by_rankmesh_keep_no_options():
    with fake_world(W, 2, MESHFAKE):
        opts = fake_options()
        m = init_device_mesh("cpu", (8, 1), mesh_dim_names=("dp", "one"), backend_override={"one": opts})
        assert str(dist.get_backend(m.get_group("one"))) == FAKE and backend_options(m.get_group("one")) is None
        m = init_device_mesh(
            "cpu", (8, 1), mesh_dim_names=("dp", "one"), backend_override={"one": opts}, size_one_fake=False
        )
        assert str(dist.get_backend(m.get_group("one"))) == MESHFAKE and backend_options(m.get_group("one")) is opts


def _torch_error(fn) -> Exception:
    with pytest.raises(Exception) as e:
        fn()
    return e.value


@pytest.mark.parametrize(
    "override, cls",
    [
        ({"dp": "foo", 0: "bar"}, MeshArgumentError),  # torch: the dim named twice, before the names
        ({"cp": "foo"}, MeshArgumentError),  # torch: a key naming no dim, before the name
        ({42: "bar"}, MeshArgumentError),
        ({"tp": "bar", 0: "foo"}, MeshArgumentError),  # torch: the first dim's backend first
        ({None: FAKE, "cp": FAKE}, ArgumentTypeError),  # torch's text, rankmesh's type error
    ],
    ids=repr,
)
def test_override_errors_start_with_torchs_and_come_in_torchs_order(override, cls):
    with fake_world(W, 0):
        theirs = _torch_error(
            lambda: torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override=dict(override))
        )
        given = dict(override)
        with pytest.raises(cls) as ours:
            init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override=given)
        assert str(ours.value).startswith(str(theirs)), (str(ours.value), str(theirs))
        assert given == override  # rankmesh leaves the caller's dict as it is; torch empties it


def test_override_keys_come_before_the_device_type_as_in_torch():
    with fake_world(W, 0):
        theirs = _torch_error(lambda: torch_init_device_mesh("cuda:0", (2, 4), backend_override={5: FAKE}))
        with pytest.raises(MeshArgumentError) as ours:
            init_device_mesh("cuda:0", (2, 4), backend_override={5: FAKE})
        assert str(ours.value).startswith(str(theirs)) and ours.value.field == "backend_override"


FLATTEN_CASES = {
    "a root dim's name": (lambda m: m._flatten("dp"), DuplicateNameError),
    "a flatten name reused for other dims": (
        lambda m: (m["dp", "tp"]._flatten("f"), m["cp", "tp"]._flatten("f")),
        DuplicateNameError,
    ),
    "the name before the backend": (
        lambda m: (m["dp", "tp"]._flatten("f"), m._flatten("f", "foo")),
        DuplicateNameError,
    ),
    "an unknown backend": (lambda m: m["dp", "cp"]._flatten("g", backend_override="foo"), MeshArgumentError),
}


@pytest.mark.parametrize("case", FLATTEN_CASES)
def test_flatten_errors_start_with_torchs(case):
    fn, cls = FLATTEN_CASES[case]
    with fake_world(W, 6):
        t = torch_init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        o = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        theirs, ours = _torch_error(lambda: fn(t)), _torch_error(lambda: fn(o))
        assert isinstance(ours, cls)
        assert isinstance(ours, RuntimeError if cls is MeshArgumentError else type(theirs)), (ours, theirs)
        assert str(ours).startswith(str(theirs)), (str(ours), str(theirs))


def test_a_flatten_that_exists_with_the_same_layout_is_returned_whatever_the_override():
    with fake_world(W, 1):
        for init in (torch_init_device_mesh, init_device_mesh):
            m = init("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
            f = m._flatten("f")
            assert m._flatten("f", backend_override="foo") is f


UNFLATTEN_CASES = [
    (("zz", (2, 2), ("a", "b")), UnknownNameError),
    ((2, (2, 2), ("a", "b")), DimOutOfRangeError),
    ((1, (2, 2), ("a",)), SizeMismatchError),
    ((1, (2, 3), ("a", "b")), SizeMismatchError),
    ((1, (2, 3), ("a", "b"), {"a": "foo"}), SizeMismatchError),  # torch: the product before the backend
    ((1, (2, 2), ("a", "b"), {"b": "foo", 0: "bar"}), MeshArgumentError),  # the first dim's backend
    ((1, (2, 2), ("a", "b"), {"cp": FAKE}), MeshArgumentError),
    ((1, (2, 2), ("a", "b"), {"a": FAKE, 0: FAKE}), MeshArgumentError),
]


@pytest.mark.parametrize("args, cls", UNFLATTEN_CASES, ids=repr)
def test_unflatten_errors_start_with_torchs(args, cls):
    with fake_world(W, 4):
        t = torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        o = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        theirs = _torch_error(lambda: t._unflatten(*copy.deepcopy(args)))
        with pytest.raises(cls) as ours:
            o._unflatten(*args)
        assert isinstance(ours.value, RuntimeError if cls is MeshArgumentError else type(theirs))
        assert str(ours.value).startswith(str(theirs)), (str(ours.value), str(theirs))


# -- the property test ---------------------------------------------------------------------------


SHAPES = [((8,), ("w",)), ((2, 4), ("dp", "tp")), ((2, 2, 2), ("pp", "dp", "tp")), ((4, 1, 2), ("dp", "one", "tp"))]
SHAPES += [((1, 8), ("one", "dp")), ((2, 4), None), ((2, 1, 4), None)]


def values(draw, fault: str) -> object:
    """One dim's override: a name, options alone, or a (name, options) pair. ``fault`` says which
    of two mistakes torch finds only while it creates the groups may be drawn: ``"name"`` (a
    backend c10d does not know) or ``"options"`` (``Backend.Options``, the base class, which the
    fake backend refuses with a ``TypeError``). Not both in one example: rankmesh checks every
    dim's backend name before it creates any group, so with a refused option on an earlier dim and
    an unknown name on a later one it reports the name, where torch fails on the earlier group."""
    kind = draw(st.sampled_from(["name", "name", "options", "pair", "pair"]))
    unknown = UNKNOWN[:1] if fault == "name" else ()
    if kind == "name":
        return draw(st.sampled_from(KNOWN + KNOWN + unknown))

    def opts():
        if fault == "options" and draw(st.integers(0, 3)) == 0:
            return C10dBackend.Options(FAKE)
        return fake_options(draw(st.booleans()))

    if kind == "options":
        return opts()
    return (draw(st.sampled_from((*KNOWN, None, *unknown))), None if draw(st.integers(0, 3)) == 0 else opts())


def overrides(draw, fault: str, ndim: int, names: tuple[str, ...] | None, invalid: tuple[str, ...] = ("cp", "zz")):
    """A backend_override dict: by name, by index, both, and now and then a key naming no dim."""
    if draw(st.integers(0, 4)) == 0:
        return None
    out: dict = {}
    for i in range(ndim):
        how = draw(st.integers(0, 5))
        if how == 0 or how == 1:
            out[i] = values(draw, fault)
        elif how == 2 and names:
            out[names[i]] = values(draw, fault)
        elif how == 3 and names and draw(st.integers(0, 3)) == 0:  # both: torch's "redundant" error
            out[names[i]] = values(draw, fault)
            out[i] = values(draw, fault)
    if draw(st.integers(0, 7)) == 0:
        out[draw(st.sampled_from((*invalid, ndim, 42, -1)))] = values(draw, fault)
    return out


def oracle_override(override, sizes: tuple[int, ...], names, size_one_fake: bool):
    """What torch must be given to build what rankmesh builds: the override itself, or, under
    ``size_one_fake`` and once torch's key checks pass, ``"fake"`` without options on every size-1
    dim whose override is not a ``fake`` one (and not an unknown backend, which both refuse)."""
    if not size_one_fake or 1 not in sizes:
        return copy.copy(override)
    try:
        per_dim = list(_normalize_backend_override(dict(override or {}), len(sizes), names))
    except RuntimeError:
        return copy.copy(override)  # torch's key error is the answer
    out = {}
    for i, (backend, opts) in enumerate(per_dim):
        if sizes[i] == 1 and backend in (None, MESHFAKE):
            backend, opts = FAKE, None
        if (backend, opts) != (None, None):
            out[i] = (backend, opts)
    return out


def group_answer(pg) -> tuple:
    """What a process group answers: ranks, backend name, the backend's options object."""
    return dist.get_process_group_ranks(pg), str(dist.get_backend(pg)), backend_options(pg)


def assert_same_answer(what, theirs, theirs_e, ours, ours_e) -> None:
    if theirs_e is not None:
        assert ours_e is not None, f"{what}: torch raised {theirs_e!r}, rankmesh gave {ours}"
        if isinstance(theirs_e, AssertionError) and not isinstance(ours_e, AssertionError):
            # torch's unknown backend, found while it creates the groups: rankmesh's up-front check
            assert isinstance(ours_e, MeshArgumentError) and ours_e.field.startswith("backend_override"), (
                what,
                ours_e,
                theirs_e,
            )
        else:
            assert isinstance(ours_e, type(theirs_e)), (what, ours_e, theirs_e)
        assert str(ours_e).startswith(str(theirs_e)), (what, str(ours_e), str(theirs_e))
        event(f"{what[0]}: {type(theirs_e).__name__}, {type(ours_e).__name__}")
        return
    assert ours_e is None, f"{what}: rankmesh raised {ours_e!r}; torch gave {theirs}"
    assert ours.mesh.tolist() == theirs.mesh.tolist() and ours.mesh_dim_names == theirs.mesh_dim_names
    for i in range(theirs.ndim):
        assert group_answer(ours.get_group(i)) == group_answer(theirs.get_group(i)), (what, i)
    event(f"{what[0]}: ok")


def flatten_args(draw, fault: str, mesh, taken_flat: list[str]):
    names = list(mesh.mesh_dim_names)
    k = draw(st.integers(1, len(names)))
    sub = tuple(sorted(draw(st.permutations(names))[:k], key=names.index))
    how = draw(st.integers(0, 5))
    if how == 0:
        name = draw(st.sampled_from(names))  # a root dim's name
    elif how == 1 and taken_flat:
        name = draw(st.sampled_from(taken_flat))  # flattened before: same dims or others
    elif how == 2:
        name = None  # torch's default, "_".join(sub)
    else:
        name = f"f{draw(st.integers(0, 2))}"
    return sub, name, values(draw, fault) if draw(st.booleans()) else None


def unflatten_args(draw, fault: str, mesh):
    names = list(mesh.mesh_dim_names)
    dim = draw(st.integers(0, len(names) - 1))
    size = mesh.size(dim)
    sizes = [draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))]
    sizes.append(size // sizes[0])
    if draw(st.integers(0, 7)) == 0:
        sizes[-1] *= 2  # a product that does not match
    new = ("u0", "u1")
    if draw(st.integers(0, 9)) == 0:
        new = ("u0",)  # not one name per size
    by = draw(st.integers(0, 9))
    dim_arg = names[dim] if by < 4 else dim if by < 9 else draw(st.sampled_from(["zz", len(names)]))
    return dim_arg, tuple(sizes), new, overrides(draw, fault, len(new), new, invalid=("cp", names[0]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rankmesh_answers_what_torch_answers(data):
    draw = data.draw
    shape, names = draw(st.sampled_from(SHAPES))
    size_one_fake = draw(st.booleans())
    fault = draw(st.sampled_from(["name", "options"]))
    override = overrides(draw, fault, len(shape), names)
    with fake_world(W, draw(st.integers(0, W - 1)), MESHFAKE):
        mine = copy.copy(override)
        ours, ours_e = outcome(
            init_device_mesh,
            "cpu",
            shape,
            mesh_dim_names=names,
            backend_override=mine,
            size_one_fake=size_one_fake,
        )
        assert mine == override  # left as it was
        theirs, theirs_e = outcome(
            torch_init_device_mesh,
            "cpu",
            shape,
            mesh_dim_names=names,
            backend_override=oracle_override(override, shape, names, size_one_fake),
        )
        assert_same_answer(("init_device_mesh", shape, names, override), theirs, theirs_e, ours, ours_e)
        if theirs_e is not None or names is None:
            return
        flat_names: list[str] = []
        for _ in range(draw(st.integers(1, 4))):
            if draw(st.booleans()):
                sub, name, fo = flatten_args(draw, fault, theirs, flat_names)
                size = math.prod(theirs.size(names.index(n)) for n in sub)
                t_fo = oracle_override({0: fo} if fo is not None else None, (size,), None, size_one_fake)
                t_fo = t_fo.get(0) if t_fo else None
                r_t, e_t = outcome(lambda: theirs[sub]._flatten(name, backend_override=t_fo))
                r_o, e_o = outcome(lambda: ours[sub]._flatten(name, backend_override=fo))
                assert_same_answer(("_flatten", sub, name, fo), r_t, e_t, r_o, e_o)
                if e_t is None:
                    flat_names.append(r_t.mesh_dim_names[0])
            else:
                dim, sizes, new, uo = unflatten_args(draw, fault, theirs)
                r_t, e_t = outcome(
                    lambda: theirs._unflatten(
                        dim, sizes, new, backend_override=oracle_override(uo, sizes, new, size_one_fake)
                    )
                )
                mine = copy.copy(uo)
                r_o, e_o = outcome(lambda: ours._unflatten(dim, sizes, new, backend_override=mine))
                assert mine == uo
                assert_same_answer(("_unflatten", dim, sizes, new, uo), r_t, e_t, r_o, e_o)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(device_type="cuda:0", mesh_shape=(2, 4), mesh_dim_names=("a", "b")),
        dict(device_type="cpu", mesh_shape=(2, 4), mesh_dim_names=("a", "a")),
        dict(device_type="cpu", mesh_shape=(2, 4), mesh_dim_names=("a",)),
        dict(device_type="cpu", mesh_shape=(2, 2, 2), mesh_dim_names=("a", "b", "a")),
    ],
    ids=["device-index", "repeated-name", "too-few-names", "repeated-of-three"],
)
def test_init_device_mesh_checks_start_with_torchs_text(kwargs):
    """init_device_mesh's own argument checks: torch's class and text first (taken by running torch's
    init_device_mesh up to the point where it would build), and torch's module is left as it was."""
    import torch.distributed.device_mesh as dm

    before = (dm.DeviceMesh, dm._MeshLayout)
    with fake_world(W, 0):
        with pytest.raises(Exception) as theirs:
            torch_init_device_mesh(**kwargs)
        with pytest.raises(Exception) as ours:
            init_device_mesh(**kwargs)
    assert isinstance(ours.value, type(theirs.value)), (type(ours.value), type(theirs.value))
    assert str(ours.value).startswith(str(theirs.value)), (str(ours.value), str(theirs.value))
    assert (dm.DeviceMesh, dm._MeshLayout) == before
