"""DeepSpeed's pipeline topology and grid in O(group) per rank: the ``deepspeed_topology`` and
``deepspeed_grid`` patches of :mod:`rankmesh.patches`, which the one switch installs the moment
``deepspeed.runtime.pipe.topology`` has run (:mod:`rankmesh.switch`).

DeepSpeed's ``ProcessTopology`` keeps ``{ProcessCoord: rank}`` for every rank of the world, and its
``get_coord`` scans it (O(W), on every pipeline send and receive). ``PipelineParallelGrid`` (which
``PipelineModule`` builds) calls ``new_group`` for every group of the world on every rank (D + W/D
+ W/P + W/M calls, or W one-rank groups when M = 1) and computes ``p2p_groups`` in O(W^2): 3.1 s per
rank at 16,384 ranks, minutes at 131,072. With the patches:

- ``ProcessTopology.mapping`` is a read-only mapping that computes a rank from a coordinate (and
  back) by mixed radix, in the stock dict's order, without holding W entries; ``get_coord`` is
  O(ndim) for an ``int`` rank;
- ``PipelineParallelGrid.__init__`` runs DeepSpeed's own steps up to the groups (the topology
  printed on rank 0, the sizes, ``assert self._is_grid_valid(), "Invalid Grid"``, the stage and
  data-parallel ids), then creates only this rank's four groups (the DeepSpeed-model group, the
  data-parallel, pipe and slice groups) through one :class:`~rankmesh.MeshBuilder`: in the same
  order on every rank, with ``split_group`` on a default group bound to a device, real one-rank
  groups where DeepSpeed makes them; ``p2p_groups`` and the group lists (``dp_groups``,
  ``pipe_groups``, ``model_groups``) are read-only sequences computed per item.

Every attribute and mpu method DeepSpeed reads from the grid answers as stock (a test compares
them all). A grid that rankmesh cannot serve runs DeepSpeed's own ``__init__``: a topology of a
class that overrides the methods the grid relies on, no ``pipe`` or ``data`` axis (DeepSpeed's
own error), ``deepspeed.comm.new_group`` replaced by someone (DeepSpeed's tests record it), or a
communication backend other than DeepSpeed's ``TorchBackend``.

Example, as on rank 13 of a 64-rank job (``tests/test_deepspeed_pipe.py`` runs it on torch's
``fake`` backend)::

    deepspeed.comm.init_distributed("gloo")  # or as deepspeed.initialize does it
    topo = PipeModelDataParallelTopology(num_pp=4, num_mp=2, num_dp=8)
    grid = PipelineParallelGrid(topology=topo)  # RANKMESH_ACCELERATE=1: rankmesh's
    grid.stage_id, grid.dp_group, grid.pp_group, grid.slice_group
    # (0, [1, 3, 5, 7, 9, 11, 13, 15], [13, 29, 45, 61], [12, 13])
    grid.p2p_groups[13], grid.stage_to_global(3), topo.get_coord(13)
    # ([13, 29], 61, ProcessCoord(pipe=0, data=6, model=1))
"""

from __future__ import annotations

import itertools
import math
import sys
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rankmesh._once import warn_once
from rankmesh._patch import Gate, Patch

__all__ = ["GRID", "PATCHES", "TOPOLOGY"]

_T = "deepspeed.runtime.pipe.topology"

#: What the mapping and ``get_coord`` reproduce: the stock constructor's order and ``get_coord``.
TOPOLOGY_CODE = Gate(
    "deepspeed",
    [f"{_T}.ProcessTopology.__init__", f"{_T}.ProcessTopology.get_coord", f"{_T}.ProcessTopology.get_rank"],
    reader="this patch",
)

#: What the grid reproduces (its constructor, the topology methods and helpers it calls, the group
#: lists and ``p2p_groups`` it computes) and relies on (``new_group`` reaching torch's).
GRID_CODE = Gate(
    "deepspeed",
    [
        *TOPOLOGY_CODE.paths,
        *(
            f"{_T}.{name}"
            for name in (
                "ProcessTopology.get_dim",
                "ProcessTopology.get_axis_names",
                "ProcessTopology.get_axis_comm_lists",
                "ProcessTopology.get_axis_list",
                "PipelineParallelGrid.__init__",
                "PipelineParallelGrid.get_stage_id",
                "PipelineParallelGrid.get_data_parallel_id",
                "PipelineParallelGrid._build_p2p_groups",
                "PipelineParallelGrid._is_grid_valid",
                "PipeDataParallelTopology.__init__",
                "_prime_factors",
            )
        ),
        "deepspeed.comm.comm.new_group",
        "deepspeed.comm.torch.TorchBackend.new_group",
    ],
    reader="this patch",
)


