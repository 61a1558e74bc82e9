"""rowstore.codecs.image_check: the structural check of whole PNG/JPEG files at ingest (JPEG
markers from SOI to EOI with scan data, PNG chunk CRCs to IEND), on files PIL writes, every
truncation of them, the damage of tests/damaged_images.py, and hostile structures."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from damaged_images import damaged_jpegs, damaged_pngs, flat_progressive_jpeg, png_chunk

from rowstore.codecs.image import verify_image
from rowstore.codecs.image_check import check_jpeg_structure, check_png_structure, check_structure
from rowstore.errors import CodecError

Image = pytest.importorskip("PIL.Image")


def picture(h=24, w=40, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 6, y * 9, (x + y) * 3], axis=-1) + rng.integers(0, 40, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def encode(img, fmt, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def good_files() -> dict[str, bytes]:
    p = picture()
    return {
        "baseline": encode(p, "JPEG", quality=90),
        "progressive": encode(p, "JPEG", quality=90, progressive=True),
        "grey": encode(p.convert("L"), "JPEG"),
        "cmyk": encode(p.convert("CMYK"), "JPEG"),
        "restarts": encode(p, "JPEG", restart_marker_blocks=1),
        "exif": encode(p, "JPEG", exif=b"Exif\x00\x00" + b"\xff\xd9\xff\x00" * 50),
        "flat_progressive": flat_progressive_jpeg(16, 16),
        "png": encode(p, "PNG"),
        "palette": encode(p.convert("P"), "PNG"),
        "alpha": encode(p.convert("RGBA"), "PNG"),
        "grey_png": encode(p.convert("L"), "PNG"),
        "16bit": encode(
            Image.fromarray(np.arange(24 * 40, dtype=np.uint16).reshape(24, 40)), "PNG"
        ),
    }


@pytest.mark.parametrize("name", list(good_files()))
def test_valid_files_pass_and_report_their_format(name):
    data = good_files()[name]
    fmt = check_structure(data)
    assert fmt == ("png" if data.startswith(b"\x89PNG") else "jpeg")
    check_structure(memoryview(bytearray(data)))  # any buffer
    check_structure(data + b"trailing bytes after the end")  # as libjpeg / libpng stop there


@pytest.mark.parametrize("name", ["baseline", "progressive", "restarts", "png", "palette"])
def test_every_truncation_is_refused(name):
    """A file cut anywhere (the commonest damage of a real collection) is refused: every
    strict prefix of the file."""
    data = good_files()[name]
    for cut in range(len(data)):
        with pytest.raises(CodecError):
            check_structure(data[:cut])


def test_png_damage_in_any_chunk_is_its_crc():
    data = good_files()["png"]
    rng = np.random.default_rng(1)
    for pos in rng.integers(8, len(data), 200):
        bad = bytearray(data)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(CodecError, match="CRC|runs past|IEND|first chunk|IDAT"):
            check_png_structure(bytes(bad))


def test_what_the_structure_sees_and_what_only_a_decode_sees():
    """The damaged files of the decode tests: the structural check refuses the truncated ones
    and the bad CRCs; damage inside well-formed compressed data needs the full decode
    (verify_image), which refuses every one."""
    jpeg = encode(picture(64, 64), "JPEG", quality=90)
    caught = {"truncated", "no_eoi"}
    for name, bad in damaged_jpegs(jpeg).items():
        if name in caught:
            with pytest.raises(CodecError, match="truncated"):
                check_structure(bad)
        else:
            assert check_structure(bad) == "jpeg", name
        with pytest.raises(CodecError):
            verify_image(bad)
    png = encode(picture(64, 64), "PNG")
    caught = {"idat_crc", "ancillary_crc", "no_iend"}
    for name, bad in damaged_pngs(png).items():
        if name in caught:
            with pytest.raises(CodecError, match="CRC|IEND"):
                check_structure(bad)
        else:
            assert check_structure(bad) == "png", name
        with pytest.raises(CodecError):
            verify_image(bad)


def seg(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body


def test_hostile_jpeg_structures():
    sof = seg(0xC0, struct.pack(">BHHB", 8, 8, 8, 1) + b"\x01\x11\x00")
    sos = seg(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    cases = {
        "a segment past the end": b"\xff\xd8" + b"\xff\xe0\xff\xf0" + bytes(10),
        "a zero-length segment": b"\xff\xd8\xff\xe0\x00\x00" + b"\xff\xd9",
        "a scan before the frame": b"\xff\xd8" + sos + b"\x12\x34\xff\xd9",
        "a scan without data": b"\xff\xd8" + sof + sos + b"\xff\xd9",
        "no scan at all": b"\xff\xd8" + sof + b"\xff\xd9",
        "a stray byte between segments": b"\xff\xd8" + sof + b"\x00" + sos + b"\x12\xff\xd9",
        "a restart marker without DRI": b"\xff\xd8" + sof + sos + b"\x12\xff\xd0\x34\xff\xd9",
        "a second SOI": b"\xff\xd8" + sof + b"\xff\xd8" + sos + b"\x12\xff\xd9",
        "ends in fill bytes": b"\xff\xd8" + sof + sos + b"\x12\x34\xff\xff\xff",
    }
    for data in cases.values():
        with pytest.raises(CodecError, match="damaged JPEG"):
            check_jpeg_structure(data)
    ok = b"\xff\xd8" + sof + sos + b"\x12\xff\x00\x34\xff\xff\xd9"  # stuffing, fill before EOI
    check_jpeg_structure(ok)
    dri = seg(0xDD, b"\x00\x01")
    check_jpeg_structure(b"\xff\xd8" + sof + dri + sos + b"\x12\xff\xd0\x34\xff\xd9")
    # many tiny scans: one pass over the data whatever their number
    many = b"\xff\xd8" + sof + (sos + b"\x12") * 20000 + b"\xff\xd9"
    check_jpeg_structure(many)


def test_hostile_png_structures():
    sig = b"\x89PNG\r\n\x1a\n"
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    idat = png_chunk(b"IDAT", b"x\x9cc`\x00\x00\x00\x02\x00\x01")
    iend = png_chunk(b"IEND", b"")
    check_png_structure(sig + ihdr + idat + iend)
    cases = {
        "no IDAT": sig + ihdr + iend,
        "a chunk claiming 2 GiB": sig + ihdr + struct.pack(">I4s", 0x7FFFFFFF, b"IDAT") + bytes(8),
        "a chunk past 2 GiB": sig + ihdr + struct.pack(">I4s", 0xFFFFFFFF, b"IDAT") + bytes(8),
        "IDAT first": sig + idat + ihdr + iend,
        "nothing after the signature": sig,
    }
    for data in cases.values():
        with pytest.raises(CodecError, match="damaged PNG"):
            check_png_structure(data)


def test_other_formats_are_named():
    for data, name in (
        (b"GIF89a" + bytes(20), "GIF"),
        (b"", "UNKNOWN"),
        (b"BM" + bytes(30), "BMP"),
    ):
        with pytest.raises(CodecError, match=f"not PNG or JPEG bytes \\({name}"):
            check_structure(data)
