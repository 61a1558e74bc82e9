"""rowstore.xarray: Datasets round trip identically (eager, lazy, engine="rowstore"); write_patches
matches a naive NumPy slicing reference (edges, strides, overlaps, windows, Dask chunk
boundaries with chunks smaller than a patch), drops samples by ``where``, stacks channels; the
Dask path stays within a memory budget; to_grid inverts it."""

import itertools
import os
import textwrap

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT

xr = pytest.importorskip("xarray")
da = pytest.importorskip("dask.array")
import dask  # noqa: E402

import rowstore  # noqa: E402
from rowstore.xarray import open_dataset, to_grid, to_rowstore, write_patches  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads", num_workers=2):
        yield


def sample_ds(n=7):
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "t": (
                ("sample", "alt", "x"),
                rng.random((n, 3, 2)).astype("f4"),
                {"units": "K", "valid_range": np.array([0.0, 1.0]), "scale": np.float32(0.5)},
            ),
            "flag": (("x", "sample"), rng.random((2, n)) > 0.5),  # the sample dimension not first
            "label": ("sample", np.arange(n, dtype=np.int16)),
            "name": ("sample", np.array([f"s{i}" for i in range(n)])),
            "big": ("sample", np.arange(n, dtype=">i4")),
            "const": ("alt", np.arange(3.0)),
        },
        coords={
            "sample": np.arange(n) * 10,
            "time": (
                "sample",
                pd.date_range("2020-01-01", periods=n, freq="h").values.astype("M8[ns]"),
            ),
            "lead": ("sample", np.arange(n).astype("m8[s]")),
            "alt": ("alt", np.array([1.0, 2.0, 3.0]), {"units": "m"}),
            "station id": ("sample", np.arange(n) + 100),
        },  # not an identifier: a sanitized field name
        attrs={
            "title": "test",
            "scale": np.float32(2.5),
            "levels": np.arange(4),
            "nested": {"a": [1, 2]},
        },
    )
    ds.t.encoding = {
        "dtype": np.dtype("int16"),
        "scale_factor": 0.01,
        "_FillValue": np.int16(-999),
        "units": "K",
        "chunksizes": (1, 3, 2),
        "source": "/elsewhere.nc",
    }  # the last two mean nothing here: dropped
    return ds


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
    assert back.t.encoding == {
        "dtype": "int16",
        "scale_factor": 0.01,
        "_FillValue": np.int16(-999),
        "units": "K",
    }
    lazy = open_dataset(path, chunks={"sample": 3})
    assert lazy.t.chunks == ((3, 3, 1), (3,), (2,))
    assert_identical_dtypes(lazy.compute(), ds)
    with xr.open_dataset(path, engine="rowstore") as opened:
        assert_identical_dtypes(opened.load(), ds)
    with xr.open_dataset(
        path, engine="rowstore", chunks={"sample": 2}, drop_variables=["flag"]
    ) as opened:
        assert opened.t.chunks[0] == (2, 2, 2, 1)
        assert_identical_dtypes(opened.compute(), ds.drop_vars("flag"))
    assert_identical_dtypes(open_dataset(path, rows=[3, 1, 3]), ds.isel(sample=[3, 1, 3]))
    assert_identical_dtypes(
        open_dataset(path, rows=slice(1, 5), fields=["t"]), ds.isel(sample=slice(1, 5))[["t"]]
    )


def test_lazy_indexing_reads_what_is_asked(tmp_path):
    ds = sample_ds(20)
    to_rowstore(ds, str(tmp_path / "ds"))
    with xr.open_dataset(str(tmp_path / "ds"), engine="rowstore") as lazy:
        xr.testing.assert_identical(lazy.t[[5, 2], 1, ::-1].load(), ds.t[[5, 2], 1, ::-1])
        xr.testing.assert_identical(lazy.flag[:, 3:9:2].load(), ds.flag[:, 3:9:2])
        xr.testing.assert_identical(
            lazy.t.isel(sample=4, x=[1, 0]).load(), ds.t.isel(sample=4, x=[1, 0])
        )


