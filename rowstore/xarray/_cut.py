"""Extraction for :func:`~rowstore.xarray.write_patches`: the samples of one region of the grid
cut out of its arrays in memory (window views, one copy), filtered, stacked into channels, their
statistics, and one task's whole job (:func:`write_region`: cut, filter, stack, write shards)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rowstore.writer import write_shard
from rowstore.writer.commit import ShardInfo
from rowstore.xarray._plan import PatchPlan


def samples_of(
    plan: PatchPlan,
    v: str,
    arr: np.ndarray,
    counts: Mapping[str, int],
    select: np.ndarray | None = None,
) -> np.ndarray:
    """The samples of variable ``v`` in one region: ``(n, *sample shape)``, samples in row-major
    order of the region's origins over ``plan.moving`` (the naive reference is
    ``arr[o_d : o_d + size_d, ...]`` for every origin), or only those numbered ``select``, in
    that order (one copy: gathered straight from the window view)."""
    vd = plan.vdims[v]
    mov = [d for d in vd if d in plan.size]
    nv = len(vd)
    view = (
        np.lib.stride_tricks.sliding_window_view(
            arr, [plan.size[d] for d in mov], axis=tuple(vd.index(d) for d in mov)
        )
        if mov
        else arr
    )
    sl = [slice(None)] * view.ndim
    for d in mov:
        sl[vd.index(d)] = slice(0, max(0, (counts[d] - 1) * plan.stride[d] + 1), plan.stride[d])
    view = view[tuple(sl)]
    origin_axes = [vd.index(d) for d in plan.moving if d in vd]
    sample_axes = [nv + mov.index(d) if d in plan.size else vd.index(d) for d in plan.sdims[v]]
    over_axes = [nv + mov.index(d) for d in mov if plan.kind[d] == "over"]
    x = view.transpose(origin_axes + sample_axes + over_axes)[(Ellipsis,) + (0,) * len(over_axes)]
    for i, d in enumerate(plan.moving):
        if d not in vd:  # a dimension the variable lacks: the same values at every origin
            x = np.expand_dims(x, i)
    grid = tuple(counts[d] for d in plan.moving)
    x = np.broadcast_to(x, grid + plan.sshape[v])
    if select is not None:
        return x[np.unravel_index(select, grid)] if grid else x[np.zeros(len(select), np.intp)]
    return x.reshape((math.prod(grid), *plan.sshape[v]))


def stack_channels(plan: PatchPlan, parts: Mapping[str, np.ndarray]) -> np.ndarray:
    """The stacked channel field: each variable's non-spatial dimensions flattened into channels."""
    pieces = []
    for v in plan.stacked:
        x, sd = parts[v], plan.sdims[v]
        n = len(x)
        cd = plan.chan[v]["dims"]
        order = [1 + sd.index(d) for d in cd] + [1 + sd.index(d) for d in plan.spatial if d in sd]
        x = x.transpose([0, *order])
        sp = [plan.size[d] for d in plan.spatial]
        nc = plan.chan[v]["stop"] - plan.chan[v]["start"]
        x = x.reshape((n, nc, *[plan.size[d] for d in plan.spatial if d in sd]))
        for i, d in enumerate(plan.spatial):  # no such dimension: constant over the patch
            if d not in sd:
                x = np.expand_dims(x, 2 + i)
        pieces.append(np.broadcast_to(x, (n, nc, *sp)))
    return concat_channels(pieces, plan.channels, plan.stack_dtype)


#: Channel-last stacking of pieces with fewer channels than this concatenates channel-first and
#: transposes once (measured in bench/xarray_bench.py: 24 single-channel pieces 2.5x faster that
#: way; pieces of 8 channels about as fast directly, into a C-order output).
MIN_DIRECT_CHANNELS = 4


