"""``tf.data`` datasets of a contiguous part of each epoch: :func:`make_dataset`,
:func:`repeat_epochs` and :func:`distribute_dataset_fn`."""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from rowstore._check import positive_int
from rowstore.reader import Reader
from rowstore.reader._args import varlen_modes
from rowstore.reader.epochs import EpochSpec, part_spec
from rowstore.reader.image_ops import decoded_schema
from rowstore.reader.make_reader import open_source
from rowstore.reader.order import shard_bounds
from rowstore.tf._signature import (
    _ROWSHAPE_KEY,
    VARLEN_MODES,
    _BatchConverter,
    _pad_fn,
    _reshape_rows_fn,
    output_signature,
)

__all__ = ["make_dataset", "repeat_epochs", "distribute_dataset_fn"]

#: Target size of the chunks that generators yield (cut into batches or rows by tf.data).
_CHUNK_BYTES = 1 << 20
_MAX_CHUNK_ROWS = 1 << 16


def _stack_batches(chunks: Any, batch_size: int, drop_last: bool) -> Any:
    """Converted chunks (dicts of arrays of equal length) as stacks of whole batches: dicts of
    arrays shaped ``(n, batch_size, ...)`` (views), then the last partial batch as a stack of
    one (``(1, rows, ...)``) unless ``drop_last``. A chunk whose length is not a multiple of
    ``batch_size`` carries its last rows into the next one, so batch boundaries are those of
    the concatenated stream."""
    carry: dict[str, np.ndarray] | None = None
    for out in chunks:
        if carry is not None:
            out = {key: np.concatenate([carry[key], v]) for key, v in out.items()}
            carry = None
        n = len(next(iter(out.values())))
        whole, rest = divmod(n, batch_size)
        if whole:
            end = whole * batch_size
            yield {
                key: v[:end].reshape((whole, batch_size) + v.shape[1:]) for key, v in out.items()
            }
        if rest:
            carry = {key: v[n - rest :] for key, v in out.items()}
    if carry is not None and not drop_last:
        yield {key: v[None] for key, v in carry.items()}


# -- datasets --------------------------------------------------------------------------------
#: What the dataset functions read: a ``.h5`` file, a dataset directory, a list of those read as
#: one dataset, or an open Reader.
_Source = str | os.PathLike | Sequence[str | os.PathLike] | Reader


class _Fresh:
    """A reader to be copied for each dataset made from it: the copy has the same layout (so a
    dataset directory's same manifest version, and a list's same shards) and its own
    descriptors, which the dataset closes."""

    def __init__(self, reader: Reader):
        self.reader = reader


