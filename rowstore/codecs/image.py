"""``png`` and ``jpeg`` images of ``uint8`` (PNG also ``uint16``), ``HxW`` or ``HxWxC``.

Encoding uses `imagecodecs` (``pip install rowstore[images]``). Decoding writes into a
caller-owned array without the GIL, so reader threads decode in parallel, and refuses damaged
bytes (a ``CodecError``) rather than return the pixels a decoder would make up for them:

* JPEG: rowstore's libjpeg-turbo kernel (``kernels.jpeg_decode_whole``), which reads each image
  to its end marker and takes every libjpeg warning (truncated data, a bad Huffman code,
  extraneous bytes) as an error; the frame header is checked against the output's shape before
  anything is decoded, and libjpeg's memory per image is bounded
  (``kernels.JPEG_MAX_WORK_BYTES``: a huge progressive image is refused before its coefficient
  buffer is allocated). Where the kernel was not built (no ``jpeglib.h``), imagecodecs decodes,
  which conceals some damage.
* PNG: every chunk's CRC, one run of ``IDAT`` chunks, an ``IEND``, and a zlib stream that
  inflates to exactly the image's bytes and ends where the data ends are checked
  (:func:`check_png`, what libpng only warns about), then imagecodecs (libpng) decodes. The
  reader decodes PNGs with its own kernel instead (``kernels.png_decode_batch``: all but
  interlaced ones), which checks the same.

:func:`verify_image` decodes one encoded image in full under these rules (for ingest).

Both codecs also take images already encoded (``accepts_encoded``): the bytes of a PNG or JPEG
file are stored as they are, whatever its colour model, after :func:`png_header` /
:func:`jpeg_header` read the file's own facts from the header (size, channels, colour model,
bit depth: pure Python, bounds-checked, microseconds: nothing is decompressed):

* PNG: grey 1, grey+alpha 2, RGB 3, RGBA 4 channels; a palette image 3; a ``tRNS`` chunk adds
  an alpha channel; bit depth 16 decodes to 16 bits, 8 and below to 8;
* JPEG: baseline, extended or progressive Huffman-coded, 8-bit, grey (1), YCbCr/RGB (3) or
  CMYK/YCCK (4 components); other processes (lossless, arithmetic-coded, 12-bit) are refused.

The field says what the reader gets (:func:`conversion`): any image decodes to 1 or 3
channels as PIL's ``Image.open(f).convert("L")`` / ``convert("RGB")`` does (the kernels, and
:func:`convert_reference` in NumPy where they are not built); a field of 2 or 4 channels takes
images of as many. A 16-bit PNG goes to a uint16 field as it is, to a uint8 field only under
the rule ``Png(depth="scale")`` (each sample's high byte); an 8-bit image never to uint16.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.codecs.abc import Codec, FieldLike, ParallelMap, Payloads, serial
from rowstore.errors import CodecError, CodecNotAvailableError, SchemaError

__all__ = [
    "Png",
    "Jpeg",
    "ImageHeader",
    "conversion",
    "convert_reference",
    "jpeg_reference",
    "image_header",
    "png_header",
    "jpeg_header",
    "sniff_image_format",
    "check_png",
    "verify_image",
]


def _imagecodecs():
    try:
        import imagecodecs
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise CodecNotAvailableError(
            "the png/jpeg codecs need imagecodecs: pip install 'rowstore[images]' (or imagecodecs)"
        ) from exc
    return imagecodecs


@dataclass(frozen=True)
class ImageHeader:
    """What an encoded image's header says about the array it decodes to."""

    format: str  # "png" or "jpeg"
    height: int
    width: int
    channels: int  # the file's own: PNG 1-4 (a palette is 3, tRNS adds 1), JPEG 1, 3 or 4
    bits: int  # bits per sample of the file's own pixels decoded: 8 (uint8) or 16 (uint16)
    #: the file's colour model: "grey", "rgb", "palette" (PNG); "grey", "ycbcr", "rgb",
    #: "cmyk", "ycck" (JPEG: the frame's components and the Adobe/JFIF markers); "" unknown
    colour: str = ""
    alpha: bool = False  # PNG: an alpha channel or a tRNS chunk (counted in channels)
    depth: int = 8  # bits per sample as stored: PNG 1, 2, 4, 8 or 16; JPEG 8

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.bits == 16 else np.uint8)


