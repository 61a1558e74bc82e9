"""Statistics kept at write time agree with numpy's on the data written: every dtype, nullable
and variable fields, each write path (``write``'s compiled rows, ``write_batch``, ``write_raw``),
across blocks, heap chunks, appends, shards and dataset versions."""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout

import numpy as np
import pytest

import rowstore
from rowstore import DatasetWriter, Field, Schema, Writer
from rowstore.cli import main as cli_main
from rowstore.format import stats as fs
from rowstore.reader.raw import RawSource
from rowstore.stats import DatasetStats, FieldStats

N = 300


def _data(n: int = N, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    f = rng.normal(5.0, 3.0, n)
    f[::17] = np.nan
    f[5::31] = np.inf
    f[6::41] = -np.inf
    return {
        "i8": rng.integers(-100, 100, n).astype(np.int8),
        "i64": rng.integers(-(10**12), 10**12, n),
        "u16": rng.integers(0, 60000, n).astype(np.uint16),
        "label": rng.integers(0, 7, n).astype(np.int32),
        "f32": rng.normal(0, 1, n).astype(np.float32),
        "f64": f,
        "flag": rng.random(n) < 0.3,
        "t": np.datetime64("2024-01-01T00:00:00", "s")
        + rng.integers(0, 10**7, n).astype("timedelta64[s]"),
        "vec": rng.normal(0, 2, (n, 3)).astype(np.float32),
        "word": [["cat", "dog", "ému", "ant"][k] for k in rng.integers(0, 4, n)],
        "blob": [bytes(rng.integers(0, 256, k).astype(np.uint8)) for k in rng.integers(0, 9, n)],
        "wave": [rng.normal(1, 2, k).astype(np.float32) for k in rng.integers(0, 12, n)],
    }


SCHEMA = Schema(
    [
        Field("i8", "int8"),
        Field("i64", "int64"),
        Field("u16", "uint16"),
        Field("label", "int32"),
        Field("f32", "float32"),
        Field("f64", "float64"),
        Field("flag", "bool"),
        Field("t", "datetime64[s]"),
        Field("vec", "float32", (3,)),
        Field("word", "str"),
        Field("blob", "bytes"),
        Field("wave", "float32", (None,)),
    ]
)


def _check_numbers(s: FieldStats, x: np.ndarray, *, integer: bool) -> None:
    x = np.asarray(x).reshape(-1)
    if x.dtype.kind in "mM":
        x = x.view(np.int64)
    if x.dtype.kind == "b":
        x = x.astype(np.int64)
    assert s.elements == x.size
    fin = x[np.isfinite(x)] if x.dtype.kind == "f" else x
    if x.dtype.kind == "f":
        assert s.nan == int(np.isnan(x).sum())
        assert s.inf == int(np.isinf(x).sum())
    assert s.finite == fin.size
    if not fin.size:
        assert s.min is None and s.mean is None and s.var is None
        return
    if integer:
        assert s.min == int(fin.min()) and s.max == int(fin.max())
        assert type(s.min) is int
    else:
        assert s.min == float(fin.min()) and s.max == float(fin.max())
    f64 = fin.astype(np.float64)
    assert s.mean == pytest.approx(float(f64.mean()), rel=1e-12, abs=1e-12)
    assert s.var == pytest.approx(float(f64.var()), rel=1e-9, abs=1e-12)
    assert s.std == pytest.approx(float(f64.std()), rel=1e-9, abs=1e-12)
    edges, counts = s.histogram
    assert sum(counts) == fin.size and len(counts) <= fs.BINS
    assert edges[0] <= float(f64.min()) and float(f64.max()) < edges[-1]
    want, _ = np.histogram(f64, bins=np.array(edges))
    # numpy's last bin is closed on the right; ours are all half-open: same counts unless the
    # maximum sits on the last edge, which our bins never allow
    assert counts == want.tolist()
    widths = np.diff(edges)
    assert np.allclose(widths, widths[0])
    assert math.log2(widths[0]).is_integer()
    if integer:
        assert widths[0] >= 1


def _check_values(s: FieldStats, values: list) -> None:
    top, other, complete = s.values
    uniq, counts = np.unique(np.asarray(values, dtype=object).astype(str), return_counts=True)
    want = {u: int(c) for u, c in zip(uniq.tolist(), counts.tolist())}
    assert complete and other == 0
    assert {str(v).lower() if isinstance(v, bool) else str(v): c for v, c in top} == {
        k.lower() if k in ("True", "False") else k: c for k, c in want.items()
    }
    assert [c for _, c in top] == sorted((c for _, c in top), reverse=True)


def _check_all(stats: DatasetStats, d: dict) -> None:
    n = len(d["i8"])
    assert stats.rows == n
    for name in ("i8", "i64", "u16", "label", "flag", "t"):
        _check_numbers(stats[name], d[name], integer=True)
    for name in ("f32", "f64", "vec"):
        _check_numbers(stats[name], d[name], integer=False)
    for name, s in stats.fields.items():
        assert s.count == n and s.nulls == 0, name
    _check_values(stats["label"], d["label"].tolist())
    _check_values(stats["flag"], d["flag"].tolist())
    _check_values(stats["word"], d["word"])
    top, other, complete = stats["i64"].values  # all distinct: TOP listed, the rest other
    assert len(top) == fs.TOP and other == n - fs.TOP and not complete
    assert all(c == 1 for _, c in top) and {v for v, _ in top} <= set(d["i64"].tolist())
    assert stats["f64"].values is None and stats["vec"].values is None
    word_len = np.array([len(w.encode()) for w in d["word"]])
    _check_numbers(stats["word"].lengths, word_len, integer=True)
    _check_numbers(stats["blob"].lengths, np.array([len(b) for b in d["blob"]]), integer=True)
    _check_numbers(stats["wave"].lengths, np.array([len(w) for w in d["wave"]]), integer=True)
    _check_numbers(stats["wave"], np.concatenate(d["wave"]), integer=False)
    assert stats["word"].kind == "str" and stats["t"].kind == "time"
    assert stats["flag"].kind == "bool"


def _rows(d: dict, lo: int, hi: int):
    for i in range(lo, hi):
        yield {k: v[i] for k, v in d.items()}


@pytest.mark.parametrize("how", ["write", "write_batch", "mixed"])
def test_writer_stats_agree_with_numpy(tmp_path, how):
    d = _data()
    path = tmp_path / "a.h5"
    # small blocks and heap chunks: statistics are folded block by block and before every cut
    with Writer(path, SCHEMA, rows_per_block=16, heap_chunk_bytes=256) as w:
        if how == "write":
            for row in _rows(d, 0, N):
                w.write(row)
        elif how == "write_batch":
            w.write_batch(d)
        else:
            w.write_batch({k: v[:100] for k, v in d.items()})
            for row in _rows(d, 100, 150):
                w.write(row)
            w.write_batch({k: v[150:] for k, v in d.items()})
    with rowstore.open(path) as r:
        _check_all(r.stats(), d)


def test_nullable_and_nan_only(tmp_path):
    schema = Schema(
        [
            Field("x", "float64", nullable=True),
            Field("s", "str", nullable=True),
            Field("v", "int16", (None,), nullable=True),
            Field("nan", "float32"),
        ]
    )
    n = 50
    xs = [None if i % 3 == 0 else float(i) for i in range(n)]
    ss = [None if i % 4 == 0 else f"k{i % 5}" for i in range(n)]
    vs = [None if i % 5 == 0 else np.arange(i % 7, dtype=np.int16) - 3 for i in range(n)]
    with Writer(tmp_path / "n.h5", schema, rows_per_block=8, heap_chunk_bytes=64) as w:
        for i in range(n):
            w.write({"x": xs[i], "s": ss[i], "v": vs[i], "nan": np.float32("nan")})
    st = rowstore.open(tmp_path / "n.h5").stats()
    x = st["x"]
    assert x.nulls == sum(v is None for v in xs) and x.count == n - x.nulls
    _check_numbers(x, np.array([v for v in xs if v is not None]), integer=False)
    assert st["s"].nulls == sum(v is None for v in ss)
    _check_values(st["s"], [v for v in ss if v is not None])
    vv = [v for v in vs if v is not None]
    assert st["v"].nulls == n - len(vv)
    _check_numbers(st["v"], np.concatenate(vv), integer=True)
    _check_numbers(st["v"].lengths, np.array([len(v) for v in vv]), integer=True)
    nan = st["nan"]
    assert nan.nan == n and nan.finite == 0 and nan.min is None and nan.histogram is None


def test_append_and_raw_rows(tmp_path):
    d = _data(seed=1)
    path = tmp_path / "a.h5"
    with Writer(path, SCHEMA, rows_per_block=16, heap_chunk_bytes=256) as w:
        w.write_batch({k: v[:123] for k, v in d.items()})
    with Writer(path, mode="a") as w:  # continues the partial last block and heap chunk
        w.write_batch({k: v[123:] for k, v in d.items()})
    _check_all(rowstore.open(path).stats(), d)
    # rows copied as they are (what shuffles write) are counted from their stored bytes
    with (
        RawSource(path) as src,
        Writer(tmp_path / "copy.h5", SCHEMA, rows_per_block=16, heap_chunk_bytes=256) as w,
    ):
        for k in range(src.num_blocks):
            first, n = src.block_rows(k)
            w.write_raw(src.blocks(k, k + 1, np.arange(n)))
    _check_all(rowstore.open(tmp_path / "copy.h5").stats(), d)


def test_stats_off_and_append_to_file_without(tmp_path):
    d = _data(seed=2)
    path = tmp_path / "off.h5"
    with Writer(path, SCHEMA, stats=False) as w:
        w.write_batch({k: v[:10] for k, v in d.items()})
    assert rowstore.open(path).stats() is None
    assert rowstore.Layout.open(path).stats is None
    with Writer(path, mode="a") as w:  # the old rows are unknown: still none
        w.write_batch({k: v[10:20] for k, v in d.items()})
    assert rowstore.open(path).stats() is None


def test_dataset_shards_appends_and_versions(tmp_path):
    d = _data(N, seed=3)
    root = tmp_path / "ds"
    with DatasetWriter(root, SCHEMA, shard_bytes=4000, rows_per_block=16) as w:
        w.write_batch({k: v[:200] for k, v in d.items()})
    with rowstore.open(root) as r:
        assert r.layout.num_shards > 2
        _check_all(r.stats(), {k: v[:200] for k, v in d.items()})
    with DatasetWriter(root, mode="a", shard_bytes=4000) as w:
        for row in _rows(d, 200, N):
            w.write(row)
    with rowstore.open(root) as r:
        _check_all(r.stats(), d)
    with rowstore.open(root, version=1) as r:  # each version keeps its own
        assert r.stats().rows == 200
    # the shard files read as a list: their statistics merged on open
    files = sorted((root / "shards").glob("*.h5"))
    with rowstore.open([str(p) for p in files]) as r:
        assert r.stats().rows == N
    # the manifest stores them; a version made of shards without any has none
    m = json.loads(next((root / "_manifests").glob("v00000002.json")).read_text())
    assert m["stats"]["rows"] == N
    with DatasetWriter(root, mode="a", stats=False) as w:
        w.write_batch({k: v[:5] for k, v in d.items()})
    assert rowstore.open(root).stats() is None


def test_values_past_max_track_are_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "MAX_TRACK", 20)
    schema = Schema([Field("id", "int64"), Field("k", "int64"), Field("s", "str")])
    n = 64
    with Writer(tmp_path / "ids.h5", schema, rows_per_block=8) as w:
        w.write_batch(
            {"id": np.arange(n) * 7, "k": np.arange(n) % 5, "s": [f"w{i}" for i in range(n)]}
        )
    st = rowstore.open(tmp_path / "ids.h5").stats()
    assert st["id"].values is None and st["s"].values is None  # ids, free text: not counted
    _check_values(st["k"], (np.arange(n) % 5).tolist())


