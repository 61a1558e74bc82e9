"""Peer writers for bench/ingest_bench.py that run in their own venvs (FFCV, Lance).

    <venv>/bin/python bench/ingest_peers.py ffcv|lance LIST DEST [--workers N]

``LIST`` is a JSON file of ``[[path, label], ...]`` (the bench's files, in its order). The child
imports its library first, then times only the write: reading the source files (and for FFCV
decoding them) is inside the timed part, as it is for rowstore's writers. It prints one line,
``PEER-RESULT {"seconds": s, "rows": n, "bytes": b}``, the rows counted back from what it wrote
(outside the timed part). Only the standard library at import time: each venv brings its own
library and nothing of rowstore's.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def dir_bytes(dest: str) -> int:
    if os.path.isfile(dest):
        return os.path.getsize(dest)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(dest) for f in files)


def ffcv_write(items: list, dest: str, workers: int) -> tuple[float, int]:
    """FFCV 1.0 ``DatasetWriter``: each PNG read and decoded (OpenCV, as FFCV itself uses) and
    stored with ``RGBImageField(write_mode="raw")`` (the pixels as they are: the least work FFCV
    can do, it has no mode that keeps PNG bytes) and an ``IntField`` label."""
    import cv2
    from ffcv.fields import IntField, RGBImageField
    from ffcv.reader import Reader
    from ffcv.writer import DatasetWriter

    class Files:
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            path, label = items[i]
            img = cv2.imread(path, cv2.IMREAD_COLOR)
            return cv2.cvtColor(img, cv2.COLOR_BGR2RGB), label

    t = time.perf_counter()
    DatasetWriter(
        dest,
        {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        num_workers=workers,
    ).from_indexed_dataset(Files())
    dt = time.perf_counter() - t
    return dt, int(Reader(dest).num_samples)


def lance_write(items: list, dest: str, workers: int) -> tuple[float, int]:
    """``lance.write_dataset`` of a pyarrow table (``image``: the PNG bytes as they are,
    ``label``: int64), the files read into it inside the timed part."""
    import lance
    import pyarrow as pa

    t = time.perf_counter()
    images = []
    for path, _ in items:
        with open(path, "rb") as fh:
            images.append(fh.read())
    table = pa.table(
        {
            "image": pa.array(images, type=pa.large_binary()),
            "label": pa.array([lab for _, lab in items], type=pa.int64()),
        }
    )
    lance.write_dataset(table, dest, mode="create")
    dt = time.perf_counter() - t
    return dt, lance.dataset(dest).count_rows()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("peer", choices=["ffcv", "lance"])
    ap.add_argument("list")
    ap.add_argument("dest")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    with open(args.list) as fh:
        items = json.load(fh)
    fn = {"ffcv": ffcv_write, "lance": lance_write}[args.peer]
    seconds, rows = fn(items, args.dest, args.workers)
    out = {"seconds": seconds, "rows": rows, "bytes": dir_bytes(args.dest)}
    print("PEER-RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
