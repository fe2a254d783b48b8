"""Megatron-FSDP's DeviceMeshes from the groups ``parallel_state`` already holds, in O(group size).

megatron-core 0.16's ``FullyShardedDataParallel.__init__`` (``megatron.core.distributed.fsdp.
mcore_fsdp_adapter``) first calls ``self._init_dist_index(pg_collection)``, which builds up to two
DeviceMeshes over the *whole* job on every rank: ``_get_dp_tp_mesh`` / ``_get_hsdp_tp_mesh``
rearrange ``torch.arange(world_size)`` with einops, scan it in Python to check it against the
groups, and ``DeviceMesh.from_group(groups, mesh=mesh.tolist())`` turns it back into a tensor, a
rank map and a W-long tuple; ``FSDPDistributedIndex.__init__`` then slices those meshes five to
ten times. About 2.5 s per rank at 2^20 ranks (tp 8, cp 2), for meshes whose every group the rank
already holds.

:func:`make_init_dist_index` is a drop-in for that method: the same groups, fetched the same way,
the same one-rank ``new_group`` calls where a group is missing, the same ``FSDPDistributedIndex``
arguments, the same ``self.tp_group``; only the meshes are made by
:func:`rankmesh.mesh.from_group`, which reads each dim's layout from its group (O(group size)), and
every slice ``FSDPDistributedIndex`` takes of them is then O(group size) too. Before it builds
anything it checks, in O(group size), that each group is exactly the progression of ranks the stock
mesh puts through this rank (what Megatron-FSDP's own asserts check, up to order); anything else
(pipeline parallelism, whose world Megatron-FSDP 0.16 rejects; groups in another order; a
``pg_collection`` without the groups) runs Megatron's own method, after one warning.

It is installed as the ``"megatron_fsdp"`` patch of :mod:`rankmesh.patches`, only on the
megatron-core release whose method and helper bodies it has read (:data:`PATCH`'s ``code``)::

    import rankmesh.megatron.fsdp
    rankmesh.megatron.fsdp.accelerate()   # before FullyShardedDataParallel(...) is built
    ...
    rankmesh.megatron.fsdp.restore()      # Megatron's own method again
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankmesh._native import MeshLayout, Slice
from rankmesh._once import warn_once
from rankmesh._patch import Gate, Patch

__all__ = [
    "PATCH_NAME",
    "accelerate",
    "restore",
    "is_accelerated",
    "make_init_dist_index",
    "PATCH",
]

#: The registry name of the patch (``rankmesh.patches.get(PATCH_NAME)``, ``RANKMESH_DISABLE``).
PATCH_NAME = "megatron_fsdp"

_ADAPTER = "megatron.core.distributed.fsdp.mcore_fsdp_adapter"

#: The megatron-core code the replacement was written against: per release read (0.16.1, whose
#: ``mcore_fsdp_adapter`` rankmesh has read and tested against), the
#: ``rankmesh._patch.source_hash`` of every function whose behaviour it reproduces: the method
#: itself and the helpers it stands in for. A new release that changes any of them (megatron-core's
#: main branch already gives HSDP an expert mesh) is left alone whatever its version string says.
_CODE = Gate(
    "megatron-core",
    [
        f"{_ADAPTER}.FullyShardedDataParallel._init_dist_index",
        f"{_ADAPTER}._get_dp_tp_mesh",
        f"{_ADAPTER}._get_hsdp_tp_mesh",
        f"{_ADAPTER}._check_mesh_ranks_and_group_ranks_are_consistent",
    ],
)

_DEVICE_TYPE = "cuda"  # what megatron-core 0.16 hard-codes for these meshes
_DENSE_NAMES = ("dp_cp", "tp")
_HSDP_NAMES = ("outer_fsdp_dp", "dp_cp", "tp")


# -- the patch ---------------------------------------------------------------------------------


def accelerate() -> bool:
    """Install the ``megatron_fsdp`` patch: True when rankmesh's ``_init_dist_index`` is in place
    (idempotent); False, with one warning, on a megatron-core it does not know, and without one when
    ``RANKMESH_DISABLE`` names the patch. Meshes already built stay as they are."""
    return PATCH.install()


def restore() -> None:
    """Put megatron-core's own ``_init_dist_index`` back (harmless when not accelerated)."""
    PATCH.restore()


