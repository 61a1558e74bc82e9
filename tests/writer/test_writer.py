"""Writer behaviour: write vs write_batch, block sizing and boundaries, heap chunks, attrs,
modes ("w", "x", "a" with partial last block and heap chunk), closing."""

from __future__ import annotations

import gc
import json
import os
import warnings

import h5py
import hdf5plugin  # noqa: F401 - registers the Blosc2 filter for h5py
import numpy as np
import pytest

import rowstore
from rowstore import Field, Layout, Schema, SchemaError, WriterClosedError
from rowstore.format import spec
from rowstore.format.stats import close as stats_close

COMPRESSIONS = [None, "lz4", {"cname": "zstd", "clevel": 3, "shuffle": "bit"}]
COMPRESSION_IDS = ["none", "lz4", "zstd-dict"]


def raw_content(path):
    """The logical content of a file: rows table, heap bytes, index (without file offsets), attrs."""
    with h5py.File(path, "r") as f:
        g = f["rowstore"]
        rows = g["rows"][()]
        heap = g["heap"][()].tobytes() if "heap" in g else None
        blocks = g["blocks"][()]
        blocks = {name: blocks[name].tolist() for name in blocks.dtype.names if name != "offset"}
        hc = g["heap_chunks"][()] if "heap_chunks" in g else None
        hc = (
            None
            if hc is None
            else {name: hc[name].tolist() for name in hc.dtype.names if name != "offset"}
        )
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
    return rows, heap, blocks, hc, attrs


def assert_same_content(a, b):
    ra, ha, ba, hca, aa = raw_content(a)
    rb, hb, bb, hcb, ab = raw_content(b)
    assert ra.dtype == rb.dtype and ra.tobytes() == rb.tobytes()
    assert ha == hb
    assert ba == bb
    assert hca == hcb
    # statistics: the same up to the rounding of means and variances (rows folded in other
    # groups: write vs write_batch, an append vs one go)
    sa, sb = aa.pop(spec.ATTR_STATS, None), ab.pop(spec.ATTR_STATS, None)
    assert (sa is None) == (sb is None) and (
        sa is None or stats_close(json.loads(sa), json.loads(sb))
    )
    assert {k: str(v) for k, v in aa.items()} == {k: str(v) for k, v in ab.items()}


