"""``RANKMESH_ACCELERATE=1``: every rankmesh acceleration in every Python process of a job, with no
change to its code (the one switch: :mod:`rankmesh.switch`).

rankmesh's wheel installs this module and ``rankmesh-autostart.pth`` at the top of site-packages
(the wheel's ``.data/purelib``; the source is ``python/rankmesh.data/purelib/``). Python's ``site``
runs the ``.pth`` file's one line at every interpreter start, and it imports this module only when
``RANKMESH_ACCELERATE`` is set to something: a process without it pays one environment lookup, one
with it a few standard-library imports (well under 1 ms). The value is read by :func:`parse`:
``1``, ``true``, ``yes``, ``on`` turn it on, ``0``, ``false``, ``no``, ``off`` and ``""`` off (any
case); anything else warns once and stays off. This module is outside the ``rankmesh`` package on
purpose: importing the package waits until a module it patches is imported, so a process that
never uses torch or a framework pays nothing more (it imports no module Python's start-up has not
imported already: ~0.3 ms with its bytecode cached, as a pip install leaves it, and ~80 ns for
every other import while it waits).

Nothing is imported here. A meta-path finder waits for each module in :data:`TARGETS` (torch's
``device_mesh``, torchtitan's ``parallel_dims``, spmd_types' ``_mesh_axis``, megatron-core's
``parallel_state``, Megatron-FSDP's adapter, DeepSpeed's pipeline ``topology`` and ``groups``)
and, the moment that module has run and before anything else can bind its names, installs the
patches that belong to it (:func:`rankmesh.switch.on_import`): ``torch.distributed``'s own ``from .device_mesh import
init_device_mesh`` then already gets rankmesh's, and so does every framework imported later.
Launchers pass the environment on, so one variable reaches every rank that ``torchrun``,
``torch.multiprocessing``, ``mpirun`` or Slurm's ``srun`` starts; Ray workers get it through the
job's ``runtime_env={"env_vars": {"RANKMESH_ACCELERATE": "1"}}``. ``rankmesh run -- CMD ...`` sets
it for a command and everything it starts.

A failure here never stops the interpreter or breaks an import: the module imports as it would
without rankmesh, one warning says why, and its own code runs.
"""

import sys  # and os, already imported by Python's start-up: no other import (not even __future__)

__all__ = ["ENV", "TARGETS", "enabled", "install_hook", "parse", "pending", "remove_hook"]

#: The variable that turns rankmesh on at interpreter start.
ENV = "RANKMESH_ACCELERATE"

#: The modules whose import installs rankmesh's patches, in the order they are usually imported.
#: :data:`rankmesh.switch.HOOKS` says which patches each one brings; a test holds the two equal.
TARGETS: tuple[str, ...] = (
    "torch.distributed.device_mesh",
    "spmd_types._mesh_axis",
    "torchtitan.distributed.parallel_dims",
    "megatron.core.parallel_state",
    "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
    "deepspeed.runtime.pipe.topology",
    "deepspeed.utils.groups",
)

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def parse(value: str | None) -> bool | None:
    """``RANKMESH_ACCELERATE``'s value read as on (True), off (False) or neither (None).

    >>> [parse(v) for v in ("1", "TRUE", " on ", "0", "False", "off", "", None, "2", "enable")]
    [True, True, True, False, False, False, False, False, None, None]
    """
    value = (value or "").strip().lower()
    if value in _ON:
        return True
    return False if value in _OFF else None


def enabled(environ: object = None) -> bool:
    """Whether ``environ`` (default ``os.environ``) turns the switch on; a value that is neither on
    nor off (:func:`parse`) warns once and counts as off."""
    import os

    raw = (os.environ if environ is None else environ).get(ENV)
    verdict = parse(raw)
    if verdict is None:
        _warn(
            f"rankmesh: {ENV}={raw!r} is neither on (1, true, yes, on) nor off (0, false, no, off, empty); "
            "rankmesh stays off"
        )
        return False
    return verdict


_warned: set[str] = set()


def _warn(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        import warnings

        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _installed(fullname: str) -> None:
    """The patches of ``fullname``, which has just run; a failure warns and leaves its code alone."""
    try:
        from rankmesh import switch

        switch.on_import(fullname)
    except Exception as e:  # noqa: BLE001 - never break a job's imports: the framework's own code runs
        _warn(f"rankmesh: the patches for {fullname} could not be installed ({e!r}); its own code runs")


class _Loader:
    """The real loader of a target module, then its patches (everything else is the real loader's)."""

    def __init__(self, loader: object, fullname: str) -> None:
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)

    def exec_module(self, module: object) -> None:
        self._loader.exec_module(module)
        _installed(self._fullname)

    def __getattr__(self, name: str) -> object:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)


class _Finder:
    """Finds nothing itself: wraps the loader of each module still :func:`pending` once, then
    leaves ``sys.meta_path`` when none is left. Any other import costs one set lookup."""

    def __init__(self) -> None:
        self.pending: set[str] = set()

    def find_spec(self, fullname: str, path: object, target: object = None) -> object:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending:
            remove_hook()
        for finder in list(sys.meta_path):  # the rest of the import system, as it would have run
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def _finder() -> "_Finder | None":
    return next((f for f in sys.meta_path if isinstance(f, _Finder)), None)


def pending() -> frozenset[str]:
    """The :data:`TARGETS` whose import is still awaited."""
    finder = _finder()
    return frozenset() if finder is None else frozenset(finder.pending)


def install_hook(targets: object = TARGETS) -> list[str]:
    """Install the patches of each of ``targets`` already imported now, and of the others when they
    are imported; returns the ones imported already (their patches were asked for now)."""
    now = [t for t in targets if t in sys.modules]
    later = [t for t in targets if t not in sys.modules]
    if later:
        finder = _finder()
        if finder is None:
            finder = _Finder()
            sys.meta_path.insert(0, finder)
        finder.pending.update(later)
    for name in now:
        _installed(name)
    return now


def remove_hook() -> None:
    """Stop waiting for the targets (patches already installed stay)."""
    finder = _finder()
    if finder is not None:
        finder.pending.clear()
        sys.meta_path.remove(finder)


if enabled():
    install_hook()
