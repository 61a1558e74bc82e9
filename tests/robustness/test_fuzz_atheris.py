"""The coverage-guided fuzzer's target (``tools/robustness/fuzz_atheris.py``) without atheris:
the committed corpus and every crasher found replay through the normal build (each input in a
child process with a timeout, the fuzzer's oracle: a ``RowstoreError`` or the rows read), and
the structure-aware inputs do what the campaign relies on (a resealed mutation gets past the
chunk CRCs into the kernels; the exact oracle catches changed values)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

pytest.importorskip("h5py")

import rowstore  # noqa: E402
from rowstore.errors import ChecksumError, RowstoreError  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "atheris")


@pytest.fixture(scope="module")
def fa():
    sys.path.insert(0, os.path.join(ROOT, "tools", "robustness"))
    try:
        import fuzz_atheris
    finally:
        sys.path.pop(0)
    return fuzz_atheris


def _write(tmp_path, blob: bytes) -> str:
    path = str(tmp_path / "case.h5")
    with open(path, "wb") as fh:
        fh.write(blob)
    return path


def _read_all(path: str) -> None:
    with rowstore.open(path) as r:
        r.take(np.arange(len(r)), varlen="ragged")
        r.layout.verify()


def test_committed_corpus_and_crashers_replay():
    dirs = [
        d
        for d in (os.path.join(DATA, "corpus"), os.path.join(DATA, "crashers"))
        if os.path.isdir(d)
    ]
    n = sum(
        len([f for f in glob.glob(os.path.join(d, "*")) if not f.endswith((".md", ".json"))])
        for d in dirs
    )
    assert n >= 20, "the committed atheris corpus is missing"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "tools", "robustness", "fuzz_atheris.py"),
        "--replay",
        *dirs,
        "--timeout",
        "20",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["inputs"] == n
    assert report["bad"] == [], json.dumps(report["bad"], indent=1)[:4000]
    assert proc.returncode == 0
    counts = report["by_outcome"]
    assert counts["ok"] > 0 and counts["rowstore-error"] > 0, counts


def test_seeds_read_back_as_written(fa):
    seeds = fa.seeds()
    assert [s["name"] for s in seeds] == ["seed-lz4.h5", "seed-raw.h5", "seed-raw-direct.h5"]
    for s in seeds:
        assert fa.one_input(b"\x00" + s["data"]) == "ok"  # raw mode: the file as it is


def test_the_direct_read_kernels_are_reached(fa, monkeypatch):
    """The seed of 256-row blocks makes the oracle's single-row reads use the direct kernels of
    ``_io`` (so the campaign covers them, and damage in front of them)."""
    from rowstore import kernels

    calls: dict[str, int] = {}
    for name in ("pread_rows", "pread_heap", "preadv_rows"):
        real = getattr(kernels, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(kernels, name, counted)
    direct = [s["name"] for s in fa.seeds()].index("seed-raw-direct.h5")
    assert fa.one_input(b"\x00" + fa.seeds()[direct]["data"]) == "ok"
    assert set(calls) == {"pread_rows", "pread_heap", "preadv_rows"}, calls
    # a resealed heap reference pointing past its block's range: refused by the direct kernel
    # mode 1 (resealed), 1 operation: heap-ref (code 2), block 0, row 3, ref 0 (s.offset), ODD[19] =
    # 2^64-1
    data = bytes([1, direct, 0, 2, 0, 3, 0, 0, 19])
    blob, ops = fa.build_case(data)
    assert ops[1]["op"] == "heap-ref" and ops[1]["field"] == "s.offset", ops
    assert fa.one_input(data) == "rowstore-error"


def _blosc_header_input(seed_index: int, mode: int) -> bytes:
    # mode, seed, 1 operation: code 3 (Blosc2 header byte), chunk 0, frame header, byte 14 := 0xFF
    return bytes([mode, seed_index, 0, 3, 0, 0, 14, 0xFF])


def test_a_resealed_mutation_reaches_the_frame_checks(fa, tmp_path):
    """Mode 1 recomputes the CRC of the damaged chunk: the frame check refuses it (not the
    checksum); mode 7 leaves the CRC as written and the checksum refuses it."""
    lz4 = [s["name"] for s in fa.seeds()].index("seed-lz4.h5")
    resealed, ops = fa.build_case(_blosc_header_input(lz4, 1))
    assert ops[0]["reseal"] and ops[1]["op"] == "blosc-header"
    with pytest.raises(RowstoreError) as err:
        _read_all(_write(tmp_path, resealed))
    assert not isinstance(err.value, ChecksumError), err.value
    plain, ops = fa.build_case(_blosc_header_input(lz4, 7))
    assert not ops[0]["reseal"]
    with pytest.raises(ChecksumError):
        _read_all(_write(tmp_path, plain))
    assert fa.one_input(_blosc_header_input(lz4, 1)) == "rowstore-error"


def test_the_exact_oracle_catches_changed_values(fa, tmp_path):
    """A resealed edit of a row's bytes reads back as other values: the consistency oracle of
    resealed inputs accepts it, the exact one raises a finding (the oracle can fail)."""
    raw = [s["name"] for s in fa.seeds()].index("seed-raw.h5")
    # mode 1, raw seed, 1 operation: code 0 (set bytes in a chunk), chunk 0, at 0, 1 byte := 0x7F
    data = bytes([1, raw, 0, 0, 0, 0, 0, 0, 0x7F])
    blob, _ = fa.build_case(data)
    path = _write(tmp_path, blob)
    assert fa.check_file(path, exact=False) == "ok"
    with pytest.raises(fa.Finding, match="WRONG-DATA"):
        fa.check_file(path, exact=True)


def test_asan_reports_are_classified(tmp_path):
    """tools/robustness/asan_check.py fails the run on a sanitizer report with a frame in rowstore's
    extension modules, and only lists those elsewhere (libhdf5's known crash)."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "robustness"))
    try:
        import asan_check
    finally:
        sys.path.pop(0)
    (tmp_path / "asan.python.1").write_text(
        "==1==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020\n"
        "    #0 0x7f01 in __asan_memcpy "
        "(/usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.so+0xeb)\n"
        "    #1 0x7f02 in __pyx_f_7_gather__gather_rows "
        "/w/build/asan/rowstore/_gather.cpython-311-x86_64-linux-gnu.so+0x12\n"
    )
    (tmp_path / "asan.python.2").write_text(
        "==2==ERROR: AddressSanitizer: SEGV on unknown address 0x000000000008\n"
        "    #0 0x7f03 in H5VL_blob_put (/x/h5py.libs/libhdf5-8c29085d.so.310.5.1+0x2e7996)\n"
    )
    found = {r["file"]: r for r in asan_check.reports(str(tmp_path))}
    assert (
        found["asan.python.1"]["kernel"]
        and "heap-buffer-overflow" in found["asan.python.1"]["summary"]
    )
    assert not found["asan.python.2"]["kernel"] and "SEGV" in found["asan.python.2"]["summary"]
