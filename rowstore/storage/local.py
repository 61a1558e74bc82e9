"""Local files: reading shards (:class:`LocalStore`), replacing files atomically
(:class:`AtomicFile`), and a dataset directory as a destination (:class:`LocalDir`).

**Reading.** :class:`LocalStore` reads local shard files with ``pread``/``preadv`` on plain
descriptors, opened lazily in each process and bounded in number: each store keeps at most its
``max_open``, and all the stores of a process together at most :func:`process_max_open` (half
of ``ulimit -n``), least recently used closed first, so that a dataset of 10,000 shards, or
several readers or a mix of such datasets, works under the default ``ulimit -n``. It survives
``fork`` (torch DataLoader workers) and pickling, and the kernels it calls release the GIL.

**Atomic commit of a file**: write a temporary file beside the target, then move it into place.
A target path is always either absent, its previous complete content, or its new complete
content: a crash (even SIGKILL) before :meth:`AtomicFile.commit` leaves the target untouched and
at most a temporary file ``.<name>.<random>.rowstore-tmp`` beside it.

::

    af = AtomicFile(target)                # creates af.tmp (O_EXCL, mode 0o666 less the umask)
    try:
        write_everything_to(af.tmp)        # any library: h5py, open(), ...; close it before commit
        af.commit()                        # fsync af.tmp, rename onto target, fsync the directory
    except BaseException:
        af.abort()                         # removes af.tmp; target as it was
        raise

or ``with AtomicFile(target) as af: ...`` (commits on success, aborts on an exception).
``AtomicFile(target, exclusive=True)`` never overwrites: the commit fails with
:class:`FileExistsError` if the target exists by then. ``copy_from=path`` starts the temporary
file as a copy of ``path`` with its permissions (appending without touching the original).

A writer of several files (shards, then a manifest that names them) commits each shard with its
own :class:`AtomicFile` and the manifest last, the same way: a reader that trusts only the
manifest then never sees a partial dataset.

A symlink as target is followed: its target is replaced and the link keeps pointing at the new
file. Temporary files are created in the target's directory so that the rename stays on one
filesystem (``rename`` is atomic only there).

**Locks.** An :class:`AtomicFile` holds an exclusive advisory lock (``flock``) on its temporary
file from creation until commit or abort; the OS drops it when the process dies. So a temporary
file whose lock can be taken belongs to nobody alive: it is *stale* (a killed writer's), and
whoever takes its lock may remove it (:func:`remove_stale`). ``AtomicFile(target, sole=True)``
also claims the target for itself: it removes the target's stale temporaries and refuses, with
:class:`~rowstore.errors.ConcurrentWriterError`, while another live temporary of the target
exists (one writer per target). The lock is on the temporary file, not the target (the commit's
rename replaces the target's inode, so a lock there would exclude nobody afterwards), and it
leaves no file of its own behind. Whoever opens :attr:`AtomicFile.tmp` with a library that locks
files itself must turn that off (``h5py.File(..., locking=False)``: HDF5's ``flock`` on another
descriptor would conflict with ours). Two sole writers starting at the same instant may both be
refused (each sees the other's lock); never both admitted. Without ``fcntl`` (not POSIX)
nothing is locked and nothing is called stale.

**A dataset directory as a destination.** :class:`LocalDir` writes new objects with
:class:`AtomicFile` (exclusive: never over an existing one), replaces objects atomically,
serialises writers with ``flock`` (:meth:`LocalDir.lock`) and makes every change durable
(``fsync`` of the files and their directory) before it returns.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import shutil
import stat
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import (
    ConcurrentWriterError,
    FormatError,
    MissingObjectError,
    ObjectChangedError,
    StaleFileError,
)
from rowstore.storage.base import Staging
from rowstore.storage.inputs import open_regular  # the dataset opener: one opener of inputs

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LocalStore",
    "LocalDir",
    "default_max_open",
    "process_max_open",
    "pin_identities",
    "AtomicFile",
    "fsync_path",
    "fsync_directory",
    "remove_stale",
    "temporaries",
    "TMP_SUFFIX",
    "file_identity",
    "open_regular",
    "commit_lock",
]

#: Suffix of temporary files (a crashed writer's leftovers are recognisable by it).
TMP_SUFFIX = ".rowstore-tmp"
_TOKEN_HEX = 12  # hex digits of the random part of a temporary file's name


def fsync_path(path: str) -> None:
    """Flush a closed file's content to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: str) -> None:
    """Flush a directory's entries (a rename or link in it) to stable storage."""
    fsync_path(path)  # O_RDONLY on a directory works on POSIX; fsync then syncs its entries


