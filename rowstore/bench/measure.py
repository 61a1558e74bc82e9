"""Measuring: touch every batch, time repeats after a warm-up, count CPU time and memory.

Everything here is framework-free: batches are dicts whose values may be numpy arrays,
:class:`~rowstore.reader.Ragged`, lists, or anything with a ``.numpy()`` method (torch and
TensorFlow tensors, converted without importing either framework).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from rowstore.reader.buffers import Ragged

__all__ = [
    "touch",
    "batch_rows",
    "cpu_seconds",
    "rss_mb",
    "peak_rss_mb",
    "measure_iter",
    "summarize",
    "memcpy_gbps",
    "warm_cache",
    "machine_info",
]

#: Bytes between the sampled bytes that ``touch`` reads back from each array.
_TOUCH_STRIDE = 4096
#: CPU times tick in 10 ms: shorter timed phases report no CPU%.
_MIN_CPU_S = 0.1


def _as_numpy(v: Any) -> Any:
    """A numpy view of a tensor (torch, tf) without importing the framework; other values as is."""
    if isinstance(v, (np.ndarray, Ragged, list, tuple, str, bytes)) or v is None:
        return v
    flat = getattr(v, "flat_values", None)  # tf.RaggedTensor
    if flat is not None:
        return _as_numpy(flat)
    if type(v).__module__.startswith("torch") and getattr(v, "is_nested", False):
        return [_as_numpy(t) for t in v.unbind()]
    if hasattr(v, "numpy"):
        if hasattr(v, "device") and str(getattr(v, "device", "cpu")).startswith("cuda"):
            v = v.cpu()
        return v.numpy()
    return v


def touch(value: Any) -> tuple[int, int]:
    """Read back a sample of ``value`` and count its decoded bytes.

    Returns ``(nbytes, checksum)``: ``nbytes`` are the bytes of the decoded values (arrays:
    ``nbytes``; :class:`Ragged`: its values; ``str``: characters; ``bytes``: length; ``None``: 0),
    ``checksum`` the count of non-zero values among one value every 4 KiB of each array (so
    lazily produced data must exist). Readers decode the whole batch before handing it out; this
    proves it was handed.
    """
    v = _as_numpy(value)
    if v is None:
        return 0, 0
    if isinstance(v, Ragged):
        return touch(v.values)
    if isinstance(v, str):
        n = len(v) if v.isascii() else len(v.encode("utf-8"))
        return n, n
    if isinstance(v, (bytes, bytearray, memoryview)):
        return len(v), len(v)
    if isinstance(v, (list, tuple)):
        nb = ck = 0
        for x in v:
            a, b = touch(x)
            nb += a
            ck += b
        return nb, ck
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return touch(list(v.reshape(-1)))
        if v.size == 0:
            return 0, 0
        flat = v.reshape(-1)
        step = max(1, _TOUCH_STRIDE // v.itemsize)
        sample = flat[::step]
        return int(v.nbytes), int(np.count_nonzero(sample))
    if isinstance(v, np.generic):
        return int(v.nbytes), 0
    raise TypeError(f"cannot measure a batch value of type {type(value).__name__}")


def batch_rows(batch: dict, names: Sequence[str]) -> int:
    """Rows in a batch (the length of its first field)."""
    v = batch[names[0]]
    n = getattr(v, "shape", None)
    if n is not None and len(n):
        return int(n[0])
    nrows = getattr(v, "nrows", None)  # tf.RaggedTensor
    if callable(nrows):
        return int(nrows())
    return len(v)


def _proc():
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a bench dependency
        return None
    return psutil.Process()


_PROC = _proc()


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its children (e.g. DataLoader workers):
    live ones through psutil, ended ones through ``os.times`` (a worker's time moves from the
    first to the second when it is reaped, so the sum does not drop)."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    if _PROC is None:  # pragma: no cover
        return total
    try:
        for c in _PROC.children(recursive=True):
            try:
                ct = c.cpu_times()
                total += ct.user + ct.system
            except Exception:
                pass
    except Exception:
        pass
    return total


def rss_mb(children: bool = False) -> float:
    """Resident memory now, in MiB (with ``children``: of the live child processes only)."""
    if _PROC is None:  # pragma: no cover
        return float("nan")
    if not children:
        return _PROC.memory_info().rss / 2**20
    total = 0
    for c in _PROC.children(recursive=True):
        try:
            total += c.memory_info().rss
        except Exception:
            pass
    return total / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process image, in MiB.

    Linux: ``VmHWM`` of ``/proc/self/status`` (``ru_maxrss`` would not do: Linux carries it over
    ``fork`` + ``exec``, so a child would report its parent's peak). Elsewhere ``ru_maxrss``.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def measure_iter(
    make_iter: Callable[[], Iterable[dict]],
    names: Sequence[str],
    *,
    warmup: int = 0,
    measure: int | None = None,
    time_limit: float | None = None,
    max_rows: int | None = None,
    on_batch: Callable[[], None] | None = None,
    var_dims: dict[str, tuple[int, ...]] | None = None,
    workers: bool = False,
) -> dict[str, Any]:
    """Time one pass over a fresh iterator.

    The clock for "time to first batch" starts before ``make_iter()``. The first ``warmup``
    batches are consumed and touched but not counted; then up to ``measure`` batches (None: to
    the end of the iterator) are timed, stopping early after ``time_limit`` seconds or
    ``max_rows`` rows (the result then says ``stopped_early``). With ``warmup=0`` the timed
    phase includes creating the iterator. Every batch is touched (:func:`touch_batch`). With
    ``workers``, the resident memory of child processes is sampled every 0.25 s (its maximum
    is ``workers_rss_mb``).
    """
    t0 = time.perf_counter()
    it: Iterator[dict] = iter(make_iter())
    ttfb = None
    skipped = 0
    stopped_early = False
    rows = batches = nbytes = ck = 0
    last = 0
    cpu0 = cpu_seconds()
    ts = t0
    workers_rss = 0.0
    next_rss = t0
    try:
        while skipped < warmup:
            try:
                b = next(it)
            except StopIteration:
                break
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            touch_batch(b, names, var_dims)
            skipped += 1
            if on_batch:
                on_batch()
        if warmup:
            cpu0 = cpu_seconds()
            ts = time.perf_counter()
        while measure is None or batches < measure:
            if time_limit is not None and batches and time.perf_counter() - ts >= time_limit:
                stopped_early = True
                break
            if max_rows is not None and rows >= max_rows:
                stopped_early = True
                break
            try:
                b = next(it)
            except StopIteration:
                break
            if ttfb is None:
                ttfb = time.perf_counter() - t0
            n = batch_rows(b, names)
            nb, c = touch_batch(b, names, var_dims)
            rows += n
            nbytes += nb
            ck += c
            batches += 1
            last = n
            if on_batch:
                on_batch()
            if workers and time.perf_counter() >= next_rss:
                workers_rss = max(workers_rss, rss_mb(children=True))
                next_rss = time.perf_counter() + 0.25
        te = time.perf_counter()
        cpu1 = cpu_seconds()
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it
    seconds = te - ts
    return {
        "rows": rows,
        "batches": batches,
        "last_batch_rows": last,
        "bytes": nbytes,
        "seconds": seconds,
        "ttfb_s": ttfb,
        "cpu_percent": 100.0 * (cpu1 - cpu0) / seconds if seconds >= _MIN_CPU_S else None,
        "cpu_s": cpu1 - cpu0,
        "warmup_batches": skipped,
        "stopped_early": stopped_early,
        "workers_rss_mb": workers_rss,
        "rows_per_s": rows / seconds if seconds > 0 else None,
        "bytes_per_s": nbytes / seconds if seconds > 0 else None,
        "checksum": ck,
    }


def touch_batch(
    batch: dict, names: Sequence[str], var_dims: dict[str, tuple[int, ...]] | None = None
) -> tuple[int, int]:
    """:func:`touch` the values of the fields ``names`` of a batch (companion keys not counted).

    A variable-shape field delivered zero-padded (with its ``"<name>__shape"`` companion, the
    variable dimensions per row) counts the bytes of its values, not of the padding; this needs
    ``var_dims`` (field name -> positions of its variable dimensions).
    """
    nb = ck = 0
    for name in names:
        v = batch[name]
        a, b = touch(v)
        vdims = var_dims.get(name) if var_dims else None
        shp = batch.get(name + "__shape") if vdims is not None else None
        if shp is not None and vdims is not None:
            arr = _as_numpy(v)
            if isinstance(arr, np.ndarray) and arr.ndim >= 2:
                shapes = np.asarray(_as_numpy(shp), dtype=np.int64).reshape(len(arr), -1)
                dims = np.broadcast_to(
                    np.asarray(arr.shape[1:], np.int64), (len(arr), arr.ndim - 1)
                ).copy()
                dims[:, list(vdims)] = shapes
                a = int(np.prod(dims, axis=1).sum()) * arr.itemsize
        nb += a
        ck += b
    return nb, ck


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over measured repeats (warm-up repeats already left out)."""

    def med(key):
        vals = [r[key] for r in reps if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    # CPU%: over all repeats together (a short epoch alone is below the clock's resolution).
    wall = sum(r["seconds"] for r in reps)
    cpu = 100.0 * sum(r.get("cpu_s", 0.0) for r in reps) / wall if wall >= _MIN_CPU_S else None
    return {
        "rows_per_s": med("rows_per_s"),
        "bytes_per_s": med("bytes_per_s"),
        "ttfb_s": med("ttfb_s"),
        "cpu_percent": cpu,
        "seconds": med("seconds"),
        "stopped_early": any(r["stopped_early"] for r in reps),
        "spread": (max(r["rows_per_s"] for r in reps) / min(r["rows_per_s"] for r in reps))
        if reps and all(r.get("rows_per_s") for r in reps)
        else None,
    }


def memcpy_gbps(nbytes: int = 1 << 30, repeats: int = 5) -> dict[str, Any]:
    """The copy bandwidth of ``np.copyto`` between two preallocated, prefaulted buffers (GB/s =
    1e9 bytes of destination written per second), median of ``repeats`` after one warm-up."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    return {
        "gb_per_s": nbytes / med / 1e9,
        "nbytes": nbytes,
        "repeats": repeats,
        "all_gb_per_s": [nbytes / t / 1e9 for t in times],
    }


def warm_cache(paths: Iterable[str], chunk: int = 16 << 20) -> int:
    """Read every byte of the given files (or files under directories) once, so that the page
    cache holds them (a "warm" measurement). Returns the bytes read."""
    total = 0
    buf = bytearray(chunk)
    for p in paths:
        files = (
            [p]
            if not os.path.isdir(p)
            else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
        )
        for fp in files:
            with open(fp, "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(buf)
                    if not n:
                        break
                    total += n
    return total


def machine_info() -> dict[str, Any]:
    import platform

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
        info["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    except Exception:  # pragma: no cover
        pass
    return info
