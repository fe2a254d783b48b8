"""The :class:`Patch` object every rankmesh patch is, and :class:`KnownCode`, the one way rankmesh
recognises a dependency's code (it imports only rankmesh's leaves: ``_once``, ``_dependencies``,
``_verdicts``).

Each patch is defined next to the code it installs (``rankmesh.mesh``: ``DeviceMesh._concatenate``;
``rankmesh.torchtitan.spmd_axis``: ``MeshAxis.__le__``; ``rankmesh.megatron.fsdp``: Megatron-FSDP's
meshes; ``rankmesh.devicemesh``: torch's own ``DeviceMesh``); :mod:`rankmesh.patches` lists them all
and undoes them. Each carries a :class:`KnownCode` (the dependency, the releases read, the bodies),
and so do the checks that replace no attribute (the self-check's ``DeviceMesh._concatenate``,
``_fast_groups``' two paths): one verb, ``recognise()``, answers None or why not for all of them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import linecache
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from rankmesh import _dependencies, _verdicts
from rankmesh._once import warn_once

__all__ = [
    "SWITCHES",
    "KnownCode",
    "Patch",
    "code_lines",
    "disabled",
    "resolve",
    "source_hash",
    "text_hash",
    "verdict_scope",
]

_lock = threading.RLock()


def source_hash(fn: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``fn``'s source with blank lines and surrounding
    whitespace dropped: what a patch or a fast path compares to recognise the body it replaces or
    reproduces (a new release that changes the body changes the hash, whatever its version string
    says). The source is read straight from the file, without tokenizing (~0.1 ms a function once
    the file is read): see :func:`code_lines`."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"{fn!r} is not a Python function")
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise OSError(f"the source of {fn!r} is not available")
    return text_hash(code_lines(code, lines))


def code_lines(code: Any, lines: list[str]) -> list[str]:
    """The lines of the function ``code`` compiles, out of its file's ``lines``: from its first line
    (its first decorator) through its last statement. The last statement is found from the last
    line that holds code, then followed while lines are indented deeper than the ``def`` or close a
    bracket, so where a CPython places the last instruction does not change the answer."""
    first = code.co_firstlineno - 1
    last = max((line for _, _, line in code.co_lines() if line is not None), default=first + 1)
    if last > len(lines):
        raise OSError("the source file is shorter than the code")
    base = len(lines[first]) - len(lines[first].lstrip())
    end = last
    for j in range(last, len(lines)):
        text = lines[j].strip()
        if not text:
            continue
        if len(lines[j]) - len(lines[j].lstrip()) > base or text[0] in ")]}":
            end = j + 1
            continue
        break
    return lines[first:end]


def text_hash(lines: Any) -> str:
    """:func:`source_hash` of source lines already cut out (also how a hash is read off a release's
    source file without importing it)."""
    text = "\n".join(line.strip() for line in lines if line.strip())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve(path: str) -> Any:
    """The object at a dotted ``path``: the longest importable module prefix, then attributes (a
    module imported already is taken as it is, without the import machinery)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            obj = module
            try:
                for name in parts[i:]:
                    obj = getattr(obj, name)
                return obj
            except AttributeError:
                break  # a submodule not imported yet: the import machinery finds it
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        obj = module
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def verdict_scope(dependency: str) -> str:
    """The verdict file (:mod:`rankmesh._verdicts`) of ``dependency``'s install: the folder its
    module is installed in (``.../site-packages``: :func:`rankmesh._verdicts.install_scope`) and
    Python's version, so every check of one environment shares one file; its name and version
    where the module is not imported."""
    scope = _scopes.get(dependency)
    if scope is not None:
        return scope
    module = sys.modules.get(_dependencies.DEPENDENCIES[dependency].module)
    file = getattr(module, "__file__", None)
    if isinstance(file, str) and os.sep in file:
        scope = _scopes[dependency] = _verdicts.install_scope(file)  # where it was imported from: fixed
        return scope
    return f"{dependency} {_dependencies.version(dependency)} {sys.version}"


_scopes: dict[str, str] = {}


