"""Temporary directories of a shuffle: created locked, removed on success, failure, or by the
next run after a kill.

A run creates ``.rowstore-shuffle-piles.<random>`` (in ``tmp``) and
``.rowstore-shuffle-out.<random>`` (beside the output, renamed onto it at the end) and holds an
exclusive ``flock`` on each directory while it runs; the OS drops the lock when the process
dies. Any run, on start, removes the directories of that pattern in both places whose lock it
can take: their runs are dead.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

__all__ = ["PREFIX", "LockedDir", "remove_stale"]

PREFIX = ".rowstore-shuffle-"


class LockedDir:
    """A new directory ``<parent>/.rowstore-shuffle-<kind>.<random>``, flock'ed until
    :meth:`release` (or the process's end)."""

    def __init__(self, parent: str, kind: str):
        self._fd: int | None = None
        for _ in range(100):
            path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}.", dir=parent)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.path.samestat(os.stat(path), os.fstat(fd)):
                    self.path, self._fd = path, fd
                    return
            except (BlockingIOError, FileNotFoundError):
                pass  # another run's clean-up took it between mkdtemp and flock: a new one
            os.close(fd)
        raise OSError(f"could not create a locked temporary directory in {parent!r}")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def remove(self) -> None:
        """Remove the directory (if still there) and release the lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.release()


def remove_stale(parent: str) -> list[str]:
    """Remove the shuffle directories in ``parent`` that no live run holds; their paths."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return removed
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not a directory
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a live run
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed
