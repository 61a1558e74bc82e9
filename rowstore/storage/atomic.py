"""Files replaced atomically (:class:`AtomicFile`), ``fsync``, and the stale temporary files
that killed writers leave (:func:`temporaries`, :func:`remove_stale`).

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
"""

from __future__ import annotations

import os
import re
import secrets
import shutil

from rowstore.errors import ConcurrentWriterError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "AtomicFile",
    "fsync_path",
    "fsync_directory",
    "remove_stale",
    "temporaries",
    "TMP_SUFFIX",
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
