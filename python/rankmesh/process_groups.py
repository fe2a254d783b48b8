"""This rank's process groups, from rankmesh layouts (the layer below the meshes).

A rank needs only its own group in each mesh dimension, so :class:`MeshBuilder` asks the layout
for exactly that group (O(group size)) and creates it with the strategy that cannot hang and
scales (see docs/design.md, "Process groups"):

- default group bound to a device (NCCL eager init): ``split_group(default, [my_group])``; every
  rank of the world makes one such call per distinct partition;
- otherwise (gloo, lazy NCCL): ``new_group(my_group, use_local_synchronization=True)``; only the
  members take part;
- size-1 dims and dims asked to be fake: a group on the ``fake`` backend (no communication; for
  one rank every collective is the identity, so it is also correct);
- a dim spanning the whole world: the default group itself, as torch does;
- one process group per distinct (rank partition, backend, dim name), created in the same order
  on every rank (torch's hashed group names count the groups created before, so members only
  agree on a name if they agree on the order).

The builder knows nothing of ``DeviceMesh``: :meth:`rankmesh.mesh.FastDeviceMesh.from_layout`
makes meshes over its groups. Example, as on every rank of an 8-rank gloo job (after
``dist.init_process_group("gloo")``); here one process plays rank 5 of the job on torch's
``fake`` backend, which needs no peers::

    >>> import torch.distributed as dist
    >>> from torch.testing._internal.distributed.fake_pg import FakeStore
    >>> dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=8)
    >>> world = MeshLayout.world(8)
    >>> mesh = world.unflatten("world", (2, 2, 2), ("dp_replicate", "dp_shard", "tp"))
    >>> builder = MeshBuilder(world, device_type="cpu")
    >>> dist.get_process_group_ranks(builder.process_group(mesh, "tp"))  # rank 5's tp group
    [4, 5]
    >>> dist.get_process_group_ranks(builder.process_group(mesh, "dp_shard"))
    [5, 7]
    >>> builder.report().created  # one group per dim asked for
    2
    >>> dist.destroy_process_group()

On ranks 4 and 5 the tp group is ``[4, 5]``, on ranks 6 and 7 ``[6, 7]``: each rank creates
only its own, and a layout of another world raises ``MeshArgumentError``.
"""

from __future__ import annotations

import contextlib
import datetime
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rankmesh._check import as_bool, as_int, as_layout, as_rank, as_sequence, as_timeout, check_str, type_name
from rankmesh._fast_groups import (
    ensure_backend_registered,
    new_member_group,
    options_timeout,
    register_fake_backend,
    split_member_group,
    split_non_member,
)
from rankmesh._groups import DEFAULT, FAKE, extend_key, group_key, is_fake, serves_default
from rankmesh._native import MeshLayout, Slice
from rankmesh.errors import (
    ArgumentTypeError,
    DistributedStateError,
    MeshArgumentError,
)

__all__ = [
    "BuildReport",
    "MeshBuilder",
    "check_backend_name",
    "group_is",
    "group_slice",
    "require_default_group",
]

_NOT_YET = object()  # MeshBuilder._existing: no group for this key yet

# group name -> (the group, its ranks as a Slice): the sorted ranks of groups rankmesh created over
# a world in rank order are ``offset + (size, stride) modes`` (outermost first), known without
# reading them. A weak reference to the group itself is kept so that a name torch reuses after
# destroy_process_group is never taken for another group's, and a destroyed group is freed (a
# live gloo group keeps its sockets and threads; an NCCL one its communicator).
_SLICES: dict[str, tuple[Any, Slice]] = {}


def group_slice(pg: Any) -> Slice | None:
    """A process group's sorted ranks as a :class:`~rankmesh.Slice` (``offset + sum(digit_k *
    stride_k)``) when rankmesh created it from a layout, in O(1); None for any other group (read
    its ranks: ``dist.get_process_group_ranks``)."""
    entry = _SLICES.get(getattr(pg, "group_name", None) or "")
    if entry is None or entry[0]() is not pg:
        return None
    return entry[1]


def group_is(pg: Any, ranks: Slice) -> bool:
    """Whether ``pg``'s ranks, in the group's order, are exactly ``ranks`` in increasing order
    (e.g. ``layout.group_slice(rank, dim)``): O(1) for a group rankmesh made from a layout and for
    the default group (every rank in order, which rankmesh hands out for a dim that spans the
    job), O(group) otherwise."""
    if pg is dist.group.WORLD:
        return ranks == Slice.of_range(range(pg.size()))
    known = group_slice(pg)
    if known is not None:
        return known == ranks
    return dist.get_process_group_ranks(pg) == ranks.ranks().tolist()


