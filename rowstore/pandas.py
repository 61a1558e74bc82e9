"""pandas DataFrames in and out of rowstore: cells that hold ndarrays, and the dtypes, nulls and
index of the frame, restored exactly.

:func:`from_pandas` writes a frame as a file (:class:`~rowstore.Writer`) or a dataset directory
(:class:`~rowstore.DatasetWriter`); :func:`read_pandas` and :func:`to_pandas` read it back. This
is the only module (with :mod:`rowstore.dask`) that imports pandas; ``import rowstore`` does not.

How columns are stored (the schema is inferred from *all* the cells of the frame, or given):

==========================================
==============================================================
pandas column                               rowstore field
==========================================
==============================================================
numpy bool / int / uint / float / complex   scalar field of that dtype (``NaN`` stays ``NaN``, not
null)
``Int64``, ``UInt8``..., ``Float64``,        nullable scalar field of the numpy dtype; ``pd.NA`` ->
null
``boolean``
``str`` / ``string`` (``StringDtype``)      nullable ``str`` field; missing -> null, restored as the
                                            dtype's own missing value (``NaN`` or ``pd.NA``)
object: ``str`` / ``bytes`` cells           ``str`` / ``bytes`` field, nullable if a cell is missing
                                            (``None``, ``NaN``, ``pd.NA``; restored as that sentinel
                                            when
                                            the column used only one, else ``None``)
object: ndarray (or list) cells             array field: dtype of the cells (all must agree; an
empty
                                            list has none), shape with
                                            ``None`` wherever the cells' sizes differ, nullable if a
                                            cell
                                            is missing; read back as ndarray cells
``category``                                its integer codes (``-1`` for missing); categories and
                                            ``ordered`` are kept in the file's attributes
``datetime64[unit]`` (tz-naive or aware),   ``datetime64[unit]`` / ``timedelta64[unit]`` field
(``NaT`` is
``timedelta64[unit]``                       a value, kept as is); tz-aware columns stored in UTC,
the tz in
                                            the attributes and restored
==========================================
==============================================================

The index is stored as one field per level (named after the level, or ``index``) unless
``index=False``; a ``RangeIndex`` is kept in the attributes only, as pandas' own Parquet
writer does. Column names that are not identifiers (``"speaker id"``, ``0``) are stored under
a sanitized field name and restored. Everything needed to restore the frame is the ``"pandas"``
entry of the file's user attributes (a JSON object, see ``_META_VERSION``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from rowstore.errors import RowValidationError, SchemaError
from rowstore.reader import Reader
from rowstore.reader.buffers import NULL_KEY
from rowstore.schema import BYTES, STR, Field, Schema
from rowstore.schema import field_name as _field_name
from rowstore.writer import DatasetWriter, Writer

__all__ = ["from_pandas", "read_pandas", "to_pandas", "infer_schema", "frame_columns"]

#: Version of the ``attrs["pandas"]`` description.
_META_VERSION = 1
META_KEY = "pandas"


# -- names ------------------------------------------------------------------------------------
def _json_name(name: Any, what: str) -> Any:
    if name is None or isinstance(name, (str, bool)):
        return name
    if isinstance(name, (int, np.integer)):
        return int(name)
    if isinstance(name, (float, np.floating)) and math.isfinite(name):
        return float(name)
    raise SchemaError(f"{what} {name!r}: only str, int and float names can be stored; rename it")


# -- inference --------------------------------------------------------------------------------
def _is_missing(v: Any) -> str | None:
    """The kind of missing value ``v`` is ("None", "nan", "NA", "NaT"), or None."""
    if v is None:
        return "None"
    if v is pd.NA:
        return "NA"
    if v is pd.NaT:
        return "NaT"
    if isinstance(v, float) and v != v:
        return "nan"
    return None


_SENTINELS = {"None": None, "NA": pd.NA, "nan": np.nan, "NaT": pd.NaT}
#: Key of a column's description while inferring (never stored): its dtype came from empty lists.
GUESSED = "dtype_guessed"


def stored_meta(meta: dict) -> dict:
    """``meta`` without what only inference uses (:data:`GUESSED`), as the attributes store it."""
    idx = meta["index"]
    levels = idx["levels"] if idx and idx["kind"] == "levels" else []
    for m in levels + meta["columns"]:
        m.pop(GUESSED, None)
    return meta


def _object_plan(name: Any, fname: str, values: np.ndarray) -> tuple[Field, dict]:
    """Look at every cell of an object column: str, bytes or ndarrays (one dtype and rank)."""
    kind = None  # "str", "bytes" or "array"
    dtype: Any = None
    fallback: Any = None  # the dtype numpy gives an empty list: used when no other cell has one
    ndim: Any = None
    shape: Any = None
    first = {}  # what decided the kind / dtype / rank: the row that did
    missing: set[str] = set()
    for i, v in enumerate(values):
        m = _is_missing(v)
        if m is not None:
            missing.add(m)
            continue
        if isinstance(v, str):
            k = "str"
        elif isinstance(v, (bytes, bytearray, memoryview)):
            k = "bytes"
        elif isinstance(v, (np.ndarray, list, tuple, np.generic)):
            k = "array"
        else:
            raise SchemaError(
                f"column {name!r}, row {i}: cannot store a {type(v).__name__} cell; expected str, "
                "bytes, an ndarray or a missing value",
                field=fname,
                row=i,
            )
        if kind is None:
            kind, first["kind"] = k, i
        elif k != kind:
            raise SchemaError(
                f"column {name!r}, row {i}: a {k} cell in a column of {kind} cells (row "
                f"{first['kind']} "
                f"is {kind})",
                field=fname,
                row=i,
            )
        if k != "array":
            continue
        try:
            arr = v if isinstance(v, np.ndarray) else np.asarray(v)
        except (ValueError, TypeError) as exc:  # ragged nested lists: [[1, 2], [3]]
            raise RowValidationError(
                f"column {name!r}, row {i}: a {type(v).__name__} cell that is not an n-D "
                f"array (nested lists of different lengths?): {exc}",
                field=fname,
                row=i,
            ) from None
        if arr.dtype == object or arr.dtype.kind in "USV":
            raise SchemaError(
                f"column {name!r}, row {i}: a {arr.dtype} array cell cannot be stored; expected "
                f"numbers",
                field=fname,
                row=i,
            )
        # An empty list (or tuple) says nothing about the dtype (numpy makes it float64): the
        # other cells decide it, and it is float64 only when every cell is one.
        guessed = arr.size == 0 and not isinstance(v, (np.ndarray, np.generic))
        if ndim is None:
            ndim, shape, first["rank"] = arr.ndim, list(arr.shape), i
        elif arr.ndim != ndim:
            raise SchemaError(
                f"column {name!r}, row {i}: an array of {arr.ndim} dimensions, but row "
                f"{first['rank']} "
                f"has {ndim}",
                field=fname,
                row=i,
            )
        if guessed:
            fallback = arr.dtype if fallback is None else fallback
        elif dtype is None:
            dtype, first["dtype"] = arr.dtype, i
        elif arr.dtype != dtype:
            raise SchemaError(
                f"column {name!r}, row {i}: a {arr.dtype} array, but row {first['dtype']} holds "
                f"{dtype} "
                "(cast the column to one dtype, or pass schema=)",
                field=fname,
                row=i,
            )
        for d, s in enumerate(arr.shape):
            if shape[d] is not None and shape[d] != s:
                shape[d] = None
    nullable = bool(missing)
    na = missing.pop() if len(missing) == 1 else "None"
    if kind == "array":
        extra: dict[str, Any] = {"kind": "ndarray", "na": na}
        if dtype is None:  # empty lists only: a dtype another part of the data may decide (Dask)
            dtype, extra[GUESSED] = fallback, True
        if any(s == 0 for s in shape):  # a fixed 0 dimension cannot be stored inline
            shape = [None if s == 0 else s for s in shape]
        return Field(fname, dtype, tuple(shape), nullable=nullable), extra
    if kind == "bytes":
        return Field(fname, BYTES, nullable=nullable), {"kind": "object", "na": na}
    # str, or no value at all (an empty or all-missing column): a nullable str field
    return Field(fname, STR, nullable=nullable or kind is None), {"kind": "object", "na": na}


def _plan(name: Any, fname: str, s: pd.Series) -> tuple[Field, dict]:
    """The field that stores column ``s`` and how to restore it (JSON)."""
    dt = s.dtype
    meta: dict[str, Any] = {"field": fname, "dtype": str(dt)}
    if isinstance(dt, pd.CategoricalDtype):
        cats = dt.categories
        values = cats.to_numpy()
        if cats.dtype.kind in "Mm" or isinstance(cats.dtype, pd.DatetimeTZDtype):
            raise SchemaError(
                f"column {name!r}: categories of {cats.dtype} are not supported", field=fname
            )
        meta.update(
            kind="category",
            ordered=bool(dt.ordered),
            categories=[_json_scalar(v, name) for v in values],
            categories_dtype=str(cats.dtype),
        )
        return Field(fname, s.cat.codes.dtype), meta
    if isinstance(dt, pd.DatetimeTZDtype):
        meta.update(kind="datetime", unit=dt.unit, tz=str(dt.tz))
        return Field(fname, f"datetime64[{dt.unit}]"), meta  # UTC
    if isinstance(dt, np.dtype) and dt.kind in "Mm":
        meta.update(
            kind="datetime" if dt.kind == "M" else "timedelta",
            unit=np.datetime_data(dt)[0],
            tz=None,
        )
        return Field(fname, dt), meta
    if isinstance(dt, pd.StringDtype):
        meta.update(kind="string", storage=dt.storage, na="NA" if dt.na_value is pd.NA else "nan")
        return Field(fname, STR, nullable=True), meta
    if (
        isinstance(dt, pd.api.extensions.ExtensionDtype)
        and hasattr(dt, "numpy_dtype")
        and isinstance(s.array, pd.api.extensions.ExtensionArray)
        and hasattr(s.array, "_mask")
    ):
        meta.update(kind="masked")  # Int64, Float32, boolean...: numpy values plus a mask
        return Field(fname, dt.numpy_dtype, nullable=True), meta
    if isinstance(dt, np.dtype) and dt.kind in "biufc":
        meta.update(kind="numpy")
        return Field(fname, dt), meta
    if isinstance(dt, np.dtype) and dt.kind == "O":
        field, extra = _object_plan(name, fname, s.to_numpy())
        meta.update(extra)
        return field, meta
    raise SchemaError(
        f"column {name!r}: dtype {dt} is not supported (convert it, e.g. to str or a numpy dtype)",
        field=fname,
    )


def _json_scalar(v: Any, name: Any) -> Any:
    if isinstance(v, (np.generic,)):
        v = v.item()
    if v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v)):
        return v
    raise SchemaError(f"column {name!r}: category {v!r} cannot be stored in the attributes (JSON)")


def frame_columns(
    df: pd.DataFrame, *, index: bool = True, range_index: bool = True
) -> list[tuple[Any, str, pd.Series, str]]:
    """The frame's parts to store, in order: ``(name, field name, series, role)``; role is
    ``"column"`` or ``"index"`` (index levels first, unless ``index`` is False or the index is
    a ``RangeIndex`` and ``range_index`` keeps it in the attributes)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    if isinstance(df.columns, pd.MultiIndex):
        raise SchemaError("MultiIndex columns are not supported; flatten them (df.columns = [...])")
    if not df.columns.is_unique:
        raise SchemaError(f"column names must be unique, got {list(df.columns)}")
    taken: set[str] = set()
    parts = []
    for c in df.columns:
        _json_name(c, "column")
    names = [_field_name(c, taken) for c in df.columns]
    if index and not (range_index and isinstance(df.index, pd.RangeIndex)):
        for level in range(df.index.nlevels):
            idx = df.index.get_level_values(level)
            lname = _json_name(idx.name, "index level")
            parts.append((lname, _field_name(lname, taken), pd.Series(idx, copy=False), "index"))
    for c, fname in zip(df.columns, names):
        parts.append((c, fname, df[c], "column"))
    return parts


