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
import warnings
import zlib
from pathlib import Path

import pytest
from rankmesh import _once, _verdicts

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
    new_group = fgc.KNOWN_BODIES["new_group"]
    monkeypatch.setattr(new_group, "recognise", counter("bodies", new_group.recognise))
    # each probe's first step
    monkeypatch.setattr(fgc, "register_fake_backend", counter("probe", fgc.register_fake_backend))
    return calls


def _the_file(directory: Path) -> Path:
    (path,) = directory.glob("verdicts-*")
    return path


def _load(path: Path) -> dict[str, list]:
    """The file's verdicts, name -> [key, reason], read with the module's own decoder."""
    return {name: list(entry) for name, entry in _verdicts.decode(path.read_bytes()).items()}


def _save(path: Path, verdicts: dict[str, list]) -> None:
    """A whole, valid file holding ``verdicts`` (its CRC right), as another process could write."""
    path.write_bytes(_verdicts.encode({name: tuple(entry) for name, entry in verdicts.items()}))


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


def _with_fact(key: str, name: str, value) -> str:
    """``key`` with the fact ``name`` set to ``value``."""
    lines = key.splitlines()
    (i,) = [i for i, line in enumerate(lines) if line.startswith(name + "=")]
    lines[i] = f"{name}={value!r}"
    return "\n".join(lines)


def _check(monkeypatch) -> bool:
    """A new process's first check on rank 3 of 8."""
    _new_process(monkeypatch)
    with fake_world(8, 3):
        return fg.self_check()


def test_a_second_process_reads_neither_torchs_source_nor_probes(cache, counted, monkeypatch):
    assert _check(monkeypatch)
    assert counted["bodies"] == 1 and counted["probe"] == 1 and counted["source"] >= 1  # computed
    path = _the_file(cache)
    assert path.read_bytes().startswith(b"rankmesh-verdicts %d " % _verdicts.FORMAT)
    key, reason = _load(path)[NEW_GROUP]
    assert reason is None
    facts = _facts(key)
    assert facts["torch"][0] == torch.__version__ and facts["rankmesh"] and facts["python"] == sys.version
    st = os.stat(c10d.__file__)
    assert [c10d.__file__, st.st_size, st.st_mtime_ns] in facts["files"]

    counted.update(source=0, bodies=0, probe=0)
    count = c10d._world.group_count
    assert _check(monkeypatch)
    assert counted == {"source": 0, "bodies": 0, "probe": 0}
    assert c10d._world.group_count == count


def test_a_cached_verdict_is_what_decides(cache, monkeypatch):
    """The file is read, not just written: a failing verdict stored under this key is this
    process's verdict (it warns once and falls back), with nothing computed."""
    assert _check(monkeypatch)
    path = _the_file(cache)
    verdicts = _load(path)
    verdicts[NEW_GROUP][1] = "a reason from the cache"
    _save(path, verdicts)
    _new_process(monkeypatch)
    with fake_world(8, 3):
        with pytest.warns(RuntimeWarning, match="a reason from the cache"):
            assert not fg.uses_fast_path(None)


def _recomputes(directory: Path, monkeypatch, counted) -> bool:
    counted.update(source=0, bodies=0, probe=0)
    assert _check(monkeypatch)  # the right verdict, whatever the file said
    return counted["bodies"] == 1 and counted["probe"] == 1


def _valid(path: Path) -> bool:
    return _load(path)[NEW_GROUP][1] is None


