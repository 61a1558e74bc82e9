"""The torch adapters' per-batch paths against the core reader: ``varlen="ragged"`` (the
reader's values and offsets as tensors), IterableDataset cutting tensors from whole reads, and
ResumableDataLoader without workers handing the dataset's batches out directly. Each gives
what the core reader (or torch's own DataLoader iterator) gives, batch for batch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import rowstore  # noqa: E402
import rowstore.torch as rst  # noqa: E402
from rowstore import Field, Schema  # noqa: E402
from rowstore.reader.buffers import Ragged  # noqa: E402

N = 157


@pytest.fixture(scope="module")
def var_path(tmp_path_factory) -> str:
    """``id`` (int64), ``wave`` (float32, 0-40 samples), ``grid`` (int16 (None, 3, None)),
    ``note`` (str), 10 blocks of 16 rows."""
    p = str(tmp_path_factory.mktemp("adapter_paths") / "var.h5")
    schema = Schema(
        [
            Field("id", "int64"),
            Field("wave", "float32", (None,)),
            Field("grid", "int16", (None, 3, None)),
            Field("note", "str"),
        ]
    )
    rng = np.random.default_rng(7)
    with rowstore.Writer(p, schema, rows_per_block=16) as w:
        w.write_batch(
            {
                "id": np.arange(N, dtype=np.int64),
                "wave": [
                    rng.standard_normal(int(k), dtype=np.float32) for k in rng.integers(0, 41, N)
                ],
                "grid": [
                    rng.integers(-99, 99, (int(a), 3, int(b))).astype(np.int16)
                    for a, b in rng.integers(0, 4, (N, 2))
                ],
                "note": [f"row {i}" for i in range(N)],
            }
        )
    return p


@pytest.fixture(scope="module")
def dense_path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("adapter_paths") / "dense.h5")
    schema = Schema([Field("id", "int64"), Field("x", "float32", (3,))])
    ids = np.arange(N, dtype=np.int64)
    with rowstore.Writer(p, schema, rows_per_block=16) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] * 0.5, 3, axis=1).astype(np.float32)})
    return p


def _same_ragged(got: dict, name: str, want: Ragged, field: Field) -> None:
    values, offsets = got[name], got[name + "__offsets"]
    assert values.dtype == torch.from_numpy(want.values[:0]).dtype and values.dim() == 1
    assert np.array_equal(values.numpy(), want.values)
    assert offsets.dtype == torch.int64 and np.array_equal(offsets.numpy(), want.offsets)
    dims = list(field.variable_dims)
    assert np.array_equal(got[name + "__shape"].numpy(), want.shapes[:, dims])
    # Row i rebuilt from the three tensors is the reader's row i.
    for i in range(len(want)):
        shape = list(field.shape)
        for j, d in enumerate(dims):
            shape[d] = int(got[name + "__shape"][i, j])
        row = values[int(offsets[i]) : int(offsets[i + 1])].view(shape)
        assert np.array_equal(row.numpy(), want[i])


def _check_batches(got: list, want: list, schema: Schema) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.array_equal(g["id"].numpy(), w["id"])
        assert g["note"] == list(w["note"])
        for f in schema:
            if f.is_variable:
                _same_ragged(g, f.name, w[f.name], f)


@pytest.mark.parametrize("bs", [1, 10, 64])
def test_ragged_mode_is_the_readers_ragged(var_path, bs):
    r = rowstore.open(var_path)
    want = list(r.batches(bs, seed=3, epoch=1))
    dl = rst.BatchedDataLoader(var_path, batch_size=bs, seed=3, varlen="ragged")
    dl.set_epoch(1)
    _check_batches(list(dl), want, r.schema)
    ds = rst.IterableDataset(var_path, batch_size=bs, seed=3, varlen="ragged")
    ds.set_epoch(1)
    _check_batches(list(rst.ResumableDataLoader(ds, batch_size=None)), want, r.schema)
    dl.close()


def test_ragged_mode_per_field_and_in_collate(var_path):
    r = rowstore.open(var_path)
    ds = rst.Dataset(var_path, varlen={"wave": "ragged"})  # grid: padded (the default)
    idx = [5, 0, 99, 3]
    b = rst.collate(ds.__getitems__(idx))
    want = r.take(idx, varlen="ragged")
    _same_ragged(b, "wave", want["wave"], r.schema["wave"])
    assert "grid__offsets" not in b and b["grid"].dim() == 4  # padded
    # Workers ship the same tensors.
    loader = DataLoader(ds, batch_size=8, collate_fn=rst.collate, num_workers=2)
    for got, sent in zip(DataLoader(ds, batch_size=8, collate_fn=rst.collate), loader):
        for k in ("wave", "wave__offsets", "wave__shape"):
            assert torch.equal(got[k], sent[k])


@pytest.mark.parametrize(
    "kw", [{}, {"with_ids": True}, {"pad": True, "shard": (1, 3)}, {"drop_last": True}]
)
@pytest.mark.parametrize("bs", [1, 10, 48])
def test_iterable_dataset_cuts_tensors_as_the_reader_deals(dense_path, kw, bs):
    ds = rst.IterableDataset(dense_path, batch_size=bs, seed=5, **kw)
    dl = rst.ResumableDataLoader(ds, batch_size=None)
    assert dl._in_process()
    for epoch in (0, 1):
        dl.set_epoch(epoch)
        got = list(dl)
        spec = ds.stream.spec.replace(epoch=epoch)
        want = list(ds.reader.deal(bs, spec=spec, with_ids=ds.with_ids, varlen="ragged"))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert sorted(g) == sorted(w)
            for k in w:
                assert isinstance(g[k], torch.Tensor) and np.array_equal(g[k].numpy(), w[k]), k


def test_resumable_without_workers_is_torchs_iterator(dense_path):
    """The direct path gives what torch's single-process iterator gives; a collate_fn or
    pinning goes through torch's iterator."""

    def mine(batch):
        return {k: v * 1 for k, v in batch.items()}

    ds = rst.IterableDataset(dense_path, batch_size=16, seed=1, with_ids=True)
    direct = rst.ResumableDataLoader(ds, batch_size=None)
    torchs = rst.ResumableDataLoader(ds, batch_size=None, collate_fn=mine)
    assert direct._in_process() and not torchs._in_process()
    a, b = list(direct), list(torchs)
    assert len(a) == len(b) == -(-N // 16)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x)
    # Interrupted and resumed in another loader: every row once.
    ds2 = rst.IterableDataset(dense_path, batch_size=16, seed=1, with_ids=True)
    dl = rst.ResumableDataLoader(ds2, batch_size=None)
    it = iter(dl)
    head = [next(it) for _ in range(4)]
    state = dl.state_dict()
    it.close()
    ds3 = rst.IterableDataset(dense_path, batch_size=16, seed=1, with_ids=True)
    dl3 = rst.ResumableDataLoader(ds3, batch_size=None)
    dl3.load_state_dict(state)
    rest = list(dl3)
    ids = np.concatenate([t["__id"].numpy() for t in head + rest])
    assert sorted(ids.tolist()) == list(range(N))
    assert [t["__id"].tolist() for t in head + rest] == [t["__id"].tolist() for t in a]
