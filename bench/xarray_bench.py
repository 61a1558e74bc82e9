"""``write_patches`` on a Dask-backed grid against the alternatives users write today.

    python bench/xarray_bench.py [--time 32] [--repeats 3] [--dir DIR] [--out
    bench/results/xarray_bench.json]

The grid: three float32 variables over (time, altitude=8, lat=144, lon=288), generated lazily by
``dask.array.random`` in chunks of one time step (1.3 MB per variable and step; 127 MB in all at
the default 32 steps): several times the memory any one task needs, never materialized whole.
Samples: 9x9 tiles at every time step with all altitudes (16 x 32 per step, 7.8 KB each).

Write side (each run in a fresh subprocess: wall time, samples/s, MB/s of sample bytes, peak RSS):

* ``rowstore``: :func:`rowstore.xarray.write_patches` (one task per input chunk, shards written
  on the threaded scheduler with 2 workers, then globally shuffled by ``rowstore.shuffle``
  through 256 MiB, origins and coordinates stored); ``rowstore_unshuffled``: the same with
  ``shuffle=False`` (the cost of the global shuffle is the difference);
* ``xbatcher``: the hand-written alternative: ``xbatcher.BatchGenerator(ds, input_dims={altitude:
  8, lat: 9, lon: 9}, batch_dims={time: 1}, concat_input_dims=True)``, each batch loaded and
  written with ``DatasetWriter.write_batch`` (one process, in grid order: no shuffle); on
  ``XBATCHER_TIME`` = 2 time steps only (it takes ~15 ms per patch), so its rates count;
* ``zarr``: ``to_zarr`` of the same samples built with xarray (``coarsen(...).construct`` then
  ``stack(sample=...)``, chunks of 512 samples; the Dask threaded scheduler, 2 workers).

Read side (warm page cache): batches of 256 samples of the three variables in a shuffled order,
from the rowstore dataset (``Reader.batches(shuffle="block")``) and from the Zarr store with
``xarray.open_zarr(...).isel(sample=idx)`` per batch (random ``idx``, the approach pangeo users
try first; 20 batches).

Channel stacking: 4,096 samples of 24 channels, channel-first ``(n, 24, 9, 9)``
(``np.concatenate(axis=1)``) vs channel-last ``(n, 9, 9, 24)`` in C order (``moveaxis`` then
``np.concatenate(axis=-1, out=...)``, or channel-first then one transpose copy, and what
``write_patches`` picks), median of 15, from three variables of 8 levels ``(n, 8, 9, 9)`` and
from 24 single-level variables ``(n, 1, 9, 9)``.

Medians of ``--repeats`` runs after a warm-up of each. The machine is shared: ratios within the
run matter, absolute figures less.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

A, Y, X, P = 8, 144, 288, 9
VARS = ("temperature", "u", "v")
#: xbatcher builds every patch with an ``isel`` and a ``concat`` (about 15 ms a patch here), so
#: it runs on this many time steps only; its rates are per sample all the same.
XBATCHER_TIME = 2


def grid(T: int):
    import dask.array as da
    import xarray as xr

    rng = da.random.default_rng(0)
    data = {
        v: (
            ("time", "altitude", "lat", "lon"),
            rng.random((T, A, Y, X), dtype=np.float32, chunks=(1, A, Y, X)),
        )
        for v in VARS
    }
    return xr.Dataset(
        data,
        coords={
            "time": np.arange(T).astype("M8[h]").astype("M8[ns]"),
            "altitude": np.arange(A) * 1000.0,
            "lat": np.linspace(-60, 60, Y),
            "lon": np.linspace(0, 359, X),
        },
    )


def write_rowstore(ds, path, shuffle=True):
    from rowstore.xarray import write_patches

    write_patches(
        ds,
        path,
        patch={"lat": P, "lon": P},
        keep=["altitude"],
        shard_bytes=32 << 20,
        shuffle=shuffle,
        memory="256MiB",
    )


def write_rowstore_unshuffled(ds, path):
    write_rowstore(ds, path, shuffle=False)


def write_xbatcher(ds, path):
    import xbatcher

    import rowstore

    bg = xbatcher.BatchGenerator(
        ds,
        input_dims={"altitude": A, "lat": P, "lon": P},
        batch_dims={"time": 1},
        concat_input_dims=True,
    )
    schema = rowstore.Schema(
        [rowstore.Field(v, "float32", (A, P, P)) for v in VARS]
        + [
            rowstore.Field("lat", "float64", (P,)),
            rowstore.Field("lon", "float64", (P,)),
            rowstore.Field("time", "datetime64[ns]"),
        ]
    )
    with rowstore.DatasetWriter(path, schema, shard_bytes=32 << 20) as w:
        for b in bg:
            cols = {
                v: b[v].transpose("sample", "altitude_input", "lat_input", "lon_input").values
                for v in VARS
            }
            cols["lat"] = b["lat"].transpose("sample", "lat_input").values
            cols["lon"] = b["lon"].transpose("sample", "lon_input").values
            cols["time"] = b["time"].values
            w.write_batch(cols)


def write_zarr(ds, path):
    s = ds.coarsen(lat=P, lon=P).construct(lat=("lat_tile", "lat_in"), lon=("lon_tile", "lon_in"))
    s = (
        s.stack(sample=("time", "lat_tile", "lon_tile"))
        .transpose("sample", ...)
        .reset_index("sample")
    )
    s = s.drop_vars([c for c in s.coords if c not in ("altitude",)])
    s.chunk({"sample": 512}).to_zarr(path, mode="w", consolidated=True)


def child(method: str, T: int, path: str) -> None:
    """One write in this process; prints JSON (seconds, peak RSS)."""
    import resource

    import dask
    import xbatcher  # noqa: F401  (imported before the clock starts, like everything the writers use)
    import zarr  # noqa: F401

    import rowstore.xarray  # noqa: F401

    ds = grid(XBATCHER_TIME if method == "xbatcher" else T)
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=2):
        {
            "rowstore": write_rowstore,
            "rowstore_unshuffled": write_rowstore_unshuffled,
            "xbatcher": write_xbatcher,
            "zarr": write_zarr,
        }[method](ds, path)
    dt = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": dt,
                "samples": ds.sizes["time"] * (Y // P) * (X // P),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_child(method: str, T: int, path: str) -> dict:
    shutil.rmtree(path, ignore_errors=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    }
    out = subprocess.run(
        [sys.executable, __file__, "--child", method, "--time", str(T), "--dir", path],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"{method} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_side(root: str, T: int) -> dict:
    import xarray as xr

    import rowstore

    n = T * (Y // P) * (X // P)
    res = {}
    with rowstore.open(os.path.join(root, "rowstore")) as r:
        times = []
        for epoch in range(3):
            t0 = time.perf_counter()
            got = sum(
                len(b["temperature"])
                for b in r.batches(256, shuffle="block", seed=0, epoch=epoch, fields=list(VARS))
            )
            times.append(time.perf_counter() - t0)
        res["rowstore_samples_s"] = got / statistics.median(times)
    z = xr.open_zarr(os.path.join(root, "zarr"))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(20):
        idx = np.sort(rng.choice(n, 256, replace=False))
        z[list(VARS)].isel(sample=idx).load()
    res["zarr_isel_samples_s"] = 20 * 256 / (time.perf_counter() - t0)
    res["ratio"] = res["rowstore_samples_s"] / res["zarr_isel_samples_s"]
    return res


def _stack_case(parts: list, repeats: int) -> dict:
    from rowstore.xarray._cut import concat_channels

    first, last, via, used = [], [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.concatenate(parts, axis=1)
        first.append(time.perf_counter() - t0)
        t0 = (
            time.perf_counter()
        )  # into a C-order (n, 9, 9, C) array: concatenate alone keeps the pieces' layout
        out = np.empty((len(parts[0]), P, P, sum(p.shape[1] for p in parts)), np.float32)
        np.concatenate([np.moveaxis(p, 1, -1) for p in parts], axis=-1, out=out)
        last.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.ascontiguousarray(np.moveaxis(np.concatenate(parts, axis=1), 1, -1))
        via.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        concat_channels(parts, "last", np.float32)
        used.append(time.perf_counter() - t0)
    f, la, v, u = (statistics.median(x) for x in (first, last, via, used))
    return {
        "shape": list(parts[0].shape),
        "pieces": len(parts),
        "mb": sum(p.nbytes for p in parts) / 1e6,
        "channel_first_ms": f * 1e3,
        "channel_last_direct_ms": la * 1e3,
        "channel_last_via_first_ms": v * 1e3,
        "write_patches_channel_last_ms": u * 1e3,
        "write_patches_last_over_first": u / f,
    }


def stacking(n: int = 4096, repeats: int = 15) -> dict:
    """Two cases: 3 variables of 8 levels (8 channels each), and 24 single-level variables."""
    rng = np.random.default_rng(0)
    levels = [rng.random((n, A, P, P), dtype=np.float32) for _ in VARS]
    single = [rng.random((n, 1, P, P), dtype=np.float32) for _ in range(len(VARS) * A)]
    return {
        "samples": n,
        "levels": _stack_case(levels, repeats),
        "single_level": _stack_case(single, repeats),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "xarray_bench.json"))
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.time, a.dir)
    T = a.time
    samples = T * (Y // P) * (X // P)
    sample_mb = samples * len(VARS) * A * P * P * 4 / 1e6
    root = a.dir or tempfile.mkdtemp(prefix="xarray_bench_")
    methods = ("rowstore", "rowstore_unshuffled", "xbatcher", "zarr")
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    try:
        for m in methods:  # warm-up
            run_child(m, T, os.path.join(root, m))
        for _ in range(a.repeats):
            for m in methods:
                runs[m].append(run_child(m, T, os.path.join(root, m)))
        write = {}
        for m in methods:
            s = statistics.median(r["seconds"] for r in runs[m])
            n = runs[m][0]["samples"]
            write[m] = {
                "seconds": s,
                "samples": n,
                "samples_s": n / s,
                "mb_s": sample_mb * n / samples / s,
                "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs[m]),
                "runs": [r["seconds"] for r in runs[m]],
            }
        for m in methods:
            write[m]["rate_vs_rowstore"] = write[m]["samples_s"] / write["rowstore"]["samples_s"]
        result = {
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
            },
            "grid": {
                "time": T,
                "altitude": A,
                "lat": Y,
                "lon": X,
                "variables": len(VARS),
                "dtype": "float32",
                "input_mb": T * A * Y * X * 4 * len(VARS) / 1e6,
                "chunk_mb": A * Y * X * 4 / 1e6,
            },
            "samples": samples,
            "sample_mb": sample_mb,
            "repeats": a.repeats,
            "write": write,
            "read": read_side(root, T),
            "stacking": stacking(),
        }
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=1))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
