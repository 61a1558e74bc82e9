"""Petastorm's reading idioms over rowstore: make_reader / make_batch_reader (num_epochs,
shuffle, cur_shard/shard_count, a vectorized predicate, schema_fields by name or regex,
transform_spec), rowstore.torch.DataLoader, file:// URLs, fields= as Field objects and
Reader.batches(shuffle=True)."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema, SchemaError

SCHEMA = Schema([
    Field("id", "int64"),
    Field("image_a", "uint8", (4, 4)),
    Field("image_b", "uint8", (None, 2)),
    Field("label", "int16", nullable=True),
])  # fmt: skip
N = 57


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("idioms") / "ds")
    with rowstore.DatasetWriter(path, SCHEMA, shard_bytes=600, rows_per_block=5) as w:
        for i in range(N):
            w.write({"id": i, "image_a": np.full((4, 4), i % 256, np.uint8),
                     "image_b": np.full((i % 3, 2), i % 256, np.uint8), "label": None if i % 10 == 0 else i})  # fmt: skip
    return path


def test_make_reader_rows_epochs_and_fields(ds):
    with rowstore.make_reader("file://" + ds, num_epochs=2, schema_fields=["id", "image_.*"], seed=4) as reader:
        rows = list(reader)
        assert reader.schema.names == ["id", "image_a", "image_b"]
    assert len(rows) == 2 * N and rows[0]._fields == ("id", "image_a", "image_b")
    ids = [r.id for r in rows]
    assert sorted(ids[:N]) == sorted(ids[N:]) == list(range(N)) and ids[:N] != ids[N:]  # shuffled, new order each epoch
    for r in rows[:10]:
        assert (r.image_a == r.id % 256).all() and r.image_b.shape == (r.id % 3, 2)
    with rowstore.make_reader(ds, shuffle=False, schema_fields=[SCHEMA["label"], "id"]) as reader:
        rows = list(reader)
    assert [r.id for r in rows] == list(range(N))
    assert [r.label for r in rows[:3]] == [None, 1, 2]
    with pytest.raises(SchemaError, match=r"'nope\.\*' matches no field"):
        rowstore.make_reader(ds, schema_fields=["nope.*"])


def test_make_reader_shards_predicate_transform(ds):
    parts = []
    for k in range(3):
        with rowstore.make_reader(ds, cur_shard=k, shard_count=3, schema_fields=["id"]) as reader:
            parts.append([r.id for r in reader])
    assert sorted(sum(parts, [])) == list(range(N)) and all(len(p) == N // 3 for p in parts)

    def even(batch):  # vectorized: one bool per row of the batch
        return batch["id"] % 2 == 0

    def plus_one(batch):  # sees the selected fields only (predicate_fields are dropped first)
        assert sorted(batch) == ["image_a"]
        return {"image_a": batch["image_a"] + 1}

    with rowstore.make_batch_reader(ds, batch_size=8, shuffle=False, schema_fields=["image_a"], predicate=even,
                                    predicate_fields=["id"], transform_spec=plus_one) as reader:  # fmt: skip
        batches = list(reader)
    assert all(b._fields == ("image_a",) for b in batches)
    got = np.concatenate([b.image_a[:, 0, 0] for b in batches])
    np.testing.assert_array_equal(got, np.arange(0, N, 2) % 256 + 1)
    with pytest.raises(ValueError, match="bool array of shape"):
        list(rowstore.make_reader(ds, predicate=lambda b: b["id"]))


def test_torch_dataloader_petastorm_names(ds):
    torch = pytest.importorskip("torch")
    import rowstore.torch as rst

    reader = rowstore.make_reader(ds, num_epochs=2, schema_fields=["id", "label"], predicate=lambda b: b["id"] < 30)
    with rst.DataLoader(reader, batch_size=4) as loader:
        ids = [t for b in loader for t in b["id"].tolist()]
        assert isinstance(loader, rst.BatchedDataLoader)
    assert sorted(ids) == sorted(list(range(30)) * 2)
    with rst.DataLoader(ds, batch_size=10, shuffle=True, fields=[SCHEMA["id"]]) as loader:
        assert sorted(torch.cat([b["id"] for b in loader]).tolist()) == list(range(N))
    with pytest.raises(ValueError, match="collate_fn"):
        rst.DataLoader(ds, batch_size=4, collate_fn=lambda x: x)


def test_reader_accepts_petastorm_style_arguments(ds):
    with rowstore.open("file://" + ds) as r:
        block = [b["id"] for b in r.batches(10, shuffle="block", seed=2)]
        true = [b["id"] for b in r.batches(10, shuffle=True, seed=2)]
        assert all((a == b).all() for a, b in zip(block, true, strict=True))
        none = np.concatenate([b["id"] for b in r.batches(10, shuffle=False)])
        np.testing.assert_array_equal(none, np.arange(N))
        b = next(r.batches(5, shuffle=False, fields=[SCHEMA["image_a"], "id"]))
        assert sorted(b) == ["id", "image_a"]
        assert sorted(r.take([1, 2], fields=[SCHEMA["label"]])) == ["label", "label__null"]
    with pytest.raises(ValueError, match="absolute path"):  # (other URLs go to the remote store: test_remote.py)
        rowstore.open("file://relative/ds")