def _describe(
    df: pd.DataFrame, parts, index: bool, range_index: bool = True
) -> tuple[Schema, dict]:
    fields: list[Field] = []
    cols: list[dict] = []
    levels: list[dict] = []
    for name, fname, s, role in parts:
        field, meta = _plan(name, fname, s)
        meta["name"] = _json_name(name, role)
        fields.append(field)
        (levels if role == "index" else cols).append(meta)
    if not index:
        idx: dict[str, Any] | None = None
    elif range_index and isinstance(df.index, pd.RangeIndex):
        r = df.index
        idx = {
            "kind": "range",
            "start": int(r.start),
            "step": int(r.step),
            "name": _json_name(r.name, "index"),
        }
    else:
        idx = {
            "kind": "levels",
            "levels": levels,
            "multi": isinstance(df.index, pd.MultiIndex),
            "range": isinstance(df.index, pd.RangeIndex),
        }  # stored per row (Dask partitions): a RangeIndex again if it still is one
    if not fields:
        raise SchemaError("a frame without columns (and no index stored) has nothing to store")
    meta = {
        "version": _META_VERSION,
        "pandas_version": pd.__version__,
        "columns": cols,
        "index": idx,
    }
    return Schema(fields), meta


def infer_schema(df: pd.DataFrame, *, index: bool = True) -> Schema:
    """The schema :func:`from_pandas` would write ``df`` with (looking at every cell of object
    columns: variable dimensions, nulls, dtype conflicts named by column and row)."""
    return _describe(df, frame_columns(df, index=index), index)[0]


