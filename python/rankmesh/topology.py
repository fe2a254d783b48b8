"""Which mesh dims stay inside a node, which cross nodes, and layouts that follow the hardware.

A node holds ``gpus_per_node`` consecutive ranks (torchrun's numbering: node = rank //
gpus_per_node), unless a host list says otherwise. For the calling rank, the report costs
O(group size) per dim; the optional whole-world check looks at every group (O(W) per dim)::

    >>> from rankmesh import MeshLayout
    >>> mesh = MeshLayout.world(64).unflatten("world", (4, 2, 8), ("dp", "cp", "tp"))
    >>> rep = topology_report(mesh, rank=13, gpus_per_node=8)
    >>> [(d.dim, d.size, d.nodes) for d in rep.dims]
    [('dp', 4, 4), ('cp', 2, 2), ('tp', 8, 1)]
    >>> rep.inside_node, rep.across_nodes
    (('tp',), ('dp', 'cp'))

Strict mode turns a bandwidth-hungry dim (tp always, ep and cp when asked) that spans nodes into
a :class:`~rankmesh.errors.TopologyError`. It always decides from every group of the dim (the
whole-world check), so that every rank reaches the same verdict: a check of the caller's group
alone could fail on some ranks and pass on others, which leaves the others waiting in a
collective forever::

    >>> topology_report(mesh, rank=0, gpus_per_node=8, strict=True, strict_dims=("cp",))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    rankmesh.errors.TopologyError: cp (2 ranks) spans 2 nodes (8 GPUs per node), but it is bandwidth-hungry: ...

:func:`rank_map_from_hosts` turns the host of every rank (e.g. gathered at init with
``all_gather_object(socket.gethostname())``) into a rank map that places ranks host by host, so
that a layout built on ``MeshLayout.world(W, rank_map=...)`` keeps its fast dims on one host even
when the launcher numbered ranks otherwise.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankmesh._check import as_bool, as_layout, as_rank, as_sequence, check_str, positive_int, type_name
from rankmesh._native import MeshLayout
from rankmesh.errors import ArgumentTypeError, TopologyError, UnknownNameError, arg

__all__ = [
    "BANDWIDTH_HUNGRY",
    "DimTopology",
    "TopologyReport",
    "topology_report",
    "gpus_per_node_from_env",
    "rank_map_from_hosts",
    "node_of_rank_from_hosts",
    "whole_nodes",
]

#: Families of bandwidth-hungry dims, by the name strict mode is asked with; ``tp`` is always on.
BANDWIDTH_HUNGRY: dict[str, tuple[str, ...]] = {
    "tp": ("tp", "etp", "ep_tp"),
    "ep": ("ep",),
    "cp": ("cp",),
}


_DIGITS = re.compile(r"[0-9]+")


def gpus_per_node_from_env() -> int | None:
    """``LOCAL_WORLD_SIZE`` (set by torchrun) as an int, or None when unset.

    The one reader of ``LOCAL_WORLD_SIZE`` in rankmesh. The value must be what torchrun writes:
    ASCII digits only, at least 1. Anything else (``""``, ``"abc"``, ``"1.5"``, ``"0"``,
    ``"-3"``, and ``" 8 "``: nothing is trimmed, since torchrun never writes spaces and a
    hand-set value with them is a typo to fix rather than guess at) raises
    :class:`~rankmesh.errors.TopologyError` with ``field="LOCAL_WORLD_SIZE"`` and the raw string as
    ``value``."""
    v = os.environ.get("LOCAL_WORLD_SIZE")
    if v is None:
        return None
    if not _DIGITS.fullmatch(v) or int(v) < 1:
        raise TopologyError(
            f"LOCAL_WORLD_SIZE={v!r} is not a whole number of ranks per node >= 1 (digits only, no "
            "spaces or signs); set it to the processes per node (torchrun does), unset it, or pass "
            "gpus_per_node",
            field="LOCAL_WORLD_SIZE",
            value=v,
        )
    return int(v)


def _hosts_index(hostnames: Sequence[str]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(host index of every rank, hosts in order of first appearance, ranks per host)."""
    hosts = list(as_sequence(hostnames, "hostnames", "host names (one per rank)"))
    if not hosts:
        raise TopologyError("hostnames is empty; give one host name per rank", field="hostnames", value=hostnames)
    index: dict[str, int] = {}
    node = np.empty(len(hosts), dtype=np.int32)
    for r, h in enumerate(hosts):
        if not isinstance(h, str):
            raise ArgumentTypeError(
                f"hostnames[{r}] must be a str host name, got {type_name(h)} {h!r}", field=f"hostnames[{r}]", value=h
            )
        node[r] = index.setdefault(h, len(index))
    counts = np.bincount(node, minlength=len(index))
    if counts.min() != counts.max():
        names = list(index)
        detail = ", ".join(f"{names[i]}: {int(c)}" for i, c in enumerate(counts[:8]))
        more = f", ... ({len(names)} hosts)" if len(names) > 8 else ""
        raise TopologyError(
            f"hosts hold different numbers of ranks ({detail}{more}); a mesh needs the same number "
            "of ranks on every host: launch the same number of processes per node",
            field="hostnames",
            value=hostnames,
        )
    return node, list(index), counts


