"""Petastorm's reading entry points over rowstore datasets: :func:`make_reader` (rows) and
:func:`make_batch_reader` (batches), with Petastorm's argument names.

For code moving from Petastorm (``docs/petastorm.md`` maps every call): ``with
make_reader("file:///data/ds", num_epochs=2, schema_fields=["id", "image.*"]) as reader: for
row in reader: row.id``. Underneath is one :class:`~rowstore.reader.Reader` and its
:meth:`~rowstore.reader.Reader.batches`: compiled gathers, block shuffling, shards by
``(cur_shard, shard_count)``, an order that is a pure function of the seed and the epoch.

``predicate`` is applied **vectorized, per batch**: a callable that takes the batch (a dict of
the selected fields' arrays, the fields it needs included, see ``predicate_fields``) and returns
a boolean array with one entry per row; rows where it is False are dropped. (Petastorm's
predicates are per row objects, ``in_lambda(["id"], lambda id: id % 2 == 0)``: write
``lambda b: b["id"] % 2 == 0``.) ``transform_spec`` is a callable or an object with a ``func``
(e.g. :class:`rowstore.torch.TransformSpec`) applied to each batch after the predicate.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rowstore.reader._args import positive_int, select_fields, shuffle_mode
from rowstore.reader.buffers import Ragged
from rowstore.reader.dataset import Reader

__all__ = ["make_reader", "make_batch_reader", "PetastormStyleReader", "take_rows"]


def take_rows(batch: dict, keep: np.ndarray) -> dict:
    """The rows of ``batch`` where ``keep`` (bool, one per row) is True, every column alike."""
    idx = np.flatnonzero(keep)
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, Ragged):
            out[k] = v.take(idx)
        elif isinstance(v, np.ndarray):
            out[k] = v[idx]
        else:
            out[k] = [v[i] for i in idx]
    return out


class PetastormStyleReader:
    """What :func:`make_reader` / :func:`make_batch_reader` return: iterate it (rows as named
    tuples, or batches as named tuples of arrays), use it as a context manager; ``stop()`` and
    ``join()`` exist for Petastorm's idiom and close the reader. ``reader`` is the underlying
    :class:`~rowstore.reader.Reader`, ``schema`` the selected fields' schema."""

    def __init__(self, url: Any, *, batched: bool, batch_size: int, schema_fields: Any, num_epochs: int | None,
                 shuffle: Any, seed: int, cur_shard: int | None, shard_count: int | None,
                 predicate: Callable[[dict], Any] | None, predicate_fields: Any, transform_spec: Any, window: int,
                 num_threads: int | None, verify: Any, pieces: int = 1) -> None:  # fmt: skip
        self.reader = url if isinstance(url, Reader) else Reader(url, verify=verify, num_threads=num_threads)
        self._owned = not isinstance(url, Reader)
        names = select_fields(self.reader.schema, schema_fields, regex=True)
        self.fields: list[str] = names if names is not None else self.reader.schema.names
        self.schema = self.reader.schema.select(self.fields)
        extra = select_fields(self.reader.schema, predicate_fields, regex=True) or []
        self._read_fields = self.fields + [n for n in extra if n not in self.fields]
        if num_epochs is not None:
            positive_int("num_epochs", num_epochs)
        if (cur_shard is None) != (shard_count is None):
            raise ValueError("pass both cur_shard and shard_count, or neither")
        self.shard = (0, 1) if cur_shard is None else (int(cur_shard), int(shard_count))  # type: ignore[arg-type]
        self.shuffle = shuffle_mode(shuffle)
        self.seed, self.window, self.batch_size = int(seed), window, positive_int("batch_size", batch_size)
        self.pieces = positive_int("pieces", pieces)
        self.num_epochs = num_epochs
        self.predicate, self.transform_spec, self.batched = predicate, transform_spec, batched
        self._transform = getattr(transform_spec, "func", transform_spec)
        if self._transform is not None and not callable(self._transform):
            raise TypeError(f"transform_spec must be callable or have a callable func, got {transform_spec!r}")
        if predicate is not None and not callable(predicate):
            raise TypeError(f"predicate must be a callable batch -> bool array, got {predicate!r}")
        self._tuple = collections.namedtuple("Row", self.fields)  # type: ignore[misc]

    # -- batches --------------------------------------------------------------------------------
    def filter(self, batch: dict) -> dict:
        """The predicate and the transform applied to one batch of the reader."""
        if self.predicate is not None:
            keep = np.asarray(self.predicate(batch))
            n = len(next(iter(batch.values()))) if batch else 0
            if keep.dtype != np.bool_ or keep.shape != (n,):
                raise ValueError(f"predicate must return a bool array of shape ({n},), got {keep.dtype} {keep.shape}")
            batch = take_rows(batch, keep)
        if len(self._read_fields) > len(self.fields):
            batch = {k: v for k, v in batch.items() if k.split("__")[0] in self.fields}
        if self._transform is not None:
            batch = self._transform(batch)
        return batch

    def iter_batches(self, epoch: int = 0) -> Iterator[dict]:
        """One epoch of (filtered, transformed) batches as dicts of arrays."""
        for b in self.reader.batches(self.batch_size, shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                                     window=self.window, fields=self._read_fields, shard=self.shard,
                                     pieces=self.pieces):  # fmt: skip
            b = self.filter(b)
            if b and len(next(iter(b.values()))):
                yield b

    def _epochs(self) -> Iterator[int]:
        return itertools.count() if self.num_epochs is None else iter(range(self.num_epochs))

    def __iter__(self) -> Iterator[Any]:
        for epoch in self._epochs():
            for b in self.iter_batches(epoch):
                if self.batched:
                    yield self._tuple(**{k: b[k] for k in self.fields if k in b})
                    continue
                cols = [b[k] for k in self.fields]
                nulls = [b.get(k + "__null") for k in self.fields]
                for i in range(len(cols[0])):
                    yield self._tuple(*[None if m is not None and m[i] else c[i] for c, m in zip(cols, nulls)])  # type: ignore[arg-type]

    # -- lifecycle ------------------------------------------------------------------------------
    def stop(self) -> None:
        if self._owned:
            self.reader.close()

    def join(self) -> None:
        pass

    def __enter__(self) -> PetastormStyleReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def make_reader(url: str | os.PathLike | Reader, *, schema_fields: Sequence[Any] | None = None,
                num_epochs: int | None = 1, shuffle: Any = True, shuffle_row_groups: bool | None = None,
                seed: int | None = None, cur_shard: int | None = None, shard_count: int | None = None,
                predicate: Callable[[dict], Any] | None = None, predicate_fields: Sequence[Any] | None = None,
                transform_spec: Any = None, batch_size: int = 1024, window: int = 16,
                workers_count: int | None = None, reader_pool_type: str | None = None,
                verify: bool | str = True, pieces: int = 1) -> PetastormStyleReader:  # fmt: skip
    """Rows of a rowstore dataset as named tuples (Petastorm's ``make_reader``).

    Parameters
    ----------
    url : path, ``file://`` URL or Reader
        A dataset directory or ``.h5`` file.
    schema_fields : sequence of names, regular expressions or Field objects, optional
        The fields to read (an entry that is no field name is a regex, full match).
    num_epochs : int or None
        Epochs to iterate (None: without end).
    shuffle, shuffle_row_groups : bool or {"block", "full", "none"}
        ``True`` (default): block shuffle (Petastorm's row-group shuffle, rows mixed within
        ``window`` blocks); ``shuffle_row_groups`` is Petastorm's name for it.
    seed : int, optional
        The order's seed (default 0): epoch ``e`` is the same for the same seed.
    cur_shard, shard_count : int, optional
        This reader's part of each epoch (rows split evenly, no overlap).
    predicate, predicate_fields
        A vectorized batch filter (see the module's notes) and the fields it needs beyond
        ``schema_fields``.
    transform_spec : callable or object with ``func``
        Applied to each batch (a dict) after the predicate.
    batch_size : int
        Rows read per batch (rows are still yielded one by one).
    window, workers_count, verify
        Blocks mixed together, reader threads (Petastorm's ``workers_count``), checksums.
    pieces : int
        Block shuffle of pieces of blocks (see :meth:`Reader.batches`; default 1).
    reader_pool_type : str, optional
        Accepted and ignored: reading always runs on the reader's threads without the GIL.
    """
    del reader_pool_type
    return PetastormStyleReader(url, batched=False, batch_size=batch_size, schema_fields=schema_fields,
                                num_epochs=num_epochs,
                                shuffle=shuffle if shuffle_row_groups is None else shuffle_row_groups,
                                seed=seed or 0, cur_shard=cur_shard, shard_count=shard_count, predicate=predicate,
                                predicate_fields=predicate_fields, transform_spec=transform_spec, window=window,
                                num_threads=workers_count, verify=verify, pieces=pieces)  # fmt: skip


def make_batch_reader(url: str | os.PathLike | Reader, *, batch_size: int = 1024, **kwargs: Any
                      ) -> PetastormStyleReader:  # fmt: skip
    """As :func:`make_reader`, but iterating batches: named tuples of per-field arrays of up to
    ``batch_size`` rows (fewer where the predicate dropped rows) (Petastorm's ``make_batch_reader``)."""
    r = make_reader(url, batch_size=batch_size, **kwargs)
    r.batched = True
    return r