def test_merge_is_order_free_and_exact():
    rng = np.random.default_rng(4)
    from rowstore.writer._stats import numbers

    parts = [rng.normal(m, s, 100) * 10.0**k for m, s, k in [(0, 1, 0), (50, 3, 2), (-7, 0.1, -3)]]
    stored = [numbers(p, "number", integer=False) for p in parts]
    for s, p in zip(stored, parts):
        s["count"] = len(p)
    a = fs.merge_field(fs.merge_field(stored[0], stored[1]), stored[2])
    b = fs.merge_field(stored[2], fs.merge_field(stored[1], stored[0]))
    assert a["hist"] == b["hist"]
    whole = numbers(np.concatenate(parts), "number", integer=False)
    assert a["hist"] == whole["hist"]  # merging bins is exact: as if counted at once
    assert a["mean"] == pytest.approx(whole["mean"], rel=1e-12)
    assert a["m2"] == pytest.approx(whole["m2"], rel=1e-9)


def test_images_sizes_and_channels(tmp_path):
    schema = Schema(
        [
            Field("img", "uint8", (None, None, 3), codec="png"),
            Field("gray", "uint8", (8, 8), codec="png"),
        ]
    )
    rng = np.random.default_rng(5)
    sizes = [(4 + i % 3, 5 + i % 4) for i in range(12)]
    with Writer(tmp_path / "im.h5", schema, rows_per_block=4) as w:
        for h, wd in sizes:
            w.write(
                {
                    "img": rng.integers(0, 255, (h, wd, 3), dtype=np.uint8),
                    "gray": rng.integers(0, 255, (8, 8), dtype=np.uint8),
                }
            )
    st = rowstore.open(tmp_path / "im.h5").stats()
    img = st["img"].images
    _check_numbers(img["height"], np.array([h for h, _ in sizes]), integer=True)
    _check_numbers(img["width"], np.array([w for _, w in sizes]), integer=True)
    assert img["channels"].values[0] == [(3, 12)]
    assert st["gray"].images["channels"].values[0] == [(1, 12)]
    assert st["img"].kind == "encoded" and st["img"].lengths.min > 0


