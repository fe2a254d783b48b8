"""rankmesh's general patches on transformers' own mesh building (issue 33, item 3).

transformers (5.24.0) builds its meshes in ``transformers.distributed.utils.initialize_distributed_mesh
(distributed_config)``, which ``PreTrainedModel.prepare_distribute_model`` calls with a
``DistributedConfig``: two 4-D meshes, ``(pp, dp_replicate, fsdp, tp)`` and ``(pp, dp_replicate,
efsdp, ep)``, size-1 dims kept, through ``torch.distributed.init_device_mesh`` looked up at call
time (transformers binds no name of torch's), so ``rankmesh.accelerate()`` reaches it whether it
runs before or after transformers is imported. Every test calls that function as transformers
does, stock and patched, on torch's fake backend, and compares every mesh, coordinate, slice
transformers takes (``TransformersDeviceMesh.get_mesh``), group's ranks, backend and layout.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import pytest

pytest.importorskip("torch")
tutils = pytest.importorskip("transformers.distributed.utils")
if not hasattr(tutils, "initialize_distributed_mesh"):
    pytest.skip("this transformers has no initialize_distributed_mesh", allow_module_level=True)

import rankmesh  # noqa: E402
import rankmesh.devicemesh as rdm  # noqa: E402
from rankmesh.bench.frameworks import TRANSFORMERS_SLICES  # noqa: E402

from tests.conftest import fake_world  # noqa: E402
from tests.frameworks import child_code, mesh_record, needs_autostart, run_child  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The slices transformers takes of its meshes (distributed/fsdp.py, mixin.py, modeling_utils.py):
# one list, which the benchmark's transformers recipe takes too.
SLICES = TRANSFORMERS_SLICES


def _sizes(kind: str, world: int) -> dict[str, int]:
    if kind == "fsdp":  # the shape: fsdp W/8, tp = ep = 8
        return {"tp_size": 8, "fsdp_size": world // 8, "ep_size": 8}
    if kind == "hsdp":  # two replicas, EP across two TP groups
        return {"tp_size": 8, "fsdp_size": world // 16, "dp_replicate_size": 2, "ep_size": 16}
    assert kind == "pp"
    return {"tp_size": 8, "pp_size": world // 8}


def record(device_map: Any, manager: Any, full: bool) -> tuple[dict[str, Any], list[str]]:
    """What transformers built (this process's and the children's): every mesh, slice, group."""

    def one(mesh: Any) -> dict[str, Any]:
        return mesh_record(mesh, full)

    meshes = {"dense": one(manager._dense_mesh), "expert": one(manager._expert_mesh)}
    for dims in SLICES:
        meshes["/".join(dims)] = one(manager.get_mesh(dims))
    types = [type(manager._dense_mesh).__name__, type(manager._expert_mesh).__name__]
    return {"device_map": str(device_map), "meshes": meshes}, types


def _call(world: int, rank: int, kind: str) -> tuple[dict[str, Any], list[str], int]:
    """transformers' own call (``prepare_distribute_model``): a DistributedConfig, then the function."""
    from transformers.distributed import DistributedConfig

    with fake_world(world, rank):
        device_map, manager = tutils.initialize_distributed_mesh(DistributedConfig(**_sizes(kind, world)))
        rec, types = record(device_map, manager, full=world <= 64)
        made = rdm.created_groups()  # by the init_process_groups patch, in this world
        return json.loads(json.dumps(rec)), types, made


CASES = [
    (world, rank, kind)
    for world, kind in ((64, "fsdp"), (64, "hsdp"), (64, "pp"), (4096, "fsdp"), (4096, "hsdp"))
    for rank in (0, world // 2 + 3, world - 1)
]


@pytest.mark.parametrize(("world", "rank", "kind"), CASES)
def test_accelerate_gives_transformers_the_same_meshes(world, rank, kind):
    stock, types, _ = _call(world, rank, kind)
    assert types == ["DeviceMesh", "DeviceMesh"]
    try:
        assert {"init_device_mesh", "init_process_groups"} <= set(rankmesh.accelerate())  # the switch
        fast, types, _ = _call(world, rank, kind)
        # transformers calls torch.distributed.init_device_mesh at call time: the name patch reaches it
        assert types == ["FastDeviceMesh", "FastDeviceMesh"]
    finally:
        rankmesh.restore()  # every patch the switch put in, and its hooks
    assert fast == stock


@pytest.mark.parametrize(("world", "rank", "kind"), CASES)
def test_the_process_group_patch_alone_gives_the_same_meshes(world, rank, kind):
    stock, _, _ = _call(world, rank, kind)
    try:
        assert rdm.INIT_PROCESS_GROUPS.install()
        patched, types, made = _call(world, rank, kind)
    finally:
        rdm.restore()
    assert types == ["DeviceMesh", "DeviceMesh"]  # torch's own DeviceMesh, its groups made by the patch
    assert made > 0
    assert patched == stock


CHILD = child_code(
    f"SLICES = {SLICES!r}\n" + inspect.getsource(record),
    """from transformers.distributed import DistributedConfig
from transformers.distributed.utils import initialize_distributed_mesh

device_map, manager = initialize_distributed_mesh(DistributedConfig(tp_size=8, fsdp_size=world // 8, ep_size=8))
rec, types = record(device_map, manager, full=False)""",
)


def _child(world: int, rank: int, mode: str) -> dict[str, Any]:
    return run_child(CHILD, world, rank, mode)


def test_accelerate_before_importing_transformers_gives_the_same_meshes():
    world, rank = 4096, 4096 // 2 + 3
    stock, fast = _child(world, rank, "stock"), _child(world, rank, "accelerate-first")
    assert stock["types"] == ["DeviceMesh", "DeviceMesh"]
    assert fast["types"] == ["FastDeviceMesh", "FastDeviceMesh"]
    assert fast["record"] == stock["record"]


@needs_autostart
def test_the_environment_variable_at_two_to_the_17():
    world, rank = 2**17, 2**16 + 3
    stock, fast = _child(world, rank, "stock"), _child(world, rank, "env")
    assert stock["types"] == ["DeviceMesh", "DeviceMesh"]
    assert fast["types"] == ["FastDeviceMesh", "FastDeviceMesh"]
    assert fast["record"] == stock["record"]
    dense = fast["record"]["meshes"]["dense"]
    assert dense["shape"] == [1, 1, 2**14, 8] and dense["coordinate"] == [0, 0, 2**13, 3]
    assert dense["groups"]["tp"][0] == list(range(2**16, 2**16 + 8))
    assert dense["groups"]["fsdp"][0] == list(range(3, world, 8))
    assert dense["groups"]["pp"][0] == [rank]
    assert fast["pgs"] <= stock["pgs"]
