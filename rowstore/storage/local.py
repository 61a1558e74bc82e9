"""Reading local shard files (:class:`LocalStore`) within a process-wide budget of file
descriptors, and a file's identity (:func:`file_identity`, :func:`pin_identities`).

:class:`LocalStore` reads local shard files with ``pread``/``preadv`` on plain
descriptors, opened lazily in each process and bounded in number: each store keeps at most its
``max_open``, and all the stores of a process together at most :func:`process_max_open` (half
of ``ulimit -n``), least recently used closed first, so that a dataset of 10,000 shards, or
several readers or a mix of such datasets, works under the default ``ulimit -n``. It survives
``fork`` (torch DataLoader workers) and pickling, and the kernels it calls release the GIL.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError, MissingObjectError, StaleFileError
from rowstore.storage.inputs import open_regular  # the dataset opener: one opener of inputs

__all__ = [
    "LocalStore",
    "default_max_open",
    "process_max_open",
    "pin_identities",
    "file_identity",
    "open_regular",
]


# -- file identity --------------------------------------------------------------------------------
def file_identity(st: os.stat_result) -> tuple:
    """What identifies one version of a file: device, inode, size, modification time and
    status change time (which every write changes, and which, unlike the modification time,
    no ``utime`` can set back)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# -- reading ------------------------------------------------------------------------------------

#: Every live store, so that a forked child starts each one afresh (see _after_fork).
_STORES: weakref.WeakSet[LocalStore] = weakref.WeakSet()
_TOKENS = itertools.count()


class _Files:
    """One store's descriptors in this process: ``fds`` (shard -> descriptor, least recently
    used first), ``users`` (reads in flight per descriptor: close() or an eviction must not free
    a number another thread still reads from, the OS would hand it to the next file opened),
    ``retired`` (closed while in use: the last reader closes it)."""

    __slots__ = ("fds", "users", "retired")

    def __init__(self) -> None:
        self.fds: OrderedDict[int, int] = OrderedDict()
        self.users: dict[int, int] = {}
        self.retired: set[int] = set()


