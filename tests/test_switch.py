"""The one switch (:mod:`rankmesh.switch`): ``RANKMESH_ACCELERATE=1`` alone reaches every framework
rankmesh knows, each patch the moment its module is imported, and code it has not read runs stock.

The framework proofs run each framework as itself in child processes, with nothing of rankmesh in
the child's code: stock (no variable) beside the switch (``RANKMESH_ACCELERATE=1``), comparing every
answer:

- megatron-core 0.16.1's ``mpu.initialize_model_parallel`` called as Megatron-LM's trainer calls it
  (``megatron/training/initialize.py``: three positional sizes, then its keywords): every
  ``parallel_state`` global and getter (tests/mp/megatron_snapshot.py);
- Megatron-FSDP's ``_init_dist_index`` after that call: its meshes;
- torchtitan 0.3.0's Trainer path (``ParallelDims.from_config`` -> ``build_mesh`` -> the model on the
  meta device -> ``parallelize_llama``, default ``spmd_backend="spmd_types"``): every mesh and every
  parameter's placements.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("torch")

import rankmesh  # noqa: E402
from rankmesh import _once, patches, switch  # noqa: E402

from tests.frameworks import ROOT, child_env, needs_autostart, run_json  # noqa: E402


def _child(code: str, accelerate: str | None, *args: object, timeout_s: float = 300) -> dict:
    return run_json(code, list(args), accelerate, timeout_s)


# -- the table ---------------------------------------------------------------------------------------


def test_the_hooks_cover_every_switched_patch_once_and_match_the_start_up_module():
    hooked = [p.name for p in switch.patches()]
    assert sorted(hooked) == sorted(set(patches.REGISTRY) - {"concatenate"})  # concatenate: the first mesh's
    assert len(hooked) == len(set(hooked))
    for module, refs in switch.HOOKS.items():
        for p in switch.patches(module):
            assert p.owner == module or p.owner.startswith(module + "."), (module, p.owner)
    autostart = pytest.importorskip("_rankmesh_autostart")
    assert autostart.TARGETS == tuple(switch.HOOKS)


def test_accelerate_installs_torchs_patches_now_and_restore_takes_everything_out():
    try:
        names = rankmesh.accelerate()
        assert {"init_process_groups", "init_device_mesh"} <= set(names)
        assert set(names) == {p.name for p in switch.patches() if p.installed}
    finally:
        rankmesh.restore()
    assert not any(p.installed for p in switch.patches())
    autostart = sys.modules.get("_rankmesh_autostart")
    assert autostart is None or not autostart.pending()


def test_a_name_bound_before_accelerate_is_warned_about_naming_the_module(tmp_path):
    code = """
import warnings
warnings.simplefilter("always")
from torch.distributed.device_mesh import init_device_mesh
import rankmesh
with warnings.catch_warnings(record=True) as caught:
    rankmesh.accelerate()
print([str(w.message) for w in caught if "bound" in str(w.message)])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env(None), capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "__main__ bound init_device_mesh before the call" in out.stdout, out.stdout
    assert "RANKMESH_ACCELERATE=1" in out.stdout


# -- the variable ------------------------------------------------------------------------------------

PROBE = """
import logging, sys
if sys.argv[1] != "default":
    logging.basicConfig(level=getattr(logging, sys.argv[1]), stream=sys.stdout, format="LOG %(name)s %(message)s")
import torch.distributed.device_mesh as dm
print(dm.init_device_mesh.__qualname__)
"""


def _probe(value: str | None, level: str = "default") -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, level], env=child_env(value), capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert out.returncode == 0, out.stderr
    return out


@needs_autostart
@pytest.mark.parametrize(
    "value, on",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        (" On ", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("OFF", False),
        ("", False),
    ],
)
def test_the_variable_reads_on_and_off_words_case_insensitively(value, on):
    out = _probe(value)
    assert ("_make_init_device_mesh" in out.stdout) is on, out.stdout
    assert "rankmesh" not in out.stderr  # silent at Python's default logging level


@needs_autostart
def test_an_unknown_value_warns_once_and_stays_off():
    out = _probe("enable")
    assert out.stdout.strip() == "init_device_mesh"
    assert out.stderr.count("RANKMESH_ACCELERATE='enable' is neither on") == 1


