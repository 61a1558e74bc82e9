"""rowstore: schema-defined, row-oriented HDF5 datasets, read by compiled kernels.

Write a file with :class:`Writer`, a dataset of many files with :class:`DatasetWriter` (or
:func:`write_shard` on workers and one :func:`commit`; :func:`gc_dataset` removes what old
versions left), read with :func:`open`; adapters live in ``rowstore.torch`` and ``rowstore.tf``
(importing ``rowstore`` imports neither framework); DataFrames go in and out through
``rowstore.pandas`` (``rowstore.from_pandas``/``read_pandas``, imported on first use) and
``rowstore.dask``.
"""

from rowstore._version import __version__
from rowstore.codecs import Codec, register_codec
from rowstore.errors import (
    AttrsError,
    ChecksumError,
    CodecError,
    CodecNotAvailableError,
    ConcurrentWriterError,
    FormatError,
    FormatVersionError,
    RowstoreError,
    RowValidationError,
    SchemaError,
    WriterClosedError,
)
from rowstore.format import (
    FORMAT_VERSION,
    DatasetWriter,
    Layout,
    ShardInfo,
    Writer,
    commit,
    gc_dataset,
    restore_pointer,
    write_shard,
)
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = [
    "__version__", "FORMAT_VERSION",
    "Schema", "Field", "STR", "BYTES", "Codec", "register_codec",
    "Writer", "Layout", "open",
    "DatasetWriter", "ShardInfo", "write_shard", "commit", "gc_dataset", "restore_pointer",
    "RowstoreError", "SchemaError", "RowValidationError", "CodecError", "CodecNotAvailableError",
    "FormatError", "FormatVersionError", "ChecksumError", "WriterClosedError",
    "ConcurrentWriterError", "AttrsError",
    "mix",
]  # fmt: skip


_LAZY = {"from_pandas": "rowstore.pandas", "read_pandas": "rowstore.pandas",
         # global shuffle (rowstore.global_shuffle) and dataset-order figures (rowstore.quality)
         "shuffle": "rowstore.global_shuffle", "order_quality": "rowstore.quality"}
# Arrow/Parquet (pyarrow) and Petastorm's reading idioms, imported on first use.
_LAZY.update({"from_arrow": "rowstore.arrow", "from_parquet": "rowstore.arrow",
              "make_reader": "rowstore.reader.make_reader", "make_batch_reader": "rowstore.reader.make_reader",
              "TransformSpec": "rowstore.reader.transform"})


def __getattr__(name):
    """``rowstore.from_pandas``/``read_pandas`` (pandas), ``shuffle`` and ``order_quality``,
    ``from_arrow``/``from_parquet`` (pyarrow), ``make_reader``/``make_batch_reader`` and
    ``TransformSpec`` (Petastorm's) import their modules on first use only."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rowstore' has no attribute {name!r}")


def open(path, **kwargs):  # noqa: A001 - the natural name, like h5py.File / zarr.open
    """Open a dataset for reading: a path, or a URL (``s3://``, ``http(s)://``, ``gs://``,
    ``file://``... with ``storage_options=``, ``cache=``, ``remote=``); see
    :class:`rowstore.reader.Reader` for the options."""
    from rowstore.reader import Reader

    return Reader(path, **kwargs)


# -- weighted mixtures (rowstore.reader.mix) --------------------------------------------------
def mix(sources, **kwargs):
    """A weighted mixture of datasets read as one stream; see :func:`rowstore.reader.mix.mix`."""
    from rowstore.reader.mix import mix as _mix

    return _mix(sources, **kwargs)
