"""Arrow and Parquet into rowstore: tables, record-batch streams and Parquet files or directories.

:func:`from_arrow` and :func:`from_parquet` write their rows as a file or a dataset directory,
one record batch at a time (memory stays bounded by a batch, whatever the source's size). This
module is the only one that imports pyarrow (``pip install rowstore[parquet]``); ``import
rowstore`` does not. :mod:`rowstore.spark` writes Spark DataFrames through the same mapping
(Spark hands each partition over as Arrow record batches).

How Arrow types are stored (:func:`arrow_field`):

=============================================  ====================================================
Arrow type                                     rowstore field
=============================================  ====================================================
bool, int8..uint64, float16/32/64              scalar of that dtype
string, large_string, string_view              ``str``
binary, large_binary, fixed_size_binary        ``bytes`` (or a typed field, ``payloads=``)
date32 / date64                                ``datetime64[D]`` / ``datetime64[ms]``
timestamp[unit, tz]                            ``datetime64[unit]`` (UTC for a tz; the tz is in
                                               the attributes under ``"arrow"``)
duration[unit]                                 ``timedelta64[unit]``
list / large_list of the above numbers         variable dimension (``None``); nested lists are
                                               n-D arrays (each row's sub-lists of one length)
fixed_size_list[n]                             fixed dimension ``n``
=============================================  ====================================================

A field is nullable when its column holds nulls (a :class:`pyarrow.Table`: its null counts;
Parquet: the row groups' statistics) or, for streams that cannot be looked at ahead, when the
Arrow field is nullable. A null *inside* a list is an error naming the column and row.

``payloads={column: how}`` turns binary columns into typed fields: ``how`` is ``"npy"`` (bytes
of ``numpy.save``), ``"npz"`` (``numpy.savez``: its only array), ``"png"`` or ``"jpeg"``, or a
:class:`~rowstore.Field` giving the dtype, shape and codec to store with (the name is the
column's). With a name only, the dtype and the shape come from the headers of the first
batch's values (dimensions that differ there are variable; a later value that does not fit
names its row and asks for a ``Field``); PNG fields are stored as PNG, the others raw. Every
payload's header is checked against the field, given or inferred, before its values are
decoded: a fixed shape bounds the values it may declare, an ``npy``/``npz`` header must have
the field's rank and fixed dimensions (an npz member's values are not inflated until its
header and the zip's declared size agree), else the format's limit per value holds.

PNG or JPEG cells going to a field of the same codec (``"png"`` by name, a ``png``/``jpeg``
``Field``, a schema's image field, Petastorm's ``CompressedImageCodec``) are stored as they
are: not decoded, not encoded again; the writer checks each one's header against the field
(a mismatch is a :class:`~rowstore.errors.RowValidationError` naming the field and row).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rowstore._payloads import DECODERS, Decode, declared_array
from rowstore._unischema import Unischema, read_unischema
from rowstore.errors import FormatError, RowstoreError, RowValidationError, SchemaError
from rowstore.format import spec
from rowstore.schema import BYTES, STR, Field, Schema, field_name
from rowstore.storage import local_path as _local_path
from rowstore.storage.inputs import open_input
from rowstore.writer import DatasetWriter, Writer

__all__ = ["from_arrow", "from_parquet", "arrow_field", "infer_schema", "DECODERS", "local_path"]

#: Key of the writer attributes this module adds (column names, time zones, decoded columns).
META_KEY = "arrow"
#: Rows per record batch read from Parquet (a batch is converted and written at once).
DEFAULT_BATCH_ROWS = 4096
#: What one Parquet row group may need once read, by its footer (``from_parquet``'s
#: ``max_row_group_bytes``): Spark writes row groups of about 128 MB, Petastorm of 256 MB.
DEFAULT_MAX_ROW_GROUP_BYTES = 4 << 30


def local_path(url: str | os.PathLike) -> str:
    """``url`` as a local path (``file://`` URLs accepted; see
    :func:`rowstore.storage.url.local_path`)."""
    return os.fsdecode(_local_path(url))


# -- the payloads option ---------------------------------------------------------------------
def _as_payload(col: str, spec: Any) -> Decode:
    if isinstance(spec, Decode):
        return spec
    if isinstance(spec, Field):
        how = {"png": "png", "jpeg": "jpeg"}.get(spec.codec["id"], "npy")
        return Decode(how, spec)
    if isinstance(spec, str) and spec in DECODERS:
        return Decode(spec)
    raise ValueError(
        f"payloads[{col!r}] must be one of {sorted(DECODERS)} or a rowstore.Field, got {spec!r}"
    )


def _refuse_decode(writer_kwargs: Mapping[str, Any]) -> None:
    """``decode=`` is the reader's image ops everywhere; here it would reach the writer as an
    unknown keyword, so it is refused by name, before anything is read."""
    if "decode" in writer_kwargs:
        raise TypeError("decode= is the reader's image ops; for binary columns write payloads=")


# -- types
# ------------------------------------------------------------------------------------------
def _leaf(t: pa.DataType, col: str) -> tuple[Any, tuple[int | None, ...]]:
    """(dtype, shape) of a value of Arrow type ``t`` (lists become dimensions)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or _is_list_view(t):
        dtype, shape = _leaf(t.value_type, col)
        _numeric(dtype, col, t)
        return dtype, (None, *shape)
    if pa.types.is_fixed_size_list(t):
        dtype, shape = _leaf(t.value_type, col)
        _numeric(dtype, col, t)
        return dtype, (t.list_size or None, *shape)
    if pa.types.is_boolean(t):
        return np.dtype(bool), ()
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype()), ()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is(t, "is_string_view"):
        return STR, ()
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or _is(t, "is_binary_view")
    ):
        return BYTES, ()
    if pa.types.is_date32(t):
        return np.dtype("datetime64[D]"), ()
    if pa.types.is_date64(t):
        return np.dtype("datetime64[ms]"), ()
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]"), ()
    if pa.types.is_duration(t):
        return np.dtype(f"timedelta64[{t.unit}]"), ()
    if pa.types.is_dictionary(t):
        return _leaf(t.value_type, col)
    raise SchemaError(
        f"column {col!r}: Arrow type {t} is not supported (cast it, e.g. decimals to float64 or "
        f"str, "
        "structs to separate columns)",
        field=col,
    )


