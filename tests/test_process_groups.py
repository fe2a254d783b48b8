"""MeshBuilder on the fake backend: one process group per distinct partition, the same creation
order (and so the same hashed group names) on every rank, fake groups for size-1 dims, the
default group for world-sized dims, the split_group strategy when the default group has a bound
device, DeviceMeshes equal to torch's own (rank maps included), the report, and
check_consistency (including its mismatch and timeout paths, simulated).
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rankmesh import MeshLayout, process_groups
from rankmesh.consistency import _from_i64, _to_i64, check_consistency
from rankmesh.errors import (
    ConfigMismatchError,
    ConsistencyTimeoutError,
    DistributedStateError,
    LayoutOverflowError,
    RankmeshError,
    UnknownNameError,
)
from rankmesh.mesh import FastDeviceMesh
from rankmesh.process_groups import BuildReport, MeshBuilder
from rankmesh.torchtitan.layouts import fake_dims as fake_dims_of
from rankmesh.torchtitan.parallel_dims import ParallelDims
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import fake_world


def partition(layout: MeshLayout, dim) -> frozenset:
    """The dim's partition of the world, from the O(W) enumeration (independent of modes)."""
    one = layout[layout.names[dim] if isinstance(dim, int) else dim]
    rows = one.groups().reshape(one.num_copies, -1)
    return frozenset(frozenset(r.tolist()) for r in rows)


