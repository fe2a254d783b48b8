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

from typing import Any

from rankmesh._patch import Gate, Patch

__all__ = ["INIT_DEVICE_MESH", "INIT_PROCESS_GROUPS", "PATCHES", "accelerate", "created_groups", "restore"]


def created_groups() -> int:
    """How many process groups the ``init_process_groups`` patch has created on this rank for the
    current default group (every dim served, by backend and kind: ``MeshBuilder.report()``)."""
    from rankmesh import _devicemesh_torch

    return _devicemesh_torch.created_groups()


# Installing imports nothing (the switch installs these while torch's device_mesh is being imported);
# the torch side, rankmesh._devicemesh_torch, is imported by the first call.


def _make_init_process_groups(torch_init_process_groups: Any) -> Any:
    def _init_process_groups(layout, rank_map, mesh_dim_names, backend_override, preserve_rank_order=False):  # noqa: ANN001, ANN202
        from rankmesh import _devicemesh_torch

        return _devicemesh_torch.init_process_groups(
            torch_init_process_groups, layout, rank_map, mesh_dim_names, backend_override, preserve_rank_order
        )

    _init_process_groups.__doc__ = torch_init_process_groups.__doc__
    _init_process_groups.__qualname__ = "DeviceMesh._init_process_groups"
    return _init_process_groups


def _make_init_device_mesh(torch_init_device_mesh: Any) -> Any:
    def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None, backend_override=None):  # noqa: ANN001, ANN202
        from rankmesh import _devicemesh_torch

        return _devicemesh_torch.init_device_mesh(
            torch_init_device_mesh, device_type, mesh_shape, mesh_dim_names, backend_override
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
