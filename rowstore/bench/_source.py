"""What every bench source is: the :class:`Source` record, the rowstore modes, and the helpers
both the baselines (:mod:`rowstore.bench.sources`) and the rowstore adapters
(:mod:`rowstore.bench.adapters`) use."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.schema import Field

__all__ = ["MODES", "Source", "uniform_order", "var_dims_of"]

#: rowstore modes: how a training script consumes the reader.
MODES = {
    "numpy": "rowstore Reader.batches (dicts of numpy arrays)",
    "torch": "rowstore.torch.Dataset + torch.utils.data.DataLoader",
    "torch-batched": "rowstore.torch.BatchedDataLoader",
    "tf": "rowstore.tf.make_dataset (tf.data)",
}


def uniform_order(num_rows: int, seed: int, epoch: int) -> np.ndarray:
    """A uniform permutation for the baselines, a function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 0x0B]).permutation(num_rows)


@dataclass
class Source:
    """One configured reader: ``epoch(k)`` returns an iterator over the batches of epoch ``k``."""

    label: str
    description: str
    names: list[str]
    epoch: Callable[[int], Iterator[dict]]
    shuffle_quality: Callable[[], float]
    num_batches: int
    info: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    #: field name -> positions of its variable dimensions (for padded outputs, see touch_batch)
    var_dims: dict[str, tuple[int, ...]] = field(default_factory=dict)


def var_dims_of(fields: Sequence[Field]) -> dict[str, tuple[int, ...]]:
    """Field name -> positions of its variable dimensions, for the fields that have any."""
    return {f.name: tuple(f.variable_dims) for f in fields if f.variable_dims}
