"""The local block cache of remote reads (``rowstore.open(url, cache=DIR)``), over a real HTTP
server and a GCS emulator: later epochs read locally; two processes share it; a SIGKILLed
filler and damaged files are never trusted; the size limit holds."""

from __future__ import annotations

import multiprocessing
import os
import signal

import numpy as np
import pytest
from helpers import scaled, wait_until

import rowstore
from rowstore import Field, Schema
from rowstore.storage.cache import BlockCache

pytest.importorskip("fsspec")

SCHEMA = Schema([Field("x", "float32", (16,)), Field("label", "int64"), Field("text", "str")])
N = 4000


@pytest.fixture(scope="module", params=["http", "gs"])
def served(request, tmp_path_factory, http_factory):
    """``(url, local directory, storage_options)`` of one dataset served over HTTP, then GCS."""
    d = str(tmp_path_factory.mktemp("cached"))
    cols = {
        "x": np.random.default_rng(0).random((N, 16), dtype=np.float32),
        "label": np.arange(N),
        "text": [f"row {i}" for i in range(N)],
    }
    with rowstore.DatasetWriter(
        os.path.join(d, "ds"), SCHEMA, shard_bytes=100_000, block_bytes=8 << 10, compression="lz4"
    ) as w:
        w.write_batch(cols)
    if request.param == "gs":
        import fsspec

        _, so = request.getfixturevalue("gcs_server")
        fsspec.filesystem("gs", **so).put(d + "/ds/", "rowstore/cached/ds/", recursive=True)
        return "gs://rowstore/cached/ds", os.path.join(d, "ds"), so
    srv = http_factory(d)
    return srv.url + "/ds", os.path.join(d, "ds"), None


def _epoch(r, seed=0):
    out = [b for b in r.batches(250, seed=seed, window=4)]
    return np.concatenate([b["label"] for b in out]), np.concatenate([b["x"] for b in out])


def test_later_epochs_read_from_the_cache(served, tmp_path):
    url, local, so = served
    want = _epoch(rowstore.open(local))
    r = rowstore.open(url, cache=str(tmp_path / "c"), storage_options=so)
    got = _epoch(r)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    first = r._store.requests
    assert first > 0
    r._store.wait_for_copies()  # the shard objects, copied whole in the background
    assert r._store.copy_requests >= r.layout.num_shards
    got = _epoch(r)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert r._store.requests == first  # the second epoch made no request
    # ... and read the local copies as local files are read (no chunk of the cache)
    assert len(r._store._copies) == r.layout.num_shards and r._store._cache.hits == 0
    # a fresh reader reads them too, and makes no request
    r2 = rowstore.open(url, cache=str(tmp_path / "c"), storage_options=so)
    assert all(np.array_equal(a, b) for a, b in zip(want, _epoch(r2)))
    assert r2._store.requests == 0 and r2._store.copy_requests == 0


def test_a_damaged_copy_is_dropped_and_read_remotely(served, tmp_path):
    """A local copy whose bytes differ from the index's CRCs is never served: the read that
    finds it drops it and fetches the chunks; a copy of another size is not opened."""
    url, local, so = served
    want = _epoch(rowstore.open(local))
    cache = str(tmp_path / "c")
    r = rowstore.open(url, cache=cache, storage_options=so)
    _epoch(r)
    r._store.wait_for_copies()
    objs = sorted(f for f, _ in BlockCache(cache, 1 << 30)._files() if f.endswith(".obj"))
    assert len(objs) == r.layout.num_shards
    with open(objs[0], "r+b") as f:  # damage every block's bytes of one copy
        data = bytearray(f.read())
        for i in range(64, len(data) - 64, 512):
            data[i] ^= 0x5A
        f.seek(0)
        f.write(data)
    with open(objs[1], "ab") as f:  # another size: not the object
        f.write(b"x")
    r2 = rowstore.open(url, cache=cache, storage_options=so)
    assert all(np.array_equal(a, b) for a, b in zip(want, _epoch(r2)))
    # both were dropped (and copied again, whole): every copy now holds a shard's bytes
    r2._store.wait_for_copies()
    want_bytes = set()
    for name in sorted(os.listdir(os.path.join(local, "shards"))):
        with open(os.path.join(local, "shards", name), "rb") as f:
            want_bytes.add(f.read())
    for p in objs:
        if os.path.exists(p):
            with open(p, "rb") as f:
                assert f.read() in want_bytes, p


def _fill(url, so, cache, seed, q):
    r = rowstore.open(url, cache=cache, storage_options=so)
    q.put([a.tolist() for a in _epoch(r, seed)[:1]])


