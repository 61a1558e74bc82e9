"""Memory measured in tests: what a call allocates, never how long it takes."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any


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