# -- the topology ----------------------------------------------------------------------------------


class Coords(Mapping):
    """``ProcessTopology.mapping`` without W entries: ``{ProcessCoord: rank}`` in the stock dict's
    (row-major) order, each item computed by mixed radix. Read-only; equal to the stock dict.

        >>> C = namedtuple("ProcessCoord", ["pipe", "data"])
        >>> m = Coords(C, [2, 3])
        >>> m[C(pipe=1, data=2)], m.coord(4), len(m), (1, 2) in m, (2, 0) in m
        (5, ProcessCoord(pipe=1, data=1), 6, True, False)
        >>> m == {C(a, b): 3 * a + b for a in range(2) for b in range(3)}
        True
    """

    __slots__ = ("_coord", "_dims", "_size")

    def __init__(self, coord_type: Any, dims: Sequence[int]) -> None:
        self._coord = coord_type
        self._dims = tuple(dims)
        self._size = math.prod(self._dims)

    def rank(self, key: Any) -> int | None:
        """The rank at coordinate ``key`` (a tuple as the stock dict takes it), or None."""
        hash(key)  # an unhashable key raises TypeError, as a dict lookup does
        if not isinstance(key, tuple) or len(key) != len(self._dims):
            return None
        rank = 0
        for c, d in zip(key, self._dims):  # row-major: the last axis varies fastest
            if type(c) is not int:
                try:  # what equals (and hashes as) an int finds the stock dict's entry: True, 1.0, np.int64
                    if c != int(c):
                        return None
                    c = int(c)
                except (TypeError, ValueError, OverflowError):
                    return None
            if not 0 <= c < d:
                return None
            rank = rank * d + c
        return rank

    def coord(self, rank: int) -> Any:
        """The coordinate of ``rank`` (``0 <= rank < len(self)``)."""
        out = []
        for d in reversed(self._dims):
            rank, c = divmod(rank, d)
            out.append(c)
        return self._coord._make(reversed(out))

    def __getitem__(self, key: Any) -> int:
        rank = self.rank(key)
        if rank is None:
            raise KeyError(key)
        return rank

    def __contains__(self, key: object) -> bool:
        try:
            return self.rank(key) is not None
        except TypeError:
            return False

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        make = self._coord._make
        return (make(c) for c in itertools.product(*(range(d) for d in self._dims)))

    def __repr__(self) -> str:  # the stock dict's, which DeepSpeed prints on rank 0: O(W) once, 3x faster
        fields = ", ".join(f"{f}=%r" for f in self._coord._fields)
        item = f"{self._coord.__name__}({fields}): %d"
        coords = itertools.product(*(range(d) for d in self._dims))
        return "{" + ", ".join(item % (*c, r) for r, c in enumerate(coords)) + "}"

    def __reduce__(self) -> tuple[Any, ...]:  # a copy is the stock dict (a namedtuple type made at run time)
        return (dict, (list(zip(self, range(self._size))),))


def _plain_dims(axes: Any, dims: Any) -> bool:
    return (
        isinstance(axes, (list, tuple))
        and isinstance(dims, (list, tuple))
        and len(axes) == len(dims)
        and all(type(d) is int and d > 0 for d in dims)
    )


def _make_topology_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self, axes, dims):  # noqa: ANN001, ANN202, N807
        if not _plain_dims(axes, dims):
            return original(self, axes, dims)  # DeepSpeed's own result (an empty mapping, its own error)
        self.axes = axes
        self.dims = dims
        self.ProcessCoord = namedtuple("ProcessCoord", axes)
        self.mapping = Coords(self.ProcessCoord, dims)

    __init__.__doc__ = original.__doc__
    return __init__


