"""examples/huggingface_images.py and docs/huggingface.md's blocks run as written."""

import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

pytest.importorskip("datasets")
pytest.importorskip("imagecodecs")


def test_huggingface_images_example(tmp_path, rs):
    out = rs.run_example("huggingface_images.py", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "image field: uint8 (None, None, 3) png" in out.stdout
    assert "class names: ['stripes', 'checks', 'dots']" in out.stdout
    assert "batch: (64, 32, 32, 3) uint8" in out.stdout
    assert "features equal: True test bytes identical: True" in out.stdout


def test_huggingface_guide_blocks_run(tmp_path):
    """docs/huggingface.md's blocks build on each other: run them as one script."""
    with open(os.path.join(ROOT, "docs", "huggingface.md"), encoding="utf-8") as f:
        code = "\n\n".join(re.findall(r"```python\n(.*?)```", f.read(), flags=re.S))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "{'label': ['neg', 'pos']}" in out.stdout and "[0 1]" in out.stdout
