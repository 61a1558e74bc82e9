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


# -- Petastorm-style arguments: file:// URLs, shuffle=True/False, fields as Field objects or regexes --
def file_url_path(url: Any) -> Any:
    """``file:///abs/path`` as ``/abs/path``; anything else as is (paths, other URLs)."""
    import os

    if isinstance(url, (str, bytes, os.PathLike)):
        s = os.fspath(url)
        s = os.fsdecode(s) if isinstance(s, bytes) else s
        if s.startswith("file://"):
            return local_path(s)
    return url


def local_path(url: Any) -> Any:
    """A local path for ``url``: a path as is (``str``, ``bytes``, ``os.PathLike``),
    ``file:///abs/path`` as ``/abs/path``; other URL schemes raise ``ValueError`` (only local
    files are read here)."""
    import os
    import re

    if not isinstance(url, (str, bytes, os.PathLike)):
        return url
    s = os.fspath(url)
    s = os.fsdecode(s) if isinstance(s, bytes) else s
    if s.startswith("file://"):
        rest = s[len("file://"):]
        if rest and not rest.startswith("/"):
            raise ValueError(f"{s!r}: a file:// URL must name an absolute path (file:///data/x)")
        return rest or "/"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", s):
        raise ValueError(f"{s!r}: only local paths and file:// URLs are supported here")
    return url


def select_fields(schema: Schema, fields: Any, *, regex: bool = False) -> list[str] | None:
    """Field names from a ``fields``/``schema_fields`` argument: None (all), a name or a
    :class:`~rowstore.Field`, or a sequence of them; with ``regex``, an entry that is not a
    field name is a regular expression selecting every field it fully matches (Petastorm's
    ``schema_fields``), in schema order. Unknown names raise :class:`SchemaError`."""
    import re

    from rowstore.schema import Field

    if fields is None:
        return None
    items = [fields] if isinstance(fields, (str, Field)) else list(fields)
    out: list[str] = []
    for item in items:
        name = item.name if isinstance(item, Field) else item
        if not isinstance(name, str):
            raise TypeError(f"fields must be names or Field objects, got {type(item).__name__}")
        if name in schema or not regex:
            hits = [name]
        else:
            try:
                pattern = re.compile(name)
            except re.error as exc:
                raise SchemaError(f"schema_fields entry {name!r} is neither a field nor a regular expression: {exc}",
                                  field=name) from None  # fmt: skip
            hits = [f.name for f in schema if pattern.fullmatch(f.name)]
            if not hits:
                raise SchemaError(f"schema_fields entry {name!r} matches no field of {schema.names}", field=name)
        out += [h for h in hits if h not in out]
    schema.select(out)  # unknown names: SchemaError naming them
    return out
