"""The format-v2 footer of a single file, declared once: what a reader opens a file from without
libhdf5. ``docs/format.md`` ("Format v2: the footer") specifies it in prose; keep both in step.

A v2 file is a complete HDF5 file (the same group, datasets and attributes as v1; h5py, h5dump
and PyTables see it unchanged) followed by a footer and a fixed-size trailer::

    offset F = the HDF5 end of file
      FOOTER_MAGIC              8 bytes  b"RSFOOTR2"
      header length             <u4
      header                    UTF-8 JSON object: the /rowstore attributes (same keys, same values,
                                JSON text values as text) plus "hdf5_eof": F
      INDEX_MAGIC               8 bytes  (the dataset sidecar's magic: the rest is a one-shard
      sidecar)
      block index               num_blocks * spec.BLOCK_DTYPE records
      heap chunk index          num_heap_chunks * spec.HEAP_CHUNK_DTYPE records
      (format v3 only: the page index)
      PAGE_MAGIC                8 bytes  b"RSPAGES3"
      block pages               <u4 CRC-32 per page of each block, blocks in order
      heap pages                <u4 CRC-32 per page of each heap chunk, chunks in order
    the last TRAILER_SIZE (32) bytes of the file
      TRAILER_MAGIC             8 bytes  b"RSTRAIL2"
      footer offset             <u8  (= F)
      footer length             <u8  (magic to the end of the heap chunk index)
      footer CRC-32             <u4  (zlib.crc32 of the footer bytes)
      trailer CRC-32            <u4  (of the 28 trailer bytes before it)

A v3 header holds ``format_version`` 3 and ``page_bytes``; a block's pages are
``spec.page_geometry(page_bytes, rows_per_block * row size, row size)`` (whole rows each), a
heap chunk's ``spec.page_geometry(page_bytes, heap_chunk_bytes)``, so the counts follow from the
header. Readers of v2 only refuse a v3 file by its version (``FormatVersionError``) before they
look at its index.

The footer's CRC covers the schema, every attribute and every index entry (so the position of
every block: an entry swapped or edited is refused at open); each chunk's own CRC-32 in the index
covers its bytes. A file whose last bytes are the trailer magic is read from the footer alone and
must be valid (a damaged footer is an error, never a fall-back to libhdf5); a file without it
is a v1 file (or a v2 file whose tail was cut off, which its ``format_version`` attribute
reveals), read through h5py.

libhdf5 ignores bytes past its end of file when it reads, but a file opened for writing is cut
back to that end when closed: an append (which reopens a copy with h5py) cuts the footer off
first (:func:`cut`) and writes a new one at the end.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rowstore.errors import ChecksumError, FormatError
from rowstore.format import spec
from rowstore.format.manifest import INDEX_MAGIC, _json_object

__all__ = [
    "FOOTER_MAGIC",
    "TRAILER_MAGIC",
    "PAGE_MAGIC",
    "TRAILER_SIZE",
    "FIRST_READ",
    "Footer",
    "encode",
    "read",
    "read_local",
    "cut",
    "parse_trailer",
    "parse_footer",
    "hdf5_end",
    "check_no_footer",
]

FOOTER_MAGIC = b"RSFOOTR2"
TRAILER_MAGIC = b"RSTRAIL2"
#: Start of the page index (format v3), after the heap chunk index.
PAGE_MAGIC = b"RSPAGES3"
_TRAILER = struct.Struct("<8sQQII")
TRAILER_SIZE = _TRAILER.size  # 32
_HEADER_LEN = struct.Struct("<I")
#: Largest JSON header (the schema and the user attributes are each below 64 KiB: see
#: ``_h5file.check_storable``); a larger one is refused before it is parsed.
MAX_HEADER_BYTES = 1 << 20
#: Bytes of the file's end a reader fetches first (one request of a remote open): the trailer
#: and, for files up to about 18,000 blocks (v3: about 900 blocks of 1 MiB, whose page index
#: takes 1 KiB each), the whole footer.
FIRST_READ = 1 << 20
#: Key of the header that is not an HDF5 attribute: where the footer starts.
KEY_EOF = "hdf5_eof"


class Footer:
    """A parsed footer: ``header`` (the attributes, unchecked values), ``blocks`` and
    ``heap_chunks`` (index records, not yet checked against the header), ``offset`` (where the
    footer starts: the HDF5 end of file, which every chunk lies before)."""

    __slots__ = ("header", "index", "offset", "_data", "_trailer")

    def __init__(
        self, header: dict, index: memoryview, offset: int, data: bytes = b"", trailer: bytes = b""
    ):
        self.header, self.index, self.offset = header, index, offset
        self._data, self._trailer = data, trailer

    @property
    def raw(self) -> bytes:
        """The footer's and trailer's bytes (what :func:`read` takes back as ``first``, without a
        read)."""
        return self._data + self._trailer

    def indexes(
        self, num_blocks: int, num_heap_chunks: int, bad, pages: tuple[int, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, tuple | None]:
        """The block and heap chunk index, which must hold exactly the counts given, and (with
        ``pages``: the numbers of block and heap pages, format v3) the page index: a pair of
        uint32 arrays, else None."""
        nb, nh = (
            num_blocks * spec.BLOCK_DTYPE.itemsize,
            num_heap_chunks * spec.HEAP_CHUNK_DTYPE.itemsize,
        )
        npb = (
            0
            if pages is None
            else len(PAGE_MAGIC) + (pages[0] + pages[1]) * spec.PAGE_DTYPE.itemsize
        )
        if len(self.index) != nb + nh + npb:
            what = "" if pages is None else f" and {pages[0]} + {pages[1]} pages"
            raise bad(
                f"the footer's index holds {len(self.index)} bytes, expected {nb + nh + npb} for "
                f"{num_blocks} "
                f"blocks and {num_heap_chunks} heap chunks{what}"
            )
        # Read-only views of the footer's bytes (as a dataset's index is of its sidecar's).
        blocks = np.frombuffer(self.index[:nb], dtype=spec.BLOCK_DTYPE)
        heap_chunks = np.frombuffer(self.index[nb : nb + nh], dtype=spec.HEAP_CHUNK_DTYPE)
        if pages is None:
            return blocks, heap_chunks, None
        at = nb + nh
        if bytes(self.index[at : at + len(PAGE_MAGIC)]) != PAGE_MAGIC:
            raise bad("the page index does not start with its magic")
        at += len(PAGE_MAGIC)
        split = at + pages[0] * spec.PAGE_DTYPE.itemsize
        return (
            blocks,
            heap_chunks,
            (
                np.frombuffer(self.index[at:split], dtype=spec.PAGE_DTYPE),
                np.frombuffer(self.index[split:], dtype=spec.PAGE_DTYPE),
            ),
        )


def encode(
    attrs: Mapping[str, Any],
    blocks: np.ndarray,
    heap_chunks: np.ndarray,
    offset: int,
    pages: tuple[np.ndarray, np.ndarray] | None = None,
) -> bytes:
    """Footer and trailer of a file whose HDF5 part ends at ``offset``, with these attributes
    (:func:`~rowstore.writer._h5file.file_attributes`) and indexes, and ``pages`` (the block
    and heap page CRC-32s) for a v3 file."""
    header = dict(attrs)
    header[KEY_EOF] = offset
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    footer = b"".join(
        [
            FOOTER_MAGIC,
            _HEADER_LEN.pack(len(text)),
            text,
            INDEX_MAGIC,
            np.ascontiguousarray(blocks, dtype=spec.BLOCK_DTYPE).tobytes(),
            np.ascontiguousarray(heap_chunks, dtype=spec.HEAP_CHUNK_DTYPE).tobytes(),
        ]
        + (
            []
            if pages is None
            else [
                PAGE_MAGIC,
                *(np.ascontiguousarray(p, dtype=spec.PAGE_DTYPE).tobytes() for p in pages),
            ]
        )
    )
    head = _TRAILER.pack(TRAILER_MAGIC, offset, len(footer), zlib.crc32(footer), 0)[:-4]
    return footer + head + struct.pack("<I", zlib.crc32(head))


def _bad(path: str, msg: str) -> FormatError:
    return FormatError(f"{path!r}: {msg}", path=path)


def parse_trailer(tail: bytes, size: int, path: str) -> tuple[int, int, int] | None:
    """``(footer offset, footer length, footer CRC-32)`` from the last bytes ``tail`` of a file
    of ``size`` bytes; None when they do not end with a trailer (a v1 file). A trailer whose
    magic is there but whose CRC, offsets or length are wrong is an error."""
    if len(tail) < TRAILER_SIZE or tail[-TRAILER_SIZE:][:8] != TRAILER_MAGIC:
        return None
    t = tail[-TRAILER_SIZE:]
    magic, offset, nbytes, crc, tcrc = _TRAILER.unpack(t)
    if zlib.crc32(t[:-4]) != tcrc:
        raise ChecksumError(
            f"{path!r}: the v2 trailer's CRC-32 does not match (a damaged trailer)", path=path
        )
    if (
        offset < 1
        or offset + nbytes + TRAILER_SIZE != size
        or nbytes < len(FOOTER_MAGIC) + _HEADER_LEN.size + len(INDEX_MAGIC)
    ):
        raise _bad(
            path,
            f"the v2 trailer places a footer of {nbytes} bytes at offset {offset}, which does not "
            f"end where "
            f"the trailer starts in a file of {size} bytes (truncated, or bytes inserted?)",
        )
    return offset, nbytes, crc


def parse_footer(data: bytes, offset: int, crc: int, path: str, trailer: bytes = b"") -> Footer:
    """The footer in ``data`` (its bytes exactly), checked against its CRC-32 ``crc`` first."""
    if zlib.crc32(data) != crc:
        raise ChecksumError(
            f"{path!r}: the v2 footer's CRC-32 does not match its trailer (the schema, attributes "
            f"or "
            f"block index were damaged or edited)",
            path=path,
        )
    if data[:8] != FOOTER_MAGIC:
        raise _bad(path, "the v2 footer does not start with its magic")
    (n,) = _HEADER_LEN.unpack_from(data, 8)
    at = 8 + _HEADER_LEN.size
    if n > MAX_HEADER_BYTES or at + n + len(INDEX_MAGIC) > len(data):
        raise _bad(
            path,
            f"the v2 footer's header length {n} does not fit the footer ({len(data)} bytes, at "
            f"most "
            f"{MAX_HEADER_BYTES} of header)",
        )
    header = _json_object(f"{path} (v2 footer)", data[at : at + n])
    at += n
    if data[at : at + len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise _bad(path, "the v2 footer's index does not start with its magic")
    return Footer(header, memoryview(data)[at + len(INDEX_MAGIC) :], offset, data, trailer)


def read(
    read_range: Callable[[int, int], bytes], size: int, path: str, *, first: bytes | None = None
) -> Footer | None:
    """The footer of a file of ``size`` bytes, or None for a file without one (v1).

    ``read_range(start, end)`` returns the file's bytes ``[start, end)``; ``first`` may hold
    the file's last bytes already read (else the last :data:`FIRST_READ` are read first). The
    footer is read by one more call only when it is larger than those bytes.
    """
    if first is None:
        first = read_range(max(0, size - FIRST_READ), size) if size else b""
    found = parse_trailer(first, size, path)
    if found is None:
        return None
    offset, nbytes, crc = found
    end = size - TRAILER_SIZE
    have = len(first) - TRAILER_SIZE  # bytes of the file before the trailer that `first` holds
    if nbytes <= have:
        data = bytes(first[have - nbytes : have])
    elif have <= 0:
        data = read_range(offset, end)
    else:
        data = read_range(offset, end - have) + bytes(first[:have])
        if len(data) != nbytes:
            raise _bad(
                path,
                f"read {len(data)} bytes of a {nbytes}-byte v2 footer (the file changed while "
                f"opened?)",
            )
    return parse_footer(data, offset, crc, path, bytes(first[-TRAILER_SIZE:]))


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def hdf5_end(head: bytes) -> int | None:
    """The end-of-file address that the HDF5 superblock at the start of ``head`` (the file's
    first 48 bytes) records; None for a superblock this does not parse (a user block, offsets
    of another size, an unknown version)."""
    if len(head) < 48 or head[:8] != _HDF5_SIGNATURE:
        return None
    version = head[8]
    if version in (0, 1) and head[13] == 8:
        at = 24 if version == 0 else 28  # base address, then free-space, end-of-file addresses
    elif version in (2, 3) and head[9] == 8:
        at = 12  # base address, superblock extension, end-of-file addresses
    else:
        return None
    base, _, end = struct.unpack_from("<QQQ", head, at)
    return end if base == 0 else None


def check_no_footer(read_range: Callable[[int, int], bytes], size: int, path: str) -> None:
    """For a file without a trailer (:func:`read` returned None), before libhdf5 sees it: a file
    shorter than its HDF5 superblock says is truncated, and a file whose HDF5 part is followed by
    a footer without its trailer was truncated in the footer or had bytes appended after it;
    both are a :class:`FormatError`. (A v2 file edited with h5py, which writes over the footer,
    passes: it is read as a v1 file.)"""
    end = hdf5_end(read_range(0, min(size, 48)))
    if end is None:
        return
    if end > size:
        raise _bad(path, f"truncated: its HDF5 superblock records {end} bytes, the file has {size}")
    after = read_range(end, min(size, end + len(FOOTER_MAGIC))) if end < size else b""
    if after and FOOTER_MAGIC.startswith(after):  # the footer's magic, or the start of it
        raise _bad(
            path,
            f"a v2 footer starts at offset {end} (the HDF5 end of file) but the file does not end "
            f"with its "
            f"trailer: truncated in the footer, or bytes appended after it",
        )


def read_local(fd: int, size: int, path: str) -> Footer | None:
    """:func:`read` of an open local file."""

    def pread(a: int, b: int) -> bytes:
        out = os.pread(fd, b - a, a)
        if len(out) != b - a:
            raise _bad(path, f"short read of bytes {a}-{b} (the file shrank while opened?)")
        return out

    # The trailer, then exactly the footer it names: two reads whatever the footer's size.
    found = read(
        pread, size, path, first=pread(size - TRAILER_SIZE, size) if size >= TRAILER_SIZE else b""
    )
    if found is None:
        check_no_footer(pread, size, path)
    return found


def cut(path: str, offset: int) -> None:
    """Remove the footer and trailer of the file at ``path`` whose HDF5 part ends at ``offset``
    (an append reopens it with h5py, which would cut it at close anyway)."""
    os.truncate(path, offset)
