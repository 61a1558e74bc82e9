"""The compressed format-v3 golden file: written once by tests/data/make_golden_v3_lz4.py,
committed, never regenerated. Every run reads it from its footer, checks every value, that its
page CRC-32s are those of each chunk's raw bytes (decoded here by h5py's Blosc2 filter, not by
rowstore), that its memcpy'd heap chunks lie where the JSON says, that payloads read in place
from them are checked by those pages, and the footer's bytes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import zlib

import pytest
from helpers import DATA, memcpyed_starts
from test_golden import assert_unchanged_in_git

import rowstore
from rowstore import ChecksumError, Layout
from rowstore.cli import main as cli_main
from rowstore.format import footer

GOLDEN = os.path.join(DATA, "golden_v3_lz4.h5")
EXPECTED = os.path.join(DATA, "golden_v3_lz4.json")
sys.path.insert(0, DATA)

import make_golden_v3_lz4 as made  # noqa: E402


@pytest.fixture(scope="module")
def expected():
    with open(EXPECTED, encoding="utf-8") as f:
        return json.load(f)


def _raw(what: str, size: int) -> bytes:
    h5py = pytest.importorskip("h5py")
    import hdf5plugin  # noqa: F401

    with h5py.File(GOLDEN, "r") as f:
        data = f["rowstore"][what][()].tobytes()
    return data + bytes(-len(data) % size)


def test_golden_v3_lz4_layout_and_page_index(expected):
    L = Layout.open(GOLDEN, verify=True)
    assert L.version == expected["format_version"] == 3 and L.page_bytes == 4096
    assert L.compression == expected["compression"] and L.compression["cname"] == "lz4"
    assert L.footer_offset == expected["footer_offset"]
    assert L.file_size == expected["file_size"] == os.path.getsize(GOLDEN)
    for name in L.blocks.dtype.names:
        assert L.blocks[name].tolist() == expected["blocks"][name], name
    for name in L.heap_chunks.dtype.names:
        assert L.heap_chunks[name].tolist() == expected["heap_chunks"][name], name
    assert L.block_pages.tolist() == expected["block_pages"]
    assert L.heap_pages.tolist() == expected["heap_pages"]
    # Each page CRC is zlib.crc32 of a page of the chunk's raw (decompressed) bytes.
    for what, ds, pages in (("block", "rows", L.block_pages), ("heap chunk", "heap", L.heap_pages)):
        plen, per = L.page_geometry(what)
        size = L.block_raw_bytes if what == "block" else L.heap_chunk_bytes
        raw = _raw(ds, size)
        want = [
            zlib.crc32(raw[c * size + j * plen : c * size + min((j + 1) * plen, size)])
            for c in range(len(raw) // size)
            for j in range(per)
        ]
        assert pages.tolist() == want, what
    with open(GOLDEN, "rb") as f:
        data = f.read()
    tail = data[L.footer_offset :]
    assert len(tail) == expected["footer_and_trailer_bytes"]
    assert hashlib.sha256(tail).hexdigest() == expected["footer_and_trailer_sha256"]
    assert footer.PAGE_MAGIC in tail


def test_golden_v3_lz4_memcpyed_chunks(expected):
    """Most heap chunks are memcpy'd (their raw bytes in the file as they are), the last one,
    zero-padded, compressed."""
    L = Layout.open(GOLDEN)
    starts = memcpyed_starts(GOLDEN)
    assert starts.tolist() == expected["memcpyed_raw_offsets"]
    assert (starts[:-1] >= 0).all() and starts[-1] == -1
    raw = _raw("heap", L.heap_chunk_bytes)
    with open(GOLDEN, "rb") as f:
        data = f.read()
    H = L.heap_chunk_bytes
    for c, at in enumerate(starts[:-1].tolist()):
        assert data[at : at + H] == raw[c * H : (c + 1) * H]


@pytest.mark.parametrize("verify", [True, False, "always"])
def test_golden_v3_lz4_values(expected, verify):
    with rowstore.open(GOLDEN, verify=verify) as r:
        assert len(r) == made.NUM_ROWS == len(expected["rows"])
        got = r.take(list(range(len(r))))
        for i, want in enumerate(expected["rows"]):
            assert int(got["id"][i]) == want["id"]
            assert hashlib.sha256(bytes(got["blob"][i])).hexdigest() == want["blob_sha256"]
            assert got["text"][i] == want["text"]
            assert bytes(got["blob"][i]) == made.blob(i)
        seen = sorted(int(i) for b in r.batches(7, shuffle="full", seed=1) for i in b["id"])
        assert seen == list(range(len(r)))
    assert cli_main(["verify", GOLDEN]) == 0


def test_golden_v3_lz4_flipped_payload_byte_is_refused(expected, tmp_path):
    """A byte flipped in a memcpy'd chunk's payload is refused by the page check of the read
    that touches it, with no whole-chunk read."""
    bad = str(tmp_path / "bad.h5")
    shutil.copyfile(GOLDEN, bad)
    at = expected["memcpyed_raw_offsets"][1] + 4096 + 5  # heap chunk 1, page 1
    with open(bad, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))
    H = made.HEAP_CHUNK_BYTES
    target = _raw("heap", H)[H + 4096 : H + 4096 + 32]  # the row whose blob holds that byte
    row = next(i for i in range(made.NUM_ROWS) if target in made.blob(i))
    with rowstore.open(bad) as r, pytest.raises(ChecksumError, match="field 'blob'"):
        r.take([row], fields=["blob"])
    with rowstore.open(bad, verify=False) as r:  # what verify=True refused to hand out
        assert bytes(r.take([row], fields=["blob"])["blob"][0]) != made.blob(row)


def test_golden_v3_lz4_files_are_committed_and_unchanged():
    assert_unchanged_in_git(GOLDEN, EXPECTED)
