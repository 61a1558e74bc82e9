"""``rowstore-bench``: how fast a dataset reads on this machine, and against what.

    rowstore-bench PATH                       measure a dataset (numpy batches, block shuffle)
    rowstore-bench --demo tiny --compare      a demo dataset, against h5py, PyTables, numpy memmap
    rowstore-bench PATH --sweep threads=1,2 batch=64,256 window=4,16
    rowstore-bench PATH --json out.json --plot out.png

Each configuration runs in a fresh process (so its peak memory is its own) after the file was
read once (warm page cache). Per repeat: a fresh epoch iterator, ``-m`` warm-up rows not
counted, then ``-n`` rows timed (default: the rest of the epoch), both rounded up to whole
batches, every batch touched; figures are medians of ``--repeats``.

``petastorm-throughput.py``'s flags are accepted with their meaning (``docs/petastorm.md``):
``-m``/``--warmup-cycles`` and ``-n``/``--measure-cycles`` count rows, ``-w``/``--workers-count``
readers of the ``-p``/``--pool-type`` pool (``thread``: reader threads; ``process``: DataLoader
worker processes; ``dummy``: one thread), ``--field-regex`` selects fields, ``-d``/
``--read-method`` picks the mode.

A URL is measured as remote epochs: nothing is read before measuring, no local cache, and the
timed phase starts before the epoch's first request (``-m`` does not apply): the reader
prefetches up to ``max_in_flight * merge_bytes`` ahead, so warm-up batches would let the timed
batches come from memory fetched untimed, and a small dataset's "rate" would be a memcpy.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any

from rowstore import storage
from rowstore._version import __version__
from rowstore.bench import adapters, measure, report, runner, sources
from rowstore.demo import DEMOS, default_cache_dir, make_demo
from rowstore.errors import RowstoreError
from rowstore.reader._args import select_fields

__all__ = [
    "main",
    "run",
    "resolve_petastorm_flags",
    "build_parser",
    "parse_sweep",
    "demo_path",
    "bench_cache_dir",
    "npy_export_dir",
    "clean_cache",
]

DEFAULT_BASELINES = ("h5py-row", "tables-block", "memmap")
#: Warm-up batches per repeat when ``-m`` is not given.
DEFAULT_WARMUP_BATCHES = 10
#: Readers ``-p thread|process`` starts without ``-w`` (``petastorm-throughput.py``'s default).
PETASTORM_WORKERS = 3
#: A configuration's timed pass (median of its repeats) shorter than this is too brief to be
#: ranked by ``--sweep``: at that length its figure is mostly start-up and noise.
MIN_RANKED_S = 2.0
#: Rows timed for the h5py per-row baseline (at a few thousand rows/s, an epoch would take long).
PER_ROW_ROWS = 5_000
_SWEEP_KEYS = {
    "threads": "threads",
    "t": "threads",
    "batch": "batch_size",
    "batch_size": "batch_size",
    "b": "batch_size",
    "window": "window",
    "w": "window",
    "pieces": "pieces",
    "p": "pieces",
    "shuffle": "shuffle",
    "workers": "workers",
    "mode": "mode",
}


def bench_cache_dir(cache_dir: str | None = None) -> str:
    """Where ``rowstore-bench`` keeps what it generates (demo datasets, ``.npy`` exports), reused
    from run to run: ``cache_dir`` (``--cache-dir``), else ``$ROWSTORE_BENCH_CACHE``, else
    ``$ROWSTORE_CACHE`` (the demo cache of :func:`rowstore.demo.default_cache_dir`), else
    ``$XDG_CACHE_HOME/rowstore/bench``, else ``~/.cache/rowstore/bench``; never the current
    directory unless asked."""
    if cache_dir:
        return cache_dir
    for var in ("ROWSTORE_BENCH_CACHE", "ROWSTORE_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rowstore", "bench")


def npy_export_dir(path: str, cache_dir: str | None = None) -> str:
    """The ``.npy`` export directory of the file ``path`` for the memmap baseline:
    ``<cache>/npy/<stem>-<hash of the absolute path>`` (two files of one name do not share it)."""
    import hashlib

    stem = os.path.splitext(os.path.basename(path))[0]
    key = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:10]
    return os.path.join(bench_cache_dir(cache_dir), "npy", f"{stem}-{key}")


def clean_cache(cache_dir: str | None = None) -> tuple[int, int, str]:
    """Remove every ``.npy`` export (and unfinished one) under the bench cache; demo datasets
    stay. Returns ``(exports removed, bytes freed, the npy directory)``."""
    import shutil

    root = os.path.join(bench_cache_dir(cache_dir), "npy")
    count = freed = 0
    if not os.path.isdir(root):
        return 0, 0, root
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        if not (os.path.exists(os.path.join(d, sources.NPY_DONE)) or name.endswith(".tmp")):
            continue  # not an export of ours
        for dirpath, _, files in os.walk(d):
            for fn in files:
                try:
                    freed += os.lstat(os.path.join(dirpath, fn)).st_size
                except OSError:
                    pass
        shutil.rmtree(d)
        count += 1
    if not os.listdir(root):
        os.rmdir(root)
    return count, freed, root


def demo_path(name: str, rows: int | None = None, cache_dir: str | None = None) -> str:
    """The cache path of demo ``name`` with ``rows`` rows (same naming as ``python -m
    rowstore.demo``)."""
    if name not in DEMOS:
        raise SystemExit(
            f"rowstore-bench: unknown demo {name!r}; choose from {', '.join(sorted(DEMOS))}"
        )
    rows = DEMOS[name][0] if rows is None else rows
    return os.path.join(cache_dir or default_cache_dir(), f"{name}-{rows}.h5")


def ensure_demo(
    name: str, rows: int | None = None, cache_dir: str | None = None, *, log=None
) -> str:
    """Write demo ``name`` into the cache unless it is there already; return its path."""
    path = demo_path(name, rows, cache_dir)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if log:
            log(
                f"writing demo dataset {name!r} ({rows if rows is not None else 'default'} rows) "
                f"to {path} ..."
            )
        t = time.perf_counter()
        make_demo(name, path, rows)
        if log:
            log(f"  written in {time.perf_counter() - t:.1f} s")
    return path


def parse_sweep(items: list[str]) -> list[dict[str, Any]]:
    """``["threads=1,2", "batch=64,256"]`` -> the grid of option dicts (cartesian product)."""
    axes: list[tuple[str, list[Any]]] = []
    for it in items:
        key, sep, vals = it.partition("=")
        if not sep or key.strip().lower() not in _SWEEP_KEYS:
            raise SystemExit(
                f"rowstore-bench: --sweep takes KEY=V1,V2,... with KEY in threads, batch, window, "
                f"pieces, shuffle, "
                f"workers, mode; got {it!r}"
            )
        k = _SWEEP_KEYS[key.strip().lower()]
        parsed: list[Any] = []
        for v in vals.split(","):
            v = v.strip()
            if not v:
                continue
            if k in ("shuffle", "mode"):
                parsed.append(v)
            else:
                try:
                    parsed.append(int(v))
                except ValueError:
                    raise SystemExit(
                        f"rowstore-bench: --sweep {key}: {v!r} is not an integer"
                    ) from None
        if not parsed:
            raise SystemExit(f"rowstore-bench: --sweep {key} has no values")
        axes.append((k, parsed))
    return [
        dict(zip([a for a, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])
    ]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rowstore-bench",
        description="Measure how fast a rowstore dataset reads (warm page cache), optionally "
        "against "
        "h5py, PyTables and numpy memmap baselines and the memcpy ceiling.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  rowstore-bench --demo tiny --compare\n  rowstore-bench data.h5 "
        "--threads 2 --batch-size 256"
        "\n  rowstore-bench data.h5 --sweep threads=1,2 batch=64,256 window=4,16 --plot sweep.png",
    )
    p.add_argument(
        "path",
        nargs="?",
        help="a rowstore .h5 file or dataset directory, or a URL (s3://, http(s)://, "
        "gs://... read by ranged requests)",
    )
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        type=json.loads,
        default=None,
        help="fsspec storage_options for a URL, as JSON (e.g. '{\"anon\": true}')",
    )
    p.add_argument(
        "--demo",
        metavar="NAME",
        help="generate (once, cached) and measure a demo dataset: "
        "tiny, patch, image, speech, hello",
    )
    p.add_argument(
        "--rows", type=int, help="rows of the demo dataset (default: the demo's default size)"
    )
    p.add_argument(
        "-m",
        "--warmup",
        "--warmup-cycles",
        dest="warmup",
        metavar="ROWS",
        type=int,
        default=None,
        help="warm-up rows per repeat, not timed, rounded up to whole batches "
        f"(petastorm-throughput.py's -m; default {DEFAULT_WARMUP_BATCHES} batches)",
    )
    p.add_argument(
        "-n",
        "--measure",
        "--measure-cycles",
        dest="measure",
        metavar="ROWS",
        type=int,
        default=None,
        help="rows timed per repeat, rounded up to whole batches (petastorm-throughput.py's "
        "-n; default: the rest of the epoch)",
    )
    p.add_argument(
        "-w",
        "--workers-count",
        metavar="N",
        type=int,
        default=None,
        help="readers of the -p pool (petastorm-throughput.py's -w): reader threads with -p "
        "thread (--threads), DataLoader worker processes with -p process (--workers)",
    )
    p.add_argument(
        "-p",
        "--pool-type",
        choices=["thread", "process", "dummy"],
        default=None,
        help="petastorm-throughput.py's pool: thread = reader threads, process = --mode torch "
        "with -w DataLoader worker processes, dummy = one reader thread; with -p and no -w, "
        f"{PETASTORM_WORKERS} readers (default: no -p, the reader's threads)",
    )
    p.add_argument(
        "-d",
        "--read-method",
        choices=["python", "tf"],
        default=None,
        help="petastorm-throughput.py's read method: python = --mode numpy, tf = --mode tf",
    )
    p.add_argument("--batch-size", "-b", type=int, default=256, help="rows per batch (default 256)")
    p.add_argument(
        "--threads",
        "-t",
        type=int,
        default=None,
        help="reader threads (default: the reader's, min(4, cores))",
    )
    p.add_argument(
        "--mode",
        default=None,
        choices=list(sources.MODES),
        help="how batches are consumed (default numpy)",
    )
    p.add_argument(
        "--workers", type=int, default=0, help="DataLoader workers for --mode torch (default 0)"
    )
    p.add_argument(
        "--shuffle",
        default="block",
        choices=["block", "full", "none"],
        help="epoch order (default block)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        help="units (blocks, or pieces) mixed together in block shuffling (default: the "
        "reader's for the file, docs/order.md)",
    )
    p.add_argument(
        "--pieces",
        type=int,
        default=None,
        help="block shuffle of pieces: cut each block into this many (default: the reader's, "
        "8 for uncompressed blocks read directly, else 1)",
    )
    p.add_argument("--fields", nargs="+", help="read only these fields")
    p.add_argument(
        "--field-regex",
        nargs="+",
        metavar="REGEX",
        help="read only the fields whose names fully match one of these regular expressions "
        "(petastorm-throughput.py's --field-regex)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="measured repeats; figures are their medians (default 3)",
    )
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=3.0,
        help="stop a repeat's timed phase after this many seconds and extrapolate (default 3)",
    )
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="read with verify=False: no CRC checks (the checks column says off)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also measure the baselines and memcpy in the same run",
    )
    p.add_argument(
        "--baselines",
        nargs="+",
        choices=list(sources.BASELINES),
        default=list(DEFAULT_BASELINES),
        help=f"baselines for --compare (default: {' '.join(DEFAULT_BASELINES)})",
    )
    p.add_argument(
        "--memcpy-mib",
        type=int,
        default=1024,
        help="buffer size of the memcpy measurement (default 1024 MiB)",
    )
    p.add_argument(
        "--sweep",
        nargs="+",
        metavar="KEY=V1,V2",
        help="a grid, e.g. threads=1,2 batch=64,256 window=4,16",
    )
    p.add_argument("--json", metavar="OUT", help="write all figures as JSON")
    p.add_argument(
        "--plot", metavar="OUT.png", help="write a bar chart of throughput per configuration"
    )
    p.add_argument(
        "--cache-dir",
        help="where demo datasets and .npy exports go, reused from run to run (default: "
        "$ROWSTORE_BENCH_CACHE, $ROWSTORE_CACHE, $XDG_CACHE_HOME/rowstore/bench or "
        "~/.cache/rowstore/bench)",
    )
    p.add_argument(
        "--clean-cache",
        action="store_true",
        help="remove the .npy exports of --compare from the cache (after the run if there is one; "
        "alone, without PATH or --demo, just that)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    return p


class _Progress:
    """A progress bar on stderr (rich), off when stderr is not a terminal or with --quiet."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ImportError:  # pragma: no cover
            return
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("repeats"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("", total=total)
        self.bar.start()

    def describe(self, text: str) -> None:
        if self.bar:
            self.bar.update(self.task, description=text)

    def event(self, ev: dict) -> None:
        if self.bar and ev.get("event") == "repeat":
            self.bar.advance(self.task)

    def stop(self) -> None:
        if self.bar:
            self.bar.stop()


def _dataset_info(path: str, storage_options: dict | None = None) -> dict[str, Any]:
    """What the report says of the dataset: a ``.h5`` file or a dataset directory (its manifest:
    ``rows_per_block`` is the largest block of any shard, ``version`` the manifest read), local
    or at a URL."""
    L = sources.open_layout(path, storage_options)
    return {
        "path": storage.absolute(path),
        "rows": L.num_rows,
        "fields": L.schema.names,
        "row_bytes": L.row_dtype.itemsize,
        "rows_per_block": L.rows_per_block,
        "blocks": L.num_blocks,
        "block_bytes": L.block_raw_bytes,
        "heap_bytes": L.heap_nbytes,
        "raw_bytes": L.raw_nbytes,
        "stored_bytes": L.stored_nbytes,
        "file_bytes": L.file_size,
        "compression": L.compression,
        "demo": L.user_attrs.get("demo"),
        "shards": L.num_shards,
        "version": L.version,
    }


def resolve_petastorm_flags(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``petastorm-throughput.py``'s ``-w``, ``-p`` and ``-d`` turned into
    rowstore's ``--threads``, ``--workers`` and ``--mode`` (a copy; ``args`` is left as is).

    ``-p thread`` (or no ``-p``): ``-w`` reader threads; ``-p process``: ``--mode torch`` with
    ``-w`` DataLoader worker processes; ``-p dummy``: one reader thread, ``-w`` ignored (as
    Petastorm's dummy pool). With ``-p`` and no ``-w``, Petastorm's default of
    :data:`PETASTORM_WORKERS`. ``-d python`` is ``--mode numpy``, ``-d tf`` ``--mode tf``.
    A flag that contradicts an explicit rowstore option is a ``SystemExit`` naming both.
    """
    args = argparse.Namespace(**vars(args))
    mode = getattr(args, "mode", None)
    method = getattr(args, "read_method", None)
    pool = getattr(args, "pool_type", None)
    count = getattr(args, "workers_count", None)
    if count is not None and count < 1:
        raise SystemExit(f"rowstore-bench: -w must be >= 1, got {count}")
    if method is not None:
        want = "numpy" if method == "python" else "tf"
        if mode not in (None, want):
            raise SystemExit(f"rowstore-bench: -d {method} is --mode {want}, not --mode {mode}")
        mode = want
    if pool is not None and count is None:
        count = PETASTORM_WORKERS
    if pool == "process":
        if mode not in (None, "torch"):
            raise SystemExit(
                f"rowstore-bench: -p process reads with DataLoader worker processes, which "
                f"--mode {mode} has not: use --mode torch (or leave --mode out)"
            )
        if args.workers and args.workers != count:
            raise SystemExit(f"rowstore-bench: -w {count} and --workers {args.workers} disagree")
        mode, args.workers = "torch", count
    elif count is not None:
        threads = 1 if pool == "dummy" else count
        if args.threads is not None and args.threads != threads:
            raise SystemExit(
                f"rowstore-bench: -p {pool or 'thread'} -w {count} means {threads} reader "
                f"thread(s), but --threads {args.threads} was given"
            )
        args.threads = threads
    args.mode = mode or "numpy"
    return args


def _batches(rows: int | None, batch_size: int) -> int | None:
    """Whole batches holding ``rows`` rows (None stays None)."""
    return None if rows is None else -(-rows // batch_size)


def run(args: argparse.Namespace, *, log=print, console=None) -> dict[str, Any]:
    """Run the benchmark that ``args`` describe; return the JSON document (also printed)."""
    args = resolve_petastorm_flags(args)
    cache_dir = bench_cache_dir(args.cache_dir)
    if args.plot:  # before measuring anything: say what to install
        report.require_matplotlib()
    if args.demo:
        path = ensure_demo(args.demo, args.rows, cache_dir, log=log)
    else:
        path = args.path
    where = storage.locate(path)
    path, remote = where.path, not where.local
    if not remote and not os.path.exists(path):
        raise SystemExit(f"rowstore-bench: no such file or dataset: {path}")
    for name, v in (
        ("--batch-size", args.batch_size),
        ("--repeats", args.repeats),
        ("--window", args.window),
        ("--pieces", args.pieces),
    ):
        if v is not None and v < 1:
            raise SystemExit(f"rowstore-bench: {name} must be >= 1, got {v}")
    if (args.warmup is not None and args.warmup < 0) or (
        args.measure is not None and args.measure < 1
    ):
        raise SystemExit("rowstore-bench: -m must be >= 0 and -n >= 1")

    so = getattr(args, "storage_options", None)
    info = _dataset_info(path, so)
    warmup = args.warmup  # rows; None: DEFAULT_WARMUP_BATCHES batches
    notes = []
    if remote and warmup != 0:
        warmup = 0
        notes.append(
            f"-m {DEFAULT_WARMUP_BATCHES * args.batch_size if args.warmup is None else args.warmup}"
            " not applied to a URL: every timed epoch starts before its first request "
            "(warm-up batches would time batches the reader had already prefetched)"
        )
    regexes = getattr(args, "field_regex", None)
    if args.fields and regexes:
        raise SystemExit("rowstore-bench: give --fields or --field-regex, not both")
    fields = None
    if args.fields or regexes:
        schema = sources.open_layout(path, so).schema
        fields = (
            list(schema.select(args.fields).names)
            if args.fields
            else select_fields(schema, regexes, regex=True)
        )
    configs = parse_sweep(args.sweep) if args.sweep else [{}]
    modes = {c.get("mode", args.mode) for c in configs}
    for mode in modes:
        try:
            adapters.check_mode(mode)
        except (adapters.ModeUnavailableError, ValueError) as exc:
            raise SystemExit(f"rowstore-bench: {exc}") from None

    base = {
        "path": path,
        "fields": fields,
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "window": args.window,
        "pieces": args.pieces,
        "seed": args.seed,
        "threads": args.threads,
        "workers": args.workers,
        "mode": args.mode,
        "verify": args.verify,
        "warmup": DEFAULT_WARMUP_BATCHES if warmup is None else _batches(warmup, args.batch_size),
        "measure": _batches(args.measure, args.batch_size),
        "warmup_rows": warmup,
        "measure_rows": args.measure,
        "repeats": args.repeats,
        "time_limit": args.time_limit,
    }
    if remote:
        base["storage_options"] = so
    specs = []
    for c in configs:
        specs.append(_clamp(_in_batches(dict(base, kind="rowstore", **c)), info["rows"]))
    if any(s["_clamped"] for s in specs):
        notes.append("-m/-n were reduced to fit one epoch (timed batches stay within one epoch).")

    baseline_specs = []
    npy_dir = None
    one_file = not remote and not os.path.isdir(path)
    if args.compare and remote:
        notes.append(
            "baselines skipped for a URL (bench/remote_bench.py compares h5py over fsspec); "
            "rowstore and "
            "memcpy were measured."
        )
    elif args.compare and not one_file:
        notes.append(
            f"baselines skipped: they read one HDF5 file, and {path} is a dataset directory "
            f"({info['shards']} shards); rowstore and memcpy were measured."
        )
    if args.compare and one_file:
        for kind in args.baselines:
            s = dict(base, kind=kind, threads=None, mode="numpy")
            if kind == "h5py-row":
                s["max_rows"] = PER_ROW_ROWS
            baseline_specs.append(_clamp(_in_batches(s), info["rows"]))
        if "memmap" in args.baselines:
            npy_dir = npy_export_dir(path, cache_dir)
            log(
                f"exporting fields to .npy for the memmap baseline: {npy_dir} (reused; "
                f"--clean-cache removes it)"
            )
            sources.export_npy(path, npy_dir, fields=fields)
            for s in baseline_specs:
                s["npy_dir"] = npy_dir

    # Warm cache: the file (and the .npy export) read once before any measurement.
    t = time.perf_counter()
    warmed = 0 if remote else measure.warm_cache([path] + ([npy_dir] if npy_dir else []))
    warm_s = time.perf_counter() - t

    log(_header(info, args, warmed, warm_s, warmup=base["warmup"], remote=remote))
    total = sum(s["repeats"] for s in specs + baseline_specs)
    progress = _Progress(total, enabled=not args.quiet and sys.stderr.isatty())
    results: list[dict[str, Any]] = []
    memcpy = None
    try:
        if args.compare:
            progress.describe("memcpy")
            memcpy = runner.run_spec(
                {"kind": "memcpy", "nbytes": args.memcpy_mib << 20, "repeats": 5}
            )
        for s in specs + baseline_specs:
            progress.describe(s["kind"] if s["kind"] != "rowstore" else "rowstore " + _cfg_text(s))
            res = runner.run_spec(
                {k: v for k, v in s.items() if not k.startswith("_")}, on_event=progress.event
            )
            res.setdefault("kind", s["kind"])
            if "label" not in res:
                res["label"] = (
                    sources.describe(s["kind"], s.get("mode", "numpy"))[0]
                    if s["kind"] != "rowstore"
                    else "rowstore " + _cfg_text(s)
                )
            res["config"] = {
                k: s.get(k)
                for k in (
                    "mode",
                    "batch_size",
                    "threads",
                    "workers",
                    "shuffle",
                    "window",
                    "pieces",
                    "warmup",
                    "measure",
                    "max_rows",
                    "time_limit",
                    "verify",
                )
            }
            results.append(res)
    finally:
        progress.stop()

    rs_results = [r for r in results if r["kind"] == "rowstore"]
    bl_results = [r for r in results if r["kind"] != "rowstore"]
    doc: dict[str, Any] = {
        "tool": "rowstore-bench",
        "version": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": measure.machine_info(),
        "dataset": info,
        "cache": _REMOTE_CACHE
        if remote
        else f"warm: the file was read once before measuring ({warmed / 1e6:,.0f} MB in "
        f"{warm_s:.2f} s)",
        "method": "fresh process per configuration; per repeat a fresh epoch iterator, warm-up "
        "batches "
        "not timed, then the timed batches (every batch touched); medians of the repeats",
        "settings": {k: v for k, v in base.items() if k != "path"},
        "results": rs_results,
    }
    if args.compare:
        doc["baselines"] = bl_results
        doc["memcpy"] = memcpy
        doc["compare"] = _compare(rs_results, bl_results, memcpy)
    if args.sweep:
        ok = [r for r in rs_results if not r.get("error")]
        best = max(ok, key=lambda r: r["rows_per_s"]) if ok else None
        best_cfg = configs[rs_results.index(best)] if best else None
        brief = [r for r in ok if (r.get("seconds") or 0.0) < MIN_RANKED_S]
        doc["sweep"] = {
            "grid": configs,
            "best": best["label"] if best else None,
            "best_config": best_cfg,
            "best_rows_per_s": best["rows_per_s"] if best else None,
            "min_ranked_s": MIN_RANKED_S,
            "too_brief": [r["label"] for r in brief],
        }
        if brief:
            notes.append(_too_brief_text(brief, len(ok)))
    doc["notes"] = notes + [
        f"{r['label']}: partial epoch ({_partial_text(r)}), rate extrapolated"
        for r in results
        if r.get("stopped_early")
    ]
    _print_report(doc, console=console, log=log)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
        log(f"JSON written to {args.json}")
    if args.plot:
        mg = memcpy.get("gb_per_s") if memcpy and not memcpy.get("error") else None
        name = args.demo or os.path.basename(path)
        report.plot(
            [("", rs_results + bl_results)],
            args.plot,
            memcpy_gbps=mg,
            title=f"rowstore-bench: {name} ({info['rows']:,} rows), batch {args.batch_size}, "
            + ("remote epochs" if remote else "warm cache"),
            subtitle=f"{os.cpu_count()} CPUs; median of {args.repeats} repeats; MB/s = decoded "
            f"bytes of the fields",
        )
        log(f"plot written to {args.plot}")
    return doc


def _too_brief_text(brief: list[dict], ranked: int) -> str:
    """The report's warning that ``brief`` configurations ran too briefly to be ranked."""
    each = ", ".join(f"{r['label']}: {_secs(r['seconds'])}" for r in brief)
    return (
        f"--sweep: {len(brief)} of {ranked} configurations timed under {MIN_RANKED_S:g} s per "
        f"repeat ({each}): too brief to be ranked, so the best configuration is not established "
        "(time more rows: -n up to an epoch, or a larger dataset, e.g. --rows for a demo)"
    )


def _secs(t: float) -> str:
    return f"{t:.2f} s" if t >= 0.1 else f"{t * 1e3:.2g} ms"


def _in_batches(s: dict[str, Any]) -> dict[str, Any]:
    """A spec's -m/-n rows as whole batches of its batch size (what the runner counts)."""
    B = s["batch_size"]
    rows = s.pop("warmup_rows"), s.pop("measure_rows")
    s["warmup"] = DEFAULT_WARMUP_BATCHES if rows[0] is None else _batches(rows[0], B)
    s["measure"] = _batches(rows[1], B)
    return s


def _partial_text(r: dict) -> str:
    reps = r.get("repeats") or [{}]
    return f"{reps[0].get('rows', 0):,} rows timed per repeat"


def _clamp(s: dict[str, Any], num_rows: int) -> dict[str, Any]:
    """Fit -m/-n into one epoch: timed batches never cross an epoch boundary."""
    nb = -(-num_rows // s["batch_size"])
    m, n = s["warmup"], s["measure"]
    clamped = False
    if m >= nb:
        m, clamped = max(0, nb - 1), True
    if n is not None and m + n > nb:
        n, clamped = nb - m, True
    s.update(warmup=m, measure=n, _clamped=clamped)
    return s


def _rows_text(rows: int | None, batches: int | None, batch_size: int) -> str:
    """``"1,000 rows (4 batches of 256)"``; ``rows`` None: the batches' rows."""
    if rows is None:
        rows = (batches or 0) * batch_size
    return f"{rows:,} rows ({batches} batch{'es' if batches != 1 else ''} of {batch_size})"


def _cfg_text(s: dict) -> str:
    threads = s.get("threads") or "auto"
    return f"{s.get('mode', 'numpy')} {s['shuffle']} B={s['batch_size']} t={threads}"


def _version() -> str:
    return __version__


def _compare(rs_results: list[dict], bl_results: list[dict], memcpy: dict | None) -> dict[str, Any]:
    ok = [r for r in rs_results if not r.get("error") and r.get("rows_per_s")]
    if not ok:
        return {}
    best = max(ok, key=lambda r: r["rows_per_s"])
    out: dict[str, Any] = {"rowstore": best["label"], "rows_per_s": best["rows_per_s"], "vs": {}}
    for b in bl_results:
        if b.get("rows_per_s"):
            out["vs"][b["label"]] = best["rows_per_s"] / b["rows_per_s"]
    if memcpy and memcpy.get("gb_per_s") and best.get("bytes_per_s"):
        out["memcpy_gb_per_s"] = memcpy["gb_per_s"]
        out["fraction_of_memcpy"] = best["bytes_per_s"] / (memcpy["gb_per_s"] * 1e9)
    return out


#: What a URL's measurement reads (the report's ``cache``).
_REMOTE_CACHE = (
    "remote: every epoch fetched over the network by ranged requests (nothing read before "
    "measuring, no local cache); timed from before the epoch's first request"
)


def _header(
    info: dict, args, warmed: int, warm_s: float, *, warmup: int, remote: bool = False
) -> str:
    """The report's first lines; ``warmup`` is the warm-up batches per repeat."""
    comp = info["compression"]
    comp_s = "uncompressed" if comp.get("id") == "none" else f"blosc2 {comp.get('cname')}"
    return (
        f"dataset  {info['path']}\n"
        f"         {info['rows']:,} rows x {info['row_bytes']} B in the row table"
        + (f" + {info['heap_bytes'] / 1e6:,.0f} MB heap" if info["heap_bytes"] else "")
        + f"; {info['blocks']:,} blocks of "
        f"{'up to ' if info['shards'] > 1 else ''}{info['rows_per_block']:,} rows"
        + (f" in {info['shards']:,} shards" if info["shards"] > 1 else "")
        + f"; {comp_s}\n"
        + (
            f"remote   {_REMOTE_CACHE.split(': ', 1)[1]}\n"
            if remote
            else f"cache    warm: file read once before measuring ({warmed / 1e6:,.0f} MB in "
            f"{warm_s:.2f} s)\n"
        )
        + f"method   fresh process per config; {args.repeats} repeats, medians; "
        f"{_rows_text(args.warmup if warmup else 0, warmup, args.batch_size)} of warm-up per "
        "repeat not timed; timed: "
        + (
            "the rest of the epoch"
            if args.measure is None
            else _rows_text(args.measure, _batches(args.measure, args.batch_size), args.batch_size)
        )
        + f" (at most {args.time_limit:g} s per repeat); every batch touched"
    )


def _print_report(doc: dict, *, console=None, log=print) -> None:
    memcpy = doc.get("memcpy") or {}
    mg = memcpy.get("gb_per_s")
    results = doc["results"] + doc.get("baselines", [])
    if console is None:
        try:
            from rich.console import Console

            console = Console(width=None if sys.stdout.isatty() else 150)
        except ImportError:  # pragma: no cover
            console = None
    remote = str(doc.get("cache", "")).startswith("remote")
    report.render_table(
        results,
        mg,
        title="read throughput ("
        + ("remote epochs over the network" if remote else "warm page cache")
        + ")",
        console=console,
    )
    if mg:
        log(
            f"memcpy ceiling: {mg:.1f} GB/s (np.copyto of {memcpy['nbytes'] >> 20} MiB, median of "
            f"{memcpy['repeats']})"
        )
    cmp_ = doc.get("compare")
    if cmp_ and cmp_.get("vs"):
        parts = [f"{v:,.1f}x {k}" for k, v in cmp_["vs"].items()]
        line = f"{cmp_['rowstore']}: " + ", ".join(parts)
        if cmp_.get("fraction_of_memcpy") is not None:
            line += f"; {100 * cmp_['fraction_of_memcpy']:.1f}% of memcpy"
        log(line)
    for b in doc.get("baselines", []):
        if b.get("description"):
            log(f"  {b['label']}: {b['description']}")
    if doc.get("sweep") and doc["sweep"].get("best"):
        sw = doc["sweep"]
        cfg = " ".join(f"{k}={v}" for k, v in sw["best_config"].items())
        log(
            f"best configuration: {cfg}  ({sw['best']}: {report.fmt_rate(sw['best_rows_per_s'])} "
            "samples/s)" + (" - not ranked: see the note below" if sw.get("too_brief") else "")
        )
    for n in doc.get("notes", []):
        log(f"note: {n}")
    for r in results:
        if r.get("error"):
            log(f"error in {r.get('label')}: {r['error']}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.clean_cache and not args.path and not args.demo:
        return _clean(args)
    if bool(args.path) == bool(args.demo):
        parser.error("give a PATH or --demo NAME (one of them)")
    if args.rows is not None and not args.demo:
        parser.error("--rows applies to --demo")
    try:
        doc = run(args)
    except (RowstoreError, OSError) as exc:
        print(f"rowstore-bench: error: {exc}", file=sys.stderr)
        return 1
    failed = [r for r in doc["results"] + doc.get("baselines", []) if r.get("error")]
    if args.clean_cache:
        _clean(args)
    return 1 if failed else 0


def _clean(args: argparse.Namespace) -> int:
    try:
        count, freed, root = clean_cache(args.cache_dir)
    except OSError as exc:
        print(f"rowstore-bench: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"removed {count} .npy export{'s' if count != 1 else ''} ({freed / 1e6:,.1f} MB) from "
        f"{root}"
    )
    return 0
