"""The two passes, as functions a local run and Dask tasks share.

* :func:`scatter` (pass 1): stream blocks of the input (or of a pile being split again), give
  each row its key (:func:`._plan.row_keys`), and append the row, raw, to the pile of its key
  range. A pile part is an uncompressed rowstore file of the input's schema plus
  ``<file>.keys``, the rows' keys (``<u8``), in input order.
* :func:`write_pile` (pass 2): load a pile (its parts, in input order), sort it by key, and
  write it as output shards; a pile estimated above the plan's limit is first scattered again
  into sub-ranges (recursion), never loaded whole. Pile files are removed once consumed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from rowstore.errors import FormatError
from rowstore.format import manifest
from rowstore.format._raw import RawRows, heap_refs, take_raw
from rowstore.format.index import Layout
from rowstore.global_shuffle._plan import ROW_OVERHEAD, Plan, key_bounds, pile_of, row_keys
from rowstore.reader.raw import RawSource
from rowstore.schema import Schema
from rowstore.writer.commit import ShardInfo
from rowstore.writer.file import Writer

__all__ = ["Pile", "Counters", "OutputOptions", "scatter", "input_feed", "write_pile"]

KEYS_SUFFIX = ".keys"


@dataclass(frozen=True)
class Pile:
    """Rows whose keys lie in ``[lo, hi)``: ``parts`` (pile files, in input order)."""

    name: str
    lo: int
    hi: int
    parts: tuple[str, ...]


@dataclass
class Counters:
    """What a pass moved (bytes are raw: row records plus payloads; file bytes separately)."""

    rows: int = 0
    nbytes: int = 0
    file_read: int = 0
    file_written: int = 0
    splits: int = 0  # piles split again
    depth: int = 0  # deepest split (0: none)
    peak_rss: int = 0
    scoped: bool = True  # peak_rss is since the task started (VmHWM reset), not the process's

    def add(self, other: Counters) -> None:
        self.rows += other.rows
        self.nbytes += other.nbytes
        self.file_read += other.file_read
        self.file_written += other.file_written
        self.splits += other.splits
        self.depth = max(self.depth, other.depth)
        self.peak_rss = max(self.peak_rss, other.peak_rss)
        self.scoped = self.scoped and other.scoped


@dataclass(frozen=True)
class OutputOptions:
    """How output shards are written (every shard shares compression and heap chunk size)."""

    shard_bytes: int
    block_bytes: int
    compression: dict
    heap_chunk_bytes: int
    threads: int | None = None


# -- pass 1 ------------------------------------------------------------------------------------
Feed = Iterator[
    tuple[RawSource, int, int, np.ndarray]
]  # (source, blocks [k0, k1), their rows' keys)


def _groups(src: RawSource, blocks: range, group_bytes: int) -> Iterator[tuple[int, int]]:
    """Runs of consecutive blocks of about ``group_bytes`` (rows + heap ranges; at least one)."""
    k0, acc = blocks.start, 0
    for k in blocks:
        acc += src.block_nbytes(k)
        if acc >= group_bytes:
            yield k0, k + 1
            k0, acc = k + 1, 0
    if k0 < blocks.stop:
        yield k0, blocks.stop


def _group_rows(src: RawSource, k0: int, k1: int) -> tuple[int, int]:
    """(first dataset row, rows) of blocks ``k0 .. k1 - 1`` (their rows are consecutive)."""
    first, _ = src.block_rows(k0)
    last, n = src.block_rows(k1 - 1)
    return first, last + n - first


def input_feed(src: RawSource, seed: int, blocks: range, group_bytes: int = 8 << 20) -> Feed:
    """The input's blocks, in runs of about ``group_bytes``, with their keys (computed from the
    seed and the dataset row numbers)."""
    for k0, k1 in _groups(src, blocks, group_bytes):
        first, n = _group_rows(src, k0, k1)
        yield src, k0, k1, row_keys(seed, first, n)


def _pile_feed(pile: Pile, group_bytes: int) -> Feed:
    """A pile's blocks with their stored keys."""
    for part in pile.parts:
        with RawSource(part) as src:
            keys_path = part + KEYS_SUFFIX
            n = src.layout.num_rows
            size = os.path.getsize(keys_path)
            if size != 8 * n:
                raise FormatError(
                    f"{keys_path!r}: {size} bytes of keys for {n} rows (expected {8 * n})",
                    path=keys_path,
                )
            with open(keys_path, "rb") as f:
                for k0, k1 in _groups(src, range(src.num_blocks), group_bytes):
                    first, nk = _group_rows(src, k0, k1)
                    f.seek(8 * first)
                    keys = np.frombuffer(f.read(8 * nk), dtype="<u8").astype(np.uint64)
                    yield src, k0, k1, keys


