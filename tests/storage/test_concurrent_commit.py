"""Commits to one remote dataset at the same time lose no version and never leave a dataset that
does not open.

On S3 (a real moto server) the version's objects are created only if absent and the pointer is
replaced only if unchanged: of two commits at once one wins, the other starts again on top of it.
The GCS emulator, like any store without conditional writes (``RemoteDir.conditional`` is False;
the emulator ignores ``ifGenerationMatch``), gets each commit's objects under unique names, and
each commit checks after writing the pointer that its version stays in the current version's
history while other commits may still write the pointer.

Races are made deterministic by holding commits at a chosen request (a listing of the manifest
directory, a PUT of the pointer) until the others are there: no test depends on timing.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema, storage
from rowstore.errors import CommitConflictError, ObjectChangedError
from rowstore.format import manifest
from rowstore.storage import destination
from rowstore.storage.localdir import LocalDir
from rowstore.storage.objstore import Client, RemoteOptions
from rowstore.storage.remote import RemoteDir
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
    where = storage.locate(url, so)
    out, name = [], manifest.pointer(where).manifest
    while name is not None:
        out.append(manifest.version_of(name))
        name = manifest.parent_of(where, name)
    return out


def _xs(url: str, so: dict) -> np.ndarray:
    r = rowstore.open(url, storage_options=so)
    return r.take(np.arange(len(r)))["x"]


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
    shards = {v: set(manifest.load(storage.locate(url, so), v).shards["path"]) for v in versions}
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
    shards = set(manifest.load(storage.locate(url, so), 3).shards["path"])
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


class _HoldPointerWrites:
    """Wraps the shared fsspec filesystem's ``pipe_file``: the first PUT of the pointer by each
    of ``parties`` threads waits until all of them are there, so that every commit has read the
    pointer, written its objects and checked the pointer again before any pointer is written.
    A thread that ends without getting there breaks the barrier (the others then go on)."""

    def __init__(self, fs, parties: int):
        self.fs, self.inner = fs, fs.pipe_file
        self.barrier = threading.Barrier(parties, timeout=300)
        self.seen: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, path, *args, **kw):
        if str(path).endswith(manifest.POINTER):
            with self.lock:
                first = threading.get_ident() not in self.seen
                self.seen.add(threading.get_ident())
            if first:
                try:
                    self.barrier.wait()
                except threading.BrokenBarrierError:
                    pass
        return self.inner(path, *args, **kw)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_concurrent_appends_keep_every_returned_commit(object_store, n):
    """``n`` commits (mode "a") at once, each held at its first pointer write until all are
    there: the dataset opens, every row of every commit that returned is in it, and a commit
    that raised CommitConflictError added nothing. gs:// runs the protocol without conditional
    writes (the emulator honours no precondition), s3:// the conditional one."""
    root, so = object_store
    url = f"{root}/race-{n}"
    assert destination(url, so).conditional is root.startswith("s3")
    first = _shard(url, so, 0, 10)
    assert rowstore.commit(url, [first], storage_options=so) == 1
    shards = [_shard(url, so, 1000 * (i + 1), 3 + i) for i in range(n)]
    fs = Client(url, RemoteOptions.make(so, None, None)).fs
    hold = _HoldPointerWrites(fs, n)
    fs.pipe_file = hold
    outcome: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            outcome[i] = rowstore.commit(url, [shards[i]], mode="a", storage_options=so)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome[i] = exc
            hold.barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        fs.pipe_file = hold.inner
    assert len(outcome) == n
    unexpected = [e for e in outcome.values() if isinstance(e, BaseException)]
    assert all(isinstance(e, CommitConflictError) for e in unexpected), unexpected
    won = [i for i, v in outcome.items() if isinstance(v, int)]
    assert won and len({outcome[i] for i in won}) == len(won)  # each its own version
    expected = set(range(10)) | {
        x for i in won for x in range(1000 * (i + 1), 1000 * (i + 1) + 3 + i)
    }
    xs = _xs(url, so)  # opens: pointer, manifest and sidecar agree
    assert len(xs) == len(expected) and set(xs.tolist()) == expected
    chain = _chain(url, so)
    assert chain[-1] == 1 and all(outcome[i] in chain for i in won)


class _PointerWriteHeld:
    """Wraps ``pipe_file``: the first PUT of the pointer by the thread ``held`` waits until
    ``go`` is set (``waiting`` is set then); ``landed`` is set when another thread's PUT of the
    pointer has returned."""

    def __init__(self, fs):
        self.fs, self.inner = fs, fs.pipe_file
        self.held: int | None = None
        self.waiting, self.go, self.landed = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, path, *args, **kw):
        pointer = str(path).endswith(manifest.POINTER)
        me = threading.get_ident()
        if pointer and me == self.held and not self.waiting.is_set():
            self.waiting.set()
            assert self.go.wait(300)
        out = self.inner(path, *args, **kw)
        if pointer and me != self.held:
            self.landed.set()
        return out


