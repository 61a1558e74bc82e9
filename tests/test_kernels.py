"""Each kernel against a slow NumPy reference on random inputs, and its bounds checks."""

import os

import numpy as np
import pytest

from rowstore import kernels
from rowstore.errors import ChecksumError, FormatError

RNG = np.random.default_rng(1234)


def ref_gather(src, row_size, off, size, rows):
    return np.stack([src[r * row_size + off : r * row_size + off + size] for r in rows]) if len(rows) else np.zeros((0, size), np.uint8)


@pytest.mark.parametrize("trial", range(20))
def test_gather_fixed_and_rows_match_reference(trial):
    row_size = int(RNG.integers(1, 200))
    nsrc = int(RNG.integers(1, 300))
    src = RNG.integers(0, 256, nsrc * row_size, dtype=np.uint8)
    rows = RNG.integers(0, nsrc, int(RNG.integers(0, 500))).astype(np.int64)
    fields = []
    for _ in range(int(RNG.integers(1, 5))):
        off = int(RNG.integers(0, row_size))
        size = int(RNG.choice([1, 4, 8, int(RNG.integers(0, row_size - off + 1))]))
        size = min(size, row_size - off)
        fields.append((off, size))
    for off, size in fields:
        out = np.empty((len(rows), size), np.uint8)
        kernels.gather_fixed(src, row_size, off, size, rows, out)
        assert np.array_equal(out, ref_gather(src, row_size, off, size, rows).reshape(out.shape))
    outs = [np.empty((len(rows), size), np.uint8) for _, size in fields]
    kernels.gather_rows(src, row_size, rows, [(o, s, out) for (o, s), out in zip(fields, outs)])
    for (off, size), out in zip(fields, outs):
        assert np.array_equal(out, ref_gather(src, row_size, off, size, rows).reshape(out.shape))


def test_gather_rejects_rows_outside_source():
    src = np.zeros(10 * 8, np.uint8)
    out = np.empty((2, 8), np.uint8)
    for bad in ([0, 10], [-1, 0], [2**40, 0]):
        with pytest.raises(FormatError, match="outside"):
            kernels.gather_fixed(src, 8, 0, 8, np.array(bad, np.int64), out)
        with pytest.raises(FormatError, match="outside"):
            kernels.gather_rows(src, 8, np.array(bad, np.int64), [(0, 8, out)])
    with pytest.raises(ValueError):
        kernels.gather_rows(src, 8, np.array([0, 1], np.int64), [(4, 8, out)])  # field past the row
    with pytest.raises(ValueError):
        kernels.gather_rows(src, 8, np.array([0, 1], np.int64), [(0, 8, np.empty((3, 8), np.uint8))])


def make_heap_case(nrows=50, row_size=24, ref_offset=4):
    """Rows holding (offset, nbytes) refs into a heap split in 3 slots of ranges."""
    payloads = [RNG.integers(0, 256, int(RNG.integers(0, 40)), dtype=np.uint8) for _ in range(nrows)]
    heap = np.concatenate(payloads) if payloads else np.zeros(0, np.uint8)
    offs = np.concatenate(([0], np.cumsum([len(p) for p in payloads])[:-1])).astype(np.uint64)
    src = np.zeros(nrows * row_size, np.uint8)
    view = src.reshape(nrows, row_size)
    view[:, ref_offset : ref_offset + 8] = offs.view(np.uint8).reshape(nrows, 8)
    view[:, ref_offset + 8 : ref_offset + 16] = np.array([len(p) for p in payloads], np.uint64).view(np.uint8).reshape(nrows, 8)
    return src, heap, payloads, offs


