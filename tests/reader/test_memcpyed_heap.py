"""Compressed files whose heap chunks did not compress (stored memcpy'd): payloads are read in
place, like an uncompressed file's, with the same bytes, the same checks and the same errors."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import rowstore
from rowstore import ChecksumError, Field, FormatError, Layout, Schema, kernels

ROWS = 400
SCHEMA = Schema([Field("id", "int64"), Field("w", "float32", (None,))])


def _wave(i: int) -> np.ndarray:
    # White noise: does not compress, so heap chunks are stored memcpy'd (but the last one,
    # padded with zeros: the reader mixes the two).
    return np.random.default_rng(i).standard_normal(500 + i * 37 % 3000).astype(np.float32)


@pytest.fixture(scope="module")
def noise(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("memcpyed") / "noise.h5")
    with rowstore.Writer(
        path, SCHEMA, rows_per_block=2, heap_chunk_bytes=1 << 16, compression="lz4"
    ) as w:
        for i in range(ROWS):
            w.write({"id": i, "w": _wave(i)})
    return path


def _starts(path: str) -> np.ndarray:
    L = Layout.open(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        return kernels.memcpyed_starts(
            fd,
            L.heap_chunks["offset"],
            L.heap_chunks["stored_nbytes"],
            codec=L.frame_check(),
            raw_size=L.heap_chunk_bytes,
        )
    finally:
        os.close(fd)


def _flip(src: str, dst: str, at: int) -> str:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    return dst


def test_memcpyed_chunks_are_found_in_place(noise):
    L = Layout.open(noise)
    starts = _starts(noise)
    # Every chunk memcpy'd (its raw bytes past its headers) but the last, zero-padded one.
    assert (starts[:-1] > L.heap_chunks["offset"][:-1]).all() and starts[-1] == -1
    with open(noise, "rb") as f:  # the raw bytes at that offset are the heap's own
        f.seek(int(starts[0]))
        raw = f.read(8)
    assert np.frombuffer(raw, np.float32).tolist() == _wave(0)[:2].tolist()


@pytest.mark.parametrize("verify", [True, False, "always"])
@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
def test_payloads_read_in_place_are_the_written_ones(noise, shuffle, verify):
    seen = 0
    with rowstore.open(noise, verify=verify) as r:
        for b in r.batches(16, shuffle=shuffle, seed=3, epoch=1):
            for i, w in zip(b["id"].tolist(), b["w"]):
                assert np.array_equal(np.asarray(w), _wave(i))
                seen += 1
        assert r.take([5, 399, 0], fields=["w"])["w"][1].tolist() == _wave(399).tolist()
    assert seen == ROWS


@pytest.mark.parametrize("how", ["block", "full", "take"])
def test_a_flipped_payload_byte_is_never_served(noise, tmp_path, how):
    starts = _starts(noise)
    bad = _flip(noise, str(tmp_path / "bad.h5"), int(starts[3]) + 100)
    with rowstore.open(bad) as r, pytest.raises(ChecksumError):
        if how == "take":
            r.take(list(range(ROWS)), fields=["w"])
        else:
            for _ in r.batches(16, shuffle=how, seed=1):
                pass


def test_a_bad_chunk_header_is_refused(noise, tmp_path):
    """A memcpy'd chunk whose header claims another size is refused when its payloads are
    first read in place, with verify=False too (the header is always checked)."""
    L = Layout.open(noise)
    starts = _starts(noise)
    hdr = int(starts[2]) - 32  # the chunk header: nbytes at byte 4
    bad = _flip(noise, str(tmp_path / "hdr.h5"), hdr + 5)
    with rowstore.open(bad, verify=False) as r, pytest.raises(FormatError) as ei:
        for _ in r.batches(16, shuffle="block", seed=1):
            pass
    assert "heap chunk 2" in str(ei.value)
    assert L.heap_chunk_bytes == 1 << 16


def _loads(path: str, verify) -> tuple[int, object]:
    with rowstore.open(path, verify=verify) as r:
        for _ in range(2):
            for _ in r.batches(16, shuffle="block", seed=3, window=4):
                pass
        return r._gatherer.heap_chunks_loaded, r._gatherer


@pytest.mark.parametrize("verify", [False, True])
def test_payloads_of_memcpyed_chunks_load_no_chunk(noise, verify, monkeypatch):
    """Heap chunks are loaded whole only for segments that touch the compressed (last) one;
    with verify=True each memcpy'd chunk is also read whole once, for its checksum."""
    loads, g = _loads(noise, verify)
    if verify:
        assert g._hchecked[:-1].all()  # the compressed one is checked as it is loaded
    from rowstore.reader._gather import Gatherer

    monkeypatch.setattr(Gatherer, "_memcpyed_heap", lambda self, chunks: None)
    before, _ = _loads(noise, verify)
    assert 0 < loads * 4 < before
