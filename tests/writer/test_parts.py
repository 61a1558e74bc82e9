"""rowstore.writer.parts: runs of consecutive items cut by size, their shards written (here) and
committed in order; a shard of no rows left out and removed; a failing part publishes nothing
and leaves no shard behind. (Worker processes: tests/integrations/test_from_audio.py and
test_from_images.py.)"""

from __future__ import annotations

import os

import numpy as np
import pytest

import rowstore
from rowstore.writer import write_shard
from rowstore.writer.parts import cut, n_parts, write_parts

SCHEMA = rowstore.Schema([rowstore.Field("x", "int64")])


@pytest.mark.parametrize("seed", range(20))
def test_cut_covers_every_item_in_order(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    sizes = rng.integers(0, 1000, n)
    k = int(rng.integers(1, 10))
    runs = cut(sizes, k)
    assert runs[0][0] == 0 and runs[-1][1] == n
    assert all(a < b for a, b in runs) and all(b == c for (_, b), (c, _) in zip(runs, runs[1:]))
    assert 1 <= len(runs) <= min(k, n)
    assert cut([], 3) == []
    assert cut([5, 5, 5, 5], 2) == [(0, 2), (2, 4)]


def test_n_parts():
    assert n_parts(1000, 10, workers=4, min_items=100, max_bytes=1 << 30) == 4
    assert n_parts(150, 10, workers=4, min_items=100, max_bytes=1 << 30) == 2
    assert n_parts(10, 5000, workers=1, min_items=100, max_bytes=1000) == 5  # by bytes
    assert n_parts(3, 5000, workers=8, min_items=1, max_bytes=1) == 3  # one item a part at most


def _part(dest, lo, hi, bad, *, report):
    """Rows lo..hi-1 (none when lo == hi); ``bad``: raise instead."""
    if bad:
        raise ValueError(f"part {lo} fails")
    report(hi - lo, 8 * (hi - lo))
    data = {"x": np.arange(lo, hi, dtype=np.int64)}
    return write_shard(dest, SCHEMA, data), {"rows": hi - lo}


def test_parts_committed_in_order_and_empty_shards_removed(tmp_path):
    dest = str(tmp_path / "ds")
    seen = []
    jobs = [(dest, 0, 3, False), (dest, 3, 3, False), (dest, 3, 7, False)]
    extras = write_parts(
        _part,
        jobs,
        dest,
        workers=1,
        attrs=lambda ex: {"rows": [e["rows"] for e in ex]},
        progress=lambda n, b: seen.append(n),
    )
    assert extras == [{"rows": 3}, {"rows": 0}, {"rows": 4}] and sum(seen) == 7
    with rowstore.open(dest) as r:
        assert r.take(np.arange(len(r)))["x"].tolist() == list(range(7))
        assert r.layout.user_attrs == {"rows": [3, 0, 4]}
    assert len(os.listdir(os.path.join(dest, "shards"))) == 2  # the empty one removed


def test_a_failing_part_publishes_nothing(tmp_path):
    dest = str(tmp_path / "ds")
    jobs = [(dest, 0, 3, False), (dest, 3, 5, True)]
    with pytest.raises(ValueError, match="part 3 fails"):
        write_parts(_part, jobs, dest, workers=1)
    assert not os.path.exists(dest)  # made by the call: no shard, no directory left behind


def test_an_attrs_error_publishes_nothing_and_keeps_what_was_there(tmp_path):
    """The attributes' function runs before the commit: its error publishes nothing and
    removes the shards; a dataset that was there stays as it was."""
    dest = str(tmp_path / "ds")
    write_parts(_part, [(dest, 0, 2, False)], dest, workers=1)

    def refuse(extras):
        raise ValueError(f"no rows in {len(extras)} parts")

    with pytest.raises(ValueError, match="no rows in 2 parts"):
        write_parts(
            _part, [(dest, 2, 4, False), (dest, 4, 5, False)], dest, workers=1, attrs=refuse
        )
    assert len(os.listdir(os.path.join(dest, "shards"))) == 1  # the first call's shard only
    with rowstore.open(dest) as r:
        assert r.take(np.arange(len(r)))["x"].tolist() == [0, 1]
