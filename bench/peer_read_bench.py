"""Shuffled epochs of fixed-size rows against the peers and memcpy, each system in fresh processes.

    python bench/peer_read_bench.py [--workloads tiny,patch] [--rounds 5] [--min-pass-s 2]
                                    [--out bench/results/peer_read_bench.json]
    bash bench/setup_ffcv.sh     # once: FFCV in .ffcv-venv (skipped, and said so, without it)

Workloads (``rowstore.demo.make_demo``, uncompressed): **tiny** (1,000,000 rows of 72 bytes,
batch 1024) and **patch** (20,000 rows of 19,448 bytes, batch 256). Systems, each read with
every batch touched the same way (one value per 4 KiB read, as
``rowstore.bench.measure.touch`` does):

* ``rowstore``: ``Reader.batches`` in the default order (``shuffle="block"``, the file's
  default window and pieces), the reader's 2 threads;
* ``rowstore-full``: the same with ``shuffle="full"`` (a uniform permutation);
* ``numpy``: a memmap of the rows exported to one ``.npy`` per field, a uniformly shuffled
  index gathered batch by batch (``np.take`` of sorted indices);
* ``ffcv``: FFCV's ``Loader`` (``OrderOption.RANDOM``, 2 workers, ``os_cache=True``) over a
  ``.beton`` of the same fields (``NDArrayField``/``IntField``/``FloatField``), run with
  ``.ffcv-venv``'s Python.

Each (system, round) is a fresh process: one warm-up epoch (page cache, JIT, buffers), then
epochs until a pass of ``--min-pass-s`` seconds; rows/s of the pass and its process CPU time
(FFCV's workers are threads of the process) and its minor page faults per epoch (fresh
pages faulted in: what buffers reused across batches save).
The same process then times ``np.copyto`` of 1 GiB between two prefaulted buffers: the
``memcpy`` ceiling of that moment. Rounds interleave the systems. Reported: the median rows/s,
bytes delivered/s as a share of the same process's memcpy, and the ratio to each peer.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FFCV_PY = os.path.join(ROOT, ".ffcv-venv", "bin", "python")
WORKLOADS = {"tiny": (1_000_000, 1024), "patch": (20_000, 256)}
SYSTEMS = ["rowstore", "rowstore-full", "numpy", "ffcv"]


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _memcpy_gbs() -> float:
    import numpy as np

    src = np.ones(1 << 30, np.uint8)
    dst = np.ones(1 << 30, np.uint8)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, (1 << 30) / (time.perf_counter() - t))
    return best / 1e9


def _touch(v) -> int:
    """What ``rowstore.bench.measure.touch`` does to an array (one value per 4 KiB), written out
    here so FFCV's venv, which cannot import rowstore's kernels, touches batches the same way."""
    import numpy as np

    flat = np.asarray(v).reshape(-1)
    return int(np.count_nonzero(flat[:: max(1, 4096 // flat.itemsize)])) if flat.size else 0


def _passes(epoch, n: int, min_s: float) -> dict:
    epoch(0)
    t, c, k, e, f = time.perf_counter(), _cpu(), 0, 1, _faults()
    while True:
        epoch(e)
        e, k = e + 1, k + n
        wall = time.perf_counter() - t
        if wall >= min_s:
            break
    return {
        "rows_s": k / wall,
        "rows_cpu_s": k / (_cpu() - c),
        "epochs": e - 1,
        "page_faults_per_epoch": (_faults() - f) / (e - 1),
    }


def child(spec: dict) -> dict:
    import numpy as np

    system, n, batch = spec["system"], spec["rows"], spec["batch"]
    row_bytes = spec["row_bytes"]
    if system.startswith("rowstore"):
        sys.path.insert(0, ROOT)
        from rowstore.reader import Reader

        r = Reader(spec["path"], num_threads=2)
        names = [f.name for f in r.schema]
        mode = "full" if system == "rowstore-full" else "block"

        def epoch(e):
            k = 0
            for b in r.batches(batch, shuffle=mode, seed=7, epoch=e):
                for name in names:
                    _touch(b[name])
                k += len(b[names[0]])
            assert k == n, k

    elif system == "numpy":
        cols = [np.load(p, mmap_mode="r") for p in spec["npy"]]

        def epoch(e):
            perm = np.random.default_rng(e).permutation(n)
            for a in range(0, n, batch):
                idx = np.sort(perm[a : a + batch])
                for c in cols:
                    _touch(np.take(c, idx, axis=0))

    else:  # ffcv
        from ffcv.fields.basics import FloatDecoder, IntDecoder
        from ffcv.fields.decoders import NDArrayDecoder
        from ffcv.loader import Loader, OrderOption

        decoders = {"nd": NDArrayDecoder, "int": IntDecoder, "float": FloatDecoder}
        loader = Loader(
            spec["beton"],
            batch_size=batch,
            num_workers=2,
            order=OrderOption.RANDOM,
            os_cache=True,
            drop_last=False,
            pipelines={name: [decoders[kind]()] for name, kind in spec["ffcv_fields"]},
        )

        def epoch(e):
            k = 0
            for b in loader:
                for x in b:
                    _touch(x)
                k += len(b[0])
            assert k == n, k

    out = _passes(epoch, n, spec["min_pass_s"])
    out["memcpy_gbs"] = _memcpy_gbs()
    out["share_of_memcpy"] = out["rows_s"] * row_bytes / 1e9 / out["memcpy_gbs"]
    return out


def write_beton(spec: dict) -> None:
    """Run with FFCV's venv: the .npy exports as a .beton (once)."""
    import numpy as np
    from ffcv.fields import FloatField, IntField, NDArrayField
    from ffcv.writer import DatasetWriter

    cols = [np.load(p) for p in spec["npy"]]
    fields = {}
    for (name, kind), c in zip(spec["ffcv_fields"], cols):
        if kind == "nd":
            fields[name] = NDArrayField(dtype=c.dtype, shape=c.shape[1:])
        elif kind == "int":
            fields[name] = IntField()
        else:
            fields[name] = FloatField()

    class Rows:
        def __len__(self):
            return len(cols[0])

        def __getitem__(self, i):
            return tuple(c[i] for c in cols)

    DatasetWriter(spec["beton"] + ".tmp", fields, num_workers=2).from_indexed_dataset(Rows())
    os.replace(spec["beton"] + ".tmp", spec["beton"])


