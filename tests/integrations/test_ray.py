"""Ray Data writes shards in its tasks and commits once on the driver; a Datasource reads a
dataset back by shard and block range, ndarray cells as tensor columns."""

from __future__ import annotations

import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import rowstore  # noqa: E402
from rowstore import Field, Schema  # noqa: E402
from rowstore.errors import FormatError, RowValidationError, SchemaError  # noqa: E402
from rowstore.ray import RowstoreDatasource, read_rowstore, to_rowstore  # noqa: E402

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("ray_cluster")]


def items(n=24, start=0):
    """Rows of every field kind: scalars, fixed arrays, 1-D and 2-D variable arrays, str,
    bytes."""
    out = []
    for i in range(start, start + n):
        out.append(
            {
                "i": i,
                "f": i / 4,
                "flag": i % 3 == 0,
                "x": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
                "v": np.arange(i % 5 + 1, dtype=np.int16) * i,
                "m": np.full((i % 3 + 1, 2), i, dtype=np.float64),
                "s": f"row-{i}-é" * (i % 4),
                "b": bytes(range(i % 7)),
            }
        )
    return out


def assert_rows_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            if isinstance(w[k], np.ndarray):
                np.testing.assert_array_equal(np.asarray(g[k]), w[k], err_msg=k)
                assert np.asarray(g[k]).dtype == w[k].dtype, k
            else:
                assert g[k] == w[k], k


def reader_rows(path):
    with rowstore.Reader(path) as r:
        return [r[i] for i in range(len(r))]


def manifests(path):
    d = os.path.join(path, "_manifests")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_round_trip_of_every_field_kind(tmp_path):
    path = str(tmp_path / "ds")
    want = items()
    ds = ray.data.from_items(want, override_num_blocks=4)
    assert to_rowstore(ds, path) == 1
    with rowstore.Reader(path) as r:
        s = r.schema
        assert r.layout.num_shards == 4  # one shard per block (write task)
    assert s["i"].dtype == np.int64 and s["f"].dtype == np.float64 and s["flag"].dtype == bool
    assert (s["x"].dtype, s["x"].shape) == (np.float32, (2, 3))
    assert (s["v"].dtype, s["v"].shape) == (np.int16, (None,))
    assert (s["m"].dtype, s["m"].shape) == (np.float64, (None, None))
    assert s["s"].dtype == rowstore.STR and s["b"].dtype == rowstore.BYTES
    assert not any(f.nullable for f in s)
    assert_rows_equal(reader_rows(path), want)  # in the dataset's order

    back = read_rowstore(path)
    assert back.count() == len(want)
    types = dict(zip(back.schema().names, map(str, back.schema().types)))
    assert "ArrowTensorType" in types["x"] and "(2, 3)" in types["x"]
    assert "VariableShaped" in types["v"] and "VariableShaped" in types["m"]
    assert_rows_equal(back.take_all(), want)  # the reader's "none" order
    # numpy batches: fixed-shape fields stacked, variable ones arrays of arrays
    batch = next(iter(back.iter_batches(batch_size=5, batch_format="numpy")))
    assert batch["x"].shape == (5, 2, 3) and batch["x"].dtype == np.float32
    np.testing.assert_array_equal(batch["m"][4], want[4]["m"])


def test_read_tasks_by_shard_and_block_range(tmp_path):
    path = str(tmp_path / "ds")
    want = items(40)
    to_rowstore(ray.data.from_items(want, override_num_blocks=2), path, rows_per_block=4)
    src = RowstoreDatasource(path)
    tasks = src.get_read_tasks(100)
    assert [t.metadata.num_rows for t in tasks] == [20, 20]  # one per shard
    fine = RowstoreDatasource(path, blocks_per_task=2).get_read_tasks(100)
    assert [t.metadata.num_rows for t in fine] == [8, 8, 4] * 2  # never across a shard
    assert [t.metadata.num_rows for t in RowstoreDatasource(path).get_read_tasks(1)] == [40]
    back = read_rowstore(path, blocks_per_task=2, fields=["i", "s"])
    assert back.schema().names == ["i", "s"]
    assert back.take_all() == [{"i": r["i"], "s": r["s"]} for r in want]
    with pytest.raises(SchemaError, match="nope"):
        RowstoreDatasource(path, fields=["i", "nope"])


