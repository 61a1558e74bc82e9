"""Each kernel against a slow NumPy reference on random inputs, and its bounds checks."""

import os

import numpy as np
import pytest

from rowstore import kernels
from rowstore.errors import ChecksumError, FormatError

RNG = np.random.default_rng(1234)


def ref_gather(src, row_size, off, size, rows):
    return (
        np.stack([src[r * row_size + off : r * row_size + off + size] for r in rows])
        if len(rows)
        else np.zeros((0, size), np.uint8)
    )


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
        kernels.gather_rows(
            src, 8, np.array([0, 1], np.int64), [(0, 8, np.empty((3, 8), np.uint8))]
        )


def make_heap_case(nrows=50, row_size=24, ref_offset=4):
    """Rows holding (offset, nbytes) refs into a heap split in 3 slots of ranges."""
    payloads = [
        RNG.integers(0, 256, int(RNG.integers(0, 40)), dtype=np.uint8) for _ in range(nrows)
    ]
    heap = np.concatenate(payloads) if payloads else np.zeros(0, np.uint8)
    offs = np.concatenate(([0], np.cumsum([len(p) for p in payloads])[:-1])).astype(np.uint64)
    src = np.zeros(nrows * row_size, np.uint8)
    view = src.reshape(nrows, row_size)
    view[:, ref_offset : ref_offset + 8] = offs.view(np.uint8).reshape(nrows, 8)
    view[:, ref_offset + 8 : ref_offset + 16] = (
        np.array([len(p) for p in payloads], np.uint64).view(np.uint8).reshape(nrows, 8)
    )
    return src, heap, payloads, offs


def test_gather_heap_matches_reference_padded_and_ragged():
    row_size, ref = 24, 4
    src, heap, payloads, offs = make_heap_case(row_size=row_size, ref_offset=ref)
    rows = RNG.integers(0, 50, 80).astype(np.int64)
    # one slot covering the whole heap, based at 0
    lo, hi, base = (
        np.array([0], np.int64),
        np.array([len(heap)], np.int64),
        np.array([0], np.int64),
    )
    nb = np.array([len(payloads[r]) for r in rows])
    dst = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(nb, out=dst[1:])
    out = np.empty(int(dst[-1]), np.uint8)
    kernels.gather_heap(src, row_size, ref, rows, 50, lo, hi, base, heap, out, dst)
    assert np.array_equal(out, np.concatenate([payloads[r] for r in rows]))
    stride = 40
    padded = np.full((len(rows), stride), 7, np.uint8)
    kernels.gather_heap(
        src,
        row_size,
        ref,
        rows,
        50,
        lo,
        hi,
        base,
        heap,
        padded,
        np.arange(len(rows), dtype=np.int64) * stride,
        stride,
    )
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
        kernels.gather_heap(
            src,
            row_size,
            ref,
            rows,
            50,
            np.array([0]),
            np.array([last]),
            np.array([0]),
            heap,
            out,
            dst,
        )
    # a hostile reference: offset huge
    bad = src.copy()
    bad.reshape(50, row_size)[3, ref : ref + 8] = np.array([2**62], np.uint64).view(np.uint8)
    with pytest.raises(FormatError):
        kernels.gather_heap(
            bad,
            row_size,
            ref,
            rows,
            50,
            np.array([0]),
            np.array([len(heap)]),
            np.array([0]),
            heap,
            out,
            dst,
        )
    # a hostile nbytes: larger than the range, and "negative" (top bit set)
    for nb in (2**40, 2**64 - 1):
        bad = src.copy()
        bad.reshape(50, row_size)[3, ref + 8 : ref + 16] = np.array([nb], np.uint64).view(np.uint8)
        with pytest.raises(FormatError):
            kernels.gather_heap(
                bad,
                row_size,
                ref,
                rows,
                50,
                np.array([0]),
                np.array([len(heap)]),
                np.array([0]),
                heap,
                out,
                dst,
            )
    # heap buffer shorter than the claimed range
    with pytest.raises(FormatError):
        kernels.gather_heap(
            src,
            row_size,
            ref,
            rows,
            50,
            np.array([0]),
            np.array([len(heap)]),
            np.array([0]),
            heap[:-1],
            out,
            dst,
        )
    # destination too small
    with pytest.raises(FormatError, match="destination"):
        kernels.gather_heap(
            src,
            row_size,
            ref,
            rows,
            50,
            np.array([0]),
            np.array([len(heap)]),
            np.array([0]),
            heap,
            out[:-1],
            dst,
        )


def write_chunks(path, chunks):
    with open(path, "wb") as f:
        f.write(b"\0" * 100)
        offs = []
        for c in chunks:
            offs.append(f.tell())
            f.write(c)
    return np.array(offs, np.int64)


#: Blosc2 compressor and shuffle codes (blosc2.h) by the format's names (rowstore.format.spec
#: declares the same): kernels take the codes.
CODECS = {"blosclz": 0, "lz4": 1, "lz4hc": 2, "zlib": 4, "zstd": 5}
SHUFFLES = {"none": 0, "byte": 1, "bit": 2}


def frame(raw: bytes, cname="lz4", shuffle="byte", clevel=5, typesize=4) -> np.ndarray:
    """A stored chunk as our writer makes it."""
    return kernels.compress_frame(
        raw, compcode=CODECS[cname], clevel=clevel, shuffle=SHUFFLES[shuffle], typesize=typesize
    )


