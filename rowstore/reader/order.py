"""Epoch orders as pure functions of (seed, epoch, block layout, rank, world).

No hidden RNG state and no time-based seeds: the same arguments give the same order in any
process, so DataLoader workers, DDP ranks and a resumed job agree without talking.

Modes
-----
``"block"``: permute the blocks, group them into windows of ``window`` consecutive blocks of
    that permutation, and permute the rows inside each window. Reads are whole blocks; memory
    is one window; each batch mixes rows of about ``window`` blocks.
    With ``pieces=k`` (default 1) the unit is a piece, ``ceil(rows_per_block / k)``
    consecutive rows of a block, instead of the block: the pieces of all blocks are permuted,
    grouped into windows of ``window`` pieces, and the rows inside each window permuted. The
    same memory per window holds rows of up to ``k`` times more blocks, so batches are that
    much more mixed (``pieces=1`` is the order above). The reader loads
    only the pieces of uncompressed local files; a compressed block is decompressed whole, so
    there ``pieces > 1`` costs up to ``k`` times the decompression per row.
``"full"``: a uniform permutation of all rows (memory: 8 bytes per row of the shard's epoch).
``"none"``: rows in file order.

Sharding: the epoch order (one sequence of all rows) is cut into ``world`` contiguous parts
whose sizes differ by at most one row; part ``rank`` is that rank's epoch. Parts are disjoint
and together hold every row exactly once. With ``even=True`` every part has exactly
``num_rows // world`` rows: the last ``num_rows % world`` rows of the epoch order are left out of
that epoch (different rows each epoch, since the order changes), which keeps DDP ranks in step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from rowstore._check import nonneg_int, positive_int
from rowstore.format import spec

__all__ = [
    "MODES",
    "shuffle_mode",
    "check_args",
    "check_shard",
    "Segment",
    "EpochOrder",
    "seed64",
    "permutation",
    "shuffle_reference",
    "shard_bounds",
    "iter_segments",
    "epoch_order",
    "batch_blocks",
    "shuffle_quality",
    "WINDOW_BLOCKS",
    "AUTO_PIECES",
    "auto_pieces",
    "resolve_order",
]

MODES = ("block", "full", "none")

#: Memory of a window by default, in blocks: the default ``window`` is this many units of
#: ``pieces`` pieces each, so a window holds about ``WINDOW_BLOCKS`` blocks of rows whatever
#: ``pieces`` is.
WINDOW_BLOCKS = 16
#: Pieces per block of the default block order where the reader loads pieces alone
#: (uncompressed blocks read directly): batches draw from up to 8 times more blocks for the
#: same memory and about the same speed (``docs/order.md``).
AUTO_PIECES = spec.BLOCK_PIECES  # the writer makes these pieces start on pages


def auto_pieces(rows_per_block: int, piecewise: bool, table_share: float = 0.0) -> int:
    """Pieces per block of the default block order: 1 unless ``piecewise`` (the reader loads
    a piece without the rest of its block: uncompressed blocks, direct reads); then
    :data:`AUTO_PIECES`, at most ``rows_per_block``, and at most ``1 / table_share`` where
    ``table_share`` is the row table's share of a block's bytes (rows with heap payloads: a
    window of ``p`` times more units loads up to that many row-table blocks whole, so they
    must be small)."""
    if not piecewise:
        return 1
    p = min(AUTO_PIECES, max(1, int(rows_per_block)))
    if table_share > 0:
        p = min(p, max(1, int(1.0 / table_share)))
    return p


def resolve_order(
    shuffle: str,
    window: int | None,
    pieces: int | None,
    rows_per_block: int,
    auto: int = 1,
) -> tuple[int, int]:
    """The ``(window, pieces)`` an epoch uses, from the given ones (None: the default).

    ``pieces`` None: ``auto`` (:func:`auto_pieces` of the layout) in block mode when ``window``
    is not given either, else 1 (a given ``window`` alone keeps whole blocks). ``window`` None:
    :data:`WINDOW_BLOCKS` blocks of rows, ``WINDOW_BLOCKS * pieces`` units (``pieces`` at most
    ``rows_per_block``, as the order cuts them). The one place the defaults are decided.
    """
    if pieces is None:
        pieces = auto if window is None and shuffle == "block" else 1
    pieces = positive_int("pieces", pieces)
    if window is None:
        cut = min(pieces, max(1, int(rows_per_block))) if shuffle == "block" else 1
        window = WINDOW_BLOCKS * cut
    return positive_int("window", window), pieces


_STREAM_BLOCKS, _STREAM_WINDOW, _STREAM_FULL = 1, 2, 3
_MASK64 = (1 << 64) - 1


def seed64(seed: int, epoch: int, *keys: int) -> int:
    """The 64-bit shuffle seed for one (seed, epoch, purpose...) key, via numpy's SeedSequence."""
    ss = np.random.SeedSequence([int(seed), int(epoch), *map(int, keys)])
    return int(ss.generate_state(1, np.uint64)[0])


