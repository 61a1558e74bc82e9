"""rowstore.tf against the core reader and against TFRecord files read with tf.data.

    python bench/tf_compare.py [--quick] [--repeats 3] [--out bench/results/tf_compare.json] [--doc
    docs/tf.md]

On the same data (the ``tiny`` demo: float32[16] + int64 label; the ``patch`` demo: float64
[9,9,27], int64[9,27], float64), one shuffled epoch of:

* ``core``: ``Reader.batches`` (numpy batches, consumed by a Python loop);
* ``rowstore.tf``: ``rowstore.tf.make_dataset`` (block shuffle, a new epoch each repeat), with
  1 and 2 parallel parts;
* ``TFRecord``: the same rows written here as ``tf.train.Example`` records (4 files), read with
  ``TFRecordDataset(num_parallel_reads=AUTOTUNE)`` + ``shuffle(buffer)`` + ``batch`` +
  ``map(tf.io.parse_example, num_parallel_calls=AUTOTUNE)`` + ``prefetch(AUTOTUNE)`` (float64
  arrays as raw bytes decoded with ``tf.io.decode_raw``: ``float_list`` is float32).

tf.data pipelines are consumed in the graph (``Dataset.reduce``), as ``Model.fit`` consumes
them; iterating a dataset eagerly in Python adds ~0.1-0.2 ms per batch to every pipeline.
Every measurement: files in the page cache, one warm-up epoch, then the median rows/s of
``--repeats`` epochs. Results: JSON (``--out``), a markdown table printed and written into
``--doc`` between ``<!-- tf_compare:begin -->`` and ``<!-- tf_compare:end -->``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rowstore  # noqa: E402
import rowstore.tf as rtf  # noqa: E402
from rowstore.bench.cli import ensure_demo  # noqa: E402
from rowstore.bench.measure import cpu_seconds, machine_info, warm_cache  # noqa: E402
from rowstore.demo import default_cache_dir  # noqa: E402

#: name -> rows (full), rows (--quick), batch size, TFRecord shuffle buffer (rows)
WORKLOADS: dict[str, dict[str, int]] = {
    "tiny": {"rows": 500_000, "quick": 50_000, "batch": 1024, "buffer": 10_000},
    "patch": {"rows": 5_000, "quick": 500, "batch": 128, "buffer": 1_000},
}
TFRECORD_FILES = 4
WINDOW = 16
BEGIN, END = "<!-- tf_compare:begin -->", "<!-- tf_compare:end -->"


def _log(msg: str) -> None:
    print(msg, flush=True)


# -- TFRecord files ------------------------------------------------------------------------------
def _example(name: str, row: dict[str, np.ndarray]) -> bytes:
    F = tf.train.Feature
    if name == "tiny":
        feats = {
            "x": F(float_list=tf.train.FloatList(value=row["x"])),
            "label": F(int64_list=tf.train.Int64List(value=[int(row["label"])])),
        }
    else:
        feats = {
            "foo": F(bytes_list=tf.train.BytesList(value=[row["foo"].astype("<f8").tobytes()])),
            "bar": F(int64_list=tf.train.Int64List(value=row["bar"].ravel())),
            "baz": F(
                bytes_list=tf.train.BytesList(
                    value=[np.float64(row["baz"]).astype("<f8").tobytes()]
                )
            ),
        }
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_tfrecords(name: str, path: str, out_dir: str) -> list[str]:
    """The rows of rowstore file ``path`` in file order, as TFRecord files (cached)."""
    files = [
        os.path.join(out_dir, f"{name}-{i:02d}-of-{TFRECORD_FILES:02d}.tfrecord")
        for i in range(TFRECORD_FILES)
    ]
    if all(os.path.exists(f) for f in files):
        return files
    os.makedirs(out_dir, exist_ok=True)
    r = rowstore.open(path)
    n = len(r)
    t = time.perf_counter()
    _log(f"writing {n} rows of {name!r} as TFRecord ({TFRECORD_FILES} files) ...")
    for i, fpath in enumerate(files):
        lo, hi = i * n // TFRECORD_FILES, (i + 1) * n // TFRECORD_FILES
        tmp = fpath + ".tmp"
        with tf.io.TFRecordWriter(tmp) as w:
            for a in range(lo, hi, 8192):
                b = r.take(np.arange(a, min(a + 8192, hi)))
                for j in range(len(next(iter(b.values())))):
                    w.write(_example(name, {k: v[j] for k, v in b.items()}))
        os.replace(tmp, fpath)
    _log(f"  written in {time.perf_counter() - t:.1f} s")
    return files


def tfrecord_dataset(
    name: str, files: list[str], batch: int, buffer: int, seed: int
) -> tf.data.Dataset:
    if name == "tiny":
        spec = {
            "x": tf.io.FixedLenFeature([16], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }
    else:
        spec = {
            "foo": tf.io.FixedLenFeature([], tf.string),
            "bar": tf.io.FixedLenFeature([9, 27], tf.int64),
            "baz": tf.io.FixedLenFeature([], tf.string),
        }

    def parse(serialized):
        ex = tf.io.parse_example(serialized, spec)
        if name == "patch":
            ex["foo"] = tf.reshape(tf.io.decode_raw(ex["foo"], tf.float64), [-1, 9, 9, 27])
            ex["baz"] = tf.reshape(tf.io.decode_raw(ex["baz"], tf.float64), [-1])
        return ex

    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed)
    ds = tf.data.TFRecordDataset(ds, num_parallel_reads=tf.data.AUTOTUNE)
    ds = ds.shuffle(buffer, seed=seed).batch(batch)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


# -- measuring ---------------------------------------------------------------------------------
def _consume_tf(ds: tf.data.Dataset, key: str) -> int:
    """Rows of one pass, consumed in the graph (as Model.fit does)."""
    return int(
        ds.reduce(tf.constant(0, tf.int64), lambda n, b: n + tf.shape(b[key], out_type=tf.int64)[0])
    )


def _consume_numpy(it, key: str) -> int:
    rows = 0
    for b in it:
        rows += len(b[key])
    return rows


def measure(make, consume, repeats: int) -> dict[str, Any]:
    """One warm-up epoch, then ``repeats`` timed epochs (``make(epoch)`` builds each)."""
    reps = []
    for e in range(repeats + 1):
        src = make(e)
        t0, c0 = time.perf_counter(), cpu_seconds()
        rows = consume(src)
        dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
        if e:  # epoch 0 is the warm-up
            reps.append(
                {"rows": rows, "seconds": dt, "rows_per_s": rows / dt, "cpu_percent": 100 * dc / dt}
            )
    rates = [r["rows_per_s"] for r in reps]
    return {
        "rows_per_s": statistics.median(rates),
        "cpu_percent": statistics.median(r["cpu_percent"] for r in reps),
        "rows": reps[0]["rows"],
        "all_rows_per_s": rates,
        "spread": max(rates) / min(rates),
    }


def run_workload(
    name: str, rows: int, cfg: dict[str, int], repeats: int, cache_dir: str
) -> dict[str, Any]:
    path = ensure_demo(name, rows, cache_dir, log=_log)
    files = write_tfrecords(name, path, os.path.join(cache_dir, "tfrecord", f"{name}-{rows}"))
    warm_cache([path, *files])
    r = rowstore.open(path)
    B, key = cfg["batch"], ("label" if name == "tiny" else "baz")
    quality = r.shuffle_quality(B, shuffle="block", window=WINDOW)
    results: list[dict[str, Any]] = []

    def add(label: str, make, consume, **info) -> None:
        _log(f"  {name}: {label} ...")
        res = measure(make, consume, repeats)
        res.update(name=label, **info)
        results.append(res)
        _log(
            f"    {res['rows_per_s'] / 1e6:.3f} M rows/s (spread {res['spread']:.2f}, CPU "
            f"{res['cpu_percent']:.0f}%)"
        )

    add(
        "core reader (Reader.batches)",
        lambda e: r.batches(B, shuffle="block", seed=0, epoch=e, window=WINDOW),
        lambda it: _consume_numpy(it, key),
        kind="core",
        shuffle=f"block, window {WINDOW}",
        shuffle_quality=quality,
    )
    for k in (1, 2):
        add(
            f"rowstore.tf (num_parallel_reads={k})",
            lambda e, k=k: rtf.make_dataset(
                r,
                batch_size=B,
                shuffle="block",
                seed=0,
                epoch=e,
                window=WINDOW,
                num_parallel_reads=k,
            ),
            lambda ds: _consume_tf(ds, key),
            kind="rowstore.tf",
            parallel_reads=k,
            shuffle=f"block, window {WINDOW}",
            shuffle_quality=quality,
        )
    add(
        "TFRecord + tf.data",
        lambda e: tfrecord_dataset(name, files, B, cfg["buffer"], seed=e),
        lambda ds: _consume_tf(ds, key),
        kind="tfrecord",
        shuffle=f"shuffle buffer {cfg['buffer']} rows",
    )

    core = next(x for x in results if x["kind"] == "core")["rows_per_s"]
    tfrec = next(x for x in results if x["kind"] == "tfrecord")["rows_per_s"]
    best = max((x for x in results if x["kind"] == "rowstore.tf"), key=lambda x: x["rows_per_s"])
    for x in results:
        x["vs_core"] = x["rows_per_s"] / core
        x["vs_tfrecord"] = x["rows_per_s"] / tfrec
    return {
        "rows": len(r),
        "batch_size": B,
        "row_bytes": r.layout.row_dtype.itemsize,
        "rowstore_file_mb": os.path.getsize(path) / 1e6,
        "tfrecord_mb": sum(os.path.getsize(f) for f in files) / 1e6,
        "results": results,
        "ratios": {
            "rowstore_tf_vs_core": best["rows_per_s"] / core,
            "rowstore_tf_vs_tfrecord": best["rows_per_s"] / tfrec,
            "best_rowstore_tf": best["name"],
        },
    }


# -- report
# -----------------------------------------------------------------------------------------
def _rate(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k"


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"Measured by `bench/tf_compare.py` on {m.get('cpus')} CPUs ({m.get('platform')}), "
        f"TensorFlow "
        f"{doc['tensorflow']}, load average at start {m.get('load_avg')}; warm page cache, one "
        f"warm-up epoch, "
        f"median of {doc['repeats']} shuffled epochs (spread: fastest / slowest). tf.data "
        f"pipelines consumed in the graph "
        f"(`Dataset.reduce`, as `Model.fit` does).",
        "",
    ]
    for name, w in doc["workloads"].items():
        lines += [
            f"**{name}** ({w['rows']:,} rows of {w['row_bytes']} bytes, batch {w['batch_size']}; "
            f"rowstore file "
            f"{w['rowstore_file_mb']:.1f} MB, TFRecord {w['tfrecord_mb']:.1f} MB)",
            "",
            "| reader | rows/s | spread | vs core reader | vs TFRecord | CPU % | shuffle |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for x in w["results"]:
            shuffle = x["shuffle"] + (
                f" (quality {x['shuffle_quality']:.2f})" if "shuffle_quality" in x else ""
            )
            lines.append(
                f"| {x['name']} | {_rate(x['rows_per_s'])} | {x['spread']:.2f} | "
                f"{x['vs_core']:.2f}x | {x['vs_tfrecord']:.2f}x "
                f"| {x['cpu_percent']:.0f} | {shuffle} |"
            )
        ra = w["ratios"]
        lines += [
            "",
            f"rowstore.tf (best: {ra['best_rowstore_tf']}) / core reader = "
            f"{ra['rowstore_tf_vs_core']:.2f}; "
            f"rowstore.tf / TFRecord = {ra['rowstore_tf_vs_tfrecord']:.2f}.",
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def write_doc(path: str, table: str) -> None:
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text and END in text:
        a, b = text.index(BEGIN), text.index(END) + len(END)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip() + "\n\n## Performance\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="small files (a smoke run; figures are not meaningful)"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "tf_compare.json"))
    p.add_argument(
        "--doc",
        default=os.path.join(ROOT, "docs", "tf.md"),
        help="markdown file to update ('' for none)",
    )
    p.add_argument("--cache-dir", default=default_cache_dir())
    p.add_argument(
        "--report", metavar="JSON", help="only render the markdown of an earlier run's JSON"
    )
    args = p.parse_args(argv)
    if args.report:
        with open(args.report, encoding="utf-8") as f:
            table = markdown(json.load(f))
        print(table)
        if args.doc:
            write_doc(args.doc, table)
            _log(f"updated {args.doc}")
        return 0

    t0 = time.perf_counter()
    doc: dict[str, Any] = {
        "benchmark": "tf_compare",
        "tensorflow": tf.__version__,
        "rowstore": rowstore.__version__,
        "machine": machine_info(),
        "repeats": args.repeats,
        "quick": args.quick,
        "workloads": {},
    }
    for name in args.workloads:
        cfg = WORKLOADS[name]
        doc["workloads"][name] = run_workload(
            name, cfg["quick" if args.quick else "rows"], cfg, args.repeats, args.cache_dir
        )
    doc["seconds"] = time.perf_counter() - t0
    table = markdown(doc)
    print()
    print(table)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        _log(f"wrote {args.out}")
    if args.doc:
        write_doc(args.doc, table)
        _log(f"updated {args.doc}")
    _log(f"total {doc['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