class _PileFiles:
    """The pile parts one scatter writes (a file created at a pile's first row)."""

    def __init__(self, directory: str, tag: str, schema: Schema, npiles: int, block_bytes: int):
        self.directory, self.tag, self.schema, self.block_bytes = (
            directory,
            tag,
            schema,
            block_bytes,
        )
        self.writers: list[Writer | None] = [None] * npiles
        self.keys: list = [None] * npiles

    def path(self, q: int) -> str:
        return os.path.join(self.directory, f"{self.tag}{q:06d}.h5")

    def add(self, q: int, raw: RawRows, keys: np.ndarray) -> None:
        w = self.writers[q]
        if w is None:
            w = self.writers[q] = Writer(
                self.path(q),
                self.schema,
                block_bytes=self.block_bytes,
                heap_chunk_bytes=max(64, self.block_bytes),
                threads=1,
                durable=False,
            )
            self.keys[q] = open(
                self.path(q) + KEYS_SUFFIX, "wb", buffering=min(self.block_bytes, 1 << 16)
            )
        w.write_raw(raw)
        self.keys[q].write(keys.astype("<u8", copy=False).tobytes())

    def close(self) -> list[str | None]:
        out: list[str | None] = []
        for q, w in enumerate(self.writers):
            if w is None:
                out.append(None)
                continue
            self.keys[q].close()
            w.close()
            out.append(self.path(q))
        return out

    def abort(self) -> None:
        for q, w in enumerate(self.writers):
            if w is not None:
                w.abort()
                self.keys[q].close()


def scatter(
    feed: Feed,
    bounds: list[int],
    directory: str,
    tag: str,
    schema: Schema,
    block_bytes: int,
    counters: Counters,
    progress: Callable[[int, int], None] | None = None,
) -> list[str | None]:
    """Pass 1: every row of ``feed`` to the pile of its key range (``bounds``); the pile part
    written for each range (None for an empty one), named ``<directory>/<tag><range>.h5``."""
    files = _PileFiles(directory, tag, schema, len(bounds) - 1, block_bytes)
    try:
        for src, k0, k1, keys in feed:
            piles = pile_of(keys, bounds)
            order = np.argsort(piles, kind="stable")  # by pile, input order within one
            raw = src.blocks(k0, k1, order)
            cuts = np.zeros(len(bounds), np.int64)
            np.cumsum(np.bincount(piles, minlength=len(bounds) - 1), out=cuts[1:])
            sorted_keys = keys[order]
            for q in np.flatnonzero(np.diff(cuts)):
                a, b = int(cuts[q]), int(cuts[q + 1])
                files.add(int(q), raw.slice(a, b), sorted_keys[a:b])
            counters.rows += len(keys)
            counters.nbytes += raw.nbytes
            if progress is not None:
                progress(len(keys), raw.nbytes)
        parts = files.close()
    except BaseException:
        files.abort()
        raise
    counters.file_written += sum(_file_bytes(p) for p in parts if p)
    return parts


