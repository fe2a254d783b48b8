"""Real gloo process groups on CPU via torchrun: 8 ranks on one node, and 8 ranks as two torchrun
"nodes" on loopback (c10d rendezvous). The ranks run tests/mp/worker.py (``torchrun ... -m
tests.mp.worker`` from the repository root), which records one JSON line per check and rank;
each test here asserts one check on all 8 ranks: all_reduce over every group, DTensor on the
dense/HSDP meshes, FSDP2 on HSDP (also with TP, and on a size-1 fake efsdp), and
check_consistency raising ConfigMismatchError / ConsistencyTimeoutError everywhere. Each runs on
the new_group path (plain gloo) and, on torch 2.15, again on the split_group path (gloo bound to
the CPU with ``device_id=cpu:0``, so every real group is a gloo split made by rankmesh).

Every launch has a hard deadline (the whole process group is killed past it), so a hang fails
the test instead of blocking CI.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rankmesh._torch_compat import TORCH_VERSION  # noqa: E402

from tests.mp import rankmesh_mp as mp  # noqa: E402

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]

WORLD = 8
LAUNCH_TIMEOUT_S = 240  # per launch; a healthy one takes ~25 s on 2 cores
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "lo"}

CHECKS = [
    "build_A",
    "groups_A",
    "dtensor_A",
    "fsdp_hsdp_A",
    "fsdp_tp",
    "build_B",
    "groups_B",
    "dtensor_B",
    "fsdp_hsdp_B",
    "fsdp_efsdp",
    "build_C",
    "groups_C",
    "dtensor_C",
    "later_groups",
    "mismatch",
    "timeout",
    "end",
]


def _launch(out, nodes: int, device: str = "cpu"):
    """8 ranks of tests/mp/worker.py on ``nodes`` torchrun agents (1: --standalone; 2: c10d
    rendezvous on loopback); ``device`` is the worker's ``--device``."""
    worker = mp.worker_args(mp.WORKER, "--out", str(out), "--device", device)
    if nodes == 1:
        cmds = [mp.torchrun() + ["--standalone", "--nproc-per-node", str(WORLD), *worker]]
    else:
        port = mp.free_port()
        cmds = [
            mp.torchrun()
            + [
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                str(WORLD // 2),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                f"rankmesh-test-{port}",
                "--rdzv-conf",
                f"is_host={1 if node == 0 else 0}",
                "--local-addr",
                "127.0.0.1",
                *worker,
            ]
            for node in (0, 1)
        ]
    log = mp.launch(cmds, out, LAUNCH_TIMEOUT_S, GLOO_ENV)
    return mp.results(out), log


@pytest.fixture(scope="module")
def single_node(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("mp_single"), 1)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("mp_two_nodes"), 2)


# The split_group path on real groups: gloo bound to the CPU (``device_id=cpu:0``) splits on
# torch 2.15; torch 2.13's split_group needs an accelerator.
needs_gloo_split = pytest.mark.skipif(
    TORCH_VERSION < (2, 15),
    reason=f"gloo's split_group on a CPU-bound default group needs torch 2.15 (this is {torch.__version__})",
)


@pytest.fixture(scope="module")
def single_node_split(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("mp_single_split"), 1, "cpu-bound")


@pytest.fixture(scope="module")
def two_nodes_split(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("mp_two_nodes_split"), 2, "cpu-bound")


@pytest.mark.parametrize("check", CHECKS)
def test_single_node(single_node, check):
    got = mp.assert_check(*single_node, check, WORLD)
    _extra_asserts(check, got)


@pytest.mark.parametrize("check", CHECKS)
def test_two_nodes(two_nodes, check):
    got = mp.assert_check(*two_nodes, check, WORLD)
    _extra_asserts(check, got)


@needs_gloo_split
@pytest.mark.parametrize("check", CHECKS)
def test_single_node_split_path(single_node_split, check):
    got = mp.assert_check(*single_node_split, check, WORLD)
    _extra_asserts(check, got, method="split_group")


@needs_gloo_split
@pytest.mark.parametrize("check", CHECKS)
def test_two_nodes_split_path(two_nodes_split, check):
    got = mp.assert_check(*two_nodes_split, check, WORLD)
    _extra_asserts(check, got, method="split_group")


@needs_gloo_split
def test_split_path_groups_are_rankmeshs_own_splits(single_node_split, two_nodes_split):
    """On both launches every rank passed the start-up probe: the real gloo groups above were
    split by rankmesh (rankmesh._fast_groups.split_member_group), not by torch's split_group."""
    for launch in (single_node_split, two_nodes_split):
        got = mp.assert_check(*launch, "fast_groups", WORLD)
        assert all(d["bound"] and d["fast_split"] for d in got.values()), got


def test_new_group_path_groups_are_rankmeshs_own(single_node, two_nodes):
    for launch in (single_node, two_nodes):
        got = mp.assert_check(*launch, "fast_groups", WORLD)
        assert all(not d["bound"] and d["fast_new_group"] for d in got.values()), got


def test_two_nodes_really_are_two_agents(two_nodes):
    got = mp.assert_check(*two_nodes, "start", WORLD)
    assert sorted(d["local_rank"] for d in got.values()) == [0, 0, 1, 1, 2, 2, 3, 3]


def _extra_asserts(check: str, got: dict[int, dict], method: str = "new_group") -> None:
    if check.startswith("build_"):
        reports = {json.dumps(d["report"], sort_keys=True) for d in got.values()}
        assert len(reports) == 1, reports  # the same numbers on every rank
        rep = got[0]["report"]
        assert rep["method"] == method
        if check == "build_A":
            # dp_replicate=2, dp_shard=2, tp=2: real groups for tp, loss (batch x cp),
            # dp_replicate and fsdp; batch and efsdp (ep == 1) are fake, as are the size-1 dims
            # (pp, cp, ep, etp), one fake group per dim name.
            assert rep["real"] == 4, rep
            assert rep["by_backend"] == {"gloo": 4, "fake": 6}, rep
    if check == "later_groups":  # torch's counter and names in step on every rank after rankmesh's groups
        assert len({d["count_before"] for d in got.values()}) == 1, got
        assert len({d["everyone"] for d in got.values()}) == 1, got
        assert len({d["half"] for r, d in got.items() if r % 2 == 0}) == 1, got
    if check == "mismatch":
        for d in got.values():
            assert d["raised"] == "ConfigMismatchError"
            assert "rank 3" in d["message"], d["message"]
    if check == "timeout":
        for r, d in got.items():
            if r == 3:
                assert d.get("skipped")
            else:
                assert d["raised"] == "ConsistencyTimeoutError"
                assert d["took"] < 60
