"""Member-only process groups without torch's per-member Python (named by :mod:`rankmesh._torch_compat`).

torch's ``new_group(ranks, use_local_synchronization=True)`` spends ~0.2 µs per member in Python
before the backend sees the group: ``operator.index`` over the ranks, a sort, a duplicate check,
a range check, ``ranks.index``, ``"_".join(map(str, ranks))`` and its SHA-1 for the group name,
and the ``{global rank: group rank}`` dict (~7.5 ms for a 32,768-member group, torch 2.15).
rankmesh's groups are sorted, unique, in range and hold the caller by construction, so
:func:`new_member_group` makes the same group the way torch's ``_new_group_with_tag`` does for
those arguments, minus the work that cannot fail:

- the name is torch's hashed name, computed natively (``rankmesh._native.hashed_group_name``:
  SHA-1 of the joined ranks and the salt, without building the string);
- the group is made by torch's own ``_new_process_group_helper`` (every registry entry it
  writes, ``pg_map``, ``pg_names``, ``pg_backend_config``, ``pg_to_tag``, ``tags_to_pg``, the
  store prefix, the backend and its options, is torch's);
- ``_world.pg_group_ranks[pg]`` answers as the same dict: a :class:`RankTable` (a ``dict`` that
  fills itself on first use, answering ``in`` and ``[]`` by bisection until then) for a group of
  64 members or more, the plain dict below that;
- the counters move exactly as torch's call moves them: torch 2.15 salts the name with
  ``_world.group_count`` and advances it; torch 2.13 salts it with ``len(_world.pg_names)`` and
  does not advance it (``SCHEME``).

Torch's own ``new_group`` runs instead, with the same arguments, whenever anything is not the
plain case this reproduces: TorchComms, ``TORCH_DIST_INIT_BARRIER=1``, a default group bound to a
device, a Python process group that makes its own subgroups, MPI, or a torch this module has
not read. Each fast path is allow-listed by torch release plus the hash of every torch function
body it reproduces (:data:`KNOWN_BODIES`, asked as every patch's code is:
:meth:`rankmesh._patch.KnownCode.recognise`; a patch release that changes a body fails the gate
whatever its version says). :func:`self_check` decides once per default group: it checks the
allow-list, the private names this module uses, the naming scheme against torch's own
``_hash_ranks_to_str``, and makes a one-rank ``fake`` probe group both ways, comparing the
group's own entries and everything each call wrote into c10d's registry: every table of
``_world`` and every table global of ``distributed_c10d``, found by walking them, so a table a
new torch adds is compared too (then destroys both and winds the counter back, so the next
group gets the name torch's own call would give it).
A failed check warns once and falls back to torch's calls. What the bodies and the probe decide is
the same in every process that runs the same code, so it is kept once per torch install
(:mod:`rankmesh._verdicts`, like a ``.pyc``) under a key of everything that decides it: torch's
release and build, the size and mtime of every file the checked and probed functions come from,
those functions as this process has them (a wrapper or monkeypatch is another key), the known
hashes, rankmesh's and Python's versions, and for the split path the accelerator and the bound
device type. The in-process checks (the private names, the naming scheme) and the per-call gates
(barrier, TorchComms, a bound device, ``RANKMESH_DISABLE``) still run in every process.

The ``split_group`` path (a default group bound to a device, e.g. NCCL eager init) is made the
same way by :func:`split_member_group`: torch's ``split_group(split_ranks=[my_group])`` spends
its per-member Python inverting the parent's rank table (O(W) for the default group), checking
and searching the ranks, hashing the joined ranks, and building two lists and two dicts of the
group. rankmesh reproduces the body of the one ``split_group`` it has read (torch 2.15's, by
release and body hash: :data:`KNOWN_BODIES`), calling the backend's own
``ProcessGroup.split_group`` with torch's hashed name and registering the child with torch's own
``HealthCheckHook``, ``_maybe_attach_flight_recorder`` and ``_register_pg_in_world``. Its start-up
probe splits a one-rank ``fake`` parent both ways (local: no collective, no store keys) and
compares every registry entry. Any other torch (2.13 and 2.14 differ: a sequence-number call, a
deep copy of the parent's options) gets torch's own ``split_group`` with the default group's
rank table narrowed to the ranks it reads (:func:`narrowed_parent_ranks`), after one warning.
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import inspect
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from rankmesh import _verdicts
from rankmesh._dependencies import release_of
from rankmesh._native import hashed_group_name
from rankmesh._once import warn_once
from rankmesh._patch import KnownCode, disabled, resolve, verdict_scope
from rankmesh.errors import DistributedStateError

__all__ = [
    "FAST_GROUPS",
    "KNOWN_BODIES",
    "LAZY_TABLE_MIN",
    "RANK_TABLES",
    "RankTable",
    "SCHEME",
    "SPLIT_SHAPE",
    "ensure_backend_registered",
    "group_device_types",
    "options_timeout",
    "init_fake_world",
    "narrowed_parent_ranks",
    "new_member_group",
    "register_fake_backend",
    "registered_groups",
    "resolve_group",
    "self_check",
    "split_member_group",
    "split_non_member",
    "split_self_check",
    "uses_fast_path",
    "uses_fast_split",
]

# The private members of torch.distributed.distributed_c10d this module calls or reads.
_FUNCTIONS = (
    "_get_default_group",
    "_new_process_group_helper",
    "_get_default_timeout",
    "_check_valid_timeout",
    "_is_barrier_after_init",
    "_hash_ranks_to_str",
    "_process_group_name",
    "_use_torchcomms_enabled",
    "_resolve_process_group",
)
#: The name ``RANKMESH_DISABLE`` takes to keep rankmesh out of c10d's registry: every group is
#: then torch's own ``new_group`` / ``split_group`` call.
FAST_GROUPS = "fast_groups"
_TABLES = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg", "group_count")

_C10D = "torch.distributed.distributed_c10d"
_NEW_GROUP_213 = {
    f"{_C10D}.new_group": frozenset({"47374139b94f2439"}),
    f"{_C10D}._new_group_with_tag": frozenset({"611b36bbe829f9ab"}),
    f"{_C10D}._process_group_name": frozenset({"7e6fc29384da5cd8"}),
    f"{_C10D}._hash_ranks_to_str": frozenset({"0b18a6130bc29871"}),
}
_NAMES_214 = {
    f"{_C10D}._process_group_name": frozenset({"710d483e6c074a3f"}),
    f"{_C10D}._hash_ranks_to_str": frozenset({"6b4e40a881640221"}),
}

#: The torch bodies each fast path reproduces (``"new_group"``, ``"split_group"``), by torch release:
#: the :func:`rankmesh._patch.source_hash` of every c10d function named. A fast path runs only on a
#: listed release whose bodies all hash as listed; anything else gets torch's own calls, after one
#: warning. (2.14's hashes were read from the torch 2.14.0 and 2.14.1 wheels' sources, compiled
#: and cut with :func:`rankmesh._patch.code_lines`, without installing them; they equal what
#: ``inspect.getsource`` gives, as do the others.)
KNOWN_BODIES: dict[str, KnownCode] = {
    "new_group": KnownCode(
        "torch",
        {
            "2.13": _NEW_GROUP_213,
            "2.14": {
                f"{_C10D}.new_group": frozenset({"40b4162dab7111dd"}),
                f"{_C10D}._new_group_with_tag": frozenset({"cb54f76632d7c2f8"}),
                **_NAMES_214,
            },
            "2.15": {
                f"{_C10D}.new_group": frozenset({"3ce46582957e046d"}),
                f"{_C10D}._new_group_with_tag": frozenset({"cb54f76632d7c2f8"}),
                **_NAMES_214,
            },
        },
        reader="rankmesh's new_group path",
    ),
    "split_group": KnownCode(
        "torch",
        {"2.15": {f"{_C10D}.split_group": frozenset({"d2f90c7399463483"}), **_NAMES_214}},
        reader="rankmesh's split_group path",
    ),
}


#: How each release salts hashed group names: ``"group_count"`` (2.14, 2.15: the counter every
#: rank advances on every group-name draw) or ``"pg_names"`` (2.13: the number of groups this rank
#: has registered; the counter moves only for unhashed names). The body hashes of
#: ``_process_group_name`` and ``_hash_ranks_to_str`` in :data:`KNOWN_BODIES` pin it, and the
#: start-up check compares the names both ways.
SCHEMES: dict[str, str] = {"2.13": "pg_names", "2.14": "group_count", "2.15": "group_count"}


SCHEME: str | None = SCHEMES.get(release_of("torch") or "")
_state: dict[int, bool] = {}  # id(default group) -> fast path usable


def _salt() -> int:
    w = c10d._world
    return w.group_count if SCHEME == "group_count" else len(w.pg_names)


def _draw_name(ranks: np.ndarray) -> str:
    """torch's ``_process_group_name(ranks, use_hashed_name=True)``: the name, and the counter
    moved as torch moves it."""
    name = hashed_group_name(ranks, _salt())
    if SCHEME == "group_count":
        c10d._world.group_count += 1
    return name


def _static_reason() -> str | None:
    """Why the fast paths may not run here, from what this process can see at no cost (the private
    names they use, a known naming scheme), or None. What the bodies and the probes decide is
    :func:`_checked`'s."""
    missing = [f for f in _FUNCTIONS if not callable(getattr(c10d, f, None))]
    world = getattr(c10d, "_world", None)
    missing += [f"_world.{t}" for t in _TABLES if not hasattr(world, t)]
    if missing:
        return f"torch.distributed lacks {missing}"
    if SCHEME is None:
        return "torch's hashed group names use a salt rankmesh does not know"
    return None


