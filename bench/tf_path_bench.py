"""The tf.data path against the core reader and tf.data's own floor, in one run.

    python bench/tf_path_bench.py [--rows 1000000] [--batch 256 1024] [--repeats 3]
        [--out bench/results/tf_path_bench.json]

On the ``tiny`` demo (float32[16] + int64 label, 72-byte rows), one block-shuffled epoch of:

* ``core``: ``Reader.batches(batch)`` consumed by a Python loop (every batch's length read);
* ``rowstore.tf``: a fresh ``rowstore.tf.make_dataset(reader, batch_size=batch, epoch=e)``,
  consumed eagerly (``for b in ds``, as a custom training loop does) and in the graph
  (``Dataset.reduce``, as ``Model.fit`` does);
* ``tf.data floor``: ``Dataset.from_tensors(batch).repeat(n)`` of the same batches, eager and in
  the graph: what tf.data costs per element with no input work at all (a bound for any
  tf.data pipeline handing out batches of that size).

Repeats are interleaved (repeat 1 of every configuration, then repeat 2, ...) so that a change
of machine load hits them alike; one warm-up epoch each; medians; ratios against ``core`` at the
same batch size, of wall-clock rows/s and of rows per CPU-second of the process (every thread:
what a path costs, less sensitive than wall time to other jobs on a shared machine).
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

import tensorflow as tf  # noqa: E402

import rowstore  # noqa: E402
import rowstore.tf as rtf  # noqa: E402
from rowstore.bench.cli import ensure_demo  # noqa: E402
from rowstore.bench.measure import cpu_seconds, machine_info, warm_cache  # noqa: E402
from rowstore.demo import default_cache_dir  # noqa: E402

WINDOW = 16


def _log(msg: str) -> None:
    print(msg, flush=True)


def _eager(ds: tf.data.Dataset) -> int:
    n = 0
    for b in ds:
        n += int(b["label"].shape[0])
    return n


def _graph(ds: tf.data.Dataset) -> int:
    return int(
        ds.reduce(
            tf.constant(0, tf.int64), lambda n, b: n + tf.shape(b["label"], out_type=tf.int64)[0]
        )
    )


def configs(r: Any, batch: int) -> dict[str, Any]:
    """name -> run(epoch) returning the rows read."""

    def core(e: int) -> int:
        n = 0
        for b in r.batches(batch, shuffle="block", seed=0, epoch=e, window=WINDOW):
            n += len(b["label"])
        return n

    def tf_run(mod: Any, consume: Any):
        return lambda e: consume(
            mod.make_dataset(r, batch_size=batch, shuffle="block", seed=0, epoch=e, window=WINDOW)
        )

    one = next(iter(r.batches(batch, shuffle="none")))
    const = {k: tf.constant(v) for k, v in one.items()}
    steps = len(r) // batch

    out: dict[str, Any] = {"core": core}
    for label, consume in (("eager", _eager), ("graph", _graph)):
        out[f"rowstore.tf {label}"] = tf_run(rtf, consume)
        out[f"tf.data floor {label}"] = lambda e, c=consume: c(
            tf.data.Dataset.from_tensors(const).repeat(steps)
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default=default_cache_dir())
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "tf_path_bench.json"))
    args = p.parse_args(argv)

    path = ensure_demo("tiny", args.rows, args.cache_dir, log=_log)
    warm_cache([path])
    r = rowstore.open(path)
    doc: dict[str, Any] = {
        "benchmark": "tf_path_bench",
        "tensorflow": tf.__version__,
        "rowstore": rowstore.__version__,
        "machine": machine_info(),
        "rows": len(r),
        "row_bytes": r.layout.row_dtype.itemsize,
        "repeats": args.repeats,
        "batches": {},
    }
    t0 = time.perf_counter()
    for batch in args.batch:
        runs = configs(r, batch)
        rates: dict[str, list[float]] = {name: [] for name in runs}
        cpu_rates: dict[str, list[float]] = {name: [] for name in runs}
        for fn in runs.values():  # warm-up epoch
            fn(0)
        for e in range(1, args.repeats + 1):
            for name, fn in runs.items():
                t, c = time.perf_counter(), cpu_seconds()
                n = fn(e)
                rates[name].append(n / (time.perf_counter() - t))
                cpu_rates[name].append(n / max(cpu_seconds() - c, 1e-9))
        core = statistics.median(rates["core"])
        core_cpu = statistics.median(cpu_rates["core"])
        res = {}
        for name, xs in rates.items():
            med, cmed = statistics.median(xs), statistics.median(cpu_rates[name])
            # rows per CPU-second of this process (all its threads): what the path costs, less
            # sensitive than wall time to other jobs on a shared machine
            res[name] = {
                "rows_per_s": med,
                "all_rows_per_s": xs,
                "spread": max(xs) / min(xs),
                "vs_core": med / core,
                "rows_per_cpu_s": cmed,
                "all_rows_per_cpu_s": cpu_rates[name],
                "cpu_vs_core": cmed / core_cpu,
            }
            _log(
                f"batch {batch:5d}  {name:24s} {med / 1e6:6.2f} M rows/s  {med / core:5.2f}x core  "
                f"(spread {max(xs) / min(xs):.2f});  {cmed / 1e6:6.2f} M rows/CPU-s  "
                f"{cmed / core_cpu:5.2f}x core"
            )
        doc["batches"][str(batch)] = res
    doc["seconds"] = time.perf_counter() - t0
    doc["load_avg_end"] = list(os.getloadavg())
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        _log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
