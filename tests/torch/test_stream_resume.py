"""One resumable epoch stream behind every loader: a state saved by any loader after k batches
loads in any other (torch's BatchedDataLoader, its in-memory cache, ResumableDataLoader and an
IterableDataset under a DataLoader with 0 and 2 workers, rowstore.tf.Loader, Grain's
EpochDataset), which delivers the rest of the saving run's batch sequence: the concatenation is
the uninterrupted run, batch for batch.

A tiny dataset, one epoch, savers' runs computed once: DataLoader workers are forked only for the
loaders that have them."""

from __future__ import annotations

import functools
import gc
import json
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import rowstore  # noqa: E402
import rowstore.torch as rst  # noqa: E402
from rowstore import Field, Schema  # noqa: E402

N, B, K = 83, 6, 7  # 14 batches; saved after an odd number: with 2 workers, worker 1 is next
ORDER = dict(seed=3, window=2)


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("stream") / "ids.h5")
    with rowstore.Writer(p, Schema([Field("id", "int64")]), rows_per_block=8) as w:
        w.write_batch({"id": np.arange(N, dtype=np.int64)})
    return p


def _ids(batches) -> list[list[int]]:
    return [np.asarray(b["id"]).tolist() for b in batches]


def _workers(n: int) -> dict:
    return {"num_workers": n, "multiprocessing_context": "fork"} if n else {}


def _take(it, k: int) -> list:
    return [next(it) for _ in range(k)]


# -- the loaders: each saves after k batches (head, state) and runs from a loaded state ---------
def _batched(path, cache=None):
    return rst.BatchedDataLoader(path, batch_size=B, cache=cache, **ORDER)


def _resumable(path, workers):
    ds = rst.IterableDataset(path, batch_size=B, **ORDER)
    return rst.ResumableDataLoader(ds, batch_size=None, **_workers(workers))


def _tf_loader(path):
    rtf = pytest.importorskip("rowstore.tf")
    return rtf.Loader(path, batch_size=B, **ORDER)


def _grain_iter(path):
    rg = pytest.importorskip("rowstore.grain")
    return iter(rg.EpochDataset(path, batch_size=B, shard=(0, 1), **ORDER))


def save(kind: str, path: str, k: int) -> tuple[list, dict]:
    """The first ``k`` batches of ``kind``'s run and its state then."""
    if kind in ("batched", "memory"):
        dl = _batched(path, "memory" if kind == "memory" else None)
        it = iter(dl)
        head = _take(it, k)
        state = dl.state_dict()
        it.close()
    elif kind.startswith("resumable"):
        dl = _resumable(path, int(kind[-1]))
        it = iter(dl)
        head = _take(it, k)
        state = dl.state_dict()
        del it
    elif kind == "tf":
        loader = _tf_loader(path)
        it = iter(loader.dataset())
        head = [{"id": el["id"].numpy()} for el in _take(it, k)]
        state = loader.state_dict()
    else:
        it = _grain_iter(path)
        head = _take(it, k)
        state = it.get_state()
        it.close()
    return _ids(head), json.loads(json.dumps(state))  # through JSON, as a checkpoint holds it


def resume(kind: str, path: str, state: dict | None) -> list:
    """``kind``'s batches from ``state`` (None: its whole run) to the end of the epoch."""
    if kind in ("batched", "memory"):
        dl = _batched(path, "memory" if kind == "memory" else None)
        if state is not None:
            dl.load_state_dict(state)
        return _ids(dl)
    if kind.startswith("resumable"):
        dl = _resumable(path, int(kind[-1]))
        if state is not None:
            dl.load_state_dict(state)
        return _ids(dl)
    if kind.startswith("iterable"):
        ds = rst.IterableDataset(path, batch_size=B, **ORDER)
        if state is not None:
            ds.load_state_dict(state)
        return _ids(DataLoader(ds, batch_size=None, **_workers(int(kind[-1]))))
    if kind == "tf":
        loader = _tf_loader(path)
        if state is not None:
            loader.load_state_dict(state)
        return [el["id"].numpy().tolist() for el in loader.dataset()]
    it = _grain_iter(path)
    if state is not None:
        it.set_state(state)
    out = _ids(it)
    it.close()
    return out