# -- writing ----------------------------------------------------------------------------------
def _column_values(field: Field, meta: dict, s: pd.Series) -> Any:
    """The values of one column as ``write_batch`` takes them."""
    kind = meta["kind"]
    if kind == "numpy":
        return s.to_numpy()
    if kind == "category":
        return s.cat.codes.to_numpy()
    if kind in ("datetime", "timedelta"):
        if meta.get("tz") is not None:
            s = s.dt.tz_convert("UTC").dt.tz_localize(None)
        vals = s.to_numpy()
        # Files of rowstore 0.x before native time fields stored int64 counts (appending to one).
        return vals.view(np.int64) if not field.is_time else vals
    if kind == "masked":
        mask = s.isna().to_numpy()
        vals = s.to_numpy(dtype=field.dtype.newbyteorder("="), na_value=0)
        if not mask.any():
            return vals
        out = vals.astype(object)
        out[mask] = None
        return out
    vals = s.to_numpy(dtype=object)
    missing = [i for i, v in enumerate(vals) if _is_missing(v) is not None]
    # Empty list cells of an array column: numpy would make them float64 (see _object_plan).
    empty = []
    if kind == "ndarray":
        empty = [i for i, v in enumerate(vals) if isinstance(v, (list, tuple)) and not len(v)]
    if missing or empty:
        vals = vals.copy()
        vals[missing] = None
        for i in empty:
            vals[i] = np.asarray(vals[i], dtype=field.numpy_dtype)
    return vals


