"""Bad rows are refused with an error naming the field, the row and the expectation, leaving the
writer usable and earlier rows intact; bad files (not HDF5, not rowstore, newer version,
truncated, tampered with) raise FormatError/OSError, never crash."""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest

import rowstore
from rowstore import (
    ChecksumError,
    Field,
    FormatError,
    FormatVersionError,
    Layout,
    RowValidationError,
    Schema,
    SchemaError,
)

h5py = pytest.importorskip("h5py")

SCHEMA = Schema(
    [
        Field("i", "int64"),
        Field("i8", "int8"),
        Field("u8", "uint8", (2,)),
        Field("x", "float32", (3,)),
        Field("flag", "bool"),
        Field("t", "str"),
        Field("b", "bytes", nullable=True),
        Field("v", "int16", (None, 2)),
        Field("img", "uint8", (4, 4, 3), codec="png"),
        Field("vimg", "uint8", (None, None, 3), codec="png"),
        Field("gray", "uint16", (4, 4), codec="png"),
    ]
)


def good_row(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {
        "i": i,
        "i8": -i,
        "u8": [i, 255],
        "x": [i, i + 0.5, -i],
        "flag": i % 2 == 0,
        "t": f"t{i}é",
        "b": None if i % 3 == 0 else bytes([i]) * i,
        "v": np.full((i % 3, 2), i, np.int16),
        "img": rng.integers(0, 256, (4, 4, 3), dtype=np.uint8),
        "vimg": rng.integers(0, 256, (2, 3, 3), dtype=np.uint8),
        "gray": rng.integers(0, 65536, (4, 4), dtype=np.uint16),
    }


# (field, bad value, fragment the message must contain; None: the row lacks the field)
BAD_VALUES = [
    ("i", 1.5, "int64"),
    ("i", np.float64(2.0), "int64"),
    ("i", "3", "int64"),
    ("i", b"3", "int64"),
    ("i", [1], "shape"),
    ("i", 1 + 2j, "int64"),
    ("i", 2**64, "int64"),
    ("i8", 200, "range"),
    ("i8", -129, "range"),
    ("u8", [0, 256], "range"),
    ("u8", [-1, 0], "range"),
    ("u8", [1, 2, 3], "shape"),
    ("u8", [[1, 2]], "shape"),
    ("x", [1, 2], "shape"),
    ("x", [[1, 2, 3]], "shape"),
    ("x", "abc", "float32"),
    ("x", [1, "a", 3], "float32"),
    ("x", [1j, 2, 3], "float32"),
    ("x", [[1, 2], [3]], "float32"),  # ragged nested list
    ("x", {"a": 1}, "float32"),
    ("flag", 1, "bool"),
    ("flag", "yes", "bool"),
    ("t", b"bytes", "str"),
    ("t", 5, "str"),
    ("t", ["a"], "str"),
    ("t", "lone \ud800 surrogate", "UTF-8"),
    ("b", "text", "bytes"),
    ("b", 5, "bytes"),
    ("v", [[1, 2], [3]], "int16"),  # ragged
    ("v", np.zeros((2, 3), np.int16), "shape"),
    ("v", np.zeros(4, np.int16), "shape"),
    ("v", np.zeros((2, 2), np.float32), "int16"),
    ("img", np.zeros((4, 4, 4), np.uint8), "shape"),
    ("img", np.zeros((4, 4), np.uint8), "shape"),
    ("img", np.zeros((4, 5, 3), np.uint8), "shape"),
    ("img", np.full((4, 4, 3), 300, np.uint16), "range"),
    ("img", np.zeros((4, 4, 3), np.float32), "uint8"),
    ("vimg", np.zeros((2, 3, 4), np.uint8), "shape"),
    ("vimg", np.zeros((2, 3), np.uint8), "shape"),
    ("vimg", np.zeros((0, 3, 3), np.uint8), "empty"),
    ("gray", np.zeros((4, 4, 3), np.uint16), "shape"),
    ("i", None, "not nullable"),
    ("t", None, "not nullable"),
    ("img", None, "not nullable"),
    ("v", None, "not nullable"),
    ("i", "MISSING", "missing"),
    ("img", "MISSING", "missing"),
    ("zzz", 1, "unknown field"),
]
IDS = [f"{f}-{i}" for i, (f, _, _) in enumerate(BAD_VALUES)]


def bad_row(i: int, field: str, value) -> dict:
    row = good_row(i)
    if isinstance(value, str) and value == "MISSING":
        del row[field]
    else:
        row[field] = value
    return row


def check_error(ei, field: str, row: int, fragment: str) -> None:
    err = ei.value
    assert isinstance(err, RowValidationError)
    assert (
        isinstance(err, SchemaError) and isinstance(err, ValueError) and isinstance(err, TypeError)
    )
    assert err.field == field and err.row == row, (err.field, err.row, str(err))
    msg = str(err)
    assert f"row {row}" in msg and repr(field) in msg, msg
    assert fragment.lower() in msg.lower(), msg


@pytest.mark.parametrize(("field", "value", "fragment"), BAD_VALUES, ids=IDS)
def test_bad_row_in_write(rs, h5path, field, value, fragment):
    good = [good_row(i) for i in range(5)]
    with rowstore.Writer(h5path, SCHEMA, rows_per_block=2, heap_chunk_bytes=64) as w:
        for r in good:
            w.write(r)
        with pytest.raises(RowValidationError) as ei:
            w.write(bad_row(5, field, value))
        check_error(ei, field, 5, fragment)
        assert w.num_rows == 5
        more = [good_row(i) for i in range(5, 8)]
        for r in more:  # the writer goes on
            w.write(r)
    rs.assert_rows_equal(SCHEMA, good + more, rs.read_rows(h5path))
    Layout.open(h5path, scan=True)


@pytest.mark.parametrize(("field", "value", "fragment"), BAD_VALUES, ids=IDS)
def test_bad_row_in_write_batch_is_all_or_nothing(rs, h5path, field, value, fragment):
    good = [good_row(i) for i in range(3)]
    with rowstore.Writer(h5path, SCHEMA, rows_per_block=2, heap_chunk_bytes=64) as w:
        w.write_batch(rs.rows_to_columns(SCHEMA, good))
        batch = [good_row(3), good_row(4), bad_row(5, field, value), good_row(6)]
        names = set().union(*batch)
        cols = {}
        for name in names:
            if name not in SCHEMA:
                cols[name] = [r.get(name) for r in batch]  # an unknown column
            elif all(name in r for r in batch):
                cols[name] = [r[name] for r in batch]  # else: a missing column
        with pytest.raises(RowValidationError) as ei:
            w.write_batch(cols)
        # a missing or unknown column is wrong from the batch's first row on
        whole_column = fragment in ("missing", "unknown field")
        check_error(ei, field, 3 if whole_column else 5, fragment)
        assert w.num_rows == 3
        more = [good_row(i) for i in range(3, 9)]
        w.write_batch(rs.rows_to_columns(SCHEMA, more))
    rs.assert_rows_equal(SCHEMA, good + more, rs.read_rows(h5path))


def test_batch_level_errors(rs, h5path):
    schema = Schema(
        [Field("i8", "int8"), Field("x", "float32", (2,)), Field("t", "str", nullable=True)]
    )
    with rowstore.Writer(h5path, schema, rows_per_block=3) as w:
        w.write_batch({"i8": np.arange(4, dtype=np.int64), "x": np.zeros((4, 2)), "t": ["a"] * 4})
        cases = [
            ({"i8": np.array([1, 2, 300, 4]), "x": np.zeros((4, 2))}, "i8", 6, "range"),
            ({"i8": np.zeros(4, np.float32), "x": np.zeros((4, 2))}, "i8", 4, "int8"),
            ({"i8": np.zeros(4, np.int8), "x": np.zeros((4, 3))}, "x", 4, "shape"),
            ({"i8": np.zeros(4, np.int8), "x": np.zeros((4, 2), np.complex64)}, "x", 4, "float32"),
            ({"i8": np.zeros(4, np.int8)}, "x", 4, "missing"),
            (
                {"i8": np.zeros(4, np.int8), "x": np.zeros((4, 2)), "nope": [1] * 4},
                "nope",
                4,
                "unknown",
            ),
            (
                {"i8": np.zeros(4, np.int8), "x": np.zeros((4, 2)), "t": ["a", 3, "b", "c"]},
                "t",
                5,
                "str",
            ),
        ]
        for cols, field, row, fragment in cases:
            with pytest.raises(RowValidationError) as ei:
                w.write_batch(cols)
            check_error(ei, field, row, fragment)
        with pytest.raises(RowValidationError, match="different lengths"):
            w.write_batch({"i8": [1, 2], "x": np.zeros((3, 2))})
        with pytest.raises(RowValidationError):
            w.write_batch([1, 2, 3])
        with pytest.raises(RowValidationError) as ei:
            w.write([("i8", 1)])
        assert ei.value.row == 4 and ei.value.field is None
        assert w.num_rows == 4
        w.write_batch({"i8": [5], "x": [[1, 2]]})  # t missing: nullable, null
    got = rs.read_rows(h5path)
    assert [r["i8"] for r in got] == [0, 1, 2, 3, 5] and got[4]["t"] is None


def test_accepted_conversions(rs, h5path):
    """What the casting policy accepts: safe casts, float narrowing, ints that fit."""
    schema = Schema(
        [
            Field("f", "float32", (2,)),
            Field("i8", "int8"),
            Field("u64", "uint64"),
            Field("c", "complex64"),
            Field("c2", "complex64"),
            Field("i", "int64"),
            Field("img", "uint8", (2, 2), codec="png"),
        ]
    )
    rows = [
        {
            "f": np.array([1.0, 2.0], np.float64),
            "i8": np.int64(-128),
            "u64": 2**64 - 1,
            "c": 1.5,
            "c2": 3,
            "i": True,
            "img": np.full((2, 2), 255, np.int64),
        },
        {
            "f": [1, 2],
            "i8": 127,
            "u64": np.uint8(3),
            "c": np.complex128(1 + 1j),
            "c2": np.int64(-2),
            "i": np.uint32(7),
            "img": [[0, 1], [2, 3]],
        },
    ]
    rs.write_file(h5path, schema, rows)
    got = rs.read_rows(h5path)
    assert got[0]["i8"] == -128 and got[0]["u64"] == 2**64 - 1 and got[0]["i"] == 1
    assert got[1]["img"].tolist() == [[0, 1], [2, 3]] and got[0]["img"].dtype == np.uint8


# -- bad files -------------------------------------------------------------------------------
def opening_raises(path, exc_types):
    for fn in (
        lambda: Layout.open(path),
        lambda: rowstore.open(path),
        lambda: Layout.open(path, scan=True),
    ):
        with pytest.raises(exc_types) as ei:
            fn()
        assert not isinstance(ei.value, (AssertionError, KeyError, IndexError))
    return ei.value


@pytest.fixture
def good_file(rs, tmp_path):
    path = str(tmp_path / "good.h5")
    rs.write_file(
        path, SCHEMA, [good_row(i) for i in range(20)], rows_per_block=4, heap_chunk_bytes=64
    )
    return path


def test_not_hdf5(tmp_path):
    for name, content in [
        ("text.h5", b"hello, I am not HDF5\n" * 50),
        ("empty.h5", b""),
        ("zeros.h5", bytes(4096)),
    ]:
        p = tmp_path / name
        p.write_bytes(content)
        err = opening_raises(str(p), FormatError)
        assert err.path == str(p)
    with pytest.raises(FileNotFoundError):
        rowstore.open(str(tmp_path / "missing.h5"))
    with pytest.raises(FormatError):
        rowstore.open(str(tmp_path))


def test_hdf5_but_not_rowstore(tmp_path):
    p = str(tmp_path / "other.h5")
    with h5py.File(p, "w") as f:
        f["data"] = np.arange(10)
    assert "not a rowstore file" in str(opening_raises(p, FormatError))
    with h5py.File(p, "a") as f:
        f.create_group("rowstore").attrs["format"] = "something-else"
    opening_raises(p, FormatError)


@pytest.mark.parametrize("version", [4, 99, 0])
def test_other_format_version(good_file, tmp_path, version):
    p = str(tmp_path / "v.h5")
    shutil.copy(good_file, p)
    with h5py.File(p, "a") as f:
        f["rowstore"].attrs["format_version"] = version
    err = opening_raises(p, FormatVersionError)
    assert isinstance(err, FormatError)
    assert f"v{version}" in str(err) and "v1" in str(err)
    if version > 1:
        assert "upgrade" in str(err)


@pytest.mark.parametrize("value", ["1", 1.0, None])
def test_format_version_not_an_int(good_file, tmp_path, value):
    p = str(tmp_path / "v.h5")
    shutil.copy(good_file, p)
    with h5py.File(p, "a") as f:
        if value is None:
            del f["rowstore"].attrs["format_version"]
        else:
            f["rowstore"].attrs["format_version"] = value
    assert "format_version" in str(opening_raises(p, FormatError))


def edit_attr(src, dst, name, value):
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        f["rowstore"].attrs[name] = value


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("num_rows", 21),
        ("num_rows", 19),
        ("num_rows", -1),
        ("rows_per_block", 5),
        ("rows_per_block", 0),
        ("heap_nbytes", 10**9),
        ("heap_chunk_bytes", 32),
        ("schema", "{not json"),
        ("schema", '{"fields": []}'),
        ("schema", json.dumps({"fields": [{"name": "i", "dtype": "int64"}]})),
        ("compression", '{"id": "lzma"}'),
        ("checksum", "md5"),
        ("compression", "[not json"),
    ],
)
def test_tampered_attributes(good_file, tmp_path, name, value):
    p = str(tmp_path / "t.h5")
    edit_attr(good_file, p, name, value)
    opening_raises(p, FormatError)


