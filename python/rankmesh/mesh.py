"""Real ``DeviceMesh`` objects that cost O(group size + ndim) per rank, all the way down.

:func:`init_device_mesh` has the semantics of torch's ``init_device_mesh`` and returns a
:class:`FastDeviceMesh`, a subclass of ``torch.distributed.device_mesh.DeviceMesh`` (so every
torch API that takes a mesh accepts it: DTensor, FSDP2, tensor parallel, ``torch.compile``,
pickling). Slicing, ``_flatten``, ``_unflatten`` and every query stay O(group size + ndim):

- the layout (torch's ``_MeshLayout``) is derived with torch's own algebra, which is O(ndim), and
  cross-checked against rankmesh's Rust layout of the same recipe;
- this rank's coordinate, local mesh and groups come from the Rust layout, never from a search
  over the world's rank map;
- the world's rank map (``_rank_map``, and the W-long ``_flatten_rank_map`` tuple torch uses for
  ``_concatenate`` and ``torch.compile`` guards) is made at most once per world, and only when
  something asks for it; equality and hashing use the world's identity, and the hash equals
  torch's own;
- process groups come from one :class:`~rankmesh.process_groups.MeshBuilder` per world: only this
  rank's group, one per distinct partition (and backend), shared by every mesh derived from the
  world; dims overridden to ``fake`` stay fake.

Why a subclass rather than torch's class filled in from outside: torch 2.13-2.15 recompute
``.mesh`` from the full rank map on every access and search it for the rank, and build the
W-long tuple in every ``__init__``; a subclass can keep both lazy and route ``_flatten`` /
``_unflatten`` / slicing through rankmesh, while every other method is torch's own.

Example (one process standing in for rank 5 of 8 on the fake backend)::

    >>> import torch.distributed as dist
    >>> from torch.testing._internal.distributed.fake_pg import FakeStore
    >>> dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
    >>> mesh = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
    >>> m = mesh._unflatten(0, (2, 2, 2), ("dp", "cp", "tp"))
    >>> m["dp", "tp"].mesh.tolist(), m.get_coordinate()
    ([[0, 1], [4, 5]], (1, 0, 1))
    >>> m["dp", "cp"]._flatten("dp_cp").mesh.tolist()
    [1, 3, 5, 7]
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import copy
import copyreg
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from rankmesh import _fast_groups, _mesh_check
from rankmesh import _torch_compat as compat
from rankmesh._check import (
    as_bool,
    as_int,
    as_layout,
    as_rank,
    as_sequence,
    check_str,
    type_name,
)
from rankmesh._mesh_args import (
    NO_OVERRIDE,
    BackendConfig,
    backend_config,
    backend_configs,
    from_group_arguments,
    init_arguments,
    names_tuple,
    normalize_overrides,
    sizes_tuple,
    torch_first,
    torch_rejects,
)
from rankmesh._native import MeshLayout, Slice
from rankmesh._once import warn_once
from rankmesh._patch import Patch
from rankmesh._torch_compat import C10dOptions as C10dOptions
from rankmesh._torch_compat import TorchMeshLayout as _MeshLayout
from rankmesh._torch_compat import flat_layout as _flat_layout
from rankmesh._torch_compat import normalize_backend_override as normalize_backend_override
from rankmesh.errors import (
    ArgumentTypeError,
    DimOutOfRangeError,
    DistributedStateError,
    DuplicateNameError,
    InternalError,
    InvalidRankMapError,
    MeshArgumentError,
    RankmeshError,
    RankOutOfRangeError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)
from rankmesh.process_groups import (
    FAKE,
    BuildReport,
    MeshBuilder,
    group_slice,
    require_default_group,
)
from rankmesh.recovery import active_world

__all__ = ["FastDeviceMesh", "from_group", "init_device_mesh"]


_log = logging.getLogger("rankmesh")

# A fast mesh's fields that torch's DeviceMesh.__getstate__ does not have (rankmesh's own, the
# process groups, the cached hash; on 2.13, _preserve_rank_order), left out when it pickles as torch's.
_NOT_TORCH_STATE = frozenset(
    ("_rm_world", "_rm_layout", "_pg_registry", "_hash")
    + (() if compat.HAS_PRESERVE_RANK_ORDER else ("_preserve_rank_order",))
)


class _HashOf:
    """Stands in for the W-long rank-map tuple inside torch's hash key: Python's tuple hash only
    uses its items' hashes, so ``hash((_HashOf(hash(t)), ...)) == hash((t, ...))``."""

    __slots__ = ("h",)

    def __init__(self, h: int) -> None:
        self.h = h

    def __hash__(self) -> int:
        return self.h


#: How many world-sized objects (the rank-map tensor, the W-long ``_flatten_rank_map`` tuple, or a
#: Python-side hash of it) rankmesh's meshes have built in this process, by kind. Each world makes
#: each at most once, and only when torch asks (``_concatenate`` of a torch mesh, compile guards);
#: the tests assert that a whole parallelisation at 2^20 ranks adds nothing here.
RANK_MAP_MATERIALISATIONS: dict[str, int] = {"rank_map": 0, "flatten_rank_map": 0, "python_hash": 0}


class _World:
    """What every mesh derived from one :func:`init_device_mesh` call shares: the Rust world
    layout, this rank, the process-group builder, and the lazily made world-sized objects."""

    def __init__(self, layout: MeshLayout, rank: int, builder: MeshBuilder | None) -> None:
        self.layout = as_layout(layout, "layout")
        self.rank = as_int(rank, "rank")
        self.builder = builder
        self._rank_map: torch.Tensor | None = None
        self._rank_map_tuple: tuple[int, ...] | None = None
        self._rank_map_hash: int | None = None
        self._lock = threading.Lock()
        #: Whether this rank is one of the world's ranks (always, unless the world is over part of
        #: the job: then a non-member holds meshes with no coordinate and no process groups).
        self.member = self.layout.is_member(self.rank)

    def rank_map(self) -> torch.Tensor:
        """The world's rank map as torch holds it (int32, 1-D, contiguous); made once."""
        if self._rank_map is None:
            RANK_MAP_MATERIALISATIONS["rank_map"] += 1
            rank_map = self.layout.rank_map()
            with torch.device("cpu"):
                t = (
                    torch.arange(self.layout.world_size, dtype=torch.int)
                    if rank_map is None
                    else torch.from_numpy(rank_map)
                )
            self._rank_map = t
        return self._rank_map

    def rank_map_tuple(self) -> tuple[int, ...]:
        """torch's ``_flatten_rank_map``: the rank map as a W-long tuple; made once."""
        with self._lock:
            if self._rank_map_tuple is None:
                RANK_MAP_MATERIALISATIONS["flatten_rank_map"] += 1
                self._rank_map_tuple = tuple(self.rank_map().tolist())
            return self._rank_map_tuple

    def rank_map_hash(self) -> int:
        """``hash(_flatten_rank_map)``: computed by the native module without building the tuple
        (O(W) integer work, nothing world-sized), or by Python when the start-up check found the
        native hash differs from this interpreter's."""
        with self._lock:
            if self._rank_map_hash is None:
                if compat.native_tuple_hash_ok():
                    self._rank_map_hash = self.layout.rank_map_tuple_hash()
                else:  # pragma: no cover - an interpreter whose tuple hash we do not know
                    RANK_MAP_MATERIALISATIONS["python_hash"] += 1
                    ranks = self._rank_map_tuple
                    self._rank_map_hash = hash(ranks if ranks is not None else tuple(self.rank_map().tolist()))
            return self._rank_map_hash

    def same(self, other: _World) -> bool:
        return self is other or self.matches(other.layout, other.rank)

    def matches(self, layout: MeshLayout, rank: int) -> bool:
        return self.rank == rank and self.layout == layout


