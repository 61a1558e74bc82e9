"""File format v1: the on-disk declaration (:mod:`.spec`), the index reader (:mod:`.index`),
opening files and datasets (:mod:`.open`), and the block compressions
(:mod:`rowstore.codecs.blocks`;
third parties register theirs with :func:`register_block_compression`); datasets of many
files: the manifest (:mod:`.manifest`) and their layout (:mod:`.shards`).

The writer's names (:class:`Writer`, :class:`DatasetWriter`, :func:`commit`...) live in
:mod:`rowstore.writer`; they are reachable here too, loaded on first use, so that importing
the declarations does not load the write path.
"""

from typing import Any

from rowstore.codecs.blocks import (
    BlockCompression,
    block_compression,
    register_block_compression,
)
from rowstore.format.index import Layout
from rowstore.format.spec import FORMAT_VERSION

#: Writer names served lazily: name -> (module, attribute).
_WRITER = {
    "Writer": ("rowstore.writer.file", "Writer"),
    "DatasetWriter": ("rowstore.writer.dataset", "DatasetWriter"),
    "ShardInfo": ("rowstore.writer.commit", "ShardInfo"),
    "write_shard": ("rowstore.writer.dataset", "write_shard"),
    "commit": ("rowstore.writer.commit", "commit"),
    "gc_dataset": ("rowstore.writer.gc", "gc"),
    "GCReport": ("rowstore.writer.gc", "GCReport"),
    "restore_pointer": ("rowstore.writer.gc", "restore_pointer"),
    "PointerRepair": ("rowstore.writer.gc", "PointerRepair"),
}

__all__ = [
    "Layout",
    "Writer",
    "FORMAT_VERSION",
    "BlockCompression",
    "block_compression",
    "register_block_compression",
    "DatasetWriter",
    "ShardInfo",
    "GCReport",
    "write_shard",
    "commit",
    "gc_dataset",
    "restore_pointer",
    "PointerRepair",
]


def __getattr__(name: str) -> Any:
    if name in _WRITER:
        import importlib

        module, attr = _WRITER[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rowstore.format' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
