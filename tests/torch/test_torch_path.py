"""The torch path's fast paths: BatchedDataLoader cutting tensors from whole reads,
and DataLoader workers shipping small batches by value. Each is checked against the plain path
it replaces (the reader's own batches, torch's own pickling, 0 workers)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from multiprocessing.reduction import ForkingPickler  # noqa: E402

from torch.multiprocessing import reductions  # noqa: E402,F401  (registers the tensor reductions)
from torch.utils.data import DataLoader  # noqa: E402

import rowstore  # noqa: E402
import rowstore.torch as rst  # noqa: E402
from rowstore import Field, Schema  # noqa: E402
from rowstore.reader._stream import cut_batches  # noqa: E402
from rowstore.torch import _collate  # noqa: E402
from rowstore.torch._loaders import _cut_tensors  # noqa: E402

N = 203


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    """``id`` (int64 = row number), ``x`` (float32[3]) and ``ok`` (bool), 13 blocks of 16 rows."""
    p = str(tmp_path_factory.mktemp("torch_path") / "ids.h5")
    schema = Schema([Field("id", "int64"), Field("x", "float32", (3,)), Field("ok", "bool")])
    ids = np.arange(N, dtype=np.int64)
    with rowstore.Writer(p, schema, rows_per_block=16) as w:
        w.write_batch(
            {
                "id": ids,
                "x": np.repeat(ids[:, None] + 0.5, 3, axis=1).astype(np.float32),
                "ok": ids % 3 == 0,
            }
        )
    return p


def _np(b: dict) -> dict:
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)) for k, v in b.items()}


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        x, y = _np(x), _np(y)
        assert list(x) == list(y)
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k


def test_cut_tensors_cuts_as_the_reader_cuts():
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.integers(0, 40, rng.integers(0, 6))
        parts = [
            {"a": rng.random((n, 2)).astype(np.float32), "b": rng.integers(0, 9, n)} for n in sizes
        ]
        bs, drop = int(rng.integers(1, 30)), bool(rng.integers(0, 2))
        want = list(cut_batches(iter(parts), bs, drop, lambda b: b))
        got = list(_cut_tensors(iter(parts), bs, drop))
        _same(want, got)
        assert all(isinstance(v, torch.Tensor) for g in got for v in g.values())


def test_cut_tensors_closes_its_reads_when_closed_early():
    closed = []

    def parts():
        try:
            for _ in range(10):
                yield {"a": np.zeros(64, np.int64)}
        finally:
            closed.append(True)

    it = _cut_tensors(parts(), 16, False)
    next(it)
    it.close()
    assert closed == [True]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"with_ids": True},
        {"pad": True, "shard": (1, 3)},
        {"drop_last": True},
        {"shuffle": "full"},
        {"shard": (0, 2), "unit": 3},
    ],
)
@pytest.mark.parametrize("bs", [1, 10, 48, 500])
def test_dense_loader_yields_the_readers_batches(path, kw, bs):
    dl = rst.BatchedDataLoader(path, batch_size=bs, seed=5, **kw)
    assert dl._collator.dense_only and dl._post is None  # the fast path
    for epoch in (0, 1):
        spec = dl.stream.spec.replace(epoch=epoch)
        want = list(dl.reader.deal(bs, spec=spec, with_ids=dl.with_ids, varlen="ragged"))
        dl.set_epoch(epoch)
        got = list(dl)
        _same(want, got)
        assert len(got) == len(want)
    dl.close()


def test_dense_loader_resumes_mid_epoch(path):
    dl = rst.BatchedDataLoader(path, batch_size=10, seed=1, with_ids=True)
    it = iter(dl)
    head = [next(it) for _ in range(7)]
    state = dl.state_dict()
    it.close()
    dl2 = rst.BatchedDataLoader(path, batch_size=10, seed=1, with_ids=True)
    dl2.load_state_dict(state)
    rest = list(dl2)
    ids = np.concatenate([b["__id"].numpy() for b in head + rest])
    assert sorted(ids.tolist()) == list(range(N))
    dl3 = rst.BatchedDataLoader(path, batch_size=10, seed=1, with_ids=True)
    _same(head + rest, list(dl3))


def test_shipped_batch_pickles_by_value():
    out = {
        "x": torch.arange(12, dtype=torch.float32).view(4, 3),
        "ok": torch.tensor([True, False, True, True]),
        "u": torch.from_numpy(np.arange(4, dtype=np.uint16)),
        "names": ["a", "b", "c", "d"],
    }
    got = pickle.loads(ForkingPickler.dumps(_collate._Shipped(out)))
    assert type(got) is dict and list(got) == list(out)
    _same([out], [got])
    assert not got["x"].is_shared()  # by value: no shared-memory segment per tensor
    assert (
        copy.copy(_collate._Shipped(out)).__class__ is _collate._Shipped
    )  # default_convert copies


def test_shipped_batch_over_the_limit_goes_torchs_way(monkeypatch):
    monkeypatch.setattr(_collate, "SHIP_BYTES", 8)
    out = {"x": torch.arange(12, dtype=torch.float32)}
    got = pickle.loads(ForkingPickler.dumps(_collate._Shipped(out)))
    assert type(got) is dict and got["x"].is_shared() and torch.equal(got["x"], out["x"])


def _my_collate(batch):  # a user's collate built on rst.collate (module level: picklable for spawn)
    out = rst.collate(batch)
    out["x2"] = out["x"] * 2
    return out


@pytest.mark.parametrize("collate_fn", [rst.collate, _my_collate])
def test_dataset_workers_give_what_no_workers_give(path, collate_fn):
    ds = rst.Dataset(path)
    sampler = list(torch.utils.data.BatchSampler(range(N), 16, drop_last=False))
    want = list(DataLoader(ds, batch_sampler=sampler, collate_fn=collate_fn))
    got = list(DataLoader(ds, batch_sampler=sampler, collate_fn=collate_fn, num_workers=2))
    assert all(type(b) is dict for b in got)
    _same(want, got)


def test_iterable_dataset_workers_ship_batches(path):
    ds = rst.IterableDataset(path, batch_size=16, seed=2, with_ids=True)
    got = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert all(type(b) is dict for b in got)
    ids = np.concatenate([b["__id"].numpy() for b in got])
    assert sorted(ids.tolist()) == list(range(N))
    for b in got:
        assert torch.equal(b["id"], b["__id"]) and torch.equal(b["x"][:, 0], b["id"].float() + 0.5)
