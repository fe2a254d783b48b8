"""DeepSpeed's pipeline topology and grid (``rankmesh.deepspeed``: the ``deepspeed_topology`` and
``deepspeed_grid`` patches), against DeepSpeed 0.19.8's own classes as the oracle.

Every test builds the grid the way ``PipelineModule`` does (``PipelineParallelGrid(topology=...)``
after ``deepspeed.comm`` wraps the world), once with DeepSpeed's code and once with the patches,
on torch's fake backend, and compares everything DeepSpeed reads of the grid and its topology
(tests/deepspeed_pipe.py). The gloo run with 8 processes is tests/mp/deepspeed_worker.py.
"""

from __future__ import annotations

import random
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed.runtime.pipe.topology")

import torch.distributed as dist  # noqa: E402
from rankmesh import _dependencies  # noqa: E402
from rankmesh import deepspeed as rds  # noqa: E402

from tests import deepspeed_pipe as dp  # noqa: E402
from tests.conftest import fake_world, plant_body  # noqa: E402
from tests.frameworks import run_json  # noqa: E402


def both_ways(world: int, rank: int, cfg: dict, samples: list[int], full: bool) -> tuple[dict, dict, list[int]]:
    """(stock record, rankmesh record, [stock groups created, rankmesh groups created])."""
    out, made = [], []
    for on in (False, True):
        with fake_world(world, rank), dp.patched(on):
            dp.ds_comm_init()
            before = dist.distributed_c10d._world.group_count
            grid = dp.build(cfg)
            made.append(dist.distributed_c10d._world.group_count - before)
            out.append(dp.record(grid, samples, full))
    return out[0], out[1], made


def _valid(cfg: dict, world: int) -> bool:
    return cfg["kind"] != "custom" or {"pipe", "data"} <= set(cfg["axes"])


@pytest.mark.parametrize("exp", [6, 8, 10, 12])
def test_every_answer_equals_deepspeeds_on_random_topologies_and_sampled_ranks(exp):
    world = 2**exp
    rng = random.Random(exp)
    checked = 0
    for _ in range(6 if exp < 12 else 2):
        cfg = dp.draw(rng, world)
        if not _valid(cfg, world):
            continue
        rank = rng.randrange(world)
        samples = [rng.randrange(world) for _ in range(8)] + [0, world - 1, rank]
        stock, ours, made = both_ways(world, rank, cfg, samples, full=exp <= 8)
        assert ours == stock, (cfg, rank, {k for k in stock if stock[k] != ours.get(k)})
        assert made[1] <= 4 < made[0], (cfg, made)  # this rank's groups only; stock makes every group
        checked += 1
    assert checked > 0


def test_the_docstring_example_of_rank_13():
    with fake_world(64, 13), dp.patched(True):
        dp.ds_comm_init()
        grid = dp.build({"kind": "pmd", "num_pp": 4, "num_mp": 2, "num_dp": 8})
        assert (grid.stage_id, grid.dp_group, grid.pp_group, grid.slice_group) == (
            0,
            [1, 3, 5, 7, 9, 11, 13, 15],
            [13, 29, 45, 61],
            [12, 13],
        )
        topo = grid.topology()
        assert (grid.p2p_groups[13], grid.stage_to_global(3), tuple(topo.get_coord(13))) == ([13, 29], 61, (0, 6, 1))
        assert str(topo.get_coord(13)) == "ProcessCoord(pipe=0, data=6, model=1)"


