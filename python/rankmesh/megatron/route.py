"""megatron-core's own ``parallel_state.initialize_model_parallel`` routed through rankmesh: the
``"megatron"`` patch of :mod:`rankmesh.patches`, which the one switch installs the moment
``megatron.core.parallel_state`` has run (:mod:`rankmesh.switch`).

Every caller looks the function up as an attribute of ``parallel_state`` at call time (Megatron-LM's
trainer as ``mpu.initialize_model_parallel(args.tensor_model_parallel_size, ...)``, its in-process
restart through the trainer again, Megatron-Bridge, NeMo), so one attribute reaches them all. The
replacement binds the call to megatron-core's own signature; when every argument is one
:func:`rankmesh.megatron.initialize_model_parallel` models, that function runs (only this rank's
groups, O(group size), the same globals afterwards) and None is returned, as megatron-core does.
Anything else runs megatron-core's own function with the call unchanged, after one warning per
reason: arguments that do not bind (its own ``TypeError``), or an argument of a newer release.

The patch is gated by the release (0.16) and by the bodies of every function whose behaviour
rankmesh reproduces (:data:`CODE`): a megatron-core that changed any of them keeps its own function.

:func:`rankmesh.megatron.parallel_state.megatron_own` finds megatron-core's own function wherever
it is, even after something assigned rankmesh's over it (``parallel_state.initialize_model_parallel =
rankmesh.megatron.initialize_model_parallel``), so that every call rankmesh cannot serve reaches it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from rankmesh._once import warn_once
from rankmesh._patch import Gate, Patch
from rankmesh.megatron import parallel_state

__all__ = ["CODE", "PATCH"]

_PS = "megatron.core.parallel_state"

#: The megatron-core code :func:`rankmesh.megatron.initialize_model_parallel` reproduces (its
#: checks, RankGenerator's groups and order, the groups' options, the embedding defaults) and relies
#: on (``destroy_model_parallel`` resets every global it sets), per release read. 0.16.0 and 0.16.1
#: have the same ``parallel_state``.
CODE = Gate(
    "megatron-core",
    [
        f"{_PS}.{name}"
        for name in (
            "initialize_model_parallel",
            "RankGenerator.__init__",
            "RankGenerator.get_ranks",
            "generate_masked_orthogonal_rank_groups",
            "create_group",
            "get_nccl_options",
            "create_hierarchical_groups",
            "create_hybrid_dp_cp_groups",
            "default_embedding_ranks",
            "default_position_embedding_ranks",
            "destroy_model_parallel",
        )
    ],
    reader="this patch",
)


def _modelled() -> frozenset[str]:
    """The arguments rankmesh's ``initialize_model_parallel`` models (its named parameters)."""
    params = inspect.signature(parallel_state.initialize_model_parallel).parameters.values()
    return frozenset(p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD)


def _make(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    modelled = _modelled()

    def initialize_model_parallel(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)  # megatron-core's own TypeError
        unmodelled = sorted(set(arguments) - modelled)
        if unmodelled:
            warn_once(
                ("megatron route", tuple(unmodelled)),
                f"rankmesh: initialize_model_parallel got {', '.join(unmodelled)}, which rankmesh does not model; "
                "megatron-core's own function runs (every group of the job on every rank, as without rankmesh)",
                stacklevel=2,
            )
            return original(*args, **kwargs)
        parallel_state.initialize_model_parallel(**arguments)
        return None

    initialize_model_parallel.__doc__ = original.__doc__
    initialize_model_parallel.__qualname__ = original.__qualname__
    return initialize_model_parallel


#: The patch (listed in :mod:`rankmesh.patches`; installed by the one switch, :mod:`rankmesh.switch`).
PATCH = Patch(
    "megatron",
    _PS,
    "initialize_model_parallel",
    _make,
    why="megatron-core creates every group of the job on every rank (281,138 new_group calls per rank at "
    "131,072); rankmesh's creates this rank's, O(group size), and leaves parallel_state as megatron-core's does",
    detail="(initialize_model_parallel, RankGenerator and the helpers it reproduces, by body)",
    gate=CODE,
)
