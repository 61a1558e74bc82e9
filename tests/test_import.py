"""``import rowstore`` stays light: no deep-learning framework is imported by the core package,
neither at import time nor while writing and reading (only rowstore.torch / rowstore.tf do)."""

from __future__ import annotations

FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")


def check_no_frameworks(rs, code: str) -> None:
    probe = code + f"""
import sys
loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]
assert not loaded, f"imported: {{loaded}}"
print("clean")
"""
    proc = rs.run_python(probe)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("clean")


def test_import_rowstore_and_reader(rs):
    check_no_frameworks(rs, "import rowstore\nimport rowstore.reader\n")


def test_import_core_modules(rs):
    check_no_frameworks(rs, """
import rowstore
import rowstore.schema, rowstore.errors, rowstore.codecs, rowstore.format, rowstore.writer.file
import rowstore.format.index, rowstore.kernels, rowstore.reader, rowstore.cli, rowstore.demo
from rowstore import *  # noqa
""")


def test_write_and_read_without_frameworks(rs, tmp_path):
    path = str(tmp_path / "a.h5")
    check_no_frameworks(rs, f"""
import numpy as np
import rowstore
from rowstore import Field, Schema
schema = Schema([Field("x", "float32", (3,)), Field("t", "str"), Field("v", "int16", (None,)),
                 Field("img", "uint8", (4, 4, 3), codec="png")])
with rowstore.Writer({path!r}, schema, rows_per_block=2, compression="lz4") as w:
    for i in range(5):
        w.write({{"x": [i, i, i], "t": str(i), "v": np.arange(i, dtype=np.int16), "img": np.zeros((4, 4, 3), np.uint8)}})
r = rowstore.open({path!r})
r[3]
r.take([4, 0])
for b in r.batches(2, shuffle="full", num_threads=2):
    pass
rowstore.Layout.open({path!r}, verify=True)
from rowstore.cli import main
assert main(["info", {path!r}]) == 0
""")