def _columns_for(schema: Schema, meta: dict, parts) -> dict[str, Any]:
    by_field = {m["field"]: m for m in meta["columns"]}
    if meta["index"] and meta["index"]["kind"] == "levels":
        by_field.update({m["field"]: m for m in meta["index"]["levels"]})
    return {fname: _column_values(schema[fname], by_field[fname], s) for _, fname, s, _ in parts}


def from_pandas(
    df: pd.DataFrame,
    path: str | os.PathLike,
    *,
    schema: Schema | None = None,
    index: bool = True,
    dataset: bool = False,
    attrs: dict | None = None,
    codec: Mapping[Any, Any] | None = None,
    **writer_kwargs: Any,
) -> Schema:
    """Write a DataFrame to ``path``: one ``.h5`` file, or a dataset directory with
    ``dataset=True``.

    Parameters
    ----------
    df : pandas.DataFrame
        Columns of the kinds in the module's table; object columns may hold ndarrays (of one
        dtype and rank; shapes may vary), ``str`` or ``bytes``, and missing values.
    path : str or os.PathLike
        The file (or directory) to write; it appears only when complete.
    schema : Schema, optional
        The fields to write with (same field names as :func:`infer_schema` gives, e.g. a
        ``float32`` field for ``float64`` cells, or a codec); default: inferred from all cells.
    index : bool
        Store the index (default) and restore it on reading.
    dataset : bool
        Write a dataset directory through :class:`~rowstore.DatasetWriter` (``shard_bytes=``...)
        rather than one file through :class:`~rowstore.Writer`.
    attrs : dict, optional
        User attributes stored beside the ``"pandas"`` entry this function adds.
    codec : mapping, optional
        A codec for some columns, by column name, on the inferred fields (``{"wave": {"id":
        "flac", "sample_rate": 16000}}``: a column of waveform arrays stored as FLAC,
        encoded on the writer's threads; a codec name, config dict or object, as
        :class:`~rowstore.Field` takes). Not with ``schema``, which says it all.
    **writer_kwargs
        Passed to the writer: ``block_bytes``, ``compression``, ``rows_per_block``, ``mode``...

    Returns
    -------
    Schema
        The schema written.

    Raises
    ------
    SchemaError
        A column that cannot be stored, or cells that disagree (dtype, rank, kind), naming the
        column and the row; :class:`~rowstore.errors.RowValidationError` for cells that do not
        fit a given ``schema`` (field and row named).
    """
    parts = frame_columns(df, index=index)
    inferred, meta = _describe(df, parts, index)
    if codec and schema is not None:
        raise ValueError("pass codec= or schema=, not both (the schema says it all)")
    if schema is None:
        schema = _with_codecs(inferred, parts, codec or {})
    elif not isinstance(schema, Schema):
        raise TypeError(f"schema must be a rowstore.Schema, got {type(schema).__name__}")
    elif sorted(schema.names) != sorted(inferred.names):
        raise SchemaError(
            f"schema fields {schema.names} differ from the frame's {inferred.names} "
            "(see rowstore.pandas.infer_schema)"
        )
    user = dict(attrs or {})
    user[META_KEY] = stored_meta(meta)
    columns = _columns_for(inferred, meta, parts)
    cls = DatasetWriter if dataset else Writer
    with cls(path, schema, attrs=user, **writer_kwargs) as w:
        w.write_batch(columns)
    return schema


