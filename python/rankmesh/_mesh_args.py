"""The argument checks of rankmesh's ``DeviceMesh`` faces (``init_device_mesh``, ``from_group``,
``_flatten``, ``_unflatten``, ``backend_override``), each error starting with torch's own text
for the torch running where torch refuses the same value: torch's checks run on a stand-in that
builds nothing (:func:`torch_rejects`, :func:`torch_init_rejects`), never a copy of its strings.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from rankmesh._check import as_int, as_sequence, check_str, check_unique, positive_int, type_name
from rankmesh._torch_compat import C10dOptions, normalize_backend_override
from rankmesh.errors import (
    ArgumentTypeError,
    DistributedStateError,
    DuplicateNameError,
    MeshArgumentError,
    SizeMismatchError,
)
from rankmesh.process_groups import check_backend_name

__all__ = [
    "NO_OVERRIDE",
    "BackendConfig",
    "Given",
    "backend_configs",
    "check_backend",
    "from_group_arguments",
    "init_arguments",
    "names_tuple",
    "normalize_overrides",
    "sizes_tuple",
    "torch_first",
    "torch_init_rejects",
    "torch_rejects",
    "unknown_backend_text",
]

BackendConfig = tuple[Any, Any]
NO_OVERRIDE: BackendConfig = (None, None)


def names_tuple(value: Any, field: str) -> tuple[str, ...]:
    names = as_sequence(value, field, "names", noun="a tuple")
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise ArgumentTypeError(
                f"{field}[{i}] must be a str name, got {type_name(n)} {n!r}", field=f"{field}[{i}]", value=n
            )
        check_str(n, f"{field}[{i}]")  # valid UTF-8 text (no lone surrogates)
    check_unique(
        names,
        field,
        lambda n: (
            f"Each mesh_dim_name must be unique. Found repeated mesh_dim_name {n!r} in {field} {names}; "
            "rename one of them"
        ),
        value_is_all=True,
    )
    return names


def sizes_tuple(value: Any, field: str) -> tuple[int, ...]:
    """Mesh sizes: each an int >= 1 by :mod:`rankmesh._check`'s rule (no bool, float or str)."""
    sizes = as_sequence(value, field, "sizes", noun="a tuple")
    hint = "; every mesh dimension needs at least one rank"
    return tuple(positive_int(s, f"{field}[{i}]", hint=hint) for i, s in enumerate(sizes))


def torch_first(torch_error: BaseException | None, own: str, hint: str) -> str:
    """An error message: torch's own where torch raises for the same case (``str`` of what its
    check raised, for the torch running), else rankmesh's words for it; then rankmesh's hint."""
    first = own if torch_error is None else str(torch_error)
    if first.endswith((".", "!")):
        return f"{first} {hint[:1].upper()}{hint[1:]}"
    return f"{first}; {hint}"


def check_backend(name: str | None, field: str) -> None:
    """:func:`check_backend_name`, its error starting with torch's for the same name where torch
    refuses it too: a non-empty single name c10d does not know (``"Unknown backend type ..."``,
    which torch raises only while creating the group; see :func:`unknown_backend_text`).
    torch takes ``""`` as the default backend, which rankmesh refuses in its own words."""
    try:
        check_backend_name(name, field)
    except MeshArgumentError as e:
        if not name or "," in name:
            raise
        raise MeshArgumentError(
            f"{unknown_backend_text(name)}; {e}", field=e.field, value=e.value, kind=e.kind, ctx=e.ctx, fix=e.fix
        ) from None


