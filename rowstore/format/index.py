"""Opening a file: read the attributes, schema and indexes once (a v2 file from its footer,
:mod:`rowstore.format.footer`, without libhdf5; a v1 file through libhdf5) and check every
number that the hot path will trust.

:class:`Layout` is what the reader and the kernels work from; after it is built, reading never
calls libhdf5 again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.codecs import registered_codecs
from rowstore.codecs.blocks import block_compression, compression_config
from rowstore.errors import CodecError, FormatError, FormatVersionError, RemoteError, RowstoreError
from rowstore.format import attrs as attrs_json
from rowstore.format import footer, spec
from rowstore.format import stats as stats_format
from rowstore.schema import Schema
from rowstore.storage import Location, locate

__all__ = ["Layout", "IndexSizes", "open_h5", "check_indexes", "scan_chunks"]

#: Prefix of a cached v2 footer (a metadata image of a v1 file starts with a page number).
_FOOTER_IMAGE = b"RSFOOTER-IMAGE\0\0"


def open_h5(path: str):
    """Open ``path`` read-only with h5py, with hdf5plugin's filters registered."""
    import h5py
    import hdf5plugin  # noqa: F401 - registers Blosc2 so h5py can decode compressed chunks

    try:
        return h5py.File(path, "r")
    except OSError as exc:
        if (
            exc.errno is not None
        ):  # the system refused (ENOENT, EACCES, EIO...): not a format problem
            raise
        raise FormatError(
            f"{path!r} is not an HDF5 file, or it is truncated or corrupt: {exc}", path=path
        ) from exc


