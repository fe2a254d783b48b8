"""Megatron-FSDP's meshes on rankmesh (``rankmesh.megatron.fsdp``, the ``megatron_fsdp`` patch)
against megatron-core 0.16's own ``FullyShardedDataParallel._init_dist_index`` as the oracle, on the
fake backend after ``rankmesh.megatron.initialize_model_parallel``: for dense, MoE (etp 1 and 2),
HSDP, tp = 1, a ``pg_collection`` and a pipeline (which both refuse), on sampled ranks,

- the dense and expert meshes and every submesh ``FSDPDistributedIndex`` keeps are equal (``==``,
  ``hash``, ``mesh``, ``_layout``, coordinate) and hold the very same process groups;
- the same groups are created (Megatron's one-rank fallbacks included);
- the patch installs and restores through ``rankmesh.patches``; a changed body is left alone;
- at 2^20 ranks nothing world-sized is built (Megatron-FSDP's own builds three W-long tensors).

Wrapping a real model with Megatron-FSDP needs CUDA (``torch.cuda.current_device()`` in
``MegatronFSDP.__init__``), so the test drives ``_init_dist_index`` itself, as the wrapper does first.
"""

from __future__ import annotations

import types
import warnings

import pytest
from rankmesh import _once

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core.distributed.fsdp.mcore_fsdp_adapter")
pytest.importorskip("einops")
import torch.distributed as dist  # noqa: E402
from rankmesh import patches  # noqa: E402
from rankmesh.megatron import fsdp as rfsdp  # noqa: E402
from rankmesh.mesh import RANK_MAP_MATERIALISATIONS, FastDeviceMesh  # noqa: E402

from tests.conftest import fake_world  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

if rfsdp.PATCH.recognise():
    pytest.skip("not the megatron-core release rankmesh.megatron.fsdp knows", allow_module_level=True)

import rankmesh.megatron as rm  # noqa: E402
from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.distributed.fsdp import mcore_fsdp_adapter as adapter  # noqa: E402

ORIGINAL = adapter.FullyShardedDataParallel.__dict__["_init_dist_index"]

# (world, tp, cp, ep, etp, distributed optimizer instances, pp)
CONFIGS = {
    "dense": (64, 4, 2, 1, 1, 1, 1),
    "moe": (64, 2, 2, 4, 1, 1, 1),
    "moe_etp": (64, 2, 1, 4, 2, 1, 1),
    "hsdp": (64, 4, 2, 1, 1, 2, 1),
    "tp1": (32, 1, 2, 1, 1, 1, 1),
    "pipeline": (64, 4, 1, 1, 1, 1, 2),
}


def _groups_made() -> int:
    return len(dist.distributed_c10d._world.pg_map)


def _run(fn, ddp):
    s = types.SimpleNamespace(ddp_config=ddp)
    before = _groups_made()
    try:
        return s, fn(s, None), None, _groups_made() - before
    except Exception as e:  # noqa: BLE001 - compared with the other side's
        return s, None, type(e), _groups_made() - before


def _same_mesh(x, y, what):
    assert x == y and hash(x) == hash(y), what
    assert x.mesh_dim_names == y.mesh_dim_names and torch.equal(x.mesh, y.mesh), what
    assert x._layout == y._layout and x.get_coordinate() == y.get_coordinate(), what
    for d in range(x.ndim):
        assert x.get_group(d) is y.get_group(d), (what, d)


def _setup(world, rank, tp, cp, ep, etp, nopt, pp):
    rm.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp,
        num_distributed_optimizer_instances=nopt,
        pipeline_model_parallel_size=pp,
        create_gloo_process_groups=False,
    )
    return DistributedDataParallelConfig(
        use_megatron_fsdp=True,
        data_parallel_sharding_strategy="optim_grads_params",
        num_distributed_optimizer_instances=nopt,
    )


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("where", [0, 0.5, 1])
def test_meshes_equal_megatron_fsdps_own(config, where):
    world, tp, cp, ep, etp, nopt, pp = CONFIGS[config]
    rank = min(world - 1, int(world * where) + (3 if where == 0.5 else 0))
    with fake_world(world, rank):
        try:
            ddp = _setup(world, rank, tp, cp, ep, etp, nopt, pp)
            s0, a, err_a, made_a = _run(ORIGINAL, ddp)
            _once.forget("megatron_fsdp")  # each case may warn once
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                s1, b, err_b, made_b = _run(rfsdp.make_init_dist_index(ORIGINAL), ddp)
            _compare(s0, a, err_a, made_a, s1, b, err_b, made_b, caught)
        finally:
            ps.destroy_model_parallel()


def _compare(s0, a, err_a, made_a, s1, b, err_b, made_b, caught):
    if err_a or err_b:  # Megatron-FSDP 0.16 refuses pp > 1; rankmesh runs Megatron's own, which refuses too
        assert err_a is err_b, (err_a, err_b)
        assert caught, "the fallback to Megatron's own method warns"
        return
    assert not caught, [str(w.message) for w in caught]
    assert made_a == made_b
    assert type(b.device_mesh) is FastDeviceMesh
    _same_mesh(a.device_mesh, b.device_mesh, "device_mesh")
    _same_mesh(a.expt_device_mesh, b.expt_device_mesh, "expt_device_mesh")
    assert (a.expt_device_mesh is a.device_mesh) == (b.expt_device_mesh is b.device_mesh)
    assert a.mesh_library.keys() == b.mesh_library.keys()
    for k in a.mesh_library:
        _same_mesh(a.mesh_library[k], b.mesh_library[k], k)
    for attr in ("fsdp_group", "outer_fsdp_group", "hybrid_fsdp_group", "expt_fsdp_group", "fsdp_group_ag"):
        assert getattr(a, attr) is getattr(b, attr), attr
    assert s0.tp_group is s1.tp_group


