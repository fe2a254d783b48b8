"""Start-up check verdicts kept once per torch install, as ``.pyc`` files keep compiled code (a leaf
module: it imports nothing of rankmesh, and no torch).

rankmesh's start-up checks (:mod:`rankmesh._fast_groups_check`, the self-check's and the patches'
:class:`rankmesh._patch.KnownCode`: the hashes of torch's function bodies, read from torch's
source, and the registry probe) give the same answer in every process that runs the same code:
every rank of a job, every job on a node.
:func:`verdict` keeps each answer in a small text file under the per-user cache directory, next
to the *key* that decided it: the caller's, as text (:func:`code_key`: torch's release, rankmesh's
and Python's versions, the size and mtime of every source file involved, which functions, ...).
A later process whose key is equal takes the answer without computing it; any difference in the
key is a miss: the check runs again and its answer replaces the old one. Never stale, never
trusted blindly:

- the directory is ``$RANKMESH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rankmesh``, else
  ``~/.cache/rankmesh`` (read once per process); ``RANKMESH_CACHE_DIR=`` (set, empty) turns the
  cache off (every process computes, as without it);
- one file per environment (``verdicts-<16 hex digits>``, from the caller's ``scope``: the folder
  torch, spmd_types, ... are installed in, :func:`install_scope`), so two environments sharing a
  home do not overwrite each other's answers; read once per process. It is
  text: a header line ``rankmesh-verdicts <format> <CRC-32 of the rest>``, then one record per
  check, ``name US key US reason`` (``US``: the unit separator ``\x1f``; reason ``-`` for None,
  ``+`` and the reason otherwise), records separated by ``\x1e``;
- written atomically (a temporary file in the same directory, then ``os.replace``): ranks that
  start at once on one node each leave a whole file, the last one wins;
- a file that is missing, unreadable, truncated, corrupt, of another format or holding another
  key is a miss; a directory that cannot be created or written leaves the answer in this process's
  memory only, with at most one debug-level message (logger ``rankmesh``).

The first mesh of every process reads the file, so reading it runs as little Python as it can:
keys are text compared whole, the file is split with ``str`` methods (no JSON: its decoder is four
Python functions and hundreds of objects, enough to set off a collection of Python's youngest
generation, ~0.1 ms, during the first call), checked by its CRC, and no path helper runs. Each
Python function run for the first time in a process costs ~5 us there (its code and data are not
in the CPU's caches), so the hit path is a handful of plain functions (:func:`verdict`,
:func:`cache_file`, :func:`cache_dir`, :func:`code_key`, ``_read``, :func:`decode`), no
comprehension among them (each is a code object of its own).

    >>> import os, tempfile
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {ENV: tempfile.mkdtemp()}):
    ...     forget()  # the cache's place is read once per process: a new process
    ...     first = verdict("doc", "torch=2.15.0", lambda: "computed", scope="doc")
    ...     forget()  # as a new process: the file answers, nothing is computed
    ...     again = verdict("doc", "torch=2.15.0", lambda: 1 / 0, scope="doc")
    ...     other = verdict("doc", "torch=2.15.1", lambda: None, scope="doc")  # another key
    ...     forget()
    >>> first, again, other
    ('computed', 'computed', None)
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "ENV",
    "FORMAT",
    "cache_dir",
    "cache_file",
    "code_key",
    "decode",
    "encode",
    "forget",
    "generation",
    "install_scope",
    "verdict",
]

#: The environment variable that moves the cache (a directory), or turns it off (set and empty).
ENV = "RANKMESH_CACHE_DIR"
#: The file format; a file of another format is a miss.
FORMAT = 2
_MAX_BYTES = 1 << 20  # a verdict file is a few kB; anything larger is not one of ours

_log = logging.getLogger("rankmesh")
_lock = threading.Lock()
# (file, name) -> (key, reason): what this process computed or read, so it asks the file once.
_memory: dict[tuple[str | None, str], tuple[str, str | None]] = {}
# file -> its verdicts: several checks share one file, read and parsed once per process (:func:`_read`).
_files: dict[str, dict[str, tuple[str, str | None]]] = {}
_said = False  # the one debug message about a cache that cannot be used


def cache_dir() -> str | None:
    """The directory verdicts live in, or None when the cache is off (``RANKMESH_CACHE_DIR`` set
    and empty) or no home can be found."""
    env = os.environ
    raw = env.get(ENV)
    if raw is not None:
        return os.path.abspath(os.path.expanduser(raw)) if raw.strip() else None
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and xdg.startswith(os.sep):  # the XDG spec: a relative path is to be ignored
        return f"{xdg.rstrip(os.sep)}{os.sep}rankmesh"
    home = env.get("HOME") or os.path.expanduser("~")  # expanduser: the password entry
    if not home.startswith(os.sep):  # no HOME and no password entry
        return None
    return f"{home.rstrip(os.sep)}{os.sep}.cache{os.sep}rankmesh"


def install_scope(module_file: str) -> str:
    """The ``scope`` of the environment a module was imported from: the folder it is installed in
    (``.../site-packages`` for ``.../site-packages/torch/__init__.py`` or ``.../site-packages/six.py``)
    and Python's version, so the checks of every package of one environment (torch's, spmd_types',
    ...) share one file, read once per process, and two environments sharing a home do not.

        >>> install_scope("/venv/lib/site-packages/torch/__init__.py").split()[0]
        '/venv/lib/site-packages'
    """
    folder, _, name = module_file.rpartition(os.sep)
    if name.startswith("__init__."):  # a package: the folder it sits in
        folder = folder.rpartition(os.sep)[0]
    return f"{folder} {sys.version}"


def cache_file(scope: str) -> str | None:
    """The file that holds the verdicts of ``scope`` (the caller's name for one install, e.g. the
    directory torch is installed in and the Python version), or None when the cache is off. Where
    the cache lives is read from the environment once per process (as Python reads
    ``PYTHONPYCACHEPREFIX``; :func:`forget` reads it again)."""
    path = _paths.get(scope, "")
    if path == "":
        directory = cache_dir()
        if directory is None:
            path = None
        else:
            # a name, not a check (every entry is taken under an equal key only): two checksums
            # zlib has anyway (it checks the file), not a hash module's first use (~0.02 ms cold)
            raw = scope.encode("utf-8", "surrogatepass")
            path = f"{directory}{os.sep}verdicts-{zlib.crc32(raw):08x}{zlib.adler32(raw):08x}"
        _paths[scope] = path
    return path


# scope -> its file: asked by every check of a process.
_paths: dict[str, str | None] = {}


def verdict(name: str, key: str, compute: Callable[[], str | None], *, scope: str) -> str | None:
    """The answer (None, or a reason string) of the check ``name`` whose answer ``key`` decides:
    the cached one when the file for ``scope`` holds ``name`` under an equal key, else
    ``compute()``, then stored. ``key`` is text (:func:`code_key` makes one), compared whole."""
    path = cache_file(scope)
    with _lock:
        seen = _memory.get((path, name))
    if seen is not None and seen[0] == key:
        return seen[1]
    if path is not None:
        entry = _read(path).get(name)
        if entry is not None and entry[0] == key:
            with _lock:
                _memory[(path, name)] = entry
            return entry[1]
    reason = compute()
    with _lock:
        _memory[(path, name)] = (key, reason)
    if path is not None:
        _store(path, name, (key, reason))
    return reason


def code_key(files: Any, **facts: Any) -> str | None:
    """A verdict's key for code that lives in ``files``, as text: one ``name=value`` line per fact
    (versions, hashes known, which functions; ``repr`` of str, int, None, lists, tuples and dicts
    of them), Python's version, and ``file <path> <size> <mtime_ns>`` per file (``os.stat``,
    nothing read: "the same code"; each file once per process). None when a file cannot be
    stat'ed (then nothing is cached).

        >>> key = code_key([__file__], torch="2.15.0")
        >>> key.splitlines()[0], key.splitlines()[2].startswith("file ")
        ("torch='2.15.0'", True)
    """
    lines = []
    for name, value in facts.items():  # a loop, not a comprehension: one code object less to run cold
        lines.append(f"{name}={value!r}")
    lines.append(f"python={sys.version!r}")
    for file in files:
        stamp = _stats.get(file)
        if stamp is None:
            try:
                st = os.stat(file)
            except (OSError, TypeError):
                return None
            stamp = _stats[file] = f"file {file!r} {st.st_size} {st.st_mtime_ns}"
        lines.append(stamp)
    return "\n".join(lines)


# file -> its key line: each file is stat'ed once per process (the code this process runs was read
# from it at import; several checks' keys name the same files).
_stats: dict[Any, str] = {}


def forget() -> None:
    """Forget what this process read or computed (the files stay): the next :func:`verdict` reads
    its file again, as a new process would. For tests."""
    global _said, _generation
    with _lock:
        _memory.clear()
        _files.clear()
        _paths.clear()
        _stats.clear()
        _said = False
        _generation += 1


def generation() -> int:
    """How many times :func:`forget` ran: a caller that keeps an answer in its own memory keeps it
    for one generation, so a test's "new process" asks again."""
    return _generation


