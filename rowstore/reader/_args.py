"""Argument checks shared by the reader and the framework adapters: the ``varlen`` argument,
Petastorm-style paths, ``shuffle`` and field selections (counts: :mod:`rowstore._check`).
Framework-free; the adapters import it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rowstore.errors import SchemaError
from rowstore.schema import Schema


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


# -- Petastorm-style arguments: fields as Field objects or regexes ---------------------------


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
                raise SchemaError(
                    f"schema_fields entry {name!r} is neither a field nor a regular expression: "
                    f"{exc}",
                    field=name,
                ) from None
            hits = [f.name for f in schema if pattern.fullmatch(f.name)]
            if not hits:
                raise SchemaError(
                    f"schema_fields entry {name!r} matches no field of {schema.names}", field=name
                )
        out += [h for h in hits if h not in out]
    schema.select(out)  # unknown names: SchemaError naming them
    return out
