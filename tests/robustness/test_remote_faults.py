"""A connection lost mid-read of a block (faults on the remote read path).

``tests/_servers.py``'s :class:`FaultProxy` forwards a ranged GET, lets the response's headers
and its first bytes of body through, then resets the connection (``"cut"``): a truncated body
must be retried (transient) or reported as a ``RemoteError`` naming the URL and range
(persistent), never handed out as data, never a hang.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import rowstore
from rowstore.errors import RemoteError

pytest.importorskip("fsspec")

SCHEMA = rowstore.Schema({"x": "int64", "v": ("float32", (32,))})
FAST = {"timeout": 2.0, "backoff": 0.01, "retries": 3}


@pytest.fixture(scope="module")
def served(tmp_path_factory, http_factory):
    d = tmp_path_factory.mktemp("cut")
    n = 12000
    cols = {"x": np.arange(n), "v": np.arange(n * 32, dtype=np.float32).reshape(n, 32)}
    for name, comp in (("raw.h5", None), ("lz4.h5", "lz4")):
        with rowstore.Writer(str(d / name), SCHEMA, compression=comp, rows_per_block=256) as w:
            w.write_batch(cols)
    return str(d), http_factory(str(d))


@pytest.fixture
def proxy(served):
    from _servers import FaultProxy

    made = []

    def make(**kw):
        p = FaultProxy(served[1].url.split("://", 1)[1], **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("name", ["raw.h5", "lz4.h5"])
def test_a_response_cut_mid_block_is_retried(served, proxy, name):
    seen: set[bytes] = set()

    def first_try_of_every_other_range(n: int, head: bytes) -> str | None:
        rng = next((ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"range:")), b"")
        if rng in seen:
            return None  # a retry goes through
        seen.add(rng)
        return "cut" if len(seen) % 2 else None

    p = proxy(fault=first_try_of_every_other_range, cut=1000)
    local = rowstore.open(os.path.join(served[0], name))
    remote = rowstore.open(p.url + "/" + name, remote=FAST)
    for a, b in zip(
        # window and pieces given: the default order of a local file differs from a remote one's
        local.batches(300, shuffle="block", seed=2, window=16, pieces=1),
        remote.batches(300, shuffle="block", seed=2, window=16, pieces=1),
        strict=True,
    ):
        assert np.array_equal(a["x"], b["x"]) and np.array_equal(a["v"], b["v"])
    rows = np.arange(0, len(local), 37)
    assert np.array_equal(remote.take(rows)["v"], local.take(rows)["v"])
    assert p.injected >= 2
    remote.close()
    local.close()


def test_a_response_always_cut_is_reported(served, proxy):
    armed = {"on": False}  # the faults start after the open
    p = proxy(fault=lambda n, head: "cut" if armed["on"] else None, cut=500)
    r = rowstore.open(p.url + "/lz4.h5", remote=FAST)
    armed["on"] = True
    with pytest.raises(RemoteError) as ei:
        r.take(np.arange(10))
    err = ei.value
    assert (
        err.url == p.url + "/lz4.h5"
        and err.attempts == FAST["retries"] + 1
        and err.end > err.start >= 0
    )
    armed["on"] = False
    assert np.array_equal(
        r.take(np.arange(10))["x"], np.arange(10)
    )  # the reader works once the network does
    r.close()