def ranks_of(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


# -- partition_key ---------------------------------------------------------------------------


def _factors(n: int) -> int:
    """How many prime factors ``n`` has, with multiplicity."""
    count, p = 0, 2
    while n > 1:
        while n % p == 0:
            n, count = n // p, count + 1
        p += 1
    return count


def _scrambled(draw, modes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The same set of offsets (so the same partition) as other raw modes: every mode ``(a*b, t)``
    may split into ``(a, t*b), (b, t)``, and the modes are put out of stride order (reversed if
    the shuffle left them in order), which ``with_modes`` keeps as given."""
    out = []
    for s, t in modes:
        divisors = [b for b in range(2, s) if s % b == 0]
        if divisors and (len(modes) == 1 or draw(st.booleans())):  # one mode alone is always split
            b = draw(st.sampled_from(divisors))
            out += [(s // b, t * b), (b, t)]
        else:
            out.append((s, t))
    out = list(draw(st.permutations(out)))
    if out == sorted(out, key=lambda m: -m[1]):
        out.reverse()
    return out


@st.composite
def one_world_layouts(draw):
    """Layouts over one world that share partitions through different routes: the world
    unflattened (``sizes``), maybe a flatten of some of its dims (adjacent or not), the same
    world unflattened more coarsely (an adjacent run of sizes merged), and the first of those
    rebuilt with ``with_modes`` from scrambled, equivalent modes of one dim: a dim with other raw
    modes than the one it mirrors but the same partition, the case partition_key exists for."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 2, 3, 4, 6]), min_size=1, max_size=4))
    world = MeshLayout.world(math.prod(sizes))
    names = tuple(f"d{i}" for i in range(len(sizes)))
    fine = world.unflatten("world", sizes, names)
    out = [fine]
    if len(names) >= 2 and draw(st.booleans()):
        k = draw(st.integers(2, len(names)))
        pick = sorted(draw(st.permutations(range(len(names))))[:k])
        out.append(fine[tuple(names[i] for i in pick)].flatten("f"))
    if len(sizes) >= 2:
        i = draw(st.integers(0, len(sizes) - 2))
        j = draw(st.integers(i + 2, len(sizes)))
        coarse = sizes[:i] + [math.prod(sizes[i:j])] + sizes[j:]
        out.append(world.unflatten("world", coarse, tuple(f"c{n}" for n in range(len(coarse)))))
    # the dim with the most prime factors (a prime-sized dim of one mode has no other modes)
    src, d = max(((lay, n) for lay in out for n in range(lay.ndim)), key=lambda ld: _factors(ld[0].size(ld[1])))
    axes = [src.modes(n) for n in range(src.ndim)]
    axes[d] = _scrambled(draw, axes[d])
    out.append(world.with_modes(axes, [f"s{n}" for n in range(src.ndim)]))
    return out


PARTITION_KEY_EXAMPLES = 200
PARTITION_KEY_STATS: dict[str, int] = {}


@settings(
    max_examples=PARTITION_KEY_EXAMPLES,
    derandomize=True,  # the same examples every run, so the share of hits below is deterministic
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(one_world_layouts(), min_size=1, max_size=2))
def _partition_key_iff_same_partition(groups_of_layouts):
    by_world: dict[int, list[tuple[MeshLayout, int]]] = {}
    for ls in groups_of_layouts:
        for lay in ls:
            by_world.setdefault(lay.world_size, []).extend((lay, d) for d in range(lay.ndim))
    hit = False
    for dims in by_world.values():
        for (a, da), (b, db) in itertools.combinations(dims, 2):
            same_partition = partition(a, da) == partition(b, db)
            assert (a.partition_key(da) == b.partition_key(db)) == same_partition, (a, da, b, db)
            hit |= same_partition and a.modes(da) != b.modes(db)
    PARTITION_KEY_STATS["examples"] = PARTITION_KEY_STATS.get("examples", 0) + 1
    PARTITION_KEY_STATS["hits"] = PARTITION_KEY_STATS.get("hits", 0) + hit
    event("same partition, different modes" if hit else "no pair with the same partition and other modes")


def test_partition_key_iff_same_partition():
    """Equal keys exactly when the partitions are equal, over many pairs whose partitions are
    equal although their raw modes differ (at least 60% of the examples have one; 78% do)."""
    PARTITION_KEY_STATS.clear()
    _partition_key_iff_same_partition()
    n, hits = PARTITION_KEY_STATS["examples"], PARTITION_KEY_STATS["hits"]
    assert n >= PARTITION_KEY_EXAMPLES // 2, PARTITION_KEY_STATS
    assert hits >= 0.6 * n, f"only {hits} of {n} examples had two dims of one partition with different modes"


def test_partition_key_examples():
    mesh = MeshLayout.world(8).unflatten("world", (2, 2, 2), ("a", "b", "c"))
    assert mesh.flatten().partition_key(0) == [(8, 1)]  # the whole world
    assert mesh["a", "c"].flatten().partition_key(0) == [(2, 4), (2, 1)]  # {0, 1, 4, 5} + translates
    assert mesh.unflatten("b", (1, 2), ("one", "b2")).partition_key("one") == []  # size 1


# -- dedup, order, backends ------------------------------------------------------------------

CONFIG = dict(dp_replicate=2, dp_shard=2, cp=2, tp=2, pp=2, ep=4, etp=1)  # W = 32


def expected_groups(pd: ParallelDims) -> tuple[int, int, int]:
    """(real, fake, reused_default) from the O(W) partitions and dim names, independent of
    partition_key."""
    W = pd.world_size
    seen: set = set()
    real = fake = default = 0
    for name, layout in pd.layouts.items():
        sizes = dict(zip(layout.names, layout.shape))
        fake_dims = fake_dims_of(name, layout, pd.ep)
        for d in layout.names:
            if sizes[d] == W and d not in fake_dims:  # torch's rule: an override is honoured
                default += 1
                continue
            backend = "fake" if (d in fake_dims or sizes[d] == 1) else "real"
            key = (partition(layout, d), backend, d)  # meshes share a group only within one dim name
            if key in seen:
                continue
            seen.add(key)
            if backend == "fake":
                fake += 1
            else:
                real += 1
    return real, fake, default


@pytest.mark.parametrize(
    "cfg, W",
    [
        (CONFIG, 32),
        (dict(dp_replicate=1, dp_shard=4, cp=1, tp=2, pp=1, ep=1, etp=1), 8),
        (dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=2, ep=2, etp=2), 16),
        (dict(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1), 8),
        (dict(dp_replicate=3, dp_shard=2, cp=1, tp=4, pp=1, ep=8, etp=1), 24),
    ],
)
def test_one_group_per_distinct_partition(cfg, W):
    pd = ParallelDims(**cfg, world_size=W)
    with fake_world(W, 5):
        pd.build_mesh(device_type="cpu")
        rep = pd.build_report
    real, fake, default = expected_groups(pd)
    assert (rep.real, rep.fake, rep.reused_default) == (real, fake, default)
    assert rep.dims == sum(lay.ndim for lay in pd.layouts.values())
    assert rep.shared == rep.dims - rep.created - rep.reused_default
    assert rep.created < rep.dims  # something was shared
    assert len(rep.groups) == rep.created


def test_shared_partition_returns_the_same_group_object():
    W = 16
    world = MeshLayout.world(W)
    a = world.unflatten("world", (2, 2, 4), ("x", "y", "z"))
    b = world.unflatten("world", (4, 4), ("xy", "z"))
    ab = a["x", "y"].flatten("xy")  # modes (2,8),(2,4) -> coalesced (4,4): same partition as b.xy
    with fake_world(W, 6):
        builder = MeshBuilder(world)
        g1 = builder.process_group(b, "xy")
        g2 = builder.process_group(ab, "xy")
        g3 = builder.process_group(a, "z")
        g4 = builder.process_group(b, 1)
        assert g1 is g2 and g3 is g4
        assert ranks_of(g1) == [2, 6, 10, 14]
        # same partition, other backend: another group
        g5 = builder.process_group(b, "xy", fake=True)
        assert g5 is not g1 and ranks_of(g5) == ranks_of(g1)
        assert builder.process_group(b, "xy", fake=True) is g5
        rep = builder.report()
        assert (rep.real, rep.fake, rep.shared, rep.dims) == (2, 1, 3, 6)


def test_world_sized_dims_reuse_the_default_group():
    W = 8
    world = MeshLayout.world(W)
    mesh = world.unflatten("world", (1, 8), ("one", "all"))
    with fake_world(W, 3) as default:
        builder = MeshBuilder(world)
        assert builder.process_group(mesh, "all") is default
        assert builder.process_group(mesh["all"].flatten("again"), 0) is default
        # torch honours a fake override on a world-sized dim: a W-rank fake group
        pg = builder.process_group(mesh, "all", fake=True)
        assert pg is not default and pg._get_backend_name() == "custom"
        assert dist.get_process_group_ranks(pg) == list(range(W))
        assert builder.process_group(world, "world") is default
        rep = builder.report()
        assert (rep.created, rep.fake, rep.reused_default) == (1, 1, 3)


def test_size_one_and_fake_dims_use_the_fake_backend(monkeypatch):
    calls = []
    real_new_group = process_groups.new_member_group  # torch's member-only new_group, made fast

    def spy(ranks, **kwargs):
        calls.append((ranks.tolist(), kwargs.get("backend"), kwargs))
        return real_new_group(ranks, **kwargs)

    monkeypatch.setattr(process_groups, "new_member_group", spy)
    W = 16
    world = MeshLayout.world(W)
    mesh = world.unflatten("world", (1, 4, 4), ("pp", "dp", "tp"))
    with fake_world(W, 9):
        builder = MeshBuilder(world)
        dm = FastDeviceMesh.from_layout(builder, mesh, fake_dims=("dp",))
        rep = builder.report()
    assert [(r, b) for r, b, _ in calls] == [([9], "fake"), ([1, 5, 9, 13], "fake"), ([8, 9, 10, 11], None)]
    assert (rep.real, rep.fake) == (1, 2)
    assert rep.by_backend == {"fake": 3}  # the fake world's default backend is "fake" too
    assert dm.mesh_dim_names == ("pp", "dp", "tp")


def test_unknown_fake_dim_is_rejected():
    world = MeshLayout.world(4)
    mesh = world.unflatten("world", (2, 2), ("a", "b"))
    with fake_world(4, 0):
        builder = MeshBuilder(world)
        with pytest.raises(UnknownNameError):
            FastDeviceMesh.from_layout(builder, mesh, fake_dims=("c",))
        with pytest.raises(IndexError):
            FastDeviceMesh.from_layout(builder, mesh, fake_dims=(5,))


def test_creation_order_and_group_names_agree_across_ranks():
    """Members of a group must compute the same (hashed) group name, which counts the groups
    created before: so every rank must create the same sequence of groups."""
    W = 32
    sequences = set()
    names: dict[tuple[str, tuple[int, ...]], set[str]] = {}
    for rank in range(W):
        pd = ParallelDims(**CONFIG, world_size=W)
        with fake_world(W, rank):
            pd.build_mesh(device_type="cpu")
            sequences.add(pd.build_report.groups)
            for mesh_name, mesh in {**pd._global_meshes, "world": pd.world_mesh}.items():
                for i, dim in enumerate(mesh.mesh_dim_names):
                    pg = mesh.get_group(i)
                    names.setdefault((dim, tuple(ranks_of(pg))), set()).add(pg.group_name)
    assert len(sequences) == 1
    for key, seen in names.items():
        assert len(seen) == 1, (key, seen)


@pytest.mark.parametrize("own_split", [False, True], ids=["torchs_split_group", "rankmeshs_split"])
def test_split_group_strategy_when_the_default_group_has_a_bound_device(monkeypatch, own_split):
    """One split per real partition, only this rank's group, parent = the default group: through
    torch's ``dist.split_group`` (rankmesh's fallback) or rankmesh's own split (torch 2.15 after
    its probe), both replaced here by a member-only ``new_group``."""
    from rankmesh import _fast_groups as fg

    calls = []

    def fake_split_group(parent_pg=None, split_ranks=None, **kwargs):
        calls.append((parent_pg, split_ranks, kwargs))
        return dist.new_group(split_ranks[0], use_local_synchronization=True)

    def fake_own_split(parent, ranks, ranks_list, global_ranks, *args, **kwargs):
        calls.append((parent, [ranks_list], {}))
        assert global_ranks == ranks_list  # the default group: group ranks are global ranks
        return dist.new_group(ranks_list, use_local_synchronization=True)

    monkeypatch.setattr(dist, "split_group", fake_split_group)
    monkeypatch.setattr(fg, "_split", fake_own_split)
    monkeypatch.setattr(fg, "uses_fast_split", lambda: own_split)
    W = 16
    world = MeshLayout.world(W)
    mesh = world.unflatten("world", (2, 1, 8), ("dp", "one", "tp"))
    with fake_world(W, 11) as default:
        default.bound_device_id = torch.device("cuda", 0)
        builder = MeshBuilder(world, device_type="cuda")
        assert builder.method == "split_group"
        dm = FastDeviceMesh.from_layout(builder, mesh)
        assert builder.report().method == "split_group"
    assert [c[1] for c in calls] == [[[3, 11]], [[8, 9, 10, 11, 12, 13, 14, 15]]]
    assert all(c[0] is default for c in calls)
    assert dm.device_type == "cuda"


# -- DeviceMesh equal to torch's --------------------------------------------------------------


def assert_same_mesh(ours: DeviceMesh, theirs: DeviceMesh) -> None:
    assert ours.mesh_dim_names == theirs.mesh_dim_names
    assert ours.shape == theirs.shape
    assert torch.equal(ours.mesh, theirs.mesh), (ours.mesh, theirs.mesh)
    assert ours.get_coordinate() == theirs.get_coordinate()
    for i in range(ours.ndim):
        assert ranks_of(ours.get_group(i)) == ranks_of(theirs.get_group(i))
        assert ours.get_local_rank(i) == theirs.get_local_rank(i)


@pytest.mark.parametrize("seed", range(4))
def test_device_mesh_with_a_rank_map_equals_torch(seed):
    rng = random.Random(seed)
    shape = rng.choice([(2, 3, 2), (4, 4), (3, 1, 4), (12,)])
    W = math.prod(shape)
    rank_map = list(range(W))
    rng.shuffle(rank_map)
    world = MeshLayout.world(W, rank_map)
    names = tuple(f"d{i}" for i in range(len(shape)))
    layout = world.unflatten("world", shape, names)
    for rank in sorted({0, W - 1, rng.randrange(W)}):
        with fake_world(W, rank):
            theirs = DeviceMesh("cpu", torch.tensor(rank_map).reshape(shape), mesh_dim_names=names)
            builder = MeshBuilder(world)
            ours = FastDeviceMesh.from_layout(builder, layout)
            assert_same_mesh(ours, theirs)
            for k in range(1, len(names) + 1):
                for sub in itertools.combinations(names, k):
                    assert_same_mesh(ours[sub], theirs[sub])
            flat = FastDeviceMesh.from_layout(builder, layout.flatten("all"))
            assert_same_mesh(flat, theirs._flatten("all"))


def test_device_mesh_slicing_and_coordinates():
    W = 24
    world = MeshLayout.world(W)
    layout = world.unflatten("world", (2, 3, 4), ("a", "b", "c"))
    with fake_world(W, 17):
        dm = FastDeviceMesh.from_layout(MeshBuilder(world), layout)
        assert dm.get_coordinate() == tuple(layout.coordinate_of(17))
        assert dm["b", "c"].mesh.tolist() == layout["b", "c"].mesh_of(17).tolist()
        assert dm["a"].get_local_rank() == 1
        with pytest.raises(KeyError):
            dm["c", "a"]


# -- errors ------------------------------------------------------------------------------------


def test_builder_needs_an_initialised_matching_world():
    world = MeshLayout.world(8)
    with pytest.raises(DistributedStateError, match="not initialised"):
        MeshBuilder(world)
    with fake_world(16, 0):
        with pytest.raises(DistributedStateError, match="16 ranks"):
            MeshBuilder(world)
    with fake_world(8, 2):
        with pytest.raises(DistributedStateError, match="rank = 3"):
            MeshBuilder(world, rank=3)
        assert MeshBuilder(world, rank=2).rank == 2
        with pytest.raises(TypeError):
            MeshBuilder("world")  # type: ignore[arg-type]


def test_layout_from_another_world_is_rejected():
    world = MeshLayout.world(8)
    other = MeshLayout.world(8, [1, 0, 2, 3, 4, 5, 6, 7]).unflatten("world", (2, 4), ("a", "b"))
    with fake_world(8, 0):
        builder = MeshBuilder(world)
        with pytest.raises(DistributedStateError, match="not over this builder's world"):
            builder.process_group(other, "a")
        with pytest.raises(DistributedStateError):
            FastDeviceMesh.from_layout(builder, MeshLayout.world(4))
        assert isinstance(DistributedStateError("m"), (RankmeshError, RuntimeError))


# -- report --------------------------------------------------------------------------------------


def test_report_numbers_and_text():
    W = 32
    pd = ParallelDims(**CONFIG, world_size=W)
    with fake_world(W, 0):
        assert pd.build_report is None
        pd.build_mesh(device_type="cpu")
        rep = pd.build_report
        pd.build_mesh()
        assert pd.build_report == rep  # idempotent: nothing more created
    assert isinstance(rep, BuildReport)
    d = rep.as_dict()
    assert d["created"] == rep.real + rep.fake == sum(d["by_backend"].values())
    assert d["method"] == "new_group" and d["backend"] == "fake"
    assert str(rep).startswith(f"{rep.created} process groups created")
    # every group in creation order: (dim name, backend, size)
    assert [g[0] for g in rep.groups][:3] == ["pp", "batch", "cp"]


# -- check_consistency -----------------------------------------------------------------------------


def test_i64_mapping_is_order_preserving():
    vals = [0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
    mapped = [_to_i64(v) for v in vals]
    assert mapped == sorted(mapped)
    assert all(-(2**63) <= m < 2**63 and -(2**63) <= ~m < 2**63 for m in mapped)
    assert [_from_i64(m) for m in mapped] == vals


def test_check_consistency_passes_when_all_agree():
    with fake_world(8, 3):
        check_consistency(2**64 - 1)
        check_consistency(0, timeout=5)
        with pytest.raises(LayoutOverflowError) as e:  # also a ValueError, as before
            check_consistency(2**64)
        assert (e.value.field, e.value.value) == ("fingerprint", 2**64)
        pd = ParallelDims(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=8)
        pd.build_mesh(device_type="cpu", check_consistency=True)
    with pytest.raises(DistributedStateError):
        check_consistency(1)


class _Done:
    def wait(self, timeout=None):
        return True


def test_check_consistency_mismatch_message(monkeypatch):
    """Simulates a second rank (rank 5 of 8, the other 6 agree with us) on the fake backend."""
    other = 0x1234
    mine = 0xFEDC_BA98_7654_3210
    calls = []

    def all_reduce(t, op=None, group=None, async_op=False):
        calls.append(op)
        n = len(calls)
        if n == 1:  # MAX of [v, ~v]
            v = _to_i64(other)
            t.copy_(torch.maximum(t, torch.tensor([v, ~v])))
        elif n == 2:  # SUM of [is_min, is_max]: 6 more ranks like us, one like `other`
            t.copy_(t * 7 + torch.tensor([1, 0]))
        else:  # MAX of [-first_min_rank, -first_max_rank]
            t.copy_(torch.maximum(t, torch.tensor([-5, -8])))
        return _Done()

    with fake_world(8, 2):
        monkeypatch.setattr(dist, "all_reduce", all_reduce)
        with pytest.raises(ConfigMismatchError) as ei:
            check_consistency(mine)
    e = ei.value
    assert (e.fingerprint, e.min_fingerprint, e.max_fingerprint) == (mine, other, mine)
    msg = str(e)
    assert f"{mine:#018x}" in msg and f"{other:#018x}" in msg
    assert "held by 1 rank(s) (e.g. rank 5)" in msg and "by 7 rank(s) (e.g. rank 2)" in msg
    assert calls[0] == dist.ReduceOp.MAX
    import pickle

    again = pickle.loads(pickle.dumps(e))
    assert (again.fingerprint, again.min_fingerprint, str(again)) == (mine, other, msg)


def test_check_consistency_timeout(monkeypatch):
    class Stuck:
        def wait(self, timeout=None):
            raise RuntimeError("Operation timed out!")

    with fake_world(8, 0):
        monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: Stuck())
        with pytest.raises(ConsistencyTimeoutError, match="within 1.5 s") as ei:
            check_consistency(7, timeout=1.5)
    assert isinstance(ei.value, ConfigMismatchError) and isinstance(ei.value, TimeoutError)
    assert ei.value.fingerprint == 7


def test_np_int_fingerprint_accepted():
    with fake_world(2, 1):
        check_consistency(np.uint64(2**64 - 1))
