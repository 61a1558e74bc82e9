"""rowstore.torch: datasets with DataLoader workers and DDP ranks, the batched loaders (resume,
epochs), transforms, dtypes, variable-length collation and the CPU fallback of the device path.

Small files and few processes: the whole module should take well under a minute on 2 cores."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import rowstore  # noqa: E402
import rowstore.torch as rst  # noqa: E402
from rowstore import Field, Schema  # noqa: E402
from rowstore.errors import SchemaError  # noqa: E402
from rowstore.reader.image_ops import RandomResizedCrop  # noqa: E402

N = 203  # odd, and not a multiple of the block size: shards and batches come out uneven


@pytest.fixture(scope="module")
def ids_path(tmp_path_factory) -> str:
    """``id`` (int64, = row number) and ``x`` (float32[3], = id + 0.5) in 13 blocks of 16 rows."""
    path = str(tmp_path_factory.mktemp("torch") / "ids.h5")
    schema = Schema([Field("id", "int64"), Field("x", "float32", (3,))])
    ids = np.arange(N, dtype=np.int64)
    with rowstore.Writer(path, schema, rows_per_block=16) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] + 0.5, 3, axis=1).astype(np.float32)})
    return path


VAR_SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("wave", "float32", (None,)),
        Field("seq", "int16", (None, 2)),
        Field("grid", "float32", (None, 3, None), nullable=True),
        Field("text", "str", nullable=True),
        Field("blob", "bytes"),
        Field("label", "float32", nullable=True),
    ]
)


def _var_row(i: int) -> dict:
    return {
        "id": i,
        "wave": np.arange(i % 5, dtype=np.float32) + i,
        "seq": np.full((i % 4, 2), i, np.int16),
        "grid": None if i % 6 == 0 else np.full((1 + i % 2, 3, 1 + i % 3), i, np.float32),
        "text": None if i % 4 == 0 else f"row {i} é",
        "blob": bytes([i % 256]) * (i % 3),
        "label": None if i % 5 == 0 else float(i),
    }


@pytest.fixture(scope="module")
def var_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("torch") / "var.h5")
    with rowstore.Writer(path, VAR_SCHEMA, rows_per_block=8) as w:
        for i in range(40):
            w.write(_var_row(i))
    return path


def _ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"].tolist()]


def _assert_once(ids: list[int], n: int = N) -> None:
    assert len(ids) == n and sorted(ids) == list(range(n)), (len(ids), len(set(ids)))


# -- map-style Dataset -------------------------------------------------------------------------
def test_dataset_getitems_one_take_and_collate(ids_path):
    ds = rst.Dataset(ids_path)
    assert len(ds) == N
    row = ds[5]
    assert isinstance(row, rst.Row) and row["id"].item() == 5 and row["x"].tolist() == [5.5] * 3
    rb = ds.__getitems__([3, 1, 4, 1])
    assert isinstance(rb, rst.RowBatch) and len(rb) == 4 and rb[1]["id"].item() == 1
    batches = list(DataLoader(ds, batch_size=10, collate_fn=rst.collate))
    assert [len(b["id"]) for b in batches] == [10] * 20 + [3]
    assert _ids(batches) == list(range(N))
    b = batches[1]
    assert b["x"].dtype == torch.float32 and b["x"].shape == (10, 3)
    assert torch.equal(b["x"][:, 0], b["id"].float() + 0.5)
    # default_collate still works on a RowBatch (row by row); same values
    b2 = next(iter(DataLoader(ds, batch_size=10)))
    assert torch.equal(b2["id"], batches[0]["id"]) and torch.equal(b2["x"], batches[0]["x"])


@pytest.mark.parametrize("ctx,persistent", [("fork", False), ("spawn", True)])
def test_dataset_workers_fork_spawn(ids_path, ctx, persistent):
    reader = rowstore.open(ids_path)
    reader[0]  # the parent has read (and opened its descriptor) before the workers start
    ds = rst.Dataset(reader)
    dl = DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=ctx,
        persistent_workers=persistent,
        collate_fn=rst.collate,
        generator=torch.Generator().manual_seed(0),
    )
    for _ in range(2 if persistent else 1):
        batches = list(dl)
        _assert_once(_ids(batches))
        b = batches[0]
        assert torch.equal(b["x"][:, 2], b["id"].float() + 0.5)


# -- IterableDataset ---------------------------------------------------------------------------
def test_iterable_workers_batches_and_rows(ids_path):
    ds = rst.IterableDataset(ids_path, batch_size=10, seed=3)
    batches = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    _assert_once(_ids(batches))
    assert all(len(b["id"]) <= 10 for b in batches)
    # the union of worker parts is the epoch; each worker's part is its dealt part (consumer w of 2)
    r = rowstore.open(ids_path)
    assert _ids(batches[0::2]) == _ids(
        r.deal(10, shard=(0, 2), seed=3)
    )  # worker 0 (in-order round robin)
    assert _ids(batches[1::2]) == _ids(r.deal(10, shard=(1, 2), seed=3))
    # rows, collated by rowstore.torch.collate
    rows_ds = rst.IterableDataset(ids_path, shuffle="full", seed=1)
    batches = list(
        DataLoader(
            rows_ds,
            batch_size=7,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=rst.collate,
        )
    )
    _assert_once(_ids(batches))
    # even: every worker takes the same number of whole batches: 25 of 8 rows dealt to 2 -> 12 each
    even = rst.IterableDataset(ids_path, batch_size=8, drop_last=True)
    batches = list(DataLoader(even, batch_size=None, num_workers=2, multiprocessing_context="fork"))
    ids = _ids(batches)
    assert (
        len(ids) == 24 * 8 and len(set(ids)) == len(ids) and {len(b["id"]) for b in batches} == {8}
    )
    assert even.num_items(num_workers=2) == 24


def test_iterable_matches_reader_order_and_set_epoch(ids_path):
    r = rowstore.open(ids_path)
    ds = rst.IterableDataset(ids_path, batch_size=32, seed=5, shard=(1, 3))
    e0 = _ids(ds)
    assert e0 == _ids(r.deal(32, shard=(1, 3), seed=5))
    ds.set_epoch(1)
    e1 = _ids(ds)
    assert e1 == _ids(r.deal(32, shard=(1, 3), seed=5, epoch=1)) and e1 != e0
    ds.set_epoch(0)
    assert _ids(ds) == e0
    rows = list(rst.IterableDataset(ids_path, shuffle="none"))
    assert [int(x["id"]) for x in rows] == list(range(N))


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_iterable_persistent_workers_see_set_epoch(ids_path, ctx):
    ds = rst.IterableDataset(ids_path, batch_size=16, seed=2)
    dl = DataLoader(
        ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=ctx
    )
    orders = []
    for epoch in (0, 1, 0):
        ds.set_epoch(epoch)
        ids = _ids(dl)
        _assert_once(ids)
        orders.append(ids)
    assert orders[0] != orders[1] and orders[0] == orders[2]


_DDP_SCRIPT = """
import json, os, sys, warnings
warnings.simplefilter("ignore")
import torch, torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
import rowstore.torch as rst

