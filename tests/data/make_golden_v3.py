"""Make the format-v3 golden file ``golden_v3.h5`` and its expected layout ``golden_v3.json``.

Run once, from the repository root::

    .venv/bin/python tests/data/make_golden_v3.py

The rows are those of the v1 golden file (``make_golden_v1.make_row``: the same schema, user
attributes, rows per block and heap chunk size), written uncompressed (only uncompressed files
carry the page index), so ``golden_v1.json`` holds the values; ``golden_v3.json`` pins what v3
adds: the page size, every page CRC-32, and the footer's place, size and bytes (SHA-256). The
files are committed and NEVER regenerated: they pin format v3. The script refuses to overwrite.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import make_golden_v1 as v1  # noqa: E402

import rowstore  # noqa: E402

H5 = os.path.join(HERE, "golden_v3.h5")
JSON = os.path.join(HERE, "golden_v3.json")


def main() -> int:
    for path in (H5, JSON):
        if os.path.exists(path):
            print(
                f"refusing to overwrite {path}: golden files are never regenerated", file=sys.stderr
            )
            return 1
    with rowstore.Writer(
        H5,
        v1.SCHEMA,
        mode="x",
        rows_per_block=v1.ROWS_PER_BLOCK,
        heap_chunk_bytes=v1.HEAP_CHUNK_BYTES,
        compression=None,
        attrs=v1.ATTRS,
    ) as w:
        for i in range(v1.NUM_ROWS):
            w.write(v1.make_row(i))
    layout = rowstore.Layout.open(H5, scan=True)
    with open(H5, "rb") as f:
        f.seek(layout.footer_offset)
        tail = f.read()
    expected = {
        "format_version": layout.version,
        "made_with": {"rowstore": rowstore.__version__, "numpy": np.__version__},
        "values": "golden_v1.json (rows, schema, user_attrs)",
        "file_size": layout.file_size,
        "footer_offset": layout.footer_offset,
        "footer_and_trailer_bytes": len(tail),
        "footer_and_trailer_sha256": hashlib.sha256(tail).hexdigest(),
        "page_bytes": layout.page_bytes,
        "block_pages": [int(x) for x in layout.block_pages],
        "heap_pages": [int(x) for x in layout.heap_pages],
        "blocks": {
            name: [int(x) for x in layout.blocks[name]] for name in layout.blocks.dtype.names
        },
        "heap_chunks": {
            name: [int(x) for x in layout.heap_chunks[name]]
            for name in layout.heap_chunks.dtype.names
        },
    }
    with open(JSON, "x", encoding="utf-8") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"wrote {H5} ({os.path.getsize(H5)} bytes) and {JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
