"""Shared test set-up.

``fake_world(world_size, rank, backend="fake")``: a fresh in-process world seen from ``rank``
(one process stands in for any rank of any world), on torch's fake process group; yields the
default group and always destroys the world on the way out, also when the body raises. Test
modules import it: ``from tests.conftest import fake_world``.

``meshfake``: the fake process group registered under another name. In a world on the ``fake``
backend, a group on the default backend and one overridden to ``"fake"`` are indistinguishable
(``dist.get_backend``, ``_get_backend_name`` and the group description are equal), so tests that
check which dims are fake run their worlds on ``meshfake``: groups on the default backend report
``"meshfake"`` and overridden ones ``"fake"``.

Fixtures: ``count_plain_meshes`` (the torch ``DeviceMesh`` constructions a test makes: each one
runs ``tolist()`` over its rank map) and ``small_world`` (rank 3 of an 8-rank fake world with a
builder, a 2x4 layout and a fast DeviceMesh of it; the malformed-input tests' set-up).

``meshfakesplit``: the same group registered for ``cpu`` and ``cuda``, for the ``split_group``
path on CPU: a default group bound to ``cuda`` (as ``device_id=`` binds NCCL's) needs a backend
for ``cuda``; torch 2.15's fake group can split, 2.13's and 2.14's cannot (``fake_group_splits``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

FAKE = "fake"
MESHFAKE = "meshfake"
SPLITFAKE = "meshfakesplit"


def _create_meshfake_pg(common_opts, backend_opts):
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(common_opts.group_rank, common_opts.group_size, backend_opts)


def fake_group_splits(pg: Any) -> bool:
    """Whether torch's ``split_group`` can split the fake group ``pg``: torch 2.15's can; 2.13's
    backend says it cannot (``supports_splitting`` is False), and 2.14's says it can but torch's
    split then finds no backend to split ("No backend for the parent process group or its backend
    does not support splitting"), so tests of the split path skip on both."""
    import torch
    from rankmesh._torch_compat import TORCH_VERSION

    if TORCH_VERSION < (2, 15):
        return False
    return bool(getattr(pg._get_backend(torch.device("cpu")), "supports_splitting", False))


@contextlib.contextmanager
def fake_world(world_size: int, rank: int, backend: str = FAKE) -> Iterator[Any]:
    """``init_process_group(backend)`` with a ``FakeStore`` for ``rank`` of ``world_size``; yields
    the default group; destroys the process group on exit whatever happens in the body. ``backend``
    is ``"fake"`` or another name for the fake group (``meshfake``, or a test's own). Skips the
    test where torch is not installed."""
    dist = pytest.importorskip("torch.distributed")  # skips the test where torch is absent
    from torch.testing._internal.distributed.fake_pg import FakeStore  # also registers "fake"

    dist.init_process_group(backend, rank=rank, world_size=world_size, store=FakeStore())
    try:
        yield dist.distributed_c10d._get_default_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def count_plain_meshes(monkeypatch):
    """The types of torch ``DeviceMesh`` objects constructed while the test runs (rankmesh's fast
    meshes never call ``DeviceMesh.__init__``)."""
    from torch.distributed.device_mesh import DeviceMesh

    made: list[type] = []
    init = DeviceMesh.__init__

    def counting_init(self, *args, **kwargs):
        made.append(type(self))
        return init(self, *args, **kwargs)

    monkeypatch.setattr(DeviceMesh, "__init__", counting_init)
    return made


@pytest.fixture
def small_world():
    """Rank 3 of an 8-rank fake world: a builder, a 2x4 layout, a fast DeviceMesh of it."""
    from rankmesh import MeshLayout
    from rankmesh.mesh import init_device_mesh
    from rankmesh.process_groups import MeshBuilder

    with fake_world(8, 3):
        layout = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))
        builder = MeshBuilder(MeshLayout.world(8))
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        yield {"layout": layout, "builder": builder, "mesh": mesh}


@pytest.fixture
def disable(monkeypatch):
    """``disable("a,b")`` sets ``RANKMESH_DISABLE`` as a process started with it would read it
    (rankmesh reads it once per process); ``disable(None)`` unsets it. Undone after the test."""
    from rankmesh import _patch

    def set_to(names: str | None) -> None:
        if names is None:
            monkeypatch.delenv("RANKMESH_DISABLE", raising=False)
        else:
            monkeypatch.setenv("RANKMESH_DISABLE", names)
        _patch.reset()

    yield set_to
    monkeypatch.delenv("RANKMESH_DISABLE", raising=False)
    _patch.reset()


def plant_body(monkeypatch, dependency: str, path: str, digest: str = "0" * 16) -> None:
    """Make rankmesh's table (rankmesh._known.TABLES) say the installed release of ``dependency``
    has another body at ``path``: what a new release that changed the function looks like."""
    from rankmesh._dependencies import release_in, version
    from rankmesh._known import TABLES

    release = release_in(version(dependency), tuple(TABLES[dependency]))
    monkeypatch.setitem(TABLES[dependency][release].bodies, path, digest)


def pytest_configure(config) -> None:
    # rankmesh keeps its start-up verdicts in a per-user cache (rankmesh._verdicts); the suite
    # writes its own, never the user's (tests of the cache point it elsewhere themselves).
    import os
    import tempfile

    os.environ.setdefault("RANKMESH_CACHE_DIR", tempfile.mkdtemp(prefix="rankmesh-test-cache-"))
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a test dependency
        return
    if not dist.is_available():  # pragma: no cover
        return
    for name, devices in ((MESHFAKE, ["cpu"]), (SPLITFAKE, ["cpu", "cuda"])):
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _create_meshfake_pg, extended_api=True, devices=devices)
