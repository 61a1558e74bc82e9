"""examples/ray_ingest.py runs as written: Ray tasks make the rows, to_rowstore writes one shard
per block and appends a version, read_rowstore feeds torch in the stored order."""

import os

import pytest

pytest.importorskip("ray.data")
pytest.importorskip("torch")

pytestmark = pytest.mark.xdist_group("ray")  # beside the session's Ray cluster, not with it


def test_ray_ingest_example(tmp_path, rs):
    out = rs.run_example("ray_ingest.py", str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "wrote 6 blocks as version 1" in out.stdout
    assert "appended version 2" in out.stdout
    assert "280 rows in 8 shards" in out.stdout  # 6 blocks, then 2
    assert "stations: int64[None], patch: float32[9, 9, 27]" in out.stdout
    assert "read_rowstore: 280 rows" in out.stdout
    assert "first row: id 0, region alps, 1 stations" in out.stdout
    assert "trained 9 steps over 280 rows (in the stored order: True)" in out.stdout
    assert os.path.exists(os.path.join(tmp_path, "patches", "rowstore.json"))
