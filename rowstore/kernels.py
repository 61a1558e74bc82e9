"""The only importer of the compiled kernels (``rowstore._blocks``).

Each wrapper validates its arguments, calls one kernel (which releases the GIL) and turns its
return code into a :class:`~rowstore.errors.FormatError` with context. Arrays passed in are
owned by the caller; kernels never allocate them.
"""

from __future__ import annotations

import numpy as np

from rowstore import _blocks  # type: ignore[attr-defined]  # compiled from _ext/_blocks.pyx; no stubs
from rowstore.errors import ChecksumError, FormatError

__all__ = [
    "crc32", "load_chunks", "decompress_frame", "gather_fixed", "gather_rows", "gather_heap", "pread_rows",
    "pread_heap", "preadv_rows", "shuffle", "compress_frame",
    "KernelError",
]

E_OK, E_IO, E_SHORT, E_CHECKSUM, E_FRAME, E_DECOMPRESS, E_SIZE, E_BOUNDS, E_ROW, E_DEST = range(10)

_MESSAGES = {
    E_IO: "read failed (errno {detail})",
    E_SHORT: "the file ends inside the stored chunk (truncated file?), {detail} bytes read",
    E_CHECKSUM: "stored bytes do not match their checksum (corrupt file)",
    E_FRAME: "invalid Blosc2 frame header (corrupt file)",
    E_DECOMPRESS: "decompression failed (code {detail}; corrupt file)",
    E_SIZE: "stored or decoded size {detail} is not the one expected (corrupt file)",
    E_BOUNDS: "a payload reference points outside its block's heap range (corrupt file)",
    E_ROW: "row index {detail} is outside the loaded rows",
    E_DEST: "destination buffer too small ({detail})",
}


class KernelError(FormatError):
    """A kernel reported an error; ``code`` and ``index`` tell which and where."""

    def __init__(self, message: str, *, code: int, index: int, detail: int, path=None, block=None):
        super().__init__(message, path=path, block=block)
        self.code = code
        self.index = index
        self.detail = detail


class KernelChecksumError(KernelError, ChecksumError):
    pass


def _raise(err: np.ndarray, what: str) -> None:
    code, index, detail = (int(x) for x in err[:3])
    msg = _MESSAGES.get(code, "kernel error {code}").format(detail=detail, code=code)
    cls = KernelChecksumError if code == E_CHECKSUM else KernelError
    raise cls(f"{what}: {msg}", code=code, index=index, detail=detail)


def crc32(data) -> int:
    """CRC-32 (zlib's; equals ``zlib.crc32``) of a bytes-like object, without the GIL."""
    arr = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    return int(_blocks.crc32(arr))


def load_chunks(fd: int, offsets, stored, checksums, *, codec: tuple[int, int] | None = None, verify: bool,
                dst: np.ndarray, raw_size: int, scratch: np.ndarray, what: str = "chunk",
                compressed: bool | None = None) -> None:
    """Read/verify/decompress chunks into ``dst`` (chunk i at ``i * raw_size``).

    Raises :class:`KernelError` whose ``index`` is the failing chunk's position in ``offsets``.
    """
    if compressed is None:
        compressed = codec is not None
    err = np.zeros(3, np.int64)
    rc = _blocks.load_chunks(fd, offsets, stored, checksums, int(compressed), int(verify), dst, raw_size, scratch, err)
    if rc != 0:
        _raise(err, f"{what} {int(err[1])}")


def decompress_frame(src: np.ndarray, dst: np.ndarray) -> None:
    err = np.zeros(3, np.int64)
    if _blocks.decompress_frame(src, dst, err) != 0:
        _raise(err, "blosc2 frame")


def gather_fixed(src: np.ndarray, row_size: int, field_offset: int, field_size: int,
                 rows: np.ndarray, out: np.ndarray) -> None:
    """Gather ``field_size`` bytes at ``field_offset`` of each row ``rows[i]`` of ``src`` into
    the C-contiguous array ``out`` (whose bytes must be exactly ``len(rows) * field_size``)."""
    if not out.flags.c_contiguous or out.nbytes != len(rows) * field_size:
        raise ValueError(f"gather_fixed: out must be C-contiguous with {len(rows) * field_size} bytes, got {out.nbytes}")
    err = np.zeros(3, np.int64)
    if _blocks.gather_fixed(src, row_size, field_offset, field_size, rows, out.reshape(-1).view(np.uint8), err) != 0:
        _raise(err, f"row {int(err[1])}")


def gather_heap(src: np.ndarray, row_size: int, ref_offset: int, rows: np.ndarray, rows_per_slot: int,
                slot_lo: np.ndarray, slot_hi: np.ndarray, slot_base: np.ndarray, heap: np.ndarray,
                out: np.ndarray, dst_offsets: np.ndarray, pad_stride: int = 0) -> None:
    """Copy each row's heap payload into ``out`` (a flat uint8 view) at ``dst_offsets[i]``;
    see ``_blocks.gather_heap`` for the bounds it checks."""
    err = np.zeros(3, np.int64)
    flat = out.reshape(-1).view(np.uint8)
    if _blocks.gather_heap(src, row_size, ref_offset, rows, rows_per_slot, slot_lo, slot_hi, slot_base,
                           heap, flat, dst_offsets, pad_stride, err) != 0:
        _raise(err, f"row {int(err[1])}")


