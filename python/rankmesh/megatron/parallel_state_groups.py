"""The ``parallel_state`` globals :func:`~rankmesh.megatron.initialize_model_parallel` sets, in one
table (:data:`GLOBALS`: which group of :class:`~rankmesh.ModelParallelLayout` each holds, and how),
and :func:`make_groups`, which makes this rank's groups for them in megatron-core's creation order,
with the steps megatron-core takes between them (SHARP, the hybrid-cp groups, the UCC
environment). :mod:`rankmesh.megatron.parallel_state` checks the arguments before and installs
the globals after; torch is imported only once groups are made.
"""

from __future__ import annotations

import datetime
import math
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["GLOBALS", "MUST_BE_UNSET", "Checked", "make_groups"]

# What the UCC pipeline backend needs in the environment (kept when already set), as
# megatron-core 0.16 sets it up.
_UCC_ENV_DEFAULTS = {
    "TORCH_UCC_BLOCKING_WAIT": "none",
    "UCC_EC_CUDA_STREAM_TASK_MODE": "driver",
    "UCX_TLS": "ib,cuda_copy",
}
_UCC_ENV_FORCED = {
    "NSYS_UCP_COMM_PARAMS": "1",
    "UCX_RNDV_THRESH": "0",
    "UCX_NET_DEVICES": "all",
    "UCC_CL_BASIC_TLS": "^sharp,nccl",
}

_OWN = object()  # _Maker.make(): the NCCL options configured for the group's own name


@dataclass(frozen=True)
class Checked:
    """What :mod:`~rankmesh.megatron.parallel_state` checks leave for :func:`make_groups` and for
    installing the globals: the arguments checked and resolved, and megatron-core's
    ``parallel_state`` module."""

    ps: Any
    m: Any  # rankmesh.megatron.layout.ModelParallelLayout
    world_size: int
    rank: int
    sharp_enabled_group: str | None
    nccl_comm_cfgs: dict[str, Any]
    timeout: datetime.timedelta
    gloo: bool
    create_all_gather_group: bool | None
    hybrid_context_parallel: bool
    pp_backend: str | None
    virtual_pipeline_model_parallel_size: int | None


class _Global(NamedTuple):
    """One ``parallel_state`` global that ``initialize_model_parallel`` sets: its ``name``, the
    group of :class:`~rankmesh.ModelParallelLayout` behind it, and ``what`` of that group it holds:

    - ``"group"``: the group, with megatron-core's description of it and the NCCL options
      configured for its name (``"pipeline"``: the same on the pipeline backend, no options on UCC);
    - ``"gloo"``: its gloo twin (None without ``create_gloo_process_groups``), no options, and no
      timeout where ``timeout`` is False; ``"all_gather"``: its all-gather twin (None without
      ``create_all_gather_group``). A twin's description is ``desc``, else its global's name
      without the leading underscore;
    - ``"ranks"``: its members, a list (None off the embedding ranks);
    - ``"levels"``: its hierarchical levels, a list of groups (set only with hierarchical cp).

    ``unset``: megatron-core asserts it is None before it builds anything. ``partial``: a
    partial-DistOpt global, which with one instance is the global ``alias`` names (or left unset).
    """

    name: str
    group: str
    what: str = "group"
    unset: bool = False
    desc: str | None = None
    timeout: bool = True
    partial: bool = False
    alias: str | None = None


