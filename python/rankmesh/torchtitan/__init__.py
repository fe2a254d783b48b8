"""Accelerate an installed torchtitan without editing it: ``rankmesh.torchtitan.accelerate()``.

torchtitan 0.3.0's ``ParallelDims.build_mesh`` makes a ``("world",)`` mesh with torch's
``init_device_mesh``, then unflattens it four or five times, flattens one submesh and slices the
results. With stock torch every rank materialises every group of every dim and creates a process
group per dim per unflatten: 10.4 s and 18 process groups per rank at 131,072 ranks.

After :func:`accelerate`, that world mesh is a :class:`rankmesh.FastDeviceMesh`, made by
:func:`rankmesh.init_device_mesh`. torchtitan's own ``build_mesh`` runs unchanged on it, so every
``_unflatten``, ``_flatten`` and slice is rankmesh's: O(group size) per rank, with one process
group per distinct partition of the world, shared by every mesh that has it.

In a training script, before the trainer builds its meshes::

    import rankmesh.torchtitan
    rankmesh.torchtitan.accelerate()          # for the rest of the process

    with rankmesh.torchtitan.accelerate():    # or only inside the block
        parallel_dims.build_mesh()

Without touching the script, from torchtitan's own configuration: prefix ``--module`` with
``rankmesh.torchtitan.models.`` (see :mod:`rankmesh.torchtitan.models`)::

    torchrun ... -m torchtitan.train --module rankmesh.torchtitan.models.llama3 --config llama3_8b

Two names are replaced, each in one assignment, so there is never a half-patched state:

- ``torchtitan.distributed.parallel_dims.init_device_mesh``: the installed torchtitan's module
  reads it when it builds its meshes. On a torchtitan version rankmesh has not read
  (``rankmesh._dependencies``), or when that name is not torch's ``init_device_mesh`` (someone else
  replaced it), :func:`accelerate` warns once and leaves torch's path, and the next name, in place.
- ``spmd_types._mesh_axis.MeshAxis.__le__``, where spmd_types is installed: the patch
  ``rankmesh.patches`` calls "spmd_axis_le" (:mod:`rankmesh.torchtitan.spmd_axis`). torch's FSDP2
  compares axes with it for every parameter, and spmd_types' own builds both axes' rank sets;
  rankmesh's compares their (size, stride) modes. On an spmd_types body it does not recognise it
  warns once and leaves spmd_types' own; ``RANKMESH_DISABLE=spmd_axis_le`` keeps it out.

:func:`restore` (or the handle's) puts both back; the second only where the acceleration put it in.
The first is the patch ``rankmesh.patches`` calls "torchtitan" (:data:`PATCH`), so
``rankmesh.patches.restore_all()`` undoes it too and ``RANKMESH_DISABLE=torchtitan`` keeps it out.

    >>> import rankmesh.torchtitan as rt
    >>> rt.is_accelerated()
    False
    >>> with rt.accelerate() as acc:
    ...     (rt.is_accelerated(), acc.active)
    (True, True)
    >>> rt.is_accelerated()
    False
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from rankmesh._dependencies import available, warn_unsupported
from rankmesh._dependencies import version as dependency_version
from rankmesh._patch import Gate, Patch

__all__ = [
    "PATCH",
    "Acceleration",
    "accelerate",
    "restore",
    "is_accelerated",
    "installed_version",
]

_TARGET_MODULE = "torchtitan.distributed.parallel_dims"
_TARGET_NAME = "init_device_mesh"

_lock = threading.Lock()
# What the accelerate() call in force installed: its handle, PATCH's replacement and spmd_types'
# MeshAxis.__le__ replacement (None when that one was not its to install). Only what is still in
# place is taken out: after rankmesh.patches.restore_all() and a later install by someone else,
# an old handle touches nothing.
_owner: tuple[Acceleration, Any, Any] | None = None


def _still_torchs(original: Any) -> str | None:
    """None when ``original`` (the name torchtitan's module reads) is still torch's ``init_device_mesh``."""
    import inspect

    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    # rankmesh.accelerate()'s general patch may stand in either place (it keeps torch's function
    # as __wrapped__): torchtitan bound before it, or after it (RANKMESH_ACCELERATE=1).
    if inspect.unwrap(original) is not inspect.unwrap(torch_init_device_mesh):
        return (
            f"{_TARGET_MODULE}.{_TARGET_NAME} is {original!r}, not torch's init_device_mesh "
            "(something else replaced it)"
        )
    return None


def _make(original: Any) -> Any:
    def init_device_mesh(device_type: str, mesh_shape, *, mesh_dim_names=None, backend_override=None):  # noqa: ANN001, ANN202
        return _titan_init_device_mesh(
            device_type, mesh_shape, mesh_dim_names=mesh_dim_names, backend_override=backend_override
        )

    return init_device_mesh


#: The patch (listed in :mod:`rankmesh.patches`; installed by :func:`accelerate`).
PATCH = Patch(
    "torchtitan",
    _TARGET_MODULE,
    _TARGET_NAME,
    _make,
    why="torchtitan's meshes become rankmesh's: every _unflatten, _flatten and slice of its world mesh "
    "is O(group) with one process group per distinct partition",
    detail="(the name still torch's init_device_mesh)",
    # torchtitan's releases whose ParallelDims.build_mesh rankmesh has read and tests against, by
    # version (the name it replaces is torch's function, checked by identity)
    gate=Gate("torchtitan"),
    check=_still_torchs,
)


class Acceleration:
    """What :func:`accelerate` returns: a handle that is also a context manager.

    ``active`` says whether the call put the patch in place. Only that handle undoes it, on
    ``__exit__`` or :meth:`restore`; a handle from a call that found the patch already in place,
    or that refused (unsupported torchtitan), does nothing when closed.
    """

    __slots__ = ("reason",)

    def __init__(self, reason: str = "") -> None:
        #: Why the call did not patch ("" when it did).
        self.reason = reason

    @property
    def active(self) -> bool:
        """True while the patch this handle installed is in place."""
        return _owner is not None and _owner[0] is self and PATCH.replacement is _owner[1]

    def restore(self) -> None:
        """Put torch's ``init_device_mesh`` (and spmd_types' ``MeshAxis.__le__``) back, if this
        handle installed rankmesh's and they are still in place."""
        with _lock:
            if _owner is not None and _owner[0] is self:
                _unpatch()

    def __enter__(self) -> Acceleration:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()

    def __repr__(self) -> str:
        state = "active" if self.active else f"inactive ({self.reason or 'restored'})"
        return f"<rankmesh.torchtitan.Acceleration {state}>"


