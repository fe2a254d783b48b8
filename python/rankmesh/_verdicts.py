"""Start-up check verdicts kept once per torch install, as ``.pyc`` files keep compiled code (a leaf
module: it imports nothing of rankmesh, and no torch).

rankmesh's start-up checks (:mod:`rankmesh._fast_groups_check`, the self-check's and the patches'
:class:`rankmesh._patch.KnownCode`: the hashes of torch's function bodies, read from torch's
source, and the registry probe) give the same answer in every process that runs the same code:
every rank of a job, every job on a node.
:func:`verdict` keeps each answer in a small JSON file under the per-user cache directory, next
to the *key* that decided it (the caller's: torch's release, the size and mtime of every source
file involved, rankmesh's version, the Python version, ...). A later process whose key is equal
takes the answer without computing it; any difference in the key is a miss: the check runs
again and its answer replaces the old one. Never stale, never trusted blindly:

- the directory is ``$RANKMESH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rankmesh``, else
  ``~/.cache/rankmesh``; ``RANKMESH_CACHE_DIR=`` (set, empty) turns the cache off (every process
  computes, as without it);
- one file per torch install (``verdicts-<16 hex digits>.json``, from the caller's ``scope``), so
  two environments sharing a home do not overwrite each other's answers;
- written atomically (a temporary file in the same directory, then ``os.replace``): ranks that
  start at once on one node each leave a whole file, the last one wins;
- a file that is missing, unreadable, truncated, corrupt, of another format or holding another
  key is a miss; a directory that cannot be created or written leaves the answer in this process's
  memory only, with at most one debug-level message (logger ``rankmesh``).

    >>> import os, tempfile
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {ENV: tempfile.mkdtemp()}):
    ...     first = verdict("doc", {"torch": "2.15.0"}, lambda: "computed", scope="doc")
    ...     forget()  # as a new process: the file answers, nothing is computed
    ...     again = verdict("doc", {"torch": "2.15.0"}, lambda: 1 / 0, scope="doc")
    ...     other = verdict("doc", {"torch": "2.15.1"}, lambda: None, scope="doc")  # another key
    >>> first, again, other
    ('computed', 'computed', None)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ENV", "FORMAT", "cache_dir", "cache_file", "code_key", "forget", "generation", "install_scope", "verdict"]

#: The environment variable that moves the cache (a directory), or turns it off (set and empty).
ENV = "RANKMESH_CACHE_DIR"
#: The file format; a file of another format is a miss.
FORMAT = 1
_MAX_BYTES = 1 << 20  # a verdict file is a few kB; anything larger is not one of ours

_log = logging.getLogger("rankmesh")
_lock = threading.Lock()
# (file, name) -> (key, reason): what this process computed or read, so it asks the file once.
_memory: dict[tuple[str | None, str], tuple[Any, str | None]] = {}
# file -> ((size, mtime_ns, inode), its verdicts): several checks share one file, which is then
# parsed once per process while it stays the same file (a stale copy can only miss, never answer
# wrongly: every entry is taken only under an equal key).
_files: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
_said = False  # the one debug message about a cache that cannot be used


def cache_dir() -> str | None:
    """The directory verdicts live in, or None when the cache is off (``RANKMESH_CACHE_DIR`` set
    and empty) or no home can be found."""
    raw = os.environ.get(ENV)
    if raw is not None:
        return os.path.abspath(os.path.expanduser(raw)) if raw.strip() else None
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec: a relative path is to be ignored
        return os.path.join(xdg, "rankmesh")
    home = os.path.expanduser("~")
    if home == "~" or not os.path.isabs(home):  # no HOME and no password entry
        return None
    return os.path.join(home, ".cache", "rankmesh")


def install_scope(module_file: str) -> str:
    """The ``scope`` of the install a module was imported from: its folder and Python's version, so
    every check of one install (``.../site-packages/torch``) shares one file."""
    return f"{os.path.dirname(module_file)} {sys.version}"


def cache_file(scope: str) -> str | None:
    """The file that holds the verdicts of ``scope`` (the caller's name for one install, e.g. the
    directory torch is installed in and the Python version), or None when the cache is off."""
    env = os.environ
    where = (scope, env.get(ENV), env.get("XDG_CACHE_HOME"), env.get("HOME"))
    path = _paths.get(where, "")
    if path == "":
        directory = cache_dir()
        if directory is None:
            path = None
        else:
            # BLAKE2 is built into CPython: no OpenSSL set-up on the first hash (sha256: ~0.05 ms)
            digest = hashlib.blake2b(scope.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
            path = os.path.join(directory, f"verdicts-{digest}.json")
        _paths[where] = path
    return path


# (scope, the environment that places the cache) -> its file: asked by every check of a process.
_paths: dict[tuple[str | None, ...], str | None] = {}


def verdict(name: str, key: dict[str, Any], compute: Callable[[], str | None], *, scope: str) -> str | None:
    """The answer (None, or a reason string) of the check ``name`` whose answer ``key`` decides:
    the cached one when the file for ``scope`` holds ``name`` under an equal key, else
    ``compute()``, then stored. ``key`` must be made of JSON values (str, int, float, bool, None,
    lists and dicts with str keys), so that it reads back equal."""
    path = cache_file(scope)
    with _lock:
        seen = _memory.get((path, name))
    if seen is not None and seen[0] == key:
        return seen[1]
    if path is not None:
        entry = _read(path).get(name)
        if isinstance(entry, dict) and entry.get("key") == key:
            reason = entry.get("reason")
            if reason is None or isinstance(reason, str):
                with _lock:
                    _memory[(path, name)] = (key, reason)
                return reason
    reason = compute()
    with _lock:
        _memory[(path, name)] = (key, reason)
    if path is not None:
        _store(path, name, {"key": key, "reason": reason})
    return reason


def code_key(files: Any, **facts: Any) -> dict[str, Any] | None:
    """A verdict's key for code that lives in ``files``: ``facts`` (versions, hashes known, which
    functions), the Python version, and ``[path, size, mtime_ns]`` of each file (``os.stat``,
    nothing read: "the same code"); None when a file cannot be stat'ed (then nothing is cached)."""
    stats = []
    for file in files:
        try:
            st = os.stat(file)
        except (OSError, TypeError):
            return None
        stats.append([file, st.st_size, st.st_mtime_ns])
    return {**facts, "python": sys.version, "files": stats}


