"""The single-mesh convention: one mesh ``(pp, dp_replicate, dp_shard, ep, tp)`` keeping only
the dims > 1.

Many training loops build one ``DeviceMesh`` and slice it: the dims are taken in the order
``pp, dp_replicate, dp_shard, ep, tp`` (slowest first, so tp ranks are neighbours), dims of size
1 are dropped, except ``dp_shard``, which stays (at size 1) whenever tp or ep is > 1 because
FSDP2 wants a shard dim next to them. A job with no parallelism at all is a flat
``("dp_shard",)`` mesh of the world. ``dp_shard=-1`` takes whatever the other degrees leave,
and ep is a factor of the world product here (not carved out of dp). There is no cp dim::

    >>> m = single_mesh(64, pp=2, dp_replicate=2, tp=4)
    >>> m.names, m.shape
    (('pp', 'dp_replicate', 'dp_shard', 'tp'), (2, 2, 4, 4))
    >>> single_mesh(8, tp=8).names, single_mesh(8, tp=8).shape
    (('dp_shard', 'tp'), (1, 8))
    >>> single_mesh(8).names, single_mesh(8).shape
    (('dp_shard',), (8,))
    >>> get_tp_mesh(m.layout).group(37, 0).tolist()
    [36, 37, 38, 39]
    >>> m.layout.coordinate_of(57)           # (pp, dp_replicate, dp_shard, tp)
    (1, 1, 2, 1)
    >>> get_dp_info(m.layout, rank=57)       # (dp rank, dp size) over dp_replicate x dp_shard
    (6, 8)

The helpers :func:`get_dp_mesh`, :func:`get_tp_mesh`, :func:`get_pp_mesh`, :func:`get_ep_mesh`
and :func:`get_dp_info` take a :class:`~rankmesh.MeshLayout`, a :class:`SingleMesh` or a torch
``DeviceMesh``. The torch face of a single mesh is the one every layout has: a
:class:`~rankmesh.MeshBuilder` over its world and
:meth:`FastDeviceMesh.from_layout <rankmesh.mesh.FastDeviceMesh.from_layout>`::

    builder = MeshBuilder(m.layout.world_layout())
    dm = FastDeviceMesh.from_layout(builder, m.layout)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rankmesh._check import (
    as_int,
    as_layout,
    as_rank,
    check_degrees,
    degree_fix,
    positive_int,
    type_name,
    undivided,
    undivided_fix,
    undivided_text,
)
from rankmesh._native import MeshLayout
from rankmesh.errors import ArgumentTypeError, DistributedStateError, ParallelConfigError, SizeMismatchError, arg

__all__ = [
    "SINGLE_MESH_ORDER",
    "SingleMesh",
    "single_mesh",
    "get_dp_mesh",
    "get_tp_mesh",
    "get_pp_mesh",
    "get_ep_mesh",
    "get_dp_info",
]

#: The dims of the single mesh, slowest first.
SINGLE_MESH_ORDER: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "ep", "tp")
DP_DIMS: tuple[str, ...] = ("dp_replicate", "dp_shard")


def _degree(value: Any, field: str, *, allow_auto: bool = False) -> int:
    """A degree by :mod:`rankmesh._check`'s rule (an int >= 1; ``-1`` too where ``allow_auto``)."""
    return positive_int(value, field, auto=-1 if allow_auto else None, fix=degree_fix(field))


@dataclass(frozen=True)
class SingleMesh:
    """A resolved single mesh: degrees, kept dims and their layout over the world."""

    world_size: int
    pp: int
    dp_replicate: int
    dp_shard: int
    ep: int
    tp: int
    names: tuple[str, ...]
    shape: tuple[int, ...]
    layout: MeshLayout

    def __post_init__(self) -> None:
        as_layout(self.layout, "layout")

    @property
    def degrees(self) -> dict[str, int]:
        """Every degree, including the dropped size-1 dims."""
        return {n: getattr(self, n) for n in SINGLE_MESH_ORDER}

    @property
    def dp_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    def group(self, rank: int, dim: str) -> np.ndarray:
        """``rank``'s group in ``dim`` (int32 ranks), O(group size)."""
        return self.layout.group(rank, dim)


