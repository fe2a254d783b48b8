"""One process of the real-fault tests (tests/test_recovery_mp.py launches it as ``python -m
tests.mp.fault_worker`` from the repository root, one process per rank, no torchrun): gloo on
CPU, every rendezvous on a ``TCPStore`` that the test process itself hosts, so that killing a
rank never takes the store with it.

``--case hot_spare`` (9 processes: two "nodes" of 4 mesh ranks and one spare, old rank 8) or
``--case shrink`` (8 processes, no spare). Each process, with its old rank:

1. **gen 0**: ``init_process_group("gloo", store=PrefixStore("gen0", store), world_size=W,
   timeout=20 s)``; the plain tree ``rankmesh.init_device_mesh`` (dp_replicate 2, dp_shard 2,
   tp 2) over ranks 0-7 (the spare makes the same calls as a non-member), all_reduce over every
   dim; then steps: all_reduce over every dim and over the world, until one raises. The test
   SIGKILLs one rank once every process has posted ``gen0/midway``.
2. **detect and tear down** (:func:`teardown`): a collective raises (gloo reports the dead
   peer's reset socket at once; the 20 s group timeout is the backstop). No collective is left
   pending, so ``destroy_process_group()`` returns at once; once gen 0's group objects die (a
   ``gc.collect()``: meshes sit in reference cycles) gloo closes this
   rank's sockets, which makes the collectives of the ranks still waiting on it raise too, so
   the failure spreads in about a second instead of one gloo timeout per hop.
3. **agree** (:func:`agree`): each survivor posts ``gen0/alive/<r>`` as soon as its collective
   raises; the first to reach the agreement (an atomic ``add``) decides: a rank is failed when
   it has not posted and its heartbeat counter (``hb/<r>``, bumped every 0.2 s by a thread on
   its own store client) has stood still for ``STALE_S``. It writes the list once; everyone
   waits for it (bounded). One writer, so everyone agrees.
4. **gen 1**: ``plan = rankmesh.recovery.hot_spare(9, failed, mesh_size=8)`` or ``shrink(...)``;
   a process whose ``plan.new_rank(old)`` is None writes ``left`` and exits 0; the others
   re-initialise on ``PrefixStore("gen1", store)`` with ``rank=plan.new_rank(old)``,
   ``world_size=plan.world_size``, then ``plan.check()``, ``plan.activate()``, and re-form every
   tree: ``tree_plain`` (``init_device_mesh`` with two ``_flatten``\\ s), ``tree_parallel_dims``
   (``rankmesh.ParallelDims(...).build_mesh()``) and, in the hot-spare case when megatron-core is
   installed, ``tree_megatron`` (``rankmesh.megatron.initialize_model_parallel``, tp 2, pp 2).
   Every group of every tree must be the same tree's group over the plain world at this rank's
   mesh index, mapped through ``plan.world.rank_map()``, and all_reduce over it must sum its
   members; ``order`` records each dim's coordinate beside the group's local rank; ``train``
   takes one FSDP2 + TP step (``fully_shard`` on (dp_replicate, dp_shard), ``parallelize_module``
   on tp) and records its loss and the updated parameters.

``--case reference``: the uninterrupted run the ``train`` step is compared with: ``--world``
processes straight into the tree of ``--sizes`` on the plain world, and the same ``train``.

Each process appends one JSON line per stage or check to ``<out>/rank<old rank>.jsonl``
(``tests.mp.worker.Recorder``), so a process stopped anywhere shows how far it got.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import threading
import time
import traceback
import warnings
import weakref

import numpy as np
import rankmesh
import torch
import torch.distributed as dist
from rankmesh.recovery import Reform, hot_spare, shrink

from tests.mp.worker import Recorder, batch_for, compare, expected_group, make_mlp, reference_step

HOST = "127.0.0.1"
PG_TIMEOUT_S = 20  # every gloo group's timeout: the backstop for a collective waiting on a dead peer
STORE_TIMEOUT_S = 60  # store.get / wait on the test's TCPStore
HB_PERIOD_S = 0.2  # heartbeat: hb/<rank> += 1
STALE_S = 5.0  # a rank that has not posted alive and whose heartbeat stood still this long failed
AGREE_TIMEOUT_S = 45.0  # the decider gives up (and raises) past this
STEP_DEADLINE_S = 60.0  # gen 0 steps stop (and fail) if no collective raised by then
CHECK_TIMEOUT_S = 30.0  # plan.check()
LR = 0.1

PLAIN_SIZES = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}  # gen 0's tree; 2 nodes = 2 replicas
FLATTENS = {"dp": ("dp_replicate", "dp_shard"), "dp_shard_tp": ("dp_shard", "tp")}
MEGATRON = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, create_gloo_process_groups=False)


def timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def connect(port: int) -> dist.TCPStore:
    return dist.TCPStore(HOST, port, is_master=False, timeout=timedelta(STORE_TIMEOUT_S))


class Heartbeat(threading.Thread):
    """Bumps ``hb/<rank>`` every HB_PERIOD_S on its own store client until stopped (or the store
    goes away). Blocking gloo calls release the GIL, so it beats while the main thread waits."""

    def __init__(self, port: int, rank: int) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.store, self.key = connect(port), f"hb/{rank}"
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.wait(HB_PERIOD_S):
                self.store.add(self.key, 1)
        except Exception:  # noqa: BLE001 - the store closed: the test is over
            pass


def agree(store, rank: int, world: int, gen: str) -> tuple[list[int], bool]:
    """The failed ranks of ``gen``, the same list on every survivor, in bounded time; and whether
    this rank decided. See the module docstring (step 3). Survivors post ``<gen>/alive/<rank>``
    as soon as they notice (before tearing down: destroying gloo groups holds the GIL, which can
    starve the heartbeat thread for seconds on a loaded machine); posted again here."""
    store.set(f"{gen}/alive/{rank}", "1")
    decider = store.add(f"{gen}/deciders", 1) == 1
    if decider:
        alive: set[int] = set()
        dead: set[int] = set()
        beats: dict[int, tuple[int, float]] = {}
        end = time.monotonic() + AGREE_TIMEOUT_S
        while len(alive) + len(dead) < world:
            now = time.monotonic()
            for r in range(world):
                if r in alive or r in dead:
                    continue
                if store.check([f"{gen}/alive/{r}"]):
                    alive.add(r)
                    continue
                count = store.add(f"hb/{r}", 0)
                if r not in beats or beats[r][0] != count:
                    beats[r] = (count, now)
                elif now - beats[r][1] > STALE_S:
                    dead.add(r)
            if now > end:
                undecided = sorted(set(range(world)) - alive - dead)
                store.set(f"{gen}/failed", json.dumps({"error": f"ranks {undecided} neither posted nor stopped"}))
                break
            time.sleep(0.1)
        else:
            store.set(f"{gen}/failed", json.dumps({"failed": sorted(dead)}))
    store.wait([f"{gen}/failed"], timedelta(AGREE_TIMEOUT_S + 15))
    got = json.loads(store.get(f"{gen}/failed"))
    if "error" in got:
        raise TimeoutError(got["error"])
    return got["failed"], decider


# -- the trees, and what they must be -----------------------------------------------------------


def plain_tree(sizes: dict[str, int]):
    """``rankmesh.init_device_mesh`` over (dp_replicate, dp_shard, tp) and its two flattens: the
    mesh and ``{dim: (mesh, names of the plain dims it spans)}`` for every dim of the tree."""
    mesh = rankmesh.init_device_mesh("cpu", tuple(sizes.values()), mesh_dim_names=tuple(sizes))
    dims = {n: (mesh[n], (n,)) for n in sizes}
    for flat, names in FLATTENS.items():
        dims[flat] = (mesh[names]._flatten(flat), names)
    return mesh, dims


def reduce_over(group, want: list[int], index_members: list[int], index: int, what) -> None:
    """all_reduce([rank + 1, mesh index + 1]) over ``group`` sums the expected new ranks and the
    expected mesh indices: the group holds exactly those ranks, each at the expected place."""
    t = torch.tensor([dist.get_rank() + 1.0, index + 1.0])
    dist.all_reduce(t, group=group)
    got = [int(x) for x in t.tolist()]
    expect = [sum(r + 1 for r in want), sum(i + 1 for i in index_members)]
    assert got == expect, (what, got, expect)


def check_plain(sizes, rank_map: list[int], index: int) -> dict:
    """Every dim of the plain tree: its group is the plain world's group at ``index`` mapped
    through ``rank_map`` (numpy oracle, tests/mp/worker.expected_group), and all_reduce sums it."""
    mesh, dims = plain_tree(sizes)
    world = len(rank_map)
    order = tuple(sizes)
    coord = tuple(int(c) for c in np.argwhere(np.arange(world).reshape(tuple(sizes.values())) == index)[0])
    assert mesh.get_coordinate() == coord, (mesh.get_coordinate(), coord)
    groups = {}
    for dim, (sub, names) in dims.items():
        members = expected_group(world, sizes, order, names, index)
        want = sorted(rank_map[i] for i in members)
        got = dist.get_process_group_ranks(sub.get_group())
        assert got == want, (dim, got, want)
        reduce_over(sub.get_group(), want, members, index, dim)
        groups[dim] = want
    return {"groups": groups, "coordinate": list(coord)}


def order_facts(sizes, rank_map: list[int], index: int) -> dict:
    """For every dim of the plain tree: this rank's mesh coordinate along it and its local rank in
    the dim's group (torch's ``get_local_rank``: the place in the group's sorted ranks), which
    DTensor, FSDP2 and pipeline stages go by."""
    mesh, dims = plain_tree(sizes)
    out = {}
    for dim, (sub, _names) in dims.items():
        out[dim] = {"coordinate": sub.get_coordinate()[0], "local_rank": sub.get_local_rank()}
    return out


def fake_oracle(world: int, index: int, build):
    """``build()`` over the plain world of ``world`` ranks seen from ``index``, on torch's fake
    backend (one process stands in for any rank); the default group is destroyed afterwards."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    dist.init_process_group("fake", store=FakeStore(), rank=index, world_size=world)
    try:
        return build()
    finally:
        dist.destroy_process_group()


