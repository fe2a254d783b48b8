"""Pictures of a :class:`~rankmesh.plan.Plan` (``rankmesh plan --picture``), drawn with
matplotlib, an optional extra (``pip install 'rankmesh[plot]'``).

Up to :data:`FULL_PICTURE_LIMIT` ranks the picture is the whole grid of nodes x GPUs, every rank
coloured by its group in one dim and the caller's group outlined; above, it is the caller's node
and its group in every dim of one mesh. A job of disjoint meshes (:class:`~rankmesh.job_plan.JobPlan`,
:func:`draw_job_picture`) is drawn with a colour per mesh: the grid, each mesh's ranks in its
colour, shaded by their group in one dim; above the limit, a bar of the world with each mesh's
span.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from rankmesh._dependencies import install_hint
from rankmesh._native import MeshLayout
from rankmesh.job_plan import JobPlan, PlacedMesh
from rankmesh.plan import Plan

__all__ = ["FULL_PICTURE_LIMIT", "draw_job_picture", "draw_picture", "pyplot"]

#: Up to this world size the picture draws every rank.
FULL_PICTURE_LIMIT = 512


def _group_ids(lay: MeshLayout, dim: str) -> np.ndarray:
    """For every rank, the index of its group in ``dim`` (O(W); small worlds only)."""
    g = lay[dim].groups().reshape(-1, int(lay.size(dim)))
    ids = np.empty(lay.world_size, dtype=np.int64)
    ids[g] = np.arange(g.shape[0])[:, None]
    return ids


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend. Raises ``ImportError`` naming the extra when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        hint = install_hint("matplotlib")
        raise ImportError(f"drawing needs matplotlib ({e}); install it with {hint}", name="matplotlib") from e
    return plt


def draw_picture(plan: Plan, rank: int, gpn: int, dim: str | None, path: str | os.PathLike[str]) -> str:
    """Draws the plan to ``path`` (its extension picks the format); returns a one-line
    description. ``dim`` (``tp`` or ``mesh.dim``; default the first tp of size > 1) is what the
    picture colours. Raises ``ImportError`` without matplotlib (see :func:`pyplot`),
    :class:`~rankmesh.errors.UnknownNameError` for an unknown dim and ``OSError`` when the file
    cannot be written."""
    plt = pyplot()
    if dim is None:
        label, name = _default_dim(plan)
    else:
        label, name = plan.find_dim(dim)
    if plan.world_size <= FULL_PICTURE_LIMIT:
        fig = _draw_full(plt, plan, rank, gpn, label, name)
        what = f"every rank coloured by its {label}.{name} group"
    else:
        fig = _draw_large(plt, plan, rank, gpn, label, name)
        what = f"rank {rank}'s node and its groups in the {label} mesh"
    _save(plt, fig, path)
    return what


def _save(plt, fig, path: str | os.PathLike[str]) -> None:
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)


def _default_dim(plan: Plan) -> tuple[str, str]:
    for label, lay in plan.meshes.items():
        if "tp" in lay.names and int(lay.size("tp")) > 1:
            return label, "tp"
    for label, lay in plan.meshes.items():
        for i, n in enumerate(lay.names):
            if int(lay.size(i)) > 1:
                return label, n
    label = next(iter(plan.meshes))
    return label, plan.meshes[label].names[0]


_PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#1f3b73",
    "#8cd17d",
    "#d37295",
    "#b6992d",
    "#a0cbe8",
    "#79706e",
]


def _text_color(hex_color: str) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"


def _draw_full(plt, plan: Plan, rank: int, gpn: int, label: str, name: str):
    from matplotlib.patches import Rectangle

    lay = plan.meshes[label]
    world = plan.world_size
    nodes = world // gpn
    ids = _group_ids(lay, name)
    mine = set(lay.group(rank, name).tolist())
    cell = 0.62 if gpn <= 16 else 0.4
    fig_w = max(6.0, 1.6 + gpn * cell)
    fig_h = max(2.6, 1.5 + nodes * cell * 0.62)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    fs = 8 if world <= 128 else 6
    repeat = int(ids.max()) + 1 > len(_PALETTE)
    for r in range(world):
        node, local = divmod(r, gpn)
        col = _PALETTE[int(ids[r]) % len(_PALETTE)]
        ax.add_patch(Rectangle((local, node), 0.94, 0.9, facecolor=col, edgecolor="white", linewidth=0.5))
        ax.text(local + 0.47, node + 0.45, str(r), ha="center", va="center", fontsize=fs, color=_text_color(col))
        if repeat and r != rank:  # colours repeat: say which group
            ax.text(
                local + 0.9,
                node + 0.84,
                f"g{int(ids[r])}",
                ha="right",
                va="bottom",
                fontsize=fs - 3,
                color=_text_color(col),
                alpha=0.8,
            )
    _outline_and_axes(ax, mine, gpn, nodes, top=-0.15)
    node, local = divmod(rank, gpn)
    ax.text(local + 0.47, node + 0.86, "you", ha="center", va="bottom", fontsize=6, color="black", weight="bold")
    size = int(lay.size(name))
    n_groups = world // size
    cycle = " (colours repeat; g<i> = group index)" if n_groups > len(_PALETTE) else ""
    ax.set_title(
        f"{plan.convention}: {label}.{name} groups ({n_groups} groups of {size}){cycle}\n"
        f"world {world} = {nodes} nodes x {gpn} GPUs; rank {rank}'s group outlined",
        fontsize=9,
    )
    return fig


def _outline_and_axes(ax, outlined, gpn: int, nodes: int, *, top: float) -> None:
    """The node x local-GPU grid's frame: a black outline round each rank of ``outlined`` (the
    caller's group), the axes' limits (``top``: room above the first node) and labels."""
    from matplotlib.patches import Rectangle

    for r in outlined:
        node, local = divmod(r, gpn)
        ax.add_patch(Rectangle((local - 0.02, node - 0.02), 0.98, 0.94, fill=False, edgecolor="black", linewidth=2.2))
    ax.set_xlim(-0.1, gpn)
    ax.set_ylim(nodes + 0.05, top)
    ax.set_xticks([i + 0.47 for i in range(gpn)], [str(i) for i in range(gpn)], fontsize=7)
    step = max(1, nodes // 32)
    ax.set_yticks([i + 0.45 for i in range(0, nodes, step)], [f"node {i}" for i in range(0, nodes, step)], fontsize=7)
    ax.set_xlabel("local GPU (rank % gpus_per_node)", fontsize=8)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


def _strip_picks(size: int, at: int, shown: int = 16) -> list[int]:
    """Indices of a group to draw (-1 = an ellipsis): all of a short group; else the first few,
    a window around the caller's position ``at`` and the last two."""
    if size <= shown:
        return list(range(size))
    keep = sorted({0, 1, 2, 3, size - 2, size - 1} | {i for i in range(at - 2, at + 3) if 0 <= i < size})
    out: list[int] = []
    for i in keep:
        if out and i > out[-1] + 1:
            out.append(-1)
        out.append(i)
    return out