def is_accelerated() -> bool:
    """True while ``FullyShardedDataParallel._init_dist_index`` is rankmesh's."""
    return PATCH.installed


# -- the replacement -----------------------------------------------------------------------------


@dataclass
class _Plan:
    """What ``_init_dist_index`` will build, decided before anything is created."""

    hsdp: bool
    tp_group: Any
    expt_tp_group: Any
    dp_cp_group: Any
    outer_fsdp_group: Any = None
    hybrid_fsdp_group: Any = None
    expt_dp_group: Any = None
    ep_group: Any = None
    # sizes, for torch's mesh should rankmesh's from_group fail
    world: int = 0
    rank: int = 0


def _is_group(group: Any, rank: int, want: Slice) -> bool:
    """Whether ``group``'s ranks are exactly ``want``'s, increasing (a missing tp group stands for
    the one-rank group of this rank, created only once the plan holds): O(1) for a group rankmesh
    made from a layout (``rankmesh.megatron.initialize_model_parallel``'s) and for the default
    group, which rankmesh hands out for a dim that spans the job (the expert dp group with ep =
    etp = 1, dp_cp with tp = cp = 1: the world's ranks in order, never read); O(group size)
    otherwise."""
    from rankmesh.process_groups import group_is

    if group is None:
        return len(want) == 1 and rank in want
    return group_is(group, want)


def _grid(world: int, sizes: tuple[int, int, int], names: tuple[str, str, str]) -> MeshLayout:
    """``arange(world)`` as the mesh Megatron-FSDP's helper builds (last dim fastest): its groups
    are read in O(modes) (``MeshLayout.group_slice``)."""
    return MeshLayout.world(world).unflatten(0, sizes, names)


def _check_dp_tp(dp_group: Any, tp_group: Any, ep: int, world: int, rank: int, what: str) -> str | None:
    """``_get_dp_tp_mesh(dp_group, tp_group, ep_size=ep)``'s mesh is ``arange(W)`` as
    (dp, ep, tp), tp fastest, sliced at this rank's ep index: dp stride ep*tp, tp stride 1."""
    tp = 1 if tp_group is None else tp_group.size()
    dp = dp_group.size()
    if dp * ep * tp != world:
        return (
            f"the {what} mesh needs world size = dp_cp x ep x tp, but {world} != {dp} x {ep} x {tp} "
            "(Megatron-FSDP 0.16 needs groups that tile the world: pp = 1)"
        )
    grid = _grid(world, (dp, ep, tp), ("dp", "ep", "tp"))
    want = grid.group_slice(rank, "tp")
    if not _is_group(tp_group, rank, want):
        return f"the {what} tp group is not the contiguous block of ranks {want.offset}..{want.last}"
    want = grid.group_slice(rank, "dp")
    if not _is_group(dp_group, rank, want):
        return f"the {what} dp_cp group is not ranks {want.offset}, +{ep * tp}, ... in increasing order"
    return None


def _check_hsdp(p: _Plan) -> str | None:
    """``_get_hsdp_tp_mesh``'s mesh is ``arange(W)`` as (outer, fsdp, tp), tp fastest."""
    world, rank = p.world, p.rank
    tp = 1 if p.tp_group is None else p.tp_group.size()
    outer = p.outer_fsdp_group.size()
    fsdp = p.dp_cp_group.size()
    if outer * fsdp * tp != world:
        return (
            f"the HSDP mesh needs world size = outer x dp_cp x tp, but {world} != {outer} x {fsdp} x {tp} "
            "(Megatron-FSDP 0.16 needs groups that tile the world: pp = 1)"
        )
    grid = _grid(world, (outer, fsdp, tp), ("outer", "fsdp", "tp"))
    want = grid.group_slice(rank, "tp")
    if not _is_group(p.tp_group, rank, want):
        return f"the tp group is not the contiguous block of ranks {want.offset}..{want.last}"
    if not _is_group(p.dp_cp_group, rank, grid.group_slice(rank, "fsdp")):
        return "the intra-instance dp_cp group is not a contiguous, increasing block of the dp_cp group"
    want = grid.group_slice(rank, "outer")
    if not _is_group(p.outer_fsdp_group, rank, want):
        return f"the outer (inter-instance) group is not ranks {want.offset}, +{fsdp * tp}, ... in increasing order"
    return None


