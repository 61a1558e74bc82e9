"""The only importer of the compiled kernels (``rowstore._io``, ``_gather``, ``_frame``,
``_shuffle``, ``_png``, ``_rows``; their error codes, :class:`KernelCode`, from
``rowstore._common``).

Each wrapper validates its arguments, calls one kernel (which releases the GIL) and turns its
return code into a :class:`~rowstore.errors.KernelError` with context (the ``KernelError``
family is declared in :mod:`rowstore.errors` and re-exported here). Arrays passed in are
owned by the caller; kernels never allocate them. The kernels check every bound they rely on
themselves (docs/kernels.md); the checks here are about meaning (exact shapes, contiguity) and
wording. Kernels sit just above the errors: compression is passed as Blosc2 codes (blosc2.h),
the names are the block compressions' (``rowstore.codecs.blocks``).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from rowstore import _frame, _gather, _io, _png, _rows, _shuffle, _stats  # type: ignore[attr-defined, unused-ignore]  # compiled from _ext/; no stubs
from rowstore._common import KernelCode
from rowstore.errors import KernelChecksumError, KernelError, KernelIOError

__all__ = [
    "crc32",
    "load_chunks",
    "decode_chunks",
    "decompress_frame",
    "gather_fixed",
    "gather_rows",
    "gather_heap",
    "pread_rows",
    "pread_heap",
    "pread_pages",
    "memcpyed_starts",
    "preadv_rows",
    "shuffle",
    "compress_frame",
    "png_decode_batch",
    "PNG_OK",
    "PNG_UNSUPPORTED",
    "PNG_CORRUPT",
    "PNG_NOMEM",
    "jpeg_decode_batch",
    "jpeg_decode_whole",
    "jpeg_simd",
    "JPEG_AVAILABLE",
    "JPEG_OK",
    "JPEG_CORRUPT",
    "JPEG_UNSUPPORTED",
    "JPEG_NOMEM",
    "JPEG_TOO_LARGE",
    "JPEG_SIZE",
    "JPEG_WHY",
    "JPEG_MAX_WORK_BYTES",
    "JPEG_MAX_CROP_BYTES",
    "audio_decode",
    "audio_header",
    "flac_encode",
    "AUDIO_AVAILABLE",
    "AUDIO_WHY",
    "AUDIO_OUT",
    "KernelCode",
    "KernelError",
    "KernelChecksumError",
    "KernelIOError",
    "RowKind",
    "RowPlan",
]

#: The per-row fast path of ``Writer.write`` (``_ext/_rows.pyx``): used as it is, without a
#: wrapper, since a wrapper would cost as much as the packing of a row. ``RowPlan`` checks its
#: descriptors itself; ``RowPlan.pack`` never raises for a value: it stores the row or declines
#: (returns -1, nothing kept) and the caller validates it in Python (``rowstore/writer/_pack.py``).
RowPlan = _rows.RowPlan
RowKind = _rows.RowKind
#: The writer's per-block statistics of a column (``_ext/_stats.pyx``): two passes, no GIL.
column_moments1 = _stats.moments1
column_moments2 = _stats.moments2
column_moments1_quick = _stats.moments1_quick
#: The payloads of a field, concatenated / counted by value (its str values), bounds-checked.
stats_gather = _stats.gather
stats_count_payloads = _stats.count_payloads

_MESSAGES = {
    KernelCode.E_IO: "read failed (errno {detail})",
    KernelCode.E_SHORT: "the file ends inside the stored chunk (truncated file?), {detail} bytes "
    "read",
    KernelCode.E_CHECKSUM: "stored bytes do not match their checksum (corrupt file)",
    KernelCode.E_FRAME: "invalid Blosc2 frame header (corrupt file)",
    KernelCode.E_DECOMPRESS: "decompression failed (code {detail}; corrupt file)",
    KernelCode.E_SIZE: "stored or decoded size {detail} is not the one expected (corrupt file)",
    KernelCode.E_BOUNDS: "a payload reference points outside its block's heap range (corrupt file)",
    KernelCode.E_ROW: "row index {detail} is outside the loaded rows",
    KernelCode.E_DEST: "destination buffer too small ({detail})",
    KernelCode.E_CODEC: (
        "the Blosc2 chunk header (byte {detail}) asks for other than the file's declared "
        "compression (corrupt or hostile file); refused before decompression"
    ),
    KernelCode.E_NOMEM: "out of memory",
}
_CODES = {int(c): c for c in KernelCode}


def _err() -> np.ndarray:
    """The ``err`` array a kernel fills on failure: code, index, detail."""
    return np.zeros(3, np.int64)


def _raise(err: np.ndarray, what: str, part: int | None = None) -> None:
    """Raise the error ``err`` records (``part``: which part of the call failed, kept on the
    exception as ``KernelError.part``)."""
    code, index, detail = (int(x) for x in err[:3])
    msg = _MESSAGES.get(code, "kernel error {code}").format(detail=detail, code=code)
    if code == KernelCode.E_IO and detail > 0:
        msg = f"read failed (errno {detail}: {os.strerror(detail)})"
    if code == KernelCode.E_NOMEM:
        raise MemoryError(f"{what}: {msg}")
    classes: dict[int, type[KernelError]] = {
        KernelCode.E_CHECKSUM: KernelChecksumError,
        KernelCode.E_IO: KernelIOError,
    }
    cls = classes.get(code, KernelError)
    exc = cls(f"{what}: {msg}", code=_CODES.get(code, code), index=index, detail=detail)
    exc.part = part
    raise exc


def _flat(out: np.ndarray, nbytes: int, what: str) -> np.ndarray:
    """``out`` as the flat uint8 view a kernel writes to, once it is writeable, C-contiguous and
    exactly ``nbytes`` long (the kernels check the size again; the exactness is checked here)."""
    if not out.flags.c_contiguous or not out.flags.writeable or out.nbytes != nbytes:
        raise ValueError(
            f"{what} must be writeable, C-contiguous, {nbytes} bytes; got {out.nbytes}"
        )
    return out.reshape(-1).view(np.uint8)


def _codec(codec: tuple[int, int] | None) -> tuple[int, int]:
    """(compcode, shuffle) as the kernels take them: compcode -1 for chunks stored raw."""
    if codec is None:
        return -1, 0
    compcode, shuffle = codec
    return int(compcode), int(shuffle)


def _fds(fds) -> np.ndarray:
    """Descriptors as the kernels take them: one ``int`` for every item, or an array of one per
    item."""
    return np.ascontiguousarray(np.atleast_1d(np.asarray(fds)), dtype=np.int32)


def _base(chunk_base) -> np.ndarray:
    return np.ascontiguousarray(np.atleast_1d(np.asarray(chunk_base)), dtype=np.int64)


def crc32(data) -> int:
    """CRC-32 (zlib's; equals ``zlib.crc32``) of a bytes-like object, without the GIL."""
    arr = (
        np.frombuffer(data, dtype=np.uint8)
        if not isinstance(data, np.ndarray)
        else data.reshape(-1).view(np.uint8)
    )
    return int(_frame.crc32(arr))


def load_chunks(
    fds,
    offsets,
    stored,
    checksums,
    *,
    codec: tuple[int, int] | None,
    verify: bool,
    dst: np.ndarray,
    raw_size: int,
    scratch: np.ndarray,
    what: str = "chunk",
    dst_stride: int = 0,
) -> None:
    """Read/verify/decompress chunks into ``dst`` (chunk i at ``i * dst_stride``; 0: ``raw_size``)
    from descriptor ``fds[i]`` (``fds``: one int for every chunk, or one per chunk).

    ``codec`` is None for chunks stored raw, else ``(compcode, shuffle)``: the Blosc2 compressor
    and shuffle filter codes (blosc2.h) the file declares. A chunk header that asks for anything
    else is refused before decompression (``KernelCode.E_CODEC``). Raises :class:`KernelError`
    whose ``index`` is the failing chunk's position in ``offsets``.
    """
    compcode, shuffle_ = _codec(codec)
    err = _err()
    if (
        _frame.load_chunks(
            _fds(fds),
            offsets,
            stored,
            checksums,
            compcode,
            shuffle_,
            verify,
            dst,
            raw_size,
            scratch,
            err,
            dst_stride,
        )
        != 0
    ):
        _raise(err, f"{what} {int(err[1])}")


def decode_chunks(
    src: np.ndarray,
    src_offsets: np.ndarray,
    stored: np.ndarray,
    checksums: np.ndarray,
    *,
    codec: tuple[int, int] | None,
    verify: bool,
    dst: np.ndarray,
    raw_size: int,
    what: str = "chunk",
    dst_stride: int = 0,
) -> None:
    """:func:`load_chunks` for chunks already in memory: chunk i is ``stored[i]`` bytes at
    ``src_offsets[i]`` of the flat ``uint8`` array ``src`` (bytes a remote store fetched), checked
    and decompressed into ``dst`` the same way, with the same bounds and codes."""
    compcode, shuffle_ = _codec(codec)
    err = _err()
    if (
        _frame.decode_chunks(
            src,
            src_offsets,
            stored,
            checksums,
            compcode,
            shuffle_,
            verify,
            dst,
            raw_size,
            err,
            dst_stride,
        )
        != 0
    ):
        _raise(err, f"{what} {int(err[1])}")


def decompress_frame(src: np.ndarray, dst: np.ndarray, *, codec: tuple[int, int]) -> None:
    """Decompress the single-chunk Blosc2 frame ``src`` into all of ``dst``; ``codec`` as in
    :func:`load_chunks` (not None)."""
    compcode, shuffle_ = _codec(codec)
    err = _err()
    if _frame.decompress_frame(src, dst, compcode, shuffle_, err) != 0:
        _raise(err, "blosc2 frame")


def gather_fixed(
    src: np.ndarray,
    row_size: int,
    field_offset: int,
    field_size: int,
    rows: np.ndarray,
    out: np.ndarray,
) -> None:
    """Gather ``field_size`` bytes at ``field_offset`` of each row ``rows[i]`` of ``src`` into
    the C-contiguous array ``out`` (whose bytes must be exactly ``len(rows) * field_size``)."""
    flat = _flat(out, len(rows) * field_size, "gather_fixed: out")
    err = _err()
    if _gather.gather_fixed(src, row_size, field_offset, field_size, rows, flat, err) != 0:
        _raise(err, f"row {int(err[1])}")


def _flat_bytes(out: np.ndarray, what: str) -> np.ndarray:
    """``out`` as a flat uint8 view of its own memory; a non-contiguous array would reshape
    into a copy (filled, then lost), so it is refused."""
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what}: out must be a writeable C-contiguous array")
    return out.reshape(-1).view(np.uint8)


