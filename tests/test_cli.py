"""The ``rankmesh`` command: ``plan`` for the three conventions (in process), its process-group
count (against brute-force partitions and against the torch layer's real build), pictures (and
their failures: no matplotlib, a path that cannot be written), a bad-input test for every flag
(exit status 2 and a one-line fix), the API's own error for every flag value the API refuses (its
message naming the flags typed where it names their arguments), ``bench`` pass-through, and one
``python -m rankmesh`` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from rankmesh import MeshLayout
from rankmesh._check import as_rank, positive_int
from rankmesh.cli import PLAN_LIMIT, _flag_message, _parser, _typed, main
from rankmesh.errors import RankmeshError
from rankmesh.megatron import model_parallel_layout
from rankmesh.plan import build_plan, count_process_groups, format_group
from rankmesh.single import single_mesh
from rankmesh.topology import gpus_per_node_from_env

from tests.conftest import fake_world


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_torchtitan_default(capsys):
    code, out, err = run(
        capsys,
        "plan",
        "--world-size",
        "131072",
        "--tp",
        "8",
        "--pp",
        "4",
        "--cp",
        "2",
        "--ep",
        "8",
        "--dp-replicate",
        "2",
        "--gpus-per-node",
        "8",
    )
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
    assert "process groups per rank: 10 (8 real + 2 fake)" in out
    assert "shared: dataloading.tp = dense.tp\n" in out  # sparse.ep: same ranks, its own group (FSDP2)
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

    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "4096",
        "--tp",
        "8",
        "--pp",
        "4",
        "--cp",
        "2",
        "--ep",
        "8",
        "--convention",
        "megatron",
        "--rank",
        "1234",
    )
    assert code == 0
    assert "tp=8  pp=4  cp=2  dp=64  ep=8  etp=8  edp=16" in out
    assert "decoder  [pp=4, dp=64, ep=1*, cp=2, tp=8]" in out
    assert "expert   [pp=4, dp=16, ep=8, cp=1*, tp=8]" in out
    m = model_parallel_layout(4096, 8, 4, 2, 8)
    for name in m.group_names:
        g = m.group(rank=1234, name=name)
        if g is not None:
            assert f"  {name} " in out and format_group(np.sort(g)) in out, name
    assert "embd" in out and "rank 1234 holds no embd" in out
    assert "shared: tp = ep_tp" in out
    assert "default group (whole world): intra_dist_opt_instance" in out


def test_plan_megatron_order_and_etp(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "64",
        "--tp",
        "2",
        "--pp",
        "2",
        "--ep",
        "4",
        "--etp",
        "1",
        "--convention",
        "megatron",
        "--order",
        "tp-cp-ep-dp-pp",
        "--rank",
        "5",
    )
    assert code == 0 and "etp=1" in out and "order = tp-cp-ep-dp-pp" in out


def test_plan_single(capsys):
    code, out, _ = run(
        capsys, "plan", "--world-size", "64", "--tp", "4", "--pp", "2", "--convention", "single", "--rank", "13"
    )
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


def test_plan_module_docstring_runs():
    import doctest

    import rankmesh.plan

    result = doctest.testmod(rankmesh.plan, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0


def test_demo_abbreviates_groups_like_plan():
    """One abbreviation of a group: the demo prints format_group's."""
    import rankmesh.bench.demo

    assert rankmesh.bench.demo.format_group is format_group


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
            by_name = () if convention == "megatron" else (name,)  # DeviceMesh dims: per dim name
            (fake if size == 1 or asked_fake else real).add((_labels(lay, i), *by_name))
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
    parallel_dims = pytest.importorskip("rankmesh.torchtitan.parallel_dims")

    with fake_world(world, 3):
        pd = parallel_dims.ParallelDims(**kw, world_size=world)
        pd.build_mesh("cpu")
        report = pd.build_report
    count = count_process_groups(build_plan("torchtitan", world, **kw))
    assert (report.real, report.fake) == (len(count.real), len(count.fake))


# -- pictures --------------------------------------------------------------------------------------


def _is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_picture_small_world(capsys, tmp_path):
    out_png = tmp_path / "small.png"
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "64",
        "--tp",
        "4",
        "--pp",
        "2",
        "--cp",
        "2",
        "--picture",
        str(out_png),
        "--dim",
        "dense.fsdp",
        "--rank",
        "13",
    )
    assert code == 0 and _is_png(out_png)
    assert "every rank coloured by its dense.fsdp group" in out


