"""Object storage I/O shared by the reader and the writers: an fsspec client per process with
retried ranged GETs (:class:`Client`), the options of remote reads (:class:`RemoteOptions`), and
a file object over a remote object's byte ranges for h5py's metadata reads (:class:`RangeFile`).

``fsspec`` (and the protocol's package: s3fs, gcsfs, adlfs, aiohttp) is imported on first use
only; see :mod:`rowstore.storage.remote` for how reads are scheduled.
"""

from __future__ import annotations

import asyncio
import os
import random
import struct
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rowstore.errors import FormatError, MissingObjectError, ObjectChangedError, RemoteError

__all__ = ["RemoteOptions", "Client", "RangeFile"]


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
        A directory for the local block cache (see :mod:`rowstore.storage.cache`); None: off.
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
    def make(
        cls, storage_options: Mapping[str, Any] | None, cache: Any, remote: Mapping[str, Any] | None
    ) -> RemoteOptions:
        kw = dict(remote or {})
        unknown = set(kw) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(
                f"unknown remote option(s) {sorted(unknown)}; expected "
                f"{sorted(cls.__dataclass_fields__)}"
            )
        if storage_options is not None:
            if not isinstance(storage_options, Mapping):
                raise TypeError(
                    f"storage_options must be a dict, got {type(storage_options).__name__}"
                )
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
    return any(
        m in text
        for m in ("PreconditionFailed", "Precondition Failed", "pre-conditions you specified")
    )


