"""torchtitan's mesh definitions (its commit 183a0d2) as rankmesh layouts, without torch.

One source for :class:`rankmesh.ParallelDims` (which turns them into DeviceMeshes) and for
``rankmesh plan`` (which only prints them), the degree checks included: :func:`resolve_degrees`
(when the config is made) and :func:`degrees` (where meshes are first needed) raise ParallelDims'
:class:`~rankmesh.errors.ParallelDimsError`, with its messages, without importing torch;
:func:`fake_dim_names` is the rule for which dims go on the ``fake`` backend.
``rankmesh.bench.stock`` keeps its own transcription on purpose: it is the independent oracle
the tests compare these against.

    >>> deg = degrees(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=2, etp=1)
    >>> deg["batch"], deg["fsdp"], deg["efsdp"]
    (4, 2, 2)
    >>> lay = layouts(8, deg)
    >>> lay["dense"].names, lay["dense"].shape
    (('pp', 'dp_replicate', 'fsdp', 'tp'), (1, 2, 2, 2))
    >>> sorted(fake_dims("dataloading", lay["dataloading"], ep=2))
    ['batch', 'cp', 'pp']
    >>> resolve_degrees(dp_replicate=2, dp_shard=-1, cp=1, tp=2, pp=1, ep=2, etp=1, world_size=8)["dp_shard"]
    2
"""

from __future__ import annotations

from collections.abc import Sequence

from rankmesh._check import as_int, check_degrees, degree_fix, undivided, undivided_fix, undivided_text
from rankmesh._native import MeshLayout
from rankmesh.errors import ParallelDimsError, ParallelDimsOverflowError, ParallelDimsSizeMismatchError, arg

#: torchtitan's global meshes, slowest dim first.
GLOBAL_MESH_DIMS: dict[str, tuple[str, ...]] = {
    "dataloading": ("pp", "batch", "cp", "tp"),
    "dense": ("pp", "dp_replicate", "fsdp", "tp"),
    "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
}
#: torchtitan's name for the flattened (batch, cp) dim.
LOSS_DIM_NAME = "loss_mesh"


def resolve_degrees(
    *, dp_replicate: int, dp_shard: int, cp: int, tp: int, pp: int, ep: int, etp: int, world_size: int
) -> dict[str, int]:
    """ParallelDims' constructor checks (torchtitan's asserts): every degree >= 1 except
    ``dp_shard``, which may be -1 (every rank the others leave); the degrees multiply to the
    world; etp = tp or 1 when ep > 1. Returns the seven degrees with ``dp_shard`` resolved.
    Raises :class:`~rankmesh.errors.ParallelDimsError` (an ``AssertionError``, as torchtitan),
    :class:`ParallelDimsSizeMismatchError` (also a ``SizeMismatchError``) for degrees that do not
    fit the world, :class:`ParallelDimsOverflowError` (also a ``LayoutOverflowError``) for a world
    size, or a running product of the degrees in argument order, beyond
    :data:`~rankmesh.MAX_WORLD_SIZE` (naming the world size or the degree that overflows, checked
    first), and :class:`~rankmesh.errors.ArgumentTypeError` (a ``TypeError``) for a degree that is not
    an int (:mod:`rankmesh._check`'s rule)."""
    deg = {
        "dp_replicate": as_int(dp_replicate, "dp_replicate"),
        "dp_shard": as_int(dp_shard, "dp_shard"),
        "cp": as_int(cp, "cp"),
        "tp": as_int(tp, "tp"),
        "pp": as_int(pp, "pp"),
        "ep": as_int(ep, "ep"),
        "etp": as_int(etp, "etp"),
    }
    world_size = as_int(world_size, "world_size")
    _check_positive(deg)
    dp_replicate, dp_shard, cp, tp, pp, ep, etp = deg.values()
    # overflows before the degrees are compared with the world, naming the culprit
    check_degrees([("world_size", world_size)], error=ParallelDimsOverflowError)
    world_degrees = [(n, deg[n]) for n in ("dp_replicate", "dp_shard", "cp", "tp", "pp") if deg[n] != -1]
    check_degrees(world_degrees, error=ParallelDimsOverflowError)
    auto = dp_shard < 0
    if auto:
        deg["dp_shard"] = dp_shard = _dp_shard_left(world_size, dp_replicate, cp, tp, pp)
    product = dp_replicate * dp_shard * cp * tp * pp
    if product != world_size:
        why = f"the degrees multiply to {product}, make them multiply to the world size (or set dp_shard=-1)"
        fix = "pass {dp_shard=-1} to fill the rest, or make the degrees multiply to {world_size}"
        if auto:  # dp_shard=-1 is what failed: name the degree that does not divide the world
            name, value, left = undivided(world_size, [(n, deg[n]) for n in ("dp_replicate", "cp", "tp", "pp")])
            world = arg("world_size", f"world_size = {world_size}", world_size)
            why = f"dp_shard=-1 cannot fill the rest: {undivided_text(name, name, value, left, world, world_size)}"
            fix = undivided_fix(name, value, left)
        raise ParallelDimsSizeMismatchError(
            f"Invalid parallel dims: dp_replicate({dp_replicate}) * dp_shard({dp_shard}) * "
            f"cp({cp}) * tp({tp}) * pp({pp}) != WORLD_SIZE({world_size}); {why}",
            field="world_size",
            value=world_size,
            kind="degrees_do_not_fill_world",
            ctx={"product": product},
            fix=fix,
        )
    if ep > 1 and etp not in (tp, 1):
        raise ParallelDimsError(
            f"Currently we only support ETP=TP or ETP=1: {arg('etp', f'etp = {etp}', etp)} with "
            f"{arg('tp', f'tp = {tp}', tp)} and {arg('ep', f'ep = {ep}', ep)}; set etp to 1 or to tp",
            field="etp",
            value=etp,
            kind="etp_not_tp_or_1",
            ctx={"tp": tp, "ep": ep},
            fix=degree_fix("etp"),
        )
    return deg


