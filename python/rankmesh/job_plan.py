"""A job of disjoint meshes, each over part of the world (``rankmesh plan --mesh``), without
torch: :func:`build_job_plan` reads each mesh written as :data:`MESH_SYNTAX` (``NAME=START:STOP
[:STEP][:DIM=SIZE,...]``) and places it in the world, :func:`count_mesh_groups` counts the process
groups ``init_device_mesh(..., ranks=...)`` creates for one mesh, :func:`job_topology` places a
rank's groups on the nodes and :func:`format_job_plan` is the whole text. Also importable from
:mod:`rankmesh.plan`, beside the plan of one convention over the whole world.
"""

from __future__ import annotations

import difflib
import math
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field

from rankmesh._check import as_sequence, check_str, divisors_near, positive_int
from rankmesh._groups import DEFAULT, group_key, is_fake
from rankmesh._native import MAX_WORLD_SIZE, MeshLayout, Slice
from rankmesh._plan_parts import WHOLE_WORLD_LIMIT, GroupCount, format_group
from rankmesh.errors import (
    DuplicateNameError,
    InvalidSizeError,
    MeshArgumentError,
    RankmeshError,
    RankOutOfRangeError,
    SizeMismatchError,
    UnknownNameError,
    arg,
)
from rankmesh.topology import TopologyReport, topology_report, whole_nodes

__all__ = [
    "DEGREE_NAMES",
    "MESH_SYNTAX",
    "JobPlan",
    "PlacedMesh",
    "build_job_plan",
    "count_mesh_groups",
    "format_job_plan",
    "job_topology",
]

#: The dims a mesh spec may name (``dp-replicate`` is read as ``dp_replicate``).
DEGREE_NAMES = ("pp", "dp", "dp_replicate", "dp_shard", "fsdp", "cp", "tp", "ep", "etp")
#: How one mesh of a job is written: a label, the ranks as Python's ``range(START, STOP, STEP)``,
#: and its dims slowest first (one size may be -1: the rest); no dims: the 1-D mesh ``world``.
MESH_SYNTAX = "NAME=START:STOP[:STEP][:DIM=SIZE,...]"
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_INT = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class PlacedMesh:
    """One mesh of a job: the ``spec`` as written, its ``label``, its ranks (a ``range``, O(1))
    and its layout over them, ``MeshLayout.placed(world, start, [(len, step)])`` unflattened into
    its dims; what ``init_device_mesh(..., ranks=ranks)`` builds."""

    spec: str
    label: str
    ranks: range
    layout: MeshLayout

    def span(self) -> str:
        """``0..7``, or ``1..15 step 2``."""
        r = self.ranks
        return f"{r[0]}..{r[-1]}" + (f" step {r.step}" if r.step > 1 else "")

    def dims(self) -> str:
        """``dp=2, tp=4``; a size-1 dim (a fake-backend group) starred."""
        sizes = zip(self.layout.names, self.layout.shape)
        return ", ".join(f"{n}={size}{'*' if size == 1 else ''}" for n, size in sizes)


@dataclass
class JobPlan:
    """The disjoint meshes of one job of ``world_size`` ranks, by label (:func:`build_job_plan`)."""

    world_size: int
    meshes: dict[str, PlacedMesh]
    notes: list[str] = field(default_factory=list)

    def mesh_of(self, rank: int) -> PlacedMesh | None:
        """The mesh holding ``rank``, or None (O(meshes))."""
        return next((m for m in self.meshes.values() if m.layout.is_member(rank)), None)

    @property
    def outside(self) -> int:
        """Ranks of the world in no mesh."""
        return self.world_size - sum(len(m.ranks) for m in self.meshes.values())

    def find_dim(self, dim: str) -> tuple[str, str]:
        """``"tp"`` or ``"teachers.tp"`` -> (mesh label, dim name): the first mesh holding it.
        Raises :class:`~rankmesh.errors.UnknownNameError`."""
        check_str(dim, "dim")
        label, _, name = dim.rpartition(".")
        for m in self.meshes.values():
            if name in m.layout.names and label in ("", m.label):
                return m.label, name
        first = next(iter(self.meshes.values()))
        choices = sorted({n for m in self.meshes.values() for n in m.layout.names})
        raise UnknownNameError(
            f"{dim!r} is not a dim of the job's meshes; use one of {', '.join(choices)} "
            f"(or mesh.dim, e.g. {first.label}.{first.layout.names[-1]})",
            field="dim",
            value=dim,
            fix=f"pass a dim of a mesh, e.g. {{dim={first.layout.names[-1]}}}",
        )


