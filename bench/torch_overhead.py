"""What the torch adapter costs on top of the core reader (CPU, raw fixed-size rows).

Times one block-shuffled epoch of ``Reader.batches`` and of ``rowstore.torch.BatchedDataLoader``
on the same file, interleaved in one process (same epochs, warm page cache), and prints JSON:
median wall seconds (and CPU seconds of all threads, steadier on a busy machine) of each, rows/s,
and the ratio loader/reader per batch size. A third variant,
``Reader.batches`` plus one ``torch.from_numpy`` per array, is the floor any adapter must pay.

    python bench/torch_overhead.py [--rows 200000] [--repeats 15] [--batch-sizes 256,1024,4096]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import rowstore
import rowstore.torch as rst
from rowstore.demo import make_demo


def _epoch_reader(r, bs, epoch, threads):
    n = 0
    for b in r.batches(bs, seed=0, epoch=epoch, num_threads=threads):
        n += len(b["label"])
    return n


def _epoch_floor(r, bs, epoch, threads):
    # The least any torch adapter must do: one torch.from_numpy per array of each batch.
    n = 0
    for b in r.batches(bs, seed=0, epoch=epoch, num_threads=threads):
        t = {k: torch.from_numpy(v) for k, v in b.items()}
        n += len(t["label"])
    return n


def _epoch_loader(dl, epoch):
    n = 0
    dl.set_epoch(epoch)
    for b in dl:
        n += len(b["label"])
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--batch-sizes", default="256,1024,4096")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--path", default=None, help="an existing tiny demo file (default: written to a temp dir)"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or make_demo("tiny", os.path.join(tmp, "tiny.h5"), args.rows)
        r = rowstore.open(path)
        out = {
            "rows": len(r),
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "threads": args.threads or r.num_threads,
            "results": [],
        }
        for bs in (int(x) for x in args.batch_sizes.split(",")):
            dl = rst.BatchedDataLoader(r, batch_size=bs, seed=0, num_threads=args.threads)
            t_reader, t_floor, t_loader = [], [], []
            c_reader, c_floor, c_loader = [], [], []
            for rep in range(args.repeats + 2):  # two warm-up rounds
                e = rep % 4
                c0, t0 = time.process_time(), time.perf_counter()
                n1 = _epoch_reader(r, bs, e, args.threads)
                c1, t1 = time.process_time(), time.perf_counter()
                n2 = _epoch_floor(r, bs, e, args.threads)
                c2, t2 = time.process_time(), time.perf_counter()
                n3 = _epoch_loader(dl, e)
                c3, t3 = time.process_time(), time.perf_counter()
                assert n1 == n2 == n3 == len(r)
                if rep >= 2:
                    t_reader.append(t1 - t0)
                    t_floor.append(t2 - t1)
                    t_loader.append(t3 - t2)
                    c_reader.append(c1 - c0)
                    c_floor.append(c2 - c1)
                    c_loader.append(c3 - c2)
            mr, mf, ml = (statistics.median(t) for t in (t_reader, t_floor, t_loader))
            cr, cf, cl = (statistics.median(t) for t in (c_reader, c_floor, c_loader))
            out["results"].append(
                {
                    "batch_size": bs,
                    "reader_s": round(mr, 5),
                    "from_numpy_floor_s": round(mf, 5),
                    "loader_s": round(ml, 5),
                    "reader_rows_per_s": round(len(r) / mr),
                    "loader_rows_per_s": round(len(r) / ml),
                    "floor_over_reader": round(mf / mr, 3),
                    "loader_over_reader": round(ml / mr, 3),
                    "cpu_s": {
                        "reader": round(cr, 5),
                        "floor": round(cf, 5),
                        "loader": round(cl, 5),
                    },
                    "cpu_loader_over_reader": round(cl / cr, 3),
                }
            )
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
