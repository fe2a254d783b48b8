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
from rankmesh._patch import KnownCode, Patch, disabled, resolve, source_hash
from rankmesh.errors import UnknownNameError
from rankmesh.megatron import fsdp, route
from rankmesh.torchtitan import spmd_axis

__all__ = ["REGISTRY", "Patch", "disabled", "get", "hashes", "installed", "known_code", "restore_all", "source_hash"]


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


def known_code() -> dict[str, KnownCode]:
    """Every :class:`~rankmesh.patches.KnownCode` rankmesh checks before it runs: each patch's, the
    fast process-group paths' (``fast_groups new_group``, ``fast_groups split_group``) and the
    self-check's ``DeviceMesh._concatenate`` (``fast_meshes``), by a name for people."""
    from rankmesh import _fast_groups_check, _torch_compat

    out = {f"patch {n}": p.code for n, p in REGISTRY.items()}
    out.update({f"fast_groups {n}": c for n, c in _fast_groups_check.KNOWN_BODIES.items()})
    out["fast_meshes"] = _torch_compat.CONCATENATE_CODE
    return out


def hashes() -> str:
    """The table entries for what is installed here, ready to paste: for each :func:`known_code`,
    the installed release's key and ``{dotted path: frozenset({source hash})}`` of every function
    any release of it names (a new torch or framework release is then the pin plus this entry).

        >>> "patch init_device_mesh" in hashes()
        True
    """
    from rankmesh import _dependencies

    lines = []
    for name, code in known_code().items():
        installed = _dependencies.version(code.dependency)
        if installed is None:
            lines.append(f"# {name}: {code.dependency} is not installed")
            continue
        release = code.release() or ".".join(installed.split("+")[0].split(".")[:2])
        known = "read" if code.release() else "NOT read yet: add the release to rankmesh._dependencies"
        lines.append(f"# {name}: {code.dependency} {installed} (release {release!r}: {known})")
        paths = sorted({p for bodies in code.bodies.values() for p in bodies})
        lines.append(f'"{release}": {{' + ("" if paths else "},"))
        for path in paths:
            try:
                digest = source_hash(resolve(path))
            except (ImportError, AttributeError, OSError, TypeError) as e:
                lines.append(f"    # {path}: {type(e).__name__}: {e}")
                continue
            lines.append(f'    "{path}": frozenset({{"{digest}"}}),')
        if paths:
            lines.append("},")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m rankmesh.patches hashes
    import sys

    if sys.argv[1:] != ["hashes"]:
        sys.exit("usage: python -m rankmesh.patches hashes   (the table entries for what is installed here)")
    print(hashes())
