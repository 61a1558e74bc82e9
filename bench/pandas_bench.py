"""from_pandas on a speech table vs pandas' to_parquet of np.save'd cells (what users write
today) vs Writer.write_batch of the same columns. Median of N after a warm-up, JSON out.

    python bench/pandas_bench.py [--rows 2000] [--repeat 5] [--out results/pandas.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time

import numpy as np
import pandas as pd

import rowstore
from rowstore.pandas import from_pandas, infer_schema


def speech_table(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "wave": [rng.standard_normal(int(k)).astype(np.float32) for k in rng.integers(1_600, 16_000, n)],
        "speaker": [f"spk{i % 50}" for i in range(n)],
        "transcript": [f"utterance number {i}" for i in range(n)],
        "test": rng.random(n) < 0.2,
    })  # fmt: skip


def npsave(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def median_time(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    df = speech_table(args.rows)
    nbytes = sum(w.nbytes for w in df["wave"])
    schema = infer_schema(df, index=False)
    with tempfile.TemporaryDirectory() as d:
        def parquet():
            df.assign(wave=[npsave(w) for w in df["wave"]]).to_parquet(os.path.join(d, "t.parquet"))

        def rs_pandas():
            from_pandas(df, os.path.join(d, "a.h5"), index=False)

        def rs_batch():
            with rowstore.Writer(os.path.join(d, "b.h5"), schema) as w:
                w.write_batch({c: df[c].to_numpy() for c in df.columns})

        results = {name: median_time(fn, args.repeat) for name, fn in
                   [("from_pandas", rs_pandas), ("parquet_npsave", parquet), ("write_batch", rs_batch)]}  # fmt: skip
    report = {"rows": args.rows, "wave_MB": nbytes / 1e6,
              "seconds": results, "MB_per_s": {k: nbytes / 1e6 / v for k, v in results.items()}}  # fmt: skip
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
