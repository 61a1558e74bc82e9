"""Reading from object storage: a real moto S3 server and a real HTTP server with Range on
127.0.0.1 (``tests/_servers.py``), compared with the local read of the same files.

Objects stay a few hundred KB (stock moto copies a whole object per ranged GET)."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil

import numpy as np
import pytest
from _servers import FirstTries
from helpers import same, same_epochs, scaled

import rowstore
from rowstore import Field, Schema, kernels
from rowstore.errors import ChecksumError, FormatError, ObjectChangedError, RemoteError
from rowstore.storage import remote as _remote

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("moto")

N = 3000
SCHEMA = Schema(
    [
        Field("x", "float32", (8,)),
        Field("label", "int64"),
        Field("text", "str", nullable=True),
        Field("wave", "float32", (None,)),
    ]
)


def _columns(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.random((n, 8), dtype=np.float32),
        "label": np.arange(n, dtype=np.int64) * 7 + seed,
        "text": [None if i % 11 == 0 else f"row {i} " + "z" * (i % 13) for i in range(n)],
        "wave": [rng.random(i % 9, dtype=np.float32) for i in range(n)],
    }


@pytest.fixture(scope="session")
def remote_data(tmp_path_factory) -> str:
    """A directory with a single uncompressed file, an lz4 file and an 8-shard dataset."""
    d = str(tmp_path_factory.mktemp("remote"))
    cols = _columns(N)
    with rowstore.Writer(os.path.join(d, "plain.h5"), SCHEMA, block_bytes=8 << 10) as w:
        w.write_batch(cols)
    with rowstore.Writer(
        os.path.join(d, "lz4.h5"), SCHEMA, block_bytes=8 << 10, compression="lz4"
    ) as w:
        w.write_batch(cols)
    with rowstore.DatasetWriter(
        os.path.join(d, "ds"), SCHEMA, shard_bytes=40_000, block_bytes=8 << 10
    ) as w:
        w.write_batch(cols)
    return d


@pytest.fixture(scope="session")
def s3(remote_data, s3_server):
    """moto holding ``remote_data`` under ``s3://rowstore/data/``."""
    endpoint, opts = s3_server
    fs = fsspec.filesystem("s3", **opts)
    fs.put(remote_data + "/", "rowstore/data/", recursive=True)
    return opts


@pytest.fixture(scope="session")
def gcs(remote_data, gcs_server):
    """The GCS emulator holding ``remote_data`` under ``gs://rowstore/data/``."""
    _, opts = gcs_server
    fsspec.filesystem("gs", **opts).put(remote_data + "/", "rowstore/data/", recursive=True)
    return opts


@pytest.fixture(scope="session")
def http(remote_data, http_factory):
    return http_factory(remote_data)


def _urls(kind: str, s3, http, gcs=None) -> tuple[str, dict | None]:
    if kind == "s3":
        return "s3://rowstore/data", s3
    if kind == "gs":
        return "gs://rowstore/data", gcs
    return http.url, None


