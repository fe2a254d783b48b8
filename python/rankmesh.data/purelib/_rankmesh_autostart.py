"""``RANKMESH_ACCELERATE=1``: rankmesh's general patches in every Python process of a job, with no
change to its code.

rankmesh's wheel installs this module and ``rankmesh-autostart.pth`` at the top of site-packages
(the wheel's ``.data/purelib``; the source is ``python/rankmesh.data/purelib/``). Python's ``site``
runs the ``.pth`` file's one line at every interpreter start, and it imports this module only when
``RANKMESH_ACCELERATE`` is set (to anything but ``""`` or ``"0"``): a process without it pays one
environment lookup, one with it a few standard-library imports (~1 ms). This module is outside
the ``rankmesh`` package on purpose: importing the package (numpy, the native module: ~0.3 s)
waits until torch's ``device_mesh`` is imported, so a process that never uses torch pays nothing.

torch is not imported here (seconds). A meta-path hook waits for ``torch.distributed.device_mesh``
and, the moment that module has run and before anything can bind its names, installs
:func:`rankmesh.devicemesh.accelerate`'s patches; ``torch.distributed``'s own
``from .device_mesh import init_device_mesh`` then already gets rankmesh's, and so does every
framework imported later. Launchers pass the environment on, so one variable reaches every rank
that ``torchrun``, ``torch.multiprocessing``, ``mpirun`` or Slurm's ``srun`` starts; Ray workers get
it through the job's ``runtime_env={"env_vars": {"RANKMESH_ACCELERATE": "1"}}``.
``rankmesh run -- CMD ...`` sets it for a command and everything it starts.

A failure here never stops the interpreter: the patches warn and torch's own code runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

__all__ = ["ENV", "enabled", "install_hook"]

#: The variable that turns rankmesh on at interpreter start.
ENV = "RANKMESH_ACCELERATE"
_TARGET = "torch.distributed.device_mesh"


def enabled(environ: Any = None) -> bool:
    """Whether ``environ`` (default ``os.environ``) asks for rankmesh at start-up."""
    import os

    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    return value not in ("", "0")


def _accelerate() -> None:
    try:
        from rankmesh import devicemesh

        devicemesh.accelerate()
    except Exception as e:  # noqa: BLE001 - never break a job's start: torch's own code runs
        import warnings

        warnings.warn(f"rankmesh: {ENV} is set but the patches could not be installed ({e!r})", stacklevel=2)


class _Loader(importlib.abc.Loader):
    """The real loader of ``torch.distributed.device_mesh``, then the patches."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _accelerate()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``torch.distributed.device_mesh`` once."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install_hook() -> None:
    """Install the patches now if torch's ``device_mesh`` is imported already, else when it is."""
    if _TARGET in sys.modules:
        _accelerate()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


if enabled():
    install_hook()
