"""``pieces`` (block shuffle of pieces of blocks) through the adapters: torch's
BatchedDataLoader, IterableDataset under DataLoader workers, the map-style Dataset with
ElasticBatchSampler, tf's make_dataset and Loader (tf.train.Checkpoint too), rowstore.mix and
the CLI. Each delivers every row once, in the order ``Reader.deal``/``batches`` gives with the
same ``pieces``; ``pieces`` is part of a resume state (another value is refused, a state saved
before it existed is a ``pieces=1`` state)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.cli import main
from rowstore.reader import Reader

N = 203  # 13 blocks of 16 rows (the last short): pieces of 4 rows with pieces=4
KW = dict(seed=3, window=3, pieces=4)


@pytest.fixture(scope="module")
def ids_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("pieces") / "ids.h5")
    ids = np.arange(N, dtype=np.int64)
    with rowstore.Writer(
        path, Schema([Field("id", "int64"), Field("x", "float32", (2,))]), rows_per_block=16
    ) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] + 0.5, 2, axis=1).astype(np.float32)})
    return path


def _dealt(path, batch_size, consumer=(0, 1), **kw) -> list[list[int]]:
    with Reader(path) as r:
        return [b["id"].tolist() for b in r.deal(batch_size, shard=consumer, fields=["id"], **kw)]


def _old(state: dict) -> dict:
    """The state as saved before ``pieces`` existed."""
    st = dict(state)
    del st["pieces"]
    return st


def test_pieces_change_the_order(ids_path):
    with Reader(ids_path) as r:
        four = r.epoch_order(**KW)
        one = r.epoch_order(seed=3, window=3)
        assert sorted(four.tolist()) == list(range(N)) and not np.array_equal(four, one)
        assert [i for b in _dealt(ids_path, 8, **KW) for i in b] == four.tolist()
        assert [
            i for b in r.batches(8, fields=["id"], **KW) for i in b["id"].tolist()
        ] == four.tolist()


# -- torch ------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
import rowstore.torch as rst  # noqa: E402


def test_batched_loader_order_resume_and_refusal(ids_path):
    whole = [b["id"].tolist() for b in rst.BatchedDataLoader(ids_path, batch_size=8, **KW)]
    assert whole == _dealt(ids_path, 8, **KW)
    # two ranks take 3 steps each; the job resumes on three
    first, states = [], []
    for rank in range(2):
        dl = rst.BatchedDataLoader(ids_path, batch_size=8, shard=(rank, 2), **KW)
        assert [b["id"].tolist() for b in dl] == _dealt(ids_path, 8, consumer=(rank, 2), **KW)
        dl.set_epoch(0)
        for k, b in enumerate(dl):
            first += b["id"].tolist()
            if k == 2:
                break
        states.append(dl.state_dict())
    assert states[0] == states[1] and states[0]["pieces"] == 4
    state = json.loads(json.dumps(states[0]))
    rest = []
    for rank in range(3):
        dl = rst.BatchedDataLoader(ids_path, batch_size=8, shard=(rank, 3), **KW)
        dl.load_state_dict(state)
        rest += [i for b in dl for i in b["id"].tolist()]
    assert sorted(first + rest) == list(range(N))
    for bad in (dict(KW, pieces=2), dict(KW, pieces=1)):
        with pytest.raises(ValueError, match="pieces=4"):
            rst.BatchedDataLoader(ids_path, batch_size=8, **bad).load_state_dict(state)
    with pytest.raises(ValueError, match="pieces"):
        rst.BatchedDataLoader(ids_path, batch_size=8, **KW).load_state_dict(
            _old(state)
        )  # an old state is pieces=1
    with pytest.raises(ValueError, match="pieces"):
        rst.BatchedDataLoader(ids_path, batch_size=8, pieces=0)


def test_batched_loader_accepts_an_old_state(ids_path):
    dl = rst.BatchedDataLoader(ids_path, batch_size=8, seed=3, window=3)
    it = iter(dl)
    head = [next(it)["id"].tolist() for _ in range(4)]
    old = _old(dl.state_dict())
    dl2 = rst.BatchedDataLoader(ids_path, batch_size=8, seed=3, window=3)
    dl2.load_state_dict(old)
    assert head + [b["id"].tolist() for b in dl2] == _dealt(ids_path, 8, seed=3, window=3)


def test_iterable_dataset_two_workers(ids_path):
    ds = rst.IterableDataset(ids_path, batch_size=8, fields=["id"], **KW)
    dl = rst.ResumableDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = [b["id"].tolist() for b in dl]
    # worker w is consumer w of 2: its batches are Reader.deal's, with the same default unit
    want = _dealt(ids_path, 8, consumer=(0, 2), **KW) + _dealt(ids_path, 8, consumer=(1, 2), **KW)
    assert sorted(got) == sorted(want) and sorted(i for b in got for i in b) == list(range(N))
    # save after 5 batches; resume on 2 ranks x 0 workers
    dl = rst.ResumableDataLoader(
        rst.IterableDataset(ids_path, batch_size=8, fields=["id"], **KW),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
    )
    first = []
    for k, b in enumerate(dl):
        first += b["id"].tolist()
        if k == 4:
            break
    state = dl.state_dict()
    assert state["pieces"] == 4
    rest = []
    for rank in range(2):
        ds2 = rst.IterableDataset(ids_path, batch_size=8, fields=["id"], shard=(rank, 2), **KW)
        dl2 = rst.ResumableDataLoader(ds2, batch_size=None)
        dl2.load_state_dict(state)
        rest += [i for b in dl2 for i in b["id"].tolist()]
    assert sorted(first + rest) == list(range(N))
    with pytest.raises(ValueError, match="pieces"):
        rst.IterableDataset(ids_path, batch_size=8, **dict(KW, pieces=8)).load_state_dict(state)
    plain = rst.IterableDataset(ids_path, batch_size=8, seed=3, window=3)
    plain.load_state_dict(_old(plain.state_dict()))  # an old state: pieces=1


def test_map_style_sampler(ids_path):
    ds = rst.Dataset(ids_path)
    for rank in range(2):
        sampler = rst.ElasticBatchSampler(ds, batch_size=8, shard=(rank, 2), **KW)
        dl = rst.ResumableDataLoader(
            ds,
            batch_sampler=sampler,
            collate_fn=rst.collate,
            num_workers=2,
            multiprocessing_context="fork",
        )
        assert [b["id"].tolist() for b in dl] == _dealt(ids_path, 8, consumer=(rank, 2), **KW)
    first, states = [], []
    for rank in range(3):
        sampler = rst.ElasticBatchSampler(ds, batch_size=8, shard=(rank, 3), **KW)
        dl = rst.ResumableDataLoader(ds, batch_sampler=sampler, collate_fn=rst.collate)
        for k, b in enumerate(dl):
            first += b["id"].tolist()
            if k == 1:
                break
        states.append(dl.state_dict())
    assert states[0] == states[1] == states[2] and states[0]["pieces"] == 4
    rest = []
    for rank in range(2):
        sampler = rst.ElasticBatchSampler(ds, batch_size=8, shard=(rank, 2), **KW)
        dl = rst.ResumableDataLoader(ds, batch_sampler=sampler, collate_fn=rst.collate)
        dl.load_state_dict(states[0])
        rest += [i for b in dl for i in b["id"].tolist()]
    assert sorted(first + rest) == list(range(N))
    with pytest.raises(ValueError, match="pieces"):
        rst.ElasticBatchSampler(ds, batch_size=8, seed=3, window=3).resume_from(states[0])


def test_quality_log_names_pieces(ids_path, caplog):
    seen = []
    rst.BatchedDataLoader(
        ids_path, batch_size=8, quality=lambda e, q: seen.append(q), **KW
    ).__iter__().__next__()
    with Reader(ids_path) as r:
        assert seen == [r.shuffle_quality(8, **KW)] and seen[0] != r.shuffle_quality(
            8, seed=3, window=3
        )
    with caplog.at_level("INFO", logger="rowstore"):
        next(iter(rst.BatchedDataLoader(ids_path, batch_size=8, quality="log", **KW)))
    assert "pieces=4" in caplog.text


def test_mixture_takes_pieces(ids_path, tmp_path):
    other = str(tmp_path / "o.h5")
    with rowstore.Writer(other, rowstore.open(ids_path).schema, rows_per_block=16) as w:
        w.write_batch({"id": np.arange(1000, 1100), "x": np.zeros((100, 2), np.float32)})
    m = rowstore.mix({ids_path: 0.5, other: 0.5}, seed=2)
    got = [
        i
        for b in rst.BatchedDataLoader(m, batch_size=10, fields=["id"], **KW)
        for i in b["id"].tolist()
    ]
    assert got == [i for b in m.deal(10, fields=["id"], **KW) for i in b["id"].tolist()]
    assert len(got) == len(set(got)) == m.epoch_rows
    assert got != [i for b in m.deal(10, fields=["id"], seed=3, window=3) for i in b["id"].tolist()]


def test_petastorm_style_reader_and_loader(ids_path):
    from rowstore.petastorm import DataLoader

    with Reader(ids_path) as reader:
        order = reader.epoch_order(**KW).tolist()
    with rowstore.make_reader(ids_path, schema_fields=["id"], batch_size=8, **KW) as r:
        assert [row.id for row in r] == order
    with rowstore.make_reader(ids_path, schema_fields=["id"], **KW) as r:
        loader = DataLoader(r, batch_size=8)
        assert [i for b in loader for i in b["id"].tolist()] == order


# -- CLI --------------------------------------------------------------------------------------
def test_cli_pieces(ids_path, capsys):
    def quality(*extra):
        assert main(["order", ids_path, "--batch-size", "8", "--window", "3", *extra]) == 0
        out = capsys.readouterr().out
        return out, float(out.split("shuffle quality: ")[1].split()[0])

    (out4, q4), (_, q1) = quality("--pieces", "4"), quality()
    assert "pieces=4" in out4 and q4 > q1
    assert (
        main(
            [
                "check-order",
                ids_path,
                "--batch-size",
                "8",
                "--window",
                "3",
                "--pieces",
                "4",
                "--world",
                "2",
                "--workers",
                "2",
                "--resume-at",
                "0.5",
                "--resume-world",
                "3",
            ]
        )
        == 0
    )
    assert "FAIL" not in capsys.readouterr().out
    assert main(["quality", ids_path, "--batch-size", "8", "--window", "3", "--pieces", "4"]) == 0
    assert "pieces 4" in capsys.readouterr().out


# -- tf ---------------------------------------------------------------------------------------
def test_tf_make_dataset_and_loader(ids_path, tmp_path):
    tf = pytest.importorskip("tensorflow")
    import rowstore.tf as rtf

    with Reader(ids_path) as r:
        want = [b["id"].tolist() for b in r.batches(8, fields=["id"], **KW)]
    assert [
        b["id"].numpy().tolist()
        for b in rtf.make_dataset(ids_path, batch_size=8, fields=["id"], **KW)
    ] == want
    whole = [
        b["id"].numpy().tolist()
        for b in rtf.Loader(ids_path, batch_size=8, fields=["id"], **KW).dataset()
    ]
    assert whole == _dealt(ids_path, 8, **KW)
    # two workers take 3 steps each; resume on three (state_dict) and by a tf.train.Checkpoint
    first, states = [], []
    for r in range(2):
        loader = rtf.Loader(ids_path, batch_size=8, shard=(r, 2), fields=["id"], **KW)
        it = iter(loader.dataset())
        first += [i for _ in range(3) for i in next(it)["id"].numpy().tolist()]
        states.append(loader.state_dict())
        ck = tf.train.Checkpoint(data=loader).write(str(tmp_path / f"ck{r}"))
    assert states[0] == states[1] and states[0]["pieces"] == 4
    state = states[0]
    rest = []
    for r in range(3):
        loader = rtf.Loader(ids_path, batch_size=8, shard=(r, 3), fields=["id"], **KW)
        loader.load_state_dict(json.loads(json.dumps(states[0])))
        rest += [i for b in loader.dataset() for i in b["id"].numpy().tolist()]
    assert sorted(first + rest) == list(range(N))
    fresh = rtf.Loader(ids_path, batch_size=8, shard=(1, 2), fields=["id"], **KW)
    tf.train.Checkpoint(data=fresh).read(ck).assert_consumed()
    tail = [b["id"].numpy().tolist() for b in fresh.dataset()]
    assert first[24:] + [i for b in tail for i in b] == [
        i for b in _dealt(ids_path, 8, consumer=(1, 2), **KW) for i in b
    ]
    with pytest.raises(ValueError, match="pieces"):
        rtf.Loader(ids_path, batch_size=8, **dict(KW, pieces=2)).load_state_dict(states[0])
    other = rtf.Loader(ids_path, batch_size=8, shard=(1, 2), fields=["id"], **dict(KW, pieces=2))
    tf.train.Checkpoint(data=other).read(ck)
    with pytest.raises(ValueError, match="pieces"):
        other.dataset()
    plain = rtf.Loader(ids_path, batch_size=8, seed=3, window=3)
    plain.load_state_dict(_old(plain.state_dict()))  # an old state: pieces=1
    # a checkpoint saved before the loader kept its order key (its "base": "" or the remaining list)
    for base, epoch, tail in (("", -1, whole[2:]), (json.dumps(state["remaining"]), 0, None)):
        old = tf.Module()
        old._epoch, old._steps = tf.Variable(0, dtype=tf.int64), tf.Variable(2, dtype=tf.int64)
        old._base_epoch, old._base = (
            tf.Variable(epoch, dtype=tf.int64),
            tf.Variable(base, dtype=tf.string),
        )
        path = tf.train.Checkpoint(data=old).write(str(tmp_path / "old"))
        back = rtf.Loader(ids_path, batch_size=8, fields=["id"], **KW)
        tf.train.Checkpoint(data=back).read(path).assert_consumed()
        got = [b["id"].numpy().tolist() for b in back.dataset()]
        if tail is not None:
            assert got == tail
        else:  # the remaining batches of the saved state, less 2 steps of this worker
            assert len(got) == len(_dealt(ids_path, 8, remaining=state["remaining"], **KW)) - 2
        assert json.loads(back._base.numpy().decode())["order"]["pieces"] == 4  # kept from now on
    with pytest.raises(ValueError, match="pieces"):
        rtf.Loader(ids_path, batch_size=8, **KW).load_state_dict(_old(plain.state_dict()))
