"""Where a dataset or file lives: the one object that the format layer reads through and a reader
or writer gets its store and destination from (:func:`rowstore.storage.locate` makes it).

A :class:`Location` names a path or URL and answers, by path under it (shard files, manifests,
sidecars):

* small whole objects (:meth:`~Location.read_small`, bounded), existence, listings;
* a file opened for ranged reads (:meth:`~Location.open_file`: its size, identity and bytes);
* the :class:`~rowstore.storage.base.ChunkStore` that reads a dataset's shards
  (:meth:`~Location.chunk_store`) and the :class:`~rowstore.storage.base.Destination` that
  writes under it (:meth:`~Location.destination`).

:class:`LocalLocation` reads with descriptors (``O_NONBLOCK`` + ``fstat`` through
:func:`rowstore.storage.inputs.open_regular`, then ``pread``); :class:`RemoteLocation` with
an fsspec client's retried, bounded, ETag-conditional requests. Both pickle by their path and
options.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError, MissingObjectError
from rowstore.storage.base import ChunkStore, Destination
from rowstore.storage.inputs import open_regular
from rowstore.storage.local import LocalStore, file_identity, pin_identities
from rowstore.storage.localdir import LocalDir
from rowstore.storage.objstore import Client, RangeFile, RemoteOptions
from rowstore.storage.url import join, looks_like_file

__all__ = ["Location", "LocalLocation", "RemoteLocation", "LocalFile", "RemoteFile"]

#: The most stored bytes one ranged request of :meth:`RemoteFile.load_chunks` asks for (more
#: for a larger chunk): a whole-object scan reads an object this much at a time.
SCAN_REQUEST_BYTES = 8 << 20


class Location(abc.ABC):
    """A local path or a URL, and how to read what lies under it.

    Attributes
    ----------
    path : str
        The path or URL (a ``file://`` URL read as local files is its path).
    local : bool
        Whether it is on the local filesystem (what works on local files only, such as
        parsing a file's HDF5 part with libhdf5 in a child process, asks this).

    Paths given to the methods are full paths or URLs under this location (:meth:`join`
    makes them). A missing object is a :class:`~rowstore.errors.MissingObjectError`.
    """

    path: str
    local: bool

    @abc.abstractmethod
    def join(self, rel: str) -> str:
        """The full path of ``rel`` (``/``-separated) under :attr:`path`."""

    @abc.abstractmethod
    def at(self, path: str) -> Location:
        """The location of ``path`` (another file of the same store), with the same options."""

    @abc.abstractmethod
    def is_dir(self, path: str | None = None) -> bool | None:
        """Whether ``path`` (default :attr:`path`) is a directory: True or False where the
        store has directories, None where only a read can tell (an object store prefix)."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether an object or file ``path`` exists."""

    @abc.abstractmethod
    def info(self, path: str) -> dict:
        """``{"size": int, "etag": str or None}`` of the object or file ``path``."""

    @abc.abstractmethod
    def get(self, path: str, start: int, end: int, etag: str | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (a short read is a
        :class:`~rowstore.errors.FormatError`); ``etag``: only of that version (objects)."""

    @abc.abstractmethod
    def read_small(self, path: str, limit: int) -> bytes:
        """The whole object ``path``, refused (:class:`~rowstore.errors.FormatError`, before
        reading) above ``limit`` bytes."""

    @abc.abstractmethod
    def list(self, path: str | None = None) -> list[str]:
        """The names (not paths) directly under ``path`` (default :attr:`path`); ``[]`` if
        there is none."""

    @abc.abstractmethod
    def open_file(self, path: str | None = None) -> Any:
        """``path`` (default :attr:`path`) opened for ranged reads: a :class:`LocalFile` or
        :class:`RemoteFile` (a context manager)."""

    def pin(self, paths: Sequence[str], file_ids: Sequence[tuple]) -> tuple[tuple, ...]:
        """``file_ids`` of files named by a manifest (``(size,)``), made as strict as the store
        can check later: a local file's full identity now (a shard replaced later under the
        same name and size is refused, not read)."""
        return tuple(file_ids)

    def chunk_store(
        self,
        paths: Sequence[str],
        file_ids: Sequence[tuple],
        *,
        etags: Mapping[int, str | None] | None = None,
        max_open: int | None = None,
    ) -> ChunkStore:
        """The store that reads the chunks of these shards (files under this location):
        ``file_ids`` what each must still be, ``etags`` those already learnt (remote),
        ``max_open`` the descriptors kept open at most (local)."""
        return self._store(paths, file_ids, etags, max_open)

    @abc.abstractmethod
    def _store(self, paths: Any, file_ids: Any, etags: Any, max_open: Any) -> ChunkStore: ...

    @abc.abstractmethod
    def destination(self, *, durable: bool = True) -> Destination:
        """Where a writer writes under :attr:`path` (:func:`rowstore.storage.destination`)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


class LocalLocation(Location):
    """A local path (see :class:`Location`)."""

    local = True

    def __init__(self, path: str):
        self.path = path

    def join(self, rel: str) -> str:
        return os.path.join(self.path, *rel.split("/"))

    def at(self, path: str) -> LocalLocation:
        return LocalLocation(path)

    def is_dir(self, path: str | None = None) -> bool:
        return os.path.isdir(self.path if path is None else path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def info(self, path: str) -> dict:
        try:
            return {"size": os.stat(path).st_size, "etag": None}
        except FileNotFoundError:
            raise MissingObjectError(f"{path!r} is missing", path=path) from None

    def get(self, path: str, start: int, end: int, etag: str | None = None) -> bytes:
        with self._open_object(path) as f:
            return f.read(start, end)

    def read_small(self, path: str, limit: int) -> bytes:
        with self._open_object(path) as f:
            if f.size > limit:
                raise FormatError(
                    f"{path!r}: has {f.size} bytes, more than the {limit} expected of it",
                    path=path,
                )
            data = os.pread(f.fd, f.size + 1, 0)  # sized by the file, not the limit
        if len(data) > f.size:
            raise FormatError(f"{path!r}: grew while being read", path=path)
        return data

    def list(self, path: str | None = None) -> list[str]:
        try:
            return os.listdir(self.path if path is None else path)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def open_file(self, path: str | None = None) -> LocalFile:
        return LocalFile(self.path if path is None else path)

    def _open_object(self, path: str) -> LocalFile:
        try:
            return LocalFile(path)
        except FileNotFoundError:
            raise MissingObjectError(f"{path!r} is missing", path=path) from None

    def pin(self, paths: Sequence[str], file_ids: Sequence[tuple]) -> tuple[tuple, ...]:
        return pin_identities(paths, file_ids)

    def _store(self, paths: Any, file_ids: Any, etags: Any, max_open: Any) -> ChunkStore:
        return LocalStore(paths, file_ids, max_open)

    def destination(self, *, durable: bool = True) -> Destination:
        return LocalDir(self.path, durable=durable)

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]


class RemoteLocation(Location):
    """A URL read through an fsspec client (see :class:`Location`).

    Parameters
    ----------
    url : str
    options : RemoteOptions
        ``storage_options`` and the retry, bound and cache settings of every request.
    """

    local = False

    def __init__(self, url: str, options: RemoteOptions, client: Client | None = None):
        self.path = url
        self.options = options
        self._client = client

    @property
    def client(self) -> Client:
        """The client of this location's store (made on first use, shared by :meth:`at`)."""
        if self._client is None:
            self._client = Client(self.path, self.options)
        return self._client

    def join(self, rel: str) -> str:
        return join(self.path, rel)

    def at(self, path: str) -> RemoteLocation:
        return RemoteLocation(path, self.options, self.client)

    def is_dir(self, path: str | None = None) -> bool | None:
        return False if looks_like_file(self.path if path is None else path) else None

    def exists(self, path: str) -> bool:
        try:
            self.client.cat_small(path, 0)
        except MissingObjectError:
            return False
        except FormatError:  # larger than 0 bytes: it exists
            return True
        return True

    def info(self, path: str) -> dict:
        return self.client.info(path)

    def get(self, path: str, start: int, end: int, etag: str | None = None) -> bytes:
        return self.client.get(path, start, end, etag)

    def read_small(self, path: str, limit: int) -> bytes:
        return self.client.cat_small(path, limit)

    def list(self, path: str | None = None) -> list[str]:
        return self.client.ls(self.path if path is None else path)

    def open_file(self, path: str | None = None) -> RemoteFile:
        return RemoteFile(self, self.path if path is None else path)

    def _store(self, paths: Any, file_ids: Any, etags: Any, max_open: Any) -> ChunkStore:
        from rowstore.storage.remote import RemoteStore

        return RemoteStore(paths, file_ids, self.options, etags)

    def destination(self, *, durable: bool = True) -> Destination:
        if self.path.startswith(("http://", "https://")):
            raise ValueError(
                f"{self.path!r}: HTTP is read-only; write to a local path or an object store "
                "(s3://, gs://...)"
            )
        from rowstore.storage.remote import RemoteDir

        return RemoteDir(self.path, self.options.storage_options)

    @property
    def requests(self) -> int:
        """Requests made through this location's client in this process."""
        return self.client.requests

    def __getstate__(self) -> dict:
        return {"path": self.path, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["options"])  # type: ignore[misc]


class LocalFile:
    """A local file opened for reading (``O_NONBLOCK`` + ``fstat``: regular files only).

    Attributes
    ----------
    path : str
    size : int
    ident : tuple
        Its :func:`~rowstore.storage.local.file_identity` now.
    fd : int
        The descriptor.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd, st = open_regular(path)
        self.size = st.st_size
        self.ident = file_identity(st)

    def load_chunks(
        self, offsets: Any, stored: Any, checksums: Any, *, codec: Any, dst: Any, **kw: Any
    ) -> int:
        """Chunks at ``offsets`` (``stored`` bytes each) read, CRC-checked and decompressed
        into ``dst`` (``raw_size``, ``what``: as for :func:`rowstore.kernels.load_chunks`),
        all of them in one kernel call; how many (a failure is a
        :class:`~rowstore.errors.KernelError` with the failing chunk's index)."""
        scratch = np.empty(int(stored.max()), np.uint8)
        kernels.load_chunks(
            self.fd,
            offsets,
            stored,
            checksums,
            codec=codec,
            verify=True,
            dst=dst,
            scratch=scratch,
            **kw,
        )
        return len(offsets)

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)``; a short read is a :class:`~rowstore.errors.FormatError`."""
        out = os.pread(self.fd, end - start, start)
        if len(out) != end - start:
            raise FormatError(
                f"{self.path!r}: short read of bytes {start}-{end} (the file shrank while opened?)",
                path=self.path,
            )
        return out

    def tail(self, least: int) -> bytes:
        """The file's last bytes, at least ``least`` of them where the file has that many
        (exactly ``least``: a local read costs a system call, not a round trip)."""
        return self.read(self.size - least, self.size) if self.size >= least else b""

    def cached_meta(self) -> bytes | None:
        """Metadata kept from an earlier open of this same file (none for local files)."""
        return None

    def keep_meta(self, blob: bytes) -> None:
        """Keep ``blob`` for the next open of this same file (nothing for local files)."""

    def hdf5(self, *, image: bytes | None = None, tail: bytes | None = None) -> Any:
        """What h5py opens to parse the file's HDF5 metadata (the path, for libhdf5's own
        reads), with ``read_range`` for checks before it, and ``requests`` and ``image()`` for
        :meth:`keep_meta`."""
        return _LocalHDF5(self)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _LocalHDF5:
    requests = 0

    def __init__(self, f: LocalFile):
        self.file = f.path
        self.read_range = f.read

    def image(self) -> bytes:  # pragma: no cover - requests is 0: never asked for
        return b""

    def close(self) -> None:
        pass


class _RemoteHDF5:
    def __init__(self, rf: RangeFile):
        self.file = rf
        self.read_range = rf.read_range
        self.image = rf.image
        self.close = rf.close

    @property
    def requests(self) -> int:
        return self.file.requests


class RemoteFile:
    """An object opened for ranged reads: one HEAD for its size and ETag, then every read
    conditional on that ETag (a replaced object is an
    :class:`~rowstore.errors.ObjectChangedError`, never a mix of two versions).

    Attributes
    ----------
    path : str
    size : int
    ident : tuple
        ``(size, etag)``.
    """

    def __init__(self, location: RemoteLocation, url: str):
        self.path, self._client = url, location.client
        meta = self._client.info(url)
        self.size, self.etag = meta["size"], meta["etag"]
        self.ident = (self.size, self.etag)
        self._cache = None
        if location.options.cache and self.etag:
            from rowstore.storage.cache import BlockCache

            self._cache = BlockCache(location.options.cache, location.options.cache_bytes)

    def load_chunks(
        self, offsets: Any, stored: Any, checksums: Any, *, codec: Any, dst: Any, **kw: Any
    ) -> int:
        """The first chunks at ``offsets`` that one ranged request of at most
        :data:`SCAN_REQUEST_BYTES` holds (or the first chunk alone), CRC-checked and
        decompressed into ``dst`` (``raw_size``, ``what``: as for
        :func:`rowstore.kernels.decode_chunks`); how many."""
        lo = int(offsets[0])
        hi = lo + int(stored[0])
        k = 1
        while (
            k < len(offsets)
            and int(offsets[k]) >= lo
            and int(offsets[k]) + int(stored[k]) - lo <= SCAN_REQUEST_BYTES
        ):
            hi = max(hi, int(offsets[k]) + int(stored[k]))
            k += 1
        src = np.frombuffer(self.read(lo, hi), np.uint8)
        raw = kw["raw_size"]
        kernels.decode_chunks(
            src,
            offsets[:k] - lo,
            stored[:k],
            checksums[:k],
            codec=codec,
            verify=True,
            dst=dst[: k * raw],
            **kw,
        )
        return k

    def read(self, start: int, end: int) -> bytes:
        return self._client.get(self.path, start, end, self.etag)

    def tail(self, least: int) -> bytes:
        """The object's last bytes: at least ``least``, and the whole last MiB (page aligned,
        one request), where a v2 footer or a v1 file's metadata lies."""
        t0 = max(0, self.size - max(least, RangeFile.TAIL)) // RangeFile.PAGE * RangeFile.PAGE
        return self.read(t0, self.size) if self.size else b""

    def cached_meta(self) -> bytes | None:
        """Metadata kept by an earlier open of this same object (same size and ETag) in the
        local cache (``cache=``), else None."""
        if self._cache is None:
            return None
        return self._cache.get_meta(self.path, self.ident)

    def keep_meta(self, blob: bytes) -> None:
        if self._cache is not None:
            self._cache.put_meta(self.path, self.ident, blob)

    def hdf5(self, *, image: bytes | None = None, tail: bytes | None = None) -> Any:
        """An in-memory image of the byte ranges the object's HDF5 metadata occupies
        (:class:`~rowstore.storage.objstore.RangeFile`: ``image`` from :meth:`cached_meta`, or
        ``tail`` already read and the head), for h5py: libhdf5 never sees the network."""
        return _RemoteHDF5(
            RangeFile(self._client, self.path, self.size, self.etag, image=image, tail_data=tail)
        )

    def close(self) -> None:
        pass

    def __enter__(self) -> RemoteFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
