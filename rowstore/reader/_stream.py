"""Stream: an epoch's segments gathered and decoded ahead on a thread pool, cut into batches.

Segments (windows of blocks, or slices of a permutation) are produced in order,
``threads * prefetch`` ahead; the kernels and GIL-releasing decoders let the threads work in
parallel while the consumer trains. Batches are views of their segment's arrays; a batch that
straddles two segments is concatenated.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rowstore.reader.buffers import Ragged, concat_batches, slice_batch

__all__ = ["prefetched", "cut_batches"]


def prefetched(
    segments: Iterable[Any], produce: Callable[[Any], dict], threads: int, prefetch: int
) -> Generator[dict, None, None]:
    """``produce(seg)`` of every segment, in order, computed up to ``threads * prefetch``
    ahead on ``threads`` threads (inline for 1). The pool ends with the generator."""
    if threads <= 1:
        for seg in segments:
            yield produce(seg)
        return
    depth = max(1, threads * max(1, prefetch))
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rowstore")
    inflight: deque = deque()
    try:
        for seg in segments:
            inflight.append(pool.submit(produce, seg))
            if len(inflight) >= depth:
                yield inflight.popleft().result()
        while inflight:
            yield inflight.popleft().result()
    finally:
        for fut in inflight:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def cut_batches(
    parts: Iterable[dict], batch_size: int, drop_last: bool, finish: Callable[[dict], dict]
) -> Generator[dict, None, None]:
    """Batches of exactly ``batch_size`` rows (the last may be short unless ``drop_last``)
    cut from consecutive ``parts``; ``finish`` is applied to batches that hold Ragged columns
    or were concatenated (plain array batches are views, handed out as they are)."""
    carry: list[dict] = []
    carry_n = 0
    for seg in parts:
        m = len(next(iter(seg.values()))) if seg else 0
        pos = 0
        if carry_n:
            need = min(batch_size - carry_n, m)
            carry.append(slice_batch(seg, 0, need))
            carry_n += need
            pos = need
            if carry_n == batch_size:
                yield finish(concat_batches(carry))
                carry, carry_n = [], 0
        if pos + batch_size <= m:
            if any(isinstance(v, Ragged) for v in seg.values()):
                while pos + batch_size <= m:
                    yield finish(slice_batch(seg, pos, pos + batch_size))
                    pos += batch_size
            else:
                # Plain arrays only (the common case): views, without per-batch checks.
                items = list(seg.items())
                while pos + batch_size <= m:
                    end = pos + batch_size
                    yield {k: v[pos:end] for k, v in items}
                    pos = end
        if pos < m:
            carry.append(slice_batch(seg, pos, m))
            carry_n += m - pos
    if carry_n and not drop_last:
        yield finish(concat_batches(carry))
