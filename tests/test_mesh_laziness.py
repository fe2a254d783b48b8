"""Laziness at 2**20 ranks: nothing world-sized is built per mesh, only where torch's API hands out
a world-sized object (helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import FAKE, fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
)

pytestmark = MESH_MARKS


def _titan_meshes(m: DeviceMesh) -> list[DeviceMesh]:
    """torchtitan's derivations of a (pp, dp_replicate, dp_shard, cp, tp) mesh."""
    dp = m["dp_replicate", "dp_shard", "cp"]
    fsdp = m["dp_shard", "cp"]._flatten("fsdp")
    return [
        dp,
        dp._flatten("dp_cp"),
        fsdp,
        m["tp"],
        m["pp", "tp"],
        fsdp._unflatten(0, (16, 16), ("f0", "f1")),
        m._unflatten("dp_shard", (8, 8), ("efsdp", "ep"))["efsdp", "ep"],
        m["dp_replicate", "dp_shard"]._flatten("hsdp", backend_override=FAKE),
    ]


@pytest.mark.parametrize("permuted", [False, True], ids=["identity", "rank_map"])
def test_a_million_rank_world_is_built_and_sliced_without_materialising_the_rank_map(permuted):
    W, rank = 2**20, 12345
    sizes = dict(pp=8, dp_replicate=16, dp_shard=64, cp=4, tp=32)
    shape = tuple(sizes.values())
    perm = np.random.default_rng(1).permutation(W).astype(np.int32) if permuted else None
    index = int(np.flatnonzero(perm == rank)[0]) if permuted else rank  # where this rank sits
    placed = perm if permuted else np.arange(W, dtype=np.int32)
    with fake_world(W, rank):
        world = init_device_mesh("cpu", (W,), mesh_dim_names=("world",), rank_map=perm)
        dense = world._unflatten(0, shape, tuple(sizes))
        first = [world, dense, *_titan_meshes(dense)]
        root = init_device_mesh("cpu", shape, mesh_dim_names=tuple(sizes), rank_map=perm)
        second = [root, *_titan_meshes(root)]
        for m in first + second:
            assert isinstance(m, FastDeviceMesh)
            m.get_coordinate(), m.mesh, m.get_group(0), m.get_local_rank(0)
        assert dense["tp"] == dense["tp"] and dense["tp"] != dense["cp"]
        assert world.get_coordinate() == (index,) and world.get_local_rank() == rank
        coord = tuple(int(c) for c in np.unravel_index(index, shape))
        assert dense.get_coordinate() == root.get_coordinate() == coord
        full = placed.reshape(shape)
        pp, dr, ds, cp, tp = coord
        assert dense["tp"].mesh.tolist() == root["tp"].mesh.tolist() == full[pp, dr, ds, cp, :].tolist()
        assert dense["pp", "tp"].mesh.tolist() == full[:, dr, ds, cp, :].tolist()
        assert dense["dp_shard", "cp"]._flatten("fsdp").mesh.tolist() == full[pp, dr, :, :, tp].reshape(-1).tolist()
        assert all(m.mesh.numel() < W for m in first[2:] + second[1:])
        for m in first + second:
            assert m._rm_world._rank_map_tuple is None and m._rm_world._rank_map is None
        # _flatten_rank_map: made once per world, on demand, the same object on every mesh of it
        flat = dense["tp"]._flatten_rank_map
        assert isinstance(flat, tuple) and len(flat) == W
        assert flat[index] == rank and flat[:5] == tuple(placed[:5].tolist()) and flat[-1] == placed[-1]
        for m in first:
            assert m._flatten_rank_map is flat
        assert root._rm_world._rank_map_tuple is None  # another world: another init_device_mesh call
        assert root._flatten_rank_map is not flat and root._flatten_rank_map == flat
