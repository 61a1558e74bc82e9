"""verify=True checks a compressed file's chunks once per reader (as direct reads check each
page once); verify="always" checks every load; verify=False none. A chunk corrupted on disk
is still refused the first time a reader loads it."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import RowstoreError
from rowstore.reader import Reader

ROWS = 400


@pytest.fixture(scope="module")
def lz4_file(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("compressed_checks") / "lz4.h5")
    schema = Schema(
        [Field("id", "int64"), Field("x", "float32", (16,)), Field("w", "uint8", (None,))]
    )
    with rowstore.Writer(
        path, schema, rows_per_block=16, heap_chunk_bytes=4096, compression="lz4"
    ) as w:
        for i in range(ROWS):
            w.write({"id": i, "x": np.full(16, i % 7, np.float32), "w": np.zeros(i % 50, np.uint8)})
    return path


def _recording(reader: Reader) -> list[tuple[str, bool, int]]:
    """(what, verify, chunks) of every whole-chunk load the reader's gather makes."""
    calls: list[tuple[str, bool, int]] = []
    store = reader._gatherer.store
    load = store.load_chunks

    def recorded(owner, offsets, *args, verify, what, **kw):
        calls.append((what, verify, len(offsets)))
        return load(owner, offsets, *args, verify=verify, what=what, **kw)

    store.load_chunks = recorded
    return calls


def _epoch(reader: Reader, epoch: int) -> list[int]:
    ids = []
    for b in reader.batches(32, shuffle="block", seed=3, epoch=epoch, window=4):
        ids += b["id"].tolist()
    return ids


@pytest.mark.parametrize("verify", [True, "always", False])
def test_chunks_are_checked_once_per_reader_unless_always(lz4_file, verify):
    r = Reader(lz4_file, num_threads=1, verify=verify)
    calls = _recording(r)
    assert sorted(_epoch(r, 0)) == list(range(ROWS))
    first = list(calls)
    calls.clear()
    assert sorted(_epoch(r, 1)) == list(range(ROWS))
    second = list(calls)
    r.close()
    assert first and second
    blocks = [c for c in first if c[0] == "block"]
    assert blocks and sum(n for _, _, n in blocks) >= r.layout.num_blocks
    if verify is True:
        assert all(v for what, v, _n in first if what == "block")  # first loads are checked
        assert not any(v for _w, v, _n in second)  # every chunk was checked in epoch 0
    else:
        assert all(v == bool(verify) for _w, v, _n in first + second)


def test_a_corrupt_chunk_is_refused_on_its_first_load(lz4_file, tmp_path):
    L = rowstore.Layout.open(lz4_file)
    a = L.arrays()
    k = L.num_blocks // 2
    bad = tmp_path / "bad.h5"
    data = bytearray(open(lz4_file, "rb").read())
    data[int(a["offset"][k]) + int(a["stored"][k]) // 2] ^= 0x5A
    bad.write_bytes(bytes(data))
    r = Reader(str(bad), num_threads=1)
    with pytest.raises(RowstoreError, match=f"block {k}"):
        _epoch(r, 0)
    r.close()
