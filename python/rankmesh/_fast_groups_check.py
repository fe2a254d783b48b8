"""Whether this torch's c10d is the one :mod:`rankmesh._fast_groups` reproduces: the start-up checks
of its two fast paths (``new_group``, ``split_group``), each decided once per default group.

In order: the private names the fast paths use and a known naming scheme (every process), the
gate of the torch bodies each path reproduces (:data:`GATES`), rankmesh's hashed names against
torch's ``_hash_ranks_to_str`` (every process), then a probe: a one-rank ``fake`` group made both
ways (torch's call, and rankmesh's maker handed in), or a one-rank ``fake`` parent split both ways
(local: no collective, no store keys), comparing the group's own entries and everything each call
wrote into c10d's registry: every table of ``_world`` and every table global of
``distributed_c10d``, found by walking them, so a table a new torch adds is compared too. The
probe destroys both groups and winds the counter back. Its verdict is kept once per install
(:func:`_checked`). A failed check warns once and the caller takes torch's calls.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from rankmesh import _verdicts
from rankmesh._dependencies import release_of
from rankmesh._known import TABLES
from rankmesh._native import hashed_group_name
from rankmesh._once import warn_once
from rankmesh._patch import Gate

__all__ = ["GATES", "SCHEME", "SPLIT_SHAPE", "new_group_ok", "register_fake_backend", "salt", "split_ok"]

# The private members of torch.distributed.distributed_c10d the fast paths call or read.
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
_TABLES = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg", "group_count")
_C10D = "torch.distributed.distributed_c10d"
_NAMES = [f"{_C10D}._process_group_name", f"{_C10D}._hash_ranks_to_str"]

#: The torch bodies each fast path reproduces: ``split_group`` only on a release whose table says
#: rankmesh reproduces its ``split_group`` (2.15).
GATES: dict[str, Gate] = {
    "new_group": Gate(
        "torch", [f"{_C10D}.new_group", f"{_C10D}._new_group_with_tag", *_NAMES], reader="rankmesh's new_group path"
    ),
    "split_group": Gate(
        "torch", [f"{_C10D}.split_group", *_NAMES], fact="split_group", reader="rankmesh's split_group path"
    ),
}

_RELEASE = TABLES["torch"].get(release_of("torch") or "")
#: How this torch salts hashed group names (its table's ``scheme``): ``"group_count"`` (2.14, 2.15:
#: the counter every rank advances on every name draw) or ``"pg_names"`` (2.13: the number of groups
#: registered); None on a torch not read. The gate's names bodies pin it; the check compares names.
SCHEME: str | None = _RELEASE.facts.get("scheme") if _RELEASE is not None else None
_state: dict[int, bool] = {}  # id(default group) -> fast path usable


def salt() -> int:
    """What torch salts the next hashed group name with (:data:`SCHEME`)."""
    w = c10d._world
    return w.group_count if SCHEME == "group_count" else len(w.pg_names)


def _static_reason() -> str | None:
    """Why the fast paths may not run here, from what this process can see at no cost (the private
    names they use, a known naming scheme), or None. What the bodies and the probes decide is
    :func:`_checked`'s."""
    missing = []
    for f in _FUNCTIONS:  # loops: run by the first mesh of every process (see _verdict_key)
        if not callable(getattr(c10d, f, None)):
            missing.append(f)
    world = getattr(c10d, "_world", None)
    for t in _TABLES:  # on the class where it is a property: not run, only found
        if not hasattr(type(world), t) and not hasattr(world, t):
            missing.append(f"_world.{t}")
    if missing:
        return f"torch.distributed lacks {missing}"
    if SCHEME is None:
        return "torch's hashed group names use a salt rankmesh does not know"
    return None


def _names_reason() -> str | None:
    """Why rankmesh's hashed group names (:func:`hashed_group_name`) are not torch's
    (``_hash_ranks_to_str``), or None."""
    for probe in ([0], [0, 1, 2, 3], [5, 17, 1024, 131071]):
        if c10d._hash_ranks_to_str(probe) != hashed_group_name(np.asarray(probe, dtype=np.int32), salt()):
            return f"torch's _hash_ranks_to_str({probe}) differs from rankmesh's"
    return None


# -- the probes' verdicts, kept once per install (rankmesh._verdicts) ----------------------------

