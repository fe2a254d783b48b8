"""The version gate of the fast meshes: a torch rankmesh does not know (or a failed self-check)
gives torch's own DeviceMesh with exactly one warning, never a wrong mesh; the examples in the
mesh layer's docs run; the one rule for which group serves a dim is what MeshBuilder follows.
"""

from __future__ import annotations

import doctest
import warnings

import pytest
import rankmesh
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from rankmesh import MeshLayout, _dependencies, _groups, _mesh_check, _once, mesh
from rankmesh._dependencies import release_of
from rankmesh.mesh import FastDeviceMesh, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import init_device_mesh as torch_init

from tests.conftest import fake_group_splits, fake_world


def _skip_unless_fake_backend_splits() -> None:
    import torch

    if not fake_group_splits(dist.distributed_c10d._get_default_group()):
        pytest.skip(f"the fake backend of torch {torch.__version__} cannot split (2.15's can)")


@pytest.fixture
def world8():
    with fake_world(8, 5):
        yield


def test_this_torch_is_supported_and_passes_the_self_check():
    assert release_of("torch") is not None
    assert _mesh_check._self_check() is None
    assert _mesh_check.fast_meshes_available()


def test_an_unknown_torch_falls_back_to_torchs_own_mesh_with_one_warning(world8, monkeypatch):
    monkeypatch.setitem(_dependencies._versions, "torch", "9.99.0")
    monkeypatch.setattr(_mesh_check, "_state", {})
    monkeypatch.setattr(_once, "_seen", set())
    unread = r"torch \S+ is not a version rankmesh has read \(supported: 2\.13, 2\.14, 2\.15\)"
    with pytest.warns(RuntimeWarning, match=unread):
        m = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    assert type(m) is DeviceMesh
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call must not warn again
        m2 = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    t = torch_init("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    for a in (m, m2):
        assert a.mesh.tolist() == t.mesh.tolist()
        assert a["tp"].mesh.tolist() == [4, 5, 6, 7]
        assert a.get_coordinate() == t.get_coordinate() == (1, 1)


def test_the_fallback_honours_a_rank_map(world8, monkeypatch):
    monkeypatch.setattr(_mesh_check, "_state", {"ok": False})
    rank_map = [7, 6, 5, 4, 3, 2, 1, 0]
    m = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"), rank_map=rank_map)
    assert type(m) is DeviceMesh
    assert m.mesh.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]


def test_a_failed_self_check_disables_the_fast_path(monkeypatch):
    monkeypatch.setattr(_mesh_check, "_REQUIRED_METHODS", ("_no_such_method",))
    reason = _mesh_check._self_check()
    assert reason is not None and "_no_such_method" in reason


def test_a_torch_whose_get_coordinate_reads_another_field_fails_the_self_check(monkeypatch):
    """rankmesh sets DeviceMesh._coordinate_on_dim, which torch's get_coordinate returns: a torch
    that renamed it would answer stale coordinates, so the self-check refuses it."""

    def get_coordinate(self):  # a torch that keeps the coordinate under another name
        return self._coordinate

    monkeypatch.setattr(DeviceMesh, "get_coordinate", get_coordinate)
    reason = _mesh_check._self_check()
    assert reason is not None and "_coordinate_on_dim (read by get_coordinate)" in reason


def test_the_fast_mesh_is_the_default_path(world8):
    m = rankmesh.init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
    assert type(m) is FastDeviceMesh and isinstance(m, DeviceMesh)


def test_fast_meshes_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match="init_device_mesh"):
        FastDeviceMesh("cpu", [0, 1])


@pytest.mark.parametrize("module", [mesh, _groups], ids=lambda m: m.__name__)
def test_mesh_layer_docstring_examples_run(module):
    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0
    assert result.failed == 0


def test_group_key_follows_torchs_default_group_rule():
    m = MeshLayout.world(8).unflatten("world", (1, 8), ("one", "all"))
    assert _groups.group_key(m, "all", world_size=8) == _groups.DEFAULT
    # an override is honoured, as torch does: a fake world-sized group, not the default group
    assert _groups.group_key(m, "all", world_size=8, fake=True)[1] == _groups.FAKE
    assert _groups.group_key(m, "all", world_size=8, backend="gloo")[1] == "gloo"
    # size-1 dims never communicate
    assert _groups.group_key(m, "one", world_size=8)[1] == _groups.FAKE


def test_split_group_with_the_narrowed_rank_table_equals_torchs_and_restores_it():
    """The split_group path (default group bound to a device), on the fake backend: the group
    made with the narrowed table has the same ranks and group rank as torch's own call, and the
    default group's full rank table is back afterwards, also when split_group raises."""
    import torch
    from rankmesh._fast_groups import narrowed_parent_ranks as _narrowed_parent_ranks

    W = 64
    with fake_world(W, 13):
        _skip_unless_fake_backend_splits()
        pg = dist.distributed_c10d._get_default_group()
        pg.bound_device_id = torch.device("cuda", 0)
        table = dist.distributed_c10d._world.pg_group_ranks
        full = table[pg]
        ranks = [5, 13, 21, 29]
        with _narrowed_parent_ranks(pg, ranks, W):
            assert table[pg] == {r: r for r in ranks}
            ours = dist.split_group(parent_pg=pg, split_ranks=[ranks])
        assert table[pg] is full and len(full) == W
        theirs = dist.split_group(parent_pg=pg, split_ranks=[ranks])
        assert dist.get_process_group_ranks(ours) == dist.get_process_group_ranks(theirs) == ranks
        assert dist.get_rank(ours) == dist.get_rank(theirs) == 1
        with pytest.raises(RuntimeError, match="boom"):
            with _narrowed_parent_ranks(pg, ranks, W):
                raise RuntimeError("boom")
        assert table[pg] is full
        # another parent than the default group is left alone
        sub = dist.new_group(list(range(32)), use_local_synchronization=True)
        with _narrowed_parent_ranks(sub, ranks, W):
            assert len(table[sub]) == 32


def test_fast_meshes_on_the_split_path_equal_the_new_group_path():
    """Same recipe, once with a (simulated) bound device and once without: same groups."""
    import torch

    def build(bound: bool):
        with fake_world(64, 21):
            if bound:
                _skip_unless_fake_backend_splits()
                dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
            world = init_device_mesh("cpu", (64,), mesh_dim_names=("world",))
            m = world._unflatten(0, (2, 4, 8), ("pp", "dp", "tp"), backend_override={"pp": "fake"})
            flat = m["dp", "tp"]._flatten("dp_tp")
            out = [dist.get_process_group_ranks(m.get_group(i)) for i in range(3)]
            out.append(dist.get_process_group_ranks(flat.get_group()))
            return out, m.build_report().method

    (split, method_s), (new, method_n) = build(True), build(False)
    assert (method_s, method_n) == ("split_group", "new_group")
    assert split == new
    assert split[2] == list(range(16, 24)) and split[1] == [5, 13, 21, 29]
