"""The one switch: every acceleration rankmesh has, each installed when its framework is imported.

``RANKMESH_ACCELERATE=1`` in a job's environment, ``rankmesh run CMD``, or ``rankmesh.accelerate()``
before the frameworks are imported: nothing else changes in the training script. Each patch of
:mod:`rankmesh.patches` that the switch reaches is installed the moment the module it patches has
run (:data:`HOOKS`), before anything can bind its names, or at once when that module is imported
already:

=====================================================  =========================================
module imported                                        patches installed
=====================================================  =========================================
``torch.distributed.device_mesh``                      ``init_process_groups``, ``init_device_mesh``
``spmd_types._mesh_axis``                              ``spmd_axis_le``
``torchtitan.distributed.parallel_dims``               ``torchtitan``
``megatron.core.parallel_state``                       ``megatron``
``megatron.core.distributed.fsdp.mcore_fsdp_adapter``  ``megatron_fsdp``
``deepspeed.runtime.pipe.topology``                    ``deepspeed_topology``, ``deepspeed_grid``
``deepspeed.utils.groups``                             ``deepspeed_groups``
=====================================================  =========================================

Each patch is gated as always, by the release of its dependency and the bodies of the functions
it reproduces (:class:`rankmesh.patches.Patch`): on code it has not read it warns once and the
framework's own code runs, never a crash. ``RANKMESH_DISABLE=<name>`` keeps any one out. When the
switch installs patches it says so once per module at ``INFO`` on the ``rankmesh`` logger (silent at
Python's default level); :func:`status` (``rankmesh status``) says, without starting a job, which
patches this environment would get and why the others would not.

    >>> import rankmesh
    >>> {"init_device_mesh", "init_process_groups"} <= set(rankmesh.accelerate())  # the frameworks' on import
    True
    >>> rankmesh.restore()
    >>> [p.name for p in patches("megatron.core.parallel_state")]
    ['megatron']
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import time
import types
from typing import Any

from rankmesh._once import warn_once
from rankmesh._patch import Patch, disabled

__all__ = ["HOOKS", "accelerate", "install_seconds", "on_import", "patches", "restore", "status"]

#: Module imported -> the patches its import brings (``"defining module:attribute"``, imported only
#: then). ``_rankmesh_autostart.TARGETS`` lists the same modules; a test holds the two equal, and
#: holds every patch of :data:`rankmesh.patches.REGISTRY` but ``concatenate`` (which the first
#: rankmesh mesh installs) to appear here once.
HOOKS: dict[str, tuple[str, ...]] = {
    "torch.distributed.device_mesh": (
        "rankmesh.devicemesh:INIT_PROCESS_GROUPS",
        "rankmesh.devicemesh:INIT_DEVICE_MESH",
    ),
    "spmd_types._mesh_axis": ("rankmesh.torchtitan.spmd_axis:PATCH",),
    "torchtitan.distributed.parallel_dims": ("rankmesh.torchtitan:PATCH",),
    "megatron.core.parallel_state": ("rankmesh.megatron.route:PATCH",),
    "megatron.core.distributed.fsdp.mcore_fsdp_adapter": ("rankmesh.megatron.fsdp:PATCH",),
    "deepspeed.runtime.pipe.topology": ("rankmesh.deepspeed:TOPOLOGY", "rankmesh.deepspeed:GRID"),
    "deepspeed.utils.groups": ("rankmesh.deepspeed:GROUPS",),
}

_log = logging.getLogger("rankmesh")


def _patch(ref: str) -> Patch:
    module, attribute = ref.split(":")
    return getattr(importlib.import_module(module), attribute)


def patches(module: str | None = None) -> list[Patch]:
    """The patches the switch installs (those of ``module`` only, when given), in :data:`HOOKS`' order."""
    refs = HOOKS[module] if module is not None else [r for rs in HOOKS.values() for r in rs]
    return [_patch(r) for r in refs]


def on_import(module: str) -> list[str]:
    """Install the patches of ``module``, which has just run (the start-up hook calls this); returns
    the names this call installed (one already in place is not counted, nor logged again). A patch
    that does not recognise the code warns once and stays out."""
    todo = [p for p in patches(module) if not p.installed]  # imports rankmesh's modules: not timed
    t0 = time.perf_counter()
    names = [p.name for p in todo if p.install()]
    _spent[0] += time.perf_counter() - t0
    if names:
        _log.info("rankmesh: %s imported; installed %s", module, ", ".join(names))
    return names


_spent = [0.0]


def install_seconds() -> float:
    """The time this process has spent in :func:`on_import` installing patches (their start-up
    checks): ``rankmesh bench`` counts it in the first call, since the imports it rides on are not
    timed."""
    return _spent[0]


def _autostart() -> Any:
    """``_rankmesh_autostart`` (the wheel installs it beside the package), or None."""
    try:
        import _rankmesh_autostart
    except ImportError:
        return None
    return _rankmesh_autostart