# What the probes run besides the gates' bodies, on torch's side and rankmesh's: any of them
# replaced in this process (a wrapper, a monkeypatch) is another key, so no verdict is reused for
# other code.
_PROBED_TORCH = ("new_group", "split_group", "get_rank", "destroy_process_group", "_new_group_with_tag")
_PROBED_OURS = (
    "salt",
    "_probe_reason",
    "_split_probe_reason",
    "_differs_from_torchs",
    "_entries",
    "_entries_differing",
    "_registry",
    "_writes",
    "_writes_differing",
)


def _checked(path: str, extra: dict[str, Any], probe: Callable[[], str | None], makers: tuple[Any, ...]) -> str | None:
    """``probe()``'s verdict for the ``path`` fast path, kept once per install under a key of what
    decides it: torch's build, rankmesh's version, the scheme, the gates' hashes, every function the
    probe runs as this process has it (name, file, first line; rankmesh's ``makers`` among them)
    and the size and mtime of their files."""
    from rankmesh._native import __version__ as rankmesh_version

    objs = [getattr(dist, n, None) for n in ("new_group", "split_group")]
    objs += [getattr(c10d, n, None) for n in (*_PROBED_TORCH, *_FUNCTIONS, *_SPLIT_FUNCTIONS)]
    objs += [globals()[n] for n in _PROBED_OURS] + [hashed_group_name, *makers]
    files = [c10d.__file__, __file__, getattr(sys.modules.get("rankmesh._native"), "__file__", None)]
    code = []
    for obj in dict.fromkeys(objs):
        fn = getattr(obj, "__func__", obj)
        co = getattr(fn, "__code__", None)
        name = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
        if co is not None and co.co_filename not in files:
            files.append(co.co_filename)
        code.append(name if co is None else (name, co.co_filename, co.co_firstlineno))
    gates = {p: GATES[p].known() for p in dict.fromkeys((path, "new_group"))}
    key = _verdicts.code_key(
        files,
        check=path,
        torch=(str(torch.__version__), str(getattr(torch.version, "git_version", ""))),
        rankmesh=rankmesh_version,
        scheme=SCHEME,
        gates={p: sorted(k.items()) if k else None for p, k in gates.items()},
        code=code,
        **extra,
    )
    if key is None:
        return probe()
    return _verdicts.verdict(" ".join([path, *(f"{k}={v}" for k, v in extra.items())]), key, probe)


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


def _differs_from_torchs(
    theirs: dist.ProcessGroup,
    ours: dist.ProcessGroup,
    torch_step: int,
    torch_writes: dict[str, Any],
    count: int,
    before: Any,
    probe: str,
    where: str,
) -> str | None:
    """How rankmesh's probe group ``ours`` (made after ``count`` groups, over the registry
    ``before``) differs from torch's ``theirs`` (which moved the counter by ``torch_step`` and
    wrote ``torch_writes``), or None: the comparison both probes make."""
    if c10d._world.group_count - count != torch_step:
        return f"torch's group counter moves differently{where}"
    diff = _entries_differing(theirs, ours) + _writes_differing(torch_writes, _writes(before, ours))
    return f"{probe}'s registry entries differ from torch's: {diff}" if diff else None


def _probe_reason(backend: str, create: Callable[..., Any]) -> str | None:
    """Make a one-rank probe group both ways (torch's ``new_group``; ``create``, rankmesh's
    ``_create(ranks, ranks_list, backend, pg_options, timeout, group_desc)``) and compare every
    registry entry."""
    register_fake_backend()

    me = dist.get_rank()
    ranks = np.asarray([me], dtype=np.int32)
    w = c10d._world
    made = []
    start = w.group_count
    try:
        want_name = hashed_group_name(ranks, salt())
        count, before = w.group_count, _registry()
        theirs = dist.new_group([me], backend=backend, use_local_synchronization=True, group_desc="rankmesh_probe")
        made.append(theirs)
        between = _registry()  # after torch's call, before rankmesh's
        torch_step, torch_writes = w.group_count - count, _writes(before, theirs, between)
        if w.pg_names[theirs] != want_name:
            return "rankmesh's name for torch's probe group differs from torch's"
        count, before = w.group_count, between
        ours = create(ranks, [me], backend, None, None, "rankmesh_probe")
        made.append(ours)
        return _differs_from_torchs(theirs, ours, torch_step, torch_writes, count, before, "the probe group", "")
    except Exception as e:  # noqa: BLE001 - any surprise means: use torch's own calls
        return f"the probe group failed: {type(e).__name__}: {e}"
    finally:
        for pg in made:
            dist.destroy_process_group(pg)
        # The probe leaves no trace: the next group gets the name torch's own call would give it.
        w.group_count = start


