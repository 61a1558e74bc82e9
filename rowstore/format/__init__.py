"""File format v1: the on-disk declaration (:mod:`.spec`), the index reader (:mod:`.index`),
opening files and datasets (:mod:`.open`), and the block compressions
(:mod:`rowstore.codecs.blocks`;
third parties register theirs with :func:`register_block_compression`); datasets of many
files: the manifest (:mod:`.manifest`) and their layout (:mod:`.shards`).

The writer's names (:class:`Writer`, :class:`DatasetWriter`, :func:`commit`...) live in
:mod:`rowstore.writer`, the layer above: importing the declarations does not load the write
path.
"""

from rowstore.codecs.blocks import (
    BlockCompression,
    block_compression,
    register_block_compression,
)
from rowstore.format.index import Layout
from rowstore.format.spec import FORMAT_VERSION

__all__ = [
    "Layout",
    "FORMAT_VERSION",
    "BlockCompression",
    "block_compression",
    "register_block_compression",
]
