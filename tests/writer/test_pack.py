"""The row packer (rowstore.writer._pack), without HDF5: packed rows and heap bytes decode back
to the values with plain numpy against spec.row_dtype / spec.heap_ref_dtype; batches pack the
same bytes as rows; blocks and heap chunks are cut as the format says; failures undo; limits."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import CodecError, Field, RowValidationError, Schema, SchemaError
from rowstore.format import spec
from rowstore.writer import _pack
from rowstore.writer._pack import PackerTail, RowPacker


def decode_rows(packer: RowPacker, schema: Schema) -> list[dict]:
    """Every pending row back to values, with numpy only (the format, not the reader)."""
    assert packer.rows.dtype == spec.row_dtype(schema)
    heap = bytes(packer.heap)
    assert packer.heap_flushed == 0  # the whole heap is still pending
    out = []
    for i in range(packer.n):
        row = {}
        for f in schema:
            if f.nullable and packer.rows[f.name + spec.NULL_SUFFIX][i]:
                row[f.name] = None
                continue
            if f.inline:
                row[f.name] = np.array(packer.rows[f.name][i], dtype=f.dtype)
                continue
            ref = packer.rows[f.name][i]
            assert ref.dtype == spec.heap_ref_dtype(f)
            payload = heap[int(ref["offset"]) : int(ref["offset"]) + int(ref["nbytes"])]
            if f.dtype == rowstore.STR:
                row[f.name] = payload.decode("utf-8")
            elif f.dtype == rowstore.BYTES:
                row[f.name] = payload
            elif f.codec["id"] == "raw":
                row[f.name] = np.frombuffer(payload, dtype=f.dtype).reshape(value_shape(f, ref))
            else:  # an image codec: its payload is decoded by its library
                row[f.name] = f.codec_obj.decode(payload, value_shape(f, ref), f)
        out.append(row)
    return out


def value_shape(f: Field, ref) -> tuple[int, ...]:
    """A heap value's shape: the fixed dimensions, and the variable ones from the reference."""
    dims = iter(ref["shape"].tolist()) if "shape" in ref.dtype.names else iter(())
    return tuple(next(dims) if d is None else d for d in f.shape)


def pack(schema, rows, *, batch=False, capacity=4):
    """A packer holding ``rows``, added one by one or as one batch (validated as the writer
    does)."""
    from rowstore.writer.values import check_column, check_value

    p = RowPacker(schema, capacity=capacity)
    if batch:
        parts = []
        for f in schema:
            col = [r.get(f.name) for r in rows]
            if f.inline and all(v is not None for v in col):
                col = np.stack([np.asarray(v, dtype=f.dtype) for v in col])
            parts.append(check_column(f, col, len(rows), 0)[0])
        p.add_columns(parts, len(rows))
    else:
        for i, r in enumerate(rows):
            p.add_row([check_value(f, r.get(f.name), i) for f in schema])
    return p


def test_packed_rows_decode_back_with_numpy(rs, schema_all_nullable):
    schema = schema_all_nullable
    rows = rs.make_rows(schema, 30, seed=5)
    p = pack(schema, rows)
    assert p.n == 30 and p.num_rows == 30 and p.rows_written == 0
    got = decode_rows(p, schema)
    for i, (e, g) in enumerate(zip(rows, got)):
        for f in schema:
            rs.assert_value_equal(e[f.name], g[f.name], f, f"row {i}: ")
    # payloads in row order, field by field; a null heap value is empty at the current offset
    ends = [0]
    for i in range(p.n):
        for f in schema:
            if not f.inline:
                ref = p.rows[f.name][i]
                assert int(ref["offset"]) == ends[-1]
                ends.append(int(ref["offset"] + ref["nbytes"]))
    assert ends[-1] == p.heap_pos == len(p.heap)


def test_batches_pack_the_same_bytes_as_rows(rs, schema_all_kinds, schema_all_nullable):
    for schema in (schema_all_kinds, schema_all_nullable):
        rows = rs.make_rows(schema, 17, seed=9)
        a, b = pack(schema, rows), pack(schema, rows, batch=True)
        assert a.rows[: a.n].tobytes() == b.rows[: b.n].tobytes()
        assert a.heap == b.heap and a.heap_pos == b.heap_pos