def new_group_ok(backend: str, create: Callable[..., Any], makers: tuple[Any, ...]) -> bool:
    """Whether rankmesh's ``create`` may make member-only groups itself under the current default
    group (decided once per default group, by the same checks on every rank)."""
    key = id(c10d._get_default_group())
    if key not in _state:
        reason = (
            _static_reason()
            or GATES["new_group"].recognise()
            or _names_reason()
            or _checked("new_group", {"backend": backend}, lambda: _probe_reason(backend, create), makers)
        )
        _state.clear()
        _state[key] = reason is None
        if reason is not None:
            _warn_once(f"{reason}; making process groups with torch's own new_group")
    return _state[key]


def _warn_once(message: str) -> None:
    warn_once(("fast_groups", message), f"rankmesh: {message} (correct, but O(members) Python per group)", stacklevel=5)


_SPLIT_FUNCTIONS = ("_register_pg_in_world", "_maybe_attach_flight_recorder", "HealthCheckHook", "BackendConfig")
_split_state: dict[int, bool] = {}  # id(default group) -> fast split usable


#: Which torch release's ``split_group`` ``rankmesh._fast_groups.split_member_group`` reproduces
#: here, or None (its body is checked once, by :func:`split_ok`).
SPLIT_SHAPE: str | None = GATES["split_group"].release()


def register_fake_backend() -> Any:
    """Registers torch's ``fake`` backend with c10d: importing its module does it (idempotent,
    ~0.3 ms the first time), which is returned (its ``FakeStore``). The one place rankmesh does;
    the probes need it first."""
    import torch.testing._internal.distributed.fake_pg as fake_pg

    return fake_pg


def _split_probe_reason(split: Callable[..., Any]) -> str | None:
    """Split a one-rank ``fake`` parent both ways (torch's ``split_group``; ``split``, rankmesh's
    ``_split(parent, ranks, ranks_list, global_ranks, timeout, pg_options, group_desc)``) and
    compare every registry entry. Local to this rank (the fake backend talks to no one, uses no
    store), so it cannot hang or collide with a real group; the probe leaves no group behind and
    winds the counter back."""
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
        ours = split(parent, np.zeros(1, dtype=np.int32), [0], [me], None, None, "rankmesh_probe_split")
        if ours is None:
            return "rankmesh's split of the probe gave no group"
        made.append(ours)
        return _differs_from_torchs(
            theirs, ours, torch_step, torch_writes, count, before, "the split probe group", " in split_group"
        )
    except Exception as e:  # noqa: BLE001 - any surprise means: use torch's own calls
        return f"the split probe failed: {type(e).__name__}: {e}"
    finally:
        for pg in reversed(made):
            dist.destroy_process_group(pg)
        w.group_count = start


def split_ok(split: Callable[..., Any], makers: tuple[Any, ...]) -> bool:
    """Whether rankmesh's ``split`` may split groups itself under the current default group
    (decided once per default group, by the same local probe on every rank)."""
    default = c10d._get_default_group()
    key = id(default)
    if key not in _split_state:
        missing = [f for f in _SPLIT_FUNCTIONS if getattr(c10d, f, None) is None]
        accelerator = torch.accelerator.current_accelerator()  # which backend of the parent splits
        bound = default.bound_device_id
        extra = {"accelerator": accelerator and accelerator.type, "bound": bound and bound.type}
        reason = (
            (None if SPLIT_SHAPE else f"torch {torch.__version__}'s split_group is not the one rankmesh reproduces")
            or (f"torch.distributed lacks {missing}" if missing else None)
            or _static_reason()
            or GATES["split_group"].recognise()
            or GATES["new_group"].recognise()
            or _names_reason()
            or _checked("split_group", extra, lambda: _split_probe_reason(split), makers)
        )
        _split_state.clear()
        _split_state[key] = reason is None
        if reason is not None:
            _warn_once(f"{reason}; splitting process groups with torch's own split_group")
    return _split_state[key]