# -- the in-memory kernel ----------------------------------------------------------------------
@pytest.mark.parametrize("codec", [None, "lz4"])
def test_decode_chunks_equals_load_chunks(tmp_path, codec):
    """decode_chunks on bytes read into memory gives what load_chunks gives from the file,
    for every chunk of a file, in random subsets and orders."""
    p = str(tmp_path / "f.h5")
    with rowstore.Writer(
        p, SCHEMA, block_bytes=4 << 10, **({"compression": codec} if codec else {})
    ) as w:
        w.write_batch(_columns(800))
    L = rowstore.Layout.open(p)
    off, stored, crc, raw = L.chunk_index("block")
    data = np.fromfile(p, np.uint8)
    rng = np.random.default_rng(1)
    fd = os.open(p, os.O_RDONLY)
    try:
        for _ in range(20):
            pick = rng.choice(len(off), size=rng.integers(1, len(off) + 1), replace=True)
            a = np.empty(len(pick) * raw, np.uint8)
            b = np.empty(len(pick) * raw, np.uint8)
            kernels.load_chunks(
                fd,
                off[pick],
                stored[pick],
                crc[pick],
                codec=L.frame_check(),
                verify=True,
                dst=a,
                raw_size=raw,
                scratch=np.empty(int(stored.max()), np.uint8),
            )
            kernels.decode_chunks(
                data,
                off[pick],
                stored[pick],
                crc[pick],
                codec=L.frame_check(),
                verify=True,
                dst=b,
                raw_size=raw,
            )
            assert a.tobytes() == b.tobytes()
    finally:
        os.close(fd)
    # Bounds: a range past the buffer, a bad CRC, a short destination.
    with pytest.raises(kernels.KernelError) as ei:
        kernels.decode_chunks(
            data[: int(off[1]) + 5],
            off[:2],
            stored[:2],
            crc[:2],
            codec=L.frame_check(),
            verify=True,
            dst=np.empty(2 * raw, np.uint8),
            raw_size=raw,
        )
    assert ei.value.code == kernels.KernelCode.E_SHORT and ei.value.index == 1
    bad = data.copy()
    bad[int(off[0]) + 3] ^= 1
    with pytest.raises(ChecksumError):
        kernels.decode_chunks(
            bad,
            off[:1],
            stored[:1],
            crc[:1],
            codec=L.frame_check(),
            verify=True,
            dst=np.empty(raw, np.uint8),
            raw_size=raw,
        )
    with pytest.raises(kernels.KernelError) as ei:
        kernels.decode_chunks(
            data,
            off[:2],
            stored[:2],
            crc[:2],
            codec=L.frame_check(),
            verify=True,
            dst=np.empty(2 * raw - 1, np.uint8),
            raw_size=raw,
        )
    assert ei.value.code == kernels.KernelCode.E_DEST


# -- equal to the local read -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["s3", "gs", "http"])
@pytest.mark.parametrize("name", ["plain.h5", "lz4.h5", "ds"])
def test_remote_reads_equal_local(remote_data, s3, http, kind, name, request):
    gcs = request.getfixturevalue("gcs") if kind == "gs" else None
    base, opts = _urls(kind, s3, http, gcs)
    local = rowstore.open(os.path.join(remote_data, name))
    remote = rowstore.open(f"{base}/{name}", storage_options=opts)
    assert isinstance(remote._store, _remote.RemoteStore) and len(remote) == len(local) == N
    idx = np.random.default_rng(2).integers(0, N, 400)
    assert same(local.take(idx), remote.take(idx))
    row, want = remote[17], local[17]
    assert row.keys() == want.keys() and all(np.array_equal(row[k], want[k]) for k in row)
    for kw in (
        {"shuffle": "block", "seed": 3, "window": 4},
        {"shuffle": "none"},
        {"shuffle": "block", "seed": 5, "part": (1, 3), "start": 150, "epoch": 2},
        {"shuffle": "full", "seed": 6, "part": (2, 3), "start": 333, "window": 64},
    ):
        same_epochs(local.batches(128, **kw), remote.batches(128, **kw))


def test_open_request_counts(remote_data, http_factory):
    """A dataset opens in three GETs (pointer, manifest, sidecar); a single file in a HEAD and
    two ranged GETs (head and tail of the file, where our writer puts the HDF5 metadata),
    whatever the file's size."""
    srv = http_factory(remote_data)
    before = srv.requests
    rowstore.open(srv.url + "/ds")
    assert srv.requests - before == 3
    big = os.path.join(remote_data, "big.h5")
    with rowstore.Writer(big, SCHEMA, block_bytes=8 << 10) as w:
        for k in range(8):
            w.write_batch(_columns(N, seed=k))
    assert os.path.getsize(big) > 1 << 21
    before = srv.requests
    r = rowstore.open(srv.url + "/big.h5")
    assert srv.requests - before <= 3
    assert same(r.take([0, 8 * N - 1]), rowstore.open(big).take([0, 8 * N - 1]))