PD_DEGREES = ("dp_replicate", "dp_shard", "tp")


def parallel_dims(sizes, world: int):
    degrees = dict(
        dp_replicate=sizes["dp_replicate"], dp_shard=sizes["dp_shard"], cp=1, tp=sizes["tp"], pp=1, ep=1, etp=1
    )
    pd = rankmesh.ParallelDims(**degrees, world_size=world)
    pd.build_mesh("cpu")
    return pd


def pd_members(pd) -> dict[str, list[int]]:
    """Every one-dimensional mesh of a ParallelDims build: its ranks in mesh order."""
    return {n: m.mesh.flatten().tolist() for n, m in pd.get_all_one_dimensional_meshes().items()}


def check_parallel_dims(sizes, rank_map, index, oracle) -> dict:
    """``rankmesh.ParallelDims(...).build_mesh()`` over the re-formed world: each one-dimensional
    mesh holds the oracle's mesh indices (the same build over the plain world at ``index``, fake
    backend) mapped through ``rank_map``; every real group all-reduces to its members' sum (the
    dims ParallelDims leaves fake, size 1 or unused, e.g. ``batch``, are compared as meshes only)."""
    pd = parallel_dims(sizes, len(rank_map))
    assert sorted(pd.get_all_one_dimensional_meshes()) == sorted(oracle)
    reduced, fake = 0, []
    for name, mesh in pd.get_all_one_dimensional_meshes().items():
        members = oracle[name]
        want = [rank_map[i] for i in members]
        assert mesh.mesh.flatten().tolist() == want, (name, mesh.mesh.tolist(), want)
        group = mesh.get_group()
        if dist.get_backend(group) == "fake":
            fake.append(name)
            continue
        assert dist.get_process_group_ranks(group) == sorted(want), (name, dist.get_process_group_ranks(group))
        reduce_over(group, sorted(want), members, index, name)
        reduced += 1
    return {"reduced": reduced, "fake": sorted(fake), "names": sorted(oracle)}