def _is(t: pa.DataType, pred: str) -> bool:
    f = getattr(pa.types, pred, None)
    return bool(f and f(t))


def _is_list_view(t: pa.DataType) -> bool:
    return _is(t, "is_list_view") or _is(t, "is_large_list_view")


def _numeric(dtype: Any, col: str, t: pa.DataType) -> None:
    if dtype in (STR, BYTES):
        raise SchemaError(
            f"column {col!r}: {t} holds {dtype} values; only lists of numbers, bools and times "
            "become arrays",
            field=col,
        )


def arrow_field(af: pa.Field, *, name: str | None = None, nullable: bool | None = None) -> Field:
    """The rowstore field that stores Arrow field ``af`` (see the module's table).

    ``name``: the field's name (default: ``af.name``, which must then be an identifier);
    ``nullable``: default the Arrow field's own flag."""
    dtype, shape = _leaf(af.type, af.name)
    if any(s == 0 for s in shape):  # a fixed 0 dimension cannot be stored inline
        shape = tuple(None if s == 0 else s for s in shape)
    fixed = [d for d in shape if d is not None]
    if shape and len(fixed) == len(shape):  # stored in the row, which must fit a block
        nbytes = math.prod(fixed) * np.dtype(dtype).itemsize  # (Python ints: no wrap-around)
        if nbytes > spec.MAX_CHUNK_BYTES:
            raise SchemaError(
                f"column {af.name!r}: {af.type} makes values of {nbytes} bytes, stored in the "
                f"row, which must fit a block (spec.MAX_CHUNK_BYTES = {spec.MAX_CHUNK_BYTES} "
                "bytes); cast it to a variable-size list to store its values on the heap",
                field=af.name,
            )
    return Field(
        name or af.name, dtype, shape, nullable=af.nullable if nullable is None else bool(nullable)
    )


@dataclass
class _Column:
    """One source column: its name, field, the Arrow field and its payloads' decoder."""

    source: str
    field: Field
    arrow: pa.Field
    payload: Decode | None = None


def _plan(
    arrow_schema: pa.Schema,
    payloads: Mapping[str, Any] | None,
    has_nulls: Callable[[str], bool | None],
    first: pa.RecordBatch | None,
) -> list[_Column]:
    payloads = dict(payloads or {})
    unknown = [c for c in payloads if c not in arrow_schema.names]
    if unknown:
        raise SchemaError(
            f"payloads names column(s) {unknown} that are not in the data ({arrow_schema.names})",
            field=unknown[0],
        )
    taken: set[str] = set()
    out = []
    for af in arrow_schema:
        fname = field_name(af.name, taken)
        known = has_nulls(af.name)
        nullable = af.nullable if known is None else (known and af.nullable) or known
        if af.name in payloads:
            d = _as_payload(af.name, payloads[af.name])
            if _leaf(af.type, af.name)[0] != BYTES:
                raise SchemaError(
                    f"payloads[{af.name!r}]: the column is {af.type}, not binary", field=af.name
                )
            if d.field is not None:
                f = d.field
                field = Field(
                    fname, f.dtype, f.shape, codec=f.codec, nullable=nullable or f.nullable
                )
            else:
                field = _infer_decoded(fname, af.name, d, first, nullable)
                d = Decode(d.how, field)  # its shape bounds every payload before it is decoded
            out.append(_Column(af.name, field, af, d))
        else:
            out.append(_Column(af.name, arrow_field(af, name=fname, nullable=nullable), af))
    if not out:
        raise SchemaError("the data has no columns: nothing to store")
    return out


