"""Rows/s through Grain over rowstore, against the reader alone and Grain over ArrayRecord.

    python bench/grain_bench.py [--repeats 5] [--tiny-rows 1000000] [--patch-rows 4000]
                                [--dir DIR] [--out bench/results/grain_bench.json]

Workloads (``rowstore.demo``, uncompressed): ``tiny`` (float32[16] + int64, 72-byte rows,
batches of 256) and ``patch`` (float64[9,9,27] + int64[9,27] + float64, ~19 KB rows, batches of
32). One epoch of one process (world 1), warm page cache. Sources, all in this run:

* ``reader.deal``: ``Reader.deal(B, seed=0)``, block shuffle (window 16): the reader alone;
  ``reader.deal full``: the same with a uniform shuffle (``shuffle="full"``);
* ``grain EpochDataset``: ``iter(rowstore.grain.EpochDataset(r, batch_size=B, seed=0))``, the
  same dealt epoch as a Grain iterator (``full``: uniform shuffle);
* ``grain BatchSource``: ``grain.MapDataset.source(BatchSource(r, B, seed=0))
  .to_iter_dataset(read_options)``: one ``Reader.take`` per batch in Grain's read threads;
* ``grain ReaderSource rows``: ``MapDataset.source(ReaderSource(r)).shuffle(0).batch(B)``:
  Grain's row-by-row path (one ``take`` of one row per row);
* ``grain ArrayRecord``: the usual Grain pipeline over the same rows written to ArrayRecord
  (``group_size:1,uncompressed``, a record = the row's field bytes):
  ``MapDataset.source(ArrayRecordDataSource(path)).shuffle(0).map(parse).batch(B)
  .to_iter_dataset(read_options)`` (uniform shuffle); ``grain ArrayRecord (Grain defaults)``:
  the same with Grain's default read options (16 threads, 500 elements ahead);
  the row-by-row pipelines are timed on the first ``--row-limit`` rows (tiny; a quarter of it
  for patch), the two batch sources on the first ``--batch-limit`` rows of tiny, their rate
  standing for the epoch's (the readers' pipelines read whole epochs: at 72-byte rows an
  epoch must last long enough that a shared machine's preemptions do not decide the median);
* ``grain ArrayRecord batched``: a batch source over ArrayRecord (item ``g`` is one
  ``__getitems__`` of the batch's shuffled record keys, parsed into stacked arrays), the
  batched read ArrayRecord offers.

``read_options`` is ``grain.ReadOptions(num_threads=T, prefetch_buffer_size=16)`` with ``T``
the reader's threads (``min(4, cpus)``), so both sides use as many threads. Every batch's
values are touched (``rowstore.bench.measure.touch_batch``) and counted.

Each source has a reader of its own; medians of ``--repeats`` runs after one warm-up run;
ratios against ``reader.deal`` of the same run. The machine may be shared: the ratios within
the run matter, absolute figures less.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import grain  # noqa: E402
from absl import flags  # noqa: E402
from array_record.python.array_record_module import ArrayRecordWriter  # noqa: E402

import rowstore  # noqa: E402
import rowstore.grain as rg  # noqa: E402
from rowstore.bench.measure import machine_info, touch_batch, warm_cache  # noqa: E402
from rowstore.demo import make_demo  # noqa: E402

BATCH = {"tiny": 256, "patch": 32}


def write_array_record(reader: rowstore.Reader, path: str) -> None:
    """The reader's rows in order, each record the concatenated bytes of its fields."""
    w = ArrayRecordWriter(path, "group_size:1,uncompressed")
    names = reader.schema.names
    for b in reader.batches(4096, shuffle="none"):
        cols = [np.ascontiguousarray(b[n]).reshape(len(b[n]), -1).view(np.uint8) for n in names]
        rows = np.concatenate(cols, axis=1)
        for row in rows:
            w.write(row.tobytes())
    w.close()


class Parser:
    """Record bytes -> a dict of the row's fields (numpy views of the record)."""

    def __init__(self, schema: rowstore.Schema):
        self.fields = []
        off = 0
        for f in schema:
            dt = np.dtype(f.dtype)
            n = int(np.prod(f.shape, dtype=np.int64)) if f.shape else 1
            self.fields.append((f.name, dt, f.shape, off, n))
            off += n * dt.itemsize
        self.row_bytes = off

    def row(self, rec: bytes) -> dict:
        return {
            name: np.frombuffer(rec, dt, n, off).reshape(shape)
            for name, dt, shape, off, n in self.fields
        }

    def batch(self, recs: list) -> dict:
        a = np.frombuffer(b"".join(recs), np.uint8).reshape(len(recs), self.row_bytes)
        return {
            name: np.ascontiguousarray(a[:, off : off + n * dt.itemsize])
            .view(dt)
            .reshape((len(recs), *shape))
            for name, dt, shape, off, n in self.fields
        }


