"""rankmesh's exception hierarchy. Every class lives here; the top level re-exports
:class:`RankmeshError` and the errors a job catches around its init (``ConfigMismatchError``,
``ConsistencyTimeoutError``, ``DistributedStateError``, ``ReformError``).

Every error derives from :class:`RankmeshError`, itself a :class:`ValueError`, and carries the
offending ``field`` and ``value`` (keyword-only; ``value`` is the offending value itself, not a
description of it) next to a message that says how to fix it::

    >>> from rankmesh import MeshLayout
    >>> from rankmesh.errors import SizeMismatchError
    >>> try:
    ...     MeshLayout.world(8).unflatten("world", (2, 2), ("dp", "tp"))
    ... except SizeMismatchError as e:
    ...     print(e.field, e.value)
    sizes (2, 2)

The value is a Python object of the kind the field names: an ``int`` for a size, rank or dim, a
``tuple`` for sizes or names, a ``str`` for one name, the ``(size, stride)`` mode for a raw mode.

Some classes also derive from the builtin that torch raises in the same situation (``KeyError``
for unknown names, ``IndexError`` for out-of-range dims and ranks, ``OverflowError``, and
``TypeError`` for an argument of the wrong type, such as a float size), so code written against
``DeviceMesh`` keeps catching them.

An error also carries, as pydantic-core's errors carry ``type`` and ``ctx``, a stable ``kind``
slug (the class's by default, e.g. ``"size_mismatch"``; a finer one where code may want to tell
faults apart, e.g. ``"degree_not_positive"``), a ``ctx`` dict of the values involved, and where
one is known a ``fix`` written in argument names: :meth:`RankmeshError.fix_text` renders it for
the API, and ``rankmesh plan`` renders the same text with its flags (``{tp=1}`` is ``tp=1`` here,
``--tp 1`` on the command line), so the CLI keeps no fix texts of its own. The message itself is
a template over the arguments it names in the same way (:func:`arg`; :meth:`RankmeshError.render`),
so ``rankmesh plan`` prints ``--tp 0`` where the API says ``tp = 0`` without reading the prose::

    >>> from rankmesh.errors import InvalidSizeError
    >>> e = InvalidSizeError("tp must be >= 1, got 0", field="tp", value=0,
    ...                      fix="use {tp=1} to disable tensor parallelism")
    >>> e.kind, e.fix_text(), e.fix_text({"tp": "--tp"}.get)
    ('invalid_size', 'use tp=1 to disable tensor parallelism', 'use --tp 1 to disable tensor parallelism')
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [  # the error classes (the table of kinds, ERROR_KINDS, is read as rankmesh.errors.ERROR_KINDS)
    "RankmeshError",
    "InvalidSizeError",
    "SizeMismatchError",
    "LayoutOverflowError",
    "UnknownNameError",
    "DuplicateNameError",
    "InvalidNameError",
    "SliceOrderError",
    "EmptySliceError",
    "RankOutOfRangeError",
    "DimOutOfRangeError",
    "InvalidRankMapError",
    "IncompatibleLayoutError",
    "InvalidLayoutError",
    "MeshArgumentError",
    "ArgumentTypeError",
    "InternalError",
    "ParallelConfigError",
    "TopologyError",
    "DistributedStateError",
    "ConfigMismatchError",
    "ConsistencyTimeoutError",
    "InvalidTimeoutError",
    "ParallelDimsError",
    "ParallelDimsSizeMismatchError",
    "ParallelDimsOverflowError",
    "MegatronConfigError",
    "MegatronStateError",
    "UnsupportedVersionError",
    "GroupExistsError",
    "GroupNotCreatedError",
    "ReformError",
]


#: Every finer ``kind`` an error may carry (beyond its class's own, e.g. ``"size_mismatch"``), with
#: the keys of its ``ctx``, in the spirit of pydantic-core's ``ErrorType``: code that tells faults
#: apart reads ``e.kind`` and ``e.ctx[...]`` and can rely on these. ``tests/test_structure.py`` checks
#: that every kind raised in the package (``kind=``, or positionally to a ``..._error`` helper) is here
#: and passes exactly these ``ctx`` keys.
ERROR_KINDS: dict[str, tuple[str, ...]] = {
    # a degree or size below 1 (tp=0, --tp -3); the field names it
    "degree_not_positive": (),
    # the degrees multiply to another number than the world size
    "degrees_do_not_fill_world": ("product",),
    # the world size is no multiple of what the degrees need
    "world_not_divisible": ("world_size", "divisor"),
    # dp_shard=-1 has nothing left to take
    "no_rank_left": ("world_size", "others"),
    # torchtitan's etp must be tp or 1
    "etp_not_tp_or_1": ("tp", "ep"),
    # the MoE mesh (efsdp x ep x etp) does not divide the sparse ranks
    "moe_mesh_does_not_divide": ("etp", "sparse_ranks"),
    # a Megatron order string that leaves out a dim of size > 1; works: an order that builds (or None)
    "order_misses_dim": ("dim", "size", "works"),
    # a Megatron order that does not end with pp while the dense and expert layers then disagree
    # (dp sizes or pipeline groups); works: the order that would (None when none does)
    "order_pp_not_last": ("works",),
    # a rankmesh plan flag the chosen convention does not take
    "not_for_convention": ("convention",),
    # rankmesh plan --mesh: two meshes of one job share ranks
    "meshes_overlap": (),
    # rankmesh plan --mesh: a spec that is not NAME=START:STOP[:STEP][:DIM=SIZE,...]
    "mesh_syntax": (),
    # rankmesh plan --mesh: a range of ranks that is empty (STOP not after START) or steps below 1
    "empty_mesh": (),
    # rankmesh.recovery: a failed rank whose mesh position no spare can take
    "no_spare_left": ("failed", "spares"),
    # rankmesh.recovery.shrink: every replica lost a rank, or the replica dim is 1
    "no_replica_left": ("dim", "size", "failed_replicas"),
    # rankmesh.patches.get: a name that is no patch of the registry; patches: the names it has
    "unknown_patch": ("patches",),
    # a mesh over part of the job asked for a group on a rank outside it (get_group, get_local_rank);
    # placement: the (offset, [(size, stride), ...]) of the mesh's ranks, as MeshLayout.placement
    "rank_not_in_mesh": ("rank", "placement"),
}


#: The marks around an argument's mention in a message template (:func:`arg`): ASCII record and
#: unit separators, which no value a message shows holds.
_OPEN, _SEP, _CLOSE = "\x1e", "\x1f", "\x1d"
_MARK = re.compile(f"{_OPEN}([^{_SEP}]*){_SEP}([^{_SEP}]*){_SEP}([^{_CLOSE}]*){_CLOSE}")
_NO_VALUE = "\x00"  # in a mark: the mention shows no value
_UNSET: Any = object()


def arg(name: str, text: str | None = None, value: Any = _UNSET) -> str:
    """An argument's mention in an error message: the message is a template over the arguments it
    names, as pydantic-core renders each message from a template over its error's context. The
    API's message says ``text`` (default: ``name``); ``rankmesh plan`` says the argument's flag,
    followed by ``value`` (as typed) when the mention shows one, wherever the user typed that flag
    (:meth:`RankmeshError.render`). The same data gives both, so the CLI parses no prose.

        >>> e = InvalidSizeError(f"{arg('tp', f'tp = {0}', 0)} must be >= 1", field="tp", value=0)
        >>> str(e), e.render(lambda name, value: "--tp" if name == "tp" else None)
        ('tp = 0 must be >= 1', '--tp 0 must be >= 1')
    """
    shown = name if text is None else text
    typed = _NO_VALUE if value is _UNSET else str(value)
    return f"{_OPEN}{name}{_SEP}{shown}{_SEP}{typed}{_CLOSE}"


def render(template: str, name_of: Callable[[str, str | None], str | None] | None = None) -> str:
    """``template`` with each :func:`arg` mention as the API says it, or, where ``name_of(name,
    value)`` gives a flag, as that flag (and the value typed, when the mention shows one)."""
    if _OPEN not in template:
        return template

    def fill(m: re.Match) -> str:
        name, shown, value = m.group(1), m.group(2), m.group(3)
        value = None if value == _NO_VALUE else value
        flag = name_of(name, value) if name_of is not None else None
        if flag is None:
            return shown
        return flag if value is None else f"{flag} {value}"

    return _MARK.sub(fill, template)


class RankmeshError(ValueError):
    """Base class of every rankmesh error.

    Attributes:
        field: the argument or setting at fault, e.g. ``"sizes[1]"`` or ``"rank_map"``.
        value: the offending value itself (an int, a tuple of sizes, a name, ...), as the caller
            passed it or as rankmesh derived it; ``None`` when the fault is an absence (e.g. no
            default process group).
        kind: a stable slug for the fault (the class's, e.g. ``"invalid_size"``, unless the
            raise site names a finer one); match on it rather than on the message.
        ctx: the values the fault involves, by name (may be empty).
        fix: how to fix it, in argument names, with ``{name}`` and ``{name=value}`` placeholders
            (None when the message says it all); see :meth:`fix_text`.
    """

    #: The class's slug: its name in snake case without "Error" (set for every subclass).
    kind: str = "rankmesh"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Error")).lower()

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        value: Any = None,
        kind: str | None = None,
        ctx: Mapping[str, Any] | None = None,
        fix: str | None = None,
    ) -> None:
        self.template = message
        message = render(message)
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = value
        if kind is not None:
            self.kind = kind
        self.ctx = dict(ctx or {})
        self.fix = fix

    def __str__(self) -> str:
        return self.message

    def render(self, name_of: Callable[[str, str | None], str | None] | None = None) -> str:
        """The message with the arguments it names (:func:`arg`) as ``name_of(name, value)`` gives
        them (a command-line flag, or None for the argument's own name); ``str(e)`` without it."""
        return render(self.template, name_of)

    def fix_text(self, name_of: Callable[[str], str | None] | None = None) -> str | None:
        """:attr:`fix` with its placeholders filled: ``{name}`` becomes ``name_of(name)`` and
        ``{name=value}`` becomes ``name_of(name) value`` (a command-line flag and its value), or,
        without ``name_of`` (or where it returns None), the argument name and ``name=value``."""
        if self.fix is None:
            return None

        def fill(m: re.Match) -> str:
            name, value = m.group(1), m.group(2)
            flag = name_of(name) if name_of is not None else None
            if flag is None:
                return name if value is None else f"{name}={value}"
            return flag if value is None else f"{flag} {value}"

        return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)(?:=([^{}]*))?\}", fill, self.fix)

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field, "value": self.value}
        if self.kind != type(self).kind:
            out["kind"] = self.kind
        if self.ctx:
            out["ctx"] = self.ctx
        if self.fix is not None:
            out["fix"] = self.fix
        return out

    def __reduce__(self):  # keep field/value through pickling (e.g. across processes)
        fields = self._fields()
        try:
            pickle.dumps(fields["value"])
        except Exception:  # e.g. a ProcessGroup: the copy carries its repr instead
            fields = {**fields, "value": repr(fields["value"])}
        return (_rebuild, (type(self), self.template, fields))


