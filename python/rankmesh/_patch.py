"""The one question rankmesh asks before it runs on a dependency's code (:class:`Gate`), and the
:class:`Patch` every patch is. A leaf above ``_once``, ``_known``, ``_dependencies``, ``_verdicts``.

A gate names the functions a patch or fast path reproduces or relies on; their body hashes per
release are the dependency's table (:data:`rankmesh._known.TABLES`). :meth:`Gate.recognise`
answers None or why not, memoised per process, the bodies hashed once per install
(:mod:`rankmesh._verdicts`). ``rankmesh.patches.gates()`` lists every gate.
"""

from __future__ import annotations

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
from rankmesh._known import TABLES
from rankmesh._once import warn_once

__all__ = ["SWITCHES", "Gate", "Patch", "code_lines", "disabled", "reset", "resolve", "source_hash", "text_hash"]

_lock = threading.RLock()


def source_hash(fn: Any) -> str:
    """The first 16 hex digits of the SHA-256 of ``fn``'s source (:func:`code_lines`), blank lines
    and surrounding whitespace dropped: a release that changes the body changes the hash."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"{fn!r} is not a Python function")
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise OSError(f"the source of {fn!r} is not available")
    return text_hash(code_lines(code, lines))


def code_lines(code: Any, lines: list[str]) -> list[str]:
    """The lines of the function ``code`` in its file's ``lines``: its first (decorator) through
    its last statement, followed while lines are indented deeper than the ``def`` or close a
    bracket (where a CPython puts the last instruction does not matter). No tokenizing."""
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
        if len(lines[j]) - len(lines[j].lstrip()) <= base and text[0] not in ")]}":
            break
        end = j + 1
    return lines[first:end]


def text_hash(lines: Any) -> str:
    """:func:`source_hash` of lines already cut out (a release's file read without importing it)."""
    text = "\n".join(line.strip() for line in lines if line.strip())
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve(path: str) -> Any:
    """The object at a dotted ``path``: the longest imported (else importable) module prefix, then
    attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            try:
                return _attrs(module, parts[i:])
            except AttributeError:
                break  # a submodule not imported yet
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return _attrs(module, parts[i:])
    raise ImportError(path)


def _attrs(obj: Any, names: list[str]) -> Any:
    for name in names:
        obj = getattr(obj, name)
    return obj


class Gate:
    """The code of ``dependency`` a patch or fast path relies on: ``paths`` (each in its table), on
    the pinned releases whose entry has ``fact`` true (all, without one); ``reader`` names who read
    them, in the reason for another version.

        >>> import torch
        >>> gate = Gate("torch", ["torch.distributed.device_mesh.init_device_mesh"])
        >>> gate.releases, gate.recognise() is None
        (('2.13', '2.14', '2.15'), True)
    """

    def __init__(self, dependency: str, paths: Any = (), *, fact: str | None = None, reader: str = "rankmesh"):
        table = TABLES.get(dependency)
        if table is None:
            raise ValueError(f"{dependency!r} has no table in rankmesh._known.TABLES")
        unread = [p for p in paths if not any(p in r.bodies for r in table.values())]
        if unread:
            raise ValueError(f"{unread} are in no release of {dependency}'s table (rankmesh._known.TABLES)")
        self.dependency = dependency
        self.paths = tuple(paths)
        self.fact = fact
        self.reader = reader
        pinned = _dependencies.DEPENDENCIES[dependency].releases
        self.releases = tuple(r for r in pinned if r in table and (fact is None or table[r].facts.get(fact)))
        self._memo: tuple[Any, ...] = ()

    @property
    def bodies(self) -> dict[str, dict[str, str]]:
        """``{release: {path: hash}}``."""
        table = TABLES[self.dependency]
        return {r: {p: table[r].bodies[p] for p in self.paths if p in table[r].bodies} for r in self.releases}

    def release(self) -> str | None:
        """The release of :attr:`releases` the installed version belongs to, or None."""
        installed = _dependencies.version(self.dependency)
        return None if installed is None else _dependencies.release_in(installed, self.releases)

    def known(self) -> dict[str, str] | None:
        """The bodies of the installed release, or None."""
        release = self.release()
        return None if release is None else self.bodies[release]

    def unread(self) -> str | None:
        """Why the installed release is not one read (not installed, another version, a path its
        entry lacks), or None: what :meth:`recognise` decides without reading a function."""
        reason = _dependencies.unsupported(self.dependency, self.releases, reader=self.reader)
        missing = [] if reason is not None else [p for p in self.paths if p not in (self.known() or {})]
        return reason or (f"rankmesh has not read {missing} of {self.dependency} {self.release()}" if missing else None)

    def _functions(self) -> list[Any] | str:
        """The functions at :attr:`paths`, or why one does not exist."""
        fns = []
        for path in self.paths:
            try:
                fns.append(resolve(path))
            except (ImportError, AttributeError):
                return f"{path} does not exist"
        return fns

    def hashes_reason(self) -> str | None:
        """Why a function is missing or its body is not the table's, hashed now (no cache), or None:
        for a check whose own kept verdict's key already holds these functions and hashes."""
        fns = self._functions()
        return fns if isinstance(fns, str) else _hashes_reason(self.paths, fns, self.known() or {})

    def recognise(self) -> str | None:
        """:meth:`unread`, else :meth:`hashes_reason` kept once per install (keyed by the hashes
        known and each function's file, first line, size and mtime); memoised per process while the
        functions are the same objects."""
        reason = self.unread()
        if reason is not None:
            return reason
        known = self.known() or {}
        fns = self._functions()
        if isinstance(fns, str):
            return fns
        codes = tuple(_code(fn) for fn in fns)
        memo = self._memo
        if memo and memo[:2] == (_verdicts.generation(), known) and all(a is b for a, b in zip(memo[2], codes)):
            return memo[3]
        key = None
        if all(isinstance(c, types.CodeType) for c in codes):
            key = _verdicts.code_key(
                sorted({c.co_filename for c in codes}),
                known=sorted(known.items()),
                code=[(p, c.co_filename, c.co_firstlineno) for p, c in zip(self.paths, codes)],
            )
        compute = lambda: _hashes_reason(self.paths, fns, known)  # noqa: E731
        reason = compute() if key is None else _verdicts.verdict("bodies", key, compute)
        self._memo = (_verdicts.generation(), dict(known), codes, reason)
        return reason

    def __repr__(self) -> str:
        return f"<rankmesh Gate on {self.dependency} {', '.join(self.releases)}: {len(self.paths)} bodies>"


def _code(fn: Any) -> Any:
    fn = getattr(fn, "__func__", fn)
    if hasattr(fn, "__wrapped__"):
        fn = inspect.unwrap(fn)
    return getattr(fn, "__code__", fn)


def _hashes_reason(paths: tuple[str, ...], fns: list[Any], known: dict[str, str]) -> str | None:
    for path, fn in zip(paths, fns):
        try:
            digest = source_hash(fn)
        except (OSError, TypeError):
            return f"the source of {path} is not available"
        if digest != known[path]:
            return f"{path} has a body rankmesh does not know (hash {digest})"
    return None


#: Every name ``RANKMESH_DISABLE`` takes: each patch of :mod:`rankmesh.patches`, ``fast_groups``
#: (rankmesh's writes to c10d's registry) and ``rank_tables`` (its lazy rank tables there).
SWITCHES = frozenset(
    "concatenate spmd_axis_le torchtitan megatron megatron_fsdp init_process_groups init_device_mesh fast_groups "
    "rank_tables deepspeed_topology deepspeed_grid deepspeed_groups".split()
)
_disabled: list[frozenset[str]] = []  # read from the environment once per process


def disabled(name: str) -> bool:
    """Whether ``RANKMESH_DISABLE`` (names of :data:`SWITCHES`, comma-separated, or ``all``) names
    ``name``; read once per process (:func:`reset`), an unknown name warned about once."""
    if not _disabled:
        raw = os.environ.get("RANKMESH_DISABLE", "")
        names = frozenset(n.strip() for n in raw.split(",") if n.strip())
        unknown = sorted(names - SWITCHES - {"all"})
        if unknown:
            warn_once(
                ("RANKMESH_DISABLE", raw),
                f"rankmesh: RANKMESH_DISABLE={raw!r} names {unknown}, which rankmesh does not know; "
                f"the names are {sorted(SWITCHES)} or all",
                stacklevel=3,
            )
        _disabled.append(SWITCHES if "all" in names else names)
    return name in _disabled[0]


def reset() -> None:
    """Read ``RANKMESH_DISABLE`` again on the next :func:`disabled` (a process that changes it)."""
    _disabled.clear()


class Patch:
    """One attribute rankmesh replaces, ``owner.attribute = make(original, *args)`` (the replacement
    keeps the original as ``__wrapped__``), in one assignment, and undoes. ``name`` is what
    ``RANKMESH_DISABLE`` takes; ``why`` and ``detail`` are for people (the README, the warning);
    ``gate`` is the code it was written against; ``check(original)`` says why not for what only
    this patch cares about; ``wrap`` (``staticmethod``) stores it on a class; ``aliases`` are
    modules re-exporting the attribute, which get the replacement too and are restored with it;
    ``also`` replaces more attributes of the same owner (``{attribute: make}``, each
    ``make(original)``), swapped and put back with the first, never one without the others.
    """

    def __init__(
        self,
        name: str,
        owner: str,
        attribute: str,
        make: Callable[..., Any],
        *,
        why: str,
        gate: Gate,
        detail: str = "",
        check: Callable[[Any], str | None] | None = None,
        wrap: Callable[[Any], Any] | None = None,
        aliases: tuple[str, ...] = (),
        also: dict[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        if name not in SWITCHES:
            raise ValueError(f"patch {name!r} is not in rankmesh._patch.SWITCHES; list it there")
        self.name, self.owner, self.attribute, self.why, self.gate = name, owner, attribute, why, gate
        self.detail, self.aliases, self.also = detail, aliases, dict(also or {})
        self._make, self._check, self._wrap = make, check, wrap
        self._original: Any = None
        self._replacement: Any = None
        self._holder: Any = None
        self._also: dict[str, tuple[Any, Any]] = {}  # attribute -> (original, replacement)

    @property
    def versions(self) -> str:
        """What it recognises, from its gate: ``"torch 2.13, 2.14, 2.15 (by body)"``."""
        return f"{self.gate.dependency} {', '.join(self.gate.releases)}" + (f" {self.detail}" if self.detail else "")

    @property
    def dependency(self) -> str:
        return self.gate.dependency

    @property
    def target(self) -> str:
        return f"{self.owner}.{self.attribute}"

    @property
    def holder(self) -> Any:
        """The module or class the replacement was set on while installed, else None."""
        return self._holder if self.installed else None

    @property
    def replacement(self) -> Any:
        """The replacement in place now (a new object on every install), or None."""
        return self._replacement if self.installed else None

    @property
    def installed(self) -> bool:
        """True while rankmesh's replacement is the attribute's value."""
        return self._holder is not None and self._holder.__dict__.get(self.attribute) is self._replacement

    def recognise(self) -> str | None:
        """Why not here (a release not read, the attribute missing, its ``check``, its gate), or None."""
        reason = _dependencies.unsupported(self.gate.dependency, self.gate.releases, reader=self.gate.reader)
        if reason is not None:
            return reason
        try:
            holder = resolve(self.owner)
        except (ImportError, AttributeError) as e:
            return f"{self.owner} is not importable ({type(e).__name__}: {e})"
        original = holder.__dict__.get(self.attribute)
        missing = [a for a in (self.attribute, *self.also) if holder.__dict__.get(a) is None]
        if missing:
            return f"{self.owner}.{missing[0]} does not exist"
        return (self._check(original) if self._check is not None else None) or self.gate.recognise()

    def install(self, *args: Any) -> bool:
        """Swap the attribute (idempotent); False, with one warning, where :meth:`recognise` says why
        not; False without one where ``RANKMESH_DISABLE`` names it."""
        with _lock:
            if self.installed:
                return True
            if disabled(self.name):
                return False
            reason = self.recognise()
            if reason is not None:
                warn_once(
                    ("patch", self.name, reason),
                    f"rankmesh: patch {self.name!r} ({self.target}) not installed: {reason}; the original "
                    f"runs (correct, stock speed). Recognised: {self.versions}",
                    stacklevel=3,
                )
                return False
            holder = resolve(self.owner)
            original = holder.__dict__[self.attribute]
            raw = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
            fn = self._make(raw, *args)
            fn.__wrapped__ = raw
            replacement = self._wrap(fn) if self._wrap is not None else fn
            also = {}
            for attribute, make in self.also.items():
                was = holder.__dict__[attribute]
                new = make(was)
                new.__wrapped__ = was
                also[attribute] = (was, new)
            setattr(holder, self.attribute, replacement)
            for attribute, (_, new) in also.items():
                setattr(holder, attribute, new)
            self._holder, self._original, self._replacement, self._also = holder, original, replacement, also
            for alias in self.aliases:  # one imported later binds the replacement itself
                module = sys.modules.get(alias)
                if module is not None and module.__dict__.get(self.attribute) is original:
                    setattr(module, self.attribute, replacement)
            return True

    def restore(self) -> None:
        """Put the original back (a replacement someone made since is left alone)."""
        with _lock:
            if self.installed:
                setattr(self._holder, self.attribute, self._original)
                for attribute, (was, new) in self._also.items():
                    if self._holder.__dict__.get(attribute) is new:
                        setattr(self._holder, attribute, was)
            for alias in self.aliases:
                module = sys.modules.get(alias)
                if module is not None and self._replacement is not None:
                    if module.__dict__.get(self.attribute) is self._replacement:
                        setattr(module, self.attribute, self._original)
            self._holder = self._original = self._replacement = None
            self._also = {}

    def original(self) -> Any:
        """The function replaced (or to be): what runs when it is not installed."""
        value = self._original if self._original is not None else resolve(self.owner).__dict__[self.attribute]
        return getattr(value, "__func__", value)

    def __repr__(self) -> str:
        return f"<rankmesh patch {self.name!r} on {self.target}: {'installed' if self.installed else 'not installed'}>"