def _raw(body: bytes, form: int = _verdicts.FORMAT) -> bytes:
    """A file of ``body`` under a header whose CRC is right (and format ``form``)."""
    return b"rankmesh-verdicts %d %08x\n%s" % (form, zlib.crc32(body), body)


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "empty", "a byte flipped", "another format", "another torch", "another rankmesh",
     "a record of two fields", "a reason of neither form", "not UTF-8", "huge"],
)
def test_a_bad_file_is_never_trusted(cache, counted, monkeypatch, damage):
    assert _check(monkeypatch)
    path = _the_file(cache)
    verdicts = _load(path)
    key = verdicts[NEW_GROUP][0]
    verdicts[NEW_GROUP][1] = "stale: must not be used"  # whatever survives the damage must not be taken
    stale = _verdicts.encode({name: tuple(entry) for name, entry in verdicts.items()})
    record = f"{NEW_GROUP}\x1f{key}\x1f".encode()
    if damage == "garbage":
        path.write_bytes(b"\x00\xffnot a verdict file at all")
    elif damage == "truncated":
        path.write_bytes(stale[: len(stale) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "a byte flipped":
        at = stale.index(b"stale")
        path.write_bytes(stale[:at] + b"S" + stale[at + 1 :])
    elif damage == "another format":
        path.write_bytes(_raw(stale.partition(b"\n")[2], _verdicts.FORMAT + 1))
    elif damage == "another torch":
        verdicts[NEW_GROUP][0] = _with_fact(key, "torch", ("2.99.0", "0" * 40))
        _save(path, verdicts)
    elif damage == "another rankmesh":
        verdicts[NEW_GROUP][0] = _with_fact(key, "rankmesh", "99.0.0")
        _save(path, verdicts)
    elif damage == "a record of two fields":
        path.write_bytes(_raw(record[:-1]))
    elif damage == "a reason of neither form":
        path.write_bytes(_raw(record + b"0"))
    elif damage == "not UTF-8":
        path.write_bytes(_raw(record + b"+\xff\xfe"))
    else:
        verdicts[NEW_GROUP][1] = "x" * (2 << 20)
        _save(path, verdicts)
    assert _recomputes(cache, monkeypatch, counted)
    assert _valid(path)  # rewritten whole


@pytest.mark.parametrize("extra", [-1, 0, 1, 2 * 65536 + 7])
def test_a_file_longer_than_one_read_is_read_whole(cache, counted, monkeypatch, extra):
    """The file is read in one ``os.read`` of up to ``_CHUNK`` bytes, more only after a full one:
    a valid file of exactly one chunk, one byte either side, or several chunks answers as written."""
    assert _check(monkeypatch)
    path = _the_file(cache)
    verdicts = _load(path)
    verdicts["filler"] = ["k", "+"]
    base = len(_verdicts.encode({name: tuple(entry) for name, entry in verdicts.items()}))
    verdicts["filler"] = ["k", "+" + "x" * (_verdicts._CHUNK + extra - base)]
    _save(path, verdicts)
    assert path.stat().st_size == _verdicts._CHUNK + extra
    counted.update(source=0, bodies=0, probe=0)
    assert _check(monkeypatch)
    assert counted == {"source": 0, "bodies": 0, "probe": 0}  # taken from the file, nothing computed


def test_the_file_format_round_trips_and_keeps_separators_out():
    verdicts = {"a": ("k1\nk2", None), "b": ("k3", "why\x1fnot\x1e"), "c": ("", "")}
    back = _verdicts.decode(_verdicts.encode(verdicts))
    assert back == {"a": ("k1\nk2", None), "b": ("k3", "why not "), "c": ("", "")}
    assert _verdicts.decode(_verdicts.encode({})) == {}
    with pytest.raises(ValueError, match="separator"):
        _verdicts.encode({"a\x1fb": ("k", None)})
    with pytest.raises(ValueError, match="separator"):
        _verdicts.encode({"a": ("k\x1e", None)})


def test_an_unreadable_file_recomputes_and_says_so_once_at_debug_level(cache, counted, monkeypatch, caplog):
    assert _check(monkeypatch)
    path = _the_file(cache)
    path.unlink()
    path.mkdir()  # reading and replacing it both fail (chmod would not stop root)
    with caplog.at_level(logging.DEBUG, logger="rankmesh"):
        assert _recomputes(cache, monkeypatch, counted)
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
            assert _verdicts.verdict("another check", "", lambda: None, scope="another install") is None
        assert counted["bodies"] == 1 and counted["probe"] == 1
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
    assert _verdicts.cache_dir() is None and _verdicts.cache_file("x") is None
    # one file per install: two torch installs sharing a home do not overwrite each other
    monkeypatch.setenv(_verdicts.ENV, str(tmp_path))
    assert _verdicts.cache_file("/venv-a/torch 3.11") != _verdicts.cache_file("/venv-b/torch 3.11")


def test_a_changed_torch_file_gives_a_new_verdict_never_the_stale_one(cache, counted, monkeypatch):
    """The key holds the size and mtime of c10d's file: a torch edited or reinstalled in place
    (here: the same file with a new mtime) is checked afresh, whatever the old verdict said."""
    assert _check(monkeypatch)
    path = _the_file(cache)
    verdicts = _load(path)
    verdicts[NEW_GROUP][1] = "stale: must not be used"
    _save(path, verdicts)
    real_stat = os.stat

    class _Touched:
        def __init__(self, st):
            self.st_size, self.st_mtime_ns = st.st_size, st.st_mtime_ns + 1

    monkeypatch.setattr(os, "stat", lambda p, *a, **k: _Touched(real_stat(p)) if p == c10d.__file__ else real_stat(p))
    assert _recomputes(cache, monkeypatch, counted)
    assert _valid(path)
    monkeypatch.setattr(os, "stat", real_stat)
    assert _recomputes(cache, monkeypatch, counted)  # and back: the file's mtime is what it holds


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
    assert _recomputes(cache, monkeypatch, counted)  # the stock function again: checked afresh, passes


def test_the_split_verdict_is_keyed_by_the_accelerator(cache, monkeypatch):
    with fake_world(8, 3, SPLITFAKE) as default:
        default.bound_device_id = torch.device("cuda", 0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch 2.13/2.14: split_group not reproduced
                fg.split_self_check()
        finally:
            default.bound_device_id = None
    if fgc.SPLIT_SHAPE is None:  # torch's own split_group: decided without a check to keep
        assert not cache.exists()
        return
    verdicts = _load(_the_file(cache))
    (name,) = [n for n in verdicts if n.startswith("split_group")]
    accelerator = torch.accelerator.current_accelerator()
    facts = _facts(verdicts[name][0])
    assert facts["accelerator"] == (accelerator and accelerator.type)
    assert facts["bound"] == "cuda" and verdicts[name][1] is None


def test_rankmesh_disable_fast_groups_reads_and_writes_no_cache(cache, monkeypatch):
    monkeypatch.setenv("RANKMESH_DISABLE", "fast_groups")
    with fake_world(8, 3):
        assert not fg.uses_fast_path(None) and not fg.uses_fast_split()
    assert not cache.exists()


_WRITER = textwrap.dedent(
    """
    import sys
    from rankmesh import _verdicts
    me = int(sys.argv[1])
    for i in range(40):
        _verdicts.forget()
        want = f"{me % 2}:{i % 5}"
        got = _verdicts.verdict(f"check {i % 5}", f"writer={me % 2}\\ni={i % 5}", lambda: want, scope="s")
        assert got == want, got
    """
)


def test_many_processes_writing_at_once_leave_a_valid_file(tmp_path, monkeypatch):
    """Ranks starting together on one node: each write is a whole file put in place by
    os.replace, so every reader sees a whole file (or none) and the last one stands."""
    monkeypatch.setenv(_verdicts.ENV, str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(Path(_verdicts.__file__).parents[1])}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(n)], env=env, stderr=subprocess.PIPE) for n in range(6)
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, errors
    path = Path(_verdicts.cache_file("s"))
    verdicts = _load(path)
    assert len(verdicts) == 5
    for name, (key, reason) in verdicts.items():
        facts = _facts(key)
        writer, i = facts["writer"], facts["i"]
        assert name == f"check {i}" and reason == f"{writer}:{i}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_the_torch_compat_algebra_check_is_computed_once_per_install(cache, monkeypatch):
    """The part of the fast meshes' self-check that only the two layout algebras decide (torch's
    ``_mesh_layout``/``_pycute`` and rankmesh's native module) is kept like the group checks: a
    later process with the same files reads it; a changed file is another key."""
    from rankmesh import _torch_compat

    runs = []
    real = _torch_compat._algebra_reason

    def counting():
        runs.append(1)
        return real()

    monkeypatch.setattr(_torch_compat, "_algebra_reason", counting)
    assert _torch_compat._self_check() is None and len(runs) == 1
    _verdicts.forget()  # a new process: the file answers
    assert _torch_compat._self_check() is None and len(runs) == 1
    key = _torch_compat._algebra_key()
    first = next(line for line in key.splitlines() if line.startswith("file "))
    path, size, mtime = first.rsplit(" ", 2)
    key = key.replace(first, f"{path} {size} {int(mtime) + 1}")  # torch's _mesh_layout.py touched
    monkeypatch.setattr(_torch_compat, "_algebra_key", lambda: key)
    _verdicts.forget()
    assert _torch_compat._self_check() is None and len(runs) == 2


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
