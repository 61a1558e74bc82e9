"""Out-of-core global shuffle: a uniform random permutation of a file or dataset larger than
memory, written as a new dataset, moving stored rows undecoded.

Two passes (see :mod:`._passes`): pass 1 streams the input block by block and appends each row,
raw, to the pile of its random key's range; pass 2 loads one pile at a time, sorts it by key and
writes output shards (a pile larger than the budget is scattered again, never loaded whole).
The order is the input sorted by per-row random keys (:mod:`._plan`): uniform, a function of
the seed and the input only (not of the memory budget, the number of piles or of workers).

The output appears only at the end: shards are written into a locked staging directory beside
it, committed there as a dataset, and the directory is renamed onto ``out_path``. Temporary
directories are removed on success and on failure; those of a killed run are removed by the next
run (:mod:`._work`).
"""

from __future__ import annotations

import errno
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rowstore import storage
from rowstore._check import nonneg_int, parse_bytes
from rowstore.format import manifest
from rowstore.global_shuffle._passes import (
    Counters,
    OutputOptions,
    Pile,
    input_feed,
    peak_rss,
    reset_peak_rss,
    scatter,
    write_pile,
)
from rowstore.global_shuffle._plan import (
    KEY_SPACE,
    MIN_MEMORY,
    ROW_OVERHEAD,
    Plan,
    key_bounds,
    make_plan,
)
from rowstore.global_shuffle._progress import Progress
from rowstore.global_shuffle._work import LockedDir, remove_stale
from rowstore.reader.raw import RawSource
from rowstore.schema import Schema
from rowstore.writer.commit import ShardInfo, commit
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES
from rowstore.writer.file import DEFAULT_BLOCK_BYTES, Writer

__all__ = ["shuffle", "ShuffleReport", "PassReport", "parse_bytes"]


@dataclass(frozen=True)
class PassReport:
    """One pass: rows and raw bytes (row records + payloads) moved, file bytes read and
    written, seconds."""

    rows: int
    nbytes: int
    file_read: int
    file_written: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.seconds, 1e-9)

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / max(self.seconds, 1e-9)


@dataclass(frozen=True)
class ShuffleReport:
    """What :func:`shuffle` did.

    ``passes`` counts passes over the data (2, plus the deepest re-split of a pile);
    ``peak_rss`` is the peak resident memory of the processes that ran the passes (this one, or
    the largest Dask worker's) while they ran them: each process's ``VmHWM`` is reset when a
    shuffle (or a pass task) starts. ``peak_scope`` is ``"shuffle"`` when it was, ``"process"``
    where the kernel refused the reset (``peak_rss`` then includes what the process held before).
    ``rss_before`` is this process's RSS when the shuffle started.
    """

    output: str
    rows: int
    nbytes: int
    passes: int
    piles: int
    splits: int
    memory: int
    peak_rss: int
    rss_before: int
    seconds: float
    pass1: PassReport
    pass2: PassReport
    peak_scope: str = "shuffle"

    def summary(self) -> str:
        mib = 2**20
        lines = [
            f"shuffled {self.rows:,} rows ({self.nbytes / mib:,.1f} MiB) into {self.output} in "
            f"{self.seconds:.2f} s",
            f"passes {self.passes} ({self.piles} piles, {self.splits} split again), memory budget "
            f"{self.memory / mib:,.0f} MiB, peak RSS {self.peak_rss / mib:,.0f} MiB"
            + (
                " (during the shuffle)"
                if self.peak_scope == "shuffle"
                else " (the process's lifetime peak: this kernel cannot reset it)"
            ),
        ]
        for name, p in (("pass 1 (scatter)", self.pass1), ("pass 2 (sort + write)", self.pass2)):
            lines.append(
                f"{name}: {p.seconds:.2f} s, {p.rows_per_s:,.0f} rows/s, {p.mb_per_s:,.1f} MB/s; "
                f"read {p.file_read / mib:,.1f} MiB, wrote {p.file_written / mib:,.1f} MiB"
            )
        return "\n".join(lines)


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# -- tasks (module-level: they pickle to Dask workers) ------------------------------------------
def scatter_task(
    in_path: str,
    seed: int,
    blocks: tuple[int, int],
    bounds: list[int],
    directory: str,
    tag: str,
    block_bytes: int,
    group_bytes: int,
    verify: bool | str = True,
    storage_options: dict | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[str | None], Counters]:
    """Pass 1 over input blocks ``[blocks[0], blocks[1])``, read in runs of about
    ``group_bytes``: the pile parts written (one per key range, None where empty) and what was
    moved."""
    c = Counters(scoped=reset_peak_rss())
    with RawSource(in_path, verify=verify, storage_options=storage_options) as src:
        parts = scatter(
            input_feed(src, seed, range(*blocks), group_bytes),
            bounds,
            directory,
            tag,
            src.schema,
            block_bytes,
            c,
            progress,
        )
        a = src.layout.arrays()
        c.file_read += int(a["stored"][blocks[0] : blocks[1]].sum())
    c.peak_rss = peak_rss()
    return parts, c


