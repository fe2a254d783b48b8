"""8 gloo ranks (torchrun, one node on loopback) train one FSDP2 + TP step on stock torch's meshes
and on rankmesh's, in the same job: the loss, every gradient and every updated parameter are
equal, and the meshes FSDP2 derives (``DeviceMesh._concatenate``) are rankmesh's
(tests/mp/workload_worker.py). Every launch has a hard deadline."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from rankmesh import _mesh_check  # noqa: E402

from tests.mp import rankmesh_mp as mp  # noqa: E402

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
    pytest.mark.skipif(not _mesh_check.fast_meshes_available(), reason="rankmesh falls back to torch here"),
]

WORLD = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return mp.run_standalone(mp.WORKLOAD_WORKER, tmp_path_factory.mktemp("mp_workload"), WORLD)


def test_loss_gradients_and_parameters_equal_stocks(run):
    got = mp.assert_check(*run, "step", WORLD)
    assert all(d["params"] == 16 for d in got.values()), got[0]  # 4 blocks of 2 linears: weight + bias
    assert len({d["loss"] for d in got.values()}) == 1  # every rank saw the same replicated loss


def test_fsdp2s_derived_meshes_are_rankmeshs(run):
    got = mp.assert_check(*run, "fast", WORLD)
    assert all(d["fsdp_spmd_meshes"] == 16 for d in got.values()), got[0]


def test_every_rank_finished(run):
    mp.assert_check(*run, "end", WORLD)
