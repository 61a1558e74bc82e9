"""The JPEG batch kernels: ``kernels.jpeg_decode_batch``'s geometry is
``image_ops.crop_params`` exactly, its pixels are within a few levels of the reference
(imagecodecs decode of the whole image, crop, PIL's bilinear resize) at every DCT scale, for
RGB and grayscale of any size; ``kernels.jpeg_decode_whole`` decodes libjpeg's pixels; damaged
payloads get a status (never a crash, never concealed pixels); libjpeg's memory is bounded
before a hostile or huge progressive image can size it; the kernels check their own
arguments; threads decoding disjoint ranges give one call's bytes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from damaged_images import (
    damaged_jpegs,
    flat_progressive_jpeg,
    peak_rss_mb,
    progressive_coefficient_bytes,
    sof_lies,
)

from rowstore import kernels
from rowstore.reader import image_ops as io

imagecodecs = pytest.importorskip("imagecodecs")
Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.skipif(not kernels.JPEG_AVAILABLE, reason="built without jpeglib.h")

BASE = 0x1234_5678_9ABC_DEF0
# Pillow 13 runs the vertical pass first when an image loses more than twice as many rows as
# columns: the kernel and the reference follow it
PILLOW_13 = int(Image.__version__.split(".")[0]) >= 13


def photo(rng, h, w, c=3, noise=6.0):
    """Smooth content plus noise, like a photograph (what JPEG is for)."""
    y, x = np.mgrid[0:h, 0:w]
    fx, fy = rng.uniform(15, 60, 2)
    chans = [
        128 + 90 * np.sin(x / fx + k) * np.cos(y / fy - k) + 20 * np.sin((x + y) / 9.0)
        for k in range(c)
    ]
    a = np.stack(chans, -1) + rng.normal(0, noise, (h, w, c))
    a = np.clip(a, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(a[..., 0]) if c == 1 else a


def batch(payloads):
    data = np.frombuffer(b"".join(payloads), np.uint8)
    offsets = np.zeros(len(payloads) + 1, np.int64)
    offsets[1:] = np.cumsum([len(p) for p in payloads])
    return data, offsets


def decode(payloads, op, channels=3, rows=None, nulls=None, lo=0, hi=None):
    data, offsets = batch(payloads)
    n = len(payloads)
    rows = np.arange(n, dtype=np.int64) if rows is None else rows
    out = np.full((n, *op.size, channels) if channels == 3 else (n, *op.size), 77, np.uint8)
    status = np.zeros(n, np.uint8)
    info = np.zeros((n, kernels.JPEG_INFO), np.float64)
    failed = kernels.jpeg_decode_batch(
        data,
        offsets,
        nulls,
        rows,
        BASE,
        out,
        lo,
        n if hi is None else hi,
        status,
        info=info,
        **op.kernel_args(),
    )
    return out, status, info, failed


OPS = [
    io.RandomResizedCrop(64),
    io.RandomResizedCrop((48, 80), scale=(0.3, 0.9), ratio=(0.5, 2.0), flip=1.0),
    io.CenterCrop(56, fraction=0.875),
    io.CenterCrop((40, 72)),
    io.Resize((50, 30)),
    io.Resize(200, flip=True),  # upscaling the small images
]


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("op", OPS, ids=repr)
def test_kernel_matches_the_reference(op, channels):
    rng = np.random.default_rng(hash((repr(op), channels)) % 2**32)
    sizes = [(int(rng.integers(20, 700)), int(rng.integers(20, 700))) for _ in range(10)]
    sizes += [(1, 1), (9, 700), (1100, 800)]  # degenerate, a thin strip, DCT scale 1/8
    imgs = [photo(rng, h, w, channels) for h, w in sizes]
    payloads = [imagecodecs.jpeg8_encode(a, level=int(rng.integers(70, 96))) for a in imgs]
    out, status, info, failed = decode(payloads, op, channels)
    assert failed == 0 and not status.any()
    for i, p in enumerate(payloads):
        ref, params = io.decode_reference(op, p, io.row_key(BASE, i), channels)
        ref = ref.reshape(out[i].shape)
        assert tuple(info[i, :2]) == sizes[i]
        assert tuple(info[i, 2:7]) == tuple(float(v) for v in params), i
        d = np.abs(ref.astype(np.int64) - out[i])
        # the kernel's DCT scaling averages a little differently from the filter
        assert d.mean() < 1.5 and np.percentile(d, 99) <= 8 and d.max() <= 24, (i, info[i])
    # the DCT scale: the smallest that keeps the crop at or above the output size
    for i in range(len(payloads)):
        ch, cw, den = info[i, 4], info[i, 5], info[i, 7]
        assert den in (1, 2, 4, 8)
        assert ch >= op.size[0] * den and cw >= op.size[1] * den or den == 1
        assert den == 8 or ch < op.size[0] * den * 2 or cw < op.size[1] * den * 2


def test_reference_resize_is_pils_bilinear():
    rng = np.random.default_rng(3)
    for _ in range(20):
        h, w = (int(v) for v in rng.integers(5, 300, 2))
        a = photo(rng, h, w)
        ch, cw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        y0, x0 = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        size = (int(rng.integers(1, 120)), int(rng.integers(1, 120)))
        pil = Image.fromarray(a).resize(size[::-1], Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        ours = io.resize_reference(a, (y0, x0, ch, cw), size)
        # Pillow's fixed-point arithmetic and (since Pillow 13) its choice of pass order
        assert (np.asarray(pil) == ours).all() or not PILLOW_13, (h, w, size)


@pytest.mark.skipif(not PILLOW_13, reason="Pillow < 13 orders its passes otherwise")
@pytest.mark.parametrize("simd", [True, False])
def test_at_full_scale_the_pixels_are_pils_resize_of_the_box(simd):
    # at DCT scale 1 the kernel decodes libjpeg's pixels and resizes them as PIL's
    # Image.resize(box=..., reducing_gap=None) does (horizontal pass first, the same
    # fixed-point weights and rounding): every byte equal, flipped or not
    rng = np.random.default_rng(12)
    sizes = [(int(rng.integers(60, 600)), int(rng.integers(60, 600))) for _ in range(12)]
    imgs = [photo(rng, h, w) for h, w in sizes]
    payloads = [imagecodecs.jpeg8_encode(a, level=90) for a in imgs]
    ops = [io.RandomResizedCrop(224), io.RandomResizedCrop((48, 80), flip=1.0)]
    ops += [io.CenterCrop(56, fraction=0.875), io.Resize((50, 30), flip=True)]
    checked = 0
    try:
        kernels.jpeg_simd(simd)
        for op in ops:
            out, status, info, _ = decode(payloads, op)
            assert not status.any()
            for i, p in enumerate(payloads):
                if info[i, 7] != 1:
                    continue
                y0, x0, ch, cw, flip = info[i, 2:7]  # CenterCrop's box: fractional
                im = Image.fromarray(imagecodecs.jpeg8_decode(p)).resize(
                    op.size[::-1], Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch),
                    reducing_gap=None,
                )  # fmt: skip
                ref = np.asarray(im.transpose(Image.FLIP_LEFT_RIGHT) if flip else im)
                if isinstance(op, io.CenterCrop):  # a fractional box: the kernel's origin
                    # is the decoded columns' (x0 - xoff), PIL's the image's: the weights may
                    # round apart in their last bit
                    d = np.abs(out[i].astype(int) - ref)
                    assert d.max() <= 1 and d.mean() < 0.05, (op, sizes[i], tuple(info[i]))
                else:
                    assert (out[i] == ref).all(), (op, sizes[i], tuple(info[i]))
                checked += 1
    finally:
        kernels.jpeg_simd(True)
    assert checked >= 15


def test_full_scale_decode_is_the_reference_to_a_level():
    # at DCT scale 1 the kernel decodes what imagecodecs decodes and resizes it as the NumPy
    # reference does
    rng = np.random.default_rng(4)
    payloads = [imagecodecs.jpeg8_encode(photo(rng, 120, 160), level=90) for _ in range(4)]
    for op in (io.Resize((120, 160)), io.CenterCrop((90, 90)), io.RandomResizedCrop(100)):
        out, status, info, _ = decode(payloads, op)
        assert (info[:, 7] == 1).all()
        for i, p in enumerate(payloads):
            ref, _ = io.decode_reference(op, p, io.row_key(BASE, i), 3)
            assert (ref == out[i]).all()
    out, *_ = decode(payloads, io.Resize((120, 160)))
    assert (out[0] == imagecodecs.jpeg8_decode(payloads[0])).all()


@pytest.mark.skipif(not kernels.jpeg_simd(), reason="no AVX2 on this CPU")
@pytest.mark.parametrize("channels", [3, 1])
def test_simd_resize_is_the_plain_c_resize(channels):
    # the AVX2 resize computes the plain C code's integers: every byte equal, for every op,
    # both flips, up- and downscaling, thin strips, copies along an axis and DCT scales
    rng = np.random.default_rng(11 + channels)
    ops = OPS + [
        io.RandomResizedCrop(224),
        io.Resize((7, 3), flip=True),
        io.Resize((1, 1)),
        io.CenterCrop((33, 65), flip=True),
    ]
    sizes = [(int(rng.integers(1, 600)), int(rng.integers(1, 600))) for _ in range(14)]
    sizes += [(1, 1), (9, 700), (1100, 800), (2000, 150), (224, 224), (225, 229)]
    payloads = [imagecodecs.jpeg8_encode(photo(rng, h, w, channels), level=90) for h, w in sizes]
    try:
        for op in ops:
            rows = rng.integers(0, 1 << 40, len(payloads))
            assert kernels.jpeg_simd(True)
            simd, st1, _, _ = decode(payloads, op, channels, rows=rows)
            assert not kernels.jpeg_simd(False)
            plain, st2, _, _ = decode(payloads, op, channels, rows=rows)
            assert not st1.any() and not st2.any()
            bad = [i for i in range(len(payloads)) if not (simd[i] == plain[i]).all()]
            assert not bad, (op, [sizes[i] for i in bad])
    finally:
        kernels.jpeg_simd(True)


def test_parameters_are_a_pure_function_of_the_key():
    rng = np.random.default_rng(5)
    payloads = [imagecodecs.jpeg8_encode(photo(rng, 200, 300), level=90) for _ in range(6)]
    op = io.RandomResizedCrop(32)
    rows = np.array([5, 9, 5, 100, 9, 7], np.int64)
    payloads = [payloads[0]] * 6
    a, _, ia, _ = decode(payloads, op, rows=rows)
    b, _, ib, _ = decode(payloads, op, rows=rows)
    assert (a == b).all() and (ia == ib).all()
    assert (a[0] == a[2]).all() and (a[1] == a[4]).all()  # same row, same crop
    assert not (ia[0, 2:6] == ia[1, 2:6]).all()
    # a draw over many keys: RandomResizedCrop's distribution
    keys = [io.row_key(BASE, r) for r in range(4000)]
    p = np.array([io.crop_params(op, 375, 500, k) for k in keys], float)
    frac = p[:, 2] * p[:, 3] / (375 * 500)
    assert 0.06 < frac.min() and frac.max() <= 1.0 and 0.4 < frac.mean() < 0.6
    assert 0.45 < p[:, 4].mean() < 0.55  # flips
    aspect = p[:, 3] / p[:, 2]
    assert 0.7 < aspect.min() and aspect.max() < 1.43


def test_nulls_are_zeroed_and_ranges_decode_alone():
    rng = np.random.default_rng(6)
    payloads = [imagecodecs.jpeg8_encode(photo(rng, 90, 120), level=90) for _ in range(5)]
    nulls = np.array([0, 1, 0, 0, 1], bool)
    out, status, _, failed = decode(payloads, io.Resize(16), nulls=nulls)
    assert failed == 0 and not status.any()
    assert (out[1] == 0).all() and (out[4] == 0).all() and out[0].any()
    part, _, _, _ = decode(payloads, io.Resize(16), nulls=nulls, lo=1, hi=3)
    assert (part[1:3] == out[1:3]).all()
    assert (part[0] == 77).all() and (part[3:] == 77).all()  # outside the range: untouched


def test_threads_on_disjoint_ranges_equal_one_call():
    rng = np.random.default_rng(7)
    payloads = [
        imagecodecs.jpeg8_encode(photo(rng, int(h), int(w)), level=90)
        for h, w in rng.integers(50, 400, (24, 2))
    ]
    op = io.RandomResizedCrop(40)
    whole, *_ = decode(payloads, op)
    data, offsets = batch(payloads)
    out = np.zeros_like(whole)
    status = np.zeros(len(payloads), np.uint8)
    rows = np.arange(len(payloads), dtype=np.int64)

    def run(lo, hi):
        kernels.jpeg_decode_batch(
            data, offsets, None, rows, BASE, out, lo, hi, status, **op.kernel_args()
        )

    ts = [threading.Thread(target=run, args=(i, i + 6)) for i in range(0, 24, 6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert (out == whole).all() and not status.any()


def damaged(payload: bytes, rng) -> tuple[list[bytes], list[bytes]]:
    """Payloads damaged where every decode reads (the header, the tables), and payloads cut
    in the scan (only a decode reading the rows past the cut can see it)."""
    p = bytearray(payload)
    head = [b"", b"\xff", b"\xff\xd8", b"not a jpeg at all", bytes(rng.integers(0, 256, 999))]
    head += [bytes(p[:n]) for n in (2, 20, 100)]
    sof = payload.find(b"\xff\xc0")
    for patch in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"):  # the frame's size/precision
        q = bytearray(p)
        q[sof + 5 : sof + 9] = patch
        head.append(bytes(q))
    tail = [bytes(p[:n]) for n in (len(p) // 3, len(p) // 2, len(p) - 2)]
    return head, tail


@pytest.mark.parametrize("op", [io.Resize(32), io.CenterCrop(32), io.RandomResizedCrop(32)])
def test_damaged_payloads_get_a_status_never_a_crash(op):
    rng = np.random.default_rng(8)
    good = imagecodecs.jpeg8_encode(photo(rng, 64, 96), level=90)
    head, tail = damaged(good, rng)
    cases = head + tail
    out, status, _, failed = decode([good, *cases, good], op)
    assert status[0] == status[-1] == kernels.JPEG_OK
    assert (status[1 : 1 + len(head)] == kernels.JPEG_CORRUPT).all(), status
    if isinstance(op, io.Resize):  # reads every row, to the end marker: sees every cut
        assert (status[1 + len(head) : -1] == kernels.JPEG_CORRUPT).all(), status
    else:  # a crop above the cut decodes; one that reads past it is refused
        assert set(status[1 + len(head) : -1]) <= {kernels.JPEG_OK, kernels.JPEG_CORRUPT}
    assert failed == np.count_nonzero(status)
    alone, *_ = decode([good, good], op, rows=np.array([0, len(cases) + 1], np.int64))
    assert (out[0] == alone[0]).all() and (out[-1] == alone[1]).all()  # damage stays put
    # random byte damage anywhere: decoded or refused, never a crash
    p = np.frombuffer(good, np.uint8)
    flips = []
    for _ in range(300):
        q = p.copy()
        idx = rng.integers(0, len(q), int(rng.integers(1, 6)))
        q[idx] = rng.integers(0, 256, len(idx))
        flips.append(q.tobytes())
    _, status, _, _ = decode(flips, op)
    assert set(np.unique(status)) <= {kernels.JPEG_OK, kernels.JPEG_CORRUPT, 2}


def test_a_hostile_size_is_refused_before_it_is_allocated():
    rng = np.random.default_rng(9)
    good = imagecodecs.jpeg8_encode(photo(rng, 64, 64), level=90)
    data, offsets = batch([good])
    out = np.zeros((1, 16, 16, 3), np.uint8)
    status = np.zeros(1, np.uint8)
    rows = np.zeros(1, np.int64)
    kernels.jpeg_decode_batch(
        data, offsets, None, rows, 0, out, 0, 1, status, mode="resize", max_bytes=700
    )
    assert status[0] == kernels.JPEG_TOO_LARGE


def test_kernel_checks_its_arguments():
    from rowstore import _jpeg

    rng = np.random.default_rng(10)
    good = imagecodecs.jpeg8_encode(photo(rng, 32, 32), level=90)
    data, offsets = batch([good, good])
    rows = np.zeros(2, np.int64)
    status = np.zeros(2, np.uint8)
    out = np.zeros(2 * 8 * 8 * 3, np.uint8)
    args = dict(
        out_h=8,
        out_w=8,
        channels=3,
        mode=0,
        scale_lo=1.0,
        scale_hi=1.0,
        logr_lo=0.0,
        logr_hi=0.0,
        fraction=1.0,
        flip_p=0.0,
        max_bytes=1 << 20,
        max_work=1 << 24,
    )

    def call(data=data, offsets=offsets, out=out, lo=0, hi=2, **kw):
        a = {**args, **kw}
        return _jpeg.jpeg_decode_batch(
            data,
            offsets,
            None,
            rows,
            0,
            out,
            a["out_h"],
            a["out_w"],
            a["channels"],
            a["mode"],
            a["scale_lo"],
            a["scale_hi"],
            a["logr_lo"],
            a["logr_hi"],
            a["fraction"],
            a["flip_p"],
            a["max_bytes"],
            a["max_work"],
            lo,
            hi,
            status,
            None,
        )

    assert call() == 0
    bad_offsets = offsets.copy()
    bad_offsets[1] = len(data) + 10
    with pytest.raises(ValueError, match="offsets"):
        call(offsets=bad_offsets)
    back = offsets.copy()
    back[1] = -1
    with pytest.raises(ValueError, match="offsets"):
        call(offsets=back)
    with pytest.raises(ValueError, match="out holds"):
        call(out=np.zeros(2 * 8 * 8 * 3 - 1, np.uint8))
    with pytest.raises(ValueError, match="range"):
        call(hi=3)
    with pytest.raises(ValueError, match="channels"):
        call(channels=2)
    with pytest.raises(ValueError, match="mode"):
        call(mode=7)
    with pytest.raises(ValueError, match="scale"):
        call(mode=2, scale_lo=0.0)
    with pytest.raises(ValueError, match="max_bytes"):
        call(max_bytes=0)
    with pytest.raises(ValueError, match="max_work"):
        call(max_work=0)
    with pytest.raises(ValueError, match="mode"):
        kernels.jpeg_decode_batch(
            data, offsets, None, rows, 0, np.zeros((2, 8, 8, 3), np.uint8), 0, 2, status, mode="x"
        )
    with pytest.raises(ValueError, match="out must be"):
        kernels.jpeg_decode_batch(
            data,
            offsets,
            None,
            rows,
            0,
            np.zeros((2, 8, 8, 2), np.uint8),
            0,
            2,
            status,
            mode="resize",
        )


def test_op_declarations_are_checked():
    with pytest.raises(ValueError):
        io.RandomResizedCrop(0)
    with pytest.raises(ValueError):
        io.RandomResizedCrop(224, scale=(0.5, 0.1))
    with pytest.raises(ValueError):
        io.RandomResizedCrop(224, ratio=(0, 1))
    with pytest.raises(ValueError):
        io.CenterCrop(224, fraction=1.5)
    with pytest.raises(ValueError):
        io.Resize(224, flip=2)
    assert io.Resize(7).size == (7, 7) and io.RandomResizedCrop(5).flip == 0.5
    assert io.CenterCrop((3, 4), flip=True).flip == 0.5
    with pytest.raises(TypeError):
        io.check_decode({"image": "RandomResizedCrop"})
    with pytest.raises(TypeError):
        io.check_decode([io.Resize(3)])


@pytest.mark.parametrize("progressive", [False, True])
def test_progressive_and_every_subsampling(progressive):
    """PIL's encoder: baseline and progressive scans, 4:4:4, 4:2:2 and 4:2:0, grey."""
    import io as _io

    rng = np.random.default_rng(11)
    for channels in (3, 1):
        payloads = []
        for sub in (0, 1, 2):
            a = photo(rng, int(rng.integers(100, 900)), int(rng.integers(100, 900)), channels)
            buf = _io.BytesIO()
            Image.fromarray(a).save(
                buf, "JPEG", quality=88, progressive=progressive, subsampling=sub
            )
            payloads.append(buf.getvalue())
        for op in (io.RandomResizedCrop(96), io.CenterCrop(64), io.Resize((70, 50))):
            out, status, _, _ = decode(payloads, op, channels)
            assert not status.any()
            for i, p in enumerate(payloads):
                ref, _ = io.decode_reference(op, p, io.row_key(BASE, i), channels)
                d = np.abs(ref.reshape(out[i].shape).astype(int) - out[i])
                assert d.mean() < 1.5 and d.max() <= 24


