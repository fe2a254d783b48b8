"""Layout-core benchmark: rankmesh.MeshLayout vs torch's own layout code, side by side.

For W = 2**17 and 2**20 and a 5-dim layout (pp=8, dp_replicate=2, fsdp=W/256, cp=2, tp=8) with
a random rank map, it times on one process:

* own-group queries of one rank: ``group(r, d)`` and the 1-D ``mesh_of(r)`` for every dim,
  plus ``coordinate_of(r)`` — torch's equivalent is what DeviceMesh does: remap the layout to
  the full ``(copies, size)`` tensor and search it for the rank;
* ``groups()`` of every dim — torch: ``_MeshLayout.remap_to_tensor`` (materialised);
* ``fingerprint()`` — torch: DeviceMesh's ``_stable_hash`` recipe (blake2b over the repr of the
  layout and the rank map as a tuple), cold (first call on a fresh world) and warm;
* rank-map validation — rankmesh: ``MeshLayout.world(W, rank_map)`` (permutation check and
  inverse); torch validates nothing, the nearest equivalent is ``sort(rank_map) == arange(W)``.

Reports medians over repeats and ratios; writes benches/results/layout.{md,json}.
Usage: python benches/bench_layout.py [--repeats N] [--worlds 17,20]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from rankmesh import MeshLayout
from torch.distributed._mesh_layout import _MeshLayout

NAMES = ("pp", "dp_replicate", "fsdp", "cp", "tp")
RESULTS = Path(__file__).resolve().parent / "results"


def sizes_for(world: int) -> tuple[int, ...]:
    return (8, 2, world // 256, 2, 8)


def median_us(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(samples)


def torch_layout(world: int, sizes) -> _MeshLayout:
    root = _MeshLayout.from_sizes_strides((world,))
    return root.splice(0, 1, root[0].composition(_MeshLayout.from_sizes_strides(tuple(sizes))))


def bench_world(world: int, repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    perm = rng.permutation(world).astype(np.int64)
    sizes = sizes_for(world)
    rank = int(rng.integers(world))

    ours = MeshLayout.world(world, perm).unflatten("world", sizes, NAMES)
    dims_ours = [ours[n] for n in NAMES]
    theirs = torch_layout(world, sizes)
    rank_map_t = torch.from_numpy(perm.astype(np.int32)).contiguous()

    # Correctness guard: the two sides must agree before we time them.
    for d, name in enumerate(NAMES):
        full = _MeshLayout([theirs[d]]).remap_to_tensor(rank_map_t)
        row = full[(full == rank).any(dim=1).nonzero()[0, 0]]
        assert row.tolist() == ours.group(rank, name).tolist(), name
        assert np.array_equal(full.numpy(), dims_ours[d].groups()), name

    def ours_queries():
        for d, sub in enumerate(dims_ours):
            ours.group(rank, d)
            sub.mesh_of(rank)
        ours.coordinate_of(rank)

    def torch_queries():
        for d in range(len(NAMES)):
            full = _MeshLayout([theirs[d]]).remap_to_tensor(rank_map_t)
            coords = (full == rank).nonzero()
            full[coords[0, 0]]

    def ours_groups():
        for sub in dims_ours:
            sub.groups()

    def torch_groups():
        for d in range(len(NAMES)):
            _MeshLayout([theirs[d]]).remap_to_tensor(rank_map_t).contiguous()

    def ours_fp_cold():
        MeshLayout.world(world, perm).unflatten("world", sizes, NAMES).fingerprint()

    def ours_world_only():
        MeshLayout.world(world, perm).unflatten("world", sizes, NAMES)

    def torch_fp():
        key = repr((theirs, tuple(rank_map_t.tolist()), NAMES)).encode()
        hashlib.blake2b(key, digest_size=16).hexdigest()

    def ours_validate():
        MeshLayout.world(world, perm)

    def torch_validate():
        torch.equal(torch.sort(rank_map_t).values, torch.arange(world, dtype=torch.int32))

    slow = max(3, repeats // 10)
    rows = []

    def row(what, ours_us, torch_us, note=""):
        rows.append(
            {
                "world": world,
                "what": what,
                "rankmesh_us": round(ours_us, 2),
                "torch_us": round(torch_us, 2),
                "speedup": round(torch_us / ours_us, 1),
                "note": note,
            }
        )

    row(
        "own groups + 1-D meshes of one rank, all 5 dims",
        median_us(ours_queries, repeats),
        median_us(torch_queries, slow),
    )
    row("groups() of all 5 dims", median_us(ours_groups, slow), median_us(torch_groups, slow))
    per_dim = [median_us(sub.groups, slow) for sub in dims_ours]
    row(
        "groups() of one dim (slowest dim)",
        max(per_dim),
        median_us(torch_groups, slow) / len(NAMES),
        "torch: mean of one dim",
    )
    cold = median_us(ours_fp_cold, slow) - median_us(ours_world_only, slow)
    row(
        "fingerprint(), cold (hashes the rank map)",
        max(cold, 0.01),
        median_us(torch_fp, slow),
        "torch: _stable_hash recipe",
    )
    row(
        "fingerprint(), warm",
        median_us(ours.fingerprint, repeats),
        median_us(torch_fp, slow),
        "torch: _stable_hash recipe",
    )
    row(
        "rank-map validation (permutation + inverse)",
        median_us(ours_validate, slow),
        median_us(torch_validate, slow),
        "torch: sort == arange",
    )
    return rows


def to_markdown(rows: list[dict]) -> str:
    out = [
        "| W | operation | rankmesh (µs) | torch (µs) | speed-up | note |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        out.append(
            f"| 2^{r['world'].bit_length() - 1} | {r['what']} | {r['rankmesh_us']:,} | {r['torch_us']:,} | "
            f"{r['speedup']:,}× | {r['note']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--worlds", default="17,20", help="comma-separated log2 world sizes")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    rows = []
    for k in (int(x) for x in args.worlds.split(",")):
        rows.extend(bench_world(1 << k, args.repeats))
    table = to_markdown(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "numpy": np.__version__, "cpu_count": __import__("os").cpu_count()}
    (args.out / "layout.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / "layout.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
