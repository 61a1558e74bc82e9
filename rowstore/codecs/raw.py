"""``raw``: numbers stored as their little-endian bytes.

Fixed shapes are stored inline in the row (the reader's kernels copy them, no Python per value);
variable shapes (a ``None`` dimension) are stored in the heap, the row holding the variable
dimensions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rowstore.codecs.abc import Codec
from rowstore.errors import SchemaError

if TYPE_CHECKING:
    from rowstore.schema import Field

__all__ = ["Raw"]


class Raw(Codec):
    codec_id = "raw"
    # Placement depends on the field's shape; the format layer asks ``is_inline(field)``.
    inline = True

    def check_field(self, field: Field) -> None:
        if field.dtype in ("str", "bytes"):
            raise SchemaError(f"field {field.name!r}: codec 'raw' stores numbers; use 'utf8' or 'bytes' for {field.dtype}", field=field.name)

    def encode(self, value: Any, field: Field) -> memoryview:
        arr = np.ascontiguousarray(value, dtype=field.dtype)
        # A flat uint8 view: memoryview.cast refuses zero-size shapes such as (0,) or (2, 0, 3).
        return arr.reshape(-1).view(np.uint8).data

    def decode_into(self, src: memoryview | np.ndarray, out: np.ndarray) -> None:
        flat = np.frombuffer(src, dtype=out.dtype, count=out.size)
        out[...] = flat.reshape(out.shape)
