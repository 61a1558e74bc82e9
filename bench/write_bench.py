"""Write throughput: rowstore.Writer against PyTables Table.append and h5py, same rows, same run.

    python bench/write_bench.py [--quick] [--out bench/results/write_bench.json] [--docs
    docs/performance.md]
    python bench/write_bench.py --per-row [--quick] [--out bench/results/write_bench_per_row.json]

Each writer writes the same in-memory rows (fixed-size: the tiny and patch workloads) to a fresh
file, including flush/fsync and close (rowstore's atomic rename is part of its time; PyTables
and h5py get an fsync too, for fairness). Median of repeats after a warm-up run; MB/s of row
bytes; ratios to PyTables in the same run.

``--per-row`` measures what preprocessing scripts do instead: one ``Writer.write(dict)`` per row
of Python values (6 fields: ``id`` int, ``label`` float into float32, ``name`` str, ``vector``
float32[16] ndarray, ``flag`` bool, ``score`` float) against PyTables' ``table.row`` (the
fields set one by one, ``row.append()``; ``name`` a ``StringCol(16)``, since a PyTables row has
no variable-length text), on the same rows in the same run; rows/s, medians, interleaved
repeats. A second case adds a variable-length ``tokens`` int32 field: rowstore stores it in the
heap, PyTables appends it to a ``VLArray`` beside the table, row by row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import rowstore
from rowstore.demo import demo_schema
from rowstore.format.spec import row_dtype
from rowstore.storage.atomic import fsync_path


def rows_for(name: str, n: int, rng) -> dict[str, np.ndarray]:
    if name == "tiny":
        return {
            "x": rng.standard_normal((n, 16), dtype=np.float32),
            "label": rng.integers(0, 10, n),
        }
    return {
        "foo": rng.standard_normal((n, 9, 9, 27)),
        "bar": rng.integers(0, 1000, (n, 9, 27)),
        "baz": rng.standard_normal(n),
    }


def write_rowstore(path, schema, cols, batch, compression=None):
    n = len(next(iter(cols.values())))
    with rowstore.Writer(path, schema, mode="w", compression=compression) as w:
        for a in range(0, n, batch):
            w.write_batch({k: v[a : a + batch] for k, v in cols.items()})


def write_tables(path, schema, cols, batch, compression=None):
    import tables

    dt = row_dtype(schema)
    filters = None
    n = len(next(iter(cols.values())))
    packed = np.empty(n, dt)
    with tables.open_file(path, "w") as f:
        t = f.create_table("/", "rows", description=dt, expectedrows=n, filters=filters)
        for a in range(0, n, batch):
            part = packed[a : a + batch]
            for k, v in cols.items():  # the user packs columns into records, as rowstore does
                part[k] = v[a : a + batch]
            t.append(part)
        t.flush()
    fsync_path(path)


def write_h5py(path, schema, cols, batch, compression=None):
    import h5py

    dt = row_dtype(schema)
    n = len(next(iter(cols.values())))
    chunk = max(1, (1 << 20) // dt.itemsize)
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("rows", shape=(n,), dtype=dt, chunks=(min(chunk, n),))
        buf = np.empty(batch, dt)
        for a in range(0, n, batch):
            m = min(batch, n - a)
            for k, v in cols.items():
                buf[k][:m] = v[a : a + m]
            ds[a : a + m] = buf[:m]
    fsync_path(path)


WRITERS = {"rowstore": write_rowstore, "pytables": write_tables, "h5py": write_h5py}


# -- per-row writes ------------------------------------------------------------------------
def per_row_schema(tokens: bool) -> rowstore.Schema:
    fields = [
        rowstore.Field("id", "int64"),
        rowstore.Field("label", "float32"),
        rowstore.Field("name", "str"),
        rowstore.Field("vector", "float32", (16,)),
        rowstore.Field("flag", "bool"),
        rowstore.Field("score", "float64"),
    ]
    if tokens:
        fields.append(rowstore.Field("tokens", "int32", (None,)))
    return rowstore.Schema(fields)


def per_row_rows(n: int, tokens: bool, rng) -> list[dict]:
    """Rows as a preprocessing script makes them: Python scalars, a str, small ndarrays."""
    vec = rng.standard_normal((n, 16), dtype=np.float32)
    ids, labels, scores = (
        rng.integers(0, 1 << 40, n).tolist(),
        rng.random(n).tolist(),
        rng.standard_normal(n).tolist(),
    )
    lens = rng.integers(0, 32, n).tolist()
    rows = []
    for i in range(n):
        row = {
            "id": ids[i],
            "label": labels[i],
            "name": f"item-{ids[i] % 100_000:05d}",
            "vector": vec[i].copy(),
            "flag": bool(ids[i] & 1),
            "score": scores[i],
        }
        if tokens:
            row["tokens"] = np.arange(lens[i], dtype=np.int32)
        rows.append(row)
    return rows


def per_row_rowstore(path: str, schema, rows: list[dict]) -> None:
    with rowstore.Writer(path, schema, mode="w") as w:
        write = w.write
        for row in rows:
            write(row)


def per_row_pytables(path: str, schema, rows: list[dict]) -> None:
    import tables

    desc = {
        "id": tables.Int64Col(pos=0),
        "label": tables.Float32Col(pos=1),
        "name": tables.StringCol(16, pos=2),
        "vector": tables.Float32Col(shape=(16,), pos=3),
        "flag": tables.BoolCol(pos=4),
        "score": tables.Float64Col(pos=5),
    }
    with tables.open_file(path, "w") as f:
        t = f.create_table("/", "rows", description=desc, expectedrows=len(rows))
        vl = (
            f.create_vlarray("/", "tokens", tables.Int32Atom(), expectedrows=len(rows))
            if "tokens" in schema
            else None
        )
        r = t.row
        for row in rows:
            r["id"] = row["id"]
            r["label"] = row["label"]
            r["name"] = row["name"]
            r["vector"] = row["vector"]
            r["flag"] = row["flag"]
            r["score"] = row["score"]
            r.append()
            if vl is not None:
                vl.append(row["tokens"])
        t.flush()
    fsync_path(path)


def per_row_main(args) -> int:
    n = args.rows or (20_000 if args.quick else 200_000)
    repeats = 1 if args.quick else args.repeats
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("ROWSTORE_BENCH_TMP")) as tmp:
        for tokens in (False, True):
            schema = per_row_schema(tokens)
            rows = per_row_rows(n, tokens, rng)
            fns = {"rowstore": per_row_rowstore, "pytables": per_row_pytables}
            times: dict[str, list[float]] = {k: [] for k in fns}
            for k, fn in fns.items():  # warm-up
                fn(os.path.join(tmp, f"{k}.h5"), schema, rows[: n // 10])
            for _ in range(repeats):  # interleaved, so that load on the machine hits both alike
                for k, fn in fns.items():
                    path = os.path.join(tmp, f"{k}.h5")
                    if os.path.exists(path):
                        os.unlink(path)
                    t = time.perf_counter()
                    fn(path, schema, rows)
                    times[k].append(time.perf_counter() - t)
            base = n / statistics.median(times["pytables"])
            for k, t in times.items():
                rate = n / statistics.median(t)
                results.append(
                    {
                        "workload": "per-row" + ("+tokens" if tokens else ""),
                        "fields": len(schema),
                        "rows": n,
                        "writer": k,
                        "median_s": statistics.median(t),
                        "rows_per_s": rate,
                        "ratio_to_pytables": rate / base,
                        "times_s": t,
                    }
                )
    report = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "repeats": repeats,
        "results": results,
    }
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    print("| workload | writer | rows/s (median) | vs PyTables row.append |\n|---|---|---:|---:|")
    for r in results:
        print(
            f"| {r['workload']} ({r['fields']} fields, {r['rows']:,} rows) | {r['writer']} | "
            f"{r['rows_per_s']:,.0f} | "
            f"{r['ratio_to_pytables']:.2f}x |"
        )
    return 0


def measure(fn, path, schema, cols, batch, repeats, compression=None) -> list[float]:
    fn(path, schema, cols, batch, compression)  # warm-up
    times = []
    for _ in range(repeats):
        if os.path.exists(path):
            os.unlink(path)
        t = time.perf_counter()
        fn(path, schema, cols, batch, compression)
        times.append(time.perf_counter() - t)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke test)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--out",
        default=None,
        help="JSON results (default bench/results/write_bench.json, "
        "or write_bench_per_row.json with --per-row)",
    )
    ap.add_argument(
        "--per-row",
        action="store_true",
        help="per-row Writer.write(dict) against PyTables row.append()",
    )
    ap.add_argument(
        "--rows",
        type=int,
        default=None,
        help="rows per --per-row case (default 200,000; 20,000 with --quick)",
    )
    ap.add_argument(
        "--docs", default=None, help="update the write_bench section of this markdown file"
    )
    args = ap.parse_args(argv)
    if args.per_row:
        args.out = args.out or "bench/results/write_bench_per_row.json"
        return per_row_main(args)
    args.out = args.out or "bench/results/write_bench.json"
    repeats = 1 if args.quick else args.repeats
    sizes = {"tiny": 50_000 if args.quick else 2_000_000, "patch": 500 if args.quick else 10_000}
    rng = np.random.default_rng(0)
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("ROWSTORE_BENCH_TMP")) as tmp:
        for name, n in sizes.items():
            schema = demo_schema(name)
            cols = rows_for(name, n, rng)
            nbytes = n * row_dtype(schema).itemsize
            for compression in (None, "lz4"):
                base = None
                for wname, fn in WRITERS.items():
                    if wname != "rowstore" and compression:
                        # the target compares uncompressed writes; compressed rowstore is reported
                        # alone
                        continue
                    t = measure(
                        fn,
                        os.path.join(tmp, f"{name}-{wname}.h5"),
                        schema,
                        cols,
                        4096 if name == "tiny" else 256,
                        repeats,
                        compression,
                    )
                    med = statistics.median(t)
                    row = {
                        "workload": name,
                        "rows": n,
                        "row_bytes": nbytes // n,
                        "compression": compression or "none",
                        "writer": wname,
                        "median_s": med,
                        "MB_per_s": nbytes / med / 1e6,
                        "times_s": t,
                    }
                    results.append(row)
                    if wname == "pytables":
                        base = row
                for row in results:
                    if (
                        row["workload"] == name
                        and row["compression"] == (compression or "none")
                        and base
                    ):
                        row["ratio_to_pytables"] = row["MB_per_s"] / base["MB_per_s"]
    report = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "repeats": repeats,
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    lines = [
        "| workload | compression | writer | MB/s (median) | vs PyTables |",
        "|---|---|---|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['workload']} ({r['rows']:,} x {r['row_bytes']:,} B) | {r['compression']} | "
            f"{r['writer']} | "
            f"{r['MB_per_s']:,.0f} | "
            + (f"{r['ratio_to_pytables']:.2f}x |" if "ratio_to_pytables" in r else "- |")
        )
    table = "\n".join(lines)
    print(table)
    if args.docs:
        intro = (
            "## Write benchmark (`bench/write_bench.py`)\n\n"
            "_Generated by `python bench/write_bench.py --docs docs/performance.md`._ The same "
            "in-memory rows "
            "(columns packed into records by each writer, as a user would) written to a fresh "
            "file, fsync and "
            f"close included; median of {repeats} runs after a warm-up, MB/s of row bytes, same "
            f"run. PyTables: "
            "`Table.append` of record batches; h5py: slice assignment into a chunked compound "
            "dataset; rowstore: "
            "`Writer.write_batch` (validation, atomic rename included).\n\n"
        )
        update_section(args.docs, "write_bench", intro + table + "\n")
    return 0


def update_section(path: str, key: str, body: str) -> None:
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Performance\n"
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
