"""Benchmark: torchtitan-style mesh init, rankmesh vs stock torch, side by side in one run.

Config tp=8 pp=4 cp=2 ep=8 dp_replicate=2 dp_shard=auto, fake backend, one fresh process per
measurement standing in for one rank. Each measurement is ``build_mesh()`` plus fetching every
single-dim mesh and every combination inside one global mesh. Reported per world size: median
time, the ratio, peak RSS added by the build, and the process groups this rank holds.

Usage::

    rankmesh bench                          # default worlds 2^10 .. 2^20, writes benches/results
    rankmesh bench --worlds 10,17 --repeats 3
    python -m rankmesh.bench --worker rankmesh --world 131072   # one measurement, JSON out
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIG = dict(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1)
DEFAULT_WORLDS = "10,12,14,16,17,18,20"
IMPLS = ("rankmesh", "torch", "groups-only")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(impl: str, world: int, rank: int) -> dict:
    """One measurement in this process: init the fake default group, build, fetch everything."""
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from torch.distributed.distributed_c10d import _world
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from rankmesh._stock import all_requests

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    requests = all_requests()
    # DeviceMesh slicing imports these lazily on first use (~0.3 s); both sides would pay it once
    # per process, and a training job has them loaded anyway. Import cost is not mesh init.
    import torch.fx.experimental.proxy_tensor  # noqa: F401
    from rankmesh import _torchtitan as _tt
    from rankmesh.parallel_dims import ParallelDims
    from rankmesh.torch_layer import MeshBuilder

    pgs_before = len(_world.pg_map)
    rss_before = _rss_mb()
    t0 = time.perf_counter()
    if impl == "rankmesh":
        pd = ParallelDims(**CONFIG, world_size=world)
        pd.build_mesh(device_type="cpu")
        get = pd.get_optional_mesh
    elif impl == "groups-only":
        # rankmesh's own work without torch's DeviceMesh objects: every layout, and this rank's
        # process group for every dim of every mesh (the floor analysis in the README).
        pd = ParallelDims(**CONFIG, world_size=world)
        layouts = pd.layouts
        builder = MeshBuilder(layouts["world"], device_type="cpu")
        for name, lay in layouts.items():
            fake = _tt.fake_dims(name, lay, pd.ep)
            for d in lay.names:
                builder.process_group(lay, d, fake=d in fake)
        get = lambda r: None  # noqa: E731  (no DeviceMesh to fetch)
    else:
        from rankmesh._stock import stock_build

        build = stock_build(**CONFIG, world_size=world, device_type="cpu")
        get = build.get_optional_mesh
    t1 = time.perf_counter()
    fetched = sum(get(r) is not None for r in requests)
    t2 = time.perf_counter()
    out = {
        "impl": impl,
        "world": world,
        "rank": rank,
        "build_s": t1 - t0,
        "fetch_s": t2 - t1,
        "total_s": t2 - t0,
        "meshes_fetched": fetched,
        "process_groups": len(_world.pg_map) - pgs_before,
        "extra_rss_mb": max(0.0, _peak_rss_mb() - rss_before),
        "peak_rss_mb": _peak_rss_mb(),
    }
    dist.destroy_process_group()
    return out


def _run_worker(impl: str, world: int, rank: int) -> dict:
    cmd = [sys.executable, "-m", "rankmesh.bench", "--worker", impl, "--world", str(world), "--rank", str(rank)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"benchmark worker failed: {' '.join(cmd)}\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def summarize(samples: list[dict]) -> list[dict]:
    rows = []
    for world in sorted({s["world"] for s in samples}):
        row: dict = {"world": world}
        for impl in IMPLS:
            mine = [s for s in samples if s["world"] == world and s["impl"] == impl]
            if not mine:
                continue
            row[impl] = {
                "median_s": statistics.median(s["total_s"] for s in mine),
                "build_s": statistics.median(s["build_s"] for s in mine),
                "extra_rss_mb": statistics.median(s["extra_rss_mb"] for s in mine),
                "process_groups": mine[0]["process_groups"],
                "repeats": len(mine),
            }
        if "rankmesh" in row and "torch" in row:
            row["speedup"] = row["torch"]["median_s"] / row["rankmesh"]["median_s"]
        if "groups-only" in row and "torch" in row:
            row["speedup_floorless"] = row["torch"]["median_s"] / row["groups-only"]["median_s"]
        rows.append(row)
    return rows


def to_markdown(rows: list[dict]) -> str:
    lines = [
        "| world size | stock torch | rankmesh | speed-up | extra RSS torch | extra RSS rankmesh "
        "| PGs/rank torch | PGs/rank rankmesh | rankmesh without DeviceMesh objects | speed-up without them |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t, m, g = r.get("torch"), r.get("rankmesh"), r.get("groups-only")
        cell = lambda x, k, f: f(x[k]) if x else "–"  # noqa: E731
        speed = f"{r['speedup']:,.0f}×" if "speedup" in r else "–"
        floorless = f"{r['speedup_floorless']:,.0f}×" if "speedup_floorless" in r else "–"
        lines.append(
            f"| {r['world']:,} | {cell(t, 'median_s', _fmt_s)} | {cell(m, 'median_s', _fmt_s)} | {speed} "
            f"| {cell(t, 'extra_rss_mb', lambda v: f'{v:,.0f} MB')} | {cell(m, 'extra_rss_mb', lambda v: f'{v:,.1f} MB')} "
            f"| {cell(t, 'process_groups', str)} | {cell(m, 'process_groups', str)} "
            f"| {cell(g, 'median_s', _fmt_s)} | {floorless} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = {"torch": "stock torch", "rankmesh": "rankmesh (with torch DeviceMesh objects)", "groups-only": "rankmesh layouts + process groups only"}
    for impl, color in (("torch", "tab:red"), ("rankmesh", "tab:blue"), ("groups-only", "tab:green")):
        pts = [(r["world"], r[impl]) for r in rows if impl in r]
        if not pts:
            continue
        label = labels[impl]
        ax.plot([w for w, _ in pts], [v["median_s"] * 1e3 for _, v in pts], "o-", color=color, label=label)
        ax2.plot([w for w, _ in pts], [v["extra_rss_mb"] for _, v in pts], "o-", color=color, label=label)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("world size (ranks)")
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    ax.set_yscale("log")
    ax.set_ylabel("build + fetch all meshes, one rank (ms, median)")
    ax.set_title("torchtitan mesh init per rank (fake backend)")
    ax2.set_ylabel("extra peak RSS (MB)")
    ax2.set_title("memory added by the build")
    fig.suptitle("tp=8 pp=4 cp=2 ep=8 dp_replicate=2 dp_shard=auto, 2-core CPU", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rankmesh bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default=DEFAULT_WORLDS, help=f"log2 world sizes, comma-separated (default {DEFAULT_WORLDS})")
    p.add_argument("--repeats", type=int, default=5, help="measurements per point for rankmesh (default 5)")
    p.add_argument("--torch-repeats", type=int, default=3, help="stock torch measurements per point below 2^17 (default 3; 1 above)")
    p.add_argument("--impl", choices=IMPLS, action="append", help="only these implementations")
    p.add_argument("--rank", type=int, default=None, help="rank to stand in for (default: 0)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benches/results when run from the repo)")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        print(json.dumps(measure(args.worker, args.world, args.rank or 0)))
        return 0

    try:
        worlds = [1 << int(x) for x in args.worlds.split(",")]
    except ValueError:
        p.error(f"--worlds must be comma-separated integers (log2 sizes), got {args.worlds!r}")
    bad = [w for w in worlds if w < 256 or w > 2**30]
    if bad:
        p.error(f"--worlds: sizes must be between 2^8 and 2^30 for this config, got {bad}")
    impls = args.impl or list(IMPLS)
    samples = []
    for world in worlds:
        for impl in impls:
            n = args.repeats if impl != "torch" else (args.torch_repeats if world < 2**17 else 1)
            for _ in range(n):
                s = _run_worker(impl, world, args.rank or 0)
                samples.append(s)
                print(f"  {impl:8s} W={world:>9,}  {_fmt_s(s['total_s']):>10}  +{s['extra_rss_mb']:.1f} MB  {s['process_groups']} PGs", file=sys.stderr)
    rows = summarize(samples)
    table = to_markdown(rows)
    print(table)
    out = args.out
    if out is None:
        repo = Path(__file__).resolve().parents[2]
        out = repo / "benches" / "results" if (repo / "benches").is_dir() else Path("bench-results")
    out.mkdir(parents=True, exist_ok=True)
    import torch

    meta = {"torch": torch.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count(), "config": CONFIG}
    (out / "parallel_dims.json").write_text(json.dumps({"meta": meta, "rows": rows, "samples": samples}, indent=1))
    (out / "parallel_dims.md").write_text(table + "\n")
    if {"torch", "rankmesh"} <= set(impls):
        plot(rows, out / "parallel_dims.png")
    print(f"results written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
