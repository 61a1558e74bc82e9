"""The page index of format v3: direct reads check the pages they touch, nothing more, and a
flipped byte is still never served (rows of a page or more are checked in the preadv pass that
reads them; smaller rows and heap payloads by reading their pages first)."""

from __future__ import annotations

import os
import shutil
import zlib

import numpy as np
import pytest

import rowstore
from rowstore import ChecksumError, Field, Layout, Schema, kernels

#: Rows of 4.4 KB: each row its own page (checked in the read's pass).
BIG = Schema([Field("id", "int64"), Field("x", "float32", (1100,)), Field("y", "float32", (8,))])
#: Rows of 108 bytes: 37 rows per page, 4 pages per block of 128 rows.
SMALL = Schema([Field("id", "int64"), Field("x", "float32", (25,))])


def _write(path, schema, n=400, rows_per_block=32):
    width = schema["x"].shape[0]
    with rowstore.Writer(path, schema, rows_per_block=rows_per_block) as w:
        batch = {
            "id": np.arange(n),
            "x": np.arange(n, dtype=np.float32)[:, None] * np.ones(width, np.float32),
        }
        if "y" in schema.names:
            batch["y"] = np.ones((n, 8), np.float32)
        w.write_batch(batch)
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return _write(str(tmp_path_factory.mktemp("pages") / "big.h5"), BIG)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _write(
        str(tmp_path_factory.mktemp("pages") / "small.h5"), SMALL, n=1000, rows_per_block=128
    )


@pytest.fixture(scope="module")
def lone(tmp_path_factory):
    """Small rows, one per block: each page holds one row (checked in the read's pass)."""
    return _write(str(tmp_path_factory.mktemp("pages") / "lone.h5"), SMALL, n=300, rows_per_block=1)


def _flip(src, dst, row, field="x"):
    shutil.copyfile(src, dst)
    L = Layout.open(src)
    rpb = L.rows_per_block
    off = (
        int(L.blocks["offset"][row // rpb])
        + (row % rpb) * L.row_dtype.itemsize
        + L.row_dtype.fields[field][1]
        + 3
    )
    with open(dst, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x04]))
    return dst


