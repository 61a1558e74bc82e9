"""``utf8`` (str) and ``bytes`` (binary) values, stored in the heap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rowstore.codecs.abc import Codec
from rowstore.errors import CodecError, SchemaError

if TYPE_CHECKING:
    from rowstore.schema import Field

__all__ = ["Utf8", "Bytes"]


class Utf8(Codec):
    codec_id = "utf8"
    releases_gil = False

    def check_field(self, field: Field) -> None:
        if field.dtype != "str":
            raise SchemaError(f"field {field.name!r}: codec 'utf8' needs dtype 'str', got {field.dtype}", field=field.name)

    def encode(self, value: Any, field: Field) -> bytes:
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates
            raise CodecError(f"field {field.name!r}: text is not encodable as UTF-8: {exc}", codec="utf8", field=field.name) from exc

    def decode_into(self, src, out) -> None:
        out[()] = self.decode(src, (), None)

    def decode(self, src, shape, field) -> str:
        return bytes(src).decode("utf-8")


class Bytes(Codec):
    codec_id = "bytes"
    releases_gil = False

    def check_field(self, field: Field) -> None:
        if field.dtype != "bytes":
            raise SchemaError(f"field {field.name!r}: codec 'bytes' needs dtype 'bytes', got {field.dtype}", field=field.name)

    def encode(self, value: Any, field: Field) -> bytes:
        return bytes(value)

    def decode_into(self, src, out) -> None:
        out[()] = bytes(src)

    def decode(self, src, shape, field) -> bytes:
        return bytes(np.asarray(src, dtype=np.uint8)) if not isinstance(src, (bytes, memoryview)) else bytes(src)
