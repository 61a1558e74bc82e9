"""Resources the adapters and command-line tools hold: a reader they open from a path is closed
when they are closed, leave a ``with`` block, finish (tf generators) or are collected; a reader
the caller passed in stays open. Counted as this process's descriptors to the dataset file
(``/proc/self/fd``); also the threads and child processes they start."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from helpers import wait_until

import rowstore
from rowstore import Field, Layout, Schema

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd"
)

N = 40
SCHEMA = Schema(
    [Field("id", "int64"), Field("x", "float32", (3,)), Field("wave", "float32", (None,))]
)


def _rows(n):
    return [
        {"id": i, "x": np.full(3, i, np.float32), "wave": np.arange(i % 5, dtype=np.float32)}
        for i in range(n)
    ]


@pytest.fixture
def path(rs, tmp_path):
    p = str(tmp_path / "ds.h5")
    rs.write_file(p, SCHEMA, _rows(N), rows_per_block=4)
    return p


def fds_to(path: str) -> int:
    """Descriptors of this process open on ``path``."""
    real = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == real:
                n += 1
        except OSError:  # the descriptor listdir used, closed since
            pass
    return n


def wait_fds(path: str, want: int, timeout: float = 10.0) -> int:
    """``fds_to(path)`` once it equals ``want`` (collecting garbage meanwhile), or at the hang
    guard ``scaled(timeout)``."""

    def settled() -> bool:
        gc.collect()
        return fds_to(path) == want

    wait_until(settled, timeout=timeout)
    return fds_to(path)


def _corrupt_block(path: str, block: int) -> None:
    """Invert the first stored byte of ``block`` (its checksum no longer matches)."""
    off = int(Layout.open(path).blocks["offset"][block])
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, off)[0] ^ 0xFF]), off)
    finally:
        os.close(fd)


def _ids(batches, key="id"):
    return sorted(int(i) for b in batches for i in np.asarray(b[key]).reshape(-1))


# -- torch -------------------------------------------------------------------------------------
@pytest.fixture
def rst():
    pytest.importorskip("torch")
    return pytest.importorskip("rowstore.torch")


def test_torch_dataset_close_closes_the_reader_it_opened(rst, path):
    ds = rst.Dataset(path)
    assert ds[3]["id"].item() == 3
    assert fds_to(path) == 1
    ds.close()
    assert fds_to(path) == 0
    assert ds[4]["id"].item() == 4  # still usable: the reader reopens lazily
    ds.close()
    with rst.Dataset(path) as ds2:
        ds2.__getitems__([0, 5, 9])
        assert fds_to(path) == 1
    assert fds_to(path) == 0


def test_torch_dataset_collected_closes_the_reader(rst, path):
    ds = rst.Dataset(path)
    ds.__getitems__([1, 2])
    assert fds_to(path) == 1
    del ds
    assert wait_fds(path, 0) == 0


@pytest.mark.parametrize("threads", [1, 2])
def test_torch_iterable_close_stops_iteration_and_closes_the_reader(rst, path, threads):
    import threading

    before = set(threading.enumerate())  # threads of other tests may end meanwhile: not counted
    ds = rst.IterableDataset(path, batch_size=4, num_threads=threads, shuffle="none")
    it = iter(ds)
    assert next(it)["id"].tolist() == [0, 1, 2, 3]
    assert fds_to(path) == 1
    ds.close()  # a suspended iteration (its reader threads) is stopped before the file closes
    assert fds_to(path) == 0
    assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]
    with pytest.raises(StopIteration):
        next(it)
    with rst.IterableDataset(path, batch_size=8) as ds2:
        assert _ids(ds2) == list(range(N))
    assert fds_to(path) == 0


def test_torch_iterable_pickles_with_iterations_running(rst, path):
    import pickle

    ds = rst.IterableDataset(path, batch_size=8, shuffle="none")
    it = iter(ds)
    next(it)
    clone = pickle.loads(pickle.dumps(ds))  # what spawn workers receive
    assert _ids(clone) == list(range(N))
    clone.close()
    ds.close()
    assert fds_to(path) == 0


def test_torch_memory_cache_closes_its_reader_once_loaded(rst, path):
    dl = rst.BatchedDataLoader(path, batch_size=8, cache="memory")
    assert _ids(dl) == list(range(N))
    assert fds_to(path) == 0  # everything is in memory: no descriptor kept
    dl.close()


def test_torch_batched_loader_closes_the_reader_it_opened(rst, path):
    with rst.BatchedDataLoader(path, batch_size=8, num_threads=2) as dl:
        it = iter(dl)
        next(it)
        assert fds_to(path) == 1
    assert fds_to(path) == 0


@pytest.mark.parametrize("kind", ["Dataset", "IterableDataset", "BatchedDataLoader"])
def test_torch_adapters_leave_a_passed_reader_open(rst, path, kind):
    with rowstore.open(path) as r:
        r.take([0])
        assert fds_to(path) == 1
        with getattr(rst, kind)(
            r, **({} if kind in ("Dataset", "IterableDataset") else {"batch_size": 8})
        ) as a:
            if kind == "Dataset":
                a.__getitems__([0, 1])
            else:
                next(iter(a))
        assert r._store.is_open and fds_to(path) == 1
        assert r.take([7])["id"].tolist() == [7]
    assert fds_to(path) == 0


# -- tensorflow --------------------------------------------------------------------------------
@pytest.fixture
def rtf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    pytest.importorskip("tensorflow")
    return pytest.importorskip("rowstore.tf")


@pytest.mark.parametrize("k", [1, 3])
def test_tf_dataset_iterated_closes_the_reader_it_opened(rtf, path, k):
    ds = rtf.make_dataset(path, batch_size=8, num_parallel_reads=k, num_epochs=2)
    assert _ids(ds) == sorted(list(range(N)) * 2)
    assert wait_fds(path, 0) == 0  # while the dataset lives on
    assert _ids(ds.take(1)) != []  # iterable again
    assert wait_fds(path, 0) == 0


def test_tf_iteration_stopped_early_closes_the_reader(rtf, path):
    ds = rtf.make_dataset(path, batch_size=4, num_threads=2, prefetch=None)
    it = iter(ds)
    next(it)
    assert fds_to(path) == 1
    del it
    assert wait_fds(path, 0) == 0


def test_tf_leaves_a_passed_reader_open(rtf, path):
    with rowstore.open(path) as r:
        r.take([0])
        assert _ids(rtf.make_dataset(r, batch_size=8, num_parallel_reads=2)) == list(range(N))
        gc.collect()
        assert r._store.is_open and fds_to(path) == 1
    assert fds_to(path) == 0


def test_tf_distribute_dataset_fn_closes_the_reader_it_opened(rtf, path):
    import tensorflow as tf

    fn = rtf.distribute_dataset_fn(path, global_batch_size=8, shuffle="none")
    got = []
    for pid in range(2):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pid, num_replicas_in_sync=2
        )
        got += _ids(fn(ctx))
    assert sorted(got) == list(range(N))
    assert wait_fds(path, 0) == 0


def test_tf_read_errors_keep_path_and_block_in_the_message(rtf, path):
    # tf.data turns any Python exception of a generator into an OpError (a ValueError such as
    # ChecksumError into InvalidArgumentError; even a raised OpError's code is dropped), so the
    # rowstore error's class, path and block can only travel in the message.
    import tensorflow as tf

    _corrupt_block(path, 2)
    ds = rtf.make_dataset(path, batch_size=4, shuffle="none")
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        list(ds)
    msg = str(info.value)
    assert "ChecksumError" in msg and repr(path) in msg and "block 2" in msg
    del info
    assert wait_fds(path, 0) == 0  # the failed generator closed the reader too


# -- the rowstore command ----------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["info"], ["head", "-n", "3"], ["verify"]])
def test_cli_commands_close_the_file(path, argv, capsys):
    from rowstore.cli import main

    assert main(argv[:1] + [path] + argv[1:]) == 0
    assert fds_to(path) == 0


def test_cli_head_closes_the_file_when_reading_fails(path, capsys):
    from rowstore.cli import head_text, main

    _corrupt_block(path, 0)
    with pytest.raises(rowstore.ChecksumError) as info:
        head_text(path, 3)
    assert info.value.path == path and info.value.block == 0
    assert fds_to(path) == 0  # even while the traceback (and its frames) are kept
    assert main(["head", path]) == 1
    assert "block 0" in capsys.readouterr().err
    assert fds_to(path) == 0


# -- rowstore-bench ----------------------------------------------------------------------------
def test_bench_measure_closes_the_source_when_measuring_fails(monkeypatch):
    from rowstore.bench import runner, sources

    closed = []

    def broken_quality() -> float:
        raise RuntimeError("no quality today")

    src = sources.Source(
        label="fake",
        description="",
        names=["id"],
        epoch=lambda k: iter(()),
        shuffle_quality=broken_quality,
        num_batches=0,
        close=lambda: closed.append(True),
    )
    monkeypatch.setattr(sources, "open_source", lambda spec: src)
    with pytest.raises(RuntimeError, match="no quality today"):
        runner.measure_spec({"kind": "rowstore"}, emit=lambda ev: None)
    assert closed == [True]


def test_bench_run_spec_stops_its_child_when_the_caller_fails(path, monkeypatch):
    import subprocess

    from rowstore.bench import runner

    children: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            children.append(self)

    def on_event(ev: dict) -> None:
        raise RuntimeError("the caller gave up")

    monkeypatch.setattr(runner.subprocess, "Popen", Recorded)
    spec = {
        "kind": "rowstore",
        "path": path,
        "batch_size": 4,
        "shuffle": "none",
        "window": 4,
        "seed": 0,
        "repeats": 10**6,
    }  # far more than the test waits for
    try:
        with pytest.raises(RuntimeError, match="the caller gave up"):
            runner.run_spec(spec, on_event=on_event)
        (child,) = children
        assert (
            child.returncode is not None
        )  # killed and reaped, not left writing to a pipe nobody reads
        assert child.stdout is not None and child.stdout.closed
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
