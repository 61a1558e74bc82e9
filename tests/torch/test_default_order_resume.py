"""States saved under the old default order (``window=16``, whole blocks; saved with
``pieces=1`` or from before ``pieces`` existed) resume exactly on loaders left to the new
defaults: those loaders take the state's window and pieces; loaders given other values refuse
the state, saying what to pass."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.reader import Reader

N = 3_000  # 47 blocks of 64 rows: the new default is 8 pieces of 8 rows, window 128
OLD = dict(window=16, pieces=1)  # the default order of earlier versions


@pytest.fixture(scope="module")
def ids_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("old_default") / "ids.h5")
    ids = np.arange(N, dtype=np.int64)
    with rowstore.Writer(
        path, Schema([Field("id", "int64"), Field("x", "float32", (2,))]), rows_per_block=64
    ) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] + 0.5, 2, axis=1).astype(np.float32)})
    return path


def _dealt(path, batch_size, epoch=0, **kw) -> list[int]:
    with Reader(path) as r:
        return [
            i
            for b in r.deal(batch_size, seed=3, epoch=epoch, fields=["id"], **kw)
            for i in b["id"].tolist()
        ]


def test_the_defaults_changed_here(ids_path):
    with Reader(ids_path) as r:
        assert r.order_defaults() == (128, 8)
        assert not np.array_equal(r.epoch_order(seed=3), r.epoch_order(seed=3, **OLD))


torch = pytest.importorskip("torch")
import rowstore.torch as rst  # noqa: E402


@pytest.mark.parametrize("pre_pieces", [False, True])
def test_an_old_default_state_resumes_exactly(ids_path, pre_pieces):
    old = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, fields=["id"], **OLD)
    it = iter(old)
    head = [i for _ in range(7) for i in next(it)["id"].tolist()]
    state = json.loads(json.dumps(old.state_dict()))
    assert (state["window"], state["pieces"]) == (16, 1)
    if pre_pieces:  # saved before pieces existed
        del state["pieces"]
    new = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, fields=["id"])
    assert (new.window, new.pieces) == (128, 8)
    new.load_state_dict(state)
    assert (new.window, new.pieces) == (16, 1)  # the state's order, not the new defaults
    rest = [i for b in new for i in b["id"].tolist()]
    assert head + rest == _dealt(ids_path, 32, **OLD)
    # later epochs keep the state's order, and its states record it
    new.set_epoch(1)
    assert [i for b in new for i in b["id"].tolist()] == _dealt(ids_path, 32, epoch=1, **OLD)
    st = new.state_dict()
    assert (st["window"], st["pieces"]) == (16, 1)


def test_an_old_default_state_resumes_on_another_world(ids_path):
    old = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, fields=["id"], **OLD)
    it = iter(old)
    head = [i for _ in range(5) for i in next(it)["id"].tolist()]
    state = old.state_dict()
    rest = []
    for rank in range(2):
        dl = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, fields=["id"], shard=(rank, 2))
        dl.load_state_dict(state)
        rest += [i for b in dl for i in b["id"].tolist()]
    assert sorted(head + rest) == list(range(N))


def test_given_values_refuse_an_old_default_state(ids_path):
    old = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, **OLD)
    state = old.state_dict()
    dl = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, window=128, pieces=8)
    with pytest.raises(ValueError, match=r"window=16.*pass window=16"):
        dl.load_state_dict(state)


def test_a_new_default_state_resumes_on_a_new_default_loader(ids_path):
    a = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, fields=["id"])
    it = iter(a)
    head = [i for _ in range(9) for i in next(it)["id"].tolist()]
    state = a.state_dict()
    assert (state["window"], state["pieces"]) == (128, 8)
    b = rst.BatchedDataLoader(ids_path, batch_size=32, seed=3, fields=["id"])
    b.load_state_dict(state)
    assert head + [i for x in b for i in x["id"].tolist()] == _dealt(ids_path, 32)
