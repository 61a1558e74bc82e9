"""Rows with payloads whose row table is small beside the heap: a reader keeps the table whole
(loaded and checked once, at its first window) and reads only payloads per window. Batches are
those of the plain path; a damaged row block is refused at that first load; the table is read
once per reader, not once per window."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import flip_byte

import rowstore
from rowstore import Field, Schema
from rowstore.errors import ChecksumError
from rowstore.reader import _gather

ROWS = 400
RNG = np.random.default_rng(5)
WAVES = [RNG.standard_normal(int(RNG.integers(100, 700))).astype(np.float32) for _ in range(ROWS)]


def _write(path: str, compression: str | None) -> str:
    schema = Schema(
        [
            Field("id", "int64"),
            Field("wave", "float32", (None,)),
            Field("who", "str"),
            Field("text", "str"),
        ]
    )
    with rowstore.Writer(path, schema, rows_per_block=16, compression=compression) as w:
        for i in range(ROWS):
            w.write({"id": i, "wave": WAVES[i], "who": f"s{i % 7}", "text": "t" * (i % 50)})
    return path


@pytest.fixture(scope="module", params=[None, "lz4"])
def clips(request, tmp_path_factory) -> str:
    return _write(str(tmp_path_factory.mktemp("resident") / "clips.h5"), request.param)


def _epoch(r, **kw) -> list[dict]:
    return [
        {k: (v.to_list() if hasattr(v, "to_list") else list(v)) for k, v in b.items()}
        for b in r.batches(64, seed=3, varlen="ragged", **kw)
    ]


def _same(a: list[dict], b: list[dict]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.keys() != y.keys():
            return False
        for k in x:
            if not all(np.array_equal(np.asarray(u), np.asarray(v)) for u, v in zip(x[k], y[k])):
                return False
    return True


@pytest.mark.parametrize("kw", [{}, {"window": 16, "pieces": 1}, {"shuffle": "none"}])
def test_batches_equal_the_plain_path(clips, monkeypatch, kw):
    with rowstore.open(clips) as r:
        assert r._gatherer._resident_ok  # the table is small beside the waveforms
        got = _epoch(r, **kw)
        assert r._gatherer._resident is not None
    monkeypatch.setattr(_gather, "_RESIDENT_ROWS_BYTES", 0)
    with rowstore.open(clips) as r:
        assert not r._gatherer._resident_ok
        want = _epoch(r, **kw)
    assert _same(got, want)
    ids = np.concatenate([b["id"] for b in got])
    assert sorted(ids.tolist()) == list(range(ROWS))
    for b in got:
        for i, wave, who in zip(b["id"], b["wave"], b["who"]):
            assert np.array_equal(wave, WAVES[i]) and who == f"s{i % 7}"


def test_the_table_is_read_once_per_reader(clips):
    with rowstore.open(clips) as r:
        g = r._gatherer
        loads = []
        real = g._load

        def counted(which, what, dst):
            loads.append((what, len(which)))
            return real(which, what, dst)

        g._load = counted
        for epoch in range(3):
            _epoch(r, epoch=epoch)
        blocks = [n for what, n in loads if what == "block"]
        assert blocks == [r.layout.num_blocks]


def test_verify_always_and_small_heaps_keep_reading_blocks(tmp_path):
    path = _write(str(tmp_path / "c.h5"), None)
    with rowstore.open(path, verify="always") as r:
        assert not r._gatherer._resident_ok
        _epoch(r)
        assert r._gatherer._resident is None
    small = str(tmp_path / "small.h5")
    with rowstore.Writer(small, Schema([Field("id", "int64"), Field("s", "str")])) as w:
        for i in range(100):
            w.write({"id": i, "s": "ab"})
    with rowstore.open(small) as r:  # the table is as large as the heap: not kept
        assert not r._gatherer._resident_ok


def test_a_damaged_row_block_is_refused_at_the_first_window(tmp_path):
    path = _write(str(tmp_path / "c.h5"), None)
    L = rowstore.Layout.open(path)
    flip_byte(path, int(L.blocks["offset"][5]) + 3)
    with rowstore.open(path) as r:
        with pytest.raises(ChecksumError, match="block 5"):
            _epoch(r)
