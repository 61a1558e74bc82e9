"""examples/train_keras.py runs as written (in a subprocess: TensorFlow and Keras start fresh)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_train_keras_example(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_keras.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    fit = next(line for line in lines if line.startswith("fit:"))
    first, last = (float(v) for v in fit.split("loss ")[1].split(",")[0].split(" -> "))
    assert last < first  # it learned something
    epochs = [line.split("first labels ")[1] for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and epochs[0] != epochs[1]  # a new order each epoch
    assert "ragged mean == padded sum / length: True" in out.stdout
