"""Real gloo process groups on CPU via torchrun: 8 ranks on one node, and 8 ranks as two torchrun
"nodes" on loopback (c10d rendezvous). The ranks run tests/mp/worker.py (``torchrun ... -m
tests.mp.worker`` from the repository root), which records one JSON line per check and rank;
each test here asserts one check on all 8 ranks: all_reduce over every group, DTensor on the
dense/HSDP meshes, FSDP2 on HSDP (also with TP, and on a size-1 fake efsdp), and
check_consistency raising ConfigMismatchError / ConsistencyTimeoutError everywhere.

Every launch has a hard deadline (the whole process group is killed past it), so a hang fails
the test instead of blocking CI.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

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
    "mismatch",
    "timeout",
    "end",
]


@pytest.fixture(scope="module")
def single_node(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp_single")
    cmd = mp.torchrun() + [
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        *mp.worker_args(mp.WORKER, "--out", str(out)),
    ]
    log = mp.launch([cmd], out, LAUNCH_TIMEOUT_S, GLOO_ENV)
    return mp.results(out), log


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp_two_nodes")
    port = mp.free_port()
    cmds = []
    for node in (0, 1):
        cmds.append(
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
                *mp.worker_args(mp.WORKER, "--out", str(out)),
            ]
        )
    log = mp.launch(cmds, out, LAUNCH_TIMEOUT_S, GLOO_ENV)
    return mp.results(out), log


@pytest.mark.parametrize("check", CHECKS)
def test_single_node(single_node, check):
    got = mp.assert_check(*single_node, check, WORLD)
    _extra_asserts(check, got)


@pytest.mark.parametrize("check", CHECKS)
def test_two_nodes(two_nodes, check):
    got = mp.assert_check(*two_nodes, check, WORLD)
    _extra_asserts(check, got)


def test_two_nodes_really_are_two_agents(two_nodes):
    got = mp.assert_check(*two_nodes, "start", WORLD)
    assert sorted(d["local_rank"] for d in got.values()) == [0, 0, 1, 1, 2, 2, 3, 3]


def _extra_asserts(check: str, got: dict[int, dict]) -> None:
    if check.startswith("build_"):
        reports = {json.dumps(d["report"], sort_keys=True) for d in got.values()}
        assert len(reports) == 1, reports  # the same numbers on every rank
        rep = got[0]["report"]
        assert rep["method"] == "new_group"
        if check == "build_A":
            # dp_replicate=2, dp_shard=2, tp=2: real groups for tp, loss (batch x cp),
            # dp_replicate and fsdp; batch and efsdp (ep == 1) are fake, as are the size-1 dims
            # (pp, cp, ep, etp), one fake group per dim name.
            assert rep["real"] == 4, rep
            assert rep["by_backend"] == {"gloo": 4, "fake": 6}, rep
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
