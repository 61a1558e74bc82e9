"""What the default checks cost in the first epoch: ``verify=True`` against ``verify=False``.

    python bench/verify_bench.py [--repeats 4] [--workloads tiny,patch,image,speech] [--out PATH]
                                 [--clock wall|cpu]

For each of the four workloads of DESIGN.md (written once with ``rowstore.demo.make_demo`` into
the cache directory, small blocks so that even these small files hold hundreds of them),
uncompressed and LZ4, ``block`` and ``full`` shuffle, and the uncompressed patch and speech
files rewritten as dataset directories of 4 shards (``--dataset-workloads``): epoch 0 of a fresh
``Reader`` (the state
of every new DDP rank, DataLoader worker or restarted job) in a fresh process, warm page cache,
2 threads. Each of ``--repeats`` fresh processes per configuration times pairs of fresh
readers, one ``verify=True`` and one ``verify=False`` back to back (which goes first
alternates), for two seconds or more: the ratio of a configuration is the median over its
pairs' ratios (``True / False``; 1.0: the checks cost nothing), with the medians of each mode's
rates beside it. Rates of one configuration drift 10-30% between processes on these shared
machines (the page cache's state, other tenants); the two readers of a pair are timed a few
tenths of a second apart, so drifts hit both alike (``--clock cpu`` divides by the process's
CPU time instead of wall time: steadier where other processes share the cores). Writes a
JSON (every pair) to
``bench/results/verify_bench.json``. Runs in about ten minutes on 2 cores.
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
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

#: name -> rows, block bytes, batch size
WORKLOADS: dict[str, dict[str, int]] = {
    "tiny": {"rows": 1_000_000, "block_bytes": 64 << 10, "batch": 1024},
    "patch": {"rows": 6_000, "block_bytes": 256 << 10, "batch": 256},
    "image": {"rows": 1_200, "block_bytes": 64 << 10, "batch": 64},
    "speech": {"rows": 3_000, "block_bytes": 64 << 10, "batch": 64},
}
COMPRESSIONS = ("none", "lz4")
SHUFFLES = ("block", "full")
THREADS = 2
#: Pairs of fresh readers timed per process: at least this many, and for at least this long.
MIN_PAIRS = 3
MIN_SECONDS = 2.0
#: A full-shuffle epoch of compressed blocks (a window of blocks decompressed per segment of
#: rows) stops after this long: its rate then covers the part read, which is representative
#: (its checks are spread over the epoch). Other orders run whole (a segment may be the epoch).
MAX_EPOCH_SECONDS = 2.0


def dataset(name: str, compression: str, cache_dir: str) -> str:
    """The workload's file in the cache directory (written on first use)."""
    from rowstore.demo import make_demo

    w = WORKLOADS[name]
    path = os.path.join(cache_dir, f"{name}-{w['rows']}-{w['block_bytes']}-{compression}.h5")
    if not os.path.exists(path):
        os.makedirs(cache_dir, exist_ok=True)
        print(f"writing {path} ...", flush=True)
        make_demo(
            name,
            path + ".tmp",
            w["rows"],
            compression=None if compression == "none" else compression,
            block_bytes=w["block_bytes"],
        )
        os.replace(path + ".tmp", path)
    return path


