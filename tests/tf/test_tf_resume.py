"""rowstore.tf.Loader: dealt batches, a state saved beside (and inside) a tf.train.Checkpoint,
resumed on another number of workers with exactly the remaining rows; equal steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import rowstore  # noqa: E402
import rowstore.tf as rtf  # noqa: E402
from rowstore import Field, Schema  # noqa: E402

N = 203


@pytest.fixture(scope="module")
def ids_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tfresume") / "ids.h5")
    ids = np.arange(N, dtype=np.int64)
    schema = Schema(
        [Field("id", "int64"), Field("x", "float32", (3,)), Field("w", "float32", (None,))]
    )
    with rowstore.Writer(path, schema, rows_per_block=16) as w:
        w.write_batch(
            {
                "id": ids,
                "x": np.repeat(ids[:, None] + 0.5, 3, axis=1).astype(np.float32),
                "w": [np.full(i % 4, i, np.float32) for i in range(N)],
            }
        )
    return path


def _real(b) -> list[int]:
    ids = b["id"].numpy()
    return (ids[~b["__pad"].numpy()] if "__pad" in b else ids).tolist()


@pytest.mark.parametrize("policy", [dict(pad=True), dict(drop_last=True), {}])
def test_resume_on_another_worker_count(ids_path, tmp_path, policy):
    first, states = [], []
    for r in range(2):
        loader = rtf.Loader(
            ids_path, batch_size=8, seed=3, window=2, shard=(r, 2), with_ids=True, **policy
        )
        it = iter(loader.dataset())
        for _ in range(4):
            b = next(it)
            assert b["id"].numpy().tolist() == b["__id"].numpy().tolist()
            first += _real(b)
        assert loader.steps == 4
        states.append(loader.state_dict())
        tf.train.Checkpoint(data=loader).write(str(tmp_path / f"ck{r}"))
    assert states[0] == states[1]
    rest, steps = [], []
    for r in range(3):
        loader = rtf.Loader(ids_path, batch_size=8, seed=3, window=2, shard=(r, 3), **policy)
        loader.load_state_dict(json.loads(json.dumps(states[1])))
        n = len(loader)
        got = list(loader.dataset())
        assert len(got) == n
        steps.append(n)
        rest += [i for b in got for i in _real(b)]
        assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["remaining"] is None
    assert len(first) + len(rest) == len(set(first + rest))
    if policy:
        assert len(set(steps)) == 1
    if "drop_last" in policy:
        assert N - len(first + rest) < 8 * 3
    else:
        assert sorted(first + rest) == list(range(N))


def test_checkpoint_restores_the_position(ids_path, tmp_path):
    loader = rtf.Loader(ids_path, batch_size=10, seed=1, varlen="padded")
    whole = [
        b["id"].numpy().tolist() for b in rtf.Loader(ids_path, batch_size=10, seed=1).dataset()
    ]
    it = iter(loader.dataset())
    head = [next(it)["id"].numpy().tolist() for _ in range(5)]
    ck = tf.train.Checkpoint(data=loader)
    path = ck.write(str(tmp_path / "ck"))
    b = next(it)  # progress after the checkpoint is not in it
    assert b["w"].shape[1] == int(b["w__shape"].numpy().max())
    fresh = rtf.Loader(ids_path, batch_size=10, seed=1, varlen="padded")
    tf.train.Checkpoint(data=fresh).read(path).assert_consumed()
    assert fresh.epoch == 0 and fresh.steps == 5
    tail = [b["id"].numpy().tolist() for b in fresh.dataset()]
    assert head + tail == whole
    # two epochs in one dataset, each its own order; quality reported per epoch
    seen = []
    two = rtf.Loader(ids_path, batch_size=10, seed=1, quality=lambda e, q: seen.append(e))
    ids = [i for b in two.dataset(num_epochs=2) for i in b["id"].numpy().tolist()]
    assert sorted(ids) == sorted(list(range(N)) * 2) and seen == [0, 1] and two.epoch == 1
    with pytest.raises(ValueError, match="seed"):
        rtf.Loader(ids_path, batch_size=10, seed=2).load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="choose one"):
        rtf.Loader(ids_path, batch_size=10, pad=True, drop_last=True)


def test_loader_reads_a_mixture(ids_path, tmp_path):
    other = str(tmp_path / "o.h5")
    schema = rowstore.open(ids_path).schema
    with rowstore.Writer(other, schema, rows_per_block=8) as w:
        w.write_batch(
            {
                "id": np.arange(1000, 1050),
                "x": np.zeros((50, 3), np.float32),
                "w": [np.zeros(1, np.float32)] * 50,
            }
        )
    m = rowstore.mix({ids_path: 0.5, other: 0.5}, seed=2, with_source=True)
    got = list(rtf.Loader(m, batch_size=10, seed=1, fields=["id"]).dataset())
    src = np.concatenate([b["__source"].numpy() for b in got])
    ids = np.concatenate([b["id"].numpy() for b in got])
    assert len(ids) == m.epoch_rows == 100 and (src == 1).sum() == 50
    assert ((ids >= 1000) == (src == 1)).all() and len(set(ids.tolist())) == 100


@pytest.mark.parametrize("pre_pieces", [False, True])
def test_an_old_default_state_resumes_exactly(tmp_path, pre_pieces):
    """A state of the old default order (window 16 whole blocks) resumes with that order on a
    loader left to the new defaults (pieces of blocks here: uncompressed fixed-size rows)."""
    ids_path = str(tmp_path / "fixed.h5")
    with rowstore.Writer(ids_path, Schema([Field("id", "int64")]), rows_per_block=16) as w:
        w.write_batch({"id": np.arange(N, dtype=np.int64)})
    old_kw = dict(window=16, pieces=1)
    with rowstore.open(ids_path) as r:
        assert r.order_defaults() != (16, 1)
        whole = [i for b in r.deal(10, seed=1, fields=["id"], **old_kw) for i in b["id"].tolist()]
    old = rtf.Loader(ids_path, batch_size=10, seed=1, fields=["id"], **old_kw)
    it = iter(old.dataset())
    head = [i for _ in range(4) for i in next(it)["id"].numpy().tolist()]
    state = json.loads(json.dumps(old.state_dict()))
    if pre_pieces:
        del state["pieces"]
    new = rtf.Loader(ids_path, batch_size=10, seed=1, fields=["id"])
    new.load_state_dict(state)
    assert (new.window, new.pieces) == (16, 1)
    assert head + [i for b in new.dataset() for i in b["id"].numpy().tolist()] == whole
    with pytest.raises(ValueError, match="pass window=16"):
        rtf.Loader(ids_path, batch_size=10, seed=1, window=128, pieces=8).load_state_dict(state)