def test_cli_table_and_json(tmp_path):
    d = _data(seed=6)
    path = tmp_path / "c.h5"
    with Writer(path, SCHEMA) as w:
        w.write_batch(d)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["stats", str(path)]) == 0
    text = out.getvalue()
    assert f"{N} rows" in text
    lines = {ln.split()[0]: ln for ln in text.splitlines()[3:]}
    assert set(lines) == set(SCHEMA.names)
    assert f"{d['i8'].min()}" in lines["i8"].split() and f"{d['i8'].max()}" in lines["i8"].split()
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["stats", str(path), "--json"]) == 0
    got = DatasetStats.from_dict(json.loads(out.getvalue()))
    _check_all(got, d)
    assert got.to_dict() == rowstore.open(path).stats().to_dict()
    with Writer(tmp_path / "none.h5", SCHEMA, stats=False) as w:
        w.write_batch(d)
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_main(["stats", str(tmp_path / "none.h5")]) == 1
    assert "no statistics" in out.getvalue()


def test_grouping_does_not_change_statistics(tmp_path):
    """Rows folded in other groups (row by row with tiny heap chunks, one batch, an append)
    give the same counts, extremes, bins and values; means and variances up to rounding."""
    d = _data(seed=7)
    kw = dict(rows_per_block=16, heap_chunk_bytes=64)
    with Writer(tmp_path / "rows.h5", SCHEMA, **kw) as w:
        for row in _rows(d, 0, N):
            w.write(row)
    with Writer(tmp_path / "batch.h5", SCHEMA, rows_per_block=N) as w:
        w.write_batch(d)
    with Writer(tmp_path / "app.h5", SCHEMA, **kw) as w:
        w.write_batch({k: v[:77] for k, v in d.items()})
    with Writer(tmp_path / "app.h5", mode="a") as w:
        w.write_batch({k: v[77:] for k, v in d.items()})
    got = [rowstore.Layout.open(tmp_path / f"{n}.h5").stats for n in ("rows", "batch", "app")]
    assert fs.close(got[0], got[1])
    # an append merges the file's stored lists (24 values): exact where they were complete
    for st in (got[0], got[2]):
        for f in st["fields"].values():
            if "values" in f and not f["values"]["complete"]:
                del f["values"]
    assert fs.close(got[0], got[2])
    assert {"label", "flag", "word"} <= {k for k, f in got[2]["fields"].items() if "values" in f}
    assert not fs.close(got[0], {**got[0], "rows": 1})


