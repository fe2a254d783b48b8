"""CUDA / NCCL: the ``split_group`` path (default group bound to a device). Skipped without GPUs.

``test_local_gpus`` runs tests/mp/worker.py (``-m tests.mp.worker``) under torchrun with one rank per visible GPU:
``init_process_group("nccl", device_id=cuda:<local_rank>)`` (eager NCCL init, so rankmesh makes
every real group with ``split_group``), then ParallelDims meshes, all_reduce over every group,
DTensor, FSDP2 on HSDP and check_consistency (mismatch and timeout) on NCCL. With one GPU only
the single-rank paths run there: every dim of a 1-rank world is world-sized (the default group)
or size 1 (fake), so no ``split_group`` happens. ``test_split_group_really_runs_on_one_gpu``
covers that case: in a 1-rank NCCL world it asks for groups that are neither (a tag of their
own, a backend override with ``size_one_fake=False``, a one-member subset group), spies on
``dist.split_group`` and rankmesh's own split to see each made by a real split, and all-reduces
over them. Its body also runs without a GPU, on a fake backend whose default group is bound to ``cuda:0``
(``test_split_group_path_on_a_fake_one_rank_world``).

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

from tests.conftest import SPLITFAKE, fake_group_splits, fake_world
from tests.mp import rankmesh_mp as mp

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

LAUNCH_TIMEOUT_S = 420


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_gpu = pytest.mark.skipif(
    _gpus() == 0 or not dist.is_available() or not dist.is_nccl_available(),
    reason="needs CUDA GPUs and NCCL",
)


def _nccl_world_of_one(monkeypatch) -> torch.device:
    """A one-rank NCCL world with eager init (``device_id``: the default group is bound to cuda:0)."""
    monkeypatch.setenv("MASTER_ADDR", os.environ.get("MASTER_ADDR", "127.0.0.1"))
    monkeypatch.setenv("MASTER_PORT", os.environ.get("MASTER_PORT", str(mp.free_port())))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    return device


def split_groups_on_a_world_of_one(device: torch.device, monkeypatch) -> None:
    """In a one-rank world whose default group is bound to a device (MeshBuilder's split_group
    path), the groups that are not the default group even there: a world-sized dim with a tag
    of its own, a size-1 dim with a backend override (``size_one_fake=False``) and a one-member
    subset group. Each must come from a real split of the default group (spied on, not
    replaced) of the ranks ``[0]``: rankmesh's own (``rankmesh._fast_groups._split``, which calls
    the backend's ``ProcessGroup.split_group``) where its start-up probe passed, else torch's
    ``dist.split_group``. Each is a one-rank group on the default backend, and carries an
    all_reduce (tensors on ``device``); asking again gives the same groups without a new split."""
    from rankmesh import MeshLayout
    from rankmesh import _fast_groups as fg
    from rankmesh.process_groups import MeshBuilder

    calls = []
    default = dist.distributed_c10d._get_default_group()
    real_split_group, real_split = dist.split_group, fg._split

    def spy(*args, **kwargs):  # torch's split_group (the probe splits a one-rank fake parent: not counted)
        pg = real_split_group(*args, **kwargs)
        if kwargs.get("parent_pg") in (None, default):
            calls.append(("torch", kwargs.get("split_ranks"), pg))
        return pg

    def spy_own(parent, ranks, *args, **kwargs):
        pg = real_split(parent, ranks, *args, **kwargs)
        if parent is default:
            calls.append(("rankmesh", [ranks.tolist()], pg))
        return pg

    monkeypatch.setattr(dist, "split_group", spy)
    monkeypatch.setattr(fg, "_split", spy_own)
    backend = dist.get_backend(default)
    world = MeshLayout.world(1)
    mesh = world.unflatten("world", (1, 1), ("dp", "tp"))
    builder = MeshBuilder(world, device_type=device.type, size_one_fake=False)
    assert builder.method == "split_group"
    groups = [
        builder.process_group(world, "world", tag="own"),
        builder.process_group(mesh, "tp", backend=backend),
        builder.subset_group("solo", [0], name="solo", backend=backend),
    ]
    who = "rankmesh" if fg.uses_fast_split() else "torch"
    assert [(by, ranks) for by, ranks, _ in calls] == [(who, [[0]])] * 3, calls
    assert all(made is pg for (_, _, made), pg in zip(calls, groups, strict=True))
    report = builder.report()
    assert (report.method, report.real, report.fake, report.reused_default) == ("split_group", 3, 0, 0), report
    for pg in groups:
        assert pg is not default
        assert dist.get_process_group_ranks(pg) == [0] and dist.get_backend(pg) == backend
        t = torch.full((4,), 3.0, device=device)
        dist.all_reduce(t, group=pg)
        assert t.tolist() == [3.0] * 4
    assert builder.process_group(world, "world", tag="own") is groups[0]
    assert builder.subset_group("solo", [0], name="solo", backend=backend) is groups[2]
    assert len(calls) == 3


def required_checks(world: int) -> list[str]:
    """Checks tests/mp/worker.py always runs for a world of `world` GPUs (it runs more, e.g.
    FSDP2, where the world allows; every check any rank recorded must pass on every rank)."""
    checks = ["start", "build_A", "groups_A", "dtensor_A", "later_groups"]
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


@pytest.mark.cuda
@needs_gpu
def test_local_gpus(tmp_path):
    world = _gpus()
    cmd = mp.torchrun() + ["--standalone", "--nproc-per-node", str(world)]
    cmd += mp.worker_args(mp.WORKER, "--device", "cuda", "--out", str(tmp_path))
    log = mp.launch([cmd], tmp_path, LAUNCH_TIMEOUT_S)
    assert_results(mp.results(tmp_path), log, world)


@pytest.mark.cuda
@needs_gpu
def test_eager_nccl_single_process_mesh(monkeypatch):
    """In-process, world of 1: the builder picks split_group (though every dim here is the
    default group or fake, so none is split), and the meshes work on CUDA."""
    from rankmesh.torchtitan.parallel_dims import ParallelDims

    device = _nccl_world_of_one(monkeypatch)
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


@pytest.mark.cuda
@needs_gpu
def test_split_group_really_runs_on_one_gpu(monkeypatch):
    """A real NCCL split_group on a single GPU, which the mesh builds above never reach there."""
    device = _nccl_world_of_one(monkeypatch)
    try:
        split_groups_on_a_world_of_one(device, monkeypatch)
    finally:
        dist.destroy_process_group()


def test_split_group_path_on_a_fake_one_rank_world(monkeypatch):
    """The same body without a GPU: a one-rank world on the fake group (registered for cpu and
    cuda as ``meshfakesplit``) whose default group is bound to cuda:0, as ``device_id=`` binds
    it for NCCL, so MeshBuilder takes the split path and torch really runs split_group."""
    with fake_world(1, 0, SPLITFAKE) as default:
        if not fake_group_splits(default):
            pytest.skip(f"the fake backend of torch {torch.__version__} cannot split (2.15's can)")
        default.bound_device_id = torch.device("cuda", 0)
        split_groups_on_a_world_of_one(torch.device("cpu"), monkeypatch)


@pytest.mark.cuda
@pytest.mark.skipif("RANKMESH_CUDA_RESULTS" not in os.environ, reason="set RANKMESH_CUDA_RESULTS (see docstring)")
def test_cluster_results():
    """Checks the results of a multi-node run (see the module docstring)."""
    out = Path(os.environ["RANKMESH_CUDA_RESULTS"])
    res = mp.results(out)
    world = int(os.environ.get("RANKMESH_CUDA_WORLD", len(res.get("start", {}))))
    assert world > 0, f"no results under {out}"
    assert_results(res, f"(results read from {out})", world)
