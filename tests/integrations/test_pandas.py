"""pandas -> rowstore -> pandas round trips are exact: ndarray cells, dtypes, nulls, index."""

from __future__ import annotations

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

import rowstore  # noqa: E402
from rowstore.errors import RowValidationError, SchemaError  # noqa: E402
from rowstore.pandas import from_pandas, infer_schema, read_pandas, to_pandas  # noqa: E402


def assert_frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Equal frames, ndarray cells compared exactly (dtype, shape, values, NaN in place)."""
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_index_equal(a.index, b.index, exact=True)
    for c in a.columns:
        sa, sb = a[c], b[c]
        assert sa.dtype == sb.dtype, (c, sa.dtype, sb.dtype)
        if sa.dtype == object:
            for i, (x, y) in enumerate(zip(sa, sb)):
                if isinstance(x, np.ndarray):
                    assert (
                        isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape
                    ), (c, i)
                    np.testing.assert_array_equal(x, y)
                elif x is None or x is pd.NA:
                    assert y is x, (c, i, y)
                elif isinstance(x, float) and x != x:
                    assert isinstance(y, float) and y != y, (c, i, y)
                else:
                    assert type(x) is type(y) and x == y, (c, i, x, y)
        else:
            pd.testing.assert_series_equal(sa, sb, check_exact=True)


def speech_frame(n: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "wave": [
                rng.standard_normal(int(k)).astype(np.float32) for k in rng.integers(0, 50, n)
            ],
            "speaker": pd.array([f"spk{i % 3}" for i in range(n)], dtype="string"),
            "transcript": [["héllo", "日本語", "😀", ""][i % 4] for i in range(n)],
            "test": rng.random(n) < 0.5,
            "dataset": pd.Categorical(["libri", "cv"] * (n // 2) + ["libri"] * (n % 2)),
            "dur": rng.random(n),
        }
    )


def roundtrip(df, tmp_path, **kw):
    path = str(tmp_path / "f.h5")
    from_pandas(df, path, **kw)
    return read_pandas(path)


def test_speech_table_round_trip(tmp_path):
    df = speech_frame()
    schema = infer_schema(df)
    assert schema["wave"].shape == (None,) and schema["wave"].dtype == np.float32
    assert schema["dataset"].dtype.kind == "i"
    assert_frames_equal(df, roundtrip(df, tmp_path))


def test_every_kind_with_missing_values(tmp_path):
    n = 6
    df = pd.DataFrame(
        {
            "i8": np.arange(n, dtype=np.int8),
            "u64": np.arange(n, dtype=np.uint64) * (2**62),
            "f32": np.array([1.5, np.nan, -np.inf, 0, 2, 3], np.float32),
            "c": np.arange(n) * (1 + 2j),
            "b": np.arange(n) % 2 == 0,
            "Int64": pd.array([1, None, 3, None, 5, 6], dtype="Int64"),
            "UInt8": pd.array([1, 2, None, 4, 5, 255], dtype="UInt8"),
            "Float64": pd.array([0.5, None, 2, 3, 4, 5], dtype="Float64"),
            "boolean": pd.array([True, None, False, True, None, False], dtype="boolean"),
            "string": pd.array(["a", None, "é", "", "x", None], dtype="string"),
            "str": pd.Series(["a", None, "日本", "", "b", "c"], dtype="str"),
            "obj_str_none": pd.Series(["a", None, "b", "c", None, "d"], dtype=object),
            "obj_str_nan": pd.Series(["a", np.nan, "b", "c", np.nan, "é"], dtype=object),
            "obj_str_na": pd.Series(["a", pd.NA, "b", "c", "", "d"], dtype=object),
            "obj_bytes": [b"", b"\x00\xff", None, b"x", b"y", b"z"],
            "cat": pd.Categorical(
                ["x", None, "y", "x", "z", "y"], categories=["z", "y", "x"], ordered=True
            ),
            "cat_int": pd.Categorical([3, 1, 3, 1, 2, 2]),
            "when": pd.to_datetime(
                [
                    "2020-01-01",
                    None,
                    "1969-12-31 23:59:59.5",
                    "2262-01-01",
                    "2000-02-29",
                    "1900-01-01",
                ],
                format="ISO8601",
            ),
            "when_tz": pd.to_datetime(
                ["2020-01-01", None, "2021-06-01", "2022-01-01", "2023-01-01", "2024-01-01"]
            ).tz_localize("Europe/Paris"),
            "delta": pd.to_timedelta([1, None, -3, 0, 10**12, 5], unit="s"),
            "grid": [np.full((2, k, 3), k, np.int16) for k in range(n)],
            "fixed": [np.arange(4, dtype=np.float64) + k for k in range(n)],
            "maybe": [
                np.zeros(3, np.uint8),
                None,
                np.ones(0, np.uint8),
                np.ones(2, np.uint8),
                None,
                np.ones(1, np.uint8),
            ],
        }
    )
    schema = infer_schema(df)
    assert schema["fixed"].shape == (4,) and schema["grid"].shape == (2, None, 3)
    assert schema["maybe"].nullable and schema["Int64"].nullable and not schema["f32"].nullable
    # Native time fields (NaT is a value, not a null); tz-aware columns in UTC, tz in the
    # attributes.
    assert (
        schema["when"].dtype == df["when"].dtype.newbyteorder("<") and not schema["when"].nullable
    )
    assert schema["when_tz"].dtype == np.dtype(f"<M8[{df['when_tz'].dtype.unit}]")
    assert schema["delta"].dtype == df["delta"].dtype.newbyteorder("<")
    back = roundtrip(df, tmp_path)
    assert_frames_equal(df, back)
    assert np.isnan(back["f32"][1])  # NaN stays NaN, not null
    assert back["obj_str_nan"].dtype == object and back["obj_str_none"][1] is None


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_time_columns_are_native_fields(tmp_path, unit):
    when = pd.Series(pd.to_datetime(["2020-01-01 12:00", None, "1999-12-31 00:00"]).as_unit(unit))
    df = pd.DataFrame(
        {
            "when": when,
            "when_tz": when.dt.tz_localize("America/New_York"),
            "delta": pd.Series(pd.to_timedelta([1, None, -3], unit="s").as_unit(unit)),
            "cells": [
                np.array(["2020-01-01", "NaT"], f"M8[{unit}]"),
                None,
                np.array([], f"M8[{unit}]"),
            ],
        }
    )
    path = str(tmp_path / "t.h5")
    from_pandas(df, path)
    with rowstore.open(path) as r:
        s = r.schema
        assert s["when"].dtype == np.dtype(f"<M8[{unit}]") and s["delta"].dtype == np.dtype(
            f"<m8[{unit}]"
        )
        assert s["when_tz"].dtype == np.dtype(f"<M8[{unit}]") and s["cells"].shape == (None,)
        b = r.take([0, 1, 2])
        assert b["when"].dtype == np.dtype(f"M8[{unit}]") and np.isnat(b["when"][1])
        # tz-aware: stored as UTC wall time
        assert b["when_tz"][0] == np.datetime64("2020-01-01T17:00")
    back = read_pandas(path)
    assert_frames_equal(df, back)
    assert str(back["when_tz"].dtype) == f"datetime64[{unit}, America/New_York]"


def test_plain_file_time_field_reads_with_nat_for_nulls(tmp_path):
    path = str(tmp_path / "p.h5")
    with rowstore.Writer(path, rowstore.Schema([rowstore.Field("t", "M8[s]", nullable=True)])) as w:
        w.write_batch({"t": [np.datetime64("2020-01-01", "s"), None, np.datetime64("NaT")]})
    back = read_pandas(path)
    assert back["t"].dtype == np.dtype("M8[s]") and back["t"].isna().tolist() == [False, True, True]


@pytest.mark.parametrize(
    "index",
    [
        pd.RangeIndex(5, 15, 2, name="r"),
        pd.Index([f"clip{i}" for i in range(5)], name="clip id"),
        pd.Index([10, 3, 7, 1, 0], dtype="int32"),
        pd.MultiIndex.from_arrays(
            [["a", "a", "b", "b", "c"], [1, 2, 1, 2, 1]], names=["split", None]
        ),
        pd.DatetimeIndex(pd.date_range("2024-01-01", periods=5, freq="h").values, name="t"),
    ],
)
def test_index_restored(tmp_path, index):
    df = pd.DataFrame({"x": np.arange(5.0), "index": list("abcde")}, index=index)
    assert_frames_equal(df, roundtrip(df, tmp_path))


def test_index_false_and_odd_column_names(tmp_path):
    df = pd.DataFrame(
        {"speaker id": [1, 2], 0: ["a", "b"], "class": [0.5, 1.5], "a__b": [1, 1]}, index=[7, 8]
    )
    back = roundtrip(df, tmp_path, index=False)
    assert list(back.columns) == ["speaker id", 0, "class", "a__b"]
    assert_frames_equal(df.reset_index(drop=True), back)


def test_rows_and_fields_and_reader_slice(tmp_path):
    df = speech_frame(20)
    df.index = pd.Index([f"r{i}" for i in range(20)], name="id")
    path = str(tmp_path / "f.h5")
    from_pandas(df, path, rows_per_block=4)
    rows = [19, 0, 7, 7]
    assert_frames_equal(
        df.iloc[rows][["wave", "speaker"]], read_pandas(path, rows=rows, fields=["wave", "speaker"])
    )
    with rowstore.open(path) as r:
        assert_frames_equal(df.iloc[3:9], to_pandas(r, rows=slice(3, 9)))
    with pytest.raises(KeyError, match="nope"):
        read_pandas(path, fields=["nope"])


def test_empty_frame_and_empty_arrays(tmp_path):
    df = speech_frame(4).iloc[:0]
    back = roundtrip(df, tmp_path)
    assert len(back) == 0 and list(back.columns) == list(df.columns)
    df = pd.DataFrame({"w": [np.zeros(0, np.float32), np.zeros(0, np.float32)]})
    assert_frames_equal(df, roundtrip(df, tmp_path))


def test_empty_list_cells_take_the_dtype_of_the_others(tmp_path):
    """``[]`` fixes no dtype (numpy would call it float64): the non-empty cells decide it; a
    column of empty lists only is float64."""
    df = pd.DataFrame({"x": [[], [1, 2], [3]], "y": [[], [], []]})
    schema = infer_schema(df)
    assert schema["x"].dtype == np.dtype("<i8") and schema["x"].shape == (None,)
    assert schema["y"].dtype == np.dtype("<f8")
    from_pandas(df, str(tmp_path / "e.h5"))
    back = read_pandas(str(tmp_path / "e.h5"))
    assert [c.tolist() for c in back["x"]] == [[], [1, 2], [3]]
    assert back["x"][0].dtype == np.int64 and back["x"][1].dtype == np.int64
    with pytest.raises(
        SchemaError, match=r"column 'x', row 2: a float64 array, but row 1 holds int64"
    ):
        infer_schema(pd.DataFrame({"x": [[], [1, 2], [0.5]]}))


def test_dataset_round_trip(tmp_path):
    df = speech_frame(40)
    path = str(tmp_path / "ds")
    from_pandas(df, path, dataset=True, shard_bytes=500, rows_per_block=4)
    with rowstore.open(path) as r:
        assert r.layout.num_shards > 1
    assert_frames_equal(df, read_pandas(path))


def test_conflicts_named_by_column_and_row(tmp_path):
    bad = pd.DataFrame(
        {"w": [np.zeros(3, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float64)]}
    )
    with pytest.raises(
        SchemaError, match=r"column 'w', row 2: a float64 array, but row 0 holds float32"
    ) as e:
        from_pandas(bad, str(tmp_path / "a.h5"))
    assert e.value.row == 2 and e.value.field == "w"
    rank = pd.DataFrame({"w": [np.zeros(3), np.zeros((1, 3))]})
    with pytest.raises(SchemaError, match="row 1: an array of 2 dimensions"):
        infer_schema(rank)
    mixed = pd.DataFrame({"t": ["a", b"b"]})
    with pytest.raises(SchemaError, match="row 1: a bytes cell in a column of str"):
        infer_schema(mixed)
    with pytest.raises(SchemaError, match="row 0: cannot store a dict"):
        infer_schema(pd.DataFrame({"d": [{}]}))
    with pytest.raises(SchemaError, match="not supported"):
        infer_schema(pd.DataFrame({"p": pd.period_range("2020", periods=2, freq="Y")}))


@pytest.mark.parametrize("given", [False, True])
def test_ragged_nested_lists_are_named_by_column_and_row(tmp_path, given):
    """Nested lists of different lengths make no n-D array: the cell is named, not numpy's
    ValueError let through (with an inferred schema or a given one)."""
    df = pd.DataFrame({"w": [[[1, 2], [3, 4]], [[1, 2], [3]], [[5, 6], [7, 8]]]})
    schema = rowstore.Schema([rowstore.Field("w", "int64", (None, 2))]) if given else None
    with pytest.raises(RowValidationError, match=r"column 'w', row 1: a list cell") as e:
        from_pandas(df, str(tmp_path / "a.h5"), schema=schema)
    assert (e.value.field, e.value.row) == ("w", 1)
    assert not (tmp_path / "a.h5").exists()
    with pytest.raises(RowValidationError, match="row 1"):
        infer_schema(df)


def test_given_schema_checks_cells(tmp_path):
    df = pd.DataFrame({"w": [np.zeros(3, np.float64), np.zeros(4, np.float64)]})
    schema = rowstore.Schema([rowstore.Field("w", "float32", (None,))])
    from_pandas(df, str(tmp_path / "a.h5"), schema=schema)
    assert read_pandas(str(tmp_path / "a.h5"))["w"][1].dtype == np.float32
    fixed = rowstore.Schema([rowstore.Field("w", "float64", (3,))])
    with pytest.raises(RowValidationError, match="row 1: field 'w'"):
        from_pandas(df, str(tmp_path / "b.h5"), schema=fixed)
    assert not (tmp_path / "b.h5").exists()


def test_plain_rowstore_file_reads_as_frame(tmp_path):
    from rowstore import Field, Schema

    s = Schema(
        [
            Field("a", "int32", nullable=True),
            Field("t", "str", nullable=True),
            Field("v", "int16", (None,)),
            Field("x", "float64"),
        ]
    )
    path = str(tmp_path / "p.h5")
    with rowstore.Writer(path, s) as w:
        w.write_batch(
            {
                "a": [1, None],
                "t": ["x", None],
                "v": [np.arange(2, dtype=np.int16), np.arange(0, dtype=np.int16)],
                "x": [0.5, 1.5],
            }
        )
    df = read_pandas(path)
    assert str(df["a"].dtype) == "Int32" and df["a"].isna().tolist() == [False, True]
    assert (
        df["t"].tolist() == ["x", None]
        and df["v"][0].tolist() == [0, 1]
        and df["x"].dtype == np.float64
    )


def test_import_rowstore_imports_no_pandas_or_dask(rs):
    proc = rs.run_python(
        """
