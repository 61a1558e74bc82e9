"""``rowstore quality``, ``order`` and ``check-order``: how ordered a dataset is, how mixed an
epoch order is, and whether an epoch dealt to a world (interrupted and resumed on another)
delivers every row once (the last two read no rows)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from rowstore.cli._common import (
    _n,
    _open_layout,
    _positive,
    _storage_options_argument,
    _unit_frac,
)
from rowstore.quality import order_quality
from rowstore.reader import Reader
from rowstore.reader.order import EpochOrder
from rowstore.reader.proof import batch_blocks, check_order, read_cost


def register(sub: Any) -> None:
    """Add ``quality``, ``order`` and ``check-order`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "quality",
        help="how ordered a dataset is: rank correlation of a field with position, "
        "batch spread, block-shuffle mixing",
    )
    p.add_argument("path")
    p.add_argument("--field", help="a scalar numeric field (default: the first one)")
    p.add_argument("--batch-size", type=_positive, default=64, help="batch size (default 64)")
    p.add_argument(
        "--window",
        type=_positive,
        help="block-shuffle window (default: the file's, see docs/order.md)",
    )
    p.add_argument(
        "--pieces",
        type=_positive,
        help="block shuffle of pieces: cut each block into this many (default: the file's, 8 "
        "for uncompressed blocks read directly, else 1: whole blocks)",
    )
    _storage_options_argument(p)
    p.set_defaults(run=_quality)
    p = sub.add_parser(
        "order",
        help="shuffle quality of an epoch order: distinct blocks per batch, a histogram, "
        "read cost per rank (reads no rows)",
    )
    _epoch_arguments(p)
    p.add_argument(
        "--world",
        type=_positive,
        default=1,
        help="consumers (ranks x workers) to deal the epoch to",
    )
    p.add_argument(
        "--plot", metavar="PNG", help="write the histogram and where batch rows come from to a PNG"
    )
    p.set_defaults(run=_order)
    p = sub.add_parser(
        "check-order",
        help="simulate an epoch on a world, interrupted and resumed on another, and "
        "check exactly-once delivery, equal steps and determinism (reads no rows)",
    )
    _epoch_arguments(p)
    p.add_argument("--world", type=_positive, default=1)
    p.add_argument("--workers", type=_positive, default=1, help="DataLoader workers per rank")
    p.add_argument(
        "--unit", type=_positive, help="global batches dealt at a time (default: about a window)"
    )
    p.add_argument(
        "--resume-at",
        type=_unit_frac,
        help="stop after this fraction of the epoch's steps and resume",
    )
    p.add_argument("--resume-world", type=_positive)
    p.add_argument("--resume-workers", type=_positive)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--drop-last", action="store_true", help="equal steps by leaving rows out")
    g.add_argument(
        "--pad", action="store_true", help="equal steps by repeating rows (marked __pad)"
    )
    p.set_defaults(run=_check_order)


def _quality(args: argparse.Namespace) -> int:
    print(
        order_quality(
            args.path,
            field=args.field,
            batch_size=args.batch_size,
            window=args.window,
            pieces=args.pieces,
            storage_options=args.storage_options,
        ).text()
    )
    return 0


def _order(args: argparse.Namespace) -> int:
    print(
        order_text(
            args.path,
            batch_size=args.batch_size,
            shuffle=args.shuffle,
            window=args.window,
            seed=args.seed,
            epoch=args.epoch,
            world=args.world,
            plot=args.plot,
            pieces=args.pieces,
            storage_options=args.storage_options,
        )
    )
    return 0


def _check_order(args: argparse.Namespace) -> int:
    text, ok = check_order_text(
        args.path,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        window=args.window,
        seed=args.seed,
        epoch=args.epoch,
        world=args.world,
        workers=args.workers,
        unit=args.unit,
        drop_last=args.drop_last,
        pad=args.pad,
        resume_at=args.resume_at,
        resume_world=args.resume_world,
        resume_workers=args.resume_workers,
        pieces=args.pieces,
        storage_options=args.storage_options,
    )
    print(text)
    return 0 if ok else 1


def _epoch_arguments(p: argparse.ArgumentParser) -> None:
    """PATH and the arguments of an epoch order, shared by ``order`` and ``check-order``."""
    p.add_argument("path")
    p.add_argument("--batch-size", type=_positive, default=64)
    p.add_argument("--shuffle", choices=["block", "full", "none"], default="block")
    p.add_argument("--window", type=_positive, help="block-shuffle window (default: the file's)")
    p.add_argument(
        "--pieces",
        type=_positive,
        help="block shuffle of pieces: cut each block into this many (default: the file's, 8 "
        "for uncompressed blocks read directly, else 1: whole blocks)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    _storage_options_argument(p)


def _order_defaults(
    path: str, storage_options: dict | None, shuffle: str, window: Any, pieces: Any
) -> tuple[int, int]:
    """The window and pieces a reader of ``path`` uses for these arguments (None: its
    defaults, :meth:`rowstore.reader.Reader.order_defaults`)."""
    if window is not None and pieces is not None:
        return window, pieces
    with Reader(path, storage_options=storage_options) as r:
        return r.order_defaults(shuffle, window, pieces)


def order_text(
    path: str,
    *,
    batch_size: int = 64,
    shuffle: str = "block",
    window: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    world: int = 1,
    plot: str | None = None,
    pieces: int | None = None,
    storage_options: dict | None = None,
) -> str:
    """What ``rowstore order`` prints (see docs/order.md)."""
    L, _ = _open_layout(path, storage_options)
    br, rpb = L.block_rows(), L.rows_per_block
    window, pieces = _order_defaults(path, storage_options, shuffle, window, pieces)
    eo = EpochOrder(br, rpb, shuffle=shuffle, seed=seed, epoch=epoch, window=window, pieces=pieces)
    ids = eo.ids()
    bb = batch_blocks(ids, rpb, batch_size)
    nblocks = int((br > 0).sum())
    uniform = nblocks * (1.0 - (1.0 - 1.0 / max(nblocks, 1)) ** batch_size) if nblocks else 0.0
    quality = min(1.0, bb.mean() / uniform) if len(bb) and nblocks > 1 else 1.0
    lines = [
        f"{path}: {_n(eo.num_rows, 'row')} in {_n(nblocks, 'block')} of up to {_n(rpb, 'row')}; "
        f"shuffle={shuffle} "
        f"window={window} "
        + (f"pieces={pieces} " if pieces > 1 else "")
        + f"batch_size={batch_size} seed={seed} epoch={epoch}",
        f"shuffle quality: {quality:.3f} (1.0 = as mixed as a uniform shuffle)",
        f"distinct blocks per batch: mean {bb.mean() if len(bb) else 0:.2f}, expected for a "
        f"uniform shuffle "
        f"{uniform:.2f}, at most {min(batch_size, nblocks)}",
        "histogram of distinct blocks per batch:",
    ]
    if len(bb):
        counts = np.bincount(bb)
        top = max(counts.max(), 1)
        for k in np.flatnonzero(counts):
            lines.append(
                f"  {k:>5} blocks  {counts[k]:>7} batches  "
                f"{'#' * max(1, int(40 * counts[k] / top))}"
            )
    if world > 1:
        dealt = [read_cost(eo, batch_size, c, world) for c in range(world)]
        contig = [read_cost(eo, batch_size, c, world, dealt=False) for c in range(world)]
        per = lambda costs: sum(b for b, _ in costs) / max(1, sum(r for _, r in costs))  # noqa: E731
        lines.append(
            f"read cost over {world} consumers: {per(dealt) * rpb:.2f} block loads per block of "
            f"rows delivered "
            f"(dealt, elastic) vs {per(contig) * rpb:.2f} (contiguous slices)"
        )
    if plot:
        _order_plot(
            plot, bb, ids, rpb, batch_size, title=f"{path}: shuffle={shuffle} window={window}"
        )
        lines.append(f"wrote {plot}")
    return "\n".join(lines)


def _order_plot(path: str, bb: Any, ids: Any, rpb: int, batch_size: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    if len(bb):
        a.hist(bb, bins=np.arange(bb.min(), bb.max() + 2) - 0.5)
    a.set_xlabel("distinct blocks in a batch")
    a.set_ylabel("batches")
    n = min(len(ids) // batch_size, 200)
    if n:
        y = (ids[: n * batch_size] // rpb).reshape(n, batch_size)
        b.scatter(np.repeat(np.arange(n), batch_size), y.reshape(-1), s=1)
    b.set_xlabel("batch")
    b.set_ylabel("block of each row")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def check_order_text(
    path: str, *, storage_options: dict | None = None, **kwargs: Any
) -> tuple[str, bool]:
    """What ``rowstore check-order`` prints, and whether every check passed."""
    L, _ = _open_layout(path, storage_options)
    kwargs["window"], kwargs["pieces"] = _order_defaults(
        path,
        storage_options,
        kwargs.get("shuffle", "block"),
        kwargs.get("window"),
        kwargs.get("pieces"),
    )
    r = check_order(L.block_rows(), L.rows_per_block, **kwargs)
    w, k = kwargs.get("world", 1), kwargs.get("workers", 1)
    lines = [
        f"{path}: {_n(r['rows'], 'row')}, "
        f"{_n(r['global_batches'], 'global batch', 'global batches')} of "
        f"{kwargs['batch_size']}, dealt in "
        f"units of {r['unit']} to {w} ranks x {k} workers"
    ]
    lines.append(f"steps per rank: {_span(r['steps_per_rank'])}")
    if kwargs.get("resume_at") is not None:
        rw, rk = kwargs.get("resume_world") or w, kwargs.get("resume_workers") or k
        lines.append(
            f"stopped after {r['resumed_after_steps']} steps per rank; resumed on {rw} ranks x "
            f"{rk} workers: "
            f"steps per rank {_span(r['resume_steps_per_rank'])}"
        )
    for name, ok in r["checks"].items():
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {name}")
    lines.append(
        f"delivery digest {r['digest']}; mean distinct blocks per batch "
        f"{r['mean_blocks_per_batch']:.2f} "
        f"(uniform: {r['uniform_blocks_per_batch']:.2f})"
    )
    return "\n".join(lines), bool(r["ok"])


def _span(v: list[int]) -> str:
    if not v:
        return "-"
    return (
        f"{v[0]} each"
        if len(set(v)) == 1
        else f"{min(v)}..{max(v)} ({v[:8]}{'...' if len(v) > 8 else ''})"
    )
