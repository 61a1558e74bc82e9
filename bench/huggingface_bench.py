"""``rowstore.from_huggingface`` / ``to_huggingface`` against same-run baselines.

    python bench/huggingface_bench.py [--rows 2000] [--images 2000] [--repeats 5] [--dir DIR]
                                      [--out bench/results/huggingface_bench.json]

Two datasets are built locally and saved with ``save_to_disk`` (read back memory-mapped):

* ``vectors``: a float32 ``List(length=1024)`` column, an ``Array2D((None, 16))`` column of 1..64
  rows and a ``ClassLabel``; timed as ``from_huggingface`` against ``rowstore.from_arrow`` of the
  same Arrow table (extension arrays given as their storage) and the same schema, with
  ``batch_rows`` 1024 for both: the cost of the features layer;
* ``images``: 128x128 RGB PNG ``Image`` column and a ``ClassLabel``; timed as
  ``from_huggingface`` storing the bytes as they are, against ``decode_images=True`` (each image
  decoded as ``datasets`` does), and ``to_huggingface`` of the stored bytes (``cache_dir``).

Each case runs once to warm up, then ``--repeats`` times alternating; the report gives each
one's median wall time, rows/s and the ratios within this run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import datasets  # noqa: E402
import imagecodecs  # noqa: E402
import pyarrow as pa  # noqa: E402

import rowstore  # noqa: E402
from rowstore.huggingface import from_huggingface, infer_schema, to_huggingface  # noqa: E402


def vectors(n: int, root: str) -> datasets.Dataset:
    rng = np.random.default_rng(0)
    f = datasets.Features(
        {
            "emb": datasets.List(datasets.Value("float32"), length=1024),
            "frames": datasets.Array2D((None, 16), "float32"),
            "label": datasets.ClassLabel(num_classes=10),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "emb": rng.standard_normal((n, 1024), dtype=np.float32),
            "frames": [rng.standard_normal((1 + k % 64, 16)).astype(np.float32) for k in range(n)],
            "label": rng.integers(0, 10, n),
        },
        features=f,
    )
    ds.save_to_disk(os.path.join(root, "vectors"))
    return datasets.load_from_disk(os.path.join(root, "vectors"))


def images(n: int, root: str) -> datasets.Dataset:
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[:128, :128]
    base = np.stack([(yy + xx) % 256, (yy * 2) % 256, (xx * 3) % 256], -1).astype(np.uint8)
    blobs = [
        imagecodecs.png_encode(base + rng.integers(0, 8, base.shape, dtype=np.uint8), level=6)
        for _ in range(n)
    ]
    f = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in blobs], "label": rng.integers(0, 10, n)},
        features=f,
    )
    ds.save_to_disk(os.path.join(root, "images"))
    return datasets.load_from_disk(os.path.join(root, "images"))


def arrow_storage(ds: datasets.Dataset) -> pa.Table:
    t = ds.data.table
    cols = []
    for c in t.columns:
        if isinstance(c.type, pa.ExtensionType):
            c = pa.chunked_array([x.storage for x in c.chunks], c.type.storage_type)
        cols.append(c)
    return pa.table(cols, names=t.column_names)


def timed(fn, out: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    if os.path.exists(out):
        os.remove(out)
    t = time.perf_counter()
    fn(out)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir")
    ap.add_argument("--out", default="bench/results/huggingface_bench.json")
    a = ap.parse_args()
    root = tempfile.mkdtemp(dir=a.dir)
    try:
        vec, img = vectors(a.rows, root), images(a.images, root)
        table = arrow_storage(vec)
        schema = infer_schema(vec)  # the same fields for both (Arrow alone infers (None, None))
        stored = os.path.join(root, "stored.h5")
        from_huggingface(img, stored)
        cases = {
            "vectors_from_huggingface": (a.rows, lambda p: from_huggingface(vec, p)),
            "vectors_from_arrow": (
                a.rows,
                lambda p: rowstore.from_arrow(table, p, schema=schema, batch_rows=1024),
            ),
            "images_as_bytes": (a.images, lambda p: from_huggingface(img, p)),
            "images_decoded": (a.images, lambda p: from_huggingface(img, p, decode_images=True)),
            "images_to_huggingface": (
                a.images,
                lambda p: to_huggingface(stored, cache_dir=p),
            ),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        for k, (_, fn) in cases.items():  # warm-up
            timed(fn, os.path.join(root, k))
        for _ in range(a.repeats):
            for k, (_, fn) in cases.items():
                times[k].append(timed(fn, os.path.join(root, k)))
        med = {k: statistics.median(v) for k, v in times.items()}
        report = {
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
            "repeats": a.repeats,
            "median_s": med,
            "rows_per_s": {k: cases[k][0] / med[k] for k in cases},
            "ratios": {
                "from_huggingface / from_arrow (vectors)": med["vectors_from_huggingface"]
                / med["vectors_from_arrow"],
                "decoded / as bytes (images)": med["images_decoded"] / med["images_as_bytes"],
            },
        }
        print(json.dumps(report, indent=2))
        if a.out:
            os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
            with open(a.out, "w") as f:
                json.dump(report, f, indent=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
