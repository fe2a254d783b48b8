"""Pickling the fast meshes: a round trip gives a mesh equal to torch's, in the same world
(helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import copy
import pickle

import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.mesh import FastDeviceMesh

from tests.conftest import FAKE, MESHFAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    build_both,
)

pytestmark = MESH_MARKS


def test_pickled_root_slice_and_flattened_meshes_come_back_equal_with_their_groups():
    perm = [3, 0, 6, 1, 7, 2, 4, 5]
    for rank in (0, 4):
        with fake_world(8, rank, MESHFAKE):
            o, t = build_both((2, 2, 2), ("dp", "cp", "tp"), perm, backend_override={"tp": FAKE})
            ours = [o, o["dp", "tp"], o["dp", "cp"]._flatten("dp_cp"), o._unflatten("tp", (2, 1), ("t0", "t1"))]
            theirs = [t, t["dp", "tp"], t["dp", "cp"]._flatten("dp_cp"), t._unflatten("tp", (2, 1), ("t0", "t1"))]
            for m, tm in zip(ours, theirs):
                back = pickle.loads(pickle.dumps(m))
                assert type(back) is FastDeviceMesh
                assert back == m and hash(back) == hash(m)
                assert back == tm and hash(back) == hash(tm)
                assert back.mesh.tolist() == m.mesh.tolist()
                assert back.mesh_dim_names == m.mesh_dim_names and back._layout == m._layout
                assert back.get_coordinate() == m.get_coordinate()
                for i in range(m.ndim):
                    assert back.get_group(i) is m.get_group(i)
                    assert back.get_local_rank(i) == m.get_local_rank(i)
                # still derivable after the round trip
                if m.ndim > 1:
                    n0, n1 = m.mesh_dim_names[:2]
                    assert back[n0, n1] == m[n0, n1] and back[n0, n1] == tm[n0, n1]
                # deepcopy goes the same way
                dc = copy.deepcopy(m)
                assert type(dc) is FastDeviceMesh and dc == m and dc.mesh.tolist() == m.mesh.tolist()
                assert all(dc.get_group(i) is m.get_group(i) for i in range(m.ndim))
            # meshes pickled together keep one root
            root, sub, flat, _ = pickle.loads(pickle.dumps(ours))
            assert sub._get_root_mesh() is root and flat._get_root_mesh() is root
            assert root["dp_cp"] == flat
