"""The one location object: :func:`rowstore.storage.locate` gives a Location that the format layer
reads through, the same way for a local path and for a URL (here a ``file://`` URL read as an
object store, through the same client as ``s3://``)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema, storage
from rowstore.errors import FormatError, MissingObjectError
from rowstore.format import manifest
from rowstore.format.index import Layout
from rowstore.format.shards import DatasetLayout
from rowstore.storage.location import LocalLocation, RemoteLocation

SCHEMA = Schema([Field("x", "float32", (3,)), Field("text", "str")])


def _cols(n: int) -> dict:
    return {
        "x": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
        "text": [f"row {i}" * (i % 4) for i in range(n)],
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("location")
    one = str(d / "one.h5")
    with rowstore.Writer(one, SCHEMA, block_bytes=1024) as w:
        w.write_batch(_cols(200))
    ds = str(d / "ds")
    with rowstore.DatasetWriter(ds, SCHEMA, shard_bytes=3000, block_bytes=512) as w:
        w.write_batch(_cols(200))
    return one, ds


def both(path: str):
    """The local location of ``path`` and its ``file://`` URL read as an object store."""
    return [storage.locate(path), storage.locate("file://" + path, remote={})]


def test_locate_decides_once():
    assert isinstance(storage.locate("/data/x.h5"), LocalLocation)
    assert isinstance(storage.locate("file:///data/x.h5"), LocalLocation)  # no option: local
    assert storage.locate("file:///data/x.h5").path == "/data/x.h5"
    remote = storage.locate("s3://bucket/x.h5", {"anon": True})
    assert isinstance(remote, RemoteLocation) and not remote.local
    assert remote.options.storage_options == {"anon": True}
    many = storage.locate(["s3://bucket/a.h5", "s3://bucket/b.h5"])
    assert [type(w) for w in many] == [RemoteLocation, RemoteLocation]
    assert many[0].options is many[1].options


@pytest.mark.parametrize("kw", [{"storage_options": {}}, {"cache": "/tmp/c"}, {"remote": {}}])
def test_unused_options_are_refused_by_name(kw):
    with pytest.raises(ValueError, match=f"'{next(iter(kw))}' was provided but unused"):
        storage.locate("/data/x.h5", **kw)
    with pytest.raises(ValueError, match="apply to URLs"):
        rowstore.open("/data/x.h5", **kw)


def test_local_paths_and_urls_are_not_mixed():
    with pytest.raises(ValueError, match="local paths and URLs"):
        storage.locate(["/data/a.h5", "s3://bucket/b.h5"])


def test_locations_pickle_by_path_and_options(data):
    for where in both(data[0]):
        again = pickle.loads(pickle.dumps(where))
        assert type(again) is type(where) and again.path == where.path
        assert Layout.open(again).num_rows == 200


def test_small_reads_are_bounded_alike(data, tmp_path):
    one, ds = data
    for where in both(ds):
        p = where.join(manifest.POINTER)
        got = where.read_small(p, 1 << 16)
        assert got == open(os.path.join(ds, manifest.POINTER), "rb").read()
        with pytest.raises(FormatError, match="more than"):
            where.read_small(p, len(got) - 1)
        with pytest.raises(MissingObjectError):
            where.read_small(where.join("no-such-object"), 10)
        assert where.exists(p) and not where.exists(where.join("no-such-object"))
        assert manifest.POINTER in where.list()


def test_one_opener_for_paths_and_urls(data):
    one, ds = data
    files = [Layout.open(w) for w in both(one)]
    assert files[0].file_id[2] == files[1].file_id[0]  # the size; then inode or ETag
    for a, b in zip(files[0].blocks.tolist(), files[1].blocks.tolist()):
        assert a == b
    dsets = [DatasetLayout.open(w) for w in both(ds)]
    assert [d.location.local for d in dsets] == [True, False]
    assert dsets[0].num_rows == dsets[1].num_rows == 200
    assert np.array_equal(dsets[0].blocks, dsets[1].blocks)
    assert [
        type(d.shard_location().chunk_store(d.shard_paths, d.shard_ids)).__name__ for d in dsets
    ] == [
        "LocalStore",
        "RemoteStore",
    ]


def test_damage_reads_through_the_location(data, tmp_path):
    _, ds = data
    import shutil

    bad = str(tmp_path / "bad")
    shutil.copytree(ds, bad)
    L = DatasetLayout.open(bad)
    shard = L.shard_paths[1]
    off = int(L.blocks["offset"][L.shard_block0(1)])
    with open(shard, "r+b") as f:
        f.seek(off + 1)
        b = f.read(1)
        f.seek(off + 1)
        f.write(bytes([b[0] ^ 0xFF]))
    found = [DatasetLayout.open(w).damage() for w in both(bad)]
    assert [len(f) for f in found] == [1, 1]
    assert found[0][0].path == found[1][0].path.removeprefix("file://")
    assert found[0][0].block == found[1][0].block == 0


def test_layout_open_scans_with_scan_not_verify(data):
    """The eager read of every chunk is ``scan``; ``verify`` is not a second name for it."""
    one, _ = data
    assert Layout.open(one, scan=True).num_rows == 200
    with pytest.raises(TypeError, match="verify"):
        Layout.open(one, verify=True)


def test_a_file_is_scanned_through_its_location(data, tmp_path):
    import shutil

    one, _ = data
    bad = str(tmp_path / "bad.h5")
    shutil.copyfile(one, bad)
    off = int(Layout.open(bad).blocks["offset"][2])
    with open(bad, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    for where in both(bad):
        L = Layout.open(where)
        assert [e.block for e in L.damage(location=where)] == [2]
        with pytest.raises(FormatError, match="block 2"):
            Layout.open(where, scan=True)
