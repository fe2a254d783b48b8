"""Re-forming every mesh after a rank fails: a hot spare takes its place, or the replica dim
shrinks. O(changes) to describe, O(group) per rank to build, like the first init.

A :class:`Reform` says, for the new job, how many ranks it has, which new rank each old one
becomes (the ranks still alive are renumbered in order, as torch's ``shrink_group`` and an
ordered re-rendezvous do), and the world the meshes are laid over. Build it on every rank from
what failed (:func:`hot_spare` or :func:`shrink`), re-initialise the default group with
``new_rank(old)`` and ``world_size``, prove every rank agrees (:meth:`Reform.check`), then
:meth:`Reform.activate` it and build the meshes exactly as at the first init:
``rankmesh.init_device_mesh``, :class:`rankmesh.ParallelDims`, ``rankmesh.torchtitan.accelerate()``'s
torchtitan and ``rankmesh.megatron.initialize_model_parallel`` all lay their meshes over the
re-formed world while it is active (until the default group changes).

A hot spare: 8 ranks in the mesh and one spare (old rank 8); rank 3 fails and the spare takes
its place and its number (``renumber="fill"``, the default): every other rank keeps its number,
the world stays the plain one, and every tree is the first start's::

    >>> from rankmesh.recovery import hot_spare, shrink
    >>> plan = hot_spare(9, failed=[3], mesh_size=8)
    >>> plan.world_size, plan.new_rank(8), plan.new_rank(5), plan.new_rank(3), plan.world.in_rank_order
    (8, 3, 5, None, True)

Where the launcher renumbers the survivors in order instead (torch's ``shrink_group``),
``renumber="shift"``: the spare becomes rank 7 at mesh index 3, and the world stores the
renumbering (O(changes))::

    >>> plan = hot_spare(9, failed=[3], mesh_size=8, renumber="shift")
    >>> plan.new_rank(8), plan.new_rank(5)
    (7, 4)
    >>> [int(r) for r in plan.world.unflatten("world", (2, 4), ("dp", "tp")).group(7, "tp")]
    [0, 1, 2, 7]

Such a world is not monotone: a group holding the spare and a later index ranks its members in
sorted order, as torch's ``new_group`` does for a ``DeviceMesh`` over the same rank map, so its
local ranks are not the mesh coordinates there (torch's meshes answer the same). Megatron's
pipeline stages go by local rank: ``rankmesh.megatron`` refuses a shifted world. Prefer ``fill``.

Shrinking ``dp_replicate`` after rank 5 of a ``(dp_replicate 2, dp_shard 2, tp 2)`` job fails:
replica 1 (ranks 4-7) leaves, the other keeps every inner dim::

    >>> plan = shrink({"dp_replicate": 2, "dp_shard": 2, "tp": 2}, failed=[5])
    >>> plan.sizes, plan.world_size, plan.new_rank(2), plan.new_rank(6)
    ({'dp_replicate': 1, 'dp_shard': 2, 'tp': 2}, 4, 2, None)

Every refusal is a :class:`~rankmesh.errors.ReformError` naming the argument and the fix, raised
before any group is created.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankmesh._check import as_int
from rankmesh._native import MeshLayout
from rankmesh.errors import RankmeshError, ReformError

__all__ = ["Reform", "hot_spare", "shrink", "active_world", "deactivate"]


@dataclass(frozen=True)
class Reform:
    """The job after a failure, as every rank must see it.

    Attributes:
        world_size: ranks in the new job.
        world: the 1-D world layout the meshes are laid over (``MeshLayout.world``'s kind; a
            renumbered world after a hot spare, stored in O(changes)).
        removed: the old ranks not in the new job (sorted): the failed ones, unused spares, the
            ranks of dropped replicas.
        sizes: the mesh's dims and sizes after the change (for :func:`shrink`; None for a hot
            spare, where the sizes do not change).
    """

    old_world_size: int
    world_size: int
    world: MeshLayout
    removed: tuple[int, ...]
    sizes: dict[str, int] | None = None
    _dropped: Any = field(default=None, repr=False, compare=False)

    def new_rank(self, old_rank: int) -> int | None:
        """The rank old rank ``old_rank`` has in the new job, or None when it is not in it (it
        failed, or leaves). O(log changes)."""
        old = as_int(old_rank, "old_rank")
        if not 0 <= old < self.old_world_size:
            raise ReformError(
                f"old_rank = {old} is not a rank of the old job of {self.old_world_size} ranks",
                field="old_rank",
                value=old_rank,
            )
        if self._dropped is not None:  # a shrink or a filled hot spare: by rule, O(changes)
            return self._dropped(old)
        k = bisect.bisect_left(self.removed, old)
        if k < len(self.removed) and self.removed[k] == old:
            return None
        return old - k

    @property
    def fingerprint(self) -> int:
        """64 bits every rank of the new job must agree on (the world layout's fingerprint,
        which covers the renumbering, and the sizes)."""
        import hashlib

        h = hashlib.blake2b(b"rankmesh.reform.v1", digest_size=8)
        h.update(self.world.fingerprint().to_bytes(8, "little"))
        h.update(repr((self.old_world_size, self.world_size, self.sizes)).encode())
        return int.from_bytes(h.digest(), "little")

    def check(self, *, timeout: float = 300.0) -> None:
        """Prove, in one tiny collective over the new default group, that every rank holds the same
        re-form (``rankmesh.check_consistency``): ranks that disagree about what failed raise
        :class:`~rankmesh.errors.ConfigMismatchError` everywhere, in bounded time, instead of
        hanging in a group creation."""
        from rankmesh.consistency import check_consistency

        check_consistency(self.fingerprint, timeout=timeout)

    def activate(self) -> Reform:
        """Lay every mesh rankmesh builds over this re-formed world, for as long as the current
        default group lives (a new ``init_process_group`` ends it; so does :func:`deactivate`).
        The default group must already be the new job's: ``world_size`` ranks."""
        import torch.distributed as dist

        from rankmesh.errors import DistributedStateError

        if not dist.is_initialized() or dist.get_world_size() != self.world_size:
            got = dist.get_world_size() if dist.is_initialized() else None
            raise DistributedStateError(
                f"activate() needs the new job's default group of {self.world_size} ranks, found "
                f"{'none' if got is None else f'{got} ranks'}; call init_process_group(rank=plan.new_rank(old_rank), "
                "world_size=plan.world_size, ...) first",
                field="world_size",
                value=got,
            )
        _ACTIVE[:] = [dist.group.WORLD, self.world]
        return self


