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
from rowstore.errors import FormatError, MissingObjectError, RemoteError
from rowstore.format import manifest as _manifest
from rowstore.format.shards import DatasetLayout
from rowstore.storage import join, looks_like_file
from rowstore.storage.local import pin_identities
from rowstore.storage.objstore import Client, RangeFile, RemoteOptions

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


#: Prefix of a cached v2 footer (a metadata image of a v1 file starts with a page number).
_FOOTER_IMAGE = b"RSFOOTER-IMAGE\0\0"


def remote_file_layout(
    client: Client, url: str, cache: Any = None, *, allow_missing_footer: bool = False
) -> Any:
    """A remote file's :class:`~rowstore.format.index.Layout` (its ``file_id`` is ``(size,
    etag)``). A HEAD, then one ranged GET of the file's last MiB: a v2 file's footer is there
    (a footer larger than that, of a file of more than about 18,000 blocks, takes one more GET)
    and the layout is built from it alone. A v1 file is parsed by h5py from an in-memory image of
    the byte ranges its HDF5 metadata occupies
    (:class:`~rowstore.storage.objstore.RangeFile`: that tail and, for our
    writer's files, one more GET of the head); no block is read and libhdf5 never sees the
    network. With a ``cache`` (:class:`rowstore.storage.cache.BlockCache`), the footer or the
    image is kept and a later open of the same object (same size and ETag) makes the HEAD only.
    ``allow_missing_footer`` as for :meth:`~rowstore.format.index.Layout.open`."""
    import h5py

    from rowstore.format import footer
    from rowstore.format.index import Layout

    meta = client.info(url)
    size, etag = meta["size"], meta["etag"]
    ident = (size, etag)
    image = cache.get_meta(url, ident) if cache is not None and etag else None
    first = None
    if image is not None and image.startswith(_FOOTER_IMAGE):
        first, image = image[len(_FOOTER_IMAGE) :], None
    if first is None and image is None:
        t0 = max(0, size - RangeFile.TAIL) // RangeFile.PAGE * RangeFile.PAGE
        first = client.get(url, t0, size, etag) if size else b""
    if first is not None:
        ft = footer.read(lambda a, b: client.get(url, a, b, etag), size, url, first=first)
        if ft is not None:
            layout = Layout.from_footer(ft, url, size, ident)
            if cache is not None and etag and image is None:
                cache.put_meta(url, ident, _FOOTER_IMAGE + ft.raw)
            return layout
    rf = RangeFile(client, url, size, etag, image=image, tail_data=first)
    try:
        footer.check_no_footer(rf.read_range, size, url)
        with h5py.File(rf, "r") as f:
            layout = Layout.from_h5(f, url, size, ident, allow_missing_footer=allow_missing_footer)
        if cache is not None and etag and rf.requests:
            cache.put_meta(url, ident, rf.image())
        return layout
    except OSError as exc:
        if isinstance(exc, (RemoteError, FormatError)):
            raise
        raise FormatError(
            f"{url!r} is not an HDF5 file, or it is truncated or corrupt: {exc}", path=url
        ) from exc
    finally:
        rf.close()


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
