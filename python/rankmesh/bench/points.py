"""The points ``rankmesh bench`` measures: each is an implementation, a recipe and a
process-group path (:mod:`rankmesh.bench.meshes` measures them, :mod:`rankmesh.bench.report`
renders them), with the configuration every recipe builds and the points stock code cannot run.
"""

from __future__ import annotations

from rankmesh.bench.frameworks import FRAMEWORKS

CONFIG = dict(dp_replicate=2, dp_shard=-1, cp=2, tp=8, pp=4, ep=8, etp=1)
IMPLS = ("rankmesh", "torch")
#: Re-forming every mesh after a failure (rankmesh.recovery): a hot spare takes a failed rank's place
#: and the survivors are renumbered in order; rankmesh re-forms the tree over that world, stock
#: torch rebuilds it with its own code.
REFORM_RECIPES = ("reform_parallel_dims", "reform_megatron", "reform_fsdp")
RECIPES = ("parallel_dims", "titan030", "torchtitan", "megatron", "torch_api", *FRAMEWORKS, *REFORM_RECIPES)
#: Recipes whose rankmesh side is the one switch alone: a worker started with RANKMESH_ACCELERATE=1
#: runs the framework's own code, as stock does, with nothing of rankmesh in it.
SWITCHED = ("torchtitan", "megatron", *FRAMEWORKS)
PATHS = ("new_group", "split_group")
#: Points stock code cannot run on the fake backend, with why (shown as "–" in the tables).
NOT_MEASURABLE = {
    ("torch", "megatron", "split_group"): "megatron-core's new_group on a default group bound to a "
    "device splits it with perform_nocolor_split, which the fake backend lacks",
    # The frameworks' own calls run on the new_group path only: the split path is the same patch
    # (torch_api measures it), and some frameworks read the device from the accelerator they find.
    **{(i, fw, "split_group"): "frameworks are measured on the new_group path" for fw in FRAMEWORKS for i in IMPLS},
    **{(i, r, "split_group"): "re-forms are measured on the new_group path" for r in REFORM_RECIPES for i in IMPLS},
}
