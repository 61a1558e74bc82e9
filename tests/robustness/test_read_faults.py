"""EIO on reads, injected by libfiu (a failing disk).

Each case runs a child under ``fiu-run -x`` (libfiu's POSIX preload library: every ``pread``,
``preadv`` and, where asked, ``read`` of the process goes through a failure point). The child
enables the failure points once with ``fiu_enable_external`` and decides in the callback, by
counting calls, which ones fail with ``EIO``: all of them from a moment it chooses (a disk gone
bad), or one call after N (a transient fault). Only the reads of the data file are ``pread``s
(Python's own file reads, pipes and imports use ``read``), so the faults land in rowstore's
kernels and in libhdf5, the paths a failing disk hits.

The oracle, for a single file and a dataset, raw and lz4: ``rowstore.open``, ``take``,
``reader[i]``, block and full shuffle epochs, the torch ``Dataset`` under a ``DataLoader`` (0 and
2 workers) and ``rowstore verify`` raise an ``OSError`` whose ``errno`` is ``EIO`` (and, from
the kernels, a ``RowstoreError`` naming the file), never return data, never hang (the child
has a timeout), release their descriptors and threads; once the fault stops the same reader
and a fresh one read every value exactly. A short ``pread`` (libfiu's ``pread/reduce``) is
not an error: the values come back exact.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

import rowstore

FIU_RUN = shutil.which("fiu-run")
PRELOAD = "/usr/lib/fiu/fiu_posix_preload.so"
pytestmark = pytest.mark.skipif(not FIU_RUN or not os.path.exists(PRELOAD) or sys.platform != "linux",
                                reason="needs libfiu (apt: fiu-utils, libfiu-dev)")  # fmt: skip

SCHEMA = rowstore.Schema({"x": "int64", "t": rowstore.STR, "v": ("float32", (8,))})
N = 3000


def _rows(n: int = N) -> dict:
    x = np.arange(n, dtype=np.int64)
    return {"x": x, "t": [f"r{i}" * (1 + i % 4) for i in range(n)],
            "v": (x[:, None] * 8 + np.arange(8)).astype(np.float32)}  # fmt: skip


CHILD = r'''
import ctypes, errno, io, json, os, sys, threading, time, contextlib
import numpy as np
import rowstore
from rowstore.cli import main as cli_main

path, torch_too = sys.argv[1], sys.argv[2] == "1"
if torch_too:
    import torch
    import rowstore.torch

fiu = ctypes.CDLL("libfiu.so.0")
CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int),
                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint))
fiu.fiu_enable_external.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, CB]
fiu.fiu_enable_random.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_double]
fiu.fiu_disable.argtypes = [ctypes.c_char_p]
S = {"n": 0, "lo": 0, "hi": 0, "read": False, "failed": 0}  # calls lo < n <= hi fail

@CB
def decide(name, failnum, failinfo, flags):
    if name.endswith(b"/read") and not S["read"]:
        return 0
    S["n"] += 1
    if S["lo"] < S["n"] <= S["hi"]:
        S["failed"] += 1
        return 1
    return 0

for point in (b"posix/io/rw/pread", b"posix/io/rw/preadv", b"posix/io/rw/read"):
    assert fiu.fiu_enable_external(point, 1, errno.EIO, 0, decide) == 0

def fail_from(k=0, count=10**12, read=False):  # calls k+1 .. k+count from now fail
    S["lo"], S["hi"], S["read"] = S["n"] + k, S["n"] + k + count, read

def stop():
    S["lo"] = S["hi"] = 0
    S["read"] = False

x = np.arange(int(sys.argv[3]))
def exact(b):
    return (np.array_equal(np.asarray(b["x"]), x[: len(b["x"])]) if "x" in b else True)

def check_all(r):
    b = r.take(np.arange(len(r)))
    v = np.asarray(b["v"])
    return (len(r) == len(x) and np.array_equal(np.asarray(b["x"]), x)
            and [str(t) for t in b["t"]] == [f"r{i}" * (1 + i % 4) for i in x.tolist()]
            and np.array_equal(v, (x[:, None] * 8 + np.arange(8)).astype(np.float32)))

def epoch(r, shuffle):
    seen = []
    for b in r.batches(128, shuffle=shuffle, seed=3):
        seen.append(np.asarray(b["x"]))
    return np.array_equal(np.sort(np.concatenate(seen)), x)

def outcome(fn):
    """What fn did while the fault was on: the error's type, errno, filename, or returned data."""
    before, t0 = S["failed"], time.time()
    try:
        fn()
    except BaseException as exc:
        e = exc
        while e is not None and not isinstance(e, OSError):  # an OSError reached the caller, or is its cause
            e = e.__cause__ or e.__context__
        rec = {"error": type(exc).__name__, "oserror": isinstance(exc, OSError),
               "errno": getattr(exc, "errno", None), "cause_errno": getattr(e, "errno", None),
               "rowstore": isinstance(exc, rowstore.RowstoreError),
               "filename": getattr(exc, "filename", None) or getattr(exc, "path", None), "msg": str(exc)[-300:],
               "names": path in str(exc)}
    else:
        rec = {"error": None}
    rec["faults"] = S["failed"] - before
    rec["s"] = round(time.time() - t0, 2)
    stop()
    return rec

