"""Petastorm datasets into rowstore without petastorm: the committed fixture (written by real
Petastorm 0.13.1, tests/data/make_petastorm_fixture.py) converts with exact values, in row
order; hostile or corrupt Unischema pickles are refused without running anything."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
from helpers import DATA, ROOT, raised_without_blocking

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import rowstore  # noqa: E402
from rowstore import FormatError, RowstoreError  # noqa: E402
from rowstore.errors import InputError  # noqa: E402
from rowstore.petastorm import UNISCHEMA_KEY, import_petastorm, load_unischema, read_unischema  # noqa: E402

HELLO = os.path.join(DATA, "petastorm_hello")


@pytest.fixture(scope="module")
def expected():
    with np.load(HELLO + "_expected.npz") as e, np.load(HELLO + "_petastorm.npz") as p:
        return {k: e[k] for k in e.files} | {"gray_petastorm": p["gray"]}


def test_unischema_read_without_petastorm():
    uni = read_unischema("file://" + HELLO)
    got = {
        f.name: (f.dtype, f.shape, f.codec, f.nullable, f.image_format, f.spark_type)
        for f in uni.fields
    }
    assert got == {
        "id": ("int32", (), "scalar", False, None, "IntegerType"),
        "image1": ("uint8", (32, 64, 3), "image", False, "png", None),
        "gray": ("uint8", (16, 16), "image", False, "jpeg", None),
        "array_4d": ("uint8", (None, 4, 3, None), "ndarray", False, None, None),
        "score": ("float64", (), "scalar", False, None, "DoubleType"),
        "name": ("str", (), "scalar", True, None, "StringType"),
        "matrix": ("float32", (5, 5), "compressed_ndarray", False, None, None),
    }
    assert "petastorm" not in sys.modules


def _check_values(path: str, expected: dict) -> None:
    with rowstore.open(path) as r:
        n = len(r)
        b = r.take(np.arange(n))
        s = r.schema
    assert n == 24
    assert s["image1"].codec["id"] == "png" and s["array_4d"].shape == (None, 4, 3, None)
    np.testing.assert_array_equal(
        b["id"], expected["id"]
    )  # Petastorm's row order (files, then row groups)
    for name in ("image1", "matrix", "score"):
        assert (
            b[name].dtype == expected[name].dtype and b[name].tobytes() == expected[name].tobytes()
        ), name
    np.testing.assert_array_equal(
        b["gray"], expected["gray_petastorm"]
    )  # JPEG: as Petastorm decodes it
    for i in range(n):
        a = b["array_4d"][i]
        assert a.dtype == np.uint8 and a.shape == expected[f"array_4d_{i}"].shape
        np.testing.assert_array_equal(a, expected[f"array_4d_{i}"])
    names = [None if null else str(v) for v, null in zip(expected["name"], expected["name_null"])]
    assert list(b["name"]) == names and list(b["name__null"]) == list(expected["name_null"])


def test_fixture_converts_with_exact_values(tmp_path, expected):
    out = str(tmp_path / "ds")
    import_petastorm("file://" + HELLO, out)
    _check_values(out, expected)
    # from_parquet recognises a Petastorm directory by itself; petastorm=False keeps the payloads
    rowstore.arrow.from_parquet(HELLO, str(tmp_path / "one.h5"))
    _check_values(str(tmp_path / "one.h5"), expected)
    raw = rowstore.arrow.from_parquet(
        HELLO, str(tmp_path / "raw.h5"), petastorm=False, columns=["id", "image1"]
    )
    assert raw["image1"].dtype == "bytes"


def test_cli_import_petastorm(tmp_path, expected):
    out = str(tmp_path / "cli")
    root = ROOT  # this checkout first
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
    p = subprocess.run(
        [sys.executable, "-m", "rowstore.cli", "import-petastorm", "file://" + HELLO, out],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "7 fields written" in p.stdout
    _check_values(out, expected)
    p = subprocess.run(
        [sys.executable, "-m", "rowstore.cli", "import-petastorm", str(tmp_path), out + "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 1 and "not a Petastorm dataset: no _common_metadata" in p.stderr


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch " + _Boom.marker,))


def _hostile_pickles(marker: str) -> dict[str, bytes]:
    _Boom.marker = marker
    real = read_unischema(HELLO)
    good = pq.read_metadata(os.path.join(HELLO, "_common_metadata")).metadata[UNISCHEMA_KEY]
    assert real is not None
    return {
        "os.system": pickle.dumps(_Boom()),
        "eval": b"cbuiltins\neval\n(V__import__('os').system('touch "
        + marker.encode()
        + b"')\ntR.",
        "nested global": good.replace(b"\x8c\x0bOrderedDict", b"\x8c\x0bSystemError"),
        "truncated": good[: len(good) // 2],
        "not a unischema": pickle.dumps(OrderedDict(a=1)),
        "garbage": b"\x80\x04\x95garbage",
        "empty": b"",
        "bad shape": good.replace(b"K\x20K\x40K\x03\x87", b"K\x20J\xff\xff\xff\xffK\x03\x87"),
        # numpy.dtype(s) for the first field's np.int32, three memo entries as before
        **{
            f"dtype {s!r}": good.replace(
                b"\x8c\x05numpy\x94\x8c\x05int32\x94\x93\x94",
                b"\x8c\x05numpy\x94\x8c\x05dtype\x94\x93\x8c" + bytes([len(s)]) + s + b"\x85R\x94",
            )
            for s in (b"(1099511627776,)f8", b"(3,)f8", b"i4,i8", b"O")
        },
    }


def test_hostile_pickles_are_refused(tmp_path):
    marker = str(tmp_path / "ran")
    for what, data in _hostile_pickles(marker).items():
        with pytest.raises(FormatError, match="Petastorm Unischema is not valid") as info:
            load_unischema(data, what)
        assert isinstance(info.value, RowstoreError), what
        assert not os.path.exists(marker), f"{what}: the pickle ran code"
    with pytest.raises(FormatError, match="at most"):
        load_unischema(b"\x80\x04" + b"N" * (5 << 20))


def test_hostile_metadata_file(tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    marker = str(tmp_path / "ran")
    _Boom.marker = marker
    table = pa.table({"x": [1, 2]})
    pq.write_table(table, d / "part-00000.parquet")
    pq.write_metadata(
        table.schema.with_metadata({UNISCHEMA_KEY: pickle.dumps(_Boom())}), d / "_common_metadata"
    )
    with pytest.raises(
        FormatError, match=r"global 'posix.system' is not part of a Petastorm Unischema"
    ):
        import_petastorm(str(d), str(tmp_path / "out"))
    assert not os.path.exists(marker)
    (d / "_common_metadata").write_bytes(b"PAR1 not really")
    with pytest.raises(FormatError, match="cannot read the Parquet metadata"):
        import_petastorm(str(d), str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "rowstore.json")


@pytest.mark.parametrize("name", ["part-00001-fifo.parquet", "_common_metadata"])
def test_a_fifo_in_the_dataset_israised_without_blocking(tmp_path, name):
    """The dataset's files are opened as every ingest input is: a FIFO where a Parquet file
    or the metadata file belongs is an InputError naming it, not an open() that waits."""
    d = tmp_path / "ds"
    shutil.copytree(HELLO, d)
    if name == "_common_metadata":
        os.remove(d / name)
    os.mkfifo(d / name)
    exc = raised_without_blocking(
        lambda: import_petastorm(str(d), str(tmp_path / "out")), str(d / name)
    )
    assert isinstance(exc, InputError), exc
    assert name in str(exc) and "FIFO" in str(exc)
    assert not os.path.exists(tmp_path / "out" / "rowstore.json")