def _names_reason() -> str | None:
    """Why rankmesh's hashed group names (:func:`hashed_group_name`) are not torch's
    (``_hash_ranks_to_str``), or None."""
    for probe in ([0], [0, 1, 2, 3], [5, 17, 1024, 131071]):
        if c10d._hash_ranks_to_str(probe) != hashed_group_name(np.asarray(probe, dtype=np.int32), _salt()):
            return f"torch's _hash_ranks_to_str({probe}) differs from rankmesh's"
    return None


# -- the verdicts, kept once per torch install (rankmesh._verdicts) ------------------------------

#: What the probes run besides the bodies :data:`KNOWN_BODIES` names, on torch's side (looked up
#: where the calls look them up) and rankmesh's: any of them replaced in this process (a wrapper,
#: a monkeypatch) makes another key, so a verdict is never reused for other code.
_PROBED_TORCH = ("new_group", "split_group", "get_rank", "destroy_process_group", "_new_group_with_tag")
_PROBED_OURS = ("_create", "_split", "_draw_name", "_salt", "_names_reason", "_probe_reason", "_split_probe_reason",
                "_entries", "_registry", "_writes", "_writes_differing", "hashed_group_name", "_as_list",
                "_rank_table")  # fmt: skip


def _code_of(obj: Any) -> tuple[str, Any]:
    """``obj``'s qualified name and its code object (None for a class or a builtin)."""
    fn = getattr(obj, "__func__", obj)
    name = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return name, getattr(fn, "__code__", None)