def _file_bytes(part: str) -> int:
    return os.path.getsize(part) + os.path.getsize(part + KEYS_SUFFIX)


def remove_pile(pile: Pile) -> None:
    for part in pile.parts:
        for p in (part, part + KEYS_SUFFIX):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


# -- pass 2 ------------------------------------------------------------------------------------
class _Shards:
    """Output shards of one pile, rolled over every ``shard_bytes``."""

    def __init__(self, root: str, schema: Schema, name: str, opts: OutputOptions):
        self.root, self.schema, self.name, self.opts = root, schema, name, opts
        self.infos: list[ShardInfo] = []
        self.w: Writer | None = None
        self.rel = ""

    def write(self, raw: RawRows) -> None:
        if self.w is None:
            self.rel = f"{manifest.SHARD_DIR}/{self.name}-{len(self.infos):04d}.h5"
            o = self.opts
            self.w = Writer(
                os.path.join(self.root, self.rel),
                self.schema,
                mode="x",
                block_bytes=o.block_bytes,
                compression=o.compression,
                heap_chunk_bytes=o.heap_chunk_bytes,
                threads=o.threads,
            )
        self.w.write_raw(raw)
        if self.w.raw_nbytes >= self.opts.shard_bytes:
            self._close_one()

    def _close_one(self) -> None:
        w, self.w = self.w, None
        assert w is not None
        w.close()
        self.infos.append(
            ShardInfo.from_layout(self.rel, Layout.open(os.path.join(self.root, self.rel)))
        )

    def close(self) -> list[ShardInfo]:
        if self.w is not None:
            self._close_one()
        return self.infos

    def abort(self) -> None:
        if self.w is not None:
            self.w.abort()
            self.w = None


def _estimate(pile: Pile) -> tuple[int, int]:
    """(rows, bytes of its rows, payloads and sort keys) of a pile, from its files' layouts.
    Loading it also takes the zero padding of each part's last block and heap chunk (at most
    two pile blocks a part), which splitting again would not remove."""
    rows = nbytes = 0
    for part in pile.parts:
        L = Layout.open(part)
        rows += L.num_rows
        nbytes += L.num_rows * L.row_dtype.itemsize + L.heap_nbytes
    return rows, nbytes + ROW_OVERHEAD * rows


def write_pile(
    pile: Pile,
    root: str,
    schema: Schema,
    plan: Plan,
    opts: OutputOptions,
    counters: Counters,
    split_dir: str,
    progress: Callable[[int, int], None] | None = None,
    depth: int = 0,
) -> list[ShardInfo]:
    """Pass 2 for one pile: its rows sorted by key, as shards in ``root`` (returned in order);
    the pile's files are removed once written (also on failure)."""
    try:
        if not pile.parts:
            return []
        rows, est = _estimate(pile)
        if est > plan.pile_limit and rows > 1 and pile.hi - pile.lo > 1:
            return _split(pile, root, schema, plan, opts, counters, split_dir, progress, depth, est)
        return _sort_and_write(pile, root, schema, plan, opts, counters, progress)
    finally:
        remove_pile(pile)


def _split(
    pile: Pile,
    root: str,
    schema: Schema,
    plan: Plan,
    opts: OutputOptions,
    counters: Counters,
    split_dir: str,
    progress: Callable[[int, int], None] | None,
    depth: int,
    est: int,
) -> list[ShardInfo]:
    """A pile too large for memory: scattered again into sub-ranges of its keys, each written
    in turn (their order is the key order, so the output is what one sort would give)."""
    q = plan.splits(est)
    bounds = key_bounds(pile.lo, pile.hi, q)
    sub_counters = Counters()
    parts = scatter(
        _pile_feed(pile, plan.chunk_bytes),
        bounds,
        split_dir,
        f"{pile.name}.",
        schema,
        plan.pile_block_bytes,
        sub_counters,
    )
    counters.file_read += sum(_file_bytes(p) for p in pile.parts)
    counters.file_written += sub_counters.file_written
    counters.splits += 1
    counters.depth = max(counters.depth, depth + 1)
    remove_pile(pile)
    subs = [
        Pile(f"{pile.name}.{i:04d}", bounds[i], bounds[i + 1], (p,) if p else ())
        for i, p in enumerate(parts)
    ]
    infos: list[ShardInfo] = []
    try:
        for s in subs:
            infos += write_pile(
                s, root, schema, plan, opts, counters, split_dir, progress, depth + 1
            )
    finally:
        for s in subs:
            remove_pile(s)
    return infos


