"""Each framework's own mesh building, as the framework calls it: what ``rankmesh bench --recipe
<framework>`` times, stock torch against the same call under :func:`rankmesh.accelerate`.

Every entry calls the installed release's own function (nothing of the framework is copied) for
one shape at world size ``W``: the data-parallel dim W/8 wide and tp = 8 (ep = 8 where the
framework has experts), then the slices the framework itself takes of what it built. Each
``build`` returns the meshes it obtained, so the benchmark can count them.

>>> {"transformers", "accelerate"} <= set(FRAMEWORKS)
True
>>> FRAMEWORKS["transformers"].distribution
'transformers'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Framework:
    """One framework's mesh phase.

    ``imports``: the modules to import before the clock starts (imports are not timed);
    ``binds_at_import``: the framework binds ``init_device_mesh`` when imported, so the patches
    must be installed first (as ``RANKMESH_ACCELERATE=1`` does at interpreter start);
    ``release``: the release the tests prove it on (``requirements-dev.txt``)."""

    distribution: str
    release: str
    imports: tuple[str, ...]
    build: Callable[[int], list[Any]]
    binds_at_import: bool = False
    shape: str = ""

    def installed(self) -> bool:
        """Whether the framework's package can be imported here (without importing it)."""
        import importlib.util

        return importlib.util.find_spec(self.imports[0].partition(".")[0]) is not None


# The slices transformers 5.24 takes of its two meshes (distributed/fsdp.py, mixin.py, modeling_utils.py).
TRANSFORMERS_SLICES = (
    ("dp_replicate", "fsdp"),
    ("fsdp",),
    ("dp_replicate", "efsdp"),
    ("efsdp",),
    ("pp", "fsdp", "tp"),
    ("pp",),
    ("tp",),
    ("ep",),
)


