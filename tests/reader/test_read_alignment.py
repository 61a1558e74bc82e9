"""Segments cut at batch boundaries: the same epoch order, cut elsewhere.

Where the gather reads a window's rows directly (uncompressed local files with large rows or
heap fields), ``Reader.batches`` and ``Reader.deal`` cut the order into position ranges of whole
batches (``EpochOrder.aligned``) instead of windows, so that no batch is concatenated from two
segments. These tests check that it is the same order (every row once, deterministic, resumable)
and that the reader takes that path where it should and only there.
"""

import os
import threading

import numpy as np
import pytest

from rowstore import Writer
from rowstore.reader import Reader, order
from rowstore.schema import Field, Schema


def _rows(segs):
    parts = [s.rows() for s in segs]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@pytest.mark.parametrize("mode", ["block", "none", "full"])
def test_aligned_is_the_same_order_randomized(mode):
    rng = np.random.default_rng(5)
    for trial in range(40):
        nb, rpb = int(rng.integers(1, 30)), int(rng.integers(1, 40))
        br = np.full(nb, rpb, np.int64)
        br[-1] = int(rng.integers(0, rpb + 1))
        keep = rng.random(int(br.sum())) < 0.7 if trial % 3 == 0 else None
        eo = order.EpochOrder(
            br,
            rpb,
            shuffle=mode,
            seed=trial,
            epoch=trial % 4,
            window=int(rng.integers(1, 6)),
            keep=keep,
        )
        n = eo.num_rows
        lo = int(rng.integers(0, n + 1))
        hi = int(rng.integers(lo, n + 2))
        step = int(rng.integers(1, 3 * rpb + 2))
        segs = list(eo.aligned(lo, hi, step))
        want = _rows(eo.segments(lo, hi))
        assert np.array_equal(_rows(segs), want)
        assert np.array_equal(want, eo.ids(lo, hi) if lo < min(hi, n) else np.zeros(0, np.int64))
        lens = [len(s) for s in segs]
        assert all(m == step for m in lens[:-1]) and sum(lens) == len(want)
        assert all(s.blocks is None and s.local() is None for s in segs)  # rows only: read directly


def test_aligned_rows_from_many_threads():
    br = np.full(64, 100, np.int64)
    eo = order.EpochOrder(br, 100, shuffle="block", seed=3, window=4)
    want = eo.ids(0, eo.num_rows)
    eo2 = order.EpochOrder(br, 100, shuffle="block", seed=3, window=4)  # a fresh window cache
    segs = list(eo2.aligned(0, eo2.num_rows, 96))
    got: dict[int, np.ndarray] = {}

    def work(k):
        for i in range(k, len(segs), 4):
            got[i] = segs[i].rows()

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert np.array_equal(np.concatenate([got[i] for i in range(len(segs))]), want)


def test_epoch_order_pickles_without_its_lock():
    import pickle

    eo = order.EpochOrder(np.full(8, 10, np.int64), 10, seed=1, window=2)
    eo.ids(0, 30)
    eo2 = pickle.loads(pickle.dumps(eo))
    assert np.array_equal(eo2.ids(0, 80), eo.ids(0, 80))


def _write(path, kind, n=1500):
    if kind == "large":  # 16 KiB rows, 8 rows per block: rows read by preadv
        n = 400
        schema = Schema([Field("i", "int64"), Field("x", "float32", (4094,))])
        cols = {"i": np.arange(n), "x": np.repeat(np.arange(n, dtype=np.float32)[:, None], 4094, 1)}
        bb = 128 << 10
    elif kind == "heap":  # variable payloads: read by pread per payload
        schema = Schema([Field("i", "int64"), Field("w", "float32", (None,))])
        cols = {"i": np.arange(n), "w": [np.full(1 + i % 50, i, np.float32) for i in range(n)]}
        bb = 1 << 10
    else:  # small rows: gathered from a window of loaded blocks
        schema = Schema([Field("i", "int64"), Field("x", "float32", (4,))])
        cols = {"i": np.arange(n), "x": np.zeros((n, 4), np.float32)}
        bb = 2 << 10
    with Writer(path, schema, block_bytes=bb) as w:
        w.write_batch(cols)
    return path


