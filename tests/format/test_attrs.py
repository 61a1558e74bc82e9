"""User attributes holding numpy arrays and scalars are stored exactly (docs/format.md, 1.1): in
files, in dataset manifests, through appends; hostile tagged objects are FormatErrors."""

import json

import h5py
import numpy as np
import pytest

import rowstore
from rowstore.format import attrs as A

SCHEMA = rowstore.Schema([rowstore.Field("x", "int64")])

ATTRS = {
    "alt": np.arange(3.0),
    "f32": np.float32(1.5),
    "i8": np.int8(-3),
    "big": np.array([1, 2], ">i4"),
    "grid": np.arange(6, dtype=np.uint16).reshape(2, 3),
    "empty": np.zeros((0, 2)),
    "nan": np.array([np.nan, -np.inf]),
    "c": np.complex64(1 + 2j),
    "t": np.datetime64("2020-01-01T06", "ns"),
    "dt": np.array([1, 2], "m8[s]"),
    "names": np.array(["a", "bcd"]),
    "raw": np.array([b"x", b"yz"]),
    "flag": np.bool_(True),
    "nested": {"levels": [1, np.int64(2), {"v": np.ones(2, np.float32)}], "s": "text"},
    "plain": 3.25,
}


def assert_same(got, want):
    assert type(got) is type(want), (got, want)
    if isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want)
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want)
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_same(a, b)
    else:
        assert got == want


def test_file_round_trip(tmp_path):
    path = str(tmp_path / "f.h5")
    with rowstore.Writer(path, SCHEMA, attrs=ATTRS) as w:
        w.write({"x": 1})
    assert_same(rowstore.open(path).layout.user_attrs, ATTRS)
    with rowstore.Writer(path, mode="a", attrs={"more": np.arange(2)}) as w:  # an append keeps them
        w.write({"x": 2})
    got = rowstore.open(path).layout.user_attrs
    assert_same(got, {**ATTRS, "more": np.arange(2)})
    # h5py sees ordinary JSON text
    with h5py.File(path, "r") as f:
        text = json.loads(f["rowstore"].attrs["user_attrs"])
    assert text["alt"] == {
        "$ndarray": {"dtype": "<f8", "shape": [3], "base64": "AAAAAAAAAAAAAAAAAADwPwAAAAAAAABA"}
    }


def test_dataset_round_trip(tmp_path):
    root = str(tmp_path / "ds")
    with rowstore.DatasetWriter(root, SCHEMA, attrs=ATTRS) as w:
        w.write({"x": 1})
    assert_same(rowstore.open(root).layout.user_attrs, ATTRS)
    info = rowstore.write_shard(root, SCHEMA, {"x": [2]})
    rowstore.commit(root, [info], mode="a")  # attrs=None: the current version's, re-encoded
    assert_same(rowstore.open(root).layout.user_attrs, ATTRS)
    info = rowstore.write_shard(root, SCHEMA, {"x": [3]})
    rowstore.commit(root, [info], mode="a", attrs={"a": np.float16(2)})
    assert_same(rowstore.open(root).layout.user_attrs, {"a": np.float16(2)})


def test_tuples_become_lists_and_check_normalizes():
    got = A.check({"t": (1, (2, np.int32(3)))})
    assert_same(got, {"t": [1, [2, np.int32(3)]]})


@pytest.mark.parametrize(
    "bad, what",
    [
        ({"o": object()}, "attrs['o']: object"),
        (
            {"a": [1, {"b": np.array([object()])}]},
            "attrs['a'][1]['b']: a numpy value of dtype object",
        ),
        ({"s": np.zeros(2, [("a", "i4")])}, "attrs['s']"),
        ({"k": {1: 2}}, "key 1 is not a str"),
        ({"r": {"$ndarray": 1}}, "reserved"),
    ],
)
def test_unstorable_values_name_the_attribute(tmp_path, bad, what):
    with pytest.raises(
        rowstore.AttrsError, match=what.replace("[", r"\[").replace("(", r"\(")
    ) as e:
        rowstore.Writer(str(tmp_path / "f.h5"), SCHEMA, attrs=bad)
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)
    assert not list(tmp_path.iterdir())
    with pytest.raises(rowstore.AttrsError):
        rowstore.DatasetWriter(str(tmp_path / "ds"), SCHEMA, attrs=bad)


def _tag(body, tag="$ndarray"):
    return {"v": {tag: body}}


@pytest.mark.parametrize(
    "user",
    [
        _tag({"dtype": "<f8", "shape": [3], "base64": "AAAA"}),  # too few bytes for the shape
        _tag(
            {"dtype": "<f8", "shape": [1 << 40], "base64": "AAAA"}
        ),  # a huge shape: refused before any allocation
        _tag({"dtype": "|O", "shape": [1], "base64": "AAAAAAAAAAA="}),
        _tag({"dtype": "V8", "shape": [1], "base64": "AAAAAAAAAAA="}),
        _tag({"dtype": "nonsense", "shape": [1], "base64": "AAAA"}),
        _tag({"dtype": 5, "shape": [1], "base64": "AAAA"}),
        _tag({"dtype": "<i4", "shape": [-1], "base64": "AAAAAA=="}),
        _tag({"dtype": "<i4", "shape": "1", "base64": "AAAAAA=="}),
        _tag({"dtype": "<i4", "shape": [1], "base64": "!!!!!!!!"}),
        _tag({"dtype": "<i4", "shape": [1]}),
        _tag({"dtype": "<i4", "base64": "AAAAAA==", "x": 1}, tag="$numpy"),
        _tag([1, 2]),
    ],
)
def test_hostile_tags_are_format_errors(tmp_path, user):
    path = str(tmp_path / "f.h5")
    with rowstore.Writer(path, SCHEMA) as w:
        w.write({"x": 1})
    with h5py.File(path, "r+") as f:
        f["rowstore"].attrs["user_attrs"] = json.dumps(user)
    with pytest.raises(rowstore.FormatError, match="user attribute attrs\\['v'\\]"):
        rowstore.open(path)


def test_hostile_tags_in_a_manifest_are_format_errors(tmp_path):
    root = str(tmp_path / "ds")
    with rowstore.DatasetWriter(root, SCHEMA, attrs={"a": np.arange(3)}) as w:
        w.write({"x": 1})
    mpath = tmp_path / "ds" / "_manifests" / "v00000001.json"
    m = json.loads(mpath.read_text())
    m["attrs"]["a"]["$ndarray"]["shape"] = [4]
    text = json.dumps(m, indent=1).encode()
    mpath.chmod(0o644)
    mpath.write_bytes(text)
    pointer = json.loads((tmp_path / "ds" / "rowstore.json").read_text())
    import zlib

    pointer["manifest_crc32"] = zlib.crc32(text)
    (tmp_path / "ds" / "rowstore.json").write_text(json.dumps(pointer))
    with pytest.raises(rowstore.FormatError, match="user attribute attrs\\['a'\\]"):
        rowstore.open(root)
