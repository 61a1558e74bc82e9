"""rowstore.mix: weighted mixtures dealt and resumed like one dataset; weights within
statistical bounds; exhaust-smallest vs with replacement; the mixture manifest; loaders."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import FormatError, SchemaError
from rowstore.reader.plan import EpochPlan

SCHEMA = Schema([Field("id", "int64"), Field("src", "int64"), Field("v", "float32", (None,))])


def _write(path, n, src, rpb=16):
    ids = np.arange(n, dtype=np.int64)
    with rowstore.Writer(path, SCHEMA, rows_per_block=rpb) as w:
        w.write_batch(
            {
                "id": ids,
                "src": np.full(n, src, np.int64),
                "v": [np.full(i % 3, i, np.float32) for i in range(n)],
            }
        )
    return path


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    return [
        _write(str(d / "a.h5"), 300, 0),
        _write(str(d / "b.h5"), 120, 1, rpb=8),
        _write(str(d / "c.h5"), 50, 2),
    ]


def _rows(batches):
    return [(int(s), int(i)) for b in batches for s, i in zip(b["src"], b["id"])]


def test_exhaust_smallest_weights_and_every_row_once(paths):
    m = rowstore.mix({paths[0]: 0.5, paths[1]: 0.3, paths[2]: 0.2}, seed=1, with_source=True)
    # c (50 rows at 0.2) is the scarcest: the epoch is 250 positions, c read whole
    assert m.epoch_rows == 250 and m.counts.tolist() == [125, 75, 50]
    batches = list(m.deal(20, seed=2, with_ids=True, varlen="padded"))
    rows = _rows(batches)
    assert len(rows) == len(set(rows)) == m.epoch_rows
    assert all((b["__source"] == b["src"]).all() and (b["__id"] == b["id"]).all() for b in batches)
    per = np.array([np.bincount(b["src"], minlength=3) for b in batches])
    # per batch, the sources' shares are hypergeometric around the weights: check the mean and a
    # 5-sigma bound on every batch
    assert per.sum(axis=0).tolist() == m.counts.tolist()
    w, n, N = m.counts / m.epoch_rows, 20, m.epoch_rows
    sd = np.sqrt(n * w * (1 - w) * (N - n) / (N - 1))
    assert (np.abs(per[:-1] - n * w) <= 5 * sd + 1).all()  # the full batches
    assert abs(per[:-1, 2].mean() - n * w[2]) < 5 * sd[2] / np.sqrt(len(per) - 1)
    assert batches[0]["v"].shape[0] == 20 and "v__shape" in batches[0]
    for b in batches:  # the right values behind each row (fields of one row together)
        assert all(float(x.max(initial=i)) == i for x, i in zip(b["v"], b["id"]))
    # deterministic; another epoch, another order
    assert _rows(m.deal(20, seed=2)) == rows and _rows(m.deal(20, seed=2, epoch=1)) != rows


def test_replacement_cycles_sources_and_bounds(paths):
    m = rowstore.mix([(paths[0], 1.0), (paths[2], 1.0)], seed=4, replacement=True, epoch_rows=1000)
    rows = _rows(m.deal(50, seed=0))
    src = np.array([s for s, _ in rows])
    assert len(rows) == 1000 and (src == 2).sum() == 500  # exact counts per epoch
    c = [i for s, i in rows if s == 2]
    assert sorted(c) == sorted(list(range(50)) * 10)  # 10 passes over c, each row once per pass
    assert c[:50] != c[50:100]  # each pass in its own order


@pytest.mark.parametrize("policy", ["drop", "pad", "none"])
def test_mixture_resumes_elastically(paths, policy):
    m = rowstore.mix({paths[0]: 2, paths[1]: 1}, seed=3)
    kw = dict(seed=5, window=2, drop_last=policy == "drop", pad=policy == "pad", unit=2)

    def real(b):
        return [
            r for r, p in zip(_rows([b]), b.get("__pad", np.zeros(len(b["id"]), bool))) if not p
        ]

    plan = EpochPlan(m.epoch_rows, 16, drop_last=policy == "drop", pad=policy == "pad")
    first = [r for c in range(3) for b in list(m.deal(16, shard=(c, 3), **kw))[:2] for r in real(b)]
    left = plan.after([2, 2, 2], 2)
    rest = [
        r
        for c in range(2)
        for b in m.deal(16, shard=(c, 2), remaining=left.remaining, **kw)
        for r in real(b)
    ]
    got = first + rest
    assert len(got) == len(set(got))
    if policy != "drop":
        assert len(got) == m.epoch_rows


def test_mixture_file_and_errors(paths, tmp_path):
    m = rowstore.mix({paths[0]: 0.7, paths[1]: 0.3}, seed=9, replacement=True, epoch_rows=200)
    m.save(tmp_path / "mix.json")
    obj = json.loads((tmp_path / "mix.json").read_text())
    assert obj["kind"] == "mixture" and obj["sources"][0]["weight"] == pytest.approx(0.7)
    again = rowstore.mix(tmp_path / "mix.json")
    assert again.epoch_rows == 200 and _rows(again.deal(10)) == _rows(m.deal(10))
    assert again.seed == 9 and again.replacement
    # a manifest is the mixture as saved: settings given beside it are refused, not merged
    with pytest.raises(ValueError, match=r"manifest.*\['seed'\]"):
        rowstore.mix(tmp_path / "mix.json", seed=3)
    (tmp_path / "bad.json").write_text(json.dumps({**obj, "kind": "soup"}))
    with pytest.raises(FormatError, match="mixture"):
        rowstore.mix(tmp_path / "bad.json")
    other = _write(str(tmp_path / "o.h5"), 10, 0)
    with rowstore.Writer(str(tmp_path / "s.h5"), Schema([Field("id", "int64")])) as w:
        w.write({"id": 1})
    with pytest.raises(SchemaError, match="schema"):
        rowstore.mix({other: 1, str(tmp_path / "s.h5"): 1})
    for bad in ({other: -1}, {other: 0}, {}):
        with pytest.raises(ValueError):
            rowstore.mix(bad)
    with pytest.raises(ValueError, match="epoch_rows"):
        rowstore.mix({other: 1}, epoch_rows=5)


def test_loaders_read_a_mixture(paths):
    torch = pytest.importorskip("torch")
    import rowstore.torch as rst

    m = rowstore.mix({paths[0]: 0.5, paths[2]: 0.5}, seed=1, with_source=True)
    first, states = [], []
    for r in range(2):
        dl = rst.BatchedDataLoader(
            m, batch_size=10, shard=(r, 2), drop_last=True, fields=["id", "src"]
        )
        it = iter(dl)
        for _ in range(2):
            b = next(it)
            assert torch.equal(b["__source"] * 2, b["src"])
            first += _rows([b])
        states.append(dl.state_dict())
        it.close()
    assert states[0] == states[1]
    dl = rst.BatchedDataLoader(m, batch_size=10, drop_last=True, fields=["id", "src"])
    dl.load_state_dict(states[0])
    rest = _rows(dl)
    assert len(first + rest) == len(set(first + rest)) == m.epoch_rows


def test_a_list_of_sources_has_equal_weights(paths):
    # the same source twice: two equal-weight sources, each read whole in its own order
    m = rowstore.mix([paths[2], paths[2]], seed=5, with_source=True)
    assert (
        m.weights.tolist() == [0.5, 0.5] and m.counts.tolist() == [50, 50] and m.epoch_rows == 100
    )
    batches = list(m.deal(10, with_ids=True))
    for k in range(2):
        ids = [int(i) for b in batches for i, s in zip(b["id"], b["__source"]) if s == k]
        assert sorted(ids) == list(range(50))
    with rowstore.open(paths[0]) as r:  # open Readers and lists, alike
        m = rowstore.mix([r, paths[1]], seed=1)
        assert m.counts.tolist() == [120, 120]
    assert rowstore.mix([(paths[0], 3), (paths[1], 1)]).weights.tolist() == [0.75, 0.25]
    with pytest.raises(
        ValueError, match=r"entry 0 is a \(source, weight\) pair but entry 1 .* is a bare source"
    ):
        rowstore.mix([(paths[0], 1.0), paths[1]])
    with pytest.raises(TypeError, match="mix\\(\\) takes a dict"):
        rowstore.mix(7)


def test_mix_and_mixture_share_their_defaults(paths):
    # one seed default (0) for mix() and Mixture(), as for every other entry point
    import inspect

    from rowstore.reader.mix import Mixture, mix

    defaults = {}
    for fn in (mix, Mixture):
        sig = inspect.signature(fn)
        defaults[fn] = {
            k: sig.parameters[k].default
            for k in ("seed", "replacement", "epoch_rows", "with_source")
        }
    assert defaults[mix] == defaults[Mixture] and defaults[Mixture]["seed"] == 0
    a = rowstore.mix({paths[0]: 1, paths[1]: 1})
    b = Mixture([rowstore.open(paths[0]), rowstore.open(paths[1])], [1, 1])
    assert a.seed == b.seed == 0 and (a.source_order(0) == b.source_order(0)).all()


def test_a_mixture_refuses_decode_as_every_entry_point_that_cannot_apply_it(paths):
    from rowstore.reader.epochs import EpochSpec, no_decode
    from rowstore.reader.image_ops import Resize

    m = rowstore.mix(paths)
    spec = EpochSpec(decode={"v": Resize(8)})
    with pytest.raises(ValueError) as want:
        no_decode("Mixture.deal", spec)
    for call, where in ((m.deal, "Mixture.deal"), (m.batches, "Mixture.batches")):
        with pytest.raises(ValueError) as got:
            call(10, decode={"v": Resize(8)})
        assert str(got.value) == str(want.value).replace("Mixture.deal", where)
