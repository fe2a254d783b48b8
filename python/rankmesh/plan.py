"""Plan a parallel layout before launching: the meshes of one convention, one rank's groups, the
process groups a rank creates and where the groups sit on the nodes, all without torch.

This is what ``rankmesh plan`` prints (:mod:`rankmesh.cli` only parses the command line).
:func:`build_plan` resolves the degrees with the convention's own checks (torchtitan's
``ParallelDims``, Megatron's ``initialize_model_parallel``, the single mesh) and raises their
typed :class:`~rankmesh.errors.RankmeshError`; :func:`count_process_groups` counts groups by
the rule :class:`~rankmesh.process_groups.MeshBuilder` creates them by
(:func:`rankmesh._groups.group_key`); :func:`format_group` abbreviates a group;
:func:`format_plan` is the whole text. ``rankmesh plan --mesh``'s job of disjoint meshes, each
over part of the world, is :mod:`rankmesh.job_plan`, whose names are importable from here too::

    >>> from rankmesh.plan import build_plan, count_process_groups, format_group, format_plan
    >>> plan = build_plan("torchtitan", 64, tp=4, pp=2)
    >>> plan.degrees
    {'pp': 2, 'dp_replicate': 1, 'dp_shard': 8, 'cp': 1, 'tp': 4, 'ep': 1, 'etp': 1}
    >>> format_group(plan.meshes["dense"].group(13, "tp"))
    '[12, 13, 14, 15] (4 ranks)'
    >>> count = count_process_groups(plan)
    >>> count.created, len(count.real), len(count.fake), count.shared()[0]
    (10, 4, 6, ['dataloading.pp', 'dense.pp', 'sparse.pp'])
    >>> text = format_plan(plan, 13, plan_topology(plan, 13, gpus_per_node=8))
    >>> print(text.splitlines()[0])
    rankmesh plan: torchtitan convention, world of 64 ranks, rank 13
    >>> build_plan("torchtitan", 64, tp=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rankmesh.errors.ParallelDimsError: Parallelism degree should be >= 1, except for dp_shard: tp = 0; use 1 to ...
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rankmesh._check import check_str
from rankmesh._groups import DEFAULT, group_key, is_fake
from rankmesh._native import MeshLayout
from rankmesh._plan_parts import WHOLE_WORLD_LIMIT, GroupCount, format_group
from rankmesh.errors import ParallelConfigError, UnknownNameError, arg
from rankmesh.job_plan import (  # the job of disjoint meshes (--mesh), importable from here too
    DEGREE_NAMES,
    MESH_SYNTAX,
    JobPlan,
    PlacedMesh,
    build_job_plan,
    count_mesh_groups,
    format_job_plan,
    job_topology,
)
from rankmesh.megatron import DEFAULT_ORDER, model_parallel_layout
from rankmesh.single import single_mesh
from rankmesh.topology import TopologyReport, topology_report
from rankmesh.torchtitan import layouts

__all__ = [
    "CONVENTIONS",
    "DEGREE_NAMES",
    "MESH_SYNTAX",
    "GroupCount",
    "JobPlan",
    "PlacedMesh",
    "Plan",
    "build_job_plan",
    "build_plan",
    "count_mesh_groups",
    "count_process_groups",
    "format_group",
    "format_job_plan",
    "format_plan",
    "job_topology",
    "plan_topology",
]

CONVENTIONS = ("torchtitan", "megatron", "single")


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
        has size > 1, else the first holding it. Raises :class:`~rankmesh.errors.UnknownNameError`."""
        check_str(dim, "dim")
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
        first = self.dims()[0]
        raise UnknownNameError(
            f"{dim!r} is not a dim of the {self.convention} plan; use one of {', '.join(choices)} "
            f"(or mesh.dim, e.g. {first[0]}.{first[1]})",
            field="dim",
            value=dim,
            fix=f"pass a dim of the plan (e.g. {{dim={first[1]}}}) or mesh.dim (e.g. {{dim={first[0]}.{first[1]}}})",
        )


