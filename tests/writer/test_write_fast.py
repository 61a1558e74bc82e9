"""The per-row fast path of ``Writer.write`` (``_ext/_rows.pyx`` through ``RowPacker.add_row_fast``)
against the Python path it short-cuts (``validate.check_value`` + ``RowPacker.add_row``): on
random rows mixing plain values, values only the Python path converts, and bad values, both
writers accept and refuse the same rows with the same errors and hold the same row bytes and
heap bytes after every row. Then the plan's own checks (descriptors, buffers, slots)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

import rowstore
from rowstore import Field, RowValidationError, Schema
from rowstore.format import spec
from rowstore.kernels import RowKind, RowPlan
from rowstore.writer import _pack

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def int_values(dt: np.dtype, rng) -> list:
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    other = np.int16 if dt != np.int16 else np.int32
    return [
        int(rng.integers(lo, hi, endpoint=True, dtype=np.int64 if dt.kind == "i" else np.uint64)),
        lo,
        hi,
        0,
        lo - 1,
        hi + 1,
        1 << 63,
        (1 << 63) - 1,
        -(1 << 63),
        -(1 << 63) - 1,
        1 << 64,
        1 << 70,
        True,
        False,
        dt.type(hi),
        other(7),
        1.0,
        1.5,
        "3",
        None,
        np.array(5),
        [5],
    ]


def float_values(dt: np.dtype, rng) -> list:
    f32max = float(np.finfo(np.float32).max)
    return [
        float(rng.standard_normal()),
        0.0,
        -0.0,
        math.nan,
        math.inf,
        -math.inf,
        1e300,
        -1e300,
        f32max,
        np.nextafter(f32max, math.inf),
        1e-46,
        5e-324,
        dt.type(1.25),
        np.float32(math.nan),
        np.float64(2.5),
        np.float16(0.5),
        3,
        True,
        1j,
        "x",
        None,
        np.array(1.0),
        [1.0],
    ]


def array_values(f: Field, rng) -> list:
    dt = np.dtype(f.dtype)
    shape = tuple(int(rng.integers(0, 4)) if d is None else d for d in f.shape)
    good = (
        (rng.standard_normal(shape) * 50).astype(dt) if dt.kind != "b" else rng.random(shape) < 0.5
    )
    wrong_dims = tuple(d + 1 for d in shape)
    wide = (good.real if dt.kind == "c" else good).astype(np.float64)
    out = [
        good,
        good.copy(),
        wide,
        good.astype(dt.newbyteorder(">")),
        np.zeros(wrong_dims, dt),
        good.reshape(-1),
        good.tolist(),
        np.zeros(shape, np.int64),
        np.full(shape, 1e300),
        np.ma.masked_array(good),
        np.zeros(shape + (2,), dt)[..., 0],
        None,
        "abc",
        3,
    ]
    if good.ndim >= 2:
        out.append(np.asfortranarray(good))
    return out


TEXT = [
    "",
    "plain",
    "héllo wörld",
    "日本語テキスト",
    "\ud800 lone",
    "x" * 40,
    np.str_("numpy str"),
    b"bytes",
    math.nan,
    None,
    5,
]
BLOBS = [
    b"",
    b"abc",
    bytes(range(256)),
    bytearray(b"ba"),
    memoryview(b"mv"),
    np.bytes_(b"nb"),
    "str",
    None,
    math.nan,
    7,
]


def candidates(f: Field, rng) -> list:
    if f.dtype == rowstore.STR:
        return TEXT
    if f.dtype == rowstore.BYTES:
        return BLOBS
    if f.shape:
        return array_values(f, rng)
    dt = np.dtype(f.dtype)
    if dt.kind == "b":
        return [
            True,
            False,
            np.bool_(True),
            np.bool_(False),
            1,
            0,
            1.0,
            None,
            np.array(True),
            "yes",
        ]
    if dt.kind in "iu":
        return int_values(dt, rng)
    return float_values(dt, rng)


def good_value(f: Field, rng):
    """A value the fast path stores (plain Python, or an exact ndarray)."""
    if f.dtype == rowstore.STR:
        return ["ok", "né", ""][int(rng.integers(3))]
    if f.dtype == rowstore.BYTES:
        return bytes(rng.integers(0, 256, int(rng.integers(0, 9)), dtype=np.uint8))
    if f.shape:
        return array_values(f, rng)[0]
    dt = np.dtype(f.dtype)
    if dt.kind == "b":
        return bool(rng.random() < 0.5)
    if dt.kind in "iu":
        return int_values(dt, rng)[0]
    return float(rng.standard_normal())


SCHEMAS = {
    "ints": Schema([Field(f"f_{t}", t) for t in INTS]),
    "floats_bool": Schema([Field("a", "float32"), Field("b", "float64"), Field("c", "bool")]),
    "arrays": Schema(
        [
            Field("v", "float32", (4,)),
            Field("m", "int16", (2, 3)),
            Field("h", "float16", (3,)),
            Field("z", "complex64", (2,)),
            Field("q", "bool", (5,)),
        ]
    ),
    "heap": Schema(
        [
            Field("s", "str"),
            Field("b", "bytes"),
            Field("w", "int32", (None,)),
            Field("g", "uint16", (None, 3, None)),
        ]
    ),
    "nullable": Schema(
        [
            Field("i", "int32", nullable=True),
            Field("x", "float32", nullable=True),
            Field("s", "str", nullable=True),
            Field("v", "float64", (3,), nullable=True),
            Field("w", "uint8", (None,), nullable=True),
            Field("k", "bool", nullable=True),
        ]
    ),
    "bench_row": Schema(
        [
            Field("id", "int64"),
            Field("label", "float32"),
            Field("name", "str"),
            Field("vector", "float32", (16,)),
            Field("flag", "bool"),
            Field("score", "float64"),
        ]
    ),
}


def outcome(w: rowstore.Writer, row) -> tuple | None:
    try:
        w.write(row)
    except RowValidationError as exc:
        return type(exc), str(exc), exc.field, exc.row
    return None


def state(w: rowstore.Writer) -> tuple[bytes, bytes, int, int]:
    p = w._packer
    return p.rows[: p.n].tobytes(), bytes(p.heap), p.heap_pos, p.num_rows


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_fast_path_equals_python_path(tmp_path, name):
    schema = SCHEMAS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    fast = rowstore.Writer(tmp_path / "fast.h5", schema, rows_per_block=100_000)
    slow = rowstore.Writer(tmp_path / "slow.h5", schema, rows_per_block=100_000)
    slow._packer._fast = None  # every row through check_value + add_row
    assert fast._packer._fast is not None, "every field of these schemas has a fast path"
    took = []
    add = fast._packer.add_row_fast
    fast._packer.add_row_fast = lambda row: took.append(add(row)) or took[-1]  # type: ignore[method-assign]
    refused = 0
    for k in range(400):
        row = {f.name: good_value(f, rng) for f in schema}
        if k % 2:  # one field (sometimes two) from the hard cases
            for _ in range(1 + (k % 5 == 1)):
                f = schema[schema.names[int(rng.integers(len(schema)))]]
                vals = candidates(f, rng)
                row[f.name] = vals[int(rng.integers(len(vals)))]
        if k % 37 == 5:
            del row[schema.names[0]]
        if k % 41 == 7:
            row["unknown"] = 1
        arg = types.MappingProxyType(row) if k % 53 == 11 else row
        got, want = outcome(fast, arg), outcome(slow, arg)
        assert got == want, f"row {k} {row!r}"
        refused += want is not None
        assert state(fast) == state(slow), f"after row {k} {row!r}"
    assert took.count(True) > 100 and took.count(False) > 20 and refused > 20
    rows_fast = (fast._packer.rows[: fast._packer.n].copy(), bytes(fast._packer.heap))
    for w in (fast, slow):
        w.close()
    got = rowstore.open(tmp_path / "fast.h5")
    assert len(got) == len(rows_fast[0])


def test_bench_row_reads_back_across_blocks_and_heap_chunks(rs, tmp_path):
    schema = SCHEMAS["bench_row"]
    rng = np.random.default_rng(1)
    rows = [{f.name: good_value(f, rng) for f in schema} for _ in range(700)]
    for i in range(0, 700, 7):
        rows[i]["label"] = np.float64(i)  # a value only the Python path converts, between fast rows
    rows[3]["name"] = "x" * 300  # one payload wider than a heap chunk
    path = rs.write_file(tmp_path / "a.h5", schema, rows, heap_chunk_bytes=64, block_bytes=4096)
    expected = [{**r, "label": np.float32(r["label"])} for r in rows]
    rs.assert_rows_equal(schema, expected, rs.read_rows(path))
    lay = rowstore.open(path).layout
    assert lay.num_blocks > 3


def test_bad_rows_in_a_stream_of_fast_rows_keep_nothing(tmp_path):
    schema = SCHEMAS["heap"]
    with rowstore.Writer(tmp_path / "a.h5", schema) as w:
        good = {
            "s": "abc",
            "b": b"xy",
            "w": np.arange(3, dtype=np.int32),
            "g": np.zeros((1, 3, 2), np.uint16),
        }
        w.write(good)
        heap = bytes(w._packer.heap)
        bad = dict(
            good, g=np.zeros((1, 4, 2), np.uint16)
        )  # the last field is bad: the others were packed first
        with pytest.raises(RowValidationError, match=r"row 1: field 'g'") as exc:
            w.write(bad)
        assert exc.value.field == "g" and exc.value.row == 1
        assert bytes(w._packer.heap) == heap and w.num_rows == 1
        assert (
            not w._packer.rows[1:].tobytes().strip(b"\0")
        )  # the slot the fast path began is zeroed
        w.write(good)
    assert len(rowstore.open(tmp_path / "a.h5")) == 2


@pytest.mark.parametrize(
    "field",
    [
        Field("t", "datetime64[ns]"),
        Field("h", "float16"),
        Field("c", "complex128"),
        Field("img", "uint8", (4, 4, 3), codec="png"),
    ],
)
def test_fields_without_a_fast_path_disable_it(tmp_path, rs, field):
    schema = Schema([Field("i", "int64"), field])
    assert _pack.fast_plan(schema, spec.row_dtype(schema)) is None
    rng = np.random.default_rng(0)
    value = rs.make_value(field, rng) if field.shape else np.array(0).astype(field.dtype)[()]
    path = rs.write_file(tmp_path / "a.h5", schema, [{"i": 1, field.name: value}])
    assert rs.read_rows(path)[0]["i"] == 1


def test_plan_refuses_descriptors_outside_the_row():
    dtype = np.dtype("<i8")

    def desc(kind, offset, size=8, null=-1, dims=(), shape_offset=-1):
        return ("x", int(kind), offset, null, size, 0, 1, dtype, dtype.type, dims, shape_offset)

    RowPlan([desc(RowKind.K_INT, 0)], 8, 10, 10)  # fits
    bad = [
        desc(RowKind.K_INT, 1),
        desc(RowKind.K_INT, -1),
        desc(RowKind.K_INT, 0, size=3),
        desc(RowKind.K_INT, 0, null=8),
        desc(RowKind.K_ARRAY, 0, size=16, dims=(2,)),
        desc(RowKind.K_STR, 1),
        desc(RowKind.K_VARRAY, 0, dims=(-1,), shape_offset=16),
        desc(RowKind.K_VARRAY, 0, dims=(2,), shape_offset=0),
        desc(99, 0),
    ]
    for d in bad:
        with pytest.raises(ValueError, match="RowPlan"):
            RowPlan([d], 8 if d[1] not in (RowKind.K_STR, RowKind.K_VARRAY) else 16, 10, 10)


def test_plan_checks_its_buffer_and_slot():
    schema = Schema([Field("i", "int64"), Field("s", "str")])
    dt = spec.row_dtype(schema)
    plan = _pack.fast_plan(schema, dt)
    assert plan is not None
    heap = bytearray()
    assert plan.pack({"i": 1, "s": "a"}, 0, heap, 0) == -1  # no buffer yet
    buf = np.zeros(2, dt)
    with pytest.raises(ValueError, match="whole number"):
        plan.set_rows(buf.view(np.uint8)[:-1])
    with pytest.raises((BufferError, ValueError)):
        plan.set_rows(np.zeros(4, dt)[::2])  # not contiguous
    plan.set_rows(buf)
    assert (
        plan.pack({"i": 1, "s": "a"}, 2, heap, 0) == -1
        and plan.pack({"i": 1, "s": "a"}, -1, heap, 0) == -1
    )
    assert plan.pack({"i": 7, "s": "héllo"}, 1, heap, 5) == 5 + len("héllo".encode())
    assert buf["i"][1] == 7 and buf["s"]["offset"][1] == 5 and bytes(heap) == "héllo".encode()
    assert plan.pack({"i": 7, "s": "x"}, 0, heap, spec.MAX_HEAP_BYTES) == -1  # the heap limit
    assert bytes(heap) == "héllo".encode() and not buf[0].tobytes().strip(b"\0")


def test_key_order_and_key_objects_do_not_matter():
    """A dict in schema order with the schema's name objects is read in order; other key orders
    and equal names that are other str objects are looked up: the same bytes, still fast."""
    schema = SCHEMAS["bench_row"]
    rng = np.random.default_rng(3)
    row = {f.name: good_value(f, rng) for f in schema}
    shuffled = {k: row[k] for k in reversed(list(row))}
    copies = {"".join(list(k)): v for k, v in row.items()}  # equal keys, new str objects
    assert all(a is not b for a, b in zip(copies, row))
    plan = _pack.fast_plan(schema, spec.row_dtype(schema))
    out = []
    for r in (row, shuffled, copies):
        buf, heap = np.zeros(1, spec.row_dtype(schema)), bytearray()
        plan.set_rows(buf)
        assert plan.pack(r, 0, heap, 0) == len(row["name"].encode())
        out.append((buf.tobytes(), bytes(heap)))
    assert out[0] == out[1] == out[2]
