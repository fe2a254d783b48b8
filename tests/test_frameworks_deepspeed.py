"""rankmesh's general patches on DeepSpeed's own mesh building (issue 33, item 3).

DeepSpeed (0.19.8) builds its meshes in ``deepspeed.comm.initialize_mesh_device(shape, names)``,
whose ``TorchBackend.init_device_mesh`` calls ``torch.distributed.device_mesh.init_device_mesh``
looked up at call time (DeepSpeed binds no name of torch's), so ``rankmesh.accelerate()`` reaches
it whether it runs before or after DeepSpeed is imported. ``deepspeed.initialize`` gets there two
ways, and every test calls it as a training script does (a two-layer model, ``LOCAL_RANK`` as
DeepSpeed's launcher sets it), stock and patched, on torch's fake backend:

- AutoTP training (``"tensor_parallel": {"autotp_size": 8}``): the engine's
  ``_configure_tensor_parallel_states`` calls ``groups._init_tp_mesh_device(8)``, a
  ``(data_parallel, tensor_parallel)`` mesh whose two groups ``deepspeed.utils.groups`` keeps;
- ``mesh_param=(dp, sp)``: a ``(data_parallel, sequence_parallel)`` mesh the engine keeps as
  ``groups.mesh_device``, from which DeepSpeed's data and sequence parallel getters answer.

Compared: every mesh DeepSpeed asked for (caught on its way out of ``initialize_mesh_device``),
its coordinate, local ranks, group ranks, backend and layout, and every group, size and rank the
engine and ``deepspeed.utils.groups`` answer with. DeepSpeed's ``TorchBackend`` JIT-compiles its
CPU shared-memory all-reduce op on Linux (ninja and a C++ compiler); the tests mark that op
incompatible, the switch DeepSpeed itself takes off Linux, which leaves every collective to torch.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
deepspeed = pytest.importorskip("deepspeed")
if not hasattr(deepspeed.comm, "initialize_mesh_device"):
    pytest.skip("this DeepSpeed has no deepspeed.comm.initialize_mesh_device", allow_module_level=True)

import rankmesh  # noqa: E402
import rankmesh.devicemesh as rdm  # noqa: E402

from tests.conftest import fake_world  # noqa: E402
from tests.frameworks import child_code, mesh_record, needs_autostart, run_child  # noqa: E402


def ds_config(kind: str) -> dict[str, Any]:
    """The config a training script passes: AutoTP over 8 ranks (its partition specs skip every
    weight, as DeepSpeed's own TestTpParallelStates does), or none beyond the batch size."""
    config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}
    if kind == "autotp":
        specs = [{"patterns": [r".*\.weight$"], "partition_type": "skip"}]
        config["tensor_parallel"] = {
            "autotp_size": 8,
            "partition_config": {"use_default_specs": False, "layer_specs": specs},
        }
    return config


def ds_initialize(world: int, rank: int, kind: str) -> tuple[Any, list[Any]]:
    """``deepspeed.initialize`` on the world already initialised (DeepSpeed wraps it), with
    ``mesh_param=(W/4, 4)`` for ``kind == "mesh_param"``; the engine and every mesh DeepSpeed built."""
    import deepspeed
    import deepspeed.ops
    import torch

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # as off Linux: no JIT build
    built: list[Any] = []
    asked = deepspeed.comm.initialize_mesh_device  # groups.py and initialize call it as dist.<name>

    def catching(mesh_shape, mesh_dim_names):
        built.append(asked(mesh_shape, mesh_dim_names))
        return built[-1]

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % 8))
    deepspeed.comm.initialize_mesh_device = catching
    try:
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
        mesh_param = (world // 4, 4) if kind == "mesh_param" else None
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config(kind), mesh_param=mesh_param
        )
    finally:
        deepspeed.comm.initialize_mesh_device = asked
    return engine, built


