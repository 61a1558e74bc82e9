"""The PNG batch-decode kernel (``kernels.png_decode_batch``) and the reader's use of it: the
bytes it returns are libpng's (imagecodecs) for every PNG the ``png`` codec writes and every
filter type, PIL's ``convert`` for every other kind converted to the output's channels
(palette, transparency, low bit depths, grey for RGB), anything else is left to the codec
(interlacing, another size, damaged bytes), hostile chunks (a palette index past the palette,
a PLTE of a bad length or after the data) are refused, a corrupt stored image (also one libpng
would only warn about) is a FormatError naming field and row on every read path, and threads
decode disjoint ranges of one batch."""

from __future__ import annotations

import re
import struct
import threading
import zlib

import numpy as np
import pytest
from damaged_images import damaged_pngs

import rowstore
from rowstore import kernels
from rowstore.errors import FormatError, RowstoreError
from rowstore.reader import _decode
from rowstore.schema import Field, Schema

imagecodecs = pytest.importorskip("imagecodecs")


# -- PNGs built by hand: every filter type, any chunking ------------------------------------------
def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _filter_row(f: int, row: np.ndarray, up: np.ndarray, bpp: int) -> np.ndarray:
    x, b = row.astype(np.int64), up.astype(np.int64)
    a = np.concatenate([np.zeros(bpp, np.int64), x[:-bpp]])
    c = np.concatenate([np.zeros(bpp, np.int64), b[:-bpp]])
    if f == 0:
        pred = np.zeros_like(x)
    elif f == 1:
        pred = a
    elif f == 2:
        pred = b
    elif f == 3:
        pred = (a + b) // 2
    else:
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    return ((x - pred) % 256).astype(np.uint8)


def make_png(
    img: np.ndarray, filters, *, idat_size: int = 50, extra: bytes = b"", level: int = 6
) -> bytes:
    """A PNG of ``img`` (uint8/uint16, HxW or HxWxC) whose row r uses filter ``filters[r %
    len]``."""
    h, w = img.shape[:2]
    c = img.shape[2] if img.ndim == 3 else 1
    depth = 8 * img.dtype.itemsize
    ctype = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    rows = img.astype(img.dtype.newbyteorder(">")).reshape(h, -1).view(np.uint8).reshape(h, -1)
    bpp = c * img.dtype.itemsize
    up = np.zeros(rows.shape[1], np.uint8)
    raw = bytearray()
    for r in range(h):
        f = filters[r % len(filters)]
        raw.append(f)
        raw += _filter_row(f, rows[r], up, bpp).tobytes()
        up = rows[r]
    z = zlib.compress(bytes(raw), level)
    out = (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
        + extra
    )
    for a in range(0, len(z), idat_size):
        out += _chunk(b"IDAT", z[a : a + idat_size])
    return out + _chunk(b"IEND", b"")


def decode(pngs: list[bytes], shape, dtype, *, nulls=None, lo=0, hi=None, scale16=False):
    data = np.frombuffer(b"".join(pngs), np.uint8) if pngs else np.zeros(0, np.uint8)
    offs = np.zeros(len(pngs) + 1, np.int64)
    np.cumsum([len(p) for p in pngs], out=offs[1:])
    out = np.zeros((len(pngs),) + tuple(shape), dtype)
    status = np.full(len(pngs), 255, np.uint8)
    left = kernels.png_decode_batch(
        data, offs, nulls, out, lo, len(pngs) if hi is None else hi, status, scale16=scale16
    )
    return out, status, left


def reference(png: bytes, shape) -> np.ndarray:
    return imagecodecs.png_decode(png).reshape(shape)


def _img(rng, shape, dtype, smooth=False):
    if smooth:
        base = np.add.outer(np.arange(shape[0]), np.arange(shape[1])) * 3
        base = base.reshape(shape[:2] + (1,) * (len(shape) - 2))
        return ((base + rng.integers(0, 8, shape)) % np.iinfo(dtype).max).astype(dtype)
    return rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