class _Budget:
    """The descriptors every store of this process keeps open: ``lru`` maps ``(store token,
    shard)`` to the store's :class:`_Files`, least recently used first; ``lock`` guards it and
    every store's :class:`_Files` (one lock: an eviction closes another store's descriptor)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lru: OrderedDict[tuple[int, int], _Files] = OrderedDict()
        self.limit = 0  # set on first use (process_max_open)
        # The thread holding the lock, and the stores whose close() it reached meanwhile: a
        # Reader collected by the garbage collector inside a critical section closes its store
        # from a finalizer, on the thread that already holds the lock; it is closed on release.
        self.owner: int | None = None
        self.pending: list[LocalStore] = []

    @contextlib.contextmanager
    def held(self) -> Iterator[_Budget]:
        with self.lock:
            self.owner = threading.get_ident()
            try:
                yield self
            finally:
                while self.pending:
                    self.pending.pop()._close_locked()
                self.owner = None


_BUDGET = _Budget()


def _after_fork() -> None:
    # A fork copies only the forking thread: a lock another thread held stays locked forever in
    # the child. The child starts with a new budget and every store empty; its copies of the
    # parent's descriptors are closed (it opens its own on first use; closing a copy leaves the
    # parent's open). The budget's entries include stores that died without close().
    global _BUDGET
    old, _BUDGET = _BUDGET, _Budget()
    inherited = {fd for files in old.lru.values() for fd in files.fds.values()}
    for store in list(_STORES):
        inherited |= set(store._files.fds.values()) | store._files.retired
        store._reset()
    for fd in inherited:
        try:
            os.close(fd)
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork)


def _soft_nofile() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY or soft <= 0:
            soft = 1 << 16
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        soft = 1024
    return soft


def default_max_open() -> int:
    """Descriptors one store keeps open at most: a quarter of the soft ``RLIMIT_NOFILE``
    (256 under the usual 1024), at least 16."""
    return max(16, _soft_nofile() // 4)


def process_max_open() -> int:
    """Descriptors all the stores of this process keep open together at most: half of the
    soft ``RLIMIT_NOFILE`` (512 under the usual 1024), at least 16. Read when the process (or
    a forked child) first opens a shard."""
    return max(16, _soft_nofile() // 2)


def pin_identities(paths: Sequence[str], file_ids: Sequence[tuple]) -> tuple[tuple, ...]:
    """``file_ids`` with each ``(size,)`` (a shard named by a manifest) replaced by the
    :func:`~rowstore.storage.local.file_identity` of the file now at its path when that file
    is a regular file of that size (one ``stat`` each, no open): a reader then refuses a
    shard replaced later under the same name and size. Others are kept (the first read reports
    them)."""
    out = []
    for path, want in zip(paths, file_ids):
        if len(want) == 1:
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == want[0]:
                want = file_identity(st)
        out.append(want)
    return tuple(out)


def _on_descriptors(name: str) -> Callable[..., Any]:
    """A store method that calls the kernel ``kernels.<name>`` on the descriptors of its first
    argument's shards (item i of shard ``shards[i]``; None: all of shard 0), the rest passed as
    they are: each read of a :class:`LocalStore` has its kernel's signature, with shards for
    descriptors. The kernel is looked up at each call, as every other caller of ``kernels``
    does (a test or the fuzzing harness may wrap it)."""

    def read(self: LocalStore, shards: np.ndarray | None, *args: Any, **kw: Any) -> Any:
        fd, held = self._per_item(shards)  # (no context manager: per request, on the hot path)
        try:
            return getattr(kernels, name)(fd, *args, **kw)
        finally:
            self._release(held)

    read.__name__ = read.__qualname__ = name
    read.__doc__ = f"kernels.{name} with ``shards`` for its descriptors."
    return read


class LocalStore:
    """The stored bytes of a dataset's shard files on a local filesystem.

    Parameters
    ----------
    paths : sequence of str
        The shard files (one for a single file).
    file_ids : sequence of tuple
        Per shard, what a descriptor opened later must see: a full
        :func:`rowstore.storage.local.file_identity` (another inode, size or time is a
        :class:`~rowstore.errors.StaleFileError`: the file was replaced or modified since the
        reader opened it), or ``(size,)`` (a shard named by a manifest; another size is a
        :class:`~rowstore.errors.FormatError`). Empty tuple: not checked.
    max_open : int, optional
        Descriptors this store keeps open at once (least recently used ones are closed first);
        default :func:`default_max_open`, at most :func:`process_max_open`, which also bounds
        the descriptors all stores of the process keep together. A request needing more shards
        at once opens them for its duration only.

    Notes
    -----
    A :class:`~rowstore.storage.base.DirectReads` (``direct`` is True): single rows and
    payloads can be read where that moves fewer bytes than whole chunks (a few microseconds
    per ``pread`` from the page cache); each read is its kernel's signature with shards for
    descriptors. Descriptors are opened lazily in each process (``O_NONBLOCK`` until
    ``fstat`` shows a regular file: a FIFO is an error, never a wait), so the store survives
    ``fork`` (torch DataLoader workers) and pickling. Thread-safe; the kernels it calls
    release the GIL.
    """

    direct = True

    def __init__(
        self, paths: Sequence[str], file_ids: Sequence[tuple] = (), max_open: int | None = None
    ):
        self.paths = tuple(paths)
        self.file_ids = tuple(file_ids) or ((),) * len(self.paths)
        self.max_open = min(max_open or default_max_open(), process_max_open())
        self._reset()
        _STORES.add(self)

    @property
    def path(self) -> str:
        return self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} shard files"

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._token = next(_TOKENS)
        self._files = _Files()

    @property
    def _lock(self) -> threading.Lock:
        """The lock guarding this store's descriptors (the process's budget lock, shared)."""
        return _BUDGET.lock

    @property
    def _fds(self) -> OrderedDict[int, int]:
        """shard -> descriptor of this process, least recently used first."""
        return self._files.fds

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "file_ids": self.file_ids, "max_open": self.max_open}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.paths, self.file_ids, self.max_open = (
            state["paths"],
            state["file_ids"],
            state["max_open"],
        )
        self._reset()
        _STORES.add(self)

    @property
    def is_open(self) -> bool:
        """Whether this process holds a descriptor of any shard now."""
        return self._pid == os.getpid() and bool(self._files.fds)

    def open_count(self) -> int:
        """Descriptors this process holds now (cached and in use)."""
        files = self._files
        return len(files.fds) + len(files.retired) if self._pid == os.getpid() else 0

    def _acquire(self, shards: Sequence[int]) -> list[int]:
        """This process's descriptors of ``shards`` (distinct; opened on first use), held until
        :meth:`_release`."""
        out: list[int] = []
        with _BUDGET.held() as budget:
            if self._pid != os.getpid():  # pragma: no cover - _after_fork resets; belt and braces
                self._reset()
            if not budget.limit:
                budget.limit = process_max_open()
            files, lru, token = self._files, budget.lru, self._token
            try:
                for s in shards:
                    fd = files.fds.get(s)
                    if fd is None:
                        fd = files.fds[s] = self._open(s)
                        lru[(token, s)] = files
                    else:
                        files.fds.move_to_end(s)
                        lru.move_to_end((token, s))
                    files.users[fd] = files.users.get(fd, 0) + 1
                    out.append(fd)
            except BaseException:
                self._release_locked(out)
                raise
            self._evict_locked(budget)
        return out

    def _release(self, fds: Sequence[int]) -> None:
        with _BUDGET.held() as budget:
            self._release_locked(fds)
            self._evict_locked(budget)

    def _release_locked(self, fds: Sequence[int]) -> None:
        users, retired = self._files.users, self._files.retired
        for fd in fds:
            users[fd] -= 1
            if not users[fd]:
                del users[fd]
                if fd in retired:  # closed meanwhile: the last reader closes it
                    retired.discard(fd)
                    os.close(fd)

    def _evict_locked(self, budget: _Budget) -> None:
        """Close the least recently used idle descriptors beyond this store's ``max_open``,
        then those of any store beyond the process's budget (those in use go to the back: they
        are being used now)."""
        files, token = self._files, self._token
        excess = len(files.fds) - self.max_open
        tries = len(files.fds)
        while excess > 0 and tries > 0:
            tries -= 1
            s, fd = next(iter(files.fds.items()))
            if fd in files.users:
                files.fds.move_to_end(s)
                continue
            del files.fds[s]
            budget.lru.pop((token, s), None)
            os.close(fd)
            excess -= 1
        lru = budget.lru
        excess = len(lru) - budget.limit
        tries = len(lru)
        while excess > 0 and tries > 0:
            tries -= 1
            key, owner = next(iter(lru.items()))
            fd = owner.fds[key[1]]
            if fd in owner.users:
                lru.move_to_end(key)
                continue
            del lru[key], owner.fds[key[1]]
            os.close(fd)
            excess -= 1

    def _open(self, s: int) -> int:
        path = self.paths[s]
        try:
            fd, st = open_regular(path)
        except FileNotFoundError:
            raise MissingObjectError(
                f"{path!r} is missing (a shard of the dataset: removed or moved since it was "
                f"opened)",
                path=path,
            ) from None
        want = self.file_ids[s]
        if want:
            have = file_identity(st) if len(want) > 1 else (st.st_size,)
            if have != want:
                os.close(fd)
                if len(want) == 1:
                    raise FormatError(
                        f"{path!r} has {st.st_size} bytes, the dataset's manifest records "
                        f"{want[0]} "
                        f"(a shard was replaced, truncated or appended to)",
                        path=path,
                    )
                if st.st_size != want[2]:
                    how = (
                        f"it has {st.st_size} bytes, {want[2]} when opened (for a dataset's shard, "
                        f"the size its "
                        f"manifest records): replaced, truncated or appended to"
                    )
                else:
                    how = "another inode or times: replaced, rewritten or modified in place"
                raise StaleFileError(
                    f"{path!r} changed since it was opened ({how}); its bytes are not read with "
                    f"the "
                    f"old version's index: open it again to read the new version",
                    path=path,
                )
        return fd

    def close(self) -> None:
        """Close this process's descriptors (reopened on next use); reads still in flight on
        other threads finish first, the last of them closes theirs."""
        budget = _BUDGET
        if budget is None or threading is None:  # interpreter exit: the OS closes them
            return
        if budget.owner == threading.get_ident():  # from a finalizer inside a critical section
            budget.pending.append(self)
            return
        with budget.held():
            self._close_locked()

    def _close_locked(self) -> None:
        if self._pid != os.getpid():
            return
        lru, files, token = _BUDGET.lru, self._files, self._token
        fds, files.fds = list(files.fds.items()), OrderedDict()
        for s, fd in fds:
            lru.pop((token, s), None)
            if fd in files.users:
                files.retired.add(fd)
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
    def fetch_ahead(self, segments: Any, plan_segments: Any, keys_of: Any) -> Any:
        """``segments`` as they are: local reads need no prefetch schedule."""
        return segments

    load_chunks = _on_descriptors("load_chunks")
    # DirectReads
    read_rows = _on_descriptors("pread_rows")
    read_rows_into = _on_descriptors("preadv_rows")
    check_pages = _on_descriptors("check_ranges")
    memcpyed_starts = _on_descriptors("memcpyed_starts")
    read_pages = _on_descriptors("pread_pages")
    read_payloads = _on_descriptors("pread_heap")
