"""rankmesh.recovery (issue 36, item 2): a hot spare or a shrunk replica dim, described in
O(changes), and every mesh tree re-formed over it on the fake backend.

The oracle for a re-formed tree is the same tree over the plain world at this rank's mesh index,
its ranks mapped through the dense rank map the re-form stands for (computed here the slow,
obvious way), and for ``init_device_mesh`` torch's own ``DeviceMesh`` over that dense map.
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import rankmesh  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rankmesh import MeshLayout, ReformError  # noqa: E402
from rankmesh.recovery import RankSet, Reform, active_world, deactivate, hot_spare, shrink  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh  # noqa: E402

from tests.conftest import fake_world  # noqa: E402


def dense(old: int, size: int, removed: list[int], spares: dict[int, int]) -> list[int]:
    """The rank at each mesh index after the re-form, the obvious way."""
    alive = [r for r in range(old) if r not in removed]
    return [alive.index(spares.get(i, i)) for i in range(size)]


def world_ranks(layout: MeshLayout) -> list[int]:
    m = layout.rank_map()
    return list(range(layout.world_size)) if m is None else [int(x) for x in m]


@pytest.mark.parametrize("seed", range(40))
def test_hot_spare_worlds_are_the_dense_rank_map(seed):
    rng = random.Random(seed)
    size = rng.choice([4, 8, 12, 16, 64])
    nspares = rng.randint(1, 4)
    old = size + nspares
    failed = rng.sample(range(size), rng.randint(1, nspares))
    if rng.random() < 0.3 and len(failed) < nspares:  # a spare dies too
        failed.append(rng.randrange(size, old))
    plan = hot_spare(old, failed=failed, mesh_size=size, renumber="shift")
    pool = [r for r in range(size, old) if r not in failed]
    spares = dict(zip(sorted(r for r in failed if r < size), pool))
    # hot_spare gives the failed mesh ranks the spares in the order failed lists them
    spares = dict(zip([r for r in failed if r < size], pool))
    removed = sorted(set(failed) | {r for r in range(size, old) if r not in spares.values()})
    want = dense(old, size, removed, spares)
    assert world_ranks(plan.world) == want
    assert plan.world_size == size and list(plan.removed) == removed
    for r in range(old):  # new_rank agrees with the world: the rank at each index
        new = plan.new_rank(r)
        if r in removed:
            assert new is None
        else:
            index = spares_inv(spares).get(r, r)
            assert want[index] == new
    # O(changes): the world keeps the renumbering, not a W-long map
    assert plan.world.renumbering == (old, removed, sorted(spares.items()))
    again = pickle.loads(pickle.dumps(plan.world))
    assert again == plan.world and again.renumbering == plan.world.renumbering


def spares_inv(spares: dict[int, int]) -> dict[int, int]:
    return {r: i for i, r in spares.items()}


def test_hot_spare_refuses_what_cannot_be_reformed():
    def fails(kind_or_field, **kw):
        with pytest.raises(ReformError) as e:
            hot_spare(**kw)
        assert kind_or_field in (e.value.field, e.value.kind), (e.value.field, e.value.kind, str(e.value))
        return e.value

    fails("failed[0]", old_world_size=9, failed=[9], mesh_size=8)  # outside the job
    fails("failed", old_world_size=9, failed=[3, 3], mesh_size=8)  # twice
    fails("failed", old_world_size=9, failed=[], mesh_size=8)  # nothing failed
    err = fails("no_spare_left", old_world_size=9, failed=[1, 2], mesh_size=8)  # one spare, two failures
    assert err.ctx == {"failed": (1, 2), "spares": (8,)}
    fails("spares", old_world_size=10, failed=[1], mesh_size=8, spares=[5])  # a spare inside the mesh
    fails("spares", old_world_size=10, failed=[1, 9], mesh_size=8, spares=[9])  # a failed spare
    fails("spares[0]", old_world_size=10, failed=[1], mesh_size=8, spares=[10])
    fails("mesh_size", old_world_size=9, failed=[1], mesh_size=10)


@pytest.mark.parametrize("seed", range(30))
def test_shrink_renumbers_survivors_in_order_and_keeps_inner_dims(seed):
    rng = random.Random(seed)
    names = ["pp", "dp_replicate", "dp_shard", "tp"]
    sizes = dict(zip(names, [rng.choice([1, 2]), rng.choice([2, 3, 4]), rng.choice([1, 2]), rng.choice([1, 2, 4])]))
    numel = int(np.prod(list(sizes.values())))
    extra = rng.randint(0, 2)  # idle ranks beyond the mesh leave too
    failed = rng.sample(range(numel + extra), rng.randint(1, 2))
    grid = np.arange(numel).reshape(list(sizes.values()))
    lost = sorted({int(np.argwhere(grid == r)[0][1]) for r in failed if r < numel})
    if len(lost) == sizes["dp_replicate"]:
        with pytest.raises(ReformError) as e:
            shrink(sizes, failed=failed, old_world_size=numel + extra)
        assert e.value.kind == "no_replica_left"
        return
    plan = shrink(sizes, failed=failed, old_world_size=numel + extra)
    kept = np.delete(grid, lost, axis=1)  # the obvious way: drop the replicas, keep the order
    survivors = sorted(kept.flatten().tolist())
    assert plan.sizes == {**sizes, "dp_replicate": sizes["dp_replicate"] - len(lost)}
    assert plan.world_size == len(survivors) == kept.size
    for r in range(numel + extra):
        want = survivors.index(r) if r in survivors else None
        assert plan.new_rank(r) == want
    # the survivors' new ranks, in the kept grid, are the plain new world in row-major order
    assert [plan.new_rank(int(r)) for r in kept.flatten()] == list(range(kept.size))
    assert plan.world.in_rank_order
    # removed: every rank that leaves (the lost replicas, strided when pp > 1, and the idle ranks)
    assert plan.removed == [r for r in range(numel + extra) if r not in survivors]
    assert all((r in plan.removed) == (plan.new_rank(r) is None) for r in range(numel + extra))


def test_shrink_refusals():
    with pytest.raises(ReformError) as e:
        shrink({"dp_replicate": 1, "tp": 4}, failed=[1])
    assert e.value.kind == "no_replica_left" and e.value.field == "dim"
    with pytest.raises(ReformError) as e:
        shrink({"dp_replicate": 2, "tp": 2}, failed=[0, 3])
    assert e.value.kind == "no_replica_left" and e.value.ctx["failed_replicas"] == (0, 1)
    with pytest.raises(ReformError) as e:
        shrink({"dp": 2, "tp": 2}, failed=[0])
    assert e.value.field == "dim"
    with pytest.raises(ReformError) as e:
        shrink({"dp_replicate": 2, "tp": 2}, failed=[4])
    assert e.value.field == "failed[0]"


# -- removed: every rank that leaves, held in O(changes) -----------------------------------------


def test_a_shrink_at_2_17_removes_every_rank_of_the_lost_replica():
    plan = shrink({"dp_replicate": 4, "dp_shard": 4096, "tp": 8}, failed=[70_001])
    lost = range(65_536, 98_304)  # replica 2: 4096 * 8 ranks
    assert len(plan.removed) == 32_768 and plan.removed.pieces == (lost,)
    assert repr(plan.removed) == "RankSet(range(65536, 98304))"
    for r in (65_536, 70_001, 81_920, 98_303):  # first, failed, middle, last
        assert r in plan.removed and plan.new_rank(r) is None
    for r in (0, 65_535, 98_304, 131_071, -1, "70001", 70_001.0):
        assert r not in plan.removed
    sample = [*random.Random(0).sample(range(1 << 17), 3000), 65_535, 65_536, 98_303, 98_304]
    assert all((r in plan.removed) == (plan.new_rank(r) is None) for r in sample)
    assert plan.removed == list(lost) and plan.removed == tuple(lost) and plan.removed != list(lost)[1:]


def test_a_shrink_of_an_inner_replica_dim_removes_one_strided_piece_per_run_of_lost_replicas():
    sizes = {"pp": 4, "dp": 8, "cp": 2, "tp": 4}  # Megatron-like: dp has pp outside it
    plan = shrink(sizes, failed=[8, 17, 100], dim="dp", old_world_size=260)  # dp 1, 2 (in pp 0) and 4 (pp 1)
    grid = np.arange(256).reshape(4, 8, 2, 4)
    want = sorted([*grid[:, [1, 2, 4]].flatten().tolist(), 256, 257, 258, 259])
    assert plan.removed == want and len(plan.removed) == len(want)
    assert len(plan.removed.pieces) == 3  # dp 1-2, dp 4, the idle ranks 256-259: not one per pp stage
    assert repr(plan.removed) == "RankSet(Slice(8, [(4, 64), (16, 1)]), Slice(32, [(4, 64), (8, 1)]), range(256, 260))"
    assert all((r in plan.removed) == (plan.new_rank(r) is None) for r in range(260))


def test_a_hot_spare_removes_the_failed_ranks_and_the_unused_spares():
    # 12 in the mesh, spares 12-19; mesh ranks 3 and 5 fail, spare 17 too: spares 12 and 13 step in
    for renumber in ("fill", "shift"):
        plan = hot_spare(20, failed=[3, 17, 5], mesh_size=12, renumber=renumber)
        assert plan.removed == [3, 5, 14, 15, 16, 17, 18, 19]
        assert repr(plan.removed) == "RankSet(3, 5, range(14, 20))" and len(plan.removed.pieces) == 3
        assert all((r in plan.removed) == (plan.new_rank(r) is None) for r in range(20))
    plan = hot_spare(20, failed=[3], mesh_size=12, spares=[15])  # the spares around 15 leave
    assert repr(plan.removed) == "RankSet(3, range(12, 15), range(16, 20))"
    assert all((r in plan.removed) == (plan.new_rank(r) is None) for r in range(20))
    assert plan.new_rank(15) == 3
    every_spare = hot_spare(10, failed=[2, 7], mesh_size=8)  # both spares step in: the failed leave
    assert every_spare.removed == (2, 7) and repr(every_spare.removed) == "RankSet(2, 7)"


def test_removed_is_a_few_pieces_at_2_20_and_len_repr_and_in_never_list_it(monkeypatch):
    world = 1 << 20
    shrunk = shrink({"dp_replicate": 8, "dp_shard": 16_384, "tp": 8}, failed=[5, 300_000, world - 1])
    megatron = shrink({"pp": 64, "dp": 256, "cp": 1, "tp": 64}, failed=[70_000, 70_064], dim="dp")  # dp 69, 70
    spare = hot_spare(world + 4096, failed=[7, 900_000], mesh_size=world)
    monkeypatch.setattr(RankSet, "__iter__", lambda self: pytest.fail("the ranks were listed"))
    assert len(shrunk.removed.pieces) == 3 and len(shrunk.removed) == 3 * 131_072  # replicas 0, 2, 7
    assert repr(shrunk.removed) == "RankSet(range(0, 131072), range(262144, 393216), range(917504, 1048576))"
    assert len(megatron.removed.pieces) == 1 and len(megatron.removed) == 2 * 64 * 64  # in each of 64 stages
    assert repr(megatron.removed) == "RankSet(Slice(4416, [(64, 16384), (128, 1)]))"
    assert 70_064 + 16_384 in megatron.removed and 70_000 + 128 not in megatron.removed
    assert len(spare.removed.pieces) == 3 and len(spare.removed) == 2 + 4094  # spares 0-1 step in
    assert repr(spare.removed) == "RankSet(7, 900000, range(1048578, 1052672))"
    for plan in (shrunk, megatron, spare):
        plan.fingerprint  # noqa: B018  (covers removed's pieces, not its ranks)


def test_the_fingerprint_differs_exactly_when_the_new_job_does():
    def fp(plan):
        return plan.fingerprint

    sizes = {"dp_replicate": 2, "tp": 2}
    assert fp(shrink(sizes, failed=[0])) != fp(shrink(sizes, failed=[3]))  # another replica leaves
    assert fp(shrink(sizes, failed=[0])) == fp(shrink(sizes, failed=[1]))  # the same replica: the same job
    assert fp(hot_spare(10, failed=[2], mesh_size=8)) != fp(hot_spare(10, failed=[3], mesh_size=8))
    # the same ranks leave, but the spares take the other numbers
    a = hot_spare(10, failed=[2, 3], mesh_size=8, spares=[8, 9])
    b = hot_spare(10, failed=[3, 2], mesh_size=8, spares=[8, 9])
    assert a.removed == b.removed and (a.new_rank(8), b.new_rank(8)) == (2, 3)
    assert fp(a) != fp(b) and a != b
    assert fp(a) == fp(hot_spare(10, failed=[2, 3], mesh_size=8)) and a == hot_spare(10, failed=[2, 3], mesh_size=8)
    shifted = hot_spare(10, failed=[2], mesh_size=8, renumber="shift")
    assert fp(shifted) != fp(hot_spare(10, failed=[3], mesh_size=8, renumber="shift"))


def test_a_rank_set_is_a_sorted_set_of_ranks_that_equals_its_list_and_pickles():
    s = RankSet(range(10, 20), 3, range(15, 25), 2, 30)  # overlapping and touching pieces join
    assert s.pieces == (range(2, 4), range(10, 25), range(30, 31))
    assert repr(s) == "RankSet(range(2, 4), range(10, 25), 30)"
    assert list(s) == [2, 3, *range(10, 25), 30] == s and len(s) == 18
    assert hash(s) == hash(tuple(s)) and s == RankSet(*list(s)) and s != [2, 3] and s != "ranks"
    strided = RankSet(range(1, 9, 4), rankmesh.Slice(2, [(2, 8), (2, 1)]), 7)
    assert list(strided) == [1, 2, 3, 5, 7, 10, 11] and 10 in strided and 9 not in strided
    assert repr(strided) == "RankSet(range(1, 9, 4), Slice(2, [(2, 8), (2, 1)]), 7)"
    for x in (s, strided, RankSet()):
        back = pickle.loads(pickle.dumps(x))
        assert back == x and back.pieces == x.pieces and repr(back) == repr(x)
    assert len(RankSet()) == 0 and not RankSet() and repr(RankSet()) == "RankSet()"
    with pytest.raises(ReformError) as e:
        RankSet(rankmesh.Slice(0, [(2, 8), (2, 1)]), 9)  # 9 is in the Slice
    assert e.value.field == "pieces" and "rank 9" in str(e.value)
    for bad, field, value in ((-1, "pieces[0]", -1), (1.5, "pieces[0]", 1.5), (True, "pieces[0]", True)):
        with pytest.raises(ReformError) as e:
            RankSet(bad)
        assert (e.value.field, e.value.value) == (field, value)
    with pytest.raises(ReformError) as e:
        RankSet(4, range(5, 0, -1))
    assert e.value.field == "pieces[1]"
    plan = Reform(old_world_size=4, world_size=2, world=MeshLayout.world(2), removed=(3, 1))  # a sequence: made a set
    assert isinstance(plan.removed, RankSet) and plan.removed == [1, 3] and plan.new_rank(2) == 1


# -- every tree, re-formed over a hot spare, on the fake backend -------------------------------

OLD, SIZE, FAILED = 18, 16, [3, 10]  # 16 in the mesh, spares 16 and 17; ranks 3 and 10 fail


def _plan():
    return hot_spare(OLD, failed=FAILED, mesh_size=SIZE, renumber="shift")


def _index_of(plan, new_rank: int) -> int:
    return world_ranks(plan.world).index(new_rank)


@pytest.mark.parametrize("new_rank", [0, 3, 9, 14, 15])
def test_init_device_mesh_over_a_hot_spare_is_torchs_mesh_over_the_dense_map(new_rank):
    plan = _plan()
    ranks = torch.tensor(world_ranks(plan.world))
    with fake_world(SIZE, new_rank):
        expect = DeviceMesh("cpu", ranks.reshape(2, 2, 4), mesh_dim_names=("pp", "dp", "tp"))
        plan.activate()
        try:
            mesh = rankmesh.init_device_mesh("cpu", (2, 2, 4), mesh_dim_names=("pp", "dp", "tp"))
            explicit = rankmesh.init_device_mesh(
                "cpu", (2, 2, 4), mesh_dim_names=("pp", "dp", "tp"), rank_map=plan.world
            )
        finally:
            deactivate()
        for m in (mesh, explicit):
            assert torch.equal(m.mesh, expect.mesh)
            assert m.get_coordinate() == expect.get_coordinate()
            for name in ("pp", "dp", "tp"):
                assert dist.get_process_group_ranks(m.get_group(name)) == dist.get_process_group_ranks(
                    expect.get_group(name)
                )
            flat = m["dp", "tp"]._flatten("dp_tp")
            assert flat.mesh.tolist() == expect["dp", "tp"]._flatten("dp_tp").mesh.tolist()


@pytest.mark.parametrize("new_rank", [0, 7, 13])
def test_parallel_dims_over_a_hot_spare(new_rank):
    plan = _plan()
    index = _index_of(plan, new_rank)
    ranks = world_ranks(plan.world)
    degrees = dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=2, ep=1, etp=1)
    with fake_world(SIZE, index):  # the oracle: the plain world at this rank's index
        plain = rankmesh.ParallelDims(**degrees, world_size=SIZE)
        plain.build_mesh("cpu")
        want = {
            n: [ranks[i] for i in m.mesh.flatten().tolist()] for n, m in plain.get_all_one_dimensional_meshes().items()
        }
    with fake_world(SIZE, new_rank):
        plan.activate()
        try:
            pd = rankmesh.ParallelDims(**degrees, world_size=SIZE)
            pd.build_mesh("cpu")
        finally:
            deactivate()
        got = {n: m.mesh.flatten().tolist() for n, m in pd.get_all_one_dimensional_meshes().items()}
        groups = {
            n: dist.get_process_group_ranks(m.get_group()) for n, m in pd.get_all_one_dimensional_meshes().items()
        }
    assert got == want
    assert groups == {n: sorted(v) for n, v in want.items()}


@pytest.mark.parametrize("seed", range(10))
def test_a_filled_hot_spare_keeps_every_number_but_the_spares(seed):
    rng = random.Random(seed)
    size, nspares = rng.choice([8, 16, 64]), rng.randint(1, 3)
    old = size + nspares
    failed = rng.sample(range(size), rng.randint(1, nspares))
    plan = hot_spare(old, failed=failed, mesh_size=size)
    assert plan.world.in_rank_order and plan.world_size == size
    spares = dict(zip(range(size, old), failed))
    for r in range(old):
        want = spares.get(r, None if r in failed or r >= size else r)
        assert plan.new_rank(r) == want
    assert sorted(r for r in (plan.new_rank(x) for x in range(old)) if r is not None) == list(range(size))


def test_megatron_refuses_a_shifted_world_before_any_group():
    ps = pytest.importorskip("megatron.core.parallel_state")
    import rankmesh.megatron as rm

    with fake_world(SIZE, 0):
        _plan().activate()
        try:
            before = len(dist.distributed_c10d._world.pg_map)
            with pytest.raises(ReformError) as e:
                rm.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=False)
            assert e.value.field == "renumber" and "fill" in str(e.value)
            assert len(dist.distributed_c10d._world.pg_map) == before
            assert not ps.model_parallel_is_initialized()
        finally:
            deactivate()


@pytest.mark.parametrize("new_rank", [0, 6, 15])
def test_megatron_over_a_hot_spare(new_rank):
    ps = pytest.importorskip("megatron.core.parallel_state")
    import rankmesh.megatron as rm

    plan = hot_spare(OLD, failed=FAILED, mesh_size=SIZE)  # renumber="fill": the plain world
    index = _index_of(plan, new_rank)
    ranks = world_ranks(plan.world)
    getters = ("get_tensor_model_parallel_group", "get_pipeline_model_parallel_group", "get_data_parallel_group")

    def members():
        return {g: dist.get_process_group_ranks(getattr(ps, g)()) for g in getters}

    with fake_world(SIZE, index):
        rm.initialize_model_parallel(
            tensor_model_parallel_size=2, pipeline_model_parallel_size=2, create_gloo_process_groups=False
        )
        try:
            want = {g: sorted(ranks[i] for i in v) for g, v in members().items()}
        finally:
            ps.destroy_model_parallel()
    with fake_world(SIZE, new_rank):
        plan.activate()
        try:
            rm.initialize_model_parallel(
                tensor_model_parallel_size=2, pipeline_model_parallel_size=2, create_gloo_process_groups=False
            )
            got = members()
        finally:
            deactivate()
            ps.destroy_model_parallel()
    assert got == want


def test_a_reform_ends_with_its_default_group():
    plan = _plan()
    with fake_world(SIZE, 0):
        plan.activate()
        assert active_world(SIZE) == plan.world
        assert active_world(SIZE + 1) is None
    with fake_world(SIZE, 0):  # a new default group: the plain world again
        assert active_world(SIZE) is None
        assert rankmesh.init_device_mesh("cpu", (SIZE,)).mesh.tolist() == list(range(SIZE))
    with fake_world(SIZE + 2, 0):
        with pytest.raises(rankmesh.DistributedStateError):
            plan.activate()  # not the new job's size
