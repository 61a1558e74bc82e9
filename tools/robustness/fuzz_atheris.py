"""Coverage-guided fuzzing of the read path with atheris (libFuzzer).

    scripts/fuzz_venv.sh && scripts/build_sanitized.sh fuzz      # once: .fuzz-venv, build/fuzz
    .fuzz-venv/bin/python tools/robustness/fuzz_atheris.py --minutes 10     # the campaign (make
    fuzz)
    python tools/robustness/fuzz_atheris.py --replay tests/data/atheris     # no atheris needed

The target, :func:`one_input`, turns the fuzzer's bytes into a rowstore file and reads it with
the oracle of ``tools/robustness/fuzz.py`` (a ``RowstoreError``, or exactly the rows written;
anything else
is a finding). The bytes are decoded by :class:`Bytes`, a plain consumer (no
``atheris.FuzzedDataProvider``), so that the suite replays the committed corpus and crashers
through the normal build without atheris (``tests/robustness/test_fuzz_atheris.py``).

Input layout: byte 0 chooses the mode.

* ``mode % 8 == 0`` (raw): the rest of the input is the whole file (libFuzzer's own byte-level
  mutations of the two seed files, committed as corpus entries ``raw-*``).
* otherwise (structure-aware): byte 1 picks a seed file of ``tests/data/atheris/seeds`` (50
  rows, raw and lz4, written by ``tools/robustness/fuzz.py``'s ``seed_rows``), byte 2 the number of
  operations (1-4), then each operation: set or xor bytes inside a block or heap chunk, a heap
  reference of a row (offset/nbytes/shape, raw seed), a byte of a Blosc2 frame or chunk header,
  a field of a block or heap-chunk index entry (offsets, sizes, rows, heap ranges), a byte
  anywhere, a truncation, a chunk range copied over another. Unless ``mode == 7``, every index
  entry's CRC-32 is then recomputed over the bytes it now points at ("resealed"), so damage
  reaches the kernels (frame parsing, decompression, gathers, heap references) past the
  checksum; mode 7 leaves the CRCs as they were (the checks must refuse it).

Findings: an exception other than ``RowstoreError`` (or ``OSError`` with an errno), wrong data
(raised as :class:`Finding`), a crash (ASan/UBSan report or signal), a timeout (``-timeout``) or
an allocation past ``-malloc_limit_mb``/``-rss_limit_mb`` (ASan cannot run under an
``RLIMIT_AS``: its shadow memory is terabytes of reserved address space; libFuzzer's limits are
the bound here). libFuzzer saves each as ``crash-*``/``timeout-*``/``oom-*`` under
``--crashers`` (default ``bench/results/atheris-work/crashers``; commit them to
``tests/data/atheris/crashers``, which the suite replays).

Coverage: Python lines of ``rowstore`` through ``atheris.instrument_imports``, and the Cython
kernels' C edges and comparisons through clang's ``-fsanitize=fuzzer-no-link`` (build/fuzz);
the C code is only counted when the extensions are built that way and atheris'
``asan_with_fuzzer.so`` is preloaded, as the driver (``--minutes``) does. libFuzzer's ``cov:``
(edges) and ``ft:`` (features) are printed and saved in ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if (
    ROOT not in sys.path
):  # this checkout's rowstore (a sanitized build/<kind> put first on PYTHONPATH wins)
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz  # noqa: E402 - tools/robustness/fuzz.py: the seeds, the oracle and the child runner

DATA = os.path.join(ROOT, "tests", "data", "atheris")
SEEDS = os.path.join(DATA, "seeds")
WORK = os.path.join(ROOT, "bench", "results", "atheris-work")

#: Values an edited size, offset or count takes (besides raw fuzzer bytes).
ODD = (
    0,
    1,
    2,
    7,
    8,
    31,
    32,
    255,
    256,
    4096,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**40,
    2**48,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 1,
)


class Finding(Exception):
    """What the oracle saw that is neither a RowstoreError nor the rows written."""


class Bytes:
    """Deterministic consumer of the fuzzer's bytes; past the end everything reads as 0."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out + bytes(n - len(out))

    def u8(self) -> int:
        return self.take(1)[0]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")

    def value(self, width: int) -> int:
        """A ``width``-byte value: one of ODD, a small number, or raw bytes."""
        how = self.u8() % 4
        if how == 0:
            v = ODD[self.u8() % len(ODD)]
        elif how == 1:
            v = self.u8()
        else:
            v = self.uint(width)
        return v % (1 << (8 * width))


