"""The writer: validates rows, packs them into blocks, compresses and commits files atomically.

A dataset is written to a temporary file beside ``path`` and renamed onto ``path`` only when
the writer closes successfully (after ``fsync``), so ``path`` is always either absent, the
previous complete file, or the new complete file. Appending (``mode="a"``) works on a copy of
the existing file (``copy_file_range``/reflink where the filesystem offers it) and renames it
over the original at close: a crash mid-append leaves the old file untouched.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import warnings
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from rowstore import __version__
from rowstore.errors import FormatError, RowValidationError, SchemaError, WriterClosedError
from rowstore.format import spec
from rowstore.format.validate import check_column, check_value
from rowstore.schema import Schema

__all__ = ["Writer"]

#: Largest block or heap chunk (raw bytes): Blosc2 chunks stay below 2 GiB.
MAX_CHUNK_BYTES = 1 << 30
DEFAULT_BLOCK_BYTES = 1 << 20
DEFAULT_HEAP_CHUNK_BYTES = 1 << 20


def _blosc2_compressor(config: dict, typesize: int):
    """A function raw block -> stored chunk (a single-chunk Blosc2 frame, built by the kernel
    without the GIL, so a writer's threads compress in parallel)."""
    from rowstore import kernels

    params = {"cname": config["cname"], "clevel": config["clevel"], "shuffle": config["shuffle"], "typesize": typesize}

    def compress(raw) -> np.ndarray:
        return kernels.compress_frame(raw, compcode={"blosclz": 0, "lz4": 1, "lz4hc": 2, "zlib": 4, "zstd": 5}[params["cname"]], clevel=params["clevel"],
                                      shuffle={"none": 0, "byte": 1, "bit": 2}[params["shuffle"]], typesize=params["typesize"])

    return compress


def _hdf5_filter_kwargs(config: dict) -> dict:
    if config["id"] == "none":
        return {}
    import hdf5plugin

    filters = {"none": hdf5plugin.Blosc2.NOFILTER, "byte": hdf5plugin.Blosc2.SHUFFLE, "bit": hdf5plugin.Blosc2.BITSHUFFLE}[config["shuffle"]]
    return dict(hdf5plugin.Blosc2(cname=config["cname"], clevel=config["clevel"], filters=filters))


class _ChunkStream:
    """Writes fixed-size chunks of one HDF5 dataset with ``write_direct_chunk`` and remembers,
    per chunk, its stored size and checksum (offsets are read back at close).

    With a ``pool``, chunks are compressed and checksummed on its threads (Blosc2 and the CRC
    release the GIL) while the caller packs the next rows; HDF5 writes stay on the calling
    thread, in chunk order. At most two chunks per worker are in flight.
    """

    def __init__(self, dataset, chunk_len: int, itemsize: int, compress, start_chunk: int = 0,
                 stored: list[int] | None = None, checksums: list[int] | None = None,
                 pool: ThreadPoolExecutor | None = None):
        self.ds = dataset
        self.chunk_len = chunk_len
        self.raw_bytes = chunk_len * itemsize
        self.compress = compress
        self.next_chunk = start_chunk
        self.stored = stored if stored is not None else []
        self.checksums = checksums if checksums is not None else []
        self.pool = pool if compress is not None else None
        self._pending: deque = deque()  # (chunk index, extent, future of (data, crc))

    def write(self, raw: memoryview, extent: int) -> None:
        """Write the next chunk from ``raw`` (exactly one chunk's bytes; the caller may reuse
        it on return); grow the dataset to ``extent`` items first (extents only grow:
        shrinking would make HDF5 rewrite chunks)."""
        assert len(raw) == self.raw_bytes, "internal: chunk size"
        k = self.next_chunk
        self.next_chunk += 1
        if self.pool is None:
            self._store(k, extent, *self._encode(raw))
            return
        self._pending.append((k, extent, self.pool.submit(self._encode, bytes(raw))))
        self._drain(wait=len(self._pending) > 2 * self.pool._max_workers)

    def _encode(self, raw) -> tuple[Any, int]:
        from rowstore.kernels import crc32

        data = self.compress(raw) if self.compress is not None else raw
        return data, crc32(data)

    def _drain(self, *, wait: bool = False, everything: bool = False) -> None:
        """Store finished chunks in order: the ready ones, or at least one (``wait``), or all."""
        while self._pending and (everything or wait or self._pending[0][2].done()):
            k, extent, fut = self._pending.popleft()
            self._store(k, extent, *fut.result())
            wait = False

    def flush(self) -> None:
        self._drain(everything=True)

    def cancel(self) -> None:
        for _, _, fut in self._pending:
            fut.cancel()
        self._pending.clear()

    def _store(self, k: int, extent: int, data, crc: int) -> None:
        if extent > self.ds.shape[0]:
            self.ds.resize((extent,))
        self.ds.id.write_direct_chunk((k * self.chunk_len,), data)
        if k < len(self.stored):  # rewriting the partial last chunk of an appended file
            self.stored[k] = len(data)
            self.checksums[k] = crc
        else:
            self.stored.append(len(data))
            self.checksums.append(crc)

    def offsets(self) -> np.ndarray:
        """File offsets of chunks 0..next_chunk-1, read from HDF5's chunk index."""
        self.flush()
        n = self.next_chunk
        offs = np.full(n, -1, dtype=np.int64)
        sizes = np.zeros(n, dtype=np.int64)

        def visit(info):
            k = info.chunk_offset[0] // self.chunk_len
            if k < n:
                offs[k] = info.byte_offset
                sizes[k] = info.size

        self.ds.id.chunk_iter(visit)
        if (offs < 0).any() or not np.array_equal(sizes, np.asarray(self.stored[:n], dtype=np.int64)):
            raise FormatError("internal: HDF5's chunk index disagrees with the chunks written", path=self.ds.file.filename)
        return offs


class Writer:
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
        from the first rows when that is not given. Blocks are the unit of reading and
        shuffling: ~1 MiB reads at near-``memcpy`` speed.
    rows_per_block : int, optional
        Fix the number of rows per block instead.
    compression : None, str or dict
        Per-block compression: ``None`` (default), ``"lz4"``, ``"zstd"``, ``"blosclz"``,
        ``"zlib"``, or ``{"cname": "zstd", "clevel": 5, "shuffle": "byte"}``. Stored through the
        Blosc2 HDF5 filter (id 32026) so h5py (with ``hdf5plugin``) and PyTables read it too.
    heap_chunk_bytes : int
        Chunk size of the heap of variable-size payloads.
    attrs : mapping, optional
        User attributes (JSON-serialisable), stored in the file; also editable as ``writer.attrs``.
    threads : int, optional
        Threads that compress and checksum blocks while rows are packed (compressed files
        only; default ``min(4, os.cpu_count())``; 1 compresses on the calling thread). Chunks
        are still written in order, by the calling thread.

    Notes
    -----
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
    ):
        self._pool: ThreadPoolExecutor | None = None
        if mode not in ("w", "x", "a"):
            raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
        if not isinstance(block_bytes, int) or not 1 <= block_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"block_bytes must be an int in 1..{MAX_CHUNK_BYTES}, got {block_bytes!r}")
        if not isinstance(heap_chunk_bytes, int) or not 64 <= heap_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"heap_chunk_bytes must be an int in 64..{MAX_CHUNK_BYTES}, got {heap_chunk_bytes!r}")
        if rows_per_block is not None and (not isinstance(rows_per_block, int) or rows_per_block < 1):
            raise ValueError(f"rows_per_block must be a positive int, got {rows_per_block!r}")
        self.path = os.fspath(path)
        # The file that is replaced at close: a symlink's target (the link keeps pointing at
        # the new file), else the path itself.
        self._target = os.path.realpath(self.path) if os.path.islink(self.path) else self.path
        self.mode = mode
        self._closed = True  # until __init__ succeeds: a failed constructor leaves nothing to close
        self._h5: Any = None  # the open h5py.File of the temporary copy
        self._tmp: str | None = None
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"directory {directory!r} does not exist")
        if mode == "x" and os.path.exists(self.path):
            raise FileExistsError(f"{self.path!r} exists (mode='x')")

        appending = mode == "a" and os.path.exists(self.path)
        if appending:
            from rowstore.format.index import Layout

            layout = Layout.open(self.path, verify=False)
            if schema is not None and Schema.from_json(schema.to_json()) != layout.schema:
                raise SchemaError(f"cannot append to {self.path!r}: its schema differs from the one given:\n{layout.schema}\nvs\n{schema}")
            schema = layout.schema
            if compression is not None and spec.compression_config(compression) != layout.compression:
                raise ValueError(f"cannot append with compression {compression!r}: the file uses {layout.compression}")
            self._compression = layout.compression
            rows_per_block = layout.rows_per_block
            heap_chunk_bytes = layout.heap_chunk_bytes
            self.attrs: dict[str, Any] = dict(layout.user_attrs)
        else:
            if not isinstance(schema, Schema):
                raise SchemaError(f"Writer needs a Schema (got {type(schema).__name__}) unless appending to an existing file")
            self._compression = spec.compression_config(compression)
            self.attrs = {}
        if attrs:
            self.attrs.update(attrs)
        json.dumps(self.attrs)  # fail early on attributes that cannot be stored

        self.schema: Schema = schema
        self._row_dtype = spec.row_dtype(schema)
        self._itemsize = self._row_dtype.itemsize
        self._heap_fields = [f for f in schema if not f.inline]
        self._block_bytes = block_bytes
        self._heap_chunk_bytes = heap_chunk_bytes
        self._rpb: int | None = rows_per_block
        if self._rpb is None and not self._heap_fields:
            self._rpb = max(1, block_bytes // self._itemsize)
        if self._rpb is not None:
            self._rpb = min(self._rpb, max(1, MAX_CHUNK_BYTES // self._itemsize))

        # Pending rows of the current (unflushed) block and the heap stream.
        self._buf = np.zeros(self._rpb or 64, dtype=self._row_dtype)
        self._n = 0  # rows in _buf
        self._heap_buf = bytearray()  # heap bytes from logical offset _heap_flushed on
        self._heap_flushed = 0
        self._heap_pos = 0  # logical heap size
        self._block_heap_start = 0
        self._rows_written = 0  # rows in flushed blocks
        self._block_heap: list[tuple[int, int]] = []  # per flushed block: heap range
        self._rows_stream: _ChunkStream | None = None
        self._heap_stream: _ChunkStream | None = None
        self._typesize = spec.blosc_typesize(self._row_dtype)
        nthreads = min(4, os.cpu_count() or 1) if threads is None else threads
        if not isinstance(nthreads, int) or isinstance(nthreads, bool) or nthreads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        if self._compression["id"] != "none" and nthreads > 1:
            self._pool = ThreadPoolExecutor(nthreads, thread_name_prefix="rowstore-compress")
        if appending:
            try:
                self._open_for_append(layout)
            except BaseException:
                self.abort()  # removes the copy
                raise
        self._closed = False

    # -- public API ------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Rows accepted so far (including those of an appended-to file)."""
        return self._rows_written + self._n

    def write(self, row: Mapping[str, Any]) -> None:
        """Validate and add one row (a mapping of field name to value; ``None`` for nulls).

        Raises :class:`~rowstore.errors.RowValidationError` for a bad row; nothing of it is kept.
        """
        self._check_open()
        rownum = self.num_rows
        if not isinstance(row, Mapping):
            raise RowValidationError(f"row {rownum}: expected a mapping of field names to values, got {type(row).__name__}", row=rownum)
        values = self._check_row(row, rownum)
        self._ensure_capacity(1)
        i = self._n
        heap_start = len(self._heap_buf)
        try:
            for f, v in zip(self.schema, values):
                self._store(f, i, v)
        except BaseException:
            del self._heap_buf[heap_start:]
            self._heap_pos = self._heap_flushed + len(self._heap_buf)
            self._buf[i] = np.zeros((), self._row_dtype)
            raise
        self._n += 1
        self._after_rows()

    def write_batch(self, columns: Mapping[str, Any]) -> None:
        """Validate and add many rows given as columns: ``{name: array (n, *shape) or sequence}``.

        Inline (fixed-shape) fields given as arrays are checked and copied without per-row
        Python work. The batch is all-or-nothing: a bad value rejects the whole batch.
        """
        self._check_open()
        first = self.num_rows
        if not isinstance(columns, Mapping):
            raise RowValidationError(f"row {first}: write_batch expects a mapping of field names to columns", row=first)
        self._check_names(columns, first)
        lengths = {name: len(col) for name, col in columns.items()}
        n = next(iter(lengths.values()), 0)
        if any(v != n for v in lengths.values()):
            raise RowValidationError(f"row {first}: columns have different lengths: {lengths}", row=first)
        if n == 0:
            return
        checked: dict[str, tuple[np.ndarray | list, np.ndarray | None]] = {}
        for f in self.schema:
            if f.name not in columns:
                if not f.nullable:
                    raise RowValidationError(f"row {first}: field {f.name!r} is missing from the batch", field=f.name, row=first)
                checked[f.name] = ([None] * n, np.ones(n, bool))
            else:
                checked[f.name] = check_column(f, columns[f.name], n, first)
        # Validated: now store, in slices that fit the pending block.
        done = 0
        while done < n:
            self._ensure_capacity(1)
            if self._rpb:
                take = min(self._rpb - self._n, n - done)
            else:
                # Block size not known yet: with heap payloads, go row by row so the first block
                # closes as soon as it holds block_bytes (a batch may be far larger).
                take = 1 if self._heap_fields else n - done
                self._ensure_capacity(take)
            sl = slice(self._n, self._n + take)
            per_row = []
            for f in self.schema:
                values, mask = checked[f.name]
                part = values[done : done + take]
                if f.inline and isinstance(part, np.ndarray):
                    self._buf[f.name][sl] = part
                    if f.nullable:
                        self._buf[f.name + spec.NULL_SUFFIX][sl] = False
                else:
                    per_row.append((f, part))
            # Row by row, field by field (as write() does): the heap holds payloads in row order,
            # so a batch writes the same file as the same rows written one by one.
            if per_row:
                for j in range(take):
                    for f, part in per_row:
                        self._store(f, self._n + j, part[j])
            self._n += take
            done += take
            self._after_rows()

    def close(self) -> None:
        """Flush the last block, write the index and atomically move the file into place."""
        if self._closed:
            return
        try:
            self._finish()
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Discard everything written since the writer opened; ``path`` is left as it was."""
        self._closed = True
        for stream in (getattr(self, "_rows_stream", None), getattr(self, "_heap_stream", None)):
            if stream is not None:
                stream.cancel()
        self._stop_pool()
        if self._h5 is not None:
            try:
                self._h5.close()
            except Exception:
                pass
            self._h5 = None
        if self._tmp is not None and os.path.exists(self._tmp):
            os.unlink(self._tmp)
        self._tmp = None

    def _stop_pool(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn(f"rowstore.Writer for {self.path!r} was never closed; its rows are discarded", ResourceWarning, stacklevel=2)
            self.abort()

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
        self._check_names(row, rownum)
        values = []
        for f in self.schema:
            if f.name in row:
                values.append(check_value(f, row[f.name], rownum))
            elif f.nullable:
                values.append(None)
            else:
                raise RowValidationError(
                    f"row {rownum}: field {f.name!r} is missing (expected {f.dtype}"
                    f"{'' if not f.shape else ' of shape ' + str(f.shape)})",
                    field=f.name,
                    row=rownum,
                )
        return values

    # -- packing ---------------------------------------------------------------------------
    def _store(self, f, i: int, v: Any) -> None:
        """Put one validated value into pending row ``i`` (heap payloads appended)."""
        if f.nullable:
            self._buf[f.name + spec.NULL_SUFFIX][i] = v is None
        if f.inline:
            self._buf[f.name][i] = 0 if v is None else v
            return
        ref = self._buf[f.name]
        if v is None:
            ref["offset"][i] = self._heap_pos
            ref["nbytes"][i] = 0
            if "shape" in ref.dtype.names:
                ref["shape"][i] = 0
            return
        payload = f.codec_obj.encode(v, f)
        ref["offset"][i] = self._heap_pos
        ref["nbytes"][i] = len(payload)
        if "shape" in ref.dtype.names:
            ref["shape"][i] = [v.shape[d] for d in f.variable_dims]
        self._heap_buf += payload
        self._heap_pos += len(payload)

    def _ensure_capacity(self, extra: int) -> None:
        need = self._n + extra
        if need > len(self._buf):
            grown = np.zeros(max(need, 2 * len(self._buf)), dtype=self._row_dtype)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown

    def _after_rows(self) -> None:
        if self._rpb is None:
            pending = self._n * self._itemsize + (self._heap_pos - self._block_heap_start)
            if pending < self._block_bytes:
                return
            self._rpb = min(self._n, max(1, MAX_CHUNK_BYTES // self._itemsize))
        while self._n >= self._rpb:
            self._flush_block(self._rpb)
        self._flush_heap(final=False)

    def _flush_block(self, nrows: int) -> None:
        """Write the first ``nrows`` pending rows as the next block (zero-padded to a chunk)."""
        if self._h5 is None:
            self._create_file()
        rpb, stream = self._rpb, self._rows_stream
        assert rpb is not None and stream is not None  # set when the file was created or opened
        if nrows == rpb:
            block = self._buf[:rpb]  # written as is: no copy of a full block
        else:
            block = np.zeros(rpb, dtype=self._row_dtype)  # the last chunk is zero-filled
            block[:nrows] = self._buf[:nrows]
        # The block's heap range ends at the last payload of its rows.
        if self._heap_fields and nrows:
            ends = [self._buf[f.name]["offset"][:nrows] + self._buf[f.name]["nbytes"][:nrows] for f in self._heap_fields]
            heap_end = int(max(e.max() for e in ends))
            heap_end = max(heap_end, self._block_heap_start)
        else:
            heap_end = self._block_heap_start
        first = self._rows_written
        stream.write(block.data.cast("B"), extent=first + nrows)
        self._block_heap.append((self._block_heap_start, heap_end))
        self._block_heap_start = heap_end
        self._rows_written += nrows
        # Every column of a pending row is assigned when the row is added, so rows left over
        # from the flushed block need no clearing.
        rest = self._n - nrows
        if rest:
            self._buf[:rest] = self._buf[nrows : self._n].copy()
        self._n = rest
        if len(self._buf) != rpb:
            keep = self._buf[:rest].copy()
            self._buf = np.zeros(max(rpb, rest), dtype=self._row_dtype)
            self._buf[:rest] = keep

    def _flush_heap(self, final: bool) -> None:
        stream = self._heap_stream
        if stream is None:
            if not self._heap_buf or self._h5 is None:
                return
        assert stream is not None  # created with the file whenever the schema has heap fields
        H = self._heap_chunk_bytes
        while len(self._heap_buf) >= H or (final and self._heap_buf):
            chunk = bytes(self._heap_buf[:H])
            if len(chunk) < H:
                chunk += bytes(H - len(chunk))
            start = self._heap_flushed
            stream.write(memoryview(chunk), extent=min(start + H, self._heap_pos))
            del self._heap_buf[:H]
            self._heap_flushed += H
        if final and self._heap_flushed > self._heap_pos:
            self._heap_flushed = self._heap_pos

    # -- file handling ---------------------------------------------------------------------
    def _new_tmp_path(self) -> str:
        directory = os.path.dirname(os.path.abspath(self._target))
        prefix = os.path.join(directory, "." + os.path.basename(self._target) + ".")
        for _ in range(100):
            tmp = prefix + secrets.token_hex(6) + ".rowstore-tmp"
            try:
                # 0o666 less the umask, like any new file (mkstemp's 0o600 survived the rename, so
                # datasets were unreadable by the group and others).
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
            except FileExistsError:
                continue
            os.close(fd)
            return tmp
        raise FileExistsError(f"could not create a temporary file beside {self.path!r}")

    def _create_file(self) -> None:
        import h5py

        if self._rpb is None:
            # Bytes per row so far; no rows yet (an empty file): the row itself. (An average of 0
            # made blocks of block_bytes rows, which later appends padded to block_bytes * row size.)
            avg = (self._n * self._itemsize + self._heap_pos - self._block_heap_start) / self._n if self._n else self._itemsize
            self._rpb = int(min(max(self._n, self._block_bytes // max(1, int(avg)), 1), max(1, MAX_CHUNK_BYTES // self._itemsize)))
        self._tmp = self._new_tmp_path()
        f = h5py.File(self._tmp, "w")  # default libver: PyTables and older HDF5 open it
        self._h5 = f
        g = f.create_group(spec.GROUP)
        kw = _hdf5_filter_kwargs(self._compression)
        rows = g.create_dataset(spec.ROWS, shape=(0,), maxshape=(None,), chunks=(self._rpb,), dtype=self._row_dtype, **kw)
        compress = _blosc2_compressor(self._compression, self._typesize) if kw else None
        self._rows_stream = _ChunkStream(rows, self._rpb, self._itemsize, compress, pool=self._pool)
        if self._heap_fields:
            heap = g.create_dataset(spec.HEAP, shape=(0,), maxshape=(None,), chunks=(self._heap_chunk_bytes,), dtype=np.uint8, **kw)
            hcompress = _blosc2_compressor(self._compression, 1) if kw else None
            self._heap_stream = _ChunkStream(heap, self._heap_chunk_bytes, 1, hcompress, pool=self._pool)

    def _open_for_append(self, layout) -> None:
        """Copy the file, reopen the copy, and reload its partial last block and heap chunk so
        that appended rows continue them (the copy is renamed over the original at close)."""
        import h5py
        import hdf5plugin  # noqa: F401 - registers the Blosc2 filter to read compressed chunks

        self._tmp = self._new_tmp_path()
        shutil.copyfile(self.path, self._tmp)  # copy_file_range/sendfile: in-kernel, reflink on CoW filesystems
        shutil.copymode(self.path, self._tmp)  # the appended file keeps its permissions
        self._h5 = f = h5py.File(self._tmp, "r+")
        g = f[spec.GROUP]
        rpb = self._rpb
        assert rpb is not None  # appending: the file's rows_per_block
        blocks = layout.blocks
        nblocks = len(blocks)
        stored = [int(x) for x in blocks["stored_nbytes"]]
        checks = [int(x) for x in blocks["checksum"]]
        kw = self._compression["id"] != "none"
        compress = _blosc2_compressor(self._compression, self._typesize) if kw else None
        self._rows_stream = rows_stream = _ChunkStream(g[spec.ROWS], rpb, self._itemsize, compress, nblocks, stored, checks,
                                         pool=self._pool)
        self._block_heap = [(int(a), int(b)) for a, b in zip(blocks["heap_start"], blocks["heap_end"])]
        self._rows_written = layout.num_rows
        self._heap_pos = layout.heap_nbytes
        self._block_heap_start = self._block_heap[-1][1] if nblocks else 0
        if nblocks and int(blocks["num_rows"][-1]) < rpb:
            # Reopen the partial last block: its rows go back to pending, its chunk is rewritten.
            last = nblocks - 1
            first = int(blocks["first_row"][last])
            rows = g[spec.ROWS][first : layout.num_rows]
            self._buf = np.zeros(rpb, dtype=self._row_dtype)
            self._buf[: len(rows)] = rows
            self._n = len(rows)
            self._rows_written = first
            rows_stream.next_chunk = last
            self._block_heap_start, _ = self._block_heap.pop()
        if self._heap_fields:
            hc = layout.heap_chunks
            hstored = [int(x) for x in hc["stored_nbytes"]]
            hchecks = [int(x) for x in hc["checksum"]]
            hcompress = _blosc2_compressor(self._compression, 1) if kw else None
            self._heap_stream = heap_stream = _ChunkStream(g[spec.HEAP], self._heap_chunk_bytes, 1, hcompress, len(hc), hstored, hchecks,
                                             pool=self._pool)
            H = self._heap_chunk_bytes
            self._heap_flushed = len(hc) * H
            if layout.heap_nbytes % H:
                k = len(hc) - 1
                self._heap_buf = bytearray(g[spec.HEAP][k * H : layout.heap_nbytes].tobytes())
                self._heap_flushed = k * H
                heap_stream.next_chunk = k

    def _finish(self) -> None:
        if self._n or self._h5 is None:
            if self._h5 is None:
                self._create_file()
            if self._n:
                self._flush_block(self._n)
        self._flush_heap(final=True)
        for stream in (self._rows_stream, self._heap_stream):
            if stream is not None:
                stream.flush()
        self._stop_pool()
        f = self._h5
        g = f[spec.GROUP]
        rows_stream, rpb, tmp = self._rows_stream, self._rpb, self._tmp
        assert rows_stream is not None and rpb is not None and tmp is not None  # the file exists now
        nblocks = rows_stream.next_chunk
        blocks = np.zeros(nblocks, dtype=spec.BLOCK_DTYPE)
        blocks["first_row"] = np.arange(nblocks, dtype=np.uint64) * rpb
        blocks["num_rows"] = np.minimum(rpb, self._rows_written - blocks["first_row"].astype(np.int64))
        blocks["offset"] = rows_stream.offsets()
        blocks["stored_nbytes"] = rows_stream.stored[:nblocks]
        blocks["checksum"] = np.asarray(rows_stream.checksums[:nblocks], dtype=np.uint64)
        heap_ranges = np.asarray(self._block_heap, dtype=np.uint64).reshape(-1, 2)
        blocks["heap_start"] = heap_ranges[:, 0]
        blocks["heap_end"] = heap_ranges[:, 1]
        for name in (spec.BLOCKS, spec.HEAP_CHUNKS):
            if name in g:
                del g[name]
        g.create_dataset(spec.BLOCKS, data=blocks)
        if self._heap_stream is not None:
            n = self._heap_stream.next_chunk
            hc = np.zeros(n, dtype=spec.HEAP_CHUNK_DTYPE)
            hc["offset"] = self._heap_stream.offsets()
            hc["stored_nbytes"] = self._heap_stream.stored[:n]
            hc["checksum"] = np.asarray(self._heap_stream.checksums[:n], dtype=np.uint64)
            g.create_dataset(spec.HEAP_CHUNKS, data=hc)
            if g[spec.HEAP].shape[0] != self._heap_pos:
                g[spec.HEAP].resize((max(g[spec.HEAP].shape[0], self._heap_pos),))
        a = g.attrs
        a[spec.ATTR_FORMAT] = spec.FORMAT_NAME
        a[spec.ATTR_VERSION] = spec.FORMAT_VERSION
        a[spec.ATTR_SCHEMA] = self.schema.to_json_str()
        a[spec.ATTR_USER] = json.dumps(self.attrs, sort_keys=True)
        a[spec.ATTR_NUM_ROWS] = self._rows_written
        a[spec.ATTR_ROWS_PER_BLOCK] = rpb
        a[spec.ATTR_HEAP_CHUNK_BYTES] = self._heap_chunk_bytes
        a[spec.ATTR_HEAP_NBYTES] = self._heap_pos
        a[spec.ATTR_COMPRESSION] = json.dumps(self._compression, sort_keys=True)
        a[spec.ATTR_CHECKSUM] = spec.CHECKSUM
        a[spec.ATTR_WRITER] = f"rowstore {__version__}"
        f.close()
        self._h5 = None
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if self.mode == "x":
            os.link(tmp, self._target)  # fails if path appeared meanwhile: never overwrite
            os.unlink(tmp)
        else:
            os.replace(tmp, self._target)
        self._tmp = None
        dfd = os.open(os.path.dirname(os.path.abspath(self._target)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
