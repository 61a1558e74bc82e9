""":func:`write_patches`: samples cut out of a gridded Dataset (spatial patches with strides, time
windows, whole kept dimensions), chunk by chunk (with halos) on the active Dask scheduler, written
as shards in parallel, shuffled, optionally stacked into one channel field with normalization
statistics."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rowstore._check import one_of
from rowstore.errors import SchemaError
from rowstore.format import manifest
from rowstore.global_shuffle import shuffle as local_shuffle
from rowstore.schema import Field, Schema
from rowstore.writer import commit, write_shard
from rowstore.writer.commit import ShardInfo
from rowstore.writer.file import DEFAULT_BLOCK_BYTES
from rowstore.xarray._meta import (
    META_KEY,
    META_VERSION,
    _attrs,
    _encoding,
    _field_dtype,
    _field_name,
)


# -- write_patches ---------------------------------------------------------------------------------
class _Plan:
    """What every task of :func:`write_patches` needs (plain values: it pickles to workers)."""

    def __init__(
        self,
        ds: xr.Dataset,
        *,
        patch: Mapping[str, int],
        stride: Mapping[str, int] | None,
        window: Mapping[str, int] | None,
        sample_over: Sequence[str] | str | None,
        keep: Sequence[str] | str,
        variables: Sequence[str] | None,
        stack: Any,
        channels: str,
        stack_name: str,
        dtype: Any,
        sample_dim: str,
    ):
        dims = list(ds.dims)
        patch, window, stride = dict(patch or {}), dict(window or {}), dict(stride or {})
        if (
            sample_over is None
        ):  # the default: time, unless it is a window or patch dimension or absent
            sample_over = [
                d for d in ("time",) if d in ds.dims and d not in patch and d not in window
            ]
        sample_over = [sample_over] if isinstance(sample_over, str) else list(sample_over)
        keep = [keep] if isinstance(keep, str) else list(keep)
        named: dict[str, str] = {}
        for what, group in (("patch", patch), ("window", window), ("sample_over", sample_over)):
            for d in group:
                if d not in ds.dims:
                    raise SchemaError(
                        f"{what}: {d!r} is not a dimension of the dataset (dims: {dims})"
                    )
                if d in named:
                    raise SchemaError(f"dimension {d!r} is in both {named[d]} and {what}")
                named[d] = what
        for d in stride:
            if d not in named:
                raise SchemaError(f"stride: {d!r} is not in patch, window or sample_over")
        self.kind = {d: ("over" if named[d] == "sample_over" else named[d]) for d in named}
        self.moving = [d for d in dims if d in named]  # in the dataset's order
        self.size = {d: int(patch.get(d, window.get(d, 1))) for d in self.moving}
        self.stride = {
            d: int(stride.get(d, self.size[d] if self.kind[d] == "patch" else 1))
            for d in self.moving
        }
        for d in self.moving:
            if self.size[d] < 1 or self.stride[d] < 1:
                raise ValueError(
                    f"dimension {d!r}: patch/window sizes and strides must be >= 1, got "
                    f"{self.size[d]} and {self.stride[d]}"
                )
        self.keep = [d for d in keep if d in ds.dims and d not in named]
        self.grid = {d: int(ds.sizes[d]) for d in self.moving}
        for d in self.moving:
            if (
                self.kind[d] != "over" and self.size[d] > self.grid[d]
            ):  # no whole patch fits: no sample
                what = self.kind[d]
                raise ValueError(
                    f"{what} dimension {d!r}: size {self.size[d]} is larger than the grid's "
                    f"{self.grid[d]}; no whole {what} fits (use a size <= {self.grid[d]})"
                )
        self.counts = {
            d: max(0, (self.grid[d] - self.size[d]) // self.stride[d] + 1) for d in self.moving
        }
        names = list(ds.data_vars) if variables is None else list(variables)
        for v in names:
            if v not in ds.data_vars:
                raise SchemaError(
                    f"variables: {v!r} is not a data variable (they are {list(ds.data_vars)})"
                )
            other = [d for d in ds[v].dims if d not in named and d not in self.keep]
            if other:
                raise SchemaError(
                    f"variable {v!r}: dimension {other[0]!r} is in none of patch, window, "
                    f"sample_over "
                    "or keep",
                    field=str(v),
                )
            if ds[v].dtype.kind not in "biufcmM":
                raise SchemaError(
                    f"variable {v!r}: dtype {ds[v].dtype} cannot be cut into patches", field=str(v)
                )
        self.variables = [str(v) for v in names]
        self.sample_dim = sample_dim
        self.vdims = {v: [str(d) for d in ds[v].dims] for v in self.variables}
        self.in_itemsize = {v: ds[v].dtype.itemsize for v in self.variables}
        self.sizes = {str(d): int(n) for d, n in ds.sizes.items()}
        self.sdims = {
            v: [d for d in self.vdims[v] if self.kind.get(d) != "over"] for v in self.variables
        }
        self.sshape = {
            v: tuple(self.size[d] if d in self.size else int(ds.sizes[d]) for d in self.sdims[v])
            for v in self.variables
        }
        self.dtype = {
            v: np.dtype(dtype) if dtype is not None and ds[v].dtype.kind == "f" else ds[v].dtype
            for v in self.variables
        }
        # stacking
        stacked = self.variables if stack is True else [] if not stack else list(stack)
        for v in stacked:
            if v not in self.variables:
                raise SchemaError(
                    f"stack: {v!r} is not one of the variables written ({self.variables})"
                )
        one_of("channels", channels, ("first", "last"))
        self.stacked, self.channels, self.stack_name = stacked, channels, stack_name
        self.spatial = [d for d in self.moving if self.kind[d] == "patch"]
        self.chan: dict[str, dict] = {}
        c = 0
        for v in stacked:
            cdims = [d for d in self.sdims[v] if d not in self.spatial]
            n = math.prod(self.sshape[v][self.sdims[v].index(d)] for d in cdims)
            self.chan[v] = {"start": c, "stop": c + n, "dims": cdims}
            c += n
        self.num_channels = c
        self.stack_dtype = (
            np.dtype(dtype)
            if dtype is not None
            else np.result_type(*[self.dtype[v] for v in stacked])
            if stacked
            else None
        )
        # coordinates of the moving dims: stored whole in the metadata, per sample in fields
        self.coords = {d: np.asarray(ds[d].values) for d in self.moving if d in ds.coords}
        for d, values in self.coords.items():
            if values.dtype.kind not in "biufcmMU" or (
                values.dtype.kind == "U" and self.kind[d] != "over"
            ):
                raise SchemaError(
                    f"coordinate {d!r} of dtype {values.dtype} cannot be stored per sample"
                )
        self.keep_coords = {d: ds[d].variable for d in self.keep if d in ds.coords}
        self._fields()

    def _fields(self) -> None:
        taken: set[str] = set()
        fields = []
        self.field = {}
        for v in self.variables:
            if v in self.stacked:
                continue
            self.field[v] = _field_name(v, taken)
            fields.append(Field(self.field[v], _field_dtype(v, self.dtype[v]), self.sshape[v]))
        if self.stacked:
            self.field[self.stack_name] = _field_name(self.stack_name, taken)
            fields.append(Field(self.field[self.stack_name], self.stack_dtype, self.stack_shape))
        self.index_field = _field_name("sample_index", taken)
        fields.append(Field(self.index_field, "int64"))
        self.origin_field, self.coord_field = {}, {}
        for d in self.moving:
            self.origin_field[d] = _field_name(f"{d}_origin", taken)
            fields.append(Field(self.origin_field[d], "int64"))
            if d in self.coords:
                c = self.coords[d]
                if self.kind[d] == "over":
                    self.coord_field[d] = _field_name(d, taken)
                    fields.append(Field(self.coord_field[d], _field_dtype(d, c.dtype)))
                else:
                    self.coord_field[d] = _field_name(f"{d}_values", taken)
                    fields.append(
                        Field(self.coord_field[d], _field_dtype(d, c.dtype), (self.size[d],))
                    )
        self.schema = Schema(fields)
        self.row_nbytes = max(
            1, sum(f.numpy_dtype.itemsize * math.prod(f.shape) for f in self.schema)
        )

    @property
    def stack_shape(self) -> tuple[int, ...]:
        sp = tuple(self.size[d] for d in self.spatial)
        return (self.num_channels, *sp) if self.channels == "first" else (*sp, self.num_channels)

    @property
    def footprint(self) -> tuple[str, ...]:
        """The moving dimensions a sample spans (patch and window dimensions), in order."""
        return tuple(d for d in self.moving if self.kind[d] != "over")

    def metadata(self, stats: dict) -> dict:
        sd = self.sample_dim
        variables: list[dict] = []
        static: list[dict] = []
        for v in self.variables:
            if v not in self.stacked:
                variables.append(
                    {
                        "name": v,
                        "field": self.field[v],
                        "dims": [sd, *self.sdims[v]],
                        "coord": False,
                        "attrs": {},
                        "encoding": {},
                        "dtype": self.dtype[v].str,
                    }
                )
        if self.stacked:
            dims = (
                ["channel", *self.spatial]
                if self.channels == "first"
                else [*self.spatial, "channel"]
            )
            variables.append(
                {
                    "name": self.stack_name,
                    "field": self.field[self.stack_name],
                    "dims": [sd, *dims],
                    "coord": False,
                    "attrs": {},
                    "encoding": {},
                    "dtype": np.dtype(self.stack_dtype).str,
                }
            )
        coords = [("sample_index", self.index_field, [sd])]
        for d in self.moving:
            coords.append((f"{d}_origin", self.origin_field[d], [sd]))
            if d in self.coord_field:
                coords.append(
                    (
                        self.coord_field[d],
                        self.coord_field[d],
                        [sd] if self.kind[d] == "over" else [sd, d],
                    )
                )
        for name, field, dims in coords:
            variables.append(
                {
                    "name": name,
                    "field": field,
                    "dims": dims,
                    "coord": True,
                    "attrs": {},
                    "encoding": {},
                }
            )
        for d, var in self.keep_coords.items():
            static.append(
                {
                    "name": d,
                    "dims": [d],
                    "coord": True,
                    "values": np.asarray(var.values),
                    "attrs": _attrs(var.attrs, f"coordinate {d!r}"),
                    "encoding": _encoding(var.encoding),
                }
            )
        patches = {
            "dims": self.moving,
            "kind": self.kind,
            "size": self.size,
            "stride": self.stride,
            "grid": self.grid,
            "counts": self.counts,
            "keep": self.keep,
            "coords": self.coords,
            "origin_fields": self.origin_field,
            "coord_fields": self.coord_field,
            "index_field": self.index_field,
            "fields": {v: self.field.get(v) for v in self.variables},
            "variable_dims": self.sdims,
            "stats": stats,
        }
        if self.stacked:
            patches["stack"] = {
                "name": self.stack_name,
                "field": self.field[self.stack_name],
                "layout": self.channels,
                "channels": self.chan,
                "num_channels": self.num_channels,
                "spatial": self.spatial,
            }
        return {
            "version": META_VERSION,
            "kind": "patches",
            "sample_dim": sd,
            "attrs": {},
            "variables": variables,
            "static": static,
            "patches": patches,
        }


def _extract(
    plan: _Plan,
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
    for i, d in enumerate(
        plan.moving
    ):  # a dimension the variable lacks: the same values at every origin
        if d not in vd:
            x = np.expand_dims(x, i)
    grid = tuple(counts[d] for d in plan.moving)
    x = np.broadcast_to(x, grid + plan.sshape[v])
    if select is not None:
        return x[np.unravel_index(select, grid)] if grid else x[np.zeros(len(select), np.intp)]
    return x.reshape((math.prod(grid), *plan.sshape[v]))


def _stack(plan: _Plan, parts: Mapping[str, np.ndarray]) -> np.ndarray:
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
    return _concat_channels(pieces, plan.channels, plan.stack_dtype)


#: Channel-last stacking of pieces with fewer channels than this concatenates channel-first and
#: transposes once (measured in bench/xarray_bench.py: 24 single-channel pieces 2.5x faster that
#: way; pieces of 8 channels about as fast directly, into a C-order output).
MIN_DIRECT_CHANNELS = 4


def _concat_channels(pieces: Sequence[np.ndarray], channels: str, dtype: Any) -> np.ndarray:
    """Pieces ``(n, C_i, *spatial)`` as one ``(n, sum C_i, *spatial)`` (``"first"``) or
    ``(n, *spatial, sum C_i)`` (``"last"``) array."""
    if channels == "first":
        return np.concatenate(pieces, axis=1, dtype=dtype)
    if (
        min(p.shape[1] for p in pieces) < MIN_DIRECT_CHANNELS
    ):  # short runs: one strided pass, not one per piece
        return np.ascontiguousarray(np.moveaxis(np.concatenate(pieces, axis=1, dtype=dtype), 1, -1))
    n, spatial = pieces[0].shape[0], pieces[0].shape[2:]
    out = np.empty(
        (n, *spatial, sum(p.shape[1] for p in pieces)), dtype
    )  # C order (concatenate keeps the pieces' layout)
    return np.concatenate(
        [np.moveaxis(p, 1, -1) for p in pieces], axis=-1, out=out, casting="same_kind"
    )


def _stats(x: np.ndarray, axes: tuple[int, ...] | None = None) -> list:
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


def _where(
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


def _patch_task(
    sub: xr.Dataset,
    plan: _Plan,
    start: Mapping[str, int],
    counts: Mapping[str, int],
    task: int,
    path: str,
    where: Any,
    shard_bytes: int,
    options: dict,
) -> tuple[list, dict]:
    """Cut, filter, stack and write the samples whose origins lie in one region (in grid order:
    the shuffle comes after, over all of them); returns the shards' infos and the partial
    statistics."""
    n = math.prod(counts[d] for d in plan.moving)
    if n == 0:
        return [], {}
    arrays = {v: np.asarray(sub[v].values) for v in plan.variables}
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
    if where is None:  # every sample: gathered straight from the window views
        order = np.arange(n)
        parts = {
            v: _extract(plan, v, a, counts, order).astype(plan.dtype[v], copy=False)
            for v, a in arrays.items()
        }
        columns = {k: c[order] for k, c in columns.items()}
    else:
        parts = {
            v: _extract(plan, v, a, counts).astype(plan.dtype[v], copy=False)
            for v, a in arrays.items()
        }
        order = _where(where, parts, columns, n)
        parts = {v: x[order] for v, x in parts.items()}
        columns = {k: c[order] for k, c in columns.items()}
    stats = {v: _stats(parts[v]) for v in plan.variables}
    for v in plan.variables:
        if v not in plan.stacked:
            columns[plan.field[v]] = parts[v]
    if plan.stacked:
        x = _stack(plan, parts)
        caxis = 1 if plan.channels == "first" else x.ndim - 1
        stats[plan.stack_name] = _stats(x, tuple(a for a in range(x.ndim) if a != caxis))
        columns[plan.field[plan.stack_name]] = x
    m = len(order)
    step = max(1, shard_bytes // plan.row_nbytes)
    infos = []
    for a in range(0, m, step):
        infos.append(
            write_shard(
                path, plan.schema, {k: c[a : a + step] for k, c in columns.items()}, **options
            )
        )
    return infos, stats


def _combine_stats(plan: _Plan, parts: Iterable[dict]) -> dict:
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


def _shuffle_output(
    path: str,
    infos: list[ShardInfo],
    plan: _Plan,
    *,
    shuffle: dict | None,
    mode: str,
    attrs: dict,
    options: dict,
) -> int:
    """Commit the shards the tasks wrote as one version of ``path``: the shuffle step of
    :func:`write_patches`, in one place.

    ``shuffle`` None: the tasks wrote into ``path``; their shards are committed in task order.
    Otherwise the tasks wrote into a temporary dataset (``shuffle["work"]``): it is committed
    there, globally shuffled by the two-pass out-of-core shuffle (:func:`rowstore.shuffle`, or
    :func:`rowstore.dask.shuffle` on the current ``dask.distributed`` client: the same output)
    through ``shuffle["memory"]`` into a staging dataset beside ``path``, whose shard files are
    then moved into ``path`` and committed there (``mode``); both temporaries are removed,
    whatever happens. The order is a uniform permutation of the samples, a pure function of
    ``seed`` and the input's chunking.
    """
    if not infos:  # every sample dropped: an empty shard carries the schema
        root = path if shuffle is None else shuffle["work"]
        infos = [
            write_shard(
                root,
                plan.schema,
                {f.name: np.empty((0, *f.shape), f.numpy_dtype) for f in plan.schema},
                **options,
            )
        ]
    if shuffle is None:
        return commit(path, infos, mode=mode, attrs=attrs)
    import shutil

    work, staged = shuffle["work"], shuffle["staged"]
    try:
        commit(work, infos, mode="x", attrs=attrs)
        kwargs = dict(
            memory=shuffle["memory"],
            seed=shuffle["seed"],
            tmp=shuffle["tmp"],
            shard_bytes=shuffle["shard_bytes"],
            block_bytes=options["block_bytes"],
            compression="same",
        )
        client = _distributed_client() if shuffle["cluster"] else None
        if client is not None:
            from rowstore.dask import shuffle as dask_shuffle

            dask_shuffle(work, staged, client=client, **kwargs)
        else:
            local_shuffle(work, staged, **kwargs)
        moved = ShardInfo.committed(staged)
        os.makedirs(os.path.join(path, "shards"), exist_ok=True)
        for info in moved:  # part-<32 hex> names: unique, so they never overwrite a shard of path
            os.replace(os.path.join(staged, info.path), os.path.join(path, info.path))
        return commit(path, moved, mode=mode, attrs=attrs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(staged, ignore_errors=True)


def _distributed_client() -> Any:
    """The current ``dask.distributed`` client, or None (no cluster in use)."""
    try:
        import distributed

        return distributed.get_client()
    except (ImportError, ValueError):
        return None


def _regions(
    plan: _Plan, chunks: Mapping[Hashable, tuple[int, ...]], task_bytes: int | None = None
) -> list[tuple[dict, dict, dict]]:
    """Per task: (origin grid start, origin counts, input slices with the halo) for each chunk of
    the input along the moving dimensions that holds at least one patch origin; consecutive
    chunks along the first moving dimension are merged while the task's input and samples stay
    within ``task_bytes``."""
    per_dim = []
    for d in plan.moving:
        s, p, cnt = plan.stride[d], plan.size[d], plan.counts[d]
        out, a = [], 0
        for c in chunks.get(d, (plan.grid[d],)):
            b = a + c
            j0, j1 = -(-a // s), min(-(-b // s), cnt)
            if j1 > j0:
                out.append((j0, j1 - j0, slice(j0 * s, (j1 - 1) * s + p)))
            a = b
        per_dim.append(out)
    if task_bytes is not None and per_dim and per_dim[0]:
        d0 = plan.moving[0]
        other = math.prod(max((it[1] for it in items), default=0) for items in per_dim[1:])
        most = max(
            1, task_bytes // max(1, other * plan.row_nbytes)
        )  # origins along the first dim per task
        span = {
            d: max((it[2].stop - it[2].start for it in items), default=0)
            for d, items in zip(plan.moving, per_dim)
        }
        step_in = sum(
            plan.in_itemsize[v]
            * math.prod(span.get(d, plan.sizes[d]) for d in plan.vdims[v] if d != d0)
            for v in plan.variables
        )  # input bytes of one index of the first dim
        merged = [per_dim[0][0]]
        for it in per_dim[0][1:]:
            j0, n0, sl0 = merged[-1]
            if n0 + it[1] <= most and (it[2].stop - sl0.start) * step_in <= task_bytes:
                merged[-1] = (j0, n0 + it[1], slice(sl0.start, it[2].stop))
            else:
                merged.append(it)
        per_dim[0] = merged
    regions = []
    for combo in np.ndindex(*[len(x) for x in per_dim]):
        items = [per_dim[i][k] for i, k in enumerate(combo)]
        regions.append(
            (
                {d: it[0] for d, it in zip(plan.moving, items)},
                {d: it[1] for d, it in zip(plan.moving, items)},
                {d: it[2] for d, it in zip(plan.moving, items)},
            )
        )
    return regions


def write_patches(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    patch: Mapping[str, int] | None = None,
    stride: Mapping[str, int] | None = None,
    window: Mapping[str, int] | None = None,
    sample_over: Sequence[str] | str | None = None,
    keep: Sequence[str] | str = ("altitude",),
    variables: Sequence[str] | None = None,
    where: str | Callable[[dict], Any] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    stack: bool | Sequence[str] | None = None,
    channels: str = "last",
    stack_name: str = "stack",
    dtype: Any = None,
    sample_dim: str = "sample",
    shard_bytes: int = 64 << 20,
    task_bytes: int = 8 << 20,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    compression: Any = None,
    mode: str = "w",
    memory: int | str = "1GB",
    tmp: str | os.PathLike | None = None,
    compute: bool = True,
) -> Any:
    """Cut samples out of a gridded Dataset into a rowstore dataset directory, one row per sample.

    Parameters
    ----------
    ds : xarray.Dataset
        Numpy- or Dask-backed. Every dimension of a variable written must be in ``patch``,
        ``window``, ``sample_over`` or ``keep``.
    path : str or os.PathLike
        The dataset directory (written as shards, committed once).
    patch : mapping of dim to int
        Patch sizes (default ``{"lat": 9, "lon": 9}``); a patch dimension is stacked spatially.
    stride : mapping of dim to int, optional
        Step between patch origins per dimension; default the patch size for ``patch``
        dimensions (tiles), 1 for ``window`` and ``sample_over`` dimensions. A stride smaller
        than the size overlaps samples. Only whole patches are cut: origins ``0, s, 2s, ...`` up
        to ``size - patch`` (a remainder at the far edge is not covered); a patch larger than its
        dimension is a ``ValueError``.
    window : mapping of dim to int, optional
        Runs of consecutive steps (``{"time": 2}`` for pairs), kept as a dimension of the sample.
    sample_over : sequence of dims, optional
        Every index is its own sample; the dimension is dropped (its coordinate value is stored).
        Default ``("time",)`` when ``ds`` has a ``time`` dimension not in ``patch``/``window``.
    keep : sequence of dims
        Taken whole (e.g. all altitudes). Names that are not dimensions of ``ds`` are ignored.
    variables : sequence of str, optional
        Data variables to write (default all).
    where : "notnull" or callable, optional
        Drop samples: ``"notnull"`` drops those with a NaN (NaT) in any variable written; a
        callable gets a dict of the region's samples (each variable ``(n, ...)`` before
        stacking, plus the origin/coordinate fields) and returns ``n`` bools (True = keep),
        e.g. ``lambda s: s["land"].all(axis=(1, 2))``.
    shuffle, seed : bool, int
        Shuffle the output globally (a uniform permutation of all samples, deterministic for a
        seed and the input's chunking): the samples are written to a temporary dataset beside
        ``path`` and shuffled by the two-pass out-of-core shuffle (:func:`rowstore.shuffle`;
        :func:`rowstore.dask.shuffle` when a ``dask.distributed`` client is current), which
        costs about two more passes over the samples on disk (see :func:`_shuffle_output`).
    memory : int or str
        The shuffle's memory budget (as for :func:`rowstore.shuffle`).
    tmp : str or os.PathLike, optional
        Directory of the shuffle's piles (default: beside ``path``).
    stack : True or sequence of str, optional
        Stack these variables (True: all) into one field ``stack_name`` with a channel
        dimension: each variable's non-patch dimensions (kept levels, window steps) are
        flattened into its channels, in order, then variables are concatenated.
    channels : {"last", "first"}
        Channel-last ``(patch..., C)`` (tf/Keras) or channel-first ``(C, patch...)`` (torch).
    dtype : optional
        Cast floating variables (and the stacked field) to it, e.g. ``"float32"``.
    sample_dim : str
        The sample dimension :func:`open_dataset` gives the result.
    shard_bytes, block_bytes, compression
        Shard and block sizes, block compression (as for :class:`~rowstore.DatasetWriter`).
    task_bytes : int
        Consecutive input chunks along the first moving dimension are merged into one task
        while its input region and its samples each stay within this many bytes (fewer, larger
        shards from finely chunked inputs); with the chunks of the other dimensions it bounds a
        task's memory.
    mode : {"w", "x"}
        As for :func:`~rowstore.commit`.
    compute : bool
        ``False``: return a ``dask.delayed`` that writes and commits.

    Returns
    -------
    int or dask.delayed.Delayed
        The committed version.

    Notes
    -----
    Fields: each variable (shape: its dimensions except ``sample_over``, patch sizes for patch
    and window dimensions) or the stacked field; ``sample_index`` (row-major origin position);
    per moving dimension ``<dim>_origin`` (the index of the sample's first element), and its
    coordinate: ``<dim>`` for ``sample_over`` dimensions (e.g. the time), ``<dim>_values`` the
    patch's vector otherwise. The metadata (user attribute ``"xarray"``) holds the grid
    (sizes, full coordinates), the plan, and per variable (and per channel) the ``mean``,
    ``std`` and ``count`` of the values written (NaN ignored), computed in the same pass.

    Dask-backed inputs are processed chunk by chunk: one task per input chunk (along the moving
    dimensions; consecutive ones merged up to ``task_bytes``) that holds patch origins, reading
    that chunk plus the ``patch - stride`` halo it needs from the next chunks; each task writes
    its samples as shards on the worker
    (:func:`~rowstore.write_shard`), and one :func:`~rowstore.commit` publishes them. Memory
    per task: its input region and its samples (overlapping patches multiply the input).
    Numpy-backed inputs are cut into regions along the first moving dimension of about
    ``task_bytes`` of samples each, on the active scheduler too.
    """
    path = os.fspath(path)
    import dask

    one_of("mode", mode, ("w", "x"))
    plan = _Plan(
        ds,
        patch={"lat": 9, "lon": 9} if patch is None else patch,
        stride=stride,
        window=window,
        sample_over=sample_over,
        keep=keep,
        variables=variables,
        stack=stack,
        channels=channels,
        stack_name=stack_name,
        dtype=dtype,
        sample_dim=sample_dim,
    )
    if where is not None and where != "notnull" and not callable(where):
        raise ValueError(f"where must be None, 'notnull' or a callable, got {where!r}")
    sub = ds[plan.variables].drop_vars(list(ds[plan.variables].coords))
    if not sub.chunks and plan.moving:
        d0 = plan.moving[0]
        per_step = max(1, plan.row_nbytes * math.prod(plan.counts[d] for d in plan.moving[1:]))
        origins = max(1, task_bytes // per_step)
        sub = sub.chunk({d0: max(1, origins * plan.stride[d0])})
    sub = sub.unify_chunks()
    chunks = dict(sub.chunks) if sub.chunks else {}
    options = dict(block_bytes=block_bytes, compression=compression)
    task = dask.delayed(_patch_task, pure=False)
    shared = dask.delayed(
        plan, traverse=False
    )  # one key in the graph (it holds the grid's coordinates), not one copy per task
    if mode == "x" and (manifest.is_dataset(path) or os.path.exists(path)):
        raise FileExistsError(f"{path!r} exists (mode='x')")
    glob: dict | None = (
        None  # the global shuffle's settings; the tasks then write into glob["work"]
    )
    if shuffle:
        parent, name = os.path.split(os.path.abspath(path))
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        glob = dict(
            work=os.path.join(parent, f".{name}.patches-{tag}"),
            staged=os.path.join(parent, f".{name}.shuffled-{tag}"),
            memory=memory,
            seed=seed,
            tmp=None if tmp is None else os.fspath(tmp),
            shard_bytes=shard_bytes,
            cluster=compute,
        )
    target = path if glob is None else glob["work"]
    tasks = [
        task(sub.isel(sl), shared, start, counts, i, target, where, shard_bytes, options)
        for i, (start, counts, sl) in enumerate(_regions(plan, chunks, task_bytes))
    ]
    if not compute:
        return dask.delayed(_finish_patches, pure=False)(path, tasks, plan, glob, mode, options)
    try:
        results = list(dask.compute(*tasks))
    except BaseException:
        if glob is not None:
            import shutil

            shutil.rmtree(glob["work"], ignore_errors=True)
        raise
    return _finish_patches(path, results, plan, glob, mode, options)


def _finish_patches(
    path: str, results: list, plan: _Plan, glob: dict | None, mode: str, options: dict
) -> int:
    infos = [i for r in results for i in r[0]]
    stats = _combine_stats(plan, [r[1] for r in results])
    return _shuffle_output(
        path,
        infos,
        plan,
        shuffle=glob,
        mode=mode,
        attrs={META_KEY: plan.metadata(stats)},
        options=options,
    )
