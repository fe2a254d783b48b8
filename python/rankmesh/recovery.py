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

``plan.removed`` holds every rank that leaves, in O(changes) (a :class:`RankSet`; one piece for the
whole replica, however many ranks it has)::

    >>> plan.removed, list(plan.removed), 6 in plan.removed
    (RankSet(range(4, 8)), [4, 5, 6, 7], True)

Every refusal is a :class:`~rankmesh.errors.ReformError` naming the argument and the fix, raised
before any group is created.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankmesh._check import as_int
from rankmesh._native import MeshLayout, Slice
from rankmesh.errors import RankmeshError, ReformError

__all__ = ["Reform", "RankSet", "hot_spare", "shrink", "active_world", "deactivate"]


class RankSet:
    """An immutable set of ranks in ascending order, held as a few pieces rather than one entry per
    rank: each piece a ``range`` of consecutive ranks or, for ranks spread out at a fixed period
    (a replica of a dim with dims outside it), a :class:`rankmesh.Slice`. What
    :attr:`Reform.removed` is, so that a replica of 32,768 ranks that a shrink drops is one piece.
    ``len`` is O(1), ``in`` O(log pieces) (plus O(modes) per strided piece); iterating yields
    every rank in ascending order (O(len)). A set compares equal to another holding the same ranks
    and to a list or tuple of them in ascending order (O(len) unless the pieces match); it hashes
    as that tuple.

    ``RankSet(*pieces)``: ints, ``range`` objects (any positive step) and Slices; ranges that
    touch or overlap are joined, a Slice may not share a rank with another piece.

        >>> s = RankSet(range(65_536, 98_304), 9)
        >>> s, len(s), 70_001 in s, 98_304 in s, len(s.pieces)
        (RankSet(9, range(65536, 98304)), 32769, True, False, 2)
        >>> from rankmesh import Slice
        >>> every_4th_block = RankSet(Slice(8, [(2, 32), (8, 1)]))   # ranks 8-15 and 40-47
        >>> every_4th_block == [*range(8, 16), *range(40, 48)], 41 in every_4th_block
        (True, True)
        >>> RankSet(3, 2, 9) == (2, 3, 9), RankSet(3, 2, 9)
        (True, RankSet(range(2, 4), 9))
    """

    __slots__ = ("_ranges", "_starts", "_before", "_slices", "_pieces", "_len", "_hash")

    def __init__(self, *pieces: int | range | Slice) -> None:
        ranges: list[range] = []
        slices: list[Slice] = []
        for k, p in enumerate(pieces):
            field_name = f"pieces[{k}]"
            if isinstance(p, Slice):
                r = p.as_range()
                if r is not None and (len(r) == 1 or r.step == 1):
                    ranges.append(range(r[0], r[-1] + 1))
                else:
                    slices.append(p)
                continue
            if isinstance(p, range):
                if len(p) == 0:
                    continue
                if p.step < 0 or p[0] < 0:
                    raise ReformError(
                        f"{field_name} = {p!r} must hold ranks >= 0 in ascending order", field=field_name, value=p
                    )
                if p.step == 1 or len(p) == 1:
                    ranges.append(range(p[0], p[-1] + 1))
                else:
                    slices.append(Slice.of_range(p))
                continue
            try:
                r = as_int(p, field_name)
            except RankmeshError as e:
                raise ReformError(
                    f"{field_name} must be a rank, a range or a rankmesh.Slice, got {type(p).__name__} {p!r}",
                    field=field_name,
                    value=e.value,
                ) from None
            if r < 0:
                raise ReformError(f"{field_name} = {r} is not a rank (ranks are >= 0)", field=field_name, value=p)
            ranges.append(range(r, r + 1))
        joined: list[range] = []
        for r in sorted(ranges, key=lambda x: x.start):
            if joined and r.start <= joined[-1].stop:
                joined[-1] = range(joined[-1].start, max(joined[-1].stop, r.stop))
            else:
                joined.append(r)
        slices.sort(key=lambda s: s.offset)
        for i, s in enumerate(slices):
            others = [*slices[i + 1 :], *(Slice.of_range(r) for r in joined)]
            shared = next((x for x in (s.first_shared_rank(o) for o in others) if x is not None), None)
            if shared is not None:
                raise ReformError(
                    f"pieces overlap: {s!r} and another piece both hold rank {shared}; give each rank once",
                    field="pieces",
                    value=pieces,
                )
        self._ranges = tuple(joined)
        self._starts = [r.start for r in joined]
        self._before = list(itertools.accumulate((len(r) for r in joined), initial=0))  # ranks before range k
        self._slices = tuple(slices)
        self._pieces: tuple[range | Slice, ...] = tuple(
            sorted((*joined, *slices), key=lambda p: p.start if isinstance(p, range) else p.offset)
        )
        self._len = self._before[-1] + sum(len(s) for s in slices)
        self._hash: int | None = None

    @property
    def pieces(self) -> tuple[range | Slice, ...]:
        """The ranges (step 1) and strided Slices that hold the ranks, by first rank: what is stored."""
        return self._pieces

    def __len__(self) -> int:
        return self._len

    def __contains__(self, rank: object) -> bool:
        try:
            r = operator.index(rank)  # type: ignore[arg-type]
        except TypeError:
            return False
        k = bisect.bisect_right(self._starts, r) - 1
        if k >= 0 and r < self._ranges[k].stop:
            return True
        return r >= 0 and any(r in s for s in self._slices)

    def __iter__(self) -> Iterator[int]:
        if not self._slices:
            return itertools.chain.from_iterable(self._ranges)
        spread = (iter(sorted(s.ranks().tolist())) for s in self._slices)
        return heapq.merge(*self._ranges, *spread)

    def _count_below(self, rank: int) -> int:
        """How many of the ranks are below ``rank``: O(log pieces) for the ranges, O(size) for a
        strided piece."""
        k = bisect.bisect_right(self._starts, rank) - 1
        n = 0 if k < 0 else self._before[k] + min(rank, self._ranges[k].stop) - self._ranges[k].start
        return n + sum(bisect.bisect_left(sorted(s.ranks().tolist()), rank) for s in self._slices)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankSet):
            if self._pieces == other._pieces:
                return True
        elif not isinstance(other, (tuple, list)):
            return NotImplemented
        return len(other) == self._len and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        """``hash(tuple(self))``, as equal tuples hash (O(len) the first time)."""
        if self._hash is None:
            self._hash = hash(tuple(self))
        return self._hash

    def _key(self) -> tuple[tuple[int, ...], ...]:
        """The pieces as plain ints (``(start, stop)`` per range, ``(offset, size, stride, ...)`` per
        Slice): what pickles and what :attr:`Reform.fingerprint` covers."""
        return tuple(
            (p.start, p.stop) if isinstance(p, range) else (p.offset, *itertools.chain.from_iterable(p.modes))
            for p in self._pieces
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rank_set, (self._key(),))

    def __repr__(self) -> str:
        def shown(p: range | Slice) -> str:
            r = p if isinstance(p, range) else p.as_range()  # a Slice of one mode reads as its range
            if r is None:
                return repr(p)
            return str(r.start) if len(r) == 1 else repr(r)

        return f"RankSet({', '.join(shown(p) for p in self._pieces)})"