@pytest.mark.parametrize("mp", [1, 8])
def test_a_2_17_world_answers_as_deepspeeds_topology_computes_it(mp):
    """Stock's grid takes minutes here (O(W^2)); its topology's own lists are the oracle."""
    from deepspeed.runtime.pipe import topology as t

    world, rank = 2**17, 2**16 + 3
    cfg = {"kind": "pmd", "num_pp": 4, "num_mp": mp, "num_dp": world // (4 * mp)}
    oracle = t.PipeModelDataParallelTopology(num_pp=4, num_mp=mp, num_dp=world // (4 * mp))  # stock: a dict
    assert type(oracle.mapping) is dict
    with fake_world(world, rank), dp.patched(True):
        dp.ds_comm_init()
        before = dist.distributed_c10d._world.group_count
        grid = dp.build(cfg)
        assert dist.distributed_c10d._world.group_count - before <= 4
        coord = oracle.get_coord(rank)
        assert grid.topology().get_coord(rank) == coord
        assert (grid.stage_id, grid.data_parallel_id) == (coord.pipe, coord.data)
        assert grid.ds_model_world_size == 4 * mp
        ds_model = sorted(oracle.get_axis_list("data", coord.data))
        assert dist.get_process_group_ranks(grid.ds_model_proc_group) == ds_model
        assert grid.ds_model_rank == ds_model.index(rank)
        for axis, mine, pg, name in (
            ("data", grid.dp_group, grid.dp_proc_group, "dp_groups"),
            ("pipe", grid.pp_group, grid.pp_proc_group, "pipe_groups"),
        ):
            lists = oracle.get_axis_comm_lists(axis)
            assert [g for g in lists if rank in g] == [mine] and dist.get_process_group_ranks(pg) == mine
            assert len(getattr(grid, name)) == len(lists) and getattr(grid, name)[-1] == lists[-1]
        expected_slice = [rank] if mp == 1 else [g for g in oracle.get_axis_comm_lists("model") if rank in g][0]
        assert grid.slice_group == expected_slice
        assert dist.get_process_group_ranks(grid.slice_proc_group) == expected_slice
        pipe = grid.pp_group
        for r in (rank, 0, world - 1, pipe[-1]):
            c = oracle.get_coord(r)
            nxt = oracle.get_rank(**c._replace(pipe=(c.pipe + 1) % 4)._asdict())
            assert grid.p2p_groups[r] == [r, nxt]
        assert [grid.stage_to_global(s) for s in range(4)] == pipe


def test_get_coord_and_get_rank_do_not_grow_with_the_world():
    """O(ndim): the same number of Python calls at 2^10 and at 2^20 ranks."""
    import sys

    from deepspeed.runtime.pipe import topology as t

    def calls(world: int) -> int:
        topo = t.PipeModelDataParallelTopology(num_pp=4, num_mp=8, num_dp=world // 32)
        count = [0]

        def tracer(frame, event, arg):  # noqa: ANN001, ANN202
            if event == "call":
                count[0] += 1
            return None

        sys.setprofile(tracer)
        try:
            c = topo.get_coord(world // 2 + 3)
            topo.get_rank(**c._asdict())
        finally:
            sys.setprofile(None)
        return count[0]

    with dp.patched(True):
        assert calls(2**10) == calls(2**20)
        assert type(t.ProcessTopology(["a"], [2**20]).mapping) is rds.Coords


def test_the_mapping_is_the_stock_dict_in_order_and_errors():
    from deepspeed.runtime.pipe import topology as t

    for axes, dims in ((["pipe", "data", "model"], [2, 3, 4]), (["x"], [5]), (["a", "b"], [1, 7])):
        stock = t.ProcessTopology(axes=axes, dims=dims)
        with dp.patched(True):
            ours = t.ProcessTopology(axes=axes, dims=dims)
        assert type(ours.mapping) is rds.Coords and type(stock.mapping) is dict
        assert list(ours.mapping.items()) == list(stock.mapping.items()) and ours.mapping == stock.mapping
        assert str(ours) == str(stock) and len(ours.mapping) == ours.world_size() == stock.world_size()
        for key in [(0,) * len(dims), tuple(d - 1 for d in dims), (True,) * len(dims), (1.0,) * len(dims)]:
            assert (key in ours.mapping) == (key in stock.mapping)
            if key in stock.mapping:
                assert ours.mapping[key] == stock.mapping[key]
        for bad in [tuple(d for d in dims), (-1,) * len(dims), (0.5,) * len(dims), (0,) * (len(dims) + 1), "x"]:
            assert bad not in ours.mapping and bad not in stock.mapping
            with pytest.raises(KeyError):
                ours.mapping[bad]
        with pytest.raises(TypeError):
            ours.mapping[[0] * len(dims)]  # unhashable, as a dict says
        for rank in (-1, ours.world_size(), 2.5):
            with pytest.raises(ValueError, match=f"rank {rank} not found in topology."):
                ours.get_coord(rank)
            with pytest.raises(ValueError, match=f"rank {rank} not found in topology."):
                stock.get_coord(rank)
        with pytest.raises(ValueError, match="does not support slices"):
            ours.get_rank(**{axes[0]: 0}, extra=1) if len(axes) == 1 else ours.get_rank(**{axes[0]: 0})
        with pytest.raises(TypeError):
            ours.mapping[(0,) * len(dims)] = 1  # read-only
    with dp.patched(True):  # dims DeepSpeed does not expect: its own constructor, its own result
        assert t.ProcessTopology(axes=["a", "b"], dims=[2, 0]).mapping == {}
        with pytest.raises(TypeError):
            t.ProcessTopology(axes=["a"], dims=[2.5])


def test_a_topology_whose_dims_do_not_make_the_world_raises_deepspeeds_own_error():
    for on in (False, True):
        with fake_world(16, 3), dp.patched(on):
            dp.ds_comm_init()
            with pytest.raises(AssertionError, match="Invalid Grid"):
                dp.build({"kind": "pmd", "num_pp": 2, "num_mp": 2, "num_dp": 2})
            with pytest.raises(AttributeError):  # no data axis: DeepSpeed's own error
                dp.build({"kind": "custom", "axes": ["pipe", "model"], "dims": [4, 4]})


def test_a_recorded_new_group_or_a_subclassed_topology_runs_deepspeeds_own_grid(monkeypatch):
    """DeepSpeed's own tests replace deepspeed.comm.new_group to record the calls: they get them all."""
    import deepspeed.comm as ds_comm
    from deepspeed.runtime.pipe import topology as t

    calls = []
    real = ds_comm.new_group

    def recording(ranks):  # noqa: ANN001, ANN202
        calls.append(list(ranks))
        return real(ranks)

    from rankmesh import _once

    _once.forget("deepspeed")
    with fake_world(16, 5), dp.patched(True):
        dp.ds_comm_init()
        monkeypatch.setattr(ds_comm, "new_group", recording)
        with pytest.warns(
            RuntimeWarning, match="PipelineParallelGrid: deepspeed.comm.new_group is not DeepSpeed's own"
        ):
            grid = dp.build({"kind": "pmd", "num_pp": 2, "num_mp": 2, "num_dp": 4})
        assert len(calls) == 4 + 4 + 8 + 8 and grid.slice_group == [4, 5]
        monkeypatch.setattr(ds_comm, "new_group", real)

        class Mine(t.PipeDataParallelTopology):
            def get_coord(self, rank):  # noqa: ANN001, ANN202
                return super().get_coord(rank)

        calls.clear()
        monkeypatch.setattr(ds_comm, "new_group", recording)
        t.PipelineParallelGrid(topology=Mine(num_pp=4, num_dp=4))
        assert len(calls) == 4 + 4 + 4 + 16


def test_an_unread_release_or_body_runs_deepspeeds_own_code_with_one_warning(monkeypatch):
    plant_body(monkeypatch, "deepspeed", "deepspeed.runtime.pipe.topology.PipelineParallelGrid.__init__")
    rds.GRID_CODE._memo = ()
    with pytest.warns(RuntimeWarning, match="deepspeed_grid.*PipelineParallelGrid.__init__ has a body"):
        assert not rds.GRID.install()
    assert not rds.GRID.installed
    monkeypatch.undo()
    rds.GRID_CODE._memo = ()
    monkeypatch.setitem(_dependencies._versions, "deepspeed", "0.20.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not rds.TOPOLOGY.install() and not rds.GRID.install()
    texts = [str(w.message) for w in caught]
    assert any("deepspeed 0.20.0 is not a version this patch has read (supported: 0.19)" in m for m in texts), texts


def test_the_switch_installs_the_three_when_deepspeed_is_imported_and_the_grid_is_rankmeshs():
    code = """
import contextlib, io, json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from deepspeed.runtime.pipe import topology as t
from rankmesh import patches
from tests.deepspeed_pipe import ds_comm_init
dist.init_process_group("fake", rank=int(sys.argv[1]), world_size=4096, store=FakeStore())
ds_comm_init()
before = dist.distributed_c10d._world.group_count
with contextlib.redirect_stdout(io.StringIO()):
    grid = t.PipelineParallelGrid(topology=t.PipeModelDataParallelTopology(num_pp=4, num_mp=8, num_dp=128))
print(json.dumps({"installed": sorted(n for n in patches.installed() if n.startswith("deepspeed")),
                  "groups": dist.distributed_c10d._world.group_count - before, "pp": grid.pp_group}))
"""
    on = run_json(code, [2051], "1")
    off = run_json(code, [2051], None)
    assert on["installed"] == ["deepspeed_grid", "deepspeed_groups", "deepspeed_topology"] and off["installed"] == []
    assert on["pp"] == off["pp"] == [3, 1027, 2051, 3075]
    assert on["groups"] <= 4 and off["groups"] == 128 + 32 + 1024 + 512


# -- deepspeed.utils.groups ----------------------------------------------------------------------------


@pytest.mark.parametrize("exp", [4, 6, 8, 10])
def test_deepspeeds_group_loops_leave_the_same_globals_on_random_configurations(exp):
    world = 2**exp
    rng = random.Random(100 + exp)
    for _ in range(4):
        calls = dp.draw_groups(rng, world)
        rank = rng.randrange(world)
        got, made = [], []
        for on in (False, True):
            with fake_world(world, rank), dp.patched(on):
                dp.ds_comm_init()
                before = dist.distributed_c10d._world.group_count
                got.append(dp.run_groups(calls))
                made.append(dist.distributed_c10d._world.group_count - before)
        stock, ours = got
        assert ours == stock, (calls, rank, {k for k in stock if stock[k] != ours.get(k)})
        assert all(v == "ok" for k, v in stock.items() if k in dict(calls)), stock
        assert made[1] <= 8 and made[0] >= 7, (calls, made)  # 2 + 1 + 2 + 2 groups (+ a one-off probe); stock: all


def test_a_recorded_new_group_gets_deepspeeds_own_calls_as_its_autotp_tests_expect(monkeypatch):
    """DeepSpeed's test_autotp_training asserts the exact call list of _init_tp_groups_with_new_group."""
    from deepspeed.utils import groups

    calls = []
    with fake_world(4, 2), dp.patched(True):
        dp.ds_comm_init()
        monkeypatch.setattr(groups.dist, "new_group", lambda ranks: calls.append(tuple(ranks)) or tuple(ranks))
        groups._release_process_group_references()
        groups._init_tp_groups_with_new_group(tensor_model_parallel_size=2)
        assert calls == [(0, 2), (1, 3), (0, 1), (2, 3)]
        assert (groups._DATA_PARALLEL_GROUP, groups._TENSOR_MODEL_PARALLEL_GROUP) == ((0, 2), (2, 3))


def test_bad_sizes_raise_deepspeeds_own_errors_both_ways():
    bad = [
        ("_init_tp_groups_with_new_group", {"tensor_model_parallel_size": 3}),
        ("_init_tp_groups_with_new_group", {"tensor_model_parallel_size": 2, "data_parallel_size": 3}),
        ("_create_zero_param_parallel_group", {"group_size": 3}),
        ("_create_expert_and_data_parallel", {"expert_parallel_size_": 3, "pp_size": 2}),
        ("_create_expert_data_and_model_parallel", {"expert_parallel_size_": 3, "mpu": (2, 1)}),
    ]
    for call in bad:
        got = []
        for on in (False, True):
            with fake_world(16, 5), dp.patched(on):
                dp.ds_comm_init()
                got.append(dp.run_groups([call]))
        assert got[1] == got[0] and got[0][call[0]].startswith("AssertionError"), (call, got)


def test_deepspeeds_group_loops_at_2_17_answer_as_its_own():
    """ep 8 (both layouts), ZeRO++ hpZ 8, AutoTP's tp 8 and the expert+model groups at 131,072 ranks."""
    world, rank = 2**17, 2**16 + 3
    calls = [
        ("_init_tp_groups_with_new_group", {"tensor_model_parallel_size": 8}),
        ("_create_zero_param_parallel_group", {"group_size": 8}),
        ("_create_expert_and_data_parallel", {"expert_parallel_size_": 8, "pp_size": 4}),
        ("_create_expert_and_data_parallel", {"expert_parallel_size_": 16, "use_data_before_expert_parallel_": True}),
        ("_create_expert_data_and_model_parallel", {"expert_parallel_size_": 32, "mpu": (8, 4)}),
    ]
    got = []
    for on in (False, True):
        with fake_world(world, rank), dp.patched(on):
            dp.ds_comm_init()
            got.append(dp.run_groups(calls))
    assert got[1] == got[0] and set(got[0]["_EXPERT_PARALLEL_GROUP"]) == {"ep_size_8", "ep_size_16", "ep_size_32"}