def _modes(tl: _MeshLayout, i: int) -> list[tuple[int, int]]:
    return list(zip(tl[i].shape, tl[i].stride))


def _torch_layout(rm_layout: MeshLayout, dims: Sequence[int] | None = None) -> _MeshLayout:
    """torch's ``_MeshLayout`` of (some dims of) a rankmesh layout, O(modes)."""
    return _MeshLayout([_flat_layout(rm_layout.modes(i)) for i in (range(rm_layout.ndim) if dims is None else dims)])


def _mesh_order(own: tuple[str, ...], names: Sequence[str]) -> list[int] | None:
    """The indices of ``names`` in ``own`` when all are there, in increasing (mesh) order; else None."""
    idx = [own.index(n) if n in own else -1 for n in names]
    if idx and idx[0] >= 0 and all(b > a for a, b in zip(idx, idx[1:])):
        return idx
    return None


def _check_agree(rm_layout: MeshLayout, tl: _MeshLayout) -> None:
    """rankmesh's Rust layout and torch's ``_MeshLayout`` of one recipe must be the same modes."""
    n = rm_layout.ndim
    if n != len(tl) or any(list(map(tuple, rm_layout.modes(i))) != _modes(tl, i) for i in range(n)):
        raise InternalError(  # pragma: no cover - would be a rankmesh bug; never build a wrong mesh
            f"rankmesh and torch derived different layouts: {rm_layout!r} vs {tl}; please report this",
            field="layout",
            value=rm_layout,
        )