def _rebuild(cls: type[RankmeshError], message: str, fields: dict[str, Any]) -> RankmeshError:
    """Unpickles an error: its fields are keyword-only, which ``BaseException.__reduce__`` cannot
    pass."""
    return cls(message, **fields)


class InvalidSizeError(RankmeshError):
    """A size (world size, dim size, degree) is zero or negative."""


class SizeMismatchError(RankmeshError, RuntimeError):
    """Sizes do not multiply to what they must (unflatten sizes vs the dim, degrees vs the world,
    a mesh shape vs the world), or a different number of sizes and names. Also a
    ``RuntimeError``: torch's ``init_device_mesh`` and ``_unflatten`` raise one for the latter."""


class LayoutOverflowError(RankmeshError, OverflowError):
    """A size or product does not fit: ranks are int32, products are checked in 64 bits."""


class UnknownNameError(RankmeshError, KeyError):
    """A dimension name that the mesh does not have, or (kind ``"unknown_patch"``) a name that is
    no patch of :data:`rankmesh.patches.REGISTRY`."""

    __str__ = RankmeshError.__str__


class DuplicateNameError(RankmeshError, RuntimeError):
    """The same dimension name twice, or a flatten name that is already taken. Also a
    ``RuntimeError``, which torch's ``init_device_mesh`` raises for repeated names."""