def test_a_pointer_write_landing_late_loses_no_commit(gcs_server):
    """Commit A checks the pointer (version 1) and is held just before writing it; commit B
    publishes on top of version 1 and writes the pointer; then A's write lands over B's. Without
    conditional writes nothing refuses A's write: B must not return as if committed (it finds
    its version gone from the pointer's chain and commits again on top of A's), and both
    commits' rows are in the dataset."""
    _, so = gcs_server
    url = "gs://rowstore/late-pointer"
    first = _shard(url, so, 0, 10)
    assert rowstore.commit(url, [first], storage_options=so) == 1
    a, b = _shard(url, so, 100, 5), _shard(url, so, 200, 7)
    fs = Client(url, RemoteOptions.make(so, None, None)).fs
    hold = _PointerWriteHeld(fs)
    fs.pipe_file = hold
    got: dict[str, object] = {}

    def commit(name, info, held=False):
        if held:
            hold.held = threading.get_ident()
        try:
            got[name] = rowstore.commit(url, [info], mode="a", storage_options=so)
        except BaseException as exc:  # noqa: BLE001 - checked below
            got[name] = exc

    ta = threading.Thread(target=commit, args=("a", a, True))
    tb = threading.Thread(target=commit, args=("b", b))
    try:
        ta.start()
        assert hold.waiting.wait(300)
        tb.start()
        assert hold.landed.wait(300)  # B's pointer is written; A's lands after it
        hold.go.set()
        ta.join(300)
        tb.join(300)
    finally:
        hold.go.set()
        fs.pipe_file = hold.inner
    assert isinstance(got["a"], int) and isinstance(got["b"], int), got
    assert sorted(_xs(url, so).tolist()) == [*range(10), *range(100, 105), *range(200, 207)]
    chain = _chain(url, so)
    assert chain[0] == got["b"] and got["a"] in chain and chain[-1] == 1


def test_without_conditional_writes_objects_have_unique_names(gcs_server):
    """On gs:// each version's manifest and sidecar carry a unique id, the pointer names the
    manifest exactly, the manifest its parent's; no pending object stays; every version of the
    chain opens by number."""
    _, so = gcs_server
    url = "gs://rowstore/unique-names"
    assert rowstore.commit(url, [_shard(url, so, 0, 4)], storage_options=so) == 1
    assert rowstore.commit(url, [_shard(url, so, 4, 3)], mode="a", storage_options=so) == 2
    dest = RemoteDir(url, so)
    names = sorted(dest.list(manifest.MANIFEST_DIR))
    assert len(names) == 4 and all(manifest.owner_of(n) for n in names)
    assert not [n for n in names if n.endswith(manifest.PENDING)]
    ptr = json.loads(dest.read_small(manifest.POINTER, 1 << 16))
    assert set(ptr) == {"format", "format_version", "version", "manifest", "manifest_crc32"}
    assert ptr["format_version"] == 1 and ptr["version"] == 2
    assert ptr["manifest"].startswith("_manifests/v00000002-") and ptr["manifest"] != (
        manifest.manifest_path(2)
    )
    m2 = json.loads(dest.read_small(ptr["manifest"], 1 << 20))
    assert m2["parent"] == 1 and manifest.version_of(m2["parent_manifest"]) == 1
    assert m2["index"]["path"] == ptr["manifest"][: -len(".json")] + ".index"
    assert len(rowstore.open(url, storage_options=so, version=1)) == 4
    assert sorted(_xs(url, so).tolist()) == list(range(7))


def test_a_killed_commits_pending_object_is_removed_once_stale(gcs_server):
    """A pending object left by a killed commit (built on no version) would hold every later
    commit; once it has stayed ``stale_s`` (here 0) it is removed with a warning and the commit
    returns."""
    _, so = gcs_server
    url = "gs://rowstore/stale-pending"
    assert rowstore.commit(url, [_shard(url, so, 0, 4)], storage_options=so) == 1
    dest = RemoteDir(url, so)
    dead = manifest.pending_path(5, "0" * 32)
    dest.write_new(dead, b'{"base": null}')
    more = _shard(url, so, 4, 2)
    with pytest.warns(RuntimeWarning, match="killed commit"):
        v = commit_to(dest, [more], mode="a", stale_s=0, storage_options=so)
    assert v == 6 and not dest.exists(dead)
    assert sorted(_xs(url, so).tolist()) == list(range(6))


