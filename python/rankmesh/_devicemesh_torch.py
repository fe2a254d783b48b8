"""The torch side of :mod:`rankmesh.devicemesh`: the bodies of its two patches, imported by their
first call (the declarations there import no torch, and installing them imports nothing: the switch
installs them while torch's ``device_mesh`` is being imported)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist

from rankmesh import _mesh_check
from rankmesh import _torch_compat as compat
from rankmesh._native import MeshLayout
from rankmesh.errors import RankmeshError
from rankmesh.mesh import _modes, _placement_of, _symbolic_rank
from rankmesh.mesh import init_device_mesh as rankmesh_init_device_mesh
from rankmesh.process_groups import MeshBuilder, check_backend_name

__all__ = ["created_groups", "init_device_mesh", "init_process_groups"]

_lock = threading.RLock()

# id(rank-map tensor) -> (weakref to it, its _version, world size, the world it is, or None when it
# is no layout). torch hands every unflatten of a root mesh the root's rank map: read once.
_RANK_MAPS: dict[int, tuple[Any, int, int, Any]] = {}

# The builders of this process's default group: one per world (rank order), so that a partition
# used again (another mesh, another unflatten) gets the group made the first time.
_BUILDERS: dict[Any, Any] = {}
_BUILDERS_OF: list[Any] = [None]  # the default group the builders belong to


def created_groups() -> int:
    """How many process groups the ``init_process_groups`` patch has created on this rank for the
    current default group (every dim served, by backend and kind: ``MeshBuilder.report()``)."""
    with _lock:
        if _BUILDERS_OF[0] is None or _BUILDERS_OF[0] is not dist.group.WORLD:
            return 0
        return sum(b.report().created for b in _BUILDERS.values())


def _rank_map_world(rank_map: Any, world_size: int) -> Any:
    """The rankmesh world a rank map is (``MeshLayout.world`` for a permutation of the whole world,
    ``MeshLayout.placed`` for an offset plus modes over part of it), or None: read once per tensor
    (and again only after an in-place change), in the core."""

    key = id(rank_map)
    hit = _RANK_MAPS.get(key)
    version = compat.tensor_version(rank_map)
    if hit is not None and hit[0]() is rank_map and hit[1] == version and hit[2] == world_size:
        return hit[3]
    world = None
    if rank_map.dtype in (torch.int32, torch.int64) and rank_map.dim() == 1 and not rank_map.requires_grad:
        arr = rank_map.numpy()
        n = int(arr.size)
        try:
            if n == world_size:
                world = MeshLayout.world(world_size, arr)
            elif 0 < n < world_size:
                placement = _placement_of(arr, n, world_size)
                world = None if placement is None else MeshLayout.placed(world_size, placement.offset, placement.modes)
        except RankmeshError:  # not a permutation, a rank outside the job, a rank twice: torch's
            world = None
    ref = weakref.ref(rank_map, lambda _r, key=key: _RANK_MAPS.pop(key, None))
    _RANK_MAPS[key] = (ref, version, world_size, world)
    return world


def _builder(world: Any, default_group: Any) -> Any:
    """The process-wide builder of ``world`` (its whole world when it is over part of the job)."""

    if _BUILDERS_OF[0] is not default_group:  # a new default group: the old groups are gone
        _BUILDERS.clear()
        _BUILDERS_OF[0] = default_group
    whole = world if world.placement is None else MeshLayout.world(world.global_size)
    builder = _BUILDERS.get(whole)
    if builder is None:
        builder = _BUILDERS[whole] = MeshBuilder(whole, device_type="cpu", size_one_fake=False)
    return builder


def _torch_would_split(default_group: Any, backend: str | None) -> bool:
    """torch's own test for its ``split_group`` road (``_init_one_process_group``)."""

    bound = getattr(default_group, "bound_device_id", None) is not None
    if not (bound or compat.use_torchcomms()) or not torch.accelerator.is_available():
        return False
    if backend is None:
        return True
    return compat.accelerator_backend_name(default_group) == backend


def _plan(layout: Any, rank_map: Any, mesh_dim_names: Any, backend_override: Any, preserve: Any) -> Any:
    """What rankmesh makes for these arguments, or None where torch's own method must run. Every
    decision is a function of the arguments and of process-wide state that is the same on every
    rank (torch's release, the default group, its backend and bound device), never of the rank
    alone, so every rank takes the same road and creates its groups in the same order."""
    import torch

    if preserve or not dist.is_initialized():
        return None
    if _symbolic_rank("DeviceMesh._init_process_groups", "method makes the groups"):
        return None  # LocalTensorMode: one process plays every rank
    if type(rank_map) is not torch.Tensor or rank_map.device.type != "cpu":
        return None  # tensor subclasses, device rank maps: torch's
    if not isinstance(layout, compat.TorchMeshLayout) or len(backend_override) != len(layout):
        return None
    default_group = dist.group.WORLD
    # A bound device: rankmesh splits too (every rank of the world calls split once per distinct
    # partition), also where torch would loop over new_group (a bound CPU device): both roads are
    # world-wide, so no rank waits on another.
    bound = getattr(default_group, "bound_device_id", None) is not None
    overrides = []
    for config in backend_override:
        if not (isinstance(config, tuple) and len(config) == 2):
            return None
        backend, options = config
        if backend is not None:
            try:
                check_backend_name(backend, "backend_override")
            except RankmeshError:
                return None  # torch raises its own error for a backend it does not know
        if backend != "fake" and _torch_would_split(default_group, backend) and not bound:
            return None  # torch splits (torchcomms) where rankmesh would make member-only groups
        overrides.append((backend, options))
    world = _rank_map_world(rank_map, dist.get_world_size())
    if world is None:
        return None
    names = tuple(mesh_dim_names) if mesh_dim_names else tuple(f"dim_{d}" for d in range(len(layout)))
    try:
        rm_layout = world.with_modes([_modes(layout, d) for d in range(len(layout))], list(names))
    except RankmeshError:
        return None  # e.g. names torch takes and rankmesh's layouts do not: torch's
    return _builder(world, default_group), rm_layout, overrides


def init_process_groups(
    torch_init_process_groups: Any, layout, rank_map, mesh_dim_names, backend_override, preserve_rank_order
):  # noqa: ANN001
    """The ``init_process_groups`` patch's body: this rank's group per dim, or torch's own method."""
    with _lock:
        plan = _plan(layout, rank_map, mesh_dim_names, backend_override, preserve_rank_order)
        if plan is None:
            extra = (preserve_rank_order,) if preserve_rank_order else ()
            return torch_init_process_groups(layout, rank_map, mesh_dim_names, backend_override, *extra)
        builder, rm_layout, overrides = plan
        names = rm_layout.names
        groups = [
            builder.process_group(rm_layout, d, backend=b, pg_options=o, mesh_dim_name=names[d])
            for d, (b, o) in enumerate(overrides)
        ]
        return [pg.group_name for pg in groups if pg is not None]


def init_device_mesh(torch_init_device_mesh: Any, device_type, mesh_shape, mesh_dim_names, backend_override):  # noqa: ANN001
    """The ``init_device_mesh`` patch's body: rankmesh's mesh under torch's size-1 rule, or torch's."""
    if not _mesh_check.fast_meshes_available():
        return torch_init_device_mesh(
            device_type, mesh_shape, mesh_dim_names=mesh_dim_names, backend_override=backend_override
        )
    return rankmesh_init_device_mesh(
        device_type, mesh_shape, mesh_dim_names=mesh_dim_names, backend_override=backend_override, size_one_fake=False
    )
