"""What DeepSpeed reads of a pipeline grid and its topology, recorded for a stock-vs-rankmesh
comparison (tests/test_deepspeed_pipe.py, the agreement road, the gloo worker), and the topologies
the tests draw. Imports DeepSpeed only when called."""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Iterator
from typing import Any

GRID_ATTRS = (
    "global_rank world_size data_parallel_size pipe_parallel_size model_parallel_size slice_parallel_size "
    "stage_id data_parallel_id ds_model_world_size ds_model_rank dp_group pp_group slice_group "
    "is_first_stage is_last_stage mp_group"
).split()
MPU = (
    "get_global_rank get_pipe_parallel_rank get_pipeline_model_parallel_rank get_pipe_parallel_world_size "
    "get_pipeline_model_parallel_world_size get_data_parallel_rank get_data_parallel_world_size "
    "get_data_parallel_group_ranks get_model_parallel_rank get_model_parallel_world_size get_slice_parallel_rank "
    "get_tensor_model_parallel_rank get_slice_parallel_world_size get_tensor_model_parallel_world_size"
).split()
GROUPS = "get_pipe_parallel_group get_data_parallel_group get_model_parallel_group get_slice_parallel_group".split()


def ds_comm_init() -> None:
    """DeepSpeed's communication layer over the torch world already made (as deepspeed.initialize
    does), without its JIT-built CPU all-reduce op (as off Linux)."""
    import deepspeed.comm as ds_comm
    import deepspeed.ops
    from deepspeed.utils import groups

    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    groups._release_process_group_references()
    ds_comm.init_distributed(dist_backend="gloo")


def draw(rng: random.Random, world: int) -> dict[str, Any]:
    """A random topology of ``world`` ranks: DeepSpeed's two classes, DeepSpeed's default (None),
    or a ProcessTopology of its own axes and order (a fourth axis, data before pipe, no model)."""

    def split(n: int, parts: int) -> list[int]:
        out = []
        for _ in range(parts - 1):
            divisors = [d for d in range(1, n + 1) if n % d == 0]
            d = rng.choice(divisors)
            out.append(d)
            n //= d
        return [*out, n]

    kind = rng.choice(["pmd", "pmd", "pmd", "pd", "default", "custom"])
    if kind == "pmd":
        pp, mp, dp = split(world, 3)
        return {"kind": kind, "num_pp": pp, "num_mp": mp, "num_dp": dp}
    if kind == "pd":
        pp, dp = split(world, 2)
        return {"kind": kind, "num_pp": pp, "num_dp": dp}
    if kind == "default":
        return {"kind": kind}
    orders = [["pipe", "data", "model", "seq"], ["data", "pipe", "model"], ["model", "pipe", "data"], ["data", "pipe"]]
    axes = rng.choice(orders)
    return {"kind": kind, "axes": axes, "dims": split(world, len(axes))}


def topology(cfg: dict[str, Any]) -> Any:
    from deepspeed.runtime.pipe import topology as t

    if cfg["kind"] == "pmd":
        return t.PipeModelDataParallelTopology(num_pp=cfg["num_pp"], num_mp=cfg["num_mp"], num_dp=cfg["num_dp"])
    if cfg["kind"] == "pd":
        return t.PipeDataParallelTopology(num_pp=cfg["num_pp"], num_dp=cfg["num_dp"])
    if cfg["kind"] == "default":
        return None
    return t.ProcessTopology(axes=list(cfg["axes"]), dims=list(cfg["dims"]))


def build(cfg: dict[str, Any]) -> Any:
    """``PipelineParallelGrid(topology=...)`` as PipelineModule builds it (rank 0's print kept quiet)."""
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid

    with contextlib.redirect_stdout(io.StringIO()):
        return PipelineParallelGrid(topology=topology(cfg))


def _ranks(pg: Any) -> Any:
    import torch.distributed as dist

    if pg is None:
        return None
    return dist.get_process_group_ranks(pg)


def record(grid: Any, samples: list[int], full: bool) -> dict[str, Any]:
    """Everything DeepSpeed reads of ``grid`` and its topology; the W-sized lists whole when
    ``full``, else at the ``samples`` indices."""
    topo = grid.topology()
    out: dict[str, Any] = {a: getattr(grid, a, "<unset>") for a in GRID_ATTRS}
    out["has_model_groups"] = hasattr(grid, "model_groups")
    out.update({m: getattr(grid, m)() for m in MPU})
    out.update({m: _ranks(getattr(grid, m)()) for m in GROUPS})
    out["ds_model_proc_group"] = _ranks(grid.ds_model_proc_group)
    out["stage_to_global"] = [grid.stage_to_global(s) for s in range(grid.pipe_parallel_size)]
    out["stage_to_global_data0"] = [grid.stage_to_global(s, data=0) for s in range(grid.pipe_parallel_size)]
    out["axes"], out["dims"] = list(topo.get_axis_names()), [topo.get_dim(a) for a in topo.get_axis_names()]
    out["topo_world_size"] = topo.world_size()
    out["is_grid_valid"] = grid._is_grid_valid()
    lists = {"p2p_groups": grid.p2p_groups, "dp_groups": grid.dp_groups, "pipe_groups": grid.pipe_groups}
    if out["has_model_groups"]:
        lists["model_groups"] = grid.model_groups
    for name, value in lists.items():
        out[f"len {name}"] = len(value)
        out[name] = list(value) if full else [value[i % len(value)] for i in samples]
    coords = [topo.get_coord(r % grid.world_size) for r in samples]
    out["coords"] = [tuple(c) for c in coords]
    out["coords_fields"] = [c._fields for c in coords[:1]]
    out["get_rank"] = [topo.get_rank(**c._asdict()) for c in coords]
    out["rank_repr"] = [topo.get_rank_repr(r % grid.world_size) for r in samples]
    if full:
        out["str"] = str(topo)
        out["comm_lists"] = {a: topo.get_axis_comm_lists(a) for a in topo.get_axis_names()}
        out["filter_match"] = topo.filter_match(pipe=0)
        out["axis_list"] = topo.get_axis_list("data", 0)
        out["mapping_items"] = [(tuple(k), v) for k, v in topo.mapping.items()][:64]
    return out