class _BadImage(ValueError):
    """An encoded image whose header is invalid, truncated or not one the codec stores."""


class _Truncated(_BadImage):
    """The bytes end before the header does (for :func:`image_header`'s prefixes)."""


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour type -> (channels, allowed bit depths)
_PNG_COLOUR = {0: (1, (1, 2, 4, 8, 16)), 2: (3, (8, 16)), 3: (3, (1, 2, 4, 8)), 4: (2, (8, 16))}
_PNG_COLOUR[6] = (4, (8, 16))
_PNG_MAX_DIM = (1 << 31) - 1


def sniff_image_format(data: Any) -> str | None:
    """The format whose signature ``data`` starts with (``"png"``, ``"jpeg"``, ``"webp"``,
    ``"gif"``, ``"tiff"``, ``"bmp"``), or None: for error messages."""
    head = bytes(memoryview(data)[:12])
    if head.startswith(_PNG_SIGNATURE):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith((b"II*\x00", b"MM\x00*")):
        return "tiff"
    if head.startswith(b"BM"):
        return "bmp"
    return None


def _not(fmt: str, data: memoryview) -> _BadImage:
    other = sniff_image_format(data)
    if other is not None and other != fmt:
        return _BadImage(f"got {other.upper()} bytes, not {fmt.upper()}")
    if len(data) < 16:
        return _BadImage(f"not {fmt.upper()} bytes ({len(data)} bytes: truncated or empty)")
    return _BadImage(f"not {fmt.upper()} bytes (no {fmt.upper()} signature)")


def png_header(data: Any, *, complete: bool = True) -> ImageHeader:
    """Read a PNG's header: ``IHDR`` (checked, CRC included), then the chunk headers up to the
    first ``IDAT`` (for ``PLTE``/``tRNS``); no pixel data is read. ``data``: bytes-like, the
    whole file (``complete=False``: maybe only its beginning, so the first ``IDAT`` chunk need
    not fit). Raises ``ValueError`` for bytes that are not a valid PNG header."""
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(buf)
    if bytes(buf[:8]) != _PNG_SIGNATURE:
        raise _not("png", memoryview(buf))
    if n < 33:
        raise _Truncated(f"truncated PNG: {n} bytes, the header alone takes 33")
    length, kind = struct.unpack_from(">I4s", buf, 8)
    if kind != b"IHDR" or length != 13:
        raise _BadImage("invalid PNG: the first chunk is not a 13-byte IHDR")
    width, height, depth, colour, method, filt, interlace = struct.unpack_from(">IIBBBBB", buf, 16)
    (crc,) = struct.unpack_from(">I", buf, 29)
    if zlib.crc32(buf[12:29]) != crc:
        raise _BadImage("corrupt PNG: the IHDR chunk's CRC does not match")
    if not (1 <= width <= _PNG_MAX_DIM and 1 <= height <= _PNG_MAX_DIM):
        raise _BadImage(f"invalid PNG: size {width}x{height}")
    if colour not in _PNG_COLOUR or depth not in _PNG_COLOUR[colour][1]:
        raise _BadImage(f"invalid PNG: bit depth {depth} with colour type {colour}")
    if method != 0 or filt != 0 or interlace not in (0, 1):
        raise _BadImage(f"invalid PNG: compression {method}, filter {filt}, interlace {interlace}")
    channels = _PNG_COLOUR[colour][0]
    pos, palette, transparency = 33, False, False
    while True:  # chunk headers up to the image data: each step moves >= 12 bytes
        if pos + 8 > n:
            raise _Truncated("truncated PNG: it ends before its image data (IDAT)")
        length, kind = struct.unpack_from(">I4s", buf, pos)
        if length > _PNG_MAX_DIM:
            raise _BadImage(f"invalid PNG: a chunk of {length} bytes")
        if kind == b"IDAT":
            if complete and pos + 12 + length > n:
                raise _BadImage("truncated PNG: it ends inside its first IDAT chunk")
            break
        if kind == b"IEND":
            raise _BadImage("invalid PNG: no image data (IDAT)")
        palette |= kind == b"PLTE"
        transparency |= kind == b"tRNS"
        pos += 12 + length
    if colour == 3 and not palette:
        raise _BadImage("invalid PNG: a palette image without a PLTE chunk")
    if transparency and colour in (0, 2, 3):
        channels += 1  # the decoder turns tRNS into an alpha channel
    model = "palette" if colour == 3 else "grey" if colour in (0, 4) else "rgb"
    alpha = colour in (4, 6) or transparency
    return ImageHeader(
        "png", height, width, channels, 16 if depth == 16 else 8, model, alpha, depth
    )


