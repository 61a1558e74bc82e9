"""Format v2: a single file ends with a rowstore-owned, checksummed footer (schema, attributes,
both indexes) that it is opened from without libhdf5. Damaged or edited footers are
refused, truncations and appended bytes give an error or the exact rows, appends keep a footer,
v1 files still read (and become v2 when appended to), remote opens read the footer in one GET."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib

import numpy as np
import pytest
from helpers import DATA

import rowstore
from rowstore import (
    ChecksumError,
    Field,
    FormatError,
    FormatVersionError,
    Layout,
    RowstoreError,
    Schema,
)
from rowstore.format import footer

h5py = pytest.importorskip("h5py")

SCHEMA = Schema([
    Field("id", "int64"), Field("x", "float32", (4,)), Field("s", "str", nullable=True),
    Field("v", "int16", (None, 2)),
])  # fmt: skip
N = 50


def _row(i):
    return {"id": i, "x": np.full(4, i, np.float32), "s": None if i % 4 == 0 else f"s{i}",
            "v": np.full((i % 3, 2), i, np.int16)}  # fmt: skip


def _write(path, n=N, start=0, mode="w", compression=None):
    with rowstore.Writer(
        path, SCHEMA, compression=compression, rows_per_block=8, heap_chunk_bytes=256, mode=mode
    ) as w:
        for i in range(start, start + n):
            w.write(_row(i))
    return path


@pytest.fixture(scope="module", params=[None, "lz4"])
def valid(tmp_path_factory, request):
    return _write(
        str(tmp_path_factory.mktemp("footer") / f"v-{request.param}.h5"), compression=request.param
    )


def _check_rows(path, n=N, **open_kwargs):
    """The file reads back exactly rows 0..n-1, by every read path."""
    with rowstore.open(path, **open_kwargs) as r:
        assert len(r) == n
        got = r.take(np.arange(n))
        assert got["id"].tolist() == list(range(n))
        assert (got["x"] == np.arange(n, dtype=np.float32)[:, None]).all()
        for i in (0, 1, n - 1):
            row = r[i]
            want = _row(i)
            assert row["s"] == want["s"] and np.array_equal(row["v"], want["v"])
        ids = sorted(int(i) for b in r.batches(7, shuffle="full", seed=1) for i in b["id"])
        assert ids == list(range(n))
        r.layout.verify()


def _parts(path):
    """(footer offset, footer bytes, trailer bytes) of a v2 file."""
    data = open(path, "rb").read()
    _, off, nbytes, _, _ = struct.unpack("<8sQQII", data[-footer.TRAILER_SIZE :])
    return off, data[off : off + nbytes], data[-footer.TRAILER_SIZE :]


def _header(path):
    _, f, _ = _parts(path)
    (n,) = struct.unpack_from("<I", f, 8)
    return json.loads(f[12 : 12 + n])


def _encode(header, blocks, heap_chunks, offset, *, text=None, pages=None):
    """Footer and trailer bytes, built here from docs/format.md's byte layout (not by the code
    under test); ``text``: the header's JSON bytes as given; ``pages``: a v3 file's block and
    heap page CRC-32s."""
    text = json.dumps(header, sort_keys=True).encode() if text is None else text
    body = b"".join(
        [
            b"RSFOOTR2",
            struct.pack("<I", len(text)),
            text,
            b"RSDXIDX1",
            blocks.tobytes(),
            heap_chunks.tobytes(),
        ]
    )
    if pages is not None:
        body += (
            b"RSPAGES3"
            + np.asarray(pages[0], "<u4").tobytes()
            + np.asarray(pages[1], "<u4").tobytes()
        )
    head = struct.pack("<8sQQI", b"RSTRAIL2", offset, len(body), zlib.crc32(body))
    return body + head + struct.pack("<I", zlib.crc32(head))


def _rewrite(src, dst, *, header=None, raw_header=None, blocks=None, heap_chunks=None):
    """A copy of ``src`` with its footer rebuilt (valid CRCs) from edited parts: what a hostile
    writer can produce; the reader must check every value, not only the CRCs."""
    shutil.copyfile(src, dst)
    L = Layout.open(src)
    data = _encode(
        _header(src) if header is None else header,
        L.blocks if blocks is None else blocks,
        L.heap_chunks if heap_chunks is None else heap_chunks,
        L.footer_offset,
        text=raw_header,
        pages=None if L.block_pages is None else (L.block_pages, L.heap_pages),
    )
    with open(dst, "r+b") as f:
        f.truncate(L.footer_offset)
        f.seek(L.footer_offset)
        f.write(data)
    return dst


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in ("id", "x"))


def _oracle(path, n=N):
    """Either a RowstoreError (or the system's OSError) or exactly the rows written."""
    try:
        _check_rows(path, n)
    except RowstoreError:
        pass
    except OSError as exc:
        assert exc.errno is not None, f"{type(exc).__name__} without errno: {exc!r}"


def as_v1(src, dst):
    """``src`` as the v1 writer left it: the footer cut off, format_version 1, no has_footer."""
    shutil.copyfile(src, dst)
    footer.cut(dst, Layout.open(src).footer_offset)
    with h5py.File(dst, "r+") as f:
        f["rowstore"].attrs["format_version"] = 1
        del f["rowstore"].attrs["has_footer"]
    assert Layout.open(dst).version == 1
    return dst


# -- what is written -----------------------------------------------------------------------------------
def test_writer_appends_a_v2_footer_that_h5py_ignores(valid):
    L = Layout.open(valid)
    # Compressed and uncompressed files carry the page index (v3).
    want = 3
    assert L.version == want and rowstore.FORMAT_VERSION == 3
    assert 0 < L.footer_offset < L.file_size == os.path.getsize(valid)
    off, f, t = _parts(valid)
    assert (
        off == L.footer_offset
        and f.startswith(footer.FOOTER_MAGIC)
        and t.startswith(footer.TRAILER_MAGIC)
    )
    h = _header(valid)
    assert (
        h[footer.KEY_EOF] == off
        and h["format_version"] == want
        and json.loads(h["schema"]) == SCHEMA.to_json()
    )
    assert (h.get("page_bytes") == 4096) == (want == 3)
    with h5py.File(valid, "r") as hf:  # the HDF5 part is a complete file, with the same index
        g = hf["rowstore"]
        assert int(g.attrs["format_version"]) == want and g["rows"].shape == (N,)
        assert np.array_equal(g["blocks"][()], L.blocks) and np.array_equal(
            g["heap_chunks"][()], L.heap_chunks
        )
        assert g["rows"]["id"][()].tolist() == list(range(N))
    assert (L.blocks["offset"] + L.blocks["stored_nbytes"] <= off).all()
    # The page index: each page's CRC-32 of the raw bytes, as documented (the stored bytes of
    # an uncompressed file; a compressed file's are tested in test_page_index).
    pages = (L.block_pages, L.heap_pages)
    if L.compression["id"] == "none":
        raw = open(valid, "rb").read()
        rs, plen = L.row_dtype.itemsize, max(1, 4096 // L.row_dtype.itemsize) * L.row_dtype.itemsize
        chunk_pages = lambda at, size, step: [
            zlib.crc32(raw[at + a : at + min(a + step, size)])  # noqa: E731
            for a in range(0, size, step)
        ]
        pages = (
            [
                c
                for b in L.blocks
                for c in chunk_pages(int(b["offset"]), L.rows_per_block * rs, plen)
            ],
            [
                c
                for b in L.heap_chunks
                for c in chunk_pages(int(b["offset"]), L.heap_chunk_bytes, 4096)
            ],
        )
    assert f + t == _encode(
        h, L.blocks, L.heap_chunks, off, pages=pages
    )  # the documented byte layout, exactly
    _check_rows(valid)


def test_open_and_read_never_call_libhdf5(valid, tmp_path, rs):
    """With h5py impossible to import, a v2 file opens and reads; with every HDF5 metadata byte
    (everything but the chunks and the footer) zeroed, it still reads back exactly."""
    L = Layout.open(valid)
    garbled = str(tmp_path / "garbled.h5")
    shutil.copyfile(valid, garbled)
    keep = np.zeros(L.file_size, bool)
    for off, n in list(zip(L.blocks["offset"], L.blocks["stored_nbytes"])) + list(
        zip(L.heap_chunks["offset"], L.heap_chunks["stored_nbytes"])
    ):
        keep[int(off) : int(off + n)] = True
    keep[L.footer_offset :] = True
    data = np.fromfile(garbled, np.uint8)
    data[~keep] = 0
    data.tofile(garbled)
    with pytest.raises(OSError):
        h5py.File(garbled, "r")  # libhdf5 cannot open it any more
    code = f"""
import sys
sys.modules["h5py"] = None  # `import h5py` raises ImportError
import numpy as np
import rowstore
for p in ({valid!r}, {garbled!r}):
    with rowstore.open(p) as r:
        got = r.take(np.arange({N}))
        assert got["id"].tolist() == list(range({N})), p
        assert (got["x"] == np.arange({N}, dtype=np.float32)[:, None]).all()
        assert r[5]["s"] == "s5" and r[5]["v"].tolist() == [[5, 5], [5, 5]]
        assert sorted(int(i) for b in r.batches(7, shuffle="full", seed=1) for i in b["id"]) == list(range({N}))
    rowstore.Layout.open(p).verify()
assert sys.modules["h5py"] is None
print("ok")
"""
    out = rs.run_python(code, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


# -- damage and hostile footers -------------------------------------------------------------------------
def test_every_flipped_footer_byte_is_an_error_or_exact(valid, tmp_path):
    off, f, t = _parts(valid)
    size = os.path.getsize(valid)
    path = str(tmp_path / "flip.h5")
    shutil.copyfile(valid, path)
    errors = 0
    for at in range(off, size):
        with open(path, "r+b") as fh:
            fh.seek(at)
            b = fh.read(1)
            fh.seek(at)
            fh.write(bytes([b[0] ^ 0x5A]))
        with pytest.raises(
            FormatError
        ):  # a flipped trailer magic too: the footer is there, its trailer is not
            Layout.open(path)
        errors += 1
        with open(path, "r+b") as fh:
            fh.seek(at)
            fh.write(b)
    assert errors == size - off


def test_edited_schema_in_the_footer_is_refused(valid, tmp_path):
    """ "<f4" edited to "<i4" in the footer: a ChecksumError at open (v1 files cannot tell)."""
    path = str(tmp_path / "schema.h5")
    shutil.copyfile(valid, path)
    off, f, _ = _parts(path)
    at = f.index(b"<f4")
    with open(path, "r+b") as fh:
        fh.seek(off + at)
        fh.write(b"<i4")
    with pytest.raises(ChecksumError, match="footer"):
        rowstore.open(path)


def test_swapped_block_entries_in_the_footer_are_refused(valid, tmp_path):
    path = str(tmp_path / "swap.h5")
    shutil.copyfile(valid, path)
    L = Layout.open(path)
    b = L.blocks.copy()
    b[[0, 1]] = b[[1, 0]]
    at = L.footer_offset + _parts(path)[1].index(L.blocks.tobytes())
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(b.tobytes())
    with pytest.raises(ChecksumError):
        rowstore.open(path)


def test_swapped_whole_chunks_are_a_checksum_error(valid, tmp_path):
    L = Layout.open(valid)
    if L.compressed:
        pytest.skip("compressed chunks differ in size")
    path = str(tmp_path / "chunks.h5")
    shutil.copyfile(valid, path)
    (a, b), n = (int(x) for x in L.blocks["offset"][:2]), int(L.blocks["stored_nbytes"][0])
    data = bytearray(open(path, "rb").read())
    data[a : a + n], data[b : b + n] = data[b : b + n], data[a : a + n]
    open(path, "wb").write(bytes(data))
    with pytest.raises(ChecksumError):
        with rowstore.open(path) as r:
            r.take(np.arange(N))
    with pytest.raises(ChecksumError):
        Layout.open(path).verify()


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, bytes):
        return v.decode("latin-1")
    return v


def _hostile_cases():
    from test_hostile_metadata import ATTR_CASES

    cases = {k: (name, _jsonable(v)) for k, (name, v) in ATTR_CASES.items()}
    cases.update({
        "num_rows-bool": ("num_rows", True), "format_version-1": ("format_version", 1),
        "format_version-4": ("format_version", 4), "format_version-str": ("format_version", "2"),
        "schema-as-object": ("schema", SCHEMA.to_json()), "schema-int": ("schema", 7), "writer-int": ("writer", 3),
        "eof-wrong": (footer.KEY_EOF, 10), "eof-missing": (footer.KEY_EOF, None), "eof-bool": (footer.KEY_EOF, True),
        "format-other": ("format", "hdf5"), "user_attrs-list": ("user_attrs", "[1]"),
        "heap_nbytes-negative": ("heap_nbytes", -5), "rows_per_block-float": ("rows_per_block", 8.0),
    })  # fmt: skip
    return cases


HOSTILE = _hostile_cases()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_values_with_valid_crcs(valid, tmp_path, case):
    """Every attribute case of test_hostile_metadata, and v2-only ones, written into a footer
    whose CRCs are recomputed: a RowstoreError or the exact rows, never another exception."""
    name, value = HOSTILE[case]
    h = _header(valid)
    if value is None:
        h.pop(name, None)
    else:
        h[name] = value
    path = _rewrite(valid, str(tmp_path / "h.h5"), header=h)
    if case.startswith("eof-"):
        with pytest.raises(FormatError, match="hdf5_eof"):
            rowstore.open(path)
    elif case == "format_version-4":
        with pytest.raises(FormatVersionError, match="v4"):
            rowstore.open(path)
    elif (
        case == "schema-dtype-int-reinterpret"
    ):  # a CRC catches damage, not a deliberate edit that recomputes it
        assert Layout.open(path).schema["x"].dtype == np.int32
        return
    _oracle(path)


@pytest.mark.parametrize(
    "raw", [b"[1, 2]", b"{", b"\xff\xfe", b"[" * 200_000 + b"]" * 200_000, b"null", b""]
)
def test_header_that_is_not_a_json_object(valid, tmp_path, raw):
    path = _rewrite(valid, str(tmp_path / "raw.h5"), raw_header=raw)
    with pytest.raises(FormatError):
        rowstore.open(path)


def _col(L, name, column, fn):
    a = getattr(L, name).copy()
    a[column] = fn(a[column])
    return {name: a}


INDEX_CASES = {
    "blocks-all-at-one-chunk": lambda L: _col(
        L, "blocks", "offset", lambda c: np.full_like(c, c[0])
    ),
    "blocks-swapped-offsets": lambda L: _col(
        L, "blocks", "offset", lambda c: c[[1, 0, *range(2, len(c))]]
    ),
    "blocks-overlapping": lambda L: _col(
        L, "blocks", "offset", lambda c: np.concatenate([c[:1], c[:1] + 1, c[2:]])
    ),
    "blocks-offset-huge": lambda L: _col(L, "blocks", "offset", lambda c: c + np.uint64(2**63)),
    "blocks-into-footer": lambda L: _col(
        L, "blocks", "offset", lambda c: np.concatenate([c[:-1], [L.footer_offset]])
    ),
    "blocks-stored-huge": lambda L: _col(
        L, "blocks", "stored_nbytes", lambda c: c * np.uint64(2**40)
    ),
    "blocks-heap-end-huge": lambda L: _col(L, "blocks", "heap_end", lambda c: c + np.uint64(2**62)),
    "blocks-first-row": lambda L: _col(L, "blocks", "first_row", lambda c: c[::-1]),
    "blocks-one-missing": lambda L: {"blocks": L.blocks[:-1].copy()},
    "blocks-one-more": lambda L: {"blocks": np.concatenate([L.blocks, L.blocks[-1:]])},
    "heap-chunks-at-one-offset": lambda L: _col(
        L, "heap_chunks", "offset", lambda c: np.full_like(c, c[0])
    ),
    "heap-chunks-missing": lambda L: {"heap_chunks": L.heap_chunks[:0].copy()},
}


@pytest.mark.parametrize("case", sorted(INDEX_CASES))
def test_hostile_index_entries_with_valid_crcs(valid, tmp_path, case):
    """Index entries a hostile writer recomputed the CRC of: refused at open by the same checks
    as a v1 file's index (offsets swapped whole, with their CRCs, are the one edit only each
    chunk's CRC catches: see test_swapped_whole_chunks_are_a_checksum_error)."""
    L = Layout.open(valid)
    path = _rewrite(valid, str(tmp_path / "i.h5"), **INDEX_CASES[case](L))
    if (
        case == "blocks-swapped-offsets" and not L.compressed
    ):  # disjoint and in the file: the chunk CRCs catch it
        with pytest.raises(ChecksumError):
            with rowstore.open(path) as r:
                r.take(np.arange(N))
        return
    with pytest.raises(FormatError):
        rowstore.open(path)


def test_truncation_at_every_footer_boundary_and_appended_bytes(valid, tmp_path):
    """Cut at each structure boundary of the footer (and just before it, inside the HDF5 part),
    garbage in the trailer, bytes appended: a FormatError before libhdf5 sees the file (its HDF5
    superblock says where the footer starts), except a file cut exactly at the footer, which is
    a complete v1-like file: refused as having lost its footer, or read through libhdf5 with the
    exact rows when the caller opts in."""
    off, f, t = _parts(valid)
    (n,) = struct.unpack_from("<I", f, 8)
    size = os.path.getsize(valid)
    cuts = {off - 1, off, off + 4, off + 8, off + 12, off + 12 + n // 2, off + 12 + n, off + 20 + n, off + 20 + n + 56,
            off + len(f) - 1, off + len(f), size - 20, size - 4, size - 1}  # fmt: skip
    for cut in sorted(cuts):
        p = str(tmp_path / f"cut{cut}.h5")
        shutil.copyfile(valid, p)
        os.truncate(p, cut)
        if cut == off:
            with pytest.raises(FormatError, match="footer is gone"):
                Layout.open(p)
            _check_rows(p, allow_missing_footer=True)
        else:
            with pytest.raises(FormatError, match="truncated|trailer|footer"):
                Layout.open(p)
    for extra in (b"\0", b"x" * 31, b"\xff" * 32, b"garbage" * 1000, t, f + t):
        p = str(tmp_path / "appended.h5")
        shutil.copyfile(valid, p)
        with open(p, "ab") as fh:
            fh.write(extra)
        with pytest.raises(FormatError, match="trailer"):
            Layout.open(p)
    for garbage in (footer.TRAILER_MAGIC + b"\0" * 24, footer.TRAILER_MAGIC + os.urandom(24)):
        p = str(tmp_path / "trailer.h5")
        shutil.copyfile(valid, p)
        with open(p, "r+b") as fh:
            fh.seek(size - footer.TRAILER_SIZE)
            fh.write(garbage)
        with pytest.raises(FormatError):
            Layout.open(p)


# -- append ---------------------------------------------------------------------------------------------
def test_append_to_a_v2_file_writes_a_fresh_footer(valid, tmp_path):
    path = str(tmp_path / "a.h5")
    shutil.copyfile(valid, path)
    comp = Layout.open(valid).compression["id"]
    _write(path, n=13, start=N, mode="a", compression=None if comp == "none" else "lz4")
    L = Layout.open(path)
    assert L.version == Layout.open(valid).version and L.footer_offset and L.num_rows == N + 13
    assert _parts(path)[0] == L.footer_offset
    _check_rows(path, N + 13)
    with h5py.File(path) as hf:  # the HDF5 part agrees with the footer
        assert np.array_equal(hf["rowstore/blocks"][()], L.blocks)
        assert hf["rowstore/rows"]["id"][()].tolist() == list(range(N + 13))
    _write(path, n=5, start=N + 13, mode="a", compression=None if comp == "none" else "lz4")
    _check_rows(path, N + 18)


def test_append_to_a_v1_file_makes_it_v2(valid, tmp_path):
    v1 = as_v1(valid, str(tmp_path / "v1.h5"))
    _check_rows(v1)  # a v1 file reads through h5py
    comp = Layout.open(valid).compression["id"]
    _write(v1, n=9, start=N, mode="a", compression=None if comp == "none" else "lz4")
    L = Layout.open(v1)
    assert L.version == 2 and L.footer_offset
    _check_rows(v1, N + 9)


def test_append_to_the_v1_golden_file(tmp_path):
    golden = os.path.join(DATA, "golden_v1.h5")
    path = str(tmp_path / "g.h5")
    shutil.copyfile(golden, path)
    before = Layout.open(path)
    assert before.version == 1 and before.footer_offset == 0
    with rowstore.open(golden) as r:
        rows = [r[i] for i in range(len(r))]
    with rowstore.Writer(path, mode="a") as w:
        for row in rows[:3]:
            w.write(row)
    after = Layout.open(path)
    assert after.version == 2 and after.num_rows == before.num_rows + 3 and after.footer_offset
    after.verify()
    with rowstore.open(path) as r:
        assert r[len(r) - 1]["id"] == rows[2]["id"] and r[0]["id"] == rows[0]["id"]


# -- remote -----------------------------------------------------------------------------------------------
def test_remote_open_reads_the_footer_in_one_get(valid, tmp_path, http_factory):
    """HTTP: a HEAD and one ranged GET open a v2 file (a v1 file takes a HEAD and two GETs),
    and a big footer one GET more; the rows equal the local file's."""
    d = str(tmp_path / "srv")
    os.makedirs(d)
    shutil.copyfile(valid, os.path.join(d, "v2.h5"))
    as_v1(valid, os.path.join(d, "v1.h5"))
    big = os.path.join(d, "big.h5")
    with rowstore.Writer(big, Schema([Field("i", "int32")]), rows_per_block=1) as w:
        w.write_batch({"i": np.arange(25_000, dtype=np.int32)})  # a 1.4 MB footer
    assert os.path.getsize(big) - Layout.open(big).footer_offset > footer.FIRST_READ
    srv = http_factory(d)
    for name, want in (
        ("v2.h5", 2),
        ("v1.h5", 2),
        ("big.h5", 3),
    ):  # small files: the tail GET holds it all
        before = srv.requests
        with rowstore.open(srv.url + "/" + name) as r:
            assert srv.requests - before == want, name
            n = len(r)
            with rowstore.open(os.path.join(d, name)) as local:
                k = np.arange(0, n, max(1, n // 50))
                got, want_rows = r.take(k), local.take(k)
                assert all(
                    np.array_equal(got[f], want_rows[f]) for f in ("id", "x", "i") if f in got
                )


def test_remote_open_of_a_damaged_footer_is_refused(valid, tmp_path, http_factory):
    d = str(tmp_path / "srv")
    os.makedirs(d)
    path = os.path.join(d, "bad.h5")
    shutil.copyfile(valid, path)
    off = Layout.open(path).footer_offset
    with open(path, "r+b") as fh:
        fh.seek(off + 20)
        b = fh.read(1)
        fh.seek(off + 20)
        fh.write(bytes([b[0] ^ 1]))
    srv = http_factory(d)
    with pytest.raises(ChecksumError):
        rowstore.open(srv.url + "/bad.h5")


def test_remote_open_from_moto(valid, s3_server):
    fsspec = pytest.importorskip("fsspec")
    _, opts = s3_server
    fs = fsspec.filesystem("s3", **opts)
    key = f"rowstore/footer/{os.path.basename(valid)}"
    fs.put(valid, key)
    with rowstore.open("s3://" + key, storage_options=opts) as r, rowstore.open(valid) as local:
        assert r.layout.num_rows == N
        assert _same(r.take(np.arange(N)), local.take(np.arange(N)))


# -- rowstore verify: the HDF5 part against the footer --------------------------------------------------
def test_verify_cross_checks_the_hdf5_part(valid, tmp_path, capsys):
    """``rowstore verify`` of a v2 file also checks, with libhdf5 in a child process, that the
    HDF5 part (what h5py users read) holds the footer's attributes and index: an HDF5 index
    edited under an intact footer, or HDF5 metadata libhdf5 cannot read, exits 1."""
    from rowstore.cli import main

    assert main(["verify", valid]) == 0
    L = Layout.open(valid)
    edited = str(tmp_path / "edited.h5")
    shutil.copyfile(valid, edited)
    tail = open(valid, "rb").read()[L.footer_offset :]
    with h5py.File(edited, "r+") as f:  # writes over the footer: put it back after
        b = f["rowstore/blocks"][()]
        b["checksum"][0] ^= 1
        f["rowstore/blocks"][...] = b
    with open(edited, "r+b") as fh:
        fh.seek(L.footer_offset)
        fh.write(tail)
        fh.truncate()
    assert (
        Layout.open(edited).footer_offset == L.footer_offset
    )  # rowstore still reads the intact footer
    capsys.readouterr()
    assert main(["verify", edited]) == 1
    assert "the footer and the HDF5 part disagree" in capsys.readouterr().err
    assert main(["verify", edited, "--no-hdf5-check"]) == 0
    garbled = str(tmp_path / "garbled.h5")
    shutil.copyfile(valid, garbled)
    with open(garbled, "r+b") as fh:  # the HDF5 superblock
        fh.write(b"\0" * 64)
    capsys.readouterr()
    assert main(["verify", garbled]) == 1
    assert "libhdf5 failed" in capsys.readouterr().err
    with rowstore.open(garbled) as r:  # rowstore reads it from its footer all the same
        assert r.take(np.arange(N))["id"].tolist() == list(range(N))


def test_remote_open_with_a_cache_keeps_the_footer(valid, tmp_path, http_factory):
    """With cache=, the footer is kept: a second open of the same object makes only the HEAD."""
    d = str(tmp_path / "srv")
    os.makedirs(d)
    shutil.copyfile(valid, os.path.join(d, "v2.h5"))
    srv = http_factory(d)
    cache = str(tmp_path / "cache")
    counts = []
    for _ in range(2):
        before = srv.requests
        with rowstore.open(srv.url + "/v2.h5", cache=cache) as r:
            counts.append(srv.requests - before)
            assert r.take(np.arange(N))["id"].tolist() == list(range(N))
            assert r.layout.num_rows == N
    assert counts[0] >= 2
    with rowstore.open(srv.url + "/v2.h5", cache=cache) as r:
        pass
    before = srv.requests
    with rowstore.open(srv.url + "/v2.h5", cache=cache) as r:
        assert srv.requests - before == 1  # the HEAD: footer from the cache
        assert r.layout.num_rows == N
