"""The ``rowstore`` console script: info, head, verify (through main(argv) and the installed
script)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rowstore import Field, Layout, Schema
from rowstore.cli import main

SCHEMA = Schema(
    [
        Field("x", "float32", (4,)),
        Field("label", "int64"),
        Field("name", "str"),
        Field("note", "bytes", nullable=True),
        Field("wave", "float32", (None,)),
        Field("img", "uint8", (8, 8, 3), codec="png"),
    ]
)


def rows(n):
    return [
        {
            "x": np.arange(4, dtype=np.float32) + i,
            "label": 10 * i,
            "name": f"name {i} é",
            "note": None if i % 2 else b"n" * i,
            "wave": np.linspace(0, 1, i * 3, dtype=np.float32),
            "img": np.full((8, 8, 3), i, np.uint8),
        }
        for i in range(n)
    ]


@pytest.fixture(params=[None, "lz4"], ids=["plain", "lz4"])
def dataset(request, rs, tmp_path):
    path = str(tmp_path / "ds.h5")
    rs.write_file(
        path,
        SCHEMA,
        rows(25),
        rows_per_block=4,
        heap_chunk_bytes=128,
        compression=request.param,
        attrs={"source": "cli test"},
    )
    return path


def test_info(dataset, capsys):
    assert main(["info", dataset]) == 0
    out = capsys.readouterr().out
    assert dataset in out
    assert (
        "rowstore v3" in out  # every new file has the page index, compressed or not
        and "written by rowstore" in out
        and "checksummed footer" in out
        and "page CRCs every 4096 bytes" in out
    )
    assert "rows            25" in out
    assert "7 x 4 rows" in out
    assert '"source": "cli test"' in out
    for name, codec, where in [
        ("x", "raw", "row"),
        ("name", "utf8", "heap"),
        ("img", "png(level=6)", "heap"),
    ]:
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert codec in line and where in line
    assert "(None,)" in out and "yes" in out  # variable shape, nullable
    compressed = Layout.open(dataset).compressed
    assert ("blosc2 lz4" in out) == compressed and ("compression     none" in out) == (
        not compressed
    )


def test_head(dataset, capsys):
    assert main(["head", dataset, "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert "row 0" in out and "row 2" in out and "row 3" not in out
    assert "(3 of 25 rows)" in out
    assert "name: 'name 1 é'" in out and "label: 10" in out
    assert "note: None" in out and "note: b'nn'" in out
    assert "img: uint8[8, 8, 3]" in out
    assert main(["head", dataset]) == 0
    assert "(5 of 25 rows)" in capsys.readouterr().out
    assert main(["head", dataset, "-n", "100", "--fields", "label", "name"]) == 0
    out = capsys.readouterr().out
    assert "(25 of 25 rows)" in out and "row 24" in out and "img" not in out and "label: 240" in out
    assert main(["head", dataset, "-n", "0"]) == 0
    assert "(0 of 25 rows)" in capsys.readouterr().out


def test_head_empty_file(rs, tmp_path, capsys):
    path = str(tmp_path / "empty.h5")
    rs.write_file(path, SCHEMA, [])
    assert main(["head", path]) == 0
    assert "(0 of 0 rows)" in capsys.readouterr().out
    assert main(["info", path]) == 0 and main(["verify", path]) == 0


def test_verify_ok(dataset, capsys):
    assert main(["verify", dataset]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "7 blocks" in out


def flip(path, dst, where):
    lay = Layout.open(path)
    if where == "block":
        k = min(3, lay.num_blocks - 1)
        pos = int(lay.blocks["offset"][k]) + int(lay.blocks["stored_nbytes"][k]) // 2
    else:
        pos = int(lay.heap_chunks["offset"][1]) + 10
    data = bytearray(open(path, "rb").read())
    data[pos] ^= 0x01
    with open(dst, "wb") as f:
        f.write(data)
    return dst


@pytest.mark.parametrize("where", ["block", "heap chunk"])
def test_verify_reports_a_flipped_byte(dataset, tmp_path, capsys, where):
    bad = flip(dataset, str(tmp_path / "bad.h5"), where)
    assert main(["verify", bad]) == 1
    err = capsys.readouterr().err
    assert "checksum" in err and where in err and "bad.h5" in err
    if where == "block":
        assert "block 3" in err


def test_errors_exit_1(tmp_path, capsys):
    missing = str(tmp_path / "missing.h5")
    for cmd in ("info", "head", "verify"):
        assert main([cmd, missing]) == 1
        assert f"rowstore {cmd}: error" in capsys.readouterr().err
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5" * 100)
    assert main(["info", str(junk)]) == 1
    assert "not an HDF5 file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:
        main([])
    assert ei.value.code == 2
    with pytest.raises(SystemExit):
        main(["head", str(junk), "-n", "x"])


def test_head_refuses_a_negative_count(dataset, capsys):
    with pytest.raises(SystemExit) as ei:
        main(["head", dataset, "-n", "-2"])
    assert ei.value.code == 2 and ">= 0" in capsys.readouterr().err
    from rowstore.cli import head_text

    assert head_text(dataset, -3).endswith("(0 of 25 rows)")


def test_verify_truncated_file(dataset, tmp_path, capsys):
    data = open(dataset, "rb").read()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) // 2])
    assert main(["verify", str(cut)]) == 1
    assert "truncated" in capsys.readouterr().err


def console_script():
    path = os.path.join(os.path.dirname(sys.executable), "rowstore")
    if not os.path.exists(path):
        pytest.skip("the rowstore console script is not installed beside this interpreter")
    return path


def test_installed_console_script(rs, tmp_path):
    exe = console_script()
    path = str(tmp_path / "ds.h5")
    rs.write_file(path, SCHEMA, rows(9), rows_per_block=4, compression="zstd")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    info = subprocess.run([exe, "info", path], capture_output=True, text=True, timeout=120, env=env)
    assert info.returncode == 0, info.stderr
    assert "rows            9" in info.stdout and "blosc2 zstd" in info.stdout
    head = subprocess.run(
        [exe, "head", path, "-n", "2"], capture_output=True, text=True, timeout=120, env=env
    )
    assert head.returncode == 0 and "(2 of 9 rows)" in head.stdout
    ok = subprocess.run([exe, "verify", path], capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = flip(path, str(tmp_path / "bad.h5"), "block")
    res = subprocess.run([exe, "verify", bad], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1 and "checksum" in res.stderr
    mod = subprocess.run(
        [sys.executable, "-m", "rowstore.cli", "verify", bad],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert mod.returncode == 1 and "checksum" in mod.stderr


# -- URLs (a real moto S3 server), --version, Ctrl-C ---------------------------------------------
@pytest.fixture(scope="module")
def s3_data(rs, tmp_path_factory, s3_server):
    """A file, a 3-shard dataset and a copy of the file with a flipped byte, under
    ``s3://rowstore/cli/``; returns the storage options as JSON."""
    fsspec = pytest.importorskip("fsspec")
    import json

    import rowstore

    d = tmp_path_factory.mktemp("cli-s3")
    path = rs.write_file(str(d / "f.h5"), SCHEMA, rows(25), rows_per_block=4, heap_chunk_bytes=128)
    flip(path, str(d / "bad.h5"), "block")
    with rowstore.DatasetWriter(str(d / "ds"), SCHEMA, shard_bytes=2000, rows_per_block=4) as w:
        for r in rows(25):
            w.write(r)
    _, so = s3_server
    fsspec.filesystem("s3", **so).put(str(d) + "/", "rowstore/cli/", recursive=True)
    return json.dumps(so)


