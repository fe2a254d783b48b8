"""``rankmesh plan --mesh``: a job of disjoint meshes, each over part of the world.

The text for a knowledge-distillation job (students on ``[0, W/2)`` as dp x tp, teachers on
``[W/2, W)``) at 16 and at 131072 ranks, seen from members and non-members; groups against the
mesh a numpy reshape of the ranks gives (the oracle: ``DeviceMesh(mesh=torch.arange(...).reshape(...))``
is that array); the process-group count against the torch layer's real build
(``init_device_mesh(..., ranks=...)`` on the fake backend); the overlap test against set
intersection; every class of bad ``--mesh`` (exit 2, the flag as typed, one fix line, the API's
typed error); the picture files; and a job at the largest world rankmesh takes, which must build
nothing world-sized.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from rankmesh._native import MAX_WORLD_SIZE, Slice
from rankmesh.cli import _flag_message, _parser, _typed
from rankmesh.errors import (
    DuplicateNameError,
    InvalidSizeError,
    MeshArgumentError,
    RankOutOfRangeError,
    SizeMismatchError,
    UnknownNameError,
)
from rankmesh.plan import (
    build_job_plan,
    count_mesh_groups,
    format_group,
)

from tests.conftest import fake_world
from tests.test_cli import _assert_one_error_and_fix, _is_png, run

KD16 = ["--mesh", "students=0:8:dp=2,tp=4", "--mesh", "teachers=8:16:dp=-1,tp=2"]


@pytest.fixture(autouse=True)
def _no_local_world_size(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


# -- the text ---------------------------------------------------------------------------------------


def test_kd_job_seen_from_a_teacher(capsys):
    code, out, err = run(capsys, "plan", "--world-size", "16", *KD16, "--rank", "13")
    assert code == 0 and err == ""
    assert out.startswith("rankmesh plan: 2 meshes over a world of 16 ranks, rank 13\n")
    assert "  students  ranks 0..7   [dp=2, tp=4]  rank 13 is not a member: 2 placeholders\n" in out
    assert "  teachers  ranks 8..15  [dp=4, tp=2]  rank 13 creates 2 process groups (2 real + 0 fake)\n" in out
    assert "every rank of the world is in one mesh" in out
    assert "rank 13 is in teachers, at dp=2, tp=1\n" in out
    assert "  teachers.dp  [9, 11, 13, 15] (4 ranks)\n" in out
    assert "  teachers.tp  [12, 13] (2 ranks)\n" in out
    assert "  students     - (not a member: its ranks are 0..7)\n" in out
    assert "process groups on rank 13: 4 (2 real + 2 fake)" in out
    assert "2 of them are placeholders" in out
    assert "topology: 2 node(s) of 8 GPUs; rank 13 is on node 1" in out
    assert "teachers.tp         2 ranks  inside node 1; every group inside a node" in out


def test_kd_job_seen_from_a_student(capsys):
    code, out, _ = run(capsys, "plan", "--world-size", "16", *KD16, "--rank", "3")
    assert code == 0
    assert "  students  ranks 0..7   [dp=2, tp=4]  rank 3 creates 2 process groups (2 real + 0 fake)\n" in out
    assert "  teachers  ranks 8..15  [dp=4, tp=2]  rank 3 is not a member: 2 placeholders\n" in out
    assert "rank 3 is in students, at dp=0, tp=3\n" in out
    assert "  students.dp  [3, 7] (2 ranks)\n" in out
    assert "  students.tp  [0, 1, 2, 3] (4 ranks)\n" in out
    assert "  teachers     - (not a member: its ranks are 8..15)\n" in out
    assert "teachers.dp" not in out and "teachers.tp" not in out


def test_kd_job_at_131072_ranks_is_fast(capsys):
    t0 = time.perf_counter()
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "131072",
        "--mesh",
        "students=0:65536:dp=-1,tp=8",
        "--mesh",
        "teachers=65536:131072:pp=4,dp=-1,tp=8",
        "--rank",
        "70000",
    )
    elapsed = time.perf_counter() - t0
    assert code == 0
    assert "  students  ranks 0..65535       [dp=8192, tp=8]        rank 70000 is not a member: 2 placeholders" in out
    assert "  teachers  ranks 65536..131071  [pp=4, dp=2048, tp=8]  rank 70000 creates 3 process groups" in out
    assert "rank 70000 is in teachers, at pp=0, dp=558, tp=0\n" in out
    assert "  teachers.pp  [70000, 86384, 102768, 119152] (4 ranks)\n" in out
    assert "  teachers.dp  [65536, 65544, ..., 81912] (2048 ranks)\n" in out
    assert "  teachers.tp  [70000, 70001, ..., 70007] (8 ranks)\n" in out
    assert "process groups on rank 70000: 5 (3 real + 2 fake)" in out
    assert elapsed < 20, elapsed  # ~0.1 s; generous for a loaded 2-core machine

    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "131072",
        "--mesh",
        "students=0:65536:dp=-1,tp=8",
        "--mesh",
        "teachers=65536:131072:pp=4,dp=-1,tp=8",
        "--rank",
        "5",
    )
    assert code == 0 and "rank 5 is in students, at dp=0, tp=5\n" in out
    assert "  students.dp  [5, 13, ..., 65533] (8192 ranks)\n" in out
    assert "  teachers     - (not a member: its ranks are 65536..131071)\n" in out


def test_a_rank_in_no_mesh_and_strided_meshes(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "32",
        "--mesh",
        "actor=0:16:2:dp=2,tp=4",
        "--mesh",
        "critic=1:16:2",
        "--mesh",
        "reward=24:32:tp=-1",
        "--rank",
        "20",
    )
    assert code == 0
    assert "  actor   ranks 0..14 step 2  [dp=2, tp=4]" in out
    assert "  critic  ranks 1..15 step 2  [world=8]" in out  # no dims: the 1-D mesh "world"
    assert "  reward  ranks 24..31        [tp=8]" in out
    assert "8 of the world's ranks are in no mesh" in out
    assert "rank 20 is in no mesh\n" in out
    assert "process groups on rank 20: 4 (0 real + 4 fake)" in out  # placeholders only
    assert "topology: 4 node(s) of 8 GPUs; rank 20 is on node 2\n" in out
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "32",
        "--mesh",
        "actor=0:16:2:dp=2,tp=4",
        "--mesh",
        "critic=1:16:2",
        "--rank",
        "5",
    )
    assert code == 0 and "rank 5 is in critic, at world=2\n" in out
    assert "  critic.world  [1, 3, ..., 15] (8 ranks)\n" in out


def test_a_size_one_dim_is_fake_and_a_whole_world_dim_is_the_default_group(capsys):
    code, out, _ = run(capsys, "plan", "--world-size", "16", "--mesh", "all=0:16:dp=2,tp=8,pp=1", "--rank", "3")
    assert code == 0 and "[dp=2, tp=8, pp=1*]  rank 3 creates 3 process groups (2 real + 1 fake)" in out
    code, out, _ = run(capsys, "plan", "--world-size", "16", "--mesh", "all=0:16", "--rank", "3")
    assert code == 0 and "default group (whole world): all.world" in out


# -- oracles ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "world, specs, oracle",
    [
        (
            16,
            ["students=0:8:dp=2,tp=4", "teachers=8:16:dp=4,tp=2"],
            {"students": (range(0, 8), (2, 4)), "teachers": (range(8, 16), (4, 2))},
        ),
        (
            48,
            ["a=0:24:2:pp=2,dp=-1,tp=3", "b=1:24:2:dp=4,tp=3", "c=30:46:cp=2,dp=2,tp=4"],
            {"a": (range(0, 24, 2), (2, 2, 3)), "b": (range(1, 24, 2), (4, 3)), "c": (range(30, 46), (2, 2, 4))},
        ),
    ],
)
def test_groups_are_those_of_the_reshaped_ranks(world, specs, oracle):
    """torch's ``DeviceMesh(mesh=torch.tensor(ranks).reshape(shape))`` is this array: a rank's
    group in dim d is the line through it along d."""
    job = build_job_plan(world, specs)
    for label, (ranks, shape) in oracle.items():
        lay = job.meshes[label].layout
        assert lay.shape == shape
        grid = np.asarray(ranks).reshape(shape)
        for rank in range(world):
            assert lay.is_member(rank) == (rank in ranks)
            if rank not in ranks:
                continue
            where = tuple(int(x[0]) for x in np.nonzero(grid == rank))
            assert lay.coordinate_of(rank) == where
            for d in range(len(shape)):
                line = grid[tuple(slice(None) if i == d else c for i, c in enumerate(where))]
                assert lay.group(rank, d).tolist() == line.tolist()


@pytest.mark.parametrize("rank", [2, 11])  # a student, a teacher
def test_count_equals_the_torch_layers_real_build(rank):
    """What ``plan`` counts for each mesh is what ``init_device_mesh(..., ranks=...)`` creates:
    a member its groups (real, fake for size 1), any other rank one placeholder per group."""
    pytest.importorskip("torch")
    from rankmesh.mesh import init_device_mesh

    job = build_job_plan(16, ["students=0:8:dp=2,tp=4,cp=1", "teachers=8:16:pp=2,dp=2,tp=2"])
    with fake_world(16, rank):
        for m in job.meshes.values():
            mesh = init_device_mesh("cpu", m.layout.shape, mesh_dim_names=m.layout.names, ranks=m.ranks)
            report = mesh.build_report()
            count = count_mesh_groups(job, m.label)
            if m.layout.is_member(rank):
                assert (report.real, report.fake) == (len(count.real), len(count.fake)), (m.label, report)
            else:
                assert (report.real, report.fake) == (0, count.created), (m.label, report)


def test_first_shared_rank_is_the_least_rank_in_both():
    ranges = [range(a, b, s) for a in range(0, 7) for b in range(a + 1, 24, 3) for s in (1, 2, 3, 4, 6)]
    for r1 in ranges:
        for r2 in ranges[::7]:
            both = set(r1) & set(r2)
            shared = Slice.of_range(r1).first_shared_rank(Slice.of_range(r2))
            assert shared == (min(both) if both else None), (r1, r2)
            assert Slice.of_range(r1).intersects(Slice.of_range(r2)) == bool(both)


def test_nothing_world_sized_at_the_largest_world():
    """Specs, layouts, overlap checks and a rank's groups in O(ndim + group): at 2**31 - 1 ranks
    a world-sized array would take seconds and gigabytes."""
    half = 1 << 30
    t0 = time.perf_counter()
    job = build_job_plan(MAX_WORLD_SIZE, [f"students=0:{half}:dp=-1,tp=8", f"teachers={half}:{MAX_WORLD_SIZE}:2"])
    rank = MAX_WORLD_SIZE - 1  # even: the last teacher
    assert job.mesh_of(rank).label == "teachers" and job.outside == (MAX_WORLD_SIZE - half) // 2
    assert format_group(job.meshes["students"].layout.group(12345, "tp")) == "[12344, 12345, ..., 12351] (8 ranks)"
    assert count_mesh_groups(job, "students").created == 2 and job.mesh_of(rank - 1) is None
    assert time.perf_counter() - t0 < 5


# -- bad input ----------------------------------------------------------------------------------------

W16 = ["plan", "--world-size", "16"]

# (argv after ``plan --world-size 16``, text of the error line, the API's error class or None)
BAD = [
    (
        ["--mesh", "students=0:20:dp=2,tp=10"],
        "--mesh 'students=0:20:dp=2,tp=10': it reaches rank 19, outside the world of 16 ranks (0..15)",
        RankOutOfRangeError,
    ),
    (["--mesh", "students=-2:6"], "it starts at -2, outside the world", RankOutOfRangeError),
    (
        ["--mesh", "students=0:10", "--mesh", "teachers=8:16"],
        "--mesh 'teachers=8:16': it shares rank 8 with --mesh 'students=0:10' (0..9); the meshes of a job are disjoint",
        MeshArgumentError,
    ),
    (["--mesh", "a=0:16:2", "--mesh", "b=4:12:4"], "it shares rank 4 with --mesh 'a=0:16:2'", MeshArgumentError),
    (["--mesh", "a=0:16:3", "--mesh", "b=1:16:5"], "it shares rank 6", MeshArgumentError),
    (["--mesh", "students=0:8:dp=2,tp=3"], "dp*tp = 2*3 = 6 is not its 8 ranks (0..7)", SizeMismatchError),
    (["--mesh", "students=0:8:tp=3,dp=-1"], "tp=3 does not divide its 8 ranks", SizeMismatchError),
    (["--mesh", "students=0:8:dp=-1,tp=-1"], "dp and tp are both -1", SizeMismatchError),
    (["--mesh", "students=0:8:dpp=2,tp=4"], "'dpp' is not a dim name", UnknownNameError),
    (["--mesh", "students=0:8:world=8"], "'world' is not a dim name", UnknownNameError),
    (["--mesh", "students=8:8:tp=2"], "range(8, 8, 1) holds no rank", InvalidSizeError),
    (["--mesh", "students=8:4"], "range(8, 4, 1) holds no rank", InvalidSizeError),
    (["--mesh", "students=0:8:0"], "step 0 is not >= 1", InvalidSizeError),
    (["--mesh", "students=0:8:dp=0,tp=8"], "dp=0: a size is >= 1", InvalidSizeError),
    (["--mesh", "students=0:8:tp=2,tp=4"], "it names tp twice", DuplicateNameError),
    (["--mesh", "a=0:8", "--mesh", "a=8:16"], "a second mesh named 'a'", DuplicateNameError),
    (["--mesh", "0:8"], "it has no NAME= before the ranks", MeshArgumentError),
    (["--mesh", "1st=0:8"], "'1st' is not a mesh name", MeshArgumentError),
    (["--mesh", "students=0-8"], "'0-8' is not START:STOP", MeshArgumentError),
    (["--mesh", "students=0:8:dp=2:tp=4"], "is not START:STOP", MeshArgumentError),
    (["--mesh", "students=0:8:dp=x"], "'dp=x' is not DIM=SIZE", MeshArgumentError),
    (["--mesh", ""], "it has no NAME=", MeshArgumentError),
    (["--mesh", "a=0:8", "--tp", "2"], "--tp does not apply with --mesh", None),
    (["--mesh", "a=0:8", "--dp-shard", "-1"], "--dp-shard does not apply with --mesh", None),
    (["--mesh", "a=0:8", "--convention", "single"], "--convention does not apply with --mesh", None),
    (["--mesh", "a=0:8", "--order", "tp-dp"], "--order does not apply with --mesh", None),
    (["--mesh", "a=0:8", "--strict"], "--strict does not apply with --mesh", None),
    (
        ["--mesh", "a=0:8:dp=2,tp=4", "--picture", "x.png", "--dim", "pp"],
        "'pp' is not a dim of the job's meshes",
        UnknownNameError,
    ),
    (["--mesh", "a=0:8", "--dim", "tp"], "--dim only chooses", None),
    (["--mesh", "a=0:8", "--gpus-per-node", "6"], "whole number of 6-GPU nodes", None),
    (["--mesh", "a=0:8", "--rank", "16"], "--rank 16 is out of range", None),
]


@pytest.mark.parametrize("argv, says, cls", BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_bad_mesh_input_exits_2_naming_the_flag(capsys, monkeypatch, tmp_path, argv, says, cls):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *W16, *argv)
    assert code == 2 and out == "", (out, err)
    assert says in err.splitlines()[0], err
    _assert_one_error_and_fix(err)
    assert not list(tmp_path.iterdir())
    if cls is None:  # a flag the CLI refuses: no API call takes it
        return
    specs = [v for k, v in zip(argv, argv[1:]) if k == "--mesh"]
    with pytest.raises(cls) as info:  # the API's typed error for the same value
        job = build_job_plan(16, specs)
        job.find_dim(argv[argv.index("--dim") + 1])
    e = info.value
    if e.field == "mesh":
        assert e.value in specs and err.startswith(f"rankmesh plan: error: --mesh {e.value!r}: "), err
        flagged = _flag_message(e, _typed(_parser().parse_args([*W16, *argv])))
        assert str(e).startswith(f"mesh {e.value!r}: ") and f"error: {flagged}\n" in err, (err, str(e))
    else:
        assert e.field == "dim" and f"rankmesh plan: error: {e}\n" in err


def test_the_fix_is_a_spec_that_works(capsys):
    """Where the fix gives a corrected --mesh, that --mesh plans."""
    for bad in ["students=0:8:dp=2,tp=3", "students=8:4", "s=0:8:tp=3"]:
        code, _, err = run(capsys, *W16, "--mesh", bad)
        fix = err.splitlines()[-1]
        assert code == 2 and "--mesh " in fix, fix
        good = fix.rsplit("--mesh ", 1)[1]
        code, out, err = run(capsys, *W16, "--mesh", good)
        assert code == 0, (bad, good, err)


# -- pictures and help ----------------------------------------------------------------------------


def test_picture_of_a_small_job(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "kd.png"
    code, out, _ = run(capsys, *W16, *KD16, "--rank", "13", "--picture", str(path), "--dim", "dp")
    assert code == 0 and _is_png(path)
    assert f"picture: {path} (a colour per mesh, shaded by students.dp, teachers.dp groups)" in out
    path = tmp_path / "one.png"
    code, out, _ = run(capsys, *W16, *KD16, "--picture", str(path), "--dim", "teachers.dp")
    assert code == 0 and _is_png(path) and "students.tp, teachers.dp groups" in out


def test_picture_of_a_large_job(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "big.svg"
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "131072",
        "--mesh",
        "students=0:65536:2:dp=-1,tp=8",
        "--mesh",
        "teachers=1:65536:2",
        "--rank",
        "3",
        "--picture",
        str(path),
    )
    assert code == 0 and path.read_text().lstrip().startswith("<?xml")
    assert "a lane per mesh over the world's ranks" in out


def test_help_shows_a_mesh_example(capsys):
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0 and "--mesh NAME=START:STOP[:DIMS]" in out
    assert "--mesh students=0:8:dp=2,tp=4 --mesh teachers=8:16:dp=-1,tp=2" in out
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "--mesh students=0:8:dp=2,tp=4" in out