def node_of_rank_from_hosts(hostnames: Sequence[str]) -> tuple[np.ndarray, int]:
    """``(node index of every rank, gpus per node)`` from the host of every rank; nodes are
    numbered in order of first appearance. Raises :class:`TopologyError` for uneven hosts."""
    node, _, counts = _hosts_index(hostnames)
    return node, int(counts[0])


def rank_map_from_hosts(hostnames: Sequence[str]) -> np.ndarray:
    """A rank map placing ranks host by host: ``hostnames[r]`` is the host of rank ``r``.

    Hosts come in order of first appearance, each host's ranks ascending, so mesh index
    ``i`` lives on host ``i // gpus_per_node``. Pass it to ``MeshLayout.world(W, rank_map=...)``::

        >>> rank_map = rank_map_from_hosts(["a", "b", "a", "b"])   # a round-robin launcher
        >>> rank_map.tolist()
        [0, 2, 1, 3]
        >>> mesh = MeshLayout.world(4, rank_map=rank_map).unflatten("world", (2, 2), ("dp", "tp"))
        >>> mesh.group(2, "tp").tolist()                          # both on host "a"
        [0, 2]

    Raises :class:`TopologyError` when hosts hold different numbers of ranks.
    """
    node, _, _ = _hosts_index(hostnames)
    return np.argsort(node, kind="stable").astype(np.int32)


@dataclass(frozen=True)
class DimTopology:
    """How one dim of one mesh sits on the nodes.

    Attributes:
        mesh: the mesh's label ("" for a lone layout).
        dim: the dim's name.
        size: ranks per group.
        nodes: nodes the caller's group spans.
        node_ids: the nodes of the caller's group, ascending (at most 16 listed).
        min_nodes, max_nodes: nodes spanned by the least / most spread group of the dim, over the
            whole world; None unless the whole-world check ran.
    """

    mesh: str
    dim: str
    size: int
    nodes: int
    node_ids: tuple[int, ...]
    min_nodes: int | None = None
    max_nodes: int | None = None

    @property
    def label(self) -> str:
        """``mesh.dim``, or just the dim for a lone layout or a 1-D mesh named after its dim."""
        return f"{self.mesh}.{self.dim}" if self.mesh and self.mesh != self.dim else self.dim

    @property
    def intra_node(self) -> bool:
        """The caller's group stays inside one node."""
        return self.nodes == 1

    @property
    def all_intra_node(self) -> bool | None:
        """Every group of the dim stays inside a node (None without the whole-world check)."""
        return None if self.max_nodes is None else self.max_nodes == 1