# -- the whole decode (the jpeg codec's), damaged bytes and memory ------------------------------
def whole(payloads, shape, *, nulls=None, max_work=kernels.JPEG_MAX_WORK_BYTES):
    data, offsets = batch(payloads)
    out = np.full((len(payloads), *shape), 77, np.uint8)
    status = np.zeros(len(payloads), np.uint8)
    failed = kernels.jpeg_decode_whole(
        data, offsets, nulls, out, 0, len(payloads), status, max_work=max_work
    )
    return out, status, failed


def pil_jpeg(a, **kw) -> bytes:
    import io as _io

    buf = _io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", **kw)
    return buf.getvalue()


@pytest.mark.parametrize("progressive", [False, True])
def test_whole_decode_is_libjpegs_image(progressive):
    """Every subsampling, grey, baseline and progressive: imagecodecs' pixels exactly (both are
    libjpeg-turbo's islow DCT and fancy upsampling)."""
    rng = np.random.default_rng(12)
    for channels, shape in ((3, (37, 53, 3)), (1, (41, 30))):
        payloads = [
            pil_jpeg(photo(rng, *shape[:2], channels), quality=q, progressive=progressive, **kw)
            for q, kw in ((90, {"subsampling": 0}), (75, {"subsampling": 1}), (95, {}))
        ]
        out, status, failed = whole(payloads, shape)
        assert failed == 0 and not status.any()
        for i, p in enumerate(payloads):
            assert np.array_equal(out[i], imagecodecs.jpeg8_decode(p))


