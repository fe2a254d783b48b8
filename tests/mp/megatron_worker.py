"""One rank of the megatron-core multi-process test (torchrun as ``-m tests.mp.megatron_worker`` from
the repository root, 8 ranks, gloo on CPU; see tests/test_megatron_mp.py).

For each configuration every rank runs rankmesh's ``initialize_model_parallel`` (real gloo groups)
and snapshots ``parallel_state`` (tests/mp/megatron_snapshot.py); after all of them (and the grid)
it runs megatron-core's own for each and snapshots again. Checks, one JSON line each (``<out>/rank<r>.jsonl``):

- ``state_<cfg>``: the two snapshots are equal (every global and accessor, ranks and backends);
- ``reduce_<cfg>``: all_reduce(rank + 1) over every distinct process group rankmesh installed
  (gloo twins, embedding and expert groups included) gives the sum over the group's ranks;
- ``pgs_<cfg>``: process groups each call registered on this rank;
- ``grid``: HyperCommGrid.create_pg groups all-reduce over the right peers, also on a grid that
  leaves ranks out (rank_offset), after which a plain new_group still rendezvous (names in step).
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from tests.mp import megatron_snapshot as snap
from tests.mp.worker import Recorder, assert_reduces

CONFIGS = {
    "moe": dict(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        expert_model_parallel_size=2,
        expert_tensor_parallel_size=1,
        num_distributed_optimizer_instances=2,
        create_all_gather_group=True,
    ),
    "cp": dict(
        tensor_model_parallel_size=2,
        context_parallel_size=2,
        hierarchical_context_parallel_sizes=[2],
        hybrid_context_parallel=True,
    ),
    "pp4": dict(pipeline_model_parallel_size=4, order="tp-cp-ep-pp-dp", virtual_pipeline_model_parallel_size=2),
}


def distinct_groups(snapshot_pgs):
    out, seen = [], set()
    for pg in snapshot_pgs:
        if isinstance(pg, dist.ProcessGroup) and id(pg) not in seen:
            seen.add(id(pg))
            out.append(pg)
    return out


def installed_groups():
    from megatron.core import parallel_state as ps

    found = []
    for name in snap._state_names():
        value = getattr(ps, name)
        found.extend(value if isinstance(value, list) else value.values() if isinstance(value, dict) else [value])
    return distinct_groups(found)


def all_reduce_every_group(groups) -> dict:
    reduced = 0
    for pg in groups:
        ranks = dist.get_process_group_ranks(pg)
        assert_reduces(pg, ranks, ranks)
        reduced += 1
    return {"reduced": reduced}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rec = Recorder(args.out, rank)
    import rankmesh.megatron as rm
    from megatron.core import parallel_state as ps

    def one(fn, kw):
        before = len(c10d._world.pg_map)
        fn(**kw)
        return snap.snapshot(), len(c10d._world.pg_map) - before

    # rankmesh's calls first, megatron-core's after, and no process group destroyed in between:
    # torch 2.13 salts member-only group names with the number of groups this rank has
    # registered, which megatron-core's own call (every group on every rank, registered on
    # members only) leaves different on different ranks, and which destroying groups lowers, so
    # that a later group can take an earlier one's name and meet its stale rendezvous.
    ours = {}
    for cfg_name, kw in CONFIGS.items():
        ours[cfg_name] = one(rm.initialize_model_parallel, kw)
        rec.run(f"reduce_{cfg_name}", all_reduce_every_group, installed_groups())
        snap.reset()  # parallel_state forgets the groups; they stay registered with torch
        dist.barrier()

    def grid():
        os.environ.pop("WORLD_SIZE", None)  # torchrun sets it; the grid reads it first (8 here either way)
        full = rm.HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
        part = rm.HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=3)  # ranks 3..6 only
        groups = [full.create_pg("cp"), full.create_pg(["tp", "dp"])]
        groups += [part.create_pg("dp"), part.create_pg(["tp", "dp"])]
        assert (groups[2] is None) == (not 3 <= rank < 7)
        n = all_reduce_every_group([g for g in groups if g is not None])["reduced"]
        later = dist.new_group(list(range(8)), use_local_synchronization=True)  # names still agree
        n += all_reduce_every_group([later])["reduced"]
        return {"reduced": n}

    rec.run("grid", grid)
    dist.barrier()

    for cfg_name, kw in CONFIGS.items():
        stock, n_stock = one(ps.initialize_model_parallel, kw)
        ps.destroy_model_parallel()
        snap.reset()
        mine, n_ours = ours[cfg_name]

        def state():
            d = snap.diff(stock, mine)
            assert not d, d[:10]
            return {"keys": len(mine)}

        rec.run(f"state_{cfg_name}", state)
        rec.write(f"pgs_{cfg_name}", n_ours < n_stock, stock=n_stock, ours=n_ours)
    dist.barrier()
    rec.write("end", True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
