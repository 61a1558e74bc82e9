"""rowstore.spark on local[2] (one SparkSession for the test session, tests/_spark.py): every
supported Spark type round-trips equal to ``df.collect()``, to_row cells decode exactly, a task
that raises commits nothing, the workers run the driver's Python (or the write fails at once
naming PYSPARK_PYTHON), and the converter caches, reuses, deletes and feeds torch (a real
``torch.utils.data.DataLoader``, every row once per epoch with 0 and 2 workers) and tf."""

from __future__ import annotations

import datetime as dt
import os
import sys

import numpy as np
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytestmark = pytest.mark.xdist_group(
    "spark"
)  # one worker starts the one SparkSession (--dist loadgroup)

import rowstore  # noqa: E402
from rowstore import Field, RowValidationError, Schema, SchemaError  # noqa: E402


@pytest.fixture(scope="module")
def rsp(spark):
    import rowstore.spark as rsp

    return rsp


def _all_types(spark):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("i8", T.ByteType()),
            T.StructField("i16", T.ShortType()),
            T.StructField("i32", T.IntegerType()),
            T.StructField("f32", T.FloatType()),
            T.StructField("f64", T.DoubleType()),
            T.StructField("ok", T.BooleanType()),
            T.StructField("text", T.StringType()),
            T.StructField("blob", T.BinaryType()),
            T.StructField("day", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("ints", T.ArrayType(T.IntegerType())),
            T.StructField("grid", T.ArrayType(T.ArrayType(T.DoubleType()))),
            T.StructField("vec", VectorUDT()),
        ]
    )
    rows = []
    for i in range(30):
        null = i % 7 == 3
        rows.append(
            (
                i,
                None if null else i - 128,
                -i * 300,
                i * 70_000,
                i / 4,
                i / 3,
                None if null else bool(i % 2),
                None if null else f"ü{i}" * (i % 4),
                bytes(range(i % 5)),
                dt.date(1999, 12, 31) + dt.timedelta(days=i),
                dt.datetime(2024, 2, 29, 23, 59, 59, 999_999 - i, tzinfo=dt.timezone.utc)
                if not null
                else None,
                dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=i * 12_345_678),
                list(range(i % 4)),
                [[float(i), -0.0]] * (i % 3),
                Vectors.dense([i, 0.5, -1.0])
                if i % 2
                else Vectors.sparse(4, [1, 3], [float(i), 2.0]),
            )
        )
    return spark.createDataFrame(rows, schema).repartition(3, "id").sortWithinPartitions("id")


def _spark_value(v, field: Field):
    """A collected Spark value as rowstore returns it."""
    if v is None:
        return None
    if hasattr(v, "toArray"):
        return v.toArray()
    if field.is_time:
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return np.datetime64(v, np.datetime_data(field.dtype)[0])
    if field.shape:
        return np.asarray(v, dtype=field.dtype).reshape(
            (len(v), len(v[0]))
            if field.shape == (None, None) and v
            else (0, 0)
            if field.shape == (None, None)
            else (len(v),)
        )
    return v


def test_every_type_round_trips_equal_to_collect(tmp_path, spark, rsp, rs):
    df = _all_types(spark)
    path = str(tmp_path / "all")
    version = rsp.to_rowstore(df, "file://" + path, shard_bytes=1 << 20)
    expected = df.collect()
    assert version == 1
    with rowstore.open(path) as r:
        s = r.schema
        got = [r[i] for i in range(len(r))]
        assert r.layout.num_shards == 3  # one per non-empty partition, in partition order
        assert r.layout.user_attrs["arrow"]["spark"] == {"vectors": ["vec"]}
    assert [f.dtype.name if f.dtype not in ("str", "bytes") else f.dtype for f in s] == [
        "int64",
        "int8",
        "int16",
        "int32",
        "float32",
        "float64",
        "bool",
        "str",
        "bytes",
        "datetime64[D]",
        "datetime64[us]",
        "datetime64[us]",
        "int32",
        "float64",
        "float64",
    ]
    assert [f.shape for f in s][12:] == [(None,), (None, None), (None,)]
    assert s["i8"].nullable and not s["id"].nullable  # Spark's flags (nullable="spark")
    assert len(got) == len(expected) == 30
    for k, (row, want) in enumerate(zip(got, expected)):
        for f in s:
            rs.assert_value_equal(_spark_value(want[f.name], f), row[f.name], f, f"row {k}: ")
    # the shards of the job are all committed (none left over)
    with rowstore.open(path) as r:
        assert sorted(os.listdir(os.path.join(path, "shards"))) == sorted(
            os.path.basename(p) for p in r.layout.shard_paths
        )


