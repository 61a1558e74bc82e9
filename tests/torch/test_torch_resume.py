"""Elastic resume through torch's DataLoader: a training process with DataLoader workers is
killed (SIGKILL) after saving a state and restarted on another world with other workers; the
map-style path (ElasticBatchSampler); torchdata's StatefulDataLoader; len(); row mode ids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import wait_until  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import rowstore  # noqa: E402
import rowstore.torch as rst  # noqa: E402
from rowstore import Field, Schema  # noqa: E402

N = 203


@pytest.fixture(scope="module")
def ids_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("resume") / "ids.h5")
    ids = np.arange(N, dtype=np.int64)
    with rowstore.Writer(
        path, Schema([Field("id", "int64"), Field("x", "float32", (3,))]), rows_per_block=16
    ) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] + 0.5, 3, axis=1).astype(np.float32)})
    return path


def _real(b) -> list[int]:
    ids = b["id"]
    return (ids[~b["__pad"]] if "__pad" in b else ids).tolist()


# The training loop: `world` ranks simulated in lockstep in one process (each its own
# ResumableDataLoader with DataLoader workers), one step = one batch from every rank, as DDP
# does. Every delivered row is logged with its step; after `save_at` steps the state of one
# rank is saved (atomically), then the loop keeps going slowly until it is killed.
_TRAIN = """
import json, os, sys, time
import torch
import rowstore.torch as rst

path, out, world, workers, save_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
state_file = os.path.join(out, "state.json")
loaders = []
for rank in range(world):
    ds = rst.IterableDataset(path, batch_size=8, seed=5, window=2, shard=(rank, world), pad=True)
    dl = rst.ResumableDataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context="fork")
    if os.path.exists(state_file):
        with open(state_file) as f:
            dl.load_state_dict(json.load(f))
    loaders.append(dl)
lens = [len(dl) for dl in loaders]
log = open(os.path.join(out, f"log{os.getpid()}.jsonl"), "w")
log.write(json.dumps({"lens": lens}) + "\\n")
its = [iter(dl) for dl in loaders]
step = 0
while True:
    try:
        batches = [next(it) for it in its]
    except StopIteration:
        break
    for b in batches:
        ids = b["id"][~b["__pad"]].tolist()
        log.write(json.dumps({"step": step, "ids": ids}) + "\\n")
    log.flush()
    step += 1
    if step == save_at:
        states = [dl.state_dict() for dl in loaders]
        assert all(s == states[0] for s in states), states
        with open(state_file + ".tmp", "w") as f:
            json.dump(states[-1], f)
        os.replace(state_file + ".tmp", state_file)
    if save_at and step >= save_at:
        time.sleep(0.2)  # keep training (and delivering rows the state does not count) until killed
