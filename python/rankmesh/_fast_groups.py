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
not read. Whether this torch is one it has read is :mod:`rankmesh._fast_groups_check`'s question
(:func:`self_check`, :func:`split_self_check`: each fast path allow-listed by torch release plus
the hash of every torch function body it reproduces, then a one-rank ``fake`` probe made both
ways and compared table by table; decided once per default group, its verdict kept once per torch
install). A failed check warns once and falls back to torch's calls. The per-call gates (barrier,
TorchComms, a bound device, ``RANKMESH_DISABLE``) run here, in every process.

The ``split_group`` path (a default group bound to a device, e.g. NCCL eager init) is made the
same way by :func:`split_member_group`: torch's ``split_group(split_ranks=[my_group])`` spends
its per-member Python inverting the parent's rank table (O(W) for the default group), checking
and searching the ranks, hashing the joined ranks, and building two lists and two dicts of the
group. rankmesh reproduces the body of the one ``split_group`` it has read (torch 2.15's, by
release and body hash: ``_fast_groups_check.GATES``), calling the backend's own
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
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from rankmesh import _fast_groups_check as check
from rankmesh._fast_groups_check import register_fake_backend
from rankmesh._native import hashed_group_name, member_tuple
from rankmesh._patch import disabled
from rankmesh.errors import DistributedStateError

__all__ = [
    "FAST_GROUPS",
    "LAZY_TABLE_MIN",
    "RANK_TABLES",
    "RankTable",
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

#: The name ``RANKMESH_DISABLE`` takes to keep rankmesh out of c10d's registry: every group is
#: then torch's own ``new_group`` / ``split_group`` call.
FAST_GROUPS = "fast_groups"


def _draw_name(ranks: np.ndarray) -> str:
    """torch's ``_process_group_name(ranks, use_hashed_name=True)``: the name, and the counter
    moved as torch moves it (``_fast_groups_check.SCHEME``)."""
    name = hashed_group_name(ranks, check.salt())
    if check.SCHEME == "group_count":
        c10d._world.group_count += 1
    return name


def _makers() -> tuple[Any, ...]:
    """rankmesh's functions that make a group as torch would (what the probes run on rankmesh's
    side: part of the start-up verdict's key), as this process has them now."""
    return (_create, _split, _draw_name, _as_list, _rank_table)


def self_check(backend: str = "fake") -> bool:
    """Whether :func:`new_member_group` may make groups itself under the current default group
    (decided once per default group: :func:`rankmesh._fast_groups_check.new_group_ok`)."""
    return check.new_group_ok(backend, _create, _makers())


def split_self_check() -> bool:
    """Whether :func:`split_member_group` may split groups itself under the current default group
    (decided once per default group: :func:`rankmesh._fast_groups_check.split_ok`)."""
    return check.split_ok(_split, _makers())


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
# group takes its list and its rank table from the one tuple. The tuple is made untracked by the
# cycle collector (``member_tuple``: ints hold no cycle), so the collection a process's first build
# sets off does not walk every member of every table it has just made (~0.07 ms at 131,072 ranks).
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
    if members is None:
        if len(ranks) < LAZY_TABLE_MIN:  # only member lists worth keeping
            return ranks.tolist()
        if len(_MEMBER_TABLES) >= 32:
            _MEMBER_TABLES.clear()
        members = member_tuple(ranks)  # untracked: see _MEMBER_TABLES
        _MEMBER_TABLES[id(ranks)] = (ranks, members)
    return list(members)  # a list of its own: torch keeps what it is given


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


def _optional(timeout: datetime.timedelta | None, pg_options: Any) -> dict[str, Any]:
    """The ``timeout`` and ``pg_options`` keywords for torch's ``new_group``/``split_group``, each
    only when given (so torch applies its own defaults, as for a caller that left them out)."""
    out: dict[str, Any] = {}
    if timeout is not None:
        out["timeout"] = timeout
    if pg_options is not None:
        out["pg_options"] = pg_options
    return out


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
        pg = dist.new_group(
            ranks_list,
            backend=backend,
            use_local_synchronization=True,
            group_desc=group_desc,
            **_optional(timeout, pg_options),
        )
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
    if check.SCHEME != "pg_names":
        return None
    default = c10d._get_default_group()
    if c10d.Backend(backend or c10d._world.pg_map[default][0]) == "fake":
        return None
    if _drawn[0] is None or _drawn[0]() is not default:  # a new world: nothing drawn in it yet
        _drawn[:] = [weakref.ref(default), set()]
    names: set[str] = _drawn[1]
    name = hashed_group_name(ranks, check.salt())
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


def init_fake_world(world_size: int, rank: int) -> None:
    """``init_process_group`` on the ``fake`` backend: one process stands in for ``rank`` of a
    ``world_size``-rank job (the demo, the benchmarks, the workloads)."""
    fake_pg = register_fake_backend()
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=fake_pg.FakeStore())


def registered_groups() -> int:
    """How many process groups this rank has registered with torch (``len(_world.pg_map)``, the
    default group included): what the demo and the benchmarks report as "process groups"."""
    return len(c10d._world.pg_map)


def group_members() -> int:
    """How many members the process groups this rank has registered hold, the default group left
    out (the sum of their rank tables' lengths): the one part of a build that grows with the
    world on every road, since torch needs each member of a rank's own groups (a rank table entry,
    the backend's member list). What the benchmarks report as "members"."""
    default = dist.group.WORLD
    return sum(len(table) for pg, table in c10d._world.pg_group_ranks.items() if pg is not default)


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
    with narrowed_parent_ranks(default, members, default.size()):
        pg = dist.split_group(
            parent_pg=default, split_ranks=[members], group_desc=group_desc, **_optional(timeout, pg_options)
        )
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
    count = c10d._world.group_count
    with narrowed_parent_ranks(default, [me, other], default.size()):
        dist.split_group(
            parent_pg=default, split_ranks=[[other]], group_desc=group_desc, **_optional(timeout, pg_options)
        )
    return c10d._world.group_count != count
