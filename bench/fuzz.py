"""Structure-aware mutation fuzzer for rowstore readers (issue 17, item 1).

    python bench/fuzz.py --minutes N [--seed S] [--out bench/results/fuzz.json]
    python bench/fuzz.py --cases N [--region all|chunks|metadata|index] [--seed S]

Seed files: small valid rowstore files (uncompressed and lz4; int64, float32[4], nullable str,
variable int16 (None, 2), an 8x8x3 PNG when imagecodecs is present; 50 rows, rows_per_block=8,
heap_chunk_bytes=256) built in a temporary directory. Their structures (block chunks, heap
chunks, the index datasets) are located with h5py (``get_chunk_info``, ``id.get_offset()``);
everything else in the file is HDF5 metadata (superblock, object headers, B-trees, heaps, free
space).

Each case applies one to three mutations (see ``KINDS``) and runs the oracle in a child process
(spawned, ``RLIMIT_AS`` 4 GiB, many cases per child, restarted after a crash or hang): open,
``r[0]``, ``take`` of all rows, ``batches`` in block/full/none, ``Layout.verify()`` and
``rowstore verify``. Outcomes, worst step wins:

    ok            every step returned and every value equals what was written
    rowstore-error  a RowstoreError (or OSError with an errno; ``rowstore verify`` exiting 1)
    WRONG-DATA    a step returned without error but a value (or the row count) differs
    LEAKED        any other exception (MemoryError included: an allocation beyond the bounds)
    CRASH         the child was killed by a signal
    HANG          the case ran past --timeout seconds

Every case other than ok/rowstore-error is saved under ``bench/results/fuzz-cases/`` (the mutated
file and a JSON of its mutations); ``--out`` gets counts per outcome and per mutation kind.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import traceback
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # fuzz this checkout's rowstore (spawned children run this too)
    sys.path.insert(0, ROOT)

N_ROWS = 50
OUTCOMES = ("ok", "rowstore-error", "WRONG-DATA", "LEAKED", "CRASH", "HANG")
SEVERITY = {o: i for i, o in enumerate(OUTCOMES)}
BAD = ("WRONG-DATA", "LEAKED", "CRASH", "HANG")


# --------------------------------------------------------------------------- seeds


def _has_imagecodecs() -> bool:
    try:
        import imagecodecs  # noqa: F401
    except ImportError:
        return False
    return True


def seed_schema(with_image: bool):
    from rowstore import Field, Schema

    fields = [
        Field("id", "int64"), Field("x", "float32", (4,)), Field("s", "str", nullable=True),
        Field("v", "int16", (None, 2)),
    ]  # fmt: skip
    if with_image:
        fields.append(Field("img", "uint8", (8, 8, 3), codec="png"))
    return Schema(fields)


def seed_rows(with_image: bool) -> list[dict]:
    rows = []
    for i in range(N_ROWS):
        row = {"id": i, "x": np.full(4, i * 0.5, np.float32), "s": None if i % 4 == 0 else f"s{i}",
               "v": np.full((i % 3, 2), i, np.int16)}  # fmt: skip
        if with_image:
            row["img"] = (np.arange(192, dtype=np.uint8).reshape(8, 8, 3) + i).astype(np.uint8)
        rows.append(row)
    return rows


def build_seeds(tmp: str, with_image: bool) -> dict[str, str]:
    import rowstore

    out = {}
    for comp in (None, "lz4"):
        name = f"seed-{comp or 'raw'}"
        path = os.path.join(tmp, name + ".h5")
        with rowstore.Writer(path, seed_schema(with_image), compression=comp, rows_per_block=8,
                             heap_chunk_bytes=256) as w:  # fmt: skip
            for r in seed_rows(with_image):
                w.write(r)
        out[name] = path
    return out


def structure_map(path: str) -> dict:
    """Byte ranges of every structure: block chunks, heap chunks, index datasets; the rest is
    metadata. Also the positions of heap-reference columns inside a row and the row size."""
    import h5py

    regions = []  # (kind, start, end)
    with h5py.File(path, "r") as f:
        g = f["rowstore"]
        compressed = bool(g["rows"].compression or g["rows"]._filters)
        for name, kind in (("rows", "block"), ("heap", "heap")):
            if name not in g:
                continue
            ds = g[name]
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                regions.append((kind, int(info.byte_offset), int(info.byte_offset + info.size)))
        for name in ("blocks", "heap_chunks"):
            if name in g:
                ds = g[name]
                off = ds.id.get_offset()
                if off is not None:
                    regions.append(("index", int(off), int(off + ds.id.get_storage_size())))
        dt = g["rows"].dtype
        refs = []  # (start within row, length, what)
        for fname in dt.names:
            sub, base = dt.fields[fname][:2]
            if sub.names and "offset" in sub.names:
                for part in sub.names:
                    pdt, poff = sub.fields[part][:2]
                    refs.append((base + poff, pdt.itemsize, f"{fname}.{part}"))
        row_size = dt.itemsize
    size = os.path.getsize(path)
    regions.sort(key=lambda r: r[1])
    meta, pos = [], 0
    for _, a, b in regions:
        if a > pos:
            meta.append(("metadata", pos, a))
        pos = max(pos, b)
    if pos < size:
        meta.append(("metadata", pos, size))
    return {"size": size, "compressed": compressed, "regions": regions, "metadata": meta,
            "refs": refs, "row_size": row_size}  # fmt: skip


# --------------------------------------------------------------------------- mutations

CHUNK_KINDS = ("chunk-bitflip", "chunk-setbyte", "chunk-zero", "row-bytes", "heap-ref", "blosc-frame-header",
               "blosc-chunk-header")  # fmt: skip
META_KINDS = ("meta-bitflip", "meta-setbyte", "meta-zero")
INDEX_KINDS = ("index-bitflip", "index-setbyte")
FILE_KINDS = ("bitflip", "setbyte", "zero-range", "insert-garbage", "truncate-random", "truncate-boundary",
              "append-garbage")  # fmt: skip
KINDS = {"chunks": CHUNK_KINDS, "metadata": META_KINDS, "index": INDEX_KINDS,
         "all": CHUNK_KINDS + META_KINDS + INDEX_KINDS + FILE_KINDS}  # fmt: skip


def _pick_region(rng, smap, kinds):
    cands = [r for r in smap["regions"] if r[0] in kinds] if kinds != ("metadata",) else smap["metadata"]
    cands = [r for r in cands if r[2] > r[1]]
    return cands[rng.integers(len(cands))] if cands else None


def _flip(data, rng, a, b):
    p = int(rng.integers(a, b))
    bit = int(rng.integers(8))
    data[p] ^= 1 << bit
    return {"op": "flip", "at": p, "bit": bit}


def _set(data, rng, a, b):
    p = int(rng.integers(a, b))
    v = int(rng.choice([0, 0xFF, 0x7F, 0x80, 1, int(rng.integers(256))]))
    old = data[p]
    data[p] = v if v != old else (v ^ 0x55)
    return {"op": "set", "at": p, "value": data[p]}


def _zero(data, rng, a, b):
    p = int(rng.integers(a, b))
    n = int(min(b - p, rng.integers(1, 65)))
    data[p : p + n] = bytes(n)
    return {"op": "zero", "at": p, "n": n}


def _chunk_mutation(kind, data, rng, smap):
    """A mutation inside one block or heap chunk; returns the op (or None if not applicable)."""
    if kind in ("blosc-frame-header", "blosc-chunk-header") and not smap["compressed"]:
        kind = "chunk-setbyte"
    if kind in ("row-bytes", "heap-ref"):
        reg = _pick_region(rng, smap, ("block",))
    else:
        reg = _pick_region(rng, smap, ("block", "heap"))
    if reg is None:
        return None
    _, a, b = reg
    if kind == "chunk-bitflip":
        return _flip(data, rng, a, b)
    if kind == "chunk-setbyte":
        return _set(data, rng, a, b)
    if kind == "chunk-zero":
        return _zero(data, rng, a, b)
    if kind == "row-bytes":
        if smap["compressed"]:  # payload after the frame and chunk headers
            h = int.from_bytes(bytes(data[a + 11 : a + 15]), "big")
            lo = min(b - 1, a + h + 32)
            return _set(data, rng, lo, b)
        return _set(data, rng, a, b)
    if kind == "heap-ref":
        if smap["compressed"] or not smap["refs"]:
            return _set(data, rng, a, b)
        row = int(rng.integers((b - a) // smap["row_size"]))
        start, length, what = smap["refs"][int(rng.integers(len(smap["refs"])))]
        p = a + row * smap["row_size"] + start
        val = int(rng.choice([0, 1, 2**31, 2**32 - 1, int(rng.integers(0, 4096))]))
        if length == 8:
            val = int(rng.choice([val, 2**63, 2**64 - 1]))
        chunk = np.frombuffer(bytes(data[p : p + length]), f"<u{length}").copy() if length in (1, 2, 4, 8) else None
        if chunk is None:  # the shape column: (k,) <u4
            p += 4 * int(rng.integers(length // 4))
            length = 4
        data[p : p + length] = int(val % (1 << (8 * length))).to_bytes(length, "little")
        return {"op": "heap-ref", "at": p, "field": what, "value": val % (1 << (8 * length))}
    if kind == "blosc-frame-header":
        h = int.from_bytes(bytes(data[a + 11 : a + 15]), "big")
        hi = a + (h if 16 <= h <= b - a else 32)
        return _set(data, rng, a, min(hi, b))
    if kind == "blosc-chunk-header":
        h = int.from_bytes(bytes(data[a + 11 : a + 15]), "big")
        lo = a + h if 16 <= h < b - a else a
        return _set(data, rng, lo, min(lo + 32, b))
    raise AssertionError(kind)


def mutate(kind: str, data: bytearray, rng, smap) -> tuple[bytearray, dict | None]:
    n = len(data)
    if kind in CHUNK_KINDS:
        return data, _chunk_mutation(kind, data, rng, smap)
    if kind in META_KINDS or kind in INDEX_KINDS:
        reg = _pick_region(rng, smap, ("metadata",) if kind in META_KINDS else ("index",))
        if reg is None:
            return data, None
        _, a, b = reg
        fn = {"bitflip": _flip, "setbyte": _set, "zero": _zero}[kind.split("-", 1)[1]]
        return data, fn(data, rng, a, b)
    if kind == "bitflip":
        return data, _flip(data, rng, 0, n)
    if kind == "setbyte":
        return data, _set(data, rng, 0, n)
    if kind == "zero-range":
        return data, _zero(data, rng, 0, n)
    if kind == "insert-garbage":
        p = int(rng.integers(0, n))
        g = rng.integers(0, 256, int(rng.integers(1, 65)), dtype=np.uint8).tobytes()
        return data[:p] + g + data[p:], {"op": "insert", "at": p, "n": len(g)}
    if kind == "append-garbage":
        g = rng.integers(0, 256, int(rng.integers(1, 4097)), dtype=np.uint8).tobytes()
        return data + g, {"op": "append", "n": len(g)}
    if kind == "truncate-random":
        p = int(rng.integers(0, n))
        return data[:p], {"op": "truncate", "at": p}
    if kind == "truncate-boundary":
        bounds = sorted({x for r in smap["regions"] for x in (r[1], r[2])} | {p for r in smap["regions"] for p in (r[1] + 1, r[2] - 1)})
        bounds = [x for x in bounds if 0 < x < n]
        p = int(bounds[int(rng.integers(len(bounds)))])
        return data[:p], {"op": "truncate", "at": p, "boundary": True}
    raise AssertionError(kind)


# --------------------------------------------------------------------------- oracle (child)


def _canon(v):
    if v is None:
        return None
    if isinstance(v, (str, bytes)):
        return v
    a = np.asarray(v)
    if a.dtype == object:
        return a.item() if a.ndim == 0 else tuple(_canon(x) for x in a.reshape(-1))
    return (a.dtype.str, a.shape, a.tobytes())


def _field(d: dict, k: str):
    if k not in d:  # the file's schema names other fields (a renamed field): not what was written
        raise _Wrong(f"field {k!r} missing from what was read (keys {sorted(d)[:8]})")
    return d[k]


def _canon_row(row: dict, names) -> tuple:
    return tuple(_canon(_field(row, k)) for k in names)


def _batch_rows(batch: dict, names, nullable) -> list[tuple]:
    n = len(_field(batch, names[0]))
    rows = []
    for i in range(n):
        vals = []
        for k in names:
            if k in nullable and _field(batch, k + "__null")[i]:
                vals.append(None)
            else:
                vals.append(_canon(_field(batch, k)[i]))
        rows.append(tuple(vals))
    return rows


class _Wrong(Exception):
    pass


def _check_rows(got: list[tuple], expected: list[tuple], ordered: bool, what: str):
    if ordered:
        if got != expected:
            bad = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), min(len(got), len(expected)))
            raise _Wrong(f"{what}: row {bad} differs ({len(got)} rows read)")
        return
    if sorted(got, key=repr) != sorted(expected, key=repr):
        raise _Wrong(f"{what}: the rows read ({len(got)}) are not the rows written")


def _steps(path: str, expected: list[tuple], names, nullable):
    """Yields (step name, callable); each callable returns normally, raises _Wrong or any error."""
    import rowstore
    from rowstore.cli import main as cli_main

    state = {}

    def op():
        state["r"] = rowstore.open(path)
        if len(state["r"]) != len(expected):
            raise _Wrong(f"open: {len(state['r'])} rows, {len(expected)} written")
        if [f.name for f in state["r"].schema] != list(names):
            raise _Wrong(f"open: fields {[f.name for f in state['r'].schema]}, {list(names)} written")

    def first():
        _check_rows([_canon_row(state["r"][0], names)], expected[:1], True, "r[0]")

    def take():
        t = state["r"].take(np.arange(len(expected)), varlen="ragged")
        _check_rows(_batch_rows(t, names, nullable), expected, True, "take")

    def batches(shuffle):
        def go():
            got = []
            for b in state["r"].batches(7, shuffle=shuffle, num_threads=2, varlen="ragged"):
                got += _batch_rows(b, names, nullable)
            _check_rows(got, expected, shuffle == "none", f"batches({shuffle})")

        return go

    def verify():
        state["r"].layout.verify()

    def cli():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = cli_main(["verify", path])
        if rc != 0:
            raise rowstore.RowstoreError(f"rowstore verify exited {rc}")

    yield "open", op
    yield "r[0]", first
    yield "take", take
    for s in ("block", "full", "none"):
        yield f"batches-{s}", batches(s)
    yield "verify", verify
    yield "cli-verify", cli
    if "r" in state:
        with contextlib.suppress(Exception):
            state["r"].close()


def run_oracle(path: str, with_image: bool, progress=None) -> dict:
    """Every step on ``path``; ``progress(step)`` is called before each (the parent names the
    step a hang or crash happened in)."""
    from rowstore import RowstoreError

    schema = seed_schema(with_image)
    names = [f.name for f in schema]
    nullable = {f.name for f in schema if f.nullable}
    expected = [_canon_row(r, names) for r in seed_rows(with_image)]
    outcome, detail = "ok", []
    gen = _steps(path, expected, names, nullable)
    for name, fn in gen:
        if progress is not None:
            progress(name)
        try:
            fn()
            continue
        except _Wrong as exc:
            res, info = "WRONG-DATA", {"step": name, "message": str(exc)}
        except RowstoreError as exc:
            res, info = "rowstore-error", {"step": name, "type": type(exc).__name__}
        except OSError as exc:
            if exc.errno is not None:
                res, info = "rowstore-error", {"step": name, "type": type(exc).__name__, "errno": exc.errno}
            else:
                res, info = "LEAKED", _leak(name, exc)
        except BaseException as exc:  # noqa: BLE001 - the oracle classifies everything
            res, info = "LEAKED", _leak(name, exc)
        if SEVERITY[res] > SEVERITY[outcome]:
            outcome = res
        detail.append({"outcome": res, **info})
        if name == "open":
            gen.close()
            break
    return {"outcome": outcome, "steps": detail}


def _leak(step, exc):
    tb = traceback.extract_tb(exc.__traceback__)
    last = tb[-1] if tb else None
    return {"step": step, "type": type(exc).__name__, "message": str(exc)[:300],
            "where": f"{last.filename}:{last.lineno} in {last.name}" if last else None}  # fmt: skip


def child_main(conn, mem_limit: int):
    import resource

    if mem_limit:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    import faulthandler

    faulthandler.disable()
    import rowstore  # noqa: F401 - import once, before the first case

    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        cid, path, with_image = msg
        conn.send(("start", cid))
        try:
            res = run_oracle(path, with_image, lambda step: conn.send(("step", step)))
        except BaseException as exc:  # noqa: BLE001
            res = {"outcome": "LEAKED", "steps": [_leak("oracle", exc)]}
        conn.send(("done", (cid, res)))


class Child:
    def __init__(self, mem_limit: int):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(child_conn, mem_limit), daemon=True)
        self.proc.start()
        child_conn.close()
        if not self.conn.poll(120):
            raise RuntimeError("fuzz child did not start")
        self.conn.recv()
        self.cases = 0

    def run(self, cid, path, with_image, timeout):
        """(result, alive)"""
        self.conn.send((cid, path, with_image))
        self.cases += 1
        deadline = time.monotonic() + timeout
        started = False
        step = None
        while True:
            left = deadline - time.monotonic()
            try:
                ready = self.conn.poll(max(0.0, min(left, 0.2)))
            except (EOFError, OSError):
                ready = False
            if ready:
                try:
                    kind, val = self.conn.recv()
                except (EOFError, OSError):
                    ready = False
                else:
                    if kind == "start":
                        started = True
                        deadline = time.monotonic() + timeout
                        continue
                    if kind == "step":
                        step = val
                        continue
                    return val[1], True
            if not self.proc.is_alive():
                self.proc.join()
                code = self.proc.exitcode
                sig = -code if code is not None and code < 0 else None
                return {"outcome": "CRASH", "steps": [{"step": step, "signal": sig, "exitcode": code, "started": started}]}, False
            if time.monotonic() > deadline:
                self.kill()
                return {"outcome": "HANG", "steps": [{"step": step, "timeout_s": timeout}]}, False

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()

    def close(self):
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.proc.join(5)
        self.kill()


# --------------------------------------------------------------------------- driver


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, help="run for this long")
    ap.add_argument("--cases", type=int, help="run this many cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--region", choices=sorted(KINDS), default="all")
    ap.add_argument("--out", default="bench/results/fuzz.json")
    ap.add_argument("--cases-dir", default="bench/results/fuzz-cases")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per case before it is a HANG")
    ap.add_argument("--per-child", type=int, default=50, help="cases per child process")
    ap.add_argument("--mem-gib", type=float, default=4.0, help="RLIMIT_AS of the child")
    ap.add_argument("--no-image", action="store_true", help="leave the PNG field out")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--replay", nargs="+", metavar="FILE", help="run the oracle on these files (.h5 or .h5.gz) and print the outcomes")
    args = ap.parse_args(argv)
    if args.replay:
        return replay(args)
    if args.minutes is None and args.cases is None:
        ap.error("give --minutes or --cases")
    with_image = _has_imagecodecs() and not args.no_image
    kinds = KINDS[args.region]
    rng = np.random.default_rng(args.seed)
    tmp = tempfile.mkdtemp(prefix="rowstore-fuzz-")
    t0 = time.monotonic()
    try:
        seeds = build_seeds(tmp, with_image)
        blobs = {k: bytes(open(p, "rb").read()) for k, p in seeds.items()}
        smaps = {k: structure_map(p) for k, p in seeds.items()}
        mem = int(args.mem_gib * 2**30)
        child = Child(mem)
        for name, p in seeds.items():  # sanity: the unmutated seeds read back exactly
            res, _ = child.run(name, p, with_image, args.timeout)
            if res["outcome"] != "ok":
                raise SystemExit(f"seed {name} does not read back as written: {res}")
        by_outcome = collections.Counter()
        by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        findings = []
        error_types = collections.Counter()
        case_path = os.path.join(tmp, "case.h5")
        deadline = t0 + 60 * args.minutes if args.minutes is not None else None
        i = 0
        while True:
            if args.cases is not None and i >= args.cases:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            seed_name = list(seeds)[int(rng.integers(len(seeds)))]
            data = bytearray(blobs[seed_name])
            ops = []
            case_kinds = []
            for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
                kind = kinds[int(rng.integers(len(kinds)))]
                data, op = mutate(kind, data, rng, smaps[seed_name])
                if op is not None:
                    op["kind"] = kind
                    ops.append(op)
                    case_kinds.append(kind)
                if kind.startswith(("truncate", "insert")):
                    break  # later offsets would no longer mean the seed's structures
            if not ops or data == blobs[seed_name]:
                continue  # nothing applied, or a no-op (zeros over zeros)
            with open(case_path, "wb") as fh:
                fh.write(data)
            if child.cases >= args.per_child:
                child.close()
                child = Child(mem)
            res, alive = child.run(i, case_path, with_image, args.timeout)
            if not alive:
                child = Child(mem)
            out = res["outcome"]
            by_outcome[out] += 1
            if res["steps"]:
                first = res["steps"][0]
                error_types[f"{first.get('outcome', out)}: {first.get('type', first.get('signal', '-'))} at {first.get('step', '-')}"] += 1
            label = "+".join(sorted(set(case_kinds)))
            by_kind[label if len(set(case_kinds)) == 1 else "multi"][out] += 1
            if out in BAD:
                h = hashlib.sha1(bytes(data)).hexdigest()[:10]
                rec = {"case": i, "seed_file": seed_name, "outcome": out, "kinds": case_kinds, "ops": ops,
                       "steps": res["steps"], "file": f"{out}-{h}.h5", "nbytes": len(data),
                       "crc32": zlib.crc32(data)}  # fmt: skip
                findings.append(rec)
                os.makedirs(args.cases_dir, exist_ok=True)
                shutil.copyfile(case_path, os.path.join(args.cases_dir, rec["file"]))
                with open(os.path.join(args.cases_dir, rec["file"][:-3] + ".json"), "w") as fh:
                    json.dump(rec, fh, indent=1)
                if not args.quiet:
                    print(f"case {i}: {out} {label} {res['steps']}", file=sys.stderr)
            i += 1
        child.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - t0
    report = {
        "seed": args.seed, "region": args.region, "cases": i, "seconds": round(elapsed, 1), "with_image": with_image,
        "seed_files": {k: len(v) for k, v in blobs.items()},
        "by_outcome": {o: by_outcome[o] for o in OUTCOMES},
        "by_kind": {k: {o: c[o] for o in OUTCOMES if c[o]} for k, c in sorted(by_kind.items())},
        "first_error": dict(error_types.most_common()),
        "findings": findings,
    }  # fmt: skip
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    print_table(report)
    return 0


def replay(args) -> int:
    """The oracle on saved reproducers (``tests/data/fuzz``, ``bench/results/fuzz-cases``)."""
    import gzip

    with_image = _has_imagecodecs() and not args.no_image
    tmp = tempfile.mkdtemp(prefix="rowstore-fuzz-")
    child = Child(int(args.mem_gib * 2**30))
    try:
        for src in args.replay:
            path = src
            if src.endswith(".gz"):
                path = os.path.join(tmp, "replay.h5")
                with gzip.open(src, "rb") as fi, open(path, "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            res, alive = child.run(src, path, with_image, args.timeout)
            print(json.dumps({"file": src, **res}))
            if not alive:
                child = Child(int(args.mem_gib * 2**30))
    finally:
        child.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def print_table(report):
    cols = OUTCOMES
    print(f"{report['cases']} cases in {report['seconds']} s (region {report['region']}, seed {report['seed']})")
    print("| kind | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for k, c in report["by_kind"].items():
        print(f"| {k} | " + " | ".join(str(c.get(o, 0)) for o in cols) + " |")
    print("| **total** | " + " | ".join(str(report["by_outcome"][o]) for o in cols) + " |")


if __name__ == "__main__":
    sys.exit(main())
