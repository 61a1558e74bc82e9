"""``xr.open_dataset(path, engine="rowstore")``: the xarray backend entry point."""

from __future__ import annotations

import os
from typing import Any

import xarray as xr
from xarray.backends import BackendEntrypoint

from rowstore.format import manifest
from rowstore.reader import Reader
from rowstore.xarray._meta import _meta
from rowstore.xarray._samples import _build


class RowstoreBackendEntrypoint(BackendEntrypoint):
    """``xr.open_dataset(path, engine="rowstore")``: files and dataset directories written by
    :mod:`rowstore.xarray`, lazily indexed (only the rows asked for are read; ``chunks=``
    gives Dask arrays)."""

    description = "rowstore files and dataset directories written by rowstore.xarray"
    url = "https://github.com/rowstore/rowstore"
    open_dataset_parameters = ("filename_or_obj", "drop_variables", "version")

    def open_dataset(
        self, filename_or_obj: Any, *, drop_variables: Any = None, version: int | None = None
    ) -> xr.Dataset:
        reader = Reader(os.fspath(filename_or_obj), version=version)
        drop = [drop_variables] if isinstance(drop_variables, str) else list(drop_variables or [])
        ds = _build(reader, _meta(reader), drop)
        ds.set_close(reader.close)
        return ds

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        try:
            p = os.fspath(filename_or_obj)
        except TypeError:
            return False
        if os.path.isdir(p):
            return os.path.isfile(os.path.join(p, manifest.POINTER))
        return p.endswith(".h5") and _is_rowstore_file(p)


def _is_rowstore_file(path: str) -> bool:
    try:
        import h5py

        with h5py.File(path, "r") as f:
            return "rowstore" in f
    except (OSError, ValueError):
        return False
