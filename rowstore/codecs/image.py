"""``png`` and ``jpeg`` images of ``uint8`` (PNG also ``uint16``), ``HxW`` or ``HxWxC``.

Encoding and decoding use `imagecodecs` (``pip install rowstore[images]``), whose decoders write
into a caller-owned array and release the GIL, so reader threads decode in parallel."""

from __future__ import annotations

from typing import Any

import numpy as np

from rowstore.codecs.abc import Codec, FieldLike
from rowstore.errors import CodecError, CodecNotAvailableError, SchemaError

__all__ = ["Png", "Jpeg"]


def _imagecodecs():
    try:
        import imagecodecs
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise CodecNotAvailableError(
            "the png/jpeg codecs need imagecodecs: pip install 'rowstore[images]' (or imagecodecs)"
        ) from exc
    return imagecodecs


class _Image(Codec):
    releases_gil = True  # imagecodecs' decoders release the GIL
    dtypes: tuple[str, ...] = ("u1",)
    channels: tuple[int, ...] = (1, 3, 4)

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
    """Lossless PNG. ``level``: zlib level 0-9 (default 6; 1 writes much faster)."""

    codec_id = "png"
    dtypes = ("u1", "u2")
    channels = (1, 2, 3, 4)

    def __init__(self, level: int = 6):
        if not isinstance(level, int) or not 0 <= level <= 9:
            raise CodecError(f"png level must be an int in 0..9, got {level!r}", codec="png")
        self.level = level
        self._freeze()

    def get_config(self) -> dict[str, Any]:
        return {"id": "png", "level": self.level}

    def encode(self, value: Any, field: FieldLike) -> bytes:
        return _imagecodecs().png_encode(np.ascontiguousarray(value), level=self.level)

    def decode_into(self, src, out: np.ndarray) -> None:
        _decode_into(_imagecodecs().png_decode, "png", src, out)


class Jpeg(_Image):
    """Lossy JPEG (8-bit). ``quality``: 1-100 (default 90)."""

    codec_id = "jpeg"
    channels = (1, 3)

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
        _decode_into(_imagecodecs().jpeg8_decode, "jpeg", src, out)


def _decode_into(decode, codec_id: str, src, out: np.ndarray) -> None:
    """Decode straight into ``out`` (imagecodecs checks its shape and dtype against the image
    and releases the GIL); a non-contiguous ``out`` gets a decoded copy."""
    data = src if isinstance(src, (bytes, np.ndarray)) else np.frombuffer(src, np.uint8)
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