def megatron_groups() -> dict[str, object]:
    """Every process group parallel_state holds or answers, by state name / accessor."""
    from tests.mp import megatron_snapshot as snap

    out = {}
    ps = snap.ps
    for name in snap._state_names():
        value = getattr(ps, name)
        if isinstance(value, dist.ProcessGroup):
            out[name] = value
    for name, kw in snap._accessor_calls():
        try:
            value = getattr(ps, name)(**kw)
        except Exception:  # noqa: BLE001 - not a group on this configuration
            continue
        if isinstance(value, dist.ProcessGroup):
            out[name + "".join(f",{k}={v}" for k, v in kw.items())] = value
    return out


def megatron_oracle() -> dict:
    """megatron-core's own ``initialize_model_parallel`` (the oracle) on the fake world: every
    group's ranks, and the pipeline stage."""
    from megatron.core import parallel_state as ps

    from tests.mp import megatron_snapshot as snap

    ps.initialize_model_parallel(**MEGATRON)
    try:
        groups = {k: dist.get_process_group_ranks(g) for k, g in megatron_groups().items()}
        return {"groups": groups, "pp_rank": ps.get_pipeline_model_parallel_rank()}
    finally:
        ps.destroy_model_parallel()
        snap.reset()


def check_megatron(rank_map, index, oracle) -> dict:
    """``rankmesh.megatron.initialize_model_parallel`` over the re-formed world: every group
    parallel_state holds or answers is megatron-core's group at ``index`` mapped through
    ``rank_map``; each distinct one all-reduces to its members' sum."""
    import rankmesh.megatron as rm
    from megatron.core import parallel_state as ps

    from tests.mp import megatron_snapshot as snap

    rm.initialize_model_parallel(**MEGATRON)
    try:
        groups = megatron_groups()
        assert sorted(groups) == sorted(oracle["groups"]), (sorted(groups), sorted(oracle["groups"]))
        done: dict[int, list[int]] = {}
        for key, group in groups.items():
            members = oracle["groups"][key]
            want = sorted(rank_map[i] for i in members)
            assert dist.get_process_group_ranks(group) == want, (key, dist.get_process_group_ranks(group), want)
            if id(group) not in done:
                reduce_over(group, want, members, index, key)
                done[id(group)] = want
        pp = ps.get_pipeline_model_parallel_rank()
        return {"groups": len(groups), "reduced": len(done), "pp_rank": pp, "pp_stage_of_index": oracle["pp_rank"]}
    finally:
        rm.destroy_model_parallel()
        snap.reset()