class InvalidNameError(RankmeshError):
    """A dimension name that cannot be used (e.g. empty)."""


class SliceOrderError(RankmeshError, KeyError):
    """Names sliced out of mesh order (torch requires ascending mesh order). Also a ``KeyError``,
    which is what ``DeviceMesh.__getitem__`` raises."""

    __str__ = RankmeshError.__str__


class EmptySliceError(RankmeshError):
    """A slice that names no dimension."""


class RankOutOfRangeError(RankmeshError, IndexError):
    """A rank outside ``range(world_size)``, or (kind ``"rank_not_in_mesh"``) a rank outside a mesh
    over part of the job asking it for one of its process groups."""


class DimOutOfRangeError(RankmeshError, IndexError):
    """A dimension index outside ``range(ndim)``."""


class InvalidRankMapError(RankmeshError):
    """A rank map that is not a permutation of ``range(world_size)``."""


class IncompatibleLayoutError(RankmeshError):
    """An operation the layout's strides cannot express (e.g. an uneven unflatten of a
    dim flattened from non-adjacent dims)."""


class InvalidLayoutError(RankmeshError):
    """Raw modes (e.g. from a corrupted pickle) that do not tile the world."""


class MeshArgumentError(RankmeshError, RuntimeError):
    """An argument of :func:`rankmesh.init_device_mesh` or a mesh derivation that torch rejects
    with a ``RuntimeError`` (a device type with an index, a ``backend_override`` key that names
    no dim, a mesh without dim names to flatten or unflatten) or that it cannot use (a backend
    name torch.distributed does not know). Also a ``RuntimeError``. An
    argument of the wrong type (a float size, a name that is not a str) is an
    :class:`ArgumentTypeError` instead (see :mod:`rankmesh._check`)."""


