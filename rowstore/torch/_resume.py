"""Elastic resume with torch's ``DataLoader``: :class:`ResumableDataLoader` counts the batches
it hands out and turns them into a state that resumes on any world size and number of workers;
:class:`ElasticBatchSampler` deals an epoch's batches to ranks for the map-style
:class:`~rowstore.torch.Dataset` (see :mod:`rowstore.reader.plan`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch.utils.data as _tud

from rowstore._check import positive_int
from rowstore.reader.epochs import EpochSpec, EpochStream, OnStream, no_decode
from rowstore.reader.plan import step_rows
from rowstore.torch._datasets import Dataset, IterableDataset, _Indices
from rowstore.torch._epoch import _EpochReader, _OwnsReader

__all__ = ["ElasticBatchSampler", "ResumableDataLoader"]


class ElasticBatchSampler(OnStream, _tud.Sampler, _EpochReader, _OwnsReader):
    """Batches of row numbers for :class:`~rowstore.torch.Dataset`: this rank's part of the
    epoch's global batches, dealt as :class:`~rowstore.torch.BatchedDataLoader` deals them.

    ``DataLoader(ds, batch_sampler=ElasticBatchSampler(ds, batch_size=64, seed=0),
    collate_fn=rst.collate)``; wrap it in :class:`ResumableDataLoader` to resume on any world.
    The order arguments (``spec``, or ``shuffle``, ``seed``, ``window``, ``pieces``, ``shard``,
    ``drop_last``, ``pad``, ``unit``: ``docs/order.md``) and ``with_ids``, ``rows``/``predicate``,
    ``quality`` are those of :class:`~rowstore.torch.BatchedDataLoader`; with ``pad``, batches
    get ``"__pad"``. The
    sampler holds no state of its own (the same epoch gives the same batches), so
    ``torchdata``'s ``StatefulDataLoader`` resumes it by fast-forwarding.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        spec: EpochSpec | None = None,
        shard: tuple[int, int] | None = None,
        drop_last: bool = False,
        with_ids: bool = False,
        rows: Any = None,
        predicate: Any = None,
        quality: Any = None,
        **order: Any,
    ):
        self._open_reader(dataset.reader if isinstance(dataset, Dataset) else dataset)
        self.batch_size: int = positive_int("batch_size", batch_size)
        self._init_order(
            "ElasticBatchSampler", spec, shard, drop_last, with_ids, rows, predicate, quality, order
        )
        no_decode("ElasticBatchSampler", self.spec)
        self.stream = EpochStream(self.reader, self.batch_size, self.spec, quality=self.quality)

    def set_epoch(self, epoch: int) -> None:
        """Deal epoch ``epoch`` from the next iteration on (keeps a loaded state of that epoch)."""
        self.stream.set_epoch(epoch)

    def resume_from(self, state: Mapping[str, Any]) -> None:
        """Deal only the batches a job state (any rowstore loader's) has left, in its order."""
        self.stream.load_state_dict(state)
        self.spec = self.stream.spec

    def __len__(self) -> int:
        return self.stream.steps_left()

    def __iter__(self) -> Iterator[list[int]]:
        reader, B = self.reader, self.batch_size
        rows_of = reader.layout.rows_of

        def lane(spec: EpochSpec, remaining: Any, skip: int) -> Iterator[Any]:
            order = reader.epoch(keep=spec.keep, **spec.order_kwargs())
            plan = spec.plan(reader, B, remaining)
            return step_rows(order, plan, *spec.shard, self.stream.unit, skip)

        for (ids, mask), _, _ in self.stream.batches(lane=lane):
            yield _Indices(rows_of(ids).tolist(), mask if self.pad else None, self.with_ids)


