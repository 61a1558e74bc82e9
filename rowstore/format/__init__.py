"""File format v1: the on-disk declaration (:mod:`.spec`), the writer, the index reader, and the
block compressions (:mod:`rowstore.codecs.blocks`; third parties register theirs with
:func:`register_block_compression`); datasets of many files: the manifest (:mod:`.manifest`) and
their writing (:mod:`.dataset_writer`)."""

from rowstore.codecs.blocks import (
    BlockCompression,
    block_compression,
    register_block_compression,
)
from rowstore.format.dataset_writer import (
    DatasetWriter,
    GCReport,
    PointerRepair,
    ShardInfo,
    commit,
    restore_pointer,
    write_shard,
)
from rowstore.format.dataset_writer import gc as gc_dataset
from rowstore.format.index import Layout
from rowstore.format.spec import FORMAT_VERSION
from rowstore.format.writer import Writer

__all__ = [
    "Layout", "Writer", "FORMAT_VERSION", "BlockCompression", "block_compression", "register_block_compression",
    "DatasetWriter", "ShardInfo", "GCReport", "write_shard", "commit", "gc_dataset",
    "restore_pointer", "PointerRepair",
]  # fmt: skip
