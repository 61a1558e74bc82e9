"""rowstore.dask.shuffle on a real 2-process LocalCluster: the same output as the local path
(rows, order, stored bytes), whatever the number of pass-1 tasks; failures leave nothing."""

from __future__ import annotations

import os

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from test_shuffle import expected_order, ids_of, leftovers, stored_by_id, tiny_plan, write_sorted  # noqa: E402, F401

import rowstore  # noqa: E402
import rowstore.dask as rdask  # noqa: E402
from rowstore.cli import main  # noqa: E402

pytestmark = pytest.mark.xdist_group("dask")


@pytest.fixture(scope="module")
def cluster(dask_cluster):
    """The session's LocalCluster (conftest.py)."""
    return dask_cluster


@pytest.fixture(scope="module")
def client(cluster):
    with distributed.Client(cluster) as c:
        yield c


def test_dask_output_equals_local_output(tmp_path, client, tiny_plan):  # noqa: F811
    src = write_sorted(tmp_path / "in", 3000, shard_bytes=60_000)
    tiny_plan(piles=3, limit=100_000)  # piles split again on the workers too
    local = rowstore.shuffle(src, tmp_path / "local", memory="4MiB", seed=4, block_bytes=8192)
    rep = rdask.shuffle(
        src, tmp_path / "dask", memory="4MiB", seed=4, block_bytes=8192, client=client, tasks=3
    )
    assert rep.rows == local.rows == 3000 and rep.splits > 0 and rep.peak_rss > 0
    ids = ids_of(tmp_path / "dask")
    assert np.array_equal(ids, ids_of(tmp_path / "local"))
    assert np.array_equal(ids, expected_order(4, 3000))  # the uniform permutation of the seed
    assert stored_by_id(tmp_path / "dask") == stored_by_id(src)
    with rowstore.open(tmp_path / "dask") as r:
        assert [r[i]["name"] for i in (0, 1)] == [
            None if i % 5 == 0 else f"row {i}" for i in ids[:2]
        ]
    assert leftovers(tmp_path) == []


def test_dask_task_count_does_not_change_the_order(tmp_path, client):
    src = write_sorted(tmp_path / "in", 2000, shard_bytes=30_000)
    orders = []
    for tasks in (1, 5):
        out = tmp_path / f"out{tasks}"
        rdask.shuffle(src, out, memory="4MiB", seed=8, client=client, tasks=tasks)
        orders.append(ids_of(out))
    assert np.array_equal(orders[0], orders[1]) and np.array_equal(
        orders[0], expected_order(8, 2000)
    )


def test_dask_failure_leaves_no_output_and_no_piles(tmp_path, client):
    src = write_sorted(tmp_path / "in.h5", 2000, dataset=False)
    off = int(rowstore.Layout.open(src).blocks["offset"][2])
    with open(src, "r+b") as f:
        f.seek(off + 1)
        f.write(b"\xee\xee")
    with pytest.raises(rowstore.ChecksumError):
        rdask.shuffle(src, tmp_path / "out", memory="4MiB", seed=1, client=client, tasks=2)
    assert not os.path.exists(tmp_path / "out") and leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="tasks must be a positive int"):
        rdask.shuffle(src, tmp_path / "out", client=client, tasks=0)


def test_cli_dask_scheduler(tmp_path, cluster, capsys):
    src = write_sorted(tmp_path / "in", 1500)
    args = [
        "shuffle",
        src,
        str(tmp_path / "out"),
        "--memory",
        "4MiB",
        "--seed",
        "2",
        "--dask-scheduler",
        cluster.scheduler_address,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "shuffled 1,500 rows" in out and "after:" in out
    assert np.array_equal(ids_of(tmp_path / "out"), expected_order(2, 1500))