@pytest.mark.parametrize("codec", [None, (CODECS["lz4"], SHUFFLES["byte"])])
def test_load_chunks_matches_reference(tmp_path, codec):
    raw_size = 4096
    raws = [RNG.integers(0, 4, raw_size, dtype=np.uint8).tobytes() for _ in range(6)]
    stored = [frame(r).tobytes() if codec else r for r in raws]
    path = str(tmp_path / "c.bin")
    offs = write_chunks(path, stored)
    sizes = np.array([len(s) for s in stored], np.int64)
    checks = np.array([kernels.crc32(s) for s in stored], np.uint64)
    fd = os.open(path, os.O_RDONLY)
    try:
        dst = np.empty(6 * raw_size, np.uint8)
        scratch = np.empty(int(sizes.max()), np.uint8)
        kernels.load_chunks(
            fd,
            offs,
            sizes,
            checks,
            codec=codec,
            verify=True,
            dst=dst,
            raw_size=raw_size,
            scratch=scratch,
        )
        assert dst.tobytes() == b"".join(raws)
        sel = np.array([4, 1], np.int64)
        kernels.load_chunks(
            fd,
            offs[sel],
            sizes[sel],
            checks[sel],
            codec=codec,
            verify=True,
            dst=dst[: 2 * raw_size],
            raw_size=raw_size,
            scratch=scratch,
        )
        assert dst[: 2 * raw_size].tobytes() == raws[4] + raws[1]
        # checksum mismatch
        bad = checks.copy()
        bad[2] ^= np.uint64(1)
        with pytest.raises(ChecksumError) as ei:
            kernels.load_chunks(
                fd,
                offs,
                sizes,
                bad,
                codec=codec,
                verify=True,
                dst=dst,
                raw_size=raw_size,
                scratch=scratch,
            )
        assert ei.value.index == 2 and ei.value.code == kernels.KernelCode.E_CHECKSUM
        # beyond the end of the file
        far = offs.copy()
        far[1] = os.path.getsize(path) - 10
        with pytest.raises(FormatError, match="truncated"):
            kernels.load_chunks(
                fd,
                far,
                sizes,
                checks,
                codec=codec,
                verify=False,
                dst=dst,
                raw_size=raw_size,
                scratch=scratch,
            )
        # wrong stored size for a raw chunk / zero size
        wrong = sizes.copy()
        wrong[0] = 0
        with pytest.raises(FormatError):
            kernels.load_chunks(
                fd,
                offs,
                wrong,
                checks,
                codec=codec,
                verify=False,
                dst=dst,
                raw_size=raw_size,
                scratch=scratch,
            )
        # a destination or staging buffer too small
        with pytest.raises(FormatError, match="destination"):
            kernels.load_chunks(
                fd,
                offs,
                sizes,
                checks,
                codec=codec,
                verify=False,
                dst=dst[:-1],
                raw_size=raw_size,
                scratch=scratch,
            )
        if codec is None:
            # A raw chunk stored short (a trimmed heap): its bytes, then zeros to raw_size, by
            # both kernels; one stored longer than raw_size is refused.
            short = sizes.copy()
            short[3] = 1000
            short_checks = checks.copy()
            short_checks[3] = kernels.crc32(raws[3][:1000])
            want = b"".join(raws[:3]) + raws[3][:1000] + bytes(raw_size - 1000) + b"".join(raws[4:])
            dst[:] = 7
            kernels.load_chunks(
                fd,
                offs,
                short,
                short_checks,
                codec=None,
                verify=True,
                dst=dst,
                raw_size=raw_size,
                scratch=scratch,
            )
            assert dst.tobytes() == want
            src = np.frombuffer(open(path, "rb").read(), np.uint8)
            dst[:] = 7
            kernels.decode_chunks(
                src, offs, short, short_checks, codec=None, verify=True, dst=dst, raw_size=raw_size
            )
            assert dst.tobytes() == want
            long = sizes.copy()
            long[1] = raw_size + 1
            with pytest.raises(FormatError):
                kernels.load_chunks(
                    fd,
                    offs,
                    long,
                    checks,
                    codec=None,
                    verify=False,
                    dst=dst,
                    raw_size=raw_size,
                    scratch=scratch,
                )
            with pytest.raises(FormatError):
                kernels.decode_chunks(
                    src, offs, long, checks, codec=None, verify=False, dst=dst, raw_size=raw_size
                )
        if codec:
            with pytest.raises(FormatError, match="destination"):
                kernels.load_chunks(
                    fd,
                    offs,
                    sizes,
                    checks,
                    codec=codec,
                    verify=False,
                    dst=dst,
                    raw_size=raw_size,
                    scratch=scratch[:10],
                )
    finally:
        os.close(fd)


def test_decompress_rejects_corrupt_frames():
    raw = RNG.integers(0, 4, 8192, dtype=np.uint8).tobytes()
    good = frame(raw).copy()
    lz4 = (CODECS["lz4"], SHUFFLES["byte"])
    dst = np.empty(8192, np.uint8)
    kernels.decompress_frame(good, dst, codec=lz4)
    assert dst.tobytes() == raw
    with pytest.raises(FormatError):
        kernels.decompress_frame(
            good, np.empty(8191, np.uint8), codec=lz4
        )  # size not the expected one
    with pytest.raises(FormatError):
        kernels.decompress_frame(good[:50], dst, codec=lz4)  # truncated
    failures = 0
    for _trial in range(300):
        bad = good.copy()
        for _ in range(int(RNG.integers(1, 6))):
            bad[int(RNG.integers(0, len(bad)))] = RNG.integers(0, 256)
        try:
            kernels.decompress_frame(bad, dst, codec=lz4)  # must raise or succeed, never crash
        except FormatError:
            failures += 1
    assert failures > 0
    hlen = int.from_bytes(good[11:15].tobytes(), "big")
    for hdr in [*range(0, 40), *range(hlen, hlen + 32)]:
        bad = good.copy()
        bad[hdr] ^= 0xFF
        try:
            kernels.decompress_frame(bad, dst, codec=lz4)
        except FormatError:
            pass


