"""Make the dataset-manifest-v1 golden dataset ``golden_dataset_v1/`` and
``golden_dataset_v1.json``.

Run once, from the repository root::

    .venv/bin/python tests/data/make_golden_dataset_v1.py

Committed and NEVER regenerated: it pins dataset manifest v1 (pointer, manifest, block-index
sidecar, shard files). Three shards of the rows of ``make_golden_v1.py`` (same schema and
formulas), with different rows per block (8, 5, 8) so that row ids are not dense, committed as
version 1 and then a fourth shard appended as version 2 (so two versions exist). The script
refuses to overwrite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np

import rowstore
from rowstore.format import manifest
from rowstore.format.index import Layout

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "golden_dataset_v1")
JSON = os.path.join(HERE, "golden_dataset_v1.json")
#: (rows, rows_per_block) per shard; the last one is appended as version 2.
SHARDS = [(15, 8), (9, 5), (12, 8), (6, 4)]
HEAP_CHUNK_BYTES = 256
COMPRESSION = "lz4"
ATTRS = {
    "name": "golden_dataset_v1",
    "made_by": "tests/data/make_golden_dataset_v1.py",
    "note": "never regenerate",
}


def _golden_v1():
    spec = importlib.util.spec_from_file_location(
        "make_golden_v1", os.path.join(HERE, "make_golden_v1.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    for path in (ROOT, JSON):
        if os.path.exists(path):
            print(
                f"refusing to overwrite {path}: golden files are never regenerated", file=sys.stderr
            )
            return 1
    g = _golden_v1()
    rows = [g.make_row(i) for i in range(sum(n for n, _ in SHARDS))]
    os.makedirs(os.path.join(ROOT, manifest.SHARD_DIR))
    entries, blocks, chunks, pos = [], [], [], 0
    for k, (n, rpb) in enumerate(SHARDS):
        rel = f"{manifest.SHARD_DIR}/part-{k:04d}.h5"
        with rowstore.Writer(
            os.path.join(ROOT, rel),
            g.SCHEMA,
            mode="x",
            rows_per_block=rpb,
            heap_chunk_bytes=HEAP_CHUNK_BYTES,
            compression=COMPRESSION,
        ) as w:
            for r in rows[pos : pos + n]:
                w.write(r)
        pos += n
        L = Layout.open(os.path.join(ROOT, rel), scan=True)
        entries.append(manifest.shard_entry(rel, L))
        blocks.append(L.blocks)
        chunks.append(L.heap_chunks)
        if k >= len(SHARDS) - 2:  # after shard 2: version 1; after shard 3: version 2
            with manifest.commit_lock(ROOT):
                manifest.publish(
                    ROOT,
                    schema=g.SCHEMA,
                    attrs=ATTRS,
                    compression=L.compression,
                    heap_chunk_bytes=HEAP_CHUNK_BYTES,
                    shards=entries,
                    blocks=blocks,
                    heap_chunks=chunks,
                    parent=None if k == len(SHARDS) - 2 else 1,
                )
    os.remove(
        os.path.join(ROOT, manifest.MANIFEST_DIR, manifest.LOCK)
    )  # a commit's lock file: not part of the format
    expected = {
        "manifest_format_version": manifest.FORMAT_VERSION,
        "made_with": {"rowstore": rowstore.__version__, "numpy": np.__version__},
        "schema": g.SCHEMA.to_json(),
        "attrs": ATTRS,
        "versions": {"1": sum(n for n, _ in SHARDS[:-1]), "2": sum(n for n, _ in SHARDS)},
        "shards": entries,
        "rows": [{f.name: g.encode_value(f, r.get(f.name)) for f in g.SCHEMA} for r in rows],
    }
    with open(JSON, "x", encoding="utf-8") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False, allow_nan=False)
        f.write("\n")
    print(f"wrote {ROOT} and {JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
