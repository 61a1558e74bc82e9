"""examples/xarray_patches.py runs as written: Dask-chunked weather grid -> stacked 9x9 patches ->
torch training -> predictions back on the grid (to_grid) and a PNG."""

import os

import pytest

pytest.importorskip("xarray")
pytest.importorskip("torch")
pytest.importorskip("matplotlib")


def test_xarray_patches_example(tmp_path, rs):
    out = rs.run_example("xarray_patches.py", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert (
        "480 patches in 1 shards" in out.stdout
    )  # 24 times x 4 x 5 tiles of 9 x 9, globally shuffled into one shard
    assert "x: (18, 9, 9) channel-first, 18 channels" in out.stdout
    assert "38880 of 38880 points covered" in out.stdout  # 36 x 45 tiles exactly: every point once
    first, last = (float(v) for v in out.stdout.split("loss ")[1].split("\n")[0].split(" -> "))
    assert last < first / 5  # it learned something
    assert os.path.getsize(tmp_path / "xarray_patches.png") > 10_000
