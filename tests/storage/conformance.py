"""The conformance suites of the two storage interfaces (:mod:`rowstore.storage.base`), as
base classes to subclass once per backend, in the manner of zarr's ``StoreTests``.

* :class:`DestinationTests`: a subclass provides a ``dest`` fixture returning a fresh, empty
  :class:`~rowstore.storage.base.Destination`;
* :class:`ChunkStoreTests`: a subclass provides a ``served`` fixture returning
  ``(opened, local_dir)``: the :class:`~rowstore.format.open.Opened` of the dataset
  :func:`dataset_dir` writes, as the backend serves it, and that dataset's local directory.

A new backend (gs://, az://, a cache tier) is one subclass per interface, plus its fixture.
"""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema, kernels
from rowstore.errors import FormatError, MissingObjectError, ObjectChangedError
from rowstore.storage.base import ChunkStore, Destination, DirectReads

SCHEMA = Schema([Field("x", "float32", (3,)), Field("label", "int64"), Field("text", "str")])
ROWS = 900


def dataset_dir(root: str) -> str:
    """An uncompressed dataset of several shards under ``root``/ds; its path."""
    path = os.path.join(root, "ds")
    cols = {
        "x": np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3),
        "label": np.arange(ROWS, dtype=np.int64),
        "text": [f"t{i}" for i in range(ROWS)],
    }
    with rowstore.DatasetWriter(path, SCHEMA, shard_bytes=12_000, block_bytes=2048) as w:
        w.write_batch(cols)
    return path


class DestinationTests:
    """What every destination does; ``dest`` is a fresh, empty one."""

    def test_is_a_destination(self, dest):
        assert isinstance(dest, Destination)
        assert isinstance(dest.conditional, bool)

    def test_write_new_then_read_list_size(self, dest):
        dest.write_new("d/a.json", b"hello")
        assert dest.read_small("d/a.json", 100) == b"hello"
        assert dest.exists("d/a.json") and not dest.exists("d/b.json")
        assert dest.size("d/a.json") == 5 and dest.size("d/b.json") is None
        dest.write_new("d/b.json", b"x")
        assert sorted(dest.list("d")) == ["a.json", "b.json"]
        assert dest.list("nothing-here") == []

    def test_write_new_never_overwrites(self, dest):
        dest.write_new("a", b"first")
        with pytest.raises(FileExistsError):
            dest.write_new("a", b"second")
        assert dest.read_small("a", 100) == b"first"

    def test_missing_object_is_a_file_not_found_error(self, dest):
        with pytest.raises(MissingObjectError) as ei:
            dest.read_small("missing.json", 100)
        assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, FormatError)
        assert "missing.json" in str(ei.value)

    def test_read_small_refuses_more_than_its_limit(self, dest):
        dest.write_new("big", b"x" * 1000)
        with pytest.raises(FormatError):
            dest.read_small("big", 999)
        assert dest.read_small("big", 1000) == b"x" * 1000

    def test_replace_only_if_unchanged(self, dest):
        assert dest.token("p") is None
        dest.replace("p", b"v1", expect=None)  # created: there was none
        with pytest.raises(ObjectChangedError):
            dest.replace("p", b"v1 again", expect=None)  # there is one now
        t1 = dest.token("p")
        assert t1 is not None
        dest.replace("p", b"v2", expect=t1)
        assert dest.read_small("p", 100) == b"v2"
        with pytest.raises(ObjectChangedError):
            dest.replace("p", b"v3", expect=t1)  # stale: another writer replaced it
        assert dest.read_small("p", 100) == b"v2"
        dest.replace("p", b"v4")  # unconditional
        assert dest.read_small("p", 100) == b"v4"

    def test_put_file_and_remove(self, dest, tmp_path):
        local = tmp_path / "f.bin"
        local.write_bytes(b"\x00\x01" * 500)
        dest.put_file(str(local), "shards/f.bin")
        assert dest.read_small("shards/f.bin", 1000) == b"\x00\x01" * 500
        dest.remove("shards/f.bin")
        dest.remove("shards/f.bin")  # nothing there: no error
        assert not dest.exists("shards/f.bin")

    def test_staging_publishes_finished_files(self, dest):
        staging = dest.staging()
        try:
            path = staging.local("shards/s.h5")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"shard bytes")
            staging.publish("shards/s.h5")
        finally:
            staging.close()
        assert dest.read_small("shards/s.h5", 100) == b"shard bytes"

    def test_lock_and_sync(self, dest):
        with dest.lock("_manifests/.lock"):
            dest.write_new("x", b"1")
        dest.sync()
        assert dest.read_small("x", 10) == b"1"

    def test_racing_write_new_has_one_winner(self, dest):
        """Two writers creating one name at once: exactly one succeeds, where the destination
        makes that atomic (``conditional``)."""
        if not dest.conditional:
            pytest.skip("this destination checks before writing: two writers at once may both pass")
        barrier = threading.Barrier(2, timeout=300)
        won, lost = [], []

        def write(i: int) -> None:
            barrier.wait()
            try:
                dest.write_new("race", f"writer {i}".encode())
                won.append(i)
            except FileExistsError:
                lost.append(i)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(lost) == 1
        assert dest.read_small("race", 100) == f"writer {won[0]}".encode()