def pread_rows(fd: int, file_offsets: np.ndarray, row_size: int, dst: np.ndarray) -> None:
    """Read rows straight from the file (uncompressed files): row i to ``dst[i*row_size:]``."""
    err = np.zeros(3, np.int64)
    if _blocks.pread_rows(fd, file_offsets, row_size, dst, err) != 0:
        _raise(err, f"row read {int(err[1])}")


def pread_heap(fd: int, src: np.ndarray, row_size: int, ref_offset: int, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               chunk_offsets: np.ndarray, chunk_bytes: int, out: np.ndarray, dst_offsets: np.ndarray,
               pad_stride: int = 0) -> None:
    """Read the heap payload of each row ``rows[i]`` of ``src`` straight from the file into
    ``out`` at ``dst_offsets[i]`` (uncompressed heaps); ``[lo[i], hi[i])`` bounds the reference."""
    err = np.zeros(3, np.int64)
    flat = out.reshape(-1).view(np.uint8)
    if _blocks.pread_heap(fd, src, row_size, ref_offset, rows, lo, hi, chunk_offsets, chunk_bytes, flat,
                          dst_offsets, pad_stride, err) != 0:
        _raise(err, f"row {int(err[1])}")


def shuffle(a: np.ndarray, seed: int) -> None:
    """Shuffle the int64 array ``a`` in place (Fisher-Yates on SplitMix64; GIL released)."""
    if a.dtype != np.int64 or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("shuffle: a must be a writeable C-contiguous int64 array")
    _blocks.shuffle(a, np.uint64(seed))


def gather_rows(src: np.ndarray, row_size: int, rows: np.ndarray, fields: list[tuple[int, int, np.ndarray]]) -> None:
    """Gather several fields of each row in one pass: for each ``(offset, size, out)``, the
    ``size`` bytes at ``offset`` of row ``rows[i]`` go to row i of ``out`` (C-contiguous,
    exactly ``len(rows) * size`` bytes)."""
    n = len(rows)
    offs = np.empty(len(fields), np.int64)
    sizes = np.empty(len(fields), np.int64)
    addrs = np.empty(len(fields), np.uint64)
    for j, (off, size, out) in enumerate(fields):
        if not out.flags.c_contiguous or not out.flags.writeable or out.nbytes != n * size:
            raise ValueError(f"gather_rows: out {j} must be writeable, C-contiguous, {n * size} bytes; got {out.nbytes}")
        offs[j], sizes[j], addrs[j] = off, size, out.ctypes.data
    err = np.zeros(3, np.int64)
    # `fields` holds references to every out array for the duration of the call.
    if _blocks.gather_rows(src, row_size, rows, offs, sizes, addrs, err) != 0:
        _raise(err, f"row {int(err[1])}")


def preadv_rows(fd: int, file_offsets: np.ndarray, row_size: int, segments: list[tuple[int, np.ndarray | None]],
                sink: np.ndarray) -> None:
    """Read rows from the file straight into per-field arrays (one ``preadv`` per row).

    ``segments`` cut the row into consecutive ``(size, out)`` pieces covering it exactly; row
    i's piece goes to row i of ``out`` (C-contiguous, ``len(file_offsets) * size`` bytes), or
    into ``sink`` when ``out`` is None.
    """
    n = len(file_offsets)
    sizes = np.empty(len(segments), np.int64)
    addrs = np.zeros(len(segments), np.uint64)
    for j, (size, out) in enumerate(segments):
        sizes[j] = size
        if out is not None:
            if not out.flags.c_contiguous or not out.flags.writeable or out.nbytes != n * size:
                raise ValueError(f"preadv_rows: out {j} must be writeable, C-contiguous, {n * size} bytes; got {out.nbytes}")
            addrs[j] = out.ctypes.data if n else 0
            if n == 0:
                return
    err = np.zeros(3, np.int64)
    # `segments` keeps every out array alive for the duration of the call.
    if _blocks.preadv_rows(fd, file_offsets, row_size, sizes, addrs, sink, err) != 0:
        _raise(err, f"row read {int(err[1])}")


#: Blosc2 codec and filter codes (blosc2.h).
BLOSC2_CODECS = {"blosclz": 0, "lz4": 1, "lz4hc": 2, "zlib": 4, "zstd": 5}
BLOSC2_SHUFFLES = {"none": 0, "byte": 1, "bit": 2}


def compress_frame(raw, *, compcode: int, clevel: int, shuffle: int, typesize: int) -> np.ndarray:
    """``raw`` (bytes-like) as a single-chunk Blosc2 frame, without the GIL; returns a view of a
    new array holding exactly the frame. ``compcode`` and ``shuffle`` are Blosc2 codes
    (``spec.BLOSC2_CODECS``, ``spec.BLOSC2_SHUFFLES``)."""
    src = np.frombuffer(raw, np.uint8)
    dst = np.empty(len(src) + 65536, np.uint8)  # frame header, chunk header and index fit easily
    err = np.zeros(3, np.int64)
    n = _blocks.compress_frame(src, dst, compcode, clevel, shuffle, typesize, err)
    if n < 0:
        _raise(err, "blosc2 compression")
    return dst[:n]
