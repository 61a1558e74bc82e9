"""Real servers on 127.0.0.1 for the object-storage tests and bench (no mocks of the client):

* :func:`moto_s3` - moto's S3 server in this process (``ThreadedMotoServer``, port 0), with a
  bucket; objects are kept to a few MB (stock moto copies the whole object per ranged GET);
* :func:`gcs_emulator` - ``gcp-storage-emulator``'s GCS JSON API in this process (a thread,
  port 0, objects in memory), with a bucket, read and written by gcsfs;
* :class:`RangeHTTPServer` - a directory over HTTP/1.1 with ``Range``, ``ETag`` and ``If-Match``
  (``http.server`` does not do ranges);
* :class:`FaultProxy` - a TCP proxy in front of either, adding first-byte latency per request
  and injecting faults on ranged GETs: 503 responses, reset connections, stalls;
* :class:`FirstTries` - a fault schedule counted in requests, not time: the first tries of some
  distinct requests fail, then every try passes (the outcome does not depend on the speed of
  the machine or the order of concurrent requests).

``tests/conftest.py`` exposes them as session fixtures; ``bench/remote_bench.py`` imports this
module too.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import os
import re
import socket
import struct
import threading
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from helpers import scaled

# -- S3 (moto) --------------------------------------------------------------------------------


@contextmanager
def moto_s3(bucket: str = "rowstore", *, process: bool = False):
    """``(endpoint_url, storage_options)`` of a moto S3 server with ``bucket`` created: in this
    process (threads), or with ``process`` in a child process of its own (``moto_server``; the
    bench, so that the server's GIL is not the client's)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if process:
        with _moto_process() as endpoint:
            _make_bucket(endpoint, bucket)
            yield endpoint, s3_options(endpoint)
        return
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        _make_bucket(endpoint, bucket)
        yield endpoint, s3_options(endpoint)
    finally:
        server.stop()


@contextmanager
def _moto_process():
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def _make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)


def s3_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage_options for a moto endpoint (or a proxy in front of it)."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


