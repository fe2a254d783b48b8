"""Time to a parallelised model (rankmesh.bench.workloads) on the fake backend, one process per rank.

- At 2^20 ranks, after each workload, nothing world-sized was built: rankmesh's meshes made no
  rank-map tensor, no W-long ``_flatten_rank_map`` tuple and no Python hash of one
  (``rankmesh.mesh.RANK_MAP_MATERIALISATIONS``), and torch constructed no plain ``DeviceMesh``
  (whose ``__init__`` runs ``tolist()`` over the world). ``torch.compile`` may make the rank map
  once per world (dynamo copies the mesh's attributes into its guards), never more.
- The DTensor parameters' placements, mesh names, mesh ranks and groups equal stock torch's for
  the same recipe.

The torchtitan workloads (Llama3 8B for every spmd_backend, MoE, pipeline) are in
tests/test_titan_workloads.py. No timing is asserted; ``rankmesh bench model`` measures.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from rankmesh import _mesh_check  # noqa: E402
from rankmesh.bench import workloads as wl  # noqa: E402
from rankmesh.mesh import RANK_MAP_MATERIALISATIONS, FastDeviceMesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

from tests.conftest import fake_world  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not _mesh_check.fast_meshes_available(), reason="rankmesh falls back to torch here"),
    pytest.mark.filterwarnings("ignore:FSDP2-wrapped module"),
]

BIG = 1 << 20
SMALL = 1 << 12
# workload -> how many times per kind its one world may materialise the rank map
ALLOWED = {"fsdp_tp": 0, "train_step": 0, "compile": 1, "distill": 0, "rl_split": 0, "ep_per_stage": 0}


@pytest.mark.parametrize("name", sorted(wl.WORKLOADS))
def test_nothing_world_sized_is_built_at_2_20_ranks(name, count_plain_meshes):
    before = dict(RANK_MAP_MATERIALISATIONS)
    run = wl.WORKLOADS[name]("rankmesh", BIG, rank=BIG // 2 + 3)
    made = {k: RANK_MAP_MATERIALISATIONS[k] - before[k] for k in before}
    assert all(v <= ALLOWED[name] for v in made.values()), made
    assert count_plain_meshes == [], count_plain_meshes
    dtensor_meshes = [p.device_mesh for p in run.model.parameters() if isinstance(p, DTensor)]
    assert dtensor_meshes and all(type(m) is FastDeviceMesh for m in dtensor_meshes)


def test_the_counter_counts():
    # The assertion above can fail: asking a fast mesh for torch's world-sized fields counts.
    run = wl.fsdp_tp("rankmesh", 2048, rank=7, blocks=1)
    before = dict(RANK_MAP_MATERIALISATIONS)
    assert len(run.meshes["tp"]._flatten_rank_map) == 2048
    assert RANK_MAP_MATERIALISATIONS["flatten_rank_map"] == before["flatten_rank_map"] + 1
    assert RANK_MAP_MATERIALISATIONS["rank_map"] == before["rank_map"] + 1
    run.meshes["dp"]._flatten_rank_map  # same world: made once
    assert RANK_MAP_MATERIALISATIONS["flatten_rank_map"] == before["flatten_rank_map"] + 1


def _groups(mesh) -> list[list[int]]:
    return [dist.get_process_group_ranks(mesh.get_group(i)) for i in range(mesh.ndim)]


def _describe(run) -> list[tuple]:
    """Per parameter: placements, mesh names, this rank's mesh, its groups' ranks, coordinate."""
    out = []
    for name, p in run.model.named_parameters():
        if isinstance(p, DTensor):
            m = p.device_mesh
            out.append((name, str(p.placements), m.mesh_dim_names, m.mesh.tolist(), m.get_coordinate(), p.shape))
        else:
            out.append((name, "plain", tuple(p.shape)))
    return out


@pytest.mark.parametrize("name", sorted(wl.WORKLOADS))
@pytest.mark.parametrize("rank", [0, SMALL // 2 + 3, SMALL - 1])
def test_parameters_equal_stocks(name, rank):
    # Each side in its own world (the fake backend stands in for `rank`), torch first.
    fn = wl.WORKLOADS[name]
    theirs, ours = {}, {}
    for impl, out in (("torch", theirs), ("rankmesh", ours)):
        wl.clear_dtensor_caches()
        with fake_world(SMALL, rank):
            run = fn(impl, SMALL)
            out["describe"] = _describe(run)
            out["placements"] = run.extra["placements"]
            params = [(n, p) for n, p in run.model.named_parameters() if isinstance(p, DTensor)]
            out["groups"] = {n: _groups(p.device_mesh) for n, p in params}
    assert ours["placements"] == theirs["placements"]
    assert ours["describe"] == theirs["describe"]
    assert ours["groups"] == theirs["groups"]
