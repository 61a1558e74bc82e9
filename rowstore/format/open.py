"""Opening files and datasets, local or remote: one opener for paths and URLs.

:func:`open_layout` takes what :func:`rowstore.open` takes; where a path leads (local files or
which object store) is the storage layer's decision (:func:`rowstore.storage.locate`: a
:class:`~rowstore.storage.location.Location`), and :meth:`DatasetLayout.open` reads through
what it is given:

* a **dataset** from its pointer, manifest and block-index sidecar (three small reads);
* a **single file** from its v2 footer alone, or by parsing its HDF5 metadata with h5py (at a
  URL from an in-memory image of the few byte ranges holding it,
  :class:`~rowstore.storage.objstore.RangeFile`: two requests for the files our writer makes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rowstore import storage
from rowstore.errors import MissingObjectError
from rowstore.format.index import Layout
from rowstore.format.shards import DatasetLayout

__all__ = ["Opened", "open_layout", "open_file"]


@dataclasses.dataclass(frozen=True)
class Opened:
    """What :func:`open_layout` found.

    Attributes
    ----------
    layout : DatasetLayout
        Its :attr:`~DatasetLayout.location` reads the shards
        (:meth:`~rowstore.storage.location.Location.chunk_store`).
    """

    layout: DatasetLayout

    @property
    def location(self) -> Any:
        """Where the dataset was opened (:class:`~rowstore.storage.location.Location`)."""
        return self.layout.shard_location()


def open_layout(
    path: Any,
    *,
    version: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cache: Any = None,
    remote: Mapping[str, Any] | None = None,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
    pin: bool = True,
) -> Opened:
    """The layout of the file or dataset at ``path`` (a path, ``file://`` or any fsspec URL,
    or a list of those read as one), as :func:`rowstore.open` takes it. ``pin``: each local
    shard that a manifest names by size is pinned to the file there now (inode, mtime), so
    that a shard replaced later under the same name and size is refused, not read."""
    where = storage.locate(path, storage_options, cache=cache, remote=remote)
    layout = DatasetLayout.open(
        where,  # a list of locations is read as one
        version=version,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
    )
    if pin:
        at = layout.shard_location()
        layout = dataclasses.replace(layout, shard_ids=at.pin(layout.shard_paths, layout.shard_ids))
    return Opened(layout)


def open_file(path: Any, storage_options: Mapping[str, Any] | None = None) -> Layout:
    """The :class:`~rowstore.format.index.Layout` of the single file at ``path`` (a path, a URL
    or a :class:`~rowstore.storage.location.Location`); a missing one is a
    :class:`~rowstore.errors.MissingObjectError`."""
    try:
        return Layout.open(path, storage_options=storage_options)
    except MissingObjectError:
        raise
    except FileNotFoundError:
        where = getattr(path, "path", path)
        raise MissingObjectError(f"{where!r} is missing", path=where) from None