def _torchtitan_plan(
    world: int, tp: int, pp: int, cp: int, ep: int, dp_replicate: int, dp_shard: int, etp: int
) -> Plan:
    """torchtitan's ParallelDims (dp_shard=-1 fills the rest) and its meshes, as layouts."""
    d = layouts.resolve_degrees(
        dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp, world_size=world
    )
    deg = layouts.degrees(**d)
    dp_shard = d["dp_shard"]
    built = layouts.layouts(world, deg, loss_name="loss")
    meshes = {k: built[k] for k in ("dataloading", "loss", "dense", "sparse")}
    fake = {k: layouts.fake_dims(k, lay, ep) for k, lay in meshes.items()}
    degrees = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp, "ep": ep, "etp": etp}
    derived = {
        "batch": f"{deg['batch']} (dp_replicate*dp_shard)",
        "loss": f"{deg['loss']} (batch*cp)",
        "fsdp": f"{deg['fsdp']} (dp_shard*cp)",
        "efsdp": f"{deg['efsdp']} (fsdp*tp/(etp*ep))",
    }
    notes = ["batch is count-only (fake backend), as in torchtitan; so are size-1 dims and efsdp while ep = 1"]
    return Plan("torchtitan", world, degrees, derived, meshes, fake, notes=notes)


def _megatron_plan(world: int, tp: int, pp: int, cp: int, ep: int, etp: int | None, order: str) -> Plan:
    m = model_parallel_layout(world, tp, pp, cp, ep, etp, order)
    meshes: dict[str, MeshLayout] = {
        "decoder": m.decoder.mesh_layout,
        "expert": m.expert.mesh_layout,
    }
    extra: dict[str, object] = {}
    for name in m.group_names:
        lay = m.layout(name)
        if lay is None:
            extra[name] = m
        else:  # one 1-D "mesh" per named group, so every group is listed, counted and placed
            meshes[name] = lay.flatten(name) if lay.names[0] != name else lay
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


def _single_plan(world: int, tp: int, pp: int, cp: int, ep: int, dp_replicate: int, dp_shard: int) -> Plan:
    s = single_mesh(world, pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, ep=ep, tp=tp, cp=cp)
    degrees = s.degrees
    dropped = [n for n in degrees if n not in s.names]
    notes = [f"dims of size 1 dropped: {', '.join(dropped)}"] if dropped else []
    if "dp_shard" in s.names and s.dp_shard == 1:
        notes.append("dp_shard kept at size 1 next to tp/ep (FSDP needs a shard dim)")
    fake = {"mesh": frozenset(n for n, size in zip(s.names, s.shape) if size == 1)}
    derived = {"dp": f"{s.dp_size} (dp_replicate*dp_shard)"}
    return Plan("single", world, degrees, derived, {"mesh": s.layout}, fake, notes=notes)


def _not_for(name: str, value: object, convention: str, why: str = "") -> ParallelConfigError:
    fix = "drop {" + name + "}" + (", or pass {convention=megatron}" if name == "order" else "")
    return ParallelConfigError(
        f"{arg(name)} does not apply to the {convention} convention{why}",
        field=name,
        value=value,
        kind="not_for_convention",
        ctx={"convention": convention},
        fix=fix,
    )


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
    """The layouts of one convention: ``"torchtitan"`` (``dp_replicate`` default 1, ``dp_shard``
    default -1, ``etp`` default 1), ``"megatron"`` (dp derived, ``etp`` default tp, ``order``
    default ``tp-cp-ep-dp-pp``) or ``"single"`` (no cp, no etp).

    Degrees are checked by the convention itself, with its typed errors: torchtitan's
    :class:`~rankmesh.errors.ParallelDimsError`, Megatron's
    :class:`~rankmesh.errors.ParallelConfigError` family, the single mesh's size errors. A
    parameter the convention does not have raises :class:`~rankmesh.errors.ParallelConfigError`
    (``field`` is its name); an unknown convention :class:`~rankmesh.errors.UnknownNameError`.
    """
    if convention == "torchtitan":
        if order is not None:
            raise _not_for("order", order, convention, " (only to megatron)")
        return _torchtitan_plan(
            world_size,
            tp,
            pp,
            cp,
            ep,
            1 if dp_replicate is None else dp_replicate,
            -1 if dp_shard is None else dp_shard,
            1 if etp is None else etp,
        )
    if convention == "megatron":
        why = " (dp = world/(tp*pp*cp) is derived)"
        if dp_replicate is not None:
            raise _not_for("dp_replicate", dp_replicate, convention, why)
        if dp_shard is not None:
            raise _not_for("dp_shard", dp_shard, convention, why)
        return _megatron_plan(world_size, tp, pp, cp, ep, etp, DEFAULT_ORDER if order is None else order)
    if convention == "single":
        if order is not None:
            raise _not_for("order", order, convention, " (only to megatron)")
        if etp is not None:
            raise _not_for("etp", etp, convention, " (it has no expert-tp dim)")
        return _single_plan(
            world_size,
            tp,
            pp,
            cp,
            ep,
            1 if dp_replicate is None else dp_replicate,
            -1 if dp_shard is None else dp_shard,
        )
    raise UnknownNameError(
        f"unknown convention {convention!r}; use one of {', '.join(CONVENTIONS)}", field="convention", value=convention
    )


