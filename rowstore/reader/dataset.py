"""The reader: random access and shuffled batches, through the compiled kernels.

On open, :class:`~rowstore.format.index.Layout` reads the schema and block index once through
libhdf5; afterwards reads are ``pread`` calls on a plain file descriptor, opened lazily in each
process (so a reader survives ``fork`` and pickling), and the kernels release the GIL.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError
from rowstore.format import spec
from rowstore.format.index import Layout, file_identity
from rowstore.reader import order as _order
from rowstore.reader._args import nonneg_int, positive_int
from rowstore.reader.buffers import (
    NULL_KEY,
    SHAPE_KEY,
    Ragged,
    concat_batches,
    pad_ragged,
    slice_batch,
)
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = ["Reader"]

VARLEN_MODES = ("ragged", "padded")
#: Rough costs used to choose between reading whole blocks and reading rows directly.
_SYSCALL_S = 1.5e-6
_BYTES_PER_S = 6e9


@dataclass(frozen=True)
class _FieldPlan:
    field: Field
    kind: str  # "fixed" | "raw_var" | "text" | "bytes" | "image"
    offset: int  # byte offset of the value (fixed) or of the heap reference in the row
    nbytes: int  # fixed: bytes of one value
    nvar: int  # number of variable dimensions
    null_offset: int  # byte offset of the __null flag, or -1


def _plan_fields(schema: Schema, row_dtype: np.dtype) -> dict[str, _FieldPlan]:
    plans = {}
    fields = row_dtype.fields
    assert fields is not None  # spec.row_dtype(schema): a structured dtype
    for f in schema:
        off = fields[f.name][1]
        null_off = fields[f.name + spec.NULL_SUFFIX][1] if f.nullable else -1
        if f.inline:
            kind = "fixed"
        elif f.dtype == STR:
            kind = "text"
        elif f.dtype == BYTES:
            kind = "bytes"
        elif f.codec["id"] == "raw":
            kind = "raw_var"
        else:
            kind = "image"
        plans[f.name] = _FieldPlan(f, kind, off, f.fixed_nbytes, len(f.variable_dims), null_off)
    return plans


def _check_varlen(varlen: str) -> str:
    if varlen not in VARLEN_MODES:
        raise ValueError(f"varlen must be one of {VARLEN_MODES}, got {varlen!r}")
    return varlen


def _parallel(fn, n: int, pool: ThreadPoolExecutor | None) -> None:
    """Run ``fn(lo, hi)`` over ``range(n)``, in chunks on ``pool`` when given (image decoders
    release the GIL), so a segment of images uses every core even when few are in flight."""
    k = min(pool._max_workers, n // 4) if pool is not None else 1
    if pool is None or k <= 1:
        fn(0, n)
        return
    bounds = np.linspace(0, n, k + 1).astype(int)
    for fut in [pool.submit(fn, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]:
        fut.result()


def _decoders(plans: list[_FieldPlan], threads: int) -> ThreadPoolExecutor | None:
    """A pool for decoding images when there are images and threads to use (the caller shuts
    it down when its call or epoch ends: no threads outlive a read)."""
    if threads > 1 and any(p.kind == "image" for p in plans):
        return ThreadPoolExecutor(threads, thread_name_prefix="rowstore-decode")
    return None


class _Scratch(threading.local):
    """Per-thread reusable buffers for loaded blocks (reused across calls: no page faults)."""

    def get(self, name: str, nbytes: int) -> np.ndarray:
        buf = getattr(self, name, None)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(max(nbytes, 1), np.uint8)
            setattr(self, name, buf)
        return buf[:nbytes]


class Reader:
    """Read a rowstore dataset.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.h5`` file written by :class:`rowstore.Writer`.
    verify : bool or "always"
        ``True`` (default): check the CRC-32 of every chunk that is read whole (at tens of GB/s,
        cheap beside decompression); a mismatch raises :class:`~rowstore.errors.ChecksumError`.
        Rows and payloads of uncompressed files that are read directly (when that is cheaper
        than whole blocks) are bounds-checked but not checksummed. ``"always"`` reads whole
        chunks only, so every byte handed out was checksummed; ``False`` checks nothing.
        ``rowstore verify PATH`` checks a whole file once.
    varlen : {"ragged", "padded"}
        Default output of variable-shape fields: a :class:`~rowstore.reader.buffers.Ragged`
        (values + offsets + shapes), or a zero-padded array plus ``"<name>__shape"`` (``n x k``
        int64, the variable dimensions of each row).
    num_threads : int
        Default number of threads for :meth:`batches` (default: ``min(4, os.cpu_count())``).

    Notes
    -----
    Output dicts map field names to arrays with a leading batch dimension: fixed-shape fields
    and images give ``ndarray``; variable shapes give ``Ragged`` (or padded arrays); ``str`` and
    ``bytes`` give ``object`` arrays. A nullable field adds ``"<name>__null"`` (bool), and null
    ``str``/``bytes`` values are ``None``. Arrays handed out are owned by the caller: the reader
    never writes into them again (no copy is needed to keep a batch). A batch from
    :meth:`batches` is a view of its segment's arrays (a window of blocks, decoded), so keeping
    one batch keeps that segment's memory alive; copy it (``a.copy()``) to keep a few rows of
    many batches.

    Memory while iterating is bounded by ``num_threads * prefetch + 1`` decoded segments plus a
    scratch buffer of ``window`` blocks per thread, whatever the dataset's size (``full``
    shuffling also keeps the shard's permutation, 8 bytes per row).

    Readers pickle by path and options, and open their file descriptor lazily in each process,
    so they can be created before ``fork`` or sent to ``spawn`` workers. Methods are
    thread-safe; kernels and image decoders run without the GIL.
    """

    def __init__(
        self,
        path: str | bytes | os.PathLike,
        *,
        verify: bool | str = True,
        varlen: str = "ragged",
        num_threads: int | None = None,
    ):
        _check_varlen(varlen)
        self.path = os.fsdecode(path)  # str, also for a bytes path: errors carry it as their path
        if verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always', got {verify!r}")
        self.verify = verify
        self.varlen = varlen
        self.num_threads = num_threads or min(4, os.cpu_count() or 1)
        self._init_state(Layout.open(self.path))

    def _init_state(self, layout: Layout) -> None:
        self.layout = layout
        self.schema: Schema = layout.schema
        self._plans = _plan_fields(layout.schema, layout.row_dtype)
        self._arr = layout.arrays()
        self._row_size = layout.row_dtype.itemsize
        self._rpb = layout.rows_per_block
        self._fd_pid: int | None = None
        self._fd: int | None = None
        self._fd_lock = threading.Lock()
        self._scratch = _Scratch()
        stored = self._arr["stored"]
        hstored = self._arr["hc_stored"]
        self._max_stored = int(max(stored.max() if len(stored) else 0, hstored.max() if len(hstored) else 0))

    # -- pickling / fork -------------------------------------------------------------------
    def __getstate__(self) -> dict:
        return {"path": self.path, "verify": self.verify, "varlen": self.varlen, "num_threads": self.num_threads, "layout": self.layout}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self.verify = state["verify"]
        self.varlen = state["varlen"]
        self.num_threads = state["num_threads"]
        self._init_state(state["layout"])

    def _fileno(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._fd_pid != pid:
            with self._fd_lock:
                if self._fd is None or self._fd_pid != pid:
                    # A descriptor inherited through fork shares nothing we rely on (pread has
                    # no file position), but we open our own so closing in one process is local.
                    fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    if self.layout.file_id and file_identity(os.fstat(fd)) != self.layout.file_id:
                        os.close(fd)
                        raise FormatError(
                            f"{self.path!r} changed since it was opened (replaced, appended to or modified); "
                            f"open it again to read the new version", path=self.path)
                    self._fd, self._fd_pid = fd, pid
        return self._fd

    def close(self) -> None:
        """Close this process's file descriptor (reopened on next use)."""
        if self._fd is not None and self._fd_pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- basic access ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.layout.num_rows

    def __repr__(self) -> str:
        return f"<rowstore.Reader {self.path!r}: {len(self)} rows, fields {self.schema.names}>"

    @property
    def num_rows(self) -> int:
        return self.layout.num_rows

    def __getitem__(self, i: int) -> dict[str, Any]:
        """One row as a dict: arrays, scalars (0-d arrays), str/bytes, ``None`` for nulls."""
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"rows are indexed by int, got {type(i).__name__}; use take() for many")
        batch = self.take([i], varlen="ragged")
        row: dict[str, Any] = {}
        for f in self.schema:
            v = batch[f.name][0]
            if f.nullable and batch[f.name + NULL_KEY][0]:
                v = None
            row[f.name] = v
        return row

    def _global_rows(self, indices: Any) -> np.ndarray:
        """Dataset row numbers -> global row ids (block * rows_per_block + row in block)."""
        idx = np.asarray(indices)
        if idx.dtype == bool:
            raise TypeError("boolean masks are not supported; pass indices")
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        n = self.num_rows
        if idx.size:
            idx = np.where(idx < 0, idx + n, idx)
            bad = (idx < 0) | (idx >= n)
            if bad.any():
                raise IndexError(f"row index {int(np.asarray(indices).reshape(-1)[np.argmax(bad)])} out of range for {n} rows")
        # Every block but the last is full, so row number == global row id.
        return idx

    def take(self, indices: Sequence[int] | np.ndarray, *, fields: Sequence[str] | None = None,
             out: dict[str, np.ndarray] | None = None, varlen: str | None = None) -> dict[str, Any]:
        """The given rows (any order, repeats allowed) as a dict of per-field batch arrays.

        ``out`` may supply C-contiguous arrays for fixed-shape fields (``(n, *shape)`` of the
        field's dtype); they are filled and returned in place of new arrays.
        """
        plans = self._select(fields)
        varlen = _check_varlen(varlen or self.varlen)
        rows = self._global_rows(indices)
        if out is not None:
            self._check_out(out, plans, len(rows))
        decoders = _decoders(plans, self.num_threads)
        try:
            pieces = [self._gather(rows[a:b], plans, out, a, decoders) for a, b in self._pieces(rows)]
        finally:
            if decoders is not None:
                decoders.shutdown()
        batch = concat_batches(pieces) if pieces else self._gather(rows, plans, out, 0)
        if out:
            batch.update({k: v for k, v in out.items() if k in batch})
        return self._finish_varlen(batch, plans, varlen)

    def _pieces(self, rows: np.ndarray) -> list[tuple[int, int]]:
        """Split a take into pieces that bound the blocks loaded at once."""
        n = len(rows)
        if n == 0:
            return []
        if not self.layout.compressed:
            step = 1 << 16
            return [(a, min(a + step, n)) for a in range(0, n, step)]
        # Compressed: a piece loads each block it touches whole; cap blocks per piece at 64.
        out, a, cap = [], 0, 64
        blocks = rows // self._rpb
        while a < n:
            b = min(n, a + (1 << 16))
            while b - a > cap and len(np.unique(blocks[a:b])) > cap:
                b = a + max(cap, (b - a) // 2)
            out.append((a, b))
            a = b
        return out

    def _select(self, fields: Sequence[str] | None) -> list[_FieldPlan]:
        return [self._plans[f.name] for f in self.schema.select(fields)]

    def _check_out(self, out: dict, plans: list[_FieldPlan], n: int) -> None:
        for name, arr in out.items():
            p = self._plans.get(name)
            if p is None or not any(q is p for q in plans):
                raise ValueError(f"out[{name!r}]: not a selected field")
            if p.kind != "fixed" and not (p.kind == "image" and not p.field.is_variable):
                raise ValueError(f"out[{name!r}]: only fixed-shape fields take out= arrays")
            want = (n,) + tuple(p.field.shape)
            if not isinstance(arr, np.ndarray) or arr.dtype != p.field.dtype.newbyteorder("=") and arr.dtype != p.field.dtype \
                    or arr.shape != want or not arr.flags.c_contiguous or not arr.flags.writeable:
                raise ValueError(
                    f"out[{name!r}] must be a writeable C-contiguous {p.field.dtype} array of shape {want}, got "
                    f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}"
                )

    # -- the gather ------------------------------------------------------------------------
    def _strategy(self, n: int, nblocks: int, has_heap: bool, nfixed: int) -> str:
        """How to read ``n`` rows spread over ``nblocks`` blocks, by a cost estimate:
        ``"blocks"`` (load whole blocks, then gather), ``"rows"`` (pread each row, then gather:
        uncompressed files, few rows per block), or ``"preadv"`` (uncompressed, fixed-size fields
        only: each row straight into the batch arrays)."""
        if self.layout.compressed or self.verify == "always":
            return "blocks"
        row = self._row_size / _BYTES_PER_S
        costs = {
            "blocks": nblocks * self.layout.block_raw_bytes / _BYTES_PER_S + n * row,
            "rows": n * (_SYSCALL_S + 2 * row),
        }
        if not has_heap and nfixed <= 30:  # preadv_rows takes up to 64 pieces per row
            costs["preadv"] = n * (_SYSCALL_S + row)
        return min(costs, key=costs.__getitem__)

    @staticmethod
    def _segments(fixed: list[tuple[int, int, np.ndarray]], row_size: int) -> list[tuple[int, np.ndarray | None]]:
        """Cut a row into consecutive (size, out) pieces for ``preadv_rows``; bytes no field
        asked for go to the sink (None)."""
        segs: list[tuple[int, np.ndarray | None]] = []
        pos = 0
        for off, size, out in sorted(fixed, key=lambda t: t[0]):
            if size == 0:
                continue
            if off > pos:
                segs.append((off - pos, None))
            segs.append((size, out))
            pos = off + size
        if pos < row_size:
            segs.append((row_size - pos, None))
        return segs

    def _gather(self, rows_or_seg: np.ndarray | _order.Segment, plans: list[_FieldPlan], out: dict | None = None,
                out_start: int = 0, decoders: ThreadPoolExecutor | None = None) -> dict[str, Any]:
        """Read ``rows_or_seg`` (global row ids, or a Segment) and return their fields. The
        kernels run without the GIL, so several threads gather in parallel."""
        # Global row ids and their blocks (arrays), or None where the path taken needs none: the
        # strategy below decides which are set, so they are typed loosely.
        rows: Any
        blk: Any = None
        ublocks = local = seg = None
        if isinstance(rows_or_seg, _order.Segment):
            seg, ublocks, local = rows_or_seg, rows_or_seg.blocks, rows_or_seg.local()
            n = len(seg)
            # Window segments: global row ids are computed below only where needed.
            rows = None if local is not None else seg.rows()
        else:
            rows = rows_or_seg
            n = len(rows)
        fd = self._fileno()
        rpb, rs = self._rpb, self._row_size
        arr = self._arr
        if ublocks is None:
            blk = rows // rpb
            present = np.zeros(self.layout.num_blocks, np.bool_)
            present[blk] = True
            ublocks = np.flatnonzero(present)
        heap_plans = [p for p in plans if p.kind != "fixed"]
        strategy = self._strategy(n, len(ublocks), bool(heap_plans), 2 * len(plans))
        direct = strategy != "blocks"
        if rows is None and (direct or heap_plans or local is None):
            assert seg is not None  # rows is None only for a segment
            rows = seg.rows()
        if rows is not None and blk is None:
            blk = rows // rpb
        batch: dict[str, Any] = {}
        # Fixed-size values and null flags of all fields.
        fixed: list[tuple[int, int, np.ndarray]] = []
        for p in plans:
            f = p.field
            if p.null_offset >= 0:
                nulls = np.empty(n, np.bool_)
                fixed.append((p.null_offset, 1, nulls))
                batch[f.name + NULL_KEY] = nulls
            if p.kind == "fixed":
                dst = out[f.name][out_start : out_start + n] if out and f.name in out else np.empty((n,) + f.shape, f.dtype)
                fixed.append((p.offset, p.nbytes, dst))
                batch[f.name] = dst
        if strategy == "preadv":
            # Large fixed-size rows of an uncompressed file: each row goes from the page cache
            # straight into the batch arrays, one preadv per row, no intermediate buffer.
            offs = arr["offset"][blk] + (rows - blk * rpb) * rs
            kernels.preadv_rows(fd, offs, rs, self._segments(fixed, rs), self._scratch.get("sink", rs))
            return batch
        if direct:
            rowbuf = self._scratch.get("rows", n * rs)
            offs = arr["offset"][blk] + (rows - blk * rpb) * rs
            kernels.pread_rows(fd, offs, rs, rowbuf)
            idx = np.arange(n, dtype=np.int64)
        else:
            raw = self.layout.block_raw_bytes
            rowbuf = self._scratch.get("rows", len(ublocks) * raw)
            scratch = self._scratch.get("stage", self._max_stored if self.layout.compressed else 1)
            try:
                kernels.load_chunks(fd, arr["offset"][ublocks], arr["stored"][ublocks], arr["checksum"][ublocks],
                                    codec=None if not self.layout.compressed else (
                                        {"blosclz": 0, "lz4": 1, "lz4hc": 2, "zlib": 4, "zstd": 5}[self.layout.compression["cname"]],
                                        {"none": 0, "byte": 1, "bit": 2}[self.layout.compression["shuffle"]]),
                                    verify=bool(self.verify), dst=rowbuf, raw_size=raw,
                                    scratch=scratch, what="block")
            except kernels.KernelError as exc:
                raise self._located(exc, f"block {int(ublocks[exc.index])}", int(ublocks[exc.index])) from None
            if local is not None:
                idx = local  # the segment's rows, already as positions in the loaded blocks
            else:
                lookup = np.empty(self.layout.num_blocks, np.int64)
                lookup[ublocks] = np.arange(len(ublocks), dtype=np.int64) * rpb
                idx = lookup[blk] + (rows - blk * rpb)
        if fixed:
            # One pass over the rows for all fields: one cache miss per row, not per field.
            kernels.gather_rows(rowbuf, rs, idx, fixed)

        if not heap_plans:
            return batch
        # Payload sizes of every heap field, bounded before they size any allocation: a payload
        # lies in its block's heap range (the kernels check the exact range while copying).
        heap_lo, heap_hi = arr["heap_start"][blk], arr["heap_end"][blk]
        heap_span = heap_hi - heap_lo
        sizes = {}
        for p in heap_plans:
            nbytes = np.empty(n, np.int64)
            kernels.gather_fixed(rowbuf, rs, p.offset + 8, 8, idx, nbytes)
            bad = (nbytes < 0) | (nbytes > heap_span)
            if bad.any():
                i = int(np.argmax(bad))
                raise FormatError(f"{self.path!r}: field {p.field.name!r}: row {int(rows[i])}: payload size {int(nbytes[i])} "
                                  f"exceeds its block's heap range (corrupt file)", path=self.path, block=int(blk[i]))
            sizes[p.field.name] = nbytes
        heap_ctx = None
        if self.layout.compressed or not direct:
            # Uncompressed heaps: pread each payload into place when that moves fewer bytes than
            # loading the heap chunks under the blocks' ranges (large payloads, few fields).
            needed = sum(int(v.sum()) for v in sizes.values())
            to_load = int((arr["heap_end"][ublocks] - arr["heap_start"][ublocks]).sum()) + self.layout.heap_chunk_bytes * len(ublocks)
            per_payload = n * len(heap_plans) * _SYSCALL_S + needed / _BYTES_PER_S
            direct = not self.layout.compressed and self.verify != "always" and per_payload < 2 * to_load / _BYTES_PER_S
            if not direct:
                heap_ctx = self._heap_context(fd, ublocks)
        for p in heap_plans:
            f = p.field
            name = f.name
            dst_off = np.zeros(n + 1, np.int64)
            np.cumsum(sizes[name], out=dst_off[1:])
            payload = np.empty(int(dst_off[-1]), np.uint8)
            try:
                if heap_ctx is None:
                    kernels.pread_heap(fd, rowbuf, rs, p.offset, idx, heap_lo, heap_hi, arr["hc_offset"],
                                       self.layout.heap_chunk_bytes, payload, dst_off)
                else:
                    heap, lo, hi, base = heap_ctx
                    kernels.gather_heap(rowbuf, rs, p.offset, idx, rpb, lo, hi, base, heap, payload, dst_off)
            except kernels.KernelError as exc:
                raise FormatError(f"{self.path!r}: field {name!r}: {exc}", path=self.path) from None
            shapes = None
            if p.nvar:
                var = np.empty((n, p.nvar), np.uint32)
                kernels.gather_fixed(rowbuf, rs, p.offset + 16, 4 * p.nvar, idx, var)
                shapes = np.empty((n, len(f.shape)), np.int64)
                vi = 0
                for d, s in enumerate(f.shape):
                    if s is None:
                        shapes[:, d] = var[:, vi]
                        vi += 1
                    else:
                        shapes[:, d] = s
            batch[name] = self._decode(p, payload, dst_off, shapes, batch.get(name + NULL_KEY), out, out_start, n, decoders)
        return batch

    def _located(self, exc: kernels.KernelError, where: str, block: int | None = None) -> FormatError:
        """The kernel error re-raised with the file and the block or chunk it concerns."""
        msg = str(exc).split(": ", 1)[-1]
        return type(exc)(f"{self.path!r}: {where}: {msg}", code=exc.code, index=exc.index, detail=exc.detail,
                         path=self.path, block=block)

    def _heap_context(self, fd: int, ublocks: np.ndarray):
        """Load every heap chunk the loaded blocks' heap ranges touch: (heap buffer, per-slot
        lo, hi, base) for ``gather_heap``."""
        arr = self._arr
        H = self.layout.heap_chunk_bytes
        lo_b, hi_b = arr["heap_start"][ublocks], arr["heap_end"][ublocks]
        c_lo = lo_b // H
        c_hi = np.where(hi_b > lo_b, (hi_b - 1) // H, c_lo - 1)
        present = np.zeros(len(arr["hc_offset"]) + 1, np.bool_)
        for a, b in zip(c_lo, c_hi):
            present[a : b + 1] = True
        need = np.flatnonzero(present[:-1]).astype(np.int64)
        heap = self._scratch.get("heap", len(need) * H)
        if len(need):
            scratch = self._scratch.get("stage", self._max_stored if self.layout.compressed else 1)
            try:
                kernels.load_chunks(fd, arr["hc_offset"][need], arr["hc_stored"][need], arr["hc_checksum"][need],
                                    codec=None if not self.layout.compressed else (
                                        {"blosclz": 0, "lz4": 1, "lz4hc": 2, "zlib": 4, "zstd": 5}[self.layout.compression["cname"]],
                                        {"none": 0, "byte": 1, "bit": 2}[self.layout.compression["shuffle"]]),
                                    verify=bool(self.verify), dst=heap, raw_size=H,
                                    scratch=scratch, what="heap chunk")
            except kernels.KernelError as exc:
                raise self._located(exc, f"heap chunk {int(need[exc.index])}") from None
        base = np.searchsorted(need, c_lo) * H - c_lo * H
        return heap, lo_b, hi_b, base

    def _decode(self, p: _FieldPlan, payload, dst_off, shapes, nulls, out, out_start, n, decoders=None):
        f = p.field
        if p.kind == "text":
            vals = np.empty(n, object)
            mv = payload.tobytes()
            try:
                vals[:] = [mv[dst_off[i] : dst_off[i + 1]].decode("utf-8") for i in range(n)]
            except UnicodeDecodeError as exc:
                raise FormatError(f"{self.path!r}: field {f.name!r}: stored text is not UTF-8 (corrupt file)", path=self.path) from exc
            if nulls is not None:
                vals[nulls] = None
            return vals
        if p.kind == "bytes":
            vals = np.empty(n, object)
            mv = payload.tobytes()
            vals[:] = [mv[dst_off[i] : dst_off[i + 1]] for i in range(n)]
            if nulls is not None:
                vals[nulls] = None
            return vals
        if p.kind == "raw_var":
            counts = np.prod(shapes, axis=1)
            item = f.dtype.itemsize
            if not np.array_equal(counts * item, np.diff(dst_off)):
                raise FormatError(f"{self.path!r}: field {f.name!r}: payload sizes disagree with stored shapes (corrupt file)", path=self.path)
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(counts, out=offsets[1:])
            return Ragged(payload.view(f.dtype), offsets, shapes)
        # images: decode each payload into its place (imagecodecs releases the GIL)
        codec = f.codec_obj
        starts, ends = dst_off[:-1], dst_off[1:]
        if not f.is_variable:
            dst = out[f.name][out_start : out_start + n] if out and f.name in out else np.empty((n,) + f.shape, f.dtype)

            def decode(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    if nulls is not None and nulls[i]:
                        dst[i] = 0
                    else:
                        self._decode_one(codec, f, payload[starts[i] : ends[i]], dst[i])

            _parallel(decode, n, decoders)
            return dst
        counts = np.prod(shapes, axis=1)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        values = np.empty(int(offsets[-1]), f.dtype)

        def decode_var(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                if counts[i]:
                    out_i = values[offsets[i] : offsets[i + 1]].reshape(tuple(shapes[i]))
                    self._decode_one(codec, f, payload[starts[i] : ends[i]], out_i)

        _parallel(decode_var, n, decoders)
        return Ragged(values, offsets, shapes)

    def _decode_one(self, codec, f: Field, src: np.ndarray, out: np.ndarray) -> None:
        try:
            codec.decode_into(src, out)
        except FormatError:
            raise
        except Exception as exc:
            raise FormatError(f"{self.path!r}: field {f.name!r}: {exc}", path=self.path) from exc

    def _finish_varlen(self, batch: dict, plans: list[_FieldPlan], varlen: str) -> dict:
        if varlen != "padded":
            return batch
        for p in plans:
            v = batch.get(p.field.name)
            if isinstance(v, Ragged):
                batch[p.field.name + SHAPE_KEY] = v.shapes[:, list(p.field.variable_dims)]
                batch[p.field.name] = pad_ragged(v)
        return batch

    # -- epochs ----------------------------------------------------------------------------
    def epoch_order(self, *, shuffle: str = "block", seed: int = 0, epoch: int = 0, window: int = 16,
                    shard: tuple[int, int] = (0, 1), even: bool = False) -> np.ndarray:
        """The row numbers of one epoch of ``batches`` with these arguments, in order."""
        return _order.epoch_order(self.layout.block_rows(), self._rpb, shuffle=shuffle, seed=seed, epoch=epoch,
                                  window=window, rank=shard[0], world=shard[1], even=even)

    def shard_size(self, *, shard: tuple[int, int] = (0, 1), even: bool = False) -> int:
        """Rows of ``shard``'s part of an epoch."""
        _order.check_shard(*shard)
        lo, hi = _order.shard_bounds(self.num_rows, shard[0], shard[1], even)
        return hi - lo

    def num_batches(self, batch_size: int, *, shard: tuple[int, int] = (0, 1), even: bool = False,
                    drop_last: bool = False, start: int = 0) -> int:
        """Batches that :meth:`batches` yields with these arguments."""
        positive_int("batch_size", batch_size)
        n = max(0, self.shard_size(shard=shard, even=even) - nonneg_int("start", start))
        return n // batch_size if drop_last else -(-n // batch_size)

    def shuffle_quality(self, batch_size: int, **order_kwargs) -> float:
        """:func:`rowstore.reader.order.shuffle_quality` of the epoch order these arguments give."""
        order = self.epoch_order(**order_kwargs)
        return _order.shuffle_quality(order, self._rpb, self.layout.num_blocks, batch_size)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: str = "block",
        seed: int = 0,
        epoch: int = 0,
        window: int = 16,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] = (0, 1),
        even: bool = False,
        drop_last: bool = False,
        num_threads: int | None = None,
        prefetch: int = 2,
        varlen: str | None = None,
        start: int = 0,
    ) -> Generator[dict[str, Any], None, None]:
        """Yield one epoch of batches (dicts of per-field arrays with ``batch_size`` rows).

        Parameters
        ----------
        shuffle : {"block", "full", "none"}
            See :mod:`rowstore.reader.order`. ``block`` reads whole blocks (fastest); ``full`` is
            a uniform permutation (uncompressed files read such rows directly; compressed
            files must decompress a block per row, so prefer ``block`` for them).
        seed, epoch : int
            The order is a pure function of (seed, epoch, layout, shard).
        window : int
            Blocks whose rows are mixed together in ``block`` mode; memory grows with it.
        shard : (rank, world)
            This consumer's part of the epoch (DDP rank x DataLoader worker).
        even : bool
            Give every shard exactly ``len // world`` rows (drops up to ``world - 1`` rows).
        num_threads : int
            Threads reading ahead (kernels and image decoders release the GIL).
        prefetch : int
            Segments (windows) read ahead per thread; memory ~ ``num_threads * prefetch *
            window * block_bytes``.
        start : int
            Skip this many rows of the shard's epoch (resume mid-epoch).

        Yields
        ------
        dict
            Arrays owned by the caller (never overwritten by the reader).
        """
        positive_int("batch_size", batch_size)
        nonneg_int("start", start)
        positive_int("prefetch", prefetch)
        positive_int("num_threads", num_threads, optional=True)
        rank, world = shard
        _order.check_args(shuffle, seed, epoch, window, rank, world)
        plans = self._select(fields)
        varlen = _check_varlen(varlen or self.varlen)
        seg_rows = None
        if shuffle == "full":
            # Compressed: a segment must not touch more than `window` blocks; uncompressed
            # rows are read directly, so segments can be large.
            seg_rows = window if self.layout.compressed else max(batch_size, 4096)
        segments = _order.iter_segments(
            self.layout.block_rows(), self._rpb, shuffle=shuffle, seed=seed, epoch=epoch, window=window,
            rank=rank, world=world, even=even, start=start, segment_rows=seg_rows,
        )  # fmt: skip
        threads = num_threads or self.num_threads
        return self._batch_stream(segments, plans, batch_size, drop_last, threads, prefetch, varlen)

    def _batch_stream(self, segments, plans, batch_size, drop_last, threads, prefetch, varlen):
        carry: list[dict] = []
        carry_n = 0

        def emit(b):
            return self._finish_varlen(b, plans, varlen)

        for seg in self._segment_results(segments, plans, threads, prefetch):
            m = len(next(iter(seg.values()))) if seg else 0
            pos = 0
            if carry_n:
                need = min(batch_size - carry_n, m)
                carry.append(slice_batch(seg, 0, need))
                carry_n += need
                pos = need
                if carry_n == batch_size:
                    yield emit(concat_batches(carry))
                    carry, carry_n = [], 0
            if pos + batch_size <= m:
                if any(isinstance(v, Ragged) for v in seg.values()):
                    while pos + batch_size <= m:
                        yield emit(slice_batch(seg, pos, pos + batch_size))
                        pos += batch_size
                else:
                    # Plain arrays only (the common case): views, without per-batch checks.
                    items = list(seg.items())
                    while pos + batch_size <= m:
                        end = pos + batch_size
                        yield {k: v[pos:end] for k, v in items}
                        pos = end
            if pos < m:
                carry.append(slice_batch(seg, pos, m))
                carry_n += m - pos
        if carry_n and not drop_last:
            yield emit(concat_batches(carry))

    def _segment_results(self, segments, plans, threads: int, prefetch: int) -> Iterator[dict]:
        if threads <= 1:
            for seg in segments:
                yield self._gather(seg, plans)
            return
        depth = max(1, threads * max(1, prefetch))
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rowstore")
        decoders = _decoders(plans, threads)
        inflight: deque = deque()
        try:
            for seg in segments:
                inflight.append(pool.submit(self._gather, seg, plans, None, 0, decoders))
                if len(inflight) >= depth:
                    yield inflight.popleft().result()
            while inflight:
                yield inflight.popleft().result()
        finally:
            for fut in inflight:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            if decoders is not None:
                decoders.shutdown(wait=True, cancel_futures=True)


def as_reader(path_or_reader: Any) -> tuple[Reader, bool]:
    """``(reader, owned)``: ``path_or_reader`` itself if it is a :class:`Reader` (``owned`` is
    False), else a new ``Reader`` of that path (``str``, ``bytes`` or ``os.PathLike``; ``owned``
    is True: the caller may close it). For the adapters, which take either."""
    if isinstance(path_or_reader, Reader):
        return path_or_reader, False
    if isinstance(path_or_reader, (str, bytes, os.PathLike)):
        return Reader(path_or_reader), True
    raise TypeError(f"expected a path or a rowstore Reader, got {type(path_or_reader).__name__}")
