"""Re-initialising in the same process, many times (issue 36, item 1), on the fake backend: one
process stands in for one rank of a 131,072-rank world.

Each cycle is ``init_process_group`` + rankmesh's meshes + ``destroy_process_group()``; the roads:

- ``rankmesh.init_device_mesh`` 3-D, its slices, a ``_flatten`` and an ``_unflatten``;
- ``rankmesh.ParallelDims.build_mesh`` and ``get_mesh`` of several dims;
- torch's own ``init_device_mesh`` (and a ``_flatten`` / ``_unflatten`` of it) under
  ``rankmesh.accelerate()``;
- ``rankmesh.megatron.initialize_model_parallel`` / ``destroy_model_parallel`` (gloo twins on a
  renamed fake backend), when megatron-core is installed.

Every cycle gives every group the name it had in the first cycle (the names are what members
meet under in the store: a name that drifts between cycles, or between ranks, is a rendezvous that
never meets or meets a stale one), c10d's tables are empty after each destroy, and the process
grows by at most 16 MB over the cycles (a memory bound: a group, a builder or a mesh kept
alive per cycle would show). The same cycles across 8 gloo ranks: tests/test_reinit_mp.py.
"""

from __future__ import annotations

import ctypes
import gc
import warnings

import pytest

torch = pytest.importorskip("torch")
import rankmesh  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed import distributed_c10d as c10d  # noqa: E402

from tests.conftest import fake_world  # noqa: E402

WORLD = 2**17
RANK = WORLD // 2 + 3
CYCLES = 100
MEGATRON_CYCLES = 30
RSS_GROWTH_MB = 16

#: c10d's per-group tables (``_world``'s); each must be empty after ``destroy_process_group()``.
TABLES = (
    "pg_map",
    "pg_names",
    "pg_group_ranks",
    "pg_backend_config",
    "tags_to_pg",
    "pg_to_tag",
    "pg_coalesce_state",
)


def c10d_tables() -> dict[str, int]:
    """How many entries each of c10d's per-group tables holds, and its group counter."""
    w = c10d._world
    out = {t: len(getattr(w, t)) for t in TABLES if hasattr(w, t)}
    out["group_count"] = w.group_count
    return out


def assert_c10d_empty() -> None:
    assert not dist.is_initialized()
    left = {t: n for t, n in c10d_tables().items() if n}
    assert not left, f"c10d's tables after destroy_process_group(): {left}"


def rss_mb() -> float:
    """This process's resident memory after a garbage collection, with the heap memory malloc
    keeps for reuse given back first (glibc's ``malloc_trim``), so that RSS counts what is alive
    rather than what the allocator happens to hold after a 2^17-rank world's transient arrays."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS as it is
        pass
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


def names_of(mesh) -> list[str]:
    """The group name of every dim of ``mesh`` (a fake group for a size-1 dim included)."""
    return [mesh.get_group(d).group_name for d in range(mesh.ndim)]


def rankmesh_meshes() -> dict[str, list[str]]:
    """rankmesh.init_device_mesh 3-D (pp 4, dp 128, tp 256), slices, a _flatten and an _unflatten."""
    mesh = rankmesh.init_device_mesh("cpu", (4, WORLD // 1024, 256), mesh_dim_names=("pp", "dp", "tp"))
    dp_tp = mesh["dp", "tp"]
    flat = dp_tp._flatten("dp_tp")
    unflat = mesh["tp"]._unflatten(0, (32, 8), ("tp_outer", "tp_inner"))
    return {
        "mesh": names_of(mesh),
        "dp_tp": names_of(dp_tp),
        "pp": names_of(mesh["pp"]),
        "flat": names_of(flat),
        "unflat": names_of(unflat),
    }


def parallel_dims_meshes() -> dict[str, list[str]]:
    """torchtitan's dims through rankmesh.ParallelDims: HSDP x TP with MoE, several get_mesh."""
    pd = rankmesh.ParallelDims(dp_replicate=8, dp_shard=-1, cp=2, tp=8, pp=4, ep=16, etp=1, world_size=WORLD)
    pd.build_mesh(device_type="cpu")
    dims = (["dp_replicate", "fsdp"], "tp", "cp", "pp", "ep", "efsdp", "batch", "loss")
    return {str(d): names_of(pd.get_mesh(d)) for d in dims}


