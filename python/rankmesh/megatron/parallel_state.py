"""megatron-core's ``parallel_state.initialize_model_parallel``, in O(group size) per rank.

Exposed as :func:`rankmesh.megatron.initialize_model_parallel` (see there). megatron-core's own
function enumerates every group of the job on every rank and calls ``new_group`` for each
(281,138 calls per rank at 131,072 ranks); this one asks :class:`~rankmesh.ModelParallelLayout`
for the caller's groups only and creates them through one :class:`~rankmesh.MeshBuilder`: one
process group per distinct (partition, backend, options, timeout), ``split_group`` when the
default group is bound to a device, member-only ``new_group`` otherwise. The groups are then
installed in ``megatron.core.parallel_state`` where megatron-core's function puts them.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

from rankmesh._check import as_sequence, check_str
from rankmesh._dependencies import DEPENDENCIES, install_hint, unsupported
from rankmesh._dependencies import version as dependency_version
from rankmesh._once import warn_once
from rankmesh.errors import MegatronConfigError, MegatronStateError, UnknownNameError
from rankmesh.megatron.parallel_state_groups import MUST_BE_UNSET, Checked, make_groups
from rankmesh.recovery import active_world

__all__ = [
    "initialize_model_parallel",
    "destroy_model_parallel",
    "last_build_report",
    "megatron_core_version",
    "megatron_own",
    "parallel_state",
]

# The megatron-core releases initialize_model_parallel is proved against (its parallel_state
# globals and the groups behind them change between minor releases) are the one table of
# rankmesh._dependencies; any other gets megatron-core's own function, after one warning.
_RELEASES: tuple[str, ...] = DEPENDENCIES["megatron-core"].releases

_last_builder: Any = None


def megatron_core_version() -> str | None:
    """The installed megatron-core version, or None."""
    return dependency_version("megatron-core")


def parallel_state():
    """``megatron.core.parallel_state``; ``ImportError`` naming the extra when megatron-core is
    not installed."""
    if megatron_core_version() is None:
        raise ImportError(
            "rankmesh.megatron.initialize_model_parallel fills megatron-core's parallel_state; "
            f"install megatron-core {', '.join(_RELEASES)} ({install_hint('megatron-core')})"
        )
    import warnings

    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on CPU
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
    return ps


def _stock(ps: Any, reason: str, args: dict[str, Any], newer: dict[str, Any]) -> None:
    """megatron-core's own ``initialize_model_parallel`` (:func:`megatron_own`:
    found even where rankmesh's was assigned over it) with the arguments the caller gave a value other
    than rankmesh's default (megatron-core keeps its own defaults for the rest) and every argument
    rankmesh does not model (megatron-core refuses what it does not know), after one warning."""
    import inspect

    warn_once(
        ("megatron stock", reason),
        f"rankmesh: {reason}; rankmesh.megatron.initialize_model_parallel calls megatron-core's own (every group "
        "of the job on every rank, as without rankmesh)",
        stacklevel=4,
    )
    defaults = {k: p.default for k, p in inspect.signature(initialize_model_parallel).parameters.items()}
    megatron_own(ps)(**{k: v for k, v in args.items() if _given(v, defaults[k])}, **newer)


def megatron_own(ps: Any) -> Callable[..., Any]:
    """megatron-core's own ``initialize_model_parallel`` of the module ``ps``: the attribute, or the
    first function that is not rankmesh's along its ``__wrapped__`` chain (the ``"megatron"`` patch
    keeps the function it replaced there), else the ``def`` in ``ps``'s source file run again in
    ``ps``'s own globals, so that it reads and sets the same module state (after
    ``parallel_state.initialize_model_parallel = rankmesh.megatron.initialize_model_parallel``)."""
    fn = ps.__dict__.get("initialize_model_parallel")
    while fn is not None and str(getattr(fn, "__module__", "")).startswith("rankmesh."):
        fn = getattr(fn, "__wrapped__", None)  # functools.wraps of rankmesh's takes its module too
    if fn is not None:
        return fn
    file = ps.__file__
    key = (file, os.stat(file).st_mtime_ns)
    if key not in _compiled:
        import ast

        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=file)
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "initialize_model_parallel")
        namespace: dict[str, Any] = {}
        exec(compile(ast.Module(body=[node], type_ignores=[]), file, "exec"), ps.__dict__, namespace)  # noqa: S102
        _compiled[key] = namespace["initialize_model_parallel"]
    return _compiled[key]


_compiled: dict[tuple[str, int], Callable[..., Any]] = {}


def _given(value: Any, default: Any) -> bool:
    """Whether an argument differs from rankmesh's default for it (any value that cannot be
    compared counts as given)."""
    if value is default:
        return False
    try:
        return bool(value != default)
    except Exception:  # noqa: BLE001 - e.g. an array: pass it on
        return True


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size: int | None = None,
    pipeline_model_parallel_comm_backend: str | None = None,
    use_sharp: bool = False,
    context_parallel_size: int = 1,
    hierarchical_context_parallel_sizes: list[int] | None = None,
    hybrid_context_parallel: bool = False,
    expert_model_parallel_size: int = 1,
    num_distributed_optimizer_instances: int = 1,
    expert_tensor_parallel_size: int | None = None,
    nccl_communicator_config_path: str | None = None,
    distributed_timeout_minutes: int = 30,
    order: str = "tp-cp-ep-dp-pp",
    get_embedding_ranks: Callable[..., list[int]] | None = None,
    get_position_embedding_ranks: Callable[..., list[int]] | None = None,
    create_gloo_process_groups: bool = True,
    high_priority_stream_groups: list[str] | None = None,
    sharp_enabled_group: str | None = None,
    create_all_gather_group: bool | None = False,
    **newer: Any,
):
    """megatron-core 0.16's ``parallel_state.initialize_model_parallel`` (same arguments, same
    checks, same state afterwards), creating only the caller's groups, in O(group size).

    Call it on every rank after ``torch.distributed.init_process_group``, exactly where
    megatron-core's own function would be called. Afterwards every ``parallel_state.get_*``
    accessor, ``model_parallel_is_initialized()`` and ``destroy_model_parallel()`` behave as after
    megatron-core's call: the group globals, their global-rank lists, the embedding, expert,
    partial-DistOpt, hierarchical-cp and hybrid-cp groups and the gloo twins
    (``create_gloo_process_groups``) are where megatron-core puts them, with the same members.

    What differs is how the groups are made:

    - only the caller's group of each kind is created (megatron-core calls ``new_group`` for
      every group of the job on every rank: 281,138 calls per rank at 131,072 ranks);
    - with ``split_group`` when the default group is bound to a device (NCCL eager init), else
      with member-only ``new_group`` (gloo twins: always member-only ``new_group``);
    - one process group per distinct (set of groups, backend, NCCL options, timeout): e.g. ``tp``
      and the expert ``tp`` are one communicator when their degrees match, and the default group
      serves every group that spans the world. ``create_all_gather_group`` still gets its own
      communicator (that is its point), and one-rank groups are real one-rank groups, as in
      megatron-core.

    Returns the :class:`~rankmesh.BuildReport` of the groups created (megatron-core returns
    None). A megatron-core outside the releases ``rankmesh._dependencies`` lists, or an argument of
    a newer release (``gtp_remat_size``), gets megatron-core's own function with the call as made
    (and None back), after one ``RuntimeWarning``: its answers and its exceptions, never rankmesh's.
    That holds after ``parallel_state.initialize_model_parallel = rankmesh.megatron.initialize_model_parallel``
    too (:func:`megatron_own`). Errors, raised before any group
    exists: :class:`~rankmesh.errors.MegatronStateError`
    (torch.distributed not initialised, model parallelism already initialised; also an
    ``AssertionError``), :class:`~rankmesh.errors.ParallelConfigError` (a ``RuntimeError``, where
    megatron-core raises one) and :class:`~rankmesh.errors.MegatronConfigError` (also an
    ``AssertionError``, where megatron-core asserts).

    Example (on every rank of a job, e.g. under torchrun)::

        >>> import torch.distributed as dist  # doctest: +SKIP
        >>> from megatron.core import parallel_state as ps  # doctest: +SKIP
        >>> import rankmesh.megatron  # doctest: +SKIP
        >>> dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))  # doctest: +SKIP
        >>> rankmesh.megatron.initialize_model_parallel(tensor_model_parallel_size=8,
        ...     pipeline_model_parallel_size=4, expert_model_parallel_size=8)  # doctest: +SKIP
        >>> ps.get_tensor_model_parallel_world_size()  # doctest: +SKIP
        8
    """
    args = dict(locals())  # every keyword as given: written once, in the signature
    newer = args.pop("newer")
    ps = parallel_state()
    reason = unsupported("megatron-core", installed=megatron_core_version())
    if reason is None and newer:
        reason = f"initialize_model_parallel got {', '.join(sorted(newer))}, which rankmesh does not model"
    if reason is not None:
        _stock(ps, reason, args, newer)
        return None
    c = _check(ps, args)
    new, hybrid, builder = make_groups(c)
    _install(c, new, hybrid, builder)
    return builder.report()


def _check(ps: Any, a: dict[str, Any]) -> Checked:
    """Everything megatron-core checks, before any group exists, in its order; each check is a
    small function of its own arguments. Returns the configuration resolved."""
    from rankmesh.megatron.layout import model_parallel_layout

    sharp_group = _sharp_group(a["use_sharp"], a["sharp_enabled_group"], a["num_distributed_optimizer_instances"])
    high_priority = _high_priority_groups(a["high_priority_stream_groups"])
    _check_pp_backend(a["pipeline_model_parallel_comm_backend"])
    world_size, rank = _distributed(ps)
    m = model_parallel_layout(
        world_size,
        a["tensor_model_parallel_size"],
        a["pipeline_model_parallel_size"],
        a["context_parallel_size"],
        a["expert_model_parallel_size"],
        a["expert_tensor_parallel_size"],
        a["order"],
        a["num_distributed_optimizer_instances"],
        a["hierarchical_context_parallel_sizes"],
        a["virtual_pipeline_model_parallel_size"],
        a["get_embedding_ranks"],
        a["get_position_embedding_ranks"],
        world=_reformed_world(world_size),  # rankmesh.recovery's re-formed world, when one is active
    )
    _check_hybrid_cp(a["hybrid_context_parallel"], m.dp, m.cp)
    _check_ucc(a["pipeline_model_parallel_comm_backend"], os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"))
    nccl_comm_cfgs = _nccl_comm_cfgs(a["nccl_communicator_config_path"])
    for pg_name in high_priority:
        ps.overwrite_nccl_comm_cfgs(nccl_comm_cfgs, pg_name, ("is_high_priority_stream", True))
    _check_embedding_ranks(m, rank)
    return Checked(
        ps=ps,
        m=m,
        world_size=world_size,
        rank=rank,
        sharp_enabled_group=sharp_group,
        nccl_comm_cfgs=nccl_comm_cfgs,
        timeout=datetime.timedelta(minutes=a["distributed_timeout_minutes"]),
        gloo=a["create_gloo_process_groups"],
        create_all_gather_group=a["create_all_gather_group"],
        hybrid_context_parallel=a["hybrid_context_parallel"],
        pp_backend=a["pipeline_model_parallel_comm_backend"],
        virtual_pipeline_model_parallel_size=a["virtual_pipeline_model_parallel_size"],
    )


def _sharp_group(
    use_sharp: bool, sharp_enabled_group: str | None, num_distributed_optimizer_instances: int
) -> str | None:
    """The group SHARP is enabled for (None without SHARP), as megatron-core resolves it."""
    if not use_sharp:
        if sharp_enabled_group is not None:
            raise MegatronConfigError(
                f"sharp_enabled_group={sharp_enabled_group!r} is only valid with use_sharp=True",
                field="sharp_enabled_group",
                value=sharp_enabled_group,
            )
        return None
    if sharp_enabled_group is None:
        return "dp"
    if sharp_enabled_group not in ("dp", "dp_replica"):
        raise MegatronConfigError(
            f"sharp_enabled_group must be 'dp' or 'dp_replica', got {sharp_enabled_group!r}",
            field="sharp_enabled_group",
            value=sharp_enabled_group,
        )
    if sharp_enabled_group == "dp_replica" and not num_distributed_optimizer_instances > 1:
        raise MegatronConfigError(
            "sharp_enabled_group='dp_replica' needs num_distributed_optimizer_instances > 1, got "
            f"{num_distributed_optimizer_instances}",
            field="num_distributed_optimizer_instances",
            value=num_distributed_optimizer_instances,
        )
    return sharp_enabled_group


def _high_priority_groups(high_priority_stream_groups: list[str] | None) -> tuple[str, ...]:
    """The group names, each one megatron-core creates. megatron-core ignores a name it does not
    know (a typo silently loses the high-priority stream); rankmesh refuses it, naming the groups
    ``get_nccl_options`` reads."""
    from rankmesh.megatron.layout import GROUP_DESCRIPTIONS

    names = as_sequence(
        () if high_priority_stream_groups is None else high_priority_stream_groups,
        "high_priority_stream_groups",
        "group names",
        noun="a list",
    )
    for i, pg_name in enumerate(names):
        check_str(pg_name, f"high_priority_stream_groups[{i}]")
        if pg_name not in GROUP_DESCRIPTIONS:
            raise UnknownNameError(
                f"high_priority_stream_groups[{i}] = {pg_name!r} is not a group megatron-core creates; "
                f"name some of {', '.join(GROUP_DESCRIPTIONS)}",
                field="high_priority_stream_groups",
                value=pg_name,
            )
    return tuple(names)


def _check_pp_backend(pipeline_model_parallel_comm_backend: str | None) -> None:
    if pipeline_model_parallel_comm_backend not in (None, "nccl", "ucc"):
        raise MegatronConfigError(
            f"pipeline_model_parallel_comm_backend must be None, 'nccl' or 'ucc', got "
            f"{pipeline_model_parallel_comm_backend!r}",
            field="pipeline_model_parallel_comm_backend",
            value=pipeline_model_parallel_comm_backend,
        )


def _reformed_world(world_size: int) -> Any:
    """The world of the re-form :mod:`rankmesh.recovery` made active for this default group, or
    None (nothing to read unless that module was imported)."""
    world = active_world(world_size)
    if world is not None and not world.in_rank_order:
        from rankmesh.errors import ReformError

        raise ReformError(
            "Megatron goes by each rank's place in its sorted group (its pipeline stage, tp rank), which a "
            "re-formed world that renumbered the survivors around a spare does not keep; re-form with "
            'rankmesh.recovery.hot_spare(..., renumber="fill") (the spare takes the failed rank\'s number)',
            field="renumber",
            value="shift",
        )
    return world


def _distributed(ps: Any) -> tuple[int, int]:
    """(world size, rank) of the default group; refused when torch.distributed is not initialised
    or model parallelism already is."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise MegatronStateError(
            "torch.distributed is not initialised; call torch.distributed.init_process_group(...) "
            "before initialize_model_parallel",
            field="default_group",
            value=None,
        )
    for name in MUST_BE_UNSET:
        if getattr(ps, name, None) is not None:
            raise MegatronStateError(
                f"model parallelism is already initialised (parallel_state.{name} is set); call "
                "destroy_model_parallel() first",
                field=name,
                value=getattr(ps, name),
            )
    return dist.get_world_size(), dist.get_rank()


