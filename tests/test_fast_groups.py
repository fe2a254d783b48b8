"""rankmesh's member-only process groups (rankmesh._fast_groups) against torch's own ``new_group``.

rankmesh makes the caller's group through torch's ``_new_process_group_helper`` with the name,
ranks and rank table computed by rankmesh (issue 17). Torch is the oracle:

- random member sets, ranks, backends, timeouts and descriptions: the name torch would draw,
  every registry entry (backend, store-less fields, group-rank table, backend config, tag, the
  tag index, description, size, rank) and the counter step equal torch's own call's;
- a whole mesh build, then a plain ``new_group`` of every rank, gives the same group names on
  every rank, and the same as with torch's own calls (simulated ranks of a 2^17 world);
- anything but the plain case (TORCH_DIST_INIT_BARRIER, a bound device, an unknown naming
  scheme) takes torch's own call, and a failed start-up check warns once and falls back.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import warnings

import numpy as np
import pytest
from rankmesh import _dependencies, _once

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rankmesh import _fast_groups as fg  # noqa: E402
from rankmesh import _fast_groups_check as fgc  # noqa: E402
from rankmesh._native import hashed_group_name  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

from tests.conftest import FAKE, MESHFAKE, SPLITFAKE, fake_group_splits, fake_world, plant_body  # noqa: E402


def _entries(pg):
    return fgc._entries(pg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 12).flatmap(
        lambda log: st.tuples(
            st.just(1 << log),
            st.integers(0, (1 << log) - 1),
            st.sets(st.integers(0, (1 << log) - 1), max_size=150),  # from 64 members: a RankTable
        )
    ),
    st.sampled_from([None, FAKE, MESHFAKE]),
    st.sampled_from([None, datetime.timedelta(seconds=7), datetime.timedelta(minutes=3)]),
    st.sampled_from([None, "mesh_tp", "rankmesh x"]),
    st.integers(0, 3),
)
def test_registry_entries_equal_torchs_new_group(world_rank_members, backend, timeout, desc, warmup):
    world, rank, others = world_rank_members
    members = np.asarray(sorted(others | {rank}), dtype=np.int32)
    with fake_world(world, rank, MESHFAKE):
        for _ in range(warmup):  # move the counters first
            dist.new_group([rank], use_local_synchronization=True)
        assert fg.self_check()
        extra = {} if timeout is None else {"timeout": timeout}
        w = c10d._world
        want = hashed_group_name(members, fgc.salt())
        count = w.group_count
        theirs = dist.new_group(
            members.tolist(), backend=backend, use_local_synchronization=True, group_desc=desc, **extra
        )
        torch_step = w.group_count - count
        assert w.pg_names[theirs] == want
        count = w.group_count
        ours = fg.new_member_group(members, backend=backend, timeout=timeout, group_desc=desc)
        assert w.group_count - count == torch_step
        assert _entries(ours) == _entries(theirs)
        lazy = len(members) >= fg.LAZY_TABLE_MIN
        assert type(w.pg_group_ranks[ours]) is (fg.RankTable if lazy else dict)
        if lazy:  # its members kept as a tuple of ints the cycle collector does not walk
            kept = w.pg_group_ranks[ours]._members
            assert type(kept) is tuple and kept == tuple(members.tolist()) and not gc.is_tracked(kept)
        assert ours is not theirs and w.pg_names[ours] != w.pg_names[theirs]
        assert dist.get_process_group_ranks(ours) == members.tolist()
        assert dist.get_group_rank(ours, rank) == members.tolist().index(rank)
        assert dist.get_global_rank(ours, 0) == int(members[0])
        assert ours._get_backend_name() == theirs._get_backend_name()
        dist.destroy_process_group(ours)
        assert ours not in w.pg_names and ours not in w.pg_group_ranks


def _names_after_build(world: int, rank: int) -> list[str]:
    """A torchtitan-style build on this rank, then a plain new_group of all ranks: the group
    names in creation order."""
    from rankmesh import ParallelDims

    with fake_world(world, rank):
        pd = ParallelDims(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1, world_size=world)
        pd.build_mesh(device_type="cpu")
        later = dist.new_group(list(range(world)))
        w = c10d._world
        return [w.pg_names[pg] for pg in w.pg_names] + [later.group_name, str(w.group_count)]


@pytest.mark.parametrize("world", [1 << 10, 1 << 17])
def test_names_and_counters_agree_on_every_rank_and_with_torchs_own_calls(world, monkeypatch):
    ranks = [0, 5, world // 2 + 3, world - 1]
    fast = {r: _names_after_build(world, r) for r in ranks}
    later = {r: names[-2:] for r, names in fast.items()}
    assert len(set(map(tuple, later.values()))) == 1, later  # the later plain group meets everywhere
    monkeypatch.setattr(fg, "uses_fast_path", lambda backend: False)  # torch's own new_group
    stock = {r: _names_after_build(world, r) for r in ranks}
    assert fast == stock


def test_barrier_after_init_bound_devices_and_python_groups_take_torchs_call(monkeypatch):
    with fake_world(8, 3):
        assert fg.uses_fast_path(None)
        monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "1")
        assert not fg.uses_fast_path(None)
        monkeypatch.delenv("TORCH_DIST_INIT_BARRIER")
        import torch

        default = c10d._get_default_group()
        default.bound_device_id = torch.device("cuda", 0)
        try:
            assert not fg.uses_fast_path(None)
        finally:
            default.bound_device_id = None
        assert fg.uses_fast_path(FAKE)


def test_a_failed_check_warns_once_and_falls_back_to_torch(monkeypatch):
    monkeypatch.setattr(fgc, "SCHEME", None)
    monkeypatch.setattr(fgc, "_state", {})
    monkeypatch.setattr(_once, "_seen", set())
    calls = []
    real = dist.new_group
    monkeypatch.setattr(dist, "new_group", lambda *a, **k: calls.append(a) or real(*a, **k))
    with fake_world(8, 3):
        with pytest.warns(RuntimeWarning, match="salt rankmesh does not know"):
            pg = fg.new_member_group(np.asarray([1, 3], dtype=np.int32))
        assert calls == [([1, 3],)] and dist.get_process_group_ranks(pg) == [1, 3]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fg.new_member_group(np.asarray([3], dtype=np.int32))  # no second warning


def test_this_torchs_bodies_are_the_ones_rankmesh_reproduces():
    """The allow-list holds this torch's release and body hashes (CI runs 2.13 and 2.15)."""
    assert fgc.GATES["new_group"].recognise() is None
    assert (fgc.GATES["split_group"].recognise() is None) == (fgc.SPLIT_SHAPE is not None)