def test_two_processes_share_the_cache(served, tmp_path):
    url, local, so = served
    cache = str(tmp_path / "c")
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_fill, args=(url, so, cache, s, q)) for s in (1, 2)]
    for p in procs:
        p.start()
    res = [q.get(timeout=scaled(120)) for _ in procs]
    for p in procs:
        p.join(scaled(60))
        assert p.exitcode == 0
    ref = rowstore.open(local)
    assert sorted(map(tuple, (tuple(r[0]) for r in res))) == sorted(
        tuple(_epoch(ref, s)[0].tolist()) for s in (1, 2)
    )
    r = rowstore.open(url, cache=cache, storage_options=so)
    assert all(np.array_equal(a, b) for a, b in zip(_epoch(ref, 3), _epoch(r, 3)))
    assert r._store.requests == 0  # everything came from what the two processes cached


def _read_forever(url, so, cache):
    r = rowstore.open(url, cache=cache, storage_options=so)
    for s in range(1000):
        for _ in r.batches(100, seed=s, window=2):
            pass


def test_killed_filler_and_damaged_files_are_not_trusted(served, tmp_path):
    url, local, so = served
    cache = str(tmp_path / "c")
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_read_forever, args=(url, so, cache))
    p.start()
    c = BlockCache(cache, 1 << 30)

    def chunk_files():
        return [f for f, _ in c._files() if f.endswith(".blk")]

    wait_until(lambda: len(chunk_files()) >= 5, timeout=60)  # asserted below
    os.kill(p.pid, signal.SIGKILL)
    p.join(scaled(10))
    files = chunk_files()
    assert len(files) >= 5
    # A half-written file under the final name and a foreign one: both dropped on use.
    with open(files[0], "r+b") as f:
        f.truncate(os.path.getsize(files[0]) // 2)
    with open(files[1], "r+b") as f:
        f.seek(40)
        f.write(b"garbage!")
    r = rowstore.open(url, cache=cache, storage_options=so)
    ref = rowstore.open(local)
    assert all(np.array_equal(a, b) for a, b in zip(_epoch(ref, 5), _epoch(r, 5)))
    # Both damaged files are refused on use (and removed), never served: the reader above
    # dropped them where it used the chunk files (it reads whole-object copies once made).
    for f in files[:2]:
        size = int(f[: -len(".blk")].rsplit("-", 1)[1])
        if os.path.exists(f) and not _valid(f):  # (a valid one was dropped and cached again)
            assert c._get(f, size) is None and not os.path.exists(f)
    for f, _ in c._files():
        assert f.endswith(".obj") or _valid(f), f  # (copies: checked by the reads' CRCs)


def _valid(path: str) -> bool:
    import struct
    import zlib

    with open(path, "rb") as fh:
        data = fh.read()
    magic, n, crc = struct.unpack_from("<8sQI", data)
    return magic == b"RSBLKC01" and len(data) == 20 + n and zlib.crc32(data[20:]) == crc


def test_size_limit(served, tmp_path):
    url, local, so = served
    limit = 40_000
    r = rowstore.open(
        url, cache=str(tmp_path / "c"), remote={"cache_bytes": limit}, storage_options=so
    )
    ref = rowstore.open(local)
    assert all(np.array_equal(a, b) for a, b in zip(_epoch(ref), _epoch(r)))
    assert 0 < r._store._cache.size() <= limit


def test_a_single_files_metadata_is_cached(tmp_path, http_factory):
    """A single remote file's HDF5 metadata pages go to the cache: the next open of the same
    object (same size and ETag) makes one request (the HEAD), and reads the same."""
    d = tmp_path / "srv"
    d.mkdir()
    with rowstore.Writer(str(d / "f.h5"), SCHEMA, block_bytes=8 << 10) as w:
        w.write_batch(
            {"x": np.ones((500, 16), np.float32), "label": np.arange(500), "text": ["a"] * 500}
        )
    srv = http_factory(str(d))
    cache = str(tmp_path / "c")
    before = srv.requests
    a = rowstore.open(srv.url + "/f.h5", cache=cache)
    assert 2 <= srv.requests - before <= 3  # the HEAD, then head and tail (one GET: a small file)
    before = srv.requests
    b = rowstore.open(srv.url + "/f.h5", cache=cache)
    assert srv.requests - before == 1
    assert np.array_equal(a.take(np.arange(500))["label"], b.take(np.arange(500))["label"])


def test_one_process_keeps_the_cache_within_its_limit(tmp_path):
    """After every write the cache holds at most max_bytes (evicting down to 90%, oldest
    first), also when it starts from files an earlier process left."""
    from rowstore.storage.cache import BlockCache

    limit = 10_000
    first = BlockCache(str(tmp_path / "c"), limit)
    for k in range(15):
        first.put((0, k * 500, 500), "http://h/x.h5", (1,), bytes([k]) * 500)
    again = BlockCache(str(tmp_path / "c"), limit)  # a new process: starts from what is there
    for k in range(15, 100):
        again.put((0, k * 500, 500), "http://h/x.h5", (1,), bytes([k % 256]) * 500)
        assert again.size() <= limit, k
    assert (
        again.get((0, 99 * 500, 500), "http://h/x.h5", (1,)) == bytes([99]) * 500
    )  # the newest stay