def _mesh_error(cls: type[RankmeshError], spec: str, why: str, fix: str, *, kind: str | None = None) -> RankmeshError:
    """An error of one mesh spec: the message names it as ``mesh 'spec'`` (``rankmesh plan``
    prints ``--mesh 'spec'``), ``field`` is ``"mesh"`` and ``value`` the spec."""
    return cls(f"{arg('mesh', f'mesh {spec!r}', repr(spec))}: {why}", field="mesh", value=spec, kind=kind, fix=fix)


def _spec(label: str, r: range, dims: Sequence[tuple[str, int]]) -> str:
    """The spec text of a mesh (for fixes)."""
    step = f":{r.step}" if r.step != 1 else ""
    degrees = ":" + ",".join(f"{n}={s}" for n, s in dims) if dims else ""
    return f"{label}={r.start}:{r[-1] + 1 if r else r.stop}{step}{degrees}"


def _ranks_from(start: int, step: int, n: int) -> range:
    """``n`` ranks from ``start``, ``step`` apart (for a fix; the range does the arithmetic)."""
    return range(start, MAX_WORLD_SIZE + start + 1, step)[:n]


#: Names of parallelisms a mesh spec may try that are no dim here, and the dim that does their work.
_ALIASES = {
    "sp": "cp",
    "seq": "cp",
    "sequence": "cp",
    "context": "cp",
    "tensor": "tp",
    "mp": "tp",
    "pipeline": "pp",
    "data": "dp",
    "expert": "ep",
    "replicate": "dp_replicate",
    "shard": "dp_shard",
}


def _closest_dim(name: str, taken: Sequence[str]) -> str | None:
    """The accepted dim name closest to ``name`` (one a spec may try: ``sp`` is ``cp``'s work, else
    difflib's nearest) that the spec does not name already; None when none is close."""
    free = [n for n in DEGREE_NAMES if n not in taken]
    alias = _ALIASES.get(name.lower())
    if alias in free:
        return alias
    close = difflib.get_close_matches(name, free, n=1)
    return close[0] if close else None


