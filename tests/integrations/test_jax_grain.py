"""rowstore.grain: Grain sources and the dealt epoch as a Grain iterator (exact contents against
the reader, exact resume through Grain's state and checkpoint handlers, on another process
count too), and per-process batches as global jax arrays (docs/jax.md)."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("grain")

import grain  # noqa: E402
import jax  # noqa: E402
from etils import epath  # noqa: E402

import rowstore  # noqa: E402
import rowstore.grain as rg  # noqa: E402
from rowstore import Field, Schema  # noqa: E402
from rowstore.reader.image_ops import RandomResizedCrop  # noqa: E402

N = 203


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("jax") / "x.h5")
    schema = Schema(
        [
            Field("id", "int64"),
            Field("x", "float32", (4,)),
            Field("v", "int16", (None,)),
            Field("t", "str", nullable=True),
        ]
    )
    with rowstore.Writer(p, schema, rows_per_block=8, compression="lz4") as w:
        for i in range(N):
            w.write(
                {
                    "id": i,
                    "x": np.full(4, i, np.float32),
                    "v": np.arange(i % 5, dtype=np.int16),
                    "t": None if i % 7 == 0 else f"row {i}",
                }
            )
    return p


@pytest.fixture(scope="module")
def reader(path):
    with rowstore.open(path) as r:
        yield r


def same_row(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if a[k] is None or isinstance(a[k], str):
            assert a[k] == b[k], k
        else:
            assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype, k
            np.testing.assert_array_equal(a[k], b[k])


def same_batch(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k])


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


# -- sources ---------------------------------------------------------------------------------
def test_reader_source_rows_are_reader_rows(reader):
    src = rg.ReaderSource(reader)
    assert len(src) == N
    for i in (0, 1, 7, 8, N - 1):
        same_row(src[i], reader[i])
    picks = [5, 0, N - 1, 5, 64, 63]
    for row, i in zip(src._getitems(picks), picks):
        same_row(row, reader[i])
    # Grain's batched read reaches the source's _getitems (one take for all the rows).
    from grain._src.python.dataset.base import SupportsBatchedReadRandomAccessDataSource

    assert isinstance(src, SupportsBatchedReadRandomAccessDataSource)
    ds = grain.MapDataset.source(src)
    for row, i in zip(ds._getitems(picks), picks):
        same_row(row, reader[i])
    # And a Grain pipeline of rows (fixed-shape fields) reads each row once.
    rows = grain.MapDataset.source(rg.ReaderSource(reader, fields=["id", "x"]))
    got = list(rows.shuffle(seed=3).batch(16))
    assert sorted(ids(got)) == list(range(N))
    b = got[0]
    np.testing.assert_array_equal(b["x"][:, 0], b["id"].astype(np.float32))


def test_batch_source_items_are_the_dealt_global_batches(reader):
    src = rg.BatchSource(reader, 16, seed=4, window=3, with_ids=True)
    want = list(reader.deal(16, seed=4, window=3, with_ids=True, varlen="padded"))
    assert len(src) == len(want) == -(-N // 16)
    for g, b in enumerate(want):
        same_batch(src[g], b)
    assert [ids([x]) for x in src._getitems([2, 0])] == [ids([want[2]]), ids([want[0]])]
    # Grain shuffles the batches of each epoch; every row once per epoch.
    ds = grain.MapDataset.source(src).shuffle(seed=1).repeat(2)
    got = list(ds)
    assert sorted(ids(got[: len(src)])) == sorted(ids(got[len(src) :])) == list(range(N))
    assert len(rg.BatchSource(reader, 16, drop_last=True)) == N // 16
    with pytest.raises(ValueError, match="EpochDataset"):
        rg.BatchSource(reader, 16, shard=(0, 2))
    with pytest.raises(ValueError, match="does not apply decode"):  # take() reads the bytes
        rg.BatchSource(reader, 16, decode={"id": RandomResizedCrop(8)})
    with pytest.raises(IndexError):
        src[len(src)]


def test_batch_source_in_grain_worker_processes(path):
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's workers read absl flags (absl.app.run parses them)
    src = rg.BatchSource(path, 32, seed=2, shuffle="full", fields=["id"])
    ds = grain.MapDataset.source(src).to_iter_dataset()
    got = list(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    assert sorted(ids(got)) == list(range(N))


# -- the dealt epoch -------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 3])
def test_epoch_dataset_is_reader_deal(reader, world):
    order = dict(seed=5, window=4, pieces=2)
    for rank in range(world):
        ds = rg.EpochDataset(reader, batch_size=8, num_epochs=2, shard=(rank, world), **order)
        got = list(ds)
        want = [
            b
            for e in range(2)
            for b in reader.deal(8, epoch=e, shard=(rank, world), varlen="padded", **order)
        ]
        assert len(got) == len(want) == ds.steps(0) + ds.steps(1)
        for a, b in zip(got, want):
            same_batch(a, b)


def test_epoch_dataset_over_a_mixture(path, tmp_path):
    other = str(tmp_path / "y.h5")
    with rowstore.Writer(other, rowstore.open(path).schema, rows_per_block=8) as w:
        for i in range(40):
            w.write(
                {
                    "id": 1000 + i,
                    "x": np.zeros(4, np.float32),
                    "v": np.zeros(0, np.int16),
                    "t": None,
                }
            )
    m = rowstore.mix({path: 3, other: 1}, seed=0)
    got = list(rg.EpochDataset(m, batch_size=8, seed=2, shard=(1, 2)))
    want = list(m.deal(8, seed=2, shard=(1, 2), varlen="padded"))
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        same_batch(a, b)
    one = lambda: iter(rg.EpochDataset(m, batch_size=8, seed=2, shard=(0, 1)))  # noqa: E731
    whole, it = ids(one()), one()
    head = [next(it) for _ in range(3)]
    it2 = one()
    it2.set_state(it.get_state())
    assert ids(head) + ids(it2) == whole


def test_epoch_dataset_defaults_to_the_jax_process(reader):
    ds = rg.EpochDataset(reader, batch_size=8)
    assert ds.shard == (jax.process_index(), jax.process_count()) == rg.process_shard()
    with pytest.raises(ValueError, match="shard"):
        rg.EpochDataset(reader, batch_size=8, shard=(2, 2))


def run(ds, steps=None, state=None) -> tuple[list[int], dict]:
    it = iter(ds)
    if state is not None:
        it.set_state(json.loads(json.dumps(state)))
    got = []
    for b in it:
        got += ids([b])
        if steps is not None and len(got) >= steps * ds.batch_size:
            break
    return got, it.get_state()


def test_exact_resume_mid_epoch_through_the_grain_state(reader):
    make = lambda: rg.EpochDataset(reader, batch_size=8, seed=1, num_epochs=3)  # noqa: E731
    whole, end = run(make())
    assert end["epoch"] == 3 and end["remaining"] is None
    for steps in (0, 1, 5, 25, 26, 40):  # an epoch has 26 steps here
        head, state = run(make(), steps)
        json.dumps(state)  # plain JSON
        tail, _ = run(make(), state=state)
        assert head + tail == whole, steps
    # Through Grain transformations, which pass their parent's state on.
    ds = make().map(lambda b: {"id": b["id"] * 2})
    it = iter(ds)
    first = [next(it) for _ in range(30)]
    it2 = iter(make().map(lambda b: {"id": b["id"] * 2}))
    it2.set_state(it.get_state())
    rest = ids(first) + ids(it2)
    assert rest == [2 * i for i in whole]


def test_resume_with_grain_thread_prefetch(reader):
    make = lambda: rg.EpochDataset(reader, batch_size=8, seed=2, num_epochs=2)  # noqa: E731
    whole = ids(make())
    it = iter(grain.experimental.ThreadPrefetchIterDataset(make(), prefetch_buffer_size=4))
    head = [next(it) for _ in range(33)]  # the thread has read ahead of what was handed out
    state = it.get_state()
    it.close()
    it2 = iter(grain.experimental.ThreadPrefetchIterDataset(make(), prefetch_buffer_size=4))
    it2.set_state(state)
    assert ids(head) + ids(it2) == whole


def test_resume_on_another_process_count(reader):
    """Two processes take 7 steps each; three processes resume from the state: every row of
    the epoch exactly once across the interruption, and the next epoch whole."""
    order = dict(seed=9, window=2, num_epochs=2)
    before, states = [], []
    for rank in range(2):
        ds = rg.EpochDataset(reader, batch_size=5, shard=(rank, 2), **order)
        got, st = run(ds, 7)
        before += got
        states.append(st)
    assert states[0] == states[1]  # the same state on every process
    after = {0: [], 1: []}
    for rank in range(3):
        it = iter(rg.EpochDataset(reader, batch_size=5, shard=(rank, 3), **order))
        it.set_state(states[rank % 2])
        for b in it:
            after[it.epoch] += ids([b])
    assert sorted(before + after[0]) == list(range(N))
    assert not set(before) & set(after[0])
    assert sorted(after[1]) == list(range(N))


def test_grain_checkpoint_handler_round_trip(reader, tmp_path):
    make = lambda: rg.EpochDataset(reader, batch_size=8, seed=3, num_epochs=2)  # noqa: E731
    whole = ids(make())
    it = iter(make())
    head = [next(it) for _ in range(11)]
    d = epath.Path(tmp_path / "grain")
    d.mkdir()
    grain.checkpoint.CheckpointHandler().save(d, item=it)
    assert os.listdir(d) == ["process_0-of-1.json"]
    it2 = grain.checkpoint.CheckpointHandler().restore(d, item=iter(make()))
    assert ids(head) + ids(it2) == whole
    it3 = rg.CheckpointHandler().restore(d, item=iter(make()))
    assert ids(head) + ids(it3) == whole


def test_orbax_checkpoint_manager(reader, tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    make = lambda: rg.EpochDataset(reader, batch_size=8, seed=6, num_epochs=2)  # noqa: E731
    whole = ids(make())
    it = iter(make())
    head = [next(it) for _ in range(19)]
    pairs = {
        "grain": (grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore),
        "rowstore": (rg.CheckpointSave, rg.CheckpointRestore),
    }
    for name, (save, restore) in pairs.items():
        with ocp.CheckpointManager(tmp_path / name) as mngr:
            mngr.save(19, args=ocp.args.Composite(data=save(it)))
            mngr.wait_until_finished()
        with ocp.CheckpointManager(tmp_path / name) as mngr:
            it2 = iter(make())
            mngr.restore(19, args=ocp.args.Composite(data=restore(it2)))
        assert ids(head) + ids(it2) == whole, name


def test_orbax_restores_on_another_process_count(reader, tmp_path):
    """An Orbax checkpoint whose data item two processes wrote (Grain's file names): restored
    on this one process with rowstore's arguments, every row once across the interruption."""
    ocp = pytest.importorskip("orbax.checkpoint")
    order = dict(seed=7, num_epochs=1)
    it = iter(rg.EpochDataset(reader, batch_size=4, shard=(0, 2), **order))
    it_1 = iter(rg.EpochDataset(reader, batch_size=4, shard=(1, 2), **order))
    before = ids([next(it) for _ in range(6)]) + ids([next(it_1) for _ in range(6)])
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(6, args=ocp.args.Composite(data=rg.CheckpointSave(it)))
        mngr.wait_until_finished()
    data = epath.Path(tmp_path / "ckpt" / "6" / "data")
    (data / "process_0-of-1.json").rename(data / "process_0-of-2.json")
    (data / "process_1-of-2.json").write_text(json.dumps(it_1.get_state(), indent=4))
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        it2 = iter(rg.EpochDataset(reader, batch_size=4, shard=(0, 1), **order))
        mngr.restore(6, args=ocp.args.Composite(data=rg.CheckpointRestore(it2)))
    assert sorted(before + ids(it2)) == list(range(N))


def test_handler_restores_a_checkpoint_of_another_process_count(reader, tmp_path):
    """Files as Grain's handler writes them on 2 processes (``process_{i}-of-2.json``): Grain's
    own handler finds no file for this 1-process run; rowstore's loads the shared state."""
    order = dict(seed=8, num_epochs=1)
    before, d = [], epath.Path(tmp_path / "two")
    d.mkdir()
    for rank in range(2):
        got, st = run(rg.EpochDataset(reader, batch_size=4, shard=(rank, 2), **order), 9)
        before += got
        (d / f"process_{rank}-of-2.json").write_text(json.dumps(st, indent=4))
    one = lambda: iter(rg.EpochDataset(reader, batch_size=4, shard=(0, 1), **order))  # noqa: E731
    with pytest.raises(ValueError, match="does not exist"):
        grain.checkpoint.CheckpointHandler().restore(d, item=one())
    after = ids(rg.CheckpointHandler().restore(d, item=one()))
    assert sorted(before + after) == list(range(N))
    # States that differ (processes at different steps), or that are not rowstore's: refused.
    (d / "process_1-of-2.json").write_text(
        json.dumps(run(rg.EpochDataset(reader, batch_size=4, shard=(1, 2), **order), 3)[1])
    )
    with pytest.raises(ValueError, match="differ"):
        rg.CheckpointHandler().restore(d, item=one())
    for f in d.glob("*.json"):
        f.write_text(json.dumps({"next_index": 3}))
    with pytest.raises(ValueError, match="not rowstore epoch states"):
        rg.CheckpointHandler().restore(d, item=one())
    with pytest.raises(ValueError, match="no Grain iterator state"):
        rg.CheckpointHandler().restore(epath.Path(tmp_path), item=one())


def test_state_of_another_order_is_refused(reader):
    _, state = run(rg.EpochDataset(reader, batch_size=8, seed=1), 3)
    for other in (dict(seed=2), dict(seed=1, window=8), dict(seed=1, drop_last=True)):
        it = iter(rg.EpochDataset(reader, batch_size=8, **other))
        with pytest.raises(ValueError, match="cannot resume"):
            it.set_state(state)
    it = iter(rg.EpochDataset(reader, batch_size=4, seed=1))
    with pytest.raises(ValueError, match="batch_size"):
        it.set_state(state)
    with pytest.raises(ValueError, match="not a rowstore epoch state"):
        it.set_state({"next_index": 3})


# -- JAX ---------------------------------------------------------------------------------------
def test_global_batch_on_one_process(reader):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    ds = rg.EpochDataset(reader, batch_size=10, seed=0, drop_last=True)
    seen = []
    for b in ds:
        g = rg.global_batch(b, mesh, fields=["id", "x", "v", "v__shape"])
        assert g["x"].shape == (10 * jax.process_count(), 4)
        assert isinstance(g["x"], jax.Array) and g["x"].dtype == np.float32
        np.testing.assert_array_equal(np.asarray(g["x"]), b["x"])
        np.testing.assert_array_equal(np.asarray(g["v"]), b["v"])
        seen += np.asarray(g["id"]).tolist()
    assert len(seen) == len(set(seen)) == N // 10 * 10
    with pytest.raises(TypeError, match="'t'"):
        rg.global_batch(b, mesh)
    ragged = next(iter(rg.EpochDataset(reader, batch_size=10, varlen="ragged")))
    with pytest.raises(TypeError, match="'v' is Ragged"):
        rg.global_batch(ragged, mesh, fields=["v"])


def test_global_batch_on_two_devices(rs, path):
    """Two CPU devices (XLA_FLAGS): the global batch is split between them along rows."""
    code = textwrap.dedent(f"""
        import jax, numpy as np
        import rowstore.grain as rg
        assert len(jax.devices()) == 2, jax.devices()
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
        ds = rg.EpochDataset({path!r}, batch_size=8, seed=0, drop_last=True, fields=["id", "x"])
        n = 0
        for b in ds:
            g = rg.global_batch(b, mesh)
            shards = sorted(g["x"].addressable_shards, key=lambda s: s.index[0].start)
            assert [s.data.shape for s in shards] == [(4, 4), (4, 4)]
            np.testing.assert_array_equal(np.concatenate([s.data for s in shards]), b["x"])
            assert float(jax.jit(lambda x: x.sum())(g["x"])) == float(b["x"].sum())
            n += 1
        print("batches", n)
    """)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = rs.run_python(code, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"batches {N // 8}" in out.stdout
