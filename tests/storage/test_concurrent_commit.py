"""Two commits to one remote dataset at the same time (a real moto S3 server) lose no version:
both read the same current version, then both publish; one wins, the other starts again on top
of it. The race is made deterministic by holding both commits at the listing of the manifest
directory (each has read the pointer and the version it builds on by then) until both are there.

A store without conditional writes (gs://: ``RemoteDir.conditional`` is False) checks just
before each write, which closes the race only when the other commit has finished by then: that
case is tested on S3 and GCS alike (one commit held at the listing while another commits).
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import CommitConflictError, ObjectChangedError
from rowstore.format import manifest
from rowstore.storage.local import LocalDir
from rowstore.storage.objstore import Client, RemoteOptions
from rowstore.writer.commit import commit_to

pytest.importorskip("s3fs")

SCHEMA = Schema([Field("x", "int64")])


def _shard(url: str, so: dict, a: int, n: int) -> rowstore.ShardInfo:
    return rowstore.write_shard(url, SCHEMA, {"x": np.arange(a, a + n)}, storage_options=so)


class _BothListFirst:
    """Wraps the shared fsspec filesystem's ``ls``: the first listing of each of ``parties``
    threads waits until all of them list (a generous timeout only guards against a hang)."""

    def __init__(self, fs, parties: int):
        self.fs, self.inner = fs, fs.ls
        self.barrier = threading.Barrier(parties, timeout=300)
        self.seen: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, *args, **kw):
        me = threading.get_ident()
        with self.lock:
            first = me not in self.seen
            self.seen.add(me)
        if first and "_manifests" in str(args[0]):
            self.barrier.wait()
        return self.inner(*args, **kw)


def _run_both(commits):
    errors: list[BaseException] = []
    versions: list[int] = []

    def run(fn):
        try:
            versions.append(fn())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in commits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return versions, errors


def _chain(url: str, so: dict) -> list[int]:
    """The versions from the current one back through each manifest's parent."""
    c = Client(url, RemoteOptions.make(so, None, None))
    out, v = [], manifest.read_pointer(url, read=c.cat_small)[0]
    while v is not None:
        out.append(v)
        text = c.cat_small(f"{url}/{manifest.manifest_path(v)}", manifest.MAX_MANIFEST_BYTES)
        v = json.loads(text)["parent"]
    return out


@pytest.mark.parametrize("mode", ["a", "w"])
def test_two_concurrent_remote_commits_lose_no_version(s3_server, mode):
    _, so = s3_server
    url = f"s3://rowstore/concurrent-{mode}"
    first = _shard(url, so, 0, 10)
    assert rowstore.commit(url, [first], storage_options=so) == 1
    a, b = _shard(url, so, 100, 5), _shard(url, so, 200, 7)
    fs = Client(url, RemoteOptions.make(so, None, None)).fs  # the filesystem every client shares
    hold = _BothListFirst(fs, 2)
    fs.ls = hold
    try:
        versions, errors = _run_both(
            [
                lambda: rowstore.commit(url, [a], mode=mode, storage_options=so),
                lambda: rowstore.commit(url, [b], mode=mode, storage_options=so),
            ]
        )
    finally:
        fs.ls = hold.inner
    assert not errors, errors
    first_won, last = sorted(versions)
    assert first_won != last  # both published, each its own version
    assert _chain(url, so) == [
        last,
        first_won,
        1,
    ]  # the winner's version is the loser's parent: none lost
    c = Client(url, RemoteOptions.make(so, None, None))
    shards = {v: set(manifest.load(url, v, read=c.cat_small).shards["path"]) for v in versions}
    if mode == "a":  # the loser appended to the winner's version
        assert shards[last] == {first.path, a.path, b.path}
        assert len(rowstore.open(url, storage_options=so)) == 22
    else:  # each version holds exactly its commit's shards
        assert set(map(frozenset, shards.values())) == {frozenset({a.path}), frozenset({b.path})}


class _HeldAtListing:
    """Wraps the shared fsspec filesystem's ``ls``: the first listing of the manifest directory
    by the thread ``held`` (which sets it) waits until ``go`` is set; ``waiting`` is set when
    it does (a generous timeout only guards against a hang)."""

    def __init__(self, fs):
        self.fs, self.inner = fs, fs.ls
        self.held: int | None = None
        self.waiting, self.go = threading.Event(), threading.Event()

    def __call__(self, *args, **kw):
        if threading.get_ident() == self.held and not self.waiting.is_set():
            if "_manifests" in str(args[0]):
                self.waiting.set()
                assert self.go.wait(300)
        return self.inner(*args, **kw)


@pytest.mark.parametrize("mode", ["a", "w"])
def test_a_commit_overtaken_after_reading_starts_again_on_top(object_store, mode):
    """Commit A reads the pointer (version 1) and is held; commit B publishes version 2; A then
    finds version 2 taken and the pointer moved, and publishes version 3 on top of B's."""
    root, so = object_store
    url = f"{root}/overtaken-{mode}"
    first = _shard(url, so, 0, 10)
    assert rowstore.commit(url, [first], storage_options=so) == 1
    a, b = _shard(url, so, 100, 5), _shard(url, so, 200, 7)
    fs = Client(url, RemoteOptions.make(so, None, None)).fs
    hold = _HeldAtListing(fs)
    fs.ls = hold
    got: list = []

    def commit_a() -> None:
        hold.held = threading.get_ident()
        got.append(rowstore.commit(url, [a], mode=mode, storage_options=so))

    t = threading.Thread(target=commit_a)
    try:
        t.start()
        assert hold.waiting.wait(300)
        assert rowstore.commit(url, [b], mode=mode, storage_options=so) == 2
    finally:
        hold.go.set()
        t.join(300)
        fs.ls = hold.inner
    assert got == [3] and _chain(url, so) == [3, 2, 1]
    c = Client(url, RemoteOptions.make(so, None, None))
    shards = set(manifest.load(url, 3, read=c.cat_small).shards["path"])
    assert shards == ({first.path, a.path, b.path} if mode == "a" else {a.path})


class _PointerAlwaysMoved(LocalDir):
    """A directory where another commit always moves the pointer first."""

    def replace(self, rel, data, *, expect=...):
        raise ObjectChangedError(f"{rel!r} changed since it was read", path=rel)


def test_a_commit_that_keeps_losing_the_race_fails_clearly_and_leaves_nothing(tmp_path):
    root = str(tmp_path / "ds")
    assert rowstore.commit(root, [rowstore.write_shard(root, SCHEMA, {"x": np.arange(3)})]) == 1
    late = rowstore.write_shard(root, SCHEMA, {"x": np.arange(3, 6)})
    with pytest.raises(CommitConflictError, match="3 times") as ei:
        commit_to(_PointerAlwaysMoved(root), [late], mode="a", max_attempts=3)
    assert ei.value.path == root
    assert manifest.read_pointer(root)[0] == 1
    assert sorted(os.listdir(os.path.join(root, manifest.MANIFEST_DIR))) == [
        ".lock",
        "v00000001.index",
        "v00000001.json",
    ]
    assert len(rowstore.open(root)) == 3
