"""DeepSpeed's ``ProcessTopology``, its own against rankmesh's (``rankmesh.deepspeed``): what one
pipeline send or receive pays to find its peer.

DeepSpeed's pipeline engine calls ``grid.get_stage_id()`` and ``grid.stage_to_global(stage)`` for
every ``p2p.send`` and ``p2p.recv`` (each one ``ProcessTopology.get_coord``: a scan of the W-entry
mapping), and ``bwc_tensor_model_parallel_rank`` per parameter in the fp16 optimizer's norm. Times:
building ``PipeModelDataParallelTopology(num_pp=4, num_mp=8, num_dp=W/32)``, one ``get_coord`` of
rank W/2 + 3, and one ``stage_to_global``-style lookup (``get_coord`` + ``get_rank``); medians,
for W = 2^12, 2^15, 2^17, 2^20. Prints a Markdown table (the one in docs/benchmarks.md).
Usage: python benches/bench_deepspeed_coord.py [--repeats N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from importlib import metadata

from deepspeed.runtime.pipe import topology as t
from rankmesh import deepspeed as rds


def median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(world: int, repeats: int) -> tuple[float, float, float]:
    make = lambda: t.PipeModelDataParallelTopology(num_pp=4, num_mp=8, num_dp=world // 32)  # noqa: E731
    build = median_s(make, max(1, repeats // 4))
    topo = make()
    rank = world // 2 + 3
    coord = median_s(lambda: topo.get_coord(rank), repeats)

    def lookup() -> int:
        me = topo.get_coord(rank)
        return topo.get_rank(**me._replace(pipe=3)._asdict())

    return build, coord, median_s(lookup, repeats)


def fmt(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    rows = []
    for exp in (12, 15, 17, 20):
        world = 2**exp
        for p in rds.PATCHES:
            p.restore()
        stock = measure(world, args.repeats)
        assert rds.TOPOLOGY.install()
        ours = measure(world, args.repeats)
        rds.TOPOLOGY.restore()
        rows.append((world, stock, ours))
    print(
        f"deepspeed {metadata.version('deepspeed')}, Python {platform.python_version()}, "
        f"{platform.machine()}; medians of {args.repeats}\n"
    )
    print("| world | build: DeepSpeed → rankmesh | get_coord | get_coord + get_rank (stage_to_global) |")
    print("|---:|---:|---:|---:|")
    for world, s, o in rows:
        print(f"| {world:,} | {fmt(s[0])} → {fmt(o[0])} | {fmt(s[1])} → {fmt(o[1])} | {fmt(s[2])} → {fmt(o[2])} |")


if __name__ == "__main__":
    main()
