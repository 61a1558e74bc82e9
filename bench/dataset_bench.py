"""Datasets of many files against one file, in the same run.

    python bench/dataset_bench.py [--repeats 5] [--shards 16] [--out
    bench/results/dataset_bench.json]

* ``epoch``: one shuffled epoch (``block`` and ``full``) of the tiny (72-byte rows) and patch
  (19 KB rows) workloads, every batch touched, from one ``.h5`` file and from a dataset of
  ``--shards`` shard files holding the same rows; A and B alternate within one process (one
  warm-up epoch each first), the report gives median rows/s and the median per-pair ratio
  dataset / file.
* ``open``: opening a dataset of ``--open-shards`` (10,000) small shards: median wall time of
  ``rowstore.open`` and the peak Python memory it allocates (tracemalloc), then one full
  epoch over all shards under the default descriptor bound.
* ``scale``: a million blocks (1,000 shards of 1,000 one-row blocks): open time, RSS growth,
  a block-shuffled epoch.
* ``write``: ``DatasetWriter`` (rolling over every ``--shard-mb``) against ``Writer`` on the
  same batches, alternating, median MB/s and ratio.

Datasets are written under ``--dir`` (default: a temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rowstore  # noqa: E402
from rowstore.format import manifest  # noqa: E402
from rowstore.format.index import Layout  # noqa: E402

WORKLOADS = {
    # name: (schema, rows, batch size)
    "tiny": (rowstore.Schema({"x": ("float32", (16,)), "y": "int64"}), 2_000_000, 1024),
    "patch": (
        rowstore.Schema(
            {"foo": ("float64", (9, 9, 27)), "bar": ("int64", (9, 27)), "baz": "float64"}
        ),
        10_000,
        128,
    ),
}


def columns(schema: rowstore.Schema, lo: int, hi: int) -> dict:
    rng = np.random.default_rng(lo)
    return {
        f.name: rng.standard_normal((hi - lo, *f.shape)).astype(f.dtype)
        if f.dtype.kind == "f"
        else np.arange(lo, hi, dtype=f.dtype).reshape(-1, *([1] * len(f.shape)))
        * np.ones(f.shape, f.dtype)
        for f in schema
    }


def write_file(path: str, schema, n: int, step: int = 20_000) -> None:
    with rowstore.Writer(path, schema) as w:
        for a in range(0, n, step):
            w.write_batch(columns(schema, a, min(n, a + step)))


def write_shards(root: str, schema, n: int, shards: int) -> None:
    """``shards`` shard files of consecutive rows committed as one dataset (the two-phase path
    when the writer provides it, else shard files plus a manifest)."""
    bounds = np.linspace(0, n, shards + 1).astype(int)
    if hasattr(rowstore, "write_shard"):
        infos = [
            rowstore.write_shard(root, schema, columns(schema, int(a), int(b)))
            for a, b in zip(bounds[:-1], bounds[1:])
        ]
        rowstore.commit(root, infos)
        return
    os.makedirs(os.path.join(root, manifest.SHARD_DIR))
    entries, blocks, chunks = [], [], []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        rel = f"{manifest.SHARD_DIR}/part-{k:05d}.h5"
        with rowstore.Writer(os.path.join(root, rel), schema) as w:
            w.write_batch(columns(schema, int(a), int(b)))
        L = Layout.open(os.path.join(root, rel))
        entries.append(manifest.shard_entry(rel, L))
        blocks.append(L.blocks)
        chunks.append(L.heap_chunks)
    with manifest.commit_lock(root):
        manifest.publish(
            root,
            schema=schema,
            attrs={},
            compression=L.compression,
            heap_chunk_bytes=L.heap_chunk_bytes,
            shards=entries,
            blocks=blocks,
            heap_chunks=chunks,
        )


def linked_dataset(
    root: str, one: str, schema, nshards: int, *, rows: int, rows_per_block: int
) -> None:
    """A dataset of ``nshards`` hard links of one shard file of ``rows`` rows: many shard files
    without writing as many HDF5 files."""
    with rowstore.Writer(one, schema, rows_per_block=rows_per_block) as w:
        w.write_batch(columns(schema, 0, rows))
    L = Layout.open(one)
    entries = []
    for k in range(nshards):
        rel = f"{manifest.SHARD_DIR}/part-{k:05d}.h5"
        os.link(one, os.path.join(root, rel))
        entries.append(manifest.shard_entry(rel, L))
    with manifest.commit_lock(root):
        manifest.publish(
            root,
            schema=schema,
            attrs={},
            compression=L.compression,
            heap_chunk_bytes=L.heap_chunk_bytes,
            shards=entries,
            blocks=[L.blocks] * nshards,
            heap_chunks=[L.heap_chunks] * nshards,
        )


def epoch_rate(reader, batch: int, shuffle: str, epoch: int) -> float:
    t = time.perf_counter()
    n = 0
    for b in reader.batches(batch, shuffle=shuffle, seed=1, epoch=epoch, num_threads=2):
        for v in b.values():
            v.reshape(-1)[:1].sum()  # touch every batch
        n += len(next(iter(b.values())))
    return n / (time.perf_counter() - t)


def bench_epoch(d: str, repeats: int, shards: int) -> dict:
    out = {}
    for name, (schema, n, batch) in WORKLOADS.items():
        f = os.path.join(d, f"{name}.h5")
        ds = os.path.join(d, f"{name}_ds")
        write_file(f, schema, n)
        write_shards(ds, schema, n, shards)
        for shuffle in ("block", "full"):
            A, B = rowstore.open(f), rowstore.open(ds)
            epoch_rate(A, batch, shuffle, 0)
            epoch_rate(B, batch, shuffle, 0)
            fa, fb = [], []
            for k in range(repeats):
                fa.append(epoch_rate(A, batch, shuffle, k + 1))
                fb.append(epoch_rate(B, batch, shuffle, k + 1))
            A.close()
            B.close()
            ratio = statistics.median(b / a for a, b in zip(fa, fb))
            out[f"{name}/{shuffle}"] = {
                "file_rows_per_s": statistics.median(fa),
                "dataset_rows_per_s": statistics.median(fb),
                "ratio_dataset_over_file": ratio,
                "shards": shards,
                "rows": n,
            }
            print(
                f"epoch {name:6s} {shuffle:5s}: file {statistics.median(fa):12,.0f} rows/s  "
                f"{shards}-shard dataset "
                f"{statistics.median(fb):12,.0f} rows/s  ratio {ratio:.3f}",
                flush=True,
            )
        shutil.rmtree(ds)
        os.remove(f)
    return out


def bench_open(d: str, repeats: int, nshards: int) -> dict:
    schema = WORKLOADS["tiny"][0]
    root = os.path.join(d, "many")
    os.makedirs(os.path.join(root, manifest.SHARD_DIR))
    linked_dataset(root, os.path.join(d, "one.h5"), schema, nshards, rows=100, rows_per_block=32)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        r = rowstore.open(root)
        times.append(time.perf_counter() - t)
        r.close()
    tracemalloc.start()
    r = rowstore.open(root)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t = time.perf_counter()
    n = sum(len(b["y"]) for b in r.batches(1024, shuffle="full", seed=0))
    epoch_s = time.perf_counter() - t
    res = {
        "shards": nshards,
        "rows": len(r),
        "open_s_median": statistics.median(times),
        "open_peak_python_bytes": peak,
        "full_epoch_s": epoch_s,
        "max_open_files": r._store.max_open,
        "manifest_bytes": os.path.getsize(os.path.join(root, manifest.manifest_path(1))),
        "sidecar_bytes": os.path.getsize(os.path.join(root, manifest.index_path(1))),
    }
    assert n == len(r) == 100 * nshards
    r.close()
    print(
        f"open {nshards:,} shards: {res['open_s_median'] * 1e3:.0f} ms (median of {repeats}), peak "
        f"{peak / 2**20:.1f} MiB "
        f"Python memory; manifest {res['manifest_bytes'] / 2**20:.1f} MiB + sidecar "
        f"{res['sidecar_bytes'] / 2**20:.1f} MiB; "
        f"full-shuffle epoch of {n:,} rows over all shards ({res['max_open_files']} descriptors at "
        f"most): {epoch_s:.1f} s",
        flush=True,
    )
    shutil.rmtree(root)
    return res


def bench_scale(d: str, repeats: int, nshards: int = 1000, blocks_per_shard: int = 1000) -> dict:
    """A million blocks: ``nshards`` hard links of one file of ``blocks_per_shard`` one-row
    blocks. Open time, the process's peak RSS growth (the index is numpy arrays: ~100 bytes per
    block), and a block-shuffled epoch."""
    import psutil

    schema = WORKLOADS["tiny"][0]
    root = os.path.join(d, "million")
    os.makedirs(os.path.join(root, manifest.SHARD_DIR))
    linked_dataset(
        root,
        os.path.join(d, "one_row_blocks.h5"),
        schema,
        nshards,
        rows=blocks_per_shard,
        rows_per_block=1,
    )
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        r = rowstore.open(root)
        times.append(time.perf_counter() - t)
    rss1 = proc.memory_info().rss
    t = time.perf_counter()
    n = sum(len(b["y"]) for b in r.batches(4096, shuffle="block", seed=0, window=256))
    epoch_s = time.perf_counter() - t
    rss2 = proc.memory_info().rss
    res = {
        "blocks": r.layout.num_blocks,
        "shards": nshards,
        "open_s_median": statistics.median(times),
        "rss_growth_open_bytes": rss1 - rss0,
        "rss_growth_after_epoch_bytes": rss2 - rss0,
        "block_epoch_s": epoch_s,
        "sidecar_bytes": os.path.getsize(os.path.join(root, manifest.index_path(1))),
    }
    assert n == len(r)
    r.close()
    print(
        f"scale: {res['blocks']:,} blocks in {nshards:,} shards: open {res['open_s_median']:.2f} s "
        f"(median of {repeats}), "
        f"RSS +{(rss1 - rss0) / 2**20:.0f} MiB after opening {repeats}x, "
        f"+{(rss2 - rss0) / 2**20:.0f} MiB after a block "
        f"epoch ({epoch_s:.1f} s); sidecar {res['sidecar_bytes'] / 2**20:.0f} MiB",
        flush=True,
    )
    shutil.rmtree(root)
    return res


def bench_write(d: str, repeats: int, shard_mb: int) -> dict:
    if not hasattr(rowstore, "DatasetWriter"):
        return {"skipped": "no DatasetWriter in this checkout"}
    out = {}
    for name, (schema, n, _batch) in WORKLOADS.items():
        batches = [columns(schema, a, min(n, a + 5000)) for a in range(0, n, 5000)]
        nbytes = n * rowstore.format.spec.row_dtype(schema).itemsize
        ta, tb = [], []
        for k in range(repeats):
            f, ds = os.path.join(d, f"w{k}.h5"), os.path.join(d, f"w{k}_ds")
            t = time.perf_counter()
            with rowstore.Writer(f, schema) as w:
                for b in batches:
                    w.write_batch(b)
            ta.append(nbytes / (time.perf_counter() - t) / 1e6)
            t = time.perf_counter()
            with rowstore.DatasetWriter(ds, schema, shard_bytes=shard_mb << 20) as w:
                for b in batches:
                    w.write_batch(b)
            tb.append(nbytes / (time.perf_counter() - t) / 1e6)
            shards = rowstore.open(ds).layout.num_shards
            os.remove(f)
            shutil.rmtree(ds)
        ratio = statistics.median(b / a for a, b in zip(ta, tb))
        out[name] = {
            "writer_MB_per_s": statistics.median(ta),
            "dataset_writer_MB_per_s": statistics.median(tb),
            "ratio": ratio,
            "shards": shards,
            "MB": nbytes / 1e6,
        }
        print(
            f"write {name:6s}: Writer {statistics.median(ta):7.0f} MB/s  DatasetWriter ({shards} "
            f"shards) "
            f"{statistics.median(tb):7.0f} MB/s  ratio {ratio:.3f}",
            flush=True,
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--open-shards", type=int, default=10_000)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument(
        "--only",
        nargs="+",
        choices=["epoch", "open", "write", "scale"],
        default=["epoch", "open", "write", "scale"],
    )
    ap.add_argument("--dir", help="where to write the datasets (default: a temporary directory)")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="rowstore-dsbench-")
    os.makedirs(d, exist_ok=True)
    res: dict = {"machine": {"cpus": os.cpu_count()}, "repeats": args.repeats}
    try:
        if "epoch" in args.only:
            res["epoch"] = bench_epoch(d, args.repeats, args.shards)
        if "open" in args.only:
            res["open"] = bench_open(d, args.repeats, args.open_shards)
        if "write" in args.only:
            res["write"] = bench_write(d, args.repeats, args.shard_mb)
        if "scale" in args.only:
            res["scale"] = bench_scale(d, min(args.repeats, 3))
    finally:
        if not args.dir:
            shutil.rmtree(d, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
