"""examples/audio_segments.py and docs/audio.md's code run as written (FLAC in, torch windows
out)."""

import os
import subprocess
import sys

import pytest
from helpers import ROOT
from test_examples import python_blocks

pytest.importorskip("soundfile")
pytest.importorskip("torch")


def test_audio_segments_example(tmp_path, rs):
    out = rs.run_example("audio_segments.py", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "whole utterances exact: True" in out.stdout
    assert "batch: audio (32, 16000) torch.float32" in out.stdout
    assert "resumed batch identical: True" in out.stdout
    ratio = float(out.stdout.split("FLAC / float32: ")[1].split()[0])
    assert ratio <= 0.6


def test_audio_guide_blocks_run(tmp_path):
    code = "\n\n".join(python_blocks(os.path.join("docs", "audio.md")))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "torch.Size([16, 16000]) torch.float32" in out.stdout
