"""examples/dask_cluster.py runs as written: a 2-process LocalCluster writes a sharded dataset
that rowstore.open and read_rowstore read back whole."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("pandas")
pytest.importorskip("dask.dataframe")
pytest.importorskip("distributed")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dask_cluster_example(tmp_path):
    # PYTHONPATH: the rowstore of this checkout (the worker processes import it too).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "dask_cluster.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "wrote 16 partitions as version 1" in out.stdout
    assert "2400 rows in 32 shards" in out.stdout  # each ~5 MB partition split at shard_bytes=4 MB
    assert "read_rowstore: 32 partitions, divisions known: True" in out.stdout
    assert "7 speakers" in out.stdout and "(as generated)" in out.stdout
    assert os.path.exists(os.path.join(tmp_path, "speech", "rowstore.json"))
