"""Dask DataFrames in and out of rowstore datasets, written in parallel on the workers.

:func:`to_rowstore` writes each partition as shards (of about ``shard_bytes``) **on the worker that
computed it**
(:func:`rowstore.write_shard`: no lock, nothing collected to the client but the small
:class:`~rowstore.ShardInfo`) and publishes them all with a single :func:`rowstore.commit` once
every partition succeeded: a failed task leaves the previous version (or nothing) visible; the
shards already written are orphans that a later ``commit`` or :func:`rowstore.gc_dataset`
removes after their grace period. Works on any scheduler (threads, processes,
``dask.distributed``) whose workers see the dataset's directory.

:func:`read_rowstore` gives a lazy ``dask.dataframe`` with one partition per shard (or per group
of blocks), divisions known when the stored index is sorted (always for row numbers).

Column kinds, nulls and the index are handled as by :mod:`rowstore.pandas`; a partition's
``RangeIndex`` is stored as a field (each partition has its own), unless ``index=False``.

Dask converts object columns to strings by default (``dataframe.convert-string``), object
columns of ndarrays or lists too: ``dd.from_pandas`` turns each such cell into its ``str``, and
the arrays are gone. :func:`to_rowstore` keeps them where it can: a frame built by
``dd.from_pandas`` still holds the pandas frame, and the graph is rebuilt from it without the
conversion for the sources whose object columns hold anything but ``str``. Where the source is
gone (a persisted frame, ``from_delayed``...), a string column whose every value reads like the
``str`` of an array (``"[1. 2. 3.]"``, ``"[[1, 2], [3]]"``) is refused with a
:class:`~rowstore.errors.SchemaError` naming it, never stored as text (``schema=`` with a
``str`` field stores it as text on purpose). :func:`from_pandas` builds a frame without the
conversion; :func:`read_rowstore` switches it off for the graphs it builds.
"""

from __future__ import annotations

import os
import re
from typing import Any

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

from rowstore._check import positive_int
from rowstore.errors import SchemaError
from rowstore.format import spec
from rowstore.global_shuffle import run as shuffle_run
from rowstore.pandas import (
    GUESSED,
    META_KEY,
    _columns_for,
    _describe,
    frame_columns,
    read_pandas,
    stored_meta,
    to_pandas,
)
from rowstore.reader import Reader
from rowstore.schema import STR, Schema
from rowstore.writer import commit, write_shard
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES, discard

__all__ = ["from_pandas", "to_rowstore", "read_rowstore", "shuffle"]

_CONVERT_STRING = "dataframe.convert-string"


# -- Dask's string conversion -----------------------------------------------------------------
def from_pandas(
    df: pd.DataFrame,
    npartitions: int | None = None,
    *,
    chunksize: int | None = None,
    sort: bool = True,
) -> dd.DataFrame:
    """``dd.from_pandas`` without Dask's string conversion (``dataframe.convert-string``),
    which would turn the ndarray (or list) cells of object columns into their ``str``.

    Parameters are those of :func:`dask.dataframe.from_pandas`; object columns stay object
    columns (``str`` cells included), in the graph and in every partition it computes.
    """
    with dask.config.set({_CONVERT_STRING: False}):
        return dd.from_pandas(df, npartitions=npartitions, chunksize=chunksize, sort=sort)


def _converts_losslessly(frame: pd.DataFrame) -> bool:
    """Whether Dask's string conversion keeps ``frame``'s values: its object columns (and
    index) hold only ``str`` cells and missing values."""
    cols = [frame[c] for c in frame.columns if frame[c].dtype == object]
    if frame.index.dtype == object:
        cols.append(pd.Series(frame.index, copy=False))
    return all(
        isinstance(v, str) or v is None or v is pd.NA or (isinstance(v, float) and v != v)
        for s in cols
        for v in s.to_numpy()
    )


def _keep_arrays(ddf: dd.DataFrame) -> dd.DataFrame:
    """``ddf`` with its ``dd.from_pandas`` sources rebuilt without the string conversion where
    it would lose cells (ndarrays, lists, bytes...); ``ddf`` itself when none would."""
    try:
        from dask._collections import new_collection
        from dask.dataframe.dask_expr.io.io import FromPandas
    except ImportError:  # a Dask without expressions: only the check of the values is left
        return ddf
    expr = getattr(ddf, "expr", None)
    if expr is None:
        return ddf
    new = expr
    for node in list(expr.find_operations(FromPandas)):
        if node.operand("pyarrow_strings_enabled") and not _converts_losslessly(node.frame._data):
            new = new.substitute(
                node, node.substitute_parameters({"pyarrow_strings_enabled": False})
            )
    return ddf if new is expr else new_collection(new)


