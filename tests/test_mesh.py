"""rankmesh.mesh.FastDeviceMesh against torch's own DeviceMesh, torch being the oracle.

Every test builds one recipe twice in the same simulated world, once with torch
(``torch.distributed.device_mesh.init_device_mesh``, or ``DeviceMesh("cpu", rank_map.reshape(shape))``
when a rank map is given) and once with :func:`rankmesh.mesh.init_device_mesh`, and compares
everything torch exposes: the mesh tensor, shape, coordinates, local ranks, process-group ranks
and backends, ``_layout``, ``_rank_map``, ``_flatten_rank_map``, root structure, object identity
of derived meshes, ``==`` and ``hash`` (also across the two implementations), errors, pickling,
DTensor, FSDP2 and torch.compile.

Ranks are simulated on the fake backend: one process re-initialises the default group as rank 0,
the last rank and a random rank in turn.

Backends: in a world on the ``fake`` backend a dim overridden to ``"fake"`` and a dim on the
default backend are indistinguishable (``dist.get_backend``, ``_get_backend_name`` and the group
description are equal). So the property test runs its worlds on ``meshfake``, a backend registered
by tests/conftest.py that is the fake process group under another name: groups on the default backend report
``"meshfake"`` and overridden ones ``"fake"``.

No timing is asserted anywhere; speed is measured by the benchmarks.
"""

from __future__ import annotations

