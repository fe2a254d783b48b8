"""A drop-in for torchtitan's ``ParallelDims`` (torchtitan commit 183a0d2, "Use new DeviceMesh
unflatten to rewrite parallel_dims") that builds the same meshes in O(group size) per rank.

torchtitan unflattens a 1-D world mesh three times and flattens one submesh; on every rank torch
then materialises every group of every dim and calls ``new_group`` once per subgroup of the job,
several times over for the dims the meshes share (pp, dp_replicate, tp). Here the same meshes
come from rankmesh layouts and one :class:`~rankmesh.process_groups.MeshBuilder`: each rank creates
only its own groups, one per distinct partition of the world.

The meshes (names and semantics as in torchtitan)::

    world        [world]                                   the default group
    dataloading  [pp, batch, cp, tp]                       batch = dp_replicate * dp_shard (fake)
    loss         [loss_mesh] = flatten(batch, cp)
    dense        [pp, dp_replicate, fsdp, tp]              fsdp = dp_shard * cp
    sparse       [pp, dp_replicate, efsdp, ep, etp]        efsdp = fsdp * tp / (ep * etp)

Dims of size 1, ``batch``, and ``efsdp`` while ``ep == 1`` get ``fake``-backend groups. Example,
as on each of 8 ranks (after ``dist.init_process_group(...)``); here one process plays rank 5 on
torch's ``fake`` backend, which needs no peers (on a gloo job the report says ``'gloo'``)::

    >>> import torch.distributed as dist
    >>> from torch.testing._internal.distributed.fake_pg import FakeStore
    >>> dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=8)
    >>> pd = ParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=2, pp=1, ep=1, etp=1, world_size=8)
    >>> world_mesh = pd.build_mesh(device_type="cpu")
    >>> pd.get_mesh(["dp_replicate", "fsdp"]).shape
    (2, 2)
    >>> sorted(pd.get_all_one_dimensional_meshes())
    ['batch', 'dp_replicate', 'efsdp', 'fsdp', 'loss', 'tp']
    >>> dist.get_process_group_ranks(pd.get_mesh("fsdp").get_group())  # rank 5's fsdp group
    [5, 7]
    >>> print(pd.build_report)  # doctest: +ELLIPSIS
    10 process groups created (4 on the default backend 'fake' via new_group, 6 fake for size-1 or ...
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from rankmesh._check import as_int, check_str, check_unique
from rankmesh._native import MeshLayout
from rankmesh.consistency import check_consistency as _check_consistency
from rankmesh.errors import (
    ArgumentTypeError,
    DistributedStateError,
    MeshArgumentError,
    ParallelConfigError,
    UnknownNameError,
)
from rankmesh.mesh import init_device_mesh
from rankmesh.process_groups import BuildReport, require_default_group
from rankmesh.torchtitan import layouts as titan_layouts

__all__ = ["ParallelDims"]

logger = logging.getLogger("rankmesh")

#: The device type ``build_mesh()`` uses when none is passed, as torchtitan's module-level
#: ``device_type`` (torchtitan's own tests patch ``<module>.device_type``; so can yours).
device_type: str = "cuda" if torch.cuda.is_available() else "cpu"


def _module_device_type() -> str:
    return device_type  # read at call time, so a patched value is seen


def _titan_meshes(
    world_mesh: DeviceMesh, deg: dict[str, int], ep: int
) -> tuple[dict[str, DeviceMesh], dict[str, DeviceMesh]]:
    """torchtitan's own recipe on ``world_mesh`` (rankmesh's ``init_device_mesh``): returns the
    global meshes and the 1-D meshes, by name. One ``_unflatten`` per global mesh (batch and
    disabled dims on the fake backend), the loss mesh flattened from dataloading's (batch, cp).
    Every mesh shares the world's process groups, one per distinct partition of the world."""

    def unflatten(name: str) -> DeviceMesh:
        dims = titan_layouts.GLOBAL_MESH_DIMS[name]
        fake_names = titan_layouts.fake_dim_names(dims, [deg[n] for n in dims], ep)
        fake = {n: "fake" for n in dims if n in fake_names}
        return world_mesh._unflatten(0, tuple(deg[n] for n in dims), dims, backend_override=fake)

    dl = unflatten("dataloading")
    loss = dl["batch", "cp"]._flatten(titan_layouts.LOSS_DIM_NAME)
    dense = unflatten("dense")
    sparse = unflatten("sparse")
    global_meshes = {"dataloading": dl, "loss": loss, "dense": dense, "sparse": sparse}
    # The 1-D meshes are slices of the global meshes, as in torchtitan: they share the
    # world's rank map, which FSDP2 needs to concatenate a DP mesh with a TP mesh.
    meshes = {
        "pp": dl["pp"],
        "batch": dl["batch"],
        "loss": loss,
        "dp_replicate": dense["dp_replicate"],
        "fsdp": dense["fsdp"],
        "cp": dl["cp"],
        "tp": dl["tp"],
        "ep": sparse["ep"],
        "efsdp": sparse["efsdp"],
        "etp": sparse["etp"],
    }
    return global_meshes, meshes


