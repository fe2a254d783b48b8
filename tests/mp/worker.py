"""One rank of the multi-process tests (run by torchrun as ``-m tests.mp.worker`` from the
repository root; see tests/test_multiprocess.py and tests/test_cuda.py).

Gloo on CPU (``--device cpu``, 8 ranks) or NCCL on CUDA (``--device cuda``, any number of ranks,
default group bound to the device so groups come from ``split_group``). Every check appends one
JSON line ``{"check", "rank", "ok", ...}`` to ``<out>/rank<r>.jsonl``; the test reads them back.
The checks, in order (every rank runs the same sequence, SPMD):

- ``groups_<cfg>``: all_reduce(rank + 1) over every real group of every mesh gives the sum over its
  ranks, and the ranks are the ones torch's own layout rules give; fake groups are fake.
- ``dtensor_<cfg>``: distribute_tensor / full_tensor / redistribute / a reduction on the
  dense mesh and its HSDP submesh.
- ``fsdp_hsdp_<cfg>``: fully_shard on the HSDP mesh, one SGD step, equal to a local reference.
- ``fsdp_tp``: TP (parallelize_module on the ``tp`` mesh) + HSDP: FSDP2 concatenates meshes
  sliced from two different global meshes.
- ``fsdp_efsdp``: fully_shard on ``[dp_replicate, efsdp]`` with efsdp of size 1 (fake group).
- ``mismatch``: rank 3 has another config; build_mesh(check_consistency=True) raises
  ConfigMismatchError on every rank.
- ``timeout``: rank 3 never enters check_consistency; the others raise ConsistencyTimeoutError
  within the timeout. Last, since it leaves the default group unusable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from rankmesh.consistency import check_consistency
from rankmesh.errors import ConfigMismatchError, ConsistencyTimeoutError
from rankmesh.torchtitan.parallel_dims import ParallelDims

CONFIGS = {
    # 8 ranks: HSDP 2 x 2 with TP 2
    "A": dict(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1),
    # 8 ranks: MoE, ep 4 over fsdp x tp, efsdp of size 1 (fake), plus cp
    "B": dict(dp_replicate=2, dp_shard=1, cp=2, tp=2, pp=1, ep=4, etp=1),
    # 8 ranks: pipeline + etp = tp
    "C": dict(dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=2, ep=2, etp=2),
}

DEVICE = torch.device("cpu")


def configs_for(world: int) -> dict[str, dict[str, int]]:
    """CONFIGS for 8 ranks; otherwise configs that fit `world` (e.g. the GPUs of a CUDA run)."""
    if world == 8:
        return CONFIGS
    out = {"A": dict(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1)}
    if world % 4 == 0:
        out["A"] = dict(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, etp=1)
        out["B"] = dict(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=2, etp=1)
    elif world % 2 == 0:
        out["A"] = dict(dp_replicate=1, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, etp=1)
    return out


class Recorder:
    def __init__(self, out: str, rank: int) -> None:
        self.path = os.path.join(out, f"rank{rank}.jsonl")
        self.rank = rank

    def write(self, check: str, ok: bool, **info) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"check": check, "rank": self.rank, "ok": ok, **info}) + "\n")

    def run(self, check: str, fn, *args) -> None:
        t0 = time.perf_counter()
        try:
            info = fn(*args) or {}
            self.write(check, True, seconds=time.perf_counter() - t0, **info)
        except Exception as e:  # noqa: BLE001 - reported to the test
            self.write(check, False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())


def expected_group(world: int, sizes: dict[str, int], order: tuple[str, ...], names: tuple[str, ...], rank: int):
    """The ranks of `rank`'s group over `names` in a row-major mesh of `order` (numpy oracle)."""
    grid = np.arange(world).reshape([sizes[n] for n in order])
    coord = np.argwhere(grid == rank)[0]
    index = tuple(slice(None) if n in names else int(c) for n, c in zip(order, coord))
    sub = grid[index]
    # sub's axes are `names` in mesh order; flatten row-major
    return sorted(sub.reshape(-1).tolist())


def assert_reduces(group, ranks: list[int], what) -> None:
    """all_reduce(rank + 1) over ``group`` gives the sum over ``ranks``: the group talks to exactly
    those peers (+1 so that rank 0's part counts too)."""
    t = torch.tensor([float(dist.get_rank() + 1)], device=DEVICE)
    dist.all_reduce(t, group=group)
    want = sum(r + 1 for r in ranks)
    assert int(t.item()) == want, (what, t.item(), want)


