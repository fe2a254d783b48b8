"""What a run of ``rankmesh bench`` reports (:mod:`rankmesh.bench.meshes` measures): the rows
summarised from its samples, the markdown tables, the plots and the results files.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from rankmesh.bench.frameworks import FRAMEWORKS
from rankmesh.bench.points import CONFIG, IMPLS, NOT_MEASURABLE, PATHS, RECIPES, REFORM_RECIPES


def machine() -> str:
    """The measuring machine as plot titles name it, e.g. ``"2-CPU x86_64 Linux"``."""
    import platform

    return f"{os.cpu_count()}-CPU {platform.machine()} {platform.system()}"


def _fmt_count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.2f} s"


def summarize(samples: list[dict]) -> list[dict]:
    rows = []
    keys = sorted(
        {(s["recipe"], s["path"], s["world"]) for s in samples},
        key=lambda k: (RECIPES.index(k[0]), PATHS.index(k[1]), k[2]),
    )
    for recipe, path, world in keys:
        row: dict = {"recipe": recipe, "path": path, "world": world}
        for impl in IMPLS:
            point = [
                s for s in samples if (s["recipe"], s["path"], s["world"], s["impl"]) == (recipe, path, world, impl)
            ]
            mine = [s for s in point if not s.get("fresh")]
            fresh = [s["cold_s"] for s in point if s.get("fresh")]
            if mine:
                row[impl] = {
                    "median_s": statistics.median(s["total_s"] for s in mine),
                    "cold_s": statistics.median(s["cold_s"] for s in mine) if "cold_s" in mine[0] else None,
                    "fresh_s": statistics.median(fresh) if fresh else None,  # first process, empty cache
                    "extra_rss_mb": statistics.median(s["extra_rss_mb"] for s in mine),
                    "process_groups": mine[0]["process_groups"],
                    "members": mine[0].get("members"),
                    "meshes": mine[0]["meshes_fetched"],
                    "repeats": len(mine),
                }
        if "rankmesh" in row and "torch" in row:
            row["speedup"] = row["torch"]["median_s"] / row["rankmesh"]["median_s"]
            if row["torch"]["cold_s"] and row["rankmesh"]["cold_s"]:
                row["cold_speedup"] = row["torch"]["cold_s"] / row["rankmesh"]["cold_s"]
        rows.append(row)
    return rows


def member_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """The least-squares line ``seconds = fixed + per_member * members`` through ``(members,
    seconds)`` points: what a build costs apart from its groups' members, and per member.

    >>> member_fit([(100, 0.002 + 100 * 50e-9), (10_000, 0.002 + 10_000 * 50e-9), (90_000, 0.0065)])
    (0.002, 5e-08)
    """
    n = len(points)
    mean_m = sum(m for m, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    var = sum((m - mean_m) ** 2 for m, _ in points)
    per_member = sum((m - mean_m) * (t - mean_t) for m, t in points) / var if var else 0.0
    return round(mean_t - per_member * mean_m, 12), round(per_member, 15)


def _growth_lines(mine: list[dict]) -> list[str]:
    """Below a recipe's table: how rankmesh's first call grows from the smallest world to the
    largest, how much its groups' members grew, and the same growth with the members' share taken
    out (a :func:`member_fit` over the worlds measured)."""
    pts = [(r["world"], r["rankmesh"]["members"], r["rankmesh"]["cold_s"]) for r in mine if "rankmesh" in r]
    pts = [p for p in pts if p[1] is not None and p[2]]
    if len(pts) < 3 or pts[0][1] == pts[-1][1]:
        return []
    fixed, per_member = member_fit([(m, t) for _, m, t in pts])
    (w0, m0, t0), (w1, m1, t1) = pts[0], pts[-1]
    rest0, rest1 = t0 - per_member * m0, t1 - per_member * m1
    rest = f"{rest1 / rest0:.2f}×" if rest0 > 0 and rest1 > 0 else "–"
    return [
        "",
        f"rankmesh, first call, {w0:,} → {w1:,} ranks: {t1 / t0:.2f}× while its groups' members grew "
        f"{m1 / max(m0, 1):,.0f}× ({m0:,} → {m1:,}); fitted over the {len(pts)} worlds, "
        f"{_fmt_s(fixed)} + {per_member * 1e9:,.0f} ns per member, and apart from the members {rest}.",
    ]


def to_markdown(rows: list[dict], split_calls: list[dict]) -> str:
    lines = []
    for recipe in RECIPES:
        for path in PATHS:
            mine = [r for r in rows if (r["recipe"], r["path"]) == (recipe, path)]
            if not mine:
                continue
            n = next((r[i]["meshes"] for r in mine for i in IMPLS if i in r), "?")
            lines += [
                f"**{recipe}, {path} path** ({n} meshes per build)",
                "",
                "| world size | stock torch, cold | rankmesh, cold | speed-up, cold | rankmesh, cold, fresh install "
                "| stock torch, warm | rankmesh, warm | speed-up, warm | extra RSS torch | extra RSS rankmesh "
                "| PGs/rank torch | PGs/rank rankmesh | members/rank torch | members/rank rankmesh |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for r in mine:
                t, m = r.get("torch"), r.get("rankmesh")
                cell = lambda x, k, f: f(x[k]) if x else "–"  # noqa: E731
                speed = f"{r['speedup']:,.0f}×" if "speedup" in r else "–"
                cold_speed = f"{r['cold_speedup']:,.0f}×" if "cold_speedup" in r else "–"
                cold = lambda x, k="cold_s": _fmt_s(x[k]) if x and x.get(k) else "–"  # noqa: E731
                lines.append(
                    f"| {r['world']:,} | {cold(t)} | {cold(m)} | {cold_speed} | {cold(m, 'fresh_s')} "
                    f"| {cell(t, 'median_s', _fmt_s)} | {cell(m, 'median_s', _fmt_s)} | {speed} "
                    f"| {cell(t, 'extra_rss_mb', lambda v: f'{v:,.0f} MB')} "
                    f"| {cell(m, 'extra_rss_mb', lambda v: f'{v:,.1f} MB')} "
                    f"| {cell(t, 'process_groups', str)} | {cell(m, 'process_groups', str)} "
                    f"| {cell(t, 'members', _fmt_count)} | {cell(m, 'members', _fmt_count)} |"
                )
            lines += _growth_lines(mine)
            if ("torch", recipe, path) in NOT_MEASURABLE:
                lines += ["", f"Stock not measured here: {NOT_MEASURABLE['torch', recipe, path]}."]
            lines.append("")
    if split_calls:
        lines += [
            "**One `split_group` call** (an 8-rank split of the default group bound to a device)",
            "",
            "| world size | torch's split_group | torch's, rank table narrowed (fallback) | rankmesh's own split |",
            "|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {c['world']:,} | {_fmt_s(c['torch'])} | {_fmt_s(c['rankmesh'])} "
            f"| {_fmt_s(c['rankmesh_split']) if c.get('rankmesh_split') is not None else '–'} |"
            for c in split_calls
        ]
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, recipes: tuple[str, ...] = RECIPES) -> None:
    """The time and memory of ``recipes`` against world size, stock and rankmesh."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    markers = "o", "s", "^", "D", "v", "P", "X", "*", "h"
    styles = {r: markers[i % len(markers)] for i, r in enumerate(recipes)}
    colors = {
        ("torch", "new_group"): "tab:red",
        ("torch", "split_group"): "tab:orange",
        ("rankmesh", "new_group"): "tab:blue",
        ("rankmesh", "split_group"): "tab:cyan",
    }
    for recipe in recipes:
        for p in PATHS:
            for impl in IMPLS:
                pts = [(r["world"], r[impl]) for r in rows if (r["recipe"], r["path"]) == (recipe, p) and impl in r]
                if not pts:
                    continue
                label = f"{'stock torch' if impl == 'torch' else 'rankmesh'}: {recipe}, {p}"
                kw = dict(
                    marker=styles[recipe],
                    color=colors[(impl, p)],
                    label=label,
                    ls={"titan030": "-", "torchtitan": ":", "megatron": "-.", "torch_api": ":"}.get(recipe, "--"),
                )
                ax.plot([w for w, _ in pts], [v["median_s"] * 1e3 for _, v in pts], **kw)
                ax2.plot([w for w, _ in pts], [v["extra_rss_mb"] for _, v in pts], **kw)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("world size (ranks)")
        a.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("mesh init, one rank, real DeviceMesh objects (ms, median)")
    ax.set_title("end to end, fake backend")
    ax2.set_ylabel("extra peak RSS (MB)")
    ax2.set_title("memory added by the build")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _merge_previous(previous: Path, samples: list[dict], split_calls: list[dict]) -> tuple[list[dict], list[dict]]:
    """The samples and split calls of this run, with the points it did not measure kept from the
    ``previous`` results file (when it exists and has the same config); returns both lists."""
    measured = {(s["recipe"], s["path"], s["world"], s["impl"]) for s in samples}
    if previous.is_file():
        old = json.loads(previous.read_text())
        if old.get("meta", {}).get("config") == CONFIG:
            samples = [
                s for s in old.get("samples", []) if (s["recipe"], s["path"], s["world"], s["impl"]) not in measured
            ] + samples
            done = {c["world"] for c in split_calls}
            split_calls = sorted(
                [c for c in old.get("split_calls", []) if c["world"] not in done] + split_calls,
                key=lambda c: c["world"],
            )
    return samples, split_calls


