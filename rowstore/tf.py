"""TensorFlow adapter: rowstore datasets as ``tf.data.Dataset``\\ s.

:func:`make_dataset` wraps the compiled reader (:meth:`rowstore.reader.Reader.batches`) in
``tf.data.Dataset.from_generator`` with an ``output_signature`` derived from the file's schema,
so no ``tf.io.FixedLenFeature`` boilerplate and no protobuf parsing: batches arrive as
per-field arrays, already gathered by kernels that run without the GIL.

Parallelism: the epoch is cut into ``num_parallel_reads`` disjoint parts, each read by its own
generator (a ``Reader.batches`` stream with its own reader threads) and interleaved with
``Dataset.interleave(..., num_parallel_calls=k)``; then ``prefetch``.

Determinism: the order of one epoch is a pure function of (seed, epoch, file layout, shard,
num_parallel_reads, batch_size) with ``deterministic=True``; a new ``epoch`` gives a new order.

Files: a reader opened here from a path is closed (its descriptor) whenever none of its
generators is running: at the end of each epoch, and when an iteration stopped early is
collected; the next generator reopens it. A reader the caller passed in is never closed here.

This module is the only one in rowstore that imports tensorflow.
"""

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
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY, Ragged, offsets_from_lengths
from rowstore.reader.dataset import VARLEN_MODES, as_reader
from rowstore.reader.order import check_args
from rowstore.reader.plan import (
    EXTRA_KEYS,
    ID_KEY,
    PAD_KEY,
    SOURCE_KEY,
    default_unit,
    make_state,
    rank_steps_taken,
    read_state,
    subset_key,
)
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = [
    "make_dataset",
    "Loader",
    "repeat_epochs",
    "distribute_dataset_fn",
    "output_signature",
    "ragged_to_tf",
]

#: Target size of the chunks that generators yield (cut into batches or rows by tf.data).
_CHUNK_BYTES = 1 << 20
_MAX_CHUNK_ROWS = 1 << 16
#: Key suffix of the per-row shapes that carry variable fields through unbatching (internal).
_ROWSHAPE_KEY = "__rowshape"


# -- signature --------------------------------------------------------------------------------
def _tensor_spec(spec) -> tf.TensorSpec:
    # Without a name: tf.data drops names in some transformations (unbatch), and an unnamed
    # spec compares equal to what the dataset reports in every mode.
    return tf.TensorSpec(spec.shape, spec.dtype)


def output_signature(
    schema: Schema | Reader,
    *,
    batch_size: int | None = None,
    drop_last: bool = False,
    fields: Sequence[str] | None = None,
    varlen: str | Mapping[str, str] = "ragged",
) -> dict[str, tf.TypeSpec]:
    """The ``element_spec`` of :func:`make_dataset` with these arguments.

    Parameters
    ----------
    schema : Schema or Reader
    batch_size : int, optional
        None: rows (no batch dimension). Otherwise a leading batch dimension, ``None`` unless
        ``drop_last`` (then ``batch_size``).
    fields : list of str, optional
        The selected fields (default: all).
    varlen : "ragged", "padded" or dict
        How batches hold variable-shape fields (ignored for rows, which are always dense).

    Returns
    -------
    dict
        Per field: a ``tf.TensorSpec`` (fixed shapes fully known; ``str``/``bytes`` as
        ``tf.string``), a ``tf.RaggedTensorSpec`` (variable shapes, batched, ``ragged``; ragged up
        to the last variable dimension, the fixed dimensions after it dense), or a padded
        ``tf.TensorSpec`` with ``None`` for variable dimensions plus ``"<name>__shape"`` (int64
        ``(batch, k)``, the k variable dimensions of each row). Each nullable field adds
        ``"<name>__null"`` (bool). ``datetime64``/``timedelta64`` fields are ``tf.int64`` (the
        count of the field's unit; NaT is the int64 minimum).
    """
    if isinstance(schema, Reader):
        schema = schema.schema
    schema = schema.select(fields)
    modes = varlen_modes(varlen, schema, modes=VARLEN_MODES, default="ragged")
    batch = None if batch_size is None else (batch_size if drop_last else -1)
    lead: tuple[int | None, ...] = () if batch is None else (None if batch < 0 else batch,)
    sig: dict[str, tf.TypeSpec] = {}
    for f in schema:
        if f.is_variable and batch is not None and modes[f.name] == "ragged":
            sig[f.name] = f.tf_spec(batch, ragged=True)
        else:
            sig[f.name] = _tensor_spec(f.tf_spec(batch, ragged=False))
            if f.is_variable and batch is not None:
                sig[f.name + SHAPE_KEY] = tf.TensorSpec(lead + (len(f.variable_dims),), tf.int64)
        if f.nullable:
            sig[f.name + NULL_KEY] = tf.TensorSpec(lead, tf.bool)
    return sig