def _infer_decoded(
    fname: str, col: str, d: Decode, first: pa.RecordBatch | None, nullable: bool
) -> Field:
    """Dtype and shape of a decoded column from the first batch's values."""
    values = [] if first is None else [v for v in first.column(col).to_pylist() if v is not None]
    if not values:
        raise SchemaError(
            f"payloads[{col!r}]: no value in the first batch to learn the dtype and shape from; "
            "pass a rowstore.Field (payloads={col: Field(...)})",
            field=col,
        )
    arrays = [_kind(d, v, col, i) for i, v in enumerate(values)]
    a0 = arrays[0]
    shape: list[int | None] = list(a0.shape)
    for a in arrays[1:]:
        if a.dtype != a0.dtype or a.ndim != a0.ndim:
            raise SchemaError(
                f"payloads[{col!r}]: values of {a0.dtype} {a0.shape} and {a.dtype} {a.shape} in "
                "one column; pass a rowstore.Field",
                field=col,
            )
        shape = [s if s == t else None for s, t in zip(shape, a.shape)]
    shape = [None if s == 0 else s for s in shape]
    codec = {"id": "png", "level": 1} if d.how == "png" else None
    return Field(fname, a0.dtype, tuple(shape), codec=codec, nullable=nullable)


@dataclass(frozen=True)
class _Kind:
    """Dtype and shape of a decoded value, as much as inference needs of it."""

    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _kind(d: Decode, v: bytes, col: str, row: int) -> Any:
    """What ``v`` decodes to, from its header (nothing decoded: an npz member's values are
    not inflated) for the built-in decoders; decoded for others."""
    if d.how in ("npy", "npz"):
        try:
            shape, dtype = declared_array(d.how, v)
        except Exception as exc:  # a payload the decoder rejects: name it
            raise RowValidationError(
                f"column {col!r}, row {row}: the {d.how} payload does not decode: {exc}",
                field=col,
                row=row,
            ) from exc
        return _Kind(dtype, shape)
    if d.how not in ("png", "jpeg"):
        return _decoded(d, v, col, row)
    from rowstore.codecs.image import field_channels, jpeg_header, png_header

    try:
        h = (png_header if d.how == "png" else jpeg_header)(v)
    except ValueError as exc:
        raise RowValidationError(
            f"column {col!r}, row {row}: the {d.how} payload does not decode: {exc}",
            field=col,
            row=row,
        ) from None
    c = field_channels(h)
    shape = (h.height, h.width) if c == 1 else (h.height, h.width, c)
    return _Kind(h.dtype, shape)


def as_is(c: _Column) -> bool:
    """Whether column ``c``'s cells are stored as they are: PNG/JPEG cells going to a field of
    that codec (the writer checks their headers)."""
    d = c.payload
    return d is not None and d.how in ("png", "jpeg") and c.field.codec.get("id") == d.how


def binary_cells(arr: pa.Array) -> list:
    """Per row the bytes of a binary array (a ``memoryview`` into its buffer: no copy; the
    writer copies it into the file within ``write_batch``), or None."""
    t = arr.type
    if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return arr.to_pylist()
    _, offsets, data = arr.buffers()
    n = len(arr)
    offs = np.frombuffer(offsets, np.int32 if pa.types.is_binary(t) else np.int64)
    o = offs[arr.offset : arr.offset + n + 1].tolist()
    view = memoryview(data) if data is not None else memoryview(b"")
    if arr.null_count == 0:
        return [view[o[i] : o[i + 1]] for i in range(n)]
    valid = np.asarray(arr.is_valid()).tolist()
    return [view[o[i] : o[i + 1]] if valid[i] else None for i in range(n)]


def _decoded(d: Decode, v: bytes, col: str, row: int) -> np.ndarray:
    try:
        return d(v)
    except Exception as exc:  # a payload the decoder rejects: name it
        raise RowValidationError(
            f"column {col!r}, row {row}: the {d.how} payload does not decode: {exc}",
            field=col,
            row=row,
        ) from exc


# -- values ---------------------------------------------------------------------------------------
def _has_fixed_level(t: pa.DataType) -> bool:
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            return True
        t = t.value_type
    return False


