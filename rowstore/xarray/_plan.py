"""Planning :func:`~rowstore.xarray.write_patches`: what a sample is (:class:`PatchPlan`: the role
and size of each dimension, the variables, the stacked field, the coordinates, the schema, the
metadata) and which region of the grid each task cuts (:func:`task_regions`). Plain values only:
a plan pickles to Dask workers."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rowstore._check import one_of
from rowstore.errors import SchemaError
from rowstore.schema import Field, Schema
from rowstore.xarray._meta import (
    META_VERSION,
    _attrs,
    _encoding,
    _field_dtype,
    _field_name,
)


class PatchPlan:
    """What every task of :func:`~rowstore.xarray.write_patches` needs, resolved and checked
    once from its arguments.

    Built in steps, each a method: the role of each named dimension (:meth:`_roles`: patch,
    window or "over"), sizes, strides and origin counts (:meth:`_sizes`), the variables written
    and their sample shapes (:meth:`_variables`), the stacked channel field (:meth:`_stacking`),
    the coordinates stored per sample (:meth:`_coordinates`) and the fields (:meth:`_fields`).
    """

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
        patch, window, stride = dict(patch or {}), dict(window or {}), dict(stride or {})
        self.sample_dim = sample_dim
        self._roles(ds, patch, window, stride, sample_over)
        self._sizes(ds, patch, window, stride, keep)
        self._variables(ds, variables, dtype)
        self._stacking(stack, channels, stack_name, dtype)
        self._coordinates(ds)
        self._fields()

    def _roles(
        self,
        ds: xr.Dataset,
        patch: dict,
        window: dict,
        stride: dict,
        sample_over: Sequence[str] | str | None,
    ) -> None:
        """``kind`` (``"patch"``, ``"window"`` or ``"over"``) of each named dimension and
        ``moving``, those dimensions in the dataset's order."""
        dims = list(ds.dims)
        if sample_over is None:  # the default: time, unless it is a window or patch dim or absent
            sample_over = [
                d for d in ("time",) if d in ds.dims and d not in patch and d not in window
            ]
        sample_over = [sample_over] if isinstance(sample_over, str) else list(sample_over)
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

    def _sizes(
        self, ds: xr.Dataset, patch: dict, window: dict, stride: dict, keep: Sequence[str] | str
    ) -> None:
        """Per moving dimension its sample ``size``, ``stride``, ``grid`` length and the
        ``counts`` of origins; ``keep``, the dimensions taken whole."""
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
        keep = [keep] if isinstance(keep, str) else list(keep)
        self.keep = [d for d in keep if d in ds.dims and d not in self.kind]
        self.grid = {d: int(ds.sizes[d]) for d in self.moving}
        for d in self.moving:
            if self.kind[d] != "over" and self.size[d] > self.grid[d]:  # no whole patch fits
                what = self.kind[d]
                raise ValueError(
                    f"{what} dimension {d!r}: size {self.size[d]} is larger than the grid's "
                    f"{self.grid[d]}; no whole {what} fits (use a size <= {self.grid[d]})"
                )
        self.counts = {
            d: max(0, (self.grid[d] - self.size[d]) // self.stride[d] + 1) for d in self.moving
        }

    def _variables(self, ds: xr.Dataset, variables: Sequence[str] | None, dtype: Any) -> None:
        """The ``variables`` written, checked, with their dimensions (``vdims``), the sample's
        dimensions and shape (``sdims``, ``sshape``) and the ``dtype`` they are written in."""
        names = list(ds.data_vars) if variables is None else list(variables)
        for v in names:
            if v not in ds.data_vars:
                raise SchemaError(
                    f"variables: {v!r} is not a data variable (they are {list(ds.data_vars)})"
                )
            other = [d for d in ds[v].dims if d not in self.kind and d not in self.keep]
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

    def _stacking(self, stack: Any, channels: str, stack_name: str, dtype: Any) -> None:
        """The ``stacked`` variables, each one's range of channels (``chan``), the ``spatial``
        (patch) dimensions, ``num_channels`` and ``stack_dtype``."""
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

    def _coordinates(self, ds: xr.Dataset) -> None:
        """The moving dimensions' ``coords`` (stored whole in the metadata, per sample in
        fields) and the kept dimensions' (``keep_coords``, in the metadata)."""
        self.coords = {d: np.asarray(ds[d].values) for d in self.moving if d in ds.coords}
        for d, values in self.coords.items():
            if values.dtype.kind not in "biufcmMU" or (
                values.dtype.kind == "U" and self.kind[d] != "over"
            ):
                raise SchemaError(
                    f"coordinate {d!r} of dtype {values.dtype} cannot be stored per sample"
                )
        self.keep_coords = {d: ds[d].variable for d in self.keep if d in ds.coords}

    def _fields(self) -> None:
        """The ``schema``: a field per variable (or the stacked field), ``sample_index``, and per
        moving dimension its origin and coordinate fields; ``row_nbytes``."""
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
        """The user attribute ``"xarray"`` of the dataset written: the variables and coordinates
        (fields, dims), the kept coordinates whole, and the plan with the statistics ``stats``."""
        return {
            "version": META_VERSION,
            "kind": "patches",
            "sample_dim": self.sample_dim,
            "attrs": {},
            "variables": self._variable_entries() + self._coordinate_entries(),
            "static": self._static_entries(),
            "patches": self._patches_entry(stats),
        }

    def _variable_entries(self) -> list[dict]:
        sd = self.sample_dim
        variables: list[dict] = []
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
        return variables

    def _coordinate_entries(self) -> list[dict]:
        """The per-sample coordinates: ``sample_index``, each moving dimension's origin and
        coordinate."""
        sd = self.sample_dim
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
        return [
            {"name": name, "field": field, "dims": dims, "coord": True, "attrs": {}, "encoding": {}}
            for name, field, dims in coords
        ]

    def _static_entries(self) -> list[dict]:
        """The kept dimensions' coordinates, stored whole."""
        return [
            {
                "name": d,
                "dims": [d],
                "coord": True,
                "values": np.asarray(var.values),
                "attrs": _attrs(var.attrs, f"coordinate {d!r}"),
                "encoding": _encoding(var.encoding),
            }
            for d, var in self.keep_coords.items()
        ]

    def _patches_entry(self, stats: dict) -> dict:
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
        return patches


def task_regions(
    plan: PatchPlan, chunks: Mapping[Hashable, tuple[int, ...]], task_bytes: int | None = None
) -> list[tuple[dict, dict, dict]]:
    """Per task: (origin grid start, origin counts, input slices with the halo) for each chunk of
    the input along the moving dimensions that holds at least one patch origin; consecutive
    chunks along the first moving dimension are merged while the task's input and samples stay
    within ``task_bytes``."""
    per_dim = [_chunk_origins(plan, d, chunks.get(d, (plan.grid[d],))) for d in plan.moving]
    if task_bytes is not None and per_dim and per_dim[0]:
        per_dim[0] = _merge_first_dim(plan, per_dim, task_bytes)
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


def _chunk_origins(plan: PatchPlan, d: str, chunks: Sequence[int]) -> list[tuple]:
    """Along dimension ``d``: (first origin, origins, input slice with the halo) of each chunk
    holding an origin."""
    s, p, cnt = plan.stride[d], plan.size[d], plan.counts[d]
    out, a = [], 0
    for c in chunks:
        b = a + c
        j0, j1 = -(-a // s), min(-(-b // s), cnt)
        if j1 > j0:
            out.append((j0, j1 - j0, slice(j0 * s, (j1 - 1) * s + p)))
        a = b
    return out


def _merge_first_dim(plan: PatchPlan, per_dim: list[list[tuple]], task_bytes: int) -> list[tuple]:
    """The first moving dimension's chunks, consecutive ones merged while a task's samples and
    its input region each stay within ``task_bytes``."""
    d0 = plan.moving[0]
    other = math.prod(max((it[1] for it in items), default=0) for items in per_dim[1:])
    most = max(1, task_bytes // max(1, other * plan.row_nbytes))  # origins along d0 per task
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
    return merged
