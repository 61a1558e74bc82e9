"""Every read entry point takes the order arguments with one meaning (docs/order.md).

The same ``shuffle`` (True/False or a mode), ``seed``, ``epoch``, ``window``, ``pieces`` and
``shard``/``part`` go to each entry point; each must deliver the rows of the reference call:

- a dealt ``shard=(rank, world)``: the batches of ``Reader.deal`` in the same order (torch's
  BatchedDataLoader, IterableDataset, ResumableDataLoader, the map-style Dataset with
  ElasticBatchSampler, BatchedDataLoader's ``cache="memory"``, ``rowstore.petastorm.DataLoader``,
  ``rowstore.tf.Loader``);
- a contiguous ``part=(index, count)``: the batches of ``Reader.batches`` in the same order
  (``rowstore.tf.make_dataset``, ``make_batch_reader``, ``make_reader``);

and a :class:`~rowstore.reader.mix.Mixture` reads with the same calls as a Reader.
"""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.reader import Reader
from rowstore.reader.epochs import EpochSpec

torch = pytest.importorskip("torch")
import rowstore.petastorm  # noqa: E402
import rowstore.torch as rst  # noqa: E402

N = 203  # 13 blocks of 16 rows, the last short
B = 8

ORDERS = [
    dict(shuffle=True, seed=3, epoch=0, window=3, pieces=1),
    dict(shuffle=False, seed=0, epoch=2, window=16, pieces=1),
    dict(shuffle="full", seed=5, epoch=1, window=2, pieces=1),
    dict(shuffle="block", seed=1, epoch=2, window=3, pieces=4),
]
SPLITS = [(0, 1), (1, 3)]
CASES = [
    pytest.param(o, s, id=f"{o['shuffle']}-e{o['epoch']}-p{o['pieces']}-{s[0]}of{s[1]}")
    for o in ORDERS
    for s in SPLITS
]


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("entry") / "ids.h5")
    ids = np.arange(N, dtype=np.int64)
    schema = Schema([Field("id", "int64"), Field("x", "float32", (2,))])
    with rowstore.Writer(p, schema, rows_per_block=16) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] + 0.5, 2, axis=1).astype(np.float32)})
    return p


def _ids(batches) -> list[list[int]]:
    return [np.asarray(b["id"]).tolist() for b in batches]


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


# -- the dealt shard ------------------------------------------------------------------------------
def _dealt_entry_points(source, shard, order, map_style=True):
    """Batches of ids of every entry point reading the dealt ``shard``, by name (the map-style
    Dataset reads by row number: not a mixture)."""
    out = {}
    dl = rst.BatchedDataLoader(source, batch_size=B, shard=shard, **_no_epoch(order))
    dl.set_epoch(order["epoch"])
    out["BatchedDataLoader"] = _ids(dl)
    if map_style:  # a Reader's rows (a mixture is no Reader)
        dl = rst.BatchedDataLoader(
            source, batch_size=B, shard=shard, cache="memory", **_no_epoch(order)
        )
        dl.set_epoch(order["epoch"])
        out["BatchedDataLoader(cache='memory')"] = _ids(dl)
    ds = rst.IterableDataset(source, batch_size=B, shard=shard, **_no_epoch(order))
    ds.set_epoch(order["epoch"])
    out["IterableDataset"] = _ids(ds)
    ds = rst.IterableDataset(source, batch_size=B, shard=shard, **_no_epoch(order))
    rl = rst.ResumableDataLoader(ds, batch_size=None)
    rl.set_epoch(order["epoch"])
    out["ResumableDataLoader"] = _ids(rl)
    pl = rowstore.petastorm.DataLoader(source, batch_size=B, shard=shard, **_no_epoch(order))
    pl.set_epoch(order["epoch"])
    out["petastorm.DataLoader"] = _ids(pl)
    if map_style:
        mds = rst.Dataset(source)
        sampler = rst.ElasticBatchSampler(mds, batch_size=B, shard=shard, **_no_epoch(order))
        sampler.set_epoch(order["epoch"])
        loader = torch.utils.data.DataLoader(mds, batch_sampler=sampler, collate_fn=rst.collate)
        out["ElasticBatchSampler"] = _ids(loader)
    return out


def _no_epoch(order: dict) -> dict:
    """The loaders take the epoch from ``set_epoch``."""
    return {k: v for k, v in order.items() if k != "epoch"}