@pytest.mark.parametrize("how", ["body", "release"])
def test_an_unknown_body_or_release_warns_once_and_falls_back_to_torch(monkeypatch, how):
    if how == "body":
        plant_body(monkeypatch, "torch", "torch.distributed.distributed_c10d._new_group_with_tag")
        match = r"_new_group_with_tag has a body rankmesh does not know \(hash [0-9a-f]{16}\)"
    else:
        monkeypatch.setitem(_dependencies._versions, "torch", "9.99.0")
        match = r"torch 9\.99\.0 is not a version rankmesh's new_group path has read \(supported: 2\.13, 2\.14, 2\.15\)"
    monkeypatch.setattr(fgc, "_state", {})
    monkeypatch.setattr(_once, "_seen", set())
    monkeypatch.setattr(fg, "_create", lambda *a, **k: pytest.fail("rankmesh made a group despite the gate"))
    with fake_world(8, 3):
        with pytest.warns(RuntimeWarning, match=match):
            pg = fg.new_member_group(np.asarray([1, 3], dtype=np.int32))
        assert dist.get_process_group_ranks(pg) == [1, 3]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fg.new_member_group(np.asarray([3], dtype=np.int32))  # no second warning


def test_rankmesh_disable_fast_groups_keeps_every_group_torchs_own(disable, monkeypatch):
    disable("concatenate, fast_groups")
    monkeypatch.setattr(fg, "_create", lambda *a, **k: pytest.fail("rankmesh made a group while disabled"))
    with fake_world(8, 3):
        assert not fg.uses_fast_path(None) and not fg.uses_fast_split()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the user's choice: no warning
            pg = fg.new_member_group(np.asarray([1, 3], dtype=np.int32))
        assert dist.get_process_group_ranks(pg) == [1, 3]
        monkeypatch.undo()
        disable("concatenate")
        assert fg.uses_fast_path(None)


