"""A file appears at its path only when complete: an exception or a SIGKILL mid-write leaves
either nothing or the previous complete file, for fresh writes and appends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema

SCHEMA = Schema([Field("i", "int64"), Field("t", "str"), Field("v", "float32", (None,))])


def rows(start, n):
    return [
        {"i": i, "t": f"row {i} é", "v": np.arange(i % 5, dtype=np.float32)}
        for i in range(start, start + n)
    ]


def only_file(directory, name="data.h5"):
    assert sorted(os.listdir(directory)) == [name]


class Boom(Exception):
    pass


# -- exceptions inside `with` ---------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "lz4"])
@pytest.mark.parametrize(
    "n_before", [0, 3, 50], ids=["nothing-flushed", "partial-block", "many-blocks"]
)
def test_exception_in_with_leaves_no_file(tmp_path, compression, n_before):
    path = str(tmp_path / "data.h5")
    with pytest.raises(Boom):
        with rowstore.Writer(
            path, SCHEMA, rows_per_block=4, heap_chunk_bytes=64, compression=compression
        ) as w:
            for r in rows(0, n_before):
                w.write(r)
            raise Boom()
    assert os.listdir(tmp_path) == []
    with pytest.raises(rowstore.WriterClosedError):
        w.write(rows(0, 1)[0])


@pytest.mark.parametrize("mode", ["w", "a"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_exception_in_with_keeps_previous_file(rs, tmp_path, mode, compression):
    path = str(tmp_path / "data.h5")
    first = rows(0, 10)  # partial last block (4 rows per block)
    rs.write_file(
        path, SCHEMA, first, rows_per_block=4, heap_chunk_bytes=64, compression=compression
    )
    before = open(path, "rb").read()
    with pytest.raises(Boom):
        with rowstore.Writer(
            path, SCHEMA, mode=mode, rows_per_block=4, heap_chunk_bytes=64, compression=compression
        ) as w:
            for r in rows(10, 30):
                w.write(r)
            raise Boom()
    only_file(tmp_path)
    assert open(path, "rb").read() == before
    rs.assert_rows_equal(SCHEMA, first, rs.read_rows(path))


def test_bad_row_escaping_with_discards_the_file(tmp_path):
    path = str(tmp_path / "data.h5")
    with pytest.raises(rowstore.RowValidationError):
        with rowstore.Writer(path, SCHEMA, rows_per_block=2) as w:
            for r in rows(0, 5):
                w.write(r)
            w.write({"i": "not an int", "t": "x", "v": []})
    assert os.listdir(tmp_path) == []


def test_abort_keeps_previous_file_for_append(rs, tmp_path):
    path = str(tmp_path / "data.h5")
    rs.write_file(path, SCHEMA, rows(0, 5), rows_per_block=2)
    before = open(path, "rb").read()
    w = rowstore.Writer(path, mode="a")
    for r in rows(5, 10):
        w.write(r)
    w.abort()
    only_file(tmp_path)
    assert open(path, "rb").read() == before


# -- SIGKILL mid-write ----------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import rowstore
    from rowstore import Field, Schema

    path, mode, compression = sys.argv[1], sys.argv[2], sys.argv[3]
    compression = None if compression == "none" else compression
    schema = Schema([Field("i", "int64"), Field("t", "str"), Field("v", "float32", (None,))])
    kw = dict(rows_per_block=4, heap_chunk_bytes=64, compression=compression) if mode != "a" else {}
    w = rowstore.Writer(path, schema if mode != "a" else None, mode=mode, **kw)
    start = w.num_rows
    for i in range(start, start + 41):  # 10 blocks flushed, a partial one pending
        w.write({"i": i, "t": f"new {i}", "v": np.full(i % 7, i, np.float32)})
    sys.stdout.write(f"written {w.num_rows}\\n")
    sys.stdout.flush()
    sys.stdin.readline()  # blocks until the parent kills us
    w.close()
    sys.stdout.write("closed\\n")
    """
)


def run_and_kill(tmp_path, path, mode, compression):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, mode, compression or "none"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("written"), (
            line,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        # mid-write: blocks went to a temporary file beside the final path
        tmp = [n for n in os.listdir(tmp_path) if n != "data.h5"]
        assert (
            len(tmp) == 1 and tmp[0].startswith(".data.h5.") and tmp[0].endswith(".rowstore-tmp")
        ), tmp
        assert os.path.getsize(tmp_path / tmp[0]) > 0
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return tmp[0]


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_sigkill_during_first_write_leaves_no_file(rs, tmp_path, compression):
    path = str(tmp_path / "data.h5")
    leftover = run_and_kill(tmp_path, path, "w", compression)
    assert not os.path.exists(path)
    # only the dead writer's temporary file remains (it cannot clean up after SIGKILL)
    assert os.listdir(tmp_path) == [leftover]
    # a new writer is not disturbed by it
    rs.write_file(path, SCHEMA, rows(0, 3))
    assert len(rowstore.open(path)) == 3


@pytest.mark.parametrize("mode", ["a", "w"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_sigkill_during_append_or_rewrite_keeps_previous_file(rs, tmp_path, mode, compression):
    path = str(tmp_path / "data.h5")
    first = rows(0, 10)  # partial last block and partial heap chunk: an append reopens them
    rs.write_file(
        path, SCHEMA, first, rows_per_block=4, heap_chunk_bytes=64, compression=compression
    )
    before = open(path, "rb").read()
    leftover = run_and_kill(tmp_path, path, mode, compression)
    assert sorted(os.listdir(tmp_path)) == sorted(["data.h5", leftover])
    assert open(path, "rb").read() == before
    rowstore.Layout.open(path, scan=True)
    rs.assert_rows_equal(SCHEMA, first, rs.read_rows(path))
    # and the file still takes an append
    with rowstore.Writer(path, mode="a") as w:
        for r in rows(10, 3):
            w.write(r)
    rs.assert_rows_equal(SCHEMA, first + rows(10, 3), rs.read_rows(path))


def test_child_completes_when_not_killed(rs, tmp_path):
    """The child script itself works: let it finish and check its file."""
    path = str(tmp_path / "data.h5")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, path, "w", "lz4"],
        input="go\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["written 41", "closed"]
    only_file(tmp_path)
    got = rs.read_rows(path)
    assert [r["i"] for r in got] == list(range(41)) and got[40]["t"] == "new 40"


def test_abort_warns_when_closing_the_discarded_file_fails(tmp_path, monkeypatch):
    """abort keeps going (the temporary file is removed) but says that the close failed."""
    import h5py

    path = str(tmp_path / "data.h5")
    w = rowstore.Writer(path, SCHEMA, rows_per_block=2)
    for r in rows(0, 5):
        w.write(r)
    real_close = h5py.File.close

    def failing_close(self):
        real_close(self)
        raise OSError("disk full")

    monkeypatch.setattr(h5py.File, "close", failing_close)
    with pytest.warns(RuntimeWarning, match="disk full"):
        w.abort()
    assert os.listdir(tmp_path) == []