def single_mesh(
    world_size: int,
    *,
    pp: int = 1,
    dp_replicate: int = 1,
    dp_shard: int = -1,
    ep: int = 1,
    tp: int = 1,
    cp: int = 1,
    rank_map: Any = None,
) -> SingleMesh:
    """Resolves the degrees and builds the single mesh's layout.

    ``rank_map`` (a permutation of the ranks, e.g. from
    :func:`rankmesh.topology.rank_map_from_hosts`) places ranks in the world like
    :meth:`MeshLayout.world`. Raises :class:`~rankmesh.errors.ParallelConfigError` for cp > 1 (this
    convention has no cp dim), :class:`~rankmesh.errors.InvalidSizeError` for a degree < 1,
    :class:`~rankmesh.errors.LayoutOverflowError` for a world size, or a running product of the degrees in
    argument order, beyond :data:`~rankmesh.MAX_WORLD_SIZE` (naming the world size or the degree
    that overflows) and :class:`~rankmesh.errors.SizeMismatchError` when the degrees do not multiply to the
    world.
    """
    world_size = _degree(world_size, "world_size")
    cp = _degree(cp, "cp")
    if cp > 1:
        raise ParallelConfigError(
            f"the single-mesh convention has no cp dim (got {arg('cp', f'cp={cp}', cp)}); use the torchtitan or "
            "megatron convention for context parallelism",
            field="cp",
            value=cp,
            fix="drop {cp} (or pass {cp=1}), or use {convention=torchtitan} or megatron for context parallelism",
        )
    deg = {
        "pp": _degree(pp, "pp"),
        "dp_replicate": _degree(dp_replicate, "dp_replicate"),
        "dp_shard": _degree(dp_shard, "dp_shard", allow_auto=True),
        "ep": _degree(ep, "ep"),
        "tp": _degree(tp, "tp"),
    }
    check_degrees([("world_size", world_size)])
    check_degrees([(n, d) for n, d in deg.items() if d != -1])  # argument order
    others = deg["pp"] * deg["dp_replicate"] * deg["ep"] * deg["tp"]
    if deg["dp_shard"] == -1:
        if world_size % others:
            name, value, left = undivided(world_size, [(n, deg[n]) for n in ("pp", "dp_replicate", "ep", "tp")])
            world = arg("world_size", f"world_size {world_size}", world_size)
            raise SizeMismatchError(
                f"{world} is not divisible by pp*dp_replicate*ep*tp = {others}, so dp_shard=-1 cannot fill the "
                f"rest: {undivided_text(name, name, value, left, arg('world_size'), world_size)}",
                field="dp_shard",
                value=-1,
                kind="world_not_divisible",
                ctx={"world_size": world_size, "divisor": others},
                fix=f"{undivided_fix(name, value, left)}, or make {{world_size}} a multiple of {others}",
            )
        deg["dp_shard"] = world_size // others
    total = others * deg["dp_shard"]
    if total != world_size:
        raise SizeMismatchError(
            f"pp*dp_replicate*dp_shard*ep*tp = {'*'.join(str(deg[n]) for n in SINGLE_MESH_ORDER)} = "
            f"{total}, not the world size {world_size}; pass dp_shard=-1 to fill the rest",
            field="world_size",
            value=world_size,
            kind="degrees_do_not_fill_world",
            ctx={"product": total},
            fix="pass {dp_shard=-1} to fill the rest, or make the degrees multiply to {world_size}",
        )
    keep_shard = deg["tp"] > 1 or deg["ep"] > 1
    names = tuple(n for n in SINGLE_MESH_ORDER if deg[n] > 1 or (n == "dp_shard" and keep_shard))
    if not names:
        names = ("dp_shard",)
    shape = tuple(deg[n] for n in names)
    layout = MeshLayout.world(world_size, rank_map=rank_map).unflatten(0, shape, names)
    return SingleMesh(world_size=world_size, names=names, shape=shape, layout=layout, **deg)


