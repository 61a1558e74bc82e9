"""xarray Datasets in and out of rowstore: samples along a dimension, patches cut from a grid, and
back.

- :func:`to_rowstore` / :func:`open_dataset`: a Dataset with a sample dimension, one row per
  sample (every variable along it a field), restored identically (names, dims, coordinates,
  attributes including numpy-valued ones, dtypes, datetime coordinates), eagerly or lazily.
  ``xr.open_dataset(path, engine="rowstore")`` goes through :class:`RowstoreBackendEntrypoint`.
- :func:`write_patches`: samples cut out of a gridded Dataset (spatial patches with strides,
  time windows, whole kept dimensions), each row carrying its origin indices and coordinates,
  processed chunk by chunk (with halos) on the active Dask scheduler and written as shards in
  parallel, shuffled, optionally stacked into one channel field with normalization statistics.
- :func:`to_grid`: per-sample predictions back onto the grid (averaged where patches overlap,
  NaN where no sample landed).

xarray (and, for chunked data, dask) are imported only by this package.
"""

from rowstore.xarray._backend import RowstoreBackendEntrypoint
from rowstore.xarray._grid import to_grid
from rowstore.xarray._meta import META_KEY
from rowstore.xarray._patches import write_patches
from rowstore.xarray._samples import open_dataset, to_rowstore

__all__ = [
    "to_rowstore",
    "open_dataset",
    "write_patches",
    "to_grid",
    "RowstoreBackendEntrypoint",
    "META_KEY",
]
