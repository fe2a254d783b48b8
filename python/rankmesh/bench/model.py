"""Benchmark: time to a parallelised model, stock torch vs rankmesh, side by side in one run.

``rankmesh bench model`` runs each workload of :mod:`rankmesh.bench.workloads` (and, with
torchtitan 0.3.0 installed, :mod:`rankmesh.bench.titan_workloads`; with megatron-core 0.16,
:mod:`rankmesh.bench.megatron_fsdp`) for one rank, ``W/2 + 3``, of worlds 2^12, 2^17 and 2^20 on
the fake backend, once on stock torch's meshes and once on rankmesh's, in a fresh process per
measurement, twice in that process. The torchtitan workloads' rankmesh side is the one switch
alone: torchtitan's own Trainer steps in a worker started with ``RANKMESH_ACCELERATE=1``, nothing of
rankmesh called (the others call rankmesh's meshes, or its Megatron-FSDP patch, by name):

- **cold**: the first call, what a trainer waits for (it builds its meshes once per process): the
  modules the workload uses are imported first (imports are not counted), everything else is, the
  one-time start-up checks of rankmesh and torch's own first-use work included;
- **warm**: the same call again, in the same process, at the same world.

Reported per point: the median of each phase (mesh, model, parallelise, step) of the warm call, the
cold call's total, the peak RSS the warm call added (VmHWM reset before it), and the process groups
it created on this rank.

The targets: rankmesh's parallelise phase at 2^20 within 1.25x of its time at 2^12
(same group shapes), and at most 64 MB more peak extra RSS.

Usage::

    rankmesh bench model                                   # every workload, worlds 12,17,20
    rankmesh bench model --workload fsdp_tp --worlds 12,20 --repeats 3
    python -m rankmesh.bench.model --worker rankmesh --workload fsdp_tp --world 1048576
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rankmesh._dependencies import available
from rankmesh.bench.meshes import _fmt_s, _peak_rss_mb, _reset_peak_rss, _rss_mb, machine, parse_worlds, results_dir

IMPLS = ("torch", "rankmesh")
DEFAULT_WORLDS = "12,17,20"
PHASES = ("mesh", "model", "parallelise", "step")


def _workloads() -> dict:
    from rankmesh.bench import workloads

    out = dict(workloads.WORKLOADS)
    if available("torchtitan"):
        from rankmesh.bench import titan_workloads

        out.update(titan_workloads.WORKLOADS)
    if available("megatron-core") and available("einops"):
        from rankmesh.bench import megatron_fsdp

        out.update(megatron_fsdp.WORKLOADS)
    return out


def _min_world(name: str) -> int:
    from rankmesh.bench import workloads

    if name.startswith("megatron_fsdp"):
        from rankmesh.bench import megatron_fsdp

        return megatron_fsdp.MIN_WORLD[name]
    return workloads.MIN_WORLD.get(name) or _titan_min_world(name)


def _titan_min_world(name: str) -> int:
    from rankmesh.bench import titan_workloads

    return titan_workloads.MIN_WORLD[name]


def _import_everything(name: str) -> None:
    """The modules a workload uses, imported and nothing run (imports are not the cold figure)."""
    import importlib

    mods = [
        "torch._dynamo",  # torch 2.15's first DeviceMesh slice imports it
        "torch.distributed.tensor",
        "torch.distributed.tensor.parallel",
        "torch.distributed.fsdp",
        "rankmesh.mesh",
        "rankmesh._devicemesh_torch",  # the patches' torch side, imported by their first call
        "rankmesh.bench.workloads",
        "rankmesh.torchtitan",
    ]
    if name.startswith("titan_"):
        mods += [
            "rankmesh.bench.titan_workloads",
            "torchtitan.distributed.parallel_dims",
            "torchtitan.models.llama3",
            "torchtitan.models.deepseek_v3",
            "rankmesh.torchtitan.spmd_axis",
            "spmd_types",
        ]
    if name.startswith("megatron_fsdp"):
        mods += [
            "rankmesh.bench.megatron_fsdp",
            "rankmesh.megatron.parallel_state",
            "rankmesh.megatron.groups",
            "rankmesh.megatron.fsdp",
            "megatron.core.parallel_state",
            "megatron.core.distributed.fsdp.mcore_fsdp_adapter",
        ]
    for m in mods:
        with contextlib.suppress(ImportError):
            importlib.import_module(m)


def _one(impl: str, fn: Any, world: int, rank: int) -> tuple[Any, float, int, float]:
    import gc

    import torch.distributed as dist

    from rankmesh._fast_groups import init_fake_world, registered_groups

    init_fake_world(world, rank)
    pgs_before = registered_groups()
    gc.collect()  # an earlier run's garbage is not this run's (a gen-2 pass costs ~0.15 s here)
    _reset_peak_rss()
    rss_before = _rss_mb()
    t0 = time.perf_counter()
    run = fn(impl, world)
    total = time.perf_counter() - t0
    pgs, rss = registered_groups() - pgs_before, max(0.0, _peak_rss_mb() - rss_before)
    dist.destroy_process_group()
    return run, total, pgs, rss


def measure(impl: str, name: str, world: int, *, warm: bool = True) -> dict:
    """One measurement in this process: the cold first call, then (``warm``) the warm second one
    (see the module); without ``warm`` the warm fields repeat the cold call's."""
    import warnings

    warnings.simplefilter("ignore")
    import torch

    _import_everything(name)
    fn = _workloads()[name]
    rank = world // 2 + 3
    side = "switch" if impl == "rankmesh" and _switched(name) else impl  # no rankmesh call in the run
    cold, cold_total, cold_pgs, cold_rss = _one(side, fn, world, rank)
    cold_phases = dict(cold.phases)
    if warm:
        del cold
        run, total, pgs, rss = _one(side, fn, world, rank)
    else:
        run, total, pgs, rss = cold, cold_total, cold_pgs, cold_rss
    return {
        "impl": impl,
        "workload": name,
        "world": world,
        "rank": rank,
        "phases": run.phases,
        "total_s": total,
        "cold_phases": cold_phases,
        "cold_total_s": cold_total,
        "cold_extra_rss_mb": cold_rss,
        "process_groups": pgs,
        "extra_rss_mb": rss,
        "torch": torch.__version__,
    }


