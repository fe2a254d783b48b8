"""The one rule for which process group serves a mesh dim (torch-free, so the CLI can count
groups without importing torch; :class:`rankmesh.MeshBuilder` creates them by the same rule).

- A world-sized dim without a backend override is served by the default group (torch's rule).
- Otherwise a dim asked to be fake is served by a ``fake``-backend group, and so is a dim of
  size 1 (it never communicates; for one rank the fake backend's collectives are exact) unless
  ``size_one_fake=False``, torch's own rule, which gives it a one-rank group on its backend.
- Every other dim gets one group per distinct (partition of the world, backend, options): two
  dims whose groups are the same sets of ranks share one group.

    >>> from rankmesh import MeshLayout
    >>> m = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))
    >>> group_key(m, "tp", world_size=8)
    (((4, 1),), None, None)
    >>> group_key(m.flatten("all"), 0, world_size=8) is DEFAULT
    True
    >>> group_key(m, "dp", world_size=8, fake=True)[1]
    'fake'
"""

from __future__ import annotations

from typing import Any

from rankmesh._native import MeshLayout

__all__ = ["DEFAULT", "FAKE", "group_key"]

FAKE = "fake"
#: The key of dims served by the default (world) group.
DEFAULT = ("default",)


def group_key(
    layout: MeshLayout,
    dim: int | str,
    *,
    world_size: int,
    fake: bool = False,
    backend: str | None = None,
    options_id: int | None = None,
    size_one_fake: bool = True,
) -> tuple[Any, ...]:
    """The key of the process group that serves ``dim`` of ``layout``: :data:`DEFAULT`, or
    ``(partition modes, backend, options id)`` with backend ``"fake"`` for fake dims and
    ``None`` for the default backend. Dims with equal keys share one group."""
    size = int(layout.size(dim))
    if size == world_size and not fake and backend is None and options_id is None:
        return DEFAULT
    if fake or (size == 1 and size_one_fake):
        backend, options_id = FAKE, None
    return (tuple(map(tuple, layout.partition_key(dim))), backend, options_id)
