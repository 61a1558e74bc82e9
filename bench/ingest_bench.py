"""Ingest of encoded images: a folder of PNG files into a dataset, same files, same run.

    bash bench/setup_ffcv.sh; bash bench/setup_lance.sh     # once: the peers in their own venvs
    python bench/ingest_bench.py [--n 20000] [--repeats 3] [--workers N] [--quick]
        [--skip CASE ...] [--out bench/results/ingest_bench.json]

The source is ``n`` PNG files of 128x256x3 (smooth images with noise, 10 class folders), made
once and read from the page cache by every contender. Every writer reads the files itself
inside its timed part; the cases run interleaved, their order rotated each round, the first
round a warm-up:

* ``from_images``: ``rowstore.from_images`` (bytes as they are, header checked, fsync'd and
  committed; ``workers`` processes) and ``from_images_1``: the same with ``workers=1``;
* ``reencode``: the path before encoded values were taken: each file read, decoded
  (imagecodecs), the arrays written with ``DatasetWriter.write_batch`` and encoded again,
  ``threads=1``; ``reencode_threads``: the same with the writer's encode threads (``workers``);
* ``tfrecord``: the bytes as they are into one TFRecord file of ``tf.train.Example`` (image
  bytes, label), the usual TensorFlow peer (skipped without tensorflow);
* ``arrayrecord``: ``ArrayRecordWriter`` (its default options: ``group_size:1``, ``zstd:3``),
  one record a file: a pickled ``{"image": bytes, "label": int}``, as Grain users write them;
* ``lance``: ``lance.write_dataset`` of a pyarrow table (PNG bytes, int64 label), in
  ``.lance-venv`` (bench/setup_lance.sh), a child process timing only its write;
* ``ffcv``: FFCV 1.0's ``DatasetWriter``, ``RGBImageField(write_mode="raw")`` (FFCV cannot keep
  PNG bytes: each file is decoded, OpenCV, and its pixels stored; raw is its least work) and an
  ``IntField``, ``num_workers=workers``, in ``.ffcv-venv`` (bench/setup_ffcv.sh), a child
  process timing only its write. A peer whose venv is missing is skipped, and said so.

None of the peers fsyncs. Median seconds of the timed rounds, images/s, bytes written, and
each case's time over ``from_images``' and ``from_images_1``'s (above 1: rowstore is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import imagecodecs
import numpy as np

import rowstore

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ingest_rounds import emit, medians, rounded, timed_rounds  # noqa: E402

SHAPE = (128, 256, 3)
CLASSES = 10
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "bench", "ingest_peers.py")


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


def run_arrayrecord(paths: list[str], labels: list[int], dest: str) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(dest, exist_ok=True)
    w = ArrayRecordWriter(os.path.join(dest, "data.array_record"), "")
    try:
        for p, lab in zip(paths, labels):
            with open(p, "rb") as fh:
                data = fh.read()
            w.write(pickle.dumps({"image": data, "label": lab}, protocol=5))
    finally:
        w.close()


def run_peer(python: str, peer: str, listing: str, dest: str, workers: int) -> float:
    """One write by a peer in its own venv; the child's own timing of the write (its start-up
    and imports are not counted), its rows checked."""
    proc = subprocess.run(
        [python, PEERS, peer, listing, dest, "--workers", str(workers)],
        capture_output=True,
        text=True,
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("PEER-RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{peer} failed: {(proc.stderr or proc.stdout)[-2000:]}")
    out = json.loads(lines[-1][len("PEER-RESULT ") :])
    with open(listing) as fh:
        n = len(json.load(fh))
    assert out["rows"] == n, (peer, out["rows"], n)
    return out["seconds"]


def check(dest: str, paths: list[str]) -> None:
    """The dataset holds every file, the first one's pixels those of its PNG."""
    with rowstore.open(dest) as r:
        assert len(r) == len(paths), (len(r), len(paths))
        with open(paths[0], "rb") as fh:
            want = imagecodecs.png_decode(fh.read())
        assert np.array_equal(r[0]["image"], want)


