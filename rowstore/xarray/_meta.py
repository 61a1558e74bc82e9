"""What every part of :mod:`rowstore.xarray` stores and reads back: the metadata attribute
(:data:`META_KEY`), field names and dtypes for variables, their encodings and attributes."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from rowstore.errors import SchemaError
from rowstore.reader import Reader

#: The user attribute holding what :func:`open_dataset` and :func:`to_grid` need.
META_KEY = "xarray"
META_VERSION = 1
#: Encoding entries kept (others, like chunk sizes of the source store, mean nothing here).
ENCODING_KEYS = (
    "units",
    "calendar",
    "dtype",
    "_FillValue",
    "missing_value",
    "scale_factor",
    "add_offset",
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- names and dtypes -----------------------------------------------------------------------------
def _field_name(name: Hashable, taken: set[str]) -> str:
    """A field name for variable ``name``: itself when it is one, else a sanitized unique one."""
    if not isinstance(name, str):
        raise SchemaError(f"variable name {name!r}: rowstore stores variables with str names")
    base = (
        name
        if _IDENT.fullmatch(name) and "__" not in name
        else re.sub(r"\W|__", "_", name).strip("_") or "var"
    )
    if not _IDENT.fullmatch(base):
        base = "v_" + base
    out, k = base, 1
    while out in taken:
        out, k = f"{base}_{k}", k + 1
    taken.add(out)
    return out


def _field_dtype(name: str, dtype: np.dtype) -> str | np.dtype:
    if dtype.kind in "biufc":
        return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    if dtype.kind in "mM":
        return dtype
    if dtype.kind == "U":
        return "str"
    if dtype.kind == "S":
        return "bytes"
    raise SchemaError(
        f"variable {name!r}: dtype {dtype} cannot be stored (numbers, datetime64, timedelta64, "
        f"str, bytes)",
        field=name,
    )


def _encoding(enc: Mapping[str, Any]) -> dict:
    out = {}
    for k in ENCODING_KEYS:
        if k in enc:
            v = enc[k]
            out[k] = str(np.dtype(v)) if k == "dtype" else v
    return out


def _attrs(attrs: Mapping[Any, Any], where: str) -> dict:
    bad = [k for k in attrs if not isinstance(k, str)]
    if bad:
        raise SchemaError(f"{where}: attribute name {bad[0]!r} is not a str")
    return dict(attrs)


def _meta(reader: Reader) -> dict:
    meta = reader.layout.user_attrs.get(META_KEY)
    if not isinstance(meta, dict) or meta.get("version") != META_VERSION or "variables" not in meta:
        raise SchemaError(
            f"{reader.layout.path!r} was not written by rowstore.xarray (no {META_KEY!r} metadata "
            f"of version {META_VERSION}); read it with rowstore.open"
        )
    return meta
