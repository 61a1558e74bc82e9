"""User attributes as JSON, with numpy arrays and scalars stored exactly (``docs/format.md``,
section 1.1).

User attributes (``Writer(attrs=)``, ``DatasetWriter(attrs=)``, ``commit(attrs=)``) are stored as
one JSON object. Plain JSON values (``dict`` with ``str`` keys, ``list``/``tuple``, ``str``,
``int``, ``float``, ``bool``, ``None``) are stored as themselves; a numpy array or scalar (common
in netCDF metadata: ``units``' companions, ``valid_range``, ``_FillValue``) is stored as a tagged
object holding its dtype, shape and raw bytes, and read back as the same array or scalar (same
dtype, byte order, shape and values, NaN payloads included)::

    {"$ndarray": {"dtype": "<f8", "shape": [3], "base64": "..."}}   # np.ndarray
    {"$numpy": {"dtype": "<f4", "base64": "..."}}                   # np.generic (np.float32(1.5),
    ...)

:func:`encode` turns attributes into plain JSON values, :func:`decode` back; :func:`dumps` is
the text a file or manifest stores. A dict whose only key is ``"$ndarray"`` or ``"$numpy"`` is
reserved (refused when given). Decoding checks everything (dtype kind, shape, byte count
against the shape) and raises :class:`~rowstore.errors.FormatError`: attributes come from files.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rowstore.errors import AttrsError, FormatError

__all__ = ["encode", "decode", "dumps", "check", "TAG_ARRAY", "TAG_SCALAR"]

TAG_ARRAY = "$ndarray"
TAG_SCALAR = "$numpy"
#: dtype kinds stored: bool, ints, uints, floats, complex, datetime64, timedelta64, bytes, str.
KINDS = "biufcmMSU"
#: Nesting depth refused beyond this (a hostile file must not recurse without bound).
MAX_DEPTH = 64


def _dtype_ok(dt: np.dtype) -> bool:
    return dt.kind in KINDS and dt.fields is None and dt.subdtype is None and dt.itemsize > 0


def _tagged(value: np.ndarray | np.generic, where: str) -> dict:
    arr = np.asarray(value)
    if not _dtype_ok(arr.dtype):
        raise AttrsError(
            f"attribute {where}: a numpy value of dtype {arr.dtype} cannot be stored (only "
            "bool, int, uint, float, complex, datetime64, timedelta64, bytes and str dtypes)"
        )
    data = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")
    if isinstance(value, np.ndarray):
        return {TAG_ARRAY: {"dtype": arr.dtype.str, "shape": list(arr.shape), "base64": data}}
    return {TAG_SCALAR: {"dtype": arr.dtype.str, "base64": data}}


def encode(value: Any, where: str = "attrs", _depth: int = 0) -> Any:
    """``value`` as plain JSON values (numpy arrays and scalars as tagged objects).

    Raises :class:`~rowstore.errors.AttrsError` (a ``TypeError`` and ``ValueError``) naming the
    attribute (``attrs['a'][2]``) for a value JSON cannot hold
    (an object, a structured or object-dtype array, a non-``str`` key, a reserved tag).
    """
    if _depth > MAX_DEPTH:
        raise AttrsError(f"attribute {where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, (np.ndarray, np.generic)):
        return _tagged(value, where)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise AttrsError(
                    f"attribute {where}: key {k!r} is not a str (JSON object keys are)"
                )
            out[k] = encode(v, f"{where}[{k!r}]", _depth + 1)
        if len(out) == 1 and next(iter(out)) in (TAG_ARRAY, TAG_SCALAR):
            raise AttrsError(
                f"attribute {where}: a dict whose only key is {next(iter(out))!r} is reserved "
                "for numpy values"
            )
        return out
    if isinstance(value, (list, tuple)):
        return [encode(v, f"{where}[{i}]", _depth + 1) for i, v in enumerate(value)]
    raise AttrsError(
        f"attribute {where}: {type(value).__name__} values cannot be stored (JSON values, numpy "
        "arrays and numpy scalars can)"
    )


def dumps(attrs: Mapping[str, Any]) -> str:
    """The JSON text stored for ``attrs`` (keys sorted)."""
    if not isinstance(attrs, Mapping):
        raise TypeError(f"attrs must be a mapping, got {type(attrs).__name__}")
    return json.dumps(encode(attrs), sort_keys=True)


def check(attrs: Any) -> dict:
    """A normalized deep copy of ``attrs`` (tuples as lists, numpy values copied), as a reader
    will see it; :class:`~rowstore.errors.AttrsError` for what cannot be stored."""
    if not isinstance(attrs, Mapping):
        raise TypeError(f"attrs must be a mapping, got {type(attrs).__name__}")
    return decode(json.loads(json.dumps(encode(attrs))))


def _bad(where: str, msg: str) -> FormatError:
    return FormatError(f"user attribute {where}: {msg}")


def _untag(tag: str, body: Any, where: str) -> np.ndarray | np.generic:
    keys = {"dtype", "shape", "base64"} if tag == TAG_ARRAY else {"dtype", "base64"}
    if not isinstance(body, dict) or set(body) != keys:
        raise _bad(where, f"a {tag!r} object must hold exactly the keys {sorted(keys)}")
    try:
        dt = (
            np.dtype(body["dtype"])
            if isinstance(body["dtype"], str) and len(body["dtype"]) <= 16
            else None
        )
    except TypeError:
        dt = None
    if dt is None or not _dtype_ok(dt):
        raise _bad(where, f"dtype {body['dtype']!r} is not a stored kind ({KINDS})")
    shape: tuple[int, ...] = ()
    if tag == TAG_ARRAY:
        s = body["shape"]
        if not isinstance(s, list) or len(s) > 32 or not all(type(d) is int and d >= 0 for d in s):
            raise _bad(where, f"shape must be a list of at most 32 non-negative ints, got {s!r}")
        shape = tuple(s)
    data = body["base64"]
    if not isinstance(data, str):
        raise _bad(where, "base64 must be a str")
    expected = math.prod(shape) * dt.itemsize
    if len(data) != 4 * (
        -(-expected // 3)
    ):  # before decoding: never allocate what the shape does not say
        raise _bad(
            where,
            f"{len(data)} base64 characters, expected {4 * (-(-expected // 3))} for {dt.str} of "
            f"shape {shape}",
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(where, "invalid base64") from None
    if len(raw) != expected:
        raise _bad(where, f"{len(raw)} bytes, expected {expected} for {dt.str} of shape {shape}")
    arr = np.frombuffer(raw, dtype=dt).reshape(shape).copy()
    return arr if tag == TAG_ARRAY else arr[()]


def decode(value: Any, where: str = "attrs", _depth: int = 0) -> Any:
    """JSON values as :func:`encode` made them, with tagged objects turned back into numpy values.

    Raises :class:`~rowstore.errors.FormatError` for a malformed tagged object.
    """
    if _depth > MAX_DEPTH:
        raise _bad(where, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        if len(value) == 1:
            ((k, body),) = value.items()
            if k in (TAG_ARRAY, TAG_SCALAR):
                return _untag(k, body, where)
        return {k: decode(v, f"{where}[{k!r}]", _depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v, f"{where}[{i}]", _depth + 1) for i, v in enumerate(value)]
    return value