def permutation(n: int, seed: int) -> np.ndarray:
    """A permutation of ``range(n)`` (int64): the compiled Fisher-Yates of
    :func:`shuffle_reference`."""
    from rowstore import kernels

    a = np.arange(n, dtype=np.int64)
    kernels.shuffle(a, seed)
    return a


def shuffle_reference(a: list[int], seed: int) -> list[int]:
    """Slow pure-Python statement of the shuffle the kernel runs (tests compare the two).

    SplitMix64 generates 64-bit words; a uniform integer below ``b`` is Lemire's
    ``(x * b) >> 64``, redrawing while ``(x * b) mod 2**64 < (2**64 - b) mod b``; Fisher-Yates
    swaps ``a[i]`` with ``a[j]``, ``j = bounded(i + 1)``, for ``i`` from ``n - 1`` down to 1.
    """
    a = list(a)
    state = seed & _MASK64

    def nxt() -> int:
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    for i in range(len(a) - 1, 0, -1):
        b = i + 1
        x = nxt()
        lo = (x * b) & _MASK64
        if lo < b:
            threshold = ((1 << 64) - b) % b
            while lo < threshold:
                x = nxt()
                lo = (x * b) & _MASK64
        j = (x * b) >> 64
        a[i], a[j] = a[j], a[i]
    return a


def shuffle_mode(shuffle: Any) -> str:
    """The epoch order mode of a ``shuffle`` argument: ``True`` is ``"block"`` (shuffled
    blocks, rows mixed within a window), ``False``/``None`` is ``"none"``, a name of
    :data:`MODES` is itself; anything else raises ``ValueError``."""
    if shuffle is True:
        return "block"
    if shuffle is False or shuffle is None:
        return "none"
    if not isinstance(shuffle, str) or shuffle not in MODES:
        raise ValueError(f"shuffle must be one of {MODES} (or True/False), got {shuffle!r}")
    return shuffle


def check_args(shuffle: str, seed: int, epoch: int, window: int, rank: int, world: int) -> None:
    """``ValueError`` naming the argument unless ``shuffle`` is a name of :data:`MODES`,
    ``seed``/``epoch`` are ints >= 0, ``window`` an int >= 1 and ``(rank, world)`` a shard."""
    if shuffle not in MODES:
        raise ValueError(f"shuffle must be one of {MODES}, got {shuffle!r}")
    nonneg_int("seed", seed)
    nonneg_int("epoch", epoch)
    positive_int("window", window)
    check_shard(rank, world)


def check_shard(rank: int, world: int) -> None:
    """``ValueError`` unless ``0 <= rank < world`` are ints (bools refused)."""
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (rank, world))
    if not ints or world < 1 or not 0 <= rank < world:
        raise ValueError(
            f"shard must be (rank, world) with 0 <= rank < world, got ({rank!r}, {world!r})"
        )


def shard_bounds(num_rows: int, rank: int, world: int, even: bool = False) -> tuple[int, int]:
    """The [lo, hi) positions of ``rank``'s part of an epoch order of ``num_rows`` rows."""
    if even:
        size = num_rows // world
        return rank * size, (rank + 1) * size
    return rank * num_rows // world, (rank + 1) * num_rows // world