@pytest.mark.parametrize("order, shard", CASES)
def test_dealt_shard_is_the_same_everywhere(path, order, shard):
    with Reader(path) as r:
        want = _ids(r.deal(B, shard=shard, fields=["id"], **order))
        spec = EpochSpec(shard=shard, **order)
        assert _ids(r.deal(B, spec=spec, fields=["id"])) == want
    assert want and all(len(b) == B for b in want[:-1])
    for name, got in _dealt_entry_points(path, shard, order).items():
        assert got == want, name


@pytest.mark.parametrize("order, shard", CASES)
def test_dealt_shards_hold_every_row_once(path, order, shard):
    with Reader(path) as r:
        world = shard[1]
        rows = [
            i
            for c in range(world)
            for i in _flat(_ids(r.deal(B, shard=(c, world), fields=["id"], **order)))
        ]
    assert sorted(rows) == list(range(N))


# -- the contiguous part --------------------------------------------------------------------------
@pytest.mark.parametrize("order, part", CASES)
def test_contiguous_part_is_the_same_everywhere(path, order, part):
    with Reader(path) as r:
        want = _ids(r.batches(B, part=part, fields=["id"], **order))
        assert _flat(want) == r.epoch_order(part=part, **order).tolist()
        world = part[1]
        every = [i for c in range(world) for i in r.epoch_order(part=(c, world), **order).tolist()]
        assert sorted(every) == list(range(N))
    petastorm = dict(
        shuffle=order["shuffle"],
        seed=order["seed"],
        window=order["window"],
        pieces=order["pieces"],
        cur_shard=part[0],
        shard_count=part[1],
    )
    with rowstore.make_batch_reader(path, batch_size=B, schema_fields=["id"], **petastorm) as br:
        assert _ids(br.iter_batches(order["epoch"])) == want
    if order["epoch"] == 0:
        with rowstore.make_reader(path, batch_size=B, schema_fields=["id"], **petastorm) as rr:
            assert [int(row.id) for row in rr] == _flat(want)


# -- tf -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rtf():
    return pytest.importorskip("rowstore.tf")


def _tf_ids(ds) -> list[list[int]]:
    return [el["id"].numpy().tolist() for el in ds]


@pytest.mark.parametrize("order, split", CASES[::3])
def test_tf_reads_as_the_reader(path, rtf, order, split):
    with Reader(path) as r:
        dealt = _ids(r.deal(B, shard=split, fields=["id"], **order))
        part = _ids(r.batches(B, part=split, fields=["id"], **order))
    assert _tf_ids(rtf.make_dataset(path, batch_size=B, part=split, fields=["id"], **order)) == part
    loader = rtf.Loader(path, batch_size=B, shard=split, fields=["id"], **_no_epoch(order))
    loader.set_epoch(order["epoch"])
    assert _tf_ids(loader.dataset()) == dealt


@pytest.mark.parametrize("order, split", CASES[1::3])
def test_tf_reads_a_mixture_as_the_mixture(mixture, rtf, order, split):
    part = _ids(mixture.batches(B, part=split, fields=["id"], **order))
    assert (
        _tf_ids(rtf.make_dataset(mixture, batch_size=B, part=split, fields=["id"], **order)) == part
    )
    loader = rtf.Loader(mixture, batch_size=B, shard=split, fields=["id"], **_no_epoch(order))
    loader.set_epoch(order["epoch"])
    assert _tf_ids(loader.dataset()) == _ids(mixture.deal(B, shard=split, fields=["id"], **order))


# -- a mixture reads with the same calls ---------------------------------------------------------
@pytest.fixture(scope="module")
def mixture(path):
    with rowstore.mix({path: 0.5, (path,): 0.5}, seed=7, with_source=True) as m:
        yield m


@pytest.mark.parametrize("order, split", CASES)
def test_a_mixture_reads_with_the_reader_calls(path, mixture, order, split):
    m = mixture
    part = list(m.batches(B, part=split, fields=["id"], **order))
    pos = m.epoch_order(part=split, **order)
    assert [(int(s), int(i)) for b in part for s, i in zip(b["__source"], b["id"])] == [
        tuple(p) for p in pos
    ]
    assert all(len(b["id"]) == B for b in part[:-1])
    world = split[1]
    whole = m.epoch_order(**order)
    dealt = [list(m.deal(B, shard=(c, world), fields=["id"], **order)) for c in range(world)]
    got = sorted((int(s), int(i)) for d in dealt for b in d for s, i in zip(b["__source"], b["id"]))
    assert got == sorted(map(tuple, whole.tolist()))
    want = _ids(dealt[split[0]])
    for name, got_ids in _dealt_entry_points(m, split, order, map_style=False).items():
        assert got_ids == want, name


