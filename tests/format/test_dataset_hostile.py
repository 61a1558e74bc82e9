"""Sealed hostile datasets found by ``tools/robustness/fuzz.py`` (dataset regions): a manifest and
sidecar
whose checksums are all correct but whose numbers lie. Each must be refused with a
:class:`FormatError` at open, before the reader sizes anything by them."""

from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import FormatError
from rowstore.format import manifest as M
from rowstore.format import spec


def _dataset(root, compression="lz4"):
    schema = Schema([Field("id", "int64"), Field("b", "bytes")])
    rng = np.random.default_rng(0)
    rows = [{"id": i, "b": rng.bytes(int(rng.integers(0, 300)))} for i in range(40)]
    infos = [
        rowstore.write_shard(
            root,
            schema,
            rows[a:z],
            rows_per_block=k,
            compression=compression,
            heap_chunk_bytes=256,
            name=f"s{a}",
        )
        for a, z, k in ((0, 25, 8), (25, 40, 5))
    ]
    rowstore.commit(root, infos)
    return rows


def _reseal(root, edit):
    """Apply ``edit(manifest, blocks, heap_chunks)`` and recompute every CRC a reader checks."""
    version, _ = M.read_pointer(root)
    mpath, ipath = (
        os.path.join(root, M.manifest_path(version)),
        os.path.join(root, M.index_path(version)),
    )
    m = json.load(open(mpath))
    raw = open(ipath, "rb").read()[len(M.INDEX_MAGIC) :]
    nb = sum(e["blocks"] for e in m["shards"])
    split = nb * spec.BLOCK_DTYPE.itemsize
    blocks = np.frombuffer(raw[:split], spec.BLOCK_DTYPE).copy()
    heap = np.frombuffer(raw[split:], spec.HEAP_CHUNK_DTYPE).copy()
    edit(m, blocks, heap)
    b0 = h0 = 0
    for e in m["shards"]:
        e["index_crc32"] = M.index_crc32(
            blocks[b0 : b0 + e["blocks"]], heap[h0 : h0 + e["heap_chunks"]]
        )
        b0, h0 = b0 + e["blocks"], h0 + e["heap_chunks"]
    side = M.INDEX_MAGIC + blocks.tobytes() + heap.tobytes()
    open(ipath, "wb").write(side)
    m["index"].update(nbytes=len(side), crc32=zlib.crc32(side))
    text = json.dumps(m).encode()
    open(mpath, "wb").write(text)
    p = json.load(open(os.path.join(root, M.POINTER)))
    p["manifest_crc32"] = zlib.crc32(text)
    open(os.path.join(root, M.POINTER), "w").write(json.dumps(p))


def _last_by_offset(arr, lo, hi):
    return lo + int(np.argmax(arr["offset"][lo:hi]))


@pytest.mark.parametrize("what", ["heap chunk", "block"])
def test_a_huge_compressed_chunk_under_an_inflated_file_size_is_refused_at_open(tmp_path, what):
    """Found probing the fuzzer's sealed sidecar edits (a stored size together with its shard's
    file_size; the fuzzer now makes such pairs too): the manifest's file_size is checked only when
    a shard is first read, so a stored size bounded by it was unbounded; the reader then sized
    its staging buffer by it (``MemoryError`` allocating 256 GiB before any check). A stored
    chunk is now bounded by its raw size plus ``spec.MAX_FRAME_OVERHEAD``."""
    root = str(tmp_path / "ds")
    _dataset(root)

    def edit(m, blocks, heap):
        m["shards"][0]["file_size"] = 1 << 62
        if what == "block":  # the block last in the file: no neighbour to overlap
            k = _last_by_offset(blocks, 0, m["shards"][0]["blocks"])
            blocks["stored_nbytes"][k] = 1 << 38
        else:
            k = _last_by_offset(heap, 0, m["shards"][0]["heap_chunks"])
            heap["stored_nbytes"][k] = 1 << 38

    _reseal(root, edit)
    with pytest.raises(FormatError, match="frame overhead"):
        rowstore.open(root)


