"""What the datasets and the loaders share about reading: the shard (torch.distributed's by
default), the shuffle mode (True/False allowed), :class:`_EpochReader`, the epoch-order
arguments of ``Reader.batches`` and the call itself, and :class:`_OwnsReader`, the reader and
closing it. Counts are checked by :mod:`rowstore.reader._args`."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any, TypeVar

import torch

from rowstore._check import positive_int
from rowstore.reader import order as _order
from rowstore.reader._args import shuffle_mode
from rowstore.reader.dataset import Reader, as_reader
from rowstore.reader.plan import (
    EXTRA_KEYS,
    EpochPlan,
    default_unit,
    make_state,
    rank_steps_taken,
    read_state,
    subset_key,
)

_log = logging.getLogger("rowstore")
_ROW_BATCH = 512  # rows read at once (and dealt as one global batch) by IterableDataset in row mode

_Self = TypeVar("_Self", bound="_OwnsReader")


def _resolve_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    """``shard`` if given, else (rank, world size) of torch.distributed when initialized, else (0, 1)."""
    if shard is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    try:
        rank, world = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (rank, world), got {shard!r}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, got {shard!r}")
    return rank, world


_shuffle_mode = shuffle_mode  # one definition (True is "block"), in rowstore.reader._args


class _EpochReader:
    """Mixin of :class:`IterableDataset`, :class:`BatchedDataLoader` and the elastic batch
    sampler: their order arguments (shuffle, seed, window, pieces, the equal-steps policy, unit, row
    subset), checked once when the object is made; the dealt epoch (``Reader.deal``) of one
    consumer; and the resumable state (:mod:`rowstore.reader.plan`). The class sets
    ``reader``, ``shard``, ``even``, ``prefetch``, ``batch_size``, ``drop_last`` and
    ``_fields`` before :meth:`_init_order`."""

    reader: Reader
    shard: tuple[int, int]
    even: bool
    prefetch: int
    batch_size: int | None
    drop_last: bool
    _fields: list[str] | None

    def _init_order(self, shuffle: Any, seed: int, window: int, *, pad: bool = False, unit: int | None = None,
                    with_ids: bool = False, rows: Any = None, predicate: Any = None, quality: Any = None,
                    pieces: int = 1) -> None:
        self.shuffle = _shuffle_mode(shuffle)
        self.seed = seed
        self.window = window
        _order.check_args(self.shuffle, seed, 0, window, *self.shard)
        self.pieces = positive_int("pieces", pieces)
        self.pad = bool(pad)
        if self.pad and (self.drop_last or self.even):
            raise ValueError("pad=True and drop_last/even=True are two equal-steps policies: choose one")
        self.unit = positive_int("unit", unit, optional=True)
        self.with_ids = bool(with_ids)
        self._keep = self.reader.keep_mask(rows, predicate)
        if quality is not None and quality != "log" and not callable(quality):
            raise ValueError(f"quality must be None, 'log' or a callable(epoch, quality), got {quality!r}")
        self.quality = quality
        self._quality_done: int | None = None

    def _drop(self) -> bool:
        return self.drop_last or self.even

    def _plan(self, remaining: list | None, batch_size: int | None = None) -> EpochPlan:
        return self.reader.plan(batch_size or self.batch_size or _ROW_BATCH, drop_last=self._drop(), pad=self.pad,
                                remaining=remaining, keep=self._keep)

    def _unit_for(self, batch_size: int) -> int:
        return self.unit or default_unit(self.shuffle, self.window, self.reader.layout.rows_per_block, batch_size,
                                         self.pieces)

    def _order_key(self, batch_size: int) -> dict:
        """What a state's order depends on (checked when it is loaded)."""
        plan = self._plan(None, batch_size)
        return {"seed": self.seed, "shuffle": self.shuffle, "window": self.window, "pieces": self.pieces,
                "dataset_rows": len(self.reader), "dataset_version": self.reader.layout.version,
                "subset": subset_key(self._keep), "batch_size": batch_size, "num_rows": plan.num_rows,
                "drop_last": plan.drop_last, "pad": plan.pad}

    def _state_after(self, epoch: int, remaining: list | None, steps: int, workers: int, batch_size: int) -> dict:
        """The state once every rank handed out ``steps`` batches of ``epoch`` (dealt from
        ``remaining``) with ``workers`` DataLoader workers each."""
        plan = self._plan(remaining, batch_size)
        rank, world = self.shard
        unit = self._unit_for(batch_size)
        left = plan.after(rank_steps_taken(plan, steps, world, workers, unit), unit)
        if left is None:
            return make_state(epoch + 1, self._order_key(batch_size), None)
        return make_state(epoch, self._order_key(batch_size), left)

    def _load(self, state: Any, batch_size: int) -> tuple[int, list | None]:
        return read_state(state, self._order_key(batch_size))

    def _report_quality(self, epoch: int, batch_size: int) -> None:
        """Log (``quality="log"``) or pass to the callback each epoch's shuffle quality, once."""
        if self.quality is None or self._quality_done == epoch:
            return
        self._quality_done = epoch
        q = self.reader.shuffle_quality(batch_size, shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                                        window=self.window, pieces=self.pieces)
        if self.quality == "log":
            _log.info("rowstore epoch %d: shuffle quality %.3f (shuffle=%r, window=%d, pieces=%d, batch_size=%d)",
                      epoch, q, self.shuffle, self.window, self.pieces, batch_size)
        else:
            self.quality(epoch, q)

    def _read_epoch(
        self,
        batch_size: int,
        *,
        epoch: int,
        shard: tuple[int, int],
        drop_last: bool,
        num_threads: int | None,
        remaining: list | None = None,
        skip: int = 0,
        parts: bool = False,
    ) -> Generator[dict, None, None]:
        """Consumer ``shard``'s batches of ``epoch`` (dealt from ``remaining``, its first
        ``skip`` steps skipped); variable-shape fields as ``Ragged`` (collation turns them into
        the ``varlen`` modes); with ``parts``, the reads uncut (see ``Reader.deal``)."""
        return self.reader.deal(
            batch_size, consumer=shard, shuffle=self.shuffle, seed=self.seed, epoch=epoch, window=self.window,
            unit=self._unit_for(batch_size), drop_last=drop_last or self.even, pad=self.pad, remaining=remaining,
            skip=skip, keep=self._keep, fields=self._fields, with_ids=self.with_ids, num_threads=num_threads,
            prefetch=self.prefetch, varlen="ragged", parts=parts, pieces=self.pieces,
        )  # fmt: skip


def _split_extras(b: dict) -> tuple[dict, dict]:
    """A reader batch without its ``__id``/``__pad``/``__source`` columns (transforms and collation see the
    schema's fields only), and those columns."""
    if not any(k in b for k in EXTRA_KEYS):
        return b, {}
    b = dict(b)
    return b, {k: b.pop(k) for k in EXTRA_KEYS if k in b}


class _OwnsReader:
    """Mixin of the datasets and loaders: their reader, and closing it.

    A reader opened here from a path belongs to the object: :meth:`close` (or leaving a
    ``with`` block) closes its descriptor, and so does collecting the object (the reader closes
    itself when it is collected). A :class:`~rowstore.reader.Reader` the caller passed in is
    the caller's: it is never closed here."""

    reader: Reader
    _owns_reader: bool

    def _open_reader(self, path_or_reader: Any) -> None:
        self.reader, self._owns_reader = as_reader(path_or_reader)


    def _stop(self) -> None:
        """Stop this object's iterations that are still running (their reader threads read the
        file), before the reader closes."""

    def close(self) -> None:
        """Stop running iterations (and their reader threads); close the reader if this object
        opened it. The object stays usable: the reader reopens its file on next use."""
        self._stop()
        if self._owns_reader:
            self.reader.close()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
