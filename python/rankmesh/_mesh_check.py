"""Whether this torch's ``DeviceMesh`` is the one :mod:`rankmesh.mesh` reproduces: the start-up
self-check of the fast meshes, decided once per process (:func:`fast_meshes_available`).

rankmesh's meshes set torch's own private fields from precomputed state, which is only safe on a
``DeviceMesh`` rankmesh has read. The check: torch's release is read (``rankmesh._known``); every
private method and field rankmesh reads or writes exists (the lists below: ``tests/test_structure``
checks that every one rankmesh names is listed, and that renaming one fails the check), and the
fields whose meaning lies in a torch method are still read by it; ``DeviceMesh._concatenate``'s
body is the table's (:data:`CONCATENATE_CODE`, also the "concatenate" patch's gate); torch's
layout algebra agrees with rankmesh's (kept once per install: :mod:`rankmesh._verdicts`). On any
failure it warns once and every caller takes torch's own ``DeviceMesh`` construction.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch
from torch.distributed.device_mesh import DeviceMesh

from rankmesh import _verdicts
from rankmesh._dependencies import unsupported, warn_unsupported
from rankmesh._patch import Gate
from rankmesh._torch_compat import FlatLayout, TorchMeshLayout, flat_layout

__all__ = ["CONCATENATE_CODE", "fast_meshes_available"]

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
# Every DeviceMesh field rankmesh reads or writes: each a class annotation or a name in the code of
# ``DeviceMesh.__init__`` (which sets ``_coordinate_on_dim``, ``_dim_group_names``,
# ``_flatten_rank_map`` and ``_hash`` without one). ``_preserve_rank_order`` is version-dependent
# (HAS_PRESERVE_RANK_ORDER).
_REQUIRED_FIELDS = (
    "_rank_map",
    "_layout",
    "_mesh_dim_names",
    "_root_mesh",
    "_flatten_mapping",
    "_pg_registry",
    "_device_type",
    "_rank",
    "_thread_id",
    "_coordinate_on_dim",
    "_dim_group_names",
    "_flatten_rank_map",
    "_hash",
)
# Fields rankmesh sets whose meaning lies in a method torch runs on a fast mesh: (field, the
# DeviceMesh method whose body must still read it). ``_coordinate_on_dim``: torch's
# ``get_coordinate`` returns it (2.13-2.15), so a torch that renamed it would answer wrong coordinates.
_READ_FIELDS = (
    ("_dim_group_names", "get_group"),
    ("_flatten_mapping", "get_group"),
    ("_coordinate_on_dim", "get_coordinate"),
)
# Private fields of ``torch.Tensor`` rankmesh reads (through the functions below).
_TENSOR_FIELDS = ("_version",)

_state: dict[str, bool] = {}

_DEVICE_MESH = "torch.distributed.device_mesh.DeviceMesh"

#: The body of torch's ``DeviceMesh._concatenate`` (what it reads from each mesh and passes on,
#: which rankmesh's meshes must hold): part of the self-check, and the "concatenate" patch's gate.
CONCATENATE_CODE = Gate("torch", [f"{_DEVICE_MESH}._concatenate"])


def _self_check() -> str | None:
    """Why the fast meshes cannot be used on this torch, or None when they can."""
    reason = unsupported("torch")
    if reason is not None:
        return reason
    # Run by the first mesh of every process: plain loops, no comprehension (each is a code object
    # of its own, ~5 us the first time it runs: rankmesh._verdicts).
    missing = []
    for method in _REQUIRED_METHODS:
        if not callable(getattr(DeviceMesh, method, None)):
            missing.append(method)
    fields = set(getattr(DeviceMesh, "__annotations__", {}))
    fields.update(_code_names(DeviceMesh.__init__))
    for field in _REQUIRED_FIELDS:
        if field not in fields:
            missing.append(field)
    for field, method in _READ_FIELDS:
        if field not in _code_names(getattr(DeviceMesh, method, None)):
            missing.append(f"{field} (read by {method})")
    for field in _TENSOR_FIELDS:
        if not hasattr(torch.Tensor, field):
            missing.append(f"Tensor.{field}")
    if missing:
        return f"torch {torch.__version__}'s DeviceMesh lacks {missing}"
    concatenate = CONCATENATE_CODE.recognise()
    if concatenate is not None:
        return f"torch {torch.__version__}: {concatenate}"
    key = _algebra_key()
    if key is None:
        return _algebra_reason()
    return _verdicts.verdict("mesh_check algebra", key, _algebra_reason)


def _code_names(fn: object) -> tuple[str, ...]:
    """The names ``fn``'s code reads or sets (``co_names``: attributes and globals), torch's own
    where rankmesh's replacement wraps it; empty for no function."""
    fn = getattr(fn, "__func__", fn)
    if hasattr(fn, "__wrapped__"):
        fn = inspect.unwrap(fn)
    return getattr(getattr(fn, "__code__", None), "co_names", ())


