"""``rankmesh``: plan a parallel layout before launching, or benchmark against stock torch.

Usage::

    rankmesh plan --world-size 131072 --tp 8 --pp 4 --cp 2 --ep 8 --dp-replicate 2
    rankmesh plan --world-size 4096 --tp 8 --pp 4 --cp 2 --ep 8 --convention megatron --rank 1234
    rankmesh plan --world-size 64 --tp 4 --pp 2 --convention single --picture mesh.png --dim tp
    rankmesh bench --worlds 10,17

``plan`` prints the resolved degrees, every mesh and dim with its size, the groups of one rank
(``--rank``), the number of process groups a rank creates (one per distinct rank partition,
computed from the layouts' modes, no torch needed), and where the groups sit on the nodes. Bad
input exits with status 2 and a one-line fix. ``bench`` runs :func:`rankmesh.bench.main`.
Also available as ``python -m rankmesh``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TextIO

import numpy as np

from rankmesh import _torchtitan as _tt
from rankmesh._groups import DEFAULT, FAKE, group_key
from rankmesh._native import MAX_WORLD_SIZE, MeshLayout
from rankmesh.errors import ParallelConfigError, RankmeshError

__all__ = ["main", "Plan", "build_plan", "count_process_groups", "format_group"]

CONVENTIONS = ("torchtitan", "megatron", "single")
#: Above this world size the whole-world topology check (O(W) per dim) is skipped.
WHOLE_WORLD_LIMIT = 1 << 22
#: The largest world ``plan`` takes: it materialises the caller's groups (a dp group can hold
#: most of the world) to print and place them.
PLAN_LIMIT = 1 << 24
#: Up to this world size ``--picture`` draws every rank.
FULL_PICTURE_LIMIT = 512


class BadInput(Exception):
    """Invalid command-line input: a message and a one-line fix (exit status 2)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


# -----------------------------------------------------------------------------------------------
# the plan: layouts of one convention, computed without torch
# -----------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """Everything ``rankmesh plan`` prints: resolved degrees and the layouts by mesh label."""

    convention: str
    world_size: int
    degrees: dict[str, int]
    derived: dict[str, str]  # name -> "value (formula)"
    meshes: dict[str, MeshLayout]  # label -> layout (all over one world)
    fake: dict[str, frozenset[str]] = field(default_factory=dict)  # label -> dims on the fake backend
    extra_groups: dict[str, object] = field(default_factory=dict)  # non-partition groups (megatron embd)
    notes: list[str] = field(default_factory=list)
    display_only: frozenset[str] = frozenset()  # meshes shown but not built (megatron's generators)

    def built(self) -> dict[str, MeshLayout]:
        """The meshes whose dims become process groups."""
        return {k: v for k, v in self.meshes.items() if k not in self.display_only}

    def dims(self) -> list[tuple[str, str, int]]:
        """(mesh label, dim name, size) of every dim, in display order."""
        return [(label, n, int(lay.size(i))) for label, lay in self.meshes.items() for i, n in enumerate(lay.names)]

    def tag(self, label: str, dim: str) -> str:
        """``mesh.dim``, or the bare name of a 1-D mesh named after its dim (``loss``, ``dp_cp``)."""
        return dim if label == dim else f"{label}.{dim}"

    def find_dim(self, dim: str) -> tuple[str, str]:
        """``"tp"`` or ``"dense.tp"`` -> (mesh label, dim name): the first mesh where the dim
        has size > 1, else the first holding it."""
        if "." in dim:
            label, name = dim.split(".", 1)
            lay = self.meshes.get(label)
            if lay is not None and name in lay.names:
                return label, name
        holders = [label for label, lay in self.meshes.items() if dim in lay.names]
        for label in holders:
            if int(self.meshes[label].size(dim)) > 1:
                return label, dim
        if holders:
            return holders[0], dim
        choices = sorted({n for _, n, _ in self.dims()})
        raise BadInput(
            f"--dim {dim!r} is not a dim of the {self.convention} plan",
            f"use one of {', '.join(choices)} (or mesh.dim, e.g. {self.dims()[0][0]}.{self.dims()[0][1]})",
        )


