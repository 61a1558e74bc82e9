"""The torch layer over :mod:`rowstore.reader.epochs`: the default shard (torch.distributed's),
:class:`_EpochReader` (the loaders' :class:`~rowstore.reader.epochs.EpochSpec`, which their
:class:`~rowstore.reader.epochs.EpochStream` reads) and :class:`_OwnsReader` (the reader, opened
with ``storage_options`` for a URL, and closing it)."""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from rowstore.reader.dataset import Reader
from rowstore.reader.epochs import EpochSpec, as_pair, check_quality
from rowstore.reader.make_reader import open_source
from rowstore.reader.plan import EXTRA_KEYS, EpochPlan

_ROW_BATCH = 512  # rows read at once (and dealt as one global batch) by IterableDataset in row mode

_Self = TypeVar("_Self", bound="_OwnsReader")


def _resolve_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    """``shard`` if given (checked), else (rank, world size) of torch.distributed when
    initialized, else (0, 1)."""
    if shard is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    return as_pair("shard", shard)


class _EpochReader:
    """Mixin of :class:`IterableDataset`, :class:`BatchedDataLoader` and the elastic batch
    sampler: their :class:`~rowstore.reader.epochs.EpochSpec` (``spec``, made once by
    :meth:`_init_order`; their :class:`~rowstore.reader.epochs.EpochStream` reads it). The
    class sets ``reader`` first."""

    reader: Reader
    spec: EpochSpec
    prefetch: int
    batch_size: int | None
    _fields: list[str] | None

    def _init_order(
        self,
        where: str,
        spec: EpochSpec | None,
        shard: Any,
        drop_last: bool,
        with_ids: bool,
        rows: Any,
        predicate: Any,
        quality: Any,
        order: dict[str, Any],
    ) -> None:
        """Make ``self.spec`` from ``spec`` and the order keywords (``shuffle``, ``seed``,
        ``window``, ``pieces``, ``pad``, ``unit``, ``decode``)."""
        self.drop_last = bool(drop_last)
        keep = self.reader.keep_mask(rows, predicate)
        self.spec = EpochSpec.make(
            spec, shard=_resolve_shard(shard), drop_last=self.drop_last, keep=keep, **order
        )
        self.shard = self.spec.shard
        self.with_ids = bool(with_ids)
        self.quality = check_quality(quality)

    # The order arguments, as the spec holds them.
    shuffle = property(lambda self: self.spec.shuffle)
    seed = property(lambda self: self.spec.seed)
    # The window and pieces the reader resolved (the defaults decided for its file).
    window = property(lambda self: self.spec.resolve(self.reader).window)
    pieces = property(lambda self: self.spec.resolve(self.reader).pieces)
    pad = property(lambda self: self.spec.pad)
    unit = property(lambda self: self.spec.unit)
    _keep = property(lambda self: self.spec.keep)

    def _plan(self, remaining: list | None, batch_size: int | None = None) -> EpochPlan:
        return self.spec.plan(self.reader, batch_size or self.batch_size or _ROW_BATCH, remaining)


def _split_extras(b: dict) -> tuple[dict, dict]:
    """A reader batch without its ``__id``/``__pad``/``__source`` columns (transforms and
    collation see the schema's fields only), and those columns."""
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

    def _open_reader(self, path_or_reader: Any, storage_options: Any = None) -> None:
        self.reader, self._owns_reader = open_source(path_or_reader, storage_options)

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
