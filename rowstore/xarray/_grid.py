"""Per-sample predictions back onto the grid :func:`~rowstore.xarray.write_patches` cut the
samples from (:func:`to_grid`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rowstore.errors import SchemaError
from rowstore.reader import Reader
from rowstore.xarray._meta import (
    _meta,
)


# -- to_grid
# ----------------------------------------------------------------------------------------
def _patch_meta(reader: Reader) -> dict:
    meta = _meta(reader)
    if meta.get("kind") != "patches":
        raise SchemaError(
            f"{reader.layout.path!r} was not written by write_patches (no patch metadata)"
        )
    return meta["patches"]


def to_grid(
    predictions: Any,
    path_or_reader: str | os.PathLike | Reader,
    *,
    like: xr.Dataset | xr.DataArray | None = None,
    rows: Any = None,
    name: str = "prediction",
    window_step: int | None = None,
) -> xr.Dataset:
    """Put per-sample predictions back onto the grid :func:`write_patches` cut the samples from.

    Parameters
    ----------
    predictions : array or mapping of name to array
        One entry per row (in dataset row order, or of ``rows``): shaped like a sample's
        footprint (its ``window`` and ``patch`` dimensions, in the dataset's dimension order),
        like its patch only (e.g. ``(n, 9, 9)`` for samples of ``window={"time": 2}``: placed at
        one step of the window), or one value per sample (``(n,)``). Dimensions a prediction
        does not span place it at the centre (index ``origin + size // 2``).
    path_or_reader : str, os.PathLike or Reader
        The dataset written by :func:`write_patches` (its ``<dim>_origin`` fields are read).
    like : xarray.Dataset or DataArray, optional
        The source grid: its coordinates are used and checked against those stored (sizes and
        values); default the coordinates stored in the metadata.
    rows : slice or sequence of int, optional
        The rows the predictions are for (default all, in order).
    name : str
        The variable name for an array given as ``predictions``.
    window_step : int, optional
        Where in a window a prediction that does not span it lands (``-1``: the last step, as
        for a forecast from a pair); default the centre.

    Returns
    -------
    xarray.Dataset
        One variable per prediction over the moving dimensions (``sample_over``, ``window``,
        ``patch``): the mean of the values that landed on each point (float64, or the
        predictions' floating dtype), NaN where none did. Exact for non-overlapping patches.
    """
    reader = (
        path_or_reader if isinstance(path_or_reader, Reader) else Reader(os.fspath(path_or_reader))
    )
    P = _patch_meta(reader)
    dims, size, kind, grid = P["dims"], P["size"], P["kind"], P["grid"]
    preds = dict(predictions) if isinstance(predictions, Mapping) else {name: predictions}
    idx = np.arange(len(reader)) if rows is None else np.arange(len(reader))[rows]
    origins = reader.take(idx, fields=[P["origin_fields"][d] for d in dims]) if len(idx) else {}
    coords: dict[str, Any] = {d: np.asarray(P["coords"][d]) for d in P["coords"]}
    if like is not None:
        for d in dims:
            if d not in like.dims or like.sizes[d] != grid[d]:
                raise SchemaError(
                    f"like: dimension {d!r} has {like.sizes.get(d)} elements, the samples were cut "
                    f"from "
                    f"{grid[d]}"
                )
            if d in coords and (
                d not in like.coords or not np.array_equal(np.asarray(like[d].values), coords[d])
            ):
                raise SchemaError(
                    f"like: the coordinate {d!r} differs from the one the samples were cut from"
                )
        coords = {d: like[d].variable for d in dims if d in like.coords}
    foot = [d for d in dims if kind[d] != "over"]
    fshape = tuple(size[d] for d in foot)
    patch_dims = [d for d in foot if kind[d] == "patch"]
    pshape = tuple(size[d] for d in patch_dims)
    out = xr.Dataset(
        coords={d: (d, c) if isinstance(c, np.ndarray) else c for d, c in coords.items()}
    )
    for key, values in preds.items():
        v = np.asarray(values)
        if len(v) != len(idx):
            raise ValueError(
                f"predictions {key!r}: {len(v)} rows, expected {len(idx)} (one per sample)"
            )
        if v.shape[1:] == fshape:
            spread = foot
        elif v.shape[1:] == pshape:
            spread = patch_dims
        elif v.shape[1:] == ():
            spread = []
        else:
            raise ValueError(
                f"predictions {key!r}: a sample's shape is {v.shape[1:]}, expected {fshape} (the "
                f"footprint over {foot}), {pshape} (over {patch_dims}) or () (one value per "
                "sample)"
            )
        index: list[np.ndarray] = []
        for d in dims:
            o = np.asarray(origins[P["origin_fields"][d]], np.int64).reshape(-1, *[1] * len(spread))
            if d in spread:
                at = [1] * len(spread)
                at[spread.index(d)] = size[d]
                o = o + np.arange(size[d]).reshape(at)
            elif kind[d] == "window" and window_step is not None:
                o = o + window_step % size[d]
            elif kind[d] != "over":
                o = o + size[d] // 2
            index.append(np.broadcast_to(o, v.shape))
        total = np.zeros([grid[d] for d in dims], np.float64)
        count = np.zeros(total.shape, np.int64)
        ok = ~np.isnan(v) if v.dtype.kind == "f" else np.ones(v.shape, bool)
        np.add.at(total, tuple(i[ok] for i in index), v[ok].astype(np.float64))
        np.add.at(count, tuple(i[ok] for i in index), 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        dt = v.dtype if v.dtype.kind == "f" else np.float64
        out[key] = (dims, mean.astype(dt))
    return out
