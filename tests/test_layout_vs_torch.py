"""Property tests: ``rankmesh.MeshLayout`` against torch's own layout code as the oracle.

Random layouts are built by random sequences of operations starting at
``MeshLayout.world(W, rank_map)``: unflatten of any dim (inner dims, size-1 dims, dims that
came from a flatten of non-adjacent dims), slices of ordered subsets, flatten. Every operation
is mirrored on torch's side with ``_MeshLayout`` / ``_FlatLayout`` exactly as
``DeviceMesh._unflatten`` / ``__getitem__`` / ``_flatten`` do it, and after every step the two
are compared exactly: shape, names, modes, ``groups()`` vs ``remap_to_tensor``, and for sampled
ranks the local mesh, the coordinate, the copy index and the group of every dim.

A smaller test drives real ``DeviceMesh`` objects on the ``fake`` backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, currently_in_test_context, event, given, note, settings
from hypothesis import strategies as st
from rankmesh import MeshLayout
from rankmesh.errors import IncompatibleLayoutError, SliceOrderError
from torch.distributed._mesh_layout import _MeshLayout

from tests.conftest import fake_world

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# prime factors a world is drawn from; W is their product (W = 1 when none is drawn)
PRIMES = [2, 2, 2, 2, 3, 3, 5, 7]
MAX_WORLD = 4096


def record(what: str) -> None:
    """A coverage event for ``--hypothesis-show-statistics`` (no-op outside a property test)."""
    if currently_in_test_context():
        event(what)


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


# ---------------------------------------------------------------------------------------------
# torch's side: the exact operations DeviceMesh performs on its _MeshLayout
# ---------------------------------------------------------------------------------------------


def torch_unflatten(layout: _MeshLayout, dim: int, sizes: list[int]) -> _MeshLayout | None:
    """``DeviceMesh._create_unflatten_mesh``'s layout, or None where torch rejects the sizes.

    pycute's composition raises AssertionError when the sizes do not follow the dim's strides.
    In a few such cases it does not raise but silently returns a layout of other sizes; that is
    a rejection too (a DeviceMesh built from it would not have the requested shape).
    """
    inner = _MeshLayout.from_sizes_strides(tuple(sizes))
    assert inner.numel() == layout[dim].numel()
    try:
        partial = layout[dim].composition(inner)
    except AssertionError:
        return None
    if list(partial.top_level_sizes) != list(sizes):
        record("pycute returned other sizes without raising")
        return None
    return layout.splice(dim, dim + 1, partial)


def torch_slice(layout: _MeshLayout, idx: list[int]) -> _MeshLayout | None:
    """``DeviceMesh._get_slice_mesh_layout``, or None where torch rejects the slice."""
    result = _MeshLayout([layout[i] for i in idx])
    if not result.collapse().check_sorted() or not result.collapse().check_orthogonal():
        return None
    return result


def torch_flatten(layout: _MeshLayout) -> _MeshLayout:
    return _MeshLayout([layout.collapse()])


def row_of(remap: torch.Tensor) -> np.ndarray:
    """For a ``remap_to_tensor`` result, the row index holding each rank."""
    flat = remap.reshape(remap.shape[0], -1).numpy()
    rows = np.full(int(flat.size), -1, dtype=np.int64)
    rows[flat] = np.arange(flat.shape[0])[:, None]
    assert (rows >= 0).all(), "torch's remap is not a partition of the world"
    return rows


# ---------------------------------------------------------------------------------------------
# the model: our layout next to torch's
# ---------------------------------------------------------------------------------------------


@dataclass
class Pair:
    ours: MeshLayout
    theirs: _MeshLayout
    names: list[str]
    rank_map: torch.Tensor  # int32, 1-D: rank_map[i] = rank at world index i

    @property
    def world_size(self) -> int:
        return int(self.rank_map.numel())


def new_pair(world_size: int, seed: int | None) -> Pair:
    if seed is None:
        perm = None
        rank_map = torch.arange(world_size, dtype=torch.int32)
    else:
        perm = np.random.default_rng(seed).permutation(world_size)
        rank_map = torch.from_numpy(perm.astype(np.int32))
    ours = MeshLayout.world(world_size, perm)
    theirs = _MeshLayout.from_sizes_strides((world_size,))
    return Pair(ours, theirs, ["world"], rank_map)


def check_pair(p: Pair, ranks: list[int]) -> None:
    """Every query of ours equals what torch's layout code gives."""
    ours, theirs = p.ours, p.theirs
    record(f"world size < {1 << p.world_size.bit_length()}")
    record(f"max modes per dim: {max(len(ours.modes(d)) for d in range(ours.ndim))}")
    assert ours.shape == tuple(theirs.top_level_sizes)
    assert ours.names == tuple(p.names)
    assert ours.ndim == len(theirs) == len(ours)
    assert ours.world_size == p.world_size
    assert ours.size() == theirs.numel()
    assert ours.num_copies == p.world_size // theirs.numel()
    for d in range(len(theirs)):
        axis = theirs[d]
        assert ours.modes(d) == list(zip(axis.shape, axis.stride)), (d, axis)
        assert ours.modes(p.names[d]) == ours.modes(d)
        assert ours.size(d) == ours.size(p.names[d]) == axis.numel()

    remap = theirs.remap_to_tensor(p.rank_map)
    groups = ours.groups()
    assert groups.dtype == np.int32 and groups.flags.c_contiguous
    assert groups.shape == tuple(remap.shape)
    np.testing.assert_array_equal(groups, remap.numpy())

    rows = row_of(remap)
    dim_remaps = [_MeshLayout([theirs[d]]).remap_to_tensor(p.rank_map) for d in range(len(theirs))]
    dim_rows = [row_of(r) for r in dim_remaps]
    for r in ranks:
        local = remap[rows[r]]
        np.testing.assert_array_equal(ours.mesh_of(r), local.numpy())
        assert ours.copy_index_of(r) == rows[r]
        # DeviceMesh's own search, as get_coordinate() does it
        coord = tuple((local == r).nonzero()[0].tolist())
        assert ours.coordinate_of(r) == coord
        for d in range(len(theirs)):
            want = dim_remaps[d][dim_rows[d][r]].numpy()
            np.testing.assert_array_equal(ours.group(r, d), want)
            np.testing.assert_array_equal(ours.group(r, p.names[d]), want)
            # the group is the line through r's coordinate along d in the local mesh
            index = list(coord)
            index[d] = slice(None)
            np.testing.assert_array_equal(local[tuple(index)].numpy(), want)