def test_page_geometry_of_the_files(big, small):
    Lb, Ls = Layout.open(big), Layout.open(small)
    assert Lb.version == Ls.version == 3 and Lb.page_bytes == Ls.page_bytes == 4096
    assert Lb.page_geometry("block") == (Lb.row_dtype.itemsize, 32)  # one row per page
    rs = Ls.row_dtype.itemsize
    assert Ls.page_geometry("block") == (4096 // rs * rs, -(-128 // (4096 // rs)))
    assert len(Ls.block_pages) == Ls.num_blocks * Ls.page_geometry("block")[1]


@pytest.mark.parametrize("how", ["take", "getitem", "full", "block", "take_many", "pieces"])
@pytest.mark.parametrize("which", ["big", "small", "lone"])
def test_a_flipped_byte_is_never_served(big, small, lone, tmp_path, which, how):
    src, n = {"big": (big, 400), "small": (small, 1000), "lone": (lone, 300)}[which]
    bad = _flip(src, str(tmp_path / "bad.h5"), 100)
    with rowstore.open(bad) as r, pytest.raises(ChecksumError) as ei:
        if how == "take":
            r.take([100], fields=["x"])
        elif how == "getitem":
            r[100]
        elif how == "take_many":
            r.take(
                np.random.default_rng(0).permutation(n)[:40].tolist() + [100], fields=["id", "x"]
            )
        elif how == "pieces":
            for _ in r.batches(16, shuffle="block", pieces=4, seed=1, fields=["id", "x"]):
                pass
        else:
            for _ in r.batches(16, shuffle=how, seed=1, fields=["id", "x"]):
                pass
    assert ei.value.path == bad


@pytest.mark.parametrize("which", ["big", "small"])
def test_a_read_checks_only_the_pages_it_touches(big, small, tmp_path, which):
    """A flipped byte in another page of the same block does not fail a read of this row
    (with whole-chunk checks it did); reading that page then fails."""
    src = big if which == "big" else small
    L = Layout.open(src)
    row, other = 10, 10 + max(1, 4096 // L.row_dtype.itemsize)  # the next page of block 0
    assert other < L.rows_per_block
    bad = _flip(src, str(tmp_path / "bad.h5"), other)
    with rowstore.open(bad) as r:
        got = r.take([row], fields=["id", "x"])
        assert got["id"].tolist() == [row] and (got["x"] == row).all()
        with pytest.raises(ChecksumError):
            r.take([other], fields=["x"])


def test_a_clean_file_reads_the_same_over_epochs(big, small, lone):
    for src, n in ((big, 400), (small, 1000), (lone, 300)):
        with rowstore.open(src) as r:
            for epoch in range(2):  # the first epoch checks pages, the second reads them directly
                for shuffle in ("full", "block"):
                    ids = []
                    for b in r.batches(
                        25, shuffle=shuffle, seed=4, epoch=epoch, fields=["id", "x"]
                    ):
                        assert (b["x"][:, 0] == b["id"]).all() and (b["x"][:, -1] == b["id"]).all()
                        ids.extend(b["id"].tolist())
                    assert sorted(ids) == list(range(n))


def test_a_dataset_of_files_checks_pages_too(big, tmp_path):
    bad = _flip(big, str(tmp_path / "bad.h5"), 300)
    with rowstore.open([big, bad]) as r:
        assert r.layout.page_index() is not None
        assert r.take([300], fields=["id"])["id"].tolist() == [300]  # the clean file's row 300
        with pytest.raises(ChecksumError) as ei:
            r.take([400 + 300], fields=["x"])
        assert ei.value.path == os.path.abspath(bad)


def test_an_edited_page_crc_is_refused(big, tmp_path):
    """A footer whose page index was changed (and its CRCs recomputed) reads as a checksum
    error on the page, never as the other bytes."""
    from test_footer import _encode, _header

    L = Layout.open(big)
    pages = L.block_pages.copy()
    pages[7] ^= 1
    dst = str(tmp_path / "edited.h5")
    shutil.copyfile(big, dst)
    data = _encode(
        _header(big), L.blocks, L.heap_chunks, L.footer_offset, pages=(pages, L.heap_pages)
    )
    with open(dst, "r+b") as f:
        f.truncate(L.footer_offset)
        f.seek(L.footer_offset)
        f.write(data)
    with rowstore.open(dst) as r:
        assert r.take([6], fields=["id"])["id"].tolist() == [6]
        with pytest.raises(ChecksumError):
            r.take([7], fields=["id"])


def test_append_keeps_the_page_index(big, tmp_path):
    path = str(tmp_path / "a.h5")
    shutil.copyfile(big, path)
    with rowstore.Writer(path, mode="a") as w:
        w.write_batch(
            {
                "id": np.arange(400, 410),
                "x": np.full((10, 1100), 7, np.float32),
                "y": np.ones((10, 8), np.float32),
            }
        )
    L = Layout.open(path)
    assert L.version == 3 and L.num_rows == 410
    raw = open(path, "rb").read()
    rs = L.row_dtype.itemsize
    want = [
        zlib.crc32(raw[int(b["offset"]) + j * rs : int(b["offset"]) + (j + 1) * rs])
        for b in L.blocks
        for j in range(L.rows_per_block)
    ]
    assert L.block_pages.tolist() == want
    with rowstore.open(path) as r:
        assert r.take([405], fields=["id"])["id"].tolist() == [405]


def _raw_chunks(path: str, what: str) -> list[bytes]:
    """Each block's (``"block"``) or heap chunk's raw bytes, decoded by h5py (hdf5plugin); the
    last one zero-filled to a whole chunk, as it is written."""
    import h5py
    import hdf5plugin  # noqa: F401

    with h5py.File(path, "r") as f:
        ds = f["rowstore"]["rows" if what == "block" else "heap"]
        data = ds[()].tobytes()
        size = ds.chunks[0] * ds.dtype.itemsize
    data += bytes(-len(data) % size)
    return [data[a : a + size] for a in range(0, len(data), size)]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_files_have_pages_of_their_raw_bytes(tmp_path, compression):
    """A compressed file is v3 too: its page CRCs are of each chunk's raw (decompressed) bytes,
    which a memcpy'd heap chunk stores as they are."""
    p = str(tmp_path / "c.h5")
    schema = Schema([Field("id", "int64"), Field("w", "float32", (None,))])
    rng = np.random.default_rng(0)
    with rowstore.Writer(
        p, schema, compression=compression, rows_per_block=8, heap_chunk_bytes=1 << 14
    ) as w:
        for i in range(40):
            w.write({"id": i, "w": rng.standard_normal(300 + 50 * i).astype(np.float32)})
    L = Layout.open(p)
    assert L.version == 3 and L.page_bytes == 4096
    for what, pages in (("block", L.block_pages), ("heap chunk", L.heap_pages)):
        plen, per = L.page_geometry(what)
        raws = _raw_chunks(p, what)
        want = [zlib.crc32(r[j * plen : (j + 1) * plen]) for r in raws for j in range(per)]
        assert pages.tolist() == want, what


def test_append_to_a_compressed_file_keeps_its_pages(tmp_path):
    p = str(tmp_path / "c.h5")
    schema = Schema([Field("id", "int64"), Field("w", "float32", (None,))])
    rng = np.random.default_rng(1)
    vals = [rng.standard_normal(200 + 40 * i).astype(np.float32) for i in range(60)]
    with rowstore.Writer(
        p, schema, compression="lz4", rows_per_block=8, heap_chunk_bytes=1 << 14
    ) as w:
        for i in range(45):
            w.write({"id": i, "w": vals[i]})
    before = Layout.open(p)
    with rowstore.Writer(p, mode="a") as w:
        for i in range(45, 60):
            w.write({"id": i, "w": vals[i]})
    L = Layout.open(p)
    assert L.version == 3 and L.num_rows == 60 and len(L.heap_pages) > len(before.heap_pages)
    fresh = str(tmp_path / "fresh.h5")
    with rowstore.Writer(
        fresh, schema, compression="lz4", rows_per_block=8, heap_chunk_bytes=1 << 14
    ) as w:
        for i in range(60):
            w.write({"id": i, "w": vals[i]})
    F = Layout.open(fresh)
    assert L.heap_pages.tolist() == F.heap_pages.tolist()
    assert L.block_pages.tolist() == F.block_pages.tolist()
    with rowstore.open(p) as r:
        got = r.take(list(range(60)), fields=["w"])["w"]
        assert all(np.array_equal(np.asarray(g), v) for g, v in zip(got, vals))


# -- the kernels against a zlib reference ----------------------------------------------------
def test_page_crcs_and_check_buffer_match_zlib():
    rng = np.random.default_rng(3)
    for n, plen in ((0, 7), (1, 1), (10_000, 4096), (8192, 4096), (999, 100)):
        a = rng.integers(0, 256, n, dtype=np.uint8)
        want = [zlib.crc32(a[i : i + plen].tobytes()) for i in range(0, n, plen)]
        assert kernels.page_crcs(a, plen).tolist() == want
        starts = np.arange(0, n, plen)
        sizes = np.minimum(plen, n - starts)
        kernels.check_buffer(a, starts, sizes, np.array(want, np.uint32))
        if want:
            bad = np.array(want, np.uint32)
            k = int(rng.integers(len(bad)))
            bad[k] ^= 1
            with pytest.raises(kernels.KernelChecksumError) as ei:
                kernels.check_buffer(a, starts, sizes, bad)
            assert ei.value.index == k
    with pytest.raises(kernels.KernelError):
        kernels.check_buffer(
            np.zeros(4, np.uint8), np.array([2]), np.array([3]), np.zeros(1, np.uint32)
        )


def test_check_ranges_and_checked_preadv_match_zlib(tmp_path):
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, 50_000, dtype=np.uint8)
    p = tmp_path / "f.bin"
    p.write_bytes(data.tobytes())
    fd = os.open(p, os.O_RDONLY)
    try:
        # Runs of pages: each range split into pages of 1000 bytes, the last one the rest.
        offs, sizes = np.array([0, 7_000, 20_123]), np.array([2_500, 1_000, 4_100])
        want = [
            zlib.crc32(data[o + a : o + min(a + 1000, s)].tobytes())
            for o, s in zip(offs, sizes)
            for a in range(0, s, 1000)
        ]
        kernels.check_ranges(
            fd, offs, sizes, 1000, np.array(want, np.uint32), np.empty(5000, np.uint8)
        )
        bad = np.array(want, np.uint32)
        bad[4] ^= 8
        with pytest.raises(kernels.KernelChecksumError) as ei:
            kernels.check_ranges(fd, offs, sizes, 1000, bad, np.empty(5000, np.uint8))
        assert ei.value.index == 4
        # Rows of 300 bytes cut into 3 segments (one to the sink), rows 0, 2 checked.
        rows = np.array([0, 1_200, 40_000, 300], np.int64)
        segs_out = [np.empty((4, 100), np.uint8), np.empty((4, 50), np.uint8)]
        segments = [(100, segs_out[0]), (150, None), (50, segs_out[1])]
        crc = np.array([zlib.crc32(data[r : r + 300].tobytes()) for r in rows], np.uint32)
        check = np.array([1, 0, 1, 1], bool)
        kernels.preadv_rows(
            fd, rows, 300, segments, np.empty(300, np.uint8), check=check, expect=crc
        )
        assert (segs_out[0] == np.stack([data[r : r + 100] for r in rows])).all()
        assert (segs_out[1] == np.stack([data[r + 250 : r + 300] for r in rows])).all()
        crc[1] ^= 1  # an unchecked row: not compared
        kernels.preadv_rows(
            fd, rows, 300, segments, np.empty(300, np.uint8), check=check, expect=crc
        )
        crc[3] ^= 1
        with pytest.raises(kernels.KernelChecksumError) as ei:
            kernels.preadv_rows(
                fd, rows, 300, segments, np.empty(300, np.uint8), check=check, expect=crc
            )
        assert ei.value.index == 3
    finally:
        os.close(fd)


# -- heap payloads ---------------------------------------------------------------------------
WAVE = Schema([Field("id", "int64"), Field("wave", "float32", (None,))])


@pytest.fixture(scope="module")
def heapfile(tmp_path_factory):
    """Payloads of 0.4-12 KB over heap chunks of 32 KiB (pages of 4 KiB): payloads straddle
    pages and chunks."""
    path = str(tmp_path_factory.mktemp("pages") / "heap.h5")
    with rowstore.Writer(path, WAVE, rows_per_block=16, heap_chunk_bytes=1 << 15) as w:
        for i in range(300):
            w.write({"id": i, "wave": np.full(100 + (i * 37) % 3000, i, np.float32)})
    return path


def test_heap_payloads_check_their_pages_only(heapfile, tmp_path):
    """A flipped byte in row 10's heap chunk, on a page row 10's payload does not touch: row 10
    still reads (whole-chunk checks refused it); the row whose payload holds the byte fails."""
    import h5py

    L = Layout.open(heapfile)
    H = L.heap_chunk_bytes
    with h5py.File(heapfile, "r") as f:
        refs = f["rowstore/rows"]["wave"][()]
    start, nb = int(refs["offset"][10]), int(refs["nbytes"][10])
    x = ((start + nb - 1) // 4096 + 2) * 4096 + 5  # two pages past row 10's last page
    assert x // H == start // H  # the same heap chunk
    hit = int(np.flatnonzero((refs["offset"] <= x) & (refs["offset"] + refs["nbytes"] > x))[0])
    bad = str(tmp_path / "bad.h5")
    shutil.copyfile(heapfile, bad)
    with open(bad, "r+b") as f:
        at = int(L.heap_chunks["offset"][x // H]) + x % H
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))
    with rowstore.open(bad) as r:
        assert r.take([10], fields=["wave"])["wave"][0].shape == (100 + 370,)
        for how in ("take", "full"):
            with pytest.raises(ChecksumError):
                if how == "take":
                    r.take([hit], fields=["wave"])
                else:
                    for _ in r.batches(8, shuffle="full", fields=["wave"]):
                        pass
    # Every epoch of the clean file reads every payload back (pages checked, then not).
    with rowstore.open(heapfile) as r:
        for epoch in range(2):
            seen = 0
            for b in r.batches(16, shuffle="full", epoch=epoch, fields=["id", "wave"]):
                for i, w in zip(b["id"].tolist(), b["wave"]):
                    assert len(w) == 100 + (i * 37) % 3000 and (np.asarray(w) == i).all()
                    seen += 1
            assert seen == 300


def test_checked_pread_heap_matches_plain_reads(heapfile):
    """The kernel with pages against itself without (same bytes) and a flag per page set."""
    L = Layout.open(heapfile)
    rows = np.zeros(300, dtype=L.row_dtype)
    import h5py

    with h5py.File(heapfile, "r") as f:
        rows[:] = f["rowstore/rows"][()]
    src = rows.view(np.uint8)
    rs, ref = L.row_dtype.itemsize, L.row_dtype.fields["wave"][1]
    idx = np.random.default_rng(1).permutation(300)[:60].astype(np.int64)
    nb = rows["wave"]["nbytes"][idx].astype(np.int64)
    dst = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(nb, out=dst[1:])
    lo = np.zeros(len(idx), np.int64)
    hi = np.full(len(idx), L.heap_nbytes, np.int64)
    offs = np.ascontiguousarray(L.heap_chunks["offset"], np.int64)
    fd = os.open(heapfile, os.O_RDONLY)
    try:
        plain = np.empty(int(dst[-1]), np.uint8)
        kernels.pread_heap(
            fd, src, rs, [ref], idx, lo, hi, offs, L.heap_chunk_bytes, [plain], [dst]
        )
        with pytest.raises(ValueError):  # the scratch holds a head and a tail page
            kernels.pread_heap(
                fd,
                src,
                rs,
                [ref],
                idx,
                lo,
                hi,
                offs,
                L.heap_chunk_bytes,
                [np.empty_like(plain)],
                [dst],
                pages=(
                    4096,
                    L.heap_pages,
                    np.zeros(len(L.heap_pages), bool),
                    np.empty(4096, np.uint8),
                ),
            )
        for scratch in (2 * 4096, 3 * 4096, 1 << 20):
            checked = np.zeros(len(L.heap_pages), bool)
            got = np.empty_like(plain)
            kernels.pread_heap(
                fd,
                src,
                rs,
                [ref],
                idx,
                lo,
                hi,
                offs,
                L.heap_chunk_bytes,
                [got],
                [dst],
                pages=(4096, L.heap_pages, checked, np.empty(scratch, np.uint8)),
            )
            assert np.array_equal(got, plain) and checked.any()
            # Every page a payload touches is flagged, and only those.
            want = np.zeros_like(checked)
            H = L.heap_chunk_bytes
            for o, n in zip(rows["wave"]["offset"][idx].astype(np.int64), nb):
                for x in range(o, o + n):
                    want[(x // H) * (H // 4096) + (x % H) // 4096] = True
            assert np.array_equal(checked, want)
        bad = L.heap_pages.copy()
        bad[int(np.flatnonzero(want)[0])] ^= 1
        with pytest.raises(kernels.KernelChecksumError):
            kernels.pread_heap(
                fd,
                src,
                rs,
                [ref],
                idx,
                lo,
                hi,
                offs,
                L.heap_chunk_bytes,
                [np.empty_like(plain)],
                [dst],
                pages=(4096, bad, np.zeros(len(bad), bool), np.empty(8192, np.uint8)),
            )
    finally:
        os.close(fd)


def test_crc_shift_table_combines_crcs():
    """The table that moves a CRC past n bytes: crc32(a + b) from crc32(a) and crc32(b)."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 3, 4096, 10_000):
        t = kernels.crc_shift_table(n)
        for _ in range(50):
            a = rng.integers(0, 256, int(rng.integers(0, 9000)), np.uint8).tobytes()
            b = rng.integers(0, 256, n, np.uint8).tobytes()
            c = zlib.crc32(a)
            moved = int(t[c & 255] ^ t[256 + (c >> 8 & 255)] ^ t[512 + (c >> 16 & 255)])
            moved ^= int(t[768 + (c >> 24)])
            assert moved ^ zlib.crc32(b) == zlib.crc32(a + b)


@pytest.mark.parametrize("chunk", [1 << 15, 10_000])
def test_checked_pread_heap_names_the_page_it_refuses(tmp_path, chunk):
    """Runs of pages are checked in one pass against their CRCs combined: a wrong CRC anywhere
    (a whole page, a head or tail page shared with a neighbour, a chunk's shorter last page)
    is refused by every read touching it, naming that page; edge pages flagged already are not
    read or checked again (a wrong CRC there goes unnoticed, by design: it was checked)."""
    import h5py

    path = str(tmp_path / "heap.h5")
    with rowstore.Writer(path, WAVE, rows_per_block=16, heap_chunk_bytes=chunk) as w:
        for i in range(120):
            w.write({"id": i, "wave": np.full(100 + (i * 37) % 3000, i, np.float32)})
    L = Layout.open(path)
    with h5py.File(path, "r") as f:
        rows = f["rowstore/rows"][()]
    src = rows.view(np.uint8)
    rs, ref = L.row_dtype.itemsize, L.row_dtype.fields["wave"][1]
    offs = np.ascontiguousarray(L.heap_chunks["offset"], np.int64)
    per = -(-chunk // 4096)
    assert len(L.heap_pages) == per * len(offs)
    starts = rows["wave"]["offset"].astype(np.int64)
    ends = starts + rows["wave"]["nbytes"].astype(np.int64)

    def page_of(x):
        return (x // chunk) * per + (x % chunk) // 4096

    def read(idx, crcs, checked):
        idx = np.asarray(idx, np.int64)
        dst = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(ends[idx] - starts[idx], out=dst[1:])
        out = np.empty(int(dst[-1]), np.uint8)
        kernels.pread_heap(
            fd,
            src,
            rs,
            [ref],
            idx,
            np.zeros(len(idx), np.int64),
            np.full(len(idx), L.heap_nbytes, np.int64),
            offs,
            chunk,
            [out],
            [dst],
            pages=(4096, crcs, checked, np.empty(8192, np.uint8)),
        )
        return out

    fd = os.open(path, os.O_RDONLY)
    try:
        for p in range(0, len(L.heap_pages), 3):
            touching = [i for i in range(120) if page_of(starts[i]) <= p <= page_of(ends[i] - 1)]
            bad = L.heap_pages.copy()
            bad[p] ^= 1 << 7
            for i in touching:
                with pytest.raises(kernels.KernelChecksumError) as exc:
                    read([i], bad, np.zeros(len(bad), bool))
                assert exc.value.detail == p
        # Edge pages checked already are skipped: flag a payload's first and last pages and
        # give them wrong CRCs; the payload reads (and its other pages are flagged).
        i = next(i for i in range(120) if page_of(ends[i] - 1) - page_of(starts[i]) >= 2)
        first, last = page_of(starts[i]), page_of(ends[i] - 1)
        bad = L.heap_pages.copy()
        bad[[first, last]] ^= 1
        checked = np.zeros(len(bad), bool)
        checked[[first, last]] = True
        got = read([i], bad, checked)
        assert (got.view(np.float32) == i).all()
        assert checked[first : last + 1].all() and checked.sum() == last - first + 1
        # Only the last page flagged: the first page is read and checked, and a page between.
        bad = L.heap_pages.copy()
        bad[[first + 1, last]] ^= 1
        checked = np.zeros(len(bad), bool)
        checked[last] = True
        with pytest.raises(kernels.KernelChecksumError) as exc:
            read([i], bad, checked)
        assert exc.value.detail == first + 1
    finally:
        os.close(fd)


def test_pread_pages_reads_ranges_of_blocks_checked(small):
    """Ranges of blocks (pieces) read with their pages checked in the pass: the bytes of a
    plain read, the touched pages flagged (only those), a wrong CRC refused naming its page,
    and ranges outside their chunk, the page index or the destination refused."""
    L = Layout.open(small)
    rs = L.row_dtype.itemsize
    plen, per = L.page_geometry("block")
    raw = L.block_raw_bytes
    offs = np.ascontiguousarray(L.blocks["offset"], np.int64)
    blk = np.array([0, 3, 3, 5], np.int64)
    within = np.array([5, 0, 70, 100], np.int64) * rs
    take = np.array([40, 1, 50, 28], np.int64) * rs
    first = blk * per
    dst = np.concatenate(([0], np.cumsum(take)[:-1])).astype(np.int64)
    scratch = np.empty(2 * plen, np.uint8)
    fd = os.open(small, os.O_RDONLY)
    try:
        plain = np.empty(int(take.sum()), np.uint8)
        for i in range(len(blk)):
            plain[dst[i] : dst[i] + take[i]] = np.frombuffer(
                os.pread(fd, int(take[i]), int(offs[blk[i]] + within[i])), np.uint8
            )

        def read(crcs, checked, **kw):
            a = dict(within=within, take=take, first=first, dst=dst, out=None)
            a.update(kw)
            out = np.empty(int(take.sum()), np.uint8) if a["out"] is None else a["out"]
            kernels.pread_pages(
                fd,
                offs[blk],
                np.full(len(blk), raw, np.int64),
                a["within"],
                a["take"],
                a["first"],
                (plen, crcs, checked, scratch),
                out,
                a["dst"],
            )
            return out

        checked = np.zeros(len(L.block_pages), bool)
        assert np.array_equal(read(L.block_pages, checked), plain)
        want = np.zeros_like(checked)
        for b, w, t in zip(blk, within, take):
            want[b * per + w // plen : b * per + (w + t - 1) // plen + 1] = True
        assert np.array_equal(checked, want)
        assert np.array_equal(read(L.block_pages, checked), plain)  # all flagged: plain reads
        bad = L.block_pages.copy()
        bad[3 * per + 1] ^= 1  # page 1 of block 3: range 2 (rows 70..119)
        with pytest.raises(kernels.KernelChecksumError) as exc:
            read(bad, np.zeros_like(checked))
        assert exc.value.index == 2 and exc.value.detail == 3 * per + 1
        for kw in (
            dict(within=within + np.array([0, 0, 0, raw], np.int64)),  # past the chunk
            dict(take=take + np.array([0, 0, 0, raw], np.int64)),
            dict(within=within - np.array([0, 0, 0, raw], np.int64)),
            dict(first=first + np.array([0, 0, 0, len(L.block_pages)], np.int64)),
            dict(first=first - np.array([0, 0, 0, 10**6], np.int64)),
            dict(dst=dst + np.array([0, 0, 0, 10**6], np.int64)),
            dict(out=np.empty(int(take.sum()) - 1, np.uint8)),
        ):
            with pytest.raises(kernels.KernelError):
                read(L.block_pages, np.zeros_like(checked), **kw)
    finally:
        os.close(fd)


def _dataset(path, schema, n=400, rows_per_block=32, shard_rows=100):
    width = schema["x"].shape[0]
    # no statistics: a test replaces a shard by another file of the same size, and their size
    # follows the values
    with rowstore.DatasetWriter(
        path, schema, rows_per_block=rows_per_block, shard_bytes=shard_rows * 4464, stats=False
    ) as w:  # rows of 4,464 bytes
        w.write_batch(
            {
                "id": np.arange(n),
                "x": np.arange(n, dtype=np.float32)[:, None] * np.ones(width, np.float32),
                "y": np.ones((n, 8), np.float32),
            }
        )
    return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return _dataset(str(tmp_path_factory.mktemp("pages") / "ds"), BIG)


def _copy_flip(src, dst, row):
    """A copy of the dataset directory ``src`` with one bit of dataset row ``row`` flipped in
    its shard; returns the copy and the shard's path."""
    shutil.copytree(src, dst)
    with rowstore.open(dst) as r:
        L = r.layout
        s = int(np.searchsorted(np.cumsum(L.shard_rows), row, side="right"))
        path = L.shard_paths[s]
        local = row - int(np.sum(L.shard_rows[:s]))
    tmp = path + ".orig"
    os.rename(path, tmp)
    _flip(tmp, path, local)
    os.remove(tmp)
    return dst, path


def test_a_dataset_directory_uses_its_shards_page_indexes(dataset):
    with rowstore.open(dataset) as r:
        L = r.layout
        assert L.num_shards >= 3 and L.shard_layouts is None  # opened from the manifest
        pi = L.page_index()
        assert pi is not None and len(pi.block_pages) == sum(
            Layout.open(p).block_pages.size for p in L.shard_paths
        )


@pytest.mark.parametrize("how", ["take", "getitem", "full", "block"])
def test_a_flipped_byte_in_a_dataset_shard_is_never_served(dataset, tmp_path, how):
    bad, shard = _copy_flip(dataset, str(tmp_path / "bad"), 250)
    with rowstore.open(bad) as r, pytest.raises(ChecksumError) as ei:
        if how == "take":
            r.take([250], fields=["x"])
        elif how == "getitem":
            r[250]
        else:
            for _ in r.batches(16, shuffle=how, seed=1, fields=["id", "x"]):
                pass
    assert ei.value.path == shard


def test_a_dataset_read_checks_only_the_pages_it_touches(dataset, tmp_path):
    bad, _ = _copy_flip(dataset, str(tmp_path / "bad"), 251)
    with rowstore.open(bad) as r:
        assert r.layout.page_index() is not None
        assert r.take([250], fields=["id", "x"])["id"].tolist() == [250]  # same block, another page
        with pytest.raises(ChecksumError):
            r.take([251], fields=["x"])


def test_a_replaced_shard_falls_back_to_whole_chunk_checks(dataset, tmp_path):
    """A shard replaced by another valid v3 file of the same size has its own page CRCs: they
    do not describe the manifest's chunks, so they are not used, and the manifest's chunk
    checksums refuse its rows."""
    bad = str(tmp_path / "bad")
    shutil.copytree(dataset, bad)
    with rowstore.open(bad) as r:
        path = r.layout.shard_paths[1]
    other = str(tmp_path / "other.h5")
    # (no statistics: their size follows the values, and this file must have the shard's size)
    with rowstore.Writer(other, BIG, rows_per_block=32, stats=False) as w:
        n = int(Layout.open(path).num_rows)
        w.write_batch(
            {
                "id": np.arange(n) + 7,
                "x": np.ones((n, 1100), np.float32),
                "y": np.ones((n, 8), np.float32),
            }
        )
    assert os.path.getsize(other) == os.path.getsize(path)
    os.replace(other, path)
    with rowstore.open(bad) as r:
        assert r.layout.page_index() is None
        assert r.take([10], fields=["id"])["id"].tolist() == [10]  # shard 0 is untouched
        with pytest.raises(ChecksumError):
            r.take([int(r.layout.shard_rows[0]) + 1], fields=["id"])
