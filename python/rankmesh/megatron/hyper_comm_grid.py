"""megatron-core's ``HyperCommGrid`` (``megatron/core/hyper_comm_grid.py``), whose ``create_pg``
makes only the caller's group. Exposed as :class:`rankmesh.megatron.HyperCommGrid`."""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from typing import Any

from rankmesh._check import as_int, check_degrees, check_str, check_unique, positive_int
from rankmesh._native import MeshLayout
from rankmesh.errors import (
    DistributedStateError,
    EmptySliceError,
    GroupExistsError,
    GroupNotCreatedError,
    InvalidNameError,
    InvalidSizeError,
    SizeMismatchError,
    UnknownNameError,
)
from rankmesh.megatron.generator import rank_arg

__all__ = ["HyperCommGrid"]


class HyperCommGrid:
    """megatron-core's ``HyperCommGrid``: an n-D grid of ranks whose named dims (leftmost
    fastest, like Megatron's ``order``) give process groups, one dim combination at a time.

    Same constructor, ``create_pg``, ``get_pg`` and ``get_rank_enum`` (and the attributes
    ``shape``, ``dim_names``, ``rank_offset``, ``size``, ``backend``) as megatron-core's class.
    The difference: ``create_pg`` creates only the caller's group, in O(group size), through a
    :class:`~rankmesh.MeshBuilder` (``split_group`` when the default group is bound to a device,
    member-only ``new_group`` otherwise), where megatron-core's calls
    ``new_subgroups_by_enumeration`` over every group of the grid on every rank. Within one grid,
    dim combinations with the same groups (e.g. with a size-1 dim added) share one process group;
    a combination spanning the whole world is the default group.

    Args:
        shape: the size of each dim.
        dim_names: one distinct name per dim; ``dim_names[0]`` varies fastest over the ranks.
        rank_offset: the grid's first rank, when it does not start at rank 0.
        backend: the backend of the groups (default: the default group's).

    Example (the world size comes from ``WORLD_SIZE`` or the default process group; no group is
    needed for the enumeration)::

        >>> import os; saved = os.environ.get("WORLD_SIZE"); os.environ["WORLD_SIZE"] = "8"
        >>> grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
        >>> grid.get_rank_enum("cp")
        [[0, 2], [1, 3], [4, 6], [5, 7]]
        >>> grid.get_rank_enum(["tp", "dp"])  # members in mesh order: dp slowest, tp fastest
        [[0, 1, 4, 5], [2, 3, 6, 7]]
        >>> grid.my_ranks(6, "tp")
        [6, 7]
        >>> _ = os.environ.pop("WORLD_SIZE") if saved is None else os.environ.update(WORLD_SIZE=saved)

    On every rank of a job: ``dp_group = grid.create_pg("dp")``, later ``grid.get_pg("dp")``.

    Errors: a shape and names of different lengths (:class:`~rankmesh.errors.SizeMismatchError`, a
    ``ValueError`` as in megatron-core), a negative ``rank_offset`` or a size < 1
    (:class:`~rankmesh.errors.InvalidSizeError`, a ``ValueError``), a grid larger than the world past
    ``rank_offset`` and no ``WORLD_SIZE`` nor process group (:class:`~rankmesh.errors.SizeMismatchError` /
    :class:`~rankmesh.DistributedStateError`, ``RuntimeError`` s as in megatron-core), unknown
    or repeated names (:class:`~rankmesh.errors.UnknownNameError`, :class:`~rankmesh.errors.DuplicateNameError`,
    ``ValueError`` s), ``create_pg`` twice for the same dims
    (:class:`~rankmesh.errors.GroupExistsError`) and ``get_pg`` before ``create_pg``
    (:class:`~rankmesh.errors.GroupNotCreatedError`), both ``KeyError`` s as in megatron-core.
    """

    def __init__(
        self,
        shape: Sequence[int],
        dim_names: Sequence[str],
        rank_offset: int = 0,
        backend: str | None = None,
    ) -> None:
        shape = list(shape)
        dim_names = list(dim_names)
        if len(shape) != len(dim_names):
            raise SizeMismatchError(
                f"len(shape) {shape} != len(dim_names) {dim_names}; give one name per dim",
                field="dim_names",
                value=dim_names,
            )
        if not shape:
            raise EmptySliceError(
                "a HyperCommGrid needs at least one dim, e.g. HyperCommGrid([8], ['dp'])", field="shape", value=shape
            )
        for i, (size, name) in enumerate(zip(shape, dim_names)):
            shape[i] = positive_int(size, f"shape[{i}]", hint=f" (the size of dim {name!r})")
            if not isinstance(name, str) or not name:
                raise InvalidNameError(
                    f"dim_names[{i}] must be a non-empty str, got {name!r}", field=f"dim_names[{i}]", value=name
                )
            check_str(name, f"dim_names[{i}]")
        check_unique(
            dim_names, "dim_names", lambda n: f"dim name {n!r} appears twice in {dim_names}; give each dim its own name"
        )
        world_size = self._world_size()
        self.rank_offset = as_int(rank_offset, "rank_offset")
        # a grid too large for any world names the size that overflows, before the world compares
        self.size = check_degrees([(f"shape[{i}]", s) for i, s in enumerate(shape)])
        if self.rank_offset < 0:
            raise InvalidSizeError(
                f"rank_offset must be non-negative, got {self.rank_offset}; the grid's first rank is >= 0",
                field="rank_offset",
                value=self.rank_offset,
            )
        if self.size > world_size - self.rank_offset:
            raise SizeMismatchError(
                f"Grid shape {shape} is over sized with world size {world_size} and rank offset "
                f"{self.rank_offset}: it needs {self.size} ranks from rank {self.rank_offset}",
                field="shape",
                value=shape,
            )
        self.shape = shape
        self.dim_names = dim_names
        self.backend = backend
        self._world_size_at_init = world_size
        self._pgs: dict[str, Any] = {}
        self._builder: Any = None
        # Mesh order (slowest first) is dim_names reversed, as in megatron-core.
        self._layout = MeshLayout.world(self.size).unflatten(0, self.shape[::-1], self.dim_names[::-1])

    @staticmethod
    def _world_size() -> int:
        # WORLD_SIZE first, as megatron-core (so grids can be built without a process group).
        if "WORLD_SIZE" in os.environ:
            text = os.environ["WORLD_SIZE"]
            try:  # environment text: parsed here, with its own error (rankmesh._check refuses str)
                value = int(text)
            except ValueError:
                value = None
            if value is None or value < 1:
                raise DistributedStateError(
                    f"WORLD_SIZE={text!r} is not a positive integer; set WORLD_SIZE to the number of "
                    "ranks (e.g. WORLD_SIZE=8) or unset it to read the default process group's",
                    field="WORLD_SIZE",
                    value=text,
                )
            return value
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is a dependency of the torch layer
            dist = None
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        raise DistributedStateError(
            "Cannot determine world size: WORLD_SIZE environment variable not set and "
            "torch.distributed is not initialized. Set WORLD_SIZE or call "
            "torch.distributed.init_process_group() before creating HyperCommGrid.",
            field="WORLD_SIZE",
            value=None,
        )

    # -- dims -----------------------------------------------------------------------------------
    def _order_dims(self, dims: str | Sequence[str]) -> tuple[list[str], str]:
        """``dims`` in mesh order (``dim_names`` reversed) and the key megatron-core stores them
        under, e.g. ``["dp", "tp"]`` -> ``(["dp", "tp"], "dp-tp")`` for names tp, cp, dp."""
        names = [dims] if isinstance(dims, str) else list(dims)
        if not names:
            raise EmptySliceError(
                f"dims must name at least one dim, e.g. {self.dim_names[0]!r}", field="dims", value=dims
            )
        rev = self.dim_names[::-1]
        for n in names:
            if isinstance(n, str):
                check_str(n, "dims")
            if n not in rev:
                raise UnknownNameError(
                    f"unknown dim {n!r}; the grid's dims are {self.dim_names}", field="dims", value=n
                )
        check_unique(names, "dims", lambda n: f"dim {n!r} is named twice in {names}; name it once")
        ordered = sorted(names, key=rev.index)
        return ordered, "-".join(ordered)

    def _group_layout(self, ordered: list[str]) -> MeshLayout:
        return self._layout[tuple(ordered)].flatten("_grid")

    def _placed_layout(self, world: int, ordered: list[str]) -> MeshLayout:
        """:meth:`_group_layout` over the job's ranks: the grid's ranks are ``rank_offset`` on,
        one after another (``MeshLayout.placed``, O(ndim)), or the whole job."""
        if self.rank_offset == 0 and self.size == world:
            return self._group_layout(ordered)
        grid = MeshLayout.placed(world, self.rank_offset, [(self.size, 1)])
        grid = grid.unflatten(0, self.shape[::-1], self.dim_names[::-1])
        return grid[tuple(ordered)].flatten("_grid")

    def get_rank_enum(self, dims: str | Sequence[str]) -> list[list[int]]:
        """Every group of ``dims``, as megatron-core enumerates them (O(grid size))."""
        ordered, _ = self._order_dims(dims)
        groups = self._group_layout(ordered).groups()
        return (groups.reshape(groups.shape[0], -1) + self.rank_offset).tolist()

    def my_ranks(self, rank: int, dims: str | Sequence[str]) -> list[int] | None:
        """``rank``'s group of ``dims`` (O(group size)), ranks in megatron-core's order; None
        for a rank outside the grid. Arguments in rankmesh's order, rank first, as
        :meth:`MeshLayout.group(rank, dim) <rankmesh.MeshLayout.group>`."""
        rank_arg(rank, "HyperCommGrid.my_ranks", "dims")
        ordered, _ = self._order_dims(dims)
        local = as_int(rank, "rank") - self.rank_offset
        if not 0 <= local < self.size:
            return None
        return (self._group_layout(ordered).group(local, 0) + self.rank_offset).tolist()

    # -- process groups -------------------------------------------------------------------------
    def create_pg(
        self,
        dims: str | Sequence[str],
        *,
        timeout: datetime.timedelta | None = None,
        pg_options: Any = None,
        group_desc: str | None = None,
    ):
        """Create the caller's process group of ``dims`` (None for a rank outside the grid).

        Every rank of the world must call it, in the same order, as with megatron-core's. The
        keywords are those megatron-core passes on to ``new_subgroups_by_enumeration`` (another
        is a ``TypeError``, as there); ``group_desc`` defaults to ``grid_<dims>``. Raises
        :class:`~rankmesh.errors.GroupExistsError` (a ``KeyError``) if the group of these dims was
        created before.
        """
        ordered, key = self._order_dims(dims)
        if key in self._pgs:
            raise GroupExistsError(
                f"Process group {dims} has already been created. Because there is no way to check "
                "whether options to create process group matches the first, we error out instead "
                "of returning the process group that has already been created before; use "
                f"get_pg({dims!r})",
                field="dims",
                value=key,
            )
        import torch.distributed as dist

        from rankmesh.process_groups import MeshBuilder, require_default_group

        require_default_group("HyperCommGrid.create_pg")
        world = dist.get_world_size()
        if self._builder is None:
            if world < self.rank_offset + self.size:
                raise SizeMismatchError(
                    f"the grid needs ranks {self.rank_offset}..{self.rank_offset + self.size - 1} but the "
                    f"default process group has {world}",
                    field="shape",
                    value=self.shape,
                )
            self._builder = MeshBuilder(MeshLayout.world(world), size_one_fake=False)
        kw = dict(backend=self.backend, pg_options=pg_options, timeout=timeout, group_desc=group_desc or f"grid_{key}")
        # The grid over its ranks of the job: all of them, or (an offset grid) a placed world, whose
        # ranks outside the grid take the members' steps and get None.
        pg = self._builder.process_group(self._placed_layout(world, ordered), 0, **kw)
        self._pgs[key] = pg
        return pg

    def get_pg(self, dims: str | Sequence[str]):
        """The process group :meth:`create_pg` created for ``dims``."""
        _, key = self._order_dims(dims)
        if key not in self._pgs:
            raise GroupNotCreatedError(
                f"Process group for {key} hasn't been created. Call create_pg({dims!r}) first.", field="dims", value=key
            )
        return self._pgs[key]

    def build_report(self):
        """The :class:`~rankmesh.BuildReport` of the groups this grid created (None before any)."""
        return None if self._builder is None else self._builder.report()

    def __repr__(self) -> str:
        off = f", rank_offset={self.rank_offset}" if self.rank_offset else ""
        be = f", backend={self.backend!r}" if self.backend else ""
        return f"HyperCommGrid({self.shape}, {self.dim_names}{off}{be})"
