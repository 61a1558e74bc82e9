"""examples/train_keras.py runs as written (in a subprocess: TensorFlow and Keras start fresh)."""

import pytest

pytest.importorskip("tensorflow")


def test_train_keras_example(tmp_path, rs):
    out = rs.run_example("train_keras.py", str(tmp_path), TF_CPP_MIN_LOG_LEVEL="2")
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    fit = next(line for line in lines if line.startswith("fit:"))
    first, last = (float(v) for v in fit.split("loss ")[1].split(",")[0].split(" -> "))
    assert last < first  # it learned something
    epochs = [line.split("first labels ")[1] for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and epochs[0] != epochs[1]  # a new order each epoch
    assert "ragged mean == padded sum / length: True" in out.stdout
