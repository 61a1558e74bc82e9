"""Dealing an epoch to consumers so that it resumes exactly on any world: :class:`EpochPlan`.

A pure function, like :mod:`rowstore.reader.order`, of which it is the next step. The epoch
order (one sequence of rows) is cut into **global batches** of ``batch_size`` rows: batch ``g``
is positions ``[g * B, (g + 1) * B)`` of the order. That sequence does not depend on who reads
it. The plan deals it to ``C`` consumers (DDP ranks x DataLoader workers):

- **Units**: whole runs of ``unit`` consecutive global batches go round-robin to the consumers
  (consumer ``c`` gets units ``c, c + C, ...``). A unit is a contiguous range of the order, so
  a consumer reads windows of blocks it mostly uses (by default ``unit * B`` rows are about 4
  windows: see ``docs/order.md`` for the measured read cost).
- **Tail**: what is left after the last full round of units (``T < C * unit`` batches) is
  dealt as one round of shorter units (``T // C`` batches each), then the last ``T % C``
  batches one at a time, so consumers' step counts differ by at most one.
- **Equal steps** (the policy is explicit): ``drop_last=True`` leaves out the last partial
  batch and the last ``T % C`` tail batches; ``pad=True`` completes the partial batch and gives
  the consumers one short a batch of repeated rows, marked by the ``"__pad"`` column (True for
  a repeated row); neither: counts may differ by one (every row once).

**Resume**: the plan's state is the set of global batches not yet delivered (``remaining``,
intervals of batch numbers), plus what the order depends on (the state itself is
:class:`rowstore.reader.state.StreamState`). After every consumer took its
steps, :meth:`EpochPlan.after` gives the new remaining set. It depends on nothing but the
steps taken, so when all consumers took the same number of steps every consumer computes the
same state, and a plan for *another* world (or unit) deals exactly the batches not yet
delivered: each row once across the interruption.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rowstore._check import nonneg_int, positive_int

__all__ = [
    "EpochPlan",
    "PAD_KEY",
    "ID_KEY",
    "SOURCE_KEY",
    "EXTRA_KEYS",
    "default_unit",
    "rank_steps_taken",
]

#: Column marking rows repeated to even out steps (``pad=True``): True for a repeated row.
PAD_KEY = "__pad"
#: Column of each row's dataset row number (``with_ids=True``).
ID_KEY = "__id"
#: Column of each row's source in a mixture (``rowstore.mix(..., with_source=True)``).
SOURCE_KEY = "__source"
#: The columns a dealt batch may add to the schema's fields.
EXTRA_KEYS = (ID_KEY, PAD_KEY, SOURCE_KEY)


#: Windows of rows per dealt unit by default: a unit straddles about one window boundary, so a
#: consumer loads ``1 + 1 / UNIT_WINDOWS`` blocks per block delivered: 1.15-1.28 with 4
#: (bench/order_bench.py), where units of 1 window load 1.6-2.0 and contiguous slices 1.0-1.1.
UNIT_WINDOWS = 4


def default_unit(
    shuffle: str, window: int, rows_per_block: int, batch_size: int, pieces: int = 1
) -> int:
    """Global batches per dealt unit: about ``UNIT_WINDOWS`` windows of rows (1 for ``full``
    shuffling, whose batches come from anywhere anyway); with ``pieces``, a window holds
    ``window`` pieces of ``ceil(rows_per_block / pieces)`` rows."""
    if shuffle == "full":
        return 1
    rows = -(-rows_per_block // min(pieces, max(1, rows_per_block)))
    return max(1, -(-UNIT_WINDOWS * window * rows // batch_size))


def _index(v: Any) -> int:
    """An int (Python or NumPy, not bool: a float 5.5 or a str "5" is a ``TypeError``)."""
    if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
        raise TypeError(f"not an int: {v!r}")
    return int(v)


def _intervals(ids: np.ndarray) -> list[list[int]]:
    """Sorted unique ints -> ``[[a, b), ...]`` runs."""
    if not len(ids):
        return []
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [len(ids)]))
    return [[int(ids[a]), int(ids[b - 1]) + 1] for a, b in zip(starts, ends)]


class EpochPlan:
    """One epoch's global batches and how they are dealt (see the module).

    Parameters
    ----------
    num_rows : int
        Rows of the epoch order (a row subset's size, if any).
    batch_size : int
    drop_last, pad : bool
        The equal-steps policy (at most one of them).
    remaining : sequence of [a, b), optional
        Global batches not yet delivered (default: all); from :meth:`after` or a saved state.
    """

    def __init__(
        self,
        num_rows: int,
        batch_size: int,
        *,
        drop_last: bool = False,
        pad: bool = False,
        remaining: Sequence[Sequence[int]] | None = None,
    ):
        self.num_rows = nonneg_int("num_rows", num_rows)
        self.batch_size = B = positive_int("batch_size", batch_size)
        if drop_last and pad:
            raise ValueError("drop_last and pad are two equal-steps policies: choose one")
        self.drop_last, self.pad = bool(drop_last), bool(pad)
        self.num_batches = self.num_rows // B if drop_last else -(-self.num_rows // B)
        if remaining is None:
            iv = np.array(
                [[0, self.num_batches]] if self.num_batches else [], dtype=np.int64
            ).reshape(-1, 2)
        else:
            try:
                iv = np.array(
                    [[_index(a), _index(b)] for a, b in remaining], dtype=np.int64
                ).reshape(-1, 2)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(
                    f"remaining must be a list of [start, stop) pairs, got {remaining!r}"
                ) from None
            flat = iv.reshape(-1)
            if len(flat) and (
                flat[0] < 0
                or flat[-1] > self.num_batches
                or (np.diff(flat) < 0).any()
                or (iv[:, 1] <= iv[:, 0]).any()
            ):
                raise ValueError(
                    f"remaining must be sorted disjoint non-empty [start, stop) batch ranges "
                    f"within "
                    f"[0, {self.num_batches}), got {remaining!r}"
                )
        self._iv = iv
        lens = iv[:, 1] - iv[:, 0]
        self._cum = np.cumsum(lens) - lens  # first position of each interval
        self.num_positions = int(lens.sum())

    # -- what is left --------------------------------------------------------------------------
    @property
    def remaining(self) -> list[list[int]]:
        """Global batches not yet delivered, as ``[start, stop)`` ranges."""
        return self._iv.tolist()

    @property
    def fresh(self) -> bool:
        """True when nothing of the epoch was delivered yet."""
        return self.num_positions == self.num_batches

    def batch_of(self, positions: np.ndarray) -> np.ndarray:
        """Global batch numbers of positions in the remaining sequence (-1 stays -1)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not len(self._iv):
            return np.full(len(positions), -1, np.int64)
        i = np.searchsorted(self._cum, np.maximum(positions, 0), side="right") - 1
        return np.where(positions < 0, -1, self._iv[i, 0] + positions - self._cum[i])

    def rows_of_batch(self, g: int) -> tuple[int, int]:
        """Positions ``[lo, hi)`` of the epoch order in global batch ``g``."""
        B = self.batch_size
        return g * B, min((g + 1) * B, self.num_rows)

    # -- dealing -------------------------------------------------------------------------------
    def _counts(self, world: int, unit: int) -> tuple[int, int, int]:
        """(batches every consumer gets from full rounds, tail batches, first tail position)."""
        P, C, k = self.num_positions, world, unit
        full = P // (C * k)
        return full * k, P - full * C * k, full * C * k

    def steps(self, world: int, unit: int = 1) -> np.ndarray:
        """Steps (batches) of each of ``world`` consumers; equal under ``drop_last`` or ``pad``."""
        positive_int("world", world)
        positive_int("unit", unit)
        fk, tail, _ = self._counts(world, unit)
        if self.drop_last:
            return np.full(world, fk + tail // world, np.int64)
        if self.pad:
            return np.full(world, fk + -(-tail // world), np.int64)
        c = np.arange(world)
        return fk + np.where(c < tail, (tail - c + world - 1) // world, 0)

    def positions(self, consumer: int, world: int, unit: int = 1) -> np.ndarray:
        """Consumer ``consumer``'s positions in the remaining sequence, step by step (-1: a
        batch of padding)."""
        if not 0 <= consumer < world:
            raise ValueError(f"consumer must be in [0, {world}), got {consumer}")
        C, k, c = world, positive_int("unit", unit), consumer
        fk, tail, base = self._counts(C, k)
        j = np.arange(fk, dtype=np.int64)
        full = ((j // k) * C + c) * k + j % k
        # The tail: one round of shorter units (tail // C batches each), then the last
        # tail % C batches one each.
        k2 = tail // C
        mid = base + c * k2 + np.arange(k2, dtype=np.int64)
        base2 = base + C * k2
        extra = np.array([base2 + c] if c < tail - C * k2 else [], dtype=np.int64)
        seq = np.concatenate((full, mid, extra))
        want = int(self.steps(C, k)[c])
        if len(seq) > want:
            seq = seq[:want]
        elif len(seq) < want:
            seq = np.concatenate((seq, np.full(want - len(seq), -1, np.int64)))
        return seq

    def batches(self, consumer: int, world: int, unit: int = 1) -> np.ndarray:
        """Consumer ``consumer``'s global batch numbers, step by step (-1: padding)."""
        return self.batch_of(self.positions(consumer, world, unit))

    def after(self, taken: Sequence[int] | np.ndarray, unit: int = 1) -> EpochPlan | None:
        """The plan of what is left once consumer ``c`` of ``len(taken)`` took ``taken[c]`` steps;
        None when every consumer took all its steps (the epoch is over)."""
        taken = np.asarray(taken, dtype=np.int64).reshape(-1)
        world = len(taken)
        steps = self.steps(world, unit)
        if (taken < 0).any() or (taken > steps).any():
            raise ValueError(
                f"steps taken {taken.tolist()} must be within each consumer's {steps.tolist()}"
            )
        if (taken == steps).all():
            return None
        done = np.zeros(self.num_positions, bool)
        for c in range(world):
            p = self.positions(c, world, unit)[: taken[c]]
            done[p[p >= 0]] = True
        left = self.batch_of(np.flatnonzero(~done))
        return EpochPlan(
            self.num_rows,
            self.batch_size,
            drop_last=self.drop_last,
            pad=self.pad,
            remaining=_intervals(left),
        )


def rank_steps_taken(
    plan: EpochPlan, steps: int, world: int, workers: int, unit: int
) -> np.ndarray:
    """Steps each of the ``world * workers`` consumers (rank ``r``'s worker ``w`` is consumer
    ``r * workers + w``) took when every rank handed out ``steps`` batches, its workers' batches
    taken in turn (as torch's ``DataLoader`` does: worker ``i % workers`` gives the ``i``-th)."""
    nonneg_int("steps", steps)
    per = plan.steps(world * workers, unit).reshape(world, workers)
    w = np.arange(workers)
    # Consumers' step counts never increase with their number, so the last round (where some
    # workers are done) goes to the first workers, in order.
    got = steps // workers + (w < steps % workers)
    return np.minimum(per, got[None, :]).reshape(-1)


def step_rows(order: Any, plan: EpochPlan, consumer: int, world: int, unit: int = 1, skip: int = 0):
    """Yield ``(row_ids, pad_mask)`` of each of a consumer's steps: what a reader delivers,
    computed without reading (``order`` is an :class:`~rowstore.reader.order.EpochOrder`).
    The proof tool and the property tests use it; :meth:`Reader.deal` reads the same rows."""
    B = plan.batch_size
    head = None
    for g in plan.batches(consumer, world, unit)[skip:]:
        if g < 0:
            ids = pad_ids(order, B)
            yield ids, np.ones(len(ids), bool)
            continue
        lo, hi = plan.rows_of_batch(int(g))
        ids = order.ids(lo, hi)
        mask = np.zeros(len(ids), bool)
        if plan.pad and hi - lo < B:
            head = pad_ids(order, B - (hi - lo)) if head is None else head
            ids = np.concatenate((ids, head))
            mask = np.concatenate((mask, np.ones(len(head), bool)))
        yield ids, mask


def pad_ids(order: Any, n: int) -> np.ndarray:
    """``n`` row ids repeated from the start of the epoch order (the rows of padding)."""
    m = min(n, order.num_rows)
    if m == 0:
        return np.zeros(0, np.int64)
    first = order.ids(0, m)
    return np.resize(first, n)