def _check_hybrid_cp(hybrid_context_parallel: bool, dp: int, cp: int) -> None:
    if hybrid_context_parallel and (dp * cp) % 2:
        raise MegatronConfigError(
            f"hybrid context parallel requires an even number of dp*cp ranks, got {dp}*{cp} = {dp * cp}",
            field="hybrid_context_parallel",
            value=dp * cp,
        )


def _check_ucc(pipeline_model_parallel_comm_backend: str | None, max_connections: str | None) -> None:
    """The UCC pipeline backend needs ``CUDA_DEVICE_MAX_CONNECTIONS`` (``max_connections``) > 1."""
    if pipeline_model_parallel_comm_backend == "ucc" and max_connections == "1":
        raise MegatronConfigError(
            "the UCC pipeline backend needs CUDA_DEVICE_MAX_CONNECTIONS > 1 (it is 1), or its "
            "communication is serialised; unset it or set it to e.g. 8",
            field="CUDA_DEVICE_MAX_CONNECTIONS",
            value=max_connections,
        )


def _nccl_comm_cfgs(nccl_communicator_config_path: str | None) -> dict[str, Any]:
    """The NCCL communicator configs from the YAML file, as megatron-core reads them ({} without one)."""
    if nccl_communicator_config_path is None:
        return {}
    try:
        import yaml
    except ImportError:
        raise RuntimeError(
            "Cannot import `yaml`. Setting custom nccl communicator configs requires the yaml package."
        ) from None
    with open(nccl_communicator_config_path) as stream:
        return yaml.safe_load(stream) or {}


