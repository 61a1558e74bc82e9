"""The mutation fuzzer of ``tools/robustness/fuzz.py``, restricted to mutations inside chunk
bytes (block and heap chunks: row bytes, heap references, Blosc2 frame and chunk headers):
every such damage is covered by the chunk CRCs and the kernels' bounds checks, so ~100 cases
must give no crash, hang, leaked exception or wrong data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

pytest.importorskip("h5py")


def test_chunk_mutations_are_caught(tmp_path):
    out = tmp_path / "fuzz.json"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "tools", "robustness", "fuzz.py"),
        "--cases",
        "100",
        "--region",
        "chunks",
        "--seed",
        "17",
        "--out",
        str(out),
        "--cases-dir",
        str(tmp_path / "cases"),
        "--quiet",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["cases"] == 100
    counts = report["by_outcome"]
    assert counts["rowstore-error"] > 80, counts  # damage is detected, not read past
    bad = {k: counts[k] for k in ("WRONG-DATA", "LEAKED", "CRASH", "HANG")}
    assert bad == dict.fromkeys(bad, 0), json.dumps(report["findings"], indent=1)[:4000]


def _fuzz(tmp_path, region: str, cases: int, seed: int) -> dict:
    out = tmp_path / f"fuzz-{region}.json"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "tools", "robustness", "fuzz.py"),
        "--cases",
        str(cases),
        "--region",
        region,
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--cases-dir",
        str(tmp_path / "cases"),
        "--quiet",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["cases"] == cases
    return report


def test_dataset_manifest_mutations_are_caught(tmp_path):
    """Dataset targets: stored bytes of the pointer, manifest and sidecar (the CRCs refuse them)
    and sealed edits (every CRC recomputed: the semantic checks of manifest.py, shards.py and
    index.py refuse them). Either way nothing wrong is returned and nothing else escapes."""
    for region, cases, seed, min_errors in (("manifest", 60, 17, 55), ("sealed", 80, 17, 60)):
        report = _fuzz(tmp_path, region, cases, seed)
        counts = report["by_outcome"]
        assert counts["rowstore-error"] >= min_errors, (region, counts)
        bad = {k: counts[k] for k in ("WRONG-DATA", "LEAKED", "CRASH", "HANG")}
        assert bad == dict.fromkeys(bad, 0), (
            region,
            json.dumps(report["findings"], indent=1)[:4000],
        )


def test_reseal_makes_a_valid_dataset(tmp_path):
    """The sealed edits test the semantic checks only if resealing is right: an edit of an
    informative key, resealed, reads back exactly as written."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "robustness"))
    try:
        import fuzz
    finally:
        sys.path.pop(0)
    seeds = fuzz.build_dataset_seeds(str(tmp_path), with_image=False)
    root = seeds["ds-lz4"]
    dmap = fuzz.dataset_map(root)
    files = fuzz.read_tree(root)
    m = json.loads(files[dmap["manifest"]])
    m["num_rows"] = 12345  # informative: not checked by a reader
    files[dmap["manifest"]] = json.dumps(m).encode()
    fuzz.reseal(files, dmap)
    case = tmp_path / "case-ds"
    fuzz.write_tree(str(case), files)
    assert files != fuzz.read_tree(root)
    assert fuzz.run_oracle(str(case), with_image=False) == {"outcome": "ok", "steps": []}
