"""PyTorch adapters: datasets for ``torch.utils.data.DataLoader`` and a fast batched loader.

This package is the only part of rowstore that imports torch. Use it as
``import rowstore.torch as rst``.

- :class:`Dataset`: map-style; ``__getitems__`` fetches a whole DataLoader batch with one
  :meth:`Reader.take <rowstore.reader.Reader.take>`; pass ``collate_fn=rowstore.torch.collate``.
- :class:`IterableDataset`: splits each epoch over DDP ranks and DataLoader workers with no
  overlap and no loss; yields rows, or whole batches with ``batch_size``.
- :class:`BatchedDataLoader`: the fast path, no ``DataLoader``: dicts of tensors built with
  ``torch.from_numpy`` on the reader's arrays; with a CUDA ``device``, pinned staging buffers and
  ``non_blocking`` copies on a side stream. Resumable mid-epoch (``state_dict``).
  ``cache="memory"`` reads the rows once and deals every epoch from memory, in the same order.
- :class:`TransformSpec`: a per-row or per-batch transform that declares the fields it edits,
  removes or adds, so every loader knows its ``output_schema``.
- :class:`ResumableDataLoader` and :class:`ElasticBatchSampler`: torch's ``DataLoader`` with a
  state that resumes on another world size and number of workers.
- :func:`collate`: the ``collate_fn`` for :class:`Dataset` and row-mode :class:`IterableDataset`.

Variable-shape fields are collated per field (``varlen=``): ``"padded"`` (a zero-padded tensor
plus ``"<name>__shape"``, the variable dimensions of each row, int64 ``(n, k)``), ``"nested"``
(``torch.nested``: the jagged layout, a view of the batch values, when only the first dimension
varies; otherwise a strided nested tensor, a copy), ``"list"`` (a list of tensors, views) or
``"ragged"`` (the reader's layout, no copy: the flat values, ``"<name>__offsets"`` and
``"<name>__shape"``).
``str``/``bytes`` fields are Python lists; a nullable field adds ``"<name>__null"`` (bool).
See ``docs/torch.md``.
"""

from __future__ import annotations

from rowstore.reader.transform import TransformSpec
from rowstore.torch._collate import Row, RowBatch, collate
from rowstore.torch._convert import VARLEN_MODES, torch_dtype
from rowstore.torch._datasets import Dataset, IterableDataset
from rowstore.torch._device import _CudaStage  # noqa: F401  (tests subclass it as rst._CudaStage)
from rowstore.torch._loaders import BatchedDataLoader
from rowstore.torch._resume import ElasticBatchSampler, ResumableDataLoader

__all__ = [
    "Dataset",
    "IterableDataset",
    "BatchedDataLoader",
    "TransformSpec",
    "collate",
    "Row",
    "RowBatch",
    "torch_dtype",
    "VARLEN_MODES",
    "ResumableDataLoader",
    "ElasticBatchSampler",  # elastic resume (rowstore.reader.plan)
]
