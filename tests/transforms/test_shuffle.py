"""rowstore.shuffle: an out-of-core global shuffle of stored rows.

Every row exactly once, stored bytes unchanged (PNGs stay the PNG bytes they were), the order
a uniform permutation that depends on the seed only (not on the memory budget, the piles or a
re-split), memory bounded (measured in a subprocess), and no visible output or leftover piles
after failures and SIGKILLs.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from helpers import scaled

import rowstore
from rowstore import Field, Schema
from rowstore.cli import main
from rowstore.format._raw import heap_refs, take_raw
from rowstore.global_shuffle import _passes, _plan, check_arguments
from rowstore.global_shuffle._plan import Plan, make_plan, row_keys
from rowstore.global_shuffle._work import PREFIX
from rowstore.reader.raw import RawSource

ID_SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("x", "float32", (3,)),
        Field("wave", "uint8", (None,)),
        Field("name", rowstore.STR, nullable=True),
    ]
)


def write_sorted(path, n, *, shard_bytes=200_000, block_bytes=8192, compression=None, dataset=True):
    """Rows 0..n-1 in id order: a fixed field, a variable one and nullable text, all from the id."""
    cols = {
        "id": np.arange(n),
        "x": np.arange(n, dtype=np.float32)[:, None] * np.ones(3, np.float32),
        "wave": [np.full(i % 50, i % 251, np.uint8) for i in range(n)],
        "name": [None if i % 5 == 0 else f"row {i}" for i in range(n)],
    }
    if dataset:
        with rowstore.DatasetWriter(
            path,
            ID_SCHEMA,
            shard_bytes=shard_bytes,
            block_bytes=block_bytes,
            compression=compression,
            attrs={"origin": "test"},
        ) as w:
            w.write_batch(cols)
    else:
        with rowstore.Writer(
            path, ID_SCHEMA, block_bytes=block_bytes, compression=compression
        ) as w:
            w.write_batch(cols)
    return os.fspath(path)


def ids_of(path) -> np.ndarray:
    with rowstore.open(path) as r:
        return np.asarray(r.take(np.arange(len(r)), fields=["id"])["id"])


def expected_order(seed: int, n: int) -> np.ndarray:
    """The permutation the shuffle promises: the rows sorted by their keys (ties in input order)."""
    return np.argsort(row_keys(seed, 0, n), kind="stable")


def leftovers(*dirs) -> list[str]:
    return [os.path.join(d, x) for d in dirs for x in os.listdir(d) if x.startswith(PREFIX)]


@pytest.fixture
def tiny_plan(monkeypatch):
    """A plan for small test data: ``piles`` piles, piles above ``limit`` bytes split again."""

    def use(piles: int, limit: int):
        def fake(memory, data_bytes, *, block_bytes):
            return Plan(memory, piles, limit, max(1, limit // 2), 16 << 10, 64 << 10)

        monkeypatch.setattr("rowstore.global_shuffle.make_plan", fake)

    return use


def stored_by_id(path) -> dict[int, tuple[bytes, tuple[bytes, ...]]]:
    """Each row's stored record (heap offsets zeroed) and stored payload bytes, by its id."""
    out = {}
    with RawSource(path) as src:
        for k in range(src.num_blocks):
            raw = src.block(k)
            rows = raw.rows.copy()
            pays = []
            for name, _ in src.refs:
                off = rows[name]["offset"].astype(np.int64) - raw.origin
                nb = rows[name]["nbytes"].astype(np.int64)
                pays.append([raw.heap[o : o + m].tobytes() for o, m in zip(off, nb)])
                rows[name]["offset"] = 0
            for i in range(len(rows)):
                out[int(rows["id"][i])] = (rows[i : i + 1].tobytes(), tuple(p[i] for p in pays))
    return out


# -- every row once, bytes unchanged -----------------------------------------------------------
def test_every_row_once_in_the_promised_order(tmp_path):
    src = write_sorted(tmp_path / "in", 3000)
    rep = rowstore.shuffle(src, tmp_path / "out", memory="4MiB", seed=7, block_bytes=16384)
    ids = ids_of(tmp_path / "out")
    assert sorted(ids.tolist()) == list(range(3000))
    assert np.array_equal(ids, expected_order(7, 3000))
    assert rep.rows == 3000 and rep.passes == 2 and rep.pass1.rows == rep.pass2.rows == 3000
    with rowstore.open(tmp_path / "out") as r:
        assert r.layout.user_attrs == {"origin": "test"}
        b = r.take(np.arange(0, 3000, 37))
        for k, i in enumerate(b["id"]):
            assert np.array_equal(b["x"][k], np.full(3, i, np.float32))
            assert np.array_equal(b["wave"][k], np.full(i % 50, i % 251, np.uint8))
            assert b["name"][k] == (None if i % 5 == 0 else f"row {i}")
    assert leftovers(tmp_path) == []


