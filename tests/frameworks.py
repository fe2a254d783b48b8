"""Shared by the tests that run a framework as itself under rankmesh's general patches
(tests/test_frameworks_*.py) and the start-up tests (tests/test_autostart.py): what is compared of
each mesh (:func:`mesh_record`), a child Python process with or without ``RANKMESH_ACCELERATE=1``
(:func:`child_code`, :func:`run_child`), and the mark for tests that need the wheel's ``.pth`` file
(the installed wheel; in CI, ``RANKMESH_TEST_INSTALLED=1``, a missing file fails)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Whether Python's ``site`` will run rankmesh's ``rankmesh-autostart.pth`` in a child.
AUTOSTART_INSTALLED = importlib.util.find_spec("_rankmesh_autostart") is not None
if os.environ.get("RANKMESH_TEST_INSTALLED") == "1":
    assert AUTOSTART_INSTALLED, "the installed wheel lacks _rankmesh_autostart / rankmesh-autostart.pth"

needs_autostart = pytest.mark.skipif(
    not AUTOSTART_INSTALLED, reason="needs rankmesh's wheel installed (its rankmesh-autostart.pth)"
)


def mesh_record(mesh: Any, full: bool) -> dict[str, Any]:
    """Everything compared of one mesh a framework built, stock against patched: names, shape,
    coordinate, layout, device type, each dim's group ranks, backend and local rank, and the mesh
    tensor itself when ``full`` (small worlds)."""
    import torch.distributed as dist

    out: dict[str, Any] = {
        "names": list(mesh.mesh_dim_names),
        "shape": list(mesh.shape),
        "coordinate": mesh.get_coordinate(),
        "layout": str(mesh._layout),
        "device_type": mesh.device_type,
        "groups": {},
        "local_ranks": {},
    }
    for name in mesh.mesh_dim_names:
        group = mesh.get_group(name)
        out["groups"][name] = [dist.get_process_group_ranks(group), str(dist.get_backend(group))]
        out["local_ranks"][name] = mesh.get_local_rank(name)
    if full:
        out["mesh"] = mesh.mesh.tolist()
    return out


def child_code(definitions: str, body: str) -> str:
    """A child script for :func:`run_child`: ``definitions`` (the test's helpers, as source), then
    the world, rank and mode from its arguments, ``rankmesh.accelerate()`` first when the mode is
    ``"accelerate-first"`` (before the framework is imported), a fake world, ``body`` (the
    framework's own call, setting ``rec`` and ``types``), and one JSON line of what it built."""
    return f"""from typing import Any
from tests.frameworks import mesh_record
{definitions}
import json, sys
world, rank, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode == "accelerate-first":  # the one line, before the framework is imported
    import rankmesh
    rankmesh.accelerate()
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
{body}
print(json.dumps({{"record": rec, "types": types, "pgs": len(dist.distributed_c10d._world.pg_map)}}))
dist.destroy_process_group()
"""


def child_env(accelerate: str | None) -> dict[str, str]:
    """This process's environment, ``RANKMESH_ACCELERATE`` set to ``accelerate`` (or removed)."""
    env = dict(os.environ)
    env.pop("RANKMESH_ACCELERATE", None)
    if accelerate is not None:
        env["RANKMESH_ACCELERATE"] = accelerate
    return env


def run_child(code: str, world: int, rank: int, mode: str, timeout_s: float = 300) -> dict[str, Any]:
    """``python -c code world rank mode`` from the repository root, ``RANKMESH_ACCELERATE=1`` when
    ``mode`` is ``"env"``; the JSON object its last line prints."""
    return run_json(code, [world, rank, mode], "1" if mode == "env" else None, timeout_s)


def run_json(code: str, args: list[Any], accelerate: str | None, timeout_s: float = 300) -> dict[str, Any]:
    """``python -c code *args`` from the repository root with ``RANKMESH_ACCELERATE`` set to
    ``accelerate`` (or unset); the JSON object its last line prints."""
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        env=child_env(accelerate),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