def test_raw_inline_columns_are_assigned_in_one_call(rs):
    schema = Schema([Field("x", "float32", (3,)), Field("k", "int8", nullable=True)])
    p = RowPacker(schema)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    p.add_columns([x, np.array([1, 2, 3, 4], np.int8)], 4)
    assert np.array_equal(p.rows["x"][:4], x) and not p.rows["k__null"][:4].any()
    assert p.rows.dtype.names == ("x", "k", "k__null")


def test_blocks_are_cut_with_their_heap_ranges():
    schema = Schema([Field("i", "int32"), Field("b", "bytes", nullable=True)])
    p = RowPacker(schema, capacity=4)
    values = [None if i % 3 == 1 else bytes([i]) * i for i in range(10)]
    for i, v in enumerate(values):
        p.add_row([np.array(i, np.int32), v])
    full = p.peek_block(4, 4)
    assert np.shares_memory(full.rows, p.rows)  # a full block is written from the buffer, no copy
    assert (full.num_rows, full.heap_start, full.heap_end) == (4, 0, 0 + 2 + 3)
    p.pop_block(full, 4)
    assert (p.n, p.rows_written, p.block_heap_start) == (6, 4, 5)
    assert p.rows["i"][:6].tolist() == [4, 5, 6, 7, 8, 9]
    part = p.peek_block(3, 8)  # the last, partial block: a zero-filled copy of rows_per_block rows
    assert (
        len(part.rows) == 8
        and part.rows["i"][:3].tolist() == [4, 5, 6]
        and not part.rows[3:].tobytes().strip(b"\0")
    )
    assert (part.heap_start, part.heap_end) == (5, 5 + 5 + 6)  # row 4 is null
    p.pop_block(part, 8)
    assert len(p.rows) == 8 and p.n == 3 and p.rows["i"][:3].tolist() == [7, 8, 9]


def test_block_of_null_payloads_keeps_its_heap_start():
    schema = Schema([Field("b", "bytes", nullable=True)])
    p = RowPacker(schema)
    p.add_row([b"abc"])
    p.pop_block(p.peek_block(1, 1), 1)
    p.add_row([None])
    blk = p.peek_block(1, 1)
    assert (blk.heap_start, blk.heap_end) == (3, 3)


def test_heap_chunks():
    schema = Schema([Field("b", "bytes")])
    p = RowPacker(schema)
    for k in range(3):
        p.add_row([bytes([k + 1]) * 50])
    chunks = list(p.heap_chunks(64, final=False))
    assert [(len(c), e) for c, e in chunks] == [(64, 64), (64, 128)]
    assert chunks[0][0] == b"\x01" * 50 + b"\x02" * 14
    assert p.heap_flushed == 128 and len(p.heap) == 22
    last = list(p.heap_chunks(64, final=True))
    assert [(len(c), e) for c, e in last] == [(64, 150)]
    assert last[0][0] == b"\x03" * 22 + bytes(42)  # zero-filled
    assert p.heap_flushed == p.heap_pos == 150 and not p.heap


class Boom(rowstore.Codec):
    """A heap codec that fails on values of size 3 (to test that a failed add is undone)."""

    codec_id = "test_boom"

    def check_field(self, field):
        pass

    def encode(self, value, field):
        if value.size == 3:
            raise CodecError("boom", codec=self.codec_id, field=field.name)
        return value.tobytes()

    def decode_into(self, src, out):
        out[...] = np.frombuffer(src, out.dtype).reshape(out.shape)


