"""The default block order against other orders: shuffle quality and speed per workload.

    python bench/default_order_bench.py [--repeats 5] [--batch 256] [--threads N] [--json out.json]

On the four bench workloads (demo schemas ``tiny``, ``patch``, ``image``, ``speech``, 1 MiB
blocks, uncompressed and LZ4) it reads one epoch with ``Reader.batches`` per order
configuration, every batch touched, configurations interleaved within each repeat (their order
reversed every other repeat); medians of ``--repeats``. ``--threads``: reader threads (default:
the reader's). ``default`` is what the reader resolves with no ``window``/``pieces`` given;
``window=16`` is 16 whole blocks, the reference of the ratios. Quality is exact (computed from
the block index); rows per CPU second of this process (user + system) are given beside wall
rows/s since a shared machine makes wall time noisy, and the speed ratios against ``window=16``
are the medians of the per-repeat ratios. To compare the default with another checkout's
reading, use ``bench/ab.py`` (paired fresh processes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# The rowstore of this checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rowstore  # noqa: E402
from rowstore.demo import make_demo  # noqa: E402

WORKLOADS = {"tiny": 2_000_000, "patch": 6_000, "image": 600, "speech": 3_000}
CONFIGS = {
    "window=16": dict(window=16, pieces=1),
    "default": dict(),
    "window=128 pieces=8": dict(window=128, pieces=8),
    "window=64 pieces=4": dict(window=64, pieces=4),
}


def _epoch(r, batch: int, kw: dict, threads: int | None = None) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for b in r.batches(batch, seed=1, num_threads=threads, **kw):
        v = next(iter(b.values()))
        n += len(v)
    return n / (time.perf_counter() - t0), n / max(1e-9, time.process_time() - c0)


def _demo_files(args):
    """``(workload, compression, path)`` of each demo file the run reads, written into a
    temporary directory that lasts while the run iterates."""
    with tempfile.TemporaryDirectory(prefix="default_order") as d:
        for name in args.workloads:
            for comp in args.compression:
                path = os.path.join(d, f"{name}-{comp}.h5")
                make_demo(name, path, WORKLOADS[name], compression=None if comp == "none" else comp)
                yield name, comp, path


def _save(path: str | None, *, args, results: list[dict], **meta) -> None:
    """The run's JSON (batch, threads, load average, ``meta`` and the results) at ``path``."""
    if path:
        head = {"batch": args.batch, "threads": args.threads, "load_average": os.getloadavg()}
        with open(path, "w") as f:
            json.dump({**head, **meta, "results": results}, f, indent=1)


def _resolved(r, kw: dict) -> dict:
    window, pieces = r.order_defaults("block", kw.get("window"), kw.get("pieces"))
    return {"window": window, "pieces": pieces}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--compression", nargs="+", default=["none", "lz4"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = []
    for name, comp, path in _demo_files(args):
        with rowstore.open(path) as r:
            runs: dict = {c: [] for c in CONFIGS}
            for kw in CONFIGS.values():  # warm up: page cache, imports, page checks
                _epoch(r, args.batch, kw, args.threads)
            for i in range(args.repeats):
                names = list(CONFIGS) if i % 2 == 0 else list(CONFIGS)[::-1]
                for c in names:
                    runs[c].append(_epoch(r, args.batch, CONFIGS[c], args.threads))
            for c, kw in CONFIGS.items():
                base = runs["window=16"]
                out.append(
                    {
                        "workload": name,
                        "compression": comp,
                        "rows_per_block": r.layout.rows_per_block,
                        "config": c,
                        **_resolved(r, kw),
                        "quality": r.shuffle_quality(args.batch, seed=1, **kw),
                        "rows_per_s": statistics.median(w for w, _ in runs[c]),
                        "rows_per_cpu_s": statistics.median(p for _, p in runs[c]),
                        "cpu_ratio": statistics.median(
                            p / bp for (_, p), (_, bp) in zip(runs[c], base)
                        ),
                        "wall_ratio": statistics.median(
                            w / bw for (w, _), (bw, _) in zip(runs[c], base)
                        ),
                    }
                )
                o = out[-1]
                print(
                    f"| {name} | {comp} | {c} | {o['window']} | {o['pieces']} | "
                    f"{o['quality']:.3f} | {o['rows_per_s']:,.0f} | "
                    f"{o['rows_per_cpu_s']:,.0f} | {o['cpu_ratio']:.2f}x | "
                    f"{o['wall_ratio']:.2f}x |",
                    flush=True,
                )
    print(f"batch {args.batch}, medians of {args.repeats}; load {os.getloadavg()[0]:.1f}")
    _save(
        args.json,
        repeats=args.repeats,
        note="machine shared with other jobs: ratios are same-run, medians",
        results=out,
        args=args,
    )


if __name__ == "__main__":
    main()