class ChunkStoreTests:
    """What every chunk store does; ``served`` is ``(opened, local_dir)``."""

    @staticmethod
    def store_of(opened) -> ChunkStore:
        L = opened.layout
        return opened.location.chunk_store(L.shard_paths, L.shard_ids)

    @staticmethod
    def expected_blocks(opened, local_dir: str) -> bytes:
        """Every block's stored bytes, read straight from the local files."""
        L, a = opened.layout, opened.layout.arrays()
        out = []
        for b in range(L.num_blocks):
            shard = os.path.join(local_dir, *L.shard_paths[L.block_shard[b]].rsplit("/", 2)[-2:])
            with open(shard, "rb") as f:
                f.seek(int(a["offset"][b]))
                out.append(f.read(int(a["stored"][b])))
        return b"".join(out)

    @staticmethod
    def load_all(store, opened, checksums=None) -> np.ndarray:
        L, a = opened.layout, opened.layout.arrays()
        raw = L.block_raw_bytes
        dst = np.empty(L.num_blocks * raw, np.uint8)
        store.load_chunks(
            L.block_shard,
            a["offset"],
            a["stored"],
            a["checksum"] if checksums is None else checksums,
            codec=L.frame_check(),
            verify=True,
            dst=dst,
            raw_size=raw,
            scratch=np.empty(int(a["stored"].max()), np.uint8),
            what="block",
            dst_stride=raw,
        )
        return dst

    def test_is_a_chunk_store(self, served):
        store = self.store_of(served[0])
        assert isinstance(store, ChunkStore) and isinstance(store.direct, bool)
        assert isinstance(store, DirectReads) == store.direct  # the flag names the interface
        assert store.max_open >= 1 and isinstance(store.path, str)

    def test_load_chunks_gives_the_stored_blocks(self, served):
        opened, local = served
        assert opened.layout.num_shards > 1
        got = self.load_all(self.store_of(opened), opened)
        assert got.tobytes() == self.expected_blocks(opened, local)

    def test_a_bad_checksum_is_refused(self, served):
        opened, _ = served
        bad = opened.layout.arrays()["checksum"].copy()
        bad[len(bad) // 2] ^= 1
        with pytest.raises(kernels.KernelChecksumError):
            self.load_all(self.store_of(opened), opened, checksums=bad)

    def test_a_missing_shard_is_a_missing_object(self, served):
        opened, _ = served
        L = opened.layout
        gone = L.shard_paths[0].rsplit("/", 1)[0] + "/no-such-shard.h5"
        store = opened.location.chunk_store([gone], [(int(L.shard_file_size[0]),)])
        a = L.arrays()
        raw = L.block_raw_bytes
        with pytest.raises(MissingObjectError) as ei:
            store.load_chunks(
                None,
                a["offset"][:1],
                a["stored"][:1],
                a["checksum"][:1],
                codec=L.frame_check(),
                verify=True,
                dst=np.empty(raw, np.uint8),
                raw_size=raw,
                scratch=np.empty(int(a["stored"].max()), np.uint8),
                what="block",
            )
        assert isinstance(ei.value, FileNotFoundError)

    def test_survives_pickling_and_close(self, served):
        opened, local = served
        store = self.store_of(opened)
        first = self.load_all(store, opened)
        store.close()
        again = pickle.loads(pickle.dumps(store))
        assert self.load_all(again, opened).tobytes() == first.tobytes()
        assert self.load_all(store, opened).tobytes() == first.tobytes()  # reopened on use

    def test_direct_stores_read_single_rows(self, served):
        opened, local = served
        store = self.store_of(opened)
        if not store.direct:
            pytest.skip("not a direct store: the gather reads whole chunks only")
        L, a = opened.layout, opened.layout.arrays()
        rs = L.row_dtype.itemsize
        blocks = self.expected_blocks(opened, local)
        raw = L.block_raw_bytes
        pick = np.array([0, L.num_blocks - 1])
        dst = np.empty(len(pick) * rs, np.uint8)
        store.read_rows(L.block_shard[pick], a["offset"][pick], rs, dst)  # each block's first row
        want = b"".join(blocks[int(b) * raw : int(b) * raw + rs] for b in pick)
        assert dst.tobytes() == want