def _make_get_coord(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_coord(self, rank):  # noqa: ANN001, ANN202
        mapping = self.__dict__.get("mapping")
        if type(mapping) is Coords and type(rank) is int:
            if 0 <= rank < len(mapping):
                return mapping.coord(rank)
            raise ValueError(f"rank {rank} not found in topology.")
        return original(self, rank)

    get_coord.__doc__ = original.__doc__
    return get_coord


# -- the grid --------------------------------------------------------------------------------------


class Lists(Sequence):
    """A read-only list whose items are computed when read (``p2p_groups``, ``dp_groups``, ...);
    equal to the stock list.

        >>> squares = Lists(4, lambda i: [i, i * i])
        >>> squares[3], squares[-1], len(squares), squares == [[0, 0], [1, 1], [2, 4], [3, 9]]
        ([3, 9], [3, 9], 4, True)
    """

    __slots__ = ("_n", "_item")

    def __init__(self, n: int, item: Callable[[int], list[int]]) -> None:
        self._n, self._item = n, item

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(j) for j in range(*i.indices(self._n))]
        i = int(i.__index__())
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("list index out of range")
        return self._item(i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # as a list

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


class _Shape:
    """A topology's ``axes`` and ``dims`` as a world layout: the core answers which ranks a group
    holds (:class:`~rankmesh.MeshLayout`, :class:`~rankmesh.Slice`)."""

    def __init__(self, axes: Sequence[str], dims: Sequence[int]) -> None:
        from rankmesh._native import MeshLayout

        self.axes = list(axes)
        self.layout = MeshLayout.world(math.prod(dims)).unflatten(0, list(dims), self.axes)

    def comm_lists(self, axis: str) -> Lists:
        """``ProcessTopology.get_axis_comm_lists(axis)``, computed per item: the i-th list starts
        at the i-th rank of the other axes (row-major), and runs along ``axis``."""
        from rankmesh._native import Slice

        firsts = Slice(0, [m for a in self.axes if a != axis for m in self.layout.modes(a)])
        line = self.layout.modes(axis)
        return Lists(len(firsts), lambda i: Slice(firsts.rank_at(i), line).ranks().tolist())

    def p2p(self) -> Lists:
        """``PipelineParallelGrid._build_p2p_groups()``: ``[r, the next stage's rank]`` per rank."""
        pipe = self.axes.index("pipe")

        def item(r: int) -> list[int]:
            ranks = self.layout.group(r, pipe)
            return [r, int(ranks[(self.layout.coordinate_of(r)[pipe] + 1) % len(ranks)])]

        return Lists(self.layout.world_size, item)


class _Groups:
    """This rank's groups of one world layout, real ones (one-rank groups too), made in call order."""

    def __init__(self, sizes: Sequence[int], names: Sequence[str]) -> None:
        from rankmesh.process_groups import MeshBuilder

        self.shape = _Shape(names, sizes)
        self.layout = self.shape.layout
        self.builder = MeshBuilder(self.layout.world_layout(), size_one_fake=False)
        self.rank = self.builder.rank

    def group(self, dim: str | int, name: str, layout: Any = None) -> Any:
        """This rank's group of ``dim`` (of :attr:`layout`, or of ``layout``, a layout of the same
        world), for DeepSpeed's ``name``: a group of its own (a tag: never the default group, nor
        shared with another, as DeepSpeed's new_group makes it; DeepSpeed compares and destroys
        them one by one)."""
        return self.builder.process_group(self.layout if layout is None else layout, dim, tag=f"deepspeed {name}")

    def ranks(self, dim: str) -> list[int]:
        return self.layout.group(self.rank, dim).tolist()

    def range(self, dim: str) -> range:
        """This rank's group as the ``range`` DeepSpeed's loop made it."""
        found = self.layout.group_slice(self.rank, dim)
        assert found is not None and found.as_range() is not None
        return found.as_range()


def _comm_reason(dist: Any) -> str | None:
    """Why rankmesh cannot create DeepSpeed's groups here (its own code runs), or None:
    ``deepspeed.comm.new_group`` replaced (DeepSpeed's tests record the calls), another
    communication backend, no torch world."""
    import torch.distributed as torch_dist
    from deepspeed.comm import comm as ds_comm
    from deepspeed.comm.torch import TorchBackend

    if dist.__dict__.get("new_group") is not ds_comm.new_group:
        return "deepspeed.comm.new_group is not DeepSpeed's own"
    cdb = ds_comm.cdb
    if not isinstance(cdb, TorchBackend) or type(cdb).new_group is not TorchBackend.new_group:
        return f"DeepSpeed's communication backend is {type(cdb).__name__}, not its TorchBackend"
    if not torch_dist.is_initialized():
        return "torch.distributed is not initialised"
    return None


def _own_code(what: str, reason: str) -> None:
    """The one warning when a call runs DeepSpeed's own code at run time (per call site and reason)."""
    warn_once(
        ("deepspeed", what, reason),
        f"rankmesh: {what}: {reason}, so DeepSpeed's own code runs (every group of the world on every rank, "
        "as without rankmesh)",
        stacklevel=4,
    )


def _grid_reason(t: Any, topology: Any) -> str | None:
    """Why rankmesh cannot build this grid (DeepSpeed's own ``__init__`` runs), or None."""
    reason = _comm_reason(t.dist)
    if reason is not None:
        return reason
    if topology is None:
        return None
    base = t.ProcessTopology
    relied = ("get_dim", "get_axis_names", "get_coord", "get_rank", "get_axis_list", "get_axis_comm_lists")
    if not isinstance(topology, base) or any(getattr(type(topology), m) is not base.__dict__[m] for m in relied):
        return f"the topology's class {type(topology).__qualname__} is not DeepSpeed's or overrides its methods"
    axes, dims, mapping = topology.__dict__.get("axes"), topology.__dict__.get("dims"), topology.__dict__.get("mapping")
    if not _plain_dims(axes, dims) or not {"pipe", "data"} <= set(axes):
        return "the topology has no pipe or data axis, or dims that are not positive ints"
    if type(mapping) is not Coords and not (type(mapping) is dict and len(mapping) == math.prod(dims)):
        return "the topology's mapping was changed"
    return None


def _make_grid_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self, topology=None, process_group=None):  # noqa: ANN001, ANN202, N807
        t = sys.modules[_T]
        reason = _grid_reason(t, topology)
        if reason is not None:
            _own_code("PipelineParallelGrid", reason)
            return original(self, topology, process_group)
        # DeepSpeed's own steps up to the groups, in its order (its messages and errors)
        self.global_rank = t.dist.get_rank()
        self.world_size = t.dist.get_world_size()
        if topology is not None:
            if self.global_rank == 0:
                print("Using topology:", topology)
            self._topo = topology
        else:
            num_pp = 1
            num_dp = 1
            for idx, prime in enumerate(t._prime_factors(self.world_size)):
                if idx % 2 == 0:
                    num_pp *= prime
                else:
                    num_dp *= prime
            self._topo = t.PipeDataParallelTopology(num_dp=num_dp, num_pp=num_pp)
        self.data_parallel_size = max(self._topo.get_dim("data"), 1)
        self.pipe_parallel_size = max(self._topo.get_dim("pipe"), 1)
        self.model_parallel_size = max(self._topo.get_dim("model"), 1)
        self.slice_parallel_size = self.model_parallel_size
        assert self._is_grid_valid(), "Invalid Grid"
        self.stage_id = self.get_stage_id()
        self.data_parallel_id = self.get_data_parallel_id()
        _groups(self, _Groups(self._topo.dims, self._topo.axes))

    __init__.__doc__ = original.__doc__
    return __init__