def _torchtitan_plan(world: int, tp: int, pp: int, cp: int, ep: int, dp_replicate: int, dp_shard: int, etp: int) -> Plan:
    """torchtitan's ParallelDims (dp_shard=-1 fills the rest) and its meshes, as layouts."""
    if dp_shard == -1:
        rest = dp_replicate * cp * tp * pp
        if world % rest:
            raise BadInput(
                f"--dp-shard -1 cannot fill the world: {world} is not divisible by "
                f"dp_replicate*cp*tp*pp = {dp_replicate}*{cp}*{tp}*{pp} = {rest}",
                f"pick a --world-size that is a multiple of {rest}, or smaller degrees",
            )
        dp_shard = world // rest
    product = dp_replicate * dp_shard * cp * tp * pp
    if product != world:
        raise BadInput(
            f"dp_replicate*dp_shard*cp*tp*pp = {dp_replicate}*{dp_shard}*{cp}*{tp}*{pp} = {product}, "
            f"not the world size {world}",
            "pass --dp-shard -1 to fill the rest, or make the degrees multiply to --world-size",
        )
    if ep > 1 and etp not in (tp, 1):
        raise BadInput(
            f"--etp {etp} with --tp {tp} and --ep {ep}: torchtitan supports etp = tp or etp = 1",
            f"pass --etp 1 or --etp {tp}",
        )
    fsdp = dp_shard * cp
    if (fsdp * tp) % (ep * etp):
        raise BadInput(
            f"ep*etp = {ep}*{etp} = {ep * etp} does not divide dp_shard*cp*tp = {fsdp * tp}: the sparse mesh "
            "splits those ranks into efsdp x ep x etp",
            f"choose --ep (and --etp) so that ep*etp divides {fsdp * tp}",
        )
    deg = _tt.degrees(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp)
    built = _tt.layouts(world, deg, loss_name="loss")
    meshes = {k: built[k] for k in ("dataloading", "loss", "dense", "sparse")}
    fake = {k: _tt.fake_dims(k, lay, ep) for k, lay in meshes.items()}
    degrees = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp, "ep": ep, "etp": etp}
    derived = {
        "batch": f"{deg['batch']} (dp_replicate*dp_shard)",
        "loss": f"{deg['batch'] * cp} (batch*cp)",
        "fsdp": f"{fsdp} (dp_shard*cp)",
        "efsdp": f"{deg['efsdp']} (fsdp*tp/(etp*ep))",
    }
    notes = ["batch is count-only (fake backend), as in torchtitan; so are size-1 dims and efsdp while ep = 1"]
    return Plan("torchtitan", world, degrees, derived, meshes, fake, notes=notes)


def _megatron_plan(world: int, tp: int, pp: int, cp: int, ep: int, etp: int | None, order: str) -> Plan:
    from rankmesh.megatron import model_parallel_layout

    m = model_parallel_layout(world, tp, pp, cp, ep, etp, order)
    meshes: dict[str, MeshLayout] = {
        "decoder": m.decoder.mesh_layout,
        "expert": m.expert.mesh_layout,
    }
    groups: dict[str, MeshLayout] = {}
    extra: dict[str, object] = {}
    for name in m.group_names:
        lay = m.layout(name)
        if lay is None:
            extra[name] = m
        else:
            groups[name] = lay.flatten(name) if lay.names[0] != name else lay
    # one 1-D "mesh" per named group, so every group is listed, counted and placed
    meshes.update(groups)
    degrees = {"tp": tp, "pp": pp, "cp": cp, "dp": m.dp, "ep": ep, "etp": m.expert_tp, "edp": m.expert_dp}
    derived = {
        "dp": f"{m.dp} (world/(tp*pp*cp))",
        "expert dp": f"{m.expert_dp} (world/(etp*ep*pp))",
        "order": f"{m.order} (leftmost fastest; mesh dims are its reverse)",
    }
    notes = [
        "decoder and expert are Megatron's two RankGenerators (shown, not built); the groups are "
        "those initialize_model_parallel creates, by its NCCL-config names",
    ]
    return Plan("megatron", world, degrees, derived, meshes, {}, extra, notes, frozenset({"decoder", "expert"}))


