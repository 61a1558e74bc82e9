"""Object storage: a store that fetches the block index's byte ranges by ranged requests.

Any fsspec URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``...) opens here;
libhdf5 never touches a remote file's data:

* a **dataset** is opened from its pointer, manifest and block-index sidecar: three requests
  (:func:`open_layout`);
* a **single file** is opened by reading the few byte ranges holding its HDF5 metadata (the
  superblock and group at the head, the indexes and attributes the writer puts at the tail)
  into memory, and parsing them with h5py on that in-memory image (:class:`RangeFile`: two
  requests for the files our writer makes, counted by ``RangeFile.requests``).

:class:`RemoteStore` serves ``load_chunks`` (the only read a remote store offers: ``direct`` is
False, so the gather always reads whole chunks) from bytes fetched into memory and decoded by
``kernels.decode_chunks``, the in-memory twin of ``load_chunks`` (same bounds, CRC-32 checked
always, whatever ``verify`` says). Its :class:`Scheduler` receives the epoch's chunks in order
(``Reader.batches`` hands it the same pure-function order the reader follows) and keeps a
bounded number of ranged GETs in flight ahead of the reader: memory is bounded by
``max_in_flight`` requests of at most ``merge_bytes`` each. Requests for one chunk coalesce;
adjacent chunks of one object merge into one request up to ``merge_bytes``.

Each process makes its own fsspec client on first use (fork- and spawn-safe; the store pickles
by URL and options). Transient failures (5xx, throttling, reset connections, short bodies, a
request stalled past ``timeout``) are retried with exponential backoff and jitter, then raised
as :class:`~rowstore.errors.RemoteError` naming the URL, byte range and attempts. Every object's
size (and ETag, where the protocol has one) is recorded when first used; requests carry
``If-Match`` (S3, HTTP), and a changed object is refused with
:class:`~rowstore.errors.ObjectChangedError`, never mixed with the index read at open.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError, ObjectChangedError, RemoteError
from rowstore.format import manifest as _manifest
from rowstore.format._url import is_url
from rowstore.format.index import Layout
from rowstore.format.shards import DatasetLayout

__all__ = ["RemoteOptions", "RemoteStore", "RangeFile", "Client", "open_layout", "is_url"]

#: Chunk key: (shard, byte offset, stored bytes).
Key = tuple[int, int, int]


@dataclass(frozen=True)
class RemoteOptions:
    """How a remote dataset is read (``rowstore.open(url, remote=...)`` takes these as a dict).

    Attributes
    ----------
    storage_options : dict
        Passed to ``fsspec.core.url_to_fs`` (credentials, ``client_kwargs={"endpoint_url": ...}``,
        ``anon``...).
    max_in_flight : int
        Ranged requests kept in flight ahead of the reader. Default 32: by Little's law, 32
        requests of 1 MiB with ~30 ms first-byte latency and ~5 ms transfer sustain ~900 MB/s,
        more than two cores can decode; raise it for higher latency.
    merge_bytes : int
        Adjacent chunks of one object are fetched by one request up to this size (4 MiB).
        Memory held by prefetching is at most ``max_in_flight * merge_bytes``.
    retries : int
        Retries of a transient failure (5 by default: 6 attempts), with exponential backoff
        from ``backoff`` seconds (jittered 0.5-1.5x, capped at ``max_backoff``).
    timeout : float
        Seconds a single request may take before it counts as stalled and is retried (async
        protocols: s3, gs, az, http; a synchronous protocol such as ``file://`` has no timeout).
    cache : str or None
        A directory for the local block cache (see :mod:`rowstore.reader._cache`); None: off.
    cache_bytes : int
        The cache's size limit (least recently used blocks are evicted first).
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    max_in_flight: int = 32
    merge_bytes: int = 4 << 20
    retries: int = 5
    backoff: float = 0.05
    max_backoff: float = 2.0
    timeout: float = 30.0
    cache: str | None = None
    cache_bytes: int = 10 << 30

    @classmethod
    def make(cls, storage_options: Mapping[str, Any] | None, cache: Any, remote: Mapping[str, Any] | None) -> RemoteOptions:
        kw = dict(remote or {})
        unknown = set(kw) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown remote option(s) {sorted(unknown)}; expected {sorted(cls.__dataclass_fields__)}")
        if storage_options is not None:
            if not isinstance(storage_options, Mapping):
                raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
            kw["storage_options"] = dict(storage_options)
        if cache is not None:
            kw["cache"] = os.fspath(cache)
        opts = cls(**kw)
        for name in ("max_in_flight", "merge_bytes", "cache_bytes"):
            v = getattr(opts, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"remote option {name} must be a positive int, got {v!r}")
        if not isinstance(opts.retries, int) or opts.retries < 0:
            raise ValueError(f"remote option retries must be an int >= 0, got {opts.retries!r}")
        if not opts.timeout > 0 or not opts.backoff >= 0:
            raise ValueError("remote options timeout must be > 0 and backoff >= 0")
        return opts


# -- errors ----------------------------------------------------------------------------------
def _status(exc: BaseException) -> int | None:
    """The HTTP status an fsspec/aiohttp/botocore error carries, if any."""
    for attr in ("status", "status_code", "code"):
        v = getattr(exc, attr, None)
        if isinstance(v, int):
            return v
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        v = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(v, int):
            return v
    return None


def _changed(exc: BaseException) -> bool:
    """A failed precondition (If-Match): the object is not the one opened."""
    if _status(exc) == 412:
        return True
    text = f"{type(exc).__name__} {exc}"
    # s3fs turns S3's PreconditionFailed into OSError(EINVAL) with S3's message.
    return any(m in text for m in ("PreconditionFailed", "Precondition Failed", "pre-conditions you specified"))


def _permanent(exc: BaseException) -> bool:
    """Errors no retry can fix: a missing object, refused credentials or access."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return True
    status = _status(exc)
    return status in (400, 401, 403, 404, 405, 416)


class _Short(Exception):
    def __init__(self, got: int, want: int):
        super().__init__(f"a response of {got} bytes for a range of {want} (short body or the server ignored Range)")


class _Changed(Exception):
    pass


# -- the client: one per process ---------------------------------------------------------------
class Client:
    """An fsspec filesystem for one URL's protocol, made in this process on first use, with
    ranged GETs retried as :class:`RemoteOptions` says. Thread-safe."""

    def __init__(self, url: str, options: RemoteOptions):
        self.url = url
        self.options = options
        self._lock = threading.Lock()
        self._pid = -1
        self._fs: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self.requests = 0  # ranged GETs made by this process (tests and the bench count them)

    def __getstate__(self) -> dict:
        return {"url": self.url, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["url"], state["options"])  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._fs, self._pool, self.requests = self._make_fs(), None, 0
                    self._pid = os.getpid()
        return self._fs

    def _make_fs(self) -> Any:
        try:
            import fsspec.core
        except ImportError:  # pragma: no cover - the remote extra is declared
            raise ImportError("reading URLs needs fsspec (and s3fs for s3://, aiohttp for http://): "
                              "pip install 'rowstore[remote]'") from None
        so = dict(self.options.storage_options)
        proto = self.url.split("://", 1)[0]
        if proto in ("s3", "s3a") and "config_kwargs" not in so:
            # One attempt per request in botocore and s3fs: the retries are ours (counted, jittered).
            so["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
        fs, _ = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **so)
        if proto in ("s3", "s3a"):
            fs.retries = 1
        return fs

    def path(self, url: str) -> str:
        """What the filesystem calls ``url`` (fsspec strips the protocol for most)."""
        fs = self.fs
        return fs._strip_protocol(url) if not url.startswith(("http://", "https://")) else url

    @property
    def is_async(self) -> bool:
        return bool(getattr(self.fs, "async_impl", False))

    # -- metadata --------------------------------------------------------------------------
    def info(self, url: str) -> dict:
        """Size and ETag (``{"size": int, "etag": str | None}``) of an object; a missing one is
        a :class:`FormatError`, refused credentials a :class:`RemoteError` (both at once)."""
        def call() -> Any:
            fs = self.fs
            if hasattr(fs, "invalidate_cache"):
                fs.invalidate_cache(self.path(url))
            try:
                return fs.info(self.path(url))
            except FileNotFoundError:
                if url.startswith(("http://", "https://")):
                    # fsspec's HTTP info says "not found" for any failed HEAD: one byte tells
                    # a refusal (401/403) or a server error from a missing object.
                    fs.cat_file(url, start=0, end=1)
                raise

        info = self._retrying(url, None, None, call)
        if info.get("type") == "directory":
            raise FormatError(f"{url!r} is a directory of objects, not a rowstore file or dataset", path=url)
        size = info.get("size")
        if not isinstance(size, int):
            raise RemoteError(f"{url!r}: the server does not tell the object's size (no Content-Length)", url=url)
        etag = info.get("ETag") or info.get("etag")
        return {"size": size, "etag": str(etag) if etag else None}

    def cat_small(self, url: str, limit: int) -> bytes:
        """The whole object at ``url`` (a manifest, pointer or sidecar) in one request, refused
        above ``limit`` bytes (one byte more is asked for, no more is read):
        :func:`rowstore.format.manifest.load`'s ``read``."""
        data = self.submit(url, 0, limit + 1, short_ok=True).result()
        if len(data) > limit:
            raise FormatError(f"{url!r}: has more than the {limit} bytes a manifest may hold: not a rowstore dataset "
                              f"manifest", path=url)
        return data

    # -- ranged reads ------------------------------------------------------------------------
    def get(self, url: str, start: int, end: int, etag: str | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (blocking)."""
        return self.submit(url, start, end, etag).result()

    def submit(self, url: str, start: int, end: int, etag: str | None = None, *, short_ok: bool = False) -> Future:
        """Start fetching bytes ``[start, end)`` of ``url``: a future of ``bytes`` (exactly that
        many, or up to that many with ``short_ok``), or of the error after the retries."""
        fs = self.fs
        if self.is_async:
            return asyncio.run_coroutine_threadsafe(self._get_async(url, start, end, etag, short_ok), fs.loop)
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self.options.max_in_flight,
                                                    thread_name_prefix="rowstore-fetch")
        def once() -> bytes:
            self.requests += 1
            return self._check(fs.cat_file(self.path(url), start=start, end=end), start, end, short_ok)

        return self._pool.submit(self._retrying, url, start, end, once)

    @staticmethod
    def _check(data: bytes, start: int, end: int, short_ok: bool = False) -> bytes:
        if len(data) > end - start or len(data) < end - start and not short_ok:
            raise _Short(len(data), end - start)
        return data

    async def _get_once(self, url: str, start: int, end: int, etag: str | None, short_ok: bool) -> bytes:
        fs = self.fs
        self.requests += 1
        proto = url.split("://", 1)[0]
        if proto in ("s3", "s3a") and etag and hasattr(fs, "_call_s3"):
            bucket, key, _ = fs.split_path(self.path(url))
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                     IfMatch=etag)
            try:
                data = await resp["Body"].read()
            finally:
                resp["Body"].close()
        elif proto in ("http", "https") and etag:
            data = await fs._cat_file(url, start=start, end=end, headers={"If-Match": etag})
        else:
            data = await fs._cat_file(self.path(url), start=start, end=end)
        return self._check(data, start, end, short_ok)

    async def _get_async(self, url: str, start: int, end: int, etag: str | None, short_ok: bool) -> bytes:
        o = self.options
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.wait_for(self._get_once(url, start, end, etag, short_ok), o.timeout)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - classified below
                err = self._classify(exc, url, start, end, attempt)
                if err is not None:
                    raise err from exc
            await asyncio.sleep(self._delay(attempt))

    def _retrying(self, url: str, start: int | None, end: int | None, call: Callable[[], Any]) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except BaseException as exc:  # noqa: BLE001 - classified below
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                err = self._classify(exc, url, start, end, attempt)
                if err is not None:
                    raise err from exc
            time.sleep(self._delay(attempt))

    def _delay(self, attempt: int) -> float:
        o = self.options
        return min(o.max_backoff, o.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)

    def _classify(self, exc: BaseException, url: str, start: int | None, end: int | None,
                  attempt: int) -> BaseException | None:
        """None to retry, else the error to raise."""
        where = f"{url!r}" + (f" bytes {start}-{end - 1}" if start is not None and end is not None else "")
        if isinstance(exc, (FormatError, RemoteError)):
            return exc
        if _changed(exc):
            return ObjectChangedError(f"{where}: the object changed since it was opened (its ETag no longer "
                                      f"matches); open it again to read the new version", path=url)
        if isinstance(exc, FileNotFoundError) or _status(exc) == 404 or "NoSuchKey" in str(exc):
            return FormatError(f"{url!r} is missing", path=url)
        if _status(exc) == 416 or "InvalidRange" in str(exc):
            return ObjectChangedError(f"{where}: the object is shorter than when it was opened (replaced or "
                                      f"truncated); open it again", path=url)
        if _permanent(exc):
            return RemoteError(f"{where}: access refused ({type(exc).__name__}: {exc}); check the credentials and "
                               f"storage_options", url=url, start=start, end=end, attempts=attempt)
        if attempt > self.options.retries:
            kind = "stalled past the timeout" if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else \
                f"{type(exc).__name__}: {exc}"
            return RemoteError(f"{where}: failed after {attempt} attempts ({kind})", url=url, start=start, end=end,
                               attempts=attempt)
        return None


# -- a single remote file's metadata -------------------------------------------------------------
class RangeFile:
    """A read-only file object over a remote object for h5py's metadata reads: pages of
    ``page`` bytes fetched on demand (and kept), the head and tail fetched first together.

    Our writer puts the superblock and the group's object header at the head of a file and the
    indexes and attributes (written at close) at its tail, so a file opens in two requests;
    ``requests`` counts them. Memory: the pages read (the metadata), never the blocks.
    """

    def __init__(self, client: Client, url: str, size: int, etag: str | None, *, head: int = 1 << 18,
                 tail: int = 1 << 20, page: int = 1 << 16):
        self.client, self.url, self.size, self.etag, self.page = client, url, size, etag, page
        self.pos = 0
        self.requests = 0
        self.fetched = 0
        self._have: dict[int, bytes] = {}  # page number -> bytes
        spans = [(0, min(size, head))]
        t0 = max(0, size - tail) // page * page
        if t0 < spans[0][1]:
            spans = [(0, size)]
        elif size:
            spans.append((t0, size))
        self._fetch(spans)

    def _fetch(self, spans: list[tuple[int, int]]) -> None:
        futs = [(a, self.client.submit(self.url, a, b, self.etag)) for a, b in spans if b > a]
        for a, fut in futs:
            data = fut.result()
            self.requests += 1
            self.fetched += len(data)
            for k in range(0, len(data), self.page):
                self._have[(a + k) // self.page] = data[k : k + self.page]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        a, b = self.pos, min(self.size, self.pos + n)
        if b <= a:
            return b""
        first, last = a // self.page, (b - 1) // self.page
        missing = [p for p in range(first, last + 1) if p not in self._have]
        if missing:  # one request per run of missing pages
            runs, lo = [], missing[0]
            for i, p in enumerate(missing):
                if i + 1 == len(missing) or missing[i + 1] != p + 1:
                    runs.append((lo * self.page, min(self.size, (p + 1) * self.page)))
                    lo = missing[i + 1] if i + 1 < len(missing) else p
            self._fetch(runs)
        out = b"".join(self._have[p] for p in range(first, last + 1))
        off = a - first * self.page
        self.pos = b
        return out[off : off + (b - a)]

    def readinto(self, buf: Any) -> int:
        data = self.read(len(memoryview(buf).cast("B")))
        memoryview(buf).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._have.clear()


# -- opening -------------------------------------------------------------------------------------
def _looks_like_file(url: str) -> bool:
    return url.lower().rstrip("/").endswith((".h5", ".hdf5", ".hdf"))


def open_layout(url: str, options: RemoteOptions, version: int | None = None) -> tuple[DatasetLayout, dict]:
    """The layout of the dataset or single file at ``url``, and what was learnt about its
    objects (``{"etags": {shard: etag}, "requests": n}``)."""
    client = Client(url, options)
    url = url.rstrip("/") if not _looks_like_file(url) else url
    if not _looks_like_file(url):
        try:
            m = _manifest.load(url, version, read=client.cat_small)
        except FormatError as exc:
            if version is not None or "is missing" not in str(exc) or _manifest.POINTER not in str(exc):
                raise
        else:
            return DatasetLayout.from_manifest(m), {"etags": {}, "requests": client.requests}
    if version is not None:
        raise ValueError(f"{url!r} is a file: version= applies to datasets")
    meta = client.info(url)
    layout = open_file_layout(client, url, meta)
    return DatasetLayout.from_files([layout], path=url), {"etags": {0: meta["etag"]}, "requests": client.requests}


def open_file_layout(client: Client, url: str, meta: dict) -> Layout:
    """A single remote file's :class:`Layout`, parsed by h5py from an in-memory image of the
    byte ranges its metadata occupies (:class:`RangeFile`); no block is read."""
    import h5py

    rf = RangeFile(client, url, meta["size"], meta["etag"])
    try:
        with h5py.File(rf, "r") as f:
            return Layout.from_h5(f, url, meta["size"], (meta["size"], meta["etag"]))
    except OSError as exc:
        if isinstance(exc, RemoteError):
            raise
        raise FormatError(f"{url!r} is not an HDF5 file, or it is truncated or corrupt: {exc}", path=url) from exc
    finally:
        rf.close()


# -- the store -----------------------------------------------------------------------------------
_STORES: weakref.WeakSet[RemoteStore] = weakref.WeakSet()


class RemoteStore:
    """The stored bytes of a dataset's shard objects, by ranged requests (the
    :class:`~rowstore.reader._store.LocalStore` interface, ``load_chunks`` only).

    Parameters
    ----------
    paths : sequence of str
        The shard URLs.
    file_ids : sequence of tuple
        Per shard ``(size,)`` (from a manifest) or ``(size, etag)`` (a file opened directly):
        checked against the object before its first read in each process.
    options : RemoteOptions
    etags : dict, optional
        ETags already learnt (shard -> etag), kept through pickling so that workers compare
        against what the parent saw.

    Notes
    -----
    ``direct`` is False: rows and payloads are always cut from whole chunks, each fetched,
    CRC-checked and decompressed (``kernels.decode_chunks``, GIL released). Thread-safe; the
    fsspec client is made per process on first use, so the store survives fork and pickling.
    """

    direct = False
    max_open = 1 << 30

    def __init__(self, paths: Sequence[str], file_ids: Sequence[tuple], options: RemoteOptions,
                 etags: Mapping[int, str | None] | None = None):
        self.paths = tuple(paths)
        self.file_ids = tuple(file_ids) or ((),) * len(self.paths)
        self.options = options
        self._etags: dict[int, str | None] = dict(etags or {})
        self._reset()
        _STORES.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._client = Client(self.paths[0] if self.paths else "file://", self.options)
        self.scheduler: Scheduler | None = None
        self._cache = None
        if self.options.cache:
            from rowstore.reader._cache import BlockCache

            self._cache = BlockCache(self.options.cache, self.options.cache_bytes)

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self.paths, "file_ids": self.file_ids, "options": self.options, "etags": dict(self._etags)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["paths"], state["file_ids"], state["options"], state["etags"])  # type: ignore[misc]

    @property
    def path(self) -> str:
        return self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} shard objects"

    @property
    def client(self) -> Client:
        if self._pid != os.getpid():
            self._reset()
        return self._client

    @property
    def requests(self) -> int:
        """Ranged GETs this process made so far."""
        return self.client.requests

    @property
    def is_open(self) -> bool:
        return False

    def open_count(self) -> int:
        return 0

    def close(self) -> None:
        """Stop prefetching (what is in flight finishes and is dropped)."""
        sched, self.scheduler = self.scheduler, None
        if sched is not None:
            sched.stop()

    # -- object identity ---------------------------------------------------------------------
    def etag(self, s: int) -> str | None:
        """The ETag recorded when shard ``s`` was opened (a single file: its HEAD at open), sent
        as ``If-Match`` with every request; None for a dataset's shards (immutable by the
        format; the manifest records their sizes and every block's CRC is checked)."""
        want = self.file_ids[s]
        return self._etags.get(s) or (want[1] if len(want) > 1 else None)

    def check_unchanged(self, s: int) -> None:
        """After a failed CRC: raise :class:`ObjectChangedError` when shard ``s``'s object no
        longer has the size (or ETag) recorded at open (one HEAD request), so that a replaced
        object is named as such rather than as corrupt."""
        url = self.paths[s]
        meta = self.client.info(url)
        want = self.file_ids[s]
        if want and meta["size"] != want[0]:
            raise ObjectChangedError(f"{url!r} has {meta['size']} bytes, {want[0]} when it was opened (the object was "
                                     f"replaced); open it again to read the new version", path=url)
        known = self.etag(s)
        if known and meta["etag"] and known != meta["etag"]:
            raise ObjectChangedError(f"{url!r} changed since it was opened (ETag {meta['etag']} instead of {known}); "
                                     f"open it again to read the new version", path=url)

    def submit(self, s: int, start: int, end: int) -> Future:
        return self.client.submit(self.paths[s], start, end, self.etag(s))

    # -- epoch order ---------------------------------------------------------------------------
    def schedule(self, plan: Iterable[list[Key]]) -> Scheduler:
        """Prefetch the chunks of ``plan`` (lists of keys, one list per segment, in the order
        the reader will ask for them), replacing any earlier schedule."""
        self.close()
        self.scheduler = Scheduler(self, iter(plan))
        return self.scheduler

    # -- reads ---------------------------------------------------------------------------------
    def load_chunks(self, shards: np.ndarray | None, offsets: np.ndarray, stored: np.ndarray, checksums: np.ndarray,
                    *, codec: tuple[int, int] | None, verify: bool, dst: np.ndarray, raw_size: int,
                    scratch: np.ndarray, what: str, dst_stride: int = 0) -> None:
        """Whole stored chunks, fetched (prefetched ones first), CRC-checked always, decompressed
        into ``dst`` (see :meth:`LocalStore.load_chunks`); ``scratch`` is not needed."""
        n = len(offsets)
        stride = dst_stride or raw_size
        sh = np.zeros(n, np.int64) if shards is None else np.asarray(shards, np.int64)
        keys = [(int(s), int(o), int(z)) for s, o, z in zip(sh.tolist(), offsets.tolist(), stored.tolist())]
        pieces = self._pieces(keys)
        for i, (buf, at) in enumerate(pieces):
            src = np.frombuffer(buf, np.uint8)
            try:
                kernels.decode_chunks(src, np.array([at], np.int64), stored[i : i + 1], checksums[i : i + 1],
                                      codec=codec, verify=True, dst=dst[i * stride : i * stride + raw_size],
                                      raw_size=raw_size, what=what)
            except kernels.KernelChecksumError:
                # A different object under the same name fails its CRC: say so when that is why.
                self.check_unchanged(keys[i][0])
                raise
            except kernels.KernelError as exc:
                exc.index = i
                raise

    def _pieces(self, keys: list[Key]) -> list[tuple[bytes, int]]:
        """Each key's bytes (a buffer and the chunk's offset in it): from the scheduler when it
        fetched them, else fetched now (cache first), all at once, adjacent ones merged."""
        out: list[Any] = [None] * len(keys)
        sched = self.scheduler
        todo = []
        for i, k in enumerate(keys):
            got = sched.take(k) if sched is not None else None
            if got is None and self._cache is not None:
                data = self._cache.get(k, self.paths[k[0]], self.file_ids[k[0]])
                got = (data, 0) if data is not None else None
            if got is None:
                todo.append(i)
            else:
                out[i] = got
        if todo:
            for piece, members in _merge([keys[i] for i in todo], self.options.merge_bytes):
                s, start, end = piece
                fut = self.submit(s, start, end)
                for j in members:
                    out[todo[j]] = (fut, keys[todo[j]][1] - start)
        res = []
        for i, (src, at) in enumerate(out):
            buf = src.result() if isinstance(src, Future) else src
            if self._cache is not None and isinstance(src, Future):
                k = keys[i]
                self._cache.put(k, self.paths[k[0]], self.file_ids[k[0]], memoryview(buf)[at : at + k[2]])
            res.append((buf, at))
        return res

    def read_rows(self, *args: Any, **kw: Any) -> None:  # pragma: no cover - direct is False
        raise NotImplementedError("a remote store reads whole chunks only (direct is False)")

    read_rows_into = read_payloads = read_rows


def _merge(keys: list[Key], limit: int) -> list[tuple[tuple[int, int, int], list[int]]]:
    """Group keys (in any order) into requests: ``((shard, start, end), [positions])``;
    adjacent or overlapping ranges of one shard merge up to ``limit`` bytes, a key asked twice
    is fetched once."""
    order = sorted(range(len(keys)), key=lambda i: keys[i][:2])
    out: list[tuple[tuple[int, int, int], list[int]]] = []
    for i in order:
        s, off, size = keys[i]
        if out:
            (ps, pa, pz), members = out[-1]
            if ps == s and pa <= off and off + size <= pz:  # inside the previous request
                members.append(i)
                continue
            if ps == s and off == pz and off + size - pa <= limit:
                out[-1] = ((s, pa, off + size), members + [i])
                continue
        out.append(((s, off, off + size), [i]))
    return out


class Scheduler:
    """Ranged GETs in flight ahead of the reader, in the epoch's order.

    The plan (the reader's segments' chunks, in order) is consumed lazily; at most
    ``max_in_flight`` requests (each up to ``merge_bytes``: adjacent chunks of one segment
    merge) are held at once, counting those fetched but not yet taken. :meth:`take` hands a
    chunk's bytes to the reader (waiting for its request) and lets the next request start. A
    chunk the reader asks for that was not scheduled is fetched by the store directly; planned
    entries the reader has passed (an abandoned epoch) are dropped after a while, so a plan out
    of step with the reader costs requests, never memory or correctness.
    """

    def __init__(self, store: RemoteStore, plan: Iterator[list[Key]]):
        self.store = store
        self.plan = plan
        self.limit = store.options.max_in_flight
        self._lock = threading.Lock()
        self._ahead: deque[Key] = deque()  # planned keys not yet issued
        self._entries: dict[Key, deque] = {}  # key -> [request, seq] entries, oldest first
        self._requests: dict[int, list] = {}  # request id -> [future, keys left to take]
        self._seq = 0
        self._taken_seq = 0
        self._stopped = False
        self._exhausted = False
        self.issued = 0
        self.hits = 0
        self._fill()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for req in self._requests.values():
                req[0].cancel()
            self._requests.clear()
            self._entries.clear()
            self._ahead.clear()

    def in_flight(self) -> int:
        """Requests held now (in flight, or done and not yet taken)."""
        return len(self._requests)

    def _refill_ahead(self) -> None:
        while not self._exhausted and len(self._ahead) < 4 * self.limit:
            try:
                part = next(self.plan)
            except StopIteration:
                self._exhausted = True
                break
            self._ahead.extend(part)

    def _fill(self) -> None:
        """Issue requests while fewer than ``limit`` are held (called with or without the lock)."""
        with self._lock:
            if self._stopped:
                return
            self._refill_ahead()
            while self._ahead and len(self._requests) < self.limit:
                key = self._ahead[0]
                q = self._entries.get(key)
                if q:  # asked for again while held: share its request (coalesced, no new GET)
                    self._ahead.popleft()
                    rid, _, at = q[-1]
                    self._requests[rid][1] += 1
                    self._seq += 1
                    q.append((rid, self._seq, at))
                    continue
                # One request: the next key and the keys adjacent to it that follow in the plan.
                s, off, size = self._ahead.popleft()
                keys = [(s, off, size)]
                end = off + size
                while self._ahead and self._ahead[0][0] == s and self._ahead[0][1] == end \
                        and end + self._ahead[0][2] - off <= self.store.options.merge_bytes \
                        and self._ahead[0] not in self._entries:
                    k = self._ahead.popleft()
                    keys.append(k)
                    end += k[2]
                self._refill_ahead()
                try:
                    fut = self.store.submit(s, off, end)
                except BaseException:  # noqa: BLE001 - the reader's own request will raise it
                    return
                rid = self.issued
                self.issued += 1
                self._requests[rid] = [fut, len(keys)]
                for k in keys:
                    self._seq += 1
                    self._entries.setdefault(k, deque()).append((rid, self._seq, k[1] - off))
            self._drop_passed()

    def _drop_passed(self) -> None:
        """Forget entries far behind what the reader takes (it went past them)."""
        horizon = self._taken_seq - 8 * self.limit
        if horizon <= 0:
            return
        for k in list(self._entries):
            q = self._entries[k]
            while q and q[0][1] < horizon:
                rid, _, _ = q.popleft()
                self._release(rid)
            if not q:
                del self._entries[k]

    def _release(self, rid: int) -> None:
        req = self._requests.get(rid)
        if req is not None:
            req[1] -= 1
            if req[1] <= 0:
                del self._requests[rid]

    def take(self, key: Key) -> tuple[Any, int] | None:
        """``(future of the request's bytes, the chunk's offset in them)`` for a scheduled
        chunk, or None when the plan does not hold it (now)."""
        with self._lock:
            q = self._entries.get(key)
            if not q:
                # Not issued yet: drop it from the plan ahead (the reader fetches it itself).
                try:
                    self._ahead.remove(key)
                except ValueError:
                    pass
                return None
            rid, seq, at = q.popleft()
            if not q:
                del self._entries[key]
            fut = self._requests[rid][0]
            self._release(rid)
            self._taken_seq = max(self._taken_seq, seq)
            self.hits += 1
        self._fill()
        return fut, at


def epoch_plan(segments: Iterable[Any], keys_of: Callable[[Any], list[Key]]) -> Iterator[list[Key]]:
    """The chunks of each segment, in order (``keys_of(segment)``), for :meth:`RemoteStore.schedule`."""
    for seg in segments:
        yield keys_of(seg)


def with_options(options: RemoteOptions, **changes: Any) -> RemoteOptions:
    return replace(options, **changes)


def scheduled(store: RemoteStore, segments: Iterable[Any], plan_segments: Callable[[], Iterable[Any]],
              keys_of: Callable[[Any], list[Key]]) -> Iterator[Any]:
    """``segments``, with the store prefetching their chunks from a second, identical iteration
    of the (pure-function) order, started when the first segment is asked for; the schedule
    stops with the iteration."""
    sched = store.schedule(epoch_plan(plan_segments(), keys_of))
    try:
        yield from segments
    finally:
        if store.scheduler is sched:
            store.close()
