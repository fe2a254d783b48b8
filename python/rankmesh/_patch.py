"""The :class:`Patch` object every rankmesh patch is (a leaf module: it imports nothing of rankmesh).

Each patch is defined next to the code it installs (``rankmesh.mesh``: ``DeviceMesh._concatenate``;
``rankmesh.torchtitan.spmd_axis``: ``MeshAxis.__le__``; ``rankmesh.megatron.fsdp``: Megatron-FSDP's
meshes); :mod:`rankmesh.patches` lists them all and undoes them.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import linecache
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from rankmesh._once import warn_once

__all__ = [
    "SWITCHES",
    "Patch",
    "body_unknown",
    "bodies_unknown",
    "code_lines",
    "disabled",
    "resolve",
    "source_hash",
    "text_hash",
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
    """The object at a dotted ``path``: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def bodies_unknown(name: str, fns: dict[str, Any], known: Any, *, scope: str) -> str | None:
    """The first of ``fns`` (``{what: function}``) whose body hash is not in ``known[what]``, as
    :func:`body_unknown` says it, or None: hashed once per install (:mod:`rankmesh._verdicts`,
    keyed by the hashes known and each function's file, line, size and mtime), so a later process
    reads no source. ``name`` and ``scope`` name the verdict and its file."""
    key = _bodies_key(fns, {p: sorted(h) for p, h in known.items()})
    if key is None:
        return _bodies_reason(fns, known)
    from rankmesh import _verdicts  # a leaf too

    return _verdicts.verdict(name, key, lambda: _bodies_reason(fns, known), scope=f"{scope} {sys.version}")


def _bodies_reason(fns: dict[str, Any], known: dict[str, frozenset[str]]) -> str | None:
    for path, fn in fns.items():
        reason = body_unknown(path, fn, known[path])
        if reason is not None:
            return reason
    return None


def _bodies_key(fns: dict[str, Any], known: dict[str, list[str]]) -> dict[str, Any] | None:
    """What decides :meth:`Patch.unknown`'s body check, without reading a source file: the hashes
    known, and each function as this process has it (file, first line, the file's size and mtime);
    None when one has no code or its file cannot be stat'ed (then the bodies are hashed)."""
    from rankmesh._verdicts import code_key

    code = []
    for path, fn in fns.items():
        co = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None)
        if co is None:
            return None
        code.append([path, co.co_filename, co.co_firstlineno])
    return code_key(sorted({c[1] for c in code}), known=known, code=code)


def body_unknown(what: str, fn: Any, known: Any) -> str | None:
    """Why ``fn``'s body is not one rankmesh has read (its :func:`source_hash` not in ``known``),
    or None when it is; ``what`` names it in the reason."""
    try:
        digest = source_hash(fn)
    except (OSError, TypeError):
        return f"the source of {what} is not available"
    return None if digest in known else f"{what} has a body rankmesh does not know (hash {digest})"


