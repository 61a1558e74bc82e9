"""Reading: :class:`Reader` (random access and shuffled batches), orders, batch containers."""

from rowstore.reader.buffers import Ragged
from rowstore.reader.dataset import Reader
from rowstore.reader.order import shuffle_quality

__all__ = ["Reader", "Ragged", "shuffle_quality"]
