"""The one rule for which process group serves a mesh dim (torch-free, so the CLI can count
groups without importing torch; :class:`rankmesh.MeshBuilder` creates them by the same rule).

- A world-sized dim without a backend override is served by the default group (torch's rule).
- Otherwise a dim asked to be fake is served by a ``fake``-backend group, and so is a dim of
  size 1 (it never communicates; for one rank the fake backend's collectives are exact) unless
  ``size_one_fake=False``, torch's own rule, which gives it a one-rank group on its backend.
  A dim made fake by these rules has no options; a ``fake`` backend override keeps its options
  and timeout, as torch passes them (``FakeProcessGroup.Options``, e.g. ``error_on_collective``).
- Every other dim gets one group per distinct (partition of the world, backend, options, timeout,
  tag, mesh dim name): two dims whose groups are the same sets of ranks share one group. A ``tag``
  asks for a communicator of its own (Megatron's all-gather twin of the dp-cp group); a
  ``timeout`` other than the backend's default keeps a group from being shared with one that has
  another timeout.
- Dims of ``DeviceMesh`` objects pass their name (``mesh_dim_name``): they share a group only
  with dims of the same name (``pp`` of torchtitan's dataloading, dense and sparse meshes), never
  across names. FSDP2 groups a module's parameters by their (shard, replicate) process groups
  and requires one mesh per such pair, so when ``efsdp`` has the same ranks as ``fsdp`` (ep equal
  to cp x tp) one shared group would make ``fully_shard`` refuse torchtitan's MoE blocks; stock
  torch gives them two groups as well.

    >>> from rankmesh import MeshLayout
    >>> m = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))
    >>> group_key(m, "tp", world_size=8)
    (((4, 1),), None, None)
    >>> group_key(m.flatten("all"), 0, world_size=8) is DEFAULT
    True
    >>> group_key(m, "dp", world_size=8, fake=True)[1]
    'fake'
    >>> is_fake(group_key(m, "dp", world_size=8, fake=True)), is_fake(group_key(m, "dp", world_size=8))
    (True, False)
    >>> group_key(m, "dp", world_size=8, backend="fake", options_id=7)[1:]  # a fake override keeps its options
    ('fake', 7)
    >>> group_key(m, "dp", world_size=8, fake=True, backend="gloo", options_id=7)[1:]  # made fake: none
    ('fake', None)
"""

from __future__ import annotations

from typing import Any

from rankmesh._check import as_layout
from rankmesh._native import MeshLayout

__all__ = ["DEFAULT", "FAKE", "extend_key", "group_key", "is_fake", "serves_default"]

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
    timeout: Any = None,
    tag: str | None = None,
    mesh_dim_name: str | None = None,
) -> tuple[Any, ...]:
    """The key of the process group that serves ``dim`` of ``layout``: :data:`DEFAULT`, or
    ``(partition modes, backend, options id)`` with backend ``"fake"`` for fake dims and
    ``None`` for the default backend, followed by ``(timeout, tag)`` when either is given and by
    ``("name", mesh_dim_name)`` for a dim of a ``DeviceMesh``. Dims with equal keys share one
    group. A world-sized dim with only a ``timeout`` is still served by the default group (which
    keeps its own timeout), whatever its name, as in torch."""
    as_layout(layout, "layout")
    size = int(layout.size(dim))
    if not fake and serves_default(size, world_size, backend=backend, options_id=options_id, tag=tag):
        return DEFAULT
    if (fake or (size == 1 and size_one_fake)) and backend != FAKE:
        # made fake by rankmesh's rule, not asked for: no options or timeout of another backend.
        # A ``fake`` override keeps its options (torch passes them to the fake backend), and a
        # group with options is not shared with one without.
        backend, options_id, timeout = FAKE, None, None
    key = extend_key((tuple(map(tuple, layout.partition_key(dim))), backend, options_id), timeout, tag)
    placement = layout.placement
    if placement is not None:  # a mesh over part of the job: its partition is of those ranks only
        key = key + (("placed", placement[0], tuple(map(tuple, placement[1]))),)
    return key if mesh_dim_name is None else key + (("name", mesh_dim_name),)


def is_fake(key: tuple[Any, ...]) -> bool:
    """Whether a :func:`group_key` is that of a ``fake``-backend group."""
    return key[1:2] == (FAKE,)


def serves_default(
    size: int, world_size: int, *, backend: str | None = None, options_id: int | None = None, tag: str | None = None
) -> bool:
    """Whether a group of ``size`` ranks is the default group itself: the whole world, with no
    backend, options or tag of its own (torch's rule; a timeout alone does not count)."""
    return size == world_size and backend is None and options_id is None and tag is None


def extend_key(key: tuple[Any, ...], timeout: Any = None, tag: str | None = None) -> tuple[Any, ...]:
    """``key`` with ``(timeout, tag)`` appended when either is given (keys stay short otherwise)."""
    return key if timeout is None and tag is None else key + (timeout, tag)