class KnownCode:
    """The code of one dependency that rankmesh has read, and the one question asked of it:
    :meth:`recognise`.

    ``bodies`` is the one shape every body hash is kept in: per release of ``dependency`` read,
    ``{dotted path: {source hashes}}`` of every function whose behaviour rankmesh reproduces or
    relies on (:func:`source_hash`; a release with no paths is recognised by its version alone). A
    release holds the versions that start with it (``"2.15"``: 2.15.0+cu132; ``"0.16.1"``); each
    must be one of the dependency's releases in :data:`rankmesh._dependencies.DEPENDENCIES`.
    ``reader`` names who read them, in the reason for another version (``"this patch"``).

        >>> import torch
        >>> KnownCode("torch", {"2.13": {}, "2.14": {}, "2.15": {}}).recognise() is None  # by version alone
        True
        >>> code = KnownCode("torch", {r: {"torch.distributed.get_rank": {"0" * 16}} for r in ("2.13", "2.14", "2.15")})
        >>> code.releases, code.recognise().startswith("torch.distributed.get_rank has a body rankmesh does not know")
        (('2.13', '2.14', '2.15'), True)
    """

    def __init__(self, dependency: str, bodies: dict[str, dict[str, frozenset[str]]], *, reader: str = "rankmesh"):
        read = [r for r in bodies if not _dependencies.DEPENDENCIES[dependency].supports(r)]
        if read:
            raise ValueError(f"{dependency} {read} is not among the releases rankmesh._dependencies lists")
        self.dependency = dependency
        self.bodies = bodies
        self.reader = reader
        self._seen: tuple[int, dict[str, frozenset[str]], tuple[Any, ...], str | None] | None = None

    @property
    def releases(self) -> tuple[str, ...]:
        """The releases read, for messages and tables: the keys of :attr:`bodies`."""
        return tuple(self.bodies)

    def release(self) -> str | None:
        """The release of :attr:`releases` the installed version belongs to, or None."""
        installed = _dependencies.version(self.dependency)
        return None if installed is None else _dependencies.release_in(installed, tuple(self.bodies))

    def known(self) -> dict[str, frozenset[str]] | None:
        """The bodies of the installed release (:meth:`release`), or None."""
        release = self.release()
        return None if release is None else self.bodies[release]

    def recognise(self) -> str | None:
        """Why the installed code is not the code read (not installed; a version not read; a
        function missing; a body whose hash is not known), or None when it is. The bodies are
        hashed once per install (:mod:`rankmesh._verdicts`, keyed by the hashes known and each
        function's file, first line, size and mtime), so a later process reads no source."""
        return self._unread() or self._bodies_reason()

    def _unread(self) -> str | None:
        return _dependencies.unsupported(self.dependency, tuple(self.bodies), reader=self.reader)

    def _bodies_reason(self) -> str | None:
        # The first mesh of every process runs this: plain loops, no comprehension or helper
        # (each is a code object of its own, ~5 us the first time it runs: rankmesh._verdicts).
        known = self.known() or {}
        fns = {}
        codes = []
        for path in known:
            try:
                fn = resolve(path)
            except (ImportError, AttributeError):
                return f"{path} does not exist"
            fns[path] = fn
            codes.append(_code(fn))
        if not fns:
            return None
        # Asked again in this process (the self-check, then the patch): the same functions' code
        # objects and the same hashes known give the same answer, without building the key.
        seen = self._seen
        if seen is not None and seen[0] == _verdicts.generation() and seen[1] == known:
            same = len(seen[2]) == len(codes)
            for a, b in zip(seen[2], codes):
                same = same and a is b
            if same:
                return seen[3]
        key = _bodies_key(fns, codes, known)
        if key is None:
            reason = _hashes_reason(fns, known)
        else:
            name = "bodies " + " ".join(sorted(fns))
            compute = functools.partial(_hashes_reason, fns, known)
            reason = _verdicts.verdict(name, key, compute, scope=verdict_scope(self.dependency))
        self._seen = (_verdicts.generation(), dict(known), tuple(codes), reason)
        return reason

    def __repr__(self) -> str:
        return f"<rankmesh KnownCode of {self.dependency} {', '.join(self.releases)}>"


def _code(fn: Any) -> Any:
    """The code object of ``fn`` as rankmesh hashes it (unwrapped), or ``fn`` itself where it has none."""
    fn = getattr(fn, "__func__", fn)
    if hasattr(fn, "__wrapped__"):
        fn = inspect.unwrap(fn)
    return getattr(fn, "__code__", fn)