def _draw_large(plt, plan: Plan, rank: int, gpn: int, label: str, name: str):
    from matplotlib.patches import Rectangle

    lay = plan.meshes[label]
    my_node = rank // gpn
    node_ranks = list(range(my_node * gpn, (my_node + 1) * gpn))
    dims = [d for d in lay.names if int(lay.size(d)) > 1 or d == name] or list(lay.names)
    groups = {d: lay.group(rank, d) for d in dims}
    picks = {d: _strip_picks(len(groups[d]), int(np.nonzero(groups[d] == rank)[0][0])) for d in dims}
    cols = max([gpn] + [len(p) for p in picks.values()])
    cw = 0.62  # cell width in data units
    fig, ax = plt.subplots(figsize=(2.6 + cols * 0.62, 1.3 + (1 + len(dims)) * 0.78))
    fs = 6.5

    def box(x, y, text, face, below=None):
        ax.add_patch(Rectangle((x, y), cw * 0.94, 0.62, facecolor=face, edgecolor="white", linewidth=0.5))
        ax.text(x + cw * 0.47, y + 0.31, text, ha="center", va="center", fontsize=fs, color=_text_color(face))
        if below:
            ax.text(x + cw * 0.47, y + 0.68, below, ha="center", va="top", fontsize=5, color="#555555")

    ax.text(-0.15, 0.31, f"node {my_node}\n(rank {rank}'s)", ha="right", va="center", fontsize=7.5)
    members = {d: set(groups[d].tolist()) for d in dims if int(lay.size(d)) > 1}
    for j, r in enumerate(node_ranks):
        shared = "you" if r == rank else "\n".join(d for d in members if r in members[d])
        box(j * cw, 0, str(r), "#222222" if r == rank else "#dddddd", shared or None)
    for k, d in enumerate(dims, start=1):
        y = k * 0.95 + 0.25
        g = groups[d].tolist()
        nodes = {m // gpn for m in g}
        where = "inside its node" if len(nodes) == 1 else f"spans {len(nodes)} nodes"
        ax.text(
            -0.15,
            y + 0.31,
            f"{d} ({len(g)})\n{where}",
            ha="right",
            va="center",
            fontsize=7.5,
            weight="bold" if d == name else "normal",
        )
        for j, p in enumerate(picks[d]):
            x = j * cw
            if p == -1:
                ax.text(x + cw * 0.47, y + 0.31, "...", ha="center", va="center", fontsize=8)
                continue
            m = g[p]
            nd = m // gpn
            face = "#222222" if m == rank else _PALETTE[0] if nd == my_node else _PALETTE[1]
            box(x, y, str(m), face, f"node {nd}")
    ax.set_xlim(-0.05, cols * cw)
    ax.set_ylim((1 + len(dims)) * 1.0 + 0.5, -0.25)
    ax.axis("off")
    ax.set_title(
        f"{plan.convention}: rank {rank}'s groups in the {label} mesh (world {plan.world_size}, {gpn} GPUs per node)\n"
        f"top: rank {rank}'s node, with the dims it shares with each GPU; rows: its group in each dim\n"
        f"black = rank {rank}; blue = on its node {my_node}; orange = on another node (number below)",
        fontsize=8.5,
    )
    return fig


# -----------------------------------------------------------------------------------------------
# a job of disjoint meshes
# -----------------------------------------------------------------------------------------------

#: Colour of the ranks in no mesh.
_OUTSIDE = "#e6e6e6"


def draw_job_picture(job: JobPlan, rank: int, gpn: int, dim: str | None, path: str | os.PathLike[str]) -> str:
    """Draws a job of disjoint meshes to ``path``; returns a one-line description. Up to
    :data:`FULL_PICTURE_LIMIT` ranks: the grid of nodes x GPUs, a colour per mesh, its ranks
    shaded by their group in ``dim`` (``tp`` or ``mesh.dim``; a mesh without it: its fastest dim
    of size > 1) and ``rank``'s group outlined; above, a bar of the world with each mesh's span.
    Raises as :func:`draw_picture`."""
    plt = pyplot()
    label, name = None, "tp"
    if dim is not None:  # "dp": every mesh holding dp; "teachers.dp": that mesh alone
        label, name = job.find_dim(dim)
        label = label if "." in dim else None
    shade = {m.label: _shade_dim(m, name if label in (None, m.label) else None) for m in job.meshes.values()}
    if job.world_size <= FULL_PICTURE_LIMIT:
        fig = _draw_job_grid(plt, job, rank, gpn, shade)
        what = "a colour per mesh, shaded by " + ", ".join(f"{k}.{v}" for k, v in shade.items()) + " groups"
    else:
        fig = _draw_job_bar(plt, job, rank)
        what = "a lane per mesh over the world's ranks"
    _save(plt, fig, path)
    return what


def _shade_dim(m: PlacedMesh, asked: str | None) -> str:
    lay = m.layout
    if asked in lay.names:
        return asked  # type: ignore[return-value]
    return next((n for i, n in reversed(list(enumerate(lay.names))) if int(lay.size(i)) > 1), lay.names[-1])


def _lighter(hex_color: str, f: float) -> str:
    """``hex_color`` mixed with white (``f`` = 0: itself, 1: white)."""
    rgb = [int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * f):02x}" for c in rgb)


