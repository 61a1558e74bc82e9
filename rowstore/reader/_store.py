"""Byte fetching: where a reader's stored bytes come from.

A store serves the byte ranges the block index names (whole stored chunks, and for stores that
can afford many small reads, single rows and payloads). The reader's gather layer calls only
these methods, so a store for another medium (object storage, by ranged requests) plugs in
beside :class:`LocalStore` without touching the gather, decode or stream layers.

:class:`LocalStore` is a local file read with ``pread``/``preadv`` on a plain descriptor,
opened lazily in each process: it survives ``fork`` (torch DataLoader workers) and pickling,
and the kernels it calls release the GIL.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError
from rowstore.format.index import file_identity

__all__ = ["LocalStore"]

#: Every live store, so that a forked child starts each one afresh (see _after_fork).
_STORES: weakref.WeakSet[LocalStore] = weakref.WeakSet()


def _after_fork() -> None:
    # A fork copies only the forking thread: a lock another thread held stays locked forever in
    # the child. Give every store a new lock; the child's copies of the parent's descriptors are
    # closed (the child opens its own on first use; closing a copy leaves the parent's open).
    for store in list(_STORES):
        inherited = set(store._retired) | ({store._fd} if store._fd is not None else set())
        store._reset()
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass


os.register_at_fork(after_in_child=_after_fork)


class LocalStore:
    """The stored bytes of one local file.

    Parameters
    ----------
    path : str
    file_id : tuple
        :func:`rowstore.format.index.file_identity` of the file when its layout was read; a
        descriptor opened later must see the same file (an atomic rewrite replaces the inode),
        else :class:`~rowstore.errors.FormatError`. Empty: not checked.

    Notes
    -----
    ``direct`` is True: single rows and payloads can be read where that moves fewer bytes
    than whole chunks (a few microseconds per ``pread`` from the page cache). Thread-safe; the
    methods release the GIL in the kernels.
    """

    direct = True

    def __init__(self, path: str, file_id: tuple = ()):
        self.path = path
        self.file_id = file_id
        self._reset()
        _STORES.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._fd_pid: int | None = None
        # Reads in flight per descriptor: close() must not free a number another thread is
        # still reading from (the OS would hand it to the next file opened).
        self._users: dict[int, int] = {}
        self._retired: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "file_id": self.file_id}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self.file_id = state["file_id"]
        self._reset()
        _STORES.add(self)

    @property
    def is_open(self) -> bool:
        """Whether this process holds a descriptor of the file now."""
        return self._fd is not None and self._fd_pid == os.getpid()

    def _acquire(self) -> int:
        """This process's descriptor (opened on first use), held until :meth:`_release`."""
        pid = os.getpid()
        with self._lock:
            if self._fd is None or self._fd_pid != pid:
                self._fd, self._fd_pid = self._open(), pid
            fd = self._fd
            self._users[fd] = self._users.get(fd, 0) + 1
        return fd

    def _release(self, fd: int) -> None:
        with self._lock:
            self._users[fd] -= 1
            if not self._users[fd] and fd in self._retired:  # closed meanwhile: the last reader closes it
                del self._users[fd]
                self._retired.discard(fd)
                os.close(fd)

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        if self.file_id and file_identity(os.fstat(fd)) != self.file_id:
            os.close(fd)
            raise FormatError(
                f"{self.path!r} changed since it was opened (replaced, appended to or modified); "
                f"open it again to read the new version", path=self.path)
        return fd

    def close(self) -> None:
        """Close this process's descriptor (reopened on next use); reads still in flight on
        other threads finish first, the last of them closes it."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None or self._fd_pid != os.getpid():
                return
            if self._users.get(fd):
                self._retired.add(fd)
            else:
                self._users.pop(fd, None)
                os.close(fd)

    # -- reads (each raises kernels.KernelError with the failing item's index) ----------------
    def load_chunks(self, offsets: np.ndarray, stored: np.ndarray, checksums: np.ndarray, *,
                    codec: tuple[int, int] | None, verify: bool, dst: np.ndarray, raw_size: int,
                    scratch: np.ndarray, what: str) -> None:
        """Whole stored chunks, checked and decompressed into ``dst`` (see kernels.load_chunks)."""
        fd = self._acquire()  # (not a context manager: this is per request on the hot path)
        try:
            kernels.load_chunks(fd, offsets, stored, checksums, codec=codec, verify=verify, dst=dst,
                                raw_size=raw_size, scratch=scratch, what=what)
        finally:
            self._release(fd)

    def read_rows(self, file_offsets: np.ndarray, row_size: int, dst: np.ndarray) -> None:
        """Single rows into ``dst`` (``direct`` stores only)."""
        fd = self._acquire()
        try:
            kernels.pread_rows(fd, file_offsets, row_size, dst)
        finally:
            self._release(fd)

    def read_rows_into(self, file_offsets: np.ndarray, row_size: int,
                       segments: list[tuple[int, np.ndarray | None]], sink: np.ndarray) -> None:
        """Single rows cut straight into per-field arrays (``direct`` stores only)."""
        fd = self._acquire()
        try:
            kernels.preadv_rows(fd, file_offsets, row_size, segments, sink)
        finally:
            self._release(fd)

    def read_payloads(self, rowbuf: np.ndarray, row_size: int, ref_offset: int, rows: np.ndarray,
                      lo: np.ndarray, hi: np.ndarray, chunk_offsets: np.ndarray, chunk_bytes: int,
                      out: np.ndarray, dst_offsets: np.ndarray) -> None:
        """Single heap payloads into ``out`` (``direct`` stores of uncompressed heaps only)."""
        fd = self._acquire()
        try:
            kernels.pread_heap(fd, rowbuf, row_size, ref_offset, rows, lo, hi, chunk_offsets, chunk_bytes, out,
                               dst_offsets)
        finally:
            self._release(fd)
