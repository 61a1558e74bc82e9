"""rowstore.arrow: from_arrow / from_parquet round trips, streaming memory, the payloads option,
errors."""

from __future__ import annotations

import datetime as dt
import io
import os

import numpy as np
import pytest
from helpers import peak_allocations

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import rowstore  # noqa: E402
from rowstore import Field, RowValidationError, Schema, SchemaError  # noqa: E402
from rowstore.arrow import Decode, from_arrow, from_parquet, infer_schema  # noqa: E402

N = 23


def _table(n: int = N, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ragged = [rng.standard_normal(int(rng.integers(0, 5))).astype(np.float32) for _ in range(n)]
    grids = [
        rng.integers(-9, 9, (int(rng.integers(0, 3)), int(rng.integers(1, 4)))).astype(np.int16)
        for _ in range(n)
    ]
    return pa.table(
        {
            "i32": pa.array([None if k % 7 == 3 else k for k in range(n)], pa.int32()),
            "u8": pa.array(rng.integers(0, 255, n, dtype=np.uint8)),
            "f64": pa.array(rng.standard_normal(n)),
            "f16": pa.array(rng.standard_normal(n).astype(np.float16)),
            "flag": pa.array([None if k % 5 == 1 else bool(k % 2) for k in range(n)]),
            "text": pa.array([None if k % 4 == 0 else f"t{k} é😀" for k in range(n)]),
            "big": pa.array([f"l{k}" for k in range(n)], pa.large_string()),
            "blob": pa.array([bytes(range(k % 9)) for k in range(n)], pa.binary()),
            "fixb": pa.array([bytes([k, k]) for k in range(n)], pa.binary(2)),
            "ts": pa.array(
                [dt.datetime(2020, 1, 1) + dt.timedelta(seconds=37 * k) for k in range(n)],
                pa.timestamp("ms", tz="Europe/Paris"),
            ),
            "day": pa.array(
                [dt.date(2001, 1, 1) + dt.timedelta(days=k) for k in range(n)], pa.date32()
            ),
            "dur": pa.array(np.arange(n) * 1000, pa.duration("us")),
            "wave": pa.array([r.tolist() for r in ragged], pa.list_(pa.float32())),
            "wave_l": pa.array(
                [None if k == 2 else r.tolist() for k, r in enumerate(ragged)],
                pa.large_list(pa.float32()),
            ),
            "vec3": pa.array([[k, k + 1, k + 2] for k in range(n)], pa.list_(pa.int64(), 3)),
            "grid": pa.array([g.tolist() for g in grids], pa.list_(pa.list_(pa.int16()))),
            "pairs": pa.array(
                [g[:, :1].repeat(2, axis=1).tolist() for g in grids],
                pa.list_(pa.list_(pa.int16(), 2)),
            ),
            "speaker id": pa.array([k % 3 for k in range(n)], pa.int64()),
        }
    )


def _expected(col: pa.ChunkedArray, field: Field, k: int):
    v = col[k].as_py()
    if v is None:
        return None
    if field.dtype in (rowstore.STR, rowstore.BYTES):
        return v
    if field.shape:
        return np.asarray(v, dtype=field.dtype).reshape(
            [len(v)]
            + (
                [len(v[0])]
                if v and field.shape[1:]
                else [0]
                if field.shape[1:] == (None,)
                else list(field.shape[1:])
            )
        )
    if field.is_time:
        return np.asarray(col.slice(k, 1).to_numpy(zero_copy_only=False)[0])
    return np.asarray(v, dtype=field.dtype)


def _check(table: pa.Table, path: str, rs, schema: Schema | None = None) -> None:
    schema = schema or infer_schema(table)
    with rowstore.open(path) as r:
        assert r.schema == schema
        got = [r[k] for k in range(len(r))]
    assert len(got) == table.num_rows
    for f, name in zip(schema, table.column_names):
        col = table.column(name)
        for k in range(table.num_rows):
            rs.assert_value_equal(_expected(col, f, k), got[k][f.name], f, f"row {k}: ")


def test_types_map_to_fields():
    want = {
        "i32": ("int32", (), True),
        "u8": ("uint8", (), False),
        "f64": ("float64", (), False),
        "f16": ("float16", (), False),
        "flag": ("bool", (), True),
        "text": ("str", (), True),
        "big": ("str", (), False),
        "blob": ("bytes", (), False),
        "fixb": ("bytes", (), False),
        "ts": ("datetime64[ms]", (), False),
        "day": ("datetime64[D]", (), False),
        "dur": ("timedelta64[us]", (), False),
        "wave": ("float32", (None,), False),
        "wave_l": ("float32", (None,), True),
        "vec3": ("int64", (3,), False),
        "grid": ("int16", (None, None), False),
        "pairs": ("int16", (None, 2), False),
        "speaker_id": ("int64", (), False),
    }
    assert infer_schema(_table()) == Schema(
        [Field(k, d, s, nullable=n) for k, (d, s, n) in want.items()]
    )


@pytest.mark.parametrize("how", ["table", "sliced", "batches", "reader", "dataset"])
def test_from_arrow_round_trip(tmp_path, rs, how):
    t = _table(40)
    if how == "sliced":  # offsets into the buffers of every array
        t = t.slice(5, 30)
    if how == "batches":  # several chunks, a schema from the first
        src = t.to_batches(max_chunksize=7)
    elif how == "reader":
        src = pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=9))
    elif how == "dataset":
        import pyarrow.dataset as pads

        src = pads.dataset(t)
    else:
        src = t
    path = str(tmp_path / "t.h5")
    if how in (
        "reader",
        "batches",
        "dataset",
    ):  # a stream cannot be looked ahead: nullability from the Arrow flags
        schema = from_arrow(src, path, schema=infer_schema(t))
    else:
        schema = from_arrow(src, path, batch_rows=8)
    assert schema == infer_schema(t)
    _check(t, path, rs)
    with rowstore.open(path) as r:
        meta = r.layout.user_attrs["arrow"]
    assert meta["columns"]["speaker_id"] == "speaker id" and meta["timezones"] == {
        "ts": "Europe/Paris"
    }


