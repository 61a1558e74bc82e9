"""Encoded images through the integrations: Arrow/Parquet binary cells, pandas bytes cells, a
Petastorm dataset's CompressedImageCodec cells, Spark and Dask writes: stored as they are
(the stored payload is the cell's bytes), read back as imagecodecs decodes them."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import DATA, stored_payloads

import rowstore
from rowstore import Field, RowValidationError, Schema

ic = pytest.importorskip("imagecodecs")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def smooth(h, w, c=3, shift=0):
    y, x = np.mgrid[0:h, 0:w]
    base = (np.sin(x / 4.0 + shift) + np.cos(y / 6.0) + 2) * 60
    return np.stack([base + 10 * k for k in range(c)], axis=-1).astype(np.uint8)


SHAPES = [(8, 6), (8, 6), (5, 9), (12, 4), (8, 6)]
IMAGES = [smooth(h, w, shift=i) for i, (h, w) in enumerate(SHAPES)]
PNGS = [ic.png_encode(a) for a in IMAGES]
JPGS = [ic.jpeg8_encode(a) for a in IMAGES]


def _check(path, name, cells, decode):
    assert stored_payloads(path, name) == [bytes(c) for c in cells]
    with rowstore.open(path) as r:
        for i, c in enumerate(cells):
            np.testing.assert_array_equal(r[i][name], decode(c))


def test_from_arrow_stores_cells_as_they_are(tmp_path):
    t = pa.table(
        {
            "img": pa.array(PNGS, pa.binary()),
            "big": pa.array(PNGS, pa.large_binary()),
            "jpg": JPGS,
            "y": list(range(5)),
        }
    )
    var = Field("big", "uint8", (None, None, 3), codec="png")
    jpg = Field("jpg", "uint8", (None, None, 3), codec="jpeg")
    out = tmp_path / "a.h5"
    # "png" by name: dtype and shape from the first batch's headers (dims that vary: None)
    schema = rowstore.from_arrow(t, out, payloads={"img": "png", "big": var, "jpg": jpg})
    assert schema["img"].shape == (None, None, 3) and schema["img"].codec["id"] == "png"
    with pytest.raises(RowValidationError, match=r"row 2: field 'img'.*\(5, 9, 3\)"):
        # a first batch of 2 rows tells (8, 6, 3)
        rowstore.from_arrow(t, tmp_path / "b.h5", payloads={"img": "png"}, batch_rows=2)
    schema = rowstore.from_arrow(t, out, payloads={"img": var, "big": var, "jpg": jpg})
    _check(out, "img", PNGS, ic.png_decode)
    _check(out, "big", PNGS, ic.png_decode)
    _check(out, "jpg", JPGS, ic.jpeg8_decode)
    # a slice (an offset into the buffers) and nulls
    nulls = pa.table({"img": pa.array([None, PNGS[1], None, PNGS[3], PNGS[4]], pa.binary())})
    nf = Field("img", "uint8", (None, None, 3), codec="png", nullable=True)
    rowstore.from_arrow(nulls.slice(1), out, schema=Schema([nf]))
    assert stored_payloads(out, "img") == [PNGS[1], b"", PNGS[3], PNGS[4]]
    with rowstore.open(out) as r:
        assert r[1]["img"] is None
        np.testing.assert_array_equal(r[2]["img"], IMAGES[3])


def test_from_parquet_and_a_bad_cell(tmp_path):
    src = tmp_path / "imgs.parquet"
    pq.write_table(pa.table({"img": PNGS, "label": [0, 1, 0, 1, 1]}), src, row_group_size=2)
    schema = Schema(
        [Field("img", "uint8", (None, None, 3), codec="png"), Field("label", "int64", ())]
    )
    out = tmp_path / "ds"
    rowstore.from_parquet(src, out, schema=schema, dataset=True)
    _check(out, "img", PNGS, ic.png_decode)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"img": PNGS[:3] + [JPGS[3]], "label": [0, 0, 0, 0]}), bad)
    with pytest.raises(RowValidationError, match="row 3: field 'img'.*got JPEG bytes") as e:
        rowstore.from_parquet(bad, tmp_path / "bad.h5", schema=schema)
    assert (e.value.field, e.value.row) == ("img", 3)
    assert not os.path.exists(tmp_path / "bad.h5")


def test_from_pandas_bytes_cells(tmp_path):
    pd = pytest.importorskip("pandas")
    from rowstore.pandas import from_pandas, read_pandas

    df = pd.DataFrame({"img": PNGS, "label": [3, 1, 4, 1, 5]})
    schema = Schema(
        [Field("img", "uint8", (None, None, 3), codec="png"), Field("label", "int64", ())]
    )
    out = tmp_path / "p.h5"
    from_pandas(df, out, schema=schema)
    _check(out, "img", PNGS, ic.png_decode)
    back = read_pandas(out)
    assert back["label"].tolist() == [3, 1, 4, 1, 5]
    assert all(np.array_equal(back["img"][i], IMAGES[i]) for i in range(5))
    df.loc[2, "img"] = PNGS[2][:20]
    with pytest.raises(RowValidationError, match="row 2: field 'img'.*truncated PNG"):
        from_pandas(df, tmp_path / "q.h5", schema=schema)


def test_petastorm_image_cells_stored_as_they_are(tmp_path):
    from rowstore.arrow import parquet_files
    from rowstore.petastorm import import_petastorm

    hello = os.path.join(DATA, "petastorm_hello")
    out = str(tmp_path / "ds")
    import_petastorm("file://" + hello, out)
    cells = pa.concat_tables(
        [pq.read_table(f, columns=["image1", "gray"]) for f in parquet_files(hello)]
    )
    with rowstore.open(out) as r:
        assert r.schema["image1"].codec["id"] == "png" and r.schema["gray"].codec["id"] == "jpeg"
    assert stored_payloads(out, "image1") == cells.column("image1").to_pylist()
    assert stored_payloads(out, "gray") == cells.column("gray").to_pylist()


@pytest.mark.xdist_group("spark")  # the one SparkSession, on one worker (--dist loadgroup)
def test_spark_write(spark, tmp_path):
    from pyspark.sql import types as T

    import rowstore.spark as rsp

    st = T.StructType(
        [T.StructField("img", T.BinaryType(), False), T.StructField("y", T.LongType(), False)]
    )
    df = spark.createDataFrame([(bytearray(p), i) for i, p in enumerate(PNGS)], st).coalesce(1)
    schema = Schema([Field("img", "uint8", (None, None, 3), codec="png"), Field("y", "int64", ())])
    out = str(tmp_path / "ds")
    rsp.to_rowstore(df, out, schema=schema)
    with rowstore.open(out) as r:
        order = np.argsort(r.take(np.arange(len(r)))["y"])
    got = stored_payloads(out, "img")
    assert [got[i] for i in order] == PNGS
    row = rsp.to_row(schema, {"img": memoryview(PNGS[2]), "y": 2})  # kept as it is
    assert bytes(row["img"]) == PNGS[2]
    with pytest.raises(RowValidationError, match="field 'img'"):
        rsp.to_row(schema, {"img": JPGS[2], "y": 2})


@pytest.mark.xdist_group("dask")
def test_dask_write(tmp_path):
    dask = pytest.importorskip("dask")
    dd = pytest.importorskip("dask.dataframe")
    pd = pytest.importorskip("pandas")
    from rowstore.dask import to_rowstore

    df = pd.DataFrame({"img": PNGS, "y": range(5)})
    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_pandas(df, npartitions=2)
    schema = Schema([Field("img", "uint8", (None, None, 3), codec="png"), Field("y", "int64", ())])
    out = str(tmp_path / "ds")
    with dask.config.set(scheduler="threads"):
        to_rowstore(ddf, out, schema=schema, index=False)
    _check(out, "img", PNGS, ic.png_decode)
