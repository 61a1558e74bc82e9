"""Stored rows of a file or dataset, undecoded: what a global shuffle moves between files.

:class:`RawSource` loads one block at a time (or a whole small file) through the reader's
gatherer, so every chunk is checksummed and decompressed as a read would, and returns
:class:`~rowstore.format._raw.RawRows`: row records and heap payloads as bytes, references
checked against their block's heap range and rewritten to the copied payloads.
"""

from __future__ import annotations

import os

import numpy as np

from rowstore.format._raw import RawRows, heap_refs, take_raw
from rowstore.reader.dataset import Reader

__all__ = ["RawSource"]


class RawSource:
    """A file or dataset read as stored rows.

    Parameters
    ----------
    path : str, os.PathLike or list of them
        As :func:`rowstore.open` takes.
    verify : bool or "always"
        As for :class:`~rowstore.reader.Reader` (chunks are always read whole here, so with
        ``True`` every chunk read is checksummed).
    storage_options : dict, optional
        For a URL, as for :class:`~rowstore.reader.Reader`.

    Not thread-safe (one reusable block buffer); cheap to create in each worker.
    """

    def __init__(
        self,
        path: str | os.PathLike | list,
        *,
        verify: bool | str = True,
        storage_options: dict | None = None,
    ):
        self.reader = Reader(path, verify=verify, num_threads=1, storage_options=storage_options)
        self.layout = self.reader.layout
        self.schema = self.layout.schema
        self.row_dtype = self.layout.row_dtype
        self.refs = heap_refs(self.schema, self.row_dtype)
        self._g = self.reader._gatherer
        self._buf = np.empty(0, np.uint8)

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> RawSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks

    def block_rows(self, k: int) -> tuple[int, int]:
        """``(first dataset row, rows)`` of block ``k``."""
        a = self.layout.arrays()
        return int(a["first"][k]), int(a["num_rows"][k])

    def block_nbytes(self, k: int) -> int:
        """Raw bytes of block ``k``'s valid rows plus its heap range."""
        a = self.layout.arrays()
        return int(a["num_rows"][k]) * self.row_dtype.itemsize + int(
            a["heap_end"][k] - a["heap_start"][k]
        )

    def block(self, k: int, order: np.ndarray | None = None) -> RawRows:
        """The rows of block ``k`` (all, in order; or ``order``: positions within the block),
        with their payloads, checked."""
        return self.blocks(k, k + 1, order)

    def blocks(self, k0: int, k1: int, order: np.ndarray | None = None) -> RawRows:
        """The rows of blocks ``k0 .. k1 - 1`` (all, in order; or ``order``: positions among
        their valid rows), with their payloads, checked. The heap chunks under consecutive
        blocks are loaded once (a block's payloads often straddle a chunk boundary)."""
        L, a = self.layout, self.layout.arrays()
        which = np.arange(k0, k1, dtype=np.int64)
        stride = L.block_raw_bytes
        need = len(which) * stride
        if self._buf.nbytes < need:
            self._buf = np.empty(need, np.uint8)
        self._g._load(which, "block", self._buf[:need])
        rpb = L.rows_per_block
        counts = a["num_rows"][which]
        pos = np.repeat(
            np.arange(len(which), dtype=np.int64) * rpb - np.cumsum(counts) + counts, counts
        )
        pos += np.arange(len(pos), dtype=np.int64)  # valid row i of slot s at s * rpb + i
        idx = pos if order is None else pos[order]
        sh = int(L.block_shard[k0])
        where = (
            f"{L.shard_paths[sh]!r}: blocks {k0 - L.shard_block0(sh)}.."
            if k1 - k0 > 1
            else f"{L.shard_paths[sh]!r}: block {k0 - L.shard_block0(sh)}"
        )
        rs = self.row_dtype.itemsize
        if not self.refs:
            return take_raw(
                self._buf[:need],
                self.row_dtype,
                [],
                idx,
                self._buf[:0],
                base=0,
                lo=0,
                hi=0,
                rows_per_slot=rpb,
                where=where,
            )
        heap, lo, hi, base = self._g._heap_context(which)
        assert need % rs == 0
        return take_raw(
            self._buf[:need],
            self.row_dtype,
            self.refs,
            idx,
            heap,
            base=base,
            lo=lo,
            hi=hi,
            rows_per_slot=rpb,
            where=where,
        )

    @property
    def rows_nbytes(self) -> int:
        """Bytes :meth:`load_into` needs for the rows (whole blocks)."""
        return self.layout.num_blocks * self.layout.block_raw_bytes

    @property
    def heap_nbytes(self) -> int:
        """Bytes :meth:`load_into` needs for the heap (whole heap chunks)."""
        return len(self.layout.heap_chunks) * self.layout.heap_chunk_bytes

    def load_into(self, rows: np.ndarray, heap: np.ndarray) -> None:
        """Load a one-file source whole (for files that fit in memory: a shuffle's piles):
        its blocks into ``rows`` (``rows_nbytes``; row ``i`` at byte ``i * row size``) and
        its heap chunks into ``heap`` (``heap_nbytes``; heap references address it directly)."""
        L = self.layout
        if L.num_shards != 1:
            raise ValueError("load_into reads a single file")
        if rows.nbytes != self.rows_nbytes or heap.nbytes != self.heap_nbytes:
            raise ValueError("load_into: destinations of the wrong size")
        if L.num_blocks:
            self._g._load(np.arange(L.num_blocks, dtype=np.int64), "block", rows)
        if len(L.heap_chunks):
            self._g._load(np.arange(len(L.heap_chunks), dtype=np.int64), "heap chunk", heap)