def old_writer_frame(raw: bytes, cname="lz4", shuffle="byte", clevel=5, typesize=4) -> np.ndarray:
    """A stored chunk as the writer made it before compress_frame, through python-blosc2 (the
    golden file's chunks): the shuffle sits in the first filter slot, not the last."""
    import blosc2

    filters = {
        "none": blosc2.Filter.NOFILTER,
        "byte": blosc2.Filter.SHUFFLE,
        "bit": blosc2.Filter.BITSHUFFLE,
    }
    params = {
        "codec": getattr(blosc2.Codec, cname.upper()),
        "clevel": clevel if any(raw) else 0,
        "typesize": typesize,
        "filters": [filters[shuffle]],
        "nthreads": 1,
    }
    schunk = blosc2.SChunk(chunksize=len(raw), cparams=params, dparams={"nthreads": 1})
    schunk.append_chunk(blosc2.compress2(raw, **params))
    return np.frombuffer(schunk.to_cframe(), np.uint8)


def _kinds(n):
    """Block contents that take the writer's different paths: compressible, incompressible (Blosc2
    stores it memcpy'd), all zeros (the writer stores it memcpy'd at clevel 0), one value, tiny."""
    return {
        "compressible": RNG.integers(0, 4, n, dtype=np.uint8),
        "random": RNG.integers(0, 256, n, dtype=np.uint8),
        "zeros": np.zeros(n, np.uint8),
        "constant": np.full(n, 7, np.uint8),
        "tiny": RNG.integers(0, 256, 5, dtype=np.uint8),
    }


@pytest.mark.parametrize("make", [frame, old_writer_frame], ids=["compress_frame", "python-blosc2"])
@pytest.mark.parametrize("cname", sorted(CODECS))
def test_every_chunk_the_writer_makes_passes_the_header_check(tmp_path, cname, make):
    """Every cname x shuffle x typesize x clevel the writer can produce (and the writer before
    compress_frame produced), on contents that take Blosc2's different paths (memcpy'd, split
    or not), loads under its declared compression."""
    chunks, raws, codecs = [], [], []
    for shuffle in sorted(SHUFFLES):
        for typesize in (1, 2, 3, 4, 8, 16, 255):
            for clevel in (0, 1, 5, 9):
                for raw in _kinds(int(RNG.integers(1, 70000))).values():
                    fr = make(raw.tobytes(), cname, shuffle, clevel, typesize)
                    codec = (CODECS[cname], SHUFFLES[shuffle])
                    out = np.empty(len(raw), np.uint8)
                    kernels.decompress_frame(fr, out, codec=codec)
                    assert np.array_equal(out, raw)
                    chunks.append(fr.tobytes())
                    raws.append(raw)
                    codecs.append(codec)
    # and through load_chunks, as the reader reads them (one call per declared compression)
    path = str(tmp_path / "all.bin")
    offs = write_chunks(path, chunks)
    fd = os.open(path, os.O_RDONLY)
    try:
        scratch = np.empty(max(len(c) for c in chunks), np.uint8)
        for i, (chunk, raw, codec) in enumerate(zip(chunks, raws, codecs)):
            dst = np.empty(len(raw), np.uint8)
            kernels.load_chunks(
                fd,
                offs[i : i + 1],
                np.array([len(chunk)], np.int64),
                np.array([kernels.crc32(chunk)], np.uint64),
                codec=codec,
                verify=True,
                dst=dst,
                raw_size=len(raw),
                scratch=scratch,
            )
            assert np.array_equal(dst, raw)
    finally:
        os.close(fd)