import ast
import copy
import math
import pickle
import re
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rankmesh import _torch_compat
from rankmesh.errors import (
    ArgumentTypeError,
    DimOutOfRangeError,
    DuplicateNameError,
    IncompatibleLayoutError,
    InvalidRankMapError,
    InvalidSizeError,
    MeshArgumentError,
    RankmeshError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh, _normalize_backend_override
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE, MESHFAKE, fake_world

pytestmark = [
    pytest.mark.skipif(
        not _torch_compat.fast_meshes_available(),
        reason=f"rankmesh falls back to torch's own DeviceMesh on torch {torch.__version__}",
    ),
    # torch deprecates slicing a flattened dim from the root; the property test does it on purpose.
    pytest.mark.filterwarnings("ignore:Slicing a flattened dim from root mesh"),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gloo_world_of_one(monkeypatch):
    """A real one-process gloo world on loopback."""
    if not dist.is_gloo_available():
        pytest.skip("needs gloo")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{_free_port()}")
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        dist.destroy_process_group()


def ranks_of(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


def sampled_ranks(world_size: int, rnd: int) -> list[int]:
    """The first, the last and a random rank."""
    return sorted({0, world_size - 1, rnd % world_size})


def build_both(shape, names=None, rank_map=None, backend_override=None, rank_map_form=list):
    """The same root mesh from torch and from rankmesh, in the current world."""
    bo = None if backend_override is None else dict(backend_override)
    if rank_map is None:
        theirs = torch_init_device_mesh("cpu", tuple(shape), mesh_dim_names=names, backend_override=bo)
    else:
        norm = None if bo is None else tuple(_normalize_backend_override(dict(bo), len(shape), names))
        theirs = DeviceMesh(
            "cpu",
            torch.tensor(list(rank_map), dtype=torch.int).reshape(tuple(shape)),
            mesh_dim_names=names,
            backend_override=norm,
        )
    rm = None if rank_map is None else rank_map_form(list(rank_map))
    ours = init_device_mesh(
        "cpu",
        tuple(shape),
        mesh_dim_names=names,
        backend_override=None if backend_override is None else dict(backend_override),
        rank_map=rm,
    )
    return ours, theirs


def _backend(pg) -> str:
    return str(dist.get_backend(pg))


def assert_same_group(pg, tpg, world_size: int) -> None:
    assert ranks_of(pg) == ranks_of(tpg)
    # rankmesh serves every size-1 dim of a multi-rank world with a fake group (it never
    # communicates); torch uses the default backend there. Everywhere else: torch's backend.
    want = FAKE if pg.size() == 1 and world_size > 1 else _backend(tpg)
    assert _backend(pg) == want, (ranks_of(pg), _backend(pg), _backend(tpg))


def assert_same_mesh(ours, theirs, our_root, their_root) -> None:
    """Everything torch exposes about a mesh, ours against torch's, on this rank."""
    assert type(ours) is FastDeviceMesh and isinstance(ours, DeviceMesh)
    assert type(theirs) is DeviceMesh
    world_size = dist.get_world_size()
    assert ours.device_type == theirs.device_type
    assert ours.mesh.dtype == theirs.mesh.dtype
    assert ours.mesh.tolist() == theirs.mesh.tolist()
    assert ours.shape == theirs.shape
    assert ours.ndim == theirs.ndim
    assert ours.size() == theirs.size()
    assert ours.mesh_dim_names == theirs.mesh_dim_names
    assert ours.get_coordinate() == theirs.get_coordinate()
    assert ours._is_current_rank_part_of_mesh() == theirs._is_current_rank_part_of_mesh()
    assert repr(ours) == repr(theirs)
    assert ours._layout == theirs._layout
    assert ours._rank_map.tolist() == theirs._rank_map.tolist()
    assert ours._flatten_rank_map == theirs._flatten_rank_map
    assert ours._get_root_mesh() is our_root
    assert theirs._get_root_mesh() is their_root
    assert len(ours._dim_group_names) == len(theirs._dim_group_names) == ours.ndim
    for i in range(ours.ndim):
        assert ours.size(i) == theirs.size(i)
        assert ours.get_local_rank(i) == theirs.get_local_rank(i)
        pg = ours.get_group(i)
        assert_same_group(pg, theirs.get_group(i), world_size)
        if ours.mesh_dim_names:
            name = ours.mesh_dim_names[i]
            by_name = ours.get_group(name)
            # torch looks a name up in the root's flattened dims first (a flatten may reuse the
            # name of a dim of a derived mesh): the same lookup on both sides
            assert_same_group(by_name, theirs.get_group(name), world_size)
            if name not in our_root._flatten_mapping:
                assert by_name is pg
            assert ours.get_local_rank(name) == theirs.get_local_rank(name)
    if ours.ndim == 1:
        assert ours.get_group() is ours.get_group(0)
        assert ours.get_local_rank() == theirs.get_local_rank()
    assert [ranks_of(g) for g in ours.get_all_groups()] == [ranks_of(g) for g in theirs.get_all_groups()]
    # torch's semantics: equal, in both directions, with the same hash.
    assert ours == theirs and theirs == ours
    assert not (ours != theirs) and not (theirs != ours)
    assert hash(ours) == hash(theirs)


def assert_same_relations(pairs) -> None:
    """Equality and identity among all meshes derived so far agree with torch's; our groups are
    one per distinct (ranks, backend, dim name)."""
    for i, (o1, t1) in enumerate(pairs):
        for o2, t2 in pairs[i + 1 :]:
            assert (o1 == o2) == (t1 == t2)
            assert (o1 == t2) == (t1 == t2)
            assert (o1 is o2) == (t1 is t2)
            if o1 == o2:
                assert hash(o1) == hash(o2)
    by_key: dict = {}
    for o, _ in pairs:
        for i in range(o.ndim):
            pg = o.get_group(i)
            key = (tuple(ranks_of(pg)), _backend(pg), pg.group_desc)  # desc: mesh_<dim name>
            assert by_key.setdefault(key, pg) is pg, key
    assert len({id(pg) for pg in by_key.values()}) == len(by_key)


# -- 1. the property test ------------------------------------------------------------------------


class Replay:
    """Draws from hypothesis on the first rank and replays the same choices on the others (the
    recipe is SPMD: every rank makes the same calls)."""

    def __init__(self, data) -> None:
        self.data = data
        self.log: list = []
        self.pos: int | None = None

    def draw(self, strategy):
        if self.pos is None:
            value = self.data.draw(strategy)
            self.log.append(value)
            return value
        value = self.log[self.pos]
        self.pos += 1
        return value

    def rewind(self) -> None:
        self.pos = 0


def _pick_names(ch: Replay, valid: list[str], max_k: int = 3, p_sorted: float = 0.75) -> tuple[str, ...]:
    """A non-empty subset of ``valid``, usually in ``valid`` order, sometimes shuffled."""
    k = ch.draw(st.integers(1, min(max_k, len(valid))))
    picked = list(ch.draw(st.permutations(valid)))[:k]
    if ch.draw(st.floats(0, 1)) < p_sorted:
        picked.sort(key=valid.index)
    return tuple(picked)


def _factorize(ch: Replay, n: int) -> list[int]:
    parts = ch.draw(st.integers(1, 3))
    sizes = []
    for _ in range(parts - 1):
        f = ch.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
        sizes.append(f)
        n //= f
    sizes.append(n)
    return sizes


def _draw_op(ch: Replay, t_src: DeviceMesh, fresh) -> tuple:
    """One derivation, drawn from the structure of torch's mesh (the same on every rank)."""
    names = list(t_src.mesh_dim_names or ())
    is_root = t_src._get_root_mesh() is t_src
    # (no unflatten of an unnamed mesh: see test_unflatten_of_an_unnamed_mesh_raises_like_torch)
    kinds = ["unflatten", "unflatten", "slice", "flatten", "flatten_slice"] if names else ["slice", "flatten"]
    kind = ch.draw(st.sampled_from(kinds))
    if kind == "unflatten":
        dim = ch.draw(st.integers(0, t_src.ndim - 1))
        sizes = _factorize(ch, t_src.size(dim))
        if ch.draw(st.integers(0, 9)) == 0:  # now and then a product that does not match
            sizes[-1] *= 2
        new = tuple(fresh() for _ in sizes)
        override = {}
        for j, n in enumerate(new):
            if ch.draw(st.integers(0, 3)) == 0:
                override[n if ch.draw(st.booleans()) else j] = FAKE
        by_name = names and ch.draw(st.booleans())
        return ("unflatten", names[dim] if by_name else dim, tuple(sizes), new, override or None)
    if kind == "slice":
        valid = names + (list(t_src._get_root_mesh()._flatten_mapping) if is_root else [])
        if not valid:
            return ("slice", ("nope",))
        picked = _pick_names(ch, valid)
        if len(picked) == 1 and ch.draw(st.booleans()):
            return ("slice", picked[0])
        return ("slice", picked)
    # flatten: the whole mesh or a slice of it (adjacent dims or not), under a fresh name, the
    # default name, or a name that is taken already.
    sub = None
    if kind == "flatten_slice" and names:
        sub = _pick_names(ch, names, max_k=4, p_sorted=0.9)
    root = t_src._get_root_mesh()
    taken = list(root.mesh_dim_names or ()) + list(root._flatten_mapping) + names
    how = ch.draw(st.integers(0, 9))
    if how <= 6 or not taken:
        name = fresh()
    elif how <= 8:
        name = None
    else:
        name = ch.draw(st.sampled_from(taken))
    override = FAKE if ch.draw(st.integers(0, 3)) == 0 else None
    return ("flatten", sub, name, override)


def _apply(op: tuple, mesh: DeviceMesh) -> DeviceMesh:
    kind = op[0]
    if kind == "slice":
        return mesh[op[1]]
    if kind == "flatten":
        _, sub, name, override = op
        src = mesh if sub is None else mesh[sub]
        return src._flatten(name, backend_override=override)
    _, dim, sizes, new, override = op
    return mesh._unflatten(dim, sizes, new, backend_override=copy.copy(override))


def _outcome(fn):
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - compared with torch's outcome below
        return None, e


# torch raises an AssertionError from pycute's composition when unflatten sizes do not follow
# the modes of a dim flattened from non-adjacent dims; rankmesh raises its documented
# IncompatibleLayoutError (a ValueError) instead. The one accepted difference in error class.
KNOWN_ERROR_DIFFERENCES = {AssertionError: IncompatibleLayoutError}


def assert_same_error(op, ours_e: BaseException | None, theirs_e: BaseException) -> None:
    assert ours_e is not None, f"torch raised {theirs_e!r} for {op} but rankmesh did not"
    expected = KNOWN_ERROR_DIFFERENCES.get(type(theirs_e), type(theirs_e))
    assert isinstance(ours_e, expected), (op, ours_e, theirs_e)


@st.composite
def roots(draw):
    shape: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        shape.append(draw(st.sampled_from([s for s in (1, 2, 3, 4) if math.prod(shape) * s <= 64])))
    world = math.prod(shape)
    named = draw(st.integers(0, 9)) > 0
    names = tuple(f"r{i}" for i in range(len(shape))) if named else None
    perm = draw(st.none() | st.permutations(range(world)))
    form = draw(st.sampled_from([list, np.array, torch.tensor]))
    override = None
    if draw(st.booleans()):
        override = {}
        for i in range(len(shape)):
            if draw(st.integers(0, 3)) == 0:
                override[names[i] if names and draw(st.booleans()) else i] = FAKE
    return shape, names, perm, form, override


def run_recipe(ch: Replay, shape, names, perm, form, override) -> None:
    counter = iter(range(10**6))

    def fresh() -> str:
        return f"n{next(counter)}"

    our_root, their_root = build_both(shape, names, perm, override, rank_map_form=form)
    # torch's hash, computed without making the W-long rank-map tuple
    assert hash(our_root) == hash(their_root) and our_root._rm_world._rank_map_tuple is None
    assert_same_mesh(our_root, their_root, our_root, their_root)
    pairs = [(our_root, their_root)]
    for _ in range(ch.draw(st.integers(1, 8))):
        i = ch.draw(st.integers(0, len(pairs) - 1))
        o_src, t_src = pairs[i]
        op = _draw_op(ch, t_src, fresh)
        theirs, theirs_e = _outcome(lambda: _apply(op, t_src))
        ours, ours_e = _outcome(lambda: _apply(op, o_src))
        event(f"{op[0]}: {type(theirs_e).__name__ if theirs_e else 'ok'}")
        if theirs_e is not None:
            assert_same_error(op, ours_e, theirs_e)
            continue
        assert ours_e is None, f"rankmesh raised {ours_e!r} for {op}; torch gave {theirs}"
        assert_same_mesh(ours, theirs, our_root, their_root)
        # a second handle to the same recipe: equal, same hash (and the same object where torch's is)
        again, again_t = _apply(op, o_src), _apply(op, t_src)
        assert again == ours and hash(again) == hash(ours)
        assert (again is ours) == (again_t is theirs)
        pairs.append((ours, theirs))
        assert_same_relations(pairs)
    assert sorted(our_root._flatten_mapping) == sorted(their_root._flatten_mapping)
    for name, flat in our_root._flatten_mapping.items():
        assert flat == their_root._flatten_mapping[name]
    assert_same_relations(pairs)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(roots(), st.integers(0, 2**16), st.data())
def test_every_derived_mesh_equals_torchs_on_sampled_ranks(root, rnd, data):
    shape, names, perm, form, override = root
    world = math.prod(shape)
    ch = Replay(data)
    for k, rank in enumerate(sampled_ranks(world, rnd)):
        if k:
            ch.rewind()
        with fake_world(world, rank, MESHFAKE):
            run_recipe(ch, shape, names, perm, form, override)


def test_property_test_world_tells_overridden_dims_from_default_ones():
    # The premise of the backend comparison above: in a meshfake world torch's own groups tell
    # an overridden dim from a default one (in a fake world they could not).
    with fake_world(8, 3, MESHFAKE):
        t = torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override={"tp": FAKE})
        assert [_backend(t.get_group(i)) for i in range(2)] == [MESHFAKE, FAKE]
    with fake_world(8, 3):
        t = torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override={"tp": FAKE})
        assert [_backend(t.get_group(i)) for i in range(2)] == [FAKE, FAKE]


@pytest.mark.parametrize("rank", [0, 13, 23])
def test_slices_of_flattened_and_unflattened_meshes_equal_torchs(rank):
    # A fixed, torchtitan-like recipe with a rank map, checked step by step.
    W = 24
    perm = list(np.random.default_rng(7).permutation(W))
    with fake_world(W, rank, MESHFAKE):
        o, t = build_both((W,), ("world",), perm)
        pairs = [(o, t)]
        recipe = [
            lambda m: m._unflatten(0, (2, 3, 2, 2), ("pp", "dp", "cp", "tp"), backend_override={"pp": FAKE}),
            lambda m: m["dp", "cp"],
            lambda m: m._flatten("dp_cp"),
            lambda m: m._unflatten("dp_cp", (3, 2), ("x", "y")),
            lambda m: m["y"],
        ]
        cur = (o, t)
        for f in recipe:
            cur = (f(cur[0]), f(cur[1]))
            assert_same_mesh(cur[0], cur[1], o, t)
            pairs.append(cur)
        # non-adjacent: pp and tp, flattened, then sliced from the root by the flattened name
        dense_o, dense_t = pairs[1]
        ptp = (dense_o["pp", "tp"]._flatten("pp_tp"), dense_t["pp", "tp"]._flatten("pp_tp"))
        assert_same_mesh(*ptp, o, t)
        assert _backend(ptp[0].get_group()) == MESHFAKE
        from_root = (o["pp_tp"], t["pp_tp"])
        assert_same_mesh(*from_root, o, t)
        pairs += [ptp, from_root]
        assert_same_relations(pairs)
        assert _backend(pairs[1][0].get_group("pp")) == FAKE
        # torch's other mesh methods, inherited, give torch's answers
        assert ranks_of(o.get_group("pp_tp")) == ranks_of(t.get_group("pp_tp"))  # flattened name on root
        for name in ("pp", "dp", "cp", "tp"):
            assert [m.mesh.tolist() for m in dense_o._get_all_submeshes(name)] == [
                m.mesh.tolist() for m in dense_t._get_all_submeshes(name)
            ]
        assert [dense_o._sym_get_coordinate(i) for i in range(4)] == list(dense_t.get_coordinate())
        assert o._stable_hash() == t._stable_hash() and dense_o["tp"]._stable_hash() == dense_t["tp"]._stable_hash()
        cat_o = DeviceMesh._concatenate([dense_o["pp"], dense_o["cp", "tp"]])
        cat_t = DeviceMesh._concatenate([dense_t["pp"], dense_t["cp", "tp"]])
        assert cat_o == cat_t and cat_o.mesh.tolist() == cat_t.mesh.tolist()
        assert cat_o._get_root_mesh() is o
        assert [ranks_of(g) for g in cat_o.get_all_groups()] == [ranks_of(g) for g in cat_t.get_all_groups()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([(2, 2), (2, 3), (3, 2, 2), (4, 2, 2)]),
    st.data(),
)
def test_meshes_of_two_roots_compare_and_hash_as_torchs(shape, data):
    # Two init_device_mesh calls in one world, with the same or different rank maps: ==, != and
    # hash between every pair of derived meshes agree with torch's, across implementations too.
    W = math.prod(shape)
    perm_of = st.none() | st.permutations(range(W)) | st.just(list(range(W)))
    perms = [data.draw(perm_of), data.draw(perm_of)]
    rank = data.draw(st.integers(0, W - 1))
    names = tuple(f"d{i}" for i in range(len(shape)))
    with fake_world(W, rank):
        pairs = []
        for perm in perms:
            o, t = build_both(shape, names, perm)
            pairs += [(o, t), (o[names[-1]], t[names[-1]]), (o[names[:2]], t[names[:2]])]
            pairs.append((o[names[1:]]._flatten("flat"), t[names[1:]]._flatten("flat")))
        for i, (o1, t1) in enumerate(pairs):
            for o2, t2 in pairs[i:]:
                same = t1 == t2
                assert (o1 == o2) == same and (o1 == t2) == same and (t2 == o1) == same
                assert (o1 != o2) == (not same)
                if same:
                    assert hash(o1) == hash(o2) == hash(t1) == hash(t2)


def test_a_flatten_named_like_a_dim_of_a_derived_mesh_shadows_it_in_get_group_as_in_torch():
    # torch only checks flatten names against the root's dims, and get_group(name) looks in the
    # root's flattened dims first: u.get_group("tp") is then the group of the flattened "dp".
    for rank in (0, 6):
        with fake_world(8, rank, MESHFAKE):
            o, t = build_both((8,), ("world",))
            uo, ut = o._unflatten(0, (2, 4), ("dp", "tp")), t._unflatten(0, (2, 4), ("dp", "tp"))
            fo, ft = uo["dp"]._flatten("tp", backend_override=FAKE), ut["dp"]._flatten("tp", backend_override=FAKE)
            assert_same_mesh(fo, ft, o, t)
            assert_same_mesh(uo, ut, o, t)
            assert ranks_of(ut.get_group("tp")) == ranks_of(ut.get_group(0))  # torch's quirk
            assert uo.get_group("tp") is fo.get_group() and _backend(uo.get_group("tp")) == FAKE
            assert uo.get_local_rank("tp") == ut.get_local_rank("tp") == rank // 4
            block = rank // 4 * 4
            assert ranks_of(uo.get_group(1)) == ranks_of(ut.get_group(1)) == list(range(block, block + 4))


def test_unflatten_of_a_non_adjacent_flatten_follows_torch_or_raises_incompatible_layout():
    with fake_world(12, 9, MESHFAKE):
        o, t = build_both((3, 2, 2), ("a", "b", "c"))
        fo, ft = o["a", "c"]._flatten("ac"), t["a", "c"]._flatten("ac")
        assert_same_mesh(fo, ft, o, t)
        for sizes in [(3, 2), (6,), (1, 6), (3, 1, 2)]:  # sizes that follow the modes (3,2):(4,1)
            new = tuple(f"x{i}" for i in range(len(sizes)))
            assert_same_mesh(fo._unflatten(0, sizes, new), ft._unflatten(0, sizes, new), o, t)
        for sizes in [(2, 3), (2, 3, 1)]:  # they do not: torch fails in pycute with an AssertionError
            new = tuple(f"y{i}" for i in range(len(sizes)))
            with pytest.raises(AssertionError):
                ft._unflatten(0, sizes, new)
            with pytest.raises(IncompatibleLayoutError, match="non-adjacent"):
                fo._unflatten(0, sizes, new)


# -- 2. rank maps -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rank_map",
    [
        [0, 0, 2, 3, 4, 5, 6, 7],  # a duplicate
        [1, 2, 3, 4, 5, 6, 7, 8],  # out of range
        [-1, 0, 1, 2, 3, 4, 5, 6],  # negative
        [0, 1, 2, 3, 4, 5, 6],  # too short
        [0, 1, 2, 3, 4, 5, 6, 7, 8],  # too long
        [[0, 1, 2, 3], [4, 5, 6, 7]],  # not 1-D
        torch.tensor([7, 6, 5, 4, 3, 2, 1, 1]),  # a tensor with a duplicate
    ],
)
def test_rank_map_that_is_not_a_permutation_raises_invalid_rank_map_error(rank_map):
    with fake_world(8, 2):
        with pytest.raises(InvalidRankMapError) as e:
            init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), rank_map=rank_map)
        assert isinstance(e.value, RankmeshError)
        assert e.value.field == "rank_map"
        assert "permutation" in str(e.value)