def accelerated_torch_meshes() -> dict[str, list[str]]:
    """torch's own init_device_mesh (the name in torch.distributed.device_mesh) under
    rankmesh.accelerate(), with a slice, a _flatten and an _unflatten of its mesh."""
    from torch.distributed import device_mesh

    mesh = device_mesh.init_device_mesh("cpu", (8, WORLD // 64, 8), mesh_dim_names=("dp_replicate", "fsdp", "tp"))
    assert isinstance(mesh, rankmesh.FastDeviceMesh)
    dp = mesh["dp_replicate", "fsdp"]._flatten("dp")
    ep = mesh["fsdp", "tp"]._unflatten(0, (WORLD // 1024, 16), ("efsdp", "ep"))
    return {"mesh": names_of(mesh), "dp": names_of(dp), "ep": names_of(ep)}


ROADS = {
    "init_device_mesh": rankmesh_meshes,
    "ParallelDims": parallel_dims_meshes,
    "accelerate": accelerated_torch_meshes,
}


def one_cycle(road) -> dict[str, list[str]]:
    with fake_world(WORLD, RANK):
        names = road()
    assert_c10d_empty()
    return names


@pytest.fixture
def accelerated():
    rankmesh.restore()
    assert {"init_device_mesh", "init_process_groups"} <= set(rankmesh.accelerate())
    yield
    rankmesh.restore()


def test_a_hundred_cycles_give_the_same_names_and_leave_nothing_behind(accelerated):
    """100 cycles of init + every road's meshes + destroy at 2^17 ranks: the same group names
    every cycle, c10d's tables empty after every destroy, and RSS within +16 MB from the first
    half of the cycles to the second. RSS is sampled every 5 cycles and each half counts its
    lowest sample: what the cycles keep alive lifts every sample, while the world's transient
    W-entry tables, freed into Python's and malloc's pools, lift some samples by up to ~15 MB and
    not others (a world left alive per cycle would add >5 MB each)."""
    assert not dist.is_initialized()
    first = {name: one_cycle(road) for name, road in ROADS.items()}  # imports, verdicts, caches
    assert all(first.values())
    samples = []
    for cycle in range(1, CYCLES):
        for name, road in ROADS.items():
            got = one_cycle(road)
            assert got == first[name], (cycle, name, got, first[name])
        if cycle % 5 == 0:
            samples.append(rss_mb())
    half = len(samples) // 2
    grown = min(samples[half:]) - min(samples[:half])
    assert grown < RSS_GROWTH_MB, f"RSS grew by {grown:.1f} MB over {CYCLES - 1} cycles (MB: {samples})"


# -- megatron-core's parallel_state through rankmesh.megatron ------------------------------------

FAKEGLOO = "fakegloo"
MEGATRON_KW = dict(
    tensor_model_parallel_size=8,
    pipeline_model_parallel_size=4,
    context_parallel_size=2,
    expert_model_parallel_size=8,
    expert_tensor_parallel_size=1,
)


@pytest.fixture
def megatron(monkeypatch):
    """megatron-core's parallel_state, its gloo twins on ``fakegloo`` (a renamed fake backend, as
    in tests/test_megatron_init.py), restored to its import-time globals afterwards."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is a test dependency")
        pytest.importorskip("einops")
    import rankmesh.megatron as rm
    from rankmesh import process_groups

    from tests.conftest import _create_meshfake_pg
    from tests.mp import megatron_snapshot as snap

    if FAKEGLOO not in dist.Backend.backend_list:
        dist.Backend.register_backend(FAKEGLOO, _create_meshfake_pg, extended_api=True, devices=["cpu", "cuda"])
    real_new_group, real_member = dist.new_group, process_groups.new_member_group

    def new_group(*args, backend=None, **kw):
        return real_new_group(*args, backend=FAKEGLOO if backend == "gloo" else backend, **kw)

    def new_member_group(ranks, *, backend=None, **kw):
        return real_member(ranks, backend=FAKEGLOO if backend == "gloo" else backend, **kw)

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(process_groups, "new_member_group", new_member_group)
    snap.reset()
    yield rm, snap
    snap.reset()


def megatron_names(snap) -> dict[str, str]:
    """The name of every process group parallel_state holds, by the global that holds it."""
    from megatron.core import parallel_state as ps

    out = {}
    for name in snap._state_names():
        value = getattr(ps, name)
        values = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
        for i, v in enumerate(values):
            if isinstance(v, dist.ProcessGroup):
                out[f"{name}[{i}]"] = v.group_name
    return out


def test_thirty_megatron_initialize_destroy_cycles(megatron):
    """30 cycles of init + rankmesh.megatron.initialize_model_parallel (gloo twins included) +
    destroy_model_parallel + destroy at 2^17 ranks: the same names every cycle, c10d's tables
    empty after every destroy."""
    rm, snap = megatron
    first = None
    for cycle in range(MEGATRON_CYCLES):
        with fake_world(WORLD, RANK):
            rm.initialize_model_parallel(**MEGATRON_KW)
            names = megatron_names(snap)
            rm.destroy_model_parallel()
            snap.reset()
        assert_c10d_empty()
        assert len(names) > 10, names
        first = first or names
        assert names == first, (cycle, names, first)


# -- a group destroyed inside a world, then made again (torch 2.13's names can repeat) -----------


def test_rebuilding_freed_groups_in_the_same_world_is_refused_on_torch_2_13_and_works_after():
    """torch 2.13 salts member-only names with the number of groups registered, which
    ``destroy_process_group(group)`` lowers: the same mesh built again after its groups were
    destroyed would get their names and meet their stale rendezvous in the store (on gloo: a hang
    or a gloo connection error). rankmesh raises DistributedStateError there, before the group is
    made; torch 2.14+ never reuses a name, so there the rebuild just works. A new world (or
    partitions of other ranks) is not refused."""
    from rankmesh import _fast_groups_check
    from rankmesh.errors import DistributedStateError

    from tests.conftest import MESHFAKE  # a fake group under another name: stands for gloo here

    def build(names=("dp", "tp")):
        return rankmesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=names)

    def free(mesh):
        for d in mesh.mesh_dim_names:
            dist.destroy_process_group(mesh.get_group(d))

    with fake_world(8, 5, MESHFAKE):
        first = build()
        old = names_of(first)
        free(first)
        before = len(c10d._world.pg_map)
        if _fast_groups_check.SCHEME == "pg_names":  # torch 2.13
            with pytest.raises(DistributedStateError) as e:
                build()
            assert e.value.field == "group_name" and e.value.value == old[0]
            assert len(c10d._world.pg_map) == before  # nothing made
            other = rankmesh.init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))  # other ranks: made
            assert not set(names_of(other)) & set(old)
        else:
            again = build()
            assert not set(names_of(again)) & set(old)
    with fake_world(8, 5, MESHFAKE):  # a new world: the same names again, nothing refused
        assert names_of(build()) == old
