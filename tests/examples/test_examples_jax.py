"""examples/train_jax.py runs as written (CPU, two XLA host devices): it trains through Grain,
resumes from an Orbax checkpoint mid-epoch with exactly the batches left, and learns."""

import os
import re

import pytest

pytest.importorskip("jax")
pytest.importorskip("grain")
pytest.importorskip("orbax.checkpoint")


def test_train_jax_example(tmp_path, rs):
    out = rs.run_example(
        "train_jax.py", str(tmp_path), XLA_FLAGS="--xla_force_host_platform_device_count=2"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 process(es), 2 device(s)" in out.stdout
    assert "checkpoint at step 150: epoch 1, 22 steps into it" in out.stdout
    assert "resumed at epoch 1: 106 batches left in it" in out.stdout
    assert "16384 rows in 2 epochs" in out.stdout
    first, last = map(float, re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", out.stdout).groups())
    assert last < first / 2, out.stdout
    acc = float(re.search(r"accuracy (\d\.\d+) on 8192 rows", out.stdout).group(1))
    assert acc > 0.8, out.stdout


def test_jax_guide_blocks_run(tmp_path, rs):
    """docs/jax.md's ```python blocks build on each other: run them as one script (```py
    blocks are illustrative; what they show is tested in tests/integrations/test_jax_grain.py)."""
    from test_examples import python_blocks

    code = "\n\n".join(python_blocks(os.path.join("docs", "jax.md")))
    out = rs.run_python(code, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(50, 16) 0 [[6, 20]]" in out.stdout
    assert "34 batches left" in out.stdout and "1000 rows" in out.stdout
