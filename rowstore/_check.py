"""The argument checks every layer shares: counts, choices and byte sizes.

Each check returns the normalised value or raises ``ValueError`` naming the argument and what
was expected. They import nothing of rowstore, so any module may use them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TypeVar, overload

import numpy as np

__all__ = ["positive_int", "nonneg_int", "one_of", "parse_bytes"]

T = TypeVar("T")


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


def one_of(name: str, value: T, choices: Iterable[Any]) -> T:
    """``value`` if it is one of ``choices``, else ``ValueError`` naming the argument and the
    choices (``mode must be one of ('w', 'x'), got 'a'``)."""
    options = tuple(choices)
    try:
        ok = value in options
    except TypeError:  # an unhashable value against a set-like container
        ok = False
    if not ok or isinstance(value, bool) and not any(o is value for o in options):
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_bytes(value: int | str, what: str = "memory") -> int:
    """``2GB``, ``256MiB``, ``1.5g``, ``1000000`` -> bytes (SI for kB/MB/GB, binary for KiB...).

    Raises ``ValueError`` naming ``what`` for anything else, and for sizes below one byte.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a size like '2GB' or a number of bytes, got {value!r}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(
                f"{what} must be a size like '2GB', '512MiB' or a number of bytes, got {value!r}"
            )
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise ValueError(f"{what} must be a size like '2GB' or a number of bytes, got {value!r}")
    if n < 1:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return n
