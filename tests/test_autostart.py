"""``RANKMESH_ACCELERATE=1``: rankmesh's general patches reach every process a launcher starts,
with no change to the script. The wheel installs ``_rankmesh_autostart`` and
``rankmesh-autostart.pth`` at the top of site-packages; these tests run fresh interpreters (and
torchrun's rank processes) and look at what they got.

They need the installed wheel (the ``.pth`` file is what Python's ``site`` reads at start-up): in
CI (``RANKMESH_TEST_INSTALLED=1``) a missing file fails; from a source tree the tests skip.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.frameworks import child_env, needs_autostart  # noqa: E402
from tests.mp import rankmesh_mp as mp  # noqa: E402

pytestmark = needs_autostart

PROBE = """
import sys
before = "rankmesh" in sys.modules
import torch.distributed as dist
import torch.distributed.device_mesh as dm
ipg = dm.DeviceMesh.__dict__["_init_process_groups"].__func__
print(before, dist.init_device_mesh is dm.init_device_mesh, dm.init_device_mesh.__qualname__, ipg.__module__)
"""


def _probe(value: str | None) -> list[str]:
    env = child_env(value)
    env.pop("PYTHONPATH", None)  # the installed wheel, as a user has it
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_variable_installs_both_patches_before_torch_binds_the_names():
    before, same, qualname, module = _probe("1")
    assert before == "False"  # nothing of rankmesh before torch's device_mesh is imported
    assert same == "True" and qualname == "_make_init_device_mesh.<locals>.init_device_mesh"
    assert module == "rankmesh.devicemesh"


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_variable_nothing_changes(value):
    before, same, qualname, module = _probe(value)
    assert (before, same, qualname, module) == ("False", "True", "init_device_mesh", "torch.distributed.device_mesh")


@pytest.mark.multiprocess
@pytest.mark.skipif(not dist.is_gloo_available(), reason="needs gloo")
@pytest.mark.parametrize("accelerate", ["1", "0"])
def test_every_torchrun_rank_gets_the_patches_and_its_groups_talk_to_the_right_peers(tmp_path, accelerate):
    world = 4
    cmd = mp.torchrun() + ["--standalone", "--nproc-per-node", str(world)]
    cmd += mp.worker_args("tests.mp.plain_torch_worker", "--out", str(tmp_path))
    log = mp.launch([cmd], tmp_path, 240, {"GLOO_SOCKET_IFNAME": "lo", "RANKMESH_ACCELERATE": accelerate})
    res = mp.results(tmp_path)
    got = mp.assert_check(res, log, "build", world)
    mp.assert_check(res, log, "end", world)
    for rank, record in got.items():
        if accelerate == "1":
            assert record["mesh_type"] == "FastDeviceMesh", rank
            assert record["init_process_groups"] == "rankmesh.devicemesh.DeviceMesh._init_process_groups"
        else:
            assert record["mesh_type"] == "DeviceMesh", rank
            assert record["init_process_groups"] == "torch.distributed.device_mesh.DeviceMesh._init_process_groups"


def test_rankmesh_run_sets_the_variable_for_the_command_and_its_children():
    env = child_env(None)
    code = "import os, subprocess, sys; subprocess.run([sys.executable, '-c', " + repr(PROBE) + "])"
    out = subprocess.run(
        [sys.executable, "-m", "rankmesh", "run", "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "rankmesh.devicemesh", out.stdout


def test_rankmesh_run_without_a_command_says_how_and_a_missing_one_is_127():
    out = subprocess.run([sys.executable, "-m", "rankmesh", "run"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage: rankmesh run" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "rankmesh", "run", "no-such-command-here"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 127 and "no-such-command-here" in out.stderr
