"""One rank of the "time to a parallelised model" multi-process test (``torchrun ... -m
tests.mp.workload_worker`` from the repository root, 8 ranks, gloo on CPU; see
tests/test_workloads_mp.py).

Every rank runs :func:`rankmesh.bench.workloads.train_step` (FSDP2 + TP, one AdamW step on real
CPU tensors: dp_replicate 2 x fsdp 2 x tp 2) twice in the same gloo job: on stock torch's meshes
and on rankmesh's. Checks, one JSON line each (``<out>/rank<r>.jsonl``):

- ``step``: the loss, every gradient (``full_tensor()``) and every updated parameter of the two
  runs are equal, and so are the parameters' placements, mesh names and mesh ranks;
- ``fast``: the rankmesh run's meshes, including the ones FSDP2 concatenated, are rankmesh's.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch
import torch.distributed as dist

from tests.mp.worker import Recorder

DEGREES = dict(tp=2, fsdp=2)


def _snapshot(run) -> dict:
    from torch.distributed.tensor import DTensor

    grads, params, meshes = {}, {}, {}
    for name, p in run.model.named_parameters():
        assert isinstance(p, DTensor), name
        grads[name] = p.grad.full_tensor()
        params[name] = p.detach().full_tensor()
        meshes[name] = (p.device_mesh.mesh_dim_names, p.device_mesh.mesh.tolist(), p.device_mesh)
    return {"loss": run.extra["loss"], "grads": grads, "params": params, "meshes": meshes, "run": run}


def check_step(stock: dict, ours: dict) -> dict:
    assert ours["loss"] == stock["loss"], (ours["loss"], stock["loss"])
    assert ours["run"].extra["placements"] == stock["run"].extra["placements"]
    assert ours["grads"].keys() == stock["grads"].keys()
    for name in stock["grads"]:
        torch.testing.assert_close(ours["grads"][name], stock["grads"][name], rtol=0, atol=0, msg=name)
        torch.testing.assert_close(ours["params"][name], stock["params"][name], rtol=0, atol=0, msg=name)
        assert ours["meshes"][name][:2] == stock["meshes"][name][:2], name
    return {"loss": ours["loss"], "params": len(stock["grads"])}


def check_fast(ours: dict) -> dict:
    from rankmesh.mesh import FastDeviceMesh

    kinds = {name: type(m[2]).__name__ for name, m in ours["meshes"].items()}
    assert all(type(m[2]) is FastDeviceMesh for m in ours["meshes"].values()), kinds
    fsdp_meshes = [
        type(fp._spmd_mesh).__name__
        for module in ours["run"].model.modules()
        if hasattr(module, "_get_fsdp_state") and module._get_fsdp_state()._fsdp_param_group is not None
        for fp in module._get_fsdp_state()._fsdp_param_group.fsdp_params
        if getattr(fp, "_spmd_mesh", None) is not None
    ]
    assert fsdp_meshes and set(fsdp_meshes) == {"FastDeviceMesh"}, fsdp_meshes
    return {"fsdp_spmd_meshes": len(fsdp_meshes)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rec = Recorder(args.out, rank)
    rec.write("start", True, world=world)

    from rankmesh.bench.workloads import train_step

    try:
        stock = _snapshot(train_step("torch", world, **DEGREES))
        ours = _snapshot(train_step("rankmesh", world, **DEGREES))
    except Exception as e:  # noqa: BLE001 - reported to the test
        import traceback

        rec.write("step", False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())
    else:
        rec.run("step", check_step, stock, ours)
        rec.run("fast", check_fast, ours)
    dist.barrier()
    rec.write("end", True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
