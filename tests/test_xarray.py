"""rowstore.xarray: Datasets round trip identically (eager, lazy, engine="rowstore"); write_patches
matches a naive NumPy slicing reference (edges, strides, overlaps, windows, Dask chunk
boundaries with chunks smaller than a patch), drops samples by ``where``, stacks channels; the
Dask path stays within a memory budget; to_grid inverts it."""

import os
import textwrap

import numpy as np
import pandas as pd
import pytest

xr = pytest.importorskip("xarray")
da = pytest.importorskip("dask.array")
import dask  # noqa: E402

import rowstore  # noqa: E402
from rowstore.xarray import open_dataset, to_rowstore  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads", num_workers=2):
        yield


def sample_ds(n=7):
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {"t": (("sample", "alt", "x"), rng.random((n, 3, 2)).astype("f4"),
               {"units": "K", "valid_range": np.array([0.0, 1.0]), "scale": np.float32(0.5)}),
         "flag": (("x", "sample"), rng.random((2, n)) > 0.5),  # the sample dimension not first
         "label": ("sample", np.arange(n, dtype=np.int16)),
         "name": ("sample", np.array([f"s{i}" for i in range(n)])),
         "big": ("sample", np.arange(n, dtype=">i4")),
         "const": ("alt", np.arange(3.0))},
        coords={"sample": np.arange(n) * 10,
                "time": ("sample", pd.date_range("2020-01-01", periods=n, freq="h").values.astype("M8[ns]")),
                "lead": ("sample", np.arange(n).astype("m8[s]")),
                "alt": ("alt", np.array([1.0, 2.0, 3.0]), {"units": "m"}),
                "station id": ("sample", np.arange(n) + 100)},  # not an identifier: a sanitized field name
        attrs={"title": "test", "scale": np.float32(2.5), "levels": np.arange(4), "nested": {"a": [1, 2]}},
    )  # fmt: skip


def assert_identical_dtypes(a, b):
    xr.testing.assert_identical(a, b)
    for k in b.variables:
        assert a[k].dtype.kind == b[k].dtype.kind and a[k].dtype.itemsize == b[k].dtype.itemsize, k
        assert a[k].dims == b[k].dims, k
    for k, v in b.attrs.items():
        if isinstance(v, (np.ndarray, np.generic)):
            assert type(a.attrs[k]) is type(v) and a.attrs[k].dtype == v.dtype


@pytest.mark.parametrize("kind", ["file", "dataset", "dask"])
def test_round_trip_identical(tmp_path, kind):
    ds = sample_ds()
    path = str(tmp_path / ("a.h5" if kind == "file" else "ds"))
    to_rowstore(ds.chunk(sample=3) if kind == "dask" else ds, path)
    if kind == "dask":
        assert rowstore.open(path).layout.num_shards == 3  # one shard per chunk
    back = open_dataset(path)
    assert not back.t.chunks  # in memory
    assert_identical_dtypes(back, ds)
    assert back.t.attrs["scale"].dtype == np.float32
    assert back.time.dtype == np.dtype("M8[ns]") and back.lead.dtype == np.dtype("m8[s]")
    lazy = open_dataset(path, chunks={"sample": 3})
    assert lazy.t.chunks == ((3, 3, 1), (3,), (2,))
    assert_identical_dtypes(lazy.compute(), ds)
    with xr.open_dataset(path, engine="rowstore") as opened:
        assert_identical_dtypes(opened.load(), ds)
    with xr.open_dataset(path, engine="rowstore", chunks={"sample": 2}, drop_variables=["flag"]) as opened:
        assert opened.t.chunks[0] == (2, 2, 2, 1)
        assert_identical_dtypes(opened.compute(), ds.drop_vars("flag"))
    assert_identical_dtypes(open_dataset(path, rows=[3, 1, 3]), ds.isel(sample=[3, 1, 3]))
    assert_identical_dtypes(open_dataset(path, rows=slice(1, 5), fields=["t"]), ds.isel(sample=slice(1, 5))[["t"]])


def test_lazy_indexing_reads_what_is_asked(tmp_path):
    ds = sample_ds(20)
    to_rowstore(ds, str(tmp_path / "ds"))
    with xr.open_dataset(str(tmp_path / "ds"), engine="rowstore") as lazy:
        xr.testing.assert_identical(lazy.t[[5, 2], 1, ::-1].load(), ds.t[[5, 2], 1, ::-1])
        xr.testing.assert_identical(lazy.flag[:, 3:9:2].load(), ds.flag[:, 3:9:2])
        xr.testing.assert_identical(lazy.t.isel(sample=4, x=[1, 0]).load(), ds.t.isel(sample=4, x=[1, 0]))


def test_guess_can_open_and_errors(tmp_path):
    from rowstore.xarray import RowstoreBackendEntrypoint

    ds = sample_ds()
    to_rowstore(ds, str(tmp_path / "ds"))
    to_rowstore(ds, str(tmp_path / "a.h5"))
    e = RowstoreBackendEntrypoint()
    assert e.guess_can_open(str(tmp_path / "ds")) and e.guess_can_open(str(tmp_path / "a.h5"))
    assert not e.guess_can_open(str(tmp_path)) and not e.guess_can_open(str(tmp_path / "none.h5"))
    s = rowstore.Schema([rowstore.Field("x", "int64")])
    with rowstore.Writer(str(tmp_path / "plain.h5"), s) as w:
        w.write({"x": 1})
    with pytest.raises(rowstore.SchemaError, match="not written by rowstore.xarray"):
        open_dataset(str(tmp_path / "plain.h5"))
    with pytest.raises(rowstore.SchemaError, match="sample_dim 'row'"):
        to_rowstore(ds, str(tmp_path / "b"), sample_dim="row")
    with pytest.raises(rowstore.SchemaError, match="fields \\['nope'\\]"):
        open_dataset(str(tmp_path / "ds"), fields=["nope"])
    with pytest.raises(rowstore.SchemaError, match="dtype object"):
        to_rowstore(xr.Dataset({"o": ("sample", np.array([object()]))}), str(tmp_path / "c"))
