"""Atomic commit of a file: write a temporary file beside the target, then move it into place.

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
"""

from __future__ import annotations

import os
import secrets
import shutil

__all__ = ["AtomicFile", "fsync_path", "fsync_directory", "TMP_SUFFIX"]

#: Suffix of temporary files (a crashed writer's leftovers are recognisable by it).
TMP_SUFFIX = ".rowstore-tmp"


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


def _create_temp(target: str) -> str:
    directory = os.path.dirname(os.path.abspath(target))
    prefix = os.path.join(directory, "." + os.path.basename(target) + ".")
    for _ in range(100):
        tmp = prefix + secrets.token_hex(6) + TMP_SUFFIX
        try:
            # 0o666 less the umask, like any new file (mkstemp's 0o600 survived the rename, so
            # datasets were unreadable by the group and others).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"could not create a temporary file beside {target!r}")


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
        Start :attr:`tmp` as a copy of this file (``copy_file_range``/reflink where the
        filesystem offers it) with its permission bits.

    Attributes
    ----------
    target : str
        The path that :meth:`commit` replaces (the symlink's target for a symlink).
    tmp : str
        The temporary file to write (:class:`ValueError` once committed or aborted).
    done : bool
        Whether :meth:`commit` or :meth:`abort` has run (successfully, for a commit).

    Not thread-safe. The caller closes its own handles on :attr:`tmp` before :meth:`commit`.
    """

    def __init__(self, target: str | os.PathLike, *, exclusive: bool = False, copy_from: str | os.PathLike | None = None):
        self.target = _resolve(os.fspath(target))
        self.exclusive = exclusive
        self._tmp: str | None = _create_temp(self.target)
        if copy_from is not None:
            try:
                shutil.copyfile(copy_from, self._tmp)  # copy_file_range/sendfile: in-kernel, reflink on CoW
                shutil.copymode(copy_from, self._tmp)  # the new file keeps the old one's permissions
            except BaseException:
                self.abort()
                raise

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
        fsync_path(tmp)
        if self.exclusive:
            os.link(tmp, self.target)  # fails if the target appeared meanwhile: never overwrite
            os.unlink(tmp)
        else:
            os.replace(tmp, self.target)
        self._tmp = None
        fsync_directory(os.path.dirname(os.path.abspath(self.target)))

    def abort(self) -> None:
        """Remove :attr:`tmp` (idempotent); :attr:`target` is left as it was."""
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

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
