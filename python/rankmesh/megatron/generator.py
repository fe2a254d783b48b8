"""Megatron-core's ``RankGenerator`` over a :class:`~rankmesh.MeshLayout` (torch-free): the world
unflattened in an order string's reverse, and its tokens as flattened slices. How an order maps
to a mesh, with a worked example, is in :mod:`rankmesh.megatron`; which orders a generator
accepts is :mod:`rankmesh.megatron.order`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from rankmesh._check import as_int, check_str, degree_fix, positive_int
from rankmesh._native import MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DuplicateNameError,
    EmptySliceError,
    InvalidNameError,
    ParallelConfigError,
    RankOutOfRangeError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.megatron.order import MEGATRON_DIMS, GeneratorCheck, split_names

__all__ = ["RankGenerator"]


def rank_arg(rank: Any, method: str, what: str) -> Any:
    """``rank`` as given, unless it is a str: then the caller wrote the arguments in the old
    ``(name, rank)`` order, which rankmesh's methods no longer take."""
    if isinstance(rank, str):
        raise ArgumentTypeError(
            f"{method}(rank, {what}) takes the rank first, got the str {rank!r} as the rank; "
            f"write {method.rsplit('.', 1)[-1]}(rank, {rank!r})",
            field="rank",
            value=rank,
        )
    return rank


