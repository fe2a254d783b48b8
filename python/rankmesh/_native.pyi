"""Type stubs for ``rankmesh._native``, the PyO3 extension built from ``rust/python.rs``.

Import the public names from :mod:`rankmesh` instead. Every method that can fail raises a
subclass of :class:`rankmesh.errors.RankmeshError` (a ``ValueError``) with the offending ``field``
and ``value`` (the value itself: an int, a tuple of sizes, a name, ...); a panic in the Rust core
surfaces as :class:`rankmesh.errors.InternalError`.

Integer arguments follow :mod:`rankmesh._check`'s rule (anything with ``__index__``, numpy
integers included, but not ``bool``); a float, bool or string where an int is needed, or a str
where a sequence of names is, raises :class:`rankmesh.errors.ArgumentTypeError` (a ``TypeError``),
and an int beyond 128 bits :class:`rankmesh.errors.LayoutOverflowError`.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Final, SupportsIndex, final

import numpy as np
import numpy.typing as npt

_Int = int | SupportsIndex
_Dim = str | _Int
_RankMap = npt.ArrayLike

MAX_WORLD_SIZE: Final[int]
"""Largest world size accepted: torch stores ranks as int32, so ``2**31 - 1``."""

__version__: Final[str]
"""The crate's version from ``Cargo.toml``; ``rankmesh.__version__`` and the wheel use it too."""