class _ReaderLease:
    """The reader of one dataset and the generators running on it.

    A reader opened from a path (``owned``) is closed when its last running generator ends
    (finished, closed, or collected with an iterator stopped early), never while another one
    reads: parallel parts and concurrent iterators share the descriptor, and closing it under a
    reading thread could hand its number to another file. A reader the caller passed in is
    never closed.
    """

    def __init__(self, path_or_reader: Any, storage_options: Any = None):
        if isinstance(path_or_reader, _Fresh):  # a copy for this dataset alone, owned by it
            self.reader, self.owned = copy.copy(path_or_reader.reader), True
        else:  # a reader, a path, or a list of paths read as one
            self.reader, self.owned = open_source(path_or_reader, storage_options)
        self._lock = threading.Lock()
        self._running = 0

    def acquire(self) -> None:
        with self._lock:
            self._running += 1

    def release(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0 and self.owned:
                self.reader.close()


def make_dataset(
    path_or_reader: _Source,
    *,
    batch_size: int | None = None,
    spec: EpochSpec | None = None,
    num_epochs: int | None = 1,
    fields: Sequence[str] | None = None,
    part: tuple[int, int] | None = None,
    even: bool = False,
    num_parallel_reads: int | None = None,
    num_threads: int | None = None,
    varlen: str | Mapping[str, str] = "ragged",
    deterministic: bool = True,
    prefetch: int | None = tf.data.AUTOTUNE,
    rows: Any = None,
    predicate: Any = None,
    storage_options: Mapping[str, Any] | None = None,
    **order: Any,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of dicts read from a rowstore dataset.

    Parameters
    ----------
    path_or_reader : path, list of paths, or Reader
        A ``.h5`` file, a dataset directory, or a list of those read as one dataset (opened
        here), or an open :class:`~rowstore.reader.Reader` (to choose ``verify`` or
        ``num_threads``).
    batch_size : int, optional
        Rows per element. Batches come straight from :meth:`Reader.batches` (compiled gather,
        no per-row Python). None: elements are single rows (the reader's batches, unbatched by
        ``tf.data``).
    spec : EpochSpec, optional
        The order arguments as one object (:class:`rowstore.reader.epochs.EpochSpec`); the
        keywords ``order`` replace its values.
    **order
        The order arguments, with the meanings of ``docs/order.md``: ``shuffle``, ``seed``,
        ``epoch`` (the first epoch), ``window``, ``pieces``, ``drop_last`` (drop each part's
        last partial batch; the batch dimension is then static, ``batch_size``). The order
        is a pure function of them and of the layout, ``part``, ``num_parallel_reads`` and
        ``batch_size``. ``decode``: image ops of jpeg fields (``{"image":
        RandomResizedCrop(224)}``, :mod:`rowstore.reader.image_ops`), fixed-size uint8 images.
    num_epochs : int or None
        Epochs ``epoch, epoch + 1, ...`` in one dataset, each in its own order (None: without
        end). Keras ``fit`` re-iterates a dataset each epoch and would replay one order: give it
        ``num_epochs=N`` (or :func:`repeat_epochs`) and ``steps_per_epoch`` instead.
    fields : list of str, optional
        Read only these fields.
    part : (index, count), optional
        This input pipeline's contiguous part of every epoch (``docs/order.md``). With
        ``tf.distribute``: ``(ctx.input_pipeline_id, ctx.num_input_pipelines)``, see
        :func:`distribute_dataset_fn`.
    even : bool
        Give every part (and every parallel read of it) exactly ``len // (count * k)`` rows,
        dropping up to ``count * k - 1`` rows per epoch, so that synchronous workers take the
        same number of steps.
    num_parallel_reads : int, optional
        k: the epoch (or shard) is cut into k disjoint parts, each read by its own generator
        and interleaved with ``num_parallel_calls=k``. Default 1. Each part ends with its own
        partial batch unless ``drop_last``.
    num_threads : int, optional
        Reader threads per part (default: the reader's ``num_threads`` divided by k, at least 1).
    varlen : "ragged", "padded", or dict {field: mode}
        Variable-shape fields in batches: ``tf.RaggedTensor``, or zero-padded to the batch's
        largest shape plus ``"<name>__shape"`` (int64 ``(batch, k)``). A dict sets the mode
        per field (default "ragged"). Rows (``batch_size=None``) are always dense tensors.
    deterministic : bool
        Keep the interleave order fixed (False lets a faster part run ahead; the set of rows
        is the same).
    prefetch : int or None
        ``Dataset.prefetch`` buffer (default AUTOTUNE; None or 0: none).
    rows, predicate : optional
        A row subset (see :meth:`Reader.keep_mask <rowstore.reader.Reader.keep_mask>`): the
        epoch order and its parts are those of the subset.
    storage_options : dict, optional
        For a URL, as :func:`rowstore.open` takes them (refused for a local path or an open
        reader).

    Returns
    -------
    tf.data.Dataset
        Elements as in :func:`output_signature`; ``str`` values are UTF-8 ``tf.string``. The
        cardinality is known (``ds.cardinality()``; infinite for ``num_epochs=None``).

    Notes
    -----
    Each part runs a :meth:`Reader.batches` stream in a ``from_generator`` Python function;
    the reader's kernels run on its own threads without the GIL, while the conversion to
    tensors (a few numpy calls per batch) holds it. Arrays are handed to TensorFlow without
    being kept by the reader.
    """
    lease = _ReaderLease(path_or_reader, storage_options)
    reader = lease.reader
    positive_int("batch_size", batch_size, optional=True)
    positive_int("num_parallel_reads", num_parallel_reads, optional=True)
    positive_int("num_threads", num_threads, optional=True)
    positive_int("num_epochs", num_epochs, optional=True)
    spec, (rank, world) = part_spec("rowstore.tf.make_dataset", spec, part, order)
    if rows is not None or predicate is not None:
        spec = spec.replace(keep=reader.keep_mask(rows, predicate))
    kept = len(reader) if spec.keep is None else int(np.count_nonzero(spec.keep))
    epoch, drop_last = spec.epoch, spec.drop_last
    schema = decoded_schema(reader.schema.select(fields), spec.decode)
    modes = varlen_modes(varlen, schema, modes=VARLEN_MODES, default="ragged")
    k = int(num_parallel_reads or 1)
    threads = int(num_threads or max(1, reader.num_threads // k))
    rows = batch_size is None
    parts = [(rank * k + i, world * k) for i in range(k)]
    bounds = [shard_bounds(kept, *p, even) for p in parts]
    part_rows = [hi - lo for lo, hi in bounds]
    variable = [f for f in schema if f.is_variable]
    padded = [] if rows else [f for f in variable if modes[f.name] == "padded"]

    # Generators yield chunks of `chunk` rows (a multiple of batch_size, about _CHUNK_BYTES):
    # from_generator costs ~0.2 ms of Python per element whatever its size, so small batches
    # are cut from larger chunks by tf.data's rebatch (C++; same rows, same order).
    row_bytes: float = sum(f.fixed_nbytes for f in schema)
    if any(not f.inline for f in schema) and reader.num_rows:
        row_bytes += reader.layout.heap_nbytes / reader.num_rows
    per_chunk = max(1, int(_CHUNK_BYTES // max(row_bytes, 1)))
    if batch_size is None:  # rows
        chunk = min(max(per_chunk, 64), _MAX_CHUNK_ROWS)
    else:
        chunk = int(batch_size) * max(1, min(per_chunk, _MAX_CHUNK_ROWS) // int(batch_size))
    rebatch = not rows and (chunk != batch_size or drop_last)
    # Batches without variable fields: each chunk goes to tf.data as a stack of whole batches,
    # shape (chunk // batch_size, batch_size, ...) (a numpy reshape, no copy), which
    # ``Dataset.unbatch`` (C++) hands out one batch per element: one slice per batch and
    # component, where ``rebatch`` copied rows into each new batch. Same rows, same order, same
    # batch boundaries. Variable (ragged) fields keep ``rebatch``.
    stacked = rebatch and not variable
    if stacked:
        rebatch = False

    # What generators yield: batches (leading dimension None), variable fields ragged; stacked:
    # batches of batches.
    gen_sig = output_signature(schema, batch_size=chunk, varlen="ragged" if rows else modes)
    if stacked:
        gen_sig = {
            key: tf.TensorSpec((None,) + tuple(spec.shape), spec.dtype)
            for key, spec in output_signature(
                schema, batch_size=batch_size, drop_last=drop_last, varlen=modes
            ).items()
        }
    # Each yielded batch is a batch handed out (no rebatching): padded fields are padded in
    # the generator, as the core reader pads (numpy), not in a graph map after it.
    pad_here = not rows and not rebatch and not stacked
    if pad_here:
        padded = []
    for f in variable:
        if pad_here and modes[f.name] == "padded":
            continue  # the padded TensorSpec and "__shape" of output_signature
        if rows:
            gen_sig[f.name] = tf.RaggedTensorSpec(
                (None, None), gen_sig[f.name].dtype, ragged_rank=1
            )
            gen_sig[f.name + _ROWSHAPE_KEY] = tf.TensorSpec((None, len(f.shape)), tf.int64)
        else:
            gen_sig[f.name] = f.tf_spec(-1, ragged=True)
    # Batches with variable fields cross from_generator as numpy parts; the ragged tensors
    # are assembled in the graph (``convert.assemble``), before rebatching.
    convert = _BatchConverter(schema, modes, rows, parts=not rows, pad=pad_here)
    assemble = convert.assembles
    if assemble:
        gen_sig = convert.signature(gen_sig)
    names = schema.names

    def generate(e, i):
        lease.acquire()
        try:
            cut = spec.replace(
                epoch=int(e), drop_last=drop_last and not rebatch and not stacked and not rows
            )
            it = reader.batches(
                chunk,
                spec=cut,
                fields=names,
                part=parts[int(i)],
                even=even,
                num_threads=threads,
                varlen="ragged",
            )
            try:
                if stacked:
                    yield from _stack_batches(map(convert, it), int(batch_size), drop_last)
                else:
                    for b in it:
                        yield convert(b)
            finally:
                it.close()  # joins its reader threads before the reader may close
        finally:
            lease.release()

    def one_part(e, i):
        ds = tf.data.Dataset.from_generator(generate, args=(e, i), output_signature=gen_sig)
        if assemble:
            ds = ds.map(convert.assemble)
        if stacked:
            ds = ds.unbatch()
        elif rebatch:
            ds = ds.rebatch(int(batch_size), drop_remainder=drop_last)
        return ds

    def one_epoch(e):
        if k == 1:
            return one_part(e, tf.constant(0, tf.int64))
        return tf.data.Dataset.range(k).interleave(
            lambda i: one_part(e, i),
            cycle_length=k,
            block_length=1,
            num_parallel_calls=k,
            deterministic=deterministic,
        )

    end = np.iinfo(np.int64).max if num_epochs is None else epoch + num_epochs
    ds = tf.data.Dataset.range(epoch, end).flat_map(one_epoch)
    if batch_size is None:  # rows
        ds = ds.unbatch()
        if variable:
            ds = ds.map(_reshape_rows_fn(variable))
        per_epoch = sum(part_rows)
    else:
        if padded:
            ds = ds.map(_pad_fn(padded), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        B = int(batch_size)
        per_epoch = sum(n // B if drop_last else -(-n // B) for n in part_rows)
    total = tf.data.INFINITE_CARDINALITY if num_epochs is None else per_epoch * num_epochs
    ds = ds.apply(tf.data.experimental.assert_cardinality(total))
    if prefetch:
        ds = ds.prefetch(prefetch)
    return ds


def repeat_epochs(
    path_or_reader: _Source, num_epochs: int | None, **kwargs: Any
) -> tf.data.Dataset:
    """One dataset covering ``num_epochs`` epochs (``epoch, epoch + 1, ...``), each in a new
    order: ``make_dataset(path_or_reader, num_epochs=num_epochs, **kwargs)``; the keywords are
    those of :func:`make_dataset`.

    For Keras: ``model.fit(repeat_epochs(path, N, batch_size=b), epochs=N,
    steps_per_epoch=int(make_dataset(path, batch_size=b).cardinality()))``.
    """
    return make_dataset(path_or_reader, num_epochs=num_epochs, **kwargs)


def distribute_dataset_fn(
    path_or_reader: _Source,
    *,
    global_batch_size: int,
    even: bool = True,
    **kwargs: Any,
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """A ``dataset_fn`` for ``strategy.distribute_datasets_from_function``.

    Each input pipeline reads its own part ``(ctx.input_pipeline_id, ctx.num_input_pipelines)``
    of every epoch in batches of ``ctx.get_per_replica_batch_size(global_batch_size)``. ``even``
    defaults to True so that every pipeline takes the same number of steps (synchronous
    training would otherwise wait on the longest). Other keywords are those of
    :func:`make_dataset` (all but ``batch_size`` and ``part``).

    >>> strategy = tf.distribute.MirroredStrategy()
    >>> dist = strategy.distribute_datasets_from_function(
    ...     rowstore.tf.distribute_dataset_fn("train.h5", global_batch_size=256, seed=1, epoch=e))
    """
    for key in ("batch_size", "part"):
        if key in kwargs:
            raise TypeError(
                f"distribute_dataset_fn sets {key!r} from the input context; do not pass it"
            )
    positive_int("global_batch_size", global_batch_size)
    opened = _ReaderLease(path_or_reader, kwargs.pop("storage_options", None))  # fails here
    reader, owned = opened.reader, opened.owned
    # Each pipeline's dataset owns (and closes) its own copy of a reader opened here: readers are
    # not shared between datasets that would close them under one another. A copy, not the path
    # reopened: a list of paths has no one path, and a dataset directory may have a newer version.
    source: Any = _Fresh(reader) if owned else reader

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_dataset(
            source,
            batch_size=ctx.get_per_replica_batch_size(global_batch_size),
            part=(ctx.input_pipeline_id, ctx.num_input_pipelines),
            even=even,
            **kwargs,
        )

    return dataset_fn
