"""Whether this torch's c10d is the one :mod:`rankmesh._fast_groups` reproduces: the start-up checks
of its two fast paths (``new_group``, ``split_group``), each decided once per default group.

In order: the private names the fast paths use and a known naming scheme, the release read
(every process); then, kept as one verdict per install (:func:`_checked`, whose key holds every
function involved and the table's hashes): the bodies each path reproduces (:data:`GATES`),
rankmesh's hashed names against torch's ``_hash_ranks_to_str``, and a probe: a one-rank ``fake`` group made both
ways (torch's call, and rankmesh's maker handed in), or a one-rank ``fake`` parent split both ways
(local: no collective, no store keys), comparing the group's own entries and everything each call
wrote into c10d's registry: every table of ``_world`` and every table global of
``distributed_c10d``, found by walking them, so a table a new torch adds is compared too. The
probe destroys both groups and winds the counter back. A failed check warns once and the caller
takes torch's calls.
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
    "_probe",
    "_probe_reason",
    "_split_probe_reason",
    "_differs_from_torchs",
    "_entries",
    "_registry",
    "_writes",
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
    a, b = _entries(theirs), _entries(ours)
    return sorted(k for k in a if a[k] != b.get(k))


def _registry() -> dict[str, Any]:
    """Every table of c10d's registry, copied one level deep (the lists and sets in a dict too:
    torch appends to ``tags_to_pg``'s in place): each attribute of ``_world`` and each dict, list,
    set or int global of ``distributed_c10d``. Nothing is picked by hand: a table a new torch adds
    is in it (``_world``'s properties are views of these globals, some W long: not read)."""
    out: dict[str, Any] = {}
    for prefix, space in (("_world.", vars(c10d._world)), ("c10d.", vars(c10d))):
        for n, v in space.items():
            t = type(v)  # not isinstance(): a deprecated c10d global warns when its __class__ is read
            if n.startswith("__") or t is bool or not issubclass(t, (dict, list, set, int)):
                continue
            if isinstance(v, dict):
                v = {k: (type(x)(x) if isinstance(x, (list, set)) else x) for k, x in v.items()}
            out[prefix + n] = type(v)(v) if isinstance(v, (list, set)) else v
    return out


def _normal(x: Any, pg: Any, name: str) -> Any:
    """``x`` with the new group and its name as placeholders and other objects as their type, so
    that torch's and rankmesh's writes compare equal when they are the same writes."""
    if x is pg:
        return "<group>"
    if isinstance(x, str):
        return x.replace(name, "<name>") if name else x
    if isinstance(x, (bool, int, float, datetime.timedelta)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_normal(y, pg, name) for y in x)
    if isinstance(x, (set, frozenset)):
        return sorted(repr(_normal(y, pg, name)) for y in x)
    if isinstance(x, dict):
        return sorted((repr(_normal(k, pg, name)), repr(_normal(v, pg, name))) for k, v in x.items())
    return type(x).__name__


def _writes(before: dict[str, Any], pg: Any, after: dict[str, Any] | None = None) -> dict[str, Any]:
    """What making ``pg`` wrote into the registry between ``before`` and ``after`` (now, by default;
    both :func:`_registry`): per table, the entries added, replaced or removed, the items appended,
    or how far a counter moved."""
    name = c10d._world.pg_names.get(pg, "")
    after = _registry() if after is None else after
    out: dict[str, Any] = {}
    for table in sorted(before.keys() | after.keys()):
        a, b = before.get(table), after.get(table)
        if isinstance(a, dict) and isinstance(b, dict):
            changed = [(k, "<removed>") for k in a if k not in b]
            for k, v in b.items():
                if k not in a:
                    changed.append((k, v))
                elif isinstance(v, list) and isinstance(a[k], list) and v[: len(a[k])] == a[k]:
                    if len(v) > len(a[k]):
                        changed.append((k, ("<appended>", *v[len(a[k]) :])))
                elif a[k] is not v and not _same(a[k], v):
                    changed.append((k, v))
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
    return sorted(t for t in theirs.keys() | ours.keys() if theirs.get(t) != ours.get(t))


def _differs_from_torchs(what: str, where: str, theirs: Callable[[], Any], ours: Callable[[], Any]) -> str | None:
    """Make ``what`` torch's way (``theirs()``), then rankmesh's (``ours()``): how rankmesh's group,
    its counter step and its registry writes differ from torch's, or None."""
    w = c10d._world
    count, before = w.group_count, _registry()
    their_pg = theirs()
    if not isinstance(their_pg, dist.ProcessGroup):
        return f"torch's call for {what} gave no group"
    between = _registry()
    step, writes = w.group_count - count, _writes(before, their_pg, between)
    count = w.group_count
    our_pg = ours()
    if our_pg is None:
        return f"rankmesh's call for {what} gave no group"
    if w.group_count - count != step:
        return f"torch's group counter moves differently{where}"
    diff = _entries_differing(their_pg, our_pg) + _writes_differing(writes, _writes(between, our_pg))
    return f"{what}'s registry entries differ from torch's: {diff}" if diff else None


def _probe(
    what: str, where: str, theirs: Callable[..., Any], ours: Callable[..., Any], parent: bool = False
) -> str | None:
    """:func:`_differs_from_torchs` on one-rank ``fake`` groups, each maker called with the list of
    groups made (and, with ``parent``, a one-rank ``fake`` group made first to split). It leaves no
    trace: every group made is destroyed and the counter wound back, so the next group gets the
    name torch's own call would give it; local to this rank (the fake backend talks to no one, uses
    no store), it cannot hang or collide with a real group."""
    register_fake_backend()
    made: list[Any] = []
    start = c10d._world.group_count
    try:
        if parent:
            me = dist.get_rank()
            made.append(
                dist.new_group([me], backend="fake", use_local_synchronization=True, group_desc="rankmesh_probe")
            )
        return _differs_from_torchs(what, where, lambda: theirs(made), lambda: ours(made))
    except Exception as e:  # noqa: BLE001 - any surprise means: use torch's own calls
        return f"{what} failed: {type(e).__name__}: {e}"
    finally:
        for pg in reversed(made):
            dist.destroy_process_group(pg)
        c10d._world.group_count = start


def _keep(made: list, pg: Any) -> Any:
    if pg is not None:
        made.append(pg)
    return pg


def _probe_reason(backend: str, create: Callable[..., Any]) -> str | None:
    """A one-rank group made by torch's ``new_group`` and by rankmesh's ``create(ranks, ranks_list,
    backend, pg_options, timeout, group_desc)``, compared."""
    me = dist.get_rank()
    ranks = np.asarray([me], dtype=np.int32)

    def theirs(made: list) -> Any:
        want = hashed_group_name(ranks, salt())
        pg = _keep(
            made, dist.new_group([me], backend=backend, use_local_synchronization=True, group_desc="rankmesh_probe")
        )
        if c10d._world.pg_names[pg] != want:
            raise ValueError("rankmesh's name for torch's probe group differs from torch's")
        return pg

    return _probe(
        "the probe group",
        "",
        theirs,
        lambda made: _keep(made, create(ranks, [me], backend, None, None, "rankmesh_probe")),
    )


def _split_probe_reason(split: Callable[..., Any]) -> str | None:
    """A one-rank ``fake`` parent split by torch's ``split_group`` and by rankmesh's ``split(parent,
    ranks, ranks_list, global_ranks, timeout, pg_options, group_desc)``, compared."""
    me = dist.get_rank()

    def theirs(made: list) -> Any:
        return _keep(made, dist.split_group(parent_pg=made[0], split_ranks=[[0]], group_desc="rankmesh_probe_split"))

    def ours(made: list) -> Any:
        return _keep(made, split(made[0], np.zeros(1, dtype=np.int32), [0], [me], None, None, "rankmesh_probe_split"))

    return _probe("the split probe group", " in split_group", theirs, ours, parent=True)


def register_fake_backend() -> Any:
    """Registers torch's ``fake`` backend with c10d: importing its module does it (idempotent, ~0.3 ms
    the first time). The one place rankmesh does; the probes need it first."""
    import torch.testing._internal.distributed.fake_pg as fake_pg

    return fake_pg


def _warn_once(message: str) -> None:
    warn_once(("fast_groups", message), f"rankmesh: {message} (correct, but O(members) Python per group)", stacklevel=5)


def new_group_ok(backend: str, create: Callable[..., Any], makers: tuple[Any, ...]) -> bool:
    """Whether rankmesh's ``create`` may make member-only groups itself under the current default
    group (decided once per default group, by the same checks on every rank)."""
    key = id(c10d._get_default_group())
    if key not in _state:
        gate = GATES["new_group"]
        # the probe's kept verdict is keyed by the gate's functions and hashes too: one verdict
        reason = (
            _static_reason()
            or gate.unread()
            or _checked(
                "new_group",
                {"backend": backend},
                lambda: gate.hashes_reason() or _names_reason() or _probe_reason(backend, create),
                makers,
            )
        )
        _state.clear()
        _state[key] = reason is None
        if reason is not None:
            _warn_once(f"{reason}; making process groups with torch's own new_group")
    return _state[key]


_SPLIT_FUNCTIONS = ("_register_pg_in_world", "_maybe_attach_flight_recorder", "HealthCheckHook", "BackendConfig")
_split_state: dict[int, bool] = {}  # id(default group) -> fast split usable

#: Which torch release's ``split_group`` ``rankmesh._fast_groups.split_member_group`` reproduces
#: here (the table's ``split_group`` fact), or None.
SPLIT_SHAPE: str | None = GATES["split_group"].release()


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
            or GATES["split_group"].unread()
            or GATES["new_group"].unread()
            or _checked(
                "split_group",
                extra,
                lambda: (
                    GATES["split_group"].hashes_reason()
                    or GATES["new_group"].hashes_reason()
                    or _names_reason()
                    or _split_probe_reason(split)
                ),
                makers,
            )
        )
        _split_state.clear()
        _split_state[key] = reason is None
        if reason is not None:
            _warn_once(f"{reason}; splitting process groups with torch's own split_group")
    return _split_state[key]
