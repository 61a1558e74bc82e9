"""Datasets for ``torch.utils.data.DataLoader``: map-style :class:`Dataset` and
:class:`IterableDataset`, which splits each epoch over DDP ranks and DataLoader workers."""

from __future__ import annotations

import weakref
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data as _tud

from rowstore._check import nonneg_int, positive_int
from rowstore.errors import StateError
from rowstore.reader.epochs import EpochSpec, EpochStream
from rowstore.reader.plan import ID_KEY, PAD_KEY
from rowstore.reader.transform import as_spec as _as_spec
from rowstore.torch._collate import Row, RowBatch, _Collator, _cut_tensors, _Shipped, collate
from rowstore.torch._epoch import _ROW_BATCH, _EpochReader, _OwnsReader, _split_extras
from rowstore.torch._transform import _process, _schemas

_MAX_RANGES = 8192  # ranges of remaining batches a loaded state may hold (shared memory: 128 KiB)
_HEAD = 8  # the stream's position in shared memory: epoch, steps, pending, base (5 numbers)


class _Indices(list):
    """A batch of dataset row numbers from :class:`ElasticBatchSampler`, with its padding mask
    (None without ``pad``) and whether to add ``"__id"``."""

    def __init__(self, rows, pad: np.ndarray | None, with_ids: bool):
        super().__init__(rows)
        self.pad = pad
        self.with_ids = with_ids

    def __reduce__(self):  # DataLoader workers get the indices through a queue
        return _Indices, (list(self), self.pad, self.with_ids)


class Dataset(_tud.Dataset, _OwnsReader):
    """A map-style torch dataset over a rowstore file.

    Parameters
    ----------
    path_or_reader : str, os.PathLike, a list of them, or rowstore.reader.Reader
        A ``.h5`` file, a dataset directory, or a list of those read as one dataset (opened
        here), or an open :class:`~rowstore.reader.Reader`. Readers pickle by path
        and open their file descriptor lazily in each process, so either works with any
        ``num_workers``, ``persistent_workers``, and the ``fork``/``spawn``/``forkserver``
        start methods (no HDF5 handle is held open).
    fields : sequence of str, optional
        Fields to read (default: all).
    transform : callable or TransformSpec, optional
        Applied to each row (numpy values); see :class:`TransformSpec`.
    batch_transform : callable or TransformSpec, optional
        Applied to each fetched batch (after ``transform``), before collation.
    varlen : {"padded", "nested", "list", "ragged"} or dict
        Collation of variable-shape fields, one mode for all or a dict per field (unlisted
        fields: ``"padded"``).
    storage_options : mapping, optional
        fsspec options for a URL, as :func:`rowstore.open`'s.

    Notes
    -----
    ``ds[i]`` is a :class:`Row` of tensors. ``DataLoader`` calls ``__getitems__`` with a whole
    batch of indices, which reads them with one :meth:`~rowstore.reader.Reader.take` (the
    kernels release the GIL); pass ``collate_fn=rowstore.torch.collate`` (also
    ``ds.collate_fn``) to turn it into tensors without a per-row loop. Works with any sampler,
    including ``DistributedSampler``. Collated tensors are views of arrays owned by the batch.
    """

    collate_fn = staticmethod(collate)

    def __init__(
        self,
        path_or_reader: Any,
        *,
        fields: Sequence[str] | None = None,
        transform: Any = None,
        batch_transform: Any = None,
        varlen: str | Mapping[str, str] = "padded",
        storage_options: Mapping[str, Any] | None = None,
    ):
        self._open_reader(path_or_reader, storage_options)
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._row_tf, self._batch_tf), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform), _as_spec(batch_transform)]
        )
        self._collator = _Collator(self.output_schema, varlen)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Row:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"Dataset indices are ints, got {type(index).__name__}")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> RowBatch:
        """The rows at ``indices`` as one :class:`RowBatch` (one ``Reader.take``). Indices from
        an :class:`ElasticBatchSampler` may add ``"__id"`` and ``"__pad"`` columns."""
        b = self.reader.take(indices, fields=self._fields, varlen="ragged")
        cols = _process(b, self._row_tf, self._batch_tf, self.output_schema)
        if isinstance(indices, _Indices):
            if indices.with_ids:
                cols[ID_KEY] = np.asarray(list(indices), dtype=np.int64)
            if indices.pad is not None:
                cols[PAD_KEY] = indices.pad
        return RowBatch(cols, self._collator)