def _groups(grid: Any, made: _Groups) -> None:
    """The grid's groups, this rank's only (in DeepSpeed's order, one builder: the same order on
    every rank), and the attributes DeepSpeed's loops leave set."""
    from rankmesh._native import MeshLayout

    rank, world, lay = grid.global_rank, grid.world_size, made.layout
    model_axes = tuple(a for a in made.shape.axes if a != "data")  # every rank with my data coordinate
    ds_model = lay[model_axes].flatten("ds_model")
    grid.ds_model_proc_group = made.group(0, "ds_model", ds_model)
    members = ds_model.group(rank, 0).tolist()
    grid.ds_model_world_size = len(members)
    grid.ds_model_rank = members.index(rank)
    grid.dp_group = made.ranks("data")
    grid.dp_groups = made.shape.comm_lists("data")
    grid.dp_proc_group = made.group("data", "dp")
    grid.is_first_stage = grid.stage_id == 0
    grid.is_last_stage = grid.stage_id == (grid.pipe_parallel_size - 1)
    grid.p2p_groups = made.shape.p2p()
    grid.pp_group = made.ranks("pipe")
    grid.pipe_groups = made.shape.comm_lists("pipe")
    grid.pp_proc_group = made.group("pipe", "pp")
    if grid.model_parallel_size == 1:  # DeepSpeed's W one-rank groups: real ones, this rank's
        ones = MeshLayout.world(world).unflatten(0, (world, 1), ("world", "slice"))
        grid.slice_group = [rank]
        grid.slice_proc_group = made.group("slice", "slice", ones)
        return
    grid.mp_group = []
    grid.model_groups = made.shape.comm_lists("model")
    grid.slice_group = made.ranks("model")
    grid.slice_proc_group = made.group("model", "slice")


