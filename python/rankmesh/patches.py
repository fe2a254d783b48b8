"""Everything rankmesh changes in torch and in frameworks, in one registry.

rankmesh never edits an installed package. Where a framework's own code path grows with the world
(torchtitan's mesh build, ``spmd_types``' axis comparison, Megatron-FSDP's meshes, torch's
``DeviceMesh._concatenate`` on rankmesh meshes), rankmesh swaps one attribute for its own function,
and only here. Each such swap is a :class:`Patch`: a named object that says what it replaces, which
versions and which exact function bodies it recognises, whether it is installed, and how to undo it.

- ``install()`` swaps the attribute in one assignment (never a half-patched state) and returns
  whether the patch is in place. On a version or body it does not recognise it warns once and
  leaves the original alone: the original then runs, at stock speed, never a wrong answer.
- ``restore()`` puts the original back; :func:`restore_all` undoes every patch.
- ``RANKMESH_DISABLE=name,name`` (or ``all``) in the environment keeps the named patches out:
  ``install()`` then returns False without a warning.

    >>> import rankmesh.patches as patches
    >>> sorted(patches.REGISTRY)  # doctest: +NORMALIZE_WHITESPACE
    ['concatenate', 'init_device_mesh', 'init_process_groups', 'megatron', 'megatron_fsdp',
     'spmd_axis_le', 'torchtitan']
    >>> p = patches.get("concatenate")
    >>> p.target, p.installed in (True, False)
    ('torch.distributed.device_mesh.DeviceMesh._concatenate', True)
"""

from __future__ import annotations

from rankmesh import devicemesh, mesh, torchtitan
from rankmesh._patch import Patch, disabled, source_hash
from rankmesh.errors import UnknownNameError
from rankmesh.megatron import fsdp, route
from rankmesh.torchtitan import spmd_axis

__all__ = ["REGISTRY", "Patch", "disabled", "get", "installed", "restore_all", "source_hash"]


#: Every patch rankmesh can install, by name.
REGISTRY: dict[str, Patch] = {
    p.name: p
    for p in (mesh.CONCATENATE, spmd_axis.PATCH, torchtitan.PATCH, route.PATCH, fsdp.PATCH, *devicemesh.PATCHES)
}


def get(name: str) -> Patch:
    """The patch called ``name``; otherwise an :class:`~rankmesh.errors.UnknownNameError` (also a
    ``KeyError``) with ``kind`` ``"unknown_patch"``, naming ``name`` and listing the patches."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = tuple(sorted(REGISTRY))
        raise UnknownNameError(
            f"no rankmesh patch {name!r}; the patches are {', '.join(known)}",
            field="name",
            value=name,
            kind="unknown_patch",
            ctx={"patches": known},
            fix=f"pass one of {', '.join(known)} as {{name}}",
        ) from None


def installed() -> list[str]:
    """The names of the patches in place now."""
    return [n for n, p in REGISTRY.items() if p.installed]


def restore_all() -> None:
    """Undo every patch in the registry: stock behaviour is back. Meshes built meanwhile stay as
    they are."""
    for p in REGISTRY.values():
        p.restore()
