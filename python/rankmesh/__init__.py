"""rankmesh: DeviceMesh rank layouts for 100k+ rank torch.distributed jobs, computed in Rust.

A rank needs only its own groups, and each is a pure function of (layout, rank)::

    >>> from rankmesh import MeshLayout
    >>> mesh = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))
    >>> mesh.group(6, "tp").tolist(), mesh.group(6, "dp").tolist()
    ([4, 5, 6, 7], [2, 6])
    >>> mesh.coordinate_of(6)
    (1, 2)
    >>> mesh["dp"].groups().tolist()
    [[0, 4], [1, 5], [2, 6], [3, 7]]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankmesh._lazy import lazy_getattr
from rankmesh._native import MAX_WORLD_SIZE, MeshLayout, Slice
from rankmesh.errors import (
    ConfigMismatchError,
    ConsistencyTimeoutError,
    DistributedStateError,
    RankmeshError,
    ReformError,
)
from rankmesh.megatron import ModelParallelLayout, RankGenerator, model_parallel_layout
from rankmesh.single import SingleMesh, single_mesh
from rankmesh.topology import rank_map_from_hosts, topology_report

if TYPE_CHECKING:
    from rankmesh.consistency import check_consistency
    from rankmesh.mesh import FastDeviceMesh, from_group, init_device_mesh
    from rankmesh.process_groups import BuildReport, MeshBuilder
    from rankmesh.switch import accelerate, restore
    from rankmesh.torchtitan.parallel_dims import ParallelDims

from rankmesh._native import __version__ as __version__  # Cargo.toml's, built into the extension

# The torch layer imports torch (seconds); the layout algebra needs only numpy. Import it lazily.
_LAZY = {
    "init_device_mesh": "rankmesh.mesh",
    "from_group": "rankmesh.mesh",
    "FastDeviceMesh": "rankmesh.mesh",
    "ParallelDims": "rankmesh.torchtitan.parallel_dims",
    "MeshBuilder": "rankmesh.process_groups",
    "BuildReport": "rankmesh.process_groups",
    "check_consistency": "rankmesh.consistency",
    "accelerate": "rankmesh.switch",
    "restore": "rankmesh.switch",
}

__getattr__ = lazy_getattr(__name__, _LAZY, globals())


__all__ = [
    "MAX_WORLD_SIZE",
    "MeshLayout",
    "Slice",
    # torch layer and conventions
    "accelerate",
    "restore",
    "init_device_mesh",
    "from_group",
    "FastDeviceMesh",
    "ParallelDims",
    "MeshBuilder",
    "BuildReport",
    "check_consistency",
    "RankGenerator",
    "ModelParallelLayout",
    "model_parallel_layout",
    "SingleMesh",
    "single_mesh",
    "topology_report",
    "rank_map_from_hosts",
    # the errors a job catches; every error class is in rankmesh.errors
    "RankmeshError",
    "ConfigMismatchError",
    "ConsistencyTimeoutError",
    "DistributedStateError",
    "ReformError",
]
