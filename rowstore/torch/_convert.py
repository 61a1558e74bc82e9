"""Values on their way to torch: field dtypes as torch dtypes, numpy arrays as tensors, the
per-field ``varlen`` modes, and conforming (transformed) batches and rows to a schema."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rowstore.errors import SchemaError
from rowstore.reader._args import varlen_modes
from rowstore.reader.buffers import NULL_KEY, Ragged, offsets_from_lengths
from rowstore.schema import BYTES, STR, Field, Schema

#: Collations of variable-shape fields.
VARLEN_MODES = ("padded", "nested", "list", "ragged")


# -- dtypes ------------------------------------------------------------------------------------
def torch_dtype(field: Field) -> torch.dtype:
    """The torch dtype of ``field``'s tensors.

    Raises :class:`~rowstore.errors.SchemaError` (naming the field) for ``str``/``bytes`` (they
    are returned as Python lists) and for unsigned dtypes this torch lacks (``uint16``/``32``/
    ``64`` need torch >= 2.3; they hold and move data, but most arithmetic is not implemented
    for them: cast with ``.to(torch.int64)`` before computing).
    """
    try:
        return field.torch_dtype()
    except AttributeError as exc:  # torch without torch.uint16/32/64
        raise SchemaError(
            f"field {field.name!r}: torch {torch.__version__} has no {field.dtype} tensors (torch "
            f">= 2.3 "
            f"has them); cast the field in a TransformSpec",
            field=field.name,
        ) from exc


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    """Casts a transform's output may get silently: same kind, int<->uint, ints/bools to floats."""
    if src == dst or np.can_cast(src, dst, "same_kind"):
        return True
    return (src.kind in "iu" and dst.kind in "iu") or (src.kind in "biu" and dst.kind in "fc")