def check_groups(pd: ParallelDims, cfg: dict[str, int]) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    deg = pd._degrees()
    fsdp = deg["fsdp"]
    orders = {
        "dataloading": ("pp", "batch", "cp", "tp"),
        "dense": ("pp", "dp_replicate", "fsdp", "tp"),
        "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
    }
    sizes = {**deg, "fsdp": fsdp}
    checked = fake = 0
    for gname, order in orders.items():
        mesh = pd._global_meshes[gname]
        assert mesh.mesh_dim_names == order, (mesh.mesh_dim_names, order)
        for i, name in enumerate(order):
            group = mesh.get_group(i)
            ranks = dist.get_process_group_ranks(group)
            want = expected_group(world, sizes, order, (name,), rank)
            assert ranks == want, (gname, name, ranks, want)
            assert mesh.get_local_rank(i) == want.index(rank)
            if dist.get_backend(group) == "fake":
                assert name == "batch" or not pd._mesh_exist(name, sizes[name]) or len(ranks) == 1, (gname, name)
                fake += 1
                continue
            assert_reduces(group, want, (gname, name))
            checked += 1
    # loss = flatten(batch, cp) of the dataloading mesh
    loss = pd.get_optional_mesh("loss")
    want = expected_group(world, sizes, orders["dataloading"], ("batch", "cp"), rank)
    if loss is not None:
        assert dist.get_process_group_ranks(loss.get_group()) == want
        assert_reduces(loss.get_group(), want, "loss")
        checked += 1
    report = pd.build_report
    return {"checked": checked, "fake": fake, "report": report.as_dict()}


def check_dtensor(pd: ParallelDims) -> dict:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    names = [n for n in ("dp_replicate", "fsdp", "tp") if pd.get_optional_mesh(n) is not None]
    if not names:
        return {"mesh": names}
    dense = pd.get_mesh(names)
    torch.manual_seed(0)
    full = torch.randn(8, 12).to(DEVICE)
    dt = distribute_tensor(full, dense, [Shard(0), Shard(1), Replicate()][: len(names)])
    assert torch.equal(dt.full_tensor(), full)
    assert torch.allclose(dt.sum().full_tensor(), full.sum(), atol=1e-5)
    rep = dt.redistribute(dense, [Replicate(), Replicate(), Shard(0)][-len(names) :])
    assert torch.equal(rep.full_tensor(), full)
    if pd.get_optional_mesh(["dp_replicate", "fsdp"]) is None:
        return {"mesh": names}
    hsdp = pd.get_mesh(["dp_replicate", "fsdp"])
    dt2 = distribute_tensor(full, hsdp, [Replicate(), Shard(0)])
    assert torch.equal(dt2.full_tensor(), full)
    assert dt2.to_local().shape == (8 // hsdp.size(1), 12)
    mm = (dt2 @ distribute_tensor(full.T.contiguous(), hsdp, [Replicate(), Replicate()])).full_tensor()
    assert torch.allclose(mm, full @ full.T, atol=1e-4)
    return {"mesh": names}


def make_mlp(seed: int = 1234) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(DEVICE)


def batch_for(dp_index: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + dp_index)
    return torch.randn(4, 16, generator=g).to(DEVICE)


def reference_step(dp_size: int, lr: float) -> dict[str, torch.Tensor]:
    """Plain SGD on one model, gradient = mean over the dp ranks' per-rank mean losses."""
    ref = make_mlp()
    ref.zero_grad()
    for i in range(dp_size):
        (ref(batch_for(i)).pow(2).mean() / dp_size).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= lr * p.grad
    return {k: v.detach().cpu().clone() for k, v in ref.state_dict().items()}


def train_step(model: nn.Module, dp_mesh, lr: float) -> dict[str, torch.Tensor]:
    coord = dp_mesh.get_coordinate()
    dp_index = coord[0] * dp_mesh.size(1) + coord[1] if dp_mesh.ndim == 2 else coord[0]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss = model(batch_for(dp_index)).pow(2).mean()
    loss.backward()
    opt.step()
    state = model.state_dict().items()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone() for k, v in state}


def compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys(), (got.keys(), want.keys())
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-4), (k, (got[k] - want[k]).abs().max())


def check_fsdp(pd: ParallelDims, dims: list[str]) -> dict:
    from torch.distributed.fsdp import fully_shard

    mesh = pd.get_mesh(dims)
    lr = 0.1
    model = make_mlp()
    fully_shard(model, mesh=mesh)
    got = train_step(model, mesh, lr)
    compare(got, reference_step(mesh.size(), lr))
    return {"mesh": list(mesh.shape)}


def check_fsdp_tp(pd: ParallelDims) -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = pd.get_mesh("tp")
    hsdp = pd.get_mesh(["dp_replicate", "fsdp"])
    lr = 0.1
    model = make_mlp()
    parallelize_module(model, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=hsdp)
    got = train_step(model, hsdp, lr)
    compare(got, reference_step(hsdp.size(), lr))
    return {}


