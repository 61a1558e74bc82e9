"""Image fields take any JPEG and PNG as the file was, and every read path decodes them to the
field's channels as PIL's ``Image.open(f).convert("RGB")`` (or ``"L"``) does, within one level:
greyscale, CMYK (Adobe, inverted), progressive and 4:4:4 JPEGs; grey, 1-bit, grey+alpha,
palette, palette+tRNS, RGBA and 16-bit PNGs. The images are made with PIL here, written into a
file with a 3-channel and a 1-channel field, and read back through ``r[i]``, ``take``,
``batches``, ``deal``, the torch loader and an image op (``decode=RandomResizedCrop``), with
and without the kernels (imagecodecs + NumPy: the same pixels). Damaged bytes stored past the
writer's header check are a RowstoreError naming the field and the row in every path."""

from __future__ import annotations

import io

import numpy as np
import pytest

import rowstore
from rowstore import kernels
from rowstore.codecs.image import (
    Jpeg,
    Png,
    conversion,
    convert_reference,
    jpeg_header,
    png_header,
    verify_image,
)
from rowstore.errors import RowstoreError, RowValidationError
from rowstore.reader import _decode
from rowstore.reader import image_ops as iop
from rowstore.schema import Field, Schema
from tests.damaged_images import damaged_jpegs, damaged_pngs

Image = pytest.importorskip("PIL.Image")
imagecodecs = pytest.importorskip("imagecodecs")

H, W = 24, 30


def _pixels(c: int, seed: int, h: int = H, w: int = W) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([128 + 100 * np.sin(x / 5 + k) * np.cos(y / 4 - k) for k in range(c)], -1)
    return np.clip(a + rng.normal(0, 12, a.shape), 0, 255).astype(np.uint8)


def _save(img, fmt: str, **kw) -> bytes:
    f = io.BytesIO()
    img.save(f, fmt, **kw)
    return f.getvalue()


def jpegs() -> dict[str, bytes]:
    rgb = Image.fromarray(_pixels(3, 1))
    return {
        "ycbcr_420": _save(rgb, "JPEG", quality=85),
        "ycbcr_444": _save(rgb, "JPEG", quality=85, subsampling=0),
        "progressive": _save(rgb, "JPEG", quality=85, progressive=True),
        "grey": _save(Image.fromarray(_pixels(1, 2)[..., 0]), "JPEG", quality=85),
        "cmyk": _save(Image.fromarray(_pixels(4, 3), "CMYK"), "JPEG", quality=85),
        "cmyk_progressive": _save(
            Image.fromarray(_pixels(4, 4), "CMYK"), "JPEG", quality=85, progressive=True
        ),
    }


def pngs() -> dict[str, bytes]:
    rgb = Image.fromarray(_pixels(3, 5))
    pal = rgb.quantize(40)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 3
    g16 = (_pixels(1, 7)[..., 0].astype(np.uint16) * 257) ^ 0x5A
    return {
        "grey": _save(Image.fromarray(_pixels(1, 6)[..., 0]), "PNG"),
        "grey_1bit": _save(Image.fromarray(_pixels(1, 8)[..., 0]).convert("1"), "PNG"),
        "grey_4bit": _save(Image.fromarray(_pixels(1, 9)[..., 0] >> 4 << 4).quantize(16), "PNG"),
        "grey_alpha": _save(Image.fromarray(_pixels(2, 10), "LA"), "PNG"),
        "palette": _save(pal, "PNG"),
        "palette_trns": _save(pal_t, "PNG", transparency=3),
        "palette_2bit": _save(rgb.quantize(4), "PNG", bits=2),
        "rgb": _save(rgb, "PNG"),
        "rgb_trns": _save(rgb, "PNG", transparency=(10, 20, 30)),
        "rgba": _save(Image.fromarray(_pixels(4, 11), "RGBA"), "PNG"),
        "grey_16": imagecodecs.png_encode(g16),
        "rgb_16": imagecodecs.png_encode(_pixels(3, 12).astype(np.uint16) * 257 + 3),
        "rgba_16": imagecodecs.png_encode(_pixels(4, 13).astype(np.uint16) * 250),
    }