def test_from_parquet_directory_keeps_order_and_nulls(tmp_path, rs):
    t = _table(60, seed=3)
    d = tmp_path / "pq"
    d.mkdir()
    for k, a in enumerate(
        range(0, 60, 20)
    ):  # three files, names sort in row order; small row groups
        pq.write_table(t.slice(a, 20), d / f"part-{k:05d}.parquet", row_group_size=6)
    (d / "_SUCCESS").write_bytes(b"")
    out = str(tmp_path / "ds")
    schema = from_parquet("file://" + str(d), out, dataset=True, batch_rows=5, shard_bytes=1 << 12)
    # Null counts of the row groups' statistics decide for top-level columns; list columns have
    # none (their leaves are counted), so their Arrow flag does.
    assert schema["u8"].nullable is False and schema["i32"].nullable is True
    want = Schema(
        [
            Field(f.name, f.dtype, f.shape, codec=f.codec, nullable=f.nullable or bool(f.shape))
            for f in infer_schema(t)
        ]
    )
    assert schema == want
    _check(t, out, rs, want)
    with rowstore.open(out) as r:
        assert r.layout.num_shards > 1
    cols = from_parquet(str(d), str(tmp_path / "two.h5"), columns=["text", "i32"])
    assert cols.names == ["text", "i32"]


