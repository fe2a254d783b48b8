"""The benchmarks, side by side with stock torch in one run (``rankmesh bench``), and the
stock-torch baseline they measure against.

- :mod:`rankmesh.bench.meshes`: the meshes alone (``rankmesh bench``: every mesh a framework
  asks for, end to end, with real ``DeviceMesh`` objects);
- :mod:`rankmesh.bench.model`: time to a parallelised model (``rankmesh bench model``);
- :mod:`rankmesh.bench.stock`: torchtitan 183a0d2's mesh construction on plain torch, the
  baseline of the benchmarks and the demo and the oracle of the tests.

They ship in the wheel: the number that counts is the one a user measures on their own torch
and machine. Nothing here is on rankmesh's own build path; ``python -m rankmesh.bench`` is
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