class IterableDataset(_tud.IterableDataset, _EpochReader, _OwnsReader):
    """An iterable torch dataset that deals each epoch to DDP ranks and DataLoader workers.

    Parameters
    ----------
    path_or_reader : str, os.PathLike, a list of them, or rowstore.reader.Reader
        As in :class:`Dataset`.
    batch_size : int, optional
        Yield whole collated batches of this many rows (use ``DataLoader(ds, batch_size=None)``);
        ``None`` yields :class:`Row`\\ s (use ``collate_fn=rowstore.torch.collate``).
    spec : EpochSpec, optional
        The order arguments as one object; the keywords ``order`` replace its values.
    **order
        The order arguments of ``docs/order.md``: ``shuffle`` (default ``"block"``; True/False
        allowed), ``seed``, ``window``, ``pieces``, ``pad`` (equal steps by repeating rows,
        marked ``"__pad"``), ``unit``. All but ``unit`` are part of a resume state.
    fields : sequence of str, optional
    shard : (rank, world), optional
        This process's dealt part of each epoch. Default: ``torch.distributed``'s rank and
        world size when it is initialized *when the dataset is created*, else (0, 1).
    drop_last : bool
        Equal steps on every (rank, worker) by leaving out the last partial batch and the
        batches that do not divide evenly.
    with_ids : bool
        Add ``"__id"``, each row's dataset row number.
    rows, predicate : optional
        A row subset (see :meth:`Reader.keep_mask <rowstore.reader.Reader.keep_mask>`).
    num_epochs : int
        Epochs one iteration yields (default 1).
    num_workers : int, optional
        The DataLoader's ``num_workers``, for ``len(ds)`` (set by :class:`ResumableDataLoader`).
    quality : None, "log" or callable
        Report each epoch's shuffle quality (``"log"``: logger ``"rowstore"``; a callable gets
        ``(epoch, quality)``); in worker 0 of each rank.
    transform, batch_transform : callable or TransformSpec, optional
        Per-row and per-batch transforms (in row mode ``batch_transform`` sees chunks of
        ``512`` rows as read).
    varlen : {"padded", "nested", "list", "ragged"} or dict
    num_threads : int, optional
        Reader threads per process (default: 1 inside a DataLoader worker, else the reader's).
    prefetch : int
        Segments each reader thread reads ahead.

    Notes
    -----
    Worker ``w`` of ``W`` on rank ``r`` of ``R`` is consumer ``r * W + w`` of ``R * W``: the
    epoch's global batches (``batch_size`` rows of the order; 512 in row mode) are dealt to
    the consumers (:mod:`rowstore.reader.plan`), each once. The epoch set by :meth:`set_epoch`
    lives in shared memory, so persistent workers see it at their next epoch.

    Resume: :class:`ResumableDataLoader` gives a state that resumes on any world and number
    of workers (a loaded state lives in shared memory, as the epoch does: persistent workers
    see it at their next iteration). Under
    ``torchdata.stateful_dataloader.StatefulDataLoader``, :meth:`state_dict` and
    :meth:`load_state_dict` run in each worker (its own progress: same number of workers).

    :meth:`close` (or ``with IterableDataset(...) as ds:``) stops this process's running
    iterations (and their reader threads) and closes a reader opened from a path; a reader
    passed in stays open.
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int | None = None,
        spec: EpochSpec | None = None,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] | None = None,
        drop_last: bool = False,
        transform: Any = None,
        batch_transform: Any = None,
        varlen: str | Mapping[str, str] = "padded",
        num_threads: int | None = None,
        prefetch: int = 2,
        with_ids: bool = False,
        rows: Any = None,
        predicate: Any = None,
        num_epochs: int = 1,
        num_workers: int | None = None,
        quality: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        **order: Any,
    ):
        self._open_reader(path_or_reader, storage_options)
        self.batch_size = positive_int("batch_size", batch_size, optional=True)
        self.num_threads = positive_int("num_threads", num_threads, optional=True)
        self.prefetch = prefetch
        self.num_workers = None if num_workers is None else nonneg_int("num_workers", num_workers)
        self._init_order(
            "IterableDataset", spec, shard, drop_last, with_ids, rows, predicate, quality, order
        )
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._row_tf, self._batch_tf), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform), _as_spec(batch_transform)], self.spec.decode
        )
        self._collator = _Collator(self.output_schema, varlen)
        # Row mode reads 512-row global batches whole (drop_last applies to batches).
        spec = self.spec if self.batch_size else self.spec.replace(drop_last=False)
        self.stream = EpochStream(
            self.reader,
            self._bs(),
            spec,
            num_epochs=positive_int("num_epochs", num_epochs),
            quality=self.quality,
        )
        # Where the stream stands, in shared memory: persistent DataLoader workers (fork or
        # spawn) see set_epoch and a state loaded after they started, at their next iteration.
        self._shared = torch.zeros(_HEAD + 2 * _MAX_RANGES, dtype=torch.int64).share_memory_()
        self._publish()
        self._worker_state: tuple[tuple[int, int], int] | None = None  # (worker, row) loaded
        self._progress: dict | None = None  # this process's iteration: where it stands
        self._iterations: weakref.WeakSet = weakref.WeakSet()  # this process's, still open

    num_epochs = property(lambda self: self.stream.num_epochs)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_iterations", None)  # generators of this process: not picklable, not a worker's
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._iterations = weakref.WeakSet()

    # -- the stream's position in shared memory ------------------------------------------------
    def _publish(self) -> None:
        """Write the stream's position to shared memory."""
        st, sh = self.stream, self._shared
        base = st._base
        if base is not None and base[1] is not None and len(base[1]) > _MAX_RANGES:
            raise StateError(
                f"this state has {len(base[1])} ranges of remaining batches, more than the "
                f"{_MAX_RANGES} an IterableDataset holds; finish the epoch on one world first",
                field="remaining",
            )
        head = [st.epoch, st.steps, int(st._pending), 0, 0, 0, 0, 0]
        if base is not None:
            epoch, remaining, lanes = base
            head[3:7] = [1, epoch, remaining is not None, lanes or 0]
            if remaining:
                head[7] = len(remaining)
                sh[_HEAD : _HEAD + 2 * len(remaining)] = torch.tensor(
                    remaining, dtype=torch.int64
                ).reshape(-1)
        sh[:_HEAD] = torch.tensor(head, dtype=torch.int64)

    def _sync(self) -> None:
        """Read the stream's position from shared memory (what the main process set)."""
        st = self.stream
        h = self._shared[:_HEAD].tolist()
        st.epoch, st.steps, st._pending = h[0], h[1], bool(h[2])
        st._base = None
        if h[3]:
            n = h[7]
            remaining = self._shared[_HEAD : _HEAD + 2 * n].view(n, 2).tolist() if h[5] else None
            st._base = (h[4], remaining, h[6] or None)

    @property
    def epoch(self) -> int:
        return int(self._shared[0])

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (call before ``iter(loader)``).
        Right after :meth:`load_state_dict`, the loaded epoch keeps the loaded position."""
        self._sync()
        if nonneg_int("epoch", epoch) != self.stream.epoch:
            self._worker_state = None
        self.stream.set_epoch(epoch)
        self._publish()

    def worker_shard(self) -> tuple[int, int]:
        """The (worker, workers) of this process's DataLoader: the lane of its rank's batches
        it reads (:class:`~rowstore.reader.epochs.EpochStream`)."""
        info = _tud.get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def _bs(self) -> int:
        return self.batch_size or _ROW_BATCH

    def num_items(self, num_workers: int = 0) -> int:
        """Rows (or batches with ``batch_size``) this rank yields in the next iteration with
        ``num_workers`` DataLoader workers."""
        self._sync()
        st, own = self.stream, max(1, num_workers)
        if self.batch_size is not None:
            return st.steps_left(own)
        total = 0
        for e in range(st.epoch, st.epoch + (st.num_epochs or 1)):
            plan = st.plan(e)
            g = st.rank_batches(e, own)[st.steps if e == st.epoch else 0 :]
            total += sum(
                plan.rows_of_batch(int(x))[1] - plan.rows_of_batch(int(x))[0] for x in g if x >= 0
            )
        return total

    def __len__(self) -> int:
        """:meth:`num_items` with ``num_workers`` (set it, or use :class:`ResumableDataLoader`)."""
        if self.num_workers is None:
            raise TypeError(
                "len(IterableDataset) needs num_workers= (the DataLoader's), or a "
                "ResumableDataLoader"
            )
        return self.num_items(self.num_workers)

    # -- torchdata's Stateful protocol (per process) and job states ----------------------------
    def state_dict(self) -> dict:
        """Where this process's iteration stands (inside a DataLoader worker: that worker's
        progress, for ``StatefulDataLoader``; resumes the same worker). Before any iteration,
        the state of the epoch to read. Plain JSON values
        (:class:`~rowstore.reader.state.StreamState`)."""
        p, st = self._progress, self.stream
        if p is None and self._worker_state is not None:  # a worker state loaded, not yet read
            (wid, _), row = self._worker_state
            p = {"epoch": st.epoch, "next": st.steps + wid, "worker": self._worker_state[0]}
            p["row"] = row
        if p is None:
            self._sync()
            return st.state_dict(self.num_workers or 1)
        epoch, start, row = p["epoch"], p["next"], p["row"]
        wid, nw = p["worker"]
        if start - wid >= st.epoch_steps(epoch, nw) and not row:
            epoch, start = epoch + 1, wid  # this worker's epoch is over: the next one's start
        hand = {
            "world": st.shard[1],
            "lanes": st.lanes(epoch, nw),
            "unit": st.unit,
            "steps": start - wid,
            "base": st.base(epoch),
        }
        return st.spec.state(
            self.reader,
            self._bs(),
            epoch,
            st.base(epoch),
            consumer=(wid, nw),
            row=row,
            hand_out=hand,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state: a job state (any rowstore loader's, any world and workers: the
        next iteration deals exactly the batches not yet delivered) or a worker's
        (:meth:`state_dict` inside a worker, as ``StatefulDataLoader`` does).
        :class:`~rowstore.errors.StateError` if a field is invalid or the state was saved for
        another dataset or order."""
        self._load_state(state, worker=True)

    def _load_state(self, state: Mapping[str, Any], *, worker: bool) -> None:
        st = self.stream.spec.read_state(self.reader, state, self._bs(), worker=worker)
        if st.consumer is None:
            self._sync()
            self.stream.adopt(st)
            self.spec = self.stream.spec
            self._worker_state = None
            self._publish()
            return
        # A worker's own state: this process resumes it (it is no job's position).
        self.stream.adopt(st, check=False)
        self._worker_state = (st.consumer, st.row)

    def __iter__(self) -> Iterator[Any]:
        gen = self._iterate()
        self._iterations.add(gen)
        return gen

    def _stop(self) -> None:
        for gen in list(self._iterations):
            gen.close()  # joins its reader threads
        self._iterations.clear()

    def _iterate(self) -> Generator[Any, None, None]:
        info = _tud.get_worker_info()
        worker = self.worker_shard()
        wid, nw = worker
        threads = self.num_threads or (1 if info is not None else None)
        bs = self.batch_size
        col = self._collator
        skip_rows = 0
        if self._worker_state is not None:
            if self._worker_state[0] != worker:
                raise StateError(
                    f"this state is DataLoader worker {self._worker_state[0]}'s; this process is "
                    f"{worker}: a worker state resumes with the same workers (use "
                    f"ResumableDataLoader for another world)",
                    field="consumer",
                )
            skip_rows = self._worker_state[1]
            self._worker_state = None
        else:
            self._sync()
        stream = self.stream
        p = self._progress = {
            "epoch": stream.epoch,
            "next": stream.steps + wid,
            "worker": worker,
            "row": 0,
        }
        # Fixed-shape numeric fields, no transform: tensors cut from the reads as
        # BatchedDataLoader cuts them (one from_numpy and one split per read, not per batch).
        dense = (
            bs is not None and col.dense_only and self._row_tf is None and self._batch_tf is None
        )
        size = bs or 0  # a batch size wherever ``dense``
        it = stream.batches(
            own=nw,
            take=wid,
            cut=(lambda parts: _cut_tensors(parts, size)) if dense else None,
            parts=dense,
            fields=self._fields,
            with_ids=self.with_ids,
            num_threads=threads,
            prefetch=self.prefetch,
            varlen="ragged",
        )
        try:
            if dense:
                for out, epoch, steps in it:
                    p["epoch"], p["next"] = epoch, steps - 1 + nw
                    yield out if info is None else _Shipped(out)
                return
            for b, epoch, steps in it:
                b, extras = _split_extras(b)
                b = _process(b, self._row_tf, self._batch_tf, self.output_schema)
                p["epoch"] = epoch
                if bs is not None:
                    out = col.to_torch(b)
                    out.update({k: torch.from_numpy(v) for k, v in extras.items()})
                    p["next"] = steps - 1 + nw
                    yield out if info is None else _Shipped(out)  # a worker's: by value
                    continue
                n = len(b[self.output_schema.names[0]])
                p["next"] = steps - 1
                for i in range(skip_rows, n):
                    r = col.row(b, i)
                    for k, v in extras.items():
                        r[k] = torch.tensor(v[i])
                    p["row"] = i + 1
                    if i + 1 == n:
                        p["next"], p["row"] = steps - 1 + nw, 0
                    yield r
                skip_rows = 0
        finally:
            it.close()
