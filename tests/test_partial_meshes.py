"""Meshes over part of the world (``init_device_mesh`` with fewer ranks, or ``ranks=``) and meshes
from existing process groups (:func:`rankmesh.from_group`), against torch's own
``DeviceMesh(mesh=subset)`` / ``DeviceMesh.from_group(..., mesh=...)`` as the oracle, on the fake
backend, seen from members and non-members:

- random worlds, shapes, placements (contiguous, strided, any layout of ranks, and arbitrary
  subsets, which go to torch's own mesh with one warning), ranks, slices, flattens, unflattens:
  every answer torch gives (mesh, coordinate, layout, rank map, equality, hash, group ranks)
  is rankmesh's; where torch raises for a non-member (a slice), rankmesh answers: coordinate None,
  no groups, and ``.mesh`` of a multi-copy slice raises torch's RuntimeError;
- non-members take the members' steps: a plain group made afterwards has the same name on both;
- from_group over random layouts' groups equals torch's from_group with the full mesh tensor;
- bad input is a typed error naming the field; nothing world-sized is built at 2^20.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from rankmesh import _once

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rankmesh import MeshLayout  # noqa: E402
from rankmesh.errors import (  # noqa: E402
    DistributedStateError,
    InvalidRankMapError,
    MeshArgumentError,
    RankOutOfRangeError,
    SizeMismatchError,
)
from rankmesh.mesh import RANK_MAP_MATERIALISATIONS, FastDeviceMesh, from_group, init_device_mesh  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from tests.conftest import fake_world  # noqa: E402

NAMES = ("a", "b", "c")


def _group_ranks(mesh, dim):
    return dist.get_process_group_ranks(mesh.get_group(dim))


def _factor(n: int, draw) -> tuple[int, ...]:
    """A random shape (1-3 dims) whose sizes multiply to ``n``."""
    dims = []
    rest = n
    for _ in range(draw(st.integers(0, 2))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    dims.append(rest)
    return tuple(dims)


@st.composite
def partial_recipes(draw):
    world = draw(st.integers(2, 40))
    numel = draw(st.integers(1, world))
    shape = _factor(numel, draw)
    kind = draw(st.sampled_from(["default", "range", "strided", "layout", "subset"]))
    if kind == "default":
        ranks = None
    elif kind == "range":
        start = draw(st.integers(0, world - numel))
        ranks = range(start, start + numel)
    elif kind == "strided":
        step = draw(st.integers(1, max(1, (world - 1) // max(1, numel - 1)) if numel > 1 else 3))
        start = draw(st.integers(0, world - 1 - step * (numel - 1)))
        ranks = range(start, start + step * numel, step)
    elif kind == "layout":
        # one copy of a random unflatten of a bigger world, listed in a random dim order
        sizes = _factor(world, draw)

        def spans(sizes):
            return [
                (i, j)
                for i in range(len(sizes))
                for j in range(i + 1, len(sizes) + 1)
                if math.prod(sizes[i:j]) == numel
            ]

        if not spans(sizes):
            sizes = (world // math.gcd(world, numel), math.gcd(world, numel))
            numel = sizes[1]
            shape = _factor(numel, draw)
        layout = MeshLayout.world(world).unflatten(0, sizes, NAMES[: len(sizes)])
        i, j = draw(st.sampled_from(spans(sizes)))
        sub = layout[NAMES[i:j]]
        copy = draw(st.integers(0, sub.num_copies - 1))
        ranks = [int(r) for r in sub.groups()[copy].reshape(-1)]
    else:
        ranks = sorted(draw(st.permutations(range(world)))[:numel])
        if draw(st.booleans()):
            ranks = list(reversed(ranks))
    rank = draw(st.integers(0, world - 1))
    return world, shape, ranks, rank


def _ranks_list(ranks, numel):
    return list(range(numel)) if ranks is None else list(ranks)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partial_recipes(), st.data())
def test_partial_meshes_equal_torchs(recipe, data):
    world, shape, ranks, rank = recipe
    numel = math.prod(shape)
    names = NAMES[: len(shape)]
    listed = _ranks_list(ranks, numel)
    member = rank in listed
    with fake_world(world, rank):
        theirs = DeviceMesh("cpu", torch.tensor(listed, dtype=torch.int).reshape(shape), mesh_dim_names=names)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an arbitrary subset: torch's own, warned
            ours = init_device_mesh("cpu", shape, mesh_dim_names=names, ranks=ranks)
        assert ours.mesh.tolist() == theirs.mesh.tolist()
        assert ours.get_coordinate() == theirs.get_coordinate()
        assert ours._layout == theirs._layout
        assert ours._rank_map.tolist() == theirs._rank_map.tolist()
        assert ours == theirs and hash(ours) == hash(theirs)
        assert (len(ours._dim_group_names) > 0) == member == (len(theirs._dim_group_names) > 0)
        if member:
            for d in range(len(shape)):
                assert _group_ranks(ours, d) == _group_ranks(theirs, d)
        if type(ours) is not FastDeviceMesh:
            return
        # a slice: torch answers on members; rankmesh answers on every rank
        i = data.draw(st.integers(0, len(names) - 1))
        j = data.draw(st.integers(i + 1, len(names)))
        key = names[i:j]
        mine = ours[key]
        if member:
            ref = theirs[key]
            assert mine.mesh.tolist() == ref.mesh.tolist()
            assert mine.get_coordinate() == ref.get_coordinate()
            for d in range(len(key)):
                assert _group_ranks(mine, d) == _group_ranks(ref, d)
            flat = mine._flatten("f")
            assert flat.mesh.tolist() == sorted(flat.mesh.tolist()) or flat.mesh.numel() >= 1
            assert _group_ranks(flat, 0) == sorted(ref.mesh.reshape(-1).tolist())
        else:
            assert mine.get_coordinate() is None and mine._dim_group_names == []
            if mine._rm_layout.num_copies > 1:
                with pytest.raises(RuntimeError, match="contain the local rank"):
                    mine.mesh  # noqa: B018
                with pytest.raises(RuntimeError, match="contain the local rank"):
                    theirs[key]
            flat = mine._flatten("f")
            assert flat.get_coordinate() is None and flat._dim_group_names == []
            with pytest.raises(IndexError):
                mine.get_local_rank(0)  # torch's answer for a rank with no group


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partial_recipes())
def test_non_members_keep_torchs_group_names_in_step(recipe):
    """A plain member-only group made after a partial mesh (and its slices and flattens) has the
    same name on a member and on a non-member: both drew the same number of names."""
    world, shape, ranks, _ = recipe
    numel = math.prod(shape)
    listed = _ranks_list(ranks, numel)
    if len(set(listed)) == world:
        return
    outsider = next(r for r in range(world) if r not in listed)
    names_seen = []
    for rank in (listed[0], outsider):
        with fake_world(world, rank):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                m = init_device_mesh("cpu", shape, mesh_dim_names=NAMES[: len(shape)], ranks=ranks)
            if type(m) is not FastDeviceMesh:
                # torch's own mesh over an arbitrary subset: torch 2.13 itself salts later names with
                # a count non-members do not advance (docs/known_gaps.md); not rankmesh's steps
                return
            m[NAMES[0]]._flatten("f0")
            if len(shape) > 1:
                m._flatten("all")
            later = dist.new_group(list(range(world)), use_local_synchronization=True)
            names_seen.append(later.group_name)
    assert names_seen[0] == names_seen[1]


@st.composite
def group_recipes(draw):
    world = draw(st.integers(2, 48))
    sizes = _factor(world, draw)
    names = NAMES[: len(sizes)]
    k = draw(st.integers(1, len(sizes)))
    dims = sorted(draw(st.permutations(range(len(sizes))))[:k])
    rank = draw(st.integers(0, world - 1))
    return world, sizes, names, dims, rank


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group_recipes())
def test_from_group_equals_torchs_from_group(recipe):
    world, sizes, names, dims, rank = recipe
    layout = MeshLayout.world(world).unflatten(0, sizes, names)
    with fake_world(world, rank):
        groups = []
        for d in dims:
            members = layout.group(rank, d).tolist()
            groups.append(
                dist.new_group(members, use_local_synchronization=True) if len(members) < world else dist.group.WORLD
            )
        key = tuple(names[d] for d in dims)
        full = torch.from_numpy(layout[key].mesh_of(rank))
        theirs = DeviceMesh.from_group(groups, "cpu", mesh=full, mesh_dim_names=key)
        ours = from_group(groups, "cpu", mesh_dim_names=key)
        assert type(ours) is FastDeviceMesh
        assert ours.mesh.tolist() == theirs.mesh.tolist()
        assert ours.get_coordinate() == theirs.get_coordinate()
        assert ours._layout == theirs._layout and ours._rank_map.tolist() == theirs._rank_map.tolist()
        assert ours == theirs and hash(ours) == hash(theirs)
        for i, n in enumerate(key):
            assert ours.get_group(n) is groups[i]
            assert ours.get_local_rank(n) == theirs.get_local_rank(n)
            assert ours[n].mesh.tolist() == theirs[n].mesh.tolist()
        if len(key) == 1:
            one = from_group(groups[0], "cpu", mesh_dim_names=key)
            assert one == DeviceMesh.from_group(groups[0], "cpu", mesh_dim_names=key)


def test_bad_input_is_typed():
    with fake_world(8, 2):
        with pytest.raises(SizeMismatchError) as e:
            init_device_mesh("cpu", (4, 4))
        assert e.value.field == "mesh_shape"
        with pytest.raises(RankOutOfRangeError) as e:
            init_device_mesh("cpu", (2, 2), ranks=range(6, 10))
        assert e.value.field == "ranks[3]" and e.value.value == 9
        with pytest.raises(SizeMismatchError) as e:
            init_device_mesh("cpu", (2, 2), ranks=range(0, 3))
        assert e.value.field == "ranks"
        with pytest.raises(InvalidRankMapError) as e:
            init_device_mesh("cpu", (2, 2), ranks=[0, 1, 1, 2])
        assert e.value.field == "ranks" and e.value.value == 1
        with pytest.raises(RankOutOfRangeError) as e:
            init_device_mesh("cpu", (2,), ranks=[0, -1])
        assert e.value.field == "ranks[1]"
        with pytest.raises(MeshArgumentError) as e:
            init_device_mesh("cpu", (2, 2), ranks=range(4), rank_map=list(range(8)))
        assert e.value.field == "rank_map"
        tp = dist.new_group([2, 3], use_local_synchronization=True)
        with pytest.raises(MeshArgumentError) as e:  # the same dim twice: the groups overlap
            from_group([tp, tp], "cpu", mesh_dim_names=("x", "y"))
        assert e.value.field == "group"
        with pytest.raises(MeshArgumentError) as e:
            from_group([tp, tp], "cpu")
        assert e.value.field == "mesh_dim_names"
        with pytest.raises(DistributedStateError) as e:
            from_group([dist.GroupMember.NON_GROUP_MEMBER], "cpu", mesh_dim_names=("x",))
        assert e.value.field == "group[0]"
        odd = dist.new_group([0, 2, 3], use_local_synchronization=True)  # no (size, stride) layout
        with pytest.raises(MeshArgumentError, match="pass mesh="):
            from_group([odd, tp], "cpu", mesh_dim_names=("x", "y"))
        with pytest.warns(RuntimeWarning, match="not an offset plus"):
            one = from_group(odd, "cpu", mesh_dim_names=("x",))
        assert type(one) is DeviceMesh and one.mesh.tolist() == [0, 2, 3]


def test_from_group_on_a_rank_outside_the_group_says_so():
    """On a non-member, new_group returns torch's sentinel (an int): the error says that this rank is
    not in the group, not that an int is no sequence of process groups."""
    with fake_world(8, 0):
        outside = dist.new_group([1, 2])
        assert outside is dist.GroupMember.NON_GROUP_MEMBER
        with pytest.raises(DistributedStateError) as e:
            from_group(outside, "cpu", mesh_dim_names=("x",))
        assert (e.value.field, e.value.value) == ("group", outside)
        assert "this rank (0) is not a member of that group" in str(e.value)
        assert "call from_group only on the group's member ranks" in str(e.value)


def test_get_group_on_a_rank_outside_a_partial_mesh_says_the_rank_is_not_in_it():
    """Where torch's get_group fails with a bare ``IndexError: list index out of range`` (a
    non-member holds no group names), rankmesh's says which rank asked and which ranks the mesh is
    over, in an ``IndexError`` still; torch's checks of the dim come first."""
    import pickle

    world, half = 32, 16
    with fake_world(world, 3):
        teachers = init_device_mesh("cpu", (half // 8, 8), mesh_dim_names=("dp", "tp"), ranks=range(half, world))
        assert teachers.get_coordinate() is None
        asks = {
            "by name": lambda: teachers.get_group("tp"),
            "by index": lambda: teachers.get_group(1),
            "on a slice": lambda: teachers["tp"].get_group(),
            "on a slice, by name": lambda: teachers["dp"].get_group("dp"),
            "a flattened dim": lambda: teachers._flatten("dp_tp").get_group(),
            "a flattened dim, from the root": lambda: teachers.get_group("dp_tp"),
            "the local rank": lambda: teachers.get_local_rank("tp"),
            "every group": lambda: teachers.get_all_groups(),
        }
        for what, ask in asks.items():
            with pytest.raises(IndexError) as e:
                ask()
            err = e.value
            assert type(err) is RankOutOfRangeError, what
            assert (err.field, err.value, err.kind) == ("rank", 3, "rank_not_in_mesh"), what
            assert err.ctx == {"rank": 3, "placement": (16, [(16, 1)])}
            assert str(err).startswith("rank 3 is not in this mesh (ranks range(16, 32) of the job's 32)"), str(err)
            assert "mesh.get_coordinate() is None" in str(err) and "get_coordinate() is None" in err.fix_text()
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is RankOutOfRangeError and str(back) == str(err) and back.ctx == err.ctx
        with pytest.raises(KeyError, match="does not exist"):  # a bad dim is torch's error, as on a member
            teachers.get_group("pp")
        with pytest.raises(RuntimeError, match="mesh_dim"):
            teachers.get_group()
        strided = init_device_mesh("cpu", (2, 8), mesh_dim_names=("dp", "tp"), ranks=range(0, world, 2))
        with pytest.raises(RankOutOfRangeError, match=r"^rank 3 is not in this mesh \(ranks range\(0, 31, 2\)") as e:
            strided.get_group("tp")
        assert e.value.ctx["placement"] == (0, [(16, 2)])
        # ranks 4-7 and 20-23: no range, so the Slice they are
        spread = init_device_mesh("cpu", (8,), mesh_dim_names=("x",), ranks=[4, 5, 6, 7, 20, 21, 22, 23])
        with pytest.raises(RankOutOfRangeError, match=r"ranks Slice\(4, \[\(2, 16\), \(4, 1\)\]\) of the job"):
            spread.get_group()


@pytest.mark.parametrize("rank", [16, 21, 31])
def test_a_member_of_a_partial_mesh_still_gets_torchs_groups(rank):
    world, half = 32, 16
    with fake_world(world, rank):
        teachers = init_device_mesh("cpu", (half // 8, 8), mesh_dim_names=("dp", "tp"), ranks=range(half, world))
        theirs = DeviceMesh("cpu", torch.arange(half, world).reshape(2, 8), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp", 0, 1):
            assert _group_ranks(teachers, dim) == _group_ranks(theirs, dim)
            assert teachers.get_local_rank(dim) == theirs.get_local_rank(dim)
        assert _group_ranks(teachers["tp"], None) == _group_ranks(theirs["tp"], None)
        assert [dist.get_process_group_ranks(g) for g in teachers.get_all_groups()] == [
            dist.get_process_group_ranks(g) for g in theirs.get_all_groups()
        ]
        assert teachers["tp"].get_group() is teachers.get_group("tp")
        with pytest.raises(IndexError) as e:  # a dim out of range: torch's own bare IndexError
            teachers.get_group(2)
        assert type(e.value) is IndexError


def test_an_arbitrary_subset_is_torchs_own_mesh_with_a_warning():

    _once.forget("mesh")
    with fake_world(8, 3):
        with pytest.warns(RuntimeWarning, match="not an offset plus"):
            m = init_device_mesh("cpu", (3,), mesh_dim_names=("x",), ranks=[0, 3, 4])
        assert type(m) is DeviceMesh and m.get_coordinate() == (1,)


@pytest.mark.parametrize("rank", [0, 5, (1 << 19) + 7, (1 << 20) - 1])
def test_workloads_at_2_20_build_nothing_world_sized(rank):
    """KD (students and teachers on the two halves), an RL split (actor on [0, A), rollout tp groups
    on [A, W)), one EP mesh per pipeline stage, and a mesh from existing groups, at 2^20 ranks, on a
    member and a non-member: no world-sized rank map, tuple or Python hash is made."""
    world = 1 << 20
    half = world // 2
    before = dict(RANK_MAP_MATERIALISATIONS)
    with fake_world(world, rank):
        students = init_device_mesh("cpu", (half // 8, 8), mesh_dim_names=("dp", "tp"))
        teachers = init_device_mesh("cpu", (half // 8, 8), mesh_dim_names=("dp", "tp"), ranks=range(half, world))
        for m in (students, teachers):
            m["dp"], m["tp"], m._flatten("dp_tp")
            hash(m), m == students
        actor = init_device_mesh("cpu", (world // 4 // 8, 8), mesh_dim_names=("fsdp", "tp"), ranks=range(world // 4))
        rollout = init_device_mesh(
            "cpu", (world // 4 * 3 // 8, 8), mesh_dim_names=("replica", "tp"), ranks=range(world // 4, world)
        )
        actor["tp"], rollout["tp"]
        pp = 4
        stages = [
            init_device_mesh("cpu", (world // pp // 8, 8), mesh_dim_names=("edp", "ep"), ranks=range(s, world, pp))
            for s in range(pp)
        ]
        mine = [m for m in stages if m.get_coordinate() is not None]
        assert len(mine) == 1
        assert mine[0]["ep"].mesh.tolist() == [rank % pp + pp * (rank // (pp * 8) * 8 + k) for k in range(8)]
        member = teachers if rank >= half else students
        outside = students if rank >= half else teachers
        with pytest.raises(RankOutOfRangeError, match=f"^rank {rank} is not in this mesh"):
            outside["tp"].get_group()
        g = from_group([member.get_group("dp"), member.get_group("tp")], "cpu", mesh_dim_names=("dp", "tp"))
        assert g.get_coordinate() == member.get_coordinate() and g["tp"].mesh.tolist() == member["tp"].mesh.tolist()
    assert RANK_MAP_MATERIALISATIONS == before


def test_placed_layouts_pickle_and_compare():
    import pickle

    a = MeshLayout.placed(32, 8, [(8, 1)]).unflatten(0, (2, 4), ("dp", "tp"))
    assert pickle.loads(pickle.dumps(a)) == a
    assert a.global_size == 32 and a.world_size == 8 and a.placement == (8, [(8, 1)])
    assert a != MeshLayout.placed(32, 16, [(8, 1)]).unflatten(0, (2, 4), ("dp", "tp"))
    assert MeshLayout.placed(8, 0, [(8, 1)]) == MeshLayout.world(8)
    assert np.array_equal(a.rank_map(), np.arange(8, 16))
    with fake_world(32, 9):
        m = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), ranks=range(8, 16))
        back = pickle.loads(pickle.dumps(m))
        assert back == m and back.get_coordinate() == (0, 1) and back["tp"].mesh.tolist() == [8, 9, 10, 11]


def test_from_group_of_rankmeshs_own_groups_reads_no_ranks(monkeypatch):
    """Groups rankmesh made from a layout carry it (rankmesh.process_groups.group_slice): from_group
    over them is O(1) per dim, even for a dp group of 2^17 ranks."""
    world = 1 << 20
    with fake_world(world, 77):
        m = init_device_mesh("cpu", (world // 8, 8), mesh_dim_names=("dp", "tp"))

        def no_read(group=None):
            raise AssertionError("from_group read a group's ranks")

        monkeypatch.setattr(dist, "get_process_group_ranks", no_read)
        g = from_group([m.get_group("dp"), m.get_group("tp")], "cpu", mesh_dim_names=("dp", "tp"))
        assert g == m and g.get_coordinate() == m.get_coordinate() == (9, 5)
        assert g["tp"].mesh.tolist() == list(range(72, 80))