def _hashes_reason(fns: dict[str, Any], known: dict[str, frozenset[str]]) -> str | None:
    """The first of ``fns`` (``{dotted path: function}``) whose :func:`source_hash` is not in
    ``known[path]``, said as why, or None."""
    for path, fn in fns.items():
        try:
            digest = source_hash(fn)
        except (OSError, TypeError):
            return f"the source of {path} is not available"
        if digest not in known[path]:
            return f"{path} has a body rankmesh does not know (hash {digest})"
    return None


def _bodies_key(fns: dict[str, Any], codes: list[Any], known: dict[str, frozenset[str]]) -> str | None:
    """What decides :meth:`KnownCode.recognise`'s body check, without reading a source file: the
    hashes known, and each function as this process has it (``codes``: :func:`_code` of each of
    ``fns``; file, first line, the file's size and mtime); None when one has no code or its file
    cannot be stat'ed (then the bodies are hashed)."""
    code = []
    files = []
    hashes = []
    for path, co in zip(fns, codes):
        if not isinstance(co, types.CodeType):
            return None
        code.append((path, co.co_filename, co.co_firstlineno))
        if co.co_filename not in files:
            files.append(co.co_filename)
        hashes.append((path, sorted(known[path])))
    return _verdicts.code_key(sorted(files), known=hashes, code=code)


#: Every name ``RANKMESH_DISABLE`` takes: each patch of :mod:`rankmesh.patches`, ``fast_groups``
#: (rankmesh's writes to c10d's registry, which replace no attribute) and ``rank_tables`` (the
#: rank tables it writes there fill themselves on first use: :class:`rankmesh._fast_groups.RankTable`).
SWITCHES: frozenset[str] = frozenset(
    {
        "concatenate",
        "spmd_axis_le",
        "torchtitan",
        "megatron",
        "megatron_fsdp",
        "init_process_groups",
        "init_device_mesh",
        "fast_groups",
        "rank_tables",
    }
)


def disabled(name: str) -> bool:
    """Whether ``RANKMESH_DISABLE`` (comma-separated names of :data:`SWITCHES`, or ``all``) names
    ``name``. A name it does not know is warned about once (a typo would otherwise be ignored)."""
    raw = os.environ.get("RANKMESH_DISABLE", "")
    if not raw:
        return False
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = sorted(names - SWITCHES - {"all"})
    if unknown:
        warn_once(
            ("RANKMESH_DISABLE", raw),
            f"rankmesh: RANKMESH_DISABLE={raw!r} names {unknown}, which rankmesh does not know; "
            f"the names are {sorted(SWITCHES)} or all",
            stacklevel=3,
        )
    return "all" in names or name in names


