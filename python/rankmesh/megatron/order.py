"""Megatron's order rules (torch-free): which order strings, such as ``"tp-cp-ep-dp-pp"``, a
``RankGenerator`` or ``model_parallel_layout`` call builds with, and the error it raises otherwise.

One class per call checks it, once: :class:`GeneratorCheck` (one ``RankGenerator``) and
:class:`LayoutCheck` (``model_parallel_layout``'s dense and expert generators). A check finds the
first rule the call breaks without raising (:func:`order_problem` says it in words,
:func:`working_order` tries candidates with it); each rule also says, in place, the error the
call raises for it, of its class's kind or of a kind of :data:`rankmesh.errors.ERROR_KINDS`
(``order_misses_dim``, ``order_pp_not_last``, ``world_not_divisible``) with that kind's ctx::

    >>> order_problem("tp-dp", 16, tp=2, pp=2)
    'the order does not name pp (size 2 in the dense generator)'
    >>> working_order(["tp-dp", "tp-dp-pp"], 16, tp=2, pp=2)
    'tp-dp-pp'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from rankmesh._check import (
    as_int,
    check_degrees,
    check_str,
    degree_fix,
    positive_int,
    undivided,
    undivided_fix,
    undivided_text,
)
from rankmesh._native import MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DuplicateNameError,
    InvalidNameError,
    InvalidSizeError,
    MegatronConfigError,
    ParallelConfigError,
    RankmeshError,
    SizeMismatchError,
    UnknownNameError,
    arg,
)

__all__ = ["MEGATRON_DIMS", "DEFAULT_ORDER", "order_problem", "working_order"]

#: The dim names a Megatron ``RankGenerator`` knows, in its own ``name_to_size`` order.
MEGATRON_DIMS: tuple[str, ...] = ("tp", "pp", "dp", "ep", "cp")
#: ``initialize_model_parallel``'s default order.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
# The fix (a RankmeshError.fix template) of a bad order.
ORDER_FIX = "name every dim of size > 1 once in {order}, joined by '-' with pp last"
#: The argument of model_parallel_layout (and of initialize_model_parallel) each degree is passed as.
_MEGATRON_ARGS = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
}


class _Fault(NamedTuple):
    """The first rule a call breaks, found without raising: ``reason`` (:func:`order_problem`'s
    words) and ``error``, which makes the error the call raises for it (made only when raised: an
    order's error names the order that works, which is found by checking other orders)."""

    reason: str
    error: Callable[[], RankmeshError]


def _made(error: RankmeshError) -> Callable[[], RankmeshError]:
    """The maker of an error a shared check (:mod:`rankmesh._check`) has already made."""
    return lambda: error


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


# -- names: an order or a token -------------------------------------------------------------------


def _names_fault(text: Any, field: str, unique: bool = False) -> tuple[list[str], _Fault | None]:
    """``text``'s names (``"tp-dp"`` -> ``["tp", "dp"]``, lower-cased) and the first rule they
    break, or None: not a str (or not valid text), an empty or unknown name, with ``unique`` a name
    twice. Never raises."""
    fix = ORDER_FIX if field == "order" else None
    if not isinstance(text, str):
        return [], _Fault(
            f"the {field} must be a str like 'tp-dp', not {type(text).__name__}",
            lambda: ArgumentTypeError(
                f"{field} must be a str like 'tp-dp', got {type(text).__name__} {text!r}", field=field, value=text
            ),
        )
    try:
        check_str(text, field)
    except ArgumentTypeError as e:
        return [], _Fault(f"the {field} is not valid UTF-8 text", _made(e))
    names = text.lower().split("-")
    bad = next((n for n in names if n not in MEGATRON_DIMS), None)  # the first empty or unknown name
    if bad == "":
        return [], _Fault(
            f"the {field} {text!r} has an empty name",
            lambda: InvalidNameError(
                f"{field} {text!r} has an empty name; write names joined by single '-', e.g. 'tp-cp-ep-dp-pp'",
                field=field,
                value=text,
                fix=fix,
            ),
        )
    if bad is not None:
        known = ", ".join(MEGATRON_DIMS)
        return [], _Fault(
            f"the {field} {text!r} names {bad!r}, which is not one of {known}",
            lambda: UnknownNameError(
                f"{arg(field, f'{field} {text!r}', repr(text))} names {bad!r}, which is not one of {known}",
                field=field,
                value=bad,
                fix=fix,
            ),
        )
    if unique and len(set(names)) < len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        return [], _Fault(
            f"the {field} {text!r} names {twice!r} twice",
            lambda: DuplicateNameError(f"{field} {text!r} names {twice!r} twice", field=field, value=twice, fix=fix),
        )
    return names, None


def split_names(text: str, field: str) -> list[str]:
    """``"tp-dp"`` -> ``["tp", "dp"]``, lower-cased, each name known, no empty piece; else the
    error of the first rule ``text`` (argument ``field``: an order or a token) breaks."""
    names, fault = _names_fault(text, field)
    if fault is not None:
        raise fault.error()
    return names


def _pp_last_hint(fix: str | None, fallback: str) -> str:
    """The hint of an order that must end with pp: the order that works, or what else to change."""
    return f"put pp last, e.g. order={fix!r}" if fix is not None else f"no order works here; {fallback}"


# -- the checks of one call -----------------------------------------------------------------------


class _OrderCheck:
    """What the checks of both calls share. The degrees are ints >= 1 (each call reads its own);
    what does not depend on the order is checked when the check is made, once. :meth:`fault` says
    which rule an order breaks, without raising; :meth:`checked_names` raises the call's error."""

    #: The world the generators are built on (None: the identity world of :attr:`world_size` ranks).
    world: Any = None
    #: Ranks of the call's generators (0 where a fault found before the order is read stopped the check).
    world_size: int = 0
    #: What is wrong whatever the order: found before the order is read (``before``) or after
    #: every check of it (``after``); None where nothing is.
    before: _Fault | None = None
    after: _Fault | None = None

    def fault(self, order: object) -> tuple[list[str], _Fault | None]:
        """``order``'s names and the first rule the call breaks with it (None: it builds), in the
        call's order. Never raises."""
        if self.before is not None:
            return [], self.before
        names, fault = _names_fault(order, "order", unique=True)
        if fault is None:
            fault = self._order_fault(order, names)
        return names, fault or self.after

    def _order_fault(self, order: Any, names: list[str]) -> _Fault | None:
        """The first rule valid, distinct ``names`` (of ``order``) break with these degrees."""
        raise NotImplementedError

    def works(self, candidates: Iterable[Any]) -> str | None:
        """The first of ``candidates`` with which the call builds, or None."""
        return next((c for c in candidates if self.fault(c)[1] is None), None)

    def checked_names(self, order: Any) -> list[str]:
        """``order``'s names, where the call builds with it; else the call's error, raised."""
        names, fault = self.fault(order)
        if fault is not None:
            raise fault.error()
        return names

    def _missing_fault(self, order: Any, names: list[str], where: str, sizes: dict[str, int]) -> _Fault | None:
        """The first dim of size > 1 of a generator of ``sizes`` (``where``: which) ``names`` leave out."""
        missing = tuple(n for n in MEGATRON_DIMS if n not in names and sizes[n] != 1)
        if not missing:
            return None
        dim, size = missing[0], sizes[missing[0]]

        def error() -> RankmeshError:
            fix, listed = self.works(_order_candidates(names, missing)), ", ".join(map(repr, missing))
            hint = f"add {listed} to the order, e.g. {fix!r}"
            if fix is None:
                hint = f"no order naming {listed} works with these degrees; change them"
            return ParallelConfigError(
                f"the size of {dim} is {size}, but the {arg('order', f'order {order!r}', repr(order))} does not name "
                f"it; {hint}",
                field="order",
                value=order,
                kind="order_misses_dim",
                ctx={"dim": dim, "size": size, "works": fix},
                fix=ORDER_FIX,
            )

        return _Fault(f"the order does not name {dim} (size {size}{where})", error)

    def _world_fault(self) -> _Fault | None:
        world, w = self.world, self.world_size
        if world is None or (isinstance(world, MeshLayout) and world.ndim == 1 and world.world_size == w):
            return None

        def error() -> RankmeshError:
            if not isinstance(world, MeshLayout):
                return ArgumentTypeError(
                    f"world must be a 1-D MeshLayout, got {type(world).__name__}; pass "
                    f"MeshLayout.world({w}, rank_map=...) or leave it out",
                    field="world",
                    value=world,
                )
            # the degrees do not multiply to the world: rankmesh's one class for that fault
            return SizeMismatchError(
                f"world must be a 1-D MeshLayout of tp*ep*dp*pp*cp = {w} ranks, got shape {world.shape} over "
                f"{world.world_size} ranks; change the degrees or pass MeshLayout.world({w}, ...)",
                field="world",
                value=world,
            )

        return _Fault(f"world is not a 1-D MeshLayout of {w} ranks", error)


class GeneratorCheck(_OrderCheck):
    """The checks of ``RankGenerator(tp, ep, dp, pp, cp, order, rank_offset, world=world)``."""

    def __init__(self, tp: int, ep: int, dp: int, pp: int, cp: int, world: Any = None, rank_offset: Any = 0) -> None:
        self.world = world
        #: The generator's degrees, in argument order.
        self.sizes = {"tp": tp, "ep": ep, "dp": dp, "pp": pp, "cp": cp}
        #: ``rank_offset`` as an int (0 until read: ep and cp both > 1 are found first).
        self.rank_offset = 0
        if ep > 1 and cp > 1:
            self.before = _Fault(
                f"ep ({ep}) and cp ({cp}) cannot both be > 1 in one RankGenerator",
                lambda: MegatronConfigError(
                    f"ep ({ep}) and cp ({cp}) cannot both be > 1 in one RankGenerator: Megatron keeps cp in the "
                    "dense generator (ep=1) and ep in the expert one (cp=1); use model_parallel_layout() to build "
                    "both",
                    field="ep",
                    value=ep,
                ),
            )
            return
        offset = self.rank_offset = as_int(rank_offset, "rank_offset")
        if offset < 0:
            self.before = _Fault(
                f"rank_offset ({offset}) is < 0",
                lambda: InvalidSizeError(
                    f"rank_offset must be >= 0, got {offset} (megatron-core silently ignores "
                    "a negative offset; rankmesh refuses it)",
                    field="rank_offset",
                    value=offset,
                ),
            )
            return
        # the degree whose product overflows is named (tp=2**64 blames tp), then rank_offset
        self.world_size = check_degrees(self.sizes.items(), rank_offset=offset)

    def _order_fault(self, order: Any, names: list[str]) -> _Fault | None:
        return self._missing_fault(order, names, "", self.sizes) or self._world_fault()


class LayoutCheck(_OrderCheck):
    """The checks of ``model_parallel_layout(world_size, tp, pp, cp, ep, etp, order, n_do, hcp,
    vpp, world=world)``: its dense generator (``ep`` 1) and its expert one (``etp`` for tp, ``cp``
    1), which one order must suit."""

    def __init__(
        self,
        world_size: int,
        tp: int,
        pp: int,
        cp: int,
        ep: int,
        etp: int,
        world: Any = None,
        *,
        n_do: int = 1,
        hcp: Sequence[int] | None = None,
        vpp: int | None = None,
    ) -> None:
        w, model, expert_model = world_size, tp * pp * cp, etp * ep * pp
        self.world, self.world_size = world, w
        self.tp, self.pp, self.cp, self.ep, self.etp, self.n_do, self.hcp = tp, pp, cp, ep, etp, n_do, hcp
        #: The dense and expert dp (each meaningful where tp*pp*cp, etp*ep*pp divide the world).
        self.dp, self.edp = w // model, w // expert_model
        #: The dense generator's degrees, and the expert one's (None where the world does not fit it).
        self.dense = {"tp": tp, "ep": 1, "dp": self.dp, "pp": pp, "cp": cp}
        self.expert: dict[str, int] | None = None
        if w % model:
            self.before = _Fault(f"world_size ({w}) is not divisible by tp*pp*cp = {model}", self._world_error(True))
            return
        if vpp is not None:
            positive_int(vpp, "virtual_pipeline_model_parallel_size")
            if not pp > 1:
                self.before = _Fault(
                    "virtual_pipeline_model_parallel_size needs pp > 1",
                    lambda: ParallelConfigError(
                        "pipeline-model-parallel size should be greater than 1 with interleaved schedule "
                        "(virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1)",
                        field="virtual_pipeline_model_parallel_size",
                        value=vpp,
                    ),
                )
                return
        if w % expert_model:
            why = f"world_size ({w}) is not divisible by expert_tp*ep*pp = {expert_model}"
            self.after = _Fault(why, self._world_error(False))
            return
        self.expert = {"tp": etp, "ep": ep, "dp": self.edp, "pp": pp, "cp": 1}
        self.after = self._n_do_fault() or self._hcp_fault()

    def _world_error(self, dense: bool) -> Callable[[], RankmeshError]:
        """The error of a world that the dense (or the expert) degrees do not divide: a
        SizeMismatchError, a RuntimeError like megatron-core's."""
        w = self.world_size
        names = ("tp", "pp", "cp") if dense else ("etp", "ep", "pp")
        what = "tp*pp*cp" if dense else "expert_tp*ep*pp"
        factors = tuple(getattr(self, n) for n in names)
        div = int(np.prod(factors))
        # the degree at fault, named by its argument (a flag of rankmesh plan), and values that divide
        name, value, left = undivided(w, list(zip(names, factors)))
        field = _MEGATRON_ARGS[name]
        return lambda: SizeMismatchError(
            f"{arg('world_size', f'world_size ({w})', w)} is not divisible by {what} = {'*'.join(map(str, factors))} "
            f"= {div} ({undivided_text(field, name, value, left, 'it', w)}); use a world "
            f"that is a multiple of {div} or smaller {'degrees' if dense else 'expert degrees'}",
            field="world_size",
            value=w,
            kind="world_not_divisible",
            ctx={"world_size": w, "divisor": div},
            fix=f"{undivided_fix(field, value, left)}, or make {{world_size}} a multiple of {div}",
        )

    def _n_do_fault(self) -> _Fault | None:
        n_do, dp, cp, edp = self.n_do, self.dp, self.cp, self.edp
        if not ((dp * cp) % n_do or edp % n_do):
            return None
        dense = bool((dp * cp) % n_do)
        what = f"data parallel size with cp ({dp}*{cp})" if dense else f"expert data parallel size ({edp})"
        return _Fault(
            f"num_distributed_optimizer_instances ({n_do}) does not divide {'dp*cp' if dense else 'the expert dp'}",
            lambda: MegatronConfigError(
                f"{what} should be divisible by the partial DistOpt shard factor "
                f"num_distributed_optimizer_instances ({n_do})",
                field="num_distributed_optimizer_instances",
                value=n_do,
            ),
        )

    def _hcp_fault(self) -> _Fault | None:
        hcp, cp = self.hcp, self.cp
        if not hcp:
            return None
        try:  # as model_parallel_layout reads them
            hs = [positive_int(s, f"hierarchical_context_parallel_sizes[{i}]") for i, s in enumerate(hcp)]
        except RankmeshError as e:  # the call's own error: kept, without this frame, for checked_names
            why = f"hierarchical_context_parallel_sizes {hcp} are not all ints >= 1"
            return _Fault(why, _made(e.with_traceback(None)))
        product = int(np.prod(hs))
        if product == cp:
            return None
        return _Fault(
            f"hierarchical_context_parallel_sizes {hcp} do not multiply to cp ({cp})",
            lambda: MegatronConfigError(
                f"hierarchical_context_parallel_sizes {hs} multiply to {product}, not cp ({cp})",
                field="hierarchical_context_parallel_sizes",
                value=hs,
            ),
        )

    def _order_fault(self, order: Any, names: list[str]) -> _Fault | None:
        fault = self._missing_fault(order, names, " in the dense generator", self.dense) or self._world_fault()
        if fault is None and self.expert is not None:
            fault = self._missing_fault(order, names, " in the expert generator", self.expert)
            fault = fault or self._pp_fault(order, names, self.expert)
        return fault

    def _pp_fault(self, order: Any, names: list[str], expert: dict[str, int]) -> _Fault | None:
        """With pp > 1, an order that does not end with pp builds only where the dense and expert
        dp sizes, and then their pipeline groups, agree."""
        if not (self.pp > 1 and names[-1] != "pp"):
            return None
        why = "the order does not end with pp and the dense"
        if self.dp != self.edp:
            reason = f"{why} ({self.dp}) and expert ({self.edp}) dp differ"
        else:
            dense, moe = self._pipelines(MeshLayout.world(self.world_size), names, expert)
            if dense.same_groups(moe):  # the core: by modes, else each rank's least group-mate
                return None
            reason = f"{why} and expert pipeline groups differ"

        def error() -> RankmeshError:
            fix = self.works(_order_candidates(names))
            return MegatronConfigError(
                self._pp_text(order, names, expert, fix),
                field="order",
                value=order,
                kind="order_pp_not_last",
                ctx={"works": fix},
                fix=ORDER_FIX,
            )

        return _Fault(reason, error)

    def _pipelines(self, world: MeshLayout, names: list[str], expert: dict[str, int]) -> list[MeshLayout]:
        """The pipeline dims of the dense and expert generators of order ``names`` over ``world``:
        each generator's ``layout("pp")``."""
        mesh_names = (names + [n for n in MEGATRON_DIMS if n not in names])[::-1]
        return [
            world.unflatten(0, [s[n] for n in mesh_names], mesh_names)[("pp",)].flatten("pp")
            for s in (self.dense, expert)
        ]

    def _pp_text(self, order: Any, names: list[str], expert: dict[str, int], fix: str | None) -> str:
        """The message of an order that must end with pp (``fix``: the order that works, or None)."""
        if self.dp != self.edp:
            return (
                f"when the order ({order!r}) does not end with pp, the data-parallel sizes of the attention "
                f"({self.dp}) and MoE ({self.edp}) layers must be the same; "
                + _pp_last_hint(fix, "make expert_tp*ep equal tp*cp")
            )
        world = MeshLayout.world(self.world_size) if self.world is None else self.world
        step = [",".join(str(d) for _, d in g.partition_key(0)) for g in self._pipelines(world, names, expert)]
        return (
            "pipeline parallel groups are expected to be the same for the non-expert and expert parts; "
            f"with order {order!r} the dense pp groups step by {step[0]} ranks and the expert ones "
            f"by {step[1]}; " + _pp_last_hint(fix, "change the degrees")
        )


# -- the order rules, as words and as the order that works -------------------------------------------


def _call_check(
    world_size: Any, tp: Any, pp: Any, cp: Any, ep: Any, etp: Any, dp: Any, n_do: Any, hcp: Any, world: Any
) -> _OrderCheck:
    """The check of the call :func:`order_problem`'s arguments describe; degrees that are not ints
    >= 1 raise as that call would."""
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
        return GeneratorCheck(tp, ep, positive_int(dp, "dp"), pp, cp, world)
    world_size = check_degrees([("world_size", positive_int(world_size, "world_size"))])
    n_do = positive_int(n_do, "num_distributed_optimizer_instances")
    return LayoutCheck(world_size, tp, pp, cp, ep, etp, world, n_do=n_do, hcp=hcp)


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
    :func:`~rankmesh.megatron.model_parallel_layout`'s. Degrees that are not ints >= 1 raise as the
    call itself would.

        >>> order_problem("tp-cp-ep-dp-pp", 16, tp=2, pp=2, ep=4) is None
        True
        >>> order_problem("tp-dp-pp", 16, tp=2, pp=2, ep=4)
        'the order does not name ep (size 4 in the expert generator)'
        >>> order_problem("tp-pp-ep-dp", 32, tp=2, pp=4, ep=2, etp=1)
        'the order does not end with pp and the dense and expert pipeline groups differ'
        >>> order_problem("tp-dp", tp=2, dp=2, pp=2)  # one RankGenerator
        'the order does not name pp (size 2)'
    """
    n_do, hcp = num_distributed_optimizer_instances, hierarchical_context_parallel_sizes
    check = _call_check(world_size, tp, pp, cp, ep, etp, dp, n_do, hcp, world)
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
    n_do, hcp = num_distributed_optimizer_instances, hierarchical_context_parallel_sizes
    check = _call_check(world_size, tp, pp, cp, ep, etp, dp, n_do, hcp, world)
    return check.works(candidates)
