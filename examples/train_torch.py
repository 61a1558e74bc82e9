"""Train a small PyTorch model from a rowstore file, three ways.

1. ``BatchedDataLoader``: the fast path (no DataLoader), resumable mid-epoch.
2. ``DataLoader(num_workers=2)`` over the map-style ``Dataset`` (one ``Reader.take`` per batch).
3. ``DataLoader(num_workers=2)`` over the ``IterableDataset`` (each worker reads its shard).

Run: python examples/train_torch.py [DIR]     (CPU; a few seconds)
"""

import os
import sys
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader

import rowstore
import rowstore.torch as rst


def write_dataset(path: str, rows: int = 8192) -> None:
    """Rows of 16 features whose label (4 classes) is a fixed linear function of them."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((rows, 16)).astype(np.float32)
    schema = rowstore.Schema(
        [
            rowstore.Field("x", "float32", (16,)),
            rowstore.Field("label", "int64"),
            rowstore.Field("source", rowstore.STR),
        ]
    )
    with rowstore.Writer(path, schema) as writer:
        writer.write_batch(
            {
                "x": x,
                "label": (x @ w).argmax(axis=1),
                "source": [f"sensor-{i % 7}" for i in range(rows)],
            }
        )


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.2)


def step(model, opt, x, y) -> float:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


# A batch transform that declares what it changes: it standardizes x, and drops the str field
# the model does not use, so the loader's output schema is known before the first batch.
def standardize(batch):
    x = batch["x"]
    batch["x"] = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
    return batch


TRANSFORM = rst.TransformSpec(standardize, removed_fields=["source"])


def main(out_dir: str) -> None:
    path = os.path.join(out_dir, "train.h5")
    write_dataset(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # 1. BatchedDataLoader: torch tensors straight from the reader's arrays.
    model, opt = make_model()
    with rst.BatchedDataLoader(
        path, batch_size=256, shuffle="block", seed=0, device=device, transform=TRANSFORM
    ) as loader:
        print("output schema:", loader.output_schema.names)
        losses = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                losses.append(step(model.to(device), opt, batch["x"], batch["label"]))
                if epoch == 1 and loader.position == 256 * 10:
                    saved = loader.state_dict()  # e.g. with the model's checkpoint
        print(f"BatchedDataLoader: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    # Resume: a new loader (as after a restart) continues epoch 1 after its 10th batch.
    with rst.BatchedDataLoader(path, batch_size=256, seed=0, transform=TRANSFORM) as loader:
        loader.load_state_dict(saved)
        loader.set_epoch(saved["epoch"])
        print(f"resumed at epoch {loader.epoch}, row {loader.position}: {len(loader)} batches left")

    # 2. Map-style Dataset with DataLoader workers: __getitems__ reads a batch with one take.
    model, opt = make_model()
    ds = rst.Dataset(path, fields=["x", "label"])
    dl = DataLoader(
        ds,
        batch_size=128,
        shuffle=True,
        num_workers=2,
        collate_fn=rst.collate,
        generator=torch.Generator().manual_seed(0),
    )
    losses = [step(model, opt, b["x"], b["label"]) for _, b in zip(range(40), dl)]
    print(
        f"Dataset + DataLoader(num_workers=2): {len(losses)} steps, loss {losses[0]:.3f} -> "
        f"{losses[-1]:.3f}"
    )

    # 3. IterableDataset: worker w of W reads shard w of the epoch (times the DDP rank, if any).
    model, opt = make_model()
    ids = rst.IterableDataset(path, batch_size=128, seed=0, fields=["x", "label"])
    dl = DataLoader(ids, batch_size=None, num_workers=2)
    losses = []
    rows = 0
    for epoch in range(2):
        ids.set_epoch(epoch)
        for b in dl:
            rows += len(b["label"])
            losses.append(step(model, opt, b["x"], b["label"]))
    print(
        f"IterableDataset + DataLoader(num_workers=2): {rows} rows in 2 epochs, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
