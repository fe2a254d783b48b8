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
    ['concatenate', 'deepspeed_grid', 'deepspeed_groups', 'deepspeed_topology', 'init_device_mesh',
     'init_process_groups', 'megatron', 'megatron_fsdp', 'spmd_axis_le', 'torchtitan']
    >>> p = patches.get("concatenate")
    >>> p.target, p.installed in (True, False)
    ('torch.distributed.device_mesh.DeviceMesh._concatenate', True)
"""

from __future__ import annotations

import contextlib
import sys

from rankmesh import deepspeed, devicemesh, mesh, torchtitan
from rankmesh._known import TABLES
from rankmesh._patch import Gate, Patch, disabled, resolve, source_hash
from rankmesh.errors import UnknownNameError
from rankmesh.megatron import fsdp, route
from rankmesh.torchtitan import spmd_axis

__all__ = ["REGISTRY", "Gate", "Patch", "disabled", "gates", "get", "hashes", "installed", "restore_all", "source_hash"]


#: Every patch rankmesh can install, by name.
REGISTRY: dict[str, Patch] = {
    p.name: p
    for p in (
        mesh.CONCATENATE,
        spmd_axis.PATCH,
        torchtitan.PATCH,
        route.PATCH,
        fsdp.PATCH,
        *devicemesh.PATCHES,
        *deepspeed.PATCHES,
    )
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


def gates() -> dict[str, Gate]:
    """Every :class:`~rankmesh._patch.Gate` rankmesh asks before it runs, by a name for people: each
    patch's, the fast process-group paths' (``fast_groups new_group``, ``fast_groups split_group``)
    and the mesh self-check's ``DeviceMesh._concatenate`` (``fast_meshes``)."""
    from rankmesh import _fast_groups_check, _mesh_check

    out = {f"patch {n}": p.gate for n, p in REGISTRY.items()}
    out.update({f"fast_groups {n}": g for n, g in _fast_groups_check.GATES.items()})
    out["fast_meshes"] = _mesh_check.CONCATENATE_CODE
    return out


def hashes() -> str:
    """The table entries (:data:`rankmesh._known.TABLES`) of what is installed here, ready to paste:
    per dependency, its installed release's ``Release({dotted path: hash, ...}, facts)`` with every
    path any release of its table names. A new release is then the pin
    (:data:`rankmesh._dependencies.DEPENDENCIES`) plus this entry; its facts are copied from the
    newest release read, to be checked by hand.

        >>> "torch.distributed.device_mesh.init_device_mesh" in hashes()
        True
    """
    from rankmesh import _dependencies

    lines = []
    for dependency, table in TABLES.items():
        installed = _dependencies.version(dependency)
        if installed is None:
            lines.append(f"# {dependency} is not installed")
            continue
        release = _dependencies.release_in(installed, tuple(table))
        state = "read" if release else "NOT read: pin it in rankmesh._dependencies and paste this entry"
        key = release or ".".join(installed.split("+")[0].split(".")[:2])
        facts = table[release or next(reversed(table))].facts
        lines += [f"# {dependency} {installed}: {state}", f'"{dependency}": {{', f'    "{key}": Release(', "        {"]
        for path in sorted({p for r in table.values() for p in r.bodies}):
            try:
                with contextlib.redirect_stdout(sys.stderr):  # a framework's import chatter is not the entry
                    fn = resolve(path)
                lines.append(f'            "{path}": "{source_hash(fn)}",')
            except (ImportError, AttributeError, OSError, TypeError) as e:
                lines.append(f"            # {path}: {type(e).__name__}: {e}")
        lines.append("        }," + ("" if release else "  # facts copied from the newest release: check them"))
        lines += ([f"        {facts!r},"] if facts else []) + ["    ),", "},"]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m rankmesh.patches hashes
    if sys.argv[1:] != ["hashes"]:
        sys.exit("usage: python -m rankmesh.patches hashes   (the table entries for what is installed here)")
    print(hashes())