@dataclass(frozen=True)
class BuildReport:
    """What a :class:`MeshBuilder` did on this rank (the same numbers on every rank, except
    where :meth:`MeshBuilder.subset_group` leaves a rank out of every group).

    Attributes:
        backend: the default group's backend (what real groups use), e.g. ``"nccl"``.
        method: how real subgroups are made: ``"split_group"`` or ``"new_group"``.
        real: process groups created on the default backend.
        fake: process groups created on the ``fake`` backend: size-1 and overridden dims, and
            the one-rank placeholders a rank outside every group of a
            :meth:`MeshBuilder.subset_group` registers to keep torch's group names in step.
        reused_default: dims served by the default (world) group, nothing created.
        shared: dims served by a group created earlier for the same partition.
        dims: dims served in all (``real + fake + reused_default + shared``).
        groups: ``(dim name, backend, group size)`` of every group created, in creation order.
    """

    backend: str
    method: str
    real: int = 0
    fake: int = 0
    reused_default: int = 0
    shared: int = 0
    dims: int = 0
    groups: tuple[tuple[str, str, int], ...] = ()

    @property
    def created(self) -> int:
        """Process groups created in all."""
        return self.real + self.fake

    @property
    def by_backend(self) -> dict[str, int]:
        """Process groups created, by backend name (the default backend's and ``"fake"``)."""
        out: dict[str, int] = {}
        for _, backend, _ in self.groups:
            out[backend] = out.get(backend, 0) + 1
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "method": self.method,
            "created": self.created,
            "real": self.real,
            "fake": self.fake,
            "reused_default": self.reused_default,
            "shared": self.shared,
            "dims": self.dims,
            "by_backend": self.by_backend,
        }

    def __str__(self) -> str:
        def n(k: int, one: str, many: str) -> str:
            return f"{k} {one if k == 1 else many}"

        return (
            f"{n(self.created, 'process group', 'process groups')} created ({self.real} on the default "
            f"backend {self.backend!r} via {self.method}, {self.fake} fake for size-1 or overridden dims) "
            f"for {n(self.dims, 'mesh dim', 'mesh dims')}; "
            f"{n(self.reused_default, 'dim reuses', 'dims reuse')} the default group, "
            f"{n(self.shared, 'dim shares', 'dims share')} a group created earlier"
        )


@dataclass
class _Counters:
    real: int = 0
    fake: int = 0
    reused_default: int = 0
    shared: int = 0
    dims: int = 0
    groups: list[tuple[str, str, int]] = field(default_factory=list)


