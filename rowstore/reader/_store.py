"""Byte fetching: where a reader's stored bytes come from.

A store serves the byte ranges the block index names (whole stored chunks, and for stores that
can afford many small reads, single rows and payloads). The reader's gather layer calls only
these methods, so a store for another medium (object storage, by ranged requests) plugs in
beside :class:`LocalStore` without touching the gather, decode or stream layers.

:class:`LocalStore` reads local shard files with ``pread``/``preadv`` on plain descriptors,
opened lazily in each process and bounded in number (a dataset of 10,000 shards works under the
default ``ulimit -n``): it survives ``fork`` (torch DataLoader workers) and pickling, and the
kernels it calls release the GIL.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError
from rowstore.format.index import file_identity

__all__ = ["LocalStore", "default_max_open"]

#: Every live store, so that a forked child starts each one afresh (see _after_fork).
_STORES: weakref.WeakSet[LocalStore] = weakref.WeakSet()


def _after_fork() -> None:
    # A fork copies only the forking thread: a lock another thread held stays locked forever in
    # the child. Give every store a new lock; the child's copies of the parent's descriptors are
    # closed (the child opens its own on first use; closing a copy leaves the parent's open).
    for store in list(_STORES):
        inherited = set(store._retired) | set(store._fds.values())
        store._reset()
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass


os.register_at_fork(after_in_child=_after_fork)


def default_max_open() -> int:
    """Descriptors one store keeps open at most: a quarter of the soft ``RLIMIT_NOFILE``
    (256 under the usual 1024), at least 16."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or soft <= 0:
            soft = 1 << 16
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        soft = 1024
    return max(16, soft // 4)


class LocalStore:
    """The stored bytes of a dataset's shard files on a local filesystem.

    Parameters
    ----------
    paths : sequence of str
        The shard files (one for a single file).
    file_ids : sequence of tuple
        Per shard, what a descriptor opened later must see: a full
        :func:`rowstore.format.index.file_identity` (an atomic rewrite replaces the inode), or
        ``(size,)`` (a shard named by a manifest); else :class:`~rowstore.errors.FormatError`.
        Empty tuple: not checked.
    max_open : int, optional
        Descriptors kept open at once (least recently used ones are closed first); default
        :func:`default_max_open`. A request needing more shards at once opens them for its
        duration only.

    Notes
    -----
    ``direct`` is True: single rows and payloads can be read where that moves fewer bytes
    than whole chunks (a few microseconds per ``pread`` from the page cache). Descriptors are
    opened lazily in each process, so the store survives ``fork`` (torch DataLoader workers)
    and pickling. Thread-safe; the kernels it calls release the GIL.
    """

    direct = True

    def __init__(self, paths: Sequence[str], file_ids: Sequence[tuple] = (), max_open: int | None = None):
        self.paths = tuple(paths)
        self.file_ids = tuple(file_ids) or ((),) * len(self.paths)
        self.max_open = max_open or default_max_open()
        self._reset()
        _STORES.add(self)

    @property
    def path(self) -> str:
        return self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} shard files"

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # shard -> descriptor, least recently used first.
        self._fds: OrderedDict[int, int] = OrderedDict()
        # Reads in flight per descriptor: close() or an eviction must not free a number another
        # thread is still reading from (the OS would hand it to the next file opened).
        self._users: dict[int, int] = {}
        self._retired: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "file_ids": self.file_ids, "max_open": self.max_open}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.paths, self.file_ids, self.max_open = state["paths"], state["file_ids"], state["max_open"]
        self._reset()
        _STORES.add(self)

    @property
    def is_open(self) -> bool:
        """Whether this process holds a descriptor of any shard now."""
        return self._pid == os.getpid() and bool(self._fds)

    def open_count(self) -> int:
        """Descriptors this process holds now (cached and in use)."""
        return len(self._fds) + len(self._retired) if self._pid == os.getpid() else 0

    def _acquire(self, shards: Sequence[int]) -> list[int]:
        """This process's descriptors of ``shards`` (distinct; opened on first use), held until
        :meth:`_release`."""
        out = []
        with self._lock:
            if self._pid != os.getpid():  # pragma: no cover - _after_fork resets; belt and braces
                self._reset_locked()
            try:
                for s in shards:
                    fd = self._fds.get(s)
                    if fd is None:
                        fd = self._fds[s] = self._open(s)
                    else:
                        self._fds.move_to_end(s)
                    self._users[fd] = self._users.get(fd, 0) + 1
                    out.append(fd)
            except BaseException:
                self._release_locked(out)
                raise
            self._evict_locked()
        return out

    def _reset_locked(self) -> None:
        self._pid = os.getpid()
        self._fds = OrderedDict()
        self._users = {}
        self._retired = set()

    def _release(self, fds: Sequence[int]) -> None:
        with self._lock:
            self._release_locked(fds)
            self._evict_locked()

    def _release_locked(self, fds: Sequence[int]) -> None:
        for fd in fds:
            self._users[fd] -= 1
            if not self._users[fd]:
                del self._users[fd]
                if fd in self._retired:  # closed meanwhile: the last reader closes it
                    self._retired.discard(fd)
                    os.close(fd)

    def _evict_locked(self) -> None:
        """Close the least recently used idle descriptors beyond ``max_open`` (those in use go
        to the back: they are being used now)."""
        excess = len(self._fds) - self.max_open
        tries = len(self._fds)
        while excess > 0 and tries > 0:
            tries -= 1
            s, fd = next(iter(self._fds.items()))
            if fd in self._users:
                self._fds.move_to_end(s)
                continue
            del self._fds[s]
            os.close(fd)
            excess -= 1

    def _open(self, s: int) -> int:
        path = self.paths[s]
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise FormatError(f"{path!r} is missing (a shard of the dataset: removed or moved since it was opened)",
                              path=path) from None
        want = self.file_ids[s]
        if want:
            st = os.fstat(fd)
            have = file_identity(st) if len(want) == 4 else (st.st_size,)
            if have != want:
                os.close(fd)
                if len(want) == 1:
                    raise FormatError(f"{path!r} has {st.st_size} bytes, the dataset's manifest records {want[0]} "
                                      f"(a shard was replaced, truncated or appended to)", path=path)
                raise FormatError(
                    f"{path!r} changed since it was opened (replaced, appended to or modified); "
                    f"open it again to read the new version", path=path)
        return fd

    def close(self) -> None:
        """Close this process's descriptors (reopened on next use); reads still in flight on
        other threads finish first, the last of them closes theirs."""
        with self._lock:
            if self._pid != os.getpid():
                return
            fds, self._fds = list(self._fds.values()), OrderedDict()
            for fd in fds:
                if fd in self._users:
                    self._retired.add(fd)
                else:
                    os.close(fd)

    def _per_item(self, shards: np.ndarray | None) -> tuple[Any, list[int]]:
        """Descriptors for items of ``shards`` (one per item; None: all of shard 0)."""
        if shards is None or len(self.paths) == 1:
            fds = self._acquire([0])
            return fds[0], fds
        S = len(self.paths)
        if len(shards) * 8 < S:  # a few items over many shards: sort them
            uniq, inverse = np.unique(shards, return_inverse=True)
            fds = self._acquire(uniq.tolist())
            return np.asarray(fds, np.int32)[inverse], fds
        uniq = np.flatnonzero(np.bincount(shards, minlength=S))  # O(items + shards), no sort
        fds = self._acquire(uniq.tolist())
        table = np.empty(S, np.int32)
        table[uniq] = fds
        return table[shards], fds

    # -- reads (each raises kernels.KernelError with the failing item's index) ----------------
    def load_chunks(self, shards: np.ndarray | None, offsets: np.ndarray, stored: np.ndarray, checksums: np.ndarray,
                    *, codec: tuple[int, int] | None, verify: bool, dst: np.ndarray, raw_size: int,
                    scratch: np.ndarray, what: str, dst_stride: int = 0) -> None:
        """Whole stored chunks (chunk i of shard ``shards[i]``; None: all of shard 0), checked and
        decompressed into ``dst`` (see kernels.load_chunks)."""
        fd, held = self._per_item(shards)  # (not a context manager: this is per request on the hot path)
        try:
            kernels.load_chunks(fd, offsets, stored, checksums, codec=codec, verify=verify, dst=dst,
                                raw_size=raw_size, scratch=scratch, what=what, dst_stride=dst_stride)
        finally:
            self._release(held)

    def read_rows(self, shards: np.ndarray | None, file_offsets: np.ndarray, row_size: int, dst: np.ndarray) -> None:
        """Single rows (row i of shard ``shards[i]``) into ``dst`` (``direct`` stores only)."""
        fd, held = self._per_item(shards)
        try:
            kernels.pread_rows(fd, file_offsets, row_size, dst)
        finally:
            self._release(held)

    def read_rows_into(self, shards: np.ndarray | None, file_offsets: np.ndarray, row_size: int,
                       segments: list[tuple[int, np.ndarray | None]], sink: np.ndarray, *,
                       check: np.ndarray | None = None, expect: np.ndarray | None = None) -> None:
        """Single rows cut straight into per-field arrays, those ``check`` marks CRC-checked
        against ``expect`` as they are read (``direct`` stores only)."""
        fd, held = self._per_item(shards)
        try:
            kernels.preadv_rows(fd, file_offsets, row_size, segments, sink, check=check, expect=expect)
        finally:
            self._release(held)

    def check_pages(self, shards: np.ndarray | None, offsets: np.ndarray, sizes: np.ndarray, page_len: int,
                    expect: np.ndarray, scratch: np.ndarray) -> None:
        """Runs of pages (run i of shard ``shards[i]``) read and CRC-checked page by page
        against ``expect`` (see kernels.check_ranges; ``direct`` stores only)."""
        fd, held = self._per_item(shards)
        try:
            kernels.check_ranges(fd, offsets, sizes, page_len, expect, scratch)
        finally:
            self._release(held)

    def read_payloads(self, shards: np.ndarray | None, rowbuf: np.ndarray, row_size: int, ref_offset: int,
                      rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, chunk_offsets: np.ndarray, chunk_base: Any,
                      chunk_bytes: int, out: np.ndarray, dst_offsets: np.ndarray, *, pages: tuple | None = None) -> None:
        """Single heap payloads into ``out`` (``direct`` stores of uncompressed heaps only),
        checked by heap pages with ``pages`` (see kernels.pread_heap)."""
        fd, held = self._per_item(shards)
        try:
            kernels.pread_heap(fd, rowbuf, row_size, ref_offset, rows, lo, hi, chunk_offsets, chunk_bytes, out,
                               dst_offsets, chunk_base=chunk_base, pages=pages)
        finally:
            self._release(held)