def image_header(data: Any, *, complete: bool = True) -> ImageHeader | None:
    """The header of PNG or JPEG bytes (the format from the signature). ``complete=False``:
    ``data`` may be the beginning of a file only, and None means that the header does not end
    within it (read more). Raises ``ValueError`` for bytes that are neither, or invalid."""
    fmt = sniff_image_format(data)
    if fmt not in ("png", "jpeg"):
        raise _BadImage(f"not PNG or JPEG bytes ({(fmt or 'unknown format').upper()})")
    try:
        if fmt == "png":
            return png_header(data, complete=complete)
        return jpeg_header(data)
    except _Truncated:
        if complete:
            raise
        return None


#: SOF markers of JPEG processes the jpeg codec's decoder reads: baseline, extended, progressive
_JPEG_SOF_OK = (0xC0, 0xC1, 0xC2)


def jpeg_header(data: Any) -> ImageHeader:
    """Read a JPEG's frame header: the marker segments are walked up to the first SOF marker
    (nothing is decompressed). ``data``: bytes-like. Raises ``ValueError`` for bytes that are
    not a valid JPEG header or one of a process the jpeg codec does not read."""
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    n = len(buf)
    if n < 3 or buf[0] != 0xFF or buf[1] != 0xD8 or buf[2] != 0xFF:
        raise _not("jpeg", memoryview(buf))
    pos, adobe = 2, -1  # adobe: the APP14 marker's colour transform (-1: none)
    while True:  # each step moves >= 1 byte (fill bytes), a segment >= 4
        if pos + 2 > n:
            raise _Truncated("truncated JPEG: it ends before its frame header (SOF)")
        if buf[pos] != 0xFF:
            raise _BadImage(f"invalid JPEG: no marker at byte {pos}")
        marker = buf[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        pos += 2
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a segment
            continue
        if marker in (0x00, 0xD8, 0xD9, 0xDA):
            raise _BadImage(f"invalid JPEG: marker 0x{marker:02X} before the frame header (SOF)")
        if pos + 2 > n:
            raise _Truncated("truncated JPEG: it ends before its frame header (SOF)")
        (seglen,) = struct.unpack_from(">H", buf, pos)
        if seglen < 2:
            raise _BadImage(f"invalid JPEG: a segment of length {seglen} at byte {pos}")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if seglen < 8 or pos + seglen > n:
                raise _Truncated("truncated JPEG: it ends inside its frame header (SOF)")
            bits, height, width, components = struct.unpack_from(">BHHB", buf, pos + 2)
            if marker not in _JPEG_SOF_OK:
                raise _BadImage(
                    f"a JPEG of process SOF{marker - 0xC0} (lossless, hierarchical or "
                    "arithmetic-coded), which the jpeg codec does not read"
                )
            if bits != 8:
                raise _BadImage(f"a {bits}-bit JPEG; the jpeg codec stores 8-bit images")
            if width == 0 or height == 0:
                raise _BadImage(f"invalid or unsupported JPEG: size {width}x{height}")
            if components not in (1, 3, 4):
                raise _BadImage(
                    f"a JPEG of {components} components; the jpeg codec reads grey (1), "
                    "colour (3) and CMYK (4) images"
                )
            if seglen < 8 + 3 * components:
                raise _BadImage("invalid JPEG: a frame header too short for its components")
            ids = bytes(buf[pos + 8 + 3 * k] for k in range(components))
            return ImageHeader(
                "jpeg", height, width, components, 8, _jpeg_colour(components, adobe, ids), False
            )
        if marker == 0xEE and seglen >= 14 and pos + seglen <= n:  # APP14 "Adobe"
            if bytes(buf[pos + 2 : pos + 7]) == b"Adobe":
                adobe = buf[pos + 13]
        pos += seglen


def _jpeg_colour(components: int, adobe: int, ids: bytes) -> str:
    """The colour model libjpeg reads a frame of ``components`` in (jdapimin.c's
    default_decompress_parms): ``adobe`` the APP14 transform (-1: no marker), ``ids`` the
    component identifiers."""
    if components == 1:
        return "grey"
    if components == 3:
        if adobe == 0 or (adobe < 0 and ids == b"RGB"):
            return "rgb"
        return "ycbcr"
    return "ycck" if adobe == 2 else "cmyk"


#: What a 16-bit PNG becomes in a uint8 field (the png codec's ``depth``): refused (None),
#: or "scale": each sample's high byte, as PIL reads 16-bit RGB, RGBA and grey+alpha PNGs.
_DEPTH_RULES = (None, "scale")


def field_channels(hdr: ImageHeader) -> int:
    """The channels a field made for an image of header ``hdr`` holds by default: the file's
    own, except a CMYK/YCCK JPEG's 4 components, which PIL and torchvision read as RGB (3).
    Every ingest (folders, Arrow/Parquet, Hugging Face) decides a new field's channels here."""
    return 3 if hdr.colour in ("cmyk", "ycck") else hdr.channels


def conversion(hdr: ImageHeader, channels: int, dtype: Any, depth: str | None = None) -> str:
    """Why an image of header ``hdr`` cannot be decoded into ``channels`` channels of
    ``dtype`` (``""``: it can). Any image converts to 1 (grey) or 3 (RGB) channels as PIL's
    ``convert("L")`` / ``convert("RGB")`` does; 2 and 4 channels take only images of as many
    channels. 16-bit samples go to uint16 as they are, or to uint8 with ``depth="scale"``;
    8-bit samples go to uint8 only."""
    dtype = np.dtype(dtype)
    if hdr.channels != channels and channels not in (1, 3):
        return (
            f"a {hdr.channels}-channel {hdr.colour or hdr.format} image cannot become "
            f"{channels} channels (images of any channels convert to 1 or 3)"
        )
    if hdr.bits == 16 and dtype == np.uint8:
        if depth != "scale":
            return (
                "a 16-bit PNG for a uint8 field: store it in a uint16 field, or choose the rule "
                "codec=Png(depth='scale') (each sample's high byte, as PIL reads 16-bit colour "
                "PNGs)"
            )
    elif dtype != hdr.dtype:
        return f"an {hdr.bits}-bit image cannot become {dtype} samples"
    return ""


def convert_reference(
    img: np.ndarray, hdr: ImageHeader, channels: int, dtype: Any = np.uint8
) -> np.ndarray:
    """``img``, an image as decoded by its own colour model (``H x W`` or ``H x W x C``: PNG
    after palette expansion, a CMYK/YCCK JPEG as libjpeg's CMYK samples), converted to
    ``channels`` of ``dtype`` as PIL does (``H x W x channels``): a 16-bit sample's high byte
    for uint8; CMYK to RGB by PIL's ``cmyk2rgb`` of the inverted (Adobe) samples; alpha
    dropped; grey repeated for RGB; RGB to grey by PIL's ``L = (19595 R + 38470 G + 7471 B +
    0x8000) >> 16``. The NumPy statement of what the kernels compute (the fallback without
    them)."""
    a = img if img.ndim == 3 else img[..., None]
    if a.dtype == np.uint16 and np.dtype(dtype) == np.uint8:
        a = (a >> 8).astype(np.uint8)
    if hdr.colour in ("cmyk", "ycck") and a.shape[2] == 4:
        k = a[..., 3:4].astype(np.int32)
        t = (255 - a[..., :3].astype(np.int32)) * k + 128  # PIL: C = 255 - stored ("CMYK;I")
        a = np.clip(k - (((t >> 8) + t) >> 8), 0, 255).astype(np.uint8)
    elif a.shape[2] in (2, 4) and channels != a.shape[2]:
        a = a[..., :-1]  # alpha dropped (PIL's convert: no compositing)
    if a.shape[2] == channels:
        return np.ascontiguousarray(a)
    if channels == 3 and a.shape[2] == 1:
        return np.repeat(a, 3, axis=2)
    if channels == 1 and a.shape[2] == 3:
        c = a.astype(np.int64)
        grey = (c[..., 0] * 19595 + c[..., 1] * 38470 + c[..., 2] * 7471 + 0x8000) >> 16
        return grey.astype(a.dtype)[..., None]
    raise CodecError(f"{hdr.format} image of {a.shape[2]} channels cannot become {channels}")


class _Image(Codec):
    releases_gil = True  # imagecodecs' decoders release the GIL
    encode_releases_gil = True  # and its encoders
    accepts_encoded = True  # PNG/JPEG bytes are stored as they are (header checked)
    dtypes: tuple[str, ...] = ("u1",)
    channels: tuple[int, ...] = (1, 3, 4)
    stats_kind = "image"  # statistics: height, width, channels of each value (its shape)
    depth: str | None = None

    @staticmethod
    def read_header(data: Any) -> ImageHeader:
        raise NotImplementedError

    def inspect_encoded(self, data: memoryview, field: FieldLike) -> tuple[tuple[int, ...], Any]:
        """Shape and dtype of the image ``data`` holds as the field reads it, from its header:
        ``(H, W)`` for a field of shape ``(H, W)``, else ``(H, W, C)`` with the field's ``C``
        (any image converts to 1 or 3 channels: :func:`conversion`). A CodecError names what
        no conversion does (a 16-bit PNG for a uint8 field without ``depth="scale"``)."""
        try:
            hdr = self.read_header(data)
        except _BadImage as exc:
            raise CodecError(
                f"field {field.name!r}: codec {self.codec_id!r}: {exc}",
                codec=self.codec_id,
                field=field.name,
            ) from None
        c = field.shape[2] if len(field.shape) == 3 else 1
        want = c if c is not None else 1  # (check_field: a channel count is fixed)
        why = conversion(hdr, want, field.numpy_dtype, self.depth)
        if why:
            raise CodecError(
                f"field {field.name!r}: codec {self.codec_id!r}: {why}",
                codec=self.codec_id,
                field=field.name,
            )
        if len(field.shape) == 2:
            return (hdr.height, hdr.width), field.numpy_dtype
        return (hdr.height, hdr.width, want), field.numpy_dtype

    def verify_encoded(self, data: memoryview, shape: tuple[int, ...], field: FieldLike) -> None:
        out = np.empty(shape, dtype=field.numpy_dtype)
        try:
            self.decode_into(np.frombuffer(data, np.uint8), out)
        except CodecError as exc:
            raise CodecError(
                f"field {field.name!r}: {exc}", codec=self.codec_id, field=field.name
            ) from None

    def check_field(self, field: FieldLike) -> None:
        name = field.name
        if (
            field.dtype in ("str", "bytes")
            or f"{field.dtype.kind}{field.dtype.itemsize}" not in self.dtypes
        ):
            raise SchemaError(
                f"field {name!r}: codec {self.codec_id!r} stores {'/'.join(self.dtypes)} images, "
                f"got dtype {field.dtype}",
                field=name,
            )
        if len(field.shape) not in (2, 3):
            raise SchemaError(
                f"field {name!r}: codec {self.codec_id!r} needs shape (H, W) or (H, W, C), got "
                f"{field.shape}",
                field=name,
            )
        if len(field.shape) == 3 and field.shape[2] not in self.channels:
            raise SchemaError(
                f"field {name!r}: codec {self.codec_id!r} supports {self.channels} channels, got "
                f"shape {field.shape}",
                field=name,
            )

    def check_value(self, value: Any, field: FieldLike) -> None:
        if value.ndim == 3 and value.shape[2] not in self.channels:
            raise CodecError(
                f"field {field.name!r}: codec {self.codec_id!r} supports {self.channels} channels, "
                f"got an image of shape {value.shape}",
                codec=self.codec_id,
                field=field.name,
            )
        if value.size == 0:
            raise CodecError(
                f"field {field.name!r}: codec {self.codec_id!r} cannot store an empty image of "
                f"shape {value.shape}",
                codec=self.codec_id,
                field=field.name,
            )


class Png(_Image):
    """Lossless PNG. ``level``: zlib level 0-9 (default 6; 1 writes much faster).
    ``depth``: what a 16-bit PNG stored as it is becomes in a uint8 field: None (default:
    refused at write) or ``"scale"`` (each sample's high byte, as PIL reads 16-bit colour
    PNGs)."""

    codec_id = "png"
    dtypes = ("u1", "u2")
    channels = (1, 2, 3, 4)
    read_header = staticmethod(png_header)

    def __init__(self, level: int = 6, depth: str | None = None):
        if not isinstance(level, int) or not 0 <= level <= 9:
            raise CodecError(f"png level must be an int in 0..9, got {level!r}", codec="png")
        if depth not in _DEPTH_RULES:
            raise CodecError(f"png depth must be None or 'scale', got {depth!r}", codec="png")
        self.level = level
        self.depth = depth
        self._freeze()

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"id": "png", "level": self.level}
        if self.depth is not None:  # files without the rule keep the config they always had
            config["depth"] = self.depth
        return config

    def encode(self, value: Any, field: FieldLike) -> bytes:
        return _imagecodecs().png_encode(np.ascontiguousarray(value), level=self.level)

    def decode_into(self, src, out: np.ndarray) -> None:
        data = _bytes_of(src)
        hdr = _header_for(png_header, "png", data, out, self.depth)
        check_png(data, hdr)
        if _same(hdr, out):
            _decode_into(_imagecodecs().png_decode, "png", data, out)
            return
        img = _decode_native(_imagecodecs().png_decode, "png", data)
        out[...] = convert_reference(img, hdr, _expected(out)[2], out.dtype).reshape(out.shape)