def test_from_parquet_streams_in_bounded_memory(tmp_path, monkeypatch):
    """Memory held while converting is a few record batches, not the file: Arrow's allocator
    is sampled after every batch of a 12 MB file read in 256 KB batches."""
    import rowstore.arrow as ra

    rng = np.random.default_rng(0)
    n, size = 48, 256 << 10
    t = pa.table({"k": np.arange(n), "payload": [rng.bytes(size) for _ in range(n)]})
    f = tmp_path / "big.parquet"
    pq.write_table(t, f, row_group_size=1, compression="none")
    del t
    peak = [0]
    real = ra._parquet_batches

    def sampled(*a, **k):
        for b in real(*a, **k):
            yield b
            peak[0] = max(peak[0], pa.total_allocated_bytes())

    monkeypatch.setattr(ra, "_parquet_batches", sampled)
    base = pa.total_allocated_bytes()
    from_parquet(str(f), str(tmp_path / "big.h5"), batch_rows=1)
    assert 0 < peak[0] - base < n * size / 4, (peak[0] - base, n * size)
    with rowstore.open(str(tmp_path / "big.h5")) as r:
        assert len(r) == n and r[n - 1]["k"] == n - 1


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_payloads_of_binary_columns(tmp_path, rs):
    imagecodecs = pytest.importorskip("imagecodecs")
    rng = np.random.default_rng(1)
    arrays = [
        rng.standard_normal((2, int(rng.integers(1, 4)))).astype(np.float32) for _ in range(10)
    ]
    images = [rs.smooth_image(rng, (8, 6, 3)) for _ in range(10)]
    t = pa.table(
        {
            "arr": [_npy(a) for a in arrays],
            "img": [imagecodecs.png_encode(i) for i in images],
            "img2": [imagecodecs.png_encode(i) for i in images],
        }
    )
    target = Field("img2", "uint8", (None, None, 3), codec="png")
    schema = from_arrow(
        t, str(tmp_path / "d.h5"), payloads={"arr": "npy", "img": "png", "img2": target}
    )
    assert schema["arr"] == Field(
        "arr", "float32", (2, None)
    )  # the first batch's values: dim 1 varies
    assert schema["img"].shape == (8, 6, 3) and schema["img"].codec["id"] == "png"
    assert schema["img2"].shape == (None, None, 3)
    with rowstore.open(str(tmp_path / "d.h5")) as r:
        for k in range(10):
            row = r[k]
            np.testing.assert_array_equal(row["arr"], arrays[k])
            np.testing.assert_array_equal(row["img"], images[k])
            np.testing.assert_array_equal(row["img2"], images[k])
    # a given schema decodes binary columns of numeric fields by the field's codec
    again = from_arrow(
        t.select(["arr", "img"]),
        str(tmp_path / "e.h5"),
        schema=Schema(
            [Field("arr", "float32", (2, None)), Field("img", "uint8", (8, 6, 3), codec="png")]
        ),
    )
    assert again.names == ["arr", "img"]
    bad = pa.table({"arr": [_npy(arrays[0]), b"not npy"]})
    with pytest.raises(
        RowValidationError, match=r"column 'arr', row 1: the npy payload does not decode"
    ):
        from_arrow(bad, str(tmp_path / "f.h5"), payloads={"arr": "npy"})
    # a hostile header declaring a terabyte is refused before anything is allocated
    h = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        h, {"descr": "<f4", "fortran_order": False, "shape": (2, 10**12)}
    )
    huge = pa.table({"arr": [_npy(arrays[0]), h.getvalue() + b"x" * 64]})
    with pytest.raises(
        RowValidationError, match=r"row 1: the npy payload does not decode: the npy header declares"
    ):
        from_arrow(
            huge, str(tmp_path / "g.h5"), payloads={"arr": Field("arr", "float32", (2, None))}
        )
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(RowValidationError, match="pickles are never loaded"):
        from_arrow(
            pa.table({"arr": [pickled.getvalue()]}),
            str(tmp_path / "h.h5"),
            payloads={"arr": Field("arr", "float32", (None,))},
        )


def test_null_rows_of_fixed_size_lists(tmp_path):
    """A null row of a fixed-size list keeps its (null) slots in the child array: it is a null
    row, not a null inside a list; errors still name the batch's row."""
    p = str(tmp_path / "f.h5")
    fixed = pa.array([[1, 2], None, [3, 4], None], pa.list_(pa.int64(), 2))
    grids = pa.array(
        [[[1.0], [2.0]], None, [[3.0], [4.0]], [[5.0], [6.0]]],
        pa.list_(pa.list_(pa.float32(), 1), 2),
    )
    nested = pa.array([None, [[1, 2], [3, 4]], [[5, 6]], []], pa.list_(pa.list_(pa.int16(), 2)))
    schema = from_arrow(pa.table({"v": fixed, "g": grids, "n": nested}), p, batch_rows=3)
    assert schema["v"] == Field("v", "int64", (2,), nullable=True)
    assert schema["g"].shape == (2, 1) and schema["g"].nullable
    with rowstore.open(p) as r:
        got = r.take(np.arange(4), fields=["v", "g"])
        assert got["v__null"].tolist() == [False, True, False, True]
        np.testing.assert_array_equal(got["v"][[0, 2]], [[1, 2], [3, 4]])
        np.testing.assert_array_equal(got["g"][3], [[5.0], [6.0]])
        assert r[0]["n"] is None and r[2]["n"].tolist() == [[5, 6]]
    ragged = pa.array([None, [[1], [2]], None, [[1], [2, 3]]], pa.list_(pa.list_(pa.int8()), 2))
    with pytest.raises(RowValidationError, match=r"column 'r', row 3: sub-lists of lengths"):
        from_arrow(pa.table({"r": ragged}), p, mode="w")
    inner = pa.array([None, [1, None]], pa.list_(pa.int8(), 2))
    with pytest.raises(RowValidationError, match=r"column 'i' \(rows 1\.\.1\): a null inside"):
        from_arrow(pa.table({"i": inner}), p, mode="w")


