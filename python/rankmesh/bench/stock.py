"""The stock-torch build that rankmesh replaces: torchtitan's mesh construction (its commit
183a0d2, "Use new DeviceMesh unflatten to rewrite parallel_dims") written against plain
``torch.distributed.DeviceMesh``. It is the oracle of the tests and the baseline of the
benchmarks and the demo; nothing in rankmesh's own build path uses it.

On every rank it materialises every group of every dimension (``remap_to_tensor`` over the whole
world) and calls ``new_group`` once per subgroup of the job, so it costs O(W) time and memory per
rank per mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GLOBAL_MESH_DIMS: dict[str, tuple[str, ...]] = {
    "dataloading": ("pp", "batch", "cp", "tp"),
    "dense": ("pp", "dp_replicate", "fsdp", "tp"),
    "sparse": ("pp", "dp_replicate", "efsdp", "ep", "etp"),
}


def resolve_degrees(
    *, dp_replicate: int, dp_shard: int, cp: int, tp: int, pp: int, ep: int, etp: int, world_size: int
) -> dict[str, int]:
    """Degrees of every mesh name, torchtitan's way (``dp_shard=-1`` fills the rest)."""
    if dp_shard < 0:
        dp_shard = world_size // (dp_replicate * cp * tp * pp)
    fsdp = dp_shard * cp
    return {
        "pp": pp,
        "batch": dp_replicate * dp_shard,
        "loss": dp_replicate * dp_shard * cp,
        "dp_replicate": dp_replicate,
        "dp_shard": dp_shard,
        "fsdp": fsdp,
        "cp": cp,
        "tp": tp,
        "ep": ep,
        "efsdp": fsdp * tp // (etp * ep),
        "etp": etp,
    }


def mesh_exists(name: str, degree: int, ep: int) -> bool:
    """torchtitan's ``_mesh_exist``: efsdp exists whenever ep > 1, other dims when > 1."""
    if name == "efsdp":
        return ep > 1
    return degree > 1


@dataclass
class StockBuild:
    world_mesh: Any
    meshes: dict[str, Any]
    global_meshes: dict[str, Any]
    degrees: dict[str, int]
    ep: int
    extra: dict = field(default_factory=dict)

    def get_optional_mesh(self, dims: str | list[str]):
        names = [dims] if isinstance(dims, str) else list(dims)
        for n in names:
            if n not in self.meshes:
                raise ValueError(f"Invalid mesh dim: '{n}'. Valid dimensions are: {list(self.meshes)}")
        if any(not mesh_exists(n, self.meshes[n].size(), self.ep) for n in names):
            return None
        if len(names) == 1:
            return self.meshes[names[0]]
        for mesh in self.global_meshes.values():
            if set(names).issubset(set(mesh.mesh_dim_names)):
                return mesh[tuple(names)]
        raise ValueError(f"Invalid mesh name combinations {names}.")


def stock_build(
    *,
    dp_replicate: int,
    dp_shard: int,
    cp: int,
    tp: int,
    pp: int,
    ep: int,
    etp: int,
    world_size: int,
    device_type: str = "cpu",
) -> StockBuild:
    """Builds torchtitan's meshes with stock torch on the already-initialised default group."""
    from torch.distributed.device_mesh import init_device_mesh

    deg = resolve_degrees(
        dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp, world_size=world_size
    )

    def unflatten(world_mesh, names: tuple[str, ...]):
        sizes = tuple(deg[n] for n in names)
        override = {n: "fake" for n in names if n == "batch" or not mesh_exists(n, deg[n], ep)}
        return world_mesh._unflatten(0, sizes, names, backend_override=override)

    world_mesh = init_device_mesh(device_type, (world_size,), mesh_dim_names=("world",))
    dataloading = unflatten(world_mesh, GLOBAL_MESH_DIMS["dataloading"])
    loss = dataloading["batch", "cp"]._flatten("loss_mesh")
    dense = unflatten(world_mesh, GLOBAL_MESH_DIMS["dense"])
    sparse = unflatten(world_mesh, GLOBAL_MESH_DIMS["sparse"])
    meshes = {
        "pp": dataloading["pp"],
        "batch": dataloading["batch"],
        "loss": loss,
        "dp_replicate": dense["dp_replicate"],
        "fsdp": dense["fsdp"],
        "cp": dataloading["cp"],
        "tp": dataloading["tp"],
        "ep": sparse["ep"],
        "efsdp": sparse["efsdp"],
        "etp": sparse["etp"],
    }
    global_meshes = {"dataloading": dataloading, "loss": loss, "dense": dense, "sparse": sparse}
    return StockBuild(world_mesh, meshes, global_meshes, deg, ep)


def all_requests() -> list[list[str]]:
    """Every single-dim name and every ordered combination inside one global mesh: what the
    benchmark and the demo fetch after the build."""
    from itertools import combinations

    seen: list[list[str]] = [["loss"]]
    for dims in GLOBAL_MESH_DIMS.values():
        for k in range(1, len(dims) + 1):
            for combo in combinations(dims, k):
                if list(combo) not in seen:
                    seen.append(list(combo))
    return seen
