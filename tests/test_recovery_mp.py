"""Real faults on gloo (issue 36, item 3): a process is SIGKILLed mid-run and rankmesh re-forms
every mesh over the survivors, by a hot spare or by shrinking the replica dim.

The test is its own launcher: it hosts the ``TCPStore`` (so killing any rank cannot take the
store down) and starts one ``python -m tests.mp.fault_worker`` per rank, each in its own session.
Once every process has built gen 0's meshes, reduced over them and posted ``gen0/midway``, it
SIGKILLs one rank; the worker's docstring says how the survivors notice (a collective raises),
tear down (``destroy_process_group``), agree on what failed (heartbeats and one decider, through
the store) and re-form (``plan.new_rank``, ``plan.check``, ``plan.activate``, every tree).

- ``hot_spare``: 9 processes, two "nodes" of 4 mesh ranks (dp_replicate 2, dp_shard 2, tp 2) and
  the spare, old rank 8. Old rank 3 is killed; ``hot_spare(9, failed=[3], mesh_size=8)``: the
  spare takes mesh index 3 and number 3, every other rank keeps its own. Re-formed: the plain
  ``init_device_mesh`` tree with two ``_flatten``\\ s, ``rankmesh.ParallelDims`` and, with
  megatron-core installed, Megatron's (tp 2, pp 2).
- ``shrink``: 8 processes, the same tree; old rank 5 is killed;
  ``shrink(..., failed=[5])`` drops replica 1: old ranks 4, 6 and 7 leave cleanly, 0-3 re-form
  (dp_replicate 1, dp_shard 2, tp 2): the plain tree and ParallelDims.

The oracle for a re-formed tree: the same tree over the plain world at the rank's mesh index
(numpy for the plain tree; the same build on torch's fake backend for ParallelDims; megatron-core's
own ``initialize_model_parallel`` on the fake backend for Megatron), mapped through
``plan.world.rank_map()``; every group must equal it and all_reduce over it must sum it. The
training step's oracle is an uninterrupted run: a second launch of the same worker and the same
``train`` on the re-formed shape (8 ranks, or 4 for the shrink) with no failure, compared index
by index (and, in each worker, plain SGD on one process).

Every launch has a hard deadline; every process must have exited by itself (the killed one by
SIGKILL, every other with status 0), and none of their sessions may hold a process afterwards.
On 2 busy cores a case takes ~30-60 s for its two launches; after the kill the survivors notice
within ~0.5 s, agree within ~6 s (the 5 s heartbeat staleness) and are re-formed ~2-5 s later.

Beyond membership, each rank's place in each group is its mesh coordinate (what DTensor, FSDP2
and Megatron's stages go by), and ``destroy_process_group()`` frees every group rankmesh made
(a live gloo group keeps its sockets: peers would wait out the gloo timeout).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from rankmesh.recovery import hot_spare, shrink  # noqa: E402

from tests.mp import rankmesh_mp as mp  # noqa: E402

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]

WORKER = "tests.mp.fault_worker"
SIZES = {"dp_replicate": 2, "dp_shard": 2, "tp": 2}
LAUNCH_DEADLINE_S = 150  # per launch, hard; a healthy fault launch takes ~30-60 s on 2 busy cores
MIDWAY_DEADLINE_S = 100  # every process built gen 0 and is stepping
NOTICE_BOUND_S = 30  # kill -> every survivor's collective raised (gloo timeout 20 s is the backstop)


def megatron_installed() -> bool:
    try:
        import megatron.core.parallel_state  # noqa: F401
    except ImportError:
        return False
    return True


@dataclasses.dataclass
class Case:
    name: str
    world: int  # processes in gen 0
    kill: int  # the old rank the test SIGKILLs
    plan: object  # the Reform every survivor must reach
    reference_sizes: dict


CASES = {
    "hot_spare": Case("hot_spare", 9, 3, hot_spare(9, failed=[3], mesh_size=8), SIZES),
    "shrink": Case("shrink", 8, 5, shrink(SIZES, failed=[5]), {"dp_replicate": 1, "dp_shard": 2, "tp": 2}),
}


@dataclasses.dataclass
class Launch:
    records: dict[int, dict[str, dict]]  # rank -> check -> record
    returncodes: dict[int, int | None]
    left_behind: list[int]  # ranks still running at the deadline (then killed)
    strays: list[int]  # pids found in the workers' sessions after they exited
    seconds: float
    killed_at: float | None  # time.time() of the SIGKILL
    log: str

    def tail(self) -> str:
        return self.log[-6000:]


def _sessions(sids: set[int]) -> list[int]:
    """Every live process whose session is one of ``sids`` (read from /proc; no psutil)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        if int(fields[3]) in sids and fields[0] != "Z":
            found.append(int(entry))
    return found