def test_single_file_and_nulls(tmp_path):
    f = str(tmp_path / "one.h5")
    schema = Schema(
        [
            Field("k", "int32", nullable=True),
            Field("t", rowstore.STR, nullable=True),
            Field("a", "float32", (3,), nullable=True),
        ]
    )
    with rowstore.Writer(f, schema) as w:
        for i in range(6):
            null = i % 2 == 1
            w.write(
                {
                    "k": None if null else i,
                    "t": None if null else str(i),
                    "a": None if null else np.full(3, i, np.float32),
                }
            )
    rows = read_rowstore(f).take_all()
    assert [r["k"] for r in rows] == [0, None, 2, None, 4, None]
    assert [r["t"] for r in rows] == ["0", None, "2", None, "4", None]
    assert [bool(r["a__null"]) for r in rows] == [False, True] * 3
    np.testing.assert_array_equal(rows[2]["a"], np.full(3, 2, np.float32))

    # and back into a dataset: nullable where a column holds a null (nullable="data")
    out = str(tmp_path / "again")
    to_rowstore(read_rowstore(f, fields=["k", "t"]), out)
    with rowstore.Reader(out) as r:
        assert r.schema["k"].nullable and r.schema["t"].nullable
        assert [r[i]["k"] for i in range(6)] == [0, None, 2, None, 4, None]


def test_appending_a_version(tmp_path):
    path = str(tmp_path / "ds")
    first, more = items(10), items(7, start=10)
    assert to_rowstore(ray.data.from_items(first, override_num_blocks=2), path) == 1
    assert to_rowstore(ray.data.from_items(more, override_num_blocks=3), path, mode="a") == 2
    assert_rows_equal(reader_rows(path), first + more)
    with rowstore.Reader(path, version=1) as r:
        assert len(r) == 10
    assert_rows_equal(read_rowstore(path, version=1).take_all(), first)
    with pytest.raises(FileExistsError):
        to_rowstore(ray.data.from_items(more), path, mode="x")


def test_failed_task_commits_nothing(tmp_path):
    path = str(tmp_path / "ds")

    def boom(batch):
        if (batch["i"] >= 30).any():
            raise RuntimeError("task failed on purpose")
        return batch

    bad = ray.data.from_items(items(40), override_num_blocks=4).map_batches(boom)
    with pytest.raises(Exception, match="task failed on purpose"):
        to_rowstore(bad, path, nullable=())
    assert not os.path.exists(os.path.join(path, "rowstore.json"))  # no version published
    with pytest.raises(FormatError, match="no rowstore.json"):
        rowstore.Reader(path)

    # over a dataset: the current version stays the one readers see
    to_rowstore(ray.data.from_items(items(5)), path)
    before = manifests(path)
    with pytest.raises(Exception, match="task failed on purpose"):
        to_rowstore(bad, path, mode="a", nullable=())
    assert manifests(path) == before
    assert_rows_equal(reader_rows(path), items(5))


def test_bad_input_names_field_and_row(tmp_path):
    path = str(tmp_path / "ds")
    rows = items(6)
    rows[4]["i"] = None  # a null where the field is not nullable
    ds = ray.data.from_items(rows, override_num_blocks=1)
    with pytest.raises(RowValidationError) as info:
        to_rowstore(ds, path, nullable=())
    assert "'i'" in str(info.value) and "row 4" in str(info.value)
    assert (info.value.field, info.value.row) == ("i", 4)
    assert not os.path.exists(os.path.join(path, "rowstore.json"))
    rows = items(12)
    rows[9]["i"] = None  # in the task's third shard: the row still counts from its first
    with pytest.raises(RowValidationError, match="row 9") as info:
        to_rowstore(
            ray.data.from_items(rows, override_num_blocks=1), path, nullable=(), shard_bytes=300
        )
    assert (info.value.field, info.value.row) == ("i", 9)
    to_rowstore(ray.data.from_items(items(12), override_num_blocks=1), path, shard_bytes=300)
    with rowstore.Reader(path) as r:
        assert sum(r.layout.shard_rows[:2]) <= 9  # row 9 is in the third shard or later

    # a schema that does not fit the columns is refused on the driver
    good = ray.data.from_items(items(4))
    to_rowstore(good, path)
    with rowstore.Reader(path) as r:
        schema = Schema([Field("s", "int64") if f.name == "s" else f for f in r.schema])
    with pytest.raises(SchemaError, match="column 's' is string, but field 's' is int64"):
        to_rowstore(good, path, schema=schema)
    with pytest.raises(SchemaError, match="nope"):
        to_rowstore(good, path, nullable=["nope"])