def _resolve(path: str) -> str:
    """The file that is replaced for ``path``: a symlink's target, else the path itself."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _create_temp(target: str) -> tuple[str, int]:
    """A new temporary file beside ``target`` and a descriptor holding its lock."""
    directory = os.path.dirname(os.path.abspath(target))
    prefix = os.path.join(directory, "." + os.path.basename(target) + ".")
    for _ in range(100):
        tmp = prefix + secrets.token_hex(_TOKEN_HEX // 2) + TMP_SUFFIX
        try:
            # 0o666 less the umask, like any new file (mkstemp's 0o600 survived the rename, so
            # datasets were unreadable by the group and others).
            fd = os.open(
                tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666
            )
        except FileExistsError:
            continue
        if _lock(fd, tmp):
            return tmp, fd
        os.close(
            fd
        )  # taken meanwhile by someone removing it as stale: it is gone, pick another name
    raise FileExistsError(f"could not create a temporary file beside {target!r}")


def _lock(fd: int, path: str) -> bool:
    """Take the exclusive lock of ``fd`` without waiting; True if taken and ``path`` still names
    that file (a holder that removes a stale file unlinks it before unlocking)."""
    if fcntl is None:  # pragma: no cover
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def temporaries(path: str | os.PathLike) -> list[str]:
    """The temporary files of target ``path`` (a symlink is followed), or of every target in
    directory ``path``: names exactly ``.<name>.<12 hex digits>.rowstore-tmp``, live or stale."""
    path = _resolve(os.fspath(path))
    if os.path.isdir(path):
        directory, name = path, ".+"
    else:
        directory, name = os.path.dirname(os.path.abspath(path)), re.escape(os.path.basename(path))
    pattern = re.compile(rf"\.{name}\.[0-9a-f]{{{_TOKEN_HEX}}}{re.escape(TMP_SUFFIX)}")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(directory, n) for n in names if pattern.fullmatch(n))


def remove_stale(
    path: str | os.PathLike, *, dry_run: bool = False, keep: str | None = None
) -> tuple[list[str], list[str]]:
    """Remove the stale temporary files of target (or directory) ``path``: those whose lock
    nobody holds. Returns ``(stale, live)``: the stale ones (removed unless ``dry_run``) and
    those a live writer holds (left alone). ``keep`` is a temporary file to skip (one's own)."""
    stale: list[str] = []
    live: list[str] = []
    if fcntl is None:  # pragma: no cover - cannot tell live from stale
        return stale, live
    for tmp in temporaries(path):
        if tmp == keep:
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            continue
        except PermissionError:
            live.append(tmp)  # cannot take its lock: not ours to call stale
            continue
        try:
            if not _lock(fd, tmp):
                if os.path.exists(tmp):
                    live.append(tmp)
                continue
            if not dry_run:
                os.unlink(tmp)  # still holding its lock: see _lock
            stale.append(tmp)
        finally:
            os.close(fd)
    return stale, live


class AtomicFile:
    """A temporary file that replaces ``target`` only when committed.

    Parameters
    ----------
    target : str or os.PathLike
        Final path. A symlink is followed (its target is replaced).
    exclusive : bool
        Never overwrite: :meth:`commit` links the file into place and fails with
        :class:`FileExistsError` if ``target`` exists at that moment (checking earlier is the
        caller's business).
    copy_from : str or os.PathLike, optional
        Start :attr:`tmp` as a copy of this file (see :meth:`copy`).
    durable : bool
        ``False`` skips the ``fsync`` calls of :meth:`commit` (still atomic, not durable across
        a power loss: for temporary files, such as a shuffle's piles).
    sole : bool
        Be the target's only writer: remove its stale temporary files (listed in
        :attr:`removed`) and raise :class:`~rowstore.errors.ConcurrentWriterError` if another
        live :class:`AtomicFile` of the target exists (see the module docstring).

    Attributes
    ----------
    target : str
        The path that :meth:`commit` replaces (the symlink's target for a symlink).
    tmp : str
        The temporary file to write (:class:`ValueError` once committed or aborted).
    done : bool
        Whether :meth:`commit` or :meth:`abort` has run (successfully, for a commit).
    removed : list of str
        The stale temporary files removed at construction (``sole=True``).

    Not thread-safe. The caller closes its own handles on :attr:`tmp` before :meth:`commit`.
    """

    def __init__(
        self,
        target: str | os.PathLike,
        *,
        exclusive: bool = False,
        copy_from: str | os.PathLike | None = None,
        sole: bool = False,
        durable: bool = True,
    ):
        self.target = _resolve(os.fspath(target))
        self.exclusive = exclusive
        self.durable = durable
        self.removed: list[str] = []
        self._fd: int | None = None
        self._tmp: str | None
        self._tmp, self._fd = _create_temp(self.target)
        try:
            if sole:
                self.removed, live = remove_stale(self.target, keep=self._tmp)
                if live:
                    raise ConcurrentWriterError(
                        f"{self.target!r} is being written by another writer (its temporary "
                        f"file {os.path.basename(live[0])!r} is locked): one writer at a time",
                        path=self.target,
                    )
            if copy_from is not None:
                self.copy(copy_from)
        except BaseException:
            self.abort()
            raise

    def copy(self, src: str | os.PathLike) -> None:
        """Make :attr:`tmp` a copy of ``src`` (``copy_file_range``/reflink where the filesystem
        offers it) with its permission bits."""
        shutil.copyfile(
            src, self.tmp
        )  # copy_file_range/sendfile: in-kernel, reflink on CoW; same inode
        shutil.copymode(src, self.tmp)  # the new file keeps the old one's permissions

    @property
    def tmp(self) -> str:
        if self._tmp is None:
            raise ValueError(f"AtomicFile for {self.target!r} was already committed or aborted")
        return self._tmp

    @property
    def done(self) -> bool:
        return self._tmp is None

    def commit(self) -> None:
        """fsync :attr:`tmp`, move it onto :attr:`target` (``rename``, or ``link`` when
        exclusive), and fsync the directory. On an error :attr:`tmp` is left for :meth:`abort`."""
        tmp = self.tmp
        if self.durable:
            fsync_path(tmp)
        if self.exclusive:
            os.link(tmp, self.target)  # fails if the target appeared meanwhile: never overwrite
            os.unlink(tmp)
        else:
            os.replace(tmp, self.target)
        self._tmp = None
        self._unlock()
        if self.durable:
            fsync_directory(os.path.dirname(os.path.abspath(self.target)))

    def _unlock(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def abort(self) -> None:
        """Remove :attr:`tmp` (idempotent); :attr:`target` is left as it was."""
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            try:
                os.unlink(tmp)  # before unlocking: see _lock
            except FileNotFoundError:
                pass
        self._unlock()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            self._unlock()  # dropped without commit or abort: its temporary file becomes stale

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()

    def __repr__(self) -> str:
        state = "done" if self._tmp is None else repr(self._tmp)
        return f"AtomicFile({self.target!r}, exclusive={self.exclusive}, tmp={state})"


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
    ``direct`` is True: single rows and payloads can be read where that moves fewer bytes
    than whole chunks (a few microseconds per ``pread`` from the page cache). Descriptors are
    opened lazily in each process (``O_NONBLOCK`` until ``fstat`` shows a regular file: a FIFO
    is an error, never a wait), so the store survives ``fork`` (torch DataLoader workers) and
    pickling. Thread-safe; the kernels it calls release the GIL.
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
    def load_chunks(
        self,
        shards: np.ndarray | None,
        offsets: np.ndarray,
        stored: np.ndarray,
        checksums: np.ndarray,
        *,
        codec: tuple[int, int] | None,
        verify: bool,
        dst: np.ndarray,
        raw_size: int,
        scratch: np.ndarray,
        what: str,
        dst_stride: int = 0,
    ) -> None:
        """Whole stored chunks (chunk i of shard ``shards[i]``; None: all of shard 0), checked and
        decompressed into ``dst`` (see kernels.load_chunks)."""
        fd, held = self._per_item(
            shards
        )  # (not a context manager: this is per request on the hot path)
        try:
            kernels.load_chunks(
                fd,
                offsets,
                stored,
                checksums,
                codec=codec,
                verify=verify,
                dst=dst,
                raw_size=raw_size,
                scratch=scratch,
                what=what,
                dst_stride=dst_stride,
            )
        finally:
            self._release(held)

    def fetch_ahead(self, segments: Any, plan_segments: Any, keys_of: Any) -> Any:
        """``segments`` as they are: local reads need no prefetch schedule."""
        return segments

    def read_rows(
        self, shards: np.ndarray | None, file_offsets: np.ndarray, row_size: int, dst: np.ndarray
    ) -> None:
        """Single rows (row i of shard ``shards[i]``) into ``dst`` (``direct`` stores only)."""
        fd, held = self._per_item(shards)
        try:
            kernels.pread_rows(fd, file_offsets, row_size, dst)
        finally:
            self._release(held)

    def read_rows_into(
        self,
        shards: np.ndarray | None,
        file_offsets: np.ndarray,
        row_size: int,
        segments: list[tuple[int, np.ndarray | None]],
        sink: np.ndarray,
        *,
        check: np.ndarray | None = None,
        expect: np.ndarray | None = None,
    ) -> None:
        """Single rows cut straight into per-field arrays, those ``check`` marks CRC-checked
        against ``expect`` as they are read (``direct`` stores only)."""
        fd, held = self._per_item(shards)
        try:
            kernels.preadv_rows(
                fd, file_offsets, row_size, segments, sink, check=check, expect=expect
            )
        finally:
            self._release(held)

    def check_pages(
        self,
        shards: np.ndarray | None,
        offsets: np.ndarray,
        sizes: np.ndarray,
        page_len: int,
        expect: np.ndarray,
        scratch: np.ndarray,
    ) -> None:
        """Runs of pages (run i of shard ``shards[i]``) read and CRC-checked page by page
        against ``expect`` (see kernels.check_ranges; ``direct`` stores only)."""
        fd, held = self._per_item(shards)
        try:
            kernels.check_ranges(fd, offsets, sizes, page_len, expect, scratch)
        finally:
            self._release(held)

    def memcpyed_starts(
        self,
        shards: np.ndarray | None,
        offsets: np.ndarray,
        stored: np.ndarray,
        *,
        codec: tuple[int, int],
        raw_size: int,
        what: str,
    ) -> np.ndarray:
        """Where each stored frame's memcpy'd raw bytes lie in its file (-1: compressed), the
        headers checked (frame i of shard ``shards[i]``; see kernels.memcpyed_starts)."""
        fd, held = self._per_item(shards)
        try:
            return kernels.memcpyed_starts(
                fd, offsets, stored, codec=codec, raw_size=raw_size, what=what
            )
        finally:
            self._release(held)

    def read_pages(
        self,
        shards: np.ndarray | None,
        chunk_offsets: np.ndarray,
        chunk_bytes: np.ndarray,
        within: np.ndarray,
        take: np.ndarray,
        page_first: np.ndarray,
        pages: tuple,
        out: np.ndarray,
        dst_offsets: np.ndarray,
    ) -> None:
        """Ranges of uncompressed chunks (range i of shard ``shards[i]``) into ``out``, checked
        by their pages in the read's pass (see kernels.pread_pages)."""
        fd, held = self._per_item(shards)
        try:
            kernels.pread_pages(
                fd, chunk_offsets, chunk_bytes, within, take, page_first, pages, out, dst_offsets
            )
        finally:
            self._release(held)

    def read_payloads(
        self,
        shards: np.ndarray | None,
        rowbuf: np.ndarray,
        row_size: int,
        ref_offsets: list[int],
        rows: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        chunk_offsets: np.ndarray,
        chunk_base: Any,
        chunk_bytes: int,
        outs: list[np.ndarray],
        dst_offsets: list[np.ndarray],
        *,
        pages: tuple | None = None,
    ) -> None:
        """The heap payloads of fields (references at ``ref_offsets`` of a row) into ``outs``
        in one call, those next to each other in the file in one read (``direct`` stores of
        uncompressed heaps only), checked by heap pages with ``pages`` (see
        kernels.pread_heap)."""
        fd, held = self._per_item(shards)
        try:
            kernels.pread_heap(
                fd,
                rowbuf,
                row_size,
                ref_offsets,
                rows,
                lo,
                hi,
                chunk_offsets,
                chunk_bytes,
                outs,
                dst_offsets,
                chunk_base=chunk_base,
                pages=pages,
            )
        finally:
            self._release(held)


# -- a directory as a destination ----------------------------------------------------------------
@contextlib.contextmanager
def commit_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the lock file ``path`` (``flock``; waits for another holder, dropped by the OS when
    the process dies). The file and its directory are created if missing and left in place."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class LocalDir:
    """A local directory as a :class:`~rowstore.storage.base.Destination`.

    Every object appears complete or not at all (:class:`AtomicFile`: a temporary file beside
    it, ``fsync``, then ``link`` for :meth:`write_new` or ``rename`` for :meth:`replace`), and
    :meth:`sync` flushes the directory entries. :meth:`lock` is an ``flock``, so writers that
    hold it run one at a time in any process; :meth:`replace` with ``expect`` compares the
    file's identity (:func:`file_identity`), which is atomic for holders of the lock.

    Parameters
    ----------
    root : str or os.PathLike
        The directory (created on the first write).
    durable : bool
        ``False`` skips the ``fsync`` calls (still atomic).
    """

    conditional = True

    def __init__(self, root: str | os.PathLike, *, durable: bool = True):
        self.root = os.fspath(root)
        self.local_root = self.root
        self.durable = durable

    def staging(self) -> Staging:
        return Staging(self.root, in_place=True)

    def __repr__(self) -> str:
        return f"LocalDir({self.root!r})"

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def list(self, rel: str) -> list[str]:
        try:
            return os.listdir(self._path(rel))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self._path(rel))

    def read_small(self, rel: str, limit: int) -> bytes:
        path = self._path(rel)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise FormatError(
                        f"{path!r}: has {size} bytes, more than the {limit} expected of it",
                        path=path,
                    )
                data = f.read(size + 1)  # sized by the file, not the limit
        except FileNotFoundError:
            raise MissingObjectError(f"{path!r} is missing", path=path) from None
        if len(data) > size:
            raise FormatError(f"{path!r}: grew while being read", path=path)
        return data

    def size(self, rel: str) -> int | None:
        try:
            return os.stat(self._path(rel)).st_size
        except FileNotFoundError:
            return None

    def token(self, rel: str) -> Any:
        try:
            return file_identity(os.stat(self._path(rel)))
        except FileNotFoundError:
            return None

    def _write(self, rel: str, data: bytes, *, exclusive: bool) -> None:
        target = self._path(rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with AtomicFile(target, exclusive=exclusive, durable=self.durable) as af:
            with open(af.tmp, "wb") as f:
                f.write(data)

    def write_new(self, rel: str, data: bytes) -> None:
        self._write(rel, data, exclusive=True)

    def replace(self, rel: str, data: bytes, *, expect: Any = ...) -> None:
        if expect is not ... and self.token(rel) != expect:
            where = self._path(rel)
            raise ObjectChangedError(
                f"{where!r} changed since it was read (another writer replaced it)", path=where
            )
        self._write(rel, data, exclusive=False)

    def put_file(self, local: str, rel: str) -> None:
        target = self._path(rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with AtomicFile(target, durable=self.durable) as af:
            af.copy(local)

    def remove(self, rel: str) -> None:
        try:
            os.remove(self._path(rel))
        except FileNotFoundError:
            pass

    def lock(self, rel: str) -> contextlib.AbstractContextManager[None]:
        return commit_lock(self._path(rel))

    def sync(self) -> None:
        if self.durable and os.path.isdir(self.root):
            fsync_directory(self.root)