# The str of an ndarray ("[1. 2.]", "[[0 1]\n [2 3]]", "[ True False]", "[1. ... 9.]") or of a
# list ("[1, 2]", "[np.float64(1.0)]", "[array([1, 2])]"): brackets around numbers only.
_ARRAY_TEXT = re.compile(
    r"\[[\s\d.,+\-eEj\[\]()]*(?:(?:nan|inf|True|False|array\(|dtype=\w+|np\.\w+\()"
    r"[\s\d.,+\-eEj\[\]()]*)*\]"
)


def _check_not_array_text(df: pd.DataFrame, schema: Schema, meta: dict, user_schema: bool) -> None:
    """Refuse the string columns (``StringDtype``: what Dask's conversion makes) that are the
    ``str`` of array cells, or that a given schema stores as a non-string field."""
    for m in meta["columns"]:
        if m["kind"] != "string" or m["name"] not in df.columns:
            continue
        field = schema[m["field"]]
        s = df[m["name"]]
        if field.dtype != STR:
            why = f"a string column, which schema= stores as a {field.dtype} field"
        elif user_schema:
            continue
        else:
            values = s.dropna()
            if not len(values) or not _ARRAY_TEXT.fullmatch(str(values.iloc[0])):
                continue
            if not all(_ARRAY_TEXT.fullmatch(v) for v in values.astype(str)):
                continue
            why = f"text that reads as the str of arrays ({str(values.iloc[0])[:40]!r}...)"
        raise SchemaError(
            f"column {m['name']!r} holds {why}: Dask's {_CONVERT_STRING!r} (on by default) turned "
            "its ndarray or list cells into strings when the frame was built, and they cannot "
            "be recovered; build the frame with rowstore.dask.from_pandas(df, ...) or under "
            f"dask.config.set({{{_CONVERT_STRING!r}: False}}) (or pass schema= with a str field "
            "to store the text as it is)",
            field=m["field"],
        )


# -- schema over all partitions -----------------------------------------------------------------
def _describe_part(df: pd.DataFrame, index: bool) -> tuple[dict, dict]:
    schema, meta = _describe(
        df, frame_columns(df, index=index, range_index=False), index, range_index=False
    )
    return schema.to_json(), meta


def _merge(parts: list[tuple[dict, dict]]) -> tuple[Schema, dict]:
    """One schema for every partition's: variable where shapes differ, nullable where any is;
    a dtype or kind that differs between partitions is an error naming the column and partition."""
    schema0, meta0 = parts[0]
    fields = {f["name"]: dict(f) for f in schema0["fields"]}
    metas = {m["field"]: m for m in _all_meta(meta0)}
    for p, (schema, meta) in enumerate(parts[1:], 1):
        for f, m in zip(schema["fields"], _all_meta(meta)):
            g, gm = fields[f["name"]], metas[f["name"]]
            guessed = gm.get(GUESSED) or m.get(GUESSED)
            if g["dtype"] != f["dtype"] and gm["kind"] == m["kind"] == "ndarray" and guessed:
                if gm.pop(GUESSED, None):  # empty lists only so far: this partition's cells decide
                    g["dtype"] = f["dtype"]
                f = {**f, "dtype": g["dtype"]}
            elif not m.get(GUESSED):
                gm.pop(GUESSED, None)
            differs = (
                g["dtype"] != f["dtype"]
                or len(g["shape"]) != len(f["shape"])
                or gm["kind"] != m["kind"]
                or gm.get("categories") != m.get("categories")
                or gm.get("unit") != m.get("unit")
            )
            if differs:
                raise SchemaError(
                    f"column {m['name']!r}: partition {p} holds {m['dtype']} ({f['dtype']} of "
                    f"shape "
                    f"{tuple(f['shape'])}), partition 0 {gm['dtype']} ({g['dtype']} of shape "
                    f"{tuple(g['shape'])}); cast the column (ddf.categorize() for categories) or "
                    f"pass "
                    "schema=",
                    field=f["name"],
                )
            g["shape"] = [a if a == b else None for a, b in zip(g["shape"], f["shape"])]
            g["nullable"] = g["nullable"] or f["nullable"]
            if gm.get("na") != m.get("na") and gm["kind"] == "object":
                gm["na"] = "None"
    return Schema.from_json({"fields": list(fields.values())}), stored_meta(meta0)