def gather_heap(
    src: np.ndarray,
    row_size: int,
    ref_offset: int,
    rows: np.ndarray,
    rows_per_slot: int,
    slot_lo: np.ndarray,
    slot_hi: np.ndarray,
    slot_base: np.ndarray,
    heap: np.ndarray,
    out: np.ndarray,
    dst_offsets: np.ndarray,
    pad_stride: int = 0,
) -> None:
    """Copy each row's heap payload into ``out`` (a flat uint8 view) at ``dst_offsets[i]``;
    see ``_gather.gather_heap`` for the bounds it checks."""
    err = _err()
    flat = _flat_bytes(out, "gather_heap")
    if (
        _gather.gather_heap(
            src,
            row_size,
            ref_offset,
            rows,
            rows_per_slot,
            slot_lo,
            slot_hi,
            slot_base,
            heap,
            flat,
            dst_offsets,
            pad_stride,
            err,
        )
        != 0
    ):
        _raise(err, f"row {int(err[1])}")


def memcpyed_starts(
    fds, offsets, stored, *, codec: tuple[int, int], raw_size: int, what: str = "chunk"
) -> np.ndarray:
    """The file offset (int64) of each stored Blosc2 frame's raw bytes where its chunk is
    memcpy'd (-1 where it is compressed), its headers checked as :func:`load_chunks` checks
    them: a memcpy'd chunk's bytes can be read in place, like an uncompressed one's."""
    compcode, shuffle_ = _codec(codec)
    out = np.empty(len(offsets), np.int64)
    err = _err()
    if (
        _frame.memcpyed_starts(
            _fds(fds),
            np.ascontiguousarray(offsets, np.int64),
            np.ascontiguousarray(stored, np.int64),
            compcode,
            shuffle_,
            raw_size,
            out,
            err,
        )
        != 0
    ):
        _raise(err, f"{what} {int(err[1])}")
    return out


