"""megatron-core's parallel_state filled by rankmesh, with real collectives: 8 gloo ranks on one
node (torchrun) run tests/mp/megatron_worker.py, which compares rankmesh's
``initialize_model_parallel`` with megatron-core's own on every rank, all-reduces over every group
rankmesh installed (gloo twins included) and exercises HyperCommGrid.

The launch has a hard deadline, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.mp import rankmesh_mp as mp

pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is a test dependency")
pytest.importorskip("einops")

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]

WORLD = 8
CONFIGS = ("moe", "cp", "pp4")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return mp.run_standalone(mp.MEGATRON_WORKER, tmp_path_factory.mktemp("mp_megatron"), WORLD)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_same_parallel_state_as_megatron(run, cfg):
    mp.assert_check(*run, f"state_{cfg}", WORLD)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_every_group_talks_to_its_peers(run, cfg):
    got = mp.assert_check(*run, f"reduce_{cfg}", WORLD)
    assert all(d["reduced"] >= 4 for d in got.values()), got[0]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_fewer_process_groups(run, cfg):
    got = mp.assert_check(*run, f"pgs_{cfg}", WORLD)
    for d in got.values():
        assert d["ours"] < d["stock"], d


def test_hyper_comm_grid(run):
    got = mp.assert_check(*run, "grid", WORLD)
    for rank, d in got.items():  # the offset grid holds ranks 3..6 only
        assert d["reduced"] == (5 if 3 <= rank < 7 else 3), (rank, d)


def test_every_rank_finished(run):
    mp.assert_check(*run, "end", WORLD)
