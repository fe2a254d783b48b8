"""Megatron-core's ``initialize_model_parallel`` as layouts (torch-free): the table of every group
it creates and :class:`ModelParallelLayout`, which answers each of them per rank from the dense and
expert :class:`~rankmesh.megatron.generator.RankGenerator` that :func:`model_parallel_layout`
builds once the call's order rules (:mod:`rankmesh.megatron.order`) have passed. How an order
string such as ``"tp-cp-ep-dp-pp"`` maps to a mesh, with a worked example, is in
:mod:`rankmesh.megatron`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rankmesh._check import check_degrees, check_str, degree_fix, positive_int
from rankmesh._native import MeshLayout
from rankmesh.errors import IncompatibleLayoutError, ParallelConfigError, UnknownNameError
from rankmesh.megatron.generator import RankGenerator, rank_arg
from rankmesh.megatron.order import DEFAULT_ORDER, MEGATRON_DIMS, LayoutCheck, order_problem, working_order

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


def default_embedding_ranks(pp_ranks: Sequence[int]) -> list[int]:
    """Megatron's default: word embeddings live on the first and last pipeline stages."""
    pp_ranks = list(pp_ranks)
    return [pp_ranks[0]] if len(pp_ranks) == 1 else [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks(pp_ranks: Sequence[int]) -> list[int]:
    """Megatron's default: position embeddings live on the first pipeline stage."""
    return [list(pp_ranks)[0]]


# -----------------------------------------------------------------------------------------------
# initialize_model_parallel's groups
# -----------------------------------------------------------------------------------------------


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

    def __init__(self, desc: str) -> None:
        #: What the group is, in Megatron's words (its ``group_desc``).
        self.desc = desc

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

    def __init__(self, desc: str, generator: str, token: str) -> None:
        super().__init__(desc)
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
        desc: str,
        generator: str,
        token: str,
        sizes: Callable[[ModelParallelLayout], Sequence[int]],
        level: int,
        when: Callable[[ModelParallelLayout], bool] | None = None,
    ) -> None:
        super().__init__(desc)
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

    def __init__(
        self, desc: str, generator: str, token: str, sizes: Callable[[ModelParallelLayout], Sequence[int]]
    ) -> None:
        super().__init__(desc)
        self.generator, self.tok, self.sizes = generator, token, sizes

    def expand(self, m: ModelParallelLayout, key: str) -> dict[str, _Group]:
        levels = range(len(self.sizes(m)))
        return {
            f"{key}_l{i}": _Level(self.desc.replace("<level>", str(i)), self.generator, self.tok, self.sizes, i)
            for i in levels
        }


