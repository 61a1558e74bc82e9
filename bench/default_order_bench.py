"""The default block order against the old one: shuffle quality and speed per workload.

    python bench/default_order_bench.py [--repeats 5] [--batch 256] [--threads N] [--json out.json]
    python bench/default_order_bench.py --baseline DIR [--pairs 15] [--epochs 10] ...

On the four bench workloads (demo schemas ``tiny``, ``patch``, ``image``, ``speech``, 1 MiB
blocks, uncompressed and LZ4) it reads one epoch with ``Reader.batches`` per order
configuration, every batch touched, configurations interleaved within each repeat (their order
reversed every other repeat); medians of ``--repeats``. ``--threads``: reader threads (default:
the reader's). ``default`` is what the reader resolves with no ``window``/``pieces`` given;
``window=16`` is the old default (16 whole blocks). Quality is exact (computed from the block
index); rows per CPU second of this process (user + system) are given beside wall rows/s since
a shared machine makes wall time noisy, and the speed ratios against ``window=16`` are the
medians of the per-repeat ratios.

``--baseline DIR``: the default order against *today's* default as another checkout reads it
(``DIR``, its kernels built in place: ``git worktree add DIR REV && cd DIR && python setup.py
build_ext --inplace``): each pair is two fresh processes back to back over the same file, this
checkout's default and ``DIR``'s ``window=16``, each timing ``--epochs`` epochs after one
(rows per CPU second, median); the figure is the median of ``--pairs`` pair ratios, since one
configuration's rate drifts between processes here more than it differs between orders.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# The checkout whose rowstore this process imports: this one, or --baseline's in its children.
sys.path.insert(
    0,
    os.environ.get("ROWSTORE_TREE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
)

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


def _child(path: str, kw: dict, batch: int, epochs: int, threads: int | None) -> None:
    """One process's figure (``--child``): rows per CPU second, median of ``epochs`` epochs
    after one, printed as JSON."""
    with rowstore.open(path) as r:
        _epoch(r, batch, kw, threads)
        rates = [_epoch(r, batch, kw, threads)[1] for _ in range(epochs)]
    print(json.dumps({"rows_per_cpu_s": statistics.median(rates), "module": rowstore.__file__}))


def _in_process(tree: str, path: str, kw: dict, args) -> float:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", path, "--kw", json.dumps(kw)]
    cmd += ["--batch", str(args.batch), "--epochs", str(args.epochs)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, ROWSTORE_TREE=tree)
    got = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True).stdout)
    if not got["module"].startswith(os.path.join(os.path.abspath(tree), "")):
        raise SystemExit(f"{tree}: imported rowstore from {got['module']}")
    return got["rows_per_cpu_s"]


def _demo_files(args):
    """``(workload, compression, path)`` of each demo file the run reads, written into a
    temporary directory that lasts while the run iterates."""
    with tempfile.TemporaryDirectory(prefix="default_order") as d:
        for name in args.workloads:
            for comp in args.compression:
                path = os.path.join(d, f"{name}-{comp}.h5")
                make_demo(name, path, WORKLOADS[name], compression=None if comp == "none" else comp)
                yield name, comp, path


def against_baseline(args) -> list[dict]:
    """This checkout's default order against ``args.baseline``'s ``window=16``, in pairs of
    fresh processes (see the module)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for name, comp, path in _demo_files(args):
        with rowstore.open(path) as r:
            quality = r.shuffle_quality(args.batch, seed=1)
            old_quality = r.shuffle_quality(args.batch, seed=1, window=16, pieces=1)
            resolved = _resolved(r, {})
        pairs = []
        for i in range(args.pairs):
            one = [
                (here, {}),
                (args.baseline, {"window": 16, "pieces": 1}),
            ]
            if i % 2:
                one.reverse()
            got = {t: _in_process(t, path, kw, args) for t, kw in one}
            pairs.append((got[here], got[args.baseline]))
        ratios = sorted(a / b for a, b in pairs)
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        out.append(
            {
                "workload": name,
                "compression": comp,
                **resolved,
                "quality": quality,
                "baseline_quality": old_quality,
                "rows_per_cpu_s": statistics.median(a for a, _ in pairs),
                "baseline_rows_per_cpu_s": statistics.median(b for _, b in pairs),
                "ratio": statistics.median(ratios),
                "quartiles": [q[0], q[2]],
                "pairs": len(pairs),
            }
        )
        o = out[-1]
        print(
            f"| {name} | {comp} | {o['window']} | {o['pieces']} | "
            f"{old_quality:.3f} -> {quality:.3f} | {o['baseline_rows_per_cpu_s']:,.0f} | "
            f"{o['rows_per_cpu_s']:,.0f} | {o['ratio']:.2f}x | "
            f"{q[0]:.2f}-{q[2]:.2f} |",
            flush=True,
        )
    return out


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
    ap.add_argument("--baseline", help="a checkout whose window=16 is today's default")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--kw", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, json.loads(args.kw), args.batch, args.epochs, args.threads)
        return
    if args.baseline:
        out = against_baseline(args)
        print(f"batch {args.batch}, {args.pairs} pairs; load {os.getloadavg()[0]:.1f}")
        _save(
            args.json,
            pairs=args.pairs,
            epochs=args.epochs,
            baseline=os.path.abspath(args.baseline),
            results=out,
            args=args,
        )
        return
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