@final
class MeshLayout:
    """An immutable DeviceMesh rank layout over one world.

    Each dim is a short list of CuTe-style ``(size, stride)`` modes over the world index, like
    torch's ``_MeshLayout``; ``rank_map[i]`` is the rank placed at world index ``i``. Layouts are
    values: they compare equal, hash and pickle by (world size, rank map, modes, names).

    >>> m = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))
    >>> m.group(6, "tp").tolist(), m.group(6, "dp").tolist(), m.coordinate_of(6)
    ([4, 5, 6, 7], [2, 6], (1, 2))
    """

    @staticmethod
    def world(world_size: _Int, rank_map: _RankMap | None = None) -> MeshLayout:
        """The 1-D mesh of ``world_size`` ranks named ``"world"``.

        ``rank_map[i]`` is the rank at index ``i``: a 1-D integer permutation of
        ``range(world_size)`` (list, numpy array or tensor). An identity map is the same as none.

        Raises:
            InvalidSizeError: ``world_size <= 0``.
            LayoutOverflowError: ``world_size > MAX_WORLD_SIZE``.
            InvalidRankMapError: ``rank_map`` is not a 1-D permutation of the world; ``value`` is
                the number of entries, the entry outside the world, the rank that appears twice,
                or the shape of an array that is not 1-D.
            ArgumentTypeError: ``world_size`` is not an int, or ``rank_map`` holds entries that
                are not ints (``value`` is the first such entry) or is not a sequence.
        """

    @staticmethod
    def placed(world_size: _Int, offset: _Int, modes: Sequence[tuple[_Int, _Int]]) -> MeshLayout:
        """The 1-D mesh named ``"world"`` over part of a job of ``world_size`` ranks: its index ``i``
        is rank ``offset + sum(digit_k(i) * stride_k)``, the digits being ``i`` in mixed radix of the
        modes' sizes (last mode fastest). O(modes) whatever the number of ranks: a contiguous range
        ``[S, S + N)`` is ``placed(W, S, [(N, 1)])``, a strided one ``placed(W, S, [(N, k)])``.
        Every layout derived from it (unflatten, slicing, flatten) is over those ranks; a rank of the
        job outside them is no member (:meth:`is_member`; per-rank queries raise for it).

        >>> students = MeshLayout.placed(16, 8, [(8, 1)]).unflatten("world", (2, 4), ("dp", "tp"))
        >>> students.group(13, "dp").tolist(), students.coordinate_of(13), students.is_member(3)
        ([9, 13], (1, 1), False)
        >>> MeshLayout.placed(8, 0, [(8, 1)]) == MeshLayout.world(8)  # every rank in order
        True

        Raises:
            InvalidLayoutError: a mode that is not positive (``field`` ``"modes[k]"``), or modes
                that overlap so that a rank would appear twice (``"modes"``).
            RankOutOfRangeError: ``offset`` or the last rank outside ``range(world_size)``.
            InvalidSizeError, LayoutOverflowError: ``world_size`` as in :meth:`world`.
        """

    @property
    def global_size(self) -> int:
        """Ranks in the job (the default process group): :attr:`world_size` unless :meth:`placed`."""

    @property
    def placement(self) -> tuple[int, list[tuple[int, int]]] | None:
        """``(offset, modes)`` of a world over part of the job (:meth:`placed`), else None."""

    @staticmethod
    def renumbered(
        old_world_size: _Int,
        size: _Int,
        removed: Sequence[_Int],
        replaced: Mapping[_Int, _Int] | Sequence[tuple[_Int, _Int]],
    ) -> MeshLayout:
        """The 1-D mesh named ``"world"`` re-formed after a failure, stored in O(changes): before it,
        index ``i`` was rank ``i`` of a job of ``old_world_size`` ranks (``size`` in the mesh, the rest
        spares); the old ranks ``removed`` left the job, the spare of old rank ``r`` takes index ``i``
        for each ``i: r`` in ``replaced``, and the ranks still alive are renumbered in order (as
        torch's ``shrink_group`` does). Every rank of the new job holds an index. Build it with
        :func:`rankmesh.recovery.hot_spare`; malformed parts raise ``InvalidLayoutError`` naming them.

        >>> w = MeshLayout.renumbered(9, 8, [3], {3: 8})   # rank 3 failed, spare 8 takes its index
        >>> w.rank_map().tolist(), w.coordinate_of(7)
        ([0, 1, 2, 7, 3, 4, 5, 6], (3,))
        """

    @property
    def renumbering(self) -> tuple[int, list[int], list[tuple[int, int]]] | None:
        """``(old_world_size, removed, [(index, spare rank), ...])`` of a world re-formed after a
        failure (:meth:`renumbered`), else None."""

    def is_member(self, rank: _Int) -> bool:
        """Whether ``rank`` of the job is one of this layout's ranks (always, unless placed)."""

    @property
    def in_rank_order(self) -> bool:
        """Whether index ``i`` is rank ``i`` of the job for every index: no rank map and no
        placement (O(1); ``rank_map() is None`` copies a permuted world's map to answer)."""

    def world_layout(self) -> MeshLayout:
        """The 1-D ``"world"`` layout this layout derives from, O(1): the layout to build a
        :class:`~rankmesh.MeshBuilder` over, e.g. ``MeshBuilder(mesh.world_layout())``.

        >>> w = MeshLayout.world(8)
        >>> w.unflatten(0, (2, 4), ("dp", "tp"))["tp"].world_layout() == w
        True
        """

    def unflatten(self, dim: _Dim, sizes: Sequence[_Int], names: Sequence[str]) -> MeshLayout:
        """Splits ``dim`` (name or index) into ``sizes`` named ``names``, like
        ``DeviceMesh._unflatten``; works on any dim, including ones from an earlier flatten.

        Raises:
            InvalidSizeError: a size ``<= 0`` (``field`` is e.g. ``"sizes[1]"``).
            SizeMismatchError: the sizes do not multiply to the dim's size (``field`` is
                ``"sizes"``, ``value`` the sizes), or ``len(sizes) != len(names)`` (``"names"``,
                the names).
            LayoutOverflowError: a size over ``MAX_WORLD_SIZE``, or the size whose factor makes
                the product of sizes overflow 64 bits (``field`` is e.g. ``"sizes[2]"``).
            ArgumentTypeError: a size that is not an int, names that are not a sequence of str.
            IncompatibleLayoutError: the sizes cannot split a dim flattened from non-adjacent
                dims (torch's pycute raises there too).
            DuplicateNameError, InvalidNameError, UnknownNameError, DimOutOfRangeError.
        """

    def __getitem__(self, key: str | tuple[str, ...] | list[str]) -> MeshLayout:
        """Slices by one name or a tuple of names, in mesh order, like ``DeviceMesh.__getitem__``.

        A slice keeps the named dims; each rank's part of it is the slice through that rank's
        coordinate in the other dims. Over 8 ranks as ``(pp, dp, tp) = (2, 2, 2)``, the ``(pp, tp)``
        slice on ranks 0, 1, 4, 5 (dp = 0) is the mesh ``[[0, 1], [4, 5]]``, on ranks 2, 3, 6, 7
        it is ``[[2, 3], [6, 7]]``; names out of mesh order are refused with an order that works:

        >>> m = MeshLayout.world(8).unflatten("world", (2, 2, 2), ("pp", "dp", "tp"))
        >>> m["pp", "tp"].mesh_of(5).tolist(), m["pp", "tp"].mesh_of(2).tolist()
        ([[0, 1], [4, 5]], [[2, 3], [6, 7]])
        >>> m["tp", "pp"]
        Traceback (most recent call last):
            ...
        rankmesh.errors.SliceOrderError: names ["tp", "pp"] are not in mesh order ...; ... e.g. ["pp", "tp"]

        Raises:
            UnknownNameError (also a ``KeyError``), SliceOrderError (``value`` is the names as
            given; the message suggests an order that slices), EmptySliceError,
            DuplicateNameError, ArgumentTypeError (a key that is not a name or names).
        """

    def with_modes(self, axes: Sequence[Sequence[tuple[_Int, _Int]]], names: Sequence[str]) -> MeshLayout:
        """A layout over this layout's world from raw ``(size, stride)`` modes per dim (torch's
        ``_FlatLayout`` shapes and strides), e.g. to mirror a layout torch's algebra produced.
        O(modes); the world and its rank map are shared.

        >>> w = MeshLayout.world(8)
        >>> w.with_modes([[(2, 4)], [(4, 1)]], ["dp", "tp"]) == w.unflatten("world", (2, 4), ("dp", "tp"))
        True

        Raises:
            InvalidLayoutError: a mode that is not a positive ``(size, stride)`` pair or spans
                more than the world (``field`` is ``"axes[a][k]"``, ``value`` the mode), or modes
                that overlap or do not tile the world (``"axes"``, every dim's modes).
            LayoutOverflowError: a size or stride beyond 64 bits (``field`` is e.g.
                ``"axes[0][1][1]"`` for the stride of mode 1 of dim 0).
            SizeMismatchError: ``len(axes) != len(names)``.
            ArgumentTypeError: a part of the wrong type (``field`` names it, e.g. ``"axes[1]"``).
            DuplicateNameError, InvalidNameError.
        """

    def flatten(self, name: str | None = None) -> MeshLayout:
        """A 1-D layout over all dims of this one (adjacent or not), like
        ``DeviceMesh._flatten``; ``name`` defaults to the dim names joined by ``"_"``.

        As in torch, a layout remembers its *root* (the layout that unflatten, slicing and
        flatten started from: :meth:`world`, or :meth:`with_modes`), and a flatten may not take a
        name the root uses; a 1-D layout flattened into its own name is itself:

        >>> dp = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))["dp"]
        >>> dp.flatten("world")
        Traceback (most recent call last):
        ...
        rankmesh.errors.DuplicateNameError: name = "world" already names a dim of the root mesh ["world"]; \
a flattened dim needs a name the root does not use, e.g. "world_flat"
        >>> dp.flatten("dp") == dp, dp.flatten("world_flat").names
        (True, ('world_flat',))

        Raises:
            DuplicateNameError (``field`` ``"name"``, ``value`` the name): a name of the root.
            InvalidNameError: an empty name. ArgumentTypeError: a name that is not a ``str`` of
                UTF-8 text.
        """

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of every dim, like ``DeviceMesh.shape``."""

    @property
    def names(self) -> tuple[str, ...]:
        """The dim names, like ``DeviceMesh.mesh_dim_names``."""

    @property
    def ndim(self) -> int:
        """Number of dims."""

    @property
    def world_size(self) -> int:
        """Number of ranks in the world this layout is over."""

    @property
    def num_copies(self) -> int:
        """Number of copies of this mesh that tile the world (rows of :meth:`groups`)."""

    def size(self, dim: _Dim | None = None) -> int:
        """Ranks in one copy of the mesh, or the size of one dim, like ``DeviceMesh.size()``."""

    def modes(self, dim: _Dim) -> list[tuple[int, int]]:
        """The ``(size, stride)`` modes of one dim over the world index (torch's
        ``_layout[dim]`` as ``zip(shape, stride)``); empty for a dim of size 1."""

    def partition_key(self, dim: _Dim) -> list[tuple[int, int]]:
        """Canonical ``(size, stride)`` modes of one dim's partition of the world, outermost
        first: two dims of one world with equal keys have the same groups as sets of ranks
        (e.g. one process group can serve both)."""

    def group_slice(self, rank: _Int, dim: _Dim) -> Slice | None:
        """``rank``'s group along ``dim`` as a set: a :class:`Slice` from its smallest rank over
        the dim's partition modes (its ranks increasing), in O(modes); None when the world is not
        in rank order (a rank map, a placement, a re-form: read :meth:`group`).

        >>> MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp")).group_slice(6, "dp")
        Slice(2, [(2, 4)])
        """

    def same_groups(self, other: MeshLayout) -> bool:
        """Whether ``other`` splits the job into the same groups as this layout (each copy of
        the mesh one group, as a set of ranks): O(modes) when their modes decide it, else
        O(world), by each rank's smallest group-mate.

        >>> m = MeshLayout.world(8).unflatten("world", (2, 2, 2), ("a", "b", "c"))
        >>> n = MeshLayout.world(8).unflatten("world", (2, 4), ("x", "y"))
        >>> m["a"].same_groups(n["x"]), m["a"].same_groups(m["c"])   # {0, 4}, {1, 5}, ...
        (True, False)
        """

    def rank_map(self) -> npt.NDArray[np.int32] | None:
        """The rank map as a new int32 array, or ``None`` for the identity; for a :meth:`placed`
        world its ranks in index order (made on request, O(its size))."""

    def rank_map_tuple_hash(self) -> int:
        """``hash(tuple(rank_map))`` for the world's rank map (identity included), computed
        without building the tuple (torch's ``DeviceMesh.__hash__`` hashes that W-long tuple).

        >>> MeshLayout.world(4).rank_map_tuple_hash() == hash((0, 1, 2, 3))
        True
        """

    def mesh_of(self, rank: _Int) -> npt.NDArray[np.int32]:
        """The local mesh a DeviceMesh of this layout holds on ``rank`` (``DeviceMesh.mesh``):
        int32 array of :attr:`shape`. O(mesh size).

        Raises:
            RankOutOfRangeError: ``rank`` is not in ``range(global_size)``, or not one of the ranks
                of a :meth:`placed` world (the message says which).
        """

    def coordinate_of(self, rank: _Int) -> tuple[int, ...]:
        """``rank``'s coordinate in its mesh, as ``DeviceMesh.get_coordinate()`` on that rank."""

    def group(self, rank: _Int, dim: _Dim) -> npt.NDArray[np.int32]:
        """The ranks of ``rank``'s group in ``dim`` (who ``get_group(dim)`` connects), in mesh
        order: int32 1-D array. O(group size)."""

    def copy_index_of(self, rank: _Int) -> int:
        """Which copy of the mesh (row of :meth:`groups`) holds ``rank``."""

    def groups(self) -> npt.NDArray[np.int32]:
        """Every copy of the mesh: int32 array ``(world_size // size(), *shape)`` in torch's
        order, equal to ``_MeshLayout.remap_to_tensor(rank_map)``. O(world size)."""

    def fingerprint(self) -> int:
        """A stable 64-bit hash of (world size, rank map, dims, names): equal on every rank,
        every run and every platform, so ranks can check that they agree."""

    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __len__(self) -> int: ...
    def __repr__(self) -> str: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

@final
class Slice:
    """A set of distinct ranks as one value, in the spirit of Monarch's ``ndslice::Slice``: index
    ``i`` is rank ``offset + sum(digit_k(i) * stride_k)`` over ``(size, stride)`` modes (outermost
    first, the digits being ``i`` in mixed radix of the sizes). Validated once (positive sizes and
    strides, modes that do not overlap, ranks within int32); every query is a method, O(modes)
    where the modes decide it. Slices compare and hash by their coalesced modes.

    It is rankmesh's one face of placement arithmetic: the groups rankmesh made from a layout
    (:func:`rankmesh.process_groups.group_slice`), the ranks a mesh over part of the job is placed
    at, the overlap check of ``rankmesh plan --mesh``, spmd_types' layout inclusion.

    >>> import numpy as np
    >>> s = Slice.recognise(np.array([1, 3, 9, 11]))
    >>> s, len(s), s.rank_at(2), s.index_of(11), s.coordinates(9), 5 in s
    (Slice(1, [(2, 8), (2, 2)]), 4, 9, 3, [1, 0], False)
    >>> s.first_shared_rank(Slice.of_range(range(2, 14, 3)))   # 2, 5, 8, 11
    11
    """

    def __init__(self, offset: _Int, modes: Sequence[tuple[_Int, _Int]] | None = None) -> None:
        """``offset + modes``; overlapping modes raise ``InvalidLayoutError``, a size or stride
        below 1 too, ranks past int32 ``RankOutOfRangeError``."""

    @staticmethod
    def of_range(ranks: range) -> Slice:
        """The ranks of a non-empty ``range`` with a positive step (any step for one rank)."""

    @staticmethod
    def recognise(ranks: npt.NDArray[np.int64]) -> Slice | None:
        """The slice that ``ranks`` (a 1-D int64 array) are, in their order, or None when they
        are no such set (a general subset, a repeated or negative rank). O(len), in the core."""

    @property
    def offset(self) -> int:
        """The first (and smallest) rank."""

    @property
    def modes(self) -> list[tuple[int, int]]:
        """``(size, stride)`` modes, outermost first, coalesced; none for one rank."""

    @property
    def last(self) -> int:
        """The largest rank."""

    def rank_at(self, index: _Int) -> int:
        """The rank at ``index`` (``select``); ``IndexError`` outside ``range(len(self))``."""

    def index_of(self, rank: _Int) -> int | None:
        """The index of ``rank``, or None when it is not one of the ranks. O(modes)."""

    def coordinates(self, rank: _Int) -> list[int] | None:
        """``rank``'s digit in each mode (outermost first), or None when it is not one of them."""

    def as_range(self) -> range | None:
        """The ranks as a ``range`` when they are one (at most one mode), else None."""

    def ranks(self) -> npt.NDArray[np.int32]:
        """Every rank in index order (O(len))."""

    def first_shared_rank(self, other: Slice) -> int | None:
        """The least rank in both, or None: O(log stride) for two ranges (the Chinese remainder
        theorem), otherwise the smaller slice walked in increasing order."""

    def intersects(self, other: Slice) -> bool:
        """Whether the two share a rank."""

    def subset_by_modes(self, other: Slice) -> bool | None:
        """Whether every rank of this slice is one of ``other``'s, from the modes alone (O(modes));
        None when they do not decide it (an offset, or cut points that are no divisibility chain:
        then only the rank sets can)."""

    def __contains__(self, rank: object) -> bool: ...
    def __len__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __repr__(self) -> str: ...

def _restore(*state: Any) -> MeshLayout:
    """Rebuilds a pickled MeshLayout from its parts ``(world_size, rank_map, axes, names)``, and
    ``root_names`` for a layout derived from another root (so that its flatten refuses them), and
    ``(global_size, offset, modes)`` for a :meth:`MeshLayout.placed` world, as
    :meth:`MeshLayout.__reduce__` gives them, validating every part as :meth:`MeshLayout.world`
    and :meth:`MeshLayout.with_modes` do: whatever a corrupted payload holds, the failure is a
    typed :mod:`rankmesh.errors` class naming its field (``InvalidLayoutError`` with field
    ``"state"`` when there are not 4 to 6 parts)."""

def _panic_for_test() -> None:
    """Test hook: panics inside the FFI guard; raises :class:`rankmesh.errors.InternalError`."""

def hashed_group_name(ranks: npt.NDArray[np.int32], salt: int) -> str:
    """torch's hashed name of a member-only process group: the SHA-1 hex digest of
    ``"_".join(map(str, ranks)) + "_" + str(salt)`` (``distributed_c10d._hash_ranks_to_str``),
    without building the joined string. ``ranks``: the sorted members, a C-contiguous int32 array.

    >>> import hashlib, numpy as np
    >>> hashed_group_name(np.array([0, 4, 8], dtype=np.int32), 7) == hashlib.sha1(b"0_4_8_7").hexdigest()
    True
    """

def member_tuple(ranks: npt.NDArray[np.int32]) -> tuple[int, ...]:
    """The ranks of a 1-D int32 array as a tuple of ints that Python's cycle collector does not
    track (a tuple of ints holds no cycle; CPython untracks one itself at the first collection that
    walks it). A group's rank table keeps its members this way.

    >>> import gc, numpy as np
    >>> t = member_tuple(np.array([0, 4, 8], dtype=np.int32))
    >>> t, gc.is_tracked(t), gc.is_tracked(tuple([0, 4, 8]))
    ((0, 4, 8), False, True)
    """
