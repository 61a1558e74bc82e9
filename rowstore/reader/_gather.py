"""Gather: the stored bytes of a set of rows, from the store into batch arrays.

For each request (global row ids, or an epoch :class:`~rowstore.reader.order.Segment`) a cost
model of syscalls and bytes moved picks how to read, then the kernels copy, without the GIL:

* fields whose codec stores raw bytes in the row go straight into their batch arrays (the
  caller's ``out=`` where given), null flags likewise;
* every other field comes out as :class:`~rowstore.codecs.Payloads` (its stored bytes per
  row), which the decode layer hands to the field's codec.

Every offset and size read from the file is bounded here or in the kernels before it is used.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.codecs import Payloads
from rowstore.errors import FormatError
from rowstore.format import spec
from rowstore.format._raw import first_overlap
from rowstore.format.shards import DatasetLayout
from rowstore.reader import order as _order
from rowstore.reader.buffers import NULL_KEY, BufferPool
from rowstore.schema import Field, Schema
from rowstore.storage.base import DirectReads

__all__ = ["FieldPlan", "Gathered", "Gatherer", "plan_fields"]

#: Rough costs used to choose between reading whole blocks and reading rows directly.
_SYSCALL_S = 1.5e-6
_BYTES_PER_S = 6e9
#: preadv_rows takes up to 64 pieces per row.
_MAX_ROW_PIECES = 30


@dataclass(frozen=True)
class FieldPlan:
    """Where one field lives in a stored row, and how it comes out of the gather."""

    field: Field
    inline: bool  # a fixed-size value in the row (else a heap reference)
    raw: bool  # inline raw bytes: gathered straight into the batch array, nothing to decode
    offset: int  # byte offset of the value (inline) or of the heap reference in the row
    nbytes: int  # inline: bytes of one stored value
    nvar: int  # number of variable dimensions (heap fields)
    null_offset: int  # byte offset of the __null flag, or -1


def plan_fields(schema: Schema, row_dtype: np.dtype) -> dict[str, FieldPlan]:
    cols = row_dtype.fields
    if cols is None:
        raise TypeError("row_dtype must be a structured dtype")
    plans = {}
    for f in schema:
        null_off = cols[f.name + spec.NULL_SUFFIX][1] if f.nullable else -1
        inline = f.inline
        plans[f.name] = FieldPlan(
            f,
            inline,
            inline and f.codec_obj.raw_bytes,
            cols[f.name][1],
            f.stored_nbytes or 0,
            len(f.variable_dims),
            null_off,
        )
    return plans


@dataclass
class Gathered:
    """What a gather produced: per field a finished array (raw inline fields), or
    :class:`Payloads` to decode; ``name__null`` flags; and the global row ids (for errors)."""

    columns: dict[str, Any]
    rows: Any  # ndarray, or the Segment whose rows() gives them

    def row_ids(self) -> np.ndarray:
        return self.rows.rows() if isinstance(self.rows, _order.Segment) else self.rows


#: Bytes of heap payload buffers a reader keeps for reuse, at most.
_PAYLOAD_POOL_BYTES = 128 << 20
#: Bytes of decompressed heap chunks a reader keeps between window segments, at most (at least
#: two chunks): the chunks that a segment's blocks share with blocks outside it.
_HEAP_CACHE_BYTES = 64 << 20
#: A row table of heap-bearing rows is kept whole by a reader (loaded once, at its first
#: window) when it is at most this large and at most ``1 / _RESIDENT_HEAP_SHARE`` of the heap:
#: each window then reads only payloads, not the row-table blocks of every unit it holds.
_RESIDENT_ROWS_BYTES = 16 << 20
_RESIDENT_HEAP_SHARE = 8


class _HeapCache:
    """Decompressed heap chunks that straddle requests, kept for the next block that needs them.

    A block's heap range rarely ends on a chunk boundary, so the chunk holding its end is also
    needed by the next block; a window segment loads whole chunks, so without this cache a
    chunk shared with a block of another window is decompressed once per window. Each chunk
    at the end of some block's heap range counts its blocks still to be read in this pass
    over them (``remaining``): after a request it is kept (a copy, never modified) while that
    count is above 0, and dropped once every block touching it has been read, so in an epoch
    that reads each block once (block and none orders) each such chunk is decompressed once
    while the cache holds it: up to ``capacity`` chunks, the oldest dropped first. Other
    orders (full) only make hits rarer. Thread-safe; entries are shared by the reader's
    threads.
    """

    def __init__(self, capacity: int, users: np.ndarray, chunk_bytes: int):
        self.capacity = capacity
        self._users = users  # blocks touching each chunk (0: inside one block, never kept)
        self._remaining = np.zeros(len(users), np.int64)
        self._chunks: dict[int, np.ndarray] = {}  # insertion order: the oldest first
        # Buffers of dropped chunks, reused (a fresh one costs a page fault per page); with
        # the kept ones never more than ``capacity``.
        self._free: list[np.ndarray] = []
        self._chunk_bytes = chunk_bytes
        self._lock = threading.Lock()

    def take_into(self, ids: list[int], heap: np.ndarray) -> set[int]:
        """Copy the cached chunks among ``ids`` into their slots of ``heap`` (slot i for
        ``ids[i]``); returns them (they stay cached until :meth:`settle`)."""
        H = self._chunk_bytes
        hits = set()
        with self._lock:  # copied under the lock: a dropped chunk's buffer is reused
            for i, c in enumerate(ids):
                data = self._chunks.get(c)
                if data is not None:
                    heap[i * H : (i + 1) * H] = data
                    hits.add(c)
        return hits

    def settle(self, ids: np.ndarray, touching: np.ndarray, slots: dict[int, np.ndarray]) -> None:
        """A request read ``touching[i]`` of the blocks touching chunk ``ids[i]``: count them
        off; keep the chunks with blocks still to read (copied from ``slots[c]``, the chunk's
        bytes, unless still cached), drop the others."""
        with self._lock:
            rem = self._remaining[ids]
            rem = np.where(rem <= 0, self._users[ids], rem) - touching
            self._remaining[ids] = np.maximum(rem, 0)
            for c, left in zip(ids.tolist(), rem.tolist()):
                if left <= 0:
                    self._drop(c)
                elif c not in self._chunks:
                    buf = self._free.pop() if self._free else np.empty(self._chunk_bytes, np.uint8)
                    buf[:] = slots[c]
                    self._chunks[c] = buf
            while len(self._chunks) > self.capacity:
                self._drop(next(iter(self._chunks)))

    def _drop(self, c: int) -> None:
        buf = self._chunks.pop(c, None)
        if buf is not None:
            self._free.append(buf)


class _Scratch(threading.local):
    """Per-thread reusable buffers for loaded blocks (reused across calls: no page faults)."""

    def get(self, name: str, nbytes: int) -> np.ndarray:
        buf = getattr(self, name, None)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), np.uint8)
            setattr(self, name, buf)
        return buf[:nbytes]


@dataclass
class _Rows:
    """The rows of one request: count, global ids and blocks (when computed), the sorted
    blocks they touch, and (window segments) their positions within those blocks loaded."""

    n: int
    rows: Any
    blk: Any
    ublocks: np.ndarray
    local: np.ndarray | None
    units: np.ndarray | None = None  # a window of pieces loaded piece by piece: its sorted units
    pieces: int = 1

    def ensure_rows(self, seg: _order.Segment | None, rpb: int) -> None:
        if self.rows is None:
            assert seg is not None  # rows are left uncomputed only for a segment
            self.rows = seg.rows()
        if self.blk is None:
            self.blk = self.rows // rpb


class Gatherer:
    """Reads rows of a dataset's shards through a store (one per reader; thread-safe)."""

    def __init__(
        self, layout: DatasetLayout, store: Any, verify: bool | str, codec: tuple[int, int] | None
    ):
        self.layout = layout
        self.store = store
        # Single rows, payloads and page ranges only from stores that read them in place.
        self.direct = isinstance(store, DirectReads)
        self.verify = verify
        self.codec = codec
        self.arr = layout.arrays()
        self.multi = layout.num_shards > 1
        self.rs = layout.row_dtype.itemsize
        self.rpb = layout.rows_per_block
        self.scratch = _Scratch()
        # Heap payload buffers of uncompressed direct reads, reused once every batch cut from
        # one is dropped (a fresh buffer per segment costs a zeroed page per page delivered).
        self._payloads = BufferPool(8, max_bytes=_PAYLOAD_POOL_BYTES)
        stored, hstored = self.arr["stored"], self.arr["hc_stored"]
        self.max_stored = int(
            max(stored.max() if len(stored) else 0, hstored.max() if len(hstored) else 0)
        )
        # Single rows and payloads only where the store serves them cheaply, from uncompressed
        # chunks, and not under verify="always" (whole chunks only).
        self.direct_ok = self.direct and codec is None and verify != "always"
        # Object stores that fetch page ranges (RemoteStore.read_pages, every page checked on
        # every fetch): a window's pieces of an uncompressed file are read alone there too.
        self._ranged = bool(getattr(store, "ranged_pages", False)) and codec is None
        self._ranged = self._ranged and verify != "always"
        # verify=True, files without a page index: a chunk is checksummed whole the first time a
        # direct read touches it (per process), so that no byte handed out comes from an
        # unchecked chunk. Races between threads only verify twice.
        self._checked = np.zeros(layout.num_blocks, np.bool_) if verify is True else None
        self._hchecked = np.zeros(len(self.arr["hc_offset"]), np.bool_) if verify is True else None
        self._hc_raw: np.ndarray | None = None  # memcpy'd heap chunks' raw offsets (compressed)
        self._check_lock = threading.Lock()  # one thread checks a chunk; the others wait for it
        # Files with a page index (format v3): direct reads check pages instead of whole chunks,
        # rows of a page or more in the pass that reads them, smaller rows and payloads by
        # reading the pages they touch that this reader has not checked yet (a few KiB each).
        # The page index is found on the first direct read (a dataset opened from its manifest
        # reads its shards' footers for it), so block-order epochs never pay for it. Compressed
        # files use only the heap pages, for the payloads read in place from memcpy'd chunks.
        self._want_pages = (verify is True and self.direct) or self._ranged
        self._pages: Any = None
        self._pages_lock = threading.Lock()
        self._pages_done = False  # every block page checked (direct reads check nothing more)
        # Rows with payloads, whose row table is small beside their heap: the table is loaded
        # (checked, decompressed) once, at the first window, and kept (not under
        # verify="always", which checks every read; local stores only).
        table = layout.num_blocks * layout.block_raw_bytes
        self._resident_ok = bool(
            self.direct
            and verify != "always"
            and len(self.arr["hc_offset"])
            and layout.block_raw_bytes == self.rpb * self.rs
            and table <= _RESIDENT_ROWS_BYTES
            and table * _RESIDENT_HEAP_SHARE <= layout.heap_nbytes
        )
        self._resident: np.ndarray | None = None
        self._resident_lock = threading.Lock()
        # Compressed files (not verify="always", which checks every read): heap chunks shared
        # by the blocks of two window segments are decompressed once (_HeapCache).
        self._heap_cache: _HeapCache | None = None
        #: Heap chunks decompressed (or read, uncompressed) into a segment's heap buffer.
        self.heap_chunks_loaded = 0
        self._count_lock = threading.Lock()
        if codec is not None and verify != "always" and len(self.arr["hc_offset"]):
            self._chunk_users = self._heap_chunk_users()
            self._heap_cache = _HeapCache(
                max(2, _HEAP_CACHE_BYTES // layout.heap_chunk_bytes),
                self._chunk_users[2],
                layout.heap_chunk_bytes,
            )

    @property
    def pieces_ok(self) -> bool:
        """Whether a window of pieces (no heap fields) is read piece by piece: uncompressed
        files on a store with direct reads, or on one that fetches checked page ranges (where
        the file has a page index)."""
        return self.direct_ok or (self._ranged and self.pages is not None)

    def ranged_rows(self, n: int, nblocks: int) -> bool:
        """Whether ``n`` rows (no heap fields) of ``nblocks`` blocks are fetched row by row, as
        their pages (:meth:`_load_ranged`): a store that fetches checked page ranges, rows
        spread thin (under half of their blocks' rows: a full shuffle), a page index."""
        return (
            self._ranged
            and not self.direct_ok
            and 2 * n <= nblocks * self.rpb
            and self.pages is not None
        )

    @property
    def pages(self) -> Any:
        """The dataset's :class:`~rowstore.format.shards.PageIndex` where direct reads check
        pages (verify=True, a store with direct reads, v3 files), else None."""
        if not self._want_pages:
            return None
        if self._pages is None:
            with self._pages_lock:
                if self._pages is None:
                    pi = self.layout.page_index()
                    if pi is not None:
                        # Pages past a block's valid rows are never read: counted as checked,
                        # so that every page read being checked is ``_pchecked.all()``.
                        self._pchecked = np.ones(len(pi.block_pages), np.bool_)
                        rpp = pi.rows_per_page
                        used = -(-self.layout.block_rows() // rpp)
                        first = np.asarray(pi.block_page0, np.int64)
                        k = np.arange(int(used.sum()), dtype=np.int64)
                        start = np.cumsum(used) - used
                        self._pchecked[np.repeat(first - start, used) + k] = False
                        self._hpchecked = np.zeros(len(pi.heap_pages), np.bool_)
                    self._pages = pi if pi is not None else False
        return self._pages or None

    # -- the request -------------------------------------------------------------------------
    def gather(
        self,
        request: np.ndarray | _order.Segment,
        plans: list[FieldPlan],
        out: dict | None = None,
        out_start: int = 0,
    ) -> Gathered:
        """Read ``request`` (global row ids, or a Segment) and return its fields' columns."""
        seg = request if isinstance(request, _order.Segment) else None
        heap_plans = [p for p in plans if not p.inline]
        if (
            seg is not None
            and seg.units is not None
            and seg.pieces > 1
            and self.pieces_ok
            and not heap_plans
        ):
            # A window of pieces of an uncompressed local file: load only its pieces.
            r = _Rows(len(seg), None, None, seg.blocks, seg.piece_local(), seg.units, seg.pieces)
            strategy = "pieces"
        elif seg is not None and heap_plans and self._resident_ok:
            r = self._locate(request)  # rows from the resident table (checked when loaded)
            strategy = "resident"
        else:
            r = self._locate(request)
            strategy = self._strategy(r.n, len(r.ublocks), bool(heap_plans), 2 * len(plans))
            if strategy == "blocks" and not heap_plans and self.ranged_rows(r.n, len(r.ublocks)):
                strategy = "ranged"  # rows spread thin, on an object store: their pages alone
        if strategy not in ("blocks", "pieces") or heap_plans or r.local is None:
            r.ensure_rows(seg, self.rpb)
        columns: dict[str, Any] = {}
        fixed = self._fixed_targets(plans, r.n, out, out_start, columns)
        in_pass = None  # (pages, to check) of rows checked in the pass that reads them
        if strategy not in ("blocks", "resident"):
            if self.pages is None:
                self._check_first_touch(r.ublocks, "block")
            elif not self._pages_done and strategy not in ("pieces", "ranged"):  # checked as read
                in_pass = self._row_pages(r)
        if strategy == "preadv":
            # Large fixed-size rows of an uncompressed file: each row goes from the page cache
            # straight into the batch arrays, one preadv per row, no intermediate buffer.
            # Read in file order: the rows of a piece or block that follow each other in the
            # file go in one preadv, each into its own batch slot.
            check = expect = None
            if in_pass is not None:
                check, expect = in_pass[1], in_pass[2]
            shards, offsets = self._shards(r), self._file_offsets(r)
            order = np.argsort(offsets) if shards is None else np.lexsort((offsets, shards))
            try:
                self.store.read_rows_into(
                    shards,
                    offsets,
                    self.rs,
                    self._pieces(fixed),
                    self.scratch.get("sink", self.rs),
                    check=check,
                    expect=expect,
                    order=order,
                )
            except kernels.KernelChecksumError as exc:
                raise self._row_error(exc, r) from None
            self._mark_rows(in_pass)
        else:
            if strategy == "pieces":
                rowbuf, idx = self._load_pieces(r)
            elif strategy == "ranged":
                rowbuf, idx = self._load_ranged(r)
            elif strategy == "resident":
                rowbuf, idx = self._resident_rows(), r.rows
            else:
                rowbuf, idx = self._load_rows(r, strategy == "rows")
            if in_pass is not None and strategy != "blocks":
                todo = np.flatnonzero(in_pass[1])
                try:
                    kernels.check_buffer(
                        rowbuf,
                        idx[todo] * self.rs,
                        np.full(len(todo), self.rs, np.int64),
                        in_pass[2][todo],
                    )
                except kernels.KernelChecksumError as exc:
                    exc.index = int(todo[exc.index])
                    raise self._row_error(exc, r) from None
                self._mark_rows(in_pass)
            if fixed:
                # One pass over the rows for all fields: one cache miss per row, not per field.
                kernels.gather_rows(rowbuf, self.rs, idx, fixed)
            if heap_plans:
                self._gather_heap(
                    r, heap_plans, rowbuf, idx, strategy == "rows", columns, strategy == "resident"
                )
        for p in plans:
            if p.inline and not p.raw:  # stored bytes for the codec to decode
                data = columns[p.field.name]
                offsets = np.arange(r.n + 1, dtype=np.int64) * p.nbytes
                columns[p.field.name] = Payloads(
                    data.reshape(-1), offsets, None, columns.get(p.field.name + NULL_KEY)
                )
        return Gathered(columns, request if r.rows is None else r.rows)

    def _locate(self, request: np.ndarray | _order.Segment) -> _Rows:
        if isinstance(request, _order.Segment):
            local = request.local()
            # Window segments: global row ids are computed only where needed.
            rows = None if local is not None else request.rows()
            r = _Rows(len(request), rows, None, request.blocks, local)
            if r.ublocks is not None:
                return r
        else:
            r = _Rows(len(request), request, None, None, None)  # type: ignore[arg-type]
        r.blk = r.rows // self.rpb
        present = np.zeros(self.layout.num_blocks, np.bool_)
        present[r.blk] = True
        r.ublocks = np.flatnonzero(present)
        return r

    def _strategy(self, n: int, nblocks: int, has_heap: bool, nfixed: int) -> str:
        """How to read ``n`` rows spread over ``nblocks`` blocks, by a cost estimate:
        ``"blocks"`` (load whole blocks, then gather), ``"rows"`` (read each row, then gather:
        uncompressed files, few rows per block), or ``"preadv"`` (uncompressed, fixed-size
        fields only: each row straight into the batch arrays)."""
        if not self.direct_ok:
            return "blocks"
        row = self.rs / _BYTES_PER_S
        costs = {
            "blocks": nblocks * self.layout.block_raw_bytes / _BYTES_PER_S + n * row,
            "rows": n * (_SYSCALL_S + 2 * row),
        }
        if not has_heap and nfixed <= _MAX_ROW_PIECES:
            costs["preadv"] = n * (_SYSCALL_S + row)
        return min(costs, key=costs.__getitem__)

    # -- fixed-size parts of the rows --------------------------------------------------------
    def _fixed_targets(
        self,
        plans: list[FieldPlan],
        n: int,
        out: dict | None,
        out_start: int,
        columns: dict[str, Any],
    ) -> list[tuple[int, int, np.ndarray]]:
        """The ``(offset in row, size, destination)`` of every inline value and null flag;
        the destinations are entered in ``columns``."""
        fixed: list[tuple[int, int, np.ndarray]] = []
        for p in plans:
            f = p.field
            if p.null_offset >= 0:
                nulls = np.empty(n, np.bool_)
                fixed.append((p.null_offset, 1, nulls))
                columns[f.name + NULL_KEY] = nulls
            if p.raw:
                given = out.get(f.name) if out else None
                dst = (
                    given[out_start : out_start + n]
                    if given is not None
                    else np.empty((n,) + f.shape, f.dtype)
                )
            elif p.inline:
                dst = np.empty((n, p.nbytes), np.uint8)
            else:
                continue
            fixed.append((p.offset, p.nbytes, dst))
            columns[f.name] = dst
        return fixed

    def _pieces(
        self, fixed: list[tuple[int, int, np.ndarray]]
    ) -> list[tuple[int, np.ndarray | None]]:
        """Cut a row into consecutive (size, out) pieces for ``preadv_rows``; bytes no field
        asked for go to the sink (None)."""
        segs: list[tuple[int, np.ndarray | None]] = []
        pos = 0
        for off, size, dst in sorted(fixed, key=lambda t: t[0]):
            if size == 0:
                continue
            if off > pos:
                segs.append((off - pos, None))
            segs.append((size, dst))
            pos = off + size
        if pos < self.rs:
            segs.append((self.rs - pos, None))
        return segs

    def _shards(self, r: _Rows) -> np.ndarray | None:
        """The shard of each requested row (None for a one-file dataset)."""
        return self.layout.block_shard[r.blk] if self.multi else None

    def _file_offsets(self, r: _Rows) -> np.ndarray:
        return self.arr["offset"][r.blk] + (r.rows - r.blk * self.rpb) * self.rs

    def _load_rows(self, r: _Rows, direct: bool) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows in a buffer, and each requested row's position in it."""
        if direct:
            rowbuf = self.scratch.get("rows", r.n * self.rs)
            self.store.read_rows(self._shards(r), self._file_offsets(r), self.rs, rowbuf)
            return rowbuf, np.arange(r.n, dtype=np.int64)
        raw = self.layout.block_raw_bytes
        rowbuf = self.scratch.get("rows", len(r.ublocks) * raw)
        self._load(r.ublocks, "block", rowbuf)
        if r.local is not None:
            return rowbuf, r.local  # the segment's rows, already as positions in the loaded blocks
        lookup = np.empty(self.layout.num_blocks, np.int64)
        lookup[r.ublocks] = np.arange(len(r.ublocks), dtype=np.int64) * self.rpb
        return rowbuf, lookup[r.blk] + (r.rows - r.blk * self.rpb)

    def _resident_rows(self) -> np.ndarray:
        """The whole row table, block b's rows in slot b (so a row's position is its id),
        loaded and checked once by the first thread that asks."""
        table = self._resident
        if table is None:
            with self._resident_lock:
                table = self._resident
                if table is None:
                    L = self.layout
                    table = np.empty(L.num_blocks * L.block_raw_bytes, np.uint8)
                    self._load(np.arange(L.num_blocks, dtype=np.int64), "block", table)
                    self._resident = table
        return table

    def _load_pieces(self, r: _Rows) -> tuple[np.ndarray, np.ndarray]:
        """A window of pieces (uncompressed local file): each unit's rows read into its slot of
        ``piece_rows`` rows (checked by :meth:`gather`, as every direct read), so ``r.local``
        (``slot * piece_rows + row in the piece``) indexes the buffer as it is. All pieces go
        in one ``pread_rows`` call of ``piece_rows`` rows each: a short piece at the end of a
        block reads the bytes after it into the rest of its slot (rows never indexed), except
        where that would read past the end of the file (the last block's pieces): one read
        each of its own rows."""
        assert r.units is not None and r.local is not None
        P = -(-self.rpb // r.pieces)
        blk = r.units // r.pieces
        start = (r.units % r.pieces) * P
        counts = np.minimum(np.maximum(self.layout.block_rows()[blk] - start, 0), P)
        rowbuf = self.scratch.get("rows", len(r.units) * P * self.rs)
        shards = self.layout.block_shard[blk] if self.multi else None
        pi = self.pages
        if pi is not None and not self._pages_done:
            # Each piece's own rows, with the rest of its first and last pages, checked by
            # their pages in the read's pass (the pieces of a block share its pages).
            plen = pi.rows_per_page * self.rs
            try:
                self.store.read_pages(
                    shards,
                    self.arr["offset"][blk],
                    self.layout.shard_rpb[self.layout.block_shard[blk]] * self.rs,
                    start * self.rs,
                    counts * self.rs,
                    pi.block_page0[blk],
                    (plen, pi.block_pages, self._pchecked, self.scratch.get("pages2", 2 * plen)),
                    rowbuf,
                    np.arange(len(blk), dtype=np.int64) * (P * self.rs),
                )
            except kernels.KernelError as exc:
                k = int(blk[exc.index]) if 0 <= exc.index < len(blk) else None
                raise self.located(exc, "block", k) from None
            self._pages_done = bool(self._pchecked.all())
            return rowbuf, r.local
        offsets = self.arr["offset"][blk] + start * self.rs
        size = self.layout.shard_file_size[shards if shards is not None else 0]
        whole = (counts == P) | (offsets + P * self.rs <= size)
        if whole.all():
            self.store.read_rows(shards, offsets, P * self.rs, rowbuf)
            return rowbuf, r.local
        slot = P * self.rs
        runs = np.flatnonzero(np.diff(np.concatenate(([0], whole.view(np.int8), [0]))))
        for a, b in zip(runs[::2], runs[1::2]):  # consecutive whole slots: one call each
            self.store.read_rows(
                None if shards is None else shards[a:b],
                offsets[a:b],
                slot,
                rowbuf[a * slot : b * slot],
            )
        for i in np.flatnonzero(~whole & (counts > 0)).tolist():
            n = int(counts[i]) * self.rs
            self.store.read_rows(
                None if shards is None else shards[i : i + 1],
                offsets[i : i + 1],
                n,
                rowbuf[i * slot : i * slot + n],
            )
        return rowbuf, r.local

    def _load_ranged(self, r: _Rows) -> tuple[np.ndarray, np.ndarray]:
        """Rows spread over many blocks, from a store that fetches checked page ranges
        (``RemoteStore.read_pages``): each row with the rest of its pages, checked by them."""
        pi = self.pages
        blk = r.blk
        rowbuf = self.scratch.get("rows", r.n * self.rs)
        try:
            self.store.read_pages(
                self._shards(r),
                self.arr["offset"][blk],
                self.layout.shard_rpb[self.layout.block_shard[blk]] * self.rs,
                (r.rows - blk * self.rpb) * self.rs,
                np.full(r.n, self.rs, np.int64),
                pi.block_page0[blk],
                (pi.rows_per_page * self.rs, pi.block_pages, self._pchecked, None),
                rowbuf,
                np.arange(r.n, dtype=np.int64) * self.rs,
            )
        except kernels.KernelError as exc:
            k = int(blk[exc.index]) if 0 <= exc.index < len(blk) else None
            raise self.located(exc, "block", k) from None
        return rowbuf, np.arange(r.n, dtype=np.int64)

    def _load(self, which: np.ndarray, what: str, dst: np.ndarray) -> None:
        """Whole chunks ``which`` (sorted blocks or heap chunks) into consecutive slots of
        ``dst`` (a block's slot is ``layout.block_raw_bytes``, a heap chunk's
        ``heap_chunk_bytes``), checked and decompressed: one kernel call (one per shard when
        the shards' blocks differ in size). verify=True checks each chunk once per reader, as
        direct reads check each page once: a request whose chunks were all checked by an
        earlier load is not checked again (verify="always" checks every load)."""
        a = self.arr
        checked = self._checked if what == "block" else self._hchecked
        verify = bool(self.verify) if checked is None else not bool(checked[which].all())
        if what == "block":
            off, stored, check, stride = (
                a["offset"],
                a["stored"],
                a["checksum"],
                self.layout.block_raw_bytes,
            )
        else:
            off, stored, check, stride = (
                a["hc_offset"],
                a["hc_stored"],
                a["hc_checksum"],
                self.layout.heap_chunk_bytes,
            )
        scratch = self.scratch.get("stage", self.max_stored if self.codec is not None else 1)
        L = self.layout
        if what == "block" and not L.uniform_blocks:
            # Shards of different block sizes: one call per run of one shard (raw sizes differ).
            runs = [
                (L.block_shard[which[i:j]], which[i:j], int(L.shard_rpb[sh]) * self.rs, i, j)
                for sh, i, j in L.runs(which, what)
            ]
        else:  # one call, each chunk read from its own shard's descriptor
            raw = int(L.shard_rpb[0]) * self.rs if what == "block" else stride
            owner = (
                (L.block_shard if what == "block" else L.chunk_shard)[which] if self.multi else None
            )
            runs = [(owner, which, raw, 0, len(which))]
        for owner, part, raw, i, j in runs:
            try:
                self.store.load_chunks(
                    owner,
                    off[part],
                    stored[part],
                    check[part],
                    codec=self.codec,
                    verify=verify,
                    dst=dst[i * stride : (j - 1) * stride + raw],
                    raw_size=raw,
                    scratch=scratch,
                    what=what,
                    dst_stride=stride,
                )
            except kernels.KernelError as exc:
                k = int(part[exc.index]) if 0 <= exc.index < len(part) else None
                raise self.located(exc, what, k) from None
        if verify and checked is not None:
            checked[which] = True

    def located(self, exc: kernels.KernelError, what: str, k: int | None = None) -> FormatError:
        """The kernel error re-raised with the shard file and its block (``what`` "block") or
        heap chunk ``k`` (dataset-wide numbers), or with a field name (``what`` "field 'x'",
        ``k`` the block)."""
        msg = str(exc).split(": ", 1)[-1]
        blk = None
        L = self.layout
        if k is None:
            path, where = (L.shard_paths[0] if L.num_shards == 1 else L.path), what
        elif what == "heap chunk":
            sh = int(L.chunk_shard[k])
            path, where = L.shard_paths[sh], f"heap chunk {k - L.shard_block0(sh, what)}"
        else:
            sh = int(L.block_shard[k])
            path, blk = L.shard_paths[sh], k - L.shard_block0(sh)
            where = f"block {blk}" if what == "block" else what
        return type(exc)(
            f"{path!r}: {where}: {msg}",
            code=exc.code,
            index=exc.index,
            detail=exc.detail,
            path=path,
            block=blk,
        )

    # -- heap payloads -----------------------------------------------------------------------
    def _gather_heap(
        self,
        r: _Rows,
        plans: list[FieldPlan],
        rowbuf: np.ndarray,
        idx: np.ndarray,
        direct: bool,
        columns: dict[str, Any],
        by_block: bool = False,
    ) -> None:
        """The heap fields' payloads of rows ``idx`` of ``rowbuf`` into ``columns``: read in
        place (``direct``, or where the cost model says so) or gathered from the heap chunks
        of the rows' blocks. ``by_block``: ``rowbuf`` is the resident table (a row's position
        is its id), so a row's slot among the loaded chunks' blocks is its block."""
        heap_lo, heap_hi = self.arr["heap_start"][r.blk], self.arr["heap_end"][r.blk]
        chunk_base = self.arr["chunk_base"][r.blk] if self.multi else 0
        sizes = {
            p.field.name: self._payload_sizes(p, r, rowbuf, idx, heap_lo, heap_hi) for p in plans
        }
        heap_ctx = None
        hc_off = self.arr["hc_offset"]  # where the heap chunks' raw bytes lie (direct reads)
        if not direct:
            # Pread the payloads into place when that moves fewer bytes than loading the heap
            # chunks under the blocks' ranges (large payloads); a row's fields lie together
            # in the heap and are read in one call.
            needed = sum(int(v.sum()) for v in sizes.values())
            to_load = int(
                (self.arr["heap_end"][r.ublocks] - self.arr["heap_start"][r.ublocks]).sum()
            )
            to_load += self.layout.heap_chunk_bytes * len(r.ublocks)
            per_payload = r.n * _SYSCALL_S + needed / _BYTES_PER_S
            direct = per_payload < 2 * to_load / _BYTES_PER_S
            if direct and not self.direct_ok:
                # A compressed file: its memcpy'd heap chunks (those that did not compress)
                # hold their bytes as they are, so payloads in them are read in place too.
                raw_at = self._memcpyed_heap(self._heap_chunks_of(r.ublocks))
                direct = raw_at is not None
                if raw_at is not None:
                    hc_off = raw_at
            if not direct:
                heap_ctx = self._heap_context(r.ublocks)
                if by_block:  # slots by block id: the loaded blocks' ranges, the rest empty
                    full = [np.zeros(self.layout.num_blocks, np.int64) for _ in range(3)]
                    for a, v in zip(full, heap_ctx[1:]):
                        a[r.ublocks] = v
                    heap_ctx = (heap_ctx[0], full[0], full[1], full[2])
        pages = None
        if direct and self.pages is not None:
            # Payloads on pages not yet checked are read with the rest of their first and last
            # pages (into a scratch of two pages) and checked in that pass.
            pages = (
                self.pages.page_bytes,
                self.pages.heap_pages,
                self._hpchecked,
                self.scratch.get("heap_pages", 2 * self.pages.page_bytes),
            )
        elif direct:
            self._check_first_touch(self._heap_chunks_of(r.ublocks), "heap chunk")
        bufs = []
        for p in plans:
            dst_off = np.zeros(r.n + 1, np.int64)
            np.cumsum(sizes[p.field.name], out=dst_off[1:])
            bufs.append((self._payloads.take(int(dst_off[-1])), dst_off))
        if heap_ctx is None:
            # Every field's payloads in one call: a row's payloads lie next to each other in
            # its block's heap, so they are read together (one preadv per run in the file).
            try:
                self.store.read_payloads(
                    self._shards(r),
                    rowbuf,
                    self.rs,
                    [p.offset for p in plans],
                    idx,
                    heap_lo,
                    heap_hi,
                    hc_off,
                    self.layout.heap_chunk_bytes,
                    [b for b, _ in bufs],
                    [d for _, d in bufs],
                    chunk_base=chunk_base,
                    pages=pages,
                )
            except kernels.KernelError as exc:
                blk = int(r.blk[exc.index]) if 0 <= exc.index < r.n else None
                name = plans[exc.part or 0].field.name
                raise self.located(exc, f"field {name!r}", blk) from None
        for p, (payload, dst_off) in zip(plans, bufs):
            name = p.field.name
            if heap_ctx is not None:
                heap, lo, hi, base = heap_ctx
                try:
                    kernels.gather_heap(
                        rowbuf,
                        self.rs,
                        p.offset,
                        idx,
                        self.rpb,
                        lo,
                        hi,
                        base,
                        heap,
                        payload,
                        dst_off,
                    )
                except kernels.KernelError as exc:
                    blk = int(r.blk[exc.index]) if 0 <= exc.index < r.n else None
                    raise self.located(exc, f"field {name!r}", blk) from None
            columns[name] = Payloads(
                payload, dst_off, self._shapes(p, rowbuf, idx), columns.get(name + NULL_KEY)
            )

    def _payload_sizes(
        self,
        p: FieldPlan,
        r: _Rows,
        rowbuf: np.ndarray,
        idx: np.ndarray,
        heap_lo: np.ndarray,
        heap_hi: np.ndarray,
    ) -> np.ndarray:
        """Payload sizes of a heap field, bounded before they size any allocation: a payload
        lies in its block's heap range, apart from the other rows' (the kernels check the exact
        range again while copying)."""
        nbytes = np.empty(r.n, np.int64)
        kernels.gather_fixed(rowbuf, self.rs, p.offset + 8, 8, idx, nbytes)
        starts = np.empty(r.n, np.int64)
        kernels.gather_fixed(rowbuf, self.rs, p.offset, 8, idx, starts)
        bad = (nbytes < 0) | (nbytes > heap_hi - heap_lo)
        if bad.any():
            i = int(np.argmax(bad))
            path, blk, row = self.layout.where(int(r.rows[i]))
            raise FormatError(
                f"{path!r}: field {p.field.name!r}: row {row}: payload size {int(nbytes[i])} "
                f"exceeds its block's heap range (corrupt file)",
                path=path,
                block=blk,
                field=p.field.name,
                row=row,
            )
        inside = (starts >= heap_lo) & (starts <= heap_hi - nbytes)
        outside = (nbytes > 0) & ~inside
        if outside.any():  # what the kernels would report, before the payloads size a buffer
            i = int(np.argmax(outside))
            exc = kernels.KernelError(
                f"gather_heap: row {self.layout.where(int(r.rows[i]))[2]}: a payload reference "
                f"points "
                "outside its block's heap range (corrupt file)",
                code=kernels.KernelCode.E_BOUNDS,
                index=i,
                detail=int(r.rows[i]),
            )
            raise self.located(exc, f"field {p.field.name!r}", int(r.blk[i])) from None
        k = first_overlap(r.rows, r.blk, starts, nbytes, inside & (nbytes > 0))
        if k is not None:
            path, blk, row = self.layout.where(int(r.rows[k]))
            raise FormatError(
                f"{path!r}: field {p.field.name!r}: row {row}: payload overlaps another "
                f"row's payload in its block's heap range (corrupt file)",
                path=path,
                block=blk,
                field=p.field.name,
                row=row,
            )
        return nbytes

    def _shapes(self, p: FieldPlan, rowbuf: np.ndarray, idx: np.ndarray) -> np.ndarray | None:
        """Each row's full shape (int64, ``n x ndim``) for variable-shape fields, else None."""
        if not p.nvar:
            return None
        n = len(idx)
        var = np.empty((n, p.nvar), np.uint32)
        kernels.gather_fixed(rowbuf, self.rs, p.offset + 16, 4 * p.nvar, idx, var)
        shape = p.field.shape
        shapes = np.empty((n, len(shape)), np.int64)
        shapes[:, list(p.field.variable_dims)] = var
        for d, s in enumerate(shape):
            if s is not None:
                shapes[:, d] = s
        return shapes

    def _heap_chunks_of(self, ublocks: np.ndarray) -> np.ndarray:
        """The heap chunks (sorted ids) that the heap ranges of ``ublocks`` touch."""
        H = self.layout.heap_chunk_bytes
        lo_b, hi_b = self.arr["heap_start"][ublocks], self.arr["heap_end"][ublocks]
        base = self.arr["chunk_base"][ublocks]
        c_lo = base + lo_b // H
        c_hi = np.where(hi_b > lo_b, base + (hi_b - 1) // H, c_lo - 1)
        present = np.zeros(len(self.arr["hc_offset"]) + 1, np.bool_)
        for a, b in zip(c_lo, c_hi):
            present[a : b + 1] = True
        return np.flatnonzero(present[:-1]).astype(np.int64)

    def _memcpyed_heap(self, chunks: np.ndarray) -> np.ndarray | None:
        """Compressed files on a direct store (not verify="always"): the file offset of every
        heap chunk's raw bytes where ``chunks`` (sorted ids) are all memcpy'd (their headers
        read and checked once per reader), else None. verify=True then checks the pages a
        payload read touches (v3 files: the page index holds the CRCs of every heap chunk's
        raw bytes), or each chunk whole the first time a payload read touches it (v2)."""
        if not self.direct or self.codec is None or self.verify == "always":
            return None
        if self._hc_raw is None:
            self._hc_raw = np.full(len(self.arr["hc_offset"]), -2, np.int64)  # -2: not read
        raw_at = self._hc_raw
        todo = chunks[raw_at[chunks] == -2]
        if len(todo):
            try:
                got = self.store.memcpyed_starts(
                    self.layout.chunk_shard[todo] if self.multi else None,
                    self.arr["hc_offset"][todo],
                    self.arr["hc_stored"][todo],
                    codec=self.codec,
                    raw_size=self.layout.heap_chunk_bytes,
                    what="heap chunk",
                )
            except kernels.KernelError as exc:
                k = int(todo[exc.index]) if 0 <= exc.index < len(todo) else None
                raise self.located(exc, "heap chunk", k) from None
            raw_at[todo] = got
        return raw_at if bool((raw_at[chunks] >= 0).all()) else None

    def _heap_chunk_users(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per heap chunk, the first and last block whose heap range starts or ends in it, and
        the number of blocks with a heap range between them (-1, -1, 0 for chunks inside one
        block's range: no other block needs them)."""
        n = len(self.arr["hc_offset"])
        H = self.layout.heap_chunk_bytes
        lo_b, hi_b = self.arr["heap_start"], self.arr["heap_end"]
        full = hi_b > lo_b
        b = np.flatnonzero(full)
        base = self.arr["chunk_base"][b]
        ends = np.concatenate([base + lo_b[b] // H, base + (hi_b[b] - 1) // H])
        ends = np.clip(ends, 0, n - 1)  # bounded by the index checks; clipped for safety
        first = np.full(n, np.iinfo(np.int64).max, np.int64)
        last = np.full(n, -1, np.int64)
        np.minimum.at(first, ends, np.concatenate([b, b]))
        np.maximum.at(last, ends, np.concatenate([b, b]))
        inner = last < 0
        first[inner] = -1
        cum = np.concatenate(([0], np.cumsum(full)))
        users = np.where(inner, 0, cum[last + 1] - cum[np.maximum(first, 0)])
        users[users < 2] = 0  # one block only: never needed by another request
        # A chunk stored uncompressed (Blosc2 memcpy'd: larger than its raw size) is read again
        # at about the cost of copying it into the cache and out, so it is not kept.
        users[self.arr["hc_stored"] >= H] = 0
        self._nonempty = full
        return first, last, users

    def _count(self, n: int) -> None:
        with self._count_lock:
            self.heap_chunks_loaded += n

    def _load_heap(self, need: np.ndarray, ublocks: np.ndarray, heap: np.ndarray) -> None:
        """Heap chunks ``need`` (sorted) into consecutive slots of ``heap``: cached ones copied
        out of the :class:`_HeapCache`, the others loaded (one kernel call per run of them);
        then the ones shared with a block outside ``ublocks`` are cached."""
        H = self.layout.heap_chunk_bytes
        cache = self._heap_cache
        if cache is None:
            self._load(need, "heap chunk", heap)
            self._count(len(need))
            return
        ids = need.tolist()
        hits = cache.take_into(ids, heap)
        missing = np.fromiter((c not in hits for c in ids), np.bool_, len(ids))
        runs = np.flatnonzero(np.diff(np.concatenate(([0], missing.view(np.int8), [0]))))
        for a, z in zip(runs[::2].tolist(), runs[1::2].tolist()):
            self._load(need[a:z], "heap chunk", heap[a * H : z * H])
            self._count(z - a)
        first, last, _ = self._chunk_users
        edge = np.flatnonzero(last[need] >= 0)
        if not len(edge):
            return
        f, la = first[need[edge]], last[need[edge]]
        # Blocks of this request with a heap range, among those touching each edge chunk.
        cum = np.concatenate(([0], np.cumsum(self._nonempty[ublocks])))
        touching = cum[np.searchsorted(ublocks, la, "right")] - cum[np.searchsorted(ublocks, f)]
        slots = {ids[i]: heap[i * H : (i + 1) * H] for i in edge.tolist()}
        cache.settle(need[edge], touching, slots)

    def _heap_context(
        self, ublocks: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Load every heap chunk the loaded blocks' heap ranges touch: (heap buffer, per-slot
        lo, hi, base) for ``gather_heap``."""
        H = self.layout.heap_chunk_bytes
        lo_b, hi_b = self.arr["heap_start"][ublocks], self.arr["heap_end"][ublocks]
        need = self._heap_chunks_of(ublocks)
        heap = self.scratch.get("heap", len(need) * H)
        if len(need):
            self._load_heap(need, ublocks, heap)
        first = (
            self.arr["chunk_base"][ublocks] + lo_b // H
        )  # each block's first chunk, dataset-wide
        base = np.searchsorted(need, first) * H - (lo_b // H) * H
        return heap, lo_b, hi_b, base

    # -- the page index (format v3) ----------------------------------------------------------
    def _row_pages(self, r: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """verify=True, a file with a page index, before rows are read directly: a row that
        is its page's only row (rows of a page or more; a block of one row) is checked in the
        read's pass: returns ``(page of each row, whether to check it, its CRC-32)`` (None when
        none is left to check); the pages of other rows that are not checked yet are checked
        here, before the read (a read of their own, as they hold rows not asked for)."""
        pi = self.pages
        assert pi is not None
        pg = pi.block_page0[r.blk] + (r.rows - r.blk * self.rpb) // pi.rows_per_page
        todo = ~self._pchecked[pg]
        if not todo.any():
            return None
        if pi.rows_per_page > 1:
            alone = pi.block_page_size[pg] == self.rs
            before = todo & ~alone
            if before.any():
                want = np.zeros(len(self._pchecked), np.bool_)  # pages to check, sorted, unique
                want[pg[before]] = True
                self._check_pages(np.flatnonzero(want))
                todo &= alone
                if not todo.any():
                    return None
        return pg, todo, pi.block_pages[pg]

    def _mark_rows(self, in_pass: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> None:
        if in_pass is not None:
            self._pchecked[in_pass[0][in_pass[1]]] = True
            self._pages_done = bool(self._pchecked.all())

    def _row_error(self, exc: kernels.KernelError, r: _Rows) -> FormatError:
        """A page check of requested row ``exc.index`` failed: the error, located at its block."""
        k = int(r.blk[exc.index]) if 0 <= exc.index < r.n else None
        return self.located(exc, "block", k)

    def _check_pages(self, pages: np.ndarray) -> None:
        """Read and check the block pages ``pages`` (sorted ids), runs of consecutive pages of
        one block in one read each, and mark them checked (threads racing on a page only
        check it twice)."""
        pi = self.pages
        assert pi is not None
        chunk = np.searchsorted(pi.block_page0, pages, side="right") - 1
        first = pi.block_page0[chunk]
        offs, sizes, crcs = self.arr["offset"], pi.block_page_size, pi.block_pages
        plen = pi.rows_per_page * self.rs
        # Runs: consecutive pages of one chunk, at most 1 MiB each.
        cap = max(1, (1 << 20) // plen)
        brk = np.ones(len(pages), np.bool_)
        brk[1:] = (pages[1:] != pages[:-1] + 1) | (chunk[1:] != chunk[:-1])
        run_id = np.cumsum(brk) - 1
        start_of = np.flatnonzero(brk)
        pos = np.arange(len(pages)) - start_of[run_id]
        brk |= pos % cap == 0
        starts = np.flatnonzero(brk)
        ends = np.append(starts[1:], len(pages))
        p0 = pages[starts]
        run_off = offs[chunk[starts]] + (p0 - first[starts]) * plen
        csum = np.concatenate(([0], np.cumsum(sizes[pages])))
        run_size = csum[ends] - csum[starts]
        shards = self.layout.block_shard[chunk[starts]] if self.multi else None
        scratch = self.scratch.get("pages", int(run_size.max()) if len(run_size) else 1)
        try:
            self.store.check_pages(shards, run_off, run_size, plen, crcs[pages], scratch)
        except kernels.KernelError as exc:
            if isinstance(exc, kernels.KernelChecksumError):
                k = int(chunk[exc.index]) if 0 <= exc.index < len(pages) else None
            else:
                k = int(chunk[starts[exc.index]]) if 0 <= exc.index < len(starts) else None
            raise self.located(exc, "block", k) from None
        self._pchecked[pages] = True
        self._pages_done = bool(self._pchecked.all())

    def _check_first_touch(self, which: np.ndarray, what: str) -> None:
        """verify=True before a direct read: checksum, whole, each chunk of ``which`` (blocks or
        heap chunks) not yet checked by this reader in this process (a chunk touched again is
        read directly, without a check)."""
        checked = self._checked if what == "block" else self._hchecked
        if checked is None or not len(which) or checked[which].all():
            return
        with self._check_lock:
            self._check_chunks(which[~checked[which]], what)

    def _check_chunks(self, todo: np.ndarray, what: str) -> None:
        """Load ``todo`` whole, for their checksums (:meth:`_load` marks them checked)."""
        raw = self.layout.block_raw_bytes if what == "block" else self.layout.heap_chunk_bytes
        step = max(1, (16 << 20) // raw)
        buf = self.scratch.get("check", min(step, len(todo)) * raw)
        for a in range(0, len(todo), step):
            part = todo[a : a + step]
            self._load(part, what, buf[: len(part) * raw])