# -- GCS (gcp-storage-emulator) --------------------------------------------------------------------
@contextmanager
def gcs_emulator(bucket: str = "rowstore"):
    """``(endpoint_url, storage_options)`` of a ``gcp-storage-emulator`` server in this process
    with ``bucket`` created.

    The emulator's request handler is served by our own ``HTTPServer`` (one request at a time,
    as the emulator's own server, whose in-memory store is not thread-safe) with a listen
    backlog for the 32 requests a reader keeps in flight, and quiet about clients that close
    early. gcsfs's experimental zonal/HNS layer is turned off before gcsfs is first imported:
    it asks the gRPC Storage Control API (which no emulator serves) for the bucket's type, for
    a minute per call."""
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import gcsfs
    from gcp_storage_emulator.handlers import buckets
    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    if gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
        raise RuntimeError(
            "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set"
        )

    class Server(HTTPServer):
        request_queue_size = 128

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that closed its connection early (a cancelled request)

    storage = Storage(use_memory_fs=True)
    buckets.create_bucket(bucket, storage)
    httpd = Server(("127.0.0.1", 0), partial(RequestHandler, storage))
    thread = threading.Thread(target=httpd.serve_forever, name="gcs-emulator", daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield endpoint, gcs_options(endpoint)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(scaled(10))


def gcs_options(endpoint: str) -> dict[str, Any]:
    """fsspec storage_options for the emulator at ``endpoint`` (no credentials)."""
    return {"endpoint_url": endpoint, "token": "anon"}


# -- HTTP with Range ---------------------------------------------------------------------------
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _RangeHandler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _etag(self, path: str) -> str:
        st = os.stat(path)
        return (
            '"'
            + hashlib.md5(f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest()
            + '"'
        )

    def _target(self) -> str | None:
        path = self.translate_path(self.path.split("?", 1)[0])
        return path if os.path.isfile(path) else None

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        self.server.requests += 1  # type: ignore[attr-defined]
        path = self._target()
        if self.path.startswith("/private/"):  # what a server refusing the credentials answers
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag = self._etag(path)
        match = self.headers.get("If-Match")
        if match and match != etag and match != "*":
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = os.path.getsize(path)
        start, end = 0, size
        rng = self.headers.get("Range")
        status = 200
        if rng:
            m = _RANGE.match(rng.strip())
            if not m or int(m.group(1)) >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m.group(1))
            end = min(size, int(m.group(2)) + 1) if m.group(2) else size
            status = 206
        mode = self.server.misbehave  # type: ignore[attr-defined]
        if rng and mode == "ignore-range":
            status, start, end = 200, 0, size
        elif rng and mode in ("long-body", "unsized-body"):
            end = size  # the rest of the object, whatever the range asked for
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header(
            "Last-Modified", email.utils.formatdate(os.path.getmtime(path), usegmt=True)
        )
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        if rng and mode == "unsized-body":  # no length: the body ends when the connection does
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if body:
            with open(path, "rb") as f:
                f.seek(start)
                left = end - start
                while left:
                    # 64 KiB pieces: a test that measures the allocations of its process
                    # (tracemalloc counts this thread too) sees little of the server's, also
                    # while handlers of earlier requests still write to a closed connection.
                    chunk = f.read(min(left, 64 << 10))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many connections at once (the default backlog of 5 refuses some)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(
            sys.exc_info()[1], (ConnectionError, OSError)
        ):  # a client that hung up is normal
            super().handle_error(request, client_address)


class RangeHTTPServer:
    """Serves ``root`` on ``http://127.0.0.1:PORT`` (threads; ``requests`` counts requests).

    ``misbehave`` makes it answer ranged GETs wrongly: ``"ignore-range"`` (200 and the whole
    object), ``"long-body"`` (206, and the object from the range's start to its end, with that
    Content-Length) or ``"unsized-body"`` (the same without a Content-Length, the body ending
    when the connection closes).
    """

    def __init__(self, root: str, *, misbehave: str | None = None):
        handler = lambda *a, **kw: _RangeHandler(*a, directory=root, **kw)  # noqa: E731
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.requests = 0  # type: ignore[attr-defined]
        self.httpd.misbehave = misbehave  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def requests(self) -> int:
        return self.httpd.requests  # type: ignore[attr-defined]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def http_process(root: str):
    """The URL of a :class:`RangeHTTPServer` serving ``root`` from a child process of its own
    (the bench: the server's GIL is not the proxy's or the client's)."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        f"import sys, time; sys.path.insert(0, {here!r}); import _servers; "
        f"s = _servers.RangeHTTPServer({root!r}); print(s.url, flush=True); time.sleep(1e9)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.kill()
        proc.wait(10)


# -- fault-injecting proxy -----------------------------------------------------------------------
_RETIRED_LOOPS: list[asyncio.AbstractEventLoop] = []  # stopped, left open (see FaultProxy.close)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``upstream`` ("host:port"), on its own event loop.

    ``latency`` seconds are added before each request is forwarded (first-byte latency,
    per request, without blocking other connections). ``fault(n, head)`` is asked for every
    ranged GET (with ``every_request``, every request; ``n`` counts them from 1, ``head`` is the
    request's first bytes) and returns
    None, ``"503"``, ``"reset"`` (a TCP RST), ``"stall"`` (nothing sent until the proxy is
    closed, or for ``stall`` seconds, then closed: only the client's timeout ends it), ``"cut"``
    (the request is forwarded and the response's status line, headers and first ``cut`` bytes
    of its body pass, then a TCP RST: a connection lost mid-read of a block) or
    ``"drop-range"`` (forwarded without its ``Range`` header: what a proxy or server ignoring
    Range answers). ``ranged`` counts ranged GETs, ``injected`` the faults injected.
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency: float = 0.0,
        stall: float | None = None,
        fault: Callable[[int, bytes], str | None] | None = None,
        every_request: bool = False,
        cut: int = 100,
    ):
        self.up_host, up_port = upstream.rsplit(":", 1)
        self.up_port = int(up_port)
        self.latency, self.stall, self.fault, self.every_request = (
            latency,
            stall,
            fault,
            every_request,
        )
        self.cut = cut
        self.ranged = 0
        self.injected = 0
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(scaled(30)):
            raise RuntimeError("the fault proxy's event loop did not start")
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def _decide(self, head: bytes) -> str | None:
        ranged = head.startswith(b"GET ") and b"\r\nrange:" in head.lower()
        if not ranged and not (
            self.every_request and head[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST")
        ):
            return None
        with self._lock:
            self.ranged += 1
            n = self.ranged
        action = self.fault(n, head) if self.fault else None
        if action:
            with self._lock:
                self.injected += 1
        return action

    async def _conn(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            ureader, uwriter = await asyncio.open_connection(self.up_host, self.up_port)
        except OSError:
            cwriter.close()
            return
        conn: dict[str, Any] = {"cut": None}  # body bytes still let through before a reset
        back = asyncio.ensure_future(self._pump(ureader, cwriter, conn))
        try:
            while True:
                data = await creader.read(1 << 16)
                if not data:
                    break
                action = self._decide(data)
                if action == "503":
                    cwriter.write(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: "
                        b"close\r\n\r\n"
                    )
                    await cwriter.drain()
                    break
                if action == "reset":
                    sock = cwriter.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    break
                if action == "stall":  # until close() cancels it, or ``stall`` seconds
                    forever = asyncio.get_running_loop().create_future()
                    await (asyncio.sleep(self.stall) if self.stall is not None else forever)
                    break
                if action == "cut":
                    conn.update(cut=self.cut, body=False, tail=b"")
                if action == "drop-range":  # the server then answers 200 with the whole object
                    data = re.sub(rb"\r\nrange:[^\r]*", b"", data, count=1, flags=re.IGNORECASE)
                if self.latency and data[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST"):
                    await asyncio.sleep(self.latency)
                uwriter.write(data)
                await uwriter.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            back.cancel()
            for w in (uwriter, cwriter):
                try:
                    w.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    pass

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: dict | None = None
    ) -> None:
        try:
            while True:
                data = await reader.read(1 << 18)
                if not data:
                    break
                keep = (
                    FaultProxy._cut(conn, data)
                    if conn is not None and conn["cut"] is not None
                    else None
                )
                if keep is not None:  # a "cut" response: its first bytes, then a TCP RST
                    writer.write(data[:keep])
                    await writer.drain()
                    sock = writer.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    writer.transport.abort()
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    @staticmethod
    def _cut(conn: dict, data: bytes) -> int | None:
        """For a "cut" response: None to let ``data`` through, else how many of its bytes to
        send before the reset (the headers, then ``conn["cut"]`` bytes of body)."""
        start = 0
        if not conn["body"]:
            seen = conn["tail"] + data
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                conn["tail"] = seen[-3:]
                return None
            conn["body"] = True
            start = end + 4 - len(conn["tail"])
        if len(data) - start <= conn["cut"]:
            conn["cut"] -= len(data) - start
            return None
        return start + conn["cut"]

    def close(self) -> None:
        """Stop listening, end every connection (a stall too), then the loop (left open: a
        transport collected later must not find it closed)."""

        async def stop() -> None:
            self.server.close()
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(scaled(30))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(scaled(30))
        _RETIRED_LOOPS.append(self.loop)  # never collected: no "unclosed event loop" warning


class FirstTries:
    """A :class:`FaultProxy` ``fault`` schedule counted in requests: of the distinct requests
    (request line and ``Range``), every ``every``-th one (the 1st, the ``every + 1``-th, ...)
    fails on its first ``tries`` tries, with the next of ``kinds`` each time, until ``kinds``
    is used up; every other try passes. No request fails more than ``tries`` times whatever
    the speed of the machine or the order concurrent requests arrive in, so a client retrying
    more than ``tries`` times always gets through; ``faulted`` counts the distinct requests
    that failed.
    """

    def __init__(self, kinds: tuple[str, ...], *, every: int = 3, tries: int = 1):
        self.kinds, self.every, self.tries = tuple(kinds), every, tries
        self._left: dict[bytes, int] = {}  # failures still to inject, per distinct request
        self._given = 0  # kinds handed to distinct requests so far
        self._used = 0  # kinds injected so far
        self._lock = threading.Lock()
        self.faulted = 0

    @staticmethod
    def key(head: bytes) -> bytes:
        lines = head.split(b"\r\n")
        rng = next((ln.lower() for ln in lines if ln.lower().startswith(b"range:")), b"")
        return lines[0] + b"|" + rng

    def __call__(self, n: int, head: bytes) -> str | None:
        key = self.key(head)
        with self._lock:
            if key not in self._left:
                share = 0
                if len(self._left) % self.every == 0:
                    share = min(self.tries, len(self.kinds) - self._given)
                self._left[key] = share
                self._given += share
                self.faulted += share > 0
            if not self._left[key]:
                return None
            self._left[key] -= 1
            self._used += 1
            return self.kinds[self._used - 1]


# -- pytest fixtures (imported by tests/conftest.py) --------------------------------------------
def _fixtures():
    import pytest

    @pytest.fixture(scope="session")
    def s3_server():
        """``(endpoint_url, storage_options)`` of one moto S3 server for the session (bucket
        ``rowstore``)."""
        with moto_s3() as got:
            yield got

    @pytest.fixture(scope="session")
    def gcs_server():
        """``(endpoint_url, storage_options)`` of one GCS emulator for the session (bucket
        ``rowstore``)."""
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # before gcsfs is imported
        pytest.importorskip("gcsfs")
        pytest.importorskip("gcp_storage_emulator")
        with gcs_emulator() as got:
            yield got

    @pytest.fixture(scope="session")
    def http_factory():
        """``http_factory(root, **kw)``: a :class:`RangeHTTPServer` serving ``root`` (closed at
        the end)."""
        servers: list[RangeHTTPServer] = []

        def make(root: str, **kw: Any) -> RangeHTTPServer:
            srv = RangeHTTPServer(root, **kw)
            servers.append(srv)
            return srv

        yield make
        for srv in servers:
            srv.close()

    return s3_server, gcs_server, http_factory


s3_server, gcs_server, http_factory = _fixtures()