def test_picture_large_world(capsys, tmp_path):
    out_png = tmp_path / "large.png"
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "131072",
        "--tp",
        "8",
        "--pp",
        "4",
        "--cp",
        "2",
        "--ep",
        "8",
        "--dp-replicate",
        "2",
        "--rank",
        "12345",
        "--picture",
        str(out_png),
    )
    assert code == 0 and _is_png(out_png)
    assert "rank 12345's node and its groups in the dataloading mesh" in out


def test_picture_megatron_dim_lookup(capsys, tmp_path):
    out_png = tmp_path / "m.png"
    code, out, _ = run(
        capsys,
        "plan",
        "--world-size",
        "128",
        "--tp",
        "2",
        "--pp",
        "2",
        "--cp",
        "2",
        "--ep",
        "4",
        "--etp",
        "1",
        "--convention",
        "megatron",
        "--picture",
        str(out_png),
        "--dim",
        "ep",
    )
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
    (["plan", "--world-size", "60", "--tp", "8"], "!= WORLD_SIZE(60)"),
    (["plan", "--world-size", "8", "--tp", "16"], "leaves no rank"),
    (BASE + ["--tp", "0"], "--tp 0;"),
    (BASE + ["--tp", "x"], "invalid int"),
    (BASE + ["--tp", "0", "--convention", "megatron"], "--tp must be >= 1"),
    (BASE + ["--tp", "0", "--convention", "single"], "--tp must be >= 1"),
    (BASE + ["--pp", "0"], "--pp 0;"),
    (BASE + ["--cp", "-1"], "--cp -1;"),
    (BASE + ["--cp", "2", "--convention", "single"], "no cp dim"),
    (BASE + ["--ep", "0"], "--ep 0;"),
    (BASE + ["--ep", "3"], "ep * etp = 3 * 1 = 3 must divide"),
    (BASE + ["--dp-replicate", "0"], "--dp-replicate 0;"),
    (BASE + ["--dp-replicate", "2", "--convention", "megatron"], "does not apply"),
    (BASE + ["--dp-shard", "0"], "--dp-shard 0;"),
    (BASE + ["--dp-shard", "-2"], "--dp-shard -2;"),
    (BASE + ["--dp-shard", "4"], "!= WORLD_SIZE(64)"),
    (BASE + ["--dp-shard", "4", "--convention", "megatron"], "does not apply"),
    (BASE + ["--etp", "0"], "--etp 0;"),
    (BASE + ["--tp", "4", "--ep", "2", "--etp", "2"], "ETP=TP or ETP=1"),
    (BASE + ["--etp", "2", "--convention", "single"], "--etp does not apply"),
    (BASE + ["--convention", "deepspeed"], "invalid choice"),
    (BASE + ["--order", "tp-dp-pp"], "--order does not apply to the torchtitan convention"),
    (BASE + ["--order", "tp-dp-pp", "--convention", "single"], "--order does not apply to the single convention"),
    (BASE + ["--order", "tp-xp-pp", "--convention", "megatron"], "xp"),
    (BASE + ["--order", "tp-dp", "--pp", "2", "--convention", "megatron"], "does not name it"),
    (BASE + ["--order", "", "--convention", "megatron"], "empty name"),
    (BASE + ["--order", ""], "order does not apply"),
    (["plan", "--world-size", "60", "--tp", "8", "--convention", "megatron"], "not divisible"),
    (BASE + ["--rank", "64"], "--rank 64 is out of range"),
    (BASE + ["--rank", "-1"], "--rank -1 is out of range"),
    (BASE + ["--gpus-per-node", "0"], "--gpus-per-node must be >= 1"),
    (BASE + ["--gpus-per-node", "6"], "whole number of 6-GPU nodes"),
    (BASE + ["--strict", "pp"], "unknown bandwidth-hungry family 'pp'"),
    (BASE + ["--strict", ""], "unknown bandwidth-hungry family ''"),
    (BASE + ["--strict", "ep,"], "unknown bandwidth-hungry family ''"),
    (BASE + ["--tp", "16", "--strict"], "bandwidth-hungry"),
    (BASE + ["--picture", "out.txt"], "image extension"),
    (BASE + ["--picture", ""], "image extension"),
    (BASE + ["--picture", "/nonexistent/dir/x.png"], "does not exist"),
    (BASE + ["--picture", "x.png", "--dim", "zz"], "'zz' is not a dim"),
    (BASE + ["--picture", "x.png", "--dim", ""], "'' is not a dim"),
    (BASE + ["--dim", "tp"], "--dim only chooses"),
    (["bogus"], "invalid choice"),
]