def _verdict_key(path: str, extra: dict[str, Any]) -> dict[str, Any] | None:
    """What decides the ``path`` check's verdict (``"new_group"`` or ``"split_group"``): torch's
    release and build, Python's and rankmesh's versions, the bodies :data:`KNOWN_BODIES` lists and
    their hashes, every function the check reads or runs as this process has it (its name, file
    and first line: a wrapper or a replacement is another key), and the size and mtime of every
    file they come from (``os.stat``, nothing read). None when a file cannot be stat'ed (then
    nothing is cached)."""
    import rankmesh

    release = release_of("torch")
    known = {p: KNOWN_BODIES[p].known() for p in (path, "new_group")}
    objs = [getattr(dist, n, None) for n in ("new_group", "split_group")]
    objs += [getattr(c10d, n, None) for n in _PROBED_TORCH + _FUNCTIONS + _SPLIT_FUNCTIONS]
    objs += [inspect.unwrap(_resolved(n)) for p in known.values() for n in (p or {})]
    here = globals()
    objs += [here[n] for n in _PROBED_OURS]
    files = [c10d.__file__, __file__, getattr(sys.modules.get("rankmesh._native"), "__file__", None)]
    code: list[Any] = []
    seen: set[int] = set()
    for obj in objs:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        name, co = _code_of(obj)
        if co is None:
            code.append(name)
            continue
        if co.co_filename not in files:
            files.append(co.co_filename)
        code.append([name, files.index(co.co_filename), co.co_firstlineno])
    return _verdicts.code_key(
        files,
        check=path,
        torch=[str(torch.__version__), str(getattr(torch.version, "git_version", ""))],  # str: cheap ==
        rankmesh=rankmesh.__version__,
        release=release,
        scheme=SCHEME,
        bodies={p: b and {n: sorted(h) for n, h in b.items()} for p, b in known.items()},
        code=code,
        **extra,
    )


def _resolved(path: str) -> Any:
    try:
        return resolve(path)
    except (ImportError, AttributeError):
        return None


def _checked(path: str, extra: dict[str, Any], compute: Callable[[], str | None]) -> str | None:
    """``compute()``'s verdict for the ``path`` check, kept once per torch install under
    :func:`_verdict_key` (:mod:`rankmesh._verdicts`): later processes with the same torch,
    rankmesh and Python files read it instead of hashing torch's source and probing."""
    key = _verdict_key(path, extra)
    if key is None:
        return compute()
    name = " ".join([path, *(f"{k}={v}" for k, v in extra.items())])  # e.g. "new_group backend=fake"
    return _verdicts.verdict(name, key, compute, scope=verdict_scope("torch"))


def _entries(pg: dist.ProcessGroup) -> dict[str, Any]:
    w = c10d._world
    name = w.pg_names[pg]
    return {
        "backend": w.pg_map[pg][0],
        "group_ranks": dict(w.pg_group_ranks[pg]),
        "backend_config": w.pg_backend_config[pg],
        "tag": w.pg_to_tag[pg].replace(name, "<name>"),
        "tagged": pg in w.tags_to_pg.get(w.pg_to_tag[pg], []),
        "group_name": pg.group_name == name,
        "desc": pg.group_desc,
        "size": pg.size(),
        "rank": pg.rank(),
        "bound_device_id": pg.bound_device_id,
        "flight_recorder": pg in getattr(w, "pg_flight_recorder_hooks", {}),
        "device_types": sorted(d.type for d in pg._device_types),
    }


def _entries_differing(theirs: dist.ProcessGroup, ours: dist.ProcessGroup) -> list[str]:
    """The registry entries (:func:`_entries`) in which rankmesh's group differs from torch's."""
    a, b = _entries(theirs), _entries(ours)
    return sorted(k for k in a if a[k] != b.get(k))


# -- every table a group creation may write -----------------------------------------------------


def _registry() -> dict[str, Any]:
    """Every table of c10d's registry, copied one level deep: each attribute of ``_world`` and
    each dict, list, set or int global of ``distributed_c10d`` (``_world``'s properties answer
    these globals, or views computed afresh from them such as ``pg_config_info``, which would
    list the default group's W ranks on every read). Nothing is picked by hand: a table a new
    torch adds is in it."""
    out: dict[str, Any] = {}
    for prefix, space in (("_world.", vars(c10d._world)), ("c10d.", vars(c10d))):
        for n, v in space.items():
            if _is_table(v) and not n.startswith("__"):
                out[prefix + n] = _copy(v)
    return out


def _is_table(v: Any) -> bool:
    t = type(v)  # type(), not isinstance(): a deprecated c10d global warns when its __class__ is read
    if t in _TABLE_TYPES:
        return True
    if t in _NOT_TABLES:
        return False
    if t is not bool and issubclass(t, _TABLE_TYPES):
        return True
    _NOT_TABLES.add(t)
    return False


_NOT_TABLES: set[type] = set()  # types seen that hold no table (functions, classes, modules, ...)
_TABLE_TYPES = (dict, list, set, int)


def _copy(v: Any) -> Any:
    """A table copied so that a later write shows: a dict's own entries, and the lists and sets
    in it (torch appends to ``tags_to_pg``'s lists in place). Dicts in a dict are kept as they are:
    a group's rank table is written whole, and the default group's is W entries long."""
    if isinstance(v, dict):
        return {k: (type(x)(x) if isinstance(x, (list, set)) else x) for k, x in v.items()}
    return type(v)(v) if isinstance(v, (list, set)) else v


