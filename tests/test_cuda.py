"""CUDA / NCCL: the ``split_group`` path (default group bound to a device). Skipped without GPUs.

``test_local_gpus`` runs tests/mp/worker.py (``-m tests.mp.worker``) under torchrun with one rank per visible GPU:
``init_process_group("nccl", device_id=cuda:<local_rank>)`` (eager NCCL init, so rankmesh makes
every real group with ``split_group``), then ParallelDims meshes, all_reduce over every group,
DTensor, FSDP2 on HSDP and check_consistency (mismatch and timeout) on NCCL. With one GPU only
the single-rank paths run (every dim is world-sized or size 1).

On a multi-node CUDA cluster, run the same worker with torchrun on every node, writing to a
directory every node can reach, then check the results from any node::

    # from the repository root on each of NNODES nodes (NODE_RANK = 0 .. NNODES-1; MASTER_ADDR = node 0's address)
    torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node $GPUS_PER_NODE \\
        --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 --rdzv-id rankmesh-cuda \\
        -m tests.mp.worker --device cuda --out /shared/rankmesh-cuda

    # then, anywhere:
    RANKMESH_CUDA_RESULTS=/shared/rankmesh-cuda RANKMESH_CUDA_WORLD=$((NNODES * GPUS_PER_NODE)) \\
        python -m pytest tests/test_cuda.py -m cuda -k cluster

(Use an empty ``--out`` directory per run: the worker appends to ``rank<r>.jsonl``.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.mp import rankmesh_mp as mp

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.cuda

LAUNCH_TIMEOUT_S = 420


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_gpu = pytest.mark.skipif(
    _gpus() == 0 or not dist.is_available() or not dist.is_nccl_available(),
    reason="needs CUDA GPUs and NCCL",
)


def required_checks(world: int) -> list[str]:
    """Checks tests/mp/worker.py always runs for a world of `world` GPUs (it runs more, e.g.
    FSDP2, where the world allows; every check any rank recorded must pass on every rank)."""
    checks = ["start", "build_A", "groups_A", "dtensor_A"]
    if world > 1:
        checks += ["mismatch", "timeout"]
    return checks + ["end"]


def assert_results(res, log: str, world: int) -> None:
    missing = [c for c in required_checks(world) if c not in res]
    assert not missing, f"checks never reported: {missing}; output:\n{log}"
    for check in sorted(res):
        got = mp.assert_check(res, log, check, world)
        if check.startswith("build_"):
            reports = {json.dumps(d["report"], sort_keys=True) for d in got.values()}
            assert len(reports) == 1, reports
            rep = got[0]["report"]
            assert rep["method"] == "split_group", rep
            assert set(rep["by_backend"]) <= {"nccl", "fake"}, rep
        if check == "mismatch":
            assert all(d["raised"] == "ConfigMismatchError" for d in got.values())
        if check == "timeout":
            odd = min(3, world - 1)
            for r, d in got.items():
                assert d.get("skipped") if r == odd else d["raised"] == "ConsistencyTimeoutError"


@needs_gpu
def test_local_gpus(tmp_path):
    world = _gpus()
    cmd = mp.torchrun() + ["--standalone", "--nproc-per-node", str(world)]
    cmd += mp.worker_args(mp.WORKER, "--device", "cuda", "--out", str(tmp_path))
    log = mp.launch([cmd], tmp_path, LAUNCH_TIMEOUT_S)
    assert_results(mp.results(tmp_path), log, world)


@needs_gpu
def test_eager_nccl_single_process_mesh():
    """In-process, world of 1: the builder picks split_group, and the meshes work on CUDA."""
    from rankmesh.parallel_dims import ParallelDims

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(mp.free_port()))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    try:
        pd = ParallelDims(1, 1, 1, 1, 1, 1, 1, 1)
        world = pd.build_mesh(device_type="cuda", check_consistency=True, consistency_timeout=60)
        assert world.device_type == "cuda"
        assert pd.build_report.method == "split_group"
        t = torch.ones(1, device=device)
        dist.all_reduce(t, group=world.get_group())
        assert t.item() == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif("RANKMESH_CUDA_RESULTS" not in os.environ, reason="set RANKMESH_CUDA_RESULTS (see docstring)")
def test_cluster_results():
    """Checks the results of a multi-node run (see the module docstring)."""
    out = Path(os.environ["RANKMESH_CUDA_RESULTS"])
    res = mp.results(out)
    world = int(os.environ.get("RANKMESH_CUDA_WORLD", len(res.get("start", {}))))
    assert world > 0, f"no results under {out}"
    assert_results(res, f"(results read from {out})", world)