SHAPES = [(1, 1), (5, 7), (5, 7, 1), (6, 3, 2), (9, 11, 3), (4, 13, 4), (17, 2, 3)]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_filter_type_decodes_to_libpngs_bytes(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    imgs = [_img(rng, shape, dtype, smooth=k % 2 == 1) for k in range(6)]
    filter_sets = [[0], [1], [2], [3], [4], [4, 3, 2, 1, 0]]
    pngs = [
        make_png(im, fs, idat_size=7 + 13 * k) for k, (im, fs) in enumerate(zip(imgs, filter_sets))
    ]
    out, status, left = decode(pngs, shape, dtype)
    assert left == 0 and not status.any()
    for k, png in enumerate(pngs):
        assert np.array_equal(out[k], imgs[k])
        assert out[k].tobytes() == reference(png, shape).tobytes()


@pytest.mark.parametrize("level", [0, 1, 6, 9])
@pytest.mark.parametrize(
    "dtype,shape",
    [
        (np.uint8, (32, 48, 3)),
        (np.uint8, (20, 20)),
        (np.uint16, (16, 24, 4)),
        (np.uint8, (40, 8, 2)),
        (np.uint16, (9, 9)),
    ],
)
def test_the_codecs_own_pngs_at_every_level(level, dtype, shape):
    rng = np.random.default_rng(level)
    f = Field("v", np.dtype(dtype).name, shape, codec={"id": "png", "level": level})
    imgs = [_img(rng, shape, dtype, smooth=k % 2 == 0) for k in range(4)]
    pngs = [bytes(f.codec_obj.encode(im, f)) for im in imgs]
    out, status, left = decode(pngs, shape, dtype)
    assert left == 0
    for k in range(4):
        assert out[k].tobytes() == imgs[k].tobytes() == reference(pngs[k], shape).tobytes()


def test_pil_written_pngs_decode_identically():
    Image = pytest.importorskip("PIL.Image")
    import io

    rng = np.random.default_rng(3)
    for mode, shape in (
        ("RGB", (21, 34, 3)),
        ("RGBA", (8, 9, 4)),
        ("L", (30, 5)),
        ("LA", (7, 7, 2)),
    ):
        img = _img(rng, shape, np.uint8, smooth=True)
        buf = io.BytesIO()
        Image.fromarray(img, mode).save(buf, format="PNG", optimize=True)
        out, status, left = decode([buf.getvalue()], shape, np.uint8)
        assert left == 0 and np.array_equal(out[0], img)


def test_kinds_it_leaves_to_the_reference_decoder():
    Image = pytest.importorskip("PIL.Image")
    import io

    rng = np.random.default_rng(4)
    img = _img(rng, (6, 5, 3), np.uint8)

    def pil(im, **kw):
        buf = io.BytesIO()
        im.save(buf, format="PNG", **kw)
        return buf.getvalue()

    palette = pil(Image.fromarray(img).convert("P"))
    trns = pil(Image.fromarray(img), transparency=(1, 2, 3))
    other_size = make_png(_img(rng, (6, 6, 3), np.uint8), [1])
    grey_for_rgb = make_png(img[..., 0], [1])
    interlaced = bytearray(make_png(img, [0]))
    interlaced[28] = 1  # IHDR interlace byte (the CRC fixed below)
    interlaced[29:33] = struct.pack(">I", zlib.crc32(bytes(interlaced[12:29])))
    out, status, left = decode(
        [palette, trns, other_size, grey_for_rgb, bytes(interlaced)], (6, 5, 3), np.uint8
    )
    assert left == 2 and status.tolist() == [0, 0, kernels.PNG_UNSUPPORTED, 0, 1]
    for k, p in ((0, palette), (1, trns), (3, grey_for_rgb)):  # converted as PIL converts
        assert np.array_equal(out[k], np.asarray(Image.open(io.BytesIO(p)).convert("RGB")))
    # no rule for 16-bit into 8-bit samples, 8-bit into 16; tRNS into an alpha channel
    g16 = make_png(_img(rng, (6, 5), np.uint16), [1])
    _, status, _ = decode([g16], (6, 5), np.uint8)
    assert status.tolist() == [kernels.PNG_UNSUPPORTED]
    out, status, _ = decode([g16], (6, 5), np.uint8, scale16=True)
    assert status.tolist() == [0] and np.array_equal(out[0], imagecodecs.png_decode(g16) >> 8)
    _, status, _ = decode([grey_for_rgb], (6, 5), np.uint16)
    assert status.tolist() == [kernels.PNG_UNSUPPORTED]
    _, status, _ = decode([trns, palette], (6, 5, 4), np.uint8)
    assert status.tolist() == [kernels.PNG_UNSUPPORTED] * 2


def _hand_png(ihdr: bytes, *chunks: tuple[bytes, bytes]) -> bytes:
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + b"".join(_chunk(k, d) for k, d in chunks)
        + _chunk(b"IEND", b"")
    )


