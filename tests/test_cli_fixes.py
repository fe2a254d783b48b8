"""Every ``fix:`` line ``rankmesh plan`` prints is a command that works (issue 49): a bad command's
fix is read as edits of the command typed (each ``--flag VALUE`` in it to set, each ``drop --flag``
to drop, a ``did you mean --pp?`` to rename the flag typed wrong, a ``--mesh`` to replace the mesh of
its name or the one the error names), each alternative of it (``..., or ...``) is run, and each gets
further: it exits 0, or with another error; following the first alternative ends in a plan. Also
the did-you-mean of a flag typed wrong, the ``bench`` help text and heads-up, and the title of
``--picture``'s bar of meshes."""

from __future__ import annotations

import re

import pytest
from rankmesh.cli import PICTURE_SUFFIXES, _parser, main

#: Each flag of ``rankmesh plan`` by its option string.
PLAN = {o: a for a in _parser().commands["plan"]._actions for o in a.option_strings if o.startswith("--")}
_TRAILING = ",;:)?"


def _takes(flag: str, value: str) -> bool:
    """Whether ``value`` is one ``flag`` takes (a word after a flag in prose is no value)."""
    action = PLAN[flag]
    if action.type is int:
        return re.fullmatch(r"-?[0-9]+", value) is not None
    if action.choices:
        return value in action.choices
    if flag == "--mesh":
        return "=" in value
    if flag == "--picture":
        return value.lower().endswith(PICTURE_SUFFIXES)
    if flag == "--order":
        return re.fullmatch(r"[a-z]+(-[a-z]+)+", value) is not None
    return bool(value) and value[0].isalnum()


def edits(alternative: str) -> list[tuple[str, str | None]]:
    """The edits one alternative of a fix says: ``(flag, value)`` to set, ``(flag, None)`` to drop.
    A flag with punctuation right after it (``--order,``, ``--tp:``) takes no value there."""
    tokens = alternative.split()
    out: list[tuple[str, str | None]] = []
    for i, token in enumerate(tokens):
        flag = token.lstrip("(`").rstrip(_TRAILING + "`")
        if flag not in PLAN:
            continue
        bare = token.lstrip("(`") == flag
        value = tokens[i + 1].rstrip(_TRAILING) if bare and i + 1 < len(tokens) else None
        if value is not None and _takes(flag, value):
            out.append((flag, value))
        elif i and tokens[i - 1] == "drop":
            out.append((flag, None))
    return out


def _error_line(err: str) -> str:
    return next(line for line in err.splitlines() if ": error: " in line)


def _fix_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("fix: ")).removeprefix("fix: ")


def _set(argv: list[str], flag: str, value: str | None, named: str | None) -> list[str]:
    out = list(argv)
    has_value = [i for i, t in enumerate(out) if t == flag]
    if value is None:  # drop the flag and its value (--strict may have none)
        i = has_value[0]
        takes = i + 1 < len(out) and not out[i + 1].startswith("--")
        return out[:i] + out[i + 1 + takes :]
    if flag == "--mesh":
        label = value.partition("=")[0]
        same = [i for i in has_value if out[i + 1].partition("=")[0] == label]
        same = same or [i for i in has_value if out[i + 1] == named]
        if same:
            out[same[0] + 1] = value
            return out
        return out + [flag, value]
    if has_value:
        i = has_value[0]
        if i + 1 < len(out) and not (out[i + 1].startswith("--") and flag == "--strict"):
            out[i + 1] = value
        else:
            out.insert(i + 1, value)
        return out
    return out + [flag, value]