class Jpeg(_Image):
    """Lossy JPEG (8-bit). ``quality``: 1-100 (default 90)."""

    codec_id = "jpeg"
    channels = (1, 3)
    read_header = staticmethod(jpeg_header)

    def __init__(self, quality: int = 90):
        if not isinstance(quality, int) or not 1 <= quality <= 100:
            raise CodecError(
                f"jpeg quality must be an int in 1..100, got {quality!r}", codec="jpeg"
            )
        self.quality = quality
        self._freeze()

    def get_config(self) -> dict[str, Any]:
        return {"id": "jpeg", "quality": self.quality}

    def encode(self, value: Any, field: FieldLike) -> bytes:
        arr = np.ascontiguousarray(value)
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[..., 0]
        return _imagecodecs().jpeg8_encode(arr, level=self.quality)

    def decode_into(self, src, out: np.ndarray) -> None:
        data = _bytes_of(src)
        hdr = _header_for(jpeg_header, "jpeg", data, out)
        if not kernels.JPEG_AVAILABLE:  # built without jpeglib.h: imagecodecs
            out[...] = jpeg_reference(data, hdr, _expected(out)[2]).reshape(out.shape)
            return
        one = out if out.flags.c_contiguous and out.flags.writeable else np.empty_like(out)
        status = np.zeros(1, np.uint8)
        kernels.jpeg_decode_whole(
            data, np.array([0, len(data)], np.int64), None, _kernel_view(one), 0, 1, status
        )
        _jpeg_raise(int(status[0]))
        if one is not out:
            out[...] = one

    def decode_batch(self, src: Payloads, out: np.ndarray, parallel: ParallelMap = serial) -> None:
        """Images of one shape (``out`` ``n x shape``, C-contiguous uint8) in one kernel call
        per range of images, on ``parallel``'s threads; others image by image."""
        if not (
            kernels.JPEG_AVAILABLE
            and src.shapes is None
            and out.dtype == np.uint8
            and out.ndim in (3, 4)
            and out.shape[3:] in ((), (1,), (3,))
            and out.flags.c_contiguous
            and out.flags.writeable
        ):
            super().decode_batch(src, out, parallel)
            return
        status = np.zeros(len(src), np.uint8)
        view = out.reshape(out.shape[:3]) if out.shape[3:] == (1,) else out

        def run(lo: int, hi: int) -> None:
            kernels.jpeg_decode_whole(src.data, src.offsets, src.nulls, view, lo, hi, status)

        parallel(run, len(src))
        bad = np.flatnonzero(status)
        if len(bad):
            i = int(bad[0])
            hdr = _header_for(jpeg_header, "jpeg", _bytes_of(src.payload(i)), out[i])
            _jpeg_raise(int(status[i]), hdr)