def _cells(
    arr: pa.Array,
    col: str,
    first_row: int,
    rows: np.ndarray | None = None,
    stack: bool = False,
) -> Any:
    """Per row an ndarray (its list levels as dimensions) or None, for a list-typed ``arr``
    (``rows``: the batch row of each of its rows, for errors; default ``0..len - 1``); with
    ``stack``, fixed-size lists only and no null: one ``(n, *shape)`` view instead."""
    if _is_list_view(arr.type):  # offsets may overlap: rebuild as a plain list array
        arr = pa.array(arr.to_pylist(), pa.large_list(arr.type.value_type))
    if arr.null_count and _has_fixed_level(arr.type):
        # A null row of a fixed-size list keeps its slots, null ones as a rule: convert a copy
        # of the rows that are not null (take), then put the nulls back in their places.
        keep = np.flatnonzero(np.asarray(arr.is_valid()))
        cells: list = [None] * len(arr)
        for j, v in zip(keep.tolist(), _cells(arr.take(pa.array(keep)), col, first_row, keep)):
            cells[j] = v
        return cells

    def row_of(i: int) -> int:
        return first_row + (i if rows is None else int(rows[i]))

    # Per level: ("list", logical offsets) or ("fixed", (array offset, size)). List offsets
    # index the logical positions of `.values`; a fixed-size level's `.values` ignores the
    # array's own offset.
    levels: list[tuple[str, Any]] = []
    a = arr
    lo, hi = 0, len(arr)  # the positions of `a` that the rows of `arr` hold
    while (
        pa.types.is_list(a.type)
        or pa.types.is_large_list(a.type)
        or pa.types.is_fixed_size_list(a.type)
    ):
        if pa.types.is_fixed_size_list(a.type):
            levels.append(("fixed", (a.offset, a.type.list_size)))
            lo, hi = (a.offset + lo) * a.type.list_size, (a.offset + hi) * a.type.list_size
        else:
            offs = np.asarray(a.offsets).astype(np.int64, copy=False)
            levels.append(("list", offs))
            lo, hi = int(offs[lo]), int(offs[hi])
        a = a.values
        # a slice's `.values` is its whole parent's: only its own rows' values count
        if a.null_count and a.slice(lo, hi - lo).null_count:
            raise RowValidationError(
                f"column {col!r} (rows {row_of(0)}..{row_of(len(arr) - 1)}): a null inside "
                "a list value; arrays cannot hold nulls (fill them, e.g. with NaN)",
                field=col,
                row=row_of(0),
            )
    if a.null_count:  # outside this slice's rows only: filled so the dtype stays
        a = a.fill_null(pa.scalar(False if pa.types.is_boolean(a.type) else 0, type=a.type))
    values = a.to_numpy(zero_copy_only=False)
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid())
    n = len(arr)
    if stack and valid is None and all(kind == "fixed" for kind, _ in levels):
        lo, hi = 0, n
        for _, (off, size) in levels:
            lo, hi = (off + lo) * size, (off + hi) * size
        return values[lo:hi].reshape(n, *(size for _, (_, size) in levels))
    if len(levels) == 1 and levels[0][0] == "list":  # the common case: 1-D variable arrays
        offs = levels[0][1]
        out: list = [values[offs[i] : offs[i + 1]] for i in range(n)]
        if valid is not None:
            out = [v if ok else None for v, ok in zip(out, valid)]
        return out
    out = []
    for i in range(n):
        if valid is not None and not valid[i]:
            out.append(None)
            continue
        lo, hi = i, i + 1
        dims: list[int] = []
        for kind, level in levels:
            if kind == "fixed":
                off, size = level
                dims.append(size)
                lo, hi = (off + lo) * size, (off + hi) * size
            else:
                starts = level[lo : hi + 1]
                lens = np.diff(starts)
                if len(lens) and (lens != lens[0]).any():
                    raise RowValidationError(
                        f"column {col!r}, row {row_of(i)}: sub-lists of lengths "
                        f"{sorted(set(lens.tolist()))[:5]} do not make an n-D array",
                        field=col,
                        row=row_of(i),
                    )
                dims.append(int(lens[0]) if len(lens) else 0)
                lo, hi = int(starts[0]), int(starts[-1])
        out.append(values[lo:hi].reshape(dims))
    return out


