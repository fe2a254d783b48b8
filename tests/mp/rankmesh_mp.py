"""Launch helpers shared by the multi-process tests (tests/test_multiprocess.py, test_cuda.py,
test_torchtitan_mp.py, test_megatron_mp.py): run torchrun commands with a hard deadline (the
whole process group is killed past it) and read back the JSON lines the workers write, one per
check and rank.

Workers are modules of this package, launched as ``torchrun ... -m tests.mp.<worker>`` from the
repository root (``ROOT``; every launch runs there), so they import ``tests.mp`` like the tests
do and nothing edits ``sys.path``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root: `python -m tests.mp.<worker>` runs from here
WORKER = "tests.mp.worker"  # the module torchrun runs (``-m``); see worker_args
TITAN_WORKER = "tests.mp.titan_worker"
MEGATRON_WORKER = "tests.mp.megatron_worker"
DEEPSPEED_WORKER = "tests.mp.deepspeed_worker"
WORKLOAD_WORKER = "tests.mp.workload_worker"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run"]


def worker_args(module: str, *args: str) -> list[str]:
    """torchrun's trailing arguments to run ``module`` (``python -m module *args``) on every rank."""
    return ["-m", module, *args]


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    out.pop("TORCHELASTIC_RUN_ID", None)
    return out


def launch(cmds: list[list[str]], out: Path, timeout_s: float, extra_env: dict[str, str] | None = None) -> str:
    """Runs the commands concurrently, each in its own session; kills them all past the deadline.
    Returns the tail of their output (prefixed with TIMED OUT when the deadline passed)."""
    procs, logs = [], []
    for i, cmd in enumerate(cmds):
        log = open(out / f"torchrun{i}.log", "w")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env(**(extra_env or {})),
                cwd=ROOT,
                start_new_session=True,
            )
        )
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for log in logs:
            log.close()
    text = "\n".join((out / f"torchrun{i}.log").read_text()[-4000:] for i in range(len(cmds)))
    return (f"TIMED OUT after {timeout_s} s\n" if timed_out else "") + text


def run_standalone(
    worker: str, out: Path, world: int, timeout_s: float = 300
) -> tuple[dict[str, dict[int, dict]], str]:
    """One ``torchrun --standalone`` launch of ``python -m worker --out out`` on ``world`` gloo
    ranks over loopback, with a hard deadline: (its results, the tail of its output)."""
    cmd = torchrun() + ["--standalone", "--nproc-per-node", str(world)] + worker_args(worker, "--out", str(out))
    log = launch([cmd], out, timeout_s, {"GLOO_SOCKET_IFNAME": "lo"})
    return results(out), log


def results(out: Path) -> dict[str, dict[int, dict]]:
    """{check: {rank: record}} from the worker's rank*.jsonl files."""
    res: dict[str, dict[int, dict]] = {}
    for f in Path(out).glob("rank*.jsonl"):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            res.setdefault(d["check"], {})[d["rank"]] = d
    return res


def assert_check(res: dict[str, dict[int, dict]], log: str, check: str, world: int) -> dict[int, dict]:
    """`check` passed on every one of `world` ranks."""
    got = res.get(check, {})
    failed = {r: d.get("tb") or d.get("error") for r, d in got.items() if not d["ok"]}
    assert not failed, f"{check} failed on ranks {sorted(failed)}:\n" + "\n".join(
        f"--- rank {r}:\n{tb}" for r, tb in sorted(failed.items())
    )
    missing = sorted(set(range(world)) - set(got))
    assert not missing, f"{check} did not report on ranks {missing}; torchrun output:\n{log}"
    return got
