"""End-to-end demo: torchtitan's meshes and model for one rank of a 131,072-rank world, on the fake backend.

1. Builds the meshes with :class:`rankmesh.ParallelDims`, prints every mesh with this rank's groups
   and the process groups created, then builds the same meshes with stock torch in the same
   process, checks that every group and local mesh is identical, and prints both timings.
2. Time to a parallelised model on torchtitan 0.3.0's default backend (``spmd_types``): Llama3 8B's
   shape, tp 8 x dp_shard 256, stock torch and ``rankmesh.torchtitan.accelerate()`` side by side,
   each in a fresh process (``rankmesh bench model``'s worker), per phase.

Every figure is the first call, what a trainer waits for (it builds its meshes once per process):
the modules are imported before timing; nothing is warmed up.

    python -m rankmesh.bench.demo                 # W = 131072, rank 0
    python -m rankmesh.bench.demo --world-size 1048576 --rank 777 --no-stock
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from rankmesh.plan import format_group

if TYPE_CHECKING:
    from rankmesh import ParallelDims


def _parser() -> argparse.ArgumentParser:
    """The demo's command line: the world, the rank, the degrees, and the parts to skip."""
    p = argparse.ArgumentParser(
        prog="python -m rankmesh.bench.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--world-size", type=int, default=131072)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--pp", type=int, default=4)
    p.add_argument("--cp", type=int, default=2)
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--etp", type=int, default=1)
    p.add_argument("--dp-replicate", type=int, default=2)
    p.add_argument("--dp-shard", type=int, default=-1)
    p.add_argument("--no-stock", action="store_true", help="skip the stock-torch comparison")
    p.add_argument("--no-model", action="store_true", help="skip the time to a parallelised model (part 2)")
    return p


def _print_build(pd: ParallelDims, ours: dict, requests: list, pgs: int, seconds: float) -> None:
    """Prints what rankmesh built: the resolved degrees, this rank's 1-D meshes and their groups,
    the global meshes, the process groups created and the time taken."""
    from torch.distributed.device_mesh import DeviceMesh

    print(
        f"\nresolved degrees: dp_replicate={pd.dp_replicate} dp_shard={pd.dp_shard} cp={pd.cp} tp={pd.tp} "
        f"pp={pd.pp} ep={pd.ep} etp={pd.etp}"
    )
    print("\n1-D meshes of this rank (name: size -> ranks of its group):")
    for name, mesh in pd._meshes.items():
        ranks = mesh.mesh.flatten().tolist()
        state = "" if mesh.size() > 1 or name == "efsdp" and pd.ep > 1 else "  (disabled: fake backend)"
        print(f"  {name:13s} {mesh.size():>7,}  {format_group(ranks)}{state}")
    shapes = ", ".join(f"{k}{tuple(m.mesh_dim_names)}={tuple(m.shape)}" for k, m in pd._global_meshes.items())
    print(f"\nglobal meshes: {shapes}")
    report = pd.build_report
    print(f"process groups created by rankmesh on this rank: {pgs} ({report})")
    real = all(isinstance(m, DeviceMesh) for m in ours.values() if m is not None)
    print(f"meshes are real torch DeviceMesh objects: {real}")
    print(
        f"rankmesh: build_mesh() + fetching {len(requests)} meshes/combinations: {seconds * 1e3:,.1f} ms "
        "(first call in this process)"
    )


