"""Ingest of encoded images: a folder of PNG files into a dataset, same files, same run.

    python bench/ingest_bench.py [--n 20000] [--repeats 3] [--workers N] [--quick]
        [--out bench/results/ingest_bench.json]

The source is ``n`` PNG files of 128x256x3 (smooth images with noise, 10 class folders), made
once and read from the page cache by every contender (the first repeat is a warm-up):

* ``from_images``: ``rowstore.from_images`` (bytes as they are, header checked; ``workers``
  processes) and the same with ``workers=1``;
* ``reencode``: the path before encoded values were taken: each file read, decoded
  (imagecodecs), the arrays written with ``DatasetWriter.write_batch`` and encoded again,
  ``threads=1``; ``reencode_threads``: the same with the writer's encode threads (``workers``);
* ``tfrecord``: the bytes as they are into one TFRecord file of ``tf.train.Example`` (image
  bytes, label), the usual TensorFlow peer (skipped without tensorflow).

Median seconds of the timed repeats, images/s and ratios to ``reencode`` (and to ``tfrecord``).
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

import imagecodecs
import numpy as np

import rowstore

SHAPE = (128, 256, 3)
CLASSES = 10


def make_source(root: str, n: int) -> tuple[list[str], list[int], int]:
    """``n`` PNG files under ``root/class_k/``; their paths, labels and total bytes."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
    paths, labels, total = [], [], 0
    for i in range(n):
        k = i % CLASSES
        base = np.stack(
            [np.sin(x / (5 + k) + i) * 60, np.cos(y / (7 + k)) * 60, (x + y + i) % 64], axis=-1
        )
        img = (base + 128 + rng.normal(0, 6, SHAPE)).clip(0, 255).astype(np.uint8)
        d = os.path.join(root, f"class_{k:02d}")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, f"{i:06d}.png")
        data = imagecodecs.png_encode(img, level=6)
        with open(p, "wb") as fh:
            fh.write(data)
        paths.append(p)
        labels.append(k)
        total += len(data)
    order = sorted(range(n), key=lambda i: paths[i])
    return [paths[i] for i in order], [labels[i] for i in order], total


def run_from_images(src: str, dest: str, workers: int) -> None:
    rowstore.from_images(src, dest, workers=workers, path_field=None)


def run_reencode(paths: list[str], labels: list[int], dest: str, threads: int) -> None:
    schema = rowstore.Schema(
        [rowstore.Field("image", "uint8", SHAPE, codec="png"), rowstore.Field("label", "int64", ())]
    )
    with rowstore.DatasetWriter(dest, schema, threads=threads) as w:
        for a in range(0, len(paths), 256):
            imgs = []
            for p in paths[a : a + 256]:
                with open(p, "rb") as fh:
                    imgs.append(imagecodecs.png_decode(fh.read()))
            w.write_batch({"image": imgs, "label": labels[a : a + 256]})


def run_tfrecord(paths: list[str], labels: list[int], dest: str) -> None:
    import tensorflow as tf

    os.makedirs(dest, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(dest, "data.tfrecord")) as w:
        for p, lab in zip(paths, labels):
            with open(p, "rb") as fh:
                data = fh.read()
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[lab])),
                    }
                )
            )
            w.write(ex.SerializeToString())


def check(dest: str, paths: list[str]) -> None:
    """The dataset holds every file, the first one's pixels those of its PNG."""
    with rowstore.open(dest) as r:
        assert len(r) == len(paths), (len(r), len(paths))
        with open(paths[0], "rb") as fh:
            want = imagecodecs.png_decode(fh.read())
        assert np.array_equal(r[0]["image"], want)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="PNG files (default 20000)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (after one warm-up)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="n=600, 2 repeats")
    ap.add_argument("--no-tfrecord", action="store_true")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 600, 2
    tmp = tempfile.mkdtemp(prefix="ingest_bench_")
    try:
        src = os.path.join(tmp, "src")
        t0 = time.perf_counter()
        paths, labels, total = make_source(src, args.n)
        print(
            f"{args.n} PNGs of {SHAPE}: {total / 1e6:.1f} MB ({total / args.n / 1e3:.1f} kB "
            f"each), made in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        cases = {
            "from_images": lambda d: run_from_images(src, d, args.workers),
            "from_images_1": lambda d: run_from_images(src, d, 1),
            "reencode": lambda d: run_reencode(paths, labels, d, 1),
            "reencode_threads": lambda d: run_reencode(paths, labels, d, args.workers),
        }
        if not args.no_tfrecord:
            try:
                import tensorflow  # noqa: F401

                cases["tfrecord"] = lambda d: run_tfrecord(paths, labels, d)
            except ImportError:
                pass
        times: dict[str, list[float]] = {k: [] for k in cases}
        for rep in range(args.repeats + 1):  # interleaved; repeat 0 warms up
            for name, fn in cases.items():
                dest = os.path.join(tmp, f"out_{name}")
                shutil.rmtree(dest, ignore_errors=True)
                t = time.perf_counter()
                fn(dest)
                dt = time.perf_counter() - t
                if name != "tfrecord":
                    check(dest, paths)
                if rep:
                    times[name].append(dt)
                print(f"  {name:18s} repeat {rep}: {dt:.2f} s", file=sys.stderr)
        med = {k: statistics.median(v) for k, v in times.items()}
        result = {
            "bench": "ingest_bench",
            "n": args.n,
            "shape": list(SHAPE),
            "source_mb": round(total / 1e6, 1),
            "workers": args.workers,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "rowstore": rowstore.__version__,
            "median_s": {k: round(v, 3) for k, v in med.items()},
            "images_per_s": {k: round(args.n / v) for k, v in med.items()},
            "speedup_vs_reencode": {k: round(med["reencode"] / v, 2) for k, v in med.items()},
        }
        if "tfrecord" in med:
            result["speedup_vs_tfrecord"] = {
                k: round(med["tfrecord"] / v, 2) for k, v in med.items()
            }
        print(json.dumps(result, indent=2))
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=2)
                fh.write("\n")
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
