"""The format-v3 golden file: written once by tests/data/make_golden_v3.py, committed, never
regenerated. Its values are the v1 golden file's (golden_v1.json), stored uncompressed with the
page index; every run reads it from its footer, checks every value, the page CRC-32s and the
footer's bytes, that a reader of v1/v2 only refuses it by its version, and that its HDF5 part
still reads (the v1 path) with the footer cut off."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib

import numpy as np
import pytest
from helpers import DATA
from test_golden import assert_unchanged_in_git
from test_golden_v2 import _check_values

from rowstore import FormatVersionError, Layout, Schema
from rowstore.cli import main as cli_main
from rowstore.errors import FormatError
from rowstore.format import footer, spec

GOLDEN = os.path.join(DATA, "golden_v3.h5")
EXPECTED = os.path.join(DATA, "golden_v3.json")


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED, encoding="utf-8") as f:
        v3 = json.load(f)
    with open(os.path.join(DATA, "golden_v1.json"), encoding="utf-8") as f:
        v3["v1"] = json.load(f)
    return v3


def test_golden_v3_layout_and_page_index(expected):
    L = Layout.open(GOLDEN, verify=True)
    assert (
        L.version == expected["format_version"] == 3
        and L.page_bytes == expected["page_bytes"] == 4096
    )
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
    assert (
        L.block_pages.tolist() == expected["block_pages"]
        and L.heap_pages.tolist() == expected["heap_pages"]
    )
    with open(GOLDEN, "rb") as f:
        raw = f.read()
    # Each page CRC is zlib.crc32 of the page's stored bytes (docs/format.md, the page index).
    rs = L.row_dtype.itemsize
    plen = max(1, 4096 // rs) * rs
    pages = []
    for b in L.blocks:
        at, size = int(b["offset"]), L.rows_per_block * rs
        pages += [zlib.crc32(raw[at + a : at + min(a + plen, size)]) for a in range(0, size, plen)]
    assert pages == expected["block_pages"]
    hpages = []
    for c in L.heap_chunks:
        at, size = int(c["offset"]), L.heap_chunk_bytes
        hpages += [zlib.crc32(raw[at + a : at + min(a + 4096, size)]) for a in range(0, size, 4096)]
    assert hpages == expected["heap_pages"]
    tail = raw[L.footer_offset :]
    assert len(tail) == expected["footer_and_trailer_bytes"]
    assert hashlib.sha256(tail).hexdigest() == expected["footer_and_trailer_sha256"]
    assert footer.PAGE_MAGIC in tail


def test_golden_v3_values(expected):
    _check_values(GOLDEN, expected)
    assert cli_main(["verify", GOLDEN]) == 0


def test_a_reader_of_v1_and_v2_refuses_v3_by_its_version(monkeypatch):
    """What a reader from before v3 does with the file: its version check comes before its
    index is looked at, so it raises FormatVersionError (never a misread index)."""
    monkeypatch.setattr(spec, "READABLE_VERSIONS", (1, 2))
    with pytest.raises(FormatVersionError, match="v3"):
        Layout.open(GOLDEN)


def test_golden_v3_hdf5_part_is_the_same_file(expected, tmp_path):
    """h5py sees the same index; with the footer cut off, the v1 path reads the same values
    (without the page index: a reader then checks whole chunks, as for v1 and v2)."""
    h5py = pytest.importorskip("h5py")
    L = Layout.open(GOLDEN)
    with h5py.File(GOLDEN, "r") as f:
        assert np.array_equal(f["rowstore/blocks"][()], L.blocks)
        assert int(f["rowstore"].attrs["format_version"]) == 3
    cut = str(tmp_path / "cut.h5")
    shutil.copyfile(GOLDEN, cut)
    footer.cut(cut, L.footer_offset)
    with pytest.raises(FormatError, match="footer is gone"):  # its attributes say it had one
        Layout.open(cut)
    Lc = Layout.open(cut, allow_missing_footer=True)
    assert Lc.footer_offset == 0 and Lc.page_bytes == 0 and Lc.block_pages is None
    _check_values(cut, expected, allow_missing_footer=True)


def test_golden_v3_files_are_committed_and_unchanged():
    assert_unchanged_in_git(GOLDEN, EXPECTED)
