"""URLs of object storage (``s3://``, ``gs://``, ``http(s)://``, ``file://``, any fsspec
protocol) and local paths: the one place that tells a URL from a local path. Only the storage
layer asks (:func:`rowstore.storage.locate`, :func:`rowstore.storage.destination`); every
other layer holds what those return."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = [
    "is_url",
    "check_url",
    "join",
    "local_root",
    "file_url_path",
    "local_path",
    "looks_like_file",
]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")

#: Protocols whose URLs start with a bucket, container or host (``s3://bucket/key``): one
#: without it is refused before any client is made (boto refused it only after its retries).
NEEDS_BUCKET = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "http", "https"}
)


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def check_url(url: str) -> str:
    """``url`` as it is, or :class:`ValueError` when a protocol of :data:`NEEDS_BUCKET` has no
    bucket or host after its ``://`` (``s3://``, ``s3:///key``, ``https://``)."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() in NEEDS_BUCKET and not rest.split("/", 1)[0]:
        what = "host" if scheme.lower() in ("http", "https") else "bucket"
        raise ValueError(
            f"{url!r} names no {what}: {scheme}:// URLs start with one ({scheme}://{what}/path)"
        )
    return url


def local_root(path: str) -> str | None:
    """The local directory that ``path`` names: a path itself, a ``file://`` or ``local://``
    URL's path (fsspec reads those from the local filesystem, links and all); None for any
    other URL."""
    if not is_url(path):
        return path
    for scheme in ("file://", "local://"):
        if path.startswith(scheme):
            return path[len(scheme) :] or "/"
    return None


def join(root: str, rel: str) -> str:
    """``rel`` (a plain relative path, ``/``-separated) under the URL ``root``."""
    return root.rstrip("/") + "/" + rel


def file_url_path(url: Any) -> Any:
    """``file:///abs/path`` as ``/abs/path``; anything else as is (paths, other URLs)."""
    if isinstance(url, (str, bytes, os.PathLike)):
        s = os.fspath(url)
        s = os.fsdecode(s) if isinstance(s, bytes) else s
        if s.startswith("file://"):
            return local_path(s)
    return url


def local_path(url: Any) -> Any:
    """A local path for ``url``: a path as is (``str``, ``bytes``, ``os.PathLike``),
    ``file:///abs/path`` as ``/abs/path``; other URL schemes raise ``ValueError`` (only local
    files are read here)."""
    if not isinstance(url, (str, bytes, os.PathLike)):
        return url
    s = os.fspath(url)
    s = os.fsdecode(s) if isinstance(s, bytes) else s
    if s.startswith("file://"):
        rest = s[len("file://") :]
        if rest and not rest.startswith("/"):
            raise ValueError(f"{s!r}: a file:// URL must name an absolute path (file:///data/x)")
        return rest or "/"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", s):
        raise ValueError(f"{s!r}: only local paths and file:// URLs are supported here")
    return url


def looks_like_file(url: str) -> bool:
    """Whether ``url`` names a single HDF5 file (by its suffix) rather than a dataset."""
    return url.lower().rstrip("/").endswith((".h5", ".hdf5", ".hdf"))