def test_gather_heap_matches_reference_padded_and_ragged():
    row_size, ref = 24, 4
    src, heap, payloads, offs = make_heap_case(row_size=row_size, ref_offset=ref)
    rows = RNG.integers(0, 50, 80).astype(np.int64)
    # one slot covering the whole heap, based at 0
    lo, hi, base = (np.array([0], np.int64), np.array([len(heap)], np.int64), np.array([0], np.int64))
    nb = np.array([len(payloads[r]) for r in rows])
    dst = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(nb, out=dst[1:])
    out = np.empty(int(dst[-1]), np.uint8)
    kernels.gather_heap(src, row_size, ref, rows, 50, lo, hi, base, heap, out, dst)
    assert np.array_equal(out, np.concatenate([payloads[r] for r in rows]))
    stride = 40
    padded = np.full((len(rows), stride), 7, np.uint8)
    kernels.gather_heap(src, row_size, ref, rows, 50, lo, hi, base, heap, padded, np.arange(len(rows), dtype=np.int64) * stride, stride)
    for i, r in enumerate(rows):
        assert np.array_equal(padded[i, : len(payloads[r])], payloads[r])
        assert not padded[i, len(payloads[r]) :].any()


def test_gather_heap_bounds_checks():
    row_size, ref = 24, 4
    src, heap, payloads, offs = make_heap_case(row_size=row_size, ref_offset=ref)
    rows = np.arange(50, dtype=np.int64)
    dst = np.zeros(51, np.int64)
    np.cumsum([len(p) for p in payloads], out=dst[1:])
    out = np.empty(int(dst[-1]), np.uint8)
    # a slot range that excludes the last payload
    last = int(offs[-1])
    with pytest.raises(FormatError, match="heap range"):
        kernels.gather_heap(src, row_size, ref, rows, 50, np.array([0]), np.array([last]), np.array([0]), heap, out, dst)
    # a hostile reference: offset huge
    bad = src.copy()
    bad.reshape(50, row_size)[3, ref : ref + 8] = np.array([2**62], np.uint64).view(np.uint8)
    with pytest.raises(FormatError):
        kernels.gather_heap(bad, row_size, ref, rows, 50, np.array([0]), np.array([len(heap)]), np.array([0]), heap, out, dst)
    # a hostile nbytes: larger than the range, and "negative" (top bit set)
    for nb in (2**40, 2**64 - 1):
        bad = src.copy()
        bad.reshape(50, row_size)[3, ref + 8 : ref + 16] = np.array([nb], np.uint64).view(np.uint8)
        with pytest.raises(FormatError):
            kernels.gather_heap(bad, row_size, ref, rows, 50, np.array([0]), np.array([len(heap)]), np.array([0]), heap, out, dst)
    # heap buffer shorter than the claimed range
    with pytest.raises(FormatError):
        kernels.gather_heap(src, row_size, ref, rows, 50, np.array([0]), np.array([len(heap)]), np.array([0]), heap[:-1], out, dst)
    # destination too small
    with pytest.raises(FormatError, match="destination"):
        kernels.gather_heap(src, row_size, ref, rows, 50, np.array([0]), np.array([len(heap)]), np.array([0]), heap, out[:-1], dst)


def write_chunks(path, chunks):
    with open(path, "wb") as f:
        f.write(b"\0" * 100)
        offs = []
        for c in chunks:
            offs.append(f.tell())
            f.write(c)
    return np.array(offs, np.int64)


def frame(raw: bytes, cname="lz4") -> bytes:
    import blosc2

    sc = blosc2.SChunk(chunksize=len(raw), data=raw, cparams={"codec": getattr(blosc2.Codec, cname.upper()), "typesize": 4, "nthreads": 1})
    return sc.to_cframe()