def test_whole_decode_refuses_another_size_or_kind():
    rng = np.random.default_rng(13)
    rgb = imagecodecs.jpeg8_encode(photo(rng, 32, 40), level=90)
    grey = imagecodecs.jpeg8_encode(photo(rng, 32, 40, 1), level=90)
    arithmetic = rgb.replace(b"\xff\xc0", b"\xff\xc9", 1)  # SOF9: arithmetic-coded
    _, status, failed = whole([rgb, rgb], (32, 41, 3))
    assert failed == 2 and (status == kernels.JPEG_SIZE).all()
    out, status, _ = whole([grey, rgb, arithmetic], (32, 40, 3))
    assert status.tolist() == [0, 0, kernels.JPEG_UNSUPPORTED]
    assert np.array_equal(out[0], np.repeat(imagecodecs.jpeg8_decode(grey)[..., None], 3, 2))
    out, status, _ = whole([rgb, grey], (32, 40))
    assert status.tolist() == [0, 0]  # RGB to grey: PIL's luma of libjpeg's RGB
    c = imagecodecs.jpeg8_decode(rgb).astype(np.int64)
    luma = (c[..., 0] * 19595 + c[..., 1] * 38470 + c[..., 2] * 7471 + 0x8000) >> 16
    assert np.array_equal(out[0], luma)
    out, status, failed = whole([rgb, rgb], (32, 40, 3), nulls=np.array([True, False]))
    assert failed == 0 and (out[0] == 77).all()  # a null's slot is left to the caller
    data, offsets = batch([rgb])
    status = np.zeros(1, np.uint8)
    for bad, match in (
        (np.zeros((1, 32, 40, 2), np.uint8), "out must be"),
        (np.zeros((1, 32, 40, 3), np.uint16), "out must be"),
        (np.zeros((1, 32, 40, 3), np.uint8)[:, ::2], "C-contiguous"),
    ):
        with pytest.raises(ValueError, match=match):
            kernels.jpeg_decode_whole(data, offsets, None, bad, 0, 1, status)
    with pytest.raises(ValueError, match="max_work"):
        kernels.jpeg_decode_whole(
            data, offsets, None, np.zeros((1, 32, 40, 3), np.uint8), 0, 1, status, max_work=0
        )
    with pytest.raises(ValueError, match="range"):
        kernels.jpeg_decode_whole(
            data, offsets, None, np.zeros((1, 32, 40, 3), np.uint8), 0, 2, status
        )


