"""Make the compressed format-v3 golden file ``golden_v3_lz4.h5`` and ``golden_v3_lz4.json``.

Run once, from the repository root::

    .venv/bin/python tests/data/make_golden_v3_lz4.py

A compressed (Blosc2/LZ4) v3 file: its page index holds the CRC-32s of each chunk's *raw*
(decompressed) bytes (docs/format.md, section 12). Its heap holds incompressible payloads
(SHA-256 streams: a formula, no random generator), so most heap chunks are stored memcpy'd
(their raw bytes in the file as they are, which readers read payloads from in place and check
by those pages), and the last, zero-padded one compressed. ``golden_v3_lz4.json`` pins the
indexes, every page CRC-32, which heap chunks are memcpy'd, the footer's place, size and bytes
(SHA-256), and every value (the blob's SHA-256, the text as is). The files are committed and
NEVER regenerated: they pin format v3 for compressed files. The script refuses to overwrite.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

import rowstore
from rowstore import Field, Schema

HERE = os.path.dirname(os.path.abspath(__file__))
H5 = os.path.join(HERE, "golden_v3_lz4.h5")
JSON = os.path.join(HERE, "golden_v3_lz4.json")

NUM_ROWS = 40
ROWS_PER_BLOCK = 8
HEAP_CHUNK_BYTES = 16384  # four 4 KiB pages; payloads of 1-3 KiB cross pages and chunks
SCHEMA = Schema([Field("id", "int64"), Field("blob", "bytes"), Field("text", "str")])
ATTRS = {"name": "golden_v3_lz4", "made_by": "tests/data/make_golden_v3_lz4.py"}


def blob(i: int) -> bytes:
    """``1000 + 61 * i`` bytes of SHA-256 output: incompressible, reproducible."""
    n = 1000 + 61 * i
    out = b"".join(hashlib.sha256(f"{i}:{k}".encode()).digest() for k in range(-(-n // 32)))
    return out[:n]


def make_row(i: int) -> dict:
    return {"id": i, "blob": blob(i), "text": f"row {i} " + "ab" * (i % 5)}


def main() -> int:
    for path in (H5, JSON):
        if os.path.exists(path):
            print(
                f"refusing to overwrite {path}: golden files are never regenerated", file=sys.stderr
            )
            return 1
    with rowstore.Writer(
        H5,
        SCHEMA,
        mode="x",
        rows_per_block=ROWS_PER_BLOCK,
        heap_chunk_bytes=HEAP_CHUNK_BYTES,
        compression="lz4",
        attrs=ATTRS,
    ) as w:
        for i in range(NUM_ROWS):
            w.write(make_row(i))
    layout = rowstore.Layout.open(H5, scan=True)
    fd = os.open(H5, os.O_RDONLY)
    try:
        starts = rowstore.kernels.memcpyed_starts(
            fd,
            layout.heap_chunks["offset"],
            layout.heap_chunks["stored_nbytes"],
            codec=layout.frame_check(),
            raw_size=layout.heap_chunk_bytes,
        )
    finally:
        os.close(fd)
    with open(H5, "rb") as f:
        f.seek(layout.footer_offset)
        tail = f.read()
    expected = {
        "format_version": layout.version,
        "made_with": {"rowstore": rowstore.__version__, "numpy": np.__version__},
        "compression": layout.compression,
        "file_size": layout.file_size,
        "footer_offset": layout.footer_offset,
        "footer_and_trailer_bytes": len(tail),
        "footer_and_trailer_sha256": hashlib.sha256(tail).hexdigest(),
        "page_bytes": layout.page_bytes,
        "block_pages": [int(x) for x in layout.block_pages],
        "heap_pages": [int(x) for x in layout.heap_pages],
        "memcpyed_raw_offsets": [int(x) for x in starts],
        "blocks": {
            name: [int(x) for x in layout.blocks[name]] for name in layout.blocks.dtype.names
        },
        "heap_chunks": {
            name: [int(x) for x in layout.heap_chunks[name]]
            for name in layout.heap_chunks.dtype.names
        },
        "rows": [
            {"id": i, "blob_sha256": hashlib.sha256(blob(i)).hexdigest(), "text": r["text"]}
            for i, r in ((i, make_row(i)) for i in range(NUM_ROWS))
        ],
    }
    with open(JSON, "x", encoding="utf-8") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"wrote {H5} ({os.path.getsize(H5)} bytes) and {JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
