"""Petastorm's reading idioms over rowstore: make_reader / make_batch_reader (num_epochs,
shuffle, cur_shard/shard_count, a vectorized predicate, schema_fields by name or regex,
transform_spec), rowstore.petastorm.DataLoader, file:// URLs, fields= as Field objects and
Reader.batches(shuffle=True)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from helpers import DATA

import rowstore
from rowstore import Field, Schema, SchemaError
from rowstore.cli import main

SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("image_a", "uint8", (4, 4)),
        Field("image_b", "uint8", (None, 2)),
        Field("label", "int16", nullable=True),
    ]
)
N = 57


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("idioms") / "ds")
    with rowstore.DatasetWriter(path, SCHEMA, shard_bytes=600, rows_per_block=5) as w:
        for i in range(N):
            w.write(
                {
                    "id": i,
                    "image_a": np.full((4, 4), i % 256, np.uint8),
                    "image_b": np.full((i % 3, 2), i % 256, np.uint8),
                    "label": None if i % 10 == 0 else i,
                }
            )
    return path


def test_make_reader_rows_epochs_and_fields(ds):
    with rowstore.make_reader(
        "file://" + ds, num_epochs=2, schema_fields=["id", "image_.*"], seed=4
    ) as reader:
        rows = list(reader)
        assert reader.schema.names == ["id", "image_a", "image_b"]
    assert len(rows) == 2 * N and rows[0]._fields == ("id", "image_a", "image_b")
    ids = [r.id for r in rows]
    assert (
        sorted(ids[:N]) == sorted(ids[N:]) == list(range(N)) and ids[:N] != ids[N:]
    )  # shuffled, new order each epoch
    for r in rows[:10]:
        assert (r.image_a == r.id % 256).all() and r.image_b.shape == (r.id % 3, 2)
    with rowstore.make_reader(ds, shuffle=False, schema_fields=[SCHEMA["label"], "id"]) as reader:
        rows = list(reader)
    assert [r.id for r in rows] == list(range(N))
    assert [r.label for r in rows[:3]] == [None, 1, 2]
    with pytest.raises(SchemaError, match=r"'nope\.\*' matches no field"):
        rowstore.make_reader(ds, schema_fields=["nope.*"])


def test_make_reader_shards_predicate_transform(ds):
    parts = []
    for k in range(3):
        with rowstore.make_reader(ds, cur_shard=k, shard_count=3, schema_fields=["id"]) as reader:
            parts.append([r.id for r in reader])
    assert sorted(sum(parts, [])) == list(range(N)) and all(len(p) == N // 3 for p in parts)

    def even(batch):  # vectorized: one bool per row of the batch
        return batch["id"] % 2 == 0

    def plus_one(batch):  # sees the selected fields only (predicate_fields are dropped first)
        assert sorted(batch) == ["image_a"]
        return {"image_a": batch["image_a"] + 1}

    with rowstore.make_batch_reader(
        ds,
        batch_size=8,
        shuffle=False,
        schema_fields=["image_a"],
        predicate=even,
        predicate_fields=["id"],
        transform_spec=plus_one,
    ) as reader:
        batches = list(reader)
    assert all(b._fields == ("image_a",) for b in batches)
    got = np.concatenate([b.image_a[:, 0, 0] for b in batches])
    np.testing.assert_array_equal(got, np.arange(0, N, 2) % 256 + 1)
    with pytest.raises(ValueError, match="bool array of shape"):
        list(rowstore.make_reader(ds, predicate=lambda b: b["id"]))


def test_torch_dataloader_petastorm_names(ds):
    torch = pytest.importorskip("torch")
    import rowstore.torch as rst
    from rowstore.petastorm import DataLoader

    reader = rowstore.make_reader(
        ds, num_epochs=2, schema_fields=["id", "label"], predicate=lambda b: b["id"] < 30
    )
    with DataLoader(reader, batch_size=4) as loader:
        ids = [t for b in loader for t in b["id"].tolist()]
        assert isinstance(loader, rst.BatchedDataLoader)
    assert sorted(ids) == sorted(list(range(30)) * 2)
    with DataLoader(ds, batch_size=10, shuffle=True, fields=[SCHEMA["id"]]) as loader:
        assert sorted(torch.cat([b["id"] for b in loader]).tolist()) == list(range(N))
    with pytest.raises(ValueError, match="collate_fn"):
        DataLoader(ds, batch_size=4, collate_fn=lambda x: x)


def test_reader_accepts_petastorm_style_arguments(ds):
    with rowstore.open("file://" + ds) as r:
        block = [b["id"] for b in r.batches(10, shuffle="block", seed=2)]
        true = [b["id"] for b in r.batches(10, shuffle=True, seed=2)]
        assert all((a == b).all() for a, b in zip(block, true, strict=True))
        none = np.concatenate([b["id"] for b in r.batches(10, shuffle=False)])
        np.testing.assert_array_equal(none, np.arange(N))
        b = next(r.batches(5, shuffle=False, fields=[SCHEMA["image_a"], "id"]))
        assert sorted(b) == ["id", "image_a"]
        assert sorted(r.take([1, 2], fields=[SCHEMA["label"]])) == ["label", "label__null"]
    with pytest.raises(
        ValueError, match="absolute path"
    ):  # (other URLs go to the remote store: test_remote.py)
        rowstore.open("file://relative/ds")


# -- docs/petastorm.md, "Reading: plain Python": every row of the table, as written --------------
def _ids(reader):
    return [r.id for r in reader]


def test_table_epochs_shuffle_seed(ds):
    url = "file://" + ds
    # make_reader(url, num_epochs=1) | same (None: without end)
    with rowstore.make_reader(url, num_epochs=1) as reader:
        assert sorted(_ids(reader)) == list(range(N))
    with rowstore.make_reader(url, num_epochs=None) as reader:
        it = iter(reader)
        assert sorted(next(it).id for _ in range(3 * N)) == sorted(list(range(N)) * 3)
    # shuffle_row_groups=True / shuffle_rows | shuffle=True (block shuffle); Petastorm's names
    # accepted
    with rowstore.open(ds) as r:
        block = r.epoch_order(shuffle="block", seed=1).tolist()
    for kw in (
        {"shuffle": True},
        {"shuffle_row_groups": True},
        {"shuffle_rows": True},
        {},
        {"shuffle_row_groups": False, "shuffle_rows": True},
        {"shuffle": "block"},
    ):
        with rowstore.make_reader(url, seed=1, **kw) as reader:
            assert _ids(reader) == block, kw
    for kw in (
        {"shuffle": False},
        {"shuffle_row_groups": False},
        {"shuffle_row_groups": False, "shuffle_rows": False},
    ):
        with rowstore.make_reader(url, seed=1, **kw) as reader:
            assert _ids(reader) == list(range(N)), kw
    with rowstore.make_reader(url, shuffle="full", seed=1) as reader:
        assert sorted(_ids(reader)) == list(range(N))
    with pytest.raises(ValueError, match="not both"):
        rowstore.make_reader(url, shuffle=True, shuffle_rows=True)
    with pytest.raises(TypeError, match="shuffle_rows must be True or False"):
        rowstore.make_reader(url, shuffle_rows="yes")

    # seed= | same; the order is a pure function of (seed, epoch, layout, shard)
    def epochs(seed):
        with rowstore.make_reader(url, num_epochs=2, seed=seed, shuffle_rows=True) as reader:
            ids = _ids(reader)
        return ids[:N], ids[N:]

    assert epochs(7) == epochs(7) and epochs(7) != epochs(8) and epochs(7)[0] != epochs(7)[1]
    assert epochs(None) == epochs(0)  # no seed: seed 0, not a different order each run


def test_table_shards_fields_predicate_transform(ds):
    # cur_shard=k, shard_count=n | same: disjoint parts of each epoch
    parts = []
    for k in range(2):
        with rowstore.make_reader(ds, cur_shard=k, shard_count=2, seed=3) as reader:
            parts.append(_ids(reader))
    assert not set(parts[0]) & set(parts[1]) and sorted(parts[0] + parts[1]) == list(range(N))
    # schema_fields=[HelloWorldSchema.id, "image.*"] | names, regular expressions or Field objects
    with rowstore.make_reader(ds, schema_fields=[SCHEMA["id"], "image.*"]) as reader:
        assert next(iter(reader))._fields == ("id", "image_a", "image_b")
    # predicate=in_lambda(["id"], lambda id: id < 100) | predicate=lambda b: b["id"] < 100,
    # predicate_fields=
    with rowstore.make_reader(ds, predicate=lambda b: b["id"] < 10, shuffle=False) as reader:
        assert _ids(reader) == list(range(10))
    with rowstore.make_reader(
        ds,
        schema_fields=["label"],
        predicate=lambda b: b["id"] < 3,
        predicate_fields=["id"],
        shuffle=False,
    ) as reader:
        rows = list(reader)
    assert [r._fields for r in rows] == [("label",)] * 3 and [r.label for r in rows] == [None, 1, 2]
    # transform_spec=TransformSpec(func, ...) | same, per row, with its edit/removed/selected fields
    spec = rowstore.TransformSpec(
        lambda r: {**r, "twice": r["id"] * 2},
        edit_fields=[("twice", "int64", ())],
        removed_fields=["image_a", "image_b"],
    )
    with rowstore.make_reader(ds, transform_spec=spec, shuffle=False) as reader:
        rows = list(reader)
    assert rows[5]._fields == ("id", "label", "twice") and [r.twice for r in rows] == [
        2 * i for i in range(N)
    ]
    # workers_count=, reader_pool_type= | workers_count sets the reader threads; reader_pool_type is
    # ignored
    with rowstore.make_reader(
        ds, workers_count=2, reader_pool_type="process", shuffle=False
    ) as reader:
        assert reader.reader.num_threads == 2 and _ids(reader) == list(range(N))


def test_table_batch_reader_and_parquet(ds, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    # make_batch_reader(url) | rowstore.make_batch_reader(url, batch_size=...): named tuples of
    # arrays
    with rowstore.make_batch_reader(ds, batch_size=10, shuffle=False) as reader:
        batches = list(reader)
    assert batches[0]._fields == ("id", "image_a", "image_b", "label") and len(batches[0].id) == 10
    np.testing.assert_array_equal(np.concatenate([b.id for b in batches]), np.arange(N))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['filters'\]"):
        rowstore.make_batch_reader(ds, filters=[("id", "<", 3)])
    # make_batch_reader over a plain Parquet store | convert once: rowstore.from_parquet(url, out)
    pq.write_table(
        pa.table({"id": np.arange(20, dtype=np.int64), "x": np.linspace(0, 1, 20)}),
        str(tmp_path / "plain.parquet"),
    )
    url, out = str(tmp_path / "plain.parquet"), str(tmp_path / "plain.h5")
    rowstore.from_parquet(url, out)
    with rowstore.make_batch_reader(out, batch_size=8, shuffle=False) as reader:
        assert np.concatenate([b.id for b in reader]).tolist() == list(range(20))


def test_make_reader_of_an_s3_url(ds, s3_server, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    _, opts = s3_server
    fsspec.filesystem("s3", **opts).put(ds + "/", "rowstore/petastorm_idioms/", recursive=True)
    url = "s3://rowstore/petastorm_idioms"
    with rowstore.make_reader(url, storage_options=opts, shuffle_rows=True, seed=2) as reader:
        ids = _ids(reader)
    with rowstore.make_reader(ds, shuffle_rows=True, seed=2) as reader:
        assert ids == _ids(reader)
    with rowstore.make_batch_reader(
        url, storage_options=opts, batch_size=20, shuffle=False
    ) as reader:
        assert np.concatenate([b.id for b in reader]).tolist() == list(range(N))
    with rowstore.open(ds) as r, pytest.raises(ValueError, match="storage_options apply to a URL"):
        rowstore.make_reader(r, storage_options=opts)


# -- docs/petastorm.md, "Reading: PyTorch" and "Reading: TensorFlow": every row, as written -----
def test_table_pytorch(ds):
    torch = pytest.importorskip("torch")
    import rowstore.torch as rst
    from rowstore.petastorm import DataLoader

    def transform(row):  # a Petastorm-style row transform
        return {**row, "id": row["id"] + 1000}

    spec = rst.TransformSpec(transform, removed_fields=["image_b", "label"])

    # rowstore.petastorm.DataLoader(reader, batch_size): the reader's fields, shard, order,
    # predicate,
    # transform and num_epochs apply; collate_fn must be None; shuffling_queue_capacity is ignored
    def loader_ids(k, **kw):
        reader = rowstore.make_reader(
            ds, num_epochs=2, cur_shard=k, shard_count=2, seed=5, shuffle_rows=True, **kw
        )
        with DataLoader(reader, batch_size=4, shuffling_queue_capacity=100) as loader:
            got = list(loader)
        return got, torch.cat([b["id"] for b in got]).tolist()

    plain = [loader_ids(k)[1] for k in range(2)]
    n0 = (N + 1) // 2  # rows of rank 0 per epoch
    assert sorted(plain[0][:n0] + plain[1][: N - n0]) == list(range(N))  # disjoint parts of epoch 0
    for k in range(2):
        got, ids = loader_ids(k, predicate=lambda b: b["id"] % 2 == 0, transform_spec=spec)
        assert all(sorted(b) == ["id", "image_a"] for b in got)
        assert ids == [
            i + 1000 for i in plain[k] if i % 2 == 0
        ]  # the same order, filtered and transformed
    with pytest.raises(ValueError, match="collate_fn"):
        DataLoader(rowstore.make_reader(ds), batch_size=4, collate_fn=lambda rows: rows)
    # rowstore.torch.BatchedDataLoader(url, batch_size=..., transform=...)
    with rst.BatchedDataLoader(
        ds, batch_size=16, shuffle=False, fields=["id"], transform=lambda b: {"id": b["id"] * 2}
    ) as loader:
        assert torch.cat([b["id"] for b in loader]).tolist() == [2 * i for i in range(N)]
    # Petastorm's InMemBatchedDataLoader(url, batch_size=..., num_epochs=...): cache="memory"
    with rst.BatchedDataLoader(ds, batch_size=16, fields=["id"], cache="memory") as loader:
        assert sorted(torch.cat([b["id"] for b in loader]).tolist()) == list(range(N))
    # (num_epochs=None: without end; islice takes 3 epochs, so the test cannot run unbounded)
    with rst.BatchedDataLoader(
        ds, batch_size=16, fields=["id"], cache="memory", num_epochs=None
    ) as loader:
        with pytest.raises(TypeError, match="endless"):
            len(loader)
        ids = torch.cat([b["id"] for b in itertools.islice(loader, 3 * -(-N // 16))]).tolist()
    assert all(sorted(ids[e * N : (e + 1) * N]) == list(range(N)) for e in range(3))
    # rowstore.torch.TransformSpec(func, edit_fields=..., removed_fields=..., selected_fields=...)
    tspec = rst.TransformSpec(
        lambda b: {**b, "n": b["image_a"].sum(axis=(1, 2))},
        edit_fields=[("n", "int64", ())],
        removed_fields=["image_b"],
        selected_fields=["n", "id"],
    )
    with rst.BatchedDataLoader(ds, batch_size=8, shuffle=False, transform=tspec) as loader:
        b = next(iter(loader))
    assert list(b) == ["n", "id"] and b["n"].tolist() == [16 * i for i in range(8)]
    # variable-length fields | varlen="padded" (plus <name>__shape), "nested" or "list"
    for varlen in ("padded", "nested", "list"):
        with DataLoader(
            rowstore.make_reader(ds, schema_fields=["image_b"], shuffle=False),
            batch_size=6,
            varlen=varlen,
        ) as loader:
            b = next(iter(loader))
        if varlen == "padded":
            assert (
                b["image_b"].shape == (6, 2, 2)
                and b["image_b__shape"][:, 0].tolist() == [0, 1, 2] * 2
            )
        elif varlen == "nested":
            assert (
                b["image_b"].is_nested
                and [t.shape[0] for t in b["image_b"].unbind()] == [0, 1, 2] * 2
            )
        else:
            assert [t.shape for t in b["image_b"]] == [(i % 3, 2) for i in range(6)]


def test_table_tensorflow(ds):
    pytest.importorskip("tensorflow")
    import rowstore.tf as rtf

    # make_petastorm_dataset(reader) | rowstore.tf.make_dataset(url, batch_size=..., shuffle=...,
    # num_epochs=...)
    dataset = rtf.make_dataset(ds, batch_size=10, shuffle="block", num_epochs=2, fields=["id"])
    ids = [i for b in dataset for i in b["id"].numpy().tolist()]
    assert sorted(ids) == sorted(list(range(N)) * 2)


# -- docs/petastorm.md, "Generating a dataset" and "The Spark dataset converter", as written -----
@pytest.mark.xdist_group("spark")  # the one SparkSession, on one worker (--dist loadgroup)
def test_spark_sections_as_written(spark, tmp_path):
    pytest.importorskip("pyarrow")
    torch = pytest.importorskip("torch")
    import rowstore.spark as rsp

    sc = spark.sparkContext
    url, n = "file://" + str(tmp_path / "hello_world_dataset"), 10

    def row_generator(x):  # the README's
        return {
            "id": x,
            "image1": np.random.randint(0, 255, dtype=np.uint8, size=(128, 256, 3)),  # noqa: NPY002
            "array_4d": np.random.randint(0, 255, dtype=np.uint8, size=(4, 128, 30, 3)),  # noqa: NPY002
        }  # noqa: NPY002

    # the section's rowstore block
    HelloWorldSchema = Schema(
        [
            Field("id", "int32"),
            Field("image1", "uint8", (128, 256, 3), codec="png"),
            Field("array_4d", "uint8", (None, 128, 30, None)),
        ]
    )
    rows = (
        sc.parallelize(range(n)).map(row_generator).map(lambda x: rsp.to_row(HelloWorldSchema, x))
    )
    df = spark.createDataFrame(rows, rsp.spark_schema(HelloWorldSchema))
    rsp.to_rowstore(df, url, schema=HelloWorldSchema, shard_bytes=1 << 20, compression="lz4")
    with rowstore.make_reader(url, shuffle=False) as reader:
        got = list(reader)
    assert sorted(r.id for r in got) == list(range(n))
    assert all(r.image1.shape == (128, 256, 3) and r.array_4d.shape == (4, 128, 30, 3) for r in got)

    # the converter's rowstore block (make_converter(df, shard_bytes=..., compression=...))
    spark.conf.set(rsp.CACHE_DIR_CONF, "file://" + str(tmp_path / "cache"))
    try:
        frame = spark.range(0, 30, numPartitions=2).selectExpr("id", "cast(id as float) as x")
        converter = rsp.make_converter(frame, shard_bytes=1 << 16, compression="lz4")
    finally:
        spark.conf.unset(rsp.CACHE_DIR_CONF)
    assert len(converter) == converter.dataset_size == 30
    spec = rowstore.TransformSpec(lambda b: {**b, "x": b["x"] * 2})
    with converter.make_torch_dataloader(
        batch_size=32, num_epochs=1, transform_spec=spec
    ) as dataloader:
        b = next(iter(dataloader))
    assert torch.equal(b["x"], b["id"].float() * 2)
    pytest.importorskip("tensorflow")
    with converter.make_tf_dataset(batch_size=32, num_epochs=1) as dataset:
        assert sorted(np.concatenate([t["id"].numpy() for t in dataset]).tolist()) == list(
            range(30)
        )
    converter.delete()
    assert not os.path.exists(converter.path)


# -- docs/petastorm.md, "Existing Petastorm datasets and other Parquet", as written ---------------
def test_import_section_as_written(tmp_path):
    pytest.importorskip("pyarrow")
    import rowstore.petastorm

    src = os.path.join(DATA, "petastorm_hello")
    hello, h5 = str(tmp_path / "hello_rowstore"), str(tmp_path / "hello.h5")
    rowstore.petastorm.import_petastorm("file://" + src, hello)
    rowstore.from_parquet(src, h5)  # recognises the Unischema too
    with (
        rowstore.make_reader(hello, shuffle=False) as a,
        rowstore.make_reader(h5, shuffle=False) as b,
    ):
        assert a.schema == b.schema
        ra, rb = list(a), list(b)
    assert len(ra) == len(rb) > 0
    assert all(np.array_equal(x, y) for p, q in zip(ra, rb) for x, y in zip(p, q))
    assert main(["import-petastorm", "file://" + src, str(tmp_path / "cli_out")]) == 0


def test_parquet_with_png_bytes_as_written(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    Image = pytest.importorskip("PIL.Image")
    import io

    def png(a):
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        return buf.getvalue()

    images = [np.full((4, 6, 3), i, np.uint8) for i in range(5)]
    spark_output = tmp_path / "spark_output"
    spark_output.mkdir()
    pq.write_table(
        pa.table({"id": np.arange(5), "png_bytes": [png(a) for a in images]}),
        str(spark_output / "part-0.parquet"),
    )
    out = str(tmp_path / "out")
    rowstore.from_parquet(str(spark_output), out, dataset=True, payloads={"png_bytes": "png"})
    with rowstore.make_reader(out, shuffle=False) as reader:
        rows = list(reader)
    assert [r.id for r in rows] == list(range(5))
    assert all(np.array_equal(r.png_bytes, a) for r, a in zip(rows, images))
