"""The dealt epoch's costs: read locality, shuffle quality against window, and speed.

    python bench/order_bench.py [--repeats 3] [--out bench/results/order_bench.json]

On the four workloads (demo schemas ``tiny``, ``patch``, ``image``, ``speech``, written with
1 MiB blocks under a temporary directory):

* ``locality`` (on a layout of 4,096 blocks with the workload's rows per block, from the
  block index only): block loads per block of rows delivered, for one epoch dealt to ``world``
  consumers (``Reader.deal``: units of global batches round-robin, elastic) against the
  contiguous slices of ``Reader.batches(part=...)`` (not elastic); what the reader loads: a
  window segment loads its window's blocks. 1.0 = every block loaded once. Batch 64 with
  window 16 makes 4 windows of rows a whole number of batches (units aligned to windows);
  ``dealt_default_batch100`` is the default unit with batch 100 (not aligned).
* ``quality`` (same layout): shuffle quality and mean distinct blocks per batch against
  ``window``.
* ``speed``: rows/s of consumer 0 of 4 reading its epoch part, dealt vs contiguous
  (alternating, median of ``--repeats``), and of a whole epoch (world 1) against ``window``.
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

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import rowstore  # noqa: E402
from rowstore.demo import make_demo  # noqa: E402
from rowstore.reader.order import EpochOrder  # noqa: E402
from rowstore.reader.proof import batch_blocks, read_cost  # noqa: E402

WORKLOADS = {"tiny": 2_000_000, "patch": 6_000, "image": 600, "speech": 3_000}
NBLOCKS = 4096  # the layouts of the locality and quality figures: 4 GiB of 1 MiB blocks
BATCH = 64


def _layout(rpb: int, nblocks: int = NBLOCKS) -> np.ndarray:
    br = np.full(nblocks, rpb, np.int64)
    br[-1] = max(1, rpb // 3)
    return br


def _locality(rpb: int, windows=(4, 16), worlds=(4, 8, 32), units=(1, 4)) -> list[dict]:
    out = []
    br = _layout(rpb)
    for window in windows:
        eo = EpochOrder(br, rpb, shuffle="block", seed=0, window=window)
        for world in worlds:
            contig = [read_cost(eo, BATCH, c, world, dealt=False) for c in range(world)]
            row = {
                "window": window,
                "world": world,
                "contiguous": rpb * sum(b for b, _ in contig) / max(1, sum(n for _, n in contig)),
            }
            for mult in units:
                u = max(1, -(-mult * window * rpb // BATCH))  # mult windows of rows
                cost = [read_cost(eo, BATCH, c, world, unit=u) for c in range(world)]
                row[f"dealt_unit_{mult}w"] = (
                    rpb * sum(b for b, _ in cost) / max(1, sum(n for _, n in cost))
                )
                row[f"unit_{mult}w_batches"] = u
            # batch 100 does not divide a window of rows: unit boundaries fall inside windows
            cost = [read_cost(eo, 100, c, world) for c in range(world)]
            row["dealt_default_batch100"] = (
                rpb * sum(b for b, _ in cost) / max(1, sum(n for _, n in cost))
            )
            out.append(row)
    return out


def _quality(rpb: int, windows=(1, 4, 16, 64)) -> list[dict]:
    from rowstore.reader.order import shuffle_quality

    out = []
    br = _layout(rpb)
    for window in [*windows, "full"]:
        eo = EpochOrder(
            br,
            rpb,
            shuffle="full" if window == "full" else "block",
            seed=0,
            window=16 if window == "full" else window,
        )
        ids = eo.ids()
        bb = batch_blocks(ids, rpb, BATCH)
        out.append(
            {
                "window": window,
                "quality": shuffle_quality(ids, rpb, len(br), BATCH),
                "blocks_per_batch": float(bb.mean()) if len(bb) else 0.0,
            }
        )
    return out


def _epoch_rate(it) -> float:
    t = time.perf_counter()
    n = 0
    for b in it:
        n += len(next(iter(b.values())))
    return n / (time.perf_counter() - t)


def _speed(r, repeats: int) -> dict:
    res: dict = {"consumer0_of_4": {"dealt": [], "contiguous": []}, "window": {}}
    for _ in range(repeats):
        res["consumer0_of_4"]["dealt"].append(_epoch_rate(r.deal(BATCH, shard=(0, 4), seed=1)))
        res["consumer0_of_4"]["contiguous"].append(
            _epoch_rate(r.batches(BATCH, part=(0, 4), seed=1))
        )
    for window in (1, 16, 64):
        res["window"][str(window)] = statistics.median(
            _epoch_rate(r.deal(BATCH, seed=1, window=window)) for _ in range(repeats)
        )
    d, c = res["consumer0_of_4"]["dealt"], res["consumer0_of_4"]["contiguous"]
    res["consumer0_of_4"] = {
        "dealt_rows_s": statistics.median(d),
        "contiguous_rows_s": statistics.median(c),
        "ratio_dealt_over_contiguous": statistics.median([a / b for a, b in zip(d, c)]),
    }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "order_bench.json")
    )
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="order_bench")
    report: dict = {
        "batch_size": BATCH,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_note": "2 cores shared with other jobs: rates are noisy; ratios come from the same "
        "run",
        "workloads": {},
    }
    try:
        for name in args.workloads:
            path = make_demo(name, os.path.join(tmp, f"{name}.h5"), WORKLOADS[name])
            with rowstore.open(path) as r:
                rpb = r.layout.rows_per_block
                entry = {
                    "rows": len(r),
                    "rows_per_block": rpb,
                    "blocks": r.layout.num_blocks,
                    "layout_blocks": NBLOCKS,
                    "locality": _locality(rpb),
                    "quality": _quality(rpb),
                    "speed": _speed(r, args.repeats),
                }
            report["workloads"][name] = entry
            print(name, json.dumps(entry, indent=None, default=float)[:600], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=float)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