def edit_index(src, dst, dataset, column, index, value):
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        arr = f["rowstore"][dataset][()]
        arr[column][index] = value
        del f["rowstore"][dataset]
        f["rowstore"].create_dataset(dataset, data=arr)


@pytest.mark.parametrize(
    ("dataset", "column", "index", "value"),
    [
        ("blocks", "offset", 1, 2**40),
        ("blocks", "offset", 0, 2**64 - 8),
        ("blocks", "stored_nbytes", 2, 0),
        ("blocks", "stored_nbytes", 2, 2**63),
        ("blocks", "first_row", 1, 3),
        ("blocks", "num_rows", 4, 5),
        ("blocks", "heap_start", 1, 0),
        ("blocks", "heap_end", 4, 10**6),
        ("heap_chunks", "offset", 0, 2**50),
        ("heap_chunks", "stored_nbytes", 1, 63),
    ],
)
def test_tampered_index(good_file, tmp_path, dataset, column, index, value):
    p = str(tmp_path / "t.h5")
    edit_index(good_file, p, dataset, column, index, value)
    opening_raises(p, FormatError)


# Reads of damaged files run in a subprocess: a crash there must not take pytest down, and its
# return code must not be a signal.
DAMAGED_READ = """
import sys
import numpy as np
import rowstore
from rowstore import FormatError, Layout

for path in sys.argv[1:]:
    results = []
    for what in ("layout", "open", "verify", "read"):
        try:
            if what == "layout":
                Layout.open(path)
            elif what == "open":
                rowstore.open(path)
            elif what == "verify":
                Layout.open(path, scan=True)
            else:
                for verify in (True, False):
                    r = rowstore.open(path, verify=verify)
                    r.take(np.arange(len(r)))
                    [r[i] for i in range(len(r))]
                    for shuffle in ("none", "full"):
                        for b in r.batches(3, shuffle=shuffle, num_threads=2):
                            pass
            results.append(f"{what}:ok")
        except (FormatError, OSError) as exc:
            results.append(f"{what}:{type(exc).__name__}")
        except Exception as exc:
            results.append(f"{what}:UNEXPECTED-{type(exc).__name__}:{str(exc).replace(' ', '_')}")
    print(" ".join(results), flush=True)
"""


