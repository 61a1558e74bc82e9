"""Compressed files whose heap chunks did not compress (stored memcpy'd): payloads are read in
place, like an uncompressed file's, with the same bytes, the same checks and the same errors."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from helpers import count_whole_checks, memcpyed_starts

import rowstore
from rowstore import ChecksumError, Field, FormatError, Layout, Schema

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


@pytest.fixture(scope="module")
def noise_v2(noise, tmp_path_factory) -> str:
    """``noise`` as compressed files were written before they had a page index (format v2)."""
    from rowstore.format import footer, spec

    path = str(tmp_path_factory.mktemp("memcpyed") / "noise-v2.h5")
    shutil.copyfile(noise, path)
    L = Layout.open(noise)
    fd = os.open(noise, os.O_RDONLY)
    try:
        header = dict(footer.read_local(fd, L.file_size, noise).header)
    finally:
        os.close(fd)
    header.pop(footer.KEY_EOF)
    header.pop(spec.ATTR_PAGE_BYTES)
    header[spec.ATTR_VERSION] = spec.FORMAT_VERSION_NO_PAGES
    footer.cut(path, L.footer_offset)
    with open(path, "ab") as f:
        f.write(footer.encode(header, L.blocks, L.heap_chunks, L.footer_offset))
    assert Layout.open(path).version == 2 and Layout.open(noise).version == 3
    return path


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
    starts = memcpyed_starts(noise)
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


@pytest.mark.parametrize("version", [3, 2])
@pytest.mark.parametrize("how", ["block", "full", "take"])
def test_a_flipped_payload_byte_is_never_served(noise, noise_v2, tmp_path, how, version):
    """v3: by the page checks of the payload reads; v2: by each chunk's whole check."""
    src = noise if version == 3 else noise_v2
    starts = memcpyed_starts(src)
    bad = _flip(src, str(tmp_path / "bad.h5"), int(starts[3]) + 100)
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
    starts = memcpyed_starts(noise)
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
def test_payloads_of_memcpyed_chunks_load_no_chunk(noise, noise_v2, verify, monkeypatch):
    """Heap chunks are loaded whole only for segments that touch the compressed (last) one.
    With verify=True a v3 file's payloads are checked by their pages (no memcpy'd chunk is read
    whole); a v2 file's memcpy'd chunks are each read whole once, for their checksums."""
    checks = count_whole_checks(monkeypatch)  # chunks read whole for their checksums
    loads, g = _loads(noise, verify)
    if verify:
        assert not checks  # no whole-chunk check of a memcpy'd chunk
        # Pages checked as payloads were read in place (the chunks of segments that also touch
        # the compressed one are loaded whole, checked by their chunk CRCs as they decompress).
        assert g.pages is not None and g._hpchecked.mean() > 0.5
        _, g2 = _loads(noise_v2, verify)
        assert g2.pages is None and g2._hchecked[:-1].all()
        assert checks  # v2: memcpy'd chunks read whole once for their chunk checksums
    from rowstore.reader._gather import Gatherer

    monkeypatch.setattr(Gatherer, "_memcpyed_heap", lambda self, chunks: None)
    before, _ = _loads(noise, verify)
    assert 0 < loads * 4 < before


@pytest.mark.parametrize("how", ["take", "getitem"])
def test_a_payload_read_checks_only_its_pages(noise, tmp_path, how):
    """A flipped byte on a page of a memcpy'd chunk costs only the reads of that page: the
    payloads away from it are served, those on it are refused."""
    L = Layout.open(noise)
    P, H = L.page_bytes, L.heap_chunk_bytes
    sizes = [_wave(i).nbytes for i in range(ROWS)]
    at = np.concatenate(([0], np.cumsum(sizes)))  # payloads lie in the heap in row order
    page = (2 * H + 5 * P) // P  # the heap's page 5 of chunk 2
    bad = _flip(noise, str(tmp_path / "bad.h5"), int(memcpyed_starts(noise)[2]) + 5 * P + 17)
    first, last = at[:-1] // P, (at[1:] - 1) // P
    dirty = [i for i in range(ROWS) if first[i] <= page <= last[i]]
    # Rows whose payloads neither touch that page nor share a first/last page with one that
    # does (a payload read checks its own first and last pages whole).
    clean = [i for i in range(ROWS) if last[i] < page - 1 or first[i] > page + 1]
    assert dirty and len(clean) > ROWS // 2
    with rowstore.open(bad) as r:
        if how == "take":
            got = dict(zip(clean, r.take(clean, fields=["w"])["w"]))
        else:
            got = {i: r[i]["w"] for i in clean[::7]}
        assert len(got) > 20
        assert all(np.array_equal(np.asarray(w), _wave(i)) for i, w in got.items())
        with pytest.raises(ChecksumError):
            if how == "take":
                r.take(dirty[:1], fields=["w"])
            else:
                r[dirty[-1]]


def test_a_compressed_dataset_checks_payloads_by_its_shards_pages(tmp_path, monkeypatch):
    """A dataset of compressed shards opened from its manifest uses the shards' page indexes
    for payloads in memcpy'd chunks; a flipped byte in one is still never served."""
    root = str(tmp_path / "ds")
    with rowstore.DatasetWriter(
        root,
        SCHEMA,
        shard_bytes=1 << 18,
        compression="lz4",
        rows_per_block=2,
        heap_chunk_bytes=1 << 16,
    ) as w:
        for i in range(ROWS):
            w.write({"id": i, "w": _wave(i)})
    checks = count_whole_checks(monkeypatch)  # chunks read whole for their checksums
    with rowstore.open(root) as r:
        assert r.layout.num_shards >= 2
        for i in range(0, ROWS, 9):  # single rows: read in place
            assert np.array_equal(np.asarray(r.take([i], fields=["w"])["w"][0]), _wave(i))
        g = r._gatherer
        assert g.pages is not None and g._hpchecked.any() and not checks
        shard = r.layout.shard_paths[1]
    starts = memcpyed_starts(shard)
    assert starts[0] >= 0
    _flip(shard, shard + ".tmp", int(starts[0]) + 300)
    os.replace(shard + ".tmp", shard)
    with rowstore.open(root) as r:
        with pytest.raises(ChecksumError):
            for i in range(ROWS):  # each row on its own: payloads read in place
                r.take([i], fields=["w"])