def jpeg_reference(data: Any, hdr: ImageHeader, channels: int) -> np.ndarray:
    """A JPEG decoded whole with imagecodecs (libjpeg-turbo, ``JDCT_ISLOW``) and converted to
    ``channels`` as PIL's ``convert`` (:func:`convert_reference`): the fallback without the
    kernel, with its pixels. ``H x W x channels`` uint8. Damaged data imagecodecs conceals is
    not refused here: the kernel is the decoder that refuses every libjpeg warning."""
    codecs = _imagecodecs()
    try:
        if hdr.colour in ("cmyk", "ycck"):
            img = codecs.jpeg8_decode(data, colorspace=hdr.colour.upper(), outcolorspace="CMYK")
        elif channels == 3 or hdr.colour == "grey":
            img = codecs.jpeg8_decode(data, outcolorspace="RGB" if channels == 3 else "GRAYSCALE")
        else:
            img = codecs.jpeg8_decode(data, outcolorspace="RGB")
    except Exception as exc:
        raise CodecError(f"jpeg payload does not decode: {exc}", codec="jpeg") from exc
    return convert_reference(img, hdr, channels)


def _bytes_of(src: Any) -> Any:
    return src if isinstance(src, (bytes, np.ndarray)) else np.frombuffer(src, np.uint8)