def _check_positive(deg: dict[str, int]) -> None:
    """Returns when every degree in ``deg`` is at least 1, ``dp_shard`` also -1; else
    :class:`~rankmesh.errors.ParallelDimsError` naming the first that is not."""
    for name in ("dp_replicate", "cp", "tp", "pp", "ep", "etp"):
        d = deg[name]
        if d < 1:
            raise ParallelDimsError(
                f"Parallelism degree should be >= 1, except for dp_shard: {arg(name, f'{name} = {d}', d)}; use 1 "
                "to disable a parallelism",
                field=name,
                value=d,
                kind="degree_not_positive",
                fix=degree_fix(name),
            )
    dp_shard = deg["dp_shard"]
    if not (dp_shard == -1 or dp_shard >= 1):
        raise ParallelDimsError(
            f"{arg('dp_shard')} must -1 or >=1: {arg('dp_shard', f'dp_shard = {dp_shard}', dp_shard)}; use -1 to give "
            "FSDP every rank the other degrees leave",
            field="dp_shard",
            value=dp_shard,
            kind="degree_not_positive",
            fix=degree_fix("dp_shard"),
        )


def _dp_shard_left(world_size: int, dp_replicate: int, cp: int, tp: int, pp: int) -> int:
    """``dp_shard = -1`` resolved: the ranks per replica the other degrees leave (the world size
    divided by their product); :class:`ParallelDimsSizeMismatchError` when that is none, whose fix
    gives the degree at fault values that divide the world (:func:`~rankmesh._check.undivided`)."""
    dp_shard = world_size // (dp_replicate * cp * tp * pp)
    if dp_shard < 1:
        name, value, left = undivided(world_size, [("dp_replicate", dp_replicate), ("cp", cp), ("tp", tp), ("pp", pp)])
        raise ParallelDimsSizeMismatchError(
            f"{arg('dp_shard', 'dp_shard = -1', -1)} leaves no rank for FSDP: "
            f"{arg('world_size', f'world_size = {world_size}', world_size)} is "
            f"smaller than dp_replicate * cp * tp * pp = {dp_replicate * cp * tp * pp}; lower "
            f"those degrees so that their product divides the world size "
            f"({undivided_text(name, name, value, left, arg('world_size'), world_size)})",
            field="dp_shard",
            value=-1,
            kind="no_rank_left",
            ctx={"world_size": world_size, "others": dp_replicate * cp * tp * pp},
            fix=undivided_fix(name, value, left),
        )
    return dp_shard


