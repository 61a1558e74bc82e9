"""Reading over HTTP against the same data on local disk: nginx, fixed first-byte latencies.

The rig of issue 42. Writes the demo datasets (``patch``: ~19 KB fixed rows; ``speech``: ~354 KB
variable-length rows with heap payloads) into a directory, starts nginx from Debian
(``apt-get install -y nginx-light libnginx-mod-http-echo``) on 127.0.0.1 serving that directory
with byte ranges and ETags, one port per latency: a port adding ``L`` ms to every request does
``echo_sleep`` then ``echo_exec`` to the static location (this kernel has no netem), and
measures, each case in a fresh process:

* ``local``: ``rowstore.open(path)``, the page cache warm;
* ``remote``: ``rowstore.open("http://127.0.0.1:PORT/...")``, default options;
* ``cached``: the remote URL with ``cache=DIR``, the cache filled by one epoch first (the
  "second epoch" of a training job).

For each order (the default block order, and ``shuffle="full"``). A pass is a fresh reader and
shuffled epochs (seed = epoch = pass number) until it lasted >= ``--min-s`` seconds, stopped
early (mid-epoch) at ``--max-s``; the rate of a case is the median of ``--passes`` passes.
Recorded per case: rows/s, MB/s of bytes delivered (the arrays of the batches), the reader's CPU
(user + system over wall, 1.0 = one core), nginx's CPU, and the bytes nginx sent over the bytes
delivered (amplification; read from nginx's access log, so no client code is trusted for it).
The ratios are ``remote / local`` and ``cached / local`` of the same run.

    python bench/remote_read_bench.py [--small] [--latencies 0,10,30,60] [--workloads
    patch,speech] [--orders default,full] [--json bench/results/remote_read_bench.json]

Server and client share the machine's cores: absolute rates move with the load, the ratios of
one run are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

NGINX = "/usr/sbin/nginx"
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"
BATCH = {"patch": 256, "speech": 32}


# -- the datasets ---------------------------------------------------------------------------------
def write_data(root: str, rows: dict[str, int]) -> dict[str, str]:
    from rowstore.demo import make_demo

    out = {}
    for name, n in rows.items():
        path = os.path.join(root, f"{name}.rs")
        if not os.path.exists(path):
            make_demo(name, path, n, seed=0)
        out[name] = path
    return out


# -- nginx ---------------------------------------------------------------------------------------
class Nginx:
    """nginx on 127.0.0.1 serving ``root``: one port per latency (ms)."""

    def __init__(self, root: str, latencies: list[int], work: str):
        if not os.path.exists(NGINX) or not os.path.exists(ECHO_MODULE):
            raise SystemExit(
                "nginx with the echo module is needed: apt-get install -y nginx-light "
                "libnginx-mod-http-echo"
            )
        self.work = work
        self.log = os.path.join(work, "access.log")
        tmp = os.path.join(work, "tmp")
        os.makedirs(tmp, exist_ok=True)
        self.ports: dict[int, int] = {}
        servers = []
        for lat in latencies:
            port = _free_port()
            self.ports[lat] = port
            if lat:
                loc = (
                    f"location / {{ echo_sleep {lat / 1000:.3f}; echo_exec @static; }} "
                    "location @static { }"
                )
            else:
                loc = ""
            servers.append(f"server {{ listen 127.0.0.1:{port}; root {root}; {loc} }}")
        conf = f"""