def _records(out: Path) -> dict[int, dict[str, dict]]:
    recs: dict[int, dict[str, dict]] = {}
    for f in out.glob("rank*.jsonl"):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            recs.setdefault(d["rank"], {})[d["check"]] = d
    return recs


def launch(out: Path, case: str, world: int, kill: int | None = None, sizes: dict | None = None) -> Launch:
    """``world`` fault workers on a TCPStore hosted here; SIGKILL ``kill`` once all are midway.
    Everything is killed past LAUNCH_DEADLINE_S; the workers' sessions are checked for leftovers."""
    import datetime

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
    )
    extra = ["--sizes", json.dumps(sizes)] if sizes else []
    procs, logs = [], []
    t0 = time.monotonic()
    deadline = t0 + LAUNCH_DEADLINE_S
    for r in range(world):
        log = open(out / f"proc{r}.log", "w")
        logs.append(log)
        node = r // 4  # two nodes of 4; the spare alone on a third
        cmd = [sys.executable, "-m", WORKER, "--case", case, "--rank", str(r), "--world", str(world)]
        cmd += ["--port", str(store.port), "--out", str(out), *extra]
        env = mp.env(GLOO_SOCKET_IFNAME="lo", LOCAL_RANK=str(r % 4), GROUP_RANK=str(node))
        procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=mp.ROOT, start_new_session=True)
        )
    left: list[int] = []
    strays: list[int] = []
    note = ""
    killed_at = None
    try:
        if kill is not None:
            midway = t0 + MIDWAY_DEADLINE_S
            while store.add("gen0/midway", 0) < world:
                if time.monotonic() > midway or any(p.poll() is not None for p in procs):
                    note = f"NOT MIDWAY: {store.add('gen0/midway', 0)} of {world} after {time.monotonic() - t0:.0f} s\n"
                    break
                time.sleep(0.05)
            else:
                time.sleep(0.5)  # every process is inside its steps
                killed_at = time.time()
                store.set("killed_at", repr(killed_at))
                os.kill(procs[kill].pid, signal.SIGKILL)
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        left = [r for r, p in enumerate(procs) if p.poll() is None]
        strays = _sessions({p.pid for p in procs}) if not left else []
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
        del store
    seconds = time.monotonic() - t0
    text = "".join(f"--- proc {r}:\n{(out / f'proc{r}.log').read_text()[-3000:]}\n" for r in range(world))
    if left:
        note += f"TIMED OUT after {LAUNCH_DEADLINE_S} s: ranks {left} still running\n"
    codes = {r: p.returncode for r, p in enumerate(procs)}
    return Launch(_records(out), codes, left, strays, seconds, killed_at, note + text)