def test_failed_add_is_undone():
    schema = Schema(
        [Field("a", "bytes"), Field("v", "float32", (None,), codec=Boom()), Field("k", "int8")]
    )
    p = RowPacker(schema)
    ok = [b"xy", np.zeros(2, np.float32), np.array(1, np.int8)]
    p.add_row(ok)
    state = (p.n, bytes(p.heap), p.heap_pos, p.rows[:1].tobytes())
    with pytest.raises(CodecError):
        p.add_row([b"stored before the failure", np.zeros(3, np.float32), np.array(2, np.int8)])
    assert (p.n, bytes(p.heap), p.heap_pos, p.rows[:1].tobytes()) == state
    with pytest.raises(CodecError):
        p.add_columns(
            [
                [b"a", b"b"],
                [np.zeros(1, np.float32), np.zeros(3, np.float32)],
                np.array([3, 4], np.int8),
            ],
            2,
        )
    assert (p.n, bytes(p.heap), p.heap_pos, p.rows[:1].tobytes()) == state
    assert not p.rows[1:].tobytes().strip(b"\0")  # half-filled slots are cleared
    p.add_row(ok)
    assert p.n == 2 and p.heap_pos == 2 * (2 + 8)


# -- an inline codec that is not raw ---------------------------------------------------------
class Q16(rowstore.Codec):
    """float32 values of a fixed shape, stored inline as big-endian int16 hundredths."""

    codec_id = "test_q16"

    def check_field(self, field):
        if field.dtype != np.float32 or field.is_variable:
            raise SchemaError("test_q16 stores fixed-shape float32", field=field.name)

    def stored_nbytes(self, field):
        return 2 * int(np.prod(field.shape, dtype=np.int64))

    def encode(self, value, field):
        return np.round(np.asarray(value) * 100).astype(">i2").tobytes()

    def decode_into(self, src, out):
        out[...] = np.frombuffer(src, ">i2").reshape(out.shape) / 100


class Q16Short(Q16):
    codec_id = "test_q16_short"

    def encode(self, value, field):
        return super().encode(value, field)[:-1]


def q16_schema(codec=None) -> Schema:
    return Schema(
        [Field("i", "int64"), Field("q", "float32", (2, 3), codec=codec or Q16(), nullable=True)]
    )


def test_row_dtype_of_an_inline_codec_that_is_not_raw():
    schema = q16_schema()
    assert schema["q"].inline
    assert spec.row_dtype(schema) == np.dtype(
        [("i", "<i8"), ("q", "u1", (12,)), ("q__null", "|b1")]
    )


def test_inline_codec_values_are_stored_encoded():
    schema = q16_schema()
    vals = [np.arange(6, dtype=np.float32).reshape(2, 3) * k / 7 for k in range(5)]
    vals[2] = None
    rows = [{"i": k, "q": v} for k, v in enumerate(vals)]
    for batch in (False, True):
        p = pack(schema, rows, batch=batch)
        for k, v in enumerate(vals):
            stored = p.rows["q"][k]
            if v is None:
                assert p.rows["q__null"][k] and not stored.any()
            else:
                assert stored.tobytes() == Q16().encode(v, schema["q"])
                back = np.frombuffer(stored.tobytes(), ">i2").reshape(2, 3) / 100  # plain numpy
                assert np.allclose(back, v, atol=0.005)
    # a whole ndarray column of a non-raw inline field is encoded row by row too
    p = RowPacker(Schema([Field("q", "float32", (2, 3), codec=Q16())]))
    p.add_columns([np.stack([vals[0], vals[1]])], 2)
    assert p.rows["q"][1].tobytes() == Q16().encode(vals[1], schema["q"])


def test_inline_codec_of_the_wrong_length_is_an_error():
    schema = q16_schema(Q16Short())
    p = RowPacker(schema)
    with pytest.raises(
        CodecError,
        match=r"row 0: field 'q': codec 'test_q16_short' encoded a value into 11 bytes; its "
        r"stored_nbytes is 12",
    ) as info:
        p.add_row([np.array(1), np.zeros((2, 3), np.float32)])
    assert info.value.field == "q" and p.n == 0


# -- limits ----------------------------------------------------------------------------------
def test_value_nbytes():
    assert _pack.value_nbytes(np.zeros((3, 4), np.float64)) == 96
    assert _pack.value_nbytes("abc") == 3 and _pack.value_nbytes("é€😀") == 2 + 3 + 4
    assert _pack.value_nbytes(b"\0" * 7) == 7


