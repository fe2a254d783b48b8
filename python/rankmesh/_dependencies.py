"""Every package rankmesh reads beyond numpy, the versions it has read, and one policy for the rest
(polars' ``dependencies.py`` habit).

The policy, the same for each:

- **not installed**: the feature that needs it raises ``ImportError`` naming the pip extra (or,
  for an accelerator such as ``rankmesh.torchtitan.accelerate()``, warns once and does nothing);
- **installed at a version rankmesh has not read**: one ``RuntimeWarning`` per package and
  version, and the framework's own code runs unchanged (stock speed, never a wrong answer).

:func:`report` says what is installed and whether rankmesh has read it::

    >>> DEPENDENCIES["megatron-core"].supports("0.16.1"), DEPENDENCIES["megatron-core"].supports("0.17.0")
    (True, False)
    >>> DEPENDENCIES["torch"].supports("2.15.0+cu132")
    True
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from importlib import metadata

from rankmesh._once import warn_once

__all__ = [
    "DEPENDENCIES",
    "Dependency",
    "version",
    "release_of",
    "release_in",
    "available",
    "install_hint",
    "unsupported",
    "warn_unsupported",
    "report",
]


_VERSION = re.compile(
    r"v?(\d+(?:\.\d+)*)(?:[.-]?(?:a|b|c|rc|alpha|beta|pre|preview|dev|post)\d*)*(?:\+[A-Za-z0-9.]+)?$"
)


@dataclass(frozen=True)
class Dependency:
    """One package: its distribution and import names, the releases rankmesh has read (a release
    matches every version that starts with it: ``"0.16"`` holds ``0.16.1``, ``"0.3.0"`` only
    ``0.3.0`` and its local builds), the pip extra that installs it, and what rankmesh does with it."""

    distribution: str
    module: str
    releases: tuple[str, ...]
    extra: str | None
    used_for: str
    #: ``"module:attribute"`` holding the version, read when the package has no install metadata
    #: (e.g. Megatron-LM run from a source checkout on ``PYTHONPATH``).
    version_attr: str | None = None

    def supports(self, version: str) -> bool:
        """Whether ``version`` is one of :attr:`releases` (pre-releases and local builds of a
        release count as it)."""
        return self.release(version) is not None

    def release(self, version: str) -> str | None:
        """The release of :attr:`releases` that ``version`` belongs to, or None (:func:`release_in`)."""
        return release_in(version, self.releases)

    @property
    def supported(self) -> str:
        """The releases, for messages: ``"0.16"`` or ``"2.13, 2.14, 2.15"``."""
        return ", ".join(self.releases)


def release_in(version: str, releases: tuple[str, ...]) -> str | None:
    """The first of ``releases`` that ``version`` belongs to, or None: a release holds every version
    that starts with it, its pre-releases and local builds (a PEP 440 version read with one regular
    expression: packaging costs ~3 ms to import, and this is asked on the first mesh a process
    builds).

        >>> release_in("2.15.0+cu132", ("2.13", "2.15")), release_in("0.16.0", ("0.16.1",))
        ('2.15', None)
    """
    hit = _releases.get((version, releases), "")
    if hit != "":
        return hit
    m = _VERSION.match(version.strip())
    found = None
    if m is not None:
        have = tuple(int(x) for x in m.group(1).split("."))
        found = next((r for r in releases if have[: len(r.split("."))] == tuple(int(x) for x in r.split("."))), None)
    if len(_releases) < 256:
        _releases[(version, releases)] = found
    return found


_releases: dict[tuple[str, tuple[str, ...]], str | None] = {}  # asked by every check on the first mesh


#: Every package rankmesh reads beyond numpy, by distribution name.
DEPENDENCIES: dict[str, Dependency] = {
    d.distribution: d
    for d in (
        Dependency(
            "torch",
            "torch",
            ("2.13", "2.14", "2.15"),
            "torch",
            "process groups and DeviceMesh objects",
            "torch:__version__",
        ),
        Dependency(
            "torchtitan",
            "torchtitan",
            ("0.3.0",),
            "torchtitan",
            "rankmesh.torchtitan.accelerate() (ParallelDims)",
            "torchtitan:__version__",
        ),
        Dependency(
            "spmd_types",
            "spmd_types",
            ("0.2.3", "0.2.4", "0.3.0", "0.3.1"),
            "torchtitan",
            "the MeshAxis.__le__ patch (torchtitan's default spmd_types backend)",
        ),
        Dependency(
            "megatron-core",
            "megatron.core",
            ("0.16",),
            "megatron",
            "rankmesh.megatron.initialize_model_parallel (0.16) and the Megatron-FSDP patch (0.16.1)",
            "megatron.core.package_info:__version__",
        ),
        Dependency(
            "einops", "einops", ("0",), "megatron", "megatron-core's partial-DistOpt and hierarchical-cp groups"
        ),
        Dependency(
            "pyyaml", "yaml", ("5", "6"), "megatron", "initialize_model_parallel's nccl_communicator_config_path"
        ),
        Dependency("matplotlib", "matplotlib", ("3",), "plot", "rankmesh plan --picture and the benchmark plots"),
    )
}

_versions: dict[str, str | None] = {}


def version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a key of :data:`DEPENDENCIES`), or None: its
    :attr:`Dependency.version_attr` when its module is imported already (``torch.__version__``:
    reading install metadata costs 1-3 ms), else its install metadata, else (a source checkout on
    ``PYTHONPATH``) the attribute after importing the module."""
    if distribution not in _versions:
        dep = DEPENDENCIES[distribution]
        found = _version_from_module(dep, imported_only=True)  # no metadata parsing (1-3 ms for torch's)
        if found is None:
            found = _kept_version(dep)
        if found is None:
            found = _metadata_version(dep)
        _versions[distribution] = found
    return _versions[distribution]


