"""Datasets for ``torch.utils.data.DataLoader``: map-style :class:`Dataset` and
:class:`IterableDataset`, which splits each epoch over DDP ranks and DataLoader workers."""

from __future__ import annotations

import weakref
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data as _tud

from rowstore.reader._args import nonneg_int, positive_int
from rowstore.torch._args import _EpochReader, _OwnsReader, _resolve_shard
from rowstore.torch._collate import Row, RowBatch, _Collator, collate
from rowstore.torch._transform import _as_spec, _process, _schemas

_ROW_READ_BATCH = 512  # rows read at once by IterableDataset in row mode


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
        """The rows at ``indices`` as one :class:`RowBatch` (one ``Reader.take``)."""
        b = self.reader.take(indices, fields=self._fields, varlen="ragged")
        return RowBatch(
            _process(b, self._row_tf, self._batch_tf, self.output_schema), self._collator
        )


class IterableDataset(_tud.IterableDataset, _EpochReader, _OwnsReader):
    """An iterable torch dataset that splits each epoch over DDP ranks and DataLoader workers.

    Parameters
    ----------
    path_or_reader : str, os.PathLike, a list of them, or rowstore.reader.Reader
        As in :class:`Dataset`.
    batch_size : int, optional
        Yield whole collated batches of this many rows (use ``DataLoader(ds, batch_size=None)``);
        ``None`` yields :class:`Row`\\ s (use ``collate_fn=rowstore.torch.collate``).
    shuffle : {"block", "full", "none"} or bool
        Epoch order mode, see :mod:`rowstore.reader.order`.
    seed : int
        The order is a pure function of (seed, epoch, layout, shard).
    fields : sequence of str, optional
    shard : (rank, world), optional
        This process's rank and the world size. Default: ``torch.distributed``'s when it is
        initialized *when the dataset is created*, else (0, 1).
    even : bool
        Every (rank, worker) gets exactly ``len // (world * num_workers)`` rows (the rest of the
        epoch order is left out that epoch), so ranks stay in step.
    drop_last : bool
        With ``batch_size``: drop each worker's last partial batch.
    window : int
        Blocks mixed together in ``block`` mode.
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
    Worker ``w`` of ``W`` on rank ``r`` of ``R`` reads shard ``(r * W + w, R * W)`` of the epoch
    order: the parts are disjoint and together hold every row exactly once. The epoch set by
    :meth:`set_epoch` lives in shared memory, so persistent workers see it at their next epoch.

    :meth:`close` (or ``with IterableDataset(...) as ds:``) stops this process's running
    iterations (and their reader threads) and closes a reader opened from a path; a reader
    passed in stays open.
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int | None = None,
        shuffle: Any = "block",
        seed: int = 0,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] | None = None,
        even: bool = False,
        drop_last: bool = False,
        window: int = 16,
        transform: Any = None,
        batch_transform: Any = None,
        varlen: str | Mapping[str, str] = "padded",
        num_threads: int | None = None,
        prefetch: int = 2,
    ):
        self._open_reader(path_or_reader)
        self.batch_size = positive_int("batch_size", batch_size, optional=True)
        self.even = bool(even)
        self.drop_last = bool(drop_last)
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.shard = _resolve_shard(shard)
        self._init_order(shuffle, seed, window)
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._row_tf, self._batch_tf), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform), _as_spec(batch_transform)]
        )
        self._collator = _Collator(self.output_schema, varlen)
        # Shared memory: persistent DataLoader workers (fork or spawn) see set_epoch.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
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

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (call before ``iter(loader)``)."""
        self._epoch[0] = nonneg_int("epoch", epoch)

    def worker_shard(self) -> tuple[int, int]:
        """The (index, count) shard this process reads: rank x DataLoader worker."""
        rank, world = self.shard
        info = _tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * nw + wid, world * nw

    def num_items(self, num_workers: int = 0) -> int:
        """Rows (or batches with ``batch_size``) this rank yields per epoch with ``num_workers``."""
        rank, world = self.shard
        nw = max(1, num_workers)
        total = 0
        for w in range(nw):
            s = (rank * nw + w, world * nw)
            if self.batch_size is None:
                total += self.reader.shard_size(shard=s, even=self.even)
            else:
                total += self.reader.num_batches(
                    self.batch_size, shard=s, even=self.even, drop_last=self.drop_last
                )
        return total

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
        threads = self.num_threads or (1 if _tud.get_worker_info() is not None else None)
        bs = self.batch_size
        it = self._read_epoch(
            bs or _ROW_READ_BATCH, epoch=self.epoch, shard=shard,
            drop_last=self.drop_last if bs else False, num_threads=threads,
        )  # fmt: skip
        col = self._collator
        try:
            for b in it:
                b = _process(b, self._row_tf, self._batch_tf, self.output_schema)
                if bs is not None:
                    yield col.to_torch(b)
                else:
                    for i in range(len(b[self.output_schema.names[0]])):
                        yield col.row(b, i)
        finally:
            it.close()
