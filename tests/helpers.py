"""Helpers every test folder shares: the checkout's paths, hang guards, memory measured.

Time limits in the tests are hang guards only, never what a test checks.

A test waits for an event (a line from a child, a file appearing, an item on a queue, a
request counted by a server); a limit only ends a test that would otherwise hang. Limits are
generous and multiplied by ``ROWSTORE_TEST_TIMEOUT_SCALE`` (default 4), so that a slow or busy
machine (another job saturating every core) does not turn a wait into a failure.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

#: The checkout (the directory holding ``tests/``) and the committed test data.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")

TIMEOUT_SCALE = float(os.environ.get("ROWSTORE_TEST_TIMEOUT_SCALE", "4"))


def scaled(seconds: float) -> float:
    """``seconds`` times :data:`TIMEOUT_SCALE`: a hang guard's limit."""
    return seconds * TIMEOUT_SCALE


def wait_until(done: Callable[[], object], timeout: float = 30.0, interval: float = 0.02) -> bool:
    """Poll ``done()`` until it is true (returns True) or ``scaled(timeout)`` seconds pass
    (returns False, for the caller's assertion to say what did not happen)."""
    end = time.monotonic() + scaled(timeout)
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(interval)
    return True


def peak_allocations(call: Callable[[], Any]) -> tuple[Exception | None, int]:
    """``call()``'s error (None if it returned) and the peak of Python allocations while it
    ran (all threads; numpy's buffers count, libraries' own C allocations do not)."""
    tracemalloc.start()
    try:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - returned for the test to check
            return exc, tracemalloc.get_traced_memory()[1]
        return None, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def stored_payloads(path: Any, name: str) -> list[bytes]:
    """The stored bytes of heap field ``name`` of a file or dataset, row by row, undecoded
    (what the writer put in the heap: e.g. an image's PNG bytes)."""
    from rowstore.reader.raw import RawSource

    out = []
    with RawSource(os.fspath(path)) as src:
        for k in range(src.num_blocks):
            raw = src.block(k)
            ref = raw.rows[name]
            for off, nb in zip(ref["offset"].tolist(), ref["nbytes"].tolist()):
                lo = off - raw.origin
                out.append(raw.heap[lo : lo + nb].tobytes())
    return out


def memcpyed_starts(path: str) -> Any:
    """The file offset of each heap chunk's raw bytes in a compressed file, -1 for a chunk
    that is not memcpy'd (``kernels.memcpyed_starts``)."""
    from rowstore import Layout, kernels

    L = Layout.open(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        return kernels.memcpyed_starts(
            fd,
            L.heap_chunks["offset"],
            L.heap_chunks["stored_nbytes"],
            codec=L.frame_check(),
            raw_size=L.heap_chunk_bytes,
        )
    finally:
        os.close(fd)


def count_whole_checks(monkeypatch: Any) -> list[int]:
    """Record, for the rest of the test, how many chunks each whole-chunk check reads before a
    direct read (the reader's ``Gatherer._check_chunks``); returns the list it appends to."""
    from rowstore.reader._gather import Gatherer

    checks: list[int] = []
    check = Gatherer._check_chunks

    def counted(self: Any, todo: Any, what: str) -> None:
        checks.append(len(todo))
        check(self, todo, what)

    monkeypatch.setattr(Gatherer, "_check_chunks", counted)
    return checks


def flip_byte(path: str, offset: int, mask: int = 0x5A) -> None:
    """XOR the byte at ``offset`` of the file ``path`` with ``mask`` (in place)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def raised_without_blocking(call: Callable[[], Any], fifo: str | None = None) -> Exception | None:
    """What ``call()`` raised (None if nothing), run in a thread. A hang guard only, never a
    timing check: if the call still runs after a generous limit, a writer opens and closes
    ``fifo`` (releasing an ``open`` blocked on it) and the test fails."""
    box: dict[str, Any] = {"exc": None}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(scaled(15))
    blocked = t.is_alive()
    if blocked and fifo is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(scaled(15))
    if blocked:
        import pytest

        pytest.fail(f"blocked (a FIFO {fifo!r} opened for reading, or a walk that never ends)")
    return box["exc"]


# -- batches compared exactly ----------------------------------------------------------------
def same(a, b) -> bool:
    """Exact equality of two batches (arrays bitwise, object arrays by value, Ragged by parts)."""
    import numpy as np

    from rowstore.reader.buffers import Ragged

    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, Ragged):
            if not (
                isinstance(y, Ragged)
                and np.array_equal(x.values, y.values)
                and np.array_equal(x.offsets, y.offsets)
                and np.array_equal(x.shapes, y.shapes)
            ):
                return False
        elif x.dtype == object:
            if list(x) != list(y):
                return False
        elif x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def same_epochs(ea, eb) -> int:
    ea, eb = list(ea), list(eb)
    assert len(ea) == len(eb) and ea
    for i, (x, y) in enumerate(zip(ea, eb)):
        assert same(x, y), f"batch {i} differs"
    return len(ea)
