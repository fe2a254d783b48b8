"""One rank of the DeepSpeed pipeline test (torchrun as ``-m tests.mp.deepspeed_worker`` from the
repository root, 8 ranks, gloo on CPU; see tests/test_deepspeed_mp.py). It runs as a job runs:
with or without ``RANKMESH_ACCELERATE=1`` in its environment, nothing else differs.

Checks, one JSON line each (``<out>/rank<r>.jsonl``):

- ``grid``: ``PipelineParallelGrid`` over pipe 2 x data 2 x model 2, as ``PipelineModule`` builds it;
  everything DeepSpeed reads of it (tests/deepspeed_pipe.py), and which patches are in place;
- ``reduce``: all_reduce(rank + 1) over each of its four groups gives the sum over the group's ranks;
- ``train``: a 4-layer ``PipelineModule`` (pipe 2 x data 4) trained for two batches by DeepSpeed's
  pipeline engine: the losses and a checksum of this rank's parameters after the steps.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from tests.mp.worker import Recorder, assert_reduces


def grid_check() -> dict:
    from rankmesh import patches

    from tests import deepspeed_pipe as dp

    grid = dp.build({"kind": "pmd", "num_pp": 2, "num_mp": 2, "num_dp": 2})
    rec = dp.record(grid, [0, 7, dist.get_rank()], full=True)
    rec = {k: repr(v) for k, v in rec.items()}
    return {"record": rec, "patches": sorted(n for n in patches.installed() if n.startswith("deepspeed"))}


def reduce_check() -> dict:
    from tests import deepspeed_pipe as dp

    grid = dp.build({"kind": "pmd", "num_pp": 2, "num_mp": 2, "num_dp": 2})
    for name in ("ds_model_proc_group", "dp_proc_group", "pp_proc_group", "slice_proc_group"):
        pg = getattr(grid, name)
        assert_reduces(pg, dist.get_process_group_ranks(pg), name)
    return {"reduced": 4}


def train_check() -> dict:
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8) for _ in range(4)]
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    g = torch.Generator().manual_seed(1234 + engine.grid.data_parallel_id)
    batches = [(torch.randn(1, 8, generator=g), torch.randn(1, 8, generator=g)) for _ in range(8)]
    it = iter(batches)
    losses = [float(engine.train_batch(data_iter=it)) for _ in range(2)]
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    return {"losses": losses, "checksum": checksum, "stage": engine.stage_id}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import deepspeed
    import deepspeed.ops

    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False  # no JIT build
    deepspeed.init_distributed(dist_backend="gloo")
    rec = Recorder(args.out, dist.get_rank())
    rec.run("grid", grid_check)
    rec.run("reduce", reduce_check)
    rec.run("train", train_check)
    dist.barrier()
    rec.write("end", True, accelerate=os.environ.get("RANKMESH_ACCELERATE"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