def test_every_reading_command_takes_a_url_and_storage_options(s3_data, capsys):
    so = ["--storage-options", s3_data]
    assert main(["info", "s3://rowstore/cli/ds", *so]) == 0
    out = capsys.readouterr().out
    assert (
        "dataset         s3://rowstore/cli/ds" in out
        and "rows            25" in out
        and "shard files" in out
    )
    assert main(["info", "s3://rowstore/cli/f.h5", *so]) == 0
    assert "rows            25" in capsys.readouterr().out
    assert main(["head", "s3://rowstore/cli/f.h5", "-n", "2", *so]) == 0
    assert "(2 of 25 rows)" in capsys.readouterr().out
    for url in ("s3://rowstore/cli/ds", "s3://rowstore/cli/f.h5"):
        assert main(["verify", url, *so]) == 0
        out = capsys.readouterr().out
        assert "OK" in out and "checksums match" in out
    assert main(["order", "s3://rowstore/cli/ds", *so]) == 0
    assert "s3://rowstore/cli/ds: 25 rows in 8 blocks" in capsys.readouterr().out
    assert main(["check-order", "s3://rowstore/cli/ds", *so]) == 0
    assert "FAIL" not in capsys.readouterr().out
    assert main(["quality", "s3://rowstore/cli/ds", *so]) == 0
    assert "25 rows" in capsys.readouterr().out


