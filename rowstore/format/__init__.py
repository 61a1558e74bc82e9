"""File format v1: the on-disk declaration (:mod:`.spec`), the writer and the index reader."""

from rowstore.format.index import Layout
from rowstore.format.spec import FORMAT_VERSION
from rowstore.format.writer import Writer

__all__ = ["Layout", "Writer", "FORMAT_VERSION"]