@pytest.mark.parametrize("progressive", [False, True])
def test_damaged_jpegs_are_refused_not_concealed(progressive):
    """A cut scan, a missing end marker, an inserted run of zeros: libjpeg decodes each with a
    warning and made-up grey pixels; every decode that reads the damage refuses it (the whole
    decode and Resize read every row; a progressive image is read whole before its first row
    whatever the crop)."""
    rng = np.random.default_rng(14)
    good = pil_jpeg(photo(rng, 48, 64), quality=90, progressive=progressive)
    bad = list(damaged_jpegs(good).values())
    _, status, _ = whole([good, *bad], (48, 64, 3))
    assert status.tolist() == [0] + [kernels.JPEG_CORRUPT] * len(bad)
    ops = [io.Resize(16), io.Resize((48, 64))]
    if progressive:
        ops += [io.CenterCrop(16), io.RandomResizedCrop(16)]
    for op in ops:
        _, status, _, _ = decode([good, *bad], op)
        assert status.tolist() == [0] + [kernels.JPEG_CORRUPT] * len(bad), op


def test_a_frame_header_that_lies_about_the_size_is_refused():
    """64 x 64 pixels of data under a frame header of 8000 x 8000: the data ends long before
    the image does (a warning): refused, not an 8000 x 8000 grey image."""
    rng = np.random.default_rng(15)
    liar = sof_lies(imagecodecs.jpeg8_encode(photo(rng, 64, 64), level=90))
    for op in (io.Resize(64), io.CenterCrop(64), io.RandomResizedCrop(64)):
        _, status, info, _ = decode([liar], op)
        assert status[0] == kernels.JPEG_CORRUPT, op
    data, offsets = batch([liar])
    status = np.zeros(1, np.uint8)
    out = np.empty((1, 8000, 8000, 3), np.uint8)  # virtual: only the rows decoded are touched
    kernels.jpeg_decode_whole(data, offsets, None, out, 0, 1, status)
    assert status[0] == kernels.JPEG_CORRUPT


