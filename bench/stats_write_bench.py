"""What keeping statistics costs the writer: the same rows written with ``stats=True`` (the
default) and ``stats=False``, interleaved, in one run (issue 41: at most 5% of ``write_batch``
and of per-row ``write`` throughput).

    python bench/stats_write_bench.py [--quick] [--repeats N] [--out FILE.json]

Workloads (each to a fresh file, flush, fsync and close included, as ``bench/write_bench.py``):

* ``batch tiny``: ``write_batch`` of 16 float32 features and an int64 label per row;
* ``batch patch``: ``write_batch`` of the patch rows (float64 9x9x27, int64 9x27, a float);
* ``batch text``: ``write_batch`` of an int label, a short str class name and variable-length
  int32 tokens;
* ``per-row``: one ``Writer.write(dict)`` per row of Python values (``id`` int, ``label``
  float into float32, ``name`` str, ``vector`` float32[16], ``flag`` bool, ``score`` float);
* ``per-row tokens``: the same plus a variable-length int32 ``tokens`` field (heap).

Reports the median seconds of each side and ``cost = on / off - 1``; repeats alternate the order
of the two sides. Figures on a loaded machine are noisy: the coordinator takes the final ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import rowstore
from rowstore import Field, Schema


def batch_workloads(n: int, rng) -> dict[str, tuple[Schema, dict]]:
    tiny = (
        Schema([Field("x", "float32", (16,)), Field("label", "int64")]),
        {"x": rng.standard_normal((n, 16), dtype=np.float32), "label": rng.integers(0, 10, n)},
    )
    m = max(1, n // 40)
    patch = (
        Schema(
            [
                Field("foo", "float64", (9, 9, 27)),
                Field("bar", "int64", (9, 27)),
                Field("baz", "float64"),
            ]
        ),
        {
            "foo": rng.standard_normal((m, 9, 9, 27)),
            "bar": rng.integers(0, 1000, (m, 9, 27)),
            "baz": rng.standard_normal(m),
        },
    )
    k = max(1, n // 4)
    names = ["cat", "dog", "bird", "fish", "horse", "ant", "bee", "cow"]
    text = (
        Schema([Field("label", "int64"), Field("name", "str"), Field("tokens", "int32", (None,))]),
        {
            "label": rng.integers(0, 8, k),
            "name": [names[i] for i in rng.integers(0, 8, k)],
            "tokens": [rng.integers(0, 30000, j).astype(np.int32) for j in rng.integers(4, 40, k)],
        },
    )
    return {"batch tiny": tiny, "batch patch": patch, "batch text": text}


def row_workloads(n: int, rng) -> dict[str, tuple[Schema, list]]:
    base = [
        Field("id", "int64"),
        Field("label", "float32"),
        Field("name", "str"),
        Field("vector", "float32", (16,)),
        Field("flag", "bool"),
        Field("score", "float64"),
    ]
    names = ["alpha", "beta", "gamma", "delta"]
    rows = [
        {
            "id": i,
            "label": float(i % 10),
            "name": names[i % 4],
            "vector": rng.standard_normal(16, dtype=np.float32),
            "flag": bool(i % 2),
            "score": float(i) * 0.5,
        }
        for i in range(n)
    ]
    with_tokens = [
        dict(r, tokens=rng.integers(0, 30000, 4 + i % 24).astype(np.int32))
        for i, r in enumerate(rows)
    ]
    return {
        "per-row": (Schema(base), rows),
        "per-row tokens": (Schema(base + [Field("tokens", "int32", (None,))]), with_tokens),
    }


def write_batches(path: str, schema: Schema, cols: dict, stats: bool, batch: int = 8192) -> None:
    n = len(next(iter(cols.values())))
    with rowstore.Writer(path, schema, stats=stats) as w:
        for a in range(0, n, batch):
            w.write_batch({k: v[a : a + batch] for k, v in cols.items()})


def write_rows(path: str, schema: Schema, rows: list, stats: bool) -> None:
    with rowstore.Writer(path, schema, stats=stats) as w:
        for r in rows:
            w.write(r)


def measure(fn, schema, data, repeats: int, tmp: str) -> dict:
    times: dict[bool, list[float]] = {True: [], False: []}
    path = os.path.join(tmp, "bench.h5")
    fn(path, schema, data, True)  # warm-up
    for k in range(repeats):
        for stats in (True, False) if k % 2 == 0 else (False, True):
            t0 = time.perf_counter()
            fn(path, schema, data, stats)
            times[stats].append(time.perf_counter() - t0)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"on_s": on, "off_s": off, "cost": on / off - 1.0, "runs": repeats}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data, few repeats (a smoke test)")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    n_batch = args.rows or (20_000 if args.quick else 1_000_000)
    n_rows = max(1, n_batch // 10) if args.rows is None else args.rows
    repeats = args.repeats or (3 if args.quick else 9)
    rng = np.random.default_rng(0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (schema, cols) in batch_workloads(n_batch, rng).items():
            results[name] = measure(write_batches, schema, cols, repeats, tmp)
            print(_line(name, results[name]), flush=True)
        for name, (schema, rows) in row_workloads(n_rows, rng).items():
            results[name] = measure(write_rows, schema, rows, repeats, tmp)
            print(_line(name, results[name]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "results": results,
                    "rows_batch": n_batch,
                    "rows_per_row": n_rows,
                    "python": sys.version.split()[0],
                    "machine": platform.platform(),
                    "cpus": os.cpu_count(),
                    "rowstore": rowstore.__version__,
                },
                f,
                indent=1,
            )
    return 0


def _line(name: str, r: dict) -> str:
    return (
        f"{name:16s} stats on {r['on_s'] * 1e3:9.1f} ms  off {r['off_s'] * 1e3:9.1f} ms  "
        f"cost {100 * r['cost']:+6.1f}%"
    )


if __name__ == "__main__":
    sys.exit(main())
