"""Writing to object storage (a real moto S3 server and a GCS emulator): Writer, DatasetWriter
and write_shard + commit with s3:// and gs:// URLs; what is committed reads back equal; a failed
commit leaves the previous version current and readable."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import FormatError

fsspec = pytest.importorskip("fsspec")

SCHEMA = Schema([Field("x", "float32", (4,)), Field("label", "int64"), Field("text", "str")])


def _cols(a: int, n: int) -> dict:
    return {
        "x": np.arange(a * 4, (a + n) * 4, dtype=np.float32).reshape(n, 4),
        "label": np.arange(a, a + n, dtype=np.int64),
        "text": [f"t{i}" for i in range(a, a + n)],
    }


def _labels(r) -> np.ndarray:
    return r.take(np.arange(len(r)))["label"]


def _fs(root: str, so: dict):
    return fsspec.filesystem(root.split("://", 1)[0], **so)


def test_writer_uploads_a_file(object_store):
    root, so = object_store
    with rowstore.Writer(f"{root}/w/one.h5", SCHEMA, storage_options=so, block_bytes=4096) as w:
        w.write_batch(_cols(0, 700))
    r = rowstore.open(f"{root}/w/one.h5", storage_options=so)
    assert np.array_equal(_labels(r), np.arange(700)) and r[5]["text"] == "t5"
    fs = _fs(root, so)
    with pytest.raises(RuntimeError):
        with rowstore.Writer(f"{root}/w/two.h5", SCHEMA, storage_options=so) as w:
            w.write_batch(_cols(0, 10))
            raise RuntimeError("job failed")
    assert not fs.exists("rowstore/w/two.h5")  # nothing uploaded


def test_dataset_writer_and_append(object_store):
    root, so = object_store
    url = f"{root}/w/ds"
    with rowstore.DatasetWriter(
        url, SCHEMA, storage_options=so, shard_bytes=8000, block_bytes=2048
    ) as w:
        w.write_batch(_cols(0, 1000))
    r = rowstore.open(url, storage_options=so)
    assert (
        r.layout.num_shards > 2
        and r.layout.version == 1
        and np.array_equal(_labels(r), np.arange(1000))
    )
    with rowstore.DatasetWriter(
        url, mode="a", storage_options=so, shard_bytes=8000, block_bytes=2048
    ) as w:
        w.write_batch(_cols(1000, 300))
    r = rowstore.open(url, storage_options=so)
    assert r.layout.version == 2 and np.array_equal(_labels(r), np.arange(1300))
    assert np.array_equal(
        _labels(rowstore.open(url, storage_options=so, version=1)), np.arange(1000)
    )
    with pytest.raises(FileExistsError):
        rowstore.DatasetWriter(url, SCHEMA, mode="x", storage_options=so)


def _worker(args):
    url, so, k = args
    return rowstore.write_shard(
        url, SCHEMA, _cols(k * 200, 200), storage_options=so, block_bytes=2048
    )


def test_shards_from_several_processes_then_commit(object_store):
    """write_shard in 3 forked processes (each makes its own client), one commit: readable, in
    order; a failed commit (a shard that is not there) leaves the previous version current."""
    root, so = object_store
    url = f"{root}/w/par"
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        infos = pool.map(_worker, [(url, so, k) for k in range(3)])
    assert rowstore.commit(url, infos, storage_options=so) == 1
    r = rowstore.open(url, storage_options=so)
    assert np.array_equal(_labels(r), np.arange(600)) and r.layout.num_shards == 3
    more = _worker((url, so, 3))
    gone = rowstore.write_shard(url, SCHEMA, _cols(0, 5), storage_options=so)
    _fs(root, so).rm_file(f"rowstore/w/par/{gone.path}")
    with pytest.raises(FormatError, match="missing"):
        rowstore.commit(url, [more, gone], mode="a", storage_options=so)
    r = rowstore.open(url, storage_options=so)
    assert r.layout.version == 1 and np.array_equal(_labels(r), np.arange(600))
    assert rowstore.commit(url, [more], mode="a", storage_options=so) == 2
    assert np.array_equal(_labels(rowstore.open(url, storage_options=so)), np.arange(800))


def test_commit_failing_at_the_pointer_leaves_the_previous_version(s3_server):
    """A proxy refusing (503) every PUT of the pointer: the commit fails after its retries with
    the new sidecar and manifest uploaded, the previous version stays current and readable, and
    the next commit publishes past the orphaned version."""
    from _servers import FaultProxy, s3_options

    endpoint, so = s3_server
    url = "s3://rowstore/w/fail"
    first = rowstore.write_shard(url, SCHEMA, _cols(0, 100), storage_options=so)
    assert rowstore.commit(url, [first], storage_options=so) == 1
    proxy = FaultProxy(
        endpoint.split("://", 1)[1],
        every_request=True,
        fault=lambda n, head: (
            "503" if head.startswith(b"PUT ") and b"rowstore.json" in head else None
        ),
    )
    try:
        second = rowstore.write_shard(
            url, SCHEMA, _cols(100, 50), storage_options=s3_options(proxy.url)
        )
        with pytest.raises(rowstore.RowstoreError, match="rowstore.json"):
            rowstore.commit(url, [second], mode="a", storage_options=s3_options(proxy.url))
        assert proxy.injected >= 2
    finally:
        proxy.close()
    fs = fsspec.filesystem("s3", **so)
    assert fs.exists(
        "rowstore/w/fail/_manifests/v00000002.json"
    )  # uploaded before the pointer failed
    r = rowstore.open(url, storage_options=so)
    assert r.layout.version == 1 and np.array_equal(_labels(r), np.arange(100))
    assert rowstore.commit(url, [second], mode="a", storage_options=so) == 3
    assert np.array_equal(_labels(rowstore.open(url, storage_options=so)), np.arange(150))
