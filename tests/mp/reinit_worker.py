"""One rank of the re-initialisation test (torchrun as ``-m tests.mp.reinit_worker`` from the
repository root, 8 gloo ranks on CPU; see tests/test_reinit_mp.py).

``--cycles`` times, in one process: ``init_process_group("gloo")`` on a fresh prefix of the store
torchrun gives (``env://``; the same prefix every cycle would hand cycle 2 the addresses cycle 1
left in the store, which stock torch cannot re-initialise on either), rankmesh's meshes on every
road, an all-reduce over every group they hold, then ``destroy_process_group()``. The roads, in
this order each cycle:

- ``rankmesh.init_device_mesh`` (pp 2 x dp 2 x tp 2), two slices, a ``_flatten`` and an
  ``_unflatten``;
- torch's own ``init_device_mesh`` and ``DeviceMesh(mesh=...)`` under ``rankmesh.accelerate()``
  (installed once, before the first cycle), with a ``_flatten``;
- megatron-core's ``parallel_state`` through ``rankmesh.megatron.initialize_model_parallel``
  (tp 2, pp 2, gloo twins included) when megatron-core is installed, then
  ``rankmesh.megatron.destroy_model_parallel()`` (which destroys the gloo twins one by one).

Each rank writes one JSON line per cycle (``cycle<i>``; ``<out>/rank<r>.jsonl``): every group it
reduced over as ``label -> [name, ranks]`` (the ranks from the test's own numpy oracle or
megatron's rank rule, never read back from the group), and c10d's tables after the destroy; then
``rebuild_after_free`` (a mesh's groups destroyed and the mesh built again in the same world);
an ``end`` line when all is done.
"""

from __future__ import annotations

import argparse
import time
import warnings

import rankmesh
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from tests.mp.worker import Recorder, assert_reduces, expected_group

#: c10d's per-group tables (``_world``'s), each empty after ``destroy_process_group()``.
TABLES = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag", "pg_coalesce_state")


def c10d_tables() -> dict[str, int]:
    w = c10d._world
    out = {t: len(getattr(w, t)) for t in TABLES if hasattr(w, t)}
    out["group_count"] = w.group_count
    return out


class Groups:
    """The groups of one cycle on this rank: each all-reduced over its expected ranks, and
    recorded as ``label -> [name, ranks]``."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.seen: dict[str, list] = {}

    def add(self, label: str, group, ranks: list[int]) -> None:
        assert self.rank in ranks, (label, ranks)
        assert_reduces(group, ranks, label)
        self.seen[label] = [group.group_name, ranks]

    def mesh(self, label: str, mesh, sizes: dict[str, int], order: tuple[str, ...], alias=None) -> None:
        """Every dim of ``mesh`` (a mesh over ``order`` of ``sizes``, or a slice, flatten or
        unflatten of it: each of its dim names is a dim of ``order`` (through ``alias``), or a
        flatten of several named ``a_b``)."""
        for d, name in enumerate(mesh.mesh_dim_names):
            name = (alias or {}).get(name, name)
            dims = (name,) if name in order else tuple(n for n in order if n in name.split("_"))
            self.add(f"{label}.{name}", mesh.get_group(d), expected_group(self.world, sizes, order, dims, self.rank))


def rankmesh_meshes(g: Groups) -> None:
    sizes, order = {"pp": 2, "dp": 2, "tp": 2}, ("pp", "dp", "tp")
    mesh = rankmesh.init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=order)
    g.mesh("rankmesh", mesh, sizes, order)
    g.mesh("rankmesh[dp,tp]", mesh["dp", "tp"], sizes, order)
    g.mesh("rankmesh[pp]", mesh["pp"], sizes, order)
    flat = mesh["dp", "tp"]._flatten("dp_tp")
    g.mesh("rankmesh.flatten", flat, sizes, order)
    # dp_tp unflattened again into (dp, tp): the same partitions as the root's dp and tp
    g.mesh("rankmesh.unflatten", flat._unflatten(0, (2, 2), ("d", "t")), sizes, order, alias={"d": "dp", "t": "tp"})


def torch_meshes(g: Groups) -> None:
    """torch's own API, under rankmesh.accelerate()."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    sizes, order = {"dp": 2, "tp": 4}, ("dp", "tp")
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=order)
    assert isinstance(mesh, rankmesh.FastDeviceMesh), type(mesh)
    g.mesh("torch.init_device_mesh", mesh, sizes, order)
    sizes3, order3 = {"a": 2, "b": 2, "c": 2}, ("a", "b", "c")
    plain = DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), mesh_dim_names=order3)
    g.mesh("torch.DeviceMesh", plain, sizes3, order3)
    g.mesh("torch.DeviceMesh.flatten", plain["b", "c"]._flatten("b_c"), sizes3, order3)


