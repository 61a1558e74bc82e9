"""``rowstore.torch.DataLoader``: Petastorm's ``petastorm.pytorch.DataLoader`` name and arguments
over :class:`BatchedDataLoader` (docs/petastorm.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rowstore.reader.make_reader import PetastormStyleReader
from rowstore.torch._loaders import BatchedDataLoader


class DataLoader(BatchedDataLoader):
    """``DataLoader(reader, batch_size=1, collate_fn=None, shuffling_queue_capacity=0)``, as
    Petastorm's: ``reader`` is what :func:`rowstore.make_reader` returned (its fields, shard,
    shuffle, seed, predicate, transform and ``num_epochs`` are used: one ``for`` loop iterates
    ``num_epochs`` epochs, without end for None), or a path / :class:`~rowstore.reader.Reader`
    (one epoch per loop, as :class:`BatchedDataLoader`). Batches are dicts of tensors.

    ``collate_fn`` must be None (batches are collated by the loader; use ``transform``);
    ``shuffling_queue_capacity`` is accepted and ignored (rows are mixed within the reader's
    window of blocks). Other keyword arguments are :class:`BatchedDataLoader`'s."""

    def __init__(self, reader: Any, batch_size: int = 1, collate_fn: Any = None, shuffling_queue_capacity: int = 0,
                 **kwargs: Any) -> None:  # fmt: skip
        if collate_fn is not None:
            raise ValueError("rowstore.torch.DataLoader collates batches itself: pass transform= instead of collate_fn")
        del shuffling_queue_capacity
        self._petastorm: PetastormStyleReader | None = None
        if isinstance(reader, PetastormStyleReader):
            self._petastorm = reader
            transform = reader.filter if reader.predicate is not None or reader._transform is not None else None
            kwargs = {"shuffle": reader.shuffle, "seed": reader.seed, "shard": reader.shard, "window": reader.window,
                      "pieces": reader.pieces,
                      "fields": reader._read_fields, "transform": transform, **kwargs}  # fmt: skip
            reader = reader.reader
        super().__init__(reader, batch_size=batch_size, **kwargs)

    def __iter__(self) -> Iterator[dict]:
        p = self._petastorm
        if p is None:
            yield from super().__iter__()
            return
        epochs = iter(int, 1) if p.num_epochs is None else range(p.num_epochs)  # iter(int, 1): without end
        for _ in epochs:
            yield from super().__iter__()
