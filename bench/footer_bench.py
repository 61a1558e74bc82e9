"""Opening a single file: format v2 (the footer, no libhdf5) vs v1 (h5py reads the attributes
and the index datasets), locally and over HTTP.

Writes two files of ``i int32`` rows: *small* (50 rows, 7 blocks) and *many-blocks* (``--blocks``
blocks of one row each, 100,000 by default: a 5.6 MB index). Each is read as written (v2) and as
a v1 copy (the footer cut off, ``format_version`` set back to 1: byte for byte what the v1 writer
left). Measures ``Layout.open`` (median of ``--repeats``, v1 and v2 alternating; the page cache is
warm) and, through the Range HTTP server of ``tests/_servers.py``, the requests and bytes of a
remote open. Open times move with the machine's load; compare the ratios of one run.

    python bench/footer_bench.py [--blocks 100000] [--repeats 9] [--json
    bench/results/footer_bench.json]
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # tests/_servers.py


def _write(path: str, n: int, rows_per_block: int) -> None:
    import rowstore

    with rowstore.Writer(
        path, rowstore.Schema([rowstore.Field("i", "int32")]), rows_per_block=rows_per_block
    ) as w:
        w.write_batch({"i": np.arange(n, dtype=np.int32)})


def _as_v1(src: str, dst: str) -> None:
    import h5py

    from rowstore import Layout
    from rowstore.format import footer

    shutil.copyfile(src, dst)
    footer.cut(dst, Layout.open(src).footer_offset)
    with h5py.File(dst, "r+") as f:
        f["rowstore"].attrs["format_version"] = 1
        if "has_footer" in f["rowstore"].attrs:  # the v1 writer did not write it
            del f["rowstore"].attrs["has_footer"]


def _time_open(path: str) -> float:
    from rowstore import Layout

    t = time.perf_counter()
    Layout.open(path)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from _servers import RangeHTTPServer

    import rowstore

    tmp = tempfile.mkdtemp(prefix="footer-bench-")
    results: dict = {"repeats": args.repeats, "cases": {}}
    try:
        for name, n, rpb in (("small", 50, 8), ("many-blocks", args.blocks, 1)):
            v2 = os.path.join(tmp, f"{name}-v2.h5")
            v1 = os.path.join(tmp, f"{name}-v1.h5")
            _write(v2, n, rpb)
            _as_v1(v2, v1)
            L = rowstore.Layout.open(v2)
            times: dict[str, list[float]] = {"v1": [], "v2": []}
            for _ in range(args.repeats):
                times["v1"].append(_time_open(v1))
                times["v2"].append(_time_open(v2))
            med = {k: statistics.median(v) for k, v in times.items()}
            case = {
                "rows": n,
                "blocks": L.num_blocks,
                "file_bytes": L.file_size,
                "footer_bytes": L.file_size - L.footer_offset,
                "open_ms_v1": round(med["v1"] * 1e3, 3),
                "open_ms_v2": round(med["v2"] * 1e3, 3),
                "v1_over_v2": round(med["v1"] / med["v2"], 2),
            }
            srv = RangeHTTPServer(tmp)
            try:
                with rowstore.open(f"{srv.url}/{os.path.basename(v2)}"):
                    pass  # warm-up: the first remote open of a process sets up its client
                for v, p in (("v1", v1), ("v2", v2)):
                    before = srv.requests
                    t = time.perf_counter()
                    with rowstore.open(f"{srv.url}/{os.path.basename(p)}") as r:
                        assert len(r) == n
                    case[f"remote_open_ms_{v}"] = round((time.perf_counter() - t) * 1e3, 1)
                    case[f"remote_requests_{v}"] = srv.requests - before
            finally:
                srv.close()
            results["cases"][name] = case
            print(name, json.dumps(case))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
