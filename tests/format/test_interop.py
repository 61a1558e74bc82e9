"""Files are ordinary HDF5: h5py (with hdf5plugin) and PyTables read the row table and the heap,
uncompressed and compressed, and find exactly what was written.

PyTables runs in a subprocess that imports neither h5py nor hdf5plugin, to show that it decodes
the Blosc2 chunks with its own filter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rowstore import Field, Schema

h5py = pytest.importorskip("h5py")
pytest.importorskip("hdf5plugin")

COMPRESSIONS = [None, "lz4", "zstd", {"cname": "blosclz", "clevel": 9, "shuffle": "none"}]
COMPRESSION_IDS = ["none", "lz4", "zstd", "blosclz-dict"]


def interop_schema() -> Schema:
    return Schema([
        Field("fixed", "float32", (2, 3)),
        Field("label", "int64", nullable=True),
        Field("flag", "bool"),
        Field("u", "uint64"),
        Field("h", "float16", (2,)),
        Field("c", "complex64"),
        Field("text", "str", nullable=True),
        Field("blob", "bytes"),
        Field("wave", "float32", (None,)),
        Field("grid", "int16", (None, 3, None), nullable=True),
        Field("image", "uint8", (6, 5, 3), codec={"id": "png", "level": 1}),
    ])  # fmt: skip


def interop_rows(rs, schema, n=23):
    rows = rs.make_rows(schema, n, seed=21)
    # a whole block (rows 8..11 with rows_per_block=4) of zeros/empties: all-zero chunks
    for i in range(8, 12):
        rows[i].update(fixed=np.zeros((2, 3), np.float32), label=0, flag=False, u=0, h=np.zeros(2, np.float16),
                       c=0j, text="", blob=bytes(200), wave=np.zeros(0, np.float32), grid=np.zeros((0, 3, 0), np.int16),
                       image=np.zeros((6, 5, 3), np.uint8))  # fmt: skip
    return rows


def expected_payload(field, value) -> bytes:
    if field.dtype == "str":
        return value.encode("utf-8")
    if field.dtype == "bytes":
        return bytes(value)
    if field.codec["id"] == "raw":
        return np.ascontiguousarray(value, dtype=field.dtype).tobytes()
    return bytes(field.codec_obj.encode(np.asarray(value, field.dtype), field))


def check_table(schema, rows, table: np.ndarray, heap: bytes, *, exact_dtypes: bool = True) -> None:
    """``table``: the /rowstore/rows compound array as read by a third-party library.

    PyTables reads h5py's bool (an HDF5 enum of int8) as int8: same bytes, other dtype, hence
    ``exact_dtypes=False`` for it."""
    n = len(rows)
    assert len(table) == n
    names = table.dtype.names
    for f in schema:
        assert f.name in names
        col = table[f.name]
        if f.nullable:
            assert table[f.name + "__null"].tolist() == [r.get(f.name) is None for r in rows], (
                f.name
            )
        if f.inline:
            exp = np.stack([np.zeros(f.shape, f.dtype) if r.get(f.name) is None else np.asarray(r[f.name], f.dtype)
                            for r in rows])  # fmt: skip
            if exact_dtypes:
                assert col.dtype.base == f.dtype, (f.name, col.dtype)
            assert col.dtype.base.itemsize == f.dtype.itemsize, (f.name, col.dtype)
            assert np.ascontiguousarray(col).tobytes() == exp.tobytes(), f.name
            continue
        for i, r in enumerate(rows):
            off, nb = int(col["offset"][i]), int(col["nbytes"][i])
            v = r.get(f.name)
            if v is None:
                assert nb == 0, (f.name, i)
                continue
            assert heap[off : off + nb] == expected_payload(f, v), (f.name, i)
            if f.variable_dims:
                assert list(np.atleast_1d(col["shape"][i])) == [
                    v.shape[d] for d in f.variable_dims
                ], (f.name, i)


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_h5py_reads_the_table_and_heap(rs, h5path, compression):
    schema = interop_schema()
    rows = interop_rows(rs, schema)
    rs.write_file(
        h5path, schema, rows, rows_per_block=4, heap_chunk_bytes=64, compression=compression
    )
    with h5py.File(h5path, "r") as f:
        g = f["rowstore"]
        ds = g["rows"]
        assert ds.shape == (len(rows),) and ds.chunks == (4,)
        assert ("32026" in ds._filters) == (compression is not None)
        table = ds[()]
        heap = g["heap"][()].tobytes()
        assert g["heap"].dtype == np.uint8 and g["heap"].chunks == (64,)
        # row-by-row and sliced reads through HDF5 agree with the whole read
        assert ds[5].tobytes() == table[5].tobytes()
        assert ds[3:13].tobytes() == table[3:13].tobytes()
        assert g["blocks"].shape == (6,) and g["heap_chunks"].shape == (-(-len(heap) // 64),)
        assert json.loads(g.attrs["schema"]) == schema.to_json()
    check_table(schema, rows, table, heap)
    rs.assert_rows_equal(schema, rows, rs.read_rows(h5path))


PYTABLES_DUMP = """
import sys
import numpy as np
import tables