def test_stored_bytes_identical_all_kinds_png_varlen_nulls(tmp_path, rs, tiny_plan):
    schema = Schema([Field("id", "int64")] + list(rs.all_kinds_schema(nullable=True)))
    rows = rs.make_rows(schema, 500, seed=3, max_len=40)
    for i, r in enumerate(rows):
        r["id"] = i
    with rowstore.DatasetWriter(
        tmp_path / "in", schema, shard_bytes=40_000, block_bytes=4096, compression="lz4"
    ) as w:
        for r in rows:
            w.write(r)
    before = stored_by_id(tmp_path / "in")
    tiny_plan(piles=2, limit=150_000)  # two piles, each split again
    rep = rowstore.shuffle(
        tmp_path / "in", tmp_path / "out", memory="4MiB", seed=11, block_bytes=4096
    )
    assert rep.splits > 0 and rep.passes > 2
    assert (
        stored_by_id(tmp_path / "out") == before
    )  # records and payloads byte for byte (PNG as stored)
    with rowstore.open(tmp_path / "out") as r:
        assert r.layout.compression == rowstore.open(tmp_path / "in").layout.compression  # "same"
        assert (
            r.take(np.arange(len(r)), fields=["id"])["id"].tolist()
            == expected_order(11, 500).tolist()
        )
        got = [r[i] for i in range(0, 500, 7)]
    rs.assert_rows_equal(schema, [rows[int(g["id"])] for g in got], got)  # decoded: the images too


def test_shards_of_different_block_sizes_and_an_empty_shard(tmp_path):
    def cols(a, b):
        return {
            "id": np.arange(a, b),
            "x": np.zeros((b - a, 3), np.float32),
            "wave": [np.full(i % 9, i % 7, np.uint8) for i in range(a, b)],
            "name": [f"n{i}" for i in range(a, b)],
        }

    infos = [
        rowstore.write_shard(tmp_path / "in", ID_SCHEMA, cols(a, b), rows_per_block=rpb)
        for a, b, rpb in ((0, 300, 10), (300, 300, 5), (300, 1000, 37), (1000, 1333, 64))
    ]
    rowstore.commit(tmp_path / "in", infos)
    assert not rowstore.open(tmp_path / "in").layout.uniform_blocks
    rowstore.shuffle(tmp_path / "in", tmp_path / "out", memory="4MiB", seed=2)
    assert np.array_equal(ids_of(tmp_path / "out"), expected_order(2, 1333))
    assert stored_by_id(tmp_path / "out") == stored_by_id(tmp_path / "in")


def test_single_file_input_compression_choice_and_empty_input(tmp_path):
    src = write_sorted(tmp_path / "in.h5", 700, dataset=False, compression="zstd")
    rowstore.shuffle(src, tmp_path / "out", memory="4MiB", seed=1, compression=None)
    assert np.array_equal(ids_of(tmp_path / "out"), expected_order(1, 700))
    assert rowstore.open(tmp_path / "out").layout.compression == {"id": "none"}
    with rowstore.Writer(tmp_path / "empty.h5", ID_SCHEMA):
        pass
    rep = rowstore.shuffle(tmp_path / "empty.h5", tmp_path / "out2", memory="4MiB", seed=1)
    assert rep.rows == 0 and len(rowstore.open(tmp_path / "out2")) == 0


