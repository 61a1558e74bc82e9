"""Make the format-v1 golden file ``golden_v1.h5`` and its expected content ``golden_v1.json``.

Run once, from the repository root::

    .venv/bin/python tests/data/make_golden_v1.py

The files are committed and NEVER regenerated: they pin format v1 (a reader that cannot read them
has broken compatibility). The script refuses to overwrite either file. Values come from simple
formulas (no random generator), so the script documents exactly what the file holds.
"""

from __future__ import annotations

import base64
import json
import os
import sys

import numpy as np

import rowstore
from rowstore import Field, Schema

HERE = os.path.dirname(os.path.abspath(__file__))
H5 = os.path.join(HERE, "golden_v1.h5")
JSON = os.path.join(HERE, "golden_v1.json")

NUM_ROWS = 36
ROWS_PER_BLOCK = 8  # 5 blocks, the last one partial (4 rows)
HEAP_CHUNK_BYTES = 256  # many heap chunks; payloads span chunk boundaries
COMPRESSION = "lz4"
ATTRS = {"name": "golden_v1", "made_by": "tests/data/make_golden_v1.py", "note": "never regenerate"}

SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("score", "float32"),
        Field("vec", "float64", (3,)),
        Field("mat", "int16", (2, 3)),
        Field("flag", "bool"),
        Field("maybe", "int32", nullable=True),
        Field("label", "str"),
        Field("note", "bytes", nullable=True),
        Field("wave", "float32", (None,)),
        Field("grid", "int32", (None, None)),
        Field("pairs", "uint16", (None, 2)),
        Field("image", "uint8", (8, 6, 3), codec={"id": "png", "level": 1}),
    ]
)

LABELS = ["", "a", "golden", "café", "日本語", "😀 emoji", "e\u0301", "x" * 40]
SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 3.4e38]


def make_row(i: int) -> dict:
    image = (
        np.arange(8)[:, None, None] * 30
        + np.arange(6)[None, :, None] * 40
        + np.arange(3) * 7
        + i * 11
    ) % 256
    return {
        "id": i * 1_000_000_007 - 2**40,
        "score": np.float32(SPECIAL[i % len(SPECIAL)] if i % 3 == 0 else i / 7),
        "vec": np.array([i, -i / 3, 2.0**-i]),
        "mat": ((np.arange(6).reshape(2, 3) - 3) * (i + 1) * 1000 // 7).astype(np.int16),
        "flag": i % 3 == 1,
        "maybe": None if i % 4 == 2 else i - 20,
        "label": LABELS[i % len(LABELS)] + (f" #{i}" if i % 2 else ""),
        "note": None if i % 5 == 0 else bytes((i * k) % 256 for k in range(i % 11)),
        "wave": (np.arange(i % 9, dtype=np.float32) - 4) * np.float32(0.5) ** (i % 4),
        "grid": np.arange((i % 4) * (i % 3), dtype=np.int32).reshape(i % 4, i % 3) * (-1) ** i,
        "pairs": np.array([[k, 65535 - k * i] for k in range(i % 6)], dtype=np.uint16).reshape(
            -1, 2
        ),
        "image": image.astype(np.uint8),
    }


def encode_value(field: Field, value) -> object:
    """JSON form of one value: null, a string, {"b64"} for bytes, {"dtype","shape","b64"} for
    numbers."""
    if value is None:
        return None
    if field.dtype == "str":
        return value
    if field.dtype == "bytes":
        return {"b64": base64.b64encode(bytes(value)).decode("ascii")}
    arr = np.asarray(value, dtype=field.dtype)  # not ascontiguousarray: it makes scalars 1-D
    return {
        "dtype": arr.dtype.str,
        "shape": list(arr.shape),
        "b64": base64.b64encode(arr.tobytes()).decode("ascii"),
    }


def main() -> int:
    for path in (H5, JSON):
        if os.path.exists(path):
            print(
                f"refusing to overwrite {path}: golden files are never regenerated", file=sys.stderr
            )
            return 1
    rows = [make_row(i) for i in range(NUM_ROWS)]
    with rowstore.Writer(
        H5,
        SCHEMA,
        mode="x",
        rows_per_block=ROWS_PER_BLOCK,
        heap_chunk_bytes=HEAP_CHUNK_BYTES,
        compression=COMPRESSION,
        attrs=ATTRS,
    ) as w:
        for r in rows:
            w.write(r)
    layout = rowstore.Layout.open(H5, scan=True)
    expected = {
        "format_version": layout.version,
        "made_with": {"rowstore": rowstore.__version__, "numpy": np.__version__},
        "schema": SCHEMA.to_json(),
        "user_attrs": ATTRS,
        "layout": {
            "num_rows": layout.num_rows,
            "rows_per_block": layout.rows_per_block,
            "num_blocks": layout.num_blocks,
            "row_itemsize": layout.row_dtype.itemsize,
            "heap_chunk_bytes": layout.heap_chunk_bytes,
            "heap_nbytes": layout.heap_nbytes,
            "num_heap_chunks": len(layout.heap_chunks),
            "compression": layout.compression,
            "blocks": {
                name: [int(x) for x in layout.blocks[name]] for name in layout.blocks.dtype.names
            },
            "heap_chunks": {
                name: [int(x) for x in layout.heap_chunks[name]]
                for name in layout.heap_chunks.dtype.names
            },
        },
        "rows": [{f.name: encode_value(f, r.get(f.name)) for f in SCHEMA} for r in rows],
    }
    with open(JSON, "x", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False, allow_nan=False)
        f.write("\n")
    print(f"wrote {H5} ({os.path.getsize(H5)} bytes) and {JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
