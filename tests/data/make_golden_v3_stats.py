"""Make ``golden_v3_stats.h5``, a format-v3 file with statistics (the ``stats`` attribute,
``docs/format.md`` "Statistics"), and its expected content ``golden_v3_stats.json``.

Run once, from the repository root::

    .venv/bin/python tests/data/make_golden_v3_stats.py

The rows are those of the v1 golden file (``make_golden_v1.make_row``: every kind of field,
NaN/inf, nulls, str, bytes, variable arrays, a PNG image), written uncompressed, so
``golden_v1.json`` holds the values; ``golden_v3_stats.json`` pins the statistics exactly as
stored and the footer's bytes (SHA-256). The files are committed and NEVER regenerated: they pin
the stored form of statistics. The script refuses to overwrite.
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

H5 = os.path.join(HERE, "golden_v3_stats.h5")
JSON = os.path.join(HERE, "golden_v3_stats.json")


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
        "footer_and_trailer_sha256": hashlib.sha256(tail).hexdigest(),
        "stats": layout.stats,
    }
    with open(JSON, "x", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {H5} ({os.path.getsize(H5)} bytes) and {JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
