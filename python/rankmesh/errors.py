"""rankmesh's exception hierarchy.

Every error derives from :class:`RankmeshError`, itself a :class:`ValueError`, and carries the
offending ``field`` and ``value`` next to a message that says how to fix it::

    >>> from rankmesh import MeshLayout, SizeMismatchError
    >>> try:
    ...     MeshLayout.world(8).unflatten("world", (2, 2), ("dp", "tp"))
    ... except SizeMismatchError as e:
    ...     print(e.field)
    sizes

Some classes also derive from the builtin that torch raises in the same situation (``KeyError``
for unknown names, ``IndexError`` for out-of-range dims and ranks, ``OverflowError``), so code
written against ``DeviceMesh`` keeps catching them.
"""

from __future__ import annotations

__all__ = [
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


class RankmeshError(ValueError):
    """Base class of every rankmesh error.

    Attributes:
        field: the argument or setting at fault, e.g. ``"sizes[1]"`` or ``"rank_map"``.
        value: the offending value, as text.
    """

    def __init__(self, message: str, field: str = "", value: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # keep field/value through pickling (e.g. across processes)
        return (type(self), (self.message, self.field, self.value))


class InvalidSizeError(RankmeshError):
    """A size (world size, dim size, degree) is zero or negative."""


class SizeMismatchError(RankmeshError):
    """Sizes do not multiply to what they must (unflatten sizes vs the dim, degrees vs the world)."""


class LayoutOverflowError(RankmeshError, OverflowError):
    """A size or product does not fit: ranks are int32, products are checked in 64 bits."""


class UnknownNameError(RankmeshError, KeyError):
    """A dimension name that the mesh does not have."""

    __str__ = RankmeshError.__str__


class DuplicateNameError(RankmeshError):
    """The same dimension name twice."""


class InvalidNameError(RankmeshError):
    """A dimension name that cannot be used (e.g. empty)."""


class SliceOrderError(RankmeshError):
    """Names sliced out of mesh order (torch requires ascending mesh order)."""


class EmptySliceError(RankmeshError):
    """A slice that names no dimension."""


class RankOutOfRangeError(RankmeshError, IndexError):
    """A rank outside ``range(world_size)``."""


class DimOutOfRangeError(RankmeshError, IndexError):
    """A dimension index outside ``range(ndim)``."""


class InvalidRankMapError(RankmeshError):
    """A rank map that is not a permutation of ``range(world_size)``."""


class IncompatibleLayoutError(RankmeshError):
    """An operation the layout's strides cannot express (e.g. an uneven unflatten of a
    dim flattened from non-adjacent dims)."""


class InvalidLayoutError(RankmeshError):
    """Raw modes (e.g. from a corrupted pickle) that do not tile the world."""


class InternalError(RankmeshError):
    """A bug in rankmesh (a Rust panic caught at the FFI boundary). Please report it."""
