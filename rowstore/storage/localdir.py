"""A local directory as a destination (:class:`LocalDir`) and its writer lock
(:func:`commit_lock`).

:class:`LocalDir` writes new objects with
:class:`AtomicFile` (exclusive: never over an existing one), replaces objects atomically,
serialises writers with ``flock`` (:meth:`LocalDir.lock`) and makes every change durable
(``fsync`` of the files and their directory) before it returns.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from rowstore.errors import FormatError, MissingObjectError, ObjectChangedError
from rowstore.storage.atomic import AtomicFile, fsync_directory
from rowstore.storage.base import Staging
from rowstore.storage.local import file_identity

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["LocalDir", "commit_lock"]


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