@pytest.mark.parametrize("kind", ["large", "heap", "small"])
@pytest.mark.parametrize("batch", [7, 64, 500])
def test_reader_batches_same_order_whole_batches(tmp_path, kind, batch):
    path = _write(str(tmp_path / f"{kind}.h5"), kind)
    with Reader(path) as r:
        step = r._aligned_step("block", 4, batch, r._select(None))
        assert (step is None) == (kind == "small")
        if step is not None:
            assert step % batch == 0
        for shard, start in (((0, 1), 0), ((1, 3), 0), ((0, 2), 2 * batch + 3), ((1, 2), len(r))):
            want = r.epoch_order(shuffle="block", seed=4, epoch=1, window=4, part=shard)[start:]
            bs = list(
                r.batches(batch, seed=4, epoch=1, window=4, part=shard, start=start, num_threads=2)
            )
            got = np.concatenate([b["i"] for b in bs]) if bs else np.zeros(0, np.int64)
            assert np.array_equal(got, want)
            assert all(len(b["i"]) == batch for b in bs[:-1])
            if kind == "large":
                assert all((b["x"] == b["i"][:, None]).all() for b in bs)
            if kind == "heap":
                assert all(
                    np.array_equal(v, np.full(1 + i % 50, i, np.float32))
                    for b in bs
                    for i, v in zip(b["i"], b["w"])
                )


@pytest.mark.parametrize("kind", ["large", "heap"])
def test_deal_aligned_resumes_exactly_once(tmp_path, kind):
    path = _write(str(tmp_path / f"{kind}.h5"), kind)
    B, C = 24, 3
    with Reader(path) as r:
        plan = r.plan(B)
        got = []
        for c in range(C):  # every consumer takes 2 steps, then the job resumes on 2 consumers
            got += [b["i"] for _, b in zip(range(2), r.deal(B, shard=(c, C), seed=9, window=4))]
        left = plan.after([2] * C, unit=order_unit(r, B))
        for c in range(2):
            got += [
                b["i"] for b in r.deal(B, shard=(c, 2), seed=9, window=4, remaining=left.remaining)
            ]
        ids = np.concatenate(got)
        assert np.array_equal(np.sort(ids), np.arange(len(r)))


def order_unit(r, B):
    from rowstore.reader.plan import default_unit

    return default_unit("block", 4, r._rpb, B)


def test_full_segments_are_whole_batches(tmp_path):
    path = _write(str(tmp_path / "large.h5"), "large")
    with Reader(path) as r:
        for B in (3, 100, 1000, 5000):
            assert r._segment_rows("full", 16, B) % B == 0
        bs = list(r.batches(100, shuffle="full", seed=2))
        assert np.array_equal(
            np.concatenate([b["i"] for b in bs]), r.epoch_order(shuffle="full", seed=2)
        )


# -- the buffer pool -------------------------------------------------------------
def test_pool_reuses_only_dropped_buffers():
    import sys

    from rowstore.reader.buffers import BufferPool

    pool = BufferPool(cap=3, min_bytes=0)
    spec = [("a", (16,), np.float32), ("b", (), np.int64)]
    c1 = pool.columns(spec, 5000)
    c1["a"][:] = 1
    keep = c1["a"][10:20]  # a view the caller keeps
    del c1
    c2 = pool.columns(spec, 5000)
    assert len(pool._bufs) == 2 and not np.shares_memory(c2["a"], keep)
    del c2
    c3 = pool.columns(spec, 4000)  # the dropped buffer, not the kept one
    assert len(pool._bufs) == 2 and not np.shares_memory(c3["a"], keep)
    assert (keep == 1).all()
    assert c3["a"].ctypes.data % 64 == 0 and c3["b"].ctypes.data % 64 == 0
    held = [pool.columns(spec, 5000) for _ in range(5)]  # past the cap: plain arrays, never shared
    assert len(pool._bufs) == 3
    bases = [h["a"].base for h in held] + [c3["a"].base, keep.base]
    assert all(not np.shares_memory(x, y) for i, x in enumerate(bases) for y in bases[i + 1 :])
    assert sys.getrefcount(pool._bufs[0]) >= 2