@pytest.mark.parametrize(
    "dtype", ["f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "?", "M8[ms]"]
)
def test_kernel_agrees_with_numpy(dtype):
    """The compiled column statistics against the numpy reference (:func:`numbers`), strided
    columns and skipped (null) rows included."""
    from rowstore.writer._stats import column, numbers

    rng = np.random.default_rng(8)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = (rng.normal(3, 5, (40, 3)) * 100).astype(dt)
        x[3, 1], x[7, 0], x[9, 2] = np.nan, np.inf, -np.inf
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, (40, 3), dtype=dt, endpoint=True)
    elif dt.kind == "b":
        x = rng.random((40, 3)) < 0.4
    else:
        x = (rng.integers(0, 10**12, (40, 3))).astype(dt)
        x[5, 1] = np.datetime64("NaT")
    rows = np.zeros(40, dtype=[("pad", "u1"), ("x", dt, (3,)), ("null", "?")])
    rows["x"] = x
    rows["null"][::7] = True
    kind = "bool" if dt.kind == "b" else "time" if dt.kind == "M" else "number"
    integer = dt.kind in "iubM"
    got = column(rows["x"], kind, integer=integer, skip=rows["null"])
    want = numbers(x[~rows["null"]].reshape(-1), kind, integer=integer)
    for k in ("elements", "nan", "inf", "finite", "min", "max"):
        assert got[k] == want[k], k
    assert got["mean"] == pytest.approx(want["mean"], rel=1e-9)
    assert got["m2"] == pytest.approx(want["m2"], rel=1e-6)
    assert got.get("hist") == want.get("hist") or dt.kind == "u" and dt.itemsize == 8


