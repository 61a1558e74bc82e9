"""The shuffle's order and its memory plan: pure functions of the arguments.

**Order.** Row ``g`` (its dataset row number in the input) gets the 64-bit key
``splitmix64(seed64(seed, 0, STREAM) + (g + 1) * golden)``, the ``g``-th output of a
SplitMix64 stream (counter-based: any worker computes any row's key alone). The output is the
input sorted by key (ties, of probability ~n^2 / 2^65, in input order): keys are independent and
uniform, so the permutation is uniform. Piles are *key ranges*: pile ``p`` of ``P`` holds the
keys in ``[bounds[p], bounds[p + 1])``, each pile is sorted by key in memory, and the piles
are written in order. The output is therefore the same whatever the number of piles (hence the
memory budget), of workers, or of recursive splits: only the seed and the input decide it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rowstore.reader.order import seed64

__all__ = ["row_keys", "key_bounds", "pile_of", "Plan", "make_plan"]

_STREAM_SHUFFLE = 0x5348  # "SH": the seed64 purpose of the global shuffle's keys
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
KEY_SPACE = 1 << 64


def row_keys(seed: int, first: int, n: int) -> np.ndarray:
    """The keys (uint64) of rows ``first .. first + n - 1`` for ``seed``."""
    s = np.uint64(seed64(seed, 0, _STREAM_SHUFFLE))
    with np.errstate(over="ignore"):
        z = (np.arange(first + 1, first + n + 1, dtype=np.uint64) * _GOLDEN) + s
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def key_bounds(lo: int, hi: int, parts: int) -> list[int]:
    """``parts + 1`` boundaries cutting the key range ``[lo, hi)`` into near-equal ranges."""
    return [lo + (hi - lo) * q // parts for q in range(parts + 1)]


def pile_of(keys: np.ndarray, bounds: list[int]) -> np.ndarray:
    """The range (0 .. len(bounds) - 2) of each key; keys lie in ``[bounds[0], bounds[-1])``."""
    inner = np.array(bounds[1:-1], dtype=np.uint64)
    return np.searchsorted(inner, keys, side="right").astype(np.int64)


#: Smallest memory budget accepted (below it the fixed buffers dominate).
MIN_MEMORY = 4 << 20
#: At most this many piles are written at once (open files; a larger input is split again).
MAX_PILES = 512
#: Bytes a row costs in memory in pass 2 beyond its stored bytes: its key, its place in the sort.
ROW_OVERHEAD = 24
#: Memory an open HDF5 file being written costs, whatever its size (measured: ~550 KiB, mostly
#: libhdf5's metadata cache index): pass 1 holds one per pile.
OPEN_FILE_BYTES = 640 << 10


@dataclass(frozen=True)
class Plan:
    """How a shuffle uses its memory budget (bytes)."""

    memory: int
    num_piles: int  # piles of pass 1
    pile_limit: (
        int  # a pile estimated above this (rows + heap + ROW_OVERHEAD per row) is split again
    )
    pile_target: int  # what a pile is sized for
    pile_block_bytes: (
        int  # block and heap chunk size of the piles (pass 1 buffers one of each per pile)
    )
    chunk_bytes: int  # rows gathered at once in pass 2
    max_open: int = MAX_PILES  # pile files written at once that the memory allows

    def splits(self, estimate: int) -> int:
        """Sub-piles for a pile estimated at ``estimate`` bytes (at most ``max_open``, at least
        2)."""
        return int(max(2, min(MAX_PILES, self.max_open, math.ceil(estimate / self.pile_target))))


def make_plan(memory: int, data_bytes: int, *, block_bytes: int) -> Plan:
    """The plan for ``data_bytes`` (rows + heap + ROW_OVERHEAD per row) through ``memory``.

    Pass 2 holds one pile (up to ``pile_limit``) plus fixed buffers: a gathered chunk (twice:
    gathered, then packed) and the output writer's block, heap chunk and compressed frames
    (``4 * block_bytes``): ``pile_limit = 0.75 * memory - those``. Piles are sized at 0.6 of
    the limit, so binomial spread rarely triggers a split. Pass 1 holds an open file, one
    block and one heap chunk per pile, at most half the memory in all: a larger input gets
    fewer, larger piles that pass 2 splits again (one more pass over those rows).
    """
    chunk = int(min(16 << 20, memory // 32))
    fixed = 2 * chunk + 4 * block_bytes
    limit = max(1 << 20, int(0.75 * memory) - fixed)
    target = max(1, int(0.6 * limit))
    want = max(1, math.ceil(data_bytes / target))
    pile_block = int(min(1 << 20, max(16 << 10, memory // (16 * want))))
    fit = max(1, (memory // 2) // (OPEN_FILE_BYTES + 2 * pile_block))
    piles = int(min(MAX_PILES, want, fit))
    return Plan(memory, piles, limit, target, pile_block, chunk, int(min(MAX_PILES, fit)))