def _switched(name: str) -> bool:
    """Whether the rankmesh side of workload ``name`` is the one switch alone: torchtitan's own
    Trainer steps in a worker started with ``RANKMESH_ACCELERATE=1``, no rankmesh call in them."""
    return name.startswith("titan_")


def _run_worker(args: list[str], *, switch: bool = False) -> dict:
    """One worker process, with ``RANKMESH_ACCELERATE=1`` when ``switch`` (else without it)."""
    cmd = [sys.executable, "-m", "rankmesh.bench.model", *args]
    env = {k: v for k, v in os.environ.items() if k != "RANKMESH_ACCELERATE"}
    if switch:
        env["RANKMESH_ACCELERATE"] = "1"
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"benchmark worker failed: {' '.join(cmd)}\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def summarize(samples: list[dict]) -> list[dict]:
    """One row per (workload, world, impl): phase medians, total, RSS and PGs."""
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        groups.setdefault((s["workload"], s["world"], s["impl"]), []).append(s)
    rows = []
    for (name, world, impl), ss in sorted(groups.items()):
        phases = {p: statistics.median(s["phases"].get(p, 0.0) for s in ss) for p in PHASES}
        rows.append(
            {
                "workload": name,
                "world": world,
                "impl": impl,
                "n": len(ss),
                "phases": phases,
                "total_s": statistics.median(s["total_s"] for s in ss),
                # the first call in a fresh process (None for points measured before cold runs existed)
                "cold_total_s": statistics.median(s["cold_total_s"] for s in ss) if "cold_total_s" in ss[0] else None,
                "extra_rss_mb": statistics.median(s["extra_rss_mb"] for s in ss),
                "process_groups": ss[0]["process_groups"],
            }
        )
    return rows


def _cell(row: dict | None, key: str) -> str:
    if row is None:
        return "–"
    if key in PHASES:
        return _fmt_s(row["phases"][key]) if key in row["phases"] and row["phases"][key] else "–"
    return _fmt_s(row[key]) if row.get(key) is not None else "–"


