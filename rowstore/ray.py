"""Ray Data datasets in and out of rowstore: written on the Ray workers, committed once by the
driver; and a :class:`ray.data.Datasource` that reads a dataset (or file) by shard and block
range.

This is the only module that imports ray (``pip install rowstore[ray]``).

- :func:`to_rowstore`: ``Dataset.write_datasink`` with :class:`RowstoreDatasink`. Each write task
  writes the blocks Ray hands it as one shard or more (:func:`rowstore.write_shard`, of about
  ``shard_bytes``; rows never travel to the driver); only the small
  :class:`~rowstore.ShardInfo` of each shard comes back, and the driver commits one manifest
  version (:func:`rowstore.commit`) once every task succeeded, the shards in the order of the
  tasks (the dataset's order: the write runs with ``preserve_order``). A failed task commits
  nothing: the previous version (or none) stays visible; the shards of this write that no
  version names are removed (and any a cancelled task writes later are orphans, which a later
  ``commit`` or :func:`rowstore.gc_dataset` removes after their grace period).
- Types: Ray blocks are Arrow tables, so columns map through :mod:`rowstore.arrow`'s table
  (numbers, bool, str, bytes, times, lists). Ray's tensor columns (``ArrowTensorType``,
  ``ArrowTensorTypeV2``, Arrow's ``fixed_shape_tensor``: the ndarray cells of ``from_items``,
  ``from_numpy``, ``map_batches``) are fixed-shape array fields; variable-shaped tensor columns
  (``ArrowVariableShapedTensorType``: ndarrays of one rank whose shapes differ) are array fields
  with every dimension variable (``None``).
- :func:`read_rowstore` (``ray.data.read_datasource(RowstoreDatasource(...))``): one read task
  per shard, or per ``blocks_per_task`` blocks of a shard, or consecutive ones grouped to the
  parallelism Ray asks for; the rows in the reader's ``"none"`` order (shard by shard, as
  stored; ``preserve_order``). Fixed-shape fields become tensor columns, variable-shape
  fields variable-shaped tensor columns (``iter_batches`` gives numpy arrays,
  ``iter_torch_batches`` tensors), ``str`` and ``bytes`` Arrow strings and binaries, scalars
  their Arrow type; a null is an Arrow null (a nullable array field's null rows:
  ``<name>__null`` is True, the cell zero-filled, as :class:`rowstore.Reader` gives them).

The workers must see the dataset directory (one machine, or a filesystem shared by the
cluster); URLs (``s3://``...) work with ``storage_options``, which each task passes to fsspec.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import ray.data
from ray.data import Datasink, Datasource, ReadTask
from ray.data.block import BlockAccessor, BlockMetadata

from rowstore._check import one_of, positive_int
from rowstore.arrow import _attrs, _Column, _columns, _Source, write_shards
from rowstore.errors import RowValidationError, SchemaError
from rowstore.format import manifest
from rowstore.reader import Reader
from rowstore.reader.buffers import NULL_KEY, Ragged
from rowstore.schema import BYTES, STR, Schema
from rowstore.storage import absolute, destination, file_url_path
from rowstore.writer import commit, write_shard
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES

__all__ = ["to_rowstore", "read_rowstore", "RowstoreDatasink", "RowstoreDatasource"]

#: Arrow bytes of the pieces a write task cuts its blocks into (shards end between pieces).
_PIECE_BYTES = 16 << 20
#: Raw bytes (decoded rows) of one block a read task yields, at most about: Ray's own default
#: target block size is 128 MiB.
DEFAULT_READ_BLOCK_BYTES = 64 << 20


# -- Ray's tensor columns as plain Arrow ----------------------------------------------------
def _tensor_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """Ray's (fixed-shape, variable-shape) tensor extension types, and Arrow's canonical
    fixed-shape tensor type."""
    from ray.data.extensions import ArrowTensorType, ArrowVariableShapedTensorType

    fixed: list[type] = [ArrowTensorType]
    v2 = getattr(ray.data.extensions, "ArrowTensorTypeV2", None)
    if v2 is not None:
        fixed.append(v2)
    canonical = getattr(pa, "FixedShapeTensorType", None)
    if canonical is not None:
        fixed.append(canonical)
    return tuple(fixed), (ArrowVariableShapedTensorType,)


def _tensor_kind(t: pa.DataType) -> str | None:
    fixed, variable = _tensor_types()
    if isinstance(t, fixed):
        return "fixed"
    if isinstance(t, variable):
        return "variable"
    return None


def _value_type(t: pa.DataType) -> pa.DataType:
    st = t.storage_type
    if pa.types.is_struct(st):  # variable shape: struct<data: list<T>, shape: list<int64>>
        st = st.field("data").type
    return st.value_type


def _fixed_shape(t: pa.DataType) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def plain_type(t: pa.DataType) -> pa.DataType:
    """The plain Arrow type a Ray tensor column is stored as (nested fixed-size lists for a
    fixed shape, nested large lists for a variable one); other types as they are."""
    kind = _tensor_kind(t)
    if kind is None:
        return t
    out = _value_type(t)
    if kind == "fixed":
        for d in reversed(_fixed_shape(t)):
            out = pa.list_(out, d) if d else pa.large_list(out)
        return out
    for _ in range(t.ndim):
        out = pa.large_list(out)
    return out


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its tensor columns as :func:`plain_type` gives them."""
    return pa.schema(
        [pa.field(f.name, plain_type(f.type), f.nullable) for f in schema], schema.metadata
    )