class ResumableDataLoader(_tud.DataLoader):
    """torch's ``DataLoader`` over a rowstore :class:`~rowstore.torch.IterableDataset` (with
    ``batch_size``; the loader's ``batch_size=None``) or a :class:`~rowstore.torch.Dataset` with
    an :class:`ElasticBatchSampler`, that knows where the job stands.

    It counts the batches it hands out: :meth:`state_dict` is the state once every rank handed
    out as many (as DDP ranks do), the same on every rank; :meth:`load_state_dict` on loaders
    of *another* world size and number of workers resumes with exactly the batches not yet
    delivered. Like :class:`~rowstore.torch.BatchedDataLoader`, a completed iteration moves to
    the next epoch; breaking out of a loop and iterating again continues where it stopped.
    ``len(loader)`` is this rank's number of batches in the next iteration. Persistent
    workers see a state loaded at any time (the IterableDataset keeps it in shared memory).
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any):
        super().__init__(dataset, *args, **kwargs)
        if isinstance(dataset, IterableDataset):
            if dataset.batch_size is None or self.batch_size is not None:
                raise ValueError(
                    "ResumableDataLoader over an IterableDataset needs "
                    "IterableDataset(batch_size=B) "
                    "and DataLoader batch_size=None (whole batches are what it counts)"
                )
            dataset.num_workers = self.num_workers
            self._source: Any = dataset
        elif isinstance(self.batch_sampler, ElasticBatchSampler):
            self._source = self.batch_sampler
        else:
            raise TypeError(
                "ResumableDataLoader takes a rowstore IterableDataset, or a Dataset with "
                "batch_sampler=ElasticBatchSampler(...)"
            )
        self._steps = 0
        self._done = False

    def _lanes(self) -> int:
        """The hand-out's lanes: the DataLoader's workers (the sampler's batches: one)."""
        return max(1, self.num_workers) if isinstance(self._source, IterableDataset) else 1

    def _stream(self) -> EpochStream:
        src = self._source
        if isinstance(src, IterableDataset):
            src._sync()
        return src.stream

    @property
    def epoch(self) -> int:
        return self._source.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` (from its start, unless a state of that epoch was just loaded)."""
        self._source.set_epoch(epoch)
        self._steps, self._done = 0, False

    def state_dict(self) -> dict:
        """The job's state (see the class): plain Python values."""
        st = self._stream()
        own = self._lanes()
        if self._done:
            return st.state_dict(own, steps=st.epoch_steps(st.epoch, own))
        return st.state_dict(own, steps=st.steps + self._steps)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a :meth:`state_dict` of any rank of any world (or any rowstore
        loader's state)."""
        if isinstance(self._source, IterableDataset):
            self._source._load_state(state, worker=False)
        else:
            self._source.resume_from(state)
        self._steps, self._done = 0, False

    def __len__(self) -> int:
        src = self._source
        if isinstance(src, IterableDataset):
            return src.num_items(self.num_workers)
        return len(src)

    def __iter__(self):
        if self._done:
            self._source.set_epoch(self.epoch + 1)
            self._steps, self._done = 0, False
        elif self._steps:  # an iteration was left: continue from where it stopped
            self.load_state_dict(self.state_dict())
        if isinstance(self._source, IterableDataset):  # the loaded position is being read
            self._source._sync()
            self._source.stream._pending = False
            self._source._publish()
        it = self._direct() if self._in_process() else super().__iter__()
        for b in it:
            self._steps += 1
            yield b
        self._done = True

    def _in_process(self) -> bool:
        """True when torch's single-process iterator would only pass the dataset's batches on:
        no workers, an IterableDataset of whole batches, ``default_convert`` (the batches are
        tensors and lists already), no pinning."""
        return (
            self.num_workers == 0
            and isinstance(self._source, IterableDataset)
            and self.collate_fn is _tud.default_convert
            and not self.pin_memory
        )

    def _direct(self) -> Iterator[Any]:
        """The dataset's batches as the single-process iterator hands them out, without its
        per-batch machinery (sampler step, fetcher, ``default_convert`` walking each dict,
        profiler record): about as much time per batch as the reader spends on a small one."""
        it = iter(self._source)
        try:
            yield from it
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