@pytest.mark.parametrize("rank_map", [[0.0, 1, 2, 3, 4, 5, 6, 7], torch.arange(8.0)], ids=["list", "tensor"])
def test_rank_map_of_floats_raises_argument_type_error(rank_map):
    # not integers: a type fault, by rankmesh._check's rule (the Rust core applies it to rank maps)
    with fake_world(8, 2):
        with pytest.raises(ArgumentTypeError) as e:
            init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), rank_map=rank_map)
        assert e.value.field == "rank_map" and e.value.value == 0.0


@pytest.mark.parametrize("form", [list, tuple, np.array, torch.tensor])
def test_rank_map_in_any_form_gives_torchs_mesh_of_the_permuted_tensor(form):
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    for rank in (0, 5, 7):
        with fake_world(8, rank):
            o, t = build_both((2, 2, 2), ("a", "b", "c"), perm, rank_map_form=form)
            assert_same_mesh(o, t, o, t)
            assert o._rank_map.tolist() == perm
            assert o["a", "c"].mesh.tolist() == t["a", "c"].mesh.tolist()


# -- 3. errors: rankmesh's class, and torch's builtin class too -----------------------------------


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


def test_mesh_shape_smaller_than_the_world_raises_size_mismatch():
    # torch accepts a mesh over the first ranks of the world; rankmesh asks for torch's own
    # init_device_mesh there (a documented restriction), with a SizeMismatchError.
    with fake_world(8, 3):
        with pytest.raises(SizeMismatchError, match="multiply to 8"):
            init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))


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