def fixed_commands(argv: list[str], err: str) -> list[list[str]]:
    """The commands a fix line says to run instead of ``argv``: one per alternative with edits."""
    line, fix = _error_line(err), _fix_line(err)
    if "unrecognized arguments: " in line:  # rename the flags typed wrong, drop the rest
        said = fix.split("did you mean ", 1)[1].split("?")[0] if "did you mean " in fix else ""
        unknown = line.split("unrecognized arguments: ", 1)[1].split()
        pairs = [tuple(p.split(" (not ")) for p in said.split(", ")] if "(not " in said else []
        meant = {old.rstrip(")"): new for new, old in pairs} if pairs else {}
        if said and not pairs:
            meant = {next(t for t in unknown if t.startswith("--")).partition("=")[0]: said}
        dropped = fix.split("drop ", 1)[1].split(";")[0].split() if "drop " in fix else []
        out = [t for t in argv if t not in dropped]
        out = [
            meant.get(t.partition("=")[0], t.partition("=")[0]) + ("=" + t.partition("=")[2] if "=" in t else "")
            if t.startswith("--")
            else t
            for t in out
        ]
        return [out]
    named = line.split("--mesh '", 1)[1].split("'")[0] if "--mesh '" in line else None
    commands = []
    for alternative in re.split(r",? or |; ", fix):
        wanted = edits(alternative)
        if wanted:
            out = list(argv)
            for flag, value in wanted:
                out = _set(out, flag, value, named)
            commands.append(out)
    return commands


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    assert code in (0, 2) and "Traceback" not in err, (argv, code, err)
    return code, out, err