def _plan(self: Any, pg_collection: Any, g: dict[str, Any]) -> _Plan | str:
    """The original's group fetching (same getters, same order, no side effects) and the checks its
    helpers make, in O(group size); a string says why the original must run instead."""
    if not g.get("HAVE_DTENSOR", False) or not g.get("HAVE_EINOPS", False):
        return "torch without DTensor or no einops (Megatron's own method raises)"
    parallel_state = g["parallel_state"]
    dist = g["dist"]

    enable_hsdp = self.ddp_config.num_distributed_optimizer_instances > 1
    outer_fsdp_group = hybrid_fsdp_group = expt_dp_group = ep_group = None
    if pg_collection is None:
        tp_group = parallel_state.get_tensor_model_parallel_group()
        expt_tp_group = parallel_state.get_expert_tensor_parallel_group()
        if enable_hsdp:
            dp_cp_group = parallel_state.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
            outer_fsdp_group = parallel_state.get_inter_distributed_optimizer_instance_group()
            hybrid_fsdp_group = parallel_state.get_data_parallel_group(
                with_context_parallel=True, partial_data_parallel=False
            )
        else:
            dp_cp_group = parallel_state.get_data_parallel_group(
                with_context_parallel=True, partial_data_parallel=False
            )
            expt_dp_group = parallel_state.get_expert_data_parallel_group()
            ep_group = parallel_state.get_expert_model_parallel_group()
    else:
        tp_group = getattr(pg_collection, "tp", None)
        expt_tp_group = getattr(pg_collection, "expt_tp", None)
        if enable_hsdp:
            dp_cp_group = pg_collection.intra_dp_cp
            outer_fsdp_group = pg_collection.inter_dist_opt
            hybrid_fsdp_group = pg_collection.dp_cp
        else:
            dp_cp_group = pg_collection.dp_cp
            expt_dp_group = getattr(pg_collection, "expt_dp", None)
            ep_group = getattr(pg_collection, "ep", None)

    p = _Plan(
        hsdp=enable_hsdp,
        tp_group=tp_group,
        expt_tp_group=expt_tp_group,
        dp_cp_group=dp_cp_group,
        outer_fsdp_group=outer_fsdp_group,
        hybrid_fsdp_group=hybrid_fsdp_group,
        expt_dp_group=expt_dp_group,
        ep_group=ep_group,
        world=dist.get_world_size(),
        rank=dist.get_rank(),
    )
    if dp_cp_group is None or (enable_hsdp and outer_fsdp_group is None):
        return "a data-parallel group is missing"
    if enable_hsdp:
        return _check_hsdp(p) or p
    if ep_group is not None:
        if expt_dp_group is None:
            return "an expert-parallel group without an expert data-parallel group"
        why = _check_dp_tp(expt_dp_group, expt_tp_group, ep_group.size(), p.world, p.rank, "expert")
        if why is not None:
            return why
    return _check_dp_tp(dp_cp_group, tp_group, 1, p.world, p.rank, "dense") or p


def _mesh(groups: list[Any], names: tuple[str, ...], torch_mesh: Any, g: dict[str, Any]) -> Any:
    """rankmesh's mesh over ``groups``; should it fail, torch's, from the mesh megatron-core
    would have built (``torch_mesh()``), so the result is never wrong."""
    try:
        from rankmesh.mesh import from_group

        return from_group(groups, _DEVICE_TYPE, mesh_dim_names=names)
    except Exception as e:  # noqa: BLE001 - a rankmesh failure must not stop training
        warn_once(
            ("megatron_fsdp", f"from_group:{type(e).__name__}"),
            f"rankmesh.megatron.fsdp: rankmesh.mesh.from_group failed ({type(e).__name__}: {e}); "
            "building torch's DeviceMesh from the world-sized rank tensor instead (stock speed)",
            stacklevel=3,
        )
        return g["DeviceMesh"].from_group(
            groups, device_type=_DEVICE_TYPE, mesh=torch_mesh().tolist(), mesh_dim_names=list(names)
        )