class MeshBuilder:
    """Creates this rank's process groups for layouts of one world (``DeviceMesh`` objects over
    them: :meth:`rankmesh.mesh.FastDeviceMesh.from_layout`).

    Args:
        world: the world layout (``MeshLayout.world(W, rank_map)``) every layout passed later
            derives from.
        device_type: the ``DeviceMesh`` device type, e.g. ``"cuda"`` or ``"cpu"``.
        rank: this process's global rank; defaults to (and must equal) ``dist.get_rank()``.
        size_one_fake: serve size-1 dims with ``fake``-backend groups (the default; they never
            communicate). ``False`` follows torch: a one-rank group on the dim's backend.

    The default process group must be initialised, with ``world.world_size`` ranks. Use one
    builder for every mesh of a job so that partitions shared between meshes get one group.
    Every rank must make the same sequence of calls (SPMD): the groups are created in call order.
    """

    def __init__(
        self, world: MeshLayout, *, device_type: str = "cpu", rank: int | None = None, size_one_fake: bool = True
    ) -> None:
        as_layout(world, "world")
        check_str(device_type, "device_type")
        size_one_fake = as_bool(size_one_fake, "size_one_fake")
        if rank is not None:
            rank = as_int(rank, "rank")
        require_default_group("building meshes")
        world_size = dist.get_world_size()
        if world_size != world.world_size:
            raise DistributedStateError(
                f"the default process group has {world_size} ranks but the layout's world has "
                f"{world.world_size}; build the layout with MeshLayout.world(dist.get_world_size())",
                field="world_size",
                value=world.world_size,
            )
        my_rank = dist.get_rank()
        if rank is not None and rank != my_rank:
            raise DistributedStateError(
                f"rank = {rank} but this process is rank {my_rank} of the default group; groups "
                "can only be created for the calling process, so leave rank unset",
                field="rank",
                value=rank,
            )
        self._world = world
        self._device_type = device_type
        self._size_one_fake = size_one_fake
        self._rank = my_rank
        self._world_size = world_size
        self._default = dist.group.WORLD
        self._in_rank_order = world.in_rank_order
        self._root = world.world_layout()  # what every layout of this world derives from
        self._backend = str(dist.get_backend(self._default))
        self._split = getattr(self._default, "bound_device_id", None) is not None
        self._gloo_with_cuda = self._backend == "gloo" and torch.cuda.is_available()
        self._keepalive: list[Any] = []
        self._groups: dict[tuple[Any, ...], dist.ProcessGroup | None] = {}  # by rankmesh._groups.group_key
        # this rank's sorted members per (partition, placement): see process_group
        self._sorted_members: dict[tuple[Any, ...], np.ndarray] = {}
        self._layer_state: dict[str, Any] = {}  # state the layers above keep per builder: layer_state()
        self._known: set[MeshLayout] = set()
        self._counters = _Counters()
        self._fake_ready = False

    # -- properties ------------------------------------------------------------------------

    @property
    def world(self) -> MeshLayout:
        return self._world

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def method(self) -> str:
        """How real subgroups are made here: ``"split_group"`` (default group bound to a device)
        or ``"new_group"``."""
        return "split_group" if self._split else "new_group"

    # -- process groups --------------------------------------------------------------------

    def process_group(
        self,
        layout: MeshLayout,
        dim: int | str,
        *,
        fake: bool = False,
        backend: str | None = None,
        pg_options: Any = None,
        timeout: datetime.timedelta | None = None,
        group_desc: str | None = None,
        tag: str | None = None,
        mesh_dim_name: str | None = None,
    ) -> dist.ProcessGroup | None:
        """This rank's process group in ``dim`` of ``layout``; None when ``layout`` is over part of
        the job (``MeshLayout.placed``) and this rank is not one of its ranks (it still takes the
        members' steps, so every rank must make the call).

        ``fake=True`` (or a dim of size 1, unless the builder has ``size_one_fake=False``) gives
        a group on the ``fake`` backend, which never communicates, without options. ``backend`` /
        ``pg_options`` override the backend as torch's ``backend_override`` does; with
        ``backend="fake"`` the options (``FakeProcessGroup.Options``) and timeout are kept, as
        torch keeps them. A world-sized dim without an override gives the default group.
        Otherwise the group is created once per distinct partition of the world (keyed on the
        dim's modes, backend, options, ``timeout`` and ``tag``) and shared by every later dim with
        the same key. A ``tag`` asks for a communicator of its own even when another dim has the
        same partition; ``group_desc`` names a new group (default ``mesh_<dim name>``).
        ``timeout`` is a ``datetime.timedelta`` or seconds (see :func:`rankmesh._check.as_timeout`).
        ``mesh_dim_name``: the dim belongs to a ``DeviceMesh`` under that name, and shares its group
        only with dims of the same name (FSDP2 needs distinct groups for distinct meshes; see
        :mod:`rankmesh._groups`).
        """
        self._check_layout(layout)
        if not isinstance(dim, str):
            dim = as_int(dim, "dim")
        size = int(layout.size(dim))  # raises DimOutOfRangeError / UnknownNameError
        name = layout.names[dim] if isinstance(dim, int) else dim
        fake = as_bool(fake, "fake")
        check_str(mesh_dim_name, "mesh_dim_name", optional=True)
        backend, timeout = _check_group_args(backend, timeout, group_desc, tag)
        c = self._counters
        c.dims += 1
        key = group_key(
            layout,
            dim,
            world_size=self._world_size,
            fake=fake,
            backend=backend,
            options_id=None if pg_options is None else id(pg_options),
            size_one_fake=self._size_one_fake,
            timeout=timeout,
            tag=tag,
            mesh_dim_name=mesh_dim_name,
        )
        if is_fake(key) and backend != FAKE:
            # fake by rankmesh's rule (``fake=True``, size 1): no options meant for another backend.
            # A ``fake`` override's options and timeout reach the group as torch passes them.
            backend, pg_options, timeout = FAKE, None, None
        pg = self._existing(key)
        if pg is not _NOT_YET:
            return pg
        if not layout.is_member(self._rank):
            # A mesh over part of the job that leaves this rank out: no group here, but the same
            # steps as the members (torch's group names and the split need them), see _create.
            return self._create(key, None, str(name), backend, pg_options, timeout, group_desc or f"mesh_{name}")
        # Dims with the same partition (a flatten of one dim under several names, e.g. accelerate's
        # dp, dp_shard_cp and dp_cp) have the same members here: read and sort them once, and hand
        # the same array on, so its list and torch's rank table are made once too (_fast_groups).
        placement = layout.placement  # (offset, [(size, stride), ...]) or None: made hashable
        members_key = (key[0], None if placement is None else (placement[0], tuple(map(tuple, placement[1]))))
        ranks = self._sorted_members.get(members_key)
        if ranks is None:
            ranks = layout.group(self._rank, dim)
            if len(ranks) > 1 and not bool((ranks[1:] > ranks[:-1]).all()):
                ranks = np.sort(ranks)
            self._sorted_members[members_key] = ranks
        if group_desc is None:
            group_desc = "mesh_default" if size == self._world_size and backend is None else f"mesh_{name}"
        pg = self._create(key, ranks, str(name), backend, pg_options, timeout, group_desc)
        assert pg is not None
        if self._in_rank_order and layout.placement is None and size > 1:
            _SLICES[pg.group_name] = (weakref.ref(pg), layout.group_slice(self._rank, dim))
        return pg

    def subset_group(
        self,
        partition: Any,
        members: Sequence[int] | None,
        *,
        name: str,
        backend: str | None = None,
        pg_options: Any = None,
        timeout: datetime.timedelta | None = None,
        group_desc: str | None = None,
        tag: str | None = None,
    ) -> dist.ProcessGroup | None:
        """This rank's group in a partition that no layout of the world describes: disjoint
        groups that may leave some ranks out (Megatron's embedding groups) or that are not
        strided (a hand-made split).

        ``partition`` is any hashable that names the partition the same way on every rank;
        ``members`` is the caller's group (global ranks, including the caller) or ``None`` when
        the caller is in none of its groups. Every rank must make the same calls in the same
        order, members or not: on the ``split_group`` path non-members take part in the split (as
        NCCL requires) and get ``None``; on the ``new_group`` path only members create the group,
        and the others register a one-rank ``fake`` placeholder so that torch's group names stay
        in step on every rank.
        A second call with the same partition and key arguments returns the first group. A group
        of the whole world without overrides or tag is the default group; a one-rank group is a
        real group on its backend (never ``fake``: on the split path every rank must split).

        Example: Megatron's embedding groups with pp = 4 over 8 ranks (pipelines ``[0, 2, 4, 6]``
        and ``[1, 3, 5, 7]``; the first and last stage of each hold the embedding). On ranks 0
        and 6 this returns the group ``[0, 6]``, on ranks 1 and 7 the group ``[1, 7]``; ranks
        2-5 pass ``None`` and get ``None`` (they still make the call). Here one process plays
        rank 6, then rank 3, on the ``fake`` backend::

            >>> import torch.distributed as dist
            >>> from torch.testing._internal.distributed.fake_pg import FakeStore
            >>> dist.init_process_group("fake", store=FakeStore(), rank=6, world_size=8)
            >>> builder = MeshBuilder(MeshLayout.world(8))
            >>> dist.get_process_group_ranks(builder.subset_group("embd", [0, 6], name="embd"))
            [0, 6]
            >>> dist.destroy_process_group()
            >>> dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=8)
            >>> builder = MeshBuilder(MeshLayout.world(8))
            >>> builder.subset_group("embd", None, name="embd") is None  # rank 3 holds no embedding
            True
            >>> builder.subset_group("embd", [0, 6], name="embd")  # a group without the caller
            Traceback (most recent call last):
                ...
            rankmesh.errors.DistributedStateError: members of 'embd' must include this rank (3), got [0, 6]; ...
            >>> dist.destroy_process_group()
        """
        check_str(name, "name")
        try:
            hash(partition)
        except TypeError:
            raise ArgumentTypeError(
                f"partition must be hashable (e.g. a str or a tuple), got {type_name(partition)} {partition!r}",
                field="partition",
                value=partition,
            ) from None
        backend, timeout = _check_group_args(backend, timeout, group_desc, tag)
        ranks = None if members is None else np.asarray(self._members(members, name), dtype=np.int32)
        self._counters.dims += 1
        options_id = None if pg_options is None else id(pg_options)
        key = extend_key((("subset", partition), backend, options_id), timeout, tag)
        if ranks is not None:
            if serves_default(len(ranks), self._world_size, backend=backend, options_id=options_id, tag=tag):
                key = DEFAULT  # every rank is a member, so every rank takes this branch
        pg = self._existing(key)
        if pg is not _NOT_YET:
            return pg
        return self._create(key, ranks, name, backend, pg_options, timeout, group_desc or f"mesh_{name}")

    def layer_state(self, layer: str, make: Callable[[], Any]) -> Any:
        """The state a layer above keeps for this builder (made by ``make()`` on first use), e.g.
        the world that every ``DeviceMesh`` :mod:`rankmesh.mesh` makes over this builder's groups
        shares. The builder itself never reads it."""
        state = self._layer_state.get(layer)
        if state is None:
            state = self._layer_state[layer] = make()
        return state

    def report(self) -> BuildReport:
        """Process groups created so far, by backend, and how many dims reused one."""
        c = self._counters
        return BuildReport(
            backend=self._backend,
            method=self.method,
            real=c.real,
            fake=c.fake,
            reused_default=c.reused_default,
            shared=c.shared,
            dims=c.dims,
            groups=tuple(c.groups),
        )

    def __repr__(self) -> str:
        return (
            f"MeshBuilder(world_size={self._world_size}, rank={self._rank}, "
            f"device_type={self._device_type!r}, method={self.method!r}, groups={len(self._groups)})"
        )

    # -- helpers ---------------------------------------------------------------------------

    def _existing(self, key: tuple[Any, ...]) -> Any:
        """The default group for :data:`DEFAULT`, or the group already made for ``key`` (None
        where this rank is in none of a subset's groups); ``_NOT_YET`` when it must be made."""
        c = self._counters
        if key == DEFAULT and not self._gloo_with_cuda:
            c.reused_default += 1
            return self._default
        # (torch's special case: CUDA present and a gloo default group -> one W-rank group.)
        if key in self._groups:
            c.shared += 1
            return self._groups[key]
        return _NOT_YET

    def _create(
        self,
        key: tuple[Any, ...],
        ranks: np.ndarray | None,
        name: str,
        backend: str | None,
        pg_options: Any,
        timeout: datetime.timedelta | None,
        desc: str,
    ) -> dist.ProcessGroup | None:
        """Creates (and records under ``key``) the group of ``ranks`` (sorted int32, holding this
        rank); ``None`` means this rank is in none of the partition's groups, which only the split
        path has to take part in. Groups come from :mod:`rankmesh._fast_groups`
        (``new_member_group``, ``split_member_group``, ``split_non_member``: torch's
        ``new_group`` / ``split_group`` without their per-member Python where the start-up checks
        allow it)."""
        c = self._counters
        if timeout is None:
            timeout = options_timeout(pg_options)
        split = self._split and backend != FAKE and (backend is None or backend == self._backend)
        if ranks is None:
            # This rank is in none of the partition's groups. torch names hashed groups with a
            # per-rank counter (2.15: every group name drawn; 2.13: groups registered), so it
            # must take the same steps as the members or every later group gets a different
            # name here than on them (a rendezvous that never meets). On the split path it takes
            # part in the split (NOCOLOR: NCCL needs every rank of the parent); where that draws
            # no name, and on the new_group path, it registers a one-rank ``fake`` placeholder.
            placeholder = True
            if split:
                other = (self._rank + 1) % self._world_size
                placeholder = not split_non_member(other, group_desc=desc, timeout=timeout, pg_options=pg_options)
            if placeholder:
                self._ensure_fake_backend()
                me = np.asarray([self._rank], dtype=np.int32)
                new_member_group(me, backend=FAKE, group_desc=f"{desc}_placeholder")
                c.fake += 1
                c.groups.append((str(name), "placeholder", 1))
            self._groups[key] = None
            return None
        if backend == FAKE:
            self._ensure_fake_backend()
            pg = new_member_group(ranks, backend=FAKE, group_desc=desc, timeout=timeout, pg_options=pg_options)
            c.fake += 1
            label = FAKE
        elif split:
            pg = split_member_group(ranks, group_desc=desc, timeout=timeout, pg_options=pg_options)
            c.real += 1
            label = self._backend
        else:
            pg = new_member_group(ranks, backend=backend, group_desc=desc, timeout=timeout, pg_options=pg_options)
            c.real += 1
            label = backend or self._backend
        if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER:  # pragma: no cover - torch bug
            raise DistributedStateError(
                f"torch returned no process group for rank {self._rank} in {name!r} "
                f"(ranks {ranks[:8].tolist()}{'...' if len(ranks) > 8 else ''})",
                field="dim",
                value=name,
            )
        self._groups[key] = pg
        if pg_options is not None:
            self._keepalive.append(pg_options)  # id() in the key must stay unique
        c.groups.append((str(name), str(label), len(ranks)))
        return pg

    def _members(self, members: Any, name: str) -> list[int]:
        """``members`` of a subset group: distinct ranks of the world, this rank among them; sorted."""
        given = as_sequence(members, "members", "ranks (or None)", label=f"members of {name!r}")
        ranks = sorted(as_rank(r, self._world_size, f"members[{i}]") for i, r in enumerate(given))
        for a, b in zip(ranks, ranks[1:]):
            if a == b:
                raise DistributedStateError(
                    f"members of {name!r} list rank {a} twice; give each rank of the group once",
                    field="members",
                    value=members,
                )
        if self._rank not in ranks:
            raise DistributedStateError(
                f"members of {name!r} must include this rank ({self._rank}), got "
                f"{ranks[:8]}{'...' if len(ranks) > 8 else ''}; pass this rank's own group, or None "
                "when this rank is in none of the partition's groups",
                field="members",
                value=members,
            )
        return ranks

    def _check_layout(self, layout: MeshLayout) -> None:
        if isinstance(layout, MeshLayout) and layout in self._known:
            return
        as_layout(layout, "layout")
        same = layout.world_size == self._world.world_size
        if layout.placement is not None:  # over part of the job: ranks of the default group
            same = layout.global_size == self._world_size
        elif same:  # the same world: O(1) when shared, else one rank-map comparison in Rust
            same = layout.world_layout() == self._root
        if not same:
            raise DistributedStateError(
                f"the layout {layout!r} is not over this builder's world "
                f"(world_size={self._world.world_size}, "
                f"rank_map={'identity' if self._world.in_rank_order else 'a permutation'}); "
                "derive every layout from the world given to MeshBuilder",
                field="layout",
                value=layout,
            )
        self._known.add(layout)

    def _ensure_fake_backend(self) -> None:
        if not self._fake_ready:
            register_fake_backend()
            self._fake_ready = True