def _draw_job_grid(plt, job: JobPlan, rank: int, gpn: int, shade: dict[str, str]):
    from matplotlib.patches import Patch, Rectangle

    world = job.world_size
    nodes = world // gpn
    colour = {label: _PALETTE[i % len(_PALETTE)] for i, label in enumerate(job.meshes)}
    face = np.full(world, _OUTSIDE, dtype=object)
    coord: dict[int, str] = {}
    for m in job.meshes.values():  # small worlds only: every rank of every mesh
        lay, d = m.layout, shade[m.label]
        ids = lay[d].groups().reshape(-1, int(lay.size(d)))
        for g, row in enumerate(ids):
            face[row] = _lighter(colour[m.label], 0.42 if g % 2 else 0.0)
        if world <= 128:
            grid = lay.groups().reshape(-1)
            idx = np.indices(lay.shape).reshape(lay.ndim, -1).T
            for r, c in zip(grid.tolist(), idx.tolist()):
                coord[r] = ",".join(map(str, c))
    mine = job.mesh_of(rank)
    outline = mine.layout.group(rank, shade[mine.label]).tolist() if mine is not None else [rank]

    cell = 0.62 if gpn <= 16 else 0.4
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 + gpn * cell), max(2.8, 1.9 + nodes * cell * 0.62)))
    fs = 8 if world <= 128 else 6
    for r in range(world):
        node, local = divmod(r, gpn)
        col = str(face[r])
        ax.add_patch(Rectangle((local, node), 0.94, 0.9, facecolor=col, edgecolor="white", linewidth=0.5))
        y = node + (0.38 if r in coord else 0.45)
        ax.text(local + 0.47, y, str(r), ha="center", va="center", fontsize=fs, color=_text_color(col))
        if r in coord:
            ax.text(
                local + 0.47,
                node + 0.7,
                f"({coord[r]})",
                ha="center",
                va="center",
                fontsize=fs - 2.5,
                color=_text_color(col),
            )
    _outline_and_axes(ax, outline, gpn, nodes, top=-0.3)
    node, local = divmod(rank, gpn)
    ax.text(local + 0.47, node + 0.02, "you", ha="center", va="top", fontsize=6, color="black", weight="bold")
    handles = [
        Patch(facecolor=colour[m.label], label=f"{m.label}: ranks {m.span()}  [{m.dims()}]  shades: {shade[m.label]}")
        for m in job.meshes.values()
    ]
    if job.outside:
        handles.append(Patch(facecolor=_OUTSIDE, label=f"in no mesh ({job.outside} ranks)"))
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7.5, frameon=False)
    where = f"in {mine.label}, its {mine.label}.{shade[mine.label]} group outlined" if mine else "in no mesh"
    coords = "; (coordinate) in its mesh" if coord else ""
    ax.set_title(
        f"{len(job.meshes)} meshes over a world of {world} = {nodes} nodes x {gpn} GPUs{coords}\n"
        f"a colour per mesh, light/dark: its groups; rank {rank} {where}",
        fontsize=9,
    )
    return fig


