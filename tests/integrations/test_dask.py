"""Dask writes shards on the workers and commits once; reads back lazily with known divisions."""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

import dask  # noqa: E402
from dask.delayed import Delayed  # noqa: E402
from test_pandas import assert_frames_equal, speech_frame  # noqa: E402

import rowstore  # noqa: E402
from rowstore.dask import read_rowstore, to_rowstore  # noqa: E402
from rowstore.errors import RowValidationError, SchemaError  # noqa: E402
from rowstore.pandas import from_pandas, read_pandas  # noqa: E402

pytestmark = pytest.mark.xdist_group("dask")


@pytest.fixture(scope="module")
def client(dask_cluster):
    """A client of the session's LocalCluster (conftest.py) for the module."""
    with distributed.Client(dask_cluster) as c:
        yield c


def frame(n=60):
    df = speech_frame(n)
    df["transcript"] = df["transcript"].astype(object)  # object column: one describing pass
    return df


def to_ddf(df, npartitions):
    """Without dask's string conversion, which would make ndarray cells strings."""
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(df, npartitions=npartitions)


def manifests(path):
    """The manifest versions' files, and the pointer's bytes (what a reader opens)."""
    d = os.path.join(path, "_manifests")
    pointer = os.path.join(path, "rowstore.json")
    return (
        sorted(os.listdir(d)) if os.path.isdir(d) else [],
        open(pointer, "rb").read() if os.path.exists(pointer) else None,
    )


@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_local_schedulers_round_trip(tmp_path, scheduler):
    df = frame()
    path = str(tmp_path / "ds")
    with dask.config.set(scheduler=scheduler):
        version = to_rowstore(to_ddf(df, 4), path, rows_per_block=4)
        assert version == 1
        with rowstore.open(path) as r:
            assert r.layout.num_shards == 4
        assert_frames_equal(df, read_pandas(path))
        back = read_rowstore(path)
        assert back.npartitions == 4 and back.known_divisions
        assert_frames_equal(df, back.compute())
        by_blocks = read_rowstore(path, blocks_per_partition=2, fields=["wave", "dur"])
        assert by_blocks.npartitions > 4 and by_blocks.known_divisions
        assert_frames_equal(df[["wave", "dur"]], by_blocks.compute())
        assert by_blocks.loc[10:20].compute()["dur"].tolist() == df.loc[10:20, "dur"].tolist()


def test_distributed_cluster_same_rows_as_sequential(tmp_path, client):
    df = frame(90)
    seq = str(tmp_path / "seq.h5")
    from_pandas(df, seq)
    path = str(tmp_path / "ds")
    to_rowstore(to_ddf(df, 6), path)
    assert_frames_equal(read_pandas(seq), read_pandas(path))
    assert_frames_equal(read_pandas(path), read_rowstore(path).compute())
    lazy = to_rowstore(to_ddf(df, 3), path, compute=False, mode="a")
    assert isinstance(lazy, Delayed) and manifests(path)[0][-1] == "v00000001.json"
    assert lazy.compute() == 2
    assert len(read_pandas(path)) == 180


def _explode(df):
    if (df["dur"] > 2).any():
        raise RuntimeError("injected failure")
    return df


def test_failed_partition_leaves_no_new_manifest(tmp_path, client):
    df = frame(40)
    path = str(tmp_path / "ds")
    to_rowstore(to_ddf(df, 2), path)
    before = manifests(path)
    bad = df.copy()
    bad.loc[35, "dur"] = 5.0
    ddf = to_ddf(bad, 4).map_partitions(_explode, meta=bad.iloc[:0])
    with pytest.raises(RuntimeError, match="injected"):
        to_rowstore(ddf, path)
    assert manifests(path) == before
    assert_frames_equal(df, read_pandas(path))  # the previous version, whole


