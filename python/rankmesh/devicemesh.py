"""torch's own ``DeviceMesh`` at O(group size) per rank, for every framework: two patches, one call.

transformers, NeMo Automodel, accelerate, DeepSpeed, Lightning, verl and torchrec build their
meshes with torch's API (``init_device_mesh``, ``DeviceMesh(mesh=...)``, ``_flatten``,
``_unflatten``). Each of those reaches one static method, ``DeviceMesh._init_process_groups``,
which builds a W-long ``remap_to_tensor`` per dim and then every group of the dim (a size-1 dim
too: W one-rank groups). Two patches of :mod:`rankmesh.patches` take that work away:

- ``init_process_groups`` replaces ``DeviceMesh._init_process_groups``. It reads the rank map it
  is handed once (in the Rust core, cached per tensor: a root mesh and all its unflattens share
  it), and when the map is a layout (a permutation of the world, or an offset plus ``(size,
  stride)`` modes over part of it) makes only this rank's group per dim through rankmesh's
  process groups: ``split_group`` where a device is bound (torch 2.15's default ``nccl``), a
  member-only ``new_group`` elsewhere, torch's size-1 rule (a real one-rank group), torch's
  ``mesh_<name>`` descriptions, ``backend_override`` backends, options and timeouts, one group
  per distinct (partition, backend, options, dim name) for the whole process, created in the same
  order on every rank. Anything else (a rank map that is no layout, ``preserve_rank_order``,
  symbolic ranks under ``LocalTensorMode``, a tensor subclass, a backend c10d does not know, a
  road torch would split on but rankmesh would not) gets torch's own method, never an error.
- ``init_device_mesh`` replaces ``torch.distributed.device_mesh.init_device_mesh`` (and
  ``torch.distributed.init_device_mesh``) with :func:`rankmesh.init_device_mesh` under torch's
  size-1 rule: the mesh and everything derived from it (slices, ``_flatten``, ``_unflatten``)
  stay O(group size), where torch's own ``DeviceMesh.__init__`` still makes a W-long tuple and
  searches the rank map per mesh. torch's own re-exports of the name follow it; a module outside
  torch that bound the name before the patch keeps torch's function (and still gets the first
  patch: ``rankmesh.accelerate()`` warns, naming it); ``RANKMESH_ACCELERATE=1`` in the
  environment installs both the moment torch's ``device_mesh`` has run, before anything can bind
  the name (``_rankmesh_autostart``, :mod:`rankmesh.switch`).

The one switch (:func:`rankmesh.accelerate`, ``RANKMESH_ACCELERATE=1``) installs both, with every
framework's patches; :func:`accelerate` here installs these two alone; :func:`restore` (or
``rankmesh.patches.restore_all()``) undoes them; ``RANKMESH_DISABLE=init_process_groups,init_device_mesh``
keeps them out.

Example: rank 5 of 8 on the fake backend, a plain torch mesh with the patch in place::

    >>> import torch.distributed as dist
    >>> from torch.distributed.device_mesh import DeviceMesh
    >>> from torch.testing._internal.distributed.fake_pg import FakeStore
    >>> dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    >>> INIT_PROCESS_GROUPS.install()
    True
    >>> mesh = DeviceMesh("cpu", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("dp", "tp"))
    >>> dist.get_process_group_ranks(mesh.get_group("tp")), dist.get_process_group_ranks(mesh.get_group("dp"))
    ([4, 5, 6, 7], [1, 5])
    >>> created_groups()          # only rank 5's two groups, where torch makes all six
    2
    >>> INIT_PROCESS_GROUPS.restore(); dist.destroy_process_group()
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from rankmesh._patch import Gate, Patch

__all__ = ["INIT_DEVICE_MESH", "INIT_PROCESS_GROUPS", "PATCHES", "accelerate", "created_groups", "restore"]

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
    import torch.distributed as dist

    with _lock:
        if _BUILDERS_OF[0] is None or _BUILDERS_OF[0] is not dist.group.WORLD:
            return 0
        return sum(b.report().created for b in _BUILDERS.values())


def _rank_map_world(rank_map: Any, world_size: int) -> Any:
    """The rankmesh world a rank map is (``MeshLayout.world`` for a permutation of the whole world,
    ``MeshLayout.placed`` for an offset plus modes over part of it), or None: read once per tensor
    (and again only after an in-place change), in the core."""
    import torch

    from rankmesh import _torch_compat as compat
    from rankmesh._native import MeshLayout
    from rankmesh.errors import RankmeshError
    from rankmesh.mesh import _placement_of

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
    from rankmesh._native import MeshLayout
    from rankmesh.process_groups import MeshBuilder

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
    import torch

    from rankmesh import _torch_compat as compat

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
    import torch.distributed as dist

    from rankmesh import _torch_compat as compat
    from rankmesh.errors import RankmeshError
    from rankmesh.mesh import _modes, _symbolic_rank
    from rankmesh.process_groups import check_backend_name

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


def _make_init_process_groups(torch_init_process_groups: Any) -> Any:
    def _init_process_groups(layout, rank_map, mesh_dim_names, backend_override, preserve_rank_order=False):  # noqa: ANN001, ANN202
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

    _init_process_groups.__doc__ = torch_init_process_groups.__doc__
    _init_process_groups.__qualname__ = "DeviceMesh._init_process_groups"
    return _init_process_groups


def _make_init_device_mesh(torch_init_device_mesh: Any) -> Any:
    def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None, backend_override=None):  # noqa: ANN001, ANN202
        from rankmesh import _mesh_check
        from rankmesh.mesh import init_device_mesh as rankmesh_init_device_mesh

        if not _mesh_check.fast_meshes_available():
            return torch_init_device_mesh(
                device_type, mesh_shape, mesh_dim_names=mesh_dim_names, backend_override=backend_override
            )
        return rankmesh_init_device_mesh(
            device_type,
            mesh_shape,
            mesh_dim_names=mesh_dim_names,
            backend_override=backend_override,
            size_one_fake=False,
        )

    init_device_mesh.__doc__ = torch_init_device_mesh.__doc__
    init_device_mesh.__module__ = "torch.distributed.device_mesh"
    return init_device_mesh


_DEVICE_MESH = "torch.distributed.device_mesh"

INIT_PROCESS_GROUPS = Patch(
    "init_process_groups",
    f"{_DEVICE_MESH}.DeviceMesh",
    "_init_process_groups",
    _make_init_process_groups,
    why="every DeviceMesh torch builds (init_device_mesh, DeviceMesh(mesh=...), _flatten, _unflatten) creates "
    "every group of every dim through it; rankmesh's creates this rank's group per dim, O(group size)",
    detail="(_init_process_groups and _init_one_process_group by body)",
    wrap=staticmethod,
    gate=Gate(
        "torch",
        [f"{_DEVICE_MESH}.DeviceMesh.{m}" for m in ("_init_process_groups", "_init_one_process_group")],
        reader="this patch",
    ),
)

INIT_DEVICE_MESH = Patch(
    "init_device_mesh",
    _DEVICE_MESH,
    "init_device_mesh",
    _make_init_device_mesh,
    why="frameworks build their meshes with it; rankmesh's returns a FastDeviceMesh (torch's size-1 rule) whose "
    "slices, _flatten and _unflatten stay O(group size) where torch's DeviceMesh makes a W-long tuple per mesh",
    detail="(init_device_mesh by body)",
    gate=Gate("torch", [f"{_DEVICE_MESH}.init_device_mesh"], reader="this patch"),
    # torch's own re-exports of the name (FSDP2's fully_shard makes its default mesh with it); a
    # module outside torch that bound it early is warned about by rankmesh.accelerate()
    aliases=(
        "torch.distributed",
        "torch.distributed.tensor",
        "torch.distributed.tensor.device_mesh",
        "torch.distributed._tensor",
        "torch.distributed.fsdp._fully_shard._fsdp_init",
    ),
)

#: The general patches, in the order :func:`accelerate` installs them.
PATCHES: tuple[Patch, ...] = (INIT_PROCESS_GROUPS, INIT_DEVICE_MESH)


def accelerate() -> list[str]:
    """Install the two patches of torch's ``DeviceMesh`` (the one switch, ``rankmesh.accelerate()``,
    installs them with every framework's); returns the names in place.

    Idempotent; a torch the patches do not recognise keeps its own functions, with one warning
    each. Call it before a framework imports ``init_device_mesh`` (or set ``RANKMESH_ACCELERATE=1``
    for the whole job): a name bound earlier stays torch's, whose meshes still get the
    ``init_process_groups`` patch.

        >>> sorted(accelerate())
        ['init_device_mesh', 'init_process_groups']
        >>> restore()
    """
    return [p.name for p in PATCHES if p.install()]


def restore() -> None:
    """Undo :func:`accelerate` (meshes and groups made meanwhile stay as they are)."""
    for p in reversed(PATCHES):
        p.restore()