def pread_rows(fds, file_offsets: np.ndarray, row_size: int, dst: np.ndarray) -> None:
    """Read rows straight from the files (uncompressed files): row i, from descriptor ``fds[i]``
    (``fds``: one int for all rows, or one per row), to ``dst[i*row_size:]``."""
    err = _err()
    if _io.pread_rows(_fds(fds), file_offsets, row_size, dst, err) != 0:
        _raise(err, f"row read {int(err[1])}")


def pread_pages(
    fds,
    chunk_offsets: np.ndarray,
    chunk_bytes: np.ndarray,
    within: np.ndarray,
    take: np.ndarray,
    page_first: np.ndarray,
    pages: tuple,
    out: np.ndarray,
    dst_offsets: np.ndarray,
) -> None:
    """Read range i, bytes ``[within[i], within[i] + take[i])`` of the uncompressed chunk of
    ``chunk_bytes[i]`` raw bytes at ``chunk_offsets[i]`` (descriptor ``fds``: one for all, or
    one per range), into ``out`` at ``dst_offsets[i]``, checked in the read's pass by the
    chunk's pages, which start at ``page_first[i]`` of the page index. ``pages``: ``(page_len,
    crcs, checked, scratch)``, the CRC-32s (uint32) and flags (bool, set as pages are checked)
    of the page index and a scratch of two pages (see ``pread_heap``)."""
    err = _err()
    page_len, crcs, checked, scratch = pages
    i64 = lambda a: np.ascontiguousarray(a, np.int64)  # noqa: E731
    if (
        _io.pread_pages(
            _fds(fds),
            i64(chunk_offsets),
            i64(chunk_bytes),
            i64(within),
            i64(take),
            i64(page_first),
            page_len,
            crcs,
            checked.view(np.uint8),
            crc_shift_table(page_len),
            scratch,
            _flat_bytes(out, "pread_pages"),
            i64(dst_offsets),
            err,
        )
        != 0
    ):
        _raise(err, f"range {int(err[1])}")


