# ruff: noqa: UP008, UP032 - Petastorm's example code is kept as it is written
"""Petastorm's own examples, run as they are written with rowstore's imports swapped in (as
docs/petastorm.md says): examples/mnist/pytorch_example.py (train and test loops over
``DataLoader(make_reader(..., transform_spec=TransformSpec(f, removed_fields=['idx']),
seed=..., shuffle_rows=True))``) and the README's PyTorch section; and TransformSpec's
``edit_fields`` / ``removed_fields`` / ``selected_fields`` as Petastorm defines them, in plain
iteration, ``make_batch_reader`` and ``rowstore.petastorm.DataLoader``."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema, SchemaError

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.optim as optim  # noqa: E402

import rowstore.torch as rst  # noqa: E402
from rowstore.petastorm import DataLoader, TransformSpec, make_reader  # noqa: E402  (petastorm's)

try:
    from torchvision import transforms
except (
    ImportError
):  # torchvision is no test dependency: the three transforms the examples use, as it defines them

    class transforms:  # noqa: N801 - torchvision's module name
        class Compose:
            def __init__(self, fs):
                self.fs = fs

            def __call__(self, x):
                for f in self.fs:
                    x = f(x)
                return x

        class Lambda:
            def __init__(self, f):
                self.f = f

            def __call__(self, x):
                return self.f(x)

        class ToTensor:  # HxW or HxWxC uint8 ndarray -> CxHxW float tensor in [0, 1]
            def __call__(self, nd):
                nd = nd[:, :, None] if nd.ndim == 2 else nd
                return (
                    torch.from_numpy(np.ascontiguousarray(nd.transpose(2, 0, 1))).float().div(255)
                )

        class Normalize:
            def __init__(self, mean, std):
                self.mean, self.std = (
                    torch.tensor(mean)[:, None, None],
                    torch.tensor(std)[:, None, None],
                )

            def __call__(self, t):
                return (t - self.mean) / self.std


# Petastorm's MnistSchema (examples/mnist/schema.py): idx, digit, image (28, 28) uint8
MNIST = Schema([Field("idx", "int64"), Field("digit", "int64"), Field("image", "uint8", (28, 28))])
N_TRAIN, N_TEST = 96, 40


def _image(i: int) -> np.ndarray:
    return np.full((28, 28), (i * 7) % 256, np.uint8)


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    """``file://`` URL of a directory with ``train`` and ``test`` datasets of MnistSchema."""
    root = str(tmp_path_factory.mktemp("mnist"))
    for part, n in (("train", N_TRAIN), ("test", N_TEST)):
        with rowstore.DatasetWriter(
            os.path.join(root, part), MNIST, rows_per_block=8, shard_bytes=20_000
        ) as w:
            for i in range(n):
                w.write({"idx": i, "digit": i % 10, "image": _image(i)})
    return "file://" + root


def _normalized(i: int) -> float:
    return ((i * 7) % 256 / 255 - 0.1307) / 0.3081


# -- examples/mnist/pytorch_example.py, as written (argparse defaults; the dataset made small) --
class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(model, device, train_loader, log_interval, optimizer, epoch):
    model.train()
    seen = 0
    for batch_idx, row in enumerate(train_loader):
        data, target = row["image"].to(device), row["digit"].to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % log_interval == 0:
            print(
                "Train Epoch: {} [{}]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), loss.item()
                )
            )
        seen += len(data)
    return seen


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    count = 0
    with torch.no_grad():
        for row in test_loader:
            data, target = row["image"].to(device), row["digit"].to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.max(1, keepdim=True)[1]  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()
            count += data.shape[0]

    test_loss /= count
    print(
        "\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n".format(
            test_loss, correct, count, 100.0 * correct / count
        )
    )
    return count, test_loss


test.__test__ = False  # the example's function, not a pytest test


def _transform_row(mnist_row):
    # For this example, the images are stored as simpler ndarray (28,28), but the
    # training network expects 3-dim images, hence the additional lambda transform.
    transform = transforms.Compose(
        [
            transforms.Lambda(lambda nd: nd.reshape(28, 28, 1)),
            transforms.ToTensor(),
            transforms.Normalize((0.1307,), (0.3081,)),
        ]
    )
    # In addition, the petastorm pytorch DataLoader does not distinguish the notion of
    # data or target transform, but that actually gives the user more flexibility
    # to make the desired partial transform, as shown here.
    result_row = {"image": transform(mnist_row["image"]), "digit": mnist_row["digit"]}

    return result_row