class ArrayRecordBatches:
    """A Grain source of batches over ArrayRecord: one ``__getitems__`` per batch."""

    def __init__(self, path: str, batch_size: int, parser: Parser, seed: int = 0):
        self.source = grain.sources.ArrayRecordDataSource(path)
        n = len(self.source)
        self.perm = np.random.default_rng(seed).permutation(n)
        self.B, self.parser = batch_size, parser

    def __len__(self) -> int:
        return -(-len(self.perm) // self.B)

    def __getitem__(self, g: int) -> dict:
        keys = self.perm[g * self.B : (g + 1) * self.B].tolist()
        return self.parser.batch(list(self.source.__getitems__(keys)))


def sources(path, ar_path, B, row_limit, batch_limit):
    """name -> (make(reader) -> iterator of batches, rows timed or None for the epoch)."""
    threads = rowstore.open(path).num_threads
    ro = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=16)
    parser = Parser(rowstore.open(path).schema)
    ars = lambda: grain.sources.ArrayRecordDataSource(ar_path)  # noqa: E731
    return {
        "reader.deal": (lambda r: r.deal(B, seed=0), None),
        "reader.deal full": (lambda r: r.deal(B, seed=0, shuffle="full"), None),
        "grain EpochDataset": (
            lambda r: iter(rg.EpochDataset(r, batch_size=B, seed=0, shard=(0, 1))),
            None,
        ),
        "grain EpochDataset full": (
            lambda r: iter(rg.EpochDataset(r, batch_size=B, seed=0, shuffle="full", shard=(0, 1))),
            None,
        ),
        "grain BatchSource": (
            lambda r: iter(
                grain.MapDataset.source(rg.BatchSource(r, B, seed=0)).to_iter_dataset(ro)
            ),
            batch_limit,
        ),
        "grain ReaderSource rows": (
            lambda r: iter(
                grain.MapDataset.source(rg.ReaderSource(r)).shuffle(0).batch(B).to_iter_dataset(ro)
            ),
            row_limit,
        ),
        "grain ArrayRecord": (
            lambda r: iter(
                grain.MapDataset.source(ars())
                .shuffle(0)
                .map(parser.row)
                .batch(B)
                .to_iter_dataset(ro)
            ),
            row_limit,
        ),
        "grain ArrayRecord (Grain defaults)": (
            lambda r: iter(
                grain.MapDataset.source(ars()).shuffle(0).map(parser.row).batch(B).to_iter_dataset()
            ),
            row_limit,
        ),
        "grain ArrayRecord batched": (
            lambda r: iter(
                grain.MapDataset.source(ArrayRecordBatches(ar_path, B, parser)).to_iter_dataset(ro)
            ),
            batch_limit,
        ),
    }


def run_once(make, r, names, limit) -> dict:
    t0 = time.perf_counter()
    rows = nbytes = 0
    it = make(r)
    for b in it:
        nb, _ = touch_batch(b, names)
        nbytes += nb
        rows += len(b[names[0]])
        if limit is not None and rows >= limit:
            break
    dt = time.perf_counter() - t0
    if hasattr(it, "close"):
        it.close()
    return {"rows": rows, "seconds": dt, "rows_per_s": rows / dt, "mb_per_s": nbytes / dt / 1e6}


def bench_workload(name, rows, workdir, repeats, row_limit, batch_limit) -> dict:
    path = os.path.join(workdir, f"{name}.h5")
    if not os.path.exists(path):
        make_demo(name, path, rows)
    r = rowstore.open(path)
    ar_path = os.path.join(workdir, f"{name}.array_record")
    if not os.path.exists(ar_path):
        write_array_record(r, ar_path)
    warm_cache([path, ar_path])
    B = BATCH[name]
    names = r.schema.names
    srcs = sources(path, ar_path, B, row_limit[name], batch_limit[name])
    out = {}
    for key, (make, limit) in srcs.items():
        # A reader of its own for each source: what a reader remembers of earlier reads (pages
        # whose checksum it checked) is that source's own.
        src_reader = rowstore.open(path)
        run_once(make, src_reader, names, limit)  # warm-up
        reps = [run_once(make, src_reader, names, limit) for _ in range(repeats)]
        src_reader.close()
        med = statistics.median(x["rows_per_s"] for x in reps)
        out[key] = {
            "rows_per_s": med,
            "mb_per_s": statistics.median(x["mb_per_s"] for x in reps),
            "rows_timed": reps[0]["rows"],
            "reps_rows_per_s": [round(x["rows_per_s"]) for x in reps],
        }
        print(f"  {name:5s} {key:36s} {med:12,.0f} rows/s", flush=True)
    base = out["reader.deal"]["rows_per_s"]
    for v in out.values():
        v["ratio_vs_reader_deal"] = v["rows_per_s"] / base
    return {"rows": len(r), "batch_size": B, "threads": r.num_threads, "sources": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tiny-rows", type=int, default=1_000_000)
    ap.add_argument("--patch-rows", type=int, default=4_000)
    ap.add_argument("--row-limit", type=int, default=1024, help="rows timed row by row (tiny)")
    ap.add_argument(
        "--batch-limit", type=int, default=10_240, help="rows timed batch by batch (tiny)"
    )
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "grain_bench.json"))
    a = ap.parse_args(argv)
    flags.FLAGS.mark_as_parsed()  # Grain reads absl flags (absl.app.run would parse them)
    workdir = a.dir or tempfile.mkdtemp(prefix="grain_bench_")
    os.makedirs(workdir, exist_ok=True)
    limits = {"tiny": a.row_limit, "patch": max(1, a.row_limit // 4)}
    batch_limits = {"tiny": a.batch_limit, "patch": None}
    result = {
        "machine": machine_info(),
        "note": "machine shared with other jobs: compare ratios within the run",
        "versions": {"grain": grain.__version__ if hasattr(grain, "__version__") else "0.2.18"},
        "repeats": a.repeats,
        "workloads": {},
    }
    for name, rows in (("tiny", a.tiny_rows), ("patch", a.patch_rows)):
        result["workloads"][name] = bench_workload(
            name, rows, workdir, a.repeats, limits, batch_limits
        )
    print()
    print(f"{'workload':8s} {'source':36s} {'rows/s':>12s} {'MB/s':>8s} {'x deal':>7s}")
    for name, w in result["workloads"].items():
        for key, v in w["sources"].items():
            print(
                f"{name:8s} {key:36s} {v['rows_per_s']:12,.0f} {v['mb_per_s']:8.1f} "
                f"{v['ratio_vs_reader_deal']:7.2f}"
            )
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
