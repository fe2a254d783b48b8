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

import datetime

import numpy as np
import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rankmesh import _fast_groups as fg  # noqa: E402
from rankmesh._native import hashed_group_name  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

from tests.conftest import FAKE, MESHFAKE, fake_world  # noqa: E402


def _entries(pg):
    return fg._entries(pg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 12).flatmap(
        lambda log: st.tuples(
            st.just(1 << log),
            st.integers(0, (1 << log) - 1),
            st.sets(st.integers(0, (1 << log) - 1), max_size=40),
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
        want = hashed_group_name(members, fg._salt())
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
    monkeypatch.setattr(fg, "SCHEME", None)
    monkeypatch.setattr(fg, "_state", {})
    monkeypatch.setattr(fg, "_warned", [])
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


def test_native_group_name_equals_torchs_hash():
    with fake_world(64, 1):
        for ranks in ([1], [0, 1, 2], list(range(1, 64, 2))):
            assert hashed_group_name(np.asarray(ranks, dtype=np.int32), fg._salt()) == c10d._hash_ranks_to_str(ranks)