@pytest.mark.parametrize("kind", ["large", "small"])
@pytest.mark.parametrize("shuffle", ["block", "full"])
def test_batches_kept_by_the_caller_are_never_overwritten(tmp_path, kind, shuffle):
    path = _write(str(tmp_path / f"{kind}.h5"), kind)
    with Reader(path) as r:
        ref = r.take(np.arange(len(r)))
        kept = []
        for k, b in enumerate(r.batches(32, shuffle=shuffle, seed=1, num_threads=2, prefetch=1)):
            if k % 3 == 0:
                kept.append(b)  # the others are dropped, their buffers reused
            elif k % 3 == 1:
                kept.append({"x": b["x"][2:5], "i": b["i"][2:5]})  # a view of part of it
        for b in kept:
            assert np.array_equal(b["x"], ref["x"][b["i"]])
        # a torch tensor sharing the memory holds it too
        torch = pytest.importorskip("torch")
        ts = [
            (torch.from_numpy(b["x"]), b["i"].copy())
            for b in r.batches(32, shuffle=shuffle, seed=2)
        ]
        for t, i in ts:
            assert np.array_equal(t.numpy(), ref["x"][i])


def test_the_next_epoch_reuses_the_last_ones_buffers_but_never_a_kept_batch(tmp_path):
    """A reader's segment buffers outlive an iteration: a second epoch takes the first one's
    dropped buffers (no new allocation), never one a batch the caller kept still uses; a
    forked child starts a pool of its own."""
    path = _write(str(tmp_path / "large.h5"), "large")  # 1.6 MB segments: pooled
    with Reader(path) as r:
        ref = r.take(np.arange(len(r)))
        kept = []
        for k, b in enumerate(r.batches(32, seed=1, num_threads=2, prefetch=1)):
            if k == 2:
                kept.append(b)
        pool = r._column_pool[1]
        assert pool._bufs, "the segments did not come from the reader's pool"
        sizes = []
        for epoch, threads in ((1, 2), (2, 1), (3, 1)):  # one thread: what is in flight is fixed
            for b in r.batches(32, seed=1, epoch=epoch, num_threads=threads, prefetch=1):
                assert np.array_equal(b["x"], ref["x"][b["i"]])
                assert not np.shares_memory(b["x"], kept[0]["x"])
            sizes.append(len(pool._bufs))
        # at most what an iteration may have in flight, and no new buffer epoch after epoch
        assert r._column_pool[1] is pool and max(sizes) <= pool.cap and sizes[2] == sizes[1]
        assert np.array_equal(kept[0]["x"], ref["x"][kept[0]["i"]])
        if hasattr(os, "fork"):
            pid = os.fork()
            if pid == 0:  # the child: a pool of its own, the same batches
                ok = all(np.array_equal(b["x"], ref["x"][b["i"]]) for b in r.batches(32, seed=1))
                os._exit(0 if ok and r._column_pool[1] is not pool else 1)
            assert os.waitpid(pid, 0)[1] == 0
        r.close()
        assert r._column_pool[1] is not pool and not r._column_pool[1]._bufs


@pytest.mark.parametrize("shuffle", ["block", "full"])
def test_heap_payload_batches_kept_by_the_caller_are_never_overwritten(tmp_path, shuffle):
    """Heap payload buffers are pooled by the reader too: a batch (or a view of one row of it)
    the caller keeps is never overwritten by a later segment, and dropped ones are reused."""
    schema = Schema([Field("i", "int64"), Field("w", "float32", (None,))])
    path = str(tmp_path / "heap.h5")
    n = 3000
    sizes = 2000 + (np.arange(n) * 7919) % 3000  # 8-20 KB payloads
    with Writer(path, schema, rows_per_block=16) as w:
        for a in range(0, n, 500):
            w.write_batch(
                {
                    "i": np.arange(a, a + 500),
                    "w": [np.full(int(sizes[k]), k, np.float32) for k in range(a, a + 500)],
                }
            )
    with Reader(path) as r:
        pool = r._gatherer._payloads
        kept = []
        for k, b in enumerate(r.batches(100, shuffle=shuffle, seed=1, num_threads=2, prefetch=1)):
            if k % 4 == 0:
                kept.append((b["i"].copy(), b["w"]))
            elif k % 4 == 1:
                kept.append((b["i"][3:4].copy(), [b["w"][3]]))  # one row's view
        assert pool._bufs, "the payloads did not come from the pool"
        for ids, ws in kept:
            for i, x in zip(ids, ws):
                assert len(x) == sizes[i] and (np.asarray(x) == i).all()
