"""Resume states: one codec (:class:`rowstore.reader.state.StreamState`) for every loader's
state. A state names its dataset (``Reader.fingerprint``) and is refused on another dataset
with the same rows and version; every field is checked by type and range, refused with
``StateError`` naming it; a state read as JSON text is bounded in size and nesting."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import RowstoreError, StateError
from rowstore.reader import state as state_codec
from rowstore.reader.epochs import EpochSpec
from rowstore.reader.state import StreamState, loads_state

N = 96
B = 8  # rows per batch: 12 global batches
SCHEMA = Schema([Field("id", "int64")])
SPEC = EpochSpec(seed=1, window=2, pieces=1)


def _write(path: str, ids: np.ndarray) -> None:
    with rowstore.Writer(path, SCHEMA, rows_per_block=16) as w:
        w.write_batch({"id": ids.astype(np.int64)})


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """``a`` and ``b``: the same rows and (no) version, other bytes; ``copy``: ``a``'s bytes at
    another path."""
    d = tmp_path_factory.mktemp("states")
    out = {k: str(d / f"{k}.h5") for k in ("a", "b", "copy")}
    _write(out["a"], np.arange(N))
    _write(out["b"], np.arange(N) + 1000)
    shutil.copyfile(out["a"], out["copy"])
    return out


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, str]:
    """Two dataset directories, both at version 1 with ``N`` rows, of other rows."""
    d = tmp_path_factory.mktemp("state_dirs")
    out = {}
    for k, first in (("a", 0), ("b", 1000)):
        out[k] = str(d / k)
        with rowstore.DatasetWriter(out[k], SCHEMA, rows_per_block=16) as w:
            w.write_batch({"id": np.arange(first, first + N, dtype=np.int64)})
    return out


def _state(path: str, steps: int = 3) -> dict:
    """A state of ``SPEC`` on ``path`` after ``steps`` batches (plain JSON)."""
    with rowstore.Reader(path) as r:
        return json.loads(json.dumps(SPEC.state_after(r, 0, None, steps, B)))


def _load(path: str, state) -> StreamState:
    with rowstore.Reader(path) as r:
        return SPEC.read_state(r, state, B)


# -- the dataset's identity --------------------------------------------------------------------
def test_the_fingerprint_is_the_datasets_bytes(files, dirs):
    fp = {k: rowstore.Reader(p).fingerprint for k, p in files.items()}
    assert len(fp["a"]) == 16 and int(fp["a"], 16) >= 0
    assert fp["a"] == fp["copy"] != fp["b"]  # another path, same bytes: the same dataset
    with rowstore.Reader(dirs["a"]) as ra, rowstore.Reader(dirs["b"]) as rb:
        assert len(ra) == len(rb) and ra.layout.version == rb.layout.version == 1
        assert ra.fingerprint != rb.fingerprint
        m = rowstore.mix([(ra, 0.5), (rb, 0.5)])
        assert m.fingerprint == rowstore.mix([(ra, 0.5), (rb, 0.5)]).fingerprint
        assert m.fingerprint != rowstore.mix([(ra, 0.75), (rb, 0.25)]).fingerprint
        assert m.fingerprint != rowstore.mix([(rb, 0.5), (ra, 0.5)]).fingerprint


def test_a_state_names_its_dataset_and_resumes_on_its_bytes(files):
    state = _state(files["a"])
    assert state["version"] == 3 and state["dataset"] == rowstore.Reader(files["a"]).fingerprint
    st = _load(files["copy"], state)
    assert (st.epoch, st.remaining) == (0, state["remaining"]) and st.to_json() == state


@pytest.mark.parametrize("which", ["files", "dirs"])
def test_a_state_of_another_dataset_is_refused(files, dirs, which):
    paths = files if which == "files" else dirs
    with pytest.raises(StateError, match="another dataset") as e:
        _load(paths["b"], _state(paths["a"]))
    assert e.value.field == "dataset" and isinstance(e.value, ValueError)


def test_a_state_of_an_earlier_version_is_refused_after_an_append(dirs, tmp_path):
    root = str(tmp_path / "grown")
    shutil.copytree(dirs["a"], root)
    state = _state(root)
    with rowstore.DatasetWriter(root, mode="a") as w:
        w.write_batch({"id": np.arange(N, N + 16, dtype=np.int64)})
    with pytest.raises(StateError, match=r"dataset_version=1.*version=1\)") as e:
        _load(root, state)
    assert e.value.field == "dataset_version"
    with rowstore.Reader(root, version=1) as r:  # the version it was saved on resumes it
        assert SPEC.read_state(r, state, B).remaining == state["remaining"]


def test_a_state_from_before_the_fingerprint_resumes_with_a_warning(files):
    old = {**_state(files["a"]), "version": 2}
    del old["dataset"]
    with pytest.warns(FutureWarning, match="does not name its dataset"):
        st = _load(files["a"], old)
    assert st.remaining == old["remaining"]
    with pytest.raises(StateError, match="no 'dataset'"):  # a version-3 state must name it
        _load(files["a"], {**old, "version": 3})


# -- every field by type and range -------------------------------------------------------------
BAD = [
    ("epoch", 5.5),
    ("epoch", "5"),
    ("epoch", True),
    ("epoch", 2**63),
    ("epoch", -1),
    ("epoch", None),
    ("remaining", [[5.5, 12]]),
    ("remaining", [["5", 12]]),
    ("remaining", [[True, 12]]),
    ("remaining", [[2**63, 2**63 + 1]]),
    ("remaining", [[-1, 12]]),
    ("remaining", [[0, 1, 2]]),
    ("remaining", [[3]]),
    ("remaining", [[5, 5]]),
    ("remaining", [[6, 8], [2, 4]]),
    ("remaining", [[0, 13]]),  # beyond the epoch's 12 batches
    ("remaining", "3-12"),
    ("remaining", {"3": 12}),
    ("batch_size", True),
    ("batch_size", 8.0),
    ("seed", "1"),
    ("seed", -1),
    ("shuffle", "sideways"),
    ("shuffle", True),
    ("window", 0),
    ("pieces", 1.0),
    ("drop_last", 0),
    ("pad", "no"),
    ("subset", 2**40),
    ("dataset_rows", -N),
    ("dataset_version", "1"),
    ("dataset", 123),
    ("dataset", "not a fingerprint"),
    ("consumer", [0, 1, 2]),
    ("consumer", [2, 1]),
    ("taken", -1),
    ("version", 99),
    ("version", True),
    ("kind", "rowstore.other"),
    ("surprise", 1),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}"[:40] for f, v in BAD])
def test_each_bad_field_is_refused_naming_it(files, field, value):
    state = {**_state(files["a"]), field: value}
    with pytest.raises(StateError) as e:
        with rowstore.Reader(files["a"]) as r:
            SPEC.read_state(r, state, B, worker=True)
    assert e.value.field == field and repr(field)[1:-1] in str(e.value)
    assert isinstance(e.value, RowstoreError)


def test_a_missing_field_or_a_non_dict_is_refused(files):
    for key in ("epoch", "remaining", "seed", "batch_size"):
        state = _state(files["a"])
        del state[key]
        with pytest.raises(StateError, match=f"no '{key}'"):
            _load(files["a"], state)
    for bad in (None, [], "state", 3):
        with pytest.raises(StateError, match="not a rowstore epoch state"):
            _load(files["a"], bad)


def test_json_text_is_bounded(monkeypatch):
    assert loads_state('{"a": [[1, 2]], "s": "[[[[[[[[[[[[[[[[[[[[["}') == {
        "a": [[1, 2]],
        "s": "[" * 21,
    }
    # brackets in strings (escaped quotes and backslashes too) are not nesting
    text = '{"s": "\\"' + "[" * 20 + '\\\\", "t": ["\\\\", [[1]]]}'
    assert loads_state(text) == {"s": '"' + "[" * 20 + "\\", "t": ["\\", [[1]]]}
    for text in ("[" * 100_000, "[" * 100_000 + "]" * 100_000, '{"a":' * 50 + "1" + "}" * 50):
        with pytest.raises(StateError, match="nested"):
            loads_state(text)
    for bad in (b"\xff\xfe{}", "{'a': 1}", "", '"' + '\\"' * 10_000):
        with pytest.raises(StateError):
            loads_state(bad)
    monkeypatch.setattr(state_codec, "MAX_STATE_BYTES", 64)
    with pytest.raises(StateError, match="bytes"):
        loads_state(json.dumps({"remaining": [[i, i + 1] for i in range(0, 40, 2)]}))


# -- the loaders -------------------------------------------------------------------------------
def test_torch_loaders_refuse_another_dataset_and_bad_fields(files):
    pytest.importorskip("torch")
    import rowstore.torch as rst

    kw = dict(batch_size=B, seed=1, window=2, pieces=1)

    def loaders(path):
        ds = rst.IterableDataset(path, **kw)
        sampler = rst.ElasticBatchSampler(rst.Dataset(path), **kw)
        return {
            "BatchedDataLoader": rst.BatchedDataLoader(path, **kw),
            "IterableDataset": rst.IterableDataset(path, **kw),
            "ResumableDataLoader(IterableDataset)": rst.ResumableDataLoader(ds, batch_size=None),
            "ResumableDataLoader(ElasticBatchSampler)": rst.ResumableDataLoader(
                rst.Dataset(path), batch_sampler=sampler, collate_fn=rst.collate
            ),
        }

    dl = rst.BatchedDataLoader(files["a"], **kw)
    it = iter(dl)
    head = [next(it)["id"].tolist() for _ in range(3)]
    it.close()
    state = json.loads(json.dumps(dl.state_dict()))
    assert state["dataset"] == rowstore.Reader(files["a"]).fingerprint
    for name, loader in loaders(files["b"]).items():
        with pytest.raises(StateError, match="another dataset"):
            loader.load_state_dict(state)
        for field, value in (
            ("remaining", [[3, 12, 1]]),  # torch's RuntimeError before
            ("remaining", [[2**63, 2**63 + 1]]),  # plan's OverflowError before
            ("remaining", [[5.5, 12]]),
            ("epoch", 2**63),
        ):
            with pytest.raises(StateError) as e:
                loader.load_state_dict({**state, field: value})
            assert e.value.field == field, name
    for loader in loaders(files["copy"]).values():  # a's bytes: resumes
        loader.load_state_dict(state)
    rest = rst.BatchedDataLoader(files["copy"], **kw)
    rest.load_state_dict(state)
    whole = [b["id"].tolist() for b in rst.BatchedDataLoader(files["a"], **kw)]
    assert head + [b["id"].tolist() for b in rest] == whole
    # a DataLoader worker's own state resumes only in that worker's IterableDataset
    worker = {**state, "consumer": [0, 2], "taken": 1, "row": 0}
    rst.IterableDataset(files["a"], **kw).load_state_dict(worker)
    with pytest.raises(StateError, match="worker") as e:
        rst.BatchedDataLoader(files["a"], **kw).load_state_dict(worker)
    assert e.value.field == "consumer"


def test_memory_cache_refuses_another_dataset_and_old_in_memory_states(files):
    pytest.importorskip("torch")
    import rowstore.torch as rst

    kw = dict(batch_size=B, seed=3, cache="memory")
    dl = rst.BatchedDataLoader(files["a"], **kw)
    it = iter(dl)
    head = [next(it)["id"].tolist() for _ in range(2)]
    it.close()
    state = json.loads(json.dumps(dl.state_dict()))
    assert state["kind"] == "rowstore.epoch" and state["version"] == 3
    with pytest.raises(StateError, match="another dataset"):
        rst.BatchedDataLoader(files["b"], **kw).load_state_dict(state)
    with pytest.raises(StateError) as e:
        dl.load_state_dict({**state, "remaining": [[2, 1]]})
    assert e.value.field == "remaining"
    rest = rst.BatchedDataLoader(files["a"], **kw)
    rest.load_state_dict(state)
    whole = [b["id"].tolist() for b in rst.BatchedDataLoader(files["a"], batch_size=B, seed=3)]
    assert head + [b["id"].tolist() for b in rest] == whole
    # the in-memory loader's states (a position in its own permutation) resume nowhere now
    inmem = {
        "kind": "InMemBatchedDataLoader",
        "version": 3,
        "epoch": 0,
        "dataset_version": None,
        "num_rows": N,
        "dataset": state["dataset"],
        "shard": [0, 1],
        "even": False,
        "seed": 3,
        "shuffle": True,
        "batch_size": B,
        "position": 16,
        "stop_epoch": 1,
    }
    with pytest.raises(StateError) as e:
        rst.BatchedDataLoader(files["a"], **kw).load_state_dict(inmem)
    assert e.value.field == "kind"


def test_tf_loader_refuses_another_dataset_and_bad_fields(files, tmp_path):
    tf = pytest.importorskip("tensorflow")
    import rowstore.tf as rtf

    kw = dict(batch_size=B, seed=1, window=2, pieces=1)
    loader = rtf.Loader(files["a"], **kw)
    it = iter(loader.dataset())
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    ck = tf.train.Checkpoint(data=loader).write(str(tmp_path / "a"))
    other = rtf.Loader(files["b"], **kw)
    with pytest.raises(StateError, match="another dataset"):
        other.load_state_dict(state)
    with pytest.raises(StateError) as e:
        other.load_state_dict({**state, "remaining": [["3", 12]]})
    assert e.value.field == "remaining"
    tf.train.Checkpoint(data=other).read(ck).assert_consumed()
    with pytest.raises(StateError, match="another dataset"):
        other.dataset()
    same = rtf.Loader(files["copy"], **kw)  # a's bytes: the checkpoint resumes
    tf.train.Checkpoint(data=same).read(ck).assert_consumed()
    assert len(list(same.dataset())) == 12 - 3
    same._epoch.assign(2**63 - 1)
    with pytest.raises(StateError) as e:
        same.state_dict()
    assert e.value.field == "epoch"
    same._epoch.assign(0)
    same._steps.assign(13)
    with pytest.raises(StateError, match="13, more than the 12 steps") as e:
        len(same)
    assert e.value.field == "steps"
    same._steps.assign(0)
    same._base.assign("[" * 10_000)
    with pytest.raises(StateError, match="nested"):
        same.dataset()


def test_grain_refuses_another_dataset_and_hostile_files(files, tmp_path):
    pytest.importorskip("grain")
    from etils import epath

    import rowstore.grain as rg

    kw = dict(batch_size=B, seed=1, window=2, pieces=1, shard=(0, 1))
    it = iter(rg.EpochDataset(files["a"], **kw))
    for _ in range(3):
        next(it)
    state = it.get_state()
    other = iter(rg.EpochDataset(files["b"], **kw))
    with pytest.raises(StateError, match="another dataset"):
        other.set_state(state)
    with pytest.raises(StateError) as e:
        other.set_state({**state, "remaining": [[5.5, 12]]})
    assert e.value.field == "remaining"
    d = epath.Path(tmp_path / "ckpt")
    d.mkdir()
    rg.CheckpointHandler().save(d, item=it)
    back = rg.CheckpointHandler().restore(d, item=iter(rg.EpochDataset(files["copy"], **kw)))
    assert len(list(back)) == 12 - 3
    with pytest.raises(StateError, match="another dataset"):
        rg.CheckpointHandler().restore(d, item=iter(rg.EpochDataset(files["b"], **kw)))
    (name,) = os.listdir(d)
    for text in ("[" * 200_000, '{"kind": ' + "[" * 5000 + "]" * 5000 + "}", "\xff"):
        (d / name).write_text(text)
        with pytest.raises(StateError):
            rg.CheckpointHandler().restore(d, item=iter(rg.EpochDataset(files["a"], **kw)))