def pile_task(
    pile: Pile,
    root: str,
    schema_json: str,
    plan: Plan,
    opts: OutputOptions,
    split_dir: str,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[ShardInfo], Counters]:
    """Pass 2 for one pile: its output shards, in order, and what was moved."""
    c = Counters(scoped=reset_peak_rss())
    infos = write_pile(
        pile, root, Schema.from_json(schema_json), plan, opts, c, split_dir, progress
    )
    c.peak_rss = peak_rss()
    return infos, c


Mapper = Callable[[Callable[..., Any], Sequence[tuple], Progress], list]


def serial_map(fn: Callable[..., Any], args: Sequence[tuple], progress: Progress) -> list:
    """Run tasks here, one after the other, with live progress."""
    return [fn(*a, progress=progress.update) for a in args]


# -- the run -----------------------------------------------------------------------------------
def _check_paths(in_path: str, out_path: str, tmp: str | None) -> tuple[str, str]:
    try:
        storage.local_only(out_path, "shuffle's output", file_urls=False)
    except ValueError:
        raise ValueError(
            f"shuffle: the output must be a local directory, got the URL {out_path!r}"
        ) from None
    where = storage.locate(in_path)
    if where.local and not os.path.exists(where.path):  # (a URL is checked when opened)
        raise FileNotFoundError(f"shuffle: input {in_path!r} does not exist")
    if os.path.lexists(out_path):
        raise FileExistsError(
            f"shuffle: output {out_path!r} exists; shuffle writes a new dataset (remove it first)"
        )
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"shuffle: the output's directory {parent!r} does not exist")
    work = parent if tmp is None else os.fspath(tmp)
    if not os.path.isdir(work):
        raise NotADirectoryError(f"shuffle: tmp {work!r} is not a directory")
    return parent, work