# (argv after ``plan``, $LOCAL_WORLD_SIZE): a bad command for every fix rankmesh plan gives
W64 = ["--world-size", "64"]
BAD = [
    # issue 49
    (["--world-size", "131072", "--tp", "7"], None),
    (["--world-size", "131072", "--dp-replicate", "3"], None),
    (["--world-size", "131072", "--tp", "7", "--pp", "4"], None),
    (["--world-size", "16", "--mesh", "students=0:8:dp=3,tp=4"], None),
    (["--world-size", "16", "--mesh", "students=0:8:dp=2,sp=4"], None),
    (["--ppp", "4", "--world-size", "64"], None),
    (["--tensor-parallel", "8", "--world-size", "64"], None),
    (["--world-size", "64", "--tensor-model-parallel-size", "8", "--ppp", "2", "--xyz", "3"], None),
    # argparse's own errors
    ([], None),
    (["--world-size", "abc"], None),
    (W64 + ["--tp"], None),
    (W64 + ["--tp", "x"], None),
    (W64 + ["--convention", "deepspeed"], None),
    (W64 + ["--convention", "megatorn"], None),
    # the world and the rank
    (["--world-size", "0"], None),
    (["--world-size", "-8"], None),
    (W64 + ["--rank", "64"], None),
    (W64 + ["--rank", "-1"], None),
    # torchtitan's degrees
    (["--world-size", "60", "--tp", "8"], None),
    (["--world-size", "8", "--tp", "16"], None),
    (["--world-size", "8", "--tp", "4", "--pp", "4"], None),
    (W64 + ["--tp", "0"], None),
    (W64 + ["--pp", "0"], None),
    (W64 + ["--cp", "-1"], None),
    (W64 + ["--ep", "0"], None),
    (W64 + ["--ep", "3"], None),
    (W64 + ["--etp", "0"], None),
    (W64 + ["--dp-replicate", "0"], None),
    (W64 + ["--dp-shard", "0"], None),
    (W64 + ["--dp-shard", "-2"], None),
    (W64 + ["--dp-shard", "4"], None),
    (W64 + ["--dp-shard", "4", "--tp", "7"], None),
    (W64 + ["--tp", "4", "--ep", "2", "--etp", "2"], None),
    (W64 + ["--order", "tp-dp-pp"], None),
    (W64 + ["--order", ""], None),
    # Megatron's
    (W64 + ["--tp", "0", "--convention", "megatron"], None),
    (W64 + ["--tp", "7", "--convention", "megatron"], None),
    (["--world-size", "60", "--tp", "8", "--convention", "megatron"], None),
    (W64 + ["--etp", "3", "--convention", "megatron"], None),
    (W64 + ["--tp", "8", "--pp", "16", "--convention", "megatron"], None),
    (W64 + ["--dp-replicate", "2", "--convention", "megatron"], None),
    (W64 + ["--dp-shard", "4", "--convention", "megatron"], None),
    (W64 + ["--order", "tp-xp-pp", "--convention", "megatron"], None),
    (W64 + ["--order", "tp-dp", "--pp", "2", "--convention", "megatron"], None),
    (W64 + ["--order", "", "--convention", "megatron"], None),
    (
        [
            "--world-size",
            "16",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "4",
            "--order",
            "tp-pp-dp",
            "--convention",
            "megatron",
        ],
        None,
    ),
    (
        ["--world-size", "16", "--tp", "2", "--pp", "2", "--ep", "3", "--order", "tp-dp", "--convention", "megatron"],
        None,
    ),
    # the single mesh's
    (W64 + ["--tp", "0", "--convention", "single"], None),
    (W64 + ["--tp", "7", "--convention", "single"], None),
    (W64 + ["--cp", "2", "--convention", "single"], None),
    (W64 + ["--etp", "2", "--convention", "single"], None),
    (W64 + ["--order", "tp-dp-pp", "--convention", "single"], None),
    # nodes and --strict
    (W64 + ["--gpus-per-node", "0"], None),
    (W64 + ["--gpus-per-node", "6"], None),
    (W64, "6"),
    (W64, "abc"),
    (W64, "0"),
    (W64 + ["--strict", "pp"], None),
    (W64 + ["--strict", ""], None),
    (W64 + ["--strict", "ep,"], None),
    (W64 + ["--tp", "16", "--strict"], None),
    # --picture and --dim
    (W64 + ["--picture", "out.txt"], None),
    (W64 + ["--picture", ""], None),
    (W64 + ["--picture", "/nonexistent/dir/x.png"], None),
    (W64 + ["--picture", "x.png", "--dim", "zz"], None),
    (W64 + ["--dim", "tp"], None),
    # a job of --mesh meshes
    (["--world-size", "16", "--mesh", "students=8:16:dp=3,tp=4"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=-1,tp=3"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=3,tp=3"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=2,xyz=4"], None),
    (["--world-size", "16", "--mesh", "0:8:dp=2,tp=4"], None),
    (["--world-size", "16", "--mesh", "1st=0:8"], None),
    (["--world-size", "16", "--mesh", "s=0-8:dp=2"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=2,tp"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=2,dp=4"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=0,tp=4"], None),
    (["--world-size", "16", "--mesh", "s=0:8:0"], None),
    (["--world-size", "16", "--mesh", "s=8:0:dp=2"], None),
    (["--world-size", "16", "--mesh", "s=4:4:dp=2"], None),
    (["--world-size", "16", "--mesh", "s=8:24"], None),
    (["--world-size", "16", "--mesh", "s=-2:6"], None),
    (["--world-size", "16", "--mesh", "s=9:24:2"], None),
    (["--world-size", "16", "--mesh", "s=0:8:dp=-1,tp=-1"], None),
    (["--world-size", "16", "--mesh", "a=0:8:dp=2,tp=4", "--mesh", "b=4:12"], None),
    (["--world-size", "16", "--mesh", "a=4:12:tp=8", "--mesh", "b=0:8:dp=2,tp=4"], None),
    (["--world-size", "16", "--mesh", "a=0:16:2", "--mesh", "b=2:16:4"], None),
    (["--world-size", "16", "--mesh", "a=0:8", "--mesh", "a=8:16"], None),
    (["--world-size", "16", "--mesh", "a=0:8", "--tp", "2"], None),
    (["--world-size", "16", "--mesh", "a=0:8", "--convention", "megatron"], None),
    (["--world-size", "16", "--mesh", "a=0:8", "--strict"], None),
    (["--world-size", "16", "--mesh", "a=0:8", "--picture", "x.png", "--dim", "zz"], None),
]


@pytest.fixture
def where(monkeypatch, tmp_path):
    """Runs in an empty folder (a fix may draw a picture), with $LOCAL_WORLD_SIZE unset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    return monkeypatch


@pytest.mark.parametrize("argv, env", BAD, ids=[" ".join(a) + (f" LOCAL_WORLD_SIZE={e}" if e else "") for a, e in BAD])
def test_every_fix_the_cli_prints_is_a_command_that_gets_further(capsys, where, argv, env):
    if env is not None:
        where.setenv("LOCAL_WORLD_SIZE", env)
    code, _, err = run(capsys, argv)
    assert code == 2, err
    error = _error_line(err)
    commands = fixed_commands(argv, err)
    assert commands, f"the fix names no command to run: {_fix_line(err)!r}"
    for fixed in commands:
        code, _, again = run(capsys, fixed)
        assert code == 0 or _error_line(again) != error, (fixed, again)


@pytest.mark.parametrize("argv, env", BAD, ids=[" ".join(a) + (f" LOCAL_WORLD_SIZE={e}" if e else "") for a, e in BAD])
def test_following_the_first_fix_ends_in_a_plan(capsys, where, argv, env):
    if env is not None:
        where.setenv("LOCAL_WORLD_SIZE", env)
    seen = [argv]
    for _ in range(5):
        code, _, err = run(capsys, seen[-1])
        if code == 0:
            return
        seen.append(fixed_commands(seen[-1], err)[0])
    pytest.fail(f"no plan after 5 fixes: {seen}")


# -- issue 49's commands, word for word ------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, says, fix",
    [
        (
            ["--world-size", "131072", "--tp", "7"],
            "--tp 7 does not divide --world-size 131072",
            "use --tp 8 or --tp 4 (divisors of 131072)",
        ),
        (
            ["--world-size", "131072", "--dp-replicate", "3"],
            "--dp-replicate 3 does not divide --world-size 131072",
            "use --dp-replicate 2 or --dp-replicate 4 (divisors of 131072)",
        ),
        (
            ["--world-size", "131072", "--tp", "7", "--pp", "4"],
            "--tp 7 does not divide the 32768 ranks",
            "use --tp 8 or --tp 4 (divisors of 32768)",
        ),
        (
            ["--world-size", "64", "--tp", "7", "--convention", "megatron"],
            "(--tp 7 does not divide it)",
            "use --tp 8 or --tp 4 (divisors of 64)",
        ),
        (
            ["--world-size", "64", "--tp", "7", "--convention", "single"],
            "--tp 7 does not divide --world-size",
            "use --tp 8 or --tp 4 (divisors of 64)",
        ),
        (
            ["--world-size", "16", "--mesh", "students=0:8:dp=3,tp=4"],
            "dp*tp = 3*4 = 12 is not its 8 ranks",
            "give it 12 ranks: --mesh students=0:12:dp=3,tp=4",
        ),
        (
            ["--world-size", "16", "--mesh", "students=0:8:dp=2,sp=4"],
            "the accepted names are pp, dp,",
            "did you mean cp? e.g. --mesh students=0:8:dp=2,cp=4",
        ),
    ],
)
def test_the_error_names_the_argument_at_fault_and_the_fix_values_that_work(capsys, where, argv, says, fix):
    code, _, err = run(capsys, argv)
    assert code == 2 and says in _error_line(err) and _fix_line(err).startswith(fix), err
    assert "--dp-shard -1" not in err and "instead of" not in err, err


def test_the_world_size_limits_fix_names_the_limit(capsys, where):
    """Not run: a plan of 2^24 ranks takes a while (the list above runs every other fix)."""
    from rankmesh.cli import PLAN_LIMIT

    for world in (PLAN_LIMIT * 2, 2**31):
        code, _, err = run(capsys, ["--world-size", str(world)])
        assert code == 2 and edits(_fix_line(err)) == [("--world-size", str(PLAN_LIMIT))], err


def test_a_dim_name_close_to_none_lists_the_names(capsys, where):
    code, _, err = run(capsys, ["--world-size", "16", "--mesh", "s=0:8:dp=2,qqq=4"])
    assert code == 2 and "name each dim one of pp, dp, dp_replicate, dp_shard, fsdp, cp, tp, ep, etp" in err, err


# -- did you mean ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, meant",
    [
        (["--ppp", "4"], "did you mean --pp?"),
        (["--tensor-parallel", "8"], "did you mean --tp?"),
        (["--pipeline-model-parallel-size", "2"], "did you mean --pp?"),
        (["--gpu-per-node", "8"], "did you mean --gpus-per-node?"),
        (["--convension", "megatron"], "did you mean --convention?"),
        (["--ppp=4"], "did you mean --pp?"),
        (["--ppp", "4", "--tensor-parallel", "8"], "did you mean --pp (not --ppp), --tp (not --tensor-parallel)?"),
        (["--xyz", "3"], "drop --xyz 3;"),
    ],
)
def test_a_flag_typed_wrong_gets_the_plan_flag_it_resembles(capsys, argv, meant):
    code, _, err = run(capsys, ["--world-size", "64", *argv])
    assert code == 2
    assert err.startswith("usage: rankmesh plan"), err  # plan's usage, not the top level's
    assert _error_line(err) == f"rankmesh plan: error: unrecognized arguments: {' '.join(argv)}", err
    assert _fix_line(err).startswith(meant) and _fix_line(err).endswith("`rankmesh plan --help` lists its flags"), err


def test_a_command_typed_wrong_gets_the_command_it_resembles(capsys):
    assert main(["plna", "--world-size", "64"]) == 2
    assert "fix: did you mean `rankmesh plan`?" in capsys.readouterr().err
    assert main(["status", "--verbose"]) == 2
    assert "fix: drop --verbose; `rankmesh status --help` lists its flags" in capsys.readouterr().err


def test_the_top_level_help_still_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"    {command}" in out for command in ("plan", "status", "run", "bench")), out


# -- rankmesh bench: its help, and what a run is about to do -------------------------------------


def test_the_bench_help_says_what_is_true(capsys):
    from rankmesh.bench import meshes
    from rankmesh.bench.points import RECIPES

    with pytest.raises(SystemExit):
        meshes.main(["--help"])
    text = capsys.readouterr().out
    assert not re.search(r"\b(one|two|three|four|five|six|seven|eight|nine|ten)\s+recipes\b", text, re.I), text
    assert not re.search(r"\bissue\s+[0-9]+", text), "user-facing help names an issue"
    assert all(recipe in text for recipe in RECIPES)
    assert f"default: all {len(RECIPES)} installed" in text and meshes.QUICK_RUN in text


def test_the_bench_model_help_names_no_issue(capsys):
    from rankmesh.bench import model

    with pytest.raises(SystemExit):
        model.main(["--help"])
    assert not re.search(r"\bissue\s+[0-9]+", capsys.readouterr().out)


class _Started(Exception):
    pass


def _heads_up(monkeypatch, capsys, argv: list[str]) -> str:
    """What ``rankmesh bench ARGV`` prints before its first measurement (none is taken)."""
    from rankmesh.bench import meshes

    def start(*a, **k):
        raise _Started

    monkeypatch.setattr(meshes, "_measure_points", start)
    with pytest.raises(_Started):
        main(["bench", *argv])
    return capsys.readouterr().err


def test_a_bare_bench_says_what_it_will_run_and_how_to_run_a_quick_one(monkeypatch, capsys):
    err = _heads_up(monkeypatch, capsys, [])
    assert "rankmesh bench: about to run " in err and " worker processes, roughly " in err, err
    assert "worlds 2^10, 2^12, 2^14, 2^16, 2^17, 2^18, 2^20" in err and "parallel_dims" in err, err
    assert "stock torch takes about a minute per build at 2^20 ranks" in err, err
    assert "for a quick run: rankmesh bench --worlds 10,12 --recipe parallel_dims" in err, err


def test_a_quick_bench_gets_no_warning(monkeypatch, capsys):
    err = _heads_up(monkeypatch, capsys, ["--worlds", "10,12", "--recipe", "parallel_dims"])
    assert "about to run 8 points in 38 worker processes, roughly 2 min" in err, err
    assert "a minute per build" not in err, err


# -- --picture's bar of meshes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "specs, hatched", [(["a=0:2048", "b=2048:4096"], False), (["a=0:2048", "b=2049:4096:2"], True)]
)
def test_the_bar_title_mentions_hatching_only_where_it_is_drawn(specs, hatched):
    from rankmesh._picture import _draw_job_bar, pyplot
    from rankmesh.job_plan import build_job_plan

    plt = pyplot()
    fig = _draw_job_bar(plt, build_job_plan(4096, specs), 0)
    try:
        title = fig.axes[0].get_title()
        patches = [p for p in fig.axes[0].patches if p.get_hatch()]
        assert ("hatched" in title) == hatched == bool(patches), (title, patches)
    finally:
        plt.close(fig)