def _permanent(exc: BaseException) -> bool:
    """Errors no retry can fix: a missing object, refused credentials or access."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return True
    status = _status(exc)
    return status in (400, 401, 403, 404, 405, 416)


def _no_credentials(exc: BaseException) -> bool:
    """botocore found no (or partial) credentials: raised before any request, never transient."""
    return any(
        c.__name__ in ("NoCredentialsError", "PartialCredentialsError") for c in type(exc).__mro__
    )


#: botocore's errors raised before a request is sent: parameters or configuration it refuses
#: (a bucket name that is not one, no region, a bad endpoint or addressing style).
_INVALID_REQUEST = frozenset(
    {
        "ParamValidationError",
        "ValidationError",
        "NoRegionError",
        "InvalidS3AddressingStyleError",
        "InvalidEndpointConfigurationError",
        "InvalidConfigError",
        "InvalidHostLabelError",
        "UnsupportedS3ArnError",
        "UnknownServiceError",
    }
)


def _invalid_request(exc: BaseException) -> bool:
    """A request refused before it was sent (botocore's parameter and configuration checks; a
    ``TypeError`` or ``NotImplementedError`` of the filesystem, e.g. an unknown storage
    option): the same arguments fail the same way, so it is never retried."""
    for e in (exc, exc.__cause__):
        if isinstance(e, (TypeError, NotImplementedError)) or any(
            c.__name__ in _INVALID_REQUEST for c in type(e).__mro__
        ):
            return True
    return False


def _no_bucket(exc: BaseException) -> bool:
    """S3's NoSuchBucket (s3fs raises FileNotFoundError with S3's message, the cause kept)."""
    return any(
        "NoSuchBucket" in type(e).__name__ or "bucket does not exist" in str(e)
        for e in (exc, exc.__cause__)
        if e is not None
    )


_REPLACED = "{url!r} changed since it was read (another writer replaced it)"


class _Short(Exception):
    def __init__(self, got: int, want: int):
        super().__init__(
            f"a response of {got} bytes for a range of {want} (short body or the server ignored "
            f"Range)"
        )


class _Changed(Exception):
    pass


# -- the client: one per process ---------------------------------------------------------------
#: This process's fsspec filesystems, by (pid, protocol, token of the storage options).
_FS: dict[tuple[int, str, str], Any] = {}
_FS_LOCK = threading.Lock()


def _forget_filesystems() -> (
    None
):  # a forked child makes its own (the parent's loop is not running here)
    global _FS_LOCK
    _FS_LOCK = threading.Lock()
    _FS.clear()


os.register_at_fork(after_in_child=_forget_filesystems)


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
            raise ImportError(
                "reading URLs needs fsspec (and s3fs for s3://, aiohttp for http://): "
                "pip install 'rowstore[remote]'"
            ) from None
        from fsspec.utils import tokenize

        so = dict(self.options.storage_options)
        proto = self.url.split("://", 1)[0]
        # One filesystem per protocol and options in a process: each s3fs instance is a botocore
        # session that parses its own copy of the service models (about 17 MiB of Python
        # objects), so a client per store (a shuffle opens one per task) held that many.
        key = (os.getpid(), proto, tokenize(so))
        with _FS_LOCK:
            fs = _FS.get(key)
            if fs is not None:
                return fs
            if proto in ("s3", "s3a") and "config_kwargs" not in so:
                # One attempt per request in botocore and s3fs: the retries are ours (counted,
                # jittered).
                so["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
            fs, _ = fsspec.core.url_to_fs(self.url, skip_instance_cache=True, **so)
            if proto in ("s3", "s3a"):
                fs.retries = 1
            if len(_FS) >= 64:
                _FS.clear()
            _FS[key] = fs
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
            raise FormatError(
                f"{url!r} is a directory of objects, not a rowstore file or dataset", path=url
            )
        size = info.get("size")
        if not isinstance(size, int):
            raise RemoteError(
                f"{url!r}: the server does not tell the object's size (no Content-Length)", url=url
            )
        etag = info.get("ETag") or info.get("etag")
        return {"size": size, "etag": str(etag) if etag else None}

    def cat_small(self, url: str, limit: int) -> bytes:
        """The whole object at ``url`` (a manifest, pointer or sidecar) in one request, refused
        above ``limit`` bytes (one byte more is asked for, no more is read):
        :func:`rowstore.format.manifest.load`'s ``read``."""
        data = self.submit(url, 0, limit + 1, short_ok=True).result()
        if len(data) > limit:
            raise FormatError(
                f"{url!r}: has more than the {limit} bytes expected of it (not a rowstore dataset "
                f"object, or a replaced one)",
                path=url,
            )
        return data

    # -- writes and listings -------------------------------------------------------------------
    @property
    def conditional(self) -> bool:
        """Whether the store makes writes conditional atomically (S3's ``If-None-Match: *``
        and ``If-Match`` on PutObject); other stores are checked first and written after.

        GCS has preconditions (``ifGenerationMatch``), but gcsfs's uploads carry only the
        "create" one (no replacement if the generation is unchanged), and emulators such as
        gcp-storage-emulator ignore it: ``gs://`` is not conditional here."""
        return self.url.split("://", 1)[0] in ("s3", "s3a")

    def put_file(self, local: str, url: str) -> None:
        """Upload the file ``local`` to ``url`` (one PUT, or a multipart upload that appears
        whole), retried as reads are."""
        self._retrying(url, None, None, lambda: self.fs.put_file(local, self.path(url)))

    def put_bytes(
        self, url: str, data: bytes, *, create: bool = False, match: str | None = None
    ) -> None:
        """Write ``data`` to ``url`` (one PUT). ``create``: only if there is no object there
        (else :class:`FileExistsError`); ``match``: only if the object's ETag is still that
        (else :class:`~rowstore.errors.ObjectChangedError`). Atomic where :attr:`conditional`,
        checked just before the write elsewhere."""
        kw: dict[str, Any] = {}
        if self.conditional:
            if create:
                kw["mode"] = "create"
            if match is not None:
                kw["IfMatch"] = match
        elif create or match is not None:
            now = self.etag_or_none(url)
            if create and now is not None:
                raise FileExistsError(f"{url!r} exists")
            if match is not None and now != match:
                raise ObjectChangedError(_REPLACED.format(url=url), path=url)
        failed: list[BaseException] = []

        def call() -> None:
            try:
                self.fs.pipe_file(self.path(url), data, **kw)
            except FileExistsError as exc:  # s3fs: If-None-Match failed
                failed.append(exc)
            except OSError as exc:
                if match is not None and _changed(exc):
                    failed.append(exc)
                else:
                    raise

        self._retrying(url, None, None, call)
        if failed:
            if isinstance(failed[0], FileExistsError):
                raise FileExistsError(f"{url!r} exists (written by another writer)")
            raise ObjectChangedError(_REPLACED.format(url=url), path=url)

    def etag_or_none(self, url: str) -> str | None:
        """The ETag of the object at ``url`` (``""`` when the store gives none); None if there
        is no object."""
        try:
            return self.info(url)["etag"] or ""
        except MissingObjectError:
            return None

    def ls(self, url: str) -> list[str]:
        """The names directly under the prefix ``url``; ``[]`` if there is none."""

        def call() -> Any:
            fs = self.fs
            if hasattr(fs, "invalidate_cache"):
                fs.invalidate_cache(self.path(url))
            try:
                return fs.ls(self.path(url), detail=False)
            except FileNotFoundError:
                return []

        return [p.rstrip("/").rsplit("/", 1)[-1] for p in self._retrying(url, None, None, call)]

    def remove(self, url: str) -> None:
        """Remove the object at ``url`` (nothing if there is none)."""

        def call() -> None:
            try:
                self.fs.rm_file(self.path(url))
            except FileNotFoundError:
                pass

        self._retrying(url, None, None, call)

    # -- ranged reads ------------------------------------------------------------------------
    def get(self, url: str, start: int, end: int, etag: str | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``url`` (blocking)."""
        return self.submit(url, start, end, etag).result()

    def submit(
        self, url: str, start: int, end: int, etag: str | None = None, *, short_ok: bool = False
    ) -> Future:
        """Start fetching bytes ``[start, end)`` of ``url``: a future of ``bytes`` (exactly that
        many, or up to that many with ``short_ok``), or of the error after the retries."""
        fs = self.fs
        if self.is_async:
            return asyncio.run_coroutine_threadsafe(
                self._get_async(url, start, end, etag, short_ok), fs.loop
            )
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        max_workers=self.options.max_in_flight, thread_name_prefix="rowstore-fetch"
                    )

        def once() -> bytes:
            self.requests += 1
            return self._check(
                fs.cat_file(self.path(url), start=start, end=end), start, end, short_ok, url
            )

        return self._pool.submit(self._retrying, url, start, end, once)

    def _check(
        self, data: bytes, start: int, end: int, short_ok: bool = False, url: str | None = None
    ) -> bytes:
        if len(data) > end - start:
            raise self._oversized(url or self.url, start, end, f"a body of {len(data)} bytes")
        if len(data) < end - start and not short_ok:
            raise _Short(len(data), end - start)
        return data

    @staticmethod
    def _oversized(url: str, start: int, end: int, what: str) -> RemoteError:
        """The error for a response longer than the range asked for (not retried: a server that
        ignores ``Range`` answers the same way again, and each answer would be buffered)."""
        return RemoteError(
            f"{url!r} bytes {start}-{end - 1}: the server answered {what} for a range of "
            f"{end - start} bytes (it ignores Range, or the object is not what it claims); "
            f"refused unread",
            url=url,
            start=start,
            end=end,
        )

    async def _get_once(
        self, url: str, start: int, end: int, etag: str | None, short_ok: bool
    ) -> bytes:
        fs = self.fs
        self.requests += 1
        proto = url.split("://", 1)[0]
        if etag and etag.startswith("W/"):  # a weak ETag never matches If-Match (RFC 9110 13.1.1)
            etag = None
        if start == end:
            return b""
        # The body is read at most one byte past the range: a server that ignores Range (200
        # and the whole object) or sends more than asked costs no more memory than the range.
        if proto in ("s3", "s3a") and hasattr(fs, "_call_s3"):
            bucket, key, version = fs.split_path(self.path(url))
            kw = {"VersionId": version} if version else {}
            if etag:
                kw["IfMatch"] = etag
            resp = await fs._call_s3(
                "get_object",
                Bucket=bucket,
                Key=key,
                Range=f"bytes={start}-{end - 1}",
                **kw,
                **getattr(fs, "req_kw", {}),
            )
            try:
                length = resp.get("ContentLength")
                if isinstance(length, int) and length > end - start:
                    raise self._oversized(url, start, end, f"Content-Length {length}")
                data = await self._read_capped(resp["Body"].read, url, start, end)
            finally:
                resp["Body"].close()
        elif proto in ("http", "https") and hasattr(fs, "set_session"):
            kw = dict(getattr(fs, "kwargs", {}))
            headers = dict(kw.pop("headers", None) or {})
            headers["Range"] = f"bytes={start}-{end - 1}"
            if etag:
                headers["If-Match"] = etag
            session = await fs.set_session()
            async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
                fs._raise_not_found_for_status(r, url)
                if r.status == 200 and start > 0:
                    raise self._oversized(url, start, end, "200 with the object from byte 0")
                length = r.content_length
                if length is not None and length > end - start:
                    raise self._oversized(url, start, end, f"Content-Length {length}")
                data = await self._read_capped(r.content.read, url, start, end)
        else:
            data = await fs._cat_file(self.path(url), start=start, end=end)
        return self._check(data, start, end, short_ok, url)

    async def _read_capped(
        self, read: Callable[[int], Any], url: str, start: int, end: int
    ) -> bytes:
        """A response body through ``read(n)`` (at most ``n`` bytes; empty at its end), refused
        as soon as it is longer than ``[start, end)``."""
        cap, got = end - start, 0
        parts: list[bytes] = []
        while True:
            chunk = await read(cap + 1 - got)
            if not chunk:
                return b"".join(parts)
            got += len(chunk)
            if got > cap:
                raise self._oversized(url, start, end, "a longer body")
            parts.append(chunk)

    async def _get_async(
        self, url: str, start: int, end: int, etag: str | None, short_ok: bool
    ) -> bytes:
        o = self.options
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.wait_for(
                    self._get_once(url, start, end, etag, short_ok), o.timeout
                )
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - classified below
                err = self._classify(exc, url, start, end, attempt)
                if err is not None:
                    raise err from exc
            await asyncio.sleep(self._delay(attempt))

    def _retrying(
        self, url: str, start: int | None, end: int | None, call: Callable[[], Any]
    ) -> Any:
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

    def _classify(
        self, exc: BaseException, url: str, start: int | None, end: int | None, attempt: int
    ) -> BaseException | None:
        """None to retry, else the error to raise."""
        where = f"{url!r}" + (
            f" bytes {start}-{end - 1}" if start is not None and end is not None else ""
        )
        if isinstance(exc, (FormatError, RemoteError)):
            return exc
        if _changed(exc):
            return ObjectChangedError(
                f"{where}: the object changed since it was opened (its ETag no longer "
                f"matches); open it again to read the new version",
                path=url,
            )
        if _no_credentials(exc):
            return RemoteError(
                f"{where}: no credentials found ({type(exc).__name__}: {exc}); pass them in "
                f"storage_options (key/secret, profile), the environment or a credentials file, "
                f"or anon=True for a public bucket",
                url=url,
                start=start,
                end=end,
                attempts=attempt,
            )
        if _invalid_request(exc):
            return RemoteError(
                f"{where}: the request is invalid, so it was not retried ({type(exc).__name__}: "
                f"{exc}); check the URL and storage_options",
                url=url,
                start=start,
                end=end,
                attempts=attempt,
            )
        if _no_bucket(exc):
            bucket = url.split("://", 1)[-1].split("/", 1)[0]
            return FormatError(
                f"{url!r}: the bucket {bucket!r} does not exist (check its name and the endpoint)",
                path=url,
            )
        if isinstance(exc, FileNotFoundError) or _status(exc) == 404 or "NoSuchKey" in str(exc):
            return MissingObjectError(f"{url!r} is missing", path=url)
        if _status(exc) == 416 or "InvalidRange" in str(exc):
            return ObjectChangedError(
                f"{where}: the object is shorter than when it was opened (replaced or "
                f"truncated); open it again",
                path=url,
            )
        if _permanent(exc):
            return RemoteError(
                f"{where}: access refused ({type(exc).__name__}: {exc}); check the credentials and "
                f"storage_options",
                url=url,
                start=start,
                end=end,
                attempts=attempt,
            )
        if attempt > self.options.retries:
            kind = (
                "stalled past the timeout"
                if isinstance(exc, (asyncio.TimeoutError, TimeoutError))
                else f"{type(exc).__name__}: {exc}"
            )
            return RemoteError(
                f"{where}: failed after {attempt} attempts ({kind})",
                url=url,
                start=start,
                end=end,
                attempts=attempt,
            )
        return None


# -- a single remote file's metadata -------------------------------------------------------------
class RangeFile:
    """A read-only file object over a remote object for h5py's metadata reads: pages of
    ``page`` bytes fetched on demand (and kept), the head and tail fetched first together.

    Our writer puts the superblock and the group's object header at the head of a file and the
    indexes and attributes (written at close) at its tail, so a file opens in two requests;
    ``requests`` counts them. Memory: the pages read (the metadata), never the blocks.
    """

    HEAD = 1 << 18
    TAIL = 1 << 20
    PAGE = 1 << 16

    def __init__(
        self,
        client: Client,
        url: str,
        size: int,
        etag: str | None,
        *,
        image: bytes | None = None,
        tail_data: bytes | None = None,
    ):
        self.client, self.url, self.size, self.etag, self.page = client, url, size, etag, self.PAGE
        self.pos = 0
        self.requests = 0
        self.fetched = 0
        self._have: dict[int, bytes] = {}  # page number -> bytes
        if image is not None and self._load_image(image):
            return  # pages of an earlier open (a local cache): no request
        page = self.PAGE
        t0 = max(0, size - self.TAIL) // page * page
        if (
            tail_data is not None and len(tail_data) == size - t0
        ):  # the tail, already fetched (by the footer check)
            self._store(t0, tail_data)
            self._fetch([(0, min(size, self.HEAD, t0))])
            return
        spans = [(0, min(size, self.HEAD))]
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
            self._store(a, data)

    def _store(self, a: int, data: bytes) -> None:
        for k in range(0, len(data), self.page):
            self._have[(a + k) // self.page] = data[k : k + self.page]

    def image(self) -> bytes:
        """The pages read so far, as one blob (``<u8 page, <u4 length`` then the bytes, per
        page) that :class:`RangeFile` takes back as ``image=``."""
        out = []
        for k in sorted(self._have):
            v = self._have[k]
            out.append(struct.pack("<QI", k, len(v)) + v)
        return b"".join(out)

    def _load_image(self, image: bytes) -> bool:
        pages: dict[int, bytes] = {}
        at = 0
        while at < len(image):
            if at + 12 > len(image):
                return False
            k, n = struct.unpack_from("<QI", image, at)
            at += 12
            if n > self.page or at + n > len(image) or k * self.page + n > self.size:
                return False
            pages[k] = image[at : at + n]
            at += n
        self._have = pages
        return True

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

    def read_range(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` (fetched if missing), the position unchanged."""
        pos = self.pos
        self.pos = start
        try:
            return self.read(end - start)
        finally:
            self.pos = pos

    def readinto(self, buf: Any) -> int:
        data = self.read(len(memoryview(buf).cast("B")))
        memoryview(buf).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._have.clear()
