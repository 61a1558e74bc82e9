"""examples/train_torch.py runs as written (CPU) and its models learn."""

import re

import pytest

pytest.importorskip("torch")


def test_train_torch_example(tmp_path, rs):
    out = rs.run_example("train_torch.py", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "output schema: ['x', 'label']" in out.stdout
    assert "resumed at epoch 1, row 2560: 22 batches left" in out.stdout
    assert "16384 rows in 2 epochs" in out.stdout
    losses = re.findall(r"loss (\d+\.\d+) -> (\d+\.\d+)", out.stdout)
    assert len(losses) == 3, out.stdout
    for first, last in losses:
        assert float(last) < float(first), out.stdout


def test_dataset_example(tmp_path, rs):
    out = rs.run_example("dataset.py", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "6700 rows in 3 shards" in out.stdout
    losses = re.findall(r"(\d+) batches, loss (\d+\.\d+) -> (\d+\.\d+)", out.stdout)
    assert [int(n) for n, _, _ in losses] == [27, 27], out.stdout
    assert float(losses[-1][2]) < float(losses[0][1]), out.stdout


def test_pandas_speech_example(tmp_path, rs):
    pytest.importorskip("pandas")
    out = rs.run_example("pandas_speech.py", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "('wave', 'float32', (None,))" in out.stdout
    assert "round trip exact: True" in out.stdout
    assert "epoch done: 13 batches" in out.stdout
    assert re.search(r"max length (\d+) == padded width \1", out.stdout)