def _plain_cells(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """Per-row conversion (nulls, 0-sized dimensions): the cells as nested lists."""
    cells = arr.to_numpy(zero_copy_only=False) if len(arr) else []
    valid = np.asarray(arr.is_valid()) if arr.null_count else None
    rows = [
        None if (valid is not None and not valid[i]) or c is None else np.asarray(c).tolist()
        for i, c in enumerate(cells)
    ]
    return pa.array(rows, type=t)


def plain_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A Ray tensor column as :func:`plain_type`'s type, without copying the values where they
    are contiguous (no nulls); other arrays as they are."""
    if isinstance(arr, pa.ChunkedArray):
        if _tensor_kind(arr.type) is None:
            return arr
        chunks = [plain_array(c) for c in arr.chunks]
        return pa.concat_arrays(chunks) if chunks else pa.array([], type=plain_type(arr.type))
    kind = _tensor_kind(arr.type)
    if kind is None:
        return arr
    t = plain_type(arr.type)
    storage = arr.storage
    n = len(arr)
    if kind == "fixed":
        shape = _fixed_shape(arr.type)
        if arr.null_count or 0 in shape:
            return _plain_cells(arr, t)
        out = storage.flatten()
        for d in reversed(shape):
            out = pa.FixedSizeListArray.from_arrays(out, d)
        return out
    if arr.null_count:
        return _plain_cells(arr, t)
    data, shape_col = storage.field("data"), storage.field("shape")  # sliced as the struct is
    ndim = arr.type.ndim
    shapes = shape_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    shapes = shapes.reshape(n, ndim)
    out = data.flatten()
    counts = np.ones(n, dtype=np.int64)  # sub-arrays per row at each level
    per_level = []
    for j in range(ndim):
        per_level.append(np.repeat(shapes[:, j], counts))
        counts = counts * shapes[:, j]
    for lengths in reversed(per_level):
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        out = pa.LargeListArray.from_arrays(pa.array(offsets), out)
    return out


def plain_batch(block: Any) -> pa.Table:
    """A Ray block (an Arrow table, or a pandas frame) as Arrow with plain types."""
    table = block if isinstance(block, pa.Table) else BlockAccessor.for_block(block).to_arrow()
    if not any(_tensor_kind(t) for t in table.schema.types):
        return table
    cols = [plain_array(c) for c in table.columns]
    return pa.table(cols, schema=plain_schema(table.schema))


def _arrow_schema(ds: ray.data.Dataset) -> pa.Schema:
    s = ds.schema()
    if s is None:
        raise SchemaError("the Ray dataset has no schema (no blocks): nothing tells the fields")
    base = getattr(s, "base_schema", s)
    if not isinstance(base, pa.Schema):  # a dataset of pandas blocks
        base = pa.schema([pa.field(n, t) for n, t in zip(s.names, s.types)])
    return base


# -- writing --------------------------------------------------------------------------------
def _null_counts(batch: pa.Table) -> pa.Table:
    return pa.table({c: [batch.column(c).null_count] for c in batch.column_names})


def _plan(ds: ray.data.Dataset, schema: Schema | None, nullable: Any) -> list[_Column]:
    arrow = _arrow_schema(ds)
    if schema is not None or nullable == "ray":

        def has_nulls(c: str) -> bool | None:
            return None
    elif nullable == "data":
        # per block on the workers; a few integers each to the driver (Ray's own aggregations
        # start shuffle actors: seconds even for a small dataset)
        totals = dict.fromkeys(arrow.names, 0)
        for row in ds.map_batches(
            _null_counts, batch_format="pyarrow", batch_size=None
        ).iter_rows():
            for c in arrow.names:
                totals[c] += int(row[c])

        def has_nulls(c: str) -> bool | None:
            return totals[c] > 0
    else:
        if isinstance(nullable, str) or not isinstance(nullable, Iterable):
            raise ValueError(
                "nullable must be 'data', 'ray' or the names of the nullable columns, got "
                f"{nullable!r}"
            )
        names = set(nullable)
        unknown = sorted(names - set(arrow.names))
        if unknown:
            raise SchemaError(
                f"nullable names column(s) {unknown} that the dataset lacks ({arrow.names})",
                field=unknown[0],
            )

        def has_nulls(c: str) -> bool | None:
            return c in names

    return _columns(_Source(plain_schema(arrow), iter(()), has_nulls), schema, None)


class RowstoreDatasink(Datasink):
    """Ray's write of a dataset to a rowstore dataset directory (:func:`to_rowstore` builds it).

    ``write`` runs in each write task: its blocks as shards named ``ray-<job>-<task>-...``;
    ``on_write_complete`` runs on the driver and commits them all at once (the result:
    :attr:`version`); ``on_write_failed`` removes this job's shards. Pickled to the tasks: holds
    the path, the column plan and the options only.
    """

    def __init__(
        self,
        path: str,
        cols: list[_Column],
        *,
        shard_bytes: int,
        mode: str,
        attrs: Mapping[str, Any] | None,
        storage_options: Mapping[str, Any] | None,
        writer_kwargs: Mapping[str, Any],
    ):
        self.path = path
        self.cols = cols
        self.shard_bytes = shard_bytes
        self.mode = mode
        self.attrs = dict(attrs or {})
        self.storage_options = dict(storage_options) if storage_options else None
        self.writer_kwargs = dict(writer_kwargs)
        self.job = uuid.uuid4().hex[:16]
        self.version: int | None = None

    def get_name(self) -> str:
        return "Rowstore"

    def write(self, blocks: Iterable[Any], ctx: Any) -> tuple[int, list]:
        task = int(getattr(ctx, "task_idx", 0))

        piece = min(self.shard_bytes, _PIECE_BYTES)

        def batches() -> Iterator[pa.RecordBatch]:
            for b in blocks:  # in pieces, so that a shard can end inside a large block
                t = plain_batch(b)
                rows = max(1, t.num_rows * piece // max(1, t.nbytes))
                yield from t.to_batches(max_chunksize=rows)

        try:
            infos = write_shards(
                self.path,
                self.cols,
                batches(),
                shard_bytes=self.shard_bytes,
                name_prefix=f"ray-{self.job}-{task:05d}-{uuid.uuid4().hex[:6]}",
                storage_options=self.storage_options,
                **self.writer_kwargs,
            )
        except RowValidationError as exc:
            raise _in_task(exc, task) from exc
        return task, infos

    def on_write_complete(self, write_result: Any) -> None:
        first: dict[int, list] = {}
        for task, infos in write_result.write_returns:
            first.setdefault(task, infos)  # one attempt per task
        infos = [i for t in sorted(first) for i in first[t]]
        committed: set[str] = set()
        try:
            if not infos and self.mode != "a":  # an empty dataset: an empty version, not an error
                rs_schema = Schema([c.field for c in self.cols])
                infos = [
                    write_shard(
                        self.path,
                        rs_schema,
                        {f.name: [] for f in rs_schema},
                        name=f"ray-{self.job}-empty",
                        storage_options=self.storage_options,
                        **self.writer_kwargs,
                    )
                ]
            committed = {i.path for i in infos}
            if infos:
                self.version = commit(
                    self.path,
                    infos,
                    mode=self.mode,
                    attrs=_attrs(self.cols, self.attrs),
                    storage_options=self.storage_options,
                )
            else:
                self.version = _current_version(self.path, self.storage_options)
        finally:
            self._remove_job_files(committed)

    def on_write_failed(self, error: Exception) -> None:
        self._remove_job_files(set())

    def _remove_job_files(self, keep: set[str]) -> None:
        """Remove this job's shards that ``keep`` (the committed ones) does not name: those of
        failed and retried tasks, or all of them after a failure."""
        with contextlib.suppress(OSError):
            dest = destination(self.path, self.storage_options)
            for n in dest.list(manifest.SHARD_DIR):
                rel = f"{manifest.SHARD_DIR}/{n}"
                if n.startswith(f"ray-{self.job}-") and rel not in keep:
                    with contextlib.suppress(OSError):
                        dest.remove(rel)


def _current_version(path: str, storage_options: Mapping[str, Any] | None) -> int | None:
    with Reader(path, storage_options=dict(storage_options or {}) or None) as r:
        return r.layout.version


def _in_task(exc: RowValidationError, task: int) -> RowValidationError:
    """``exc`` saying which write task's rows its row number counts."""
    out = RowValidationError(
        f"{exc} (row {exc.row} of write task {task}'s rows)", field=exc.field, row=exc.row
    )
    return out


def to_rowstore(
    ds: ray.data.Dataset,
    path: str | os.PathLike,
    *,
    schema: Schema | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    mode: str = "w",
    nullable: str | Iterable[str] = "data",
    attrs: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    concurrency: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
    **writer_kwargs: Any,
) -> int:
    """Write a Ray dataset as a rowstore dataset directory, each block on the worker that holds
    it, committed once on the driver.

    Parameters
    ----------
    ds : ray.data.Dataset
        Columns of the types in the module's notes (ndarray cells: tensor columns).
    path : str or os.PathLike
        The dataset directory (or a URL: ``file://``, ``s3://``...), seen by the driver and
        every worker.
    schema : Schema, optional
        The fields to store (names as the columns', sanitized), checked against the dataset's
        schema on the driver: a column a field cannot store is a
        :class:`~rowstore.errors.SchemaError` naming it. Default: from the dataset's schema.
    shard_bytes : int
        Largest shard (Arrow bytes of its rows); a write task writes one shard or more, never
        merged with another task's (``ds.repartition(n)`` sets the number of tasks).
    mode : {"w", "x", "a"}
        As for :func:`rowstore.commit`.
    nullable : {"data", "ray"} or iterable of str
        Without ``schema``: which fields are nullable. ``"data"`` (default): those whose column
        holds a null (one extra pass over the dataset counts them on the workers; only the
        counts travel); ``"ray"``: the Arrow schema's flags (Ray marks nearly every column
        nullable); or the names of the nullable columns (no extra pass; a null elsewhere is a
        :class:`~rowstore.errors.RowValidationError` naming the column).
    attrs : dict, optional
        User attributes of the version (an ``"arrow"`` entry is added).
    storage_options : dict, optional
        fsspec options of a URL, for the tasks and the commit.
    concurrency, ray_remote_args
        As for ``ray.data.Dataset.write_datasink``.
    **writer_kwargs
        ``block_bytes``, ``rows_per_block``, ``compression``, ``heap_chunk_bytes`` for
        :func:`rowstore.write_shard`.

    Returns
    -------
    int
        The version committed. Rows keep the dataset's order.

    Raises
    ------
    SchemaError
        A column type that cannot be stored, or ``schema`` not matching the columns.
    RowValidationError
        A value that does not fit (a null in a non-nullable field, sub-arrays of different
        lengths...): its field, and its row within the failing write task's rows. Nothing is
        committed.
    """
    positive_int("shard_bytes", shard_bytes)
    one_of("mode", mode, ("w", "x", "a"))
    root = absolute(file_url_path(os.fspath(path)))  # Ray's workers run elsewhere
    cols = _plan(ds, schema, nullable)
    sink = RowstoreDatasink(
        root,
        cols,
        shard_bytes=shard_bytes,
        mode=mode,
        attrs=attrs,
        storage_options=storage_options,
        writer_kwargs=writer_kwargs,
    )
    options = ds.context.execution_options
    before = options.preserve_order
    options.preserve_order = True  # task numbers follow the dataset's blocks
    try:
        ds.write_datasink(
            sink,
            concurrency=concurrency,
            ray_remote_args=dict(ray_remote_args) if ray_remote_args else None,
        )
    finally:
        options.preserve_order = before
    if sink.version is None:  # write_datasink returned without completing the sink
        raise RuntimeError(f"Ray's write to {root!r} ended without committing a version")
    return sink.version


# -- reading --------------------------------------------------------------------------------
def _arrow_column(f: Any, v: Any, nulls: np.ndarray | None) -> list[tuple[str, pa.Array]]:
    """The Ray columns of field ``f`` from a reader batch: the values, plus ``<name>__null``
    for a nullable array field."""
    from ray.data.extensions import ArrowTensorArray

    if f.dtype in (STR, BYTES):
        return [(f.name, pa.array(list(v), type=pa.string() if f.dtype == STR else pa.binary()))]
    if not f.shape:
        mask = nulls if nulls is not None and nulls.any() else None
        return [(f.name, pa.array(v, mask=mask))]
    if isinstance(v, Ragged):
        arr = _variable_tensor(v)
    else:
        arr = ArrowTensorArray.from_numpy(np.ascontiguousarray(v))
    out = [(f.name, arr)]
    if f.nullable:
        out.append((f.name + NULL_KEY, pa.array(nulls if nulls is not None else [False] * len(v))))
    return out


def _variable_tensor(v: Ragged) -> pa.ExtensionArray:
    """A variable-shaped tensor column of ``v``'s rows, its values not copied (Ray's own
    conversion makes a fixed-shape column of a block whose rows share one shape, and a
    variable field's column keeps one type across blocks)."""
    from ray.data.extensions import ArrowVariableShapedTensorType

    n, ndim = v.shapes.shape if v.shapes.ndim == 2 else (len(v), 0)
    data = pa.LargeListArray.from_arrays(
        pa.array(v.offsets.astype(np.int64, copy=False)), pa.array(v.values.reshape(-1))
    )
    t = ArrowVariableShapedTensorType(data.type.value_type, ndim)
    shape_type = t.storage_type.field("shape").type
    shape = pa.ListArray.from_arrays(
        pa.array(np.arange(n + 1, dtype=np.int32) * ndim),
        pa.array(v.shapes.reshape(-1).astype(np.int64, copy=False)),
        type=shape_type,
    )
    storage = pa.StructArray.from_arrays([data, shape], fields=list(t.storage_type))
    return pa.ExtensionArray.from_storage(t, storage)


def _block(batch: dict, schema: Schema) -> pa.Table:
    names, arrays = [], []
    for f in schema:
        if f.name not in batch:
            continue
        for name, arr in _arrow_column(f, batch[f.name], batch.get(f.name + NULL_KEY)):
            names.append(name)
            arrays.append(arr)
    return pa.Table.from_arrays(arrays, names=names)


def _read_ranges(
    path: str,
    ranges: list[tuple[int, int]],
    fields: list[str] | None,
    version: int | None,
    storage_options: dict | None,
    rows_per_block: int,
) -> Iterator[pa.Table]:
    with Reader(path, version=version, storage_options=storage_options, num_threads=1) as r:
        schema = r.schema if fields is None else Schema([r.schema[n] for n in fields])
        for a, b in ranges:
            for lo in range(a, b, rows_per_block):
                hi = min(b, lo + rows_per_block)
                batch = r.take(np.arange(lo, hi), fields=fields, varlen="ragged")
                yield _block(batch, schema)


class RowstoreDatasource(Datasource):
    """A rowstore dataset directory (or ``.h5`` file, or URL) as a Ray ``Datasource``.

    Parameters
    ----------
    path : str or os.PathLike
        What :class:`rowstore.Reader` opens.
    fields : sequence of str, optional
        The fields to read (default: all).
    blocks_per_task : int, optional
        Rows of one read task: this many blocks of a shard (default: a whole shard). Fewer tasks
        than that make are made when Ray asks for less parallelism (consecutive ranges grouped).
    version : int, optional
        The manifest version (default: the current one, fixed when this is made).
    storage_options : dict, optional
        fsspec options of a URL, for the driver and every read task.
    read_block_bytes : int
        Largest Ray block a task yields, in decoded bytes, about.

    The read tasks reopen the dataset by path and version (the layout is not pickled into
    each task); each yields the rows of its ranges in order, so the dataset's rows are in the
    reader's ``"none"`` order when Ray keeps the order (``preserve_order``, or one task).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        fields: Sequence[str] | None = None,
        blocks_per_task: int | None = None,
        version: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        read_block_bytes: int = DEFAULT_READ_BLOCK_BYTES,
    ):
        super().__init__()
        self.path = os.fspath(path)
        self.storage_options = dict(storage_options) if storage_options else None
        self.read_block_bytes = positive_int("read_block_bytes", read_block_bytes)
        with Reader(self.path, version=version, storage_options=self.storage_options) as r:
            self.version = r.layout.version
            self.path = r.path
            unknown = [n for n in fields or () if n not in r.schema.names]
            if unknown:
                raise SchemaError(
                    f"fields {unknown} are not in the dataset ({r.schema.names})", field=unknown[0]
                )
            self.fields = list(fields) if fields is not None else None
            self.schema = r.schema if fields is None else Schema([r.schema[n] for n in fields])
            self.ranges = r.row_ranges(blocks_per_task, name="blocks_per_task")
            # decoded bytes of a row: fixed part, plus the heap's payloads (str, bytes, variable
            # arrays, images: their stored size, a lower bound when compressed) spread evenly
            heap = r.layout.heap_nbytes * len(self.schema) // max(1, len(r.schema))
            self.row_bytes = max(1, _fixed_row_bytes(self.schema) + heap // max(1, r.num_rows))
            self.num_rows = r.num_rows
            empty = r.take(np.zeros(0, np.int64), fields=self.fields, varlen="ragged")
            self.arrow_schema = _block(empty, self.schema).schema

    def get_name(self) -> str:
        return "Rowstore"

    def estimate_inmemory_data_size(self) -> int | None:
        return self.num_rows * self.row_bytes

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        groups = _group(self.ranges, parallelism)
        rows_per_block = max(1, self.read_block_bytes // self.row_bytes)
        tasks = []
        args = (self.path, self.fields, self.version, self.storage_options, rows_per_block)
        for g in groups:
            rows = sum(b - a for a, b in g)
            meta = BlockMetadata(
                num_rows=rows, size_bytes=rows * self.row_bytes, input_files=None, exec_stats=None
            )

            def read(g: list = g) -> Iterator[pa.Table]:
                return _read_ranges(args[0], g, *args[1:])

            tasks.append(
                ReadTask(
                    read, meta, schema=self.arrow_schema, per_task_row_limit=per_task_row_limit
                )
            )
        return tasks


def _fixed_row_bytes(schema: Schema) -> int:
    """Bytes of a row's fixed-shape fields as numpy holds them."""
    n = 0
    for f in schema:
        if f.dtype not in (STR, BYTES) and None not in f.shape:
            n += f.numpy_dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
    return n


def _group(ranges: list[tuple[int, int]], parallelism: int) -> list[list[tuple[int, int]]]:
    """``ranges`` as at most ``parallelism`` runs of consecutive ones, of about equal rows."""
    if parallelism <= 0 or len(ranges) <= parallelism:
        return [[r] for r in ranges]
    total = sum(b - a for a, b in ranges)
    out: list[list[tuple[int, int]]] = [[]]
    done = 0
    for r in ranges:
        if out[-1] and done >= total * len(out) / parallelism:
            out.append([])
        out[-1].append(r)
        done += r[1] - r[0]
    return out


def read_rowstore(
    path: str | os.PathLike,
    *,
    fields: Sequence[str] | None = None,
    blocks_per_task: int | None = None,
    version: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    preserve_order: bool = True,
    override_num_blocks: int | None = None,
    **read_args: Any,
) -> ray.data.Dataset:
    """A Ray dataset of a rowstore dataset (or file): ``ray.data.read_datasource`` of a
    :class:`RowstoreDatasource` (parameters as there; ``override_num_blocks`` and
    ``read_args`` for ``read_datasource``: ``concurrency``, ``ray_remote_args``...).

    ``preserve_order`` (default True) sets the dataset's own
    ``context.execution_options.preserve_order`` (the ``DataContext`` copy it was made with,
    which the datasets derived from it share): its rows then come in the reader's ``"none"``
    order, shard by shard. ``False`` lets Ray hand out blocks as their tasks finish.
    """
    src = RowstoreDatasource(
        path,
        fields=fields,
        blocks_per_task=blocks_per_task,
        version=version,
        storage_options=storage_options,
    )
    ds = ray.data.read_datasource(src, override_num_blocks=override_num_blocks, **read_args)
    if preserve_order:
        ds.context.execution_options.preserve_order = True
    return ds