def timeline(launch: Launch) -> str:
    """Seconds from the kill to the last process reaching each stage."""
    if launch.killed_at is None:
        return "no kill"
    out = []
    for stage in ("detected", "teardown", "agreed", "gen1", "end"):
        ats = [recs[stage]["at"] for recs in launch.records.values() if "at" in recs.get(stage, {})]
        if ats:
            out.append(f"{stage} +{max(ats) - launch.killed_at:.1f} s")
    return ", ".join(out)


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory):
    """(case, the fault launch, the uninterrupted reference launch)."""
    case = CASES[request.param]
    fault = launch(tmp_path_factory.mktemp(f"fault_{case.name}"), case.name, case.world, kill=case.kill)
    ref_world = math.prod(case.reference_sizes.values())
    ref = launch(tmp_path_factory.mktemp(f"ref_{case.name}"), "reference", ref_world, sizes=case.reference_sizes)
    print(
        f"\n{case.name}: fault launch {fault.seconds:.1f} s (after the kill: {timeline(fault)}), "
        f"reference launch {ref.seconds:.1f} s"
    )
    return case, fault, ref


def survivors(case: Case) -> list[int]:
    return [r for r in range(case.world) if r != case.kill]


def staying(case: Case) -> list[int]:
    return [r for r in survivors(case) if case.plan.new_rank(r) is not None]


def passed(launch: Launch, ranks: list[int], check: str) -> dict[int, dict]:
    """``check`` passed on every one of ``ranks``; their records."""
    got = {r: launch.records.get(r, {}).get(check) for r in ranks}
    failed = {r: d.get("tb") or d.get("error") for r, d in got.items() if d is not None and not d["ok"]}
    assert not failed, f"{check} failed on ranks {sorted(failed)}:\n" + "\n".join(
        f"--- rank {r}:\n{tb}" for r, tb in sorted(failed.items())
    )
    missing = [r for r, d in got.items() if d is None]
    if missing:
        last = {r: list(launch.records.get(r, {}))[-1:] for r in missing}
        pytest.fail(f"{check} not reported by ranks {missing} (their last records: {last});\n{launch.tail()}")
    return got


def test_every_process_exits_by_itself_and_none_is_left_behind(run):
    case, fault, ref = run
    for launch_, killed in ((fault, case.kill), (ref, None)):
        assert not launch_.left_behind, launch_.tail()
        assert not launch_.strays, (launch_.strays, launch_.tail())
        want = {r: (-signal.SIGKILL if r == killed else 0) for r in launch_.returncodes}
        assert launch_.returncodes == want, launch_.tail()
        passed(launch_, [r for r in launch_.returncodes if r != killed], "end")


def test_survivors_notice_the_failure_in_bounded_time_and_tear_down(run):
    case, fault, _ = run
    detected = passed(fault, survivors(case), "detected")
    for r, d in detected.items():
        assert d["after_kill_s"] is not None and 0 <= d["after_kill_s"] < NOTICE_BOUND_S, (r, d)
        assert d["steps"] >= 1, (r, d)
    for r, d in passed(fault, survivors(case), "teardown").items():
        assert d["seconds"] < 20, (r, d)  # destroy_process_group on the broken gloo world: no hang
        assert d["left_open"] == 0, (r, d)  # every gen 0 group freed: its sockets are closed


def test_destroy_process_group_frees_every_group_rankmesh_made(run, request):
    """After ``destroy_process_group()`` and a ``gc.collect()``, no gen 0 group is alive (before the
    worker's workaround; a live gloo group keeps its sockets and threads)."""
    case, fault, _ = run
    held = {r: d["held"] for r, d in passed(fault, survivors(case), "teardown").items()}
    assert not any(held.values()), held


def test_survivors_agree_on_what_failed(run):
    case, fault, _ = run
    agreed = passed(fault, survivors(case), "agreed")
    assert {r: d["failed"] for r, d in agreed.items()} == {r: [case.kill] for r in survivors(case)}
    assert sum(d["decider"] for d in agreed.values()) == 1, agreed


def test_ranks_outside_the_new_job_leave_cleanly(run):
    case, fault, _ = run
    leaving = [r for r in survivors(case) if case.plan.new_rank(r) is None]
    assert leaving == ([] if case.name == "hot_spare" else [4, 6, 7])
    got = passed(fault, leaving, "left")
    assert all(d["world_size"] == case.plan.world_size for d in got.values())
    assert not any("gen1" in fault.records[r] for r in leaving)


