"""The one home of rankmesh's argument checks: integers (degrees, sizes, ranks, counts, dims),
fingerprints, timeouts, flags and layouts.

One rule everywhere (the Python layer and, for the same values, the Rust core):

* an integer is anything with ``__index__`` (``int``, numpy integers, ``torch`` ints), as in
  torch's own size and rank arguments;
* ``bool`` is **not** an integer here, although Python makes it one: ``tp=True`` is a bug, not a
  degree of 1;
* floats are refused, even integral ones (``2.0``), and strings too: nothing is truncated or
  parsed silently. Environment variables and command-line text are parsed where they are read,
  with their own error (``LOCAL_WORLD_SIZE``: :func:`rankmesh.topology.gpus_per_node_from_env`).

A value of the wrong type raises :class:`~rankmesh.errors.ArgumentTypeError` (a ``TypeError``,
which torch raises for a float size, and a ``ValueError`` like every rankmesh error); a value out
of range raises the class of its fault. This holds for the mesh layer too: a float or bool in
``init_device_mesh``'s ``mesh_shape`` or ``_unflatten``'s ``mesh_sizes`` is an
``ArgumentTypeError``, not a :class:`~rankmesh.errors.MeshArgumentError` (a ``RuntimeError``,
kept for what torch itself rejects with one: a device type with an index, a ``backend_override``
key that names no dim). torch's own ``init_device_mesh`` raises ``ValueError`` for such sizes
(its layout check) and ``Tensor.view`` a ``TypeError``: an ``ArgumentTypeError`` is both.

Other rules kept here:

* a fingerprint (:func:`as_u64`) is an integer in ``0 .. 2**64 - 1``; outside it,
  :class:`~rankmesh.errors.LayoutOverflowError`;
* a timeout (:func:`as_timeout`) is seconds (an ``int`` or ``float``, never a ``bool`` or a
  string) or a ``datetime.timedelta``, finite, at least 1 ms (c10d counts whole milliseconds and
  reads 0 as "no timeout") and at most ``timedelta.max``; out of range,
  :class:`~rankmesh.errors.InvalidTimeoutError`;
* a flag (:func:`as_bool`) is a ``bool`` (or numpy's), never a truthy object;
* a name, description or tag (:func:`check_str`) is a ``str`` of valid UTF-8 text: a ``str``
  holding a lone surrogate (``"\\ud800"``, what ``errors="surrogateescape"`` decoding makes of
  bytes that are not UTF-8) is an :class:`~rankmesh.errors.ArgumentTypeError` too, here and in the
  Rust core, never a ``UnicodeEncodeError`` from deep inside;
* a layout argument (:func:`as_layout`) is a :class:`~rankmesh.MeshLayout`;
* degrees (:func:`check_degrees`) multiply to a world of at most
  :data:`~rankmesh.MAX_WORLD_SIZE` ranks (ranks are int32), checked as a running product in
  argument order so that the :class:`~rankmesh.errors.LayoutOverflowError` names the degree that
  overflows it, as ``MeshLayout.unflatten`` names the size (``RankGenerator(tp=2**64, ...)`` blames
  ``tp``), and before the degrees are compared with the world.

    >>> from rankmesh._check import as_int, as_timeout, positive_int
    >>> positive_int(8, "tp")
    8
    >>> as_int(2.0, "tp")
    Traceback (most recent call last):
    ...
    rankmesh.errors.ArgumentTypeError: tp must be an int, got float 2.0
    >>> as_timeout(1.5).total_seconds()
    1.5
    >>> as_timeout(float("nan"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rankmesh.errors.InvalidTimeoutError: timeout must be a finite number of seconds >= 0.001, got nan; ...
"""

from __future__ import annotations

import datetime
import math
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rankmesh._native import MAX_WORLD_SIZE, MeshLayout
from rankmesh.errors import (
    ArgumentTypeError,
    DuplicateNameError,
    InvalidSizeError,
    InvalidTimeoutError,
    LayoutOverflowError,
    RankOutOfRangeError,
    arg,
)

__all__ = [
    "as_int",
    "as_sequence",
    "degree_fix",
    "divisors_near",
    "undivided",
    "undivided_text",
    "undivided_fix",
    "check_unique",
    "positive_int",
    "as_rank",
    "as_u64",
    "as_timeout",
    "as_bool",
    "as_layout",
    "check_str",
    "check_degrees",
    "type_name",
]

_U64_MAX = (1 << 64) - 1
_MIN_TIMEOUT = datetime.timedelta(milliseconds=1)


def type_name(value: Any) -> str:
    """The short type name used in messages (``float``, ``MeshLayout``, ...)."""
    return type(value).__name__


