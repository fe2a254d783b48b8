"""``check_consistency``: prove every rank holds the same configuration before any group exists.

One tiny all-reduce of a 64-bit fingerprint (e.g. ``layout.fingerprint()``) per job: ranks that
disagree about the configuration raise :class:`~rankmesh.errors.ConfigMismatchError` together,
naming the fingerprints, instead of hanging later in a group creation only some ranks enter.
Built on :mod:`rankmesh.process_groups` (the default group must exist); knows nothing of meshes.
"""

from __future__ import annotations

import datetime
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from rankmesh._check import as_timeout, as_u64, type_name
from rankmesh._fast_groups import group_device_types
from rankmesh.errors import ArgumentTypeError, ConfigMismatchError, ConsistencyTimeoutError
from rankmesh.process_groups import require_default_group

__all__ = ["check_consistency"]

_TWO63 = 1 << 63


def _to_i64(fp: int) -> int:
    """Order-preserving map of a u64 onto int64: ``fp - 2**63``."""
    return fp - _TWO63


def _from_i64(v: int) -> int:
    return v + _TWO63


def _collective_device(pg: dist.ProcessGroup) -> torch.device:
    device_types = group_device_types(pg)
    if not device_types or "cpu" in device_types:
        return torch.device("cpu")
    bound = getattr(pg, "bound_device_id", None)
    if bound is not None:
        return bound
    acc = torch.accelerator.current_accelerator()
    if acc is None:  # pragma: no cover - a group without CPU backend needs an accelerator
        return torch.device("cpu")
    return torch.device(acc.type, torch.accelerator.current_device_index())


def _wait(work: Any, timeout: datetime.timedelta, what: str, fingerprint: int, pg: dist.ProcessGroup) -> None:
    try:
        ok = work.wait(timeout=timeout)
    except RuntimeError as e:  # gloo / nccl raise on timeout
        raise ConsistencyTimeoutError(
            f"rankmesh consistency check: not every one of the {pg.size()} ranks reached the "
            f"{what} within {timeout.total_seconds():g} s ({e}). A rank crashed, is stuck, or "
            "runs a different code path (for example its own configuration failed validation). "
            "Check every rank's logs; make all ranks run the same configuration",
            field="timeout",
            value=timeout.total_seconds(),
            fingerprint=fingerprint,
        ) from e
    if ok is False:
        raise ConsistencyTimeoutError(
            f"rankmesh consistency check: the {what} did not complete within "
            f"{timeout.total_seconds():g} s; not every rank reached it",
            field="timeout",
            value=timeout.total_seconds(),
            fingerprint=fingerprint,
        )


def check_consistency(
    fingerprint: int,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: float | datetime.timedelta = 300.0,
) -> None:
    """Prove that every rank of ``group`` (default: the world) holds the same 64-bit fingerprint.

    One tiny collective (an all-reduce MAX of 2 int64: the fingerprint and its complement, which
    gives the minimum and maximum over all ranks). If they differ, a second tiny all-reduce finds
    how many ranks hold the extremes and one rank of each, and every rank raises
    :class:`~rankmesh.errors.ConfigMismatchError` naming its fingerprint and the others',
    instead of hanging later in a group creation or collective that only some ranks enter.
    If not every rank enters within ``timeout``, raises
    :class:`~rankmesh.errors.ConsistencyTimeoutError` (a ``ConfigMismatchError``). After a
    timeout the group may be unusable: treat it as fatal.

    The arguments are checked before any communication, so a malformed one fails on the rank
    that passed it and names it, instead of surfacing as a timeout blamed on the other ranks:

    - ``fingerprint``: an integer (``__index__``, not a bool, float or str: two ranks holding
      1.5 and 1.9 must not "agree") in ``0 .. 2**64 - 1``; else
      :class:`~rankmesh.errors.ArgumentTypeError` or :class:`~rankmesh.errors.LayoutOverflowError`;
    - ``timeout``: seconds (int or float) or a ``datetime.timedelta``, finite and at least 1 ms;
      else :class:`~rankmesh.errors.ArgumentTypeError` (a str, a bool) or
      :class:`~rankmesh.errors.InvalidTimeoutError` (zero, negative, NaN, infinite);
    - ``group``: ``None`` or a ``ProcessGroup`` this rank belongs to; else
      :class:`~rankmesh.errors.ArgumentTypeError`.

    Use e.g. ``layout.fingerprint()`` or ``ParallelDims(...).fingerprint``; call it on every
    rank, before building meshes.
    """
    fp = as_u64(fingerprint, "fingerprint")
    timeout = as_timeout(timeout, "timeout")
    _check_group(group)
    require_default_group("check_consistency")
    pg = group if group is not None else dist.group.WORLD
    device = _collective_device(pg)
    v = _to_i64(fp)
    t = torch.tensor([v, ~v], dtype=torch.int64, device=device)
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg, async_op=True)
    _wait(work, timeout, "fingerprint all-reduce", fp, pg)
    hi, neg_lo = t.tolist()
    fmax, fmin = _from_i64(hi), _from_i64(~neg_lo)
    if fmin == fmax == fp:
        return
    _raise_mismatch(fp, fmin, fmax, pg, device, timeout)


def _check_group(group: Any) -> None:
    """Returns when ``group`` is None (the world) or a ``ProcessGroup``; else
    :class:`~rankmesh.errors.ArgumentTypeError`, which says when this rank is not in the group."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        outside = type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER
        raise ArgumentTypeError(
            "group is GroupMember.NON_GROUP_MEMBER: this rank is not in the group; call check_consistency "
            "only on the group's members"
            if outside
            else f"group must be a torch.distributed.ProcessGroup or None (the world), got {type_name(group)} "
            f"{group!r}",
            field="group",
            value=group,
        )


def _raise_mismatch(
    fp: int, fmin: int, fmax: int, pg: dist.ProcessGroup, device: torch.device, timeout: datetime.timedelta
) -> NoReturn:
    """Raises :class:`~rankmesh.errors.ConfigMismatchError` on every rank of ``pg``, after one more
    tiny collective that finds how many ranks hold the lowest and highest fingerprints and one
    rank of each, for the message."""
    # Mismatch: every rank sees it (same reduction). One more tiny collective for the message.
    me = dist.get_rank(pg)
    n = pg.size()
    s = torch.tensor(
        [int(fp == fmin), int(fp == fmax), -(me if fp == fmin else n), -(me if fp == fmax else n)],
        dtype=torch.int64,
        device=device,
    )
    counts, firsts = s[:2].clone(), s[2:].clone()
    w1 = dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=pg, async_op=True)
    w2 = dist.all_reduce(firsts, op=dist.ReduceOp.MAX, group=pg, async_op=True)
    _wait(w1, timeout, "mismatch census", fp, pg)
    _wait(w2, timeout, "mismatch census", fp, pg)
    n_min, n_max = counts.tolist()
    r_min, r_max = (-x for x in firsts.tolist())
    raise ConfigMismatchError(
        f"rankmesh consistency check failed on rank {me} of {n}: ranks disagree on the "
        f"configuration. This rank's fingerprint is {fp:#018x}; the lowest fingerprint, "
        f"{fmin:#018x}, is held by {n_min} rank(s) (e.g. rank {r_min}) and the highest, "
        f"{fmax:#018x}, by {n_max} rank(s) (e.g. rank {r_max}). Every rank must build the same "
        "meshes: give all ranks the same parallelism degrees, world size and rank map (same "
        "command line, config files and environment), then restart the job",
        field="fingerprint",
        value=fp,
        fingerprint=fp,
        min_fingerprint=fmin,
        max_fingerprint=fmax,
    )
