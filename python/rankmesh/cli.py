"""``rankmesh``: plan a parallel layout before launching, or benchmark against stock torch.

Usage::

    rankmesh plan --world-size 131072 --tp 8 --pp 4 --cp 2 --ep 8 --dp-replicate 2
    rankmesh plan --world-size 4096 --tp 8 --pp 4 --cp 2 --ep 8 --convention megatron --rank 1234
    rankmesh plan --world-size 64 --tp 4 --pp 2 --convention single --picture mesh.png --dim tp
    rankmesh plan --world-size 16 --mesh students=0:8:dp=2,tp=4 --mesh teachers=8:16:dp=4,tp=2 --rank 13
    rankmesh bench --worlds 10,17

``plan`` prints the resolved degrees, every mesh and dim with its size, the groups of one rank
(``--rank``), the number of process groups a rank creates (one per distinct rank partition,
computed from the layouts' modes, no torch needed), and where the groups sit on the nodes;
``--picture`` draws it (needs ``pip install 'rankmesh[plot]'``). Instead of a convention's
degrees, ``--mesh`` (repeated) plans a job of disjoint meshes, each over part of the world, as
``init_device_mesh(..., ranks=range(START, STOP))`` builds them. Bad input exits with status 2,
the error the API gives for the same value (naming the flags typed where it names their
arguments: ``--tp 0``, not ``tp = 0``) and a one-line fix: flags and values to type, each of
which gets the command further (a flag typed wrong: ``did you mean --pp?``). ``bench`` runs
:func:`rankmesh.bench.main`. Also available as ``python -m rankmesh``.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np

from rankmesh._check import as_rank, divisors_near, positive_int
from rankmesh._dependencies import install_hint
from rankmesh._native import MAX_WORLD_SIZE
from rankmesh.errors import RankmeshError, TopologyError
from rankmesh.job_plan import DEGREE_NAMES, MESH_SYNTAX, build_job_plan, format_job_plan, job_topology
from rankmesh.megatron.order import DEFAULT_ORDER, working_order
from rankmesh.plan import CONVENTIONS, build_plan, format_plan, plan_topology
from rankmesh.topology import gpus_per_node_from_env

__all__ = ["main", "PLAN_LIMIT"]

#: The largest world ``plan`` takes: it materialises the caller's groups (a dp group can hold
#: most of the world) to print and place them.
PLAN_LIMIT = 1 << 24
#: Ranks per node when neither --gpus-per-node nor $LOCAL_WORLD_SIZE says.
DEFAULT_GPUS_PER_NODE = 8
PICTURE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
_WRITABLE = "pass a path you can write, e.g. --picture ./{name}"


class BadInput(Exception):
    """Invalid command-line input: a one-line message and a one-line fix (exit status 2). Made from
    an API error (``BadInput(e, fix)``), its message is the error's, printed with the flags the user
    typed for the arguments it names (:meth:`line`, :func:`_flag_message`)."""

    def __init__(self, message: str | RankmeshError, fix: str) -> None:
        super().__init__(str(message))
        self.error = message if isinstance(message, RankmeshError) else None
        self.message = " ".join(str(message).splitlines())
        self.fix = fix

    def line(self, typed: Mapping[str, Sequence[str]]) -> str:
        """The message on one line; an API error's with the flags in ``typed`` (:func:`_typed`)."""
        if self.error is None:
            return self.message
        return " ".join(_flag_message(self.error, typed).splitlines())


# -----------------------------------------------------------------------------------------------
# errors of the API -> the flag at fault and its fix
# -----------------------------------------------------------------------------------------------

#: The flag of each argument the API's errors name (Megatron's keyword names included): all the
#: CLI knows about an error. Its message and its fix (``RankmeshError.fix``, rendered with these
#: flags) come from the API.
_FLAG = {
    "world_size": "--world-size",
    "tp": "--tp",
    "tensor_model_parallel_size": "--tp",
    "pp": "--pp",
    "pipeline_model_parallel_size": "--pp",
    "cp": "--cp",
    "context_parallel_size": "--cp",
    "ep": "--ep",
    "expert_model_parallel_size": "--ep",
    "etp": "--etp",
    "expert_tensor_parallel_size": "--etp",
    "dp_replicate": "--dp-replicate",
    "dp_shard": "--dp-shard",
    "order": "--order",
    "dim": "--dim",
    "convention": "--convention",
    "mesh": "--mesh",
    "rank": "--rank",
    "gpus_per_node": "--gpus-per-node",
    "strict_dims": "--strict",
}