path, out = sys.argv[1], sys.argv[2]
with tables.open_file(path, "r") as f:
    t = f.get_node("/rowstore/rows")
    rows = t.read()
    one = t[5]
    part = t.read(3, 13)
    heap = f.get_node("/rowstore/heap").read()
    filters = repr(t.filters)
    blocks = f.get_node("/rowstore/blocks").read()
    attrs = {k: str(f.get_node_attr("/rowstore", k)) for k in ("format", "format_version", "num_rows")}
assert "h5py" not in sys.modules and "hdf5plugin" not in sys.modules, "PyTables must decode on its own"
assert "rowstore" not in sys.modules
np.save(out + "rows.npy", rows)
np.save(out + "heap.npy", heap)
np.save(out + "one.npy", np.asarray(one))
np.save(out + "part.npy", part)
np.save(out + "blocks.npy", blocks)
print(filters)
print(attrs)
"""


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_pytables_reads_the_table_and_heap_without_hdf5plugin(rs, h5path, tmp_path, compression):
    pytest.importorskip("tables")
    schema = interop_schema()
    rows = interop_rows(rs, schema)
    rs.write_file(
        h5path, schema, rows, rows_per_block=4, heap_chunk_bytes=64, compression=compression
    )
    prefix = str(tmp_path / "dump_")
    proc = rs.run_python(PYTABLES_DUMP, h5path, prefix)
    assert proc.returncode == 0, proc.stderr
    if compression is not None:
        assert "blosc2" in proc.stdout.lower()
    assert "'format': 'rowstore'" in proc.stdout and "'num_rows': '23'" in proc.stdout
    table = np.load(prefix + "rows.npy")
    heap = np.load(prefix + "heap.npy").tobytes()
    check_table(schema, rows, table, heap, exact_dtypes=False)
    assert np.load(prefix + "part.npy").tobytes() == table[3:13].tobytes()
    assert np.load(prefix + "one.npy").tobytes() == table[5].tobytes()
    with h5py.File(h5path, "r") as f:
        assert table.tobytes() == f["rowstore/rows"][()].tobytes()
        assert np.load(prefix + "blocks.npy").tobytes() == f["rowstore/blocks"][()].tobytes()


def test_pytables_reads_a_file_without_heap(rs, h5path, tmp_path):
    pytest.importorskip("tables")
    schema = Schema(
        [Field("x", "float64", (9, 9, 27)), Field("bar", "int64", (9, 27)), Field("baz", "float64")]
    )
    rng = np.random.default_rng(22)
    rows = [
        {
            "x": rng.standard_normal((9, 9, 27)),
            "bar": rng.integers(-99, 99, (9, 27)),
            "baz": float(i),
        }
        for i in range(7)
    ]
    rs.write_file(h5path, schema, rows, rows_per_block=3, compression="zstd")
    code = """
    import sys, numpy as np, tables
    with tables.open_file(sys.argv[1]) as f:
        assert "/rowstore/heap" not in f
        np.save(sys.argv[2], f.root.rowstore.rows.read())
    assert "h5py" not in sys.modules and "hdf5plugin" not in sys.modules
    """
    out = str(tmp_path / "t.npy")
    proc = rs.run_python(code, h5path, out)
    assert proc.returncode == 0, proc.stderr
    check_table(schema, rows, np.load(out), b"", exact_dtypes=False)