# (default group, world layout) of the active re-form; empty when none is.
_ACTIVE: list[Any] = []


def active_world(world_size: int) -> MeshLayout | None:
    """The world of the active :class:`Reform` when it is over ``world_size`` ranks and its default
    group is still the current one, else None (the plain world). What rankmesh's builders read
    where they would otherwise lay a mesh over ``MeshLayout.world(world_size)``."""
    if not _ACTIVE:
        return None
    import torch.distributed as dist

    group, world = _ACTIVE
    if dist.group.WORLD is not group:  # the job re-initialised (or ended): the re-form is over
        _ACTIVE.clear()
        return None
    return world if world.world_size == world_size else None


def deactivate() -> None:
    """Lay meshes over the plain world again."""
    _ACTIVE.clear()


def _ranks(values: Iterable[Any], name: str, world: int) -> list[int]:
    try:
        items = list(values)
    except TypeError:
        raise ReformError(
            f"{name} must be a sequence of ranks, got {type(values).__name__}", field=name, value=values
        ) from None
    out: list[int] = []
    for k, v in enumerate(items):
        try:
            r = as_int(v, f"{name}[{k}]")
        except RankmeshError as e:
            raise ReformError(str(e), field=f"{name}[{k}]", value=v) from None
        if not 0 <= r < world:
            raise ReformError(
                f"{name}[{k}] = {r} is not a rank of the old job of {world} ranks (0..{world - 1})",
                field=f"{name}[{k}]",
                value=v,
            )
        if r in out:
            raise ReformError(f"{name} lists rank {r} twice", field=name, value=tuple(items))
        out.append(r)
    return out


