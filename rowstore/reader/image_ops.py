"""Decode-time image ops: what a ``jpeg`` field becomes as it is decoded (a crop, a resize, a
flip), declared once per read as ``decode={"image": RandomResizedCrop(224)}``.

The same declaration means the same thing in every entry point: ``Reader.batches``/``deal``,
``rowstore.torch.BatchedDataLoader``, ``rowstore.tf.DataLoader`` (it is an
:class:`~rowstore.reader.epochs.EpochSpec` argument, like ``seed``). A field read through an op
comes out as a fixed-size ``uint8`` batch, ``n x H x W x C`` (``n x H x W`` for a 2-D field),
whatever the stored images' sizes, and the output schema says so (:func:`decoded_schema`).

The random parameters of an image (its crop and its flip) are a pure function of (seed, epoch,
field, dataset row, the image's size): :func:`crop_params` states it. So an epoch resumed from
a saved state, on any world size, decodes every row exactly as the uninterrupted epoch would.

Decoding is done by ``kernels.jpeg_decode_batch`` (libjpeg-turbo, without the GIL: the
smallest DCT scale that keeps the crop at or above the output size, only the crop's rows and
columns decoded, then Pillow's bilinear filter, antialiased when it shrinks, in Pillow's
fixed-point arithmetic and pass order). Where the kernel was not built (no ``jpeglib.h``),
:func:`decode_reference` decodes the whole image with imagecodecs, crops and resizes with the
same filter in NumPy (:func:`resize_reference`): the same geometry; at DCT scale 1 the same
pixels (both compute Pillow's ``resize(box=..., reducing_gap=None)`` to the bit), else
within a few levels (the kernel's DCT scaling averages a little differently from the filter).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from rowstore.errors import SchemaError
from rowstore.reader import audio_ops
from rowstore.schema import Field, Schema

__all__ = [
    "ImageOp",
    "Resize",
    "CenterCrop",
    "RandomResizedCrop",
    "check_decode",
    "decoded_schema",
    "read_ops",
    "image_base",
    "row_key",
    "crop_params",
    "resize_reference",
    "decode_reference",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0xD1B54A32D192ED03  # the per-row key step (odd: distinct rows, distinct keys)
_STREAM_IMAGES = 4  # order.py's streams are 1..3

#: Decoded (DCT-scaled) crop bytes one image may take before it is refused as hostile.
MAX_DECODED_BYTES = 1 << 30


def _size(size: Any) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (size, size)
    try:
        h, w = (int(v) for v in size)
    except (TypeError, ValueError):
        raise ValueError(f"size must be an int or (height, width), got {size!r}") from None
    if not (1 <= h <= 65535 and 1 <= w <= 65535):
        raise ValueError(f"size must be 1..65535 each way, got {size!r}")
    return h, w


def _flip(flip: Any) -> float:
    p = 0.5 if flip is True else 0.0 if flip is False else float(flip)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"flip must be a bool or a probability in [0, 1], got {flip!r}")
    return p


@dataclasses.dataclass(frozen=True)
class ImageOp:
    """Base of the decode-time ops: ``size`` (the output's ``(height, width)``; an int is a
    square) and ``flip`` (the probability of a left-right mirror; True is 0.5)."""

    size: tuple[int, int]
    _: dataclasses.KW_ONLY
    flip: float = 0.0
    mode = ""  # the kernel's name for the op

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size(self.size))
        object.__setattr__(self, "flip", _flip(self.flip))

    def kernel_args(self) -> dict[str, Any]:
        """The op as the keyword arguments of ``kernels.jpeg_decode_batch`` (plain numbers;
        the output size is the ``out`` array's)."""
        return {"mode": self.mode, "flip": self.flip}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resize(ImageOp):
    """The whole image resized to ``size`` (its aspect ratio not kept)."""

    mode = "resize"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CenterCrop(ImageOp):
    """torchvision's ``Resize(S)`` + ``CenterCrop(size)`` with ``S = round(min(size) /
    fraction)``, done as one resize of the box the two cut from the image (the same pixels
    within a level: docs/images.md): ``CenterCrop(224, fraction=0.875)`` is ``Resize(256)`` +
    ``CenterCrop(224)``; ``fraction=1`` (default) resizes the largest centred square to a
    square ``size``. For a size of another aspect that the resized image cannot hold, the
    largest centred box of the size's aspect, ``fraction`` of it each way."""

    fraction: float = 1.0
    mode = "center"

    def __post_init__(self) -> None:
        super().__post_init__()
        f = float(self.fraction)
        if not 0.0 < f <= 1.0:
            raise ValueError(f"CenterCrop fraction must be in (0, 1], got {self.fraction!r}")
        object.__setattr__(self, "fraction", f)

    def kernel_args(self) -> dict[str, Any]:
        return {**super().kernel_args(), "fraction": self.fraction}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomResizedCrop(ImageOp):
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` (+ ``RandomHorizontalFlip`` with
    ``flip``, default 0.5): a box of ``scale`` of the image's area and an aspect ratio drawn
    log-uniformly from ``ratio``, placed uniformly, resized to ``size``; ten tries, then the
    whole image with its ratio clamped into ``ratio``, centred."""

    flip: float = 0.5
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    mode = "random_resized"

    def __post_init__(self) -> None:
        super().__post_init__()
        lo, hi = (float(v) for v in self.scale)
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"scale must be (lo, hi) with 0 < lo <= hi <= 1, got {self.scale!r}")
        rlo, rhi = (float(v) for v in self.ratio)
        if not 0.0 < rlo <= rhi:
            raise ValueError(f"ratio must be (lo, hi) with 0 < lo <= hi, got {self.ratio!r}")
        object.__setattr__(self, "scale", (lo, hi))
        object.__setattr__(self, "ratio", (rlo, rhi))

    def kernel_args(self) -> dict[str, Any]:
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        return {**super().kernel_args(), "scale": self.scale, "log_ratio": log_ratio}


# -- declarations checked against a schema ------------------------------------------------------
def _channels(f: Field) -> int:
    return f.shape[2] if len(f.shape) == 3 else 1


def check_decode(decode: Any, schema: Schema | None = None) -> dict[str, ImageOp] | None:
    """``decode`` as a ``{field: ImageOp}`` dict (None or empty: None). With ``schema``, each
    field must be in it, a ``jpeg`` field of uint8 with 1 or 3 channels (else SchemaError)."""
    if decode is None:
        return None
    if not isinstance(decode, Mapping):
        raise TypeError(f"decode must be a dict {{field: ImageOp}}, got {type(decode).__name__}")
    out: dict[str, Any] = {}  # ImageOp or audio_ops.AudioOp
    for name, op in decode.items():
        if not isinstance(name, str) or not isinstance(op, (ImageOp, audio_ops.AudioOp)):
            raise TypeError(
                f"decode maps field names to rowstore image ops (Resize, CenterCrop, "
                f"RandomResizedCrop) or audio ops (Segment, RandomSegment), got {name!r}: {op!r}"
            )
        out[name] = op
    if schema is not None:
        _check_fields(out, schema)
    return out or None


def _check_fields(ops: Mapping[str, ImageOp], schema: Schema) -> None:
    """SchemaError unless every field of ``ops`` is a ``jpeg`` field of ``schema``, uint8 with 1
    or 3 channels."""
    for name in ops:
        if name not in schema:
            raise SchemaError(
                f"decode names field {name!r}, which is not in {schema.names}", field=name
            )
        f = schema[name]
        op = ops[name]
        if isinstance(op, audio_ops.AudioOp):  # flac/wav fields: audio_ops checks them
            audio_ops.check_field(name, op, f)
            continue
        if getattr(f.codec_obj, "codec_id", None) != "jpeg" or _channels(f) not in (1, 3):
            raise SchemaError(
                f"decode={{{name!r}: ...}}: image ops decode jpeg fields of 1 or 3 channels; "
                f"field {name!r} is {f.dtype} {f.shape} with codec {f.codec!r}",
                field=name,
            )


def read_ops(
    ops: Mapping[str, ImageOp] | None, schema: Schema, read: Collection[str], seed: int, epoch: int
) -> dict[str, tuple[ImageOp, int]] | None:
    """The image ops of one read, ``{field: (op, key base)}`` (None without ops): ``ops`` as an
    :class:`~rowstore.reader.epochs.EpochSpec` holds them (:func:`check_decode` without a
    schema), checked against ``schema`` and the fields ``read`` (SchemaError), each with its
    :func:`image_base` of (``seed``, ``epoch``)."""
    if not ops:
        return None
    _check_fields(ops, schema)
    for name in ops:
        if name not in read:
            raise SchemaError(
                f"decode names field {name!r}, which is not among the fields read {sorted(read)}",
                field=name,
            )
    return {n: (op, image_base(seed, epoch, n)) for n, op in ops.items()}


def decoded_schema(schema: Schema, decode: Mapping[str, ImageOp] | None) -> Schema:
    """``schema`` with each field of ``decode`` (checked against it: :func:`check_decode`) as
    its op outputs it: uint8 of the op's size (and the field's channels, for a 3-D field),
    fixed shape, nullability kept."""
    decode = check_decode(decode, schema)
    if not decode:
        return schema
    fields = []
    for f in schema:
        op = decode.get(f.name)
        if op is None:
            fields.append(f)
            continue
        if isinstance(op, audio_ops.AudioOp):
            fields.append(audio_ops.decoded_field(f, op))
            continue
        shape = op.size + ((f.shape[2],) if len(f.shape) == 3 else ())
        fields.append(Field(f.name, np.uint8, shape, nullable=f.nullable))
    return Schema(fields)


# -- the random parameters: a pure function of (seed, epoch, field, row, image size) ------------
def image_base(seed: int, epoch: int, field: str) -> int:
    """The 64-bit base of a field's keys in an epoch (``order.seed64``, on its own stream)."""
    from rowstore.reader.order import seed64

    return seed64(seed, epoch, _STREAM_IMAGES, zlib.crc32(field.encode()))


def row_key(base: int, row: int) -> int:
    """The SplitMix64 state a row's parameters are drawn from (the kernel's)."""
    return (base + int(row) * _GOLDEN) & _MASK64


class _SplitMix:
    def __init__(self, state: int):
        self.s = state

    def next(self) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) & _MASK64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def uniform(self) -> float:
        return (self.next() >> 11) * 2.0**-53

    def bounded(self, b: int) -> int:
        x = self.next()
        if (x * b) & _MASK64 < b:
            t = ((1 << 64) - b) % b
            while (x * b) & _MASK64 < t:
                x = self.next()
        return (x * b) >> 64


def _round(x: float) -> int:
    """Python's round (half to even), as torchvision's parameter code rounds."""
    return round(x)


def crop_params(op: ImageOp, h: int, w: int, key: int) -> tuple[Any, Any, Any, Any, bool]:
    """``(y0, x0, crop_h, crop_w, flip)`` of an ``h x w`` image under ``op`` with key ``key``
    (:func:`row_key`): the statement of what the kernel computes (``_ext/_jpeg_impl.h``).
    The box is torchvision's for the same draws: ``RandomResizedCrop.get_params`` (whole
    pixels), the whole image for ``Resize``, and for ``CenterCrop`` the box in source pixels
    (floats) that ``Resize(S)`` + ``CenterCrop(size)`` crops, ``S = round(min(size) /
    fraction)``."""
    rng = _SplitMix(key)
    y0, x0, ch, cw = 0, 0, h, w
    if isinstance(op, RandomResizedCrop):
        (slo, shi), (rlo, rhi) = op.scale, (math.log(op.ratio[0]), math.log(op.ratio[1]))
        area = float(h) * float(w)
        for _ in range(10):
            t = area * (slo + rng.uniform() * (shi - slo))
            r = math.exp(rlo + rng.uniform() * (rhi - rlo))
            a, b = _round(math.sqrt(t * r)), _round(math.sqrt(t / r))
            if 0 < a <= w and 0 < b <= h:
                ch, cw = b, a
                y0 = rng.bounded(h - b + 1)
                x0 = rng.bounded(w - a + 1)
                break
        else:
            ar = w / h
            if ar < math.exp(rlo):
                cw, ch = w, _round(w / math.exp(rlo))
            elif ar > math.exp(rhi):
                ch, cw = h, _round(h * math.exp(rhi))
            ch, cw = min(max(ch, 1), h), min(max(cw, 1), w)
            y0, x0 = (h - ch) // 2, (w - cw) // 2
    elif isinstance(op, CenterCrop):
        return (*_center_box(op, h, w), bool(op.flip > 0 and rng.uniform() < op.flip))
    flip = op.flip > 0 and rng.uniform() < op.flip
    return y0, x0, ch, cw, bool(flip)


def _center_box(op: CenterCrop, h: int, w: int) -> tuple[Any, Any, Any, Any]:
    """CenterCrop's box: torchvision's ``Resize(S)`` (the shorter side to ``S``, the longer
    to ``int(S * long / short)``) then ``CenterCrop(size)`` (at ``round((H' - oh) / 2)``), as
    one box of the source in fractional pixels. Where the output does not fit the resized
    image (a size of another aspect), the largest centred box of the output's aspect,
    ``fraction`` of it each way, in whole pixels."""
    oh, ow = op.size
    s = _round(min(oh, ow) / op.fraction)
    rh, rw = (s, int(s * w / h)) if h <= w else (int(s * h / w), s)
    if s >= 1 and rh >= oh and rw >= ow:
        sy, sx = h / rh, w / rw
        top, left = _round((rh - oh) / 2.0), _round((rw - ow) / 2.0)
        y0, x0 = top * sy, left * sx
        return y0, x0, (top + oh) * sy - y0, (left + ow) * sx - x0
    want = ow / oh
    bh, bw = float(h), float(w)
    if bw / bh > want:
        bw = bh * want
    else:
        bh = bw / want
    ch = min(max(_round(bh * op.fraction), 1), h)
    cw = min(max(_round(bw * op.fraction), 1), w)
    return (h - ch) // 2, (w - cw) // 2, ch, cw


# -- the NumPy reference of the resampling (and the fallback without the kernel) -------------------
_PREC = 22  # fixed-point bits of the weights (Pillow's PRECISION_BITS for 8-bit images)


def _coeffs(in0: float, in1: float, in_size: int, out_size: int) -> np.ndarray:
    """``out_size x in_size`` integer weights (sum ``2**22`` each) of Pillow's bilinear
    (triangle) filter over ``[in0, in1)``: its ``precompute_coeffs`` and
    ``normalize_coeffs_8bpc``, operation for operation (antialiased when it shrinks)."""
    scale = (in1 - in0) / out_size
    fs = max(scale, 1.0)
    support, ss = fs, 1.0 / fs
    k = np.zeros((out_size, in_size), np.int64)
    for i in range(out_size):
        center = in0 + (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        n = min(int(center + support + 0.5), in_size) - lo
        w = [max(1.0 - abs((x + lo - center + 0.5) * ss), 0.0) for x in range(n)]
        ww = 0.0
        for v in w:
            ww += v
        for x in range(n):
            k[i, lo + x] = int(0.5 + (w[x] / ww if ww != 0.0 else 0.0) * (1 << _PREC))
    return k


def _pass(k: np.ndarray, a: np.ndarray, axis: int) -> np.ndarray:
    """One pass of the filter along ``axis`` (0: rows, 1: columns) of ``a`` (``H x W x C``),
    rounded and clamped to 8 bits as Pillow's ``clip8``."""
    acc = np.einsum("oy,yxc->oxc" if axis == 0 else "ox,yxc->yoc", k, a.astype(np.int64))
    return np.clip((acc + (1 << (_PREC - 1))) >> _PREC, 0, 255).astype(np.uint8)


def resize_reference(
    img: np.ndarray, box: tuple[int, int, int, int], size: tuple[int, int], flip: bool = False
) -> np.ndarray:
    """The ``(y0, x0, crop_h, crop_w)`` box of ``img`` (``H x W`` or ``H x W x C`` uint8)
    resized to ``size`` as Pillow 13's ``Image.resize(size[::-1], BILINEAR, box=...,
    reducing_gap=None)`` does it, to the bit: its fixed-point weights, each pass rounded to 8
    bits, the vertical pass first when the image loses more than twice as many rows as
    columns (else the horizontal pass first); mirrored with ``flip``."""
    y0, x0, ch, cw = box  # floats for CenterCrop's box
    a = img if img.ndim == 3 else img[..., None]
    (h, w), (oh, ow) = a.shape[:2], size
    ky = _coeffs(y0, y0 + ch, h, oh)
    kx = _coeffs(x0, x0 + cw, w, ow)
    if oh < h and h - oh > 2 * (w - ow):
        out = _pass(kx, _pass(ky, a, 0), 1)
    else:
        out = _pass(ky, _pass(kx, a, 1), 0)
    if flip:
        out = out[:, ::-1]
    return out if img.ndim == 3 else out[..., 0]


def decode_reference(
    op: ImageOp, payload: Any, key: int, channels: int
) -> tuple[np.ndarray, tuple[int, int, int, int, bool]]:
    """One image decoded whole with imagecodecs and converted to ``channels`` as PIL's
    ``convert`` (:func:`rowstore.codecs.image.jpeg_reference`), then cropped and resized per
    ``op``: the output (``H x W x channels``) and its :func:`crop_params`."""
    from rowstore.codecs.image import jpeg_header, jpeg_reference

    data: Any = np.frombuffer(payload, np.uint8)  # imagecodecs reads any buffer (its stubs: bytes)
    img = jpeg_reference(data, jpeg_header(data), channels)
    p = crop_params(op, img.shape[0], img.shape[1], key)
    return resize_reference(img, p[:4], op.size, p[4]), p