@pytest.mark.parametrize("compressed", [False, True])
def test_load_chunks_matches_reference(tmp_path, compressed):
    raw_size = 4096
    raws = [RNG.integers(0, 4, raw_size, dtype=np.uint8).tobytes() for _ in range(6)]
    stored = [frame(r) if compressed else r for r in raws]
    path = str(tmp_path / "c.bin")
    offs = write_chunks(path, stored)
    sizes = np.array([len(s) for s in stored], np.int64)
    checks = np.array([kernels.crc32(s) for s in stored], np.uint64)
    fd = os.open(path, os.O_RDONLY)
    try:
        dst = np.empty(6 * raw_size, np.uint8)
        scratch = np.empty(int(sizes.max()), np.uint8)
        kernels.load_chunks(fd, offs, sizes, checks, compressed=compressed, verify=True, dst=dst, raw_size=raw_size, scratch=scratch)
        assert dst.tobytes() == b"".join(raws)
        sel = np.array([4, 1], np.int64)
        kernels.load_chunks(fd, offs[sel], sizes[sel], checks[sel], compressed=compressed, verify=True, dst=dst[: 2 * raw_size], raw_size=raw_size, scratch=scratch)
        assert dst[: 2 * raw_size].tobytes() == raws[4] + raws[1]
        # checksum mismatch
        bad = checks.copy()
        bad[2] ^= np.uint64(1)
        with pytest.raises(ChecksumError) as ei:
            kernels.load_chunks(fd, offs, sizes, bad, compressed=compressed, verify=True, dst=dst, raw_size=raw_size, scratch=scratch)
        assert ei.value.index == 2
        # beyond the end of the file
        far = offs.copy()
        far[1] = os.path.getsize(path) - 10
        with pytest.raises(FormatError, match="truncated"):
            kernels.load_chunks(fd, far, sizes, checks, compressed=compressed, verify=False, dst=dst, raw_size=raw_size, scratch=scratch)
        # wrong stored size for a raw chunk / zero size
        wrong = sizes.copy()
        wrong[0] = 0
        with pytest.raises(FormatError):
            kernels.load_chunks(fd, offs, wrong, checks, compressed=compressed, verify=False, dst=dst, raw_size=raw_size, scratch=scratch)
    finally:
        os.close(fd)


def test_decompress_rejects_corrupt_frames():
    raw = RNG.integers(0, 4, 8192, dtype=np.uint8).tobytes()
    good = np.frombuffer(frame(raw), np.uint8).copy()
    dst = np.empty(8192, np.uint8)
    kernels.decompress_frame(good, dst)
    assert dst.tobytes() == raw
    with pytest.raises(FormatError):
        kernels.decompress_frame(good, np.empty(8191, np.uint8))  # size not the expected one
    with pytest.raises(FormatError):
        kernels.decompress_frame(good[:50], dst)  # truncated
    failures = 0
    for _trial in range(300):
        bad = good.copy()
        for _ in range(int(RNG.integers(1, 6))):
            bad[int(RNG.integers(0, len(bad)))] = RNG.integers(0, 256)
        try:
            kernels.decompress_frame(bad, dst)  # must raise or succeed, never crash
        except FormatError:
            failures += 1
    assert failures > 0
    for hdr in range(0, 40):
        bad = good.copy()
        bad[hdr] ^= 0xFF
        try:
            kernels.decompress_frame(bad, dst)
        except FormatError:
            pass


def test_crc32_equals_zlib():
    import zlib

    assert kernels.crc32(b"") == 0
    assert kernels.crc32(b"abc") == zlib.crc32(b"abc") == 0x352441C2
    for n in (1, 15, 64, 1000, 1 << 20):
        data = RNG.integers(0, 256, n, dtype=np.uint8)
        assert kernels.crc32(data) == zlib.crc32(data)


