"""``utf8`` (str) and ``bytes`` (binary) values, stored in the heap."""

from __future__ import annotations

from typing import Any

import numpy as np

from rowstore.codecs.abc import Codec, FieldLike, ParallelMap, Payloads, serial
from rowstore.errors import CodecError, SchemaError

__all__ = ["Utf8", "Bytes"]


def _check_dtype(codec_id: str, dtype: str, field: FieldLike) -> None:
    if field.dtype != dtype:
        raise SchemaError(
            f"field {field.name!r}: codec {codec_id!r} needs dtype {dtype!r}, got {field.dtype}",
            field=field.name,
        )


def _split(src: Payloads) -> list[bytes]:
    """Every value's bytes, from one copy of the column (slicing bytes is cheaper than
    slicing an ndarray per value)."""
    data, offs = src.data.tobytes(), src.offsets.tolist()
    return [data[a:b] for a, b in zip(offs[:-1], offs[1:])]


class Utf8(Codec):
    codec_id = "utf8"

    def check_field(self, field: FieldLike) -> None:
        _check_dtype("utf8", "str", field)

    def encode(self, value: Any, field: FieldLike) -> bytes:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise CodecError(
                f"field {field.name!r}: text is not encodable as UTF-8: {exc}",
                codec="utf8",
                field=field.name,
            ) from exc

    def decode_into(self, src: np.ndarray, out: np.ndarray) -> None:
        try:
            out[()] = src.tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"stored text is not UTF-8: {exc}", codec="utf8") from exc

    def decode(self, src: Any, shape: tuple[int, ...] = (), field: FieldLike | None = None) -> str:
        out = np.empty((), object)
        self.decode_into(np.frombuffer(src, np.uint8), out)
        return str(out[()])

    def decode_batch(self, src: Payloads, out: np.ndarray, parallel: ParallelMap = serial) -> None:
        try:
            out[:] = [b.decode("utf-8") for b in _split(src)]
        except UnicodeDecodeError as exc:
            raise CodecError(f"stored text is not UTF-8: {exc}", codec="utf8") from exc


class Bytes(Codec):
    codec_id = "bytes"

    def check_field(self, field: FieldLike) -> None:
        _check_dtype("bytes", "bytes", field)

    def encode(self, value: Any, field: FieldLike) -> bytes:
        return bytes(value)

    def decode_into(self, src: np.ndarray, out: np.ndarray) -> None:
        out[()] = src.tobytes()

    def decode(
        self, src: Any, shape: tuple[int, ...] = (), field: FieldLike | None = None
    ) -> bytes:
        return bytes(src)

    def decode_batch(self, src: Payloads, out: np.ndarray, parallel: ParallelMap = serial) -> None:
        out[:] = _split(src)