def _all_meta(meta: dict) -> list[dict]:
    idx = meta["index"]
    return (idx["levels"] if idx and idx["kind"] == "levels" else []) + meta["columns"]


def _infer(ddf: dd.DataFrame, index: bool, schema: Schema | None = None) -> tuple[Schema, dict]:
    """From ``meta`` when no column is of object dtype (dtypes say everything) or when a schema
    is given (it says what object columns hold: ndarray cells for numeric fields); else one pass
    that describes each partition on the workers and merges the descriptions here."""
    head = ddf._meta
    if not any(getattr(dt, "kind", None) == "O" for dt in list(head.dtypes) + [head.index.dtype]):
        return _merge([_describe_part(head, index)])
    if schema is not None:  # no pass over the data (which would compute every partition twice)
        sj, meta = _describe_part(head, index)  # object columns of an empty frame look like str
        for m in _all_meta(meta):
            if (
                m.get("kind") == "object"
                and m["field"] in schema.names
                and schema[m["field"]].numpy_dtype.kind != "O"
            ):
                m["kind"] = "ndarray"
        return Schema.from_json(sj), meta
    parts = dask.compute(*[dask.delayed(_describe_part)(p, index) for p in ddf.to_delayed()])
    return _merge(list(parts))


# -- writing ----------------------------------------------------------------------------------
def _row_nbytes(schema: Schema, columns: dict[str, Any], n: int) -> np.ndarray:
    """Raw bytes of each row as a shard stores it before compression (what ``shard_bytes``
    counts): the packed row plus the heap payloads of its cells (ndarrays' ``nbytes``, the
    UTF-8 lengths of ``str``, lengths of ``bytes``)."""
    sizes = np.full(n, spec.row_dtype(schema).itemsize, dtype=np.int64)
    for f in schema:
        if f.inline:
            continue
        col = columns.get(f.name)
        if col is None:
            continue
        if isinstance(col, np.ndarray) and col.dtype != object:
            sizes += col.nbytes // max(1, len(col))
            continue
        sizes += np.fromiter((_cell_nbytes(v) for v in col), dtype=np.int64, count=n)
    return sizes


def _cell_nbytes(v: Any) -> int:
    if isinstance(v, np.ndarray):
        return v.nbytes
    if isinstance(v, str):
        return len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass"))
    if isinstance(v, (bytes, bytearray)):
        return len(v)
    return memoryview(v).nbytes if isinstance(v, memoryview) else 0