def prepare(name: str, tmp: str) -> dict:
    import numpy as np

    sys.path.insert(0, ROOT)
    from rowstore.demo import make_demo
    from rowstore.reader import Reader

    rows, batch = WORKLOADS[name]
    path = os.path.join(tmp, f"{name}.h5")
    make_demo(name, path, rows=rows)
    r = Reader(path)
    data = r.take(np.arange(r.num_rows))
    npy, ffcv_fields = [], []
    for f in r.schema:
        p = os.path.join(tmp, f"{name}.{f.name}.npy")
        np.save(p, np.ascontiguousarray(data[f.name]))
        npy.append(p)
        kind = "nd" if f.shape else ("int" if f.dtype.kind in "iu" else "float")
        ffcv_fields.append((f.name, kind))
    return {
        "path": path,
        "npy": npy,
        "ffcv_fields": ffcv_fields,
        "beton": os.path.join(tmp, f"{name}.beton"),
        "rows": rows,
        "batch": batch,
        "row_bytes": r.layout.row_dtype.itemsize,
    }


def run_child(spec: dict, python: str) -> dict:
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="tiny,patch")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-pass-s", type=float, default=2.0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "peer_read_bench.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--write-beton", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    if a.write_beton:
        write_beton(json.loads(a.write_beton))
        return
    systems = a.systems.split(",")
    if "ffcv" in systems and not os.path.exists(FFCV_PY):
        print("ffcv: no .ffcv-venv (bash bench/setup_ffcv.sh): skipped", file=sys.stderr)
        systems.remove("ffcv")
    results: dict = {"method": __doc__.split("\n\n")[1:], "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="rowstore-peer-") as tmp:
        for name in a.workloads.split(","):
            spec = prepare(name, tmp)
            if "ffcv" in systems:
                subprocess.run(
                    [FFCV_PY, os.path.abspath(__file__), "--write-beton", json.dumps(spec)],
                    check=True,
                    cwd=ROOT,
                )
            runs: dict[str, list[dict]] = {s: [] for s in systems}
            for _ in range(a.rounds):
                for s in systems:
                    py = FFCV_PY if s == "ffcv" else sys.executable
                    runs[s].append(run_child({**spec, "system": s, "min_pass_s": a.min_pass_s}, py))
            summary = {}
            for s, rs in runs.items():
                summary[s] = {
                    "rows_s": statistics.median(r["rows_s"] for r in rs),
                    "rows_cpu_s": statistics.median(r["rows_cpu_s"] for r in rs),
                    "share_of_memcpy": statistics.median(r["share_of_memcpy"] for r in rs),
                    "memcpy_gbs": statistics.median(r["memcpy_gbs"] for r in rs),
                    "page_faults_per_epoch": statistics.median(
                        r["page_faults_per_epoch"] for r in rs
                    ),
                    "runs": rs,
                }
            base = summary["rowstore"]["rows_s"]
            for s in summary:
                summary[s]["rowstore_over_this"] = base / summary[s]["rows_s"]
            results["workloads"][name] = summary
            print(
                f"{name}: "
                + ", ".join(
                    f"{s} {v['rows_s'] / 1e3:.0f}k rows/s ({v['share_of_memcpy']:.2f} of memcpy, "
                    f"rowstore {v['rowstore_over_this']:.2f}x)"
                    for s, v in summary.items()
                )
            )
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