def _with_codecs(schema: Schema, parts, codec: Mapping[Any, Any]) -> Schema:
    """``schema`` with the codecs given by column name."""
    if not codec:
        return schema
    fields = {name: fname for name, fname, _, _ in parts}
    unknown = [c for c in codec if c not in fields]
    if unknown:
        raise SchemaError(f"codec: no column(s) {unknown}; the columns are {list(fields)}")
    by_field = {fields[c]: spec for c, spec in codec.items()}
    return Schema(
        [
            Field(f.name, f.dtype, f.shape, codec=by_field[f.name], nullable=f.nullable)
            if f.name in by_field
            else f
            for f in schema
        ]
    )


# -- reading ----------------------------------------------------------------------------------
def _cells(v: Any, n: int) -> np.ndarray:
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = v[i]
    return out


def _restore(meta: Any, field: Field, batch: dict, index: Any) -> Any:
    """A column (Series values) from a batch, as ``meta`` says (generic when None)."""
    v = batch[field.name]
    nulls = batch.get(field.name + NULL_KEY)
    nulls = nulls if nulls is not None and nulls.any() else None
    n = len(v)
    kind = meta["kind"] if meta else None
    if kind is None:
        if field.shape == () and field.is_time:  # a plain file's time field: nulls as NaT
            if nulls is None:
                return v
            out = v.copy()
            out[nulls] = np.datetime64("NaT") if field.dtype.kind == "M" else np.timedelta64("NaT")
            return out
        if field.shape == () and field.dtype not in (STR, BYTES):
            return (
                _masked(field.dtype, v, nulls if nulls is not None else np.zeros(n, bool))
                if field.nullable
                else v
            )
        kind, meta = (
            ("object", {"na": "None"})
            if field.dtype in (STR, BYTES)
            else ("ndarray", {"na": "None"})
        )
    if kind == "numpy":
        return v
    if kind == "category":
        cats = pd.Index(meta["categories"], dtype=meta["categories_dtype"])
        return pd.Categorical.from_codes(v, categories=cats, ordered=meta["ordered"])
    if kind in ("datetime", "timedelta"):
        # A native time field; int64 counts in files written before there were any.
        arr = (
            v if field.is_time else v.view(f"{'M' if kind == 'datetime' else 'm'}8[{meta['unit']}]")
        )
        if meta.get("tz") is not None:
            return pd.Series(arr, copy=False).dt.tz_localize("UTC").dt.tz_convert(meta["tz"]).array
        return arr
    if kind == "masked":
        return _masked(
            field.dtype, v, nulls if nulls is not None else np.zeros(n, bool), meta["dtype"]
        )
    if kind == "string":
        dtype = pd.StringDtype(meta["storage"], na_value=_SENTINELS[meta["na"]])
        return (
            pd.array(v, dtype=dtype)
            if nulls is None
            else pd.array(np.where(nulls, None, v), dtype=dtype)
        )
    out = _cells(v, n) if not (isinstance(v, np.ndarray) and v.dtype == object) else v.copy()
    if nulls is not None:
        out[nulls] = _SENTINELS[meta["na"]]
    return out


def _masked_name(dtype: np.dtype) -> str:
    return (
        "boolean"
        if dtype.kind == "b"
        else str(dtype.newbyteorder("=")).capitalize().replace("Uint", "UInt")
    )


def _masked(dtype: np.dtype, values: np.ndarray, mask: np.ndarray, name: str | None = None) -> Any:
    pdt = pd.api.types.pandas_dtype(name or _masked_name(dtype))
    return pdt.construct_array_type()(values.astype(pdt.numpy_dtype, copy=False), mask.copy())


