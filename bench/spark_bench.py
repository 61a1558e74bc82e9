"""rowstore.spark.write against Petastorm's materialize_dataset + Parquet write, and reading the
results: rowstore's torch loader against petastorm.pytorch.BatchedDataLoader.

    python bench/spark_bench.py [--rows 128] [--repeats 3] [--petastorm-python
    /tmp/petastorm-venv/bin/python]
                                [--out bench/results/spark_bench.json]

Both sides write the same rows of Petastorm's hello-world schema (an int32 id, a 128x256x3 uint8
PNG image, a uint8 array of shape (1..3, 16, 8, 1..4)), made by the same deterministic
generator, from a Spark DataFrame on ``local[2]`` that is cached and counted before timing:

* ``rowstore``: :func:`rowstore.spark.to_row` cells, :func:`rowstore.spark.write` (pyspark 4.3,
  this venv); the writer decodes each PNG cell and encodes it again (zlib ``--png-level``,
  default 1), work that Petastorm's write does not do (its cells are stored as they are);
* ``petastorm``: ``dict_to_spark_row`` cells, ``materialize_dataset`` + ``df.write.parquet``
  (Petastorm 0.13.1, pyspark 3.5, pyarrow 14, in Petastorm's own venv: a subprocess running this
  file with ``--petastorm-side``; see tests/data/README.md for the venv).

Writing: median wall time of ``--repeats`` writes (one warm-up first), rows/s. Reading: one epoch
of batches of 32 over the fields ``id`` and ``image1`` (Petastorm's BatchedDataLoader cannot batch
the variable-shape array), PNG decoding included: ``rowstore.torch.BatchedDataLoader`` (block
shuffle) vs ``petastorm.pytorch.BatchedDataLoader(make_reader(..., shuffle_row_groups=True))``
and, since that loader converts a row reader's rows one by one, also Petastorm's
``DataLoader`` on the same reader; each epoch opens its reader; median of ``--repeats`` epochs
after a warm-up, rows/s. Spark start-up is not timed. The two
sides run one after the other on the same 2-core machine; other load on it shows in the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

BATCH = 32


def row_generator(i: int) -> dict:
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:128, 0:256]
    image = np.stack([(x + i) % 256, (y * 2) % 256, (x * y + i) % 256], axis=-1).astype(np.uint8)
    return {
        "id": np.int32(i),
        "image1": image,
        "array_4d": rng.integers(0, 255, (1 + i % 3, 16, 8, 1 + i % 4), dtype=np.uint8),
    }


def _session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    s = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    s.sparkContext.setLogLevel("ERROR")
    return s


def _median(fn, repeats: int) -> tuple[float, list[float]]:
    """Median wall time of ``repeats`` calls after a warm-up; a call may return its own time
    (a float) instead, e.g. to leave out retries."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        own = fn()
        times.append(own if isinstance(own, float) else time.perf_counter() - t0)
    return statistics.median(times), times


# -- Petastorm's side (its own venv; no rowstore import) ------------------------------------------
def petastorm_side(rows: int, repeats: int, work: str) -> dict:
    from petastorm import make_reader
    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.pytorch import BatchedDataLoader, DataLoader
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql.types import IntegerType

    schema = Unischema(
        "HelloWorldSchema",
        [
            UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
            UnischemaField("image1", np.uint8, (128, 256, 3), CompressedImageCodec("png"), False),
            UnischemaField("array_4d", np.uint8, (None, 16, 8, None), NdarrayCodec(), False),
        ],
    )
    spark = _session()
    rdd = spark.sparkContext.parallelize(range(rows), 2).map(
        lambda i: dict_to_spark_row(schema, row_generator(i))
    )
    df = spark.createDataFrame(rdd, schema.as_spark_schema()).cache()
    df.count()
    url = "file://" + os.path.join(work, "petastorm_ds")

    def write():
        with materialize_dataset(spark, url, schema, 32):
            df.write.mode("overwrite").parquet(url)

    w, wt = _median(write, repeats)
    spark.stop()

    short = {"BatchedDataLoader": 0, "DataLoader": 0}

    def read(loader=BatchedDataLoader):
        # Measured here: under load, Petastorm's thread-pool reader now and then ends an epoch
        # early (0 rows); such an epoch is counted and read again (at most 5 times), and only
        # the complete epoch is timed.
        for _ in range(5):
            n, t0 = 0, time.perf_counter()
            with make_reader(
                url,
                schema_fields=["id", "image1"],
                num_epochs=1,
                shuffle_row_groups=True,
                workers_count=2,
            ) as reader:
                for b in loader(reader, batch_size=BATCH):
                    n += len(b["id"])
            if n == rows:
                return time.perf_counter() - t0
            short[loader.__name__] += 1
        raise AssertionError(f"{loader.__name__}: {n} rows of {rows}, 5 times")

    r, rt = _median(read, repeats)
    d, dt = _median(lambda: read(DataLoader), repeats)
    import petastorm
    import pyarrow
    import pyspark

    return {
        "write_s": w,
        "write_times": wt,
        "read_s": r,
        "read_times": rt,
        "read_dataloader_s": d,
        "read_dataloader_times": dt,
        "short_epochs_retried": short,
        "versions": {
            "petastorm": petastorm.__version__,
            "pyspark": pyspark.__version__,
            "pyarrow": pyarrow.__version__,
            "numpy": np.__version__,
        },
    }