def _expected(out: np.ndarray) -> tuple[int, int, int]:
    """(height, width, channels) of the image ``out`` receives: ``H x W`` is one channel."""
    if out.ndim == 2:
        return out.shape[0], out.shape[1], 1
    if out.ndim == 3:
        return out.shape[0], out.shape[1], out.shape[2]
    raise CodecError(f"an image decodes into H x W or H x W x C, not {out.shape}")


def _same(hdr: ImageHeader, out: np.ndarray) -> bool:
    """Whether ``out`` takes the image as it decodes by itself (no conversion)."""
    return hdr.channels == _expected(out)[2] and hdr.dtype == out.dtype


def _header_for(
    read, codec_id: str, data: Any, out: np.ndarray, depth: str | None = None
) -> ImageHeader:
    """The header of ``data`` (``read``: png_header or jpeg_header), checked against ``out``
    before anything is decoded or allocated: a header that lies about the size, or an image
    no conversion brings to ``out``'s channels and dtype, is refused here."""
    try:
        hdr = read(data)
    except _BadImage as exc:
        raise CodecError(f"{codec_id} payload: {exc}", codec=codec_id) from None
    h, w, c = _expected(out)
    why = conversion(hdr, c, out.dtype, depth)
    if (hdr.height, hdr.width) != (h, w) or why:
        raise CodecError(
            f"{codec_id} payload's header says {hdr.dtype} {hdr.height}x{hdr.width}x"
            f"{hdr.channels}, expected {out.dtype} {out.shape}{': ' + why if why else ''}",
            codec=codec_id,
        )
    return hdr


