"""Before/after benchmark of the core reader: this checkout against a baseline checkout, in the
same run, interleaved (A B A B ...), so a change to the read path is judged by ratios that hold
while the shared machine's speed drifts.

    python bench/reader_ab.py --baseline /path/to/old/checkout [--repeats 7] [--out FILE.json]

Each measurement is one process per checkout (``--child``) that imports ``rowstore`` from its
checkout, reads one warm-up epoch and then ``--epochs`` epochs of ``Reader.batches`` on each of
the four workloads of DESIGN.md (block shuffle; ``patch`` also uniform), touching every batch,
and prints rows/s per epoch. Datasets are written once by the baseline checkout (so both read
the same bytes) into ``--cache-dir``. The report gives, per workload, the median rows/s of each
side and the median of the per-pair ratios (new / baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: name -> (rows, batch size, shuffles)
WORKLOADS = {
    "tiny": (1_000_000, 1024, ["block"]),
    "patch": (8_000, 128, ["block", "full"]),
    "image": (600, 64, ["block"]),
    "speech": (6_000, 64, ["block"]),
}


def _child(args: argparse.Namespace) -> int:
    sys.path.insert(0, os.getcwd())
    import numpy as np

    import rowstore
    from rowstore.demo import make_demo

    out = {"rowstore": os.path.dirname(rowstore.__file__)}
    for name in args.workloads:
        rows, batch, shuffles = WORKLOADS[name]
        path = os.path.join(args.cache_dir, f"{name}-{rows}.h5")
        if not os.path.exists(path):
            make_demo(name, path, rows)
        if args.make_only:
            continue
        with open(path, "rb") as f:  # warm the page cache
            while f.read(16 << 20):
                pass
        reader = rowstore.open(path)
        for shuffle in shuffles:
            rates = []
            for e in range(args.epochs + 1):
                t = time.perf_counter()
                n = 0
                for b in reader.batches(
                    batch, shuffle=shuffle, seed=1, epoch=e, num_threads=args.threads
                ):
                    for v in b.values():  # touch every field, as a consumer would
                        a = getattr(v, "values", v)
                        if isinstance(a, np.ndarray) and a.dtype != object and a.size:
                            a.reshape(-1)[::4096].sum()
                    n += len(next(iter(b.values())))
                if e:  # epoch 0 is the warm-up
                    rates.append(n / (time.perf_counter() - t))
            out[f"{name}/{shuffle}"] = rates
        reader.close()
    print(json.dumps(out))
    return 0


def _run(checkout: str, args: argparse.Namespace, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--cache-dir",
        args.cache_dir,
        "--epochs",
        str(args.epochs),
        "--threads",
        str(args.threads),
        "--workloads",
        *args.workloads,
        *extra,
    ]
    res = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"child in {checkout} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="checkout to compare against (built in place)")
    ap.add_argument("--repeats", type=int, default=5, help="A/B pairs of processes")
    ap.add_argument(
        "--epochs", type=int, default=3, help="timed epochs per process (after one warm-up)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--cache-dir", default=os.path.join(ROOT, ".cache", "reader_ab"))
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--make-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.cache_dir = os.path.abspath(args.cache_dir)
    if args.child:
        return _child(args)
    if not args.baseline:
        ap.error("--baseline is required")
    os.makedirs(args.cache_dir, exist_ok=True)
    _run(args.baseline, args, ["--make-only"])
    sides: dict[str, dict[str, list[float]]] = {"new": {}, "base": {}}
    ratios: dict[str, list[float]] = {}
    for i in range(args.repeats):
        pair = {}
        for side, checkout in (
            (("base", args.baseline), ("new", ROOT))
            if i % 2
            else (("new", ROOT), ("base", args.baseline))
        ):
            pair[side] = _run(checkout, args, [])
        for key in pair["new"]:
            if key == "rowstore":
                continue
            new, base = statistics.median(pair["new"][key]), statistics.median(pair["base"][key])
            sides["new"].setdefault(key, []).append(new)
            sides["base"].setdefault(key, []).append(base)
            ratios.setdefault(key, []).append(new / base)
        print(f"pair {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    print(
        f"{'workload':<14} {'baseline rows/s':>16} {'new rows/s':>14} "
        f"{'new/base (median, min-max)':>30}"
    )
    report = {}
    for key, rs in ratios.items():
        b, n = statistics.median(sides["base"][key]), statistics.median(sides["new"][key])
        report[key] = {
            "baseline": b,
            "new": n,
            "ratio_median": statistics.median(rs),
            "ratio_min": min(rs),
            "ratio_max": max(rs),
        }
        print(
            f"{key:<14} {b:>16,.0f} {n:>14,.0f} {statistics.median(rs):>12.3f} "
            f"({min(rs):.3f}-{max(rs):.3f})"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "epochs": args.epochs,
                    "results": report,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