def test_bad_input_names_column_and_row(tmp_path):
    p = str(tmp_path / "x.h5")
    with pytest.raises(RowValidationError, match=r"column 'l'.*a null inside a list"):
        from_arrow(pa.table({"l": pa.array([[1.0], [2.0, None]])}), p)
    with pytest.raises(
        RowValidationError, match=r"column 'g', row 1: sub-lists of lengths \[1, 2\]"
    ):
        from_arrow(pa.table({"g": pa.array([[[1], [2]], [[1], [2, 3]]])}), p)
    with pytest.raises(SchemaError, match=r"column 's': Arrow type struct"):
        from_arrow(pa.table({"s": pa.array([{"a": 1}])}), p)
    with pytest.raises(SchemaError, match=r"column 'ls'.*only lists of numbers"):
        from_arrow(pa.table({"ls": pa.array([["a"]])}), p)
    with pytest.raises(SchemaError, match=r"payloads\['x'\]: the column is int64, not binary"):
        from_arrow(pa.table({"x": [1]}), p, payloads={"x": "npy"})
    with pytest.raises(SchemaError, match=r"payloads names column\(s\) \['nope'\]"):
        from_arrow(pa.table({"x": [1]}), p, payloads={"nope": "npy"})
    with pytest.raises(ValueError, match=r"payloads\['x'\] must be one of"):
        from_arrow(pa.table({"x": [b"1"]}), p, payloads={"x": "gif"})
    with pytest.raises(SchemaError, match="differ from the data's columns"):
        from_arrow(pa.table({"x": [1]}), p, schema=Schema([Field("y", "int64")]))
    with pytest.raises(TypeError, match="from_arrow takes a pyarrow Table"):
        from_arrow({"x": [1]}, p)
    with pytest.raises(ValueError, match="only local paths and file:// URLs"):
        from_parquet("s3://bucket/x", p)


def test_decode_is_the_readers_word(tmp_path):
    """Binary columns become typed fields by ``payloads=``; ``decode=`` (the reader's image ops)
    is refused by name, before anything is read or written."""
    p = str(tmp_path / "x.h5")
    msg = r"decode= is the reader's image ops; for binary columns write payloads="
    t = pa.table({"x": [_npy(np.arange(3.0))]})
    with pytest.raises(TypeError, match=msg):
        from_arrow(t, p, decode={"x": "npy"})
    pq.write_table(t, tmp_path / "t.parquet")
    with pytest.raises(TypeError, match=msg):
        from_parquet(str(tmp_path / "t.parquet"), p, decode={"x": "npy"})
    with pytest.raises(TypeError, match="decode"):
        infer_schema(t, decode={"x": "npy"})
    assert not os.path.exists(p)
    assert infer_schema(t, payloads={"x": "npy"})["x"] == Field("x", "float64", (3,))


def test_write_shards_rolls_over_and_cleans_up(tmp_path):
    """The executor side of rowstore.spark.to_rowstore: a batch stream as shards of ~shard_bytes, in
    order, nothing committed; an error mid-stream removes the shards already written."""
    from rowstore.arrow import _columns, _source, write_shards

    t = pa.table(
        {
            "k": np.arange(100),
            "v": [np.arange(k % 7, dtype=np.float64).tolist() for k in range(100)],
        }
    )
    src = _source(t, 10)
    cols = _columns(src, None, None)
    path = str(tmp_path / "ds")
    infos = write_shards(path, cols, src.batches, shard_bytes=500, name_prefix="part-x")
    assert len(infos) > 3 and [i.path for i in infos] == sorted(i.path for i in infos)
    assert not os.path.exists(os.path.join(path, "rowstore.json"))
    rowstore.commit(path, infos)
    with rowstore.open(path) as r:
        np.testing.assert_array_equal(r.take(np.arange(100))["k"], np.arange(100))

    def failing():
        yield from t.to_batches(max_chunksize=10)[:5]
        raise RuntimeError("the task died")

    with pytest.raises(RuntimeError, match="the task died"):
        write_shards(path, cols, failing(), shard_bytes=1500, name_prefix="part-y")
    assert not [n for n in os.listdir(os.path.join(path, "shards")) if n.startswith("part-y")]


