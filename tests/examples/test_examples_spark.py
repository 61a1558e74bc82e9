"""examples/spark_petastorm_hello.py runs as written: Petastorm's hello world written from Spark
on local[2], read back with make_reader, trained from in torch through the converter."""

import os

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("torch")


def test_spark_petastorm_hello_example(tmp_path, rs):
    from _spark import INSTALL_JAVA, java_ok

    if java_ok():
        pytest.skip(INSTALL_JAVA)
    out = rs.run_example("spark_petastorm_hello.py", str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "wrote version 1: 24 rows in 2 shards" in out.stdout
    assert "make_reader: every row equals what was written (image1 (128, 256, 3)" in out.stdout
    assert "converter: 256 rows cached" in out.stdout
    assert "trained 24 steps" in out.stdout  # 3 epochs of 8 batches
    assert "converting again reuses the cache: True" in out.stdout
    assert os.path.exists(os.path.join(tmp_path, "hello_world_dataset", "rowstore.json"))
