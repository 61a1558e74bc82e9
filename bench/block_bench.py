"""Block mode, gather bandwidth and shuffle quality: block (whole blocks and pieces) and full
shuffle against memcpy, in the same process.

    python bench/block_bench.py [--reps 5] [--rounds 2] [--out bench/results/block_bench.json]
                                [--cache-dir DIR]

Each workload runs in a fresh process per round: the demo file is opened, every configuration
reads one warm-up epoch, then ``--reps`` epochs each, configurations interleaved, every batch
touched (``rowstore.bench.measure.touch_batch``); the process also times ``np.copyto`` of the
epoch's bytes between two prefaulted buffers (``memcpy``) in the same rounds. Reported: medians
of wall time and of process CPU time (user + system; steadier than wall time on a loaded
machine), and each configuration's GB/s as a fraction of that process's memcpy. The shuffle
quality of each configuration is :meth:`rowstore.reader.Reader.shuffle_quality` of its epoch
order. To compare two checkouts, use ``bench/ab.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: workload -> (rows, batch sizes)
WORKLOADS = {
    "tiny": (2_000_000, [1024]),
    "patch": (20_000, [128, 1024]),
    "speech": (6_000, [64, 256]),
    "image": (600, [64]),
}
#: (shuffle, window, pieces): today's two modes, then the pieces curve (block mode)
CONFIGS = [
    ("block", 16, 1),
    ("full", 16, 1),
    ("block", 128, 8),
    ("block", 128, 32),
    ("block", 256, 64),
]


def child(spec: dict[str, Any]) -> None:
    import resource

    import numpy as np

    from rowstore.bench import measure as M
    from rowstore.reader import Reader

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    r = Reader(spec["path"])
    has_pieces = "pieces" in Reader.batches.__code__.co_varnames
    cfgs = [tuple(c) for c in spec["configs"] if has_pieces or c[2] == 1]
    out: list[dict[str, Any]] = []
    bufs: dict[str, Any] = {}
    for B in spec["batches"]:

        def run(c: tuple, ep: int, B: int = B) -> tuple[int, int, float, float]:
            shuffle, window, pieces = c
            if shuffle == "memcpy":
                t, c0 = time.perf_counter(), cpu()
                np.copyto(bufs["dst"], bufs["src"])
                return len(r), bufs["src"].nbytes, time.perf_counter() - t, cpu() - c0
            kw = {"pieces": pieces} if has_pieces else {}
            n = nb = 0
            t, c0 = time.perf_counter(), cpu()
            for b in r.batches(
                B,
                shuffle=shuffle,
                seed=1,
                epoch=ep,
                window=window,
                num_threads=spec["threads"],
                **kw,
            ):
                nb += M.touch_batch(b, [k for k in b if not k.startswith("__")])[0]
                n += len(next(iter(b.values())))
            return n, nb, time.perf_counter() - t, cpu() - c0

        nbytes = run(cfgs[0], 99)[1]
        bufs["src"], bufs["dst"] = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        allc = cfgs + [("memcpy", 0, 1)]
        for c in allc:
            run(c, 99)  # warm-up
        res: dict[tuple, list] = {c: [] for c in allc}
        for k in range(spec["reps"]):
            for c in allc:
                res[c].append(run(c, k))
        mc = statistics.median(x[1] / x[2] for x in res[("memcpy", 0, 1)])
        for c in allc:
            rr = res[c]
            wall, cp = statistics.median(x[2] for x in rr), statistics.median(x[3] for x in rr)
            d = {
                "batch": B,
                "shuffle": c[0],
                "window": c[1],
                "pieces": c[2],
                "rows": rr[0][0],
                "bytes": rr[0][1],
                "wall_s": wall,
                "cpu_s": cp,
                "rows_per_s": rr[0][0] / wall,
                "gb_per_s": rr[0][1] / wall / 1e9,
                "rows_per_cpu_s": rr[0][0] / cp,
                "memcpy_gb_per_s": mc / 1e9,
                "fraction_of_memcpy": rr[0][1] / wall / mc,
            }
            if c[0] != "memcpy":
                d["quality"] = r.shuffle_quality(
                    B, shuffle=c[0], window=c[1], **({"pieces": c[2]} if has_pieces else {})
                )
            out.append(d)
    print("RESULT " + json.dumps(out), flush=True)


def markdown(doc: dict[str, Any]) -> str:
    """Tables of a run: per workload and batch, each configuration's medians over the rounds
    (rows/s, % of the same process's memcpy, rows per CPU second, quality)."""
    from collections import defaultdict

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for d in doc["results"]:
        groups[
            (d["workload"], d["batch"], d["shuffle"], d["window"], d["pieces"], d["tree"])
        ].append(d)

    def med(rs: list[dict], k: str) -> float:
        return statistics.median(r[k] for r in rs)

    lines = []
    keys = sorted(
        {(w, b) for w, b, *_ in groups}, key=lambda t: (list(WORKLOADS).index(t[0]), t[1])
    )
    for w, b in keys:
        lines += [
            f"**{w}, batch {b}**",
            "",
            "| config | tree | rows/s | % memcpy | rows per CPU s | quality |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for (w2, b2, sh, win, k, tree), rs in sorted(groups.items(), key=lambda t: t[0][2:5]):
            if (w2, b2) != (w, b) or sh == "memcpy":
                continue
            cfg = "full" if sh == "full" else f"block W={win}" + (f" pieces={k}" if k > 1 else "")
            lines.append(
                f"| {cfg} | {tree} | {med(rs, 'rows_per_s'):,.0f} | "
                f"{100 * med(rs, 'fraction_of_memcpy'):.1f}% "
                f"| {med(rs, 'rows_per_cpu_s'):,.0f} | {rs[0]['quality']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    # image is PNG-decode bound (read_bench.py measures it); its quality curve: --workloads image
    ap.add_argument(
        "--workloads", nargs="+", default=["tiny", "patch", "speech"], choices=list(WORKLOADS)
    )
    ap.add_argument(
        "--cache-dir",
        default=os.environ.get("ROWSTORE_CACHE", os.path.join(ROOT, ".cache", "rowstore")),
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "block_bench.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--report", default=None, help="print the markdown tables of a JSON result and exit"
    )
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as fh:
            print(markdown(json.load(fh)))
        return 0
    if args.child:
        child(json.loads(args.child))
        return 0
    sys.path.insert(0, ROOT)
    from rowstore.bench.cli import ensure_demo
    from rowstore.bench.measure import machine_info

    trees = [("current", ROOT)]
    doc: dict[str, Any] = {
        "tool": "bench/block_bench.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "trees": dict(trees),
        "reps": args.reps,
        "rounds": args.rounds,
        "threads": args.threads,
        "results": [],
    }
    for name in args.workloads:
        rows, batches = WORKLOADS[name]
        path = ensure_demo(name, rows, args.cache_dir, log=print)
        for rnd in range(args.rounds):
            for label, tree in trees:
                spec = {
                    "path": path,
                    "batches": batches,
                    "configs": CONFIGS,
                    "reps": args.reps,
                    "threads": args.threads,
                }
                env = dict(os.environ, PYTHONPATH=tree)
                load = os.getloadavg()
                p = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=tree,
                    timeout=1800,
                )
                line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(p.stdout[-2000:], p.stderr[-4000:])
                    return 1
                for d in json.loads(line[7:]):
                    d.update(workload=name, tree=label, round=rnd, load_avg=list(load))
                    doc["results"].append(d)
                    print(
                        f"{name:6s} {label:6s} r{rnd} B={d['batch']:5d} {d['shuffle']:6s} "
                        f"W={d['window']:3d} "
                        f"k={d['pieces']:2d} {d['rows_per_s'] / 1e3:9.1f} k rows/s "
                        f"{d['gb_per_s']:6.2f} GB/s "
                        f"{100 * d['fraction_of_memcpy']:5.1f}% memcpy, "
                        f"{d['rows_per_cpu_s'] / 1e3:9.1f} k rows/cpu-s"
                        f" q={d.get('quality', float('nan')):.3f}  (load {load[0]:.1f})",
                        flush=True,
                    )
    doc["load_avg_end"] = list(os.getloadavg())
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(markdown(doc))
    print("written", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
