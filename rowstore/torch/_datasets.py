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
from rowstore.reader.epochs import EpochSpec
from rowstore.reader.plan import ID_KEY, PAD_KEY
from rowstore.reader.transform import as_spec as _as_spec
from rowstore.torch._collate import Row, RowBatch, _Collator, _Shipped, collate
from rowstore.torch._epoch import (
    _ROW_BATCH,
    _EpochReader,
    _OwnsReader,
    _split_extras,
)
from rowstore.torch._transform import _process, _schemas

_MAX_RANGES = 8192  # ranges of remaining batches a loaded state may hold (shared memory: 128 KiB)


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
    varlen : {"padded", "nested", "list"} or dict
        Collation of variable-shape fields, one mode for all or a dict per field (unlisted
        fields: ``"padded"``).

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
    ):
        self._open_reader(path_or_reader)
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
        batches that do not divide evenly. ``even=True`` is its deprecated spelling.
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
    varlen : {"padded", "nested", "list"} or dict
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
        even: bool = False,
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
        **order: Any,
    ):
        self._open_reader(path_or_reader)
        self.batch_size = positive_int("batch_size", batch_size, optional=True)
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.num_epochs = positive_int("num_epochs", num_epochs)
        self.num_workers = None if num_workers is None else nonneg_int("num_workers", num_workers)
        self._init_order(
            "IterableDataset",
            spec=spec,
            shard=shard,
            drop_last=drop_last,
            even=even,
            with_ids=with_ids,
            rows=rows,
            predicate=predicate,
            quality=quality,
            **order,
        )
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._row_tf, self._batch_tf), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform), _as_spec(batch_transform)], self.spec.decode
        )
        self._collator = _Collator(self.output_schema, varlen)
        # Shared memory: persistent DataLoader workers (fork or spawn) see set_epoch.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        # (epoch, remaining) of a loaded state, in shared memory too, so that persistent workers
        # see a state loaded after they started: [epoch + 1 (0: none), has remaining, n, a0, b0,
        # ...].
        self._shared_resume = torch.zeros(3 + 2 * _MAX_RANGES, dtype=torch.int64).share_memory_()
        self._skip: tuple[tuple[int, int], int, int] | None = (
            None  # a worker state: (consumer, taken, row)
        )
        self._progress: dict | None = None  # this process's iteration: where it stands
        self._iterations: weakref.WeakSet = weakref.WeakSet()  # this process's, still open

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_iterations", None)  # generators of this process: not picklable, not a worker's
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._iterations = weakref.WeakSet()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    @property
    def _resume(self) -> tuple[int, list | None] | None:
        sh = self._shared_resume
        if int(sh[0]) == 0:
            return None
        if not int(sh[1]):
            return int(sh[0]) - 1, None
        n = int(sh[2])
        return int(sh[0]) - 1, sh[3 : 3 + 2 * n].view(n, 2).tolist()

    @_resume.setter
    def _resume(self, value: tuple[int, list | None] | None) -> None:
        sh = self._shared_resume
        if value is None:
            sh[0] = 0
            return
        epoch, remaining = value
        if remaining is not None:
            if len(remaining) > _MAX_RANGES:
                raise StateError(
                    f"this state has {len(remaining)} ranges of remaining batches, more than the "
                    f"{_MAX_RANGES} an IterableDataset holds; finish the epoch on one world first",
                    field="remaining",
                )
            sh[2] = len(remaining)
            if remaining:
                sh[3 : 3 + 2 * len(remaining)] = torch.tensor(remaining, dtype=torch.int64).reshape(
                    -1
                )
        sh[1] = remaining is not None
        sh[0] = epoch + 1

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (call before ``iter(loader)``).
        Right after :meth:`load_state_dict`, the loaded epoch keeps the loaded position."""
        epoch = nonneg_int("epoch", epoch)
        if self._resume is not None and self._resume[0] != epoch:
            self._resume, self._skip = None, None
        self._epoch[0] = epoch

    def worker_shard(self) -> tuple[int, int]:
        """The (consumer, consumers) this process reads as: rank x DataLoader worker."""
        rank, world = self.shard
        info = _tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * nw + wid, world * nw

    def _bs(self) -> int:
        return self.batch_size or _ROW_BATCH

    def _remaining(self, epoch: int) -> list | None:
        return self._resume[1] if self._resume is not None and self._resume[0] == epoch else None

    def num_items(self, num_workers: int = 0) -> int:
        """Rows (or batches with ``batch_size``) this rank yields in the next iteration with
        ``num_workers`` DataLoader workers (padding rows included)."""
        rank, world = self.shard
        nw = max(1, num_workers)
        total = 0
        for e in range(self.epoch, self.epoch + self.num_epochs):
            plan = self._plan(self._remaining(e), self._bs())
            unit = self._unit_for(self._bs())
            for w in range(nw):
                c = rank * nw + w
                if self.batch_size is not None:
                    total += int(plan.steps(world * nw, unit)[c])
                else:
                    g = plan.batches(c, world * nw, unit)
                    total += sum(
                        plan.rows_of_batch(int(x))[1] - plan.rows_of_batch(int(x))[0]
                        for x in g
                        if x >= 0
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

    # -- torchdata's Stateful protocol (per process) and job states
    # ---------------------------------
    def state_dict(self) -> dict:
        """Where this process's iteration stands (inside a DataLoader worker: that worker's
        progress, for ``StatefulDataLoader``; resumes the same worker). Before any iteration,
        the state of the epoch to read. Plain JSON values
        (:class:`~rowstore.reader.epochs.StreamState`)."""
        bs = self._bs()
        p = self._progress
        if p is None:
            e = self.epoch
            return self.spec.state(self.reader, bs, e, self._remaining(e))
        return self.spec.state(
            self.reader,
            bs,
            p["epoch"],
            p["remaining"],
            consumer=p["consumer"],
            taken=p["taken"],
            row=p["row"],
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state: a job state (:meth:`ResumableDataLoader.state_dict`, any world
        and workers: the next iteration deals exactly the batches not yet delivered) or a
        worker's (:meth:`state_dict` inside a worker, as ``StatefulDataLoader`` does).
        :class:`~rowstore.errors.StateError` if a field is invalid or the state was saved for
        another dataset or order."""
        self._load_state(state, worker=True)

    def _load_state(self, state: Mapping[str, Any], *, worker: bool) -> None:
        st = self._load(state, self._bs(), worker=worker)
        self._resume = (st.epoch, st.remaining)
        self._epoch[0] = st.epoch
        self._skip = None if st.consumer is None else (st.consumer, st.taken, st.row)

    def __iter__(self) -> Iterator[Any]:
        gen = self._iterate()
        self._iterations.add(gen)
        return gen

    def _stop(self) -> None:
        for gen in list(self._iterations):
            gen.close()  # joins its reader threads
        self._iterations.clear()

    def _iterate(self) -> Generator[Any, None, None]:
        shard = self.worker_shard()
        info = _tud.get_worker_info()
        threads = self.num_threads or (1 if info is not None else None)
        bs = self.batch_size
        col = self._collator
        skip, skip_rows = 0, 0
        if self._skip is not None:
            if self._skip[0] != shard:
                raise StateError(
                    f"this state is DataLoader worker consumer {self._skip[0]}'s; this process is "
                    f"{shard}: a worker state resumes with the same workers (use "
                    f"ResumableDataLoader for another world)",
                    field="consumer",
                )
            _, skip, skip_rows = self._skip
        first = self.epoch
        for epoch in range(first, first + self.num_epochs):
            remaining = self._remaining(epoch)
            if info is None or info.id == 0:
                self._report_quality(epoch, self._bs())
            it = self._read_epoch(
                self._bs(),
                epoch=epoch,
                shard=shard,
                drop_last=self.drop_last if bs else False,
                num_threads=threads,
                remaining=remaining,
                skip=skip,
            )
            p = self._progress = {
                "epoch": epoch,
                "remaining": remaining,
                "consumer": shard,
                "taken": skip,
                "row": 0,
            }
            try:
                for b in it:
                    b, extras = _split_extras(b)
                    b = _process(b, self._row_tf, self._batch_tf, self.output_schema)
                    if bs is not None:
                        out = col.to_torch(b)
                        out.update({k: torch.from_numpy(v) for k, v in extras.items()})
                        p["taken"] += 1
                        yield out if info is None else _Shipped(out)  # a worker's: by value
                        continue
                    n = len(b[self.output_schema.names[0]])
                    for i in range(skip_rows, n):
                        r = col.row(b, i)
                        for k, v in extras.items():
                            r[k] = torch.tensor(v[i])
                        p["row"] = i + 1
                        if i + 1 == n:
                            p["taken"], p["row"] = p["taken"] + 1, 0
                        yield r
                    skip_rows = 0
            finally:
                it.close()
            skip, skip_rows = 0, 0
