"""Time limits in the tests are hang guards only, never what a test checks.

A test waits for an event (a line from a child, a file appearing, an item on a queue, a
request counted by a server); a limit only ends a test that would otherwise hang. Limits are
generous and multiplied by ``ROWSTORE_TEST_TIMEOUT_SCALE`` (default 4), so that a slow or busy
machine (another job saturating every core) does not turn a wait into a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

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