@pytest.mark.parametrize("argv, needle", BAD, ids=[" ".join(a[1:]) or a[0] for a, _ in BAD])
def test_bad_input_exits_2_with_a_fix(capsys, argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a picture that slipped through would land here
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    code, out, err = run(capsys, *argv)
    assert code == 2, (argv, out, err)
    assert needle in err, err
    _assert_one_error_and_fix(err)
    assert not list(tmp_path.iterdir())


def _assert_one_error_and_fix(err: str) -> None:
    """One error line and one fix line (argparse's usage lines aside), never a traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]
    assert len(lines) == 2 and "error: " in lines[0] and lines[1].startswith("fix: ") and len(lines[1]) > 10, err


# -- the error line names the flags the user typed (issue 28.5), the API's message its arguments -

W64 = ["--world-size", "64"]

# (argv after ``plan``, what the error line says, the API's name for the value typed, which it must not show)
FLAG_ERRORS = [
    (W64 + ["--tp", "0"], "except for dp_shard: --tp 0; use 1 to disable", "tp = 0"),
    (W64 + ["--tp", "0", "--convention", "megatron"], "error: --tp must be >= 1, got 0", "tensor_model_parallel"),
    (W64 + ["--pp", "0", "--convention", "single"], "error: --pp must be >= 1, got 0", "error: pp"),
    (W64 + ["--cp", "-1"], ": --cp -1; use 1", "cp = -1"),
    (W64 + ["--ep", "0", "--convention", "megatron"], "error: --ep must be >= 1, got 0", "expert_model_parallel"),
    (W64 + ["--etp", "0"], ": --etp 0; use 1", "etp = 0"),
    (W64 + ["--dp-replicate", "0"], ": --dp-replicate 0; use 1", "dp_replicate"),
    (W64 + ["--dp-shard", "0"], "error: --dp-shard must -1 or >=1: --dp-shard 0; use -1", "dp_shard"),
    (W64 + ["--dp-shard", "-2", "--convention", "single"], "error: --dp-shard must be >= 1 (or -1", "dp_shard"),
    (W64 + ["--tp", "4", "--ep", "2", "--etp", "2"], "ETP=1: --etp 2 with --tp 4 and --ep 2;", " = "),
    (W64 + ["--etp", "3", "--convention", "megatron"], "error: --world-size 64 is not divisible by", "world_size"),
    (["--world-size", "60", "--tp", "8", "--convention", "single"], "error: --world-size 60 is not", "world_size"),
    (["--world-size", "8", "--tp", "16"], "FSDP: --world-size 8 is smaller than", "world_size"),
    (["--world-size", "0"], "error: --world-size must be >= 1, got 0", "world_size"),
    (W64 + ["--rank", "99"], "error: --rank 99 is out of range for a world of 64 ranks", "rank = "),
    (W64 + ["--gpus-per-node", "0"], "error: --gpus-per-node must be >= 1, got 0", "gpus_per_node"),
    (W64 + ["--gpus-per-node", "6"], "6-GPU nodes; pass the real --gpus-per-node,", "gpus_per_node"),
    (W64 + ["--strict", "ep,bogus"], "family 'bogus' in --strict; choose from", "strict_dims"),
    (W64 + ["--order", "tp-xx", "--convention", "megatron"], "error: --order 'tp-xx' names 'xx'", "error: order"),
    (
        W64 + ["--order", "tp-dp", "--pp", "2", "--convention", "megatron"],
        "the --order 'tp-dp' does not name",
        "the order 'tp-dp'",
    ),
    (W64 + ["--order", "tp-dp-pp"], "error: --order does not apply to the torchtitan convention", "error: order"),
    (W64 + ["--dp-replicate", "2", "--convention", "megatron"], "error: --dp-replicate does not apply", "dp_replicate"),
    (W64 + ["--etp", "2", "--convention", "single"], "error: --etp does not apply", "error: etp"),
    (W64 + ["--cp", "2", "--convention", "single"], "has no cp dim (got --cp 2)", "cp=2"),
    (W64 + ["--tp", str(2**32)], f"error: --tp {2**32} overflows", f"tp = {2**32}"),
    (W64 + ["--mesh", "a=0:8", "--rank", "99"], "error: --rank 99 is out of range", "rank = "),
    (
        W64 + ["--mesh", "a=0:8", "--mesh", "b=4:16"],
        "error: --mesh 'b=4:16': it shares rank 4 with --mesh 'a=0:8'",
        "with mesh",
    ),
]


@pytest.mark.parametrize("argv, says, api_name", FLAG_ERRORS, ids=[" ".join(a) for a, _, _ in FLAG_ERRORS])
def test_the_error_line_names_the_flags_typed(capsys, monkeypatch, tmp_path, argv, says, api_name):
    """Where the API's message names an argument whose flag the user typed (``tp = 0``,
    ``tensor_model_parallel_size must``, ``world_size (64)``, ``in strict_dims``), ``rankmesh plan``
    prints the flag (``--tp 0``, ``--tp must``, ``--world-size 64``, ``in --strict``); the fix line
    already speaks in flags."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    code, out, err = run(capsys, "plan", *argv)
    assert code == 2, (out, err)
    _assert_one_error_and_fix(err)
    line = next(line for line in err.splitlines() if line.startswith("rankmesh plan: error: "))
    assert says in line and api_name not in line, line