def _rank_set(key: tuple[tuple[int, ...], ...]) -> RankSet:
    """A :class:`RankSet` from its :meth:`RankSet._key` (unpickling)."""
    pieces: list[range | Slice] = []
    for part in key:
        if len(part) == 2:
            pieces.append(range(*part))
        else:
            pieces.append(Slice(part[0], list(zip(part[1::2], part[2::2]))))
    return RankSet(*pieces)


@dataclass(frozen=True)
class Reform:
    """The job after a failure, as every rank must see it.

    Attributes:
        world_size: ranks in the new job.
        world: the 1-D world layout the meshes are laid over (``MeshLayout.world``'s kind; a
            renumbered world after a hot spare, stored in O(changes)).
        removed: every old rank not in the new job, as a :class:`RankSet` (ascending, held in
            O(changes) pieces, so a dropped replica of 2^15 ranks is one piece): the failed ones,
            unused spares, the ranks of dropped replicas, the idle ranks past a shrunk mesh.
            Exactly the ranks whose :meth:`new_rank` is None. Given as a sequence of ranks, it is
            made a :class:`RankSet`.
        sizes: the mesh's dims and sizes after the change (for :func:`shrink`; None for a hot
            spare, where the sizes do not change).
    """

    old_world_size: int
    world_size: int
    world: MeshLayout
    removed: RankSet
    sizes: dict[str, int] | None = None
    _dropped: Any = field(default=None, repr=False, compare=False)
    # (mesh index, spare) of a "fill" hot spare: which spare takes which number (a "shift" world's
    # renumbering holds them); part of the fingerprint
    _spares: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.removed, RankSet):
            object.__setattr__(self, "removed", RankSet(*self.removed))

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
        if old in self.removed:
            return None
        return old - self.removed._count_below(old)

    @property
    def fingerprint(self) -> int:
        """64 bits every rank of the new job must agree on: the world layout's fingerprint (which
        covers a shifted world's renumbering), the sizes, the ranks that leave (:attr:`removed`'s
        pieces) and which spare takes which number. Plans that renumber any old rank differently
        differ here, whatever the world looks like."""
        import hashlib

        h = hashlib.blake2b(b"rankmesh.reform.v2", digest_size=8)
        h.update(self.world.fingerprint().to_bytes(8, "little"))
        key = (self.old_world_size, self.world_size, self.sizes, self.removed._key(), self._spares)
        h.update(repr(key).encode())
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
        (8, RankSet(2, 9), 2)
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
    removed = RankSet(*gone, *_idle(range(size, old), sorted(used.values())))  # the failed, the unused spares
    if renumber == "fill":
        return Reform(
            old_world_size=old,
            world_size=size,
            world=MeshLayout.world(size),
            removed=removed,
            _dropped=_filled_rank(used, removed, size),
            _spares=tuple(sorted(used.items())),
        )
    try:
        world = MeshLayout.renumbered(old, size, list(removed), used)
    except RankmeshError as e:  # a backstop: what is checked above should leave nothing here
        raise ReformError(str(e), field=e.field, value=e.value) from None
    return Reform(old_world_size=old, world_size=size, world=world, removed=removed)


