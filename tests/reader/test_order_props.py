"""Property tests of the dealt epoch (rowstore.reader.plan): over random dataset sizes, block
sizes, batch sizes, worlds, DataLoader workers, units, resume points and resume worlds, with
drop_last, pad or neither: every row exactly once across interruptions, equal steps on every
consumer under drop_last/pad, and the same answer every time (determinism). Computed without
reading (as ``rowstore check-order`` does); one test checks a real Reader delivers the same."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rowstore
from rowstore import Field, Schema
from rowstore.reader.order import EpochOrder
from rowstore.reader.plan import EpochPlan, rank_steps_taken, step_rows

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def layouts(draw):
    nblocks = draw(st.integers(0, 12))
    rpb = draw(st.integers(1, 9))
    rows = [
        draw(st.integers(0, rpb)) if i == nblocks - 1 or draw(st.booleans()) is False else rpb
        for i in range(nblocks)
    ]  # full blocks, some shards' last blocks short or empty
    return np.array(rows, np.int64), rpb


policies = st.sampled_from(["drop", "pad", "none"])
shuffles = st.sampled_from(["block", "full", "none"])


def _plan(n, bs, policy, remaining=None):
    return EpochPlan(n, bs, drop_last=policy == "drop", pad=policy == "pad", remaining=remaining)


def _deliver(eo, plan, world, unit, taken=None):
    """Rows each consumer delivers (real rows, pad rows dropped), step counts and pad counts."""
    out, steps = [], []
    for c in range(world):
        n = 0
        for k, (ids, mask) in enumerate(step_rows(eo, plan, c, world, unit)):
            if taken is not None and k >= taken[c]:
                break
            assert len(ids) == plan.batch_size or (
                not (plan.drop_last or plan.pad) and len(ids) <= plan.batch_size
            )
            out.extend(ids[~mask].tolist())
            n += 1
        steps.append(n)
    return out, steps


def _valid(block_rows, rpb, keep=None):
    ids = [b * rpb + i for b, n in enumerate(block_rows) for i in range(n)]
    if keep is not None:
        ids = [x for x, k in zip(ids, keep) if k]
    return ids


@SETTINGS
@given(
    layout=layouts(),
    bs=st.integers(1, 12),
    world=st.integers(1, 6),
    unit=st.integers(1, 4),
    policy=policies,
    shuffle=shuffles,
    seed=st.integers(0, 2**32),
    window=st.integers(1, 4),
)
def test_one_epoch_exactly_once_and_equal_steps(
    layout, bs, world, unit, policy, shuffle, seed, window
):
    br, rpb = layout
    eo = EpochOrder(br, rpb, shuffle=shuffle, seed=seed, epoch=1, window=window)
    plan = _plan(eo.num_rows, bs, policy)
    rows, steps = _deliver(eo, plan, world, unit)
    valid = _valid(br, rpb)
    assert len(rows) == len(set(rows)) and set(rows) <= set(valid)
    assert steps == plan.steps(world, unit).tolist()
    if policy == "drop":
        assert len(set(steps)) == 1
        # at most the partial batch and world - 1 batches are left out
        assert len(valid) - len(rows) < bs * world
    else:
        assert sorted(rows) == sorted(valid)
        if policy == "pad":
            assert len(set(steps)) == 1
        else:
            assert max(steps) - min(steps) <= 1
    # determinism: the same arguments give the same delivery
    assert _deliver(eo, _plan(eo.num_rows, bs, policy), world, unit) == (rows, steps)


@SETTINGS
@given(
    layout=layouts(),
    bs=st.integers(1, 12),
    world=st.integers(1, 5),
    workers=st.integers(1, 4),
    unit=st.integers(1, 4),
    policy=policies,
    shuffle=shuffles,
    seed=st.integers(0, 2**32),
    at=st.floats(0, 1),
    world2=st.integers(1, 7),
    workers2=st.integers(1, 3),
    unit2=st.integers(1, 5),
    at2=st.floats(0, 1),
    world3=st.integers(1, 4),
)
def test_elastic_resume_exactly_once(
    layout,
    bs,
    world,
    workers,
    unit,
    policy,
    shuffle,
    seed,
    at,
    world2,
    workers2,
    unit2,
    at2,
    world3,
):
    """Every rank hands out the same number of batches (steps); the job stops, resumes on
    another world with other workers and unit, stops again, and finishes on a third world."""
    br, rpb = layout
    eo = EpochOrder(br, rpb, shuffle=shuffle, seed=seed, epoch=0, window=2)
    delivered: list[int] = []
    plan = _plan(eo.num_rows, bs, policy)
    for w, nw, u, frac in (
        (world, workers, unit, at),
        (world2, workers2, unit2, at2),
        (world3, 1, 1, 1.0),
    ):
        C = w * nw
        rank_steps = plan.steps(C, u).reshape(w, nw).sum(axis=1)
        n = int(rank_steps.min() * frac) if frac < 1 else int(rank_steps.max())
        taken = rank_steps_taken(plan, n, w, nw, u)
        # the state every rank computes from its own step count is the same
        rows, _ = _deliver(eo, plan, C, u, taken)
        delivered += rows
        state = plan.after(taken, u)
        if state is None:
            break
        plan = _plan(eo.num_rows, bs, policy, remaining=state.remaining)
    valid = _valid(br, rpb)
    assert len(delivered) == len(set(delivered))
    if policy == "drop":
        assert set(delivered) <= set(valid)
    else:
        assert sorted(delivered) == sorted(valid)


@SETTINGS
@given(
    layout=layouts(),
    bs=st.integers(1, 8),
    world=st.integers(1, 4),
    policy=policies,
    shuffle=shuffles,
    data=st.data(),
)
def test_row_subsets_keep_the_guarantees(layout, bs, world, policy, shuffle, data):
    br, rpb = layout
    n = int(br.sum())
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    eo = EpochOrder(br, rpb, shuffle=shuffle, seed=3, window=2, keep=keep)
    plan = _plan(eo.num_rows, bs, policy)
    rows, steps = _deliver(eo, plan, world, 2)
    valid = _valid(br, rpb, keep)
    assert eo.num_rows == len(valid) and len(rows) == len(set(rows)) and set(rows) <= set(valid)
    if policy != "drop":
        assert sorted(rows) == sorted(valid)
    if policy != "none":
        assert len(set(steps)) == 1
    # a subset's order is the full order without the other rows
    full = EpochOrder(br, rpb, shuffle=shuffle, seed=3, window=2).ids()
    assert eo.ids().tolist() == [x for x in full.tolist() if x in set(valid)]


def test_rank_steps_follow_dataloader_turns():
    plan = EpochPlan(23, 2)  # 12 batches, 4 consumers (2 ranks x 2 workers): 3 each
    assert rank_steps_taken(plan, 3, 2, 2, 1).tolist() == [2, 1, 2, 1]
    plan = EpochPlan(21, 2)  # 11 batches: steps 3, 3, 3, 2
    assert plan.steps(4).tolist() == [3, 3, 3, 2]
    assert rank_steps_taken(plan, 6, 2, 2, 1).tolist() == [3, 3, 3, 2]


def test_bad_plans():
    with pytest.raises(ValueError, match="choose one"):
        EpochPlan(10, 2, drop_last=True, pad=True)
    for bad in ([[3, 2]], [[0, 6]], [[2, 4], [3, 5]], [["a", 1]]):
        with pytest.raises(ValueError, match="remaining"):
            EpochPlan(10, 2, remaining=bad)
    with pytest.raises(ValueError, match="steps taken"):
        EpochPlan(10, 2).after([9, 0])


@pytest.fixture(scope="module")
def ids_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("props") / "ids.h5")
    ids = np.arange(203, dtype=np.int64)
    with rowstore.Writer(
        path, Schema([Field("id", "int64"), Field("x", "float32", (2,))]), rows_per_block=16
    ) as w:
        w.write_batch({"id": ids, "x": np.repeat(ids[:, None] + 0.5, 2, axis=1).astype(np.float32)})
    return path


@pytest.mark.parametrize("shuffle", ["block", "full", "none"])
@pytest.mark.parametrize("policy", ["drop", "pad", "none"])
def test_reader_deal_reads_what_the_plan_says(ids_path, shuffle, policy):
    r = rowstore.open(ids_path)
    kw = dict(shuffle=shuffle, seed=4, epoch=1, window=3)
    eo = r.epoch(**kw)
    plan = _plan(r.num_rows, 10, policy)
    for c in range(3):
        want = list(step_rows(eo, plan, c, 3, 2))
        got = list(
            r.deal(
                10,
                shard=(c, 3),
                unit=2,
                drop_last=policy == "drop",
                pad=policy == "pad",
                with_ids=True,
                **kw,
            )
        )
        assert len(got) == len(want)
        for b, (ids, mask) in zip(got, want):
            assert b["id"].tolist() == ids.tolist() == b["__id"].tolist()
            assert np.allclose(b["x"][:, 0], b["id"] + 0.5)
            if policy == "pad":
                assert b["__pad"].tolist() == mask.tolist()
            else:
                assert "__pad" not in b


@pytest.fixture(scope="module")
def mix_sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixprops")
    out = []
    for k, (n, rpb) in enumerate([(97, 8), (40, 5), (23, 16)]):
        p = str(d / f"s{k}.h5")
        with rowstore.Writer(
            p, Schema([Field("id", "int64"), Field("src", "int64")]), rows_per_block=rpb
        ) as w:
            w.write_batch({"id": np.arange(n), "src": np.full(n, k)})
        out.append(p)
    return out


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    weights=st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(lambda w: sum(w) > 0),
    seed=st.integers(0, 1000),
    replacement=st.booleans(),
    bs=st.integers(1, 9),
    world=st.integers(1, 4),
    world2=st.integers(1, 4),
    policy=policies,
    at=st.floats(0, 1),
)
def test_mixtures_deal_and_resume_like_a_dataset(
    mix_sources, weights, seed, replacement, bs, world, world2, policy, at
):
    m = rowstore.mix(
        list(zip(mix_sources, weights)),
        seed=seed,
        replacement=replacement,
        epoch_rows=150 if replacement else None,
    )
    kw = dict(seed=seed + 1, window=2, drop_last=policy == "drop", pad=policy == "pad", unit=2)
    plan = _plan(m.epoch_rows, bs, policy)
    n = int(plan.steps(world, 2).min() * at)

    def rows(batches):
        out = []
        for b in batches:
            keep = ~b["__pad"] if "__pad" in b else np.ones(len(b["id"]), bool)
            out += list(zip(b["src"][keep].tolist(), b["id"][keep].tolist()))
        return out

    first = [r for c in range(world) for r in rows(list(m.deal(bs, shard=(c, world), **kw))[:n])]
    left = plan.after([n] * world, 2)
    rest = (
        []
        if left is None
        else [
            r
            for c in range(world2)
            for r in rows(m.deal(bs, shard=(c, world2), remaining=left.remaining, **kw))
        ]
    )
    got = first + rest
    counts = np.bincount([s for s, _ in got], minlength=3)
    if policy != "drop":
        assert counts.tolist() == m.counts.tolist()  # exactly the mixture's counts
    assert (counts <= m.counts).all()
    if not replacement:
        assert len(got) == len(set(got))  # no row twice without replacement
        assert (m.counts <= m.sizes).all()
    else:  # with replacement, a row repeats only across passes over its source
        for k in range(3):
            ids = [i for s, i in got if s == k]
            assert (
                max(np.bincount(ids, minlength=1)) <= -(-m.counts[k] // m.sizes[k]) if ids else True
            )
