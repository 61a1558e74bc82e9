"""Everything that reads files reads datasets: the torch datasets and loaders (real DataLoader
workers), tf.data, rowstore-bench and the CLI, over a dataset directory of shards of different
rows per block (so row ids and row numbers differ) and over a list of shard files.

Datasets are built as tests/reader/test_dataset_read.py builds them (shard files, then
``manifest.publish``), so these tests need no dataset writer.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import rowstore
from rowstore.format import manifest as M
from rowstore.format.index import Layout

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import rowstore.torch as rst  # noqa: E402

#: (rows, rows_per_block) of each shard: partial blocks mid-dataset, a shard of one row.
SHARDS = [(23, 7), (16, 4), (1, 3), (30, 5)]
N = sum(n for n, _ in SHARDS)
SCHEMA = rowstore.Schema(
    [
        rowstore.Field("id", "int64"),
        rowstore.Field("x", "float32", (3,)),
        rowstore.Field("name", rowstore.STR),
    ]
)


def build_dataset(root: str, shards=SHARDS) -> list[str]:
    """A dataset directory at ``root`` (shard files + a published manifest); row ``i`` has
    ``id == i``. Returns the shard files."""
    os.makedirs(os.path.join(root, M.SHARD_DIR))
    entries, blocks, chunks, paths, pos = [], [], [], [], 0
    for k, (n, rpb) in enumerate(shards):
        rel = f"{M.SHARD_DIR}/s{k:03d}.h5"
        path = os.path.join(root, rel)
        ids = np.arange(pos, pos + n)
        with rowstore.Writer(path, SCHEMA, rows_per_block=rpb) as w:
            w.write_batch(
                {
                    "id": ids,
                    "x": np.repeat(ids[:, None], 3, 1).astype(np.float32),
                    "name": [f"row-{i}" for i in ids],
                }
            )
        pos += n
        L = Layout.open(path)
        entries.append(M.shard_entry(rel, L))
        blocks.append(L.blocks)
        chunks.append(L.heap_chunks)
        paths.append(path)
    with M.commit_lock(root):
        M.publish(
            root,
            schema=SCHEMA,
            attrs={},
            compression=L.compression,
            heap_chunk_bytes=L.heap_chunk_bytes,
            shards=entries,
            blocks=blocks,
            heap_chunks=chunks,
        )
    return paths


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> tuple[str, list[str]]:
    root = str(tmp_path_factory.mktemp("adapters") / "ds")
    return root, build_dataset(root)


@pytest.fixture(params=["dir", "list"])
def source(request, ds):
    root, files = ds
    return root if request.param == "dir" else files


def ids_of(batches) -> np.ndarray:
    return (
        np.concatenate([np.asarray(b["id"]).reshape(-1) for b in batches])
        if batches
        else np.zeros(0, np.int64)
    )


def test_layout_is_not_uniform(ds):
    with rowstore.open(ds[0]) as r:
        assert r.layout.num_shards == 4 and not r.layout.uniform  # row ids != row numbers


# -- torch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, ctx", [("dir", "fork"), ("list", "fork"), ("dir", "spawn")]
)  # spawn: ~6 s
def test_iterable_dataset_workers_read_every_row_once(ds, kind, ctx):
    source = ds[0] if kind == "dir" else ds[1]
    it = rst.IterableDataset(source, batch_size=6, shuffle="block", seed=1, window=2)
    dl = DataLoader(it, batch_size=None, num_workers=2, multiprocessing_context=ctx)
    batches = list(dl)
    got = ids_of(batches)
    assert sorted(got.tolist()) == list(range(N)) and got.tolist() != list(range(N))  # shuffled
    assert len(batches) == it.num_items(num_workers=2)


def test_map_dataset_with_workers_reads_every_row_once(source):
    d = rst.Dataset(source)
    g = torch.Generator().manual_seed(0)
    dl = DataLoader(
        d, batch_size=8, shuffle=True, num_workers=2, collate_fn=rst.collate, generator=g
    )
    batches = list(dl)
    assert sorted(ids_of(batches).tolist()) == list(range(N))
    for b in batches:  # the right row behind each id: fields of one row stay together
        assert torch.equal(b["x"][:, 0].long(), b["id"])


@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
@pytest.mark.parametrize("even", [False, True])
def test_ddp_shards_are_disjoint_and_complete(source, shuffle, even):
    world = 3
    parts = []
    for rank in range(world):
        kw = dict(batch_size=5, shuffle=shuffle, seed=2, window=2, shard=(rank, world))
        with rst.BatchedDataLoader(source, drop_last=even, **kw) as dl:
            parts.append(ids_of(list(dl)))
            assert len(parts[-1]) == dl.shard_size
        it = rst.IterableDataset(source, drop_last=even, **kw)
        assert ids_of(list(DataLoader(it, batch_size=None))).tolist() == parts[-1].tolist()
    allids = np.concatenate(parts)
    assert len(set(allids.tolist())) == len(allids)  # disjoint
    if even:  # equal steps of whole batches on every rank (the epoch is dealt in batches)
        assert len({len(p) for p in parts}) == 1 and N - len(allids) < 5 * world
    else:
        assert sorted(allids.tolist()) == list(range(N))  # complete


@pytest.mark.parametrize("shuffle", ["block", "full"])
def test_batched_loader_resumes_mid_epoch(source, shuffle):
    with rst.BatchedDataLoader(source, batch_size=4, shuffle=shuffle, seed=5, window=2) as dl:
        dl.set_epoch(1)
        full = ids_of(list(dl))
        dl.set_epoch(1)
        it = iter(dl)
        head = [next(it) for _ in range(3)]
        state = json.loads(json.dumps(dl.state_dict()))
        it.close()
    assert state["remaining"][0][0] == 3 and state["dataset_version"] == (
        1 if isinstance(source, str) else None
    )
    with rst.BatchedDataLoader(source, batch_size=4, shuffle=shuffle, seed=5, window=2) as dl2:
        dl2.load_state_dict(state)
        rest = ids_of(list(dl2))
    assert np.concatenate([ids_of(head), rest]).tolist() == full.tolist()
    with rowstore.open(source) as r:  # the loader's order is the reader's, in row numbers
        assert full.tolist() == r.epoch_order(shuffle=shuffle, seed=5, epoch=1, window=2).tolist()


def test_memory_cache_reads_its_shard_and_resumes(source):
    parts = []
    for rank in range(2):
        kw = dict(batch_size=8, seed=3, shard=(rank, 2))
        dl = rst.BatchedDataLoader(source, cache="memory", **kw)
        parts.append(ids_of(list(dl)))
        assert parts[-1].tolist() == ids_of(list(rst.BatchedDataLoader(source, **kw))).tolist()
    assert sorted(np.concatenate(parts).tolist()) == list(range(N))
    dl = rst.BatchedDataLoader(source, batch_size=8, seed=3, cache="memory")
    full = ids_of(list(dl))
    dl = rst.BatchedDataLoader(source, batch_size=8, seed=3, cache="memory")
    it = iter(dl)
    head = [next(it), next(it)]
    state = dl.state_dict()
    it.close()
    dl2 = rst.BatchedDataLoader(source, batch_size=8, seed=3, cache="memory")
    dl2.load_state_dict(state)
    assert np.concatenate([ids_of(head), ids_of(list(dl2))]).tolist() == full.tolist()


def test_state_of_another_dataset_version_is_refused(ds, tmp_path):
    root = str(tmp_path / "v")
    files = build_dataset(root)
    with rst.BatchedDataLoader(root, batch_size=4) as dl:
        state = dl.state_dict()
    with rst.BatchedDataLoader(files, batch_size=4) as dl:  # same rows, no manifest version
        with pytest.raises(ValueError, match="dataset_version"):
            dl.load_state_dict(state)


# -- tf ------------------------------------------------------------------------------------------
def test_tf_reads_every_row_once(source):
    rtf = pytest.importorskip("rowstore.tf")
    tf = pytest.importorskip("tensorflow")
    ds = rtf.make_dataset(
        source, batch_size=6, shuffle="block", seed=1, window=2, num_parallel_reads=2
    )
    assert int(ds.cardinality()) == sum(-(-n // 6) for n in (N // 2, N - N // 2))
    got = np.concatenate([b["id"].numpy() for b in ds])
    assert sorted(got.tolist()) == list(range(N))
    parts = []
    fn = rtf.distribute_dataset_fn(source, global_batch_size=8, even=False)
    for i in range(2):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2
        )
        parts.append(np.concatenate([b["id"].numpy() for b in fn(ctx)]))
    allids = np.concatenate(parts)
    assert len(set(allids.tolist())) == N == len(allids)


# -- rowstore-bench and the CLI -------------------------------------------------------------------
def test_bench_runs_on_a_dataset_directory(ds, tmp_path, capsys):
    from rowstore.bench import cli as bench_cli

    out = str(tmp_path / "b.json")
    argv = [
        ds[0],
        "-m",
        "1",
        "-n",
        "2",
        "-b",
        "8",
        "--repeats",
        "1",
        "--time-limit",
        "1",
        "--compare",
        "--baselines",
        "h5py-fancy",
        "--memcpy-mib",
        "1",
        "--json",
        out,
        "--quiet",
    ]
    assert bench_cli.main(argv) == 0
    text = capsys.readouterr().out
    with open(out) as fh:
        doc = json.load(fh)
    assert (
        doc["dataset"]["shards"] == 4
        and doc["dataset"]["rows"] == N
        and doc["dataset"]["version"] == 1
    )
    (r,) = doc["results"]
    assert not r.get("error") and r["rows_per_s"] > 0 and 0 <= r["shuffle_quality"] <= 1
    assert doc["baselines"] == [] and any("baselines skipped" in n for n in doc["notes"])
    assert "in 4 shards" in text


def test_bench_torch_mode_shuffle_quality_counts_real_blocks(ds):
    from rowstore.bench import sources

    B = 8
    opts = {
        "kind": "rowstore",
        "path": ds[0],
        "fields": None,
        "batch_size": B,
        "shuffle": "block",
        "window": 2,
        "seed": 0,
        "mode": "torch",
        "threads": 1,
        "workers": 0,
        "verify": True,
    }
    src = sources.open_source(opts)
    try:
        assert sorted(ids_of(list(src.epoch(0))).tolist()) == list(range(N))
        # The DataLoader's uniform order, its rows' blocks found from the blocks' row counts.
        with rowstore.open(ds[0]) as r:
            counts = r.layout.block_rows()
        order = sources.uniform_order(N, 0, 0)[: N // B * B]
        blk = np.searchsorted(np.cumsum(counts), order, side="right").reshape(-1, B)
        distinct = np.mean([len(set(b)) for b in blk.tolist()])
        nb = len(counts)
        assert src.shuffle_quality() == pytest.approx(
            min(1.0, distinct / (nb * (1 - (1 - 1 / nb) ** B)))
        )
    finally:
        src.close()


def test_cli_info_head_verify_on_a_dataset(tmp_path, capsys):
    from rowstore.cli import main

    root = str(tmp_path / "ds")
    files = build_dataset(root)
    assert main(["info", root]) == 0
    text = capsys.readouterr().out
    assert "version 1, 4 shard files" in text and f"rows            {N}" in text
    assert main(["head", root, "-n", "3"]) == 0
    text = capsys.readouterr().out
    assert "'row-2'" in text and f"(3 of {N} rows)" in text
    assert main(["verify", root]) == 0
    capsys.readouterr()
    L = Layout.open(files[1])
    off = int(L.blocks["offset"][1]) + 3
    with open(files[1], "r+b") as fh:  # one flipped byte in shard 1's second block
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0x40]))
    assert main(["verify", root]) == 1
    cap = capsys.readouterr()
    assert "s001.h5" in cap.out + cap.err
