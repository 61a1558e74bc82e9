"""The documented JAX and Grain paths (docs/order.md): run where jax / grain are installed,
skipped otherwise (neither is a dependency of rowstore)."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("jax") / "x.h5")
    with rowstore.Writer(
        p, Schema([Field("id", "int64"), Field("x", "float32", (4,))]), rows_per_block=8
    ) as w:
        w.write_batch(
            {
                "id": np.arange(100),
                "x": np.repeat(np.arange(100, dtype=np.float32)[:, None], 4, axis=1),
            }
        )
    return p


def test_jax_process_local_batches(path):
    jax = pytest.importorskip("jax")
    r = rowstore.open(path)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    seen = []
    for b in r.deal(
        10, consumer=(jax.process_index(), jax.process_count()), seed=0, drop_last=True
    ):
        x = jax.make_array_from_process_local_data(sharding, b["x"])
        assert x.shape == (10 * jax.process_count(), 4)
        seen += b["id"].tolist()
    assert len(seen) == len(set(seen)) == 100


def test_reader_is_a_grain_random_access_source(path):
    grain = pytest.importorskip("grain")
    r = rowstore.open(path)
    ds = grain.MapDataset.source(r).shuffle(seed=0).batch(10)
    ids = sorted(int(i) for b in ds for i in np.asarray(b["id"]).reshape(-1))
    assert ids == list(range(100))
