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
- ``_world.pg_group_ranks[pg]`` is the same dict, built by ``dict(zip(...))`` (one entry per
  member is what torch's table needs: the part of the cost that stays O(members));
- the counters move exactly as torch's call moves them: torch 2.15 salts the name with
  ``_world.group_count`` and advances it; torch 2.13 salts it with ``len(_world.pg_names)`` and
  does not advance it (``SCHEME``).

Torch's own ``new_group`` runs instead, with the same arguments, whenever anything is not the
plain case this reproduces: TorchComms, ``TORCH_DIST_INIT_BARRIER=1``, a default group bound to a
device, a Python process group that makes its own subgroups, MPI, or a torch whose functions
this module does not recognise. :func:`self_check` decides once per default group: it checks
the private names this module uses, the naming scheme against torch's own
``_hash_ranks_to_str``, and makes a one-rank ``fake`` probe group both ways, comparing every
registry entry (then destroys both and winds the counter back, so the next group gets the name
torch's own call would give it).
A failed check warns once and falls back to torch's calls.
"""

from __future__ import annotations

import datetime
import warnings
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from rankmesh._native import hashed_group_name

__all__ = ["SCHEME", "new_member_group", "self_check", "uses_fast_path"]

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
)
_TABLES = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag", "tags_to_pg", "group_count")


def _scheme() -> str | None:
    """How this torch salts hashed group names: ``"group_count"`` (2.15: the counter every
    rank advances on every group-name draw) or ``"pg_names"`` (2.13: the number of groups this
    rank has registered; the counter moves only for unhashed names); None if neither."""
    fn = getattr(c10d, "_hash_ranks_to_str", None)
    pgn = getattr(c10d, "_process_group_name", None)
    if fn is None or pgn is None:
        return None
    names = set(fn.__code__.co_names)
    if "group_count" in names and "pg_names" not in names and "group_count" in pgn.__code__.co_names:
        return "group_count"
    if "pg_names" in names and "group_count" not in names:
        return "pg_names"
    return None


SCHEME: str | None = _scheme()
_state: dict[int, bool] = {}  # id(default group) -> fast path usable
_warned: list[str] = []


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
    missing = [f for f in _FUNCTIONS if not callable(getattr(c10d, f, None))]
    world = getattr(c10d, "_world", None)
    missing += [f"_world.{t}" for t in _TABLES if not hasattr(world, t)]
    if missing:
        return f"torch.distributed lacks {missing}"
    if SCHEME is None:
        return "torch's hashed group names use a salt rankmesh does not know"
    for probe in ([0], [0, 1, 2, 3], [5, 17, 1024, 131071]):
        if c10d._hash_ranks_to_str(probe) != hashed_group_name(np.asarray(probe, dtype=np.int32), _salt()):
            return f"torch's _hash_ranks_to_str({probe}) differs from rankmesh's"
    return None


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
    }


def _probe_reason(backend: str) -> str | None:
    """Make a one-rank probe group both ways and compare every registry entry."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake"; idempotent)

    me = dist.get_rank()
    ranks = np.asarray([me], dtype=np.int32)
    w = c10d._world
    made = []
    start = w.group_count
    try:
        want_name = hashed_group_name(ranks, _salt())
        count = w.group_count
        theirs = dist.new_group([me], backend=backend, use_local_synchronization=True, group_desc="rankmesh_probe")
        made.append(theirs)
        torch_step = w.group_count - count
        if w.pg_names[theirs] != want_name:
            return "rankmesh's name for torch's probe group differs from torch's"
        count = w.group_count
        ours = _create(ranks, [me], backend, None, None, "rankmesh_probe")
        made.append(ours)
        if w.group_count - count != torch_step:
            return "torch's group counter moves differently"
        a, b = _entries(theirs), _entries(ours)
        if a != b:
            diff = sorted(k for k in a if a[k] != b.get(k))
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
    (decided once per default group; every rank of the job runs the same probe)."""
    default = c10d._get_default_group()
    key = id(default)
    if key not in _state:
        reason = _static_reason() or _probe_reason(backend)
        _state.clear()
        _state[key] = reason is None
        if reason is not None and reason not in _warned:
            _warned.append(reason)
            warnings.warn(
                f"rankmesh: {reason}; making process groups with torch's own new_group (correct, "
                "but O(members) Python per group)",
                RuntimeWarning,
                stacklevel=3,
            )
    return _state[key]


def uses_fast_path(backend: str | None) -> bool:
    """Whether a member-only group on ``backend`` would be made by rankmesh right now."""
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
    c10d._world.pg_group_ranks[pg] = dict(zip(ranks_list, range(len(ranks_list))))
    return pg


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
    torch's call; torch's call itself whenever :func:`uses_fast_path` says no."""
    ranks_list = ranks.tolist()
    if not uses_fast_path(backend):
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = timeout
        if pg_options is not None:
            extra["pg_options"] = pg_options
        return dist.new_group(
            ranks_list, backend=backend, use_local_synchronization=True, group_desc=group_desc, **extra
        )
    return _create(np.ascontiguousarray(ranks, dtype=np.int32), ranks_list, backend, pg_options, timeout, group_desc)