def test_verify_of_a_url_reports_a_damaged_block(s3_data, capsys):
    assert main(["verify", "s3://rowstore/cli/bad.h5", "--storage-options", s3_data]) == 1
    err = capsys.readouterr().err
    assert "checksum" in err and "block 3" in err and "s3://rowstore/cli/bad.h5" in err


def test_url_errors_name_the_bucket_and_local_paths_refuse_storage_options(
    s3_data, tmp_path, capsys
):
    so = ["--storage-options", s3_data]
    assert main(["info", "s3://no-such-bucket/ds", *so]) == 1
    err = capsys.readouterr().err
    assert "bucket 'no-such-bucket' does not exist" in err and "is missing" not in err
    assert main(["info", "s3://rowstore/cli/absent", *so]) == 1
    assert "is missing" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "x.h5"), *so]) == 1
    assert "--storage-options applies to URLs" in capsys.readouterr().err
    assert main(["gc", "s3://rowstore/cli/ds"]) == 1
    assert "local files only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:
        main(["info", "s3://rowstore/cli/ds", "--storage-options", "[1"])
    assert ei.value.code == 2 and "JSON object" in capsys.readouterr().err


def test_version(capsys):
    import rowstore

    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert (
        ei.value.code == 0 and capsys.readouterr().out.strip() == f"rowstore {rowstore.__version__}"
    )


class _SilentServer:
    """A TCP server on 127.0.0.1 that accepts connections, reads what comes and never answers;
    ``seen`` is set when the first request arrives."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen = threading.Event()
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            try:
                if conn.recv(65536):
                    self.seen.set()
            except OSError:
                pass

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize(
    "command",
    [["rowstore.cli", "info"], ["rowstore.cli", "verify"], ["rowstore.bench"]],
    ids=["info", "verify", "bench"],
)
def test_ctrl_c_prints_one_line_and_exits_130(command):
    """SIGINT while a command waits on a server that never answers: one line, status 130."""
    import signal

    srv = _SilentServer()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", *command, srv.url + "/data.h5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert srv.seen.wait(120), "the command never reached the server"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    finally:
        srv.close()
    name = "rowstore-bench" if command == ["rowstore.bench"] else f"rowstore {command[1]}"
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"{name}: interrupted"], err
    assert "Traceback" not in out + err


def test_demo_module_has_help_and_refuses_unknown_names(capsys):
    from rowstore import demo

    with pytest.raises(SystemExit) as e:
        demo.main(["--help"])
    assert e.value.code == 0 and "tiny" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        demo.main(["bogus"])
    assert e.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["tiny", "0"])


def test_counts_of_one_are_singular(tmp_path, capsys):
    """A dataset of one shard and one row: "1 shard file", "1 row", "1 block", never "1 shard
    files" (or "1 heap chunks")."""
    import rowstore

    path = str(tmp_path / "one")
    with rowstore.DatasetWriter(path, SCHEMA, rows_per_block=1) as w:
        w.write(rows(2)[1])
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "version 1, 1 shard file\n" in out and "1 x 1 row (" in out
    assert "in 1 chunk of" in out
    assert main(["verify", path]) == 0
    out = capsys.readouterr().out
    assert "OK (1 block, 1 heap chunk, checksums match" in out, out
    assert main(["head", path]) == 0 and "(1 of 1 row)" in capsys.readouterr().out
    assert not any(bad in out for bad in ("1 shard files", "1 blocks", "1 heap chunks", "1 rows"))


@pytest.mark.parametrize("what", ["empty", "other files"])
def test_gc_and_repair_of_a_directory_that_is_no_dataset_fail(tmp_path, capsys, what):
    """``rowstore gc`` on a directory that is no dataset and holds nothing of rowstore's (a
    typo, a dataset's parent) said nothing and exited 0; ``repair`` made ``_manifests/`` in
    it. Both now exit 1 naming it, and leave it as it was."""
    d = tmp_path / "not-a-dataset"
    d.mkdir()
    if what == "other files":
        (d / "notes.txt").write_text("hello")
    before = sorted(os.listdir(d))
    for cmd in (["gc"], ["gc", "--dry-run"], ["repair"], ["repair", "--dry-run"]):
        assert main([*cmd, str(d)]) == 1, cmd
        err = capsys.readouterr().err
        assert f"rowstore {cmd[0]}: error" in err and "not a dataset directory" in err, err
        assert sorted(os.listdir(d)) == before
    (d / "data.h5").write_bytes(b"")  # a directory of files: gc looks for their temporaries
    assert main(["gc", str(d)]) == 0
    assert "removed 0 stale temporary file(s)" in capsys.readouterr().out