# -- rowstore's side ------------------------------------------------------------------------------
def rowstore_side(rows: int, repeats: int, work: str, png_level: int) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import pyspark

    import rowstore
    import rowstore.spark as rsp
    import rowstore.torch as rst
    from rowstore import Field, Schema

    schema = Schema(
        [
            Field("id", "int32"),
            Field("image1", "uint8", (128, 256, 3), codec={"id": "png", "level": png_level}),
            Field("array_4d", "uint8", (None, 16, 8, None)),
        ]
    )
    spark = _session()
    rdd = spark.sparkContext.parallelize(range(rows), 2).map(
        lambda i: rsp.to_row(schema, row_generator(i))
    )
    df = spark.createDataFrame(rdd, rsp.spark_schema(schema)).cache()
    df.count()
    path = os.path.join(work, "rowstore_ds")
    w, wt = _median(lambda: rsp.to_rowstore(df, path, schema=schema), repeats)
    spark.stop()

    def read():
        n = 0
        with rst.BatchedDataLoader(
            path, batch_size=BATCH, shuffle=True, fields=["id", "image1"]
        ) as dl:
            for b in dl:
                n += len(b["id"])
        assert n == rows, n

    r, rt = _median(read, repeats)
    with rowstore.open(path) as reader:
        shards = reader.layout.num_shards
    return {
        "write_s": w,
        "write_times": wt,
        "read_s": r,
        "read_times": rt,
        "shards": shards,
        "versions": {
            "rowstore": rowstore.__version__,
            "pyspark": pyspark.__version__,
            "numpy": np.__version__,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--png-level", type=int, default=1, help="zlib level of rowstore's PNG field (default 1)"
    )
    ap.add_argument("--petastorm-python", default="/tmp/petastorm-venv/bin/python")
    ap.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "spark_bench.json"
        ),
    )
    ap.add_argument("--petastorm-side", metavar="WORKDIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.petastorm_side:
        print(json.dumps(petastorm_side(args.rows, args.repeats, args.petastorm_side)))
        return
    work = tempfile.mkdtemp(prefix="spark-bench-")
    try:
        ours = rowstore_side(args.rows, args.repeats, work, args.png_level)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON")}
        p = subprocess.run(
            [
                args.petastorm_python,
                os.path.abspath(__file__),
                "--rows",
                str(args.rows),
                "--repeats",
                str(args.repeats),
                "--petastorm-side",
                work,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if p.returncode != 0:
            raise SystemExit(f"Petastorm's side failed:\n{p.stderr[-4000:]}")
        theirs = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = args.rows
    result = {
        "bench": "spark_bench",
        "rows": n,
        "batch_size": BATCH,
        "repeats": args.repeats,
        "png_level": args.png_level,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "rowstore": ours,
        "petastorm": theirs,
        "write_rows_per_s": {"rowstore": n / ours["write_s"], "petastorm": n / theirs["write_s"]},
        "read_rows_per_s": {
            "rowstore": n / ours["read_s"],
            "petastorm": n / theirs["read_s"],
            "petastorm_DataLoader": n / theirs["read_dataloader_s"],
        },
        "write_speedup": theirs["write_s"] / ours["write_s"],
        "read_speedup": theirs["read_s"] / ours["read_s"],
        "read_speedup_vs_DataLoader": theirs["read_dataloader_s"] / ours["read_s"],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "write_rows_per_s",
                    "read_rows_per_s",
                    "write_speedup",
                    "read_speedup",
                    "read_speedup_vs_DataLoader",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
