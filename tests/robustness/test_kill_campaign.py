"""The SIGKILL campaign of ``tools/robustness/kill_campaign.py``, small: 12 kills over its six
local write scenarios (Writer modes w and a, DatasetWriter modes a and w, write_shard + commit,
gc_dataset), raw and lz4, each leaving exactly the old or the new content and a target that
recovers without temporaries or orphans; then one kill each of ``rowstore shuffle``, a Dask
``to_rowstore`` and a commit to S3 (moto). The published campaign (440+ kills) is in
``bench/results/kill_campaign.json``."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

SCRIPT = os.path.join(ROOT, "tools", "robustness", "kill_campaign.py")
SCENARIOS = ["writer_w", "writer_a", "ds_append", "ds_replace", "two_phase", "gc"]
OTHERS = ["shuffle", "dask", "remote"]


def _campaign(tmp_path, kills: int, scenarios: list[str]):
    out = tmp_path / "kills.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--kills",
            str(kills),
            "--seed",
            "17",
            "--rows",
            "2000",
            "--calibration-runs",
            "0",
            "--workdir",
            str(tmp_path),
            "--out",
            str(out),
            "--scenarios",
            *scenarios,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return proc, json.loads(out.read_text())


# three children that start a Dask cluster, a moto server and a shuffle: ~30 s idle
@pytest.mark.slow
def test_kill_campaign_of_shuffle_dask_and_remote_commits_finds_no_violation(tmp_path):
    pytest.importorskip("distributed")
    pytest.importorskip("moto")
    proc, doc = _campaign(tmp_path, 3, OTHERS)
    assert proc.returncode == 0, proc.stdout + proc.stderr + json.dumps(doc["violations"], indent=1)
    assert doc["violations"] == [] and list(doc["summary"]) == OTHERS
    for name, s in doc["summary"].items():
        assert s["kills"] == 1 and s["old"] + s["new"] + s["not_killed"] == 1, (name, s)
    assert sorted(os.listdir(tmp_path)) == ["kills.json"]


def test_kill_campaign_finds_no_violation(tmp_path):
    proc, doc = _campaign(tmp_path, 12, SCENARIOS)
    assert proc.returncode == 0, proc.stdout + proc.stderr + json.dumps(doc["violations"], indent=1)
    assert doc["violations"] == []
    assert list(doc["summary"]) == SCENARIOS
    for name, s in doc["summary"].items():
        assert s["kills"] == 2 and s["violations"] == 0, (name, s)
        assert s["old"] + s["new"] + s["not_killed"] == 2, (name, s)
    assert {(t["scenario"], t["compression"]) for t in doc["trials"]} == {
        (s, c) for s in SCENARIOS for c in ("raw", "lz4")
    }
    assert sum(s["old"] for s in doc["summary"].values()) >= 1  # some kills did land mid-write
    for name in SCENARIOS:
        assert name in proc.stdout  # the table
    assert sorted(os.listdir(tmp_path)) == ["kills.json"]  # the trials' directories are removed
