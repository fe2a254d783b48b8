"""One rank of the partial-mesh multi-process test (``torchrun ... -m tests.mp.partial_worker`` from
the repository root, 8 gloo ranks; see tests/test_partial_meshes_mp.py). Every rank builds every
mesh (SPMD), members and non-members alike; one JSON line per check (``<out>/rank<r>.jsonl``):

- ``kd``: students on ranks 0-3 and teachers on 4-7, each (dp 2, tp 2): all_reduce(rank + 1) over
  this rank's dp and tp groups sums their ranks; the groups' ranks equal torch's
  ``DeviceMesh(mesh=subset)``'s; non-members get coordinate None and no groups;
- ``kd_step``: each half trains its own FSDP2 + TP model one step on its own mesh; loss, gradients
  and parameters equal the same step on torch's meshes of the same half (on the split path stock
  torch cannot build a mesh over part of a gloo world: gloo lacks ``perform_nocolor_split``);
- ``rl``: actor ranks 0-3 as (fsdp, tp), rollout 4-7 as (replica, tp); all_reduce over tp;
- ``ep_stage``: one (edp, ep) mesh per pipeline stage of 4 ranks; all_reduce over ep and edp;
- ``strided``: the odd ranks as (2, 2) (``ranks=range(1, 8, 2)``); all_reduce on members;
- ``from_group``: ``rankmesh.from_group`` of the kd groups equals torch's ``from_group`` with the
  mesh tensor, and its groups are the same objects;
- ``later``: after all of it, a plain ``new_group`` of all ranks meets (names stayed in step) and
  sums right.
"""

from __future__ import annotations

import argparse
import logging
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from rankmesh._torch_compat import TORCH_VERSION
from rankmesh.mesh import FastDeviceMesh, from_group, init_device_mesh
from torch.distributed.device_mesh import DeviceMesh

from tests.mp.worker import Recorder


def _reduce_check(mesh: DeviceMesh, names: tuple[str, ...]) -> dict:
    rank = dist.get_rank()
    out = {}
    if mesh.get_coordinate() is None:
        assert mesh._dim_group_names == [], mesh._dim_group_names
        return {"member": False}
    for n in names:
        pg = mesh.get_group(n)
        members = dist.get_process_group_ranks(pg)
        assert members == sorted(mesh[n].mesh.tolist()), (n, members, mesh[n].mesh.tolist())
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, group=pg)
        assert t.item() == sum(r + 1 for r in members), (n, t.item(), members)
        out[n] = members
    return {"member": True, **out}


def _split_path() -> bool:
    return dist.distributed_c10d._get_default_group().bound_device_id is not None


def _torch_subset(ranks: range, shape, names) -> DeviceMesh | None:
    """torch's own mesh over ``ranks``; None on the split path, where stock torch cannot build one
    on gloo (its non-members call ``perform_nocolor_split``, which gloo lacks)."""
    if _split_path():
        return None
    return DeviceMesh("cpu", torch.tensor(list(ranks)).reshape(shape), mesh_dim_names=names)


def check_kd(state: dict) -> dict:
    names = ("dp", "tp")
    students = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    teachers = init_device_mesh("cpu", (2, 2), mesh_dim_names=names, ranks=range(4, 8))
    t_students = _torch_subset(range(0, 4), (2, 2), names)
    t_teachers = _torch_subset(range(4, 8), (2, 2), names)
    assert type(students) is FastDeviceMesh and type(teachers) is FastDeviceMesh
    for ours, theirs in ((students, t_students), (teachers, t_teachers)):
        if theirs is None:
            continue
        assert ours.get_coordinate() == theirs.get_coordinate()
        assert ours.mesh.tolist() == theirs.mesh.tolist()
        if ours.get_coordinate() is not None:
            for n in names:
                assert dist.get_process_group_ranks(ours.get_group(n)) == dist.get_process_group_ranks(
                    theirs.get_group(n)
                )
    state.update(students=students, teachers=teachers, t_students=t_students, t_teachers=t_teachers)
    return {"students": _reduce_check(students, names), "teachers": _reduce_check(teachers, names)}


def _step(mesh: DeviceMesh) -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16)) for _ in range(2)])
    for block in model:
        parallelize_module(block, mesh["tp"], {"0": ColwiseParallel(), "1": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1 + mesh.get_coordinate()[0]))
    loss = model(x).pow(2).mean()
    loss.backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    opt.step()
    params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    meshes = {type(p.device_mesh).__name__ for p in model.parameters()}
    return {"loss": float(loss.detach()), "grads": grads, "params": params, "meshes": meshes}


