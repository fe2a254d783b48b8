"""The property test: random recipes (shapes, rank maps, unflattens with backend overrides, slices,
flattens, slices of flattened and unflattened meshes) built by torch and by rankmesh on sampled
ranks, every mesh and relation compared (helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rankmesh.errors import (
    IncompatibleLayoutError,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

from tests.conftest import FAKE, MESHFAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    assert_same_mesh,
    assert_same_relations,
    backend_name,
    build_both,
    outcome,
    ranks_of,
    sampled_ranks,
)

pytestmark = MESH_MARKS


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
        theirs, theirs_e = outcome(lambda: _apply(op, t_src))
        ours, ours_e = outcome(lambda: _apply(op, o_src))
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
        assert [backend_name(t.get_group(i)) for i in range(2)] == [MESHFAKE, FAKE]
    with fake_world(8, 3):
        t = torch_init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), backend_override={"tp": FAKE})
        assert [backend_name(t.get_group(i)) for i in range(2)] == [FAKE, FAKE]


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
        assert backend_name(ptp[0].get_group()) == MESHFAKE
        from_root = (o["pp_tp"], t["pp_tp"])
        assert_same_mesh(*from_root, o, t)
        pairs += [ptp, from_root]
        assert_same_relations(pairs)
        assert backend_name(pairs[1][0].get_group("pp")) == FAKE
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
            assert uo.get_group("tp") is fo.get_group() and backend_name(uo.get_group("tp")) == FAKE
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
