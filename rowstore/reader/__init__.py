"""Reading: :class:`Reader` (random access and shuffled batches), the epoch pipeline every
entry point builds on (:class:`EpochSpec`, :class:`EpochSource`), orders, batch containers."""

from rowstore.reader.buffers import Ragged
from rowstore.reader.dataset import Reader
from rowstore.reader.epochs import EpochSource, EpochSpec
from rowstore.reader.order import shuffle_quality

__all__ = ["Reader", "Ragged", "EpochSpec", "EpochSource", "shuffle_quality"]
