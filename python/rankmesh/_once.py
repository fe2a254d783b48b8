"""rankmesh's one warn-once: every "this falls back to stock" ``RuntimeWarning`` (an unknown
version or body, a failed start-up check, a mesh rankmesh hands to torch) is said once per process
and key, through :func:`warn_once`. A leaf: it imports nothing of rankmesh.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     [warn_once(("doc", 1), "rankmesh: said once") for _ in range(3)]
    [True, False, False]
    >>> len(seen)
    1
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable

__all__ = ["warn_once", "forget"]

_lock = threading.Lock()
_seen: set[Hashable] = set()


def warn_once(key: Hashable, message: str, *, stacklevel: int = 2) -> bool:
    """``warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)`` the first time ``key``
    comes (keys are namespaced by the caller, e.g. ``("mesh", "ranks")``); whether it warned."""
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    return True


def forget(match: Hashable | None = None) -> None:
    """Forget the keys said so far (all, or those whose first item is ``match``): for tests."""
    with _lock:
        if match is None:
            _seen.clear()
        else:
            _seen.difference_update({k for k in _seen if isinstance(k, tuple) and k and k[0] == match})