# -- one check of the arguments, old spellings warned ---------------------------------------------
def test_shard_half_is_refused_everywhere(path):
    with Reader(path) as r:
        calls = {
            "Reader.deal": lambda: r.deal(B, shard=(0.5, 2)),
            "Reader.batches": lambda: r.batches(B, part=(0.5, 2)),
            "EpochSpec": lambda: EpochSpec(shard=(0.5, 2)),
            "BatchedDataLoader": lambda: rst.BatchedDataLoader(path, batch_size=B, shard=(0.5, 2)),
            "IterableDataset": lambda: rst.IterableDataset(path, batch_size=B, shard=(0.5, 2)),
            "ElasticBatchSampler": lambda: rst.ElasticBatchSampler(
                rst.Dataset(path), batch_size=B, shard=(0.5, 2)
            ),
            "make_reader": lambda: rowstore.make_reader(path, cur_shard=0.5, shard_count=2),
        }
        for call in calls.values():
            with pytest.raises(ValueError, match="shard|part"):
                call()
        with pytest.raises(ValueError, match="shard"):  # a bool is not a rank either
            r.deal(B, shard=(True, 2))


def test_shard_half_is_refused_by_tf(path, rtf):
    with pytest.raises(ValueError, match="shard"):
        rtf.Loader(path, batch_size=B, shard=(0.5, 2))
    with pytest.raises(ValueError, match="part"):
        rtf.make_dataset(path, batch_size=B, part=(0.5, 2))


def test_old_spellings(path, rtf):
    # shard= of shard_size, num_batches and epoch_order (a contiguous part there) is gone
    with Reader(path) as r:
        kw = dict(seed=2, window=3, fields=["id"])
        with pytest.raises(TypeError, match="shard"):
            r.shard_size(shard=(1, 3))
        with pytest.raises(TypeError, match="shard"):
            r.num_batches(B, shard=(1, 3))
        with pytest.raises(TypeError, match="shard"):
            r.epoch_order(shard=(1, 3))
    # batches(shard=) (a contiguous slice once) and deal(consumer=) are gone, for a reader and
    # a mixture alike (one batches and one deal serve both): shard= is the dealt part
    with Reader(path) as r, rowstore.mix([path, path]) as m:
        for source in (r, m):
            with pytest.raises(ValueError, match=r"part=\(index, count\).*deal\(\)"):
                next(iter(source.batches(B, shard=(1, 3), **kw)))
            with pytest.raises(TypeError, match="consumer"):
                next(iter(source.deal(B, consumer=(1, 3), **kw)))
    # the adapters' old spellings are gone (even=, shard= for a contiguous part)
    with pytest.raises(TypeError, match="even"):
        rst.BatchedDataLoader(path, batch_size=B, shard=(1, 3), even=True, seed=2)
    with pytest.raises(TypeError, match="even"):
        rst.IterableDataset(path, batch_size=B, even=True)
    with pytest.raises(TypeError, match="even"):
        rst.ElasticBatchSampler(rst.Dataset(path), batch_size=B, even=True)
    with pytest.raises(ValueError, match="deal"):
        rtf.make_dataset(path, batch_size=B, shard=(1, 3), **kw)


def test_a_spec_and_its_keywords_are_one_thing(path):
    spec = EpochSpec(shuffle=True, seed=4, window=3)
    assert spec.shuffle == "block" and EpochSpec(shuffle=False).shuffle == "none"
    with pytest.raises(ValueError, match="equal-steps"):
        EpochSpec(drop_last=True, pad=True)
    with pytest.raises(TypeError, match="windw"):
        EpochSpec.make(windw=3)
    with Reader(path) as r:
        assert _ids(r.batches(B, spec=spec, epoch=1)) == _ids(
            r.batches(B, shuffle=True, seed=4, window=3, epoch=1)
        )
        with pytest.raises(ValueError, match="deal"):
            r.batches(B, spec=spec.replace(shard=(0, 2)))