def hot_spare(
    old_world_size: int,
    *,
    failed: Sequence[int],
    mesh_size: int | None = None,
    spares: Sequence[int] | None = None,
    renumber: str = "fill",
) -> Reform:
    """The job after spares take the failed ranks' places; the sizes of every mesh stay.

    Before the failure, the meshes were over ranks ``0 .. mesh_size - 1`` of a job of
    ``old_world_size`` ranks (the rest, ``mesh_size ..``, are spares; ``mesh_size`` defaults to
    ``old_world_size - len(failed)``, every spare used). Each failed rank's index goes to one spare,
    in order (``spares``, default the lowest spare ranks). Spares left unused leave the new job
    too (its ranks are exactly the meshes' ranks). ``renumber``: ``"fill"`` (default) gives each
    spare the number of the rank it replaces and every other rank keeps its own (the plain world:
    every group as at the first start); ``"shift"`` renumbers the survivors in order, as torch's
    ``shrink_group`` does, and the new world stores only what changed.

    Refused (:class:`~rankmesh.errors.ReformError`): a failed rank or spare outside the old job,
    listed twice, a failed spare, a spare inside the mesh, more failed mesh ranks than spares.

        >>> plan = hot_spare(10, failed=[2, 9], mesh_size=8)   # spare 9 failed too; spare 8 is used
        >>> plan.world_size, plan.removed, plan.new_rank(8)
        (8, (2, 9), 2)
    """
    old = as_int(old_world_size, "old_world_size")
    if old < 1:
        raise ReformError(f"old_world_size must be >= 1, got {old}", field="old_world_size", value=old_world_size)
    gone = _ranks(failed, "failed", old)
    if not gone:
        raise ReformError("failed lists no rank; nothing to re-form", field="failed", value=tuple(failed))
    size = old - len(gone) if mesh_size is None else as_int(mesh_size, "mesh_size")
    if not 1 <= size <= old:
        raise ReformError(
            f"mesh_size = {size} must be between 1 and old_world_size = {old}", field="mesh_size", value=mesh_size
        )
    in_mesh = [r for r in gone if r < size]
    pool = _live_spares(spares, gone, size, old)
    if len(pool) < len(in_mesh):
        raise ReformError(
            f"{len(in_mesh)} ranks of the mesh failed ({in_mesh}) but only {len(pool)} spares are alive ({pool}); "
            "add spares, or shrink the replica dim instead (rankmesh.recovery.shrink)",
            field="failed",
            value=tuple(failed),
            kind="no_spare_left",
            ctx={"failed": tuple(in_mesh), "spares": tuple(pool)},
        )
    if renumber not in ("fill", "shift"):
        raise ReformError(f'renumber must be "fill" or "shift", got {renumber!r}', field="renumber", value=renumber)
    used = dict(zip(in_mesh, pool))
    removed = sorted(set(gone) | {r for r in range(size, old) if r not in used.values()})
    if renumber == "fill":
        return Reform(
            old_world_size=old,
            world_size=size,
            world=MeshLayout.world(size),
            removed=tuple(removed),
            _dropped=_filled_rank(used, removed, size),
        )
    try:
        world = MeshLayout.renumbered(old, size, removed, used)
    except RankmeshError as e:  # a backstop: what is checked above should leave nothing here
        raise ReformError(str(e), field=e.field, value=e.value) from None
    return Reform(old_world_size=old, world_size=size, world=world, removed=tuple(removed))


def _live_spares(spares: Sequence[int] | None, gone: list[int], size: int, old: int) -> list[int]:
    """The spares that take failed ranks' places, in order: ``spares``, or by default every rank
    past the mesh that did not fail; :class:`~rankmesh.errors.ReformError` for a given spare inside
    the mesh or failed."""
    if spares is None:
        return [r for r in range(size, old) if r not in gone]
    pool = _ranks(spares, "spares", old)
    inside = [r for r in pool if r < size]
    if inside:
        raise ReformError(
            f"spares {inside} are ranks of the mesh (0..{size - 1}); a spare is a rank from {size} on",
            field="spares",
            value=tuple(spares),
        )
    dead = [r for r in pool if r in gone]
    if dead:
        raise ReformError(f"spares {dead} failed too; leave them out", field="spares", value=tuple(spares))
    return pool


def _filled_rank(used: dict[int, int], removed: list[int], size: int) -> Callable[[int], int | None]:
    """``new_rank`` of a ``"fill"`` hot spare: each spare in ``used`` (failed index -> spare) takes
    its index's number, every other rank of the mesh keeps its own, the ``removed`` ranks and those
    past the mesh leave (None)."""
    moved = {spare: index for index, spare in used.items()}  # each spare takes its index's number
    left = frozenset(removed)

    def new_rank(r: int) -> int | None:
        if r in moved:
            return moved[r]
        return None if r in left or r >= size else r

    return new_rank


