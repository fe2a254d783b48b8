"""The one home of rankmesh's argument checks for integers: degrees, sizes, ranks, counts.

One rule everywhere (the Python layer and, for the same values, the Rust core):

* an integer is anything with ``__index__`` (``int``, numpy integers, ``torch`` ints), as in
  torch's own size and rank arguments;
* ``bool`` is **not** an integer here, although Python makes it one: ``tp=True`` is a bug, not a
  degree of 1;
* floats are refused, even integral ones (``2.0``), and strings too: nothing is truncated or
  parsed silently. Environment variables and command-line text are parsed where they are read,
  with their own error.

A value of the wrong type raises :class:`~rankmesh.errors.ArgumentTypeError` (a ``TypeError``,
which torch raises for a float size); a value out of range raises the class of its fault.

    >>> from rankmesh._check import as_int, positive_int
    >>> positive_int(8, "tp")
    8
    >>> as_int(2.0, "tp")
    Traceback (most recent call last):
    ...
    rankmesh.errors.ArgumentTypeError: tp must be an int, got float 2.0
"""

from __future__ import annotations

import operator
from typing import Any

from rankmesh.errors import ArgumentTypeError, InvalidSizeError, RankOutOfRangeError

__all__ = ["as_int", "positive_int", "as_rank"]


def as_int(value: Any, field: str) -> int:
    """``value`` as an ``int``: anything with ``__index__`` except ``bool``."""
    if isinstance(value, bool):
        raise ArgumentTypeError(
            f"{field} must be an int, got bool {value!r}; write the number itself", field=field, value=value
        )
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(
            f"{field} must be an int, got {type(value).__name__} {value!r}", field=field, value=value
        ) from None


def positive_int(value: Any, field: str, *, auto: int | None = None, hint: str = "") -> int:
    """``value`` as an ``int`` >= 1; ``auto`` (e.g. ``-1``, "fill the rest of the world") also
    passes through when given. ``hint`` is appended to the error message."""
    v = as_int(value, field)
    if v >= 1 or (auto is not None and v == auto):
        return v
    also = f" (or {auto} to fill the rest of the world)" if auto is not None else ""
    raise InvalidSizeError(f"{field} must be >= 1{also}, got {v}{hint}", field=field, value=v)


def as_rank(value: Any, world_size: int, field: str = "rank") -> int:
    """``value`` as a rank in ``range(world_size)``."""
    r = as_int(value, field)
    if not 0 <= r < world_size:
        raise RankOutOfRangeError(
            f"{field} = {r} is out of range for a world of {world_size} ranks; valid ranks are 0..{world_size}",
            field=field,
            value=r,
        )
    return r