class FastDeviceMesh(DeviceMesh):
    """A ``torch.distributed.device_mesh.DeviceMesh`` whose derivations cost O(group size + ndim).

    Made by :func:`rankmesh.init_device_mesh` (and everything derived from it:
    ``mesh[names]``, ``mesh._flatten(name)``, ``mesh._unflatten(dim, sizes, names)``) and by
    :meth:`FastDeviceMesh.from_layout` and :func:`rankmesh.from_group`. Never construct it directly.

    Every public and semi-public attribute equals what torch builds for the same recipe: ``mesh``,
    ``shape``, ``ndim``, ``size()``, ``mesh_dim_names``, ``get_group``, ``get_coordinate``,
    ``get_local_rank``, ``_layout``, ``_rank_map``, ``_flatten_rank_map``, ``_dim_group_names``,
    ``_get_root_mesh()``, ``_flatten_mapping``; ``==`` and ``hash`` behave as torch's. On a rank
    outside a mesh over part of the job, ``get_group`` (and so ``get_local_rank``) says so where
    torch's fails with a bare ``IndexError``.
    """

    _rm_world: _World
    _rm_layout: MeshLayout

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: D107
        raise TypeError(
            "FastDeviceMesh is made by rankmesh.init_device_mesh (and slicing, _flatten, _unflatten of "
            "its result); to build a mesh from an explicit rank tensor use torch's DeviceMesh(...)"
        )

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_layout(
        cls,
        builder: MeshBuilder,
        layout: MeshLayout,
        *,
        fake_dims: Sequence[str | int] = (),
    ) -> DeviceMesh:
        """A ``DeviceMesh`` of ``layout`` for this rank over ``builder``'s process groups, like
        torch's ``DeviceMesh.from_group``: a root :class:`FastDeviceMesh` whose slices, flattens
        and unflattens stay O(group size) and share the builder's groups (and, on a torch
        rankmesh does not recognise, torch's own ``DeviceMesh`` over the same groups).

        Equal to what torch builds for the same layout (``init_device_mesh`` + ``_unflatten`` /
        slicing / ``_flatten``): same ``mesh``, group ranks, coordinate, local ranks and names.
        ``fake_dims`` (names or indices) get ``fake``-backend groups, as does every size-1 dim.
        Every mesh over one builder shares its world (rank map, fingerprint).

        Example: rank 5 of an 8-rank world (one process plays it on the ``fake`` backend)::

            >>> import torch.distributed as dist
            >>> from torch.testing._internal.distributed.fake_pg import FakeStore
            >>> from rankmesh import MeshBuilder, MeshLayout
            >>> dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=8)
            >>> world = MeshLayout.world(8)
            >>> layout = world.unflatten("world", (2, 2, 2), ("dp_replicate", "dp_shard", "tp"))
            >>> dm = FastDeviceMesh.from_layout(MeshBuilder(world), layout)
            >>> dm["dp_replicate", "dp_shard"].shape
            (2, 2)
            >>> dist.get_process_group_ranks(dm.get_group("tp"))  # ranks 4, 5; on ranks 6, 7: [6, 7]
            [4, 5]
            >>> dist.destroy_process_group()
        """
        if not isinstance(builder, MeshBuilder):
            raise ArgumentTypeError(
                f"builder must be a rankmesh.MeshBuilder, got {type_name(builder)} {builder!r}",
                field="builder",
                value=builder,
            )
        builder._check_layout(layout)
        fake_idx = _fake_dim_indices(layout, fake_dims)
        names = tuple(layout.names)
        if not _mesh_check.fast_meshes_available():
            # An unknown torch: torch's own DeviceMesh over the same process groups (O(W) per
            # mesh). Always the n-D form of from_group, also for one dim: the 1-D form re-reads
            # the group's ranks (O(W) in Python for a world-sized group) and rejects a mesh that
            # is not in sorted order, which a rank map can legitimately produce.
            groups = [
                builder.process_group(layout, i, fake=i in fake_idx, mesh_dim_name=names[i]) for i in range(len(names))
            ]
            mesh = torch.from_numpy(layout.mesh_of(builder.rank))
            return DeviceMesh.from_group(groups, builder.device_type, mesh=mesh, mesh_dim_names=names)
        CONCATENATE.install()  # a fast mesh is about to exist: FSDP2 may join it (see CONCATENATE)
        world = _world_of(builder)
        tl = _torch_layout(layout)
        root = cls._make(world, layout, tl, builder.device_type, names, [], None)
        overrides = [(FAKE, None) if i in fake_idx else NO_OVERRIDE for i in range(layout.ndim)]
        root.__dict__["_dim_group_names"] = root._groups_for(layout, range(layout.ndim), overrides)
        return root

    @classmethod
    def _make(
        cls,
        world: _World,
        rm_layout: MeshLayout,
        tl: _MeshLayout,
        device_type: str,
        names: tuple[str, ...] | None,
        group_names: list[str],
        root: FastDeviceMesh | None,
    ) -> FastDeviceMesh:
        self = object.__new__(cls)
        d = self.__dict__
        d["_rm_world"] = world
        d["_rm_layout"] = rm_layout
        d["_device_type"] = device_type
        d["_layout"] = tl
        d["_mesh_dim_names"] = names
        d["_root_mesh"] = root
        d["_preserve_rank_order"] = False
        d["_thread_id"] = threading.get_ident() if dist.is_initialized() and dist.get_backend() == "threaded" else None
        d["_flatten_mapping"] = {}
        d["_pg_registry"] = {}
        d["_dim_group_names"] = group_names
        d["_rank"] = world.rank
        # None on a rank outside a mesh over part of the job, as torch's get_coordinate()
        d["_coordinate_on_dim"] = tuple(rm_layout.coordinate_of(world.rank)) if world.member else None
        d["_hash"] = None
        return self

    # -- world-sized state, lazy and shared per world --------------------------------------------

    @property
    def _rank_map(self) -> torch.Tensor:  # type: ignore[override]
        return self._rm_world.rank_map()

    @property
    def _flatten_rank_map(self) -> tuple[int, ...]:
        return self._rm_world.rank_map_tuple()

    @property
    def mesh(self) -> torch.Tensor:
        """This rank's copy of the mesh (int32, ``shape``), as torch's ``.mesh``; O(mesh size).

        On a rank outside a mesh over part of the job, as torch: the mesh when it has one copy (a
        root), else torch's ``RuntimeError`` (which copy would it be?)."""
        if self._rm_world.member:
            return torch.from_numpy(self._rm_layout.mesh_of(self._rank))
        if self._rm_layout.num_copies == 1:
            return torch.from_numpy(self._rm_layout.groups()[0])
        raise RuntimeError(
            "In order to get the mesh Tensor of a DeviceMesh it needs to either have all its original dimensions "
            f"(e.g., no slicing) or it needs to contain the local rank (rank {self._rank} is not in this mesh over "
            "part of the job; its get_coordinate() is None)"
        )

    @property
    def layout(self) -> MeshLayout:
        """The rankmesh layout of this mesh (names, modes, this rank's groups, fingerprint)."""
        return self._rm_layout

    def get_group(self, mesh_dim: int | str | None = None) -> dist.ProcessGroup:
        """torch's ``get_group``. On a rank outside a mesh over part of the job (its
        ``get_coordinate()`` is None; it holds no group of the mesh), where torch's fails with a
        bare ``IndexError: list index out of range``, a :class:`~rankmesh.errors.RankOutOfRangeError`
        (an ``IndexError`` too) that names the rank and the mesh's ranks; ``get_local_rank`` and
        ``get_all_groups``, which call it, say the same. A bad ``mesh_dim`` is torch's error first.

        Example (rank 3 of 16, outside the teachers' mesh over ranks 8-15)::

            >>> import torch.distributed as dist
            >>> from torch.testing._internal.distributed.fake_pg import FakeStore
            >>> dist.init_process_group("fake", rank=3, world_size=16, store=FakeStore())
            >>> teachers = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), ranks=range(8, 16))
            >>> teachers.get_coordinate() is None
            True
            >>> teachers["tp"].get_group()  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            rankmesh.errors.RankOutOfRangeError: rank 3 is not in this mesh (ranks range(8, 16) of the job's 16) ...
            >>> dist.destroy_process_group()
        """
        # Only torch's registered fields here: torch.compile inlines get_group on a mesh.
        if self._coordinate_on_dim is None:  # not a rank of the mesh: torch's checks of mesh_dim first
            try:
                return DeviceMesh.get_group(self, mesh_dim)
            except IndexError:  # the dim's group name, from the empty list a non-member holds
                raise _not_a_member(self) from None
        return DeviceMesh.get_group(self, mesh_dim)

    # -- identity --------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        theirs = other.__dict__.get("_rm_world") if type(other) is FastDeviceMesh else None
        if theirs is not None:
            return self._rm_world.same(theirs) and compat.eq_fields(self) == compat.eq_fields(other)
        if isinstance(other, DeviceMesh):
            return DeviceMesh.__eq__(self, other)
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if not h:
            h = hash((_HashOf(self._rm_world.rank_map_hash()), *compat.eq_fields(self)))
            self.__dict__["_hash"] = h
        return h

    # -- pickling and copying ----------------------------------------------------------------------
    #
    # A checkpoint must load where rankmesh is absent, and ``torch.load(weights_only=True)`` (torch's
    # default) builds only the classes torch allowlists: ``DeviceMesh``, not a subclass. So a fast
    # mesh pickles *as* torch's ``DeviceMesh``: the class written is ``DeviceMesh`` and the state is
    # what torch's ``__getstate__`` gives for the same mesh. pickle writes an object's class from its
    # ``__class__`` (and refuses a ``__newobj__`` of any other), hence the ``__class__`` below, as
    # proxies (``unittest.mock``, ``wrapt``) do; ``type()`` still tells the two apart. Copies in the
    # process (``copy.copy``, ``copy.deepcopy``, e.g. of a model's DTensor parameters) stay fast meshes
    # of the same world and build nothing world-sized.

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105
        return DeviceMesh

    def __getstate__(self) -> dict:
        """torch's ``DeviceMesh.__getstate__`` of the same mesh: the same fields, with the world's
        rank map (``_rank_map``, and the W-long ``_flatten_rank_map`` tuple, made once per world and
        shared by every mesh of it, so a pickle of several meshes holds it once). O(world size)
        the first time, and only when a mesh is pickled (``torch.save`` of a DTensor, say): that is
        what the file holds, as torch's. ``_hash`` is left to be recomputed where it is loaded (the
        mesh's names hash differently in another process).

        Example (rank 2 of 4; what ``torch.load(..., weights_only=True)`` rebuilds, with or without
        rankmesh there)::

            >>> import pickle, torch.distributed as dist
            >>> from torch.testing._internal.distributed.fake_pg import FakeStore
            >>> dist.init_process_group("fake", rank=2, world_size=4, store=FakeStore())
            >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            >>> back = pickle.loads(pickle.dumps(mesh["tp"]))
            >>> type(back).__name__, back == mesh["tp"], back.mesh.tolist(), back.get_coordinate()
            ('DeviceMesh', True, [2, 3], (0,))
            >>> dist.destroy_process_group()
        """
        state = {k: v for k, v in self.__dict__.items() if k not in _NOT_TORCH_STATE}
        state["_rank_map"] = self._rank_map
        state["_flatten_rank_map"] = self._flatten_rank_map
        state["_hash"] = None
        return state

    def __reduce_ex__(self, protocol: int) -> tuple:
        return (copyreg.__newobj__, (DeviceMesh,), self.__getstate__())

    def __setstate__(self, state: dict) -> None:
        # Only a pickle made by rankmesh 0.1.0 (class FastDeviceMesh, rankmesh's own state) comes
        # here, loaded with weights_only=False: today's pickles name torch's DeviceMesh.
        state = dict(state)
        layout, rank = state.pop("_rm_world_state")
        root = state.get("_root_mesh")
        # Meshes unpickled together share their root's world (pickle memoizes the root).
        world = root.__dict__.get("_rm_world") if isinstance(root, FastDeviceMesh) else None
        if world is None or not world.matches(layout, rank):
            world = _World(layout, rank, None)
        self.__dict__.update(state)
        self.__dict__["_rm_world"] = world
        self.__dict__["_hash"] = None
        self.__dict__["_pg_registry"] = {}
        registry = self._get_root_mesh().__dict__.setdefault("_pg_registry", {})
        for name in self._dim_group_names:
            pg = _fast_groups.resolve_group(name)
            if pg is not None:
                registry[name] = pg

    def __copy__(self) -> FastDeviceMesh:
        new = object.__new__(FastDeviceMesh)
        new.__dict__.update(self.__dict__)
        new.__dict__["_pg_registry"] = dict(self._pg_registry)
        return new

    def __deepcopy__(self, memo: dict) -> FastDeviceMesh:
        """A fast mesh equal to this one; the world (this process's groups and rank map, made at
        most once) and the process groups are shared, not copied, as torch's copy resolves the same
        groups by name."""
        new = object.__new__(FastDeviceMesh)
        memo[id(self)] = new
        d = self.__dict__
        shared = ("_rm_world", "_rm_layout", "_pg_registry")
        new.__dict__.update(copy.deepcopy({k: v for k, v in d.items() if k not in shared}, memo))
        new.__dict__.update({k: d[k] for k in shared}, _pg_registry=dict(d["_pg_registry"]))
        return new

    # -- derivations -----------------------------------------------------------------------------

    def _builder(self) -> MeshBuilder:
        w = self._rm_world
        if w.builder is None:  # e.g. unpickled: groups are made for this process from now on
            w.builder = MeshBuilder(w.layout, device_type=self._device_type)
        return w.builder

    def _register(self, pgs: Sequence[dist.ProcessGroup]) -> list[str]:
        registry = self._get_root_mesh()._pg_registry
        names = []
        for pg in pgs:
            if pg is None:  # a rank outside a mesh over part of the job: no group, as torch's []
                continue
            registry[pg.group_name] = pg
            names.append(pg.group_name)
        return names

    def _groups_for(self, rm_layout: MeshLayout, dims: Sequence[int], overrides: Sequence[BackendConfig]) -> list[str]:
        b = self._builder()
        names = rm_layout.names
        pgs = [
            b.process_group(rm_layout, d, backend=o[0], pg_options=o[1], mesh_dim_name=names[d])
            for d, o in zip(dims, overrides)
        ]
        return self._register(pgs)

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:  # type: ignore[override]
        own = self._mesh_dim_names
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else mesh_dim_names
        if not isinstance(names, tuple):
            names_tuple(names, "mesh_dim_names")  # torch takes any iterable of str names
        elif any(not isinstance(n, str) for n in names):
            names_tuple(names, "mesh_dim_names")
        if own and isinstance(names, tuple):
            if names == own:
                return self
            # The common case, names of this mesh in mesh order: O(ndim), no pycute. Anything
            # else (flattened names sliced from the root, size-1 dims out of order, errors) takes
            # torch's own validation below, which then calls _create_sub_mesh.
            idx = _mesh_order(own, names)
            if idx is not None:
                return self._create_sub_mesh(_MeshLayout([self._layout[i] for i in idx]), names)
        try:
            return super().__getitem__(mesh_dim_names)
        except KeyError as e:
            raise _slice_error(self, mesh_dim_names, e) from e

    def _create_sub_mesh(self, layout: _MeshLayout, submesh_dim_names: tuple[str, ...]) -> FastDeviceMesh:
        # torch has validated the names and computed ``layout`` (O(ndim)); we pick the groups and
        # this rank's part from the Rust layout instead of building a DeviceMesh over the world.
        own = tuple(self._mesh_dim_names or ())
        group_names: list[str] = []
        for name in submesh_dim_names if self._rm_world.member else ():
            if name in own:
                group_names.append(self._dim_group_names[own.index(name)])
            else:  # a flattened dim sliced from the root (deprecated in torch, still supported)
                group_names.append(self._flatten_mapping[name]._dim_group_names[0])
        if _mesh_order(own, submesh_dim_names) is not None:
            rm_layout = self._rm_layout[tuple(submesh_dim_names)]
        else:  # size-1 dims out of mesh order (torch accepts them) or flattened names
            modes = [_modes(layout, i) for i in range(len(layout))]
            rm_layout = self._rm_layout.with_modes(modes, list(submesh_dim_names))
            _check_agree(rm_layout, layout)
        root = self._get_root_mesh()
        return FastDeviceMesh._make(
            self._rm_world, rm_layout, layout, self._device_type, tuple(submesh_dim_names), group_names, root
        )

    def _create_flatten_mesh(self, mesh_dim_name: str, backend_override: BackendConfig = NO_OVERRIDE) -> None:
        # torch's _flatten (inlined by torch.compile, so not overridden) passes its arguments here
        # unchecked: a name that is not a str, an override that is no backend. Its checks run in
        # torch's order: the name (taken by the root, or flattened before with another layout),
        # and only for a new flattened mesh the backend, which torch checks creating the group.
        check_str(mesh_dim_name, "mesh_dim_name")
        root = self._get_root_mesh()
        taken = tuple(root._mesh_dim_names or ())
        if mesh_dim_name in taken:
            raise DuplicateNameError(
                torch_first(
                    torch_rejects("_create_flatten_mesh", self, mesh_dim_name, NO_OVERRIDE),
                    f"{mesh_dim_name} already exists for submesh of the {root}",
                    f"the root mesh's dims are {taken}; pass another mesh_dim_name for the flattened dim",
                ),
                field="mesh_dim_name",
                value=mesh_dim_name,
            )
        # torch's root rule (above) decides which names are taken; the Rust layout's own root is
        # the ("world",) layout it was derived from, whose names torch does not reserve.
        src = self._rm_layout
        rm_layout = src.with_modes([[m for i in range(src.ndim) for m in src.modes(i)]], [mesh_dim_name])
        tl = _torch_layout(rm_layout)
        existing = root._flatten_mapping.get(mesh_dim_name)
        if existing is not None:
            if existing._layout == tl:
                return  # torch's answer too, whatever the backend_override
            raise DuplicateNameError(
                torch_first(
                    torch_rejects("_create_flatten_mesh", self, mesh_dim_name, NO_OVERRIDE),
                    f"Flatten mesh with mesh_dim_name {mesh_dim_name} has been created before",
                    f"{mesh_dim_name!r} already names a flattening of other dims; pass another mesh_dim_name, or "
                    "flatten the same dims to get that mesh again",
                ),
                field="mesh_dim_name",
                value=mesh_dim_name,
            )
        backend_override = backend_config(backend_override, "backend_override")
        group_names = self._groups_for(rm_layout, [0], [backend_override])
        flattened = FastDeviceMesh._make(
            self._rm_world, rm_layout, tl, root._device_type, (mesh_dim_name,), group_names, root
        )
        root._flatten_mapping[mesh_dim_name] = flattened

    def _unflatten(  # type: ignore[override]
        self,
        dim: int | str,
        mesh_sizes: tuple[int, ...],
        mesh_dim_names: tuple[str, ...],
        backend_override: dict[str, Any] | None = None,
    ) -> DeviceMesh:
        # torch's checks, in torch's order and with torch's text first (torch_rejects runs
        # torch's own _unflatten with the arguments of one check, the others neutral): the dim,
        # the number of names, the override keys, the sizes' product, the override values.
        # rankmesh's own checks (types, a negative dim, repeated names) come where torch would
        # fail on them or take them.
        if not self._mesh_dim_names:
            raise MeshArgumentError(
                "Cannot unflatten a DeviceMesh without mesh_dim_names; pass mesh_dim_names to init_device_mesh",
                field="mesh_dim_names",
                value=None,
            )
        own = tuple(self._mesh_dim_names)
        if isinstance(dim, str):
            if dim not in own:
                check_str(dim, "dim")  # a name that is not UTF-8 text is the wrong type, not unknown
                raise UnknownNameError(
                    torch_first(
                        torch_rejects("_unflatten", self, dim, (), ()),
                        f"dim {dim!r} specified in `_unflatten` is not in {own}",
                        "pass one of those names or an index",
                    ),
                    field="dim",
                    value=dim,
                )
            dim = own.index(dim)
        else:
            dim_arg = dim
            dim = as_int(dim, "dim")
            if not 0 <= dim < self.ndim:
                raise DimOutOfRangeError(
                    torch_first(
                        torch_rejects("_unflatten", self, dim_arg, (), ()),
                        f"dim {dim!r} specified in `_unflatten` is out of range {self.ndim}",
                        f"valid dims are 0..{self.ndim - 1} or the names {own}",
                    ),
                    field="dim",
                    value=dim,
                )
        sizes = as_sequence(mesh_sizes, "mesh_sizes", "sizes", noun="a tuple")
        names = as_sequence(mesh_dim_names, "mesh_dim_names", "names", noun="a tuple")
        if len(sizes) != len(names):
            raise SizeMismatchError(
                torch_first(
                    torch_rejects("_unflatten", self, dim, sizes, names),
                    "mesh_dim_names must have same length as mesh_sizes in _unflatten",
                    f"got {len(names)} names {names} for {len(sizes)} sizes {sizes}",
                ),
                field="mesh_dim_names",
                value=names,
            )
        sizes = sizes_tuple(sizes, "mesh_sizes")
        names = names_tuple(names, "mesh_dim_names")
        given = normalize_overrides(backend_override, len(sizes), names)
        self._check_unflatten_sizes(dim, sizes, names)
        return self._create_unflatten_mesh(dim, sizes, names, backend_configs(given))

    def _check_unflatten_sizes(self, dim: int, mesh_sizes: tuple[int, ...], mesh_dim_names: tuple[str, ...]) -> None:
        size = self._layout[dim].numel()
        prod = int(np.prod(mesh_sizes, dtype=object))
        if prod != size:
            neutral = (NO_OVERRIDE,) * len(mesh_sizes)
            raise SizeMismatchError(
                torch_first(
                    torch_rejects("_create_unflatten_mesh", self, dim, mesh_sizes, mesh_dim_names, neutral),
                    f"The product of mesh_sizes={tuple(mesh_sizes)} is {prod}, but the original dimension at "
                    f"dim={dim} has size {size}. These must be equal for unflatten to work correctly",
                    f"pick mesh_sizes that multiply to {size}",
                ),
                field="mesh_sizes",
                value=tuple(mesh_sizes),
            )

    def _create_unflatten_mesh(  # type: ignore[override]
        self,
        dim: int,
        mesh_sizes: tuple[int, ...],
        mesh_dim_names: tuple[str, ...],
        backend_override: tuple[BackendConfig, ...] = (NO_OVERRIDE,),
    ) -> FastDeviceMesh:
        self._check_unflatten_sizes(dim, mesh_sizes, mesh_dim_names)
        # rankmesh's algebra first: it names the field at fault (e.g. a name that exists already).
        rm_layout = self._rm_layout.unflatten(dim, mesh_sizes, mesh_dim_names)
        new_dims = list(range(dim, dim + len(mesh_sizes)))
        tl = self._layout.splice(dim, dim + 1, _torch_layout(rm_layout, new_dims))
        new_names = self._groups_for(rm_layout, new_dims, backend_override)
        group_names = list(self._dim_group_names)
        group_names[dim : dim + 1] = new_names
        return FastDeviceMesh._make(
            self._rm_world, rm_layout, tl, self._device_type, tuple(rm_layout.names), group_names, self._get_root_mesh()
        )

    # -- rankmesh extras ---------------------------------------------------------------------------

    def build_report(self) -> BuildReport:
        """The process groups this rank created for this mesh's world, by backend."""
        return self._builder().report()


