"""The ``rankmesh`` command: ``plan`` for the three conventions (in process), its process-group
count (against brute-force partitions and against the torch layer's real build), pictures, a
bad-input test for every flag (exit status 2 and a one-line fix), ``bench`` pass-through, and one
``python -m rankmesh`` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from rankmesh import MeshLayout
from rankmesh.cli import PLAN_LIMIT, build_plan, count_process_groups, format_group, main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_torchtitan_default(capsys):
    code, out, err = run(capsys, "plan", "--world-size", "131072", "--tp", "8", "--pp", "4", "--cp", "2",
                         "--ep", "8", "--dp-replicate", "2", "--gpus-per-node", "8")  # fmt: skip
    assert code == 0 and err == ""
    assert "torchtitan convention, world of 131072 ranks, rank 0" in out
    assert "pp=4  dp_replicate=2  dp_shard=1024  cp=2  tp=8  ep=8  etp=1" in out
    assert "efsdp = 2048 (fsdp*tp/(etp*ep))" in out
    assert "dataloading  [pp=4, batch=2048*, cp=2, tp=8]" in out
    assert "loss         [loss=4096]" in out
    assert "dense        [pp=4, dp_replicate=2, fsdp=2048, tp=8]" in out
    assert "sparse       [pp=4, dp_replicate=2, efsdp=2048, ep=8, etp=1*]" in out
    assert "dense.tp             [0, 1, ..., 7] (8 ranks)" in out
    assert "dataloading.pp       [0, 32768, 65536, 98304] (4 ranks)" in out
    assert "process groups per rank: 8 (6 real + 2 fake)" in out
    assert "shared: dataloading.tp = dense.tp = sparse.ep" in out
    assert "topology: 16384 node(s) of 8 GPUs; rank 0 is on node 0" in out
    assert "dense.tp                    8 ranks  inside node 0; every group inside a node" in out


def test_plan_shows_the_callers_groups(capsys):
    code, out, _ = run(capsys, "plan", "--world-size", "64", "--tp", "4", "--pp", "2", "--rank", "13")
    assert code == 0
    plan = build_plan("torchtitan", 64, tp=4, pp=2)
    for label, lay in plan.built().items():
        for i, name in enumerate(lay.names):
            assert f"{plan.tag(label, name)}" in out
            assert format_group(lay.group(13, i)) in out


def test_plan_megatron(capsys):
    from rankmesh.megatron import model_parallel_layout

    code, out, _ = run(capsys, "plan", "--world-size", "4096", "--tp", "8", "--pp", "4", "--cp", "2",
                       "--ep", "8", "--convention", "megatron", "--rank", "1234")  # fmt: skip
    assert code == 0
    assert "tp=8  pp=4  cp=2  dp=64  ep=8  etp=8  edp=16" in out
    assert "decoder  [pp=4, dp=64, ep=1*, cp=2, tp=8]" in out
    assert "expert   [pp=4, dp=16, ep=8, cp=1*, tp=8]" in out
    m = model_parallel_layout(4096, 8, 4, 2, 8)
    for name in m.group_names:
        g = m.group(name, 1234)
        if g is not None:
            assert f"  {name} " in out and format_group(np.sort(g)) in out, name
    assert "embd" in out and "rank 1234 holds no embd" in out
    assert "shared: tp = ep_tp" in out
    assert "default group (whole world): intra_dist_opt_instance" in out


def test_plan_megatron_order_and_etp(capsys):
    code, out, _ = run(capsys, "plan", "--world-size", "64", "--tp", "2", "--pp", "2", "--ep", "4", "--etp", "1",
                       "--convention", "megatron", "--order", "tp-cp-ep-dp-pp", "--rank", "5")  # fmt: skip
    assert code == 0 and "etp=1" in out and "order = tp-cp-ep-dp-pp" in out


def test_plan_single(capsys):
    code, out, _ = run(capsys, "plan", "--world-size", "64", "--tp", "4", "--pp", "2", "--convention", "single", "--rank", "13")
    assert code == 0
    assert "mesh  [pp=2, dp_shard=8, tp=4]" in out
    assert "mesh.tp        [12, 13, 14, 15] (4 ranks)" in out
    assert "dims of size 1 dropped: dp_replicate, ep" in out
    assert "process groups per rank: 3 (3 real + 0 fake)" in out
    code, out, _ = run(capsys, "plan", "--world-size", "8", "--tp", "8", "--convention", "single")
    assert code == 0 and "[dp_shard=1*, tp=8]" in out and "dp_shard kept at size 1" in out


def test_format_group():
    assert format_group([3]) == "[3] (1 rank)"
    assert format_group([0, 4]) == "[0, 4] (2 ranks)"
    assert format_group(range(8)) == "[0, 1, ..., 7] (8 ranks)"
    assert format_group(np.arange(0, 64, 8, dtype=np.int32)) == "[0, 8, ..., 56] (8 ranks)"
    assert format_group([0, 1, 4, 5, 8, 9]) == "[0, 1, 4, 5, 8, 9] (6 ranks)"
    assert format_group([0, 1, 4, 5, 8, 9, 12, 13, 16]) == "[0, 1, 4, 5, ..., 16] (9 ranks)"


# -- process-group count ------------------------------------------------------------------------


def _labels(lay: MeshLayout, dim: int) -> bytes:
    """The dim's partition of the world as bytes: for every rank, the least rank of its group."""
    one = lay[lay.names[dim]]
    rows = one.groups().reshape(-1, int(one.size()))
    out = np.empty(lay.world_size, dtype=np.int64)
    out[rows] = rows.min(axis=1, keepdims=True)
    return out.tobytes()