def fds():
    return sorted(os.listdir("/proc/self/fd"))

def threads():
    return sorted(t.name for t in threading.enumerate())

out = {}
base_fds, base_threads = fds(), threads()

# rowstore.open on a failing disk: every pread and read fails (the pointer and manifest of a
# dataset are read with read()).
fail_from(read=True)
out["open"] = outcome(lambda: rowstore.open(path))

r = rowstore.open(path)
ops = {
    "take": lambda: r.take(np.arange(0, len(r), 7)),
    "getitem": lambda: r[len(r) // 2],
    "block": lambda: epoch(r, "block"),
    "full": lambda: epoch(r, "full"),
    "none": lambda: epoch(r, "none"),
}
for name, fn in ops.items():
    fail_from()
    out[name] = outcome(fn)
    out[name]["after"] = check_all(r)  # the same reader, once the disk is back

# A transient fault: one pread fails, in the middle of an epoch; a fresh reader then reads it all.
fail_from(k=3, count=1)
out["transient"] = outcome(lambda: epoch(r, "full"))
with rowstore.open(path) as fresh:
    out["transient"]["after"] = check_all(fresh) and epoch(fresh, "block")

if torch_too:
    for workers in (0, 2):
        ds = rowstore.torch.Dataset(path)
        def run(ds=ds, workers=workers):
            loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers,
                                                 collate_fn=ds.collate_fn)
            for _ in loader:
                pass
        fail_from()
        out[f"torch{workers}"] = outcome(run)
        ds.close()

# rowstore verify: the disk fails half way through a verify (counted on a clean run first).
def verify():
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli_main(["verify", path])
    return rc, err.getvalue()