def _label_like(label: str) -> str:
    """A mesh name like ``label`` (letters, digits, ``_`` and ``-``, a letter first), for a fix."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", label)
    return clean if _LABEL.fullmatch(clean) else "mesh" if not clean or ":" in label else f"m{clean}"


def _parse_mesh(spec: str, world: int) -> tuple[str, range, list[tuple[str, int]]]:
    """``students=0:8:dp=2,tp=4`` -> ``("students", range(0, 8), [("dp", 2), ("tp", 4)])``,
    checked against a world of ``world`` ranks (sizes not yet against the range). Each fault's fix
    is the spec mended, as a ``{mesh=...}`` a command can take."""
    check_str(spec, "mesh")
    label, eq, rest = spec.partition("=")
    if not eq or not _LABEL.fullmatch(label):
        nameless = not eq or not label or ":" in label
        why = "it has no NAME= before the ranks" if nameless else f"{label!r} is not a mesh name"
        named = f"mesh={spec}" if not eq or ":" in label else f"{_label_like(label)}={rest}"
        raise _mesh_error(
            MeshArgumentError,
            spec,
            f"{why}; write {MESH_SYNTAX}",
            f"name the mesh with a letter first, then its ranks, e.g. {{mesh={named}}}",
            kind="mesh_syntax",
        )
    example = f"{{mesh={label}=0:{max(1, world // 2)}:dp=-1}}"
    parts = rest.split(":")
    dims_text = parts.pop() if "=" in parts[-1] else None
    if len(parts) not in (2, 3) or not all(_INT.fullmatch(p) for p in parts):
        raise _mesh_error(
            MeshArgumentError,
            spec,
            f"{rest!r} is not START:STOP[:STEP][:DIM=SIZE,...] with integer ranks",
            f"write the ranks as START:STOP (STOP excluded) and the dims last, e.g. {example}",
            kind="mesh_syntax",
        )
    start, stop, step = (int(p) for p in parts + ["1"] * (3 - len(parts)))
    items = [] if dims_text is None else dims_text.split(",")

    def mended(k: int, item: str | None) -> str:
        """The spec with dim item ``k`` replaced by ``item`` (None: dropped), as a fix's ``{mesh=...}``."""
        kept = [x for i, x in enumerate(items) if i != k] if item is None else items[:k] + [item] + items[k + 1 :]
        return "{mesh=" + f"{label}={':'.join(parts)}" + (f":{','.join(kept)}" if kept else "") + "}"

    dims: list[tuple[str, int]] = []
    for k, item in enumerate(items):
        name, eq, size = item.partition("=")
        name = name.replace("-", "_")
        if not eq or not _INT.fullmatch(size):
            fix = "give the dims as DIM=SIZE, comma-separated, slowest first"
            fix += f", e.g. {mended(k, f'{name}=-1')}" if name in DEGREE_NAMES and eq == "" else f", e.g. {example}"
            raise _mesh_error(MeshArgumentError, spec, f"{item!r} is not DIM=SIZE", fix, kind="mesh_syntax")
        if name not in DEGREE_NAMES:
            taken = [x.partition("=")[0].replace("-", "_") for x in items]
            close = _closest_dim(name, taken)
            if close is not None:
                fix = f"did you mean {close}? e.g. {mended(k, f'{close}={size}')}"
            else:
                fix = f"name each dim one of {', '.join(DEGREE_NAMES)}, or drop {name}: {mended(k, None)}"
            raise _mesh_error(
                UnknownNameError,
                spec,
                f"{name!r} is not a dim name; the accepted names are {', '.join(DEGREE_NAMES)}",
                fix,
            )
        if name in (n for n, _ in dims):
            once = f"give {name} once: {mended(k, None)}"
            raise _mesh_error(DuplicateNameError, spec, f"it names {name} twice", once)
        if int(size) < 1 and int(size) != -1:
            fix = f"use {name}=1 for no {name}: {mended(k, f'{name}=1')}"
            if not any(x.partition("=")[2] == "-1" for x in items):
                fix += f", or {name}=-1 for the ranks the other dims leave: {mended(k, f'{name}=-1')}"
            raise _mesh_error(
                InvalidSizeError,
                spec,
                f"{name}={size}: a size is >= 1 (or -1: the rest)",
                fix,
                kind="degree_not_positive",
            )
        dims.append((name, int(size)))
    if step < 1:
        raise _mesh_error(
            InvalidSizeError,
            spec,
            f"step {step} is not >= 1",
            f"use a step >= 1 (1: every rank), e.g. {{mesh={_spec(label, range(start, stop), dims)}}}",
            kind="empty_mesh",
        )
    ranks = range(start, stop, step)
    if not ranks:
        need = math.prod(size for _, size in dims if size > 0)
        turned = range(stop, start, step) if stop < start else _ranks_from(start, step, need)
        raise _mesh_error(
            InvalidSizeError,
            spec,
            f"range({start}, {stop}, {step}) holds no rank",
            f"put STOP after START, e.g. {{mesh={_spec(label, turned, dims)}}}",
            kind="empty_mesh",
        )
    if start < 0 or ranks[-1] >= world:
        where = f"starts at {start}" if start < 0 else f"reaches rank {ranks[-1]}"
        moved = _ranks_from(0, step, len(ranks)) if start < 0 else range(world - 1, -1, -step)[: len(ranks)][::-1]
        fix = f"keep its ranks in 0..{world - 1} (STOP is excluded: at most {world})"
        if len(moved) == len(ranks) and moved[-1] < world:
            fix += f", e.g. {{mesh={_spec(label, moved, dims)}}}"
        if start >= 0:
            fix += f", or pass a larger {{world_size={ranks[-1] + 1}}}"
        raise _mesh_error(
            RankOutOfRangeError,
            spec,
            f"it {where}, outside the world of {world} ranks (0..{world - 1})",
            fix,
        )
    return label, ranks, dims


