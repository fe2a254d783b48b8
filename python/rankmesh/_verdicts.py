"""Start-up check verdicts kept on disk, as ``.pyc`` files keep compiled code (a leaf: nothing of
rankmesh, no torch).

A start-up check (a gate's body hashes, the fast paths' probes, the layout self-check) gives the
same answer in every process that runs the same code. :func:`verdict` keeps each answer in a file
named by the SHA-256 of the check's name and *key* (:func:`code_key`: versions, which functions,
and the size and mtime of every file involved), so a different key is a different file: nothing
is ever replaced, and nothing stale can answer.

- The directory is ``$RANKMESH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rankmesh``, else
  ``~/.cache/rankmesh``; ``RANKMESH_CACHE_DIR=`` (set, empty) turns the cache off.
- **Written at most once**: the file is created with ``O_EXCL``, so of the ranks that start at once
  (on a node, or on every node of a shared home) only the first to finish the check writes it;
  the others find it there and leave it alone.
- **Never trusted blindly**: the file holds a header with the format and the CRC-32 of the
  answer; one that is missing, partly written, corrupt or of another format is a miss (the check
  runs; a bad file a minute old is replaced). A directory that cannot be created or written keeps
  the answer in this process only, with one debug message (logger ``rankmesh``).

    >>> import os, tempfile
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {ENV: tempfile.mkdtemp()}):
    ...     forget()
    ...     first = verdict("doc", "torch=2.15.0", lambda: "computed")
    ...     forget()  # as a new process: the file answers, nothing is computed
    ...     again = verdict("doc", "torch=2.15.0", lambda: 1 / 0)
    ...     other = verdict("doc", "torch=2.15.1", lambda: None)  # another key, another file
    ...     forget()
    >>> first, again, other
    ('computed', 'computed', None)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["ENV", "FORMAT", "cache_dir", "code_key", "decode", "encode", "forget", "generation", "path", "verdict"]

#: The environment variable that moves the cache (a directory), or turns it off (set and empty).
ENV = "RANKMESH_CACHE_DIR"
#: The file format; a file of another format is a miss.
FORMAT = 3
_MAGIC = b"rankmesh-verdict"

_log = logging.getLogger("rankmesh")
_lock = threading.Lock()
_memory: dict[tuple[str, str], str | None] = {}  # (name, key) -> reason: asked again in this process
_stats: dict[Any, str] = {}  # file -> its line of a key: each file is stat'ed once per process
_dir: list[str | None] = []  # the directory, read from the environment once per process
_said = False
_generation = 0


def cache_dir() -> str | None:
    """The directory verdicts live in, or None (the cache off, or no home to put it in)."""
    raw = os.environ.get(ENV)
    if raw is not None:
        return os.path.abspath(os.path.expanduser(raw)) if raw.strip() else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and xdg.startswith(os.sep):  # the XDG spec: a relative path is ignored
        return os.path.join(xdg, "rankmesh")
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache", "rankmesh") if home.startswith(os.sep) else None


def path(name: str, key: str) -> str | None:
    """The file of the check ``name`` under ``key``, or None when the cache is off."""
    if not _dir:
        _dir.append(cache_dir())
    if _dir[0] is None:
        return None
    digest = hashlib.sha256(f"{name}\x00{key}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return os.path.join(_dir[0], f"verdict-{digest}")


def verdict(name: str, key: str, compute: Callable[[], str | None]) -> str | None:
    """The answer (None, or a reason) of the check ``name`` that ``key`` decides: this process's,
    else the file's, else ``compute()``'s, which is then written unless a file is there already (a
    bad one older than :data:`STALE_SECONDS`, left by a writer that died, is replaced)."""
    with _lock:
        if (name, key) in _memory:
            return _memory[(name, key)]
    file = path(name, key)
    found = _read(file) if file is not None else _MISSING
    reason = compute() if found is _MISSING or found is _BAD else found
    with _lock:
        _memory[(name, key)] = reason
    if file is not None and (found is _MISSING or (found is _BAD and _stale(file))):
        _write(file, reason, replace=found is _BAD)
    return reason


def code_key(files: Any, **facts: Any) -> str | None:
    """A key for code in ``files``: one ``name=value`` line per fact (``repr``), Python's version,
    and ``file <path> <size> <mtime_ns>`` per file (``os.stat``, nothing read). None when a file
    cannot be stat'ed (then nothing is kept).

        >>> key = code_key([__file__], torch="2.15.0")
        >>> key.splitlines()[0], key.splitlines()[2].startswith("file ")
        ("torch='2.15.0'", True)
    """
    lines = [f"{name}={value!r}" for name, value in facts.items()]
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


def encode(reason: str | None) -> bytes:
    """A verdict file's bytes: ``rankmesh-verdict <format> <crc32>`` and the answer (``-`` for None,
    ``+`` and the reason otherwise), which :func:`decode` reads back."""
    body = b"-" if reason is None else b"+" + reason.encode("utf-8", "backslashreplace")
    return b"%s %d %08x\n%s" % (_MAGIC, FORMAT, zlib.crc32(body), body)


def decode(data: bytes) -> Any:
    """The answer a file's bytes hold, or :data:`_BAD` when they are not a whole file of this format."""
    head, newline, body = data.partition(b"\n")
    if not newline or head != b"%s %d %08x" % (_MAGIC, FORMAT, zlib.crc32(body)):
        return _BAD
    if body == b"-":
        return None
    return body[1:].decode("utf-8", "backslashreplace") if body[:1] == b"+" else _BAD


_MISSING, _BAD = object(), object()
#: A bad file this much older than now was left by a writer that died: it is replaced.
STALE_SECONDS = 60


def _read(file: str) -> Any:
    try:
        fd = os.open(file, os.O_RDONLY)
        try:
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            return _MISSING
        _debug(f"rankmesh: start-up check cache {file} not read ({type(e).__name__}: {e}); checking afresh")
        return _BAD
    return decode(data)


def _stale(file: str) -> bool:
    try:
        return os.stat(file).st_mtime < time.time() - STALE_SECONDS
    except OSError:
        return False


def _write(file: str, reason: str | None, *, replace: bool = False) -> None:
    """Create ``file`` holding ``reason`` unless it exists (another process wrote it first); with
    ``replace``, put a whole new file in its place."""
    target = f"{file}.{os.getpid()}.tmp" if replace else file
    try:
        os.makedirs(os.path.dirname(file), mode=0o700, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as e:
        _debug(f"rankmesh: start-up check cache {file} not written ({type(e).__name__}: {e}); checks run each time")
        return
    try:
        os.write(fd, encode(reason))  # one write of a few hundred bytes
    finally:
        os.close(fd)
    if replace:
        try:
            os.replace(target, file)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(target)
            _debug(f"rankmesh: start-up check cache {file} not replaced ({type(e).__name__}: {e})")


def forget() -> None:
    """Forget what this process read or computed (the files stay), as a new process would: for tests."""
    global _said, _generation
    with _lock:
        _memory.clear()
        _stats.clear()
        _dir.clear()
        _said = False
        _generation += 1


def generation() -> int:
    """How many times :func:`forget` ran: a caller's own memo lasts one generation."""
    return _generation


def _debug(message: str) -> None:
    global _said
    with _lock:
        said, _said = _said, True
    if not said:
        _log.debug(message)
