"""``DeviceMesh._concatenate`` (FSDP2 joins its dp mesh and the parameters' TP/EP mesh with it) on
rankmesh's meshes, against torch's own function on torch's meshes of the same recipe.

rankmesh patches torch's class here (a static method called on ``DeviceMesh`` itself; no subclass
can override it): ``rankmesh.patches``' "concatenate". The patch hands over to
rankmesh only when every input is a rankmesh mesh of one world, and is never a wrong mesh:

- random worlds, rank maps, unflattens, slices and flattens; random lists of derived meshes
  (overlapping, repeated, unnamed, in any order): torch raises iff rankmesh does, with the same
  class and message, and otherwise every attribute of the result equals torch's;
- a mix of torch and rankmesh meshes, or meshes of another world, go to torch's own function;
- the patch is installed once, through the registry, keeps torch's function as ``__wrapped__``,
  the start-up self-check recognises torch's function by its body, and ``restore()`` brings
  torch's back;
- the hash of the world's rank-map tuple, computed natively, equals Python's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rankmesh import _mesh_check, _native, _torch_compat, patches
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh

from tests.conftest import fake_world, plant_body
from tests.mesh_helpers import MESH_MARKS, assert_same_mesh, build_both, outcome

pytestmark = MESH_MARKS


@st.composite
def recipes(draw):
    """A root shape (2-4 dims, world <= 48), an optional rank map, and 1-3 pieces to concatenate
    in any order, each a slice of the mesh (names in mesh order) or a flatten of one."""
    shape = [draw(st.sampled_from([2, 3, 4])) for _ in range(draw(st.integers(2, 4)))]
    while math.prod(shape) > 48:
        shape.pop()
    names = tuple(f"d{i}" for i in range(len(shape)))
    perm = draw(st.none() | st.permutations(range(math.prod(shape))))
    pieces = []
    for _ in range(draw(st.integers(1, 3))):
        k = draw(st.integers(1, len(names)))
        picked = sorted(draw(st.permutations(names))[:k], key=names.index)
        pieces.append((tuple(picked), draw(st.booleans()) and k > 1))
    rank = draw(st.integers(0, math.prod(shape) - 1))
    return shape, names, perm, pieces, rank


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipes())
def test_concatenate_equals_torchs_or_raises_what_torch_raises(recipe):
    shape, names, perm, pieces, rank = recipe
    with fake_world(math.prod(shape), rank):
        ours_root, theirs_root = build_both(tuple(shape), names, perm)
        ours_in = [ours_root[p] if p != names else ours_root for p, _ in pieces]
        theirs_in = [theirs_root[p] if p != names else theirs_root for p, _ in pieces]
        for i, (p, flat) in enumerate(pieces):
            if flat:
                ours_in[i] = ours_in[i]._flatten(f"f{i}")
                theirs_in[i] = theirs_in[i]._flatten(f"f{i}")
        ours, ours_e = outcome(lambda: DeviceMesh._concatenate(ours_in))
        theirs, theirs_e = outcome(lambda: DeviceMesh._concatenate.__wrapped__(theirs_in))
        if theirs_e is not None:
            event(f"torch raises {type(theirs_e).__name__}")
            assert type(ours_e) is type(theirs_e) and str(ours_e) == str(theirs_e), (ours_e, theirs_e)
            return
        assert ours_e is None, ours_e
        all_names = [n for m in ours_in for n in m.mesh_dim_names]
        if len(set(all_names)) < len(all_names):  # a repeated name: torch's own mesh, as torch makes it
            event("repeated name: torch's mesh")
            assert type(ours) is DeviceMesh and ours == theirs
            return
        event(f"rankmesh's mesh of {ours.ndim} dims")
        assert_same_mesh(ours, theirs, ours_root, theirs_root)


@pytest.mark.parametrize("rank", [0, 5, 23])
def test_fsdp2s_concatenations_are_fast_meshes_equal_to_torchs(rank):
    with fake_world(24, rank):
        ours_root, theirs_root = build_both((2, 3, 4), ("dp_replicate", "fsdp", "tp"))
        for keys in ([("dp_replicate",), ("fsdp",)], [("dp_replicate", "fsdp"), ("tp",)], [("fsdp",), ("tp",)]):
            ours = DeviceMesh._concatenate([ours_root[k] for k in keys])
            theirs = DeviceMesh._concatenate([theirs_root[k] for k in keys])
            assert type(ours) is FastDeviceMesh and type(theirs) is DeviceMesh
            assert_same_mesh(ours, theirs, ours_root, theirs_root)
            # the parts keep their process groups: no group is created
            assert ours._dim_group_names == [n for k in keys for n in ours_root[k]._dim_group_names]


def test_a_mix_of_torch_and_rankmesh_meshes_is_torchs_own_concatenation():
    with fake_world(8, 3):
        ours_root, theirs_root = build_both((2, 4), ("dp", "tp"))
        mixed = DeviceMesh._concatenate([ours_root["dp"], theirs_root["tp"]])
        assert type(mixed) is DeviceMesh  # torch's path, torch's result
        assert mixed == DeviceMesh._concatenate.__wrapped__([theirs_root["dp"], theirs_root["tp"]])


def test_meshes_of_another_world_go_to_torch_which_refuses_them():
    with fake_world(8, 3):
        a = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        b = init_device_mesh("cpu", (2, 4), mesh_dim_names=("x", "y"), rank_map=[7, 6, 5, 4, 3, 2, 1, 0])
        with pytest.raises(RuntimeError, match="different device meshes|different device meshs"):
            DeviceMesh._concatenate([a["dp"], b["y"]])
        # same world (equal rank maps) from two init calls: rankmesh's, like torch accepts it
        c = init_device_mesh("cpu", (2, 4), mesh_dim_names=("p", "q"))
        joined = DeviceMesh._concatenate([a["dp"], c["q"]])
        assert type(joined) is FastDeviceMesh and joined.mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_patch_is_installed_once_and_wraps_torchs_function():
    with fake_world(4, 0):
        init_device_mesh("cpu", (4,), mesh_dim_names=("w",))
    patched = DeviceMesh.__dict__["_concatenate"]
    assert isinstance(patched, staticmethod)
    assert patched.__func__.__wrapped__ is _torch_compat._TORCH_CONCATENATE.__func__
    patch = patches.get("concatenate")
    assert patch.installed and "concatenate" in patches.installed()
    assert patch.install() is True  # idempotent: nothing changes
    assert DeviceMesh.__dict__["_concatenate"] is patched
    assert _mesh_check.CONCATENATE_CODE.recognise() is None  # the self-check recognises torch's function
    patch.restore()  # stock torch's function is back, and torch's own result comes out
    try:
        assert DeviceMesh.__dict__["_concatenate"] is _torch_compat._TORCH_CONCATENATE
        with fake_world(8, 5):
            m = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
            assert patch.installed  # the first fast mesh installs it again
            patch.restore()
            assert type(DeviceMesh._concatenate([m["dp"], m["tp"]])) is DeviceMesh
    finally:
        patch.install()
    assert DeviceMesh.__dict__["_concatenate"].__func__.__wrapped__ is _torch_compat._TORCH_CONCATENATE.__func__


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.none() | st.permutations(range(n)).map(list) | st.just(n)))
def test_native_rank_map_hash_equals_pythons_tuple_hash(perm):
    if perm is None or isinstance(perm, int):
        n = 17 if perm is None else perm
        assert _native.MeshLayout.world(n).rank_map_tuple_hash() == hash(tuple(range(n)))
    else:
        layout = _native.MeshLayout.world(len(perm), np.array(perm))
        assert layout.rank_map_tuple_hash() == hash(tuple(perm))
    assert _torch_compat.native_tuple_hash_ok()


def test_hash_of_a_fast_mesh_equals_torchs_without_building_the_rank_map():
    from rankmesh.mesh import RANK_MAP_MATERIALISATIONS

    with fake_world(1 << 16, 77):
        ours = init_device_mesh("cpu", (256, 256), mesh_dim_names=("a", "b"))
        before = dict(RANK_MAP_MATERIALISATIONS)
        h = hash(ours["b"])
        assert RANK_MAP_MATERIALISATIONS == before
        theirs = torch.distributed.device_mesh.init_device_mesh("cpu", (256, 256), mesh_dim_names=("a", "b"))
        assert h == hash(theirs["b"])
    assert dist.is_initialized() is False


def test_a_concatenate_whose_body_rankmesh_has_not_read_turns_the_fast_meshes_off(monkeypatch):
    """torch's ``_concatenate`` is recognised by the hash of its body, per release: another body (a
    torch that reads other fields of the meshes it joins) fails the start-up self-check, and the
    patch stays out."""
    plant_body(monkeypatch, "torch", "torch.distributed.device_mesh.DeviceMesh._concatenate")
    unknown = "torch.distributed.device_mesh.DeviceMesh._concatenate has a body rankmesh does not know (hash "
    assert _mesh_check.CONCATENATE_CODE.recognise().startswith(unknown)
    assert unknown in _mesh_check._self_check()
    monkeypatch.setattr(_mesh_check, "_state", {"ok": True})  # as decided before: the patch's own check
    assert patches.get("concatenate").recognise().startswith(unknown)