def _as_range(index: pd.Index) -> pd.Index:
    """``index`` as a RangeIndex when its values are an increasing arithmetic progression."""
    v = index.to_numpy()
    if len(v) == 0:
        return pd.RangeIndex(0, name=index.name)
    step = int(v[1] - v[0]) if len(v) > 1 else 1
    if step > 0 and (len(v) < 3 or bool((np.diff(v) == step).all())):
        return pd.RangeIndex(int(v[0]), int(v[-1]) + step, step, name=index.name)
    return index


def _rows_arg(rows: Any, n: int) -> np.ndarray:
    if rows is None:
        return np.arange(n, dtype=np.int64)
    if isinstance(rows, slice):
        return np.arange(n, dtype=np.int64)[rows]
    idx = np.asarray(rows)
    if idx.dtype.kind not in "iu" and idx.size:
        raise TypeError(f"rows must be integers or a slice, got {idx.dtype}")
    return np.where(idx < 0, idx + n, idx).astype(np.int64).reshape(-1)


def to_pandas(
    reader: Reader, *, rows: Any = None, fields: Sequence[Any] | None = None
) -> pd.DataFrame:
    """Rows of an open reader as a DataFrame with ndarray cells, dtypes and index restored.

    ``rows``: row numbers (any order) or a slice, default all; ``fields``: the frame's column
    names to read (default all; the index is always read). A dataset not written by
    :func:`from_pandas` reads too: numbers as numpy (nullable ones as pandas' masked dtypes),
    str/bytes and arrays as object columns (``None`` for nulls).
    """
    meta: Any = reader.layout.user_attrs.get(META_KEY)
    idx_meta: Any
    idx = _rows_arg(rows, len(reader))
    if meta is None:
        col_meta = [{"name": f.name, "field": f.name, "kind": None} for f in reader.schema]
        idx_meta = None
    else:
        col_meta, idx_meta = meta["columns"], meta["index"]
    if fields is not None:
        want = list(fields)
        by_name = {m["name"]: m for m in col_meta}
        unknown = [c for c in want if c not in by_name]
        if unknown:
            raise KeyError(
                f"no column(s) {unknown}; the columns are {[m['name'] for m in col_meta]}"
            )
        col_meta = [by_name[c] for c in want]
    levels = idx_meta["levels"] if idx_meta and idx_meta["kind"] == "levels" else []
    names = [m["field"] for m in levels + col_meta]
    batch = reader.take(idx, fields=names, varlen="ragged") if names else {}
    schema = reader.schema

    def restored(m):
        return _restore(m if m.get("kind") else None, schema[m["field"]], batch, None)

    if levels:
        arrays = [pd.Index(restored(m), name=m["name"], tupleize_cols=False) for m in levels]
        index: Any = pd.MultiIndex.from_arrays(arrays) if idx_meta["multi"] else arrays[0]
        if idx_meta.get("range") and not idx_meta["multi"]:
            index = _as_range(index)
    elif idx_meta and idx_meta["kind"] == "range":
        start, step = idx_meta["start"], idx_meta["step"]
        index = pd.RangeIndex(start, start + step * len(reader), step, name=idx_meta["name"])
        if rows is not None:
            index = index[idx] if not isinstance(rows, slice) else index[rows]
    elif isinstance(rows, slice) or rows is None:
        index = pd.RangeIndex(len(reader))[
            rows if rows is not None else slice(None)
        ]  # the row numbers
    else:
        index = pd.Index(idx)
    data = {}
    for m in col_meta:
        v = restored(m)
        # An explicit object dtype: pandas 3 would make str cells a "str" column (NaN for None).
        obj = isinstance(v, np.ndarray) and v.dtype == object
        data[m["name"]] = pd.Series(v, index=index, dtype=object if obj else None, copy=False)
    return pd.DataFrame(data, index=index, copy=False)


def read_pandas(
    path: str | os.PathLike,
    *,
    fields: Sequence[Any] | None = None,
    rows: Any = None,
    **reader_kwargs: Any,
) -> pd.DataFrame:
    """Read a file or dataset written by :func:`from_pandas` (or any rowstore dataset) as a
    DataFrame; see :func:`to_pandas`. ``reader_kwargs`` go to :class:`~rowstore.reader.Reader`."""
    with Reader(path, **reader_kwargs) as r:
        return to_pandas(r, rows=rows, fields=fields)
