"""Names whose modules import torch (seconds) or megatron-core, imported on first use so that
``import rankmesh`` and the layout API stay torch-free: a module-level ``__getattr__``
(PEP 562) shared by every module that has such names."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(module: str, table: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``module`` that imports ``table[name]`` when ``name`` is first used and
    caches the value in ``namespace`` (the module's ``globals()``), so later lookups are plain."""

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
