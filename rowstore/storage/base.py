"""The storage interfaces: where a reader's stored bytes come from (:class:`ChunkStore`, and
:class:`DirectReads` where single rows are cheap) and where a writer's files and dataset
versions go (:class:`Destination`).

Storage deals in bytes and relative names; it knows nothing of layouts, manifests or schemas.
Implementations: :class:`~rowstore.storage.local.LocalStore` and
:class:`~rowstore.storage.remote.RemoteStore` (chunk stores),
:class:`~rowstore.storage.localdir.LocalDir` and :class:`~rowstore.storage.remote.RemoteDir`
(destinations). A :class:`~rowstore.storage.location.Location` (from
:func:`rowstore.storage.locate`) picks one for a path or URL. How a store batches, coalesces
or schedules its reads (merge sizes, requests in flight, epoch-order prefetch) is its own
concern, not part of the interface.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ChunkStore", "DirectReads", "Destination", "Staging", "StagedFile"]


@runtime_checkable
class ChunkStore(Protocol):
    """The stored bytes of a dataset's shards, as the block index names them: whole chunks,
    checked and decompressed.

    Attributes
    ----------
    path : str
        What the store reads (a shard's path or URL, or a count of shards), for messages.
    direct : bool
        Capability flag: True exactly when the store is also a :class:`DirectReads` (single
        rows, payloads and ranges read cheaply, in place); when False the gather reads whole
        chunks only.
    max_open : int
        How many shard files the store keeps open at most.

    A missing shard is a :class:`~rowstore.errors.MissingObjectError`; a changed one a
    :class:`~rowstore.errors.StaleFileError` (local) or
    :class:`~rowstore.errors.ObjectChangedError` (remote). Stores are thread-safe, survive
    ``fork`` and pickle by their paths and options.
    """

    @property
    def path(self) -> str: ...

    @property
    def direct(self) -> bool: ...

    @property
    def max_open(self) -> int: ...

    def fetch_ahead(
        self,
        segments: Iterable[Any],
        plan_segments: Callable[[], Iterable[Any]],
        keys_of: Callable[[Any], list[tuple[int, int, int]]],
    ) -> Iterable[Any]:
        """An epoch's ``segments`` (each giving chunk keys ``(shard, offset, stored)`` by
        ``keys_of``), with the chunks fetched ahead in that order where the store gains by it;
        ``plan_segments`` makes the same segments again, for the store's own iteration."""

    @property
    def load_chunks(self) -> Callable[..., None]:
        """``load_chunks(shards, offsets, stored, checksums, *, codec, verify, dst, raw_size,
        scratch, what, dst_stride=0)``: whole stored chunks (chunk i of shard ``shards[i]``;
        None: all of shard 0), checked (CRC-32 with ``verify``, frame headers against
        ``codec``) and decompressed into ``dst`` (chunk i at ``i * dst_stride`` when given,
        else packed); the signature of :func:`rowstore.kernels.load_chunks` with shards for its
        descriptors."""

    def close(self) -> None:
        """Release this process's descriptors or connections (they come back on next use)."""


@runtime_checkable
class DirectReads(Protocol):
    """Reads in place, for stores where a single row or payload costs a few microseconds (local
    files: ``pread`` from the page cache). Only stores that are cheap this way implement it; the
    gather asks once (``isinstance(store, DirectReads)``, or :attr:`ChunkStore.direct`) and
    otherwise cuts everything from whole chunks. The signatures are those of the kernels the
    methods call (:mod:`rowstore.kernels`); in each, item i belongs to shard ``shards[i]``
    (None: all to shard 0).

    Methods
    -------
    read_rows(shards, file_offsets, row_size, dst)
        Single rows into ``dst``.
    read_rows_into(shards, file_offsets, row_size, segments, sink, *, check=None, expect=None)
        Single rows cut straight into per-field arrays, those ``check`` marks CRC-checked
        against ``expect`` as they are read.
    check_pages(shards, offsets, sizes, page_bytes, expect, scratch)
        Runs of pages read and CRC-checked page by page (kernels.check_ranges).
    memcpyed_starts(shards, offsets, stored, *, codec, raw_size, what)
        Where each stored frame's memcpy'd raw bytes lie in its file (-1: compressed), the
        headers checked (kernels.memcpyed_starts).
    read_pages(shards, chunk_offsets, chunk_bytes, within, take, page_first, pages, out,
    dst_offsets)
        Ranges of uncompressed chunks into ``out``, checked by their pages in the read's pass
        (kernels.pread_pages).
    read_payloads(shards, rowbuf, row_size, ref_offsets, rows, lo, hi, chunk_offsets,
    chunk_base, chunk_bytes, outs, dst_offsets, *, pages=None)
        Rows' heap payloads of one or more fields (references at ``ref_offsets``) into
        ``outs`` at ``dst_offsets``, in one call (kernels.pread_heap).
    """

    read_rows: Callable[..., None]
    read_rows_into: Callable[..., None]
    check_pages: Callable[..., None]
    memcpyed_starts: Callable[..., np.ndarray]
    read_pages: Callable[..., None]
    read_payloads: Callable[..., None]


