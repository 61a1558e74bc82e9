"""Argument checks shared by the reader and the framework adapters: integer counts (batch
sizes, epochs, windows) and the ``varlen`` argument. Framework-free; the adapters import it."""

from __future__ import annotations

from typing import Any, overload

import numpy as np


def _int_at_least(name: str, value: Any, low: int, what: str) -> int:
    # bool is an int subclass, but batch_size=True is a mistake, not 1.
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be a {what}, got {value!r}")
    return int(value)


@overload
def positive_int(name: str, value: Any) -> int: ...
@overload
def positive_int(name: str, value: Any, *, optional: bool) -> int | None: ...
def positive_int(name: str, value: Any, *, optional: bool = False) -> int | None:
    """``int(value)`` if it is an int (Python or NumPy, not bool) >= 1, or None for None when
    ``optional``; otherwise ``ValueError`` naming the argument ``name``."""
    if optional:
        return None if value is None else _int_at_least(name, value, 1, "positive int or None")
    return _int_at_least(name, value, 1, "positive int")


def nonneg_int(name: str, value: Any) -> int:
    """``int(value)`` if it is an int (Python or NumPy, not bool) >= 0, else ``ValueError``."""
    return _int_at_least(name, value, 0, "non-negative int")
