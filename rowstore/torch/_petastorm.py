"""``rowstore.petastorm.DataLoader``: Petastorm's ``petastorm.pytorch.DataLoader`` name and
arguments over :class:`~rowstore.torch.BatchedDataLoader` (docs/petastorm.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from rowstore.reader.buffers import Ragged
from rowstore.reader.make_reader import PetastormStyleReader
from rowstore.reader.transform import TransformSpec
from rowstore.schema import BYTES, STR, Field, Schema
from rowstore.torch._convert import _castable, _columns_of, _conform_row, _np
from rowstore.torch._loaders import BatchedDataLoader


def _fits(a: np.ndarray, f: Field, rows: bool) -> bool:
    shape = a.shape[1:] if rows else a.shape
    return (
        a.dtype.kind in "biufc"
        and _castable(a.dtype, np.dtype(f.dtype))
        and len(shape) == len(f.shape)
        and all(d is None or d == s for d, s in zip(f.shape, shape))
    )


def _field_of(name: str, v: Any, f: Field, rows: bool) -> Field:
    """The field ``v`` (a transform's output for ``f``'s name) needs where ``f`` does not fit it."""
    if v is None or isinstance(v, Ragged):
        return f
    if isinstance(v, (str, bytes)):
        return (
            f
            if f.dtype in (STR, BYTES)
            else Field(name, STR if isinstance(v, str) else BYTES, nullable=f.nullable)
        )
    if f.dtype in (STR, BYTES) and isinstance(v, np.ndarray) and v.dtype == object:
        return f
    a = _np(v)
    if _fits(a, f, rows):
        return f
    shape = a.shape[1:] if rows else a.shape
    if len(shape) == len(f.shape):  # a variable dimension of the stored field stays variable
        shape = tuple(None if d is None else s for d, s in zip(f.shape, shape))
    return Field(name, a.dtype, shape, nullable=f.nullable)


def _resolved_schema(reader: PetastormStyleReader) -> Schema:
    """The reader's output schema, where fields its transform changes without declaring them
    in ``edit_fields`` take the dtype and shape the function gives the first stored row."""
    spec = reader.transform_spec
    if spec is None or spec.func is None or not len(reader.reader):
        return reader.schema
    declared = {f.name for f in spec.edit_fields}
    sample = reader.reader.take([0], fields=reader._read_fields, varlen="ragged")
    sample = {k: v for k, v in sample.items() if k.split("__")[0] in reader.fields}
    if reader.batched:
        out = reader.transform_batch(sample)
    else:
        out = reader.transform_row(next(reader.rows_of(sample)))
    return Schema(
        [
            f if f.name in declared else _field_of(f.name, out[f.name], f, reader.batched)
            for f in reader.schema
        ]
    )


def _loader_transform(reader: PetastormStyleReader) -> TransformSpec | None:
    """The predicate and transform of ``reader`` as one batch transform for the loader."""
    if reader.predicate is None and reader.transform_spec is None:
        return None
    out = _resolved_schema(reader)

    def per_row(b: dict) -> dict:
        rows = [
            _conform_row(reader.transform_row(r), out, "make_reader's transform_spec")
            for r in reader.rows_of(reader.select(b))
        ]
        return _columns_of(rows, out)

    func = reader.filter if reader.batched or reader.transform_spec is None else per_row
    return TransformSpec(func, edit_fields=list(out), selected_fields=out.names)


class DataLoader(BatchedDataLoader):
    """``DataLoader(reader, batch_size=1, collate_fn=None, shuffling_queue_capacity=0)``, as
    Petastorm's: ``reader`` is what :func:`rowstore.make_reader` or
    :func:`rowstore.make_batch_reader` returned (its fields, shard, shuffle, seed, predicate,
    transform and ``num_epochs`` are used: one ``for`` loop iterates ``num_epochs`` epochs,
    without end for None), or a path / :class:`~rowstore.reader.Reader` (one epoch per loop,
    as :class:`BatchedDataLoader`). Batches are dicts of tensors.

    A ``make_reader`` transform runs on each row, as in Petastorm, and the rows are collated;
    a ``make_batch_reader`` one on each batch. Fields the transform changes (dtype or shape)
    must fit the output schema: those declared in ``edit_fields`` are cast to it, and those
    it changes without declaring them (Petastorm's MNIST example turns a ``uint8 (28, 28)``
    image into a ``float32 (1, 28, 28)`` tensor) take the dtype and shape the function gives
    the first stored row (called once more for that, when the loader is made).

    ``collate_fn`` must be None (batches are collated by the loader; use ``transform``);
    ``shuffling_queue_capacity`` is accepted and ignored (rows are mixed within the reader's
    window of blocks). Other keyword arguments are :class:`BatchedDataLoader`'s."""

    def __init__(
        self,
        reader: Any,
        batch_size: int = 1,
        collate_fn: Any = None,
        shuffling_queue_capacity: int = 0,
        **kwargs: Any,
    ) -> None:
        if collate_fn is not None:
            raise ValueError(
                "rowstore.petastorm.DataLoader collates batches itself: pass transform= instead of "
                "collate_fn"
            )
        del shuffling_queue_capacity
        self._petastorm: PetastormStyleReader | None = None
        if isinstance(reader, PetastormStyleReader):
            self._petastorm = reader
            kwargs = {
                "spec": reader.spec,
                "shard": reader.shard,
                "fields": reader._read_fields,
                "transform": _loader_transform(reader),
                **kwargs,
            }
            reader = reader.reader
        super().__init__(reader, batch_size=batch_size, **kwargs)

    def __iter__(self) -> Iterator[dict]:
        p = self._petastorm
        if p is None:
            yield from super().__iter__()
            return
        epochs = (
            iter(int, 1) if p.num_epochs is None else range(p.num_epochs)
        )  # iter(int, 1): without end
        for _ in epochs:
            yield from super().__iter__()
