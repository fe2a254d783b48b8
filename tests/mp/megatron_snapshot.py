"""What megatron-core's ``parallel_state`` answers on this rank, as plain data, to compare
megatron-core's own ``initialize_model_parallel`` with rankmesh's (tests/test_megatron_init.py on
the fake backend, tests/mp/megatron_worker.py on 8 gloo ranks).

- ``snapshot()``: every state global of ``parallel_state`` (process groups as their ranks and
  backend) and the answer of every ``get_*`` / ``is_*`` accessor that takes no required argument,
  also with each boolean keyword flipped (``with_context_parallel``, ``partial_data_parallel``,
  ``ignore_virtual``, ...); an accessor that raises answers its exception's class name.
- ``reset()``: puts every state global back to its value at import (megatron-core's own
  ``destroy_model_parallel`` leaves some set, e.g. the rank lists), so that one run cannot leave
  answers behind for the next.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any

import torch.distributed as dist

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on CPU
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as ps

# Not compared: the timeout list (rankmesh lists each shared group once, by design) and the
# memory buffers (compared as present/absent).
_OPAQUE = {"_global_process_group_list", "_GLOBAL_MEMORY_BUFFER", "_GLOBAL_SYMMETRIC_MEMORY_BUFFER"}
_SKIP_ACCESSORS = {"get_global_memory_buffer", "get_global_symmetric_memory_buffer"}


def _state_names() -> list[str]:
    return sorted(n for n in vars(ps) if n.startswith("_") and n[1:2].isupper() and not callable(getattr(ps, n)))


def _pristine(value: Any) -> Any:
    """A global's import-time value: a process group left behind by an earlier test (megatron-core's
    own destroy_model_parallel never resets ``_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP``) is
    None at import, so this module may be imported after any test."""
    return None if isinstance(value, dist.ProcessGroup) else copy.copy(value)


_PRISTINE = {n: _pristine(getattr(ps, n)) for n in [*_state_names(), "_global_process_group_list"]}


def reset() -> None:
    for name, value in _PRISTINE.items():
        setattr(ps, name, copy.copy(value))


def norm(value: Any) -> Any:
    """A process group as ``["pg", ranks, backend]``; lists, tuples and dicts element-wise."""
    if isinstance(value, dist.ProcessGroup):
        return ["pg", dist.get_process_group_ranks(value), str(dist.get_backend(value))]
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    if isinstance(value, dict):
        return {str(k): norm(v) for k, v in sorted(value.items())}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__name__}>"


def _accessor_calls() -> list[tuple[str, dict[str, Any]]]:
    calls = []
    for name in sorted(vars(ps)):
        fn = getattr(ps, name)
        if not name.startswith(("get_", "is_", "has_", "model_parallel_is")) or name in _SKIP_ACCESSORS:
            continue
        if not inspect.isfunction(fn) or fn.__module__ != ps.__name__:
            continue
        params = inspect.signature(fn).parameters.values()
        if any(p.default is inspect.Parameter.empty for p in params):
            continue
        calls.append((name, {}))
        for p in params:
            if isinstance(p.default, bool):
                calls.append((name, {p.name: not p.default}))
        if name == "get_hybrid_data_context_parallel_groups":
            calls += [(name, {"group_size": s}) for s in (2, 4, 8)]
    return calls


def snapshot() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _state_names():
        if name in _OPAQUE:
            out[name] = getattr(ps, name) is not None
        else:
            out[name] = norm(getattr(ps, name))
    for name, kw in _accessor_calls():
        key = name + "".join(f",{k}={v}" for k, v in kw.items())
        try:
            out[key] = norm(getattr(ps, name)(**kw))
        except Exception as e:  # noqa: BLE001 - the exception class is the answer
            out[key] = f"raises {type(e).__name__}"
    return out


def diff(stock: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    keys = sorted(set(stock) | set(ours))
    return [
        f"{k}: stock {stock.get(k)!r:.300} vs rankmesh {ours.get(k)!r:.300}"
        for k in keys
        if stock.get(k) != ours.get(k)
    ]