def test_a_bad_row_is_counted_from_the_first_batch_and_in_its_own_slice(tmp_path):
    """write_shards numbers a bad row from the first batch of the stream, whichever shard it
    falls in; a batch (a slice of a table) is judged by its own rows only, not by the rows
    of the table it shares its buffers with."""
    from rowstore.arrow import _columns, _source, write_shards

    n = 12
    k = pa.array([None if i == 9 else i for i in range(n)], pa.int64())
    lists = pa.array([[1, 2]] * 7 + [[1, None]] + [[1, 2]] * 4, pa.list_(pa.int64()))
    good = pa.table({"k": pa.array(range(n), pa.int64()), "l": pa.array([[1, 2]] * n)})
    cols = _columns(_source(good, n), None, None)
    path = str(tmp_path / "ds")
    with pytest.raises(RowValidationError, match="row 9: field 'k' is not nullable") as info:
        bad = pa.table({"k": k, "l": good.column("l")})
        write_shards(path, cols, bad.to_batches(max_chunksize=2), shard_bytes=50, name_prefix="a")
    assert info.value.row == 9
    with pytest.raises(RowValidationError, match=r"column 'l' \(rows 6\.\.7\): a null inside"):
        bad = pa.table({"k": good.column("k"), "l": lists})
        write_shards(path, cols, bad.to_batches(max_chunksize=2), shard_bytes=50, name_prefix="b")
    assert not os.listdir(os.path.join(path, "shards"))  # what was written is removed
    # the rows before the null, as a slice of the same table: stored, ints staying ints
    from_arrow(pa.table({"l": lists}).slice(0, 7), str(tmp_path / "x.h5"))
    with rowstore.open(str(tmp_path / "x.h5")) as r:
        assert r.schema["l"].dtype == np.int64 and r[6]["l"].tolist() == [1, 2]


def _png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width x height`` RGBA pixels, with a few bytes of data."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _npz_declaring(nbytes: int) -> bytes:
    """An npz of one small array whose zip directory declares ``nbytes`` uncompressed."""
    import struct

    buf = io.BytesIO()
    np.savez_compressed(buf, np.zeros((4, 4)))
    b = bytearray(buf.getvalue())
    cd = b.index(b"PK\x01\x02")
    b[cd + 24 : cd + 28] = struct.pack("<I", nbytes)
    return bytes(b)


@pytest.mark.parametrize(
    "case", ["png of the field", "png of the format", "npz of the field", "npz of the format"]
)
def test_a_cell_header_declaring_more_than_the_field_is_refused_unallocated(tmp_path, case):
    """A PNG header (or an npz member) may declare gigabytes in a few bytes: the size is bounded
    by the field's shape (fixed), else by the format's per-value limit, before decoding."""
    pytest.importorskip("imagecodecs")
    kind, bound = case.split(" of the ")
    if kind == "png":
        good = __import__("imagecodecs").png_encode(np.zeros((8, 6, 4), np.uint8))
        bad = _png_declaring(8, 8) if bound == "field" else _png_declaring(60000, 60000)  # 14.4 GB
        field = Field("c", "uint8", (8, 6, 4) if bound == "field" else (None, None, 4), codec="png")
    else:
        buf = io.BytesIO()
        np.savez(buf, np.zeros((8, 6)))
        good = buf.getvalue()
        if bound == "field":  # a zip bomb: 128 MiB of zeros in about 130 KiB
            buf = io.BytesIO()
            np.savez_compressed(buf, np.zeros((4096, 4096)))
            bad = buf.getvalue()
        else:
            bad = _npz_declaring(3 << 30)
        # (a Petastorm CompressedNdarrayCodec column is decoded so; a plain field means npy)
        field = Decode("npz", Field("c", "float64", (8, 6))) if bound == "field" else "npz"
    pq.write_table(pa.table({"c": [good, bad]}), tmp_path / "cells.parquet")
    err, peak = peak_allocations(
        lambda: from_parquet(
            str(tmp_path / "cells.parquet"), str(tmp_path / "c.h5"), payloads={"c": field}
        )
    )
    assert isinstance(err, RowValidationError), err
    if kind == "png":  # stored as it is: the writer checks its header against the field
        assert (err.field, err.row) == ("c", 1), err
        assert ("wrong shape" if bound == "field" else "MAX_VALUE_BYTES") in str(err), err
    else:
        assert "column 'c', row 1" in str(err) and "declares" in str(err), err
    assert peak < 64 << 20, peak


