"""The start-up checks' verdicts, kept once per torch install (rankmesh._verdicts, issue 34).

A later process with the same torch, rankmesh and Python files takes the verdict from the cache
file and neither reads torch's source nor probes the registry; anything else (a corrupt,
truncated, foreign, unreadable file, a changed file or function, an unusable directory) makes it
check afresh, never trust the file. Every test points the cache at its own ``tmp_path``
(``RANKMESH_CACHE_DIR``) and forgets what this process remembers, as a new process would.
"""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import textwrap
import time
import warnings
import zlib
from pathlib import Path
from subprocess import PIPE

import pytest
from rankmesh import _once, _patch, _verdicts

pytest.importorskip("torch")
import linecache  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rankmesh import _fast_groups as fg  # noqa: E402
from rankmesh import _fast_groups_check as fgc  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

from tests.conftest import FAKE, SPLITFAKE, fake_world  # noqa: E402

NEW_GROUP = f"new_group backend={FAKE}"


def _new_process(monkeypatch) -> None:
    """Forget every verdict this process holds (the files stay)."""
    monkeypatch.setattr(fgc, "_state", {})
    monkeypatch.setattr(fgc, "_split_state", {})
    _verdicts.forget()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv(_verdicts.ENV, str(directory))
    monkeypatch.setattr(_once, "_seen", set())
    _new_process(monkeypatch)
    yield directory
    _verdicts.forget()


@pytest.fixture
def counted(monkeypatch):
    """Counts what the checks cost: lines read from torch's source, body checks, probes."""
    calls = {"source": 0, "bodies": 0, "probe": 0}

    def counter(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(linecache, "getlines", counter("source", linecache.getlines))
    monkeypatch.setattr(_patch, "_hashes_reason", counter("bodies", _patch._hashes_reason))
    # each probe's first step
    monkeypatch.setattr(fgc, "register_fake_backend", counter("probe", fgc.register_fake_backend))
    return calls


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("verdict-*"))


def _keys(monkeypatch) -> dict[str, str]:
    """Records every verdict asked from now on: name -> key (the file is named by both)."""
    seen: dict[str, str] = {}
    real = _verdicts.verdict

    def verdict(name, key, compute):
        seen[name] = key
        return real(name, key, compute)

    monkeypatch.setattr(_verdicts, "verdict", verdict)
    return seen


def _file(keys: dict[str, str], name: str) -> Path:
    return Path(_verdicts.path(name, keys[name]))


def _facts(key: str) -> dict:
    """A key's ``name=value`` lines as values, and its ``file`` lines as [path, size, mtime_ns]."""
    facts: dict = {"files": []}
    for line in key.splitlines():
        if line.startswith("file "):
            path, size, mtime = line[len("file ") :].rsplit(" ", 2)
            facts["files"].append([ast.literal_eval(path), int(size), int(mtime)])
        else:
            name, _, value = line.partition("=")
            facts[name] = ast.literal_eval(value)
    return facts


def _check(monkeypatch) -> bool:
    """A new process's first check on rank 3 of 8."""
    _new_process(monkeypatch)
    with fake_world(8, 3):
        return fg.self_check()


def test_a_second_process_reads_neither_torchs_source_nor_probes(cache, counted, monkeypatch):
    keys = _keys(monkeypatch)
    assert _check(monkeypatch)
    assert counted["bodies"] >= 1 and counted["probe"] == 1 and counted["source"] >= 1  # computed
    path = _file(keys, NEW_GROUP)
    assert path.read_bytes().startswith(b"rankmesh-verdict %d " % _verdicts.FORMAT)
    assert _verdicts.decode(path.read_bytes()) is None
    facts = _facts(keys[NEW_GROUP])
    assert facts["torch"][0] == torch.__version__ and facts["rankmesh"] and facts["python"] == sys.version
    st = os.stat(c10d.__file__)
    assert [c10d.__file__, st.st_size, st.st_mtime_ns] in facts["files"]

    counted.update(source=0, bodies=0, probe=0)
    count = c10d._world.group_count
    files = {p: p.stat().st_mtime_ns for p in _files(cache)}
    assert _check(monkeypatch)
    assert counted == {"source": 0, "bodies": 0, "probe": 0}
    assert c10d._world.group_count == count
    assert {p: p.stat().st_mtime_ns for p in _files(cache)} == files  # nothing written again


