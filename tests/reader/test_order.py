"""Epoch orders: pure functions of (seed, epoch, layout, rank, world)."""

import subprocess
import sys

import numpy as np
import pytest

from rowstore.reader import order


def layout(nblocks=37, rpb=50, last=13):
    rows = np.full(nblocks, rpb, np.int64)
    rows[-1] = last
    return rows, rpb


def valid_ids(block_rows, rpb):
    return np.concatenate([np.arange(b * rpb, b * rpb + n) for b, n in enumerate(block_rows)])


@pytest.mark.parametrize("mode", order.MODES)
@pytest.mark.parametrize("window", [1, 4, 100])
def test_each_row_exactly_once(mode, window):
    br, rpb = layout()
    o = order.epoch_order(br, rpb, shuffle=mode, seed=3, epoch=1, window=window)
    assert np.array_equal(np.sort(o), valid_ids(br, rpb))


@pytest.mark.parametrize("mode", ["block", "full"])
def test_epochs_differ_and_repeat(mode):
    br, rpb = layout()
    a = order.epoch_order(br, rpb, shuffle=mode, seed=7, epoch=0)
    b = order.epoch_order(br, rpb, shuffle=mode, seed=7, epoch=0)
    c = order.epoch_order(br, rpb, shuffle=mode, seed=7, epoch=1)
    d = order.epoch_order(br, rpb, shuffle=mode, seed=8, epoch=0)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, d)


def test_none_is_file_order():
    br, rpb = layout()
    assert np.array_equal(order.epoch_order(br, rpb, shuffle="none"), valid_ids(br, rpb))


@pytest.mark.parametrize("mode", order.MODES)
@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("even", [False, True])
def test_shards_disjoint_and_complete(mode, world, even):
    br, rpb = layout()
    parts = [
        order.epoch_order(
            br, rpb, shuffle=mode, seed=1, epoch=2, window=3, rank=r, world=world, even=even
        )
        for r in range(world)
    ]
    allrows = np.concatenate(parts)
    assert len(np.unique(allrows)) == len(allrows)  # disjoint
    n = int(br.sum())
    sizes = [len(p) for p in parts]
    if even:
        assert sizes == [n // world] * world
        assert set(allrows) <= set(valid_ids(br, rpb))
    else:
        assert max(sizes) - min(sizes) <= 1
        assert np.array_equal(np.sort(allrows), valid_ids(br, rpb))  # complete
    # the shards are the parts of the one epoch order
    whole = order.epoch_order(br, rpb, shuffle=mode, seed=1, epoch=2, window=3)
    assert np.array_equal(allrows, whole[: len(allrows)])


@pytest.mark.parametrize("mode", order.MODES)
def test_start_skips_rows(mode):
    br, rpb = layout()
    whole = order.epoch_order(br, rpb, shuffle=mode, seed=5, rank=1, world=2)
    for start in (0, 1, 49, 50, 333, len(whole) - 1, len(whole), len(whole) + 5):
        part = order.epoch_order(br, rpb, shuffle=mode, seed=5, rank=1, world=2, start=start)
        assert np.array_equal(part, whole[start:])


def test_block_mode_windows_are_local():
    br, rpb = layout(nblocks=40, rpb=100, last=100)
    o = order.epoch_order(br, rpb, shuffle="block", seed=0, window=4)
    # each consecutive run of 400 rows comes from exactly 4 blocks
    for w in range(10):
        assert len(np.unique(o[w * 400 : (w + 1) * 400] // rpb)) == 4


def test_kernel_shuffle_matches_reference():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 10, 257):
        seed = int(rng.integers(0, 2**63))
        a = np.arange(n, dtype=np.int64) * 3 + 1
        ref = order.shuffle_reference(list(a), seed)
        from rowstore import kernels

        kernels.shuffle(a, seed)
        assert a.tolist() == ref


def test_shuffle_is_uniform_enough():
    # all 6 permutations of 3 items appear with roughly equal frequency
    counts = {}
    for s in range(6000):
        p = tuple(order.permutation(3, order.seed64(s, 0, 9)))
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == 6
    assert min(counts.values()) > 850 and max(counts.values()) < 1150


def test_same_order_in_another_process():
    br, rpb = layout()
    here = order.epoch_order(br, rpb, shuffle="block", seed=11, epoch=4, window=2).tolist()
    code = (
        "import numpy as np, json; from rowstore.reader import order;"
        "br=np.full(37,50); br[-1]=13;"
        "print(json.dumps(order.epoch_order(br,50,shuffle='block',seed=11,epoch=4,window=2).tolist()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    import json

    assert json.loads(out) == here


def test_bad_arguments():
    br, rpb = layout()
    for kwargs in (
        {"shuffle": "random"},
        {"seed": -1},
        {"epoch": 1.5},
        {"window": 0},
        {"rank": 2, "world": 2},
        {"world": 0},
    ):
        with pytest.raises(ValueError):
            order.epoch_order(br, rpb, **kwargs)


def test_shuffle_quality_orders():
    br, rpb = layout(nblocks=200, rpb=100, last=100)
    q = {
        m: order.shuffle_quality(order.epoch_order(br, rpb, shuffle=m, window=8), rpb, 200, 64)
        for m in order.MODES
    }
    assert q["none"] < 0.1
    assert 0.05 < q["block"] < 0.5
    assert q["full"] > 0.9