def shrink(
    sizes: Mapping[str, int],
    *,
    failed: Sequence[int],
    dim: str = "dp_replicate",
    old_world_size: int | None = None,
) -> Reform:
    """The job after every replica along ``dim`` that lost a rank leaves; every other dim keeps its
    size, and the survivors are renumbered in order.

    ``sizes`` are the mesh's dims in mesh order (outermost first, as ``init_device_mesh`` takes
    them) over ranks ``0 .. prod(sizes) - 1`` of a job of ``old_world_size`` ranks (default: just
    those; ranks beyond them leave the new job). ``dim`` is the replica dim: torchtitan's
    ``dp_replicate``, or ``dp`` for a Megatron job (laid out as ``(pp, dp, cp, tp)``-like sizes).
    The new world is the plain world of the new size: dropping indices along one dim and
    renumbering in order keeps every other rank's place.

    Refused (:class:`~rankmesh.errors.ReformError`): an unknown dim, a failed rank outside the job,
    a replica dim of size 1, or failures in every replica (nothing would be left)::

        >>> shrink({"dp_replicate": 1, "tp": 4}, failed=[1])
        Traceback (most recent call last):
        ...
        rankmesh.errors.ReformError: dim 'dp_replicate' has size 1: there is no other replica to keep; ...
    """
    names, shape = _replica_shape(sizes, dim)
    numel = 1
    for s in shape:
        numel *= s
    old = numel if old_world_size is None else as_int(old_world_size, "old_world_size")
    if old < numel:
        raise ReformError(
            f"old_world_size = {old} is smaller than the mesh's {numel} ranks", field="old_world_size", value=old
        )
    gone = _ranks(failed, "failed", old)
    d = names.index(dim)
    inner = 1
    for s in shape[d + 1 :]:
        inner *= s
    size = shape[d]
    lost = _lost_replicas(gone, numel, inner, size, dim, failed)
    new_sizes = dict(zip(names, shape))
    new_sizes[dim] = size - len(lost)
    new_numel = numel // size * new_sizes[dim]
    removed = tuple(sorted(set(gone) | {r for r in range(numel, old)}))  # O(changes); dropped replicas by rule
    return Reform(
        old_world_size=old,
        world_size=new_numel,
        world=MeshLayout.world(new_numel),
        removed=removed,
        sizes=new_sizes,
        _dropped=_shrunk_rank(numel, inner, size, lost, new_sizes, dim),
    )


def _replica_shape(sizes: Mapping[str, int], dim: str) -> tuple[list[str], list[int]]:
    """The mesh's dim names and sizes, in mesh order; :class:`~rankmesh.errors.ReformError` when
    ``dim`` is not one of them or a size is below 1."""
    names = list(sizes)
    if dim not in names:
        raise ReformError(
            f"dim {dim!r} is not one of the mesh's dims {names}; name the replica dim", field="dim", value=dim
        )
    shape = [as_int(sizes[n], f"sizes[{n!r}]") for n in names]
    if any(s < 1 for s in shape):
        raise ReformError(f"sizes must be >= 1, got {dict(sizes)}", field="sizes", value=dict(sizes))
    return names, shape


def _lost_replicas(gone: list[int], numel: int, inner: int, size: int, dim: str, failed: Sequence[int]) -> list[int]:
    """The indices along ``dim`` (``size`` replicas, each ``inner`` ranks apart) of the replicas
    that lost a rank of the mesh, sorted; :class:`~rankmesh.errors.ReformError` when no replica
    would be left."""
    lost = sorted({(r // inner) % size for r in gone if r < numel})
    if size == 1 and lost:
        raise ReformError(
            f"dim {dim!r} has size 1: there is no other replica to keep; use a hot spare "
            "(rankmesh.recovery.hot_spare) or restart the job",
            field="dim",
            value=dim,
            kind="no_replica_left",
            ctx={"dim": dim, "size": size, "failed_replicas": tuple(lost)},
        )
    if len(lost) == size:
        raise ReformError(
            f"every replica along {dim!r} ({size}) lost a rank; nothing would be left. Use hot spares "
            "(rankmesh.recovery.hot_spare) or restart the job",
            field="failed",
            value=tuple(failed),
            kind="no_replica_left",
            ctx={"dim": dim, "size": size, "failed_replicas": tuple(lost)},
        )
    return lost


def _shrunk_rank(
    numel: int, inner: int, size: int, lost: list[int], new_sizes: dict[str, int], dim: str
) -> Callable[[int], int | None]:
    """``new_rank`` of a shrink: ranks past the mesh's ``numel`` and those in a ``lost`` replica
    leave (None); the others close up in order, ``new_sizes[dim]`` replicas along ``dim`` instead
    of ``size``."""

    def new_rank(r: int) -> int | None:
        if r >= numel:
            return None
        replica = (r // inner) % size
        k = bisect.bisect_left(lost, replica)
        if k < len(lost) and lost[k] == replica:
            return None
        outer = r // (inner * size)
        return (outer * new_sizes[dim] + replica - k) * inner + r % inner

    return new_rank