# -----------------------------------------------------------------------------------------------
# process-group count (from modes, no torch)
# -----------------------------------------------------------------------------------------------


def count_process_groups(plan: Plan) -> GroupCount:
    """What rankmesh's torch layer creates for the plan, by its rule
    (:func:`rankmesh._groups.group_key`): dims spanning the world reuse the default group; other
    dims get one group per distinct partition and backend (fake for count-only and size-1 dims),
    and, for the DeviceMesh conventions (torchtitan, single), per dim name."""
    groups: dict[tuple, list[str]] = {}
    default: list[str] = []
    for label, lay in plan.built().items():
        for i, name in enumerate(lay.names):
            tag = plan.tag(label, name)
            fake = name in plan.fake.get(label, ())
            # DeviceMesh dims (torchtitan, single) share a group only under one name; Megatron's
            # groups are plain process groups, shared by partition.
            dim_name = None if plan.convention == "megatron" else name
            key = group_key(lay, i, world_size=plan.world_size, fake=fake, mesh_dim_name=dim_name)
            if key == DEFAULT:
                default.append(tag)
            else:
                groups.setdefault(key, []).append(tag)
    real = [tags for key, tags in groups.items() if not is_fake(key)]
    fake = [tags for key, tags in groups.items() if is_fake(key)]
    return GroupCount(real, fake, default)


# -----------------------------------------------------------------------------------------------
# text
# -----------------------------------------------------------------------------------------------


def plan_topology(
    plan: Plan, rank: int, gpus_per_node: int | None = None, *, strict_dims: Iterable[str] | None = None
) -> TopologyReport:
    """:func:`rankmesh.topology_report` of the plan's built meshes for ``rank`` (the whole-world
    check up to :data:`WHOLE_WORLD_LIMIT` ranks). With ``strict_dims`` (families besides tp,
    e.g. ``("ep", "cp")``; ``()`` for tp alone) it is strict: raises
    :class:`~rankmesh.errors.TopologyError` when a bandwidth-hungry dim spans nodes."""
    return topology_report(
        plan.built(),
        rank,
        gpus_per_node,
        whole_world=plan.world_size <= WHOLE_WORLD_LIMIT,
        strict=strict_dims is not None,
        strict_dims=() if strict_dims is None else tuple(strict_dims),
    )


def format_plan(plan: Plan, rank: int, report: TopologyReport) -> str:
    """The text of ``rankmesh plan``: degrees, meshes, ``rank``'s groups, the process-group count
    and ``report`` (from :func:`plan_topology`)."""
    lines: list[str] = []
    w = lines.append
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
        sizes = [(n, int(lay.size(i))) for i, n in enumerate(lay.names)]
        dims = ", ".join(f"{n}={size}{'*' if (n in fake or size == 1) else ''}" for n, size in sizes)
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
        g = m.group(rank=rank, name=name)  # type: ignore[attr-defined]
        txt = format_group(g) if g is not None else f"- (rank {rank} holds no {name})"
        w(f"  {name:<{tw}}  {txt}  (not a partition of the world)\n")

    count = count_process_groups(plan)
    w(
        f"\nprocess groups per rank: {count.created} ({len(count.real)} real + {len(count.fake)} fake), "
        f"one per distinct rank partition{'' if plan.convention == 'megatron' else ' and dim name'}\n"
    )
    for g in count.shared():
        w(f"  shared: {' = '.join(g)}\n")
    if count.default:
        w(f"  default group (whole world): {', '.join(count.default)}\n")
    if plan.extra_groups:
        w(f"  plus {', '.join(plan.extra_groups)}: subsets of the world, created by their members only\n")

    w(f"\ntopology: {report.format()}\n")
    if not report.whole_world:
        w(f"  (whole-world check skipped above {WHOLE_WORLD_LIMIT} ranks)\n")
    return "".join(lines)