def column_values(c: _Column, arr: pa.Array | pa.ChunkedArray, first_row: int) -> Any:
    """The values of one column of a batch as :meth:`Writer.write_batch` takes them."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if as_is(c):
        return binary_cells(arr)
    if c.payload is not None:
        out: list = []
        for i, v in enumerate(arr.to_pylist()):
            out.append(None if v is None else _decoded(c.payload, v, c.source, first_row + i))
        return out
    f = c.field
    if f.dtype in (STR, BYTES):
        try:
            vals = arr.to_pylist()
        except UnicodeDecodeError as exc:  # a string column's bytes (Arrow does not check them)
            raise RowValidationError(
                f"column {c.source!r} (rows {first_row}..{first_row + len(arr) - 1}): a string "
                f"that is not UTF-8 ({exc})",
                field=c.source,
                row=first_row,
            ) from None
        if pa.types.is_fixed_size_binary(arr.type) or f.dtype == BYTES:
            return [None if v is None else bytes(v) for v in vals]
        return vals
    if f.shape:
        return _cells(arr, c.source, first_row, stack=None not in f.shape)
    if arr.null_count == 0:
        return arr.to_numpy(zero_copy_only=False)
    mask = np.asarray(arr.is_null())
    zero = pa.scalar(False if pa.types.is_boolean(arr.type) else 0, type=arr.type)
    vals = arr.fill_null(zero).to_numpy(zero_copy_only=False)
    cells = np.empty(len(vals), dtype=object)
    cells[:] = list(vals)  # numpy scalars (datetime64 stays datetime64, not an int)
    cells[mask] = None
    return cells


# -- sources --------------------------------------------------------------------------------------
@dataclass
class _Source:
    schema: pa.Schema
    batches: Iterator[pa.RecordBatch]
    has_nulls: Callable[[str], bool | None]
    first: pa.RecordBatch | None = None


def _peek(it: Iterator[pa.RecordBatch]) -> tuple[pa.RecordBatch | None, Iterator[pa.RecordBatch]]:
    first = next(it, None)
    if first is None:
        return None, iter(())

    def chain() -> Iterator[pa.RecordBatch]:
        yield first
        yield from it

    return first, chain()


def _source(data: Any, batch_rows: int) -> _Source:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        table = data
        return _Source(
            table.schema,
            iter(table.to_batches(max_chunksize=batch_rows)),
            lambda c: table.column(c).null_count > 0,
        )
    if isinstance(data, pa.RecordBatchReader):
        return _Source(data.schema, iter(data), lambda c: None)
    try:
        import pyarrow.dataset as pads
    except ImportError:  # pragma: no cover - part of every pyarrow wheel
        pads = None
    if pads is not None and isinstance(data, pads.Dataset):
        return _Source(data.schema, iter(data.to_batches(batch_size=batch_rows)), lambda c: None)
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes, Mapping)):
        first, it = _peek(iter(data))
        if first is None:
            raise ValueError(
                "from_arrow: the iterable of record batches is empty (nothing tells the schema)"
            )
        if not isinstance(first, pa.RecordBatch):
            raise TypeError(f"from_arrow: expected record batches, got a {type(first).__name__}")
        return _Source(first.schema, it, lambda c: None)
    raise TypeError(
        f"from_arrow takes a pyarrow Table, RecordBatch, RecordBatchReader, "
        f"pyarrow.dataset.Dataset or "
        f"an iterable of RecordBatches, got {type(data).__name__}"
    )


def _columns(
    src: _Source, schema: Schema | None, payloads: Mapping[str, Any] | None
) -> list[_Column]:
    """The plan of every column: inferred, or the fields of ``schema`` (matched by field name;
    a binary column for a numeric field is decoded as its codec says: png, jpeg, else npy)."""
    first = None
    needs_first = any(not isinstance(v, (Field, Decode)) for v in (payloads or {}).values())
    if needs_first:
        first, src.batches = _peek(src.batches)
    cols = (
        _plan(src.schema, payloads if schema is None else None, src.has_nulls, first)
        if schema is None
        else None
    )
    if cols is not None:
        return cols
    assert schema is not None
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a rowstore.Schema, got {type(schema).__name__}")
    taken: set[str] = set()
    names = {field_name(af.name, taken): af for af in src.schema}
    if sorted(names) != sorted(schema.names):
        raise SchemaError(
            f"schema fields {schema.names} differ from the data's columns {list(names)} (as field "
            "names)"
        )
    out = []
    payloads = dict(payloads or {})
    for f in schema:
        af = names[f.name]
        kind = _leaf(af.type, af.name)[0]
        d = payloads.get(af.name)
        if d is not None:
            d = _as_payload(af.name, d)
            d = Decode(d.how, f)
        elif kind == BYTES and f.dtype != BYTES:
            d = _as_payload(af.name, f)
        elif kind != f.dtype and (kind in (STR, BYTES) or f.dtype in (STR, BYTES)):
            raise SchemaError(
                f"column {af.name!r} is {af.type}, but field {f.name!r} is {f.dtype}", field=f.name
            )
        elif kind not in (STR, BYTES):
            _check_numeric(af, f)
        out.append(_Column(af.name, f, af, d))
    return out


def _check_numeric(af: pa.Field, f: Field) -> None:
    """A numeric column against the field given for it: the same rank, and a dtype the writer
    can take (a float column for an int field is refused here, not on the first row)."""
    dtype, shape = _leaf(af.type, af.name)
    if len(shape) != len(f.shape):
        raise SchemaError(
            f"column {af.name!r} ({af.type}) holds values of {len(shape)} dimensions, but field "
            f"{f.name!r} has shape {f.shape}",
            field=f.name,
        )
    src, dst = np.dtype(dtype), f.dtype
    if src.kind in "Mm" or dst.kind in "Mm":
        ok = src.kind == dst.kind
    elif dst.kind == "b":
        ok = src.kind == "b"
    else:
        ok = np.can_cast(src, dst, "same_kind") or (src.kind in "biu" and dst.kind in "iuf")
    if not ok:
        raise SchemaError(
            f"column {af.name!r} is {af.type}, which field {f.name!r} ({dst}) cannot store",
            field=f.name,
        )


def _attrs(
    cols: list[_Column], attrs: Mapping[str, Any] | None, extra: Mapping[str, Any] | None = None
) -> dict:
    user = dict(attrs or {})
    meta: dict[str, Any] = {"columns": {c.field.name: c.source for c in cols}}
    tz = {
        c.field.name: c.arrow.type.tz
        for c in cols
        if pa.types.is_timestamp(c.arrow.type) and c.arrow.type.tz
    }
    if tz:
        meta["timezones"] = tz
    dec = {c.field.name: c.payload.how for c in cols if c.payload is not None}
    if dec:
        meta["decoded"] = dec
    meta.update(extra or {})
    user[META_KEY] = meta
    return user


def write_batches(
    writer: Any, cols: list[_Column], batches: Iterable[pa.RecordBatch], first_row: int = 0
) -> int:
    """Convert and write each record batch with ``writer.write_batch``; the rows written."""
    row = first_row
    for b in batches:
        if b.num_rows == 0:
            continue
        writer.write_batch({c.field.name: column_values(c, b.column(c.source), row) for c in cols})
        row += b.num_rows
    return row - first_row


def _write(
    path: str | os.PathLike,
    src: _Source,
    cols: list[_Column],
    dataset: bool,
    attrs: Any,
    extra: Mapping[str, Any] | None,
    writer_kwargs: dict,
) -> Schema:
    schema = Schema([c.field for c in cols])
    cls = DatasetWriter if dataset else Writer
    with cls(path, schema, attrs=_attrs(cols, attrs, extra), **writer_kwargs) as w:
        write_batches(w, cols, src.batches)
    return schema


def infer_schema(data: Any, *, payloads: Mapping[str, Any] | None = None) -> Schema:
    """The schema :func:`from_arrow` would write ``data`` (a Table, RecordBatch or
    ``pyarrow.Schema``) with."""
    if isinstance(data, pa.Schema):
        return Schema([c.field for c in _plan(data, payloads, lambda c: None, None)])
    src = _source(data, DEFAULT_BATCH_ROWS)
    return Schema([c.field for c in _columns(src, None, payloads)])


def from_arrow(
    data: Any,
    path: str | os.PathLike,
    *,
    schema: Schema | None = None,
    payloads: Mapping[str, Any] | None = None,
    dataset: bool = False,
    attrs: Mapping[str, Any] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    **writer_kwargs: Any,
) -> Schema:
    """Write Arrow data to ``path``: one ``.h5`` file, or a dataset directory with ``dataset=True``.

    Parameters
    ----------
    data : pyarrow.Table, RecordBatch, RecordBatchReader, pyarrow.dataset.Dataset, or an iterable of
    RecordBatches
        Read one record batch at a time (a Table in chunks of ``batch_rows``); only the batch
        being converted is held, so a reader or dataset of any size streams through.
    path : str or os.PathLike
        The file or directory to write; it appears only when complete.
    schema : Schema, optional
        The fields to store (names as :func:`infer_schema` gives them, i.e. sanitized column
        names); binary columns of numeric fields are decoded as the field's codec says
        (``png``, ``jpeg``, else ``npy``). Default: inferred (see the module's table).
    payloads : dict, optional
        ``{column: "npy" | "npz" | "png" | "jpeg" | Field}``: binary columns whose payloads
        become typed fields (see the module's notes). Not ``decode=``: that is the reader's
        image ops, and is refused here.
    dataset : bool
        Write a dataset directory (:class:`~rowstore.DatasetWriter`, ``shard_bytes=``...).
    attrs : dict, optional
        User attributes; an ``"arrow"`` entry (source column names, time zones, decoded
        columns) is added.
    batch_rows : int
        Rows per chunk of a Table.
    **writer_kwargs
        For the writer: ``block_bytes``, ``compression``, ``rows_per_block``, ``mode``,
        ``shard_bytes`` (datasets)...

    Returns
    -------
    Schema
        The schema written.

    Raises
    ------
    SchemaError
        A type that cannot be stored, or ``schema``/``payloads`` naming columns the data lacks.
    TypeError
        ``decode=`` (the reader's word for image ops; binary columns are ``payloads=``).
    RowValidationError
        A value that does not fit (a null in a non-nullable field, a null inside a list,
        sub-lists of different lengths, a payload that does not decode), naming column and row.
    """
    _refuse_decode(writer_kwargs)
    src = _source(data, batch_rows)
    return _write(path, src, _columns(src, schema, payloads), dataset, attrs, None, writer_kwargs)


class _Converting(Exception):
    """A conversion's RowValidationError on its way through the shard writer (its row counted
    from the first batch already)."""


def write_shards(
    path: str,
    cols: list[_Column],
    batches: Iterable[pa.RecordBatch],
    *,
    shard_bytes: int,
    name_prefix: str,
    **writer_kwargs: Any,
) -> list:
    """Write a stream of record batches as shards of about ``shard_bytes`` (Arrow bytes of the
    batches) with :func:`rowstore.write_shard` (named ``<name_prefix>-<k>``), consecutive rows in
    order; the :class:`~rowstore.ShardInfo` of each, to commit. Nothing is committed here; on an
    error the shards already written are removed. A bad value's
    :class:`~rowstore.errors.RowValidationError` counts its row from the first of ``batches``."""
    from rowstore.writer import write_shard
    from rowstore.writer.dataset import _renumber, discard

    schema = Schema([c.field for c in cols])
    it = iter(batches)
    infos: list = []
    pending: list[pa.RecordBatch] = []
    row = [0, 0]  # rows converted, rows before the current shard

    def shard_batches() -> Iterator[dict]:
        size = 0
        while size < shard_bytes:
            b = pending.pop() if pending else next(it, None)
            if b is None:
                return
            if b.num_rows == 0:
                continue
            try:
                values = {c.field.name: column_values(c, b.column(c.source), row[0]) for c in cols}
            except RowValidationError as exc:
                raise _Converting(exc) from exc
            yield values
            row[0] += b.num_rows
            size += b.nbytes

    try:
        while True:
            first = next(it, None)
            while first is not None and first.num_rows == 0:
                first = next(it, None)
            if first is None:
                break
            pending.append(first)
            row[1] = row[0]
            try:
                info = write_shard(
                    path,
                    schema,
                    shard_batches(),
                    name=f"{name_prefix}-{len(infos):04d}",
                    batches=True,
                    **writer_kwargs,
                )
            except _Converting as exc:
                raise exc.args[0] from None
            except RowValidationError as exc:  # the writer's: rows counted in the shard
                raise _renumber(exc, row[1]) from exc.__cause__
            infos.append(info)
    except BaseException:
        discard(path, infos)
        raise
    return infos


# -- Parquet
# ----------------------------------------------------------------------------------------
def parquet_files(root: str) -> list[str]:
    """The Parquet files of a file or directory, in row order: sorted by relative path (Spark's
    ``part-00000...`` names sort in partition order); names starting with ``_`` or ``.``
    (``_SUCCESS``, ``_common_metadata``, ``.crc`` files) are skipped."""
    if os.path.isfile(root):
        return [root]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no Parquet file or directory at {root!r}")
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(("_", ".")))
        out += [
            os.path.join(d, f)
            for f in files
            if not f.startswith(("_", ".")) and not f.endswith(".crc")
        ]
    out.sort(key=lambda p: os.path.relpath(p, root))
    if not out:
        raise FileNotFoundError(f"no Parquet file under {root!r}")
    return out


def _parquet_input(f: str) -> Any:
    """Parquet file ``f`` opened as every ingest input is (a regular file, found without
    blocking on a FIFO or device: :func:`rowstore.storage.inputs.open_input`), as the binary
    file object pyarrow reads; the caller closes it."""
    fd, _ = open_input(f, what="Parquet file")
    return os.fdopen(fd, "rb")


def _parquet_file(f: str) -> pq.ParquetFile:
    """Parquet file ``f`` (see :func:`_parquet_input`) as a ``ParquetFile``; close it with
    ``close(force=True)``."""
    fh = _parquet_input(f)
    try:
        with _parquet_read(f):
            return pq.ParquetFile(fh)
    except BaseException:
        fh.close()
        raise


@contextmanager
def _parquet_read(f: str) -> Iterator[None]:
    """pyarrow's errors reading Parquet file ``f`` as ours: a corrupt or truncated file (pyarrow's
    ``ArrowInvalid``, an ``OSError`` without an errno, a ``UnicodeDecodeError`` of its metadata)
    is a :class:`FormatError` naming it; an ``OSError`` with an errno stays one (I/O)."""
    try:
        yield
    except RowstoreError:
        raise
    except OSError as exc:
        if exc.errno is not None:
            raise
        raise FormatError(
            f"Parquet file {f!r} is corrupt or truncated ({type(exc).__name__}: {exc})", path=f
        ) from exc
    except (pa.ArrowException, ValueError, KeyError, IndexError, OverflowError) as exc:
        raise FormatError(
            f"Parquet file {f!r} is corrupt or truncated ({type(exc).__name__}: {exc})", path=f
        ) from exc


def _min_row_bytes(t: pa.DataType) -> int:
    """A lower bound of the bytes pyarrow allocates per row of a column of type ``t`` (at least
    1)."""
    if pa.types.is_fixed_size_list(t):
        return max(1, t.list_size * _min_row_bytes(t.value_type))
    try:
        return max(1, t.bit_width // 8)
    except ValueError:  # not fixed-width: offsets of at least 4 bytes
        return 4


def _check_row_groups(f: str, md: Any, schema: pa.Schema, limit: int) -> None:
    """Refuse, from the footer alone, a row group whose declared rows would make pyarrow
    allocate more than ``limit`` bytes for the columns of ``schema`` (a footer claiming 10**10
    rows in a file of a few KiB made it allocate 32 GiB)."""
    per_row = sum(_min_row_bytes(t) for t in schema.types)
    for g in range(md.num_row_groups):
        n = md.row_group(g).num_rows
        if n < 0 or n * per_row > limit:
            raise FormatError(
                f"Parquet file {f!r}: row group {g} declares {n} rows, at least {n * per_row} "
                f"bytes "
                f"of columns, more than max_row_group_bytes={limit} (corrupt file, or raise the "
                f"limit)",
                path=f,
            )


def _parquet_nulls(files: list[str], schema: pa.Schema) -> Callable[[str], bool | None]:
    """Per top-level primitive column: whether any row group's statistics count a null (None
    where a file has no statistics for it: the Arrow flag decides)."""
    counts: dict[str, int | None] = {}
    for f in files:
        with _parquet_input(f) as fh, _parquet_read(f):
            _null_counts(pq.read_metadata(fh), schema, counts)
    return lambda c: None if counts.get(c) is None else counts[c] > 0  # type: ignore[operator]


def _null_counts(md: Any, schema: pa.Schema, counts: dict[str, int | None]) -> None:
    """Add one file's null counts (its footer ``md``) to ``counts`` (None: not known)."""
    paths = {md.schema.column(j).path: j for j in range(md.num_columns)}
    for name in schema.names:
        j = paths.get(name)
        if j is None:  # nested: leaves are "name.list.element"...
            counts[name] = None
            continue
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(j).statistics
            if st is None or not st.has_null_count:
                counts[name] = None
                break
            if counts.get(name, 0) is not None:
                counts[name] = (counts.get(name) or 0) + st.null_count


