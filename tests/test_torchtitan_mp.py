"""torchtitan 0.3.0 on rankmesh's meshes with real collectives: 8 gloo ranks on one node (torchrun)
run tests/mp/titan_worker.py, which builds torchtitan's ParallelDims stock and accelerated for
every spmd_backend, all-reduces over every group and trains one FSDP2 step on the dense mesh.

The launch has a hard deadline, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from rankmesh import _mesh_check

from tests.mp import rankmesh_mp as mp

pytest.importorskip("torchtitan.distributed.parallel_dims", reason="torchtitan 0.3.0 is a test dependency")

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
    pytest.mark.skipif(not _mesh_check.fast_meshes_available(), reason="rankmesh falls back to torch here"),
]

WORLD = 8
BACKENDS = ("spmd_types", "partial_dtensor", "full_dtensor")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return mp.run_standalone(mp.TITAN_WORKER, tmp_path_factory.mktemp("mp_titan"), WORLD)


@pytest.mark.parametrize("backend", BACKENDS)
def test_groups_talk_to_the_stock_peers(run, backend):
    got = mp.assert_check(*run, f"groups_{backend}", WORLD)
    # tp, dp_replicate, dp_shard / fsdp, batch-or-dp, loss, ep, efsdp: every real 1-D mesh reduced
    assert all(len(d["reduced"]) >= 5 for d in got.values()), got[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fsdp2_step_on_the_dense_mesh(run, backend):
    got = mp.assert_check(*run, f"fsdp_{backend}", WORLD)
    assert got[0]["mesh"] == [2, 2]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fewer_process_groups(run, backend):
    got = mp.assert_check(*run, f"pgs_{backend}", WORLD)
    for d in got.values():
        assert d["ours"] < d["stock"], d


def test_every_rank_finished(run):
    mp.assert_check(*run, "end", WORLD)
