"""Argument checks shared by the reader and the framework adapters: integer counts (batch
sizes, epochs, windows) and the ``varlen`` argument. Framework-free; the adapters import it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

import numpy as np

from rowstore.errors import SchemaError
from rowstore.schema import Schema


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


def varlen_modes(
    varlen: str | Mapping[str, str], schema: Schema, *, modes: Sequence[str], default: str
) -> dict[str, str]:
    """The ``varlen`` mode of every field of ``schema``.

    ``varlen`` is one mode for all fields, or a mapping ``{field: mode}`` (fields it does not
    name get ``default``). Each caller passes the modes it supports. Raises ``TypeError`` for
    anything but a str or a mapping, :class:`~rowstore.errors.SchemaError` (a ``ValueError``)
    for a field that is not in ``schema``, and ``ValueError`` for a mode not in ``modes``.
    """
    modes = tuple(modes)
    if isinstance(varlen, str):
        if varlen not in modes:
            raise ValueError(
                f"varlen must be one of {modes} or a dict {{field: mode}}, got {varlen!r}"
            )
        return {f.name: varlen for f in schema}
    if not isinstance(varlen, Mapping):
        raise TypeError(
            f"varlen must be one of {modes} or a dict {{field: mode}}, got {type(varlen).__name__}"
        )
    unknown = [k for k in varlen if k not in schema]
    if unknown:
        raise SchemaError(
            f"varlen names field(s) {unknown} that are not selected; the fields are {schema.names}",
            field=unknown[0],
        )
    bad = {k: v for k, v in varlen.items() if v not in modes}
    if bad:
        raise ValueError(f"varlen modes must be one of {modes}, got {bad}")
    return {f.name: varlen.get(f.name, default) for f in schema}