def test_a_table_only_torchs_call_writes_is_found(monkeypatch):
    """The probe diffs every table of the registry, not a list: a table a future torch adds and
    fills in new_group, which rankmesh's reproduction does not fill, fails the check."""
    monkeypatch.setattr(c10d, "_rankmesh_future_table", {}, raising=False)
    real = dist.new_group

    def new_group(*args, **kwargs):
        pg = real(*args, **kwargs)
        c10d._rankmesh_future_table[pg] = "torch wrote this"
        return pg

    monkeypatch.setattr(dist, "new_group", new_group)
    with fake_world(8, 3):
        count = c10d._world.group_count
        reason = fgc._probe_reason(FAKE, fg._create)
        assert reason is not None and "c10d._rankmesh_future_table" in reason, reason
        assert c10d._world.group_count == count  # the probe left no counter step behind


def test_the_registry_diff_sees_writes_and_normalises_the_new_group():
    before = {"c10d.t": {"a": 1}, "c10d.lst": {"": ["x"]}, "c10d.n": 3}
    pg = object()
    after = {"c10d.t": {"a": 1, pg: "ptd:NAME"}, "c10d.lst": {"": ["x", pg]}, "c10d.n": 4}
    import unittest.mock as mock

    with mock.patch.object(fgc, "_registry", lambda: after), mock.patch.dict(c10d._world.pg_names, {pg: "NAME"}):
        writes = fgc._writes(before, pg)
    assert writes == {
        "c10d.t": [("'<group>'", "'ptd:<name>'")],
        "c10d.lst": [("''", "('<appended>', '<group>')")],
        "c10d.n": 1,
    }
    assert fgc._writes_differing(writes, {**writes, "c10d.n": 2}) == ["c10d.n"]
    other = object()  # a set table: only what the call added counts, not what was there
    before, after = {"c10d.s": {other}}, {"c10d.s": {other, pg}}
    with mock.patch.object(fgc, "_registry", lambda: after), mock.patch.dict(c10d._world.pg_names, {pg: "NAME"}):
        assert fgc._writes(before, pg) == {"c10d.s": ["'<group>'"]}


def test_native_group_name_equals_torchs_hash():
    with fake_world(64, 1):
        for ranks in ([1], [0, 1, 2], list(range(1, 64, 2))):
            assert hashed_group_name(np.asarray(ranks, dtype=np.int32), fgc.salt()) == c10d._hash_ranks_to_str(ranks)


# -- the split_group path ----------------------------------------------------------------------

needs_fast_split = pytest.mark.skipif(
    fgc.SPLIT_SHAPE is None,
    reason=f"torch {torch.__version__}'s split_group is not the one rankmesh reproduces (2.15's); "
    "its split path is torch's own call, and its fake backend cannot split",
)


@contextlib.contextmanager
def bound_fake_world(world: int, rank: int):
    """A fake world whose default group can split (``meshfakesplit``: cpu and cuda) and is bound
    to a device, as ``init_process_group(device_id=...)`` binds it: MeshBuilder's split path."""
    with fake_world(world, rank, SPLITFAKE) as default:
        default.bound_device_id = torch.device("cuda", 0)
        yield default


