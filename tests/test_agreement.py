"""Nothing hangs: every rank of a world takes the same collective steps, on every road
(tests/agreement.py: the recorder, the roads and the checks).

- every road over all ranks of 2^8-rank worlds on 20 random configurations each (size-1 dims,
  ``backend_override``, partial worlds, hot spares and shrinks), on the ``new_group`` path and,
  where torch's fake group can split (torch 2.15), on the ``split_group`` path of a bound device;
- every road over all ranks of one 2^12-rank world (the split path where it runs, else new_group);
- mutations: two dims' groups swapped on one rank, a NOCOLOR split skipped by one non-member, one
  rank refusing alone: each is caught, naming the road, the rank and the step;
- the checker's own misuse: an unknown road, a world too large for the time asked.
"""

from __future__ import annotations

import importlib.util
import random

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests import agreement  # noqa: E402
from tests.agreement import ROADS, Disagreement, Road, check_road  # noqa: E402
from tests.conftest import fake_group_splits, fake_world  # noqa: E402


def _can_split() -> bool:
    with fake_world(2, 0, "meshfakesplit") as pg:
        return fake_group_splits(pg)


SPLITS = _can_split()
PATHS = ["new_group", "split"] if SPLITS else ["new_group"]


def _needs(road: str) -> None:
    needs = ROADS[road].needs
    if needs and importlib.util.find_spec(needs.rpartition(".")[0]) is None:
        pytest.skip(f"road {road!r} needs {needs}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("road", list(ROADS))
def test_every_rank_of_2_8_worlds_agrees_on_20_random_configurations(road, path):
    _needs(road)
    for seed in range(20):
        cfg = ROADS[road].config(random.Random(seed), 256)
        got = check_road(road, 256, cfg, split=path == "split")
        assert got["ranks"] == agreement.world_of(road, 256, cfg)
        assert got["member_groups"] > 0 or got["world_steps"] > 0, (road, cfg)  # something was checked
        if path == "split":
            assert got["world_steps"] > 0, (road, cfg)


@pytest.mark.parametrize("road", list(ROADS))
def test_every_rank_of_a_2_12_world_agrees(road):
    _needs(road)
    cfg = ROADS[road].config(random.Random(2**12), 2**12)
    got = check_road(road, 2**12, cfg, split=SPLITS)
    assert got["ranks"] == agreement.world_of(road, 2**12, cfg)


# -- mutations ---------------------------------------------------------------------------------------------

SHAPE, NAMES = (4, 8, 8), ("pp", "dp", "tp")


def _builder_road(order):
    """Each rank makes its own group of each dim with one MeshBuilder, in ``order(rank)``."""

    def road(world: int, rank: int, cfg: dict) -> None:
        from rankmesh import MeshLayout
        from rankmesh.process_groups import MeshBuilder

        layout = MeshLayout.world(world).unflatten("world", SHAPE, NAMES)
        builder = MeshBuilder(MeshLayout.world(world))
        for name in order(rank):
            builder.process_group(layout, name)

    return road


@pytest.mark.parametrize("path", PATHS)
def test_two_dims_swapped_on_one_rank_are_caught_naming_the_road_rank_and_step(path, monkeypatch):
    straight = Road(_builder_road(lambda rank: NAMES), lambda rng, w: {})
    monkeypatch.setitem(ROADS, "builder", straight)
    check_road("builder", 256, {}, split=path == "split")  # in order on every rank: they agree
    swapped = _builder_road(lambda rank: ("pp", "tp", "dp") if rank == 37 else NAMES)
    with pytest.raises(Disagreement, match=r"^road 'builder': rank \d+, step \S+: ") as e:
        check_road("builder", 256, {}, split=path == "split", mutate=lambda rank: swapped if rank == 37 else None)
    assert "rank 37" in str(e.value) or "37" in str(e.value), str(e.value)


@pytest.mark.parametrize("path", PATHS)
def test_a_non_member_that_skips_a_partial_mesh_is_caught(path):
    cfg = {"start": 0, "size": 128, "tp": 4, "teachers": False}
    check_road("partial", 256, cfg, split=path == "split")

    def skip(world: int, rank: int, cfg: dict) -> None:
        return None  # rank 200 is outside the students' mesh: it skips its NOCOLOR split / naming steps

    with pytest.raises(Disagreement, match=r"^road 'partial': rank 200, step ") as e:
        check_road("partial", 256, cfg, split=path == "split", mutate=lambda rank: skip if rank == 200 else None)
    want = "world-collective steps" if path == "split" else "group counter"
    assert want in str(e.value), str(e.value)


def test_a_configuration_refused_on_every_rank_alike_passes_and_one_rank_refusing_alone_fails():
    bad = {"shape": [3, 100], "names": ["dp", "tp"], "override": {}, "flatten": False}  # 300 != 256
    got = check_road("tree", 256, bad)
    assert got["member_groups"] == 0

    def refuse(world: int, rank: int, cfg: dict) -> None:
        raise ValueError("only this rank refuses")

    good = ROADS["tree"].config(random.Random(1), 256)
    with pytest.raises(
        Disagreement, match=r"^road 'tree': rank 5, step end: raised ValueError where rank 0 raised nothing"
    ):
        check_road("tree", 256, good, mutate=lambda rank: refuse if rank == 5 else None)


def test_the_checkers_misuse_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown road 'nosuch'; the roads are tree, partial"):
        check_road("nosuch", 256, {})
    cfg = ROADS["parallel_dims"].config(random.Random(0), 2**20)
    with pytest.raises(
        ValueError, match=r"road 'parallel_dims' at world 1,048,576 would take ~\d+ s .* over the 1 s asked"
    ):
        check_road("parallel_dims", 2**20, cfg, budget_s=1)
    assert not dist.is_initialized()


def test_the_recorder_changes_no_decision_it_only_watches_the_transport():
    """The recorder wraps torch's transport (ProcessGroup.split_group, _new_process_group_helper)
    and restores both; rankmesh's own functions are never touched."""
    import rankmesh.process_groups as pg
    from rankmesh import _fast_groups
    from torch.distributed import distributed_c10d as c10d

    def watched() -> tuple:
        return (
            dist.ProcessGroup.__dict__["split_group"],  # the class's own entry, which binds self
            c10d._new_process_group_helper,
            pg.MeshBuilder.process_group,
            _fast_groups.new_member_group,
            _fast_groups.split_member_group,
        )

    before = watched()
    with agreement.record() as steps:
        with fake_world(8, 3):
            import rankmesh

            rankmesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
        assert (pg.MeshBuilder.process_group, _fast_groups.new_member_group) == before[2:4]
    assert [s.kind for s in steps if s.kind == "new_group" and s.member][:1] == ["new_group"]
    after = watched()
    assert all(a is b for a, b in zip(after, before))
    if SPLITS:  # a split still works after the recorder put torch's method back
        with fake_world(4, 1, "meshfakesplit") as world:
            assert dist.split_group(parent_pg=world, split_ranks=[[0, 1], [2, 3]]) is not None
