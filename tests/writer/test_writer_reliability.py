"""Writer reliability: an append refuses a corrupt tail instead of re-checksumming it, one writer
per target at a time (an advisory lock), stale temporaries of killed writers are removed, and a
directory as path is refused at construction."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.cli import main as cli_main

SCHEMA = Schema([Field("i", "int64"), Field("t", "str")])
INLINE = Schema([Field("i", "int64"), Field("x", "float32", (4,))])


def rows(start, n):
    return [{"i": i, "t": f"row {i} " + "x" * (i % 7)} for i in range(start, start + n)]


def write(path, n, *, compression=None, schema=SCHEMA):
    with rowstore.Writer(
        path, schema, rows_per_block=8, heap_chunk_bytes=128, compression=compression
    ) as w:
        for r in (
            rows(0, n)
            if schema is SCHEMA
            else ({"i": i, "x": np.full(4, i, np.float32)} for i in range(n))
        ):
            w.write(r)


def flip_byte(path, dataset, chunk, at=0):
    """Flip one stored byte of chunk number ``chunk`` of ``/rowstore/<dataset>``."""
    with h5py.File(path, "r") as f:
        info = f["rowstore"][dataset].id.get_chunk_info(chunk)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + min(at, info.size - 1))
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0x5A]))


def listing(directory):
    return sorted(os.listdir(directory))


# -- 1. an append verifies the chunks it reloads -------------------------------------------
@pytest.mark.parametrize("compression", [None, "lz4"])
@pytest.mark.parametrize("dataset", ["rows", "heap"])
def test_append_refuses_corrupt_partial_tail(tmp_path, compression, dataset):
    path = str(tmp_path / "data.h5")
    write(path, 21, compression=compression)  # 3 blocks of 8 rows, the last one partial
    layout = rowstore.Layout.open(path)
    assert int(layout.blocks["num_rows"][-1]) < layout.rows_per_block
    assert layout.heap_nbytes % layout.heap_chunk_bytes, "the last heap chunk must be partial too"
    last = (layout.num_blocks if dataset == "rows" else len(layout.heap_chunks)) - 1
    flip_byte(path, dataset, last, at=3)
    before = pathlib.Path(path).read_bytes()
    with pytest.raises(rowstore.ChecksumError) as info:
        rowstore.Writer(path, mode="a")
    assert path in str(info.value) and info.value.path == path
    if dataset == "rows":
        assert info.value.block == last
    assert pathlib.Path(path).read_bytes() == before  # untouched, and nothing left beside it
    assert listing(tmp_path) == ["data.h5"]


def test_append_refuses_corrupt_inline_only_block(tmp_path):
    path = str(tmp_path / "data.h5")
    write(path, 13, schema=INLINE)
    flip_byte(path, "rows", 1, at=5)
    with pytest.raises(rowstore.ChecksumError):
        rowstore.Writer(path, mode="a")
    assert listing(tmp_path) == ["data.h5"]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_append_to_sound_file_still_continues_the_tail(rs, tmp_path, compression):
    path = str(tmp_path / "data.h5")
    write(path, 21, compression=compression)
    with rowstore.Writer(path, mode="a") as w:
        for r in rows(21, 30):
            w.write(r)
    rowstore.Layout.open(path).verify()
    got = rs.read_rows(path, verify="always")
    assert [int(r["i"]) for r in got] == list(range(51))
    assert [str(r["t"]) for r in got] == [r["t"] for r in rows(0, 51)]


# -- 2. one writer per target ---------------------------------------------------------------
def test_second_writer_in_process_is_refused(tmp_path):
    path = str(tmp_path / "data.h5")
    write(path, 5)
    w = rowstore.Writer(path, mode="a")
    for mode in ("a", "w"):
        with pytest.raises(rowstore.ConcurrentWriterError) as info:
            rowstore.Writer(path, SCHEMA, mode=mode)
        assert isinstance(info.value, BlockingIOError) and isinstance(
            info.value, rowstore.RowstoreError
        )
        assert (
            path in str(info.value)
            and "another writer" in str(info.value)
            and info.value.path == path
        )
    new = str(tmp_path / "new.h5")
    with rowstore.Writer(new, SCHEMA, mode="x"):  # a file not there yet is locked too
        with pytest.raises(rowstore.ConcurrentWriterError):
            rowstore.Writer(new, SCHEMA, mode="x")
    os.unlink(new)
    # readers are not blocked
    assert rowstore.Layout.open(path).num_rows == 5
    w.write(rows(5, 1)[0])
    w.close()
    with rowstore.Writer(path, mode="a") as w2:  # released at close
        w2.write(rows(6, 1)[0])
    w3 = rowstore.Writer(path, mode="a")
    w3.abort()
    rowstore.Writer(path, mode="a").close()  # released at abort
    assert rowstore.Layout.open(path).num_rows == 7
    assert listing(tmp_path) == ["data.h5"]


def test_writers_through_a_symlink_share_the_lock(tmp_path):
    path = str(tmp_path / "data.h5")
    write(path, 5)
    os.symlink(path, tmp_path / "link.h5")
    with rowstore.Writer(path, mode="a"):
        with pytest.raises(rowstore.ConcurrentWriterError):
            rowstore.Writer(str(tmp_path / "link.h5"), mode="a")


APPENDER = textwrap.dedent(
    """
    import sys
    import rowstore

    path, n = sys.argv[1], int(sys.argv[2])
    try:
        w = rowstore.Writer(path, mode="a")
    except rowstore.ConcurrentWriterError as exc:
        print("busy", exc, flush=True)
        sys.exit(3)
    start = w.num_rows
    for i in range(start, start + n):
        w.write({"i": i, "t": f"new {i}"})
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "close":
        w.close()
        print("closed", flush=True)
    """
)


@contextlib.contextmanager
def appender(path, n):
    """A child process that has appended ``n`` rows to ``path`` and holds its writer open
    (send it "close" to commit); killed on the way out if still running."""
    proc = subprocess.Popen(
        [sys.executable, "-c", APPENDER, path, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("ready"), proc.stderr.read()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()


def test_two_processes_appending_one_is_refused_none_lost(tmp_path):
    path = str(tmp_path / "data.h5")
    write(path, 1000)
    with appender(path, 5000) as a:
        b = subprocess.run(
            [sys.executable, "-c", APPENDER, path, "5000"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert b.returncode == 3 and b.stdout.startswith("busy") and "another writer" in b.stdout, (
            b.stdout,
            b.stderr,
        )
        assert rowstore.Layout.open(path).num_rows == 1000  # readers see the old file meanwhile
        out, err = a.communicate("close\n", timeout=60)
        assert a.returncode == 0 and "closed" in out, err
    assert rowstore.Layout.open(path).num_rows == 6000
    assert listing(tmp_path) == ["data.h5"]


# -- 3. stale temporaries -------------------------------------------------------------------
def kill_mid_write(path, n=50):
    """SIGKILL an appender of ``path`` once it has written ``n`` rows: it leaves its temporary."""
    with appender(path, n) as proc:
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL


def temporaries(directory):
    return [n for n in listing(directory) if n.endswith(".rowstore-tmp")]


def test_new_writer_removes_stale_temporaries_of_its_target_only(tmp_path):
    path = str(tmp_path / "data.h5")
    write(path, 20)
    write(str(tmp_path / "other.h5"), 20)
    kill_mid_write(path)
    kill_mid_write(str(tmp_path / "other.h5"))
    stale = temporaries(tmp_path)
    assert len(stale) == 2 and any(n.startswith(".data.h5.") for n in stale)
    (tmp_path / ".data.h5.notarandom.rowstore-tmp").write_bytes(
        b"not ours"
    )  # not the exact pattern
    before = pathlib.Path(path).read_bytes()
    with rowstore.Writer(path, mode="a") as w:  # the dead writer's lock went with it
        now = temporaries(tmp_path)
        assert {n for n in stale if n.startswith(".data.h5.")}.isdisjoint(now)  # removed
        assert {n for n in stale if n.startswith(".other.h5.")} <= set(
            now
        )  # another target's: kept
        assert (
            len(
                [
                    n
                    for n in now
                    if n.startswith(".data.h5.") and n not in stale and "notarandom" not in n
                ]
            )
            == 1
        )  # w's
        w.write(rows(20, 1)[0])
    assert pathlib.Path(path).read_bytes() != before
    left = temporaries(tmp_path)
    assert sorted(left) == sorted(
        [n for n in stale if n.startswith(".other.h5.")] + [".data.h5.notarandom.rowstore-tmp"]
    )


def test_gc_removes_stale_temporaries_but_not_a_live_writers(tmp_path, capsys):
    path = str(tmp_path / "data.h5")
    other = str(tmp_path / "other.h5")
    write(path, 20)
    write(other, 20)
    kill_mid_write(path)
    stale = temporaries(tmp_path)
    with appender(other, 50) as live:
        live_tmp = [n for n in temporaries(tmp_path) if n.startswith(".other.h5.")]
        assert len(live_tmp) == 1
        assert cli_main(["gc", "--dry-run", str(tmp_path)]) == 0
        assert stale[0] in capsys.readouterr().out
        assert sorted(temporaries(tmp_path)) == sorted(stale + live_tmp)
        assert cli_main(["gc", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert (
            f"removed: {tmp_path / stale[0]}" in out
            and f"kept (a writer is active): {tmp_path / live_tmp[0]}" in out
        )
        assert temporaries(tmp_path) == live_tmp
        live.communicate("close\n", timeout=60)
    assert rowstore.Layout.open(other).num_rows == 70
    kill_mid_write(path)
    assert cli_main(["gc", path]) == 0  # a file path: its own temporaries
    assert temporaries(tmp_path) == []
    assert listing(tmp_path) == ["data.h5", "other.h5"]


# -- 4. a directory as path -----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["w", "x", "a"])
def test_directory_as_path_is_refused_at_construction(tmp_path, mode):
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        rowstore.Writer(str(tmp_path), SCHEMA, mode=mode)
    assert listing(tmp_path) == []


def test_schema_too_wide_for_hdf5_is_refused_before_any_row(tmp_path):
    """~1,000+ scalar fields: HDF5 cannot store the row type in one object header message.
    The writer used to accept rows and fail inside h5py at the first block."""
    wide = rowstore.Schema([rowstore.Field(f"field_number_{i}", "float32") for i in range(2000)])
    target = tmp_path / "wide.h5"
    with pytest.raises(rowstore.SchemaError, match="array"):
        rowstore.Writer(str(target), wide)
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    ok = rowstore.Schema([rowstore.Field(f"field_number_{i}", "float32") for i in range(500)])
    with rowstore.Writer(str(target), ok) as w:
        w.write({f"field_number_{i}": float(i) for i in range(500)})
    assert rowstore.open(str(target))[0]["field_number_499"] == 499.0
    with pytest.raises(rowstore.SchemaError, match="user attributes"):
        rowstore.Writer(str(tmp_path / "a.h5"), ok, attrs={"notes": "x" * 70_000})


def test_attributes_grown_too_large_are_refused_at_close_without_losing_rows(tmp_path):
    target = str(tmp_path / "attrs.h5")
    w = rowstore.Writer(target, Schema([Field("i", "int64")]))
    w.write_batch({"i": np.arange(100)})
    w.attrs["log"] = "x" * 70_000
    with pytest.raises(rowstore.SchemaError, match="user attributes"):
        w.close()
    del w.attrs["log"]
    w.close()
    assert len(rowstore.open(target)) == 100