def backend_config(value: Any, field: str) -> BackendConfig:
    """One dim's override as torch takes it (a backend name, ``Backend.Options``, or a
    ``(name, options)`` pair), as torch's ``(backend, options)`` pair. The options of a ``fake``
    override (``FakeProcessGroup.Options``) reach its group as torch passes them."""
    if isinstance(value, str):
        check_backend(value, field)
        return (value, None)
    if isinstance(value, C10dOptions):
        return (None, value)
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], (str, type(None)))
        and isinstance(value[1], (C10dOptions, type(None)))
    ):
        check_backend(value[0], field)
        return value
    # torch checks none of this: a malformed value fails inside its group creation (unpacking it,
    # or reading ``_timeout``) with Python's TypeError / ValueError / AttributeError, which is no
    # check of torch's; rankmesh's ArgumentTypeError (a TypeError) keeps its own words.
    raise ArgumentTypeError(
        f"{field} must be a backend name (e.g. 'gloo', 'fake'), a Backend.Options, or a (name, options) "
        f"pair, got {type_name(value)} {value!r}",
        field=field,
        value=value,
    )


class Given:
    """One dim's override as the caller gave it, with the key the caller used. torch's
    ``normalize_backend_override`` yields such an object unchanged (it converts only ``str`` and
    ``Backend.Options`` values), so torch itself decides which key is which dim."""

    __slots__ = ("key", "value")

    def __init__(self, key: Any, value: Any) -> None:
        self.key = key
        self.value = value


def is_key(k: Any) -> bool:
    """rankmesh's rule for a ``backend_override`` key: a name, or an int (never a bool or a float,
    which torch's ``in`` would take for the index they equal)."""
    return isinstance(k, str) or (not isinstance(k, bool) and hasattr(k, "__index__"))


def normalize_overrides(
    backend_override: Mapping[Any, Any] | None, ndim: int, names: tuple[str, ...] | None
) -> tuple[Given | None, ...]:
    """The keys of ``backend_override``, checked as torch checks them and in torch's order: torch's
    own ``normalize_backend_override`` runs first (a dim named by both its index and its name,
    then keys that name no dim), and its ``RuntimeError`` is the start of rankmesh's error (a
    :class:`MeshArgumentError`, or an :class:`ArgumentTypeError` where a key is neither a name nor
    an int); then rankmesh's own rule refuses a bool or float key that torch took for an index.
    Per dim, the value given (with its key), or None. The values are checked by
    :func:`backend_configs`, later, where torch checks them (creating the groups). The caller's
    mapping is left as it is (torch's ``init_device_mesh`` empties it)."""
    if backend_override is None:
        return (None,) * ndim
    if not isinstance(backend_override, Mapping):
        raise ArgumentTypeError(
            f"backend_override must be a mapping of dim (name or index) -> backend, got "
            f"{type_name(backend_override)} {backend_override!r}",
            field="backend_override",
            value=backend_override,
        )
    given = {k: Given(k, v) for k, v in backend_override.items()}
    torch_error = None
    try:
        per_dim = tuple(normalize_backend_override(dict(given), ndim, names))
    except RuntimeError as e:
        torch_error = e
    bad = [k for k in backend_override if not is_key(k)]
    if bad:
        why = f"backend_override keys must be dim names (str) or indices (int), got {type_name(bad[0])} {bad[0]!r}"
        raise ArgumentTypeError(
            why if torch_error is None else f"{torch_error}; {why}", field="backend_override", value=bad[0]
        ) from torch_error
    if torch_error is not None:
        raise MeshArgumentError(
            f"{torch_error}; name each overridden dim by one of its names {list(names or ())} or its index",
            field="backend_override",
            value=backend_override,
        ) from torch_error
    return tuple(g if isinstance(g, Given) else None for g in per_dim)


def backend_configs(given: Sequence[Given | None]) -> tuple[BackendConfig, ...]:
    """Each dim's override (from :func:`normalize_overrides`) as torch's ``(backend, options)``
    pair, checked in dim order, the order in which torch creates the groups and fails on the first
    bad one."""
    out = []
    for g in given:
        if g is None:
            out.append(NO_OVERRIDE)
        else:
            key = g.key if isinstance(g.key, str) else as_int(g.key, "backend_override")
            out.append(backend_config(g.value, f"backend_override[{key!r}]"))
    return tuple(out)