#: Every name ``RANKMESH_DISABLE`` takes: each patch of :mod:`rankmesh.patches`, ``fast_groups``
#: (rankmesh's writes to c10d's registry, which replace no attribute) and ``rank_tables`` (the
#: rank tables it writes there fill themselves on first use: :class:`rankmesh._fast_groups.RankTable`).
SWITCHES: frozenset[str] = frozenset(
    {
        "concatenate",
        "spmd_axis_le",
        "torchtitan",
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
        recognise: ``recognise(original) -> None`` when the original is the code rankmesh was written
            against, else the reason it is not (a version, a changed body): then nothing is swapped.
            Patches that give ``bodies`` need none: :meth:`unknown` then does the recognising.
        wrap: ``staticmethod`` or ``None``: how the replacement is stored on a class.
        dependency: the distribution (a key of :data:`rankmesh._dependencies.DEPENDENCIES`) whose
            code is patched.
        bodies: per release of ``dependency`` read, ``{dotted path: {source hashes}}`` of every
            function whose behaviour the replacement reproduces or relies on (the patched one
            among them): :meth:`unknown` recognises the code by release and bodies.
        aliases: modules that re-export the attribute (``torch.distributed.init_device_mesh``):
            where one holds the original, it gets the replacement too, and is restored with it.
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
        recognise: Callable[[Any], str | None] | None = None,
        wrap: Callable[[Any], Any] | None = None,
        dependency: str | None = None,
        bodies: dict[str, dict[str, frozenset[str]]] | None = None,
        aliases: tuple[str, ...] = (),
    ) -> None:
        if name not in SWITCHES:
            raise ValueError(f"patch {name!r} is not in rankmesh._patch.SWITCHES; list it there")
        if (recognise is None) == (bodies is None) or (bodies is not None and dependency is None):
            raise ValueError(f"patch {name!r}: give recognise, or dependency and bodies")
        self.name = name
        self.owner = owner
        self.attribute = attribute
        self.why = why
        self.versions = versions
        self._make = make
        self._recognise = recognise
        self._wrap = wrap
        self.dependency = dependency
        self.bodies = bodies
        self.aliases = aliases
        self._original: Any = None
        self._replacement: Any = None
        self._holder: Any = None

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

    def unknown(self) -> str | None:
        """Why the installed code is not what this patch was written against (a release of its
        dependency it has not read, a function body whose hash it does not know, a function that
        is missing), or None when it is: the one question every gate of a patch asks."""
        if self.bodies is None:
            original = self._resolve().__dict__.get(self.attribute)
            return None if original is None else self._recognise(original)  # type: ignore[misc]
        from rankmesh import _dependencies  # a leaf, imported on first use only

        release = _dependencies.release_of(self.dependency)  # type: ignore[arg-type]
        known = self.bodies.get(release or "")
        if known is None:
            installed = _dependencies.version(self.dependency)  # type: ignore[arg-type]
            return f"{self.dependency} {installed} is not a release this patch has read ({', '.join(self.bodies)})"
        fns = {}
        for path in known:
            try:
                fns[path] = resolve(path)
            except (ImportError, AttributeError):
                return f"{path} does not exist"
        scope = f"{self.dependency} {_dependencies.version(self.dependency)}"
        return bodies_unknown(f"patch {self.name}", fns, known, scope=scope)

    def install(self, *args: Any) -> bool:
        """Swap the attribute (idempotent); False, with one warning, when the target is missing or
        not recognised, and False without one when ``RANKMESH_DISABLE`` names this patch."""
        with _lock:
            if self.installed:
                return True
            if disabled(self.name):
                return False
            try:
                holder = self._resolve()
            except (ImportError, AttributeError) as e:
                self._warn("missing", f"{self.owner} is not importable ({type(e).__name__}: {e})")
                return False
            original = holder.__dict__.get(self.attribute)
            if original is None:
                self._warn("missing", f"{self.target} does not exist")
                return False
            reason = self.unknown()  # the one verb (it reads the attribute found above again)
            if reason is not None:
                self._warn(reason, reason)
                return False
            raw = original.__func__ if isinstance(original, (staticmethod, classmethod)) else original
            fn = self._make(raw, *args)
            fn.__wrapped__ = raw
            replacement = self._wrap(fn) if self._wrap is not None else fn
            setattr(holder, self.attribute, replacement)
            self._holder, self._original, self._replacement = holder, original, replacement
            for alias in self.aliases:
                module = importlib.import_module(alias)
                if module.__dict__.get(self.attribute) is original:
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

    def _warn(self, key: str, reason: str) -> None:
        warn_once(
            ("patch", self.name, key),
            f"rankmesh: patch {self.name!r} ({self.target}) not installed: {reason}; the original runs "
            f"(correct, stock speed). Recognised: {self.versions}",
            stacklevel=4,
        )

    def __repr__(self) -> str:
        return f"<rankmesh patch {self.name!r} on {self.target}: {'installed' if self.installed else 'not installed'}>"