def test_explicit_schema(tmp_path):
    path = str(tmp_path / "ds")
    want = items(8)
    schema = Schema(
        [
            Field("i", "int32"),
            Field("f", "float32"),
            Field("flag", "bool"),
            Field("x", "float32", (None, 3)),  # stored variable although Ray's is fixed
            Field("v", "int16", (None,)),
            Field("m", "float64", (None, 2)),
            Field("s", rowstore.STR, nullable=True),
            Field("b", rowstore.BYTES),
        ]
    )
    to_rowstore(ray.data.from_items(want, override_num_blocks=2), path, schema=schema)
    with rowstore.Reader(path) as r:
        assert r.schema == schema
        got = [r[i] for i in range(len(r))]
    assert [int(g["i"]) for g in got] == [w["i"] for w in want]
    np.testing.assert_array_equal(got[5]["m"], want[5]["m"])
    np.testing.assert_array_equal(got[3]["x"], want[3]["x"])


def test_iter_torch_batches(tmp_path):
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "ds")
    want = items(20)
    to_rowstore(ray.data.from_items(want, override_num_blocks=3), path)
    back = read_rowstore(path, fields=["x", "i", "f"])
    seen = []
    for b in back.iter_torch_batches(batch_size=8, drop_last=False):
        assert isinstance(b["x"], torch.Tensor) and b["x"].dtype == torch.float32
        assert b["x"].shape[1:] == (2, 3) and b["i"].dtype == torch.int64
        seen += b["i"].tolist()
        np.testing.assert_array_equal(b["x"].numpy(), np.stack([want[i]["x"] for i in b["i"]]))
    assert seen == list(range(20))


def test_s3_round_trip(tmp_path, s3_server):
    pytest.importorskip("s3fs")
    _, opts = s3_server
    url = "s3://rowstore/ray_round_trip"
    want = items(12)
    ds = ray.data.from_items(want, override_num_blocks=3)
    assert to_rowstore(ds, url, storage_options=opts) == 1
    with rowstore.Reader(url, storage_options=opts) as r:
        assert r.layout.num_shards == 3
    assert_rows_equal(read_rowstore(url, storage_options=opts).take_all(), want)


def test_sliced_tensor_columns_convert_as_their_rows():
    """Ray hands a task slices of blocks: the tensor columns' offsets are honoured."""
    from ray.data.extensions import ArrowTensorArray

    from rowstore.arrow import _cells
    from rowstore.ray import plain_array

    cells = np.empty(5, dtype=object)
    cells[:] = [np.arange(k * 2, dtype=np.float32).reshape(k, 2) for k in (1, 3, 2, 4, 1)]
    ragged = ArrowTensorArray.from_numpy(cells)
    fixed_values = np.arange(30).reshape(5, 2, 3)
    fixed = ArrowTensorArray.from_numpy(fixed_values)
    for a, b in [(0, 5), (1, 4), (2, 5), (4, 5)]:
        got = _cells(plain_array(ragged.slice(a, b - a)), "m", 0)
        assert len(got) == b - a
        for g, w in zip(got, cells[a:b]):
            np.testing.assert_array_equal(g, w)
        got = _cells(plain_array(fixed.slice(a, b - a)), "x", 0, stack=True)
        np.testing.assert_array_equal(got, fixed_values[a:b])


def test_an_empty_dataset_is_an_empty_version(tmp_path):
    path = str(tmp_path / "ds")
    from ray.data.expressions import col

    empty = ray.data.from_items(items(4), override_num_blocks=2).filter(expr=col("i") < 0)
    assert to_rowstore(empty, path, nullable=()) == 1
    with rowstore.Reader(path) as r:
        assert len(r) == 0 and r.schema["x"].shape == (2, 3)
    assert read_rowstore(path).take_all() == []