log.write(json.dumps({"done": step}) + "\\n")
log.close()
"""


def _read_log(out) -> list[dict]:
    recs = []
    for name in sorted(os.listdir(out)):
        if name.startswith("log"):
            recs.append(
                [json.loads(line) for line in open(os.path.join(out, name)) if line.endswith("\n")]
            )
    return recs


def test_killed_mid_epoch_and_resumed_on_another_world(ids_path, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_TRAIN))
    out = tmp_path / "run"
    out.mkdir()
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    # world 2 x 2 workers; the state is saved after 3 steps, then the process is killed
    p = subprocess.Popen(
        [sys.executable, str(script), ids_path, str(out), "2", "2", "3"],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def past_the_state() -> (
        bool
    ):  # batches delivered after the saved state (lost progress: they come again)
        assert p.poll() is None, p.communicate()[1].decode()[-3000:]
        logs = _read_log(out) if (out / "state.json").exists() else []
        return any(r.get("step", 0) >= 4 for recs in logs for r in recs)

    try:
        assert wait_until(past_the_state, timeout=120), "no batch delivered after the saved state"
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the trainer and its DataLoader workers
        p.wait()
    assert p.returncode == -signal.SIGKILL
    (first,) = _read_log(out)
    assert "done" not in first[-1]
    before = [i for r in first if r.get("step", 99) < 3 for i in r["ids"]]
    assert any(r.get("step", 0) >= 3 for r in first)  # it went on past the saved state
    for name in os.listdir(out):
        if name.startswith("log"):
            os.rename(out / name, out / ("old" + name))
    # restart on world 3 x 1 worker from the saved state
    done = subprocess.run(
        [sys.executable, str(script), ids_path, str(out), "3", "1", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (second,) = _read_log(out)
    after = [i for r in second if "ids" in r for i in r["ids"]]
    assert "done" in second[-1]
    lens = second[0]["lens"]
    assert len(set(lens)) == 1 and second[-1]["done"] == lens[0]  # equal steps, known before
    assert len(before) + len(after) == N and sorted(before + after) == list(range(N))


def test_map_style_sampler_resumes_on_another_world(ids_path):
    ds = rst.Dataset(ids_path)
    first, states = [], []
    for rank in range(3):
        sampler = rst.ElasticBatchSampler(
            ds, batch_size=8, seed=2, shard=(rank, 3), drop_last=True, with_ids=True
        )
        dl = rst.ResumableDataLoader(
            ds,
            batch_sampler=sampler,
            collate_fn=rst.collate,
            num_workers=2,
            multiprocessing_context="fork",
        )
        assert len(dl) == len(sampler) == (N // 8) // 3
        for k, b in enumerate(dl):
            assert b["id"].tolist() == b["__id"].tolist()
            first += b["id"].tolist()
            if k == 3:
                break
        states.append(dl.state_dict())
    assert states[0] == states[1] == states[2]
    rest = []
    for rank in range(2):
        sampler = rst.ElasticBatchSampler(ds, batch_size=8, seed=2, shard=(rank, 2), drop_last=True)
        dl = rst.ResumableDataLoader(ds, batch_sampler=sampler, collate_fn=rst.collate)
        dl.load_state_dict(states[0])
        dl.set_epoch(0)  # the usual loop: keeps the loaded position
        rest += [i for b in dl for i in b["id"].tolist()]
        assert dl.state_dict()["epoch"] == 1
    got = first + rest
    assert len(got) == len(set(got)) and N - len(got) < 8 * 3


@pytest.mark.parametrize("persistent", [False, True])
def test_resumable_loader_continues_and_moves_on(ids_path, persistent):
    ds = rst.IterableDataset(ids_path, batch_size=10, seed=1)
    dl = rst.ResumableDataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=persistent,
    )
    n = len(dl)
    got = []
    for k, b in enumerate(dl):
        got += b["id"].tolist()
        if k == 4:
            break
    got += [i for b in dl for i in b["id"].tolist()]  # iterating again continues
    assert sorted(got) == list(range(N)) and n == -(-N // 10)
    assert dl.state_dict()["epoch"] == 1
    e1 = [i for b in dl for i in b["id"].tolist()]  # the next iteration is the next epoch
    assert sorted(e1) == list(range(N)) and e1 != got
    with pytest.raises(ValueError, match="batch_size"):
        rst.ResumableDataLoader(rst.IterableDataset(ids_path), batch_size=4)
    with pytest.raises(TypeError, match="ElasticBatchSampler"):
        rst.ResumableDataLoader(rst.Dataset(ids_path), batch_size=4)


def test_stateful_dataloader_workers(ids_path):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    kw = dict(batch_size=None, num_workers=2, multiprocessing_context="fork")
    ds = rst.IterableDataset(ids_path, batch_size=8, seed=9)
    dl = sdl.StatefulDataLoader(ds, **kw)
    first = []
    for k, b in enumerate(dl):
        first += b["id"].tolist()
        if k == 6:
            break
    state = dl.state_dict()
    dl2 = sdl.StatefulDataLoader(rst.IterableDataset(ids_path, batch_size=8, seed=9), **kw)
    dl2.load_state_dict(state)
    rest = [i for b in dl2 for i in b["id"].tolist()]
    assert sorted(first + rest) == list(range(N))
    # map-style: the sampler is deterministic, StatefulDataLoader fast-forwards it
    mds = rst.Dataset(ids_path)
    mk = lambda: sdl.StatefulDataLoader(
        mds,
        batch_sampler=rst.ElasticBatchSampler(mds, batch_size=8, seed=9),  # noqa: E731
        collate_fn=rst.collate,
        num_workers=2,
        multiprocessing_context="fork",
    )
    dl = mk()
    first = []
    for k, b in enumerate(dl):
        first += b["id"].tolist()
        if k == 5:
            break
    dl2 = mk()
    dl2.load_state_dict(dl.state_dict())
    rest = [i for b in dl2 for i in b["id"].tolist()]
    assert sorted(first + rest) == list(range(N))


def test_row_mode_ids_and_len(ids_path):
    ds = rst.IterableDataset(ids_path, seed=3, with_ids=True, rows=np.arange(100), num_workers=0)
    batches = list(DataLoader(ds, batch_size=16, collate_fn=rst.collate))
    assert all(b["id"].tolist() == b["__id"].tolist() for b in batches)
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(100))
    assert len(ds) == 100 and len(DataLoader(ds, batch_size=16, collate_fn=rst.collate)) == 7
    with pytest.raises(TypeError, match="num_workers"):
        len(rst.IterableDataset(ids_path))


def test_quality_reported_by_the_dataset_and_sampler(ids_path, caplog):
    seen = []
    ds = rst.IterableDataset(
        ids_path, batch_size=10, num_epochs=2, quality=lambda e, q: seen.append((e, q))
    )
    assert len(list(DataLoader(ds, batch_size=None))) == 2 * -(-N // 10)
    assert [e for e, _ in seen] == [0, 1] and all(0 < q <= 1 for _, q in seen)
    with caplog.at_level("INFO", logger="rowstore"):
        list(rst.ElasticBatchSampler(rst.Dataset(ids_path), batch_size=10, quality="log"))
    assert "shuffle quality" in caplog.text
    with pytest.raises(ValueError, match="quality"):
        rst.IterableDataset(ids_path, quality="print")