def record(engine: Any, built: list[Any], full: bool) -> tuple[dict[str, Any], list[str]]:
    """What DeepSpeed built (this process's and the children's): every mesh, and every group,
    size and rank its engine and ``deepspeed.utils.groups`` answer with."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    def group(pg: Any) -> Any:
        return None if pg is None else [dist.get_process_group_ranks(pg), str(dist.get_backend(pg))]

    seq = groups._get_sequence_parallel_group() if groups.mesh_device is not None else None
    held = {
        "tensor_parallel": group(groups._TENSOR_MODEL_PARALLEL_GROUP),
        "data_parallel": group(groups._DATA_PARALLEL_GROUP),
        "model_parallel": group(groups._MODEL_PARALLEL_GROUP),
        "engine.data_parallel": group(engine.data_parallel_group),
        "engine.seq_data_parallel": group(engine.seq_data_parallel_group),
        "sequence_parallel": group(seq),
    }
    sizes = {
        "dp": engine.dp_world_size,
        "mp": engine.mp_world_size,
        "seq_dp": engine.seq_dp_world_size,
        "sp": engine.sequence_parallel_size,
        "dp_rank": groups._get_data_parallel_rank(),
        "sp_rank": groups._get_sequence_parallel_rank(),
        "autotp": engine.autotp_size(),
    }
    if groups._TENSOR_MODEL_PARALLEL_GROUP is not None:
        sizes["tp"] = groups.get_tensor_model_parallel_world_size()
        sizes["tp_rank"] = groups.get_tensor_model_parallel_rank()
    rec = {"meshes": [mesh_record(m, full) for m in built], "groups": held, "sizes": sizes}
    return rec, [type(m).__name__ for m in built]


@contextlib.contextmanager
def launched(world: int, rank: int) -> Iterator[None]:
    """A fake world with the environment DeepSpeed's launcher sets; on the way out, DeepSpeed's own
    teardown (``deepspeed.comm.destroy_process_group``: the world and DeepSpeed's group references)."""
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    try:
        with fake_world(world, rank):
            try:
                yield
            finally:
                if deepspeed.comm.is_initialized():  # False where DeepSpeed never wrapped the world
                    deepspeed.comm.destroy_process_group()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _call(world: int, rank: int, kind: str) -> tuple[dict[str, Any], list[str], int]:
    """DeepSpeed's own call, then what it built."""
    with launched(world, rank):
        engine, built = ds_initialize(world, rank, kind)
        rec, types = record(engine, built, full=world <= 64)
        made = rdm.created_groups()  # by the init_process_groups patch, in this world
        return json.loads(json.dumps(rec)), types, made


CASES = [
    (world, rank, kind)
    for world in (64, 4096)
    for kind in ("autotp", "mesh_param")
    for rank in (0, world // 2 + 3, world - 1)
]


@pytest.mark.parametrize(("world", "rank", "kind"), CASES)
def test_accelerate_gives_deepspeed_the_same_meshes(world, rank, kind):
    stock, types, _ = _call(world, rank, kind)
    assert types == ["DeviceMesh"]
    try:
        assert {"init_device_mesh", "init_process_groups"} <= set(rankmesh.accelerate())  # the switch
        fast, types, _ = _call(world, rank, kind)
        # DeepSpeed calls torch.distributed.device_mesh.init_device_mesh at call time: the name patch reaches it
        assert types == ["FastDeviceMesh"]
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
    assert types == ["DeviceMesh"]  # torch's own DeviceMesh, its groups made by the patch
    assert made > 0
    assert patched == stock


# The child runs both of DeepSpeed's calls, each in a world of its own, torn down by DeepSpeed.
CHILD = child_code(
    "import os\n" + "\n".join(inspect.getsource(f) for f in (ds_config, ds_initialize, record)),
    """import deepspeed
from torch.testing._internal.distributed.fake_pg import FakeStore

engine, built = ds_initialize(world, rank, "autotp")
rec, types = record(engine, built, full=False)
deepspeed.comm.destroy_process_group()
dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
engine, built = ds_initialize(world, rank, "mesh_param")
rec_sp, types_sp = record(engine, built, full=False)
rec, types = {"autotp": rec, "mesh_param": rec_sp}, types + types_sp""",
)


def _child(world: int, rank: int, mode: str) -> dict[str, Any]:
    return run_child(CHILD, world, rank, mode)


def test_accelerate_before_importing_deepspeed_gives_the_same_meshes():
    world, rank = 4096, 4096 // 2 + 3
    stock, fast = _child(world, rank, "stock"), _child(world, rank, "accelerate-first")
    assert stock["types"] == ["DeviceMesh", "DeviceMesh"]
    assert fast["types"] == ["FastDeviceMesh", "FastDeviceMesh"]
    assert fast["record"] == stock["record"]


@needs_autostart
@pytest.mark.parametrize("exponent", [17, 20])
def test_the_environment_variable_at_scale(exponent):
    world = 2**exponent
    rank = world // 2 + 3
    stock, fast = _child(world, rank, "stock"), _child(world, rank, "env")
    assert stock["types"] == ["DeviceMesh", "DeviceMesh"]
    assert fast["types"] == ["FastDeviceMesh", "FastDeviceMesh"]
    assert fast["record"] == stock["record"]
    (tp,) = fast["record"]["autotp"]["meshes"]
    assert tp["names"] == ["data_parallel", "tensor_parallel"]
    assert tp["shape"] == [world // 8, 8] and tp["coordinate"] == [world // 16, 3]
    assert tp["groups"]["tensor_parallel"] == [list(range(world // 2, world // 2 + 8)), "fake"]
    assert tp["groups"]["data_parallel"] == [list(range(3, world, 8)), "fake"]
    held = fast["record"]["autotp"]["groups"]
    assert held["tensor_parallel"] == tp["groups"]["tensor_parallel"]
    assert held["data_parallel"] == tp["groups"]["data_parallel"]
    (sp,) = fast["record"]["mesh_param"]["meshes"]
    assert sp["shape"] == [world // 4, 4] and sp["coordinate"] == [world // 8, 3]
    assert sp["groups"]["sequence_parallel"][0] == list(range(world // 2, world // 2 + 4))
    assert fast["record"]["mesh_param"]["groups"]["sequence_parallel"] == sp["groups"]["sequence_parallel"]
    assert fast["record"]["mesh_param"]["sizes"]["sp"] == 4
    assert fast["pgs"] <= stock["pgs"]
