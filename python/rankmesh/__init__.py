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

from rankmesh._native import MAX_WORLD_SIZE, MeshLayout
from rankmesh.errors import (
    DimOutOfRangeError,
    DuplicateNameError,
    EmptySliceError,
    IncompatibleLayoutError,
    InternalError,
    InvalidLayoutError,
    InvalidNameError,
    InvalidRankMapError,
    InvalidSizeError,
    LayoutOverflowError,
    RankmeshError,
    RankOutOfRangeError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)

__version__ = "0.1.0"

__all__ = [
    "MAX_WORLD_SIZE",
    "MeshLayout",
    "RankmeshError",
    "InvalidSizeError",
    "SizeMismatchError",
    "LayoutOverflowError",
    "UnknownNameError",
    "DuplicateNameError",
    "InvalidNameError",
    "SliceOrderError",
    "EmptySliceError",
    "RankOutOfRangeError",
    "DimOutOfRangeError",
    "InvalidRankMapError",
    "IncompatibleLayoutError",
    "InvalidLayoutError",
    "InternalError",
]
