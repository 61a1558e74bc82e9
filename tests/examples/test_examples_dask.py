"""examples/dask_cluster.py runs as written: a 2-process LocalCluster writes a sharded dataset
that rowstore.open and read_rowstore read back whole."""

import os

import pytest

pytest.importorskip("pandas")
pytest.importorskip("dask.dataframe")
pytest.importorskip("distributed")


def test_dask_cluster_example(tmp_path, rs):
    out = rs.run_example("dask_cluster.py", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "wrote 16 partitions as version 1" in out.stdout
    assert "2400 rows in 32 shards" in out.stdout  # each ~5 MB partition split at shard_bytes=4 MB
    assert "read_rowstore: 32 partitions, divisions known: True" in out.stdout
    assert "7 speakers" in out.stdout and "(as generated)" in out.stdout
    assert os.path.exists(os.path.join(tmp_path, "speech", "rowstore.json"))