def _claim_rows(path: str, rows: int, claim: int) -> None:
    """Rewrite the footer of a Parquet file of ``rows`` rows (one row group) so that it declares
    ``claim`` rows (file, row group and column chunks), as a corrupt or hostile footer may."""

    def varint(
        n: int,
    ) -> bytes:  # Thrift compact protocol: zigzag varint of an i64 after its field header
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    data = open(path, "rb").read()
    n = int.from_bytes(data[-8:-4], "little")
    foot = data[-8 - n : -8]
    assert foot.count(b"\x16" + varint(2 * rows)) >= 2
    foot = foot.replace(b"\x16" + varint(2 * rows), b"\x16" + varint(2 * claim))
    open(path, "wb").write(data[: -8 - n] + foot + len(foot).to_bytes(4, "little") + b"PAR1")


def test_a_footer_claiming_billions_of_rows_is_refused_before_reading(tmp_path):
    p = str(tmp_path / "claim.parquet")
    pq.write_table(
        pa.table({"id": np.arange(777), "f": np.ones(777, np.float32)}), p, compression="none"
    )
    _claim_rows(p, 777, 10**10)
    assert pq.read_metadata(p).row_group(0).num_rows == 10**10
    err, peak = peak_allocations(lambda: from_parquet(p, str(tmp_path / "c.h5")))
    assert isinstance(err, rowstore.FormatError) and "declares 10000000000 rows" in str(err), err
    assert peak < 64 << 20, peak
    # the limit is the caller's to set
    ok = str(tmp_path / "ok.parquet")
    pq.write_table(pa.table({"id": np.arange(777)}), ok)
    with pytest.raises(rowstore.FormatError, match="max_row_group_bytes=1000"):
        from_parquet(ok, str(tmp_path / "d.h5"), max_row_group_bytes=1000)
    assert from_parquet(ok, str(tmp_path / "e.h5"), max_row_group_bytes=777 * 8).names == ["id"]