def check_later_groups(rank: int, world: int) -> dict:
    """After rankmesh's groups, the user's own plain groups (``new_group`` called by every rank;
    on a bound default group the halves by ``split_group``) still meet: torch's group counter and
    names agree on every rank, and the groups carry an all_reduce among the right ranks."""
    count = dist.distributed_c10d._world.group_count
    everyone = dist.new_group(list(range(world)))
    halves = [h for h in ([r for r in range(world) if r % 2 == parity] for parity in (0, 1)) if h]
    if dist.distributed_c10d._get_default_group().bound_device_id is None:
        mine = [dist.new_group(h) for h in halves][rank % 2]
    else:  # a bound default group: the user's own split (new_group would NOCOLOR-split, which gloo lacks)
        mine = dist.split_group(split_ranks=halves)
    t = torch.ones(1, device=DEVICE)
    dist.all_reduce(t, group=everyone)
    u = torch.full((1,), float(rank), device=DEVICE)
    dist.all_reduce(u, group=mine)
    assert t.item() == world, t
    assert u.item() == sum(halves[rank % 2]), (u, halves[rank % 2])
    return {"count_before": count, "everyone": everyone.group_name, "half": mine.group_name}


def check_mismatch(rank: int) -> dict:
    world = dist.get_world_size()
    odd = min(3, world - 1)
    cfg = dict(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1)
    if rank == odd:
        cfg.update(dp_shard=1, pp=world)  # valid too, but a different mesh
    pd = ParallelDims(**cfg, world_size=world)
    t0 = time.perf_counter()
    try:
        pd.build_mesh(device_type=DEVICE.type, check_consistency=True, consistency_timeout=60)
    except ConfigMismatchError as e:
        assert e.fingerprint == pd.fingerprint
        assert e.min_fingerprint != e.max_fingerprint
        assert pd.build_report is None  # nothing was created
        return {"raised": type(e).__name__, "message": str(e), "took": time.perf_counter() - t0}
    raise AssertionError("build_mesh(check_consistency=True) did not raise")


def check_timeout(rank: int) -> dict:
    timeout = 3.0
    if rank == min(3, dist.get_world_size() - 1):
        time.sleep(timeout + 4)  # never enters the check
        return {"skipped": True}
    t0 = time.perf_counter()
    try:
        check_consistency(12345, timeout=timeout)
    except ConsistencyTimeoutError as e:
        took = time.perf_counter() - t0
        assert took < timeout + 30, took
        return {"raised": type(e).__name__, "message": str(e), "took": took}
    raise AssertionError("check_consistency did not time out")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cpu-bound", "cuda"])
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    global DEVICE
    if args.device == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        DEVICE = torch.device("cuda", local_rank)
        # eager NCCL init (bound device): rankmesh then creates groups with split_group
        dist.init_process_group("nccl", device_id=DEVICE)
    elif args.device == "cpu-bound":
        # gloo bound to the CPU (torch 2.15: gloo can split): rankmesh takes the split_group path
        dist.init_process_group("gloo", device_id=torch.device("cpu", 0))
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    rec = Recorder(args.out, rank)
    world = dist.get_world_size()
    rec.write("start", True, world=world, pid=os.getpid(), local_rank=int(os.environ.get("LOCAL_RANK", -1)))
    from rankmesh import _fast_groups

    bound = dist.distributed_c10d._get_default_group().bound_device_id is not None
    rec.write(
        "fast_groups",
        True,
        bound=bound,
        fast_split=_fast_groups.uses_fast_split() if bound else None,
        fast_new_group=None if bound else _fast_groups.uses_fast_path(None),
    )

    for name, cfg in configs_for(world).items():
        pd = ParallelDims(**cfg, world_size=world)
        try:
            pd.build_mesh(device_type=DEVICE.type, check_consistency=True, consistency_timeout=120)
            assert pd.build_mesh() is pd.world_mesh  # idempotent
        except Exception as e:  # noqa: BLE001
            rec.write(f"build_{name}", False, error=f"{type(e).__name__}: {e}", tb=traceback.format_exc())
            continue
        rec.write(f"build_{name}", True, report=pd.build_report.as_dict())
        rec.run(f"groups_{name}", check_groups, pd, cfg)
        rec.run(f"dtensor_{name}", check_dtensor, pd)
        if pd.dp_replicate > 1 and pd.get_optional_mesh(["dp_replicate", "fsdp"]) is not None:
            rec.run(f"fsdp_hsdp_{name}", check_fsdp, pd, ["dp_replicate", "fsdp"])
        if name == "A":
            rec.run("fsdp_tp", check_fsdp_tp, pd)
        if name == "B":
            rec.run("fsdp_efsdp", check_fsdp, pd, ["dp_replicate", "efsdp"])

    rec.run("later_groups", check_later_groups, rank, world)
    if world > 1:
        rec.run("mismatch", check_mismatch, rank)
        rec.run("timeout", check_timeout, rank)
    rec.write("end", True)
    sys.stdout.flush()
    sys.stderr.flush()
    # The timeout check leaves an all-reduce pending on the default group: don't tear it down.
    os._exit(0)


if __name__ == "__main__":
    main()
