"""Bytes in and out of local files and object stores.

:func:`locate` turns what a user passes (a path, a ``file://`` URL, any fsspec URL, and
``storage_options``) into a :class:`~.location.Location`, the one object the format layer
reads through (small objects, files opened for ranged reads) and that gives the
:class:`~.base.ChunkStore` a reader's gather reads stored chunks from and the
:class:`~.base.Destination` writers put files and dataset versions into (:mod:`.base`). This
module holds the package's only local-or-remote decision, so no other layer looks at a URL's
scheme.

* :mod:`.location`: :class:`~.location.LocalLocation`, :class:`~.location.RemoteLocation`;
* :mod:`.local`: reading local shard files (:class:`~.local.LocalStore`, the process's
  descriptor budget, file identity);
* :mod:`.localdir`: a local directory as a destination (:class:`~.localdir.LocalDir`, the
  commit lock);
* :mod:`.atomic`: files replaced atomically (:class:`~.atomic.AtomicFile`), ``fsync``, stale
  temporary files;
* :mod:`.objstore`: the fsspec client with retried ranged GETs and conditional PUTs;
* :mod:`.remote`: :class:`~.remote.RemoteStore` (scheduled ranged reads) and
  :class:`~.remote.RemoteDir`;
* :mod:`.cache`: the local disk cache of remote chunks;
* :mod:`.url`: telling a URL from a path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, overload

from rowstore.storage.base import ChunkStore, Destination, DirectReads, StagedFile, Staging
from rowstore.storage.location import LocalLocation, Location, RemoteLocation
from rowstore.storage.objstore import Client, RemoteOptions
from rowstore.storage.url import (
    check_url,
    file_url_path,
    is_url,
    join,
    local_path,
    local_root,
    looks_like_file,
)

__all__ = [
    "ChunkStore",
    "DirectReads",
    "Destination",
    "Location",
    "destination",
    "locate",
    "location_of",
    "absolute",
    "under",
    "under_all",
    "Staging",
    "StagedFile",
    "stage_file",
    "RemoteOptions",
    "Client",
    "local_root",
    "local_only",
    "local_path",
    "looks_like_file",
    "join",
]


@overload
def locate(
    path_or_url: list | tuple,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache: Any = None,
    remote: Mapping[str, Any] | None = None,
) -> list[Location]: ...


@overload
def locate(
    path_or_url: str | os.PathLike,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache: Any = None,
    remote: Mapping[str, Any] | None = None,
) -> Location: ...


def locate(
    path_or_url: Any,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache: Any = None,
    remote: Mapping[str, Any] | None = None,
) -> Location | list[Location]:
    """The :class:`~.location.Location` of ``path_or_url`` (a path, a ``file://`` or any
    fsspec URL), or one per item of a list, read as one dataset: local files for paths (and
    for ``file://`` URLs when no option is given), an object store for URLs, with
    ``storage_options`` (fsspec's), ``cache`` (a local directory of fetched chunks) and
    ``remote`` (:class:`~.objstore.RemoteOptions`' retry and bound settings).

    Raises
    ------
    ValueError
        an option that would go unused (given for local paths: "'storage_options' was
        provided but unused"), local paths and URLs mixed, or a URL without its bucket or
        host (``s3://``): before any request.
    """
    given = [
        n
        for n, v in (("storage_options", storage_options), ("cache", cache), ("remote", remote))
        if v is not None
    ]
    many = isinstance(path_or_url, (list, tuple))
    items = list(path_or_url) if many else [path_or_url]
    if not given:
        items = [file_url_path(p) for p in items]
    urls = [check_url(u) for u in items if is_url(u)]
    if not urls and not given:
        locs: list[Location] = [LocalLocation(os.fsdecode(p)) for p in items]
    elif len(urls) != len(items):
        shown = items[0] if len(items) == 1 else items
        unused = " and ".join(repr(n) for n in given) or "a URL"
        raise ValueError(
            f"{unused} was provided but unused: storage_options, cache and remote apply to URLs "
            f"(s3://, http://, file://...); got {shown}"
            if given
            else f"local paths and URLs cannot be read as one; got {shown}"
        )
    else:
        options = RemoteOptions.make(storage_options, cache, remote)
        locs = [RemoteLocation(u, options) for u in urls]
    return locs if many else locs[0]


def destination(
    path_or_url: str | os.PathLike,
    storage_options: Mapping[str, Any] | None = None,
    *,
    durable: bool = True,
) -> Destination:
    """Where a writer writes: a :class:`~.localdir.LocalDir` for a local path or a ``file://``
    URL (flock, fsync, atomic rename), a :class:`~.remote.RemoteDir` for an object store URL.

    Raises
    ------
    ValueError
        ``storage_options`` given for a local path, a read-only protocol (``http(s)://``), or
        a URL without its bucket (``s3://``): before any request.
    """
    return _written(path_or_url, storage_options).destination(durable=durable)


def _written(path_or_url: str | os.PathLike, storage_options: Mapping[str, Any] | None) -> Location:
    """The location a writer writes ``path_or_url`` at: local for a path or a ``file://`` URL
    without options (given options for a local path are refused), else an object store's."""
    path = os.fspath(path_or_url)
    if is_url(path):
        check_url(path)
    root = local_root(path) if storage_options is None else (None if is_url(path) else path)
    if root is None:
        return RemoteLocation(path, RemoteOptions.make(storage_options, None, None))
    if storage_options is not None:
        raise ValueError(
            f"storage_options applies to URLs (s3://, gs://...); got the local path {path!r}"
        )
    return LocalLocation(root)


def location_of(dest: Destination) -> Location:
    """The :class:`~.location.Location` that reads what ``dest`` holds (its pointer, manifests
    and sidecars), with the same options."""
    if dest.local_root is not None:
        return LocalLocation(dest.local_root)
    client = dest.client  # type: ignore[attr-defined]  # a RemoteDir's
    return RemoteLocation(dest.root, client.options, client)


def stage_file(
    path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None
) -> StagedFile:
    """Where a writer makes the single file ``path``: the path itself for a local file, a
    temporary local file uploaded (one PUT) at :meth:`~.base.StagedFile.publish` for a URL."""
    where = _written(path, storage_options)
    if where.local:
        return StagedFile(where.path)
    parent, _, name = where.path.rstrip("/").rpartition("/")
    dest = where.at(parent).destination()
    staging = dest.staging()
    return StagedFile(os.path.join(staging.root, "upload.h5"), dest=dest, rel=name, staging=staging)


def absolute(path: str) -> str:
    """``path`` made absolute: a local path by the working directory, a URL as it is."""
    return path if is_url(path) else os.path.abspath(path)


def under(root: str, rel: str) -> str:
    """``rel`` (``/``-separated, already checked to stay inside) under ``root``, a URL or an
    absolute local directory."""
    return join(root, rel) if is_url(root) else os.path.join(root, *rel.split("/"))


def under_all(root: str, rels: Sequence[str]) -> list[str]:
    """:func:`under` for many plain relative paths (checked: no ``..``, no empty part) at once."""
    base = root.rstrip("/") + "/" if is_url(root) else os.path.join(root, "")
    return [base + rel for rel in rels]


def local_only(path: str | os.PathLike, what: str, *, file_urls: bool = True) -> str:
    """The local path ``path`` names (a ``file://`` URL's path, unless not ``file_urls``),
    for operations on local files only (``what`` names the operation); :class:`ValueError`
    for another URL."""
    p = os.fspath(path)
    root = local_root(p) if file_urls else (None if is_url(p) else p)
    if root is None:
        raise ValueError(f"{what} works on local files only; {p!r} is a URL")
    return root
