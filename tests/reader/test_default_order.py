"""The default block order: pieces of blocks where the reader loads pieces alone (uncompressed
blocks read directly), whole blocks otherwise, a window of about ``WINDOW_BLOCKS`` blocks of
rows either way; well mixed on small versions of the bench workloads (quality is exact given
the seed: not a timing test); given values keep their meaning."""

from __future__ import annotations

import os

import numpy as np
import pytest

import rowstore
from rowstore.demo import make_demo
from rowstore.reader import order
from rowstore.reader.epochs import EpochSpec

#: Small versions of the bench workloads: (rows, block bytes), enough blocks to mix.
WORKLOADS = {
    "tiny": (100_000, 1 << 16),
    "patch": (2_000, 1 << 19),
    "image": (200, 1 << 20),
    "speech": (2_000, 1 << 20),
}


@pytest.fixture(scope="module")
def demos(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("default_order")
    return {
        name: make_demo(name, os.path.join(d, f"{name}.h5"), rows, block_bytes=bb)
        for name, (rows, bb) in WORKLOADS.items()
    }


@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("batch_size", [64, 256])
def test_default_order_is_well_mixed(demos, name, batch_size):
    with rowstore.open(demos[name]) as r:
        window, pieces = r.order_defaults()
        assert pieces == min(order.AUTO_PIECES, r.layout.rows_per_block) > 1
        assert window == order.WINDOW_BLOCKS * pieces  # about WINDOW_BLOCKS blocks of rows
        for seed in (0, 1):
            assert r.shuffle_quality(batch_size, seed=seed) >= 0.5
        # the defaults are the spelled-out order, bit for bit
        assert np.array_equal(
            r.epoch_order(seed=1), r.epoch_order(seed=1, window=window, pieces=pieces)
        )


def test_default_order_reads_every_row_once(demos):
    with rowstore.open(demos["tiny"]) as r:
        ids = np.concatenate([b["label"] for b in r.batches(1000, seed=2)])
        want = r.take(r.epoch_order(seed=2), fields=["label"])["label"]
        assert np.array_equal(ids, want)
        dealt = [b["label"] for c in range(3) for b in r.deal(512, shard=(c, 3), seed=2)]
        assert len(np.concatenate(dealt)) == len(r)


def test_compressed_blocks_keep_whole_blocks(tmp_path):
    """A compressed block is decompressed whole: pieces would cost decompression and memory."""
    path = make_demo("tiny", str(tmp_path / "lz4.h5"), 50_000, compression="lz4")
    with rowstore.open(path) as r:
        assert r.order_defaults() == (order.WINDOW_BLOCKS, 1)
        assert np.array_equal(r.epoch_order(seed=1), r.epoch_order(seed=1, window=16, pieces=1))


def test_whole_block_checks_keep_whole_blocks(demos):
    with rowstore.open(demos["tiny"], verify="always") as r:
        assert r.order_defaults() == (order.WINDOW_BLOCKS, 1)


def test_given_values_keep_their_meaning(demos):
    with rowstore.open(demos["tiny"]) as r:
        assert r.order_defaults("block", 16, None) == (16, 1)  # a window alone: whole blocks
        assert r.order_defaults("block", None, 4) == (64, 4)  # pieces alone: same memory
        assert r.order_defaults("block", 5, 3) == (5, 3)
        assert r.order_defaults("full") == (16, 1) == r.order_defaults("none")
    assert order.resolve_order("block", None, 8, rows_per_block=2) == (32, 8)  # 2 pieces cut
    assert order.auto_pieces(14, True, table_share=0.25) == 4  # large row tables: fewer
    assert order.auto_pieces(14, False) == 1


def test_the_spec_resolves_and_records_the_values(demos):
    with rowstore.open(demos["tiny"]) as r:
        spec = EpochSpec(seed=1)
        assert (spec.window, spec.pieces) == (None, None) and not spec.resolved
        res = spec.resolve(r)
        assert (res.window, res.pieces) == r.order_defaults() and res.resolve(r) is res
        key = spec.order_key(r, 64)
        assert (key["window"], key["pieces"]) == r.order_defaults()
        assert spec.unit_for(r, 64) == res.unit_for(r, 64)


def test_a_mixture_takes_the_pieces_of_all_sources(demos, tmp_path):
    lz4 = make_demo("tiny", str(tmp_path / "lz4.h5"), 20_000, compression="lz4")
    with rowstore.open(demos["tiny"]) as a, rowstore.open(lz4) as b:
        m = rowstore.mix([(a, 0.5), (b, 0.5)], seed=0)
        assert m.order_defaults() == (16, 1)
        first = m.epoch_order(seed=3)
        assert np.array_equal(first, m.epoch_order(seed=3, window=16, pieces=1))