def test_pread_rows_and_heap_match_reference(tmp_path):
    row_size, ref = 24, 4
    src, heap, payloads, offs = make_heap_case(row_size=row_size, ref_offset=ref)
    # lay the file out: rows at 0.., heap chunks of 16 bytes scattered in reverse order
    H = 16
    nchunks = -(-len(heap) // H)
    chunks = [heap[k * H : (k + 1) * H].tobytes().ljust(H, b"\0") for k in range(nchunks)]
    path = str(tmp_path / "f.bin")
    with open(path, "wb") as f:
        f.write(src.tobytes())
        chunk_offsets = np.zeros(nchunks, np.int64)
        for k in reversed(range(nchunks)):
            chunk_offsets[k] = f.tell()
            f.write(chunks[k])
    fd = os.open(path, os.O_RDONLY)
    try:
        rows = RNG.integers(0, 50, 60).astype(np.int64)
        buf = np.empty(len(rows) * row_size, np.uint8)
        kernels.pread_rows(fd, rows * row_size, row_size, buf)
        assert np.array_equal(buf.reshape(-1, row_size), src.reshape(50, row_size)[rows])
        nb = np.array([len(payloads[r]) for r in rows])
        dst = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(nb, out=dst[1:])
        out = np.empty(int(dst[-1]), np.uint8)
        lo = np.zeros(len(rows), np.int64)
        hi = np.full(len(rows), len(heap), np.int64)
        ident = np.arange(len(rows), dtype=np.int64)
        kernels.pread_heap(fd, buf, row_size, ref, ident, lo, hi, chunk_offsets, H, out, dst)
        assert np.array_equal(out, np.concatenate([payloads[r] for r in rows]))
        # through a row index into the source rows (the block path): same payloads
        kernels.pread_heap(fd, src, row_size, ref, rows, lo, hi, chunk_offsets, H, out, dst)
        assert np.array_equal(out, np.concatenate([payloads[r] for r in rows]))
        with pytest.raises(FormatError, match="outside"):
            kernels.pread_heap(fd, src, row_size, ref, rows + 50, lo, hi, chunk_offsets, H, out, dst)
        hi2 = hi.copy()
        hi2[:] = 0
        if nb.any():
            with pytest.raises(FormatError):
                kernels.pread_heap(fd, buf, row_size, ref, ident, lo, hi2, chunk_offsets, H, out, dst)
        with pytest.raises(FormatError, match="truncated"):
            kernels.pread_rows(fd, np.array([os.path.getsize(path) - 3], np.int64), row_size, buf)
    finally:
        os.close(fd)


def test_gather_heap_empty_payload_of_a_block_without_heap_bytes():
    """A block whose heap range is empty loads no heap chunk; its empty payloads still read."""
    row_size, ref = 24, 4
    src = np.zeros(row_size, np.uint8)
    src[ref : ref + 8] = np.array([300], np.uint64).view(np.uint8)  # offset 300, nbytes 0
    out = np.empty(0, np.uint8)
    kernels.gather_heap(src, row_size, ref, np.array([0], np.int64), 1, np.array([300]), np.array([300]),
                        np.array([0]), np.zeros(0, np.uint8), out, np.array([0, 0], np.int64))


def test_preadv_rows_matches_reference(tmp_path):
    row_size = 37
    nrows = 40
    data = RNG.integers(0, 256, nrows * row_size, dtype=np.uint8)
    path = str(tmp_path / "rows.bin")
    with open(path, "wb") as f:
        f.write(b"\1" * 11)
        f.write(data.tobytes())
    table = data.reshape(nrows, row_size)
    rows = RNG.integers(0, nrows, 25)
    offs = (11 + rows * row_size).astype(np.int64)
    a = np.empty((25, 8), np.uint8)  # bytes 3..11
    b = np.empty((25, 20), np.uint8)  # bytes 15..35
    segs = [(3, None), (8, a), (4, None), (20, b), (2, None)]
    fd = os.open(path, os.O_RDONLY)
    try:
        kernels.preadv_rows(fd, offs, row_size, segs, np.empty(row_size, np.uint8))
        assert np.array_equal(a, table[rows, 3:11])
        assert np.array_equal(b, table[rows, 15:35])
        with pytest.raises(FormatError, match="truncated"):
            kernels.preadv_rows(fd, np.array([11 + (nrows - 1) * row_size + 5], np.int64), row_size,
                                [(3, None), (8, a[:1]), (4, None), (20, b[:1]), (2, None)], np.empty(row_size, np.uint8))
        with pytest.raises(ValueError):  # pieces must cover the row
            kernels.preadv_rows(fd, offs, row_size, segs[:-1], np.empty(row_size, np.uint8))
        with pytest.raises(ValueError):
            kernels.preadv_rows(fd, offs, row_size, [(3, None), (8, a[:3]), (4, None), (20, b), (2, None)], np.empty(row_size, np.uint8))
    finally:
        os.close(fd)