def _concatenate(meshes: Sequence[DeviceMesh]) -> FastDeviceMesh | None:
    """rankmesh's ``DeviceMesh._concatenate``: the mesh over the dims of ``meshes`` side by side
    (FSDP2 joins its dp mesh and the parameters' TP/EP mesh this way), as a :class:`FastDeviceMesh`
    in O(ndim); or None, and torch's own function runs, unless every input is a fast mesh of one
    world with names and the dims do not overlap (torch then raises its own errors).

    Equal to torch's result: the layouts side by side, names and process-group names
    concatenated, the first mesh's device type and root. Torch's own builds a plain
    ``DeviceMesh`` over the world's rank map (``tolist()`` of W ranks) every call.

    Example (rank 5 of 8): FSDP2's ``_concatenate([dp_mesh, tp_mesh])``::

        >>> import torch.distributed as dist
        >>> from torch.testing._internal.distributed.fake_pg import FakeStore
        >>> dist.init_process_group("fake", rank=5, world_size=8, store=FakeStore())
        >>> m = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
        >>> joined = DeviceMesh._concatenate([m["dp"], m["tp"]])
        >>> type(joined).__name__, joined.mesh_dim_names, joined.mesh.tolist()
        ('FastDeviceMesh', ('dp', 'tp'), [[4, 5], [6, 7]])
        >>> joined == DeviceMesh._concatenate.__wrapped__([m["dp"], m["tp"]])   # torch's own
        True
        >>> dist.destroy_process_group()
    """
    if not meshes or any(type(m) is not FastDeviceMesh for m in meshes):
        return None
    first = meshes[0]
    world = first._rm_world
    if any(not world.same(m._rm_world) for m in meshes[1:]):
        return None  # torch compares the rank maps (equal ones are fine) or raises
    if any(m._mesh_dim_names is None for m in meshes):
        return None  # torch's not_none raises
    names = tuple(n for m in meshes for n in m._mesh_dim_names)
    if len(set(names)) != len(names):
        return None  # torch builds such a mesh; rankmesh's layouts need unique names
    layout = _MeshLayout([axis for m in meshes for axis in m._layout])
    if not layout.collapse().check_orthogonal():
        return None  # torch raises "Cannot concatenate overlapping meshes"
    rm_layout = world.layout.with_modes([_modes(layout, i) for i in range(len(layout))], list(names))
    group_names = [g for m in meshes for g in m._dim_group_names]
    root = first._get_root_mesh()
    return FastDeviceMesh._make(world, rm_layout, layout, first._device_type, names, group_names, root)