def test_scheduler_bounds_requests_in_flight(remote_data, s3):
    """The store fetches in epoch order ahead of the reader, never more than max_in_flight
    requests held at once; the reader's chunks come from the schedule (hits), and merged
    adjacent chunks take fewer requests than chunks."""
    r = rowstore.open(
        "s3://rowstore/data/plain.h5", storage_options=s3, remote={"max_in_flight": 3}
    )
    seen = []
    n = 0
    sched = None
    for batch in r.batches(64, seed=1, window=4, num_threads=2):
        if r._store.scheduler is not None:  # (the last batches come after the schedule ended)
            sched = r._store.scheduler
            seen.append(sched.in_flight())
        n += len(batch["label"])
    assert sched is not None
    assert n == N and max(seen) <= 3
    # One gathering thread takes the chunks in the plan's order, so each was issued before it
    # was asked for (with two, which thread asks first is up to the OS: no count to assert).
    one = rowstore.open(
        "s3://rowstore/data/plain.h5", storage_options=s3, remote={"max_in_flight": 3}
    )
    sched1 = None
    for _ in one.batches(64, seed=1, window=4, num_threads=1):
        sched1 = one._store.scheduler or sched1
    assert sched1 is not None
    assert sched1.hits >= one.layout.num_blocks * 0.9  # nearly every chunk came prefetched
    merged = rowstore.open(
        "s3://rowstore/data/plain.h5", storage_options=s3, remote={"merge_bytes": 1 << 20}
    )
    list(merged.batches(256, shuffle="none"))
    assert merged._store.scheduler is None  # stopped with the epoch
    assert merged._store.requests < r.layout.num_blocks / 2


def test_dealt_epochs_fetch_ahead(remote_data, s3):
    """The dealt epochs of the loaders (Reader.deal) are scheduled ahead like batches(), and
    give the local read's rows."""
    r = rowstore.open(
        "s3://rowstore/data/plain.h5", storage_options=s3, remote={"max_in_flight": 3}
    )
    local = rowstore.open(os.path.join(remote_data, "plain.h5"))
    kw = dict(shard=(1, 2), seed=1, window=4, with_ids=True, fields=["label"])
    sched, got = None, []
    for batch in r.deal(64, **kw):
        sched = r._store.scheduler or sched
        got.append(batch)
    want = list(local.deal(64, **kw))
    assert sched is not None and sched.hits > 0
    assert np.array_equal(
        np.concatenate([b["__id"] for b in got]), np.concatenate([b["__id"] for b in want])
    )
    assert np.array_equal(
        np.concatenate([b["label"] for b in got]), np.concatenate([b["label"] for b in want])
    )


@pytest.mark.parametrize("kind", ["s3", "http"])
def test_global_shuffle_of_a_remote_dataset(remote_data, s3, http, kind, tmp_path):
    """rowstore.shuffle reads its input by byte ranges: the output equals the local input's
    shuffle (the permutation is a function of the seed and the rows only)."""
    base, opts = _urls(kind, s3, http)
    rowstore.shuffle(
        base + "/ds", str(tmp_path / "remote"), memory="8MiB", seed=5, storage_options=opts
    )
    rowstore.shuffle(
        os.path.join(remote_data, "ds"), str(tmp_path / "local"), memory="8MiB", seed=5
    )
    got, want = (rowstore.open(str(tmp_path / n)) for n in ("remote", "local"))
    assert len(got) == len(want) == N
    for f in SCHEMA.names:
        a, b = got.take(np.arange(N), fields=[f])[f], want.take(np.arange(N), fields=[f])[f]
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), f
    with pytest.raises(ValueError, match="output must be a local directory"):
        rowstore.shuffle(base + "/ds", base + "/out", memory="8MiB", storage_options=opts)
    from rowstore.cli import main  # the command, with the order figures before and after

    flags = [] if opts is None else ["--storage-options", json.dumps(opts)]
    assert (
        main(
            [
                "shuffle",
                base + "/ds",
                str(tmp_path / "cli"),
                "--memory",
                "8MiB",
                "--seed",
                "5",
                *flags,
            ]
        )
        == 0
    )
    cli = rowstore.open(str(tmp_path / "cli"))
    assert np.array_equal(
        cli.take(np.arange(N), fields=["label"])["label"],
        want.take(np.arange(N), fields=["label"])["label"],
    )


