"""One rank of the torchtitan 0.3.0 multi-process test (run by torchrun as ``-m tests.mp.titan_worker``
from the repository root, 8 ranks, gloo on CPU; see tests/test_torchtitan_mp.py).

For each ``spmd_backend`` every rank builds torchtitan's ``ParallelDims`` twice: stock (torch's
DeviceMesh, real gloo groups) and under ``rankmesh.torchtitan.accelerate()``. Checks, one JSON
line each (``<out>/rank<r>.jsonl``):

- ``groups_<backend>``: every 1-D mesh torchtitan hands out has the stock mesh's ranks and
  backend, and all_reduce(rank + 1) over each real group of the accelerated build gives the sum of
  the stock group's ranks (the groups talk to the right peers).
- ``fsdp_<backend>``: fully_shard on torchtitan's dense data-parallel mesh of the accelerated
  build, one SGD step, equal to a single-process reference.
- ``pgs_<backend>``: process groups each build created on this rank.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from tests.mp.worker import Recorder, assert_reduces, check_fsdp

CFG = dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=2)
DENSE_DP = {
    "spmd_types": ["dp_replicate", "dp_shard"],
    "full_dtensor": ["dp_replicate", "dp_shard"],
    "partial_dtensor": ["dp_replicate", "fsdp"],
}


def build(tpd, backend: str, accelerated: bool):
    import rankmesh.torchtitan as rt

    before = set(c10d._world.pg_map)
    pd = tpd.ParallelDims(**CFG, world_size=dist.get_world_size(), spmd_backend=backend)
    if accelerated:
        with rt.accelerate() as acc:
            assert acc.active, acc.reason
            pd.build_mesh()
    else:
        pd.build_mesh()
    return pd, [pg for pg in c10d._world.pg_map if pg not in before]


def check_groups(stock, ours) -> dict:
    from rankmesh.mesh import FastDeviceMesh

    assert type(ours.world_mesh) is FastDeviceMesh
    assert type(stock.world_mesh) is not FastDeviceMesh
    assert stock._single_axis_meshes.keys() == ours._single_axis_meshes.keys()
    reduced = {}
    for name, mesh in ours._single_axis_meshes.items():
        ref = stock._single_axis_meshes[name]
        assert mesh.mesh.tolist() == ref.mesh.tolist(), name
        pg, ref_pg = mesh.get_group(), ref.get_group()
        ranks = dist.get_process_group_ranks(ref_pg)
        assert dist.get_process_group_ranks(pg) == ranks, name
        assert dist.get_backend(pg) == dist.get_backend(ref_pg), (name, dist.get_backend(pg), dist.get_backend(ref_pg))
        if dist.get_backend(pg) == "fake":
            continue
        assert_reduces(pg, ranks, name)
        reduced[name] = len(ranks)
    assert sorted(ours.get_all_one_dimensional_meshes()) == sorted(stock.get_all_one_dimensional_meshes())
    return {"reduced": reduced}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rec = Recorder(args.out, rank)
    rec.write("start", True, world=dist.get_world_size())

    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (stock torchtitan's fake axes need it)
    import torchtitan.distributed.parallel_dims as tpd

    tpd.device_type = "cpu"  # torchtitan picks "cuda" when it finds no accelerator
    for backend in ("spmd_types", "partial_dtensor", "full_dtensor"):
        try:
            stock, stock_pgs = build(tpd, backend, accelerated=False)
            ours, our_pgs = build(tpd, backend, accelerated=True)
        except Exception as e:  # noqa: BLE001 - reported to the test
            import traceback

            rec.write(f"groups_{backend}", False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())
            continue
        rec.write(
            f"pgs_{backend}",
            True,
            stock=len(stock_pgs),
            ours=len(our_pgs),
            ours_real=sum(dist.get_backend(p) != "fake" for p in our_pgs),
        )
        rec.run(f"groups_{backend}", check_groups, stock, ours)
        rec.run(f"fsdp_{backend}", check_fsdp, ours, DENSE_DP[backend])
    dist.barrier()
    rec.write("end", True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