@runtime_checkable
class Destination(Protocol):
    """A directory (or object prefix) that files and dataset versions are written to, by
    relative ``/``-separated names.

    Attributes
    ----------
    root : str
        The directory or URL prefix.
    conditional : bool
        Capability flag: :meth:`write_new` and :meth:`replace` with ``expect`` are atomic
        checks (a lock, or the store's conditional writes). When False they check first and
        write after, and two writers at the same instant can both pass the check: a commit
        then relies on neither, writing its version's objects under names no other commit
        chooses (``docs/format.md``, "Commit protocol").
    local_root : str or None
        The local directory (None for an object store), for what works on local files only
        (removing a dataset's leftovers).

    Errors: a missing object is a :class:`~rowstore.errors.MissingObjectError`
    (a :class:`FileNotFoundError`); :meth:`write_new` over an existing object a
    :class:`FileExistsError`; :meth:`replace` of an object that is no longer ``expect`` an
    :class:`~rowstore.errors.ObjectChangedError`.
    """

    @property
    def root(self) -> str: ...

    @property
    def conditional(self) -> bool: ...

    @property
    def local_root(self) -> str | None: ...

    def staging(self) -> Staging:
        """A local directory to make finished files in (the destination itself when local,
        else a temporary directory whose files :meth:`Staging.publish` uploads)."""

    def list(self, rel: str) -> list[str]:
        """The names (not paths) directly under directory ``rel``; ``[]`` if there is none."""

    def exists(self, rel: str) -> bool:
        """Whether an object ``rel`` exists."""

    def read_small(self, rel: str, limit: int) -> bytes:
        """The whole object ``rel``, refused (:class:`~rowstore.errors.FormatError`) above
        ``limit`` bytes."""

    def size(self, rel: str) -> int | None:
        """The size in bytes of the object ``rel``; None if there is none."""

    def token(self, rel: str) -> Any:
        """What identifies the current content of ``rel`` (None if there is no such object),
        for :meth:`replace`'s ``expect``."""

    def write_new(self, rel: str, data: bytes) -> None:
        """Create ``rel`` holding ``data``, complete or not at all; :class:`FileExistsError`
        if it exists."""

    def replace(self, rel: str, data: bytes, *, expect: Any = ...) -> None:
        """Make ``rel`` hold ``data`` (complete or not at all). With ``expect`` (a
        :meth:`token`, None for "no object"), only if ``rel`` is still that, else
        :class:`~rowstore.errors.ObjectChangedError`."""

    def put_file(self, local: str, rel: str) -> None:
        """Copy the finished local file ``local`` to ``rel`` (appears whole)."""

    def remove(self, rel: str) -> None:
        """Remove the object ``rel`` (nothing if it is not there)."""

    def lock(self, rel: str) -> AbstractContextManager[None]:
        """Hold the writer lock kept in ``rel`` (waits for another holder; dropped when the
        process dies), where the store has locks; a no-op context for stores without them
        (object stores: see :attr:`conditional`)."""

    def sync(self) -> None:
        """Make everything written so far durable (directory entries included)."""


def names(items: Sequence[str]) -> list[str]:
    """The last ``/``-separated component of each listed path."""
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in items]


class Staging:
    """A local directory that a writer makes finished files in, each of which becomes an
    object of a destination when published (:meth:`Destination.staging`).

    Attributes
    ----------
    root : str
        The local directory to write in.
    in_place : bool
        Whether ``root`` is the destination itself (a local directory: nothing to publish),
        rather than a temporary directory whose files are uploaded.
    """

    def __init__(self, root: str, *, in_place: bool, dest: Any = None):
        self.root = root
        self.in_place = in_place
        self._dest = dest

    def local(self, rel: str) -> str:
        """The local path of ``rel`` in :attr:`root`."""
        return os.path.join(self.root, *rel.split("/"))

    def publish(self, rel: str) -> None:
        """Make the finished local file ``rel`` the destination's object ``rel``."""
        if not self.in_place:
            self._dest.put_file(self.local(rel), rel)

    def fetch(self, rel: str, limit: int) -> None:
        """Copy the destination's object ``rel`` (at most ``limit`` bytes) into :attr:`root`;
        :class:`~rowstore.errors.MissingObjectError` if there is none."""
        if self.in_place:
            return
        data = self._dest.read_small(rel, limit)
        os.makedirs(os.path.dirname(self.local(rel)), exist_ok=True)
        with open(self.local(rel), "wb") as f:
            f.write(data)

    def close(self) -> None:
        """Remove the temporary directory (nothing for an in-place staging)."""
        if not self.in_place:
            shutil.rmtree(self.root, ignore_errors=True)


class StagedFile:
    """One local file that becomes a destination's object when published
    (:func:`rowstore.storage.stage_file`).

    Attributes
    ----------
    path : str
        The local path to write.
    in_place : bool
        Whether :attr:`path` is the final file (nothing to publish).
    """

    def __init__(
        self, path: str, *, dest: Any = None, rel: str | None = None, staging: Staging | None = None
    ):
        self.path = path
        self.in_place = dest is None
        self._dest, self._rel, self._staging = dest, rel, staging

    def publish(self) -> None:
        """Upload the finished file (nothing for a local one) and remove the temporary copy."""
        if self._dest is None:
            return
        try:
            self._dest.put_file(self.path, self._rel)
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the temporary copy (a local file is left to its writer)."""
        if self._staging is not None:
            self._staging.close()
