"""Write failures injected with RLIMIT_FSIZE (the kernel refuses writes past a size with EFBIG,
as it refuses them with ENOSPC on a full disk): the writer raises the system's OSError, the
previous file or dataset version stays whole and current, and no temporary file is left for
more than the next writer or gc to remove (issue 17: fault injection)."""

from __future__ import annotations

import errno
import os
import sys

import numpy as np
import pytest

import rowstore

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE semantics checked on Linux")

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
    code = CHILD.format(limit=LIMIT, body="\n".join("    " + line for line in body.strip().splitlines()))
    proc = rs.run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def _small_rows(n: int) -> dict:
    return {"x": np.zeros((n, 64), np.float32), "t": [f"r{i}" for i in range(n)]}


def _temporaries(d: str) -> list[str]:
    return [os.path.join(p, f) for p, _, fs in os.walk(d) for f in fs if f.endswith(".rowstore-tmp")]


def test_a_failing_append_leaves_the_file_whole(rs, tmp_path):
    path = str(tmp_path / "f.h5")
    with rowstore.Writer(path, SCHEMA) as w:
        w.write_batch(_small_rows(100))
    before = open(path, "rb").read()
    out = _run(rs, f"""
w = rowstore.Writer({path!r}, mode="a")
for _ in range(10):
    w.write_batch(rows)
w.close()
""")
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
    out = _run(rs, f"""
with rowstore.DatasetWriter({root!r}, schema, mode={mode!r}, shard_bytes=100_000) as w:
    for _ in range(10):
        w.write_batch(rows)
""")
    assert out == ["errno", str(errno.EFBIG)]
    with rowstore.open(root) as r:
        assert len(r) == 100 and r.layout.version == 1
        assert r.take(np.arange(100))["t"].tolist() == [f"r{i}" for i in range(100)]
    # The shards it had finished are removed by its abort; nothing half-written is left.
    assert sorted(os.listdir(os.path.join(root, "shards"))) == shards and not _temporaries(root)


def test_a_failing_write_shard_publishes_nothing(rs, tmp_path):
    root = str(tmp_path / "ds")
    rowstore.commit(root, [rowstore.write_shard(root, SCHEMA, _small_rows(10))])
    out = _run(rs, f"""
rowstore.write_shard({root!r}, schema, {{"x": np.ones((5000, 64), np.float32), "t": ["z"] * 5000}})
""")
    assert out == ["errno", str(errno.EFBIG)]
    with rowstore.open(root) as r:
        assert len(r) == 10
    assert not _temporaries(root)