# --------------------------------------------------------------------------- seeds

_SEEDS: list[dict] | None = None


#: The seed files, in the order an input's seed byte picks them: ``tools/robustness/fuzz.py``'s two
#: (rows_per_block=8, raw and lz4) and an uncompressed one of 256 rows per block (a block larger
#: than the reader's cost model takes for single rows, so single-row reads use the direct
#: kernels of ``_io``: ``pread_rows``, ``preadv_rows``, ``pread_heap``).
SEED_NAMES = ("seed-lz4.h5", "seed-raw.h5", "seed-raw-direct.h5")


def build_seed_files(out: str) -> None:
    """Write the seed files that are missing (committed in tests/data/atheris/seeds: lz4 output
    is not byte-stable across runs, and the corpus' structure-aware inputs mean offsets in these
    exact bytes, so existing seeds are never rewritten)."""
    import rowstore

    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        built = {
            name + ".h5": path for name, path in fuzz.build_seeds(tmp, with_image=False).items()
        }
        path = built["seed-raw-direct.h5"] = os.path.join(tmp, "seed-raw-direct.h5")
        with rowstore.Writer(
            path,
            fuzz.seed_schema(False),
            compression=None,
            rows_per_block=256,
            heap_chunk_bytes=4096,
        ) as w:
            for r in fuzz.seed_rows(False):
                w.write(r)
        for name in SEED_NAMES:
            if not os.path.exists(os.path.join(out, name)):
                shutil.copyfile(built[name], os.path.join(out, name))


def _seed_info(path: str) -> dict:
    import h5py

    smap = fuzz.structure_map(path)
    with h5py.File(path, "r") as f:
        g = f["rowstore"]
        index = {}
        for name in ("blocks", "heap_chunks"):
            if name in g:
                ds = g[name]
                index[name] = (int(ds.id.get_offset()), int(ds.shape[0]), ds.dtype)
    with open(path, "rb") as fh:
        data = fh.read()
    chunks = [r for r in smap["regions"] if r[0] in ("block", "heap")]
    return {
        "name": os.path.basename(path),
        "data": data,
        "smap": smap,
        "index": index,
        "chunks": chunks,
    }


def seeds() -> list[dict]:
    global _SEEDS
    if _SEEDS is None:
        missing = [n for n in SEED_NAMES if not os.path.exists(os.path.join(SEEDS, n))]
        if missing:
            raise SystemExit(
                f"seed files {missing} missing from {SEEDS} (tools/robustness/fuzz_atheris.py "
                f"--make-seeds)"
            )
        _SEEDS = [_seed_info(os.path.join(SEEDS, n)) for n in SEED_NAMES]
    return _SEEDS


# --------------------------------------------------------------------------- inputs -> files


def _entries(buf: bytearray, index: dict, name: str):
    off, n, dt = index[name]
    if off + n * dt.itemsize > len(buf):
        return None
    return np.frombuffer(buf, dt, count=n, offset=off)  # a view: writes go into buf


def reseal(buf: bytearray, seed: dict) -> None:
    """Recompute the CRC-32 of every index entry over the bytes it points at (where in range)."""
    for name in ("blocks", "heap_chunks"):
        if name not in seed["index"]:
            continue
        arr = _entries(buf, seed["index"], name)
        if arr is None:
            continue
        for e in arr:
            a, n = int(e["offset"]), int(e["stored_nbytes"])
            if a + n <= len(buf):
                e["checksum"] = zlib.crc32(bytes(buf[a : a + n]))