class _PointerGates:
    """Wraps ``pipe_file``: the first PUT of the pointer by a thread named in ``names`` waits
    until that name's ``go`` is set (``arrived`` is set then); ``landed`` is set when the PUT
    has returned."""

    def __init__(self, fs, names):
        self.fs, self.inner = fs, fs.pipe_file
        ev = threading.Event
        self.arrived, self.go, self.landed = (
            {n: ev() for n in names},
            {n: ev() for n in names},
            {n: ev() for n in names},
        )

    def __call__(self, path, *args, **kw):
        me = threading.current_thread().name
        gated = str(path).endswith(manifest.POINTER) and me in self.go
        if gated and not self.arrived[me].is_set():
            self.arrived[me].set()
            assert self.go[me].wait(300)
        out = self.inner(path, *args, **kw)
        if gated:
            self.landed[me].set()
        return out


def test_a_version_overtaken_then_built_on_counts_once(gcs_server):
    """A and B both build on version 1 and are held at their pointer writes. A's lands; C reads
    it, builds on A's version and is held at its pointer write; B's lands (A's version is off
    the chain); C's lands (A's version is back on it). A must not start again (its rows would
    be in twice, or its append refused as already there): it settles only when no pending
    commit can change its outcome, and returns its version; B starts again on top of C."""
    _, so = gcs_server
    url = "gs://rowstore/overtaken-then-built-on"
    assert rowstore.commit(url, [_shard(url, so, 0, 10)], storage_options=so) == 1
    infos = {n: _shard(url, so, k, 3) for n, k in (("A", 100), ("B", 200), ("C", 300))}
    fs = Client(url, RemoteOptions.make(so, None, None)).fs
    gates = _PointerGates(fs, "ABC")
    fs.pipe_file = gates
    got: dict[str, object] = {}

    def commit():
        me = threading.current_thread().name
        try:
            got[me] = rowstore.commit(url, [infos[me]], mode="a", storage_options=so)
        except BaseException as exc:  # noqa: BLE001 - checked below
            got[me] = exc

    threads = {n: threading.Thread(target=commit, name=n) for n in "ABC"}
    try:
        threads["A"].start()
        threads["B"].start()
        assert gates.arrived["A"].wait(300) and gates.arrived["B"].wait(300)
        gates.go["A"].set()
        assert gates.landed["A"].wait(300)
        threads["C"].start()
        assert gates.arrived["C"].wait(300)
        gates.go["B"].set()
        assert gates.landed["B"].wait(300)
        gates.go["C"].set()
        for t in threads.values():
            t.join(300)
    finally:
        for e in gates.go.values():
            e.set()
        fs.pipe_file = gates.inner
    assert all(isinstance(v, int) for v in got.values()) and len(got) == 3, got
    xs = sorted(_xs(url, so).tolist())
    assert xs == [*range(10), *range(100, 103), *range(200, 203), *range(300, 303)]
    chain = _chain(url, so)
    assert chain[0] == got["B"] and got["A"] in chain and got["C"] in chain


def test_two_creating_commits_at_once_one_wins(object_store):
    """Two commits with mode "x" to a new dataset, held at their pointer writes until both are
    there (both found no dataset): one returns its version (on S3 the loser of the race for
    version 1's names may be the one to win the pointer, with version 2), the other raises
    FileExistsError, and the dataset holds the winner's rows only."""
    root, so = object_store
    url = f"{root}/create-race"
    a, b = _shard(url, so, 0, 4), _shard(url, so, 100, 6)
    fs = Client(url, RemoteOptions.make(so, None, None)).fs
    hold = _HoldPointerWrites(fs, 2)
    fs.pipe_file = hold
    got: dict[str, object] = {}

    def run(name, info):
        try:
            got[name] = rowstore.commit(url, [info], mode="x", storage_options=so)
        except BaseException as exc:  # noqa: BLE001 - checked below
            got[name] = exc
            hold.barrier.abort()

    threads = [threading.Thread(target=run, args=x) for x in (("a", a), ("b", b))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        fs.pipe_file = hold.inner
    won = [n for n, v in got.items() if isinstance(v, int)]
    lost = [v for v in got.values() if isinstance(v, FileExistsError)]
    assert len(won) == 1 and len(lost) == 1, got
    want = list(range(4)) if won == ["a"] else list(range(100, 106))
    assert sorted(_xs(url, so).tolist()) == want and _chain(url, so) == [got[won[0]]]
