"""Benchmark: end-to-end mesh init per rank, rankmesh vs stock torch, side by side in one run.

The number that counts is end to end, with real ``DeviceMesh`` objects: every mesh the framework
asks for. The recipes below (``--recipe``; the torchtitan ones with tp=8 pp=4 cp=2 ep=8
dp_replicate=2 dp_shard=auto), fake backend, one fresh process per measurement standing in for one
rank:

- ``parallel_dims``: torchtitan's ``ParallelDims.build_mesh()`` (commit 183a0d2) plus fetching
  every single-dim mesh and every combination inside one global mesh (56 requests);
  rankmesh = :class:`rankmesh.ParallelDims`, torch = the same recipe on stock torch
  (:mod:`rankmesh.bench.stock`).
- ``titan030``: ``init_device_mesh`` + a torchtitan-0.3.0-style recipe: a ``("world",)`` mesh,
  five ``_unflatten``s (dataloading ``[pp, batch, cp, tp]``, dense for FSDP
  ``[pp, dp_replicate, fsdp, tp]``, dense for forward/backward ``[pp, dp_replicate, dp_shard,
  cp, tp]``, sparse ``[pp, dp_replicate, efsdp, ep]``, and expert TP ``[pp, dp_replicate, efsdp,
  ep, etp]``), one ``_flatten`` (loss), every 1-D slice and the multi-axis meshes FSDP2/HSDP use.
  Both sides run the identical code with their own ``init_device_mesh``.
- ``torchtitan``: the installed torchtitan 0.3.0 itself (needs ``pip install torchtitan==0.3.0``):
  ``ParallelDims(...).build_mesh()`` with its default ``spmd_backend``, then every 1-D mesh,
  ``spmd_meshes()`` and the FSDP meshes (dense and MoE); torch = stock, rankmesh = the same
  code in a worker started with ``RANKMESH_ACCELERATE=1`` (the one switch, no code change; no
  ``etp`` in 0.3.0).
- ``megatron``: megatron-core 0.16's own ``parallel_state.initialize_model_parallel`` call (tp=8
  pp=4 cp=2 ep=8 etp=1, dp = world/64, no gloo twins on either side: gloo cannot run on the fake
  store), stock beside the same call under ``RANKMESH_ACCELERATE=1`` (routed to
  :func:`rankmesh.megatron.initialize_model_parallel`); "meshes" counts the group globals set.
- ``torch_api``: the general road, every framework that builds meshes with torch's own API:
  transformers 5.24's two 4-D ``init_device_mesh`` calls (size-1 dims kept), a ``_flatten`` and
  the slices a trainer fetches (:func:`torch_api_recipe`); torch = stock, rankmesh = the same
  code after :func:`rankmesh.accelerate` (the ``init_process_groups`` and ``init_device_mesh``
  patches).
- one recipe per framework in :mod:`rankmesh.bench.frameworks` (transformers, accelerate, ...;
  each needs its release installed): the framework's **own** mesh-building call, as it calls it,
  and the slices it takes; torch = stock, rankmesh = the same call in a worker started with
  ``RANKMESH_ACCELERATE=1`` (the time its hooks spend installing patches during the imports,
  :func:`rankmesh.switch.install_seconds`, counts towards the first build). ``new_group`` path only.
- ``reform_parallel_dims``, ``reform_megatron``, ``reform_fsdp``: re-forming every mesh after a
  failure: a spare takes the place of rank W/3 of a job of W + 1 and the survivors
  are renumbered in order; rankmesh = :func:`rankmesh.recovery.hot_spare` + ``activate()`` + the
  tree (``rankmesh.ParallelDims``, ``rankmesh.megatron.initialize_model_parallel``, a plain FSDP2
  ``init_device_mesh`` tree with a ``_flatten``); torch = the same tree rebuilt by torch's own
  code (the FSDP2 tree over the same rank map with ``DeviceMesh(mesh=...)``). The warm figure is
  an in-process restart's (the process built its meshes before). ``new_group`` path only.

Each runs on two process-group paths: ``new_group`` (no bound device: lazy NCCL, gloo) and
``split_group`` (the default group bound to a device, simulated on the fake backend: torch's own
code is made to take its split path by reporting an accelerator).

Each worker imports everything first (torch 2.15's first slice imports ``torch._dynamo``, ~2 s;
imports are not counted), then builds the recipe twice at the measured world: the **cold** first
build (what a trainer waits for: it builds its meshes once per process; rankmesh's one-time
start-up checks included) and the **warm** second one. rankmesh's start-up checks keep their
verdicts once per torch install (:mod:`rankmesh._verdicts`), so its workers run on a cache of the
run's own (``RANKMESH_CACHE_DIR`` in a temporary folder): per point, one more worker runs first on
an empty cache, the first process on a **fresh install**, which fills it for the cold figures of the
others (a machine that has run rankmesh once). Reported per point: median warm and cold time, the
ratio, rankmesh's fresh-install first build, peak RSS added by the warm build (VmHWM after
resetting it, minus the RSS before), the process groups this rank holds.

Before it starts, ``rankmesh bench`` says on stderr what it is about to run (worlds, recipes,
paths, worker processes) and, when stock torch is measured at 2^18 ranks or more, that each such
measurement takes about a minute or more (two builds of ~1 min each at 2^20) and how to run a
quick one.

Usage::

    rankmesh bench                          # worlds 2^10 .. 2^20, every recipe and path: an hour or more
    rankmesh bench --worlds 10,12 --recipe parallel_dims    # a quick run: a minute or two
    rankmesh bench model                    # time to a parallelised model (rankmesh.bench.model)
    rankmesh bench --worlds 10,17 --repeats 3 --recipe titan030 --path new_group
    python -m rankmesh.bench.meshes --worker rankmesh --recipe titan030 --path new_group --world 131072
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from rankmesh._dependencies import available
from rankmesh.bench.frameworks import FRAMEWORKS
from rankmesh.bench.points import CONFIG, IMPLS, NOT_MEASURABLE, PATHS, RECIPES, REFORM_RECIPES, SWITCHED
from rankmesh.bench.report import (
    _fmt_s,
    # The next five lived here before rankmesh.bench.report and stay importable from here
    # (rankmesh.bench.model imports machine from here).
    machine,  # noqa: F401
    member_fit,  # noqa: F401
    plot,  # noqa: F401
    summarize,  # noqa: F401
    to_markdown,  # noqa: F401
    write_results,
)

DEFAULT_WORLDS = "10,12,14,16,17,18,20"
#: megatron-core's initialize_model_parallel with the same degrees (gloo twins off on both sides:
#: a gloo group cannot be made on the fake backend's store).
MEGATRON = dict(
    tensor_model_parallel_size=8,
    pipeline_model_parallel_size=4,
    context_parallel_size=2,
    expert_model_parallel_size=8,
    expert_tensor_parallel_size=1,
    create_gloo_process_groups=False,
)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    """Peak RSS since the last :func:`_reset_peak_rss` (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource  # pragma: no cover - not Linux

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak_rss() -> None:
    """Linux: make the peak RSS the current RSS, so the peak afterwards is the build's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover - not Linux, or not allowed
        pass


def titan030_recipe(init: Callable[..., Any], world: int) -> list[Any]:
    """A torchtitan-0.3.0-style build on ``init`` (torch's or rankmesh's ``init_device_mesh``):
    returns every mesh it asks for."""
    tp, pp, cp, ep, etp, dpr = (CONFIG[k] for k in ("tp", "pp", "cp", "ep", "etp", "dp_replicate"))
    dps = world // (tp * pp * cp * dpr)
    deg = dict(
        pp=pp,
        batch=dpr * dps,
        cp=cp,
        tp=tp,
        dp_replicate=dpr,
        dp_shard=dps,
        fsdp=dps * cp,
        ep=ep,
        efsdp=dps * cp * tp // (ep * etp),
        etp=etp,
    )
    world_mesh = init("cpu", (world,), mesh_dim_names=("world",))

    def unflatten(names: tuple[str, ...]) -> Any:
        fake = {n: "fake" for n in names if n == "batch" or deg[n] == 1}
        return world_mesh._unflatten(0, tuple(deg[n] for n in names), names, backend_override=fake)

    dl = unflatten(("pp", "batch", "cp", "tp"))
    loss = dl["batch", "cp"]._flatten("loss")
    fsdp = unflatten(("pp", "dp_replicate", "fsdp", "tp"))
    dense = unflatten(("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    sparse = unflatten(("pp", "dp_replicate", "efsdp", "ep"))
    etp_mesh = unflatten(("pp", "dp_replicate", "efsdp", "ep", "etp"))
    out = [world_mesh, dl, loss, fsdp, dense, sparse, etp_mesh]
    for m in (dl, fsdp, dense, sparse, etp_mesh):
        out.extend(m[n] for n in m.mesh_dim_names)
    out += [
        fsdp["dp_replicate", "fsdp"],
        dense["dp_shard", "cp"],
        dense["dp_replicate", "dp_shard", "cp"],
        sparse["dp_replicate", "efsdp"],
        sparse["efsdp", "ep"],
        etp_mesh["ep", "etp"],
    ]
    return out


@contextlib.contextmanager
def _bound_device(path: str, impl: str):
    """Simulates a default group bound to a device (NCCL eager init) on the fake backend."""
    if path != "split_group":
        yield
        return
    import torch
    import torch.distributed as dist

    dist.group.WORLD.bound_device_id = torch.device("cuda", 0)
    if impl != "torch":
        yield
        return
    # torch's DeviceMesh takes its split path only when an accelerator is available.
    saved = torch.accelerator.is_available, torch.accelerator.current_accelerator
    torch.accelerator.is_available = lambda: True
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
    try:
        yield
    finally:
        torch.accelerator.is_available, torch.accelerator.current_accelerator = saved


def _build_torchtitan(impl: str, world: int) -> int:
    """torchtitan 0.3.0's own build (under the switch on the rankmesh side: :func:`_check_switch`);
    returns the number of meshes fetched."""
    import torchtitan.distributed.parallel_dims as tpd

    tpd.device_type = "cpu"  # torchtitan falls back to "cuda" without an accelerator
    pd = tpd.ParallelDims(**{k: v for k, v in CONFIG.items() if k != "etp"}, world_size=world)
    pd.build_mesh()
    meshes = [*pd.get_all_one_dimensional_meshes().values(), *pd.spmd_meshes()]
    meshes += [pd.get_optional_mesh(["dp_replicate", "dp_shard"]), pd.get_optional_mesh(["dp_replicate", "efsdp"])]
    return sum(m is not None for m in meshes)


def _build_megatron(impl: str, world: int) -> int:
    """megatron-core's own ``parallel_state.initialize_model_parallel`` call (routed by the switch on
    the rankmesh side: :func:`_check_switch`); returns the groups set."""
    from megatron.core import parallel_state as ps

    from rankmesh.megatron import route

    if ps.model_parallel_is_initialized():  # the warm-up's
        ps.destroy_model_parallel()
    init = ps.initialize_model_parallel
    if impl == "rankmesh" and not route.PATCH.installed:  # reform_megatron's worker: rankmesh's own call
        import rankmesh.megatron as rm

        init = rm.initialize_model_parallel
    init(**MEGATRON)
    import torch.distributed as dist

    return sum(isinstance(v, dist.ProcessGroup) for v in vars(ps).values())


def torch_api_recipe(world: int) -> list[Any]:
    """transformers 5.24's shapes through torch's own API, as every framework not fitted by hand
    builds them: two 4-D ``init_device_mesh`` calls that keep their size-1 dims,
    ``(pp, dp_replicate, fsdp, tp)`` and ``(pp, dp_replicate, efsdp, ep)`` with fsdp = efsdp = W/8
    and tp = ep = 8, then accelerate's ``_flatten`` of the data-parallel dims and the slices a
    trainer fetches. The name is looked up at call time, so ``rankmesh.accelerate()``'s patch of
    it applies, as it does to a framework imported after it."""
    import torch.distributed.device_mesh as tdm

    dense = tdm.init_device_mesh("cpu", (1, 1, world // 8, 8), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))
    sparse = tdm.init_device_mesh("cpu", (1, 1, world // 8, 8), mesh_dim_names=("pp", "dp_replicate", "efsdp", "ep"))
    dp = dense["dp_replicate", "fsdp"]._flatten("dp")
    return [dense, sparse, dp, dense["tp"], dense["fsdp"], sparse["ep"], sparse["efsdp"]]


def _reform(impl: str, recipe: str, world: int) -> int:
    """A re-form after rank ``world // 3`` of a job of ``world + 1`` (one spare) failed: rankmesh
    plans it (:func:`rankmesh.recovery.hot_spare`), activates it and builds the tree over the
    renumbered world; stock torch rebuilds the same tree with its own code (for the plain FSDP2
    tree over the same rank map, ``DeviceMesh(mesh=...)``; torchtitan's and Megatron's stock code
    takes no rank map, so over the world in order). Returns the meshes or groups built."""
    tree = recipe.removeprefix("reform_")
    if impl == "rankmesh":
        from rankmesh.recovery import deactivate, hot_spare

        hot_spare(world + 1, failed=[world // 3], mesh_size=world).activate()
        try:
            if tree == "fsdp":
                from rankmesh.mesh import init_device_mesh

                mesh = init_device_mesh("cpu", (2, world // 16, 8), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
                return len([mesh, mesh["dp_replicate", "dp_shard"]._flatten("dp"), mesh["tp"], mesh["dp_shard"]])
            return _build("rankmesh", "megatron" if tree == "megatron" else "parallel_dims", world)
        finally:
            deactivate()
    if tree == "fsdp":
        import torch
        from torch.distributed.device_mesh import DeviceMesh

        ranks = list(range(world))  # the renumbered world's map: index f is the spare, now rank W - 1
        f = world // 3
        ranks = ranks[:f] + [world - 1] + [r - 1 for r in ranks[f + 1 :]]
        grid = torch.tensor(ranks).reshape(2, world // 16, 8)
        mesh = DeviceMesh("cpu", grid, mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
        return len([mesh, mesh["dp_replicate", "dp_shard"]._flatten("dp"), mesh["tp"], mesh["dp_shard"]])
    return _build("torch", "megatron" if tree == "megatron" else "parallel_dims", world)


def _build(impl: str, recipe: str, world: int) -> int:
    """Builds the recipe; returns the number of meshes fetched."""
    if recipe in REFORM_RECIPES:
        return _reform(impl, recipe, world)
    if recipe in FRAMEWORKS:  # the framework's own call; rankmesh's patches installed by measure()
        return len(FRAMEWORKS[recipe].build(world))
    if recipe == "torch_api":
        import rankmesh.devicemesh as general

        if impl == "rankmesh":
            general.accelerate()
        try:
            return len(torch_api_recipe(world))
        finally:
            general.restore()
    if recipe == "megatron":
        return _build_megatron(impl, world)
    if recipe == "torchtitan":
        return _build_torchtitan(impl, world)
    if recipe == "titan030":
        if impl == "rankmesh":
            from rankmesh.mesh import init_device_mesh
        else:
            from torch.distributed.device_mesh import init_device_mesh
        return len(titan030_recipe(init_device_mesh, world))
    from rankmesh.bench.stock import all_requests

    if impl == "rankmesh":
        from rankmesh.torchtitan.parallel_dims import ParallelDims

        pd = ParallelDims(**CONFIG, world_size=world)
        pd.build_mesh(device_type="cpu")
        get = pd.get_optional_mesh
    else:
        from rankmesh.bench.stock import stock_build

        get = stock_build(**CONFIG, world_size=world, device_type="cpu").get_optional_mesh
    return sum(get(r) is not None for r in all_requests())


def _check_switch(impl: str, recipe: str) -> float:
    """For a recipe of :data:`SWITCHED`: that its worker got the switch (its framework's patch in
    place on the rankmesh side, none on stock's), so no figure is a silent fallback; returns the
    seconds the switch spent installing patches in this process (0 on stock's side)."""
    if recipe not in SWITCHED:
        return 0.0
    from rankmesh import switch

    want = {"torchtitan": "torchtitan", "megatron": "megatron", "deepspeed_pipe": "deepspeed_grid"}.get(
        recipe, "init_process_groups"
    )
    installed = {p.name for p in switch.patches() if p.installed}
    if (want in installed) != (impl == "rankmesh"):
        state = "in place" if want in installed else "not in place"
        raise RuntimeError(
            f"{impl} worker of {recipe}: the switch's patch {want!r} is {state} ({sorted(installed)}); "
            f"RANKMESH_ACCELERATE={os.environ.get('RANKMESH_ACCELERATE')!r}"
        )
    return switch.install_seconds()


def measure(impl: str, recipe: str, path: str, world: int, rank: int) -> dict:
    """One measurement in this process: the cold first build, then the warm second one."""
    import torch
    import torch._dynamo  # noqa: F401  (torch 2.15's first DeviceMesh slice imports it: ~2 s)
    import torch.distributed as dist
    import torch.fx.experimental.proxy_tensor  # noqa: F401

    import rankmesh._devicemesh_torch  # noqa: F401  (the patches' torch side, imported by their first call)
    import rankmesh.bench.stock  # noqa: F401  (parallel_dims's requests, both sides: ~1.5 ms compiling without .pyc)
    import rankmesh.devicemesh  # noqa: F401
    import rankmesh.mesh  # noqa: F401
    import rankmesh.torchtitan.parallel_dims  # noqa: F401
    from rankmesh._fast_groups import group_members, init_fake_world, registered_groups

    if recipe == "torchtitan":
        import torchtitan.distributed.parallel_dims  # noqa: F401  (seconds of imports)

        import rankmesh.torchtitan.spmd_axis  # noqa: F401  (accelerate() imports it: not part of the call)
    if recipe in REFORM_RECIPES:
        import rankmesh.recovery  # noqa: F401
    if recipe in ("megatron", "reform_megatron"):
        import warnings

        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed" on CPU
        import megatron.core.parallel_state  # noqa: F401

        import rankmesh.megatron.groups  # noqa: F401
        import rankmesh.megatron.parallel_state  # noqa: F401  (imported by the first call otherwise)

    if recipe in FRAMEWORKS:
        import importlib

        for module in FRAMEWORKS[recipe].imports:
            importlib.import_module(module)
    # the switch's patches were installed by the imports (not timed): their one-time checks count
    # towards the first build
    startup = _check_switch(impl, recipe)

    init_fake_world(world, rank)
    with _bound_device(path, impl):
        t0 = time.perf_counter()
        _build(impl, recipe, world)
        cold = time.perf_counter() - t0 + startup
    if recipe in ("megatron", "reform_megatron"):
        import megatron.core.parallel_state as mps

        mps.destroy_model_parallel()
    dist.destroy_process_group()
    import gc

    gc.collect()

    init_fake_world(world, rank)
    pgs_before = registered_groups()
    _reset_peak_rss()
    rss_before = _rss_mb()
    with _bound_device(path, impl):
        t0 = time.perf_counter()
        fetched = _build(impl, recipe, world)
        t1 = time.perf_counter()
    out = {
        "impl": impl,
        "recipe": recipe,
        "path": path,
        "world": world,
        "rank": rank,
        "total_s": t1 - t0,
        "cold_s": cold,
        "meshes_fetched": fetched,
        "process_groups": registered_groups() - pgs_before,
        "members": group_members(),
        "extra_rss_mb": max(0.0, _peak_rss_mb() - rss_before),
        "torch": torch.__version__,
    }
    dist.destroy_process_group()
    return out


def measure_split_call(world: int) -> dict:
    """What one ``split_group`` call costs on a ``world``-rank default group bound to a device:
    torch's as it is (O(world) Python), torch's with the narrowed rank table (rankmesh's fallback,
    O(group) Python) and rankmesh's own split (torch 2.15; None where it falls back)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from rankmesh import _fast_groups as fg

    fg.init_fake_world(world, 0)
    pg = dist.group.WORLD
    pg.bound_device_id = torch.device("cuda", 0)
    ranks = list(range(8))
    own = fg.uses_fast_split()
    times: dict[str, list[float]] = {"torch": [], "rankmesh": [], "rankmesh_split": []}
    for _ in range(3):
        t0 = time.perf_counter()
        dist.split_group(parent_pg=pg, split_ranks=[ranks])
        times["torch"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with fg.narrowed_parent_ranks(pg, ranks, world):
            dist.split_group(parent_pg=pg, split_ranks=[ranks])
        times["rankmesh"].append(time.perf_counter() - t0)
        if own:
            t0 = time.perf_counter()
            fg.split_member_group(np.asarray(ranks, dtype=np.int32))
            times["rankmesh_split"].append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return {"world": world, **{k: statistics.median(v) if v else None for k, v in times.items()}}


def _run_worker(args: list[str], cache: str | None = None, *, switch: bool = False) -> dict:
    """One worker process; ``cache``: the folder rankmesh keeps its start-up check verdicts in;
    ``switch``: started with ``RANKMESH_ACCELERATE=1`` (else without the variable, whatever this
    process has)."""
    cmd = [sys.executable, "-m", "rankmesh.bench.meshes", *args]
    env = {k: v for k, v in os.environ.items() if k != "RANKMESH_ACCELERATE"}
    if cache is not None:
        env["RANKMESH_CACHE_DIR"] = cache
    if switch:
        env["RANKMESH_ACCELERATE"] = "1"
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"benchmark worker failed: {' '.join(cmd)}\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def results_dir(out: Path | None) -> Path:
    """Where results go: ``out``, else ``benches/results`` when the working directory is the
    rankmesh repository, else ``./bench-results``; created. Never a folder found from where the
    package is installed."""
    if out is None:
        out = Path("bench-results")
        repo = Path.cwd()
        if (repo / "benches").is_dir() and (repo / "Cargo.toml").is_file():
            out = repo / "benches" / "results"
    out.mkdir(parents=True, exist_ok=True)
    return out


MAX_LOG2_WORLD = 30  # 2^30 ranks: far beyond any job, and still an int64 everywhere


def parse_worlds(p: argparse.ArgumentParser, text: str) -> list[int]:
    """``--worlds`` (comma-separated log2 sizes, ``17,20``) as world sizes; a parser error otherwise.

    >>> parse_worlds(argparse.ArgumentParser(), "17,20")
    [131072, 1048576]
    """
    try:
        logs = [int(x) for x in text.split(",")]
    except ValueError:
        p.error(f"--worlds must be comma-separated integers (log2 sizes), got {text!r}")
        raise  # pragma: no cover - p.error exits
    bad = [x for x in logs if not 1 <= x <= MAX_LOG2_WORLD]
    if bad:
        x = bad[0]
        hint = f"; for {x:,} ranks pass --worlds {x.bit_length() - 1}" if x > 0 and x & (x - 1) == 0 else ""
        p.error(f"--worlds takes log2 world sizes from 1 to {MAX_LOG2_WORLD} (17 means 131,072 ranks), got {x}{hint}")
    return [1 << x for x in logs]


#: What the heads-up's estimate assumes (docs/benchmarks.md, torch 2.15): a worker process starts in
#: ~3 s (imports), and stock torch builds ``parallel_dims`` in ~55 us per rank (57 s at 2^20), twice per
#: measurement (cold, then warm); rankmesh's builds take milliseconds.
WORKER_START_S = 3.0
TORCH_S_PER_RANK = 55e-6
#: A run that takes a minute or two, which the heads-up suggests.
QUICK_RUN = "rankmesh bench --worlds 10,12 --recipe parallel_dims"


def _samples(args: argparse.Namespace, impl: str, world: int) -> int:
    """The worker processes one point runs: the measurements, and for rankmesh one more first, on a
    fresh install."""
    return (args.repeats + 1) if impl == "rankmesh" else (args.torch_repeats if world < 2**17 else 1)


def heads_up(
    args: argparse.Namespace, impls: list[str], recipes: list[str], paths: list[str], worlds: list[int]
) -> str:
    """What a run is about to do, printed on stderr before it starts: its points, worker processes
    and a rough time (:data:`WORKER_START_S`, :data:`TORCH_S_PER_RANK`); at 2^18 ranks or more with
    stock torch, that each of its measurements takes a minute or more, and how to run a quick one."""
    points = [
        (impl, world)
        for recipe in recipes
        for path in paths
        for world in worlds
        for impl in impls
        if (impl, recipe, path) not in NOT_MEASURABLE
    ]
    workers = sum(_samples(args, impl, world) for impl, world in points) + len(worlds) * ("split_group" in paths)
    seconds = workers * WORKER_START_S + sum(
        _samples(args, impl, world) * 2 * TORCH_S_PER_RANK * world for impl, world in points if impl == "torch"
    )
    sizes = ", ".join(f"2^{w.bit_length() - 1}" for w in worlds)
    text = (
        f"rankmesh bench: about to run {len(points)} points in {workers} worker processes, "
        f"roughly {max(1, round(seconds / 60))} min or more\n"
        f"  worlds {sizes}; recipes {', '.join(recipes)}; paths {', '.join(paths)}; {' and '.join(impls)}\n"
    )
    if "torch" in impls and max(worlds) >= 2**18:
        text += (
            f"  stock torch takes about a minute per build at 2^20 ranks, two builds per measurement; "
            f"for a quick run: {QUICK_RUN}\n"
        )
    return text


def _parser() -> argparse.ArgumentParser:
    """The command line of ``rankmesh bench`` (and of its workers, with the hidden flags)."""
    p = argparse.ArgumentParser(
        prog="rankmesh bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--worlds",
        default=DEFAULT_WORLDS,
        help=f"log2 world sizes, comma-separated (default {DEFAULT_WORLDS}; stock torch takes a minute or more "
        f"per build at 20; a quick run: {QUICK_RUN.removeprefix('rankmesh bench ')})",
    )
    p.add_argument("--repeats", type=int, default=5, help="measurements per point for rankmesh (default 5)")
    p.add_argument(
        "--torch-repeats",
        type=int,
        default=3,
        help="stock torch measurements per point below 2^17 (default 3; 1 above)",
    )
    p.add_argument("--impl", choices=IMPLS, action="append", help="only these implementations")
    p.add_argument(
        "--recipe", choices=RECIPES, action="append", help=f"only these recipes (default: all {len(RECIPES)} installed)"
    )
    p.add_argument("--path", choices=PATHS, action="append", help="only these process-group paths")
    p.add_argument(
        "--rank",
        type=lambda v: v if v == "mid" else int(v),
        default=0,
        help="rank to stand in for (default: 0; mid: W/2 + 3, a rank in the middle of every world)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="results folder (default: benches/results when run from the repo)"
    )
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--split-call", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    return p


def _installed_recipes(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The recipes to run: those asked for (all by default), less those whose framework is not
    installed here; a parser error when a recipe asked for by name needs one."""
    recipes = args.recipe or list(RECIPES)
    if "torchtitan" in recipes and not available("torchtitan"):
        if args.recipe:
            p.error("--recipe torchtitan needs torchtitan 0.3.0 installed (pip install torchtitan==0.3.0)")
        recipes.remove("torchtitan")
        print("torchtitan is not installed: skipping the torchtitan recipe", file=sys.stderr)
    for fw in [r for r in recipes if r in FRAMEWORKS]:
        dist = FRAMEWORKS[fw].distribution
        if not FRAMEWORKS[fw].installed():
            if args.recipe:
                p.error(f"--recipe {fw} needs {dist} installed (pip install {dist}=={FRAMEWORKS[fw].release})")
            recipes.remove(fw)
            print(f"{dist} is not installed: skipping the {fw} recipe", file=sys.stderr)
    if "reform_megatron" in recipes and not available("megatron-core"):
        recipes.remove("reform_megatron")
    if "megatron" in recipes and not available("megatron-core"):
        if args.recipe:
            p.error("--recipe megatron needs megatron-core 0.16 installed (pip install 'megatron-core>=0.16,<0.17')")
        recipes.remove("megatron")
        print("megatron-core is not installed: skipping the megatron recipe", file=sys.stderr)
    return recipes


def _measure_points(
    args: argparse.Namespace, impls: list[str], recipes: list[str], paths: list[str], worlds: list[int], cache: str
) -> list[dict]:
    """Every point, each measurement in a worker process of its own (per rankmesh point, first one
    on a fresh install: an empty ``cache``); returns the samples, printing each one's line."""
    samples = []
    for recipe in recipes:
        for path in paths:
            for world in worlds:
                for impl in impls:
                    if (impl, recipe, path) in NOT_MEASURABLE:
                        continue
                    fresh = impl == "rankmesh"  # first a process on a fresh install: an empty cache
                    if fresh:
                        shutil.rmtree(cache, ignore_errors=True)
                    for i in range(_samples(args, impl, world)):
                        worker = ["--worker", impl, "--recipe", recipe, "--path", path, "--world", str(world)]
                        switch = impl == "rankmesh" and recipe in SWITCHED
                        rank = world // 2 + 3 if args.rank == "mid" else args.rank
                        s = _run_worker([*worker, "--rank", str(rank)], cache, switch=switch)
                        s["fresh"] = fresh and i == 0
                        samples.append(s)
                        print(
                            f"  {recipe:13s} {path:11s} {impl:8s} W={world:>9,}  {_fmt_s(s['total_s']):>10}  "
                            f"cold {_fmt_s(s['cold_s']):>10}{' (fresh install)' if s['fresh'] else ''}  "
                            f"+{s['extra_rss_mb']:.1f} MB  {s['process_groups']} PGs",
                            file=sys.stderr,
                        )
    return samples


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    p = _parser()
    args = p.parse_args(argv)

    if args.worker:
        print(json.dumps(measure(args.worker, args.recipe[0], args.path[0], args.world, args.rank)))
        return 0
    if args.split_call:
        print(json.dumps(measure_split_call(args.world)))
        return 0

    worlds = parse_worlds(p, args.worlds)
    bad = [w for w in worlds if w < 256 or w > 2**30]
    if bad:
        p.error(f"--worlds: sizes must be between 2^8 and 2^30 for this config, got {bad}")
    impls, recipes, paths = args.impl or list(IMPLS), _installed_recipes(p, args), args.path or list(PATHS)
    print(heads_up(args, impls, recipes, paths, worlds), end="", file=sys.stderr, flush=True)
    cache = os.path.join(tempfile.mkdtemp(prefix="rankmesh-bench-"), "cache")  # this run's verdicts
    samples = _measure_points(args, impls, recipes, paths, worlds, cache)
    split_calls = []
    if "split_group" in paths:
        split_calls = [_run_worker(["--split-call", "--world", str(w)], cache) for w in worlds]
    shutil.rmtree(os.path.dirname(cache), ignore_errors=True)
    out = results_dir(args.out)
    write_results(out, samples, split_calls, impls)
    print(f"results written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