# ---------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------


@st.composite
def worlds(draw, min_factors: int = 0) -> tuple[int, int | None]:
    factors = draw(st.lists(st.sampled_from(PRIMES), min_size=min_factors, max_size=10))
    w = 1
    for f in factors:
        if w * f > MAX_WORLD:
            break
        w *= f
    seed = draw(st.none() | st.integers(0, 2**32 - 1))
    return w, seed


def draw_sizes(data, n: int, max_parts: int = 4, ones: bool = True, min_parts: int = 1) -> list[int]:
    """A random ordered factorisation of ``n``: shuffled prime factors cut into parts, plus
    (when ``ones``) a few size-1 parts anywhere."""
    primes = data.draw(st.permutations(prime_factors(n)), label="primes")
    hi = max(1, min(max_parts, len(primes)))
    k = data.draw(st.integers(min(min_parts, hi), hi), label="parts")
    cuts = sorted(
        data.draw(
            st.lists(st.integers(1, max(1, len(primes) - 1)), min_size=k - 1, max_size=k - 1, unique=True),
            label="cuts",
        )
    )
    bounds = [0, *cuts, len(primes)]
    sizes = [math.prod(primes[a:b]) for a, b in zip(bounds, bounds[1:])]
    if ones:
        for pos in data.draw(st.lists(st.integers(0, len(sizes)), max_size=2), label="ones at"):
            sizes.insert(pos, 1)
    return sizes


def draw_dim_arg(data, p: Pair, d: int):
    how = data.draw(st.sampled_from(["name", "index", "negative"]), label="dim as")
    return {"name": p.names[d], "index": d, "negative": d - len(p.names)}[how]