def _algebra_key() -> str | None:
    """What decides :func:`_algebra_reason`: torch's and rankmesh's versions and the size and
    mtime of the files of both algebras (torch's ``_mesh_layout`` and ``_pycute``, rankmesh's
    native module and this file), read with ``os.stat`` only; None when one cannot be stat'ed."""
    from rankmesh._native import __version__ as rankmesh_version  # Cargo's, not the package's

    native = sys.modules.get("rankmesh._native")
    files = [sys.modules[TorchMeshLayout.__module__].__file__, __file__, getattr(native, "__file__", None)]
    pycute = sys.modules.get("torch.distributed._pycute")
    if pycute is not None:  # the package and the modules it imports (no listdir: ~0.03 ms)
        inside = pycute.__name__ + "."
        files.append(pycute.__file__)
        modules = []
        for value in vars(pycute).values():  # a loop: no comprehension to run cold (_self_check)
            if isinstance(value, types.ModuleType) and value.__name__.startswith(inside):
                modules.append(value.__file__)
        modules.sort()
        files += modules
    return _verdicts.code_key(
        files,
        torch=(str(torch.__version__), str(getattr(torch.version, "git_version", ""))),
        rankmesh=rankmesh_version,
    )


def _algebra_reason() -> str | None:
    """Why torch's layout algebra and rankmesh's disagree (on a layout that exercises composition,
    coalescing and flattening), or None: the part of the self-check decided by the two algebras'
    code alone, so its verdict is kept once per install (:mod:`rankmesh._verdicts`)."""
    try:
        from rankmesh._native import MeshLayout

        ours = flat_layout([(2, 1), (3, 2)])
        if set(vars(ours)) != set(vars(FlatLayout((2, 3), (1, 2)))) or ours != FlatLayout((2, 3), (1, 2)):
            return f"torch {torch.__version__}'s _FlatLayout is no longer a dataclass of shape and stride"
        # The two algebras must agree on a layout that exercises composition and coalescing.
        tl = TorchMeshLayout.from_sizes_strides((24,))
        tl = tl.splice(0, 1, tl[0].composition(TorchMeshLayout.from_sizes_strides((2, 3, 4))))
        rm = MeshLayout.world(24).unflatten("world", (2, 3, 4), ("a", "b", "c"))
        for i in range(3):
            if tuple(rm.modes(i)) != tuple(zip(tl[i].shape, tl[i].stride)):
                return f"torch {torch.__version__}'s _MeshLayout disagrees with rankmesh on dim {i}"
        flat = TorchMeshLayout([tl[0], tl[2]]).collapse()
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
            warn_unsupported(
                "torch",
                reason,
                "falling back to torch's own DeviceMesh construction (correct, but O(world size) per mesh)",
                stacklevel=4,
            )
    return bool(_state["ok"])
