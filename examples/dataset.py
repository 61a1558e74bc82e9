"""Train from many files read as one dataset.

Data often arrives in pieces (one file per day, per writer process, per source). Each piece is
an ordinary rowstore file; ``rowstore.open([f1, f2, ...])`` reads them as one dataset: rows are
numbered across the files in order, and every epoch order (shuffled blocks, uniform shuffle,
DDP shards) spans all of them. The torch loaders take the same list.

Run: python examples/dataset.py [DIR]     (CPU; about a second)
"""

import os
import sys
import tempfile

import numpy as np
import torch

import rowstore
import rowstore.torch as rst

SCHEMA = rowstore.Schema(
    [
        rowstore.Field("x", "float32", (8,)),
        rowstore.Field("label", "int64"),
    ]
)


def write_pieces(directory: str, sizes=(3000, 1200, 2500)) -> list[str]:
    """One file per piece; the label is a fixed linear function of x in all of them."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    paths = []
    for k, n in enumerate(sizes):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        path = os.path.join(directory, f"part-{k:03d}.h5")
        with rowstore.Writer(path, SCHEMA) as writer:
            writer.write_batch({"x": x, "label": (x @ w).argmax(axis=1)})
        paths.append(path)
    return paths


def main(directory: str) -> None:
    paths = write_pieces(directory)
    with rowstore.open(paths) as reader:
        print(reader)  # one dataset: rows of all the files

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    with rst.BatchedDataLoader(paths, batch_size=256, shuffle="block", seed=1) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            losses = []
            for batch in loader:
                loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            print(f"epoch {epoch}: {len(losses)} batches, loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