#: ``rankmesh plan --help``: how to write a job of disjoint meshes.
_MESH_EPILOG = f"""\
a job of disjoint meshes (--mesh, repeated; instead of --tp/--pp/... and --convention):
  --mesh {MESH_SYNTAX}
  ranks range(START, STOP, STEP) (STOP excluded); dims slowest first, named
  {", ".join(DEGREE_NAMES)}; one size may be -1 (the rest); no dims: a 1-D mesh "world".
  Knowledge distillation, students on ranks 0-7 as (dp, tp), teachers on ranks 8-15:
    rankmesh plan --world-size 16 --mesh students=0:8:dp=2,tp=4 --mesh teachers=8:16:dp=-1,tp=2 \\
        --rank 13 --picture kd.png
"""


def _typed(a: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    """The flags on the command line, each with its value(s) as the API's messages print them
    (``0``, ``'tp-dp'``); ``--rank`` always (0 when not given, a rank no message refuses)."""
    out: dict[str, tuple[str, ...]] = {}
    for dest, value in vars(a).items():
        if value is None or dest == "command":
            continue
        values = value if isinstance(value, list) else [value]
        out["--" + dest.replace("_", "-")] = tuple(repr(v) if isinstance(v, str) else str(v) for v in values)
    return out


def _flag_message(e: RankmeshError, typed: Mapping[str, Sequence[str]]) -> str:
    """The API error's message as ``rankmesh plan`` prints it: the message is a template over the
    arguments it names (:func:`rankmesh.errors.arg`), rendered with the flag of each argument the
    user typed (``tp = 0`` reads ``--tp 0``, ``tensor_model_parallel_size must`` ``--tp must``)
    where the mention shows no value or the value typed. Unchanged: what the template does not mark
    as an argument (the factors of a formula, a dim named like a flag), a value the user did not
    type (the default ``dp_shard = -1``), an argument with no flag, and the error itself.

        >>> from rankmesh.errors import RankOutOfRangeError, arg
        >>> e = RankOutOfRangeError(f"{arg('rank', 'rank = 99', 99)} is out of range", field="rank", value=99)
        >>> _flag_message(e, {"--rank": ("99",)}), _flag_message(e, {}), str(e)
        ('--rank 99 is out of range', 'rank = 99 is out of range', 'rank = 99 is out of range')
    """

    def flag_of(name: str, value: str | None) -> str | None:
        flag = _FLAG.get(name)
        if flag is None or flag not in typed or (value is not None and value not in typed[flag]):
            return None
        return flag

    return e.render(flag_of)


def _plan_fix(
    e: RankmeshError, convention: str, degrees: Mapping[str, Any] | None = None, *, order_typed: bool = True
) -> str:
    """The one-line fix for an error of :func:`build_plan` (or of the plan's dim lookup): the
    error's own fix with flags for argument names. For Megatron's ``--order``, the order that works
    (:func:`~rankmesh.megatron.order.working_order`): the one the error carries (``e.ctx["works"]``),
    else, for an order it could not read, the default order if it works with the plan's
    ``degrees`` (``world_size`` and :func:`build_plan`'s Megatron degrees); never one not checked.
    Where none works, the degrees are at fault: dropping a typed ``--order`` shows which."""
    fix = e.fix_text(_FLAG.get) or "see `rankmesh plan --help`"
    if e.field == "order" and convention == "megatron" and degrees is not None:
        works = e.ctx["works"] if "works" in e.ctx else working_order([DEFAULT_ORDER], **degrees)
        if works is not None:
            return f"{fix}, e.g. --order {works}"
        if order_typed:
            return f"{fix}; no order works with these degrees alone: drop --order, and the error names what to change"
        return f"{fix}; no order works with these degrees alone, so change them too"
    return fix


# -----------------------------------------------------------------------------------------------
# argument parsing
# -----------------------------------------------------------------------------------------------


#: A value each flag of ``rankmesh plan`` takes, for a fix that shows one (one that works on most
#: worlds: a degree of 2 divides every even world).
_EXAMPLE = {
    "--world-size": "64",
    "--tp": "2",
    "--pp": "2",
    "--cp": "2",
    "--ep": "2",
    "--etp": "1",
    "--dp-replicate": "2",
    "--dp-shard": "-1",
    "--convention": "torchtitan",
    "--mesh": "students=0:8:dp=2,tp=4",
    "--order": DEFAULT_ORDER,
    "--rank": "0",
    "--gpus-per-node": "8",
    "--strict": "ep,cp",
    "--picture": "mesh.png",
    "--dim": "tp",
}


class _Parser(argparse.ArgumentParser):
    """argparse that adds a one-line fix to its errors (exit status 2), one naming the flag at fault
    and a value it takes (a flag typed wrong: the flag meant, by difflib); its subparsers are too.
    ``commands`` holds the subparsers by name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, _Parser] = {}

    def error(self, message: str, fix: str | None = None) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.stderr.write(f"fix: {self._fix(message) if fix is None else fix}\n")
        raise SystemExit(2)

    def unrecognized(self, extra: Sequence[str]) -> NoReturn:
        """Exit 2 for arguments this (sub)parser does not take: ``rankmesh plan --ppp 4`` says
        ``did you mean --pp?``, by difflib over its own flags and the API's names for them
        (``--tensor-model-parallel-size`` is ``--tp``), and which ``--help`` lists them."""
        self.error(f"unrecognized arguments: {' '.join(extra)}", self._unknown_fix(list(extra)))

    def _action(self, name: str) -> argparse.Action | None:
        """The argument argparse's message names (``--tp``, ``{plan,status,run,bench}``)."""
        for action in self._actions:
            if name in action.option_strings or name in (action.metavar, action.dest, "/".join(action.option_strings)):
                return action
        return None

    def _fix(self, message: str) -> str:
        """The one-line fix for argparse's ``message`` (its own wording, read here: argparse's
        errors carry no data)."""
        if message.startswith("the following arguments are required: "):
            flags = message.partition(": ")[2].split(", ")
            return "add " + " ".join(f"{f} {_EXAMPLE.get(f, 'VALUE')}" for f in flags)
        if message.startswith("ambiguous option: "):
            flags = message.partition(" could match ")[2].split(", ")
            return f"write the flag in full: {' or '.join(flags)}"
        if not message.startswith("argument "):
            return f"see `{self.prog} --help`"
        name, _, why = message.removeprefix("argument ").partition(": ")
        action = self._action(name)
        flag = action.option_strings[-1] if action is not None and action.option_strings else name
        example = _EXAMPLE.get(flag, "VALUE")
        if why.startswith("invalid choice: ") and action is not None and action.choices:
            typed = why.removeprefix("invalid choice: ").partition(" (choose from")[0].strip("'")
            choices = [str(c) for c in action.choices]
            close = difflib.get_close_matches(typed, choices, n=1)
            listed = f"{', '.join(choices[:-1])} or {choices[-1]}"
            if not action.option_strings:  # a command
                commands = ", ".join(choices)
                said = f"did you mean `{self.prog} {close[0]}`? " if close else f"the commands are {commands}; "
                return f"{said}`{self.prog} --help` says what each does"
            if close:
                return f"did you mean {flag} {close[0]}? ({flag} takes {listed})"
            return f"{flag} takes {listed}, e.g. {flag} {choices[0]}"
        if "invalid int value" in why:
            return f"{flag} takes an integer, e.g. {flag} {example}"
        if why.startswith("expected one argument"):
            return f"give {flag} a value, e.g. {flag} {example}"
        return f"see `{self.prog} --help`"

    def _unknown_fix(self, extra: list[str]) -> str:
        """``did you mean --pp?`` for each unknown flag close to one of this parser's (or to the
        API's name for one), ``drop ...`` for the rest; and which ``--help`` lists the flags."""
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        api_names = {"--" + k.replace("_", "-"): f for k, f in _FLAG.items() if f in options}
        meant: list[tuple[str, str]] = []
        dropped: list[str] = []
        for i, token in enumerate(extra):
            flag = token.partition("=")[0]
            if token.startswith("--"):
                close = difflib.get_close_matches(flag, options + list(api_names), n=1)
                if close:
                    meant.append((flag, api_names.get(close[0], close[0])))
                    continue
            elif i and extra[i - 1].startswith("--") and "=" not in extra[i - 1]:  # an unknown flag's value
                if extra[i - 1] in (old for old, _ in meant):
                    continue
            dropped.append(token)
        parts = []
        if len(meant) == 1:
            parts.append(f"did you mean {meant[0][1]}?")
        elif meant:
            parts.append("did you mean " + ", ".join(f"{new} (not {old})" for old, new in meant) + "?")
        if dropped:
            parts.append(f"drop {' '.join(dropped)};")
        return " ".join(parts + [f"`{self.prog} --help` lists its flags"])


def _version() -> str:
    """``rankmesh <version>`` (the extension's, from Cargo.toml) and where the package lives."""
    import rankmesh

    return f"rankmesh {rankmesh.__version__} ({os.path.dirname(rankmesh.__file__)})"


def _parser() -> _Parser:
    p = _Parser(prog="rankmesh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub_parsers = p.commands
    p.add_argument("--version", action="version", version=_version(), help="print rankmesh's version and exit")
    sub = p.add_subparsers(dest="command", metavar="{plan,status,run,bench}")
    sub.required = True
    q = sub_parsers["plan"] = sub.add_parser(  # type: ignore[assignment]
        "plan",
        help="print the layouts, groups, process-group count and topology of a configuration",
        description="Print the resolved degrees, every mesh and dim, one rank's groups, the process "
        "groups a rank creates and where the groups sit on the nodes; optionally draw it.",
        epilog=_MESH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("--world-size", type=int, required=True, help="number of ranks (e.g. 131072)")
    q.add_argument("--tp", type=int, default=None, help="tensor parallel degree (default 1)")
    q.add_argument("--pp", type=int, default=None, help="pipeline parallel degree (default 1)")
    q.add_argument("--cp", type=int, default=None, help="context parallel degree (default 1)")
    q.add_argument("--ep", type=int, default=None, help="expert parallel degree (default 1)")
    q.add_argument("--dp-replicate", type=int, default=None, help="replicated data parallel degree (default 1)")
    q.add_argument("--dp-shard", type=int, default=None, help="sharded data parallel degree; -1 (default): the rest")
    q.add_argument("--etp", type=int, default=None, help="expert tensor parallel degree (default 1; megatron: tp)")
    q.add_argument("--convention", choices=CONVENTIONS, default=None, help="convention (default torchtitan)")
    q.add_argument(
        "--mesh",
        action="append",
        default=None,
        metavar="NAME=START:STOP[:DIMS]",
        help="one mesh of a job of disjoint meshes, e.g. teachers=8:16:dp=4,tp=2 (repeat it; see below)",
    )
    q.add_argument("--order", default=None, help="megatron order, leftmost fastest (default tp-cp-ep-dp-pp)")
    q.add_argument("--rank", type=int, default=0, help="the rank whose groups to show (default 0)")
    q.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help=f"ranks per node (default: $LOCAL_WORLD_SIZE, else {DEFAULT_GPUS_PER_NODE})",
    )
    q.add_argument(
        "--strict",
        nargs="?",
        const="tp",
        default=None,
        metavar="ep,cp",
        help="fail (status 2) when tp, or the listed bandwidth-hungry dims (ep, cp), span nodes",
    )
    q.add_argument(
        "--picture",
        default=None,
        metavar="OUT.png",
        help=f"draw the layout (needs matplotlib: {install_hint('matplotlib')})",
    )
    q.add_argument(
        "--dim",
        default=None,
        help="dim to colour in the picture: tp or mesh.dim (default tp; with --mesh, the shades in each mesh)",
    )
    sub_parsers["status"] = sub.add_parser(  # type: ignore[assignment]
        "status",
        help="say which patches the switch (RANKMESH_ACCELERATE=1) installs in this environment, and why not",
        description="For this environment, without starting a job: whether RANKMESH_ACCELERATE turns the switch "
        "on, and for each patch and fast path whether it is on, ready (its framework's release and bodies are "
        "recognised) or off, and why.",
    )
    # listed for --help only: main() hands `bench ...` and `run ...` on before parsing
    sub.add_parser("bench", help="benchmark against stock torch (rankmesh.bench); arguments pass through")
    sub.add_parser(
        "run",
        help="run a command (e.g. torchrun ...) with RANKMESH_ACCELERATE=1: every Python process it starts gets "
        "every rankmesh patch (torch's DeviceMesh, torchtitan, Megatron), with no change to the script",
    )
    return p


# -----------------------------------------------------------------------------------------------
# plan
# -----------------------------------------------------------------------------------------------


def _world_and_rank(a: argparse.Namespace) -> tuple[int, int]:
    try:
        world = positive_int(a.world_size, "world_size")
    except RankmeshError as e:
        raise BadInput(e, "pass the number of ranks, e.g. --world-size 131072") from e
    if world > PLAN_LIMIT:
        why = "ranks are int32 in torch" if world > MAX_WORLD_SIZE else "plan prints whole groups"
        raise BadInput(
            f"--world-size {world} is larger than rankmesh plan's limit of {PLAN_LIMIT} ranks ({why})",
            f"use --world-size {PLAN_LIMIT} or less",
        )
    try:
        rank = as_rank(a.rank, world, "rank")
    except RankmeshError as e:
        example = 0 if a.rank < 0 else world - 1
        raise BadInput(e, f"pass a rank of the world (0 to {world - 1}), e.g. --rank {example}") from e
    return world, rank


def _gpus_per_node(a: argparse.Namespace, world: int) -> tuple[int, str, str | None]:
    """(ranks per node, where it came from, a note when the default was adjusted)."""
    if a.gpus_per_node is not None:
        try:
            return positive_int(a.gpus_per_node, "gpus_per_node"), "flag", None
        except RankmeshError as e:
            gpn = math.gcd(DEFAULT_GPUS_PER_NODE, world)  # one that divides the world
            raise BadInput(e, f"pass the ranks per node, e.g. --gpus-per-node {gpn}") from e
    try:
        env = gpus_per_node_from_env()  # topology's reading: unset -> None, invalid -> TopologyError
    except TopologyError as e:
        gpn = math.gcd(DEFAULT_GPUS_PER_NODE, world)
        fix = f"set LOCAL_WORLD_SIZE to the GPUs per node, or unset it, or pass --gpus-per-node {gpn}"
        raise BadInput(e, fix) from e
    if env is not None:
        return env, "env", None
    gpn = DEFAULT_GPUS_PER_NODE
    if world % gpn == 0:
        return gpn, "default", None
    adjusted = int(np.gcd(gpn, world))  # a default must not fail
    note = f"{gpn} GPUs per node (the default) does not divide the world; assuming {adjusted} (pass --gpus-per-node)"
    return adjusted, "default", note


def _strict_families(a: argparse.Namespace) -> tuple[str, ...] | None:
    """--strict's families as topology_report takes them (validated there); None without it."""
    if a.strict is None:
        return None
    return tuple(s.strip() for s in a.strict.split(","))


def _check_picture(a: argparse.Namespace) -> None:
    """Refuse a --picture that cannot be drawn or written before any work is done."""
    if a.picture is None:
        if a.dim is not None:
            raise BadInput("--dim only chooses what --picture colours", "add --picture mesh.png, or drop --dim")
        return
    path = Path(a.picture)
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise BadInput(
            f"--picture {a.picture!r} has no image extension",
            "name the file with .png, .svg or .pdf, e.g. --picture mesh.png",
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise BadInput(
            f"--picture: the folder {str(parent)!r} does not exist",
            f"create it first, or write here: --picture {path.name}",
        )
    if path.is_dir():
        raise BadInput(
            f"cannot write --picture {a.picture!r}: it is a folder", f"name a file, e.g. --picture {path / 'mesh.png'}"
        )
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise BadInput(f"cannot write --picture {a.picture!r}: permission denied", _WRITABLE.format(name=path.name))
    from rankmesh import _picture

    try:
        _picture.pyplot()
    except ImportError as e:
        why = e.__cause__ or e
        raise BadInput(f"--picture needs matplotlib, which is not installed ({why})", install_hint("matplotlib")) from e


#: The flags of a convention's plan, which a job of --mesh meshes does not take.
_CONVENTION_FLAGS = ("tp", "pp", "cp", "ep", "etp", "dp_replicate", "dp_shard", "convention", "order", "strict")


def _degrees(a: argparse.Namespace, **override: object) -> dict[str, object]:
    """The convention flags given, as :func:`build_plan` takes them (absent: its defaults)."""
    given = {k: getattr(a, k) for k in ("tp", "pp", "cp", "ep", "etp", "dp_replicate", "dp_shard", "order")}
    return {k: v for k, v in (given | override).items() if v is not None}


def _node_size_fix(gpn: int, gpn_source: str, world: int) -> str:
    """The fix for a node size that topology's own checks refuse: node sizes that divide the world
    (the nearest, :func:`~rankmesh._check.divisors_near`)."""
    sizes = " or ".join(f"--gpus-per-node {n}" for n in divisors_near(world, gpn))
    if gpn_source == "env":
        return f"LOCAL_WORLD_SIZE={gpn} does not fit: set it to the real GPUs per node, or pass {sizes}"
    return f"pass the real GPUs per node ({sizes} divide the world), or make --world-size a multiple of {gpn}"


def _job(a: argparse.Namespace, out: TextIO) -> int:
    """``rankmesh plan --mesh ... [--mesh ...]``: a job of disjoint meshes."""
    world, rank = _world_and_rank(a)
    for name in _CONVENTION_FLAGS:
        if getattr(a, name) is None:
            continue
        flag = _FLAG.get(name, "--" + name)
        if name in ("convention", "order", "strict"):
            fix = f"drop {flag}: each --mesh is a plain DeviceMesh (init_device_mesh with ranks=); "
            fix += "the topology lines say which groups cross nodes" if name == "strict" else "no convention applies"
        else:
            fix = f"drop {flag}: each --mesh gives its own sizes, e.g. students=0:{max(1, world // 2)}:dp=-1,tp=2"
        raise BadInput(f"{flag} does not apply with --mesh: each mesh gives its own dims", fix)
    gpn, gpn_source, gpn_note = _gpus_per_node(a, world)
    _check_picture(a)
    try:
        job = build_job_plan(world, a.mesh)
        if a.dim is not None:
            job.find_dim(a.dim)  # before printing
    except RankmeshError as e:
        raise BadInput(e, e.fix_text(_FLAG.get) or "see `rankmesh plan --help`") from e
    if gpn_note:
        job.notes.append(gpn_note)
    try:
        report = job_topology(job, rank, gpn)
    except RankmeshError as e:
        raise BadInput(e, _node_size_fix(gpn, gpn_source, world)) from e
    out.write(format_job_plan(job, rank, report))
    if a.picture is not None:
        from rankmesh._picture import draw_job_picture

        _write_picture(a, out, lambda: draw_job_picture(job, rank, gpn, a.dim, a.picture))
    return 0


def _write_picture(a: argparse.Namespace, out: TextIO, draw: Callable[[], str]) -> None:
    try:
        what = draw()
    except OSError as e:
        why, fix = e.strerror or str(e), _WRITABLE.format(name=Path(a.picture).name)
        raise BadInput(f"cannot write --picture {a.picture!r}: {why}", fix) from e
    out.write(f"\npicture: {a.picture} ({what})\n")


def _plan(a: argparse.Namespace, out: TextIO) -> int:
    if a.mesh is not None:
        return _job(a, out)
    world, rank = _world_and_rank(a)
    gpn, gpn_source, gpn_note = _gpus_per_node(a, world)
    strict = _strict_families(a)
    _check_picture(a)
    convention = a.convention or "torchtitan"
    try:
        plan = build_plan(convention, world, **_degrees(a))
        if a.dim is not None:
            plan.find_dim(a.dim)  # before printing
    except RankmeshError as e:
        megatron = {k: v for k, v in _degrees(a).items() if k in ("tp", "pp", "cp", "ep", "etp")}
        fix = _plan_fix(e, convention, {"world_size": world, **megatron}, order_typed=a.order is not None)
        raise BadInput(e, fix) from e
    if gpn_note:
        plan.notes.append(gpn_note)

    try:  # topology's own checks of the node size
        report = plan_topology(plan, rank, gpn)
    except RankmeshError as e:
        raise BadInput(e, _node_size_fix(gpn, gpn_source, world)) from e
    violation: TopologyError | None = None
    if strict is not None:
        try:  # topology's strict mode: unknown families at once, a violation after the plan is shown
            plan_topology(plan, rank, gpn, strict_dims=strict)
        except RankmeshError as e:
            if e.field.startswith("strict_dims"):  # an unknown family, or text that is no name
                raise BadInput(e, "name the families to keep inside a node, e.g. --strict ep,cp") from e
            if not isinstance(e, TopologyError):
                raise
            violation = e

    out.write(format_plan(plan, rank, report))
    if violation is not None:
        raise BadInput(
            violation,
            f"keep {violation.field} inside a node (the fastest dim, with a size dividing the {gpn} GPUs per node), "
            "or drop --strict",
        )
    if strict is not None:
        hungry = ("tp",) + tuple(f for f in strict if f != "tp")
        out.write(f"  strict: every bandwidth-hungry dim ({', '.join(hungry)}) stays inside a node\n")
    if a.picture is not None:
        from rankmesh._picture import draw_picture

        _write_picture(a, out, lambda: draw_picture(plan, rank, gpn, a.dim, a.picture))
    return 0


def _run(command: list[str]) -> int:
    """``rankmesh run [--] CMD ...``: CMD with ``RANKMESH_ACCELERATE=1`` in its environment (and so
    in every process it starts: torchrun's ranks, multiprocessing's workers), in place of this
    process. Exit 2 without a command, 127 when it is not found, as a shell does."""
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or command[0] in ("-h", "--help"):
        sys.stderr.write(
            "usage: rankmesh run [--] COMMAND [ARG ...]\n"
            "runs COMMAND with RANKMESH_ACCELERATE=1, e.g. rankmesh run torchrun --nproc-per-node 8 train.py\n"
        )
        return 0 if command else 2
    os.environ["RANKMESH_ACCELERATE"] = "1"
    try:
        os.execvp(command[0], command)
    except OSError as e:
        sys.stderr.write(f"rankmesh run: {command[0]}: {e.strerror}\n")
        return 127
    return 0  # pragma: no cover - execvp does not return


def _status(out: TextIO) -> int:
    """``rankmesh status``: the switch's value, then one row per patch and fast path
    (:func:`rankmesh.switch.status`)."""
    import warnings

    from rankmesh import switch

    raw = os.environ.get("RANKMESH_ACCELERATE")
    try:
        from _rankmesh_autostart import parse
    except ImportError:  # a source tree: the start-up module is not installed, so the variable does nothing
        out.write("RANKMESH_ACCELERATE does nothing here: rankmesh's start-up module is not installed (no wheel)\n")
    else:
        verdict = parse(raw)
        if raw is None:
            out.write("RANKMESH_ACCELERATE is not set: the switch is off (rankmesh.accelerate() turns it on)\n")
        else:
            word = {True: "on", False: "off", None: "off (neither on nor off: 1/true/yes/on or 0/false/no/off)"}
            out.write(f"RANKMESH_ACCELERATE={raw!r}: the switch is {word[verdict]}\n")
    with warnings.catch_warnings():  # the frameworks' import-time chatter; the reasons are in the rows
        warnings.simplefilter("ignore")
        rows = switch.status()
    width = max(len(r[0]) for r in rows)
    for name, target, state, why in rows:
        out.write(f"{name:<{width}}  {state:<5}  {target}\n{'':<{width}}         {why}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rankmesh`` command; returns the exit status (0 ok, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "model"]:  # time to a parallelised model
        from rankmesh.bench import model

        return int(model.main(argv[2:]) or 0)
    if argv and argv[0] == "bench":  # the meshes alone
        from rankmesh import bench

        return int(bench.main(argv[1:]) or 0)
    if argv and argv[0] == "run":
        return _run(argv[1:])
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # the command's own parser says which of its flags was meant
            parser.commands.get(args.command, parser).unrecognized(extra)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        return int(e.code or 0)
    if args.command == "status":
        return _status(sys.stdout)
    try:
        return _plan(args, sys.stdout)
    except BadInput as e:
        sys.stdout.flush()
        sys.stderr.write(f"rankmesh plan: error: {e.line(_typed(args))}\nfix: {e.fix}\n")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
