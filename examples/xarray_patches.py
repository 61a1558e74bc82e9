"""Weather-like grid -> 9x9 patches with all altitudes -> rowstore -> torch -> predictions back on
the grid.

1. A synthetic Dataset (time x altitude x lat x lon; temperature, u, v on levels, precipitation
   at the surface), Dask-chunked like an archive on disk.
2. ``write_patches``: 9x9 patches (tiles) at every time step, all altitudes stacked channel-first
   (float32, with per-channel mean/std in the metadata), precipitation as the target; chunk by
   chunk on the Dask scheduler, shards written in parallel, then shuffled globally
   (rowstore.shuffle).
3. A small convolutional network trained for a few steps from ``rowstore.torch.BatchedDataLoader``.
4. ``to_grid``: its predictions for every patch put back on the grid, and a PNG of one time step.

Run: python examples/xarray_patches.py [DIR]     (CPU; a few seconds)
"""

import os
import sys
import tempfile

import dask
import matplotlib
import numpy as np
import pandas as pd
import torch
import xarray as xr

import rowstore
import rowstore.torch as rst
from rowstore.xarray import open_dataset, to_grid, write_patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def weather(T=24, A=6, Y=36, X=45) -> xr.Dataset:
    """Smooth fields over (time, altitude, lat, lon); precipitation depends on them locally."""
    rng = np.random.default_rng(0)
    t, a = np.arange(T)[:, None, None, None], np.arange(A)[None, :, None, None]
    y, x = np.arange(Y)[None, None, :, None], np.arange(X)[None, None, None, :]
    temp = 288 - 6.5 * a + 5 * np.sin(2 * np.pi * (x / X + t / T)) * np.cos(np.pi * y / Y)
    u = 10 * np.cos(2 * np.pi * (y / Y - t / (2 * T))) * (1 + a / A) + np.zeros_like(temp)
    v = 5 * np.sin(2 * np.pi * x / X + a) + np.zeros_like(temp)
    temp = temp + rng.normal(0, 0.3, temp.shape)
    precip = np.maximum(0, (temp[:, 0] - 285) * 0.4 + 0.05 * u[:, 2] - 0.1 * v[:, 1])
    ds = xr.Dataset(
        {
            "temperature": (("time", "altitude", "lat", "lon"), temp, {"units": "K"}),
            "u": (("time", "altitude", "lat", "lon"), u, {"units": "m s-1"}),
            "v": (("time", "altitude", "lat", "lon"), v, {"units": "m s-1"}),
            "precip": (("time", "lat", "lon"), precip, {"units": "mm h-1"}),
        },
        coords={
            "time": pd.date_range("2026-01-01", periods=T, freq="h").values.astype("M8[ns]"),
            "altitude": ("altitude", np.arange(A) * 1000.0, {"units": "m"}),
            "lat": ("lat", np.linspace(40, 57.5, Y), {"units": "degrees_north"}),
            "lon": ("lon", np.linspace(-10, 12, X), {"units": "degrees_east"}),
        },
        attrs={
            "title": "synthetic weather",
            "levels_hpa": np.array([1000, 900, 800, 700, 600, 500], np.int16),
        },
    )
    return ds.chunk({"time": 6, "lat": 18})  # as an archive on disk would be chunked


def main(root: str) -> None:
    ds = weather()
    path = os.path.join(root, "patches")
    with dask.config.set(scheduler="threads", num_workers=2):
        write_patches(
            ds,
            path,
            patch={"lat": 9, "lon": 9},
            keep=["altitude"],
            stack=["temperature", "u", "v"],
            channels="first",
            dtype="float32",
            stack_name="x",
            seed=0,
            shard_bytes=1 << 20,
        )
    with rowstore.open(path) as r:
        meta = r.layout.user_attrs["xarray"]["patches"]
        print(f"{len(r)} patches in {r.layout.num_shards} shards; fields {r.schema.names}")
        print(f"x: {r.schema['x'].shape} channel-first, {meta['stack']['num_channels']} channels")
    mean = torch.tensor(meta["stats"]["x"]["mean"], dtype=torch.float32)[:, None, None]
    std = torch.tensor(meta["stats"]["x"]["std"], dtype=torch.float32)[:, None, None] + 1e-6
    print(f"normalization from the metadata: temperature level 0 mean {float(mean[0]):.1f} K")

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(18, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 1, 1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    with rst.BatchedDataLoader(
        path, batch_size=32, shuffle="block", seed=0, fields=["x", "precip"]
    ) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                pred = model((batch["x"] - mean) / std)[:, 0]
                loss = torch.nn.functional.mse_loss(pred, batch["precip"].float())
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
    print(f"trained {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    # Predict every stored patch (in row order), then back onto the grid.
    with rowstore.open(path) as r, torch.no_grad():
        x = torch.from_numpy(r.take(np.arange(len(r)), fields=["x"])["x"])
        preds = model((x - mean) / std)[:, 0].numpy()
    grid = to_grid({"precip_pred": preds}, path, like=ds)
    truth = ds.precip.compute()
    covered = grid.precip_pred.notnull()
    rmse = float(np.sqrt(((grid.precip_pred - truth) ** 2).where(covered).mean()))
    print(
        f"to_grid: {dict(grid.sizes)}, {int(covered.sum())} of {covered.size} points covered, rmse "
        f"{rmse:.3f}"
    )
    samples = open_dataset(path, rows=slice(0, 4), fields=["precip"])
    print(
        f"open_dataset: {dict(samples.sizes)}, first sample at {str(samples.time.values[0])[:16]}"
    )

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, field, title in (
        (axes[0], truth, "precipitation"),
        (axes[1], grid.precip_pred, "predicted (to_grid)"),
    ):
        field.isel(time=12).plot(ax=ax, vmin=0, vmax=float(truth.max()), cmap="Blues")
        ax.set_title(title)
    png = os.path.join(root, "xarray_patches.png")
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    print(f"wrote {png} ({os.path.getsize(png)} bytes)")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