def _load_one(tmp_path, chunk: np.ndarray, raw_size: int, codec) -> np.ndarray:
    """load_chunks of one stored chunk whose checksum is that of its (possibly patched) bytes."""
    path = str(tmp_path / "one.bin")
    offs = write_chunks(path, [chunk.tobytes()])
    dst = np.empty(raw_size, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        kernels.load_chunks(
            fd,
            offs,
            np.array([len(chunk)], np.int64),
            np.array([kernels.crc32(chunk)], np.uint64),
            codec=codec,
            verify=True,
            dst=dst,
            raw_size=raw_size,
            scratch=np.empty(len(chunk), np.uint8),
        )
    finally:
        os.close(fd)
    return dst


# Patches of a chunk header (byte offset in the chunk: value or function of the old value), each
# refused with E_CODEC naming that byte (or the one given third). Offsets and bits: c-blosc2
# README_CHUNK_FORMAT.rst.
HEADER_PATCHES = {
    "codec bits name zstd": (2, lambda v: (v & 0x1F) | (4 << 5)),
    "codec bits name a user-defined codec": (2, lambda v: (v & 0x1F) | (6 << 5)),
    "codec bits name the super-chunk's codec": (2, lambda v: (v & 0x1F) | (7 << 5)),
    "delta coding flag": (2, lambda v: v | 0x08),
    "no extended header": (2, lambda v: v & ~0x04),
    "a filter in slot 0 (delta)": (16, 3),
    "a user-defined filter in slot 4": (20, 160),
    "a global registered filter in slot 4": (20, 32),
    "bit shuffle while byte shuffle is declared": (21, 2),
    "bit shuffle in the first slot": (16, 2),
    "byte shuffle in both slots": (16, 1, 21),
    "no shuffle while byte shuffle is declared": (21, 0),
    "user-defined codec id": (22, 160),
    "codec id of zstd": (22, 5),
    "codec metadata": (23, 1),
    "filter metadata of the shuffle": (29, 4),
    "filter metadata of slot 0": (24, 1),
    "variable-length blocks": (30, 1),
    "dictionary flag": (31, 0x01),
    "lazy chunk": (31, 0x08),
    "special zeros": (31, 0x10),
    "big-endian": (31, 0x02),
    "instrumented codec": (31, 0x80),
    "alpha format version": (0, 3),
    "future format version": (0, 7),
    "codec format version": (1, 2),
}


@pytest.mark.parametrize("patch", sorted(HEADER_PATCHES))
def test_header_check_refuses_other_codecs_and_filters(tmp_path, patch):
    """A chunk whose header bytes (with a valid checksum) ask for anything but the declared
    compression is refused with E_CODEC before c-blosc2 sees it: no plugin lookup by id."""
    raw = RNG.integers(0, 4, 16384, dtype=np.uint8).tobytes()
    good = frame(raw, "lz4", "byte")
    lz4 = (CODECS["lz4"], SHUFFLES["byte"])
    assert _load_one(tmp_path, good, len(raw), lz4).tobytes() == raw
    at, value, *named = HEADER_PATCHES[patch]
    bad = good.copy()
    hlen = int.from_bytes(good[11:15].tobytes(), "big")
    bad[hlen + at] = value(int(bad[hlen + at])) if callable(value) else value
    assert bad[hlen + at] != good[hlen + at]
    with pytest.raises(FormatError, match="declared compression") as ei:
        _load_one(tmp_path, bad, len(raw), lz4)
    assert isinstance(ei.value, kernels.KernelError) and not isinstance(ei.value, ChecksumError)
    assert (ei.value.code, ei.value.index, ei.value.detail) == (
        kernels.KernelCode.E_CODEC,
        0,
        (named or [at])[0],
    )
    with pytest.raises(FormatError, match="declared compression"):
        kernels.decompress_frame(bad, np.empty(len(raw), np.uint8), codec=lz4)


def test_header_check_refuses_a_valid_chunk_of_another_codec(tmp_path):
    """A zstd chunk decompresses fine, but not in a file that declares lz4: the check compares
    with the declaration, not with what c-blosc2 could decode."""
    raw = RNG.integers(0, 4, 16384, dtype=np.uint8).tobytes()
    zstd = frame(raw, "zstd", "byte")
    assert _load_one(tmp_path, zstd, len(raw), (CODECS["zstd"], SHUFFLES["byte"])).tobytes() == raw
    for declared in [
        ("lz4", "byte"),
        ("lz4hc", "byte"),
        ("zstd", "bit"),
        ("zstd", "none"),
        ("zlib", "byte"),
    ]:
        with pytest.raises(FormatError, match="declared compression") as ei:
            _load_one(tmp_path, zstd, len(raw), (CODECS[declared[0]], SHUFFLES[declared[1]]))
        assert ei.value.code == kernels.KernelCode.E_CODEC
    # lz4 and lz4hc share a format but not a codec id: each is refused under the other's name
    lz4hc = frame(raw, "lz4hc", "byte")
    with pytest.raises(FormatError, match="declared compression"):
        _load_one(tmp_path, lz4hc, len(raw), (CODECS["lz4"], SHUFFLES["byte"]))
    # a chunk that claims more or fewer bytes than the block holds
    with pytest.raises(FormatError, match="size"):
        _load_one(tmp_path, zstd, len(raw) - 1, (CODECS["zstd"], SHUFFLES["byte"]))


def test_compression_codes_are_checked():
    for compcode, shuffle in [(3, 0), (6, 0), (160, 0), (-1, 0), (1, 3), (1, 160), (1, -1)]:
        with pytest.raises(ValueError):
            kernels.compress_frame(
                b"abcd" * 100, compcode=compcode, clevel=5, shuffle=shuffle, typesize=4
            )
        with pytest.raises(ValueError):
            kernels.decompress_frame(
                frame(b"abcd" * 100), np.empty(400, np.uint8), codec=(compcode, shuffle)
            )


def test_error_codes_are_one_enum_with_a_message_each():
    from rowstore import _common

    assert kernels.KernelCode is _common.KernelCode
    assert [int(c) for c in kernels.KernelCode] == list(range(len(kernels.KernelCode)))
    assert set(kernels._MESSAGES) == set(kernels.KernelCode) - {kernels.KernelCode.E_OK}
    assert kernels.KernelCode.E_CODEC.name == "E_CODEC"


def test_kernels_check_err_and_destinations_themselves(tmp_path):
    """Memory safety does not rest on kernels.py: called directly, every kernel refuses a short
    ``err`` and a destination smaller than what it would write."""
    from rowstore import _frame, _gather, _io

    src = np.zeros(10 * 8, np.uint8)
    rows = np.array([0, 1, 2], np.int64)
    i64 = np.zeros(1, np.int64)
    path = str(tmp_path / "f.bin")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 4)
    fd = os.open(path, os.O_RDONLY)
    fds = np.array([fd], np.int32)
    calls = {
        "gather_fixed": lambda out, err: _gather.gather_fixed(src, 8, 0, 8, rows, out, err),
        "gather_rows": lambda out, err: _gather.gather_rows(
            src,
            8,
            rows,
            np.array([4, 0], np.int64),
            np.array([4, 8], np.int64),
            [np.empty(12, np.uint8), out],
            err,
        ),
        "gather_heap": lambda out, err: _gather.gather_heap(
            np.zeros(24, np.uint8),
            24,
            0,
            np.array([0], np.int64),
            1,
            i64,
            i64,
            i64,
            np.zeros(0, np.uint8),
            out,
            np.array([0], np.int64),
            8,
            err,
        ),
        "pread_rows": lambda out, err: _io.pread_rows(fds, rows * 8, 8, out, err),
        "pread_heap": lambda out, err: _io.pread_heap(
            fds,
            np.zeros(24, np.uint8),
            24,
            np.array([0], np.int64),
            np.array([0], np.int64),
            i64,
            i64,
            np.array([0], np.int64),
            i64,
            16,
            (out,),
            (np.array([0], np.int64),),
            8,
            err,
        ),
        "preadv_rows": lambda out, err: _io.preadv_rows(
            fds, rows * 8, 8, np.array([8], np.int64), [out], np.empty(0, np.uint8), err
        ),
        "load_chunks": lambda out, err: _frame.load_chunks(
            fds,
            rows * 8,
            np.full(3, 8, np.int64),
            np.zeros(3, np.uint64),
            -1,
            0,
            False,
            out,
            8,
            np.empty(1, np.uint8),
            err,
        ),
    }
    try:
        for name, call in calls.items():
            big = np.empty(3 * 8, np.uint8)
            with pytest.raises(ValueError, match="err"):
                call(big, np.zeros(2, np.int64))
            err = np.full(3, 99, np.int64)
            assert call(big, err) == 0 and err[0] == 0, name
            assert call(big[:7] if name.endswith("heap") else big[:-1], err) == -1, (
                name
            )  # heap: pad stride 8
            assert err[0] == kernels.KernelCode.E_DEST, (name, err)
        err = np.zeros(3, np.int64)  # the sink of a segment not asked for
        assert (
            _io.preadv_rows(
                fds,
                rows * 8,
                8,
                np.array([2, 6], np.int64),
                [None, big[:18]],
                np.empty(1, np.uint8),
                err,
            )
            == -1
        )
        assert err[0] == kernels.KernelCode.E_DEST
        assert (
            calls["gather_rows"](bytearray(24), np.zeros(3, np.int64)) == 0
        )  # any writeable buffer of bytes
        with pytest.raises((ValueError, BufferError)):  # not C-contiguous
            calls["gather_rows"](np.empty((3, 16), np.uint8)[:, :8], np.zeros(3, np.int64))
        ro = np.empty(24, np.uint8)
        ro.flags.writeable = False
        for name in ("gather_rows", "preadv_rows"):  # read-only
            with pytest.raises((ValueError, BufferError)):
                calls[name](ro, np.zeros(3, np.int64))
    finally:
        os.close(fd)


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
        kernels.pread_heap(fd, buf, row_size, [ref], ident, lo, hi, chunk_offsets, H, [out], [dst])
        assert np.array_equal(out, np.concatenate([payloads[r] for r in rows]))
        # through a row index into the source rows (the block path): same payloads
        kernels.pread_heap(fd, src, row_size, [ref], rows, lo, hi, chunk_offsets, H, [out], [dst])
        assert np.array_equal(out, np.concatenate([payloads[r] for r in rows]))
        with pytest.raises(FormatError, match="outside"):
            kernels.pread_heap(
                fd, src, row_size, [ref], rows + 50, lo, hi, chunk_offsets, H, [out], [dst]
            )
        hi2 = hi.copy()
        hi2[:] = 0
        if nb.any():
            with pytest.raises(FormatError):
                kernels.pread_heap(
                    fd, buf, row_size, [ref], ident, lo, hi2, chunk_offsets, H, [out], [dst]
                )
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
    kernels.gather_heap(
        src,
        row_size,
        ref,
        np.array([0], np.int64),
        1,
        np.array([300]),
        np.array([300]),
        np.array([0]),
        np.zeros(0, np.uint8),
        out,
        np.array([0, 0], np.int64),
    )


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
            kernels.preadv_rows(
                fd,
                np.array([11 + (nrows - 1) * row_size + 5], np.int64),
                row_size,
                [(3, None), (8, a[:1]), (4, None), (20, b[:1]), (2, None)],
                np.empty(row_size, np.uint8),
            )
        with pytest.raises(ValueError):  # pieces must cover the row
            kernels.preadv_rows(fd, offs, row_size, segs[:-1], np.empty(row_size, np.uint8))
        with pytest.raises(ValueError):
            kernels.preadv_rows(
                fd,
                offs,
                row_size,
                [(3, None), (8, a[:3]), (4, None), (20, b), (2, None)],
                np.empty(row_size, np.uint8),
            )
    finally:
        os.close(fd)


def test_preadv_rows_in_file_order_coalesces_runs_into_their_slots(tmp_path):
    """``order``: rows read in that order, runs of consecutive rows in one preadv, each still in
    its own slot; the same bytes as one call per row, whatever the runs, checks and faults."""
    import zlib

    row_size, nrows = 29, 300
    data = RNG.integers(0, 256, nrows * row_size, dtype=np.uint8)
    path = tmp_path / "rows.bin"
    path.write_bytes(data.tobytes())
    table = data.reshape(nrows, row_size)
    # Runs of consecutive rows (some longer than one preadv takes), repeats, shuffled slots.
    runs = [np.arange(a, a + k) for a, k in [(0, 7), (40, 120), (200, 1), (10, 3), (203, 60)]]
    rows = np.concatenate(runs + [np.array([5, 5, 299])])
    rows = rows[RNG.permutation(len(rows))]
    n = len(rows)
    offs = (rows * row_size).astype(np.int64)
    order = np.argsort(offs, kind="stable")
    sink = np.empty(row_size, np.uint8)
    crc = np.array([zlib.crc32(table[r].tobytes()) for r in rows], np.uint32)
    k = int(np.flatnonzero(rows == 100)[0])  # inside a long run
    bad = crc.copy()
    bad[k] ^= 4
    fd = os.open(path, os.O_RDONLY)
    try:
        for tail in (19, 15):  # the whole row to the arrays; 4 bytes of it to the sink
            a, b = np.zeros((n, 10), np.uint8), np.zeros((n, tail), np.uint8)
            segs = (
                [(10, a), (row_size - 10 - tail, None), (tail, b)]
                if tail < 19
                else [(10, a), (19, b)]
            )
            for check in (None, np.ones(n, bool)):
                a[:], b[:] = 0, 0
                expect = None if check is None else crc
                kernels.preadv_rows(
                    fd, offs, row_size, segs, sink, check=check, expect=expect, order=order
                )
                assert np.array_equal(a, table[rows, :10])
                assert np.array_equal(b, table[rows, row_size - tail :])
            with pytest.raises(kernels.KernelChecksumError) as ei:
                kernels.preadv_rows(
                    fd, offs, row_size, segs, sink, check=np.ones(n, bool), expect=bad, order=order
                )
            assert ei.value.index == k
        with pytest.raises(ValueError, match="order"):
            kernels.preadv_rows(fd, offs, row_size, segs, sink, order=order[:-1])
        with pytest.raises(kernels.KernelError):
            kernels.preadv_rows(fd, offs, row_size, segs, sink, order=np.full(n, n, np.int64))
    finally:
        os.close(fd)
    # A run that reaches past the end of a truncated file: the error names the first missing row.
    short = tmp_path / "short.bin"
    short.write_bytes(data[: 250 * row_size + 7].tobytes())
    offs = (np.arange(240, 260) * row_size).astype(np.int64)
    out = np.zeros((20, row_size), np.uint8)
    fd = os.open(short, os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="truncated") as ei:
            kernels.preadv_rows(
                fd, offs, row_size, [(row_size, out)], sink, order=np.arange(20, dtype=np.int64)
            )
        assert "row read 10" in str(ei.value)
        assert np.array_equal(out[:10], table[240:250])
    finally:
        os.close(fd)


