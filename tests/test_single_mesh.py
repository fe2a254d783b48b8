"""rankmesh.single: the single-mesh convention, layout-level against a plain numpy reference
(``np.arange(W).reshape(shape)``), its errors, and the helpers on a real DeviceMesh."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from rankmesh.errors import InvalidSizeError, ParallelConfigError, RankmeshError, SizeMismatchError
from rankmesh.single import (
    SINGLE_MESH_ORDER,
    get_dp_info,
    get_dp_mesh,
    get_ep_mesh,
    get_pp_mesh,
    get_tp_mesh,
    single_mesh,
)

from tests.conftest import fake_world


def reference_names(world, pp, dp_replicate, dp_shard, ep, tp):
    """The convention spelled out independently of the implementation."""
    if dp_shard == -1:
        dp_shard = world // (pp * dp_replicate * ep * tp)
    deg = dict(pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, ep=ep, tp=tp)
    names = [n for n in ("pp", "dp_replicate", "dp_shard", "ep", "tp") if deg[n] > 1]
    if (tp > 1 or ep > 1) and "dp_shard" not in names:
        names.insert(len([n for n in names if n in ("pp", "dp_replicate")]), "dp_shard")
    if not names:
        names = ["dp_shard"]
    return tuple(names)


CASES = [
    # world, pp, dp_replicate, dp_shard, ep, tp -> names
    (1, 1, 1, -1, 1, 1),
    (8, 1, 1, -1, 1, 1),
    (8, 1, 1, -1, 1, 8),
    (8, 1, 1, 1, 8, 1),
    (8, 8, 1, -1, 1, 1),
    (16, 2, 2, -1, 1, 1),
    (16, 2, 1, 1, 2, 4),
    (64, 2, 2, -1, 1, 4),
    (64, 2, 2, 2, 2, 4),
    (96, 3, 2, -1, 2, 2),
    (128, 4, 1, 2, 4, 4),
    (240, 2, 3, 5, 2, 4),
    (1024, 4, 2, -1, 8, 8),
]


@pytest.mark.parametrize("world, pp, dp_replicate, dp_shard, ep, tp", CASES)
def test_layout_matches_numpy_reference(world, pp, dp_replicate, dp_shard, ep, tp):
    m = single_mesh(world, pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, ep=ep, tp=tp)
    names = reference_names(world, pp, dp_replicate, dp_shard, ep, tp)
    assert m.names == names
    shape = tuple(m.degrees[n] for n in names)
    assert m.shape == shape and m.layout.shape == shape and m.layout.names == names
    assert int(np.prod(shape)) == world
    ref = np.arange(world).reshape(shape)
    rng = np.random.default_rng(world)
    ranks = range(world) if world <= 128 else rng.integers(0, world, 64)
    for d, name in enumerate(names):
        # every group of the dim, in torch's order: the other dims row-major, the dim last
        expected = np.moveaxis(ref, d, -1).reshape(-1, shape[d])
        assert np.array_equal(m.layout[name].groups().reshape(-1, shape[d]), expected), name
        for r in ranks:
            coord = np.unravel_index(int(r), shape)
            idx = list(coord)
            idx[d] = slice(None)
            assert m.group(int(r), name).tolist() == ref[tuple(idx)].tolist(), (name, r)
    for r in ranks:
        assert m.layout.coordinate_of(int(r)) == tuple(int(c) for c in np.unravel_index(int(r), shape))


def test_every_small_config_keeps_the_rules():
    """All degree combinations of a 48-rank world: the kept dims follow the rules exactly."""
    world = 48
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    seen = 0
    for pp, rep, ep, tp in itertools.product(divisors, repeat=4):
        if world % (pp * rep * ep * tp):
            continue
        m = single_mesh(world, pp=pp, dp_replicate=rep, ep=ep, tp=tp)
        seen += 1
        shard = world // (pp * rep * ep * tp)
        assert m.dp_shard == shard and m.dp_size == rep * shard
        deg = dict(pp=pp, dp_replicate=rep, dp_shard=shard, ep=ep, tp=tp)
        assert [n for n in m.names] == [n for n in SINGLE_MESH_ORDER if n in m.names]  # order kept
        for n in SINGLE_MESH_ORDER:
            keep = deg[n] > 1 or (n == "dp_shard" and (tp > 1 or ep > 1))
            assert (n in m.names) == keep or (m.names == ("dp_shard",) and n == "dp_shard"), (deg, m.names)
        if all(v == 1 for k, v in deg.items() if k != "dp_shard") and shard == 1:
            assert m.names == ("dp_shard",)
        assert np.array_equal(m.layout.groups().reshape(-1), np.arange(world))
    assert seen > 50


def test_all_ones_is_a_flat_dp_shard_mesh():
    m = single_mesh(1)
    assert m.names == ("dp_shard",) and m.shape == (1,)
    m = single_mesh(8, dp_shard=8)
    assert m.names == ("dp_shard",) and m.shape == (8,)
    assert get_dp_info(m, rank=5) == (5, 8)


def test_dp_shard_kept_at_one_next_to_tp_or_ep():
    assert single_mesh(8, tp=8).names == ("dp_shard", "tp")
    assert single_mesh(8, tp=8).shape == (1, 8)
    assert single_mesh(8, ep=8).names == ("dp_shard", "ep")
    assert single_mesh(16, pp=2, tp=8).names == ("pp", "dp_shard", "tp")
    assert single_mesh(16, dp_replicate=2, tp=8).names == ("dp_replicate", "dp_shard", "tp")
    assert single_mesh(8, pp=8).names == ("pp",)  # no tp/ep: no dp_shard of size 1
    assert single_mesh(16, pp=2, dp_replicate=8).names == ("pp", "dp_replicate")


def test_ep_is_a_factor_of_the_world():
    m = single_mesh(64, ep=4, tp=2)
    assert m.dp_shard == 8 and m.shape == (8, 4, 2) and m.names == ("dp_shard", "ep", "tp")
    assert m.group(13, "ep").tolist() == [9, 11, 13, 15]


def test_helpers_on_layouts():
    m = single_mesh(64, pp=2, dp_replicate=2, tp=4)
    assert get_tp_mesh(m).names == ("tp",) and get_tp_mesh(m.layout).shape == (4,)
    assert get_pp_mesh(m).shape == (2,)
    dp = get_dp_mesh(m)
    assert dp.names == ("dp_replicate", "dp_shard") and dp.shape == (2, 4)
    assert get_ep_mesh(m) is None
    ref = np.arange(64).reshape(2, 2, 4, 4)
    for r in range(64):
        p, a, b, t = np.unravel_index(r, (2, 2, 4, 4))
        assert get_dp_info(m, rank=r) == (a * 4 + b, 8)
        assert get_dp_info(m.layout, rank=r) == (a * 4 + b, 8)
        assert dp.group(r, "dp_shard").tolist() == ref[p, a, :, t].tolist()
    only_rep = single_mesh(16, pp=2, dp_replicate=8)
    assert get_dp_mesh(only_rep).names == ("dp_replicate",)
    assert get_dp_info(only_rep, rank=13) == (5, 8)
    no_dp = single_mesh(8, pp=8)
    assert get_dp_mesh(no_dp) is None and get_tp_mesh(no_dp) is None
    assert get_dp_info(no_dp, rank=3) == (0, 1)
    with pytest.raises(TypeError):
        get_dp_info(m.layout)  # a layout needs the rank
    with pytest.raises(TypeError):
        get_tp_mesh(object())


def test_rank_map():
    perm = np.random.default_rng(0).permutation(16)
    m = single_mesh(16, dp_replicate=2, tp=8, rank_map=perm)
    plain = single_mesh(16, dp_replicate=2, tp=8)
    assert np.array_equal(m.layout["tp"].groups(), perm[plain.layout["tp"].groups()])


@pytest.mark.parametrize(
    "kwargs, cls, field",
    [
        (dict(world_size=8, cp=2), ParallelConfigError, "cp"),
        (dict(world_size=8, tp=3), SizeMismatchError, "dp_shard"),  # -1 cannot fill 8/3
        (dict(world_size=8, tp=2, dp_shard=2), SizeMismatchError, "world_size"),
        (dict(world_size=8, tp=0), InvalidSizeError, "tp"),
        (dict(world_size=8, pp=-2), InvalidSizeError, "pp"),
        (dict(world_size=8, dp_shard=0), InvalidSizeError, "dp_shard"),
        (dict(world_size=8, dp_shard=-2), InvalidSizeError, "dp_shard"),
        (dict(world_size=8, dp_replicate=0), InvalidSizeError, "dp_replicate"),
        (dict(world_size=8, ep=0), InvalidSizeError, "ep"),
        (dict(world_size=0), InvalidSizeError, "world_size"),
        (dict(world_size=8, cp=0), InvalidSizeError, "cp"),
    ],
)
def test_errors(kwargs, cls, field):
    with pytest.raises(cls) as e:
        single_mesh(**kwargs)
    assert isinstance(e.value, RankmeshError) and e.value.field == field
    assert str(e.value)


def test_cp_error_says_what_to_do():
    with pytest.raises(ParallelConfigError, match="torchtitan or megatron"):
        single_mesh(16, cp=2, tp=2)
    assert isinstance(pytest.raises(ParallelConfigError, single_mesh, 16, cp=2).value, RuntimeError)


def test_type_errors():
    with pytest.raises(TypeError):
        single_mesh(8, tp=2.0)
    with pytest.raises(TypeError):
        single_mesh(8, tp=True)


# -- DeviceMesh through the torch layer (fake backend, in this process) ----------------------------


@pytest.mark.parametrize("rank", [0, 13, 63])
def test_device_mesh_and_helpers(rank):
    m = single_mesh(64, pp=2, dp_replicate=2, tp=4)
    with fake_world(64, rank):  # skips without torch
        import torch.distributed as dist
        from rankmesh import FastDeviceMesh, MeshBuilder

        builder = MeshBuilder(m.layout.world_layout())
        dm = FastDeviceMesh.from_layout(builder, m.layout)
        assert tuple(dm.mesh_dim_names) == m.names and tuple(dm.shape) == m.shape
        assert tuple(dm.get_coordinate()) == m.layout.coordinate_of(rank)
        for name in m.names:
            assert sorted(dist.get_process_group_ranks(dm.get_group(name))) == m.group(rank, name).tolist()
        assert get_dp_info(dm) == get_dp_info(m, rank=rank)
        assert get_dp_info(dm, rank=rank) == get_dp_info(m, rank=rank)
        assert get_tp_mesh(dm).mesh.tolist() == m.group(rank, "tp").tolist()
        assert tuple(get_dp_mesh(dm).mesh_dim_names) == ("dp_replicate", "dp_shard")
        assert get_pp_mesh(dm).size() == 2 and get_ep_mesh(dm) is None
        with pytest.raises(ValueError):
            get_dp_info(dm, rank=(rank + 1) % 64)


def test_device_mesh_keeps_size_one_dp_shard():
    m = single_mesh(16, pp=2, tp=8)
    with fake_world(16, 9):
        from rankmesh import FastDeviceMesh, MeshBuilder

        dm = FastDeviceMesh.from_layout(MeshBuilder(m.layout.world_layout()), m.layout)
        assert tuple(dm.mesh_dim_names) == ("pp", "dp_shard", "tp") and tuple(dm.shape) == (2, 1, 8)
        assert get_dp_info(dm) == (0, 1)
        assert dm["dp_shard"].size() == 1


def test_docstring_examples_run():
    import doctest

    import rankmesh.single as module

    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0