SAVERS = ["batched", "memory", "resumable0", "resumable2", "tf", "grain"]
LOADERS = SAVERS[:4] + ["iterable0", "iterable2"] + SAVERS[4:]


@functools.cache
def _saved(kind: str, path: str) -> tuple[list, list, dict]:
    """``kind``'s uninterrupted run, and its first K batches and state then."""
    head, state = save(kind, path, K)
    return resume(kind, path, None), head, state


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("saver", SAVERS)
def test_a_state_resumes_the_identical_batch_sequence_in_every_loader(path, saver, loader):
    full, head, state = _saved(saver, path)
    assert len(full) == -(-N // B) and sorted(sum(full, [])) == list(range(N))
    assert head == full[:K]
    assert head + resume(loader, path, state) == full


def test_one_process_and_two_workers_deal_the_same_rows(path):
    """The hand-out differs (one lane, or one per worker), the rows of the epoch do not."""
    one, two = _saved("batched", path)[0], _saved("resumable2", path)[0]
    assert sorted(sum(one, [])) == sorted(sum(two, [])) == list(range(N))
    state = _saved("resumable2", path)[2]
    assert state["hand_out"]["lanes"] == 2 and state["hand_out"]["steps"] == K
    assert "hand_out" not in _saved("batched", path)[2]  # one lane, one rank: remaining says all


def test_another_world_deals_what_is_left_once(path):
    """On another world size the state's hand-out does not apply: the batches not yet delivered
    are dealt again, each row once."""
    head, state = _saved("resumable2", path)[1:]
    rest = []
    for rank in range(2):
        dl = rst.BatchedDataLoader(path, batch_size=B, shard=(rank, 2), **ORDER)
        dl.load_state_dict(state)
        rest += sum(_ids(dl), [])
    assert sorted(sum(head, []) + rest) == list(range(N))


def test_the_order_arguments_are_checked_once_on_the_way_to_the_reader(path, monkeypatch):
    """The loader's spec is checked when it is made; the stream's per-epoch and per-lane specs
    only check what they change (epoch, shard, unit)."""
    import rowstore.reader.epochs as epochs

    calls = {"check_decode": 0, "shuffle_mode": 0}

    def counted(name):
        real = getattr(epochs, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(epochs, name, call)

    counted("check_decode")
    counted("shuffle_mode")
    dl = rst.BatchedDataLoader(path, batch_size=B, num_epochs=2, **ORDER)
    assert len(_ids(dl)) == 2 * -(-N // B)
    assert calls == {"check_decode": 1, "shuffle_mode": 1}


def _closing(make, read):
    """``read(loader)`` of a new ``make()``, its reader closed after (a URL's fetch threads)."""

    def run(p, **kw):
        loader = make(p, **kw)
        try:
            return _ids(read(loader))
        finally:
            loader.reader.close()

    return run


def _path_entry_points(rtf, rg):
    """Every loader that takes a path, as ``read(path, **kw)`` -> the ids it reads."""

    def tf_dataset(p, **kw):
        out = _ids(rtf.make_dataset(p, batch_size=B, **kw))
        gc.collect()  # the dataset's generators, and the reader it opened, end with it
        return out

    return {
        "BatchedDataLoader": _closing(
            lambda p, **kw: rst.BatchedDataLoader(p, batch_size=B, **kw), iter
        ),
        "IterableDataset": _closing(
            lambda p, **kw: rst.IterableDataset(p, batch_size=B, **kw), iter
        ),
        "tf.Loader": _closing(
            lambda p, **kw: rtf.Loader(p, batch_size=B, **kw), lambda ld: ld.dataset()
        ),
        "tf.make_dataset": tf_dataset,
        "grain.EpochDataset": _closing(
            lambda p, **kw: rg.EpochDataset(p, batch_size=B, shard=(0, 1), **kw), iter
        ),
    }


def test_storage_options_are_used_for_a_url_and_refused_for_a_path(path, monkeypatch):
    rtf = pytest.importorskip("rowstore.tf")
    rg = pytest.importorskip("rowstore.grain")
    opts = {"auto_mkdir": False}
    with pytest.raises(ValueError, match="apply to URLs") as want:
        rowstore.open(path, storage_options=opts)
    readers = _path_entry_points(rtf, rg)
    for name, read in readers.items():
        with pytest.raises(ValueError, match="apply to URLs") as got:
            read(path, storage_options=opts)
        assert str(got.value) == str(want.value), name
    with rowstore.open(path) as r, pytest.raises(ValueError, match="open already"):
        rst.BatchedDataLoader(r, batch_size=B, storage_options=opts)
    # A URL is opened with them (a stand-in opens the local file: no client's threads outlive
    # the test): every loader hands them to the one opener.
    import rowstore.reader.make_reader as opener

    seen = []
    real = opener.as_reader

    def open_url(source, storage_options=None):
        if not (isinstance(source, str) and source.startswith("s3://")):
            return real(source, storage_options)
        seen.append((source, storage_options))
        return rowstore.Reader(path), True

    monkeypatch.setattr(opener, "as_reader", open_url)
    whole = readers["BatchedDataLoader"](path)
    for name, read in readers.items():
        assert read("s3://bucket/ids.h5", storage_options=opts) == whole, name
    assert seen == [("s3://bucket/ids.h5", opts)] * len(readers)
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name.startswith("rowstore")]


def test_predicate_is_taken_by_every_loader(path):
    """``rows=``/``predicate=`` mean one thing: a row subset, read in the subset's order."""
    rtf = pytest.importorskip("rowstore.tf")
    rg = pytest.importorskip("rowstore.grain")
    keep = lambda b: b["id"] % 3 == 0  # noqa: E731
    for name, read in _path_entry_points(rtf, rg).items():
        got = read(path, predicate=keep, **ORDER)
        assert sorted(sum(got, [])) == list(range(0, N, 3)), name


def test_epoch_is_the_first_epoch_read_and_set_epoch_names_the_epoch(path):
    """``epoch=`` is the first epoch a loader reads (``Reader.deal(epoch=)``'s rows), the next
    iteration reads the next epoch, ``set_epoch(k)`` reads epoch ``k``, and a loaded
    state's epoch wins over the constructor's."""
    rtf = pytest.importorskip("rowstore.tf")
    rg = pytest.importorskip("rowstore.grain")
    with rowstore.open(path) as r:
        want = {e: _ids(r.deal(B, epoch=e, **ORDER)) for e in (2, 3, 4, 5)}
    dl = rst.BatchedDataLoader(path, batch_size=B, epoch=2, **ORDER)
    try:
        assert _ids(dl) == want[2]
        assert _ids(dl) == want[3]
        dl.set_epoch(4)  # the epoch read, as epoch= says it
        assert _ids(dl) == want[4]
        state = dl.state_dict()  # epoch 5, none delivered
    finally:
        dl.close()
    for make in (
        lambda: rst.BatchedDataLoader(path, batch_size=B, epoch=2, **ORDER),
        lambda: rst.ResumableDataLoader(
            rst.IterableDataset(path, batch_size=B, epoch=2, **ORDER), batch_size=None
        ),
    ):
        dl = make()
        try:
            assert _ids(dl) == want[2]
            dl.load_state_dict(state)
            assert _ids(dl) == want[5]
        finally:
            (dl.dataset if hasattr(dl, "dataset") else dl).close()
    ld = rtf.Loader(path, batch_size=B, epoch=2, **ORDER)
    try:
        assert _ids(ld.dataset()) == want[2]
        ld.set_epoch(3)
        assert _ids(ld.dataset()) == want[3]
        with pytest.raises(ValueError, match="epoch"):
            ld.set_epoch(-1)
    finally:
        ld.reader.close()
    ds = rg.EpochDataset(path, batch_size=B, shard=(0, 1), epoch=2, num_epochs=2, **ORDER)
    try:
        assert _ids(iter(ds)) == want[2] + want[3]
    finally:
        ds.reader.close()