@contextlib.contextmanager
def patched(on: bool) -> Iterator[None]:
    """rankmesh's two DeepSpeed patches in place (``on``) or not, restored after."""
    from rankmesh import deepspeed as rds

    for p in rds.PATCHES:
        p.restore()
    if on:
        assert all(p.install() for p in rds.PATCHES), [p.recognise() for p in rds.PATCHES]
    try:
        yield
    finally:
        for p in rds.PATCHES:
            p.restore()
        from deepspeed.utils import groups

        groups._release_process_group_references()  # no group of this world left in DeepSpeed's globals


# -- deepspeed.utils.groups ------------------------------------------------------------------------


class Mpu:
    """The model-parallel unit ``_create_expert_data_and_model_parallel`` reads (as Megatron's or the
    grid's): tensor and pipeline sizes, the default group as the data-parallel one."""

    def __init__(self, tp: int, pp: int) -> None:
        self.tp, self.pp = tp, pp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp

    def get_data_parallel_group(self) -> Any:
        import torch.distributed as dist

        return dist.group.WORLD


def draw_groups(rng: random.Random, world: int) -> list[tuple[str, dict[str, Any]]]:
    """A random sequence of ``deepspeed.utils.groups`` calls (the four loops) for ``world`` ranks."""

    def divisor(n: int) -> int:
        return rng.choice([d for d in range(1, n + 1) if n % d == 0])

    tp = divisor(world)
    calls = [("_init_tp_groups_with_new_group", {"tensor_model_parallel_size": tp})]
    if rng.random() < 0.5:
        calls[0][1]["data_parallel_size"] = world // tp
    calls.append(("_create_zero_param_parallel_group", {"group_size": divisor(world) * rng.choice([1, 1, 2])}))
    pp = divisor(world)
    calls.append(
        (
            "_create_expert_and_data_parallel",
            {
                "expert_parallel_size_": divisor(world // pp),
                "pp_size": pp,
                "use_data_before_expert_parallel_": rng.random() < 0.5,
            },
        )
    )
    tp2 = divisor(world)
    pp2 = divisor(world // tp2)
    calls.append(
        (
            "_create_expert_data_and_model_parallel",
            {"expert_parallel_size_": divisor(world // (tp2 * pp2)), "mpu": (tp2, pp2)},
        )
    )
    return calls


def run_groups(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Make the calls (DeepSpeed's globals reset first); what DeepSpeed reads of its globals after."""
    import torch.distributed as dist
    from deepspeed.utils import groups as g

    g._release_process_group_references()
    out: dict[str, Any] = {}
    for name, kwargs in calls:
        kwargs = dict(kwargs)
        if "mpu" in kwargs:
            kwargs["mpu"] = Mpu(*kwargs["mpu"])
        try:
            getattr(g, name)(**kwargs)
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001 - the same error both ways is the answer
            out[name] = f"{type(e).__name__}: {e}"

    def ranks(pg: Any) -> Any:
        return None if pg is None else dist.get_process_group_ranks(pg)

    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP"):
        out[name] = {k: ranks(v) for k, v in getattr(g, name).items()}
        out[name + "_RANKS"] = {k: (type(v).__name__, list(v)) for k, v in getattr(g, name + "_RANKS").items()}
    for name in ("_ZERO_PARAM_INTRA_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GROUP"):
        out[name] = ranks(getattr(g, name))
    out["model is tensor"] = g._MODEL_PARALLEL_GROUP is g._TENSOR_MODEL_PARALLEL_GROUP
    out["expert_tensor_parallel_world_size"] = g.expert_tensor_parallel_world_size
    for key in g._EXPERT_PARALLEL_GROUP:
        out[f"getters {key}"] = [
            g._get_expert_parallel_world_size(key),
            g._get_expert_parallel_rank(key),
            g._get_expert_parallel_src_rank(key),
        ]
    for key in g._EXPERT_DATA_PARALLEL_GROUP:
        out[f"getters edp {key}"] = [g._get_expert_data_parallel_world_size(key), g._get_expert_data_parallel_rank(key)]
    if g._ZERO_PARAM_INTRA_PARALLEL_GROUP is not None:
        out["zero getters"] = [
            g._get_zero_param_intra_parallel_rank_in_mygroup(),
            g._get_zero_param_intra_parallel_group_world_size(),
            g._get_zero_param_intra_parallel_group_ranks(),
        ]
    if g._TENSOR_MODEL_PARALLEL_GROUP is not None:
        out["tp getters"] = [
            g.get_tensor_model_parallel_rank(),
            g.get_tensor_model_parallel_world_size(),
            g.get_tensor_model_parallel_src_rank(),
            g.get_data_parallel_rank(),
            g.get_data_parallel_world_size(),
        ]
    return out