class Segment:
    """A consecutive part of an epoch order, computed when first asked (a pure function; the
    shuffle runs without the GIL, so reader threads compute segments in parallel).

    ``rows()`` gives global row ids (``block * rows_per_block + row``). A window segment also
    holds ``blocks``, the sorted blocks of its window, and ``local()``, each row's position
    among those blocks loaded in that order (``slot * rows_per_block + row``): all the reader
    needs to gather from whole blocks, without mapping rows to slots again.
    """

    __slots__ = (
        "blocks",
        "_rows",
        "_local",
        "_block_rows",
        "_rpb",
        "_seed",
        "_a",
        "_z",
        "_keep",
        "_first",
        "pad",
        "_eo",
        "units",
        "pieces",
        "_ulocal",
    )

    def __init__(
        self,
        rows=None,
        *,
        blocks=None,
        block_rows=None,
        rpb=0,
        seed=None,
        a=0,
        z=0,
        keep=None,
        first=None,
        pad=False,
        order=None,
        units=None,
        pieces=1,
    ):
        self._eo = order  # a position range [a, z) of this EpochOrder, its rows computed when asked
        # Pieces (pieces > 1): the window is made of ``units`` (sorted; unit u is piece u % pieces
        # of block u // pieces), and ``blocks`` are the blocks they lie in.
        self.units, self.pieces, self._ulocal = units, pieces, None
        if units is not None and pieces > 1:
            blocks = np.unique(units // pieces)
        elif units is not None:
            blocks = units
        self.blocks = blocks
        self._rows = rows
        self._local = None
        self._block_rows, self._rpb, self._seed, self._a, self._z = block_rows, rpb, seed, a, z
        self._keep, self._first = keep, first
        self.pad = pad  # rows repeated to even out steps (see EpochPlan), marked "__pad"

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else self._z - self._a

    @property
    def piece_rows(self) -> int:
        """Rows per piece (the block's rows for ``pieces=1``)."""
        return -(-self._rpb // self.pieces)

    def piece_local(self) -> np.ndarray | None:
        """Window segments: each row's position among the window's units loaded in sorted
        order, ``unit slot * piece_rows + row in the piece`` (for ``pieces=1`` the same as
        :meth:`local`); None otherwise."""
        if self._ulocal is None and self._block_rows is not None:
            from rowstore import kernels

            units, P = (self.units if self.units is not None else self.blocks), self.piece_rows
            counts, start = self.unit_rows()
            # The window's rows, unit after unit in sorted order, then shuffled in place.
            loc = kernels.fill_runs(np.arange(len(units), dtype=np.int64) * P, counts)
            if self._seed is not None:
                kernels.shuffle(loc, self._seed)
            if self._keep is not None:  # a row subset: the window's order without the other rows
                slot = loc // P
                blk = units[slot] // self.pieces
                loc = loc[self._keep[self._first[blk] + start[slot] + (loc - slot * P)]]
            self._ulocal = loc[self._a : self._z]
        return self._ulocal

    def unit_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows of each unit of the window and its first row in its block."""
        units, P = (self.units if self.units is not None else self.blocks), self.piece_rows
        start = (units % self.pieces) * P
        counts = np.minimum(np.maximum(self._block_rows[units // self.pieces] - start, 0), P)
        return counts, start

    def local(self) -> np.ndarray | None:
        """Window segments: slot-local row positions (see the class); None otherwise."""
        if self._local is None and self._block_rows is not None:
            loc = self.piece_local()
            assert loc is not None
            units = self.units
            if self.pieces > 1 and units is not None:  # unit slots -> block slots
                P = self.piece_rows
                slot = loc // P
                bslot = np.searchsorted(self.blocks, units // self.pieces)
                loc = (bslot * self._rpb + (units % self.pieces) * P - np.arange(len(units)) * P)[
                    slot
                ] + loc
            self._local = loc
        return self._local

    def rows(self) -> np.ndarray:
        if self._rows is None and self._eo is not None:
            self._rows = self._eo.ids(self._a, self._z)
        if self._rows is None:
            loc = self.local()
            slot = loc // self._rpb
            self._rows = self.blocks[slot] * self._rpb + (loc - slot * self._rpb)
        return self._rows


class EpochOrder:
    """One epoch's order of a layout, computed once and cut into :class:`Segment`\\ s of any
    position range ``[lo, hi)`` (the dealt plans read many short ranges of one epoch).

    ``pieces`` (block mode): pieces per block, the unit of the permutation and of ``window``
    (see the module); ``window``/``pieces`` None are :func:`resolve_order`'s defaults with
    ``auto=1`` (a reader passes the values it resolved for its file). ``keep`` (bool per
    dataset row, optional) restricts the epoch to a row subset: the order is the full epoch
    order with the other rows left out (so a subset's order is a pure function of the same
    arguments, and positions count kept rows only).
    """

    def __init__(
        self,
        block_rows: np.ndarray,
        rows_per_block: int,
        *,
        shuffle: str = "block",
        seed: int = 0,
        epoch: int = 0,
        window: int | None = None,
        keep: np.ndarray | None = None,
        pieces: int | None = None,
    ):
        window, pieces = resolve_order(shuffle, window, pieces, rows_per_block)
        check_args(shuffle, seed, epoch, window, 0, 1)
        self.block_rows = br = np.asarray(block_rows, dtype=np.int64)
        self.rpb, self.shuffle, self.seed, self.epoch, self.window = (
            rows_per_block,
            shuffle,
            seed,
            epoch,
            window,
        )
        # Pieces per block (block mode): the unit of the permutation and of the window.
        self.pieces = pieces = min(pieces, max(1, rows_per_block)) if shuffle == "block" else 1
        nblocks = len(br)
        self._first = np.cumsum(br) - br  # each block's first dataset row
        self.keep = None if keep is None else np.asarray(keep, dtype=bool)
        if self.keep is not None and len(self.keep) != int(br.sum()):
            raise ValueError(
                f"keep must hold one bool per row ({int(br.sum())}), got {len(self.keep)}"
            )
        if self.keep is None:
            self._kept = br
        else:
            c = np.concatenate(([0], np.cumsum(self.keep, dtype=np.int64)))
            self._kept = c[self._first + br] - c[self._first]
        self.num_rows = int(self._kept.sum())
        self._perm: np.ndarray | None = None
        self._lock = threading.Lock()  # reader threads share the window cache of ids()
        if shuffle == "full":
            return
        nunits = nblocks * pieces
        if pieces == 1:
            unit_kept = self._kept
        else:
            P = -(-rows_per_block // pieces)
            u = np.arange(nunits, dtype=np.int64)
            lo = np.minimum((u % pieces) * P, br[u // pieces])
            hi = np.minimum(lo + P, br[u // pieces])
            if self.keep is None:
                unit_kept = hi - lo
            else:
                base = self._first[u // pieces]
                unit_kept = c[base + hi] - c[base + lo]
        # ``blocks``: the permuted units (blocks when pieces == 1), windows of ``window`` of them.
        if shuffle == "block":
            self.blocks = permutation(nunits, seed64(seed, epoch, _STREAM_BLOCKS))
        else:
            self.blocks = np.arange(nunits, dtype=np.int64)
        self._win_starts = np.arange(0, nunits, window)
        self._win_rows = (
            np.add.reduceat(unit_kept[self.blocks], self._win_starts)
            if nunits
            else np.zeros(0, np.int64)
        )
        self._win_end = np.cumsum(self._win_rows)

    def __getstate__(self) -> dict:
        st = dict(self.__dict__)
        st.pop("_lock", None)
        st.pop("_wcache", None)
        return st

    def __setstate__(self, st: dict) -> None:
        self.__dict__.update(st)
        self._lock = threading.Lock()

    def _full(self) -> np.ndarray:
        """``full`` mode: the epoch's permutation as row ids (computed once)."""
        if self._perm is None:
            n = int(self.block_rows.sum())
            perm = permutation(n, seed64(self.seed, self.epoch, _STREAM_FULL))
            if self.keep is not None:
                perm = perm[self.keep[perm]]
            b = np.searchsorted(self._first, perm, side="right") - 1
            self._perm = np.arange(len(self.block_rows), dtype=np.int64)[b] * self.rpb + (
                perm - self._first[b]
            )
        return self._perm

    def segments(self, lo: int, hi: int, segment_rows: int | None = None) -> Iterator[Segment]:
        """The order's positions ``[lo, hi)`` as consecutive segments (windows, or slices of
        ``segment_rows`` rows of the permutation in ``full`` mode)."""
        lo, hi = max(0, int(lo)), min(int(hi), self.num_rows)
        if lo >= hi:
            return
        if self.shuffle == "full":
            part = self._full()[lo:hi]
            step = segment_rows or max(1, self.window * self.rpb)
            for i in range(0, len(part), step):
                yield Segment(part[i : i + step])
            return
        win_end, win_rows = self._win_end, self._win_rows
        first_win = int(np.searchsorted(win_end, lo, side="right"))
        pos = int(win_end[first_win - 1]) if first_win else 0
        for w in range(first_win, len(self._win_starts)):
            if pos >= hi:
                break
            m = int(win_rows[w])
            a, z = max(lo - pos, 0), min(hi - pos, m)
            pos += m
            if a < z:
                yield self._window(w, a, z)

    def aligned(self, lo: int, hi: int, step: int) -> Iterator[Segment]:
        """The order's positions ``[lo, hi)`` as segments of ``step`` rows (the last shorter),
        each a position range whose rows are computed when first asked (by a reader thread).

        The same rows in the same order as :meth:`segments`, cut elsewhere: where the reader
        reads rows directly (no window of blocks to load), cutting at multiples of the batch
        size means no batch straddles two segments, so none is concatenated (a copy of its
        bytes) and a segment's fixed costs are spread over whole batches.
        """
        lo, hi = max(0, int(lo)), min(int(hi), self.num_rows)
        step = positive_int("step", step)
        for a in range(lo, hi, step):
            yield Segment(order=self, a=a, z=min(a + step, hi))

    def ids(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Row ids at positions ``[lo, hi)`` of the order. Windows are computed once and the
        last few kept, so many short ranges of one window (a batch sampler's batches) cost one
        window shuffle, not one each."""
        lo, hi = max(0, int(lo)), min(self.num_rows if hi is None else int(hi), self.num_rows)
        if lo >= hi:
            return np.zeros(0, np.int64)
        if self.shuffle == "full":
            return self._full()[lo:hi]
        parts = []
        w = int(np.searchsorted(self._win_end, lo, side="right"))
        while lo < hi:
            start = int(self._win_end[w - 1]) if w else 0
            ids = self._window_ids(w)
            a, z = lo - start, min(hi - start, len(ids))
            parts.append(ids[a:z])
            lo, w = start + z, w + 1
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _window(self, w: int, a: int, z: int) -> Segment:
        """Positions ``[a, z)`` of window ``w`` as a segment."""
        wb = np.sort(self.blocks[self._win_starts[w] : self._win_starts[w] + self.window])
        wseed = (
            seed64(self.seed, self.epoch, _STREAM_WINDOW, w) if self.shuffle == "block" else None
        )
        return Segment(
            units=wb,
            pieces=self.pieces,
            block_rows=self.block_rows,
            rpb=self.rpb,
            seed=wseed,
            a=a,
            z=z,
            keep=self.keep,
            first=self._first,
        )

    def _window_ids(self, w: int) -> np.ndarray:
        cache = self.__dict__.setdefault("_wcache", {})
        with self._lock:
            ids = cache.get(w)
        if ids is None:  # two threads may compute one window twice: the same pure result
            ids = self._window(w, 0, int(self._win_rows[w])).rows()
            with self._lock:
                if len(cache) >= 4:
                    cache.pop(next(iter(cache)))
                cache[w] = ids
        return ids


def iter_segments(
    block_rows: np.ndarray,
    rows_per_block: int,
    *,
    shuffle: str = "block",
    seed: int = 0,
    epoch: int = 0,
    window: int | None = None,
    rank: int = 0,
    world: int = 1,
    even: bool = False,
    start: int = 0,
    segment_rows: int | None = None,
    keep: np.ndarray | None = None,
    pieces: int | None = None,
) -> Iterator[Segment]:
    """Yield this shard's epoch order as consecutive :class:`Segment`\\ s.

    In ``block``/``none`` mode a segment is (the shard's part of) one window of blocks; in
    ``full`` mode, ``segment_rows`` rows of the permutation. ``start`` skips that many rows of
    the shard's order (resuming mid-epoch). ``keep``, ``pieces``: see :class:`EpochOrder`.
    """
    check_args(shuffle, seed, epoch, window or 1, rank, world)
    eo = EpochOrder(
        block_rows,
        rows_per_block,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        window=window,
        keep=keep,
        pieces=pieces,
    )
    lo, hi = shard_bounds(eo.num_rows, rank, world, even)
    yield from eo.segments(min(lo + max(0, int(start)), hi), hi, segment_rows)


def epoch_order(block_rows: np.ndarray, rows_per_block: int, **kwargs) -> np.ndarray:
    """The whole epoch order of a shard as one array (tests, quality measures)."""
    parts = [seg.rows() for seg in iter_segments(block_rows, rows_per_block, **kwargs)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def batch_blocks(ids: np.ndarray, rows_per_block: int, batch_size: int) -> np.ndarray:
    """Distinct blocks in each full batch of an order of row ids."""
    nb = len(ids) // batch_size
    if nb == 0:
        return np.zeros(0, np.int64)
    blocks = np.sort((ids[: nb * batch_size] // rows_per_block).reshape(nb, batch_size), axis=1)
    return 1 + (np.diff(blocks, axis=1) != 0).sum(axis=1)


def shuffle_quality(
    order: np.ndarray, rows_per_block: int, num_blocks: int, batch_size: int
) -> float:
    """How mixed the batches of an order are, from 0 to about 1.

    The mean number of distinct blocks a batch draws its rows from, divided by the number a
    uniformly random batch would draw from: ``num_blocks * (1 - (1 - 1/num_blocks) ** batch)``.
    1.0 is as good as a uniform shuffle; file order gives about ``1/rows_per_block``-ish values.
    Rows written together (one block) tend to be correlated, so this is the shuffle property
    that matters for SGD.
    """
    distinct = batch_blocks(np.asarray(order), rows_per_block, batch_size)
    if len(distinct) == 0 or num_blocks <= 1:
        return 1.0
    expected = num_blocks * (1.0 - (1.0 - 1.0 / num_blocks) ** batch_size)
    return float(min(1.0, distinct.mean() / expected))
