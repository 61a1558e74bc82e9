"""``import rowstore`` stays light: no deep-learning framework is imported by the core package,
neither at import time nor while writing and reading (only rowstore.torch / rowstore.tf do)."""

from __future__ import annotations

FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")


def check_no_frameworks(rs, code: str) -> None:
    probe = (
        code
        + f"""
import sys
loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]
assert not loaded, f"imported: {{loaded}}"
print("clean")
"""
    )
    proc = rs.run_python(probe)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("clean")


def test_import_rowstore_and_reader(rs):
    check_no_frameworks(rs, "import rowstore\nimport rowstore.reader\n")


def test_import_core_modules(rs):
    check_no_frameworks(
        rs,
        """
import rowstore
import rowstore.schema, rowstore.errors, rowstore.codecs, rowstore.format, rowstore.writer.file
import rowstore.format.index, rowstore.kernels, rowstore.reader, rowstore.cli, rowstore.demo
from rowstore import *  # noqa
""",
    )


def test_write_and_read_without_frameworks(rs, tmp_path):
    path = str(tmp_path / "a.h5")
    check_no_frameworks(
        rs,
        f"""
import numpy as np
import rowstore
from rowstore import Field, Schema
schema = Schema([Field("x", "float32", (3,)), Field("t", "str"), Field("v", "int16", (None,)),
                 Field("img", "uint8", (4, 4, 3), codec="png")])
with rowstore.Writer({path!r}, schema, rows_per_block=2, compression="lz4") as w:
    for i in range(5):
        w.write({{"x": [i, i, i], "t": str(i), "v": np.arange(i, dtype=np.int16), "img":
        np.zeros((4, 4, 3), np.uint8)}})
r = rowstore.open({path!r})
r[3]
r.take([4, 0])
for b in r.batches(2, shuffle="full", num_threads=2):
    pass
rowstore.Layout.open({path!r}, scan=True)
from rowstore.cli import main
assert main(["info", {path!r}]) == 0
""",
    )


def test_petastorm_names_import_neither_torch_nor_pyarrow(rs):
    check_no_frameworks(
        rs,
        """
import sys
import rowstore.petastorm
from rowstore.petastorm import make_reader, make_batch_reader, TransformSpec, read_unischema
assert "pyarrow" not in sys.modules, "rowstore.petastorm imported pyarrow"
assert "DataLoader" in dir(rowstore.petastorm) and "DataLoader" in rowstore.petastorm.__all__
""",
    )


def test_lazy_names_are_listed_and_reader_is_exported(rs):
    import rowstore
    from rowstore.reader import Reader

    assert rowstore.Reader is Reader and "Reader" in rowstore.__all__
    lazy = [
        "Reader",
        "from_pandas",
        "read_pandas",
        "shuffle",
        "order_quality",
        "from_arrow",
        "from_parquet",
        "from_huggingface",
        "to_huggingface",
        "make_reader",
        "make_batch_reader",
        "TransformSpec",
    ]
    assert set(lazy) <= set(dir(rowstore)) and set(lazy) <= set(rowstore.__all__)
    assert all(hasattr(rowstore, n) for n in rowstore.__all__)
    # Without pyarrow (and so without rowstore.pandas' needs): a star import still works and
    # leaves those names out; asking for one says what to install.
    proc = rs.run_python("""
import sys
sys.modules["pyarrow"] = None  # as if not installed
import rowstore
from rowstore import *  # noqa
assert "from_arrow" not in rowstore.__all__ and "from_pandas" not in rowstore.__all__
assert "from_arrow" in dir(rowstore) and Reader is rowstore.Reader
try:
    rowstore.from_parquet
except ModuleNotFoundError as exc:
    assert "pip install rowstore[parquet]" in str(exc) and exc.name == "pyarrow", exc
else:
    raise AssertionError("no error")
print("clean")
""")
    assert proc.returncode == 0 and proc.stdout.strip() == "clean", proc.stderr[-3000:]