def test_bad_cells_and_partition_conflicts(tmp_path):
    df = pd.DataFrame(
        {
            "w": pd.Series(
                [np.zeros(2, np.float32)] * 3 + [np.zeros(2, np.float64)] * 3, dtype=object
            )
        }
    )
    with dask.config.set(scheduler="sync"):
        with pytest.raises(SchemaError, match="column 'w': partition 1 holds"):
            to_rowstore(to_ddf(df, 2), str(tmp_path / "a"))
        schema = rowstore.Schema(
            [rowstore.Field("w", "float32", (2,)), rowstore.Field("index", "int64")]
        )
        with pytest.raises(RowValidationError, match="field 'w'"):
            to_rowstore(
                to_ddf(df.iloc[:3], 1),
                str(tmp_path / "b"),
                schema=rowstore.Schema([rowstore.Field("w", "int8", (2,)), schema["index"]]),
            )
        assert manifests(str(tmp_path / "b")) == ([], None)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_large_partition_split_into_shards_in_order(tmp_path, scheduler):
    df = frame(200)
    path = str(tmp_path / "ds")
    with dask.config.set(scheduler=scheduler):
        to_rowstore(to_ddf(df, 2), path, shard_bytes=3000, rows_per_block=8)
    infos = json.load(open(os.path.join(path, "_manifests", "v00000001.json")))["shards"]
    assert len(infos) > 4
    from rowstore.format import spec

    with rowstore.open(path) as r:
        itemsize = spec.row_dtype(r.schema).itemsize
        assert sum(r.layout.shard_rows) == 200
    for s in infos:
        assert s["rows"] * itemsize + s["heap_nbytes"] <= 3000 or s["rows"] == 1
    assert_frames_equal(df, read_pandas(path))  # the same rows, in order
    back = read_rowstore(path)
    assert back.npartitions == len(infos) and back.known_divisions
    assert_frames_equal(df, back.compute())


def test_shard_bytes_below_one_row_gives_a_shard_per_row(tmp_path):
    df = frame(7)
    path = str(tmp_path / "ds")
    with dask.config.set(scheduler="sync"):
        to_rowstore(to_ddf(df, 1), path, shard_bytes=1)
    with rowstore.open(path) as r:
        assert list(r.layout.shard_rows) == [1] * 7
    assert_frames_equal(df, read_pandas(path))


def test_failure_in_a_later_slice_removes_the_partitions_shards(tmp_path):
    w = [np.zeros(2, np.float32)] * 30 + [np.zeros(3, np.float32)]
    df = pd.DataFrame({"w": pd.Series(w, dtype=object)})
    schema = rowstore.Schema(
        [rowstore.Field("w", "float32", (2,)), rowstore.Field("index", "int64")]
    )
    path = str(tmp_path / "ds")
    with dask.config.set(scheduler="sync"), pytest.raises(RowValidationError, match="field 'w'"):
        to_rowstore(to_ddf(df, 1), path, schema=schema, shard_bytes=64)
    assert manifests(path) == ([], None)
    assert os.listdir(os.path.join(path, "shards")) == []


def test_process_scheduler_round_trip(tmp_path):
    """Dask's multiprocessing scheduler: the partitions pickled to spawned processes, the
    ShardInfos back (one pool for both writes: starting one takes seconds)."""
    df = frame(40)
    path = str(tmp_path / "ds")
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        with dask.config.set(scheduler="processes", pool=pool):
            assert to_rowstore(to_ddf(df, 4), path) == 1
        lazy = to_rowstore(to_ddf(df, 2), path, mode="a", compute=False, shard_bytes=2000)
        assert lazy.compute(scheduler="processes", pool=pool) == 2
    with rowstore.open(path) as r:
        assert r.layout.num_shards > 6
    assert_frames_equal(pd.concat([df, df]), read_pandas(path))


def test_a_given_schema_writes_without_the_describing_pass(tmp_path):
    """With schema= the partitions are computed once: each is counted when it is built."""
    df = frame(40)
    calls = []

    def part(i):
        calls.append(i)
        return df.iloc[i * 10 : (i + 1) * 10]

    with dask.config.set({"dataframe.convert-string": False}):
        ddf = dd.from_map(part, range(4), meta=df.iloc[:0], enforce_metadata=False)
    inferred, given = str(tmp_path / "inferred"), str(tmp_path / "given")
    with dask.config.set(scheduler="sync"):
        to_rowstore(ddf, inferred)
        assert sorted(calls) == [0, 0, 1, 1, 2, 2, 3, 3]  # described, then written
        with rowstore.open(inferred) as r:
            schema = r.schema
        calls.clear()
        assert to_rowstore(ddf, given, schema=schema) == 1
    assert sorted(calls) == [0, 1, 2, 3]  # once each
    assert_frames_equal(df, read_pandas(given))
    assert_frames_equal(read_pandas(inferred), read_pandas(given))


# -- Dask's default string conversion ("dataframe.convert-string") ------------------------------
def seed_frame(n=8):
    """Weather-like rows: an ndarray-cell column, a list-cell column, scalars and text."""
    return pd.DataFrame(
        {
            "foo": [np.arange(6.0).reshape(2, 3) + i for i in range(n)],
            "bar": [list(range(i % 3 + 1)) for i in range(n)],
            "baz": np.arange(n, dtype=np.float64),
            "name": [f"row{i}" for i in range(n)],
        }
    )