def concat_channels(pieces: Sequence[np.ndarray], channels: str, dtype: Any) -> np.ndarray:
    """Pieces ``(n, C_i, *spatial)`` as one ``(n, sum C_i, *spatial)`` (``"first"``) or
    ``(n, *spatial, sum C_i)`` (``"last"``) array."""
    if channels == "first":
        return np.concatenate(pieces, axis=1, dtype=dtype)
    if min(p.shape[1] for p in pieces) < MIN_DIRECT_CHANNELS:
        # short runs: one strided pass, not one per piece
        return np.ascontiguousarray(np.moveaxis(np.concatenate(pieces, axis=1, dtype=dtype), 1, -1))
    n, spatial = pieces[0].shape[0], pieces[0].shape[2:]
    # C order (concatenate keeps the pieces' layout)
    out = np.empty((n, *spatial, sum(p.shape[1] for p in pieces)), dtype)
    return np.concatenate(
        [np.moveaxis(p, 1, -1) for p in pieces], axis=-1, out=out, casting="same_kind"
    )


def moments(x: np.ndarray, axes: tuple[int, ...] | None = None) -> list:
    """[count, sum, sum of squares] of the non-NaN values (float64), over ``axes`` (default all)."""
    if x.dtype.kind not in "biuf":
        return [0, 0.0, 0.0]
    total = np.sum(x, axis=axes, dtype=np.float64)
    if x.dtype.kind != "f" or np.isfinite(total).all():  # no NaN: no mask, no float64 copy of x
        count = np.full(np.shape(total), x.size // max(1, np.size(total)), np.int64)
        return [
            count if axes else int(count),
            total,
            np.sum(np.square(x, dtype=np.float64), axis=axes),
        ]
    f = x.astype(np.float64)
    ok = ~np.isnan(f)
    return [np.count_nonzero(ok, axis=axes), np.nansum(f, axis=axes), np.nansum(f * f, axis=axes)]


def kept(
    where: Any, parts: Mapping[str, np.ndarray], columns: Mapping[str, np.ndarray], n: int
) -> np.ndarray:
    """The numbers of the samples ``where`` keeps, in order."""
    if where == "notnull":
        keep = np.ones(n, bool)
        for x in parts.values():
            if x.dtype.kind in "fc":
                keep &= ~np.isnan(x.reshape(n, -1)).any(axis=1)
            elif x.dtype.kind in "mM":
                keep &= ~np.isnat(x.reshape(n, -1)).any(axis=1)
    else:
        keep = np.asarray(where({**parts, **columns}), dtype=bool)
        if keep.shape != (n,):
            raise ValueError(
                f"where must return one bool per sample, shape ({n},); got shape {keep.shape}"
            )
    return np.flatnonzero(keep)


def combine_moments(plan: PatchPlan, parts: Iterable[dict]) -> dict:
    """The tasks' partial statistics (:func:`moments`) summed into ``mean``, ``std`` and
    ``count`` per variable (per channel for the stacked field)."""
    total: dict[str, list] = {}
    for p in parts:
        for k, (c, s, q) in p.items():
            t = total.setdefault(k, [0, 0.0, 0.0])
            t[0], t[1], t[2] = t[0] + np.asarray(c), t[1] + np.asarray(s), t[2] + np.asarray(q)
    out: dict[str, dict[str, Any]] = {}
    for k, (c, s, q) in total.items():
        c = np.asarray(c, np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = s / c
            std = np.sqrt(np.maximum(q / c - mean * mean, 0.0))
        if np.ndim(c) == 0:
            out[k] = {"mean": float(mean), "std": float(std), "count": int(c)}
        else:
            out[k] = {
                "mean": np.asarray(mean),
                "std": np.asarray(std),
                "count": np.asarray(c, np.int64),
            }
    return out


def write_region(
    sub: xr.Dataset,
    plan: PatchPlan,
    start: Mapping[str, int],
    counts: Mapping[str, int],
    task: int,
    path: str,
    where: Any,
    shard_bytes: int,
    options: dict,
) -> tuple[list[ShardInfo], dict]:
    """One task: cut, filter, stack and write the samples whose origins lie in one region (in
    grid order: the shuffle comes after, over all of them); returns the shards' infos and the
    partial statistics."""
    n = math.prod(counts[d] for d in plan.moving)
    if n == 0:
        return [], {}
    arrays = {v: np.asarray(sub[v].values) for v in plan.variables}
    columns = origin_columns(plan, start, counts, n)
    parts, order = _cut(plan, arrays, counts, columns, where, n)
    columns = {k: c[order] for k, c in columns.items()}
    stats = _sample_columns(plan, parts, columns)
    return _write_shards(path, plan, columns, len(order), shard_bytes, options), stats


def origin_columns(
    plan: PatchPlan, start: Mapping[str, int], counts: Mapping[str, int], n: int
) -> dict[str, np.ndarray]:
    """The ``n`` samples' per-origin fields, in grid order: per moving dimension the origin
    index and its coordinate (the value, or the patch's vector), then ``sample_index``."""
    grids = np.meshgrid(*[start[d] + np.arange(counts[d]) for d in plan.moving], indexing="ij")
    j = {d: g.reshape(-1) for d, g in zip(plan.moving, grids)}  # origin grid positions per sample
    columns: dict[str, np.ndarray] = {}
    flat = np.zeros(n, np.int64)
    for d in plan.moving:
        flat = flat * plan.counts[d] + j[d]
        origin = j[d] * plan.stride[d]
        columns[plan.origin_field[d]] = origin
        if d in plan.coord_field:
            c = plan.coords[d]
            columns[plan.coord_field[d]] = (
                c[origin]
                if plan.kind[d] == "over"
                else c[origin[:, None] + np.arange(plan.size[d])]
            )
    columns[plan.index_field] = flat
    return columns


def _cut(
    plan: PatchPlan,
    arrays: Mapping[str, np.ndarray],
    counts: Mapping[str, int],
    columns: Mapping[str, np.ndarray],
    where: Any,
    n: int,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Each variable's samples, in its written dtype, and the numbers of the samples kept:
    every sample gathered straight from the window views when ``where`` is None, otherwise all
    cut, then filtered by ``where``."""
    if where is None:
        order = np.arange(n)
        parts = {
            v: samples_of(plan, v, a, counts, order).astype(plan.dtype[v], copy=False)
            for v, a in arrays.items()
        }
        return parts, order
    parts = {
        v: samples_of(plan, v, a, counts).astype(plan.dtype[v], copy=False)
        for v, a in arrays.items()
    }
    order = kept(where, parts, columns, n)
    return {v: x[order] for v, x in parts.items()}, order


def _sample_columns(
    plan: PatchPlan, parts: Mapping[str, np.ndarray], columns: dict[str, np.ndarray]
) -> dict:
    """Adds each variable's field (or the stacked field) to ``columns``; returns the partial
    statistics of each variable (and of each channel of the stacked field)."""
    stats = {v: moments(parts[v]) for v in plan.variables}
    for v in plan.variables:
        if v not in plan.stacked:
            columns[plan.field[v]] = parts[v]
    if plan.stacked:
        x = stack_channels(plan, parts)
        caxis = 1 if plan.channels == "first" else x.ndim - 1
        stats[plan.stack_name] = moments(x, tuple(a for a in range(x.ndim) if a != caxis))
        columns[plan.field[plan.stack_name]] = x
    return stats


def _write_shards(
    path: str,
    plan: PatchPlan,
    columns: Mapping[str, np.ndarray],
    m: int,
    shard_bytes: int,
    options: dict,
) -> list[ShardInfo]:
    """The ``m`` rows of ``columns`` as shards of about ``shard_bytes`` in ``path``."""
    step = max(1, shard_bytes // plan.row_nbytes)
    infos = []
    for a in range(0, m, step):
        infos.append(
            write_shard(
                path, plan.schema, {k: c[a : a + step] for k, c in columns.items()}, **options
            )
        )
    return infos
