"""Write failures injected with RLIMIT_FSIZE (the kernel refuses writes past a size with EFBIG,
as it refuses them with ENOSPC on a full disk): the writer raises the system's OSError, the
previous file or dataset version stays whole and current, and no temporary file is left for
more than the next writer or gc to remove (fault injection)."""

from __future__ import annotations

import errno
import os
import sys

import numpy as np
import pytest
from helpers import ROOT

import rowstore

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="RLIMIT_FSIZE semantics checked on Linux"
)

SCHEMA = rowstore.Schema({"x": ("float32", (64,)), "t": rowstore.STR})
LIMIT = 300_000  # bytes per file in the child: a shard of 1 MiB cannot be written

CHILD = """
import os, resource, signal, sys
import numpy as np, rowstore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
schema = rowstore.Schema({{"x": ("float32", (64,)), "t": rowstore.STR}})
rows = {{"x": np.ones((500, 64), np.float32), "t": ["y" * 50] * 500}}
try:
{body}
except OSError as exc:
    print("errno", exc.errno)
    sys.exit(0)
print("no error")
"""


def _run(rs, body: str):
    code = CHILD.format(
        limit=LIMIT, body="\n".join("    " + line for line in body.strip().splitlines())
    )
    proc = rs.run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def _small_rows(n: int) -> dict:
    return {"x": np.zeros((n, 64), np.float32), "t": [f"r{i}" for i in range(n)]}


def _temporaries(d: str) -> list[str]:
    return [
        os.path.join(p, f) for p, _, fs in os.walk(d) for f in fs if f.endswith(".rowstore-tmp")
    ]


def test_a_failing_append_leaves_the_file_whole(rs, tmp_path):
    path = str(tmp_path / "f.h5")
    with rowstore.Writer(path, SCHEMA) as w:
        w.write_batch(_small_rows(100))
    before = open(path, "rb").read()
    out = _run(
        rs,
        f"""
w = rowstore.Writer({path!r}, mode="a")
for _ in range(10):
    w.write_batch(rows)
w.close()
""",
    )
    assert out == ["errno", str(errno.EFBIG)]
    assert open(path, "rb").read() == before and not _temporaries(str(tmp_path))
    with rowstore.open(path) as r:
        assert len(r) == 100


@pytest.mark.parametrize("mode", ["a", "w"])
def test_a_failing_dataset_writer_leaves_the_version_current(rs, tmp_path, mode):
    root = str(tmp_path / "ds")
    with rowstore.DatasetWriter(root, SCHEMA) as w:
        w.write_batch(_small_rows(100))
    shards = sorted(os.listdir(os.path.join(root, "shards")))
    out = _run(
        rs,
        f"""
with rowstore.DatasetWriter({root!r}, schema, mode={mode!r}, shard_bytes=100_000) as w:
    for _ in range(10):
        w.write_batch(rows)
""",
    )
    assert out == ["errno", str(errno.EFBIG)]
    with rowstore.open(root) as r:
        assert len(r) == 100 and r.layout.version == 1
        assert r.take(np.arange(100))["t"].tolist() == [f"r{i}" for i in range(100)]
    # The shards it had finished are removed by its abort; nothing half-written is left.
    assert sorted(os.listdir(os.path.join(root, "shards"))) == shards and not _temporaries(root)


def test_a_failing_write_shard_publishes_nothing(rs, tmp_path):
    root = str(tmp_path / "ds")
    rowstore.commit(root, [rowstore.write_shard(root, SCHEMA, _small_rows(10))])
    out = _run(
        rs,
        f"""
rowstore.write_shard({root!r}, schema, {{"x": np.ones((5000, 64), np.float32), "t": ["z"] * 5000}})
""",
    )
    assert out == ["errno", str(errno.EFBIG)]
    with rowstore.open(root) as r:
        assert len(r) == 10
    assert not _temporaries(root)