def _check_sparse(*, dp_shard: int, cp: int, tp: int, ep: int, etp: int) -> None:
    """The check torchtitan does not make (ParallelDims runs it when it builds the meshes): ep *
    etp must divide dp_shard * cp * tp, which the sparse mesh splits into efsdp x ep x etp."""
    sparse = dp_shard * cp * tp
    if sparse % (ep * etp) != 0:
        _, _, left = undivided(sparse, [("etp", etp), ("ep", ep)])  # etp (tp or 1) divides: ep is at fault
        raise ParallelDimsError(
            f"ep * etp = {ep} * {etp} = {ep * etp} must divide dp_shard * cp * tp = "
            f"{dp_shard} * {cp} * {tp} = {sparse}: the MoE (sparse) mesh splits those ranks "
            f"into efsdp x ep x etp; choose ep (and etp) so that ep * etp divides {sparse}",
            field="ep",
            value=ep,
            kind="moe_mesh_does_not_divide",
            ctx={"etp": etp, "sparse_ranks": sparse},
            fix=f"{undivided_fix('ep', ep, left)}, or {{ep=1}} for no expert parallelism",
        )


def degrees(*, dp_replicate: int, dp_shard: int, cp: int, tp: int, pp: int, ep: int, etp: int) -> dict[str, int]:
    """The size of every mesh name, from the degrees :func:`resolve_degrees` returned: the second
    and last step of the one sequence ``rankmesh plan`` and :class:`ParallelDims` both follow
    (resolve when the config is made, then this where meshes or layouts are first needed). It
    first checks that the MoE (sparse) mesh divides, which torchtitan leaves to torch.

        >>> degrees(**resolve_degrees(dp_replicate=1, dp_shard=-1, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=8))["fsdp"]
        4
    """
    _check_sparse(dp_shard=dp_shard, cp=cp, tp=tp, ep=ep, etp=etp)
    fsdp = dp_shard * cp
    return {
        "pp": pp,
        "batch": dp_replicate * dp_shard,
        "loss": dp_replicate * dp_shard * cp,
        "dp_replicate": dp_replicate,
        "fsdp": fsdp,
        "cp": cp,
        "tp": tp,
        "ep": ep,
        "efsdp": fsdp * tp // (etp * ep),
        "etp": etp,
    }


def mesh_exists(name: str, degree: int, ep: int) -> bool:
    """torchtitan's ``_mesh_exist``: efsdp exists whenever ep > 1 (MoE layers are FSDP-wrapped
    for mixed precision, even at degree 1); every other dim when its degree is > 1."""
    if name == "efsdp":
        return ep > 1
    return degree > 1


def layouts(world_size: int, deg: dict[str, int], *, loss_name: str = LOSS_DIM_NAME) -> dict[str, MeshLayout]:
    """``world``, ``dataloading``, ``loss`` = flatten(batch, cp), ``dense``, ``sparse``."""
    world = MeshLayout.world(world_size)
    out = {"world": world}
    for mesh_name, dims in GLOBAL_MESH_DIMS.items():
        out[mesh_name] = world.unflatten("world", tuple(deg[d] for d in dims), dims)
    out["loss"] = out["dataloading"]["batch", "cp"].flatten(loss_name)
    return {k: out[k] for k in ("world", "dataloading", "loss", "dense", "sparse")}


def fake_dim_names(names: Sequence[str], sizes: Sequence[int], ep: int) -> frozenset[str]:
    """The one rule for which dims of a global mesh torchtitan puts on the ``fake`` backend:
    ``batch`` (count-only) and dims that do not exist (:func:`mesh_exists`).

        >>> sorted(fake_dim_names(("pp", "batch", "cp", "tp"), (1, 16, 2, 4), ep=1))
        ['batch', 'pp']
    """
    return frozenset(n for n, s in zip(names, sizes) if n == "batch" or not mesh_exists(n, s, ep))


def fake_dims(mesh_name: str, layout: MeshLayout, ep: int) -> frozenset[str]:
    """:func:`fake_dim_names` of one of :func:`global_layouts`. The loss mesh is flattened with
    the default backend (a size-1 loss is fake anyway)."""
    if mesh_name == "loss":
        return frozenset()
    return fake_dim_names(layout.names, layout.shape, ep)