def assert_seed_back(df, back):
    assert back["foo"].dtype == object and back["bar"].dtype == object
    for a, b in zip(df["foo"], back["foo"]):
        assert isinstance(b, np.ndarray) and b.dtype == np.float64 and np.array_equal(a, b)
    assert [list(b) for b in back["bar"]] == list(df["bar"])
    assert back["baz"].tolist() == df["baz"].tolist() and list(back["name"]) == list(df["name"])


@pytest.mark.parametrize("scheduler", ["sync", "distributed"])
def test_ndarray_cells_survive_default_string_conversion(tmp_path, scheduler, request):
    """The plain recipe (``dd.from_pandas`` with Dask's defaults, which make ndarray and list
    cells strings) writes the arrays, not their str."""
    df = seed_frame()
    path = str(tmp_path / "ds")
    with dask.config.set({"dataframe.convert-string": True}):
        ddf = dd.from_pandas(df, npartitions=2)
        assert str(ddf.dtypes["foo"]) != "object"  # Dask's conversion is on for this frame
        if scheduler == "distributed":
            request.getfixturevalue("client")
            to_rowstore(ddf, path)
        else:
            with dask.config.set(scheduler="sync"):
                to_rowstore(ddf[["foo", "bar", "baz", "name"]].repartition(npartitions=1), path)
    assert_seed_back(df, read_pandas(path))


def test_array_text_without_its_source_is_refused(tmp_path):
    """A converted frame whose pandas source is gone (persisted): its array text is refused,
    naming the column and the setting, and nothing is committed."""
    df = seed_frame()
    path = str(tmp_path / "ds")
    with dask.config.set({"dataframe.convert-string": True, "scheduler": "sync"}):
        lost = dd.from_pandas(df, npartitions=2).persist()
        with pytest.raises(
            SchemaError,
            match=r"column 'foo' holds text that reads as the str of arrays.*"
            r"rowstore.dask.from_pandas.*'dataframe.convert-string': False",
        ):
            to_rowstore(lost[["baz", "foo"]], path)
        assert manifests(path) == ([], None)
        with pytest.raises(SchemaError, match="column 'bar'"):
            to_rowstore(lost[["bar"]], path)
        # A schema that stores the column as a number cannot take the text either...
        schema = rowstore.Schema(
            [rowstore.Field("baz", "float64"), rowstore.Field("foo", "float64", (2, 3))]
        )
        with pytest.raises(
            SchemaError, match="column 'foo' holds a string column, which schema= stores as"
        ):
            to_rowstore(lost[["baz", "foo"]], path, schema=schema, index=False)
        # ...and one that says str stores it as the text it is.
        schema = rowstore.Schema(
            [rowstore.Field("baz", "float64"), rowstore.Field("foo", rowstore.STR, nullable=True)]
        )
        to_rowstore(lost[["baz", "foo"]], path, schema=schema, index=False)
        assert list(read_pandas(path)["foo"]) == [str(a) for a in df["foo"]]
        # Text that is not array-like passes as before.
        to_rowstore(lost[["name"]], str(tmp_path / "names"))
        assert list(read_pandas(str(tmp_path / "names"))["name"]) == list(df["name"])


def test_from_pandas_keeps_object_columns(tmp_path):
    from rowstore.dask import from_pandas as dask_from_pandas

    df = seed_frame()
    with dask.config.set({"dataframe.convert-string": True, "scheduler": "sync"}):
        ddf = dask_from_pandas(df, npartitions=3).persist()  # persisted: no source to rebuild from
        assert ddf.dtypes["foo"] == np.dtype(object) and ddf.npartitions == 3
        to_rowstore(ddf, str(tmp_path / "ds"))
    assert_seed_back(df, read_pandas(str(tmp_path / "ds")))


def test_a_partition_of_empty_lists_takes_the_dtype_of_the_others(tmp_path):
    """``[]`` fixes no dtype in a partition either: one holding only empty lists does not
    conflict with another's int64 cells (in either order)."""
    for cells in ([[], [], [1, 2], [3]], [[1, 2], [3], [], []]):
        df = pd.DataFrame({"x": cells})
        path = str(tmp_path / f"ds{len(os.listdir(tmp_path))}")
        with dask.config.set(scheduler="sync"):
            to_rowstore(to_ddf(df, 2), path)
        back = read_pandas(path)
        assert [c.tolist() for c in back["x"]] == cells and all(
            c.dtype == np.int64 for c in back["x"]
        )
        with rowstore.open(path) as r:
            assert "dtype_guessed" not in json.dumps(r.layout.user_attrs)
