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
from rankmesh.recovery import active_world, deactivate, hot_spare, shrink  # noqa: E402
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
        rm.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                     create_gloo_process_groups=False)
        try:
            want = {g: sorted(ranks[i] for i in v) for g, v in members().items()}
        finally:
            ps.destroy_model_parallel()
    with fake_world(SIZE, new_rank):
        plan.activate()
        try:
            rm.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                         create_gloo_process_groups=False)
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