# -- conversion of reader batches ------------------------------------------------------------
def ragged_to_tf(r: Ragged, field: Field) -> tf.RaggedTensor:
    """A rowstore :class:`~rowstore.reader.Ragged` batch of ``field`` as a ``tf.RaggedTensor``.

    Built from ``values`` and per-level row splits (vectorised numpy, no loop over rows): ragged
    up to the field's last variable dimension, fixed dimensions between variable ones as
    uniform row lengths, fixed dimensions after the last variable one dense in ``flat_values``.
    The result matches ``field.tf_spec(-1)``. The values buffer is handed to TensorFlow (the
    Ragged must not be modified afterwards).
    """
    shape = field.shape
    last = max(field.variable_dims)
    inner = tuple(int(d) for d in shape[last + 1 :])
    n = len(r)
    shapes = r.shapes
    flat = r.values.reshape((-1,) + inner)
    # Per level j (0..last): the number of level-j sub-rows each row has, and their lengths.
    levels: list[tuple[int | None, np.ndarray | int, int]] = []
    counts = np.ones(n, np.int64)
    for j in range(last + 1):
        nrows = int(counts.sum())
        if shape[j] is None:
            if j == 0 and not inner and last == 0:
                splits = r.offsets  # 1-D field: element offsets are the row splits
            else:
                splits = offsets_from_lengths(
                    np.repeat(shapes[:, j], counts) if j else shapes[:, 0]
                )
            levels.append((None, splits, nrows))
        else:
            levels.append((int(shape[j]), 0, nrows))
        counts = counts * shapes[:, j]
    rt: Any = flat
    for size, splits, nrows in reversed(levels):
        if size is None:
            rt = tf.RaggedTensor.from_row_splits(rt, splits, validate=False)
        else:
            rt = tf.RaggedTensor.from_uniform_row_length(rt, size, nrows=nrows, validate=False)
    return rt


def _int64_view(v: Any) -> Any:
    """A datetime64/timedelta64 array (or Ragged of them) as int64 counts of its unit."""
    if isinstance(v, Ragged):
        return Ragged(v.values.view(np.dtype(np.int64).newbyteorder(v.values.dtype.byteorder)), v.offsets, v.shapes)
    return v.view(np.dtype(np.int64).newbyteorder(v.dtype.byteorder))


class _BatchConverter:
    """Turns reader batch dicts into what the generators yield (see ``_Pipeline``)."""

    def __init__(self, schema: Schema, modes: dict[str, str], rows: bool):
        self.plan = []
        for f in schema:
            if f.dtype in (STR, BYTES):
                kind = "text"
            elif f.is_variable:
                kind = "rows" if rows else modes[f.name]
            else:
                kind = "dense"
            self.plan.append((f, kind))

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f, kind in self.plan:
            name = f.name
            v = batch[name]
            if f.is_time:  # tf has no datetime dtype: int64 counts of the field's unit (views)
                v = _int64_view(v)
            if kind == "text":
                if f.nullable:
                    # The reader gives None for nulls; "<name>__null" says which rows they were.
                    v[batch[name + NULL_KEY]] = "" if f.dtype == STR else b""
            elif kind == "ragged":
                v = ragged_to_tf(v, f)
            elif kind == "padded":
                # Ragged plus the variable dimensions; padded in the graph after rebatching.
                out[name + SHAPE_KEY] = v.shapes[:, list(f.variable_dims)]
                v = ragged_to_tf(v, f)
            elif kind == "rows":
                # Rows: each row's elements flat (one ragged level) plus its full shape; the
                # dataset reshapes each row after unbatching (exact even for empty rows).
                out[name + _ROWSHAPE_KEY] = v.shapes
                v = tf.RaggedTensor.from_row_splits(v.values, v.offsets, validate=False)
            out[name] = v
            if f.nullable:
                out[name + NULL_KEY] = batch[name + NULL_KEY]
        return out