def test_a_truncated_or_corrupt_parquet_file_is_a_format_error(tmp_path):
    """pyarrow's ArrowInvalid and its errno-less OSError (thrift, snappy, end of stream) come out
    as FormatError naming the file; no other exception leaks."""
    src = str(tmp_path / "t.parquet")
    t = pa.table(
        {
            "id": np.arange(3000),
            "s": [f"x{i}" for i in range(3000)],
            "v": pa.array([[1.0, 2.0]] * 3000, pa.list_(pa.float64())),
        }
    )
    pq.write_table(t, src, row_group_size=500)
    data = open(src, "rb").read()
    rng = np.random.default_rng(5)
    cases = [
        data[:cut] for cut in (0, 3, len(data) // 3, len(data) // 2, len(data) - 9, len(data) - 1)
    ]
    for _ in range(40):
        b = bytearray(data)
        for k in rng.integers(4, len(data) - 8, 3):
            b[int(k)] ^= 0xFF
        cases.append(bytes(b))
    kinds = set()
    for k, b in enumerate(cases):
        p = str(tmp_path / f"bad{k}.parquet")
        open(p, "wb").write(b)
        try:
            from_parquet(p, str(tmp_path / f"out{k}.h5"))
        except rowstore.RowstoreError as exc:
            kinds.add(type(exc.__cause__).__name__ if exc.__cause__ else type(exc).__name__)
            assert isinstance(exc, (rowstore.FormatError, RowValidationError)), (k, exc)
    assert {"ArrowInvalid", "OSError"} <= kinds, kinds


def test_a_fixed_size_list_too_large_for_a_row_is_a_schema_error(tmp_path):
    """``fixed_size_list<int8>[2**31 - 1]``: its values would be stored in the row, which must
    fit a block; refused naming the column when the schema is inferred (before any batch is
    read), and naming the field when a schema is given (numpy's row size wraps around)."""
    t = pa.list_(pa.int8(), 2**31 - 1)
    empty = pa.table({"x": pa.array([], t)})
    src = str(tmp_path / "big.parquet")
    pq.write_table(empty, src)
    calls = [
        lambda: infer_schema(empty.schema),
        lambda: from_arrow(empty, str(tmp_path / "a.h5")),
        lambda: from_parquet(src, str(tmp_path / "b.h5")),
    ]
    for call in calls:
        with pytest.raises(SchemaError, match="column 'x'.*MAX_CHUNK_BYTES") as e:
            call()
        assert e.value.field == "x"
    given = Schema([Field("x", "int8", (2**31 - 1,), nullable=True)])  # a row of 2**31 bytes
    with pytest.raises(SchemaError, match="field 'x'.*numpy limits a row") as e:
        from_arrow(empty, str(tmp_path / "c.h5"), schema=given)
    assert e.value.field == "x"
    assert sorted(os.listdir(tmp_path)) == ["big.parquet"]


def _npz_bomb(shape: tuple[int, ...], zeros: int) -> bytes:
    """An npz (a zip of one deflated member, ``arr_0.npy``) whose npy header declares a float64
    array of ``shape``, followed by ``zeros`` bytes (a multiple of 16 MiB) of zeros: the zip's
    declared size and CRC are true, but it is about 1/1000 of that on disk."""
    import struct
    import zlib

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    head_bytes = head.getvalue()
    block = bytes(16 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    # A full flush resets the window: every block of zeros compresses to the same bytes.
    first = c.compress(head_bytes) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    data = first + again * (zeros // len(block)) + c.flush()
    crc = zlib.crc32(head_bytes)
    for _ in range(zeros // len(block)):
        crc = zlib.crc32(block, crc)
    size = len(head_bytes) + zeros
    name = b"arr_0.npy"
    common = struct.pack("<HHHHHIII", 20, 0, 8, 0, 0, crc, len(data), size)
    local = b"PK\x03\x04" + common + struct.pack("<HH", len(name), 0) + name
    central = (
        b"PK\x01\x02"
        + struct.pack("<H", 20)
        + common
        + struct.pack("<HHHHHII", len(name), 0, 0, 0, 0, 0, 0)  # ... local header at 0
        + name
    )
    end = b"PK\x05\x06" + struct.pack(
        "<HHHHIIH", 0, 0, 1, 1, len(central), len(local) + len(data), 0
    )
    return local + data + central + end


# The peak of this process alone: VmHWM (ru_maxrss keeps the pytest worker's peak across exec).
_PEAK_RSS = """
import json, sys
from rowstore.arrow import from_parquet
from rowstore.global_shuffle._passes import peak_rss
try:
    from_parquet(sys.argv[1], sys.argv[2], payloads={"c": "npz"}, batch_rows=1)
    err = None
except Exception as exc:
    err = [type(exc).__name__, getattr(exc, "field", None), getattr(exc, "row", None), str(exc)]
print(json.dumps([err, peak_rss()]))
"""


@pytest.mark.parametrize("lie", ["npy header", "zip size only"])
def test_an_npz_bomb_is_bounded_by_the_inferred_field_before_inflating(tmp_path, lie):
    """A decoded column whose field was inferred from the first batch ((8, 6) float64), then
    an npz cell of 1.9 GiB of deflated zeros (2 MB on disk), its npy header declaring them (or
    declaring (8, 6), the zip member 1.9 GiB): refused from the headers, never inflated; the
    peak memory of the converting process stays far below what the cell declares."""
    import json
    import subprocess
    import sys

    good = io.BytesIO()
    np.savez_compressed(good, np.ones((8, 6)))
    zeros = 121 << 24  # 1.89 GiB
    shape = (8, zeros // 64) if lie == "npy header" else (8, 6)
    bad = _npz_bomb(shape, zeros)
    assert len(bad) < 4 << 20
    src, out = str(tmp_path / "bomb.parquet"), str(tmp_path / "out.h5")
    pq.write_table(pa.table({"c": [good.getvalue(), bad]}), src)
    run = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, src, out], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    err, peak = json.loads(run.stdout.splitlines()[-1])
    assert peak < 500 << 20, f"peak RSS {peak >> 20} MiB ({err})"
    assert err is not None and err[:3] == ["RowValidationError", "c", 1], err
    assert "column 'c', row 1" in err[3] and "declares" in err[3], err
    assert not os.path.exists(out)
