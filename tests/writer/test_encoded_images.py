"""Encoded images in, as they are: PNG/JPEG bytes given for a png/jpeg field are checked by their
header and stored unchanged; read back they decode to imagecodecs' pixels, and damaged ones (also
those a decoder would conceal) are refused on every read path, or at write time on request."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from damaged_images import damaged_jpegs, damaged_pngs, peak_rss_mb, sof_lies
from helpers import stored_payloads

import rowstore
from rowstore import Field, RowValidationError, Schema
from rowstore.codecs.image import (
    check_png,
    jpeg_header,
    png_header,
    sniff_image_format,
    verify_image,
)

ic = pytest.importorskip("imagecodecs")
Image = pytest.importorskip("PIL.Image")

RNG = np.random.default_rng(7)


def smooth(shape, dtype=np.uint8):
    """A smooth image (compresses, survives JPEG)."""
    h, w = shape[:2]
    top = np.iinfo(dtype).max
    y, x = np.mgrid[0:h, 0:w]
    base = (np.sin(x / 5.0) + np.cos(y / 7.0) + 2) / 4 * top
    if len(shape) == 3:
        base = np.stack([base * (0.5 + 0.5 * c / shape[2]) for c in range(shape[2])], axis=-1)
    return base.astype(dtype)


def png(a, **kw) -> bytes:
    return ic.png_encode(np.ascontiguousarray(a), **kw)


def jpg(a, **kw) -> bytes:
    return ic.jpeg8_encode(np.ascontiguousarray(a), **kw)


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def handmade_png(w, h, depth, colour, rows: bytes, extra=b"") -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + extra
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def adam7_png(img) -> bytes:
    """An Adam7-interlaced 8-bit PNG of ``img`` (HxW grey or HxWx3), built by hand (PIL writes
    no interlaced PNGs)."""
    h, w = img.shape[:2]
    raw = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4)):
        sub = img[y0::dy, x0::dx]
        raw += b"".join(b"\x00" + r.tobytes() for r in sub) if sub.size else b""
    for x0, y0, dx, dy in ((1, 0, 2, 2), (0, 1, 1, 2)):
        sub = img[y0::dy, x0::dx]
        raw += b"".join(b"\x00" + r.tobytes() for r in sub) if sub.size else b""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2 if img.ndim == 3 else 0, 0, 0, 1)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def pil_bytes(arr, fmt, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kw)
    return buf.getvalue()


# -- the header parsers agree with imagecodecs' decoder --------------------------------------
def _png_cases():
    rgb = smooth((9, 13, 3))
    yield "rgb8", png(rgb)
    yield "gray8", png(rgb[..., 0])
    yield "gray16", png(smooth((6, 5), np.uint16))
    yield "rgba16", png(smooth((6, 5, 4), np.uint16))
    yield "ga8", png(smooth((6, 5, 2)))
    yield "interlaced", pil_bytes(rgb, "PNG", interlace=1)
    yield "adam7", adam7_png(rgb)
    yield "adam7_grey_3x2", adam7_png(rgb[:3, :2, 0])
    pal = Image.fromarray(rgb).convert("P", palette=1, colors=16)
    buf = io.BytesIO()
    pal.save(buf, "PNG")
    yield "palette", buf.getvalue()
    row = b"\x00\x00\x01"
    plte = chunk(b"PLTE", bytes([255, 0, 0, 0, 255, 0]))
    yield "palette_trns", handmade_png(2, 2, 8, 3, row * 2, plte + chunk(b"tRNS", b"\x80"))
    yield "gray1", handmade_png(2, 2, 1, 0, b"\x00\x80" * 2)
    yield "gray4", handmade_png(3, 2, 4, 0, b"\x00\x12\x30" * 2)
    yield "gray_trns", handmade_png(2, 2, 8, 0, b"\x00\x01\x02" * 2, chunk(b"tRNS", b"\x00\x01"))
    yield "rgb_trns", handmade_png(2, 2, 8, 2, (b"\x00" + bytes(6)) * 2, chunk(b"tRNS", bytes(6)))
    text = chunk(b"tEXt", b"Comment\x00" + b"x" * 5000)  # a big chunk before IDAT: skipped
    yield "text_chunk", handmade_png(2, 2, 8, 0, b"\x00\x01\x02" * 2, text)


def _jpeg_cases():
    rgb = smooth((17, 23, 3))
    yield "rgb", jpg(rgb)
    yield "gray", jpg(rgb[..., 0])
    yield "progressive", pil_bytes(rgb, "JPEG", progressive=True)
    yield "exif_and_fill", pil_bytes(rgb, "JPEG", quality=50, exif=b"Exif\x00\x00" + b"\x00" * 64)


@pytest.mark.parametrize(
    "name,data", list(_png_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_png_header_matches_decoder(name, data):
    hdr = png_header(data)
    img = ic.png_decode(data)
    shape = img.shape if img.ndim == 3 else img.shape + (1,)
    assert (hdr.height, hdr.width, hdr.channels) == shape, name
    assert hdr.dtype == img.dtype
    assert png_header(memoryview(data)) == png_header(bytearray(data)) == hdr
    assert sniff_image_format(data) == "png"


@pytest.mark.parametrize(
    "name,data", list(_jpeg_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_jpeg_header_matches_decoder(name, data):
    hdr = jpeg_header(data)
    img = ic.jpeg8_decode(data)
    shape = img.shape if img.ndim == 3 else img.shape + (1,)
    assert (hdr.height, hdr.width, hdr.channels) == shape, name
    assert hdr.bits == 8 and img.dtype == np.uint8
    assert sniff_image_format(data) == "jpeg"


def test_headers_of_every_prefix_and_corruption_are_values_or_errors():
    """Truncated or mutated headers raise ValueError (never another exception, never hang);
    where a header still parses, it says what the intact one says (or the mutation hit it)."""
    rng = np.random.default_rng(3)
    for data, parse in [
        (png(smooth((20, 30, 3))), png_header),
        (pil_bytes(smooth((20, 30, 3)), "JPEG", progressive=True), jpeg_header),
    ]:
        good = parse(data)
        for n in range(0, min(len(data), 400)):
            try:
                assert parse(data[:n]) == good
            except ValueError:
                pass
        arr = np.frombuffer(data, np.uint8)
        for _ in range(300):
            bad = arr.copy()
            pos = rng.integers(0, min(len(bad), 200), size=rng.integers(1, 4))
            bad[pos] = rng.integers(0, 256, size=len(pos))
            try:
                parse(bad.tobytes())
            except ValueError:
                pass


@pytest.mark.parametrize(
    "data,why",
    [
        (b"", "truncated or empty"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 10, "truncated PNG"),
        (b"GIF89a" + b"\x00" * 40, "got GIF bytes"),
        (handmade_png(2, 2, 8, 0, b"\x00\x01\x02" * 2)[:40], "ends before its image data"),
        (handmade_png(2, 2, 8, 0, b"\x00\x01\x02" * 2)[:48], "inside its first IDAT"),
        (handmade_png(2, 2, 16, 3, b"\x00" * 10), "bit depth 16 with colour type 3"),
        (handmade_png(0, 2, 8, 0, b""), "size 0x2"),
        (handmade_png(2, 2, 8, 3, b"\x00\x00\x00" * 2), "without a PLTE"),
    ],
)
def test_png_header_refusals(data, why):
    with pytest.raises(ValueError, match=why):
        png_header(data)


def test_png_header_crc_checked():
    data = bytearray(png(smooth((4, 4))))
    data[20] ^= 1  # inside IHDR (the height)
    with pytest.raises(ValueError, match="CRC"):
        png_header(bytes(data))


def _sof(marker, bits=8, h=4, w=4, comps=3):
    seg = struct.pack(">BHHB", bits, h, w, comps) + b"\x01\x11\x00" * comps
    return b"\xff\xd8" + b"\xff" + bytes([marker]) + struct.pack(">H", 2 + len(seg)) + seg


@pytest.mark.parametrize(
    "data,why",
    [
        (b"\xff\xd8", "truncated or empty"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "ends before its frame header"),
        (_sof(0xC0)[:10], "inside its frame header"),
        (_sof(0xC3), "SOF3"),
        (_sof(0xC9), "SOF9"),
        (_sof(0xC1, bits=12), "12-bit"),
        (_sof(0xC0, comps=2), "2 components"),
        (_sof(0xC0, h=0), "size 4x0"),
        (b"\xff\xd8\xff\xda\x00\x02", "before the frame header"),
        (png(smooth((4, 4))), "got PNG bytes"),
    ],
)
def test_jpeg_header_refusals(data, why):
    with pytest.raises(ValueError, match=why):
        jpeg_header(data)


# -- writing: stored as they are, read back as imagecodecs decodes ---------------------------
def test_write_stores_bytes_unchanged(h5path):
    rgb = [smooth((24, 32, 3)) + i for i in range(5)]
    pngs = [png(a) for a in rgb]
    jpgs = [jpg(a) for a in rgb]
    gray = [png(a[..., 0]) for a in rgb]
    g16 = [png(smooth((8, 9), np.uint16) + i) for i in range(5)]
    schema = Schema(
        [
            Field("png", "uint8", (24, 32, 3), codec="png"),
            Field("jpg", "uint8", (24, 32, 3), codec="jpeg"),
            Field("gray", "uint8", (24, 32), codec="png"),
            Field("gray1", "uint8", (24, 32, 1), codec="png"),
            Field("g16", "uint16", (8, 9), codec="png"),
            Field("label", "int64", ()),
        ]
    )
    with rowstore.Writer(h5path, schema, rows_per_block=2) as w:
        w.write(dict(png=pngs[0], jpg=jpgs[0], gray=gray[0], gray1=gray[0], g16=g16[0], label=0))
        w.write(
            dict(
                png=memoryview(pngs[1]),
                jpg=bytearray(jpgs[1]),
                gray=memoryview(np.frombuffer(gray[1], np.uint8)),
                gray1=gray[1],
                g16=g16[1],
                label=1,
            )
        )
        obj = np.empty(3, dtype=object)
        obj[:] = pngs[2:]
        w.write_batch(
            dict(png=obj, jpg=jpgs[2:], gray=gray[2:], gray1=gray[2:], g16=g16[2:], label=[2, 3, 4])
        )
    assert stored_payloads(h5path, "png") == pngs
    assert stored_payloads(h5path, "jpg") == jpgs
    assert stored_payloads(h5path, "gray") == gray
    assert stored_payloads(h5path, "g16") == g16
    with rowstore.open(h5path) as r:
        b = r.take(np.arange(5))
    for i in range(5):
        assert np.array_equal(b["png"][i], ic.png_decode(pngs[i]))
        assert np.array_equal(b["jpg"][i], ic.jpeg8_decode(jpgs[i]))
        assert np.array_equal(b["gray"][i], ic.png_decode(gray[i]))
        assert np.array_equal(b["gray1"][i][..., 0], ic.png_decode(gray[i]))
        assert np.array_equal(b["g16"][i], ic.png_decode(g16[i]))
    assert b["label"].tolist() == list(range(5))


def test_encoded_and_arrays_mix(h5path):
    """Bytes and arrays in one column: bytes stored as they are, arrays encoded."""
    a = smooth((10, 12, 3))
    schema = Schema([Field("img", "uint8", (10, 12, 3), codec="png")])
    enc = png(a, level=9)
    with rowstore.Writer(h5path, schema) as w:
        w.write_batch({"img": [enc, a, enc]})
    stored = stored_payloads(h5path, "img")
    assert stored[0] == stored[2] == enc
    with rowstore.open(h5path) as r:
        assert all(np.array_equal(r[i]["img"], a) for i in range(3))


def test_variable_shape_fields(h5path):
    shapes = [(5, 7), (30, 3), (1, 1), (64, 40)]
    imgs = [smooth(s + (3,)) for s in shapes]
    schema = Schema(
        [
            Field("img", "uint8", (None, None, 3), codec="png"),
            Field("jpg", "uint8", (None, None, 3), codec="jpeg"),
            Field("gray", "uint8", (None, 40), codec="png", nullable=True),
        ]
    )
    pngs = [png(a) for a in imgs]
    jpgs = [jpg(a) for a in imgs]
    grays = [None, None, None, png(imgs[3][..., 1])]
    with rowstore.Writer(h5path, schema) as w:
        w.write_batch({"img": pngs, "jpg": jpgs, "gray": grays})
    assert stored_payloads(h5path, "img") == pngs
    with rowstore.open(h5path) as r:
        for i, s in enumerate(shapes):
            row = r[i]
            assert row["img"].shape == s + (3,) and np.array_equal(row["img"], imgs[i])
            assert np.array_equal(row["jpg"], ic.jpeg8_decode(jpgs[i]))
            if grays[i] is None:
                assert row["gray"] is None
            else:
                assert np.array_equal(row["gray"], imgs[i][..., 1])
        padded = r.take(np.arange(4), varlen="padded")
        assert padded["img__shape"].tolist() == [list(s) for s in shapes]


def _schema():
    return Schema(
        [
            Field("img", "uint8", (8, 8, 3), codec="png"),
            Field("var", "uint8", (None, None), codec="jpeg"),
            Field("y", "int32", ()),
        ]
    )


GOOD_PNG = png(smooth((8, 8, 3)))
GOOD_JPG = jpg(smooth((5, 6)))


@pytest.mark.parametrize(
    "field,value,why",
    [
        ("img", GOOD_JPG, "got JPEG bytes, not PNG"),
        ("var", GOOD_PNG, "got PNG bytes, not JPEG"),
        ("img", png(smooth((8, 9, 3))), r"shape \(8, 9, 3\) \(wrong shape\)"),
        ("img", png(smooth((8, 8, 3), np.uint16)), "16-bit PNG for a uint8 field"),
        ("img", GOOD_PNG[:30], "truncated PNG"),
        ("img", b"not an image at all", "not PNG bytes"),
        ("var", pil_bytes(smooth((5, 6, 3)), "JPEG").replace(b"\xff\xc0", b"\xff\xc3", 1), "SOF3"),
        ("var", GOOD_JPG[:12], "truncated JPEG"),
    ],
)
def test_bad_encoded_values_refused_with_field_and_row(h5path, field, value, why):
    row = dict(img=GOOD_PNG, var=GOOD_JPG, y=0)
    with rowstore.Writer(h5path, _schema()) as w:
        w.write(row)
        with pytest.raises(RowValidationError, match=why) as e:
            w.write({**row, field: value})
        assert (e.value.field, e.value.row) == (field, 1)
        assert f"row 1: field {field!r}" in str(e.value)
        cols = {k: [v, v, v] for k, v in row.items()}
        cols[field] = [row[field], value, row[field]]
        with pytest.raises(RowValidationError, match=why) as e:
            w.write_batch(cols)
        assert (e.value.field, e.value.row) == (field, 2)  # row 1 of the batch, row 2 overall
        w.write({**row, "y": 1})  # still usable
    with rowstore.open(h5path) as r:
        assert len(r) == 2 and r[1]["y"] == 1
    assert stored_payloads(h5path, "img") == [GOOD_PNG, GOOD_PNG]


def test_declared_size_over_the_value_limit_refused(h5path):
    """A header claiming a huge image is refused before anything is stored (what a reader
    would allocate)."""
    huge = handmade_png(1 << 20, 1 << 20, 8, 2, b"\x00")
    schema = Schema([Field("img", "uint8", (None, None, 3), codec="png")])
    with rowstore.Writer(h5path, schema) as w:
        with pytest.raises(RowValidationError, match="MAX_VALUE_BYTES") as e:
            w.write({"img": huge})
        assert e.value.row == 0


def test_verify_encoded_decodes_in_full(h5path):
    good = png(smooth((8, 8, 3)))
    corrupt = good[:-40] + bytes(28) + good[-12:]  # header intact, image data broken
    schema = Schema([Field("img", "uint8", (8, 8, 3), codec="png")])
    with rowstore.Writer(h5path, schema, verify_encoded=True) as w:
        w.write({"img": good})
        with pytest.raises(RowValidationError, match="does not decode") as e:
            w.write_batch({"img": [good, corrupt]})
        assert (e.value.field, e.value.row) == ("img", 2)
    # without verify_encoded the header is all that is checked: the bytes are stored, and the
    # reader reports the corrupt value when it decodes it
    with rowstore.Writer(h5path, schema) as w:
        w.write({"img": corrupt})
    with rowstore.open(h5path) as r, pytest.raises(rowstore.RowstoreError):
        r[0]


def test_dataset_writer_and_write_shard(tmp_path):
    imgs = [smooth((6, 7, 3)) + i for i in range(6)]
    pngs = [png(a) for a in imgs]
    schema = Schema([Field("img", "uint8", (None, None, 3), codec="png"), Field("i", "int64", ())])
    ds = tmp_path / "ds"
    with rowstore.DatasetWriter(ds, schema, shard_bytes=300, verify_encoded=True) as w:
        for i in range(3):
            w.write({"img": pngs[i], "i": i})
        w.write_batch({"img": pngs[3:], "i": [3, 4, 5]})
        with pytest.raises(RowValidationError) as e:
            w.write({"img": pngs[0][:20], "i": 6})
        assert (e.value.field, e.value.row) == ("img", 6)
    with rowstore.open(ds) as r:
        assert len(r.layout.shard_paths) > 1
    with rowstore.open(ds) as r:
        b = r.take(np.arange(6))
        assert all(np.array_equal(b["img"][i], imgs[i]) for i in range(6))
    assert sorted(stored_payloads(str(ds), "img")) == sorted(pngs)
    info = rowstore.write_shard(tmp_path / "ds2", schema, {"img": pngs, "i": list(range(6))})
    rowstore.commit(tmp_path / "ds2", [info])
    assert stored_payloads(str(tmp_path / "ds2"), "img") == pngs


def test_arrays_and_bytes_fields_unchanged(h5path):
    """bytes for a bytes field stay a value; an ndarray for an image field stays pixels; a
    numeric raw field refuses bytes."""
    schema = Schema(
        [Field("b", "bytes"), Field("img", "uint8", (4, 4), codec="png"), Field("x", "uint8", (4,))]
    )
    enc = png(smooth((4, 4)))
    with rowstore.Writer(h5path, schema) as w:
        w.write(
            {
                "b": enc,
                "img": np.frombuffer(smooth((4, 4)).tobytes(), np.uint8).reshape(4, 4),
                "x": np.zeros(4, np.uint8),
            }
        )
        with pytest.raises(RowValidationError, match="field 'x'"):
            w.write({"b": enc, "img": enc, "x": b"\x00" * 4})
        with pytest.raises(RowValidationError, match="field 'img'"):
            w.write({"b": enc, "img": np.frombuffer(enc, np.uint8), "x": np.zeros(4, np.uint8)})
    with rowstore.open(h5path) as r:
        assert r[0]["b"] == enc


def test_batch_arrays_encoded_on_threads_same_bytes(tmp_path):
    """Arrays of a batch are encoded on the writer's threads: the same bytes as on one, in
    row order, bytes given encoded kept as they are among them."""
    imgs = [smooth((16, 20, 3)) + i for i in range(9)]
    given = png(imgs[4], level=9)
    cells = imgs[:4] + [given] + imgs[5:]
    schema = Schema([Field("img", "uint8", (16, 20, 3), codec="png"), Field("i", "int64", ())])
    for threads in (1, 4):
        with rowstore.Writer(tmp_path / f"{threads}.h5", schema, threads=threads) as w:
            w.write_batch({"img": list(cells), "i": list(range(9))})
            w.write_batch({"img": [imgs[0], imgs[1]], "i": [9, 10]})
    one, four = (stored_payloads(tmp_path / f"{t}.h5", "img") for t in (1, 4))
    assert one == four and four[4] == given
    assert four[0] == png(imgs[0]) and len(four) == 11


# -- damaged images: stored as they came (only the header is checked), refused when read ---------
def _photo(shape, seed=0):
    """Smooth content with noise, so that a JPEG of it has a long scan to damage."""
    rng = np.random.default_rng(seed)
    return np.clip(smooth(shape).astype(int) + rng.integers(-20, 20, shape), 0, 255).astype(
        np.uint8
    )


def _refused(call, row, field="img"):
    with pytest.raises(rowstore.RowstoreError) as ei:
        call()
    e = ei.value
    assert (e.field, e.row) == (field, row), e
    assert f"row {row}" in str(e) and repr(field) in str(e)


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
@pytest.mark.parametrize("shape", [(48, 64, 3), (None, None, 3)], ids=["fixed", "variable"])
def test_damaged_jpegs_are_refused_on_every_read_path(tmp_path, progressive, shape):
    """A cut scan, a missing end marker, an inserted run of zeros: libjpeg decodes each with a
    warning and made-up grey pixels. ``r[i]``, ``take`` and ``batches``, without and with an
    image op, refuse them: an error naming the field and the row."""
    from rowstore.reader.image_ops import Resize

    good = pil_bytes(_photo((48, 64, 3)), "JPEG", quality=90, progressive=progressive)
    cells = [good]
    for b in damaged_jpegs(good).values():
        cells += [b, good]
    path = tmp_path / "damaged.h5"
    schema = Schema([Field("img", "uint8", shape, codec="jpeg"), Field("id", "int64", ())])
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"img": cells, "id": list(range(len(cells)))})
    with rowstore.open(path) as r:
        for row in range(1, len(cells), 2):
            _refused(lambda row=row: r[row], row)
            _refused(lambda row=row: r.take([row - 1, row]), row)
        _refused(lambda: list(r.batches(2, shuffle="none")), 1)
        _refused(lambda: list(r.batches(2, shuffle="none", decode={"img": Resize(16)})), 1)
        for row in range(0, len(cells), 2):
            assert np.array_equal(r[row]["img"], ic.jpeg8_decode(good))


def test_lying_and_huge_jpegs_are_refused_before_their_memory_is_touched(tmp_path):
    """A 64 x 64 JPEG whose frame header says 8000 x 8000 and a valid 14000 x 14000 progressive
    JPEG (1.1 MB; libjpeg would hold 1.2 GB of coefficients) in a variable-shape field: read
    back, each is an error naming field and row, and the reading process's peak memory stays
    where it was (the output array the stored shape sizes is allocated, never filled)."""
    got = peak_rss_mb(
        f"""
        import imagecodecs, rowstore
        from damaged_images import flat_progressive_jpeg, sof_lies
        from rowstore import Field, Schema
        small = imagecodecs.jpeg8_encode(np.full((64, 64, 3), 90, np.uint8))
        cells = [small, sof_lies(small), flat_progressive_jpeg(14000, 14000, 3)]
        path = {str(tmp_path / "big.h5")!r}
        schema = Schema([Field("img", "uint8", (None, None, 3), codec="jpeg")])
        with rowstore.Writer(path, schema) as w:
            w.write_batch({{"img": cells}})
        with rowstore.open(path) as r:
            r[0]
            mark()
            for row in (1, 2):
                try:
                    r[row]
                except rowstore.RowstoreError as e:
                    result[str(row)] = [e.field, e.row, str(e)]
        """
    )
    assert got["1"][:2] == ["img", 1] and "damaged" in got["1"][2], got
    assert got["2"][:2] == ["img", 2] and "too large" in got["2"][2], got
    assert got["delta"] < 64, got


def test_a_jpeg_header_is_checked_against_the_output_before_decoding():
    from rowstore.codecs.image import Jpeg

    small = jpg(_photo((64, 64, 3)))
    with pytest.raises(rowstore.CodecError, match="8000x8000x3, expected uint8"):
        Jpeg().decode_into(sof_lies(small), np.empty((64, 64, 3), np.uint8))
    with pytest.raises(rowstore.CodecError, match="64x64x3, expected"):
        Jpeg().decode_into(small, np.empty((64, 65), np.uint8))
    out = np.empty((64, 64, 3), np.uint8)[:, ::-1]  # a strided out: decoded, then copied
    Jpeg().decode_into(small, out)
    assert np.array_equal(out, ic.jpeg8_decode(small))


@pytest.mark.parametrize(
    "name,data", list(_png_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_check_png_passes_every_kind_of_valid_png(name, data):
    check_png(data)
    for bad in damaged_pngs(data).values():
        with pytest.raises(rowstore.CodecError, match="png payload does not decode"):
            check_png(bad)


def test_verify_image_decodes_in_full_and_refuses_damage():
    good_jpg = pil_bytes(_photo((48, 64, 3)), "JPEG", quality=90, progressive=True)
    good_png = png(smooth((9, 13, 3)))
    assert verify_image(good_jpg) == jpeg_header(good_jpg)
    assert verify_image(memoryview(good_png)) == png_header(good_png)
    for bad in [*damaged_jpegs(good_jpg).values(), *damaged_pngs(good_png).values()]:
        with pytest.raises(rowstore.CodecError, match="does not decode"):
            verify_image(bad)
    with pytest.raises(rowstore.CodecError, match="not a valid image"):
        verify_image(b"GIF89a" + bytes(20))
    with pytest.raises(rowstore.CodecError, match="over 1000"):
        verify_image(good_jpg, max_bytes=1000)


def test_verify_encoded_refuses_a_damaged_jpeg(h5path):
    good = jpg(_photo((48, 64, 3)))
    schema = Schema([Field("img", "uint8", (48, 64, 3), codec="jpeg")])
    with rowstore.Writer(h5path, schema, verify_encoded=True) as w:
        w.write({"img": good})
        for bad in damaged_jpegs(good).values():
            with pytest.raises(RowValidationError, match="does not decode") as e:
                w.write_batch({"img": [good, bad]})  # refused whole: the next starts at row 1
            assert (e.value.field, e.value.row) == ("img", 2)