def transformers_meshes(world: int) -> list[Any]:
    """transformers' ``initialize_distributed_mesh(DistributedConfig(...))`` (what
    ``PreTrainedModel.prepare_distribute_model`` calls): two 4-D meshes ``(pp, dp_replicate,
    fsdp, tp)`` and ``(pp, dp_replicate, efsdp, ep)``, then the slices it takes through
    ``get_mesh``."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    _, manager = initialize_distributed_mesh(DistributedConfig(tp_size=8, fsdp_size=world // 8, ep_size=8))
    return [manager._dense_mesh, manager._expert_mesh, *(manager.get_mesh(d) for d in TRANSFORMERS_SLICES)]


def accelerate_meshes(world: int) -> list[Any]:
    """accelerate's ``ParallelismConfig(...).get_device_mesh(device_type)`` (what
    ``Accelerator.__init__`` calls; ``build_device_mesh`` plus its ``_flatten``s), then the FSDP2
    mesh and every 1-D mesh it names."""
    from accelerate.parallelism_config import ParallelismConfig

    config = ParallelismConfig(dp_shard_size=world // 8, tp_size=8)
    root = config.get_device_mesh("cpu")
    meshes = [root, root[tuple(config.fsdp_dim_names)]]
    for name in (*root.mesh_dim_names, "dp", "dp_shard_cp", "dp_cp"):
        try:
            meshes.append(root[name])
        except KeyError:  # a flattened name whose dims are disabled
            pass
    return meshes


def nemo_automodel_meshes(world: int) -> list[Any]:
    """NeMo Automodel's ``create_distributed_setup_from_config(cfg, world_size=W)`` (what its
    recipes' ``_create_distributed_setup`` calls) for ``distributed: {strategy: fsdp2, tp_size: 8}``
    and ``dist_env.timeout_minutes``: one 5-D mesh ``(pp, dp_replicate, dp_shard, cp, tp)`` with its
    size-1 dims kept and its ``dp``, ``dp_shard_cp`` and ``dp_cp`` flattens, then the FSDP mesh
    its parallelizer takes (``get_fsdp_dp_mesh``) and the ``tp`` slice. NeMo binds
    ``init_device_mesh`` when imported (``binds_at_import``)."""
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.components.distributed.mesh_utils import get_flat_mesh, get_fsdp_dp_mesh
    from nemo_automodel.recipes._dist_utils import create_distributed_setup_from_config

    cfg = ConfigNode({"distributed": {"strategy": "fsdp2", "tp_size": 8}, "dist_env": {"timeout_minutes": 10}})
    root = create_distributed_setup_from_config(cfg, world_size=world).mesh_context.device_mesh
    flat = [get_flat_mesh(root, name) for name in ("dp", "dp_shard_cp", "dp_cp")]
    return [root, *flat, get_fsdp_dp_mesh(root), root["tp"]]


def deepspeed_meshes(world: int) -> list[Any]:
    """DeepSpeed's two meshes, each through the function ``deepspeed.initialize`` reaches it by:
    ``groups._init_tp_mesh_device(8)`` (AutoTP training, ``"autotp_size": 8``: a
    ``(data_parallel, tensor_parallel)`` mesh, W/8 x 8, of which DeepSpeed keeps the two groups)
    and ``deepspeed.comm.initialize_mesh_device`` as ``mesh_param=(W/8, 8)`` calls it (a
    ``(data_parallel, sequence_parallel)`` mesh), after ``deepspeed.comm.init_distributed`` (which
    wraps the world already made). DeepSpeed's group references of an earlier world are dropped
    first, as its ``destroy_process_group`` does. Its CPU shared-memory all-reduce op (a JIT C++
    build ``init_distributed`` starts on Linux CPUs) is switched off as DeepSpeed does off Linux,
    without probing the other ops (none is loaded here; a GPU accelerator has no such op)."""
    import deepspeed.comm as ds_comm
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import groups

    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    groups._release_process_group_references()
    ds_comm.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    built: list[Any] = []
    asked = ds_comm.initialize_mesh_device  # groups.py calls it as deepspeed.comm.<name>

    def catching(mesh_shape: Any, mesh_dim_names: Any) -> Any:
        built.append(asked(mesh_shape, mesh_dim_names))
        return built[-1]

    ds_comm.initialize_mesh_device = catching
    try:
        groups._init_tp_mesh_device(tensor_model_parallel_size=8)
    finally:
        ds_comm.initialize_mesh_device = asked
    built.append(ds_comm.initialize_mesh_device((world // 8, 8), ("data_parallel", "sequence_parallel")))
    return built


def deepspeed_pipe_grid(world: int) -> list[Any]:
    """DeepSpeed's pipeline grid as ``PipelineModule`` builds it:
    ``PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=4, num_mp=8, num_dp=W/32))``
    after ``deepspeed.comm`` wraps the world; its four process groups (DeepSpeed-model, data,
    pipe, slice). Rank 0 prints the topology (W entries): its output is dropped."""
    import contextlib
    import io

    import deepspeed.comm as ds_comm
    import deepspeed.ops
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology
    from deepspeed.utils import groups

    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    groups._release_process_group_references()
    ds_comm.init_distributed(dist_backend="gloo")
    with contextlib.redirect_stdout(io.StringIO()):
        grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=4, num_mp=8, num_dp=world // 32))
    return [grid.ds_model_proc_group, grid.dp_proc_group, grid.pp_proc_group, grid.slice_proc_group]


FRAMEWORKS: dict[str, Framework] = {
    "transformers": Framework(
        "transformers",
        "5.24.0",
        ("transformers.distributed.utils", "transformers.distributed.configuration_utils"),  # the second: lazily
        transformers_meshes,
        shape="fsdp W/8, tp 8, ep 8 (two 4-D meshes, size-1 pp and dp_replicate kept)",
    ),
    "accelerate": Framework(
        "accelerate",
        "1.15.0",
        ("accelerate.parallelism_config",),
        accelerate_meshes,
        shape="dp_shard W/8, tp 8 (plus its three _flatten meshes)",
    ),
    "nemo_automodel": Framework(
        "nemo_automodel",
        "0.7.0",
        (
            "nemo_automodel.recipes._dist_utils",
            "nemo_automodel.components.config.loader",
            "nemo_automodel.components.distributed.mesh_utils",
        ),
        nemo_automodel_meshes,
        binds_at_import=True,
        shape="dp_shard W/8, tp 8 (a 5-D mesh, size-1 pp, dp_replicate and cp kept; three _flatten meshes)",
    ),
    "deepspeed": Framework(
        "deepspeed",
        "0.19.8",
        ("deepspeed.comm", "deepspeed.comm.mori", "deepspeed.utils.groups", "deepspeed.accelerator"),
        deepspeed_meshes,
        shape="data_parallel W/8 x tensor_parallel 8 (AutoTP), data_parallel W/8 x sequence_parallel 8 (mesh_param)",
    ),
    "deepspeed_pipe": Framework(
        "deepspeed",
        "0.19.8",
        ("deepspeed.comm", "deepspeed.utils.groups", "deepspeed.runtime.pipe.topology", "deepspeed.accelerator"),
        deepspeed_pipe_grid,
        shape="PipelineParallelGrid: pipe 4 x data W/32 x model 8 (its four groups)",
    ),
}
