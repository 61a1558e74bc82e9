"""examples/train_torch.py runs as written (CPU) and its models learn."""

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_torch_example(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_torch.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "output schema: ['x', 'label']" in out.stdout
    assert "resumed at epoch 1, row 2560: 22 batches left" in out.stdout
    assert "16384 rows in 2 epochs" in out.stdout
    losses = re.findall(r"loss (\d+\.\d+) -> (\d+\.\d+)", out.stdout)
    assert len(losses) == 3, out.stdout
    for first, last in losses:
        assert float(last) < float(first), out.stdout


def test_dataset_example(tmp_path):
    # PYTHONPATH: the rowstore of this checkout, also where the environment installs another one.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "dataset.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "6700 rows in 3 shards" in out.stdout
    losses = re.findall(r"(\d+) batches, loss (\d+\.\d+) -> (\d+\.\d+)", out.stdout)
    assert [int(n) for n, _, _ in losses] == [27, 27], out.stdout
    assert float(losses[-1][2]) < float(losses[0][1]), out.stdout


def test_pandas_speech_example(tmp_path):
    pytest.importorskip("pandas")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "pandas_speech.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "('wave', 'float32', (None,))" in out.stdout
    assert "round trip exact: True" in out.stdout
    assert "epoch done: 13 batches" in out.stdout
    assert re.search(r"max length (\d+) == padded width \1", out.stdout)