_generation = 0


def _read(path: str, *, again: bool = False) -> dict[str, tuple[str, str | None]]:
    """The verdicts in ``path`` by name, ``(key, reason)``; empty when there is no usable file.
    Read once per process, with no ``stat`` (a copy another process has replaced since can only
    miss, never answer wrongly: every entry is taken only under an equal key); ``again`` (before a
    write, to keep the other entries) reads it anew."""
    seen = _files.get(path)
    if seen is not None and not again:
        return seen
    try:
        fd = os.open(path, os.O_RDONLY)  # no io stack
        try:
            data = more = os.read(fd, _CHUNK)  # a verdict file (a few kB) is one read
            while len(more) == _CHUNK and len(data) <= _MAX_BYTES:  # a full read: there may be more
                more = os.read(fd, _CHUNK)
                data += more
        finally:
            os.close(fd)
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            _debug(f"rankmesh: start-up check cache {path} not read ({type(e).__name__}: {e}); checking afresh")
        _files[path] = {}
        return {}
    verdicts = _files[path] = decode(data)
    return verdicts


_CHUNK = 1 << 16  # below malloc's mmap threshold: no mmap/munmap pair for a few kB

_MAGIC = b"rankmesh-verdicts"
_UNIT, _RECORD = "\x1f", "\x1e"


