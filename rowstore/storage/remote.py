"""Object storage: a store that fetches the block index's byte ranges by ranged requests
(:class:`RemoteStore`), and a URL prefix as a destination of writes (:class:`RemoteDir`).

Any fsspec URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``...) reads here;
libhdf5 never touches a remote file's data (opening, from a few byte ranges, is
:mod:`rowstore.format.open`'s).

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
as :class:`~rowstore.errors.RemoteError` naming the URL, byte range and attempts. A single
file's size and ETag are recorded at open and every request carries ``If-Match`` (S3, HTTP): a
replaced object is refused with :class:`~rowstore.errors.ObjectChangedError`, never mixed with
the index read at open. A dataset's shards are immutable by the format; the manifest records
their sizes, every chunk's CRC is checked, and a failed CRC makes the store look again (one
HEAD) so that a replaced shard is named as such.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import MissingObjectError, ObjectChangedError
from rowstore.storage.base import Staging
from rowstore.storage.objstore import Client, RangeFile, RemoteOptions
from rowstore.storage.url import join

__all__ = [
    "RemoteOptions",
    "RemoteStore",
    "RangeFile",
    "Client",
    "Scheduler",
    "RemoteDir",
    "page_ranges",
]

#: Chunk key: (shard, byte offset, stored bytes).
Key = tuple[int, int, int]


# -- the store -----------------------------------------------------------------------------------
_STORES: weakref.WeakSet[RemoteStore] = weakref.WeakSet()


def _after_fork() -> None:
    # A forked child inherits the parent's schedule (futures of a loop thread it does not have)
    # and client: every store starts afresh, its client made on first use.
    for store in list(_STORES):
        store._reset()


os.register_at_fork(after_in_child=_after_fork)


class RemoteStore:
    """The stored bytes of a dataset's shard objects, by ranged requests: a
    :class:`~rowstore.storage.base.ChunkStore` (whole chunks only, no
    :class:`~rowstore.storage.base.DirectReads`).

    Parameters
    ----------
    paths : sequence of str
        The shard URLs.
    file_ids : sequence of tuple
        Per shard ``(size,)`` (from a manifest) or ``(size, etag)`` (a file opened directly:
        every request is conditional on that ETag).
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

    def __init__(
        self,
        paths: Sequence[str],
        file_ids: Sequence[tuple],
        options: RemoteOptions,
        etags: Mapping[int, str | None] | None = None,
    ):
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
        # With a cache: complete local copies of the shard objects (shard -> descriptor, held
        # while the store lives), read by the local kernels; copies are made in the background.
        self._copies: dict[int, int] = {}
        self._looked: dict[int, float] = {}
        self._to_copy: deque[int] = deque()
        self._filler: threading.Thread | None = None
        self._copy_flags: np.ndarray | None = None  # pages of the copies checked (read_pages)
        # Copies fetch through a client of their own: ``requests`` counts the reads' requests.
        self._copier = Client(self.paths[0] if self.paths else "file://", self.options)
        weakref.finalize(self, _close_all, self._copies)
        if self.options.cache:
            from rowstore.storage.cache import BlockCache

            self._cache = BlockCache(self.options.cache, self.options.cache_bytes)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self.paths,
            "file_ids": self.file_ids,
            "options": self.options,
            "etags": dict(self._etags),
        }

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
        """Ranged GETs this process made so far for reads (not counting :attr:`copy_requests`)."""
        return self.client.requests

    @property
    def copy_requests(self) -> int:
        """Ranged GETs this process made so far to copy whole objects into the cache."""
        return self._copier.requests

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
            raise ObjectChangedError(
                f"{url!r} has {meta['size']} bytes, {want[0]} when it was opened (the object was "
                f"replaced); open it again to read the new version",
                path=url,
            )
        known = self.etag(s)
        if known and meta["etag"] and known != meta["etag"]:
            raise ObjectChangedError(
                f"{url!r} changed since it was opened (ETag {meta['etag']} instead of {known}); "
                f"open it again to read the new version",
                path=url,
            )

    def submit(self, s: int, start: int, end: int) -> Future:
        return self.client.submit(self.paths[s], start, end, self.etag(s))

    # -- local copies (cache=) -------------------------------------------------------------------
    def _copy_fds(self, sh: np.ndarray) -> np.ndarray | None:
        """The descriptors of the complete local copies of shards ``sh`` (one per item), or
        None where one is not copied (yet: its copy is then started in the background)."""
        if self._cache is None or not len(sh):
            return None
        out = np.empty(len(sh), np.int32)
        for s in np.unique(sh).tolist():
            fd = self._copies.get(s)
            if fd is None:
                fd = self._find_copy(s)
                if fd is None:
                    return None
            out[sh == s] = fd
        return out

    def _find_copy(self, s: int) -> int | None:
        now = time.monotonic()
        if now - self._looked.get(s, -1e9) < 0.5 or not self.file_ids[s]:
            return None  # looked for a moment ago (or its size is not known)
        self._looked[s] = now
        assert self._cache is not None
        fd = self._cache.open_object(self.paths[s], self.file_ids[s], int(self.file_ids[s][0]))
        with self._lock:
            if fd is not None:
                if s in self._copies:
                    os.close(fd)
                    return self._copies[s]
                self._copies[s] = fd
                return fd
            if s not in self._to_copy:
                self._to_copy.append(s)
                if self._filler is None or not self._filler.is_alive():
                    self._filler = threading.Thread(
                        target=self._fill_copies, name="rowstore-cache-copy", daemon=True
                    )
                    self._filler.start()
        return None

    def _fill_copies(self) -> None:
        """Copy the objects queued, one after the other (their bytes fetched as every request
        is: retried, conditional on the ETag recorded at open)."""
        while True:
            with self._lock:
                if not self._to_copy:
                    self._filler = None
                    return
                s = self._to_copy[0]
            url, etag = self.paths[s], self.etag(s)
            assert self._cache is not None
            self._cache.fill_object(
                url,
                self.file_ids[s],
                int(self.file_ids[s][0]),
                lambda a, b, url=url, etag=etag: self._copier.get(url, a, b, etag),
            )
            with self._lock:
                self._to_copy.popleft()
                self._looked.pop(s, None)  # look again at the next read

    def wait_for_copies(self, timeout: float | None = None) -> None:
        """Wait until the local copies started so far are made (or failed)."""
        t = self._filler
        if t is not None:
            t.join(timeout)

    def _drop_copies(self, sh: np.ndarray) -> None:
        """Copies a read found damaged: removed from the cache (and no longer read here)."""
        with self._lock:
            for s in np.unique(sh).tolist():
                fd = self._copies.pop(s, None)
                if fd is not None:
                    os.close(fd)
                    assert self._cache is not None
                    self._cache.drop_object(self.paths[s], self.file_ids[s])
                self._looked[s] = time.monotonic()

    # -- epoch order ---------------------------------------------------------------------------
    def schedule(self, plan: Iterable[list[Key]]) -> Scheduler:
        """Prefetch the chunks of ``plan`` (lists of keys, one list per segment, in the order
        the reader will ask for them), replacing any earlier schedule."""
        self.close()
        self.scheduler = Scheduler(self, iter(plan))
        return self.scheduler

    # -- reads ---------------------------------------------------------------------------------
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
        """Whole stored chunks, fetched (prefetched ones first, or from the cache), CRC-checked
        always, decompressed into ``dst`` (see :meth:`LocalStore.load_chunks`); ``scratch`` is
        not needed. A chunk is cached only once its CRC matched the index."""
        if self._pid != os.getpid():  # pragma: no cover - _after_fork resets; belt and braces
            self._reset()
        n = len(offsets)
        stride = dst_stride or raw_size
        sh = np.zeros(n, np.int64) if shards is None else np.asarray(shards, np.int64)
        fds = self._copy_fds(sh)
        if fds is not None:
            # Local copies: read as a local file is (one kernel call; ``verify`` as the reader
            # asks, the first read of each chunk checked); a damaged copy is dropped and the
            # chunks fetched below.
            try:
                kernels.load_chunks(
                    fds,
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
                return
            except kernels.KernelError:
                self._drop_copies(sh)
        keys = [
            (int(s), int(o), int(z))
            for s, o, z in zip(sh.tolist(), offsets.tolist(), stored.tolist())
        ]
        pieces = self._pieces(keys)
        for i, (buf, at, source) in enumerate(pieces):
            k = keys[i]
            for attempt in (0, 1):
                try:
                    kernels.decode_chunks(
                        np.frombuffer(buf, np.uint8),
                        np.array([at], np.int64),
                        stored[i : i + 1],
                        checksums[i : i + 1],
                        codec=codec,
                        verify=True,
                        dst=dst[i * stride : i * stride + raw_size],
                        raw_size=raw_size,
                        what=what,
                    )
                except kernels.KernelChecksumError:
                    if source == "cache" and attempt == 0 and self._cache is not None:
                        buf, at, source = self._refetch(k)
                        continue
                    # A different object under the same name fails its CRC: say so when that is why.
                    self.check_unchanged(k[0])
                    raise
                except kernels.KernelError as exc:
                    exc.index = i
                    raise
                break
            if source == "fetched" and self._cache is not None:
                self._cache.put(
                    k, self.paths[k[0]], self.file_ids[k[0]], memoryview(buf)[at : at + k[2]]
                )

    def _refetch(self, k: Key) -> tuple[Any, int, str]:
        """A cached copy of chunk ``k`` that is not the indexed chunk (it failed its CRC):
        dropped from the cache and fetched again, as ``(buffer, offset in it, "fetched")``."""
        assert self._cache is not None
        self._cache.drop(k, self.paths[k[0]], self.file_ids[k[0]])
        return self.submit(k[0], k[1], k[1] + k[2]).result(), 0, "fetched"

    # -- ranges of uncompressed chunks, checked by their pages ---------------------------------
    #: Capability flag: :meth:`read_pages` fetches only the pages of the ranges asked for (the
    #: gather reads the pieces of a window of an uncompressed file so, as from a local file).
    ranged_pages = True

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
        """Range i, bytes ``[within[i], within[i] + take[i])`` of the uncompressed chunk of
        ``chunk_bytes[i]`` raw bytes at ``chunk_offsets[i]`` of shard ``shards[i]``, into
        ``out`` at ``dst_offsets[i]`` (the signature of ``kernels.pread_pages``).

        Only the pages the range touches are fetched (:func:`page_ranges`; scheduled ones
        first, or from the cache), and every one of them is CRC-checked against ``pages``
        (``(page_len, crcs, checked, scratch)``; ``checked`` and ``scratch`` are not used:
        fetched bytes are new bytes, checked each time) before any of its bytes is copied
        out. Errors are :class:`~rowstore.errors.KernelError` whose ``index`` is i."""
        page_len, crcs = int(pages[0]), pages[1]
        n = len(within)
        i64 = lambda a: np.asarray(a, np.int64)  # noqa: E731
        off, cb, w, t = i64(chunk_offsets), i64(chunk_bytes), i64(within), i64(take)
        first, dst = i64(page_first), i64(dst_offsets)
        sh = np.zeros(n, np.int64) if shards is None else i64(shards)
        flat = out.reshape(-1).view(np.uint8)
        per = (cb + page_len - 1) // page_len
        bad = (
            (cb <= 0) | (w < 0) | (t < 0) | (w > cb - t) | (off < 0) | (first < 0)
            | (first > len(crcs) - per) | (sh < 0) | (sh >= len(self.paths))
        )  # fmt: skip
        bad_dst = (dst < 0) | (dst > flat.shape[0] - t)
        for i in np.flatnonzero((bad | bad_dst) & (t > 0))[:1].tolist():
            code = kernels.KernelCode.E_BOUNDS if bad[i] else kernels.KernelCode.E_DEST
            raise kernels.KernelError(
                f"read_pages: range {i}: bytes {int(w[i])}+{int(t[i])} of a chunk of "
                f"{int(cb[i])} bytes, pages from {int(first[i])} of {len(crcs)}, into "
                f"{int(dst[i])} of {flat.shape[0]} (corrupt index)",
                code=code,
                index=i,
                detail=int(w[i]),
            )
        todo = np.flatnonzero(t > 0)
        if not len(todo):
            return
        fds = self._copy_fds(sh)
        if fds is not None:
            # Local copies: the local kernel, each page checked the first time this store
            # reads it (as a local file's); a damaged copy is dropped and the pages fetched.
            flags = self._copy_flags
            if flags is None or len(flags) != len(crcs):
                flags = self._copy_flags = np.zeros(len(crcs), np.bool_)
            scratch = pages[3]
            if not isinstance(scratch, np.ndarray) or scratch.nbytes < 2 * page_len:
                scratch = np.empty(2 * page_len, np.uint8)
            try:
                kernels.pread_pages(
                    fds, off, cb, w, t, first, (page_len, crcs, flags, scratch), out, dst
                )
                return
            except kernels.KernelError:
                self._drop_copies(sh)
                self._copy_flags = None
        start, end = page_ranges(off[todo], cb[todo], w[todo], t[todo], page_len)
        keys = [
            (int(s), int(a), int(b - a))
            for s, a, b in zip(sh[todo].tolist(), start.tolist(), end.tolist())
        ]
        got = self._pieces(keys)
        for j, i in enumerate(todo.tolist()):
            k = keys[j]
            buf, at, source = got[j]
            p0 = int(w[i]) // page_len
            p1 = -(-(int(w[i]) + int(t[i])) // page_len)
            lo = np.arange(p0, p1, dtype=np.int64) * page_len
            sizes = np.minimum(lo + page_len, int(cb[i])) - lo
            for attempt in (0, 1):
                data = np.frombuffer(buf, np.uint8)[at : at + k[2]]
                try:
                    kernels.check_buffer(
                        data,
                        lo - p0 * page_len,
                        sizes,
                        crcs[int(first[i]) + p0 : int(first[i]) + p1],
                    )
                except kernels.KernelChecksumError as exc:
                    if source == "cache" and attempt == 0 and self._cache is not None:
                        buf, at, source = self._refetch(k)
                        continue
                    self.check_unchanged(k[0])
                    # As pread_pages: the range's position, the page's index in the page index.
                    exc.index, exc.detail = i, int(first[i]) + p0 + int(exc.index)
                    raise
                break
            a = int(w[i]) - p0 * page_len
            flat[int(dst[i]) : int(dst[i]) + int(t[i])] = data[a : a + int(t[i])]
            if source == "fetched" and self._cache is not None:
                self._cache.put(k, self.paths[k[0]], self.file_ids[k[0]], data.data)

    def _pieces(self, keys: list[Key]) -> list[tuple[Any, int, str]]:
        """Each key's bytes ``(buffer, the chunk's offset in it, "fetched" or "cache")``: from
        the scheduler when it fetched them, the cache, else fetched now, all at once, adjacent
        ones merged."""
        out: list[Any] = [None] * len(keys)
        sched = self.scheduler
        todo = []
        for i, k in enumerate(keys):
            got = sched.take(k) if sched is not None else None
            if got is None and self._cache is not None:
                data = self._cache.get(k, self.paths[k[0]], self.file_ids[k[0]])
                if data is not None:
                    out[i] = (data, 0, "cache")
                    continue
            if got is None:
                todo.append(i)
            else:
                out[i] = (got[0], got[1], "fetched")
        if todo:
            for piece, members in _merge([keys[i] for i in todo], self.options.merge_bytes):
                s, start, end = piece
                fut = self.submit(s, start, end)
                for j in members:
                    out[todo[j]] = (fut, keys[todo[j]][1] - start, "fetched")
        done = []
        for i, (src, at, how) in enumerate(out):
            if isinstance(src, Future):
                try:
                    src = src.result()
                except CancelledError:
                    # The schedule stopped (its epoch's iteration ended, or a new one began)
                    # while this reader thread still held one of its requests: fetch it now.
                    s_, off, size = keys[i]
                    src, at = self.submit(s_, off, off + size).result(), 0
            done.append((src, at, how))
        return done

    def fetch_ahead(
        self,
        segments: Iterable[Any],
        plan_segments: Callable[[], Iterable[Any]],
        keys_of: Callable[[Any], list[Key]],
    ) -> Iterable[Any]:
        """``segments``, their chunks fetched ahead in that order (see :func:`scheduled`)."""
        return scheduled(self, segments, plan_segments, keys_of)


def page_ranges(
    chunk_offsets: np.ndarray,
    chunk_bytes: np.ndarray,
    within: np.ndarray,
    take: np.ndarray,
    page_len: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The object byte ranges ``[start, end)`` that :meth:`RemoteStore.read_pages` fetches for
    ranges ``[within, within + take)`` (``take`` > 0) of uncompressed chunks: whole pages of
    ``page_len`` (a chunk's last page the rest of it), so each can be checked by its CRC."""
    w, t = np.asarray(within, np.int64), np.asarray(take, np.int64)
    cb = np.asarray(chunk_bytes, np.int64)
    off = np.asarray(chunk_offsets, np.int64)
    a = (w // page_len) * page_len
    b = np.minimum(-(-(w + t) // page_len) * page_len, cb)
    return off + a, off + b


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


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
        self._retiring = False
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

    def retire(self) -> None:
        """The plan's iteration ended: stop (and leave the store) once nothing is held."""
        with self._lock:
            self._retiring = True
        self._retire_if_idle()

    def _retire_if_idle(self) -> None:
        with self._lock:
            idle = self._retiring and self._exhausted and not self._requests and not self._ahead
        if idle:
            self.stop()
            if self.store.scheduler is self:
                self.store.scheduler = None

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
            cache = self.store._cache
            copies = self.store._copies
            while self._ahead and len(self._requests) < self.limit:
                key = self._ahead[0]
                if cache is not None and (key[0] in copies or self.store._find_copy(key[0])):
                    self._ahead.popleft()  # the reader reads its shard's local copy
                    continue
                if cache is not None and cache.has(
                    key, self.store.paths[key[0]], self.store.file_ids[key[0]]
                ):
                    self._ahead.popleft()  # the reader finds it in the local cache
                    continue
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
                while (
                    self._ahead
                    and self._ahead[0][0] == s
                    and self._ahead[0][1] == end
                    and end + self._ahead[0][2] - off <= self.store.options.merge_bytes
                    and self._ahead[0] not in self._entries
                ):
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
        if self._retiring:
            self._retire_if_idle()
        return fut, at


def epoch_plan(segments: Iterable[Any], keys_of: Callable[[Any], list[Key]]) -> Iterator[list[Key]]:
    """The chunks of each segment, in order (``keys_of(segment)``), for
    :meth:`RemoteStore.schedule`."""
    for seg in segments:
        yield keys_of(seg)


def scheduled(
    store: RemoteStore,
    segments: Iterable[Any],
    plan_segments: Callable[[], Iterable[Any]],
    keys_of: Callable[[Any], list[Key]],
) -> Iterator[Any]:
    """``segments``, with the store prefetching their chunks from a second, identical iteration
    of the (pure-function) order, started when the first segment is asked for. An iteration
    closed early stops the schedule; one that ran to its end leaves it to serve the last
    segments, which the reader's threads may still be gathering: it stops once they took
    what it holds (or at the next schedule, or :meth:`RemoteStore.close`), so their requests
    are not cancelled and made again."""
    sched = store.schedule(epoch_plan(plan_segments(), keys_of))
    ended = False
    try:
        yield from segments
        ended = True
    finally:
        if not ended and store.scheduler is sched:
            store.close()
        elif ended:
            sched.retire()


# -- a prefix of an object store as a destination ------------------------------------------------
class RemoteDir:
    """A URL prefix of an object store as a :class:`~rowstore.storage.base.Destination`.

    Each object is one PUT (or a multipart upload), which object stores make atomic: a reader
    sees the old object or the new one. There is no lock (:meth:`lock` waits for nothing).
    Where the store has conditional writes (:attr:`conditional`: S3's ``If-None-Match: *`` and
    ``If-Match`` on PutObject), :meth:`write_new` and :meth:`replace` with ``expect`` are
    atomic checks, so two writers racing for one name or one pointer never both win; on other
    stores they check just before writing, and two writers at the same instant can both pass
    (a commit there writes each version's objects under unique names and checks the pointer
    after writing it instead: :func:`rowstore.writer.commit.publish_unconditional`).

    Parameters
    ----------
    url : str
        The prefix (``s3://bucket/dataset``).
    storage_options : mapping, optional
        fsspec options (credentials, ``endpoint_url``...).
    """

    local_root = None

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None):
        self.root = url.rstrip("/")
        self.client = Client(self.root, RemoteOptions.make(storage_options, None, None))

    def staging(self) -> Staging:
        """A temporary local directory; its finished files are uploaded one PUT each."""
        return Staging(tempfile.mkdtemp(prefix="rowstore-upload-"), in_place=False, dest=self)

    def __repr__(self) -> str:
        return f"RemoteDir({self.root!r})"

    @property
    def conditional(self) -> bool:
        return self.client.conditional

    def _url(self, rel: str) -> str:
        return join(self.root, rel)

    def list(self, rel: str) -> list[str]:
        return self.client.ls(self._url(rel))

    def exists(self, rel: str) -> bool:
        return self.client.etag_or_none(self._url(rel)) is not None

    def read_small(self, rel: str, limit: int) -> bytes:
        return self.client.cat_small(self._url(rel), limit)

    def size(self, rel: str) -> int | None:
        try:
            return self.client.info(self._url(rel))["size"]
        except MissingObjectError:
            return None

    def token(self, rel: str) -> Any:
        return self.client.etag_or_none(self._url(rel))

    def write_new(self, rel: str, data: bytes) -> None:
        self.client.put_bytes(self._url(rel), data, create=True)

    def replace(self, rel: str, data: bytes, *, expect: Any = ...) -> None:
        if expect is ...:
            self.client.put_bytes(self._url(rel), data)
        elif expect is None:
            try:
                self.client.put_bytes(self._url(rel), data, create=True)
            except FileExistsError:
                where = self._url(rel)
                raise ObjectChangedError(
                    f"{where!r} was created by another writer meanwhile", path=where
                ) from None
        else:
            self.client.put_bytes(self._url(rel), data, match=expect)

    def put_file(self, local: str, rel: str) -> None:
        self.client.put_file(local, self._url(rel))

    def remove(self, rel: str) -> None:
        self.client.remove(self._url(rel))

    def lock(self, rel: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def sync(self) -> None:
        """Nothing to do: a PUT is durable when it returns."""