@needs_fast_split
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 17).flatmap(
        lambda log: st.tuples(
            st.just(1 << log),
            st.integers(0, (1 << log) - 1),
            st.sets(st.integers(0, (1 << log) - 1), max_size=150),  # from 64 members: a RankTable
        )
    ),
    st.sampled_from([None, datetime.timedelta(seconds=7), datetime.timedelta(minutes=3)]),
    st.sampled_from([None, "mesh_tp", "rankmesh x"]),
    st.integers(0, 3),
)
def test_registry_entries_equal_torchs_split_group(world_rank_members, timeout, desc, warmup):
    world, rank, others = world_rank_members
    members = np.asarray(sorted(others | {rank}), dtype=np.int32)
    with bound_fake_world(world, rank) as default:
        for _ in range(warmup):  # move the counters first
            dist.new_group([rank], use_local_synchronization=True)
        assert fg.uses_fast_split()
        extra = {} if timeout is None else {"timeout": timeout}
        w = c10d._world
        want = hashed_group_name(members, fgc.salt())
        count = w.group_count
        theirs = dist.split_group(split_ranks=[members.tolist()], group_desc=desc, **extra)
        torch_step = w.group_count - count
        assert w.pg_names[theirs] == want
        count = w.group_count
        ours = fg.split_member_group(members, timeout=timeout, group_desc=desc)
        assert w.group_count - count == torch_step
        a, b = _entries(ours), _entries(theirs)
        if desc is None:  # torch's default description counts the parent's splits: ours came next
            stem, n = b["desc"].rsplit(":", 1)
            assert b["desc"] == f"{default.group_desc}:split:{n}"
            b["desc"] = f"{stem}:{int(n) + 1}"
        assert a == b
        assert ours is not theirs and w.pg_names[ours] != w.pg_names[theirs]
        cpu = torch.device("cpu")
        assert ours._get_backend(cpu).options._timeout == theirs._get_backend(cpu).options._timeout
        assert dist.get_process_group_ranks(ours) == members.tolist()
        assert dist.get_group_rank(ours, rank) == members.tolist().index(rank)
        assert dist.get_global_rank(ours, 0) == int(members[0])
        assert c10d._resolve_process_group(ours.group_name) is ours
        dist.destroy_process_group(ours)
        assert ours not in w.pg_names and ours not in w.pg_group_ranks


def _names_after_split_build(world: int, rank: int) -> list[str]:
    """A torchtitan-style build on the split path on this rank, then a plain new_group of all
    ranks: the group names in creation order, and the counter."""
    from rankmesh import ParallelDims

    with bound_fake_world(world, rank):
        pd = ParallelDims(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1, world_size=world)
        pd.build_mesh(device_type="cpu")
        assert pd.build_report.method == "split_group"
        later = dist.new_group(list(range(world)))
        w = c10d._world
        return [w.pg_names[pg] for pg in w.pg_names] + [later.group_name, str(w.group_count)]