def _slices(sizes: np.ndarray, shard_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of at most ``shard_bytes`` each (one row at least)."""
    ends = np.cumsum(sizes)
    out, start, n = [], 0, len(sizes)
    while start < n:
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + shard_bytes, side="right")))
        out.append((start, min(stop, n)))
        start = stop
    return out


def _write_part(
    df: pd.DataFrame,
    path: str,
    schema_json: dict,
    meta: dict,
    index: bool,
    shard_bytes: int,
    options: dict,
    user_schema: bool = False,
) -> list:
    """Write one partition as shards of about ``shard_bytes`` (consecutive rows, in order); on an
    error the shards this task already wrote are removed (none is committed)."""
    if len(df) == 0:
        return []
    schema = Schema.from_json(schema_json)
    _check_not_array_text(df, schema, meta, user_schema)
    columns = _columns_for(schema, meta, frame_columns(df, index=index, range_index=False))
    n = len(df)
    bounds = _slices(_row_nbytes(schema, columns, n), shard_bytes)
    if len(bounds) == 1:
        return [write_shard(path, schema, columns, **options)]
    infos: list = []
    try:
        for a, b in bounds:
            infos.append(
                write_shard(path, schema, {k: v[a:b] for k, v in columns.items()}, **options)
            )
    except BaseException:
        discard(path, infos)
        raise
    return infos


def _commit(infos: list[list], path: str, mode: str, attrs: dict) -> int:
    return commit(path, [i for part in infos for i in part], mode=mode, attrs=attrs)


def to_rowstore(
    ddf: dd.DataFrame,
    path: str | os.PathLike,
    *,
    schema: Schema | None = None,
    index: bool = True,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    compute: bool = True,
    mode: str = "w",
    attrs: dict | None = None,
    **writer_kwargs: Any,
) -> Any:
    """Write a Dask DataFrame as a rowstore dataset directory: each non-empty partition as one shard
    or more (of about ``shard_bytes``), in partition order.

    Parameters
    ----------
    ddf : dask.dataframe.DataFrame
        Columns of the kinds :mod:`rowstore.pandas` stores.
    path : str or os.PathLike
        The dataset directory; every worker must see it (a shared filesystem for a cluster).
    schema : Schema, optional
        The fields (names as :func:`rowstore.pandas.infer_schema` gives them); given, the data is
        read once (object columns hold ndarray cells for numeric fields, str/bytes otherwise).
        Default: inferred from ``ddf._meta`` when no column is of object dtype, else by one pass
        over the partitions (each described on its worker; only the descriptions travel: the
        partitions are computed twice unless persisted).
    index : bool
        Store each partition's index as a field (restored by :func:`read_rowstore` and
        :func:`rowstore.read_pandas`).
    shard_bytes : int
        Largest shard, in raw bytes before compression (packed rows plus heap payloads, as
        :class:`~rowstore.DatasetWriter` counts them): a larger partition is written as several
        shards of consecutive rows, committed in order. Partitions are not merged: repartition
        (``ddf.repartition(partition_size=...)``) to avoid many small shards.
    compute : bool
        ``True``: write now and return the new manifest version. ``False``: return a
        ``dask.delayed`` whose computation writes the shards and then commits (in the task that
        runs last, on a worker), like Dask's own ``to_parquet``.
    mode : {"w", "x", "a"}
        As for :func:`rowstore.commit`.
    attrs : dict, optional
        User attributes of the new version (beside the ``"pandas"`` entry).
    **writer_kwargs
        ``block_bytes``, ``rows_per_block``, ``compression``, ``heap_chunk_bytes`` for
        :func:`rowstore.write_shard`.

    Returns
    -------
    int or dask.delayed.Delayed
        The version committed, or the delayed that commits it.
    """
    positive_int("shard_bytes", shard_bytes)
    path = os.fspath(path)
    ddf = _keep_arrays(ddf)
    inferred, meta = _infer(ddf, index, schema)
    if schema is None:
        schema = inferred
    elif sorted(schema.names) != sorted(inferred.names):
        raise SchemaError(f"schema fields {schema.names} differ from the frame's {inferred.names}")
    user = dict(attrs or {})
    user[META_KEY] = meta
    sj = schema.to_json()
    write = dask.delayed(_write_part, pure=False)
    given = schema is not inferred
    tasks = [
        write(p, path, sj, meta, index, shard_bytes, writer_kwargs, given) for p in ddf.to_delayed()
    ]
    if not compute:
        return dask.delayed(_commit, pure=False)(tasks, path, mode, user)
    infos = dask.compute(*tasks)  # raises if any partition failed: nothing is committed
    return _commit(list(infos), path, mode, user)


# -- reading ----------------------------------------------------------------------------------
def _read_part(
    bounds: tuple[int, int], path: str, fields: list | None, version: int | None
) -> pd.DataFrame:
    return read_pandas(path, rows=slice(*bounds), fields=fields, version=version)


def read_rowstore(
    path: str | os.PathLike,
    *,
    fields: list | None = None,
    blocks_per_partition: int | None = None,
    version: int | None = None,
) -> dd.DataFrame:
    """A lazy Dask DataFrame of a rowstore dataset (or file), as :func:`rowstore.read_pandas` reads
    it.

    One partition per shard, or per ``blocks_per_partition`` blocks (never across shards). The
    divisions are known when the index is sorted: always for row numbers (a frame written
    without its index, or with a ``RangeIndex`` by :func:`rowstore.from_pandas`), and for a
    stored index that is monotonic (checked by reading the index fields once). ``version``
    pins the manifest version (default: the current one, fixed when this is called).
    """
    path = os.fspath(path)
    with Reader(path, version=version) as r:
        version = r.layout.version
        bounds = r.row_ranges(blocks_per_partition, name="blocks_per_partition")
        meta_df = to_pandas(r, rows=[], fields=fields)
        divisions: Any = None
        info = r.layout.user_attrs.get(META_KEY)
        idx = info["index"] if info else None
        if not bounds:
            pass
        elif idx is None or idx["kind"] == "range":
            start, step = (idx["start"], idx["step"]) if idx else (0, 1)
            if step > 0:
                divisions = [start + a * step for a, _ in bounds] + [
                    start + (bounds[-1][1] - 1) * step
                ]
        elif not idx["multi"]:
            values = to_pandas(r, fields=[]).index
            if values.is_monotonic_increasing and not values.hasnans:
                divisions = [values[a] for a, _ in bounds] + [values[bounds[-1][1] - 1]]
    # Dask's "dataframe.convert-string" (on by default) would turn object columns, ndarray cells
    # included, into strings: off for this graph (it is decided when the graph is built).
    with dask.config.set({"dataframe.convert-string": False}):
        if not bounds:
            return dd.from_pandas(meta_df, npartitions=1)
        return dd.from_map(
            _read_part,
            bounds,
            path=path,
            fields=fields,
            version=version,
            meta=meta_df,
            divisions=divisions,
            enforce_metadata=False,
        )


# -- global shuffle on a cluster -----------------------------------------------------
def shuffle(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    memory: int | str = "2GB",
    seed: int = 0,
    tmp: str | os.PathLike | None = None,
    shard_bytes: int | str = DEFAULT_SHARD_BYTES,
    block_bytes: int = 1 << 20,
    compression: Any = "same",
    verify: bool | str = True,
    progress: bool = False,
    client: Any = None,
    tasks: int | None = None,
    storage_options: dict | None = None,
) -> Any:
    """:func:`rowstore.shuffle` with both passes run as tasks on a ``dask.distributed`` cluster.

    Pass 1: ``tasks`` tasks (default: two per worker thread) each scatter a contiguous range of
    input blocks to their own pile files; pass 2: one task per pile (its parts from every pass-1
    task, in input order) sorts it and writes its output shards; the client commits once and
    renames the dataset into place. The output is *the same* as :func:`rowstore.shuffle`'s for
    the same seed (rows and their order; shard boundaries follow the piles, which depend on
    ``memory``).

    ``memory`` is the budget of one task (a worker running T threads may use T budgets). The
    workers must see ``in_path``, ``tmp`` and the output's directory at the same paths (a
    shared filesystem). ``client``: a ``distributed.Client`` (default: the current one).
    Returns a :class:`rowstore.global_shuffle.ShuffleReport` (``peak_rss``: the largest
    worker's).
    """
    import distributed

    if client is None:
        try:
            client = distributed.get_client()
        except ValueError:
            raise ValueError(
                "rowstore.dask.shuffle needs a dask.distributed Client (pass client=, or create "
                "one "
                "first); for one machine without Dask use rowstore.shuffle"
            ) from None
    if tasks is None:
        threads = sum(
            w.get("nthreads", 1) for w in client.scheduler_info().get("workers", {}).values()
        )
        tasks = 2 * max(1, threads)
    else:
        tasks = positive_int("tasks", tasks)

    def mapper(fn, args, bar):
        futures = [client.submit(fn, *a, pure=False) for a in args]
        where = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(futures)
        try:
            for fut in distributed.as_completed(futures):
                res = fut.result()
                results[where[fut.key]] = res
                bar.update(res[1].rows, res[1].nbytes)
        except BaseException:
            # Let the tasks still running end (they write into the directories the caller is
            # about to remove), then release them all.
            try:
                distributed.wait(futures, timeout=600, return_when="ALL_COMPLETED")
            except Exception:  # noqa: S110 - a timeout or cancelled futures: nothing more to wait for
                pass
            client.cancel(futures)
            raise
        return results

    return shuffle_run(
        in_path,
        out_path,
        memory=memory,
        seed=seed,
        tmp=tmp,
        shard_bytes=shard_bytes,
        block_bytes=block_bytes,
        compression=compression,
        verify=verify,
        progress=progress,
        tasks=tasks,
        mapper=mapper,
        storage_options=storage_options,
    )
