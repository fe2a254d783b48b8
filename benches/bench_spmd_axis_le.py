"""One ``MeshAxis.__le__`` call, spmd_types' own against rankmesh's (``rankmesh.torchtitan.spmd_axis``).

The comparisons torch 2.15's FSDP2 makes per parameter (``axis <= fsdp_axis``) on a torchtitan-shaped
world of W ranks with tp = 8 innermost and dp = W/8 over it (dp_replicate = 2 outermost):

* ``tp <= dp``: (8:1) <= (W/8:8), False;
* ``dp_shard <= dp``: (W/16:8) <= (W/8:8), True.

Medians over repeats, milliseconds, for W = 2^12, 2^17, 2^20; prints a Markdown table (the one in
docs/upstream_spmd_types_le.md). Nothing is patched: both functions are called directly.
Usage: python benches/bench_spmd_axis_le.py [--repeats N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from importlib import metadata

import torch
from rankmesh.torchtitan import spmd_axis
from spmd_types._mesh_axis import MeshAxis


def median_ms(fn, a, b, repeats: int) -> tuple[float, object]:
    out = fn(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(a, b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    stock = MeshAxis.__dict__["__le__"]
    stock = getattr(stock, "__wrapped__", stock)
    fast = spmd_axis.make_le(stock)
    print(
        f"torch {torch.__version__}, spmd_types {metadata.version('spmd_types')}, "
        f"python {platform.python_version()}, {platform.processor() or platform.machine()}\n"
    )
    print("| W | comparison | answer | spmd_types 0.2.3 | rankmesh | ratio |")
    print("|---|---|---|---|---|---|")
    for k in (12, 17, 20):
        w = 1 << k
        tp, dp, dp_shard = MeshAxis.of(8, 1), MeshAxis.of(w // 8, 8), MeshAxis.of(w // 16, 8)
        for name, a, b in (("tp <= dp", tp, dp), ("dp_shard <= dp", dp_shard, dp)):
            t_stock, r_stock = median_ms(stock, a, b, args.repeats)
            t_fast, r_fast = median_ms(fast, a, b, max(args.repeats, 1000))
            assert r_stock == r_fast, (name, w)
            print(
                f"| 2^{k} | `{name}` | {r_fast} | {t_stock:.3f} ms | {t_fast * 1e3:.1f} µs | {t_stock / t_fast:,.0f}x |"
            )


if __name__ == "__main__":
    main()
