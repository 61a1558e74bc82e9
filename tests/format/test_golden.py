"""The format-v1 golden file: written once by tests/data/make_golden_v1.py, committed, never
regenerated. Every run reads it and checks schema, layout and every value exactly."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import DATA

import rowstore
from rowstore import Layout, Schema
from rowstore.cli import main as cli_main
from rowstore.format import spec

GOLDEN = os.path.join(DATA, "golden_v1.h5")
EXPECTED = os.path.join(DATA, "golden_v1.json")
SCRIPT = os.path.join(DATA, "make_golden_v1.py")


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED, encoding="utf-8") as f:
        return json.load(f)


def decode_value(field, obj):
    if obj is None:
        return None
    if field.dtype == "str":
        return obj
    if field.dtype == "bytes":
        return base64.b64decode(obj["b64"])
    assert np.dtype(obj["dtype"]) == field.dtype
    return np.frombuffer(base64.b64decode(obj["b64"]), dtype=obj["dtype"]).reshape(obj["shape"])


def expected_rows(expected, schema):
    return [{f.name: decode_value(f, row[f.name]) for f in schema} for row in expected["rows"]]


def test_golden_schema_and_attributes(expected):
    layout = Layout.open(GOLDEN)
    assert layout.version == expected["format_version"] == 1
    assert layout.schema == Schema.from_json(expected["schema"])
    assert layout.schema.to_json() == expected["schema"]
    assert layout.user_attrs == expected["user_attrs"]
    assert layout.schema.names == [
        "id",
        "score",
        "vec",
        "mat",
        "flag",
        "maybe",
        "label",
        "note",
        "wave",
        "grid",
        "pairs",
        "image",
    ]
    kinds = {f.name: ("inline" if f.inline else "heap") for f in layout.schema}
    assert [n for n, k in kinds.items() if k == "inline"] == [
        "id",
        "score",
        "vec",
        "mat",
        "flag",
        "maybe",
    ]


def test_golden_layout(expected):
    layout = Layout.open(GOLDEN, verify=True)
    exp = expected["layout"]
    assert layout.num_rows == exp["num_rows"] == 36
    assert layout.rows_per_block == exp["rows_per_block"] == 8
    assert layout.num_blocks == exp["num_blocks"] == 5
    assert layout.row_dtype.itemsize == exp["row_itemsize"]
    assert layout.heap_chunk_bytes == exp["heap_chunk_bytes"] == 256
    assert layout.heap_nbytes == exp["heap_nbytes"]
    assert len(layout.heap_chunks) == exp["num_heap_chunks"] > 1
    assert (
        layout.compression
        == exp["compression"]
        == {"id": "blosc2", "cname": "lz4", "clevel": 5, "shuffle": "byte"}
    )
    for name in spec.BLOCK_DTYPE.names:
        assert layout.blocks[name].tolist() == exp["blocks"][name], name
    for name in spec.HEAP_CHUNK_DTYPE.names:
        assert layout.heap_chunks[name].tolist() == exp["heap_chunks"][name], name
    assert layout.blocks["num_rows"].tolist() == [8, 8, 8, 8, 4]


def test_golden_on_disk_layout_matches_the_spec():
    """The row table's compound dtype, the attributes and the filters are what format v1 says."""
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401

    schema = Layout.open(GOLDEN).schema
    with h5py.File(GOLDEN, "r") as f:
        g = f["rowstore"]
        assert g["rows"].dtype == spec.row_dtype(schema)
        assert g["rows"].dtype.names[:7] == (
            "id",
            "score",
            "vec",
            "mat",
            "flag",
            "maybe",
            "maybe__null",
        )
        assert (
            g["blocks"].dtype == spec.BLOCK_DTYPE
            and g["heap_chunks"].dtype == spec.HEAP_CHUNK_DTYPE
        )
        assert g.attrs["format"] == "rowstore" and g.attrs["checksum"] == "crc32"
        assert list(g["rows"]._filters) == ["32026"] and list(g["heap"]._filters) == ["32026"]
        assert g["rows"].chunks == (8,) and g["heap"].chunks == (256,)