def forget() -> None:
    """Forget what this process read or computed (the files stay): the next :func:`verdict` reads
    its file again, as a new process would. For tests."""
    global _said, _generation
    with _lock:
        _memory.clear()
        _files.clear()
        _said = False
        _generation += 1


def generation() -> int:
    """How many times :func:`forget` ran: a caller that keeps an answer in its own memory keeps it
    for one generation, so a test's "new process" asks again."""
    return _generation


_generation = 0


def _read(path: str) -> dict[str, Any]:
    """The verdicts in ``path`` by name; empty when there is no usable file. Parsed once while the
    file's size, mtime and inode stay the same (``os.replace`` gives every write a new inode)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
            seen = _files.get(path)
            if seen is not None and seen[0] == stamp:
                return seen[1]
            data = f.read(_MAX_BYTES + 1)
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            _debug(f"rankmesh: start-up check cache {path} not read ({type(e).__name__}: {e}); checking afresh")
        return {}
    verdicts = _parse(data)
    _files[path] = (stamp, verdicts)
    return verdicts


def _parse(data: bytes) -> dict[str, Any]:
    if len(data) > _MAX_BYTES:
        return {}
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # corrupt, truncated, not UTF-8, absurdly nested
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("verdicts"), dict):
        return {}
    return doc["verdicts"]


def _store(path: str, name: str, entry: dict[str, Any]) -> None:
    """Puts ``entry`` under ``name`` in ``path``, keeping the other names' entries, by an atomic
    replace; on any error leaves the file as it was (and says so once, at debug level)."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        verdicts = {k: v for k, v in _read(path).items() if k != name}
        verdicts[name] = entry
        text = json.dumps({"format": FORMAT, "verdicts": verdicts}, separators=(",", ":"))
        fd, tmp = tempfile.mkstemp(prefix=".verdicts-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except (OSError, TypeError, ValueError) as e:  # TypeError/ValueError: a key that is not JSON
        _debug(f"rankmesh: start-up check cache {path} not written ({type(e).__name__}: {e}); checks run each time")


def _debug(message: str) -> None:
    global _said
    with _lock:
        if _said:
            return
        _said = True
    _log.debug(message)