def test_a_huge_progressive_jpeg_is_refused_before_libjpeg_allocates():
    """A valid 14000 x 14000 progressive JPEG of 1.1 MB: libjpeg would hold its 1.2 GB of DCT
    coefficients before the first row, whatever the crop. The kernels refuse it
    (JPEG_TOO_LARGE) before that allocation: the peak memory of the decoding process does not
    move. The same for the lying header of the test above, decoded whole into a virtual
    8000 x 8000 image. An image within the bound decodes."""
    got = peak_rss_mb(
        """
        from damaged_images import flat_progressive_jpeg, sof_lies
        from rowstore import kernels
        from rowstore.reader import image_ops as io
        import imagecodecs
        def one(p):
            return np.frombuffer(p, np.uint8), np.array([0, len(p)], np.int64)
        huge = one(flat_progressive_jpeg(14000, 14000, 3))
        liar = one(sof_lies(imagecodecs.jpeg8_encode(np.full((64, 64, 3), 9, np.uint8))))
        status = np.zeros(1, np.uint8)
        rows = np.zeros(1, np.int64)
        small = np.zeros((1, 224, 224, 3), np.uint8)
        big = np.empty((1, 14000, 14000, 3), np.uint8)
        lied = np.empty((1, 8000, 8000, 3), np.uint8)
        mark()
        for op in (io.RandomResizedCrop(224), io.CenterCrop(224, fraction=0.875)):
            kernels.jpeg_decode_batch(*huge, None, rows, 1, small, 0, 1, status,
                                      **op.kernel_args())
            result[op.mode] = int(status[0])
        kernels.jpeg_decode_whole(*huge, None, big, 0, 1, status)
        result["whole"] = int(status[0])
        kernels.jpeg_decode_whole(*liar, None, lied, 0, 1, status)
        result["liar"] = int(status[0])
        fits = one(flat_progressive_jpeg(2000, 3000, 3))
        kernels.jpeg_decode_whole(*fits, None, big.reshape(-1)[: 2000 * 3000 * 3].reshape(
            1, 2000, 3000, 3), 0, 1, status)
        result["fits"] = int(status[0])
        """
    )
    too_large = kernels.JPEG_TOO_LARGE
    assert got["random_resized"] == got["center"] == got["whole"] == too_large, got
    assert got["liar"] == kernels.JPEG_CORRUPT and got["fits"] == kernels.JPEG_OK, got
    # the image that fits: 36 MB of coefficients and 18 MB of pixels; nothing else moved
    assert got["delta"] < 150, got


