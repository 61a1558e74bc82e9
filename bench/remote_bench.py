"""Reading from object storage: rowstore over S3 vs h5py over an fsspec file vs a local read.

Starts moto's S3 server and a Range HTTP server, each in a process of its own (127.0.0.1), and
two proxies in front of each
(``tests/_servers.py``): one adding nothing, one adding first-byte latency to every request
(default +30 ms). Writes the *patch* workload (``foo float64[9,9,27]``, ``bar int64[9,27]``,
``baz float64``: 19,448-byte rows, ~1 MiB blocks) as a dataset of 4 MiB shards (stock moto copies
a whole object per ranged GET: small objects keep the server out of the way), uploads it, and
measures one block-shuffled epoch per repeat, each case in a fresh process (its peak RSS its own):

* ``local``: ``rowstore.open(dir)`` on the local copy (page cache warm);
* ``rowstore s3 +N ms``: ``rowstore.open("s3://...")``, default options (32 requests in flight);
* ``h5py/fsspec s3 +N ms``: each shard opened with ``s3fs`` (``block_size`` = one block,
  readahead cache) and ``h5py.File`` on that file object, its blocks read in a shuffled order
  (shards shuffled too): the same block-shuffled epoch, through libhdf5.

MB/s counts the rows' bytes delivered (19,448 per row), medians of the repeats. Server, proxy and
client share the machine's cores: on a loaded 2-core machine, absolute figures move with the
load; the ratios in one run are what to compare.

    python bench/remote_bench.py [--mb 96] [--repeats 3] [--latency-ms 30] [--json
    bench/results/remote_bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # tests/_servers.py

ROW_BYTES = 9 * 9 * 27 * 8 + 9 * 27 * 8 + 8


def write_patch(root: str, mb: int) -> str:
    import rowstore
    from rowstore import Field, Schema

    schema = Schema(
        [
            Field("foo", "float64", (9, 9, 27)),
            Field("bar", "int64", (9, 27)),
            Field("baz", "float64"),
        ]
    )
    rows = (mb << 20) // ROW_BYTES
    ds = os.path.join(root, "patch")
    rng = np.random.default_rng(0)
    with rowstore.DatasetWriter(ds, schema, shard_bytes=4 << 20, block_bytes=1 << 20) as w:
        for a in range(0, rows, 2048):
            n = min(2048, rows - a)
            w.write_batch(
                {
                    "foo": rng.random((n, 9, 9, 27)),
                    "bar": rng.integers(0, 1 << 40, (n, 9, 27)),
                    "baz": np.arange(a, a + n, dtype=np.float64),
                }
            )
    return ds


# -- the cases (each in a child process) ----------------------------------------------------------
def _rowstore(spec: dict) -> dict:
    import rowstore

    r = rowstore.open(spec["url"], storage_options=spec.get("so"), remote=spec.get("remote"))
    times, rows = [], 0
    for k in range(spec["repeats"]):
        t = time.perf_counter()
        rows = 0
        for b in r.batches(256, seed=k, epoch=k):
            rows += len(b["baz"])
            b["foo"][:, 0, 0, 0].sum()
        times.append(time.perf_counter() - t)
    req = r._store.requests if hasattr(r._store, "requests") else None
    return {"rows": rows, "times_s": times, "requests": req}


def _h5py(spec: dict) -> dict:
    import fsspec
    import h5py

    if spec["url"].startswith("http"):
        fs = fsspec.filesystem("http")
        shards = [spec["url"] + "/shards/" + n for n in spec["shards"]]
    else:
        fs = fsspec.filesystem("s3", **spec["so"])
        shards = sorted(p for p in fs.find(spec["url"].split("://", 1)[1] + "/shards"))
    times, rows = [], 0
    for k in range(spec["repeats"]):
        rng = np.random.default_rng(k)
        t = time.perf_counter()
        rows = 0
        for s in rng.permutation(len(shards)):
            with (
                fs.open(shards[s], "rb", block_size=1 << 20, cache_type="readahead") as f,
                h5py.File(f, "r") as h,
            ):
                ds = h["rowstore/rows"]
                rpb = ds.chunks[0]
                nb = -(-ds.shape[0] // rpb)
                for b in rng.permutation(nb):
                    part = ds[b * rpb : min(ds.shape[0], (b + 1) * rpb)]
                    rows += len(part)
            if time.perf_counter() - t > spec["time_limit"]:
                break
        times.append(time.perf_counter() - t)
    return {"rows": rows, "times_s": times, "partial": True}


def _vm_hwm_mb() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss would count the forked parent's pages)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(spec: dict) -> dict:
    res = _h5py(spec) if spec["kind"] == "h5py" else _rowstore(spec)
    res["peak_rss_mb"] = _vm_hwm_mb()
    t = statistics.median(res["times_s"])
    res["mb_per_s"] = res["rows"] * ROW_BYTES / t / 1e6
    return res


def run_child(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=os.path.dirname(HERE)),
    )
    if out.returncode != 0:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=96, help="dataset size (MB of rows)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--latency-ms", type=float, default=30.0)
    p.add_argument(
        "--h5py-seconds",
        type=float,
        default=8.0,
        help="time limit of an h5py epoch (rate extrapolated)",
    )
    p.add_argument(
        "--in-flight",
        default="",
        help="also rowstore over HTTP at +latency with these max_in_flight "
        "values, e.g. 1,4,8 (the window's effect)",
    )
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    import _servers
    import fsspec

    tmp = tempfile.mkdtemp(prefix="rowstore-remote-bench-")
    ds = write_patch(tmp, args.mb)
    results: dict = {
        "dataset": {
            "rows": None,
            "mb": args.mb,
            "row_bytes": ROW_BYTES,
            "shard_bytes": 4 << 20,
            "block_bytes": 1 << 20,
        },
        "cases": {},
    }
    with _servers.moto_s3(process=True) as (endpoint, so):
        fs = fsspec.filesystem("s3", **so)
        fs.put(ds + "/", "rowstore/patch/", recursive=True)
        proxies = {
            0: _servers.FaultProxy(endpoint.split("://")[1]),
            int(args.latency_ms): _servers.FaultProxy(
                endpoint.split("://")[1], latency=args.latency_ms / 1e3
            ),
        }
        cases = [("local", {"kind": "rowstore", "url": ds})]
        for ms, px in proxies.items():
            pso = _servers.s3_options(px.url)
            cases.append(
                (
                    f"rowstore s3 +{ms} ms",
                    {"kind": "rowstore", "url": "s3://rowstore/patch", "so": pso},
                )
            )
            cases.append(
                (
                    f"h5py/fsspec s3 +{ms} ms",
                    {
                        "kind": "h5py",
                        "url": "s3://rowstore/patch",
                        "so": pso,
                        "time_limit": args.h5py_seconds,
                    },
                )
            )
        # The same over plain HTTP (tests/_servers.py's Range server, in its own process: lighter
        # than moto).
        http_cm = _servers.http_process(tmp)
        http_url = http_cm.__enter__()
        hproxies = {
            0: _servers.FaultProxy(http_url.split("://")[1]),
            int(args.latency_ms): _servers.FaultProxy(
                http_url.split("://")[1], latency=args.latency_ms / 1e3
            ),
        }
        shard_names = sorted(os.listdir(os.path.join(ds, "shards")))
        for ms, px in hproxies.items():
            cases.append(
                (f"rowstore http +{ms} ms", {"kind": "rowstore", "url": px.url + "/patch"})
            )
            for w in [int(v) for v in args.in_flight.split(",") if v] if ms else []:
                cases.append(
                    (
                        f"rowstore http +{ms} ms in flight {w}",
                        {
                            "kind": "rowstore",
                            "url": px.url + "/patch",
                            "remote": {"max_in_flight": w},
                        },
                    )
                )
            cases.append(
                (
                    f"h5py/fsspec http +{ms} ms",
                    {
                        "kind": "h5py",
                        "url": px.url + "/patch",
                        "shards": shard_names,
                        "time_limit": args.h5py_seconds,
                    },
                )
            )
        for name, spec in cases:
            spec["repeats"] = args.repeats if spec["kind"] == "rowstore" else 1
            res = run_child(spec)
            results["cases"][name] = res
            print(
                f"{name:24s} "
                + (
                    f"{res['mb_per_s']:8.1f} MB/s  peak RSS {res['peak_rss_mb']:6.0f} MB"
                    f"  times {[f'{t:.2f}' for t in res['times_s']]}"
                    if "error" not in res
                    else "ERROR " + res["error"][-400:]
                ),
                flush=True,
            )
        for px in list(proxies.values()) + list(hproxies.values()):
            px.close()
        http_cm.__exit__(None, None, None)
    c = results["cases"]
    lat = int(args.latency_ms)

    def mbps(k: str) -> float:
        return c.get(k, {}).get("mb_per_s", float("nan"))

    results["summary"] = {
        f"rowstore_mb_s_at_{lat}ms": mbps(f"rowstore s3 +{lat} ms"),
        "rowstore_mb_s_at_0ms": mbps("rowstore s3 +0 ms"),
        f"ratio_to_h5py_at_{lat}ms": mbps(f"rowstore s3 +{lat} ms")
        / mbps(f"h5py/fsspec s3 +{lat} ms"),
        f"ratio_{lat}ms_to_0ms": mbps(f"rowstore s3 +{lat} ms") / mbps("rowstore s3 +0 ms"),
        "ratio_0ms_to_local": mbps("rowstore s3 +0 ms") / mbps("local"),
        f"http_rowstore_mb_s_at_{lat}ms": mbps(f"rowstore http +{lat} ms"),
        "http_rowstore_mb_s_at_0ms": mbps("rowstore http +0 ms"),
        f"http_ratio_to_h5py_at_{lat}ms": mbps(f"rowstore http +{lat} ms")
        / mbps(f"h5py/fsspec http +{lat} ms"),
        f"http_ratio_{lat}ms_to_0ms": mbps(f"rowstore http +{lat} ms")
        / mbps("rowstore http +0 ms"),
    }
    results["machine"] = {
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "note": "server (moto), proxy and client share the cores; other jobs ran alongside",
    }
    print(json.dumps(results["summary"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