class ArgumentTypeError(RankmeshError, TypeError):
    """An argument of the wrong type: a float, bool or string where an integer (a size, degree,
    rank or count) is needed, or an object that is not what the argument must be (e.g. a world
    that is not a :class:`~rankmesh.MeshLayout`). Also a ``TypeError``, which is what torch raises
    for a float size. See :mod:`rankmesh._check` for the one rule rankmesh applies."""


class InternalError(RankmeshError):
    """A bug in rankmesh (a Rust panic caught at the FFI boundary). Please report it."""


class ParallelConfigError(RankmeshError, RuntimeError):
    """Parallel degrees or conventions that do not fit together: ep and cp both > 1 in one
    Megatron ``RankGenerator``, an order string that leaves out a dim of size > 1, expert and
    dense pipeline groups that differ, cp in the single-mesh convention (degrees that do not
    multiply to the world are a :class:`SizeMismatchError` in every convention). Also a
    :class:`RuntimeError`, which Megatron-core raises in the same situations, so code written
    against it keeps catching them."""


class TopologyError(RankmeshError):
    """A layout that does not fit the hardware: in strict mode, a bandwidth-hungry dim (tp always;
    ep and cp when asked) whose groups span nodes; a host list that cannot describe the nodes
    (hosts with different numbers of ranks); a world that is not a whole number of nodes."""


class DistributedStateError(RankmeshError, RuntimeError):
    """torch.distributed is not in the state a mesh needs: no default process group, a default
    group whose world size differs from the layout's, or a layout from another world."""


class ConfigMismatchError(RankmeshError, RuntimeError):
    """Ranks disagree on the parallel configuration (their fingerprints differ), found by
    :func:`rankmesh.check_consistency` before any process group is created.

    Attributes (besides ``field``/``value``): ``fingerprint`` (this rank's), ``min_fingerprint``
    and ``max_fingerprint`` (the extremes over all ranks; ``None`` when unknown, e.g. after a
    timeout).
    """

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        value: Any = None,
        fingerprint: int | None = None,
        min_fingerprint: int | None = None,
        max_fingerprint: int | None = None,
        **more: Any,
    ) -> None:
        super().__init__(message, field=field, value=value, **more)
        self.fingerprint = fingerprint
        self.min_fingerprint = min_fingerprint
        self.max_fingerprint = max_fingerprint

    def _fields(self) -> dict[str, Any]:
        extremes = {"min_fingerprint": self.min_fingerprint, "max_fingerprint": self.max_fingerprint}
        return {**super()._fields(), "fingerprint": self.fingerprint, **extremes}


class ConsistencyTimeoutError(ConfigMismatchError, TimeoutError):
    """Not every rank reached the consistency check in time: a rank crashed, is stuck, or runs a
    different code path (e.g. failed validation of its own, different, configuration)."""


class InvalidTimeoutError(RankmeshError):
    """A timeout that is not a usable duration: zero, negative, below c10d's 1 ms resolution,
    NaN, infinite or beyond ``datetime.timedelta.max`` (``value`` is the timeout as given). A
    timeout of the wrong type (a string, a bool) is an :class:`ArgumentTypeError`."""


