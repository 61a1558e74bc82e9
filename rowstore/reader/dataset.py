"""The reader: random access and shuffled batches over a dataset's shards, through the kernels.

On open, :class:`~rowstore.format.shards.DatasetLayout` reads the schema and block index once: a
dataset's manifest and block-index sidecar, or a single file's HDF5 metadata through libhdf5.
Afterwards reads are ``pread`` calls on plain file descriptors, opened lazily in each process
(so a reader survives ``fork`` and pickling), and the kernels release the GIL.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from rowstore._check import nonneg_int, positive_int
from rowstore.format.open import open_layout
from rowstore.format.shards import DatasetLayout
from rowstore.format.spec import BLOCK_DTYPE, HEAP_CHUNK_DTYPE
from rowstore.format.stats import DatasetStats
from rowstore.reader import order as _order
from rowstore.reader._args import select_fields
from rowstore.reader._decode import Decoder
from rowstore.reader._gather import FieldPlan, Gatherer, plan_fields
from rowstore.reader._segments import (
    VARLEN_MODES,
    EpochRead,
    EpochReads,
    check_varlen,
    finish_varlen,
)
from rowstore.reader.buffers import (
    NULL_KEY,
    BufferPool,
    concat_batches,
)
from rowstore.reader.epochs import EpochSource, as_pair, part_spec
from rowstore.reader.image_ops import decoded_schema, read_ops
from rowstore.reader.plan import ID_KEY, PAD_KEY, pad_ids
from rowstore.reader.view import reader_html, reader_text
from rowstore.schema import Schema
from rowstore.storage import ChunkStore

__all__ = ["Reader", "VARLEN_MODES"]

#: Bytes of rows (payloads included) per segment of a full shuffle of uncompressed files, about.
_SEGMENT_BYTES = 16 << 20


class Reader(EpochReads):
    """Read a rowstore dataset.

    Parameters
    ----------
    path : str, os.PathLike, or a list of them
        A dataset directory (written by :class:`rowstore.DatasetWriter` or
        :func:`rowstore.commit`), a ``.h5`` file written by :class:`rowstore.Writer`, or a list
        of those read as one dataset (same schema, compression and heap chunk size), in order.
        Rows are numbered across all shards in shard order; ``block`` shuffling permutes blocks
        across shards and ``full`` shuffling rows across shards.
    verify : bool or "always"
        ``True`` (default): no byte is handed out from a chunk whose CRC-32 was not checked; a
        mismatch raises :class:`~rowstore.errors.ChecksumError`. Chunks read whole are checked
        every time (at tens of GB/s, cheap beside decompression); uncompressed files may be read
        row by row or payload by payload where that is cheaper, and what such a read touches is
        checked the first time (once per reader and process): in a format-v3 file the pages it
        touches (rows of 4 KiB or more and heap payloads in the pass that reads them, with the
        rest of a payload's first and last pages; smaller rows by reading their pages first),
        in a v1/v2 file each chunk whole (the first epoch of a uniform shuffle then reads the
        data once more).
        ``"always"``: whole chunks only, checked on every read. ``False``: no checks (bounds
        are still checked).
        ``rowstore verify PATH`` checks a whole file once.
    varlen : {"ragged", "padded"}
        Default output of variable-shape fields: a :class:`~rowstore.reader.buffers.Ragged`
        (values + offsets + shapes), or a zero-padded array plus ``"<name>__shape"`` (``n x k``
        int64, the variable dimensions of each row).
    num_threads : int
        Default number of threads for :meth:`batches` (default: ``min(4, os.cpu_count())``).
    version : int, optional
        A dataset directory's manifest version to read (default: the current one). A reader
        keeps reading the version it opened while later versions are committed.
    max_open_files : int, optional
        Shard files this reader keeps open at once per process (default: a quarter of ``ulimit
        -n``; all readers of a process together keep at most half of it, least recently used
        closed first); requests that touch more shards are split.
    storage_options : dict, optional
        For a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``, any fsspec
        protocol): passed to fsspec (credentials, ``client_kwargs={"endpoint_url": ...}``).
        A remote dataset is read by ranged requests, many in flight in epoch order; every
        remote chunk's CRC-32 is checked whatever ``verify`` says (see docs/api.md, "Object
        storage").
    cache : str or os.PathLike, optional
        A local directory caching whole remote blocks (size limit ``remote={"cache_bytes": n}``,
        least recently used evicted first; safe for several processes); None: no cache.
    remote : dict, optional
        Further options of remote reads (:class:`rowstore.storage.remote.RemoteOptions`):
        ``max_in_flight``, ``merge_bytes``, ``retries``, ``backoff``, ``timeout``, ``cache_bytes``.
    allow_outside_links : bool
        A dataset directory's manifest, sidecar and shard paths must resolve inside it (the real
        paths, symlinks followed, of the directory and of each shard): by default a path that
        leads out of it, through a symlinked shard or ``shards/``, raises
        :class:`~rowstore.errors.FormatError` at open (a downloaded dataset cannot make the
        reader return another file's bytes). ``True`` follows such links (shards linked in from
        another disk). ``..`` and absolute paths are refused either way; URLs are not affected.
    allow_missing_footer : bool
        Read a v2 file whose footer is gone (opened for writing with h5py, which cuts it
        at close) through libhdf5, with v1's guarantees only; default False: such a file is a
        :class:`~rowstore.errors.FormatError` saying so.

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
        path: str | bytes | os.PathLike | Sequence[str | bytes | os.PathLike],
        *,
        verify: bool | str = True,
        varlen: str = "ragged",
        num_threads: int | None = None,
        version: int | None = None,
        max_open_files: int | None = None,
        storage_options: dict | None = None,
        cache: str | os.PathLike | None = None,
        remote: dict | None = None,
        allow_outside_links: bool = False,
        allow_missing_footer: bool = False,
    ):
        check_varlen(varlen)
        if verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always', got {verify!r}")
        self.verify = verify
        self.varlen = varlen
        self.num_threads = positive_int("num_threads", num_threads, optional=True) or min(
            4, os.cpu_count() or 1
        )
        self.max_open_files = positive_int("max_open_files", max_open_files, optional=True)
        self._etags: dict[int, Any] = {}
        if not isinstance(allow_outside_links, bool):
            raise TypeError(f"allow_outside_links must be a bool, got {allow_outside_links!r}")
        if isinstance(path, (list, tuple)):
            path = [os.fsdecode(p) if isinstance(p, bytes) else p for p in path]
        opened = open_layout(
            path,
            version=version,
            storage_options=storage_options,
            cache=cache,
            remote=remote,
            allow_outside_links=allow_outside_links,
            allow_missing_footer=allow_missing_footer,
        )
        self._init_state(opened.layout)

    def _init_state(self, layout: DatasetLayout) -> None:
        self.layout = layout
        self._fingerprint: str | None = None
        self.path: str = layout.path
        self.schema: Schema = layout.schema
        self._plans = plan_fields(layout.schema, layout.row_dtype)
        self._rpb = layout.rows_per_block
        self._store: ChunkStore = layout.shard_location().chunk_store(
            layout.shard_paths, layout.shard_ids, etags=self._etags, max_open=self.max_open_files
        )
        self._gatherer = Gatherer(layout, self._store, self.verify, layout.frame_check())
        self._decoder = Decoder(self.path, layout.where, layout.rows_of)
        self._column_pool: tuple[int, BufferPool] = (os.getpid(), BufferPool(0))

    # -- pickling / fork -------------------------------------------------------------------
    def __getstate__(self) -> dict:
        return {
            "verify": self.verify,
            "varlen": self.varlen,
            "num_threads": self.num_threads,
            "max_open_files": self.max_open_files,
            "layout": self.layout,
            "etags": getattr(self._store, "_etags", {}),
        }

    def __setstate__(self, state: dict) -> None:
        self.verify = state["verify"]
        self.varlen = state["varlen"]
        self.num_threads = state["num_threads"]
        self.max_open_files = state["max_open_files"]
        self._etags = dict(state.get("etags", {}))
        self._init_state(state["layout"])

    def close(self) -> None:
        """Close this process's file descriptors and decode threads (both come back on next use)
        and drop its pooled batch buffers."""
        self._store.close()
        self._decoder.close()
        self._column_pool = (os.getpid(), BufferPool(0))

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_store"):  # absent when __init__ failed
            self._store.close()
            self._decoder.close(wait=False)  # the collector may run this on a decode thread

    # -- basic access ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.layout.num_rows

    def __repr__(self) -> str:
        return reader_text(self)  # the path, rows, shards and fields: one screen at most

    def _repr_html_(self) -> str:
        """The notebook view (:mod:`rowstore.reader.view`): fields, statistics, sample rows."""
        return reader_html(self)

    @property
    def num_rows(self) -> int:
        return self.layout.num_rows

    def stats(self) -> DatasetStats | None:
        """Statistics of the rows, kept by the writer (``docs/stats.md``): per field counts,
        nulls, NaN/inf, min, max, mean, variance, a histogram, value counts, lengths and image
        sizes; for a dataset, those of the version read (its shards' merged at commit). None
        for files or versions written without them (before rowstore kept statistics, or with
        ``Writer(stats=False)``). Nothing is read: they come with the footer or manifest."""
        stats = self.layout.stats
        return (
            None if stats is None else DatasetStats.from_dict(stats, self.path, self.schema.names)
        )

    @property
    def fingerprint(self) -> str:
        """The dataset's identity, as a resume state names it (16 hex digits).

        A hash (BLAKE2b, 64 bits) of the schema, the rows of each shard and the block and heap
        chunk indexes, whose entries hold each stored chunk's CRC-32: two datasets differ in it
        whenever their bytes do, even with the same rows and manifest version, and the same
        bytes give the same fingerprint wherever they are (a copied or moved dataset, a
        directory or its shard files). Computed once per reader, on first use."""
        if self._fingerprint is None:
            self._fingerprint = layout_fingerprint(self.layout)
        return self._fingerprint

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
        """Dataset row numbers -> row ids (block * rows_per_block + row in block; see
        :mod:`rowstore.format.shards`)."""
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
                raise IndexError(
                    f"row index {int(np.asarray(indices).reshape(-1)[np.argmax(bad)])} out of "
                    f"range for {n} rows"
                )
        return self.layout.ids(idx)

    def take(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        fields: Sequence[str] | None = None,
        out: dict[str, np.ndarray] | None = None,
        varlen: str | None = None,
    ) -> dict[str, Any]:
        """The given rows (any order, repeats allowed) as a dict of per-field batch arrays.

        ``out`` may supply C-contiguous arrays for fixed-shape numeric fields (``(n, *shape)``
        of the field's dtype); they are filled and returned in place of new arrays.
        """
        plans = self._select(fields)
        varlen = check_varlen(varlen or self.varlen)
        rows = self._global_rows(indices)
        if out is not None:
            self._check_out(out, plans, len(rows))
        pieces = [
            self._read(rows[a:b], plans, out, a, self.num_threads) for a, b in self._pieces(rows)
        ]
        batch = concat_batches(pieces) if pieces else self._read(rows, plans, out, 0, 1)
        if out:
            batch.update({k: v for k, v in out.items() if k in batch})
        return self._finish_varlen(batch, plans, varlen)

    def _read(
        self,
        request: np.ndarray | _order.Segment,
        plans: list[FieldPlan],
        out: dict | None = None,
        out_start: int = 0,
        threads: int = 1,
        images: dict | None = None,
    ) -> dict[str, Any]:
        """Gather then decode one request (rows or a segment); thread-safe. A request touching
        more shards than the store keeps open is read in parts. ``images``: the image ops of
        the read (:func:`~rowstore.reader.image_ops.read_ops`)."""
        if self.layout.num_shards > self._store.max_open and (
            not isinstance(request, _order.Segment) or request.blocks is None
        ):
            rows = request.rows() if isinstance(request, _order.Segment) else request
            shards = np.unique(self.layout.block_shard[rows // self._rpb])
            if len(shards) > self._store.max_open and len(rows) > 1:
                h = len(rows) // 2
                return concat_batches(
                    [
                        self._read(rows[:h], plans, out, out_start, threads, images),
                        self._read(rows[h:], plans, out, out_start + h, threads, images),
                    ]
                )
        return self._decoder.decode(
            self._gatherer.gather(request, plans, out, out_start),
            plans,
            out,
            out_start,
            threads,
            images,
        )

    def output_schema(self, fields: Sequence[Any] | None = None, decode: Any = None) -> Schema:
        """The schema of the batches of ``fields`` (default all) read with the image ops
        ``decode`` (``{field: ImageOp}``): each such field a fixed-size uint8 image."""
        schema = self.schema.select(select_fields(self.schema, fields))
        return decoded_schema(schema, decode)

    def _pieces(self, rows: np.ndarray) -> list[tuple[int, int]]:
        """Split a take into pieces that bound the blocks loaded at once."""
        n = len(rows)
        if n == 0:
            return []
        if not self.layout.compressed and self._store.direct:
            step = 1 << 16
            return [(a, min(a + step, n)) for a in range(0, n, step)]
        # Compressed (or a remote store): a piece loads each block it touches whole; cap blocks
        # per piece at 64.
        out, a, cap = [], 0, 64
        blocks = rows // self._rpb
        while a < n:
            b = min(n, a + (1 << 16))
            while b - a > cap and len(np.unique(blocks[a:b])) > cap:
                b = a + max(cap, (b - a) // 2)
            out.append((a, b))
            a = b
        return out

    def _select(self, fields: Sequence[Any] | None) -> list[FieldPlan]:
        return [self._plans[f.name] for f in self.schema.select(select_fields(self.schema, fields))]

    def _check_out(self, out: dict, plans: list[FieldPlan], n: int) -> None:
        for name, arr in out.items():
            p = self._plans.get(name)
            if p is None or not any(q is p for q in plans):
                raise ValueError(f"out[{name!r}]: not a selected field")
            f = p.field
            if f.is_variable or f.numpy_dtype.kind == "O":
                raise ValueError(f"out[{name!r}]: only fixed-shape numeric fields take out= arrays")
            want = (n,) + tuple(f.shape)
            if (
                not isinstance(arr, np.ndarray)
                or arr.dtype != f.dtype.newbyteorder("=")
                and arr.dtype != f.dtype
                or arr.shape != want
                or not arr.flags.c_contiguous
                or not arr.flags.writeable
            ):
                raise ValueError(
                    f"out[{name!r}] must be a writeable C-contiguous {f.dtype} array of shape "
                    f"{want}, got "
                    f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}"
                )

    def _finish_varlen(self, batch: dict, plans: list[FieldPlan], varlen: str) -> dict:
        return finish_varlen(batch, plans, varlen)

    # -- epochs ----------------------------------------------------------------------------
    def order_defaults(
        self, shuffle: str | bool = "block", window: int | None = None, pieces: int | None = None
    ) -> tuple[int, int]:
        """The ``(window, pieces)`` of an epoch of this file, ``window``/``pieces`` None being
        the defaults (:func:`~rowstore.reader.order.resolve_order`): in block mode, pieces of
        blocks where this reader loads a piece alone (uncompressed blocks, a store with direct
        reads, ``verify`` not ``"always"``, which checks whole blocks), so a window of about
        :data:`~rowstore.reader.order.WINDOW_BLOCKS` blocks of rows mixes rows of up to 8 times
        more blocks; whole blocks otherwise."""
        return self._order_defaults(_order.shuffle_mode(shuffle), window, pieces)

    def _order_defaults(
        self, shuffle: str, window: int | None, pieces: int | None
    ) -> tuple[int, int]:
        """:meth:`order_defaults` of a mode name."""
        L = self.layout
        heap = L.heap_nbytes / max(1, L.num_blocks)
        table = L.block_raw_bytes
        # Pieces by default where rows are read in place (local uncompressed files). An object
        # store reads pieces as ranged reads of their checked pages (the same order, the same
        # bytes, when window/pieces are named), but one request per piece costs 3.5-4x the
        # epoch time of whole blocks through today's transport (bench/remote_read_bench.py),
        # so its default stays whole blocks until requests cost less than their bytes.
        g = self._gatherer
        auto = _order.auto_pieces(
            self._rpb,
            bool(g.direct_ok),
            table / (table + heap) if heap > 0 else 0.0,
        )
        return _order.resolve_order(shuffle, window, pieces, self._rpb, auto)

    def epoch_order(
        self,
        *,
        shuffle: str | bool = "block",
        seed: int = 0,
        epoch: int = 0,
        window: int | None = None,
        part: tuple[int, int] | None = None,
        even: bool = False,
        pieces: int | None = None,
    ) -> np.ndarray:
        """The row numbers of one epoch of :meth:`batches` with these arguments, in order."""
        return self.layout.rows_of(
            self._epoch_ids(
                shuffle=shuffle,
                seed=seed,
                epoch=epoch,
                window=window,
                part=part,
                even=even,
                pieces=pieces,
            )
        )

    def _epoch_ids(
        self,
        *,
        part: tuple[int, int] | None = None,
        even: bool = False,
        **order: Any,
    ) -> np.ndarray:
        spec, (rank, world) = part_spec("Reader.epoch_order", None, part, order)
        window, pieces = self._order_defaults(spec.shuffle, spec.window, spec.pieces)
        eo = self._epoch_order(spec.shuffle, spec.seed, spec.epoch, window, pieces)
        return eo.ids(*_order.shard_bounds(eo.num_rows, rank, world, even))

    def _chunk_keys(self, plans: list[FieldPlan]):
        """``keys_of(segment)``: the (shard, offset, stored bytes) of the chunks the gather will
        load for a segment, in the order it loads them (blocks, then heap chunks)."""
        L, a, g = self.layout, self.layout.arrays(), self._gatherer
        heap = any(not p.inline for p in plans)

        def keys_of(seg: _order.Segment) -> list[tuple[int, int, int]]:
            if seg.units is not None and seg.pieces > 1 and not heap and g.pieces_ok:
                return piece_keys(seg)
            blocks = seg.blocks if seg.blocks is not None else np.unique(seg.rows() // self._rpb)
            if not heap and g.ranged_rows(len(seg), len(blocks)):
                return row_keys(seg.rows())
            keys = list(
                zip(
                    L.block_shard[blocks].tolist(),
                    a["offset"][blocks].tolist(),
                    a["stored"][blocks].tolist(),
                )
            )
            if heap:
                ch = g._heap_chunks_of(blocks)
                keys += zip(
                    L.chunk_shard[ch].tolist(),
                    a["hc_offset"][ch].tolist(),
                    a["hc_stored"][ch].tolist(),
                )
            return keys

        def row_keys(rows: np.ndarray) -> list[tuple[int, int, int]]:
            # The page ranges the store's read_pages fetches for rows read alone
            # (Gatherer._load_ranged), in order.
            from rowstore.storage.remote import page_ranges

            blk = rows // self._rpb
            rs = L.row_dtype.itemsize
            lo, hi = page_ranges(
                a["offset"][blk],
                L.shard_rpb[L.block_shard[blk]] * rs,
                (rows - blk * self._rpb) * rs,
                np.full(len(rows), rs, np.int64),
                g.pages.rows_per_page * rs,
            )
            return list(zip(L.block_shard[blk].tolist(), lo.tolist(), (hi - lo).tolist()))

        def piece_keys(seg: _order.Segment) -> list[tuple[int, int, int]]:
            # The page ranges the store's read_pages fetches for the window's pieces (as
            # Gatherer._load_pieces asks for them), in order.
            from rowstore.storage.remote import page_ranges

            P = -(-self._rpb // seg.pieces)
            blk = seg.units // seg.pieces
            start = (seg.units % seg.pieces) * P
            counts = np.minimum(np.maximum(L.block_rows()[blk] - start, 0), P)
            keep = counts > 0
            blk, start, counts = blk[keep], start[keep], counts[keep]
            rs = L.row_dtype.itemsize
            lo, hi = page_ranges(
                a["offset"][blk],
                L.shard_rpb[L.block_shard[blk]] * rs,
                start * rs,
                counts * rs,
                g.pages.rows_per_page * rs,
            )
            return list(zip(L.block_shard[blk].tolist(), lo.tolist(), (hi - lo).tolist()))

        return keys_of

    def row_ranges(
        self, blocks_per_part: int | None = None, *, name: str = "blocks_per_part"
    ) -> list[tuple[int, int]]:
        """Row ranges ``[start, stop)`` of the parts of a parallel read (a Dask partition, a
        Ray read task): one per shard, or per ``blocks_per_part`` consecutive blocks of a shard
        (never across shards); empty ones left out. ``name``: the argument, for errors."""
        L = self.layout
        if blocks_per_part is None:
            ends = np.cumsum(L.shard_rows)
            starts = ends - L.shard_rows
            return [(int(a), int(b)) for a, b in zip(starts, ends) if b > a]
        positive_int(name, blocks_per_part)
        rows = L.block_rows()
        first = np.concatenate([[0], np.cumsum(rows)])
        out, b = [], 0
        shard = L.block_shard
        while b < len(rows):
            e = b
            while e < len(rows) and e - b < blocks_per_part and shard[e] == shard[b]:
                e += 1
            if first[e] > first[b]:
                out.append((int(first[b]), int(first[e])))
            b = e
        return out

    def shard_size(
        self,
        *,
        part: tuple[int, int] | None = None,
        even: bool = False,
    ) -> int:
        """Rows of the contiguous ``part`` of an epoch."""
        rank, world = as_pair("part", (0, 1) if part is None else part)
        lo, hi = _order.shard_bounds(self.num_rows, rank, world, even)
        return hi - lo

    def num_batches(
        self,
        batch_size: int,
        *,
        part: tuple[int, int] | None = None,
        even: bool = False,
        drop_last: bool = False,
        start: int = 0,
    ) -> int:
        """Batches that :meth:`batches` yields with these arguments."""
        positive_int("batch_size", batch_size)
        n = max(0, self.shard_size(part=part, even=even) - nonneg_int("start", start))
        return n // batch_size if drop_last else -(-n // batch_size)

    def shuffle_quality(self, batch_size: int, **order_kwargs) -> float:
        """:func:`rowstore.reader.order.shuffle_quality` of the epoch order these arguments give."""
        order = self._epoch_ids(**order_kwargs)  # row ids: id // rows_per_block is the block
        return _order.shuffle_quality(order, self._rpb, self.layout.num_blocks, batch_size)

    def _cut(self, read: EpochRead) -> _ReaderCut:
        """How this reader reads ``read`` (:class:`~rowstore.reader._segments.Cut`)."""
        return _ReaderCut(self, read)

    def read_ids(
        self,
        ids: np.ndarray,
        *,
        fields: Sequence[Any] | None = None,
        num_threads: int | None = None,
    ) -> dict[str, Any]:
        """The rows of row ids ``ids`` (``block * rows_per_block + row``, as an
        :class:`~rowstore.reader.order.EpochOrder` gives them), variable shapes as ``Ragged``:
        what a :class:`~rowstore.reader.mix.Mixture` reads of each source."""
        ids = np.asarray(ids, dtype=np.int64)
        return self._read(ids, self._select(fields), None, 0, num_threads or self.num_threads)

    def _segment_rows(self, shuffle: str, window: int, batch_size: int) -> int | None:
        """Rows per segment of a ``full`` shuffle (None for the other orders): compressed (or
        remote) data decompresses a whole block per row, so a segment touches at most ``window``
        blocks; uncompressed rows are read directly, so segments can be large."""
        if shuffle != "full":
            return None
        ranged = self._gatherer._ranged and self.layout.heap_nbytes == 0  # rows fetched alone
        if self.layout.compressed or not (self._store.direct or ranged):
            return window
        # Whole batches (none straddles two segments) of about 4,096 rows, or fewer where the
        # rows are large: a segment's rows are read by one thread into one buffer, so segments
        # of at most _SEGMENT_BYTES keep both threads busy and the buffers reusable.
        L = self.layout
        row_bytes = L.row_dtype.itemsize + L.heap_nbytes / max(1, L.num_rows)
        batches = max(
            1, min(-(-4096 // batch_size), int(_SEGMENT_BYTES // (row_bytes * batch_size)))
        )
        return batch_size * batches

    def _aligned_step(
        self, shuffle: str, window: int, batch_size: int, plans: list[FieldPlan], pieces: int = 1
    ) -> int | None:
        """Rows per segment cut at batch boundaries (:meth:`EpochOrder.aligned`) where the
        gather reads the rows of a ``block``/``none`` window directly (uncompressed local
        files: large fixed-size rows by ``preadv``, heap payloads by ``pread``), else None
        (window segments: compressed or remote files, small rows gathered from loaded blocks).

        A window segment of such a file loads nothing whole, so cutting the same order at
        multiples of the batch size costs no reads, and saves what a window cut costs: the
        batch across each window boundary concatenated (a copy of its bytes; every batch
        once a batch holds more rows than a window), and fixed per-segment costs on windows
        of few rows. About a window of rows per segment, so memory stays as documented."""
        if shuffle == "full" or not self._gatherer.direct_ok:
            return None
        pieces = min(pieces, max(1, self._rpb)) if shuffle == "block" else 1
        rows = window * -(-self._rpb // pieces)
        heap = any(not p.inline for p in plans)
        nfixed = 2 * len(plans)
        if (
            not heap
            and self._gatherer._strategy(rows, -(-window // pieces), False, nfixed) == "blocks"
        ):
            return None
        return batch_size * max(1, -(-rows // batch_size))

    def _pooled_columns(self, plans: list[FieldPlan], threads: int, prefetch: int):
        """``columns(n)``: the ``out=`` arrays of a segment's raw fields, from this reader's
        :class:`~rowstore.reader.buffers.BufferPool` (None: no raw field). The pool outlives
        an iteration: the next epoch's segments reuse its buffers instead of faulting in (and
        the system zeroing) a fresh segment's worth of pages each; it holds at most the
        buffers one iteration has in flight (``threads * prefetch + 3``), as an epoch does."""
        raw = [(p.field.name, tuple(p.field.shape), p.field.dtype) for p in plans if p.raw]
        if not raw:
            return lambda n: None
        pid, pool = self._column_pool
        if pid != os.getpid():  # a forked child (a DataLoader worker): its own pool and lock
            pool = BufferPool(0)
            self._column_pool = (os.getpid(), pool)
        pool.cap = max(pool.cap, max(1, threads) * prefetch + 3)
        return lambda n: pool.columns(raw, n)

    # -- dealt epochs: elastic resume and equal steps (rowstore.reader.plan) ----------------------
    def keep_mask(
        self, rows: Any = None, predicate: Any = None, *, fields: Sequence[str] | None = None
    ) -> np.ndarray | None:
        """A row subset as one bool per dataset row (None: every row).

        ``rows``: dataset row numbers (any order, repeats ignored). ``predicate``: a function of
        a batch dict (the ``fields`` it needs, default all) returning one bool per row; it is
        called once per block, reading the dataset once in file order. Both: their intersection.
        """
        if rows is None and predicate is None:
            return None
        n = self.num_rows
        keep = np.ones(n, bool)
        if rows is not None:
            idx = np.asarray(rows)
            if idx.dtype == bool:
                raise TypeError("rows= takes row numbers, not a boolean mask")
            if idx.size and idx.dtype.kind not in "iu":
                raise TypeError(f"rows= must be integers, got {idx.dtype}")
            idx = idx.astype(np.int64).reshape(-1)
            bad = (idx < 0) | (idx >= n)
            if bad.any():
                raise IndexError(f"rows=: row {int(idx[np.argmax(bad)])} out of range for {n} rows")
            keep[:] = False
            keep[idx] = True
        if predicate is not None:
            if not callable(predicate):
                raise TypeError(
                    f"predicate must be a callable on a batch dict, got {type(predicate).__name__}"
                )
            first = self.layout.arrays()["first"]
            counts = self.layout.block_rows()
            for b in range(self.layout.num_blocks):
                lo, m = int(first[b]), int(counts[b])
                if m == 0:
                    continue
                batch = self.take(np.arange(lo, lo + m), fields=fields)
                got = np.asarray(predicate(batch))
                if got.dtype != bool or got.shape != (m,):
                    raise ValueError(
                        f"predicate must return a bool array of shape ({m},) for block {b}, got "
                        f"{got.dtype} {got.shape}"
                    )
                keep[lo : lo + m] &= got
        return keep

    def epoch(
        self,
        *,
        shuffle: str | bool = "block",
        seed: int = 0,
        epoch: int = 0,
        window: int | None = None,
        keep: np.ndarray | None = None,
        pieces: int | None = None,
    ) -> _order.EpochOrder:
        """The :class:`~rowstore.reader.order.EpochOrder` of these arguments (a row subset with
        ``keep``; ``window``/``pieces`` None: :meth:`order_defaults`)."""
        shuffle = _order.shuffle_mode(shuffle)
        window, pieces = self._order_defaults(shuffle, window, pieces)
        return self._epoch_order(shuffle, seed, epoch, window, pieces, keep)

    def _epoch_order(
        self,
        shuffle: str,
        seed: int,
        epoch: int,
        window: int,
        pieces: int,
        keep: np.ndarray | None = None,
    ) -> _order.EpochOrder:
        """:meth:`epoch` of resolved arguments (a mode name, the window and pieces decided)."""
        keep = None if keep is None else self._check_keep(keep)
        return _order.EpochOrder(
            self.layout.block_rows(),
            self._rpb,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            window=window,
            keep=keep,
            pieces=pieces,
        )

    def _check_keep(self, keep: np.ndarray) -> np.ndarray:
        """``keep`` as a bool array of one value per dataset row, checked."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (self.num_rows,):
            raise ValueError(
                f"keep must hold one bool per row ({self.num_rows}), got shape {keep.shape}"
            )
        return keep

    def _epoch_rows(self, keep: np.ndarray | None) -> int:
        return self.num_rows if keep is None else int(np.count_nonzero(self._check_keep(keep)))


class _ReaderCut:
    """A reader's :class:`~rowstore.reader._segments.Cut` of one epoch read: its
    :class:`~rowstore.reader.order.EpochOrder`, cut into windows (or permutation slices, or
    batch-aligned ranges: :meth:`Reader._aligned_step`), each gathered and decoded by
    :meth:`Reader._read` into pooled buffers."""

    def __init__(self, reader: Reader, read: EpochRead):
        self._reader = reader
        self._plans = plans = reader._select(read.fields)
        self._order = reader._epoch_order(
            read.shuffle, read.seed, read.epoch, read.window, read.pieces, read.keep
        )
        self.num_rows = self._order.num_rows
        self.threads = read.num_threads or reader.num_threads
        B = read.batch_size
        self._seg_rows = reader._segment_rows(read.shuffle, read.window, B)
        self._step = reader._aligned_step(read.shuffle, read.window, B, plans, read.pieces)
        read_fields = {p.field.name for p in plans}
        self._images = read_ops(read.decode, reader.schema, read_fields, read.seed, read.epoch)
        self._columns = reader._pooled_columns(plans, self.threads, read.prefetch)
        self._with_ids, self._pad, self._varlen = read.with_ids, read.pad, read.varlen

    def segments(self, lo: int, hi: int) -> Iterable[_order.Segment]:
        if self._step is None:
            return self._order.segments(lo, hi, self._seg_rows)
        return self._order.aligned(lo, hi, self._step)

    def padding(self, n: int) -> _order.Segment:
        return _order.Segment(pad_ids(self._order, n), pad=True)

    def produce(self, seg: _order.Segment) -> dict:
        r = self._reader
        b = r._read(seg, self._plans, self._columns(len(seg)), 0, self.threads, self._images)
        if self._with_ids:
            b[ID_KEY] = r.layout.rows_of(seg.rows())
        if self._pad:
            b[PAD_KEY] = np.full(len(seg), seg.pad, bool)
        return b

    def finish(self, batch: dict) -> dict:
        return finish_varlen(batch, self._plans, self._varlen)

    def fetch_ahead(self, segments: Any) -> Iterable[Any]:
        """``segments()``; from object storage, with the store fetching their chunks ahead in
        that (pure-function) order, which it iterates a second time."""
        r = self._reader
        return r._store.fetch_ahead(segments(), segments, r._chunk_keys(self._plans))


def layout_fingerprint(layout: DatasetLayout) -> str:
    """:attr:`Reader.fingerprint` of a layout."""
    h = hashlib.blake2b(b"rowstore.dataset\0", digest_size=8)
    h.update(layout.schema.to_json_str().encode())
    h.update(np.ascontiguousarray(layout.shard_rows, dtype="<i8").tobytes())
    for arr, dtype in ((layout.blocks, BLOCK_DTYPE), (layout.heap_chunks, HEAP_CHUNK_DTYPE)):
        h.update(len(arr).to_bytes(8, "little"))
        h.update(np.ascontiguousarray(arr, dtype=dtype).view(np.uint8).data)
    return h.hexdigest()


def as_reader(path_or_reader: Any, storage_options: Any = None) -> tuple[Reader, bool]:
    """``(reader, owned)``: ``path_or_reader`` itself if it is a :class:`Reader` or another
    epoch source (a :class:`~rowstore.reader.mix.Mixture`; ``owned`` is False), else a new
    ``Reader`` of that path or URL, opened as :func:`rowstore.open` opens it with
    ``storage_options`` (refused there for a local path); a file or a dataset directory, or a
    list or tuple of them read as one (``owned`` is True: the caller may close it). For the
    entry points that take either. ``storage_options`` with an open source is a
    ``ValueError``: it was opened with its own."""
    if isinstance(path_or_reader, (Reader, EpochSource)):
        # A Reader, or another epoch source (a rowstore.mix Mixture), which offers the adapters
        # what they use of a Reader.
        if storage_options is not None:
            raise ValueError(
                f"storage_options apply to a path or URL; a {type(path_or_reader).__name__} is "
                "open already (pass them to rowstore.open)"
            )
        return cast(Reader, path_or_reader), False
    opts = None if storage_options is None else dict(storage_options)
    if isinstance(path_or_reader, (str, bytes, os.PathLike)):
        return Reader(path_or_reader, storage_options=opts), True
    if (
        isinstance(path_or_reader, (list, tuple))
        and path_or_reader
        and all(isinstance(p, (str, bytes, os.PathLike)) for p in path_or_reader)
    ):
        return Reader(list(path_or_reader), storage_options=opts), True
    raise TypeError(f"expected a path or a rowstore Reader, got {type(path_or_reader).__name__}")