# (argv after ``plan --world-size 64``, what the error line keeps of the API's message)
KEPT = [
    (["--dp-shard", "4"], "dp_replicate(1) * dp_shard(4) * cp(1) * tp(1) * pp(1) != WORLD_SIZE(64)"),  # a formula
    (["--ep", "3"], "ep * etp = 3 * 1 = 3 must divide dp_shard * cp * tp = 64 * 1 * 1 = 64"),  # a formula
    (["--tp", "128"], "error: dp_shard = -1 leaves no rank for FSDP: --world-size 64 is smaller"),  # not typed
    (["--cp", "2", "--convention", "single"], "the single-mesh convention has no cp dim"),  # a dim, not the flag
]


@pytest.mark.parametrize("argv, kept", KEPT, ids=[" ".join(a) for a, _ in KEPT])
def test_the_error_line_keeps_formulas_dims_and_values_not_typed(capsys, monkeypatch, argv, kept):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    code, _, err = run(capsys, "plan", *W64, *argv)
    assert code == 2 and kept in err.splitlines()[0], err


def test_flag_rendering_leaves_the_api_message_alone(capsys):
    """The API's errors keep their argument names: only ``rankmesh plan`` prints flags."""
    cases = [
        (lambda: build_plan("torchtitan", 64, tp=0), ["--tp", "0"], "tp = 0", "--tp 0"),
        (
            lambda: model_parallel_layout(64, tensor_model_parallel_size=0),
            ["--tp", "0", "--convention", "megatron"],
            "tensor_model_parallel_size must be >= 1",
            "--tp must be >= 1",
        ),
        (lambda: as_rank(99, 64), ["--rank", "99"], "rank = 99 is out", "--rank 99 is out"),
        (lambda: positive_int(0, "world_size"), [], "world_size must be >= 1", "--world-size must be >= 1"),
    ]
    for call, argv, api, cli in cases:
        e = _api_error(call)
        before = str(e)
        typed = _typed(_parser().parse_args(["plan", *W64, *argv]))
        assert api in before and cli in _flag_message(e, typed) and str(e) == before, (before, typed)
        assert _flag_message(e, {}) == before  # no flag typed: the API's message as it is


# -- flag values the API refuses: the CLI gives the API's own error (with the flags typed), never a default


def _api_error(call) -> Exception:
    with pytest.raises(RankmeshError) as info:
        call()
    return info.value


def _topology(gpn, **kw):
    from rankmesh.topology import topology_report

    plan = build_plan("torchtitan", 64, tp=kw.pop("tp", 1))
    return topology_report(plan.built(), 0, gpn, **kw)


