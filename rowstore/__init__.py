"""rowstore: schema-defined, row-oriented HDF5 datasets, read by compiled kernels.

Write a file with :class:`Writer`, a dataset of many files with :class:`DatasetWriter` (or
:func:`write_shard` on workers and one :func:`commit`; :func:`gc_dataset` removes what old
versions left), read with :func:`open` (a :class:`Reader`); adapters live in ``rowstore.torch``
and ``rowstore.tf`` (importing ``rowstore`` imports neither framework); DataFrames go in and out
through ``rowstore.pandas`` (``rowstore.from_pandas``/``read_pandas``, imported on first use) and
``rowstore.dask``; Hugging Face datasets through ``rowstore.huggingface``
(``rowstore.from_huggingface``/``to_huggingface``); Petastorm's names are in ``rowstore.petastorm``.
"""

from rowstore._version import __version__
from rowstore.codecs import Codec, register_codec
from rowstore.errors import (
    AttrsError,
    ChecksumError,
    CodecError,
    CodecNotAvailableError,
    CommitConflictError,
    ConcurrentWriterError,
    FormatError,
    FormatVersionError,
    InputError,
    MissingObjectError,
    ObjectChangedError,
    OutsideRootError,
    RemoteError,
    RowstoreError,
    RowValidationError,
    SchemaError,
    StaleFileError,
    StateError,
    WriterClosedError,
)
from rowstore.format import FORMAT_VERSION, Layout
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = [
    "__version__",
    "FORMAT_VERSION",
    "Schema",
    "Field",
    "STR",
    "BYTES",
    "Codec",
    "register_codec",
    "Writer",
    "Layout",
    "open",
    "DatasetWriter",
    "ShardInfo",
    "write_shard",
    "commit",
    "gc_dataset",
    "restore_pointer",
    "RowstoreError",
    "SchemaError",
    "RowValidationError",
    "CodecError",
    "CodecNotAvailableError",
    "FormatError",
    "FormatVersionError",
    "ChecksumError",
    "WriterClosedError",
    "ConcurrentWriterError",
    "AttrsError",
    "StaleFileError",
    "MissingObjectError",
    "ObjectChangedError",
    "CommitConflictError",
    "RemoteError",
    "InputError",
    "OutsideRootError",
    "StateError",
    "mix",
]

#: Names imported on first use (their modules, or the optional packages they need, are heavy).
_LAZY = {
    "Reader": "rowstore.reader",
    "from_pandas": "rowstore.pandas",
    "read_pandas": "rowstore.pandas",
    "shuffle": "rowstore.global_shuffle",
    "order_quality": "rowstore.quality",
    "from_arrow": "rowstore.arrow",
    "from_parquet": "rowstore.arrow",
    "from_audio": "rowstore.audio",
    "from_huggingface": "rowstore.huggingface",
    "to_huggingface": "rowstore.huggingface",
    "from_images": "rowstore.images",
    "mix": "rowstore.reader.mix",
    "make_reader": "rowstore.reader.make_reader",
    "make_batch_reader": "rowstore.reader.make_reader",
    "TransformSpec": "rowstore.reader.transform",
    "Resize": "rowstore.reader.image_ops",
    "CenterCrop": "rowstore.reader.image_ops",
    "RandomResizedCrop": "rowstore.reader.image_ops",
    "Segment": "rowstore.reader.audio_ops",
    "RandomSegment": "rowstore.reader.audio_ops",
    "DatasetStats": "rowstore.format.stats",
    "FieldStats": "rowstore.format.stats",
}
# The write path loads on first use too: importing the format's declarations (or reading
# files) does not import the writer. A value "module:attribute" names another attribute.
_LAZY.update(
    dict.fromkeys(
        ["Writer", "DatasetWriter", "ShardInfo", "write_shard", "commit", "restore_pointer"],
        "rowstore.writer",
    ),
    gc_dataset="rowstore.writer:gc",
)
# Looking at a dataset: the report page and the notebook view of a batch (docs/inspect.md).
_LAZY.update(report="rowstore.inspect", show="rowstore.reader.view")
#: The extra and the optional packages a lazy module needs (``pip install rowstore[<extra>]``).
_NEEDS = {
    "rowstore.pandas": ("pandas", ("pandas", "pyarrow")),
    "rowstore.arrow": ("parquet", ("pyarrow",)),
    "rowstore.huggingface": ("huggingface", ("datasets", "pyarrow")),
}


def _installed(module):
    import importlib.util

    module = module.partition(":")[0]
    return all(importlib.util.find_spec(p) is not None for p in _NEEDS.get(module, ("", ()))[1])


# ``from rowstore import *`` imports every lazy name whose optional packages are installed (a
# name whose package is missing stays reachable as ``rowstore.<name>``, which says what to
# install); dir() lists them all.
__all__ += [name for name, module in _LAZY.items() if name not in __all__ and _installed(module)]


def __getattr__(name):
    """The names of ``_LAZY`` (the writer's names, :class:`~rowstore.reader.Reader`,
    ``from_pandas``/``read_pandas`` (pandas), ``shuffle``, ``order_quality``,
    ``from_arrow``/``from_parquet`` (pyarrow), ``from_huggingface``/``to_huggingface``
    (datasets), ``make_reader``/``make_batch_reader``, ``TransformSpec`` and the image ops
    ``Resize``/``CenterCrop``/``RandomResizedCrop``) import their modules on first use only."""
    if name in _LAZY:
        import importlib

        module, _, attr = _LAZY[name].partition(":")
        try:
            value = getattr(importlib.import_module(module), attr or name)
            globals()[name] = value  # later lookups are plain attribute reads
            return value
        except ModuleNotFoundError as exc:
            extra, packages = _NEEDS.get(module, ("", ()))
            if exc.name not in packages:
                raise
            msg = f"rowstore.{name} needs {exc.name}: pip install rowstore[{extra}]"
            raise ModuleNotFoundError(msg, name=exc.name) from exc
    raise AttributeError(f"module 'rowstore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def open(path, **kwargs):  # noqa: A001 - the natural name, like h5py.File / zarr.open
    """Open a dataset for reading: a path, or a URL (``s3://``, ``http(s)://``, ``gs://``,
    ``file://``... with ``storage_options=``, ``cache=``, ``remote=``); see
    :class:`rowstore.reader.Reader` for the options."""
    from rowstore.reader import Reader

    return Reader(path, **kwargs)
