"""Shared by the tests that run a framework as itself under rankmesh's general patches
(tests/test_frameworks_*.py) and the start-up tests (tests/test_autostart.py): a child Python
process with or without ``RANKMESH_ACCELERATE=1``, and the mark for tests that need the wheel's
``.pth`` file (the installed wheel; in CI, ``RANKMESH_TEST_INSTALLED=1``, a missing file fails)."""

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
    out = subprocess.run(
        [sys.executable, "-c", code, str(world), str(rank), mode],
        env=child_env("1" if mode == "env" else None),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