def _op(b: Bytes, buf: bytearray, seed: dict, exact: bool) -> tuple[dict, bool]:
    """Apply one operation; returns (description, stop)."""
    chunks = seed["chunks"]
    code = b.u8() % 8
    if exact and code in (4, 5, 7):  # index edits, chunk copies, the schema attribute: what no
        code = 0  # checksum of a v1 file covers
    if code in (0, 1):  # set / xor bytes inside a chunk
        _, a, z = chunks[b.u8() % len(chunks)]
        p = a + b.uint(2) % (z - a)
        vals = b.take(1 + b.u8() % 8)[: z - p]
        for i, v in enumerate(vals):
            buf[p + i] = v if code == 0 else buf[p + i] ^ (v or 1)
        return {"op": "chunk-set" if code == 0 else "chunk-xor", "at": p, "n": len(vals)}, False
    if code == 2:  # a heap reference of a row (uncompressed seeds: rows are stored as they are)
        smap = seed["smap"]
        blocks = [r for r in chunks if r[0] == "block"]
        _, a, z = blocks[b.u8() % len(blocks)]
        row = b.u8() % max(1, (z - a) // smap["row_size"])
        start, length, what = smap["refs"][b.u8() % len(smap["refs"])]
        if length not in (1, 2, 4, 8):  # the shape column: (k,) <u4
            start += 4 * (b.u8() % (length // 4))
            length = 4
        p = a + row * smap["row_size"] + start
        if smap["compressed"] or p + length > len(buf):
            p = a + b.uint(2) % (z - a)
            length = min(length, z - p)
        buf[p : p + length] = b.value(length).to_bytes(8, "little")[:length]
        return {"op": "heap-ref", "at": p, "field": what}, False
    if code == 3:  # a Blosc2 frame or chunk header byte (first 64 bytes of a chunk)
        _, a, z = chunks[b.u8() % len(chunks)]
        h = int.from_bytes(bytes(buf[a + 11 : a + 15]), "big") if z - a > 15 else 0
        base = a + h if b.u8() % 2 and 16 <= h < z - a else a
        p = min(z - 1, base + b.u8() % 64)
        buf[p] = b.u8()
        return {"op": "blosc-header", "at": p}, False
    if code == 4:  # a field of an index entry
        names = sorted(seed["index"])
        name = names[b.u8() % len(names)]
        arr = _entries(buf, seed["index"], name)
        if arr is None:
            return {"op": "index", "skipped": True}, False
        e = arr[b.u8() % len(arr)]
        field = arr.dtype.names[b.u8() % len(arr.dtype.names)]
        e[field] = b.value(8)
        return {"op": "index", "index": name, "field": field, "value": int(e[field])}, False
    if code == 5:  # any byte of the file
        p = b.uint(4) % len(buf)
        buf[p] = b.u8()
        return {"op": "set", "at": p}, False
    if code == 6:  # truncate
        p = b.uint(4) % len(buf)
        del buf[p:]
        return {"op": "truncate", "at": p}, True
    # copy one chunk's bytes over another's (same length or the shorter)
    _, a, z = chunks[b.u8() % len(chunks)]
    _, c, d = chunks[b.u8() % len(chunks)]
    n = min(z - a, d - c)
    buf[c : c + n] = buf[a : a + n]
    return {"op": "copy-chunk", "from": a, "to": c, "n": n}, False


def build_case(data: bytes) -> tuple[bytes, list[dict]]:
    """The file an input stands for, and the operations that made it."""
    b = Bytes(data)
    mode = b.u8() % 8
    if mode == 0:
        return data[1:], [{"op": "raw", "n": len(data) - 1}]
    ss = seeds()
    seed = ss[b.u8() % len(ss)]
    buf = bytearray(seed["data"])
    ops = [{"seed": seed["name"], "reseal": mode != 7}]
    for _ in range(1 + b.u8() % 4):
        if not len(buf):
            break
        op, stop = _op(b, buf, seed, exact=mode == 7)
        ops.append(op)
        if stop:
            break
    if mode != 7:
        reseal(buf, seed)
    return bytes(buf), ops


# --------------------------------------------------------------------------- the oracle


#: Rows read by the consistency oracle of a file that declares more (the seeds have 50).
MAX_CHECKED_ROWS = 4096


def check_file(path: str, exact: bool = True) -> str:
    """The read-path oracle, lighter than ``fuzz.run_oracle`` (the fuzzer wants many executions
    a second): open, ``take`` of every row, ``batches`` in file order, ``r[0]`` and
    ``Layout.verify()``. ``exact``: the values must be the rows written; otherwise (a resealed
    file: its CRCs vouch for the edited bytes, which may rightly read as other values) the two
    read paths must agree with each other. Returns ``"ok"`` or ``"rowstore-error"``; raises
    :class:`Finding` for anything else."""
    import rowstore

    schema = fuzz.seed_schema(False)
    names = [f.name for f in schema]
    nullable = {f.name for f in schema if f.nullable}
    expected = _expected()
    try:
        with rowstore.open(path) as r:
            n = len(r)
            if exact and (n != len(expected) or [f.name for f in r.schema] != names):
                raise Finding(f"WRONG-DATA: open: {n} rows, fields {[f.name for f in r.schema]}")
            names = [f.name for f in r.schema]
            nullable = {f.name for f in r.schema if f.nullable}
            fixed = [
                f.name
                for f in r.schema
                if f.dtype not in ("str", "bytes") and None not in f.shape and not f.nullable
            ]
            # Single rows first, while no block is loaded: the direct reads (large blocks of an
            # uncompressed file), all fields (pread_rows + pread_heap) and fixed ones (preadv_rows).
            single = []
            for i in sorted({0, n // 2, n - 1}) if n else ():
                one = fuzz._batch_rows(r.take([i], varlen="ragged"), names, nullable)
                part = (
                    fuzz._batch_rows(r.take([i], fields=fixed, varlen="ragged"), fixed, set())
                    if fixed
                    else None
                )
                single.append((i, one, part))
            k = min(n, MAX_CHECKED_ROWS)
            t = (
                fuzz._batch_rows(r.take(np.arange(k), varlen="ragged"), names, nullable)
                if k
                else []
            )
            if exact:
                fuzz._check_rows(t, expected, True, "take")
            for i, one, part in single:
                if i < k:
                    fuzz._check_rows(one, t[i : i + 1], True, f"take([{i}]) vs take")
                    if part is not None:
                        cols = [names.index(c) for c in fixed]
                        fuzz._check_rows(
                            part,
                            [tuple(t[i][c] for c in cols)],
                            True,
                            f"take([{i}], fields) vs take",
                        )
            if n <= MAX_CHECKED_ROWS:
                got = []
                for bt in r.batches(16, shuffle="none", num_threads=1, varlen="ragged"):
                    got += fuzz._batch_rows(bt, names, nullable)
                fuzz._check_rows(got, t, True, "batches vs take")
            if k:
                fuzz._check_rows([fuzz._canon_row(r[0], names)], t[:1], True, "r[0] vs take")
            r.layout.verify()
    except rowstore.RowstoreError:
        return "rowstore-error"
    except OSError as exc:
        if exc.errno is None:
            raise Finding(f"OSError without errno: {exc!r}") from exc
        return "rowstore-error"
    except fuzz._Wrong as exc:
        raise Finding(f"WRONG-DATA: {exc}") from exc
    return "ok"


_EXPECTED: list | None = None


def _expected() -> list:
    global _EXPECTED
    if _EXPECTED is None:
        names = [f.name for f in fuzz.seed_schema(False)]
        _EXPECTED = [fuzz._canon_row(r, names) for r in fuzz.seed_rows(False)]
    return _EXPECTED


_CASE_DIR: str | None = None


def one_input(data: bytes) -> str:
    """The fuzz target: the file of ``data`` through :func:`check_file`."""
    global _CASE_DIR
    if _CASE_DIR is None:
        _CASE_DIR = tempfile.mkdtemp(
            prefix="rowstore-atheris-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        )
    blob, ops = build_case(data)
    path = os.path.join(_CASE_DIR, "case.h5")
    with open(path, "wb") as fh:
        fh.write(blob)
    return check_file(path, exact=is_exact(ops))


def is_exact(ops: list[dict]) -> bool:
    """Whether the exact-rows oracle applies: mode 7 (CRCs left as they were). Raw inputs and
    resealed ones get the consistency oracle: raw byte mutations can edit the schema attribute or
    swap index entries of a single v1 file, which no checksum covers (docs/reliability.md, "Not
    covered yet"; tools/robustness/fuzz.py measures that with the exact oracle)."""
    return ops[0].get("reseal") is False


def initial_corpus(out: str) -> None:
    """Starting inputs: each seed as a raw input, and one structure-aware input per operation
    and seed (resealed), so the fuzzer starts past the checksums."""
    os.makedirs(out, exist_ok=True)
    entries = []
    for i, s in enumerate(seeds()):
        entries.append(b"\x00" + s["data"])
        for code in range(8):
            entries.append(bytes([1, i, 0, code, 3, 17, 1, 2, 0x41, 0x42, 5, 9]))
            entries.append(bytes([7, i, 0, code, 1, 40, 0, 1, 0xFF]))
    for e in entries:
        with open(os.path.join(out, hashlib.sha1(e).hexdigest()), "wb") as fh:
            fh.write(e)


# --------------------------------------------------------------------------- replay (no atheris)


def replay_oracle(path: str, exact: bool, progress=None) -> dict:
    """:func:`check_file` in ``tools/robustness/fuzz.py``'s result format (its child runs this)."""
    if progress is not None:
        progress("check")
    try:
        return {"outcome": check_file(path, exact), "steps": []}
    except Finding as exc:
        wrong = str(exc).startswith("WRONG-DATA")
        return {
            "outcome": "WRONG-DATA" if wrong else "LEAKED",
            "steps": [{"step": "check", "message": str(exc)[:300]}],
        }
    except BaseException as exc:  # noqa: BLE001 - the oracle classifies everything
        return {"outcome": "LEAKED", "steps": [fuzz._leak("check", exc)]}


def replay(paths: list[str], timeout: float = 10.0) -> dict:
    """Every input under ``paths`` (files or directories) through the fuzzer's oracle
    (:func:`check_file`), each in a child process of ``tools/robustness/fuzz.py`` (a timeout, and
    ``RLIMIT_AS`` 4 GiB unless sanitized: a crash or hang is an outcome, not the end of the
    run). Returns counts and the inputs whose outcome was not ok/rowstore-error."""
    files = []
    for p in paths:
        files += (
            sorted(
                q
                for q in glob.glob(os.path.join(p, "**", "*"), recursive=True)
                if os.path.isfile(q)
            )
            if os.path.isdir(p)
            else [p]
        )
    files = [f for f in files if not f.endswith((".md", ".json"))]
    mem = 0 if "asan" in os.environ.get("LD_PRELOAD", "") else 4 << 30
    counts = dict.fromkeys(fuzz.OUTCOMES, 0)
    bad = []
    tmp = tempfile.mkdtemp(prefix="rowstore-atheris-replay-")
    child = fuzz.Child(mem, "fuzz_atheris:replay_oracle")
    try:
        for i, src in enumerate(files):
            with open(src, "rb") as fh:
                blob, ops = build_case(fh.read())
            case = os.path.join(tmp, "case.h5")
            with open(case, "wb") as fh:
                fh.write(blob)
            res, alive = child.run(i, case, is_exact(ops), timeout)
            counts[res["outcome"]] += 1
            if res["outcome"] in fuzz.BAD:
                bad.append({"input": os.path.relpath(src, ROOT), "ops": ops, **res})
            if not alive:
                child = fuzz.Child(mem, "fuzz_atheris:replay_oracle")
    finally:
        child.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"inputs": len(files), "by_outcome": counts, "bad": bad}


# --------------------------------------------------------------------------- the campaign

_STAT = re.compile(
    r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+)(?: corp: (\d+)/(\S+))?.*?(?:exec/s: (\d+))?", re.M
)


def _runtime() -> str:
    import importlib.util

    spec = importlib.util.find_spec("atheris")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "atheris is not installed: scripts/fuzz_venv.sh, then .fuzz-venv/bin/python"
        )
    lib = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "asan_with_fuzzer.so")
    if not os.path.exists(lib):
        raise SystemExit(f"{lib} missing (atheris wheel without its sanitizer runtimes?)")
    return lib


def campaign(args) -> int:
    """Run libFuzzer for ``--minutes``, restarting it after each finding (the corpus carries
    over), and report executions, coverage and findings."""
    build = os.path.join(ROOT, "build", "fuzz")
    native = bool(glob.glob(os.path.join(build, "rowstore", "_frame*.so"))) and not args.no_native
    if not native and not args.no_native:
        print(
            "build/fuzz missing (scripts/build_sanitized.sh fuzz): Python coverage only",
            file=sys.stderr,
        )
    work = args.work
    corpus = os.path.join(work, "corpus")
    crashers = os.path.abspath(args.crashers) + os.sep
    os.makedirs(crashers, exist_ok=True)
    if not os.path.isdir(corpus) or not os.listdir(corpus):
        initial_corpus(corpus)
    committed = os.path.join(DATA, "corpus")
    dirs = [corpus] + ([committed] if os.path.isdir(committed) and os.listdir(committed) else [])
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=0:allocator_may_return_null=0:handle_abort=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    if native:
        env["LD_PRELOAD"] = _runtime()
        env["PYTHONPATH"] = os.pathsep.join([build, ROOT])
    else:
        env["PYTHONPATH"] = ROOT
    malloc_mb = (1 << 30) // (1 << 20) + 64  # MAX_CHUNK_BYTES (one block) and some slack
    if args.merge:  # minimize the working corpus into the committed one (libFuzzer -merge=1)
        os.makedirs(args.merge, exist_ok=True)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            os.path.abspath(args.merge),
            *[d for d in dirs if os.path.abspath(d) != os.path.abspath(args.merge)],
            "-merge=1",
            f"-timeout={int(args.timeout)}",
            f"-rss_limit_mb={args.rss_mb}",
            "-max_len=32768",
        ]
        proc = subprocess.run(
            cmd,
            cwd=build if native else ROOT,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
        )
        print(proc.stdout[-1500:] + proc.stderr[-1500:], file=sys.stderr)
        print(f"{len(os.listdir(args.merge))} inputs in {args.merge}")
        return proc.returncode
    t_end = time.monotonic() + 60 * args.minutes
    runs, execs, cov, ft, findings, log_lines = 0, 0, 0, 0, [], []
    log = open(os.path.join(work, "libfuzzer.log"), "a", buffering=1)
    while True:
        left = int(t_end - time.monotonic())
        if left < 5:
            break
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            *dirs,
            f"-max_total_time={left}",
            f"-timeout={int(args.timeout)}",
            f"-rss_limit_mb={args.rss_mb}",
            f"-malloc_limit_mb={malloc_mb}",
            f"-max_len={args.max_len}",
            "-len_control=0",
            f"-artifact_prefix={crashers}",
            "-print_final_stats=1",
            f"-seed={args.seed + runs}",
            "-reload=0",
        ]
        runs += 1
        proc = subprocess.Popen(
            cmd,
            cwd=build if native else ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        last_execs = 0
        for line in proc.stdout:
            log.write(line)
            m = _STAT.match(line)
            if m:
                last_execs = int(m.group(1))
                cov, ft = max(cov, int(m.group(3))), max(ft, int(m.group(4)))
                if not args.quiet and m.group(2) in ("INITED", "DONE", "pulse"):
                    print(line.rstrip(), file=sys.stderr)
            elif line.startswith("stat::number_of_executed_units:"):
                last_execs = int(line.split(":")[-1])
            elif "Test unit written to" in line:
                findings.append(line.rsplit(" ", 1)[-1].strip())
                print(line.rstrip(), file=sys.stderr)
            elif "ERROR:" in line or "Uncaught Python exception" in line or "==ERROR" in line:
                log_lines.append(line.rstrip()[:300])
                print(line.rstrip(), file=sys.stderr)
        proc.wait()
        execs += last_execs
    log.close()
    report = {
        "minutes": args.minutes,
        "native_coverage": native,
        "libfuzzer_runs": runs,
        "executions": execs,
        "cov_edges": cov,
        "features": ft,
        "corpus_inputs": len(os.listdir(corpus)),
        "findings": findings,
        "errors": log_lines[:50],
        "seed": args.seed,
    }
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    print(json.dumps(report, indent=1))
    return 0


def worker(argv: list[str]) -> None:
    """Inside libFuzzer: instrument rowstore's Python, import everything the oracle uses, fuzz."""
    import atheris

    with atheris.instrument_imports(include=["rowstore"]):
        import rowstore  # noqa: F401
        import rowstore.cli  # noqa: F401

        # the first read imports the rest of the read path lazily: do it here, instrumented
        assert one_input(b"\x00" + seeds()[0]["data"]) == "ok"
    from rowstore import _frame

    print(f"rowstore kernels: {_frame.__file__}", file=sys.stderr, flush=True)

    def target(data: bytes) -> None:
        one_input(data)

    # libFuzzer re-runs argv[0] through the shell for -merge=1 (and -fork): make it this worker
    import shlex

    atheris.Setup(
        [f"{shlex.quote(sys.executable)} {shlex.quote(os.path.abspath(__file__))} --worker", *argv],
        target,
    )
    atheris.Fuzz()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, help="run the coverage-guided campaign this long")
    ap.add_argument(
        "--replay",
        nargs="+",
        metavar="PATH",
        help="run these inputs (files or directories) through the oracle, no atheris needed",
    )
    ap.add_argument(
        "--make-seeds",
        action="store_true",
        help="write the seed files into tests/data/atheris/seeds",
    )
    ap.add_argument("--work", default=WORK, help="libFuzzer's working corpus and log")
    ap.add_argument("--crashers", default=os.path.join(WORK, "crashers"))
    ap.add_argument("--out", default="bench/results/fuzz_atheris.json")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per input")
    ap.add_argument("--rss-mb", type=int, default=4096)
    ap.add_argument(
        "--max-len",
        type=int,
        default=128,
        help="longest input; whole raw files (mode 0 over the seeds) need 32768",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-native", action="store_true", help="the normal build: Python coverage only"
    )
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument(
        "--merge",
        metavar="DIR",
        help="merge the working corpus into DIR (tests/data/atheris/corpus), keeping only inputs "
        "that add coverage",
    )
    args = ap.parse_args(argv)
    if args.make_seeds:
        build_seed_files(SEEDS)
        return 0
    if args.replay:
        rep = replay(args.replay, args.timeout)
        print(json.dumps(rep, indent=1, default=repr))
        return 1 if rep["bad"] else 0
    if args.minutes is None and not args.merge:
        ap.error("give --minutes, --merge, --replay or --make-seeds")
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