def _single_plan(world: int, tp: int, pp: int, ep: int, dp_replicate: int, dp_shard: int) -> Plan:
    from rankmesh.single import single_mesh

    s = single_mesh(world, pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, ep=ep, tp=tp)
    degrees = s.degrees
    dropped = [n for n in degrees if n not in s.names]
    notes = [f"dims of size 1 dropped: {', '.join(dropped)}"] if dropped else []
    if "dp_shard" in s.names and s.dp_shard == 1:
        notes.append("dp_shard kept at size 1 next to tp/ep (FSDP needs a shard dim)")
    fake = {"mesh": frozenset(n for n, size in zip(s.names, s.shape) if size == 1)}
    derived = {"dp": f"{s.dp_size} (dp_replicate*dp_shard)"}
    return Plan("single", world, degrees, derived, {"mesh": s.layout}, fake, notes=notes)


def build_plan(
    convention: str,
    world_size: int,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp_replicate: int | None = None,
    dp_shard: int | None = None,
    etp: int | None = None,
    order: str | None = None,
) -> Plan:
    """The layouts of one convention (see ``rankmesh plan --help``). Raises :class:`BadInput`."""
    if convention == "torchtitan":
        if order is not None:
            raise BadInput("--order only applies to --convention megatron", "drop --order, or pass --convention megatron")
        return _torchtitan_plan(
            world_size, tp, pp, cp, ep,
            1 if dp_replicate is None else dp_replicate,
            -1 if dp_shard is None else dp_shard,
            1 if etp is None else etp,
        )  # fmt: skip
    if convention == "megatron":
        if dp_replicate is not None or dp_shard is not None:
            flag = "--dp-replicate" if dp_replicate is not None else "--dp-shard"
            raise BadInput(
                f"{flag} does not apply to --convention megatron (dp = world/(tp*pp*cp) is derived)",
                f"drop {flag}",
            )
        return _megatron_plan(world_size, tp, pp, cp, ep, etp, order or "tp-cp-ep-dp-pp")
    if convention == "single":
        if order is not None:
            raise BadInput("--order only applies to --convention megatron", "drop --order, or pass --convention megatron")
        if cp > 1:
            raise BadInput(
                f"the single-mesh convention has no cp dim (--cp {cp})",
                "drop --cp (or pass --cp 1), or use --convention torchtitan or megatron for context parallelism",
            )
        if etp is not None:
            raise BadInput("--etp does not apply to --convention single (it has no expert-tp dim)", "drop --etp")
        return _single_plan(world_size, tp, pp, ep, 1 if dp_replicate is None else dp_replicate, -1 if dp_shard is None else dp_shard)
    raise BadInput(f"unknown convention {convention!r}", f"use one of {', '.join(CONVENTIONS)}")


# -----------------------------------------------------------------------------------------------
# process-group count (from modes, no torch)
# -----------------------------------------------------------------------------------------------


@dataclass
class GroupCount:
    """Process groups one rank creates for a plan, one per distinct (partition, backend)."""

    real: list[list[str]]  # each entry: the "mesh.dim" labels sharing one real group
    fake: list[list[str]]
    default: list[str]  # dims spanning the world: served by the default group

    @property
    def created(self) -> int:
        return len(self.real) + len(self.fake)


def count_process_groups(plan: Plan) -> GroupCount:
    """What rankmesh's torch layer creates for the plan: dims spanning the world reuse the default
    group; other dims get one group per distinct partition and backend (fake for count-only and
    size-1 dims)."""
    real: dict[tuple, list[str]] = {}
    fake: dict[tuple, list[str]] = {}
    default: list[str] = []
    for label, lay in plan.built().items():
        for i, name in enumerate(lay.names):
            tag = plan.tag(label, name)
            key = group_key(lay, i, world_size=plan.world_size, fake=name in plan.fake.get(label, ()))
            if key == DEFAULT:
                default.append(tag)
                continue
            (fake if key[1] == FAKE else real).setdefault(key, []).append(tag)
    return GroupCount(list(real.values()), list(fake.values()), default)