class _Embedding(_Group):
    """The word or position embedding group: the ranks ``m.<ranks_fn>`` picks from the caller's
    pipeline group; None on a rank that holds no embedding (Megatron leaves the global None)."""

    partition = False

    def __init__(self, desc: str, ranks_fn: str, default: Callable[[Sequence[int]], list[int]], max_pp: int) -> None:
        super().__init__(desc)
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
#: own NCCL-config names, with its description: the one table behind :data:`GROUP_DESCRIPTIONS`
#: and :meth:`ModelParallelLayout.group`, ``layout``, ``all_groups``, ``token`` and ``group_names``.
_GROUPS: dict[str, _Group] = {
    "dp_cp": _Token("DATA_PARALLEL_GROUP_WITH_CP", "decoder", "dp-cp"),
    "intra_dp_cp": _Level("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "decoder", "dp-cp", _partial_dp, 0),
    "dp": _Token("DATA_PARALLEL_GROUP", "decoder", "dp"),
    "cp": _Token("CONTEXT_PARALLEL_GROUP", "decoder", "cp"),
    # hcp_l0, hcp_l1, ... with hierarchical cp
    "hcp": _Levels("HIERARCHICAL_CONTEXT_PARALLEL_GROUP_L<level>", "decoder", "cp", _hierarchical_cp),
    "mp": _Token("MODEL_PARALLEL_GROUP", "decoder", "tp-pp"),
    "tp": _Token("TENSOR_MODEL_PARALLEL_GROUP", "decoder", "tp"),
    "pp": _Token("PIPELINE_MODEL_PARALLEL_GROUP", "decoder", "pp"),
    "embd": _Embedding("EMBEDDING_GROUP", "get_embedding_ranks", default_embedding_ranks, max_pp=2),
    "pos_embd": _Embedding(
        "POSITION_EMBEDDING_GROUP", "get_position_embedding_ranks", default_position_embedding_ranks, max_pp=1
    ),
    "tp_dp_cp": _Token("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "decoder", "tp-dp-cp"),
    "tp_dp": _Token("TENSOR_AND_DATA_PARALLEL_GROUP", "decoder", "tp-dp"),
    "tp_cp": _Token("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "decoder", "tp-cp"),
    "ep": _Token("EXPERT_MODEL_PARALLEL_GROUP", "expert", "ep"),
    "ep_tp": _Token("EXPERT_TENSOR_PARALLEL_GROUP", "expert", "tp"),
    "tp_ep_mp": _Token("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "expert", "tp-ep"),
    "tp_ep_pp": _Token("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "expert", "tp-ep-pp"),
    "ep_dp": _Token("EXPERT_DATA_PARALLEL_GROUP", "expert", "dp"),
    # megatron's partial-DistOpt expert dp levels (it aliases intra_ep_dp to ep_dp when n == 1)
    "intra_ep_dp": _Level("HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0", "expert", "dp", _partial_expert_dp, 0),
    "inter_ep_dp": _Level(
        "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1", "expert", "dp", _partial_expert_dp, 1, when=_partial_dist_opt
    ),
    "intra_dist_opt_instance": _DistOptInstance("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"),
}

#: What each group is, in Megatron's words (its ``group_desc``).
GROUP_DESCRIPTIONS: dict[str, str] = {key: entry.desc for key, entry in _GROUPS.items()}


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
        rank = rank_arg(rank, "ModelParallelLayout.group", "name")
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
    :class:`~rankmesh.errors.SizeMismatchError` (a ``RuntimeError``, like Megatron; ``field`` is
    ``"world_size"``, ``value`` the world size) when ``world_size`` is not a multiple of tp*pp*cp
    or of expert_tp*ep*pp: rankmesh's one class for degrees that do not fit the world, in every
    convention. Raises :class:`~rankmesh.errors.ParallelConfigError` (a ``RuntimeError``, like
    Megatron) when a virtual pipeline is asked without pp > 1; and its subclass
    :class:`~rankmesh.errors.MegatronConfigError` (also an ``AssertionError``, like Megatron's
    asserts) when the order does not end with pp and pp > 1 and the dense and expert dp sizes
    differ, when the dense and expert pipeline groups differ (both of kind ``"order_pp_not_last"``;
    these and an order that leaves out a dim carry the order that works for this call,
    :func:`~rankmesh.megatron.working_order`'s, in ``e.ctx["works"]``, or None), when dp*cp or the
    expert dp is not a multiple of ``num_distributed_optimizer_instances``, and when the
    hierarchical cp sizes do not multiply to cp. A degree that is not an int raises
    :class:`~rankmesh.errors.ArgumentTypeError` (a ``TypeError``) and one < 1
    :class:`~rankmesh.errors.InvalidSizeError`.

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
    check = _layout_check(
        world_size,
        tensor_model_parallel_size,
        pipeline_model_parallel_size,
        context_parallel_size,
        expert_model_parallel_size,
        expert_tensor_parallel_size,
        num_distributed_optimizer_instances,
        hierarchical_context_parallel_sizes,
        virtual_pipeline_model_parallel_size,
        world,
    )
    names = check.checked_names(order)  # every check of this call, in its order, before any generator is built
    if world is None:
        world = MeshLayout.world(check.world_size)
    assert check.expert is not None  # the order passed: the expert degrees fit the world
    return ModelParallelLayout(
        RankGenerator._checked(check.dense, names, world),
        RankGenerator._checked(check.expert, names, world),
        num_distributed_optimizer_instances=check.n_do,
        hierarchical_context_parallel_sizes=hierarchical_context_parallel_sizes,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        get_embedding_ranks=get_embedding_ranks,
        get_position_embedding_ranks=get_position_embedding_ranks,
    )


def _layout_check(
    world_size: Any, tp: Any, pp: Any, cp: Any, ep: Any, etp: Any, n_do: Any, hcp: Any, vpp: Any, world: Any
) -> LayoutCheck:
    """The check of one :func:`model_parallel_layout` call (its arguments in order, by their short
    names): each degree an int >= 1, named by its argument (``etp``: tp when None), and their
    products within a world's reach; what does not fit raises here."""
    world_size = positive_int(world_size, "world_size")
    tp = positive_int(tp, "tensor_model_parallel_size", fix=degree_fix("tp", "tensor_model_parallel_size"))
    pp = positive_int(pp, "pipeline_model_parallel_size", fix=degree_fix("pp", "pipeline_model_parallel_size"))
    cp = positive_int(cp, "context_parallel_size", fix=degree_fix("cp", "context_parallel_size"))
    ep = positive_int(ep, "expert_model_parallel_size", fix=degree_fix("ep", "expert_model_parallel_size"))
    etp_field = "tensor_model_parallel_size" if etp is None else "expert_tensor_parallel_size"
    if etp is None:
        etp = tp
    else:
        etp = positive_int(etp, "expert_tensor_parallel_size", fix=degree_fix("etp", "expert_tensor_parallel_size"))
    n_do = positive_int(n_do, "num_distributed_optimizer_instances")
    # overflows first, each naming the degree that overflows the running product (as
    # MeshLayout.unflatten names the size), before the degrees are compared with the world
    check_degrees([("world_size", world_size)])
    check_degrees(
        [("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp), ("context_parallel_size", cp)]
    )
    check_degrees([(etp_field, etp), ("expert_model_parallel_size", ep), ("pipeline_model_parallel_size", pp)])
    return LayoutCheck(world_size, tp, pp, cp, ep, etp, world, n_do=n_do, hcp=hcp, vpp=vpp)
