"""A local disk cache of whole remote chunks (blocks and heap chunks), shared by processes.

``rowstore.open(url, cache=DIR)``: epochs after the first read the chunks from ``DIR`` instead
of the network. Safe for several processes on one machine and against being killed:

* a chunk's file is written under a temporary name (``.tmp-<pid>-<random>``) in its final
  directory, then renamed onto its final name (atomic): a reader sees a complete file or none;
  two processes filling the same chunk each rename a complete copy (the last one stays);
* each file holds a header (magic, length, CRC-32 of the payload) that :meth:`BlockCache.get`
  checks: a damaged or foreign file is removed and counts as a miss, never trusted (and the
  store checks the chunk's CRC from the dataset's index again, as for every remote chunk);
* temporary files a killed process left are never read, and are removed by eviction once older
  than a minute.

Size: ``max_bytes`` (default 10 GiB), least recently used first (a hit touches the file's
mtime). Each process keeps an estimate of the cache's total (a directory scan at its first
write, then what it adds); when a write takes the estimate past the limit it scans again and
evicts down to 90%: one process alone keeps the cache within the limit, several processes
writing at once keep it near it (each evicts on what it sees). The cache holds copies only: it never
deletes anything
but its own files.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
import zlib
from typing import Any

__all__ = ["BlockCache"]

_MAGIC = b"RSBLKC01"
_HEAD = struct.Struct("<8sQI")  # magic, payload length, CRC-32 of the payload
_TMP_AGE_S = 60.0


def _stat_regular(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISREG(st.st_mode)


class BlockCache:
    """Chunks of remote objects, keyed by (object URL, its identity, offset, size)."""

    def __init__(self, root: str, max_bytes: int):
        self.root = os.path.abspath(os.fspath(root))
        self.max_bytes = int(max_bytes)
        os.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()
        self._estimate: int | None = (
            None  # the cache's total as of this process's last scan, plus its writes
        )
        self.hits = 0
        self.misses = 0

    def _path(self, key: tuple[int, int, int], url: str, file_id: tuple) -> str:
        obj = hashlib.sha1(f"{url}\0{file_id!r}".encode()).hexdigest()[:24]
        return os.path.join(self.root, obj[:2], f"{obj}-{key[1]}-{key[2]}.blk")

    def has(self, key: tuple[int, int, int], url: str, file_id: tuple) -> bool:
        return os.path.exists(self._path(key, url, file_id))

    def get(self, key: tuple[int, int, int], url: str, file_id: tuple) -> bytes | None:
        """The chunk's bytes, or None (absent, or damaged: then removed)."""
        return self._get(self._path(key, url, file_id), key[2])

    def _meta_path(self, url: str, file_id: tuple) -> str:
        obj = hashlib.sha1(f"{url}\0{file_id!r}".encode()).hexdigest()[:24]
        return os.path.join(self.root, obj[:2], f"{obj}-meta.blk")

    def get_meta(self, url: str, file_id: tuple, limit: int = 64 << 20) -> bytes | None:
        """A single file's cached metadata image (see :meth:`put_meta`), or None."""
        return self._get(self._meta_path(url, file_id), None, limit)

    def put_meta(self, url: str, file_id: tuple, data: bytes) -> None:
        """Cache the metadata image of a single remote file (the byte pages h5py read to open
        it): a later open of the same object (same size and ETag) needs no GET."""
        self._put(self._meta_path(url, file_id), data)

    def _get(self, p: str, size: int | None, limit: int = 0) -> bytes | None:
        try:
            with open(p, "rb") as f:
                data = f.read(_HEAD.size + (size if size is not None else limit) + 1)
        except OSError:
            self.misses += 1
            return None
        ok = len(data) >= _HEAD.size
        if ok:
            magic, n, crc = _HEAD.unpack_from(data)
            payload = memoryview(data)[_HEAD.size :]
            ok = (
                magic == _MAGIC
                and n == len(payload)
                and (size is None or n == size)
                and zlib.crc32(payload) == crc
            )
        if not ok:
            self._remove(p)
            self.misses += 1
            return None
        try:
            os.utime(p)  # recently used
        except OSError:
            pass
        self.hits += 1
        return bytes(payload)

    # -- whole objects: local copies read by the local path ------------------------------------
    def object_path(self, url: str, file_id: tuple) -> str:
        obj = hashlib.sha1(f"{url}\0{file_id!r}".encode()).hexdigest()[:24]
        return os.path.join(self.root, obj[:2], f"{obj}.obj")

    def open_object(self, url: str, file_id: tuple, size: int) -> int | None:
        """A read-only descriptor of the complete local copy of ``url`` (``size`` bytes), or
        None. The caller owns the descriptor (eviction unlinks the name, never the open file).
        The copy's bytes are checked by the reads (every chunk's or page's CRC from the index),
        as a local file's are."""
        p = self.object_path(url, file_id)
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size != size or not _stat_regular(st):
                os.close(fd)
                self._remove(p)
                return None
            os.utime(p)  # recently used
        except OSError:
            os.close(fd)
            return None
        return fd

    def drop_object(self, url: str, file_id: tuple) -> None:
        """Remove a copy found damaged (its name; open descriptors keep their file)."""
        self._remove(self.object_path(url, file_id))

    def fill_object(
        self, url: str, file_id: tuple, size: int, fetch: Any, step: int = 8 << 20
    ) -> bool:
        """Copy the object ``url`` of ``size`` bytes into the cache, ``fetch(start, end)``
        giving its bytes, under a temporary name renamed onto the final one when complete
        (atomic: a reader opens a complete copy or none). One process fills a given object at
        a time (a ``.tmp-lock-`` marker made with ``O_EXCL``, touched as the copy grows; one
        left by a killed process is removed once a minute old). Objects larger than half the
        cache are not copied. Returns whether this call made the copy."""
        if size <= 0 or size > self.max_bytes // 2:
            return False
        p = self.object_path(url, file_id)
        d = os.path.dirname(p)
        lock = os.path.join(d, ".tmp-lock-" + os.path.basename(p))
        tmp = os.path.join(d, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            os.makedirs(d, exist_ok=True)
            if os.path.exists(p):
                return False
            try:
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                if time.time() - os.stat(lock).st_mtime <= _TMP_AGE_S:
                    return False  # another process is copying it
                self._remove(lock)
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except OSError:
            return False
        try:
            with open(tmp, "wb") as f:
                for a in range(0, size, step):
                    data = fetch(a, min(size, a + step))
                    if len(data) != min(size, a + step) - a:
                        raise OSError("short read")
                    f.write(data)
                    os.utime(lock)
            os.replace(tmp, p)
        except Exception:  # noqa: BLE001 - a cache that cannot fill is a cache that misses
            self._remove(tmp)
            return False
        finally:
            self._remove(lock)
        with self._lock:
            if self._estimate is None:
                self._estimate = self.size()
            else:
                self._estimate += size
            if self._estimate > self.max_bytes:
                self._estimate = self.evict()
        return True

    def drop(self, key: tuple[int, int, int], url: str, file_id: tuple) -> None:
        self._remove(self._path(key, url, file_id))

    def put(self, key: tuple[int, int, int], url: str, file_id: tuple, data: Any) -> None:
        """Store a chunk (complete and checked by the caller) atomically; errors are ignored (a
        cache that cannot write is a cache that misses)."""
        self._put(self._path(key, url, file_id), data)

    def _put(self, p: str, data: Any) -> None:
        if os.path.exists(p):
            return
        d = os.path.dirname(p)
        tmp = os.path.join(d, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            os.makedirs(d, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(_HEAD.pack(_MAGIC, len(data), zlib.crc32(data)))
                f.write(data)
            os.replace(tmp, p)
        except OSError:
            self._remove(tmp)
            return
        with self._lock:
            if self._estimate is None:
                self._estimate = self.size()  # (this file included)
            else:
                self._estimate += len(data) + _HEAD.size
            if self._estimate > self.max_bytes:
                self._estimate = self.evict()

    def size(self) -> int:
        """Bytes of the cache's complete files now."""
        return sum(st.st_size for _, st in self._files())

    def _files(self) -> list[tuple[str, os.stat_result]]:
        out = []
        now = time.time()
        for sub in os.scandir(self.root):
            if not sub.is_dir():
                continue
            for e in os.scandir(sub.path):
                try:
                    st = e.stat()
                except OSError:
                    continue
                if e.name.startswith(".tmp-"):
                    if now - st.st_mtime > _TMP_AGE_S:  # left by a killed process
                        self._remove(e.path)
                    continue
                out.append((e.path, st))
        return out

    def evict(self) -> int:
        """Remove least recently used files until the cache is within 90% of its limit (when
        it is over the limit); the bytes left."""
        files = self._files()
        total = sum(st.st_size for _, st in files)
        if total <= self.max_bytes:
            return total
        files.sort(key=lambda t: t[1].st_mtime)
        goal = self.max_bytes * 9 // 10
        for path, st in files:
            if total <= goal:
                break
            self._remove(path)
            total -= st.st_size
        return total

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass
