"""Compressed chunks loaded Blosc2 block by Blosc2 block (``_frame._load_blocks``).

``kernels.load_chunks`` reads a compressed frame one Blosc2 block at a time, each block handed
to c-blosc2 as a chunk of its own, and falls back to the frame read whole for anything it does
not expect. These tests hold it to the in-memory twin ``kernels.decode_chunks`` (which always
decompresses the frame whole): the same bytes for every codec, shuffle, element size and a
chunk whose last block is short, and the same error (code and chunk) for a damaged frame.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from rowstore import kernels
from rowstore.codecs.blocks import BLOSC2_CODECS, BLOSC2_SHUFFLES

RNG = np.random.default_rng(38)


def smooth(nbytes: int, typesize: int) -> bytes:
    """Compressible, not trivially: a slow wave plus noise in the low bits."""
    n = nbytes // typesize
    t = np.arange(n, dtype=np.float64)
    base = 1000 + 200 * np.sin(t / 3000.0) + RNG.normal(0, 0.5, n)
    if typesize == 1:
        out = (base % 7 + RNG.integers(0, 3, n)).astype(np.uint8)
    elif typesize == 4:
        out = base.astype(np.float32)
    else:
        out = base.astype(np.float64)
    raw = out.tobytes()
    return raw + bytes(nbytes - len(raw))


def frame(raw: bytes, cname: str, shuffle: str, typesize: int) -> bytes:
    return kernels.compress_frame(
        raw,
        compcode=BLOSC2_CODECS[cname],
        clevel=5,
        shuffle=BLOSC2_SHUFFLES[shuffle],
        typesize=typesize,
    ).tobytes()


def blocks_of(fr: bytes) -> tuple[int, int, int, list[int]]:
    """(frame header length, chunk cbytes, blocksize, bstarts) of a frame."""
    h = int.from_bytes(fr[11:15], "big")
    nbytes = int.from_bytes(fr[h + 4 : h + 8], "little")
    blocksize = int.from_bytes(fr[h + 8 : h + 12], "little")
    cbytes = int.from_bytes(fr[h + 12 : h + 16], "little")
    nblocks = -(-nbytes // blocksize)
    at = [h + 32 + 4 * j for j in range(nblocks)]
    bstarts = [int.from_bytes(fr[a : a + 4], "little") for a in at]
    return h, cbytes, blocksize, bstarts


def load(tmp_path, frames, raw_size, codec, *, verify=True, checks=None):
    """load_chunks over ``frames`` written to a file, and decode_chunks over them in memory:
    (bytes or the KernelError's (code, index), same for decode_chunks)."""
    path = str(tmp_path / "chunks.bin")
    offs, pos = [], 4096
    with open(path, "wb") as f:
        f.write(b"\xab" * pos)
        for fr in frames:
            offs.append(pos)
            f.write(fr)
            pos += len(fr)
    offs_a = np.array(offs, np.int64)
    sizes = np.array([len(fr) for fr in frames], np.int64)
    if checks is None:
        checks = np.array([kernels.crc32(fr) for fr in frames], np.uint64)
    outcomes = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for how in ("file", "memory"):
            dst = np.zeros(len(frames) * raw_size, np.uint8)
            try:
                if how == "file":
                    kernels.load_chunks(
                        fd,
                        offs_a,
                        sizes,
                        checks,
                        codec=codec,
                        verify=verify,
                        dst=dst,
                        raw_size=raw_size,
                        scratch=np.empty(int(sizes.max()), np.uint8),
                    )
                else:
                    src = np.frombuffer(b"".join(frames), np.uint8)
                    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
                    kernels.decode_chunks(
                        src,
                        starts,
                        sizes,
                        checks,
                        codec=codec,
                        verify=verify,
                        dst=dst,
                        raw_size=raw_size,
                    )
                outcomes.append(dst.tobytes())
            except kernels.KernelError as exc:
                outcomes.append((int(exc.code), exc.index))
    finally:
        os.close(fd)
    return outcomes


@pytest.mark.parametrize("cname", ["lz4", "zstd", "blosclz", "lz4hc", "zlib"])
@pytest.mark.parametrize("shuffle", ["byte", "none", "bit"])
@pytest.mark.parametrize("typesize", [1, 4, 8])
def test_blockwise_load_matches_the_raw_bytes(tmp_path, cname, shuffle, typesize):
    # 1 MiB + 1,000 bytes: several Blosc2 blocks and a short last one (not split).
    raw_size = (1 << 20) + 1000
    raws = [smooth(raw_size, typesize) for _ in range(3)]
    frames = [frame(r, cname, shuffle, typesize) for r in raws]
    h, cbytes, blocksize, bstarts = blocks_of(frames[0])
    assert len(bstarts) >= 2 or cname in ("zstd", "zlib")  # the path under test runs
    codec = (BLOSC2_CODECS[cname], BLOSC2_SHUFFLES[shuffle])
    for verify in (True, False):
        got_file, got_mem = load(tmp_path, frames, raw_size, codec, verify=verify)
        assert got_file == b"".join(raws)
        assert got_mem == got_file


@pytest.mark.parametrize("raw_size", [3 * 262144, 700_001, 2 * 1024 * 1024 + 3])
def test_blockwise_load_block_multiples_and_leftovers(tmp_path, raw_size):
    raws = [smooth(raw_size, 4) for _ in range(2)]
    frames = [frame(r, "lz4", "byte", 4) for r in raws]
    got_file, got_mem = load(tmp_path, frames, raw_size, (1, 1))
    assert got_file == b"".join(raws) == got_mem


def test_blocks_out_of_order_fall_back_to_the_whole_frame(tmp_path):
    """A chunk whose blocks are not stored in order (valid Blosc2: bstarts say where each
    is) is read whole and decompressed as before."""
    raw_size = 1 << 20
    raw = smooth(raw_size, 4)
    fr = bytearray(frame(raw, "lz4", "byte", 4))
    h, cbytes, blocksize, bstarts = blocks_of(bytes(fr))
    assert len(bstarts) >= 2
    ends = bstarts[1:] + [cbytes]
    parts = [bytes(fr[h + s : h + e]) for s, e in zip(bstarts, ends)]
    order = [1, 0] + list(range(2, len(parts)))
    pos, new_starts = bstarts[0], [0] * len(parts)
    body = b""
    for j in order:
        new_starts[j] = pos
        body += parts[j]
        pos += len(parts[j])
    fr[h + bstarts[0] : h + cbytes] = body
    for j, s in enumerate(new_starts):
        fr[h + 32 + 4 * j : h + 36 + 4 * j] = s.to_bytes(4, "little")
    got_file, got_mem = load(tmp_path, [bytes(fr)], raw_size, (1, 1))
    assert got_file == raw == got_mem


def test_damaged_frames_give_the_errors_of_the_whole_frame_path(tmp_path):
    """Any byte of a frame flipped (header, bstarts, blocks, trailer): load_chunks reports
    what decode_chunks (the frame read whole) reports, with and without the CRC check."""
    raw_size = (1 << 20) + 1000
    raws = [smooth(raw_size, 4) for _ in range(2)]
    frames = [frame(r, "lz4", "byte", 4) for r in raws]
    h, cbytes, blocksize, bstarts = blocks_of(frames[1])
    spots = {0, 11, 20, h, h + 3, h + 8, h + 13, h + 32, h + 36, h + bstarts[0]}
    spots |= {h + s + 5 for s in bstarts} | {h + cbytes - 1, len(frames[1]) - 1}
    spots |= set(RNG.integers(0, len(frames[1]), 12).tolist())
    checks = np.array([kernels.crc32(fr) for fr in frames], np.uint64)
    for spot in sorted(spots):
        bad = bytearray(frames[1])
        bad[spot] ^= 0x5A
        for verify in (True, False):
            got_file, got_mem = load(
                tmp_path, [frames[0], bytes(bad)], raw_size, (1, 1), verify=verify, checks=checks
            )
            assert got_file == got_mem, (spot, verify)
            if verify:
                assert got_file == (int(kernels.KernelCode.E_CHECKSUM), 1), spot


def test_truncated_file_is_short(tmp_path):
    raw_size = 1 << 20
    fr = frame(smooth(raw_size, 4), "lz4", "byte", 4)
    path = str(tmp_path / "t.bin")
    with open(path, "wb") as f:
        f.write(fr[: len(fr) // 2])
    fd = os.open(path, os.O_RDONLY)
    try:
        for verify in (True, False):
            with pytest.raises(kernels.KernelError) as ei:
                kernels.load_chunks(
                    fd,
                    np.array([0], np.int64),
                    np.array([len(fr)], np.int64),
                    np.array([kernels.crc32(fr)], np.uint64),
                    codec=(1, 1),
                    verify=verify,
                    dst=np.empty(raw_size, np.uint8),
                    raw_size=raw_size,
                    scratch=np.empty(len(fr), np.uint8),
                )
            assert ei.value.code == kernels.KernelCode.E_SHORT
    finally:
        os.close(fd)