MEGATRON = dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)


def megatron_groups(g: Groups) -> None:
    """rankmesh.megatron with tp 2, pp 2 on 8 ranks (megatron's default order tp-cp-ep-dp-pp:
    tp = consecutive pairs, dp stride 2 within a stage of 4, pp stride 4), gloo twins included;
    ``destroy_model_parallel()`` (which destroys the twins) last in the cycle."""
    import rankmesh.megatron as rm
    from megatron.core import parallel_state as ps

    r = g.rank
    rm.initialize_model_parallel(**MEGATRON)
    tp = [r - r % 2, r - r % 2 + 1]
    dp = sorted({r, (r // 4) * 4 + (r % 4 + 2) % 4})
    pp = [r % 4, r % 4 + 4]
    g.add("megatron.tp", ps.get_tensor_model_parallel_group(), tp)
    g.add("megatron.dp", ps.get_data_parallel_group(), dp)
    g.add("megatron.dp_gloo", ps.get_data_parallel_group_gloo(), dp)
    g.add("megatron.dp_cp_gloo", ps.get_data_parallel_group_gloo(with_context_parallel=True), dp)
    g.add("megatron.pp", ps.get_pipeline_model_parallel_group(), pp)
    g.add("megatron.mp", ps.get_model_parallel_group(), sorted(tp + [(x + 4) % 8 for x in tp]))  # tp x pp
    g.add("megatron.embd", ps.get_embedding_group(), pp)  # first and last stage: pp 2 holds both
    g.add("megatron.expert_dp", ps.get_expert_data_parallel_group(), dp)
    rm.destroy_model_parallel()


def have_megatron() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import einops  # noqa: F401
            import megatron.core.parallel_state  # noqa: F401
    except ImportError:
        return False
    return True


def cycle(base, rank: int, world: int, i: int, megatron: bool) -> dict:
    t0 = time.perf_counter()
    dist.init_process_group("gloo", store=dist.PrefixStore(f"rankmesh_reinit/{i}", base), rank=rank, world_size=world)
    g = Groups(rank, world)
    rankmesh_meshes(g)
    torch_meshes(g)
    if megatron:
        megatron_groups(g)
    dist.barrier()
    dist.destroy_process_group()
    return {
        "groups": g.seen,
        "tables": c10d_tables(),
        "initialized": dist.is_initialized(),
        "took": time.perf_counter() - t0,
    }


def rebuild_after_free(base, rank: int, world: int) -> dict:
    """One more world: a mesh whose groups are destroyed (``destroy_process_group(group)``) and
    the same mesh built again. torch 2.13 would give the new groups the destroyed ones' names
    (their rendezvous still in the store: a hang), so rankmesh raises DistributedStateError on
    every rank before making them; torch 2.14+ makes them under new names."""
    from rankmesh import _fast_groups_check
    from rankmesh.errors import DistributedStateError

    store = dist.PrefixStore("rankmesh_reinit/rebuild", base)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        g = Groups(rank, world)
        sizes, order = {"dp": 2, "tp": 4}, ("dp", "tp")
        mesh = rankmesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=order)
        g.mesh("first", mesh, sizes, order)
        dist.barrier()
        for d in order:
            dist.destroy_process_group(mesh.get_group(d))
        out = {"scheme": _fast_groups_check.SCHEME, "raised": None, "field": None}
        try:
            again = rankmesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=order)
        except DistributedStateError as e:
            return {**out, "raised": type(e).__name__, "field": e.field, "groups": g.seen}
        g.mesh("again", again, sizes, order)
        return {**out, "groups": g.seen}
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--cycles", type=int, default=5)
    args = p.parse_args()
    warnings.simplefilter("ignore")
    base, rank, world = next(dist.rendezvous("env://"))  # torchrun's store, connected once
    rec = Recorder(args.out, rank)
    megatron = have_megatron()
    rec.write("start", True, world=world, megatron=megatron, torch=torch.__version__)
    assert {"init_device_mesh", "init_process_groups"} <= set(rankmesh.accelerate())  # the switch: megatron too
    for i in range(args.cycles):
        rec.run(f"cycle{i}", cycle, base, rank, world, i, megatron)
    rec.run("rebuild_after_free", rebuild_after_free, base, rank, world)
    rec.write("end", True)


if __name__ == "__main__":
    main()
