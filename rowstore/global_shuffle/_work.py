"""Temporary directories of a shuffle: created locked, removed on success, failure, or by the
next run after a kill.

A run creates ``.rowstore-shuffle-piles.<random>`` (in ``tmp``) and
``.rowstore-shuffle-out.<random>`` (beside the output, renamed onto it at the end) and holds an
exclusive ``flock`` on each directory while it runs; the OS drops the lock when the process
dies. Any run, on start, removes the directories of that pattern in both places whose lock it
can take: their runs are dead; ``rowstore gc DIR`` lists and removes them too (:func:`sweep`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

__all__ = ["PREFIX", "LockedDir", "remove_stale", "sweep", "tree_bytes"]

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
    return sweep(parent)[0]


def sweep(
    parent: str, *, dry_run: bool = False, sizes: dict[str, int] | None = None
) -> tuple[list[str], list[str]]:
    """``(stale, live)``: the shuffle directories in ``parent`` whose lock can be taken (their
    run is dead; removed unless ``dry_run``) and those a live run holds (left alone). A symlink
    of that name is neither (never followed); removal does not follow links inside either.
    ``sizes``: filled with each stale directory's bytes (:func:`tree_bytes`), measured first."""
    stale: list[str] = []
    live: list[str] = []
    try:
        names = sorted(os.listdir(parent))
    except FileNotFoundError:
        return stale, live
    for name in names:
        if not name.startswith(PREFIX):
            continue
        path = os.path.join(parent, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not a directory
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live.append(path)
                continue
            if sizes is not None:
                sizes[path] = tree_bytes(path)
            if not dry_run:
                shutil.rmtree(path, ignore_errors=True)
            stale.append(path)
        finally:
            os.close(fd)
    return stale, live


def tree_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (links not followed): what removing it frees."""
    total = 0
    for top, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(top, f)).st_size
            except OSError:
                pass
    return total