#: Every ``parallel_state`` global ``initialize_model_parallel`` sets, in megatron-core's
#: creation order, in the stretches :func:`make_groups` takes steps between: the one table behind the
#: globals checked unset, the groups made and the globals installed.
GLOBALS: dict[str, tuple[_Global, ...]] = {
    # with SHARP on dp, dp-cp is the first communicator made
    "dp_cp": (
        _Global("_DATA_PARALLEL_GROUP_WITH_CP", "dp_cp"),
        _Global("_DATA_PARALLEL_GROUP_WITH_CP_AG", "dp_cp", "all_gather"),
        _Global("_DATA_PARALLEL_GROUP_WITH_CP_GLOO", "dp_cp", "gloo"),
        _Global("_DATA_PARALLEL_GLOBAL_RANKS_WITH_CP", "dp_cp", "ranks"),
        _Global(
            "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
            "intra_dp_cp",
            partial=True,
            alias="_DATA_PARALLEL_GROUP_WITH_CP",
        ),
        _Global(
            "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
            "intra_dp_cp",
            "gloo",
            partial=True,
            alias="_DATA_PARALLEL_GROUP_WITH_CP_GLOO",
        ),
    ),
    # after the hybrid-cp groups
    "dense": (
        _Global("_DATA_PARALLEL_GROUP", "dp", unset=True),
        _Global("_DATA_PARALLEL_GROUP_GLOO", "dp", "gloo"),
        _Global("_DATA_PARALLEL_GLOBAL_RANKS", "dp", "ranks"),
        _Global("_CONTEXT_PARALLEL_GROUP", "cp", unset=True),
        _Global("_CONTEXT_PARALLEL_GLOBAL_RANKS", "cp", "ranks"),
        _Global("_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS", "hcp", "levels"),
        _Global("_MODEL_PARALLEL_GROUP", "mp", unset=True),
        _Global("_MODEL_PARALLEL_GLOBAL_RANKS", "mp", "ranks"),
        _Global("_TENSOR_MODEL_PARALLEL_GROUP", "tp", unset=True),
        _Global("_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS", "tp", "ranks"),
    ),
    # once the UCC environment is set
    "pipeline_on": (
        _Global("_PIPELINE_MODEL_PARALLEL_GROUP", "pp", "pipeline", unset=True),
        _Global("_PIPELINE_GLOBAL_RANKS", "pp", "ranks"),
        _Global("_EMBEDDING_GROUP", "embd", unset=True),
        _Global("_EMBEDDING_GLOBAL_RANKS", "embd", "ranks"),
        _Global("_POSITION_EMBEDDING_GROUP", "pos_embd", unset=True),
        _Global("_POSITION_EMBEDDING_GLOBAL_RANKS", "pos_embd", "ranks"),
        _Global("_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "tp_dp_cp"),
        _Global("_TENSOR_AND_DATA_PARALLEL_GROUP", "tp_dp", unset=True),
        _Global("_TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp_cp", unset=True),
        _Global("_EXPERT_MODEL_PARALLEL_GROUP", "ep", unset=True),
        _Global("_EXPERT_MODEL_PARALLEL_RANKS", "ep", "ranks"),
        _Global("_EXPERT_TENSOR_PARALLEL_GROUP", "ep_tp", unset=True),
        _Global("_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "tp_ep_mp", unset=True),
        _Global("_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "tp_ep_pp", unset=True),
        _Global("_EXPERT_DATA_PARALLEL_GROUP", "ep_dp", unset=True),
        # megatron-core gives this gloo group no timeout (the backend's default)
        _Global("_EXPERT_DATA_PARALLEL_GROUP_GLOO", "ep_dp", "gloo", unset=True, timeout=False),
    ),
    # with SHARP on dp_replica, the expert dp's levels (megatron-core also creates a level-1 gloo
    # group but keeps no reference to it: not made here)
    "partial_expert_dp": (
        _Global(
            "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP",
            "intra_ep_dp",
            unset=True,
            partial=True,
            alias="_EXPERT_DATA_PARALLEL_GROUP",
        ),
        _Global(
            "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP_GLOO",
            "intra_ep_dp",
            "gloo",
            unset=True,
            desc="HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_GLOO_L0",
            partial=True,
            alias="_EXPERT_DATA_PARALLEL_GROUP_GLOO",
        ),
        _Global("_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP", "inter_ep_dp", unset=True, partial=True),
    ),
    "last": (_Global("_INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "intra_dist_opt_instance", unset=True),),
}
#: The globals megatron-core asserts are None before it builds anything.
MUST_BE_UNSET: tuple[str, ...] = tuple(g.name for stretch in GLOBALS.values() for g in stretch if g.unset)


def make_groups(c: Checked) -> tuple[dict[str, Any], dict[int, Any], Any]:
    """This rank's groups, in megatron-core's creation order (:data:`GLOBALS`, with its steps
    between the stretches): the ``parallel_state`` globals to set, the hybrid-cp groups by size,
    and the builder that made them."""
    # SHARP may only be enabled for the first communicator created with NCCL_COLLNET_ENABLE=1.
    os.environ.pop("NCCL_COLLNET_ENABLE", None)
    make = _Maker(c)
    make.sharp_on("dp")
    make.put(GLOBALS["dp_cp"])
    make.sharp_made("dp", "_DATA_PARALLEL_GROUP_WITH_CP")
    hybrid = make.hybrid_groups()
    make.put(GLOBALS["dense"])
    if c.pp_backend == "ucc":
        for key, value in _UCC_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        os.environ.update(_UCC_ENV_FORCED)
    make.put(GLOBALS["pipeline_on"])
    make.sharp_on("dp_replica")  # refused unless num_distributed_optimizer_instances > 1
    make.put(GLOBALS["partial_expert_dp"])
    make.sharp_made("dp_replica", "_INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP")
    make.put(GLOBALS["last"])
    return make.new, hybrid, make.builder


class _Maker:
    """Makes this rank's groups of the checked configuration ``c`` on one builder, for
    :func:`make_groups`, and keeps the ``parallel_state`` globals set so far in :attr:`new`."""

    def __init__(self, c: Checked) -> None:
        from rankmesh.megatron import groups

        self.c, self.m, self.rank = c, c.m, c.rank
        # megatron-core's one-rank groups are real groups: the builder's size-1 rule says so
        self.builder = groups.mesh_builder(c.m, size_one_fake=False)
        self.new: dict[str, Any] = {}

    def options(self, cfg_name: str) -> Any:
        return self.c.ps.get_nccl_options(cfg_name, self.c.nccl_comm_cfgs)

    def make(
        self,
        name: str,
        desc: str | None = None,
        *,
        backend: str | None = None,
        pg_options: Any = _OWN,
        with_timeout: bool = True,
        tag: str | None = None,
    ) -> Any:
        """``rank``'s group ``name`` (None for embedding groups it is not in). By default it
        carries megatron-core's description of the group and the NCCL options configured for
        ``name``; gloo twins pass their own description and no options."""
        from rankmesh.megatron import groups
        from rankmesh.megatron.layout import GROUP_DESCRIPTIONS

        kw = dict(
            backend=backend,
            pg_options=self.options(name) if pg_options is _OWN else pg_options,
            timeout=self.c.timeout if with_timeout else None,
            group_desc=GROUP_DESCRIPTIONS[name] if desc is None else desc,
            tag=tag,
        )
        return groups.group(self.builder, self.m, self.rank, name, **kw)

    def ranks(self, name: str) -> list[int] | None:
        g = self.m.group(self.rank, name)
        return None if g is None else g.tolist()

    def put(self, stretch: tuple[_Global, ...]) -> None:
        """Sets the globals of ``stretch``, in order, in :attr:`new`."""
        for g in stretch:
            if g.partial and self.m.num_distributed_optimizer_instances == 1:
                if g.alias is not None:
                    self.new[g.name] = self.new[g.alias]
            elif g.what != "levels" or self.m.hierarchical_context_parallel_sizes:
                self.new[g.name] = self.value(g)

    def value(self, g: _Global) -> Any:
        """What global ``g`` holds: a group, a twin, a list of ranks or of groups."""
        c, twin = self.c, g.desc or g.name[1:]
        if g.what == "ranks":
            return self.ranks(g.group)
        if g.what == "gloo":
            return self.make(g.group, twin, backend="gloo", pg_options=None, with_timeout=g.timeout) if c.gloo else None
        if g.what == "all_gather":
            return self.make(g.group, twin, tag="all_gather") if c.create_all_gather_group else None
        if g.what == "levels":  # hcp_l0, hcp_l1, ... on the NCCL options of hcp
            from rankmesh.megatron.layout import GROUP_DESCRIPTIONS

            desc = GROUP_DESCRIPTIONS[g.group]  # ..._L<level>
            return [
                self.make(f"{g.group}_l{i}", desc.replace("<level>", str(i)), pg_options=self.options(g.group))
                for i in range(len(self.m.hierarchical_context_parallel_sizes))
            ]
        if g.what == "pipeline":
            return self.make(g.group, backend=c.pp_backend, pg_options=None if c.pp_backend == "ucc" else _OWN)
        return self.make(g.group)

    def sharp_on(self, group: str) -> None:
        """With SHARP enabled for ``group``, the communicators made next may use it."""
        if self.c.sharp_enabled_group == group:
            os.environ["NCCL_COLLNET_ENABLE"] = "1"

    def sharp_made(self, group: str, first: str) -> None:
        """NCCL creates communicators lazily: with SHARP enabled for ``group``, one collective on
        the global ``first`` makes the SHARP-enabled communicator now; later ones may not use it."""
        if self.c.sharp_enabled_group != group:
            return
        import torch
        import torch.distributed as dist

        dist.barrier(group=self.new[first], device_ids=[torch.cuda.current_device()])
        torch.cuda.synchronize()
        os.environ.pop("NCCL_COLLNET_ENABLE", None)

    def hybrid_groups(self) -> dict[int, Any]:
        """The hybrid-cp groups, by size (none without ``hybrid_context_parallel``)."""
        hybrid: dict[int, Any] = {}
        if not self.c.hybrid_context_parallel:
            return hybrid
        dp_cp = self.ranks("dp_cp")
        pos = dp_cp.index(self.rank)
        for size in [2**i for i in range(int(math.log2(len(dp_cp))))][1:]:
            start = (pos // size) * size
            hybrid[size] = self.builder.subset_group(
                ("hybrid_dp_cp", size),
                dp_cp[start : start + size],
                name=f"hybrid_dp_cp_{size}",
                pg_options=self.options("dp_cp"),
                group_desc=f"HYBRID_DP_CP_GROUP_{size}",
            )
        return hybrid
