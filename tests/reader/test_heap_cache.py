"""Heap chunks shared by the blocks of two window segments are decompressed once (the reader's
heap chunk cache), and reads give the same batches with and without it."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.reader import Reader

ROWS = 600
# Small integers as float32: heap chunks that compress (incompressible ones are stored
# memcpy'd, which the cache does not keep).
ROWS_W = [
    np.random.default_rng(i).integers(0, 8, i * 7 % 300).astype(np.float32) for i in range(ROWS)
]


@pytest.fixture(scope="module")
def lz4_heap_file(tmp_path_factory) -> str:
    """LZ4 rows whose variable payloads (compressible and not) straddle heap chunks."""
    path = str(tmp_path_factory.mktemp("heap_cache") / "lz4.h5")
    schema = Schema([Field("id", "int64"), Field("w", "float32", (None,)), Field("s", "str")])
    with rowstore.Writer(
        path, schema, rows_per_block=8, heap_chunk_bytes=4096, compression="lz4"
    ) as w:
        for i in range(ROWS):
            w.write(
                {
                    "id": i,
                    "w": ROWS_W[i],
                    "s": "x" * (i % 40),
                }
            )
    return path


def _epoch(reader: Reader, shuffle: str) -> list[dict]:
    return list(reader.batches(32, shuffle=shuffle, seed=7, epoch=1, window=4))


@pytest.mark.parametrize("shuffle", ["block", "none", "full"])
@pytest.mark.parametrize("threads", [1, 2])
def test_batches_are_the_same_with_and_without_the_cache(lz4_heap_file, shuffle, threads):
    cached = Reader(lz4_heap_file, num_threads=threads)
    plain = Reader(lz4_heap_file, num_threads=threads)
    assert cached._gatherer._heap_cache is not None
    plain._gatherer._heap_cache = None
    got, want = _epoch(cached, shuffle), _epoch(plain, shuffle)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a["id"].tolist() == b["id"].tolist()
        assert list(a["s"]) == list(b["s"])
        assert all(np.array_equal(x, y) for x, y in zip(a["w"], b["w"]))
    seen = set()
    for b in got:  # exactly the rows written, each once
        for i, w, s in zip(b["id"].tolist(), b["w"], b["s"]):
            assert np.array_equal(w, ROWS_W[i]) and s == "x" * (i % 40)
            seen.add(i)
    assert seen == set(range(ROWS))
    cached.close()
    plain.close()


@pytest.mark.parametrize("shuffle", ["block", "none"])
def test_each_heap_chunk_is_decompressed_once_an_epoch(lz4_heap_file, shuffle):
    """One thread, every block read once: each heap chunk goes through the kernel once, where
    without the cache the chunks shared by two windows' blocks go through it twice."""
    r = Reader(lz4_heap_file, num_threads=1)
    g = r._gatherer
    chunks = len(g.arr["hc_offset"])
    _epoch(r, shuffle)
    assert g.heap_chunks_loaded == chunks
    plain = Reader(lz4_heap_file, num_threads=1)
    plain._gatherer._heap_cache = None
    _epoch(plain, shuffle)
    assert plain._gatherer.heap_chunks_loaded > chunks  # the test sees straddling chunks
    r.close()
    plain.close()


def test_verify_always_reads_every_chunk_each_time(lz4_heap_file):
    r = Reader(lz4_heap_file, num_threads=1, verify="always")
    assert r._gatherer._heap_cache is None
    _epoch(r, "block")
    assert r._gatherer.heap_chunks_loaded > len(r._gatherer.arr["hc_offset"])
    r.close()