def require_default_group(what: str) -> None:
    """Raises :class:`DistributedStateError` unless torch.distributed's default group exists."""
    if not dist.is_available() or not dist.is_initialized():
        raise DistributedStateError(
            "torch.distributed's default process group is not initialised; call "
            f"torch.distributed.init_process_group(...) (torchrun sets the environment) before {what}",
            field="default_group",
            value=None,
        )


def check_backend_name(name: str | None, field: str) -> None:
    """A single backend name (``"gloo"``, ``"nccl"``, ``"fake"``, a registered plugin) must be one
    torch.distributed knows, or group creation fails later with torch's bare ``AssertionError``.
    ``None`` and the ``"device:backend,..."`` form are left to torch."""
    if name is None or ":" in name or name == FAKE or name.lower() in dist.Backend.backend_list:
        return
    with contextlib.suppress(Exception):  # plugins registered through entry points (torch >= 2.14)
        ensure_backend_registered(name)
    if name.lower() in dist.Backend.backend_list:
        return
    raise MeshArgumentError(
        f"{field} {name!r} is not a torch.distributed backend (known: {', '.join(dist.Backend.backend_list)}); "
        "fix the name, or register the backend with torch.distributed.Backend.register_backend first",
        field=field,
        value=name,
    )


def _check_group_args(
    backend: Any, timeout: Any, group_desc: Any, tag: Any
) -> tuple[str | None, datetime.timedelta | None]:
    """The optional arguments of a process group: ``backend``, ``group_desc`` and ``tag`` are
    str or None; ``timeout`` None, seconds or a timedelta (returned as a timedelta)."""
    check_str(backend, "backend", optional=True)
    check_backend_name(backend, "backend")
    check_str(group_desc, "group_desc", optional=True)
    check_str(tag, "tag", optional=True)
    return backend, None if timeout is None else as_timeout(timeout, "timeout")
