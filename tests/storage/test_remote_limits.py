"""A server's answer costs no more memory than the range asked for.

``tests/_servers.py``'s :class:`RangeHTTPServer` in its misbehaving modes answers a ranged GET
with the whole object (``200``, Range ignored), or with more body than asked for (with or
without a Content-Length): the client refuses the answer with a :class:`RemoteError` at once,
having buffered at most the range (measured with ``tracemalloc``), and does not retry it.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import peak_allocations

import rowstore
from rowstore.errors import FormatError, RemoteError

pytest.importorskip("fsspec")

BIG = 48 << 20  # the object a misbehaving answer would buffer whole
LIMIT = 8 << 20  # generous: the ranges asked for are 64 KiB
FAST = {"timeout": 30.0, "backoff": 0.01, "retries": 3}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("limits")
    with open(d / "big.bin", "wb") as f:
        f.truncate(BIG)
    schema = rowstore.Schema({"x": "int64", "v": ("float32", (32,))})
    with rowstore.Writer(str(d / "d.h5"), schema, rows_per_block=256) as w:
        w.write_batch({"x": np.arange(12000), "v": np.zeros((12000, 32), np.float32)})
    return str(d)


@pytest.mark.parametrize("mode", ["ignore-range", "long-body", "unsized-body"])
def test_an_answer_longer_than_the_range_is_refused_unbuffered(root, http_factory, mode):
    from rowstore.storage.objstore import Client, RemoteOptions

    srv = http_factory(root, misbehave=mode)
    url = f"{srv.url}/big.bin"
    client = Client(url, RemoteOptions(**FAST))
    # Once unmeasured: the first request of a process builds its fsspec filesystem and imports
    # (megabytes of Python objects that are not the answer's).
    peak_allocations(lambda: client.get(url, 0, 65536))
    for start in (0, 1 << 20):  # a block's range, or a manifest's or pointer's first bytes
        before = srv.requests
        err, peak = peak_allocations(lambda s=start: client.get(url, s, s + 65536))
        assert isinstance(err, RemoteError) and "refused unread" in str(err), err
        assert (err.url, err.start, err.end) == (url, start, start + 65536)
        assert peak < LIMIT, (mode, start, peak)
        assert srv.requests - before == 1  # the same answer would come again: not retried
    err, peak = peak_allocations(lambda: client.cat_small(url, 65536))
    assert isinstance(err, (RemoteError, FormatError)), err
    assert peak < LIMIT, (mode, peak)


def test_opening_through_a_server_that_ignores_range_is_refused(root, http_factory):
    good, bad = http_factory(root), http_factory(root, misbehave="ignore-range")
    with rowstore.open(f"{good.url}/d.h5", remote=FAST) as r:
        assert r.take([5])["x"].tolist() == [5]
    with pytest.raises(RemoteError, match="ignores Range"):
        rowstore.open(f"{bad.url}/d.h5", remote=FAST)


def test_s3_answers_past_the_range_are_refused_unbuffered(root, s3_server):
    """The S3 path reads bodies with the same cap: a proxy in front of S3 that drops ``Range``
    (S3 then sends the whole object) is refused by its Content-Length, before the body is read,
    and not retried. (No peak is measured here: the moto server runs in this process and
    builds the whole object's answer.)"""
    import fsspec
    from _servers import FaultProxy, s3_options

    from rowstore.storage.objstore import Client, RemoteOptions

    endpoint, opts = s3_server
    fsspec.filesystem("s3", **opts).put(f"{root}/big.bin", "rowstore/limits/big.bin")
    proxy = FaultProxy(endpoint.split("://", 1)[1], fault=lambda n, head: "drop-range")
    try:
        url = "s3://rowstore/limits/big.bin"
        client = Client(url, RemoteOptions(storage_options=s3_options(proxy.url), **FAST))
        for etag in (None, client.info(url)["etag"]):
            with pytest.raises(RemoteError, match="Content-Length 50331648.*refused unread"):
                client.get(url, 1 << 20, (1 << 20) + 65536, etag)
        assert proxy.injected == 2  # one request each: not retried
    finally:
        proxy.close()
