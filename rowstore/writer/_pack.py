"""Packing validated values into blocks: the pending rows and the heap bytes of their payloads.

Pure numpy, no HDF5: :class:`RowPacker` keeps the rows not yet written as a block, in a
structured array of :func:`spec.row_dtype`, and the heap bytes not yet written as a heap chunk.
The writer cuts blocks (:meth:`RowPacker.peek_block`, :meth:`RowPacker.pop_block`) and heap
chunks (:meth:`RowPacker.heap_chunks`) from it and hands their bytes to the file.

A stored row holds, per field (see :func:`spec.row_dtype`):

* inline ``raw`` field: the value itself (numpy assignment);
* inline field of another codec: ``codec.encode(value, field)``, exactly
  ``codec.stored_nbytes(field)`` bytes;
* heap field: :func:`spec.heap_ref_dtype` (``offset``, ``nbytes`` in the logical heap, and the
  variable dimensions), the payload ``codec.payload(value, field)`` appended to the heap (that
  is ``codec.encode``'s bytes, or a value given encoded as it is);
* nullable field: a ``<name>__null`` flag; a null stores zeros (inline) or an empty payload at the
  current heap offset (heap).

Values must already be validated (:func:`rowstore.writer.values.check_value`) and within the
size limit (:func:`check_value_size`), except for :meth:`RowPacker.add_row_fast`: the per-row
fast path of ``Writer.write``, which stores a ``dict`` of plain values in one compiled call
(``_ext/_rows.pyx``, planned once per schema by :func:`fast_plan`) when every value is one it
can store exactly as validation and :meth:`RowPacker.add_row` would, and otherwise declines
(nothing kept), leaving the row to that Python path.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore.codecs.abc import Encoded
from rowstore.codecs.raw import Raw
from rowstore.codecs.text import Bytes, Utf8
from rowstore.errors import CodecError, RowValidationError, SchemaError
from rowstore.format import spec
from rowstore.kernels import RowKind, RowPlan
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = [
    "RowPacker",
    "PackedBlock",
    "PackerTail",
    "check_value_size",
    "check_row_bytes",
    "value_nbytes",
    "max_rows_per_block",
    "first_rows_per_block",
    "fast_plan",
]

# How each field is stored (the first item of a plan entry).
_RAW, _CODEC, _HEAP = range(3)


def value_nbytes(value: Any) -> int:
    """Bytes of a validated value as a reader decodes it: array bytes (also of an encoded
    value's decoded array), text as UTF-8, bytes."""
    if isinstance(value, (np.ndarray, Encoded)):
        return int(value.nbytes)
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8"))
    return len(value)


def check_value_size(field: Field, value: Any, row: int) -> None:
    """Raise :class:`RowValidationError` if ``value`` decodes to more than
    :data:`spec.MAX_VALUE_BYTES` (readers refuse such files before allocating)."""
    if value is None or (isinstance(value, str) and 4 * len(value) <= spec.MAX_VALUE_BYTES):
        return  # (UTF-8 takes at most 4 bytes a character: no need to encode to know)
    size = value_nbytes(value)
    if size > spec.MAX_VALUE_BYTES:
        raise _too_big(field, row, f"a value of {size} bytes", "MAX_VALUE_BYTES")


def _too_big(field: Field, row: int, what: str, limit: str) -> RowValidationError:
    return RowValidationError(
        f"row {row}: field {field.name!r}: {what} exceeds what a file may hold "
        f"(spec.{limit} = {getattr(spec, limit)} bytes)",
        field=field.name,
        row=row,
    )


def check_row_bytes(schema: Schema) -> int:
    """The bytes of one stored row of ``schema``, counted in Python ints (numpy's dtype size
    wraps around past ``2**31 - 1``); :class:`SchemaError` naming the largest field when a row
    would not fit a block (:data:`spec.MAX_CHUNK_BYTES`)."""
    sizes = {}
    for f in schema:
        inline = f.stored_nbytes
        ref = inline if inline is not None else spec.heap_ref_dtype(f).itemsize
        sizes[f.name] = ref + f.nullable
    total = sum(sizes.values())
    if total > spec.MAX_CHUNK_BYTES:
        big = max(sizes, key=sizes.__getitem__)
        raise SchemaError(
            f"field {big!r}: a row of this schema takes {total} bytes ({sizes[big]} of them "
            f"this field's), more than a block may hold (spec.MAX_CHUNK_BYTES = "
            f"{spec.MAX_CHUNK_BYTES}); store large arrays as variable-shape fields (on the "
            "heap) or split them over rows",
            field=big,
        )
    return total


def max_rows_per_block(itemsize: int) -> int:
    """The most rows a block holds: its raw bytes stay within :data:`spec.MAX_CHUNK_BYTES`."""
    return max(1, spec.MAX_CHUNK_BYTES // itemsize)


def first_rows_per_block(nrows: int, pending_bytes: int, itemsize: int, block_bytes: int) -> int:
    """Rows per block for a file whose first block is cut before ``block_bytes`` were reached
    (closing early): ``block_bytes`` over the bytes per row so far, at least ``nrows``. With no
    rows yet (an empty file) a row counts its own size (an average of 0 made blocks of
    ``block_bytes`` rows, which later appends padded to ``block_bytes`` times the row size)."""
    avg = pending_bytes / nrows if nrows else itemsize
    return int(min(max(nrows, block_bytes // max(1, int(avg)), 1), max_rows_per_block(itemsize)))


def _fast_kind(f: Field) -> tuple[int, int, int] | None:
    """``(kind, lo, hi)`` of the fast path for ``f``, or None where only the Python path stores
    its values (time fields, float16/complex scalars, codecs other than raw/utf8/bytes)."""
    codec = type(f.codec_obj)
    if f.dtype == STR:
        return (RowKind.K_STR, 0, 0) if codec is Utf8 else None
    if f.dtype == BYTES:
        return (RowKind.K_BYTES, 0, 0) if codec is Bytes else None
    if codec is not Raw or f.is_time:
        return None
    if not f.inline:
        return RowKind.K_VARRAY, 0, 0
    if f.shape:
        return RowKind.K_ARRAY, 0, 0
    dt = f.dtype
    if dt.kind == "b":
        return RowKind.K_BOOL, 0, 1
    if dt.kind == "f" and dt.itemsize in (4, 8):
        return RowKind.K_FLOAT, 0, 0
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return (
            (RowKind.K_INT if dt.kind == "i" else RowKind.K_UINT),
            int(info.min),
            min(int(info.max), (1 << 63) - 1),
        )
    return None


def fast_plan(schema: Schema, row_dtype: np.dtype) -> Any:
    """The compiled plan of :meth:`RowPacker.add_row_fast` for ``schema``, or None when some
    field has no fast path (then every row takes the Python path) or the host is big-endian
    (the plan stores native bytes, which are the file's little-endian ones only on a
    little-endian host). (Typed ``Any``: the compiled ``RowPlan`` has no stubs.)"""
    columns = row_dtype.fields
    if sys.byteorder != "little" or not len(schema) or columns is None:
        return None
    descriptors = []
    dims: tuple[int, ...]
    for f in schema:
        kind = _fast_kind(f)
        if kind is None:
            return None
        offset = columns[f.name][1]
        null = columns[f.name + spec.NULL_SUFFIX][1] if f.nullable else -1
        if f.dtype in (STR, BYTES):
            size, dtype, scalar, dims, shape_offset = 0, None, None, (), -1
        else:
            dims = tuple(-1 if d is None else d for d in f.shape)
            dtype, scalar = np.dtype(f.dtype), np.dtype(f.dtype).type
            size = f.fixed_nbytes if f.inline else dtype.itemsize
            ref = columns[f.name][0].fields
            shape_offset = (
                offset + ref["shape"][1]
                if ref is not None and not f.inline and f.variable_dims
                else -1
            )
        descriptors.append(
            (
                f.name,
                int(kind[0]),
                offset,
                null,
                size,
                kind[1],
                kind[2],
                dtype,
                scalar,
                dims,
                shape_offset,
            )
        )
    return RowPlan(descriptors, row_dtype.itemsize, spec.MAX_VALUE_BYTES, spec.MAX_HEAP_BYTES)


@dataclass(frozen=True)
class PackedBlock:
    """The next block: ``rows`` (exactly ``rows_per_block`` rows, zero-filled past
    ``num_rows``; may be a view of the packer's buffer, valid until :meth:`RowPacker.pop_block`)
    and its range ``[heap_start, heap_end)`` in the logical heap."""

    rows: np.ndarray
    num_rows: int
    heap_start: int
    heap_end: int


@dataclass(frozen=True)
class PackerTail:
    """Where an existing file ends, for appending: its partial last block's rows (to be
    rewritten), its partial last heap chunk's bytes, and the counters that continue them."""

    rows: np.ndarray  # rows of the partial last block (empty when the last block is full)
    rows_written: int  # rows in the blocks kept as they are
    heap: bytes  # bytes of the partial last heap chunk (empty when it is full)
    heap_flushed: int  # logical heap offset of ``heap``
    heap_pos: int  # logical heap size
    block_heap_start: int  # heap offset where the first rewritten or new block's payloads start


class RowPacker:
    """The rows not yet written as blocks and the heap bytes not yet written as heap chunks.

    Attributes
    ----------
    row_dtype : numpy.dtype
        :func:`spec.row_dtype` of the schema.
    n : int
        Pending rows (the first ``n`` rows of the buffer).
    rows_written : int
        Rows already cut into blocks: the row number of the first pending row.
    heap_pos : int
        Logical size of the heap, pending bytes included.

    Not thread-safe. Adding rows is all-or-nothing per call: a value that fails to encode
    leaves the packer as it was before the call.
    """

    def __init__(self, schema: Schema, *, capacity: int = 64):
        self.schema = schema
        check_row_bytes(schema)  # before numpy sizes the row (in a C int)
        self.row_dtype = spec.row_dtype(schema)
        self.itemsize = self.row_dtype.itemsize
        self.heap_fields = [f.name for f in schema if not f.inline]
        self.n = 0
        self.rows_written = 0
        self.heap = bytearray()  # heap bytes from logical offset heap_flushed on
        self.heap_flushed = 0
        self.heap_pos = 0
        self.block_heap_start = 0
        self._fast = fast_plan(schema, self.row_dtype)
        self._set_buffer(np.zeros(max(1, capacity), dtype=self.row_dtype))

    @property
    def num_rows(self) -> int:
        """Rows accepted so far: written as blocks and pending."""
        return self.rows_written + self.n

    def pending_bytes(self) -> int:
        """Bytes of the pending rows and of their heap payloads."""
        return self.n * self.itemsize + (self.heap_pos - self.block_heap_start)

    # -- the row buffer and how each field is stored ---------------------------------------
    def _set_buffer(self, buf: np.ndarray) -> None:
        """Use ``buf`` for the pending rows; caches its column views per field (the plan)."""
        self.rows = buf
        if self._fast is not None:
            self._fast.set_rows(buf)
        plan: list[tuple] = []
        for f in self.schema:
            col = buf[f.name]
            null = buf[f.name + spec.NULL_SUFFIX] if f.nullable else None
            if not f.inline:
                shape = col["shape"] if f.variable_dims else None
                plan.append((_HEAP, f, null, col["offset"], col["nbytes"], shape))
            elif f.codec_obj.raw_bytes:
                plan.append((_RAW, f, null, col))
            else:
                plan.append((_CODEC, f, null, col))
        self._plan = plan

    def ensure_capacity(self, extra: int) -> None:
        """Room for ``extra`` more pending rows."""
        need = self.n + extra
        if need > len(self.rows):
            grown = np.zeros(max(need, 2 * len(self.rows)), dtype=self.row_dtype)
            grown[: self.n] = self.rows[: self.n]
            self._set_buffer(grown)

    # -- adding rows -----------------------------------------------------------------------
    def add_row(self, values: Sequence[Any]) -> None:
        """Add one row: ``values`` in schema order (``None`` for nulls), validated."""
        self.ensure_capacity(1)
        undo = len(self.heap), self.heap_pos
        i = self.n
        try:
            for entry, v in zip(self._plan, values):
                self._store(entry, i, v, self.rows_written + i)
        except BaseException:
            self._undo(*undo, 1)
            raise
        self.n += 1

    def add_row_fast(self, row: Any) -> bool:
        """Add one row given as a ``dict`` of plain values in one compiled call, if every value
        is one the fast path stores exactly as :func:`~rowstore.writer.values.check_value`
        and :meth:`add_row` would; False otherwise, with nothing kept (validate the row and
        call :meth:`add_row`, which words any error)."""
        plan = self._fast
        if plan is None:
            return False
        i = self.n
        if i >= len(self.rows):
            self.ensure_capacity(1)
        pos = plan.pack(row, i, self.heap, self.heap_pos)
        if pos < 0:
            return False
        self.heap_pos = pos
        self.n = i + 1
        return True

    def add_columns(self, parts: Sequence[Any], take: int) -> None:
        """Add ``take`` rows given per field in schema order: an ndarray ``(take, *shape)`` of
        the field's dtype (inline fields without nulls), or a sequence of validated values.

        Inline ``raw`` arrays are assigned in one numpy call; the rest go row by row, field by
        field, as :meth:`add_row` does, so the heap holds payloads in row order either way.
        """
        self.ensure_capacity(take)
        undo = len(self.heap), self.heap_pos
        lo = self.n
        try:
            per_row = []
            for entry, part in zip(self._plan, parts):
                if entry[0] == _RAW and isinstance(part, np.ndarray):
                    entry[3][lo : lo + take] = part
                    if entry[2] is not None:
                        entry[2][lo : lo + take] = False
                else:
                    per_row.append((entry, part))
            for j in range(take if per_row else 0):
                for entry, part in per_row:
                    self._store(entry, lo + j, part[j], self.rows_written + lo + j)
        except BaseException:
            self._undo(*undo, take)
            raise
        self.n += take

    def add_raw(self, rows: np.ndarray, heap: np.ndarray, origin: int) -> None:
        """Add stored rows as they are (a :class:`~rowstore.format._raw.RawRows`' parts): their
        heap references, which address ``heap`` from reference value ``origin`` on, are moved to
        the end of this heap, where ``heap`` is appended."""
        m = len(rows)
        if len(heap) and self.heap_pos + len(heap) > spec.MAX_HEAP_BYTES:
            raise _too_big(
                self.schema[self.heap_fields[0]],
                self.num_rows,
                f"the heap with these rows ({self.heap_pos + len(heap)} bytes)",
                "MAX_HEAP_BYTES",
            )
        self.ensure_capacity(m)
        lo = self.n
        if m:  # as bytes: a structured assignment copies field by field
            dst = self.rows[lo : lo + m].view(np.uint8).reshape(m, self.itemsize)
            dst[...] = np.ascontiguousarray(rows).view(np.uint8).reshape(m, self.itemsize)
        for name in self.heap_fields:
            ref = self.rows[name]["offset"][lo : lo + m]
            ref -= np.uint64(origin)  # references lie at or past origin (RawRows), so no wrap
            ref += np.uint64(self.heap_pos)
        self.heap += (
            heap.data.cast("B") if heap.ndim == 1 and heap.flags.c_contiguous else bytes(heap)
        )
        self.heap_pos += len(heap)
        self.n += m

    def _undo(self, heap_len: int, heap_pos: int, count: int) -> None:
        """Drop what rows being added stored (heap bytes, partly filled slots)."""
        del self.heap[heap_len:]
        self.heap_pos = heap_pos
        self.rows[self.n : self.n + count] = np.zeros((), self.row_dtype)

    def _store(self, entry: tuple, i: int, v: Any, row: int) -> None:
        """Put one validated value into pending row ``i`` (row number ``row``)."""
        kind, f, null = entry[0], entry[1], entry[2]
        if null is not None:
            null[i] = v is None
        if kind == _RAW:
            entry[3][i] = 0 if v is None else v
        elif kind == _CODEC:
            entry[3][i] = 0 if v is None else self._encode_inline(f, v, row, entry[3].shape[1])
        elif v is None:
            entry[3][i] = self.heap_pos
            entry[4][i] = 0
            if entry[5] is not None:
                entry[5][i] = 0
        else:
            payload = f.codec_obj.payload(v, f)  # an Encoded value's bytes as they are
            size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
            self._check_payload(f, size, row)
            entry[3][i] = self.heap_pos
            entry[4][i] = size
            if entry[5] is not None:
                entry[5][i] = [v.shape[d] for d in f.variable_dims]
            self.heap += payload
            self.heap_pos += size

    @staticmethod
    def _encode_inline(f: Field, v: Any, row: int, nbytes: int) -> np.ndarray:
        stored = np.frombuffer(f.codec_obj.payload(v, f), np.uint8)
        if stored.size != nbytes:
            cid = f.codec["id"]
            raise CodecError(
                f"row {row}: field {f.name!r}: codec {cid!r} encoded a value into {stored.size} "
                f"bytes; "
                f"its stored_nbytes is {nbytes}",
                codec=cid,
                field=f.name,
            )
        return stored

    def _check_payload(self, f: Field, size: int, row: int) -> None:
        if size > spec.MAX_VALUE_BYTES:
            raise _too_big(f, row, f"a stored payload of {size} bytes", "MAX_VALUE_BYTES")
        if self.heap_pos + size > spec.MAX_HEAP_BYTES:
            raise _too_big(
                f,
                row,
                f"the heap with this payload ({self.heap_pos + size} bytes)",
                "MAX_HEAP_BYTES",
            )

    # -- cutting blocks and heap chunks ----------------------------------------------------
    def peek_block(self, nrows: int, rows_per_block: int) -> PackedBlock:
        """The first ``nrows`` pending rows as the next block (``rows_per_block`` rows, zero
        padded), without removing them; the heap range ends at the last payload of its rows."""
        if nrows == rows_per_block:
            block = self.rows[:rows_per_block]  # written as is: no copy of a full block
        else:
            block = np.zeros(rows_per_block, dtype=self.row_dtype)  # the last chunk is zero-filled
            block[:nrows] = self.rows[:nrows]
        heap_end = self.block_heap_start
        if self.heap_fields and nrows:
            for name in self.heap_fields:
                ref = self.rows[name]
                heap_end = max(heap_end, int((ref["offset"][:nrows] + ref["nbytes"][:nrows]).max()))
        return PackedBlock(block, nrows, self.block_heap_start, heap_end)

    def pop_block(self, block: PackedBlock, rows_per_block: int) -> None:
        """Remove the rows of ``block`` (from :meth:`peek_block`, written since)."""
        nrows = block.num_rows
        self.block_heap_start = block.heap_end
        self.rows_written += nrows
        # Every column of a pending row is assigned when the row is added, so rows left over
        # from the block need no clearing.
        rest = self.n - nrows
        if rest:
            self.rows[:rest] = self.rows[nrows : self.n].copy()
        self.n = rest
        if len(self.rows) != rows_per_block:
            buf = np.zeros(max(rows_per_block, rest), dtype=self.row_dtype)
            buf[:rest] = self.rows[:rest]
            self._set_buffer(buf)

    def heap_chunks(self, chunk_bytes: int, *, final: bool) -> Iterator[tuple[bytes, int]]:
        """Cut the pending heap into chunks of ``chunk_bytes`` (the last one zero-filled when
        ``final``): yields ``(chunk, extent)``, ``extent`` being the heap's logical size once
        that chunk is written. A chunk leaves the packer when the caller asks for the next."""
        while len(self.heap) >= chunk_bytes or (final and self.heap):
            chunk = bytes(self.heap[:chunk_bytes])
            if len(chunk) < chunk_bytes:
                chunk += bytes(chunk_bytes - len(chunk))
            yield chunk, min(self.heap_flushed + chunk_bytes, self.heap_pos)
            del self.heap[:chunk_bytes]
            self.heap_flushed += chunk_bytes
        if final and self.heap_flushed > self.heap_pos:
            self.heap_flushed = self.heap_pos

    def resume(self, tail: PackerTail, rows_per_block: int) -> None:
        """Continue an existing file (appending): its partial last block and heap chunk become
        pending again."""
        buf = np.zeros(max(rows_per_block, len(tail.rows)), dtype=self.row_dtype)
        buf[: len(tail.rows)] = tail.rows
        self._set_buffer(buf)
        self.n = len(tail.rows)
        self.rows_written = tail.rows_written
        self.heap = bytearray(tail.heap)
        self.heap_flushed = tail.heap_flushed
        self.heap_pos = tail.heap_pos
        self.block_heap_start = tail.block_heap_start