# -- 4. process groups --------------------------------------------------------------------------


def test_meshes_of_one_world_share_one_group_per_partition_and_name_across_unflattens():
    with fake_world(8, 5, MESHFAKE):
        world = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
        assert world.get_group() is dist.group.WORLD
        m1 = world._unflatten(0, (2, 4), ("dp", "tp"))
        m2 = world._unflatten(0, (2, 2, 2), ("a", "b", "c"), backend_override={"b": FAKE})
        m3 = world._unflatten(0, (1, 2, 4), ("x", "dp", "tp"))
        assert [ranks_of(m1.get_group(n)) for n in ("dp", "tp")] == [[1, 5], [4, 5, 6, 7]]
        assert [ranks_of(m2.get_group(n)) for n in ("a", "b", "c")] == [[1, 5], [5, 7], [4, 5]]
        # the same partition under the same name, whichever unflatten made the dim: one object
        assert m3.get_group("tp") is m1.get_group("tp") and m3.get_group("dp") is m1.get_group("dp")
        assert m1["dp", "tp"]["tp"].get_group() is m1.get_group("tp")
        # the same ranks under another name: a group of its own, as in torch (FSDP2 keys its
        # parameter groups by process group and needs one mesh per group)
        assert ranks_of(m2.get_group("a")) == ranks_of(m1.get_group("dp"))
        assert m2.get_group("a") is not m1.get_group("dp")
        bc = m2["b", "c"]._flatten("bc").get_group()
        assert ranks_of(bc) == ranks_of(m1.get_group("tp")) and bc is not m1.get_group("tp")
        assert m2["a", "b", "c"]._flatten("all").get_group() is dist.group.WORLD
        # b is fake; the real group of b's partition is another group
        assert _backend(m2.get_group("b")) == FAKE
        again = world._unflatten(0, (2, 2, 2), ("a", "b", "c"))
        real_b = again.get_group("b")
        assert _backend(real_b) == MESHFAKE and real_b is not m2.get_group("b")
        assert ranks_of(real_b) == [5, 7]
        assert again.get_group("a") is m2.get_group("a") and again.get_group("c") is m2.get_group("c")
        t01 = m1["tp"]._unflatten(0, (2, 2), ("t0", "t1"))
        assert ranks_of(t01.get_group("t0")) == [5, 7] and t01.get_group("t0") is not real_b
        # torch, for contrast, makes new groups for every unflatten
        t_world = torch_init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
        t1 = t_world._unflatten(0, (2, 4), ("dp", "tp"))
        t3 = t_world._unflatten(0, (1, 2, 4), ("x", "dp", "tp"))
        assert ranks_of(t3.get_group("tp")) == ranks_of(m3.get_group("tp"))
        assert t3.get_group("tp") is not t1.get_group("tp")
        rep = world.build_report()
        assert rep.method == "new_group"
        # created: dp, tp (m1); a, b (fake), c (m2); x (fake, m3); bc; b (real); t0, t1. Served by
        # the default group: the root's world dim and the "all" flatten. Shared: m3's dp and tp,
        # the second unflatten's a and c.
        assert (rep.real, rep.fake, rep.reused_default) == (8, 2, 2)
        assert rep.dims == 1 + 2 + 3 + 1 + 1 + 3 + 3 + 2
        assert rep.shared == 4
        assert rep.by_backend == {MESHFAKE: 8, FAKE: 2}
        assert [g[:2] for g in rep.groups] == [
            ("dp", MESHFAKE), ("tp", MESHFAKE), ("a", MESHFAKE), ("b", FAKE), ("c", MESHFAKE), ("x", FAKE),
            ("bc", MESHFAKE), ("b", MESHFAKE), ("t0", MESHFAKE), ("t1", MESHFAKE),
        ]  # fmt: skip


