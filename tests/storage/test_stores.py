"""The storage conformance suites (:mod:`conformance`) run against local disk, a moto S3 server,
a GCS emulator and an HTTP server (read-only: its chunk store only)."""

from __future__ import annotations

import itertools

import pytest
from conformance import ChunkStoreTests, DestinationTests, dataset_dir

from rowstore import storage
from rowstore.format.open import open_layout
from rowstore.storage.localdir import LocalDir
from rowstore.storage.remote import RemoteDir

_PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> str:
    return dataset_dir(str(tmp_path_factory.mktemp("conformance")))


# -- local disk ------------------------------------------------------------------------------
class TestLocalDir(DestinationTests):
    @pytest.fixture
    def dest(self, tmp_path):
        d = storage.destination(str(tmp_path / "dest"))
        assert isinstance(d, LocalDir)
        return d


class TestLocalStore(ChunkStoreTests):
    @pytest.fixture
    def served(self, local_dataset):
        return open_layout(local_dataset), local_dataset


# -- S3 (moto) -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_dataset(local_dataset, s3_server):
    fsspec = pytest.importorskip("fsspec")
    pytest.importorskip("s3fs")
    _, so = s3_server
    fsspec.filesystem("s3", **so).put(
        local_dataset + "/", "rowstore/conformance/ds/", recursive=True
    )
    return "s3://rowstore/conformance/ds", so


class TestS3Dir(DestinationTests):
    @pytest.fixture
    def dest(self, s3_server):
        pytest.importorskip("s3fs")
        _, so = s3_server
        d = storage.destination(f"s3://rowstore/dest-{next(_PREFIXES)}", so)
        assert isinstance(d, RemoteDir) and d.conditional
        return d


class TestS3Store(ChunkStoreTests):
    @pytest.fixture
    def served(self, s3_dataset, local_dataset):
        url, so = s3_dataset
        return open_layout(url, storage_options=so), local_dataset


# -- GCS (gcp-storage-emulator) ------------------------------------------------------------------
@pytest.fixture(scope="module")
def gcs_dataset(local_dataset, gcs_server):
    import fsspec

    _, so = gcs_server
    fsspec.filesystem("gs", **so).put(
        local_dataset + "/", "rowstore/conformance/ds/", recursive=True
    )
    return "gs://rowstore/conformance/ds", so


class TestGCSDir(DestinationTests):
    @pytest.fixture
    def dest(self, gcs_server):
        _, so = gcs_server
        d = storage.destination(f"gs://rowstore/dest-{next(_PREFIXES)}", so)
        assert isinstance(d, RemoteDir) and not d.conditional
        return d


class TestGCSStore(ChunkStoreTests):
    @pytest.fixture
    def served(self, gcs_dataset, local_dataset):
        url, so = gcs_dataset
        return open_layout(url, storage_options=so), local_dataset


# -- HTTP (read-only) ------------------------------------------------------------------------
class TestHTTPStore(ChunkStoreTests):
    @pytest.fixture
    def served(self, local_dataset, http_factory):
        pytest.importorskip("aiohttp")
        srv = http_factory(local_dataset)
        return open_layout(srv.url, storage_options={}), local_dataset


def test_http_is_not_a_destination():
    with pytest.raises(ValueError, match="read-only"):
        storage.destination("http://127.0.0.1:1/data")


# -- a missing object is a FileNotFoundError, by contract ----------------------------------------
def test_missing_remote_dataset_and_shard_are_file_not_found(s3_server, tmp_path):
    pytest.importorskip("s3fs")
    import numpy as np

    import rowstore

    _, so = s3_server
    with pytest.raises(FileNotFoundError) as ei:
        rowstore.open("s3://rowstore/no-such-dataset", storage_options=so)
    assert isinstance(ei.value, rowstore.FormatError) and "no-such-dataset" in str(ei.value)
    url = "s3://rowstore/missing-shard"
    info = rowstore.write_shard(
        url,
        rowstore.Schema([rowstore.Field("x", "int64")]),
        {"x": np.arange(5)},
        storage_options=so,
    )
    storage.destination(url, so).remove(info.path)
    with pytest.raises(FileNotFoundError, match="is missing") as ei:
        rowstore.commit(url, [info], storage_options=so)
    assert isinstance(ei.value, rowstore.FormatError) and ei.value.path == info.path