def test_check_value_size(monkeypatch):
    monkeypatch.setattr(spec, "MAX_VALUE_BYTES", 8)
    f = Field("t", "str")
    _pack.check_value_size(f, "12345678", 3)
    _pack.check_value_size(f, None, 3)
    _pack.check_value_size(f, "éé", 3)  # 4 UTF-8 bytes, under the bound without encoding
    with pytest.raises(
        RowValidationError,
        match=r"row 3: field 't': a value of 10 bytes exceeds .*MAX_VALUE_BYTES = 8",
    ) as info:
        _pack.check_value_size(f, "ééééé", 3)
    assert (info.value.field, info.value.row) == ("t", 3)
    with pytest.raises(RowValidationError, match="a value of 9 bytes"):
        _pack.check_value_size(Field("b", "bytes"), b"123456789", 0)
    with pytest.raises(RowValidationError, match="a value of 16 bytes"):
        _pack.check_value_size(Field("v", "float64", (None,)), np.zeros(2), 0)


class Pad(rowstore.Codec):
    """A heap codec whose payload is larger than the value (16 bytes of padding)."""

    codec_id = "test_pad"

    def check_field(self, field):
        pass

    def encode(self, value, field):
        return value.encode() + bytes(16)

    def decode_into(self, src, out):
        raise NotImplementedError


def test_payload_and_heap_limits(monkeypatch):
    schema = Schema([Field("k", "int8"), Field("t", "str", codec=Pad())])
    p = RowPacker(schema)
    monkeypatch.setattr(spec, "MAX_VALUE_BYTES", 20)
    p.add_row([np.array(0, np.int8), "abcd"])  # 20-byte payload
    with pytest.raises(
        RowValidationError,
        match=r"row 1: field 't': a stored payload of 21 bytes exceeds .*MAX_VALUE_BYTES",
    ) as info:
        p.add_row([np.array(1, np.int8), "abcde"])
    assert info.value.row == 1 and p.n == 1 and p.heap_pos == 20
    monkeypatch.setattr(spec, "MAX_HEAP_BYTES", 50)
    p.add_row([np.array(1, np.int8), "abcd"])
    with pytest.raises(
        RowValidationError,
        match=r"row 2: field 't': the heap with this payload \(60 bytes\) exceeds .*MAX_HEAP_BYTES "
        r"= 50",
    ):
        p.add_row([np.array(2, np.int8), "abcd"])
    assert p.n == 2 and p.heap_pos == 40


# -- sizing and resuming ---------------------------------------------------------------------
def test_block_sizing_helpers(monkeypatch):
    assert _pack.max_rows_per_block(72) == spec.MAX_CHUNK_BYTES // 72
    assert _pack.max_rows_per_block(spec.MAX_CHUNK_BYTES + 1) == 1
    assert _pack.first_rows_per_block(0, 0, 100, 4096) == 40  # an empty file: the row's own size
    assert _pack.first_rows_per_block(3, 3 * 500, 100, 4096) == 8  # 500 bytes per row so far
    assert _pack.first_rows_per_block(50, 50 * 10, 10, 100) == 50  # at least the rows pending
    monkeypatch.setattr(spec, "MAX_CHUNK_BYTES", 1000)
    assert _pack.first_rows_per_block(0, 0, 10, 1 << 20) == 100


def test_resume_continues_a_tail():
    schema = Schema([Field("i", "int32"), Field("b", "bytes")])
    tail_rows = np.zeros(2, dtype=spec.row_dtype(schema))
    tail_rows["i"] = [8, 9]
    p = RowPacker(schema)
    p.resume(
        PackerTail(
            rows=tail_rows,
            rows_written=8,
            heap=b"xyz",
            heap_flushed=64,
            heap_pos=67,
            block_heap_start=60,
        ),
        rows_per_block=4,
    )
    assert (p.n, p.num_rows, len(p.rows), p.heap_pos) == (2, 10, 4, 67)
    p.add_row([np.array(10, np.int32), b"!"])
    assert int(p.rows["b"]["offset"][2]) == 67 and bytes(p.heap) == b"xyz!"
    blk = p.peek_block(3, 4)
    assert blk.heap_start == 60 and blk.heap_end == 68
