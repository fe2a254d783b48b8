"""Time to a parallelised model: what a trainer does right after the mesh, as timed recipes.

A user does not stop at the mesh: the next thing every trainer does is tensor-parallelise the
model and call FSDP2's ``fully_shard`` once per block, then train. Each workload here runs one
such recipe for one rank of a ``world``-rank job (normally on the ``fake`` backend, one process
standing in for the rank) in phases, on stock torch (``impl="torch"``) or on rankmesh's meshes
(``impl="rankmesh"``); the two sides run identical code but for the one function that makes the
first mesh. They are the benchmark recipes of ``rankmesh bench model`` and the subjects of
``tests/test_workloads.py`` (no world-sized object built at 2^20 ranks; the same parameters,
placements and meshes as stock).

Phases (seconds each, in :attr:`Run.phases`): ``mesh`` (the meshes the recipe uses),
``parallelise`` (tensor parallel, FSDP2, torchtitan's parallelize function) and, where the
workload trains, ``step`` (forward, backward, optimizer step).

- :func:`fsdp_tp`: a plain FSDP2 + TP script: ``blocks`` blocks of two ``nn.Linear`` on the meta
  device, ``parallelize_module`` Colwise/Rowwise on ``mesh["tp"]``, then ``fully_shard`` per
  block and on the root over ``mesh["dp_replicate", "fsdp"]`` (HSDP when dp_replicate > 1).
- :func:`train_step`: the same on real CPU tensors (a small model) plus one training step.
- :func:`compile_block`: ``torch.compile`` of a tensor-parallel block (``aot_eager``: no C++
  toolchain needed); dynamo guards on the mesh.
- meshes over part of the world: :func:`distill` (knowledge distillation: students and teachers
  on the two halves, each (dp_replicate, fsdp, tp) with FSDP2 + TP on its own model),
  :func:`rl_split` (an actor training mesh on the first quarter, rollout tensor-parallel groups
  on the rest) and :func:`ep_per_stage` (one expert-parallel mesh per pipeline stage); stock torch
  builds these with ``init_device_mesh`` over the first ranks or ``DeviceMesh(mesh=subset)``.
  Their shard groups have a fixed size (HSDP), as :func:`fsdp_tp`'s: FSDP2 itself makes one empty
  tensor per shard rank per parameter, a cost of the shard group's size, not of the mesh.
- torchtitan 0.3.0's own parallelisation (:mod:`rankmesh.bench.titan_workloads`): Llama3 8B's shape
  for every ``spmd_backend``, a MoE model with ep > 1, and the pipeline split with pp > 1.

Example (a 64-rank world seen from rank 35: tp 4, fsdp 8, so dp_replicate 2; two blocks)::

    >>> run = fsdp_tp("rankmesh", 64, rank=35, tp=4, fsdp=8, blocks=2)
    >>> sorted(run.phases), run.meshes["tp"].mesh.tolist()
    (['mesh', 'parallelise'], [32, 33, 34, 35])
    >>> run.meshes["dp"].mesh.tolist()  # (dp_replicate, fsdp): HSDP
    [[3, 7, 11, 15, 19, 23, 27, 31], [35, 39, 43, 47, 51, 55, 59, 63]]
    >>> name, (*dims, placements, shape) = run.extra["placements"][0]  # a column-parallel weight
    >>> name, dims, shape
    ('0.0.weight', ['dp_replicate', 'fsdp', 'tp'], (1024, 256))
    >>> placements
    '(Replicate(), _StridedShard(dim=0, sf=4), Shard(dim=0))'
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MIN_WORLD",
    "WORKLOADS",
    "Run",
    "clear_dtensor_caches",
    "compile_block",
    "distill",
    "ep_per_stage",
    "fake_world",
    "rl_split",
    "fsdp_tp",
    "mesh_init",
    "param_placements",
    "train_step",
]


@dataclass
class Run:
    """What one workload left behind: its phase times, the model and the meshes it used."""

    phases: dict[str, float] = field(default_factory=dict)
    model: Any = None
    meshes: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0


def mesh_init(impl: str) -> Callable[..., Any]:
    """The ``init_device_mesh`` of one side: torch's own, or rankmesh's."""
    if impl == "rankmesh":
        from rankmesh.mesh import init_device_mesh
    elif impl == "torch":
        from torch.distributed.device_mesh import init_device_mesh
    else:
        raise ValueError(f"impl must be 'rankmesh' or 'torch', got {impl!r}")
    return init_device_mesh


def clear_dtensor_caches() -> None:
    """Empty DTensor's sharding-propagation and redistribution caches.

    They are keyed by mesh *equality*, which ignores process groups: a cached output spec from an
    earlier world (torch's meshes or rankmesh's, equal when the rank maps are) keeps that world's
    meshes and their group names. torch's own meshes get away with it across
    ``destroy_process_group`` because a new world re-creates its groups under the same names; the
    two sides of one comparison do not (rankmesh creates fewer groups). Each workload run starts
    with cold caches on both sides, as a fresh process would."""
    from torch.distributed.tensor import _collective_utils, _redistribute
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    topo = getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None)
    if hasattr(topo, "cache_clear"):
        topo.cache_clear()
    for name in ("_gen_transform_infos", "_gen_transform_infos_non_cached"):
        fn = getattr(_redistribute, name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
    planners = getattr(_redistribute, "_planner_cache", None)
    if isinstance(planners, dict):
        planners.clear()


@contextlib.contextmanager
def fake_world(world: int, rank: int | None) -> Iterator[None]:
    """A fake-backend world for ``rank`` (when given; None: the caller's world is used), with
    cold DTensor caches; destroyed on exit. Every workload of ``rankmesh bench model`` runs in one
    (:func:`rankmesh._fast_groups.init_fake_world`, the one place the fake backend is set up)."""
    clear_dtensor_caches()
    if rank is None:
        yield
        return
    import torch.distributed as dist

    from rankmesh._fast_groups import init_fake_world

    init_fake_world(world, rank)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _dp_tp_meshes(run: Run, impl: str, world: int, tp: int, fsdp: int) -> None:
    """The meshes of an FSDP2 + TP script: a ``("world",)`` mesh unflattened to
    ``(dp_replicate, fsdp, tp)``, then ``mesh["tp"]`` and ``mesh["dp_replicate", "fsdp"]``."""
    if world % (tp * fsdp):
        raise ValueError(f"world {world} is not a multiple of tp * fsdp = {tp * fsdp}")
    with run.phase("mesh"):
        root = mesh_init(impl)("cpu", (world,), mesh_dim_names=("world",))
        mesh = root._unflatten(0, (world // (tp * fsdp), fsdp, tp), ("dp_replicate", "fsdp", "tp"))
        run.meshes.update(root=root, mesh=mesh, tp=mesh["tp"], dp=mesh["dp_replicate", "fsdp"])


def _tp_fsdp(model: Any, tp_mesh: Any, dp_mesh: Any) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model:
        parallelize_module(block, tp_mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    for block in model:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def _parallelise_on_meta(run: Run, blocks: int, dim: int, hidden: int, tp_mesh: Any, dp_mesh: Any) -> None:
    """The ``parallelise`` phase of the FSDP2 + TP workloads: ``blocks`` blocks on the meta device,
    tensor parallel on ``tp_mesh``, FSDP2 on ``dp_mesh``; then the parameters' placements."""
    import torch

    with run.phase("parallelise"):
        with torch.device("meta"):
            run.model = _blocks(blocks, dim, hidden)
        _tp_fsdp(run.model, tp_mesh, dp_mesh)
    run.extra["placements"] = param_placements(run.model)


def _blocks(n: int, dim: int, hidden: int) -> Any:
    import torch.nn as nn

    return nn.Sequential(*[nn.Sequential(nn.Linear(dim, hidden), nn.Linear(hidden, dim)) for _ in range(n)])


def fsdp_tp(
    impl: str,
    world: int,
    *,
    rank: int | None = None,
    tp: int = 8,
    fsdp: int = 256,
    blocks: int = 16,
    dim: int = 256,
    hidden: int = 1024,
) -> Run:
    """(a) A plain FSDP2 + TP script on the meta device: mesh, then parallelise.

    ``rank``: make a fake world for that rank first (and destroy it after); None: use the
    caller's default group."""
    run = Run()
    with fake_world(world, rank):
        _dp_tp_meshes(run, impl, world, tp, fsdp)
        _parallelise_on_meta(run, blocks, dim, hidden, run.meshes["tp"], run.meshes["dp"])
    return run


def train_step(
    impl: str,
    world: int,
    *,
    rank: int | None = None,
    tp: int = 8,
    fsdp: int = 256,
    blocks: int = 4,
    dim: int = 64,
    hidden: int = 128,
    batch: int = 4,
    seed: int = 0,
) -> Run:
    """(e) One training step of a small FSDP2 + TP model with real CPU tensors: mesh,
    parallelise, then ``step`` (forward, backward, AdamW step). On the fake backend the
    collectives do nothing (the numbers are not meaningful, the work per rank is); on gloo the
    loss and gradients are real (``run.extra["loss"]``, ``run.extra["grads"]``)."""
    import torch

    run = Run()
    with fake_world(world, rank):
        _dp_tp_meshes(run, impl, world, tp, fsdp)
        with run.phase("parallelise"):
            torch.manual_seed(seed)
            run.model = _blocks(blocks, dim, hidden)
            _tp_fsdp(run.model, run.meshes["tp"], run.meshes["dp"])
            opt = torch.optim.AdamW(run.model.parameters(), lr=1e-2)
        with run.phase("step"):
            gen = torch.Generator().manual_seed(seed + 1)
            x = torch.randn(batch, dim, generator=gen)
            loss = run.model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
        run.extra["loss"] = float(loss.detach())
        run.extra["placements"] = param_placements(run.model)
    return run


def compile_block(impl: str, world: int, *, rank: int | None = None, tp: int = 8, fsdp: int = 256) -> Run:
    """(f) ``torch.compile`` (backend ``aot_eager``) of a tensor-parallel block on real CPU
    tensors: ``step`` is the first compiled call (tracing, guards on the DTensor's mesh) plus a
    second call through the guards."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    run = Run()
    with fake_world(world, rank):
        _dp_tp_meshes(run, impl, world, tp, fsdp)
        with run.phase("parallelise"):
            torch.manual_seed(0)
            run.model = _blocks(1, 32, 64)[0]
            parallelize_module(run.model, run.meshes["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
        torch._dynamo.reset()
        with run.phase("step"):
            compiled = torch.compile(run.model, backend="aot_eager")
            x = torch.randn(2, 32)
            compiled(x)
            compiled(x)
        run.extra["placements"] = param_placements(run.model)
    return run


def subset_mesh(impl: str, shape: tuple[int, ...], names: tuple[str, ...], ranks: range) -> Any:
    """A mesh over ``ranks`` of the job, as each side builds one: rankmesh's ``init_device_mesh``
    with ``ranks=``; torch's ``init_device_mesh`` when the ranks are the first ones, else
    ``DeviceMesh(mesh=<the ranks as a tensor>)`` (what NeMo Automodel's KD and RL recipes do)."""
    if impl == "rankmesh":
        from rankmesh.mesh import init_device_mesh

        return init_device_mesh("cpu", shape, mesh_dim_names=names, ranks=ranks)
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    if ranks.start == 0 and ranks.step == 1:
        return mesh_init("torch")("cpu", shape, mesh_dim_names=names)
    return DeviceMesh("cpu", torch.arange(ranks.start, ranks.stop, ranks.step).reshape(shape), mesh_dim_names=names)


def distill(
    impl: str,
    world: int,
    *,
    rank: int | None = None,
    tp: int = 8,
    fsdp: int = 128,
    blocks: int = 16,
    dim: int = 256,
    hidden: int = 1024,
) -> Run:
    """(g) Knowledge distillation with separate meshes: students on ranks ``[0, W/2)`` and teachers
    on ``[W/2, W)``, each a ``(dp_replicate, fsdp, tp)`` mesh (HSDP: the shard group stays ``fsdp``
    ranks as the job grows, as in :func:`fsdp_tp`); every rank builds both (SPMD) and parallelises
    its own model (FSDP2 + TP, meta device) on the one it belongs to."""
    run = Run()
    half = world // 2
    shape, names = (half // (fsdp * tp), fsdp, tp), ("dp_replicate", "fsdp", "tp")
    with fake_world(world, rank):
        with run.phase("mesh"):
            students = subset_mesh(impl, shape, names, range(0, half))
            teachers = subset_mesh(impl, shape, names, range(half, world))
            mine = students if students.get_coordinate() is not None else teachers
            run.meshes.update(students=students, teachers=teachers, tp=mine["tp"], dp=mine["dp_replicate", "fsdp"])
        _parallelise_on_meta(run, blocks, dim, hidden, run.meshes["tp"], run.meshes["dp"])
    return run


def rl_split(
    impl: str,
    world: int,
    *,
    rank: int | None = None,
    tp: int = 8,
    fsdp: int = 128,
    blocks: int = 16,
    dim: int = 256,
    hidden: int = 1024,
) -> Run:
    """(h) An RL split: the actor trains on ranks ``[0, W/4)`` as ``(dp_replicate, fsdp, tp)``
    (FSDP2 + TP, HSDP), the rollout workers on ``[W/4, W)`` as ``(replica, tp)`` tensor-parallel
    inference engines (TP only); every rank builds both meshes."""
    import torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    run = Run()
    actor_n = world // 4
    with fake_world(world, rank):
        with run.phase("mesh"):
            actor = subset_mesh(
                impl, (actor_n // (fsdp * tp), fsdp, tp), ("dp_replicate", "fsdp", "tp"), range(0, actor_n)
            )
            rollout = subset_mesh(impl, ((world - actor_n) // tp, tp), ("replica", "tp"), range(actor_n, world))
            training = actor.get_coordinate() is not None
            mine = actor if training else rollout
            run.meshes.update(actor=actor, rollout=rollout, tp=mine["tp"])
            if training:
                run.meshes["dp"] = actor["dp_replicate", "fsdp"]
        with run.phase("parallelise"):
            with torch.device("meta"):
                run.model = _blocks(blocks, dim, hidden)
            if training:
                _tp_fsdp(run.model, run.meshes["tp"], run.meshes["dp"])
            else:
                for block in run.model:
                    parallelize_module(block, run.meshes["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
        run.extra["placements"] = param_placements(run.model)
    return run


def ep_per_stage(
    impl: str,
    world: int,
    *,
    rank: int | None = None,
    pp: int = 4,
    ep: int = 8,
    edp: int = 128,
    blocks: int = 16,
    dim: int = 256,
) -> Run:
    """(i) One expert-parallel mesh per pipeline stage (NeMo Automodel's MoE with pp > 1): stage
    ``s`` holds ranks ``[s W/pp, (s+1) W/pp)`` as ``(edp_replicate, edp, ep)``; every rank builds
    every stage's mesh, then shards its stage's blocks over ``ep`` (tensor-parallel experts) and
    ``(edp_replicate, edp)`` (FSDP2, HSDP)."""
    run = Run()
    per = world // pp
    shape, names = (per // (edp * ep), edp, ep), ("edp_replicate", "edp", "ep")
    with fake_world(world, rank):
        with run.phase("mesh"):
            stages = [subset_mesh(impl, shape, names, range(s * per, (s + 1) * per)) for s in range(pp)]
            mine = next(m for m in stages if m.get_coordinate() is not None)
            run.meshes.update(ep=mine["ep"], edp=mine["edp_replicate", "edp"], stages=stages)
        _parallelise_on_meta(run, blocks, dim, 4 * dim, run.meshes["ep"], run.meshes["edp"])
    return run


def param_placements(model: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """Each parameter's DTensor layout as plain data, to compare two builds: ``(name, (*mesh dim
    names, str(placements), global shape))``; ``(name, ("plain", shape))`` for a plain tensor."""
    from torch.distributed.tensor import DTensor

    out = []
    for name, p in model.named_parameters():
        if isinstance(p, DTensor):
            names = tuple(p.device_mesh.mesh_dim_names or ())
            out.append((name, (*names, str(tuple(p.placements)), tuple(p.shape))))
        else:
            out.append((name, ("plain", tuple(p.shape))))
    return out


#: name -> workload, each ``fn(impl, world, *, rank=None, ...) -> Run``
WORKLOADS: dict[str, Callable[..., Run]] = {
    "fsdp_tp": fsdp_tp,
    "train_step": train_step,
    "compile": compile_block,
    "distill": distill,
    "rl_split": rl_split,
    "ep_per_stage": ep_per_stage,
}
#: name -> the smallest world it runs at with its default degrees (tp 8 x fsdp 256)
MIN_WORLD: dict[str, int] = {name: 8 * 256 for name in WORKLOADS} | {"rl_split": 4096, "ep_per_stage": 4096}