def test_compute_false_and_malformed_metadata(tmp_path):
    import json

    import h5py

    ds = sample_ds()
    delayed = to_rowstore(ds.chunk(sample=4), str(tmp_path / "ds"), compute=False)
    assert not os.path.exists(tmp_path / "ds" / "rowstore.json")  # nothing until computed
    assert delayed.compute() == 1
    xr.testing.assert_identical(open_dataset(str(tmp_path / "ds")), ds)
    to_rowstore(ds, str(tmp_path / "a.h5"))
    with h5py.File(tmp_path / "a.h5", "r+") as f:
        user = json.loads(f["rowstore"].attrs["user_attrs"])
        user["xarray"]["variables"][0]["dims"] = 5
        f["rowstore"].attrs["user_attrs"] = json.dumps(user)
        f["rowstore"].attrs["format_version"] = 1  # a v1 file (h5py cut the footer): readable
        del f["rowstore"].attrs["has_footer"]
    with pytest.raises(rowstore.FormatError, match="malformed 'xarray' metadata"):
        open_dataset(str(tmp_path / "a.h5"))


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


# -- write_patches against a naive NumPy reference ---------------------------------------------
def grid_ds(T=5, A=3, Y=13, X=11, nan_at=None):
    rng = np.random.default_rng(2)
    t = rng.random((T, A, Y, X))
    if nan_at is not None:
        t[nan_at] = np.nan
    return xr.Dataset(
        {
            "t": (("time", "altitude", "lat", "lon"), t, {"units": "K"}),
            "sfc": (("time", "lat", "lon"), rng.random((T, Y, X)).astype("f4")),
            "land": (("lat", "lon"), rng.random((Y, X)) > 0.3),
        },  # no time: the same at every step
        coords={
            "time": pd.date_range("2020-01-01", periods=T, freq="6h").values.astype("M8[ns]"),
            "altitude": ("altitude", np.arange(A) * 100.0, {"units": "m"}),
            "lat": np.linspace(-10, 10, Y),
            "lon": np.arange(X) * 1.5,
        },
    )


def reference(ds, size, stride, kind, variables):
    """Every sample by plain slicing: {origin tuple: {variable: array}}, origins over the moving
    dims."""
    dims = [d for d in ds.dims if d in size]
    ranges = [range(0, ds.sizes[d] - size[d] + 1, stride[d]) for d in dims]
    out = {}
    for origin in itertools.product(*ranges):
        o = dict(zip(dims, origin))
        sample = {}
        for v in variables:
            var = ds[v]
            idx = tuple(
                o[d]
                if kind.get(d) == "over"
                else slice(o[d], o[d] + size[d])
                if d in size
                else slice(None)
                for d in var.dims
            )
            sample[v] = var.values[idx]
        for d in dims:
            c = ds[d].values
            sample[f"{d}_coord"] = c[o[d]] if kind[d] == "over" else c[o[d] : o[d] + size[d]]
        out[origin] = sample
    return dims, out


def read_all(path):
    with rowstore.open(path) as r:
        return r.take(np.arange(len(r)))