def _plot_all(rows: list[dict], out: Path, stem: str, tv: str) -> None:
    """Writes one plot per family of recipes measured: the torchtitan and Megatron recipes and
    torch's API, the frameworks' own calls, the re-forms."""
    own = tuple(r for r in RECIPES if r not in FRAMEWORKS and r not in REFORM_RECIPES)
    title = f"torch {tv}: tp=8 pp=4 cp=2 ep=8 dp_replicate=2 dp_shard=auto, {machine()}"
    if any(r["recipe"] in own for r in rows):
        plot(rows, out / f"{stem}.png", title, own)
    if any(r["recipe"] in FRAMEWORKS for r in rows):
        plot(
            rows,
            out / f"frameworks_torch{tv}.png",
            f"torch {tv}: each framework's own mesh building, dp W/8, tp 8, {machine()}",
            tuple(FRAMEWORKS),
        )
    if any(r["recipe"] in REFORM_RECIPES for r in rows):
        plot(
            rows,
            out / f"reform_torch{tv}.png",
            f"torch {tv}: re-forming every mesh after a failure (hot spare), {machine()}",
            REFORM_RECIPES,
        )


def write_results(out: Path, samples: list[dict], split_calls: list[dict], impls: list[str]) -> None:
    """Prints the tables of this run's points and writes them to ``out`` (JSON, markdown, and the
    plots when both implementations ran); a run replaces the points it measured and keeps the
    others from the last results file."""
    import torch

    tv = torch.__version__.split("+")[0]
    meta = {"torch": torch.__version__, "python": sys.version.split()[0], "cpus": os.cpu_count(), "config": CONFIG}
    stem = f"e2e_torch{tv}"
    samples, split_calls = _merge_previous(out / f"{stem}.json", samples, split_calls)
    rows = summarize(samples)
    table = to_markdown(rows, split_calls)
    print(table)
    (out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "split_calls": split_calls, "samples": samples}, indent=1)
    )
    (out / f"{stem}.md").write_text(
        f"torch {tv}, {meta['cpus']} CPUs, fake backend, config {CONFIG}\n\n" + table + "\n"
    )
    if set(IMPLS) <= set(impls):
        _plot_all(rows, out, stem, tv)