load_module {ECHO_MODULE};
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log;
events {{ worker_connections 4096; }}
http {{
  log_format bytes '$server_port $bytes_sent';
  access_log {self.log} bytes;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  sendfile on; tcp_nopush on; etag on;
  keepalive_requests 1000000; keepalive_timeout 300s;
  default_type application/octet-stream;
  {chr(10).join(servers)}
}}
"""
        self.conf = os.path.join(work, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.proc = subprocess.Popen([NGINX, "-c", self.conf], stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        import socket

        for port in self.ports.values():
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    if time.time() > deadline or self.proc.poll() is not None:
                        raise SystemExit(f"nginx did not start: see {work}/error.log") from None
                    time.sleep(0.05)

    def workers(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
        ).stdout.split()
        return [int(p) for p in out] + [self.proc.pid]

    def cpu_s(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.workers():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parts = f.read().rsplit(")", 1)[1].split()
                total += (int(parts[11]) + int(parts[12])) / tick
            except OSError:
                pass
        return total

    def log_pos(self) -> int:
        try:
            return os.path.getsize(self.log)
        except OSError:
            return 0

    def bytes_sent(self, since: int) -> int:
        """Bytes nginx sent (headers included) in requests logged after ``since``."""
        total = 0
        with open(self.log, "rb") as f:
            f.seek(since)
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    total += int(parts[1])
        return total

    def close(self) -> None:
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a case, in a child process -------------------------------------------------------------------
def _nbytes(v: Any) -> int:
    if isinstance(v, np.ndarray):
        if v.dtype == object:
            return sum(_nbytes(x) for x in v.ravel())
        return v.nbytes
    if isinstance(v, (bytes, bytearray, memoryview)):
        return len(v)
    if isinstance(v, str):
        return len(v.encode())
    if isinstance(v, (list, tuple)):
        return sum(_nbytes(x) for x in v)
    if isinstance(v, dict):
        return sum(_nbytes(x) for x in v.values())
    if isinstance(getattr(v, "values", None), np.ndarray):  # Ragged
        return v.values.nbytes
    return np.asarray(v).nbytes


def _epochs(spec: dict, k: int, reader: Any, t0: float) -> tuple[int, int, bool]:
    """Epochs of pass ``k`` until ``min_s``; rows and bytes delivered, whether cut short."""
    rows = nbytes = 0
    e = 0
    kw: dict[str, Any] = {} if spec["order"] == "default" else {"shuffle": spec["order"]}
    while True:
        for b in reader.batches(spec["batch"], seed=k, epoch=1000 * k + e, **kw):
            rows += len(next(iter(b.values())))
            nbytes += _nbytes(b)
            if time.perf_counter() - t0 > spec["max_s"]:
                return rows, nbytes, True
        e += 1
        if time.perf_counter() - t0 >= spec["min_s"]:
            return rows, nbytes, False


def child(spec: dict) -> dict:
    import rowstore

    kw: dict[str, Any] = {}
    if spec.get("cache"):
        kw["cache"] = spec["cache"]
        if spec.get("fill"):  # one epoch through the cache first
            r = rowstore.open(spec["url"], **kw)
            for _ in r.batches(spec["batch"], seed=99, epoch=99):
                pass
            wait = getattr(r._store, "wait_for_copies", None)
            if wait is not None:  # local copies of whole objects, made in the background
                wait()
            r.close()
    out: dict[str, Any] = {"passes": []}
    for k in range(spec["passes"]):
        c0, t0 = os.times(), time.perf_counter()
        r = rowstore.open(spec["url"], **kw)
        rows, nbytes, cut = _epochs(spec, k, r, t0)
        r.close()
        wall = time.perf_counter() - t0
        c1 = os.times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        out["passes"].append(
            {"rows": rows, "bytes": nbytes, "wall_s": wall, "cpu": cpu / wall, "cut": cut}
        )
    return out


def run_case(spec: dict, nginx: Nginx | None) -> dict:
    pos = nginx.log_pos() if nginx else 0
    cpu0 = nginx.cpu_s() if nginx else 0.0
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    if proc.returncode:
        sys.stderr.write(proc.stderr)
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    passes = res["passes"]
    if not passes:
        return res
    res["rows_s"] = statistics.median(p["rows"] / p["wall_s"] for p in passes)
    res["mb_s"] = statistics.median(p["bytes"] / p["wall_s"] / 1e6 for p in passes)
    res["cpu"] = statistics.median(p["cpu"] for p in passes)
    res["cut"] = any(p["cut"] for p in passes)
    if nginx:
        time.sleep(0.2)  # the access log is written when a request ends
        delivered = sum(p["bytes"] for p in passes)
        sent = nginx.bytes_sent(pos)
        res["fetched_bytes"] = sent
        res["amplification"] = sent / max(1, delivered)
        res["nginx_cpu"] = (nginx.cpu_s() - cpu0) / wall
    return res


# -- the run -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--small", action="store_true", help="patch 4,000 rows, speech 400 rows")
    p.add_argument("--patch-rows", type=int, default=20_000)
    p.add_argument("--speech-rows", type=int, default=2_000)
    p.add_argument("--workloads", default="patch,speech")
    p.add_argument("--latencies", default="0,10,30,60", help="ms added per request")
    p.add_argument("--orders", default="default,full")
    p.add_argument("--no-cache", action="store_true", help="skip the cached cases")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--min-s", type=float, default=2.0)
    p.add_argument("--max-s", type=float, default=6.0, help="a pass stops here, mid-epoch")
    p.add_argument("--data", help="directory for the datasets (kept; default: a temporary one)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    rows = {"patch": a.patch_rows, "speech": a.speech_rows}
    if a.small:
        rows = {"patch": 4_000, "speech": 400}
    workloads = [w for w in a.workloads.split(",") if w]
    lats = [int(x) for x in a.latencies.split(",") if x]
    orders = [o for o in a.orders.split(",") if o]
    work = tempfile.mkdtemp(prefix="rowstore-remote-read-")
    data = a.data or os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    paths = write_data(data, {w: rows[w] for w in workloads})
    nginx = Nginx(data, lats, work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop nginx on kill too
    results: list[dict] = []
    base = {"passes": a.passes, "min_s": a.min_s, "max_s": a.max_s}
    try:
        for w in workloads:
            name = os.path.basename(paths[w])
            for order in orders:
                spec = dict(base, batch=BATCH[w], order=order)
                local = run_case(dict(spec, url=paths[w]), None)
                results.append(dict(local, workload=w, order=order, case="local", latency_ms=None))
                _show(results[-1], local)
                for lat in lats:
                    url = f"http://127.0.0.1:{nginx.ports[lat]}/{name}"
                    res = run_case(dict(spec, url=url), nginx)
                    results.append(
                        dict(res, workload=w, order=order, case="remote", latency_ms=lat)
                    )
                    _show(results[-1], local)
                if not a.no_cache:
                    cache = os.path.join(work, f"cache-{w}-{order}")
                    url = f"http://127.0.0.1:{nginx.ports[lats[0]]}/{name}"
                    run_case(dict(spec, url=url, cache=cache, fill=True, passes=0), nginx)
                    res = run_case(dict(spec, url=url, cache=cache), nginx)
                    results.append(
                        dict(res, workload=w, order=order, case="cached", latency_ms=lats[0])
                    )
                    _show(results[-1], local)
                    shutil.rmtree(cache, ignore_errors=True)
    finally:
        nginx.close()
        if not a.data:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "results": results}, f, indent=1)
    return 0


def _show(r: dict, local: dict) -> None:
    if "error" in r:
        print(f"{r['workload']:7s} {r['order']:8s} {r['case']:7s} error: {r['error']}", flush=True)
        return
    lat = "" if r["latency_ms"] is None else f"{r['latency_ms']} ms"
    ratio = r["rows_s"] / local["rows_s"] if "rows_s" in local else float("nan")
    amp = f"{r['amplification']:6.2f}" if "amplification" in r else "     -"
    ncpu = f"{r['nginx_cpu']:.2f}" if "nginx_cpu" in r else "   -"
    print(
        f"{r['workload']:7s} {r['order']:8s} {r['case']:7s} {lat:>6s} {r['rows_s']:9.0f} rows/s "
        f"{r['mb_s']:7.1f} MB/s  x{ratio:5.3f} local  cpu {r['cpu']:.2f} nginx {ncpu}  "
        f"fetched/delivered {amp}{'  (passes cut at max-s)' if r['cut'] else ''}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
