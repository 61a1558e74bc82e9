"""A speech table built on a Dask cluster, written as a sharded rowstore dataset, read back.

A ``distributed.LocalCluster`` of 2 worker processes generates the table's partitions itself
(one row per clip: a float32 waveform of random length as an ndarray cell, speaker and
transcript strings, a duration); :func:`rowstore.dask.to_rowstore` writes each partition on the
worker that computed it, split into shards of about ``shard_bytes``, and commits them all at
once (nothing is collected on the client but the shards' descriptions). The dataset is then
read back with :func:`rowstore.open` (one reader over all the shards) and lazily with
:func:`rowstore.dask.read_rowstore` (one partition per shard), whose per-speaker sums run on
the workers.

    python examples/dask_cluster.py [OUT_DIR]
"""

import os
import sys
import tempfile
import time

import dask
import dask.dataframe as dd
import distributed
import numpy as np
import pandas as pd

import rowstore
from rowstore.dask import read_rowstore, to_rowstore

PARTITIONS = 16
ROWS = 150  # per partition: 2400 clips, about 85 MB of waveforms
WORDS = ["yes", "no", "up", "down", "café", "日本"]


def make_partition(i: int) -> pd.DataFrame:
    """Partition ``i``, generated on a worker (its index continues the previous partition's)."""
    rng = np.random.default_rng(i)
    lengths = rng.integers(1_600, 16_000, ROWS)  # 0.1 s to 1 s at 16 kHz
    waves = np.empty(ROWS, dtype=object)  # one ndarray per cell
    waves[:] = [rng.standard_normal(k).astype(np.float32) * 0.1 for k in lengths]
    return pd.DataFrame(
        {
            "wave": waves,
            "speaker": np.array(
                [f"spk{(i * ROWS + j) % 7:02d}" for j in range(ROWS)], dtype=object
            ),
            "transcript": np.array(
                [" ".join(rng.choice(WORDS, 3)) for _ in range(ROWS)], dtype=object
            ),
            "dur": lengths / 16_000,
        },
        index=pd.RangeIndex(i * ROWS, (i + 1) * ROWS, name="clip"),
    )


def samples_per_speaker(df: pd.DataFrame) -> pd.Series:
    return df["wave"].map(len).groupby(df["speaker"]).sum()


def main(out_dir: str) -> None:
    path = os.path.join(out_dir, "speech")
    # Dask would turn object columns (the ndarray cells too) into strings: off for this job.
    dask.config.set({"dataframe.convert-string": False})
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster),
    ):
        meta = make_partition(0).iloc[:0]
        divisions = [i * ROWS for i in range(PARTITIONS)] + [PARTITIONS * ROWS - 1]
        ddf = dd.from_map(make_partition, range(PARTITIONS), meta=meta, divisions=divisions)
        t = time.perf_counter()
        version = to_rowstore(ddf, path, shard_bytes=4 << 20)
        print(
            f"wrote {PARTITIONS} partitions as version {version} in {time.perf_counter() - t:.1f} s"
        )

        with rowstore.open(path) as r:
            print(f"{r.num_rows} rows in {r.layout.num_shards} shards")
            clip = r[0]
            print(
                f"clip 0: {len(clip['wave'])} samples, speaker {clip['speaker']}, index "
                f"{int(clip['clip'])}"
            )

        back = read_rowstore(path)
        print(
            f"read_rowstore: {back.npartitions} partitions, divisions known: {back.known_divisions}"
        )
        per_speaker = back.map_partitions(samples_per_speaker, meta=("wave", "int64")).compute()
        per_speaker = per_speaker.groupby(level=0).sum()
        expected = sum(
            pd.Series(np.random.default_rng(i).integers(1_600, 16_000, ROWS))  # the lengths drawn
            .groupby([f"spk{(i * ROWS + j) % 7:02d}" for j in range(ROWS)])
            .sum()
            for i in range(PARTITIONS)
        )
        assert per_speaker.sort_index().equals(expected.sort_index()), (per_speaker, expected)
        print(
            f"{len(per_speaker)} speakers, {int(per_speaker.sum())} samples in all (as generated)"
        )
        print(f"rows 1000..1002: {back.loc[1000:1002, 'transcript'].compute().tolist()}")


if __name__ == "__main__":  # the worker processes import this module: the cluster only here
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
