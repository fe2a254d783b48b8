"""A rank of a plain torch script that never names rankmesh: it builds its meshes with torch's own
``init_device_mesh``, ``_unflatten``, ``_flatten`` and ``DeviceMesh(mesh=...)`` and all-reduces over
every group. Launched by tests/test_autostart.py under ``torchrun`` with and without
``RANKMESH_ACCELERATE=1``; reports (one JSON line per check, as tests/mp/worker.py) which
functions ran and whether every group talks to exactly the right peers."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # bound at import, as frameworks do

from tests.mp.worker import Recorder, assert_reduces, expected_group


def build(world: int) -> dict:
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    order = ("dp", "tp")
    sizes = {"dp": 2, "tp": world // 2}
    for name in order:
        assert_reduces(mesh.get_group(name), expected_group(world, sizes, order, (name,), dist.get_rank()), name)
    split = mesh._unflatten("tp", (world // 4, 2), ("cp", "sp"))
    order2 = ("dp", "cp", "sp")
    sizes2 = {"dp": 2, "cp": world // 4, "sp": 2}
    for name in order2:
        want = expected_group(world, sizes2, order2, (name,), dist.get_rank())
        assert_reduces(split.get_group(name), want, name)
    flat = split["dp", "sp"]._flatten("dp_sp")
    want = expected_group(world, sizes2, order2, ("dp", "sp"), dist.get_rank())
    assert_reduces(flat.get_group(), want, "dp_sp")
    # a plain DeviceMesh over the world in reverse order: torch's own class, the patched group road
    grid = torch.arange(world - 1, -1, -1).reshape(2, world // 2)
    plain = DeviceMesh("cpu", grid, mesh_dim_names=("a", "b"))
    row, col = (grid == dist.get_rank()).nonzero()[0].tolist()
    assert_reduces(plain.get_group("a"), sorted(grid[:, col].tolist()), "plain a")
    assert_reduces(plain.get_group("b"), sorted(grid[row].tolist()), "plain b")
    ipg = DeviceMesh.__dict__["_init_process_groups"].__func__
    return {
        "mesh_type": type(mesh).__name__,
        "init_device_mesh": f"{init_device_mesh.__module__}.{init_device_mesh.__qualname__}",
        "init_process_groups": f"{ipg.__module__}.{ipg.__qualname__}",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rec = Recorder(args.out, dist.get_rank())
    rec.write("env", True, accelerate=os.environ.get("RANKMESH_ACCELERATE", ""))
    rec.run("build", build, dist.get_world_size())
    dist.destroy_process_group()
    rec.write("end", True)


if __name__ == "__main__":
    main()