def _idle(spares: range, used: list[int]) -> list[range]:
    """The ranks of ``spares`` that ``used`` (sorted) leaves out, as ranges: O(len(used))."""
    out, start = [], spares.start
    for r in used:
        out.append(range(start, r))
        start = r + 1
    out.append(range(start, spares.stop))
    return out


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


def _filled_rank(used: dict[int, int], removed: RankSet, size: int) -> Callable[[int], int | None]:
    """``new_rank`` of a ``"fill"`` hot spare: each spare in ``used`` (failed index -> spare) takes
    its index's number, every other rank of the mesh keeps its own, the ``removed`` ranks and those
    past the mesh leave (None)."""
    moved = {spare: index for index, spare in used.items()}  # each spare takes its index's number

    def new_rank(r: int) -> int | None:
        if r in moved:
            return moved[r]
        return None if r >= size or r in removed else r

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
    return Reform(
        old_world_size=old,
        world_size=new_numel,
        world=MeshLayout.world(new_numel),
        removed=RankSet(*_replica_ranks(numel, inner, size, lost), range(numel, old)),  # every failed rank too
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


def _replica_ranks(numel: int, inner: int, size: int, lost: list[int]) -> list[Slice]:
    """The ranks of the ``lost`` replicas (sorted indices along a dim of ``size`` replicas, each
    ``inner`` ranks apart, in a mesh of ``numel`` ranks): one Slice per run of adjacent indices,
    ``inner`` ranks at the same place in every block of ``inner * size``; O(len(lost))."""
    blocks = numel // (inner * size)
    runs: list[list[int]] = []
    for i in lost:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return [Slice(a * inner, [(blocks, inner * size), ((b - a) * inner, 1)]) for a, b in runs]


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