def test_extreme_values_still_store_readable_statistics(tmp_path):
    big = np.finfo(np.float64).max
    schema = Schema([Field("x", "float64"), Field("u", "uint64"), Field("t", "float32")])
    with Writer(tmp_path / "x.h5", schema, rows_per_block=2) as w:
        w.write_batch(
            {
                "x": np.array([big, -big, big, 0.0, 5e-324, -5e-324]),
                "u": np.array([2**64 - 1, 2**64 - 2, 2**63, 0, 2**64 - 1, 7], dtype=np.uint64),
                "t": np.array([3.4e38, -3.4e38, 1.0, 0, 0, 0], dtype=np.float32),
            }
        )
    st = rowstore.open(tmp_path / "x.h5").stats()  # checked on read: finite, consistent
    assert st["x"].max == big and st["x"].min == -big and st["x"].finite == 6
    assert st["u"].max == 2**64 - 1 and st["u"].min == 0
    assert math.isfinite(st["x"].var) and math.isfinite(st["t"].var)


def test_xarray_patch_statistics_agree(tmp_path):
    """The xarray patch writer's per-variable mean and std (its metadata, for normalization)
    are the writer's statistics of that field: the same numbers over the same finite values."""
    xr = pytest.importorskip("xarray")
    from rowstore.xarray import write_patches

    rng = np.random.default_rng(9)
    t = rng.normal(280, 12, (4, 2, 13, 11))
    t[0, 1, 2, 3] = np.nan
    ds = xr.Dataset({"t": (("time", "altitude", "lat", "lon"), t)})
    write_patches(ds, str(tmp_path / "p"), patch={"lat": 13, "lon": 11}, variables=["t"])
    with rowstore.open(str(tmp_path / "p")) as r:
        patches = r.layout.user_attrs["xarray"]["patches"]
        meta, field = patches["stats"]["t"], patches["fields"]["t"]
        st = r.stats()[field]
    assert st.finite == meta["count"] == t.size - 1 and st.nan == 1
    assert st.mean == pytest.approx(meta["mean"], rel=1e-12)
    assert st.std == pytest.approx(meta["std"], rel=1e-9)


