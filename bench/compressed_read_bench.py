"""Compressed against uncompressed epochs, per core, in the same process.

    python bench/compressed_read_bench.py [--reps 5] [--rounds 2]
                                          [--out bench/results/compressed_read.json]

Demo patch (6,000 rows) and speech (3,000 rows) files, each written uncompressed, Blosc2 LZ4
and Blosc2 Zstd (clevel 5, byte shuffle). Each workload runs in a fresh process per round with
one reader thread: an untimed epoch per file, then ``--reps`` block-order epochs per file, the
files interleaved, every batch touched; timed by process CPU time (user + system: steadier
than wall time on a shared machine).
Reported per file: stored/raw bytes, heap chunks loaded per epoch (the kernel's decompressions)
and the median epoch CPU time, and the speed ratio against the same process's uncompressed
file (``none`` CPU / file CPU; medians over rounds). Where the floor is: after each epoch of a
compressed file the process decompresses, from memory, every chunk such an epoch decompresses
(each block and compressed heap chunk once; memcpy'd chunks are read in place, not
decompressed); "the rest" is the epoch's CPU less that, against the uncompressed epoch, and
the floor ratio ``none / (none + decompression)`` is what the file would read at if
everything but the decompression cost what the uncompressed read costs.
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
WORKLOADS = {"patch": 6_000, "speech": 3_000}
COMPRESSIONS = {
    "none": None,
    "lz4": {"cname": "lz4", "clevel": 5, "shuffle": "byte"},
    "zstd": {"cname": "zstd", "clevel": 5, "shuffle": "byte"},
}


def child(spec: dict[str, Any]) -> None:
    import resource

    import numpy as np

    from rowstore import Layout, kernels
    from rowstore.bench.measure import touch_batch
    from rowstore.demo import make_demo
    from rowstore.reader import Reader

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    paths = {}
    for c, comp in COMPRESSIONS.items():
        path = os.path.join(spec["dir"], f"{spec['workload']}_{c}.h5")
        if not os.path.exists(path):
            make_demo(spec["workload"], path + ".tmp", spec["rows"], compression=comp)
            os.replace(path + ".tmp", path)
        paths[c] = path
    readers = {c: Reader(p, num_threads=1) for c, p in paths.items()}
    out: dict[str, Any] = {}
    for c, path in paths.items():
        L = Layout.open(path)
        a = L.arrays()
        raw = len(a["stored"]) * L.block_raw_bytes + len(a["hc_stored"]) * L.heap_chunk_bytes
        out[c] = {"stored_over_raw": (a["stored"].sum() + a["hc_stored"].sum()) / raw, "cpu": []}
    names = list(readers["none"].schema.names)

    def epoch(c: str, ep: int) -> float:
        r = readers[c]
        before = getattr(r._gatherer, "heap_chunks_loaded", None)
        t = cpu()
        for b in r.batches(64, shuffle="block", seed=0, epoch=ep):
            touch_batch(b, names)
        dt = cpu() - t
        if before is not None:
            out[c]["heap_chunks_per_epoch"] = r._gatherer.heap_chunks_loaded - before
        return dt

    def frames_of(c: str) -> list:
        """The stored frames of every chunk a block-order epoch decompresses (each block and
        each compressed heap chunk once; memcpy'd chunks are read in place), with raw sizes."""
        L, codec = readers[c].layout, readers[c]._gatherer.codec
        a = L.arrays()
        frames = []
        fd = os.open(paths[c], os.O_RDONLY)
        try:
            for offs, sizes, raw in (
                (a["offset"], a["stored"], L.block_raw_bytes),
                (a["hc_offset"], a["hc_stored"], L.heap_chunk_bytes),
            ):
                raw_at = kernels.memcpyed_starts(fd, offs, sizes, codec=codec, raw_size=raw)
                for off, n in zip(offs[raw_at < 0].tolist(), sizes[raw_at < 0].tolist()):
                    frames.append((np.frombuffer(os.pread(fd, n, off), np.uint8), raw))
        finally:
            os.close(fd)
        return frames

    def decompress_only(frames: list, codec: tuple[int, int], dst: np.ndarray) -> float:
        """Unchecked, 16 chunks per kernel call (one decompression context) into consecutive
        slots of ``dst``, as the reader loads a window of 16 blocks."""
        calls = []
        for raw in sorted({r for _, r in frames}):
            fr = [f for f, r in frames if r == raw]
            for i in range(0, len(fr), 16):
                part = fr[i : i + 16]
                sizes = np.array([len(f) for f in part], np.int64)
                offs = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
                calls.append((np.concatenate(part), offs, sizes, raw))
        t = cpu()
        for src, offs, sizes, raw in calls:
            kernels.decode_chunks(
                src,
                offs,
                sizes,
                np.zeros(len(sizes), np.uint64),
                codec=codec,
                verify=False,
                dst=dst[: len(sizes) * raw],
                raw_size=raw,
                dst_stride=raw,
            )
        return cpu() - t

    for c in readers:
        epoch(c, 0)
    for rep in range(spec["reps"]):
        for c in readers:
            out[c]["cpu"].append(epoch(c, rep + 1))
    # Afterwards (frames held in memory would change the epochs' caches), the files
    # interleaved as the epochs were.
    frames = {c: frames_of(c) for c in readers if c != "none"}
    lay = readers["none"].layout
    dst = np.empty(16 * max(lay.block_raw_bytes, lay.heap_chunk_bytes), np.uint8)
    for c, fr in frames.items():
        decompress_only(fr, readers[c]._gatherer.codec, dst)  # untimed: dst's pages, caches
    for _rep in range(spec["reps"]):
        for c, fr in frames.items():
            t = decompress_only(fr, readers[c]._gatherer.codec, dst)
            out[c].setdefault("decompress_cpu", []).append(t)
    print("RESULT " + json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--dir", default=os.path.join(ROOT, ".cache", "compressed_read_bench"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compressed_read.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    trees = [("current", ROOT)]
    doc: dict[str, Any] = {
        "tool": "bench/compressed_read_bench.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trees": dict(trees),
        "reps": args.reps,
        "rounds": args.rounds,
        "runs": [],
    }
    for name in args.workloads:
        for rnd in range(args.rounds):
            for label, tree in trees:
                d = os.path.join(args.dir, label)
                os.makedirs(d, exist_ok=True)
                spec = {"workload": name, "rows": WORKLOADS[name], "dir": d, "reps": args.reps}
                load = os.getloadavg()[0]
                p = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                    capture_output=True,
                    text=True,
                    env=dict(os.environ, PYTHONPATH=tree),
                    cwd=tree,
                    timeout=1800,
                )
                line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(p.stdout, p.stderr, file=sys.stderr)
                    return 1
                res = json.loads(line[7:])
                doc["runs"].append({"workload": name, "tree": label, "round": rnd, "load": load})
                doc["runs"][-1]["files"] = res
                none = statistics.median(res["none"]["cpu"])
                for c, v in res.items():
                    m = statistics.median(v["cpu"])
                    floor = ""
                    if "decompress_cpu" in v:
                        d = statistics.median(v["decompress_cpu"])
                        floor = (
                            f" decompression alone {d * 1e3:6.1f} ms, the rest "
                            f"{(m - d) * 1e3:6.1f} ms, floor ratio {none / (none + d):.2f}"
                        )
                    print(
                        f"{name:7s} {label:6s} round {rnd} {c:5s} stored/raw "
                        f"{v['stored_over_raw']:.3f} heap chunks/epoch "
                        f"{v.get('heap_chunks_per_epoch', '-')} cpu {m * 1e3:7.1f} ms "
                        f"ratio {none / m:.2f}{floor} (load {load:.1f})",
                        flush=True,
                    )
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