def test_a_cached_verdict_is_what_decides(cache, monkeypatch):
    """The file is read, not just written: a failing verdict stored under this key is this
    process's verdict (it warns once and falls back), with nothing computed."""
    keys = _keys(monkeypatch)
    assert _check(monkeypatch)
    _file(keys, NEW_GROUP).write_bytes(_verdicts.encode("a reason from the cache"))
    _new_process(monkeypatch)
    with fake_world(8, 3):
        with pytest.warns(RuntimeWarning, match="a reason from the cache"):
            assert not fg.uses_fast_path(None)


def _recomputes(monkeypatch, counted) -> bool:
    counted.update(source=0, bodies=0, probe=0)
    assert _check(monkeypatch)  # the right verdict, whatever the file said
    return counted["probe"] == 1


def _raw(body: bytes, form: int = _verdicts.FORMAT) -> bytes:
    """A file of ``body`` under a header whose CRC is right (and format ``form``)."""
    return b"rankmesh-verdict %d %08x\n%s" % (form, zlib.crc32(body), body)


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "empty", "a byte flipped", "another format", "a reason of neither form", "not UTF-8"],
)
def test_a_bad_file_is_never_trusted_and_an_old_one_is_replaced(cache, counted, monkeypatch, damage):
    keys = _keys(monkeypatch)
    assert _check(monkeypatch)
    path = _file(keys, NEW_GROUP)
    stale = _verdicts.encode("stale: must not be used")  # whatever survives the damage must not be taken
    bad = {
        "garbage": b"\x00\xffnot a verdict file at all",
        "truncated": stale[: len(stale) // 2],
        "empty": b"",
        "a byte flipped": stale.replace(b"stale", b"Stale"),
        "another format": _raw(stale.partition(b"\n")[2], _verdicts.FORMAT + 1),
        "a reason of neither form": _raw(b"0stale"),
        "not UTF-8": _raw(b"\xff\xfe"),
    }[damage]
    path.write_bytes(bad)
    assert _recomputes(monkeypatch, counted)
    assert path.read_bytes() == bad  # fresh: perhaps a writer still at work, left alone
    old = time.time() - _verdicts.STALE_SECONDS - 5
    os.utime(path, (old, old))
    assert _recomputes(monkeypatch, counted)
    assert _verdicts.decode(path.read_bytes()) is None  # a minute old: replaced whole
    assert _files(cache) == sorted(cache.glob("*"))  # no temporary file left behind


def test_another_key_is_another_file():
    """Another torch, rankmesh, file or function makes another key: it names another file, so no
    file written for one can answer for the other."""
    assert _verdicts.path("new_group", "torch='2.15.0'") != _verdicts.path("new_group", "torch='2.99.0'")
    assert _verdicts.path("new_group", "k") != _verdicts.path("split_group", "k")


def test_the_file_format_round_trips():
    for reason in (None, "", "why\nnot", "naïve \x1f"):
        assert _verdicts.decode(_verdicts.encode(reason)) == reason
    assert _verdicts.decode(_verdicts.encode(None)[:-1]) is _verdicts._BAD


def test_an_unreadable_file_recomputes_and_says_so_once_at_debug_level(cache, counted, monkeypatch, caplog):
    keys = _keys(monkeypatch)
    assert _check(monkeypatch)
    path = _file(keys, NEW_GROUP)
    path.unlink()
    path.mkdir()  # reading and replacing it both fail (chmod would not stop root)
    with caplog.at_level(logging.DEBUG, logger="rankmesh"):
        assert _recomputes(monkeypatch, counted)
        with fake_world(8, 3, SPLITFAKE) as default:
            default.bound_device_id = torch.device("cuda", 0)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fg.split_self_check()  # a second verdict in this process: no second message
            finally:
                default.bound_device_id = None
    messages = [r for r in caplog.records if r.name == "rankmesh"]
    assert len(messages) == 1 and messages[0].levelno == logging.DEBUG, [r.getMessage() for r in messages]
    assert path.is_dir()


@pytest.mark.parametrize("how", ["a file in the way", "cache off"])
def test_no_usable_directory_computes_in_memory(tmp_path, monkeypatch, counted, caplog, how):
    monkeypatch.setattr(_once, "_seen", set())
    if how == "a file in the way":
        (tmp_path / "file").write_text("")
        monkeypatch.setenv(_verdicts.ENV, str(tmp_path / "file" / "cache"))
    else:
        monkeypatch.setenv(_verdicts.ENV, "")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))  # nothing may land in a home either
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for _ in range(2):  # two processes: each computes, and says at most once why it keeps nothing
        caplog.clear()
        counted.update(bodies=0, probe=0)
        with caplog.at_level(logging.DEBUG, logger="rankmesh"):
            assert _check(monkeypatch)
            assert _verdicts.verdict("another check", "", lambda: None) is None
        assert counted["bodies"] >= 1 and counted["probe"] == 1
        said = [r for r in caplog.records if r.name == "rankmesh"]
        assert len(said) == (1 if how == "a file in the way" else 0) and all(r.levelno == logging.DEBUG for r in said)
    assert [p.name for p in tmp_path.rglob("*")] == (["file"] if how == "a file in the way" else [])


