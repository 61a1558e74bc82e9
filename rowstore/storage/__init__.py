"""Bytes in and out of local files and object stores, behind two interfaces
(:mod:`.base`): a :class:`~.base.ChunkStore` that a reader's gather reads stored chunks from,
and a :class:`~.base.Destination` that writers put files and dataset versions into.

The functions here turn what a user passes (a path, a ``file://`` URL, any fsspec URL, and
``storage_options``) into those objects; they hold the package's only local-or-remote
decision, so no other layer looks at a URL's scheme.

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
from typing import Any

from rowstore.storage.base import ChunkStore, Destination, StagedFile, Staging
from rowstore.storage.local import LocalStore
from rowstore.storage.localdir import LocalDir
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
    "Destination",
    "chunk_store",
    "destination",
    "locate",
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
    "remote_client",
    "join",
]


def locate(
    path: Any,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache: Any = None,
    remote: Mapping[str, Any] | None = None,
) -> tuple[Any, RemoteOptions | None]:
    """Where a reader reads ``path`` (one path or URL, or a list): ``(path, None)`` for local
    files (``file://`` URLs among them when no option is given), ``(path, options)`` for URLs.

    Raises
    ------
    ValueError
        ``storage_options``, ``cache`` or ``remote`` given for local paths, local paths and
        URLs mixed, or a URL without its bucket or host (``s3://``): before any request.
    """
    if storage_options is None and cache is None and remote is None:
        path = (
            [file_url_path(p) for p in path]
            if isinstance(path, (list, tuple))
            else file_url_path(path)
        )
    many = path if isinstance(path, (list, tuple)) else [path]
    urls = [check_url(u) for u in many if is_url(u)]
    if not urls and storage_options is None and cache is None and remote is None:
        return path, None
    if len(urls) != len(many):
        shown = many[0] if len(many) == 1 else list(many)
        raise ValueError(
            "storage_options, cache and remote apply to URLs (s3://, http://, file://...); "
            f"got {shown}"
        )
    return path, RemoteOptions.make(storage_options, cache, remote)


def chunk_store(
    paths: Sequence[str],
    file_ids: Sequence[tuple],
    *,
    remote: RemoteOptions | None = None,
    etags: Mapping[int, str | None] | None = None,
    max_open: int | None = None,
) -> ChunkStore:
    """The store that reads these shards: a :class:`~.local.LocalStore` for local files,
    a :class:`~.remote.RemoteStore` when ``remote`` (from :func:`locate`) is given."""
    if remote is None:
        return LocalStore(paths, file_ids, max_open)
    from rowstore.storage.remote import RemoteStore

    return RemoteStore(paths, file_ids, remote, etags)


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
    path = os.fspath(path_or_url)
    if is_url(path):
        check_url(path)
    root = local_root(path) if storage_options is None else (None if is_url(path) else path)
    if root is not None:
        if storage_options is not None:
            raise ValueError(
                f"storage_options applies to URLs (s3://, gs://...); got the local path {path!r}"
            )
        return LocalDir(root, durable=durable)
    if path.startswith(("http://", "https://")):
        raise ValueError(
            f"{path!r}: HTTP is read-only; write to a local path or an object store "
            "(s3://, gs://...)"
        )
    from rowstore.storage.remote import RemoteDir

    return RemoteDir(path, storage_options)


def stage_file(
    path: str | os.PathLike, storage_options: Mapping[str, Any] | None = None
) -> StagedFile:
    """Where a writer makes the single file ``path``: the path itself for a local file, a
    temporary local file uploaded (one PUT) at :meth:`~.base.StagedFile.publish` for a URL."""
    p = os.fspath(path)
    if is_url(p):
        check_url(p)
    root = local_root(p) if storage_options is None else (None if is_url(p) else p)
    if root is not None:
        if storage_options is not None:
            raise ValueError(
                f"storage_options applies to URLs (s3://, gs://...); got the local path {p!r}"
            )
        return StagedFile(root)
    parent, _, name = p.rstrip("/").rpartition("/")
    dest = destination(parent, storage_options)
    staging = dest.staging()
    return StagedFile(os.path.join(staging.root, "upload.h5"), dest=dest, rel=name, staging=staging)


def remote_client(path: str, options: RemoteOptions | None) -> Client | None:
    """The client that reads objects under ``path`` (None for local files: ``options`` from
    :func:`locate` is None)."""
    return None if options is None else Client(path, options)


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