# (flag class, argv after ``plan --world-size 64``, $LOCAL_WORLD_SIZE, the API call refusing the same value)
API_REFUSES = [
    ("empty --order", ["--order", "", "--convention", "megatron"], None, lambda: model_parallel_layout(64, order="")),
    ("empty --order, torchtitan", ["--order", ""], None, lambda: build_plan("torchtitan", 64, order="")),
    ("LOCAL_WORLD_SIZE=''", [], "", gpus_per_node_from_env),
    ("LOCAL_WORLD_SIZE=abc", [], "abc", gpus_per_node_from_env),
    ("LOCAL_WORLD_SIZE=0", [], "0", gpus_per_node_from_env),
    ("LOCAL_WORLD_SIZE=-3", [], "-3", gpus_per_node_from_env),
    ("LOCAL_WORLD_SIZE not dividing", [], "6", lambda: _topology(None)),
    ("zero --world-size", None, None, lambda: positive_int(0, "world_size")),
    ("zero degree, torchtitan", ["--tp", "0"], None, lambda: build_plan("torchtitan", 64, tp=0)),
    (
        "zero degree, megatron",
        ["--ep", "0", "--convention", "megatron"],
        None,
        lambda: model_parallel_layout(64, expert_model_parallel_size=0),
    ),
    ("zero degree, single", ["--pp", "0", "--convention", "single"], None, lambda: single_mesh(64, pp=0)),
    ("negative --dp-shard", ["--dp-shard", "-2"], None, lambda: build_plan("torchtitan", 64, dp_shard=-2)),
    ("--ep not dividing", ["--ep", "3"], None, lambda: build_plan("torchtitan", 64, ep=3)),
    (
        "--etp vs --tp",
        ["--tp", "4", "--ep", "2", "--etp", "2"],
        None,
        lambda: build_plan("torchtitan", 64, tp=4, ep=2, etp=2),
    ),
    ("--cp for single", ["--cp", "2", "--convention", "single"], None, lambda: single_mesh(64, cp=2)),
    (
        "--dp-shard for megatron",
        ["--dp-shard", "-1", "--convention", "megatron"],
        None,
        lambda: build_plan("megatron", 64, dp_shard=-1),
    ),
    ("out-of-range --rank", ["--rank", "64"], None, lambda: as_rank(64, 64)),
    ("negative --rank", ["--rank", "-1"], None, lambda: as_rank(-1, 64)),
    ("zero --gpus-per-node", ["--gpus-per-node", "0"], None, lambda: positive_int(0, "gpus_per_node")),
    ("--gpus-per-node not dividing", ["--gpus-per-node", "6"], None, lambda: _topology(6)),
    ("unknown --dim", ["--picture", "x.png", "--dim", "zz"], None, lambda: build_plan("torchtitan", 64).find_dim("zz")),
    ("empty --strict", ["--strict", ""], None, lambda: _topology(8, strict=True, strict_dims=("",))),
    ("unknown --strict", ["--strict", "ep,pp"], None, lambda: _topology(8, strict=True, strict_dims=("ep", "pp"))),
    ("--strict violated", ["--tp", "16", "--strict"], None, lambda: _topology(8, tp=16, strict=True)),
]


@pytest.mark.parametrize("argv, env, call", [c[1:] for c in API_REFUSES], ids=[c[0] for c in API_REFUSES])
def test_flags_the_api_refuses_give_the_apis_error(capsys, monkeypatch, tmp_path, argv, env, call):
    monkeypatch.chdir(tmp_path)
    if env is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", env)
    expected = _api_error(call)
    argv = ["plan", "--world-size", "0"] if argv is None else ["plan", "--world-size", "64", *argv]
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    flagged = _flag_message(expected, _typed(_parser().parse_args(argv)))  # the API's message, flags for names
    assert f"rankmesh plan: error: {flagged}\n" in err, (type(expected).__name__, err)
    _assert_one_error_and_fix(err)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "kw",
    [
        dict(tp=0),
        dict(pp=-1),
        dict(cp=0),
        dict(ep=0),
        dict(etp=0),
        dict(dp_replicate=0),
        dict(dp_shard=0),
        dict(dp_shard=-2),
        dict(dp_shard=4),
        dict(tp=128),
        dict(tp=4, ep=2, etp=2),
        dict(ep=3),
        dict(tp=2, ep=4, etp=2, dp_shard=4),
    ],
    ids=repr,
)
def test_torchtitan_degrees_are_refused_like_parallel_dims(kw):
    """``rankmesh plan`` refuses torchtitan degrees with ParallelDims' own error: type, message, field."""
    parallel_dims = pytest.importorskip("rankmesh.torchtitan.parallel_dims")
    full = dict(dp_replicate=1, dp_shard=-1, cp=1, tp=1, pp=1, ep=1, etp=1) | kw
    with pytest.raises(RankmeshError) as theirs:
        parallel_dims.ParallelDims(**full, world_size=64).layouts  # the sparse check runs with the layouts
    ours = _api_error(lambda: build_plan("torchtitan", 64, **full))
    assert (type(ours), str(ours), ours.field) == (type(theirs.value), str(theirs.value), theirs.value.field)


