"""``spmd_types``' ``MeshAxis.__le__`` by (size, stride) modes: the rule behind the "spmd_axis_le" patch.

``MeshAxis.__le__`` (spmd_types 0.2.3 to 0.3.1) says whether every rank of one axis's layout,
counted from 0, is a rank of the other's: it builds both rank sets, ``set(layout.all_ranks_from_zero())``.
torch's FSDP2 asks ``axis <= fsdp_axis`` for every annotated axis of every parameter, and the dp
axis holds W/tp ranks: 56 ms a call at 2^20 ranks.

The rank set of a layout whose modes, sorted by stride, each start at a multiple of where the
previous one ends is a set of mixed-radix numbers: mode ``(size, stride)`` is free to use the
digits between the *cut points* ``stride`` and ``size * stride``; every other digit is 0. When the
cut points of both axes together form one divisibility chain (``1 | c1 | c2 | ...``), the two
layouts share one mixed radix, and one set holds the other exactly when every digit range free
in the smaller is free in the larger: a few comparisons per mode, whatever the world size.
Axes made by flattening, unflattening and slicing one world always have such a chain; for any
other pair :func:`contains` says ``None`` and spmd_types' own set test decides.

    >>> contains([(8, 1)], [(2**20 // 8, 8)])    # tp {0..7} in dp {0, 8, 16, ...}? no
    False
    >>> contains([(2, 8)], [(8, 1), (4, 8)])     # {0, 8} in {0..31}: yes
    True
    >>> contains([(2, 3)], [(4, 1)]) is None     # {0, 3} in {0..3}: cut points 3 and 4 are no chain
    True

This module imports neither torch nor spmd_types until :func:`make_le` or ``PATCH.recognise()`` runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rankmesh._native import Slice
from rankmesh._patch import Gate, Patch
from rankmesh.errors import RankmeshError

__all__ = ["COUNTS", "PATCH", "contains", "make_le"]

#: How often rankmesh's ``__le__`` decided by modes and how often it handed over to spmd_types'
#: own set test ("fallback"), since import; the tests read it to see which path ran.
COUNTS: dict[str, int] = {"modes": 0, "fallback": 0}


def _slice(modes: Iterable[tuple[int, int]]) -> Slice | None:
    """One spmd_types layout's rank set as a :class:`~rankmesh.Slice` from 0: modes of size 1 or
    stride 0 add only offset 0 and are left out; None when a mode is not a plain non-negative
    pair or the modes overlap (a rank set the core's slices do not hold).

    >>> _slice([(4, 8), (8, 1)])   # {0, 8, 16, 24} + {0..7} = {0..31}, coalesced
    Slice(0, [(32, 1)])
    >>> _slice([(2, 2), (4, 1)]) is None   # {0..3} + {0, 2} = {0..5}: modes overlap
    True
    """
    kept = []
    for mode in modes:
        size, stride = mode
        if type(size) is not int or type(stride) is not int or size < 1 or stride < 0:
            return None
        if size > 1 and stride > 0:
            kept.append(mode)
    try:
        return Slice(0, kept)
    except RankmeshError:
        return None


def contains(small_modes: Iterable[tuple[int, int]], big_modes: Iterable[tuple[int, int]]) -> bool | None:
    """Whether the ranks of the layout with ``small_modes`` (``(size, stride)`` pairs, from 0) are all
    ranks of the layout with ``big_modes``; None when the modes alone do not decide it exactly (the
    cut points of the two layouts are no divisibility chain): then only the rank sets can. The
    core decides it (:meth:`rankmesh.Slice.subset_by_modes`), in O(modes).

    >>> contains([(4, 2)], [(2, 1), (4, 2)])     # {0, 2, 4, 6} in {0..7}
    True
    >>> contains([(4, 1)], [(2, 1), (2, 4)])     # {0..3} in {0, 1, 4, 5}
    False
    """
    small = _slice(small_modes)
    big = _slice(big_modes)
    if small is None or big is None:
        return None
    return small.subset_by_modes(big)


def _modes(layout: Any) -> tuple[tuple[int, int], ...] | None:
    try:
        return tuple(layout.sizes_and_strides)
    except (AttributeError, TypeError):
        return None


def make_le(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The ``MeshAxis.__le__`` that replaces ``original`` (spmd_types' own): the same answer, by
    :func:`contains` where it decides, else by ``original``."""
    from spmd_types import _mesh_axis

    def __le__(self, other):  # noqa: ANN001, ANN202
        if not isinstance(other, _mesh_axis.MeshAxis):
            return NotImplemented
        if self == other:
            return True
        small, big = _modes(self.layout), _modes(other.layout)
        verdict = None if small is None or big is None else contains(small, big)
        if verdict is None:
            COUNTS["fallback"] += 1
            return original(self, other)
        COUNTS["modes"] += 1
        return verdict

    __le__.__doc__ = original.__doc__
    __le__.__qualname__ = "MeshAxis.__le__"
    return __le__


#: The patch (listed in :mod:`rankmesh.patches`; installed by :func:`rankmesh.torchtitan.accelerate`).
PATCH = Patch(
    "spmd_axis_le",
    "spmd_types._mesh_axis.MeshAxis",
    "__le__",
    make_le,
    why="torch's FSDP2 compares mesh axes twice per parameter; spmd_types builds both axes' rank sets each time "
    "(58 ms per call at 2^20); rankmesh compares (size, stride) modes in O(modes), the sets where they are no chain",
    detail="(MeshAxis.__le__ by body)",
    # one body in every release spmd_types has published since 0.2.3
    gate=Gate("spmd_types", ["spmd_types._mesh_axis.MeshAxis.__le__"]),
)
