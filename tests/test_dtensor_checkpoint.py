"""DTensor checkpoints made on rankmesh's meshes load as those made on torch's: with
``torch.load(..., weights_only=True)`` (torch's default), in this process and in one where rankmesh
cannot be imported, with the same ``DeviceMesh`` answers (a fast mesh pickles as torch's
``DeviceMesh``: tests/test_mesh_pickling.py). Oracle: the same checkpoint made on torch's own
meshes (``torch.distributed.device_mesh.init_device_mesh``), and meshes torch builds where it loads.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap

import torch
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from tests.conftest import fake_world
from tests.mesh_helpers import MESH_MARKS

pytestmark = MESH_MARKS

WORLD, RANK = 8, 5
SHAPE, NAMES = (2, 2, 2), ("dp", "cp", "tp")


def _meshes(root: DeviceMesh) -> dict[str, DeviceMesh]:
    """The meshes a checkpoint's DTensors sit on: the root, a 2-D slice, a 1-D slice, a flatten."""
    return {"root": root, "dp_tp": root["dp", "tp"], "tp": root["tp"], "dp_cp": root["dp", "cp"]._flatten("dp_cp")}


def _state_dict(root: DeviceMesh) -> dict[str, DTensor]:
    """One DTensor per mesh, with local shards that say which rank holds them."""
    out = {}
    for i, (key, mesh) in enumerate(_meshes(root).items()):
        local = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * RANK + i
        placements = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
        out[key] = DTensor.from_local(local, mesh, placements, run_check=False)
    return out


def _save(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _load(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


def _answers(mesh: DeviceMesh) -> dict:
    return {
        "mesh": mesh.mesh.tolist(),
        "names": list(mesh.mesh_dim_names),
        "coordinate": list(mesh.get_coordinate()),
        "shape": list(mesh.shape),
        "layout": [[list(a.shape), list(a.stride)] for a in mesh._layout],
    }


def test_a_dtensor_checkpoint_on_rankmesh_meshes_loads_weights_only_with_the_same_answers():
    with fake_world(WORLD, RANK):
        ours = init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)
        theirs = torch_init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)
        sd = _state_dict(ours)
        for m in _meshes(ours).values():
            hash(m)  # a cached hash must not travel into the checkpoint
        data = _save(sd)
        assert b"rankmesh" not in data
        back = _load(data)
        torch_back = _load(_save(_state_dict(theirs)))
        for key, m in _meshes(ours).items():
            got, tm = back[key], _meshes(theirs)[key]
            lm = got.device_mesh
            assert type(lm) is DeviceMesh and type(m) is FastDeviceMesh
            assert got.placements == sd[key].placements and torch.equal(got.to_local(), sd[key].to_local())
            assert got.shape == sd[key].shape and got.stride() == sd[key].stride()
            # the mesh answers as before saving, and as torch's mesh saved the same way
            assert lm == m and m == lm and lm == tm and lm == torch_back[key].device_mesh
            assert hash(lm) == hash(m) == hash(tm)
            assert _answers(lm) == _answers(m) == _answers(tm)
            assert lm._layout == m._layout and lm.ndim == m.ndim and lm.size() == m.size()
            # the groups exist here: the same ones, by name
            assert lm._dim_group_names == m._dim_group_names
            assert all(lm.get_group(i) is m.get_group(i) for i in range(m.ndim))
            assert [lm.get_local_rank(i) for i in range(m.ndim)] == [m.get_local_rank(i) for i in range(m.ndim)]
        # DTensors of one checkpoint share their root mesh, as torch's do
        assert back["dp_tp"].device_mesh._get_root_mesh() is back["root"].device_mesh
        assert back["dp_cp"].device_mesh._get_root_mesh() is back["root"].device_mesh
        # the mesh on its own, and DTensor's own pickling and copying
        assert _load(_save(ours)) == theirs
        again = pickle.loads(pickle.dumps(sd["dp_tp"]))
        assert again.device_mesh == ours["dp", "tp"] and torch.equal(again.to_local(), sd["dp_tp"].to_local())
        dc = copy.deepcopy(sd["dp_tp"])
        assert type(dc.device_mesh) is FastDeviceMesh and dc.device_mesh == ours["dp", "tp"]
        assert torch.equal(dc.to_local(), sd["dp_tp"].to_local())


_LOADER = textwrap.dedent(
    """
    import json, sys
    sys.modules["rankmesh"] = None  # rankmesh cannot be imported here
    import torch, torch.distributed as dist
    import torch.distributed.tensor  # as for any DTensor checkpoint (torch allowlists DTensor there)
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.distributed.device_mesh import init_device_mesh

    ours_file, torchs_file, expected_file = sys.argv[1:]
    expected = json.load(open(expected_file))
    dist.init_process_group("fake", rank=%(rank)d, world_size=%(world)d, store=FakeStore())
    ours = torch.load(ours_file, weights_only=True)
    torchs = torch.load(torchs_file, weights_only=True)
    built = init_device_mesh("cpu", %(shape)r, mesh_dim_names=%(names)r)
    built = {"root": built, "dp_tp": built["dp", "tp"], "tp": built["tp"], "dp_cp": built["dp", "cp"]._flatten("dp_cp")}
    for key, want in expected.items():
        m, tm = ours[key].device_mesh, torchs[key].device_mesh
        assert type(m) is torch.distributed.device_mesh.DeviceMesh, type(m)
        got = {
            "mesh": m.mesh.tolist(), "names": list(m.mesh_dim_names), "coordinate": list(m.get_coordinate()),
            "shape": list(m.shape), "layout": [[list(a.shape), list(a.stride)] for a in m._layout],
        }
        assert got == want["answers"], (key, got, want["answers"])
        assert m == tm and m == built[key] and hash(m) == hash(built[key]), key
        assert ours[key].to_local().tolist() == want["local"] == torchs[key].to_local().tolist(), key
        assert list(ours[key].placements) == list(torchs[key].placements), key
    try:
        import rankmesh  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("rankmesh was importable")
    assert not [n for n in sys.modules if n.startswith("rankmesh.")]
    print("LOADED", len(expected))
    """
)


def test_a_dtensor_checkpoint_loads_weights_only_where_rankmesh_is_absent(tmp_path):
    with fake_world(WORLD, RANK):
        ours = init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)
        theirs = torch_init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)
        sd = _state_dict(ours)
        for m in _meshes(ours).values():
            hash(m)  # cached here; the loading process hashes strings differently
        torch.save(sd, tmp_path / "ours.pt")
        torch.save(_state_dict(theirs), tmp_path / "torchs.pt")
        expected = {k: {"answers": _answers(m), "local": sd[k].to_local().tolist()} for k, m in _meshes(ours).items()}
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    script = _LOADER % {"rank": RANK, "world": WORLD, "shape": SHAPE, "names": NAMES}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONHASHSEED"] = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    run = subprocess.run(
        [sys.executable, "-c", script, *(str(tmp_path / f) for f in ("ours.pt", "torchs.pt", "expected.json"))],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"LOADED {len(expected)}" in run.stdout


def test_a_checkpoint_names_only_torch_classes_at_every_protocol():
    with fake_world(WORLD, RANK):
        ours = init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)
        sd = _state_dict(ours)
        buf = io.BytesIO(_save(sd))
        globals_in = torch.serialization.get_unsafe_globals_in_checkpoint(buf)
        assert globals_in == []  # every class the checkpoint names is one torch allowlists
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):  # torch's weights_only reads 2 and 3
            data = pickle.dumps(sd, protocol=protocol)
            assert b"rankmesh" not in data and pickle.loads(data)["tp"].device_mesh == ours["tp"]