def _draw_job_bar(plt, job: JobPlan, rank: int):
    """A lane per mesh over the world's ranks: its span (hatched where strided: every step-th rank)."""
    from matplotlib.patches import Rectangle

    world, n = job.world_size, len(job.meshes)
    fig, ax = plt.subplots(figsize=(10.0, 1.1 + 0.45 * n))
    mine = job.mesh_of(rank)
    for i, m in enumerate(job.meshes.values()):
        col = _PALETTE[i % len(_PALETTE)]
        r = m.ranks
        ax.add_patch(Rectangle((0, i + 0.1), world, 0.8, facecolor=_OUTSIDE, edgecolor="none"))
        ax.add_patch(
            Rectangle(
                (r[0], i + 0.1),
                r[-1] + 1 - r[0],
                0.8,
                edgecolor=col,
                linewidth=0.8,
                facecolor=_lighter(col, 0.45) if r.step > 1 else col,
                hatch="|||" if r.step > 1 else None,
            )
        )
        back = dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1.5) if r.step > 1 else None
        ax.text(
            (r[0] + r[-1] + 1) / 2,
            i + 0.5,
            f"ranks {m.span()}  [{m.dims()}]",
            ha="center",
            va="center",
            fontsize=7.5,
            color="black" if back else _text_color(col),
            weight="bold" if m is mine else "normal",
            bbox=back,
        )
    ax.vlines(rank + 0.5, 0, n, color="black", linewidth=1.5)
    ax.text(rank + 0.5, -0.05, f"rank {rank}", ha="center", va="bottom", fontsize=7.5, weight="bold")
    ax.set_xlim(0, world)
    ax.set_ylim(n, -0.35)
    ax.set_yticks([i + 0.5 for i in range(n)], list(job.meshes), fontsize=8)
    ax.set_xlabel("rank", fontsize=8)
    ax.tick_params(labelsize=7, length=0)
    for sp in ("top", "right", "left"):
        ax.spines[sp].set_visible(False)
    outside = f"; {job.outside} ranks in no mesh" if job.outside else ""
    where = f"in {mine.label}" if mine is not None else "in no mesh"
    hatched = "; hatched: every step-th rank of its span" if any(m.ranks.step > 1 for m in job.meshes.values()) else ""
    ax.set_title(
        f"{n} meshes over a world of {world} ranks (a lane per mesh{hatched}){outside}\nrank {rank} is {where}",
        fontsize=9,
    )
    return fig
