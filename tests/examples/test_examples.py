"""The examples and the README's code run as written."""

import os
import re
import subprocess
import sys

from helpers import ROOT


def test_quickstart_example(tmp_path, rs):
    out = rs.run_example("quickstart.py", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "refused: row 1000: field 'image'" in out.stdout
    assert "epoch 1: 1000 rows" in out.stdout


def python_blocks(doc: str) -> list[str]:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def readme_blocks():
    return python_blocks("README.md")


def test_readme_python_blocks_run(tmp_path):
    """The ```python blocks of the README run as written, in order, in one fresh directory (as a
    user pasting them would: later blocks read the file the quickstart wrote)."""
    for i, code in enumerate(readme_blocks()):
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, f"README block {i} failed:\n{code}\n{out.stderr}"


def test_images_guide_blocks_run(tmp_path):
    """docs/images.md's blocks, as one script."""
    code = "\n\n".join(python_blocks(os.path.join("docs", "images.md")))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "refused: row 3: field 'image'" in out.stdout
    assert "['cat', 'dog']" in out.stdout and "1 dog/0.png" in out.stdout


def test_image_folder_example(tmp_path, rs):
    out = rs.run_example("image_folder.py", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "stored as they are: True" in out.stdout
    assert "classes ['bird', 'cat', 'dog']" in out.stdout


def test_api_guide_blocks_run(tmp_path):
    """docs/api.md's blocks build on each other: run them as one script. (```py blocks are
    illustrative, with placeholders such as an S3 endpoint, and are not run; what they show is
    tested against real servers in tests/test_remote*.py.)"""
    code = "\n\n".join(python_blocks(os.path.join("docs", "api.md")))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "(3, 64)" in out.stdout