@pytest.mark.parametrize("all_epochs", [False, True])
def test_mnist_pytorch_example_as_written(mnist, all_epochs, capsys):
    epochs, seed, batch_size, test_batch_size = 2, 1, 64, 1000
    torch.manual_seed(seed)
    device = torch.device("cpu")
    model = Net().to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    if all_epochs:
        loop_epochs, reader_epochs = 1, epochs
    else:
        loop_epochs, reader_epochs = epochs, 1

    transform = TransformSpec(_transform_row, removed_fields=["idx"])

    for epoch in range(1, loop_epochs + 1):
        with DataLoader(
            make_reader(
                "{}/train".format(mnist),
                num_epochs=reader_epochs,
                transform_spec=transform,
                seed=seed,
                shuffle_rows=True,
            ),
            batch_size=batch_size,
        ) as train_loader:
            assert (
                train(model, device, train_loader, 10, optimizer, epoch) == N_TRAIN * reader_epochs
            )
        with DataLoader(
            make_reader(
                "{}/test".format(mnist), num_epochs=reader_epochs, transform_spec=transform
            ),
            batch_size=test_batch_size,
        ) as test_loader:
            count, loss = test(model, device, test_loader)
            assert count == N_TEST * reader_epochs and math.isfinite(loss)
    out = capsys.readouterr().out
    assert out.count("Train Epoch:") == loop_epochs * (
        1 + (N_TRAIN * reader_epochs - 1) // batch_size // 10
    )
    assert out.count("Test set: Average loss") == loop_epochs


def test_mnist_transform_rows_and_batches(mnist):
    transform = TransformSpec(_transform_row, removed_fields=["idx"])
    with make_reader(
        mnist + "/train", transform_spec=transform, shuffle_row_groups=False
    ) as reader:
        assert reader.schema.names == ["digit", "image"]
        rows = list(reader)
    assert len(rows) == N_TRAIN and rows[0]._fields == ("digit", "image")  # idx removed
    for i, row in enumerate(rows[:9]):
        assert (
            row.digit == i % 10
            and isinstance(row.image, torch.Tensor)
            and row.image.shape == (1, 28, 28)
        )
        assert torch.allclose(row.image, torch.full((1, 28, 28), _normalized(i)))
    with DataLoader(
        make_reader(
            mnist + "/train",
            transform_spec=transform,
            shuffle_row_groups=False,
            predicate=lambda b: b["digit"] < 5,
        ),
        batch_size=16,
    ) as loader:
        batches = list(loader)
    assert all(sorted(b) == ["digit", "image"] for b in batches)
    image, digit = (
        torch.cat([b["image"] for b in batches]),
        torch.cat([b["digit"] for b in batches]),
    )
    want = [i for i in range(N_TRAIN) if i % 10 < 5]
    assert digit.tolist() == [i % 10 for i in want] and image.dtype == torch.float32
    assert torch.allclose(image[:, 0, 0, 0], torch.tensor([_normalized(i) for i in want]))
    # the change declared, as Petastorm's edit_fields tuple: the same batches
    declared = TransformSpec(
        _transform_row,
        edit_fields=[("image", np.float32, (1, 28, 28), False)],
        removed_fields=["idx"],
    )
    with DataLoader(
        make_reader(
            mnist + "/train",
            transform_spec=declared,
            shuffle_row_groups=False,
            predicate=lambda b: b["digit"] < 5,
        ),
        batch_size=16,
    ) as loader:
        assert loader.output_schema["image"] == Field("image", "float32", (1, 28, 28))
        assert torch.equal(torch.cat([b["image"] for b in loader]), image)
    wrong = TransformSpec(
        _transform_row, edit_fields=[("image", np.float32, (28, 28), False)], removed_fields=["idx"]
    )
    with pytest.raises(SchemaError, match=r"'image' must have shape \(28, 28\)") as ei:
        next(iter(DataLoader(make_reader(mnist + "/train", transform_spec=wrong), batch_size=4)))
    assert ei.value.field == "image"


def test_readme_pytorch_example_as_written(mnist):
    """The README's ``_transform_row`` returns a tuple: Petastorm builds each row with
    ``make_namedtuple(**row)``, so it fails there too; here the error says what is expected."""
    torch.manual_seed(1)

    def _transform_row(mnist_row):
        transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
        )
        return (transform(mnist_row["image"]), mnist_row["digit"])

    transform = TransformSpec(_transform_row, removed_fields=["idx"])
    with pytest.raises(TypeError, match="must return a dict of the row's fields .* got tuple"):
        with DataLoader(
            make_reader(
                mnist + "/train", num_epochs=10, transform_spec=transform, seed=1, shuffle_rows=True
            ),
            batch_size=64,
        ) as loader:
            next(iter(loader))
    with pytest.raises(TypeError, match="must return a dict"):
        next(iter(make_reader(mnist + "/test", num_epochs=10, transform_spec=transform)))


