"""Many blocks open in bounded memory (scale).

A dataset of 200,000 one-row blocks (200 hard links of one shard file of 1,000 one-row blocks,
committed as 200 shards: the fastest way to make that many blocks, as ``bench/dataset_bench.py
--only scale`` does for its million) and a single file of 8,000 one-row blocks (written by the
``Writer``: about a millisecond a block) are opened in a fresh process; the peak of Python's
allocations during ``rowstore.open`` (``tracemalloc``: numpy's arrays included) and the growth of
the process's peak RSS (``VmHWM``) are compared with the size of the block index (the dataset's
sidecar; for the file, the index's 56 bytes a block as the sidecar stores them). The figure for a
million blocks is in docs/performance.md (``--only scale``: RSS +154-200 MiB, ~150-200 bytes a
block, open in 0.27 s idle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from helpers import ROOT

import rowstore
from rowstore.format import manifest
from rowstore.format.index import Layout

SCHEMA = rowstore.Schema({"y": "int64"})

CHILD = r"""
import json, os, sys, tracemalloc
import numpy as np
import rowstore

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
path = sys.argv[1]
with rowstore.open(path) as r:  # warm: imports and caches of the first open are not the index's
    r.take(np.arange(2))
h0 = hwm()
tracemalloc.start()
r = rowstore.open(path)
cur, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
h1 = hwm()
n = len(r)
rows = np.array([0, n // 2, n - 1])
ys = r.take(rows)["y"].tolist()
blocks = r.layout.num_blocks
r.close()
print("RESULT " + json.dumps({"blocks": blocks, "rows": n, "ys": ys, "traced_peak": peak,
"traced_kept": cur,
                              "hwm_growth": h1 - h0}))
"""


def _measure(path: str) -> dict:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, path], capture_output=True, text=True, timeout=120, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _one_row_blocks(path: str, n: int, lo: int = 0) -> None:
    with rowstore.Writer(path, SCHEMA, rows_per_block=1) as w:
        w.write_batch({"y": np.arange(lo, lo + n, dtype=np.int64)})


def test_a_dataset_of_200k_blocks_opens_in_memory_bounded_by_its_index(tmp_path):
    nshards, per = 200, 1000
    one = str(tmp_path / "one.h5")
    _one_row_blocks(one, per)
    root = tmp_path / "ds"
    os.makedirs(root / manifest.SHARD_DIR)
    L = Layout.open(one)
    entries = []
    for k in range(nshards):
        rel = f"{manifest.SHARD_DIR}/part-{k:05d}.h5"
        os.link(one, root / rel)
        entries.append(manifest.shard_entry(rel, L))
    with manifest.commit_lock(str(root)):
        manifest.publish(
            str(root),
            schema=SCHEMA,
            attrs={},
            compression=L.compression,
            heap_chunk_bytes=L.heap_chunk_bytes,
            shards=entries,
            blocks=[L.blocks] * nshards,
            heap_chunks=[L.heap_chunks] * nshards,
        )
    index_bytes = os.path.getsize(root / manifest.index_path(1))
    got = _measure(str(root))
    blocks = nshards * per
    assert got["blocks"] == blocks and got["rows"] == blocks
    assert got["ys"] == [0, (blocks // 2) % per, per - 1]  # every shard is the same file
    # The reader's index is a few contiguous copies of the sidecar's columns; the check's
    # temporaries come and go. Measured here: a peak of 4.1x the sidecar (227 bytes a block),
    # 2.4x kept, VmHWM +27 MB for an 11 MB sidecar.
    assert got["traced_peak"] <= 6 * index_bytes + (8 << 20), (got, index_bytes)
    assert got["traced_kept"] <= 3 * index_bytes + (4 << 20), (got, index_bytes)
    assert got["hwm_growth"] <= 8 * index_bytes + (32 << 20), (got, index_bytes)


def test_a_file_of_8000_blocks_opens_in_memory_bounded_by_its_index(tmp_path):
    n = 8000
    path = str(tmp_path / "f.h5")
    _one_row_blocks(path, n, lo=10)
    index_bytes = n * 56  # the block index as a dataset's sidecar stores it (56 bytes a block)
    got = _measure(path)
    assert got["blocks"] == n and got["rows"] == n and got["ys"] == [10, 10 + n // 2, 10 + n - 1]
    assert got["traced_peak"] <= 8 * index_bytes + (4 << 20), (got, index_bytes)
    assert got["hwm_growth"] <= 8 * index_bytes + (32 << 20), (got, index_bytes)