def train(sizes) -> dict:
    """One FSDP2 + TP step on the plain tree (``parallelize_module`` on tp, ``fully_shard`` on
    (dp_replicate, dp_shard)); the batch is the dp coordinate's (tests/mp/worker.batch_for).
    Returns the loss, the updated parameters, and whether they equal plain SGD on one process."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh, _ = plain_tree(sizes)
    hsdp = mesh["dp_replicate", "dp_shard"]
    model = make_mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=hsdp)
    coord = hsdp.get_coordinate()
    dp_index = coord[0] * hsdp.size(1) + coord[1]
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss = model(batch_for(dp_index)).pow(2).mean()
    loss.backward()
    opt.step()
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
        for k, v in model.state_dict().items()
    }
    compare(state, reference_step(hsdp.size(), LR))  # also plain SGD on one process
    return {
        "dp_index": int(dp_index),
        "loss": float(loss.item()),
        "params": {k: v.flatten().tolist() for k, v in state.items()},
    }


# -- the cases ----------------------------------------------------------------------------------


def teardown(groups: list) -> dict:
    """``destroy_process_group()`` on the broken gen 0, and its groups freed at once: gloo closes a
    group's sockets only when the group object dies (``shutdown()``, which destroy calls, does
    not), and those closed sockets are what make the peers still waiting on this rank raise at
    once instead of at the gloo timeout. ``groups``: weak references to gen 0's groups; returns
    how many outlived destroy + ``gc.collect()`` (``held``) and how many outlived the workaround
    (``left_open``)."""
    t = time.monotonic()
    dist.destroy_process_group()
    destroy_s = time.monotonic() - t
    gc.collect()  # meshes and their groups sit in reference cycles
    held = sum(g() is not None for g in groups)
    return {"destroy_s": destroy_s, "held": held, "left_open": held}


def gen0(rec: Recorder, store, rank: int, world: int) -> tuple[dict, list]:
    """Gen 0 until a collective raises; returns what was noticed and weak references to every
    group this rank held."""
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("gen0", store), rank=rank, world_size=world, timeout=timedelta(PG_TIMEOUT_S)
    )
    mesh, dims = plain_tree(PLAIN_SIZES)  # every rank calls it; the spare is no member
    member = mesh.get_coordinate() is not None
    groups = []
    if member:
        rank_map = list(range(8))
        info = check_plain(PLAIN_SIZES, rank_map, rank)
        groups = [sub.get_group() for sub, _ in dims.values()]
    else:
        info = {"member": False}
    rec.write("gen0_meshes", True, at=time.time(), **info)
    store.add("gen0/midway", 1)
    steps, t0 = 0, time.monotonic()
    try:
        while True:
            for g in groups:
                dist.all_reduce(torch.ones(64), group=g)
            dist.all_reduce(torch.ones(64))
            steps += 1
            if time.monotonic() - t0 > STEP_DEADLINE_S:
                raise AssertionError(f"no collective raised within {STEP_DEADLINE_S} s of steps")
            time.sleep(0.02)
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the failure being tested
        noticed = time.time()
        killed = store.get("killed_at").decode() if store.check(["killed_at"]) else None
        refs = [weakref.ref(g) for g in [dist.group.WORLD, *groups]]
        return {
            "steps": steps,
            "error": f"{type(e).__name__}: {str(e)[:300]}",
            "after_kill_s": None if killed is None else noticed - float(killed),
        }, refs


def reform(args, rec: Recorder, store) -> int:
    rank, world = args.rank, args.world
    noticed, refs = gen0(rec, store, rank, world)
    store.set(f"gen0/alive/{rank}", "1")  # first: a teardown that holds the GIL may stall the heartbeat
    rec.write("detected", True, at=time.time(), **noticed)
    t = time.monotonic()
    freed = teardown(refs)
    rec.write("teardown", True, seconds=time.monotonic() - t, at=time.time(), **freed)

    t = time.monotonic()
    failed, decider = agree(store, rank, world, "gen0")
    rec.write("agreed", True, failed=failed, decider=decider, seconds=time.monotonic() - t, at=time.time())
    if args.case == "hot_spare":
        plan: Reform = hot_spare(world, failed=failed, mesh_size=8)
    else:
        plan = shrink(PLAIN_SIZES, failed=failed, old_world_size=world)
    new = plan.new_rank(rank)
    if new is None:
        rec.write("left", True, world_size=plan.world_size, at=time.time())
        return 0
    sizes = plan.sizes or PLAIN_SIZES
    m = plan.world.rank_map()
    rank_map = list(range(plan.world_size)) if m is None else [int(x) for x in m]
    index = rank_map.index(new)

    # the oracles: the same trees over the plain world at this rank's mesh index (fake backend)
    pd_oracle = fake_oracle(plan.world_size, index, lambda: pd_members(parallel_dims(sizes, plan.world_size)))
    mg_oracle = None
    if args.case == "hot_spare" and megatron_available():
        mg_oracle = fake_oracle(plan.world_size, index, megatron_oracle)

    t = time.monotonic()
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("gen1", store),
        rank=new,
        world_size=plan.world_size,
        timeout=timedelta(PG_TIMEOUT_S),
    )
    plan.check(timeout=CHECK_TIMEOUT_S)
    plan.activate()
    rec.write(
        "gen1",
        True,
        new_rank=new,
        index=index,
        world_size=plan.world_size,
        sizes=sizes,
        rank_map=rank_map,
        seconds=time.monotonic() - t,
        at=time.time(),
    )
    rec.run("tree_plain", check_plain, sizes, rank_map, index)
    rec.run("tree_parallel_dims", check_parallel_dims, sizes, rank_map, index, pd_oracle)
    if mg_oracle is not None:
        rec.run("tree_megatron", check_megatron, rank_map, index, mg_oracle)
    rec.run("order", order_facts, sizes, rank_map, index)
    rec.run("train", lambda: {"index": index, **train(sizes)})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def reference(args, rec: Recorder, store) -> int:
    """The uninterrupted run of ``--sizes`` on ``--world`` ranks: the same ``train``."""
    sizes = json.loads(args.sizes)
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore("ref", store),
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(PG_TIMEOUT_S),
    )
    rec.run("train", lambda: {"index": args.rank, **train(sizes)})
    dist.barrier()
    dist.destroy_process_group()
    return 0


def megatron_available() -> bool:
    try:
        import megatron.core.parallel_state  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["hot_spare", "shrink", "reference"])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default=json.dumps(PLAIN_SIZES))
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    rec = Recorder(args.out, args.rank)
    store = connect(args.port)
    beat = Heartbeat(args.port, args.rank)
    beat.start()
    # Imported before gen 0, not during the re-form; then the start-up heap is frozen, so that the
    # teardown's gc.collect() scans only what gen 0 made (a full collection takes seconds here).
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401

    if args.case == "hot_spare":
        megatron_available()
    gc.freeze()
    rec.write("start", True, pid=os.getpid(), torch=torch.__version__, at=time.time())
    code = 1
    try:
        code = (reference if args.case == "reference" else reform)(args, rec, store)
        rec.write("end", True, at=time.time())
    except Exception as e:  # noqa: BLE001 - reported to the test
        rec.write("end", False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())
    finally:
        beat.halt.set()
        beat.join(timeout=5)
        sys.stdout.flush()
        sys.stderr.flush()
    # No interpreter teardown: nothing left to destroy, and gloo's destructors have nothing to add.
    os._exit(code)


if __name__ == "__main__":
    main()
