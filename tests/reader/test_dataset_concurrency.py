"""Many readers while a dataset grows: readers in several processes open and read the dataset
over and over while another process commits appends; every read sees exactly one committed
version, complete (concurrency; versions)."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np

import rowstore

SCHEMA = rowstore.Schema({"x": "int64", "t": rowstore.STR})
STEP = 300  # rows per appended shard


def _rows(lo: int, hi: int) -> dict:
    return {"x": np.arange(lo, hi, dtype=np.int64), "t": [f"row {i}" for i in range(lo, hi)]}


def _reader(root: str, stop, sizes, errors) -> None:
    """Open and read everything until told to stop; record the sizes seen and any mismatch."""
    seen = set()
    try:
        while not stop.is_set():
            with rowstore.open(root) as r:
                n = len(r)
                b = r.take(np.arange(n))
                if not np.array_equal(b["x"], np.arange(n)) or list(b["t"][-3:]) != [
                    f"row {i}" for i in range(max(0, n - 3), n)
                ]:
                    errors.put(f"version {r.layout.version}: rows differ")
                xs = (
                    np.concatenate([c["x"] for c in r.batches(128, shuffle="full", seed=len(seen))])
                    if n
                    else np.zeros(0)
                )
                if sorted(xs.tolist()) != list(range(n)):
                    errors.put(f"version {r.layout.version}: an epoch is not every row once")
                seen.add(n)
    except Exception as exc:  # reported to the test, not lost in the child
        errors.put(f"{type(exc).__name__}: {exc}")
    sizes.put(sorted(seen))


def test_readers_in_many_processes_see_whole_versions_while_commits_append(tmp_path):
    root = str(tmp_path / "ds")
    rowstore.commit(root, [rowstore.write_shard(root, SCHEMA, _rows(0, STEP))])
    ctx = mp.get_context("fork")
    stop, sizes, errors = ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(root, stop, sizes, errors)) for _ in range(4)]
    for p in procs:
        p.start()
    n = STEP
    for _ in range(8):  # appends committed while the readers read
        info = rowstore.write_shard(root, SCHEMA, _rows(n, n + STEP))
        rowstore.commit(root, [info], mode="a")
        n += STEP
    stop.set()
    seen = [sizes.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    errs = []
    while not errors.empty():
        errs.append(errors.get())
    assert not errs, errs[:5]
    committed = set(range(STEP, n + 1, STEP))
    assert all(s and set(s) <= committed for s in seen), seen
    with rowstore.open(root) as r:
        assert len(r) == n and r.layout.version == 9
    assert os.path.isdir(os.path.join(root, "shards"))