def test_a_dim_overridden_to_fake_stays_fake_through_derivations():
    for rank in (0, 6):
        with fake_world(8, rank, MESHFAKE):
            o = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"), backend_override={"dp": FAKE})
            t = torch_init_device_mesh(
                "cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"), backend_override={"dp": FAKE}
            )
            assert _backend(o.get_group("dp")) == FAKE
            for f in (lambda m: m["dp"], lambda m: m["dp", "tp"], lambda m: m["pp", "dp"]):
                assert_same_mesh(f(o), f(t), o, t)
                assert _backend(f(o).get_group("dp")) == FAKE
            flat = o["dp", "tp"]._flatten("dp_tp", backend_override=FAKE)
            assert _backend(flat.get_group()) == FAKE
            assert_same_mesh(flat, t["dp", "tp"]._flatten("dp_tp", backend_override=FAKE), o, t)
            u = flat._unflatten(0, (2, 2), ("x", "y"), backend_override={0: FAKE})
            assert [_backend(u.get_group(i)) for i in range(2)] == [FAKE, MESHFAKE]


def test_build_report_counts_groups_by_backend():
    with fake_world(16, 9, MESHFAKE):
        o = init_device_mesh(
            "cpu", (2, 1, 2, 4), mesh_dim_names=("pp", "one", "dp", "tp"), backend_override={"pp": FAKE}
        )
        rep = o.build_report()
        assert rep.backend == MESHFAKE
        assert (rep.real, rep.fake, rep.reused_default, rep.shared, rep.dims) == (2, 2, 0, 0, 4)
        assert list(rep.groups) == [("pp", FAKE, 2), ("one", FAKE, 1), ("dp", MESHFAKE, 2), ("tp", MESHFAKE, 4)]
        assert rep.by_backend == {FAKE: 2, MESHFAKE: 2}
        o._unflatten("tp", (2, 2), ("t0", "t1"))
        o["dp", "tp"]._flatten()
        rep2 = o.build_report()
        assert rep2.dims == 4 + 2 + 1
        assert rep2.created == rep.created + 3  # t0, t1, dp_tp are new partitions
        o._unflatten("tp", (4,), ("tp2",))  # tp's partition again, under another name: its own group
        assert o.build_report().created == rep2.created + 1
        o["pp", "one", "dp"]._unflatten("dp", (2,), ("dp",))  # dp's partition and name again: shared
        assert o.build_report().shared == rep2.shared + 1
        assert o["dp"].build_report() == o.build_report()  # one report per world