# -----------------------------------------------------------------------------------------------
# printing
# -----------------------------------------------------------------------------------------------


def format_group(ranks: Sequence[int] | np.ndarray, limit: int = 8) -> str:
    """``[0, 1, ..., 7] (8 ranks)``: short groups in full, long ones abbreviated (an arithmetic
    progression by its first two and last member, anything else by its first four and last)."""
    r = [int(x) for x in ranks]
    n = len(r)
    unit = "rank" if n == 1 else "ranks"
    if n <= 4:
        return f"[{', '.join(map(str, r))}] ({n} {unit})"
    diffs = np.diff(np.asarray(r, dtype=np.int64))
    if np.all(diffs == diffs[0]):
        body = f"{r[0]}, {r[1]}, ..., {r[-1]}"
    elif n <= limit:
        body = ", ".join(map(str, r))
    else:
        body = ", ".join(map(str, r[:4])) + f", ..., {r[-1]}"
    return f"[{body}] ({n} {unit})"


def _print_plan(plan: Plan, rank: int, gpn: int, out: TextIO, *, strict: tuple[str, ...] | None) -> int:
    from rankmesh.topology import topology_report

    w = out.write
    w(f"rankmesh plan: {plan.convention} convention, world of {plan.world_size} ranks, rank {rank}\n\n")
    w("degrees\n")
    w("  " + "  ".join(f"{k}={v}" for k, v in plan.degrees.items()) + "\n")
    for k, v in plan.derived.items():
        w(f"  {k} = {v}\n")
    w("\nmeshes (dims slowest first; * = fake backend: count-only or size 1)\n")
    def is_group(label: str) -> bool:
        return plan.convention == "megatron" and label not in plan.display_only

    shown = {k: v for k, v in plan.meshes.items() if not is_group(k)}
    width = max(len(k) for k in shown)
    for label, lay in shown.items():
        fake = plan.fake.get(label, frozenset())
        dims = ", ".join(
            f"{n}={int(lay.size(i))}{'*' if (n in fake or int(lay.size(i)) == 1) else ''}" for i, n in enumerate(lay.names)
        )
        w(f"  {label:<{width}}  [{dims}]\n")
    named = [(k, int(v.size(0))) for k, v in plan.meshes.items() if is_group(k)]
    if named:
        w("  groups      " + "  ".join(f"{k}={n}" for k, n in named) + "\n")
    for note in plan.notes:
        w(f"  note: {note}\n")

    w(f"\nrank {rank}'s groups\n")
    built = plan.built()
    tw = max(len(plan.tag(a, n)) for a, lay in built.items() for n in lay.names)
    tw = max([tw] + [len(n) for n in plan.extra_groups])
    for label, lay in built.items():
        for i, n in enumerate(lay.names):
            w(f"  {plan.tag(label, n):<{tw}}  {format_group(lay.group(rank, i))}\n")
    for name, m in plan.extra_groups.items():
        g = m.group(name, rank)  # type: ignore[attr-defined]
        txt = format_group(g) if g is not None else f"- (rank {rank} holds no {name})"
        w(f"  {name:<{tw}}  {txt}  (not a partition of the world)\n")

    count = count_process_groups(plan)
    w(
        f"\nprocess groups per rank: {count.created} ({len(count.real)} real + {len(count.fake)} fake), "
        "one per distinct rank partition\n"
    )
    shared = [g for g in count.real + count.fake if len(g) > 1]
    for g in shared:
        w(f"  shared: {' = '.join(g)}\n")
    if count.default:
        w(f"  default group (whole world): {', '.join(count.default)}\n")
    if plan.extra_groups:
        w(f"  plus {', '.join(plan.extra_groups)}: subsets of the world, created by their members only\n")

    whole = plan.world_size <= WHOLE_WORLD_LIMIT
    report = topology_report(built, rank, gpn, whole_world=whole)
    w(f"\ntopology: {report.format()}\n")
    if not whole:
        w(f"  (whole-world check skipped above {WHOLE_WORLD_LIMIT} ranks)\n")
    if strict is not None:
        bad = report.violations(strict)
        if bad:
            d = bad[0]
            raise BadInput(
                f"strict topology: {d.label} ({d.size} ranks) spans up to "
                f"{d.max_nodes if d.max_nodes is not None else d.nodes} nodes of {gpn} GPUs",
                f"keep bandwidth-hungry dims inside a node: make {d.dim} divide --gpus-per-node "
                f"({gpn}) and be the fastest dim, or drop --strict",
            )
        w(f"  strict: every bandwidth-hungry dim ({', '.join(('tp',) + strict)}) stays inside a node\n")
    return 0


