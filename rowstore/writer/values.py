"""Checking values against a field before they are written: one place for the writer's rules.

Casting policy: a value whose dtype casts *safely* to the field's dtype is accepted; floats may
narrow to a smaller float (float64 -> float32, the common case in preprocessing); integers may
narrow when every value fits; anything else (float -> int, int -> bool, complex -> float, ...)
is an error that names the field, the row and what was expected.

Time fields (``datetime64[unit]``, ``timedelta64[unit]``): values of the same kind in another unit
are converted when no value changes (``s`` -> ``ns`` when it does not overflow, ``ns`` -> ``s`` for
whole seconds); a lossy conversion is refused naming the row. NaT is a value (stored as is); a
null needs ``nullable=True``. Integers (and other kinds) are refused: counts of the unit are
passed explicitly as ``np.asarray(counts).astype("datetime64[ns]")`` (or ``.view``).
Python ``datetime``/``timedelta`` and pandas ``Timestamp``/``Timedelta`` scalars are accepted.

Encoded values: for a field whose codec takes them (``png``, ``jpeg``), a ``bytes``,
``bytearray`` or byte ``memoryview`` value is the encoded image itself (a NumPy array is always
pixels; pass ``memoryview(arr)`` for encoded bytes held in a ``uint8`` array). Its header gives
the shape and dtype it decodes to, checked against the field like an array's; the bytes are
stored unchanged (:class:`~rowstore.codecs.abc.Encoded`). ``verify_encoded=True`` also decodes
each one in full.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any

import numpy as np

from rowstore.codecs.abc import Encoded
from rowstore.errors import CodecError, RowValidationError
from rowstore.schema import BYTES, STR, Field

__all__ = ["check_value", "check_column", "describe", "as_columns"]


def as_columns(data: Any, first_row: int) -> Mapping[str, Any]:
    """``data`` as a mapping of columns: a mapping as is, a DataFrame-like object (``.columns``
    and ``data[name].to_numpy()``, e.g. pandas) column by column, else an error saying what
    to pass. Cells of object columns go through unchanged (ndarrays, str, missing values)."""
    if isinstance(data, Mapping):
        return data
    cols = getattr(data, "columns", None)
    if cols is not None and hasattr(data, "__getitem__"):
        out = {}
        for name in cols:
            col = data[name]
            to_numpy = getattr(col, "to_numpy", None)
            out[str(name)] = to_numpy() if callable(to_numpy) else col
        return out
    raise RowValidationError(
        f"row {first_row}: write_batch expects columns, a mapping {{field name: array or "
        f"sequence}} or a "
        f"DataFrame, got {type(data).__name__} (for rows, call write() per row; for a pandas frame "
        f"with "
        f"its index and dtypes kept, use rowstore.from_pandas)",
        row=first_row,
    )


def _missing(field: Field, value: Any) -> bool:
    """A missing value: None, pandas' NA, and for str/bytes fields a float NaN (pandas marks
    missing text that way)."""
    if value is None or type(value).__name__ == "NAType":
        return True
    return field.dtype in (STR, BYTES) and isinstance(value, float) and value != value


def describe(value: Any) -> str:
    """A short description of a value for error messages."""
    if value is None:
        return "None"
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    if isinstance(value, (str, bytes)):
        v = value if len(value) <= 20 else value[:20]
        return f"{type(value).__name__} {v!r}{'...' if len(value) > 20 else ''}"
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__


def expected(field: Field) -> str:
    if field.dtype in (STR, BYTES):
        return field.dtype + (" or None" if field.nullable else "")
    shape = (
        "("
        + ", ".join("?" if d is None else str(d) for d in field.shape)
        + ("," if len(field.shape) == 1 else "")
        + ")"
    )
    what = f"{field.dtype} scalar" if field.shape == () else f"{field.dtype} array of shape {shape}"
    return what + (" or None" if field.nullable else "")


def _fail(field: Field, row: int, value: Any, why: str = "") -> RowValidationError:
    extra = f" ({why})" if why else ""
    return RowValidationError(
        f"row {row}: field {field.name!r}: expected {expected(field)}, "
        f"got {describe(value)}{extra}",
        field=field.name,
        row=row,
    )


def _time_value(field: Field, value: Any) -> Any:
    """For a time field, Python/pandas datetime and timedelta scalars as numpy scalars (NaT
    included); anything else unchanged."""
    for attr in ("to_datetime64", "to_timedelta64"):  # pandas Timestamp/Timedelta (NaT has both)
        conv = getattr(value, attr, None)
        if callable(conv) and not isinstance(value, np.ndarray):
            try:
                return conv()
            except Exception:
                return value
    if isinstance(value, (_dt.datetime, _dt.date, _dt.timedelta)):
        if isinstance(value, _dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)  # stored as UTC
        return np.datetime64(value) if isinstance(value, _dt.date) else np.timedelta64(value)
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, float)):
        try:
            return np.asarray([_time_value(field, v) for v in value])
        except Exception:
            return value
    return value


def _time_fail(field: Field, row: int, value: Any) -> RowValidationError:
    unit = np.datetime_data(field.dtype)[0]
    what = "datetime64" if field.dtype.kind == "M" else "timedelta64"
    hint = ""
    if isinstance(value, (int, np.integer)) or (
        isinstance(value, np.ndarray) and value.dtype.kind in "iub"
    ):
        hint = (
            f"; integers are not taken as times implicitly: pass "
            f"np.asarray(counts).astype('{what}[{unit}]') "
            f"for counts of {unit}"
        )
    return _fail(field, row, value, f"{describe_kind(value)} is not a {what}{hint}")


def describe_kind(value: Any) -> str:
    return f"{value.dtype} values" if isinstance(value, np.ndarray) else type(value).__name__


def _time_cast(field: Field, arr: np.ndarray, first_row: int, per_row: bool) -> np.ndarray:
    """``arr`` (of the field's kind) in the field's unit, or an error naming the first row
    whose value changes in the conversion (precision lost or out of range)."""
    dst = field.dtype
    if arr.dtype == dst:
        return arr
    with np.errstate(all="ignore"):
        out = arr.astype(dst)
        nat = np.isnat(arr)
        bad = ((out.astype(arr.dtype) != arr) & ~nat) | (np.isnat(out) != nat)  # NaT != NaT
    if bad.any():
        if per_row:
            i = 0
        else:
            flat = bad.reshape(len(bad), -1).any(axis=1) if bad.ndim > 1 else bad
            i = int(np.argmax(flat))
        row = first_row + i
        raise RowValidationError(
            f"row {row}: field {field.name!r}: {arr.dtype} values do not convert to {dst} without "
            f"loss "
            f"(precision or range); convert them explicitly (e.g. with .astype('{dst}'), after "
            f"rounding)",
            field=field.name,
            row=row,
        )
    return out


def _cast_ok(src: np.dtype, dst: np.dtype) -> bool | None:
    """True: cast ok; False: refuse; None: ok if values fit (integer narrowing)."""
    if src == dst or np.can_cast(src, dst, "safe"):
        return True
    if src.kind in "iu" and dst.kind in "iu":
        return None
    if src.kind in "fc" and dst.kind in "fc" and not (src.kind == "c" and dst.kind == "f"):
        return None  # narrowing floats (or into complex): ok when finite values stay finite
    if (
        src.kind in "iub" and dst.kind in "fc"
    ):  # int64 -> float32 etc: values may round, accepted like numpy
        return True
    return False


def _values_fit(arr: np.ndarray, dst: np.dtype) -> bool:
    """Integers within ``dst``'s range; floats (and complex parts) whose finite values stay
    finite in ``dst`` (1e300 would silently become inf in float32)."""
    if arr.size == 0:
        return True
    if dst.kind in "iu":
        info = np.iinfo(dst)
        return bool(arr.min() >= info.min and arr.max() <= info.max)
    big = np.finfo(dst).max
    parts = (arr.real, arr.imag) if arr.dtype.kind == "c" else (arr,)
    with np.errstate(invalid="ignore"):
        return all(not (np.isfinite(p) & (np.abs(p) > big)).any() for p in parts)


def _encoded_fail(
    field: Field, row: int, codec_id: str, shape: Any, dtype: np.dtype, why: str
) -> RowValidationError:
    return RowValidationError(
        f"row {row}: field {field.name!r}: expected {expected(field)}, got {codec_id} bytes of a "
        f"{dtype} image of shape {tuple(shape)}{why}",
        field=field.name,
        row=row,
    )


def _check_encoded(field: Field, value: Any, row: int, verify: bool) -> Encoded:
    """An encoded value (bytes-like) for a codec that takes them, checked by its header."""
    codec = field.codec_obj
    try:
        data = value if isinstance(value, bytes) else memoryview(value).cast("B")
    except TypeError:  # a non-contiguous buffer
        raise _fail(field, row, value, "a non-contiguous buffer") from None
    view = memoryview(data)
    try:
        shape, dtype = codec.inspect_encoded(view, field)
    except CodecError as exc:
        raise RowValidationError(f"row {row}: {exc}", field=field.name, row=row) from exc
    dtype = np.dtype(dtype)
    if dtype != field.dtype or len(shape) != len(field.shape):
        raise _encoded_fail(field, row, codec.codec_id, shape, dtype, "")
    if any(d is not None and d != s for d, s in zip(field.shape, shape)):
        raise _encoded_fail(field, row, codec.codec_id, shape, dtype, " (wrong shape)")
    enc = Encoded(data, tuple(shape), dtype)
    try:
        codec.check_value(enc, field)
        if verify:
            codec.verify_encoded(view, enc.shape, field)
    except CodecError as exc:
        raise RowValidationError(f"row {row}: {exc}", field=field.name, row=row) from exc
    return enc


def check_value(field: Field, value: Any, row: int, *, verify_encoded: bool = False) -> Any:
    """Return the value normalised for storage (ndarray of the field's dtype, str, bytes, or
    :class:`~rowstore.codecs.abc.Encoded` for a value given encoded), ``None`` for a null, or
    raise :class:`RowValidationError`. pandas' ``pd.NA`` is a null, and so is a float NaN in a
    ``str``/``bytes`` field (in numeric fields NaN is a value). ``verify_encoded``: decode
    encoded values in full (else their header is checked)."""
    if value is None or (
        not isinstance(value, (np.ndarray, str, bytes)) and _missing(field, value)
    ):
        if field.nullable:
            return None
        raise RowValidationError(
            f"row {row}: field {field.name!r} is not nullable; got {describe(value)} (declare "
            f"Field(..., nullable=True) to allow it)",
            field=field.name,
            row=row,
        )
    if field.dtype == STR:
        if not isinstance(value, str):
            raise _fail(field, row, value)
        if not value.isascii():
            try:  # lone surrogates: reject here, before anything of the row or batch is stored
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise _fail(field, row, value, f"not encodable as UTF-8: {exc.reason}") from exc
        return value
    if field.dtype == BYTES:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise _fail(field, row, value)
    if isinstance(value, (bytes, bytearray, memoryview)) and field.codec_obj.accepts_encoded:
        return _check_encoded(field, value, row, verify_encoded)
    if isinstance(value, (str, bytes)):
        raise _fail(field, row, value)
    if field.is_time:
        value = _time_value(field, value)
    try:
        arr = np.asarray(value)
    except Exception:  # ragged nested lists and the like
        raise _fail(field, row, value) from None
    if field.is_time:
        if arr.dtype.kind != field.dtype.kind:
            raise _time_fail(field, row, value)
        if arr.ndim != len(field.shape) or any(
            d is not None and d != s for d, s in zip(field.shape, arr.shape)
        ):
            raise _fail(field, row, arr, "wrong shape")
        if not field.inline and any(s > 0xFFFFFFFF for s in arr.shape):
            raise _fail(field, row, arr, "a dimension exceeds 2**32-1")
        return _time_cast(field, arr, row, per_row=True)
    if arr.dtype == object or arr.dtype.kind in "USVMm":
        raise _fail(field, row, value)
    if arr.ndim != len(field.shape) or any(
        d is not None and d != s for d, s in zip(field.shape, arr.shape)
    ):
        raise _fail(field, row, arr, "wrong shape")
    ok = _cast_ok(arr.dtype, field.dtype)
    if ok is False:
        raise _fail(field, row, arr, f"{arr.dtype} does not cast safely to {field.dtype}")
    if ok is None and not _values_fit(arr, field.dtype):
        raise _fail(field, row, arr, f"values outside the range of {field.dtype}")
    if not field.inline and any(s > 0xFFFFFFFF for s in arr.shape):
        raise _fail(field, row, arr, "a dimension exceeds 2**32-1")
    if arr.dtype != field.dtype:
        arr = arr.astype(field.dtype)
    try:
        field.codec_obj.check_value(arr, field)
    except CodecError as exc:
        raise RowValidationError(f"row {row}: {exc}", field=field.name, row=row) from exc
    return arr


def check_column(
    field: Field, column: Any, n: int, first_row: int, *, verify_encoded: bool = False
) -> tuple[np.ndarray | list, np.ndarray | None]:
    """Validate a whole column of ``n`` values for a batch write.

    Returns ``(values, null_mask)``: an ndarray ``(n, *shape)`` of the field's dtype for inline
    fields given as arrays (vectorised check), else a list of per-row normalised values;
    ``null_mask`` is a bool array or None when there are no nulls.
    """
    if (
        field.is_time
        and field.inline
        and isinstance(column, np.ndarray)
        and column.dtype.kind == field.dtype.kind
    ):
        if column.shape != (n,) + tuple(field.shape):
            raise RowValidationError(
                f"row {first_row}: field {field.name!r}: expected a column of shape "
                f"{(n,) + tuple(field.shape)} ({expected(field)} per row), got {column.dtype} "
                f"array of shape {column.shape}",
                field=field.name,
                row=first_row,
            )
        return _time_cast(field, column, first_row, per_row=False), None
    if field.is_time and isinstance(column, np.ndarray) and column.dtype.kind in "iubfc":
        raise _time_fail(field, first_row, column)
    if (
        field.inline
        and not field.is_time
        and field.codec_obj.raw_bytes  # other in-row codecs check each value (check_value)
        and isinstance(column, np.ndarray)
        and column.dtype != object
        and column.dtype.kind not in "USVMm"
    ):
        if column.shape != (n,) + tuple(field.shape):
            bad = 0  # an ndarray column is homogeneous: the first row is already wrong
            raise RowValidationError(
                f"row {first_row + bad}: field {field.name!r}: expected a column of shape "
                f"{(n,) + tuple(field.shape)} ({expected(field)} per row), got {column.dtype} "
                f"array of shape {column.shape}",
                field=field.name,
                row=first_row + bad,
            )
        ok = _cast_ok(column.dtype, field.dtype)
        if ok is False:
            raise RowValidationError(
                f"row {first_row}: field {field.name!r}: expected {expected(field)}, got "
                f"{column.dtype} values "
                f"({column.dtype} does not cast safely to {field.dtype})",
                field=field.name,
                row=first_row,
            )
        if ok is None and not _values_fit(column, field.dtype):
            bad = next(i for i in range(n) if not _values_fit(column[i], field.dtype))
            raise RowValidationError(
                f"row {first_row + bad}: field {field.name!r}: values outside the range of "
                f"{field.dtype}",
                field=field.name,
                row=first_row + bad,
            )
        return column, None
    if (
        isinstance(column, np.ndarray)
        and column.ndim >= 1
        and column.dtype != object
        and field.dtype not in (STR, BYTES)
    ):
        items: Any = list(column)  # heap field given as a 2-D+ array: one row per item
    else:
        items = list(column) if not isinstance(column, list) else column
    if len(items) != n:
        raise RowValidationError(
            f"row {first_row}: field {field.name!r}: column has {len(items)} values, expected {n}",
            field=field.name,
            row=first_row,
        )
    values = [
        check_value(field, v, first_row + i, verify_encoded=verify_encoded)
        for i, v in enumerate(items)
    ]
    mask = None
    if field.nullable:
        m = np.fromiter((v is None for v in values), dtype=bool, count=n)
        mask = m if m.any() else None
    return values, mask