# -- the order: uniform, a function of the seed only -------------------------------------------
def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1 % point of chi-square (Wilson-Hilferty; z = 3.09 is the normal's 99.9 %)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _decile_table(perms: list[np.ndarray], n: int) -> np.ndarray:
    """Counts of (input decile, output decile) over the permutations ``perm[pos] = input row``."""
    table = np.zeros((10, 10), np.int64)
    for perm in perms:
        pos = np.empty(n, np.int64)
        pos[perm] = np.arange(n)
        np.add.at(table, (np.arange(n) * 10 // n, pos * 10 // n), 1)
    return table


def _chi2(table: np.ndarray) -> float:
    exp = table.sum() / table.size
    return float(((table - exp) ** 2 / exp).sum())


def test_deciles_land_uniformly_over_seeds(tmp_path):
    n = 2000
    src = write_sorted(tmp_path / "in", n)
    perms = []
    for seed in range(6):
        out = tmp_path / f"out{seed}"
        rowstore.shuffle(src, out, memory="4MiB", seed=seed, shard_bytes=50_000)
        perms.append(ids_of(out))
    crit = _chi2_critical(81)
    stat = _chi2(_decile_table(perms, n))
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f}: deciles do not land uniformly"
    # The test can fail: the unshuffled order, or a block-local shuffle, is far off.
    assert _chi2(_decile_table([np.arange(n)] * 6, n)) > 50 * crit
    local = [
        np.concatenate(
            [np.random.default_rng(s).permutation(np.arange(a, a + 200)) for a in range(0, n, 200)]
        )
        for s in range(6)
    ]
    assert _chi2(_decile_table(local, n)) > 10 * crit
    assert len({p.tobytes() for p in perms}) == 6  # seeds differ


def test_position_of_a_row_is_uniform_and_pairs_are_unbiased():
    """The order function itself, over many seeds (the pipeline gives exactly this order:
    the tests above compare it row for row)."""
    n, seeds = 20, 4000
    first = np.empty(seeds, np.int64)
    before = 0
    for s in range(seeds):
        order = expected_order(s, n)
        first[s] = int(np.flatnonzero(order == 0)[0])
        before += int(np.flatnonzero(order == 3)[0] < np.flatnonzero(order == 17)[0])
    counts = np.bincount(first, minlength=n)
    assert _chi2(counts) < _chi2_critical(n - 1), counts
    assert abs(before / seeds - 0.5) < 4 * math.sqrt(0.25 / seeds)
    assert _chi2(np.bincount(np.zeros(seeds, np.int64), minlength=n)) > 100 * _chi2_critical(n - 1)


def test_same_seed_same_output_whatever_memory_piles_or_splits(tmp_path, tiny_plan):
    n = 4000
    src = write_sorted(tmp_path / "in", n)
    rowstore.shuffle(src, tmp_path / "a", memory="4MiB", seed=5)
    rowstore.shuffle(src, tmp_path / "b", memory="64MiB", seed=5, tmp=tmp_path)
    tiny_plan(piles=2, limit=40_000)
    rep = rowstore.shuffle(src, tmp_path / "c", memory="4MiB", seed=5, block_bytes=4096)
    assert rep.splits > 1 and rep.piles == 2
    a = ids_of(tmp_path / "a")
    assert np.array_equal(a, ids_of(tmp_path / "b")) and np.array_equal(a, ids_of(tmp_path / "c"))
    assert stored_by_id(tmp_path / "a") == stored_by_id(tmp_path / "c")
    rowstore.shuffle(src, tmp_path / "d", memory="4MiB", seed=6)
    assert not np.array_equal(a, ids_of(tmp_path / "d"))


def test_plan_sizes_piles_from_memory_and_data():
    p = make_plan(256 << 20, 1 << 30, block_bytes=1 << 20)
    assert p.num_piles >= 4 and p.pile_target * p.num_piles >= 1 << 30
    assert p.pile_limit < 256 << 20 and p.pile_block_bytes * 2 * p.num_piles <= (256 << 20) // 2
    assert make_plan(256 << 20, 1 << 20, block_bytes=1 << 20).num_piles == 1
    assert make_plan(2 << 30, 1 << 40, block_bytes=1 << 20).num_piles == _plan.MAX_PILES
    small = make_plan(
        16 << 20, 1 << 40, block_bytes=1 << 20
    )  # open files bound the piles: split again later
    assert small.num_piles * (_plan.OPEN_FILE_BYTES + 2 * small.pile_block_bytes) <= 8 << 20
    assert small.splits(1 << 40) == small.max_open == small.num_piles  # a re-split too
    assert p.splits(10 * p.pile_target) == 10 and p.splits(1) == 2


# -- raw rows: hostile references ---------------------------------------------------------------
def test_take_raw_refuses_references_outside_the_block():
    schema = Schema([Field("b", rowstore.BYTES)])
    dt = rowstore.format.spec.row_dtype(schema)
    rows = np.zeros(3, dt)
    rows["b"]["offset"] = [0, 4, 8]
    rows["b"]["nbytes"] = [4, 4, 4]
    heap = np.arange(12, dtype=np.uint8)
    src = rows.view(np.uint8)
    refs = heap_refs(schema, dt)
    raw = take_raw(src, dt, refs, np.array([2, 0]), heap, base=0, lo=0, hi=12)
    assert raw.heap.tolist() == [8, 9, 10, 11, 0, 1, 2, 3] and raw.rows["b"]["offset"].tolist() == [
        0,
        4,
    ]
    for off, nb in ((10, 4), (2**63, 4), (0, 2**64 - 1), (13, 0)):
        bad = rows.copy()
        bad["b"]["offset"][1], bad["b"]["nbytes"][1] = off, nb
        with pytest.raises(rowstore.FormatError, match="field 'b'"):
            take_raw(bad.view(np.uint8), dt, refs, np.array([0, 1]), heap, base=0, lo=0, hi=12)


def test_take_raw_refuses_rows_sharing_payload_bytes():
    """References each inside the block's range but overlapping (a hostile file's rows all on
    one payload) would copy the heap once per row: refused before the copy is sized."""
    schema = Schema([Field("b", rowstore.BYTES)])
    dt = rowstore.format.spec.row_dtype(schema)
    rows = np.zeros(3, dt)
    rows["b"]["offset"], rows["b"]["nbytes"] = [0, 4, 8], 4
    heap = np.arange(12, dtype=np.uint8)
    refs = heap_refs(schema, dt)
    assert take_raw(
        rows.view(np.uint8), dt, refs, np.array([1, 1, 0]), heap, base=0, lo=0, hi=12
    ).heap.tolist() == [
        4,
        5,
        6,
        7,
        4,
        5,
        6,
        7,
        0,
        1,
        2,
        3,
    ]  # a row asked for twice is not an overlap
    for offsets, sizes in (
        ([0, 0, 0], [12, 12, 12]),
        ([0, 4, 6], [4, 4, 4]),
        ([0, 3, 8], [4, 4, 4]),
    ):
        bad = rows.copy()
        bad["b"]["offset"], bad["b"]["nbytes"] = offsets, sizes
        with pytest.raises(
            rowstore.FormatError, match="field 'b': row .: a payload reference overlaps"
        ):
            take_raw(bad.view(np.uint8), dt, refs, np.array([0, 1, 2]), heap, base=0, lo=0, hi=12)


def test_write_raw_copies_stored_rows_also_when_appending(tmp_path, rs):
    schema = rs.all_kinds_schema(nullable=True)
    rows = rs.make_rows(schema, 120, seed=5, max_len=30)
    rs.write_file(tmp_path / "a.h5", schema, rows, block_bytes=2048, compression="lz4")
    rs.write_file(tmp_path / "b.h5", schema, rows[:7])
    expected = list(rows[:7])
    with (
        RawSource(tmp_path / "a.h5") as src,
        rowstore.Writer(tmp_path / "b.h5", mode="a", block_bytes=1500) as w,
    ):
        for k0 in range(0, src.num_blocks, 3):  # runs of blocks, the rows reversed within each
            k1 = min(src.num_blocks, k0 + 3)
            first, _ = src.block_rows(k0)
            last, n = src.block_rows(k1 - 1)
            part = src.blocks(k0, k1, np.arange(last + n - first)[::-1])
            w.write_raw(part)
            w.write_raw(part.slice(0, 0))
            expected += rows[first : last + n][::-1]
    assert len(expected) == 127
    rs.assert_rows_equal(schema, expected, rs.read_rows(tmp_path / "b.h5"))
    with (
        pytest.raises(ValueError, match="row dtype"),
        rowstore.Writer(tmp_path / "c.h5", ID_SCHEMA) as w,
    ):
        w.write_raw(part)


def test_take_raw_checks_each_slot_against_its_own_block_range():
    schema = Schema([Field("b", rowstore.BYTES)])
    dt = rowstore.format.spec.row_dtype(schema)
    rows = np.zeros(4, dt)  # two loaded blocks (slots) of two rows: heap ranges [0, 4) and [4, 8)
    rows["b"]["offset"] = [0, 2, 4, 6]
    rows["b"]["nbytes"] = 2
    heap = np.arange(8, dtype=np.uint8)
    args = dict(base=[0, 0], lo=[0, 4], hi=[4, 8], rows_per_slot=2)
    refs = heap_refs(schema, dt)
    raw = take_raw(rows.view(np.uint8), dt, refs, np.array([3, 0]), heap, **args)
    assert raw.heap.tolist() == [6, 7, 0, 1] and raw.starts.tolist() == [0, 2, 4]
    bad = rows.copy()
    bad["b"]["offset"][2] = (
        1  # slot 1's row pointing into slot 0's range: in the heap, not in its block
    )
    with pytest.raises(rowstore.FormatError, match="row 2"):
        take_raw(bad.view(np.uint8), dt, refs, np.array([2]), heap, **args)
    with pytest.raises(ValueError, match="slot"):
        take_raw(
            rows.view(np.uint8), dt, refs, np.array([3]), heap, base=0, lo=0, hi=8, rows_per_slot=1
        )


def test_corrupt_input_fails_cleanly(tmp_path):
    src = write_sorted(tmp_path / "in.h5", 2000, dataset=False)
    off = int(rowstore.Layout.open(src).blocks["offset"][3])
    with open(src, "r+b") as f:
        f.seek(off + 5)
        b = f.read(1)
        f.seek(off + 5)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(rowstore.ChecksumError):
        rowstore.shuffle(src, tmp_path / "out", memory="4MiB", seed=1)
    assert not os.path.exists(tmp_path / "out") and leftovers(tmp_path) == []


def test_failure_in_pass_two_removes_everything(tmp_path, monkeypatch, tiny_plan):
    src = write_sorted(tmp_path / "in", 2000)
    calls = []
    real = _passes._sort_and_write

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(_passes, "_sort_and_write", failing)
    tiny_plan(piles=4, limit=1 << 20)
    os.mkdir(tmp_path / "tmp")
    with pytest.raises(OSError, match="injected"):
        rowstore.shuffle(src, tmp_path / "out", memory="4MiB", seed=1, tmp=tmp_path / "tmp")
    assert not os.path.exists(tmp_path / "out")
    assert leftovers(tmp_path, tmp_path / "tmp") == []


def test_the_losing_one_of_two_runs_into_one_output_says_so(tmp_path, monkeypatch, capsys):
    """A second shuffle into the same output finishes while the first works (run from inside
    the first's commit): the first fails naming the other run, the winner's output stays."""
    import rowstore.global_shuffle as gs

    src = write_sorted(tmp_path / "in", 1500)
    out = str(tmp_path / "out")
    real = gs.commit
    state = {"inner": False, "out": out}

    def commit_after_another_run(*args, **kwargs):
        real(*args, **kwargs)
        if not state["inner"]:
            state["inner"] = True
            rowstore.shuffle(
                src, state["out"], memory="4MiB", seed=2
            )  # the other run wins the race

    monkeypatch.setattr(gs, "commit", commit_after_another_run)
    assert main(["shuffle", src, out, "--memory", "4MiB", "--seed", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "was created by another run" in err and "Directory not empty" not in err
    assert np.array_equal(ids_of(out), expected_order(2, 1500))  # the winner's, whole
    assert leftovers(tmp_path) == []
    state.update(inner=False, out=str(tmp_path / "out2"))
    with pytest.raises(FileExistsError, match="created by another run") as ei:
        rowstore.shuffle(src, state["out"], memory="4MiB", seed=1)
    assert ei.value.errno == errno.EEXIST and leftovers(tmp_path) == []


def test_bad_arguments_say_what_was_expected(tmp_path):
    src = write_sorted(tmp_path / "in", 10)
    cases = [
        (dict(memory="lots"), ValueError, "memory must be a size like"),
        (dict(memory="1MiB"), ValueError, "at least 4 MiB"),
        (dict(memory=0), ValueError, "memory must be positive"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=1.5), ValueError, "seed"),
        (dict(shard_bytes="12 parsecs"), ValueError, "shard_bytes"),
        (dict(block_bytes=0), ValueError, "block_bytes"),
        (dict(tmp=tmp_path / "nope"), NotADirectoryError, "tmp"),
    ]
    for kwargs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            rowstore.shuffle(src, tmp_path / "out", **{"memory": "4MiB", **kwargs})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rowstore.shuffle(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ValueError, match="is the input"):
        rowstore.shuffle(src, tmp_path / "in")
    os.mkdir(tmp_path / "there")
    with pytest.raises(FileExistsError, match="exists"):
        rowstore.shuffle(src, tmp_path / "there")
    with pytest.raises(FileNotFoundError, match="directory"):
        rowstore.shuffle(src, tmp_path / "no" / "out")
    with pytest.raises(rowstore.FormatError):
        rowstore.shuffle(
            tmp_path, tmp_path / "out", memory="4MiB"
        )  # a directory that is no dataset
    with pytest.raises(rowstore.CodecError):
        rowstore.shuffle(src, tmp_path / "out", memory="4MiB", compression="snappy-ish")
    assert not os.path.exists(tmp_path / "out") and leftovers(tmp_path) == []
    assert (
        check_arguments(src, tmp_path / "out", memory="2GB", seed=0, tmp=None)[0] == 2_000_000_000
    )


def test_not_enough_disk_is_refused_before_any_work_and_big_blocks_warn(tmp_path):
    from rowstore.global_shuffle import _check_space

    with pytest.raises(OSError, match="MB free") as e:
        _check_space(str(tmp_path), str(tmp_path), piles=1 << 62, output=1)
    assert e.value.errno == 28
    _check_space(str(tmp_path), str(tmp_path), piles=1000, output=1000)
    src = write_sorted(tmp_path / "in.h5", 3000, dataset=False, block_bytes=1 << 20)
    with rowstore.Writer(tmp_path / "big.h5", ID_SCHEMA, rows_per_block=20_000) as w:
        w.write_batch(
            {
                "id": np.arange(20_000),
                "x": np.zeros((20_000, 3), np.float32),
                "wave": [np.zeros(1, np.uint8)] * 20_000,
                "name": ["a"] * 20_000,
            }
        )
    with pytest.warns(RuntimeWarning, match="blocks"):
        rowstore.shuffle(tmp_path / "big.h5", tmp_path / "out", memory="4MiB", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rowstore.shuffle(
            src, tmp_path / "out2", memory="64MiB", seed=0
        )  # 1 MiB blocks, 64 MiB: no warning


# -- memory and kills, in subprocesses ------------------------------------------------------------
_RSS_CHILD = r"""
import json, os, sys
import rowstore
from rowstore.global_shuffle import shuffle
from rowstore.global_shuffle._passes import peak_rss  # VmHWM (ru_maxrss would count the parent's)
src, out, mem = sys.argv[1:4]
with rowstore.open(src) as r:  # every module a read needs is imported: the interpreter's baseline
    r.take([0, 1])
with open("/proc/self/statm") as f:
    base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
rep = shuffle(src, out, memory=mem, seed=3)
print(json.dumps({"base": base, "peak": peak_rss(),
                  "nbytes": rep.nbytes, "piles": rep.piles, "memory": rep.memory}))
"""

#: Measured above the budget (docs/performance.md, "Global shuffle"): libraries' allocations and
#: page-cache-backed writes a budget does not count (RSS peak - baseline - budget was <= 12 MiB
#: on 8-64 MiB budgets); asserted with room.
RSS_CONSTANT = 32 << 20


def test_peak_rss_stays_within_the_budget_on_data_four_times_larger(tmp_path):
    n = 80_000  # ~70 MB raw through a 16 MiB budget
    with rowstore.DatasetWriter(tmp_path / "in", ID_SCHEMA, shard_bytes=16 << 20) as w:
        for a in range(0, n, 20_000):
            w.write_batch(
                {
                    "id": np.arange(a, a + 20_000),
                    "x": np.zeros((20_000, 3), np.float32),
                    "wave": [
                        np.full(600 + i % 400, i % 251, np.uint8) for i in range(a, a + 20_000)
                    ],
                    "name": ["r"] * 20_000,
                }
            )
    p = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(tmp_path / "in"), str(tmp_path / "out"), "16MiB"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout.strip().splitlines()[-1])
    print(m, (m["peak"] - m["base"] - m["memory"]) >> 20, "MiB over")
    assert m["nbytes"] > 4 * m["memory"] and m["piles"] >= 4
    over = m["peak"] - m["base"] - m["memory"]
    assert over <= RSS_CONSTANT, (
        f"peak RSS {m['peak'] >> 20} MiB: {over >> 20} MiB over baseline + budget"
    )
    assert len(rowstore.open(tmp_path / "out")) == n


_REMOTE_RSS_CHILD = r"""
import json, os, sys
import rowstore
from rowstore.global_shuffle import shuffle
url, out, mem, so = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
with rowstore.open(url, storage_options=so) as r:  # the modules and the S3 client a read needs
    r.take([0, 1])
with open("/proc/self/statm") as f:
    base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
rep = shuffle(url, out, memory=mem, seed=3, storage_options=so)
print(json.dumps({"base": base, "peak": rep.peak_rss, "scope": rep.peak_scope, "memory": rep.memory,
                  "piles": rep.piles}))
"""


def test_remote_shuffle_stays_within_the_budget_too(tmp_path):
    """A shuffle of an S3 dataset (moto in a process of its own, so that its objects are not
    counted): the same bound as a local one (each S3 client used to parse its own copy of
    botocore's service models, 17 MiB each, one per pass task)."""
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("moto")
    from _servers import moto_s3

    n = 60_000  # ~48 MB raw through a 16 MiB budget
    with rowstore.DatasetWriter(tmp_path / "in", ID_SCHEMA, shard_bytes=16 << 20) as w:
        for a in range(0, n, 20_000):
            w.write_batch(
                {
                    "id": np.arange(a, a + 20_000),
                    "x": np.zeros((20_000, 3), np.float32),
                    "wave": [
                        np.full(600 + i % 400, i % 251, np.uint8) for i in range(a, a + 20_000)
                    ],
                    "name": ["r"] * 20_000,
                }
            )
    with moto_s3(process=True) as (_, so):
        fsspec.filesystem("s3", **so).put(
            str(tmp_path / "in") + "/", "rowstore/in/", recursive=True
        )
        p = subprocess.run(
            [
                sys.executable,
                "-c",
                _REMOTE_RSS_CHILD,
                "s3://rowstore/in",
                str(tmp_path / "out"),
                "16MiB",
                json.dumps(so),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout.strip().splitlines()[-1])
    over = m["peak"] - m["base"] - m["memory"]
    print(m, over >> 20, "MiB over")
    assert m["piles"] >= 3
    assert over <= RSS_CONSTANT, (
        f"peak RSS {m['peak'] >> 20} MiB: {over >> 20} MiB over baseline + budget"
    )
    assert len(rowstore.open(tmp_path / "out")) == n


_PEAK_CHILD = r"""
import json, sys
import numpy as np
from rowstore.global_shuffle import shuffle
from rowstore.global_shuffle._passes import peak_rss
big = np.ones(384 << 20, np.uint8)  # touched: the process's peak before the shuffle
del big
rep = shuffle(sys.argv[1], sys.argv[2], memory="8MiB", seed=1)
print(json.dumps({"report": rep.peak_rss, "scope": rep.peak_scope, "summary": rep.summary()}))
"""


def test_the_report_gives_the_shuffles_own_peak_not_the_processs(tmp_path):
    """A process that held 384 MiB before shuffling a small dataset: the report's peak is the
    shuffle's (far below), and says so."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("this kernel does not let a process reset its VmHWM")
    src = write_sorted(tmp_path / "in", 2000)
    p = subprocess.run(
        [sys.executable, "-c", _PEAK_CHILD, src, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout.strip().splitlines()[-1])
    assert m["scope"] == "shuffle" and "(during the shuffle)" in m["summary"]
    assert m["report"] < 256 << 20, (
        f"reported peak {m['report'] >> 20} MiB includes memory freed before"
    )


_KILL_CHILD = r"""
import sys
from rowstore.global_shuffle import shuffle
print("ready", flush=True)
shuffle(sys.argv[1], sys.argv[2], memory="4MiB", seed=9, tmp=sys.argv[3], block_bytes=16384)
print("done", flush=True)
"""


def test_sigkill_at_random_points_leaves_no_output_and_the_next_run_cleans_up(tmp_path):
    n = 50_000
    src = write_sorted(tmp_path / "in", n, shard_bytes=4 << 20, block_bytes=65536)
    os.mkdir(tmp_path / "tmp")
    out = tmp_path / "out"
    args = [sys.executable, "-c", _KILL_CHILD, src, str(out), str(tmp_path / "tmp")]

    def start():
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child, time.perf_counter()

    child, t0 = start()  # a full run: how long the passes take here
    child.wait(timeout=300)
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""
    duration = time.perf_counter() - t0
    assert np.array_equal(ids_of(out), expected_order(9, n))
    import shutil

    shutil.rmtree(out)
    rng = np.random.default_rng(0)
    killed = 0
    # Kills spread over the run; a run faster than the calibrated one (a machine whose load
    # dropped) finishes before some: then further kills come earlier, until two landed.
    for i, frac in enumerate((0.15, 0.45, 0.75, 0.3, 0.2, 0.15)):
        if i >= 3 and killed >= 2:
            break
        child, t0 = start()
        time.sleep(duration * (frac + rng.uniform(-0.1, 0.1)))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            killed += 1
        child.wait(timeout=scaled(60))
        if os.path.exists(
            out
        ):  # finished before the kill, or killed after the final rename: complete
            assert np.array_equal(ids_of(out), expected_order(9, n)), (
                "a killed run left partial output"
            )
            shutil.rmtree(out)
        else:
            assert child.returncode == -signal.SIGKILL
    assert killed >= 2
    rep = rowstore.shuffle(src, out, memory="4MiB", seed=9, tmp=tmp_path / "tmp", block_bytes=16384)
    assert rep.rows == n and np.array_equal(ids_of(out), expected_order(9, n))
    assert leftovers(tmp_path, tmp_path / "tmp") == []
    assert sorted(os.listdir(out)) == ["_manifests", "rowstore.json", "shards"]


def test_remove_stale_takes_only_unlocked_shuffle_directories(tmp_path):
    from rowstore.global_shuffle._work import LockedDir, remove_stale

    live = LockedDir(str(tmp_path), "piles")
    os.makedirs(tmp_path / f"{PREFIX}piles.dead" / "sub")
    os.mkdir(tmp_path / "mine")
    (tmp_path / f"{PREFIX}file").write_text("not a directory")
    assert remove_stale(str(tmp_path)) == [str(tmp_path / f"{PREFIX}piles.dead")]
    assert (
        os.path.isdir(live.path)
        and os.path.isdir(tmp_path / "mine")
        and os.path.exists(tmp_path / f"{PREFIX}file")
    )
    live.release()  # as if its run died
    assert remove_stale(str(tmp_path)) == [live.path]


# -- command line --------------------------------------------------------------------------------
def test_cli_shuffle_prints_before_after_and_summary_quality_command(tmp_path, capsys):
    src = write_sorted(tmp_path / "in", 3000)
    assert (
        main(
            [
                "shuffle",
                src,
                str(tmp_path / "out"),
                "--memory",
                "4MiB",
                "--seed",
                "3",
                "--shard-bytes",
                "64KiB",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    before, after = out.split("before: ")[1].split("shuffled ")[0], out.split("after: ")[1]
    assert "Spearman)   +1.000" in before and "field 'id'" in before
    rho = float(after.split("Spearman)")[1].split()[0])
    assert abs(rho) < 0.1
    assert "passes 2" in out and "peak RSS" in out and "rows/s" in out
    assert np.array_equal(ids_of(tmp_path / "out"), expected_order(3, 3000))
    assert rowstore.open(tmp_path / "out").layout.num_shards > 1
    assert main(["quality", str(tmp_path / "out"), "--field", "x"]) == 1  # not a scalar field
    assert "expected a scalar numeric field" in capsys.readouterr().err
    assert main(["quality", str(tmp_path / "in"), "--batch-size", "100"]) == 0
    assert "batch 100" in capsys.readouterr().out
    assert main(["shuffle", src, str(tmp_path / "out"), "--memory", "4MiB"]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["shuffle", src, str(tmp_path / "o2"), "--memory", "4 bananas", "--quiet"]) == 1
    assert "memory must be a size" in capsys.readouterr().err


def test_order_quality_figures(tmp_path):
    src = write_sorted(tmp_path / "in", 5000, block_bytes=4096)
    q = rowstore.order_quality(src, batch_size=32)
    assert q.field == "id" and q.spearman == pytest.approx(1.0)
    assert q.batch_spread["none"] < 0.05 and 0 < q.block_mixing < 1
    rowstore.shuffle(src, tmp_path / "out", memory="4MiB", seed=1, block_bytes=4096)
    s = rowstore.order_quality(tmp_path / "out", batch_size=32)
    assert abs(s.spearman) < 0.05 and s.batch_spread["none"] > 0.9
    assert rowstore.quality.spearman(np.arange(10), -np.arange(10)) == pytest.approx(-1.0)
    assert rowstore.quality.spearman(np.arange(10), np.ones(10)) is None
    assert "Spearman" in s.text()
    with pytest.raises(rowstore.SchemaError, match="no field 'nope'"):
        rowstore.order_quality(src, field="nope")