# -----------------------------------------------------------------------------------------------
# pictures
# -----------------------------------------------------------------------------------------------


def _group_ids(lay: MeshLayout, dim: str) -> np.ndarray:
    """For every rank, the index of its group in ``dim`` (O(W); small worlds only)."""
    g = lay[dim].groups().reshape(-1, int(lay.size(dim)))
    ids = np.empty(lay.world_size, dtype=np.int64)
    ids[g] = np.arange(g.shape[0])[:, None]
    return ids


def draw_picture(plan: Plan, rank: int, gpn: int, dim: str | None, path: Path) -> str:
    """Draws the plan to ``path``; returns a one-line description."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return what


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
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#1f3b73", "#8cd17d", "#d37295", "#b6992d", "#a0cbe8", "#79706e",
]  # fmt: skip


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
            ax.text(local + 0.9, node + 0.84, f"g{int(ids[r])}", ha="right", va="bottom", fontsize=fs - 3,
                    color=_text_color(col), alpha=0.8)
    for r in mine:
        node, local = divmod(r, gpn)
        ax.add_patch(Rectangle((local - 0.02, node - 0.02), 0.98, 0.94, fill=False, edgecolor="black", linewidth=2.2))
    node, local = divmod(rank, gpn)
    ax.text(local + 0.47, node + 0.86, "you", ha="center", va="bottom", fontsize=6, color="black", weight="bold")
    ax.set_xlim(-0.1, gpn)
    ax.set_ylim(nodes + 0.05, -0.15)
    ax.set_xticks([i + 0.47 for i in range(gpn)], [str(i) for i in range(gpn)], fontsize=7)
    step = max(1, nodes // 32)
    ax.set_yticks([i + 0.45 for i in range(0, nodes, step)], [f"node {i}" for i in range(0, nodes, step)], fontsize=7)
    ax.set_xlabel("local GPU (rank % gpus_per_node)", fontsize=8)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    size = int(lay.size(name))
    n_groups = world // size
    cycle = " (colours repeat; g<i> = group index)" if n_groups > len(_PALETTE) else ""
    ax.set_title(
        f"{plan.convention}: {label}.{name} groups ({n_groups} groups of {size}){cycle}\n"
        f"world {world} = {nodes} nodes x {gpn} GPUs; rank {rank}'s group outlined",
        fontsize=9,
    )
    return fig


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
        ax.text(-0.15, y + 0.31, f"{d} ({len(g)})\n{where}", ha="right", va="center", fontsize=7.5,
                weight="bold" if d == name else "normal")
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
# argument parsing
# -----------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that adds a one-line fix to its errors (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.stderr.write(f"fix: see `{self.prog} --help`; every degree is an integer, e.g. --tp 8\n")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rankmesh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{plan,bench}")
    sub.required = True
    q = sub.add_parser(
        "plan",
        help="print the layouts, groups, process-group count and topology of a configuration",
        description="Print the resolved degrees, every mesh and dim, one rank's groups, the process "
        "groups a rank creates and where the groups sit on the nodes; optionally draw it.",
    )
    q.__class__ = _Parser
    q.add_argument("--world-size", type=int, required=True, help="number of ranks (e.g. 131072)")
    q.add_argument("--tp", type=int, default=1, help="tensor parallel degree (default 1)")
    q.add_argument("--pp", type=int, default=1, help="pipeline parallel degree (default 1)")
    q.add_argument("--cp", type=int, default=1, help="context parallel degree (default 1)")
    q.add_argument("--ep", type=int, default=1, help="expert parallel degree (default 1)")
    q.add_argument("--dp-replicate", type=int, default=None, help="replicated data parallel degree (default 1)")
    q.add_argument("--dp-shard", type=int, default=None, help="sharded data parallel degree; -1 fills the rest (default)")
    q.add_argument("--etp", type=int, default=None, help="expert tensor parallel degree (torchtitan default 1, megatron default tp)")
    q.add_argument("--convention", choices=CONVENTIONS, default="torchtitan", help="mesh convention (default torchtitan)")
    q.add_argument("--order", default=None, help="megatron order, leftmost fastest (default tp-cp-ep-dp-pp)")
    q.add_argument("--rank", type=int, default=0, help="the rank whose groups to show (default 0)")
    q.add_argument(
        "--gpus-per-node", type=int, default=None, help="ranks per node (default: $LOCAL_WORLD_SIZE, else 8)"
    )
    q.add_argument(
        "--strict",
        nargs="?",
        const="",
        default=None,
        metavar="ep,cp",
        help="fail (status 2) when tp, or the listed bandwidth-hungry dims (ep, cp), span nodes",
    )
    q.add_argument("--picture", type=Path, default=None, metavar="OUT.png", help="draw the layout (matplotlib)")
    q.add_argument("--dim", default=None, help="dim to colour in the picture: tp or mesh.dim (default tp)")
    b = sub.add_parser("bench", help="benchmark against stock torch (rankmesh.bench); arguments pass through", add_help=False)
    b.add_argument("args", nargs=argparse.REMAINDER)
    return p


def _check_args(a: argparse.Namespace) -> tuple[int, tuple[str, ...] | None]:
    """Range checks with a fix for every flag; returns (gpus_per_node, strict families)."""
    if a.world_size < 1:
        raise BadInput(f"--world-size must be >= 1, got {a.world_size}", "pass the number of ranks, e.g. --world-size 131072")
    if a.world_size > PLAN_LIMIT:
        why = "ranks are int32 in torch" if a.world_size > MAX_WORLD_SIZE else "plan prints whole groups"
        raise BadInput(
            f"--world-size {a.world_size} is larger than rankmesh plan's limit of {PLAN_LIMIT} ranks ({why})",
            f"use --world-size <= {PLAN_LIMIT}",
        )
    for flag, what in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context"), ("ep", "expert")):
        v = getattr(a, flag)
        if v < 1:
            raise BadInput(f"--{flag} must be >= 1, got {v}", f"use --{flag} 1 to disable {what} parallelism")
    if a.dp_replicate is not None and a.dp_replicate < 1:
        raise BadInput(f"--dp-replicate must be >= 1, got {a.dp_replicate}", "use --dp-replicate 1 to disable replication")
    if a.dp_shard is not None and not (a.dp_shard == -1 or a.dp_shard >= 1):
        raise BadInput(f"--dp-shard must be -1 or >= 1, got {a.dp_shard}", "use --dp-shard -1 to shard over every rank left")
    if a.etp is not None and a.etp < 1:
        raise BadInput(f"--etp must be >= 1, got {a.etp}", "use --etp 1 (no expert tensor parallelism) or --etp equal to --tp")
    if not 0 <= a.rank < a.world_size:
        raise BadInput(
            f"--rank {a.rank} is outside the world [0, {a.world_size})", f"pass a rank between 0 and {a.world_size - 1}"
        )
    gpn = a.gpus_per_node
    a.gpn_note = None
    if gpn is None:
        env = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        gpn = int(env) if env.isdigit() and int(env) > 0 else 8
        source = "$LOCAL_WORLD_SIZE" if env.isdigit() and int(env) > 0 else "the default"
        if a.world_size % gpn:
            wanted, gpn = gpn, int(np.gcd(gpn, a.world_size))  # a default must not fail
            a.gpn_note = (
                f"{wanted} GPUs per node ({source}) does not divide the world; assuming {gpn} "
                "(pass --gpus-per-node)"
            )
    else:
        if gpn < 1:
            raise BadInput(f"--gpus-per-node must be >= 1, got {gpn}", "pass the ranks per node, e.g. --gpus-per-node 8")
        if a.world_size % gpn:
            raise BadInput(
                f"--world-size {a.world_size} is not a whole number of {gpn}-GPU nodes",
                f"make --world-size a multiple of {gpn}, or pass the real --gpus-per-node",
            )
    strict: tuple[str, ...] | None = None
    if a.strict is not None:
        fams = tuple(s.strip() for s in a.strict.split(",") if s.strip())
        bad = [f for f in fams if f not in ("tp", "ep", "cp")]
        if bad:
            raise BadInput(f"--strict names {bad[0]!r}; the bandwidth-hungry dims are tp, ep, cp", "use e.g. --strict ep,cp")
        strict = tuple(f for f in fams if f != "tp")
    if a.picture is not None:
        if a.picture.suffix.lower() not in (".png", ".svg", ".pdf", ".jpg", ".jpeg"):
            raise BadInput(
                f"--picture {str(a.picture)!r} has no image extension", "name the file with .png, .svg or .pdf, e.g. --picture mesh.png"
            )
        parent = a.picture.parent if str(a.picture.parent) else Path(".")
        if not parent.is_dir():
            raise BadInput(f"--picture: the folder {str(parent)!r} does not exist", f"create it first, or write to ./{a.picture.name}")
    if a.dim is not None and a.picture is None:
        raise BadInput("--dim only chooses what --picture colours", "add --picture out.png, or drop --dim")
    return gpn, strict


_FIX_BY_FIELD = {
    "order": "write the order as names joined by '-', each of tp, cp, ep, dp, pp once, e.g. --order tp-cp-ep-dp-pp",
    "world_size": "make --world-size a multiple of the product of the degrees",
    "num_distributed_optimizer_instances": "make the data-parallel size divisible by the instances",
}


def _plan(a: argparse.Namespace, out: TextIO) -> int:
    gpn, strict = _check_args(a)
    try:
        plan = build_plan(
            a.convention, a.world_size, tp=a.tp, pp=a.pp, cp=a.cp, ep=a.ep,
            dp_replicate=a.dp_replicate, dp_shard=a.dp_shard, etp=a.etp, order=a.order,
        )  # fmt: skip
    except RankmeshError as e:
        fix = _FIX_BY_FIELD.get(e.field)
        if e.field == "order" and isinstance(e, ParallelConfigError):
            fix = "name every dim of size > 1 in --order and end it with pp, e.g. --order tp-cp-ep-dp-pp"
        if fix is None:
            fix = "pass --dp-shard -1 to fill the rest" if e.field in ("world_size", "dp_shard") else (
                "adjust the degrees so that they multiply to --world-size"
            )
        raise BadInput(str(e), fix) from e
    if a.dim is not None:
        plan.find_dim(a.dim)  # validate before printing
    if a.gpn_note:
        plan.notes.append(a.gpn_note)
    code = _print_plan(plan, a.rank, gpn, out, strict=strict)
    if a.picture is not None:
        what = draw_picture(plan, a.rank, gpn, a.dim, a.picture)
        out.write(f"\npicture: {a.picture} ({what})\n")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rankmesh`` command; returns the exit status (0 ok, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from rankmesh import bench

        return int(bench.main(argv[1:]) or 0)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    try:
        return _plan(args, sys.stdout)
    except BadInput as e:
        sys.stdout.flush()
        sys.stderr.write(f"rankmesh plan: error: {e.message}\nfix: {e.fix}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
