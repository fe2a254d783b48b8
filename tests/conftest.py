"""Shared test set-up.

``meshfake``: the fake process group registered under another name. In a world on the ``fake``
backend, a group on the default backend and one overridden to ``"fake"`` are indistinguishable
(``dist.get_backend``, ``_get_backend_name`` and the group description are equal), so tests that
check which dims are fake run their worlds on ``meshfake``: groups on the default backend report
``"meshfake"`` and overridden ones ``"fake"``.
"""

from __future__ import annotations

MESHFAKE = "meshfake"


def _create_meshfake_pg(common_opts, backend_opts):
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(common_opts.group_rank, common_opts.group_size, backend_opts)


def pytest_configure(config) -> None:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a test dependency
        return
    if dist.is_available() and MESHFAKE not in dist.Backend.backend_list:
        dist.Backend.register_backend(MESHFAKE, _create_meshfake_pg, extended_api=True, devices=["cpu"])