def draw_subset(data, n: int, gap: bool = False) -> list[int]:
    """A non-empty ordered subset of ``range(n)``; with ``gap`` (and n >= 3) one that skips a
    dim between two chosen ones, so flattening it gives a dim with non-uniform strides."""
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="mask")
    if gap and n >= 3:
        i, g, j = sorted(
            data.draw(st.lists(st.integers(0, n - 1), min_size=3, max_size=3, unique=True), label="i<gap<j")
        )
        mask[i], mask[g], mask[j] = True, False, True
    if not any(mask):
        mask[data.draw(st.integers(0, n - 1), label="only")] = True
    return [i for i, m in enumerate(mask) if m]


class Namer:
    def __init__(self) -> None:
        self.i = 0

    def __call__(self) -> str:
        self.i += 1
        return f"n{self.i}"


def do_unflatten(data, p: Pair, namer: Namer, d: int | None = None, ones: bool = True, min_parts: int = 1) -> Pair:
    """Unflattens a random dim on both sides; checks that torch rejects iff we do."""
    if d is None:
        d = data.draw(st.integers(0, p.ours.ndim - 1), label="dim")
    sizes = draw_sizes(data, p.ours.size(d), ones=ones, min_parts=min_parts)
    names = [namer() for _ in sizes]
    note(f"unflatten dim {d} ({p.ours.modes(d)}) into {sizes}")
    theirs = torch_unflatten(p.theirs, d, sizes)
    try:
        ours = p.ours.unflatten(draw_dim_arg(data, p, d), sizes, names)
    except IncompatibleLayoutError as e:
        assert theirs is None, f"we reject {sizes} for modes {p.ours.modes(d)}, torch accepts: {e}"
        assert e.field == "sizes"
        record("unflatten rejected by both")
        return p
    assert theirs is not None, f"torch rejects {sizes} for modes {p.ours.modes(d)}, we accept"
    record(f"unflatten of a dim with {len(p.ours.modes(d))} modes accepted")
    return Pair(ours, theirs, p.names[:d] + names + p.names[d + 1 :], p.rank_map)


def do_slice(data, p: Pair, gap: bool = False) -> Pair:
    idx = draw_subset(data, p.ours.ndim, gap)
    names = [p.names[i] for i in idx]
    note(f"slice {names}")
    theirs = torch_slice(p.theirs, idx)
    assert theirs is not None
    key = names[0] if len(names) == 1 and data.draw(st.booleans(), label="str key") else tuple(names)
    return Pair(p.ours[key], theirs, names, p.rank_map)


def do_flatten(data, p: Pair, namer: Namer) -> Pair:
    name = data.draw(st.none() | st.just(namer()), label="flatten name")
    note(f"flatten {p.names} as {name}")
    ours = p.ours.flatten(name) if name is not None else p.ours.flatten()
    expected = name if name is not None else "_".join(p.names)
    return Pair(ours, torch_flatten(p.theirs), [expected], p.rank_map)


def sample_ranks(data, w: int) -> list[int]:
    extra = data.draw(st.lists(st.integers(0, w - 1), max_size=4), label="ranks")
    return sorted({0, w - 1, *extra})


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------


@settings(max_examples=500, **SETTINGS)
@given(world=worlds(), data=st.data())
def test_random_op_sequences_match_torch(world, data):
    w, seed = world
    namer = Namer()
    p = new_pair(w, seed)
    ranks = sample_ranks(data, w)
    check_pair(p, ranks)
    p = do_unflatten(data, p, namer, d=0, min_parts=data.draw(st.integers(1, 4), label="min parts"))
    check_pair(p, ranks)
    ops = data.draw(
        st.lists(
            st.sampled_from(["unflatten", "unflatten", "slice", "flatten", "slice+flatten"]), min_size=1, max_size=7
        ),
        label="ops",
    )
    for op in ops:
        if op == "unflatten":
            p = do_unflatten(data, p, namer)
        elif op == "slice":
            p = do_slice(data, p)
        elif op == "flatten":
            p = do_flatten(data, p, namer)
        else:  # flatten a (preferably non-adjacent) subset of dims
            p = do_flatten(data, do_slice(data, p, gap=True), namer)
        check_pair(p, ranks)


