"""URLs of object storage (``s3://``, ``gs://``, ``http(s)://``, ``file://``, any fsspec protocol),
as the format layer names shards and manifests: one place that tells a URL from a local path."""

from __future__ import annotations

import re

__all__ = ["is_url", "join", "local_root"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def local_root(path: str) -> str | None:
    """The local directory that ``path`` names: a path itself, a ``file://`` or ``local://``
    URL's path (fsspec reads those from the local filesystem, links and all); None for any
    other URL."""
    if not is_url(path):
        return path
    for scheme in ("file://", "local://"):
        if path.startswith(scheme):
            return path[len(scheme):] or "/"
    return None


def join(root: str, rel: str) -> str:
    """``rel`` (a plain relative path, ``/``-separated) under the URL ``root``."""
    return root.rstrip("/") + "/" + rel