@pytest.mark.parametrize(
    "convention, world, kw",
    [
        ("torchtitan", 256, dict(tp=4, pp=2, cp=2, ep=4, dp_replicate=2)),
        ("torchtitan", 64, dict(tp=8)),
        ("torchtitan", 96, dict(tp=2, pp=3, cp=2, ep=2, etp=2)),
        ("megatron", 128, dict(tp=2, pp=2, cp=2, ep=4)),
        ("megatron", 96, dict(tp=2, pp=3, ep=2, etp=1, order="tp-cp-ep-dp-pp")),
        ("single", 64, dict(tp=2, pp=2, ep=2, dp_replicate=2)),
    ],
)
def test_count_is_the_number_of_distinct_partitions(convention, world, kw):
    plan = build_plan(convention, world, **kw)
    count = count_process_groups(plan)
    real, fake = set(), set()
    for label, lay in plan.built().items():
        for i, name in enumerate(lay.names):
            size = int(lay.size(i))
            asked_fake = name in plan.fake.get(label, ())
            if size == world and not asked_fake:  # torch: the default group, unless overridden
                continue
            (fake if size == 1 or asked_fake else real).add(_labels(lay, i))
    assert (len(count.real), len(count.fake)) == (len(real), len(fake))


@pytest.mark.parametrize(
    "world, kw",
    [
        (256, dict(tp=4, pp=2, cp=2, ep=4, dp_replicate=2, dp_shard=-1, etp=1)),
        (64, dict(tp=8, pp=1, cp=1, ep=1, dp_replicate=1, dp_shard=-1, etp=1)),
        (128, dict(tp=2, pp=4, cp=2, ep=8, dp_replicate=1, dp_shard=-1, etp=1)),
    ],
)
def test_count_equals_the_torch_layers_real_build(world, kw):
    """The number ``plan`` prints is what ParallelDims + MeshBuilder create on a rank."""
    dist = pytest.importorskip("torch.distributed")
    parallel_dims = pytest.importorskip("rankmesh.parallel_dims")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=3, world_size=world, store=FakeStore())
    try:
        pd = parallel_dims.ParallelDims(**kw, world_size=world)
        pd.build_mesh("cpu")
        report = pd.build_report
    finally:
        dist.destroy_process_group()
    count = count_process_groups(build_plan("torchtitan", world, **kw))
    assert (report.real, report.fake) == (len(count.real), len(count.fake))


# -- pictures --------------------------------------------------------------------------------------


def _is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_picture_small_world(capsys, tmp_path):
    out_png = tmp_path / "small.png"
    code, out, _ = run(capsys, "plan", "--world-size", "64", "--tp", "4", "--pp", "2", "--cp", "2",
                       "--picture", str(out_png), "--dim", "dense.fsdp", "--rank", "13")  # fmt: skip
    assert code == 0 and _is_png(out_png)
    assert "every rank coloured by its dense.fsdp group" in out


def test_picture_large_world(capsys, tmp_path):
    out_png = tmp_path / "large.png"
    code, out, _ = run(capsys, "plan", "--world-size", "131072", "--tp", "8", "--pp", "4", "--cp", "2",
                       "--ep", "8", "--dp-replicate", "2", "--rank", "12345", "--picture", str(out_png))  # fmt: skip
    assert code == 0 and _is_png(out_png)
    assert "rank 12345's node and its groups in the dataloading mesh" in out


def test_picture_megatron_dim_lookup(capsys, tmp_path):
    out_png = tmp_path / "m.png"
    code, out, _ = run(capsys, "plan", "--world-size", "128", "--tp", "2", "--pp", "2", "--cp", "2", "--ep", "4",
                       "--etp", "1", "--convention", "megatron", "--picture", str(out_png), "--dim", "ep")  # fmt: skip
    assert code == 0 and "expert.ep group" in out  # ep > 1 lives in the expert mesh


# -- bad input: every flag ------------------------------------------------------------------------

BASE = ["plan", "--world-size", "64"]