@pytest.mark.parametrize("dtype", ["f4", "f8", "i1", "i8", "u2", "u8", "M8[s]"])
def test_unchecked_kernel_paths_agree_with_numpy(dtype):
    """Columns free of NaN/inf/NaT, no nulls: the kernels' unchecked four-lane loops (rows of 7
    contiguous elements: four at a time and the rest), and a NaN or NaT found after all."""
    from rowstore.writer._stats import column, numbers

    rng = np.random.default_rng(9)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = (rng.normal(-2, 7, (50, 7)) * 10).astype(dt)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        x = rng.integers(info.min, info.max, (50, 7), dtype=dt, endpoint=True)
    else:
        x = rng.integers(0, 10**9, (50, 7)).astype(dt)
    rows = np.zeros(50, dtype=[("pad", "u1"), ("x", dt, (7,))])
    rows["x"] = x
    kind = "time" if dt.kind == "M" else "number"
    integer = dt.kind in "iuM"
    bad = x.copy()
    if dt.kind in "fM":
        bad[4, 6] = np.nan if dt.kind == "f" else np.datetime64("NaT")
    for col, ref in ((rows["x"], x), (bad, bad)):
        got = column(col, kind, integer=integer)
        want = numbers(ref.reshape(-1), kind, integer=integer)
        for k in ("elements", "nan", "inf", "finite", "min", "max"):
            assert got[k] == want[k], k
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-9)
        assert got["m2"] == pytest.approx(want["m2"], rel=1e-6)
        assert got.get("hist") == want.get("hist") or dt.kind == "u" and dt.itemsize == 8


def test_payload_kernels_count_gather_and_refuse_outside_the_heap():
    """The str-value counter and the payload gatherer: exact counts, the stop past the limit,
    and a ValueError (no read outside) for payloads beyond the heap."""
    from rowstore import kernels

    heap = np.frombuffer(b"catdogcatbirdcat", np.uint8)
    off = np.array([0, 3, 6, 9, 13, 0], np.int64)
    nb = np.array([3, 3, 3, 4, 3, 0], np.int64)
    counts: dict = {}
    assert kernels.stats_count_payloads(heap, off, nb, counts, 10)
    assert counts == {b"cat": 3, b"dog": 1, b"bird": 1, b"": 1}
    assert not kernels.stats_count_payloads(heap, off, nb, {}, 2)
    out = np.zeros(16, np.uint8)
    assert kernels.stats_gather(heap, off, nb, out) == 16
    assert out.tobytes() == b"catdogcatbirdcat"
    for o, n in ((14, 3), (-1, 2), (0, -1), (17, 0)):
        with pytest.raises(ValueError):
            kernels.stats_count_payloads(
                heap, np.array([o], np.int64), np.array([n], np.int64), {}, 9
            )
        with pytest.raises(ValueError):
            kernels.stats_gather(heap, np.array([o], np.int64), np.array([n], np.int64), out)
    with pytest.raises(ValueError):  # the output too small
        kernels.stats_gather(heap, off, nb, np.zeros(15, np.uint8))