def _parquet_batches(
    files: list[str],
    columns: list[str] | None,
    ref: pa.Schema,
    batch_rows: int,
    max_row_group_bytes: int,
) -> Iterator[pa.RecordBatch]:
    for f in files:
        pf = _parquet_file(f)
        try:
            with _parquet_read(f):
                got = pf.schema_arrow
                _check_row_groups(f, pf.metadata, ref, max_row_group_bytes)
            names = columns or ref.names
            for n in names:
                if got.get_field_index(n) < 0 or not got.field(n).type.equals(ref.field(n).type):
                    raise FormatError(
                        f"Parquet file {f!r}: column {n!r} is "
                        f"{got.field(n).type if n in got.names else 'missing'}, "
                        f"expected {ref.field(n).type} (as in {files[0]!r})",
                        path=f,
                    )
            # One row group at a time (measured: pyarrow 26's iter_batches held the whole file).
            for g in range(pf.num_row_groups):
                with _parquet_read(f):
                    group = pf.read_row_group(g, columns=names, use_pandas_metadata=False)
                    batches = group.to_batches(max_chunksize=batch_rows)
                del group
                yield from batches
                del batches
        finally:
            pf.close(force=True)


def _unischema_schema(uni: Unischema, arrow_schema: pa.Schema) -> Schema:
    """The rowstore schema of a Petastorm dataset: the Unischema's fields, those whose Parquet
    column's type decides (``uni.partial`` None) completed from ``arrow_schema``."""
    out = []
    for pf, f in zip(uni.fields, uni.partial):
        if f is None:
            if arrow_schema.get_field_index(pf.name) < 0:
                raise SchemaError(
                    f"Petastorm field {pf.name!r} has no Parquet column", field=pf.name
                )
            af = arrow_schema.field(pf.name)
            f = arrow_field(af, name=field_name(pf.name, set()), nullable=pf.nullable)
        out.append(f)
    return Schema(out)