def _normal(x: Any, pg: Any, name: str) -> Any:
    """``x`` with the new group and its name replaced by placeholders and other objects by their
    type, so that torch's and rankmesh's writes compare equal when they are the same writes."""
    if x is pg:
        return "<group>"
    if isinstance(x, str):
        return x.replace(name, "<name>") if name else x
    if isinstance(x, (bool, int, float)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_normal(y, pg, name) for y in x)
    if isinstance(x, (set, frozenset)):
        return sorted(repr(_normal(y, pg, name)) for y in x)
    if isinstance(x, dict):
        return sorted((repr(_normal(k, pg, name)), repr(_normal(v, pg, name))) for k, v in x.items())
    if isinstance(x, datetime.timedelta):
        return x
    return type(x).__name__


def _writes(before: dict[str, Any], pg: Any, after: dict[str, Any] | None = None) -> dict[str, Any]:
    """What making ``pg`` wrote into the registry between ``before`` and ``after`` (now, by
    default; both :func:`_registry`): per table, the entries added or replaced, the items
    appended, or how far a counter moved."""
    name = c10d._world.pg_names.get(pg, "")
    after = _registry() if after is None else after
    out: dict[str, Any] = {}
    for table in sorted(before.keys() | after.keys()):
        a, b = before.get(table), after.get(table)
        if isinstance(a, dict) and isinstance(b, dict):
            changed = []
            for k, v in b.items():
                if k not in a:
                    changed.append((k, v))
                elif isinstance(v, list) and isinstance(a[k], list) and v[: len(a[k])] == a[k]:
                    if len(v) > len(a[k]):
                        changed.append((k, ("<appended>", *v[len(a[k]) :])))
                elif a[k] is not v and not _same(a[k], v):  # lists and sets: copies, compared
                    changed.append((k, v))
            changed += [(k, "<removed>") for k in a if k not in b]
            if changed:
                out[table] = sorted((repr(_normal(k, pg, name)), repr(_normal(v, pg, name))) for k, v in changed)
        elif isinstance(a, (list, set)) and isinstance(b, (list, set)):
            if a != b:
                grown = [x for x in b if x not in a] if isinstance(b, set) else b[len(a) :]
                out[table] = sorted(repr(_normal(x, pg, name)) for x in grown)
        elif isinstance(a, int) and isinstance(b, int):
            if a != b:
                out[table] = b - a
        elif a is not b:
            out[table] = (type(a).__name__, type(b).__name__)
    return out


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - e.g. arrays: compare as different, which is safe
        return False


