"""Compressed against uncompressed epochs, per core, in the same process.

    python bench/compressed_read_bench.py [--reps 5] [--rounds 2] [--workloads patch smooth speech]
                                          [--compressions none lz4 zstd]
                                          [--out bench/results/compressed_read.json]

Three workloads, each written uncompressed, Blosc2 LZ4 and Blosc2 Zstd (clevel 5, byte shuffle;
``--compressions`` picks others of :data:`COMPRESSIONS`): the demo patch (6,000 rows of
``foo float64[9,9,27]`` random normal floats, ``bar int64[9,27]``, ``baz float64``: the floor,
since random mantissas do not compress), ``smooth`` (6,000 patch-like rows whose values are
what weather or image-derived fields hold: ``x float32[9,9,60]``, smooth in space and time,
see :func:`smooth_fields`, with a time stamp and the patch's coordinates) and the demo speech
(3,000 rows of white-noise waveforms: stored memcpy'd). Each workload runs in a fresh process
per round with one reader thread: an untimed epoch per file, then ``--reps`` block-order epochs
per file, the files interleaved, every batch touched; timed by process CPU time (user + system:
steadier than wall time on a shared machine).
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
WORKLOADS = {"patch": 6_000, "smooth": 6_000, "speech": 3_000}
COMPRESSIONS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "lz4": {"cname": "lz4", "clevel": 5, "shuffle": "byte"},
    "zstd": {"cname": "zstd", "clevel": 5, "shuffle": "byte"},
    "lz4-bit": {"cname": "lz4", "clevel": 5, "shuffle": "bit"},
    "zstd-bit": {"cname": "zstd", "clevel": 5, "shuffle": "bit"},
    "lz4-noshuffle": {"cname": "lz4", "clevel": 5, "shuffle": "none"},
}
DEFAULT_COMPRESSIONS = ("none", "lz4", "zstd")


def smooth_fields(rng: Any, n: int, shape: tuple[int, int, int] = (9, 9, 60)) -> Any:
    """``n`` float32 patches of ``shape`` (y, x, time) holding a smooth field, as weather
    (temperature, pressure, geopotential) or image-derived data are: a level drawn per patch
    (280 +- 10), four plane waves of random wave vectors (wavelengths of 20 grid steps or
    more, periods of 30 time steps or more) and amplitudes (0.5-8), plus white noise of 0.05
    (the measurement or quantisation noise that keeps the low mantissa bits random: about 11
    of float32's 23 near 280). Blosc2 LZ4 + byte shuffle stores them at about 0.6 of their
    raw size, Zstd at about 0.54."""
    import numpy as np

    ny, nx, nt = shape
    y = np.arange(ny, dtype=np.float64)[:, None, None]
    x = np.arange(nx, dtype=np.float64)[None, :, None]
    t = np.arange(nt, dtype=np.float64)[None, None, :]
    out = np.empty((n, ny, nx, nt), np.float32)
    for i in range(n):
        f = np.full(shape, 280.0 + 10.0 * rng.standard_normal())
        for _ in range(4):
            ky, kx = rng.uniform(0.0, 0.3, 2)
            kt = rng.uniform(0.0, 0.2)
            f = f + rng.uniform(0.5, 8.0) * np.sin(ky * y + kx * x + kt * t + rng.uniform(0, 6.3))
        f += 0.05 * rng.standard_normal(shape)
        out[i] = f
    return out


def write_smooth(path: str, rows: int, compression: Any, *, seed: int = 0) -> None:
    """The ``smooth`` workload: ``x float32[9,9,60]`` (:func:`smooth_fields`), ``time int64``
    (hours, increasing), ``lat`` and ``lon`` float32 (the patch's corner on a 0.25 degree
    grid), 1 MiB blocks as the demo files have."""
    import numpy as np

    from rowstore import Field, Schema, Writer

    schema = Schema(
        [
            Field("x", "float32", (9, 9, 60)),
            Field("time", "int64"),
            Field("lat", "float32"),
            Field("lon", "float32"),
        ]
    )
    rng = np.random.default_rng(seed)
    with Writer(path, schema, compression=compression, block_bytes=1 << 20) as w:
        for a in range(0, rows, 1_000):
            m = min(1_000, rows - a)
            w.write_batch(
                {
                    "x": smooth_fields(rng, m),
                    "time": 6 * np.arange(a, a + m, dtype=np.int64),
                    "lat": (rng.integers(-360, 360, m) * 0.25).astype(np.float32),
                    "lon": (rng.integers(0, 1440, m) * 0.25).astype(np.float32),
                }
            )


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
    for c in spec["compressions"]:
        comp = COMPRESSIONS[c]
        path = os.path.join(spec["dir"], f"{spec['workload']}_{c}.h5")
        if not os.path.exists(path):
            if spec["workload"] == "smooth":
                write_smooth(path + ".tmp", spec["rows"], comp)
            else:
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
    ap.add_argument(
        "--compressions",
        nargs="+",
        default=list(DEFAULT_COMPRESSIONS),
        choices=list(COMPRESSIONS),
        help="files to read besides the uncompressed one (always read: the ratios' base)",
    )
    ap.add_argument("--dir", default=os.path.join(ROOT, ".cache", "compressed_read_bench"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compressed_read.json"))
    ap.add_argument(
        "--base",
        default=None,
        help="another checkout (kernels built in place) read alternately with this one",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    trees = [("current", ROOT)]
    if args.base:  # a second checkout (built in place) read in alternating fresh processes
        trees.append(("base", os.path.abspath(args.base)))
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
                d = os.path.join(args.dir, "current")  # the same files for every tree
                os.makedirs(d, exist_ok=True)
                comps = ["none"] + [c for c in args.compressions if c != "none"]
                spec = {
                    "workload": name,
                    "rows": WORKLOADS[name],
                    "dir": d,
                    "reps": args.reps,
                    "compressions": comps,
                }
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
    print(summary(doc))
    return 0


def summary(doc: dict[str, Any]) -> str:
    """The table of a run: per workload and file, stored/raw, the median epoch CPU and the
    ratio against the uncompressed file (median over rounds, their range in brackets), and the
    floor ratio from the decompression alone."""
    rows: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for run in doc["runs"]:
        files = run["files"]
        none = statistics.median(files["none"]["cpu"])
        for c, v in files.items():
            key = (run["workload"], c, run["tree"])
            r = rows.setdefault(key, {"ratio": [], "cpu": [], "floor": []})
            m = statistics.median(v["cpu"])
            r["ratio"].append(none / m)
            r["cpu"].append(m)
            r["stored"] = [v["stored_over_raw"]]
            if "decompress_cpu" in v:
                r["floor"].append(none / (none + statistics.median(v["decompress_cpu"])))
    lines = [
        "| workload | file | tree | stored / raw | epoch CPU | vs uncompressed | floor "
        "(decompression) |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for (w, c, tree), r in sorted(rows.items()):
        floor = f"{statistics.median(r['floor']):.2f}" if r["floor"] else "-"
        lines.append(
            f"| {w} | {c} | {tree} | {r['stored'][0]:.3f} | "
            f"{statistics.median(r['cpu']) * 1e3:.1f} ms | "
            f"**{statistics.median(r['ratio']):.2f}x** ({min(r['ratio']):.2f}-"
            f"{max(r['ratio']):.2f}) | {floor} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
