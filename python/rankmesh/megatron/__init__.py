"""Megatron-core's rank conventions over :class:`~rankmesh.MeshLayout` (this package only names
things: the layouts are torch-free, in three rooms: the order rules :mod:`rankmesh.megatron.order`,
``RankGenerator`` :mod:`rankmesh.megatron.generator`, and the groups of ``initialize_model_parallel``
:mod:`rankmesh.megatron.layout`; its process groups and DeviceMeshes are made in one place,
:mod:`rankmesh.megatron.groups`; ``initialize_model_parallel`` is
:mod:`rankmesh.megatron.parallel_state`, ``HyperCommGrid`` :mod:`rankmesh.megatron.hyper_comm_grid`).

Megatron names its parallel dims with an *order* string such as ``"tp-cp-ep-dp-pp"``: the
leftmost name varies fastest over the ranks. That is a row-major mesh read backwards, so a
:class:`RankGenerator` is the world unflattened in the reversed order, and a *token* such as
``"tp-pp"`` is the flatten of the slice of its names (taken in mesh order)::

    >>> g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
    >>> g.order                                 # names left out are appended (size 1)
    'tp-dp-pp-ep-cp'
    >>> g.mesh_layout.names, g.mesh_layout.shape
    (('cp', 'ep', 'pp', 'dp', 'tp'), (1, 1, 2, 2, 2))
    >>> g.get_ranks("dp")                       # megatron-core's answer, as lists
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    >>> g.my_group(5, "tp-pp").tolist()         # one rank's group, O(group size)
    [0, 1, 4, 5]

``get_ranks`` answers exactly what megatron-core's ``RankGenerator.get_ranks`` does (same groups,
same order), but a rank only ever needs :meth:`RankGenerator.my_group`, which costs O(group
size) instead of O(world). :func:`model_parallel_layout` builds the dense ("decoder") and expert
generators the way ``megatron.core.parallel_state.initialize_model_parallel`` does, checks the
same invariants, and names every group Megatron creates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankmesh._lazy import lazy_getattr
from rankmesh.megatron.generator import RankGenerator
from rankmesh.megatron.layout import (
    GROUP_DESCRIPTIONS,
    ModelParallelLayout,
    default_embedding_ranks,
    default_position_embedding_ranks,
    model_parallel_layout,
)
from rankmesh.megatron.order import DEFAULT_ORDER, MEGATRON_DIMS, order_problem, working_order

if TYPE_CHECKING:
    from rankmesh.megatron.hyper_comm_grid import HyperCommGrid
    from rankmesh.megatron.parallel_state import (
        destroy_model_parallel,
        initialize_model_parallel,
        last_build_report,
    )

__all__ = [
    "MEGATRON_DIMS",
    "DEFAULT_ORDER",
    "RankGenerator",
    "ModelParallelLayout",
    "GROUP_DESCRIPTIONS",
    "model_parallel_layout",
    "default_embedding_ranks",
    "default_position_embedding_ranks",
    "working_order",
    "order_problem",
    # megatron-core's parallel_state and HyperCommGrid on rankmesh (import torch when first used)
    "initialize_model_parallel",
    "destroy_model_parallel",
    "last_build_report",
    "HyperCommGrid",
]

# Names that need torch (and megatron-core), imported when first used so that the layout API
# above stays torch-free.
_LAZY = {
    "initialize_model_parallel": "rankmesh.megatron.parallel_state",
    "destroy_model_parallel": "rankmesh.megatron.parallel_state",
    "last_build_report": "rankmesh.megatron.parallel_state",
    "HyperCommGrid": "rankmesh.megatron.hyper_comm_grid",
}

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
