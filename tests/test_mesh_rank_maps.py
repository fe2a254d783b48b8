"""init_device_mesh with a rank map: every form torch takes gives torch's meshes, and a map that is
not a permutation of the world is refused (helpers: tests/mesh_helpers.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh.errors import (
    ArgumentTypeError,
    InvalidRankMapError,
    RankmeshError,
)
from rankmesh.mesh import init_device_mesh

from tests.conftest import fake_world
from tests.mesh_helpers import (
    MESH_MARKS,
    assert_same_mesh,
    build_both,
)

pytestmark = MESH_MARKS


@pytest.mark.parametrize(
    "rank_map",
    [
        [0, 0, 2, 3, 4, 5, 6, 7],  # a duplicate
        [1, 2, 3, 4, 5, 6, 7, 8],  # out of range
        [-1, 0, 1, 2, 3, 4, 5, 6],  # negative
        [0, 1, 2, 3, 4, 5, 6],  # too short
        [0, 1, 2, 3, 4, 5, 6, 7, 8],  # too long
        [[0, 1, 2, 3], [4, 5, 6, 7]],  # not 1-D
        torch.tensor([7, 6, 5, 4, 3, 2, 1, 1]),  # a tensor with a duplicate
    ],
)
def test_rank_map_that_is_not_a_permutation_raises_invalid_rank_map_error(rank_map):
    with fake_world(8, 2):
        with pytest.raises(InvalidRankMapError) as e:
            init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), rank_map=rank_map)
        assert isinstance(e.value, RankmeshError)
        assert e.value.field == "rank_map"
        assert "permutation" in str(e.value)


@pytest.mark.parametrize("rank_map", [[0.0, 1, 2, 3, 4, 5, 6, 7], torch.arange(8.0)], ids=["list", "tensor"])
def test_rank_map_of_floats_raises_argument_type_error(rank_map):
    # not integers: a type fault, by rankmesh._check's rule (the Rust core applies it to rank maps)
    with fake_world(8, 2):
        with pytest.raises(ArgumentTypeError) as e:
            init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), rank_map=rank_map)
        assert e.value.field == "rank_map" and e.value.value == 0.0


@pytest.mark.parametrize("form", [list, tuple, np.array, torch.tensor])
def test_rank_map_in_any_form_gives_torchs_mesh_of_the_permuted_tensor(form):
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    for rank in (0, 5, 7):
        with fake_world(8, rank):
            o, t = build_both((2, 2, 2), ("a", "b", "c"), perm, rank_map_form=form)
            assert_same_mesh(o, t, o, t)
            assert o._rank_map.tolist() == perm
            assert o["a", "c"].mesh.tolist() == t["a", "c"].mesh.tolist()