# -- EIO on write and on fsync, injected by libfiu (a failing disk) -----------------------------
# A child under ``fiu-run -x`` counts the write-family calls (write, pwrite, writev, pwritev) or
# the fsync/fdatasync calls of one clean operation, then repeats the operation from the same
# starting state (in a forked child: a crash is an outcome too) with one of those calls failing
# with EIO: the first three, the last three and some between. Each time: the operation raises
# OSError errno EIO, the target reads as exactly its old content (or, for an fsync failing after
# the rename, the new one: the data was already synced; the error says durability is in doubt),
# no temporary is left, and a next writer works.
FIU_RUN = __import__("shutil").which("fiu-run")

FIU_CHILD = r'''
import ctypes, errno, json, os, shutil, sys
import numpy as np
import rowstore

fiu = ctypes.CDLL("libfiu.so.0")
CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int),
                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint))
fiu.fiu_enable_external.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, CB]
S = {"on": False, "n": 0, "fail": 0}
family = sys.argv[3]

@CB
def decide(name, failnum, failinfo, flags):
    if not S["on"]:
        return 0
    S["n"] += 1
    return 1 if S["n"] == S["fail"] else 0

points = ([b"posix/io/rw/write", b"posix/io/rw/pwrite", b"posix/io/rw/writev", b"posix/io/rw/pwritev"]
          if family == "write" else [b"posix/io/sync/fsync", b"posix/io/sync/fdatasync"])
for p in points:
    assert fiu.fiu_enable_external(p, 1, errno.EIO, 0, decide) == 0

template, scenario = sys.argv[1], sys.argv[2]
schema = rowstore.Schema({"x": "int64", "t": rowstore.STR})
def rows(lo, hi):
    return {"x": np.arange(lo, hi), "t": [f"r{i}" for i in range(lo, hi)]}
target = "f.h5" if scenario == "append" else "ds"

def operation(work):
    path = os.path.join(work, target)
    if scenario == "append":
        with rowstore.Writer(path, mode="a", rows_per_block=200) as w:
            for lo in range(100, 1600, 500):
                w.write_batch(rows(lo, lo + 500))
    elif scenario == "dataset":
        with rowstore.DatasetWriter(path, schema, mode="a", shard_bytes=8000, rows_per_block=200) as w:
            for lo in range(100, 1600, 500):
                w.write_batch(rows(lo, lo + 500))
    else:  # two-phase: two shards, then one commit
        infos = [rowstore.write_shard(path, schema, rows(lo, lo + 750)) for lo in (100, 850)]
        rowstore.commit(path, infos, mode="a", orphan_grace_s=0)

def content(work):
    with rowstore.open(os.path.join(work, target)) as r:
        b = r.take(np.arange(len(r)))
    x = np.asarray(b["x"])
    ok = [str(t) for t in b["t"]] == [f"r{i}" for i in x.tolist()]
    if ok and np.array_equal(x, np.arange(100)):
        return "old"
    if ok and np.array_equal(x, np.arange(1600)):
        return "new"
    return f"MIX {len(x)} rows"

def temporaries(work):
    return [n for _, _, ns in os.walk(work) for n in ns if n.endswith(".rowstore-tmp")]

def attempt(work, k):
    """The operation with call k failing, in a forked child (a crash of the writer is one of
    the outcomes): what it raised, or how it died."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        S.update(on=True, n=0, fail=k)
        try:
            operation(work)
            err = None
        except BaseException as exc:
            err = exc
        S["on"] = False
        rec = {"calls": S["n"], "error": None if err is None else type(err).__name__,
               "oserror": isinstance(err, OSError), "errno": getattr(err, "errno", None),
               "msg": "" if err is None else str(err)[:300]}
        os.write(wfd, json.dumps(rec).encode())
        os._exit(0)
    os.close(wfd)
    data = b""
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rfd)
    status = os.waitpid(pid, 0)[1]
    if os.WIFSIGNALED(status):
        return {"calls": None, "error": f"signal {os.WTERMSIG(status)}", "oserror": False, "errno": None, "msg": ""}
    return json.loads(data)

def trial(k):
    work = os.path.join(os.path.dirname(template), f"trial-{k}")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work)
    rec = {"k": k, **attempt(work, k)}
    rec["content"] = content(work)
    rec["temporaries"] = temporaries(work)
    # the next writer of the same target works, and gc leaves nothing of the failed one
    path = os.path.join(work, target)
    if scenario == "append":
        with rowstore.Writer(path, mode="a") as w:
            w.write_batch(rows(5000, 5010))
        from rowstore.storage.atomic import remove_stale
        remove_stale(work)
    else:
        rowstore.commit(path, [rowstore.write_shard(path, schema, rows(5000, 5010))], mode="a", orphan_grace_s=0)
        rowstore.gc_dataset(path, dry_run=False, orphan_grace_s=0)
        from rowstore.format import manifest
        named = set(manifest.load(path).shards["path"])
        rec["orphans"] = [n for n in os.listdir(os.path.join(path, "shards")) if "shards/" + n not in named]
    with rowstore.open(path) as r:
        rec["after"] = len(r)
    rec["left_after_recovery"] = temporaries(work)
    shutil.rmtree(work)
    return rec

clean = trial(0)  # fail = 0: nothing fails; counts the calls
n = clean["calls"]
ks = sorted({1, 2, 3, n // 4, n // 2, 3 * n // 4, n - 2, n - 1, n} & set(range(1, n + 1)))  # the last: after the rename
print("RESULT " + json.dumps({"clean": clean, "trials": [trial(k) for k in ks]}))
'''


