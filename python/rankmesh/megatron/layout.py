"""Megatron-core's rank conventions as layouts: ``RankGenerator``, ``ModelParallelLayout`` and the
table of every group ``initialize_model_parallel`` creates (torch-free). How an order string such
as ``"tp-cp-ep-dp-pp"`` maps to a mesh, with a worked example, is in :mod:`rankmesh.megatron`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from rankmesh._check import as_int, check_degrees, check_str, degree_fix, positive_int
from rankmesh._native import MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DuplicateNameError,
    EmptySliceError,
    IncompatibleLayoutError,
    InvalidNameError,
    InvalidSizeError,
    MegatronConfigError,
    ParallelConfigError,
    RankmeshError,
    RankOutOfRangeError,
    SizeMismatchError,
    SliceOrderError,
    UnknownNameError,
)

__all__ = [
    "MEGATRON_DIMS",
    "DEFAULT_ORDER",
    "RankGenerator",
    "ModelParallelLayout",
    "GROUP_DESCRIPTIONS",
    "model_parallel_layout",
    "default_embedding_ranks",
    "default_position_embedding_ranks",
    "working_order",
    "order_problem",
]

#: The dim names a Megatron ``RankGenerator`` knows, in its own ``name_to_size`` order.
MEGATRON_DIMS: tuple[str, ...] = ("tp", "pp", "dp", "ep", "cp")
#: ``initialize_model_parallel``'s default order.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
# The fixes (RankmeshError.fix templates) of a bad order and of a world the degrees do not divide.
ORDER_FIX = "name every dim of size > 1 once in {order}, joined by '-' with pp last"
_WORLD_FIX = "make {world_size} a multiple of tp*pp*cp and of etp*ep*pp, or change the degrees"

# -- which order works: one check, read by the calls themselves, every order hint and the CLI ----


def _order_candidates(names: Sequence[str], missing: Sequence[str] = ()) -> list[str]:
    """Orders to try for ``names`` (valid, distinct) lacking ``missing``: the missing names put in
    before pp (pp stays last), then the same with pp moved last, then the default order."""
    base = list(names)
    at = base.index("pp") if "pp" in base else len(base)
    base[at:at] = [n for n in missing if n != "pp"]
    if "pp" in missing:
        base.append("pp")
    pp_last = [n for n in base if n != "pp"] + (["pp"] if "pp" in base else [])
    return ["-".join(base), "-".join(pp_last), DEFAULT_ORDER]


class _Fault(NamedTuple):
    """The first rule a call breaks, found without raising: ``rule`` (which check), ``reason``
    (:func:`order_problem`'s words) and what the call's error names: ``name`` (the order's bad
    name, or the dim it leaves out), ``size`` (that dim's size), ``missing`` (every dim left out),
    or ``error`` where a shared check of :mod:`rankmesh._check` made it."""

    rule: str
    reason: str
    name: str = ""
    size: int = 0
    missing: tuple[str, ...] = ()
    error: RankmeshError | None = None


def _names_fault(text: object, field: str, unique: bool = False) -> tuple[list[str], _Fault | None]:
    """``text``'s names (``"tp-dp"`` -> ``["tp", "dp"]``, lower-cased) and the first rule they
    break, or None: not a str (or not valid text), an empty or unknown name, with ``unique`` a name
    twice. Never raises; :func:`_names_error` is the error of each."""
    if not isinstance(text, str):
        return [], _Fault("not_str", f"the {field} must be a str like 'tp-dp', not {type(text).__name__}")
    try:
        check_str(text, field)
    except ArgumentTypeError as e:
        return [], _Fault("not_text", f"the {field} is not valid UTF-8 text", error=e)
    names = text.lower().split("-")
    for n in names:
        if not n:
            return [], _Fault("empty_name", f"the {field} {text!r} has an empty name")
        if n not in MEGATRON_DIMS:
            known = ", ".join(MEGATRON_DIMS)
            return [], _Fault("unknown_name", f"the {field} {text!r} names {n!r}, which is not one of {known}", n)
    if unique and len(set(names)) < len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        return [], _Fault("duplicate_name", f"the {field} {text!r} names {twice!r} twice", twice)
    return names, None


def _names_error(fault: _Fault, text: Any, field: str) -> RankmeshError:
    """The error of names ``text`` (of argument ``field``) that break ``fault``'s rule."""
    fix, n = ORDER_FIX if field == "order" else None, fault.name
    if fault.error is not None:  # made by check_str
        return fault.error
    if fault.rule == "not_str":
        return ArgumentTypeError(
            f"{field} must be a str like 'tp-dp', got {type(text).__name__} {text!r}", field=field, value=text
        )
    if fault.rule == "empty_name":
        return InvalidNameError(
            f"{field} {text!r} has an empty name; write names joined by single '-', e.g. 'tp-cp-ep-dp-pp'",
            field=field,
            value=text,
            fix=fix,
        )
    if fault.rule == "unknown_name":
        return UnknownNameError(
            f"{field} {text!r} names {n!r}, which is not one of {', '.join(MEGATRON_DIMS)}",
            field=field,
            value=n,
            fix=fix,
        )
    return DuplicateNameError(f"{field} {text!r} names {n!r} twice", field=field, value=n, fix=fix)


def _split_names(text: str, field: str) -> list[str]:
    """``"tp-dp"`` -> ``["tp", "dp"]``, lower-cased, each name known, no empty piece."""
    names, fault = _names_fault(text, field)
    if fault is not None:
        raise _names_error(fault, text, field)
    return names


def _missing_fault(names: Sequence[str], where: str, sizes: dict[str, int]) -> _Fault | None:
    """The first dim of size > 1 of a generator of ``sizes`` (``where``: which) ``names`` leave out."""
    missing = [n for n in MEGATRON_DIMS if n not in names and sizes[n] != 1]
    if not missing:
        return None
    n = missing[0]
    return _Fault("missing_dim", f"the order does not name {n} (size {sizes[n]}{where})", n, sizes[n], tuple(missing))


def _pp_layout(world_size: int, names: Sequence[str], sizes: dict[str, int]) -> MeshLayout:
    """The pipeline dim of a generator of ``sizes`` and order ``names`` (as its ``layout("pp")``,
    over the identity world: a rank map changes no partition's equality)."""
    full = list(names) + [n for n in MEGATRON_DIMS if n not in names]
    mesh_names = full[::-1]
    return MeshLayout.world(world_size).unflatten(0, [sizes[n] for n in mesh_names], mesh_names)["pp"]


class _OrderCheck:
    """The checks of one call, in the order it makes them: with ``dp``, ``RankGenerator(tp, ep, dp,
    pp, cp, order, rank_offset, world=world)``; with ``world_size``, ``model_parallel_layout(world_size,
    tp, pp, cp, ep, etp, order, n_do, hcp, vpp, world=world)``. The degrees are ints >= 1 (each call
    reads its own); what does not depend on the order is checked here, once. :meth:`fault` says
    which rule an order breaks, without raising; :meth:`checked_names` raises the call's error for it."""

    def __init__(
        self, tp: int, pp: int, cp: int, ep: int, world: object, *, dp: int | None = None, world_size: int = 0,
        etp: int = 1, n_do: int = 1, hcp: Sequence[int] | None = None, vpp: int | None = None, rank_offset: Any = 0,
    ) -> None:  # fmt: skip
        self.tp, self.pp, self.cp, self.ep, self.etp, self.n_do, self.world = tp, pp, cp, ep, etp, n_do, world
        self.world_size, self.vpp, self.hcp = world_size, vpp, hcp
        #: What is wrong whatever the order: found before the order is read (``before``) or after
        #: every check of it (``after``); None where nothing is.
        self.before: _Fault | None = None
        self.after: _Fault | None = None
        #: The generators an order must suit: (where, sizes), the dense one first.
        self.generators: list[tuple[str, dict[str, int]]] = []
        if dp is not None:  # one RankGenerator
            self.generators = [("", {"tp": tp, "ep": ep, "dp": dp, "pp": pp, "cp": cp})]
            if ep > 1 and cp > 1:
                self.before = _Fault("ep_and_cp", f"ep ({ep}) and cp ({cp}) cannot both be > 1 in one RankGenerator")
                return
            self.rank_offset = as_int(rank_offset, "rank_offset")
            if self.rank_offset < 0:
                self.before = _Fault("rank_offset", f"rank_offset ({self.rank_offset}) is < 0")
                return
            # the degree whose product overflows is named (tp=2**64 blames tp), then rank_offset
            self.world_size = check_degrees(self.generators[0][1].items(), rank_offset=self.rank_offset)
            return
        w, model, expert_model = world_size, tp * pp * cp, etp * ep * pp
        if w % model:
            self.before = _Fault("dense_world", f"world_size ({w}) is not divisible by tp*pp*cp = {model}")
            return
        self.dp = w // model
        if vpp is not None:
            positive_int(vpp, "virtual_pipeline_model_parallel_size")
        if vpp is not None and not pp > 1:
            self.before = _Fault("vpp", "virtual_pipeline_model_parallel_size needs pp > 1")
            return
        self.generators = [(" in the dense generator", {"tp": tp, "ep": 1, "dp": self.dp, "pp": pp, "cp": cp})]
        if w % expert_model:
            self.after = _Fault(
                "expert_world", f"world_size ({w}) is not divisible by expert_tp*ep*pp = {expert_model}"
            )
            return
        self.edp = w // expert_model
        self.generators.append((" in the expert generator", {"tp": etp, "ep": ep, "dp": self.edp, "pp": pp, "cp": 1}))
        if (self.dp * cp) % n_do or self.edp % n_do:
            what = "dp*cp" if (self.dp * cp) % n_do else "the expert dp"
            self.after = _Fault("n_do", f"num_distributed_optimizer_instances ({n_do}) does not divide {what}")
        elif hcp:  # as model_parallel_layout reads them
            try:
                self.hs = [positive_int(s, f"hierarchical_context_parallel_sizes[{i}]") for i, s in enumerate(hcp)]
            except RankmeshError as e:  # the call's own error: kept, without this frame, for checked_names
                why = f"hierarchical_context_parallel_sizes {hcp} are not all ints >= 1"
                self.after = _Fault("hcp", why, error=e.with_traceback(None))
            if not self.after and int(np.prod(self.hs)) != cp:
                self.after = _Fault("hcp", f"hierarchical_context_parallel_sizes {hcp} do not multiply to cp ({cp})")

    def fault(self, order: object) -> tuple[list[str], _Fault | None]:
        """``order``'s names and the first rule the call breaks with it (None: it builds), in the
        call's order. Never raises."""
        if self.before is not None:
            return [], self.before
        names, fault = _names_fault(order, "order", unique=True)
        if fault is None:
            fault = _missing_fault(names, *self.generators[0]) or self._world_fault()
        if fault is None and len(self.generators) > 1:  # the expert generator of model_parallel_layout
            fault = _missing_fault(names, *self.generators[1])
            if fault is None and self.pp > 1 and names[-1] != "pp":
                (_, dense), (_, expert) = self.generators
                why = "the order does not end with pp and the dense"
                if self.dp != self.edp:
                    fault = _Fault("pp_dp", f"{why} ({self.dp}) and expert ({self.edp}) dp differ")
                elif not _same_partition(*(_pp_layout(self.world_size, names, s) for s in (dense, expert))):
                    fault = _Fault("pp_groups", f"{why} and expert pipeline groups differ")
        return names, fault or self.after

    def _world_fault(self) -> _Fault | None:
        world, w = self.world, self.world_size
        if world is None or (isinstance(world, MeshLayout) and world.ndim == 1 and world.world_size == w):
            return None
        return _Fault("world", f"world is not a 1-D MeshLayout of {w} ranks")

    def works(self, candidates: Iterable[Any]) -> str | None:
        """The first of ``candidates`` with which the call builds, or None."""
        return next((c for c in candidates if self.fault(c)[1] is None), None)

    def checked_names(self, order: str) -> list[str]:
        """``order``'s names, where the call builds with it; else the call's error, raised."""
        names, fault = self.fault(order)
        if fault is None:
            return names
        rule, w, world = fault.rule, self.world_size, self.world
        if fault.error is not None:  # made by a check of rankmesh._check
            raise fault.error
        if rule in ("not_str", "empty_name", "unknown_name", "duplicate_name"):
            raise _names_error(fault, order, "order")
        if rule == "missing_dim":
            fix, missing = self.works(_order_candidates(names, fault.missing)), ", ".join(map(repr, fault.missing))
            hint = f"add {missing} to the order, e.g. {fix!r}"
            if fix is None:
                hint = f"no order naming {missing} works with these degrees; change them"
            raise ParallelConfigError(
                f"the size of {fault.name} is {fault.size}, but the order {order!r} does not name it; {hint}",
                field="order",
                value=order,
                kind="order_misses_dim",
                ctx={"dim": fault.name, "size": fault.size, "works": fix},
                fix=ORDER_FIX,
            )
        if rule in ("pp_dp", "pp_groups"):
            fix = self.works(_order_candidates(names))
            if rule == "pp_dp":
                text = (
                    f"when the order ({order!r}) does not end with pp, the data-parallel sizes of the attention "
                    f"({self.dp}) and MoE ({self.edp}) layers must be the same; "
                    + _pp_last_hint(fix, "make expert_tp*ep equal tp*cp")
                )
            else:
                world = MeshLayout.world(w) if world is None else world
                pps = [RankGenerator(**s, order=order, world=world).layout("pp") for _, s in self.generators]
                step = [",".join(str(d) for _, d in g.partition_key(0)) for g in pps]
                text = (
                    "pipeline parallel groups are expected to be the same for the non-expert and expert parts; "
                    f"with order {order!r} the dense pp groups step by {step[0]} ranks and the expert ones "
                    f"by {step[1]}; " + _pp_last_hint(fix, "change the degrees")
                )
            raise MegatronConfigError(
                text, field="order", value=order, kind="order_pp_not_last", ctx={"works": fix}, fix=ORDER_FIX
            )
        if rule == "world" and not isinstance(world, MeshLayout):
            raise ArgumentTypeError(
                f"world must be a 1-D MeshLayout, got {type(world).__name__}; pass "
                f"MeshLayout.world({w}, rank_map=...) or leave it out",
                field="world",
                value=world,
            )
        if rule == "world":  # the degrees do not multiply to the world: rankmesh's one class for that fault
            raise SizeMismatchError(
                f"world must be a 1-D MeshLayout of tp*ep*dp*pp*cp = {w} ranks, got shape {world.shape} over "
                f"{world.world_size} ranks; change the degrees or pass MeshLayout.world({w}, ...)",
                field="world",
                value=world,
            )
        raise self._degrees_error(fault)

    def _degrees_error(self, fault: _Fault) -> RankmeshError:
        """The error of degrees that fit no order (``fault``, of :attr:`before` or :attr:`after`)."""
        tp, pp, cp, ep, etp, w, n_do = self.tp, self.pp, self.cp, self.ep, self.etp, self.world_size, self.n_do
        if fault.rule == "ep_and_cp":
            return MegatronConfigError(
                f"ep ({ep}) and cp ({cp}) cannot both be > 1 in one RankGenerator: Megatron keeps cp in the "
                "dense generator (ep=1) and ep in the expert one (cp=1); use model_parallel_layout() to build both",
                field="ep",
                value=ep,
            )
        if fault.rule == "rank_offset":
            return InvalidSizeError(
                f"rank_offset must be >= 0, got {self.rank_offset} (megatron-core silently ignores "
                "a negative offset; rankmesh refuses it)",
                field="rank_offset",
                value=self.rank_offset,
            )
        if fault.rule in ("dense_world", "expert_world"):  # SizeMismatchError, a RuntimeError like megatron-core's
            dense = fault.rule == "dense_world"
            what, factors = ("tp*pp*cp", (tp, pp, cp)) if dense else ("expert_tp*ep*pp", (etp, ep, pp))
            div = int(np.prod(factors))
            return SizeMismatchError(
                f"world_size ({w}) is not divisible by {what} = {'*'.join(map(str, factors))} = {div}; use a world "
                f"that is a multiple of {div} or smaller {'degrees' if dense else 'expert degrees'}",
                field="world_size",
                value=w,
                kind="world_not_divisible",
                ctx={"world_size": w, "divisor": div},
                fix=_WORLD_FIX,
            )
        if fault.rule == "vpp":
            return ParallelConfigError(
                "pipeline-model-parallel size should be greater than 1 with interleaved schedule "
                "(virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1)",
                field="virtual_pipeline_model_parallel_size",
                value=self.vpp,
            )
        if fault.rule == "n_do":
            what = f"expert data parallel size ({self.edp})"
            if (self.dp * cp) % n_do:
                what = f"data parallel size with cp ({self.dp}*{cp})"
            return MegatronConfigError(
                f"{what} should be divisible by the partial DistOpt shard factor "
                f"num_distributed_optimizer_instances ({n_do})",
                field="num_distributed_optimizer_instances",
                value=n_do,
            )
        hs = self.hs
        return MegatronConfigError(
            f"hierarchical_context_parallel_sizes {hs} multiply to {int(np.prod(hs))}, not cp ({cp})",
            field="hierarchical_context_parallel_sizes",
            value=hs,
        )


def _call_check(
    world_size: Any, tp: Any, pp: Any, cp: Any, ep: Any, etp: Any, dp: Any, n_do: Any, hcp: Any, world: Any
) -> _OrderCheck:
    """The :class:`_OrderCheck` of the call :func:`order_problem`'s arguments describe; degrees that
    are not ints >= 1 raise as that call would."""
    if (world_size is None) == (dp is None):
        raise ArgumentTypeError(
            "pass world_size (the degrees of model_parallel_layout) or dp (those of one RankGenerator), "
            f"not {'both' if dp is not None else 'neither'}",
            field="dp" if dp is not None else "world_size",
            value=dp if dp is not None else world_size,
        )
    given = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": tp if etp is None else etp}
    deg = {k: positive_int(v, k, fix=degree_fix(k)) for k, v in given.items()}
    tp, pp, cp, ep, etp = (deg[k] for k in ("tp", "pp", "cp", "ep", "etp"))
    if dp is not None:  # one RankGenerator
        return _OrderCheck(tp, pp, cp, ep, world, dp=positive_int(dp, "dp"))
    world_size = check_degrees([("world_size", positive_int(world_size, "world_size"))])
    n_do = positive_int(n_do, "num_distributed_optimizer_instances")
    return _OrderCheck(tp, pp, cp, ep, world, world_size=world_size, etp=etp, n_do=n_do, hcp=hcp)


def order_problem(
    order: object,
    world_size: int | None = None,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    *,
    dp: int | None = None,
    num_distributed_optimizer_instances: int = 1,
    hierarchical_context_parallel_sizes: Sequence[int] | None = None,
    world: MeshLayout | None = None,
) -> str | None:
    """Why ``order`` does not work for these degrees, or None when it does; never raises for valid
    degrees (an order of any type is fine). With ``world_size``: None exactly when
    ``model_parallel_layout(world_size, tp, pp, cp, ep, etp, order, ...)`` builds (every dim of
    size > 1 of the dense and the expert generator named, pp last unless pp == 1 or the dense and
    expert dp sizes match, the same dense and expert pipeline groups; degrees that fit no order, such
    as a world the expert degrees do not divide, are a problem of every order). With ``dp`` instead:
    None exactly when ``RankGenerator(tp, ep, dp, pp, cp, order, world=world)`` builds. ``etp``,
    ``num_distributed_optimizer_instances`` and ``hierarchical_context_parallel_sizes`` are
    :func:`model_parallel_layout`'s. Degrees that are not ints >= 1 raise as the call itself would.

        >>> order_problem("tp-cp-ep-dp-pp", 16, tp=2, pp=2, ep=4) is None
        True
        >>> order_problem("tp-dp-pp", 16, tp=2, pp=2, ep=4)
        'the order does not name ep (size 4 in the expert generator)'
        >>> order_problem("tp-pp-ep-dp", 32, tp=2, pp=4, ep=2, etp=1)
        'the order does not end with pp and the dense and expert pipeline groups differ'
        >>> order_problem("tp-dp", tp=2, dp=2, pp=2)  # one RankGenerator
        'the order does not name pp (size 2)'
    """
    check = _call_check(
        world_size, tp, pp, cp, ep, etp, dp, num_distributed_optimizer_instances, hierarchical_context_parallel_sizes,
        world,
    )  # fmt: skip
    fault = check.fault(order)[1]
    return None if fault is None else fault.reason


def working_order(
    candidates: Iterable[Any],
    world_size: int | None = None,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    *,
    dp: int | None = None,
    num_distributed_optimizer_instances: int = 1,
    hierarchical_context_parallel_sizes: Sequence[int] | None = None,
    world: MeshLayout | None = None,
) -> str | None:
    """The first of ``candidates`` (order strings) that works for these degrees (:func:`order_problem`
    says none is wrong with it), or None when none does: the only order a hint of rankmesh's
    suggests (``RankGenerator``'s and ``model_parallel_layout``'s order errors carry it in
    ``e.ctx["works"]``, and ``rankmesh plan`` prints it). Pure: it builds no generator, holds no
    state and never raises for valid degrees, whatever the candidates.

        >>> working_order(["tp-pp-dp", "tp-ep-pp-dp"], 16, tp=2, pp=2, ep=2, etp=1)  # ep 2 must be named
        'tp-ep-pp-dp'
        >>> working_order(["tp-pp-ep-dp", "tp-ep-dp-pp"], 16, tp=2, pp=2, ep=4)  # dp 4, expert dp 1: pp last
        'tp-ep-dp-pp'
        >>> working_order(["tp-cp-ep-dp-pp"], 16, tp=2, pp=2, ep=3) is None  # 2*3*2 does not divide 16
        True
    """
    check = _call_check(
        world_size, tp, pp, cp, ep, etp, dp, num_distributed_optimizer_instances, hierarchical_context_parallel_sizes,
        world,
    )  # fmt: skip
    return check.works(candidates)


def _rank_arg(rank: Any, method: str, what: str) -> Any:
    """``rank`` as given, unless it is a str: then the caller wrote the arguments in the old
    ``(name, rank)`` order, which rankmesh's methods no longer take."""
    if isinstance(rank, str):
        raise ArgumentTypeError(
            f"{method}(rank, {what}) takes the rank first, got the str {rank!r} as the rank; "
            f"write {method.rsplit('.', 1)[-1]}(rank, {rank!r})",
            field="rank",
            value=rank,
        )
    return rank


def default_embedding_ranks(pp_ranks: Sequence[int]) -> list[int]:
    """Megatron's default: word embeddings live on the first and last pipeline stages."""
    pp_ranks = list(pp_ranks)
    return [pp_ranks[0]] if len(pp_ranks) == 1 else [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks(pp_ranks: Sequence[int]) -> list[int]:
    """Megatron's default: position embeddings live on the first pipeline stage."""
    return [list(pp_ranks)[0]]


class RankGenerator:
    """Megatron-core's ``RankGenerator`` (same constructor, same ``get_ranks``), over a MeshLayout.

    Args:
        tp, ep, dp, pp, cp: the degrees; ``ep`` and ``cp`` cannot both be > 1 (Megatron keeps cp
            in the dense generator and ep in the expert one).
        order: names joined by ``-``, leftmost fastest, e.g. ``"tp-cp-ep-dp-pp"``. Names of size
            1 may be left out (they are appended, as Megatron does); case is ignored.
        rank_offset: added to every rank returned (ranks of a generator placed after others).
        world: optional 1-D :class:`MeshLayout` of ``tp*ep*dp*pp*cp`` ranks to build on, e.g. one
            with a topology-aware ``rank_map`` (see :mod:`rankmesh.topology`); identity otherwise.

    Errors (all :class:`~rankmesh.RankmeshError`): a degree < 1 (:class:`InvalidSizeError`) or
    not an int (:class:`~rankmesh.ArgumentTypeError`, a ``TypeError``), a ``world`` whose size is
    not the degrees' product (:class:`~rankmesh.SizeMismatchError`), ep
    and cp both > 1 (:class:`MegatronConfigError`, also an ``AssertionError`` as in Megatron), a
    dim of size > 1 missing from ``order`` (:class:`ParallelConfigError`, also a ``RuntimeError``
    as in Megatron; its message suggests only an order :func:`working_order` finds works, also in
    ``e.ctx["works"]``, None when none does), an unknown name
    (:class:`UnknownNameError`, also a ``KeyError``), a name twice (:class:`DuplicateNameError`), a
    negative ``rank_offset`` (:class:`InvalidSizeError`; Megatron silently ignores it) or ranks past
    int32 (:class:`~rankmesh.LayoutOverflowError`, naming the degree whose running product, in
    argument order, overflows: ``tp`` for ``tp=2**64``; ``rank_offset`` when the degrees fit).

    Example (the order ``tp-dp-pp`` of Megatron's own docstring, 16 ranks)::

        >>> g = RankGenerator(tp=2, ep=1, dp=2, pp=4, cp=1, order="tp-dp-pp")
        >>> g.get_ranks("dp")[:4]
        [[0, 2], [1, 3], [4, 6], [5, 7]]
        >>> g.get_ranks("pp")[0]
        [0, 4, 8, 12]
        >>> g.my_group(9, "tp-dp").tolist()
        [8, 9, 10, 11]
        >>> g.groups("tp").shape
        (8, 2)
    """

    def __init__(
        self,
        tp: int,
        ep: int,
        dp: int,
        pp: int,
        cp: int,
        order: str,
        rank_offset: int = 0,
        *,
        world: MeshLayout | None = None,
    ) -> None:
        sizes = {"tp": tp, "ep": ep, "dp": dp, "pp": pp, "cp": cp}  # argument order
        sizes = {k: positive_int(v, k, fix=degree_fix(k)) for k, v in sizes.items()}
        check = _OrderCheck(world=world, rank_offset=rank_offset, **sizes)
        names = check.checked_names(order)  # every check of the order, the world and rank_offset
        self.tp, self.ep, self.dp, self.pp, self.cp = (sizes[k] for k in ("tp", "ep", "dp", "pp", "cp"))
        self.rank_offset, self.world_size = check.rank_offset, check.world_size
        self.name_to_size = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "cp": self.cp}
        names += [n for n in MEGATRON_DIMS if n not in names]
        #: The full order, lower-cased, with the omitted size-1 names appended (as Megatron).
        self.order = "-".join(names)
        #: Sizes in ``order`` (leftmost fastest), as Megatron's ``ordered_size``.
        self.ordered_size = [self.name_to_size[n] for n in names]
        self._order_names = tuple(names)
        mesh_names = tuple(reversed(names))
        if world is None:
            world = MeshLayout.world(self.world_size)
        self.world = world
        #: The whole mesh: the world unflattened in the reversed order (slowest dim first).
        self.mesh_layout: MeshLayout = world.unflatten(0, [self.name_to_size[n] for n in mesh_names], mesh_names)
        self._pos = {n: i for i, n in enumerate(mesh_names)}
        self._layouts: dict[tuple[str, ...], MeshLayout] = {}

    # -- Megatron's API ---------------------------------------------------------------------
    def get_mask(self, order: str, token: str) -> list[bool]:
        """Megatron's mask: ``mask[i]`` is True when the i-th name of ``order`` is in ``token``."""
        ordered = _split_names(order, "order")
        mask = [False] * len(ordered)
        for t in self._token_names(token):
            if t not in ordered:
                raise UnknownNameError(f"token name {t!r} is not in the order {order!r}", field="token", value=t)
            mask[ordered.index(t)] = True
        return mask

    def get_ranks(self, token: str) -> list[list[int]]:
        """Every group of ``token`` as lists, in Megatron's order (O(world); prefer
        :meth:`my_group` on a rank and :meth:`groups` for arrays)."""
        return self.groups(token).tolist()

    # -- rankmesh's additions ---------------------------------------------------------------
    def _token_names(self, token: str | Iterable[str]) -> tuple[str, ...]:
        """The token's distinct names, as written (``"dp-cp"`` -> ``("dp", "cp")``)."""
        if isinstance(token, str):
            names = _split_names(token, "token")
        else:
            names = [n.lower() if isinstance(n, str) else n for n in token]
            for n in names:
                if not isinstance(n, str):
                    raise ArgumentTypeError(
                        f"token names must be str like 'tp', got {type(n).__name__} {n!r}", field="token", value=n
                    )
                check_str(n, "token")
                if n not in MEGATRON_DIMS:
                    raise UnknownNameError(
                        f"token names {n!r}, not one of {', '.join(MEGATRON_DIMS)}", field="token", value=n
                    )
            if not names:
                raise EmptySliceError("a token must name at least one dim, e.g. 'tp'", field="token", value=token)
        return tuple(dict.fromkeys(names))

    def token_dims(self, token: str | Iterable[str]) -> tuple[str, ...]:
        """The token's names in mesh order (slowest first), e.g. ``"tp-pp"`` -> ``("pp", "tp")``."""
        return tuple(sorted(self._token_names(token), key=self._pos.__getitem__))

    def layout(self, token: str | Iterable[str]) -> MeshLayout:
        """The 1-D layout of ``token``: the flatten of its names' slice, named like ``"dp_cp"``.

        Its ``groups()`` are Megatron's groups for the token (without ``rank_offset``)."""
        key = self._token_names(token)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self.mesh_layout[self.token_dims(key)].flatten("_".join(key))
            self._layouts[key] = lay
        return lay

    def group_size(self, token: str | Iterable[str]) -> int:
        """Ranks in one group of ``token``."""
        return int(np.prod([self.name_to_size[n] for n in self._token_names(token)]))

    def num_groups(self, token: str | Iterable[str]) -> int:
        """Number of groups of ``token`` (rows of :meth:`groups`)."""
        return self.world_size // self.group_size(token)

    def _local(self, rank: Any) -> int:
        r = as_int(rank, "rank")
        local = r - self.rank_offset
        if not 0 <= local < self.world_size:
            lo, hi = self.rank_offset, self.rank_offset + self.world_size
            raise RankOutOfRangeError(f"rank {r} is outside this generator's ranks [{lo}, {hi})", field="rank", value=r)
        return local

    def my_group(self, rank: int, token: str | Iterable[str]) -> np.ndarray:
        """``rank``'s group of ``token`` (int32, Megatron's order, ``rank_offset`` applied), in
        O(group size): the row of :meth:`get_ranks` that holds ``rank``. Arguments in rankmesh's
        order, rank first, as :meth:`MeshLayout.group(rank, dim) <rankmesh.MeshLayout.group>`.

            >>> g = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp-pp")
            >>> g.my_group(5, "tp-pp").tolist(), g.my_group(5, "dp").tolist()
            ([0, 1, 4, 5], [5, 7])
        """
        local = self._local(_rank_arg(rank, "RankGenerator.my_group", "token"))
        g = self.layout(token).group(local, 0)
        return g + np.int32(self.rank_offset) if self.rank_offset else g

    def groups(self, token: str | Iterable[str]) -> np.ndarray:
        """Every group of ``token`` as an int32 array ``(num_groups, group_size)``, Megatron's
        order, ``rank_offset`` applied. O(world)."""
        g = self.layout(token).groups()
        g = g.reshape(g.shape[0], -1)
        return g + np.int32(self.rank_offset) if self.rank_offset else g

    def coordinate_of(self, rank: int) -> dict[str, int]:
        """``rank``'s index in every dim, e.g. ``{"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 1}``."""
        coord = self.mesh_layout.coordinate_of(self._local(rank))
        return {n: int(coord[self._pos[n]]) for n in self._order_names}

    def dims_layout(self, dims: Sequence[str | Iterable[str]], names: Sequence[str] | None = None) -> MeshLayout:
        """A multi-dim layout whose dims are tokens, e.g. ``["pp", "dp-cp", "tp"]``, for a DeviceMesh.

        Tokens must be disjoint and listed slowest first (mesh order), and each token's names must
        be adjacent in the order (size-1 names do not count); a single token may be anything.
        Dims are named ``names`` or ``"dp_cp"``-style joins of the tokens."""
        if isinstance(dims, str):
            dims = [dims]
        keys = [self._token_names(t) for t in dims]
        if not keys:
            raise EmptySliceError(
                "dims must name at least one token, e.g. ['pp', 'dp-cp', 'tp']", field="dims", value=dims
            )
        labels = list(names) if names is not None else ["_".join(k) for k in keys]
        if len(labels) != len(keys):
            raise InvalidNameError(f"{len(labels)} names for {len(keys)} dims", field="names", value=labels)
        for i, label in enumerate(labels):
            check_str(label, f"names[{i}]")
        owner: dict[str, int] = {}
        for i, k in enumerate(keys):
            for n in k:
                if n in owner:
                    raise DuplicateNameError(
                        f"{n!r} is in two dims ({dims[owner[n]]!r} and {dims[i]!r}); put each name in one dim",
                        field="dims",
                        value=n,
                    )
                owner[n] = i
        if len(keys) == 1:  # renamed as unflatten names, so that any name works, as for several dims
            lay = self.layout(keys[0])
            return lay if labels[0] == lay.names[0] else lay.unflatten(0, lay.shape, labels)
        runs: list[tuple[int | None, int, list[str]]] = []  # (dim index, size, names)
        for n in self.mesh_layout.names:
            i = owner.get(n)
            if i is None and self.name_to_size[n] == 1:
                continue  # size-1 names are transparent
            if runs and i is not None and runs[-1][0] == i:
                runs[-1] = (i, runs[-1][1] * self.name_to_size[n], runs[-1][2] + [n])
            else:
                runs.append((i, self.name_to_size[n], [n]))
        seen = [r[0] for r in runs if r[0] is not None]
        for i in range(len(keys)):
            if seen.count(i) != 1:
                raise ParallelConfigError(
                    f"the names of {dims[i]!r} are not adjacent in the order {self.order!r}, so it cannot "
                    "be one dim of a multi-dim mesh; use it alone (dims_layout([token])) or pick tokens "
                    "that are runs of the order",
                    field="dims",
                    value=dims[i],
                )
        run_names = [labels[r[0]] if r[0] is not None else f"_rest{j}" for j, r in enumerate(runs)]
        if seen != sorted(seen):
            # mesh order is the order the tokens' runs appear in; listed so, the same runs are
            # unflattened under the same names, which works when those are non-empty and distinct
            fix_dims, fix_names = [dims[i] for i in seen], [labels[i] for i in seen]
            if not (all(run_names) and len(set(run_names)) == len(run_names)):
                hint = "no order of these dims slices this mesh; build them one at a time"
            elif names is None:
                hint = f"list them as {fix_dims}"
            else:
                hint = f"list them as {fix_dims} with names {fix_names}"
            raise SliceOrderError(
                f"dims {list(dims)} are not in mesh order (slowest first) for order {self.order!r}; {hint}",
                field="dims",
                value=list(dims),
            )
        full = self.world.unflatten(0, [r[1] for r in runs], run_names)
        return full[tuple(labels)]

    def __repr__(self) -> str:
        off = f", rank_offset={self.rank_offset}" if self.rank_offset else ""
        return (
            f"RankGenerator(tp={self.tp}, ep={self.ep}, dp={self.dp}, pp={self.pp}, cp={self.cp}, "
            f"order={self.order!r}{off})"
        )


# -----------------------------------------------------------------------------------------------
# initialize_model_parallel's groups
# -----------------------------------------------------------------------------------------------

#: What each group is, in Megatron's words (its ``group_desc``).
GROUP_DESCRIPTIONS: dict[str, str] = {
    "dp_cp": "DATA_PARALLEL_GROUP_WITH_CP",
    "intra_dp_cp": "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
    "dp": "DATA_PARALLEL_GROUP",
    "cp": "CONTEXT_PARALLEL_GROUP",
    "hcp": "HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L<level>",
    "mp": "MODEL_PARALLEL_GROUP",
    "tp": "TENSOR_MODEL_PARALLEL_GROUP",
    "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
    "embd": "EMBEDDING_GROUP",
    "pos_embd": "POSITION_EMBEDDING_GROUP",
    "tp_dp_cp": "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
    "tp_dp": "TENSOR_AND_DATA_PARALLEL_GROUP",
    "tp_cp": "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
    "ep": "EXPERT_MODEL_PARALLEL_GROUP",
    "ep_tp": "EXPERT_TENSOR_PARALLEL_GROUP",
    "tp_ep_mp": "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
    "tp_ep_pp": "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
    "ep_dp": "EXPERT_DATA_PARALLEL_GROUP",
    "intra_ep_dp": "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0",  # megatron's partial-DistOpt
    "inter_ep_dp": "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1",  # expert dp levels
    "intra_dist_opt_instance": "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
}


def _hierarchical(ranks: np.ndarray, sizes: Sequence[int], level: int, rank: int) -> np.ndarray:
    """Megatron's ``create_hierarchical_groups``: ``rank``'s level-``level`` sub-group of ``ranks``
    (``"(l s u) -> (l u) s"`` with u = prod(sizes[:level]), s = sizes[level])."""
    u = int(np.prod(sizes[:level], dtype=np.int64))
    s = int(sizes[level])
    cube = ranks.reshape(-1, s, u)
    (pos,) = np.nonzero(ranks == rank)
    p = int(pos[0])
    return np.ascontiguousarray(cube[p // (s * u), :, p % u])


class _Group:
    """How an entry of :data:`_GROUPS` gives its group: the names it stands for
    (:meth:`expand`), one rank's group (:meth:`group`), the 1-D layout whose groups partition the
    world like it (:meth:`layout`, None when there is none) and every group (:meth:`all_groups`),
    for one :class:`ModelParallelLayout` ``m``."""

    #: ``(generator, token)`` for a group that is one generator's token, else None.
    token: tuple[str, str] | None = None
    #: False for groups that do not cover the world (the embedding groups): no layout, no
    #: process group through a layout.
    partition: bool = True

    def expand(self, m: ModelParallelLayout, key: str) -> dict[str, _Group]:
        """The group names this entry stands for in ``m``, each with the entry that answers it."""
        return {key: self}

    def group(self, m: ModelParallelLayout, name: str, rank: int) -> np.ndarray | None:
        raise NotImplementedError

    def layout(self, m: ModelParallelLayout, name: str) -> MeshLayout | None:
        return None

    def all_groups(self, m: ModelParallelLayout, name: str) -> np.ndarray | None:
        lay = self.layout(m, name)
        if lay is None:
            return None
        g = lay.groups()
        return g.reshape(g.shape[0], -1)


class _Token(_Group):
    """A token of one generator: Megatron's ``get_ranks(token)`` groups, in its order."""

    def __init__(self, generator: str, token: str) -> None:
        self.token = (generator, token)

    def group(self, m: ModelParallelLayout, name: str, rank: int) -> np.ndarray:
        gen, tok = self.token
        return m.generator(gen).my_group(rank, tok)

    def layout(self, m: ModelParallelLayout, name: str) -> MeshLayout:
        gen, tok = self.token
        return m.generator(gen).layout(tok)

    def all_groups(self, m: ModelParallelLayout, name: str) -> np.ndarray:
        gen, tok = self.token
        return m.generator(gen).groups(tok)


class _Level(_Group):
    """Level ``level`` of a token's groups split in levels by Megatron's
    ``create_hierarchical_groups`` (level sizes from ``sizes(m)``, fastest first); ``when(m)``
    says whether Megatron creates it."""

    def __init__(
        self,
        generator: str,
        token: str,
        sizes: Callable[[ModelParallelLayout], Sequence[int]],
        level: int,
        when: Callable[[ModelParallelLayout], bool] | None = None,
    ) -> None:
        self.generator, self.tok, self.sizes, self.level, self.when = generator, token, sizes, level, when

    def expand(self, m: ModelParallelLayout, key: str) -> dict[str, _Group]:
        return {key: self} if self.when is None or self.when(m) else {}

    def group(self, m: ModelParallelLayout, name: str, rank: int) -> np.ndarray:
        ranks = m.generator(self.generator).my_group(rank, self.tok)
        return _hierarchical(ranks, self.sizes(m), self.level, rank)

    def layout(self, m: ModelParallelLayout, name: str) -> MeshLayout:
        sizes = tuple(self.sizes(m))
        dims = [f"_l{i}" for i in range(len(sizes))]
        dims[self.level] = name
        whole = m.generator(self.generator).layout(self.tok)
        return whole.unflatten(0, sizes[::-1], tuple(dims[::-1]))[name]


class _Levels(_Group):
    """Every level of a token's groups (hierarchical cp): names ``<key>_l0``, ``<key>_l1``, ..."""

    def __init__(self, generator: str, token: str, sizes: Callable[[ModelParallelLayout], Sequence[int]]) -> None:
        self.generator, self.tok, self.sizes = generator, token, sizes

    def expand(self, m: ModelParallelLayout, key: str) -> dict[str, _Group]:
        n = len(self.sizes(m))
        return {f"{key}_l{i}": _Level(self.generator, self.tok, self.sizes, i) for i in range(n)}


class _Embedding(_Group):
    """The word or position embedding group: the ranks ``m.<ranks_fn>`` picks from the caller's
    pipeline group; None on a rank that holds no embedding (Megatron leaves the global None)."""

    partition = False

    def __init__(self, ranks_fn: str, default: Callable[[Sequence[int]], list[int]], max_pp: int) -> None:
        self.ranks_fn = ranks_fn
        self.default = default
        self.max_pp = max_pp

    def is_pp(self, m: ModelParallelLayout) -> bool:
        """Megatron's rule: with the default ranks function and at most ``max_pp`` stages (2 for
        the word embedding: first and last stage; 1 for the position embedding: first stage),
        every pipeline rank holds the embedding, so each rank's group is its pipeline group."""
        return getattr(m, self.ranks_fn) is self.default and m.pp <= self.max_pp

    def group(self, m: ModelParallelLayout, name: str, rank: int) -> np.ndarray | None:
        pp = m.decoder.my_group(rank, "pp")
        members = [int(r) for r in getattr(m, self.ranks_fn)(pp.tolist())]
        return np.asarray(members, dtype=np.int32) if int(rank) in members else None


class _DistOptInstance(_Group):
    """Megatron's ``intra_dist_opt_instance``: ``intra_partial_expert_dp_size`` consecutive expert
    tp-ep-pp groups, concatenated."""

    def group(self, m: ModelParallelLayout, name: str, rank: int) -> np.ndarray:
        edp = m.expert.my_group(rank, "dp")
        size = m.intra_partial_expert_dp_size
        k = int(np.nonzero(edp == rank)[0][0]) // size
        chunk = edp[k * size : (k + 1) * size]
        return np.concatenate([m.expert.my_group(int(r), "tp-ep-pp") for r in chunk]).astype(np.int32)

    def layout(self, m: ModelParallelLayout, name: str) -> MeshLayout:
        n = m.num_distributed_optimizer_instances
        mesh = m.expert.mesh_layout.unflatten("dp", (n, m.intra_partial_expert_dp_size), ("_inter", "_intra"))
        return mesh[tuple(d for d in mesh.names if d != "_inter")].flatten(name)


def _partial_dp(m: ModelParallelLayout) -> tuple[int, int]:
    return (m.intra_partial_dp_size, m.num_distributed_optimizer_instances)


def _partial_expert_dp(m: ModelParallelLayout) -> tuple[int, int]:
    return (m.intra_partial_expert_dp_size, m.num_distributed_optimizer_instances)


def _partial_dist_opt(m: ModelParallelLayout) -> bool:
    return m.num_distributed_optimizer_instances > 1


def _hierarchical_cp(m: ModelParallelLayout) -> tuple[int, ...]:
    return m.hierarchical_context_parallel_sizes or ()


#: Every group ``initialize_model_parallel`` creates, in its creation order, keyed by Megatron's
#: own NCCL-config names: the one table behind :meth:`ModelParallelLayout.group`, ``layout``,
#: ``all_groups``, ``token`` and ``group_names``.
_GROUPS: dict[str, _Group] = {
    "dp_cp": _Token("decoder", "dp-cp"),
    "intra_dp_cp": _Level("decoder", "dp-cp", _partial_dp, 0),
    "dp": _Token("decoder", "dp"),
    "cp": _Token("decoder", "cp"),
    "hcp": _Levels("decoder", "cp", _hierarchical_cp),  # hcp_l0, hcp_l1, ... with hierarchical cp
    "mp": _Token("decoder", "tp-pp"),
    "tp": _Token("decoder", "tp"),
    "pp": _Token("decoder", "pp"),
    "embd": _Embedding("get_embedding_ranks", default_embedding_ranks, max_pp=2),
    "pos_embd": _Embedding("get_position_embedding_ranks", default_position_embedding_ranks, max_pp=1),
    "tp_dp_cp": _Token("decoder", "tp-dp-cp"),
    "tp_dp": _Token("decoder", "tp-dp"),
    "tp_cp": _Token("decoder", "tp-cp"),
    "ep": _Token("expert", "ep"),
    "ep_tp": _Token("expert", "tp"),
    "tp_ep_mp": _Token("expert", "tp-ep"),
    "tp_ep_pp": _Token("expert", "tp-ep-pp"),
    "ep_dp": _Token("expert", "dp"),
    "intra_ep_dp": _Level("expert", "dp", _partial_expert_dp, 0),  # Megatron aliases it to ep_dp when n == 1
    "inter_ep_dp": _Level("expert", "dp", _partial_expert_dp, 1, when=_partial_dist_opt),
    "intra_dist_opt_instance": _DistOptInstance(),
}


class ModelParallelLayout:
    """The dense ("decoder") and expert :class:`RankGenerator` of Megatron's
    ``initialize_model_parallel``, and every group it creates, per rank in O(group size).

    Build it with :func:`model_parallel_layout`. Group names (:attr:`group_names`) are Megatron's
    NCCL-config keys: ``dp_cp``, ``dp``, ``cp``, ``mp`` (tp-pp), ``tp``, ``pp``, ``embd``,
    ``pos_embd``, ``tp_dp_cp``, ``tp_dp``, ``tp_cp``, ``ep``, ``ep_tp`` (expert tp), ``tp_ep_mp``,
    ``tp_ep_pp``, ``ep_dp`` (expert dp), ``intra_dp_cp``, ``intra_ep_dp``, ``inter_ep_dp``,
    ``intra_dist_opt_instance`` and, with hierarchical cp, ``hcp_l0``, ``hcp_l1``, ...

        >>> m = model_parallel_layout(64, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
        ...                           context_parallel_size=2, expert_model_parallel_size=4)
        >>> m.dp, m.expert_dp
        (8, 4)
        >>> for k in ("tp", "cp", "dp", "pp", "ep", "ep_dp", "embd"):
        ...     print(k, m.group(13, k).tolist())
        tp [12, 13]
        cp [13, 15]
        dp [1, 5, 9, 13, 17, 21, 25, 29]
        pp [13, 45]
        ep [9, 11, 13, 15]
        ep_dp [5, 13, 21, 29]
        embd [13, 45]
    """

    def __init__(
        self,
        decoder: RankGenerator,
        expert: RankGenerator,
        *,
        num_distributed_optimizer_instances: int = 1,
        hierarchical_context_parallel_sizes: Sequence[int] | None = None,
        virtual_pipeline_model_parallel_size: int | None = None,
        get_embedding_ranks: Callable[[list[int]], list[int]] | None = None,
        get_position_embedding_ranks: Callable[[list[int]], list[int]] | None = None,
    ) -> None:
        self.decoder = decoder
        self.expert = expert
        self.world_size = decoder.world_size
        self.tp, self.pp, self.cp, self.dp = decoder.tp, decoder.pp, decoder.cp, decoder.dp
        self.ep, self.expert_tp, self.expert_dp = expert.ep, expert.tp, expert.dp
        self.order = decoder.order
        self.num_distributed_optimizer_instances = num_distributed_optimizer_instances
        self.hierarchical_context_parallel_sizes = (
            tuple(hierarchical_context_parallel_sizes) if hierarchical_context_parallel_sizes else None
        )
        self.virtual_pipeline_model_parallel_size = virtual_pipeline_model_parallel_size
        self.get_embedding_ranks = get_embedding_ranks or default_embedding_ranks
        self.get_position_embedding_ranks = get_position_embedding_ranks or default_position_embedding_ranks
        n = num_distributed_optimizer_instances
        self.intra_partial_dp_size = (self.dp * self.cp) // n
        self.intra_partial_expert_dp_size = self.expert_dp // n
        #: Every group name of this configuration, in creation order, with the entry of
        #: :data:`_GROUPS` that answers it.
        self._entries: dict[str, _Group] = {}
        for key, entry in _GROUPS.items():
            self._entries.update(entry.expand(self, key))

    # -- names --------------------------------------------------------------------------------
    @property
    def group_names(self) -> tuple[str, ...]:
        """Every group name, in Megatron's creation order (the order to create process groups in)."""
        return tuple(self._entries)

    def _entry(self, name: str) -> _Group:
        if isinstance(name, str):
            check_str(name, "name")
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise UnknownNameError(
                f"unknown group {name!r}; the groups are {', '.join(self.group_names)}", field="name", value=name
            )
        return entry

    def token(self, name: str) -> tuple[str, str] | None:
        """``(generator, token)`` behind a plain group, e.g. ``"mp"`` -> ``("decoder", "tp-pp")``;
        None for derived groups (partial DP, hierarchical cp, embeddings)."""
        return self._entry(name).token

    def generator(self, which: str) -> RankGenerator:
        return {"decoder": self.decoder, "expert": self.expert}[which]

    # -- one rank's groups, O(group size) -------------------------------------------------------
    def group(self, rank: int, name: str) -> np.ndarray | None:
        """``rank``'s group ``name`` (int32), as Megatron lists it; None for ``embd``/``pos_embd``
        when ``rank`` holds no embedding (Megatron leaves those globals None)."""
        rank = _rank_arg(rank, "ModelParallelLayout.group", "name")
        return self._entry(name).group(self, name, rank)

    def groups_of(self, rank: int) -> dict[str, np.ndarray | None]:
        """Every group of ``rank``, by name, in creation order."""
        return {name: self.group(rank, name) for name in self.group_names}

    # -- layouts (for process groups and tooling) -----------------------------------------------
    def layout(self, name: str) -> MeshLayout | None:
        """The 1-D layout whose groups partition the world like group ``name`` (same members as
        :meth:`group`, ranks ascending), or None for ``embd``/``pos_embd``, which do not cover
        the world, and for a partial-DP split that cuts a dim flattened from non-adjacent dims."""
        entry = self._entry(name)
        try:
            return entry.layout(self, name)
        except IncompatibleLayoutError:  # not a strided partition
            return None

    def group_layout(self, name: str) -> MeshLayout | None:
        """:meth:`layout`, and for an embedding group that is the pipeline group (Megatron's rule:
        default ranks, pp <= 2 for ``embd``, pp == 1 for ``pos_embd``) the ``pp`` layout: what
        ``initialize_model_parallel`` builds each group from (None: a subset group of its members).

            >>> m = model_parallel_layout(16, 2, 2)  # tp 2, pp 2: the word embedding is on every stage
            >>> m.layout("embd") is None, m.group_layout("embd") == m.layout("pp")
            (True, True)
            >>> model_parallel_layout(16, 2, 4).group_layout("embd") is None  # stages 0 and 3 only
            True
        """
        entry = self._entry(name)
        if isinstance(entry, _Embedding) and entry.is_pp(self):
            return self.layout("pp")
        return self.layout(name)

    def all_groups(self, name: str) -> np.ndarray:
        """Every group ``name`` as ``(num_groups, group_size)`` int32 (Megatron's order for plain
        groups, ranks ascending for derived ones), O(world). Not for ``embd``/``pos_embd``."""
        entry = self._entry(name)
        try:
            groups = entry.all_groups(self, name)
        except IncompatibleLayoutError:
            groups = None
        if groups is None:
            raise ParallelConfigError(
                f"group {name!r} is not a partition of the world; ask group(rank, {name!r}) for one "
                "rank's members instead",
                field="name",
                value=name,
            )
        return groups

    def covers_world(self, name: str) -> bool:
        """Whether group ``name``'s groups cover every rank (all but the embedding groups): the
        groups a torch face can create on every rank."""
        return self._entry(name).partition

    def __repr__(self) -> str:
        return (
            f"ModelParallelLayout(world_size={self.world_size}, tp={self.tp}, pp={self.pp}, cp={self.cp}, "
            f"dp={self.dp}, ep={self.ep}, expert_tp={self.expert_tp}, expert_dp={self.expert_dp}, "
            f"order={self.order!r})"
        )


def model_parallel_layout(
    world_size: int,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    context_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    expert_tensor_parallel_size: int | None = None,
    order: str = DEFAULT_ORDER,
    num_distributed_optimizer_instances: int = 1,
    hierarchical_context_parallel_sizes: Sequence[int] | None = None,
    virtual_pipeline_model_parallel_size: int | None = None,
    get_embedding_ranks: Callable[[list[int]], list[int]] | None = None,
    get_position_embedding_ranks: Callable[[list[int]], list[int]] | None = None,
    *,
    world: MeshLayout | None = None,
) -> ModelParallelLayout:
    """The layouts of Megatron's ``initialize_model_parallel`` (same keyword names), with its checks.

    Nothing is communicated: this is pure layout work, identical on every rank. Raises
    :class:`~rankmesh.SizeMismatchError` (a ``RuntimeError``, like Megatron; ``field`` is
    ``"world_size"``, ``value`` the world size) when ``world_size`` is not a multiple of tp*pp*cp
    or of expert_tp*ep*pp: rankmesh's one class for degrees that do not fit the world, in every
    convention. Raises :class:`ParallelConfigError` (a ``RuntimeError``, like Megatron) when a
    virtual pipeline is asked without pp > 1; and its subclass :class:`MegatronConfigError`
    (also an ``AssertionError``, like Megatron's asserts) when the order does not end with pp and
    pp > 1 and the dense and expert dp sizes differ, when the dense and expert pipeline groups
    differ (both of kind ``"order_pp_not_last"``; these and an order that leaves out a dim carry the
    order that works for this call, :func:`working_order`'s, in ``e.ctx["works"]``, or None), when
    dp*cp or the expert dp is not a multiple of
    ``num_distributed_optimizer_instances``, and when the hierarchical cp sizes do not multiply to
    cp. A degree that is not an int raises :class:`~rankmesh.ArgumentTypeError` (a ``TypeError``)
    and one < 1 :class:`~rankmesh.InvalidSizeError`.

    Example, Megatron's hierarchical context-parallel groups: cp = 4 over 8 ranks, split into
    levels of 2 and 2. On ranks 0-3 the cp group is ``[0, 1, 2, 3]``, on ranks 4-7
    ``[4, 5, 6, 7]``; inside it level 0 pairs neighbours (``[0, 1]`` on ranks 0 and 1,
    ``[2, 3]`` on ranks 2 and 3) and level 1 pairs across (``[0, 2]`` on ranks 0 and 2,
    ``[1, 3]`` on ranks 1 and 3). Levels that do not multiply to cp are refused:

    >>> m = model_parallel_layout(8, context_parallel_size=4, hierarchical_context_parallel_sizes=[2, 2])
    >>> [m.group(r, "cp").tolist() for r in (1, 5)]
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> [m.group(1, level).tolist() for level in ("hcp_l0", "hcp_l1")]
    [[0, 1], [1, 3]]
    >>> [m.group(2, level).tolist() for level in ("hcp_l0", "hcp_l1")]
    [[2, 3], [0, 2]]
    >>> model_parallel_layout(8, context_parallel_size=4, hierarchical_context_parallel_sizes=[3, 2])
    Traceback (most recent call last):
        ...
    rankmesh.errors.MegatronConfigError: hierarchical_context_parallel_sizes [3, 2] multiply to 6, not cp (4)
    """
    world_size = positive_int(world_size, "world_size")
    tp = positive_int(
        tensor_model_parallel_size, "tensor_model_parallel_size", fix=degree_fix("tp", "tensor_model_parallel_size")
    )
    pp = positive_int(
        pipeline_model_parallel_size,
        "pipeline_model_parallel_size",
        fix=degree_fix("pp", "pipeline_model_parallel_size"),
    )
    cp = positive_int(context_parallel_size, "context_parallel_size", fix=degree_fix("cp", "context_parallel_size"))
    ep = positive_int(
        expert_model_parallel_size, "expert_model_parallel_size", fix=degree_fix("ep", "expert_model_parallel_size")
    )
    etp = (
        tp
        if expert_tensor_parallel_size is None
        else positive_int(
            expert_tensor_parallel_size,
            "expert_tensor_parallel_size",
            fix=degree_fix("etp", "expert_tensor_parallel_size"),
        )
    )
    n_do = positive_int(num_distributed_optimizer_instances, "num_distributed_optimizer_instances")
    # overflows first, each naming the degree that overflows the running product (as
    # MeshLayout.unflatten names the size), before the degrees are compared with the world
    check_degrees([("world_size", world_size)])
    check_degrees(
        [("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp), ("context_parallel_size", cp)]
    )
    etp_field = "tensor_model_parallel_size" if expert_tensor_parallel_size is None else "expert_tensor_parallel_size"
    check_degrees([(etp_field, etp), ("expert_model_parallel_size", ep), ("pipeline_model_parallel_size", pp)])

    check = _OrderCheck(
        tp, pp, cp, ep, world, world_size=world_size, etp=etp, n_do=n_do, hcp=hierarchical_context_parallel_sizes,
        vpp=virtual_pipeline_model_parallel_size,
    )  # fmt: skip
    check.checked_names(order)  # every check of this call, in its order, before any generator is built
    if world is None:
        world = MeshLayout.world(world_size)
    (_, dense), (_, expert_sizes) = check.generators
    decoder = RankGenerator(**dense, order=order, world=world)
    expert = RankGenerator(**expert_sizes, order=order, world=world)
    return ModelParallelLayout(
        decoder,
        expert,
        num_distributed_optimizer_instances=n_do,
        hierarchical_context_parallel_sizes=hierarchical_context_parallel_sizes,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        get_embedding_ranks=get_embedding_ranks,
        get_position_embedding_ranks=get_position_embedding_ranks,
    )


def _pp_last_hint(fix: str | None, fallback: str) -> str:
    """The hint of an order that must end with pp: the order that works, or what else to change."""
    return f"put pp last, e.g. order={fix!r}" if fix is not None else f"no order works here; {fallback}"


def _same_partition(a: MeshLayout, b: MeshLayout) -> bool:
    if a.partition_key(0) == b.partition_key(0):
        return True
    if a.size() != b.size():
        return False
    return bool(np.array_equal(_group_labels(a), _group_labels(b)))


def _group_labels(lay: MeshLayout) -> np.ndarray:
    """For every rank, the smallest rank of its group: equal arrays <=> equal partitions. O(world)."""
    g = lay.groups().reshape(-1, lay.size())
    labels = np.empty(lay.world_size, dtype=np.int32)
    labels[g] = g.min(axis=1, keepdims=True)
    return labels
