"""Dask ``to_rowstore`` on a 2-process LocalCluster against a single-process write.

    python bench/dask_bench.py [--rows 4300] [--partitions 8] [--repeats 3] [--dir DIR]
                               [--out bench/results/dask_bench.json]

The speech-like table (float32 waveforms of 1,600..16,000 samples, a str transcript, an int
speaker id; ~150 MB of waveforms at the default 4,300 rows) is written as a dataset directory
(``shard_bytes`` 32 MB) by

* ``serial``: :func:`rowstore.pandas.from_pandas` ``(df, path, dataset=True)`` in this process;
* ``dask``: :func:`rowstore.dask.to_rowstore` on a ``distributed.LocalCluster(n_workers=2,
  threads_per_worker=1, processes=True)``, the frame's partitions already in the workers'
  memory (``persist``: the bench times the writing, not the shipping of the frame), schema
  inferred (object columns: one describing pass over the partitions on the workers, then the
  writing pass);
  (each partition's ``RangeIndex`` is stored as an int64 field, 8 bytes a row more than
  ``serial``, which keeps its ``RangeIndex`` in the attributes).

The two alternate (one warm-up each first); the report gives each one's median wall time of
``--repeats`` runs, MB/s of waveforms, the ratio serial / dask, and the mean CPU use of each core
during the runs (``psutil.cpu_percent(percpu=True)`` sampled every 0.1 s, when psutil is there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dask  # noqa: E402
import dask.dataframe as dd  # noqa: E402
import distributed  # noqa: E402
import pandas as pd  # noqa: E402

import rowstore  # noqa: E402
from rowstore.dask import to_rowstore  # noqa: E402
from rowstore.pandas import from_pandas  # noqa: E402

try:
    import psutil
except ImportError:  # the CPU columns are then left out
    psutil = None

SHARD_BYTES = 32 << 20


def speech_frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1_600, 16_000, n)
    waves = np.empty(n, dtype=object)
    waves[:] = [rng.standard_normal(k).astype(np.float32) * 0.1 for k in lengths]
    words = ["yes", "no", "up", "down", "café", "日本"]
    return pd.DataFrame(
        {
            "wave": waves,
            "transcript": np.array(
                [" ".join(rng.choice(words, 3)) for _ in range(n)], dtype=object
            ),
            "speaker": rng.integers(0, 500, n),
        }
    )


class CpuSampler:
    """Mean per-core CPU percent over a ``with`` block (psutil), sampled in a thread."""

    def __init__(self, interval: float = 0.1):
        self.interval, self.samples = interval, []
        self._stop = threading.Event()

    def __enter__(self):
        if psutil is not None:
            psutil.cpu_percent(percpu=True)  # starts the interval
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self.samples.append(psutil.cpu_percent(percpu=True))

    def __exit__(self, *exc):
        self._stop.set()
        if psutil is not None:
            self._thread.join()
            self.samples.append(psutil.cpu_percent(percpu=True))

    def per_core(self) -> list[float] | None:
        if psutil is None or not self.samples:
            return None
        return [round(float(v), 1) for v in np.mean(np.array(self.samples), axis=0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4300)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--dir", default=None, help="where the datasets go (default: a temporary directory)"
    )
    ap.add_argument(
        "--out",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "dask_bench.json"
        ),
    )
    args = ap.parse_args()
    dask.config.set({"dataframe.convert-string": False})  # ndarray cells stay ndarrays
    root = tempfile.mkdtemp(prefix="dask_bench_", dir=args.dir)
    try:
        df = speech_frame(args.rows)
        wave_mb = sum(w.nbytes for w in df["wave"]) / 1e6
        print(
            f"{args.rows} rows, {wave_mb:.0f} MB of waveforms, {args.partitions} partitions",
            flush=True,
        )
        with (
            distributed.LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=40,
                local_directory=os.path.join(root, "dask"),
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            with warnings.catch_warnings():  # "Sending large graph": the frame, shipped once here
                warnings.simplefilter("ignore", UserWarning)
                ddf = dd.from_pandas(df, npartitions=args.partitions).persist()
            distributed.wait(ddf)
            run = {
                "serial": lambda p: from_pandas(df, p, dataset=True, shard_bytes=SHARD_BYTES),
                "dask": lambda p: to_rowstore(ddf, p, shard_bytes=SHARD_BYTES),
            }
            times: dict[str, list[float]] = {k: [] for k in run}
            cpu: dict[str, list[list[float]]] = {k: [] for k in run}
            shards: dict[str, int] = {}
            for rep in range(args.repeats + 1):  # the first round is the warm-up
                for name, fn in run.items():
                    path = os.path.join(root, f"{name}-{rep}")
                    with CpuSampler() as s:
                        t = time.perf_counter()
                        fn(path)
                        dt = time.perf_counter() - t
                    with rowstore.open(path) as r:
                        assert r.num_rows == args.rows, (name, r.num_rows)
                        shards[name] = r.layout.num_shards
                    shutil.rmtree(path)
                    if rep:
                        times[name].append(dt)
                        if s.per_core() is not None:
                            cpu[name].append(s.per_core())
                    print(
                        f"  {'warm-up' if not rep else f'run {rep}'} {name}: {dt:.2f} s, cpu "
                        f"{s.per_core()}",
                        flush=True,
                    )
            client.cancel(ddf)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "config": {
            "rows": args.rows,
            "wave_mb": round(wave_mb, 1),
            "partitions": args.partitions,
            "repeats": args.repeats,
            "shard_bytes": SHARD_BYTES,
            "cores": os.cpu_count(),
            "cluster": "LocalCluster(n_workers=2, threads_per_worker=1, processes=True)",
            "python": platform.python_version(),
            "dask": dask.__version__,
            "dir": "temporary" if args.dir is None else args.dir,
        },
        "variants": {
            k: {
                "times_s": [round(t, 3) for t in times[k]],
                "median_s": round(med[k], 3),
                "wave_mb_per_s": round(wave_mb / med[k], 1),
                "shards": shards[k],
                "cpu_percent_per_core": (
                    [round(float(v), 1) for v in np.mean(cpu[k], axis=0)] if cpu[k] else None
                ),
            }
            for k in run
        },
        "ratio_serial_over_dask": round(med["serial"] / med["dask"], 2),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