def pil(data: bytes, mode: str) -> np.ndarray:
    """PIL's conversion: the reference; a 16-bit PNG by its high bytes (the depth rule: PIL
    reads 16-bit colour PNGs so; its I;16 -> L clips instead, which no one wants)."""
    im = Image.open(io.BytesIO(data))
    if im.mode.startswith("I;16") or im.mode == "I":
        a = (imagecodecs.png_decode(data) >> 8).astype(np.uint8)
        im = Image.fromarray(a)
    a = np.asarray(im.convert(mode))
    return a if mode == "RGB" else a[..., None]


def _near(got: np.ndarray, want: np.ndarray, what: str, tol: int = 1) -> None:
    assert got.shape == want.shape, (what, got.shape, want.shape)
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() <= tol, (what, int(d.max()), float(d.mean()))


# -- headers: the file's own facts -----------------------------------------------------------
def test_headers_report_the_files_own_colour_and_depth():
    j, p = jpegs(), pngs()
    assert [jpeg_header(j[k]).colour for k in ("ycbcr_420", "grey", "cmyk")] == [
        "ycbcr",
        "grey",
        "cmyk",
    ]
    assert jpeg_header(j["cmyk"]).channels == 4 and b"Adobe" in j["cmyk"]
    got = {
        k: (png_header(v).colour, png_header(v).channels, png_header(v).depth) for k, v in p.items()
    }
    assert got["palette"] == ("palette", 3, 8) and got["palette_trns"] == ("palette", 4, 8)
    assert got["grey_1bit"] == ("grey", 1, 1) and got["grey_alpha"] == ("grey", 2, 8)
    assert got["grey_16"] == ("grey", 1, 16) and png_header(p["grey_16"]).bits == 16
    assert png_header(p["rgba"]).alpha and not png_header(p["rgb"]).alpha


def test_conversion_rules():
    hdr = png_header(pngs()["rgb_16"])
    assert "depth='scale'" in conversion(hdr, 3, np.uint8)
    assert conversion(hdr, 3, np.uint8, "scale") == "" and conversion(hdr, 1, np.uint16) == ""
    assert "cannot become" in conversion(png_header(pngs()["rgb"]), 4, np.uint8)
    assert "uint16" in conversion(png_header(pngs()["rgb"]), 3, np.uint16)
    assert conversion(jpeg_header(jpegs()["cmyk"]), 1, np.uint8) == ""


# -- every read path, with and without the kernels -----------------------------------------
def _write(path: str, images: dict[str, bytes], codec) -> list[str]:
    names = sorted(images)
    schema = Schema(
        [
            Field("rgb", "uint8", (None, None, 3), codec=codec),
            Field("grey", "uint8", (None, None), codec=codec),
            Field("fixed", "uint8", (H, W, 3), codec=codec),
            Field("i", "int64"),
        ]
    )
    with rowstore.Writer(path, schema, rows_per_block=4) as w:
        for k, n in enumerate(names):
            w.write({"rgb": images[n], "grey": images[n], "fixed": images[n], "i": k})
    return names


def _check_rows(path: str, images: dict[str, bytes], names: list[str]) -> None:
    want = {n: (pil(images[n], "RGB"), pil(images[n], "L")) for n in names}
    with rowstore.open(path) as r:
        for k, n in enumerate(names):  # r[i]
            row = r[k]
            _near(row["rgb"], want[n][0], f"r[{k}] rgb {n}")
            _near(row["fixed"], want[n][0], f"r[{k}] fixed {n}")
            _near(row["grey"][..., None], want[n][1], f"r[{k}] grey {n}")
        order = np.arange(len(names))[::-1]
        b = r.take(order)
        for j, k in enumerate(order):
            _near(b["fixed"][j], want[names[k]][0], f"take fixed {names[k]}")
            _near(np.asarray(b["rgb"][j]), want[names[k]][0], f"take rgb {names[k]}")
        got = {}
        for batch in r.batches(5, shuffle="none", fields=["fixed", "i"]):
            got.update({int(i): v for i, v in zip(batch["i"], batch["fixed"])})
        for batch in r.deal(3, shuffle="full", seed=1, fields=["grey", "i"]):
            for i, v in zip(batch["i"], batch["grey"]):
                _near(np.asarray(v)[..., None], want[names[int(i)]][1], f"deal {names[int(i)]}")
        assert sorted(got) == list(range(len(names)))
        for i, v in got.items():
            _near(v, want[names[i]][0], f"batches {names[i]}")


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "imagecodecs"])
def test_any_jpeg_reads_as_pil_converts_it(tmp_path, monkeypatch, kernel):
    if not kernel:
        monkeypatch.setattr(kernels, "JPEG_AVAILABLE", False)
    images = jpegs()
    path = str(tmp_path / "j.h5")
    names = _write(path, images, "jpeg")
    _check_rows(path, images, names)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "imagecodecs"])
