"""A cheap structural check of a whole PNG or JPEG file, for ingest: :func:`check_structure`.

What it proves, without decoding a pixel:

* **JPEG**: the marker segments are walked from ``SOI`` to ``EOI``, every length bounded by
  the data; a frame header (``SOF``) comes before the first scan; every scan (``SOS``) is
  followed by entropy-coded data, in which only stuffed bytes (``FF 00``) and restart markers
  (``FF D0``-``FF D7``, and only where a ``DRI`` segment asked for them) may appear; the walk
  ends at an ``EOI`` marker. A file cut anywhere after its header (the commonest damage) has no
  ``EOI`` where the walk needs it. Bytes after the ``EOI`` are allowed (cameras append data
  there, and libjpeg stops at the ``EOI``).
* **PNG**: every chunk's CRC-32, from ``IHDR`` to ``IEND``, each chunk's length bounded by the
  data, at least one ``IDAT``.

What it cannot see: entropy-coded data that is damaged but still well formed (a JPEG has no
checksum; a PNG's zlib stream is not inflated here). A full decode sees those
(:func:`rowstore.codecs.image.verify_image`, ``verify_encoded=True`` at ingest).

Cost: the JPEG scan looks for marker bytes with two vectorised numpy comparisons over the
entropy-coded data; the PNG CRCs use libdeflate's CRC-32 through imagecodecs (about 6x
``zlib.crc32``'s speed here), ``zlib.crc32`` where imagecodecs is missing. Both release the GIL
on large buffers. ``bench/image_ingest_bench.py`` measures the check against the whole ingest.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from rowstore.codecs.image import sniff_image_format
from rowstore.errors import CodecError

__all__ = ["check_structure", "check_jpeg_structure", "check_png_structure"]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_MAX_CHUNK = (1 << 31) - 1
#: JPEG markers without a length (``TEM`` and the restart markers); SOI/EOI handled apart
_JPEG_BARE = frozenset([0x01, *range(0xD0, 0xD8)])
#: JPEG frame header markers (``SOFn``; C4, C8 and CC are DHT, JPG and DAC)
_JPEG_SOF = frozenset(m for m in range(0xC0, 0xD0) if m not in (0xC4, 0xC8, 0xCC))


@functools.cache
def _crc32() -> Callable[[Any], int]:
    """The fastest CRC-32 at hand: libdeflate's (imagecodecs) or zlib's, the same values."""
    try:
        from imagecodecs import deflate_crc32
    except ImportError:  # pragma: no cover - imagecodecs is the image extra's
        return zlib.crc32
    return deflate_crc32


def _damaged(fmt: str, why: str) -> CodecError:
    return CodecError(f"damaged {fmt.upper()} file: {why}", codec=fmt)


def check_png_structure(data: Any) -> None:
    """Check every chunk of PNG bytes ``data`` up to ``IEND``: its length within the data and
    its CRC-32; an ``IHDR`` first and at least one ``IDAT``. Raises ``CodecError`` naming the
    first chunk that is wrong (or where the data ends)."""
    crc32 = _crc32()
    buf = memoryview(data).cast("B")  # slices of it are views
    n = len(buf)
    if bytes(buf[:8]) != _PNG_SIGNATURE:
        raise _damaged("png", "no PNG signature")
    pos, chunks, idat = 8, 0, False
    while True:  # each step moves >= 12 bytes
        if pos + 12 > n:
            raise _damaged("png", f"it ends at byte {n}, before its IEND chunk (truncated)")
        length, kind = struct.unpack_from(">I4s", buf, pos)
        name = kind.decode("latin-1")
        if length > _PNG_MAX_CHUNK or length > n - pos - 12:
            raise _damaged(
                "png",
                f"chunk {chunks} ({name!r}, at byte {pos}) of {length} bytes runs past the end "
                f"of the {n}-byte file (truncated)",
            )
        if chunks == 0 and kind != b"IHDR":
            raise _damaged("png", f"the first chunk is {name!r}, not IHDR")
        end = pos + 8 + length
        (crc,) = struct.unpack_from(">I", buf, end)
        if crc32(buf[pos + 4 : end]) != crc:  # the CRC covers the type and the data
            raise _damaged("png", f"the CRC of chunk {chunks} ({name!r}, at byte {pos}) is wrong")
        idat |= kind == b"IDAT"
        chunks += 1
        pos = end + 4
        if kind == b"IEND":
            break
    if not idat:
        raise _damaged("png", "no image data (IDAT chunk)")


def _marker_mask(arr: np.ndarray, start: int, restarts: bool) -> np.ndarray:
    """``mask[i]``: a marker starts at ``start + i`` (``FF`` then a byte other than ``00``;
    restart markers left out when ``restarts``). Two or three vectorised passes over the data,
    whatever the number of scans; :func:`_next` then finds each scan's end by ``argmax``,
    which stops at the first hit."""
    head, tail = arr[start:-1], arr[start + 1 :]
    mask = head == 0xFF
    mask &= tail != 0
    if restarts:
        mask &= (tail < 0xD0) | (tail > 0xD7)
    return mask


def _next(mask: np.ndarray, start: int, pos: int) -> int:
    """The first marker at or after ``pos`` by ``mask`` (made from ``start``), or -1."""
    rest = mask[pos - start :]
    if not len(rest):
        return -1
    k = int(rest.argmax())
    return pos + k if rest[k] else -1


def check_jpeg_structure(data: Any) -> None:
    """Walk JPEG bytes ``data`` from ``SOI`` to ``EOI``: marker segments within the data, a
    frame header before the first scan, entropy-coded data after every scan header, and an
    ``EOI`` where the walk ends. Raises ``CodecError`` saying where the structure breaks."""
    buf = data if isinstance(data, bytes) else memoryview(data).cast("B")
    n = len(buf)
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        raise _damaged("jpeg", "no SOI marker at its start")
    masks: dict[bool, np.ndarray] = {}  # where markers are, from the first scan's data on
    first = 0
    pos, frame, scans, restarts = 2, False, 0, False
    while True:
        if pos >= n:
            raise _damaged("jpeg", f"it ends at byte {n}, before its EOI marker (truncated)")
        if buf[pos] != 0xFF:
            raise _damaged("jpeg", f"no marker at byte {pos} (expected FF, got {buf[pos]:02X})")
        while pos + 1 < n and buf[pos + 1] == 0xFF:  # fill bytes
            pos += 1
        if pos + 1 >= n:
            raise _damaged("jpeg", f"it ends at byte {n}, inside a marker (truncated)")
        marker = buf[pos + 1]
        pos += 2
        if marker == 0xD9:  # EOI
            if not scans:
                raise _damaged("jpeg", "an EOI marker before any scan (no image data)")
            return
        if marker in _JPEG_BARE:
            if scans and marker != 0x01 and not restarts:
                raise _damaged(
                    "jpeg", f"a restart marker at byte {pos - 2} without a restart interval (DRI)"
                )
            continue
        if marker in (0x00, 0xD8):
            raise _damaged("jpeg", f"marker {marker:02X} at byte {pos - 2}")
        if pos + 2 > n:
            raise _damaged("jpeg", f"it ends at byte {n}, inside a marker segment (truncated)")
        (seglen,) = struct.unpack_from(">H", buf, pos)
        if seglen < 2 or pos + seglen > n:
            raise _damaged(
                "jpeg",
                f"the segment of marker {marker:02X} at byte {pos - 2} "
                + (
                    f"has length {seglen}"
                    if seglen < 2
                    else f"runs past the end of the {n}-byte file (truncated)"
                ),
            )
        if marker in _JPEG_SOF:
            frame = True
        elif marker == 0xDD and seglen >= 4:  # DRI: restart markers in the scans if non-zero
            restarts = struct.unpack_from(">H", buf, pos + 2)[0] != 0
        pos += seglen
        if marker != 0xDA:  # SOS: its entropy-coded data follows
            continue
        if not frame:
            raise _damaged(
                "jpeg", f"a scan (SOS at byte {pos - seglen - 2}) before any frame header"
            )
        if restarts not in masks:
            first = first or pos
            masks[restarts] = _marker_mask(np.frombuffer(buf, np.uint8), first, restarts)
        end = _next(masks[restarts], first, pos)
        if end < 0:
            raise _damaged(
                "jpeg",
                f"scan {scans + 1} (from byte {pos}) runs to the end of the {n}-byte file with "
                "no EOI marker (truncated)",
            )
        if end == pos:
            raise _damaged("jpeg", f"scan {scans + 1} (at byte {pos}) has no entropy-coded data")
        scans += 1
        pos = end


def check_structure(data: Any) -> str:
    """Check PNG or JPEG bytes ``data`` (the format from their signature) and return the
    format, ``"png"`` or ``"jpeg"``. Raises ``CodecError`` for bytes of another format, or
    damaged as :func:`check_png_structure` / :func:`check_jpeg_structure` find."""
    fmt = sniff_image_format(data)
    if fmt == "png":
        check_png_structure(data)
    elif fmt == "jpeg":
        check_jpeg_structure(data)
    else:
        raise CodecError(f"not PNG or JPEG bytes ({(fmt or 'unknown format').upper()})")
    return fmt