def _patched_concatenate(torch_concatenate: Any) -> Any:
    def _concatenate_or_torchs(device_mesh_list):  # noqa: ANN001, ANN202
        mesh = _concatenate(device_mesh_list)
        return torch_concatenate(device_mesh_list) if mesh is None else mesh

    _concatenate_or_torchs.__doc__ = torch_concatenate.__doc__
    _concatenate_or_torchs.__qualname__ = "DeviceMesh._concatenate"
    return _concatenate_or_torchs


def _fast_meshes_on(_original: Any) -> str | None:
    return None if _mesh_check.fast_meshes_available() else "rankmesh's fast meshes are off on this torch"


#: The one patch of torch's own class (listed in :mod:`rankmesh.patches`): ``DeviceMesh._concatenate``
#: on fast meshes of one world is :func:`_concatenate`, anything else torch's own. Each builder of a
#: fast mesh (:meth:`FastDeviceMesh.from_layout`, :func:`init_device_mesh`, :func:`from_group`)
#: installs it before its first mesh (idempotent); unpickling installs nothing.
CONCATENATE = Patch(
    "concatenate",
    "torch.distributed.device_mesh.DeviceMesh",
    "_concatenate",
    _patched_concatenate,
    why="FSDP2 joins its dp mesh and each parameter's mesh with it; torch's builds a W-long rank map per call, "
    "rankmesh's is O(ndim) when every input is a rankmesh mesh of one world (torch's own otherwise)",
    detail="(a staticmethod(device_mesh_list), by body)",
    gate=_mesh_check.CONCATENATE_CODE,
    check=_fast_meshes_on,
    wrap=staticmethod,
)


def _not_a_member(mesh: FastDeviceMesh) -> RankOutOfRangeError:
    """The error of a rank outside a mesh over part of the job that asks it for a group: the rank,
    the mesh's ranks (a range, or the Slice they are) and what to do instead."""
    world = mesh._rm_world.layout
    offset, modes = world.placement or (0, [(world.global_size, 1)])
    placed = Slice(offset, modes)
    r = placed.as_range()
    ranks = placed if r is None else range(r[0], r[-1] + 1, r.step)  # range(1, 32, 2), not range(1, 33, 2)
    rank = mesh._rank
    return RankOutOfRangeError(
        f"rank {rank} is not in this mesh (ranks {ranks!r} of the job's {world.global_size}) and holds none of "
        "its process groups; call get_group (and get_local_rank) on the mesh's ranks only: check "
        "mesh.get_coordinate() is None first (it is, outside the mesh)",
        field="rank",
        value=rank,
        kind="rank_not_in_mesh",
        ctx={"rank": rank, "placement": (offset, modes)},
        fix="call it on a rank of the mesh; where every rank runs the same code, skip the mesh where "
        "mesh.get_coordinate() is None",
    )


