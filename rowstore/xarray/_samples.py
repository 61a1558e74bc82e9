"""A Dataset with a sample dimension in and out: one row per sample (:func:`to_rowstore`), read
back eagerly or lazily (:func:`open_dataset`, through :class:`RowstoreArray`)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import xarray as xr
from xarray.backends import BackendArray
from xarray.core import indexing

from rowstore.errors import FormatError, SchemaError
from rowstore.reader import Reader
from rowstore.schema import Field, Schema
from rowstore.writer import commit, write_shard
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES, ShardInfo
from rowstore.writer.file import DEFAULT_BLOCK_BYTES, Writer
from rowstore.xarray._meta import (
    META_KEY,
    META_VERSION,
    _attrs,
    _encoding,
    _field_dtype,
    _field_name,
    _meta,
)


# -- to_rowstore ----------------------------------------------------------------------------------
def _describe(ds: xr.Dataset, sample_dim: str) -> tuple[Schema, dict, list[tuple[str, str]]]:
    """The schema, the metadata and (variable, field) pairs of the variables along
    ``sample_dim``."""
    if sample_dim not in ds.dims:
        raise SchemaError(
            f"sample_dim {sample_dim!r} is not a dimension of the dataset (dims: {list(ds.dims)})"
        )
    taken: set[str] = set()
    fields, variables, static, pairs = [], [], [], []
    for name, var in ds.variables.items():
        is_coord = name in ds.coords
        entry = {
            "name": name,
            "dims": [str(d) for d in var.dims],
            "coord": is_coord,
            "attrs": _attrs(var.attrs, f"variable {name!r}"),
            "encoding": _encoding(var.encoding),
            "dtype": var.dtype.str,
        }
        if sample_dim in var.dims:
            fname = _field_name(name, taken)
            shape = tuple(var.sizes[d] for d in var.dims if d != sample_dim)
            dt = _field_dtype(str(name), var.dtype)
            if dt in ("str", "bytes") and shape:
                raise SchemaError(
                    f"variable {name!r}: str/bytes variables need one value per sample (dims "
                    f"{var.dims})",
                    field=fname,
                )
            fields.append(Field(fname, dt, shape))
            entry["field"] = fname
            variables.append(entry)
            pairs.append((str(name), fname))
        else:
            if not isinstance(name, str):
                raise SchemaError(
                    f"variable name {name!r}: rowstore stores variables with str names"
                )
            entry["values"] = np.asarray(var.values)
            static.append(entry)
    if not fields:
        raise SchemaError(f"no variable has the sample dimension {sample_dim!r}")
    meta = {
        "version": META_VERSION,
        "kind": "dataset",
        "sample_dim": sample_dim,
        "attrs": _attrs(ds.attrs, "dataset"),
        "variables": variables,
        "static": static,
    }
    return Schema(fields), meta, pairs


def _columns(
    ds: xr.Dataset, sample_dim: str, pairs: list[tuple[str, str]]
) -> dict[str, np.ndarray]:
    out = {}
    for name, fname in pairs:
        var = ds.variables[name]
        order = [sample_dim] + [d for d in var.dims if d != sample_dim]
        out[fname] = np.asarray(var.transpose(*order).values)
    return out


def _write_rows(
    path: str, schema_json: dict, ds: xr.Dataset, sample_dim: str, pairs: list, options: dict
) -> ShardInfo:
    return write_shard(
        path, Schema.from_json(schema_json), _columns(ds, sample_dim, pairs), **options
    )


def to_rowstore(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    sample_dim: str = "sample",
    mode: str = "w",
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    compression: Any = None,
    compute: bool = True,
) -> Any:
    """Write an ``xarray.Dataset`` with one row per element of ``sample_dim``.

    Parameters
    ----------
    ds : xarray.Dataset
        Every variable (data variable or coordinate) with ``sample_dim`` becomes a field whose
        shape is its other dimensions, in order (its name, sanitized if it is not an identifier).
        The other variables (e.g. altitude levels), the attributes of the dataset and of every
        variable (numpy-valued ones exactly) and the meaningful encodings (``units``,
        ``calendar``, ``dtype``, ``_FillValue``, ...) are stored as metadata (the user attribute
        ``"xarray"``).
    path : str or os.PathLike
        A ``.h5`` path writes one file (the variables computed chunk by chunk, in order); any
        other path a dataset directory, one shard per chunk of ``sample_dim`` (of at most
        ``shard_bytes``), written in parallel on the active Dask scheduler when ``ds`` is
        Dask-backed, and committed once.
    mode : {"w", "x", "a"}
        As for :class:`~rowstore.Writer` / :func:`~rowstore.commit` (``"a"`` adds samples of a
        dataset with the same variables; the metadata of the new rows replaces the old).
    shard_bytes, block_bytes, compression
        As for :class:`~rowstore.DatasetWriter`.
    compute : bool
        ``False`` (dataset directories): a ``dask.delayed`` that writes and commits.

    Returns
    -------
    int or None or dask.delayed.Delayed
        The committed version (a dataset directory), None (a file), or the delayed.
    """
    path = os.fspath(path)
    schema, meta, pairs = _describe(ds, sample_dim)
    attrs = {META_KEY: meta}
    n = ds.sizes[sample_dim]
    row_nbytes = max(1, sum(f.numpy_dtype.itemsize * math.prod(f.shape) for f in schema))
    step = max(1, shard_bytes // row_nbytes)
    chunks = ds.chunks.get(sample_dim) if ds.chunks else None
    bounds: list[tuple[int, int]] = []
    start = 0
    for c in chunks or (n,):
        for a in range(start, start + c, step):
            bounds.append((a, min(a + step, start + c)))
        start += c
    if path.endswith(".h5"):
        with Writer(
            path, schema, mode=mode, block_bytes=block_bytes, compression=compression, attrs=attrs
        ) as w:
            for a, b in bounds:
                w.write_batch(_columns(ds.isel({sample_dim: slice(a, b)}), sample_dim, pairs))
        return None
    options = dict(block_bytes=block_bytes, compression=compression)
    if ds.chunks:
        import dask

        write = dask.delayed(_write_rows, pure=False)
        tasks = [
            write(
                path,
                schema.to_json(),
                ds.isel({sample_dim: slice(a, b)}),
                sample_dim,
                pairs,
                options,
            )
            for a, b in bounds
        ]
        if not compute:
            return dask.delayed(_commit_all, pure=False)(path, tasks, mode, attrs)
        infos = list(dask.compute(*tasks))
    else:
        infos = [
            _write_rows(
                path,
                schema.to_json(),
                ds.isel({sample_dim: slice(a, b)}),
                sample_dim,
                pairs,
                options,
            )
            for a, b in bounds
        ]
    if not infos:  # an empty sample dimension: one empty shard carries the schema
        infos = [
            write_shard(
                path,
                schema,
                {f.name: np.empty((0, *f.shape), f.numpy_dtype) for f in schema},
                **options,
            )
        ]
    return _commit_all(path, infos, mode, attrs)


def _commit_all(path: str, infos: list, mode: str, attrs: dict) -> int:
    return commit(path, infos, mode=mode, attrs=attrs)


# -- reading --------------------------------------------------------------------------------------
class RowstoreArray(BackendArray):
    """One field of a rowstore file or dataset as a lazily indexed array (sample axis first).

    Indexing reads only the rows asked for (``Reader.take``); safe to pickle (the reader holds
    a path) and to index from several threads.
    """

    def __init__(self, reader: Reader, field: str, dtype: Any = None):
        f = reader.schema[field]
        self.reader, self.field = reader, field
        self.shape = (len(reader), *f.shape)
        stored = np.dtype(object) if f.dtype in ("str", "bytes") else f.numpy_dtype
        self.dtype = (
            stored if dtype is None else np.dtype(dtype)
        )  # the variable's own (U/S width, byte order)

    def __getitem__(self, key: indexing.ExplicitIndexer) -> np.ndarray:
        return indexing.explicit_indexing_adapter(
            key, self.shape, indexing.IndexingSupport.OUTER, self._raw
        )

    def _raw(self, key: tuple) -> np.ndarray:
        k0, rest = key[0], key[1:]
        if isinstance(k0, (int, np.integer)):
            rows = np.array([k0], np.int64)
        elif isinstance(k0, slice):
            rows = np.arange(*k0.indices(self.shape[0]), dtype=np.int64)
        else:
            rows = np.asarray(k0, np.int64)
        if len(rows):
            out = np.asarray(self.reader.take(rows, fields=[self.field])[self.field])
        else:
            out = np.empty((0, *self.shape[1:]), self.dtype)
        if out.dtype != self.dtype:
            out = out.astype(self.dtype)
        axis = 1
        for k in rest:  # outer indexing: one axis at a time
            if isinstance(k, (int, np.integer)):
                out = np.take(out, k, axis=axis)
                continue
            out = (
                out[(slice(None),) * axis + (k,)]
                if isinstance(k, slice)
                else np.take(out, np.asarray(k), axis=axis)
            )
            axis += 1
        return out[0] if isinstance(k0, (int, np.integer)) else out


def _build(reader: Reader, meta: dict, drop: Iterable[str] = ()) -> xr.Dataset:
    try:
        return _build_unchecked(reader, meta, drop)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        if isinstance(exc, SchemaError):
            raise
        raise FormatError(
            f"{reader.layout.path!r}: malformed {META_KEY!r} metadata "
            f"({type(exc).__name__}: {exc})",
            path=reader.layout.path,
        ) from exc


def _build_unchecked(reader: Reader, meta: dict, drop: Iterable[str]) -> xr.Dataset:
    sample_dim = meta["sample_dim"]
    drop = set(drop)
    variables: dict[str, xr.Variable] = {}
    coords: list[str] = []
    for e in meta["variables"]:
        if e["name"] in drop:
            continue
        order = [sample_dim] + [d for d in e["dims"] if d != sample_dim]
        data = indexing.LazilyIndexedArray(RowstoreArray(reader, e["field"], e.get("dtype")))
        var = xr.Variable(order, data, attrs=e["attrs"], encoding=dict(e.get("encoding", {})))
        variables[e["name"]] = var.transpose(*e["dims"])
        if e["coord"]:
            coords.append(e["name"])
    for e in meta["static"]:
        if e["name"] in drop:
            continue
        variables[e["name"]] = xr.Variable(
            e["dims"], e["values"], attrs=e["attrs"], encoding=dict(e.get("encoding", {}))
        )
        if e["coord"]:
            coords.append(e["name"])
    names = [e["name"] for e in meta["variables"] + meta["static"] if e["name"] in variables]
    data_vars = {k: variables[k] for k in names if k not in coords}
    ds = xr.Dataset(
        data_vars, coords={k: variables[k] for k in names if k in coords}, attrs=meta["attrs"]
    )
    return ds


def open_dataset(
    path: str | os.PathLike,
    *,
    rows: Any = None,
    fields: Sequence[str] | None = None,
    chunks: Any = None,
    version: int | None = None,
) -> xr.Dataset:
    """The ``xarray.Dataset`` that :func:`to_rowstore` (or :func:`write_patches`) wrote.

    Parameters
    ----------
    path : str or os.PathLike
        A file or dataset directory written by this module.
    rows : int, slice or sequence of int, optional
        Samples to read (``isel`` along the sample dimension); default all.
    fields : sequence of str, optional
        Variables to read (coordinates along the sample dimension are always read); default all.
    chunks : optional
        ``None``: read into memory (numpy-backed). Otherwise Dask-backed, as ``Dataset.chunk``
        takes it (``{"sample": 1000}``, ``"auto"``): each chunk's task reads its rows.
    version : int, optional
        The manifest version of a dataset directory (default the current one).

    Returns
    -------
    xarray.Dataset
        Identical to the Dataset written (``xarray.testing.assert_identical``), apart from
        big-endian numbers, which come back little-endian, and tuples in attributes (lists).
    """
    reader = Reader(os.fspath(path), version=version)
    meta = _meta(reader)
    drop: set[str] = set()
    if fields is not None:
        known = {e["name"] for e in meta["variables"] + meta["static"] if not e["coord"]}
        unknown = [f for f in fields if f not in known]
        if unknown:
            raise SchemaError(
                f"fields {unknown} are not data variables of {os.fspath(path)!r} (it has "
                f"{sorted(known)})"
            )
        drop = known - set(fields)
    ds = _build(reader, meta, drop)
    if rows is not None:
        ds = ds.isel({meta["sample_dim"]: rows})
    if chunks is not None:
        return ds.chunk(chunks)
    ds = ds.load()
    reader.close()
    return ds
