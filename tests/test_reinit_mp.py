"""Re-initialising in the same process, across ranks (issue 36, item 1): 8 gloo ranks on one node
(torchrun) run tests/mp/reinit_worker.py, which does 5 cycles of ``init_process_group("gloo")``
+ rankmesh's meshes on every road (``rankmesh.init_device_mesh`` with slices, ``_flatten`` and
``_unflatten``; torch's own ``init_device_mesh`` and ``DeviceMesh`` under ``rankmesh.accelerate()``;
``rankmesh.megatron.initialize_model_parallel`` with its gloo twins) + an all-reduce over every
group + ``destroy_process_group()``.

Asserted over the ranks' records: every cycle passed on every rank (each all-reduce gave the sum
over the group's expected ranks), every member of a group saw the group under the same name, no
name stands for two different groups on one rank, every rank's names are the same cycle after
cycle, c10d's tables are empty after every destroy, and every process finished within the
deadline (the launch is killed past it, so a rendezvous that never meets fails the test instead
of blocking CI). Last, a mesh's groups destroyed and the mesh built again in one world: a typed
error on torch 2.13 (whose names would repeat), new names on 2.14+. Runs under whichever torch
the suite runs on (scripts/test.sh: 2.15 and 2.13).
The same cycles on the fake backend at 2^17 ranks: tests/test_reinit_cycles.py.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.mp import rankmesh_mp as mp

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]

WORLD = 8
CYCLES = 5
LAUNCH_TIMEOUT_S = 240  # a healthy launch: ~45 s on 2 busy cores, mostly 8 processes importing torch and megatron-core
WORKER = "tests.mp.reinit_worker"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp_reinit")
    cmd = mp.torchrun() + ["--standalone", "--nproc-per-node", str(WORLD)]
    cmd += mp.worker_args(WORKER, "--out", str(out), "--cycles", str(CYCLES))
    log = mp.launch([cmd], out, LAUNCH_TIMEOUT_S, {"GLOO_SOCKET_IFNAME": "lo"})
    return mp.results(out), log


def cycles(run) -> list[dict[int, dict]]:
    return [mp.assert_check(*run, f"cycle{i}", WORLD) for i in range(CYCLES)]


def test_every_process_finished_within_the_deadline(run):
    res, log = run
    assert not log.startswith("TIMED OUT"), log
    mp.assert_check(res, log, "end", WORLD)


@pytest.mark.parametrize("i", range(CYCLES))
def test_every_cycle_reduces_over_every_group_on_every_rank(run, i):
    got = mp.assert_check(*run, f"cycle{i}", WORLD)
    start = mp.assert_check(*run, "start", WORLD)
    labels = {frozenset(d["groups"]) for d in got.values()}
    assert len(labels) == 1, labels  # every rank reduced over the same kinds of group
    assert len(next(iter(labels))) >= (20 if start[0]["megatron"] else 12), labels


def test_every_member_of_a_group_sees_the_same_name(run):
    for i, got in enumerate(cycles(run)):
        for label in got[0]["groups"]:
            by_ranks: dict[tuple[int, ...], set[str]] = {}
            for rank, d in got.items():
                name, ranks = d["groups"][label]
                by_ranks.setdefault(tuple(ranks), set()).add(name)
            split = {r: names for r, names in by_ranks.items() if len(names) > 1}
            assert not split, f"cycle {i}, {label}: members disagree on the name: {split}"


def test_a_name_never_stands_for_two_groups(run):
    """On one rank (and across ranks) each name belongs to one set of ranks: no silent clash."""
    for i, got in enumerate(cycles(run)):
        owner: dict[str, tuple[int, ...]] = {}
        for d in got.values():
            for label, (name, ranks) in d["groups"].items():
                assert owner.setdefault(name, tuple(ranks)) == tuple(ranks), (i, label, name, owner[name], ranks)


def test_names_are_the_same_cycle_after_cycle(run):
    first, *rest = cycles(run)
    for i, got in enumerate(rest, 1):
        for rank, d in got.items():
            assert d["groups"] == first[rank]["groups"], (i, rank)


def test_c10d_tables_are_empty_after_every_destroy(run):
    for i, got in enumerate(cycles(run)):
        for rank, d in got.items():
            assert not d["initialized"], (i, rank)
            assert not any(d["tables"].values()), (i, rank, d["tables"])


def test_rebuilding_freed_groups_raises_on_torch_2_13_and_works_after(run):
    """In one world, a mesh's groups destroyed and the same mesh built again: torch 2.13 would
    reuse the destroyed groups' names (a stale rendezvous: a hang), so every rank gets
    DistributedStateError at once; torch 2.14+ names them anew and they reduce."""
    got = mp.assert_check(*run, "rebuild_after_free", WORLD)
    for rank, d in got.items():
        if d["scheme"] == "pg_names":  # torch 2.13
            assert d["raised"] == "DistributedStateError" and d["field"] == "group_name", (rank, d)
        else:
            assert d["raised"] is None, (rank, d)
            assert d["groups"]["again.dp"][0] != d["groups"]["first.dp"][0], (rank, d)
            assert d["groups"]["again.tp"][0] != d["groups"]["first.tp"][0], (rank, d)
