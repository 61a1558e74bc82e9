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
``lambda b: b["id"] % 2 == 0``.)

``transform_spec`` is a :class:`~rowstore.reader.transform.TransformSpec` (or a plain
callable, or Petastorm's own ``TransformSpec`` object), applied after the predicate as
Petastorm applies it: :func:`make_reader` calls its function on each row (a dict), then drops
``removed_fields`` still there and keeps ``selected_fields``; :func:`make_batch_reader` calls
it on each batch (a dict of arrays where Petastorm passes a pandas DataFrame). The reader's
``schema`` is the output schema (``TransformSpec.output_schema``); the output must hold its
fields and no others. Rows keep the values the function returned (torch tensors stay tensors).
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rowstore._check import positive_int
from rowstore.errors import SchemaError
from rowstore.reader._args import select_fields
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY, Ragged
from rowstore.reader.dataset import Reader, as_reader
from rowstore.reader.epochs import EpochSpec, as_pair
from rowstore.reader.order import shuffle_mode
from rowstore.reader.transform import TransformSpec, as_spec

__all__ = ["make_reader", "make_batch_reader", "PetastormStyleReader", "take_rows", "order_mode"]


def open_source(path_or_reader: Any, storage_options: Any = None) -> tuple[Any, bool]:
    """``(source, owned)`` for an entry point that takes a path or an open source:
    :func:`~rowstore.reader.dataset.as_reader`."""
    return as_reader(path_or_reader, storage_options)


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


def _flag(name: str, value: Any) -> bool | None:
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def order_mode(
    shuffle: Any = None, shuffle_row_groups: Any = None, shuffle_rows: Any = None
) -> str:
    """The epoch order mode of make_reader's arguments: rowstore's ``shuffle`` (True/False or a
    mode name of :mod:`rowstore.reader.order`), or Petastorm's pair ``shuffle_row_groups``
    (default True) / ``shuffle_rows`` (default False): either one True is ``"block"`` (blocks,
    Petastorm's row groups, in a permuted order, rows mixed within ``window`` blocks), both
    False is ``"none"`` (file order). Giving ``shuffle`` and a Petastorm flag is a ValueError."""
    groups, rows = (
        _flag("shuffle_row_groups", shuffle_row_groups),
        _flag("shuffle_rows", shuffle_rows),
    )
    if shuffle is not None:
        if groups is not None or rows is not None:
            raise ValueError(
                f"pass rowstore's shuffle= ({shuffle!r}) or Petastorm's "
                f"shuffle_row_groups=/shuffle_rows=, "
                f"not both"
            )
        return shuffle_mode(shuffle)
    return "block" if (True if groups is None else groups) or bool(rows) else "none"


def _companions(name: str) -> tuple[str, str]:
    return name + NULL_KEY, name + SHAPE_KEY


class PetastormStyleReader:
    """What :func:`make_reader` / :func:`make_batch_reader` return: iterate it (rows as named
    tuples, or batches as named tuples of arrays), use it as a context manager; ``stop()`` and
    ``join()`` exist for Petastorm's idiom and close the reader. ``reader`` is the underlying
    :class:`~rowstore.reader.Reader`, ``input_schema`` the selected fields' schema, ``schema``
    the rows' schema (the transform's output schema), ``transform_spec`` the
    :class:`~rowstore.reader.transform.TransformSpec` (or None)."""

    def __init__(
        self,
        url: Any,
        *,
        batched: bool,
        batch_size: int,
        schema_fields: Any,
        num_epochs: int | None,
        shuffle: Any,
        seed: int,
        cur_shard: int | None,
        shard_count: int | None,
        predicate: Callable[[dict], Any] | None,
        predicate_fields: Any,
        transform_spec: Any,
        window: int | None,
        num_threads: int | None,
        verify: Any,
        pieces: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(url, Reader):
            if storage_options is not None:
                raise ValueError(
                    "storage_options apply to a URL; this Reader is open already (pass them to "
                    "rowstore.open)"
                )
            self.reader = url
        else:
            self.reader = Reader(
                url,
                verify=verify,
                num_threads=num_threads,
                storage_options=None if storage_options is None else dict(storage_options),
            )
        self._owned = not isinstance(url, Reader)
        names = select_fields(self.reader.schema, schema_fields, regex=True)
        self.fields: list[str] = names if names is not None else self.reader.schema.names
        self.input_schema = self.reader.schema.select(self.fields)
        extra = select_fields(self.reader.schema, predicate_fields, regex=True) or []
        self._read_fields = self.fields + [n for n in extra if n not in self.fields]
        if num_epochs is not None:
            positive_int("num_epochs", num_epochs)
        if (cur_shard is None) != (shard_count is None):
            raise ValueError("pass both cur_shard and shard_count, or neither")
        self.shard = (
            (0, 1)
            if cur_shard is None
            else as_pair("cur_shard, shard_count", (cur_shard, shard_count))
        )
        #: The order arguments, checked once (what the loaders over this reader use).
        self.spec = spec = EpochSpec(
            shuffle=shuffle, seed=seed, window=window, pieces=pieces
        ).resolve(self.reader)
        self.shuffle, self.seed, self.window, self.pieces = (
            spec.shuffle,
            spec.seed,
            spec.window,
            spec.pieces,
        )
        self.batch_size = positive_int("batch_size", batch_size)
        self.num_epochs = num_epochs
        self.predicate, self.batched = predicate, batched
        if predicate is not None and not callable(predicate):
            raise TypeError(f"predicate must be a callable batch -> bool array, got {predicate!r}")
        self.transform_spec: TransformSpec | None = as_spec(transform_spec, "transform_spec")
        self.schema = (
            self.input_schema
            if self.transform_spec is None
            else self.transform_spec.output_schema(self.input_schema)
        )
        self._tuple = collections.namedtuple("Row", self.schema.names)  # type: ignore[misc]

    # -- batches and rows ---------------------------------------------------------------------
    def select(self, batch: dict) -> dict:
        """The predicate applied to one batch of the reader, and the fields read only for it
        dropped."""
        if self.predicate is not None:
            keep = np.asarray(self.predicate(batch))
            n = len(next(iter(batch.values()))) if batch else 0
            if keep.dtype != np.bool_ or keep.shape != (n,):
                raise ValueError(
                    f"predicate must return a bool array of shape ({n},), "
                    f"got {keep.dtype} {keep.shape}"
                )
            batch = take_rows(batch, keep)
        if len(self._read_fields) > len(self.fields):
            batch = {k: v for k, v in batch.items() if k.split("__")[0] in self.fields}
        return batch

    def rows_of(self, batch: dict) -> Iterator[dict]:
        """The rows of a (selected) batch as dicts of the input fields (None for nulls)."""
        cols = [batch[k] for k in self.fields]
        nulls = [batch.get(k + NULL_KEY) for k in self.fields]
        for i in range(len(cols[0]) if cols else 0):
            yield {
                k: None if m is not None and m[i] else c[i]
                for k, c, m in zip(self.fields, cols, nulls)
            }

    def _output(self, y: Any, what: str, companions: bool) -> dict:
        spec = self.transform_spec or TransformSpec()
        if not isinstance(y, Mapping):
            raise TypeError(
                f"the transform_spec function must return a dict of the {what}'s fields "
                f"(field name -> "
                f"value), got {type(y).__name__}"
            )
        out_names = set(self.schema.names)
        drop = set(spec.removed_fields)
        for k in y:
            base = k
            if companions and k.endswith((NULL_KEY, SHAPE_KEY)):
                base = k[: -len(NULL_KEY)] if k.endswith(NULL_KEY) else k[: -len(SHAPE_KEY)]
            if base in out_names or base in drop or spec.selected_fields is not None:
                continue
            raise SchemaError(
                f"the transform_spec function returned field {k!r}, which is not in the "
                f"reader's output schema {self.schema.names}; declare it in "
                f"TransformSpec(edit_fields=[...]) or list it "
                f"in removed_fields",
                field=k,
            )
        out: dict[str, Any] = {}
        for f in self.schema:
            if f.name not in y:
                raise SchemaError(
                    f"the transform_spec function's {what} lacks field {f.name!r} of the "
                    f"output schema "
                    f"{self.schema.names}; declare it in TransformSpec(removed_fields=[...])",
                    field=f.name,
                )
            out[f.name] = y[f.name]
            if companions:
                out.update({c: y[c] for c in _companions(f.name) if c in y})
        return out

    def transform_row(self, row: dict) -> dict:
        """One row dict through the transform: its function, then ``removed_fields`` dropped and
        the output schema's fields kept, in its order."""
        return self._transform(row, "row")

    def transform_batch(self, batch: dict) -> dict:
        """One (selected) batch dict through the transform, as :meth:`transform_row` does a row
        (``__null``/``__shape`` companions follow their fields)."""
        return self._transform(batch, "batch")

    def _transform(self, x: dict, kind: str) -> dict:
        spec = self.transform_spec
        if spec is None:
            return x
        y = x if spec.func is None else spec.func(x)
        return self._output(x if y is None else y, kind, companions=kind == "batch")

    def filter(self, batch: dict) -> dict:
        """:meth:`select` and, for a batch reader, :meth:`transform_batch`, on one batch."""
        batch = self.select(batch)
        return self.transform_batch(batch) if self.batched else batch

    def _raw_batches(self, epoch: int) -> Iterator[dict]:
        return self.reader.batches(
            self.batch_size, spec=self.spec, epoch=epoch, fields=self._read_fields, part=self.shard
        )

    def iter_batches(self, epoch: int = 0) -> Iterator[dict]:
        """One epoch of selected batches as dicts of arrays, transformed for a batch reader."""
        for b in self._raw_batches(epoch):
            b = self.filter(b)
            if b and len(next(iter(b.values()))):
                yield b

    def _epochs(self) -> Iterator[int]:
        return itertools.count() if self.num_epochs is None else iter(range(self.num_epochs))

    def __iter__(self) -> Iterator[Any]:
        for epoch in self._epochs():
            for b in self.iter_batches(epoch):
                if self.batched:
                    yield self._tuple(**{k: b[k] for k in self.schema.names})
                    continue
                for row in self.rows_of(b):
                    yield self._tuple(**self.transform_row(row))

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


def make_reader(
    url: str | os.PathLike | Reader,
    *,
    schema_fields: Sequence[Any] | None = None,
    num_epochs: int | None = 1,
    shuffle: Any = None,
    shuffle_row_groups: bool | None = None,
    shuffle_rows: bool | None = None,
    seed: int | None = None,
    cur_shard: int | None = None,
    shard_count: int | None = None,
    predicate: Callable[[dict], Any] | None = None,
    predicate_fields: Sequence[Any] | None = None,
    transform_spec: Any = None,
    storage_options: Mapping[str, Any] | None = None,
    batch_size: int = 1024,
    window: int | None = None,
    workers_count: int | None = None,
    reader_pool_type: str | None = None,
    verify: bool | str = True,
    pieces: int | None = None,
) -> PetastormStyleReader:
    """Rows of a rowstore dataset as named tuples (Petastorm's ``make_reader``).

    Parameters
    ----------
    url : path, URL or Reader
        A dataset directory or ``.h5`` file: a local path, ``file://`` or a remote URL
        (``s3://``, ``gs://``, ``http(s)://``... as :func:`rowstore.open`), or an open
        :class:`~rowstore.reader.Reader`.
    schema_fields : sequence of names, regular expressions or Field objects, optional
        The fields to read (an entry that is no field name is a regex, full match).
    num_epochs : int or None
        Epochs to iterate (None: without end).
    shuffle : bool or {"block", "full", "none"}, optional
        rowstore's order argument (True is ``"block"``). Not with the two below.
    shuffle_row_groups, shuffle_rows : bool, optional
        Petastorm's order arguments (defaults True and False): either True reads blocks
        (Petastorm's row groups) in a permuted order with their rows mixed within ``window``
        blocks (``shuffle="block"``); both False read in file order (``shuffle="none"``).
        See :func:`order_mode`.
    seed : int, optional
        The order's seed (None: 0): the same seed gives the same epochs, in any process.
    cur_shard, shard_count : int, optional
        This reader's contiguous ``part=(cur_shard, shard_count)`` of each epoch (rows split
        evenly, no overlap; ``docs/order.md``).
    predicate, predicate_fields
        A vectorized batch filter (see the module's notes) and the fields it needs beyond
        ``schema_fields``.
    transform_spec : TransformSpec or callable, optional
        Applied to each row (a dict) after the predicate, with its ``edit_fields``,
        ``removed_fields`` and ``selected_fields`` (see the module's notes).
    storage_options : dict, optional
        For a URL: the fsspec filesystem's options, as in :func:`rowstore.open`
        (``{"endpoint_url": ..., "key": ..., "secret": ...}`` for S3...).
    batch_size : int
        Rows read per batch (rows are still yielded one by one).
    window, pieces
        The order arguments of ``docs/order.md``.
    workers_count, verify
        Reader threads (Petastorm's ``workers_count``), checksums.
    reader_pool_type : str, optional
        Accepted and ignored: reading always runs on the reader's threads without the GIL.
    """
    return _make(
        url,
        batched=False,
        schema_fields=schema_fields,
        num_epochs=num_epochs,
        shuffle=shuffle,
        shuffle_row_groups=shuffle_row_groups,
        shuffle_rows=shuffle_rows,
        seed=seed,
        cur_shard=cur_shard,
        shard_count=shard_count,
        predicate=predicate,
        predicate_fields=predicate_fields,
        transform_spec=transform_spec,
        storage_options=storage_options,
        batch_size=batch_size,
        window=window,
        workers_count=workers_count,
        reader_pool_type=reader_pool_type,
        verify=verify,
        pieces=pieces,
    )


def make_batch_reader(
    url: str | os.PathLike | Reader, *, batch_size: int = 1024, **kwargs: Any
) -> PetastormStyleReader:
    """As :func:`make_reader` (the same keyword arguments), but iterating batches: named tuples
    of per-field arrays of up to ``batch_size`` rows (fewer where the predicate dropped rows)
    (Petastorm's ``make_batch_reader``). ``transform_spec``'s function gets each batch (a dict
    of arrays) and returns one."""
    import inspect

    unknown = sorted(set(kwargs) - set(inspect.signature(make_reader).parameters) - {"url"})
    if unknown:
        raise TypeError(
            f"make_batch_reader() got unexpected keyword arguments {unknown}; "
            f"it takes make_reader's"
        )
    return _make(url, batched=True, batch_size=batch_size, **kwargs)


def _make(
    url: Any,
    *,
    batched: bool,
    schema_fields: Any = None,
    num_epochs: int | None = 1,
    shuffle: Any = None,
    shuffle_row_groups: Any = None,
    shuffle_rows: Any = None,
    seed: int | None = None,
    cur_shard: int | None = None,
    shard_count: int | None = None,
    predicate: Any = None,
    predicate_fields: Any = None,
    transform_spec: Any = None,
    storage_options: Any = None,
    batch_size: int = 1024,
    window: int | None = None,
    workers_count: int | None = None,
    reader_pool_type: str | None = None,
    verify: bool | str = True,
    pieces: int | None = None,
) -> PetastormStyleReader:
    del reader_pool_type
    return PetastormStyleReader(
        url,
        batched=batched,
        batch_size=batch_size,
        schema_fields=schema_fields,
        num_epochs=num_epochs,
        shuffle=order_mode(shuffle, shuffle_row_groups, shuffle_rows),
        seed=0 if seed is None else seed,
        cur_shard=cur_shard,
        shard_count=shard_count,
        predicate=predicate,
        predicate_fields=predicate_fields,
        transform_spec=transform_spec,
        window=window,
        num_threads=workers_count,
        verify=verify,
        pieces=pieces,
        storage_options=storage_options,
    )
