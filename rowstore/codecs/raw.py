"""``raw``: numbers stored as their little-endian bytes.

Fixed shapes are stored in the row (the reader's kernels copy them straight into the batch
arrays, no Python per value); variable shapes (a ``None`` dimension) are heap payloads, the row
holding the variable dimensions, and come out as views of the payload bytes."""

from __future__ import annotations

from typing import Any

import numpy as np

from rowstore.codecs.abc import Codec, FieldLike, ParallelMap, Payloads, serial
from rowstore.errors import CodecError, SchemaError

__all__ = ["Raw"]


class Raw(Codec):
    codec_id = "raw"
    raw_bytes = True

    def stored_nbytes(self, field: FieldLike) -> int | None:
        return None if field.is_variable else field.fixed_nbytes

    def check_field(self, field: FieldLike) -> None:
        if field.dtype in ("str", "bytes"):
            raise SchemaError(
                f"field {field.name!r}: codec 'raw' stores numbers; use 'utf8' or 'bytes' for "
                f"{field.dtype}",
                field=field.name,
            )

    def encode(self, value: Any, field: FieldLike) -> memoryview:
        arr = np.ascontiguousarray(value, dtype=field.dtype)
        # A flat uint8 view: memoryview.cast refuses zero-size shapes such as (0,) or (2, 0, 3).
        return arr.reshape(-1).view(np.uint8).data

    def decode_into(self, src: np.ndarray, out: np.ndarray) -> None:
        if len(src) != out.nbytes:
            raise CodecError(
                f"raw value of {out.dtype} {out.shape} needs {out.nbytes} bytes, got {len(src)}",
                codec="raw",
            )
        out[...] = np.frombuffer(src, dtype=out.dtype, count=out.size).reshape(out.shape)

    def decode_batch(self, src: Payloads, out: np.ndarray, parallel: ParallelMap = serial) -> None:
        # One copy of the whole column (the reader avoids even that: raw_bytes = True).
        if len(src.data) != out.nbytes:
            raise CodecError(
                f"raw column of {out.dtype} {out.shape} needs {out.nbytes} bytes, got "
                f"{len(src.data)}",
                codec="raw",
            )
        out.reshape(-1).view(np.uint8)[:] = src.data