def test_any_png_reads_as_pil_converts_it(tmp_path, monkeypatch, kernel):
    if not kernel:
        monkeypatch.setattr(_decode, "PNG_KERNEL", False)
    images = pngs()
    path = str(tmp_path / "p.h5")
    names = _write(path, images, Png(depth="scale"))
    _check_rows(path, images, names)


def test_png_kernel_converts_without_the_reference_decoder():
    """Every PNG of the set decodes in the kernel (status 0), to PIL's pixels exactly."""
    images = pngs()
    for name, data in images.items():
        for c in (3, 1):
            out = np.zeros((1, H, W, c), np.uint8)
            status = np.zeros(1, np.uint8)
            d = np.frombuffer(data, np.uint8)
            n = kernels.png_decode_batch(
                d, np.array([0, len(d)], np.int64), None, out, 0, 1, status, scale16=True
            )
            assert n == 0 and status[0] == 0, (name, c, status)
            want = pil(data, "RGB" if c == 3 else "L")
            assert np.array_equal(out[0], want), (name, c)
            ref = convert_reference(imagecodecs.png_decode(data), png_header(data), c, np.uint8)
            assert np.array_equal(ref, want), (name, c)


def test_16_bit_png_kept_in_a_uint16_field_and_refused_in_uint8_without_a_rule(tmp_path):
    p = pngs()
    schema = Schema(
        [
            Field("g", "uint16", (None, None, 3), codec="png"),
            Field("l", "uint16", (None, None), codec="png"),
        ]
    )
    path = str(tmp_path / "p16.h5")
    with rowstore.Writer(path, schema) as w:
        w.write({"g": p["rgb_16"], "l": p["grey_16"]})
        w.write({"g": p["grey_16"], "l": p["rgba_16"]})
        with pytest.raises(RowValidationError, match="8-bit image cannot become uint16") as e:
            w.write({"g": p["rgb"], "l": p["grey_16"]})
        assert (e.value.field, e.value.row) == ("g", 2)
    rgb16 = imagecodecs.png_decode(p["rgb_16"])
    g16 = imagecodecs.png_decode(p["grey_16"])
    rgba16 = imagecodecs.png_decode(p["rgba_16"]).astype(np.int64)
    with rowstore.open(path) as r:
        assert np.array_equal(r[0]["g"], rgb16) and np.array_equal(r[0]["l"], g16)
        assert np.array_equal(r[1]["g"], np.repeat(g16[..., None], 3, axis=2))
        luma = rgba16[..., 0] * 19595 + rgba16[..., 1] * 38470 + rgba16[..., 2] * 7471 + 32768
        assert np.array_equal(r[1]["l"], (luma >> 16).astype(np.uint16))
    with rowstore.Writer(
        str(tmp_path / "u8.h5"), Schema([Field("x", "uint8", (None, None, 3), codec="png")])
    ) as w:
        with pytest.raises(RowValidationError, match="16-bit PNG for a uint8 field") as e:
            w.write({"x": p["rgb_16"]})
        assert (e.value.field, e.value.row) == ("x", 0)
    assert Png(depth="scale").get_config() == {"id": "png", "level": 6, "depth": "scale"}
    assert Png().get_config() == {"id": "png", "level": 6}  # old files' config, unchanged


