"""Everything about torch's ``DeviceMesh`` that differs between the supported torch versions, and
the start-up self-check that decides whether rankmesh's fast meshes may be used at all.

rankmesh's meshes (:mod:`rankmesh.mesh`) are instances of a subclass of torch's ``DeviceMesh``
that sets torch's own private fields from precomputed state. That is only safe on a torch whose
``DeviceMesh`` we have read and tested, so:

- the torch releases read are ``rankmesh._dependencies.DEPENDENCIES["torch"].releases`` (the whole
  suite runs on them; CI: newest and oldest);
- :func:`fast_meshes_available` runs once per process: on an unknown torch, or when the self-check
  finds a field or method missing, it returns False and warns once, and every caller falls back to
  torch's own ``DeviceMesh`` construction (slow, but never wrong).

The differences, one line each:

- 2.13: ``DeviceMesh`` derives from ``torch._opaque_base.OpaqueBase`` and is registered with
  ``register_opaque_type(typ="reference")``; it has no ``_preserve_rank_order`` field.
- 2.14: ``DeviceMesh`` derives from ``torch._custom_class_base.CustomClassBase`` and is registered
  with ``register_custom_class(typ="symbolic")``; the opaque-type registry walks the MRO, so a
  subclass is compiled exactly like ``DeviceMesh`` on every supported version. Its ``__init__`` is
  still 2.13's (read from the 2.14.0 and 2.14.1 wheels).
- 2.15: adds ``preserve_rank_order`` (constructor argument, ``_preserve_rank_order`` field, part of
  ``__eq__``, ``__hash__`` and the torch.compile guard).

The one patch of torch's class (``rankmesh.patches``' "concatenate", recognised by the body hash
of torch's function per release, :data:`CONCATENATE_CODE`): ``DeviceMesh._concatenate`` is a
static method that FSDP2 calls on ``DeviceMesh`` itself (``fully_shard`` joins its dp mesh with
the parameters' TP/EP mesh), so no subclass can override it. On 2.13-2.15 it builds a plain
``DeviceMesh`` over the world's rank map (``tolist()`` of W ranks, then torch's W-long ``__eq__``
wherever DTensor compares it). The patch hands the call to rankmesh only when every input is a
rankmesh mesh of one world, and calls torch's own function otherwise; it is installed once, by
the first fast mesh of a process (``rankmesh.mesh``'s builders), and only on a torch whose
``_concatenate`` the self-check recognises.

Private torch state is named in two modules only, each with a start-up check
(``tests/test_structure.py`` fails on a private torch name anywhere else in the package;
:mod:`rankmesh.mesh` reads and sets the ``DeviceMesh`` fields listed here):

- here: ``DeviceMesh``'s private fields and methods (``_REQUIRED_METHODS``, ``_REQUIRED_FIELDS``,
  ``_READ_FIELDS``; a test checks that every one rankmesh names, the fields torch's methods set
  included, is listed, and that renaming any field rankmesh writes fails the check), the body of
  ``DeviceMesh._concatenate`` (:data:`CONCATENATE_CODE`), ``Tensor._version`` (``_TENSOR_FIELDS``,
  read through :func:`tensor_version`), torch's
  layout algebra (``_MeshLayout``, ``_FlatLayout``, compared with rankmesh's by the self-check),
  ``_normalize_backend_override`` and c10d's ``Backend.Options``, and the argument checks of
  ``DeviceMesh._unflatten`` / ``_create_unflatten_mesh`` / ``_create_flatten_mesh``, which
  :func:`torch_rejects` runs on a stand-in so that rankmesh's errors start with torch's own text;
- :mod:`rankmesh._fast_groups`: every read and write of c10d's private group registry
  (``_new_process_group_helper``, ``_register_pg_in_world``, ``_resolve_process_group``,
  ``_world``'s tables and counter, the hashed-name scheme, the backend's
  ``ProcessGroup.split_group``), with its own start-up checks in :mod:`rankmesh._fast_groups_check`
  (body hashes, then a probe for ``new_group`` and one for ``split_group``); a torch it does not
  recognise gets torch's own ``new_group`` / ``split_group``.
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
import types

import torch

# torch's private layout algebra and DeviceMesh helpers that rankmesh.mesh uses, imported here and
# nowhere else. They exist on every supported torch; if one is renamed, importing rankmesh fails the
# same way on every rank (an ImportError at start-up, never a hang).
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch.distributed._mesh_layout import _FlatLayout as FlatLayout
from torch.distributed._mesh_layout import _MeshLayout as TorchMeshLayout
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import _normalize_backend_override as normalize_backend_override

from rankmesh import _verdicts
from rankmesh._dependencies import unsupported, warn_unsupported
from rankmesh._patch import Gate

#: ``ProcessGroup.Options`` of c10d's backend class, as torch's device_mesh imports it.
C10dOptions = _C10dBackend.Options

__all__ = [
    "CONCATENATE_CODE",
    "TORCH_VERSION",
    "HAS_PRESERVE_RANK_ORDER",
    "C10dOptions",
    "FlatLayout",
    "TorchMeshLayout",
    "eq_fields",
    "flat_layout",
    "normalize_backend_override",
    "torch_init_rejects",
    "torch_rejects",
    "unknown_backend_text",
    "fast_meshes_available",
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


class _WouldBuild(Exception):
    """Raised by a :class:`_StandIn` where torch's method has passed its checks and starts building."""


