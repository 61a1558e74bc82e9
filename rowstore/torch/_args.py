"""What the datasets and the loaders share about reading: the shard (torch.distributed's by
default), the shuffle mode (True/False allowed), and :class:`_EpochReader`, the epoch-order
arguments of ``Reader.batches`` and the call itself. Counts are checked by
:mod:`rowstore.reader._args`."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import torch

from rowstore.reader import order as _order

if TYPE_CHECKING:
    from rowstore.reader.dataset import Reader


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


def _shuffle_mode(shuffle: Any) -> str:
    if shuffle is True:
        return "block"
    if shuffle is False or shuffle is None:
        return "none"
    if shuffle not in _order.MODES:
        raise ValueError(f"shuffle must be one of {_order.MODES} (or True/False), got {shuffle!r}")
    return shuffle


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
