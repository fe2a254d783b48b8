"""The all-ranks agreement check: every rank of a world takes the same collective steps.

A hang at init comes from ranks that disagree about the sequence of collective calls: the
world-collective ``split_group`` calls on a bound device (torch 2.15's default ``nccl``), or two
member-only ``new_group`` rendezvous that two ranks enter in opposite orders, or a group two
members name differently. rankmesh's design rests on "every rank creates groups in the same order
and takes the same group-naming steps, also for groups it is not in"; this module checks it for
every rank of a world, one road at a time, in one process on the fake backend.

**The recorder** (:func:`record`) watches the transport, never the code that decides: it wraps
torch's ``ProcessGroup.split_group`` (the split every road's ``split_group`` ends in, member or
NOCOLOR non-member) and ``distributed_c10d._new_process_group_helper`` (where every ``new_group``
ends, torch's and rankmesh's), and hands the world a store that logs every key it is asked for.
Each :class:`Step` holds the kind, the parent (splits), the members computed (or NOCOLOR), the
group name drawn, the backend and options, and torch's group counter at that step. rankmesh's own
functions are not touched, so the code path is the one a job takes.

**The check** (:func:`check_road`) runs a road (:data:`ROADS`: a function of the world size, the
rank and a configuration that builds what a job builds) for every rank of the world, re-initialising
the fake world per rank (``split=True``: a default group bound to a device, so every group is a
split of it), and asserts:

- every rank takes the same sequence of world-collective steps (splits, and ``new_group`` calls a
  non-member makes): the same count, in the same order, with the same parents;
- in each split, the ranks that give one colour are exactly that colour's members, and they draw
  one name;
- every member-only group is computed identically by each of its members (members, name, backend,
  options), and by no one else;
- any two ranks that share two or more member-only groups create them in the same relative order;
- every rank ends with the same group counter (non-members of a partial mesh take the members'
  naming steps), and a configuration a road refuses is refused on every rank with the same error.

A failure raises :class:`Disagreement` naming the road, the rank, the step and what differs.
Run by hand at a larger world: ``python -m tests.agreement --road parallel_dims --world 65536``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import itertools
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
from torch.distributed import distributed_c10d as c10d

NOCOLOR = "NOCOLOR"
_SPLIT_BACKEND = "meshfakesplit"  # the fake group registered for cpu and cuda (tests/conftest.py)


class Disagreement(AssertionError):
    """Two ranks of a world disagree about a collective step (see the module)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective step of one rank. ``members`` is a digest of the members computed (NOCOLOR
    for a split this rank is not in); :data:`MEMBERS` maps it to the members."""

    kind: str  # "split", "new_group" or "store"
    parent: str  # the parent group's name (splits), the op (store), "" otherwise
    members: str
    name: str
    backend: str = ""
    options: str = ""
    counter: int = 0
    member: bool = True
    width: int = 0  # the parent's size (splits): a split of a one-rank group is local, not collective


#: digest -> the sorted members it stands for (one copy per distinct group of a check).
MEMBERS: dict[str, tuple[int, ...]] = {}


def _digest(ranks: Any) -> str:
    members = np.sort(np.asarray(ranks, dtype=np.int64))
    key = hashlib.blake2b(members.tobytes(), digest_size=8).hexdigest()
    if key not in MEMBERS:
        MEMBERS[key] = tuple(members.tolist())
    return key


class _RecordingStore(dist.Store):
    """A store that logs every key it is asked for (the fake backend asks for none, but a road or
    torch's barrier might), answering like an in-memory store."""

    def __init__(self, steps: list[Step]) -> None:
        super().__init__()
        self._data: dict[str, bytes] = {}
        self._steps = steps

    def _log(self, op: str, key: Any) -> None:
        self._steps.append(Step("store", op, "", str(key), counter=_salt()))

    def set(self, key, value):  # noqa: ANN001, ANN201
        self._log("set", key)
        self._data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):  # noqa: ANN001, ANN201
        self._log("get", key)
        return self._data.get(key, b"")

    def add(self, key, amount):  # noqa: ANN001, ANN201
        self._log("add", key)
        value = int(self._data.get(key, b"0")) + int(amount)
        self._data[key] = str(value).encode()
        return value

    def check(self, keys):  # noqa: ANN001, ANN201
        self._log("check", tuple(keys))
        return all(k in self._data for k in keys)

    def wait(self, keys, timeout=None):  # noqa: ANN001, ANN201
        self._log("wait", tuple(keys))

    def compare_set(self, key, expected, desired):  # noqa: ANN001, ANN201
        self._log("compare_set", key)
        self._data[key] = desired
        return desired

    def delete_key(self, key):  # noqa: ANN001, ANN201
        self._log("delete_key", key)
        return self._data.pop(key, None) is not None

    def num_keys(self):  # noqa: ANN201
        return len(self._data)

    def set_timeout(self, timeout):  # noqa: ANN001, ANN201
        pass


