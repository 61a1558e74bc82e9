"""Weather patches made by Ray tasks, written as a sharded rowstore dataset, fed back to torch.

A local Ray cluster (2 CPUs) generates the rows in its tasks (``ray.data.range`` then
``map_batches``: each row a ``float32[9,9,27]`` patch, an ``int64[9,27]`` mask, a variable-length
list of station ids and a region name); :func:`rowstore.ray.to_rowstore` writes each block on
the worker that made it (one shard per block) and the driver commits them as one version. A
second write appends a version. :func:`rowstore.ray.read_rowstore` reads it back as a Ray
dataset (one read task per shard, ndarray cells as tensor columns), which a torch model trains
from with ``iter_torch_batches``.

    python examples/ray_ingest.py [OUT_DIR]
"""

import os
import sys
import tempfile
import time

import numpy as np
import ray
import torch

import rowstore
from rowstore.ray import read_rowstore, to_rowstore

BLOCKS = 6
ROWS = 40  # per block
REGIONS = ["alps", "andes", "atlas", "urals"]


def make_rows(batch: dict) -> dict:
    """The rows of ``batch["id"]``, made in a Ray task (seeded by the first id)."""
    ids = batch["id"]
    rng = np.random.default_rng(int(ids[0]))
    n = len(ids)
    stations = np.empty(n, dtype=object)  # one ndarray per cell, of varying length
    stations[:] = [rng.integers(0, 500, 1 + int(i) % 5) for i in ids]
    return {
        "id": ids,
        "patch": rng.standard_normal((n, 9, 9, 27)).astype(np.float32),
        "mask": rng.integers(0, 2, (n, 9, 27)),
        "stations": stations,
        "region": np.array([REGIONS[int(i) % 4] for i in ids], dtype=object),
        "target": (ids % 10).astype(np.float32),
    }


def main(out_dir: str) -> None:
    path = os.path.join(out_dir, "patches")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, address="local")
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        ds = ray.data.range(BLOCKS * ROWS, override_num_blocks=BLOCKS).map_batches(make_rows)
        t = time.perf_counter()
        version = to_rowstore(ds, path)
        print(f"wrote {BLOCKS} blocks as version {version} in {time.perf_counter() - t:.1f} s")
        start = BLOCKS * ROWS  # ids go on from the first write's
        more = ray.data.range(ROWS, override_num_blocks=2).map_batches(
            lambda b: make_rows({"id": b["id"] + start})
        )
        print(f"appended version {to_rowstore(more, path, mode='a')}")

        with rowstore.open(path) as r:
            print(f"{len(r)} rows in {r.layout.num_shards} shards")
            s = r.schema
            print(f"stations: {s['stations'].dtype}{list(s['stations'].shape)}, ", end="")
            print(f"patch: {s['patch'].dtype}{list(s['patch'].shape)}")

        back = read_rowstore(path)
        print(f"read_rowstore: {back.count()} rows")
        first = back.take(1)[0]
        print(f"first row: id {first['id']}, region {first['region']}, ", end="")
        print(f"{len(first['stations'])} stations")

        # torch: the fixed-shape fields as tensors, batch by batch
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(9 * 9 * 27, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        steps, seen = 0, []
        train = read_rowstore(path, fields=["id", "patch", "target"])
        for batch in train.iter_torch_batches(batch_size=32):
            loss = torch.nn.functional.mse_loss(model(batch["patch"]).squeeze(1), batch["target"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            seen += batch["id"].tolist()
        in_order = seen == list(range(len(seen)))
        print(f"trained {steps} steps over {len(seen)} rows (in the stored order: {in_order})")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