def test_libjpegs_memory_manager_is_the_backstop():
    """``max_work`` also caps libjpeg's memory manager (``max_memory_to_use``): a coefficient
    buffer within the kernel's own check but not within the whole budget is refused by libjpeg
    (no backing store) and reported as JPEG_TOO_LARGE, not as damage."""
    p = flat_progressive_jpeg(512, 512, 1)
    coef = progressive_coefficient_bytes(512, 512, 1)
    for max_work, want in ((coef - 1, kernels.JPEG_TOO_LARGE), (coef, kernels.JPEG_TOO_LARGE)):
        out, status, _ = whole([p], (512, 512), max_work=max_work)
        assert status[0] == want, max_work
    out, status, _ = whole([p], (512, 512), max_work=2 * coef)
    assert status[0] == kernels.JPEG_OK and (out == 128).all()
    data, offsets = batch([p])
    status = np.zeros(1, np.uint8)
    for mode in ("resize", "center"):
        kernels.jpeg_decode_batch(
            data,
            offsets,
            None,
            np.zeros(1, np.int64),
            0,
            np.zeros((1, 8, 8), np.uint8),
            0,
            1,
            status,
            mode=mode,
            max_work=coef,
        )
        assert status[0] == kernels.JPEG_TOO_LARGE


# -- colour: any JPEG to the output's channels as PIL converts; hostile colour headers ---------
def _adobe_cmyk(a, transform=0, **kw) -> bytes:
    """A CMYK JPEG (PIL writes the Adobe marker, inverted samples); its APP14 transform byte
    set to ``transform``."""
    import io as _io

    buf = _io.BytesIO()
    Image.fromarray(a, "CMYK").save(buf, "JPEG", **kw)
    data = bytearray(buf.getvalue())
    at = data.find(b"Adobe")
    assert at > 0
    data[at + 11] = transform
    return bytes(data)