def accelerate() -> list[str]:
    """Turn the switch on in this process (``RANKMESH_ACCELERATE=1`` does it at start-up): torch's
    two ``DeviceMesh`` patches now, each framework's when it is imported (at once where it is
    imported already). Returns the names of the switch's patches in place now. Idempotent;
    :func:`restore` undoes it.

    Call it before the frameworks are imported. A name that a module bound before the call (``from
    torch.distributed.device_mesh import init_device_mesh`` at the top of a script) keeps the
    original function: that is warned about once, naming the module, and meshes it builds still get
    the ``init_process_groups`` patch. ``RANKMESH_ACCELERATE=1`` for the whole job avoids it.
    """
    hook = _autostart()
    if hook is not None:
        hook.install_hook(tuple(HOOKS))
    else:  # a source tree without the wheel's start-up module: what is imported now, and torch's
        later = [m for m in HOOKS if m not in sys.modules and m != "torch.distributed.device_mesh"]
        for module in HOOKS:
            if module in sys.modules:
                on_import(module)
        if later:
            warn_once(
                ("switch", "no hook"),
                "rankmesh.accelerate(): _rankmesh_autostart is not installed (rankmesh runs from a source tree, "
                f"not its wheel), so {', '.join(later)} will not be patched when imported; import them first",
                stacklevel=2,
            )
    importlib.import_module("torch.distributed.device_mesh")  # its patches now (the hook's, or:)
    on_import("torch.distributed.device_mesh")
    _warn_bound_early()
    return [p.name for p in patches() if p.installed]


def restore() -> None:
    """Turn the switch off: stop waiting for imports, and put back every patch it installed (meshes
    and groups made meanwhile stay as they are)."""
    hook = _autostart()
    if hook is not None:
        hook.remove_hook()
    for p in reversed(patches()):
        p.restore()


def _warn_bound_early() -> None:
    """One warning per module that holds, under the patched name, the function a module-level patch
    replaced: it bound the name before the patch, so its calls reach the original."""
    seen: set[int] = set()  # torchtitan's patch replaces the same torch function: one warning
    holders = {p.owner for p in patches() if p.installed}
    for p in patches():
        if not p.installed or not isinstance(p.holder, types.ModuleType) or id(p.original()) in seen:
            continue
        original = p.original()
        seen.add(id(original))
        skip = {*holders, *p.aliases}
        bound: dict[int, str] = {}  # one name per module object (__mp_main__ is __main__)
        for name, m in list(sys.modules.items()):
            if name not in skip and getattr(m, "__dict__", {}).get(p.attribute) is original:
                bound.setdefault(id(m), name)
        early = sorted(bound.values())
        if early:
            warn_once(
                ("switch", "bound early", p.name, tuple(early)),
                f"rankmesh.accelerate(): {', '.join(early)} bound {p.attribute} before the call, so its calls run "
                f"the original {p.target} at stock speed; call rankmesh.accelerate() before importing them, or set "
                "RANKMESH_ACCELERATE=1 for the job",
                stacklevel=3,
            )


def status() -> list[tuple[str, str, str, str]]:
    """``(patch, target, state, why)`` for every patch the switch installs and the fast paths that
    replace nothing, in this environment, without starting a job (a framework that is installed is
    imported to read its code). ``state`` is ``"on"`` (installed in this process), ``"ready"`` (its
    release and bodies are recognised: the switch installs it when the framework is imported) or
    ``"off"`` (``why`` says why: not installed, disabled, a release or body not read)."""
    from rankmesh import _dependencies
    from rankmesh.mesh import CONCATENATE

    rows = []
    for p in [*patches(), CONCATENATE]:
        version = _dependencies.version(p.dependency) if _dependencies.available(p.dependency) else None
        if p.installed:
            rows.append((p.name, p.target, "on", f"installed in this process ({p.dependency} {version})"))
        elif disabled(p.name):
            rows.append((p.name, p.target, "off", "RANKMESH_DISABLE names it"))
        elif version is None:
            rows.append((p.name, p.target, "off", f"{p.dependency} is not installed"))
        else:
            with contextlib.redirect_stdout(sys.stderr):  # what a framework prints on import (DeepSpeed's
                reason = p.recognise()  # accelerator line) is not this table
            state, why = ("ready", f"{p.dependency} {version}: release and bodies recognised")
            rows.append((p.name, p.target, state, why) if reason is None else (p.name, p.target, "off", reason))
    rows.append(_fast_groups_row())
    return rows


def _fast_groups_row() -> tuple[str, str, str, str]:
    from rankmesh import _fast_groups_check as check

    target = "c10d's group registry (new_group, split_group)"
    if disabled("fast_groups"):
        return ("fast_groups", target, "off", "RANKMESH_DISABLE names it")
    reason = check._static_reason() or check._names_reason()
    if reason is not None:
        return ("fast_groups", target, "off", reason)
    return ("fast_groups", target, "ready", "names and tables recognised; a one-rank probe runs at the first group")