import sys
import rowstore, rowstore.reader, rowstore.format
loaded = [m for m in ("pandas", "dask", "distributed", "pyarrow") if m in sys.modules]
print("loaded", loaded)
""".replace("assert callable(rowstore.from_pandas.__call__) is True or True\\n", "")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("loaded []")


def test_top_level_names_are_lazy():
    assert rowstore.from_pandas is from_pandas and rowstore.read_pandas is read_pandas
    with pytest.raises(AttributeError):
        rowstore.no_such_name  # noqa: B018


# -- the fixes found on the way (plain Writer and Schema, used with DataFrames) ----------------
def test_writer_write_batch_takes_a_dataframe(tmp_path):
    df = pd.DataFrame(
        {
            "wave": [np.ones(k, np.float32) for k in (3, 0, 5)],
            "speaker": pd.Series(["a", None, "c"], dtype="str"),
            "note": pd.Series([pd.NA, "x", np.nan], dtype=object),
            "y": [1, 2, 3],
        }
    )
    schema = rowstore.Schema(
        [
            rowstore.Field("wave", "float32", (None,)),
            rowstore.Field("speaker", "str", nullable=True),
            rowstore.Field("note", "str", nullable=True),
            rowstore.Field("y", "int64"),
        ]
    )
    path = str(tmp_path / "w.h5")
    with rowstore.Writer(path, schema) as w:
        w.write_batch(df)
    with rowstore.open(path) as r:
        assert (
            r[1]["speaker"] is None
            and r[0]["note"] is None
            and r[2]["note"] is None
            and r[1]["note"] == "x"
        )
        assert r[2]["wave"].shape == (5,)
    with rowstore.DatasetWriter(str(tmp_path / "ds"), schema) as w:
        w.write_batch(df)
    info = rowstore.write_shard(str(tmp_path / "ds2"), schema, df)
    assert info.rows == 3


def test_write_batch_says_what_to_pass(tmp_path):
    schema = rowstore.Schema([rowstore.Field("y", "int64")])
    with rowstore.Writer(str(tmp_path / "w.h5"), schema) as w:
        with pytest.raises(RowValidationError, match="a mapping .* or a DataFrame, got list"):
            w.write_batch([{"y": 1}])


def test_nan_in_a_non_nullable_str_field_is_named(tmp_path):
    schema = rowstore.Schema([rowstore.Field("t", "str")])
    with rowstore.Writer(str(tmp_path / "w.h5"), schema) as w:
        with pytest.raises(
            RowValidationError, match="row 1: field 't' is not nullable; got float nan"
        ):
            w.write_batch(pd.DataFrame({"t": ["a", None]}))


def test_schema_infer_rows_finds_variable_dims_and_nulls():
    rows = [
        {"wave": np.zeros(5, np.float32), "t": "a", "g": np.zeros((2, 3))},
        {"wave": np.zeros(9, np.float32), "t": None, "g": np.zeros((2, 3))},
        {"wave": np.zeros(0, np.float32), "g": np.zeros((2, 3))},
    ]
    s = rowstore.Schema.infer_rows(rows)
    assert s["wave"].shape == (None,) and not s["wave"].nullable
    assert s["t"].nullable and s["t"].dtype == "str" and s["g"].shape == (2, 3)
    with pytest.raises(SchemaError, match="field 'wave', row 1: float64"):
        rowstore.Schema.infer_rows([{"wave": np.zeros(2, np.float32)}, {"wave": np.zeros(2)}])
    assert rowstore.Schema.infer(rows[0])["wave"].shape == (5,)  # one row: fixed, as documented


def test_speech_waveforms_stored_as_flac(tmp_path):
    """codec= per column: the speech table's waveforms (16-bit audio as float32) stored as
    FLAC, encoded by the writer, read back exactly; far fewer bytes than float32."""
    rng = np.random.default_rng(5)
    df = speech_frame(8)
    t = [np.arange(int(k)) / 16000 for k in rng.integers(800, 4000, 8)]
    pcm = [np.round(0.4 * np.sin(2 * np.pi * 300 * x) * 32767).astype(np.int16) for x in t]
    df["wave"] = [p.astype(np.float32) / 32768 for p in pcm]
    path = str(tmp_path / "flac.h5")
    schema = from_pandas(df, path, codec={"wave": {"id": "flac", "sample_rate": 16000}})
    assert schema["wave"].codec["id"] == "flac" and schema["wave"].shape == (None,)
    assert_frames_equal(df, read_pandas(path))
    from helpers import stored_payloads

    flac = stored_payloads(path, "wave")
    assert all(b.startswith(b"fLaC") for b in flac)
    assert sum(map(len, flac)) < 0.6 * sum(w.nbytes for w in df["wave"])
    with pytest.raises(SchemaError, match=r"codec: no column\(s\) \['waveform'\]"):
        from_pandas(df, str(tmp_path / "x.h5"), codec={"waveform": "flac"})
    with pytest.raises(ValueError, match="not both"):
        from_pandas(df, str(tmp_path / "x.h5"), schema=schema, codec={"wave": "flac"})