def _kernel_view(one: np.ndarray) -> np.ndarray:
    """One image as the kernel's batch of one: ``1 x H x W`` or ``1 x H x W x 3``."""
    return one.reshape((1,) + one.shape[:2] + ((3,) if one.ndim == 3 and one.shape[2] == 3 else ()))


def _jpeg_raise(status: int, hdr: ImageHeader | None = None) -> None:
    if status == kernels.JPEG_OK:
        return
    if status == kernels.JPEG_NOMEM:
        raise MemoryError("no memory to decode a JPEG image")
    why = kernels.JPEG_WHY.get(status, f"status {status}")
    if status == kernels.JPEG_TOO_LARGE and hdr is not None:
        why += f" ({hdr.height}x{hdr.width})"
    raise CodecError(f"jpeg payload does not decode: {why}", codec="jpeg")


#: Adam7's passes: (x0, y0, dx, dy)
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_raw_bytes(data: Any) -> int:
    """The bytes a PNG's zlib stream inflates to (filter bytes included), from its IHDR."""
    width, height, depth, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    bits = depth * _PNG_SAMPLES[colour]
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    total = 0
    for x0, y0, dx, dy in passes:
        w, h = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if w > 0 and h > 0:
            total += h * (1 + (w * bits + 7) // 8)
    return total


def check_png(data: Any, hdr: ImageHeader | None = None) -> None:
    """Check what libpng only warns about, or conceals, in a whole PNG file: every chunk's
    CRC-32, one run of ``IDAT`` chunks, an ``IEND`` chunk, and a zlib stream that ends with
    the ``IDAT`` data and inflates to exactly the bytes the ``IHDR`` declares (inflated in
    1 MiB pieces, nothing kept). ``hdr``: :func:`png_header`'s result, if already read.
    Raises ``CodecError``."""
    buf = memoryview(data).cast("B")
    if hdr is None:
        try:
            png_header(buf)
        except _BadImage as exc:
            raise CodecError(f"png payload: {exc}", codec="png") from None
    n, pos = len(buf), 8
    want, got = _png_raw_bytes(buf), 0
    inflate = zlib.decompressobj()
    state = 0  # 0: before the IDAT run, 1: in it, 2: after it

    def bad(why: str) -> CodecError:
        return CodecError(f"png payload does not decode (damaged): {why}", codec="png")

    while True:
        if pos + 12 > n:
            raise bad("it ends before its IEND chunk (truncated)")
        length, kind = struct.unpack_from(">I4s", buf, pos)
        if length > n - pos - 12:
            raise bad(f"a {kind!r} chunk runs past the end of the data (truncated)")
        body = buf[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack_from(">I", buf, pos + 8 + length)
        if zlib.crc32(body, zlib.crc32(kind)) != crc:
            raise bad(f"the CRC of a {kind.decode('latin-1')!r} chunk does not match")
        if kind == b"IDAT":
            if state == 2:
                raise bad("IDAT chunks apart from the image data's run")
            state = 1
            try:
                while body and not inflate.eof:
                    got += len(inflate.decompress(body, 1 << 20))
                    if got > want:
                        raise bad(f"the image data inflates to more than {want} bytes")
                    body = memoryview(inflate.unconsumed_tail)
            except zlib.error as exc:
                raise bad(f"the image data does not inflate ({exc})") from None
            if body or inflate.unused_data:
                raise bad("bytes after the end of the image data's zlib stream")
        else:
            state = 2 if state else 0
            if kind == b"IEND":
                break
        pos += 12 + length
    if not inflate.eof or got != want:
        raise bad(f"the image data inflates to {got} bytes, not {want} (truncated)")


def verify_image(data: Any, *, max_bytes: int = 1 << 31) -> ImageHeader:
    """Decode one encoded PNG or JPEG file in full, as the reader would, and return its header:
    a ``CodecError`` for bytes that are not a valid image or are damaged anywhere (what the
    reader would refuse, including damage a crop at read time would not reach), before
    anything is stored. ``max_bytes``: the most bytes the decoded image may take (checked from
    the header before it is allocated). Releases the GIL while it decodes."""
    data = _bytes_of(data)
    fmt = sniff_image_format(data)
    try:
        if fmt not in ("png", "jpeg"):
            raise _BadImage(f"not PNG or JPEG bytes ({(fmt or 'unknown format').upper()})")
        hdr = png_header(data) if fmt == "png" else jpeg_header(data)
    except _BadImage as exc:
        raise CodecError(f"not a valid image: {exc}") from None
    # a CMYK JPEG decodes as the reader decodes it: to RGB (libjpeg reads all of it either way)
    channels = 3 if hdr.format == "jpeg" and hdr.channels == 4 else hdr.channels
    nbytes = hdr.height * hdr.width * channels * hdr.dtype.itemsize
    if nbytes > max_bytes:
        raise CodecError(
            f"{hdr.format} image of {hdr.height}x{hdr.width}x{hdr.channels} takes {nbytes} "
            f"bytes decoded, over {max_bytes}",
            codec=hdr.format,
        )
    out = np.empty((hdr.height, hdr.width, channels), hdr.dtype)
    codec = Png() if hdr.format == "png" else Jpeg()
    codec.decode_into(data, out)
    return hdr


def _decode_into(decode, codec_id: str, src, out: np.ndarray) -> None:
    """Decode straight into ``out`` (imagecodecs checks its shape and dtype against the image
    and releases the GIL); a non-contiguous ``out`` gets a decoded copy."""
    data = _bytes_of(src)
    try:
        if out.flags.c_contiguous and out.flags.writeable:
            decode(data, out=out)
            return
        img = decode(data)
    except Exception as exc:
        raise CodecError(
            f"{codec_id} payload does not decode to {out.dtype} {out.shape}: {exc}", codec=codec_id
        ) from exc
    if img.ndim == out.ndim - 1 and out.shape[-1] == 1:
        img = img[..., None]
    if img.shape != out.shape or img.dtype != out.dtype:
        raise CodecError(
            f"{codec_id} payload decodes to {img.dtype} {img.shape}, expected {out.dtype} "
            f"{out.shape}",
            codec=codec_id,
        )
    out[...] = img


def _decode_native(decode, codec_id: str, data: Any) -> np.ndarray:
    """An image as imagecodecs decodes it by itself (for a conversion after)."""
    try:
        return decode(data)
    except Exception as exc:
        raise CodecError(f"{codec_id} payload does not decode: {exc}", codec=codec_id) from exc
