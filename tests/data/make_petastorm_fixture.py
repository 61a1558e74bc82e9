"""Write the small Petastorm dataset of tests/data/petastorm_hello/ with real Petastorm.

Run it in a venv of its own (Petastorm pins pyarrow < 15 and numpy < 2, and its
``materialize_dataset`` needs pyspark 3.x); see tests/data/README.md::

    python3.11 -m venv /tmp/petastorm-venv
    /tmp/petastorm-venv/bin/pip install petastorm 'pyspark==3.5.*' 'pyarrow==14.*' 'numpy<2'
    'pandas<2' \
        'opencv-python-headless<4.11'
    /tmp/petastorm-venv/bin/python tests/data/make_petastorm_fixture.py tests/data/petastorm_hello

Beside the dataset it writes ``petastorm_hello_expected.npz`` (the values each row was made from, in
row
order, the variable-shape ones under ``<field>_<id>``) and ``petastorm_hello_petastorm.npz`` (the
JPEG
field as Petastorm's own reader decodes it), which tests/integrations/test_petastorm_import.py
compares with.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
from petastorm import make_reader
from petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
from pyspark.sql import SparkSession
from pyspark.sql.types import DoubleType, IntegerType, StringType

ROWS = 24

HelloSchema = Unischema(
    "HelloSchema",
    [
        UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("image1", np.uint8, (32, 64, 3), CompressedImageCodec("png"), False),
        UnischemaField("gray", np.uint8, (16, 16), CompressedImageCodec("jpeg", 95), False),
        UnischemaField("array_4d", np.uint8, (None, 4, 3, None), NdarrayCodec(), False),
        UnischemaField("score", np.float64, (), ScalarCodec(DoubleType()), False),
        UnischemaField("name", np.str_, (), ScalarCodec(StringType()), True),
        UnischemaField("matrix", np.float32, (5, 5), CompressedNdarrayCodec(), False),
    ],
)


def row(i: int) -> dict:
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:16, 0:16]
    return {
        "id": np.int32(i),
        "image1": rng.integers(0, 255, (32, 64, 3), dtype=np.uint8),
        "gray": ((x * 8 + y * 4 + i) % 256).astype(np.uint8),
        "array_4d": rng.integers(0, 255, (1 + i % 3, 4, 3, 2 + i % 4), dtype=np.uint8),
        "score": float(rng.standard_normal()),
        "name": None if i % 5 == 0 else f"row {i}",
        "matrix": rng.standard_normal((5, 5)).astype(np.float32),
    }


def main(out: str) -> None:
    out = os.path.abspath(out)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers run this venv's Python too
    shutil.rmtree(out, ignore_errors=True)
    url = "file://" + out
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    rows = [row(i) for i in range(ROWS)]
    with materialize_dataset(spark, url, HelloSchema, row_group_size_mb=1):
        rdd = spark.sparkContext.parallelize(rows, 2).map(
            lambda r: dict_to_spark_row(HelloSchema, r)
        )
        df = spark.createDataFrame(rdd, HelloSchema.as_spark_schema()).coalesce(2)
        df.write.mode("overwrite").parquet(url)
    spark.stop()
    # What the rows were made from (row order = id order), and Petastorm's own decoding of the
    # lossy JPEG field (imagecodecs and OpenCV may round differently).
    expected = {
        "id": np.array([r["id"] for r in rows]),
        "score": np.array([r["score"] for r in rows]),
        "name": np.array(["" if r["name"] is None else r["name"] for r in rows]),
        "name_null": np.array([r["name"] is None for r in rows]),
        "image1": np.stack([r["image1"] for r in rows]),
        "gray": np.stack([r["gray"] for r in rows]),
        "matrix": np.stack([r["matrix"] for r in rows]),
    }
    expected.update({f"array_4d_{i}": r["array_4d"] for i, r in enumerate(rows)})
    np.savez_compressed(
        out + "_expected.npz", **expected
    )  # beside the dataset: Petastorm reads every file in it
    with make_reader(url, shuffle_row_groups=False, num_epochs=1, workers_count=1) as reader:
        got = sorted(reader, key=lambda r: r.id)
    np.savez_compressed(
        out + "_petastorm.npz",
        gray=np.stack([r.gray for r in got]),
        ids=np.array([r.id for r in got]),
    )
    print(
        "wrote",
        out,
        sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs),
        "bytes",
    )


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(os.path.dirname(__file__), "petastorm_hello")
    )