def as_int(value: Any, field: str) -> int:
    """``value`` as an ``int``: anything with ``__index__`` except ``bool``."""
    if isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(
            f"{field} must be an int, got bool {value!r}; write the number itself", field=field, value=value
        )
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(
            f"{field} must be an int, got {type_name(value)} {value!r}", field=field, value=value
        ) from None


_DEGREE_FIXES = {
    "tp": "use {F=1} to disable tensor parallelism, or a degree that divides {world_size}",
    "pp": "use {F=1} to disable pipeline parallelism, or a degree that divides {world_size}",
    "cp": "use {F=1} to disable context parallelism, or a degree that divides {world_size}",
    "ep": "use {F=1} to disable expert parallelism, or a degree that (times etp) divides dp_shard*cp*tp",
    "etp": "pass {F=1} (no expert tensor parallelism) or {F} equal to tp",
    "dp_replicate": "use {F=1} to disable replication",
    "dp_shard": "use {F=-1} to shard over every rank the other degrees leave",
}


def degree_fix(degree: str, field: str | None = None) -> str | None:
    """The fix (an error's ``fix`` template, see :meth:`~rankmesh.errors.RankmeshError.fix_text`)
    for a bad parallelism ``degree`` ("tp", "pp", "cp", "ep", "etp", "dp_replicate",
    "dp_shard") passed as argument ``field`` (Megatron's ``tensor_model_parallel_size``, ...).

        >>> degree_fix("tp", "tensor_model_parallel_size")
        'use {tensor_model_parallel_size=1} to disable tensor parallelism, or a degree that divides {world_size}'
    """
    text = _DEGREE_FIXES.get(degree)
    return None if text is None else text.replace("{F", "{" + (field or degree))