def test_where_the_cache_lives(tmp_path, monkeypatch):
    monkeypatch.delenv(_verdicts.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _verdicts.cache_dir() == str(tmp_path / "xdg" / "rankmesh")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _verdicts.cache_dir() == str(tmp_path / "home" / ".cache" / "rankmesh")
    monkeypatch.setenv(_verdicts.ENV, str(tmp_path / "mine"))
    assert _verdicts.cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv(_verdicts.ENV, "")
    _verdicts.forget()  # where it lives is read once per process
    assert _verdicts.cache_dir() is None and _verdicts.path("x", "k") is None
    _verdicts.forget()


def test_a_changed_torch_file_gives_a_new_verdict_never_the_stale_one(cache, counted, monkeypatch):
    """The key holds the size and mtime of c10d's file: a torch edited or reinstalled in place
    (here: the same file with a new mtime) is checked afresh, whatever the old verdict said."""
    keys = _keys(monkeypatch)
    assert _check(monkeypatch)
    _file(keys, NEW_GROUP).write_bytes(_verdicts.encode("stale: must not be used"))
    real_stat = os.stat

    class _Touched:
        def __init__(self, st):
            self.st_size, self.st_mtime_ns = st.st_size, st.st_mtime_ns + 1

    monkeypatch.setattr(os, "stat", lambda p, *a, **k: _Touched(real_stat(p)) if p == c10d.__file__ else real_stat(p))
    assert _recomputes(monkeypatch, counted)
    assert _verdicts.decode(_file(keys, NEW_GROUP).read_bytes()) is None  # the new key's own file
    monkeypatch.setattr(os, "stat", real_stat)
    with pytest.warns(RuntimeWarning, match="stale: must not be used"):  # and back: that file answers
        _new_process(monkeypatch)
        with fake_world(8, 3):
            assert not fg.self_check()


def test_a_function_replaced_in_this_process_gives_a_new_verdict(cache, counted, monkeypatch):
    """A wrapper around torch's new_group (a framework's, a test's) is probed, not assumed to be
    the function the cached verdict was made with; and one rankmesh cannot match fails."""
    assert _check(monkeypatch)
    real = dist.new_group
    monkeypatch.setattr(c10d, "_rankmesh_wrapper_table", {}, raising=False)

    def new_group(*args, **kwargs):
        pg = real(*args, **kwargs)
        c10d._rankmesh_wrapper_table[pg] = "only torch's call writes this"
        return pg

    monkeypatch.setattr(dist, "new_group", new_group)
    counted.update(bodies=0, probe=0)
    with pytest.warns(RuntimeWarning, match="_rankmesh_wrapper_table"):
        assert not _check(monkeypatch)
    assert counted["probe"] == 1
    monkeypatch.setattr(dist, "new_group", real)
    counted.update(probe=0)
    assert _check(monkeypatch) and counted["probe"] == 0  # the stock function again: its own verdict


def test_the_split_verdict_is_keyed_by_the_accelerator(cache, monkeypatch):
    keys = _keys(monkeypatch)
    with fake_world(8, 3, SPLITFAKE) as default:
        default.bound_device_id = torch.device("cuda", 0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch 2.13/2.14: split_group not reproduced
                fg.split_self_check()
        finally:
            default.bound_device_id = None
    names = [n for n in keys if n.startswith("split_group")]
    if fgc.SPLIT_SHAPE is None:  # torch's own split_group: decided without a probe to keep
        assert not names
        return
    (name,) = names
    accelerator = torch.accelerator.current_accelerator()
    facts = _facts(keys[name])
    assert facts["accelerator"] == (accelerator and accelerator.type)
    assert facts["bound"] == "cuda" and _verdicts.decode(_file(keys, name).read_bytes()) is None


def test_rankmesh_disable_fast_groups_reads_and_writes_no_cache(disable, cache, monkeypatch):
    disable("fast_groups")
    with fake_world(8, 3):
        assert not fg.uses_fast_path(None) and not fg.uses_fast_split()
    assert not cache.exists()


_WRITER = textwrap.dedent(
    """
    import os, sys
    from rankmesh import _verdicts
    created = []
    real_open = os.open
    def counting_open(path, flags, *args):
        fd = real_open(path, flags, *args)
        if flags & os.O_CREAT:
            created.append(path)
        return fd
    os.open = counting_open
    sys.stdin.read()  # every process starts its checks at once
    for i in range(5):
        want = f"answer {i}"
        got = _verdicts.verdict(f"check {i}", f"i={i}", lambda: want)
        assert got == want, got
    print(len(created))
    """
)


def test_sixteen_processes_starting_at_once_write_each_verdict_once(tmp_path, monkeypatch):
    """Ranks of one node starting together on a fresh cache directory: each verdict's file is
    created by one of them (O_EXCL), the others leave it alone; every file is whole."""
    monkeypatch.setenv(_verdicts.ENV, str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(Path(_verdicts.__file__).parents[1])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER], env=env, stdin=PIPE, stdout=PIPE, stderr=PIPE)
        for _ in range(16)
    ]
    for p in procs:
        p.stdin.close()
    outs = [(p.stdout.read(), p.stderr.read()) for p in procs]
    for p in procs:
        p.wait(timeout=120)
    assert [p.returncode for p in procs] == [0] * 16, [e.decode()[-500:] for _, e in outs]
    assert sum(int(out) for out, _ in outs) == 5  # five verdicts, five files created in all
    for i in range(5):
        assert _verdicts.decode(Path(_verdicts.path(f"check {i}", f"i={i}")).read_bytes()) == f"answer {i}"
    assert len(list(tmp_path.iterdir())) == 5