def pread_heap(
    fds,
    src: np.ndarray,
    row_size: int,
    ref_offsets,
    rows: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    chunk_offsets: np.ndarray,
    chunk_bytes: int,
    outs,
    dst_offsets,
    pad_stride: int = 0,
    chunk_base=0,
    pages: tuple | None = None,
) -> None:
    """Read the heap payloads of each row ``rows[i]`` of ``src`` straight from the file
    (uncompressed heaps): field j's (its reference at byte ``ref_offsets[j]`` of a row) into
    ``outs[j]`` at ``dst_offsets[j][i]``; ``[lo[i], hi[i])`` bounds the references. Payloads
    that follow each other in the file (a row's fields, neighbouring rows) are read in one
    ``preadv``. ``fds`` and ``chunk_base`` (where row i's file's heap chunks start in
    ``chunk_offsets``) are one value for all rows, or one per row. ``pages``: ``(page_len,
    crcs, checked, scratch)``, the heap pages' CRC-32s (uint32) and flags (bool, set as pages
    are checked): payloads on pages not yet checked are read into place with the rest of their
    first and last pages (into ``scratch``, two pages) and their pages checked in that pass. A
    failure raises :class:`KernelError` with ``index`` the row's position and ``part`` the
    field's."""
    err = np.zeros(4, np.int64)
    flats = tuple(_flat_bytes(o, "pread_heap") for o in outs)
    dsts = tuple(np.ascontiguousarray(d, np.int64) for d in dst_offsets)
    page_len, crcs, checked, scratch = pages if pages is not None else (0, None, None, None)
    shift = None
    if checked is not None:
        checked = checked.view(np.uint8)
        shift = crc_shift_table(page_len)
    if (
        _io.pread_heap(
            _fds(fds),
            src,
            row_size,
            np.ascontiguousarray(ref_offsets, np.int64).reshape(-1),
            rows,
            lo,
            hi,
            chunk_offsets,
            _base(chunk_base),
            chunk_bytes,
            flats,
            dsts,
            pad_stride,
            err,
            page_len,
            crcs,
            checked,
            scratch,
            shift,
        )
        != 0
    ):
        _raise(err, f"field {int(err[3])}: row {int(err[1])}", part=int(err[3]))


def shuffle(a: np.ndarray, seed: int) -> None:
    """Shuffle the int64 array ``a`` in place (Fisher-Yates on SplitMix64; GIL released)."""
    if a.dtype != np.int64 or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("shuffle: a must be a writeable C-contiguous int64 array")
    _shuffle.shuffle(a, np.uint64(seed))


