"""Paired A/B of two checkouts on the four read workloads: this checkout's read speed against
another's, in the same run, as ratios that hold while a shared machine's speed drifts.

    python bench/ab.py --baseline DIR [--pairs 15] [--epochs 8] [--threads N] [--batch 256]
        [--workloads tiny patch image speech] [--compression none lz4] [--shuffle block full]
        [--kw JSON] [--baseline-kw JSON] [--scale F] [--cache-dir DIR] [--out FILE.json]

``DIR`` is another checkout with its kernels built in place (``git worktree add DIR REV && cd
DIR && python setup.py build_ext --inplace``). The demo workloads (``rowstore.demo.make_demo``,
1 MiB blocks, uncompressed and LZ4) are written once by ``DIR``'s code into ``--cache-dir``, so
both sides read the same bytes, which both can read. Each pair is two fresh processes back to
back over the same file, one importing each checkout's ``rowstore``, which goes first
alternating between pairs; each process reads one untimed epoch of ``Reader.batches``
(``--shuffle``, block by default; seed 1), then ``--epochs`` timed epochs, every field of every
batch touched, and its figure is the median over those epochs of rows per CPU second (user +
system of the process, steadier than wall time on a shared machine) and of wall rows/s. Reported
per workload and compression: each side's median figure, and the median of the ``--pairs`` pair
ratios (this checkout / baseline) with their quartiles: one configuration's rate drifts between
processes more than a change to the read path usually moves it, so only the paired ratio
separates them.

Both sides read the reader's default order unless ``--kw`` / ``--baseline-kw`` give order
arguments as JSON (e.g. ``--baseline-kw '{"window": 16, "pieces": 1}'``: the default against 16
whole blocks).
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

#: workload -> rows (each epoch lasts a second or more here; ``--epochs`` of them per process)
WORKLOADS = {"tiny": 2_000_000, "patch": 6_000, "image": 600, "speech": 3_000}


def _touch(batch: dict) -> int:
    """Read one value every 4 KiB of every array of the batch, as a consumer would; its rows."""
    import numpy as np

    n = 0
    for v in batch.values():
        a = getattr(v, "values", v)
        if isinstance(a, np.ndarray) and a.dtype != object and a.size:
            a.reshape(-1)[::4096].sum()
        n = len(v)
    return n


def _epoch(r, args: argparse.Namespace, kw: dict) -> tuple[float, float]:
    """One epoch: (wall rows/s, rows per CPU second)."""
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    shuffle = args.child_shuffle
    for b in r.batches(args.batch, shuffle=shuffle, seed=1, num_threads=args.threads, **kw):
        n += _touch(b)
    return n / (time.perf_counter() - t0), n / max(1e-9, time.process_time() - c0)


def _child(args: argparse.Namespace) -> None:
    """One process of a pair (``--child``), importing ``rowstore`` from ``ROWSTORE_TREE``: its
    figures, or with ``--make`` the demo files written, printed as JSON."""
    sys.path.insert(0, os.environ["ROWSTORE_TREE"])
    import rowstore
    from rowstore.demo import make_demo

    if args.make:
        for name, comp, path in _files(args):
            if not os.path.exists(path):
                rows = _rows(name, args)
                make_demo(name, path, rows, compression=None if comp == "none" else comp)
        print(json.dumps({"module": rowstore.__file__}))
        return
    with rowstore.open(args.child) as r:
        kw = json.loads(args.child_kw)
        _epoch(r, args, kw)
        rates = [_epoch(r, args, kw) for _ in range(args.epochs)]
    print(
        json.dumps(
            {
                "module": rowstore.__file__,
                "rows_per_s": statistics.median(w for w, _ in rates),
                "rows_per_cpu_s": statistics.median(c for _, c in rates),
            }
        )
    )


def _rows(name: str, args: argparse.Namespace) -> int:
    return max(1, int(WORKLOADS[name] * args.scale))


def _files(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """``(workload, compression, path)`` of every file the run reads."""
    return [
        (name, comp, os.path.join(args.cache_dir, f"{name}-{_rows(name, args)}-{comp}.h5"))
        for name in args.workloads
        for comp in args.compression
    ]


def _run(tree: str, args: argparse.Namespace, extra: list[str]) -> dict:
    """A fresh process importing ``tree``'s ``rowstore``; checks that it did."""
    cmd = [sys.executable, os.path.abspath(__file__), "--batch", str(args.batch)]
    cmd += ["--epochs", str(args.epochs), "--cache-dir", args.cache_dir, "--scale", str(args.scale)]
    cmd += ["--workloads", *args.workloads, "--compression", *args.compression]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, ROWSTORE_TREE=tree)
    res = subprocess.run(cmd + extra, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"the process for {tree} failed:\n{res.stderr}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    if not got["module"].startswith(os.path.join(os.path.abspath(tree), "")):
        raise SystemExit(f"{tree}: imported rowstore from {got['module']}")
    return got


def _quartiles(xs: list[float]) -> list[float]:
    if len(xs) < 2:
        return [xs[0], xs[0]]
    q = statistics.quantiles(xs, n=4)
    return [q[0], q[2]]


def compare(args: argparse.Namespace) -> list[dict]:
    """Every file read in ``--pairs`` pairs of processes (see the module)."""
    base = os.path.abspath(args.baseline)
    _run(base, args, ["--make"])
    sides = {"this": (ROOT, args.kw), "baseline": (base, args.baseline_kw)}
    out = []
    for name, comp, path, shuffle in [(*f, sh) for f in _files(args) for sh in args.shuffle]:
        pairs = []
        for i in range(args.pairs):
            order = ["this", "baseline"] if i % 2 == 0 else ["baseline", "this"]
            child = ["--child", path, "--child-shuffle", shuffle]
            got = {s: _run(sides[s][0], args, [*child, "--child-kw", sides[s][1]]) for s in order}
            pairs.append(got)
        cpu = [p["this"]["rows_per_cpu_s"] / p["baseline"]["rows_per_cpu_s"] for p in pairs]
        wall = [p["this"]["rows_per_s"] / p["baseline"]["rows_per_s"] for p in pairs]
        row = {"workload": name, "compression": comp, "shuffle": shuffle, "pairs": len(pairs)}
        for s in sides:
            row[f"{s}_rows_per_cpu_s"] = statistics.median(p[s]["rows_per_cpu_s"] for p in pairs)
            row[f"{s}_rows_per_s"] = statistics.median(p[s]["rows_per_s"] for p in pairs)
        row.update(
            cpu_ratio=statistics.median(cpu),
            cpu_quartiles=_quartiles(cpu),
            wall_ratio=statistics.median(wall),
            wall_quartiles=_quartiles(wall),
        )
        out.append(row)
        print(
            f"| {name} | {comp} | {shuffle} | {row['baseline_rows_per_cpu_s']:,.0f} | "
            f"{row['this_rows_per_cpu_s']:,.0f} | {row['cpu_ratio']:.3f}x "
            f"({row['cpu_quartiles'][0]:.3f}-{row['cpu_quartiles'][1]:.3f}) | "
            f"{row['wall_ratio']:.3f}x |",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--baseline", help="the other checkout (kernels built in place)")
    ap.add_argument("--pairs", type=int, default=15, help="pairs of processes per file")
    ap.add_argument("--epochs", type=int, default=8, help="timed epochs per process, after one")
    ap.add_argument("--threads", type=int, default=None, help="reader threads (default: its own)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--compression", nargs="+", choices=["none", "lz4", "zstd"])
    ap.add_argument("--scale", type=float, default=1.0, help="rows: this times the default")
    ap.add_argument("--shuffle", nargs="+", choices=["block", "full", "none"], default=["block"])
    ap.add_argument("--kw", default="{}", help="this checkout's order arguments (JSON)")
    ap.add_argument("--baseline-kw", default="{}", help="the baseline's order arguments (JSON)")
    ap.add_argument("--cache-dir", default=os.path.join(ROOT, ".cache", "bench_ab"))
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-kw", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--child-shuffle", default="block", help=argparse.SUPPRESS)
    ap.add_argument("--make", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.compression = args.compression or ["none", "lz4"]
    args.cache_dir = os.path.abspath(args.cache_dir)
    if args.child or args.make:
        _child(args)
        return 0
    if not args.baseline:
        ap.error("--baseline is required")
    json.loads(args.kw), json.loads(args.baseline_kw)  # refuse bad JSON before the run
    os.makedirs(args.cache_dir, exist_ok=True)
    head = ["workload", "compression", "shuffle", "baseline rows/CPU s", "this rows/CPU s"]
    print("| " + " | ".join([*head, "ratio", "wall"]) + " |")
    print("|---|---|---|---:|---:|---:|---:|")
    results = compare(args)
    load = os.getloadavg()
    print(f"batch {args.batch}, {args.pairs} pairs of {args.epochs} epochs; load {load[0]:.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "baseline": os.path.abspath(args.baseline),
                    "batch": args.batch,
                    "threads": args.threads,
                    "pairs": args.pairs,
                    "epochs": args.epochs,
                    "kw": json.loads(args.kw),
                    "baseline_kw": json.loads(args.baseline_kw),
                    "load_average": load,
                    "results": results,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
