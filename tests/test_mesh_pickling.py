"""Pickling and copying the fast meshes (helpers: tests/mesh_helpers.py).

A fast mesh pickles as torch's own ``DeviceMesh`` (so a checkpoint loads with
``weights_only=True`` where rankmesh is absent: tests/test_dtensor_checkpoint.py): the same
class and the same state as torch's ``__getstate__`` of the same mesh, and the same answers after
loading. Copies in the process (``copy.copy``, ``copy.deepcopy``) stay fast meshes and build
nothing world-sized.
"""

from __future__ import annotations

import copy
import copyreg
import pickle

import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.mesh import RANK_MAP_MATERIALISATIONS, FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import FAKE, MESHFAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    build_both,
)

pytestmark = MESH_MARKS


def _same_state(state: dict, torchs: dict) -> None:
    """``state`` holds exactly the fields of torch's ``__getstate__`` with equal values (the cached
    hash left to be recomputed where the mesh is loaded)."""
    assert set(state) == set(torchs), set(state) ^ set(torchs)
    for k, v in torchs.items():
        if k == "_hash":
            assert state[k] is None
        elif k == "_rank_map":
            assert state[k].dtype == v.dtype and torch.equal(state[k], v)
        elif k in ("_root_mesh", "_flatten_mapping"):
            assert state[k] == v  # meshes compare as torch's
        elif k == "_dim_group_names":  # rankmesh's groups, not torch's: as many, by name
            assert type(state[k]) is list and len(state[k]) == len(v) and all(type(n) is str for n in state[k])
        else:
            assert state[k] == v and type(state[k]) is type(v), k


def test_a_pickled_mesh_is_torchs_devicemesh_with_torchs_state_and_the_same_answers():
    perm = [3, 0, 6, 1, 7, 2, 4, 5]
    for rank in (0, 4):
        with fake_world(8, rank, MESHFAKE):
            o, t = build_both((2, 2, 2), ("dp", "cp", "tp"), perm, backend_override={"tp": FAKE})
            ours = [o, o["dp", "tp"], o["dp", "cp"]._flatten("dp_cp"), o._unflatten("tp", (2, 1), ("t0", "t1"))]
            theirs = [t, t["dp", "tp"], t["dp", "cp"]._flatten("dp_cp"), t._unflatten("tp", (2, 1), ("t0", "t1"))]
            for m, tm in zip(ours, theirs):
                _same_state(m.__getstate__(), tm.__getstate__())
                back = pickle.loads(pickle.dumps(m))
                assert type(back) is DeviceMesh and type(m) is FastDeviceMesh  # pickling changes nothing here
                assert back == m and m == back and hash(back) == hash(m)
                assert back == tm and hash(back) == hash(tm)
                assert back.mesh.tolist() == m.mesh.tolist() == tm.mesh.tolist()
                assert back.mesh_dim_names == m.mesh_dim_names and back._layout == m._layout
                assert back.get_coordinate() == m.get_coordinate() == tm.get_coordinate()
                assert back._dim_group_names == m._dim_group_names
                for i in range(m.ndim):
                    assert back.get_group(i) is m.get_group(i)
                    assert back.get_local_rank(i) == m.get_local_rank(i)
                # torch derives from it as from its own
                if m.ndim > 1:
                    n0, n1 = m.mesh_dim_names[:2]
                    assert back[n0, n1] == m[n0, n1] == tm[n0, n1]
                    assert back[n0, n1].mesh.tolist() == tm[n0, n1].mesh.tolist()
            # meshes pickled together keep one root, with its flattened meshes
            root, sub, flat, _ = pickle.loads(pickle.dumps(ours))
            assert sub._get_root_mesh() is root and flat._get_root_mesh() is root
            assert root["dp_cp"] == flat == theirs[2]
            # and one W-long rank map tuple, not one per mesh
            assert sub._flatten_rank_map is root._flatten_rank_map


def test_a_mesh_over_part_of_the_job_pickles_as_torchs_on_members_and_others():
    for rank in (9, 3):  # a member (coordinate (0, 1)) and a rank outside the mesh
        with fake_world(32, rank, MESHFAKE):
            m = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), ranks=range(8, 16))
            tm = DeviceMesh("cpu", torch.arange(8, 16).reshape(2, 4), mesh_dim_names=("dp", "tp"))
            _same_state(m.__getstate__(), tm.__getstate__())
            back = pickle.loads(pickle.dumps(m))
            assert type(back) is DeviceMesh and back == m and back == tm and hash(back) == hash(tm)
            assert back.get_coordinate() == tm.get_coordinate() == ((0, 1) if rank == 9 else None)
            assert back.mesh.tolist() == tm.mesh.tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]


def test_copies_stay_fast_meshes_and_build_nothing_world_sized():
    with fake_world(8, 5, MESHFAKE):
        o, t = build_both((2, 2, 2), ("dp", "cp", "tp"), backend_override={"tp": FAKE})
        flat = o["dp", "cp"]._flatten("dp_cp")
        assert o == t  # comparing with a torch mesh reads the world's rank map: once per world
        before = dict(RANK_MAP_MATERIALISATIONS)
        for m, tm in ((o, t), (o["dp", "tp"], t["dp", "tp"]), (flat, t["dp", "cp"]._flatten("dp_cp"))):
            for c in (copy.copy(m), copy.deepcopy(m)):
                assert type(c) is FastDeviceMesh and c is not m
                assert c == m and c == tm and c.mesh.tolist() == tm.mesh.tolist()
                assert c.get_coordinate() == tm.get_coordinate()
                assert all(c.get_group(i) is m.get_group(i) for i in range(m.ndim))
        assert RANK_MAP_MATERIALISATIONS == before
        # a deep copy of several meshes keeps one root, and stays derivable
        root, sub, f = copy.deepcopy([o, o["dp", "tp"], flat])
        assert type(root) is FastDeviceMesh and sub._get_root_mesh() is root and f._get_root_mesh() is root
        assert root["dp_cp"] == flat and root["cp", "tp"] == t["cp", "tp"]
        assert RANK_MAP_MATERIALISATIONS == before
        assert hash(copy.deepcopy(o)) == hash(o) == hash(t)


class _OldPickle:
    """Writes a fast mesh as rankmesh 0.1.0 pickled it: class FastDeviceMesh, rankmesh's own state."""

    def __init__(self, mesh: FastDeviceMesh) -> None:
        self.mesh = mesh

    def __reduce__(self):
        d = self.mesh.__dict__
        state = {k: v for k, v in d.items() if k not in ("_pg_registry", "_rm_world", "_hash")}
        state["_rm_world_state"] = (d["_rm_world"].layout, d["_rm_world"].rank)
        return (copyreg._reconstructor, (FastDeviceMesh, object, None), state)


def test_a_mesh_pickled_by_rankmesh_0_1_0_still_loads_as_a_fast_mesh():
    with fake_world(8, 6, MESHFAKE):
        o, t = build_both((2, 4), ("dp", "tp"))
        data = pickle.dumps(_OldPickle(o["tp"]))
        assert b"FastDeviceMesh" in data and b"_rm_world_state" in data
        back = pickle.loads(data)
        assert type(back) is FastDeviceMesh
        assert back == t["tp"] and back.mesh.tolist() == [4, 5, 6, 7] and back.get_coordinate() == (2,)
        assert back.get_group(0) is o["tp"].get_group(0)