def check_layout(path, n, rpb=None):
    lay = Layout.open(path, scan=True)
    assert lay.num_rows == n
    if rpb is not None:
        assert lay.rows_per_block == rpb
    rpb = lay.rows_per_block
    nb = -(-n // rpb)
    assert lay.num_blocks == nb
    assert lay.blocks["first_row"].tolist() == [k * rpb for k in range(nb)]
    expected_rows = [rpb] * (nb - 1) + ([n - (nb - 1) * rpb] if nb else [])
    assert lay.blocks["num_rows"].tolist() == expected_rows
    assert len(lay.heap_chunks) == -(-lay.heap_nbytes // lay.heap_chunk_bytes)
    if nb:
        assert lay.blocks["heap_start"][0] == 0 and lay.blocks["heap_end"][-1] == lay.heap_nbytes
    return lay


# -- write vs write_batch --------------------------------------------------------------------
@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
@pytest.mark.parametrize(
    "sizing", [{"rows_per_block": 7}, {"block_bytes": 600}], ids=["rpb", "block_bytes"]
)
def test_write_and_write_batch_give_identical_content(
    rs, tmp_path, schema_all_nullable, compression, sizing
):
    schema = schema_all_nullable
    rows = rs.make_rows(schema, 40, seed=11)
    a, b, c = (str(tmp_path / f"{k}.h5") for k in "abc")
    kw = dict(compression=compression, heap_chunk_bytes=128, **sizing)
    rs.write_file(a, schema, rows, **kw)
    rs.write_file(b, schema, rows, batch=True, **kw)
    with rowstore.Writer(c, schema, **kw) as w:  # uneven batches
        for lo, hi in [(0, 1), (1, 10), (10, 10), (10, 33), (33, 40)]:
            if hi > lo:
                w.write_batch(rs.rows_to_columns(schema, rows[lo:hi]))
    assert_same_content(a, b)
    assert_same_content(a, c)
    for p in (a, b, c):
        check_layout(p, 40)
        rs.assert_rows_equal(schema, rows, rs.read_rows(p))


def test_write_batch_column_forms(rs, h5path):
    schema = Schema([
        Field("x", "float32", (2,)), Field("k", "int8", nullable=True), Field("v", "int16", (None,)),
        Field("t", "str"), Field("img", "uint8", (3, 3), codec="png"),
    ])  # fmt: skip
    n = 5
    cols = {
        "x": [[1, 2]] * n,  # a list of lists for an inline field
        "k": [1, None, 3, None, 5],  # nulls in an inline nullable field
        "v": np.arange(10, dtype=np.int16).reshape(n, 2),  # a 2-D array for a variable field
        "t": np.array(["a", "bb", "", "é", "😀"], dtype=object),
        "img": np.arange(45, dtype=np.uint8).reshape(n, 3, 3),
    }
    with rowstore.Writer(h5path, schema, rows_per_block=2) as w:
        w.write_batch(cols)
        w.write_batch({name: col[:0] for name, col in cols.items()})  # empty batch: no-op
        assert w.num_rows == n
    got = rs.read_rows(h5path)
    assert [r["k"] for r in got] == [1, None, 3, None, 5]
    assert [r["t"] for r in got] == ["a", "bb", "", "é", "😀"]
    assert got[3]["v"].tolist() == [6, 7] and got[4]["img"].tolist() == cols["img"][4].tolist()


# -- block sizing and boundaries -------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "rpb"), [(1, 1), (10, 1), (10, 3), (12, 3), (5, 100), (100, 7), (64, 64)]
)
def test_block_boundaries_exact(rs, h5path, n, rpb):
    schema = Schema([Field("i", "int64"), Field("v", "uint8", (None,))])
    rows = [{"i": i, "v": np.full(i % 4, i, np.uint8)} for i in range(n)]
    rs.write_file(h5path, schema, rows, rows_per_block=rpb, heap_chunk_bytes=64)
    lay = check_layout(h5path, n, rpb)
    with h5py.File(h5path, "r") as f:
        assert f["rowstore/rows"].shape == (n,) and f["rowstore/rows"].chunks == (rpb,)
        assert f["rowstore/rows"]["i"].tolist() == list(range(n))
    # each block's heap range holds exactly its rows' payloads
    sizes = [i % 4 for i in range(n)]
    for k in range(lay.num_blocks):
        lo, hi = k * rpb, min(n, (k + 1) * rpb)
        assert int(lay.blocks["heap_end"][k] - lay.blocks["heap_start"][k]) == sum(sizes[lo:hi])
    got = rowstore.open(h5path).take(np.arange(n)[::-1])
    assert got["i"].tolist() == list(range(n))[::-1]


def test_block_bytes_sets_rows_per_block_without_heap(rs, h5path):
    schema = Schema([Field("x", "float64", (4,)), Field("y", "int32")])  # 36-byte rows
    rows = [{"x": np.full(4, i), "y": i} for i in range(50)]
    rs.write_file(h5path, schema, rows, block_bytes=36 * 8)
    check_layout(h5path, 50, 8)
    rs.write_file(h5path, schema, rows, block_bytes=1)  # smaller than a row: one row per block
    check_layout(h5path, 50, 1)
    rs.write_file(h5path, schema, rows)  # default 1 MiB: everything in one block
    # 29,127 rows of 36 bytes fit; rounded down to a multiple of 8 pages of 113 rows (28,928),
    # so that the default order's 8 pieces start on pages
    check_layout(h5path, 50, 28928)


@pytest.mark.parametrize("row_size", [8, 24, 36, 53, 72, 1000, 4096, 19448])
@pytest.mark.parametrize("block_bytes", [1 << 16, 1 << 18, 1 << 20])
def test_derived_rows_per_block_cut_into_pieces_on_pages(row_size, block_bytes):
    from rowstore.format import spec

    fit = max(1, block_bytes // row_size)
    rpb = spec.page_rows_per_block(fit, row_size)
    assert fit - fit // 8 <= rpb <= fit  # loses at most an eighth of the block
    rpp = spec.page_geometry(spec.PAGE_BYTES, rpb * row_size, row_size)[0] // row_size
    if rpb >= spec.BLOCK_PIECES * rpp:  # blocks large enough to cut on pages
        for pieces in (spec.BLOCK_PIECES, spec.BLOCK_PIECES // 2, 2):
            assert (-(-rpb // pieces)) % rpp == 0  # each piece starts on a page


def test_block_bytes_with_heap_payloads(rs, h5path):
    # rows of 16 (ref) + 8 bytes, payloads of 100 bytes: 124 bytes per row, block_bytes 1000
    schema = Schema([Field("k", "int64"), Field("b", "bytes")])
    rows = [{"k": i, "b": bytes([i % 256]) * 100} for i in range(60)]
    for batch in (False, True):
        rs.write_file(h5path, schema, rows, block_bytes=1000, batch=batch)
        lay = check_layout(h5path, 60)
        assert 7 <= lay.rows_per_block <= 9, lay.rows_per_block
        rs.assert_rows_equal(schema, rows, rs.read_rows(h5path))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_many_blocks(rs, h5path, compression):
    schema = Schema([Field("i", "int32"), Field("t", "str")])
    n = 2000
    rows = [{"i": i, "t": str(i)} for i in range(n)]
    rs.write_file(
        h5path,
        schema,
        rows,
        rows_per_block=3,
        heap_chunk_bytes=64,
        compression=compression,
        batch=True,
    )
    lay = check_layout(h5path, n, 3)
    assert lay.num_blocks == 667
    r = rowstore.open(h5path)
    b = r.take(np.arange(n))
    assert b["i"].tolist() == list(range(n)) and b["t"].tolist() == [str(i) for i in range(n)]
    perm = np.random.default_rng(0).permutation(n)
    b = r.take(perm)
    assert b["i"].tolist() == perm.tolist() and b["t"].tolist() == [str(i) for i in perm]


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_heap_payloads_spanning_heap_chunks(rs, h5path, compression):
    schema = Schema([Field("b", "bytes"), Field("w", "float64", (None,)), Field("k", "uint8")])
    rng = np.random.default_rng(12)
    rows = [{"b": rng.integers(0, 256, int(rng.integers(0, 300)), dtype=np.uint8).tobytes(),
             "w": rng.standard_normal(int(rng.integers(0, 40))), "k": i} for i in range(30)]  # fmt: skip
    rs.write_file(
        h5path, schema, rows, rows_per_block=4, heap_chunk_bytes=64, compression=compression
    )
    lay = check_layout(h5path, 30, 4)
    assert lay.heap_chunk_bytes == 64
    total = sum(len(r["b"]) + 8 * len(r["w"]) for r in rows)
    assert lay.heap_nbytes == total and len(lay.heap_chunks) == -(-total // 64)
    rs.assert_rows_equal(schema, rows, rs.read_rows(h5path))
    with h5py.File(h5path, "r") as f:
        assert f["rowstore/heap"].shape == (total,)
        heap = f["rowstore/heap"][()].tobytes()
        refs = f["rowstore/rows"]["b"]
    for i, r in enumerate(rows):
        off, nb = int(refs["offset"][i]), int(refs["nbytes"][i])
        assert heap[off : off + nb] == r["b"]


# -- attrs and modes -------------------------------------------------------------------------
def test_attrs(rs, h5path):
    schema = Schema([Field("i", "int64")])
    attrs = {"source": "unit test", "n": 3, "nested": {"a": [1, 2.5, None]}, "ü": "日本"}
    with rowstore.Writer(h5path, schema, attrs=attrs) as w:
        w.write({"i": 1})
        w.attrs["late"] = True
    lay = Layout.open(h5path)
    assert lay.user_attrs == {**attrs, "late": True}
    assert rowstore.open(h5path).layout.user_attrs == lay.user_attrs
    with pytest.raises(TypeError):
        rowstore.Writer(h5path + "2", schema, attrs={"bad": object()})
    assert not os.path.exists(h5path + "2")
    # no attrs: an empty dict
    rs.write_file(h5path, schema, [{"i": 1}])
    assert Layout.open(h5path).user_attrs == {}


def test_mode_w_replaces(rs, h5path):
    schema = Schema([Field("i", "int64")])
    rs.write_file(h5path, schema, [{"i": 1}, {"i": 2}])
    rs.write_file(h5path, schema, [{"i": 3}], mode="w")
    assert [r["i"] for r in rs.read_rows(h5path)] == [3]


def test_mode_x(rs, h5path, tmp_path):
    schema = Schema([Field("i", "int64")])
    rs.write_file(h5path, schema, [{"i": 1}], mode="x")
    before = open(h5path, "rb").read()
    with pytest.raises(FileExistsError):
        rowstore.Writer(h5path, schema, mode="x")
    assert open(h5path, "rb").read() == before
    # the file appears while an "x" writer is open: close refuses to overwrite it
    other = str(tmp_path / "late.h5")
    w = rowstore.Writer(other, schema, mode="x")
    w.write({"i": 7})
    with open(other, "wb") as f:
        f.write(b"someone else's file")
    with pytest.raises(FileExistsError):
        w.close()
    assert open(other, "rb").read() == b"someone else's file"
    assert sorted(os.listdir(tmp_path)) == ["data.h5", "late.h5"]


def test_empty_file(rs, h5path):
    schema = Schema([Field("i", "int64"), Field("t", "str", nullable=True)])
    with rowstore.Writer(h5path, schema):
        pass
    lay = check_layout(h5path, 0)
    assert lay.num_blocks == 0 and lay.heap_nbytes == 0
    r = rowstore.open(h5path)
    assert len(r) == 0 and r.schema == schema
    b = r.take([])
    assert len(b["i"]) == 0
    with pytest.raises(IndexError):
        r[0]


# -- append ----------------------------------------------------------------------------------
APPEND_SCHEMA = Schema([
    Field("i", "int64"), Field("x", "float32", (3,)), Field("t", "str", nullable=True),
    Field("v", "int16", (None,)), Field("img", "uint8", (4, 4), codec="png", nullable=True),
])  # fmt: skip


def append_rows(start, n):
    rng = np.random.default_rng(start)
    return [{
        "i": i, "x": np.full(3, i, np.float32), "t": None if i % 5 == 0 else "r" * (i % 7),
        "v": np.arange(i % 6, dtype=np.int16) * i, "img": None if i % 4 == 1 else rng.integers(0, 256, (4, 4), dtype=np.uint8),
    } for i in range(start, start + n)]  # fmt: skip


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
@pytest.mark.parametrize(("n1", "n2"), [(10, 7), (8, 8), (3, 1), (1, 20), (0, 5), (9, 0)])
def test_append(rs, h5path, compression, n1, n2):
    """n1 = 10 with 4 rows per block: partial last block; heap_chunk_bytes 64 leaves the heap's
    last chunk partial in most cases; n1 = 8: the last block full."""
    first, second = append_rows(0, n1), append_rows(n1, n2)
    rs.write_file(
        h5path,
        APPEND_SCHEMA,
        first,
        rows_per_block=4,
        heap_chunk_bytes=64,
        compression=compression,
        attrs={"a": 1},
    )
    lay1 = Layout.open(h5path)
    with rowstore.Writer(h5path, mode="a", attrs={"b": 2}) as w:
        assert w.num_rows == n1
        for r in second:
            w.write(r)
        assert w.num_rows == n1 + n2
    lay = check_layout(h5path, n1 + n2, 4)
    assert lay.compression == lay1.compression and lay.heap_chunk_bytes == 64
    assert lay.user_attrs == {"a": 1, "b": 2}
    assert lay.heap_nbytes >= lay1.heap_nbytes
    rs.assert_rows_equal(APPEND_SCHEMA, first + second, rs.read_rows(h5path))
    # the same content as writing everything at once
    once = h5path + ".once.h5"
    rs.write_file(
        once,
        APPEND_SCHEMA,
        first + second,
        rows_per_block=4,
        heap_chunk_bytes=64,
        compression=compression,
        attrs={"a": 1, "b": 2},
    )
    assert_same_content(h5path, once)


def test_large_chunks_start_on_os_pages(h5path):
    """Heap chunks and blocks of spec.ALIGN_THRESHOLD bytes or more start at multiples of
    spec.ALIGN_BYTES, in a new file and after an append (checked reads of payloads then touch
    only the page-cache pages the payloads do); smaller blocks stay packed."""
    from rowstore.format import spec

    schema = Schema([Field("w", "uint8", (None,)), Field("k", "int64")])
    rng = np.random.default_rng(3)

    def rows(n):
        return [{"w": rng.integers(0, 256, int(rng.integers(1, 40_000)), dtype=np.uint8), "k": i}
                for i in range(n)]  # fmt: skip

    big = spec.ALIGN_THRESHOLD // 16  # rows of more than 16 bytes: blocks above the threshold
    first, second = rows(120), rows(90)
    with rowstore.Writer(h5path, schema, rows_per_block=big, heap_chunk_bytes=1 << 20) as w:
        for r in first:
            w.write(r)
    with rowstore.Writer(h5path, mode="a") as w:
        for r in second:
            w.write(r)
    lay = Layout.open(h5path)
    assert len(lay.heap_chunks) >= 4
    assert (lay.heap_chunks["offset"] % spec.ALIGN_BYTES == 0).all()
    assert (lay.blocks["offset"] % spec.ALIGN_BYTES == 0).all()
    with rowstore.open(h5path) as r:
        got = [r[i]["w"] for i in range(len(r))]
    assert [v.tobytes() for v in got] == [r["w"].tobytes() for r in first + second]
    small = h5path + ".small.h5"
    with rowstore.Writer(small, schema, rows_per_block=64, heap_chunk_bytes=1 << 20) as w:
        for r in first:
            w.write(r)
    offs = Layout.open(small).blocks["offset"]
    assert (offs % spec.ALIGN_BYTES != 0).any()  # small blocks: packed, not padded to pages


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_append_heap_last_chunk_exactly_full_and_partial(rs, h5path, compression):
    schema = Schema([Field("b", "bytes"), Field("k", "int8")])
    rows = [{"b": bytes([i]) * 32, "k": i} for i in range(4)]  # 128 heap bytes: 2 full chunks
    rs.write_file(
        h5path, schema, rows, rows_per_block=3, heap_chunk_bytes=64, compression=compression
    )
    assert Layout.open(h5path).heap_nbytes == 128
    more = [{"b": bytes([100 + i]) * (i * 13), "k": 100 + i} for i in range(5)]
    for chunk in (more[:1], more[1:3], more[3:]):  # several appends in a row
        with rowstore.Writer(h5path, schema, mode="a") as w:
            for r in chunk:
                w.write(r)
        rows += chunk
        check_layout(h5path, len(rows), 3)
        rs.assert_rows_equal(schema, rows, rs.read_rows(h5path))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_append_with_write_batch(rs, h5path, compression):
    first, second = append_rows(0, 6), append_rows(6, 11)
    rs.write_file(
        h5path, APPEND_SCHEMA, first, rows_per_block=4, heap_chunk_bytes=64, compression=compression
    )
    with rowstore.Writer(h5path, APPEND_SCHEMA, mode="a", compression=compression) as w:
        w.write_batch(rs.rows_to_columns(APPEND_SCHEMA, second))
    check_layout(h5path, 17, 4)
    rs.assert_rows_equal(APPEND_SCHEMA, first + second, rs.read_rows(h5path))


def test_append_creates_missing_file(rs, h5path):
    rows = append_rows(0, 3)
    with rowstore.Writer(h5path, APPEND_SCHEMA, mode="a", rows_per_block=2) as w:
        for r in rows:
            w.write(r)
    check_layout(h5path, 3, 2)
    with pytest.raises(SchemaError):
        rowstore.Writer(h5path + ".new", mode="a")  # no schema and no file


def test_append_mismatches_raise(rs, h5path):
    rs.write_file(h5path, APPEND_SCHEMA, append_rows(0, 5), rows_per_block=4, compression="lz4")
    before = open(h5path, "rb").read()
    other = Schema([f if f.name != "x" else Field("x", "float64", (3,)) for f in APPEND_SCHEMA])
    with pytest.raises(SchemaError, match="schema differs"):
        rowstore.Writer(h5path, other, mode="a")
    with pytest.raises(SchemaError):
        rowstore.Writer(h5path, APPEND_SCHEMA.select(["i", "x"]), mode="a")
    with pytest.raises(ValueError, match="compression"):
        rowstore.Writer(h5path, APPEND_SCHEMA, mode="a", compression="zstd")
    assert open(h5path, "rb").read() == before
    assert sorted(os.listdir(os.path.dirname(h5path))) == ["data.h5"]


# -- closing ---------------------------------------------------------------------------------
def test_writer_closed_error(rs, h5path):
    schema = Schema([Field("i", "int64")])
    w = rowstore.Writer(h5path, schema)
    w.write({"i": 1})
    w.close()
    w.close()  # idempotent
    with pytest.raises(WriterClosedError):
        w.write({"i": 2})
    with pytest.raises(WriterClosedError):
        w.write_batch({"i": [2]})
    assert isinstance(WriterClosedError("x"), RuntimeError)
    assert [r["i"] for r in rs.read_rows(h5path)] == [1]

    with rowstore.Writer(h5path, schema) as w2:
        w2.write({"i": 5})
    with pytest.raises(WriterClosedError):
        w2.write({"i": 6})

    w3 = rowstore.Writer(h5path + ".x", schema)
    w3.write({"i": 1})
    w3.abort()
    with pytest.raises(WriterClosedError):
        w3.write({"i": 2})
    w3.close()  # after abort: nothing happens
    assert not os.path.exists(h5path + ".x")


def test_unclosed_writer_warns_and_leaves_nothing(tmp_path):
    path = str(tmp_path / "u.h5")
    w = rowstore.Writer(path, Schema([Field("i", "int64")]), rows_per_block=1)
    for i in range(3):
        w.write({"i": i})  # blocks flushed: a temporary file exists
    assert len(os.listdir(tmp_path)) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del w
        gc.collect()
    assert any(issubclass(c.category, ResourceWarning) for c in caught)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "r"}, {"mode": "rw"}, {"block_bytes": 0}, {"block_bytes": 2.5}, {"heap_chunk_bytes": 8},
     {"rows_per_block": 0}, {"rows_per_block": 1.5}, {"compression": "snappy"}, {"compression": {"clevel": 12}},
     {"compression": {"cname": "lz4", "typo": 1}}, {"compression": 5}],
)  # fmt: skip
def test_bad_writer_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        rowstore.Writer(str(tmp_path / "a.h5"), Schema([Field("i", "int64")]), **kwargs)
    assert os.listdir(tmp_path) == []


def test_writer_needs_schema_and_directory(tmp_path):
    with pytest.raises(SchemaError):
        rowstore.Writer(str(tmp_path / "a.h5"), {"i": "int64"})
    with pytest.raises(FileNotFoundError):
        rowstore.Writer(str(tmp_path / "nodir" / "a.h5"), Schema([Field("i", "int64")]))


def test_stored_attributes(rs, h5path):
    schema = Schema([Field("i", "int64"), Field("t", "str")])
    rs.write_file(
        h5path,
        schema,
        [{"i": 1, "t": "x"}],
        rows_per_block=4,
        compression="zstd",
        heap_chunk_bytes=256,
    )
    with h5py.File(h5path, "r") as f:
        a = f["rowstore"].attrs
        # Compressed files carry the page index (of their chunks' raw bytes) too: format v3.
        assert (
            a["format"] == "rowstore"
            and int(a["format_version"]) == 3
            and rowstore.FORMAT_VERSION == 3
        )
        assert int(a["page_bytes"]) == 4096
        assert Schema.from_json(a["schema"]) == schema
        assert json.loads(a["compression"]) == {
            "id": "blosc2",
            "cname": "zstd",
            "clevel": 5,
            "shuffle": "byte",
        }
        assert (
            int(a["num_rows"]) == 1
            and int(a["rows_per_block"]) == 4
            and int(a["heap_chunk_bytes"]) == 256
        )
        assert int(a["heap_nbytes"]) == 1
        assert a["writer"] == f"rowstore {rowstore.__version__}"
        assert "32026" in f["rowstore/rows"]._filters and "32026" in f["rowstore/heap"]._filters


def test_file_permissions_follow_umask_and_survive_append(rs, h5path):
    schema = Schema([Field("i", "int64")])
    old = os.umask(0o022)
    try:
        rs.write_file(h5path, schema, [{"i": 1}])
    finally:
        os.umask(old)
    assert os.stat(h5path).st_mode & 0o777 == 0o644  # not mkstemp's 0o600
    os.chmod(h5path, 0o640)
    with rowstore.Writer(h5path, mode="a") as w:
        w.write({"i": 2})
    assert os.stat(h5path).st_mode & 0o777 == 0o640


@pytest.mark.parametrize("heap", [False, True])
def test_empty_file_block_size_then_append(rs, h5path, heap):
    """An empty file still gets blocks of about block_bytes, so a later append does not pad a
    huge first block (an empty file with heap fields used to get block_bytes *rows* per block)."""
    fields = [Field("i", "int64")] + ([Field("t", "str")] if heap else [])
    schema = Schema(fields)
    with rowstore.Writer(h5path, schema, block_bytes=4096, heap_chunk_bytes=4096):
        pass
    itemsize = Layout.open(h5path).row_dtype.itemsize
    assert 1 <= Layout.open(h5path).rows_per_block <= 4096 // itemsize
    with rowstore.Writer(h5path, mode="a") as w:
        for i in range(3):
            w.write({"i": i, **({"t": "x" * i} if heap else {})})
    assert os.path.getsize(h5path) < 64 * 1024
    assert [r["i"] for r in rs.read_rows(h5path)] == [0, 1, 2]


@pytest.mark.parametrize("batch", [False, True])
def test_input_memory_layouts(rs, h5path, batch):
    """Big-endian, non-contiguous (strided, transposed, negative strides) and read-only inputs
    are stored as the little-endian values they hold."""
    schema = Schema([
        Field("a", "float32", (3, 2)), Field("b", "int32", (None,)), Field("img", "uint8", (4, 3, 3), codec="png"),
        Field("be", "uint16", (2,)),
    ])  # fmt: skip
    base = np.arange(60, dtype=">f8").reshape(5, 3, 4)
    ints = np.arange(40, dtype=">i4")
    img = np.arange(4 * 3 * 3 * 2, dtype=np.uint8).reshape(3, 4, 2, 3)
    ro = np.array([7, 65535], ">u2")
    ro.flags.writeable = False
    rows = []
    for i in range(5):
        rows.append({"a": base[i, :, ::2] if i % 2 else base[i, ::-1, 1::2], "b": ints[::-(i + 1)][: i * 2],
                     "img": img.transpose(1, 0, 3, 2)[:, :, :, i % 2], "be": ro})  # fmt: skip
    rs.write_file(h5path, schema, rows, rows_per_block=2, batch=batch)
    got = rs.read_rows(h5path)
    for r, g in zip(rows, got, strict=True):
        assert np.array_equal(g["a"], np.asarray(r["a"], np.float32)) and g["a"].dtype == np.float32
        assert np.array_equal(g["b"], np.asarray(r["b"])) and g["b"].dtype.str == "<i4"
        assert np.array_equal(g["img"], r["img"])
        assert g["be"].tolist() == [7, 65535]


def test_failed_constructor_does_not_warn_or_leave_files(rs, h5path, tmp_path):
    schema = Schema([Field("i", "int64")])
    rs.write_file(h5path, schema, [{"i": 1}])
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    gc.collect()  # what earlier tests in this process left behind is not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(FileExistsError):
            rowstore.Writer(h5path, schema, mode="x")
        with pytest.raises(SchemaError):
            rowstore.Writer(h5path, Schema([Field("j", "int64")]), mode="a")
        with pytest.raises(rowstore.FormatError):
            rowstore.Writer(str(junk), mode="a")
        gc.collect()
    assert not [c for c in caught if issubclass(c.category, ResourceWarning)], [
        str(c.message) for c in caught
    ]
    assert sorted(os.listdir(tmp_path)) == ["data.h5", "junk.h5"]


@pytest.mark.parametrize("cname", ["lz4", "lz4hc", "zstd", "blosclz", "zlib"])
@pytest.mark.parametrize("shuffle", ["none", "byte", "bit"])
def test_every_blosc2_codec_and_shuffle(rs, h5path, schema_all_kinds, cname, shuffle):
    rows = rs.make_rows(schema_all_kinds, 9, seed=13)
    compression = {"cname": cname, "clevel": 1, "shuffle": shuffle}
    rs.write_file(
        h5path,
        schema_all_kinds,
        rows,
        rows_per_block=4,
        heap_chunk_bytes=128,
        compression=compression,
    )
    lay = Layout.open(h5path, scan=True)
    assert lay.compression == {"id": "blosc2", **compression}
    rs.assert_rows_equal(schema_all_kinds, rows, rs.read_rows(h5path))
    with h5py.File(h5path, "r") as f:  # HDF5's own Blosc2 filter agrees
        assert f["rowstore/rows"]["label"].tolist() == [int(r["label"]) for r in rows]
        assert len(f["rowstore/heap"][()]) == lay.heap_nbytes


def test_writing_through_a_symlink_replaces_its_target(tmp_path):
    import rowstore as rs_

    schema = rs_.Schema([rs_.Field("v", "int64")])
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "data.h5"
    link = tmp_path / "link.h5"
    with rs_.Writer(str(target), schema) as w:
        w.write({"v": 1})
    os.symlink(target, link)
    with rs_.Writer(str(link), schema, mode="a") as w:
        w.write({"v": 2})
    assert os.path.islink(link)
    assert rs_.open(str(target)).take([0, 1])["v"].tolist() == [1, 2]
    with rs_.Writer(str(link), schema) as w:
        w.write({"v": 3})
    assert os.path.islink(link) and rs_.open(str(link)).take([0])["v"].tolist() == [3]
    assert sorted(os.listdir(real_dir)) == ["data.h5"]


@pytest.mark.parametrize("fail", [False, True])
def test_compression_threads_give_the_same_file_and_stop(tmp_path, fail):
    """Blocks compressed on worker threads are written in order: the same chunks as on one
    thread; the threads stop at close and at abort."""
    import threading

    import rowstore as rs_

    schema = rs_.Schema([rs_.Field("x", "float32", (64,)), rs_.Field("s", rs_.STR)])
    rng = np.random.default_rng(0)
    rows = {
        "x": rng.standard_normal((3000, 64)).astype(np.float32),
        "s": [f"row {i}" * (i % 7) for i in range(3000)],
    }
    layouts = []
    for threads in (1, 3):
        path = str(tmp_path / f"t{threads}.h5")
        if fail:
            with pytest.raises(RuntimeError):
                with rs_.Writer(
                    path,
                    schema,
                    compression="zstd",
                    block_bytes=20_000,
                    heap_chunk_bytes=4096,
                    threads=threads,
                ) as w:
                    w.write_batch(rows)
                    raise RuntimeError("boom")
            assert not os.path.exists(path)
        else:
            with rs_.Writer(
                path,
                schema,
                compression="zstd",
                block_bytes=20_000,
                heap_chunk_bytes=4096,
                threads=threads,
            ) as w:
                w.write_batch(rows)
            layouts.append(rs_.Layout.open(path, scan=True))
        assert not [t for t in threading.enumerate() if t.name.startswith("rowstore-compress")]
    if not fail:
        a, b = layouts
        assert a.num_blocks > 5 and np.array_equal(a.blocks["checksum"], b.blocks["checksum"])
        assert np.array_equal(a.heap_chunks["checksum"], b.heap_chunks["checksum"])
        got = rs_.open(layouts[1].path).take(np.arange(3000))
        assert np.array_equal(got["x"], rows["x"]) and got["s"].tolist() == rows["s"]
    with pytest.raises(ValueError, match="threads"):
        rs_.Writer(str(tmp_path / "bad.h5"), schema, threads=0)


# -- allocation limits (spec.MAX_*) ----------------------------------------------------------
def test_limits_are_declared_in_spec():
    from rowstore.format import spec

    assert spec.MAX_CHUNK_BYTES == 1 << 30
    assert spec.MAX_CHUNK_BYTES < spec.MAX_VALUE_BYTES < spec.MAX_HEAP_BYTES


def test_row_larger_than_a_block_is_refused(tmp_path):
    schema = Schema(
        [Field("x", "uint8", (1 << 30,)), Field("y", "int8")]
    )  # 1 GiB + 1 byte: never allocated
    with pytest.raises(SchemaError, match="MAX_CHUNK_BYTES"):
        rowstore.Writer(str(tmp_path / "big.h5"), schema)
    assert os.listdir(tmp_path) == []


def test_value_larger_than_max_value_bytes_is_refused(rs, h5path, monkeypatch):
    from rowstore.format import spec

    monkeypatch.setattr(spec, "MAX_VALUE_BYTES", 64)
    schema = Schema(
        [Field("i", "int64"), Field("b", "bytes"), Field("v", "float64", (None,), nullable=True)]
    )
    ok = [{"i": 0, "b": b"x" * 64, "v": np.zeros(8)}, {"i": 1, "b": b"", "v": None}]
    with rowstore.Writer(h5path, schema, rows_per_block=2) as w:
        for r in ok:
            w.write(r)
        with pytest.raises(
            rowstore.RowValidationError, match=r"row 2: field 'v': a value of 72 bytes exceeds"
        ) as info:
            w.write({"i": 2, "b": b"", "v": np.zeros(9)})
        assert (info.value.field, info.value.row) == ("v", 2)
        with pytest.raises(
            rowstore.RowValidationError, match=r"row 3: field 'b': a value of 65 bytes"
        ):
            w.write_batch({"i": [2, 3], "b": [b"", b"y" * 65], "v": [None, None]})  # all or nothing
        assert w.num_rows == 2
        w.write({"i": 2, "b": b"z", "v": np.ones(1)})
    rs.assert_rows_equal(schema, ok + [{"i": 2, "b": b"z", "v": np.ones(1)}], rs.read_rows(h5path))


# -- an inline codec that is not raw ---------------------------------------------------------
class BigEndian(rowstore.Codec):
    """Fixed-shape numbers stored inline as big-endian bytes (a non-raw inline codec)."""

    codec_id = "test_big_endian"

    def check_field(self, field):
        if field.is_variable or field.dtype in ("str", "bytes"):
            raise SchemaError("test_big_endian stores fixed-shape numbers", field=field.name)

    def stored_nbytes(self, field):
        return field.fixed_nbytes

    def encode(self, value, field):
        return np.ascontiguousarray(value, dtype=field.dtype.newbyteorder(">")).tobytes()

    def decode_into(self, src, out):
        out[...] = np.frombuffer(src, out.dtype.newbyteorder(">")).reshape(out.shape)


def test_inline_codec_that_is_not_raw_is_stored_encoded(rs, tmp_path):
    schema = Schema([Field("i", "int32"), Field("e", "uint16", (3,), codec=BigEndian(), nullable=True),
                     Field("t", "str")])  # fmt: skip
    rows = [
        {"i": k, "e": None if k == 3 else np.array([k, 256 * k, 7], np.uint16), "t": "r" * k}
        for k in range(9)
    ]
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    rs.write_file(a, schema, rows, rows_per_block=4, heap_chunk_bytes=64)
    rs.write_file(b, schema, rows, rows_per_block=4, heap_chunk_bytes=64, batch=True)
    assert_same_content(a, b)
    with h5py.File(a, "r") as f:
        table = f["rowstore/rows"][()]
    assert table.dtype["e"] == np.dtype(("u1", (6,)))
    for k, r in enumerate(rows):
        if r["e"] is None:
            assert table["e__null"][k] and not table["e"][k].any()
        else:
            assert table["e"][k].tobytes() == r["e"].astype(">u2").tobytes()


# -- a heap smaller than one chunk ---------------------------------------------------------------
SMALL_HEAP_SCHEMA = Schema([Field("w", "float32", (None,)), Field("y", "int64")])


def _small_rows(n, start=0, k=50):
    return [
        {"w": np.arange((i % k) + 1, dtype=np.float32) + start, "y": start + i} for i in range(n)
    ]


def _assert_rows(path, rows):
    with rowstore.open(path) as r:
        b = r.take(np.arange(len(rows)))
    assert b["y"].tolist() == [row["y"] for row in rows]
    assert all(np.array_equal(a, row["w"]) for a, row in zip(b["w"], rows))


def test_a_small_heap_is_stored_as_one_chunk_of_its_size(tmp_path):
    """A file whose heap is smaller than heap_chunk_bytes (1 MiB by default) stored a 1 MiB
    chunk of zeros: its heap is now one HDF5 chunk of the heap's own size in whole pages of the
    page index; HDF5 (h5py) reads it as ever, and appending continues it."""
    p = str(tmp_path / "small.h5")
    rows = _small_rows(100)
    with rowstore.Writer(p, SMALL_HEAP_SCHEMA) as w:
        for row in rows:
            w.write(row)
    lay = check_layout(p, 100)
    H, hn = lay.heap_chunk_bytes, lay.heap_nbytes
    assert H == 1 << 20 and 0 < hn < 64 << 10
    page = rowstore.format.spec.PAGE_BYTES  # trimmed to whole pages of the page index
    whole = -(-hn // page) * page
    assert lay.heap_chunks["stored_nbytes"].tolist() == [whole]
    assert os.path.getsize(p) < H // 2  # no 1 MiB chunk of zeros
    with h5py.File(p, "r") as f:
        assert f["rowstore/heap"].chunks == (whole,) and f["rowstore/heap"].shape == (hn,)
        heap = f["rowstore/heap"][()]
    assert np.array_equal(heap[:8].view(np.float32), [0, 0])  # rows 0 and 1: [0.], [0., 1.][:1]
    _assert_rows(p, rows)
    from rowstore.cli import main

    assert main(["verify", p]) == 0
    # Appending: a few rows keep the heap below one chunk (trimmed again), many more grow it
    # into heap_chunk_bytes chunks.
    for n, k in ((10, 50), (3000, 500)):
        more = _small_rows(n, start=len(rows), k=k)
        with rowstore.Writer(p, mode="a") as w:
            for row in more:
                w.write(row)
        rows += more
        lay = check_layout(p, len(rows))
        _assert_rows(p, rows)
        assert main(["verify", p]) == 0
    assert len(lay.heap_chunks) == 3 and lay.heap_chunks["stored_nbytes"].tolist() == [H] * 3
    with h5py.File(p, "r") as f:
        assert f["rowstore/heap"].chunks == (H,)


def test_small_shards_share_the_dataset_heap_chunk_size(tmp_path):
    """Nine small shards: each stores its heap at its size (9 x 1 MiB of zeros before), and
    they still form one dataset (one heap_chunk_bytes)."""
    root = str(tmp_path / "ds")
    rows = _small_rows(900)
    infos = [
        rowstore.write_shard(root, SMALL_HEAP_SCHEMA, rows[i : i + 100]) for i in range(0, 900, 100)
    ]
    rowstore.commit(root, infos)
    shard_bytes = sum(os.path.getsize(os.path.join(root, i.path)) for i in infos)
    assert shard_bytes < 9 * (1 << 20) // 4
    _assert_rows(root, rows)
    with rowstore.open(root) as r:
        assert r.layout.heap_chunk_bytes == 1 << 20
        for batch in r.batches(64, shuffle="block", seed=3):  # whole-chunk loads of the heap too
            assert len(batch["y"]) <= 64


def test_a_compressed_small_heap_keeps_its_chunk_size(tmp_path):
    p = str(tmp_path / "c.h5")
    with rowstore.Writer(p, SMALL_HEAP_SCHEMA, compression="lz4") as w:
        w.write_batch({"w": [np.ones(3, np.float32)] * 10, "y": np.arange(10)})
    with h5py.File(p, "r") as f:
        assert f["rowstore/heap"].chunks == (1 << 20,)
    assert os.path.getsize(p) < 1 << 17  # the zeros compress away


def test_a_trimmed_heap_chunk_shorter_than_the_heap_is_refused():
    """Only a heap of one chunk may store it short, and never shorter than the heap's bytes."""
    from rowstore.errors import FormatError
    from rowstore.format import spec
    from rowstore.format.index import check_indexes

    def check(stored, heap_nbytes, n_chunks):
        blocks = np.zeros(1, spec.BLOCK_DTYPE)
        blocks["num_rows"], blocks["offset"], blocks["stored_nbytes"] = 1, 0, 8
        blocks["heap_end"] = heap_nbytes
        hc = np.zeros(n_chunks, spec.HEAP_CHUNK_DTYPE)
        hc["offset"] = 100 + np.arange(n_chunks) * 1000
        hc["stored_nbytes"] = stored

        def bad(_file, msg):
            return FormatError(msg)

        check_indexes(bad, blocks=blocks, heap_chunks=hc, rows=np.array([1]), rows_per_block=np.array([1]),
                      heap_nbytes=np.array([heap_nbytes]), file_size=np.array([10_000]),
                      block_counts=np.array([1]), heap_chunk_counts=np.array([n_chunks]), heap_chunk_bytes=1000,
                      row_size=8, compressed=False)  # fmt: skip

    check([500], 500, 1)  # trimmed to the heap
    check([1000], 500, 1)  # the full chunk
    with pytest.raises(FormatError, match="uncompressed heap chunk's stored size"):
        check([499], 500, 1)  # shorter than the heap's bytes
    with pytest.raises(FormatError, match="uncompressed heap chunk's stored size"):
        check(
            [1000, 700], 1700, 2
        )  # the last of two chunks: HDF5 chunks of one dataset are one size


@pytest.mark.parametrize("cname", ["lz4", "zstd"])
def test_incompressible_chunks_are_stored_memcpyd(h5path, cname):
    """A chunk saving less than BLOSC2_MIN_SAVING is Blosc2's memcpy'd chunk (its header says
    so; the file's declared compression is unchanged); compressible ones stay compressed. The
    index's sizes and CRCs are those of the stored frames; rowstore and h5py read both."""
    import zlib

    from rowstore.codecs.blocks import BLOSC2_MIN_SAVING

    schema = Schema([Field("k", "int64"), Field("b", "bytes")])
    rng = np.random.default_rng(5)
    # Payloads that compress by a few percent (5% zeros, then noise), like audio waveforms.
    noise = [bytes(150) + rng.integers(0, 256, 2850, dtype=np.uint8).tobytes() for _ in range(40)]
    rows = [{"k": i // 7, "b": noise[i]} for i in range(40)]
    compression = {"cname": cname, "clevel": 5, "shuffle": "byte"}
    with rowstore.Writer(
        h5path, schema, rows_per_block=16, heap_chunk_bytes=8192, compression=compression
    ) as w:
        for row in rows:
            w.write(row)
    lay = Layout.open(h5path, scan=True)
    assert lay.compression == {"id": "blosc2", **compression}
    a = lay.arrays()
    data = open(h5path, "rb").read()

    def memcpyd(offsets, stored, checksums, raw):
        out = []
        for off, n, crc in zip(offsets.tolist(), stored.tolist(), checksums.tolist()):
            frame = data[off : off + n]
            assert zlib.crc32(frame) == crc  # the index describes the stored frame
            h = int.from_bytes(frame[11:15], "big")
            flags, nbytes = frame[h + 2], int.from_bytes(frame[h + 4 : h + 8], "little")
            cbytes = int.from_bytes(frame[h + 12 : h + 16], "little")
            assert nbytes == raw
            out.append(bool(flags & 0x02))
            assert out[-1] == (cbytes == raw + 32)
            assert out[-1] or cbytes <= (1 - BLOSC2_MIN_SAVING) * raw
        return out

    heap = memcpyd(a["hc_offset"], a["hc_stored"], a["hc_checksum"], lay.heap_chunk_bytes)
    blocks = memcpyd(a["offset"], a["stored"], a["checksum"], lay.block_raw_bytes)
    assert all(heap[:-1]) and not any(blocks)  # random payloads; a counter and offsets
    got = rowstore.open(h5path).take(np.arange(40))
    assert got["k"].tolist() == [r["k"] for r in rows]
    assert [bytes(v) for v in got["b"]] == noise
    with h5py.File(h5path, "r") as f:  # HDF5's own Blosc2 filter reads memcpy'd chunks too
        assert f["rowstore/rows"]["k"].tolist()[:40] == [r["k"] for r in rows]
        assert bytes(f["rowstore/heap"][()][: lay.heap_nbytes]) == b"".join(noise)
