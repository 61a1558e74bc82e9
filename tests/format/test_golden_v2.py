"""The format-v2 golden file: written once by tests/data/make_golden_v2.py, committed, never
regenerated. Its values are the v1 golden file's (golden_v1.json); every run reads it from its
footer (without libhdf5), checks every value, the footer's bytes and that the HDF5 part is the
same file for h5py and for a reader that has only the v1 path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from helpers import DATA
from test_golden import assert_unchanged_in_git, expected_rows

import rowstore
from rowstore import FormatError, Layout, Schema
from rowstore.cli import main as cli_main
from rowstore.format import footer, spec

GOLDEN = os.path.join(DATA, "golden_v2.h5")
EXPECTED = os.path.join(DATA, "golden_v2.json")


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED, encoding="utf-8") as f:
        v2 = json.load(f)
    with open(os.path.join(DATA, "golden_v1.json"), encoding="utf-8") as f:
        v2["v1"] = json.load(f)
    return v2


def _check_values(path, expected, **open_kwargs):
    with rowstore.open(path, **open_kwargs) as r:
        rows = expected_rows(expected["v1"], r.schema)
        assert len(r) == len(rows) == 36
        for i, want in enumerate(rows):
            got = r[i]
            for f in r.schema:
                exp, val = want[f.name], got[f.name]
                if exp is None:
                    assert val is None, (i, f.name)
                elif f.dtype in ("str", "bytes"):
                    assert val == exp, (i, f.name)
                else:
                    assert (
                        np.asarray(val).tobytes() == exp.tobytes()
                        and np.asarray(val).shape == exp.shape
                    ), (i, f.name)


def test_golden_v2_layout_from_its_footer(expected):
    L = Layout.open(GOLDEN, verify=True)
    assert L.version == expected["format_version"] == 2
    assert L.footer_offset == expected["footer_offset"] and L.file_size == expected[
        "file_size"
    ] == os.path.getsize(GOLDEN)
    assert (
        L.schema == Schema.from_json(expected["v1"]["schema"])
        and L.user_attrs == expected["v1"]["user_attrs"]
    )
    for name in spec.BLOCK_DTYPE.names:
        assert L.blocks[name].tolist() == expected["blocks"][name], name
    for name in spec.HEAP_CHUNK_DTYPE.names:
        assert L.heap_chunks[name].tolist() == expected["heap_chunks"][name], name
    with open(GOLDEN, "rb") as f:
        f.seek(L.footer_offset)
        tail = f.read()
    assert len(tail) == expected["footer_and_trailer_bytes"]
    assert hashlib.sha256(tail).hexdigest() == expected["footer_and_trailer_sha256"]
    assert tail.startswith(footer.FOOTER_MAGIC) and tail[-footer.TRAILER_SIZE :].startswith(
        footer.TRAILER_MAGIC
    )


def test_golden_v2_values(expected):
    _check_values(GOLDEN, expected)
    assert cli_main(["verify", GOLDEN]) == 0


def test_golden_v2_hdf5_part_is_the_same_file(expected, tmp_path):
    """h5py sees the same index; with the footer cut off, the v1 path reads the same values."""
    h5py = pytest.importorskip("h5py")
    L = Layout.open(GOLDEN)
    with h5py.File(GOLDEN, "r") as f:
        assert np.array_equal(f["rowstore/blocks"][()], L.blocks)
        assert int(f["rowstore"].attrs["format_version"]) == 2
    cut = str(tmp_path / "cut.h5")
    shutil.copyfile(GOLDEN, cut)
    footer.cut(cut, L.footer_offset)
    with pytest.raises(FormatError, match="footer is gone"):  # format_version 2 says it had one
        Layout.open(cut)
    assert Layout.open(cut, allow_missing_footer=True).footer_offset == 0
    _check_values(cut, expected, allow_missing_footer=True)


def test_golden_v2_files_are_committed_and_unchanged():
    assert_unchanged_in_git(GOLDEN, EXPECTED)
