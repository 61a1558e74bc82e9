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

This package is the only part of rowstore that imports tensorflow: ``_signature`` (element
signatures and batch conversion), ``_dataset`` (:func:`make_dataset`, :func:`repeat_epochs`,
:func:`distribute_dataset_fn`) and ``_loader`` (:class:`Loader`).
"""

from __future__ import annotations

from rowstore.tf._dataset import distribute_dataset_fn, make_dataset, repeat_epochs
from rowstore.tf._loader import Loader
from rowstore.tf._signature import VARLEN_MODES, output_signature, ragged_to_tf

__all__ = [
    "make_dataset",
    "Loader",
    "repeat_epochs",
    "distribute_dataset_fn",
    "output_signature",
    "ragged_to_tf",
    "VARLEN_MODES",
]