def test_a_request_cancelled_by_a_stopping_schedule_is_fetched_again(remote_data, http):
    """A reader thread holding a scheduled request when the schedule stops (its epoch's
    iteration ended while the last segments were still being read) gets the chunk all the
    same: the store fetches it itself instead of failing with CancelledError."""
    from concurrent.futures import Future

    r = rowstore.open(http.url + "/plain.h5", remote={"max_in_flight": 2})
    a = r.layout.arrays()
    key = (0, int(a["offset"][0]), int(a["stored"][0]))
    sched = r._store.schedule(iter([[key]]))
    assert sched._entries[key]  # scheduled: one request in flight
    rid = sched._entries[key][0][0]
    cancelled = Future()
    cancelled.cancel()  # what stop() leaves to a thread that took a pending request
    sched._requests[rid][0] = cancelled
    got = r.take(np.arange(64), fields=["label"])["label"]
    want = rowstore.open(os.path.join(remote_data, "plain.h5")).take(
        np.arange(64), fields=["label"]
    )["label"]
    assert np.array_equal(got, want) and sched.hits == 1


def _epoch_labels(reader, rank, world):
    return np.concatenate([b["label"] for b in reader.batches(100, seed=9, part=(rank, world))])


def test_pickled_and_forked_readers_read_their_shards(remote_data, s3):
    """A remote reader pickles by URL and options, and fork children make their own client:
    the union of the shards read in 3 forked workers is every row once."""
    r = rowstore.open("s3://rowstore/data/ds", storage_options=s3)
    r.take([0, 1])  # the parent's client exists before the fork
    again = pickle.loads(pickle.dumps(r))
    assert same(again.take([5, 2999]), r.take([5, 2999]))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        parts = pool.starmap(_epoch_labels, [(r, k, 3) for k in range(3)])
    got = np.sort(np.concatenate(parts))
    assert np.array_equal(
        got, np.sort(rowstore.open(os.path.join(remote_data, "ds")).take(np.arange(N))["label"])
    )
    with multiprocessing.get_context("spawn").Pool(
        1
    ) as pool:  # a spawned worker: unpickled, its own client
        part = pool.apply(_epoch_labels, (r, 1, 3))
    assert np.array_equal(part, parts[1])


def test_missing_and_not_rowstore(remote_data, s3, http):
    with pytest.raises(FormatError, match="missing"):
        rowstore.open("s3://rowstore/data/nothing.h5", storage_options=s3)
    with pytest.raises(FormatError):
        rowstore.open(http.url + "/nothing")
    with pytest.raises(ValueError, match="URL"):
        rowstore.open(os.path.join(remote_data, "plain.h5"), storage_options={})


# -- integrity -------------------------------------------------------------------------------
def test_changed_objects_are_refused(tmp_path, http_factory, s3):
    """A single file replaced after open: refused by If-Match (HTTP and S3), never mixed; a
    dataset shard replaced by other bytes of another size: refused as changed."""
    d = tmp_path / "srv"
    d.mkdir()
    p = str(d / "f.h5")
    with rowstore.Writer(p, SCHEMA, block_bytes=8 << 10) as w:
        w.write_batch(_columns(500))
    srv = http_factory(str(d))
    r = rowstore.open(srv.url + "/f.h5")
    r.take([0])
    with rowstore.Writer(p, SCHEMA, block_bytes=8 << 10) as w:  # replaced atomically: a new ETag
        w.write_batch(_columns(500, seed=1))
    with pytest.raises(ObjectChangedError, match="changed"):
        r.take([1])
    fs = fsspec.filesystem("s3", **s3)
    fs.put(p, "rowstore/changing.h5")
    r = rowstore.open("s3://rowstore/changing.h5", storage_options=s3)
    with rowstore.Writer(p, SCHEMA, block_bytes=8 << 10) as w:
        w.write_batch(_columns(500, seed=2))
    fs.put(p, "rowstore/changing.h5")
    with pytest.raises(ObjectChangedError):
        r.take([1])
    # A dataset's shard replaced under the same name.
    ds = str(d / "ds")
    with rowstore.DatasetWriter(ds, SCHEMA, shard_bytes=40_000, block_bytes=8 << 10) as w:
        w.write_batch(_columns(1000))
    r = rowstore.open(srv.url + "/ds")
    shard = r.layout.shard_paths[0].rsplit("/", 1)[1]
    target = os.path.join(ds, "shards", shard)
    other = str(tmp_path / "other.h5")
    with rowstore.Writer(other, SCHEMA, block_bytes=8 << 10) as w:
        w.write_batch(_columns(300, seed=3))
    shutil.copyfile(other, target)
    with pytest.raises(ObjectChangedError, match="bytes"):
        r.take(np.arange(100))
    # Same size, other bytes: a checksum error (every remote chunk is checked, verify=False too).
    data = bytearray(open(other, "rb").read())
    size = int(r.layout.shard_file_size[0])
    r2 = rowstore.open(srv.url + "/ds", verify=False)
    blob = bytearray(os.urandom(size))
    open(target, "wb").write(bytes(blob))
    with pytest.raises(ChecksumError):
        r2.take(np.arange(100))
    del data


