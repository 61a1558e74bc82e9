"""Petastorm's names over rowstore, and Petastorm datasets converted without petastorm.

Code moving from Petastorm imports from here what it imported from ``petastorm``
(``docs/petastorm.md`` maps every call):

- :func:`make_reader` and :func:`make_batch_reader` (rows or batches of a dataset, Petastorm's
  arguments) and :class:`TransformSpec`;
- :class:`DataLoader`: ``petastorm.pytorch.DataLoader(reader, batch_size=...)`` over a reader
  of :func:`make_reader` (or a path); it imports torch, on first use only;
- :func:`import_petastorm` (``rowstore import-petastorm URL OUT``): a Petastorm dataset to a
  rowstore dataset, keeping the row order (Parquet files in sorted order, Spark's partition
  order, then row groups); ``rowstore.from_parquet`` does the same for a Petastorm directory by
  default;
- :func:`read_unischema` and :func:`load_unischema`: a dataset's Unischema, read by a
  restricted unpickler (see :mod:`rowstore._unischema`; no Petastorm, pyspark or code from the
  file runs).

The codecs decode as Petastorm's do:

=====================================
==============================================================
Petastorm codec                        rowstore field
=====================================
==============================================================
``NdarrayCodec`` (``numpy.save``)      the Unischema's dtype and shape, stored raw
``CompressedNdarrayCodec`` (``savez``) the same
``CompressedImageCodec('png')``        the PNG bytes as they are (codec ``png``; the files hold RGB:
                                       Petastorm's BGR swap and OpenCV's cancel out)
``CompressedImageCodec('jpeg')``       the JPEG bytes as they are (codec ``jpeg``: no decode, no
                                       second lossy encoding)
``ScalarCodec(spark type)``, none      the Parquet value: numbers, ``str`` (``np.str_``), ``bytes``
=====================================
==============================================================

``import rowstore.petastorm`` imports neither pyarrow nor torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rowstore._unischema import (
    MAX_PICKLE_BYTES,
    UNISCHEMA_KEY,
    PetastormField,
    Unischema,
    load_unischema,
    read_unischema,
)
from rowstore.reader.make_reader import make_batch_reader, make_reader
from rowstore.reader.transform import TransformSpec
from rowstore.schema import Schema

if TYPE_CHECKING:
    from rowstore.torch._petastorm import DataLoader

__all__ = [
    "make_reader",
    "make_batch_reader",
    "TransformSpec",
    "DataLoader",
    "import_petastorm",
    "UNISCHEMA_KEY",
    "MAX_PICKLE_BYTES",
    "PetastormField",
    "Unischema",
    "load_unischema",
    "read_unischema",
]


def __getattr__(name: str) -> Any:
    """:class:`DataLoader` imports torch, so it is imported on first use."""
    if name == "DataLoader":
        from rowstore.torch._petastorm import DataLoader

        return DataLoader
    raise AttributeError(f"module 'rowstore.petastorm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def import_petastorm(
    url: str | os.PathLike, out: str | os.PathLike, *, dataset: bool = True, **kwargs: Any
) -> Schema:
    """Convert the Petastorm dataset at ``url`` (a directory or ``file://`` URL) to rowstore at
    ``out`` (a dataset directory, or one ``.h5`` file with ``dataset=False``); the other
    arguments are :func:`rowstore.from_parquet`'s (``columns``, ``batch_rows``, ``shard_bytes``,
    ``compression``...). Petastorm need not be installed; pyarrow must be. The dataset's files
    are opened as every ingest input is (:mod:`rowstore.storage.inputs`): a FIFO or device
    where a Parquet or metadata file belongs is an :class:`~rowstore.errors.InputError` naming
    it, never an ``open`` that blocks."""
    from rowstore.arrow import from_parquet  # pyarrow: imported when a dataset is converted

    return from_parquet(url, out, petastorm=True, dataset=dataset, **kwargs)