def _unpatch() -> None:
    """Take out what the acceleration in force installed, where it is still in place."""
    global _owner
    if _owner is not None:
        _, titan, le = _owner
        if PATCH.replacement is titan:
            PATCH.restore()
        if le is not None:
            from rankmesh.torchtitan import spmd_axis

            if spmd_axis.PATCH.replacement is le:
                spmd_axis.PATCH.restore()
    _owner = None


def _install_le() -> Any:
    """Install spmd_types' ``MeshAxis.__le__`` patch where spmd_types is installed; its
    replacement when this call put it in, else None (already in, disabled, or not recognised)."""
    if not available("spmd_types"):
        return None
    from rankmesh.torchtitan import spmd_axis

    patch = spmd_axis.PATCH
    return patch.replacement if not patch.installed and patch.install() else None


def restore() -> None:
    """Put torch's path (and spmd_types' ``MeshAxis.__le__``, where the acceleration put it in)
    back whoever turned the acceleration on (e.g. the ``--module`` route). Meshes built meanwhile
    stay as they are. Harmless when not accelerated."""
    with _lock:
        _unpatch()
        PATCH.restore()


def installed_version() -> str | None:
    """The installed torchtitan's version, or None when it is not installed."""
    return dependency_version("torchtitan")


def is_accelerated() -> bool:
    """True while torchtitan's ``ParallelDims.build_mesh`` builds its meshes through rankmesh."""
    return PATCH.installed


def _titan_init_device_mesh(device_type: str, mesh_shape, *, mesh_dim_names=None, backend_override=None):  # noqa: ANN001, ANN202
    """What torchtitan's ``parallel_dims`` module calls instead of torch's ``init_device_mesh``:
    :func:`rankmesh.init_device_mesh` with torch's rule for size-1 dims (a one-rank group on the
    default backend, not a fake one), so every axis torchtitan did not make fake is real, as with
    stock torch."""
    from rankmesh.mesh import init_device_mesh

    return init_device_mesh(
        device_type, mesh_shape, mesh_dim_names=mesh_dim_names, backend_override=backend_override, size_one_fake=False
    )


def accelerate() -> Acceleration:
    """Make the installed torchtitan build its meshes with rankmesh (see the module docstring).

    Returns an :class:`Acceleration`: ignore it to keep the acceleration for the rest of the
    process, or use it as a context manager to restore torch's path on exit. Calling it again
    while it is active is harmless (the second handle does nothing on exit).
    """
    global _owner
    with _lock:
        if PATCH.installed:
            return Acceleration("already accelerated")
        reason = PATCH.recognise()  # the patch's own checks: a torchtitan read, the name still torch's
        if reason is not None:
            what = "torchtitan keeps torch's own DeviceMesh path" if installed_version() else "nothing to accelerate"
            warn_unsupported("torchtitan", reason, f"rankmesh.torchtitan.accelerate(): {what}")
            return Acceleration(reason)
        if not PATCH.install():
            return Acceleration(f"the patch {PATCH.name!r} is disabled (RANKMESH_DISABLE) or not recognised")
        handle = Acceleration()
        _owner = (handle, PATCH.replacement, _install_le())
        return handle