def fill_runs(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """int64 array of ``counts.sum()`` values: ``counts[i]`` consecutive values from
    ``starts[i]`` for each i, back to back (one allocation, no temporaries: an epoch window's
    row positions are built from these)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    out = np.empty(int(counts.sum()), np.int64)
    _shuffle.fill_runs(starts, counts, out)
    return out


def gather_rows(
    src: np.ndarray, row_size: int, rows: np.ndarray, fields: list[tuple[int, int, np.ndarray]]
) -> None:
    """Gather several fields of each row in one pass: for each ``(offset, size, out)``, the
    ``size`` bytes at ``offset`` of row ``rows[i]`` go to row i of ``out`` (C-contiguous,
    exactly ``len(rows) * size`` bytes)."""
    n = len(rows)
    offs = np.array([f[0] for f in fields], np.int64)
    sizes = np.array([f[1] for f in fields], np.int64)
    outs = [
        _flat(out, n * size, f"gather_rows: out {j}") for j, (_off, size, out) in enumerate(fields)
    ]
    err = _err()
    if _gather.gather_rows(src, row_size, rows, offs, sizes, outs, err) != 0:
        _raise(err, f"row {int(err[1])}")


def preadv_rows(
    fds,
    file_offsets: np.ndarray,
    row_size: int,
    segments: list[tuple[int, np.ndarray | None]],
    sink: np.ndarray,
    *,
    check: np.ndarray | None = None,
    expect: np.ndarray | None = None,
    order: np.ndarray | None = None,
) -> None:
    """Read rows from the files straight into per-field arrays (one ``preadv`` per row; row i
    from descriptor ``fds[i]``, or ``fds`` for all rows when it is one int).

    ``segments`` cut the row into consecutive ``(size, out)`` pieces covering it exactly; row
    i's piece goes to row i of ``out`` (C-contiguous, ``len(file_offsets) * size`` bytes), or
    into ``sink`` (at least ``row_size`` bytes) when ``out`` is None. ``check`` (bool per row)
    and ``expect`` (uint32 per row): the CRC-32 of each checked row's bytes, computed right
    after they were read, must be its ``expect`` (else a :class:`KernelChecksumError`).
    ``order`` (a permutation of the rows, e.g. ``argsort(file_offsets)``): read the rows in
    that order, rows consecutive in it and in one file in one ``preadv`` (their slots in
    ``out`` unchanged).
    """
    n = len(file_offsets)
    sizes = np.array([s[0] for s in segments], np.int64)
    outs = [
        None if out is None else _flat(out, n * size, f"preadv_rows: out {j}")
        for j, (size, out) in enumerate(segments)
    ]
    err = _err()
    if check is not None:
        check = np.ascontiguousarray(check, np.uint8)
        expect = np.ascontiguousarray(expect, np.uint32)
    if (
        _io.preadv_rows(
            _fds(fds), file_offsets, row_size, sizes, outs, sink, err, check, expect, order
        )
        != 0
    ):
        _raise(err, f"row read {int(err[1])}")


@functools.lru_cache(maxsize=8)
def crc_shift_table(nbytes: int) -> np.ndarray:
    """The table (uint32[1024], read-only) that moves a CRC-32 past ``nbytes`` more bytes:
    ``crc32(a + b) == t(crc32(a)) ^ crc32(b)`` for ``len(b) == nbytes``, where ``t(c)`` XORs
    ``table[256 * j + (c >> 8 * j & 255)]`` over j in 0..3: how the page checks combine the
    CRCs of a run of pages to check the run in one pass."""
    out = np.empty(1024, np.uint32)
    _io.crc_shift_table(int(nbytes), out)
    out.flags.writeable = False
    return out


def page_crcs(data, page_len: int) -> np.ndarray:
    """The CRC-32 (uint32) of each ``page_len``-byte page of a bytes-like object, the last one
    shorter: a chunk's entries in the page index."""
    arr = (
        np.frombuffer(data, dtype=np.uint8)
        if not isinstance(data, np.ndarray)
        else data.reshape(-1).view(np.uint8)
    )
    out = np.empty(-(-len(arr) // page_len), np.uint32)
    _io.page_crcs(arr, page_len, out)
    return out


def check_ranges(
    fds,
    offsets: np.ndarray,
    sizes: np.ndarray,
    page_len: int,
    expect: np.ndarray,
    scratch: np.ndarray,
) -> None:
    """Read each range (``sizes[i]`` bytes at ``offsets[i]`` of ``fds[i]``, or of ``fds`` for
    all: consecutive pages of one chunk) into ``scratch`` and check the CRC-32 of each of its
    ``page_len``-byte pages (the last one the rest) against the next entry of ``expect``
    (uint32); raises :class:`KernelError` (:class:`KernelChecksumError` on a mismatch), whose
    ``index`` is the range (read errors) or the page in ``expect`` (checksums)."""
    err = _err()
    if (
        _io.check_ranges(
            _fds(fds),
            np.ascontiguousarray(offsets, np.int64),
            np.ascontiguousarray(sizes, np.int64),
            page_len,
            np.ascontiguousarray(expect, np.uint32),
            scratch,
            err,
        )
        != 0
    ):
        _raise(err, f"page {int(err[1])}")


def check_buffer(
    buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, expect: np.ndarray
) -> None:
    """Check the CRC-32 of each range ``buf[starts[i]:starts[i] + sizes[i]]`` (a flat uint8
    array) against ``expect[i]``; raises :class:`KernelError` whose ``index`` is i."""
    err = _err()
    if (
        _io.check_buffer(
            buf,
            np.ascontiguousarray(starts, np.int64),
            np.ascontiguousarray(sizes, np.int64),
            np.ascontiguousarray(expect, np.uint32),
            err,
        )
        != 0
    ):
        _raise(err, f"page {int(err[1])}")


def compress_frame(raw, *, compcode: int, clevel: int, shuffle: int, typesize: int) -> np.ndarray:
    """``raw`` (bytes-like) as a single-chunk Blosc2 frame, without the GIL; returns a view of a
    new array holding exactly the frame. ``compcode`` and ``shuffle`` are the Blosc2 compressor
    and shuffle filter codes (blosc2.h; the format's names for them are in
    ``rowstore.format.spec``), ``clevel`` 0..9, ``typesize`` 1..255."""
    src = np.frombuffer(raw, np.uint8)
    dst = np.empty(len(src) + 65536, np.uint8)  # frame header, chunk header and index fit easily
    err = _err()
    n = _frame.compress_frame(src, dst, compcode, clevel, shuffle, typesize, err)
    if n < 0:
        _raise(err, "blosc2 compression")
    return dst[:n]


#: ``png_decode_batch`` status codes, one per image: decoded (or null); a PNG of a kind the
#: kernel leaves to the reference decoder; bytes that are not a PNG of the expected size;
#: no memory for the kernel's scratch buffers. Every code but PNG_OK means "not decoded".
PNG_OK, PNG_UNSUPPORTED, PNG_CORRUPT, PNG_NOMEM = (
    _png.PNG_OK,
    _png.PNG_UNSUPPORTED,
    _png.PNG_CORRUPT,
    _png.PNG_NOMEM,
)


def png_decode_batch(
    data: np.ndarray,
    offsets: np.ndarray,
    nulls: np.ndarray | None,
    out: np.ndarray,
    lo: int,
    hi: int,
    status: np.ndarray,
    *,
    scale16: bool = False,
) -> int:
    """Decode PNG images ``lo..hi`` of a batch into ``out`` (``(n, H, W[, C])`` uint8 or
    uint16, C-contiguous): image i is ``data[offsets[i]:offsets[i + 1]]``, converted to
    ``out``'s channels as PIL's ``convert("L")``/``("RGB")`` does (a 16-bit image into uint8
    by its high bytes only with ``scale16``: the png codec's ``depth="scale"``); null images
    (``nulls``) are skipped; the GIL is released for the whole range. ``status[i]`` gets one of
    the ``PNG_*`` codes; returns the number of images left undecoded (their slots unspecified),
    which the caller decodes with the reference decoder. Several threads may decode disjoint
    ranges of one batch at once."""
    if out.dtype not in (np.uint8, np.uint16) or out.ndim not in (3, 4):
        raise ValueError(
            f"png_decode_batch: out must be (n, H, W[, C]) uint8 or uint16, got {out.dtype} "
            f"{out.shape}"
        )
    flat = _flat_bytes(out, "png_decode_batch")
    h, w = out.shape[1], out.shape[2]
    c = out.shape[3] if out.ndim == 4 else 1
    nul = None if nulls is None else nulls.view(np.uint8)
    return int(
        _png.png_decode_batch(
            data, offsets, nul, flat, h, w, c, 8 * out.dtype.itemsize, lo, hi, status, scale16
        )
    )


#: ``jpeg_decode_batch`` / ``jpeg_decode_whole`` status codes, one per image: decoded (or
#: null); damaged bytes (a libjpeg error or warning: corrupt data is refused, never concealed);
#: a JPEG the kernel does not decode (12-bit, arithmetic-coded, components libjpeg cannot
#: name); no memory for the scratch buffers; too large (the decoded crop over
#: ``max_bytes``, or libjpeg's memory over ``max_work``); another size than the output's
#: (``jpeg_decode_whole``). Every code but JPEG_OK means "not decoded". JPEG_AVAILABLE is
#: False where the kernel was not built (no ``jpeglib.h``): the reader then decodes with
#: imagecodecs (:func:`rowstore.reader.image_ops.decode_reference`, the ``jpeg`` codec).
try:
    from rowstore import _jpeg  # type: ignore[attr-defined, unused-ignore]
except ImportError:  # built without libjpeg-turbo's headers
    _jpeg = None
JPEG_AVAILABLE = _jpeg is not None
JPEG_OK, JPEG_CORRUPT, JPEG_UNSUPPORTED, JPEG_NOMEM, JPEG_TOO_LARGE, JPEG_SIZE = range(6)
JPEG_INFO = 8
#: What each status but JPEG_OK means, for error messages.
JPEG_WHY = {
    JPEG_CORRUPT: "libjpeg reports damaged or truncated data",
    JPEG_UNSUPPORTED: "a JPEG of a kind rowstore does not decode (12-bit, arithmetic-coded, or "
    "components of no known colour space)",
    JPEG_NOMEM: "no memory to decode it",
    JPEG_TOO_LARGE: "its header declares an image too large to decode within the memory bound",
    JPEG_SIZE: "its frame header (SOF) gives another size than the one expected",
}
#: The most bytes libjpeg may allocate to decode one image (``max_work``): a progressive or
#: multi-scan JPEG keeps all its DCT coefficients (2 bytes each, a 4:2:0 colour image 3 bytes
#: per pixel), so 256 MiB admits such images up to 89.5 million pixels (4:2:0; 44.7 million
#: at 4:4:4, 134 million grey), PIL's ``MAX_IMAGE_PIXELS``; single-scan images need a few
#: rows.
JPEG_MAX_WORK_BYTES = 1 << 28
#: The most bytes of decoded (DCT-scaled) crop one image may take in ``jpeg_decode_batch``.
JPEG_MAX_CROP_BYTES = 1 << 30
_JPEG_MODES = {"resize": 0, "center": 1, "random_resized": 2}


def _jpeg_out(out: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    if _jpeg is None:
        raise RuntimeError("rowstore was built without libjpeg-turbo: no JPEG kernel")
    if out.dtype != np.uint8 or out.ndim not in (3, 4) or (out.ndim == 4 and out.shape[3] != 3):
        raise ValueError(
            f"{what}: out must be (n, H, W) or (n, H, W, 3) uint8, got {out.dtype} {out.shape}"
        )
    return _flat_bytes(out, what), 3 if out.ndim == 4 else 1


def jpeg_decode_batch(
    data: np.ndarray,
    offsets: np.ndarray,
    nulls: np.ndarray | None,
    rows: np.ndarray,
    base: int,
    out: np.ndarray,
    lo: int,
    hi: int,
    status: np.ndarray,
    *,
    mode: str,
    scale: tuple[float, float] = (1.0, 1.0),
    log_ratio: tuple[float, float] = (0.0, 0.0),
    fraction: float = 1.0,
    flip: float = 0.0,
    info: np.ndarray | None = None,
    max_bytes: int = JPEG_MAX_CROP_BYTES,
    max_work: int = JPEG_MAX_WORK_BYTES,
    dct_scaling: bool = True,
) -> int:
    """Decode JPEG images ``lo..hi`` of a batch with a crop, a DCT scale and a resize to
    ``out``'s size (``(n, H, W)`` or ``(n, H, W, 3)`` uint8, C-contiguous): image i is
    ``data[offsets[i]:offsets[i + 1]]``, its crop and flip drawn from
    ``image_ops.row_key(base, rows[i])``; null images (``nulls``) are zeroed.

    ``mode``: ``"resize"`` (the whole image), ``"center"`` (torchvision's
    ``Resize(round(min(H, W) / fraction))`` + ``CenterCrop((H, W))``, as one box) or
    ``"random_resized"`` (torchvision's RandomResizedCrop: an area ``scale`` of the image, the
    log aspect ratio uniform in ``log_ratio``); ``flip``: the probability of a left-right
    mirror. ``max_bytes`` bounds the decoded crop and ``max_work`` libjpeg's memory, per
    image. The GIL is released for the whole range; several threads may decode disjoint
    ranges of one batch at once. Any JPEG
    (grey, YCbCr, RGB, CMYK, YCCK) decodes to ``out``'s channels as PIL's
    ``convert("L")``/``("RGB")`` does. ``status[i]`` gets a ``JPEG_*`` code; ``info``
    (``n x JPEG_INFO`` float64, optional) gets, per image, its height and width, the crop
    ``(y0, x0, h, w)`` in source pixels (fractional for CenterCrop's box), the flip and the DCT
    scale denominator. ``dct_scaling=False`` decodes every crop at full scale (no 1/2, 1/4,
    1/8 DCT scaling: slower, PIL's pixels within a level). Returns the number of images not
    decoded (their slots unspecified)."""
    flat, c = _jpeg_out(out, "jpeg_decode_batch")
    if mode not in _JPEG_MODES:
        raise ValueError(f"jpeg_decode_batch: mode must be one of {sorted(_JPEG_MODES)}")
    nul = None if nulls is None else nulls.view(np.uint8)
    return int(
        _jpeg.jpeg_decode_batch(
            data,
            offsets,
            nul,
            np.ascontiguousarray(rows, np.int64),
            np.uint64(base),
            flat,
            out.shape[1],
            out.shape[2],
            c,
            _JPEG_MODES[mode],
            float(scale[0]),
            float(scale[1]),
            float(log_ratio[0]),
            float(log_ratio[1]),
            float(fraction),
            float(flip),
            max_bytes,
            max_work,
            lo,
            hi,
            status,
            info,
            8 if dct_scaling else 1,
        )
    )


def jpeg_simd(enabled: bool | None = None) -> bool:
    """Whether ``jpeg_decode_batch`` resizes with its AVX2 code (where the CPU has it).
    ``enabled=False`` forces the plain C code (process-wide; for tests and A/B benchmarks),
    ``True`` gives the choice back to the CPU; both compute the same integers. False without
    the kernel."""
    if _jpeg is None:
        return False
    return bool(_jpeg.jpeg_simd(enabled))


def jpeg_decode_whole(
    data: np.ndarray,
    offsets: np.ndarray,
    nulls: np.ndarray | None,
    out: np.ndarray,
    lo: int,
    hi: int,
    status: np.ndarray,
    *,
    max_work: int = JPEG_MAX_WORK_BYTES,
) -> int:
    """Decode JPEG images ``lo..hi`` of a batch whole into ``out`` (``(n, H, W)`` grey or
    ``(n, H, W, 3)`` colour uint8, C-contiguous): image i is ``data[offsets[i]:offsets[i +
    1]]`` and must be an ``H x W`` JPEG (else ``JPEG_SIZE``), of any colour space, converted to
    ``out``'s channels as PIL's ``convert("L")``/``("RGB")`` does; null images (``nulls``) are
    skipped. Every image is read to its end marker and a libjpeg warning is a refusal
    (``JPEG_CORRUPT``), so damaged bytes never come back as concealed pixels; ``max_work``
    bounds libjpeg's memory per image. The GIL is released for the whole range; threads may
    decode disjoint ranges at once. ``status[i]``
    gets a ``JPEG_*`` code; returns the number of images not decoded (their slots partly
    written)."""
    flat, c = _jpeg_out(out, "jpeg_decode_whole")
    nul = None if nulls is None else nulls.view(np.uint8)
    return int(
        _jpeg.jpeg_decode_whole(
            data, offsets, nul, flat, out.shape[1], out.shape[2], c, max_work, lo, hi, status
        )
    )


#: ``audio_decode`` status codes, one per value (``_ext/_audio.pyx``): decoded (or null); not
#: FLAC/WAV or damaged (a bad header, a libFLAC error: never concealed); a kind the codecs do not
#: read (compressed WAV, 64-bit float, float samples into an integer output); no memory for
#: libFLAC's decoder; another frame count or channel count than the stored shape's; audio that
#: ends before the frames its header declares; a window that starts past the value's end.
#: AUDIO_AVAILABLE is False where the kernel was not built (no ``FLAC/stream_decoder.h``): the
#: audio codecs then decode with soundfile (``rowstore.codecs.audio``).
try:
    from rowstore import _audio  # type: ignore[attr-defined, unused-ignore]
except ImportError:  # built without libFLAC's headers
    _audio = None
AUDIO_AVAILABLE = _audio is not None
(
    AUDIO_OK,
    AUDIO_CORRUPT,
    AUDIO_UNSUPPORTED,
    AUDIO_NOMEM,
    AUDIO_SIZE,
    AUDIO_TRUNCATED,
    AUDIO_RANGE,
) = range(7)
AUDIO_INFO = 5
#: What each status but AUDIO_OK means, for error messages.
AUDIO_WHY = {
    AUDIO_CORRUPT: "not FLAC/WAV audio, or damaged (a bad header, or libFLAC reports damaged data)",
    AUDIO_UNSUPPORTED: "audio of a kind rowstore does not decode (compressed or 64-bit WAV, an "
    "unknown length, or float samples into an integer array)",
    AUDIO_NOMEM: "no memory to decode it",
    AUDIO_SIZE: "its header gives other frames or channels than the stored shape",
    AUDIO_TRUNCATED: "the audio ends before the frames its header declares (truncated)",
    AUDIO_RANGE: "the window starts past the end of the audio",
}
#: Output sample types of ``audio_decode``.
AUDIO_OUT = {np.dtype(np.float32): 0, np.dtype(np.int16): 1, np.dtype(np.int32): 2}


def _need_audio() -> None:
    if _audio is None:
        raise RuntimeError("rowstore was built without libFLAC: no audio kernel")


def audio_header(data) -> tuple[int, ...]:
    """``(status, format, rate, channels, bits, is_float, frames, data_offset)`` of one FLAC or
    WAV value's header as the kernel parses it (format 1 FLAC, 2 WAV; status ``AUDIO_*``)."""
    _need_audio()
    arr = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    return tuple(int(v) for v in _audio.audio_header(np.ascontiguousarray(arr, np.uint8)))


def audio_decode(
    data: np.ndarray,
    offsets: np.ndarray,
    nulls: np.ndarray | None,
    starts: np.ndarray,
    counts: np.ndarray,
    expect: np.ndarray | None,
    channels: np.ndarray,
    out_offsets: np.ndarray,
    out: np.ndarray,
    *,
    mono: bool,
    lo: int,
    hi: int,
    status: np.ndarray,
    info: np.ndarray | None = None,
) -> int:
    """Decode FLAC/WAV values ``lo..hi`` of a batch into ``out`` (float32, int16 or int32,
    writeable and C-contiguous: the whole batch): value i is ``data[offsets[i]:offsets[i +
    1]]``, of ``channels[i]`` channels (and exactly ``expect[i]`` frames where ``expect`` is
    given and ``expect[i] >= 0``); its frames ``starts[i] .. starts[i] + counts[i]`` (zeros past
    its end) go to ``out.reshape(-1)[out_offsets[i]:]``, interleaved, mixed down to one channel
    with ``mono``. FLAC seeks to the window (only the frames it covers are decoded). The GIL is
    released for the whole range. ``status[i]`` gets an ``AUDIO_*`` code, ``info`` (``n x
    AUDIO_INFO`` int64, optional) the header's rate, channels, bits, frames and format. Returns
    the number of values not decoded."""
    _need_audio()
    otype = AUDIO_OUT.get(out.dtype)
    if otype is None:
        raise ValueError(f"audio_decode: out must be float32, int16 or int32, got {out.dtype}")
    flat = _flat(out, out.nbytes, "audio_decode's out")
    nul = None if nulls is None else nulls.view(np.uint8)
    return int(
        _audio.audio_decode(
            data,
            offsets,
            nul,
            starts,
            counts,
            expect,
            channels,
            out_offsets,
            flat,
            otype,
            bool(mono),
            lo,
            hi,
            status,
            info,
        )
    )


def flac_encode(samples: np.ndarray, bits: int, rate: int, level: int) -> bytes:
    """``samples`` (``frames x channels`` int32 of ``bits`` bits each) encoded as a FLAC stream
    at ``rate`` Hz by libFLAC at compression ``level`` (0-8), without the GIL. Raises
    ``ValueError`` when libFLAC refuses them."""
    _need_audio()
    x = np.ascontiguousarray(samples, np.int32)
    if x.ndim != 2:
        raise ValueError(f"flac_encode: samples must be frames x channels, got {x.shape}")
    frames, channels = x.shape
    out = np.empty(frames * channels * 4 + (1 << 16), np.uint8)
    n = _audio.flac_encode(x.reshape(-1), frames, channels, bits, rate, level, out)
    if n == -2:
        raise MemoryError("flac_encode: no memory for libFLAC's encoder")
    if n < 0:
        raise ValueError(f"flac_encode: libFLAC did not encode the samples (code {n})")
    return out[:n].tobytes()