def _metadata_version(dep: Dependency) -> str | None:
    """``dep``'s version from its install metadata, else (a source checkout on ``PYTHONPATH``) from
    its module's :attr:`Dependency.version_attr`, importing it; None when neither has one."""
    try:
        return _installed_version(metadata.distribution(dep.distribution))
    except metadata.PackageNotFoundError:
        return _version_from_module(dep)


def _kept_version(dep: Dependency) -> str | None:
    """The metadata version of a package that is imported already but names no version of its own
    (spmd_types), kept once per install (:mod:`rankmesh._verdicts`) as the start-up checks'
    verdicts are: :mod:`importlib.metadata`'s search of every ``sys.path`` entry costs ~0.3 ms of
    the first mesh. The key is what that search depends on: the package's ``__init__`` file (size
    and mtime) and the mtime of every ``sys.path`` entry (installing, upgrading or removing any
    package renames or adds a ``.dist-info`` folder there, which changes its folder's mtime, as
    :mod:`importlib.metadata` itself assumes when it caches its listings); None (the search runs)
    when the package is not imported or the cache is off."""
    module = sys.modules.get(dep.module)
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        return None
    from rankmesh import _verdicts  # a leaf: no torch, nothing of rankmesh

    lines = [f"distribution={dep.distribution!r}", f"python={sys.version!r}"]
    for entry in [file, *sys.path]:
        try:
            st = os.stat(entry or ".")
        except (OSError, TypeError, ValueError):
            lines.append(f"path {entry!r} -")
            continue
        lines.append(f"path {entry!r} {st.st_size if entry == file else '-'} {st.st_mtime_ns}")
    key = "\n".join(lines)
    compute = functools.partial(_metadata_version, dep)
    return _verdicts.verdict(f"version {dep.distribution}", key, compute)


def _installed_version(dist: metadata.Distribution) -> str:
    """``dist.version`` without parsing the whole METADATA file as e-mail (~2 ms the first time in
    a process, asked by patches on the first mesh): its ``Version:`` header line."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    m = _VERSION_HEADER.search(text)
    return m.group(1) if m else dist.version


_VERSION_HEADER = re.compile(r"^Version:[ \t]*(\S+)", re.M)


def _version_from_module(dep: Dependency, *, imported_only: bool = False) -> str | None:
    """``dep``'s :attr:`Dependency.version_attr`; with ``imported_only``, only from a module that is
    imported already (None otherwise), else importing it."""
    if dep.version_attr is None:
        return None
    module, attr = dep.version_attr.split(":")
    if imported_only:
        value = getattr(sys.modules.get(module), attr, None)
    elif not available(dep.distribution):
        return None
    else:
        try:
            value = getattr(importlib.import_module(module), attr, None)
        except Exception:  # noqa: BLE001 - a package that fails to import has no version to read
            return None
    return None if value is None else str(value)


def release_of(distribution: str) -> str | None:
    """The release of :attr:`Dependency.releases` the installed ``distribution`` belongs to (``"2.15"``
    for torch 2.15.0+cu132), or None: not installed, or a version rankmesh has not read.

        >>> release_of("torch") in DEPENDENCIES["torch"].releases
        True
    """
    installed = version(distribution)
    return None if installed is None else DEPENDENCIES[distribution].release(installed)


def available(distribution: str) -> bool:
    """Whether ``distribution``'s module can be found (``importlib.util.find_spec``: the module
    itself is not imported, but a dotted name's parent packages are)."""
    module = DEPENDENCIES[distribution].module
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def install_hint(distribution: str) -> str:
    """How to install ``distribution`` with rankmesh: the one place a ``pip install`` line is written.

    >>> install_hint("matplotlib")
    "pip install 'rankmesh[plot]'"
    """
    return f"pip install 'rankmesh[{DEPENDENCIES[distribution].extra}]'"


def unsupported(
    distribution: str,
    releases: tuple[str, ...] | None = None,
    *,
    installed: str | None = "",
    reader: str = "rankmesh",
) -> str | None:
    """Why the installed ``distribution`` is not one rankmesh has read (not installed, or another
    version), or None when it is. ``releases`` narrows :attr:`Dependency.releases` for a feature
    read against fewer (e.g. the Megatron-FSDP patch: ``("0.16.1",)``); ``installed`` is the
    version to judge (default: :func:`version`'s answer; None: not installed); ``reader`` names
    who has read the releases (``"this patch"``) in the reason."""
    releases = DEPENDENCIES[distribution].releases if releases is None else releases
    if installed == "":
        installed = version(distribution)
    if installed is None:
        return f"{distribution} is not installed ({install_hint(distribution)})"
    if release_in(installed, releases) is None:
        return f"{distribution} {installed} is not a version {reader} has read (supported: {', '.join(releases)})"
    return None


def warn_unsupported(distribution: str, reason: str, fallback: str, *, stacklevel: int = 3) -> None:
    """The policy's one warning: ``reason`` (from :func:`unsupported`) and what runs instead,
    once per package and reason."""
    warn_once(("dependencies", distribution, reason), f"rankmesh: {reason}; {fallback}", stacklevel=stacklevel)


def report() -> list[tuple[str, str | None, str, bool]]:
    """``(distribution, installed version or None, supported releases, supported?)`` for each."""
    out = []
    for name, dep in DEPENDENCIES.items():
        v = version(name)
        out.append((name, v, dep.supported, v is not None and dep.supports(v)))
    return out