def scaling(rows: list[dict]) -> list[dict]:
    """Per workload: rankmesh's parallelise phase and extra RSS at the largest world vs the smallest."""
    out = []
    for name in sorted({r["workload"] for r in rows}):
        mine = sorted((r for r in rows if r["workload"] == name and r["impl"] == "rankmesh"), key=lambda r: r["world"])
        if len(mine) < 2:
            continue
        lo, hi = mine[0], mine[-1]
        out.append(
            {
                "workload": name,
                "small": lo["world"],
                "large": hi["world"],
                "parallelise_ratio": hi["phases"]["parallelise"] / max(lo["phases"]["parallelise"], 1e-9),
                "rss_delta_mb": hi["extra_rss_mb"] - lo["extra_rss_mb"],
            }
        )
    return out


def to_markdown(rows: list[dict]) -> str:
    by = {(r["workload"], r["world"], r["impl"]): r for r in rows}
    lines = []
    for name in sorted({r["workload"] for r in rows}):
        lines += [
            f"**{name}**",
            "",
            "| world | phase | stock torch | rankmesh | speed-up |",
            "|---:|---|---:|---:|---:|",
        ]
        for world in sorted({r["world"] for r in rows if r["workload"] == name}):
            t, m = by.get((name, world, "torch")), by.get((name, world, "rankmesh"))
            for phase in (*PHASES, "total_s", "cold_total_s"):
                if all(r is None or not (r["phases"].get(phase) if phase in PHASES else r.get(phase)) for r in (t, m)):
                    continue
                tv = None if t is None else (t["phases"].get(phase) if phase in PHASES else t.get(phase))
                mv = None if m is None else (m["phases"].get(phase) if phase in PHASES else m.get(phase))
                ratio = f"{tv / mv:,.1f}×" if tv and mv else "–"
                label = {"total_s": "**total** (warm)", "cold_total_s": "**total, cold** (first call)"}
                label = label.get(phase, phase)
                lines.append(f"| {world:,} | {label} | {_cell(t, phase)} | {_cell(m, phase)} | {ratio} |")
            rss = [f"{r['extra_rss_mb']:,.0f} MB" if r else "–" for r in (t, m)]
            pgs = [str(r["process_groups"]) if r else "–" for r in (t, m)]
            lines.append(f"| {world:,} | extra RSS | {rss[0]} | {rss[1]} | |")
            lines.append(f"| {world:,} | process groups per rank | {pgs[0]} | {pgs[1]} | |")
        lines.append("")
    sc = scaling(rows)
    if sc:
        lines += [
            "**Scaling of rankmesh's parallelise phase** (target: ≤ 1.25× and ≤ 64 MB more extra RSS)",
            "",
            "| workload | worlds | parallelise, largest / smallest | extra RSS, largest − smallest |",
            "|---|---|---:|---:|",
        ]
        for s in sc:
            lines.append(
                f"| {s['workload']} | {s['small']:,} → {s['large']:,} | {s['parallelise_ratio']:.2f}× "
                f"| {s['rss_delta_mb']:+.0f} MB |"
            )
        lines.append("")
    return "\n".join(lines)


#: The workloads the headline plot draws (those present): the README's rows.
HEADLINE = {
    "titan_llama3_spmd_types": "torchtitan 0.3.0, Llama3 8B to parallelised",
    "fsdp_tp": "FSDP2 + TP script",
    "distill": "distillation, two half-world meshes",
    "megatron_fsdp": "Megatron-FSDP, parallel_state + its meshes",
}