IMAGE = Schema(
    [
        Field("id", "int64"),
        Field("image", "uint8", (16, 32, 3), codec="png"),
        Field("blob", "float32", (None, 3, None, 2)),
        Field("label", "uint8"),
        Field("when", "datetime64[us]", nullable=True),
    ]
)


def _image_rows(rs, n: int = 12) -> list[dict]:
    rng = np.random.default_rng(5)
    return [
        {
            "id": i,
            "image": rs.smooth_image(rng, (16, 32, 3)),
            "blob": rng.standard_normal((1 + i % 3, 3, i % 2, 2)).astype(np.float32),
            "label": 200 + i % 50,
            "when": None if i % 4 == 0 else np.datetime64(1_700_000_000_000_000 + i, "us"),
        }
        for i in range(n)
    ]


def test_to_row_cells_decode_exactly(tmp_path, spark, rsp, rs):
    rows = _image_rows(rs)
    df = spark.createDataFrame(
        [rsp.to_row(IMAGE, r) for r in rows], rsp.spark_schema(IMAGE), verifySchema=False
    )
    # Shards roll over between record batches: small batches, several shards a partition.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    try:
        rsp.to_rowstore(df.coalesce(2), str(tmp_path / "img"), schema=IMAGE, shard_bytes=300)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    with rowstore.open(str(tmp_path / "img")) as r:
        assert r.schema == IMAGE and r.layout.num_shards > 2
        rs.assert_rows_equal(IMAGE, rows, [r[i] for i in range(len(r))])


def test_to_row_and_schema_errors_name_the_field(spark, rsp, rs):
    from pyspark.sql import types as T

    row = _image_rows(rs, 1)[0]
    with pytest.raises(RowValidationError, match="'image'"):
        rsp.to_row(IMAGE, {**row, "image": np.zeros((16, 32), np.uint8)})
    with pytest.raises(SchemaError, match=r"row lacks field\(s\) \['label'\]"):
        rsp.to_row(IMAGE, {k: v for k, v in row.items() if k != "label"})
    with pytest.raises(SchemaError, match=r"field\(s\) \['extra'\] that the schema lacks"):
        rsp.to_row(IMAGE, {**row, "extra": 1})
    df = spark.createDataFrame(
        [], T.StructType([T.StructField("x", T.DoubleType()), T.StructField("s", T.StringType())])
    )
    with pytest.raises(
        SchemaError, match=r"column 'x' is double, which field 'x' \(int64\) cannot store"
    ):
        rsp.to_rowstore(
            df, "/nonexistent/never", schema=Schema([Field("x", "int64"), Field("s", "str")])
        )
    with pytest.raises(SchemaError, match=r"column 's' is string, but field 's' is float32"):
        rsp.to_rowstore(
            df, "/nonexistent/never", schema=Schema([Field("x", "float64"), Field("s", "float32")])
        )
    with pytest.raises(SchemaError, match="schema fields"):
        rsp.to_rowstore(df, "/nonexistent/never", schema=Schema([Field("x", "float64")]))
    m = spark.createDataFrame([({"a": 1},)], "m map<string,int>")
    with pytest.raises(SchemaError, match="column 'm'"):
        rsp.to_rowstore(m, "/nonexistent/never")
    assert not os.path.exists("/nonexistent/never")


def test_a_task_raising_mid_write_commits_nothing(tmp_path, spark, rsp):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    path = str(tmp_path / "ds")
    foreign = rowstore.write_shard(
        path, Schema([Field("id", "int64"), Field("v", "int64")]), {"id": [1], "v": [2]}
    )

    @F.udf(T.LongType())
    def boom(i):
        if i == 37:  # the second partition, after its first rows went into a shard
            raise ValueError("boom at 37")
        return i

    df = spark.range(0, 40, numPartitions=2).withColumn("v", boom("id"))
    with pytest.raises(Exception, match="boom at 37"):
        rsp.to_rowstore(df, path, shard_bytes=64)
    assert not os.path.exists(os.path.join(path, "rowstore.json"))  # no manifest, no version
    # the shards the job's tasks wrote are removed; a shard of another writer is left alone
    assert os.listdir(os.path.join(path, "shards")) == [os.path.basename(foreign.path)]