def _tensor(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` (a view), copying only what torch cannot view: read-only arrays,
    negative strides, non-native byte order. datetime64/timedelta64 arrays (torch has no such
    dtypes) become int64 tensors of the counts of their unit (a view: NaT is the int64 minimum)."""
    if a.dtype.kind in "Mm":
        a = a.view(np.dtype(np.int64).newbyteorder(a.dtype.byteorder))
    if not a.flags.writeable:
        a = a.copy()
    try:
        return torch.from_numpy(a)
    except (ValueError, TypeError):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")))


# -- varlen modes ------------------------------------------------------------------------------
def _resolve_varlen(varlen: str | Mapping[str, str], schema: Schema) -> dict[str, str]:
    """Per variable-shape field of ``schema``: "padded", "jagged", "strided", "list" or
    "ragged"."""
    modes = varlen_modes(varlen, schema, modes=VARLEN_MODES, default="padded")
    out = {}
    for f in schema:
        if not f.is_variable or f.dtype in (STR, BYTES):
            continue
        mode = modes[f.name]
        if mode == "nested":
            if f.variable_dims == (0,):
                mode = "jagged"
            else:
                mode = "strided"
                if np.dtype(f.dtype).kind == "u" and f.dtype.itemsize > 1:
                    raise SchemaError(
                        f"field {f.name!r}: torch cannot build a strided nested tensor of "
                        f"{f.dtype} "
                        f"(shape {f.shape} varies beyond its first dimension, so the jagged layout "
                        f"does "
                        f"not apply); use varlen 'padded' or 'list' for it, or cast it in a "
                        f"TransformSpec",
                        field=f.name,
                    )
        out[f.name] = mode
    return out


# -- conforming values to a schema -------------------------------------------------------------
def _np(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    return np.asarray(v)


def _cast(a: np.ndarray, f: Field, where: str) -> np.ndarray:
    if a.dtype == f.dtype:
        return a
    if a.dtype.kind not in "biufc" or not _castable(a.dtype, f.dtype):
        raise SchemaError(
            f"{where}: field {f.name!r} is {f.dtype} in the output schema, got {a.dtype}; "
            f"declare the new dtype in edit_fields or cast it",
            field=f.name,
        )
    return a.astype(f.dtype)


def _check_fixed_dims(shape: tuple, f: Field, where: str) -> None:
    if len(shape) != len(f.shape) or any(s is not None and s != d for s, d in zip(f.shape, shape)):
        raise SchemaError(
            f"{where}: field {f.name!r} must have shape {f.shape} per row, got {tuple(shape)}",
            field=f.name,
        )


def _ragged_from_arrays(vals: Sequence[Any], f: Field, where: str) -> Ragged:
    nd = len(f.shape)
    arrs = []
    for v in vals:
        if v is None:
            arrs.append(np.zeros(tuple(0 if d is None else d for d in f.shape), f.dtype))
            continue
        a = _cast(_np(v), f, where)
        _check_fixed_dims(a.shape, f, where)
        arrs.append(a)
    n = len(arrs)
    shapes = np.array([a.shape for a in arrs], np.int64).reshape(n, nd)
    offsets = offsets_from_lengths([a.size for a in arrs])
    values = np.concatenate([a.reshape(-1) for a in arrs]) if n else np.zeros(0, f.dtype)
    return Ragged(values.astype(f.dtype, copy=False), offsets, shapes)


def _as_ragged(v: Any, f: Field, where: str) -> Ragged:
    if isinstance(v, Ragged):
        if v.shapes.shape[1:] != (len(f.shape),):
            raise SchemaError(
                f"{where}: field {f.name!r} must have {len(f.shape)} dimensions per row, "
                f"got {v.shapes.shape[1]}",
                field=f.name,
            )
        for d, s in enumerate(f.shape):
            if s is not None and len(v) and (v.shapes[:, d] != s).any():
                raise SchemaError(
                    f"{where}: field {f.name!r} must have shape {f.shape} per row", field=f.name
                )
        return (
            Ragged(_cast(v.values, f, where), v.offsets, v.shapes)
            if v.values.dtype != f.dtype
            else v
        )
    if (
        isinstance(v, (np.ndarray, torch.Tensor))
        and v.dtype != object
        and len(v.shape) == len(f.shape) + 1
    ):
        a = _cast(_np(v), f, where)  # a regular batch: every row the same shape
        _check_fixed_dims(a.shape[1:], f, where)
        n = a.shape[0]
        per = int(np.prod(a.shape[1:], dtype=np.int64))
        return Ragged(
            np.ascontiguousarray(a).reshape(-1),
            np.arange(n + 1, dtype=np.int64) * per,
            np.tile(np.array(a.shape[1:], np.int64), (n, 1)),
        )
    return _ragged_from_arrays(list(v), f, where)


def _as_fixed(v: Any, f: Field, where: str) -> np.ndarray:
    a = _cast(_np(v), f, where)
    if a.shape[1:] != f.shape:
        raise SchemaError(
            f"{where}: field {f.name!r} must be (n, {', '.join(map(str, f.shape))}) for shape "
            f"{f.shape}, got {a.shape}",
            field=f.name,
        )
    return a


def _as_objects(v: Any, f: Field, where: str) -> np.ndarray:
    if isinstance(v, np.ndarray) and v.dtype == object:
        col = v
    else:
        vals = list(v)
        col = np.empty(len(vals), object)
        col[:] = vals
    want = str if f.dtype == STR else bytes
    for x in col:
        if not (isinstance(x, want) or (x is None and f.nullable)):
            raise SchemaError(
                f"{where}: field {f.name!r} holds {f.dtype} values, got {type(x).__name__}",
                field=f.name,
            )
    return col


def _require(out: Mapping, f: Field, where: str) -> None:
    """A transform's output must keep every field of its declared schema."""
    if f.name not in out:
        raise SchemaError(
            f"{where}: output lacks field {f.name!r}; declare removed fields in "
            f"TransformSpec(removed_fields=[...])",
            field=f.name,
        )


def _conform_batch(b: Mapping, schema: Schema, where: str) -> dict:
    """A batch dict with exactly ``schema``'s fields (plus ``__null``), dtypes and shapes
    checked."""
    out: dict[str, Any] = {}
    n = None
    for f in schema:
        _require(b, f, where)
        v = b[f.name]
        if f.dtype in (STR, BYTES):
            v = _as_objects(v, f, where)
        elif f.is_variable:
            v = _as_ragged(v, f, where)
        else:
            v = _as_fixed(v, f, where)
        if n is None:
            n = len(v)
        elif len(v) != n:
            raise SchemaError(
                f"{where}: field {f.name!r} has {len(v)} rows, others have {n}", field=f.name
            )
        out[f.name] = v
        if f.nullable:
            nulls = b.get(f.name + NULL_KEY)
            if nulls is None:
                nulls = (
                    np.array([x is None for x in v], np.bool_)
                    if f.dtype in (STR, BYTES)
                    else np.zeros(n, np.bool_)
                )
            nulls = np.asarray(_np(nulls), np.bool_)
            if nulls.shape != (n,):
                raise SchemaError(
                    f"{where}: {f.name + NULL_KEY!r} must be bool ({n},), got {nulls.shape}",
                    field=f.name,
                )
            out[f.name + NULL_KEY] = nulls
    return out


def _conform_row(r: Mapping, schema: Schema, where: str) -> dict:
    """A row dict with exactly ``schema``'s fields: numbers as arrays of the field's dtype."""
    out: dict[str, Any] = {}
    for f in schema:
        _require(r, f, where)
        v = r[f.name]
        if v is None:
            if not f.nullable:
                raise SchemaError(
                    f"{where}: field {f.name!r} is None but not nullable", field=f.name
                )
        elif f.dtype in (STR, BYTES):
            want = str if f.dtype == STR else bytes
            if not isinstance(v, want):
                raise SchemaError(
                    f"{where}: field {f.name!r} holds {f.dtype}, got {type(v).__name__}",
                    field=f.name,
                )
        else:
            v = _cast(_np(v), f, where)
            _check_fixed_dims(v.shape, f, where)
        out[f.name] = v
    return out


def _row_of(b: Mapping, schema: Schema, i: int) -> dict:
    """Row ``i`` of a conformed batch, reader style (``None`` for nulls; no companions)."""
    row = {}
    for f in schema:
        v = b[f.name][i]
        if f.nullable and b[f.name + NULL_KEY][i]:
            v = None
        row[f.name] = v
    return row


def _columns_of(rows: Sequence[Mapping], schema: Schema) -> dict:
    """Conformed rows (numpy or torch values, ``None`` for nulls) -> a conformed batch."""
    n = len(rows)
    out: dict[str, Any] = {}
    for f in schema:
        vals = [r[f.name] for r in rows]
        nulls = np.fromiter((v is None for v in vals), np.bool_, n) if f.nullable else None
        col: np.ndarray | Ragged
        if f.dtype in (STR, BYTES):
            col = np.empty(n, object)
            col[:] = vals
        elif f.is_variable:
            col = _ragged_from_arrays(vals, f, "rows")
        else:
            zero = np.zeros(f.shape, f.dtype)
            arr = (
                np.stack([zero if v is None else _np(v) for v in vals])
                if n
                else np.zeros((0,) + f.shape, f.dtype)
            )
            col = arr.astype(f.dtype, copy=False)
        out[f.name] = col
        if nulls is not None:
            out[f.name + NULL_KEY] = nulls
    return out
