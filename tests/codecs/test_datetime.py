"""datetime64/timedelta64 fields: every unit, NaT, fixed and variable shapes, nullable, raw and
compressed files, the writer's unit conversions, and the int64 views of torch and tf."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

import rowstore
from rowstore import Field, RowValidationError, Schema, SchemaError

UNITS = [
    ("M", "D"),
    ("M", "s"),
    ("M", "ms"),
    ("M", "us"),
    ("M", "ns"),
    ("m", "s"),
    ("m", "ms"),
    ("m", "us"),
    ("m", "ns"),
]
COMPRESSIONS = [None, "lz4"]


def _values(kind, unit, n):
    counts = np.arange(n, dtype=np.int64) * 1_000_003 - 7
    arr = counts.astype(f"{kind}8[{unit}]")
    arr[1] = np.datetime64("NaT") if kind == "M" else np.timedelta64("NaT")
    return arr


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=["raw", "lz4"])
@pytest.mark.parametrize(("kind", "unit"), UNITS, ids=[f"{k}8[{u}]" for k, u in UNITS])
def test_round_trip_every_unit(tmp_path, kind, unit, compression):
    n = 9
    dtype = np.dtype(f"<{kind}8[{unit}]")
    schema = Schema(
        [
            Field("s", dtype),
            Field("f", dtype, (2,)),
            Field("v", dtype, (None,), nullable=True),
            Field("ns", dtype, nullable=True),
        ]
    )
    assert Schema.from_json(schema.to_json_str()) == schema
    assert (
        schema.to_json()["fields"][0]["dtype"] == dtype.str
    )  # e.g. "<M8[ns]": the unit in the JSON
    s = _values(kind, unit, n)
    f = np.stack([s, s[::-1]], axis=1)
    v = [None if i == 3 else s[: i % 4] for i in range(n)]
    nulls = [None if i % 3 == 0 else s[i] for i in range(n)]
    path = str(tmp_path / "t.h5")
    with rowstore.Writer(path, schema, compression=compression, rows_per_block=4) as w:
        w.write_batch({"s": s[:5], "f": f[:5], "v": v[:5], "ns": nulls[:5]})
        for i in range(5, n):
            w.write({"s": s[i], "f": f[i], "v": v[i], "ns": nulls[i]})
    with rowstore.open(path) as r:
        assert r.schema == schema
        rows = [8, 0, 1, 5, 3]
        for b in (r.take(rows), r.take(np.arange(n))):
            idx = rows if len(b["s"]) == len(rows) else list(range(n))
            assert b["s"].dtype == dtype and b["f"].dtype == dtype and b["v"].dtype == dtype
            np.testing.assert_array_equal(
                b["s"], s[idx]
            )  # NaT compares equal in assert_array_equal
            np.testing.assert_array_equal(b["f"], f[idx])
            assert b["v__null"].tolist() == [v[i] is None for i in idx]
            for j, i in enumerate(idx):
                if v[i] is not None:
                    np.testing.assert_array_equal(b["v"][j], v[i])
            assert b["ns__null"].tolist() == [i % 3 == 0 for i in idx]
            assert np.isnat(b["s"][idx.index(1)])  # NaT is a value, not a null
        got = np.concatenate([b["s"] for b in r.batches(4, shuffle="none")])
        np.testing.assert_array_equal(got, s)


def test_units_are_checked():
    for bad in ("datetime64", "M8[Y]", "M8[2s]", "timedelta64[D]", "m8[M]"):
        with pytest.raises(SchemaError, match="unit"):
            Field("t", bad)
    assert Field("t", ">M8[ns]").dtype == np.dtype("<M8[ns]")
    assert Field("t", "datetime64[us]").storage_dtype == np.dtype("<i8")


def _writer(tmp_path, field):
    return rowstore.Writer(str(tmp_path / "w.h5"), Schema([field]))


def test_other_units_convert_when_exact(tmp_path):
    with _writer(tmp_path, Field("t", "M8[ns]")) as w:
        w.write_batch({"t": np.array(["2020-01-01", "NaT"], "M8[s]")})
        w.write({"t": dt.datetime(2021, 1, 2, 3, 4, 5, 6)})
        w.write({"t": np.datetime64("2022-03-04", "D")})
        w.write({"t": np.datetime64("NaT")})
    with rowstore.open(str(tmp_path / "w.h5")) as r:
        t = r.take(np.arange(5))["t"]
    want = np.array(
        ["2020-01-01", "NaT", "2021-01-02T03:04:05.000006", "2022-03-04", "NaT"], "M8[ns]"
    )
    np.testing.assert_array_equal(t, want)


def test_lossy_casts_name_field_and_row(tmp_path):
    with _writer(tmp_path, Field("t", "M8[s]")) as w:
        w.write_batch(
            {"t": np.array(["2020-01-01T00:00:01", "2020-01-01"], "M8[ns]")}
        )  # whole seconds: fine
        col = np.array(["2020-01-01", "2020-01-01T00:00:00.5", "2020-01-02"], "M8[ms]")
        with pytest.raises(RowValidationError, match=r"row 3: field 't'.*without loss") as ei:
            w.write_batch({"t": col})
        assert ei.value.field == "t" and ei.value.row == 3
        with pytest.raises(RowValidationError, match=r"row 2: field 't'"):
            w.write({"t": np.datetime64("2020-01-01T00:00:00.001")})
    with _writer(tmp_path, Field("d", "m8[ns]", (None,))) as w:
        with pytest.raises(
            RowValidationError, match=r"row 0: field 'd'.*without loss"
        ):  # overflows ns
            w.write({"d": np.array([10**12], "m8[s]")})


def test_ints_and_wrong_kinds_are_refused(tmp_path):
    with _writer(tmp_path, Field("t", "M8[ms]")) as w:
        with pytest.raises(RowValidationError, match=r"astype\('datetime64\[ms\]'\)"):
            w.write_batch({"t": np.arange(3)})
        with pytest.raises(RowValidationError, match=r"astype\('datetime64\[ms\]'\)"):
            w.write({"t": 5})
        with pytest.raises(RowValidationError, match="not a datetime64"):
            w.write({"t": np.timedelta64(5, "ms")})
        with pytest.raises(RowValidationError, match="not nullable"):
            w.write({"t": None})
        w.write_batch({"t": np.arange(3).astype("M8[ms]")})  # what the message says to pass


def test_torch_gets_int64_counts(tmp_path):
    torch = pytest.importorskip("torch")
    import rowstore.torch as rt

    path = str(tmp_path / "t.h5")
    schema = Schema([Field("t", "M8[us]"), Field("d", "m8[s]", (None,))])
    t = np.array(["2020-01-01", "NaT", "1970-01-01T00:00:00.000003"], "M8[us]")
    d = [np.array([1, -2], "m8[s]"), np.array([], "m8[s]"), np.array([7], "m8[s]")]
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"t": t, "d": d})
    assert schema["t"].torch_dtype() == torch.int64
    b = next(iter(rt.BatchedDataLoader(path, batch_size=3, shuffle="none")))
    assert b["t"].dtype == torch.int64 and b["t"].tolist() == t.view(np.int64).tolist()
    assert b["d"].tolist() == [[1, -2], [0, 0], [7, 0]] and b["d__shape"].tolist() == [
        [2],
        [0],
        [1],
    ]
    b = next(iter(rt.BatchedDataLoader(path, batch_size=3, shuffle="none", fields=["t"])))
    assert b["t"].dtype == torch.int64 and b["t"][1].item() == np.iinfo(np.int64).min  # NaT
    row = rt.Dataset(path)[2]
    assert row["t"].item() == 3 and row["d"].tolist() == [7]


def test_tf_gets_int64_counts(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import rowstore.tf as rtf

    path = str(tmp_path / "t.h5")
    schema = Schema([Field("t", "M8[ns]"), Field("d", "m8[ms]", (None,), nullable=True)])
    t = np.array(["2020-01-01", "NaT", "2000-01-01"], "M8[ns]")
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"t": t, "d": [np.array([1, 2], "m8[ms]"), None, np.array([3], "m8[ms]")]})
    sig = rtf.output_signature(schema, batch_size=3)
    assert sig["t"].dtype == tf.int64 and sig["d"].dtype == tf.int64
    b = next(iter(rtf.make_dataset(path, batch_size=3, shuffle="none")))
    assert b["t"].numpy().tolist() == t.view(np.int64).tolist()
    assert b["d"].to_list() == [[1, 2], [], [3]] and b["d__null"].numpy().tolist() == [
        False,
        True,
        False,
    ]
