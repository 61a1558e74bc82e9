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

SCHEMA = Schema([
    Field("x", "float32", (4,)), Field("label", "int64"), Field("name", "str"), Field("note", "bytes", nullable=True),
    Field("wave", "float32", (None,)), Field("img", "uint8", (8, 8, 3), codec="png"),
])  # fmt: skip


def rows(n):
    return [{"x": np.arange(4, dtype=np.float32) + i, "label": 10 * i, "name": f"name {i} é", "note": None if i % 2 else b"n" * i,
             "wave": np.linspace(0, 1, i * 3, dtype=np.float32), "img": np.full((8, 8, 3), i, np.uint8)}
            for i in range(n)]  # fmt: skip


@pytest.fixture(params=[None, "lz4"], ids=["plain", "lz4"])
def dataset(request, rs, tmp_path):
    path = str(tmp_path / "ds.h5")
    rs.write_file(path, SCHEMA, rows(25), rows_per_block=4, heap_chunk_bytes=128, compression=request.param,
                  attrs={"source": "cli test"})  # fmt: skip
    return path


def test_info(dataset, capsys):
    assert main(["info", dataset]) == 0
    out = capsys.readouterr().out
    assert dataset in out
    plain = Layout.open(dataset).compression["id"] == "none"  # uncompressed: v3, with the page index
    assert f"rowstore v{3 if plain else 2}" in out and "written by rowstore" in out and "checksummed footer" in out
    assert ("page CRCs every 4096 bytes" in out) == plain
    assert "rows            25" in out
    assert "7 x 4 rows" in out
    assert '"source": "cli test"' in out
    for name, codec, where in [("x", "raw", "row"), ("name", "utf8", "heap"), ("img", "png(level=6)", "heap")]:
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert codec in line and where in line
    assert "(None,)" in out and "yes" in out  # variable shape, nullable
    compressed = Layout.open(dataset).compressed
    assert ("blosc2 lz4" in out) == compressed and ("compression     none" in out) == (not compressed)


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
    head = subprocess.run([exe, "head", path, "-n", "2"], capture_output=True, text=True, timeout=120, env=env)
    assert head.returncode == 0 and "(2 of 9 rows)" in head.stdout
    ok = subprocess.run([exe, "verify", path], capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = flip(path, str(tmp_path / "bad.h5"), "block")
    res = subprocess.run([exe, "verify", bad], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1 and "checksum" in res.stderr
    mod = subprocess.run([sys.executable, "-m", "rowstore.cli", "verify", bad], capture_output=True, text=True, timeout=120)
    assert mod.returncode == 1 and "checksum" in mod.stderr
