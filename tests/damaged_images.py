"""Encoded images for the decode tests: damaged JPEGs and PNGs (each damaged where every
decoder reads it), a valid progressive JPEG of any size that is small on disk, and the peak
memory of a piece of code run in a fresh process."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def flat_progressive_jpeg(height: int, width: int, components: int = 3) -> bytes:
    """A valid progressive JPEG of a flat mid-grey image (every pixel 128), of any size up to
    65535 x 65535: its one scan (the DC coefficients of every component, no sampling) codes
    each block's difference 0 with a 1-bit Huffman code, so it takes ``components * height *
    width / 512`` bytes (1.1 MB for 14000 x 14000 x 3), while libjpeg must hold every DCT
    coefficient of the image (128 bytes a block: 1.2 GB) to decode it."""
    ids = range(1, components + 1)
    out = [b"\xff\xd8", _segment(0xDB, b"\x00" + bytes([1]) * 64)]
    sof = struct.pack(">BHHB", 8, height, width, components)
    out.append(_segment(0xC2, sof + b"".join(bytes([i, 0x11, 0]) for i in ids)))
    out.append(_segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00"))  # DC: '0' -> 0
    sos = bytes([components]) + b"".join(bytes([i, 0]) for i in ids) + b"\x00\x00\x00"
    out.append(_segment(0xDA, sos))
    bits = -(-height // 8) * -(-width // 8) * components
    out.append(bytes(bits // 8) + (bytes([(1 << (8 - bits % 8)) - 1]) if bits % 8 else b""))
    return b"".join(out) + b"\xff\xd9"


def progressive_coefficient_bytes(height: int, width: int, components: int = 3) -> int:
    """What libjpeg allocates for :func:`flat_progressive_jpeg`'s coefficients."""
    return -(-height // 8) * -(-width // 8) * components * 128


def _scan(jpeg: bytes) -> tuple[int, int]:
    """(start, end) of the last scan's entropy-coded data (between its SOS and the EOI)."""
    sos = jpeg.rfind(b"\xff\xda")
    (n,) = struct.unpack(">H", jpeg[sos + 2 : sos + 4])
    return sos + 2 + n, jpeg.rfind(b"\xff\xd9")


def damaged_jpegs(good: bytes) -> dict[str, bytes]:
    """Damaged versions of the JPEG ``good``, each of which libjpeg decodes with a warning and
    made-up (grey) pixels: cut in its scan, its end marker missing, a run of zeros in its
    scan (inserted: zeros written over scan data in place mostly decode as other valid codes,
    with no warning, to wrong pixels: JPEG has no checksum to see that)."""
    a, b = _scan(good)
    mid = (a + b) // 2
    return {
        "truncated": good[:mid],
        "no_eoi": good[:-2],
        "zero_run": good[:mid] + bytes(64) + good[mid:],
    }


def sof_lies(good: bytes, height: int = 8000, width: int = 8000) -> bytes:
    """``good`` (a baseline JPEG) whose frame header says ``height x width``."""
    sof = good.find(b"\xff\xc0")
    return good[: sof + 5] + struct.pack(">HH", height, width) + good[sof + 9 :]


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """The (kind, data) of each chunk of ``png``, in order."""
    out, pos = [], 8
    while pos + 8 <= len(png):
        (n,) = struct.unpack_from(">I", png, pos)
        out.append((png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + n]))
        pos += 12 + n
    return out


def damaged_pngs(good: bytes) -> dict[str, bytes]:
    """Damaged versions of the PNG ``good`` (any kind; one whose chunks are IHDR, maybe others,
    IDAT..., IEND): a wrong CRC (on the image data, on an ancillary chunk), the image data
    inflating to half the image (chunks intact), the zlib stream cut, a run of zeros in it,
    the IEND missing, bytes after the zlib stream, more image data than the size needs, the
    image data split around another chunk. libpng refuses the first few; it only warns about
    the rest (and returns the image)."""
    chunks = png_chunks(good)
    head = [c for c in chunks if c[0] not in (b"IDAT", b"IEND")]
    z = b"".join(d for k, d in chunks if k == b"IDAT")
    raw = zlib.decompress(z)
    row = len(raw) // max(1, struct.unpack_from(">I", good, 20)[0])  # a row of the first pass
    text = png_chunk(b"tEXt", b"k\x00v")
    half = len(z) // 2

    def build(*middle: bytes, end: bytes = png_chunk(b"IEND", b"")) -> bytes:
        return b"\x89PNG\r\n\x1a\n" + b"".join(png_chunk(*c) for c in head) + b"".join(middle) + end

    idat = png_chunk(b"IDAT", z)
    return {
        "idat_crc": build(idat[:-4] + bytes([idat[-4] ^ 1]) + idat[-3:]),
        "ancillary_crc": build(text[:-1] + bytes([text[-1] ^ 1]), idat),
        "truncated_idat": build(png_chunk(b"IDAT", zlib.compress(raw[: len(raw) // 2]))),
        "cut_stream": build(png_chunk(b"IDAT", z[:half])),
        "zero_run": build(png_chunk(b"IDAT", z[:half] + bytes(32) + z[half + 32 :])),
        "no_iend": build(idat, end=b""),
        "extra_after_stream": build(png_chunk(b"IDAT", z + b"junk")),
        "too_much_data": build(png_chunk(b"IDAT", zlib.compress(raw + bytes(row)))),
        "split_idat": build(png_chunk(b"IDAT", z[:half]), text, png_chunk(b"IDAT", z[half:])),
    }


def peak_rss_mb(body: str, *, timeout: float = 120.0) -> dict:
    """Run ``body`` (Python source, indented freely) in a fresh interpreter after ``import
    numpy as np``, with ``mark()`` available to measure from: returns ``{"delta": MB of peak
    RSS above the peak at mark(), **result}`` where ``result`` is the dict ``body`` leaves in
    ``result``."""
    src = (
        "import json, sys\nimport numpy as np\n"
        "from rowstore.global_shuffle._passes import peak_rss\n"
        # VmHWM: ru_maxrss keeps the peak of the (large) pytest worker across exec
        "def _rss():\n    return peak_rss() / (1 << 20)\n"
        "_base = [0.0]\ndef mark():\n    _base[0] = _rss()\n"
        "result = {}\n"
        + textwrap.dedent(body)
        + "\nresult['delta'] = _rss() - _base[0]\nprint(json.dumps(result))\n"
    )
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, ROOT, os.path.join(ROOT, "tests")]))
    out = subprocess.run(
        [sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout, env=env
    )
    if out.returncode:
        raise AssertionError(f"the measuring process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