# -- 5. laziness at 2**20 ranks ------------------------------------------------------------------


def _titan_meshes(m: DeviceMesh) -> list[DeviceMesh]:
    """torchtitan's derivations of a (pp, dp_replicate, dp_shard, cp, tp) mesh."""
    dp = m["dp_replicate", "dp_shard", "cp"]
    fsdp = m["dp_shard", "cp"]._flatten("fsdp")
    return [
        dp,
        dp._flatten("dp_cp"),
        fsdp,
        m["tp"],
        m["pp", "tp"],
        fsdp._unflatten(0, (16, 16), ("f0", "f1")),
        m._unflatten("dp_shard", (8, 8), ("efsdp", "ep"))["efsdp", "ep"],
        m["dp_replicate", "dp_shard"]._flatten("hsdp", backend_override=FAKE),
    ]


@pytest.mark.parametrize("permuted", [False, True], ids=["identity", "rank_map"])
def test_a_million_rank_world_is_built_and_sliced_without_materialising_the_rank_map(permuted):
    W, rank = 2**20, 12345
    sizes = dict(pp=8, dp_replicate=16, dp_shard=64, cp=4, tp=32)
    shape = tuple(sizes.values())
    perm = np.random.default_rng(1).permutation(W).astype(np.int32) if permuted else None
    index = int(np.flatnonzero(perm == rank)[0]) if permuted else rank  # where this rank sits
    placed = perm if permuted else np.arange(W, dtype=np.int32)
    with fake_world(W, rank):
        world = init_device_mesh("cpu", (W,), mesh_dim_names=("world",), rank_map=perm)
        dense = world._unflatten(0, shape, tuple(sizes))
        first = [world, dense, *_titan_meshes(dense)]
        root = init_device_mesh("cpu", shape, mesh_dim_names=tuple(sizes), rank_map=perm)
        second = [root, *_titan_meshes(root)]
        for m in first + second:
            assert isinstance(m, FastDeviceMesh)
            m.get_coordinate(), m.mesh, m.get_group(0), m.get_local_rank(0)
        assert dense["tp"] == dense["tp"] and dense["tp"] != dense["cp"]
        assert world.get_coordinate() == (index,) and world.get_local_rank() == rank
        coord = tuple(int(c) for c in np.unravel_index(index, shape))
        assert dense.get_coordinate() == root.get_coordinate() == coord
        full = placed.reshape(shape)
        pp, dr, ds, cp, tp = coord
        assert dense["tp"].mesh.tolist() == root["tp"].mesh.tolist() == full[pp, dr, ds, cp, :].tolist()
        assert dense["pp", "tp"].mesh.tolist() == full[:, dr, ds, cp, :].tolist()
        assert dense["dp_shard", "cp"]._flatten("fsdp").mesh.tolist() == full[pp, dr, :, :, tp].reshape(-1).tolist()
        assert all(m.mesh.numel() < W for m in first[2:] + second[1:])
        for m in first + second:
            assert m._rm_world._rank_map_tuple is None and m._rm_world._rank_map is None
        # _flatten_rank_map: made once per world, on demand, the same object on every mesh of it
        flat = dense["tp"]._flatten_rank_map
        assert isinstance(flat, tuple) and len(flat) == W
        assert flat[index] == rank and flat[:5] == tuple(placed[:5].tolist()) and flat[-1] == placed[-1]
        for m in first:
            assert m._flatten_rank_map is flat
        assert root._rm_world._rank_map_tuple is None  # another world: another init_device_mesh call
        assert root._flatten_rank_map is not flat and root._flatten_rank_map == flat


