"""The mutation fuzzer of ``bench/fuzz.py`` (issue 17), restricted to mutations inside chunk
bytes (block and heap chunks: row bytes, heap references, Blosc2 frame and chunk headers):
every such damage is covered by the chunk CRCs and the kernels' bounds checks, so ~100 cases
must give no crash, hang, leaked exception or wrong data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("h5py")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_chunk_mutations_are_caught(tmp_path):
    out = tmp_path / "fuzz.json"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "fuzz.py"), "--cases", "100", "--region", "chunks",
           "--seed", "17", "--out", str(out), "--cases-dir", str(tmp_path / "cases"), "--quiet"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["cases"] == 100
    counts = report["by_outcome"]
    assert counts["rowstore-error"] > 80, counts  # damage is detected, not read past
    bad = {k: counts[k] for k in ("WRONG-DATA", "LEAKED", "CRASH", "HANG")}
    assert bad == dict.fromkeys(bad, 0), json.dumps(report["findings"], indent=1)[:4000]