def test_incompressible_chunks_stay_within_the_frame_overhead(tmp_path):
    """The bound refuses no valid file: random bytes stored by every codec."""
    rng = np.random.default_rng(1)
    schema = Schema([Field("a", "uint8", (1000,)), Field("b", "bytes")])
    for comp in ("lz4", "zstd"):
        p = str(tmp_path / f"{comp}.h5")
        with rowstore.Writer(
            p, schema, compression=comp, rows_per_block=64, heap_chunk_bytes=4096
        ) as w:
            for _ in range(200):
                w.write({"a": rng.integers(0, 256, 1000, dtype=np.uint8), "b": rng.bytes(3000)})
        with rowstore.open(p) as r:
            assert len(r) == 200
            L = r.layout
            assert (
                int(L.heap_chunks["stored_nbytes"].max()) > L.heap_chunk_bytes
            )  # stored as is, framed
            assert (
                int(L.heap_chunks["stored_nbytes"].max()) - L.heap_chunk_bytes
                < spec.MAX_FRAME_OVERHEAD
            )


def test_a_schema_whose_row_layout_numpy_cannot_build_is_a_format_error(tmp_path):
    """Found by the fuzzer (sealed schema edits): a shape of (2**40, 2**40) passed the schema's
    checks and ``numpy.dtype`` raised a bare ``ValueError`` from ``rowstore.open``."""
    root = str(tmp_path / "ds")
    _dataset(root)

    def edit(m, blocks, heap):
        m["schema"]["fields"][0]["shape"] = [1 << 40, 1 << 40]

    _reseal(root, edit)
    with pytest.raises(FormatError, match="row layout"):
        rowstore.open(root)


def test_a_manifest_version_that_is_not_an_int_is_a_format_error(tmp_path):
    """``"version": 1.0`` equals the pointer's 1 in Python, and then sized a sidecar name with an
    integer format: a ``ValueError`` from open, gc and append."""
    root = str(tmp_path / "ds")
    rows = _dataset(root)

    def edit(m, blocks, heap):
        m["version"] = float(m["version"])

    _reseal(root, edit)
    with pytest.raises(FormatError, match="holds version 1.0"):
        rowstore.open(root)
    with pytest.raises(FormatError, match="holds version 1.0"):
        rowstore.gc_dataset(root)
    info = rowstore.write_shard(
        root, Schema([Field("id", "int64"), Field("b", "bytes")]), rows[:3], name="more"
    )
    with pytest.raises(FormatError, match="holds version 1.0"):
        rowstore.commit(root, [info], mode="a")


def test_a_resealed_manifest_with_its_shards_reordered_is_refused(tmp_path, capsys):
    """Entries and sidecar reversed together and every CRC recomputed: each shard still matches
    its file, but the rows would come in another order. The entries' ``first_row`` pins their
    place; ``open`` and ``rowstore verify`` refuse the reordered manifest."""
    from rowstore.cli import main

    root = str(tmp_path / "ds")
    rows = _dataset(root)
    with rowstore.open(root) as r:
        assert r.take(np.arange(40))["id"].tolist() == [row["id"] for row in rows]

    def reverse(m, blocks, heap):
        b = np.cumsum([0] + [e["blocks"] for e in m["shards"]])
        h = np.cumsum([0] + [e["heap_chunks"] for e in m["shards"]])
        n = len(m["shards"])
        blocks[:] = np.concatenate([blocks[b[i] : b[i + 1]] for i in reversed(range(n))])
        heap[:] = np.concatenate([heap[h[i] : h[i + 1]] for i in reversed(range(n))])
        m["shards"].reverse()

    _reseal(root, reverse)
    with pytest.raises(
        FormatError, match="shard 0.: first_row 25, but the shards before it hold 0 rows"
    ):
        rowstore.open(root)
    assert main(["verify", root]) == 1
    out = capsys.readouterr()
    assert "first_row 25" in out.out + out.err

    # Without the key (an optional one) the order is not checked: such a manifest still opens.
    def drop(m, blocks, heap):
        for e in m["shards"]:
            del e["first_row"]

    _reseal(root, drop)
    with rowstore.open(root) as r:
        assert r.take(np.arange(40))["id"].tolist()[:15] == list(range(25, 40))