def _salt() -> int:
    """What torch salts the next hashed group name with (2.14+: the group counter every name draw
    moves; 2.13: the number of groups registered): the naming step every rank must take alike."""
    from rankmesh._fast_groups_check import salt

    return salt()


def _options(pg_options: Any, timeout: Any) -> str:
    seconds = None if timeout is None else timeout.total_seconds()
    return f"{type(pg_options).__name__ if pg_options is not None else None} {seconds}"


@contextlib.contextmanager
def record() -> Iterator[list[Step]]:
    """Record every collective step taken inside the block (see the module); yields the list the
    steps are appended to."""
    steps: list[Step] = []
    # the class's own entry (pybind's instancemethod): getattr on the class would give the unbound
    # builtin, which put back would no longer bind self
    split_entry = dist.ProcessGroup.__dict__["split_group"]
    split = dist.ProcessGroup.split_group
    helper = c10d._new_process_group_helper

    def recorded_split(self, ranks, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        me = c10d._get_default_group().rank()
        member = me in ranks
        options = _options(kwargs.get("opts"), kwargs.get("timeout"))
        name = str(kwargs.get("group_name", ""))
        colour = _digest(ranks) if member else NOCOLOR
        count = _salt()
        steps.append(Step("split", self.group_name, colour, name, "", options, count, member, self.size()))
        return split(self, ranks, *args, **kwargs)

    def recorded_helper(group_size, group_rank, global_ranks, backend, store, group_name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if c10d._world.default_pg is not None:  # the default group itself is no step
            me = c10d._get_default_group().rank()
            options = _options(kwargs.get("backend_options"), kwargs.get("timeout"))
            count = _salt()
            members = _digest(global_ranks)
            steps.append(
                Step("new_group", "", members, str(group_name), str(backend), options, count, me in global_ranks)
            )
        return helper(group_size, group_rank, global_ranks, backend, store, group_name, *args, **kwargs)

    dist.ProcessGroup.split_group = recorded_split
    c10d._new_process_group_helper = recorded_helper
    try:
        yield steps
    finally:
        dist.ProcessGroup.split_group = split_entry
        c10d._new_process_group_helper = helper


@dataclasses.dataclass
class RankRun:
    """What one rank did: its steps, the error class it raised (or ""), its final group counter."""

    rank: int
    steps: list[Step]
    raised: str
    counter: int


def run_rank(road: Callable[[int, int, dict], Any], world: int, rank: int, cfg: dict, *, split: bool) -> RankRun:
    """``road(world, rank, cfg)`` on ``rank`` of a fresh fake world (bound to a device when
    ``split``), recorded."""
    hook = sys.excepthook  # torch prefixes it with the rank at every init: keep the process's own
    with record() as steps:
        store = _RecordingStore(steps)
        dist.init_process_group(_SPLIT_BACKEND if split else "fake", rank=rank, world_size=world, store=store)
        raised = ""
        try:
            if split:
                c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                road(world, rank, cfg)
        except Exception as e:  # noqa: BLE001 - a refusal is a step too: every rank must refuse alike
            raised = type(e).__name__
        counter = _salt()
        _cleanup()
    sys.excepthook = hook
    return RankRun(rank, steps, raised, counter)


_CLEANUPS: list[Callable[[], None]] = []


def _cleanup() -> None:
    for fn in _CLEANUPS:
        fn()
    if dist.is_initialized():
        dist.destroy_process_group()


# -- the checks ----------------------------------------------------------------------------------------


def _fail(road: str, rank: int, step: int | str, what: str) -> None:
    raise Disagreement(f"road {road!r}: rank {rank}, step {step}: {what}")


def check_runs(road: str, runs: list[RankRun]) -> dict[str, int]:
    """Every check of the module over one road's runs, one per rank of the world; returns counts."""
    first = runs[0]
    for r in runs:  # refusals, alike on every rank
        if r.raised != first.raised:
            _fail(
                road,
                r.rank,
                "end",
                f"raised {r.raised or 'nothing'} where rank {first.rank} raised {first.raised or 'nothing'}",
            )
    collective = {r.rank: [s for s in r.steps if _collective(s)] for r in runs}
    _check_collective_sequences(road, runs, collective)
    _check_split_colours(road, runs, collective)
    groups = _check_member_groups(road, runs)
    _check_relative_order(road, runs)
    for r in runs:
        if r.counter != first.counter:
            _fail(
                road,
                r.rank,
                "end",
                f"group counter {r.counter} where rank {first.rank} has {first.counter} "
                "(a rank skipped or added a group-naming step)",
            )
    keys = _check_store_keys(road, runs)
    return {"ranks": len(runs), "world_steps": len(collective[first.rank]), "member_groups": groups, "store_keys": keys}


def _check_store_keys(road: str, runs: list[RankRun]) -> int:
    """Every key a rank waits on or reads is written by some rank (a wait no one answers hangs)."""
    written = {s.name for r in runs for s in r.steps if s.kind == "store" and s.parent in ("set", "add", "compare_set")}
    for r in runs:
        for i, s in enumerate(r.steps):
            if s.kind == "store" and s.parent in ("wait", "get") and s.name not in written:
                _fail(road, r.rank, i, f"waits on store key {s.name} that no rank writes")
    return len(written)


def _collective(s: Step) -> bool:
    """A step every rank of its parent takes: a split of a group of two ranks or more (rankmesh's
    start-up probe splits a one-rank group of its own, once per process), or a ``new_group`` a
    non-member calls (torch's own world-wide ``new_group``)."""
    return (s.kind == "split" and s.width > 1) or (s.kind == "new_group" and not s.member)


def _check_collective_sequences(road: str, runs: list[RankRun], collective: dict[int, list[Step]]) -> None:
    ref = collective[runs[0].rank]
    for r in runs:
        mine = collective[r.rank]
        for i, (a, b) in enumerate(zip(mine, ref)):
            if (a.kind, a.parent) != (b.kind, b.parent):
                _fail(
                    road,
                    r.rank,
                    i,
                    f"world-collective step {a.kind} of {a.parent or a.name!r} where rank "
                    f"{runs[0].rank} takes {b.kind} of {b.parent or b.name!r}",
                )
        if len(mine) != len(ref):
            _fail(
                road,
                r.rank,
                min(len(mine), len(ref)),
                f"{len(mine)} world-collective steps where rank {runs[0].rank} takes {len(ref)}",
            )


def _check_split_colours(road: str, runs: list[RankRun], collective: dict[int, list[Step]]) -> None:
    n = len(collective[runs[0].rank])
    for i in range(n):
        by_colour: dict[str, list[int]] = {}
        names: dict[str, set[str]] = {}
        for r in runs:
            s = collective[r.rank][i]
            by_colour.setdefault(s.members, []).append(r.rank)
            if s.members != NOCOLOR:
                names.setdefault(s.members, set()).add(s.name)
        for colour, ranks in by_colour.items():
            if colour == NOCOLOR:
                continue
            members = MEMBERS[colour]
            if tuple(sorted(ranks)) != members:
                odd = sorted(set(ranks) ^ set(members))[0]
                _fail(
                    road,
                    odd,
                    i,
                    f"the split's colour {list(members[:8])}{'...' if len(members) > 8 else ''} "
                    f"is given by ranks {sorted(ranks)[:8]} but its members are {list(members[:8])}",
                )
            if len(names[colour]) != 1:
                _fail(road, ranks[0], i, f"the members of one split colour draw names {sorted(names[colour])}")


def _member_groups(r: RankRun) -> list[tuple[int, Step]]:
    """``r``'s member-only groups in creation order, each name once: rankmesh's start-up probe makes
    its first one-rank group twice under one name (torch's way, then its own, undoing the first),
    which no road can do (torch refuses a second group of a name)."""
    seen: set[str] = set()
    out = []
    for i, s in enumerate(r.steps):
        if s.kind == "new_group" and s.member and s.name not in seen:
            seen.add(s.name)
            out.append((i, s))
    return out


def _check_member_groups(road: str, runs: list[RankRun]) -> int:
    seen: dict[str, tuple[Step, int, list[int]]] = {}
    for r in runs:
        for i, s in _member_groups(r):
            hit = seen.get(s.name)
            if hit is None:
                seen[s.name] = (s, r.rank, [r.rank])
                continue
            ref, who, reporters = hit
            if (s.members, s.backend, s.options) != (ref.members, ref.backend, ref.options):
                _fail(
                    road,
                    r.rank,
                    i,
                    f"group {s.name!r} computed as {list(MEMBERS[s.members][:8])} "
                    f"({s.backend}, {s.options}) where rank {who} has {list(MEMBERS[ref.members][:8])} "
                    f"({ref.backend}, {ref.options})",
                )
            reporters.append(r.rank)
    for name, (s, who, reporters) in seen.items():
        members = MEMBERS[s.members]
        if tuple(sorted(reporters)) != members:
            missing = sorted(set(members) - set(reporters))
            extra = sorted(set(reporters) - set(members))
            rank = (missing or extra)[0]
            _fail(
                road,
                rank,
                name,
                f"group {name!r} of {list(members[:8])} is created by ranks {sorted(reporters)[:8]}: "
                f"{'missing ' + str(missing[:8]) if missing else ''}{' extra ' + str(extra[:8]) if extra else ''} "
                "(members name it differently, or a rank skipped it)",
            )
    return len(seen)


def _check_relative_order(road: str, runs: list[RankRun]) -> None:
    order: dict[tuple[str, str], tuple[bool, int]] = {}
    for r in runs:
        names = [s.name for _, s in _member_groups(r) if len(MEMBERS[s.members]) > 1]
        for a, b in itertools.combinations(names, 2):
            key, forward = ((a, b), True) if a < b else ((b, a), False)
            hit = order.get(key)
            if hit is None:
                order[key] = (forward, r.rank)
            elif hit[0] != forward:
                _fail(
                    road,
                    r.rank,
                    names.index(a),
                    f"creates {a!r} before {b!r}, rank {hit[1]} the other way round "
                    "(two member-only rendezvous in opposite orders: a hang)",
                )


# -- the roads ----------------------------------------------------------------------------------------


def _factors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _split_world(rng: random.Random, world: int, k: int) -> list[int]:
    """``k`` sizes multiplying to ``world``, some of them 1."""
    sizes = []
    rest = world
    for _ in range(k - 1):
        s = rng.choice(_factors(rest)[: max(1, len(_factors(rest)) // 2 + 1)])
        sizes.append(s)
        rest //= s
    sizes.append(rest)
    rng.shuffle(sizes)
    return sizes


def _tree_cfg(rng: random.Random, world: int) -> dict:
    names = ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    k = rng.randint(2, 5)
    shape = _split_world(rng, world, k)
    override = {names[i]: "fake" for i in range(k) if shape[i] == 1 and rng.random() < 0.5}
    return {"shape": shape, "names": names[:k], "override": override, "flatten": rng.random() < 0.7}


def road_tree(world: int, rank: int, cfg: dict) -> None:
    """``rankmesh.init_device_mesh`` and an FSDP2 / HSDP tree: ``_unflatten``, slices, ``_flatten``."""
    import rankmesh

    root = rankmesh.init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
    dense = root._unflatten(0, tuple(cfg["shape"]), tuple(cfg["names"]), backend_override=cfg["override"] or None)
    names = cfg["names"]
    if len(names) >= 3 and cfg["flatten"]:
        dense[names[1], names[2]]._flatten("dp")
    dense[names[-1]]
    rankmesh.init_device_mesh("cpu", tuple(cfg["shape"]), mesh_dim_names=tuple(names), size_one_fake=False)


def _partial_cfg(rng: random.Random, world: int) -> dict:
    half = world // rng.choice([2, 4])
    start = rng.choice([0, half, world - half])
    tp = rng.choice([t for t in (1, 2, 4, 8) if half % t == 0])
    return {"start": start, "size": half, "tp": tp, "teachers": rng.random() < 0.5}


def road_partial(world: int, rank: int, cfg: dict) -> None:
    """Meshes over part of the world (students, then teachers): every rank calls, members or not."""
    import rankmesh

    s, n, tp = cfg["start"], cfg["size"], cfg["tp"]
    students = rankmesh.init_device_mesh("cpu", (n // tp, tp), mesh_dim_names=("dp", "tp"), ranks=range(s, s + n))
    students["dp"]
    if cfg["teachers"] and n < world:
        other = 0 if s else n
        rankmesh.init_device_mesh("cpu", (n // tp, tp), mesh_dim_names=("dp", "tp"), ranks=range(other, other + n))


def _titan_cfg(rng: random.Random, world: int) -> dict:
    tp = rng.choice([t for t in (1, 2, 4, 8) if world % t == 0])
    pp = rng.choice([p for p in (1, 2, 4) if world % (tp * p) == 0])
    rest = world // (tp * pp)
    cp = rng.choice([c for c in (1, 2) if rest % c == 0])
    rest //= cp
    dp_replicate = rng.choice([d for d in (1, 2, 4) if rest % d == 0])
    dp_shard = rest // dp_replicate
    ep = rng.choice([e for e in (1, 2, 4, 8) if (dp_shard * cp) % e == 0])
    return dict(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp, ep=ep)


def road_parallel_dims(world: int, rank: int, cfg: dict) -> None:
    """rankmesh's ``ParallelDims`` (torchtitan 183a0d2's convention): ``build_mesh`` and every mesh."""
    import rankmesh

    pd = rankmesh.ParallelDims(**cfg, etp=1, world_size=world)
    pd.build_mesh("cpu")
    pd.get_all_one_dimensional_meshes()


def road_torchtitan(world: int, rank: int, cfg: dict) -> None:
    """torchtitan 0.3.0's own ``ParallelDims.build_mesh`` under the one switch."""
    import torchtitan.distributed.parallel_dims as tpd

    tpd.device_type = "cpu"
    pd = tpd.ParallelDims(**cfg, world_size=world)
    pd.build_mesh()
    pd.get_all_one_dimensional_meshes()


def road_torch_api(world: int, rank: int, cfg: dict) -> None:
    """torch's own API under the one switch, as transformers builds its meshes: two
    ``init_device_mesh`` calls with size-1 dims kept, a ``_flatten``, slices, ``DeviceMesh(mesh=)``."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    names = tuple(cfg["names"])
    mesh = init_device_mesh("cpu", tuple(cfg["shape"]), mesh_dim_names=names)
    if len(names) >= 2:
        mesh[names[-2], names[-1]]._flatten("flat")
    init_device_mesh("cpu", (world // cfg["shape"][-1], cfg["shape"][-1]), mesh_dim_names=("a", "b"))
    DeviceMesh("cpu", torch.arange(world).reshape(-1, cfg["shape"][-1]), mesh_dim_names=("x", "y"))


def _megatron_cfg(rng: random.Random, world: int) -> dict:
    tp = rng.choice([t for t in (1, 2, 4, 8) if world % t == 0])
    pp = rng.choice([p for p in (1, 2, 4) if world % (tp * p) == 0])
    cp = rng.choice([c for c in (1, 2) if world % (tp * pp * c) == 0])
    dp = world // (tp * pp * cp)
    ep = rng.choice([e for e in (1, 2, 4, 8) if (dp * cp) % e == 0 and world % (e * pp) == 0])
    etp = rng.choice([e for e in (1, tp) if world % (e * ep * pp) == 0])
    return dict(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
    )


def road_megatron(world: int, rank: int, cfg: dict) -> None:
    """megatron-core 0.16's own ``parallel_state.initialize_model_parallel`` under the one switch."""
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(**cfg, create_gloo_process_groups=False)


def _megatron_cleanup() -> None:
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None and dist.is_initialized():
        from tests.mp import megatron_snapshot  # imported before the first init: its globals as at import

        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        megatron_snapshot.reset()  # what megatron-core's destroy leaves set


def _deepspeed_cfg(rng: random.Random, world: int) -> dict:
    from tests import deepspeed_pipe

    while True:  # DeepSpeed's grid needs a pipe and a data axis
        cfg = deepspeed_pipe.draw(rng, world)
        if cfg["kind"] != "custom" or {"pipe", "data"} <= set(cfg["axes"]):
            return {"grid": cfg, "groups": deepspeed_pipe.draw_groups(rng, world)}


def road_deepspeed_pipe(world: int, rank: int, cfg: dict) -> None:
    """DeepSpeed 0.19's own ``PipelineParallelGrid`` (as ``PipelineModule`` builds it), then the loops of
    ``deepspeed.utils.groups`` (TP/DP, ZeRO++, both expert layouts), under the one switch."""
    from rankmesh import patches

    from tests import deepspeed_pipe

    assert patches.get("deepspeed_grid").installed and patches.get("deepspeed_groups").installed
    deepspeed_pipe.ds_comm_init()
    deepspeed_pipe.build(cfg["grid"])
    deepspeed_pipe.run_groups(cfg["groups"])


def _recovery_cfg(rng: random.Random, world: int) -> dict:
    dims = _titan_cfg(rng, world)
    dims["ep"] = 1
    if rng.random() < 0.5:  # a hot spare: 1-3 spares, as many failures or fewer, renumbered either way
        spares = rng.randint(1, 3)
        failed = rng.sample(range(world), rng.randint(1, spares))
        renumber = rng.choice(["fill", "shift"])
        return {"kind": "hot_spare", "dims": dims, "old": world + spares, "failed": failed, "renumber": renumber}
    if dims["dp_replicate"] == 1:  # a shrink: one more replica before the failure, which it loses
        dims["dp_replicate"], dims["dp_shard"] = 2, dims["dp_shard"] // 2
    sizes = {
        "pp": dims["pp"],
        "dp_replicate": dims["dp_replicate"] + 1,
        "dp_shard": dims["dp_shard"],
        "cp": dims["cp"],
        "tp": dims["tp"],
    }
    return {"kind": "shrink", "dims": dims, "sizes": sizes, "failed": [rng.randrange(world)]}


def recovery_plan(cfg: dict) -> Any:
    """The re-form a recovery configuration describes; its new world is the one checked."""
    from rankmesh.recovery import hot_spare, shrink

    if cfg["kind"] == "hot_spare":
        return hot_spare(cfg["old"], failed=cfg["failed"], mesh_size=_size(cfg), renumber=cfg["renumber"])
    return shrink(cfg["sizes"], failed=cfg["failed"])


def _size(cfg: dict) -> int:
    d = cfg["dims"]
    return d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"]


def road_recovery(world: int, rank: int, cfg: dict) -> None:
    """A re-form after a failure (a hot spare, or a shrink that drops the replica that lost a rank),
    then rankmesh's ``ParallelDims`` over the new world."""
    import rankmesh
    from rankmesh.recovery import deactivate

    recovery_plan(cfg).activate()
    try:
        pd = rankmesh.ParallelDims(**cfg["dims"], etp=1, world_size=world)
        pd.build_mesh("cpu")
    finally:
        deactivate()


@dataclasses.dataclass(frozen=True)
class Road:
    """One road: its builder, a random configuration for a world, what it needs, and the world a
    configuration is checked on (a re-form's new world)."""

    run: Callable[[int, int, dict], Any]
    config: Callable[[random.Random, int], dict]
    needs: str = ""
    switch: bool = False
    cleanup: Callable[[], None] | None = None
    setup: Callable[[], None] | None = None


ROADS: dict[str, Road] = {
    "tree": Road(road_tree, _tree_cfg),
    "partial": Road(road_partial, _partial_cfg),
    "parallel_dims": Road(road_parallel_dims, _titan_cfg),
    "torch_api": Road(road_torch_api, _tree_cfg, switch=True),
    "torchtitan": Road(
        road_torchtitan,
        lambda rng, w: {k: v for k, v in _titan_cfg(rng, w).items()},
        needs="torchtitan.distributed.parallel_dims",
        switch=True,
    ),
    "megatron": Road(
        road_megatron,
        _megatron_cfg,
        needs="megatron.core.parallel_state",
        switch=True,
        cleanup=_megatron_cleanup,
        setup=lambda: __import__("tests.mp.megatron_snapshot"),
    ),
    "recovery": Road(road_recovery, _recovery_cfg),
    "deepspeed_pipe": Road(
        road_deepspeed_pipe,
        _deepspeed_cfg,
        needs="deepspeed.runtime.pipe.topology",
        switch=True,
        setup=lambda: __import__("deepspeed.runtime.pipe.topology") and __import__("deepspeed.utils.groups"),
    ),
}


def world_of(road: str, world: int, cfg: dict) -> int:
    """The world a configuration of ``road`` is checked on: ``world``, or a re-form's new one."""
    return recovery_plan(cfg).world_size if road == "recovery" else world


@contextlib.contextmanager
def _switched(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    import rankmesh

    rankmesh.accelerate()
    try:
        yield
    finally:
        rankmesh.restore()


def check_road(
    road: str,
    world: int,
    cfg: dict,
    *,
    split: bool = False,
    budget_s: float | None = None,
    mutate: Callable[[int], Callable[[int, int, dict], Any] | None] | None = None,
) -> dict[str, int]:
    """Run ``road`` with ``cfg`` for every rank of the world and check that they agree (see the
    module); returns what was checked. ``budget_s``: refuse (``ValueError``) a world whose first
    rank says it would take longer. ``mutate(rank)``: another builder for that rank (the tests'
    mutations), or None."""
    if road not in ROADS:
        raise ValueError(f"unknown road {road!r}; the roads are {', '.join(ROADS)}")
    r = ROADS[road]
    world = world_of(road, world, cfg)
    MEMBERS.clear()
    _CLEANUPS[:] = [r.cleanup] if r.cleanup else []
    if r.setup is not None:
        r.setup()
    runs = []
    with _switched(r.switch):
        t0 = time.perf_counter()
        for rank in range(world):
            fn = (mutate(rank) if mutate else None) or r.run
            runs.append(run_rank(fn, world, rank, cfg, split=split))
            if rank == 0 and budget_s is not None:
                per_rank = time.perf_counter() - t0
                if per_rank * world > budget_s:
                    raise ValueError(
                        f"road {road!r} at world {world:,} would take ~{per_rank * world:.0f} s "
                        f"({per_rank * 1e3:.1f} ms a rank), over the {budget_s:g} s asked; give a smaller world "
                        "or a larger budget"
                    )
    return check_runs(road, runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.agreement", description=__doc__.split("\n\n")[0])
    p.add_argument("--road", choices=list(ROADS), action="append", help="the roads (default: every one)")
    p.add_argument("--world", type=int, default=1 << 16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", action="store_true", help="a default group bound to a device (torch 2.15)")
    args = p.parse_args(argv)
    import tests.conftest as conftest

    conftest.pytest_configure(None)  # the fake backends the roads run on
    for road in args.road or list(ROADS):
        cfg = ROADS[road].config(random.Random(args.seed), args.world)
        t0 = time.perf_counter()
        got = check_road(road, args.world, cfg, split=args.split)
        print(
            f"{road:14s} world {args.world:>9,} {'split' if args.split else 'new_group':9s} {cfg} "
            f"-> agree: {got} in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