# -- deepspeed.utils.groups -------------------------------------------------------------------------

_G = "deepspeed.utils.groups"

#: What the groups patch reproduces: each loop it replaces, the helpers they call.
GROUPS_CODE = Gate(
    "deepspeed",
    [
        *(
            f"{_G}.{name}"
            for name in (
                "_init_tp_groups_with_new_group",
                "_create_zero_param_parallel_group",
                "_create_expert_and_data_parallel",
                "_create_expert_data_and_model_parallel",
                "_get_expert_parallel_ranks",
                "_ensure_divisibility",
            )
        ),
        "deepspeed.comm.comm.new_group",
        "deepspeed.comm.torch.TorchBackend.new_group",
    ],
    reader="this patch",
)


def _odd(world: int, *sizes: Any) -> bool:
    """Sizes DeepSpeed's loops do not expect (not positive ints, or not dividing the world): its
    own code runs, with its own error or result."""
    return not all(type(n) is int and n > 0 and world % n == 0 for n in sizes)


def _make_init_tp(original: Callable[..., Any]) -> Callable[..., Any]:
    def _init_tp_groups_with_new_group(tensor_model_parallel_size=1, data_parallel_size=None):  # noqa: ANN001, ANN202
        g = sys.modules[_G]
        reason = _comm_reason(g.dist)
        if reason is not None:
            _own_code("_init_tp_groups_with_new_group", reason)
            return original(tensor_model_parallel_size, data_parallel_size)
        world_size = g.dist.get_world_size()  # DeepSpeed's checks, messages and order
        if _odd(world_size, tensor_model_parallel_size, *([] if data_parallel_size is None else [data_parallel_size])):
            return original(tensor_model_parallel_size, data_parallel_size)
        g._ensure_divisibility(world_size, tensor_model_parallel_size)
        if data_parallel_size is None:
            data_parallel_size = world_size // tensor_model_parallel_size
        else:
            assert data_parallel_size * tensor_model_parallel_size == world_size, (
                f"data_parallel_size ({data_parallel_size}) * tensor_model_parallel_size "
                f"({tensor_model_parallel_size}) must equal world_size ({world_size})"
            )
        made = _Groups((data_parallel_size, tensor_model_parallel_size), ("dp", "tp"))
        g._DATA_PARALLEL_GROUP = made.group(
            "dp", "_DATA_PARALLEL_GROUP"
        )  # DeepSpeed's order: every dp group, then every tp group
        g._TENSOR_MODEL_PARALLEL_GROUP = made.group("tp", "_TENSOR_MODEL_PARALLEL_GROUP")
        g._MODEL_PARALLEL_GROUP = g._TENSOR_MODEL_PARALLEL_GROUP
        return g._DATA_PARALLEL_GROUP, g._MODEL_PARALLEL_GROUP

    _init_tp_groups_with_new_group.__doc__ = original.__doc__
    return _init_tp_groups_with_new_group