def _slice_error(mesh: FastDeviceMesh, key: Any, e: KeyError) -> RankmeshError:
    names = (key,) if isinstance(key, str) else tuple(key)
    for i, n in enumerate(names):  # a name that is not UTF-8 text is the wrong type, not unknown
        check_str(n, "mesh_dim_names" if isinstance(key, str) else f"mesh_dim_names[{i}]")
    own = tuple(mesh._mesh_dim_names or ())
    root = mesh._get_root_mesh()
    valid = list(own) + (list(root._flatten_mapping) if mesh is root else [])
    unknown = [n for n in names if n not in valid]
    if unknown:
        return UnknownNameError(
            f"Invalid mesh_dim_names {names} specified. Valid mesh_dim_names are {valid}. Not found: {unknown}",
            field="mesh_dim_names",
            value=names,
        )
    fix = _working_order(mesh, names)
    hint = (
        f"slice them in this order: {fix} (the mesh order is {own})"
        if fix is not None
        else f"no order of these names works: their dims interleave or overlap in the mesh {own}; slice them separately"
    )
    return SliceOrderError(
        f"Invalid mesh_dim_names {names} specified. Mesh dim indices should be in ascending order: {hint}",
        field="mesh_dim_names",
        value=names,
    )


def _strides(x: Any) -> list[int]:
    return [v for s in x for v in _strides(s)] if isinstance(x, tuple) else [x]


def _working_order(mesh: FastDeviceMesh, names: tuple[str, ...]) -> tuple[str, ...] | None:
    """An order of ``names`` that torch's slice check accepts, or None when there is none.

    torch concatenates the names' layouts, collapses them and requires strictly descending
    strides with no overlap, so the only candidate is the names sorted by their largest stride;
    it is checked with torch's own ``check_sorted``/``check_orthogonal``."""
    own = tuple(mesh._mesh_dim_names or ())
    root = mesh._get_root_mesh()
    flattened_layouts = {k: m._layout[0] for k, m in root._flatten_mapping.items()} if mesh is root else {}
    layout_of = {n: mesh._layout[own.index(n)] if n in own else flattened_layouts[n] for n in names}
    if len(set(names)) != len(names):
        return None
    order = tuple(sorted(names, key=lambda n: -max(_strides(layout_of[n].stride), default=0)))
    collapsed = _MeshLayout([layout_of[n] for n in order]).collapse()
    return order if collapsed.check_sorted() and collapsed.check_orthogonal() else None


def init_device_mesh(
    device_type: str,
    mesh_shape: Sequence[int],
    *,
    mesh_dim_names: Sequence[str] | None = None,
    backend_override: Mapping[int | str, Any] | None = None,
    rank_map: Any = None,
    ranks: Any = None,
    size_one_fake: bool = True,
) -> DeviceMesh:
    """torch's ``init_device_mesh``, returning a :class:`FastDeviceMesh` built in O(group size).

    A mesh with fewer ranks than the world is over part of the job, as in torch: ranks
    ``0 .. numel - 1`` by default, or ``ranks``. Every rank of the job makes the call; the others
    get a mesh whose ``get_coordinate()`` is None and which has no process groups (slicing,
    ``_flatten`` and ``_unflatten`` still work there, where torch raises).

    Args:
        device_type: ``"cuda"``, ``"cpu"``, ... (no index, as in torch).
        mesh_shape: sizes of the mesh dims; they must multiply to the world size.
        mesh_dim_names: unique names, one per dim.
        backend_override: per dim (index or name) a backend name, ``Backend.Options``, or both, as
            in torch; ``"fake"`` makes a dim that never communicates.
        rank_map: optional permutation of ``range(world_size)`` placing rank ``rank_map[i]`` at
            world index ``i`` (topology-aware placement, as ``MeshLayout.world``); the result equals
            ``DeviceMesh(device_type, rank_map.reshape(mesh_shape), ...)``.
        ranks: for a mesh over part of the job, its ranks in mesh order: a ``range`` (contiguous
            or strided; O(1)), or any sequence of ranks (O(numel) to read). Ranks that form a
            layout (an offset plus ``(size, stride)`` modes, e.g. ``[8, 9, 12, 13]``) give a fast
            mesh that stores O(ndim); any other list gives torch's own ``DeviceMesh(mesh=...)``
            with one warning. The result equals ``DeviceMesh(device_type,
            torch.tensor(ranks).reshape(mesh_shape), ...)``.
        size_one_fake: serve dims of size 1 (of this mesh and every mesh derived from it) with
            ``fake``-backend groups, which never communicate: one process group fewer per such
            dim. ``False`` is torch's rule, a one-rank group on the dim's backend (what
            :func:`rankmesh.torchtitan.accelerate` uses, so that torchtitan sees the same backends).

    The default process group must be initialised (or is initialised from the environment, as
    torch does). On a torch rankmesh does not know, warns once and returns torch's own mesh.

    Example (rank 6 of an 8-rank job)::

        >>> import torch.distributed as dist
        >>> from torch.testing._internal.distributed.fake_pg import FakeStore
        >>> dist.init_process_group("fake", rank=6, world_size=8, store=FakeStore())
        >>> mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> mesh["tp"].mesh.tolist(), mesh["dp"].mesh.tolist(), mesh.get_coordinate()
        ([4, 5, 6, 7], [2, 6], (1, 2))

    Students on ranks 0-3 as (dp, tp), teachers on ranks 4-7: on rank 6 only the teachers' mesh
    has a coordinate and groups; the students' mesh answers slices all the same::

        >>> students = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        >>> teachers = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), ranks=range(4, 8))
        >>> teachers.get_coordinate(), teachers["tp"].mesh.tolist(), students.get_coordinate()
        ((1, 0), [6, 7], None)
        >>> students.mesh.tolist(), students["dp"].get_coordinate()
        ([[0, 1], [2, 3]], None)
        >>> dist.destroy_process_group()
    """
    shape, names, overrides = init_arguments(device_type, mesh_shape, mesh_dim_names, backend_override)
    size_one_fake = as_bool(size_one_fake, "size_one_fake")
    if not dist.is_initialized():
        dist.init_process_group()
    world_layout = _init_world(device_type, shape, names, overrides, rank_map, ranks)
    if isinstance(world_layout, DeviceMesh):  # ranks that are no layout: torch's own mesh
        return world_layout
    if not _mesh_check.fast_meshes_available() or _symbolic_rank():
        return _torch_init(device_type, shape, names, backend_override, overrides, world_layout)
    return _build_root(device_type, shape, names, overrides, world_layout, size_one_fake)


