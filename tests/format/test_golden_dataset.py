"""The dataset-manifest-v1 golden dataset: written once by tests/data/make_golden_dataset_v1.py,
committed, never regenerated. Every run reads it (both versions) and checks every value."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import DATA

import rowstore
from rowstore import Schema
from rowstore.cli import main as cli_main
from rowstore.format import manifest

ROOT = os.path.join(DATA, "golden_dataset_v1")
EXPECTED = os.path.join(DATA, "golden_dataset_v1.json")


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED, encoding="utf-8") as f:
        return json.load(f)


def _rows(expected, schema):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_golden import decode_value

    return [{f.name: decode_value(f, row[f.name]) for f in schema} for row in expected["rows"]]


@pytest.mark.parametrize("verify", [True, "always"])
def test_golden_dataset_reads_every_value(rs, expected, verify):
    schema = Schema.from_json(expected["schema"])
    rows = _rows(expected, schema)
    with rowstore.open(ROOT, verify=verify) as r:
        assert r.schema == schema and r.layout.user_attrs == expected["attrs"]
        assert r.layout.version == 2 and len(r) == expected["versions"]["2"] == len(rows)
        assert r.layout.num_shards == len(expected["shards"])
        assert list(r.layout.shard_rpb) == [s["rows_per_block"] for s in expected["shards"]]
        rs.assert_batch_equal(schema, rows, r.take(np.arange(len(rows))))
        order = r.epoch_order(shuffle="block", seed=3, window=2)
        got = rowstore.reader.buffers.concat_batches(
            list(r.batches(5, shuffle="block", seed=3, window=2))
        )
        rs.assert_batch_equal(schema, [rows[i] for i in order], got)
    with rowstore.open(ROOT, version=1) as r:
        assert len(r) == expected["versions"]["1"]
        rs.assert_batch_equal(schema, rows[: len(r)], r.take(np.arange(len(r))))


def test_golden_manifest_matches_the_spec(expected):
    m = manifest.load(ROOT)
    assert m.version == 2 and manifest.versions(ROOT) == [1, 2]
    assert [
        dict(zip(manifest.SHARD_KEYS, vals))
        for vals in zip(m.shards["path"], *(m.shards[k].tolist() for k in manifest.SHARD_KEYS[1:]))
    ] == expected["shards"]
    with open(os.path.join(ROOT, manifest.manifest_path(2)), encoding="utf-8") as f:
        raw = json.load(f)
    assert (
        raw["format"] == "rowstore-dataset"
        and raw["format_version"] == 1
        and raw["kind"] == "shards"
    )
    assert raw["parent"] == 1 and raw["num_rows"] == expected["versions"]["2"]
    # Each shard is an ordinary v1 file on its own, and its index is the sidecar's.
    for s in expected["shards"]:
        L = rowstore.Layout.open(os.path.join(ROOT, s["path"]), verify=True)
        assert manifest.index_crc32(L.blocks, L.heap_chunks) == s["index_crc32"]


def test_golden_dataset_verify_cli(capsys):
    assert cli_main(["verify", ROOT]) == 0
    assert "OK" in capsys.readouterr().out


def test_golden_dataset_files_are_committed_and_unchanged():
    out = subprocess.run(
        ["git", "status", "--porcelain", "--", ROOT, EXPECTED],
        capture_output=True,
        text=True,
        cwd=DATA,
    )
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    assert out.stdout == "", f"the golden dataset was modified:\n{out.stdout}"
    listed = subprocess.run(
        ["git", "ls-files", "--", ROOT], capture_output=True, text=True, cwd=DATA
    ).stdout.split()
    assert len(listed) == 9, listed  # pointer, 2 manifests, 2 sidecars, 4 shards


def test_make_script_refuses_to_overwrite():
    proc = subprocess.run(
        [sys.executable, os.path.join(DATA, "make_golden_dataset_v1.py")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "refusing to overwrite" in proc.stderr