def _make_zero_param(original: Callable[..., Any]) -> Callable[..., Any]:
    def _create_zero_param_parallel_group(group_size):  # noqa: ANN001, ANN202
        g = sys.modules[_G]
        reason = _comm_reason(g.dist)
        if reason is not None:
            _own_code("_create_zero_param_parallel_group", reason)
            return original(group_size)
        world_size = g.dist.get_world_size()
        if type(group_size) is not int or _odd(world_size, min(group_size, world_size)):
            return original(group_size)
        assert g.dist.is_initialized()
        assert g._ZERO_PARAM_INTRA_PARALLEL_GROUP is None, "ZeRO parameter intra parallel group is already initialized"
        size = min(group_size, world_size)
        g._ensure_divisibility(world_size, size)
        g._ZERO_PARAM_INTRA_PARALLEL_GROUP = _Groups((world_size // size, size), ("n", "zp")).group(
            "zp", "_ZERO_PARAM_INTRA_PARALLEL_GROUP"
        )

    _create_zero_param_parallel_group.__doc__ = original.__doc__
    return _create_zero_param_parallel_group


def _log_each(g: Any, text: str, made: _Groups, dim: str) -> None:
    """DeepSpeed's line per group of ``dim``, in its order, which it logs on rank 0 only: rank 0
    still writes them all (O(W) there, as DeepSpeed's log is)."""
    if g.dist.get_rank() == 0:
        for ranks in made.shape.comm_lists(dim):
            g.log_dist(text.format(ranks), [0])


def _make_expert_and_data(original: Callable[..., Any]) -> Callable[..., Any]:
    def _create_expert_and_data_parallel(  # noqa: ANN202
        expert_parallel_size_,  # noqa: ANN001
        mp_size=None,  # noqa: ANN001
        pp_size=None,  # noqa: ANN001
        mp_mode="tp",  # noqa: ANN001
        use_data_before_expert_parallel_=False,  # noqa: ANN001
        folding_spec=None,  # noqa: ANN001
    ):
        g = sys.modules[_G]
        args = (expert_parallel_size_, mp_size, pp_size, mp_mode, use_data_before_expert_parallel_, folding_spec)
        reason = _comm_reason(g.dist)
        if reason is None and (1 if mp_size is None else mp_size) > 1:
            reason = f"mp_size={mp_size} (AutoEP's TP-strided, sp and folding layouts) is not modelled"
        if reason is not None:
            _own_code("_create_expert_and_data_parallel", reason)
            return original(*args)
        e = expert_parallel_size_
        world_size = g.dist.get_world_size()
        pp = pp_size if pp_size is not None else (1 if g.mpu is None else g.bwc_pipeline_parallel_world_size(g.mpu))
        if _odd(world_size, pp) or _odd(world_size // pp, e):
            return original(*args)
        assert g.dist.is_initialized()
        g.log_dist(f"Creating expert and data parallel groups with size {e}", ranks=[0])
        per_stage = world_size // pp
        g._ensure_divisibility(per_stage, e)
        name = f"ep_size_{e}"
        # a stage of the pipeline is (edp, ep) ranks, ep fastest (E + D), or (ep, edp) (D + E)
        if use_data_before_expert_parallel_:
            made = _Groups((pp, e, per_stage // e), ("pp", "ep", "edp"))
        else:
            made = _Groups((pp, per_stage // e, e), ("pp", "edp", "ep"))
        if name not in g._EXPERT_DATA_PARALLEL_GROUP:
            _log_each(g, f"Creating expert data parallel process group named {name} with ranks: {{}}", made, "edp")
            g._EXPERT_DATA_PARALLEL_GROUP[name] = made.group("edp", f"_EXPERT_DATA_PARALLEL_GROUP {name}")
            g._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = made.range("edp")
        if name not in g._EXPERT_PARALLEL_GROUP:
            _log_each(g, f"creating expert parallel process group named {name} with ranks: {{}}", made, "ep")
            g._EXPERT_PARALLEL_GROUP[name] = made.group("ep", f"_EXPERT_PARALLEL_GROUP {name}")
            g._EXPERT_PARALLEL_GROUP_RANKS[name] = made.range("ep")

    _create_expert_and_data_parallel.__doc__ = original.__doc__
    return _create_expert_and_data_parallel


def _make_expert_data_and_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def _create_expert_data_and_model_parallel(expert_parallel_size_, mpu, use_data_before_expert_parallel_=False):  # noqa: ANN001, ANN202
        g = sys.modules[_G]
        reason = _comm_reason(g.dist)
        if reason is None and use_data_before_expert_parallel_:
            reason = "use_data_before_expert_parallel_ (D + E) is not modelled"
        if reason is not None:
            _own_code("_create_expert_data_and_model_parallel", reason)
            return original(expert_parallel_size_, mpu, use_data_before_expert_parallel_)
        tp = g.bwc_tensor_model_parallel_world_size(mpu)
        pp = 1 if mpu is None else g.bwc_pipeline_parallel_world_size(mpu)
        world_size = g.dist.get_world_size()
        if _odd(world_size, tp, pp, tp * pp) or _odd(world_size // (tp * pp), expert_parallel_size_):
            return original(expert_parallel_size_, mpu, use_data_before_expert_parallel_)
        assert g.dist.is_initialized(), "dist is not initialized"
        g.expert_tensor_parallel_world_size = tp
        dp_world_size = g._get_data_parallel_world_size()
        g._ensure_divisibility(world_size, tp)
        g._ensure_divisibility(dp_world_size, expert_parallel_size_)
        g.log_dist(
            f"Creating deepspeed groups with model parallel size {tp}, "
            f"pipeline parallel size {pp}, expert parallel size {expert_parallel_size_}, "
            f"world size {world_size}, dp world size {dp_world_size}",
            [0],
        )
        name = f"ep_size_{expert_parallel_size_}"
        if name in g._EXPERT_DATA_PARALLEL_GROUP or name in g._EXPERT_PARALLEL_GROUP:
            return
        g._ensure_divisibility(world_size, tp * pp)  # _get_expert_parallel_ranks' checks
        per_stage_dp = world_size // (tp * pp)
        g._ensure_divisibility(per_stage_dp, expert_parallel_size_)
        # a stage is (dp, tp), tp fastest; its dp lists cut into chunks of E: (edp, ep, tp)
        sizes = (pp, per_stage_dp // expert_parallel_size_, expert_parallel_size_, tp)
        made = _Groups(sizes, ("pp", "edp", "ep", "tp"))
        g._EXPERT_PARALLEL_GROUP[name] = made.group(
            "ep", f"_EXPERT_PARALLEL_GROUP {name}"
        )  # DeepSpeed's order: every ep group, then edp
        g._EXPERT_PARALLEL_GROUP_RANKS[name] = made.ranks("ep")
        g._EXPERT_DATA_PARALLEL_GROUP[name] = made.group("edp", f"_EXPERT_DATA_PARALLEL_GROUP {name}")
        g._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = made.ranks("edp")

    _create_expert_data_and_model_parallel.__doc__ = original.__doc__
    return _create_expert_data_and_model_parallel


#: ``ProcessTopology`` without W entries (listed in :mod:`rankmesh.patches`).
TOPOLOGY = Patch(
    "deepspeed_topology",
    f"{_T}.ProcessTopology",
    "__init__",
    _make_topology_init,
    also={"get_coord": _make_get_coord},
    why="DeepSpeed's ProcessTopology holds {coord: rank} for all W ranks and get_coord scans it, O(W) on "
    "every pipeline send and receive; rankmesh's computes both by mixed radix, O(ndim)",
    detail="(ProcessTopology.__init__, get_coord, get_rank, by body)",
    gate=TOPOLOGY_CODE,
)

#: ``PipelineParallelGrid`` with this rank's groups only (listed in :mod:`rankmesh.patches`).
GRID = Patch(
    "deepspeed_grid",
    f"{_T}.PipelineParallelGrid",
    "__init__",
    _make_grid_init,
    why="DeepSpeed's PipelineParallelGrid calls new_group for every group of the world on every rank and "
    "builds p2p_groups in O(W^2) (3.1 s per rank at 16,384); rankmesh's creates this rank's four groups",
    detail="(PipelineParallelGrid.__init__, the topology methods it calls, new_group, by body)",
    gate=GRID_CODE,
)

#: ``deepspeed.utils.groups``' loops over every group of the world, this rank's groups only.
GROUPS = Patch(
    "deepspeed_groups",
    _G,
    "_create_expert_and_data_parallel",
    _make_expert_and_data,
    also={
        "_create_expert_data_and_model_parallel": _make_expert_data_and_model,
        "_create_zero_param_parallel_group": _make_zero_param,
        "_init_tp_groups_with_new_group": _make_init_tp,
    },
    why="deepspeed.utils.groups calls new_group for every expert, expert-data, ZeRO++ and TP/DP group of the "
    "world on every rank; rankmesh's creates this rank's, with the same globals set",
    detail="(the four group loops and the helpers they call, by body)",
    gate=GROUPS_CODE,
)

PATCHES = (TOPOLOGY, GRID, GROUPS)