def _pad_fn(fields: list[Field]) -> Callable[[dict], dict]:
    """A tf.data map function padding ragged ``fields`` to each batch's largest shape."""

    def pad(el: dict) -> dict:
        el = dict(el)
        for f in fields:
            var = el[f.name + SHAPE_KEY]
            # Largest variable dimensions of the batch (0 for an empty batch), as
            # Reader(varlen="padded") pads; fixed dimensions as declared.
            maxs = tf.maximum(tf.reduce_max(var, axis=0), 0)
            size = [tf.shape(var, out_type=tf.int64)[0]]
            vi = 0
            for d in f.shape:
                if d is None:
                    size.append(maxs[vi])
                    vi += 1
                else:
                    size.append(tf.constant(d, tf.int64))
            dense = el[f.name].to_tensor(shape=tf.stack(size))
            el[f.name] = tf.ensure_shape(dense, (None,) + tuple(f.shape))
        return el

    return pad


def _reshape_rows_fn(fields: list[Field]) -> Callable[[dict], dict]:
    """A tf.data map function giving unbatched rows of variable ``fields`` their own shape."""

    def reshape(el: dict) -> dict:
        el = dict(el)
        for f in fields:
            shape = el.pop(f.name + _ROWSHAPE_KEY)
            el[f.name] = tf.ensure_shape(tf.reshape(el[f.name], shape), f.shape)
        return el

    return reshape


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
            yield {key: v[:end].reshape((whole, batch_size) + v.shape[1:]) for key, v in out.items()}
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

    def __init__(self, path_or_reader: Any):
        if isinstance(path_or_reader, _Fresh):  # a copy for this dataset alone, owned by it
            self.reader, self.owned = copy.copy(path_or_reader.reader), True
        else:  # a reader, a path, or a list of paths read as one
            self.reader, self.owned = as_reader(path_or_reader)
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
    shuffle: str = "block",
    seed: int = 0,
    epoch: int = 0,
    num_epochs: int | None = 1,
    fields: Sequence[str] | None = None,
    shard: tuple[int, int] | None = None,
    even: bool = False,
    num_parallel_reads: int | None = None,
    num_threads: int | None = None,
    drop_last: bool = False,
    window: int = 16,
    varlen: str | Mapping[str, str] = "ragged",
    deterministic: bool = True,
    prefetch: int | None = tf.data.AUTOTUNE,
    pieces: int = 1,
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
    shuffle : {"block", "full", "none"}
        Epoch order, see :meth:`Reader.batches`.
    seed, epoch : int
        The order is a pure function of (seed, epoch, file layout, shard, num_parallel_reads,
        batch_size): the same values give the same order, another epoch another order.
    num_epochs : int or None
        Epochs ``epoch, epoch + 1, ...`` in one dataset, each in its own order (None: without
        end). Keras ``fit`` re-iterates a dataset each epoch and would replay one order: give it
        ``num_epochs=N`` (or :func:`repeat_epochs`) and ``steps_per_epoch`` instead.
    fields : list of str, optional
        Read only these fields.
    shard : (index, count), optional
        This input pipeline's part of every epoch (disjoint parts whose union is the epoch).
        With ``tf.distribute``: ``(ctx.input_pipeline_id, ctx.num_input_pipelines)``, see
        :func:`distribute_dataset_fn`.
    even : bool
        Give every shard (and every parallel part) exactly ``len // (count * k)`` rows, dropping
        up to ``count * k - 1`` rows per epoch, so that synchronous workers take the same
        number of steps.
    num_parallel_reads : int, optional
        k: the epoch (or shard) is cut into k disjoint parts, each read by its own generator
        and interleaved with ``num_parallel_calls=k``. Default 1. Each part ends with its own
        partial batch unless ``drop_last``.
    num_threads : int, optional
        Reader threads per part (default: the reader's ``num_threads`` divided by k, at least 1).
    drop_last : bool
        Drop each part's last partial batch; the batch dimension is then static
        (``batch_size``).
    window : int
        Blocks mixed together in ``block`` shuffling.
    pieces : int
        ``block`` shuffling: permute pieces of ``ceil(rows_per_block / pieces)`` rows instead
        of whole blocks (``window`` counts pieces): far better mixed batches for the same
        memory; see :meth:`Reader.batches` and docs/order.md. Default 1 (whole blocks).
    varlen : "ragged", "padded", or dict {field: mode}
        Variable-shape fields in batches: ``tf.RaggedTensor``, or zero-padded to the batch's
        largest shape plus ``"<name>__shape"`` (int64 ``(batch, k)``). A dict sets the mode
        per field (default "ragged"). Rows (``batch_size=None``) are always dense tensors.
    deterministic : bool
        Keep the interleave order fixed (False lets a faster part run ahead; the set of rows
        is the same).
    prefetch : int or None
        ``Dataset.prefetch`` buffer (default AUTOTUNE; None or 0: none).

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
    lease = _ReaderLease(path_or_reader)
    reader = lease.reader
    positive_int("batch_size", batch_size, optional=True)
    positive_int("num_parallel_reads", num_parallel_reads, optional=True)
    positive_int("num_threads", num_threads, optional=True)
    positive_int("num_epochs", num_epochs, optional=True)
    rank, world = (0, 1) if shard is None else shard
    check_args(shuffle, seed, epoch, window, rank, world)
    positive_int("pieces", pieces)
    schema = reader.schema.select(fields)
    modes = varlen_modes(varlen, schema, modes=VARLEN_MODES, default="ragged")
    k = int(num_parallel_reads or 1)
    threads = int(num_threads or max(1, reader.num_threads // k))
    rows = batch_size is None
    parts = [(rank * k + i, world * k) for i in range(k)]
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
    for f in variable:
        if rows:
            gen_sig[f.name] = tf.RaggedTensorSpec(
                (None, None), gen_sig[f.name].dtype, ragged_rank=1
            )
            gen_sig[f.name + _ROWSHAPE_KEY] = tf.TensorSpec((None, len(f.shape)), tf.int64)
        else:
            gen_sig[f.name] = f.tf_spec(-1, ragged=True)
    convert = _BatchConverter(schema, modes, rows)
    names = schema.names

    def generate(e, i):
        lease.acquire()
        try:
            it = reader.batches(
                chunk, shuffle=shuffle, seed=seed, epoch=int(e), window=window, fields=names,
                shard=parts[int(i)], even=even, pieces=pieces,
                drop_last=drop_last and not rebatch and not stacked and not rows,
                num_threads=threads, varlen="ragged",
            )  # fmt: skip
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
        if stacked:
            ds = ds.unbatch()
        elif rebatch:
            ds = ds.rebatch(int(batch_size), drop_remainder=drop_last)
        return ds

    def one_epoch(e):
        if k == 1:
            return one_part(e, tf.constant(0, tf.int64))
        return tf.data.Dataset.range(k).interleave(
            lambda i: one_part(e, i), cycle_length=k, block_length=1, num_parallel_calls=k,
            deterministic=deterministic,
        )  # fmt: skip

    end = np.iinfo(np.int64).max if num_epochs is None else epoch + num_epochs
    ds = tf.data.Dataset.range(epoch, end).flat_map(one_epoch)
    if batch_size is None:  # rows
        ds = ds.unbatch()
        if variable:
            ds = ds.map(_reshape_rows_fn(variable))
        per_epoch = sum(reader.shard_size(shard=p, even=even) for p in parts)
    else:
        if padded:
            ds = ds.map(_pad_fn(padded), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        per_epoch = sum(
            reader.num_batches(int(batch_size), shard=p, even=even, drop_last=drop_last)
            for p in parts
        )
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

    Each input pipeline reads its own shard ``(ctx.input_pipeline_id, ctx.num_input_pipelines)``
    of every epoch in batches of ``ctx.get_per_replica_batch_size(global_batch_size)``. ``even``
    defaults to True so that every pipeline takes the same number of steps (synchronous
    training would otherwise wait on the longest). Other keywords are those of
    :func:`make_dataset` (all but ``batch_size`` and ``shard``).

    >>> strategy = tf.distribute.MirroredStrategy()
    >>> dist = strategy.distribute_datasets_from_function(
    ...     rowstore.tf.distribute_dataset_fn("train.h5", global_batch_size=256, seed=1, epoch=e))
    """
    for key in ("batch_size", "shard"):
        if key in kwargs:
            raise TypeError(
                f"distribute_dataset_fn sets {key!r} from the input context; do not pass it"
            )
    positive_int("global_batch_size", global_batch_size)
    opened = _ReaderLease(path_or_reader)  # a bad path fails here, not inside the strategy
    reader, owned = opened.reader, opened.owned
    # Each pipeline's dataset owns (and closes) its own copy of a reader opened here: readers are
    # not shared between datasets that would close them under one another. A copy, not the path
    # reopened: a list of paths has no one path, and a dataset directory may have a newer version.
    source: Any = _Fresh(reader) if owned else reader

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return make_dataset(
            source, batch_size=ctx.get_per_replica_batch_size(global_batch_size),
            shard=(ctx.input_pipeline_id, ctx.num_input_pipelines), even=even, **kwargs,
        )  # fmt: skip

    return dataset_fn


# -- resumable input (rowstore.reader.plan) -----------------------------------------------------
class Loader(tf.Module):
    """A resumable ``tf.data`` input: this worker's part of each epoch's global batches, dealt
    as the torch loaders deal them (:mod:`rowstore.reader.plan`), with a state that resumes on
    another number of workers.

    ``loader = rowstore.tf.Loader(path, batch_size=64, seed=0, shard=(i, n))``; ``ds =
    loader.dataset(num_epochs=...)`` reads from where the loader stands. The loader is a
    ``tf.Module``: its progress lives in ``tf.Variable``\\ s, so ``tf.train.Checkpoint(model=m,
    data=loader)`` saves and restores it beside the model; :meth:`state_dict` /
    :meth:`load_state_dict` give the same state as plain Python (JSON), which
    :class:`rowstore.torch.BatchedDataLoader` reads too. The state is the same on every worker
    that took the same number of steps and resumes on any ``shard`` count.

    Progress counts the batches the dataset hands out: the dataset's last step records it, and
    tf.data's automatic prefetch at the end is turned off (``inject_prefetch=False``), so a
    batch counts when your loop receives it. Keras ``fit`` and distribution strategies read
    ahead of the step they train; there, save the state returned by :meth:`state_at` for the
    step you trained (``batch["__step"]``).

    Parameters
    ----------
    path_or_reader, batch_size, shuffle, seed, window, pieces, fields, varlen, num_threads
        As in :func:`make_dataset`; ``pieces`` is part of the order, so a state (or a
        ``tf.train.Checkpoint``) resumes only with the same ``pieces`` (one saved before
        ``pieces`` existed is a ``pieces=1`` state).
    shard : (index, count), optional
        This worker's part (default (0, 1)).
    drop_last, pad : bool
        Equal steps on every worker, by leaving rows out or repeating them (``"__pad"``: True
        for a repeated row); neither: step counts may differ by one.
    unit : int, optional
        Global batches dealt at a time (default: about a window of rows).
    with_ids : bool
        Add ``"__id"`` (int64), each row's dataset row number.
    rows, predicate : optional
        A row subset (see :meth:`Reader.keep_mask <rowstore.reader.Reader.keep_mask>`).
    quality : None, "log" or callable
        Report each epoch's shuffle quality when its first batch is read.

    Elements also hold ``"__epoch"`` and ``"__step"`` (int64 scalars: the epoch and this
    worker's steps taken in it once the batch is handed out).
    """

    def __init__(self, path_or_reader: _Source, *, batch_size: int, shuffle: str = "block", seed: int = 0,
                 window: int = 16, shard: tuple[int, int] | None = None, drop_last: bool = False, pad: bool = False,
                 unit: int | None = None, with_ids: bool = False, rows: Any = None, predicate: Any = None,
                 fields: Sequence[str] | None = None, varlen: str | Mapping[str, str] = "ragged",
                 num_threads: int | None = None, quality: Any = None, pieces: int = 1):
        super().__init__(name="rowstore_loader")
        self.reader, _ = as_reader(path_or_reader)
        self.batch_size = positive_int("batch_size", batch_size)
        self.shard = (0, 1) if shard is None else (int(shard[0]), int(shard[1]))
        check_args(shuffle, seed, 0, window, *self.shard)
        if drop_last and pad:
            raise ValueError("drop_last and pad are two equal-steps policies: choose one")
        self.shuffle, self.seed, self.window = shuffle, seed, window
        self.pieces = positive_int("pieces", pieces)
        self.drop_last, self.pad, self.with_ids = bool(drop_last), bool(pad), bool(with_ids)
        self.unit = positive_int("unit", unit, optional=True) or default_unit(
            shuffle, window, self.reader.layout.rows_per_block, self.batch_size, self.pieces)
        self.fields = fields
        self.num_threads = positive_int("num_threads", num_threads, optional=True)
        self._keep = self.reader.keep_mask(rows, predicate)
        self.quality = quality
        self._schema = self.reader.schema.select(fields)
        self._modes = varlen_modes(varlen, self._schema, modes=VARLEN_MODES, default="ragged")
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self._base_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="base_epoch")
        # JSON {"order": what the order depends on, "remaining": the resumed epoch's remaining
        # batches}: a tf.train.Checkpoint holds the order key, so restoring one of another order
        # (seed, window, pieces...) is refused as load_state_dict refuses it. Checkpoints saved
        # before the order key was kept here hold "" or the bare remaining list (accepted).
        self._base = tf.Variable(self._base_json(None), dtype=tf.string, trainable=False, name="base")

    # -- state ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.numpy())

    @property
    def steps(self) -> int:
        """Batches handed out in the current epoch (since the state it resumed from)."""
        return int(self._steps.numpy())

    def _remaining(self, epoch: int) -> list | None:
        if int(self._base_epoch.numpy()) != epoch:
            return None
        import json

        text = self._base.numpy().decode()
        v = json.loads(text) if text else None
        return v["remaining"] if isinstance(v, dict) else v

    def _plan(self, remaining: list | None):
        return self.reader.plan(self.batch_size, drop_last=self.drop_last, pad=self.pad, remaining=remaining,
                                keep=self._keep)

    def _order_key(self) -> dict:
        plan = self._plan(None)
        return {"seed": self.seed, "shuffle": self.shuffle, "window": self.window, "pieces": self.pieces,
                "dataset_rows": len(self.reader), "dataset_version": self.reader.layout.version,
                "subset": subset_key(self._keep), "batch_size": self.batch_size, "num_rows": plan.num_rows,
                "drop_last": plan.drop_last, "pad": plan.pad}

    def _base_json(self, remaining: list | None) -> str:
        import json

        return json.dumps({"order": self._order_key(), "remaining": remaining}, sort_keys=True)

    def _check_order(self) -> None:
        """``ValueError`` if a restored ``tf.train.Checkpoint`` was saved for another order; a
        checkpoint from before the order key was saved is taken as this loader's order."""
        import json

        text = self._base.numpy().decode()
        v = json.loads(text) if text else None
        if isinstance(v, dict):
            if json.dumps(v["order"], sort_keys=True) != json.dumps(self._order_key(), sort_keys=True):
                read_state(make_state(0, v["order"], None), self._order_key())
        else:  # an old checkpoint: from now on the variable holds this loader's order key
            self._base.assign(self._base_json(v))

    def state_at(self, epoch: int, steps: int) -> dict:
        """The state once every worker took ``steps`` batches of ``epoch`` (plain Python)."""
        self._check_order()
        plan = self._plan(self._remaining(int(epoch)))
        left = plan.after(rank_steps_taken(plan, int(steps), self.shard[1], 1, self.unit), self.unit)
        if left is None:
            return make_state(int(epoch) + 1, self._order_key(), None)
        return make_state(int(epoch), self._order_key(), left)

    def state_dict(self) -> dict:
        """Where the input stands (see the class): plain Python values, JSON friendly."""
        return self.state_at(self.epoch, self.steps)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state of any worker of any worker count: the next :meth:`dataset`
        deals exactly the batches not yet delivered."""
        epoch, remaining = read_state(dict(state), self._order_key())
        self._epoch.assign(epoch)
        self._steps.assign(0)
        self._base_epoch.assign(epoch)
        self._base.assign(self._base_json(remaining))

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning at the next :meth:`dataset`."""
        self._epoch.assign(int(epoch))
        self._steps.assign(0)
        self._base_epoch.assign(-1)

    def __len__(self) -> int:
        """Steps of the current epoch still to take (this worker)."""
        self._check_order()
        plan = self._plan(self._remaining(self.epoch))
        return int(plan.steps(self.shard[1], self.unit)[self.shard[0]]) - self.steps

    # -- the dataset ---------------------------------------------------------------------------
    def dataset(self, num_epochs: int | None = 1) -> tf.data.Dataset:
        """Batches from where the loader stands, for ``num_epochs`` epochs (the current one
        counts; None: endless). Recording progress is the dataset's last step."""
        positive_int("num_epochs", num_epochs, optional=True)
        self._check_order()
        schema, modes = self._schema, self._modes
        variable = [f for f in schema if f.is_variable]
        padded = [f for f in variable if modes[f.name] == "padded"]
        sig = output_signature(schema, batch_size=self.batch_size, varlen=modes)
        for f in variable:
            sig[f.name] = f.tf_spec(-1, ragged=True)
        if self.with_ids:
            sig[ID_KEY] = tf.TensorSpec((None,), tf.int64)
        if self.pad:
            sig[PAD_KEY] = tf.TensorSpec((None,), tf.bool)
        if getattr(self.reader, "with_source", False):  # a rowstore.mix Mixture
            sig[SOURCE_KEY] = tf.TensorSpec((None,), tf.int64)
        sig["__epoch"] = tf.TensorSpec((), tf.int64)
        sig["__step"] = tf.TensorSpec((), tf.int64)
        convert = _BatchConverter(schema, modes, False)
        e0, s0 = self.epoch, self.steps
        stop = None if num_epochs is None else e0 + num_epochs
        names = schema.names
        reported: set[int] = set()

        def generate():
            epoch, skip = e0, s0
            while stop is None or epoch < stop:
                if self.quality is not None and epoch not in reported:
                    reported.add(epoch)
                    q = self.reader.shuffle_quality(self.batch_size, shuffle=self.shuffle, seed=self.seed,
                                                    epoch=epoch, window=self.window, pieces=self.pieces)
                    if self.quality == "log":
                        import logging

                        logging.getLogger("rowstore").info("rowstore epoch %d: shuffle quality %.3f", epoch, q)
                    else:
                        self.quality(epoch, q)
                it = self.reader.deal(
                    self.batch_size, consumer=self.shard, shuffle=self.shuffle, seed=self.seed, epoch=epoch,
                    window=self.window, unit=self.unit, drop_last=self.drop_last, pad=self.pad,
                    remaining=self._remaining(epoch), skip=skip, keep=self._keep, fields=names,
                    with_ids=self.with_ids, num_threads=self.num_threads, varlen="ragged", pieces=self.pieces,
                )  # fmt: skip
                step = skip
                try:
                    for b in it:
                        out = convert(b)
                        for k in EXTRA_KEYS:
                            if k in b:
                                out[k] = b[k]
                        step += 1
                        out["__epoch"] = np.int64(epoch)
                        out["__step"] = np.int64(step)
                        yield out
                finally:
                    it.close()
                epoch, skip = epoch + 1, 0

        ds = tf.data.Dataset.from_generator(generate, output_signature=sig)
        if padded:
            ds = ds.map(_pad_fn(padded))
        ds = ds.prefetch(2)
        epoch_v, steps_v = self._epoch, self._steps

        def record(el):
            epoch_v.assign(el["__epoch"])
            steps_v.assign(el["__step"])
            return el

        opts = tf.data.Options()
        opts.experimental_optimization.inject_prefetch = False
        return ds.map(record).with_options(opts)