@needs_fast_split
@pytest.mark.parametrize("world", [1 << 10, 1 << 17])
def test_split_names_and_counters_agree_on_every_rank_and_with_torchs_own_calls(world, monkeypatch):
    ranks = [0, 5, world // 2 + 3, world - 1]
    calls = []
    real = fg._split
    monkeypatch.setattr(fg, "_split", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    fast = {r: _names_after_split_build(world, r) for r in ranks}
    assert calls, "rankmesh's split was not used"
    later = {r: names[-2:] for r, names in fast.items()}
    assert len(set(map(tuple, later.values()))) == 1, later  # the later plain group meets everywhere
    monkeypatch.setattr(fg, "uses_fast_split", lambda: False)  # torch's own split_group
    stock = {r: _names_after_split_build(world, r) for r in ranks}
    assert fast == stock


def test_a_failed_split_check_warns_once_and_falls_back_to_torch(monkeypatch):
    monkeypatch.setattr(fgc, "SPLIT_SHAPE", None)
    monkeypatch.setattr(fgc, "_split_state", {})
    monkeypatch.setattr(_once, "_seen", set())
    calls = []
    real = dist.split_group
    monkeypatch.setattr(dist, "split_group", lambda *a, **k: calls.append(k["split_ranks"]) or real(*a, **k))
    monkeypatch.setattr(fg, "_split", lambda *a, **k: pytest.fail("rankmesh split despite a failed check"))
    with bound_fake_world(8, 3):
        with pytest.warns(RuntimeWarning, match="split_group is not the one rankmesh reproduces"):
            assert not fg.uses_fast_split()
        if not fake_group_splits(c10d._get_default_group()):
            pytest.skip(f"the fake backend of torch {torch.__version__} cannot split")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning
            pg = fg.split_member_group(np.asarray([1, 3], dtype=np.int32))
            fg.split_member_group(np.asarray([3], dtype=np.int32))
        assert calls == [[[1, 3]], [[3]]] and dist.get_process_group_ranks(pg) == [1, 3]


class _OtherTag:
    """torch's distributed_c10d as rankmesh._fast_groups sees it, but registering under a tag
    torch's split_group would not give."""

    def __getattr__(self, name):
        return getattr(c10d, name)

    @staticmethod
    def _register_pg_in_world(*args, **kwargs):
        return c10d._register_pg_in_world(*args, **{**kwargs, "pg_tag": "other"})


@needs_fast_split
def test_a_split_probe_that_differs_from_torch_falls_back(monkeypatch, tmp_path):
    """The start-up probe compares every registry entry: a reproduction that registered the
    group differently (here: under another tag) is caught, warned about once, not
    used, and leaves no probe group or counter step behind."""
    from rankmesh import _verdicts

    # a process that has not probed yet (the stand-in module below is not part of the verdict's key)
    monkeypatch.setenv(_verdicts.ENV, str(tmp_path))
    _verdicts.forget()
    monkeypatch.setattr(fgc, "_split_state", {})
    monkeypatch.setattr(_once, "_seen", set())
    monkeypatch.setattr(fg, "c10d", _OtherTag())
    with bound_fake_world(8, 3) as default:
        count, groups = c10d._world.group_count, list(c10d._world.pg_names)
        differ = r"registry entries differ from torch's: \['tag'"
        with pytest.warns(RuntimeWarning, match=differ):
            assert not fg.uses_fast_split()
        assert (c10d._world.group_count, list(c10d._world.pg_names)) == (count, groups) == (count, [default])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pg = fg.split_member_group(np.asarray([2, 3], dtype=np.int32))  # torch's call, no second warning
        assert dist.get_process_group_ranks(pg) == [2, 3]
        assert c10d._world.pg_to_tag[pg] == f"ptd:{pg.group_name}"


def test_non_member_split_and_the_narrowed_table():
    """A rank in none of a partition's groups takes part with a one-rank split of another rank
    (torch's own call, the default group's rank table narrowed meanwhile and restored after)."""
    with bound_fake_world(16, 3) as default:
        if not fake_group_splits(default):
            pytest.skip(f"the fake backend of torch {torch.__version__} cannot split")
        table = c10d._world.pg_group_ranks[default]
        count = c10d._world.group_count
        drew = fg.split_non_member(4, group_desc="x")
        assert drew == (c10d._world.group_count != count)
        assert c10d._world.pg_group_ranks[default] is table and len(table) == 16


@needs_fast_split
def test_a_table_only_torchs_split_writes_is_found(monkeypatch):
    monkeypatch.setattr(c10d, "_rankmesh_future_split_table", set(), raising=False)
    real = dist.split_group

    def split_group(*args, **kwargs):
        pg = real(*args, **kwargs)
        c10d._rankmesh_future_split_table.add(pg)
        return pg

    monkeypatch.setattr(dist, "split_group", split_group)
    with bound_fake_world(8, 3):
        count = c10d._world.group_count
        reason = fgc._split_probe_reason(fg._split)
        assert reason is not None and "c10d._rankmesh_future_split_table" in reason, reason
        assert c10d._world.group_count == count


@needs_fast_split
def test_rankmesh_disable_fast_groups_leaves_the_split_rank_table_alone(disable, monkeypatch):
    """Disabled, rankmesh writes nothing of c10d's: not even the narrowed rank table torch's own
    split_group would otherwise be shown."""
    disable("fast_groups")
    seen = []
    real = dist.split_group

    def split_group(*args, **kwargs):
        seen.append(len(c10d._world.pg_group_ranks[c10d._get_default_group()]))
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "split_group", split_group)
    with bound_fake_world(8, 3):
        pg = fg.split_member_group(np.asarray([1, 3], dtype=np.int32))
        fg.split_non_member(5)
        assert seen == [8, 8] and dist.get_process_group_ranks(pg) == [1, 3]


def test_group_members_counts_every_member_of_this_ranks_groups_and_not_the_default_group():
    """What the benchmarks report as "members": rankmesh's groups and torch's own alike, RankTables
    (64+ members) by their length without filling them."""
    from rankmesh.mesh import init_device_mesh

    with fake_world(1 << 12, 70):
        assert fg.group_members() == 0
        init_device_mesh("cpu", (64, 64), mesh_dim_names=("dp", "tp"))  # dp 64 members, tp 64
        dist.new_group([3, 70, 99], use_local_synchronization=True)
        tables = [t for t in c10d._world.pg_group_ranks.values() if isinstance(t, fg.RankTable)]
        assert fg.group_members() == 64 + 64 + 3
        assert tables and all(t._members is not None for t in tables)  # counted, not filled