class _StandIn:
    """A mesh as torch's argument checks see it: the fields they read come from the real mesh;
    anything else (the first step of building a mesh or a process group: ``device_type``,
    ``_rank_map``, ``_create_unflatten_mesh``, ...) stops the call with :class:`_WouldBuild`."""

    __slots__ = ("_mesh",)
    _READS = frozenset({"ndim", "mesh_dim_names", "_mesh_dim_names", "_layout", "_flatten_mapping"})

    def __init__(self, mesh: DeviceMesh) -> None:
        object.__setattr__(self, "_mesh", mesh)

    def __getattr__(self, name: str):
        if name in _StandIn._READS:
            return getattr(self._mesh, name)
        if name == "_get_root_mesh":
            return lambda: _StandIn(self._mesh._get_root_mesh())
        raise _WouldBuild(name)

    def __setattr__(self, name: str, value) -> None:
        raise _WouldBuild(name)

    def __format__(self, spec: str) -> str:  # torch's messages name the mesh: the real one's text
        return format(self._mesh, spec)

    def __str__(self) -> str:
        return str(self._mesh)

    __repr__ = __str__


def torch_rejects(method: str, mesh: DeviceMesh, *args) -> Exception | None:
    """What torch's own ``DeviceMesh.<method>(mesh, *args)`` raises, or None where its checks pass.

    rankmesh overrides ``_unflatten``, ``_create_unflatten_mesh`` and ``_create_flatten_mesh``, and
    raises its own typed errors; each starts with the text of the check torch itself makes, for
    the torch running (not a copy of torch's strings). torch has no separate function for these
    checks, so its method runs on a stand-in of ``mesh`` that reads the mesh's fields and builds
    nothing: where torch would go on to build (a torch that accepts what rankmesh refuses), the
    call stops and the answer is None, and rankmesh's error keeps its own text. Callers pass the
    arguments of one check, the others neutral, so the error that comes back is that check's.
    """
    try:
        getattr(DeviceMesh, method)(_StandIn(mesh), *args)
    except _WouldBuild:
        return None
    except Exception as e:  # torch's own check
        return e
    return None


class _Stop:
    """Stands in for ``DeviceMesh`` and ``_MeshLayout`` inside torch's ``init_device_mesh`` while
    :func:`torch_init_rejects` runs it: the first use means torch's checks have passed."""

    def __getattr__(self, name: str):
        raise _WouldBuild(name)

    def __call__(self, *args, **kwargs):
        raise _WouldBuild("DeviceMesh")


_init_lock = threading.Lock()


def torch_init_rejects(device_type: str, mesh_shape: tuple[int, ...], mesh_dim_names) -> Exception | None:
    """What torch's own ``init_device_mesh(device_type, mesh_shape, mesh_dim_names=...)`` raises, or
    None where its argument checks pass (the names unique, as many as the dims, a device type
    without an index). torch has no separate function for them, so its ``init_device_mesh`` runs
    with the module's ``_MeshLayout`` and ``DeviceMesh`` replaced by stand-ins that stop the call
    at the first step that would build something (no layout, no rank map, no process group).
    Called only where rankmesh's own check has already failed, so that rankmesh's error starts
    with torch's text for the torch running."""
    import inspect

    import torch.distributed.device_mesh as dm

    # torch's own function even where rankmesh.accelerate() put rankmesh's in its place (the
    # replacement keeps torch's as __wrapped__): calling the replacement would come back here.
    torch_init = inspect.unwrap(dm.init_device_mesh)
    with _init_lock:
        saved = {k: dm.__dict__[k] for k in ("_MeshLayout", "DeviceMesh")}
        dm.__dict__.update(_MeshLayout=_Stop(), DeviceMesh=_Stop())
        try:
            torch_init(device_type, tuple(mesh_shape), mesh_dim_names=mesh_dim_names)
        except _WouldBuild:
            return None
        except Exception as e:  # torch's own check
            return e
        finally:
            dm.__dict__.update(saved)
    return None


def unknown_backend_text(name: str) -> str:
    """torch's error for a backend name c10d does not know. torch checks the name only while it
    creates the group (inline in ``distributed_c10d._new_process_group_helper``, an
    ``AssertionError`` raised after the groups of the dims before it were made), with no function
    that could be called first, so this is the one copy of a torch message in rankmesh; the
    property test ``tests/test_torch_answers.py`` compares it with what torch raises, so a new
    wording fails there instead of drifting."""
    import torch.distributed as dist

    return f"Unknown backend type {dist.Backend(name)}"  # torch's name: Backend(...), lower case


def tensor_version(tensor: torch.Tensor) -> int:
    """``tensor``'s version counter (torch's private ``Tensor._version``, which every in-place change
    moves): how a rank map read once is known to be unchanged."""
    return tensor._version


# torch's own ``DeviceMesh._concatenate`` (a staticmethod; 2.13-2.15 take one argument, the list).
_TORCH_CONCATENATE = DeviceMesh.__dict__.get("_concatenate")
_DEVICE_MESH = "torch.distributed.device_mesh.DeviceMesh"

#: The body of torch's ``DeviceMesh._concatenate`` (what it reads from each mesh and passes on,
#: which rankmesh's meshes must hold): part of the self-check, and the "concatenate" patch's gate.
CONCATENATE_CODE = Gate("torch", [f"{_DEVICE_MESH}._concatenate"])


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
    return _verdicts.verdict("torch_compat algebra", key, _algebra_reason)


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