def check_arguments(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    memory: int | str,
    seed: int,
    tmp: str | os.PathLike | None,
    shard_bytes: int | str = DEFAULT_SHARD_BYTES,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> tuple[int, int, str, str]:
    """Check a shuffle's arguments before any work: ``(memory, shard_bytes, output's directory,
    piles' directory)``; ``ValueError``/``OSError`` subclasses saying what was expected."""
    nonneg_int("seed", seed)
    budget = parse_bytes(memory, "memory")
    if budget < MIN_MEMORY:
        raise ValueError(f"memory must be at least {MIN_MEMORY >> 20} MiB, got {memory!r}")
    shard_limit = parse_bytes(shard_bytes, "shard_bytes")
    if (
        not isinstance(block_bytes, int)
        or isinstance(block_bytes, bool)
        or not 1 <= block_bytes <= 1 << 30
    ):
        raise ValueError(f"block_bytes must be an int in 1..{1 << 30}, got {block_bytes!r}")
    src, dst = os.fspath(in_path), os.fspath(out_path)
    if storage.absolute(src) == os.path.abspath(dst):
        raise ValueError(f"shuffle: the output {dst!r} is the input")
    parent, work = _check_paths(src, dst, None if tmp is None else os.fspath(tmp))
    return budget, shard_limit, parent, work


def run(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    memory: int | str,
    seed: int,
    tmp: str | os.PathLike | None,
    shard_bytes: int | str,
    block_bytes: int,
    compression: Any,
    verify: bool | str,
    progress: bool,
    tasks: int,
    mapper: Mapper,
    storage_options: dict | None = None,
) -> ShuffleReport:
    """The shuffle, with pass tasks run by ``mapper`` (here, or on Dask workers)."""
    t0 = time.perf_counter()
    rss0 = _rss_now()
    reset_peak_rss()  # peak_rss from here on: the shuffle's, not what this process held before
    budget, shard_limit, parent, work = check_arguments(
        in_path,
        out_path,
        memory=memory,
        seed=seed,
        tmp=tmp,
        shard_bytes=shard_bytes,
        block_bytes=block_bytes,
    )
    src_path, dst_path = os.fspath(in_path), os.fspath(out_path)
    with RawSource(src_path, verify=verify, storage_options=storage_options) as src:
        L = src.layout
        schema = L.schema
        rows, rs = L.num_rows, L.row_dtype.itemsize
        data = rows * rs + L.heap_nbytes
        nblocks = L.num_blocks
        comp = dict(L.compression) if compression == "same" else compression
        opts = OutputOptions(shard_limit, block_bytes, comp, L.heap_chunk_bytes)
        attrs = dict(L.user_attrs)
        in_stored = L.stored_nbytes
        biggest_block = int(L.arrays()["raw"].max()) if nblocks else 0
    for d in {parent, work}:
        remove_stale(d)
    plan = make_plan(budget, data + ROW_OVERHEAD * rows, block_bytes=block_bytes)
    if biggest_block > budget // 8:
        warnings.warn(
            f"shuffle: the input's blocks ({biggest_block} bytes of rows) are large for a memory "
            f"budget of "
            f"{budget} bytes: a block is read whole, so peak memory may exceed the budget by a few "
            "blocks",
            RuntimeWarning,
            stacklevel=3,
        )
    _check_space(work, parent, piles=data, output=in_stored)
    bounds = key_bounds(0, KEY_SPACE, plan.num_piles)
    piles_dir = LockedDir(work, "piles")
    staging = LockedDir(parent, "out")
    try:
        # pass 1
        ntasks = max(1, min(tasks, nblocks))
        ranges = [(nblocks * t // ntasks, nblocks * (t + 1) // ntasks) for t in range(ntasks)]
        p1 = Progress("pass 1: scatter", data, enabled=progress)
        args1 = [
            (
                src_path,
                seed,
                r,
                bounds,
                piles_dir.path,
                f"t{t:05d}-p",
                plan.pile_block_bytes,
                plan.chunk_bytes,
                verify,
                storage_options,
            )
            for t, r in enumerate(ranges)
        ]
        results1 = mapper(scatter_task, args1, p1)
        p1.close()
        c1 = Counters()
        for _, c in results1:
            c1.add(c)
        c1.file_read = in_stored
        s1 = p1.seconds
        piles = [
            Pile(
                f"p{q:06d}",
                bounds[q],
                bounds[q + 1],
                tuple(parts[q] for parts, _ in results1 if parts[q]),
            )
            for q in range(plan.num_piles)
        ]
        # pass 2
        os.makedirs(os.path.join(staging.path, manifest.SHARD_DIR))
        p2 = Progress("pass 2: sort + write", data, enabled=progress)
        args2 = [
            (pile, staging.path, schema.to_json_str(), plan, opts, piles_dir.path) for pile in piles
        ]
        results2 = mapper(pile_task, args2, p2)
        p2.close()
        c2 = Counters()
        infos: list[ShardInfo] = []
        for shard_infos, c in results2:
            infos += shard_infos
            c2.add(c)
        s2 = p2.seconds
        if not infos:  # an empty input: one empty shard (a dataset names at least one)
            rel = f"{manifest.SHARD_DIR}/empty.h5"
            with Writer(
                os.path.join(staging.path, rel),
                schema,
                mode="x",
                compression=comp,
                heap_chunk_bytes=L.heap_chunk_bytes,
            ):
                pass
            from rowstore.format.index import Layout

            infos = [ShardInfo.from_layout(rel, Layout.open(os.path.join(staging.path, rel)))]
        commit(staging.path, infos, mode="x", attrs=attrs)
        # The output appears, whole. (rename would also replace an empty directory created at
        # out_path since the check at the start; anything else there makes it fail.)
        try:
            os.rename(staging.path, dst_path)
        except OSError as exc:
            if exc.errno in (
                errno.ENOTEMPTY,
                errno.EEXIST,
                errno.ENOTDIR,
                errno.EISDIR,
            ) and os.path.lexists(dst_path):
                raise FileExistsError(
                    errno.EEXIST,
                    f"shuffle: output {dst_path!r} was created by another run (or "
                    f"process) while this one worked; this run's copy is discarded and "
                    f"{dst_path!r} left as that run made it",
                    dst_path,
                ) from None
            raise
        _fsync_dir(parent)
    except BaseException:
        staging.remove()
        piles_dir.remove()
        raise
    staging.release()
    piles_dir.remove()
    return ShuffleReport(
        output=dst_path,
        rows=rows,
        nbytes=data,
        passes=2 + max(c1.depth, c2.depth),
        piles=plan.num_piles,
        splits=c2.splits,
        memory=budget,
        peak_rss=max(c1.peak_rss, c2.peak_rss),
        rss_before=rss0,
        peak_scope="shuffle" if c1.scoped and c2.scoped else "process",
        seconds=time.perf_counter() - t0,
        pass1=PassReport(c1.rows, c1.nbytes, c1.file_read, c1.file_written, s1),
        pass2=PassReport(c2.rows, c2.nbytes, c2.file_read, c2.file_written, s2),
    )


def _check_space(work: str, parent: str, *, piles: int, output: int) -> None:
    """``OSError(ENOSPC)`` before any work when the piles (about the input's raw bytes, in
    ``work``) and the output (about the input's stored bytes, beside it) cannot fit."""
    need: dict[int, int] = {}
    free: dict[int, int] = {}
    for d, n in ((work, piles), (parent, output)):
        st = os.statvfs(d)
        dev = os.stat(d).st_dev
        need[dev] = need.get(dev, 0) + n
        free[dev] = st.f_bavail * st.f_frsize
    for dev, n in need.items():
        if n > free[dev]:
            where = work if os.stat(work).st_dev == dev else parent
            raise OSError(
                errno.ENOSPC,
                f"shuffle needs about {n / 1e6:,.0f} MB free for its piles and output on the "
                f"filesystem of {where!r}; {free[dev] / 1e6:,.0f} MB are free (pass tmp= "
                "to put the piles elsewhere)",
            )


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def shuffle(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    memory: int | str = "2GB",
    seed: int = 0,
    tmp: str | os.PathLike | None = None,
    shard_bytes: int | str = DEFAULT_SHARD_BYTES,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    compression: Any = "same",
    verify: bool | str = True,
    progress: bool = False,
    storage_options: dict | None = None,
) -> ShuffleReport:
    """Write a uniformly shuffled copy of a file or dataset as a new dataset, through bounded
    memory.

    Parameters
    ----------
    in_path : str or os.PathLike
        A ``.h5`` file or a dataset directory, local or a URL (``s3://``, ``http(s)://``, any
        fsspec protocol: read by byte ranges, see "Object storage" in docs/api.md).
    out_path : str or os.PathLike
        The local dataset directory to create (must not exist). It appears only when complete.
    memory : int or str
        Memory budget: ``"2GB"``, ``"256MiB"`` or bytes (at least 4 MiB). Peak RSS stays within
        it plus a constant (the interpreter, libraries, the input's index: see
        docs/performance.md).
    seed : int
        The permutation is a pure function of ``seed`` and the input's rows: the same for any
        ``memory``, ``tmp`` or number of workers (:func:`rowstore.dask.shuffle` gives the same
        output as this function).
    tmp : str or os.PathLike, optional
        Directory for the piles (about the input's size, consumed pile by pile in pass 2);
        default: the output's directory.
    shard_bytes : int or str
        Target raw bytes of an output shard (each pile's rows start a new shard).
    block_bytes : int
        Target bytes of an output block.
    compression : "same", None, str or dict
        The output's block compression; ``"same"`` (default): the input's.
    verify : bool or "always"
        Checksum every input chunk read (default).
    progress : bool
        Show a progress bar per pass on stderr (tqdm if installed). Quiet by default.
    storage_options : dict, optional
        For a URL input, as for :func:`rowstore.open`.

    Returns
    -------
    ShuffleReport
        Rows, bytes, passes, piles, peak memory, seconds per pass; ``.summary()`` as text.

    Notes
    -----
    Stored rows move as bytes: encoded images stay encoded, variable-length values and strings
    are copied as stored. Disk: the input, the output and the piles (about one input size at
    the start of pass 2, then shrinking as the output grows: at most input + output + one pile
    at any time). The piles' and staging directories are removed on success and on failure; a
    killed run's stay behind unlocked, and the next shuffle using the same directories removes
    them. User attributes are copied.
    """
    return run(
        in_path,
        out_path,
        memory=memory,
        seed=seed,
        tmp=tmp,
        shard_bytes=shard_bytes,
        block_bytes=block_bytes,
        compression=compression,
        verify=verify,
        progress=progress,
        tasks=1,
        mapper=serial_map,
        storage_options=storage_options,
    )