def test_survivors_rejoin_as_the_plan_says(run):
    case, fault, _ = run
    got = passed(fault, staying(case), "gen1")
    new = {r: d["new_rank"] for r, d in got.items()}
    assert new == {r: case.plan.new_rank(r) for r in staying(case)}
    assert sorted(new.values()) == list(range(case.plan.world_size))
    if case.name == "hot_spare":
        assert got[8]["new_rank"] == 3 and got[8]["index"] == 3  # the spare took old rank 3's place and number
        assert got[4]["new_rank"] == 4 and got[4]["index"] == 4
    else:
        assert got[0]["sizes"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 2}


@pytest.mark.parametrize("tree", ["tree_plain", "tree_parallel_dims", "tree_megatron"])
def test_every_tree_is_re_formed_and_reduces_over_the_expected_ranks(run, tree):
    case, fault, _ = run
    if tree == "tree_megatron" and (case.name != "hot_spare" or not megatron_installed()):
        pytest.skip("Megatron's tree is re-formed in the hot-spare case, with megatron-core installed")
    got = passed(fault, staying(case), tree)
    if tree == "tree_plain":
        assert all(len(d["groups"]) == 5 for d in got.values())  # 3 dims + 2 flattens
    if tree == "tree_parallel_dims":  # fsdp, tp, loss (+ dp_replicate when it is 2): real and reduced
        assert all(d["reduced"] >= 3 for d in got.values()), got
    if tree == "tree_megatron":  # tp, pp, dp, model-parallel, tp-dp, embedding, ... distinct groups
        assert all(d["reduced"] >= 7 for d in got.values()), got


def test_the_training_step_equals_the_uninterrupted_reference(run):
    case, fault, ref = run
    got = passed(fault, staying(case), "train")
    want = {d["index"]: d for d in passed(ref, list(ref.returncodes), "train").values()}
    assert sorted(d["index"] for d in got.values()) == sorted(want)
    worst = 0.0
    for r, d in got.items():
        w = want[d["index"]]
        assert d["dp_index"] == w["dp_index"], (r, d["dp_index"], w["dp_index"])
        assert math.isclose(d["loss"], w["loss"], rel_tol=1e-6, abs_tol=1e-7), (r, d["loss"], w["loss"])
        assert d["params"].keys() == w["params"].keys()
        for k in w["params"]:
            diff = max(abs(a - b) for a, b in zip(d["params"][k], w["params"][k]))
            assert diff <= 1e-6, (r, k, diff)
            worst = max(worst, diff)
    print(f"{case.name}: largest parameter difference from the reference {worst:.3g}")


@pytest.mark.parametrize("what", ["device_mesh", "megatron"])
def test_each_ranks_local_rank_is_its_mesh_coordinate(run, what, request):
    """Order, not membership: along every dim the rank's place in its group (what DTensor, FSDP2,
    torch's pipelining and Megatron's stage go by) is its mesh coordinate. After a hot spare the
    re-formed world is not monotone (new rank 7 sits at index 3), and groups rank their members
    in sorted order, as torch's ``new_group`` does: see the xfail below."""
    case, fault, _ = run
    if what == "megatron":
        if case.name != "hot_spare" or not megatron_installed():
            pytest.skip("Megatron's tree is re-formed in the hot-spare case, with megatron-core installed")
        got = passed(fault, staying(case), "tree_megatron")
        wrong = {
            r: (d["pp_rank"], d["pp_stage_of_index"]) for r, d in got.items() if d["pp_rank"] != d["pp_stage_of_index"]
        }
    else:
        got = passed(fault, staying(case), "order")
        wrong = {
            (r, dim): (f["local_rank"], f["coordinate"])
            for r, d in got.items()
            for dim, f in d.items()
            if isinstance(f, dict) and f["local_rank"] != f["coordinate"]
        }
    assert not wrong, wrong