# -- helpers over a MeshLayout, a SingleMesh or a DeviceMesh -------------------------------------


def _mesh_and_names(mesh: Any) -> tuple[Any, tuple[str, ...]]:
    if isinstance(mesh, SingleMesh):
        mesh = mesh.layout
    if isinstance(mesh, MeshLayout):
        return mesh, tuple(mesh.names)
    names = getattr(mesh, "mesh_dim_names", None)
    if names is None:
        raise ArgumentTypeError(
            f"mesh must be a MeshLayout, a SingleMesh or a DeviceMesh with dim names, got {type_name(mesh)}"
            + ("; pass mesh_dim_names when building it" if hasattr(mesh, "mesh_dim_names") else ""),
            field="mesh",
            value=mesh,
        )
    return mesh, tuple(names)


def _sub(mesh: Any, wanted: tuple[str, ...]) -> Any:
    mesh, names = _mesh_and_names(mesh)
    present = tuple(n for n in names if n in wanted)
    if not present:
        return None
    return mesh[present[0]] if len(present) == 1 else mesh[present]


def get_dp_mesh(mesh: Any) -> Any:
    """The data-parallel sub-mesh: ``("dp_replicate", "dp_shard")`` (2-D, for HSDP), or the one
    of them that exists; None when the mesh has no dp dim."""
    return _sub(mesh, DP_DIMS)


def get_tp_mesh(mesh: Any) -> Any:
    """The ``tp`` sub-mesh, or None."""
    return _sub(mesh, ("tp",))


def get_pp_mesh(mesh: Any) -> Any:
    """The ``pp`` sub-mesh, or None."""
    return _sub(mesh, ("pp",))


def get_ep_mesh(mesh: Any) -> Any:
    """The ``ep`` sub-mesh, or None."""
    return _sub(mesh, ("ep",))


def get_dp_info(mesh: Any, rank: int | None = None) -> tuple[int, int]:
    """``(dp_rank, dp_size)`` across both dp dims (replicate-major): what a data loader needs.

    For a :class:`MeshLayout`/:class:`SingleMesh` pass ``rank``; a ``DeviceMesh`` answers for
    the calling rank (``rank`` must then be None or the caller). (0, 1) without dp dims."""
    mesh, names = _mesh_and_names(mesh)
    dp_rank, dp_size = 0, 1
    if isinstance(mesh, MeshLayout):
        if rank is None:
            raise ArgumentTypeError(
                "get_dp_info(layout) needs the rank: get_dp_info(layout, rank=...)", field="rank", value=None
            )
        coord = mesh.coordinate_of(as_rank(rank, mesh.world_size))
        for i, n in enumerate(names):
            if n in DP_DIMS:
                size = mesh.size(i)
                dp_rank, dp_size = dp_rank * size + int(coord[i]), dp_size * size
        return dp_rank, dp_size
    if rank is not None:
        me = mesh.get_rank()  # the caller's global rank, as DeviceMesh.get_rank() answers it
        if as_int(rank, "rank") != me:
            raise DistributedStateError(
                f"rank = {rank} but a DeviceMesh answers for the calling rank ({me}) only; "
                "leave rank unset, or pass the MeshLayout (mesh.layout) to ask about other ranks",
                field="rank",
                value=rank,
            )
    coord = mesh.get_coordinate()
    if coord is None:  # the caller is not in this mesh
        raise DistributedStateError(
            "the calling rank is not part of this DeviceMesh; ask a mesh that holds it, or pass the "
            "MeshLayout and a rank",
            field="mesh",
            value=mesh,
        )
    for i, n in enumerate(names):
        if n in DP_DIMS:
            size = mesh.size(i)
            dp_rank, dp_size = dp_rank * size + int(coord[i]), dp_size * size
    return dp_rank, dp_size