def divisors_near(n: int, d: int) -> list[int]:
    """The divisors of ``n`` nearest ``d`` (``d`` itself aside): the nearest below and the nearest
    above it, where there is one, the nearer first (the smaller on a tie). What a fix suggests for
    a degree ``d`` that does not divide the ``n`` ranks it must split (O(sqrt(n))).

        >>> divisors_near(131072, 7), divisors_near(131072, 3), divisors_near(64, 128), divisors_near(60, 8)
        ([8, 4], [2, 4], [64], [6, 10])
    """
    below = above = None
    for i in range(1, math.isqrt(n) + 1):
        if n % i:
            continue
        for q in (i, n // i):
            if q < d and (below is None or q > below):
                below = q
            elif q > d and (above is None or q < above):
                above = q
    return sorted((q for q in (below, above) if q is not None), key=lambda q: (abs(q - d), q))


def undivided(total: int, degrees: Sequence[tuple[str, int]]) -> tuple[str, int, int] | None:
    """The degree at fault when ``degrees`` (``(field, value)`` pairs, values >= 1) do not divide
    ``total`` ranks: ``(field, value, left)``, ``left`` being the ranks the degrees tried before it
    leave it to split; None when their product divides ``total``. The degrees that divide ``total``
    alone are tried first, then the others (each group in the order given): the first that does
    not divide what is left is blamed, so a degree that does not divide ``total`` alone (``tp=7``
    of 131072) is blamed before one that only does not fit beside the others.

        >>> undivided(131072, [("tp", 7), ("pp", 4)]), undivided(8, [("tp", 4), ("pp", 4)])
        (('tp', 7, 32768), ('pp', 4, 2))
        >>> undivided(64, [("tp", 8), ("pp", 2)]) is None
        True
    """
    left = total
    for field, value in sorted(degrees, key=lambda fv: total % fv[1] != 0):  # stable: the dividers first
        if left % value:
            return field, value, left
        left //= value
    return None


def undivided_text(field: str, shown: str, value: int, left: int, total: Any, total_value: int) -> str:
    """The clause naming the degree :func:`undivided` blames, a message template (:func:`arg`):
    ``tp = 7 does not divide world_size = 131072``, or ``pp = 4 does not divide the 2 ranks the
    other degrees leave of world_size = 8``; ``shown`` is the degree's name in the API's words,
    ``total`` the mention of what it must divide (an :func:`arg` mark) and ``total_value`` its size."""
    mention = arg(field, f"{shown} = {value}", value)
    if left == total_value:
        return f"{mention} does not divide {total}"
    return f"{mention} does not divide the {left} ranks the other degrees leave of {total}"


def undivided_fix(field: str, value: int, left: int) -> str:
    """The fix (a template) for a degree :func:`undivided` blames: the nearest values that divide
    the ranks it must split (:func:`divisors_near`).

        >>> undivided_fix("tp", 7, 131072)
        'use {tp=8} or {tp=4} (divisors of 131072)'
    """
    near = divisors_near(left, value)
    what = "a divisor" if len(near) == 1 else "divisors"
    return "use " + " or ".join(f"{{{field}={q}}}" for q in near) + f" ({what} of {left})"


def positive_int(value: Any, field: str, *, auto: int | None = None, hint: str = "", fix: str | None = None) -> int:
    """``value`` as an ``int`` >= 1; ``auto`` (e.g. ``-1``, "fill the rest of the world") also
    passes through when given. ``hint`` is appended to the error message; ``fix`` is the error's
    fix template."""
    v = as_int(value, field)
    if v >= 1 or (auto is not None and v == auto):
        return v
    also = f" (or {auto} to fill the rest of the world)" if auto is not None else ""
    raise InvalidSizeError(
        f"{arg(field)} must be >= 1{also}, got {v}{hint}", field=field, value=v, kind="degree_not_positive", fix=fix
    )


def as_rank(value: Any, world_size: int, field: str = "rank") -> int:
    """``value`` as a rank in ``range(world_size)``."""
    r = as_int(value, field)
    if not 0 <= r < world_size:
        raise RankOutOfRangeError(
            f"{arg(field, f'{field} = {r}', r)} is out of range for a world of {world_size} ranks; valid ranks are "
            f"0..{world_size - 1}",
            field=field,
            value=r,
        )
    return r


def as_u64(value: Any, field: str = "fingerprint") -> int:
    """``value`` as an unsigned 64-bit integer (a fingerprint): an int in ``0 .. 2**64 - 1``."""
    v = as_int(value, field)
    if not 0 <= v <= _U64_MAX:
        raise LayoutOverflowError(
            f"{field} = {v} does not fit in an unsigned 64-bit integer (0 .. 2**64 - 1); pass the "
            "value of a rankmesh fingerprint (e.g. layout.fingerprint()) unchanged",
            field=field,
            value=v,
        )
    return v


def as_timeout(value: Any, field: str = "timeout") -> datetime.timedelta:
    """``value`` (seconds as an int or float, or a ``datetime.timedelta``) as a ``timedelta``
    of at least 1 ms, finite and representable. A ``timedelta`` comes back unchanged."""
    if isinstance(value, datetime.timedelta):
        seconds: float = value.total_seconds()
        td: datetime.timedelta | None = value
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float's range
            seconds = math.inf
        td = None
    else:
        raise ArgumentTypeError(
            f"{field} must be a number of seconds (int or float) or a datetime.timedelta, got "
            f"{type_name(value)} {value!r}",
            field=field,
            value=value,
        )
    if td is None and math.isfinite(seconds) and seconds > 0:
        try:
            td = datetime.timedelta(seconds=seconds)
        except OverflowError:
            td = None
    if td is None or td < _MIN_TIMEOUT:
        raise InvalidTimeoutError(
            f"{field} must be a finite number of seconds >= 0.001, got {value!r}; pass e.g. 300 (seconds) "
            "or datetime.timedelta(minutes=5) (at most datetime.timedelta.max)",
            field=field,
            value=value,
        )
    return td


def as_sequence(value: Any, field: str, what: str, *, noun: str = "a sequence", label: str | None = None) -> tuple:
    """``value`` (any iterable but a ``str`` or ``bytes``) as a tuple; else
    :class:`~rankmesh.errors.ArgumentTypeError` naming ``field`` (``label`` in the message when
    given). A ``str`` is refused even though it iterates: ``("tp")`` is a classic missing comma,
    and the message shows the fix.

        >>> as_sequence(["dp", "tp"], "mesh_dim_names", "names", noun="a tuple")
        ('dp', 'tp')
        >>> as_sequence("tp", "mesh_dim_names", "names", noun="a tuple")
        Traceback (most recent call last):
        ...
        rankmesh.errors.ArgumentTypeError: mesh_dim_names must be a tuple of names, got str 'tp'; write ('tp',)
        >>> as_sequence("pp", "groups", "group names", noun="a list")
        Traceback (most recent call last):
        ...
        rankmesh.errors.ArgumentTypeError: groups must be a list of group names, got str 'pp'; write ['pp']
    """
    if not isinstance(value, (str, bytes)):
        try:
            return tuple(value)
        except TypeError:
            pass
    hint = ""
    if isinstance(value, str):
        hint = f"; write [{value!r}]" if noun == "a list" else f"; write ({value!r},)"
    raise ArgumentTypeError(
        f"{label or field} must be {noun} of {what}, got {type_name(value)} {value!r}{hint}", field=field, value=value
    )


def check_unique(
    names: Sequence[Any],
    field: str,
    message: Callable[[Any], str] | None = None,
    *,
    value_is_all: bool = False,
    fix: str | None = None,
) -> None:
    """Each of ``names`` once; else :class:`~rankmesh.errors.DuplicateNameError` for the first
    repeat, naming ``field``. ``message(name)`` gives the text where a convention has its own
    words (torch's for ``mesh_dim_names``); the error's ``value`` is the repeated name, or all of
    ``names`` when ``value_is_all``.

        >>> check_unique(("dp", "tp"), "names")
        >>> check_unique(("dp", "tp", "dp"), "names")
        Traceback (most recent call last):
        ...
        rankmesh.errors.DuplicateNameError: names holds 'dp' twice: ('dp', 'tp', 'dp'); give each its own name
    """
    seen: set[Any] = set()
    for name in names:
        if name in seen:
            text = message(name) if message else f"{field} holds {name!r} twice: {names}; give each its own name"
            raise DuplicateNameError(
                text,
                field=field,
                value=names if value_is_all else name,
                fix=fix,
            )
        seen.add(name)


def check_str(value: Any, field: str, *, optional: bool = False) -> None:
    """``value`` must be a ``str`` of valid UTF-8 text (or ``None`` when ``optional``): names,
    descriptions, tags. The Rust core reads names by the same rule.

        >>> check_str("tp", "names[0]")
        >>> check_str(chr(0xD800), "names[0]")  # a lone surrogate  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rankmesh.errors.ArgumentTypeError: names[0] must be valid UTF-8 text, got str '\\ud800', which holds ...
    """
    if optional and value is None:
        return
    if not isinstance(value, str):
        raise ArgumentTypeError(
            f"{field} must be a str{' or None' if optional else ''}, got {type_name(value)} {value!r}",
            field=field,
            value=value,
        )
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentTypeError(
            f"{field} must be valid UTF-8 text, got str {value!r}, which holds a lone surrogate (a str made "
            "by decoding bytes with errors='surrogateescape' or 'surrogatepass'); pass the name as ordinary text",
            field=field,
            value=value,
        ) from None


def check_degrees(degrees: Any, *, rank_offset: int = 0, error: type[LayoutOverflowError] = LayoutOverflowError) -> int:
    """The product of ``degrees``, ``(field, value)`` pairs of ints >= 1 in argument order, which
    must fit a world of at most :data:`~rankmesh.MAX_WORLD_SIZE` ranks, and so must the last rank
    past ``rank_offset``. Else ``error`` (a :class:`LayoutOverflowError`) naming the degree at which
    the running product first exceeds it (or ``rank_offset``), with that degree as the value.

        >>> check_degrees([("tp", 8), ("dp", 4)])
        32
        >>> check_degrees([("tp", 8), ("dp", 2**40), ("pp", 2)])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rankmesh.errors.LayoutOverflowError: dp = 1099511627776 overflows: tp*dp = 8*1099511627776 = ...
    """
    product = 1
    seen: list[tuple[str, int]] = []
    for field, value in degrees:
        product *= value
        seen.append((field, value))
        if product > MAX_WORLD_SIZE:
            names, values = "*".join(f for f, _ in seen), "*".join(str(v) for _, v in seen)
            what = f"{names} = {values} = {product} ranks" if len(seen) > 1 else f"{value} ranks"
            raise error(
                f"{arg(field, f'{field} = {value}', value)} overflows: {what} is more than the {MAX_WORLD_SIZE} a "
                "world holds "
                f"(ranks are int32); lower {field}",
                field=field,
                value=value,
            )
    if product + rank_offset - 1 > MAX_WORLD_SIZE:
        raise error(
            f"rank_offset = {rank_offset} overflows: with {product} ranks from rank {rank_offset} the last rank "
            f"is {product + rank_offset - 1}, past {MAX_WORLD_SIZE} (ranks are int32); lower rank_offset",
            field="rank_offset",
            value=rank_offset,
        )
    return product


def as_bool(value: Any, field: str) -> bool:
    """``value`` as a ``bool``: only ``True``/``False`` (or numpy's), never a truthy object."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ArgumentTypeError(
        f"{field} must be True or False, got {type_name(value)} {value!r}", field=field, value=value
    )


def as_layout(value: Any, field: str) -> MeshLayout:
    """``value`` if it is a :class:`~rankmesh.MeshLayout`, else :class:`ArgumentTypeError`."""
    if isinstance(value, MeshLayout):
        return value
    raise ArgumentTypeError(
        f"{field} must be a rankmesh.MeshLayout, got {type_name(value)}; build one with "
        "MeshLayout.world(world_size) and derive from it (unflatten, slicing, flatten)",
        field=field,
        value=value,
    )
