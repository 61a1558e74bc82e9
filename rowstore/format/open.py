"""Opening files and datasets, local or remote: one opener for paths and URLs.

* a local **file or dataset directory** is opened by :meth:`DatasetLayout.open` (libhdf5 reads
  a v1 file's metadata once; a v2 file's footer is parsed alone);
* a remote **dataset** is opened from its pointer, manifest and block-index sidecar: three
  requests;
* a remote **single file** by reading the few byte ranges holding its HDF5 metadata into
  memory and parsing them with h5py on that in-memory image
  (:class:`~rowstore.storage.objstore.RangeFile`: two requests for the files our writer
  makes), or its v2 footer alone.

Where a path leads (local or which object store) is the storage layer's decision
(:func:`rowstore.storage.locate`); this module only reads what it is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rowstore import storage
from rowstore.errors import MissingObjectError
from rowstore.format import manifest as _manifest
from rowstore.format.index import remote_file_layout
from rowstore.format.shards import DatasetLayout
from rowstore.storage import join, looks_like_file
from rowstore.storage.local import pin_identities
from rowstore.storage.objstore import Client, RemoteOptions

__all__ = ["Opened", "open_layout", "open_remote", "open_file", "remote_file_layout"]


@dataclasses.dataclass(frozen=True)
class Opened:
    """What :func:`open_layout` found.

    Attributes
    ----------
    layout : DatasetLayout
    remote : RemoteOptions or None
        How the shards are read (None: local files), for :func:`rowstore.storage.chunk_store`.
    etags : dict
        ETags learnt at open (shard -> etag): a single remote file's, so every later read is
        conditional on it.
    client : Client or None
        The client that read the objects (None for local files).
    """

    layout: DatasetLayout
    remote: RemoteOptions | None = None
    etags: dict = dataclasses.field(default_factory=dict)
    client: Client | None = None


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
    where, options = storage.locate(
        path, storage_options=storage_options, cache=cache, remote=remote
    )
    if options is None:
        layout = DatasetLayout.open(
            where,
            version=version,
            allow_outside_links=allow_outside_links,
            allow_missing_footer=allow_missing_footer,
        )
        if pin:
            layout = dataclasses.replace(
                layout, shard_ids=pin_identities(layout.shard_paths, layout.shard_ids)
            )
        return Opened(layout)
    urls = list(where) if isinstance(where, (list, tuple)) else [where]
    parts = [
        open_remote(
            u,
            options,
            version,
            allow_outside_links=allow_outside_links,
            allow_missing_footer=allow_missing_footer,
        )
        for u in urls
    ]
    etags, shard0 = {}, 0
    for layout, learnt in parts:
        etags.update({shard0 + k: v for k, v in learnt["etags"].items()})
        shard0 += layout.num_shards
    return Opened(
        DatasetLayout.concat([p[0] for p in parts]), options, etags, Client(urls[0], options)
    )


def open_remote(
    url: str,
    options: RemoteOptions,
    version: int | None = None,
    *,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> tuple[DatasetLayout, dict]:
    """The layout of the dataset or single file at ``url``, and what was learnt about its
    objects (``{"etags": {shard: etag}, "requests": n}``); ``allow_outside_links``: as for
    :meth:`DatasetLayout.from_manifest` (a ``file://`` dataset's links)."""
    client = Client(url, options)
    if not looks_like_file(url):
        url = url.rstrip("/")
        try:
            m = _manifest.load(url, version, read=client.cat_small)
        except MissingObjectError as exc:
            if version is not None or exc.path != join(url, _manifest.POINTER):
                raise
        else:
            layout = DatasetLayout.from_manifest(m, allow_outside_links=allow_outside_links)
            return layout, {"etags": {}, "requests": client.requests}
    if version is not None:
        raise ValueError(f"{url!r} is a file: version= applies to datasets")
    cache = None
    if options.cache:
        from rowstore.storage.cache import BlockCache

        cache = BlockCache(options.cache, options.cache_bytes)
    layout = remote_file_layout(client, url, cache, allow_missing_footer=allow_missing_footer)
    etag = layout.file_id[1] if len(layout.file_id) > 1 else None
    return DatasetLayout.from_files([layout], path=url), {
        "etags": {0: etag},
        "requests": client.requests,
    }


def open_file(path: str, storage_options: Mapping[str, Any] | None = None) -> Any:
    """The :class:`~rowstore.format.index.Layout` of the single file at ``path`` (a path or a
    URL); a missing one is a :class:`~rowstore.errors.MissingObjectError`."""
    from rowstore.format.index import Layout

    where, options = storage.locate(path, storage_options=storage_options)
    if options is None:
        try:
            return Layout.open(where)
        except FileNotFoundError:
            raise MissingObjectError(f"{where!r} is missing", path=where) from None
    return remote_file_layout(Client(where, options), where)
