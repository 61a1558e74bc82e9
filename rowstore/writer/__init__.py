"""Making files and dataset versions: the single-file :class:`Writer` (:mod:`.file`), the
values it accepts (:mod:`.values`), dataset shards and :class:`DatasetWriter`
(:mod:`.dataset`), publishing a version (:mod:`.commit`) and garbage collection (:mod:`.gc`)."""

from rowstore.writer.commit import ShardInfo, commit
from rowstore.writer.dataset import DatasetWriter, discard, write_shard
from rowstore.writer.file import Writer
from rowstore.writer.gc import GCReport, PointerRepair, gc, restore_pointer

__all__ = [
    "Writer",
    "DatasetWriter",
    "ShardInfo",
    "write_shard",
    "discard",
    "commit",
    "gc",
    "GCReport",
    "restore_pointer",
    "PointerRepair",
]
