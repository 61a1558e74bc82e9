"""``pieces=`` through the adapters: one epoch of the tiny demo rows (72 B) at batch
1024 through ``Reader.batches``, ``rowstore.torch.BatchedDataLoader`` and
``rowstore.tf.make_dataset``
with ``window=16`` and with ``window=128, pieces=8``, every batch touched; medians of
``--repeats`` epochs per configuration, configurations interleaved. Rows per CPU second (user +
system of this process) besides wall rows/s, since a loaded machine makes wall time noisy.

    python bench/pieces_adapters_bench.py [--rows 1000000] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

CONFIGS = {"window=16": dict(window=16), "window=128 pieces=8": dict(window=128, pieces=8)}


def _epoch(kind: str, path: str, reader, kw: dict) -> int:
    n = 0
    if kind == "Reader.batches":
        for b in reader.batches(1024, seed=1, **kw):
            n += len(b["label"])
    elif kind == "torch BatchedDataLoader":
        import rowstore.torch as rst

        with rst.BatchedDataLoader(reader, batch_size=1024, seed=1, **kw) as dl:
            for b in dl:
                n += int(b["label"].shape[0])
    else:
        import rowstore.tf as rtf

        for b in rtf.make_dataset(reader, batch_size=1024, seed=1, **kw):
            n += int(b["label"].shape[0])
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    from rowstore.demo import make_demo
    from rowstore.reader import Reader

    kinds = ["Reader.batches", "torch BatchedDataLoader", "tf make_dataset"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tiny.h5")
        make_demo("tiny", path, rows=args.rows)
        with Reader(path) as r:
            quality = {c: r.shuffle_quality(1024, seed=1, **kw) for c, kw in CONFIGS.items()}
            for kind in kinds:  # warm up (imports, page cache)
                _epoch(kind, path, r, CONFIGS["window=16"])
            runs: dict = {(k, c): [] for k in kinds for c in CONFIGS}
            for _ in range(args.repeats):
                for kind in kinds:
                    for c, kw in CONFIGS.items():
                        t0, c0 = time.perf_counter(), time.process_time()
                        n = _epoch(kind, path, r, kw)
                        runs[(kind, c)].append(
                            (n / (time.perf_counter() - t0), n / (time.process_time() - c0))
                        )
    out = []
    for (kind, c), v in runs.items():
        out.append(
            {
                "path": kind,
                "config": c,
                "quality": quality[c],
                "rows_per_s": statistics.median(x for x, _ in v),
                "rows_per_cpu_s": statistics.median(y for _, y in v),
            }
        )
    base = {o["path"]: o for o in out if o["config"] == "window=16"}
    print(
        f"tiny demo, {args.rows:,} rows, batch 1024, medians of {args.repeats}; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("| path | config | quality | rows/s | rows per CPU s | CPU-s ratio vs window=16 |")
    print("|---|---|---:|---:|---:|---:|")
    for o in out:
        o["cpu_ratio_vs_window16"] = o["rows_per_cpu_s"] / base[o["path"]]["rows_per_cpu_s"]
        print(
            f"| {o['path']} | {o['config']} | {o['quality']:.3f} | {o['rows_per_s']:,.0f} | "
            f"{o['rows_per_cpu_s']:,.0f} | {o['cpu_ratio_vs_window16']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": args.rows,
                    "repeats": args.repeats,
                    "load_average": os.getloadavg(),
                    "results": out,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
