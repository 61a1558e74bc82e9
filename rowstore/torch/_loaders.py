"""The batched loader (no ``DataLoader``): :class:`BatchedDataLoader`, a thin converter over
the :class:`~rowstore.reader.epochs.EpochStream` (transform and collation, the device path: a
producer thread for CUDA), and :class:`MemorySource` (``cache="memory"``)."""

from __future__ import annotations

import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rowstore._check import positive_int
from rowstore.reader.buffers import Ragged
from rowstore.reader.dataset import Reader
from rowstore.reader.epochs import EpochSpec, EpochStream, OnStream, no_decode
from rowstore.reader.plan import ID_KEY, PAD_KEY, step_rows
from rowstore.reader.transform import as_spec as _as_spec
from rowstore.torch._collate import _Collator, _cut_tensors
from rowstore.torch._device import _CudaStage, _to_device
from rowstore.torch._epoch import _EpochReader, _OwnsReader, _split_extras
from rowstore.torch._transform import _schemas


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


_END = object()


class BatchedDataLoader(OnStream, _EpochReader, _OwnsReader):
    """Batches of torch tensors straight from the reader: the fast path (no ``DataLoader``).

    Parameters
    ----------
    path_or_reader : str, os.PathLike, a list of them, or rowstore.reader.Reader
        As in :class:`rowstore.torch.Dataset`: a file, a dataset directory, a URL, or a list of
        those.
    batch_size : int
    spec : EpochSpec, optional
        The order arguments as one object; the keywords ``order`` replace its values.
    **order
        The order arguments of ``docs/order.md``: ``shuffle`` (default ``"block"``; True/False
        allowed), ``seed``, ``window``, ``pieces``, ``pad`` (equal steps on every rank by
        repeating rows: batches get ``"__pad"``, True for a repeated row, to mask out of the
        loss), ``unit``, ``decode`` (image ops of jpeg fields, ``{"image":
        RandomResizedCrop(224)}``: fixed-size uint8 images decoded, cropped and resized by the
        JPEG kernel; :mod:`rowstore.reader.image_ops`). All but ``unit`` and ``decode`` are part
        of a resume state.
    fields : sequence of str, optional
    shard : (rank, world), optional
        This rank's dealt part of each epoch. Default: torch.distributed's rank and world size
        when initialized, else (0, 1).
    device : str or torch.device, optional
        Where batches go. ``None``/``"cpu"``: CPU tensors that are ``torch.from_numpy`` views of
        arrays the reader handed over (nothing is copied). A CUDA device: see Notes.
    pin_memory : bool, optional
        Default True for a CUDA device. With ``device=None`` and CUDA present, True returns
        pinned CPU tensors. Without CUDA it warns and is ignored.
    transform : callable or TransformSpec, optional
        Applied to each batch (numpy) before collation; see :class:`TransformSpec`.
    drop_last : bool
        Equal steps on every rank by leaving out the last partial batch and the batches that
        do not divide evenly.
    num_threads : int, optional
        Reader threads (kernels and image decoders run without the GIL).
    prefetch : int
        Segments each reader thread reads ahead, and batches the CUDA path stages ahead.
    varlen : {"padded", "nested", "list", "ragged"} or dict
    with_ids : bool
        Add ``"__id"`` (int64): each row's dataset row number.
    rows, predicate : optional
        Read a row subset: row numbers, or a function of a batch dict returning one bool per
        row (evaluated once per block when the loader is made); see :meth:`Reader.keep_mask`.
    num_epochs : int or None
        Epochs one iteration yields (default 1: the rest of the current epoch); ``None``: endless.
    quality : None, "log" or callable
        Report each epoch's shuffle quality: ``"log"`` logs it (logger ``"rowstore"``, INFO),
        a callable gets ``(epoch, quality)``.
    cache : None or "memory"
        ``"memory"``: read every row once (the fields read) and deal every epoch from memory
        (:class:`MemorySource`): the same batches in the same order as without it, each a gather
        (a copy) owned by the caller. Memory: the dataset's columns (every rank holds all rows,
        as each epoch deals it other ones). ``decode`` does not apply (``ValueError``).
    storage_options : dict, optional
        For a URL, as :func:`rowstore.open` takes them (refused for a local path or a reader).

    The loader reads with ``num_threads`` threads in this process; for worker processes use
    :class:`IterableDataset` with torch's ``DataLoader`` (or :class:`ResumableDataLoader`).

    Notes
    -----
    The epoch order is the reader's (a pure function of seed, epoch, layout). Its global
    batches are dealt to the ranks (:mod:`rowstore.reader.plan`), so every rank knows its
    steps before the epoch (``len(loader)``) and a state saved on any rank resumes the whole
    job on another world size: :meth:`state_dict` is the same on every rank that took the
    same number of steps, and any rowstore loader (torch, tf, Grain; any number of DataLoader
    workers) resumes it with the identical batch sequence
    (:class:`~rowstore.reader.epochs.EpochStream`). One iteration yields the rest of the current
    epoch; when it completes, the loader moves to the next epoch, so ``for _ in range(n): for b
    in loader`` sees ``n`` different epochs.
    :meth:`set_epoch` picks an epoch explicitly. Breaking out of a loop and iterating again
    continues where it stopped; :meth:`state_dict`/:meth:`load_state_dict` do the same across
    processes.

    CUDA path: a producer thread reads (the reader prefetches on its own threads), transforms and
    collates each batch, copies it into a small ring of pinned buffers (``prefetch + 1`` slots,
    reused; a slot is refilled only once its previous copy completed) and enqueues the
    ``non_blocking`` copies on a side stream, ``prefetch`` batches ahead. The consumer's current
    stream waits on each batch's event (no host sync) and the device tensors are
    ``record_stream``-ed to it. Device tensors are fresh for each batch and owned by the caller.

    Use it as a context manager (``with BatchedDataLoader(...) as dl:``) or call :meth:`close`
    to stop threads and close a reader it opened.
    """

    batch_size: int

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int,
        spec: EpochSpec | None = None,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] | None = None,
        device: Any = None,
        pin_memory: bool | None = None,
        transform: Any = None,
        drop_last: bool = False,
        num_threads: int | None = None,
        prefetch: int = 2,
        varlen: str | Mapping[str, str] = "padded",
        with_ids: bool = False,
        rows: Any = None,
        predicate: Any = None,
        num_epochs: int | None = 1,
        quality: Any = None,
        cache: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        **order: Any,
    ):
        if cache not in (None, "memory"):
            raise ValueError(f"cache must be None or 'memory', got {cache!r}")
        self._open_reader(path_or_reader, storage_options)
        self._init_order(
            "BatchedDataLoader", spec, shard, drop_last, with_ids, rows, predicate, quality, order
        )
        if cache == "memory":
            no_decode("BatchedDataLoader(cache='memory')", self.spec)
            if not isinstance(self.reader, Reader):
                raise ValueError(
                    "BatchedDataLoader(cache='memory') holds a Reader's rows; a "
                    f"{type(self.reader).__name__} is read as it streams (cache=None)"
                )
        self._init_delivery(
            batch_size=batch_size,
            fields=fields,
            device=device,
            pin_memory=pin_memory,
            transform=transform,
            varlen=varlen,
            prefetch=prefetch,
            decode=self.spec.decode,
        )
        self.num_threads = positive_int("num_threads", num_threads, optional=True)
        self.cache = cache
        source: Any = self.reader
        if cache == "memory":
            source = MemorySource(self.reader, self._fields, close=self._owns_reader)
        self.stream = EpochStream(
            source, self.batch_size, self.spec, num_epochs=num_epochs, quality=self.quality
        )

    # -- where the loader stands: its stream's -------------------------------------------------
    num_epochs = property(lambda self: self.stream.num_epochs)

    @property
    def position(self) -> int:
        """Rows of the current epoch delivered by the job: the batches delivered before the
        state it resumed from, plus ``steps`` batches on each of the ``world`` ranks (capped
        at the epoch's rows). With one rank: the rows this loader handed out in the epoch."""
        plan = self.stream.plan(self.stream.epoch)
        before = plan.num_batches - plan.num_positions
        return min((before + self.stream.steps * self.shard[1]) * self.batch_size, plan.num_rows)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` from its start at the next iteration.

        Right after :meth:`load_state_dict`, calling it with the loaded epoch keeps the loaded
        position (so the usual ``for epoch in ...: loader.set_epoch(epoch)`` loop resumes).
        """
        self._stop()
        self.stream.set_epoch(epoch)

    def state_dict(self) -> dict:
        """The epoch in progress and the global batches not yet delivered, assuming every rank
        handed out as many batches as this one (as DDP ranks do): the same state on every rank,
        resumable on any world size and by any rowstore loader with the same order arguments
        (:class:`~rowstore.reader.epochs.EpochStream`). Plain Python values. Call it between
        batches (inside the loop is fine): it counts batches handed out, not prefetched."""
        return self.stream.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state (:meth:`state_dict` of any rowstore loader, any rank, any world
        size): the next iteration yields this rank's part of exactly the batches not yet
        delivered, in the saved run's order on the same world.
        :class:`~rowstore.errors.StateError` (a ``ValueError``) if a field is invalid or the
        state is for another dataset or order (seed, batch size...)."""
        self._stop()
        self.stream.load_state_dict(state)
        self.spec = self.stream.spec

    @property
    def shard_size(self) -> int:
        """Rows this rank reads in a whole epoch (padding included)."""
        plan = self._plan(None)
        g = plan.batches(self.shard[0], self.shard[1], self.stream.unit)
        last = plan.rows_of_batch(plan.num_batches - 1) if plan.num_batches else (0, 0)
        short = self.batch_size - (last[1] - last[0])
        return len(g) * self.batch_size - (
            short if not self.pad and (g == plan.num_batches - 1).any() else 0
        )

    def __len__(self) -> int:
        """Batches this rank yields in the current (running or next) iteration: the same on every
        rank under ``drop_last``/``pad``."""
        if self.stream.num_epochs is None:
            raise TypeError("an endless BatchedDataLoader (num_epochs=None) has no length")
        epoch, steps = self._running if self._running is not None else (self.epoch, self.steps)
        return self.stream.steps_left(1, epoch, steps)

    def _init_delivery(
        self,
        *,
        batch_size,
        fields,
        device,
        pin_memory,
        transform,
        varlen,
        prefetch,
        decode=None,
    ):
        self.batch_size = positive_int("batch_size", batch_size)
        self.prefetch = max(1, int(prefetch))
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._tf,), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform)], decode
        )
        self._collator = _Collator(self.output_schema, varlen)
        self.device = self._resolve_device(device)
        self._cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = self._resolve_pin(pin_memory)
        self._stage: _CudaStage | None = None
        self._running: tuple[int, int] | None = None
        # A weak reference: a loop that breaks drops the iterator, which then closes at once
        # (stopping its threads) instead of living in a loader <-> generator cycle until GC.
        self._active: weakref.ref | None = None
        if self._tf is None and self._collator.dense_only:
            self._convert: Callable[[dict], dict] = _Collator.dense
        else:
            self._convert = self._convert_general
        self._post = None
        if not self._cuda and (
            self._collator.has_var
            or self.pin_memory
            or (self.device is not None and self.device.type != "cpu")
        ):
            self._post = self._post_host

    # -- configuration -------------------------------------------------------------------------
    @staticmethod
    def _resolve_device(device) -> torch.device | None:
        if device is None:
            return None
        dev = torch.device(device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"device {str(device)!r} was asked for but CUDA is not available; "
                    f"use device=None or 'cpu'"
                )
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def _resolve_pin(self, pin_memory) -> bool:
        if pin_memory is None:
            return self._cuda
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True but CUDA is not available: batches are not pinned", stacklevel=4
            )
            return False
        return bool(pin_memory)

    def _convert_general(self, b: dict) -> dict:
        b, extras = _split_extras(b)
        if self._tf is not None:
            b = self._tf.batch(b)
        out = self._collator.host(b)
        out.update({k: torch.from_numpy(v) for k, v in extras.items()})
        return out

    def _post_host(self, out: dict) -> dict:
        if self._collator.has_var:
            out = _Collator.finish(out)
        if self.pin_memory or (self.device is not None and self.device.type != "cpu"):
            out = _to_device(out, self.device, self.pin_memory)
        return out

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        self._stop()
        gen = self._run(self._source())
        self._active = weakref.ref(gen)
        return gen

    def _run(self, source) -> Iterator[dict]:
        pos = self.stream
        self._running = (pos.epoch, pos.steps)
        deliver = self._deliver_cuda(source) if self._cuda else None
        try:
            if deliver is not None:
                for out, e, s in deliver:
                    pos.epoch, pos.steps = e, s
                    yield out
            elif self._cuts_tensors:
                for out, e, s in source:
                    pos.epoch, pos.steps = e, s
                    yield out
            else:
                convert, post = self._convert, self._post
                for b, e, s in source:
                    out = convert(b)
                    if post is not None:
                        out = post(out)
                    pos.epoch, pos.steps = e, s
                    yield out
        finally:
            self._running = None
            if deliver is not None:
                deliver.close()  # stops and joins the producer thread before its source closes
            source.close()
        self._finished()

    def _get_stage(self) -> _CudaStage:
        if self._stage is None:
            self._stage = _CudaStage(self.device, pin=self.pin_memory, slots=self.prefetch + 1)
        return self._stage

    def _deliver_cuda(self, source) -> Generator[tuple[dict, int, int], None, None]:
        """A producer thread reads, transforms, collates, stages into pinned memory and enqueues
        the copies on the side stream, ``prefetch`` batches ahead; this consumer makes the
        current stream wait for each batch's copies."""
        stage = self._get_stage()
        convert = self._convert
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    pass
            return False

        def produce() -> None:
            try:
                with stage.context():
                    for b, e, s in source:
                        out, event, fresh = stage.put(convert(b))
                        if not put((out, event, fresh, e, s)):
                            return
                put(_END)
            except BaseException as exc:  # handed to the consumer, raised there
                put(_Failure(exc))

        worker = threading.Thread(target=produce, name="rowstore-h2d", daemon=True)
        worker.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                out, event, fresh, e, s = item
                stage.receive(event, fresh)
                if self._collator.has_var:
                    out = _Collator.finish(out)  # views/nested built on the consumer's stream
                yield out, e, s
        finally:
            stop.set()
            worker.join()

    def _stop(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active = None
        if gen is not None:
            gen.close()

    # -- iteration -----------------------------------------------------------------------------
    @property
    def _cuts_tensors(self) -> bool:
        """True when the stream yields tensors (the raw fast path: fixed-shape numeric fields,
        no transform, CPU): :func:`_cut_tensors` cuts them from the reads."""
        return not self._cuda and self._convert is _Collator.dense and self._post is None

    def _source(self) -> Generator[tuple[dict, int, int], None, None]:
        dense = self._cuts_tensors
        B = self.batch_size
        return self.stream.batches(
            cut=(lambda parts: _cut_tensors(parts, B)) if dense else None,
            parts=dense,
            fields=self._fields,
            with_ids=self.with_ids,
            num_threads=self.num_threads,
            prefetch=self.prefetch,
            varlen="ragged",
        )

    def _finished(self) -> None:
        self.stream.seek(self.stream.run_stop)


class MemorySource:
    """An :class:`~rowstore.reader.epochs.EpochSource` that reads a reader's rows once and
    deals every epoch from memory: ``BatchedDataLoader(cache="memory")``.

    ``deal`` yields what ``Reader.deal`` yields (the same rows of the same global batches, in
    the same order, with ``"__id"``/``"__pad"``), gathered from the cached columns (a copy per
    batch, owned by the caller); everything else is the reader's. The rows are read at the first
    epoch; a reader opened from a path is then closed (no descriptor kept)."""

    def __init__(self, reader: Any, fields: list[str] | None, *, close: bool = False):
        self.reader, self._fields, self._close = reader, fields, close
        self._rows: dict | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)

    def __len__(self) -> int:
        return len(self.reader)

    def rows(self) -> dict:
        """The cached columns of every row (read on first use)."""
        if self._rows is None:
            r = self.reader
            self._rows = r.take(
                np.arange(len(r), dtype=np.int64), fields=self._fields, varlen="ragged"
            )
            if self._close:
                r.close()  # read once: no descriptor kept for the loader's lifetime
        return self._rows

    def deal(
        self,
        batch_size: int,
        *,
        spec: EpochSpec,
        remaining: Any = None,
        skip: int = 0,
        with_ids: bool = False,
        **_: Any,
    ) -> Generator[dict, None, None]:
        """``Reader.deal``'s batches of ``spec``'s consumer, from memory."""
        cols = self.rows()
        r = self.reader
        spec = spec.resolve(r)
        order = r.epoch(keep=spec.keep, **spec.order_kwargs())
        plan = spec.plan(r, batch_size, remaining)
        unit = spec.unit_for(r, batch_size)
        rows_of = r.layout.rows_of
        for ids, mask in step_rows(order, plan, *spec.shard, unit, skip):
            rows = rows_of(ids)
            b = {k: (v.take(rows) if isinstance(v, Ragged) else v[rows]) for k, v in cols.items()}
            if with_ids:
                b[ID_KEY] = rows
            if spec.pad:
                b[PAD_KEY] = mask
            yield b
