"""Opening a file: read the attributes, schema and indexes once (through libhdf5) and check
every number that the hot path will trust.

:class:`Layout` is what the reader and the kernels work from; after it is built, reading never
calls libhdf5 again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.codecs import registered_codecs
from rowstore.errors import CodecError, FormatError, FormatVersionError, RowstoreError
from rowstore.format import spec
from rowstore.format.compression import block_compression
from rowstore.schema import Schema

__all__ = ["Layout", "open_h5"]


def open_h5(path: str):
    """Open ``path`` read-only with h5py, with hdf5plugin's filters registered."""
    import h5py
    import hdf5plugin  # noqa: F401 - registers Blosc2 so h5py can decode compressed chunks

    try:
        return h5py.File(path, "r")
    except OSError as exc:
        if exc.errno is not None:  # the system refused (ENOENT, EACCES, EIO...): not a format problem
            raise
        raise FormatError(f"{path!r} is not an HDF5 file, or it is truncated or corrupt: {exc}", path=path) from exc


@dataclass(frozen=True)
class Layout:
    """Everything the reader needs about one file, validated.

    Attributes are plain values and numpy arrays (owned by the layout; do not modify).
    """

    path: str
    version: int
    schema: Schema
    user_attrs: dict
    num_rows: int
    rows_per_block: int
    row_dtype: np.dtype
    compression: dict
    heap_chunk_bytes: int
    heap_nbytes: int
    blocks: np.ndarray  # spec.BLOCK_DTYPE
    heap_chunks: np.ndarray  # spec.HEAP_CHUNK_DTYPE
    file_size: int
    #: (st_dev, st_ino, st_size, st_mtime_ns) of the file when it was opened: readers check that
    #: the file they read is still this one (an atomic rewrite replaces the inode).
    file_id: tuple = ()
    writer: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def compressed(self) -> bool:
        return self.compression["id"] != "none"

    def frame_check(self) -> tuple[int, int] | None:
        """What the kernels require of every compressed chunk's header: the Blosc2 codec and
        shuffle codes the file declares (None: uncompressed)."""
        return block_compression(self.compression).frame_check()

    @property
    def block_raw_bytes(self) -> int:
        return self.rows_per_block * self.row_dtype.itemsize

    @property
    def stored_nbytes(self) -> int:
        return int(self.blocks["stored_nbytes"].sum() + self.heap_chunks["stored_nbytes"].sum())

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the rows and heap payloads as stored before compression."""
        return int(self.num_rows * self.row_dtype.itemsize + self.heap_nbytes)

    def block_rows(self) -> np.ndarray:
        """Valid rows per block (int64)."""
        return self.blocks["num_rows"].astype(np.int64)

    def arrays(self) -> dict[str, np.ndarray]:
        """int64/uint64 contiguous copies of the index columns the kernels take (cached)."""
        if not self._cache:
            b, h = self.blocks, self.heap_chunks
            self._cache.update(
                offset=np.ascontiguousarray(b["offset"], dtype=np.int64),
                stored=np.ascontiguousarray(b["stored_nbytes"], dtype=np.int64),
                checksum=np.ascontiguousarray(b["checksum"], dtype=np.uint64),
                heap_start=np.ascontiguousarray(b["heap_start"], dtype=np.int64),
                heap_end=np.ascontiguousarray(b["heap_end"], dtype=np.int64),
                hc_offset=np.ascontiguousarray(h["offset"], dtype=np.int64),
                hc_stored=np.ascontiguousarray(h["stored_nbytes"], dtype=np.int64),
                hc_checksum=np.ascontiguousarray(h["checksum"], dtype=np.uint64),
            )
        return self._cache

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = False) -> Layout:
        """Read and check the layout of ``path``.

        Raises :class:`FormatError` for a file that is not rowstore, corrupt or truncated, and
        :class:`FormatVersionError` for a version this code cannot read. With ``verify``, also
        reads every chunk and checks its checksum (what ``rowstore verify`` does).
        """
        path = os.fspath(path)
        if os.path.isdir(path):
            raise FormatError(f"{path!r} is a directory; sharded datasets are not supported by this version", path=path)
        st = os.stat(path)
        file_size = st.st_size
        with open_h5(path) as f:
            try:
                layout = cls._read(f, path, file_size)
                object.__setattr__(layout, "file_id", file_identity(st))
            except RowstoreError:
                raise
            except OSError as exc:
                if exc.errno is not None:  # EIO, EACCES...: the system's error, not a malformed file
                    raise
                raise FormatError(f"{path!r}: malformed rowstore file: {exc}", path=path) from exc
            except (KeyError, ValueError, TypeError, AttributeError, RuntimeError, RecursionError, OverflowError) as exc:
                # h5py's errors for damaged metadata (RuntimeError), objects of the wrong kind
                # (AttributeError), sizes numpy cannot represent (OverflowError, ValueError).
                raise FormatError(f"{path!r}: malformed rowstore file: {type(exc).__name__}: {exc}", path=path) from exc
        if verify:
            layout.verify()
        return layout

    @classmethod
    def _read(cls, f, path: str, file_size: int) -> Layout:
        import h5py

        def bad(msg: str) -> FormatError:
            return FormatError(f"{path!r}: {msg}", path=path)

        if spec.GROUP not in f or not isinstance(f[spec.GROUP], h5py.Group) \
                or f[spec.GROUP].attrs.get(spec.ATTR_FORMAT) != spec.FORMAT_NAME:
            raise bad("not a rowstore file (no /rowstore group with format='rowstore')")
        g = f[spec.GROUP]
        a = g.attrs
        version = _version(a, path, bad)
        schema = _schema(a, path, bad)
        try:
            compression = spec.compression_config(_json(a, spec.ATTR_COMPRESSION, '{"id": "none"}', bad))
        except RowstoreError as exc:  # a CodecError: unknown or malformed compression
            raise bad(f"invalid compression attribute: {exc}") from exc
        user_attrs = _json(a, spec.ATTR_USER, "{}", bad)
        if not isinstance(user_attrs, dict):
            raise bad(f"user attributes must be a JSON object, got {type(user_attrs).__name__}")
        num_rows, rpb, H, heap_nbytes = (_int(a, k, bad) for k in (
            spec.ATTR_NUM_ROWS, spec.ATTR_ROWS_PER_BLOCK, spec.ATTR_HEAP_CHUNK_BYTES, spec.ATTR_HEAP_NBYTES))
        if a.get(spec.ATTR_CHECKSUM) not in (spec.CHECKSUM, spec.CHECKSUM.encode()):
            raise bad(f"unknown checksum {a.get(spec.ATTR_CHECKSUM)!r}")
        if rpb < 1 or H < 1 or num_rows < 0 or heap_nbytes < 0:
            raise bad("negative or zero sizes in the attributes")
        row_dtype = spec.row_dtype(schema)
        _check_limits(bad, row_dtype.itemsize, rpb, H, heap_nbytes, num_rows, file_size)
        rows = _dataset(g, spec.ROWS, bad)
        if rows.dtype != row_dtype:
            raise bad(f"row table dtype {rows.dtype} does not match the schema's {row_dtype}")
        if rows.shape != (num_rows,) or rows.chunks != (rpb,):
            raise bad(f"row table shape {rows.shape}/chunks {rows.chunks} disagree with num_rows={num_rows}, rows_per_block={rpb}")
        blocks = _read_index(g, spec.BLOCKS, -(-num_rows // rpb), spec.BLOCK_DTYPE, bad)
        heap_chunks = _heap_index(g, schema, heap_nbytes, H, bad)
        layout = cls(
            path=path, version=version, schema=schema, user_attrs=user_attrs, num_rows=num_rows,
            rows_per_block=rpb, row_dtype=row_dtype, compression=compression, heap_chunk_bytes=H,
            heap_nbytes=heap_nbytes, blocks=blocks, heap_chunks=heap_chunks, file_size=file_size,
            writer=_text(a.get(spec.ATTR_WRITER, "")),
        )  # fmt: skip
        layout._check_indexes(bad)
        return layout

    def _check_indexes(self, bad) -> None:
        """Every number the kernels will trust, checked against the others and the file size."""
        b = self.blocks
        rpb, n = self.rows_per_block, self.num_rows
        nblocks = -(-n // rpb)
        if len(b) != nblocks:
            raise bad(f"block index has {len(b)} entries, expected {nblocks} for {n} rows of {rpb} per block")
        with np.errstate(over="ignore"):
            first = np.arange(nblocks, dtype=np.uint64) * np.uint64(rpb)
            if not np.array_equal(b["first_row"], first):
                raise bad("block index first_row values are not consecutive blocks")
            expect_rows = np.minimum(np.uint64(rpb), np.uint64(n) - first)
            if not np.array_equal(b["num_rows"], expect_rows):
                raise bad("block index num_rows values disagree with num_rows")
            _check_ranges(b["offset"], b["stored_nbytes"], self.file_size, bad, "block")
            if not self.compressed and nblocks and (b["stored_nbytes"] != np.uint64(self.block_raw_bytes)).any():
                raise bad("an uncompressed block's stored size is not rows_per_block * row size")
            hs, he = b["heap_start"], b["heap_end"]
            if nblocks and (
                (hs > he).any() or (he > np.uint64(self.heap_nbytes)).any() or hs[0] != 0 or (hs[1:] != he[:-1]).any()
            ):
                raise bad("block heap ranges are not contiguous within the heap")
            h = self.heap_chunks
            H = self.heap_chunk_bytes
            if len(h) != -(-self.heap_nbytes // H):
                raise bad(f"heap chunk index has {len(h)} entries for {self.heap_nbytes} heap bytes")
            _check_ranges(h["offset"], h["stored_nbytes"], self.file_size, bad, "heap chunk")
            _check_disjoint(b["offset"], b["stored_nbytes"], h["offset"], h["stored_nbytes"], bad)
            if not self.compressed and len(h) and (h["stored_nbytes"] != np.uint64(H)).any():
                raise bad("an uncompressed heap chunk's stored size is not heap_chunk_bytes")

    def verify(self) -> None:
        """Read every row block and heap chunk and check checksums and decompression.

        Raises the first :class:`~rowstore.errors.ChecksumError`/:class:`FormatError` found,
        naming the chunk (see :meth:`damage` for all of them).
        """
        for err in self.damage():
            raise err

    def damage(self, *, limit: int | None = None) -> list[FormatError]:
        """Every damaged block and heap chunk (checksum, decompression or size), in file order,
        as errors with ``block`` (blocks) and ``rows``: the ``(first, end)`` dataset rows whose
        values it holds (a heap chunk: the rows of the blocks whose payloads it holds). Reads
        the whole file, 64 MiB at a time; stops after ``limit`` errors."""
        found: list[FormatError] = []
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            for what in ("block", "heap chunk"):
                *index, raw = self.chunk_index(what)
                for k, exc in self._check_all(fd, what, index, raw):
                    exc.args = (f"{self.path!r}: {what} {k}: {exc}",)
                    exc.path, exc.block = self.path, k if what == "block" else None
                    exc.rows = self._rows_of(what, k)
                    found.append(exc)
                    if limit is not None and len(found) >= limit:
                        return found
        finally:
            os.close(fd)
        return found

    def chunk_index(self, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(offsets, stored sizes, checksums, raw chunk size)`` of the blocks (``"block"``) or
        the heap chunks (``"heap chunk"``), as the kernels take them."""
        arr = self.arrays()
        if what == "block":
            return arr["offset"], arr["stored"], arr["checksum"], self.block_raw_bytes
        return arr["hc_offset"], arr["hc_stored"], arr["hc_checksum"], self.heap_chunk_bytes

    def _check_all(self, fd: int, what: str, index: list[np.ndarray], raw: int):
        """``(position, error)`` of every chunk of one index that fails to load."""
        from rowstore import kernels

        offs, stored, checks = index
        if not len(offs):
            return
        step = max(1, (64 << 20) // raw)
        dst = np.empty(min(step, len(offs)) * raw, np.uint8)
        scratch = np.empty(int(stored.max()), np.uint8)
        i = 0
        while i < len(offs):
            j = min(i + step, len(offs))
            try:
                kernels.load_chunks(fd, offs[i:j], stored[i:j], checks[i:j], codec=self.frame_check(), verify=True,
                                    dst=dst[: (j - i) * raw], raw_size=raw, scratch=scratch, what=what)
                i = j
            except kernels.KernelError as exc:
                yield i + exc.index, exc
                i += exc.index + 1  # go on after the damaged chunk

    def _rows_of(self, what: str, k: int) -> tuple[int, int]:
        b = self.blocks
        if what == "block":
            return int(b["first_row"][k]), int(b["first_row"][k] + b["num_rows"][k])
        H = self.heap_chunk_bytes
        lo, hi = np.uint64(k * H), np.uint64((k + 1) * H)
        hit = np.flatnonzero((b["heap_start"] < hi) & (b["heap_end"] > lo))
        if not len(hit):
            return (0, 0)
        return int(b["first_row"][hit[0]]), int(b["first_row"][hit[-1]] + b["num_rows"][hit[-1]])


def file_identity(st: os.stat_result) -> tuple:
    """What identifies one version of a file: device, inode, size and modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _int(attrs, name: str, bad) -> int:
    v = attrs.get(name)
    if not isinstance(v, (int, np.integer)):
        raise bad(f"attribute {name!r} is missing or not an int: {v!r}")
    return int(v)


def _check_limits(bad, row_size: int, rpb: int, H: int, heap_nbytes: int, num_rows: int, file_size: int) -> None:
    """Sizes the reader allocates from, against the format's limits, before anything is read."""
    if rpb * row_size > spec.MAX_CHUNK_BYTES:
        raise bad(f"a block of {rpb} rows of {row_size} bytes ({rpb * row_size} bytes) exceeds the format's limit of "
                  f"{spec.MAX_CHUNK_BYTES} bytes per block")
    if H > spec.MAX_CHUNK_BYTES:
        raise bad(f"heap_chunk_bytes {H} exceeds the format's limit of {spec.MAX_CHUNK_BYTES}")
    if num_rows > 0 and -(-num_rows // rpb) * spec.BLOCK_DTYPE.itemsize > file_size:
        raise bad(f"num_rows={num_rows} needs a block index larger than the file ({file_size} bytes)")
    if heap_nbytes > 0 and -(-heap_nbytes // H) * spec.HEAP_CHUNK_DTYPE.itemsize > file_size:
        raise bad(f"heap_nbytes={heap_nbytes} needs a heap chunk index larger than the file ({file_size} bytes)")


def _json(attrs, name: str, default: str, bad) -> Any:
    try:
        return json.loads(_text(attrs.get(name, default)))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; nesting too deep
        raise bad(f"attribute {name!r} is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def _dataset(g, name: str, bad):
    """``g[name]``, which must be a 1-D dataset."""
    import h5py

    if name not in g:
        raise bad(f"/{spec.GROUP}/{name} is missing")
    ds = g[name]
    if not isinstance(ds, h5py.Dataset) or len(ds.shape or ()) != 1:
        raise bad(f"/{spec.GROUP}/{name} is not a 1-D dataset")
    return ds


def _read_index(g, name: str, expected: int, dtype: np.dtype, bad) -> np.ndarray:
    """An index dataset of ``expected`` entries, its length checked before it is read (an
    unallocated HDF5 dataset can declare any length without storing it)."""
    ds = _dataset(g, name, bad)
    if ds.shape != (expected,):
        raise bad(f"{name} index has shape {ds.shape}, expected ({expected},)")
    if ds.dtype != dtype:
        raise bad(f"{name} index dtype {ds.dtype} is not {dtype}")
    return np.asarray(ds[()])


def _heap_index(g, schema: Schema, heap_nbytes: int, H: int, bad) -> np.ndarray:
    """The heap chunk index, checked against the heap dataset (empty without heap fields)."""
    if all(fl.inline for fl in schema):
        if heap_nbytes:
            raise bad("heap_nbytes is not 0 for a schema without heap fields")
        return np.zeros(0, dtype=spec.HEAP_CHUNK_DTYPE)
    heap_chunks = _read_index(g, spec.HEAP_CHUNKS, -(-heap_nbytes // H), spec.HEAP_CHUNK_DTYPE, bad)
    heap = _dataset(g, spec.HEAP, bad)
    if heap.shape != (heap_nbytes,) or heap.chunks != (H,):
        raise bad(f"heap shape {heap.shape}/chunks {heap.chunks} disagree with heap_nbytes={heap_nbytes}, heap_chunk_bytes={H}")
    return heap_chunks


def _version(a, path: str, bad) -> int:
    version = a.get(spec.ATTR_VERSION)
    if not isinstance(version, (int, np.integer)):
        raise bad(f"format_version is missing or not an int: {version!r}")
    version = int(version)
    if version not in spec.READABLE_VERSIONS:
        newer = version > max(spec.READABLE_VERSIONS)
        raise FormatVersionError(
            f"{path!r} uses rowstore format v{version}; this rowstore reads "
            f"v{', v'.join(map(str, spec.READABLE_VERSIONS))}"
            + (" (upgrade rowstore to read it)" if newer else ""),
            path=path,
        )
    return version


def _schema(a, path: str, bad) -> Schema:
    try:
        return Schema.from_json(_text(a[spec.ATTR_SCHEMA]))
    except CodecError as exc:
        if exc.codec is not None and exc.codec not in registered_codecs():
            # A codec this installation lacks: say which and what to install, not "corrupt".
            raise CodecError(f"{path!r} uses codec {exc.codec!r}, which is not installed here: {exc}",
                             codec=exc.codec, field=exc.field) from exc
        raise bad(f"invalid schema: {exc}") from exc
    except (RowstoreError, KeyError) as exc:
        raise bad(f"invalid schema: {exc}") from exc


def _check_disjoint(b_off: np.ndarray, b_size: np.ndarray, h_off: np.ndarray, h_size: np.ndarray, bad) -> None:
    """Stored chunks are disjoint byte ranges of the file: entries that share bytes (so a small
    file could claim a huge dataset, every block pointing at one chunk) are refused."""
    off = np.concatenate([b_off, h_off]).astype(np.uint64)
    end = off + np.concatenate([b_size, h_size]).astype(np.uint64)  # in the file: no overflow (checked)
    if len(off) < 2:
        return
    order = np.argsort(off, kind="stable")
    overlap = end[order][:-1] > off[order][1:]
    if overlap.any():
        i = int(np.argmax(overlap))
        a, z = (int(order[i]), int(order[i + 1]))
        name = lambda k: f"block {k}" if k < len(b_off) else f"heap chunk {k - len(b_off)}"  # noqa: E731
        raise bad(f"{name(a)} and {name(z)} share bytes of the file (offsets {int(off[a])} and {int(off[z])}): "
                  f"the index is corrupt")


def _check_ranges(offsets: np.ndarray, sizes: np.ndarray, file_size: int, bad, what: str) -> None:
    if not len(offsets):
        return
    with np.errstate(over="ignore"):
        end = offsets + sizes
        if (sizes == 0).any() or (end < offsets).any() or (end > np.uint64(file_size)).any():
            i = int(np.argmax((sizes == 0) | (end < offsets) | (end > np.uint64(file_size))))
            raise bad(f"{what} {i} lies outside the file (offset {int(offsets[i])}, {int(sizes[i])} bytes, file of {file_size} bytes; truncated?)")