# -- 6. pickling ---------------------------------------------------------------------------------


def test_pickled_root_slice_and_flattened_meshes_come_back_equal_with_their_groups():
    perm = [3, 0, 6, 1, 7, 2, 4, 5]
    for rank in (0, 4):
        with fake_world(8, rank, MESHFAKE):
            o, t = build_both((2, 2, 2), ("dp", "cp", "tp"), perm, backend_override={"tp": FAKE})
            ours = [o, o["dp", "tp"], o["dp", "cp"]._flatten("dp_cp"), o._unflatten("tp", (2, 1), ("t0", "t1"))]
            theirs = [t, t["dp", "tp"], t["dp", "cp"]._flatten("dp_cp"), t._unflatten("tp", (2, 1), ("t0", "t1"))]
            for m, tm in zip(ours, theirs):
                back = pickle.loads(pickle.dumps(m))
                assert type(back) is FastDeviceMesh
                assert back == m and hash(back) == hash(m)
                assert back == tm and hash(back) == hash(tm)
                assert back.mesh.tolist() == m.mesh.tolist()
                assert back.mesh_dim_names == m.mesh_dim_names and back._layout == m._layout
                assert back.get_coordinate() == m.get_coordinate()
                for i in range(m.ndim):
                    assert back.get_group(i) is m.get_group(i)
                    assert back.get_local_rank(i) == m.get_local_rank(i)
                # still derivable after the round trip
                if m.ndim > 1:
                    n0, n1 = m.mesh_dim_names[:2]
                    assert back[n0, n1] == m[n0, n1] and back[n0, n1] == tm[n0, n1]
                # deepcopy goes the same way
                dc = copy.deepcopy(m)
                assert type(dc) is FastDeviceMesh and dc == m and dc.mesh.tolist() == m.mesh.tolist()
                assert all(dc.get_group(i) is m.get_group(i) for i in range(m.ndim))
            # meshes pickled together keep one root
            root, sub, flat, _ = pickle.loads(pickle.dumps(ours))
            assert sub._get_root_mesh() is root and flat._get_root_mesh() is root
            assert root["dp_cp"] == flat


