"""Write a small image dataset with labels and captions, then read shuffled batches.

Run: python examples/quickstart.py [DIR]
"""

import os
import sys
import tempfile

import numpy as np

import rowstore

out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
path = os.path.join(out_dir, "quickstart.h5")

# 1. Describe a row once. None marks a variable dimension.
schema = rowstore.Schema(
    [
        rowstore.Field("image", "uint8", (32, 32, 3), codec="png"),
        rowstore.Field("label", "int64"),
        rowstore.Field("embedding", "float32", (8,)),
        rowstore.Field("caption", rowstore.STR, nullable=True),
        rowstore.Field("waveform", "float32", (None,)),
    ]
)

# 2. Write it from a preprocessing loop; the file appears only when the writer closes cleanly.
rng = np.random.default_rng(0)
with rowstore.Writer(path, schema, compression="lz4") as writer:
    for i in range(1000):
        writer.write(
            {
                "image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8),
                "label": i % 10,
                "embedding": rng.standard_normal(8).astype(np.float32),
                "caption": None if i % 4 == 0 else f"example {i}",
                "waveform": rng.standard_normal(int(rng.integers(100, 1000))).astype(np.float32),
            }
        )
    # Bad rows are refused with a message naming the field, the row and the expectation,
    # and nothing already written is lost.
    try:
        writer.write(
            {
                "image": np.zeros((32, 32), np.uint8),
                "label": 1,
                "embedding": np.zeros(8),
                "caption": "x",
                "waveform": np.zeros(3, np.float32),
            }
        )
    except rowstore.SchemaError as exc:
        print("refused:", exc)

# 3. Read: random access, and shuffled batches (block-shuffled, deterministic by seed/epoch).
reader = rowstore.open(path)
print(len(reader), "rows;", reader.schema.names)
print("row 5 caption:", reader[5]["caption"])
for epoch in range(2):
    seen = 0
    for batch in reader.batches(128, shuffle="block", seed=42, epoch=epoch):
        images = batch["image"]  # (n, 32, 32, 3) uint8, decoded from PNG by reader threads
        waves = batch["waveform"]  # Ragged: waves[i] is one clip, waves.to_padded() a dense array
        seen += len(images)
    print(f"epoch {epoch}: {seen} rows, first labels {batch['label'][:5]}")
print("shuffle quality (1 = uniform):", round(reader.shuffle_quality(128, window=4), 3))
