"""Every package rankmesh reads beyond numpy, the releases it has read (the pin; their code is in
:data:`rankmesh._known.TABLES`), and one policy for the rest:

- **not installed**: the feature that needs it raises ``ImportError`` naming the pip extra (an
  accelerator such as ``rankmesh.torchtitan.accelerate()`` warns once and does nothing);
- **installed at a version rankmesh has not read**: one ``RuntimeWarning`` per package and
  version, and the framework's own code runs unchanged (stock speed, never a wrong answer).

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
    "available",
    "install_hint",
    "release_in",
    "release_of",
    "report",
    "unsupported",
    "version",
    "warn_unsupported",
]

_VERSION = re.compile(
    r"v?(\d+(?:\.\d+)*)(?:[.-]?(?:a|b|c|rc|alpha|beta|pre|preview|dev|post)\d*)*(?:\+[A-Za-z0-9.]+)?$"
)


@dataclass(frozen=True)
class Dependency:
    """One package: distribution and import names, the releases read (a release holds every version
    that starts with it: ``"0.16"`` holds ``0.16.1``), its pip extra, what rankmesh does with it, and
    ``"module:attribute"`` holding its version where it may have no install metadata (a source
    checkout on ``PYTHONPATH``)."""

    distribution: str
    module: str
    releases: tuple[str, ...]
    extra: str | None
    used_for: str
    version_attr: str | None = None

    def supports(self, version: str) -> bool:
        return self.release(version) is not None

    def release(self, version: str) -> str | None:
        return release_in(version, self.releases)

    @property
    def supported(self) -> str:
        return ", ".join(self.releases)


def release_in(version: str, releases: tuple[str, ...]) -> str | None:
    """The first of ``releases`` that ``version`` belongs to (pre-releases and local builds count),
    or None; a PEP 440 version read with one regular expression (packaging costs ~3 ms to import).

        >>> release_in("2.15.0+cu132", ("2.13", "2.15")), release_in("0.16.0", ("0.16.1",))
        ('2.15', None)
    """
    hit = _releases.get((version, releases), "")
    if hit != "":
        return hit
    m = _VERSION.match(version.strip())
    have = tuple(int(x) for x in m.group(1).split(".")) if m else ()
    found = next((r for r in releases if m and have[: r.count(".") + 1] == tuple(map(int, r.split(".")))), None)
    if len(_releases) < 256:
        _releases[(version, releases)] = found
    return found


_releases: dict[tuple[str, tuple[str, ...]], str | None] = {}

#: Every package rankmesh reads beyond numpy, by distribution name.
DEPENDENCIES: dict[str, Dependency] = {
    d.distribution: d
    for d in (
        Dependency(
            "torch", "torch", ("2.13", "2.14", "2.15"), "torch", "process groups and meshes", "torch:__version__"
        ),
        Dependency(
            "torchtitan", "torchtitan", ("0.3.0",), "torchtitan", "the torchtitan patch", "torchtitan:__version__"
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
            "rankmesh.megatron, the megatron and megatron_fsdp patches",
            "megatron.core.package_info:__version__",
        ),
        Dependency(
            "deepspeed",
            "deepspeed",
            ("0.19",),
            "deepspeed",
            "the deepspeed_topology and deepspeed_grid patches (its pipeline topology and grid)",
            "deepspeed:__version__",
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
    """The installed version of ``distribution``, or None; read once per process: from its module
    when imported already (``torch.__version__``: metadata costs 1-3 ms), else its install metadata
    (kept once per install for a package that names no version: :func:`_kept_version`), else the
    module's attribute after importing it."""
    if distribution not in _versions:
        dep = DEPENDENCIES[distribution]
        found = _from_module(dep, imported_only=True)
        if found is None:
            found = _kept_version(dep) or _metadata_version(dep)
        _versions[distribution] = found
    return _versions[distribution]


def _metadata_version(dep: Dependency) -> str | None:
    try:  # the Version: header, not the whole METADATA parsed as e-mail (~2 ms)
        dist = metadata.distribution(dep.distribution)
    except metadata.PackageNotFoundError:
        return _from_module(dep)
    m = re.search(r"^Version:[ \t]*(\S+)", dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "", re.M)
    return m.group(1) if m else dist.version


def _kept_version(dep: Dependency) -> str | None:
    """The metadata version of an imported package that names none (spmd_types), kept once per
    install (:mod:`rankmesh._verdicts`): :mod:`importlib.metadata` searches every ``sys.path`` entry
    (~0.3 ms of the first mesh). The key: the package's file, and the mtime of every ``sys.path``
    entry (installing or removing a package there changes it). None when not imported."""
    file = getattr(sys.modules.get(dep.module), "__file__", None)
    if not isinstance(file, str):
        return None
    from rankmesh import _verdicts

    lines = [f"distribution={dep.distribution!r}", f"python={sys.version!r}"]
    for entry in [file, *sys.path]:
        try:
            st = os.stat(entry or ".")
            lines.append(f"path {entry!r} {st.st_size if entry == file else '-'} {st.st_mtime_ns}")
        except (OSError, TypeError, ValueError):
            lines.append(f"path {entry!r} -")
    compute = functools.partial(_metadata_version, dep)
    return _verdicts.verdict(f"version {dep.distribution}", "\n".join(lines), compute)


def _from_module(dep: Dependency, *, imported_only: bool = False) -> str | None:
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
    """The release read that the installed ``distribution`` belongs to (``"2.15"`` for 2.15.0+cu132),
    or None.

        >>> release_of("torch") in DEPENDENCIES["torch"].releases
        True
    """
    installed = version(distribution)
    return None if installed is None else DEPENDENCIES[distribution].release(installed)


def available(distribution: str) -> bool:
    """Whether ``distribution``'s module can be found (not imported; a dotted name's parents are)."""
    try:
        return importlib.util.find_spec(DEPENDENCIES[distribution].module) is not None
    except ModuleNotFoundError:
        return False


def install_hint(distribution: str) -> str:
    """The one place a ``pip install`` line is written.

    >>> install_hint("matplotlib")
    "pip install 'rankmesh[plot]'"
    """
    return f"pip install 'rankmesh[{DEPENDENCIES[distribution].extra}]'"


def unsupported(
    distribution: str, releases: tuple[str, ...] | None = None, *, installed: str | None = "", reader: str = "rankmesh"
) -> str | None:
    """Why the installed ``distribution`` (or ``installed``; None: not installed) is not a release
    ``reader`` has read (``releases``, default the pin), or None."""
    releases = DEPENDENCIES[distribution].releases if releases is None else releases
    installed = version(distribution) if installed == "" else installed
    if installed is None:
        return f"{distribution} is not installed ({install_hint(distribution)})"
    if release_in(installed, releases) is None:
        return f"{distribution} {installed} is not a version {reader} has read (supported: {', '.join(releases)})"
    return None


def warn_unsupported(distribution: str, reason: str, fallback: str, *, stacklevel: int = 3) -> None:
    """The policy's one warning: ``reason`` and what runs instead, once per package and reason."""
    warn_once(("dependencies", distribution, reason), f"rankmesh: {reason}; {fallback}", stacklevel=stacklevel)


def report() -> list[tuple[str, str | None, str, bool]]:
    """``(distribution, installed version or None, supported releases, supported?)`` for each."""
    return [(n, v := version(n), d.supported, v is not None and d.supports(v)) for n, d in DEPENDENCIES.items()]