def from_parquet(
    source: str | os.PathLike,
    path: str | os.PathLike,
    *,
    columns: Sequence[str] | None = None,
    schema: Schema | None = None,
    payloads: Mapping[str, Any] | None = None,
    petastorm: bool | str = "auto",
    dataset: bool = False,
    attrs: Mapping[str, Any] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES,
    **writer_kwargs: Any,
) -> Schema:
    """Convert a Parquet file or directory (Spark, Dask, pandas or Petastorm output) to rowstore.

    Files are read in sorted order (a directory recursively, skipping ``_*`` and ``.*``), one
    row group at a time, converted in record batches of ``batch_rows`` rows, so memory stays
    bounded by a row group (Spark writes them of about 128 MB; Petastorm of ``row_group_size_mb``).
    ``columns`` picks
    and orders columns; ``schema``, ``payloads``, ``dataset``, ``attrs`` and ``writer_kwargs`` are
    as for :func:`from_arrow`; nullability comes from the row groups' null counts.

    ``petastorm``: ``"auto"`` (default) reads a Petastorm dataset (a ``_common_metadata`` file
    holding a Unischema) as Petastorm would: its fields, dtypes, shapes and nullability, its
    codecs decoded (see :mod:`rowstore.petastorm`; petastorm itself is not needed); ``True``
    requires one; ``False`` reads the plain Parquet columns (binary payloads stay bytes).
    ``source`` may be a ``file://`` URL.

    ``max_row_group_bytes`` (4 GiB) bounds what one row group may need once read, as its
    footer declares it (rows times the columns' fixed bytes per row), before pyarrow allocates
    it. A corrupt or truncated Parquet file is a :class:`~rowstore.FormatError` naming it; an
    I/O failure an ``OSError`` with its errno.
    """
    _refuse_decode(writer_kwargs)
    root = local_path(source)
    extra: dict[str, Any] | None = None
    if petastorm not in (True, False, "auto"):
        raise ValueError(f"petastorm must be True, False or 'auto', got {petastorm!r}")
    if petastorm:
        meta = os.path.join(root, "_common_metadata")
        if os.path.exists(meta):  # a regular file (a FIFO there would block pyarrow's open)
            os.close(open_input(meta, what="Petastorm metadata file")[0])
        uni = read_unischema(root, required=petastorm is True)
        if uni is not None:
            if schema is not None or payloads is not None:
                raise ValueError(
                    "a Petastorm dataset brings its own schema and codecs: pass petastorm=False to "
                    "give schema= or payloads="
                )
            uni = uni.select(columns)
            payloads, columns = uni.payloads, uni.columns
            extra = {"petastorm": uni.describe()}
    if (
        not isinstance(max_row_group_bytes, int)
        or isinstance(max_row_group_bytes, bool)
        or max_row_group_bytes < 1
    ):
        raise ValueError(f"max_row_group_bytes must be an int >= 1, got {max_row_group_bytes!r}")
    files = parquet_files(root)
    with _parquet_input(files[0]) as fh, _parquet_read(files[0]):
        ref = pq.read_schema(fh).remove_metadata()
    if columns is not None:
        missing = [c for c in columns if c not in ref.names]
        if missing:
            raise SchemaError(
                f"columns {missing} are not in {files[0]!r} ({ref.names})", field=missing[0]
            )
        ref = pa.schema([ref.field(c) for c in columns])
    if extra is not None and uni is not None:
        schema = _unischema_schema(uni, ref)
    src = _Source(
        ref,
        _parquet_batches(files, list(ref.names), ref, batch_rows, max_row_group_bytes),
        _parquet_nulls(files, ref),
    )
    return _write(path, src, _columns(src, schema, payloads), dataset, attrs, extra, writer_kwargs)