@pytest.mark.skipif(not FIU_RUN or not os.path.exists("/usr/lib/fiu/fiu_posix_preload.so"),
                    reason="needs libfiu (apt: fiu-utils, libfiu-dev)")  # fmt: skip
@pytest.mark.parametrize("scenario", ["append", "dataset", "two_phase"])
@pytest.mark.parametrize("family", ["write", "fsync"])
def test_eio_on_write_and_fsync(tmp_path, scenario, family):
    import json
    import subprocess

    template = tmp_path / "template"
    template.mkdir()
    old = {"x": np.arange(100), "t": [f"r{i}" for i in range(100)]}
    schema = rowstore.Schema({"x": "int64", "t": rowstore.STR})
    if scenario == "append":
        with rowstore.Writer(str(template / "f.h5"), schema) as w:
            w.write_batch(old)
    else:
        with rowstore.DatasetWriter(str(template / "ds"), schema) as w:
            w.write_batch(old)
    script = tmp_path / "child.py"
    script.write_text(FIU_CHILD)
    root = ROOT
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.run([FIU_RUN, "-x", "-f", "", sys.executable, str(script), str(template), scenario, family],
                          capture_output=True, text=True, timeout=240, env=env)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    clean = out["clean"]
    assert clean["error"] is None and clean["content"] == "new" and clean["calls"] >= 1, clean
    assert len(out["trials"]) >= min(clean["calls"], 6)
    leaks = []
    for t in out["trials"]:
        # What must hold whatever the error: the target whole (old, or new only when an fsync
        # failed after the rename), nothing left once the next writer and gc ran.
        assert t["content"] in ("old", "new"), t
        if t["content"] == "new":
            assert family == "fsync", t
        assert t["left_after_recovery"] == [] and t.get("orphans", []) == [], t
        assert t["after"] == (1610 if t["content"] == "new" else 110), t
        assert t["error"] is not None, (
            f"call {t['k']} of {clean['calls']} failed with EIO and nothing was raised: {t}"
        )
        if t["oserror"] and t["errno"] == errno.EIO:
            assert t["temporaries"] == [], t  # the writer's abort removed its temporary
            continue
        # Known: an EIO while libhdf5 flushes its metadata in File.close surfaces as
        # h5py's RuntimeError (the errno only in its message), or crashes the process inside
        # h5py's close; the data stays safe either way (checked above).
        assert t["error"].startswith("signal") or (
            t["error"] == "RuntimeError" and "errno = 5" in t["msg"]
        ), t
        leaks.append(t)
    # the old content survives most of them (the failure came before the rename)
    assert sum(t["content"] == "old" for t in out["trials"]) >= len(out["trials"]) // 2
    if leaks:
        pytest.xfail(
            f"{len(leaks)} of {len(out['trials'])} EIOs inside libhdf5's close: "
            + ", ".join(sorted({t["error"] for t in leaks}))
            + " instead of OSError (data safe)"
        )