def _sort_and_write(
    pile: Pile,
    root: str,
    schema: Schema,
    plan: Plan,
    opts: OutputOptions,
    counters: Counters,
    progress: Callable[[int, int], None] | None,
) -> list[ShardInfo]:
    srcs = [RawSource(p) for p in pile.parts]
    try:
        row_dtype = srcs[0].row_dtype
        rs = row_dtype.itemsize
        rows_buf = np.empty(max(1, sum(s.rows_nbytes for s in srcs)), np.uint8)
        heap = np.empty(sum(s.heap_nbytes for s in srcs), np.uint8)
        keys = np.empty(sum(s.layout.num_rows for s in srcs), np.uint64)
        pos = np.empty(len(keys), np.int64)  # each row's slot in rows_buf
        refs = heap_refs(schema, row_dtype)
        r0 = h0 = n0 = 0
        for s, part in zip(srcs, pile.parts):
            n = s.layout.num_rows
            s.load_into(rows_buf[r0 : r0 + s.rows_nbytes], heap[h0 : h0 + s.heap_nbytes])
            if h0 and refs and n:  # later parts: their references move by the heap before them
                view = rows_buf[r0 : r0 + n * rs].view(row_dtype)
                for name, _off in refs:
                    view[name]["offset"] += np.uint64(h0)
            got = np.fromfile(part + KEYS_SUFFIX, dtype="<u8")
            if len(got) != n:
                raise FormatError(
                    f"{part + KEYS_SUFFIX!r}: {len(got)} keys for {n} rows", path=part + KEYS_SUFFIX
                )
            keys[n0 : n0 + n] = got
            pos[n0 : n0 + n] = np.arange(r0 // rs, r0 // rs + n, dtype=np.int64)
            counters.file_read += _file_bytes(part)
            r0, h0, n0 = r0 + s.rows_nbytes, h0 + s.heap_nbytes, n0 + n
    finally:
        for s in srcs:
            s.close()
    if not len(keys):
        return []
    order = np.argsort(keys, kind="stable")  # ties (p ~ n^2 / 2^65) in input order
    del keys
    pos = pos[order]
    del order
    total = len(pos)
    avg = max(1, (rows_buf.nbytes + heap.nbytes) // max(1, total))
    step = max(1, plan.chunk_bytes // avg)
    out = _Shards(root, schema, pile.name, opts)
    try:
        for a in range(0, total, step):
            raw = take_raw(
                rows_buf,
                row_dtype,
                refs,
                pos[a : a + step],
                heap,
                base=0,
                lo=0,
                hi=len(heap),
                where=f"pile {pile.name}",
            )
            out.write(raw)
            counters.rows += len(raw)
            counters.nbytes += raw.nbytes
            if progress is not None:
                progress(len(raw), raw.nbytes)
        infos = out.close()
    except BaseException:
        out.abort()
        raise
    counters.file_written += sum(i.file_size for i in infos)
    return infos


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (``5`` to ``/proc/self/clear_refs``,
    Linux 4.0+), so that :func:`peak_rss` then tells the peak of what runs after; False where
    the kernel does not allow it (the peak is then the process's lifetime peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """This process's peak resident set size so far, in bytes: ``VmHWM`` of /proc (ru_maxrss
    would count the parent's memory at fork for a process started by a large one)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
