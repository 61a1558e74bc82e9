"""Writing to object storage: files and shards are written locally (a temporary directory) and
uploaded when complete; a commit uploads the new version's sidecar, then its manifest, then the
pointer (each one PUT, which object stores make atomic), so a failed job leaves the previous
version current and readable.

What :func:`~rowstore.format.dataset_writer.write_shard`, :func:`~rowstore.format.dataset_writer.commit`,
:class:`~rowstore.format.dataset_writer.DatasetWriter` and :class:`~rowstore.format.writer.Writer`
do when given a URL. Object stores have no lock: commits of one remote dataset must not run at
the same time (one committing process; shards may come from any number of writers).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from rowstore.errors import FormatError, SchemaError
from rowstore.format import manifest
from rowstore.format._objstore import Client, RemoteOptions, remote_file_layout
from rowstore.format._url import join
from rowstore.format.index import Layout

__all__ = ["client", "upload", "remote_layout", "commit_remote", "download_manifests", "local_temp"]


def client(url: str, storage_options: Mapping[str, Any] | None) -> Client:
    return Client(url, RemoteOptions.make(storage_options, None, None))


def local_temp() -> str:
    """A temporary directory for files on their way to object storage."""
    return tempfile.mkdtemp(prefix="rowstore-upload-")


def upload(c: Client, local: str, url: str) -> None:
    """Upload the file ``local`` to ``url`` (one PUT, or a multipart upload that appears whole),
    retried as reads are."""
    c._retrying(url, None, None, lambda: c.fs.put_file(local, c.path(url)))


def put_bytes(c: Client, data: bytes, url: str) -> None:
    c._retrying(url, None, None, lambda: c.fs.pipe_file(c.path(url), data))


def remote_layout(c: Client, url: str) -> Layout:
    """The :class:`Layout` of a remote file, from its HDF5 metadata's byte ranges (no block read)."""
    return remote_file_layout(c, url)


def _exists(c: Client, url: str) -> bool:
    try:
        c.info(url)
        return True
    except FormatError:
        return False


def download_manifests(c: Client, url: str, root: str) -> bool:
    """Copy the remote dataset's pointer and current manifest and sidecar into the local
    directory ``root`` (to append to it); False if there is no dataset at ``url``."""
    try:
        m = manifest.load(url, read=c.cat_small)
    except FormatError as exc:
        if "is missing" in str(exc) and manifest.POINTER in str(exc):
            return False
        raise
    os.makedirs(os.path.join(root, manifest.MANIFEST_DIR), exist_ok=True)
    for rel in (manifest.POINTER, manifest.manifest_path(m.version), manifest.index_path(m.version)):
        data = c.cat_small(join(url, rel), manifest.MAX_MANIFEST_BYTES)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return True


def commit_remote(url: str, infos: Sequence[Any], *, mode: str, attrs: Mapping[str, Any] | None,
                  storage_options: Mapping[str, Any] | None, layouts: Sequence[Layout] | None = None) -> int:
    """Publish the next version of the remote dataset at ``url`` naming these shards (already
    uploaded under ``url``; checked against their infos unless their local ``layouts`` are
    given); see :func:`~rowstore.format.dataset_writer.commit`."""
    from rowstore.format.dataset_writer import ShardInfo, _check_attrs, next_version

    c = client(url, storage_options)
    url = url.rstrip("/")
    if mode not in ("w", "x", "a"):
        raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
    infos = list(infos)
    if attrs is not None:
        attrs = _check_attrs(attrs)
    if len({i.path for i in infos}) != len(infos):
        raise ValueError("a shard is given twice")
    exists = _exists(c, join(url, manifest.POINTER))
    if mode == "x" and exists:
        raise FileExistsError(f"{url!r} already holds a dataset (mode='x')")
    base = manifest.load(url, read=c.cat_small) if mode == "a" and exists else None
    parent = manifest.read_pointer(url, read=c.cat_small)[0] if exists else None
    if layouts is None:
        layouts = []
        for info in infos:
            if not isinstance(info, ShardInfo):
                raise TypeError(f"commit takes ShardInfo objects (from write_shard), got {type(info).__name__}")
            manifest._safe_relpath("commit", info.path)
            shard_url = join(url, info.path)
            try:
                layout = remote_layout(c, shard_url)
            except FormatError as exc:
                if "is missing" in str(exc):
                    raise FormatError(f"shard {info.path!r} is missing: no object at {shard_url!r} (was it written to "
                                      f"another dataset, or removed?)", path=info.path) from None
                raise
            got = ShardInfo.from_layout(info.path, layout)
            for k in manifest.SHARD_KEYS[1:]:
                if getattr(got, k) != getattr(info, k):
                    raise FormatError(f"shard {info.path!r}: {k} of the object is {getattr(got, k)}, expected "
                                      f"{getattr(info, k)} (the object is not the one written)", path=info.path)
            if got.schema != info.schema:
                raise SchemaError(f"shard {info.path!r}: the object's schema differs from its ShardInfo's")
            layouts.append(layout)
    ref, entries, blocks, heap_chunks, attrs = next_version(url, base, infos, layouts, attrs)
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in c.fs.ls(c.path(join(url, manifest.MANIFEST_DIR)), detail=False)]
    except FileNotFoundError:
        names = []
    version = manifest.next_version(names)
    sidecar, text, pointer = manifest.version_objects(version, schema=ref[1], attrs=attrs, compression=ref[2],
                                                      heap_chunk_bytes=ref[3], shards=entries, blocks=blocks,
                                                      heap_chunks=heap_chunks, parent=parent)  # fmt: skip
    put_bytes(c, sidecar, join(url, manifest.index_path(version)))
    put_bytes(c, text, join(url, manifest.manifest_path(version)))
    put_bytes(c, pointer, join(url, manifest.POINTER))  # last: the new version appears whole
    return version


def remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
