"""The whole rowstore exception hierarchy.

Every error derives from :class:`RowstoreError` and from the builtin a caller would naturally
catch (``SchemaError`` is a ``ValueError``, ...), so ``except ValueError`` keeps working.
Errors carry their context as attributes (``field``, ``row``, ``path``, ``block``).
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

__all__ = [
    "RowstoreError",
    "SchemaError",
    "StateError",
    "RowValidationError",
    "CodecError",
    "CodecNotAvailableError",
    "FormatError",
    "FormatVersionError",
    "ChecksumError",
    "StaleFileError",
    "KernelError",
    "KernelChecksumError",
    "KernelIOError",
    "MissingObjectError",
    "CommitConflictError",
    "WriterClosedError",
    "ConcurrentWriterError",
    "RemoteError",
    "ObjectChangedError",
    "AttrsError",
    "InputError",
    "OutsideRootError",
]


class RowstoreError(Exception):
    """Base class of every error rowstore raises.

    Errors pickle with their context attributes (for multiprocessing and DataLoader workers),
    whatever their constructor's keyword arguments.
    """

    def __reduce__(self):
        return (_restore, (type(self), self.args, self.__dict__))


def _restore(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class SchemaError(RowstoreError, ValueError):
    """A schema, or data checked against a schema, is invalid.

    Attributes
    ----------
    field : str or None
        The field concerned, when there is one.
    row : int or None
        The 0-based row number (within the dataset being written) when data was checked.
    """

    def __init__(self, message: str, *, field: str | None = None, row: int | None = None):
        super().__init__(message)
        self.field = field
        self.row = row


class RowValidationError(SchemaError, TypeError):
    """A row written does not match the schema (wrong dtype, shape, missing/unknown field, None
    in a non-nullable field...). Also a ``TypeError`` since most such mistakes are type errors."""


class CodecError(RowstoreError, ValueError):
    """A codec is unknown, misconfigured, or could not encode/decode a value."""

    def __init__(self, message: str, *, codec: str | None = None, field: str | None = None):
        super().__init__(message)
        self.codec = codec
        self.field = field


class CodecNotAvailableError(CodecError, ImportError):
    """A codec needs an optional dependency that is not installed."""


class FormatError(RowstoreError, ValueError):
    """A file is not a rowstore file, or it is corrupt or truncated.

    Attributes
    ----------
    path : str or None
    block : int or None
        The block where corruption was found, when known.
    field : str or None
        The field whose stored value is bad, when known.
    row : int or None
        The row (dataset row number) whose stored value is bad, when known.
    rows : (int, int) or None
        The ``[first, end)`` rows whose values a damaged chunk holds (``Layout.damage``).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        block: int | None = None,
        field: str | None = None,
        row: int | None = None,
        rows: tuple[int, int] | None = None,
    ):
        super().__init__(message)
        self.path = path
        self.block = block
        self.field = field
        self.row = row
        self.rows = rows


class FormatVersionError(FormatError):
    """A file was written by a format version this rowstore cannot read."""


class ChecksumError(FormatError):
    """The stored bytes of a block do not match the checksum in the block index."""


class StaleFileError(FormatError):
    """A local file a reader (re)opens is not the version it opened: replaced (another inode),
    rewritten or modified in place (another size or modification time). Its bytes are refused
    rather than read through the old version's index; open the dataset or file again to read
    the new version. ``path`` names the file."""


class MissingObjectError(FormatError, FileNotFoundError):
    """A file or object that should be there is not (a shard, a manifest, the pointer, a
    remote object): a :class:`FormatError` and a :class:`FileNotFoundError` (``errno`` is
    ``ENOENT``). ``path`` names what is missing."""

    def __new__(cls, *args: Any, **kw: Any) -> MissingObjectError:
        err = FileNotFoundError.__new__(cls, *args[:1])  # OSError's layout; a plain message
        err.errno = errno.ENOENT
        return err


class CommitConflictError(RowstoreError, RuntimeError):
    """Another commit published a version of the dataset while this one was being made, and
    this one could not be published on top of it (after its retries). Nothing of this commit
    is current; commit again. ``path`` names the dataset, ``version`` the one that won."""

    def __init__(self, message: str, *, path: str | None = None, version: int | None = None):
        super().__init__(message)
        self.path = path
        self.version = version


# -- the compiled kernels (rowstore.kernels) ------------------------------------------------
class KernelError(FormatError):
    """A kernel reported an error; ``code`` (a ``rowstore.kernels.KernelCode``) and ``index`` tell
    which
    and where, ``detail`` adds what the code documents (errno, a size, a header byte...);
    ``part``, for a kernel that reads several parts in one call (``pread_heap``'s fields), the
    failing part's position, else None."""

    part: int | None = None

    def __init__(self, message: str, *, code: int, index: int, detail: int, path=None, block=None):
        super().__init__(message, path=path, block=block)
        self.code = code
        self.index = index
        self.detail = detail