n0 = S["n"]
rc, _ = verify()
calls = S["n"] - n0
fail_from(k=calls // 2)
rc_bad, err_bad = verify()
faults = S["failed"]
stop()
rc_ok, _ = verify()
out["verify"] = {"calls": calls, "rc_clean": rc, "rc_fault": rc_bad, "stderr": err_bad[-600:], "rc_after": rc_ok}

# Short reads: libfiu's pread/reduce returns fewer bytes than asked, half the time.
fiu.fiu_enable_random(b"posix/io/rw/pread/reduce", 1, None, 0, 0.5)
fiu.fiu_enable_random(b"posix/io/rw/preadv/reduce", 1, None, 0, 0.5)
with rowstore.open(path) as short:
    out["short_reads"] = check_all(short) and epoch(short, "full") and epoch(short, "block")
fiu.fiu_disable(b"posix/io/rw/pread/reduce")
fiu.fiu_disable(b"posix/io/rw/preadv/reduce")

r.close()
for _ in range(1200):  # DataLoader workers and reader threads end soon after close (60 s: a hang guard)
    if threads() == base_threads:
        break
    time.sleep(0.05)
out["fds_left"] = sorted(set(fds()) - set(base_fds))
out["threads_left"] = sorted(set(threads()) - set(base_threads))
print("RESULT " + json.dumps(out))
'''


def _write(tmp_path, kind: str, compression: str | None) -> str:
    if kind == "file":
        path = str(tmp_path / "f.h5")
        with rowstore.Writer(path, SCHEMA, compression=compression, rows_per_block=128) as w:
            w.write_batch(_rows())
        return path
    path = str(tmp_path / "ds")
    with rowstore.DatasetWriter(path, SCHEMA, mode="w", compression=compression, rows_per_block=128,
                                shard_bytes=60_000) as w:  # fmt: skip
        w.write_batch(_rows())
    assert len(os.listdir(os.path.join(path, "shards"))) >= 3
    return path


def _child(tmp_path, path: str, torch_too: bool) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.run([FIU_RUN, "-x", "-f", "", sys.executable, str(script), path, "1" if torch_too else "0", str(N)],
                          capture_output=True, text=True, timeout=180, env=env)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _assert_eio(rec: dict, path: str, what: str) -> None:
    assert rec["error"] is not None, f"{what}: returned data while every read failed: {rec}"
    assert rec["faults"] >= 1, (what, rec)
    assert rec["oserror"] and rec["errno"] == 5, f"{what}: not an OSError with errno EIO: {rec}"
    assert rec["filename"] and str(rec["filename"]).startswith(path), (what, rec)


@pytest.mark.parametrize(
    "kind,compression", [("file", None), ("dataset", "lz4"), ("file", "lz4"), ("dataset", None)]
)
def test_eio_on_reads(tmp_path, kind, compression):
    path = _write(tmp_path, kind, compression)
    torch_too = (
        kind == "file" and compression is None
    )  # the DataLoader paths once (torch imports slowly)
    if torch_too:
        pytest.importorskip("torch")
    out = _child(tmp_path, path, torch_too)
    # open: a single file's HDF5 metadata (libhdf5: OSError errno 5), a dataset's pointer
    # (read(): OSError errno 5).
    rec = out["open"]
    assert (
        rec["error"] is not None and rec["faults"] >= 1 and rec["oserror"] and rec["errno"] == 5
    ), rec
    for name in ("take", "getitem", "block", "full", "none", "transient"):
        _assert_eio(out[name], path, name)
        assert out[name]["rowstore"], (
            name,
            out[name],
        )  # a KernelIOError: also a FormatError naming the file
        assert out[name]["after"] is True, (
            f"{name}: the reader was poisoned by a fault that has stopped"
        )
    if torch_too:
        _assert_eio(out["torch0"], path, "torch0")
        # Through worker processes torch re-raises the error from its message: still an
        # OSError with the errno (parsed back), the file named in the message.
        rec = out["torch2"]
        assert rec["error"] == "KernelIOError" and rec["oserror"] and rec["errno"] == 5, rec
        assert rec["names"], rec
    v = out["verify"]
    assert v["calls"] > 2 and v["rc_clean"] == 0 and v["rc_after"] == 0, v
    assert v["rc_fault"] != 0 and ("errno 5" in v["stderr"] or "Errno 5" in v["stderr"]), v
    assert out["short_reads"] is True
    assert out["fds_left"] == [] and out["threads_left"] == [], out


def test_kernel_io_error_is_an_oserror_that_pickles():
    import pickle

    from rowstore import kernels

    err = kernels.KernelIOError("'/d/f.h5': block 2: read failed (errno 5: Input/output error)",
                                code=kernels.KernelCode.E_IO, index=0, detail=5, path="/d/f.h5", block=2)  # fmt: skip
    for e in (err, pickle.loads(pickle.dumps(err))):
        assert isinstance(e, OSError) and isinstance(e, rowstore.FormatError)
        assert (e.errno, e.filename, e.path, e.block) == (5, "/d/f.h5", "/d/f.h5", 2)
        assert str(e) == "'/d/f.h5': block 2: read failed (errno 5: Input/output error)"