def _init_world(
    device_type: str, shape: tuple[int, ...], names: tuple[str, ...] | None, overrides: Any, rank_map: Any, ranks: Any
) -> MeshLayout | DeviceMesh:
    """The world an :func:`init_device_mesh` mesh is over: the job's ranks (in ``rank_map``'s order,
    or a re-form's), or part of them (``ranks``, placed); torch's own mesh for ranks that are no
    layout."""
    world_size = dist.get_world_size()
    numel = int(np.prod(shape, dtype=object))
    if numel > world_size:
        raise SizeMismatchError(
            f"mesh_shape {shape} has {numel} ranks but the default process group has {world_size}; "
            f"make the sizes multiply to at most {world_size}",
            field="mesh_shape",
            value=shape,
        )
    if isinstance(rank_map, torch.Tensor):
        rank_map = rank_map.detach().cpu().numpy()
    if ranks is not None or numel < world_size:
        if rank_map is not None:
            raise MeshArgumentError(
                "rank_map places the ranks of a mesh over the whole world, ranks those of a mesh over part of it; "
                "give one of them (for part of the world with a permuted order, list the ranks in mesh order)",
                field="rank_map",
                value="<rank map>",
            )
        placement = _placement_of(range(numel) if ranks is None else ranks, numel, world_size)
        if placement is None:  # a list of ranks that is no layout: torch's own mesh over them
            warn_once(
                ("mesh", "ranks"),
                "rankmesh.init_device_mesh: the ranks given are not an offset plus (size, stride) modes, so rankmesh "
                "builds torch's own DeviceMesh over them (O(world size) per rank)",
            )
            return DeviceMesh(
                device_type,
                torch.tensor(list(ranks), dtype=torch.int).reshape(shape),
                mesh_dim_names=names,
                backend_override=overrides,
            )
        return MeshLayout.placed(world_size, placement.offset, placement.modes)
    if isinstance(rank_map, MeshLayout):  # a world layout, e.g. rankmesh.recovery's re-formed one
        if rank_map.ndim != 1 or rank_map.world_size != world_size or rank_map.global_size != world_size:
            raise MeshArgumentError(
                f"rank_map {rank_map!r} must be a 1-D world layout over the {world_size} ranks of the default "
                "group (MeshLayout.world or MeshLayout.renumbered)",
                field="rank_map",
                value=rank_map,
            )
        return rank_map.world_layout()
    if rank_map is None and (reformed := active_world(world_size)) is not None:
        return reformed  # rankmesh.recovery: a re-form is active for this default group
    return MeshLayout.world(world_size, rank_map)


def _build_root(
    device_type: str,
    shape: tuple[int, ...],
    names: tuple[str, ...] | None,
    overrides: Any,
    world_layout: MeshLayout,
    size_one_fake: bool,
) -> FastDeviceMesh:
    """The root :class:`FastDeviceMesh` over ``world_layout`` with this rank's group per dim."""
    rm_names = names if names is not None else tuple(f"dim_{i}" for i in range(len(shape)))
    rm_layout = world_layout.unflatten(0, shape, rm_names) if len(shape) > 1 or rm_names != ("world",) else world_layout
    tl = _torch_layout(rm_layout)
    whole = world_layout if world_layout.placement is None else MeshLayout.world(world_layout.global_size)
    builder = MeshBuilder(whole, device_type=device_type, size_one_fake=size_one_fake)
    CONCATENATE.install()  # a fast mesh is about to exist: FSDP2 may join it (see CONCATENATE)
    world = _world_of(builder, world_layout)
    root = FastDeviceMesh._make(world, rm_layout, tl, device_type, names, [], None)
    root._setup_world_group_and_device()  # torch's device selection (LOCAL_RANK) and checks
    group_names = root._groups_for(rm_layout, range(len(shape)), overrides)
    root.__dict__["_dim_group_names"] = group_names
    if names is None:
        # torch keeps unnamed meshes unnamed; the Rust layout needs names, the mesh does not.
        root.__dict__["_mesh_dim_names"] = None
    return root


def from_group(
    group: dist.ProcessGroup | Sequence[dist.ProcessGroup],
    device_type: str,
    mesh: Any = None,
    *,
    mesh_dim_names: Sequence[str] | None = None,
) -> DeviceMesh:
    """torch's ``DeviceMesh.from_group`` without the world-sized ``mesh`` tensor: a
    :class:`FastDeviceMesh` over process groups a framework already has, in O(group size) per dim.

    Each group's ranks (in the group's order) are read once and must be an offset plus
    ``(size, stride)`` modes; the mesh's ranks are the dims' modes side by side around this rank,
    so its ``mesh``, names, groups, coordinate and local ranks are those of
    ``DeviceMesh.from_group(groups, device_type, mesh=<the ranks arranged by the groups>,
    mesh_dim_names=...)``. The groups themselves are the mesh's process groups; ``_flatten`` and
    ``_unflatten`` of the result create new ones as rankmesh's meshes do.

    With ``mesh`` given, torch's own ``DeviceMesh.from_group`` runs (it reads every rank anyway). A
    group whose ranks are no layout: torch's own, with one warning, for one group; a typed error
    asking for ``mesh`` for several (torch's n-D form needs it).

    Every rank calls this with its own groups (SPMD, as torch); the ranks cannot check each other's
    groups without communicating: :func:`rankmesh.check_consistency` does. On a rank outside a group
    (``new_group`` gave it ``GroupMember.NON_GROUP_MEMBER``) it raises
    :class:`~rankmesh.errors.DistributedStateError`.

    Example (rank 6 of 8: the tp groups are [4, 5], [6, 7], ..., the dp groups [0, 2, 4, 6] and
    [1, 3, 5, 7], made by hand as Megatron does)::

        >>> import torch.distributed as dist
        >>> from torch.testing._internal.distributed.fake_pg import FakeStore
        >>> dist.init_process_group("fake", rank=6, world_size=8, store=FakeStore())
        >>> tp = dist.new_group([6, 7], use_local_synchronization=True)
        >>> dp = dist.new_group([0, 2, 4, 6], use_local_synchronization=True)
        >>> m = from_group([dp, tp], "cpu", mesh_dim_names=("dp", "tp"))
        >>> m.mesh.tolist(), m.get_coordinate(), m["tp"].get_group() is tp
        ([[0, 1], [2, 3], [4, 5], [6, 7]], (3, 0), True)
        >>> dist.destroy_process_group()
    """
    if mesh is not None:
        return DeviceMesh.from_group(group, device_type, mesh, mesh_dim_names=mesh_dim_names)
    single, groups, names = from_group_arguments(group, device_type, mesh_dim_names)
    require_default_group("DeviceMesh from_group")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    origin, modes, shape = rank, [], []
    for i, pg in enumerate(groups):
        place = _group_place(i, pg, rank, world_size)
        if place is None:
            if single:  # torch's own, with one warning
                return _torch_from_group(group, device_type, mesh_dim_names)
            raise MeshArgumentError(
                f"group[{i}]'s ranks are not an offset plus (size, stride) modes, so rankmesh cannot infer the mesh; "
                "pass mesh= (torch's DeviceMesh.from_group then builds it)",
                field=f"group[{i}]",
                value=pg.group_name,
            )
        origin -= rank - place.offset  # the mesh's first rank: this rank less its offset in every dim
        modes += place.modes
        shape.append(len(place))
    try:
        world_layout = MeshLayout.placed(world_size, origin, modes)
    except RankmeshError as e:
        raise MeshArgumentError(
            f"the groups do not fit together as the dims of one mesh around rank {rank} ({e}); give groups that are "
            "the dims of one mesh, each once",
            field="group",
            value=[getattr(g, "group_name", g) for g in groups],
        ) from e
    rm_names = names if names is not None else ("dim_0",)
    rm_layout = world_layout.unflatten(0, tuple(shape), rm_names)
    if not _mesh_check.fast_meshes_available():
        full = torch.from_numpy(world_layout.rank_map()).reshape(shape)
        return DeviceMesh.from_group(group, device_type, full, mesh_dim_names=mesh_dim_names)
    builder = MeshBuilder(MeshLayout.world(world_size), device_type=device_type)
    CONCATENATE.install()  # a fast mesh is about to exist: FSDP2 may join it (see CONCATENATE)
    world = _world_of(builder, world_layout)
    root = FastDeviceMesh._make(world, rm_layout, _torch_layout(rm_layout), device_type, names, [], None)
    root.__dict__["_dim_group_names"] = root._register(groups)
    return root


def _torch_from_group(group: Any, device_type: str, mesh_dim_names: Any) -> DeviceMesh:
    warn_once(
        ("mesh", "from_group"),
        "rankmesh.from_group: the group's ranks are not an offset plus (size, stride) modes, so rankmesh "
        "builds torch's own DeviceMesh.from_group",
    )
    return DeviceMesh.from_group(group, device_type, mesh_dim_names=mesh_dim_names)


