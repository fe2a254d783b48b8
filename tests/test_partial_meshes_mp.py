"""Meshes over part of the world and from existing groups on 8 real gloo ranks (torchrun, one
node), on the new_group path and, on torch 2.15, the split_group path (gloo bound to the CPU):
tests/mp/partial_worker.py runs the checks; each test here asserts one of them on every rank.
Every launch has a hard deadline, so a hang fails instead of blocking CI.
"""

from __future__ import annotations

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
CHECKS = ["kd", "kd_step", "rl", "ep_stage", "strided", "from_group", "later", "end"]


def _launch(out, device: str):
    cmd = mp.torchrun() + ["--standalone", "--nproc-per-node", str(WORLD)]
    cmd += mp.worker_args("tests.mp.partial_worker", "--out", str(out), "--device", device)
    log = mp.launch([cmd], out, 240, {"GLOO_SOCKET_IFNAME": "lo"})
    return mp.results(out), log


@pytest.fixture(scope="module")
def new_group_path(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("partial_new_group"), "cpu")


@pytest.fixture(scope="module")
def split_path(tmp_path_factory):
    if TORCH_VERSION < (2, 15):
        pytest.skip(f"gloo's split_group on a CPU-bound default group needs torch 2.15 (this is {torch.__version__})")
    return _launch(tmp_path_factory.mktemp("partial_split"), "cpu-bound")


@pytest.mark.parametrize("check", CHECKS)
def test_new_group_path(new_group_path, check):
    res, log = new_group_path
    got = mp.assert_check(res, log, check, WORLD)
    if check == "kd":
        assert [got[r]["students"]["member"] for r in range(WORLD)] == [True] * 4 + [False] * 4
    if check == "later":  # the user's own group after rankmesh's: one name on every rank
        assert len({got[r]["name"] for r in range(WORLD)}) == 1


@pytest.mark.parametrize("check", CHECKS)
def test_split_path(split_path, check):
    res, log = split_path
    got = mp.assert_check(res, log, check, WORLD)
    if check == "later":
        assert len({got[r]["name"] for r in range(WORLD)}) == 1