def run_damaged(rs, paths):
    """Read each damaged file in one subprocess; per path, {stage: "ok" or exception name}."""
    proc = rs.run_python(DAMAGED_READ, *paths)
    assert proc.returncode >= 0, (
        f"killed by signal {signal.Signals(-proc.returncode).name}: {proc.stderr[-2000:]}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()[-len(paths) :]
    assert len(lines) == len(paths), proc.stdout
    out = []
    for line in lines:
        assert "UNEXPECTED" not in line, line
        out.append(dict(item.split(":", 1) for item in line.split()))
    return out


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_truncated_files(rs, tmp_path, compression):
    src = str(tmp_path / "src.h5")
    rs.write_file(
        src,
        SCHEMA,
        [good_row(i) for i in range(40)],
        rows_per_block=4,
        heap_chunk_bytes=64,
        compression=compression,
    )
    size = os.path.getsize(src)
    cuts = sorted({0, 8, 100, 512, 2048, size // 4, size // 2, 3 * size // 4, size - 100, size - 1})
    data = open(src, "rb").read()
    paths = []
    for k, cut in enumerate(cuts):
        paths.append(str(tmp_path / f"cut{k}.h5"))
        with open(paths[-1], "wb") as f:
            f.write(data[:cut])
    for cut, res in zip(cuts, run_damaged(rs, paths), strict=True):
        # every stage fails cleanly: a truncated file is never read as if it were whole
        assert res["layout"] != "ok" and res["open"] != "ok" and res["verify"] != "ok", (cut, res)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_flipped_bytes_in_data(rs, tmp_path, compression):
    src = str(tmp_path / "src.h5")
    rs.write_file(
        src,
        SCHEMA,
        [good_row(i) for i in range(20)],
        rows_per_block=4,
        heap_chunk_bytes=64,
        compression=compression,
    )
    lay = Layout.open(src)
    data = bytearray(open(src, "rb").read())
    targets = [
        ("block", int(lay.blocks["offset"][k]) + int(lay.blocks["stored_nbytes"][k]) // 2)
        for k in (0, 2, 4)
    ]
    targets += [
        ("heap", int(lay.heap_chunks["offset"][k]) + 5) for k in (0, len(lay.heap_chunks) - 1)
    ]
    paths = []
    for k, (_what, pos) in enumerate(targets):
        bad = bytearray(data)
        bad[pos] ^= 0xFF
        p = str(tmp_path / f"flip{k}.h5")
        paths.append(p)
        with open(p, "wb") as f:
            f.write(bad)
        assert Layout.open(p).num_rows == 20  # the index is intact
        with pytest.raises(ChecksumError) as ei:
            Layout.open(p, scan=True)
        assert "checksum" in str(ei.value).lower()
        with pytest.raises(ChecksumError):
            rowstore.open(p).take(np.arange(20))
    for res in run_damaged(rs, paths):  # reads with verify=False must not crash either
        assert res["verify"].endswith("ChecksumError") and res["read"] != "ok", res


def test_hostile_payload_references(rs, tmp_path):
    """Row references pointing outside the heap (checksums recomputed so that only the bounds
    checks can catch them) raise FormatError."""
    from rowstore import kernels

    src = str(tmp_path / "src.h5")
    schema = Schema([Field("t", "str"), Field("v", "float32", (None,))])
    rs.write_file(
        src,
        schema,
        [{"t": "abc" * i, "v": np.ones(i, np.float32)} for i in range(12)],
        rows_per_block=4,
    )
    lay = Layout.open(src)
    paths, cases = [], []
    for k, (col, part, value) in enumerate(
        [
            ("t", "offset", 10**6),
            ("t", "nbytes", 10**6),
            ("v", "nbytes", 2**63),
            ("v", "shape", 10**6),
            ("t", "offset", 0),
            ("v", "offset", 2**64 - 1),
        ]
    ):
        p = str(tmp_path / f"h{k}.h5")
        shutil.copy(src, p)
        rows = np.fromfile(p, dtype=lay.row_dtype, count=4, offset=int(lay.blocks["offset"][2]))
        rows[col][part][3] = value  # row 11
        raw = rows.tobytes()
        with open(p, "r+b") as f:
            f.seek(int(lay.blocks["offset"][2]))
            f.write(raw)
        # fix the block checksum so that the data looks authentic
        with h5py.File(p, "a") as f:
            blocks = f["rowstore/blocks"][()]
            blocks["checksum"][2] = (
                kernels.crc32(raw) if hasattr(kernels, "crc32") else kernels.xxh64(raw)
            )
            del f["rowstore/blocks"]
            f["rowstore"].create_dataset("blocks", data=blocks)
        paths.append(p)
        cases.append((col, part, value))
    for case, res in zip(cases, run_damaged(rs, paths), strict=True):
        assert res["read"] != "ok", (case, res)


def test_float_narrowing_that_would_overflow_is_refused(tmp_path):
    import rowstore as rs_

    schema = rs_.Schema([rs_.Field("f", "float32", (2,)), rs_.Field("c", "complex64")])
    path = str(tmp_path / "f.h5")
    with rs_.Writer(path, schema) as w:
        w.write({"f": np.array([1.0, np.inf]), "c": 1 + 2j})  # inf stays inf: accepted
        with pytest.raises(
            rs_.RowValidationError, match="row 1: field 'f'.*outside the range of float32"
        ):
            w.write({"f": np.array([1e300, 0.0]), "c": 0})
        with pytest.raises(rs_.RowValidationError, match="field 'c'"):
            w.write({"f": [0.0, 0.0], "c": complex(1e300, 0)})
        with pytest.raises(rs_.RowValidationError, match="row 2: field 'f'"):
            w.write_batch({"f": np.array([[0.0, 0.0], [1e40, 0.0]]), "c": np.zeros(2)})
        w.write({"f": np.array([3.5, -1e30]), "c": 0})
    assert rs_.open(path).take([0, 1])["f"][1].tolist() == [3.5, np.float32(-1e30)]


def test_nullable_must_be_a_bool():
    import rowstore as rs_

    with pytest.raises(rs_.SchemaError, match="nullable must be a bool"):
        rs_.Field("x", "int8", nullable="yes")


def test_a_field_numpy_cannot_lay_out_in_a_row_is_a_schema_error(tmp_path):
    """2**28 float64 values (2 GiB) in a row: numpy sizes a dtype in a C int, and its
    ValueError came out of Writer and from_parquet (a fixed-size list of that many values)."""
    schema = Schema([Field("id", "int64"), Field("x", "float64", (1 << 28,))])
    with pytest.raises(SchemaError, match="'x'.*2147483648 bytes") as ei:
        rowstore.Writer(str(tmp_path / "big.h5"), schema)
    assert ei.value.field == "x"
    with pytest.raises(SchemaError, match="'x'"):
        rowstore.write_shard(str(tmp_path / "ds"), schema, [])
    assert not os.path.exists(tmp_path / "big.h5")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from rowstore.arrow import from_parquet

    t = pa.table(
        {"id": pa.array([], pa.int64()), "v": pa.array([], pa.list_(pa.float64(), 1 << 28))}
    )
    pq.write_table(t, tmp_path / "big.parquet")
    with pytest.raises(SchemaError, match="'v'"):
        from_parquet(str(tmp_path / "big.parquet"), str(tmp_path / "fromparquet.h5"))


@pytest.mark.parametrize("nullable", [False, True])
def test_a_row_numpy_cannot_size_is_a_schema_error_naming_the_field(tmp_path, nullable):
    """A value of 2**31-1 bytes, with its null flag, makes a row numpy sizes as a negative
    number: refused before anything is written, naming the field."""
    schema = rowstore.Schema(
        [
            rowstore.Field("id", "int64"),
            rowstore.Field("big", "int8", (2**31 - 1,), nullable=nullable),
        ]
    )
    with pytest.raises(rowstore.SchemaError, match=r"field 'big'") as e:
        rowstore.Writer(tmp_path / "f.h5", schema)
    assert e.value.field == "big"
    assert not os.path.exists(tmp_path / "f.h5")