def _group_place(i: int, pg: Any, rank: int, world_size: int) -> Slice | None:
    """The ranks of ``group[i]`` (this rank's group in dim ``i``), in the group's order, as a
    :class:`~rankmesh.Slice`; None when they are no slice. O(1) for the default group and for a
    group rankmesh made from a layout, whose ranks are not read; O(group) otherwise."""
    not_here = (
        f"group[{i}] does not hold this rank ({rank}); from_group takes the calling rank's own group in every dim"
    )
    if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER:
        raise DistributedStateError(
            f"group[{i}] is not a process group of this rank ({rank}); from_group takes the calling rank's own "
            "group in every dim",
            field=f"group[{i}]",
            value=pg,
        )
    if not isinstance(pg, dist.ProcessGroup):
        raise ArgumentTypeError(
            f"group[{i}] must be a torch.distributed ProcessGroup, got {type_name(pg)} {pg!r}",
            field=f"group[{i}]",
            value=pg,
        )
    if pg is dist.group.WORLD:  # every rank in order
        return Slice.of_range(range(world_size))
    known = group_slice(pg)
    if known is not None:
        if rank not in known:
            raise DistributedStateError(not_here, field=f"group[{i}]", value=pg.group_name)
        return known
    ranks = np.asarray(dist.get_process_group_ranks(pg), dtype=np.int64)
    if not (ranks == rank).any():
        raise DistributedStateError(not_here, field=f"group[{i}]", value=pg.group_name)
    return _placement_of(ranks, len(ranks), world_size)


def _symbolic_rank(who: str = "rankmesh.init_device_mesh", instead: str = "init_device_mesh builds the mesh") -> bool:
    """Whether this process's rank is no plain int: under torch's ``LocalTensorMode``
    (``torch.distributed._local_tensor``, torch 2.15), one process plays every rank and
    ``dist.get_rank()`` is a per-rank ``SymInt``. A fast mesh holds one rank's groups and
    coordinate, so :func:`init_device_mesh` then hands the call to torch's own construction, which
    builds under the mode (torch 2.13's mode leaves ``get_rank`` an int: a fast mesh, which the mode
    answers for every rank as it does torch's); the ``init_process_groups`` patch hands its call to
    torch's method alike. ``who`` and ``instead`` name the caller and torch's road in the one debug
    line."""
    rank = dist.get_rank()
    if isinstance(rank, int):
        return False
    _log.debug(
        "%s: the rank is a %s, not an int (torch's LocalTensorMode?), so torch's own %s",
        who,
        type_name(rank),
        instead,
    )
    return True


def _torch_init(
    device_type: str,
    shape: tuple[int, ...],
    names: tuple[str, ...] | None,
    backend_override: Mapping[int | str, Any] | None,
    overrides: tuple[BackendConfig, ...],
    world_layout: MeshLayout,
) -> DeviceMesh:
    """torch's own construction of the same mesh (the fallback on an unknown torch, or a symbolic rank)."""
    import inspect

    from torch.distributed.device_mesh import init_device_mesh

    # torch's own function, also where rankmesh.accelerate() put rankmesh's in its place (a
    # replacement keeps torch's as __wrapped__): calling the replacement would come back here.
    torch_init = inspect.unwrap(init_device_mesh)

    rank_map = world_layout.rank_map()
    if world_layout.placement is not None:
        return DeviceMesh(
            device_type, torch.from_numpy(rank_map).reshape(shape), mesh_dim_names=names, backend_override=overrides
        )
    if rank_map is None:
        return torch_init(
            device_type,
            shape,
            mesh_dim_names=names,
            backend_override=dict(backend_override) if backend_override else None,
        )
    return DeviceMesh(
        device_type,
        torch.from_numpy(rank_map).reshape(shape),
        mesh_dim_names=names,
        backend_override=overrides,
    )


def _world_of(builder: MeshBuilder, world: MeshLayout | None = None) -> _World:
    """The :class:`_World` every mesh over ``builder``'s groups shares (kept by the builder for
    this layer: :meth:`MeshBuilder.layer_state`): of the builder's whole world, or of ``world``, a
    world over part of the job (``MeshLayout.placed``), one per placement."""
    if world is None or world.placement is None:
        return builder.layer_state("rankmesh.mesh", lambda: _World(builder.world, builder.rank, builder))
    offset, modes = world.placement
    key = f"rankmesh.mesh placed {offset} {modes}"
    return builder.layer_state(key, lambda: _World(world, builder.rank, builder))


def _placement_of(ranks: Any, numel: int, world_size: int) -> Slice | None:
    """``(offset, modes)`` of the ranks of a mesh over part of the job, in mesh order, such that
    ``ranks[i] == offset + sum(digit_k(i) * stride_k)``; None when the ranks are no such layout (a
    general subset). A ``range`` is O(1); a sequence is read once (O(numel), numpy). Ranks outside
    the job, repeated ranks or the wrong number of ranks are typed errors naming ``ranks``."""
    if isinstance(ranks, range):
        if len(ranks) != numel:
            raise SizeMismatchError(
                f"ranks {ranks} holds {len(ranks)} ranks but mesh_shape has {numel}; give one rank per mesh position",
                field="ranks",
                value=ranks,
            )
        as_rank(ranks[0], world_size, "ranks[0]")
        as_rank(ranks[-1], world_size, f"ranks[{numel - 1}]")
        if ranks.step > 0 or numel == 1:
            return Slice.of_range(ranks)
        ranks = list(ranks)  # descending: a valid list, read as one
    if isinstance(ranks, torch.Tensor):
        ranks = ranks.detach().cpu().numpy()
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__len__"):
        as_sequence(ranks, "ranks", "ranks")  # the typed error for a str, a scalar, an iterator
        ranks = list(ranks)
    arr = np.asarray(ranks)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        for i, r in enumerate(arr.reshape(-1).tolist()):
            as_int(r, f"ranks[{i}]")  # the first entry that is not an int
        arr = arr.astype(np.int64)
    arr = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
    if arr.size != numel:
        raise SizeMismatchError(
            f"ranks holds {arr.size} ranks but mesh_shape has {numel}; give one rank per mesh position",
            field="ranks",
            value=arr.size,
        )
    bad = np.nonzero((arr < 0) | (arr >= world_size))[0]
    if bad.size:
        as_rank(int(arr[bad[0]]), world_size, f"ranks[{int(bad[0])}]")
    uniq, counts = np.unique(arr, return_counts=True)
    if uniq.size != arr.size:
        twice = int(uniq[np.argmax(counts > 1)])
        raise InvalidRankMapError(
            f"ranks lists rank {twice} more than once; a mesh holds each rank once",
            field="ranks",
            value=twice,
        )
    return Slice.recognise(arr)  # the core reads the modes off the ranks, O(numel)


def _fake_dim_indices(layout: MeshLayout, fake_dims: Sequence[str | int]) -> set[int]:
    """``fake_dims`` (names or indices of ``layout``'s dims) as indices; typed errors otherwise."""
    names = tuple(layout.names)
    fake_dims = as_sequence(fake_dims, "fake_dims", "dim names or indices")
    fake_idx = set()
    for i, d in enumerate(fake_dims):
        if isinstance(d, str):
            check_str(d, f"fake_dims[{i}]")
            if d not in names:
                raise UnknownNameError(
                    f"fake_dims[{i}] = {d!r} is not a dim of the layout; name one of {names} (or its index)",
                    field="fake_dims",
                    value=d,
                )
            fake_idx.add(names.index(d))
        else:
            d = as_int(d, f"fake_dims[{i}]")
            layout.size(d)  # raises DimOutOfRangeError
            fake_idx.add(d % len(names))
    return fake_idx