BAD = [
    (["plan"], "--world-size"),  # missing required flag
    (["plan", "--world-size", "abc"], "invalid int"),
    (["plan", "--world-size", "0"], "--world-size must be >= 1"),
    (["plan", "--world-size", "-8"], "--world-size must be >= 1"),
    (["plan", "--world-size", str(PLAN_LIMIT * 2)], "limit"),
    (["plan", "--world-size", str(2**31)], "int32"),
    (["plan", "--world-size", "60", "--tp", "8"], "not divisible"),
    (BASE + ["--tp", "0"], "--tp must be >= 1"),
    (BASE + ["--tp", "x"], "invalid int"),
    (BASE + ["--pp", "0"], "--pp must be >= 1"),
    (BASE + ["--cp", "-1"], "--cp must be >= 1"),
    (BASE + ["--cp", "2", "--convention", "single"], "no cp dim"),
    (BASE + ["--ep", "0"], "--ep must be >= 1"),
    (BASE + ["--ep", "3"], "ep*etp"),
    (BASE + ["--dp-replicate", "0"], "--dp-replicate must be >= 1"),
    (BASE + ["--dp-replicate", "2", "--convention", "megatron"], "does not apply"),
    (BASE + ["--dp-shard", "0"], "--dp-shard must be -1 or >= 1"),
    (BASE + ["--dp-shard", "-2"], "--dp-shard must be -1 or >= 1"),
    (BASE + ["--dp-shard", "4"], "not the world size"),
    (BASE + ["--dp-shard", "4", "--convention", "megatron"], "does not apply"),
    (BASE + ["--etp", "0"], "--etp must be >= 1"),
    (BASE + ["--tp", "4", "--ep", "2", "--etp", "2"], "etp = tp or etp = 1"),
    (BASE + ["--etp", "2", "--convention", "single"], "--etp does not apply"),
    (BASE + ["--convention", "deepspeed"], "invalid choice"),
    (BASE + ["--order", "tp-dp-pp"], "only applies to --convention megatron"),
    (BASE + ["--order", "tp-xp-pp", "--convention", "megatron"], "xp"),
    (BASE + ["--order", "tp-dp", "--pp", "2", "--convention", "megatron"], "does not name it"),
    (BASE + ["--rank", "64"], "--rank 64 is outside"),
    (BASE + ["--rank", "-1"], "--rank -1 is outside"),
    (BASE + ["--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    (BASE + ["--gpus-per-node", "6"], "whole number"),
    (BASE + ["--strict", "pp"], "bandwidth-hungry dims are tp, ep, cp"),
    (BASE + ["--tp", "16", "--strict"], "strict topology"),
    (BASE + ["--picture", "out.txt"], "image extension"),
    (BASE + ["--picture", "/nonexistent/dir/x.png"], "does not exist"),
    (BASE + ["--picture", "x.png", "--dim", "zz"], "--dim 'zz'"),
    (BASE + ["--dim", "tp"], "--dim only chooses"),
    (["bogus"], "invalid choice"),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a[1:]) or a[0] for a, _ in BAD])
def test_bad_input_exits_2_with_a_fix(capsys, argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a picture that slipped through would land here
    code, out, err = run(capsys, *argv)
    assert code == 2, (argv, out, err)
    assert needle in err, err
    assert "error:" in err
    fixes = [line for line in err.splitlines() if line.startswith("fix: ")]
    assert len(fixes) == 1 and len(fixes[0]) > 10, err
    assert not list(tmp_path.iterdir())


def test_help_and_strict_ok(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "plan" in out and "bench" in out
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0 and "--gpus-per-node" in out
    code, out, _ = run(capsys, "plan", "--world-size", "64", "--tp", "8", "--cp", "2", "--strict", "cp")
    assert code == 2  # cp crosses nodes
    code, out, _ = run(capsys, "plan", "--world-size", "64", "--tp", "4", "--cp", "2", "--strict", "cp")
    assert code == 0 and "strict: every bandwidth-hungry dim (tp, cp) stays inside a node" in out


def test_gpus_per_node_default(capsys, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    code, out, _ = run(capsys, "plan", "--world-size", "16", "--tp", "4")
    assert code == 0 and "4 node(s) of 4 GPUs" in out
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    code, out, _ = run(capsys, "plan", "--world-size", "12", "--tp", "2")
    assert code == 0 and "assuming 4" in out and "3 node(s) of 4 GPUs" in out


def test_bench_passes_arguments_through(monkeypatch):
    import rankmesh.bench

    seen = []
    monkeypatch.setattr(rankmesh.bench, "main", lambda argv=None: seen.append(argv) or 0)
    assert main(["bench", "--worlds", "10", "--repeats", "1"]) == 0
    assert seen == [["--worlds", "10", "--repeats", "1"]]
    monkeypatch.setattr(rankmesh.bench, "main", lambda argv=None: 3)
    assert main(["bench"]) == 3


def test_python_dash_m_rankmesh():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("LOCAL_WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rankmesh", "plan", "--world-size", "1024", "--tp", "8", "--pp", "2", "--rank", "77"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "rank 77's groups" in proc.stdout and "dense.tp" in proc.stdout and "[72, 73, ..., 79] (8 ranks)" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "rankmesh", "plan", "--world-size", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "fix:" in bad.stderr
