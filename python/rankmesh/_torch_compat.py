"""Everything about torch's ``DeviceMesh`` that differs between the supported torch versions, and
the start-up self-check that decides whether rankmesh's fast meshes may be used at all.

rankmesh's meshes (:mod:`rankmesh.mesh`) are instances of a subclass of torch's ``DeviceMesh``
that sets torch's own private fields from precomputed state. That is only safe on a torch whose
``DeviceMesh`` we have read and tested, so:

- ``SUPPORTED`` lists the (major, minor) versions the whole suite runs on (CI: newest and oldest);
- :func:`fast_meshes_available` runs once per process: on an unknown torch, or when the self-check
  finds a field or method missing, it returns False and warns once, and every caller falls back to
  torch's own ``DeviceMesh`` construction (slow, but never wrong).

The differences, one line each:

- 2.13: ``DeviceMesh`` derives from ``torch._opaque_base.OpaqueBase`` and is registered with
  ``register_opaque_type(typ="reference")``; it has no ``_preserve_rank_order`` field.
- 2.14: adds ``preserve_rank_order`` (constructor argument, ``_preserve_rank_order`` field, part of
  ``__eq__``, ``__hash__`` and the torch.compile guard).
- 2.15: ``DeviceMesh`` derives from ``torch._custom_class_base.CustomClassBase`` and is registered
  with ``register_custom_class(typ="symbolic")``; the opaque-type registry walks the MRO, so a
  subclass is compiled exactly like ``DeviceMesh`` on every supported version.
"""

from __future__ import annotations

import re
import warnings

import torch
from torch.distributed.device_mesh import DeviceMesh

__all__ = [
    "SUPPORTED",
    "TORCH_VERSION",
    "HAS_PRESERVE_RANK_ORDER",
    "eq_fields",
    "fast_meshes_available",
]

#: torch (major, minor) versions the fast meshes are tested on.
SUPPORTED: tuple[tuple[int, int], ...] = ((2, 13), (2, 14), (2, 15))


def _parse(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


TORCH_VERSION: tuple[int, int] = _parse(torch.__version__)

#: 2.14+: ``_preserve_rank_order`` exists and takes part in equality, hashing and compile guards.
HAS_PRESERVE_RANK_ORDER: bool = "_preserve_rank_order" in getattr(DeviceMesh, "__annotations__", {})

# torch's equality/hash fields after ``_flatten_rank_map``, in torch's order (``_hash_key``).
_EQ_FIELDS: tuple[str, ...] = ("_layout", "_device_type", "_mesh_dim_names", "_thread_id") + (
    ("_preserve_rank_order",) if HAS_PRESERVE_RANK_ORDER else ()
)


def eq_fields(mesh: DeviceMesh) -> tuple:
    """The fields torch's ``DeviceMesh.__eq__``/``__hash__`` compare, less the rank map."""
    return tuple(getattr(mesh, f) for f in _EQ_FIELDS)


# Private members of DeviceMesh that the fast meshes read, set or override. If any is missing the
# torch is not one we know, whatever its version string says.
_REQUIRED_METHODS = (
    "_create_sub_mesh",
    "_create_flatten_mesh",
    "_create_unflatten_mesh",
    "_get_slice_mesh_layout",
    "_get_root_mesh",
    "_setup_world_group_and_device",
    "_compute_coordinate_on_dim",
    "_unflatten",
    "_flatten",
    "__getitem__",
    "get_group",
)
_REQUIRED_FIELDS = ("_rank_map", "_layout", "_mesh_dim_names", "_root_mesh", "_flatten_mapping", "_pg_registry")

_state: dict[str, object] = {}


def _self_check() -> str | None:
    """Why the fast meshes cannot be used on this torch, or None when they can."""
    if TORCH_VERSION not in SUPPORTED:
        return (
            f"torch {torch.__version__} is not one rankmesh's fast DeviceMesh was tested on "
            f"(supported: {', '.join(f'{a}.{b}' for a, b in SUPPORTED)})"
        )
    missing = [m for m in _REQUIRED_METHODS if not callable(getattr(DeviceMesh, m, None))]
    annotations = getattr(DeviceMesh, "__annotations__", {})
    missing += [f for f in _REQUIRED_FIELDS if f not in annotations]
    if missing:
        return f"torch {torch.__version__}'s DeviceMesh lacks {missing}"
    try:
        from torch.distributed._mesh_layout import _MeshLayout

        from rankmesh._native import MeshLayout

        # The two algebras must agree on a layout that exercises composition and coalescing.
        tl = _MeshLayout.from_sizes_strides((24,))
        tl = tl.splice(0, 1, tl[0].composition(_MeshLayout.from_sizes_strides((2, 3, 4))))
        rm = MeshLayout.world(24).unflatten("world", (2, 3, 4), ("a", "b", "c"))
        for i in range(3):
            if tuple(rm.modes(i)) != tuple(zip(tl[i].shape, tl[i].stride)):
                return f"torch {torch.__version__}'s _MeshLayout disagrees with rankmesh on dim {i}"
        flat = _MeshLayout([tl[0], tl[2]]).collapse()
        if tuple(rm["a", "c"].flatten("f").modes(0)) != tuple(zip(flat.shape, flat.stride)):
            return f"torch {torch.__version__}'s _MeshLayout.collapse disagrees with rankmesh"
    except Exception as e:  # pragma: no cover - only on a torch we do not know
        return f"the self-check failed on torch {torch.__version__}: {type(e).__name__}: {e}"
    return None


def fast_meshes_available() -> bool:
    """True when rankmesh may build its fast ``DeviceMesh`` objects on this torch.

    Decided once per process. When False, a single ``RuntimeWarning`` says why, and rankmesh uses
    torch's own ``DeviceMesh`` construction instead (same meshes, stock speed).
    """
    if "ok" not in _state:
        reason = _self_check()
        _state["ok"] = reason is None
        if reason is not None:
            warnings.warn(
                f"rankmesh: {reason}; falling back to torch's own DeviceMesh construction "
                "(correct, but O(world size) per mesh). Install a supported torch to get the fast path.",
                RuntimeWarning,
                stacklevel=3,
            )
    return bool(_state["ok"])
