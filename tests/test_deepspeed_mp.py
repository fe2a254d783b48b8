"""DeepSpeed's pipeline grid with real collectives: 8 gloo ranks on one node (torchrun) run
tests/mp/deepspeed_worker.py twice, as a job runs, once with ``RANKMESH_ACCELERATE=1`` and once
without: the grid answers alike, its groups all-reduce over the right peers, and DeepSpeed's own
pipeline engine trains a ``PipelineModule`` to the same losses and parameters.

Each launch has a hard deadline, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.mp import rankmesh_mp as mp

pytest.importorskip("deepspeed.runtime.pipe.topology", reason="DeepSpeed is a test dependency")

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]

WORLD = 8


def _launch(tmp_path_factory, accelerate: str | None):
    out = tmp_path_factory.mktemp(f"mp_deepspeed_{accelerate or 'stock'}")
    cmd = (
        mp.torchrun()
        + ["--standalone", "--nproc-per-node", str(WORLD)]
        + mp.worker_args(mp.DEEPSPEED_WORKER, "--out", str(out))
    )
    extra = {"GLOO_SOCKET_IFNAME": "lo", "DS_ACCELERATOR": "cpu"}
    if accelerate is not None:
        extra["RANKMESH_ACCELERATE"] = accelerate
    env_before = mp.os.environ.pop("RANKMESH_ACCELERATE", None)
    try:
        log = mp.launch([cmd], out, 300, extra)
    finally:
        if env_before is not None:
            mp.os.environ["RANKMESH_ACCELERATE"] = env_before
    return mp.results(out), log


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {"stock": _launch(tmp_path_factory, None), "switch": _launch(tmp_path_factory, "1")}


def test_the_switch_is_on_in_one_run_only(runs):
    stock = mp.assert_check(*runs["stock"], "grid", WORLD)
    switch = mp.assert_check(*runs["switch"], "grid", WORLD)
    assert all(d["patches"] == [] for d in stock.values())
    assert all(d["patches"] == ["deepspeed_grid", "deepspeed_groups", "deepspeed_topology"] for d in switch.values())


def test_every_rank_reads_the_same_grid_both_ways(runs):
    stock = mp.assert_check(*runs["stock"], "grid", WORLD)
    switch = mp.assert_check(*runs["switch"], "grid", WORLD)
    for rank in range(WORLD):
        assert switch[rank]["record"] == stock[rank]["record"], rank


@pytest.mark.parametrize("way", ["stock", "switch"])
def test_the_grids_groups_talk_to_their_peers(runs, way):
    mp.assert_check(*runs[way], "reduce", WORLD)


def test_deepspeeds_pipeline_engine_trains_to_the_same_losses_and_parameters(runs):
    stock = mp.assert_check(*runs["stock"], "train", WORLD)
    switch = mp.assert_check(*runs["switch"], "train", WORLD)
    for rank in range(WORLD):
        assert switch[rank] | {"seconds": 0} == stock[rank] | {"seconds": 0}, rank
    assert {d["stage"] for d in stock.values()} == {0, 1}


@pytest.mark.parametrize("way", ["stock", "switch"])
def test_every_rank_finished(runs, way):
    mp.assert_check(*runs[way], "end", WORLD)
