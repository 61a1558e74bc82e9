"""``rowstore order`` and ``rowstore check-order``: figures from the block index only, the
checks pass on real configurations and fail (exit 1) when the delivery is wrong."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.cli import main
from rowstore.reader import plan as _plan
from rowstore.reader.proof import check_order


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("cliorder") / "o.h5")
    with rowstore.Writer(p, Schema([Field("id", "int64")]), rows_per_block=20) as w:
        w.write_batch({"id": np.arange(1013)})
    return p


def test_order_prints_quality_histogram_and_plot(path, tmp_path, capsys):
    png = tmp_path / "o.png"
    assert (
        main(
            [
                "order",
                path,
                "--batch-size",
                "32",
                "--window",
                "4",
                "--world",
                "3",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "shuffle quality: " in out
        and "distinct blocks per batch: mean" in out
        and "histogram" in out
    )
    assert "block loads per block of rows delivered" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    q = float(out.split("shuffle quality: ")[1].split()[0])
    main(["order", path, "--batch-size", "32", "--shuffle", "full"])
    qfull = float(capsys.readouterr().out.split("shuffle quality: ")[1].split()[0])
    main(["order", path, "--batch-size", "32", "--shuffle", "none"])
    qnone = float(capsys.readouterr().out.split("shuffle quality: ")[1].split()[0])
    assert qnone < q < qfull and qfull > 0.9


@pytest.mark.parametrize("policy", [[], ["--drop-last"], ["--pad"]])
def test_check_order_passes(path, capsys, policy):
    args = [
        "check-order",
        path,
        "--world",
        "8",
        "--workers",
        "4",
        "--resume-at",
        "0.37",
        "--resume-world",
        "3",
        "--batch-size",
        "8",
        *policy,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count("PASS") >= 5
    assert ("equal steps on every rank" in out) == bool(policy)


def test_check_order_fails_on_a_wrong_resume(path, capsys, monkeypatch):
    real = _plan.EpochPlan.after

    def forgetful(self, taken, unit=1):  # a resume that forgets one consumer's progress
        taken = np.array(taken)
        taken[0] = 0
        return real(self, taken, unit)

    monkeypatch.setattr(_plan.EpochPlan, "after", forgetful)
    assert (
        main(["check-order", path, "--world", "2", "--resume-at", "0.5", "--batch-size", "8"]) == 1
    )
    assert "FAIL  every global batch at most once" in capsys.readouterr().out


def test_check_order_function_and_errors(path, capsys):
    br = np.array([5, 5, 3], np.int64)
    r = check_order(
        br, 5, batch_size=2, world=2, workers=2, resume_at=0.5, resume_world=3, pad=True
    )
    assert r["ok"] and r["rows"] == 13 and len(set(r["steps_per_rank"])) == 1
    with pytest.raises(SystemExit):
        main(["check-order", path, "--resume-at", "1.5"])
    with pytest.raises(SystemExit):
        main(["check-order", path, "--pad", "--drop-last"])
    assert main(["order", path + ".missing"]) == 1