@dataclass
class ParallelDims:
    """Parallelism degrees and the device meshes they define (torchtitan's ``ParallelDims``).

    ``dp_shard=-1`` takes what the other degrees leave of ``world_size``. Invalid degrees raise
    :class:`~rankmesh.errors.ParallelDimsError`, which is also an ``AssertionError`` (what
    torchtitan raises) and a ``ValueError``; degrees that do not multiply to ``world_size`` raise
    its subclass :class:`~rankmesh.errors.ParallelDimsSizeMismatchError`, also a
    :class:`~rankmesh.errors.SizeMismatchError` (rankmesh's one class for that fault in every
    convention); a world size, or a running product of the degrees in argument order, beyond
    :data:`~rankmesh.MAX_WORLD_SIZE` raises :class:`~rankmesh.errors.ParallelDimsOverflowError`
    naming it (a ``LayoutOverflowError`` too). A degree that is not an int (bool, float, str)
    raises :class:`~rankmesh.errors.ArgumentTypeError`, a ``TypeError``.
    """

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    etp: int
    world_size: int

    _meshes: dict[str, DeviceMesh] = field(default_factory=dict)
    _world_mesh: DeviceMesh | None = None
    _global_meshes: dict[str, DeviceMesh] = field(default_factory=dict, init=False, repr=False, compare=False)
    _layouts: dict[str, MeshLayout] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._validate()

    # -- validation --------------------------------------------------------------------------

    def _validate(self) -> None:
        # torchtitan's asserts, without torch: rankmesh.torchtitan.layouts is their one home (shared
        # with ``rankmesh plan``); integers by rankmesh._check's rule.
        deg = titan_layouts.resolve_degrees(
            dp_replicate=self.dp_replicate,
            dp_shard=self.dp_shard,
            cp=self.cp,
            tp=self.tp,
            pp=self.pp,
            ep=self.ep,
            etp=self.etp,
            world_size=self.world_size,
        )
        for name, value in deg.items():
            setattr(self, name, value)
        self.world_size = as_int(self.world_size, "world_size")

    def _mesh_exist(self, name: str, degree: int) -> bool:
        return titan_layouts.mesh_exists(name, degree, self.ep)

    # -- layouts -----------------------------------------------------------------------------

    def _degrees(self) -> dict[str, int]:
        """Every mesh size (:func:`rankmesh.torchtitan.layouts.degrees`). It checks that the MoE
        mesh divides, a check torchtitan does not make: its constructor accepts such degrees (its
        own tests build them without meshing), so it runs where they are first used, in building
        the meshes or layouts (torchtitan fails there inside torch)."""
        return titan_layouts.degrees(
            dp_replicate=self.dp_replicate,
            dp_shard=self.dp_shard,
            cp=self.cp,
            tp=self.tp,
            pp=self.pp,
            ep=self.ep,
            etp=self.etp,
        )

    @property
    def layouts(self) -> dict[str, MeshLayout]:
        """The rankmesh layouts of the meshes: ``world``, ``dataloading``, ``loss``, ``dense``,
        ``sparse`` (pure functions of the degrees; no process group involved)."""
        if self._layouts is None:
            self._layouts = titan_layouts.layouts(self.world_size, self._degrees())
        return self._layouts

    @property
    def fingerprint(self) -> int:
        """A stable 64-bit fingerprint of the configuration (world size and every mesh layout):
        equal on every rank that builds the same meshes."""
        h = hashlib.blake2b(b"rankmesh.parallel_dims.v1", digest_size=8)
        for name, layout in self.layouts.items():
            h.update(name.encode())
            h.update(struct.pack("<Q", layout.fingerprint()))
        return int.from_bytes(h.digest(), "little")

    # -- building ------------------------------------------------------------------------------

    def build_mesh(
        self,
        device_type: str | None = None,
        *,
        check_consistency: bool = False,
        consistency_timeout: float = 300.0,
    ) -> DeviceMesh:
        """Build every mesh (once; later calls return the same world mesh) and return the world mesh.

        Args:
            device_type: the meshes' device type; default ``"cuda"`` if available, else ``"cpu"``.
            check_consistency: first prove, in one tiny collective over the world, that every
                rank has the same configuration; raises
                :class:`~rankmesh.errors.ConfigMismatchError` on every rank otherwise (instead of
                hanging in group creation).
            consistency_timeout: seconds every rank has to reach that check.
        """
        if self._world_mesh is not None and self._meshes:
            return self._built_world_mesh(device_type)
        device_type = device_type or _module_device_type()
        t0 = time.perf_counter()
        logger.info(
            "Building device mesh with parallelism: pp=%d, dp_replicate=%d, dp_shard=%d, cp=%d, tp=%d, ep=%d, etp=%d",
            self.pp,
            self.dp_replicate,
            self.dp_shard,
            self.cp,
            self.tp,
            self.ep,
            self.etp,
        )
        deg = self._degrees()  # checks the MoE mesh before anything else
        self._check_default_group()
        if check_consistency:
            _check_consistency(self.fingerprint, timeout=consistency_timeout)
        world_mesh = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("world",))
        global_meshes, meshes = _titan_meshes(world_mesh, deg, self.ep)
        self._global_meshes = global_meshes
        self._meshes = meshes
        self._world_mesh = world_mesh
        self._validate_meshes()
        logger.info(
            "Successfully created meshes with active dimensions: %s in %.1f ms (%s)",
            list(self.get_all_one_dimensional_meshes().keys()),
            (time.perf_counter() - t0) * 1e3,
            self.build_report,
        )
        return world_mesh

    def _built_world_mesh(self, device_type: str | None) -> DeviceMesh:
        """The world mesh of the meshes built before; :class:`~rankmesh.errors.MeshArgumentError`
        when ``device_type`` asks for another device type than they were built for."""
        if device_type is not None and device_type != self._world_mesh.device_type:
            raise MeshArgumentError(
                f"the meshes were already built for device_type={self._world_mesh.device_type!r}; "
                f"cannot rebuild them for {device_type!r}. Build once, with the device type you need",
                field="device_type",
                value=device_type,
            )
        return self._world_mesh

    def _check_default_group(self) -> None:
        """Returns when the default process group exists and has ``world_size`` ranks; else
        :class:`~rankmesh.errors.DistributedStateError`."""
        require_default_group("building meshes")
        if dist.get_world_size() != self.world_size:
            raise DistributedStateError(
                f"the default process group has {dist.get_world_size()} ranks but "
                f"ParallelDims.world_size = {self.world_size}; pass world_size=dist.get_world_size()",
                field="world_size",
                value=self.world_size,
            )

    def _validate_meshes(self) -> None:
        expected = self._degrees()
        for name, size in expected.items():
            actual = self._meshes[name].size()
            if actual != size:  # pragma: no cover - would be a rankmesh bug
                raise AssertionError(f"Mesh '{name}' has unexpected size: expected {size}, got {actual}")

    @property
    def build_report(self) -> BuildReport | None:
        """Process groups this rank created for the meshes, by backend (None before the build)."""
        if self._world_mesh is None:
            return None
        report = getattr(self._world_mesh, "build_report", None)
        return report() if callable(report) else None

    # -- access (torchtitan's API) --------------------------------------------------------------

    def get_optional_mesh(self, dims: str | list[str]) -> DeviceMesh | None:
        """The mesh of one dim name or of several (in mesh order, inside one of the global
        meshes), or None when a named parallelism is disabled (size 1; efsdp: ep == 1).
        Builds the meshes on first use. Unknown names and combinations that no global mesh holds
        raise :class:`~rankmesh.errors.UnknownNameError`, a name given twice
        :class:`~rankmesh.errors.DuplicateNameError` (torch's slicing raises a ``RuntimeError`` for it:
        this is one too), each also a ``ValueError`` as in torchtitan; a name that is not a
        ``str`` of UTF-8 text :class:`~rankmesh.errors.ArgumentTypeError`."""
        if not self._meshes:
            self.build_mesh()
        one = isinstance(dims, str)
        if not one and (isinstance(dims, bytes) or not isinstance(dims, Iterable)):
            raise ArgumentTypeError(
                f"dims must be a dim name or a list of them, got {type(dims).__name__} {dims!r}",
                field="dims",
                value=dims,
            )
        dims = [dims] if one else list(dims)
        for i, mesh_name in enumerate(dims):
            check_str(mesh_name, "dims" if one else f"dims[{i}]")
        check_unique(
            dims,
            "dims",
            lambda n: (
                f"mesh dim {n!r} is named twice in {dims}; name each dim once (torch refuses "
                "overlapping dim names, even when the dim is disabled here)"
            ),
        )
        for mesh_name in dims:
            if mesh_name not in self._meshes:
                raise UnknownNameError(
                    f"Invalid mesh dim: '{mesh_name}'. Valid dimensions are: {list(self._meshes.keys())}",
                    field="dims",
                    value=mesh_name,
                )
        if any(not self._mesh_exist(d, self._meshes[d].size()) for d in dims):
            return None
        if len(dims) == 1:
            return self._meshes[dims[0]]
        for global_mesh in self._global_meshes.values():
            names = global_mesh.mesh_dim_names
            assert names is not None
            if not set(dims).issubset(set(names)):
                continue
            return global_mesh[tuple(dims)]
        raise UnknownNameError(
            f"Invalid mesh name combinations {dims}. Names used together must all belong to one "
            f"of the meshes {[tuple(m.mesh_dim_names or ()) for m in self._global_meshes.values()]}",
            field="dims",
            value=dims,
        )

    def get_mesh(self, dims: str | list[str]) -> DeviceMesh:
        """As :meth:`get_optional_mesh`, but raises ``ValueError`` instead of returning None."""
        mesh = self.get_optional_mesh(dims)
        if mesh is None:
            enabled_str = "enabled (size > 1)" if isinstance(dims, str) else "all enabled"
            raise ParallelConfigError(
                f"Mesh '{dims}' is not available. Ensure the corresponding parallelism dimension is {enabled_str}.",
                field="dims",
                value=dims,
            )
        return mesh

    def get_all_one_dimensional_meshes(self) -> dict[str, DeviceMesh]:
        """Every 1-D mesh of size > 1, by name (fake-backed ones such as ``batch`` included)."""
        if not self._meshes:
            self.build_mesh()
        return {k: v for k, v in self._meshes.items() if v.ndim == 1 and v.size() > 1}

    @property
    def world_mesh(self) -> DeviceMesh:
        if self._world_mesh is None:
            self._world_mesh = self.build_mesh()
        return self._world_mesh

    @property
    def dp_enabled(self) -> bool:
        return self.dp_replicate > 1 or self.dp_shard > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def dp_cp_enabled(self) -> bool:
        return self.dp_enabled or self.cp_enabled

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard_enabled or self.cp_enabled

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def etp_enabled(self) -> bool:
        return self.etp > 1

    @property
    def fsdp_gradient_divide_factor(self) -> int:
        # FSDP-sharded experts are sharded over efsdp, but gradients are averaged over all data
        # parallel ranks, as for the dense parameters.
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def non_data_parallel_size(self) -> int:
        return self.cp * self.tp * self.pp

    @property
    def seq_len_divisor(self) -> int:
        # Sequence parallel needs seq_len divisible by tp; load-balanced context parallel by 2 * cp.
        return self.tp * (self.cp * 2)