def test_converter_caches_reuses_deletes_and_loads(tmp_path, spark, rsp):
    torch = pytest.importorskip("torch")
    cache = "file://" + str(tmp_path / "cache")

    def frame():  # the same query built twice: the same analyzed plan
        return spark.range(0, 45, numPartitions=2).selectExpr(
            "id", "cast(id * 2 as float) as x", "array(id, id + 1) as pair"
        )

    conv = rsp.make_converter(frame(), cache_dir=cache)
    assert not conv.cached and len(conv) == 45 and conv.dataset_size == 45
    spark.conf.set(rsp.CACHE_DIR_CONF, cache)
    try:
        again = rsp.make_converter(frame())  # no Spark job: the cached copy
    finally:
        spark.conf.unset(rsp.CACHE_DIR_CONF)
    assert again.cached and again.path == conv.path
    other = rsp.make_converter(frame().where("id < 10"), cache_dir=cache)
    assert not other.cached and other.path != conv.path and len(other) == 10

    with conv.make_torch_dataloader(batch_size=8, num_epochs=2, seed=3) as loader:
        assert isinstance(loader, torch.utils.data.DataLoader) and len(loader) == 2 * 6
        ids = [b["id"] for b in loader]
    assert all(isinstance(t, torch.Tensor) for t in ids) and len(ids) == 2 * 6
    first, second = torch.cat(ids[:6]).tolist(), torch.cat(ids[6:]).tolist()
    assert (
        sorted(first) == sorted(second) == list(range(45)) and first != second
    )  # every row once per epoch
    halves = []
    for rank in (
        0,
        1,
    ):  # Petastorm's cur_shard/shard_count: the epoch dealt to 2 ranks, every row once
        with conv.make_torch_dataloader(
            batch_size=10, num_epochs=1, cur_shard=rank, shard_count=2, shuffle=False
        ) as loader:
            halves.append(torch.cat([b["x"] for b in loader]).tolist())
    assert all(halves) and sorted(halves[0] + halves[1]) == [2.0 * i for i in range(45)]

    tf = pytest.importorskip("tensorflow")
    with conv.make_tf_dataset(batch_size=16, num_epochs=1) as ds:
        got = np.concatenate([b["id"].numpy() for b in ds])
        assert isinstance(ds, tf.data.Dataset)
    assert sorted(got.tolist()) == list(range(45))

    conv.delete()
    assert not os.path.exists(conv.path)
    assert not rsp.make_converter(frame(), cache_dir=cache).cached  # written again
    with pytest.raises(ValueError, match="needs cache_dir="):
        rsp.make_converter(frame())


# -- the workers' Python ----------------------------------------------------------------------
def test_local_workers_run_the_drivers_python(spark, rsp, monkeypatch):
    sc = spark.sparkContext
    saved = sc.pythonExec
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    sc.pythonExec = "python3"  # what pyspark runs when the session started without PYSPARK_PYTHON
    try:
        rsp.check_workers(spark)
        assert sc.pythonExec == sys.executable
        worker = sc.parallelize([0], 1).map(lambda _: __import__("sys").executable).collect()
        assert worker == [sys.executable]
    finally:
        sc.pythonExec = saved


def test_workers_that_cannot_run_rowstore_fail_at_once_naming_pyspark_python(spark, rsp, tmp_path):
    sc = spark.sparkContext
    saved = sc.pythonExec
    bogus = str(tmp_path / "no-such-python")
    sc.pythonExec = bogus  # a session started with PYSPARK_PYTHON=<a Python that is not there>
    try:
        with pytest.raises(rowstore.RowstoreError, match="PYSPARK_PYTHON=") as err:
            rsp.to_rowstore(spark.range(3), str(tmp_path / "ds"))
    finally:
        sc.pythonExec = saved
    message = str(err.value)
    assert bogus in message and "Cannot run program" in message and sys.executable in message
    assert "\n" not in message  # one line, not the executor's trace
    assert not os.path.exists(tmp_path / "ds")  # nothing written
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_failure_text_is_the_line_that_says_why(rsp_module):
    rsp = rsp_module
    trace = (
        "An error occurred while calling o1.collectAndServe.\n"
        + "\tat org.apache.spark.api.python.PythonRunner.compute(PythonRunner.scala:1)\n" * 100
        + "ModuleNotFoundError: No module named 'rowstore'\n\tat more.java(X.java:2)\n"
    )
    assert rsp._failure_text(RuntimeError(trace)) == (
        "ModuleNotFoundError: No module named 'rowstore'"
    )
    assert rsp._failure_text(RuntimeError("first line\nsecond")) == "first line"