def test_changed_objects_are_refused_on_gcs(tmp_path, gcs):
    """GCS (no ``If-Match`` on its reads here): a single file replaced after open fails its
    chunks' CRC, and the HEAD that follows names it as changed (its ETag); a dataset's shard
    replaced by another of another size is refused by its size, as on S3."""
    fs = fsspec.filesystem("gs", **gcs)
    p = str(tmp_path / "f.h5")
    # stats=False: the replacement must have the same size (statistics of other rows differ)
    with rowstore.Writer(p, SCHEMA, block_bytes=8 << 10, stats=False) as w:
        w.write_batch(_columns(500))
    fs.put(p, "rowstore/changing.h5")
    r = rowstore.open("gs://rowstore/changing.h5", storage_options=gcs)
    assert same(r.take([0]), rowstore.open(p).take([0]))
    with rowstore.Writer(p, SCHEMA, block_bytes=8 << 10, stats=False) as w:
        w.write_batch(_columns(500, seed=2))
    fs.put(p, "rowstore/changing.h5")
    with pytest.raises(ObjectChangedError, match="changed since it was opened"):
        r.take(np.arange(500))
    ds = str(tmp_path / "ds")
    with rowstore.DatasetWriter(ds, SCHEMA, shard_bytes=40_000, block_bytes=8 << 10) as w:
        w.write_batch(_columns(1000))
    fs.put(ds + "/", "rowstore/changing-ds/", recursive=True)
    r = rowstore.open("gs://rowstore/changing-ds", storage_options=gcs)
    other = str(tmp_path / "other.h5")
    with rowstore.Writer(other, SCHEMA, block_bytes=8 << 10) as w:
        w.write_batch(_columns(300, seed=3))
    fs.put(other, "rowstore/changing-ds/" + r.layout.shard_paths[0].split("changing-ds/", 1)[1])
    with pytest.raises(ObjectChangedError, match="bytes"):
        r.take(np.arange(100))


def test_missing_gcs_objects_are_named(gcs):
    with pytest.raises(FormatError, match="missing"):
        rowstore.open("gs://rowstore/data/nothing.h5", storage_options=gcs)
    with pytest.raises(FileNotFoundError):
        rowstore.open("gs://rowstore/no-such-dataset", storage_options=gcs)


def test_access_refused_at_open(http):
    with pytest.raises(RemoteError, match="refused") as ei:
        rowstore.open(http.url + "/private/x.h5")
    assert ei.value.attempts == 1


def test_no_credentials_fail_at_once(s3, s3_server, monkeypatch, tmp_path):
    """S3 with no credentials anywhere (anon=False): one attempt, an error saying so."""
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    so = {"anon": False, "client_kwargs": s3_server[1]["client_kwargs"]}
    with pytest.raises(RemoteError, match="no credentials found") as ei:
        rowstore.open("s3://rowstore/data/plain.h5", storage_options=so)
    assert ei.value.attempts == 1
    client = _remote.Client(
        "s3://rowstore/data/plain.h5", _remote.RemoteOptions.make(so, None, None)
    )
    with pytest.raises(RemoteError, match="no credentials found") as ei:
        client.get("s3://rowstore/data/plain.h5", 0, 100)
    assert ei.value.attempts == 1 and client.requests == 1


