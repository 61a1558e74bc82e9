"""Checking an order without reading data: what ``rowstore order`` and ``rowstore check-order``
print. Everything here uses the dataset's block index only (rows per block), never its rows.

- :func:`batch_blocks`: distinct blocks each batch of an order draws from (shuffle quality).
- :func:`read_cost`: blocks a consumer loads per delivered row (read locality), dealt or as
  the contiguous slices of :func:`rowstore.reader.order.shard_bounds`.
- :func:`check_order`: simulates an epoch on ``world x workers`` consumers, interrupted at a
  fraction of its steps and resumed on another world, and checks exactly-once delivery, equal
  steps and determinism (as ``tests/reader/test_order_props.py`` does over random configurations).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from rowstore.reader.order import EpochOrder, batch_blocks, resolve_order, shard_bounds
from rowstore.reader.plan import EpochPlan, default_unit, rank_steps_taken

__all__ = ["batch_blocks", "read_cost", "check_order"]


def _segment_blocks(eo: EpochOrder, lo: int, hi: int) -> int:
    """Blocks loaded to read positions [lo, hi): a window segment loads its window's blocks;
    a slice of a permutation loads each block its rows touch."""
    n = 0
    for seg in eo.segments(lo, hi):
        n += len(seg.blocks) if seg.blocks is not None else len(np.unique(seg.rows() // eo.rpb))
    return n


def read_cost(
    eo: EpochOrder,
    batch_size: int,
    consumer: int,
    world: int,
    *,
    unit: int | None = None,
    dealt: bool = True,
    drop_last: bool = False,
) -> tuple[int, int]:
    """``(blocks loaded, rows delivered)`` by one consumer in one epoch: dealt in units of
    ``unit`` global batches (``dealt``), or as the contiguous slice of the old sharding."""
    if not dealt:
        lo, hi = shard_bounds(eo.num_rows, consumer, world)
        return _segment_blocks(eo, lo, hi), hi - lo
    plan = EpochPlan(eo.num_rows, batch_size, drop_last=drop_last)
    unit = unit or default_unit(eo.shuffle, eo.window, eo.rpb, batch_size, eo.pieces)
    g = plan.batches(consumer, world, unit)
    g = g[g >= 0]
    blocks = rows = 0
    if len(g):
        for run in np.split(g, np.flatnonzero(np.diff(g) != 1) + 1):
            lo, hi = plan.rows_of_batch(int(run[0]))[0], plan.rows_of_batch(int(run[-1]))[1]
            blocks += _segment_blocks(eo, lo, hi)
            rows += hi - lo
    return blocks, rows


def _deal(
    plan: EpochPlan, world: int, workers: int, unit: int, frac: float | None
) -> tuple[list, np.ndarray, Any]:
    """Each consumer's delivered global batches when every rank stops after ``frac`` of its
    steps (None: all), the per-rank steps, and the plan of what is left."""
    C = world * workers
    per = plan.steps(C, unit)
    rank_steps = per.reshape(world, workers).sum(axis=1)
    n = int(rank_steps.max()) if frac is None else int(np.floor(rank_steps.min() * frac))
    taken = rank_steps_taken(plan, n, world, workers, unit)
    got = []
    for c in range(C):
        b = plan.batches(c, C, unit)[: taken[c]]
        got.append(b[b >= 0])
    return got, rank_steps, plan.after(taken, unit)


def check_order(
    block_rows: np.ndarray,
    rows_per_block: int,
    *,
    batch_size: int,
    shuffle: str = "block",
    seed: int = 0,
    epoch: int = 0,
    window: int | None = None,
    world: int = 1,
    workers: int = 1,
    unit: int | None = None,
    drop_last: bool = False,
    pad: bool = False,
    resume_at: float | None = None,
    resume_world: int | None = None,
    resume_workers: int | None = None,
    resume_unit: int | None = None,
    pieces: int | None = None,
) -> dict[str, Any]:
    """Simulate one epoch (see the module) and return the checks and figures as a dict
    (``ok`` is True when every check passed). ``window``/``pieces`` None:
    :func:`~rowstore.reader.order.resolve_order`'s defaults (a reader passes its own)."""
    window, pieces = resolve_order(shuffle, window, pieces, rows_per_block)
    eo = EpochOrder(
        block_rows,
        rows_per_block,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        window=window,
        pieces=pieces,
    )
    ids = eo.ids()
    valid = (
        np.concatenate(
            [b * rows_per_block + np.arange(n) for b, n in enumerate(np.asarray(block_rows))]
        )
        if len(block_rows)
        else np.zeros(0, np.int64)
    )
    checks: dict[str, bool] = {
        "order is a permutation of the rows": bool(np.array_equal(np.sort(ids), valid))
    }
    unit = unit or default_unit(shuffle, window, rows_per_block, batch_size, pieces)
    plan = EpochPlan(eo.num_rows, batch_size, drop_last=drop_last, pad=pad)
    first, steps1, left = _deal(plan, world, workers, unit, resume_at)
    rw, rk = resume_world or world, resume_workers or workers
    second: list = []
    steps2 = np.zeros(0, np.int64)
    if resume_at is not None and left is not None:
        second, steps2, left2 = _deal(left, rw, rk, resume_unit or unit, None)
        checks["resumed epoch ends"] = left2 is None
    batches = np.concatenate(first + second) if first + second else np.zeros(0, np.int64)
    once = len(np.unique(batches)) == len(batches)
    checks["every global batch at most once (so every row)"] = bool(once)
    if not drop_last:
        checks["every row delivered"] = bool(once and len(batches) == plan.num_batches)
    else:
        lost = eo.num_rows - sum(
            plan.rows_of_batch(int(g))[1] - plan.rows_of_batch(int(g))[0] for g in batches
        )
        checks["rows left out < batch_size x consumers"] = lost < batch_size * max(
            world * workers, rw * rk
        )
    if drop_last or pad:
        checks["equal steps on every rank"] = bool(
            len(set(steps1.tolist())) <= 1 and len(set(steps2.tolist())) <= 1
        )
    again = check_digest(
        block_rows,
        rows_per_block,
        batch_size,
        shuffle,
        seed,
        epoch,
        window,
        world,
        workers,
        unit,
        drop_last,
        pad,
        pieces,
    )
    checks["deterministic (same arguments, same delivery)"] = again == check_digest(
        block_rows,
        rows_per_block,
        batch_size,
        shuffle,
        seed,
        epoch,
        window,
        world,
        workers,
        unit,
        drop_last,
        pad,
        pieces,
    )
    bb = batch_blocks(ids, rows_per_block, batch_size)
    nblocks = int((np.asarray(block_rows) > 0).sum())
    uniform = nblocks * (1.0 - (1.0 - 1.0 / max(nblocks, 1)) ** batch_size) if nblocks else 0.0
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "rows": eo.num_rows,
        "global_batches": plan.num_batches,
        "unit": unit,
        "steps_per_rank": steps1.tolist(),
        "resume_steps_per_rank": steps2.tolist(),
        "resumed_after_steps": int(np.floor(steps1.min() * resume_at))
        if resume_at is not None and len(steps1)
        else None,
        "mean_blocks_per_batch": float(bb.mean()) if len(bb) else 0.0,
        "uniform_blocks_per_batch": uniform,
        "digest": again,
    }


def check_digest(
    block_rows,
    rows_per_block,
    batch_size,
    shuffle,
    seed,
    epoch,
    window,
    world,
    workers,
    unit,
    drop_last,
    pad,
    pieces=None,
) -> str:
    """A hash of what every consumer delivers (its rows, step by step)."""
    eo = EpochOrder(
        block_rows,
        rows_per_block,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        window=window,
        pieces=pieces,
    )
    ids = eo.ids()
    plan = EpochPlan(eo.num_rows, batch_size, drop_last=drop_last, pad=pad)
    h = hashlib.sha256()
    C = world * workers
    for c in range(C):
        for g in plan.batches(c, C, unit):
            lo, hi = plan.rows_of_batch(int(g)) if g >= 0 else (0, 0)
            h.update(ids[lo:hi].tobytes() + b"|")
    return h.hexdigest()[:16]