# -- 7. DTensor, FSDP2, torch.compile ------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
@pytest.mark.parametrize("override", [None, {0: FAKE}])
def test_dtensor_on_our_mesh_gives_torchs_values_on_a_one_rank_gloo_world(gloo_world_of_one, shape, override):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    names = tuple(f"d{i}" for i in range(len(shape)))
    o, t = build_both(shape, names, backend_override=override)
    assert_same_mesh(o, t, o, t)
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    shard = [Shard(0)] + [Shard(1)] * (len(shape) - 1)
    rep = [Replicate()] * len(shape)
    results = []
    for mesh in (o, t):
        dt = distribute_tensor(full, mesh, shard)
        assert dt.device_mesh is mesh
        r = dt.redistribute(mesh, rep)
        s = (dt * 2 + 1).sum()
        results.append((dt.to_local(), r.to_local(), dt.full_tensor(), s.full_tensor(), r.placements))
    for a, b in zip(*results):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert torch.equal(results[0][2], full)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def test_fsdp2_hsdp_and_tp_build_on_our_meshes_as_on_torchs():
    # The fake backend runs no real collective, so only structure is checked here; values are
    # checked by the 8-rank gloo tests in test_multiprocess.py.
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def build(mesh_2d, mesh_3d):
        hsdp = _mlp()
        fully_shard(hsdp, mesh=mesh_2d)
        tp = _mlp()
        parallelize_module(tp, mesh_3d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(tp, mesh=mesh_3d["dp_replicate", "dp_shard"])
        return hsdp, tp

    with fake_world(8, 5):
        o2, t2 = build_both((2, 4), ("dp_replicate", "dp_shard"))
        o3, t3 = build_both((2, 2, 2), ("dp_replicate", "dp_shard", "tp"))
        ours, theirs = build(o2, o3), build(t2, t3)
        for om, tm in zip(ours, theirs):
            for (name, p), (tname, tp) in zip(om.named_parameters(), tm.named_parameters()):
                assert name == tname
                assert isinstance(p, DTensor) and isinstance(tp, DTensor)
                assert p.placements == tp.placements
                assert p.to_local().shape == tp.to_local().shape
                assert p.device_mesh == tp.device_mesh and hash(p.device_mesh) == hash(tp.device_mesh)
                assert p.device_mesh.mesh.tolist() == tp.device_mesh.mesh.tolist()
                assert p.device_mesh.mesh_dim_names == tp.device_mesh.mesh_dim_names
                assert ranks_of(p.device_mesh.get_group(0)) == ranks_of(tp.device_mesh.get_group(0))
        # HSDP: the parameters live on our mesh itself
        for p in ours[0].parameters():
            assert p.device_mesh is o2
        # TP + HSDP: FSDP2 joins the dp and tp meshes (DeviceMesh._concatenate) into a mesh whose
        # root equals ours. (Not asserted by identity: DTensor's sharding-propagation cache keys
        # on mesh equality, so an equal mesh met earlier in the process may stand in for it; the
        # same happens to torch's own meshes.)
        for p in ours[1].parameters():
            assert p.device_mesh._get_root_mesh() == o3
            assert p.device_mesh == o3
            assert [ranks_of(g) for g in p.device_mesh.get_all_groups()] == [ranks_of(g) for g in o3.get_all_groups()]


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _compile_run(fn, *args):
    """fn compiled (eager backend, counted) and run once; (result, frames, ops, graph breaks)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cnt = CompileCounter()
    try:
        out = torch.compile(fn, backend=cnt)(*args)
        return out, cnt.frame_count, cnt.op_count, _graph_breaks()
    finally:
        torch._dynamo.reset()


# DTensor caches (sharding propagation, redistribute plans) key on mesh equality, and meshes are
# equal across worlds: an equal mesh compiled earlier in the process can stand in for ours. So
# the compile tests use dim names no other test uses, and run our mesh first.


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_compiled_dtensor_function_on_our_mesh_matches_torchs_without_more_graph_breaks(gloo_world_of_one, shape):
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    names = tuple(f"compiled{len(shape)}_{i}" for i in range(len(shape)))
    o, t = build_both(shape, names)

    def fn(x):
        mesh = x.device_mesh
        y = (x * 2 + mesh.size(0)).redistribute(placements=[Replicate()] * mesh.ndim)
        z = DTensor.from_local(y.to_local() - 1, mesh, [Replicate()] * mesh.ndim)
        sub = mesh[mesh.mesh_dim_names[-1]]
        return z.full_tensor() + mesh.get_coordinate()[0] + mesh.get_local_rank(0) + sub.size() + mesh.ndim

    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    results = {}
    for label, mesh in (("ours", o), ("torch", t)):
        x = distribute_tensor(full, mesh, [Shard(0)] + [Shard(1)] * (mesh.ndim - 1))
        got, frames, ops, breaks = _compile_run(fn, x)
        assert torch.equal(got, fn(x))  # compiled == eager
        results[label] = (got, frames, ops, breaks)
    ours, theirs = results["ours"], results["torch"]
    assert torch.equal(ours[0], theirs[0])
    assert torch.equal(ours[0], full * 2 + 1 - 1 + 1 + len(shape))
    assert ours[1] >= 1  # something was compiled at all
    assert ours[1] <= theirs[1]  # frames compiled
    assert ours[3] <= theirs[3]  # graph breaks
    assert ours[2] == theirs[2]  # the same graph


def _compiled_redistribute(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    x = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    got, *_ = _compile_run(lambda x: x.redistribute(x.device_mesh, [Replicate(), Replicate()]).to_local(), x)
    assert torch.equal(got, full)


def test_compiled_redistribute_onto_our_mesh_works_like_torchs(gloo_world_of_one):
    _compiled_redistribute(init_device_mesh("cpu", (1, 1), mesh_dim_names=("redist_a", "redist_b")))


def test_compiled_redistribute_onto_torchs_mesh_works(gloo_world_of_one):
    # The oracle of the test above: torch's own mesh, same dims, other names.
    _compiled_redistribute(torch_init_device_mesh("cpu", (1, 1), mesh_dim_names=("oracle_a", "oracle_b")))


def _compiled_flatten(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    x = distribute_tensor(torch.ones(4, 3), mesh, [Shard(0), Shard(1)])
    got, *_ = _compile_run(lambda x: x.to_local() + x.device_mesh._flatten("cflat").size(), x)
    assert torch.equal(got, torch.full((4, 3), 2.0))
    assert mesh._flatten_mapping["cflat"].mesh_dim_names == ("cflat",)


def test_compiled_flatten_of_our_mesh_works_like_torchs(gloo_world_of_one):
    _compiled_flatten(init_device_mesh("cpu", (1, 1), mesh_dim_names=("cflat_a", "cflat_b")))


def test_compiled_flatten_of_torchs_mesh_works(gloo_world_of_one):
    # The oracle of the test above.
    _compiled_flatten(torch_init_device_mesh("cpu", (1, 1), mesh_dim_names=("tflat_a", "tflat_b")))