def test_nothing_imports_the_old_single_kernel_module():
    """_ext/_blocks.pyx is gone: a stale rowstore/_blocks*.so left by an in-place build must not
    matter, so no source imports it."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parent.parent
    for path in [*root.glob("rowstore/**/*.py"), *root.glob("_ext/*.p*"), *root.glob("bench/*.py")]:
        text = path.read_text()
        assert (
            "import _blocks" not in text
            and "rowstore._blocks" not in text
            and "cimport _blocks" not in text
        ), path


def test_heap_kernels_refuse_a_non_contiguous_out(tmp_path):
    """``out`` is filled through a flat view of its memory: a strided array would reshape into
    a copy that is filled and thrown away, so the wrappers refuse it."""
    row_size, ref = 24, 4
    src, heap, payloads, offs = make_heap_case(row_size=row_size, ref_offset=ref)
    rows = np.arange(50, dtype=np.int64)
    dst = np.zeros(51, np.int64)
    np.cumsum([len(p) for p in payloads], out=dst[1:])
    strided = np.zeros(2 * int(dst[-1]), np.uint8)[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.gather_heap(
            src,
            row_size,
            ref,
            rows,
            50,
            np.array([0]),
            np.array([len(heap)]),
            np.array([0]),
            heap,
            strided,
            dst,
        )
    path = tmp_path / "heap.bin"
    path.write_bytes(heap.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="C-contiguous"):
            kernels.pread_heap(
                fd,
                src,
                row_size,
                [ref],
                rows,
                np.zeros(50, np.int64),
                np.full(50, len(heap), np.int64),
                np.array([0], np.int64),
                max(len(heap), 1),
                [strided],
                [dst],
            )
    finally:
        os.close(fd)


def _interleaved_heap_file(path, nrows, nfields, H, rng):
    """A file of rows (``nfields`` references of 16 bytes each, then 8 bytes of padding) and a
    heap written row after row, field after field, as the writer lays payloads out, with gaps
    between some rows (some wider than the kernel's merge gap); heap chunks of ``H`` bytes lie
    in the file in a shuffled order, a run of them consecutive."""
    row_size = 16 * nfields + 8
    payloads, heap = [], bytearray()
    src = np.zeros(nrows * row_size, np.uint8)
    for r in range(nrows):
        heap += bytes(int(rng.choice([0, 0, 100, 5000])))  # a gap before the row
        row = []
        for j in range(nfields):
            p = rng.integers(0, 256, int(rng.choice([0, 3, 40, 700, 2500])), dtype=np.uint8)
            ref = np.array([len(heap), len(p)], np.uint64).view(np.uint8)
            src[r * row_size + 16 * j : r * row_size + 16 * j + 16] = ref
            heap += p.tobytes()
            row.append(p)
        payloads.append(row)
    nchunks = -(-len(heap) // H)
    order = list(range(nchunks))
    cut = nchunks // 3
    tail = order[cut:]
    rng.shuffle(tail)
    order = order[:cut] + tail  # the first third in order: consecutive in the file
    table = np.zeros(nchunks, np.int64)
    with open(path, "wb") as f:
        f.write(src.tobytes())
        for c in order:
            table[c] = f.tell()
            f.write(bytes(heap[c * H : (c + 1) * H]).ljust(H, b"\0"))
    return src, row_size, len(heap), table, payloads


def test_pread_heap_reads_several_fields_in_file_order(tmp_path):
    """Several heap fields in one call, rows shuffled and repeated, payloads read together in
    file order (merged across neighbours and small gaps, split at chunks and wide gaps): every
    field's bytes equal the reference; a field subset reads past the others' payloads; a bad
    reference names its field (``part``) and row."""
    rng = np.random.default_rng(7)
    nrows, nfields, H = 120, 3, 3000
    path = str(tmp_path / "heap.bin")
    src, row_size, heap_len, table, payloads = _interleaved_heap_file(path, nrows, nfields, H, rng)
    rows = np.concatenate([rng.permutation(nrows), rng.integers(0, nrows, 30)]).astype(np.int64)
    lo, hi = np.zeros(len(rows), np.int64), np.full(len(rows), heap_len, np.int64)
    fd = os.open(path, os.O_RDONLY)
    try:
        for fields in ([0, 1, 2], [0, 2], [1]):
            outs, dsts = [], []
            for j in fields:
                dst = np.zeros(len(rows) + 1, np.int64)
                np.cumsum([len(payloads[r][j]) for r in rows], out=dst[1:])
                outs.append(np.full(int(dst[-1]), 0xEE, np.uint8))
                dsts.append(dst)
            kernels.pread_heap(
                fd, src, row_size, [16 * j for j in fields], rows, lo, hi, table, H, outs, dsts
            )
            for j, out in zip(fields, outs):
                want = np.concatenate([payloads[r][j] for r in rows])
                assert np.array_equal(out, want), (fields, j)
        bad = src.copy()
        r = int(rows[17])
        bad[r * row_size + 32 : r * row_size + 40] = np.array([heap_len + 1], np.uint64).view(
            np.uint8
        )
        outs = [np.empty(10**6, np.uint8) for _ in range(3)]
        dsts = [np.zeros(len(rows) + 1, np.int64) for _ in range(3)]
        with pytest.raises(kernels.KernelError) as info:
            kernels.pread_heap(fd, bad, row_size, [0, 16, 32], rows, lo, hi, table, H, outs, dsts)
        assert info.value.part == 2 and info.value.index == 17
        assert info.value.code == kernels.KernelCode.E_BOUNDS
    finally:
        os.close(fd)


def test_per_item_descriptors_chunk_bases_and_strides_match_reference(tmp_path):
    """Several files at once (a dataset's shards): rows, payloads and chunks each read from their
    own descriptor, heap chunk tables concatenated with a per-row base, chunk slots wider than
    the chunks; every result against numpy on the files' bytes."""
    row_size, ref, H = 24, 4, 16
    files, fds, tables, srcs, pays = [], [], [], [], []
    try:
        for k in range(3):
            src, heap, payloads, _ = make_heap_case(row_size=row_size, ref_offset=ref)
            nchunks = -(-len(heap) // H)
            path = str(tmp_path / f"f{k}.bin")
            with open(path, "wb") as f:
                f.write(bytes(k * 7))  # each file's rows start elsewhere
                f.write(src.tobytes())
                table = np.zeros(nchunks, np.int64)
                for c in reversed(range(nchunks)):
                    table[c] = f.tell()
                    f.write(heap[c * H : (c + 1) * H].tobytes().ljust(H, b"\0"))
            files.append(path)
            fds.append(os.open(path, os.O_RDONLY))
            tables.append(table)
            srcs.append(src.reshape(50, row_size))
            pays.append(payloads)
        which = RNG.integers(0, 3, 80)
        rows = RNG.integers(0, 50, 80).astype(np.int64)
        per_fd = np.array(fds, np.int32)[which]
        buf = np.empty(len(rows) * row_size, np.uint8)
        kernels.pread_rows(per_fd, which * 7 + rows * row_size, row_size, buf)
        assert np.array_equal(
            buf.reshape(-1, row_size), np.stack([srcs[w][r] for w, r in zip(which, rows)])
        )
        # preadv straight into two column arrays
        a, b = np.empty((80, 10), np.uint8), np.empty((80, 14), np.uint8)
        kernels.preadv_rows(
            per_fd, which * 7 + rows * row_size, row_size, [(10, a), (14, b)], np.empty(1, np.uint8)
        )
        assert np.array_equal(np.hstack([a, b]), buf.reshape(-1, row_size))
        # payloads: one concatenated chunk table, each row's file's chunks from its base
        allt = np.concatenate(tables)
        base = (np.cumsum([len(t) for t in tables]) - [len(t) for t in tables])[which]
        expect = [pays[w][r] for w, r in zip(which, rows)]
        dst = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(p) for p in expect], out=dst[1:])
        out = np.empty(int(dst[-1]), np.uint8)
        lo, hi = np.zeros(80, np.int64), np.full(80, 50 * 1000, np.int64)
        kernels.pread_heap(
            per_fd,
            buf,
            row_size,
            [ref],
            np.arange(80, dtype=np.int64),
            lo,
            hi,
            allt,
            H,
            [out],
            [dst],
            chunk_base=base,
        )
        assert np.array_equal(out, np.concatenate(expect))
        with pytest.raises(FormatError):  # a base beyond the table
            kernels.pread_heap(
                per_fd,
                buf,
                row_size,
                [ref],
                np.arange(80, dtype=np.int64),
                lo,
                hi,
                allt,
                H,
                [out],
                [dst],
                chunk_base=base + len(allt),
            )
        # whole chunks: 16-byte rows of the files as "chunks", each from its own descriptor, in
        # 40-byte slots (the gap is left alone)
        offs = (which * 7 + rows * row_size).astype(np.int64)
        sizes = np.full(80, 16, np.int64)
        checks = np.array(
            [kernels.crc32(srcs[w][r][:16].tobytes()) for w, r in zip(which, rows)], np.uint64
        )
        slots = np.full(80 * 40, 0xAB, np.uint8)
        kernels.load_chunks(
            per_fd,
            offs,
            sizes,
            checks,
            codec=None,
            verify=True,
            dst=slots[: 79 * 40 + 16],
            raw_size=16,
            scratch=np.empty(1, np.uint8),
            dst_stride=40,
        )
        got = slots.reshape(80, 40)
        assert (
            np.array_equal(got[:, :16], buf.reshape(-1, row_size)[:, :16])
            and (got[:-1, 16:] == 0xAB).all()
        )
        with pytest.raises(FormatError, match="destination"):  # the last slot must fit
            kernels.load_chunks(
                per_fd,
                offs,
                sizes,
                checks,
                codec=None,
                verify=True,
                dst=slots[: 79 * 40 + 15],
                raw_size=16,
                scratch=np.empty(1, np.uint8),
                dst_stride=40,
            )
        with pytest.raises(ValueError, match="fds"):
            kernels.load_chunks(
                per_fd[:3],
                offs,
                sizes,
                checks,
                codec=None,
                verify=True,
                dst=slots,
                raw_size=16,
                scratch=np.empty(1, np.uint8),
                dst_stride=40,
            )
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("raw_size", [513, 4096, 100_000])
def test_load_chunks_reads_memcpyd_chunks_into_place(tmp_path, raw_size):
    """Memcpy'd chunks (clevel 0), read straight into their slots, beside compressed ones and
    an all-zero one: the same bytes; a flipped byte anywhere in a frame (headers, raw bytes,
    trailer) is a checksum error with verify, and a bad header is refused without it."""
    codec = (CODECS["zstd"], SHUFFLES["byte"])
    raws = [
        RNG.integers(0, 256, raw_size, dtype=np.uint8).tobytes(),
        RNG.integers(0, 4, raw_size, dtype=np.uint8).tobytes(),
        bytes(raw_size),
        RNG.integers(0, 256, raw_size, dtype=np.uint8).tobytes(),
    ]
    stored = [
        frame(raws[0], "zstd", clevel=0).tobytes(),
        frame(raws[1], "zstd").tobytes(),
        frame(raws[2], "zstd").tobytes(),
        frame(raws[3], "zstd", clevel=0).tobytes(),
    ]
    path = str(tmp_path / "c.bin")
    offs = write_chunks(path, stored)
    sizes = np.array([len(s) for s in stored], np.int64)
    checks = np.array([kernels.crc32(s) for s in stored], np.uint64)
    stride = raw_size + 7
    dst = np.zeros(3 * stride + raw_size, np.uint8)
    scratch = np.empty(int(sizes.max()), np.uint8)

    def load(path=path, verify=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            kernels.load_chunks(
                fd,
                offs,
                sizes,
                checks,
                codec=codec,
                verify=verify,
                dst=dst,
                raw_size=raw_size,
                scratch=scratch,
                dst_stride=stride,
            )
        finally:
            os.close(fd)

    load()
    for i, r in enumerate(raws):
        assert dst[i * stride : i * stride + raw_size].tobytes() == r
    assert not dst[raw_size:stride].any()  # the gaps between slots untouched
    data = open(path, "rb").read()
    h = int.from_bytes(stored[3][11:15], "big")
    for at in (5, h + 2, h + 40, len(stored[3]) - 3):  # frame header, chunk, raw, trailer
        bad = bytearray(data)
        bad[int(offs[3]) + at] ^= 0x10
        bad_path = str(tmp_path / f"bad{at}.bin")
        open(bad_path, "wb").write(bytes(bad))
        with pytest.raises(ChecksumError) as ei:
            load(bad_path)
        assert ei.value.index == 3
    bad = bytearray(data)  # nbytes of the memcpy'd chunk: refused without checksums too
    bad[int(offs[3]) + h + 4] ^= 0x01
    bad_path = str(tmp_path / "bad_nbytes.bin")
    open(bad_path, "wb").write(bytes(bad))
    with pytest.raises(FormatError):
        load(bad_path, verify=False)


def test_fill_runs_is_repeat_plus_arange():
    rng = np.random.default_rng(5)
    for m in (0, 1, 7, 300):
        counts = rng.integers(0, 40, m)
        counts[::5] = 0  # empty runs
        starts = rng.integers(-1000, 1 << 40, m)
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        want = np.repeat(starts - first, counts) + np.arange(int(counts.sum()))
        got = kernels.fill_runs(starts, counts)
        assert got.dtype == np.int64 and np.array_equal(got, want)


def test_fill_runs_refuses_bad_counts():
    from rowstore import _shuffle

    out = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="negative"):
        _shuffle.fill_runs(np.zeros(2, np.int64), np.array([1, -1], np.int64), out)
    with pytest.raises(ValueError, match="do not fit"):
        _shuffle.fill_runs(np.zeros(2, np.int64), np.array([3, 2], np.int64), out)
    with pytest.raises(ValueError, match="differ in length"):
        _shuffle.fill_runs(np.zeros(2, np.int64), np.zeros(3, np.int64), out)
    assert _shuffle.fill_runs(np.array([9], np.int64), np.array([4], np.int64), out) == 4
    assert out.tolist() == [9, 10, 11, 12]