def plot(rows: list[dict], path: Path, title: str) -> None:
    """The headline plot: the **first call** (what a trainer waits for) against the world size for
    the :data:`HEADLINE` workloads, stock dashed and rankmesh solid in one colour per workload, each
    line labelled at its end (no legend to search)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is optional
        return
    names = [n for n in HEADLINE if any(r["workload"] == n for r in rows)]
    fig, ax = plt.subplots(figsize=(10, 6))
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    largest = max((r["world"] for r in rows), default=2)
    labels: list[list] = []
    for name, color in zip(names, colors):
        for impl, style in (("torch", "--"), ("rankmesh", "-")):
            pts = sorted((r["world"], r["cold_total_s"]) for r in rows if r["workload"] == name and r["impl"] == impl)
            if not pts:
                continue
            ax.plot(*zip(*pts), style, marker="o", color=color, linewidth=2 if impl == "rankmesh" else 1.2)
            who = "stock torch" if impl == "torch" else "rankmesh"
            labels.append([pts[-1][1], pts[-1][0], f"{HEADLINE[name]}: {who}", color])
    labels.sort()
    for below, label in zip(labels, labels[1:]):  # labels at least a factor 1.35 apart: none overlap
        label[0] = max(label[0], below[0] * 1.35)
    for y, x, text, color in labels:
        ax.annotate(text, (x, y), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8, color=color)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    worlds = sorted({r["world"] for r in rows})
    ax.set_xticks(worlds, [f"$2^{{{w.bit_length() - 1}}}$" for w in worlds])
    ax.set_xlim(right=largest * 64)  # room for the labels
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("first call, seconds per rank (dashed: stock torch; solid: rankmesh)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="rankmesh bench model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--worlds", default=DEFAULT_WORLDS, help=f"log2 world sizes (default {DEFAULT_WORLDS})")
    p.add_argument("--repeats", type=int, default=3, help="measurements per point (default 3; stock: 1 from 2^17)")
    p.add_argument("--workload", action="append", help="only these workloads (default: all)")
    p.add_argument("--impl", choices=IMPLS, action="append", help="only these implementations")
    p.add_argument(
        "--torch-max-world",
        type=int,
        default=30,
        help="log2 of the largest world stock torch is measured at (default: all; a stock torchtitan point "
        "at 2^20 takes minutes)",
    )
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benches/results in the repo)")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--cold-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    known = _workloads()
    for name in args.workload or ():
        if name not in known:
            p.error(f"--workload {name!r}: choose from {sorted(known)}")
    if args.worker:
        print(json.dumps(measure(args.worker, args.workload[0], args.world, warm=not args.cold_only)))
        return 0
    worlds = parse_worlds(p, args.worlds)
    names = args.workload or sorted(known)
    impls = args.impl or list(IMPLS)
    samples = []
    for name in names:
        for world in worlds:
            if world < _min_world(name):
                print(f"  {name}: skipping W={world:,} (needs at least {_min_world(name):,})", file=sys.stderr)
                continue
            for impl in impls:
                if impl == "torch" and world > 1 << args.torch_max_world:
                    continue
                n = args.repeats if impl != "torch" or world < 2**17 else 1
                for _ in range(n):
                    worker = ["--worker", impl, "--workload", name, "--world", str(world)]
                    s = _run_worker(worker, switch=impl == "rankmesh" and _switched(name))
                    samples.append(s)
                    ph = " ".join(f"{k}={_fmt_s(v)}" for k, v in s["phases"].items())
                    print(
                        f"  {name:22s} {impl:8s} W={world:>9,}  {ph}  +{s['extra_rss_mb']:.1f} MB  "
                        f"{s['process_groups']} PGs",
                        file=sys.stderr,
                    )
    out = results_dir(args.out)
    import torch

    tv = torch.__version__.split("+")[0]
    stem = f"model_torch{tv}"
    measured = {(s["workload"], s["world"], s["impl"]) for s in samples}
    previous = out / f"{stem}.json"
    if previous.is_file():  # a run replaces the points it measured and keeps the others
        old = json.loads(previous.read_text())
        samples = [
            s for s in old.get("samples", []) if (s["workload"], s["world"], s["impl"]) not in measured
        ] + samples
    rows = summarize(samples)
    table = to_markdown(rows)
    print(table)
    meta = {"torch": torch.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count()}
    previous.write_text(
        json.dumps({"meta": meta, "rows": rows, "scaling": scaling(rows), "samples": samples}, indent=1)
    )
    (out / f"{stem}.md").write_text(
        f"torch {tv}, {meta['cpus']} CPUs, fake backend, one rank (W/2+3), time to a parallelised model\n\n"
        + table
        + "\n"
    )
    title = f"torch {tv}: first call to a parallelised model, one rank (W/2+3), fake backend, {machine()}"
    plot(rows, out / f"{stem}.png", title)
    print(f"results written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