class ParallelDimsError(RankmeshError, AssertionError):
    """Invalid parallelism degrees for :class:`rankmesh.ParallelDims`. Also an
    ``AssertionError`` (and a ``ValueError``), which is what torchtitan's ``ParallelDims`` raises."""


class ParallelDimsSizeMismatchError(SizeMismatchError, ParallelDimsError):
    """torchtitan's parallelism degrees do not fit ``world_size``.

    The decision, for every convention: degrees that do not fit the world raise
    :class:`~rankmesh.errors.SizeMismatchError`, the layout core's class for "sizes do not multiply to
    what they must", with ``field`` naming the world-size argument (``"world_size"``) and
    ``value`` the world size itself (for ``dp_shard=-1`` that leaves no rank: ``"dp_shard"``,
    ``-1``). Megatron's :func:`~rankmesh.model_parallel_layout` and the single mesh raise
    SizeMismatchError itself, already the ``RuntimeError`` megatron-core raises. torchtitan's
    ``ParallelDims`` asserts instead, so :class:`~rankmesh.ParallelDims` raises this subclass,
    which is also a :class:`~rankmesh.errors.ParallelDimsError` and so an ``AssertionError``
    (and, like every rankmesh error, a ``ValueError``). Catch ``SizeMismatchError`` for any
    convention; code written against torchtitan keeps catching ``AssertionError``.
    """


class ParallelDimsOverflowError(LayoutOverflowError, ParallelDimsError):
    """torchtitan's parallelism degrees (or ``world_size``) need more ranks than a world holds
    (:data:`~rankmesh.MAX_WORLD_SIZE`, ranks are int32). As in every convention, ``field`` names the
    degree that overflows the running product of the degrees in argument order (``tp`` for
    ``tp=2**64``), ``value`` is that degree. A :class:`~rankmesh.errors.LayoutOverflowError`, and, like
    every error of :class:`rankmesh.ParallelDims`, a :class:`~rankmesh.errors.ParallelDimsError`
    (an ``AssertionError``, which torchtitan raises for degrees that do not fit the world)."""


class MegatronConfigError(ParallelConfigError, AssertionError):
    """A Megatron configuration that megatron-core rejects with an ``assert`` (an order that does
    not end with pp while the dense and expert dp sizes differ, dense and expert pipeline groups
    that differ, a dp size not divisible by ``num_distributed_optimizer_instances``, hierarchical
    cp sizes that do not multiply to cp, ep and cp both > 1 in one ``RankGenerator``, an unknown
    ``sharp_enabled_group`` or pipeline backend). Also an ``AssertionError``, so code written
    against megatron-core keeps catching it."""


class MegatronStateError(DistributedStateError, AssertionError):
    """megatron-core's ``parallel_state`` is not in the state the call needs: torch.distributed
    is not initialised, or model parallelism already is (call ``destroy_model_parallel()``
    first). Also an ``AssertionError``, which megatron-core raises in the same situations."""


class UnsupportedVersionError(RankmeshError, RuntimeError):
    """An installed framework version that rankmesh has not been proved against (``field`` is
    the package, ``value`` its version); the message names the supported range. rankmesh's policy
    for such a version is to warn once and run the framework's stock code
    (:mod:`rankmesh._dependencies`); this is raised only where no stock code is left to run
    (``parallel_state.initialize_model_parallel`` replaced by rankmesh's, on an unread megatron-core)."""


class GroupExistsError(RankmeshError, KeyError):
    """A process group that was already created (``HyperCommGrid.create_pg`` twice for the same
    dims). Also a ``KeyError``, which megatron-core's ``HyperCommGrid`` raises."""

    __str__ = RankmeshError.__str__


class GroupNotCreatedError(RankmeshError, KeyError):
    """A process group asked for before it was created (``HyperCommGrid.get_pg`` before
    ``create_pg``). Also a ``KeyError``, which megatron-core's ``HyperCommGrid`` raises."""

    __str__ = RankmeshError.__str__


class ReformError(RankmeshError):
    """A change to the job that :mod:`rankmesh.recovery` cannot re-form the meshes over: a failed
    rank outside the job, a spare map that is no permutation of the right size, more failures
    than spares, a shrink that leaves no replica or breaks a divisibility rule. Raised before
    any group is created; ``field`` names the argument, and the message the fix."""