def init_arguments(
    device_type: Any, mesh_shape: Any, mesh_dim_names: Any, backend_override: Any
) -> tuple[tuple[int, ...], tuple[str, ...] | None, Any]:
    """:func:`init_device_mesh`'s arguments checked in torch's order, with torch's messages
    where torch refuses them too: ``(shape, names, overrides)``."""
    shape = sizes_tuple(mesh_shape, "mesh_shape")
    if not shape:
        raise SizeMismatchError("mesh_shape must have at least one dim", field="mesh_shape", value=mesh_shape)
    names = None
    if mesh_dim_names is not None:
        try:
            names = names_tuple(mesh_dim_names, "mesh_dim_names")
        except DuplicateNameError:
            given = tuple(mesh_dim_names)
            twice = next(n for n in given if given.count(n) > 1)
            raise DuplicateNameError(
                torch_first(
                    torch_init_rejects("cpu", shape, given),
                    f"Each mesh_dim_name must be unique. Found repeated mesh_dim_name {twice!r} in mesh_dim_names "
                    f"{given}",
                    "rename one of them",
                ),
                field="mesh_dim_names",
                value=given,
            ) from None
    if names is not None and len(names) != len(shape):
        raise SizeMismatchError(
            torch_first(
                torch_init_rejects("cpu", shape, names),
                "mesh_shape and mesh_dim_names should have same length! Found "
                f"len(mesh_dim_names): {len(names)} and len(mesh_shape): {len(shape)}",
                "give one name per dim",
            ),
            field="mesh_dim_names",
            value=names,
        )
    given = normalize_overrides(backend_override, len(shape), names)  # torch: the keys before the device
    if not isinstance(device_type, str):
        raise ArgumentTypeError(
            f"device_type must be a str such as 'cuda' or 'cpu', got {type_name(device_type)} {device_type!r}",
            field="device_type",
            value=device_type,
        )
    if device_type and not device_type.isalpha():
        raise MeshArgumentError(
            torch_first(
                torch_init_rejects(device_type, shape, names),
                f"Device type with index is not supported but got {device_type!r}",
                "pass the type only, e.g. 'cuda' (torch.device(...).type)",
            ),
            field="device_type",
            value=device_type,
        )
    return shape, names, backend_configs(given)  # torch: the backends when it creates the groups


def from_group_arguments(
    group: Any, device_type: Any, mesh_dim_names: Any
) -> tuple[bool, list[Any], tuple[str, ...] | None]:
    """:func:`from_group`'s arguments checked: ``(one group given, the groups, the names)``."""
    check_str(device_type, "device_type")
    if type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER:  # new_group's answer on a non-member
        rank = dist.get_rank() if dist.is_initialized() else "?"
        raise DistributedStateError(
            f"group is GroupMember.NON_GROUP_MEMBER ({group}): this rank ({rank}) is not a member of that group; "
            "call from_group only on the group's member ranks, or pass, on each rank, the groups it belongs to",
            field="group",
            value=group,
        )
    single = isinstance(group, dist.ProcessGroup)
    groups = [group] if single else list(as_sequence(group, "group", "process groups"))
    if not groups:
        raise MeshArgumentError("Expects at least one ProcessGroup to be passed", field="group", value=group)
    names = names_tuple(mesh_dim_names, "mesh_dim_names") if mesh_dim_names is not None else None
    if not single and names is None:
        raise MeshArgumentError(
            "Must pass mesh_dim_names if passing multiple ProcessGroups: one name per group",
            field="mesh_dim_names",
            value=None,
        )
    if names is not None and len(names) != len(groups):
        raise SizeMismatchError(
            f"mesh_dim_names {names} has {len(names)} names for {len(groups)} ProcessGroups; give one name per group",
            field="mesh_dim_names",
            value=names,
        )
    return single, groups, names


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
    return f"Unknown backend type {dist.Backend(name)}"  # torch's name: Backend(...), lower case
