"""rankmesh's general patches on accelerate's own mesh building.

accelerate (1.15.0) builds its mesh in ``ParallelismConfig.build_device_mesh(device_type)``, which
``Accelerator.__init__`` reaches through ``parallelism_config.get_device_mesh(self.device.type)``:
one mesh over the enabled dims in the order ``(dp_replicate, dp_shard, cp, sp, tp)`` (size-1 dims
dropped), through ``torch.distributed.device_mesh.init_device_mesh`` imported inside the function
(so ``rankmesh.accelerate()`` reaches it at call time, before or after accelerate is imported),
then ``_flatten``s of its dp dims (``dp``), dp_shard and cp (``dp_shard_cp``), and all three
(``dp_cp``). Every test calls it as accelerate does, stock and patched, on torch's fake backend,
and compares the root mesh, every flattened mesh, every 1-D slice, the FSDP slice accelerate takes
(``fsdp_utils``: ``mesh[fsdp_dim_names]``), coordinates, local ranks, group ranks, backends and
layouts.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import pytest

pytest.importorskip("torch")
pc = pytest.importorskip("accelerate.parallelism_config")
if not hasattr(pc.ParallelismConfig, "build_device_mesh"):
    pytest.skip("this accelerate has no ParallelismConfig.build_device_mesh", allow_module_level=True)

import rankmesh  # noqa: E402
import rankmesh.devicemesh as rdm  # noqa: E402

from tests.conftest import fake_world  # noqa: E402
from tests.frameworks import child_code, mesh_record, needs_autostart, run_child  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flattened meshes build_device_mesh makes (those whose dims are enabled).
FLATTENED = ("dp", "dp_shard_cp", "dp_cp")


def _sizes(kind: str, world: int) -> dict[str, int]:
    if kind == "fsdp":  # FSDP x TP: dp_shard W/8, tp 8
        return {"dp_shard_size": world // 8, "tp_size": 8}
    if kind == "hsdp":  # HSDP x TP: two replicas
        return {"dp_replicate_size": 2, "dp_shard_size": world // 16, "tp_size": 8}
    assert kind == "cp"  # FSDP x CP x TP
    return {"dp_shard_size": world // 16, "cp_size": 2, "tp_size": 8}


def record(config: Any, root: Any, full: bool) -> tuple[dict[str, Any], list[str]]:
    """What accelerate built (this process's and the children's): every mesh, slice, group."""

    def one(mesh: Any) -> dict[str, Any]:
        return mesh_record(mesh, full)

    names = list(root.mesh_dim_names)
    meshes = {"root": one(root)}
    meshes["fsdp"] = one(root[tuple(config.fsdp_dim_names)])  # accelerate's FSDP2 mesh (fsdp_utils)
    types = [type(root).__name__]
    for name in names + [n for n in FLATTENED if n not in names]:
        try:
            sub = root[name]
        except KeyError:
            continue
        meshes[name] = one(sub)
        types.append(type(sub).__name__)
    return {"names": names, "meshes": meshes}, types


def _call(world: int, rank: int, kind: str) -> tuple[dict[str, Any], list[str], int]:
    """accelerate's own call (``Accelerator.__init__``): a ParallelismConfig, then get_device_mesh."""
    with fake_world(world, rank):
        config = pc.ParallelismConfig(**_sizes(kind, world))
        assert config.total_size == world
        root = config.get_device_mesh("cpu")
        rec, types = record(config, root, full=world <= 64)
        made = rdm.created_groups()  # by the init_process_groups patch, in this world
        return json.loads(json.dumps(rec)), types, made


CASES = [
    (world, rank, kind)
    for world in (64, 4096)
    for kind in ("fsdp", "hsdp", "cp")
    for rank in (0, world // 2 + 3, world - 1)
]


@pytest.mark.parametrize(("world", "rank", "kind"), CASES)
def test_accelerate_gives_accelerate_the_same_meshes(world, rank, kind):
    stock, types, _ = _call(world, rank, kind)
    assert set(types) == {"DeviceMesh"}
    assert all(name in stock["meshes"] for name in FLATTENED)  # every config here has all three
    try:
        assert {"init_device_mesh", "init_process_groups"} <= set(rankmesh.accelerate())  # the switch
        fast, types, _ = _call(world, rank, kind)
        # accelerate imports init_device_mesh inside build_device_mesh: the name patch reaches it
        assert set(types) == {"FastDeviceMesh"}
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
    assert set(types) == {"DeviceMesh"}  # torch's own DeviceMesh, its groups made by the patch
    assert made > 0
    assert patched == stock


CHILD = child_code(
    f"FLATTENED = {FLATTENED!r}\n" + inspect.getsource(record),
    """from accelerate.parallelism_config import ParallelismConfig

config = ParallelismConfig(dp_shard_size=world // 8, tp_size=8)
root = config.get_device_mesh("cpu")
rec, types = record(config, root, full=False)""",
)


def _child(world: int, rank: int, mode: str) -> dict[str, Any]:
    return run_child(CHILD, world, rank, mode)


def test_accelerate_before_importing_accelerate_gives_the_same_meshes():
    world, rank = 4096, 4096 // 2 + 3
    stock, fast = _child(world, rank, "stock"), _child(world, rank, "accelerate-first")
    assert set(stock["types"]) == {"DeviceMesh"}
    assert set(fast["types"]) == {"FastDeviceMesh"}
    assert fast["record"] == stock["record"]


@needs_autostart
def test_the_environment_variable_at_two_to_the_17():
    world, rank = 2**17, 2**16 + 3
    stock, fast = _child(world, rank, "stock"), _child(world, rank, "env")
    assert set(stock["types"]) == {"DeviceMesh"}
    assert set(fast["types"]) == {"FastDeviceMesh"}
    assert fast["record"] == stock["record"]
    assert fast["record"]["names"] == ["dp_shard", "tp"]
    root = fast["record"]["meshes"]["root"]
    assert root["shape"] == [2**14, 8] and root["coordinate"] == [2**13, 3]
    assert root["groups"]["tp"][0] == list(range(2**16, 2**16 + 8))
    assert root["groups"]["dp_shard"][0] == list(range(3, world, 8))
    for name in FLATTENED:  # each is dp_shard alone here
        assert fast["record"]["meshes"][name]["groups"][name][0] == list(range(3, world, 8))
    assert fast["pgs"] <= stock["pgs"]