# -- --picture failures ----------------------------------------------------------------------------


def test_picture_without_matplotlib(capsys, monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    out_png = tmp_path / "m.png"
    code, out, err = run(capsys, "plan", "--world-size", "64", "--picture", str(out_png))
    assert code == 2 and out == ""
    assert "--picture needs matplotlib" in err and "fix: pip install 'rankmesh[plot]'" in err, err
    _assert_one_error_and_fix(err)
    assert not out_png.exists()


def test_picture_path_is_a_folder(capsys, tmp_path):
    folder = tmp_path / "mesh.png"
    folder.mkdir()
    code, out, err = run(capsys, "plan", "--world-size", "64", "--picture", str(folder))
    assert code == 2 and out == ""
    assert f"cannot write --picture '{folder}': it is a folder" in err, err
    _assert_one_error_and_fix(err)


def test_picture_folder_not_writable(capsys, monkeypatch, tmp_path):
    import rankmesh.cli

    monkeypatch.setattr(rankmesh.cli.os, "access", lambda path, mode: False)  # root writes anywhere
    path = tmp_path / "mesh.png"
    code, out, err = run(capsys, "plan", "--world-size", "64", "--picture", str(path))
    assert code == 2 and out == ""
    assert f"cannot write --picture '{path}': permission denied" in err, err
    _assert_one_error_and_fix(err)


def test_picture_write_fails(capsys, monkeypatch, tmp_path):
    """A write that fails only when it happens (disk full, a read-only mount) is one line too."""
    from matplotlib.figure import Figure

    def refuse(self, fname, **kw):
        raise PermissionError(13, "Permission denied", str(fname))

    monkeypatch.setattr(Figure, "savefig", refuse)
    path = tmp_path / "mesh.png"
    code, out, err = run(capsys, "plan", "--world-size", "64", "--picture", str(path))
    assert code == 2 and "rankmesh plan:" in out  # the plan was printed before drawing
    assert f"cannot write --picture '{path}': Permission denied" in err, err
    _assert_one_error_and_fix(err)


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


def test_bench_model_goes_to_the_model_benchmark(monkeypatch):
    import rankmesh.bench
    import rankmesh.bench.model

    seen = []
    monkeypatch.setattr(rankmesh.bench.model, "main", lambda argv=None: seen.append(argv) or 0)
    monkeypatch.setattr(rankmesh.bench, "main", lambda argv=None: pytest.fail("the mesh benchmark ran"))
    assert main(["bench", "model", "--workload", "fsdp_tp"]) == 0
    assert seen == [["--workload", "fsdp_tp"]]


@pytest.mark.parametrize(
    "text, says",
    [
        ("4096", "got 4096; for 4,096 ranks pass --worlds 12"),
        ("12,0", "got 0"),
        ("31", "got 31"),
        ("12,x", "comma-separated integers"),
    ],
)
def test_bench_worlds_are_log2_sizes(capsys, text, says):
    import argparse

    from rankmesh.bench import parse_worlds

    assert parse_worlds(argparse.ArgumentParser(), "17,20") == [131_072, 1_048_576]
    with pytest.raises(SystemExit):
        parse_worlds(argparse.ArgumentParser(prog="rankmesh bench"), text)
    assert says in capsys.readouterr().err


def test_python_dash_m_rankmesh():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("LOCAL_WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rankmesh", "plan", "--world-size", "1024", "--tp", "8", "--pp", "2", "--rank", "77"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "rank 77's groups" in proc.stdout and "dense.tp" in proc.stdout
    assert "[72, 73, ..., 79] (8 ranks)" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "rankmesh", "plan", "--world-size", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert bad.returncode == 2 and "fix:" in bad.stderr


# -- the fix line is the API error's own fix, with flags for argument names ----------------------

PLAN_ERRORS = [
    (dict(tp=0), "torchtitan", "degree_not_positive"),
    (dict(tp=0), "megatron", "degree_not_positive"),
    (dict(tp=0), "single", "degree_not_positive"),
    (dict(tp=128), "torchtitan", "no_rank_left"),
    (dict(dp_shard=4), "torchtitan", "degrees_do_not_fill_world"),
    (dict(ep=3), "torchtitan", "moe_mesh_does_not_divide"),
    (dict(tp=4, ep=2, etp=2), "torchtitan", "etp_not_tp_or_1"),
    (dict(tp=7), "megatron", "world_not_divisible"),
    (dict(pp=2, order="tp-dp"), "megatron", "order_misses_dim"),
    (dict(order="tp-xp-pp"), "megatron", "unknown_name"),
    (dict(order="tp-dp"), "torchtitan", "not_for_convention"),
    (dict(dp_replicate=2), "megatron", "not_for_convention"),
    (dict(cp=2), "single", "parallel_config"),
]


@pytest.mark.parametrize("kw, convention, kind", PLAN_ERRORS, ids=[f"{c}-{k}" for _, c, k in PLAN_ERRORS])
def test_the_cli_fix_is_the_errors_fix_with_flags(capsys, monkeypatch, kw, convention, kind):
    """Every error build_plan raises for a flag carries a kind and a fix in argument names; the
    CLI prints that fix with its flags (and, for an order, an order it has tried)."""
    from rankmesh.cli import _FLAG

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    e = _api_error(lambda: build_plan(convention, 64, **kw))
    assert e.kind == kind and e.fix is not None, (e.kind, e.fix)
    api_fix, cli_fix = e.fix_text(), e.fix_text(_FLAG.get)
    assert "{" not in api_fix and "{" not in cli_fix and "--" not in api_fix, api_fix
    assert cli_fix != api_fix and "--" in cli_fix
    flags = [f"--{k.replace('_', '-')}" for k in kw] + ["--convention", "--world-size"]
    argv = ["plan", "--world-size", "64", "--convention", convention]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    code, _, err = run(capsys, *argv)
    fix_line = next(line for line in err.splitlines() if line.startswith("fix: "))
    assert code == 2 and fix_line.startswith(f"fix: {cli_fix}"), (fix_line, cli_fix)
    assert any(f in fix_line for f in flags), fix_line


@pytest.mark.parametrize(
    "argv, works",
    [
        (["--tp", "2", "--pp", "2", "--ep", "4", "--order", "tp-pp-dp"], "tp-ep-dp-pp"),  # ep missing, pp last
        (["--tp", "2", "--pp", "2", "--ep", "4", "--order", "tp-dp"], "tp-cp-ep-dp-pp"),
        (["--tp", "2", "--pp", "2", "--ep", "4", "--order", "tp-pp-ep-dp"], "tp-ep-dp-pp"),  # dp 4, expert dp 1
        (["--tp", "2", "--pp", "2", "--ep", "4", "--order", "tp-xp-pp"], "tp-cp-ep-dp-pp"),  # unreadable: default
        (["--tp", "2", "--pp", "2", "--ep", "3", "--order", "tp-dp"], None),  # 2*3*2 never divides 16
    ],
)
def test_the_cli_suggests_the_order_the_error_proved(capsys, monkeypatch, argv, works):
    """rankmesh plan's --order fix is the order the API's error carries (e.ctx["works"], which its
    message suggests too), found by working_order; the plan is not built again to find it."""
    import rankmesh.cli as cli

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    calls = []
    real = cli.build_plan
    monkeypatch.setattr(cli, "build_plan", lambda *a, **k: calls.append(a) or real(*a, **k))
    code, _, err = run(capsys, "plan", "--world-size", "16", "--convention", "megatron", *argv)
    fix = next(line for line in err.splitlines() if line.startswith("fix: "))
    assert code == 2 and len(calls) == 1, calls
    if works is None:
        assert fix.endswith("no order works with these degrees alone: drop --order, and the error names what to change")
    else:
        assert fix.endswith(f", e.g. --order {works}"), fix
        kw = dict(zip(argv[::2], argv[1::2]))
        build_plan("megatron", 16, tp=2, pp=2, ep=int(kw["--ep"]), order=works)
    e = _api_error(lambda: build_plan("megatron", 16, tp=2, pp=2, ep=int(argv[5]), order=argv[7]))
    if "works" in e.ctx:
        assert e.ctx["works"] == works and (works is None or repr(works) in str(e)), (e.ctx, str(e))