def test_a_missing_bucket_is_named(s3):
    with pytest.raises(FormatError, match="the bucket 'no-such-bucket' does not exist"):
        rowstore.open("s3://no-such-bucket/data/plain.h5", storage_options=s3)
    with pytest.raises(FormatError, match="the bucket 'no-such-bucket' does not exist"):
        rowstore.open("s3://no-such-bucket/data/ds", storage_options=s3)


# -- faults ------------------------------------------------------------------------------------
@pytest.fixture
def proxy_factory():
    from _servers import FaultProxy

    made = []

    def make(upstream_url: str, **kw):
        p = FaultProxy(upstream_url.split("://", 1)[1], **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


#: A stalled request ends at the client's timeout only (the proxy holds it until closed); the
#: timeout is scaled so that requests that are merely slow (a busy machine) rarely reach it, and
#: the retries exceed the failures the schedule injects into any one request.
FAST = {"timeout": scaled(0.5), "backoff": 0.01, "retries": 6}


@pytest.mark.parametrize("kind", ["s3", "http"])
def test_transient_faults_are_retried(remote_data, s3, http, s3_server, proxy_factory, kind):
    """503s, reset connections and stalled responses, twice in a row on every third distinct
    ranged GET until six faults were injected (counted, not timed): the epoch still equals the
    local read."""
    schedule = FirstTries(("503", "reset", "stall") * 2, every=3, tries=2)
    if kind == "s3":
        proxy = proxy_factory(s3_server[0], fault=schedule)
        from _servers import s3_options

        url, opts = "s3://rowstore/data/lz4.h5", s3_options(proxy.url)
    else:
        proxy = proxy_factory(http.url, fault=schedule)
        url, opts = proxy.url + "/lz4.h5", None
    remote = rowstore.open(url, storage_options=opts, remote=FAST)
    local = rowstore.open(os.path.join(remote_data, "lz4.h5"))
    same_epochs(local.batches(200, seed=1, window=4), remote.batches(200, seed=1, window=4))
    assert proxy.injected == 6 and schedule.faulted == 3


def test_persistent_faults_are_reported(http, proxy_factory):
    """A range that keeps failing: an error naming the URL, the byte range and the attempts."""
    armed = {"fault": None}  # faults start after the open
    proxy = proxy_factory(
        http.url, fault=lambda n, head: armed["fault"]
    )  # a stall lasts until closed
    r = rowstore.open(proxy.url + "/plain.h5", remote={"retries": 2, "backoff": 0.01})
    armed["fault"] = "503"
    with pytest.raises(RemoteError) as ei:
        r.take([0])
    err = ei.value
    assert err.attempts == 3 and err.url == proxy.url + "/plain.h5" and err.end > err.start >= 0
    assert (
        "plain.h5" in str(err)
        and f"bytes {err.start}-{err.end - 1}" in str(err)
        and "3 attempts" in str(err)
    )
    armed["fault"] = None
    r = rowstore.open(
        proxy.url + "/plain.h5", remote={"retries": 1, "backoff": 0.01, "timeout": 0.3}
    )
    armed["fault"] = "stall"
    with pytest.raises(RemoteError, match="stalled past the timeout"):
        r.take([0])


def test_rowstore_bench_reads_a_url(s3, capsys):
    """``rowstore-bench URL --storage-options JSON`` measures a remote dataset."""
    import json

    from rowstore.bench import cli

    rc = cli.main(
        [
            "s3://rowstore/data/ds",
            "--storage-options",
            json.dumps(s3),
            "-q",
            "--repeats",
            "1",
            "-m",
            "0",
            "--compare",
            "--baselines",
            "h5py-row",
            "--memcpy-mib",
            "8",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "rowstore" in out and "baselines skipped for a URL" in out


def test_rowstore_bench_labels_remote_epochs_and_times_their_first_request(s3, capsys, tmp_path):
    """A URL's epochs are called remote (not "warm page cache"), and no warm-up batches are
    left untimed: with them the timed batches would be ones the reader had prefetched."""
    import json

    from rowstore.bench import cli

    out_json = str(tmp_path / "b.json")
    rc = cli.main(
        [
            "s3://rowstore/data/ds",
            "--storage-options",
            json.dumps(s3),
            "-q",
            "--repeats",
            "1",
            "-m",
            "5",
            "--json",
            out_json,
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "warm page cache" not in out and "warm:" not in out
    assert "remote epochs over the network" in out and "-m 5 not applied to a URL" in out
    doc = json.load(open(out_json))
    assert doc["cache"].startswith("remote:") and doc["settings"]["warmup"] == 0
    (res,) = doc["results"]
    assert res["config"]["warmup"] == 0 and res["repeats"][0]["warmup_batches"] == 0
    assert res["repeats"][0]["rows"] == N  # the whole epoch timed, from before its first request


def test_file_urls_and_full_shuffle_coalescing(remote_data):
    """file:// with remote options goes through the same store (a synchronous fsspec filesystem:
    a thread pool; without options it is read as a local file); in ``full`` mode consecutive
    segments share blocks, and a block asked for again while held is not fetched again (fewer
    requests than chunks taken)."""
    local = rowstore.open(os.path.join(remote_data, "lz4.h5"))
    plain = rowstore.open("file://" + os.path.join(remote_data, "lz4.h5"))
    assert plain.layout.shard_location().local  # the local store
    r = rowstore.open("file://" + os.path.join(remote_data, "lz4.h5"), remote={})
    sched = None
    got = []
    for b in r.batches(100, shuffle="full", seed=2, window=8):
        sched = r._store.scheduler or sched
        got.append(b)
    same_epochs(local.batches(100, shuffle="full", seed=2, window=8), got)
    assert sched is not None and sched.issued < sched.hits


def test_torch_dataloader_workers_over_http(remote_data, http):
    """A torch DataLoader with 2 forked workers over a remote reader: every row once."""
    torch = pytest.importorskip("torch")
    from rowstore.torch import IterableDataset

    ds = IterableDataset(rowstore.open(http.url + "/ds"), batch_size=100, fields=["label"], seed=3)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    labels = np.sort(np.concatenate([np.asarray(b["label"]) for b in loader]))
    want = np.sort(rowstore.open(os.path.join(remote_data, "ds")).take(np.arange(N))["label"])
    assert np.array_equal(labels, want)


def test_hostile_remote_objects_are_refused(remote_data, tmp_path, http_factory):
    """Damaged pointer, sidecar, shard or file served over HTTP: FormatError (or, for a shard
    cut short, an error naming it), never a crash, a hang or an unbounded allocation."""
    root = tmp_path / "h"
    shutil.copytree(remote_data, root)
    srv = http_factory(str(root))
    ds = root / "ds"
    pointer = (ds / "rowstore.json").read_bytes()
    (ds / "rowstore.json").write_bytes(b"{not json")
    with pytest.raises(FormatError, match="JSON"):
        rowstore.open(srv.url + "/ds")
    (ds / "rowstore.json").write_bytes(b" " * (1 << 17))
    with pytest.raises(FormatError, match="more than"):
        rowstore.open(srv.url + "/ds")
    (ds / "rowstore.json").write_bytes(pointer)
    sidecar = next((ds / "_manifests").glob("*.index"))
    good = sidecar.read_bytes()
    sidecar.write_bytes(good[:-5])
    with pytest.raises(FormatError, match="bytes"):
        rowstore.open(srv.url + "/ds")
    sidecar.write_bytes(good + b"x" * 100)
    with pytest.raises(FormatError):
        rowstore.open(srv.url + "/ds")
    sidecar.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    with pytest.raises(FormatError, match="CRC"):
        rowstore.open(srv.url + "/ds")
    sidecar.write_bytes(good)
    r = rowstore.open(srv.url + "/ds", remote={"retries": 1, "backoff": 0.01})
    shard = root / "ds" / r.layout.shard_paths[-1].split("/ds/", 1)[1]
    shard.write_bytes(shard.read_bytes()[:2000])
    with pytest.raises((FormatError, RemoteError)) as ei:
        r.take(np.arange(N))
    assert shard.name in str(ei.value)
    (root / "junk.h5").write_bytes(os.urandom(5000))
    with pytest.raises(FormatError, match="not an HDF5 file|malformed"):
        rowstore.open(srv.url + "/junk.h5")