def _build(self: Any, p: _Plan, g: dict[str, Any]) -> Any:
    import torch

    dist = g["dist"]
    index_cls = g["FSDPDistributedIndex"]
    world, rank = p.world, p.rank

    # The same one-rank groups as the original, in the same order (new_group is collective).
    tp_group, expt_tp_group = p.tp_group, p.expt_tp_group
    if tp_group is None:
        tp_group = dist.new_group(ranks=[dist.get_rank()])
    if expt_tp_group is None:
        expt_tp_group = dist.new_group(ranks=[dist.get_rank()])

    if p.hsdp:
        outer, fsdp, tp = p.outer_fsdp_group.size(), p.dp_cp_group.size(), tp_group.size()
        device_mesh = _mesh(
            [p.outer_fsdp_group, p.dp_cp_group, tp_group],
            _HSDP_NAMES,
            lambda: torch.arange(world).view(outer, fsdp, tp),
            g,
        )
        dist_index = index_cls(
            hsdp_outer_dp_shard=self.ddp_config.outer_dp_sharding_strategy != "no_shard",
            device_mesh=device_mesh,
            dp_outer_dim="outer_fsdp_dp",
            dp_shard_dim="dp_cp",
            tp_dim="tp",
            hybrid_fsdp_group=p.hybrid_fsdp_group,
        )
    else:
        if p.ep_group is not None:
            ep, etp, edp = p.ep_group.size(), expt_tp_group.size(), p.expt_dp_group.size()
            expt_device_mesh = _mesh(
                [p.expt_dp_group, expt_tp_group],
                _DENSE_NAMES,
                lambda: torch.arange(world).view(edp, ep, etp)[:, (rank // etp) % ep, :],
                g,
            )
        else:
            expt_device_mesh = None
        dp, tp = p.dp_cp_group.size(), tp_group.size()
        device_mesh = _mesh([p.dp_cp_group, tp_group], _DENSE_NAMES, lambda: torch.arange(world).view(dp, tp), g)
        dist_index = index_cls(
            device_mesh=device_mesh,
            dp_shard_dim="dp_cp",
            tp_dim="tp",
            expt_device_mesh=expt_device_mesh,
        )

    self.tp_group = tp_group
    return dist_index


def make_init_dist_index(original: Any) -> Any:
    """The replacement for ``FullyShardedDataParallel._init_dist_index`` (see the module docstring):
    megatron-core's ``original`` runs, after one warning per reason, wherever the plan does not
    hold."""
    g = original.__globals__  # the adapter module's names, as the original sees them

    def _init_dist_index(self, pg_collection):  # noqa: ANN001, ANN202
        try:
            plan = _plan(self, pg_collection, g)
        except Exception as e:  # noqa: BLE001 - the original raises its own error for this
            plan = f"{type(e).__name__}: {str(e)[:200]}"
        if isinstance(plan, str):
            warn_once(
                ("megatron_fsdp", plan),
                f"rankmesh.megatron.fsdp: {plan}; Megatron-FSDP builds its own world-sized meshes "
                "(correct, stock speed)",
                stacklevel=3,
            )
            return original(self, pg_collection)
        return _build(self, plan, g)

    _init_dist_index.__doc__ = original.__doc__
    _init_dist_index.__qualname__ = original.__qualname__
    _init_dist_index.__module__ = __name__
    return _init_dist_index


#: The patch (listed in :mod:`rankmesh.patches`): ``FullyShardedDataParallel._init_dist_index``.
PATCH = Patch(
    PATCH_NAME,
    f"{_ADAPTER}.FullyShardedDataParallel",
    "_init_dist_index",
    make_init_dist_index,
    why="Megatron-FSDP builds its DeviceMeshes over the whole job from arange(world) (about 2 s per rank at 2^20); "
    "rankmesh builds the same meshes from the groups parallel_state holds, O(group)",
    detail="(_init_dist_index and the helpers it stands in for, by body)",
    gate=_CODE,
)
