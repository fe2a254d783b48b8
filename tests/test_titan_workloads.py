"""torchtitan 0.3.0's own parallelisation (rankmesh.bench.titan_workloads) on stock torch's meshes
and under ``rankmesh.torchtitan.accelerate()``: Llama3 8B's shape for every ``spmd_backend``, a
MoE model with ep = tp = 8 (``efsdp`` has the ranks of ``fsdp``) and the pipeline split with
pp = 4.

- The parameters' placements, mesh names, mesh shapes, global and local shapes, and every 1-D
  mesh torchtitan hands out (its ranks and backend), equal stock's (2^12 ranks, two ranks).
  Where stock torch itself fails (torchtitan 0.3.0's ``spmd_types`` on torch 2.13 refuses the
  model: "all parameters must be DTensors on the full SPMD mesh"), rankmesh fails the same way.
- At 2^20 ranks the accelerated run builds nothing world-sized (no rank map, no W-long tuple, no
  plain torch DeviceMesh) and every parameter's mesh is rankmesh's.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan.distributed.parallel_dims", reason="torchtitan 0.3.0 is a test dependency")
import torch.distributed as dist  # noqa: E402
from rankmesh import (
    _mesh_check,  # noqa: E402
    _torch_compat,  # noqa: E402
)
from rankmesh.bench import titan_workloads as tw  # noqa: E402
from rankmesh.mesh import RANK_MAP_MATERIALISATIONS, FastDeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from tests.mesh_helpers import outcome  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not _mesh_check.fast_meshes_available(), reason="rankmesh falls back to torch here"),
    pytest.mark.filterwarnings("ignore"),
]

SMALL = 1 << 12
BIG = 1 << 20
# Every backend at 2^20, the default spmd_types included: accelerate() installs rankmesh's
# MeshAxis.__le__ (rankmesh.torchtitan.spmd_axis), without which spmd_types' own spends ~10 s there
# building the dp axis's rank sets.
BIG_WORKLOADS = [
    "titan_llama3_spmd_types",
    "titan_llama3_partial_dtensor",
    "titan_llama3_full_dtensor",
    "titan_moe_spmd_types",
    "titan_moe_partial_dtensor",
    "titan_pp_spmd_types",
    "titan_pp_partial_dtensor",
]


def _one_d(run) -> dict:
    out = {}
    for name, m in run.meshes.items():
        if name == "world":
            continue
        pg = m.get_group()
        out[name] = (m.size(), m.mesh.tolist(), dist.get_process_group_ranks(pg), dist.get_backend(pg))
    return out


def _same_failure(stock_e, ours_e) -> bool:
    """Where stock torch itself fails (torchtitan 0.3.0's spmd_types on torch 2.13: "all
    parameters must be DTensors on the full SPMD mesh"), rankmesh fails the same way."""
    if stock_e is None:
        assert ours_e is None, ours_e
        return False
    assert type(ours_e) is type(stock_e) and str(ours_e) == str(stock_e), (ours_e, stock_e)
    return True


@pytest.mark.parametrize("name", sorted(tw.WORKLOADS))
@pytest.mark.parametrize("rank", [3, SMALL // 2 + 3])
def test_parameters_and_meshes_equal_stocks(name, rank):
    fn = tw.WORKLOADS[name]
    stock_run, stock_e = outcome(fn, "torch", SMALL, rank=rank)
    ours_run, ours_e = outcome(fn, "rankmesh", SMALL, rank=rank)
    if _same_failure(stock_e, ours_e):
        return
    stock, ours = (stock_run.extra["placements"], stock_run), (ours_run.extra["placements"], ours_run)
    assert ours[0] == stock[0]
    assert any(p[1] != "plain" for p in ours[0])  # the model was parallelised
    meshes = {p.device_mesh for p in ours[1].model.parameters() if isinstance(p, DTensor)}
    assert meshes and all(type(m) is FastDeviceMesh for m in meshes)


def test_one_d_meshes_equal_stocks_while_the_world_is_up():
    from tests.conftest import fake_world

    for backend in tw.BACKENDS:
        got, failed = {}, {}
        for impl in ("torch", "rankmesh"):
            with fake_world(SMALL, 1234):
                run, failed[impl] = outcome(tw.WORKLOADS[f"titan_moe_{backend}"], impl, SMALL)
                got[impl] = None if run is None else _one_d(run)
        if not _same_failure(failed["torch"], failed["rankmesh"]):
            assert got["rankmesh"] == got["torch"], backend


@pytest.mark.parametrize("name", BIG_WORKLOADS)
def test_nothing_world_sized_is_built_at_2_20_ranks(name, count_plain_meshes):
    before = dict(RANK_MAP_MATERIALISATIONS)
    from rankmesh.torchtitan import spmd_axis

    if name.endswith("_spmd_types") and _torch_compat.TORCH_VERSION < (2, 14):
        pytest.skip("torchtitan 0.3.0's spmd_types refuses the model on torch 2.13, stock too (docs/known_gaps.md)")
    fallbacks = spmd_axis.COUNTS["fallback"]
    run = tw.WORKLOADS[name]("rankmesh", BIG, rank=BIG // 2 + 3)
    assert RANK_MAP_MATERIALISATIONS == before
    assert spmd_axis.COUNTS["fallback"] == fallbacks  # every axis comparison took the modes
    assert count_plain_meshes == []
    meshes = {p.device_mesh for p in run.model.parameters() if isinstance(p, DTensor)}
    assert meshes and all(type(m) is FastDeviceMesh for m in meshes)
