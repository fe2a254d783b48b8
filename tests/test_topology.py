"""rankmesh.topology: node spans against a brute-force reference, strict mode (the same verdict on
every rank), host lists and rank maps that follow the hardware, and the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rankmesh import MeshLayout
from rankmesh.errors import InvalidSizeError, RankmeshError, TopologyError, UnknownNameError
from rankmesh.single import single_mesh
from rankmesh.topology import (
    BANDWIDTH_HUNGRY,
    gpus_per_node_from_env,
    node_of_rank_from_hosts,
    rank_map_from_hosts,
    topology_report,
)


def test_report_basics():
    mesh = MeshLayout.world(64).unflatten("world", (4, 2, 8), ("dp", "cp", "tp"))
    rep = topology_report(mesh, rank=13, gpus_per_node=8)
    assert (rep.gpus_per_node, rep.num_nodes, rep.rank, rep.node) == (8, 8, 13, 1)
    by = {d.dim: d for d in rep.dims}
    assert by["tp"].intra_node and by["tp"].node_ids == (1,)
    assert by["cp"].nodes == 2 and by["cp"].node_ids == (0, 1)
    assert by["dp"].nodes == 4 and by["dp"].node_ids == (1, 3, 5, 7)
    assert rep.inside_node == ("tp",) and rep.across_nodes == ("dp", "cp")
    assert by["dp"].min_nodes is None and by["dp"].all_intra_node is None  # no whole-world check
    text = rep.format()
    assert "inside node 1" in text and "spans 4 nodes" in text and "rank 13 is on node 1" in text


def test_mapping_of_meshes_and_labels():
    world = MeshLayout.world(32)
    dense = world.unflatten("world", (4, 8), ("dp", "tp"))
    loss = dense["dp", "tp"].flatten("loss")
    rep = topology_report({"dense": dense, "loss": loss}, rank=5, gpus_per_node=8, whole_world=True)
    labels = [d.label for d in rep.dims]
    assert labels == ["dense.dp", "dense.tp", "loss"]  # a 1-D mesh named after its dim: bare name
    assert rep.dims[2].nodes == 4 and rep.dims[2].max_nodes == 4
    with pytest.raises(TopologyError):
        topology_report({"a": dense, "b": MeshLayout.world(16)}, rank=0, gpus_per_node=8)
    with pytest.raises(TypeError):
        topology_report({"a": "not a layout"}, rank=0, gpus_per_node=8)
    # an object with a .layout (SingleMesh) works too
    rep = topology_report(single_mesh(32, tp=8), rank=0, gpus_per_node=8)
    assert [d.dim for d in rep.dims] == ["dp_shard", "tp"]


def test_whole_world_sees_uneven_groups():
    """tp=6 on 8-GPU nodes: rank 0's group fits in node 0, rank 6's straddles nodes 0 and 1."""
    mesh = MeshLayout.world(48).unflatten("world", (8, 6), ("dp", "tp"))
    r0 = topology_report(mesh, rank=0, gpus_per_node=8, whole_world=True)
    r6 = topology_report(mesh, rank=6, gpus_per_node=8, whole_world=True)
    tp0, tp6 = r0.dims[1], r6.dims[1]
    assert tp0.nodes == 1 and tp6.nodes == 2
    assert (tp0.min_nodes, tp0.max_nodes) == (tp6.min_nodes, tp6.max_nodes) == (1, 2)
    assert tp0.all_intra_node is False
    assert "groups span 1-2 nodes" in r0.format()


@pytest.mark.parametrize("rank", [0, 6, 47])
def test_strict_mode_same_verdict_on_every_rank(rank):
    mesh = MeshLayout.world(48).unflatten("world", (8, 6), ("dp", "tp"))
    with pytest.raises(TopologyError) as e:
        topology_report(mesh, rank=rank, gpus_per_node=8, strict=True)
    assert e.value.field == "tp" and "bandwidth-hungry" in str(e.value)


def test_strict_mode_families():
    mesh = MeshLayout.world(64).unflatten("world", (2, 4, 8), ("cp", "ep", "tp"))
    topology_report(mesh, rank=0, gpus_per_node=8, strict=True)  # tp inside nodes: fine
    with pytest.raises(TopologyError, match="ep"):
        topology_report(mesh, rank=0, gpus_per_node=8, strict=True, strict_dims=("ep",))
    with pytest.raises(TopologyError, match="cp"):
        topology_report(mesh, rank=0, gpus_per_node=8, strict=True, strict_dims=("cp",))
    # etp belongs to the tp family
    sparse = MeshLayout.world(64).unflatten("world", (4, 16), ("ep", "etp"))
    with pytest.raises(TopologyError, match="etp"):
        topology_report(sparse, rank=0, gpus_per_node=8, strict=True)
    assert set(BANDWIDTH_HUNGRY) == {"tp", "ep", "cp"}
    for strict in (True, False):  # a name that is no family is never ignored
        with pytest.raises(UnknownNameError):
            topology_report(mesh, rank=0, gpus_per_node=8, strict=strict, strict_dims=("pp",))
    # not strict: the same layout only reports
    rep = topology_report(sparse, rank=0, gpus_per_node=8)
    assert [d.label for d in rep.violations()] == ["etp"]


@st.composite
def layouts(draw):
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4))
    world = math.prod(sizes)
    names = tuple(f"d{i}" for i in range(len(sizes)))
    lay = MeshLayout.world(world).unflatten("world", sizes, names)
    if len(sizes) >= 2 and draw(st.booleans()):
        pick = sorted(draw(st.permutations(range(len(sizes))))[: draw(st.integers(2, len(sizes)))])
        lay = lay[tuple(names[i] for i in pick)].flatten("f")
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    return lay, draw(st.sampled_from(divisors)), draw(st.integers(0, world - 1))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_node_spans_match_brute_force(case):
    lay, gpn, rank = case
    rep = topology_report(lay, rank=rank, gpus_per_node=gpn, whole_world=True)
    for d, name in zip(rep.dims, lay.names):
        rows = lay[name].groups().reshape(-1, int(lay.size(name)))
        spans = [len({int(r) // gpn for r in row}) for row in rows]
        mine = next(row for row in rows if rank in row)
        assert d.nodes == len({int(r) // gpn for r in mine})
        assert d.node_ids == tuple(sorted({int(r) // gpn for r in mine}))[:16]
        assert (d.min_nodes, d.max_nodes) == (min(spans), max(spans))


# -- hosts ---------------------------------------------------------------------------------------


def test_rank_map_from_hosts_round_robin():
    hosts = [f"h{r % 4}" for r in range(32)]  # a launcher that deals ranks round-robin
    rmap = rank_map_from_hosts(hosts)
    assert rmap.dtype == np.int32 and sorted(rmap.tolist()) == list(range(32))
    assert rmap[:8].tolist() == [0, 4, 8, 12, 16, 20, 24, 28]  # host h0's ranks first
    node_of, gpn = node_of_rank_from_hosts(hosts)
    assert gpn == 8 and node_of.tolist() == [r % 4 for r in range(32)]
    # identity placement: tp spans every host; host-aware placement: tp stays on one host
    plain = MeshLayout.world(32).unflatten("world", (4, 8), ("dp", "tp"))
    placed = MeshLayout.world(32, rank_map=rmap).unflatten("world", (4, 8), ("dp", "tp"))
    assert topology_report(plain, rank=5, hostnames=hosts).dims[1].nodes == 4
    rep = topology_report(placed, rank=5, hostnames=hosts, whole_world=True, strict=True)
    tp = rep.dims[1]
    assert tp.nodes == 1 and tp.max_nodes == 1 and rep.node == 1
    assert set(placed.group(5, "tp").tolist()) == {r for r in range(32) if r % 4 == 1}


def test_rank_map_from_hosts_contiguous_is_identity():
    hosts = ["a"] * 4 + ["b"] * 4
    assert rank_map_from_hosts(hosts).tolist() == list(range(8))
    # order of first appearance, not alphabetical
    assert rank_map_from_hosts(["z", "z", "a", "a"]).tolist() == [0, 1, 2, 3]


def test_hosts_errors():
    with pytest.raises(TopologyError, match="different numbers of ranks") as e:
        rank_map_from_hosts(["a", "a", "a", "b"])
    assert e.value.field == "hostnames" and "a: 3, b: 1" in str(e.value)
    with pytest.raises(TopologyError):
        rank_map_from_hosts([])
    with pytest.raises(TypeError):
        rank_map_from_hosts("abcd")
    with pytest.raises(TypeError):
        rank_map_from_hosts(["a", 1])
    mesh = MeshLayout.world(8).unflatten("world", (2, 4), ("dp", "tp"))
    with pytest.raises(TopologyError, match="8 ranks"):
        topology_report(mesh, rank=0, hostnames=["a", "b"])
    with pytest.raises(TopologyError, match="gpus_per_node"):
        topology_report(mesh, rank=0, gpus_per_node=2, hostnames=["a"] * 4 + ["b"] * 4)
    for err in (TopologyError,):
        assert issubclass(err, RankmeshError)


# -- gpus_per_node ---------------------------------------------------------------------------------


def test_gpus_per_node_from_env(monkeypatch):
    mesh = MeshLayout.world(16).unflatten("world", (4, 4), ("dp", "tp"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert gpus_per_node_from_env() == 4
    rep = topology_report(mesh, rank=0)
    assert rep.gpus_per_node == 4 and rep.dims[1].intra_node
    assert topology_report(mesh, rank=0, gpus_per_node=2).gpus_per_node == 2  # explicit wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(TopologyError, match="LOCAL_WORLD_SIZE"):
        topology_report(mesh, rank=0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(TopologyError):
        gpus_per_node_from_env()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert gpus_per_node_from_env() is None
    with pytest.raises(TopologyError, match="gpus_per_node is unknown"):
        topology_report(mesh, rank=0)


def test_gpus_per_node_errors():
    mesh = MeshLayout.world(12).unflatten("world", (3, 4), ("dp", "tp"))
    with pytest.raises(TopologyError, match="whole number"):
        topology_report(mesh, rank=0, gpus_per_node=8)
    with pytest.raises(InvalidSizeError):
        topology_report(mesh, rank=0, gpus_per_node=0)
    with pytest.raises(RankmeshError):
        topology_report(mesh, rank=12, gpus_per_node=4)


def test_large_world_caller_only():
    """1M ranks: the caller's report touches only its groups (no whole-world pass)."""
    world = 1 << 20
    mesh = MeshLayout.world(world).unflatten("world", (4, 2, world // 64, 8), ("pp", "dp_replicate", "fsdp", "tp"))
    rep = topology_report(mesh, rank=777_777, gpus_per_node=8)
    by = {d.dim: d for d in rep.dims}
    assert by["tp"].intra_node and by["pp"].nodes == 4 and by["fsdp"].nodes == world // 64
    assert len(by["fsdp"].node_ids) == 16  # listed ids are capped


def test_docstring_examples_run():
    import doctest

    import rankmesh.topology as module

    result = doctest.testmod(module, verbose=False, report=True)
    assert result.attempted > 0 and result.failed == 0