class IndexSizes:
    """What a file's and a dataset's layout compute alike from ``blocks``, ``heap_chunks``,
    ``compression``, ``num_rows``, ``row_dtype`` and ``heap_nbytes`` (a mixin: no state)."""

    blocks: np.ndarray
    heap_chunks: np.ndarray
    compression: dict
    row_dtype: np.dtype

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def compressed(self) -> bool:
        return self.compression["id"] != "none"

    def frame_check(self) -> tuple[int, int] | None:
        """What the kernels require of every compressed chunk's header: the Blosc2 codec and
        shuffle codes declared (None: uncompressed)."""
        return block_compression(self.compression).frame_check()

    @property
    def stored_nbytes(self) -> int:
        return int(self.blocks["stored_nbytes"].sum() + self.heap_chunks["stored_nbytes"].sum())

    @property
    def raw_nbytes(self) -> int:
        """Bytes of the rows and heap payloads as stored before compression."""
        return int(self.num_rows * self.row_dtype.itemsize + self.heap_nbytes)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Layout(IndexSizes):
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
    #: :func:`file_identity` of the file when it was opened: readers check that the file they
    #: (re)open is still this one (an atomic rewrite replaces the inode, a write in place changes
    #: the times).
    file_id: tuple = ()
    writer: str = ""
    #: Where a v2 file's footer starts (the HDF5 end of file, which every chunk lies before);
    #: 0 for a v1 file.
    footer_offset: int = 0
    #: The page index of a v3 file (:func:`spec.page_geometry`): its page size, and the CRC-32
    #: (uint32) of every page of the blocks and of the heap chunks, in order; 0 and None for a
    #: file without one (v1, v2, or a v3 file read through libhdf5).
    page_bytes: int = 0
    block_pages: np.ndarray | None = None
    heap_pages: np.ndarray | None = None
    #: The statistics of its rows (stored form, checked: :mod:`rowstore.format.stats`); None
    #: for a file written without them.
    stats: dict | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def block_raw_bytes(self) -> int:
        return self.rows_per_block * self.row_dtype.itemsize

    def page_geometry(self, what: str) -> tuple[int, int]:
        """``(bytes per page, pages per chunk)`` of the blocks (``"block"``) or heap chunks."""
        if what == "block":
            return spec.page_geometry(
                self.page_bytes, self.block_raw_bytes, self.row_dtype.itemsize
            )
        return spec.page_geometry(self.page_bytes, self.heap_chunk_bytes)

    def chunk_pages(self, what: str) -> list[np.ndarray] | None:
        """Each block's (``"block"``) or heap chunk's page CRC-32s (None: no page index)."""
        pages = self.block_pages if what == "block" else self.heap_pages
        if not self.page_bytes or pages is None:
            return None
        per = self.page_geometry(what)[1]
        return [pages[k * per : (k + 1) * per].copy() for k in range(len(pages) // per)]

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
    def open(
        cls,
        path: str | os.PathLike | Location,
        *,
        scan: bool = False,
        allow_missing_footer: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Layout:
        """Read and check the layout of the file at ``path`` (a path, a URL, or a
        :class:`~rowstore.storage.location.Location`; ``storage_options`` as for
        :func:`rowstore.open`).

        Raises :class:`FormatError` for a file that is not rowstore, corrupt or truncated, and
        :class:`FormatVersionError` for a version this code cannot read. With ``scan``, also
        reads every chunk now and checks its checksum (what ``rowstore verify`` does). A v2
        file whose footer is gone (edited with h5py, which cuts it at close) is a
        :class:`FormatError` unless ``allow_missing_footer``: then it is read through libhdf5
        with v1's guarantees only (an index entry edited in the HDF5 part is not detected).

        A v2 file is read from its footer alone (locally its trailer, then exactly the footer;
        at a URL a HEAD and one ranged GET of the last MiB); a v1 file's HDF5 metadata is
        parsed by h5py (at a URL from an in-memory image of the byte ranges it occupies:
        libhdf5 never sees the network). A remote file's ``file_id`` is ``(size, etag)`` and,
        with a ``cache``, its footer or image is kept, so that a later open of the same object
        makes the HEAD only.

        ``scan`` is the eager check of every chunk; ``verify``, as everywhere, means checking
        what is read as it is read (:func:`rowstore.open`), which a layout does not do.
        """
        where = path if isinstance(path, Location) else locate(os.fspath(path), storage_options)
        name = where.path
        if where.is_dir():
            raise FormatError(
                f"{name!r} is a directory, not a rowstore file (a dataset directory opens with "
                f"rowstore.open)",
                path=name,
            )
        with where.open_file() as f:
            layout = cls._from_file(f, allow_missing_footer)
        if scan:
            for err in layout.damage(limit=1, location=where):
                raise err
        return layout

    @classmethod
    def _from_file(cls, f: Any, allow_missing_footer: bool) -> Layout:
        """The layout of an opened file (:meth:`~rowstore.storage.location.Location.open_file`)."""
        name, size = f.path, f.size
        image = f.cached_meta()
        first = None
        if image is not None and image.startswith(_FOOTER_IMAGE):
            first, image = image[len(_FOOTER_IMAGE) :], None
        if first is None and image is None:
            first = f.tail(footer.TRAILER_SIZE)
        if first is not None:
            ft = footer.read(f.read, size, name, first=first)
            if ft is not None:  # v2: the footer alone, never libhdf5
                layout = cls.from_footer(ft, name, size, f.ident)
                if image is None:
                    f.keep_meta(_FOOTER_IMAGE + ft.raw)
                return layout
        import h5py  # v1: libhdf5 parses the metadata (a v2 file never loads it)
        import hdf5plugin  # noqa: F401 - registers Blosc2 so h5py can decode compressed chunks

        meta = f.hdf5(image=image, tail=first)
        try:
            footer.check_no_footer(meta.read_range, size, name)
            with h5py.File(meta.file, "r") as h5:
                layout = cls.from_h5(
                    h5, name, size, f.ident, allow_missing_footer=allow_missing_footer
                )
            if meta.requests:
                f.keep_meta(meta.image())
            return layout
        except OSError as exc:
            if isinstance(exc, (RemoteError, FormatError)) or exc.errno is not None:
                raise  # the system refused (ENOENT, EACCES, EIO...): not a format problem
            raise FormatError(
                f"{name!r} is not an HDF5 file, or it is truncated or corrupt: {exc}", path=name
            ) from exc
        finally:
            meta.close()

    @classmethod
    def from_h5(
        cls,
        f,
        path: str,
        file_size: int,
        file_id: tuple = (),
        *,
        allow_missing_footer: bool = False,
    ) -> Layout:
        """Read and check the layout of an open ``h5py.File`` ``f`` of ``file_size`` bytes (a
        local file, or an in-memory image of a remote file's metadata) that has no footer;
        ``path`` names it in errors, ``file_id`` is what a store checks before reading it. A
        file whose attributes say it had a footer is refused unless ``allow_missing_footer``."""
        with _malformed(path):
            layout = cls._read(f, path, file_size, allow_missing_footer)
            object.__setattr__(layout, "file_id", file_id)
        return layout

    @classmethod
    def _read(cls, f, path: str, file_size: int, allow_missing_footer: bool) -> Layout:
        import h5py

        def bad(msg: str) -> FormatError:
            return FormatError(f"{path!r}: {msg}", path=path)

        if (
            spec.GROUP not in f
            or not isinstance(f[spec.GROUP], h5py.Group)
            or f[spec.GROUP].attrs.get(spec.ATTR_FORMAT) != spec.FORMAT_NAME
        ):
            raise bad("not a rowstore file (no /rowstore group with format='rowstore')")
        g = f[spec.GROUP]
        h = _header(g.attrs, path, bad, file_size)
        schema, num_rows, rpb, H, heap_nbytes = (
            h["schema"],
            h["num_rows"],
            h["rows_per_block"],
            h["heap_chunk_bytes"],
            h["heap_nbytes"],
        )
        rows = _dataset(g, spec.ROWS, bad)
        if rows.dtype != h["row_dtype"]:
            raise bad(f"row table dtype {rows.dtype} does not match the schema's {h['row_dtype']}")
        if rows.shape != (num_rows,) or rows.chunks != (rpb,):
            raise bad(
                f"row table shape {rows.shape}/chunks {rows.chunks} disagree with "
                f"num_rows={num_rows}, rows_per_block={rpb}"
            )
        blocks = _read_index(g, spec.BLOCKS, -(-num_rows // rpb), spec.BLOCK_DTYPE, bad)
        heap_chunks = _heap_index(g, schema, heap_nbytes, H, bad)
        layout = cls(path=path, blocks=blocks, heap_chunks=heap_chunks, file_size=file_size, **h)
        layout._check_indexes(bad)
        # A v2 file without its footer (h5py wrote over it or cut it at close, or the file was cut
        # exactly where it started: see footer.check_no_footer) has a complete HDF5 part, but
        # nothing checks its index any more: read like a v1 file only when the caller says so (the
        # checks above first, so that a damaged file is reported as damaged).
        if (h["version"] >= 2 or spec.ATTR_HAS_FOOTER in g.attrs) and not allow_missing_footer:
            raise bad(
                f"its attributes say format v{h['version']} with a checksummed footer, but the "
                f"footer is gone (the "
                f"file was opened for writing with h5py or another HDF5 tool, which cuts it at "
                f"close, or it was "
                f"truncated where the footer starts); its index can no longer be checked. Read it "
                f"anyway, "
                f"with v1's guarantees, with allow_missing_footer=True (rowstore.open, "
                f"rowstore.Layout.open; "
                f"--allow-missing-footer on the command line)"
            )
        return layout

    @classmethod
    def from_footer(
        cls, ft: footer.Footer, path: str, file_size: int, file_id: tuple = ()
    ) -> Layout:
        """The layout of a v2 file from its footer (:func:`rowstore.format.footer.read`) alone:
        the same checks as :meth:`from_h5`, without libhdf5. Chunks must lie before the footer."""
        with _malformed(path):
            return cls._from_footer(ft, path, file_size, file_id)

    @classmethod
    def _from_footer(cls, ft: footer.Footer, path: str, file_size: int, file_id: tuple) -> Layout:
        def bad(msg: str) -> FormatError:
            return FormatError(f"{path!r}: v2 footer: {msg}", path=path)

        a = ft.header
        if a.get(spec.ATTR_FORMAT) != spec.FORMAT_NAME:
            raise bad(f"format is {a.get(spec.ATTR_FORMAT)!r}, expected {spec.FORMAT_NAME!r}")
        if a.get(footer.KEY_EOF) != ft.offset or isinstance(a.get(footer.KEY_EOF), bool):
            raise bad(
                f"{footer.KEY_EOF} {a.get(footer.KEY_EOF)!r} disagrees with the trailer's footer "
                f"offset {ft.offset}"
            )
        h = _header(a, path, bad, file_size)
        if h["version"] < 2:
            raise bad(f"declares format v{h['version']}, which has no footer")
        nb = -(-h["num_rows"] // h["rows_per_block"])
        nh = (
            0
            if all(fl.inline for fl in h["schema"])
            else -(-h["heap_nbytes"] // h["heap_chunk_bytes"])
        )
        if nh == 0 and h["heap_nbytes"]:
            raise bad("heap_nbytes is not 0 for a schema without heap fields")
        pages = None
        if h["version"] >= spec.PAGES_VERSION:
            P = a.get(spec.ATTR_PAGE_BYTES)
            if not isinstance(P, int) or isinstance(P, bool) or not 1 <= P <= spec.MAX_PAGE_BYTES:
                raise bad(f"{spec.ATTR_PAGE_BYTES} {P!r} is not an int in 1..{spec.MAX_PAGE_BYTES}")
            h["page_bytes"] = P
            ppb = spec.page_geometry(
                P, h["rows_per_block"] * h["row_dtype"].itemsize, h["row_dtype"].itemsize
            )[1]
            pph = spec.page_geometry(P, h["heap_chunk_bytes"])[1]
            if (nb * ppb + nh * pph) * spec.PAGE_DTYPE.itemsize > file_size:
                raise bad(
                    f"a page index of {nb * ppb + nh * pph} pages is larger than the file "
                    f"({file_size} bytes)"
                )
            pages = (nb * ppb, nh * pph)
        blocks, heap_chunks, page_crcs = ft.indexes(nb, nh, bad, pages)
        if page_crcs is not None:
            h["block_pages"], h["heap_pages"] = page_crcs
        layout = cls(
            path=path,
            blocks=blocks,
            heap_chunks=heap_chunks,
            file_size=file_size,
            footer_offset=ft.offset,
            **h,
        )
        object.__setattr__(layout, "file_id", file_id)
        layout._check_indexes(bad)
        return layout

    def _check_indexes(self, bad) -> None:
        """Every number the kernels will trust, checked against the others and the file size."""
        one = lambda v: np.array([v], np.int64)  # noqa: E731
        check_indexes(
            lambda _s, msg: bad(msg),
            blocks=self.blocks,
            heap_chunks=self.heap_chunks,
            rows=one(self.num_rows),
            rows_per_block=one(self.rows_per_block),
            heap_nbytes=one(self.heap_nbytes),
            file_size=one(self.footer_offset or self.file_size),
            block_counts=one(len(self.blocks)),
            heap_chunk_counts=one(len(self.heap_chunks)),
            heap_chunk_bytes=self.heap_chunk_bytes,
            row_size=self.row_dtype.itemsize,
            compressed=self.compressed,
        )

    def verify(self) -> None:
        """Read every row block and heap chunk and check checksums and decompression.

        Raises the first :class:`~rowstore.errors.ChecksumError`/:class:`FormatError` found,
        naming the chunk (see :meth:`damage` for all of them).
        """
        for err in self.damage():
            raise err

    def damage(
        self, *, limit: int | None = None, location: Location | None = None
    ) -> list[FormatError]:
        """Every damaged block and heap chunk (checksum, decompression or size), in file order,
        as errors with ``block`` (blocks) and ``rows``: the ``(first, end)`` dataset rows whose
        values it holds (a heap chunk: the rows of the blocks whose payloads it holds). Reads
        the whole file, 64 MiB at a time, through ``location`` (default: its path's, without
        options); stops after ``limit`` errors."""
        found: list[FormatError] = []
        f = (location or locate(self.path)).open_file()
        try:
            for what in ("block", "heap chunk"):
                *index, raw = self.chunk_index(what)
                for k, exc in self._check_all(f, what, index, raw):
                    exc.args = (f"{self.path!r}: {what} {k}: {exc}",)
                    exc.path, exc.block = self.path, k if what == "block" else None
                    exc.rows = self._rows_of(what, k)
                    found.append(exc)
                    if limit is not None and len(found) >= limit:
                        return found
        finally:
            f.close()
        return found

    def chunk_index(self, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """``(offsets, stored sizes, checksums, raw chunk size)`` of the blocks (``"block"``) or
        the heap chunks (``"heap chunk"``), as the kernels take them."""
        arr = self.arrays()
        if what == "block":
            return arr["offset"], arr["stored"], arr["checksum"], self.block_raw_bytes
        return arr["hc_offset"], arr["hc_stored"], arr["hc_checksum"], self.heap_chunk_bytes

    def _check_all(self, f: Any, what: str, index: list[np.ndarray], raw: int):
        """``(position, error)`` of every chunk of one index that fails to load."""
        return scan_chunks(f, *index, raw_size=raw, codec=self.frame_check(), what=what)

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


def scan_chunks(
    f: Any,
    offsets: np.ndarray,
    stored: np.ndarray,
    checksums: np.ndarray,
    *,
    raw_size: int,
    codec: tuple[int, int] | None,
    what: str,
):
    """Load every chunk of one file's index (64 MiB at a time) and yield ``(position, error)``
    for each that fails (checksum, decompression, size); the scan goes on after a failure.

    ``f`` is the file opened by its location
    (:meth:`~rowstore.storage.location.Location.open_file`): a local file loads each step with
    one kernel call on its descriptor, an object by ranged requests of at most 8 MiB."""
    from rowstore import kernels

    if not len(offsets):
        return
    step = max(1, (64 << 20) // raw_size)
    dst = np.empty(min(step, len(offsets)) * raw_size, np.uint8)
    i = 0
    while i < len(offsets):
        j = min(i + step, len(offsets))
        try:
            i += f.load_chunks(
                offsets[i:j],
                stored[i:j],
                checksums[i:j],
                codec=codec,
                dst=dst[: (j - i) * raw_size],
                raw_size=raw_size,
                what=what,
            )
        except kernels.KernelError as exc:
            yield i + exc.index, exc
            i += exc.index + 1  # go on after the damaged chunk


def check_indexes(
    bad,
    *,
    blocks: np.ndarray,
    heap_chunks: np.ndarray,
    rows: np.ndarray,
    rows_per_block: np.ndarray,
    heap_nbytes: np.ndarray,
    file_size: np.ndarray,
    block_counts: np.ndarray,
    heap_chunk_counts: np.ndarray,
    heap_chunk_bytes: int,
    row_size: int,
    compressed: bool,
) -> None:
    """Check the block and heap chunk indexes of one or more files at once (vectorized: a
    dataset of 10,000 shards is checked in a few numpy passes).

    ``blocks``/``heap_chunks`` are the files' indexes concatenated in file order (file-local
    values); the other arrays hold one value per file. ``bad(file, message)`` makes the error
    raised for file number ``file``. Checked: entry counts, consecutive ``first_row``,
    ``num_rows``, chunk byte ranges inside their file and disjoint within it, uncompressed
    chunk sizes, compressed chunk sizes within raw size + :data:`spec.MAX_FRAME_OVERHEAD`,
    contiguous block heap ranges within the heap.
    """
    S = len(rows)
    rows, rpb, hn, fs = (
        np.asarray(a, np.int64) for a in (rows, rows_per_block, heap_nbytes, file_size)
    )
    bc, hc = np.asarray(block_counts, np.int64), np.asarray(heap_chunk_counts, np.int64)
    H = heap_chunk_bytes
    if len(blocks) != int(bc.sum()) or len(heap_chunks) != int(hc.sum()):
        raise bad(0, "index lengths disagree with the entry counts")
    want_b = -(-rows // rpb)
    if (bc != want_b).any():
        i = int(np.argmax(bc != want_b))
        raise bad(
            i,
            f"block index has {int(bc[i])} entries, expected {int(want_b[i])} for {int(rows[i])} "
            f"rows of "
            f"{int(rpb[i])} per block",
        )
    want_h = -(-hn // H)
    if (hc != want_h).any():
        i = int(np.argmax(hc != want_h))
        raise bad(i, f"heap chunk index has {int(hc[i])} entries for {int(hn[i])} heap bytes")
    fb = np.repeat(np.arange(S), bc)  # file of each block
    fh = np.repeat(np.arange(S), hc)
    b_start = np.cumsum(bc) - bc  # first block of each file
    local = np.arange(len(blocks), dtype=np.int64) - b_start[fb]

    def first_bad(mask: np.ndarray, files: np.ndarray, msg: str) -> None:
        if mask.any():
            raise bad(int(files[int(np.argmax(mask))]), msg)

    # Contiguous copies of the fields (ops on strided record fields cost 2-3x).
    B = {k: np.ascontiguousarray(blocks[k]) for k in blocks.dtype.names or ()}
    C = {k: np.ascontiguousarray(heap_chunks[k]) for k in heap_chunks.dtype.names or ()}
    with np.errstate(over="ignore"):
        u = np.uint64
        rpb_b = rpb[fb].astype(u)
        first = local.astype(u) * rpb_b
        first_bad(
            B["first_row"] != first, fb, "block index first_row values are not consecutive blocks"
        )
        expect_rows = np.minimum(rpb_b, rows[fb].astype(u) - first)
        first_bad(
            B["num_rows"] != expect_rows, fb, "block index num_rows values disagree with num_rows"
        )
        counts = {"block": bc, "heap chunk": hc}
        for what, idx, owner in (("block", B, fb), ("heap chunk", C, fh)):
            off, size = idx["offset"], idx["stored_nbytes"]
            end = off + size
            out = (size == 0) | (end < off) | (end > fs[owner].astype(u))
            if out.any():
                i = int(np.argmax(out))
                k = i - int((np.cumsum(counts[what]) - counts[what])[owner[i]])
                raise bad(
                    int(owner[i]),
                    f"{what} {k} lies outside the file (offset {int(off[i])}, {int(size[i])} "
                    f"bytes, "
                    f"file of {int(fs[owner[i]])} bytes; truncated?)",
                )
        if not compressed:
            first_bad(
                B["stored_nbytes"] != rpb_b * u(row_size),
                fb,
                "an uncompressed block's stored size is not rows_per_block * row size",
            )
            # Each is heap_chunk_bytes, but a heap of one chunk may store it trimmed to the
            # file's heap bytes (see the writer: no mostly empty chunk for a small file).
            alone = (hc == 1)[fh]
            short_ok = (
                alone & (C["stored_nbytes"] >= hn[fh].astype(u)) & (C["stored_nbytes"] < u(H))
            )
            first_bad(
                (C["stored_nbytes"] != u(H)) & ~short_ok,
                fh,
                "an uncompressed heap chunk's stored size is not heap_chunk_bytes",
            )
        else:  # the scratch a reader stages compressed chunks in is sized by the largest of them
            slack = u(spec.MAX_FRAME_OVERHEAD)
            first_bad(
                B["stored_nbytes"] > rpb_b * u(row_size) + slack,
                fb,
                "a compressed block's stored size exceeds its raw size plus the Blosc2 frame "
                "overhead",
            )
            first_bad(
                C["stored_nbytes"] > u(H) + slack,
                fh,
                "a compressed heap chunk's stored size exceeds heap_chunk_bytes plus the Blosc2 "
                "frame overhead",
            )
        hs, he = B["heap_start"], B["heap_end"]
        is_first = local == 0
        prev_end = np.concatenate(([u(0)], he[:-1])) if len(he) else he
        broken = (hs > he) | (he > hn[fb].astype(u)) | np.where(is_first, hs != 0, hs != prev_end)
        first_bad(broken, fb, "block heap ranges are not contiguous within the heap")
        # Chunks of one file share no bytes (so a small file cannot claim a huge dataset, every
        # block pointing at one chunk). Every chunk lies inside its file (checked above), so
        # placing the files end to end (file k at the sum of the sizes before it) keeps chunks of
        # different files apart: one sort of those positions finds any overlap.
        owner = np.concatenate([fb, fh])
        base = (np.cumsum(fs) - fs).astype(u)[owner]
        off = np.concatenate([B["offset"], C["offset"]])
        pos = base + off
        end = pos + np.concatenate([B["stored_nbytes"], C["stored_nbytes"]])
        if len(pos) > 1:
            order = np.argsort(pos, kind="stable")
            overlap = end[order][:-1] > pos[order][1:]
            if overlap.any():
                i = int(np.argmax(overlap))
                a, z = int(order[i]), int(order[i + 1])
                nb = len(blocks)

                def name(k: int) -> str:
                    if k < nb:
                        return f"block {int(local[k])}"
                    return f"heap chunk {k - nb - int((np.cumsum(hc) - hc)[fh[k - nb]])}"

                raise bad(
                    int(owner[a]),
                    f"{name(a)} and {name(z)} share bytes of the file (offsets {int(off[a])} and "
                    f"{int(off[z])}): the index is corrupt",
                )


def schema_row_dtype(schema: Schema, bad) -> np.dtype:
    """:func:`spec.row_dtype` of a schema read from a file or manifest; a row layout numpy
    cannot build (a dimension beyond a C int, a row beyond its size limits) is ``bad(msg)``."""
    try:
        return spec.row_dtype(schema)
    except (ValueError, OverflowError, MemoryError) as exc:
        raise bad(
            f"the schema's row layout cannot be built ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, str):
        return v
    raise ValueError(f"expected text, got {type(v).__name__}")


def _int(attrs, name: str, bad) -> int:
    v = attrs.get(name)
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise bad(f"attribute {name!r} is missing or not an int: {v!r}")
    return int(v)


@contextlib.contextmanager
def _malformed(path: str) -> Iterator[None]:
    """Turn what parsing hostile metadata may raise (h5py's errors for damaged metadata, values
    of the wrong type, sizes numpy cannot represent) into a :class:`FormatError`."""
    try:
        yield
    except RowstoreError:
        raise
    except OSError as exc:
        if exc.errno is not None:  # EIO, EACCES...: the system's error, not a malformed file
            raise
        raise FormatError(f"{path!r}: malformed rowstore file: {exc}", path=path) from exc
    except (
        KeyError,
        ValueError,
        TypeError,
        AttributeError,
        RuntimeError,
        RecursionError,
        OverflowError,
    ) as exc:
        # h5py's errors for damaged metadata (RuntimeError), objects of the wrong kind
        # (AttributeError), sizes numpy cannot represent (OverflowError, ValueError).
        raise FormatError(
            f"{path!r}: malformed rowstore file: {type(exc).__name__}: {exc}", path=path
        ) from exc


def _header(a, path: str, bad, file_size: int) -> dict[str, Any]:
    """The attributes of a file (``a``: the ``/rowstore`` attributes, or a v2 footer's header,
    which holds the same keys and values), checked, as :class:`Layout` fields."""
    version = _version(a, path, bad)
    schema = _schema(a, path, bad)
    try:
        compression = compression_config(_json(a, spec.ATTR_COMPRESSION, '{"id": "none"}', bad))
    except RowstoreError as exc:  # a CodecError: unknown or malformed compression
        raise bad(f"invalid compression attribute: {exc}") from exc
    user_attrs = _json(a, spec.ATTR_USER, "{}", bad)
    if not isinstance(user_attrs, dict):
        raise bad(f"user attributes must be a JSON object, got {type(user_attrs).__name__}")
    try:
        user_attrs = attrs_json.decode(user_attrs)
    except FormatError as exc:
        raise bad(str(exc)) from None
    num_rows, rpb, H, heap_nbytes = (
        _int(a, k, bad)
        for k in (
            spec.ATTR_NUM_ROWS,
            spec.ATTR_ROWS_PER_BLOCK,
            spec.ATTR_HEAP_CHUNK_BYTES,
            spec.ATTR_HEAP_NBYTES,
        )
    )
    if a.get(spec.ATTR_CHECKSUM) not in (spec.CHECKSUM, spec.CHECKSUM.encode()):
        raise bad(f"unknown checksum {a.get(spec.ATTR_CHECKSUM)!r}")
    if rpb < 1 or H < 1 or num_rows < 0 or heap_nbytes < 0:
        raise bad("negative or zero sizes in the attributes")
    row_dtype = schema_row_dtype(schema, bad)
    _check_limits(bad, row_dtype.itemsize, rpb, H, heap_nbytes, num_rows, file_size)
    return dict(
        version=version,
        schema=schema,
        user_attrs=user_attrs,
        num_rows=num_rows,
        rows_per_block=rpb,
        row_dtype=row_dtype,
        compression=compression,
        heap_chunk_bytes=H,
        heap_nbytes=heap_nbytes,
        writer=_text(a.get(spec.ATTR_WRITER, "")),
        stats=_stats(a, path, schema, num_rows),
    )


def _stats(a, path: str, schema: Schema, num_rows: int) -> dict | None:
    """The file's statistics attribute, checked (None: a file without one)."""
    text = a.get(spec.ATTR_STATS)
    if text is None:
        return None
    return stats_format.decode_stats(text, repr(path), schema.names, rows=num_rows)


def _check_limits(
    bad, row_size: int, rpb: int, H: int, heap_nbytes: int, num_rows: int, file_size: int
) -> None:
    """Sizes the reader allocates from, against the format's limits, before anything is read."""
    if rpb * row_size > spec.MAX_CHUNK_BYTES:
        raise bad(
            f"a block of {rpb} rows of {row_size} bytes ({rpb * row_size} bytes) exceeds the "
            f"format's limit of "
            f"{spec.MAX_CHUNK_BYTES} bytes per block"
        )
    if H > spec.MAX_CHUNK_BYTES:
        raise bad(f"heap_chunk_bytes {H} exceeds the format's limit of {spec.MAX_CHUNK_BYTES}")
    if num_rows > 0 and -(-num_rows // rpb) * spec.BLOCK_DTYPE.itemsize > file_size:
        raise bad(
            f"num_rows={num_rows} needs a block index larger than the file ({file_size} bytes)"
        )
    if heap_nbytes > 0 and -(-heap_nbytes // H) * spec.HEAP_CHUNK_DTYPE.itemsize > file_size:
        raise bad(
            f"heap_nbytes={heap_nbytes} needs a heap chunk index larger than the file ({file_size} "
            f"bytes)"
        )


def _json(attrs, name: str, default: str, bad) -> Any:
    try:
        return json.loads(_text(attrs.get(name, default)))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; nesting too deep
        raise bad(
            f"attribute {name!r} is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


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
    trimmed = (
        heap.chunks is not None and len(heap_chunks) == 1 and heap_nbytes <= heap.chunks[0] < H
    )
    if heap.shape != (heap_nbytes,) or (heap.chunks != (H,) and not trimmed):
        raise bad(
            f"heap shape {heap.shape}/chunks {heap.chunks} disagree with "
            f"heap_nbytes={heap_nbytes}, heap_chunk_bytes={H}"
        )
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
            raise CodecError(
                f"{path!r} uses codec {exc.codec!r}, which is not installed here: {exc}",
                codec=exc.codec,
                field=exc.field,
            ) from exc
        raise bad(f"invalid schema: {exc}") from exc
    except (RowstoreError, KeyError) as exc:
        raise bad(f"invalid schema: {exc}") from exc
