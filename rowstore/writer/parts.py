"""A dataset written in parts on worker processes: runs of consecutive input files, one shard
each, committed in their order in one version.

An ingest of files (``from_images``' image folders, ``from_audio``'s speech corpora) splits
its files into parts of about equal bytes (:func:`cut`), has :func:`write_parts` run one
module-level function per part (here, or on ``spawn`` worker processes) that writes the part's
shard with :func:`~rowstore.writer.dataset.write_shard`, and publishes them with one
:func:`~rowstore.writer.commit.commit`. Workers report what they have done as they go
(``report(files, nbytes)``), relayed to the caller's ``progress`` callback in this process.
Nothing is published unless every part is written; on an error the shards written are removed
(and the dataset directory, when the call made it and nothing else is in it).
"""

from __future__ import annotations

import math
import os
import queue
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from typing import Any

import numpy as np

from rowstore.format.manifest import SHARD_DIR
from rowstore.writer.commit import ShardInfo, commit
from rowstore.writer.dataset import discard

__all__ = ["cut", "n_parts", "write_parts", "Report"]

#: ``report(files, nbytes)``: files done and their bytes, since the last call.
Report = Callable[[int, int], None]

#: The worker's end of the progress queue (set by :func:`_init_worker` in each worker process).
_QUEUE: Any = None


def cut(sizes: Sequence[int] | np.ndarray, n_parts: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of ``n_parts`` (at most; at least one) runs of consecutive items of
    about equal total size, each one item at least, covering every item in order."""
    n = len(sizes)
    if n == 0:
        return []
    ends = np.cumsum(np.asarray(sizes, np.float64))
    targets = ends[-1] * np.arange(1, max(1, min(n_parts, n))) / max(1, min(n_parts, n))
    inner = np.searchsorted(ends, targets, side="left") + 1
    bounds = [0, *sorted({int(b) for b in inner if 0 < b < n}), n]
    return list(zip(bounds, bounds[1:]))


def n_parts(n_items: int, total_bytes: int, *, workers: int, min_items: int, max_bytes: int) -> int:
    """How many parts ``n_items`` items of ``total_bytes`` are written in: one per worker
    (no part under ``min_items`` items), more where a part would exceed ``max_bytes``."""
    k = min(workers, math.ceil(n_items / max(1, min_items)))
    k = max(k, math.ceil(total_bytes / max(1, max_bytes)))
    return max(1, min(k, n_items))


def _init_worker(q: Any) -> None:
    global _QUEUE
    _QUEUE = q


def _queue_report(files: int, nbytes: int) -> None:
    if _QUEUE is not None:
        _QUEUE.put((files, nbytes))


def _run_in_worker(fn: Callable[..., Any], job: tuple) -> Any:
    return fn(*job, report=_queue_report)


def write_parts(
    fn: Callable[..., tuple[ShardInfo | None, Any]],
    jobs: Sequence[tuple],
    dest: str,
    *,
    workers: int,
    mode: str = "w",
    attrs: Mapping[str, Any] | Callable[[list[Any]], Mapping[str, Any]] | None = None,
    progress: Report | None = None,
) -> list[Any]:
    """Run ``fn(*job, report=...)`` for every job (here when ``workers`` is 1 or there is one
    job, else on ``min(workers, len(jobs))`` spawned processes), then commit the shards in the
    jobs' order.

    Parameters
    ----------
    fn : callable
        A module-level function (it runs in other processes) returning ``(info, extra)``: the
        ShardInfo of the shard it wrote (None when it wrote none; a shard of no rows is left
        out of the version and removed) and anything picklable.
    jobs : sequence of tuples
        Its arguments, one tuple per part, in the order of the parts' rows.
    dest : str
        The dataset directory.
    workers : int
        Processes to run on (1: this one).
    mode : str
        As for :func:`~rowstore.writer.commit.commit`.
    attrs : mapping or callable, optional
        The version's user attributes, or a function of the extras (in job order) giving them
        (called before the commit: an error it raises publishes nothing, as a job's does).
    progress : callable, optional
        ``progress(files, nbytes)``, called in this process as the workers report.

    Returns
    -------
    list
        The extras, in job order.

    Notes
    -----
    Workers are spawned, not forked (blosc2's thread pool hangs forked children). The first
    failing job in job order is the error raised: every job before it is waited for. On an
    error the shards written are removed, and ``dest`` too when it did not exist before the
    call and is left empty.
    """
    report: Report = progress if progress is not None else (lambda files, nbytes: None)
    fresh = not os.path.lexists(dest)
    results: list[tuple[ShardInfo | None, Any]] = []
    try:
        if workers == 1 or len(jobs) <= 1:
            for job in jobs:
                results.append(fn(*job, report=report))
        else:
            _on_processes(fn, jobs, workers, report, results)
        infos = [info for info, _ in results if info is not None and info.rows > 0]
        extras = [extra for _, extra in results]
        user = attrs(extras) if callable(attrs) else attrs
        commit(dest, infos, mode=mode, attrs=user)
        discard(dest, [info for info, _ in results if info is not None and info.rows == 0])
    except BaseException:
        discard(dest, [info for info, _ in results if info is not None])
        if fresh:
            _remove_empty(dest)
        raise
    return extras


def _remove_empty(dest: str) -> None:
    """Remove the directories the writing made in ``dest`` (new), if nothing else is there."""
    for d in (os.path.join(dest, SHARD_DIR), dest):
        try:
            os.rmdir(d)
        except OSError:
            pass  # not empty (someone else's files) or gone


def _on_processes(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    workers: int,
    report: Report,
    results: list[tuple[ShardInfo | None, Any]],
) -> None:
    """Run the jobs on spawned processes, appending their results to ``results`` in job order;
    on a failure, the results of every job that finished are in ``results`` (for the caller to
    remove their shards) when the error is raised."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()

    def drain() -> None:
        try:
            while True:
                report(*q.get_nowait())
        except queue.Empty:
            pass

    try:
        with ProcessPoolExecutor(
            min(workers, len(jobs)), mp_context=ctx, initializer=_init_worker, initargs=(q,)
        ) as ex:
            futures = [ex.submit(_run_in_worker, fn, job) for job in jobs]
            try:
                pending = set(futures)
                while pending:
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                    drain()
                    if any(f.exception() is not None for f in finished):
                        break
                for f in futures:  # the first failure in job order: the ones before waited for
                    results.append(f.result())
            except BaseException:
                for f in futures:
                    f.cancel()
                wait(futures)  # the ones running finish: their shards are removed by the caller
                results.clear()
                results.extend(
                    f.result() for f in futures if not f.cancelled() and f.exception() is None
                )
                raise
            finally:
                drain()
        drain()  # what the workers reported last: in the pipe now that they have exited
    finally:
        q.close()
        q.join_thread()