@dataclass(frozen=True)
class TopologyReport:
    """Where the caller's groups live. :meth:`format` prints it."""

    gpus_per_node: int
    num_nodes: int
    rank: int
    node: int
    dims: tuple[DimTopology, ...]
    whole_world: bool

    def _names(self, pred) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.label for d in self.dims if pred(d)))

    @property
    def inside_node(self) -> tuple[str, ...]:
        """Dims whose caller's group stays inside its node."""
        return self._names(lambda d: d.intra_node)

    @property
    def across_nodes(self) -> tuple[str, ...]:
        """Dims whose caller's group spans nodes."""
        return self._names(lambda d: not d.intra_node)

    def violations(self, hungry: Iterable[str] = ("tp",)) -> tuple[DimTopology, ...]:
        """Bandwidth-hungry dims (families of :data:`BANDWIDTH_HUNGRY`, tp always) whose groups span
        nodes: any group with the whole-world check, else the caller's."""
        names = _hungry_names(hungry)
        out = []
        for d in self.dims:
            if d.dim in names and (d.max_nodes if d.max_nodes is not None else d.nodes) > 1:
                out.append(d)
        return tuple(out)

    def format(self, indent: str = "  ") -> str:
        lines = [f"{self.num_nodes} node(s) of {self.gpus_per_node} GPUs; rank {self.rank} is on node {self.node}"]
        width = max((len(d.label) for d in self.dims), default=0)
        for d in self.dims:
            if d.intra_node:
                where = f"inside node {d.node_ids[0]}"
            else:
                ids = ", ".join(map(str, d.node_ids[:4])) + (", ..." if d.nodes > 4 else "")
                where = f"spans {d.nodes} nodes ({ids})"
            extra = ""
            if d.max_nodes is not None:
                if d.max_nodes == 1:
                    extra = "; every group inside a node"
                elif d.min_nodes == d.max_nodes:
                    extra = f"; every group spans {d.max_nodes} nodes"
                else:
                    extra = f"; groups span {d.min_nodes}-{d.max_nodes} nodes"
            lines.append(f"{indent}{d.label:<{width}}  {d.size:>8} ranks  {where}{extra}")
        for title, names in (("inside a node: ", self.inside_node), ("across nodes:  ", self.across_nodes)):
            lines.append(
                textwrap.fill(
                    ", ".join(names) or "-",
                    width=100,
                    initial_indent=indent + title,
                    subsequent_indent=indent + " " * len(title),
                    break_on_hyphens=False,
                )
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _hungry_names(hungry: Iterable[str]) -> set[str]:
    """The dim names of the families ``hungry`` names (tp always). An unknown family is an
    :class:`~rankmesh.errors.UnknownNameError` wherever it is given, strict or not: nothing is ignored."""
    hungry = as_sequence(hungry, "strict_dims", f"family names ({', '.join(BANDWIDTH_HUNGRY)})")
    names = set(BANDWIDTH_HUNGRY["tp"])
    for i, h in enumerate(hungry):
        if not isinstance(h, str):
            raise ArgumentTypeError(
                f"strict_dims[{i}] must be a family name ({', '.join(BANDWIDTH_HUNGRY)}), got {type_name(h)} {h!r}",
                field=f"strict_dims[{i}]",
                value=h,
            )
        check_str(h, f"strict_dims[{i}]")
        if h not in BANDWIDTH_HUNGRY:
            raise UnknownNameError(
                f"unknown bandwidth-hungry family {h!r} in {arg('strict_dims')}; choose from "
                + ", ".join(f"{k} (dims {'/'.join(v)})" for k, v in BANDWIDTH_HUNGRY.items()),
                field="strict_dims",
                value=h,
            )
        names.update(BANDWIDTH_HUNGRY[h])
    return names


def _as_meshes(meshes: Any) -> dict[str, MeshLayout]:
    if isinstance(meshes, MeshLayout):
        return {"": meshes}
    layout = getattr(meshes, "layout", None)  # e.g. a SingleMesh
    if isinstance(layout, MeshLayout):
        return {"": layout}
    if isinstance(meshes, Mapping):
        out = {}
        for k, v in meshes.items():
            if not isinstance(k, str):
                raise ArgumentTypeError(
                    f"meshes must be keyed by str labels, got the key {k!r} ({type_name(k)})", field="meshes", value=k
                )
            out[k] = as_layout(v, f"meshes[{k!r}]")
        return out
    raise ArgumentTypeError(
        f"meshes must be a MeshLayout, a mapping of label -> MeshLayout, or an object with a .layout "
        f"(e.g. a SingleMesh), got {type_name(meshes)}",
        field="meshes",
        value=meshes,
    )


def whole_nodes(world_size: int, gpus_per_node: int) -> int:
    """``gpus_per_node`` when ``world_size`` ranks are a whole number of such nodes; else
    :class:`TopologyError` (field ``gpus_per_node``)."""
    gpn = positive_int(gpus_per_node, "gpus_per_node")
    if world_size % gpn:
        raise TopologyError(
            f"a world of {world_size} ranks is not a whole number of {gpn}-GPU nodes; pass the real "
            f"{arg('gpus_per_node')}, or hostnames when nodes differ",
            field="gpus_per_node",
            value=gpn,
        )
    return gpn


def _nodes_spanned(node_rows: np.ndarray) -> np.ndarray:
    """Distinct values per row of a 2-D array."""
    s = np.sort(node_rows, axis=1)
    return 1 + np.count_nonzero(np.diff(s, axis=1), axis=1)


def topology_report(
    meshes: MeshLayout | Mapping[str, MeshLayout] | Any,
    rank: int,
    gpus_per_node: int | None = None,
    *,
    hostnames: Sequence[str] | None = None,
    whole_world: bool = False,
    strict: bool = False,
    strict_dims: Iterable[str] = (),
) -> TopologyReport:
    """Which dims of ``meshes`` keep ``rank``'s groups inside a node, and how many nodes each spans.

    Args:
        meshes: a layout, a mapping ``{label: layout}`` (all over one world), or an object with a
            ``.layout`` (e.g. :class:`rankmesh.single.SingleMesh`). A mesh over part of the job
            (:meth:`MeshLayout.placed`) counts the job's ranks as its world.
        rank: the caller's rank in the job; it must be in every mesh given (else
            :class:`~rankmesh.errors.RankOutOfRangeError`).
        gpus_per_node: ranks per node; defaults to ``LOCAL_WORLD_SIZE``. Node of rank ``r`` is
            ``r // gpus_per_node``.
        hostnames: the host of every rank instead (nodes in order of first appearance).
        whole_world: also look at every group of every dim (O(W) per dim) for min/max nodes.
        strict: raise :class:`TopologyError` when a bandwidth-hungry dim spans nodes: tp (and
            etp) always, plus the families in ``strict_dims`` (``"ep"``, ``"cp"``). Strict mode
            checks the hungry dims over the whole world so that every rank agrees.
        strict_dims: families of :data:`BANDWIDTH_HUNGRY`, checked whether or not ``strict`` is
            on: a name that is no family raises :class:`~rankmesh.errors.UnknownNameError` (a family
            that no mesh holds, e.g. ``"cp"`` of a mesh without cp, is fine: nothing spans nodes).

    Cost: O(group size) per dim for the caller; O(W) per dim checked over the whole world.
    """
    by_name = _as_meshes(meshes)
    world = _one_world(by_name, meshes)
    rank = as_rank(rank, world)
    if gpus_per_node is not None:
        gpus_per_node = positive_int(gpus_per_node, "gpus_per_node")
    whole_world = as_bool(whole_world, "whole_world")
    strict = as_bool(strict, "strict")
    node_of, gpn = _node_numbering(world, gpus_per_node, hostnames)
    hungry = _hungry_names(strict_dims)  # checked strict or not: an unknown name is never ignored
    if not strict:
        hungry = set()

    def nodes(ranks: np.ndarray) -> np.ndarray:
        return node_of[ranks] if node_of is not None else ranks // gpn

    dims = _dim_topologies(by_name, rank, nodes, whole_world, hungry)
    my_node = int(nodes(np.asarray([rank]))[0])
    report = TopologyReport(
        gpus_per_node=gpn,
        num_nodes=world // gpn,
        rank=rank,
        node=my_node,
        dims=tuple(dims),
        whole_world=whole_world,
    )
    if strict:
        _refuse_hungry_dims_across_nodes(report, strict_dims)
    return report


def _one_world(by_name: dict[str, MeshLayout], meshes: Any) -> int:
    """The size of the world every mesh in ``by_name`` is over (the job's ranks: a placed mesh is
    over part of them); :class:`TopologyError` when there is no mesh or they differ."""
    if not by_name:
        raise TopologyError("no mesh to report on; pass at least one layout", field="meshes", value=meshes)
    world_sizes = {m.global_size for m in by_name.values()}  # the job's ranks (a placed mesh: part of them)
    if len(world_sizes) != 1:
        raise TopologyError(
            f"meshes over different worlds: sizes {sorted(world_sizes)}; report on layouts derived from one world",
            field="meshes",
            value=meshes,
        )
    return world_sizes.pop()


def _node_numbering(
    world: int, gpus_per_node: int | None, hostnames: Sequence[str] | None
) -> tuple[np.ndarray | None, int]:
    """``(node_of, gpus_per_node)``: the node of every rank from ``hostnames`` (None without them:
    node = rank // gpus_per_node) and the ranks per node, from the hosts, the argument or
    ``LOCAL_WORLD_SIZE``; :class:`TopologyError` when they disagree with the world or each other."""
    node_of: np.ndarray | None = None
    if hostnames is not None:
        node_of, gpn = node_of_rank_from_hosts(hostnames)
        if len(node_of) != world:
            raise TopologyError(
                f"{len(node_of)} host names for a world of {world} ranks; give one per rank",
                field="hostnames",
                value=hostnames,
            )
        if gpus_per_node is not None and gpus_per_node != gpn:
            raise TopologyError(
                f"gpus_per_node={gpus_per_node} but the hosts hold {gpn} ranks each; pass one of them only",
                field="gpus_per_node",
                value=gpus_per_node,
            )
    else:
        if gpus_per_node is None:
            gpus_per_node = gpus_per_node_from_env()
        if gpus_per_node is None:
            raise TopologyError(
                "gpus_per_node is unknown: pass gpus_per_node (or hostnames), or set LOCAL_WORLD_SIZE",
                field="gpus_per_node",
                value=None,
            )
        gpn = whole_nodes(world, gpus_per_node)
    return node_of, gpn


def _dim_topologies(
    by_name: dict[str, MeshLayout],
    rank: int,
    nodes: Callable[[np.ndarray], np.ndarray],
    whole_world: bool,
    hungry: set[str],
) -> list[DimTopology]:
    """One :class:`DimTopology` per dim of every mesh: the nodes ``rank``'s group spans, and the
    fewest and most any group spans for the dims looked at over the whole world (``whole_world``,
    or a dim in ``hungry``)."""
    dims: list[DimTopology] = []
    for label, layout in by_name.items():
        for i, name in enumerate(layout.names):
            mine = np.unique(nodes(layout.group(rank, i)))
            lo = hi = None
            if whole_world or name in hungry:
                rows = layout[name].groups().reshape(-1, int(layout.size(i)))
                spans = _nodes_spanned(nodes(rows))
                lo, hi = int(spans.min()), int(spans.max())
            dims.append(
                DimTopology(
                    mesh=label,
                    dim=name,
                    size=int(layout.size(i)),
                    nodes=int(mine.size),
                    node_ids=tuple(int(x) for x in mine[:16]),
                    min_nodes=lo,
                    max_nodes=hi,
                )
            )
    return dims


def _refuse_hungry_dims_across_nodes(report: TopologyReport, strict_dims: Iterable[str]) -> None:
    """Strict mode: :class:`TopologyError` naming the first bandwidth-hungry dim of ``report``
    that spans nodes (and the others after it); returns when there is none."""
    bad = report.violations(strict_dims)
    if bad:
        gpn = report.gpus_per_node
        d = bad[0]
        others = "; also " + ", ".join(b.label for b in bad[1:]) if len(bad) > 1 else ""
        raise TopologyError(
            f"{d.label} ({d.size} ranks) spans {d.max_nodes} nodes ({gpn} GPUs per node), but it is "
            f"bandwidth-hungry: keep it inside a node (make it the fastest dim with a size dividing "
            f"{gpn}, or place ranks with rank_map_from_hosts){others}",
            field=d.label,
            value=d.max_nodes,
        )