def test_golden_values_by_row(expected):
    r = rowstore.open(GOLDEN)
    schema = r.schema
    rows = expected_rows(expected, schema)
    assert len(r) == len(rows) == 36
    for i, want in enumerate(rows):
        got = r[i]
        assert set(got) == set(schema.names)
        for f in schema:
            exp, val = want[f.name], got[f.name]
            if exp is None:
                assert val is None, (i, f.name)
            elif f.dtype in ("str", "bytes"):
                assert type(val) is type(exp) and val == exp, (i, f.name)
            else:
                val = np.asarray(val)
                assert val.dtype == f.dtype and val.shape == exp.shape, (
                    i,
                    f.name,
                    val.dtype,
                    val.shape,
                )
                assert val.tobytes() == exp.tobytes(), (i, f.name)


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("varlen", ["ragged", "padded"])
def test_golden_values_by_take(rs, expected, verify, varlen):
    r = rowstore.open(GOLDEN, verify=verify)
    rows = expected_rows(expected, r.schema)
    order = np.array([35, 0, 17, 8, 7, 33, 16, 16, 1])
    batch = r.take(order, varlen=varlen)
    if varlen == "ragged":
        rs.assert_batch_equal(r.schema, [rows[i] for i in order], batch)
    else:
        for f in r.schema:
            if not f.is_variable:
                continue
            shp = batch[f.name + "__shape"]
            for j, i in enumerate(order):
                v = rows[i][f.name]
                assert tuple(shp[j]) == tuple(v.shape[d] for d in f.variable_dims)
                assert (
                    batch[f.name][j][tuple(slice(0, s) for s in v.shape)].tobytes() == v.tobytes()
                )
    # a whole epoch in batches sees every row once
    seen = []
    for b in r.batches(5, shuffle="block", seed=3, num_threads=2):
        seen += b["id"].tolist()
    assert sorted(seen) == sorted(int(row["id"]) for row in rows)


def test_golden_special_values(expected):
    r = rowstore.open(GOLDEN)
    scores = r.take(np.arange(36))["score"]
    assert np.isnan(scores[0]) and np.isposinf(scores[9]) and np.isneginf(scores[18])
    assert (
        scores[3] == 0 and np.signbit(scores[3]) and scores[12] == 0 and not np.signbit(scores[12])
    )
    assert scores[15] == np.float32(3.4e38) and scores[1] == np.float32(1 / 7)
    assert r[0]["note"] is None and r[2]["maybe"] is None and r[0]["maybe"] == -20
    assert (
        r[3]["grid"].shape == (3, 0)
        and r[0]["wave"].shape == (0,)
        and r[0]["pairs"].shape == (0, 2)
    )
    assert r[4]["label"] == "日本語" and r[5]["label"] == "😀 emoji #5"


def test_golden_verify_cli(capsys):
    assert cli_main(["verify", GOLDEN]) == 0
    assert "OK" in capsys.readouterr().out


def assert_unchanged_in_git(*paths: str) -> None:
    """Golden files are never regenerated: git must know them, unmodified (skips outside a
    checkout)."""
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            capture_output=True,
            text=True,
            cwd=DATA,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("git not available")
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    assert proc.stdout.strip() == "", f"golden files modified or untracked:\n{proc.stdout}"


def test_golden_files_are_committed_and_unchanged(expected):
    """The golden file is never regenerated: its index is pinned in the JSON, and git knows it."""
    layout = Layout.open(GOLDEN)
    assert layout.file_size == os.path.getsize(GOLDEN)
    assert expected["made_with"]["rowstore"] == "0.1.0"
    assert_unchanged_in_git(GOLDEN, EXPECTED)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_make_script_refuses_to_overwrite(tmp_path):
    for name in ("make_golden_v1.py", "golden_v1.h5", "golden_v1.json"):
        shutil.copy(os.path.join(DATA, name), tmp_path / name)
    before = {n: sha256(tmp_path / n) for n in ("golden_v1.h5", "golden_v1.json")}
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "make_golden_v1.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "refusing to overwrite" in proc.stderr
    assert {n: sha256(tmp_path / n) for n in before} == before
    # only one of the two present: still refuses, and creates nothing
    os.unlink(tmp_path / "golden_v1.h5")
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "make_golden_v1.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and not os.path.exists(tmp_path / "golden_v1.h5")


def test_make_script_still_describes_the_golden_content(tmp_path, expected):
    """Run the script in an empty directory: today's writer stores the same values with the same
    block layout (stored sizes may differ with compressor versions, so they are not compared)."""
    shutil.copy(SCRIPT, tmp_path / "make_golden_v1.py")
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "make_golden_v1.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "golden_v1.json", encoding="utf-8") as f:
        fresh = json.load(f)
    assert fresh["rows"] == expected["rows"]
    assert fresh["schema"] == expected["schema"]
    for key in (
        "num_rows",
        "rows_per_block",
        "num_blocks",
        "row_itemsize",
        "heap_chunk_bytes",
        "compression",
    ):
        assert fresh["layout"][key] == expected["layout"][key], key
    for name in ("first_row", "num_rows"):
        assert fresh["layout"]["blocks"][name] == expected["layout"]["blocks"][name]
