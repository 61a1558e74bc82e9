"""What the datasets and the loaders share about reading: the shard (torch.distributed's by
default), the shuffle mode (True/False allowed), :class:`_EpochReader`, the epoch-order
arguments of ``Reader.batches`` and the call itself, and :class:`_OwnsReader`, the reader and
closing it. Counts are checked by :mod:`rowstore.reader._args`."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

import torch

from rowstore.reader import order as _order
from rowstore.reader._args import shuffle_mode
from rowstore.reader.dataset import Reader, as_reader

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
    """Mixin of :class:`IterableDataset` and :class:`BatchedDataLoader`: their order arguments
    (shuffle, seed, window), checked once when the object is made, and the ``Reader.batches``
    call that reads (part of) an epoch. The class sets ``reader``, ``shard``, ``even``,
    ``prefetch`` and ``_fields`` before :meth:`_init_order`."""

    reader: Reader
    shard: tuple[int, int]
    even: bool
    prefetch: int
    _fields: list[str] | None

    def _init_order(self, shuffle: Any, seed: int, window: int) -> None:
        self.shuffle = _shuffle_mode(shuffle)
        self.seed = seed
        self.window = window
        _order.check_args(self.shuffle, seed, 0, window, *self.shard)

    def _read_epoch(
        self,
        batch_size: int,
        *,
        epoch: int,
        shard: tuple[int, int],
        drop_last: bool,
        num_threads: int | None,
        start: int = 0,
    ) -> Generator[dict, None, None]:
        """Batches of ``epoch`` for ``shard`` from row ``start`` on; variable-shape fields as
        ``Ragged`` (collation turns them into the ``varlen`` modes)."""
        return self.reader.batches(
            batch_size, shuffle=self.shuffle, seed=self.seed, epoch=epoch, window=self.window,
            fields=self._fields, shard=shard, even=self.even, drop_last=drop_last,
            num_threads=num_threads, prefetch=self.prefetch, varlen="ragged", start=start,
        )  # fmt: skip


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
