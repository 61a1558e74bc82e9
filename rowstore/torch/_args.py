"""Argument checks shared by the datasets and the loaders: the shard (torch.distributed's by
default) and the shuffle mode (True/False allowed). Counts are checked by
:mod:`rowstore.reader._args`."""

from __future__ import annotations

from typing import Any

import torch

from rowstore.reader import order as _order


def _resolve_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    """``shard`` if given, else (rank, world size) of torch.distributed when initialized, else (0, 1)."""
    if shard is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    try:
        rank, world = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (rank, world), got {shard!r}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, got {shard!r}")
    return rank, world


def _shuffle_mode(shuffle: Any) -> str:
    if shuffle is True:
        return "block"
    if shuffle is False or shuffle is None:
        return "none"
    if shuffle not in _order.MODES:
        raise ValueError(f"shuffle must be one of {_order.MODES} (or True/False), got {shuffle!r}")
    return shuffle