def _mismatches(ours: dict, theirs: dict) -> list:
    """The requests whose mesh differs between the two builds (one of them absent, or another
    rank grid, coordinate or group's ranks on some dim); empty when they all agree."""
    import torch.distributed as dist

    mismatches = []
    for key, a in ours.items():
        b = theirs[key]
        if (a is None) != (b is None):
            mismatches.append(key)
            continue
        if a is None:
            continue
        same = a.mesh.tolist() == b.mesh.tolist() and a.get_coordinate() == b.get_coordinate()
        for d in range(a.ndim):
            same &= dist.get_process_group_ranks(a.get_group(d)) == dist.get_process_group_ranks(b.get_group(d))
        if not same:
            mismatches.append(key)
    return mismatches


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    import torch
    import torch.distributed as dist

    from rankmesh import ParallelDims
    from rankmesh._fast_groups import init_fake_world, registered_groups
    from rankmesh.bench.stock import all_requests, stock_build

    cfg = dict(
        dp_replicate=args.dp_replicate,
        dp_shard=args.dp_shard,
        cp=args.cp,
        tp=args.tp,
        pp=args.pp,
        ep=args.ep,
        etp=args.etp,
        world_size=args.world_size,
    )
    requests = all_requests()
    # Imports are not timed (torch 2.15's first DeviceMesh slice imports torch._dynamo, ~2 s); the
    # rest is: the first build in this process, rankmesh's one-time start-up checks included.
    import torch._dynamo  # noqa: F401
    import torch.fx.experimental.proxy_tensor  # noqa: F401  (DeviceMesh slicing imports it lazily)

    init_fake_world(args.world_size, args.rank)
    print(
        f"rankmesh demo: rank {args.rank:,} of {args.world_size:,}, fake backend, torch {torch.__version__}, "
        f"config {cfg}"
    )
    pgs0 = registered_groups()
    t0 = time.perf_counter()
    pd = ParallelDims(**cfg)
    pd.build_mesh(device_type="cpu")
    ours = {tuple(r): pd.get_optional_mesh(r) for r in requests}
    t_ours = time.perf_counter() - t0
    pgs_ours = registered_groups() - pgs0
    _print_build(pd, ours, requests, pgs_ours, t_ours)

    if args.no_stock:
        dist.destroy_process_group()
        return 0 if args.no_model else _model(args.world_size, stock=False)
    print("\nstock torch (torchtitan-style DeviceMesh build), same process and default group ...", flush=True)
    pgs1 = registered_groups()
    t0 = time.perf_counter()
    stock = stock_build(**cfg, device_type="cpu")
    theirs = {tuple(r): stock.get_optional_mesh(r) for r in requests}
    t_stock = time.perf_counter() - t0
    pgs_stock = registered_groups() - pgs1

    mismatches = _mismatches(ours, theirs)
    print(f"stock torch: {t_stock:,.2f} s, {pgs_stock} process groups on this rank")
    verdict = "yes" if not mismatches else f"NO: {mismatches}"
    print(f"identical meshes, coordinates and group ranks for all {len(requests)} requests: {verdict}")
    print(f"\nspeed-up: {t_stock / t_ours:,.0f}x  ({t_stock:,.2f} s -> {t_ours * 1e3:,.1f} ms)")
    dist.destroy_process_group()
    if mismatches:
        return 1
    return 0 if args.no_model else _model(args.world_size, stock=True)


def _model(world: int, *, stock: bool) -> int:
    """Part 2: time to a parallelised model on torchtitan's default backend, each side in a fresh
    process (the first call; imports excluded)."""
    from rankmesh._dependencies import available
    from rankmesh.bench.meshes import _fmt_s
    from rankmesh.bench.model import _run_worker

    name = "titan_llama3_spmd_types"
    if not (available("torchtitan") and available("spmd_types")):
        print("\n(time to a parallelised model: needs torchtitan 0.3.0 and spmd_types; not installed, skipped)")
        return 0
    print(
        f"\ntime to a parallelised model: torchtitan 0.3.0's Llama3 8B shape on its default spmd_backend "
        f"(spmd_types), tp 8 x dp_shard 256, rank {world // 2 + 3:,} of {world:,}; first call in a fresh process",
        flush=True,
    )
    runs = {}
    for impl in ("rankmesh", "torch") if stock else ("rankmesh",):
        runs[impl] = _run_worker(["--worker", impl, "--workload", name, "--world", str(world), "--cold-only"])
    phases = [ph for ph in ("mesh", "model", "parallelise") if any(ph in r["cold_phases"] for r in runs.values())]
    print(f"  {'phase':12s} {'stock torch':>12s} {'rankmesh':>12s}")
    for ph in [*phases, "total"]:
        cells = []
        for impl in ("torch", "rankmesh"):
            r = runs.get(impl)
            v = None if r is None else (r["cold_total_s"] if ph == "total" else r["cold_phases"].get(ph))
            cells.append(_fmt_s(v) if v is not None else "-")
        print(f"  {ph:12s} {cells[0]:>12s} {cells[1]:>12s}")
    if stock:
        t, m = runs["torch"]["cold_total_s"], runs["rankmesh"]["cold_total_s"]
        print(
            f"  speed-up: {t / m:,.1f}x; process groups on this rank: {runs['torch']['process_groups']} stock, "
            f"{runs['rankmesh']['process_groups']} rankmesh"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