@pytest.mark.parametrize("config", ["dense", "moe", "hsdp"])
def test_nothing_world_sized_at_2_20(config):
    _, tp, cp, ep, etp, nopt, pp = CONFIGS[config]
    world = 1 << 20
    before = dict(RANK_MAP_MATERIALISATIONS)
    with fake_world(world, world // 2 + 3):
        try:
            ddp = _setup(world, world // 2 + 3, tp, cp, ep, etp, nopt, pp)
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no fallback to Megatron's own
                _, index, err, _ = _run(rfsdp.make_init_dist_index(ORIGINAL), ddp)
            assert err is None
            assert type(index.device_mesh) is FastDeviceMesh and index.device_mesh.shape[-1] == tp
            for m in index.mesh_library.values():
                m.mesh, m.get_coordinate()
        finally:
            ps.destroy_model_parallel()
    assert RANK_MAP_MATERIALISATIONS == before


def test_the_patch_installs_restores_and_refuses_a_changed_body(disable, monkeypatch):
    patch = patches.get("megatron_fsdp")
    F = adapter.FullyShardedDataParallel
    try:
        assert rfsdp.accelerate() and patch.installed and "megatron_fsdp" in patches.installed()
        assert F.__dict__["_init_dist_index"].__wrapped__ is ORIGINAL
    finally:
        rfsdp.restore()
    assert F.__dict__["_init_dist_index"] is ORIGINAL and not rfsdp.is_accelerated()
    disable("megatron_fsdp")
    assert rfsdp.accelerate() is False and F.__dict__["_init_dist_index"] is ORIGINAL
    disable(None)

    def changed(self, pg_collection):  # noqa: ANN001, ANN202 - a release with another body
        return ORIGINAL(self, pg_collection)

    monkeypatch.setattr(F, "_init_dist_index", changed)
    with pytest.warns(RuntimeWarning, match="megatron_fsdp"):
        assert patch.install() is False
    assert F.__dict__["_init_dist_index"] is changed


@pytest.mark.parametrize("name", ["megatron_fsdp", "megatron_fsdp_moe"])
def test_the_benchmark_workloads_build_nothing_world_sized_at_2_20(name):
    from rankmesh.bench.megatron_fsdp import WORKLOADS

    before = dict(RANK_MAP_MATERIALISATIONS)
    run = WORKLOADS[name]("rankmesh", 1 << 20, rank=(1 << 19) + 3)
    assert run.extra["mesh_types"] == ["FastDeviceMesh"]
    assert RANK_MAP_MATERIALISATIONS == before
    assert not rfsdp.is_accelerated()  # the workload restores Megatron's own method


# Functions that read a group's ranks or c10d's rank tables (O(group size)). Over groups rankmesh
# made, the accelerated _init_dist_index reads each group's recorded layout instead; the default
# group (which rankmesh hands out for a dim spanning the job) is the world in order; only a one-rank
# group's ranks are read (O(1)).
_RANK_READERS = {"get_process_group_ranks", "get_global_rank", "get_group_rank", "_get_group_ranks"}


def _calls_of_one_init(world, config):
    """Every Python and C call of a second accelerated ``_init_dist_index`` on rank W/2 + 3 of
    ``world`` (the first call warms rankmesh's one-time checks), by (file, function), and the
    sizes of the groups whose ranks it read."""
    import collections
    import gc
    import sys

    _, tp, cp, ep, etp, nopt, pp = CONFIGS[config]
    calls, read = collections.Counter(), []

    def profile(frame, event, arg):
        if event == "call":
            calls[(frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name)] += 1
            if frame.f_code.co_name in _RANK_READERS:
                read.append((frame.f_code.co_name, frame.f_locals.get("group").size()))
        elif event == "c_call":
            calls[("C", getattr(arg, "__qualname__", repr(arg)))] += 1

    with fake_world(world, world // 2 + 3):
        try:
            ddp = _setup(world, world // 2 + 3, tp, cp, ep, etp, nopt, pp)
            init = rfsdp.make_init_dist_index(ORIGINAL)
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # no fallback to Megatron's own
                _run(init, ddp)
                gc.disable()  # a collection's callbacks are not the call's work
                sys.setprofile(profile)
                try:
                    _, index, err, _ = _run(init, ddp)
                finally:
                    sys.setprofile(None)
                    gc.enable()
            assert err is None and type(index.device_mesh) is FastDeviceMesh
        finally:
            ps.destroy_model_parallel()
    return calls, read


@pytest.mark.parametrize("config", ["dense", "moe", "moe_etp", "hsdp", "tp1"])
def test_over_rankmeshs_groups_the_mesh_phase_reads_no_ranks_and_does_the_same_work_at_any_size(config):
    """Issue 34: over groups rankmesh made, Megatron-FSDP's meshes are built without reading a
    group's ranks (one-rank groups aside), the default group included (dense here has ep = etp = 1:
    its expert dp group is the world; tp1's dp_cp group is the world), and the calls made, Python
    and C, each counted, are the same for a 2^10-rank job as for a 2^17-rank one."""
    (small, read_small), (large, read_large) = _calls_of_one_init(1 << 10, config), _calls_of_one_init(1 << 17, config)
    assert {size for _, size in read_small + read_large} <= {1}, read_large
    assert small == large, {k: (small[k], large[k]) for k in small | large if small[k] != large[k]}