# -- the converter's torch DataLoader (no Spark job: a converter of a dataset written here) ----
@pytest.fixture(scope="module")
def converter(tmp_path_factory, rsp_module):
    path = str(tmp_path_factory.mktemp("conv") / "ds")
    schema = Schema([Field("id", "int64"), Field("x", "float32")])
    ids = np.arange(45)
    info = rowstore.write_shard(
        path, schema, {"id": ids, "x": ids.astype(np.float32) * 2}, rows_per_block=8
    )
    rowstore.commit(path, [info])
    return rsp_module.SparkDatasetConverter(path, cached=True)


@pytest.fixture(scope="module")
def rsp_module():
    import rowstore.spark as rsp

    return rsp


def _epochs(loader, n: int) -> list[list[list[int]]]:
    """The loader's batches of row ids, split into its ``n`` epochs."""
    batches = [b["id"].tolist() for b in loader]
    per = len(batches) // n
    assert len(batches) == per * n
    return [batches[k * per : (k + 1) * per] for k in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_torch_dataloader_is_torchs_and_deals_every_row_once_per_epoch(converter, workers):
    torch = pytest.importorskip("torch")
    import rowstore.torch as rst

    with converter.make_torch_dataloader(
        batch_size=8, num_epochs=2, seed=3, num_workers=workers
    ) as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert loader.num_workers == workers and loader.batch_size is None  # rowstore batches
        assert loader.dataset.batch_size == 8 and len(loader) == 2 * 6
        epochs = _epochs(loader, 2)
        later = _epochs(loader, 2)  # the next loop: epochs 2 and 3
    with rst.BatchedDataLoader(converter.path, batch_size=8, seed=3) as ref:
        want = [[b["id"].tolist() for b in ref] for _ in range(4)]  # epochs 0..3
    for got, expected in zip(epochs + later, want):
        assert sorted(sum(got, [])) == list(range(45))  # every row once per epoch
        # the epoch's batches are rowstore's (seed, epoch) order; workers interleave them
        assert sorted(got) == sorted(expected) and (workers or got == expected)
    assert epochs[0] != epochs[1]


def test_torch_dataloader_petastorm_arguments(converter):
    torch = pytest.importorskip("torch")

    with converter.make_torch_dataloader(  # Petastorm's positional order
        16, None, 2, 100, None, shuffle=False
    ) as loader:
        assert loader.dataset.num_threads == 2  # workers_count: the reader's threads
        with pytest.raises(TypeError, match="num_epochs=None has no length"):
            len(loader)
        it = iter(loader)
        rows = torch.cat([next(it)["id"] for _ in range(9)]).tolist()  # past one epoch
    assert rows == list(range(45)) * 3  # three epochs of batches 16, 16, 13

    made = []

    def data_loader_fn(dataset, **kwargs):
        made.append(kwargs)
        return torch.utils.data.DataLoader(dataset, **kwargs)

    with converter.make_torch_dataloader(
        batch_size=10, num_epochs=2, data_loader_fn=data_loader_fn, transform_spec=_double
    ) as loader:
        xs = torch.cat([b["x"] for b in loader]).tolist()
    assert made == [{"batch_size": None, "num_workers": 0, "pin_memory": False}]
    assert sorted(xs) == sorted([4.0 * i for i in range(45)] * 2)
    with pytest.raises(ValueError, match="num_epochs must be an int"):
        with converter.make_torch_dataloader(data_loader_fn=data_loader_fn):
            pass
    with pytest.raises(TypeError, match=r"\.to\(device\)"):
        with converter.make_torch_dataloader(device="cpu"):
            pass


def _double(batch):
    return {**batch, "x": batch["x"] * 2}
