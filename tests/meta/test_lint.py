"""The code keeps the style the project agreed on: ruff's rules (line length included), ruff's
formatter, mypy on the package and cython-lint on the kernels (their settings are in
pyproject.toml)."""

import os
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

BIN = os.path.dirname(sys.executable)


def _tool(name):
    path = shutil.which(name, path=BIN) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (it is in requirements/dev.txt)")
    return path


def _run(cmd, env=None):
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_is_clean():
    _run([_tool("ruff"), "check", "rowstore", "tests", "bench", "examples", "tools"])


def test_ruff_format_is_clean():
    _run([_tool("ruff"), "format", "--check", "rowstore", "tests", "bench", "examples", "tools"])


def test_mypy_is_clean():
    _run([_tool("mypy"), "rowstore"])


def test_cython_lint_is_clean():
    cython_lint = _tool("cython-lint")
    _tool("pycodestyle")  # cython-lint runs it by name, from PATH
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    _run([cython_lint, "_ext"], env=env)
