"""The HDF5 side of writing one rowstore file: datasets, chunk writes, index, attributes.

:class:`H5File` creates the group and datasets of a new file (or reopens an existing one to
append), writes each block and heap chunk with ``write_direct_chunk`` through a
:class:`ChunkStream` (compressed by the file's :class:`~rowstore.codecs.blocks.BlockCompression`,
optionally on worker threads), and at the end writes the block and heap chunk indexes and the
attributes and closes the file. It works on whatever path it is given (the writer gives it the
temporary file of an :class:`~rowstore.storage.atomic.AtomicFile`).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rowstore._version import __version__
from rowstore.codecs.blocks import BlockCompression
from rowstore.errors import FormatError, SchemaError
from rowstore.format import attrs as attrs_json
from rowstore.format import footer, spec
from rowstore.schema import Schema
from rowstore.writer._index_builder import block_index, heap_chunk_index
from rowstore.writer._pack import PackerTail

if TYPE_CHECKING:
    from rowstore.format.index import Layout

__all__ = ["ChunkStream", "Compressor", "H5File", "Tail", "file_attributes", "read_tail"]

#: libhdf5's placement of large objects (H5Pset_alignment): see spec.ALIGN_BYTES.
_ALIGNMENT = {"alignment_threshold": spec.ALIGN_THRESHOLD, "alignment_interval": spec.ALIGN_BYTES}


@dataclass(frozen=True)
class Compressor:
    """How chunks are encoded: the file's compression, and optionally worker threads.

    ``pool`` (with ``workers`` threads) compresses and checksums chunks while the caller packs
    the next rows; it is used only when ``compression.compressed``.
    """

    compression: BlockCompression
    pool: ThreadPoolExecutor | None = None
    workers: int = 1


class ChunkStream:
    """Writes fixed-size chunks of one HDF5 dataset with ``write_direct_chunk`` and remembers,
    per chunk, its stored size and checksum (offsets are read back at close).

    With a pool, chunks are compressed and checksummed on its threads (Blosc2 and the CRC
    release the GIL) while the caller packs the next rows; HDF5 writes stay on the calling
    thread, in chunk order. At most two chunks per worker are in flight.
    """

    def __init__(
        self,
        dataset,
        chunk_len: int,
        itemsize: int,
        compressor: Compressor,
        *,
        typesize: int,
        start_chunk: int = 0,
        stored: list[int] | None = None,
        checksums: list[int] | None = None,
        pages: list[np.ndarray] | None = None,
        logical_bytes: int = 0,
    ):
        self.ds = dataset
        # A lone heap chunk trimmed below heap_chunk_bytes (``logical_bytes``) still has the
        # page-index entries of a whole chunk: those past its bytes are zero pages' CRCs.
        self.logical_bytes = logical_bytes
        # The page index (format v3): per chunk the CRC-32s of its raw bytes' pages (a
        # compressed file's memcpy'd heap chunks hold them as they are: payloads read in place
        # are checked by them); None: the file has none (appended to a file written without).
        self.page_len = 0
        self.pages: list[np.ndarray] | None = None
        if pages is not None or not start_chunk:
            self.page_len = spec.page_geometry(spec.PAGE_BYTES, chunk_len * itemsize, itemsize)[0]
            self.pages = pages if pages is not None else []
        self.chunk_len = chunk_len
        self.raw_bytes = chunk_len * itemsize
        self.compression = compressor.compression
        self.typesize = typesize
        self.next_chunk = start_chunk
        self.stored = stored if stored is not None else []
        self.checksums = checksums if checksums is not None else []
        self.pool = compressor.pool if self.compression.compressed else None
        self.max_in_flight = 2 * compressor.workers
        self._pending: deque = deque()  # (chunk index, extent, future of (data, crc))
        self._extent: int | None = None  # the dataset's length (h5py's .shape costs ~0.1 ms a call)

    def write(self, raw: memoryview, extent: int) -> None:
        """Write the next chunk from ``raw`` (exactly one chunk's bytes; the caller may reuse
        it on return); grow the dataset to ``extent`` items first (extents only grow:
        shrinking would make HDF5 rewrite chunks)."""
        if len(raw) != self.raw_bytes:
            raise ValueError(f"internal: a chunk of {len(raw)} bytes, expected {self.raw_bytes}")
        k = self.next_chunk
        self.next_chunk += 1
        if self.pool is None:
            self._store(k, extent, *self._encode(raw))
            return
        self._pending.append((k, extent, self.pool.submit(self._encode, bytes(raw))))
        self._drain(wait=len(self._pending) > self.max_in_flight)

    def _encode(self, raw) -> tuple[Any, int, np.ndarray | None]:
        from rowstore.kernels import crc32, page_crcs

        data = self.compression.compress(raw, typesize=self.typesize)
        if not self.page_len:
            return data, crc32(data), None
        pages = page_crcs(raw, self.page_len)
        missing = -(-self.logical_bytes // self.page_len) - len(pages)
        if missing > 0:
            zero = page_crcs(bytes(self.page_len), self.page_len)
            pages = np.concatenate([pages, np.repeat(zero, missing)])
        return data, crc32(data), pages

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

    def _store(self, k: int, extent: int, data, crc: int, pages: np.ndarray | None) -> None:
        if self._extent is None:
            self._extent = int(self.ds.shape[0])
        if extent > self._extent:  # only this stream resizes its dataset
            self.ds.resize((extent,))
            self._extent = extent
        from h5py._objects import phil

        # h5py <= 3.15 runs DatasetID.write_direct_chunk without phil, its global lock around
        # libhdf5 (h5py PR 2764): h5py work on another thread (a reader opening a file, another
        # Writer) then ran inside the non-thread-safe libhdf5 alongside it. phil is reentrant.
        with phil:
            self.ds.id.write_direct_chunk((k * self.chunk_len,), data)
        if k < len(self.stored):  # rewriting the partial last chunk of an appended file
            self.stored[k] = len(data)
            self.checksums[k] = crc
            if self.pages is not None and pages is not None:
                self.pages[k] = pages
        else:
            self.stored.append(len(data))
            self.checksums.append(crc)
            if self.pages is not None and pages is not None:
                self.pages.append(pages)

    def page_index(self) -> np.ndarray | None:
        """The page CRC-32s of chunks 0..next_chunk-1, concatenated (None: no page index)."""
        if self.pages is None:
            return None
        self.flush()
        parts = self.pages[: self.next_chunk]
        return (
            np.concatenate(parts).astype(spec.PAGE_DTYPE) if parts else np.zeros(0, spec.PAGE_DTYPE)
        )

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
        if (offs < 0).any() or not np.array_equal(
            sizes, np.asarray(self.stored[:n], dtype=np.int64)
        ):
            raise FormatError(
                "internal: HDF5's chunk index disagrees with the chunks written",
                path=self.ds.file.filename,
            )
        return offs


#: libhdf5 keeps every object header message (a dataset's datatype, an attribute) below 64 KiB
#: in the file layout PyTables and older HDF5 read (the writer's default libver).
MAX_HEADER_MESSAGE = 64 * 1024 - 512


def check_storable(schema: Schema, user_attrs_json: str) -> None:
    """Refuse, before any row is accepted, a schema (or user attributes) that HDF5 cannot store:
    its row type or its JSON would not fit one object header message (about 1,000 scalar fields
    of 20-character names; h5py would fail at the first block or at close)."""
    import h5py

    type_bytes = len(h5py.h5t.py_create(spec.row_dtype(schema)).encode())
    if type_bytes > MAX_HEADER_MESSAGE:
        raise SchemaError(
            f"a schema of {len(schema)} fields needs {type_bytes} bytes of HDF5 metadata for its "
            f"row type, more than "
            f"the {MAX_HEADER_MESSAGE} HDF5 allows in one object header message; group related "
            f"fields into array "
            f"fields (e.g. Field('features', 'float32', (n,)) instead of n scalar fields)"
        )
    for what, text in (("schema", schema.to_json_str()), ("user attributes", user_attrs_json)):
        if len(text.encode("utf-8")) > MAX_HEADER_MESSAGE:
            raise SchemaError(
                f"the {what} take {len(text.encode('utf-8'))} bytes as JSON, more than the "
                f"{MAX_HEADER_MESSAGE} an HDF5 attribute holds here"
            )


def file_attributes(
    *,
    schema: Schema,
    user_attrs: Mapping[str, Any],
    num_rows: int,
    rows_per_block: int,
    heap_chunk_bytes: int,
    heap_nbytes: int,
    compression: BlockCompression,
) -> dict[str, Any]:
    """The attributes of ``/rowstore``, in the order they are written."""
    return {
        spec.ATTR_FORMAT: spec.FORMAT_NAME,
        spec.ATTR_VERSION: spec.FORMAT_VERSION,
        spec.ATTR_SCHEMA: schema.to_json_str(),
        spec.ATTR_USER: attrs_json.dumps(user_attrs),
        spec.ATTR_NUM_ROWS: num_rows,
        spec.ATTR_ROWS_PER_BLOCK: rows_per_block,
        spec.ATTR_HEAP_CHUNK_BYTES: heap_chunk_bytes,
        spec.ATTR_HEAP_NBYTES: heap_nbytes,
        spec.ATTR_COMPRESSION: json.dumps(compression.get_config(), sort_keys=True),
        spec.ATTR_CHECKSUM: spec.CHECKSUM,
        spec.ATTR_WRITER: f"rowstore {__version__}",
        spec.ATTR_HAS_FOOTER: 1,
    }


@dataclass(frozen=True)
class Tail:
    """What an append continues: the valid rows of a partial last block (else none) and the
    valid bytes of a partial last heap chunk (else empty), checksum-verified."""

    rows: np.ndarray
    heap: bytes


def read_tail(layout: Layout) -> Tail:
    """The partial last block and heap chunk of ``layout``'s file, read with the reader's
    kernels, their CRC-32 checked and decompressed: an append rewrites them with fresh
    checksums, so a corruption it did not check here would become "valid".

    Raises :class:`~rowstore.errors.ChecksumError` or :class:`FormatError` naming the path and
    the block (or heap chunk).
    """
    blocks, rpb, itemsize = layout.blocks, layout.rows_per_block, layout.row_dtype.itemsize
    rows = np.zeros(0, dtype=layout.row_dtype)
    if len(blocks) and int(blocks["num_rows"][-1]) < rpb:
        raw = _load_chunk(layout, "block", len(blocks) - 1)
        rows = raw[: int(blocks["num_rows"][-1]) * itemsize].view(layout.row_dtype).copy()
    heap, H = b"", layout.heap_chunk_bytes
    if layout.heap_nbytes % H:
        n = len(layout.heap_chunks)
        heap = _load_chunk(layout, "heap chunk", n - 1)[
            : layout.heap_nbytes - (n - 1) * H
        ].tobytes()
    return Tail(rows, heap)


def _load_chunk(layout: Layout, what: str, k: int) -> np.ndarray:
    """Chunk ``k`` of the row table (``what="block"``) or of the heap, verified, decompressed."""
    from rowstore import kernels

    offs, stored, checks, raw = layout.chunk_index(what)
    dst = np.empty(raw, np.uint8)
    fd = os.open(layout.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        kernels.load_chunks(
            fd,
            offs[k : k + 1],
            stored[k : k + 1],
            checks[k : k + 1],
            codec=layout.frame_check(),
            verify=True,
            dst=dst,
            raw_size=raw,
            scratch=np.empty(int(stored[k]), np.uint8),
            what=what,
        )
    except kernels.KernelError as exc:
        exc.args = (f"cannot append to {layout.path!r}: {what} {k}: {exc}",)
        exc.path, exc.block = layout.path, k if what == "block" else None
        raise
    finally:
        os.close(fd)
    return dst


class H5File:
    """One rowstore file open for writing through h5py.

    Build it with :meth:`create` or :meth:`reopen`; write with :meth:`write_block` and
    :meth:`write_heap_chunk` in order; end with :meth:`finish` (index, attributes, close) or
    :meth:`abort` (close, nothing more written). Not thread-safe.
    """

    def __init__(
        self,
        h5,
        rows: ChunkStream,
        heap: ChunkStream | None,
        block_heap: list[tuple[int, int]],
        *,
        heap_chunk_bytes: int = 0,
        compressor: Compressor | None = None,
    ):
        self._h5 = h5
        self.path: str = h5.filename
        self.rows = rows
        # The heap dataset is created by the first heap chunk written, whose size is its HDF5
        # chunk size (heap_chunk_bytes, or fewer: a heap of one chunk trimmed to its bytes),
        # or at finish when it stays empty; None until then.
        self.heap = heap
        self._heap_chunk_bytes = heap_chunk_bytes
        self._compressor = compressor
        self._block_heap = block_heap  # per written block: its range in the logical heap

    @classmethod
    def create(
        cls,
        path: str,
        *,
        row_dtype: np.dtype,
        rows_per_block: int,
        heap_chunk_bytes: int,
        with_heap: bool,
        compressor: Compressor,
    ) -> H5File:
        """A new file at ``path`` (replaced) with empty, chunked ``rows`` (and ``heap``)."""
        import h5py

        # Default libver: PyTables and older HDF5 open it. No HDF5 file locking: the AtomicFile's
        # own lock on this file excludes other writers (and HDF5's would conflict with it).
        f = h5py.File(path, "w", locking=False, **_ALIGNMENT)
        try:
            g = f.create_group(spec.GROUP)
            kw = compressor.compression.hdf5_filter_kwargs()
            ds = g.create_dataset(
                spec.ROWS,
                shape=(0,),
                maxshape=(None,),
                chunks=(rows_per_block,),
                dtype=row_dtype,
                **kw,
            )
            rows = ChunkStream(
                ds,
                rows_per_block,
                row_dtype.itemsize,
                compressor,
                typesize=spec.blosc_typesize(row_dtype),
            )
        except BaseException:
            f.close()
            raise
        return cls(
            f,
            rows,
            None,
            [],
            heap_chunk_bytes=heap_chunk_bytes if with_heap else 0,
            compressor=compressor,
        )

    @classmethod
    def reopen(
        cls, path: str, layout: Layout, tail: Tail, *, compressor: Compressor
    ) -> tuple[H5File, PackerTail]:
        """Open ``path`` (a copy of the file that ``layout`` describes) to append to it;
        ``tail`` is :func:`read_tail` of the original.

        Returns the file, positioned to rewrite the partial last block and heap chunk, and their
        contents, which go back to the packer."""
        import h5py
        import hdf5plugin  # noqa: F401 - registers the Blosc2 filter of compressed datasets

        if layout.footer_offset:  # libhdf5 would cut it at close; a new one is written by finish
            footer.cut(path, layout.footer_offset)
        f = h5py.File(path, "r+", locking=False, **_ALIGNMENT)  # as in create
        try:
            g = f[spec.GROUP]
            rows = cls._reopen_stream(
                g[spec.ROWS],
                layout.blocks,
                layout.rows_per_block,
                layout.row_dtype.itemsize,
                spec.blosc_typesize(layout.row_dtype),
                compressor,
                layout.chunk_pages("block"),
            )
            block_heap = [
                (int(a), int(b))
                for a, b in zip(layout.blocks["heap_start"], layout.blocks["heap_end"])
            ]
            with_heap = any(not fl.inline for fl in layout.schema)
            H = layout.heap_chunk_bytes
            out = cls(
                f,
                rows,
                None,
                block_heap,
                heap_chunk_bytes=H if with_heap else 0,
                compressor=compressor,
            )
            pending, rows_written, block_heap_start = out._reopen_last_block(layout, tail)
            heap, heap_flushed = b"", 0
            if with_heap and g[spec.HEAP].chunks != (H,):
                # A trimmed heap of one partial chunk: written again from its first byte, into a
                # heap dataset created anew by the next chunk written.
                del g[spec.HEAP]
                heap = tail.heap
            elif with_heap:
                out.heap = cls._reopen_stream(
                    g[spec.HEAP],
                    layout.heap_chunks,
                    H,
                    1,
                    1,
                    compressor,
                    layout.chunk_pages("heap chunk"),
                )
                heap, heap_flushed = out._reopen_last_heap_chunk(layout, tail)
        except BaseException:
            f.close()
            raise
        return out, PackerTail(
            pending, rows_written, heap, heap_flushed, layout.heap_nbytes, block_heap_start
        )

    @staticmethod
    def _reopen_stream(
        ds,
        index: np.ndarray,
        chunk_len: int,
        itemsize: int,
        typesize: int,
        compressor: Compressor,
        pages: list[np.ndarray] | None,
    ) -> ChunkStream:
        return ChunkStream(
            ds,
            chunk_len,
            itemsize,
            compressor,
            typesize=typesize,
            start_chunk=len(index),
            stored=[int(x) for x in index["stored_nbytes"]],
            checksums=[int(x) for x in index["checksum"]],
            pages=pages,
        )

    def _reopen_last_block(self, layout: Layout, tail: Tail) -> tuple[np.ndarray, int, int]:
        """A partial last block goes back to pending (its chunk is rewritten by the next block
        written): returns its rows, the rows before it, and where its payloads start."""
        blocks, rpb = layout.blocks, layout.rows_per_block
        if not len(blocks) or int(blocks["num_rows"][-1]) == rpb:
            end = self._block_heap[-1][1] if self._block_heap else 0
            return np.zeros(0, dtype=layout.row_dtype), layout.num_rows, end
        first = int(blocks["first_row"][-1])
        self.rows.next_chunk = len(blocks) - 1
        heap_start, _ = self._block_heap.pop()
        return tail.rows, first, heap_start

    def _reopen_last_heap_chunk(self, layout: Layout, tail: Tail) -> tuple[bytes, int]:
        """A partial last heap chunk: its bytes and its logical offset (rewritten, like a block)."""
        assert self.heap is not None  # reopened just before
        H, n = layout.heap_chunk_bytes, len(layout.heap_chunks)
        if layout.heap_nbytes % H == 0:
            return b"", n * H
        self.heap.next_chunk = n - 1
        return tail.heap, (n - 1) * H

    # -- writing -----------------------------------------------------------------------------
    def write_block(self, raw: memoryview, *, extent: int, heap_range: tuple[int, int]) -> None:
        """Write the next block (``rows_per_block`` rows of bytes); the table grows to
        ``extent`` rows; ``heap_range`` is where its payloads lie in the logical heap."""
        self.rows.write(raw, extent=extent)
        self._block_heap.append(heap_range)

    @property
    def heap_started(self) -> bool:
        """Whether a heap chunk was written (the heap dataset and its chunk size exist)."""
        return self.heap is not None

    def write_heap_chunk(self, raw: memoryview, *, extent: int) -> None:
        """Write the next heap chunk (``heap_chunk_bytes``; fewer only as the first and last
        chunk of a heap, its HDF5 chunk size then); the heap grows to ``extent`` bytes."""
        assert self._heap_chunk_bytes, "internal: a heap chunk for a schema without heap fields"
        if self.heap is None:
            self._create_heap(len(raw))
        assert self.heap is not None
        self.heap.write(raw, extent=extent)

    def _create_heap(self, chunk_bytes: int) -> None:
        assert self._compressor is not None and self._h5 is not None
        kw = self._compressor.compression.hdf5_filter_kwargs()
        ds = self._h5[spec.GROUP].create_dataset(
            spec.HEAP, shape=(0,), maxshape=(None,), chunks=(chunk_bytes,), dtype=np.uint8, **kw
        )
        self.heap = ChunkStream(
            ds, chunk_bytes, 1, self._compressor, typesize=1, logical_bytes=self._heap_chunk_bytes
        )

    def finish(
        self, *, rows_per_block: int, num_rows: int, heap_nbytes: int, attrs: Mapping[str, Any]
    ) -> None:
        """Wait for the chunks in flight, write both indexes and ``attrs`` (see
        :func:`file_attributes`), and close the file."""
        g = self._h5[spec.GROUP]
        rows = self.rows
        nblocks = rows.next_chunk
        blocks = block_index(
            rows_per_block=rows_per_block,
            num_rows=num_rows,
            offsets=rows.offsets(),
            stored=rows.stored[:nblocks],
            checksums=rows.checksums[:nblocks],
            heap_ranges=self._block_heap,
        )
        for name in (spec.BLOCKS, spec.HEAP_CHUNKS):
            if name in g:
                del g[name]
        g.create_dataset(spec.BLOCKS, data=blocks)
        chunks = np.zeros(0, dtype=spec.HEAP_CHUNK_DTYPE)
        if self.heap is None and self._heap_chunk_bytes:  # heap fields, no heap byte
            self._create_heap(self._heap_chunk_bytes)
        if self.heap is not None:
            heap, n = self.heap, self.heap.next_chunk
            chunks = heap_chunk_index(
                offsets=heap.offsets(), stored=heap.stored[:n], checksums=heap.checksums[:n]
            )
            g.create_dataset(spec.HEAP_CHUNKS, data=chunks)
            if g[spec.HEAP].shape[0] != heap_nbytes:
                g[spec.HEAP].resize((max(g[spec.HEAP].shape[0], heap_nbytes),))
        block_pages = rows.page_index()
        heap_pages = (
            self.heap.page_index() if self.heap is not None else np.zeros(0, spec.PAGE_DTYPE)
        )
        pages = None if block_pages is None or heap_pages is None else (block_pages, heap_pages)
        attrs = dict(attrs)
        if pages is None:  # no page index: a v2 file, as before it existed
            attrs[spec.ATTR_VERSION] = spec.FORMAT_VERSION_NO_PAGES
        else:
            attrs[spec.ATTR_VERSION] = spec.PAGES_VERSION
            attrs[spec.ATTR_PAGE_BYTES] = spec.PAGE_BYTES
        for key, value in attrs.items():
            g.attrs[key] = value
        h5, self._h5 = (
            self._h5,
            None,
        )  # never closed twice: not even by abort() after a failed close
        try:
            h5.close()
        except RuntimeError as exc:
            raise _close_error(self.path, exc) from exc
        with open(self.path, "r+b") as fh:  # the v2 footer, after the HDF5 end of file
            end = fh.seek(0, os.SEEK_END)
            fh.write(footer.encode(attrs, blocks, chunks, end, pages))

    def abort(self) -> None:
        """Drop the chunks in flight and close the file (what is in it no longer matters)."""
        for stream in (self.rows, self.heap):
            if stream is not None:
                stream.cancel()
        h5, self._h5 = self._h5, None
        if h5 is not None:
            try:
                h5.close()
            except (OSError, RuntimeError, ValueError) as exc:
                # The file is being discarded (its temporary file is removed next): a close that
                # fails, e.g. on a full disk, must not hide the error that caused the abort.
                warnings.warn(
                    f"rowstore: closing the discarded file {self.path!r} failed: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )


def _close_error(path: str, exc: RuntimeError) -> Exception:
    """The error of a failed ``h5py.File.close``: libhdf5 flushes its metadata there, and h5py
    reports a write the system refused (``EIO``, ``ENOSPC``) as a ``RuntimeError`` whose text
    names the errno; it becomes the system's ``OSError`` with that errno (as every other failed
    write is), anything else stays the ``RuntimeError``."""
    m = re.search(r"errno\s*=\s*(\d+)", str(exc))
    if m is None or int(m.group(1)) == 0:
        return exc
    err = int(m.group(1))
    return OSError(err, f"{os.strerror(err)} (libhdf5 flushing {path!r} at close: {exc})", path)