@settings(max_examples=600, **SETTINGS)
@given(world=worlds(min_factors=4), data=st.data())
def test_unflatten_of_non_adjacent_flatten(world, data):
    """The hard case: a dim flattened from non-adjacent dims has non-uniform strides, and only
    sizes that follow its modes can split it. torch raises iff we raise, and agrees otherwise.
    Up to three rounds of (unflatten, slice a subset, flatten, unflatten) pile up the modes."""
    w, seed = world
    namer = Namer()
    p = new_pair(w, seed)
    ranks = sample_ranks(data, w)
    for _ in range(data.draw(st.integers(1, 3), label="rounds")):
        p = do_unflatten(data, p, namer, d=0, ones=False, min_parts=3)
        p = do_flatten(data, do_slice(data, p, gap=True), namer)
        check_pair(p, ranks)
        record(f"flattened dim with {len(p.ours.modes(0))} modes")
        for _ in range(data.draw(st.integers(1, 2), label="unflattens")):
            p = do_unflatten(data, p, namer, ones=data.draw(st.booleans(), label="ones"))
            check_pair(p, ranks)
        if p.ours.ndim > 1:
            p = do_flatten(data, p, namer)


def test_torch_rejects_what_we_reject_examples():
    """Hand-picked splits of (4,3):(6,1) = dims a, c of a (4,2,3) world of 24."""
    namer = Namer()
    p = new_pair(24, seed=7)
    p = Pair(
        p.ours.unflatten(0, (4, 2, 3), ("a", "b", "c")),
        torch_unflatten(p.theirs, 0, [4, 2, 3]),
        ["a", "b", "c"],
        p.rank_map,
    )
    p = Pair(p.ours["a", "c"].flatten("ac"), torch_flatten(_MeshLayout([p.theirs[0], p.theirs[2]])), ["ac"], p.rank_map)
    assert p.ours.modes("ac") == [(4, 6), (3, 1)]
    for sizes, ok in [
        ((2, 6), True),
        ((4, 3), True),
        ((1, 12), True),
        ((12, 1), True),
        ((2, 2, 3), True),
        ((3, 4), False),
        ((6, 2), False),
        ((2, 3, 2), False),
    ]:
        names = [namer() for _ in sizes]
        theirs = torch_unflatten(p.theirs, 0, list(sizes))
        assert (theirs is not None) == ok, sizes
        if ok:
            check_pair(Pair(p.ours.unflatten("ac", sizes, names), theirs, names, p.rank_map), [0, 5, 23])
        else:
            with pytest.raises(IncompatibleLayoutError) as info:
                p.ours.unflatten("ac", sizes, names)
            assert info.value.field == "sizes"
            assert str(list(sizes)) in str(info.value)


@settings(max_examples=400, **SETTINGS)
@given(world=worlds(), data=st.data())
def test_slice_order_iff_torch(world, data):
    """Out-of-order slices: torch's check_sorted rejects them iff we raise SliceOrderError.

    Known, deliberate difference: torch checks the order of the *strides*, and a size-1 dim has
    none, so torch lets size-1 dims be sliced out of order (``mesh["pp", "dp"]`` with pp=1).
    rankmesh requires mesh order always, so code does not start failing when a degree grows.
    There we only require: torch rejects => we reject.
    """
    w, seed = world
    namer = Namer()
    p = do_unflatten(data, new_pair(w, seed), namer, d=0, min_parts=2)
    if data.draw(st.booleans(), label="via non-adjacent flatten"):
        p = do_flatten(data, do_slice(data, p, gap=True), namer)
        p = do_unflatten(data, p, namer, d=0, min_parts=2)
    n = p.ours.ndim
    k = data.draw(st.integers(1, n), label="k")
    idx = data.draw(st.permutations(range(n)), label="perm")[:k]
    names = tuple(p.names[i] for i in idx)
    note(f"slice {names} of {p.names} {p.ours.shape}")
    theirs = torch_slice(p.theirs, idx)
    in_order = idx == sorted(idx)
    try:
        ours = p.ours[names]
    except SliceOrderError as e:
        assert not in_order
        assert e.field == "names"
        for name in names:
            assert f"{name!r}".replace("'", '"') in str(e)  # names are quoted
        if all(p.ours.size(i) > 1 for i in idx):
            assert theirs is None, "torch accepts an out-of-order slice of dims of size > 1"
        return
    assert in_order
    assert theirs is not None, f"torch rejects the in-order slice {names}"
    check_pair(Pair(ours, theirs, list(names), p.rank_map), sample_ranks(data, w))


