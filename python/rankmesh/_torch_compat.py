"""torch's private names that rankmesh uses, and everything about ``DeviceMesh`` that differs
between the torch releases read (a home of private torch state: ``tests/test_structure.py``
fails on a private torch import, c10d read or string-named private member anywhere but here,
:mod:`rankmesh._fast_groups` and :mod:`rankmesh._fast_groups_check`). Whether rankmesh's fast
meshes may run on this torch at all is :mod:`rankmesh._mesh_check`'s start-up self-check.

The differences, one line each:

- 2.13: ``DeviceMesh`` derives from ``torch._opaque_base.OpaqueBase`` and is registered with
  ``register_opaque_type(typ="reference")``; it has no ``_preserve_rank_order`` field.
- 2.14: ``DeviceMesh`` derives from ``torch._custom_class_base.CustomClassBase`` and is registered
  with ``register_custom_class(typ="symbolic")``; the opaque-type registry walks the MRO, so a
  subclass is compiled exactly like ``DeviceMesh`` on every supported version. Its ``__init__`` is
  still 2.13's (read from the 2.14.0 and 2.14.1 wheels).
- 2.15: adds ``preserve_rank_order`` (constructor argument, ``_preserve_rank_order`` field, part of
  ``__eq__``, ``__hash__`` and the torch.compile guard).

``DeviceMesh._concatenate`` is a static method that FSDP2 calls on ``DeviceMesh`` itself, so no
subclass can override it; the "concatenate" patch (:mod:`rankmesh.mesh`) replaces it, gated by its
body (:data:`rankmesh._mesh_check.CONCATENATE_CODE`).
"""

from __future__ import annotations

import re

import torch

# torch's private layout algebra and DeviceMesh helpers that rankmesh.mesh uses, imported here and
# nowhere else. They exist on every supported torch; if one is renamed, importing rankmesh fails the
# same way on every rank (an ImportError at start-up, never a hang).
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch.distributed._mesh_layout import _FlatLayout as FlatLayout
from torch.distributed._mesh_layout import _MeshLayout as TorchMeshLayout
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import _normalize_backend_override as normalize_backend_override

#: ``ProcessGroup.Options`` of c10d's backend class, as torch's device_mesh imports it.
C10dOptions = _C10dBackend.Options

__all__ = [
    "TORCH_VERSION",
    "HAS_PRESERVE_RANK_ORDER",
    "C10dOptions",
    "FlatLayout",
    "TorchMeshLayout",
    "eq_fields",
    "flat_layout",
    "normalize_backend_override",
    "tensor_version",
    "native_tuple_hash_ok",
    "use_torchcomms",
    "accelerator_backend_name",
]


def _parse(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


#: torch's (major, minor), for comparisons (which releases are read: :mod:`rankmesh._dependencies`).
TORCH_VERSION: tuple[int, int] = _parse(torch.__version__)

#: 2.15+: ``_preserve_rank_order`` exists and takes part in equality, hashing and compile guards.
HAS_PRESERVE_RANK_ORDER: bool = "_preserve_rank_order" in getattr(DeviceMesh, "__annotations__", {})

# torch's equality/hash fields after ``_flatten_rank_map``, in torch's order (``_hash_key``).
_EQ_FIELDS: tuple[str, ...] = ("_layout", "_device_type", "_mesh_dim_names", "_thread_id") + (
    ("_preserve_rank_order",) if HAS_PRESERVE_RANK_ORDER else ()
)


def use_torchcomms() -> bool:
    """torch's ``dist_config.use_torchcomms`` (2.15: the torchcomms engine behind ``nccl``), which
    sends ``DeviceMesh``'s groups down the ``split_group`` road; False where torch has no such flag."""
    config = getattr(torch.distributed, "config", None)
    return bool(getattr(config, "use_torchcomms", False))


def accelerator_backend_name(group) -> str | None:  # noqa: ANN001
    """The name of ``group``'s backend for the current accelerator, as ``DeviceMesh`` compares it
    with a ``backend_override`` before splitting (``group._get_backend(device).name()``)."""
    try:
        return group._get_backend(torch.accelerator.current_accelerator()).name()
    except (RuntimeError, AttributeError):
        return None


def eq_fields(mesh: DeviceMesh) -> tuple:
    """The fields torch's ``DeviceMesh.__eq__``/``__hash__`` compare, less the rank map."""
    return tuple(getattr(mesh, f) for f in _EQ_FIELDS)


_state: dict[str, object] = {}


def flat_layout(modes) -> FlatLayout:
    """torch's ``_FlatLayout`` of already-coalesced ``(size, stride)`` modes, without re-running
    pycute's coalesce (rankmesh's Rust core coalesces exactly as ``_FlatLayout.__init__`` does;
    the self-check below and the test suite compare the two). ``_FlatLayout`` is a frozen
    dataclass of ``shape`` and ``stride``, which the self-check also checks."""
    fl = object.__new__(FlatLayout)
    object.__setattr__(fl, "shape", tuple(int(s) for s, _ in modes))
    object.__setattr__(fl, "stride", tuple(int(d) for _, d in modes))
    return fl


def tensor_version(tensor: torch.Tensor) -> int:
    """``tensor``'s version counter (torch's private ``Tensor._version``, which every in-place change
    moves): how a rank map read once is known to be unchanged."""
    return tensor._version


# torch's own ``DeviceMesh._concatenate`` (a staticmethod; 2.13-2.15 take one argument, the list).
_TORCH_CONCATENATE = DeviceMesh.__dict__.get("_concatenate")


def native_tuple_hash_ok() -> bool:
    """Whether ``MeshLayout.rank_map_tuple_hash`` equals this interpreter's ``hash(tuple(...))``
    (checked once, on an identity and a permuted world); if not, rankmesh hashes the W-long tuple
    in Python as torch does (same value, O(W) memory once per world)."""
    if "tuple_hash" not in _state:
        from rankmesh._native import MeshLayout

        perm = [3, 0, 4, 1, 2, 6, 5]
        _state["tuple_hash"] = (
            MeshLayout.world(7).rank_map_tuple_hash() == hash(tuple(range(7)))
            and MeshLayout.world(7, perm).rank_map_tuple_hash() == hash(tuple(perm))
            and MeshLayout.world(1).rank_map_tuple_hash() == hash((0,))
        )
    return bool(_state["tuple_hash"])