class Patch:
    """One attribute rankmesh replaces: ``owner.attribute = make(original)``.

    Args:
        name: the registry name (also what ``RANKMESH_DISABLE`` takes).
        owner: the dotted path of the module or class that holds the attribute.
        attribute: the attribute replaced.
        make: ``make(original, *args) -> replacement`` (``args`` as given to :meth:`install`); the
            replacement keeps the original as ``__wrapped__``.
        why: one line for the README table.
        versions: what it recognises, in words (the README table, the warning).
        code: the dependency's code the replacement was written against (:class:`KnownCode`: the
            dependency, the releases read and the bodies of every function whose behaviour the
            replacement reproduces or relies on, the patched one among them).
        check: ``check(original) -> None`` when what only this patch cares about holds (the name is
            still torch's function; rankmesh's fast meshes are on), else the reason it does not.
        wrap: ``staticmethod`` or ``None``: how the replacement is stored on a class.
        aliases: modules that re-export the attribute (``torch.distributed.init_device_mesh``):
            where one is imported and holds the original, it gets the replacement too, and is
            restored with it (one imported later binds the replacement by itself).
    """

    def __init__(
        self,
        name: str,
        owner: str,
        attribute: str,
        make: Callable[[Any], Any],
        *,
        why: str,
        versions: str,
        code: KnownCode,
        check: Callable[[Any], str | None] | None = None,
        wrap: Callable[[Any], Any] | None = None,
        aliases: tuple[str, ...] = (),
    ) -> None:
        if name not in SWITCHES:
            raise ValueError(f"patch {name!r} is not in rankmesh._patch.SWITCHES; list it there")
        self.name = name
        self.owner = owner
        self.attribute = attribute
        self.why = why
        self.versions = versions
        self.code = code
        self._make = make
        self._check = check
        self._wrap = wrap
        self.aliases = aliases
        self._original: Any = None
        self._replacement: Any = None
        self._holder: Any = None

    @property
    def dependency(self) -> str:
        return self.code.dependency

    @property
    def releases(self) -> tuple[str, ...]:
        return self.code.releases

    @property
    def bodies(self) -> dict[str, dict[str, frozenset[str]]]:
        return self.code.bodies

    @property
    def target(self) -> str:
        return f"{self.owner}.{self.attribute}"

    @property
    def replacement(self) -> Any:
        """The replacement in place now (a new object on every install), or None."""
        return self._replacement if self.installed else None

    @property
    def installed(self) -> bool:
        """True while rankmesh's replacement is the attribute's value."""
        if self._holder is None:
            return False
        return self._holder.__dict__.get(self.attribute) is self._replacement

    def _resolve(self) -> Any:
        return resolve(self.owner)

    def recognise(self) -> str | None:
        """Why this patch may not replace the attribute here, or None when it may: the one question
        every gate of a patch asks. In order: a release of the dependency it has not read (or none
        installed), the attribute missing, this patch's own :attr:`check`, a function body whose
        hash it does not know (:meth:`KnownCode.recognise`)."""
        reason = self.code._unread()
        if reason is not None:
            return reason
        try:
            holder = self._resolve()
        except (ImportError, AttributeError) as e:
            return f"{self.owner} is not importable ({type(e).__name__}: {e})"
        original = holder.__dict__.get(self.attribute)
        if original is None:
            return f"{self.target} does not exist"
        return (self._check(original) if self._check is not None else None) or self.code.recognise()

    def install(self, *args: Any) -> bool:
        """Swap the attribute (idempotent); False, with one warning, when :meth:`recognise` says why
        not, and False without one when ``RANKMESH_DISABLE`` names this patch."""
        with _lock:
            if self.installed:
                return True
            if disabled(self.name):
                return False
            reason = self.recognise()
            if reason is not None:
                self._warn(reason)
                return False
            holder = self._resolve()
            original = holder.__dict__[self.attribute]
            raw = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
            fn = self._make(raw, *args)
            fn.__wrapped__ = raw
            replacement = self._wrap(fn) if self._wrap is not None else fn
            setattr(holder, self.attribute, replacement)
            self._holder, self._original, self._replacement = holder, original, replacement
            for alias in self.aliases:  # one imported later binds the replacement itself
                module = sys.modules.get(alias)
                if module is not None and module.__dict__.get(self.attribute) is original:
                    setattr(module, self.attribute, replacement)
            return True

    def restore(self) -> None:
        """Put the original back (harmless when not installed, or when someone replaced ours since:
        then theirs is left alone)."""
        with _lock:
            if self.installed:
                setattr(self._holder, self.attribute, self._original)
            for alias in self.aliases:  # a module that bound the replacement (at import or install)
                module = sys.modules.get(alias)
                if module is not None and self._replacement is not None:
                    if module.__dict__.get(self.attribute) is self._replacement:
                        setattr(module, self.attribute, self._original)
            self._holder = self._original = self._replacement = None

    def original(self) -> Any:
        """The function the patch replaced (or would replace): what runs when it is not installed."""
        if self._original is not None:
            return getattr(self._original, "__func__", self._original)
        value = self._resolve().__dict__[self.attribute]
        return getattr(value, "__func__", value)

    def _warn(self, reason: str) -> None:
        warn_once(
            ("patch", self.name, reason),
            f"rankmesh: patch {self.name!r} ({self.target}) not installed: {reason}; the original runs "
            f"(correct, stock speed). Recognised: {self.versions}",
            stacklevel=4,
        )

    def __repr__(self) -> str:
        return f"<rankmesh patch {self.name!r} on {self.target}: {'installed' if self.installed else 'not installed'}>"
