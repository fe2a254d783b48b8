"""torchtitan 0.3.0's own parallelisation as workloads of :mod:`rankmesh.bench.workloads` (needs
``pip install torchtitan==0.3.0``): one rank, the meta device, torch's ``fake`` backend.

Each runs the steps of torchtitan's ``Trainer.__init__`` up to the parallelised model, in its
order, with the mesh built by torchtitan's ``ParallelDims.build_mesh()`` on stock torch
(``impl="torch"``), under :func:`rankmesh.torchtitan.accelerate` (``impl="rankmesh"``), or with no
rankmesh call at all in a process that ``RANKMESH_ACCELERATE=1`` started (``impl="switch"``):

1. ``ParallelDims.from_config(config.parallelism, W).build_mesh()``  -> phase ``mesh``
2. ``set_spmd_backend``, ``model_config.update_from_config(config=config)`` (this installs the
   sharding configs: without it ``spmd_types`` and ``full_dtensor`` refuse the model with "all
   parameters must be DTensors on the full SPMD mesh", and ``partial_dtensor`` silently applies
   FSDP without TP), the model built on the meta device, ``verify_module_protocol()``  -> ``model``
3. the model's ``parallelize_fn`` (or, with pp > 1, its ``pipelining_fn``, which splits the
   model into stages, parallelises every part and builds the schedule)  -> ``parallelise``

torchtitan picks the ``cuda`` device type when torch sees no accelerator; as its own unit tests
do, the workloads set it to ``cpu``, and turn CUDA graphs off (``--training.disable_cuda_graphs``).

- ``titan_llama3_<backend>``: Llama3 8B's shape (``llama3_8b``), tp 8 x dp_shard 256,
  dp_replicate = W / 2048, for each ``spmd_backend`` (spmd_types, partial_dtensor, full_dtensor);
- ``titan_moe_<backend>``: deepseek_v3's debug MoE model with ep 8 = tp 8 (so ``efsdp`` has the
  ranks of ``fsdp``: the case where one shared process group made FSDP2 refuse the experts);
- ``titan_pp_<backend>``: Llama3 8B split into 4 pipeline stages (1F1B), tp 8 x dp_shard 64.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

from rankmesh.bench.workloads import Run, clear_dtensor_caches, fake_world

__all__ = ["BACKENDS", "MIN_WORLD", "WORKLOADS", "param_summary", "run_titan"]

BACKENDS = ("spmd_types", "partial_dtensor", "full_dtensor")


def _quiet() -> None:
    warnings.filterwarnings("ignore", module="torchtitan")
    for name in ("torchtitan", "torch.distributed.tensor._redistribute"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _cpu_device_type() -> None:
    import torchtitan.distributed.parallel_dims as tpd
    import torchtitan.distributed.utils as tdu
    import torchtitan.tools.utils as ttu

    tpd.device_type = tdu.device_type = ttu.device_type = "cpu"


def _config(
    registry_fn: Callable[[], Any],
    world: int,
    backend: str,
    *,
    tp: int,
    dp_shard: int,
    pp: int = 1,
    ep: int = 1,
    **parallelism: Any,
) -> Any:
    """A ``Trainer.Config`` from one of torchtitan's config registry functions with the
    parallelism set as the command line would set it."""
    config = registry_fn()
    p = config.parallelism
    dp_replicate = world // (pp * dp_shard * tp)
    if dp_replicate * pp * dp_shard * tp != world:
        raise ValueError(f"world {world} is not a multiple of pp * dp_shard * tp = {pp * dp_shard * tp}")
    p.data_parallel_replicate_degree, p.data_parallel_shard_degree = dp_replicate, dp_shard
    p.tensor_parallel_degree, p.pipeline_parallel_degree = tp, pp
    p.expert_parallel_degree, p.context_parallel_degree = ep, 1
    p.spmd_backend = backend
    for k, v in parallelism.items():
        setattr(p, k, v)
    config.training.disable_cuda_graphs = True
    config.__post_init__()  # torchtitan's own validation of the edited config
    return config


def run_titan(impl: str, world: int, config: Any, *, rank: int | None = None) -> Run:
    """Trainer.__init__'s steps up to the parallelised model, on one side (see the module)."""
    _quiet()
    _cpu_device_type()
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.tools import utils

    import rankmesh.torchtitan as rt

    if impl not in ("torch", "rankmesh", "switch"):
        raise ValueError(f"impl must be 'rankmesh', 'switch' or 'torch', got {impl!r}")
    if impl == "switch" and not rt.is_accelerated():
        raise RuntimeError("the switch is not on in this process: run it with RANKMESH_ACCELERATE=1")
    run = Run()
    torch.autograd.set_multithreading_enabled(False)  # as torchtitan's init_distributed does
    accel = rt.accelerate() if impl == "rankmesh" else contextlib.nullcontext()
    with accel, fake_world(world, rank):
        if impl == "rankmesh" and not accel.active:
            raise RuntimeError(f"rankmesh.torchtitan.accelerate() is not active: {accel.reason}")
        spec = config.model_spec
        with run.phase("mesh"):
            pd = ParallelDims.from_config(config.parallelism, world)
            pd.build_mesh()
        with run.phase("model"):
            dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
            model_config = spec.model
            model_config.update_from_config(config=config)
            config._validate_cuda_graphs()
            with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
                model = model_config.build()
            model.verify_module_protocol()
        with run.phase("parallelise"):
            kw = dict(
                parallel_dims=pd,
                training=config.training,
                parallelism=config.parallelism,
                compile_config=config.compile,
                ac_config=config.activation_checkpoint,
                dump_folder=config.dump_folder,
            )
            if pd.pp_enabled:
                _, parts, _, _ = spec.pipelining_fn(
                    model,
                    **kw,
                    device=torch.device("cpu"),
                    model_config=model_config,
                    parallelize_fn=spec.parallelize_fn,
                    loss_fn=config.loss.build(compile_config=config.compile),
                )
            else:
                parts = [spec.parallelize_fn(model, **kw)]
        run.model = parts[0] if len(parts) == 1 else torch.nn.ModuleList(parts)
        run.meshes = {name: m for name, m in pd._single_axis_meshes.items()}
        run.meshes["world"] = pd.world_mesh
        run.extra["placements"] = param_summary(parts)
        run.extra["parallel_dims"] = pd
    clear_dtensor_caches()
    return run