@needs_autostart
def test_one_info_line_names_the_patches_the_switch_installs():
    out = _probe("1", "INFO")
    lines = [line for line in out.stdout.splitlines() if line.startswith("LOG rankmesh")]
    assert lines == [
        "LOG rankmesh rankmesh: torch.distributed.device_mesh imported; installed init_process_groups, init_device_mesh"
    ]


@needs_autostart
def test_a_hook_that_fails_leaves_the_framework_importable_with_one_warning():
    code = """
import sys, warnings
warnings.simplefilter("always")
import _rankmesh_autostart
import rankmesh.switch
def broken(module):
    raise RuntimeError("boom")
rankmesh.switch.on_import = broken
with warnings.catch_warnings(record=True) as caught:
    import megatron.core.parallel_state as ps
print(ps.initialize_model_parallel.__module__, [str(w.message) for w in caught if "rankmesh" in str(w.message)])
"""
    pytest.importorskip("megatron.core")
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env("1"), capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("megatron.core.parallel_state ")
    for module in ("megatron.core.parallel_state", "megatron.core.distributed.fsdp.mcore_fsdp_adapter"):
        assert out.stdout.count(f"the patches for {module} could not be installed (RuntimeError('boom'))") == 1


def _status(env: dict[str, str]) -> tuple[str, dict[str, tuple[str, str]]]:
    """``rankmesh status``'s first line, and per row its state and why (the line below it)."""
    out = subprocess.run(
        [sys.executable, "-m", "rankmesh", "status"], env=env, capture_output=True, text=True, timeout=240, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    rows = {}
    for line, why in zip(lines[1::2], lines[2::2]):
        name, state, _target = line.split(maxsplit=2)
        rows[name] = (state, why.strip())
    return lines[0], rows


@needs_autostart
def test_rankmesh_status_says_what_the_switch_would_install_and_why_not():
    env = child_env(None)
    first, rows = _status(env)
    assert first.startswith("RANKMESH_ACCELERATE is not set: the switch is off")
    assert [n for n in rows if n not in ("concatenate", "fast_groups")] == [p.name for p in switch.patches()]
    state, why = rows["init_process_groups"]
    assert state == "ready" and why.startswith("torch 2.") and why.endswith("release and bodies recognised")
    env.update(RANKMESH_DISABLE="megatron", RANKMESH_ACCELERATE="1")
    first, rows = _status(env)
    assert first == "RANKMESH_ACCELERATE='1': the switch is on"
    assert rows["megatron"] == ("off", "RANKMESH_DISABLE names it")
    assert rows["init_device_mesh"][0] == "on"


# -- megatron-core as Megatron-LM's trainer calls it -----------------------------------------------

MEGATRON = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from megatron.core import mpu
from tests.mp import megatron_snapshot as snap

world, rank, tp, pp, cp, ep, fsdp = map(int, sys.argv[1:8])
dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
before = len(dist.distributed_c10d._world.pg_map)
# megatron/training/initialize.py, _initialize_distributed (core_v0.16.1), with the trainer's defaults
mpu.initialize_model_parallel(
    tp, pp, None,
    pipeline_model_parallel_comm_backend=None, use_sharp=False, context_parallel_size=cp,
    hierarchical_context_parallel_sizes=None, hybrid_context_parallel=False, expert_model_parallel_size=ep,
    num_distributed_optimizer_instances=1, expert_tensor_parallel_size=None, distributed_timeout_minutes=10,
    nccl_communicator_config_path=None, order="tp-cp-ep-dp-pp", get_embedding_ranks=None,
    get_position_embedding_ranks=None, create_gloo_process_groups=False, high_priority_stream_groups=[],
    sharp_enabled_group=None, create_all_gather_group=False,
)
out = {"state": snap.snapshot(), "groups": len(dist.distributed_c10d._world.pg_map) - before,
       "route": mpu.initialize_model_parallel.__module__}
if fsdp:
    import types
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
    from tests.frameworks import mesh_record
    s = types.SimpleNamespace(ddp_config=DistributedDataParallelConfig(
        use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params"))
    index = FullyShardedDataParallel._init_dist_index(s, None)
    out["fsdp"] = {str(k): mesh_record(m, True) for k, m in index.mesh_library.items()}
    out["fsdp_mesh"] = [type(index.device_mesh).__name__, mesh_record(index.device_mesh, True)]
    out["fsdp_route"] = FullyShardedDataParallel._init_dist_index.__module__
print(json.dumps(out))
"""


@needs_autostart
@pytest.mark.parametrize(
    "world, rank, tp, pp, cp, ep, fsdp",
    [(64, 37, 2, 2, 2, 2, 0), (128, 5, 4, 4, 1, 8, 0), (64, 43, 4, 1, 2, 1, 1), (64, 0, 2, 1, 2, 4, 1)],
)
def test_megatrons_own_call_under_the_variable_alone_answers_as_stock(world, rank, tp, pp, cp, ep, fsdp):
    pytest.importorskip("megatron.core")
    if fsdp:
        pytest.importorskip("megatron.core.distributed.fsdp.mcore_fsdp_adapter")
    args = (world, rank, tp, pp, cp, ep, fsdp)
    stock = _child(MEGATRON, None, *args)
    ours = _child(MEGATRON, "1", *args)
    assert stock["route"] == "megatron.core.parallel_state" and ours["route"] == "rankmesh.megatron.route"
    from tests.mp import megatron_snapshot as snap

    assert not snap.diff(stock["state"], ours["state"])
    assert stock["state"]["model_parallel_is_initialized"] is True
    assert ours["groups"] < stock["groups"], (ours["groups"], stock["groups"])
    if fsdp:
        assert ours["fsdp_route"] == "rankmesh.megatron.fsdp" and ours["fsdp_mesh"][0] == "FastDeviceMesh"
        assert ours["fsdp"] == stock["fsdp"] and ours["fsdp_mesh"][1] == stock["fsdp_mesh"][1]


# -- torchtitan's Trainer path -------------------------------------------------------------------------

TITAN = """
import json, sys, warnings
warnings.simplefilter("ignore")
from rankmesh.bench.titan_workloads import llama3
from tests.frameworks import mesh_record

world, rank, impl, backend = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
from rankmesh._fast_groups import init_fake_world
init_fake_world(world, rank)  # kept up after the run (rank=None below), so its meshes can be read
run = llama3(impl, world, rank=None, backend=backend)
out = {"placements": [list(map(str, p)) for p in run.extra["placements"]],
       "meshes": {k: mesh_record(m, False) for k, m in sorted(run.meshes.items())},
       "types": sorted({type(m).__name__ for m in run.meshes.values()})}
if impl == "switch":
    from rankmesh import patches
    from rankmesh.torchtitan import spmd_axis
    out["installed"] = sorted(patches.installed())
    out["le_by_modes"] = spmd_axis.COUNTS["modes"]
print(json.dumps(out))
"""


@needs_autostart
def test_torchtitans_trainer_path_under_the_variable_alone_answers_as_stock():
    pytest.importorskip("torchtitan.distributed.parallel_dims")
    from rankmesh import _torch_compat

    world, rank = 2048, 1027
    # torchtitan's default spmd_types refuses the model on torch 2.13, stock too (docs/known_gaps.md)
    backend = "spmd_types" if _torch_compat.TORCH_VERSION >= (2, 14) else "partial_dtensor"
    stock = _child(TITAN, None, world, rank, "torch", backend, timeout_s=600)
    ours = _child(TITAN, "1", world, rank, "switch", backend, timeout_s=600)
    assert ours["placements"] == stock["placements"]
    assert ours["meshes"] == stock["meshes"]
    assert ours["types"] == ["FastDeviceMesh"] and stock["types"] == ["DeviceMesh"]
    assert {"torchtitan", "init_device_mesh", "init_process_groups"} <= set(ours["installed"])
    if backend == "spmd_types":
        assert "spmd_axis_le" in ours["installed"]
        assert ours["le_by_modes"] > 0  # spmd_types' axis comparison answered by modes


# -- never a crash where stock works -------------------------------------------------------------------


def test_the_megatron_patch_leaves_a_release_it_has_not_read_alone_with_one_warning(monkeypatch):
    pytest.importorskip("megatron.core")
    from rankmesh import _dependencies
    from rankmesh.megatron import route

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
    own = ps.initialize_model_parallel
    monkeypatch.setitem(_dependencies._versions, "megatron-core", "0.19.1")
    monkeypatch.setattr(_once, "_seen", set())
    try:
        with pytest.warns(RuntimeWarning, match=r"megatron-core 0\.19\.1 is not a version this patch has read"):
            assert route.PATCH.install() is False
        assert ps.initialize_model_parallel is own
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once
            assert route.PATCH.install() is False
    finally:
        route.PATCH.restore()


def test_the_megatron_route_hands_an_unknown_keyword_to_megatrons_own_function():
    pytest.importorskip("megatron.core")
    from rankmesh.megatron import parallel_state as rm_ps
    from rankmesh.megatron import route

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
    own = ps.initialize_model_parallel
    assert route.PATCH.install()
    try:
        assert rm_ps.megatron_own(ps) is own
        with pytest.raises(TypeError) as stock_error:
            own(gtp_remat_size=1)
        with pytest.raises(TypeError) as routed_error:
            ps.initialize_model_parallel(gtp_remat_size=1)  # does not bind: megatron-core's own TypeError
        assert str(routed_error.value) == str(stock_error.value)
    finally:
        route.PATCH.restore()
    assert ps.initialize_model_parallel is own


def test_megatrons_own_function_is_found_again_from_its_source_after_an_assignment(monkeypatch):
    pytest.importorskip("megatron.core")
    import rankmesh.megatron as rm
    from rankmesh.megatron import parallel_state as rm_ps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
    own = ps.initialize_model_parallel
    monkeypatch.setattr(ps, "initialize_model_parallel", rm.initialize_model_parallel)
    found = rm_ps.megatron_own(ps)
    assert found is not own and found is not rm.initialize_model_parallel
    assert found.__code__.co_filename == own.__code__.co_filename
    assert found.__code__.co_firstlineno == own.__code__.co_firstlineno
    assert found.__globals__ is ps.__dict__ and found.__defaults__ == own.__defaults__


def test_status_rows_cover_every_switched_patch_in_process():
    rows = switch.status()
    names = [r[0] for r in rows]
    assert names[: len(switch.patches())] == [p.name for p in switch.patches()]
    assert {"concatenate", "fast_groups"} <= set(names)
    assert all(state in ("on", "ready", "off") for _, _, state, _ in rows)


def test_no_hook_is_left_behind_by_this_module():
    autostart = sys.modules.get("_rankmesh_autostart")
    assert autostart is None or not autostart.pending(), os.environ.get("RANKMESH_ACCELERATE")


SWITCHED = [p.name for p in switch.patches()]


@pytest.mark.parametrize("name", SWITCHED)
def test_every_switched_patch_leaves_a_release_it_has_not_read_alone_with_one_warning(name, monkeypatch):
    from rankmesh import _dependencies

    p = patches.get(name)
    if not _dependencies.available(p.dependency):
        pytest.skip(f"{p.dependency} is not installed")
    assert not p.installed
    monkeypatch.setitem(_dependencies._versions, p.dependency, "99.0")
    monkeypatch.setattr(_once, "_seen", set())
    try:
        with pytest.warns(RuntimeWarning, match=rf"{p.dependency} 99\.0 is not a version .* has read"):
            assert p.install() is False
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once
            assert p.install() is False
        assert not p.installed
    finally:
        p.restore()


@pytest.mark.parametrize("name", ["init_device_mesh", "torchtitan", "megatron"])
def test_an_unknown_keyword_gets_the_originals_own_type_error(name):
    """The patched functions that callers call by name (the methods are called by the framework's
    own code): a keyword neither knows raises a TypeError naming it, as the original does (the
    megatron route hands the call to megatron-core's own function, so its text is megatron-core's)."""
    p = patches.get(name)
    if p.recognise() is not None:
        pytest.skip(p.recognise())
    assert p.install()
    try:
        original, replacement = p.original(), p.replacement
        errors = []
        for fn in (original, replacement):
            with pytest.raises(TypeError) as e:
                fn(no_such_keyword=1)
            errors.append(str(e.value))
        assert all("got an unexpected keyword argument 'no_such_keyword'" in e for e in errors), errors
        if name == "megatron":
            assert errors[0] == errors[1]
    finally:
        p.restore()


@needs_autostart
def test_the_start_up_hook_imports_nothing_but_itself_in_a_process_that_uses_no_framework():
    """What keeps the switch under a millisecond at interpreter start (~0.3 ms with its bytecode
    cached; ~80 ns for every later import while it waits): ``_rankmesh_autostart`` imports no module
    Python's start-up has not imported already."""
    code = "import sys; print(' '.join(sorted(sys.modules)))"
    on = _probe_modules(code, "1")
    off = _probe_modules(code, None)
    assert on - off == {"_rankmesh_autostart"}, on - off


def _probe_modules(code: str, value: str | None) -> set[str]:
    env = child_env(value)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())
