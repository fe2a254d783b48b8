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
  reads it when it builds its meshes. On a torchtitan version that is not in
  :data:`SUPPORTED_VERSIONS`, or when that name is not torch's ``init_device_mesh`` (someone else
  replaced it), :func:`accelerate` warns once and leaves torch's path, and the next name, in place.
- ``spmd_types._mesh_axis.MeshAxis.__le__``, where spmd_types is installed: the patch
  ``rankmesh.patches`` calls "spmd_axis_le" (:mod:`rankmesh.torchtitan.spmd_axis`). torch's FSDP2
  compares axes with it for every parameter, and spmd_types' own builds both axes' rank sets;
  rankmesh's compares their (size, stride) modes. On an spmd_types body it does not recognise it
  warns once and leaves spmd_types' own; ``RANKMESH_DISABLE=spmd_axis_le`` keeps it out.

:func:`restore` (or the handle's) puts both back; the second only where the acceleration put it in.

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
import warnings
from types import ModuleType, TracebackType

from rankmesh._dependencies import DEPENDENCIES, available, unsupported, warn_unsupported
from rankmesh._dependencies import version as dependency_version

__all__ = ["SUPPORTED_VERSIONS", "Acceleration", "accelerate", "restore", "is_accelerated", "installed_version"]

#: torchtitan releases whose ``ParallelDims.build_mesh`` rankmesh has read and tests against
#: (:mod:`rankmesh._dependencies`, where every optional dependency's versions live).
SUPPORTED_VERSIONS: tuple[str, ...] = DEPENDENCIES["torchtitan"].releases

_TARGET_MODULE = "torchtitan.distributed.parallel_dims"
_TARGET_NAME = "init_device_mesh"

_lock = threading.Lock()
_warned: set[str] = set()
# Set while the patch is in place: the module patched, the value it held before, and the handle
# that put it there (only that handle, or restore(), takes it out).
_patched: tuple[ModuleType, object, Acceleration] | None = None
# Whether accelerate() installed spmd_types' MeshAxis.__le__ patch (then restoring takes it out;
# one installed by someone else through rankmesh.patches stays).
_installed_le = False


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
        """True while this handle's patch is in place."""
        return _patched is not None and _patched[2] is self

    def restore(self) -> None:
        """Put torch's ``init_device_mesh`` (and spmd_types' ``MeshAxis.__le__``) back, if this
        handle installed rankmesh's."""
        with _lock:
            if _patched is not None and _patched[2] is self:
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
    global _patched, _installed_le
    if _patched is not None:
        module, original, _ = _patched
        setattr(module, _TARGET_NAME, original)
        _patched = None
    if _installed_le:
        from rankmesh.torchtitan import spmd_axis

        spmd_axis.PATCH.restore()
        _installed_le = False


def _install_le() -> bool:
    """Install spmd_types' ``MeshAxis.__le__`` patch where spmd_types is installed; whether this
    call put it in (False when it was already in, is disabled, or is not recognised)."""
    if not available("spmd_types"):
        return False
    from rankmesh.torchtitan import spmd_axis

    patch = spmd_axis.PATCH
    return not patch.installed and patch.install()


def restore() -> None:
    """Put torch's path (and spmd_types' ``MeshAxis.__le__``) back whoever turned the acceleration
    on (e.g. the ``--module`` route). Meshes built meanwhile stay as they are. Harmless when not
    accelerated."""
    with _lock:
        _unpatch()


def installed_version() -> str | None:
    """The installed torchtitan's version, or None when it is not installed."""
    return dependency_version("torchtitan")


def is_accelerated() -> bool:
    """True while torchtitan's ``ParallelDims.build_mesh`` builds its meshes through rankmesh."""
    return _patched is not None


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


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
    global _patched, _installed_le
    version = installed_version()
    reason = (
        unsupported("torchtitan")
        if version is None
        else None
        if DEPENDENCIES["torchtitan"].supports(version)
        else f"torchtitan {version} is not a version rankmesh has read (supported: {', '.join(SUPPORTED_VERSIONS)})"
    )
    if reason is not None:
        what = "nothing to accelerate" if version is None else "torchtitan keeps torch's own DeviceMesh path"
        warn_unsupported("torchtitan", reason, f"rankmesh.torchtitan.accelerate(): {what}")
        return Acceleration(reason)

    import importlib

    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    module = importlib.import_module(_TARGET_MODULE)
    with _lock:
        if _patched is not None:
            return Acceleration("already accelerated")
        current = getattr(module, _TARGET_NAME, None)
        if current is not torch_init_device_mesh:
            _warn_once(
                "foreign",
                f"rankmesh.torchtitan.accelerate(): {_TARGET_MODULE}.{_TARGET_NAME} is {current!r}, "
                "not torch's init_device_mesh (something else replaced it); leaving it alone",
            )
            return Acceleration(f"{_TARGET_MODULE}.{_TARGET_NAME} was replaced by something else")
        handle = Acceleration()
        setattr(module, _TARGET_NAME, _titan_init_device_mesh)
        _patched = (module, current, handle)
        _installed_le = _install_le()
        return handle
