"""Run each measured configuration in a fresh Python process, so that peak memory is its own.

The parent sends a JSON spec on stdin to ``python -m rowstore.bench.runner``; the child prints
JSON lines prefixed with :data:`MARK` (progress events, then the result) on stdout. Anything
else a library prints is ignored; the child's stderr is kept to explain a failure.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

from rowstore.bench import measure as M
from rowstore.bench import sources

__all__ = ["run_spec", "child_main", "MARK"]

MARK = "@@rowstore-bench "


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def measure_spec(spec: dict[str, Any], emit: Callable[[dict], None] = _emit) -> dict[str, Any]:
    """Measure one spec in this process (what the child does). See :func:`run_spec`."""
    if spec["kind"] == "memcpy":
        res = M.memcpy_gbps(int(spec.get("nbytes", 1 << 30)), int(spec.get("repeats", 5)))
        res.update(kind="memcpy", label="memcpy (np.copyto)", peak_rss_mb=M.peak_rss_mb())
        return res
    src = sources.open_source(spec)
    rss_start = M.rss_mb()
    warm_reps = int(spec.get("warmup_repeats", 0))
    nrep = int(spec.get("repeats", 3))
    reps = []
    first_epoch = None
    last_emit = [0.0]
    counter = [0]

    def on_batch() -> None:
        counter[0] += 1
        now = time.perf_counter()
        if now - last_emit[0] > 0.25:
            last_emit[0] = now
            emit({"event": "batches", "n": counter[0]})

    try:  # the source (its reader, files, threads) is closed whatever fails from here on
        t = time.perf_counter()
        quality = src.shuffle_quality()
        quality_s = time.perf_counter() - t
        for k in range(warm_reps + nrep):
            res = M.measure_iter(
                functools.partial(src.epoch, k),
                src.names,
                warmup=int(spec.get("warmup", 0)),
                measure=spec.get("measure"),
                time_limit=spec.get("time_limit"),
                max_rows=spec.get("max_rows"),
                on_batch=on_batch,
                var_dims=src.var_dims,
                workers=bool(src.info.get("workers")),
            )
            res["epoch"] = k
            res["warmup_repeat"] = k < warm_reps
            if (
                k == 0
            ):  # the first epoch of a fresh reader (in a fresh process): what checks cost most
                first_epoch = res["rows_per_s"]
            emit(
                {"event": "repeat", "i": k, "of": warm_reps + nrep, "rows_per_s": res["rows_per_s"]}
            )
            if k >= warm_reps:
                reps.append(res)
    finally:
        src.close()
    return {
        "kind": spec["kind"],
        "label": src.label,
        "description": src.description,
        "fields": src.names,
        "info": src.info,
        "shuffle_quality": quality,
        "shuffle_quality_s": quality_s,
        "epoch_batches": src.num_batches,
        "repeats": reps,
        **M.summarize(reps),
        "first_epoch_rows_per_s": first_epoch,
        "rss_start_mb": rss_start,
        "peak_rss_mb": M.peak_rss_mb(),
        "workers_rss_mb": max((r["workers_rss_mb"] for r in reps), default=0.0),
    }


def child_main() -> int:
    spec = json.loads(sys.stdin.read())
    try:
        result = measure_spec(spec)
    except BaseException as exc:  # report anything, including ImportError from adapters
        _emit(
            {
                "event": "error",
                "type": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            }
        )
        return 1
    _emit({"event": "result", "result": result})
    return 0


def run_spec(
    spec: dict[str, Any],
    on_event: Callable[[dict], None] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Measure ``spec`` in a fresh interpreter; return its result dict.

    On failure the dict holds ``error`` (message) and ``stderr`` (the child's last lines)
    instead. ``on_event`` receives the progress events as they arrive.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    with tempfile.TemporaryFile("w+") as err:
        # Leaving the with block closes the pipes and reaps the child.
        with subprocess.Popen(
            [sys.executable, "-m", "rowstore.bench.runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        ) as proc:
            try:
                result = _read_events(proc, json.dumps(spec), on_event, timeout)
            except BaseException:  # on_event failed, or Ctrl-C: the child must not run on alone
                proc.kill()
                raise
        if result is None:
            err.seek(0)
            tail = err.read()[-3000:]
            result = {
                "error": f"the measuring process exited with code {proc.returncode}",
                "stderr": tail,
            }
    return result


def _read_events(
    proc: subprocess.Popen,
    spec_json: str,
    on_event: Callable[[dict], None] | None,
    timeout: float | None,
) -> dict[str, Any] | None:
    """Send the spec to the child and read its events: its result or error, None if it sent
    neither."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(spec_json)
    proc.stdin.close()
    result: dict[str, Any] | None = None
    t0 = time.monotonic()
    for line in proc.stdout:
        if not line.startswith(MARK):
            continue
        ev = json.loads(line[len(MARK) :])
        if ev["event"] == "result":
            result = ev["result"]
        elif ev["event"] == "error":
            result = {"error": f"{ev['type']}: {ev['message']}", "traceback": ev.get("traceback")}
        elif on_event is not None:
            on_event(ev)
        if timeout is not None and time.monotonic() - t0 > timeout:
            proc.kill()
            return {"error": f"timed out after {timeout:.0f} s"}
    return result


if __name__ == "__main__":
    sys.exit(child_main())
