"""The writer: validates rows and ties together the parts that write a file.

* :mod:`._pack` packs validated values into pending rows and heap bytes (pure numpy);
* :mod:`._h5file` writes them as HDF5 chunks, then the indexes (:mod:`._index_builder`) and the
  attributes;
* :mod:`.compression` says how chunks are compressed;
* :mod:`._commit` makes the file appear at its path only when complete.

A dataset is written to a temporary file beside ``path`` and renamed onto ``path`` only when
the writer closes successfully (after ``fsync``), so ``path`` is always either absent, the
previous complete file, or the new complete file. Appending (``mode="a"``) works on a copy of
the existing file (``copy_file_range``/reflink where the filesystem offers it) and renames it
over the original at close: a crash mid-append leaves the old file untouched. The temporary
file exists from construction and its lock makes the writer the only one of ``path`` (see
:mod:`._commit`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from rowstore.codecs.abc import Encoded
from rowstore.codecs.blocks import block_compression
from rowstore.errors import RowValidationError, SchemaError, WriterClosedError
from rowstore.format import attrs as attrs_json
from rowstore.format import spec
from rowstore.format._raw import RawRows
from rowstore.format.stats import encode_stats
from rowstore.schema import Schema
from rowstore.storage import StagedFile, stage_file
from rowstore.storage.atomic import AtomicFile
from rowstore.writer._h5file import Compressor, H5File, check_storable, file_attributes, read_tail
from rowstore.writer._pack import (
    RowPacker,
    check_value_size,
    first_rows_per_block,
    max_rows_per_block,
)
from rowstore.writer._stats import StatsKeeper
from rowstore.writer.values import as_columns, check_column, check_value

if TYPE_CHECKING:
    from rowstore.format.index import Layout

__all__ = ["Writer"]

DEFAULT_BLOCK_BYTES = 1 << 20
DEFAULT_HEAP_CHUNK_BYTES = 1 << 20


class Closing:
    """The lifecycle of :class:`Writer` and :class:`~rowstore.writer.dataset.DatasetWriter`:
    ``with`` closes on success and aborts on an exception; a writer collected unclosed warns
    (``ResourceWarning``) and aborts. Subclasses define ``close``, ``abort``, ``path`` and
    ``_closed``."""

    path: str
    _closed: bool

    def close(self) -> Any:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(
                f"rowstore.{type(self).__name__} for {self.path!r} was never closed; its rows are "
                f"discarded",
                ResourceWarning,
                stacklevel=2,
            )
            self.abort()


class Writer(Closing):
    """Write rows into a rowstore file.

    Parameters
    ----------
    path : str or os.PathLike
        Final path of the ``.h5`` file. It appears only when the writer closes successfully.
    schema : Schema, optional
        Required unless appending to an existing file (which carries its schema; a schema given
        for an append must equal it).
    mode : {"w", "x", "a"}
        ``"w"`` replaces ``path`` at close, ``"x"`` fails if ``path`` exists, ``"a"`` appends to
        an existing file (or creates it).
    block_bytes : int
        Target bytes of one block (its rows plus their heap payloads); sets ``rows_per_block``
        from the first rows when that is not given (rows without payloads: rounded down to a
        multiple of 8 pages of rows, :func:`rowstore.format.spec.page_rows_per_block`). Blocks
        are the unit of reading and shuffling: ~1 MiB reads at near-``memcpy`` speed.
    rows_per_block : int, optional
        Fix the number of rows per block instead.
    compression : None, str or dict
        Per-block compression: ``None`` (default), ``"lz4"``, ``"zstd"``, ``"blosclz"``,
        ``"zlib"``, or ``{"cname": "zstd", "clevel": 5, "shuffle": "byte"}``. Stored through the
        Blosc2 HDF5 filter (id 32026) so h5py (with ``hdf5plugin``) and PyTables read it too.
        A chunk that compresses by less than 10% is stored as Blosc2's uncompressed
        (memcpy'd) chunk, which reads at copy speed.
    heap_chunk_bytes : int
        Chunk size of the heap of variable-size payloads. An uncompressed heap smaller than
        one chunk is stored as one chunk of its own size (``docs/format.md``, section 4).
    attrs : mapping, optional
        User attributes, stored in the file; also editable as ``writer.attrs``. JSON values, numpy
        arrays and numpy scalars (restored exactly: dtype, shape, bytes; see
        :mod:`rowstore.format.attrs`); anything else raises :class:`~rowstore.errors.AttrsError`.
    threads : int, optional
        Threads that compress and checksum blocks while rows are packed (compressed files
        only), and that encode the arrays of a ``write_batch`` for codecs whose encoder releases
        the GIL (``png``, ``jpeg``). Default ``min(4, os.cpu_count())``; 1 does everything on
        the calling thread. Chunks are still written in order, by the calling thread.
    durable : bool
        ``False``: no ``fsync`` at close (the file still appears only complete, but a power loss
        may lose it): for temporary files, such as the piles of :func:`rowstore.shuffle`.
    verify_encoded : bool
        Values given encoded (PNG/JPEG bytes for a ``png``/``jpeg`` field, stored as they are)
        are checked by their header: format, size, channels, bit depth against the field.
        ``True`` also decodes each one in full, so that corrupt or truncated image data is
        refused at write time rather than met at read time (costs a decode per image).
    stats : bool
        Keep statistics of the rows written (per field: counts, nulls, NaN/inf, min, max, mean,
        variance, a histogram, value counts, lengths, image sizes; ``docs/stats.md``), computed
        per block as the rows are packed and stored in the file; read them with
        ``Reader.stats()``. ``False``: none are kept (the file reads as one without statistics;
        so does a file appended to without them).

    Notes
    -----
    One writer per path: while one is open (in any process), constructing another for the same
    path raises :class:`~rowstore.errors.ConcurrentWriterError` (an ``OSError``); readers are
    not blocked. Construction also removes the temporary files that killed writers of ``path``
    left. An append first checks the checksums of the partial last block and heap chunk it will
    rewrite (:class:`~rowstore.errors.ChecksumError` otherwise, nothing written). A directory as
    ``path`` raises :class:`IsADirectoryError`.

    Encoded images: for a ``png`` or ``jpeg`` field, a ``bytes``/``bytearray``/``memoryview``
    value is taken as an image already encoded in that format and stored unchanged (no decode,
    no re-encode); a NumPy array is pixels and is encoded. See ``docs/images.md``.

    Not thread-safe: one writer per thread or process. Rows are validated against the schema; a
    bad row raises :class:`~rowstore.errors.RowValidationError` (a ``SchemaError``) naming the
    field, the row and what was expected, writes nothing of that row (or batch), and leaves the
    writer usable. An exception escaping the ``with`` block discards the file being written.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        schema: Schema | None = None,
        *,
        mode: str = "w",
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        rows_per_block: int | None = None,
        compression: Any = None,
        heap_chunk_bytes: int = DEFAULT_HEAP_CHUNK_BYTES,
        attrs: Mapping[str, Any] | None = None,
        threads: int | None = None,
        durable: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        verify_encoded: bool = False,
        stats: bool = True,
    ):
        self._closed = True  # until __init__ succeeds: a failed constructor leaves nothing to close
        self._verify_encoded = bool(verify_encoded)
        self._keep_stats = bool(stats)
        self._stats: StatsKeeper | None = None
        self._stats_pool: ThreadPoolExecutor | None = None  # started by the first block
        self._stats_done = 0  # pending rows already folded into the statistics
        self._pool: ThreadPoolExecutor | None = None
        self._encoders: ThreadPoolExecutor | None = None  # started by the first batch to encode
        self._file: H5File | None = None  # the file being written: the temporary one
        self._atomic: AtomicFile | None = None  # that temporary file, moved onto path at close
        _check_arguments(mode, block_bytes, heap_chunk_bytes, rows_per_block)
        self._stage: StagedFile | None = None
        stage = stage_file(path, storage_options)
        # a URL: written locally, uploaded (one PUT) at close
        self.url: str | None = None if stage.in_place else os.fspath(path)
        if not stage.in_place and mode != "w":
            raise ValueError(
                f"writing to a URL takes mode='w' (the object is uploaded whole at close), got "
                f"{mode!r}"
            )
        self._stage = stage
        self.path = stage.path
        self.mode = mode
        _check_destination(self.path, mode)
        # Created now, not at the first block: its lock makes this the only writer of path (and
        # removes the temporary files that killed writers of path left).
        self._atomic = AtomicFile(self.path, exclusive=mode == "x", sole=True, durable=durable)
        try:
            self._open(
                schema, block_bytes, rows_per_block, compression, heap_chunk_bytes, attrs, threads
            )
        except BaseException:
            self.abort()  # removes the temporary file, and with it the lock
            raise
        self._closed = False

    def _open(
        self,
        schema: Schema | None,
        block_bytes: int,
        rows_per_block: int | None,
        compression: Any,
        heap_chunk_bytes: int,
        attrs: Mapping[str, Any] | None,
        threads: int | None,
    ) -> None:
        """The rest of the constructor, once the lock is held."""
        layout = None
        if self.mode == "a" and os.path.exists(self.path):
            from rowstore.format.index import Layout

            layout = Layout.open(self.path)
            schema = _check_append(self.path, layout, schema, compression)
            self._compression = block_compression(layout.compression)
            rows_per_block, heap_chunk_bytes = layout.rows_per_block, layout.heap_chunk_bytes
            self.attrs: dict[str, Any] = dict(layout.user_attrs)
        else:
            if not isinstance(schema, Schema):
                raise SchemaError(
                    f"Writer needs a Schema (got {type(schema).__name__}) unless appending to an "
                    f"existing file"
                )
            self._compression = block_compression(compression)
            self.attrs = {}
        if attrs:
            self.attrs.update(attrs)
        self.schema: Schema = schema
        check_storable(schema, attrs_json.dumps(self.attrs))  # fail early, not at close
        self._setup(rows_per_block, block_bytes, heap_chunk_bytes, threads)
        if layout is not None:
            self._open_for_append(layout)

    def _setup(
        self,
        rows_per_block: int | None,
        block_bytes: int,
        heap_chunk_bytes: int,
        threads: int | None,
    ) -> None:
        """Block sizing, the packer and the compression threads."""
        itemsize = spec.row_dtype(self.schema).itemsize
        if itemsize > spec.MAX_CHUNK_BYTES:
            raise SchemaError(
                f"a row of this schema takes {itemsize} bytes, more than a block may hold "
                f"(spec.MAX_CHUNK_BYTES = {spec.MAX_CHUNK_BYTES})"
            )
        self._heap_fields = [
            (i, f) for i, f in enumerate(self.schema) if not f.inline
        ]  # (position, field)
        self._block_bytes = block_bytes
        self._heap_chunk_bytes = heap_chunk_bytes
        self._rpb: int | None = rows_per_block
        if self._rpb is None and not self._heap_fields:
            self._rpb = spec.page_rows_per_block(max(1, block_bytes // itemsize), itemsize)
        if self._rpb is not None:
            self._rpb = min(self._rpb, max_rows_per_block(itemsize))
        self._packer = RowPacker(self.schema, capacity=self._rpb or 64)
        self._stats = StatsKeeper(self.schema, known=self._keep_stats)
        nthreads = min(4, os.cpu_count() or 1) if threads is None else threads
        if not isinstance(nthreads, int) or isinstance(nthreads, bool) or nthreads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        self._threads = nthreads
        if self._compression.compressed and nthreads > 1:
            self._pool = ThreadPoolExecutor(nthreads, thread_name_prefix="rowstore-compress")
        self._compressor = Compressor(self._compression, self._pool, nthreads)

    # -- public API ------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Rows accepted so far (including those of an appended-to file)."""
        return self._packer.num_rows

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the rows accepted so far as stored before compression: rows times the row
        size plus their heap payloads (including an appended-to file's); what
        :class:`~rowstore.writer.dataset.DatasetWriter` sizes its shards by."""
        return self._packer.num_rows * self._packer.itemsize + self._packer.heap_pos

    def write(self, row: Mapping[str, Any]) -> None:
        """Validate and add one row (a mapping of field name to value; ``None`` for nulls).

        Raises :class:`~rowstore.errors.RowValidationError` for a bad row; nothing of it is kept.

        A ``dict`` of plain values (``int``, ``float``, ``bool``, ``str``, ``bytes``, the
        field's numpy scalar type, C-contiguous ndarrays of the field's dtype and shape) is
        stored by one compiled call; any other row, and every bad one, goes through the full
        validation in Python (same rules, same errors).
        """
        if self._closed:
            self._check_open()
        packer = self._packer
        if not packer.add_row_fast(row):
            rownum = self.num_rows
            if not isinstance(row, Mapping):
                raise RowValidationError(
                    f"row {rownum}: expected a mapping of field names to values, got "
                    f"{type(row).__name__}",
                    row=rownum,
                )
            packer.add_row(self._check_row(row, rownum))
        rpb = self._rpb
        if rpb is not None and packer.n < rpb and len(packer.heap) < self._heap_chunk_bytes:
            return  # nothing to write yet (what _after_rows would find)
        self._after_rows()

    def write_batch(self, columns: Mapping[str, Any]) -> None:
        """Validate and add many rows given as columns: ``{name: array (n, *shape) or sequence}``,
        or a DataFrame (pandas or alike: ``.columns`` and ``df[name].to_numpy()``; cells of object
        columns as they are; :func:`rowstore.pandas.from_pandas` also keeps dtypes and index).

        Inline (fixed-shape) fields given as arrays are checked and copied without per-row
        Python work; arrays of ``png``/``jpeg`` fields are encoded on ``threads`` threads. The
        batch is all-or-nothing: a bad value rejects the whole batch.
        """
        self._check_open()
        n, parts = self._check_columns(columns, self.num_rows)
        self._encode_ahead(parts)
        done = 0
        while done < n:  # validated: now store, in slices that fit the pending block
            if self._rpb:
                take = min(self._rpb - self._packer.n, n - done)
            else:
                # Block size not known yet: with heap payloads, go row by row so the first block
                # closes as soon as it holds block_bytes (a batch may be far larger).
                take = 1 if self._heap_fields else n - done
            self._packer.add_columns(
                parts if take == n else [values[done : done + take] for values in parts], take
            )
            done += take
            self._after_rows()

    def write_raw(self, raw: RawRows) -> None:
        """Add stored rows as they are, undecoded (:class:`~rowstore.format._raw.RawRows` of a
        file with this schema, e.g. from :func:`~rowstore.format._raw.take_raw`): row records are
        copied, heap payloads appended and their references rewritten. Nothing is validated
        again: the rows must come from a rowstore file of the same schema (whose reader checked
        every reference)."""
        self._check_open()
        if raw.rows.dtype != self._packer.row_dtype:
            raise ValueError(
                f"write_raw: rows of dtype {raw.rows.dtype} do not match this file's row dtype "
                f"{self._packer.row_dtype}"
            )
        n = len(raw)
        if self._rpb is None and n:
            avg = max(1, raw.nbytes // n)
            self._rpb = int(
                min(max(1, self._block_bytes // avg), max_rows_per_block(self._packer.itemsize))
            )
        done = 0
        while (
            done < n
        ):  # in slices that fit the pending block (the packer's buffer stays one block)
            assert self._rpb is not None
            take = (
                min(self._rpb - self._packer.n, n - done)
                if self._packer.n < self._rpb
                else n - done
            )
            part = raw.slice(done, done + take)
            self._packer.add_raw(part.rows, part.heap, part.origin)
            done += take
            self._after_rows()

    def close(self) -> None:
        """Flush the last block, write the index and atomically move the file into place."""
        if self._closed:
            return
        # writer.attrs may have changed since the constructor: an attribute HDF5 cannot store
        # is refused here, with the writer still open (fix attrs and close again), not in _finish.
        check_storable(self.schema, attrs_json.dumps(self.attrs))
        try:
            self._finish()
            if self._stage is not None:
                self._stage.publish()
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Discard everything written since the writer opened; ``path`` is left as it was."""
        self._closed = True
        self._stop_pool()
        file, self._file = self._file, None
        if file is not None:
            file.abort()
        atomic, self._atomic = self._atomic, None
        if atomic is not None:
            atomic.abort()
        stage = getattr(self, "_stage", None)
        if stage is not None:
            stage.discard()

    def _stop_pool(self) -> None:
        for attr in ("_pool", "_encoders", "_stats_pool"):
            pool = getattr(self, attr, None)
            setattr(self, attr, None)
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _encode_ahead(self, parts: list[Any]) -> None:
        """Encode a validated batch's arrays of heap fields whose codec's encoder releases the
        GIL on the writer's threads, in place (as :class:`Encoded` values the packer stores as
        they are), before anything of the batch is stored. The first failure is raised, as the
        packer would have raised it, and nothing is kept."""
        if self._threads < 2 or not parts:  # (an empty batch has no parts)
            return
        for k, f in self._heap_fields:
            codec = f.codec_obj
            values = parts[k] if codec.encode_releases_gil else None
            if not isinstance(values, list):
                continue
            todo = [i for i, v in enumerate(values) if isinstance(v, np.ndarray)]
            if len(todo) < 2:
                continue
            if self._encoders is None:
                self._encoders = ThreadPoolExecutor(
                    self._threads, thread_name_prefix="rowstore-encode"
                )

            def encode(i: int, f: Any = f, codec: Any = codec, values: list = values) -> Encoded:
                v = values[i]
                return Encoded(codec.encode(v, f), v.shape, v.dtype)

            done = list(self._encoders.map(encode, todo))
            for i, e in zip(todo, done):
                values[i] = e

    # -- validation ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(f"writer for {self.path!r} is closed")

    def _check_names(self, row: Mapping[str, Any], rownum: int) -> None:
        unknown = [k for k in row if k not in self.schema]
        if unknown:
            raise RowValidationError(
                f"row {rownum}: unknown field {unknown[0]!r}; the schema has {self.schema.names}",
                field=str(unknown[0]),
                row=rownum,
            )

    def _check_row(self, row: Mapping[str, Any], rownum: int) -> list[Any]:
        """The row's values in schema order, validated (``None`` for a missing nullable field)."""
        self._check_names(row, rownum)
        values = []
        for f in self.schema:
            if f.name in row:
                values.append(
                    check_value(f, row[f.name], rownum, verify_encoded=self._verify_encoded)
                )
            elif f.nullable:
                values.append(None)
            else:
                raise RowValidationError(
                    f"row {rownum}: field {f.name!r} is missing (expected {f.dtype}"
                    f"{'' if not f.shape else ' of shape ' + str(f.shape)})",
                    field=f.name,
                    row=rownum,
                )
        for i, f in self._heap_fields:
            check_value_size(f, values[i], rownum)
        return values

    def _check_columns(self, columns: Mapping[str, Any], first: int) -> tuple[int, list[Any]]:
        """The batch's row count and its columns in schema order, validated (an ndarray for an
        inline field given as one, else a list of values)."""
        columns = as_columns(columns, first)
        self._check_names(columns, first)
        lengths = {name: len(col) for name, col in columns.items()}
        n = next(iter(lengths.values()), 0)
        if any(v != n for v in lengths.values()):
            raise RowValidationError(
                f"row {first}: columns have different lengths: {lengths}", row=first
            )
        if n == 0:
            return 0, []
        parts: list[Any] = []
        for f in self.schema:
            if f.name not in columns:
                if not f.nullable:
                    raise RowValidationError(
                        f"row {first}: field {f.name!r} is missing from the batch",
                        field=f.name,
                        row=first,
                    )
                parts.append([None] * n)
                continue
            parts.append(
                check_column(f, columns[f.name], n, first, verify_encoded=self._verify_encoded)[0]
            )
        for k, f in self._heap_fields:
            for i, v in enumerate(parts[k]):
                check_value_size(f, v, first + i)
        return n, parts

    # -- blocks ----------------------------------------------------------------------------
    def _after_rows(self) -> None:
        """Write the blocks that the pending rows fill, and the heap chunks they fill."""
        packer = self._packer
        if self._rpb is None:
            if packer.pending_bytes() < self._block_bytes:
                return
            self._rpb = min(packer.n, max_rows_per_block(packer.itemsize))
        while packer.n >= self._rpb:
            self._flush_block(self._rpb)
        self._flush_heap(final=False)

    def _fold_stats(self, ahead: bool = False) -> Future | None:
        """Fold the pending rows not yet counted into the statistics: before their block is
        written and before their heap payloads are cut into chunks (then they leave the
        packer). ``ahead``: on the writer's statistics thread (``threads`` > 1), while the
        caller writes the block; the caller waits for the future before it changes the
        pending rows or the heap."""
        packer = self._packer
        if self._stats is None or self._stats_done >= packer.n:
            return None
        rows = packer.rows[self._stats_done : packer.n]
        self._stats_done = packer.n
        if ahead and self._threads > 1:
            if self._stats_pool is None:
                self._stats_pool = ThreadPoolExecutor(1, thread_name_prefix="rowstore-stats")
            return self._stats_pool.submit(self._stats.add, rows, packer.heap, packer.heap_flushed)
        self._stats.add(rows, packer.heap, packer.heap_flushed)
        return None

    def _flush_block(self, nrows: int) -> None:
        """Write the first ``nrows`` pending rows as the next block (zero-padded to a chunk)."""
        folding = self._fold_stats(ahead=True)  # the block's statistics, while it is written
        if self._file is None:
            self._create_file()
        file, rpb, packer = self._file, self._rpb, self._packer
        assert file is not None and rpb is not None  # set when the file was created or opened
        block = packer.peek_block(nrows, rpb)
        file.write_block(
            block.rows.data.cast("B"),
            extent=packer.rows_written + nrows,
            heap_range=(block.heap_start, block.heap_end),
        )
        if folding is not None:
            folding.result()
        packer.pop_block(block, rpb)
        self._stats_done -= nrows

    def _flush_heap(self, final: bool) -> None:
        if self._file is None or not (final or len(self._packer.heap) >= self._heap_chunk_bytes):
            # nothing to cut (pending heap bytes wait for the first block, which creates the file)
            return
        self._fold_stats()
        size = self._heap_chunk_bytes
        if final and not self._file.heap_started and not self._compression.compressed:
            # A heap of less than one chunk is stored as one chunk of its own size, not as a
            # mostly zero-filled heap_chunk_bytes (compressed chunks shrink the zeros anyway).
            # Whole pages of the page index (format v3): the index keeps heap_chunk_bytes'
            # pages per chunk, those past the stored bytes the CRCs of zero pages.
            page = spec.PAGE_BYTES
            size = min(size, -(-len(self._packer.heap) // page) * page) or size
        for chunk, extent in self._packer.heap_chunks(size, final=final):
            self._file.write_heap_chunk(memoryview(chunk), extent=extent)

    # -- the file --------------------------------------------------------------------------
    def _create_file(self) -> None:
        packer = self._packer
        if self._rpb is None:
            self._rpb = first_rows_per_block(
                packer.n, packer.pending_bytes(), packer.itemsize, self._block_bytes
            )
        assert self._atomic is not None  # created with the writer
        self._file = H5File.create(
            self._atomic.tmp,
            row_dtype=packer.row_dtype,
            rows_per_block=self._rpb,
            heap_chunk_bytes=self._heap_chunk_bytes,
            with_heap=bool(self._heap_fields),
            compressor=self._compressor,
        )

    def _open_for_append(self, layout: Layout) -> None:
        """Reload the file's partial last block and heap chunk (checksums verified: they are
        rewritten with fresh ones), copy the file, and reopen the copy so that appended rows
        continue them (the copy is renamed over the original at close)."""
        reloaded = read_tail(layout)  # before the copy: a corrupt file costs no copy
        assert (
            self._atomic is not None and self._rpb is not None
        )  # the writer's, the file's rows_per_block
        self._atomic.copy(self.path)
        self._file, tail = H5File.reopen(
            self._atomic.tmp, layout, reloaded, compressor=self._compressor
        )
        self._packer.resume(tail, self._rpb)
        # The file's rows (the partial last block's among them) are in its statistics already.
        self._stats_done = self._packer.n
        self._stats = StatsKeeper(
            self.schema,
            layout.stats,
            known=self._keep_stats and (layout.stats is not None or not layout.num_rows),
        )

    def _finish(self) -> None:
        packer = self._packer
        if packer.n or self._file is None:
            if self._file is None:
                self._create_file()
            if packer.n:
                self._flush_block(packer.n)
        self._flush_heap(final=True)
        file, atomic, rpb = self._file, self._atomic, self._rpb
        assert file is not None and atomic is not None and rpb is not None  # the file exists now
        attrs = file_attributes(
            schema=self.schema,
            user_attrs=self.attrs,
            num_rows=packer.rows_written,
            rows_per_block=rpb,
            heap_chunk_bytes=self._heap_chunk_bytes,
            heap_nbytes=packer.heap_pos,
            compression=self._compression,
        )
        self._fold_stats()
        stats = encode_stats(self._stats.stored() if self._stats is not None else None)
        if stats is not None:
            attrs[spec.ATTR_STATS] = stats
        file.finish(
            rows_per_block=rpb,
            num_rows=packer.rows_written,
            heap_nbytes=packer.heap_pos,
            attrs=attrs,
        )
        self._file = None
        self._stop_pool()
        atomic.commit()
        self._atomic = None


def _check_arguments(
    mode: str, block_bytes: Any, heap_chunk_bytes: Any, rows_per_block: Any
) -> None:
    if mode not in ("w", "x", "a"):
        raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
    if not isinstance(block_bytes, int) or not 1 <= block_bytes <= spec.MAX_CHUNK_BYTES:
        raise ValueError(
            f"block_bytes must be an int in 1..{spec.MAX_CHUNK_BYTES}, got {block_bytes!r}"
        )
    if not isinstance(heap_chunk_bytes, int) or not 64 <= heap_chunk_bytes <= spec.MAX_CHUNK_BYTES:
        raise ValueError(
            f"heap_chunk_bytes must be an int in 64..{spec.MAX_CHUNK_BYTES}, got "
            f"{heap_chunk_bytes!r}"
        )
    if rows_per_block is not None and (not isinstance(rows_per_block, int) or rows_per_block < 1):
        raise ValueError(f"rows_per_block must be a positive int, got {rows_per_block!r}")


def _check_destination(path: str, mode: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"directory {directory!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(
            f"{path!r} is a directory; a Writer writes one .h5 file (rowstore.DatasetWriter writes "
            f"and appends to dataset directories)"
        )
    if mode == "x" and os.path.exists(path):
        raise FileExistsError(f"{path!r} exists (mode='x')")


def _check_append(path: str, layout: Layout, schema: Schema | None, compression: Any) -> Schema:
    """The schema to append with: the file's; a schema or compression given must equal it."""
    if schema is not None and Schema.from_json(schema.to_json()) != layout.schema:
        raise SchemaError(
            f"cannot append to {path!r}: its schema differs from the one "
            f"given:\n{layout.schema}\nvs\n{schema}"
        )
    if (
        compression is not None
        and block_compression(compression).get_config() != layout.compression
    ):
        raise ValueError(
            f"cannot append with compression {compression!r}: the file uses {layout.compression}"
        )
    return layout.schema