class KernelChecksumError(KernelError, ChecksumError):
    pass


class KernelIOError(KernelError, OSError):
    """A ``pread``/``preadv`` the kernel made failed (a failing disk: ``EIO``; a descriptor
    gone: ``EBADF``...): also the system's :class:`OSError`, ``errno`` the call's (``detail``),
    ``filename`` the file once known. ``except OSError`` catches it; it is not damage (a later
    read may succeed: nothing about the failure is kept)."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 1,
        index: int = -1,
        detail: int | None = None,
        path=None,
        block=None,
    ):
        if detail is None:  # rebuilt from its message alone (torch re-raises a worker's error so)
            found = re.search(r"read failed \(errno (\d+)", str(message))
            detail = int(found.group(1)) if found else 0
        super().__init__(message, code=code, index=index, detail=detail, path=path, block=block)
        if detail:  # OSError's own fields (its constructor did not see them: ours comes first)
            self.errno, self.strerror = detail, os.strerror(detail)
        self.filename = path

    def __str__(self) -> str:  # our message, not OSError's "[Errno 5] ..." (it names the block too)
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):
        state = {
            **self.__dict__,
            "errno": self.errno,
            "strerror": self.strerror,
            "filename": self.filename,
        }
        return (_restore_io, (type(self), self.args, state))


def _restore_io(cls: type[KernelIOError], args: tuple, state: dict) -> KernelIOError:
    err = OSError.__new__(cls)
    err.args = args
    for k in ("errno", "strerror", "filename"):
        setattr(err, k, state.pop(k, None))
    err.__dict__.update(state)
    return err


class AttrsError(RowstoreError, TypeError, ValueError):
    """A user attribute cannot be stored (not a JSON value, numpy array or numpy scalar); the
    message names it (``attrs['a'][2]``). Both a ``TypeError`` and a ``ValueError``."""


class StateError(RowstoreError, ValueError):
    """A saved resume state (a loader's ``state_dict``, a Grain iterator state, a
    ``tf.train.Checkpoint`` of a loader) is refused: not a rowstore state, a field of the wrong
    type or out of range, or saved for another dataset or order (resuming would not give the
    remaining rows).

    Attributes
    ----------
    field : str or None
        The state's key concerned (``"remaining"``, ``"dataset"``...), when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class WriterClosedError(RowstoreError, RuntimeError):
    """A writer was used after it was closed or aborted."""


class ConcurrentWriterError(RowstoreError, BlockingIOError):
    """Another writer (in this process or another) is writing the same path: one writer per
    path at a time. A ``BlockingIOError`` (an ``OSError``): retry once that writer is done.

    Attributes
    ----------
    path : str or None
        The path being written.
    """

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


# -- object storage (rowstore.storage.remote) -----------------------------------------------
class RemoteError(RowstoreError, OSError):
    """A read from object storage failed: a transient error that persisted through every retry,
    or one that no retry can fix (credentials refused, access denied).

    Attributes
    ----------
    url : str or None
        The object.
    start, end : int or None
        The byte range ``[start, end)`` requested, when the failure was a ranged read.
    attempts : int
        Requests made (1 when the error was not retried).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        start: int | None = None,
        end: int | None = None,
        attempts: int = 1,
    ):
        super().__init__(message)
        self.url = url
        self.start = start
        self.end = end
        self.attempts = attempts


class ObjectChangedError(FormatError):
    """A remote object differs (size or ETag) from the one the reader opened: it was replaced,
    and its bytes are refused rather than mixed with the old version's index."""


# -- inputs of ingest paths (rowstore.storage.inputs) ---------------------------------------
class InputError(RowstoreError, ValueError):
    """A file or name given to an ingest path (an image folder, a label CSV, Parquet files, a
    Hugging Face dataset) is refused: not a regular file (a FIFO, device, socket or
    directory), larger than its bound, text that does not decode, a value out of range.

    Attributes
    ----------
    path : str or None
        The file concerned.
    line : int or None
        The 1-based line of a text file (a label CSV), when known.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        super().__init__(message)
        self.path = path
        self.line = line


class OutsideRootError(InputError):
    """A name that becomes a path (a split name, an image or CSV path, a shard name) leads
    outside the directory it must stay in: an absolute name, a ``..`` component, or (unless
    links out are allowed) a symlink resolving elsewhere.

    Attributes
    ----------
    root : str or None
        The directory the name must stay in.
    name : str or None
        The name as given.
    real : str or None
        Where a symlink led, when one did.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        root: str | None = None,
        name: str | None = None,
        real: str | None = None,
    ):
        super().__init__(message, path=path, line=line)
        self.root = root
        self.name = name
        self.real = real
