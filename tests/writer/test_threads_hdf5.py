"""h5py work on other threads while Writers run (thread-pool shard writers must not crash it).

h5py <= 3.15 calls libhdf5's H5Dwrite_chunk without phil, its global lock (h5py PR 2764), so a
Writer's chunk writes ran inside the non-thread-safe libhdf5 alongside another thread's h5py
calls: a reader opening a file, or another Writer. That corrupted libhdf5's state: h5py
RuntimeError/OSError ("Failed to extract top-level error description", "no VOL object wrap
context"), double frees and segfaults. The writer now holds phil around write_direct_chunk.

Each case runs in a subprocess (a crash must not take pytest down), a few times: before the fix
nearly every run failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT, scaled

SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, traceback
    import numpy as np
    import rowstore
    from rowstore import Field, Layout, Schema

    scenario, d = sys.argv[1], sys.argv[2]
    schema = Schema([Field("i", "int64"), Field("x", "float32", (4,)), Field("t", "str"),
                     Field("w", "float32", (None,))])
    errors = []

    def write(path, n, mode="w", compression=None, threads=None):
        with rowstore.Writer(path, schema, mode=mode, compression=compression, threads=threads,
                             rows_per_block=8, heap_chunk_bytes=1024) as w:
            for i in range(n):
                w.write({"i": i, "x": np.full(4, i, np.float32), "t": "s" * (i % 5),
                         "w": np.arange(i % 9, dtype=np.float32)})

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException:
            errors.append(traceback.format_exc())

    if scenario == "readers":  # one Writer next to threads that open another file
        a = os.path.join(d, "A.h5")
        write(a, 200)
        stop = threading.Event()

        def reader(k):
            while not stop.is_set():
                if k == 0:
                    Layout.open(a, scan=True)
                else:
                    r = rowstore.open(a)
                    r.take([0, 7, 199])
                    r.close()

        ts = [threading.Thread(target=guarded, args=(reader, k)) for k in range(3)]
        for t in ts:
            t.start()
        guarded(write, os.path.join(d, "B.h5"), 3000)
        guarded(write, os.path.join(d, "C.h5"), 1500, "w", "lz4", 1)
        stop.set()
        for t in ts:
            t.join()
    else:  # Writers in parallel threads, one file each, then appends
        def job(k):
            p = os.path.join(d, f"W{k}.h5")
            write(p, 600, compression="lz4" if k % 2 else None)
            write(p, 300, mode="a")
            assert Layout.open(p, scan=True).num_rows == 900

        ts = [threading.Thread(target=guarded, args=(job, k)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    for e in errors:
        print(e, file=sys.stderr)
    sys.exit(3 if errors else 0)
    """
)

RUNS = 3


@pytest.mark.parametrize("scenario", ["readers", "writers"])
def test_hdf5_work_on_other_threads_next_to_writers(tmp_path, scenario):
    script = tmp_path / "threads_repro.py"
    script.write_text(SCRIPT)
    root = ROOT
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for run in range(RUNS):
        d = tmp_path / f"run{run}"
        d.mkdir()
        p = subprocess.run(
            [sys.executable, "-X", "faulthandler", str(script), scenario, str(d)],
            capture_output=True,
            text=True,
            timeout=scaled(60),
            env=env,
        )
        assert p.returncode == 0, f"run {run}: exit status {p.returncode}\n{p.stderr[-4000:]}"