def test_size_one_dims_out_of_order_is_a_known_divergence():
    """torch accepts ``mesh["pp", "dp"]`` when pp has size 1 (no strides to compare); we don't."""
    layout = MeshLayout.world(8).unflatten(0, (2, 1, 4), ("dp", "pp", "tp"))
    theirs = _MeshLayout.from_sizes_strides((8,))
    theirs = torch_unflatten(theirs, 0, [2, 1, 4])
    assert torch_slice(theirs, [1, 0]) is not None
    with pytest.raises(SliceOrderError):
        layout["pp", "dp"]
    assert torch_slice(theirs, [2, 0]) is None
    with pytest.raises(SliceOrderError):
        layout["tp", "dp"]


@pytest.mark.parametrize("world_size", [1, 2, 12, 64])
def test_size_one_everywhere(world_size):
    """Size-1 dims have no modes (torch's 0-d _FlatLayout) and unflatten into more size-1 dims."""
    p = new_pair(world_size, seed=world_size)
    theirs = torch_unflatten(p.theirs, 0, [1, world_size, 1])
    p = Pair(p.ours.unflatten(0, (1, world_size, 1), ("a", "b", "c")), theirs, ["a", "b", "c"], p.rank_map)
    check_pair(p, list(range(world_size)))
    assert p.ours.modes("a") == [] and p.ours.modes("c") == []
    q = Pair(
        p.ours.unflatten("c", (1, 1), ("c1", "c2")),
        torch_unflatten(p.theirs, 2, [1, 1]),
        ["a", "b", "c1", "c2"],
        p.rank_map,
    )
    check_pair(q, list(range(world_size)))
    r = Pair(q.ours["a", "c2"], torch_slice(q.theirs, [0, 3]), ["a", "c2"], p.rank_map)
    check_pair(r, list(range(world_size)))
    f = Pair(r.ours.flatten(), torch_flatten(r.theirs), ["a_c2"], p.rank_map)
    check_pair(f, list(range(world_size)))


# ---------------------------------------------------------------------------------------------
# real DeviceMesh objects on the fake backend
# ---------------------------------------------------------------------------------------------


@dataclass
class MeshPair:
    ours: MeshLayout
    theirs: object  # DeviceMesh


