"""The timed rounds the ingest benches share (``ingest_bench.py``, ``image_ingest_bench.py``,
``audio_ingest_bench.py``): the cases interleaved and rotated each round, round 0 a warm-up,
each output checked, measured and removed; and the results printed and written as JSON."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable


def dir_bytes(dest: str) -> int:
    """Bytes of the file or directory tree ``dest`` (0 when there is none)."""
    if os.path.isfile(dest):
        return os.path.getsize(dest)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(dest) for f in files)


def timed_rounds(
    cases: dict[str, Callable[[str], float | None]],
    tmp: str,
    repeats: int,
    check: Callable[[str, str], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, int], list[float]]:
    """``(seconds of each case's timed rounds, bytes it wrote, 1-minute load per round)``.

    Each round runs every case once (``case(dest)``, a fresh ``dest`` under ``tmp``; a case
    that returns seconds is timed by itself, e.g. a child process's write), in an order rotated
    by one each round; round 0 warms up and is not counted. ``check(name, dest)`` runs after
    each case, outside the time."""
    times: dict[str, list[float]] = {k: [] for k in cases}
    sizes: dict[str, int] = {}
    loads: list[float] = []
    names = list(cases)
    width = max(map(len, names), default=0) + 2
    for rep in range(repeats + 1):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            dest = os.path.join(tmp, f"out_{name}")
            shutil.rmtree(dest, ignore_errors=True)
            t = time.perf_counter()
            inner = cases[name](dest)
            dt = time.perf_counter() - t if inner is None else inner
            if check is not None:
                check(name, dest)
            sizes[name] = dir_bytes(dest)
            shutil.rmtree(dest, ignore_errors=True)
            if rep:
                times[name].append(dt)
            print(f"  {name:{width}s} round {rep}: {dt:.2f} s", file=sys.stderr)
        loads.append(round(os.getloadavg()[0], 1))
    return times, sizes, loads


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in times.items()}


def rounded(times: dict[str, list[float]], med: dict[str, float]) -> dict[str, dict]:
    """The result's ``median_s`` and ``all_s``."""
    return {
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }


def emit(result: dict, out: str | None) -> dict:
    """Print ``result`` as JSON, and write it to ``out`` when given."""
    print(json.dumps(result, indent=2))
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
            fh.write("\n")
    return result