# -- TransformSpec as Petastorm defines it -----------------------------------------------------
def test_transform_spec_fields_in_rows_batches_and_loader(mnist):
    def add(row):  # edits in place: a new field, a changed one; leaves idx for removed_fields
        row["big"] = row["idx"] >= 50
        row["digit"] = np.float64(row["digit"]) / 2
        return row

    spec = TransformSpec(add, [("big", np.bool_, (), False), ("digit", np.float64, ())], ["idx"])
    with make_reader(mnist + "/test", transform_spec=spec, shuffle_row_groups=False) as reader:
        assert (
            reader.schema.names == ["digit", "image", "big"]
            and reader.schema["digit"].dtype == np.float64
        )
        rows = list(reader)
    assert [r.big for r in rows] == [i >= 50 for i in range(N_TEST)] and rows[3].digit == 1.5
    assert all("idx" not in r._fields for r in rows)
    with DataLoader(
        make_reader(mnist + "/test", transform_spec=spec, shuffle_row_groups=False), batch_size=8
    ) as loader:
        b = next(iter(loader))
    assert sorted(b) == ["big", "digit", "image"] and b["digit"].dtype == torch.float64
    assert b["digit"].tolist() == [i % 10 / 2 for i in range(8)] and b["image"].dtype == torch.uint8

    # selected_fields: only these, in this order
    sel = TransformSpec(add, edit_fields=[("big", np.bool_, ())], selected_fields=["big", "idx"])
    with make_reader(mnist + "/test", transform_spec=sel, shuffle_row_groups=False) as reader:
        row = next(iter(reader))
        assert (
            reader.schema.names == ["big", "idx"] and row._fields == ("big", "idx") and row.idx == 0
        )
    with DataLoader(
        make_reader(mnist + "/test", transform_spec=sel, shuffle_row_groups=False), batch_size=5
    ) as dl:
        assert list(next(iter(dl))) == ["big", "idx"]

    # removed_fields alone, without a function (Petastorm allows it)
    with make_reader(
        mnist + "/test", transform_spec=TransformSpec(removed_fields=["image"])
    ) as reader:
        assert next(iter(reader))._fields == ("idx", "digit")

    # make_batch_reader: the function gets each batch
    def per_batch(b):
        return {"idx": b["idx"], "mean": b["image"].mean(axis=(1, 2)), "image": b["image"]}

    bspec = TransformSpec(
        per_batch, edit_fields=[("mean", np.float64, ())], removed_fields=["digit", "image"]
    )
    with rowstore.make_batch_reader(
        mnist + "/test", batch_size=16, transform_spec=bspec, shuffle=False
    ) as reader:
        batches = list(reader)
    assert batches[0]._fields == ("idx", "mean") and len(batches[0].idx) == 16
    np.testing.assert_allclose(
        np.concatenate([b.mean for b in batches]), [(i * 7) % 256 for i in range(N_TEST)]
    )
    with DataLoader(
        rowstore.make_batch_reader(mnist + "/test", transform_spec=bspec, shuffle=False),
        batch_size=10,
    ) as loader:
        got = list(loader)
    assert sorted(got[0]) == ["idx", "mean"] and torch.cat(
        [b["idx"] for b in got]
    ).tolist() == list(range(N_TEST))

    # outputs that break the declared schema: named errors
    undeclared = TransformSpec(lambda r: {**r, "extra": 1})
    with pytest.raises(SchemaError, match="returned field 'extra'.*edit_fields") as ei:
        next(iter(make_reader(mnist + "/test", transform_spec=undeclared)))
    assert ei.value.field == "extra"
    lacking = TransformSpec(lambda r: {"idx": r["idx"]})
    with pytest.raises(SchemaError, match="lacks field 'digit'.*removed_fields"):
        next(iter(make_reader(mnist + "/test", transform_spec=lacking)))
    with pytest.raises(SchemaError, match="returned field 'extra'"):
        next(
            iter(
                rowstore.make_batch_reader(
                    mnist + "/test",
                    transform_spec=TransformSpec(lambda b: {**b, "extra": b["idx"]}),
                )
            )
        )
    with pytest.raises(SchemaError, match=r"removed_fields \['nope'\]"):
        make_reader(mnist + "/test", transform_spec=TransformSpec(removed_fields=["nope"]))
    assert rst.TransformSpec is TransformSpec