def test_hostile_palette_and_low_depth_pngs():
    """Palette indices past the palette, a PLTE of a bad length, after the data, or missing
    are PNG_CORRUPT (never a read past the palette); 1-, 2- and 4-bit rows of widths not a
    multiple of 8 unpack as libpng expands them."""
    w, h = 5, 3
    ihdr = struct.pack(">IIBBBBB", w, h, 2, 3, 0, 0, 0)  # 2-bit palette
    raw = b"".join(b"\x00" + bytes([0b00011011, 0b01000000]) for _ in range(h))  # 0,1,2,3,1
    z = zlib.compress(raw)
    pal3 = bytes(range(9))  # 3 entries: index 3 is past it
    cases = {
        "index past the palette": _hand_png(ihdr, (b"PLTE", pal3), (b"IDAT", z)),
        "PLTE not of whole entries": _hand_png(ihdr, (b"PLTE", bytes(13)), (b"IDAT", z)),
        "PLTE over 256 entries": _hand_png(ihdr, (b"PLTE", bytes(771)), (b"IDAT", z)),
        "PLTE after the data": _hand_png(ihdr, (b"IDAT", z), (b"PLTE", bytes(12))),
        "no PLTE": _hand_png(ihdr, (b"IDAT", z)),
    }
    _, status, left = decode(list(cases.values()), (h, w, 3), np.uint8)
    assert left == len(cases) and (status == kernels.PNG_CORRUPT).all(), dict(zip(cases, status))
    pal4 = bytes(range(12))
    ok = _hand_png(ihdr, (b"PLTE", pal4), (b"IDAT", z))
    out, status, _ = decode([ok], (h, w, 3), np.uint8)
    want = np.frombuffer(pal4, np.uint8).reshape(4, 3)[[0, 1, 2, 3, 1]]
    assert status[0] == 0 and (out[0] == want).all()
    for depth in (1, 2, 4):
        rng = np.random.default_rng(depth)
        v = rng.integers(0, 1 << depth, (h, 11))
        rows = np.packbits(
            ((v[..., None] >> np.arange(depth)[::-1]) & 1).reshape(h, -1).astype(np.uint8),
            axis=1,
        )
        z = zlib.compress(b"".join(b"\x00" + r.tobytes() for r in rows))
        grey = _hand_png(struct.pack(">IIBBBBB", 11, h, depth, 0, 0, 0, 0), (b"IDAT", z))
        out, status, _ = decode([grey], (h, 11), np.uint8)
        assert status[0] == 0 and np.array_equal(out[0], imagecodecs.png_decode(grey)), depth
        assert np.array_equal(out[0], v * (255 // ((1 << depth) - 1)))


def _corruptions(png: bytes):
    """Damaged versions of ``png``: truncated, a flipped byte anywhere, a bad IDAT stream with
    valid CRCs, a huge chunk length, extra data after the stream, a bad filter byte."""
    yield b""
    yield png[:8]
    yield png[: len(png) // 2]
    yield png[:-12]  # no IEND
    for pos in range(0, len(png), 5):
        b = bytearray(png)
        b[pos] ^= 0x5A
        yield bytes(b)
    ihdr_end = 33
    z_ok = zlib.decompress(b"".join(_idats(png)))
    for bad in (
        zlib.compress(z_ok + b"\x00" * 10),
        zlib.compress(z_ok[:-3]),
        b"\x78\x9c" + bytes(40),
        zlib.compress(bytes([7]) + z_ok[1:]),
    ):
        yield png[:ihdr_end] + _chunk(b"IDAT", bad) + _chunk(b"IEND", b"")
    yield png[:ihdr_end] + struct.pack(">I", 0x7FFFFFF0) + b"IDAT" + bytes(16)


def _idats(png: bytes):
    pos = 8
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos : pos + 4])
        if png[pos + 4 : pos + 8] == b"IDAT":
            yield png[pos + 8 : pos + 8 + n]
        pos += 12 + n


def test_damaged_pngs_are_refused_or_decode_exactly_as_libpng():
    rng = np.random.default_rng(5)
    img = _img(rng, (7, 9, 3), np.uint8, smooth=True)
    png = make_png(img, [4, 1, 3], idat_size=40)
    bad = list(_corruptions(png))
    out, status, left = decode(bad, img.shape, np.uint8)
    for k, b in enumerate(bad):
        if status[k] == kernels.PNG_OK:
            # Decoded anyway (a flipped bit in an ancillary field such as IHDR's... none here):
            # then it must be exactly what libpng makes of it.
            assert out[k].tobytes() == reference(b, img.shape).tobytes()
        else:
            assert status[k] in (kernels.PNG_CORRUPT, kernels.PNG_UNSUPPORTED)
    assert left == int((status != 0).sum()) >= len(bad) - 2


def test_ranges_nulls_and_argument_checks():
    rng = np.random.default_rng(6)
    imgs = [_img(rng, (4, 4, 3), np.uint8) for _ in range(5)]
    pngs = [make_png(im, [2]) for im in imgs]
    nulls = np.array([False, True, False, False, False])
    out, status, left = decode(pngs, (4, 4, 3), np.uint8, nulls=nulls, lo=1, hi=4)
    assert left == 0
    assert not out[0].any() and not out[1].any() and not out[4].any()  # outside the range, or null
    assert np.array_equal(out[2], imgs[2]) and np.array_equal(out[3], imgs[3])
    data = np.frombuffer(b"".join(pngs), np.uint8)
    offs = np.zeros(6, np.int64)
    np.cumsum([len(p) for p in pngs], out=offs[1:])
    st = np.zeros(5, np.uint8)
    with pytest.raises(ValueError):
        kernels.png_decode_batch(
            data, offs, None, np.zeros((4, 4, 4, 3), np.uint8), 0, 5, st
        )  # out too small
    with pytest.raises(ValueError):
        kernels.png_decode_batch(
            data, offs, None, np.zeros((5, 4, 4, 3), np.uint8), 0, 6, st
        )  # range past n
    bad_offs = offs.copy()
    bad_offs[3] = len(data) + 100
    with pytest.raises(ValueError):
        kernels.png_decode_batch(data, bad_offs, None, np.zeros((5, 4, 4, 3), np.uint8), 0, 5, st)
    with pytest.raises(ValueError):
        kernels.png_decode_batch(data, offs, None, np.zeros((5, 4, 4, 3), np.float32), 0, 5, st)


def test_threads_decode_disjoint_ranges_of_one_batch():
    rng = np.random.default_rng(7)
    imgs = [_img(rng, (24, 24, 3), np.uint8, smooth=True) for _ in range(64)]
    pngs = [make_png(im, [k % 5]) for k, im in enumerate(imgs)]
    data = np.frombuffer(b"".join(pngs), np.uint8)
    offs = np.zeros(65, np.int64)
    np.cumsum([len(p) for p in pngs], out=offs[1:])
    out = np.zeros((64, 24, 24, 3), np.uint8)
    status = np.zeros(64, np.uint8)
    left = []
    ts = [
        threading.Thread(
            target=lambda a=a: left.append(
                kernels.png_decode_batch(data, offs, None, out, a, a + 16, status)
            )
        )
        for a in range(0, 64, 16)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert left == [0] * 4 and np.array_equal(out, np.stack(imgs))


# -- through the reader -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pngk") / "img.h5")
    schema = Schema(
        [
            Field("img", "uint8", (12, 10, 3), codec={"id": "png", "level": 1}),
            Field("g16", "uint16", (6, 5), codec="png", nullable=True),
            Field("id", "int64"),
        ]
    )
    rng = np.random.default_rng(8)
    n = 120
    imgs = np.stack([_img(rng, (12, 10, 3), np.uint8, smooth=k % 3 == 0) for k in range(n)])
    g16 = [None if k % 7 == 3 else _img(rng, (6, 5), np.uint16) for k in range(n)]
    with rowstore.Writer(path, schema, rows_per_block=16) as w:
        for k in range(n):
            w.write({"img": imgs[k], "g16": g16[k], "id": k})
    return path, imgs, g16


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_reader_batches_equal_the_codec_path(image_file, threads, monkeypatch):
    path, imgs, g16 = image_file
    with rowstore.open(path) as r:
        got = list(r.batches(32, shuffle="block", seed=1, num_threads=threads))
        monkeypatch.setattr(_decode, "PNG_KERNEL", False)
        ref = list(r.batches(32, shuffle="block", seed=1, num_threads=threads))
    for a, b in zip(got, ref, strict=True):
        assert np.array_equal(a["img"], b["img"]) and np.array_equal(a["g16"], b["g16"])
        assert np.array_equal(a["img"], imgs[a["id"]])
        for k, i in enumerate(a["id"]):
            assert bool(a["g16__null"][k]) == (g16[i] is None)
            assert np.array_equal(
                a["g16"][k], np.zeros((6, 5), np.uint16) if g16[i] is None else g16[i]
            )


def test_take_into_out_and_a_strided_out(image_file):
    path, imgs, _ = image_file
    with rowstore.open(path) as r:
        out = {"img": np.zeros((10, 12, 10, 3), np.uint8)}
        r.take(np.arange(20, 30), fields=["img"], out=out)
        assert np.array_equal(out["img"], imgs[20:30])
        assert np.array_equal(r.take([5, 99, 0])["img"], imgs[[5, 99, 0]])


def test_pngs_of_another_kind_in_a_file_read_the_same(tmp_path, monkeypatch):
    """A file of palette PNGs (as another writer might store) reads the same as its RGB
    images, through the kernel (which converts palettes) and through imagecodecs."""
    Image = pytest.importorskip("PIL.Image")
    import io

    from rowstore.codecs.image import Png

    def palette_png(self, value, field):
        colours, index = np.unique(value.reshape(-1, 3), axis=0, return_inverse=True)
        im = Image.fromarray(index.reshape(value.shape[:2]).astype(np.uint8), "P")
        im.putpalette(colours.astype(np.uint8).reshape(-1).tolist())
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        return buf.getvalue()

    rng = np.random.default_rng(9)
    imgs = rng.integers(0, 4, (20, 5, 6, 3), dtype=np.uint8) * 60  # few colours: exact in a palette
    path = str(tmp_path / "pal.h5")
    monkeypatch.setattr(Png, "encode", palette_png)
    with rowstore.Writer(path, Schema([Field("img", "uint8", (5, 6, 3), codec="png")])) as w:
        w.write_batch({"img": imgs})
    monkeypatch.undo()
    with rowstore.open(path) as r:
        got = np.concatenate([b["img"] for b in r.batches(8, shuffle="none", num_threads=2)])
        assert np.array_equal(got, imgs)
        monkeypatch.setattr(_decode, "PNG_KERNEL", False)
        got = np.concatenate([b["img"] for b in r.batches(8, shuffle="none", num_threads=2)])
    assert np.array_equal(got, imgs)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_corrupt_image_is_a_format_error_naming_field_and_row(tmp_path, threads):
    path = str(tmp_path / "bad.h5")
    rng = np.random.default_rng(10)
    imgs = [_img(rng, (16, 16, 3), np.uint8) for _ in range(40)]
    with rowstore.Writer(
        path, Schema([Field("img", "uint8", (16, 16, 3), codec="png"), Field("id", "int64")])
    ) as w:
        for k, im in enumerate(imgs):
            w.write({"img": im, "id": k})
    # Damage the IDAT data of one image (the 23rd PNG in the heap), past its chunk CRC.
    with open(path, "rb") as fh:
        data = fh.read()
    starts = [m.start() for m in re.finditer(re.escape(b"\x89PNG\r\n"), data)]
    assert len(starts) == 40
    pos = starts[23] + 60
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(bytes([data[pos] ^ 0xFF]))
    with rowstore.open(path, verify=False) as r:
        with pytest.raises(FormatError) as ei:
            for _ in r.batches(16, shuffle="none", num_threads=threads):
                pass
        e = ei.value
        assert isinstance(e, RowstoreError) and e.field == "img" and e.row == 23
        assert "'img'" in str(e) and "row 23" in str(e)
        assert np.array_equal(r.take([22])["img"][0], imgs[22])


# -- what libpng only warns about is damage too, on every read path -------------------------------
def _palette_png(img: np.ndarray) -> bytes:
    """A palette PNG of ``img`` (at most 256 colours), which the kernel leaves to the codec."""
    Image = pytest.importorskip("PIL.Image")
    import io

    colours, index = np.unique(img.reshape(-1, 3), axis=0, return_inverse=True)
    im = Image.fromarray(index.reshape(img.shape[:2]).astype(np.uint8), "P")
    im.putpalette(colours.astype(np.uint8).reshape(-1).tolist())
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def test_the_kernel_refuses_what_libpng_only_warns_about():
    """Bytes after the zlib stream, more image data than the size needs, an ancillary chunk's
    CRC, no IEND, image data split around another chunk: libpng warns and returns the image;
    the kernel says PNG_CORRUPT, of the PNGs it decodes as they are and of the ones it
    converts (palette)."""
    rng = np.random.default_rng(11)
    img = _img(rng, (12, 10, 3), np.uint8, smooth=True)
    bad = damaged_pngs(make_png(img, [1], idat_size=1 << 20))
    out, status, left = decode(list(bad.values()), img.shape, np.uint8)
    assert left == len(bad) and (status == kernels.PNG_CORRUPT).all(), dict(zip(bad, status))
    pal = damaged_pngs(_palette_png(img))
    _, status, _ = decode(list(pal.values()), img.shape, np.uint8)
    assert (status == kernels.PNG_CORRUPT).all(), dict(zip(pal, status))


@pytest.mark.parametrize("kind", ["rgb", "palette"])  # the kernel's PNGs; the codec's (libpng's)
@pytest.mark.parametrize("shape", [(12, 10, 3), (None, None, 3)])
def test_damaged_pngs_are_refused_on_every_read_path(tmp_path, monkeypatch, kind, shape):
    """Every damaged PNG of ``damaged_pngs`` stored (only the header is checked at write time)
    is refused by ``r[i]``, ``take`` and ``batches``, with or without the PNG kernel: a
    FormatError naming the field and the row, never libpng's image of a damaged file."""
    rng = np.random.default_rng(12)
    img = (rng.integers(0, 4, (12, 10, 3)) * 60).astype(np.uint8)  # exact in a palette
    good = make_png(img, [1]) if kind == "rgb" else _palette_png(img)
    bad = damaged_pngs(good)
    cells = [good]
    for b in bad.values():
        cells += [b, good]
    path = str(tmp_path / "damaged.h5")
    schema = Schema([Field("img", "uint8", shape, codec="png"), Field("id", "int64")])
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"img": cells, "id": list(range(len(cells)))})

    def refused(call, row):
        with pytest.raises(FormatError) as ei:
            call()
        e = ei.value
        assert isinstance(e, RowstoreError) and (e.field, e.row) == ("img", row), e
        assert f"row {row}" in str(e) and "'img'" in str(e)

    for kernel in (True, False):
        monkeypatch.setattr(_decode, "PNG_KERNEL", kernel)
        with rowstore.open(path) as r:
            for row in range(1, len(cells), 2):
                refused(lambda row=row: r[row], row)
                refused(lambda row=row: r.take([row - 1, row]), row)
            refused(lambda r=r: list(r.batches(4, shuffle="none")), 1)
            goods = r.take(np.arange(0, len(cells), 2))["img"]
            assert all(np.array_equal(g, img) for g in goods)