def _fitted(dims: list[tuple[str, int]], n: int) -> list[tuple[str, int]]:
    """``dims`` mended to fit ``n`` ranks: one dim takes the rest (-1: the one given, else the first
    whose others divide ``n``, else the first) and each other size that does not divide what is
    left becomes the nearest one that does (:func:`~rankmesh._check.divisors_near`)."""
    sizes = [size for _, size in dims]
    fill = (
        sizes.index(-1)
        if -1 in sizes
        else next((i for i in range(len(dims)) if n % math.prod(sizes[:i] + sizes[i + 1 :]) == 0), 0)
    )
    left, out = n, []
    for i, (name, size) in enumerate(dims):
        if i != fill and left % size:
            size = divisors_near(left, size)[0]
        if i != fill:
            left //= size
        out.append((name, -1 if i == fill else size))
    return out


def _sizes(spec: str, label: str, ranks: range, dims: list[tuple[str, int]], world: int) -> list[tuple[str, int]]:
    """The dims with -1 resolved; their product must be the number of ranks (no dims: 1-D). A fix
    gives the mesh the ranks its sizes need (a larger world where it must), or sizes that fit its
    ranks."""
    n = len(ranks)
    rest = [name for name, size in dims if size == -1]
    given = [(name, size) for name, size in dims if size != -1]
    known = math.prod(size for _, size in given)
    if len(rest) > 1:
        one = [(name, 1 if name in rest[1:] else size) for name, size in dims]
        raise _mesh_error(
            SizeMismatchError,
            spec,
            f"{' and '.join(rest)} are both -1; one dim at most takes the rest",
            f"give every size but one, e.g. {{mesh={_spec(label, ranks, one)}}}",
        )
    if not dims or (rest and n % known == 0) or (not rest and known == n):
        return [(name, n // known if size == -1 else size) for name, size in dims]
    if len(given) == 1:
        product = f"{given[0][0]}={known}"
    else:
        product = f"{'*'.join(name for name, _ in given)} = {'*'.join(str(size) for _, size in given)} = {known}"
    what = "does not divide" if rest else "is not"
    need = known * -(-n // known) if rest else known  # the ranks the sizes need (a multiple of known, with -1)
    grown = _ranks_from(ranks.start, ranks.step, need)
    wider = f" and {{world_size={grown[-1] + 1}}}" if grown[-1] >= world else ""
    fix = f"give it {need} ranks: {{mesh={_spec(label, grown, dims)}}}{wider}, or " if len(grown) == need else ""
    fix += f"sizes that multiply to its {n} ranks: {{mesh={_spec(label, ranks, _fitted(dims, n))}}}"
    raise _mesh_error(SizeMismatchError, spec, f"{product} {what} its {n} ranks ({ranks[0]}..{ranks[-1]})", fix)


def build_job_plan(world_size: int, meshes: Sequence[str]) -> JobPlan:
    """The disjoint meshes of a job of ``world_size`` ranks, each written as
    :data:`MESH_SYNTAX`; each layout is ``MeshLayout.placed(world, start, [(len, step)])``
    unflattened into its dims (O(ndim), whatever the world). Knowledge distillation on 16 ranks,
    students on ranks 0-7 as (dp, tp), teachers on 8-15::

        >>> job = build_job_plan(16, ["students=0:8:dp=2,tp=4", "teachers=8:16:dp=-1,tp=2"])
        >>> t = job.meshes["teachers"]
        >>> t.span(), t.dims(), t.layout.group(13, "tp").tolist(), job.mesh_of(3).label
        ('8..15', 'dp=4, tp=2', [12, 13], 'students')
        >>> build_job_plan(16, ["students=0:10:dp=2,tp=4"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rankmesh.errors.SizeMismatchError: mesh 'students=0:10:dp=2,tp=4': dp*tp = 2*4 = 8 is not its 10 ranks (0..9)

    Each spec's faults are typed errors with ``field="mesh"`` and ``value`` the spec: syntax
    (:class:`~rankmesh.errors.MeshArgumentError`), an empty range or a size < 1 but -1
    (:class:`~rankmesh.errors.InvalidSizeError`), ranks outside the world
    (:class:`~rankmesh.errors.RankOutOfRangeError`), a dim not in :data:`DEGREE_NAMES`
    (:class:`~rankmesh.errors.UnknownNameError`), sizes that do not multiply to the ranks
    (:class:`~rankmesh.errors.SizeMismatchError`), a label or dim given twice
    (:class:`~rankmesh.errors.DuplicateNameError`), meshes sharing a rank
    (:class:`~rankmesh.errors.MeshArgumentError`, kind ``"meshes_overlap"``).
    """
    world = positive_int(world_size, "world_size")
    meshes = as_sequence(meshes, "meshes", "mesh specs (str)")
    if not meshes:
        raise MeshArgumentError(
            "a job needs at least one mesh", field="mesh", value=meshes, fix=f"give each mesh as {MESH_SYNTAX}"
        )
    out: dict[str, PlacedMesh] = {}
    given: dict[str, list[tuple[str, int]]] = {}  # each mesh's dims as given (-1 resolved), for fixes
    for spec in meshes:
        label, ranks, dims = _parse_mesh(spec, world)
        dims = _sizes(spec, label, ranks, dims, world)
        if label in out:
            raise _mesh_error(
                DuplicateNameError,
                spec,
                f"a second mesh named {label!r}",
                f"name each mesh once, e.g. {{mesh={label}2{spec[len(label) :]}}}",
            )
        for other in out.values():
            shared = Slice.of_range(other.ranks).first_shared_rank(Slice.of_range(ranks))  # O(log step)
            if shared is None:
                continue
            # the mesh that starts later moves after the other, keeping its sizes
            (a, ra, _), (b, rb, b_dims) = sorted(
                [(other.label, other.ranks, given[other.label]), (label, ranks, dims)], key=lambda m: m[1].start
            )
            moved = _ranks_from(ra[-1] + 1, rb.step, len(rb))
            wider = f" and {{world_size={moved[-1] + 1}}}" if moved[-1] >= world else ""
            fix = f"give each mesh ranks of its own, e.g. move {b} after {a}: {{mesh={_spec(b, moved, b_dims)}}}{wider}"
            raise _mesh_error(
                MeshArgumentError,
                spec,
                f"it shares rank {shared} with {arg('mesh', f'mesh {other.spec!r}', repr(other.spec))} "
                f"({other.span()}); the meshes of a job are disjoint",
                fix,
                kind="meshes_overlap",
            )
        layout = MeshLayout.placed(world, ranks.start, [(len(ranks), ranks.step)])
        if dims:
            layout = layout.unflatten("world", [s for _, s in dims], [n for n, _ in dims])
        out[label] = PlacedMesh(spec, label, ranks, layout)
        given[label] = dims
    return JobPlan(world, out)


def count_mesh_groups(job: JobPlan, label: str) -> GroupCount:
    """The process groups ``init_device_mesh(..., ranks=...)`` creates for one mesh of the job,
    by rankmesh's rule (:func:`rankmesh._groups.group_key`: one per distinct partition and dim
    name; size-1 dims on the fake backend; keys hold the placement, so no two meshes share).
    A member creates them; any other rank takes the same steps without joining (a one-rank fake
    placeholder each on the new_group path, its part of an NCCL split on the split path)."""
    lay = job.meshes[label].layout
    keys: dict[tuple, list[str]] = {}
    default: list[str] = []
    for i, name in enumerate(lay.names):
        key = group_key(lay, i, world_size=job.world_size, mesh_dim_name=name)
        (default if key == DEFAULT else keys.setdefault(key, [])).append(f"{label}.{name}")
    real = [tags for key, tags in keys.items() if not is_fake(key)]
    fake = [tags for key, tags in keys.items() if is_fake(key)]
    return GroupCount(real, fake, default)


def job_topology(job: JobPlan, rank: int, gpus_per_node: int) -> TopologyReport:
    """Where ``rank``'s groups sit on nodes of ``gpus_per_node`` ranks (node of rank r:
    ``r // gpus_per_node``): its mesh's dims, none when it is in no mesh; every group of the mesh
    too up to :data:`WHOLE_WORLD_LIMIT` ranks. Raises :class:`~rankmesh.errors.TopologyError`
    when the world is not a whole number of nodes."""
    gpn = whole_nodes(job.world_size, gpus_per_node)
    whole = job.world_size <= WHOLE_WORLD_LIMIT
    mine = job.mesh_of(rank)
    if mine is not None:  # its mesh, placed in the job: topology's own report
        return topology_report({mine.label: mine.layout}, rank, gpn, whole_world=whole)
    return TopologyReport(gpn, job.world_size // gpn, rank, rank // gpn, (), whole)


def format_job_plan(job: JobPlan, rank: int, report: TopologyReport) -> str:
    """The text of ``rankmesh plan --mesh ...``: a line per mesh (ranks, dims, the process groups
    ``rank`` creates for it), ``rank``'s mesh, coordinate and groups, and ``report`` (from
    :func:`job_topology`)::

        >>> job = build_job_plan(16, ["students=0:8:dp=2,tp=4", "teachers=8:16:dp=4,tp=2"])
        >>> text = format_job_plan(job, 13, job_topology(job, 13, 8))
        >>> print(text[text.index("rank 13 is in"):text.index("process groups on")].strip())
        rank 13 is in teachers, at dp=2, tp=1
          teachers.dp  [9, 11, 13, 15] (4 ranks)
          teachers.tp  [12, 13] (2 ranks)
          students     - (not a member: its ranks are 0..7)
    """
    lines: list[str] = []
    w = lines.append
    n = len(job.meshes)
    w(f"rankmesh plan: {n} mesh{'es' if n > 1 else ''} over a world of {job.world_size} ranks, rank {rank}\n\n")
    w("meshes (dims slowest first; * = size 1, fake backend)\n")
    mine = job.mesh_of(rank)
    width = max(len(label) for label in job.meshes)
    spans = [f"ranks {m.span()}" for m in job.meshes.values()]
    sw, dw = max(map(len, spans)), max(len(m.dims()) + 2 for m in job.meshes.values())
    counts = {label: count_mesh_groups(job, label) for label in job.meshes}
    for (label, m), span in zip(job.meshes.items(), spans):
        c = counts[label]
        if m is mine:
            here = f"rank {rank} creates {c.created} process group{'s' if c.created != 1 else ''}"
            here += f" ({len(c.real)} real + {len(c.fake)} fake)"
        else:
            here = f"rank {rank} is not a member: {c.created} placeholder{'s' if c.created != 1 else ''}"
        w(f"  {label:<{width}}  {span:<{sw}}  {'[' + m.dims() + ']':<{dw}}  {here}\n")
    if job.outside:
        w(f"  {job.outside} of the world's ranks are in no mesh\n")
    else:
        w("  every rank of the world is in one mesh\n")
    for note in job.notes:
        w(f"  note: {note}\n")

    if mine is None:
        w(f"\nrank {rank} is in no mesh\n")
    else:
        coord = ", ".join(f"{d}={c}" for d, c in zip(mine.layout.names, mine.layout.coordinate_of(rank)))
        w(f"\nrank {rank} is in {mine.label}, at {coord}\n")
    tags = [f"{mine.label}.{d}" for d in mine.layout.names] if mine is not None else []
    tw = max(len(t) for t in tags + list(job.meshes))
    for i, tag in enumerate(tags):
        w(f"  {tag:<{tw}}  {format_group(mine.layout.group(rank, i))}\n")  # type: ignore[union-attr]
    for m in job.meshes.values():
        if m is not mine:
            w(f"  {m.label:<{tw}}  - (not a member: its ranks are {m.span()})\n")

    made = counts[mine.label] if mine is not None else GroupCount([], [], [])
    steps = sum(c.created for label, c in counts.items() if mine is None or label != mine.label)
    w(
        f"\nprocess groups on rank {rank}: {made.created + steps} ({len(made.real)} real + "
        f"{len(made.fake) + steps} fake), one per distinct rank partition and dim name of each mesh\n"
    )
    if steps:
        note = (
            f"{steps} of them are placeholders: a rank outside a mesh takes its members' steps (a one-rank fake "
            "group each, or its part of an NCCL split), so that torch's group names stay in step"
        )
        w(textwrap.fill(note, width=100, initial_indent="  ", subsequent_indent="  ") + "\n")
    if any(c.default for c in counts.values()):
        w(f"  default group (whole world): {', '.join(t for c in counts.values() for t in c.default)}\n")

    w(f"\ntopology: {report.format() if report.dims else report.format().splitlines()[0]}\n")
    if not report.whole_world and report.dims:
        w(f"  (whole-mesh check skipped above {WHOLE_WORLD_LIMIT} ranks)\n")
    return "".join(lines)