def check_against_reference(path, ds, size, stride, kind, variables):
    dims, ref = reference(ds, size, stride, kind, variables)
    b = read_all(path)
    got = list(zip(*[b[f"{d}_origin"] for d in dims]))
    assert sorted(got) == sorted(ref)  # every sample once, edges included, nothing else
    counts = [len(range(0, ds.sizes[d] - size[d] + 1, stride[d])) for d in dims]
    for i, origin in enumerate(got):
        want = ref[origin]
        for v in variables:
            np.testing.assert_array_equal(b[v][i], want[v], err_msg=f"{v} at {origin}")
        for d in dims:
            name = d if kind[d] == "over" else f"{d}_values"
            np.testing.assert_array_equal(b[name][i], want[f"{d}_coord"])
        assert b["sample_index"][i] == np.ravel_multi_index(
            [o // stride[d] for o, d in zip(origin, dims)], counts
        )
    return b


CASES = {
    "tiles": dict(patch={"lat": 5, "lon": 4}),  # 13 x 11: the far edges are not whole patches
    "overlap": dict(patch={"lat": 5, "lon": 4}, stride={"lat": 2, "lon": 3}),
    "window": dict(
        patch={"lat": 3, "lon": 3}, stride={"lat": 3, "lon": 5}, window={"time": 3}, stride_time=2
    ),
    "pairs": dict(patch={"lat": 9, "lon": 9}, stride={"lat": 4, "lon": 2}, window={"time": 2}),
}


def plan_of(case):
    c = dict(CASES[case])
    st = c.pop("stride_time", None)
    stride = dict(c.get("stride") or {})
    if st:
        stride["time"] = st
    c["stride"] = stride or None
    size = {**{"time": 1}, **c.get("window", {}), **c["patch"]}
    kind = {d: "patch" for d in c["patch"]}
    kind["time"] = "window" if "window" in c else "over"
    full_stride = {d: stride.get(d, size[d] if kind[d] == "patch" else 1) for d in size}
    return c, size, full_stride, kind


@pytest.mark.parametrize(
    "chunks, task_bytes",
    [
        (None, 30_000),  # numpy: regions of ~30 kB of samples along time
        ({"time": 2, "lat": 4, "lon": 3}, 1),  # chunks smaller than a patch, one task per chunk
        (
            {"time": 1, "lat": (3, 7, 3), "lon": 11},
            3_000,
        ),  # uneven chunks; time steps merged by 2 or so into tasks
    ],
    ids=["numpy", "dask-small-chunks", "dask-uneven-merged"],
)
@pytest.mark.parametrize("case", list(CASES))
def test_patches_match_numpy_slicing(tmp_path, case, chunks, task_bytes):
    ds = grid_ds()
    kwargs, size, stride, kind = plan_of(case)
    src = ds if chunks is None else ds.chunk(chunks)
    write_patches(
        src,
        str(tmp_path / "p"),
        keep=["altitude"],
        shard_bytes=30_000,
        task_bytes=task_bytes,
        **kwargs,
    )
    check_against_reference(str(tmp_path / "p"), ds, size, stride, kind, ["t", "sfc", "land"])
    back = open_dataset(str(tmp_path / "p"))  # a Dataset of samples
    assert back.sizes["sample"] == len(back.sample_index)
    assert back.t.dims == (
        "sample",
        *([] if kind["time"] == "over" else ["time"]),
        "altitude",
        "lat",
        "lon",
    )
    xr.testing.assert_identical(back.altitude, ds.altitude)


def test_tasks_follow_chunks_merged_along_the_first_dimension():
    from rowstore.xarray._plan import PatchPlan, task_regions

    ds = grid_ds().chunk({"time": 1, "lat": (3, 7, 3)})
    plan = PatchPlan(
        ds,
        patch={"lat": 5, "lon": 4},
        stride=None,
        window=None,
        sample_over=None,
        keep=("altitude",),
        variables=None,
        stack=None,
        channels="last",
        stack_name="s",
        dtype=None,
        sample_dim="sample",
    )
    one = task_regions(plan, dict(ds.chunks), 1)
    assert len(one) == 5 * 2 and {r[1]["time"] for r in one} == {
        1
    }  # lat chunk [10, 13) holds no origin
    assert [r[2]["lat"] for r in one[:2]] == [
        slice(0, 5),
        slice(5, 10),
    ]  # the halo: the chunk [0, 3) reads to 5
    merged = task_regions(plan, dict(ds.chunks), 3_000)
    assert (
        sorted({r[1]["time"] for r in merged}) == [1, 2]
        and sum(r[1]["time"] for r in merged) == 5 * 2
    )
    whole = task_regions(plan, dict(ds.chunks), 1 << 30)
    assert len(whole) == 2 and whole[0][2]["time"] == slice(0, 5)


def test_shuffle_is_global_and_seeded(tmp_path):
    ds = grid_ds().chunk({"time": 1})
    orders = {}
    for name, seed, shuffle in (("a", 0, True), ("b", 0, True), ("c", 1, True), ("d", 0, False)):
        write_patches(
            ds,
            str(tmp_path / name),
            patch={"lat": 3, "lon": 3},
            seed=seed,
            shuffle=shuffle,
            variables=["sfc"],
            task_bytes=1,
        )  # one task (and shard) per time step
        orders[name] = read_all(str(tmp_path / name))["sample_index"]
    assert np.array_equal(orders["a"], orders["b"])
    assert not np.array_equal(orders["a"], orders["c"])
    assert np.array_equal(
        orders["d"], np.arange(len(orders["d"]))
    )  # unshuffled: grid order, task by task
    assert sorted(orders["a"]) == list(orders["d"])
    # The global two-pass shuffle of the unshuffled samples, with the same seed: the same order.
    rowstore.shuffle(str(tmp_path / "d"), str(tmp_path / "e"), memory="8MiB", seed=0)
    assert np.array_equal(orders["a"], read_all(str(tmp_path / "e"))["sample_index"])
    assert (
        len(set(orders["a"][:12] // 12)) > 1
    )  # 12 patches per time step: the first 12 rows mix time steps
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c", "d", "e"]  # no temporaries left behind
    meta_a, meta_d = (rowstore.open(str(tmp_path / n)).layout.user_attrs["xarray"] for n in "ad")
    assert (
        meta_a.keys() == meta_d.keys() and meta_a["kind"] == meta_d["kind"] == "patches"
    )  # the metadata is kept


def test_where_drops_samples(tmp_path):
    ds = grid_ds(nan_at=(1, 0, 6, 2))
    write_patches(
        ds.chunk({"lat": 5}),
        str(tmp_path / "p"),
        patch={"lat": 3, "lon": 3},
        stride={"lat": 1, "lon": 1},
        where="notnull",
    )
    b = read_all(str(tmp_path / "p"))
    _, ref = reference(
        ds,
        {"time": 1, "lat": 3, "lon": 3},
        {"time": 1, "lat": 1, "lon": 1},
        {"time": "over", "lat": "patch", "lon": "patch"},
        ["t"],
    )
    keep = {o for o, s in ref.items() if not np.isnan(s["t"]).any()}
    assert len(keep) == len(ref) - 9  # one NaN lies in 3 x 3 overlapping patches
    assert set(zip(b["time_origin"], b["lat_origin"], b["lon_origin"])) == keep
    ds["land"] = (
        ("lat", "lon"),
        np.arange(13)[:, None] + np.zeros(11, int) < 7,
    )  # a land mask: the first 7 rows
    write_patches(
        ds,
        str(tmp_path / "q"),
        patch={"lat": 3, "lon": 3},
        where=lambda s: s["land"].all(axis=(1, 2)),
    )
    b = read_all(str(tmp_path / "q"))
    assert b["land"].all() and sorted(set(b["lat_origin"])) == [0, 3]
    assert len(b["land"]) == 5 * 2 * 3  # times x lat origins 0, 3 x lon origins 0, 3, 6
    with pytest.raises(ValueError, match="one bool per sample"):
        write_patches(ds, str(tmp_path / "r"), patch={"lat": 3, "lon": 3}, where=lambda s: [True])


def test_bad_plans_name_the_dimension(tmp_path):
    ds = grid_ds()
    with pytest.raises(rowstore.SchemaError, match="'altitude' is in none of"):
        write_patches(ds, str(tmp_path / "p"), patch={"lat": 3, "lon": 3}, keep=())
    with pytest.raises(rowstore.SchemaError, match="'height' is not a dimension"):
        write_patches(ds, str(tmp_path / "p"), patch={"height": 3})
    with pytest.raises(rowstore.SchemaError, match="both patch and sample_over"):
        write_patches(
            ds, str(tmp_path / "p"), patch={"lat": 3, "lon": 3, "time": 2}, sample_over=["time"]
        )
    # A patch (or window) larger than the grid: no whole one fits, which would commit 0 rows.
    with pytest.raises(
        ValueError, match="patch dimension 'lat': size 14 is larger than the grid's 13"
    ):
        write_patches(ds, str(tmp_path / "p"), patch={"lat": 14, "lon": 3})
    with pytest.raises(
        ValueError, match="window dimension 'time': size 6 is larger than the grid's 5"
    ):
        write_patches(ds, str(tmp_path / "p"), patch={"lat": 3, "lon": 3}, window={"time": 6})
    assert not os.path.exists(tmp_path / "p")


@pytest.mark.parametrize("channels", ["last", "first"])
def test_channel_stacking_and_stats(tmp_path, channels):
    ds = grid_ds()
    write_patches(
        ds.chunk({"time": 2, "lat": 6}),
        str(tmp_path / "p"),
        patch={"lat": 5, "lon": 4},
        stack=["t", "sfc"],
        channels=channels,
        dtype="float32",
        stack_name="x",
    )
    b = read_all(str(tmp_path / "p"))
    assert set(b) >= {"x", "land"} and "t" not in b and "sfc" not in b
    assert b["x"].dtype == np.float32 and b["land"].dtype == bool
    _, ref = reference(
        ds,
        {"time": 1, "lat": 5, "lon": 4},
        {"time": 1, "lat": 5, "lon": 4},
        {"time": "over", "lat": "patch", "lon": "patch"},
        ["t", "sfc"],
    )
    want_all = []
    for i, o in enumerate(zip(b["time_origin"], b["lat_origin"], b["lon_origin"])):
        s = ref[o]
        want = np.concatenate([s["t"], s["sfc"][None]], axis=0).astype(
            np.float32
        )  # (C = 3 + 1, lat, lon)
        want = want if channels == "first" else np.moveaxis(want, 0, -1)
        np.testing.assert_array_equal(b["x"][i], want)
        want_all.append(want)
    meta = rowstore.open(str(tmp_path / "p")).layout.user_attrs["xarray"]["patches"]
    st = meta["stack"]
    assert st["layout"] == channels and st["num_channels"] == 4
    assert st["channels"]["t"] == {"start": 0, "stop": 3, "dims": ["altitude"]}
    allx = np.stack(want_all).astype(np.float64)
    caxis = 1 if channels == "first" else 3
    per_channel = np.moveaxis(allx, caxis, -1).reshape(-1, 4)
    np.testing.assert_allclose(meta["stats"]["x"]["mean"], per_channel.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(meta["stats"]["x"]["std"], per_channel.std(axis=0), rtol=1e-8)
    t_values = np.stack([ref[o]["t"] for o in ref]).astype(np.float32).astype(np.float64)
    assert meta["stats"]["t"]["count"] == t_values.size
    np.testing.assert_allclose(meta["stats"]["t"]["mean"], t_values.mean(), rtol=1e-10)
    np.testing.assert_allclose(meta["stats"]["t"]["std"], t_values.std(), rtol=1e-8)
    back = open_dataset(str(tmp_path / "p"))
    assert back.x.dims == (
        ("sample", "channel", "lat", "lon")
        if channels == "first"
        else ("sample", "lat", "lon", "channel")
    )


def test_stats_ignore_nan_and_compute_false(tmp_path):
    ds = grid_ds(nan_at=(0, 1, 2, 3))
    delayed = write_patches(
        ds.chunk({"time": 2}),
        str(tmp_path / "p"),
        patch={"lat": 13, "lon": 11},
        variables=["t"],
        compute=False,
    )
    assert not os.path.exists(tmp_path / "p" / "rowstore.json")
    delayed.compute()
    st = rowstore.open(str(tmp_path / "p")).layout.user_attrs["xarray"]["patches"]["stats"]["t"]
    assert (
        st["count"] == ds.t.size - 1
    )  # one patch per time step covers the grid: every value but the NaN
    np.testing.assert_allclose(
        [st["mean"], st["std"]], [float(ds.t.mean()), float(ds.t.std())], rtol=1e-12
    )


def test_stacking_flattens_window_steps_into_channels(tmp_path):
    ds = grid_ds()
    write_patches(
        ds.chunk({"lat": 7}),
        str(tmp_path / "p"),
        patch={"lat": 5, "lon": 4},
        window={"time": 2},
        stack=True,
        variables=["t", "sfc"],
        channels="last",
    )
    b = read_all(str(tmp_path / "p"))
    assert b["stack"].shape[1:] == (5, 4, 2 * 3 + 2) and b["stack"].dtype == np.float64
    _, ref = reference(
        ds,
        {"time": 2, "lat": 5, "lon": 4},
        {"time": 1, "lat": 5, "lon": 4},
        {"time": "window", "lat": "patch", "lon": "patch"},
        ["t", "sfc"],
    )
    for i, o in enumerate(zip(b["time_origin"], b["lat_origin"], b["lon_origin"])):
        want = np.concatenate(
            [ref[o]["t"].reshape(6, 5, 4), ref[o]["sfc"]], axis=0
        )  # (time, altitude) flattened
        np.testing.assert_array_equal(b["stack"][i], np.moveaxis(want, 0, -1))
    meta = rowstore.open(str(tmp_path / "p")).layout.user_attrs["xarray"]["patches"]["stack"]
    assert (
        meta["channels"]["t"]["dims"] == ["time", "altitude"]
        and meta["channels"]["sfc"]["start"] == 6
    )


@pytest.mark.xdist_group("dask")
def test_distributed_cluster_writes_the_same_samples(tmp_path, dask_cluster):
    distributed = pytest.importorskip("distributed")
    ds = grid_ds().chunk({"time": 2, "lat": 6})
    with distributed.Client(
        dask_cluster
    ):  # the global shuffle then runs on the cluster too (rowstore.dask.shuffle)
        write_patches(
            ds, str(tmp_path / "p"), patch={"lat": 5, "lon": 4}, stride={"lat": 2, "lon": 3}
        )
        to_rowstore(sample_ds().chunk(sample=3), str(tmp_path / "r"))
    check_against_reference(
        str(tmp_path / "p"),
        grid_ds(),
        {"time": 1, "lat": 5, "lon": 4},
        {"time": 1, "lat": 2, "lon": 3},
        {"time": "over", "lat": "patch", "lon": "patch"},
        ["t", "sfc", "land"],
    )
    xr.testing.assert_identical(open_dataset(str(tmp_path / "r")), sample_ds())


@pytest.mark.parametrize("channels", [(5, 4), (1, 3, 8), (6,)])
def test_concat_channels_both_strategies(channels):
    from rowstore.xarray._cut import concat_channels

    rng = np.random.default_rng(0)
    pieces = [rng.random((7, c, 3, 2)) for c in channels]
    first = concat_channels(pieces, "first", np.float32)
    last = concat_channels(pieces, "last", np.float32)  # direct when every piece has >= 4 channels
    want = np.concatenate(pieces, axis=1).astype(np.float32)
    np.testing.assert_array_equal(first, want)
    np.testing.assert_array_equal(last, np.moveaxis(want, 1, -1))
    assert last.flags.c_contiguous and last.dtype == np.float32


# -- to_grid
# -----------------------------------------------------------------------------------------
def test_to_grid_inverts_tiles_exactly(tmp_path):
    ds = grid_ds()
    write_patches(
        ds.chunk({"lat": 4}), str(tmp_path / "p"), patch={"lat": 4, "lon": 5}, variables=["sfc"]
    )
    b = read_all(str(tmp_path / "p"))
    g = to_grid(b["sfc"], str(tmp_path / "p"), like=ds)
    covered = dict(lat=slice(0, 12), lon=slice(0, 10))
    xr.testing.assert_identical(
        g.prediction.isel(covered).drop_vars(list(g.coords)),
        ds.sfc.isel(covered).rename("prediction").drop_vars(list(ds.sfc.coords)),
    )
    assert g.prediction.dtype == np.float32
    assert (
        g.prediction.isel(lat=12).isnull().all()
        and g.prediction.isel(lon=slice(10, None)).isnull().all()
    )
    xr.testing.assert_identical(g.time, ds.time)
    with xr.open_dataset(
        str(tmp_path / "p"), engine="rowstore"
    ) as lazy:  # patch datasets open as Datasets too
        xr.testing.assert_identical(lazy.load(), open_dataset(str(tmp_path / "p")))
    alone = to_grid({"p": b["sfc"]}, str(tmp_path / "p"))  # coordinates from the stored metadata
    xr.testing.assert_identical(alone.p.rename("prediction"), g.prediction)
    with pytest.raises(rowstore.SchemaError, match="'lat' differs"):
        to_grid(b["sfc"], str(tmp_path / "p"), like=ds.assign_coords(lat=ds.lat + 1))
    with pytest.raises(ValueError, match="expected \\(4, 5\\)"):
        to_grid(b["sfc"][:, :2], str(tmp_path / "p"))


def test_to_grid_averages_overlaps_and_places_scalars(tmp_path):
    ds = grid_ds(T=2, Y=8, X=7)
    write_patches(
        ds,
        str(tmp_path / "p"),
        patch={"lat": 3, "lon": 3},
        stride={"lat": 2, "lon": 1},
        variables=["sfc"],
        window={"time": 2},
    )
    b = read_all(str(tmp_path / "p"))
    n = len(b["sfc"])
    values = np.arange(n, dtype=np.float64)[:, None, None, None] + np.zeros((1, 2, 3, 3))
    total, count = np.zeros((2, 8, 7)), np.zeros((2, 8, 7))
    for i in range(n):
        t, y, x = b["time_origin"][i], b["lat_origin"][i], b["lon_origin"][i]
        total[t : t + 2, y : y + 3, x : x + 3] += values[i]
        count[t : t + 2, y : y + 3, x : x + 3] += 1
    g = to_grid(values, str(tmp_path / "p"), like=ds)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(
            g.prediction.values, total / count
        )  # NaN where count == 0 (the last lat row)
    assert np.isnan(g.prediction.values[:, 7]).all() and count.max() > 1
    s = to_grid(
        np.arange(n, dtype=np.float32), str(tmp_path / "p"), rows=slice(None)
    )  # one value per sample: its centre
    want = np.full((2, 8, 7), np.nan, np.float32)
    for i in range(n):
        want[b["time_origin"][i] + 1, b["lat_origin"][i] + 1, b["lon_origin"][i] + 1] = i
    np.testing.assert_array_equal(s.prediction.values, want)
    last = to_grid(
        values[:, 0], str(tmp_path / "p"), window_step=-1
    )  # patch-shaped, at the window's last step
    total, count = np.zeros((2, 8, 7)), np.zeros((2, 8, 7))
    for i in range(n):
        t, y, x = b["time_origin"][i] + 1, b["lat_origin"][i], b["lon_origin"][i]
        total[t, y : y + 3, x : x + 3] += values[i, 0]
        count[t, y : y + 3, x : x + 3] += 1
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(last.prediction.values, total / count)
    assert np.isnan(last.prediction.values[0]).all()  # time 0 is never a pair's last step
    part = to_grid(values[:3], str(tmp_path / "p"), rows=[0, 1, 2])
    assert np.isfinite(part.prediction.values).sum() <= 3 * 18


# -- memory: the Dask path never materializes the whole array
# ------------------------------------------
def test_dask_input_larger_than_memory_budget_is_streamed(tmp_path, rs):
    """A lazily generated 384 MiB input (8 MiB chunks) cut into patches: peak RSS must stay far
    below the input size (generous bound: half of it, 192 MiB, above the interpreter's baseline,
    against 56-75 MiB measured with 2 threads and the default task_bytes of 8 MiB, 105-117 MiB
    with task_bytes of 16 MiB)."""
    code = textwrap.dedent("""
        import resource, sys
        import dask, dask.array as da, numpy as np, xarray as xr
        from rowstore.xarray import write_patches
        import rowstore
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        T, A, Y, X = 48, 8, 256, 512  # float64: 384 MiB
        data = da.random.default_rng(0).random((T, A, Y, X), chunks=(1, A, 128, X))  # 8 MiB chunks
        ds = xr.Dataset({"t": (("time", "altitude", "lat", "lon"), data)},
                        coords={"time": np.arange(T), "lat": np.arange(Y), "lon": np.arange(X)})
        with dask.config.set(scheduler="threads", num_workers=2):
            write_patches(ds, sys.argv[1], patch={"lat": 16, "lon": 16}, stride={"lat": 32, "lon":
            32}, shard_bytes=4 << 20)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(len(rowstore.open(sys.argv[1])), base // 1024, peak // 1024)
    """)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    out = rs.run_python(
        code, str(tmp_path / "p"), timeout=300, env={**os.environ, "PYTHONPATH": path}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows, base_mb, peak_mb = map(int, out.stdout.split())
    assert rows == 48 * 8 * 16  # every patch written
    assert peak_mb - base_mb < 192, (base_mb, peak_mb)