def _pil_convert(p, mode):
    import io as _io

    a = np.asarray(Image.open(_io.BytesIO(p)).convert(mode))
    return a


@pytest.mark.parametrize("progressive", [False, True])
def test_cmyk_and_grey_decode_as_pil_converts_them(progressive):
    rng = np.random.default_rng(21)
    cmyk = _adobe_cmyk(rng.integers(0, 256, (37, 45, 4), dtype=np.uint8), progressive=progressive)
    grey = pil_jpeg(photo(rng, 37, 45, 1), progressive=progressive)
    for c, mode in ((3, "RGB"), (1, "L")):
        shape = (37, 45, 3) if c == 3 else (37, 45)
        out, status, failed = whole([cmyk, grey], shape)
        assert failed == 0, status
        assert np.array_equal(out[0], _pil_convert(cmyk, mode)), mode
        assert np.array_equal(out[1], _pil_convert(grey, mode)), mode
        # through a crop: the rows and columns the crop reads, converted the same way
        op = io.Resize((37, 45))
        got, status, _, _ = decode([cmyk, grey], op, c)
        assert not status.any() and np.array_equal(got[0], out[0]), mode


def test_hostile_colour_headers():
    """An unknown Adobe transform (libjpeg warns: refused as damage), two components (no colour
    space: unsupported), a truncated CMYK scan (damaged), a CMYK progressive image whose
    coefficients exceed the memory bound (refused before they are allocated)."""
    rng = np.random.default_rng(22)
    cmyk = _adobe_cmyk(rng.integers(0, 256, (24, 32, 4), dtype=np.uint8))
    odd = _adobe_cmyk(rng.integers(0, 256, (24, 32, 4), dtype=np.uint8), transform=7)
    two = flat_progressive_jpeg(24, 32, components=2)
    cut = damaged_jpegs(cmyk)["truncated"]
    _, status, _ = whole([odd, two, cut, cmyk], (24, 32, 3))
    assert status.tolist() == [
        kernels.JPEG_CORRUPT,
        kernels.JPEG_UNSUPPORTED,
        kernels.JPEG_CORRUPT,
        0,
    ]
    _, status, _, _ = decode([odd, two, cmyk], io.RandomResizedCrop(8))
    assert status.tolist() == [kernels.JPEG_CORRUPT, kernels.JPEG_UNSUPPORTED, 0]
    big = flat_progressive_jpeg(2000, 2000, components=4)
    need = progressive_coefficient_bytes(2000, 2000, components=4)
    _, status, _ = whole([big], (2000, 2000, 3), max_work=need // 2)
    assert status.tolist() == [kernels.JPEG_TOO_LARGE]
