"""rankmesh's rank tables (``_fast_groups.RankTable``): torch's ``_world.pg_group_ranks`` entry for a
group of 64 members or more, filled on first use. The oracle is the plain dict torch builds,
``dict(zip(members, range(n)))``: every dict operation, before and after filling, answers the
same, and torch's own readers of the table (``get_group_rank``, ``get_global_rank``,
``get_process_group_ranks``, ``get_rank(group)``, ``pg_config_info``, ``destroy_process_group``)
answer the same on a group rankmesh made as on torch's own."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rankmesh import _fast_groups as fg  # noqa: E402
from rankmesh._fast_groups import RankTable  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

from tests.conftest import fake_world  # noqa: E402

MEMBERS = st.sets(st.integers(0, 1 << 20), min_size=1, max_size=90).map(sorted)
# Keys a caller may ask: members, non-members, and what a dict finds by equal hash.
PROBES = st.one_of(
    st.integers(-3, (1 << 20) + 3),
    st.sampled_from([True, False, 2.0, 1 << 40, -(1 << 70), "3", None, (1,)]),
)


def _read(t, members, probes):
    out = []
    for k in probes:
        for op in (lambda: t[k], lambda: k in t, lambda: t.get(k), lambda: t.get(k, "x")):
            try:
                out.append(op())
            except (KeyError, TypeError) as e:
                out.append((type(e), e.args))
    out.append(len(t))
    out.append(bool(t))
    return out


@settings(max_examples=150, deadline=None)
@given(MEMBERS, st.lists(PROBES, max_size=12))
def test_lookups_answer_as_torchs_dict_before_filling(members, probes):
    want = dict(zip(members, range(len(members))))
    t = RankTable(tuple(members))
    assert _read(t, members, probes) == _read(want, members, probes)
    assert t._members is not None or any(type(k) is not int for k in probes)  # int keys do not fill it
    numpy_keys = [np.int64(k) for k in probes if type(k) is int and -(1 << 63) <= k < 1 << 63] + [np.int32(members[0])]
    assert _read(t, members, numpy_keys) == _read(want, members, numpy_keys)  # other keys fill it first
    assert t._members is None and t == want


@settings(max_examples=100, deadline=None)
@given(MEMBERS, st.sampled_from(range(14)), st.integers(0, 1 << 20))
def test_every_other_operation_fills_it_and_then_it_is_torchs_dict(members, which, key):
    want = dict(zip(members, range(len(members))))
    t = RankTable(tuple(members))
    ops = [
        lambda d: list(d),
        lambda d: list(reversed(d)),
        lambda d: list(d.keys()),
        lambda d: list(d.values()),
        lambda d: list(d.items()),
        lambda d: (d == want, want == d, d != want, d == {}, {} != d),
        lambda d: repr(d),
        lambda d: dict(d) | {key: -1},
        lambda d: {**d, key: -2},
        lambda d: (d.copy(), type(d.copy())),
        lambda d: pickle.loads(pickle.dumps(d)),
        lambda d: (copy.copy(d), copy.deepcopy(d)),
        lambda d: (list(d.keys()), json.dumps(d)),  # json's C encoder reads storage: see below
        lambda d: sorted(d.items(), key=lambda kv: -kv[1]),
    ]
    got, expected = ops[which](t), ops[which](want)
    if which == 9:  # dict.copy of a dict subclass is a plain dict
        assert got == (want, dict) and expected == (want, dict)
    else:
        assert got == expected
    assert t == want and list(t.items()) == list(want.items()) and len(t) == len(want)


@settings(max_examples=60, deadline=None)
@given(MEMBERS, st.integers(0, 1 << 20), st.sampled_from(range(8)))
def test_changes_apply_to_the_filled_table(members, key, which):
    want = dict(zip(members, range(len(members))))
    t = RankTable(tuple(members))
    changes = [
        lambda d: d.__setitem__(key, -1),
        lambda d: d.pop(key, None),
        lambda d: d.setdefault(key, 7),
        lambda d: d.update({key: 9}),
        lambda d: d.popitem(),
        lambda d: d.clear(),
        lambda d: d.__ior__({key: 3}),
        lambda d: d.__delitem__(members[0]),
    ]
    changes[which](want)
    changes[which](t)
    assert t == want and len(t) == len(want) and (key in t) == (key in want)
    assert [t.get(k) for k in members] == [want.get(k) for k in members]


def test_the_known_limit_c_code_reading_a_dicts_storage_sees_an_unfilled_table_empty():
    """What the class docstring and docs/known_gaps.md say: json's C encoder asks the dict's storage
    for its size, so it writes an unfilled table as ``{}``; through the dict protocol (all of torch's
    readers) it is whole, and once filled it is whole everywhere. If this starts to fail, CPython
    reads subclasses through the protocol and the limit is gone."""
    t = RankTable((4, 12, 20))
    assert json.dumps(t) == "{}"
    assert t.items() and json.dumps(t) == '{"4": 0, "12": 1, "20": 2}'


def test_fromkeys_and_an_empty_table_are_plain():
    assert RankTable.fromkeys([3, 1], 0) == {3: 0, 1: 0} and len(RankTable()) == 0 and not RankTable()


@pytest.mark.parametrize("world, rank", [(1 << 12, 77), (1 << 17, (1 << 16) + 3)])
def test_torchs_readers_answer_the_same_on_rankmeshs_groups(world, rank, monkeypatch):
    """Groups of one mesh build (64 to W/8 members), made by rankmesh (RankTable) and by torch's own
    ``new_group`` with the same members (a plain dict): torch's functions that read the table give
    the same answers, and only the ones that list every member fill it."""
    from rankmesh.mesh import init_device_mesh

    with fake_world(world, rank):
        mesh = init_device_mesh("cpu", (2, world // 128, 64), mesh_dim_names=("r", "s", "t"))
        flat = mesh["r", "s"]._flatten("rs")
        ours = [mesh.get_group("s"), mesh.get_group("t"), flat.get_group()]
        w = c10d._world
        tables = [w.pg_group_ranks[pg] for pg in ours]
        assert [type(t) for t in tables] == [RankTable if len(t) >= 64 else dict for t in tables]
        ours = [pg for pg, t in zip(ours, tables) if type(t) is RankTable]
        theirs = [dist.new_group(list(t._members), use_local_synchronization=True) for t in tables if len(t) >= 64]
        for a, b in zip(ours, theirs):
            members = sorted(w.pg_group_ranks[b])
            for g in (rank, members[0], members[-1], members[len(members) // 2]):
                assert dist.get_group_rank(a, g) == dist.get_group_rank(b, g)
            with pytest.raises(ValueError) as ea:
                dist.get_group_rank(a, members[-1] + 1 if members[-1] + 1 < world else -1)
            with pytest.raises(ValueError) as eb:
                dist.get_group_rank(b, members[-1] + 1 if members[-1] + 1 < world else -1)
            assert str(ea.value).replace(str(a), "<group>") == str(eb.value).replace(str(b), "<group>")
            assert dist.get_rank(a) == dist.get_rank(b)
            assert w.pg_group_ranks[a]._members is not None  # lookups did not fill it
            assert dist.get_global_rank(a, 3) == dist.get_global_rank(b, 3)
            assert dist.get_process_group_ranks(a) == dist.get_process_group_ranks(b)
        configs = {c["pg_name"]: c for c in w.pg_config_info}
        for a, b in zip(ours, theirs):
            ca, cb = configs[w.pg_names[a]], configs[w.pg_names[b]]
            assert (ca["ranks"], ca["group_size"]) == (cb["ranks"], cb["group_size"])
        dist.destroy_process_group(ours[0])
        assert ours[0] not in w.pg_group_ranks


def test_rankmesh_disable_rank_tables_gives_torchs_plain_dicts(disable, monkeypatch):
    from rankmesh.mesh import init_device_mesh

    disable("rank_tables")
    with fake_world(1 << 12, 5):
        mesh = init_device_mesh("cpu", (64, 64), mesh_dim_names=("a", "b"))
        for name in ("a", "b"):
            table = c10d._world.pg_group_ranks[mesh.get_group(name)]
            assert type(table) is dict and table == dict(zip(mesh[name].mesh.tolist(), range(64)))
    assert fg.RANK_TABLES == "rank_tables"