def _writes_differing(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """The registry tables torch's call and rankmesh's wrote differently (:func:`_writes`)."""
    return sorted(t for t in theirs.keys() | ours.keys() if theirs.get(t) != ours.get(t))


def _probe_reason(backend: str) -> str | None:
    """Make a one-rank probe group both ways and compare every registry entry."""
    register_fake_backend()

    me = dist.get_rank()
    ranks = np.asarray([me], dtype=np.int32)
    w = c10d._world
    made = []
    start = w.group_count
    try:
        want_name = hashed_group_name(ranks, _salt())
        count, before = w.group_count, _registry()
        theirs = dist.new_group([me], backend=backend, use_local_synchronization=True, group_desc="rankmesh_probe")
        made.append(theirs)
        between = _registry()  # after torch's call, before rankmesh's
        torch_step, torch_writes = w.group_count - count, _writes(before, theirs, between)
        if w.pg_names[theirs] != want_name:
            return "rankmesh's name for torch's probe group differs from torch's"
        count, before = w.group_count, between
        ours = _create(ranks, [me], backend, None, None, "rankmesh_probe")
        made.append(ours)
        if w.group_count - count != torch_step:
            return "torch's group counter moves differently"
        diff = _entries_differing(theirs, ours) + _writes_differing(torch_writes, _writes(before, ours))
        if diff:
            return f"the probe group's registry entries differ from torch's: {diff}"
    except Exception as e:  # noqa: BLE001 - any surprise means: use torch's own calls
        return f"the probe group failed: {type(e).__name__}: {e}"
    finally:
        for pg in made:
            dist.destroy_process_group(pg)
        # The probe leaves no trace: the next group gets the name torch's own call would give it.
        w.group_count = start
    return None


def self_check(backend: str = "fake") -> bool:
    """Whether :func:`new_member_group` may make groups itself under the current default group
    (decided once per default group; every rank of the job runs the same probe, or reads its
    verdict from the once-per-install cache: :func:`_checked`)."""
    default = c10d._get_default_group()
    key = id(default)
    if key not in _state:
        reason = _static_reason() or _checked(
            "new_group",
            {"backend": backend},
            lambda: KNOWN_BODIES["new_group"].recognise() or _names_reason() or _probe_reason(backend),
        )
        _state.clear()
        _state[key] = reason is None
        if reason is not None:
            _warn_once(f"{reason}; making process groups with torch's own new_group")
    return _state[key]


def _warn_once(message: str) -> None:
    warn_once(("fast_groups", message), f"rankmesh: {message} (correct, but O(members) Python per group)", stacklevel=4)


def uses_fast_path(backend: str | None) -> bool:
    """Whether a member-only group on ``backend`` would be made by rankmesh right now (never
    with ``RANKMESH_DISABLE=fast_groups``)."""
    if disabled(FAST_GROUPS):
        return False
    default = c10d._get_default_group()
    if default.bound_device_id is not None or c10d._use_torchcomms_enabled() or c10d._is_barrier_after_init() == 1:
        return False
    if hasattr(default, "new_group") and callable(default.new_group):
        return False
    name = c10d.Backend(backend or c10d._world.pg_map[default][0])
    return name != c10d.Backend.MPI and self_check()


def _create(
    ranks: np.ndarray,
    ranks_list: list[int],
    backend: str | None,
    pg_options: Any,
    timeout: datetime.timedelta | None,
    group_desc: str | None,
) -> dist.ProcessGroup:
    """torch's ``_new_group_with_tag`` for sorted, unique, in-range ranks holding the caller."""
    default = c10d._get_default_group()
    default_backend, default_store = c10d._world.pg_map[default]
    backend = c10d.Backend(backend or default_backend)
    if timeout is None:
        timeout = c10d._get_default_timeout(backend)
    c10d._check_valid_timeout(timeout)
    name = _draw_name(ranks)
    me = default.rank()
    pg, _ = c10d._new_process_group_helper(
        len(ranks_list),
        int(np.searchsorted(ranks, me)),
        ranks_list,
        backend,
        default_store,
        name,
        backend_options=pg_options,
        timeout=timeout,
        pg_tag=None,
        device_id=default.bound_device_id,
        group_desc=group_desc,
    )
    c10d._world.pg_group_ranks[pg] = _rank_table(ranks, ranks_list)
    return pg


# The members, as a tuple, of the last member arrays seen, by identity (the array is kept, so its id
# stays its own): a builder hands the same array for every dim with the same members, and each such
# group takes its list and its rank table from the one tuple.
_MEMBER_TABLES: dict[int, tuple[np.ndarray, tuple[int, ...]]] = {}
#: Groups with at least this many members get a :class:`RankTable` that fills itself on first use;
#: smaller ones a plain dict (what it saves is then below a microsecond).
LAZY_TABLE_MIN = 64
#: The name ``RANKMESH_DISABLE`` takes to give every group torch's plain ``{rank: group rank}`` dict.
RANK_TABLES = "rank_tables"


def _members_seen(ranks: np.ndarray) -> tuple[int, ...] | None:
    hit = _MEMBER_TABLES.get(id(ranks))
    return hit[1] if hit is not None and hit[0] is ranks else None


def _as_list(ranks: np.ndarray) -> list[int]:
    members = _members_seen(ranks)
    if members is not None:
        return list(members)  # a list of its own: torch keeps what it is given
    ranks_list = ranks.tolist()
    if len(ranks_list) >= LAZY_TABLE_MIN:  # only member lists worth keeping
        if len(_MEMBER_TABLES) >= 32:
            _MEMBER_TABLES.clear()
        _MEMBER_TABLES[id(ranks)] = (ranks, tuple(ranks_list))
    return ranks_list


def _rank_table(ranks: np.ndarray, ranks_list: list[int]) -> dict[int, int]:
    """torch's ``pg_group_ranks`` entry (global rank -> group rank) for sorted, unique members: a
    :class:`RankTable` over the members' one tuple per member array, or for a small group (or
    with ``RANKMESH_DISABLE=rank_tables``) the plain dict torch builds."""
    if len(ranks_list) < LAZY_TABLE_MIN or disabled(RANK_TABLES):
        return dict(zip(ranks_list, range(len(ranks_list))))
    members = _members_seen(ranks)
    # one table per group (torch deletes each group's entry on its own), sharing the members
    return RankTable(tuple(ranks_list) if members is None else members)


class RankTable(dict):
    """torch's ``_world.pg_group_ranks`` entry for a group rankmesh made: ``{global rank: group
    rank}`` over sorted, unique members (a member's group rank is its position), filled on first
    use instead of at creation. A 131,072-member group's dict costs ~10 ms and ~10 MB to build at
    2^20 ranks, and most groups are never asked more than ``dist.get_rank(group)`` or
    ``get_group_rank`` (``in`` and ``[]``), which this answers by bisection over the members
    without filling. Anything else (iteration, ``keys()``, ``items()``, ``len`` aside, equality,
    ``repr``, any change) fills it first, after which it is the plain dict torch builds, in its
    order. It is a ``dict`` subclass, so code that checks ``isinstance(t, dict)`` is served; C
    code that reads a dict's storage directly (none in torch reads these tables) would see an
    unfilled one as empty, so a change that wants plain dicts back is ``RANKMESH_DISABLE=rank_tables``.

    >>> t = RankTable((4, 12, 20))
    >>> t[12], 20 in t, 5 in t, len(t), t.get(4)
    (1, True, False, 3, 0)
    >>> t == {4: 0, 12: 1, 20: 2}, list(t.items())
    (True, [(4, 0), (12, 1), (20, 2)])
    """

    __slots__ = ("_members",)

    def __init__(self, members: tuple[int, ...] = ()) -> None:
        super().__init__()
        self._members: tuple[int, ...] | None = members or None

    def _filled(self) -> RankTable:
        members = self._members
        if members is not None:
            dict.update(self, zip(members, range(len(members))))
            self._members = None  # after the update: a reader meanwhile still bisects
        return self

    def _index(self, key: object) -> int:
        """The group rank of ``key``, or -1; only while unfilled and for a plain ``int`` key (any
        other key, e.g. ``True`` or ``3.0``, which a dict finds by equal hash, fills first)."""
        members = self._members
        i = bisect.bisect_left(members, key)  # type: ignore[arg-type]
        return i if i < len(members) and members[i] == key else -1  # type: ignore[arg-type]

    def __getitem__(self, key: Any) -> int:
        if self._members is not None and type(key) is int:
            i = self._index(key)
            if i < 0:
                raise KeyError(key)
            return i
        return dict.__getitem__(self._filled(), key)

    def __contains__(self, key: object) -> bool:
        if self._members is not None and type(key) is int:
            return self._index(key) >= 0
        return dict.__contains__(self._filled(), key)

    def get(self, key: Any, default: Any = None) -> Any:
        if self._members is not None and type(key) is int:
            i = self._index(key)
            return default if i < 0 else i
        return dict.get(self._filled(), key, default)

    def __len__(self) -> int:
        members = self._members
        return len(members) if members is not None else dict.__len__(self)

    def __iter__(self) -> Iterator[int]:
        return dict.__iter__(self._filled())

    def __reversed__(self) -> Iterator[int]:
        return dict.__reversed__(self._filled())

    def keys(self) -> Any:
        return dict.keys(self._filled())

    def values(self) -> Any:
        return dict.values(self._filled())

    def items(self) -> Any:
        return dict.items(self._filled())

    def copy(self) -> dict[int, int]:
        return dict.copy(self._filled())

    def __eq__(self, other: object) -> bool:
        return dict.__eq__(self._filled(), other)

    def __ne__(self, other: object) -> bool:
        return dict.__ne__(self._filled(), other)

    __hash__ = None  # type: ignore[assignment]  (a dict)

    def __repr__(self) -> str:
        return dict.__repr__(self._filled())

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return dict, (dict.copy(self._filled()),)  # pickles and copies as the plain dict

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self._filled(), key, value)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self._filled(), key)

    def pop(self, *args: Any) -> Any:
        return dict.pop(self._filled(), *args)

    def popitem(self) -> tuple[Any, Any]:
        return dict.popitem(self._filled())

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return dict.setdefault(self._filled(), key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        dict.update(self._filled(), *args, **kwargs)

    def clear(self) -> None:
        self._members = None
        dict.clear(self)

    def __or__(self, other: Any) -> Any:
        return dict.__or__(self._filled(), other)

    def __ror__(self, other: Any) -> Any:
        return dict.__ror__(self._filled(), other)

    def __ior__(self, other: Any) -> RankTable:
        dict.update(self._filled(), other)
        return self

    def __sizeof__(self) -> int:
        return dict.__sizeof__(self) + (0 if self._members is None else self._members.__sizeof__())


def new_member_group(
    ranks: np.ndarray,
    *,
    backend: str | None = None,
    pg_options: Any = None,
    timeout: datetime.timedelta | None = None,
    group_desc: str | None = None,
) -> dist.ProcessGroup:
    """``dist.new_group(ranks, backend=..., pg_options=..., timeout=..., group_desc=...,
    use_local_synchronization=True)`` for the caller's group: ``ranks`` sorted, unique, in range
    and holding the caller (an int32 array). Same group, same registry entries, same counters as
    torch's call; torch's call itself whenever :func:`uses_fast_path` says no. On torch 2.13, a
    name this rank gave a group it has since destroyed raises :class:`DistributedStateError`
    before the group is made (:func:`_refuse_stale_name`)."""
    ranks = np.ascontiguousarray(ranks, dtype=np.int32)
    ranks_list = _as_list(ranks)
    drawn = _refuse_stale_name(ranks, backend)
    if not uses_fast_path(backend):
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = timeout
        if pg_options is not None:
            extra["pg_options"] = pg_options
        pg = dist.new_group(ranks_list, backend=backend, use_local_synchronization=True, group_desc=group_desc, **extra)
    else:
        pg = _create(ranks, ranks_list, backend, pg_options, timeout, group_desc)
    if drawn is not None:
        drawn.add(pg.group_name)
    return pg


# The names this rank gave member-only groups on a backend that meets in the store, in the current
# world (torch 2.13 only): [weak reference to the default group, the names].
_drawn: list[Any] = [None, set()]


def _refuse_stale_name(ranks: np.ndarray, backend: str | None) -> set[str] | None:
    """torch 2.13 salts a member-only group's hashed name with ``len(_world.pg_names)``, which
    ``destroy_process_group(group)`` lowers, so a new group of the same ranks can get the name of
    one this rank destroyed: its members then meet the destroyed group's rendezvous keys, still in
    the store under that name, and hang or fail inside gloo (e.g. ``initialize_model_parallel``
    again after ``destroy_model_parallel()``, whose gloo twins come back under their old names).
    Raises :class:`DistributedStateError` for such a name, before the group is made; returns the
    current world's set of names drawn (for the caller to add the new group's name to), or None
    where names cannot repeat (torch 2.14 and 2.15 salt with a counter that never goes down) or
    the backend keeps nothing in the store (``fake``)."""
    if SCHEME != "pg_names":
        return None
    default = c10d._get_default_group()
    if c10d.Backend(backend or c10d._world.pg_map[default][0]) == "fake":
        return None
    if _drawn[0] is None or _drawn[0]() is not default:  # a new world: nothing drawn in it yet
        _drawn[:] = [weakref.ref(default), set()]
    names: set[str] = _drawn[1]
    name = hashed_group_name(ranks, _salt())
    if name in names and name not in c10d._world.pg_names.values():
        raise DistributedStateError(
            f"torch {torch.__version__} would name this rank's new group of {len(ranks)} ranks "
            f"(first {ranks[:8].tolist()}) {name!r}, the name of a group of the same ranks this rank "
            "created and then destroyed in this world (torch 2.13 salts the name with the number of groups "
            "registered, which destroy_process_group(group) lowered); its members would meet the destroyed "
            "group's rendezvous in the store and hang. Call destroy_process_group() and init_process_group() "
            "before creating these groups again, or use torch >= 2.14",
            field="group_name",
            value=name,
        )
    return names


# -- the split_group path ----------------------------------------------------------------------

_SPLIT_FUNCTIONS = ("_register_pg_in_world", "_maybe_attach_flight_recorder", "HealthCheckHook", "BackendConfig")
_split_state: dict[int, bool] = {}  # id(default group) -> fast split usable


#: Which torch release's ``split_group`` :func:`split_member_group` reproduces here, or None
#: (the bodies' hashes are checked once, by :func:`split_self_check`).
SPLIT_SHAPE: str | None = KNOWN_BODIES["split_group"].release()


def group_device_types(pg) -> set[str]:
    """The device types a process group has backends for (c10d's private ``_device_types``; empty
    where this torch has no such attribute)."""
    return {d.type for d in getattr(pg, "_device_types", [])}


def options_timeout(pg_options):
    """The timeout carried by a ``Backend.Options`` (c10d's private ``_timeout``, which torch's
    DeviceMesh passes on as the group's timeout), or None."""
    return getattr(pg_options, "_timeout", None)


def ensure_backend_registered(name: str) -> None:
    """Let torch load a backend plugin registered through entry points (``Backend.
    _ensure_backend_registered``, torch >= 2.14; nothing on older torch). Errors are the caller's
    to judge: it checks ``Backend.backend_list`` afterwards."""
    ensure = getattr(dist.Backend, "_ensure_backend_registered", None)
    if ensure is not None:
        ensure(name)


def register_fake_backend() -> None:
    """Registers torch's ``fake`` backend with c10d: importing its module does it (idempotent,
    ~0.3 ms the first time). The one place rankmesh does."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


def init_fake_world(world_size: int, rank: int) -> None:
    """``init_process_group`` on the ``fake`` backend: one process stands in for ``rank`` of a
    ``world_size``-rank job (the demo, the benchmarks, the workloads)."""
    register_fake_backend()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())


def registered_groups() -> int:
    """How many process groups this rank has registered with torch (``len(_world.pg_map)``, the
    default group included): what the demo and the benchmarks report as "process groups"."""
    return len(c10d._world.pg_map)


def resolve_group(name: str) -> dist.ProcessGroup | None:
    """The process group registered under ``name`` on this rank, or None when there is none
    (torch's ``_resolve_process_group``, which raises for an unknown name)."""
    try:
        return c10d._resolve_process_group(name)
    except (RuntimeError, ValueError):
        return None


@contextlib.contextmanager
def narrowed_parent_ranks(parent: dist.ProcessGroup, ranks: list[int], world_size: int) -> Iterator[None]:
    """While torch's ``split_group`` runs, show it only the part of the default group's rank table
    it reads.

    torch's ``split_group`` inverts the parent's whole global-to-group rank dict on every call
    (O(W) Python: ~90 ms per call at 2^20 ranks) and then looks up only this rank and the ranks of
    the split. For the default group that dict is the identity, so a copy restricted to ``ranks``
    (which holds this rank) gives ``split_group`` exactly the same answers in O(group size). The
    full table is put back before returning, also on error. Anything unexpected (another parent,
    a table that is not the identity, a torch without the table), or ``RANKMESH_DISABLE=fast_groups``,
    leaves the table alone.
    """
    if disabled(FAST_GROUPS):
        yield
        return
    try:
        table = c10d._world.pg_group_ranks
        full = table[parent]
    except (AttributeError, KeyError, TypeError):  # pragma: no cover - an unknown torch
        yield
        return
    if parent is not dist.group.WORLD or len(full) != world_size or full.get(world_size - 1) != world_size - 1:
        yield
        return
    table[parent] = {r: r for r in ranks}
    try:
        yield
    finally:
        table[parent] = full


def _split(
    parent: dist.ProcessGroup,
    ranks: np.ndarray,
    ranks_list: list[int],
    global_ranks: list[int],
    timeout: datetime.timedelta | None,
    pg_options: Any,
    group_desc: str | None,
) -> dist.ProcessGroup | None:
    """torch 2.15's ``split_group(parent, split_ranks=[ranks])`` for this rank's own split:
    ``ranks`` (int32; ``ranks_list`` the same as a list) are ranks of ``parent`` and hold this
    rank, unique; ``global_ranks`` the same ranks in the world. The same steps in the same
    order, without the checks that cannot fail for such ranks and without building the parent's
    inverse table."""
    parent_device_types = {d.type for d in parent._device_types}
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type in parent_device_types:
        device = accelerator
    elif "cpu" in parent_device_types:
        device = torch.device("cpu")
    else:
        raise RuntimeError("No backend for the parent process group or its backend does not support splitting")
    parent_backend = parent._get_backend(device)
    if not parent_backend or not parent_backend.supports_splitting:
        raise RuntimeError("No backend for the parent process group or its backend does not support splitting")
    device_id = parent.bound_device_id
    if hasattr(parent_backend, "comm_split_count") and group_desc is None:
        group_desc = f"{parent.group_desc}:split:{parent_backend.comm_split_count()}"
    pg_backend = c10d.Backend(c10d._world.pg_map[parent][0])
    backend_config = c10d.BackendConfig(pg_backend)
    if timeout is None:
        timeout = c10d._get_default_timeout(pg_backend)
    c10d._check_valid_timeout(timeout)
    name = _draw_name(ranks)
    pg = parent.split_group(
        ranks_list, timeout=timeout, opts=pg_options, group_name=name, group_desc=group_desc, device_types=None
    )
    if pg is None:
        return None
    pg.bound_device_id = device_id
    split_devices = {d.type for d in pg._device_types}
    if not (accelerator is not None and accelerator.type in split_devices) and "cpu" not in split_devices:
        raise RuntimeError("No backend for the parent process group or its backend does not support splitting")
    if pg.group_name != name:
        raise AssertionError(f"group name should be set to {name} but got {pg.group_name}")
    c10d.HealthCheckHook.attach(pg)
    c10d._maybe_attach_flight_recorder(pg, backend_config, global_ranks)
    c10d._register_pg_in_world(
        pg,
        backend_name=pg_backend,
        store=pg.get_group_store(),
        group_name=name,
        backend_config=str(backend_config),
        rank_mapping=_rank_table(ranks, global_ranks),
    )
    return pg


def _split_probe_reason() -> str | None:
    """Split a one-rank ``fake`` parent both ways and compare every registry entry. Local to this
    rank (the fake backend talks to no one, uses no store), so it cannot hang or collide with a
    real group; the probe leaves no group behind and winds the counter back."""
    register_fake_backend()

    me = dist.get_rank()
    w = c10d._world
    made: list[Any] = []
    start = w.group_count
    try:
        parent = dist.new_group([me], backend="fake", use_local_synchronization=True, group_desc="rankmesh_probe")
        made.append(parent)
        count, before = w.group_count, _registry()
        theirs = dist.split_group(parent_pg=parent, split_ranks=[[0]], group_desc="rankmesh_probe_split")
        if not isinstance(theirs, dist.ProcessGroup):
            return "torch's split_group of the probe gave no group"
        made.append(theirs)
        between = _registry()  # after torch's call, before rankmesh's
        torch_step, torch_writes = w.group_count - count, _writes(before, theirs, between)
        count, before = w.group_count, between
        ours = _split(parent, np.zeros(1, dtype=np.int32), [0], [me], None, None, "rankmesh_probe_split")
        if ours is None:
            return "rankmesh's split of the probe gave no group"
        made.append(ours)
        if w.group_count - count != torch_step:
            return "torch's group counter moves differently in split_group"
        diff = _entries_differing(theirs, ours) + _writes_differing(torch_writes, _writes(before, ours))
        if diff:
            return f"the split probe group's registry entries differ from torch's: {diff}"
    except Exception as e:  # noqa: BLE001 - any surprise means: use torch's own calls
        return f"the split probe failed: {type(e).__name__}: {e}"
    finally:
        for pg in reversed(made):
            dist.destroy_process_group(pg)
        w.group_count = start
    return None


def split_self_check() -> bool:
    """Whether :func:`split_member_group` may split groups itself under the current default
    group (decided once per default group, by the same local probe on every rank)."""
    default = c10d._get_default_group()
    key = id(default)
    if key not in _split_state:
        missing = [f for f in _SPLIT_FUNCTIONS if getattr(c10d, f, None) is None]
        if SPLIT_SHAPE is None:
            reason = f"torch {torch.__version__}'s split_group is not the one rankmesh reproduces"
        elif missing:
            reason = f"torch.distributed lacks {missing}"
        else:
            accelerator = torch.accelerator.current_accelerator()  # which backend of the parent splits
            bound = default.bound_device_id
            reason = _static_reason() or _checked(
                "split_group",
                {"accelerator": accelerator and accelerator.type, "bound": bound and bound.type},
                lambda: KNOWN_BODIES["split_group"].recognise()
                or KNOWN_BODIES["new_group"].recognise()
                or _names_reason()
                or _split_probe_reason(),
            )
        _split_state.clear()
        _split_state[key] = reason is None
        if reason is not None:
            _warn_once(f"{reason}; splitting process groups with torch's own split_group")
    return _split_state[key]


def uses_fast_split() -> bool:
    """Whether :func:`split_member_group` would split the default group itself right now (never
    with ``RANKMESH_DISABLE=fast_groups``)."""
    if disabled(FAST_GROUPS) or c10d._use_torchcomms_enabled():
        return False
    default = c10d._get_default_group()
    table = c10d._world.pg_group_ranks.get(default)
    w = default.size()
    if table is None or len(table) != w or table.get(w - 1) != w - 1:  # not the identity
        return False
    return split_self_check()


def split_member_group(
    ranks: np.ndarray,
    *,
    pg_options: Any = None,
    timeout: datetime.timedelta | None = None,
    group_desc: str | None = None,
) -> dist.ProcessGroup | None:
    """``dist.split_group(split_ranks=[ranks], ...)`` of the default group for the caller's own
    group: ``ranks`` sorted, unique, in range and holding the caller (an int32 array). Every rank
    of the default group calls this (or :func:`split_non_member`) once per split, in the same
    order. Same group, registry entries and counters as torch's call; torch's call itself (with
    the narrowed rank table) whenever :func:`uses_fast_split` says no. None if the backend gave
    this rank no group."""
    default = c10d._get_default_group()
    ranks = np.ascontiguousarray(ranks, dtype=np.int32)
    members = ranks.tolist()
    if uses_fast_split():
        return _split(default, ranks, members, members, timeout, pg_options, group_desc)
    extra: dict[str, Any] = {}
    if timeout is not None:
        extra["timeout"] = timeout
    if pg_options is not None:
        extra["pg_options"] = pg_options
    with narrowed_parent_ranks(default, members, default.size()):
        pg = dist.split_group(parent_pg=default, split_ranks=[members], group_desc=group_desc, **extra)
    return pg if isinstance(pg, dist.ProcessGroup) else None


def split_non_member(
    other: int,
    *,
    pg_options: Any = None,
    timeout: datetime.timedelta | None = None,
    group_desc: str | None = None,
) -> bool:
    """This rank's part in a split it is not a member of: torch's ``split_group`` of the default
    group with ``split_ranks=[[other]]`` (a one-rank split that does not hold this rank: NCCL's
    NOCOLOR): O(1) Python once the rank table is narrowed, so torch's own call. Returns whether
    the call drew a group name (moved the counter)."""
    default = c10d._get_default_group()
    me = default.rank()
    extra: dict[str, Any] = {}
    if timeout is not None:
        extra["timeout"] = timeout
    if pg_options is not None:
        extra["pg_options"] = pg_options
    count = c10d._world.group_count
    with narrowed_parent_ranks(default, [me, other], default.size()):
        dist.split_group(parent_pg=default, split_ranks=[[other]], group_desc=group_desc, **extra)
    return c10d._world.group_count != count