class RankGenerator:
    """Megatron-core's ``RankGenerator`` (same constructor, same ``get_ranks``), over a MeshLayout.

    Args:
        tp, ep, dp, pp, cp: the degrees; ``ep`` and ``cp`` cannot both be > 1 (Megatron keeps cp
            in the dense generator and ep in the expert one).
        order: names joined by ``-``, leftmost fastest, e.g. ``"tp-cp-ep-dp-pp"``. Names of size
            1 may be left out (they are appended, as Megatron does); case is ignored.
        rank_offset: added to every rank returned (ranks of a generator placed after others).
        world: optional 1-D :class:`MeshLayout` of ``tp*ep*dp*pp*cp`` ranks to build on, e.g. one
            with a topology-aware ``rank_map`` (see :mod:`rankmesh.topology`); identity otherwise.

    Errors (all :class:`~rankmesh.RankmeshError`): a degree < 1
    (:class:`~rankmesh.errors.InvalidSizeError`) or not an int (:class:`~rankmesh.errors.ArgumentTypeError`,
    a ``TypeError``), a ``world`` whose size is not the degrees' product
    (:class:`~rankmesh.errors.SizeMismatchError`), ep and cp both > 1
    (:class:`~rankmesh.errors.MegatronConfigError`, also an ``AssertionError`` as in Megatron), a dim
    of size > 1 missing from ``order`` (:class:`~rankmesh.errors.ParallelConfigError`, also a
    ``RuntimeError`` as in Megatron; its message suggests only an order
    :func:`~rankmesh.megatron.working_order` finds works, also in ``e.ctx["works"]``, None when none
    does), an unknown name (:class:`~rankmesh.errors.UnknownNameError`, also a ``KeyError``), a name
    twice (:class:`~rankmesh.errors.DuplicateNameError`), a negative ``rank_offset``
    (:class:`~rankmesh.errors.InvalidSizeError`; Megatron silently ignores it) or ranks past int32
    (:class:`~rankmesh.errors.LayoutOverflowError`, naming the degree whose running product, in argument
    order, overflows: ``tp`` for ``tp=2**64``; ``rank_offset`` when the degrees fit).

    Example (the order ``tp-dp-pp`` of Megatron's own docstring, 16 ranks)::

        >>> g = RankGenerator(tp=2, ep=1, dp=2, pp=4, cp=1, order="tp-dp-pp")
        >>> g.get_ranks("dp")[:4]
        [[0, 2], [1, 3], [4, 6], [5, 7]]
        >>> g.get_ranks("pp")[0]
        [0, 4, 8, 12]
        >>> g.my_group(9, "tp-dp").tolist()
        [8, 9, 10, 11]
        >>> g.groups("tp").shape
        (8, 2)
    """

    def __init__(
        self,
        tp: int,
        ep: int,
        dp: int,
        pp: int,
        cp: int,
        order: str,
        rank_offset: int = 0,
        *,
        world: MeshLayout | None = None,
    ) -> None:
        sizes = {"tp": tp, "ep": ep, "dp": dp, "pp": pp, "cp": cp}  # argument order
        sizes = {k: positive_int(v, k, fix=degree_fix(k)) for k, v in sizes.items()}
        check = GeneratorCheck(**sizes, world=world, rank_offset=rank_offset)
        names = check.checked_names(order)  # every check of the order, the world and rank_offset
        self._build(sizes, names, check.rank_offset, check.world_size, world)

    @classmethod
    def _checked(cls, sizes: dict[str, int], names: Sequence[str], world: MeshLayout) -> RankGenerator:
        """The generator of degrees ``sizes`` and order ``names`` over ``world`` (of their product
        of ranks), which the check of the call that builds it has passed (``model_parallel_layout``'s
        :class:`~rankmesh.megatron.order.LayoutCheck`): nothing is checked again."""
        generator = cls.__new__(cls)
        generator._build(sizes, names, 0, world.world_size, world)
        return generator

    def _build(
        self, sizes: dict[str, int], names: Sequence[str], rank_offset: int, world_size: int, world: MeshLayout | None
    ) -> None:
        self.tp, self.ep, self.dp, self.pp, self.cp = (sizes[k] for k in ("tp", "ep", "dp", "pp", "cp"))
        self.rank_offset, self.world_size = rank_offset, world_size
        self.name_to_size = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "cp": self.cp}
        names = [*names, *(n for n in MEGATRON_DIMS if n not in names)]
        #: The full order, lower-cased, with the omitted size-1 names appended (as Megatron).
        self.order = "-".join(names)
        #: Sizes in ``order`` (leftmost fastest), as Megatron's ``ordered_size``.
        self.ordered_size = [self.name_to_size[n] for n in names]
        self._order_names = tuple(names)
        mesh_names = tuple(reversed(names))
        if world is None:
            world = MeshLayout.world(self.world_size)
        self.world = world
        #: The whole mesh: the world unflattened in the reversed order (slowest dim first).
        self.mesh_layout: MeshLayout = world.unflatten(0, [self.name_to_size[n] for n in mesh_names], mesh_names)
        self._pos = {n: i for i, n in enumerate(mesh_names)}
        self._layouts: dict[tuple[str, ...], MeshLayout] = {}

    # -- Megatron's API ---------------------------------------------------------------------
    def get_mask(self, order: str, token: str) -> list[bool]:
        """Megatron's mask: ``mask[i]`` is True when the i-th name of ``order`` is in ``token``."""
        ordered = split_names(order, "order")
        mask = [False] * len(ordered)
        for t in self._token_names(token):
            if t not in ordered:
                raise UnknownNameError(f"token name {t!r} is not in the order {order!r}", field="token", value=t)
            mask[ordered.index(t)] = True
        return mask

    def get_ranks(self, token: str) -> list[list[int]]:
        """Every group of ``token`` as lists, in Megatron's order (O(world); prefer
        :meth:`my_group` on a rank and :meth:`groups` for arrays)."""
        return self.groups(token).tolist()

    # -- rankmesh's additions ---------------------------------------------------------------
    def _token_names(self, token: str | Iterable[str]) -> tuple[str, ...]:
        """The token's distinct names, as written (``"dp-cp"`` -> ``("dp", "cp")``)."""
        if isinstance(token, str):
            names = split_names(token, "token")
        else:
            names = [n.lower() if isinstance(n, str) else n for n in token]
            for n in names:
                if not isinstance(n, str):
                    raise ArgumentTypeError(
                        f"token names must be str like 'tp', got {type(n).__name__} {n!r}", field="token", value=n
                    )
                check_str(n, "token")
                if n not in MEGATRON_DIMS:
                    raise UnknownNameError(
                        f"token names {n!r}, not one of {', '.join(MEGATRON_DIMS)}", field="token", value=n
                    )
            if not names:
                raise EmptySliceError("a token must name at least one dim, e.g. 'tp'", field="token", value=token)
        return tuple(dict.fromkeys(names))

    def token_dims(self, token: str | Iterable[str]) -> tuple[str, ...]:
        """The token's names in mesh order (slowest first), e.g. ``"tp-pp"`` -> ``("pp", "tp")``."""
        return tuple(sorted(self._token_names(token), key=self._pos.__getitem__))

    def layout(self, token: str | Iterable[str]) -> MeshLayout:
        """The 1-D layout of ``token``: the flatten of its names' slice, named like ``"dp_cp"``.

        Its ``groups()`` are Megatron's groups for the token (without ``rank_offset``)."""
        key = self._token_names(token)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self.mesh_layout[self.token_dims(key)].flatten("_".join(key))
            self._layouts[key] = lay
        return lay

    def group_size(self, token: str | Iterable[str]) -> int:
        """Ranks in one group of ``token``."""
        return int(np.prod([self.name_to_size[n] for n in self._token_names(token)]))

    def num_groups(self, token: str | Iterable[str]) -> int:
        """Number of groups of ``token`` (rows of :meth:`groups`)."""
        return self.world_size // self.group_size(token)

    def _local(self, rank: Any) -> int:
        r = as_int(rank, "rank")
        local = r - self.rank_offset
        if not 0 <= local < self.world_size:
            lo, hi = self.rank_offset, self.rank_offset + self.world_size
            raise RankOutOfRangeError(f"rank {r} is outside this generator's ranks [{lo}, {hi})", field="rank", value=r)
        return local

    def my_group(self, rank: int, token: str | Iterable[str]) -> np.ndarray:
        """``rank``'s group of ``token`` (int32, Megatron's order, ``rank_offset`` applied), in
        O(group size): the row of :meth:`get_ranks` that holds ``rank``. Arguments in rankmesh's
        order, rank first, as :meth:`MeshLayout.group(rank, dim) <rankmesh.MeshLayout.group>`.

            >>> g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
            >>> g.my_group(5, "tp-pp").tolist(), g.my_group(5, "dp").tolist()
            ([0, 1, 4, 5], [5, 7])
        """
        local = self._local(rank_arg(rank, "RankGenerator.my_group", "token"))
        g = self.layout(token).group(local, 0)
        return g + np.int32(self.rank_offset) if self.rank_offset else g

    def groups(self, token: str | Iterable[str]) -> np.ndarray:
        """Every group of ``token`` as an int32 array ``(num_groups, group_size)``, Megatron's
        order, ``rank_offset`` applied. O(world)."""
        g = self.layout(token).groups()
        g = g.reshape(g.shape[0], -1)
        return g + np.int32(self.rank_offset) if self.rank_offset else g

    def coordinate_of(self, rank: int) -> dict[str, int]:
        """``rank``'s index in every dim, e.g. ``{"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 1}``."""
        coord = self.mesh_layout.coordinate_of(self._local(rank))
        return {n: int(coord[self._pos[n]]) for n in self._order_names}

    def dims_layout(self, dims: Sequence[str | Iterable[str]], names: Sequence[str] | None = None) -> MeshLayout:
        """A multi-dim layout whose dims are tokens, e.g. ``["pp", "dp-cp", "tp"]``, for a DeviceMesh.

        Tokens must be disjoint and listed slowest first (mesh order), and each token's names must
        be adjacent in the order (size-1 names do not count); a single token may be anything.
        Dims are named ``names`` or ``"dp_cp"``-style joins of the tokens."""
        if isinstance(dims, str):
            dims = [dims]
        keys = [self._token_names(t) for t in dims]
        if not keys:
            raise EmptySliceError(
                "dims must name at least one token, e.g. ['pp', 'dp-cp', 'tp']", field="dims", value=dims
            )
        labels = list(names) if names is not None else ["_".join(k) for k in keys]
        if len(labels) != len(keys):
            raise InvalidNameError(f"{len(labels)} names for {len(keys)} dims", field="names", value=labels)
        for i, label in enumerate(labels):
            check_str(label, f"names[{i}]")
        owner: dict[str, int] = {}
        for i, k in enumerate(keys):
            for n in k:
                if n in owner:
                    raise DuplicateNameError(
                        f"{n!r} is in two dims ({dims[owner[n]]!r} and {dims[i]!r}); put each name in one dim",
                        field="dims",
                        value=n,
                    )
                owner[n] = i
        if len(keys) == 1:  # renamed as unflatten names, so that any name works, as for several dims
            lay = self.layout(keys[0])
            return lay if labels[0] == lay.names[0] else lay.unflatten(0, lay.shape, labels)
        runs: list[tuple[int | None, int, list[str]]] = []  # (dim index, size, names)
        for n in self.mesh_layout.names:
            i = owner.get(n)
            if i is None and self.name_to_size[n] == 1:
                continue  # size-1 names are transparent
            if runs and i is not None and runs[-1][0] == i:
                runs[-1] = (i, runs[-1][1] * self.name_to_size[n], runs[-1][2] + [n])
            else:
                runs.append((i, self.name_to_size[n], [n]))
        seen = [r[0] for r in runs if r[0] is not None]
        for i in range(len(keys)):
            if seen.count(i) != 1:
                raise ParallelConfigError(
                    f"the names of {dims[i]!r} are not adjacent in the order {self.order!r}, so it cannot "
                    "be one dim of a multi-dim mesh; use it alone (dims_layout([token])) or pick tokens "
                    "that are runs of the order",
                    field="dims",
                    value=dims[i],
                )
        run_names = [labels[r[0]] if r[0] is not None else f"_rest{j}" for j, r in enumerate(runs)]
        if seen != sorted(seen):
            # mesh order is the order the tokens' runs appear in; listed so, the same runs are
            # unflattened under the same names, which works when those are non-empty and distinct
            fix_dims, fix_names = [dims[i] for i in seen], [labels[i] for i in seen]
            if not (all(run_names) and len(set(run_names)) == len(run_names)):
                hint = "no order of these dims slices this mesh; build them one at a time"
            elif names is None:
                hint = f"list them as {fix_dims}"
            else:
                hint = f"list them as {fix_dims} with names {fix_names}"
            raise SliceOrderError(
                f"dims {list(dims)} are not in mesh order (slowest first) for order {self.order!r}; {hint}",
                field="dims",
                value=list(dims),
            )
        full = self.world.unflatten(0, [r[1] for r in runs], run_names)
        return full[tuple(labels)]

    def __repr__(self) -> str:
        off = f", rank_offset={self.rank_offset}" if self.rank_offset else ""
        return (
            f"RankGenerator(tp={self.tp}, ep={self.ep}, dp={self.dp}, pp={self.pp}, cp={self.cp}, "
            f"order={self.order!r}{off})"
        )