def param_summary(parts: list[Any]) -> list[tuple]:
    """Per parameter: name, placements, mesh dim names, mesh shape, global and local shape."""
    from torch.distributed.tensor import DTensor

    out = []
    for i, part in enumerate(parts):
        prefix = f"part{i}." if len(parts) > 1 else ""
        for name, p in part.named_parameters():
            if isinstance(p, DTensor):
                m = p.device_mesh
                out.append(
                    (
                        prefix + name,
                        str(tuple(p.placements)),
                        tuple(m.mesh_dim_names or ()),
                        tuple(m.shape),
                        tuple(p.shape),
                        tuple(p._local_tensor.shape),
                    )
                )
            else:
                out.append((prefix + name, "plain", (), (), tuple(p.shape), tuple(p.shape)))
    return out


def llama3(impl: str, world: int, *, rank: int | None = None, backend: str = "spmd_types") -> Run:
    """(b) Llama3 8B's shape, tp 8 x dp_shard 256, parallelize_llama."""
    from torchtitan.models.llama3 import config_registry as cr

    return run_titan(impl, world, _config(cr.llama3_8b, world, backend, tp=8, dp_shard=256), rank=rank)


def moe(impl: str, world: int, *, rank: int | None = None, backend: str = "spmd_types") -> Run:
    """(c) deepseek_v3's debug MoE model, ep 8 = tp 8, dp_shard 256."""
    from torchtitan.models.deepseek_v3 import config_registry as cr

    config = _config(cr.deepseek_v3_debugmodel, world, backend, tp=8, dp_shard=256, ep=8)
    return run_titan(impl, world, config, rank=rank)


def pipeline(impl: str, world: int, *, rank: int | None = None, backend: str = "spmd_types") -> Run:
    """(d) Llama3 8B split into 4 pipeline stages (1F1B), tp 8 x dp_shard 64."""
    from torchtitan.models.llama3 import config_registry as cr

    def registry() -> Any:
        c = cr.llama3_8b()
        c.training.local_batch_size = 8
        return c

    config = _config(
        registry,
        world,
        backend,
        tp=8,
        dp_shard=64,
        pp=4,
        pipeline_parallel_schedule="1F1B",
        pipeline_parallel_microbatch_size=1,
    )
    return run_titan(impl, world, config, rank=rank)


def _bind(fn: Callable[..., Run], backend: str) -> Callable[..., Run]:
    def workload(impl: str, world: int, *, rank: int | None = None) -> Run:
        return fn(impl, world, rank=rank, backend=backend)

    workload.__name__ = f"{fn.__name__}_{backend}"
    workload.__doc__ = f"{fn.__doc__} spmd_backend={backend!r}."
    return workload


#: name -> workload (``fn(impl, world, *, rank=None) -> Run``)
WORKLOADS: dict[str, Callable[..., Run]] = {
    f"titan_{kind}_{backend}": _bind(fn, backend)
    for kind, fn in (("llama3", llama3), ("moe", moe), ("pp", pipeline))
    for backend in BACKENDS
}
#: name -> the smallest world it runs at
MIN_WORLD: dict[str, int] = {name: 2048 for name in WORKLOADS}  # tp 8 x dp_shard 256 (pp 4 x 64 x 8)