def test_image_op_and_torch_loader_convert(tmp_path):
    """decode=RandomResizedCrop (crops within 2x the output: DCT scale 1, PIL's box resize of
    PIL's converted image) and the torch loader (whole images) on grey and CMYK JPEGs."""
    torch = pytest.importorskip("torch")
    from rowstore.torch import BatchedDataLoader

    images = jpegs()
    path = str(tmp_path / "j.h5")
    names = _write(path, images, "jpeg")
    op = iop.RandomResizedCrop(16, scale=(0.5, 1.0))
    base = iop.image_base(7, 0, "rgb")
    with rowstore.open(path) as r:
        b = list(r.batches(len(names), shuffle="none", seed=7, decode={"rgb": op}))[0]["rgb"]
    for k, n in enumerate(names):
        y0, x0, ch, cw, flip = iop.crop_params(op, H, W, iop.row_key(base, k))
        want = iop.resize_reference(pil(images[n], "RGB"), (y0, x0, ch, cw), op.size, flip)
        _near(b[k], want, f"RandomResizedCrop {n}")
    got = {}
    for batch in BatchedDataLoader(path, batch_size=4, shuffle="none", fields=["fixed", "i"]):
        assert isinstance(batch["fixed"], torch.Tensor)
        got.update({int(i): v.numpy() for i, v in zip(batch["i"], batch["fixed"])})
    for k, n in enumerate(names):
        _near(got[k], pil(images[n], "RGB"), f"torch {n}")


# -- damaged bytes: an error naming field and row, never concealment pixels -----------------
def _store_unchecked(path: str, field: Field, payloads: list[bytes]) -> None:
    """Payloads written as they are: the header check passes (the damage is past it)."""
    with rowstore.Writer(path, Schema([field]), rows_per_block=2) as w:
        for p in payloads:
            w.write({field.name: p})


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
def test_damaged_images_are_errors_naming_field_and_row_in_every_path(tmp_path, fmt):
    if fmt == "jpeg":
        good = jpegs()["cmyk"]
        bad = [damaged_jpegs(good)["truncated"], damaged_jpegs(jpegs()["grey"])["truncated"]]
    else:
        good = pngs()["palette"]
        d = damaged_pngs(good)
        bad = [d["idat_crc"], d["cut_stream"]]
    for j, damaged in enumerate(bad):
        path = str(tmp_path / f"{fmt}{j}.h5")
        f = Field("img", "uint8", (H, W, 3), codec=fmt)
        _store_unchecked(path, f, [good, good, good, damaged, good])
        with rowstore.open(path) as r:
            paths = {
                "r[i]": lambda r=r: r[3],
                "take": lambda r=r: r.take([1, 3]),
                "batches": lambda r=r: list(r.batches(5, shuffle="none")),
                "deal": lambda r=r: list(r.deal(2, shuffle="full", seed=0)),
            }
            if fmt == "jpeg":
                op = {"img": iop.RandomResizedCrop(8)}
                paths["decode="] = lambda r=r, op=op: list(r.batches(5, shuffle="none", decode=op))
            for what, read in paths.items():
                with pytest.raises(RowstoreError) as e:
                    read()
                assert e.value.field == "img" and e.value.row == 3, (what, e.value)
                assert "row 3" in str(e.value) and "'img'" in str(e.value), what
        with pytest.raises(rowstore.CodecError, match="does not decode"):
            verify_image(damaged)
    assert verify_image(good).format == fmt


def test_verify_image_takes_every_kind():
    for name, data in {**jpegs(), **pngs()}.items():
        hdr = verify_image(data)
        assert (hdr.height, hdr.width) == (H, W), name


def test_codecs_decode_into_convert_and_refuse_what_cannot_be():
    j = jpegs()
    out = np.empty((H, W), np.uint8)
    Jpeg().decode_into(j["cmyk"], out)
    _near(out[..., None], pil(j["cmyk"], "L"), "cmyk to L")
    with pytest.raises(rowstore.CodecError, match="16-bit PNG for a uint8 field"):
        Png().decode_into(pngs()["rgb_16"], np.empty((H, W, 3), np.uint8))
    with pytest.raises(rowstore.CodecError, match="cannot become 4 channels"):
        Png().decode_into(pngs()["grey"], np.empty((H, W, 4), np.uint8))