def compare_device_mesh(ours: MeshLayout, mesh, rank: int) -> None:
    assert mesh.mesh_dim_names == ours.names
    assert tuple(mesh.shape) == ours.shape
    np.testing.assert_array_equal(ours.mesh_of(rank), mesh.mesh.numpy())
    assert ours.coordinate_of(rank) == mesh.get_coordinate()
    for d, name in enumerate(ours.names):
        pg_ranks = dist.get_process_group_ranks(mesh.get_group(d))
        # torch's new_group keeps its ranks sorted; the mesh order is in mesh.mesh
        assert sorted(ours.group(rank, d).tolist()) == sorted(pg_ranks)
        assert sorted(ours.group(rank, name).tolist()) == sorted(pg_ranks)
        assert rank in pg_ranks


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_device_mesh_on_fake_backend(data):
    w = data.draw(st.sampled_from([1, 4, 6, 8, 12, 16, 24, 36, 48]), label="world")
    seed = data.draw(st.none() | st.integers(0, 2**32 - 1), label="seed")
    perm = None if seed is None else np.random.default_rng(seed).permutation(w)
    # a recipe of ops, replayed once per sampled rank (each rank is one fake process)
    recipe: list[tuple] = []
    namer = Namer()
    shadow = MeshLayout.world(w, perm)
    for _ in range(data.draw(st.integers(1, 4), label="n ops")):
        op = data.draw(st.sampled_from(["unflatten", "unflatten", "slice", "flatten"]), label="op")
        if op == "unflatten":
            d = data.draw(st.integers(0, shadow.ndim - 1), label="dim")
            sizes = draw_sizes(data, shadow.size(d), max_parts=3)
            names = tuple(namer() for _ in sizes)
            dim = shadow.names[d] if data.draw(st.booleans(), label="dim by name") else d
            try:
                shadow = shadow.unflatten(dim, sizes, names)
            except IncompatibleLayoutError:
                continue
            recipe.append(("unflatten", dim, tuple(sizes), names))
        elif op == "slice":
            idx = draw_subset(data, shadow.ndim)
            names = tuple(shadow.names[i] for i in idx)
            if names == shadow.names:
                continue  # DeviceMesh returns itself
            shadow = shadow[names]
            recipe.append(("slice", names))
        else:
            if shadow.ndim == 1:
                continue  # DeviceMesh._flatten of a 1-D mesh may return itself
            name = namer()
            shadow = shadow.flatten(name)
            recipe.append(("flatten", name))
    note(f"world {w}, recipe {recipe}")
    record(f"recipe of {len(recipe)} ops")
    ranks = sorted({0, w - 1, *data.draw(st.lists(st.integers(0, w - 1), max_size=2), label="ranks")})
    from torch.distributed.device_mesh import DeviceMesh

    for rank in ranks:
        with fake_world(w, rank):
            tensor = torch.arange(w, dtype=torch.int32) if perm is None else torch.from_numpy(perm.astype(np.int32))
            mesh = DeviceMesh("cpu", tensor, mesh_dim_names=("world",))
            ours = MeshLayout.world(w, perm)
            compare_device_mesh(ours, mesh, rank)
            for step in recipe:
                if step[0] == "unflatten":
                    _, d, sizes, names = step
                    mesh = mesh._unflatten(d, sizes, names)
                    ours = ours.unflatten(d, sizes, names)
                elif step[0] == "slice":
                    mesh = mesh[step[1]]
                    ours = ours[step[1]]
                else:
                    mesh = mesh._flatten(step[1])
                    ours = ours.flatten(step[1])
                compare_device_mesh(ours, mesh, rank)
            assert ours == shadow


def test_device_mesh_torchtitan_style():
    """A torchtitan-like build (world -> pp, dp_replicate, dp_shard, cp, tp; flattened dp and
    dp_shard_cp meshes) with a rank map, checked on every rank of a world of 48."""
    from torch.distributed.device_mesh import DeviceMesh

    w = 48
    perm = np.random.default_rng(0).permutation(w)
    sizes, names = (2, 2, 3, 2, 2), ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    for rank in range(w):
        with fake_world(w, rank):
            world = DeviceMesh("cpu", torch.from_numpy(perm.astype(np.int32)), mesh_dim_names=("world",))
            mesh = world._unflatten(0, sizes, names)
            ours = MeshLayout.world(w, perm).unflatten("world", sizes, names)
            compare_device_mesh(ours, mesh, rank)
            for sub in [("dp_replicate", "dp_shard"), ("dp_shard", "cp"), ("pp", "cp", "tp"), ("dp_replicate", "tp")]:
                flat_name = "_".join(sub) + "_flat"
                compare_device_mesh(ours[sub], mesh[sub], rank)
                compare_device_mesh(ours[sub].flatten(flat_name), mesh[sub]._flatten(flat_name), rank)
            # the flattened dp of a non-adjacent pair, unflattened again
            flat = mesh["dp_replicate", "cp"]._flatten("dprc")
            ours_flat = ours["dp_replicate", "cp"].flatten("dprc")
            xy = (0, (2, 2), ("x", "y"))
            compare_device_mesh(ours_flat.unflatten(*xy), flat._unflatten(*xy), rank)


def test_prime_factors():
    assert prime_factors(1) == []
    assert prime_factors(360) == [2, 2, 2, 3, 3, 5]
    assert math.prod(prime_factors(4096)) == 4096