def _check_embedding_ranks(m: Any, rank: int) -> None:
    """The embedding-rank functions return distinct ranks of the pipeline group they are given."""
    pp_ranks = m.decoder.my_group(rank, "pp").tolist()
    for name in ("embd", "pos_embd"):
        fn = m.get_embedding_ranks if name == "embd" else m.get_position_embedding_ranks
        got = [int(r) for r in fn(pp_ranks)]
        if not set(got) <= set(pp_ranks) or len(set(got)) != len(got) or not got:
            raise MegatronConfigError(
                f"get_{'' if name == 'embd' else 'position_'}embedding_ranks({pp_ranks[:8]}) returned "
                f"{got[:8]}: it must return distinct ranks of the pipeline group it is given",
                field="get_embedding_ranks" if name == "embd" else "get_position_embedding_ranks",
                value=got[:8],
            )


def _install(c: Checked, new: dict[str, Any], hybrid: dict[int, Any], builder: Any) -> None:
    """Sets megatron-core's ``parallel_state`` globals all at once, as its own call leaves them."""
    import torch.distributed as dist

    ps = c.ps
    if c.virtual_pipeline_model_parallel_size is not None:
        new["_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK"] = 0
        new["_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE"] = c.virtual_pipeline_model_parallel_size
    for name, value in new.items():
        setattr(ps, name, value)
    ps._HYBRID_DP_CP_GROUPS.update(hybrid)
    # update_pg_timeout() walks this list (None stands for the default group).
    seen: set[int] = set()
    groups: list[Any] = [None]
    for value in [*new.values(), *new.get("_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS", []), *hybrid.values()]:
        if isinstance(value, dist.ProcessGroup) and value is not dist.group.WORLD and id(value) not in seen:
            seen.add(id(value))
            groups.append(value)
    ps._global_process_group_list = groups
    ps._set_global_memory_buffer()

    global _last_builder
    _last_builder = builder


def destroy_model_parallel() -> None:
    """megatron-core's ``parallel_state.destroy_model_parallel()`` (it resets the globals and
    destroys the gloo groups), and rankmesh forgets the groups of the last initialisation."""
    global _last_builder
    parallel_state().destroy_model_parallel()
    _last_builder = None


def last_build_report():
    """The :class:`~rankmesh.BuildReport` of the last :func:`initialize_model_parallel` on this
    rank (process groups created, by backend), or None."""
    return None if _last_builder is None else _last_builder.report()