def test_the_torch_compat_algebra_check_is_computed_once_per_install(cache, monkeypatch):
    """The part of the fast meshes' self-check that only the two layout algebras decide (torch's
    ``_mesh_layout``/``_pycute`` and rankmesh's native module) is kept like the group checks: a
    later process with the same files reads it; a changed file is another key."""
    from rankmesh import _mesh_check

    runs = []
    real = _mesh_check._algebra_reason

    def counting():
        runs.append(1)
        return real()

    monkeypatch.setattr(_mesh_check, "_algebra_reason", counting)
    assert _mesh_check._self_check() is None and len(runs) == 1
    _verdicts.forget()  # a new process: the file answers
    assert _mesh_check._self_check() is None and len(runs) == 1
    key = _mesh_check._algebra_key()
    first = next(line for line in key.splitlines() if line.startswith("file "))
    path, size, mtime = first.rsplit(" ", 2)
    key = key.replace(first, f"{path} {size} {int(mtime) + 1}")  # torch's _mesh_layout.py touched
    monkeypatch.setattr(_mesh_check, "_algebra_key", lambda: key)
    _verdicts.forget()
    assert _mesh_check._self_check() is None and len(runs) == 2


def test_a_package_without_a_version_attribute_is_looked_up_once_per_install(cache, tmp_path, monkeypatch):
    """spmd_types names no ``__version__``: its install metadata is searched once per install
    (~0.3 ms of the first mesh), then read from the cache; a change to any ``sys.path`` folder (a
    package installed, upgraded or removed there) or to the package's own file searches again."""
    from importlib import metadata

    from rankmesh import _dependencies

    pytest.importorskip("spmd_types")
    real = metadata.distribution
    searched = []

    def counting(name):
        searched.append(name)
        return real(name)

    monkeypatch.setattr(_dependencies.metadata, "distribution", counting)
    monkeypatch.setattr(_dependencies, "_versions", {})
    truth = real("spmd_types").version
    assert _dependencies.version("spmd_types") == truth and searched == ["spmd_types"]

    monkeypatch.setattr(_dependencies, "_versions", {})  # a new process: the file answers
    _verdicts.forget()
    assert _dependencies.version("spmd_types") == truth and searched == ["spmd_types"]

    folder = tmp_path / "site"  # a sys.path folder in which something is then installed
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for step in ("on the path", "a package installed there"):
        if step != "on the path":
            (folder / "other-1.0.dist-info").mkdir()
            os.utime(folder, ns=(1, os.stat(folder).st_mtime_ns + 10**9))
        monkeypatch.setattr(_dependencies, "_versions", {})
        _verdicts.forget()
        before = len(searched)
        assert _dependencies.version("spmd_types") == truth
        assert len(searched) == before + 1, step

    monkeypatch.setenv(_verdicts.ENV, "")  # the cache off: every process searches
    for _ in range(2):
        monkeypatch.setattr(_dependencies, "_versions", {})
        _verdicts.forget()
        before = len(searched)
        assert _dependencies.version("spmd_types") == truth and len(searched) == before + 1
