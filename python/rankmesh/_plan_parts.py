"""What both of ``rankmesh plan``'s plans share (:mod:`rankmesh.plan`, the meshes of one
convention over the world; :mod:`rankmesh.job_plan`, a job of disjoint meshes): the count of the
process groups a rank creates, the one abbreviation of a group, and the world size above which
the whole-world topology check is skipped. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["WHOLE_WORLD_LIMIT", "GroupCount", "format_group"]

#: Above this world size the whole-world topology check (O(W) per dim) is skipped.
WHOLE_WORLD_LIMIT = 1 << 22


@dataclass
class GroupCount:
    """Process groups one rank creates for a plan, one per distinct (partition, backend)."""

    real: list[list[str]]  # each entry: the "mesh.dim" labels sharing one real group
    fake: list[list[str]]
    default: list[str]  # dims spanning the world: served by the default group

    @property
    def created(self) -> int:
        return len(self.real) + len(self.fake)

    def shared(self) -> list[list[str]]:
        """The groups that serve more than one dim (real ones first)."""
        return [g for g in self.real + self.fake if len(g) > 1]


def format_group(ranks: Sequence[int] | np.ndarray, limit: int = 8) -> str:
    """``[0, 1, ..., 7] (8 ranks)``: short groups in full, long ones abbreviated (an arithmetic
    progression by its first two and last member, anything else by its first four and last).
    The one abbreviation of a group in rankmesh (``rankmesh plan`` and the demo)."""
    r = [int(x) for x in ranks]
    n = len(r)
    unit = "rank" if n == 1 else "ranks"
    if n <= 4:
        return f"[{', '.join(map(str, r))}] ({n} {unit})"
    diffs = np.diff(np.asarray(r, dtype=np.int64))
    if np.all(diffs == diffs[0]):
        body = f"{r[0]}, {r[1]}, ..., {r[-1]}"
    elif n <= limit:
        body = ", ".join(map(str, r))
    else:
        body = ", ".join(map(str, r[:4])) + f", ..., {r[-1]}"
    return f"[{body}] ({n} {unit})"
