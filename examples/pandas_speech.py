"""A speech table in pandas -> rowstore -> torch padded batches with lengths.

One row per clip: a float32 waveform of random length (an ndarray cell), speaker id and
transcript strings, a test-split flag, the dataset's name (categorical). ``from_pandas`` infers
the schema from every cell (the waveform's length is variable), ``read_pandas`` gives the
frame back exactly, and the torch loader pads waveforms per batch and says their lengths.

    python examples/pandas_speech.py [OUT_DIR]
"""

import os
import sys
import tempfile

import numpy as np
import pandas as pd

import rowstore
from rowstore.pandas import infer_schema


def speech_table(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1_600, 16_000, n)  # 0.1 s to 1 s at 16 kHz
    words = ["yes", "no", "up", "down", "café", "日本"]
    return pd.DataFrame(
        {
            "wave": [rng.standard_normal(k).astype(np.float32) * 0.1 for k in lengths],
            "speaker": pd.array([f"spk{i % 7:02d}" for i in range(n)], dtype="string"),
            "transcript": [" ".join(rng.choice(words, 3)) for _ in range(n)],
            "test": rng.random(n) < 0.2,
            "dataset": pd.Categorical(rng.choice(["commonvoice", "librispeech"], n)),
        },
        index=pd.Index([f"clip{i:05d}" for i in range(n)], name="clip_id"),
    )


def main(out_dir: str) -> None:
    df = speech_table(400)
    print("inferred:", [(f.name, str(f.dtype), f.shape) for f in infer_schema(df)])
    path = os.path.join(out_dir, "speech.h5")
    rowstore.from_pandas(df, path, block_bytes=256 << 10)

    back = rowstore.read_pandas(path)
    same = back.index.equals(df.index) and all(
        np.array_equal(a, b) for a, b in zip(back["wave"], df["wave"])
    )
    print("round trip exact:", same and back.drop(columns="wave").equals(df.drop(columns="wave")))
    print("train rows:", int((~back["test"]).sum()), "dtypes:", dict(back.dtypes.astype(str)))

    from rowstore.torch import BatchedDataLoader

    with BatchedDataLoader(
        path, batch_size=32, shuffle="full", seed=1, fields=["wave", "test"]
    ) as dl:
        for i, batch in enumerate(dl):
            wave, lengths = batch["wave"], batch["wave__shape"][:, 0]
            if i == 0:
                print(
                    f"batch: wave {tuple(wave.shape)} {wave.dtype}, lengths "
                    f"{tuple(lengths.shape)}, "
                    f"max length {int(lengths.max())} == padded width {wave.shape[1]}"
                )
            assert int(lengths.max()) == wave.shape[1]
    print("epoch done:", i + 1, "batches")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