def dataset_dir(name: str, cache_dir: str, shards: int) -> str:
    """The workload's uncompressed file rewritten as a dataset directory of about ``shards``
    shards (opened from its manifest, as datasets are)."""
    import rowstore

    src = dataset(name, "none", cache_dir)
    w = WORKLOADS[name]
    path = os.path.join(cache_dir, f"{name}-{w['rows']}-{w['block_bytes']}-none-{shards}shards")
    if not os.path.exists(path):
        print(f"writing {path} ...", flush=True)
        with (
            rowstore.open(src, verify=False) as r,
            rowstore.DatasetWriter(
                path + ".tmp",
                r.schema,
                block_bytes=w["block_bytes"],
                shard_bytes=-(-os.path.getsize(src) // shards),
            ) as dw,
        ):
            for b in r.batches(1000, shuffle="none"):
                dw.write_batch(b)
        os.replace(path + ".tmp", path)
    return path


def _epoch(opts: dict[str, Any], verify: bool, seed: int) -> float:
    """Rows/s of epoch 0 of one fresh Reader (nothing it checks carries over from another):
    per second of wall time, or of the process's CPU time (all its threads) with
    ``opts["clock"] == "cpu"``."""
    import rowstore

    clock = time.process_time if opts.get("clock") == "cpu" else time.perf_counter
    t0, c0 = time.perf_counter(), clock()
    n = 0
    with rowstore.open(opts["path"], verify=verify, num_threads=THREADS) as r:
        for b in r.batches(opts["batch"], shuffle=opts["shuffle"], seed=seed, epoch=0):
            n += len(next(iter(b.values())))
            if opts.get("cap") and time.perf_counter() - t0 > MAX_EPOCH_SECONDS:
                break  # full shuffle of compressed blocks (window segments): part of epoch 0
    return n / (clock() - c0)


def one_process(opts: dict[str, Any]) -> dict[str, Any]:
    """Pairs of fresh Readers, one ``verify=True`` and one ``verify=False`` back to back (which
    goes first alternates), in this fresh process after one untimed reader of each, at least
    ``MIN_PAIRS`` pairs and for at least ``MIN_SECONDS``: each pair's ratio, and each mode's
    rates. A pair is read a few tenths of a second apart, so the machine's drifts (10-30%
    between processes here) hit both of its readers alike."""
    import rowstore

    with rowstore.open(opts["path"], verify=False) as r:
        version = rowstore.Layout.open(r.layout.shard_paths[0]).version
    _epoch(opts, True, 0)
    _epoch(opts, False, 0)
    rates: dict[bool, list[float]] = {True: [], False: []}
    ratios: list[float] = []
    t_all = time.perf_counter()
    while len(ratios) < MIN_PAIRS or time.perf_counter() - t_all < MIN_SECONDS:
        j = len(ratios)
        order = (True, False) if (j + opts["repeat"]) % 2 == 0 else (False, True)
        got = {v: _epoch(opts, v, 1000 * opts["repeat"] + j) for v in order}
        for v in got:
            rates[v].append(got[v])
        ratios.append(got[True] / got[False])
    return {"ratios": ratios, "true": rates[True], "false": rates[False], "format_version": version}


def _run_child(opts: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--one", json.dumps(opts)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--repeats",
        type=int,
        default=4,
        help="fresh processes per configuration (even: each mode goes first as often)",
    )
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--compressions", default=",".join(COMPRESSIONS))
    ap.add_argument("--shuffles", default=",".join(SHUFFLES))
    ap.add_argument(
        "--dataset-workloads",
        default="patch,speech",
        help="also read these uncompressed workloads as dataset directories ('' for none)",
    )
    ap.add_argument("--dataset-shards", type=int, default=4)
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time each reader by wall time, or by the process's CPU time (rows per CPU "
        "second: steadier where other processes share the cores)",
    )
    ap.add_argument(
        "--cache-dir",
        default=os.path.join(
            os.environ.get("ROWSTORE_CACHE", os.path.join(ROOT, ".cache", "rowstore")),
            "verify_bench",
        ),
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "verify_bench.json"))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one_process(json.loads(a.one))))
        return 0
    from rowstore.bench import measure

    results = []
    t_start = time.perf_counter()
    configs = [
        (name, comp, dataset(name, comp, a.cache_dir), "file")
        for name in a.workloads.split(",")
        for comp in a.compressions.split(",")
    ]
    configs += [
        (
            name,
            "none",
            dataset_dir(name, a.cache_dir, a.dataset_shards),
            f"{a.dataset_shards} shards",
        )
        for name in a.dataset_workloads.split(",")
        if name
    ]
    for name, comp, path, kind in configs:
        if True:
            measure.warm_cache([path])
            for shuffle in a.shuffles.split(","):
                runs: dict[str, list[float]] = {"ratios": [], "true": [], "false": []}
                version = None
                opts = {
                    "path": path,
                    "shuffle": shuffle,
                    "batch": WORKLOADS[name]["batch"],
                    "cap": comp != "none" and shuffle == "full",
                    "clock": a.clock,
                }
                for k in range(a.repeats):
                    got = _run_child(dict(opts, repeat=k))
                    for key in runs:
                        runs[key].extend(got[key])
                    version = got["format_version"]
                on, off = statistics.median(runs["true"]), statistics.median(runs["false"])
                ratio = statistics.median(runs["ratios"])
                row = {
                    "workload": name,
                    "compression": comp,
                    "shuffle": shuffle,
                    "format_version": version,
                    "kind": kind,
                    "verify_true_rows_per_s": on,
                    "verify_false_rows_per_s": off,
                    "ratio": ratio,
                    "pairs": len(runs["ratios"]),
                    "ratio_quartiles": statistics.quantiles(runs["ratios"], n=4),
                    "runs": runs,
                }
                results.append(row)
                print(
                    f"{name:7s} {kind:9s} {comp:5s} {shuffle:6s} v{version}  verify=True "
                    f"{on:>12,.0f} rows/s  "
                    f"verify=False {off:>12,.0f} rows/s  ratio {ratio:.2f} "
                    f"({len(runs['ratios'])} pairs)",
                    flush=True,
                )
    doc = {
        "bench": "verify_bench",
        "epoch": 0,
        "threads": THREADS,
        "clock": a.clock,
        "repeats": a.repeats,
        "workloads": {k: WORKLOADS[k] for k in a.workloads.split(",")},
        "results": results,
        "seconds": time.perf_counter() - t_start,
        "cpu_count": os.cpu_count(),
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(
        "\n| workload | as | compression | shuffle | verify=True rows/s | verify=False rows/s | "
        "ratio | quartiles | pairs |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['workload']} | {r['kind']} | {r['compression']} | {r['shuffle']} | "
            f"{r['verify_true_rows_per_s']:,.0f} | "
            f"{r['verify_false_rows_per_s']:,.0f} | {r['ratio']:.2f} | "
            f"{r['ratio_quartiles'][0]:.2f}-{r['ratio_quartiles'][2]:.2f} | {r['pairs']} |"
        )
    print(f"\nwrote {a.out} ({doc['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
