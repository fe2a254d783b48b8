"""Megatron-FSDP's mesh phase as workloads of ``rankmesh bench model`` (needs megatron-core 0.16
and einops): one rank, torch's ``fake`` backend.

Wrapping a model with Megatron-FSDP needs CUDA (``MegatronFSDP.__init__`` calls
``torch.cuda.current_device()`` and makes CUDA streams, and its DTensors are placed on ``"cuda"``),
so what is timed is the part of ``FullyShardedDataParallel.__init__`` that builds the meshes, which
runs first: ``_init_dist_index`` (its meshes, and the 8-13 slices ``FSDPDistributedIndex`` takes of
them). Phases:

- ``mesh``: ``rankmesh.megatron.initialize_model_parallel`` (rankmesh's on both sides: megatron-core's
  own takes 7 s at 131,072 ranks and would drown the rest; see the Megatron benchmarks);
- ``parallelise``: ``_init_dist_index`` as stock megatron-core runs it (``impl="torch"``), or with
  ``rankmesh.megatron.fsdp.accelerate()`` in place (``impl="rankmesh"``).

Workloads: ``megatron_fsdp`` (tp 8, cp 2: the dense ``(dp_cp, tp)`` mesh and the expert mesh
megatron-core 0.16 builds even without experts) and ``megatron_fsdp_moe`` (tp 2, ep 8).
"""

from __future__ import annotations

import types
from typing import Any

from rankmesh.bench.workloads import Run, fake_world

__all__ = ["MIN_WORLD", "WORKLOADS", "megatron_fsdp"]


def megatron_fsdp(
    impl: str, world: int, *, rank: int | None = None, tp: int = 8, cp: int = 2, ep: int = 1, nopt: int = 1
) -> Run:
    """Megatron-FSDP's mesh phase for one rank (see the module)."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp import mcore_fsdp_adapter as adapter

    import rankmesh.megatron as rm
    from rankmesh.megatron import fsdp

    run = Run()
    with fake_world(world, rank):
        try:
            with run.phase("mesh"):
                rm.initialize_model_parallel(
                    tensor_model_parallel_size=tp,
                    context_parallel_size=cp,
                    expert_model_parallel_size=ep,
                    num_distributed_optimizer_instances=nopt,
                    create_gloo_process_groups=False,
                )
            ddp = DistributedDataParallelConfig(
                use_megatron_fsdp=True,
                data_parallel_sharding_strategy="optim_grads_params",
                num_distributed_optimizer_instances=nopt,
            )
            wrapper: Any = types.SimpleNamespace(ddp_config=ddp)
            if impl == "rankmesh" and not fsdp.accelerate():
                raise RuntimeError("rankmesh.megatron.fsdp.accelerate() did not install on this megatron-core")
            try:
                with run.phase("parallelise"):
                    index = adapter.FullyShardedDataParallel._init_dist_index(wrapper, None)
            finally:
                fsdp.restore()
            run.meshes.update(index.mesh_library)
            run.meshes.update(device=index.device_mesh, expert=index.expt_device_mesh)
            run.extra["mesh_types"] = sorted({type(m).__name__ for m in run.meshes.values()})
        finally:
            ps.destroy_model_parallel()
    return run


def megatron_fsdp_moe(impl: str, world: int, *, rank: int | None = None) -> Run:
    """Megatron-FSDP with experts: tp 2, ep 8 (an expert mesh of its own)."""
    return megatron_fsdp(impl, world, rank=rank, tp=2, cp=1, ep=8)


WORKLOADS = {"megatron_fsdp": megatron_fsdp, "megatron_fsdp_moe": megatron_fsdp_moe}
MIN_WORLD = {name: 1 << 12 for name in WORKLOADS}
