"""torchtitan's mesh definitions (its commit 183a0d2) as rankmesh layouts, without torch.

One source for :class:`rankmesh.ParallelDims` (which turns them into DeviceMeshes) and for
``rankmesh plan`` (which only prints them). ``rankmesh._stock`` keeps its own transcription on
purpose: it is the independent oracle the tests compare these against.

    >>> deg = degrees(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=2, etp=1)
    >>> deg["batch"], deg["fsdp"], deg["efsdp"]
    (4, 2, 2)
    >>> lay = layouts(8, deg)
    >>> lay["dense"].names, lay["dense"].shape
    (('pp', 'dp_replicate', 'fsdp', 'tp'), (1, 2, 2, 2))
    >>> sorted(fake_dims("dataloading", lay["dataloading"], ep=2))
    ['batch', 'cp', 'pp']
"""

from __future__ import annotations

from rankmesh._native import MeshLayout

#: torchtitan's global meshes, slowest dim first.
GLOBAL_MESH_DIMS: dict[str, tuple[str, ...]] = {
    "dataloading": ("pp", "batch", "cp", "tp"),
    "dense": ("pp", "dp_replicate", "fsdp", "tp"),
    "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
}
#: torchtitan's name for the flattened (batch, cp) dim.
LOSS_DIM_NAME = "loss_mesh"


def degrees(*, dp_replicate: int, dp_shard: int, cp: int, tp: int, pp: int, ep: int, etp: int) -> dict[str, int]:
    """The size of every mesh name, from validated degrees (``dp_shard`` already resolved)."""
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


def fake_dims(mesh_name: str, layout: MeshLayout, ep: int) -> frozenset[str]:
    """Dims torchtitan puts on the ``fake`` backend: ``batch`` (count-only) and dims that do not
    exist. The loss mesh is flattened with the default backend (a size-1 loss is fake anyway)."""
    if mesh_name == "loss":
        return frozenset()
    return frozenset(
        n for n, s in zip(layout.names, layout.shape) if n == "batch" or not mesh_exists(n, s, ep)
    )