def run(rank, path, init, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    res = {}
    ds = rst.IterableDataset(path, batch_size=8, seed=7)  # shard from torch.distributed
    res["iterable"] = [int(i) for b in DataLoader(ds, batch_size=None, num_workers=2,
    multiprocessing_context="fork")
                       for i in b["id"]]
    ds = rst.IterableDataset(path, seed=7)  # rows
    res["iterable_rows"] = [int(i) for b in DataLoader(ds, batch_size=16, num_workers=2,
    multiprocessing_context="fork",
                                                       collate_fn=rst.collate) for i in b["id"]]
    mds = rst.Dataset(path)
    sampler = DistributedSampler(mds, shuffle=True, seed=7)
    sampler.set_epoch(1)
    res["sampler"] = [int(i) for b in DataLoader(mds, batch_size=16, sampler=sampler, num_workers=2,
                                                 multiprocessing_context="fork",
                                                 collate_fn=rst.collate)
                      for i in b["id"]]
    with rst.BatchedDataLoader(path, batch_size=16, seed=7) as dl:
        res["batched"] = [int(i) for b in dl for i in b["id"]]
    with rst.BatchedDataLoader(path, batch_size=16, seed=7, cache="memory") as dl:
        res["memory"] = [int(i) for b in dl for i in b["id"]]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    path, out = sys.argv[1], sys.argv[2]
    init = "file://" + os.path.join(out, "init")
    torch.multiprocessing.spawn(run, args=(path, init, out), nprocs=2)
"""


def test_ddp_two_ranks_two_workers(ids_path, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(_DDP_SCRIPT))
    proc = subprocess.run(
        [sys.executable, str(script), ids_path, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for key in ("iterable", "iterable_rows", "batched", "memory"):
        _assert_once(res[0][key] + res[1][key])
        assert not set(res[0][key]) & set(res[1][key])
    # DistributedSampler pads to a multiple of the world size by repeating rows
    both = res[0]["sampler"] + res[1]["sampler"]
    assert len(res[0]["sampler"]) == len(res[1]["sampler"]) == (N + 1) // 2
    assert sorted(set(both)) == list(range(N))


# -- BatchedDataLoader -------------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
def test_batched_matches_reader_and_resumes(ids_path, shuffle):
    r = rowstore.open(ids_path)
    kw = dict(batch_size=16, shuffle=shuffle, seed=11, shard=(1, 2), window=3)
    dl = rst.BatchedDataLoader(ids_path, **kw)
    dl.set_epoch(2)
    # rank 1 of 2 gets its dealt part of the epoch's global batches (rowstore.reader.plan)
    expect = _ids(r.deal(16, shard=(1, 2), shuffle=shuffle, seed=11, epoch=2, window=3))
    assert len(dl) == -(-len(expect) // 16)
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    buf = io.BytesIO()
    torch.save(dl.state_dict(), buf)
    tail = list(it)
    assert _ids(head + tail) == expect
    assert dl.epoch == 3 and dl.position == 0  # a finished iteration moves to the next epoch
    # a new process resumes from the saved state: same remaining rows, same order
    dl2 = rst.BatchedDataLoader(ids_path, **kw)
    dl2.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    dl2.set_epoch(2)  # the usual loop calls set_epoch(epoch) after loading: keeps the position
    assert len(dl2) == len(tail)
    resumed = list(dl2)
    assert _ids(resumed) == _ids(tail)
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(resumed, tail))


@pytest.mark.parametrize("policy", [dict(drop_last=True), dict(pad=True), {}])
def test_batched_elastic_resume_on_another_world(ids_path, policy):
    """2 ranks take 3 steps each and save (both states equal); 3 ranks resume from one of them
    and deliver exactly the rows not yet delivered; equal steps under drop_last/pad."""
    kw = dict(batch_size=8, seed=3, window=2, with_ids=True, **policy)

    def real(b):
        ids = b["__id"]
        return ids[~b["__pad"]].tolist() if "__pad" in b else ids.tolist()

    first, states = [], []
    for rank in range(2):
        dl = rst.BatchedDataLoader(ids_path, shard=(rank, 2), **kw)
        it = iter(dl)
        first += [i for _ in range(3) for i in real(next(it))]
        states.append(json.loads(json.dumps(dl.state_dict())))
        it.close()
    assert states[0] == states[1] and states[0]["remaining"]
    rest, steps = [], []
    for rank in range(3):
        dl = rst.BatchedDataLoader(ids_path, shard=(rank, 3), **kw)
        dl.load_state_dict(states[1])
        n = len(dl)
        got = list(dl)
        assert len(got) == n
        steps.append(n)
        rest += [i for b in got for i in real(b)]
        assert dl.epoch == 1 and dl.steps == 0
    assert len(first) + len(rest) == len(set(first) | set(rest))
    if policy:
        assert len(set(steps)) == 1
    if "drop_last" in policy:
        assert N - len(first + rest) < 8 * 3
    else:
        _assert_once(first + rest)


def test_batched_ids_subsets_predicate_epochs_quality(ids_path, caplog):
    rows = np.arange(0, N, 3)
    dl = rst.BatchedDataLoader(
        ids_path, batch_size=10, rows=rows, with_ids=True, num_epochs=2, seed=1
    )
    assert len(dl) == 2 * -(-len(rows) // 10)
    ids = _ids(dl)
    assert sorted(ids) == sorted(rows.tolist() * 2) and ids[: len(rows)] != ids[len(rows) :]
    pred = rst.BatchedDataLoader(
        ids_path,
        batch_size=10,
        predicate=lambda b: b["id"] % 3 == 0,
        fields=["x"],
        with_ids=True,
        seed=1,
    )
    assert sorted(i for b in pred for i in b["__id"].tolist()) == rows.tolist()
    seen = []
    with caplog.at_level("INFO", logger="rowstore"):
        dl = rst.BatchedDataLoader(ids_path, batch_size=10, quality="log", num_epochs=2)
        list(dl)
        list(
            rst.BatchedDataLoader(ids_path, batch_size=10, quality=lambda e, q: seen.append((e, q)))
        )
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "rowstore epoch 0",
        "rowstore epoch 1",
    ]
    assert len(seen) == 1 and seen[0][0] == 0 and 0 < seen[0][1] <= 1
    with pytest.raises(TypeError, match="num_workers"):  # no worker processes: num_threads
        rst.BatchedDataLoader(ids_path, batch_size=10, num_workers=2)
    with pytest.raises(ValueError, match="choose one"):
        rst.BatchedDataLoader(ids_path, batch_size=10, pad=True, drop_last=True)


def test_batched_epochs_break_and_restart(ids_path):
    r = rowstore.open(ids_path)
    dl = rst.BatchedDataLoader(ids_path, batch_size=32, seed=4)
    e0, e1 = _ids(dl), _ids(dl)  # without set_epoch, successive iterations are successive epochs
    assert e0 == r.epoch_order(seed=4).tolist() and e1 == r.epoch_order(seed=4, epoch=1).tolist()
    dl.set_epoch(0)
    assert _ids(dl) == e0  # the same epoch repeats its order
    dl.set_epoch(1)
    for k, _ in enumerate(dl):
        if k == 1:
            break
    assert dl.position == 64 and _ids(dl) == e1[64:]  # iterating again continues
    dl.set_epoch(1)
    for k, _ in enumerate(dl):
        if k == 1:
            break
    dl.set_epoch(1)  # set_epoch (no pending load) restarts the epoch
    assert _ids(dl) == e1
    with pytest.raises(ValueError, match="seed"):
        rst.BatchedDataLoader(ids_path, batch_size=32, seed=5).load_state_dict(dl.state_dict())


def test_batched_context_manager_stops_threads(ids_path):
    with rst.BatchedDataLoader(ids_path, batch_size=4, num_threads=2, window=1) as dl:
        for k, b in enumerate(dl):
            assert b["id"].dtype == torch.int64
            if k == 2:
                break
    assert not [t for t in threading.enumerate() if t.name.startswith("rowstore")]


def test_batched_cpu_fallback_of_device_path(ids_path):
    ref = list(rst.BatchedDataLoader(ids_path, batch_size=50, seed=1))
    variants = [
        dict(device="cpu"),
        dict(device=None, pin_memory=False),
        dict(device=torch.device("cpu")),
    ]
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="pin_memory"):
            dl = rst.BatchedDataLoader(ids_path, batch_size=50, seed=1, pin_memory=True)
        assert dl.pin_memory is False
        variants.append(dict(pin_memory=True))
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            rst.BatchedDataLoader(ids_path, batch_size=50, device="cuda")
    for kw in variants:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dl = rst.BatchedDataLoader(ids_path, batch_size=50, seed=1, **kw)
        got = list(dl)
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert (
                a["x"].device.type == "cpu"
                and torch.equal(a["x"], b["x"])
                and torch.equal(a["id"], b["id"])
            )


# -- cache="memory" ------------------------------------------------------------------------------
def test_memory_cache_deals_what_the_reader_deals(ids_path):
    kw = dict(batch_size=20, num_epochs=3, seed=9, shard=(0, 2), window=2, with_ids=True)
    dl = rst.BatchedDataLoader(ids_path, cache="memory", **kw)
    full = list(dl)
    assert _ids(full) == _ids(rst.BatchedDataLoader(ids_path, **kw))  # the same order, "block"
    assert all(torch.equal(b["id"], b["__id"]) for b in full)
    assert dl.epoch == 3 and dl.position == 0
    # resume in the middle of the second epoch, through torch.save/load
    dl = rst.BatchedDataLoader(ids_path, cache="memory", **kw)
    it = iter(dl)
    head = [next(it) for _ in range(7)]
    buf = io.BytesIO()
    torch.save(dl.state_dict(), buf)
    it.close()
    dl2 = rst.BatchedDataLoader(ids_path, cache="memory", **kw)
    dl2.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    assert len(dl2) == len(full) - 7 + len(full) // 3
    again = list(dl2)
    assert _ids(head + again)[: len(_ids(full))] == _ids(full)
    assert all(torch.equal(a["x"], b["x"]) for a, b in zip(head + again, full))
    unshuffled = rst.BatchedDataLoader(
        ids_path, batch_size=64, cache="memory", shuffle=False, drop_last=True
    )
    assert _ids(unshuffled) == list(range(N // 64 * 64))
    with pytest.raises(ValueError, match="decode"):
        rst.BatchedDataLoader(
            ids_path, batch_size=4, cache="memory", decode={"x": RandomResizedCrop(8)}
        )
    with pytest.raises(ValueError, match="cache"):
        rst.BatchedDataLoader(ids_path, batch_size=4, cache="disk")


def test_memory_cache_varlen_gather(var_path):
    dl = rst.BatchedDataLoader(var_path, batch_size=7, cache="memory", varlen="list", seed=1)
    r = rowstore.open(var_path)
    for b in dl:
        for i, rid in enumerate(b["id"].tolist()):
            row = r[rid]
            assert np.array_equal(b["wave"][i].numpy(), row["wave"]) and b["text"][i] == row["text"]


# -- transforms --------------------------------------------------------------------------------
def _row_tf(row):
    row["x"] = row["x"] * 2  # float32 stays float32
    row["big"] = row["id"] >= 100  # added, bool
    row["tag"] = f"id{int(row['id'])}"
    return row


def test_row_transform_spec(ids_path):
    spec = rst.TransformSpec(_row_tf, edit_fields=[("big", "bool", ()), Field("tag", "str")])
    ds = rst.Dataset(ids_path, transform=spec)
    assert ds.output_schema.names == ["id", "x", "big", "tag"]
    b = next(iter(DataLoader(ds, batch_size=8, sampler=range(96, 104), collate_fn=rst.collate)))
    assert b["big"].dtype == torch.bool and b["big"].tolist() == [False] * 4 + [True] * 4
    assert b["tag"] == [f"id{i}" for i in range(96, 104)] and torch.equal(
        b["x"][:, 0], b["id"] * 2.0 + 1.0
    )
    # row mode of the IterableDataset, with removal and selection
    spec = rst.TransformSpec(
        _row_tf,
        edit_fields=[("big", "bool"), ("tag", "str")],
        removed_fields=["x"],
        selected_fields=["tag", "id"],
    )
    ids = rst.IterableDataset(ids_path, transform=spec, shuffle="none")
    rows = list(DataLoader(ids, batch_size=5, collate_fn=rst.collate))
    assert list(rows[0]) == ["tag", "id"] and rows[0]["tag"][:2] == ["id0", "id1"]
    assert ids.output_schema.names == ["tag", "id"]


def _add_one(b):
    b["id"] = b["id"] + 1
    return b


def test_dataset_row_then_batch_transform(ids_path):
    spec = rst.TransformSpec(_row_tf, edit_fields=[("big", "bool"), ("tag", "str")])
    ds = rst.Dataset(
        ids_path,
        transform=spec,
        batch_transform=rst.TransformSpec(_add_one, removed_fields=["tag"]),
    )
    assert ds.output_schema.names == ["id", "x", "big"]
    b = next(iter(DataLoader(ds, batch_size=4, collate_fn=rst.collate)))
    assert set(b) == {"id", "x", "big"} and b["id"].tolist() == [1, 2, 3, 4]
    assert ds[7]["id"].item() == 8 and ds[7]["x"].tolist() == [15.0] * 3


def test_batch_transform_spec_and_errors(ids_path):
    def f(b):
        return {"id": b["id"], "y": b["x"].sum(axis=1).astype(np.float64)}

    spec = rst.TransformSpec(f, edit_fields=[Field("y", "float64")], removed_fields=["x"])
    dl = rst.BatchedDataLoader(ids_path, batch_size=10, shuffle="none", transform=spec)
    assert dl.output_schema.names == ["id", "y"] and dl.output_schema["y"].dtype == np.float64
    b = next(iter(dl))
    assert set(b) == {"id", "y"} and b["y"].dtype == torch.float64
    assert torch.allclose(b["y"], (b["id"].double() + 0.5) * 3)
    # a plain callable keeps the schema; int64 -> int32 is a same-kind cast, float -> int is not
    ok = rst.BatchedDataLoader(
        ids_path, batch_size=10, transform=lambda b: {**b, "id": b["id"].astype(np.int32)}
    )
    assert next(iter(ok))["id"].dtype == torch.int64
    bad = rst.BatchedDataLoader(
        ids_path, batch_size=10, transform=lambda b: {**b, "id": b["id"] + 0.5}
    )
    with pytest.raises(SchemaError, match="'id'") as ei:
        next(iter(bad))
    assert ei.value.field == "id"
    undeclared = rst.BatchedDataLoader(
        ids_path, batch_size=10, transform=lambda b: {**b, "z": b["id"]}
    )
    with pytest.raises(SchemaError, match="edit_fields") as ei:
        next(iter(undeclared))
    assert ei.value.field == "z"
    missing = rst.BatchedDataLoader(ids_path, batch_size=10, transform=lambda b: {"id": b["id"]})
    with pytest.raises(SchemaError, match="lacks field 'x'"):
        next(iter(missing))
    with pytest.raises(SchemaError, match="nope"):
        rst.BatchedDataLoader(
            ids_path, batch_size=10, transform=rst.TransformSpec(removed_fields=["nope"])
        )


# -- dtypes ------------------------------------------------------------------------------------
NUMERIC = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def test_every_dtype(tmp_path, rs):
    schema = Schema(
        [Field(f"f_{d}", d, (2,)) for d in NUMERIC] + [Field("s", "str"), Field("b", "bytes")]
    )
    rows = rs.make_rows(schema, 12, seed=1)
    path = rs.write_file(tmp_path / "dt.h5", schema, rows)
    expect = {
        "bool": torch.bool,
        "int8": torch.int8,
        "int16": torch.int16,
        "int32": torch.int32,
        "int64": torch.int64,
        "uint8": torch.uint8,
        "uint16": torch.uint16,
        "uint32": torch.uint32,
        "uint64": torch.uint64,
        "float16": torch.float16,
        "float32": torch.float32,
        "float64": torch.float64,
        "complex64": torch.complex64,
        "complex128": torch.complex128,
    }
    for b in (
        next(iter(rst.BatchedDataLoader(path, batch_size=12, shuffle="none"))),
        next(iter(DataLoader(rst.Dataset(path), batch_size=12, collate_fn=rst.collate))),
    ):
        for d in NUMERIC:
            t = b[f"f_{d}"]
            assert t.dtype == expect[d] and t.shape == (12, 2)
            assert rst.torch_dtype(schema[f"f_{d}"]) == expect[d]
            want = np.stack([r[f"f_{d}"] for r in rows]).astype(d)
            assert t.numpy().tobytes() == want.tobytes(), d
        assert b["s"] == [r["s"] for r in rows] and b["b"] == [r["b"] for r in rows]
    with pytest.raises(SchemaError, match="'s'"):
        rst.torch_dtype(schema["s"])


# -- variable-length collation -----------------------------------------------------------------
def test_varlen_padded(var_path):
    b = next(iter(rst.BatchedDataLoader(var_path, batch_size=12, shuffle="none")))
    assert b["wave"].shape == (12, 4) and b["wave__shape"].shape == (12, 1)
    assert b["seq"].shape == (12, 3, 2) and b["seq__shape"][:, 0].tolist() == [
        i % 4 for i in range(12)
    ]
    assert b["grid"].shape == (12, 2, 3, 3) and b["grid__shape"].shape == (12, 2)
    assert b["grid__null"].tolist() == [i % 6 == 0 for i in range(12)]
    assert b["text"][0] is None and b["text"][1] == "row 1 é" and b["text__null"][0]
    assert b["blob"][2] == b"\x02\x02" and b["label__null"].tolist() == [
        i % 5 == 0 for i in range(12)
    ]
    for i in range(12):
        row = _var_row(i)
        k = i % 5
        assert b["wave"][i, :k].tolist() == row["wave"].tolist() and not b["wave"][i, k:].any()
        if row["grid"] is not None:
            g = row["grid"]
            assert torch.equal(b["grid"][i, : g.shape[0], :, : g.shape[2]], torch.from_numpy(g))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
@pytest.mark.parametrize("loader", ["batched", "dataset", "iterable_rows"])
def test_varlen_nested_and_list(var_path, loader):
    varlen = {"wave": "nested", "seq": "nested", "grid": "list"}
    if loader == "batched":
        b = next(
            iter(rst.BatchedDataLoader(var_path, batch_size=12, shuffle="none", varlen=varlen))
        )
    elif loader == "dataset":
        b = next(
            iter(
                DataLoader(
                    rst.Dataset(var_path, varlen=varlen), batch_size=12, collate_fn=rst.collate
                )
            )
        )
    else:
        ds = rst.IterableDataset(var_path, shuffle="none", varlen=varlen)
        b = next(iter(DataLoader(ds, batch_size=12, collate_fn=rst.collate)))
    assert b["wave"].is_nested and b["wave"].layout == torch.jagged and "wave__shape" not in b
    assert b["seq"].is_nested and b["seq"].layout == torch.jagged and b["seq"].shape[2] == 2
    assert isinstance(b["grid"], list) and len(b["grid"]) == 12
    for i, (w, s, g) in enumerate(zip(b["wave"].unbind(), b["seq"].unbind(), b["grid"])):
        row = _var_row(i)
        assert w.tolist() == row["wave"].tolist() and s.shape == (i % 4, 2)
        assert g.shape == ((0, 3, 0) if row["grid"] is None else row["grid"].shape)
    strided = rst.BatchedDataLoader(var_path, batch_size=12, shuffle="none", varlen="nested")
    g = next(iter(strided))["grid"]
    assert g.is_nested and g.layout == torch.strided and g.unbind()[1].shape == (2, 3, 2)


def test_varlen_errors(tmp_path):
    schema = Schema([Field("a", "uint16", (None, 2, None)), Field("b", "uint32", (None,))])
    path = str(tmp_path / "u.h5")
    with rowstore.Writer(path, schema) as w:
        w.write({"a": np.ones((1, 2, 3), np.uint16), "b": np.arange(3, dtype=np.uint32)})
    with pytest.raises(SchemaError, match="'a'.*strided nested") as ei:
        rst.BatchedDataLoader(path, batch_size=2, varlen="nested")
    assert ei.value.field == "a"
    b = next(iter(rst.BatchedDataLoader(path, batch_size=2, varlen={"a": "padded", "b": "nested"})))
    assert b["b"].dtype == torch.uint32 and b["b"].unbind()[0].tolist() == [0, 1, 2]
    assert b["a"].dtype == torch.uint16 and b["a"].shape == (1, 1, 2, 3)
    with pytest.raises(SchemaError, match="zzz.*not selected") as ei:
        rst.Dataset(path, varlen={"zzz": "list"})
    assert ei.value.field == "zzz"
    with pytest.raises(ValueError, match="varlen modes"):
        rst.Dataset(path, varlen={"a": "sparse"})
    with pytest.raises(TypeError, match="varlen"):
        rst.Dataset(path, varlen=["list"])
    with pytest.raises(ValueError, match="varlen"):
        rst.Dataset(path, varlen="sparse")


def test_bools_are_not_counts(ids_path):
    def rejects(name, make):
        with pytest.raises(ValueError, match=f"^{name} must be a (positive|non-negative) int"):
            make()

    rejects("batch_size", lambda: rst.BatchedDataLoader(ids_path, batch_size=True))
    rejects("batch_size", lambda: rst.IterableDataset(ids_path, batch_size=True))
    rejects("num_epochs", lambda: rst.BatchedDataLoader(ids_path, batch_size=4, num_epochs=True))
    rejects("seed", lambda: rst.BatchedDataLoader(ids_path, batch_size=4, seed=True))
    rejects("window", lambda: rst.IterableDataset(ids_path, window=True))
    dl = rst.BatchedDataLoader(ids_path, batch_size=np.int64(4))
    assert dl.batch_size == 4 and type(dl.batch_size) is int
    rejects("epoch", lambda: dl.set_epoch(True))
    rejects("epoch", lambda: rst.IterableDataset(ids_path).set_epoch(False))
    rejects("epoch", lambda: dl.load_state_dict({**dl.state_dict(), "epoch": True}))


def test_collate_fallbacks():
    assert rst.collate([1, 2, 3]).tolist() == [
        1,
        2,
        3,
    ]  # not rowstore rows: torch's default_collate


# -- the CUDA pipeline's logic, driven by a CPU stand-in ---------------------------------------
class _FakeEvent:
    def __init__(self, log):
        self.log, self.recorded, self.synced = log, False, False

    def record(self, stream):
        self.recorded = True

    def synchronize(self):
        self.synced = True
        self.log.append("sync")


class _CpuStage(rst._CudaStage):
    """The CUDA stage with its CUDA calls replaced: 'device' copies are clones, 'pinned' buffers
    are plain tensors. Everything else (ring, threads, queue, hand-over) is the real code."""

    def __init__(self, *, pin, slots):
        self.log = []
        self.received = 0
        self.producer_threads = set()
        super().__init__(torch.device("cpu"), pin=pin, slots=slots)

    def _new_stream(self):
        return None

    def _new_event(self):
        return _FakeEvent(self.log)

    def _on_side_stream(self):
        import contextlib

        self.producer_threads.add(threading.current_thread().name)
        return contextlib.nullcontext()

    def _pinned(self, nbytes):
        self.log.append("alloc")
        return torch.empty(nbytes, dtype=torch.uint8)

    def _to_device(self, t):
        return t.clone()

    def context(self):
        import contextlib

        return contextlib.nullcontext()

    def receive(self, event, fresh):
        assert event.recorded and all(isinstance(t, torch.Tensor) for t in fresh)
        self.received += 1


def _fake_cuda(dl, *, pin=True):
    dl._cuda = True
    dl._stage = _CpuStage(pin=pin, slots=dl.prefetch + 1)
    return dl._stage


@pytest.mark.parametrize("pin", [True, False])
def test_cuda_pipeline_logic_with_cpu_stand_in(ids_path, var_path, pin):
    ref = list(rst.BatchedDataLoader(ids_path, batch_size=16, seed=3))
    dl = rst.BatchedDataLoader(ids_path, batch_size=16, seed=3, prefetch=2)
    stage = _fake_cuda(dl, pin=pin)
    got = list(dl)  # all kept: ring slots are reused, the batches handed out must not change
    assert len(got) == len(ref) and stage.received == len(ref)
    for a, b in zip(got, ref):
        assert torch.equal(a["id"], b["id"]) and torch.equal(a["x"], b["x"])
    assert stage.producer_threads == {"rowstore-h2d"}
    if pin:  # 3 slots x 2 keys allocated once, then reused after waiting for their events
        assert stage.log.count("alloc") == 6 and stage.log.count("sync") == len(ref) - 3
    assert dl.epoch == 1 and dl.position == 0
    # state counts batches handed out, not those prefetched; break stops the thread
    it = iter(dl)
    for _ in range(4):
        next(it)
    assert dl.position == 64
    state = dl.state_dict()
    it.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("rowstore")]
    dl2 = rst.BatchedDataLoader(ids_path, batch_size=16, seed=3)
    _fake_cuda(dl2, pin=pin)
    dl2.load_state_dict(state)
    cpu = rst.BatchedDataLoader(ids_path, batch_size=16, seed=3)
    cpu.set_epoch(1)
    assert state["epoch"] == 1 and _ids(dl2) == _ids(list(cpu)[4:])
    # variable-length fields: values (and jagged offsets) go through the stage, then finish()
    vl = rst.BatchedDataLoader(
        var_path, batch_size=8, shuffle="none", varlen={"wave": "nested", "grid": "list"}
    )
    _fake_cuda(vl, pin=pin)
    b = next(iter(vl))
    assert b["wave"].is_nested and [w.tolist() for w in b["wave"].unbind()] == [
        _var_row(i)["wave"].tolist() for i in range(8)
    ]
    assert (
        isinstance(b["grid"], list)
        and b["grid"][1].shape == (2, 3, 2)
        and b["text"][1] == "row 1 é"
    )
    vl.close()


def test_cuda_pipeline_errors_reach_the_consumer(ids_path):
    def boom(b):
        if b["id"].min() >= 0 and boom.calls == 2:
            raise RuntimeError("boom in transform")
        boom.calls += 1
        return b

    boom.calls = 0
    dl = rst.BatchedDataLoader(ids_path, batch_size=16, transform=boom)
    _fake_cuda(dl)
    with pytest.raises(RuntimeError, match="boom in transform"):
        list(dl)
    assert not [t for t in threading.enumerate() if t.name.startswith("rowstore")]


def test_no_deprecated_aliases_are_left(ids_path):
    assert not hasattr(rst, "DataLoader") and not hasattr(rst, "InMemBatchedDataLoader")
    with pytest.raises(TypeError, match="even"):
        rst.BatchedDataLoader(ids_path, batch_size=4, even=True)