def check_tfrecord(dest: str, paths: list[str]) -> None:
    import tensorflow as tf

    k = sum(1 for _ in tf.data.TFRecordDataset(os.path.join(dest, "data.tfrecord")))
    assert k == len(paths), (k, len(paths))


def check_arrayrecord(dest: str, paths: list[str]) -> None:
    from array_record.python.array_record_module import ArrayRecordReader

    r = ArrayRecordReader(os.path.join(dest, "data.array_record"))
    try:
        assert r.num_records() == len(paths), (r.num_records(), len(paths))
        with open(paths[0], "rb") as fh:
            assert pickle.loads(r.read([0])[0])["image"] == fh.read()
    finally:
        r.close()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="PNG files (default 20000)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quick", action="store_true", help="n=600, 2 repeats")
    ap.add_argument("--skip", nargs="*", default=[], help="cases not to run")
    ap.add_argument("--no-tfrecord", action="store_true")
    ap.add_argument("--ffcv-python", default=os.path.join(ROOT, ".ffcv-venv", "bin", "python"))
    ap.add_argument("--lance-python", default=os.path.join(ROOT, ".lance-venv", "bin", "python"))
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 600, 2
    if args.no_tfrecord:
        args.skip.append("tfrecord")
    tmp = tempfile.mkdtemp(prefix="ingest_bench_")
    try:
        src = os.path.join(tmp, "src")
        t0 = time.perf_counter()
        paths, labels, total = make_source(src, args.n)
        listing = os.path.join(tmp, "files.json")
        with open(listing, "w") as fh:
            json.dump([[p, lab] for p, lab in zip(paths, labels)], fh)
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
            "arrayrecord": lambda d: run_arrayrecord(paths, labels, d),
        }
        checks = {"arrayrecord": check_arrayrecord}
        skipped = {k: "--skip" for k in args.skip}
        try:
            import tensorflow  # noqa: F401

            cases["tfrecord"] = lambda d: run_tfrecord(paths, labels, d)
            checks["tfrecord"] = check_tfrecord
        except ImportError:
            skipped["tfrecord"] = "tensorflow not installed"
        for peer, python, setup in (
            ("lance", args.lance_python, "bench/setup_lance.sh"),
            ("ffcv", args.ffcv_python, "bench/setup_ffcv.sh"),
        ):
            probe = subprocess.run(
                [python, "-c", f"import {peer}"] if os.path.exists(python) else ["false"],
                capture_output=True,
            )
            if not probe.returncode:
                cases[peer] = lambda d, peer=peer, python=python: run_peer(
                    python, peer, listing, d, args.workers
                )
                checks[peer] = lambda d, p: None  # rows counted back by the child
            else:
                skipped[peer] = f"{python} cannot import {peer}: run {setup}"
        cases = {k: v for k, v in cases.items() if k not in args.skip}
        for k, why in skipped.items():
            print(f"  {k}: skipped ({why})", file=sys.stderr)
        times, sizes, loads = timed_rounds(
            cases, tmp, args.repeats, lambda name, d: checks.get(name, check)(d, paths)
        )
        med = medians(times)
        result = {
            "bench": "ingest_bench",
            "n": args.n,
            "shape": list(SHAPE),
            "source_mb": round(total / 1e6, 1),
            "workers": args.workers,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "load_avg_1m_per_round": loads,
            "python": platform.python_version(),
            "rowstore": rowstore.__version__,
            "skipped": skipped,
            **rounded(times, med),
            "images_per_s": {k: round(args.n / v) for k, v in med.items()},
            "written_mb": {k: round(v / 1e6, 1) for k, v in sizes.items()},
        }
        for base in ("from_images", "from_images_1", "reencode"):
            if base in med:
                result[f"time_over_{base}"] = {k: round(v / med[base], 2) for k, v in med.items()}
        return emit(result, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
