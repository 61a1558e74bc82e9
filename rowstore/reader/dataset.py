"""The reader: random access and shuffled batches over a dataset's shards, through the kernels.

On open, :class:`~rowstore.format.shards.DatasetLayout` reads the schema and block index once: a
dataset's manifest and block-index sidecar, or a single file's HDF5 metadata through libhdf5.
Afterwards reads are ``pread`` calls on plain file descriptors, opened lazily in each process
(so a reader survives ``fork`` and pickling), and the kernels release the GIL.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

from rowstore.format.shards import DatasetLayout
from rowstore.reader import order as _order
from rowstore.reader._args import local_path, nonneg_int, positive_int, select_fields, shuffle_mode
from rowstore.reader._decode import Decoder
from rowstore.reader._gather import FieldPlan, Gatherer, plan_fields
from rowstore.reader._store import LocalStore
from rowstore.reader._stream import cut_batches, prefetched
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY, Ragged, concat_batches, pad_ragged
from rowstore.schema import Schema

__all__ = ["Reader"]

VARLEN_MODES = ("ragged", "padded")


def _check_varlen(varlen: str) -> str:
    if varlen not in VARLEN_MODES:
        raise ValueError(f"varlen must be one of {VARLEN_MODES}, got {varlen!r}")
    return varlen


class Reader:
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
        row by row or payload by payload where that is cheaper, and each chunk such a read
        touches is checked whole the first time (once per reader and process: the first epoch
        of a uniform shuffle reads the data once more). ``"always"``: whole chunks only, checked
        on every read. ``False``: no checks (bounds are still checked).
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
        Shard files kept open at once per process (default: a quarter of ``ulimit -n``);
        requests that touch more shards are split.

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
    ):
        _check_varlen(varlen)
        path = [local_path(p) for p in path] if isinstance(path, (list, tuple)) else local_path(path)  # file:// URLs
        if isinstance(path, (list, tuple)):
            source: str | list[str] = [os.fsdecode(p) for p in path]
        else:
            source = os.fsdecode(path)  # str, also for a bytes path: errors carry it
        if verify not in (True, False, "always"):
            raise ValueError(f"verify must be True, False or 'always', got {verify!r}")
        self.verify = verify
        self.varlen = varlen
        self.num_threads = positive_int("num_threads", num_threads, optional=True) or min(4, os.cpu_count() or 1)
        self.max_open_files = positive_int("max_open_files", max_open_files, optional=True)
        self._init_state(DatasetLayout.open(source, version=version))

    def _init_state(self, layout: DatasetLayout) -> None:
        self.layout = layout
        self.path: str = layout.path
        self.schema: Schema = layout.schema
        self._plans = plan_fields(layout.schema, layout.row_dtype)
        self._rpb = layout.rows_per_block
        self._store = LocalStore(layout.shard_paths, layout.shard_ids, self.max_open_files)
        self._gatherer = Gatherer(layout, self._store, self.verify, layout.frame_check())
        self._decoder = Decoder(self.path, layout.where)

    # -- pickling / fork -------------------------------------------------------------------
    def __getstate__(self) -> dict:
        return {"verify": self.verify, "varlen": self.varlen, "num_threads": self.num_threads,
                "max_open_files": self.max_open_files, "layout": self.layout}

    def __setstate__(self, state: dict) -> None:
        self.verify = state["verify"]
        self.varlen = state["varlen"]
        self.num_threads = state["num_threads"]
        self.max_open_files = state["max_open_files"]
        self._init_state(state["layout"])

    def close(self) -> None:
        """Close this process's file descriptors and decode threads (both come back on next use)."""
        self._store.close()
        self._decoder.close()

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
        n = self.layout.num_shards
        shards = f" in {n} shards" if n > 1 else ""
        return f"<rowstore.Reader {self.path!r}: {len(self)} rows{shards}, fields {self.schema.names}>"

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
                raise IndexError(f"row index {int(np.asarray(indices).reshape(-1)[np.argmax(bad)])} out of range for {n} rows")
        return self.layout.ids(idx)

    def take(self, indices: Sequence[int] | np.ndarray, *, fields: Sequence[str] | None = None,
             out: dict[str, np.ndarray] | None = None, varlen: str | None = None) -> dict[str, Any]:
        """The given rows (any order, repeats allowed) as a dict of per-field batch arrays.

        ``out`` may supply C-contiguous arrays for fixed-shape numeric fields (``(n, *shape)``
        of the field's dtype); they are filled and returned in place of new arrays.
        """
        plans = self._select(fields)
        varlen = _check_varlen(varlen or self.varlen)
        rows = self._global_rows(indices)
        if out is not None:
            self._check_out(out, plans, len(rows))
        pieces = [self._read(rows[a:b], plans, out, a, self.num_threads) for a, b in self._pieces(rows)]
        batch = concat_batches(pieces) if pieces else self._read(rows, plans, out, 0, 1)
        if out:
            batch.update({k: v for k, v in out.items() if k in batch})
        return self._finish_varlen(batch, plans, varlen)

    def _read(self, request: np.ndarray | _order.Segment, plans: list[FieldPlan], out: dict | None = None,
              out_start: int = 0, threads: int = 1) -> dict[str, Any]:
        """Gather then decode one request (rows or a segment); thread-safe. A request touching
        more shards than the store keeps open is read in parts."""
        if self.layout.num_shards > self._store.max_open and (
                not isinstance(request, _order.Segment) or request.blocks is None):
            rows = request.rows() if isinstance(request, _order.Segment) else request
            shards = np.unique(self.layout.block_shard[rows // self._rpb])
            if len(shards) > self._store.max_open and len(rows) > 1:
                h = len(rows) // 2
                return concat_batches([self._read(rows[:h], plans, out, out_start, threads),
                                       self._read(rows[h:], plans, out, out_start + h, threads)])
        return self._decoder.decode(self._gatherer.gather(request, plans, out, out_start), plans, out, out_start, threads)

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
            if not isinstance(arr, np.ndarray) or arr.dtype != f.dtype.newbyteorder("=") and arr.dtype != f.dtype \
                    or arr.shape != want or not arr.flags.c_contiguous or not arr.flags.writeable:
                raise ValueError(
                    f"out[{name!r}] must be a writeable C-contiguous {f.dtype} array of shape {want}, got "
                    f"{getattr(arr, 'dtype', type(arr).__name__)} {getattr(arr, 'shape', '')}"
                )

    def _finish_varlen(self, batch: dict, plans: list[FieldPlan], varlen: str) -> dict:
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
        return self.layout.rows_of(self._epoch_ids(shuffle=shuffle, seed=seed, epoch=epoch, window=window, shard=shard,
                                                   even=even))

    def _epoch_ids(self, *, shuffle: str = "block", seed: int = 0, epoch: int = 0, window: int = 16,
                   shard: tuple[int, int] = (0, 1), even: bool = False) -> np.ndarray:
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
        order = self._epoch_ids(**order_kwargs)  # row ids: id // rows_per_block is the block
        return _order.shuffle_quality(order, self._rpb, self.layout.num_blocks, batch_size)

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: str | bool = "block",
        seed: int = 0,
        epoch: int = 0,
        window: int = 16,
        fields: Sequence[Any] | None = None,
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
        shuffle : {"block", "full", "none"} or bool
            See :mod:`rowstore.reader.order`; ``True`` is ``"block"``, ``False`` ``"none"`` (as
            the loaders take it). ``block`` reads whole blocks (fastest); ``full`` is
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
        shuffle = shuffle_mode(shuffle)
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

        def produce(seg: _order.Segment) -> dict:
            return self._read(seg, plans, None, 0, threads)

        def finish(batch: dict) -> dict:
            return self._finish_varlen(batch, plans, varlen)

        return cut_batches(prefetched(segments, produce, threads, prefetch), batch_size, drop_last, finish)


def as_reader(path_or_reader: Any) -> tuple[Reader, bool]:
    """``(reader, owned)``: ``path_or_reader`` itself if it is a :class:`Reader` (``owned`` is
    False), else a new ``Reader`` of that path (``str``, ``bytes`` or ``os.PathLike``: a file or
    a dataset directory; or a list or tuple of them, read as one; ``owned`` is True: the caller
    may close it). For the adapters, which take either."""
    if isinstance(path_or_reader, Reader):
        return path_or_reader, False
    if isinstance(path_or_reader, (str, bytes, os.PathLike)):
        return Reader(path_or_reader), True
    if isinstance(path_or_reader, (list, tuple)) and path_or_reader \
            and all(isinstance(p, (str, bytes, os.PathLike)) for p in path_or_reader):
        return Reader(list(path_or_reader)), True
    raise TypeError(f"expected a path or a rowstore Reader, got {type(path_or_reader).__name__}")
