"""Block shuffling by pieces of blocks: ``pieces=k`` permutes pieces of
``ceil(rows_per_block / k)`` rows instead of blocks, so one window of the same memory mixes rows
of up to ``k`` times more blocks. ``pieces=1`` is the order of earlier versions."""

import numpy as np
import pytest
from helpers import flip_byte

from rowstore import Writer
from rowstore.reader import Reader, order
from rowstore.reader.plan import EpochPlan, step_rows
from rowstore.schema import Field, Schema


def _valid(br, rpb, keep=None):
    v = np.concatenate(
        [np.arange(b * rpb, b * rpb + n) for b, n in enumerate(br)] or [np.zeros(0, np.int64)]
    )
    return v if keep is None else v[keep]


def _layout(rng):
    nb, rpb = int(rng.integers(1, 25)), int(rng.integers(1, 40))
    br = np.full(nb, rpb, np.int64)
    br[-1] = int(rng.integers(0, rpb + 1))
    return br, rpb


def test_pieces_every_row_once_deterministic_randomized():
    rng = np.random.default_rng(11)
    for t in range(150):
        br, rpb = _layout(rng)
        k, W = int(rng.integers(1, 12)), int(rng.integers(1, 12))
        keep = rng.random(int(br.sum())) < 0.6 if t % 3 == 0 else None
        a = order.EpochOrder(br, rpb, seed=t, epoch=2, window=W, pieces=k, keep=keep)
        b = order.EpochOrder(br, rpb, seed=t, epoch=2, window=W, pieces=k, keep=keep)
        ids = a.ids(0, a.num_rows) if a.num_rows else np.zeros(0, np.int64)
        assert np.array_equal(np.sort(ids), np.sort(_valid(br, rpb, keep)))
        assert np.array_equal(ids, b.ids(0, b.num_rows) if b.num_rows else ids)
        segs = list(a.segments(0, a.num_rows))
        assert np.array_equal(
            np.concatenate([s.rows() for s in segs] or [np.zeros(0, np.int64)]), ids
        )
        P = -(-rpb // min(k, rpb))
        for s in segs:
            # a window holds at most W pieces; each row's position among the loaded pieces and
            # among the loaded blocks name the same row
            assert len(s.units) <= W and s.piece_rows == P
            pl, loc = s.piece_local(), s.local()
            u = s.units[pl // P]
            assert np.array_equal((u // s.pieces) * rpb + (u % s.pieces) * P + pl % P, s.rows())
            assert np.array_equal(s.blocks[loc // rpb] * rpb + loc % rpb, s.rows())


def test_pieces_one_is_the_block_order():
    br = np.full(30, 17, np.int64)
    br[-1] = 5
    for seed in range(5):
        old = order.epoch_order(br, 17, seed=seed, epoch=1, window=4)
        assert np.array_equal(
            order.epoch_order(br, 17, seed=seed, epoch=1, window=4, pieces=1), old
        )
        assert not np.array_equal(
            order.epoch_order(br, 17, seed=seed, epoch=1, window=4, pieces=3), old
        )
        # pieces do not change file order or the uniform shuffle
        for mode in ("none", "full"):
            assert np.array_equal(
                order.epoch_order(br, 17, shuffle=mode, seed=seed, pieces=3),
                order.epoch_order(br, 17, shuffle=mode, seed=seed),
            )


def test_pieces_mix_more_blocks_in_the_same_memory():
    br = np.full(138, 14563, np.int64)
    q = {}
    for k, W in ((1, 16), (8, 128), (64, 256)):
        o = order.epoch_order(br, 14563, seed=0, window=W, pieces=k)
        q[k] = order.shuffle_quality(o, 14563, 138, 1024)
    assert q[1] < 0.15 and q[8] > 0.5 and q[64] > 0.75  # 16 MiB, 16 MiB and 4 MiB of 72-byte rows


def test_pieces_shards_and_elastic_resume_exactly_once():
    br = np.full(40, 25, np.int64)
    br[-1] = 9
    eo = order.EpochOrder(br, 25, seed=3, window=6, pieces=4)
    plan = EpochPlan(eo.num_rows, 16)
    taken = []
    for c in range(3):
        for _, (ids, _pad) in zip(range(4), step_rows(eo, plan, c, 3, unit=2)):
            taken.append(ids)
    left = plan.after([4, 4, 4], unit=2)
    for c in range(5):
        taken += [ids for ids, _ in step_rows(eo, left, c, 5, unit=3)]
    got = np.concatenate(taken)
    assert np.array_equal(np.sort(got), _valid(br, 25))
    parts = [
        order.epoch_order(br, 25, seed=3, window=6, pieces=4, rank=r, world=3) for r in range(3)
    ]
    assert np.array_equal(
        np.concatenate(parts), order.epoch_order(br, 25, seed=3, window=6, pieces=4)
    )


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pieces")
    schema = Schema([Field("i", "int64"), Field("x", "float32", (4,))])
    paths = {}
    for name, n, comp in (("raw", 3001, None), ("lz4", 3001, "lz4")):
        p = str(d / f"{name}.h5")
        i = np.arange(n)
        with Writer(p, schema, block_bytes=4096, compression=comp) as w:  # 170 rows per block
            w.write_batch({"i": i, "x": np.repeat(i[:, None], 4, 1).astype(np.float32)})
        paths[name] = p
    return paths


@pytest.mark.parametrize("name", ["raw", "lz4"])
@pytest.mark.parametrize("pieces,window", [(1, 4), (7, 9), (170, 50), (500, 3)])
def test_reader_reads_the_pieces_order(tiny_files, name, pieces, window):
    with Reader(tiny_files[name]) as r:
        for shard in ((0, 1), (1, 2)):
            want = r.epoch_order(seed=5, window=window, pieces=pieces, part=shard)
            bs = list(
                r.batches(100, seed=5, window=window, pieces=pieces, part=shard, num_threads=2)
            )
            got = np.concatenate([b["i"] for b in bs])
            assert np.array_equal(got, want)
            assert all((b["x"] == b["i"][:, None]).all() for b in bs)
        ids = np.concatenate(
            [
                b["__id"]
                for b in r.deal(
                    64, shard=(1, 3), seed=5, window=window, pieces=pieces, with_ids=True
                )
            ]
        )
        assert len(np.unique(ids)) == len(ids)
        q1 = r.shuffle_quality(100, window=window)
        qk = r.shuffle_quality(100, window=window, pieces=pieces)
        assert qk >= q1 - 1e-9 or pieces == 1


def test_reader_pieces_of_a_dataset_of_many_files(tmp_path):
    from rowstore.writer.dataset import DatasetWriter

    schema = Schema([Field("i", "int64"), Field("x", "float32", (4,))])
    with DatasetWriter(str(tmp_path / "ds"), schema, shard_bytes=16 << 10, block_bytes=2048) as w:
        i = np.arange(2500)
        w.write_batch({"i": i, "x": np.repeat(i[:, None], 4, 1).astype(np.float32)})
    with Reader(str(tmp_path / "ds")) as r:
        want = r.epoch_order(seed=1, window=10, pieces=3)
        got = np.concatenate([b["i"] for b in r.batches(64, seed=1, window=10, pieces=3)])
        assert r.layout.num_shards > 1
        assert np.array_equal(got, want) and np.array_equal(np.sort(got), np.arange(2500))


def test_reader_pieces_path_checks_chunks(tiny_files, tmp_path):
    import shutil

    from rowstore.errors import ChecksumError
    from rowstore.format.index import Layout

    p = str(tmp_path / "bad.h5")
    shutil.copy(tiny_files["raw"], p)
    L = Layout.open(p)
    flip_byte(p, int(L.blocks["offset"][3]) + 100, 0xFF)
    with Reader(p) as r, pytest.raises(ChecksumError):
        for _ in r.batches(100, seed=5, window=9, pieces=7):
            pass


def test_pieces_argument_checked(tiny_files):
    with Reader(tiny_files["raw"]) as r:
        for bad in (0, -1, 1.5):
            with pytest.raises((ValueError, TypeError)):
                next(iter(r.batches(10, pieces=bad)))