def decode(data: bytes) -> dict[str, tuple[str, str | None]]:
    """The verdicts a file's bytes hold (:func:`encode`), or none at all when they are not a whole
    file of this format: too large, another header or format, a CRC that does not match (corrupt,
    truncated), not UTF-8, a record that is not three fields, a reason of neither form."""
    head, newline, body = data.partition(b"\n")
    if len(data) > _MAX_BYTES or not newline or head != b"%s %d %08x" % (_MAGIC, FORMAT, zlib.crc32(body)):
        return {}
    verdicts: dict[str, tuple[str, str | None]] = {}
    if not body:
        return verdicts
    try:
        records = body.decode("utf-8").split(_RECORD)
    except UnicodeDecodeError:
        return {}
    for record in records:
        fields = record.split(_UNIT)
        if len(fields) != 3:
            return {}
        name, key, reason = fields
        if reason == "-":
            verdicts[name] = (key, None)
        elif reason[:1] == "+":
            verdicts[name] = (key, reason[1:])
        else:
            return {}
    return verdicts


def encode(verdicts: dict[str, tuple[str, str | None]]) -> bytes:
    """The bytes of a file holding ``verdicts`` (name -> (key, reason)), which :func:`decode` reads
    back. A separator inside a reason becomes a space (it is a message); a name or key holding one
    is a ValueError (keys are ``repr``'s text, which escapes them)."""
    records = []
    for name, (key, reason) in verdicts.items():
        if _UNIT in name or _RECORD in name or _UNIT in key or _RECORD in key:
            raise ValueError(f"the verdict {name!r} has a name or key with a separator in it")
        said = "-" if reason is None else "+" + reason.replace(_UNIT, " ").replace(_RECORD, " ")
        records.append(f"{name}{_UNIT}{key}{_UNIT}{said}")
    body = _RECORD.join(records).encode("utf-8", "surrogatepass")
    return b"%s %d %08x\n%s" % (_MAGIC, FORMAT, zlib.crc32(body), body)


def _store(path: str, name: str, entry: tuple[str, str | None]) -> None:
    """Puts ``entry`` under ``name`` in ``path``, keeping the other names' entries, by an atomic
    replace; on any error leaves the file as it was (and says so once, at debug level)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        verdicts = {k: v for k, v in _read(path, again=True).items() if k != name}
        verdicts[name] = entry
        data = encode(verdicts)
        fd, tmp = tempfile.mkstemp(prefix=".verdicts-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            _files[path] = verdicts  # what this process reads from now on
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except (OSError, ValueError) as e:  # ValueError: a name or key that cannot be written
        _debug(f"rankmesh: start-up check cache {path} not written ({type(e).__name__}: {e}); checks run each time")


def _debug(message: str) -> None:
    global _said
    with _lock:
        if _said:
            return
        _said = True
    _log.debug(message)
