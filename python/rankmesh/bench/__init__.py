"""All of rankmesh's benchmark code: the benchmarks, side by side with stock torch in one run
(``rankmesh bench``), the workloads they time, the demo, and the stock-torch baseline they
measure against.

- :mod:`rankmesh.bench.meshes`: the meshes alone (``rankmesh bench``: every mesh a framework
  asks for, end to end, with real ``DeviceMesh`` objects);
- :mod:`rankmesh.bench.model`: time to a parallelised model (``rankmesh bench model``), over the
  workloads of :mod:`rankmesh.bench.workloads` (plain FSDP2 + TP scripts and meshes over part of
  the world), :mod:`rankmesh.bench.titan_workloads` (torchtitan 0.3.0's own parallelisation) and
  :mod:`rankmesh.bench.megatron_fsdp` (Megatron-FSDP's mesh phase);
- :mod:`rankmesh.bench.demo`: the README's main job (``python -m rankmesh.bench.demo``, run by
  ``scripts/demo.sh``);
- :mod:`rankmesh.bench.stock`: torchtitan 183a0d2's mesh construction on plain torch, the
  baseline of the benchmarks and the demo and the oracle of the tests.

They ship in the wheel: the number that counts is the one a user measures on their own torch
and machine. Nothing here is on rankmesh's own build path, and nothing on the data path imports
this package (only the command line hands ``bench`` to it); ``python -m rankmesh.bench`` is
``rankmesh bench``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankmesh._lazy import lazy_getattr

if TYPE_CHECKING:
    from rankmesh.bench.meshes import main, parse_worlds, results_dir

__all__ = ["main", "parse_worlds", "results_dir"]

# The benchmark modules import torch; import them when first used.
__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "rankmesh.bench.meshes"), globals())