def check_kd_step(state: dict) -> dict:
    rank = dist.get_rank()
    ours = state["students"] if rank < 4 else state["teachers"]
    theirs = state["t_students"] if rank < 4 else state["t_teachers"]
    a = _step(ours)
    assert a["meshes"] == {"FastDeviceMesh"}, a["meshes"]
    if theirs is None:
        return {"loss": a["loss"], "stock": "not built on the split path"}
    b = _step(theirs)
    assert a["loss"] == b["loss"], (a["loss"], b["loss"])
    for n in b["grads"]:
        torch.testing.assert_close(a["grads"][n], b["grads"][n], rtol=0, atol=0, msg=n)
        torch.testing.assert_close(a["params"][n], b["params"][n], rtol=0, atol=0, msg=n)
    return {"loss": a["loss"]}


def check_rl(state: dict) -> dict:
    actor = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"), ranks=range(0, 4))
    rollout = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replica", "tp"), ranks=range(4, 8))
    return {"actor": _reduce_check(actor, ("fsdp", "tp")), "rollout": _reduce_check(rollout, ("tp",))}


def check_ep_stage(state: dict) -> dict:
    stages = [
        init_device_mesh("cpu", (2, 2), mesh_dim_names=("edp", "ep"), ranks=range(s * 4, (s + 1) * 4)) for s in range(2)
    ]
    mine = [s for s in stages if s.get_coordinate() is not None]
    assert len(mine) == 1
    return {f"stage{i}": _reduce_check(m, ("edp", "ep")) for i, m in enumerate(stages)}


def check_strided(state: dict) -> dict:
    odd = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"), ranks=range(1, 8, 2))
    theirs = _torch_subset(range(1, 8, 2), (2, 2), ("a", "b"))
    assert theirs is None or odd.get_coordinate() == theirs.get_coordinate()
    flat = odd._flatten("ab")
    out = _reduce_check(odd, ("a", "b"))
    if flat.get_coordinate() is not None:
        t = torch.ones(1)
        dist.all_reduce(t, group=flat.get_group())
        assert t.item() == 4.0
    return out


def check_from_group(state: dict) -> dict:
    rank = dist.get_rank()
    mesh = state["students"] if rank < 4 else state["teachers"]
    groups = [mesh.get_group("dp"), mesh.get_group("tp")]
    ours = from_group(groups, "cpu", mesh_dim_names=("dp", "tp"))
    theirs = DeviceMesh.from_group(groups, "cpu", mesh=mesh.mesh, mesh_dim_names=("dp", "tp"))
    assert type(ours) is FastDeviceMesh
    assert ours == theirs and hash(ours) == hash(theirs)
    assert ours.mesh.tolist() == theirs.mesh.tolist() and ours.get_coordinate() == theirs.get_coordinate()
    assert ours.get_group("dp") is groups[0] and ours.get_group("tp") is groups[1]
    return _reduce_check(ours, ("dp", "tp"))


def check_later(state: dict) -> dict:
    pg = dist.new_group(list(range(dist.get_world_size())))
    t = torch.ones(1)
    dist.all_reduce(t, group=pg)
    assert t.item() == dist.get_world_size()
    if TORCH_VERSION < (2, 15):
        # torch 2.13 salts member-only names with the groups this rank registered, which torch's own
        # subset meshes built above (the oracle) leave different on members and non-members
        # (docs/known_gaps.md); the plain group above is the one that must meet there.
        return {"name": pg.group_name}
    local = dist.new_group(list(range(dist.get_world_size())), use_local_synchronization=True)
    dist.all_reduce(t, group=local)
    return {"name": local.group_name}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cpu-bound"])
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    if args.device == "cpu-bound":
        dist.init_process_group("gloo", device_id=torch.device("cpu", 0))
    else:
        dist.init_process_group("gloo")
    rec = Recorder(args.out, dist.get_rank())
    state: dict = {}
    for check, fn in (
        ("kd", check_kd),
        ("kd_step", check_kd_step),
        ("rl", check_rl),
        ("ep_stage", check_ep_stage),
        ("strided", check_strided),
        ("from_group", check_from_group),
        ("later", check_later),
    ):
        rec.run(check, fn, state)
    dist.barrier()
    rec.write("end", True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
