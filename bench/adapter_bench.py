"""Every adapter against the core reader: same file, same order, every batch touched, one process.

    python bench/adapter_bench.py [--workloads tiny,patch,speech] [--batches 64,256]
        [--adapters ...] [--passes 3] [--pass-seconds 2] [--out bench/results/adapter_bench.json]

Workloads are ``rowstore.demo`` files (uncompressed, written once into ``--cache-dir``, read
from a warm page cache): ``tiny`` (float32[16] + int64, 72-byte rows), ``patch``
(float64[9,9,27] + int64[9,27] + float64, ~19 KB rows) and ``speech`` (a variable float32
waveform of 1,600-32,000 samples, two ``str`` fields, a bool). Each is read at each batch size
by:

* ``core``: ``Reader.batches(B, seed=0, epoch=e)`` (block shuffle, variable fields ``Ragged``),
  the baseline of every ratio; ``core padded``: the same with ``varlen="padded"`` (speech),
  the baseline of the adapters that pad;
* ``torch BatchedDataLoader``: ``rowstore.torch.BatchedDataLoader(r, batch_size=B, seed=0)``,
  ``set_epoch(e)`` then one iteration per epoch;
* ``torch floor``: ``Reader.batches`` plus one ``torch.from_numpy`` per array (variable fields:
  their values and offsets), the least any torch adapter does;
* ``torch ResumableDataLoader``: ``ResumableDataLoader(IterableDataset(r, batch_size=B,
  seed=0), batch_size=None)`` (``num_workers=0``: the same process and reader threads as the
  core);
* ``tf make_dataset graph``: ``rowstore.tf.make_dataset(r, batch_size=B, seed=0, epoch=e0,
  num_epochs=k)`` (a pass's epochs in one dataset, as ``repeat_epochs`` gives Keras) consumed
  by a ``tf.function`` looping over the dataset (autograph: the graph loop of ``Model.fit``),
  touching each batch with graph ops; ``tf make_dataset eager``: the same dataset consumed by
  a Python ``for`` loop (a custom training loop);
* ``grain EpochDataset``: ``iter(rowstore.grain.EpochDataset(r, batch_size=B, seed=0,
  epoch=e0, num_epochs=k, shard=(0, 1)))``.

Speech's waveform reaches each adapter in the layout that matches the core's ``Ragged`` (no
copy: torch ``varlen="ragged"``, values and offsets; tf ``tf.RaggedTensor``; Grain
``varlen="ragged"``), in torch's ``varlen="nested"`` (a jagged nested tensor over the batch
values) and, in the ``padded`` variants, zero-padded with ``"waveform__shape"`` (against
``core padded``, which pads the same way). ``tf floor graph`` is tf.data's own floor: one
batch repeated (``from_tensors(batch).repeat(n)``) through the same graph loop.

Order: before timing, every variant's first epoch is checked against the core's batch by
batch (rows and the sum of the first numeric field): same rows, same order, same batch cuts.

Timing: one warm-up pass, then ``--passes`` passes; a pass runs the same ``k`` epochs through
every variant, ``k`` chosen so that a core pass lasts ``--pass-seconds`` (a variant's pass is at
least that long). Passes are interleaved (pass 1 of every variant, then pass 2..., the order of
the variants rotated each pass) so load changes hit them alike. Every batch is touched: its
rows counted and one value every 4 KiB of each numeric array read back (the view a consumer
gets: numpy, torch or tf), ``str`` columns by their length. Per variant: median rows/s (wall)
and rows per CPU second (``time.process_time``: every thread of the process), and the ratios
against the baseline as medians of the per-pass ratios (each pass beside the baseline's pass
of the same round). The JSON (``--out``) holds every pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import rowstore  # noqa: E402
from rowstore.bench.cli import ensure_demo  # noqa: E402
from rowstore.bench.measure import machine_info, warm_cache  # noqa: E402
from rowstore.demo import default_cache_dir  # noqa: E402
from rowstore.reader.buffers import Ragged  # noqa: E402

ROWS = {"tiny": 1_000_000, "patch": 10_000, "speech": 5_000}
ADAPTERS = (
    "torch BatchedDataLoader",
    "torch ResumableDataLoader",
    "tf make_dataset graph",
    "tf make_dataset eager",
    "grain EpochDataset",
)
STRIDE = 4096  # bytes between the values read back from each array


def _log(msg: str) -> None:
    print(msg, flush=True)


# -- touching a batch: numpy, torch, tf ---------------------------------------------------------
def _touch_np(a: Any) -> int:
    if isinstance(a, Ragged):
        a = a.values
    if not isinstance(a, np.ndarray):  # a list of str (torch) or of tensors
        return len(a)
    if a.dtype == object:
        return len(a)
    flat = a.reshape(-1)
    return int(np.count_nonzero(flat[:: max(1, STRIDE // a.itemsize)]))


def touch_numpy(b: dict) -> int:
    return sum(_touch_np(v) for v in b.values())


def touch_torch(b: dict) -> int:
    n = 0
    for v in b.values():
        if isinstance(v, list):
            n += len(v)
            continue
        if v.is_nested:
            v = v.values()
        n += _touch_np(v.numpy())
    return n


def torch_rows(b: dict, name: str) -> int:
    """Rows of a torch batch (``varlen="ragged"``: the offsets say)."""
    off = b.get(name + "__offsets")
    return len(b[name]) if off is None else len(off) - 1


def first_numeric(b: dict, names: list[str]) -> Any:
    for k in names:
        v = b[k]
        if isinstance(v, (list, tuple)):
            continue
        if isinstance(v, np.ndarray) and v.dtype == object:
            continue
        return v
    raise ValueError("no numeric field")


def fingerprint_np(v: Any) -> float:
    if isinstance(v, Ragged):
        v = v.values
    return float(np.asarray(v, dtype=np.float64).sum())


def fingerprint_torch(v: Any) -> float:
    if v.is_nested:
        v = v.values()
    return fingerprint_np(v.numpy())


def fingerprint_tf(v: Any) -> float:
    flat = getattr(v, "flat_values", None)
    return fingerprint_np((v if flat is None else flat).numpy())


# -- variants -----------------------------------------------------------------------------------
class Variant:
    """One way of reading ``k`` epochs from ``e0``: ``run(e0, k)`` returns (rows, checksum);
    ``check(e)`` the (rows, fingerprint) of each batch of epoch ``e``."""

    def __init__(
        self,
        name: str,
        baseline: str,
        run: Callable[[int, int], tuple[int, int]],
        check: Callable[[int], list[tuple[int, float]]],
    ):
        self.name, self.baseline, self.run, self.check = name, baseline, run, check


def core_variants(r: Any, B: int, names: list[str], padded: bool) -> list[Variant]:
    def make(varlen: str) -> Variant:
        def run(e0: int, k: int) -> tuple[int, int]:
            n = ck = 0
            for e in range(e0, e0 + k):
                for b in r.batches(B, seed=0, epoch=e, varlen=varlen):
                    n += len(b[names[0]])
                    ck += touch_numpy(b)
            return n, ck

        def check(e: int) -> list[tuple[int, float]]:
            return [
                (len(b[names[0]]), fingerprint_np(first_numeric(b, names)))
                for b in r.batches(B, seed=0, epoch=e, varlen=varlen)
            ]

        return Variant("core" if varlen == "ragged" else "core padded", "core", run, check)

    out = [make("ragged")]
    if padded:
        out.append(make("padded"))
    return out


def torch_variants(r: Any, B: int, names: list[str], modes: list[str]) -> list[Variant]:
    import torch

    import rowstore.torch as rst

    def floor(e0: int, k: int) -> tuple[int, int]:
        # The least a torch adapter does: one from_numpy per array of the core's batches.
        n = ck = 0
        for e in range(e0, e0 + k):
            for b in r.batches(B, seed=0, epoch=e):
                t = {}
                for key, v in b.items():
                    if isinstance(v, Ragged):
                        t[key] = torch.from_numpy(v.values)
                        t[key + "__offsets"] = torch.from_numpy(v.offsets)
                    elif v.dtype == object:
                        t[key] = v.tolist()
                    else:
                        t[key] = torch.from_numpy(v)
                n += torch_rows(t, names[0])
                ck += touch_torch(t)
        return n, ck

    out = [Variant("torch floor (core + from_numpy)", "core", floor, lambda e: [])]
    for mode in modes:
        sfx = "" if mode == "-" else f" {mode}"
        base = "core padded" if mode == "padded" else "core"
        kw = {} if mode == "-" else {"varlen": mode}
        dl = rst.BatchedDataLoader(r, batch_size=B, seed=0, **kw)
        ds = rst.IterableDataset(r, batch_size=B, seed=0, **kw)
        rl = rst.ResumableDataLoader(ds, batch_size=None, num_workers=0)
        for name, loader in (("BatchedDataLoader", dl), ("ResumableDataLoader", rl)):

            def run(e0: int, k: int, loader: Any = loader) -> tuple[int, int]:
                n = ck = 0
                for e in range(e0, e0 + k):
                    loader.set_epoch(e)
                    for b in loader:
                        n += torch_rows(b, names[0])
                        ck += touch_torch(b)
                return n, ck

            def check(e: int, loader: Any = loader) -> list[tuple[int, float]]:
                loader.set_epoch(e)
                return [
                    (torch_rows(b, names[0]), fingerprint_torch(first_numeric(b, names)))
                    for b in loader
                ]

            out.append(Variant(f"torch {name}{sfx}", base, run, check))
    return out


def tf_variants(r: Any, B: int, names: list[str], modes: list[str]) -> list[Variant]:
    import tensorflow as tf

    import rowstore.tf as rtf

    def make(e0: int, k: int, kw: dict) -> Any:
        return rtf.make_dataset(r, batch_size=B, seed=0, epoch=e0, num_epochs=k, **kw)

    def touch_graph(b: dict) -> Any:
        ck = tf.constant(0, tf.int64)
        for v in b.values():
            if isinstance(v, tf.RaggedTensor):
                v = v.flat_values
            if v.dtype == tf.string:
                ck += tf.size(v, out_type=tf.int64)
                continue
            flat = tf.reshape(v, [-1])
            ck += tf.math.count_nonzero(flat[:: max(1, STRIDE // v.dtype.size)], dtype=tf.int64)
        return ck

    first = names[0]

    # The iterator is the argument (its spec is the element spec): one trace per variant, as
    # Keras traces its train function once and hands it the dataset's iterator.
    @tf.function
    def consume(it: Any) -> Any:
        n = tf.constant(0, tf.int64)
        ck = tf.constant(0, tf.int64)
        for b in it:
            v = b[first]
            n += v.nrows() if isinstance(v, tf.RaggedTensor) else tf.shape(v, tf.int64)[0]
            ck += touch_graph(b)
        return n, ck

    def touch_eager(b: dict) -> int:
        ck = 0
        for v in b.values():
            if isinstance(v, tf.RaggedTensor):
                v = v.flat_values
            if v.dtype == tf.string:
                ck += int(v.shape[0])
                continue
            ck += _touch_np(v.numpy())
        return ck

    out = []
    for mode in modes:
        sfx = "" if mode == "-" else f" {mode}"
        base = "core padded" if mode == "padded" else "core"
        kw = {} if mode == "-" else {"varlen": mode}

        def graph(e0: int, k: int, kw: dict = kw) -> tuple[int, int]:
            n, ck = consume(iter(make(e0, k, kw)))
            return int(n), int(ck)

        def eager(e0: int, k: int, kw: dict = kw) -> tuple[int, int]:
            n = ck = 0
            for b in make(e0, k, kw):
                v = b[first]
                n += int(v.nrows()) if isinstance(v, tf.RaggedTensor) else int(v.shape[0])
                ck += touch_eager(b)
            return n, ck

        def check(e: int, kw: dict = kw) -> list[tuple[int, float]]:
            out = []
            for b in make(e, 1, kw):
                v = b[first]
                rows = int(v.nrows()) if isinstance(v, tf.RaggedTensor) else int(v.shape[0])
                out.append((rows, fingerprint_tf(first_numeric(b, names))))
            return out

        out.append(Variant(f"tf make_dataset graph{sfx}", base, graph, check))
        out.append(Variant(f"tf make_dataset eager{sfx}", base, eager, check))

    # tf.data's own floor: one batch of the core's, repeated as many times as a pass has
    # batches, consumed by the same graph loop (what any tf.data input costs per element).
    one = next(iter(r.batches(B, seed=0, varlen="padded")))
    const = {k: tf.constant(v if v.dtype != object else v.astype(str)) for k, v in one.items()}
    steps = -(-len(r) // B)

    def floor(e0: int, k: int) -> tuple[int, int]:
        n, ck = consume_floor(iter(tf.data.Dataset.from_tensors(const).repeat(steps * k)))
        return int(n), int(ck)

    consume_floor = tf.function(consume.python_function)
    out.append(Variant("tf floor graph", "core", floor, lambda e: []))
    return out


def grain_variants(r: Any, B: int, names: list[str], modes: list[str]) -> list[Variant]:
    import rowstore.grain as rg

    out = []
    for mode in modes:
        sfx = "" if mode == "-" else f" {mode}"
        base = "core padded" if mode == "padded" else "core"
        kw = {} if mode == "-" else {"varlen": mode}

        def make(e0: int, k: int, kw: dict = kw) -> Any:
            return rg.EpochDataset(
                r, batch_size=B, seed=0, epoch=e0, num_epochs=k, shard=(0, 1), **kw
            )

        def run(e0: int, k: int, make: Any = make) -> tuple[int, int]:
            n = ck = 0
            for b in make(e0, k):
                n += len(b[names[0]])
                ck += touch_numpy(b)
            return n, ck

        def check(e: int, make: Any = make) -> list[tuple[int, float]]:
            return [(len(b[names[0]]), fingerprint_np(first_numeric(b, names))) for b in make(e, 1)]

        out.append(Variant(f"grain EpochDataset{sfx}", base, run, check))
    return out


def variants(r: Any, B: int, adapters: list[str]) -> list[Variant]:
    names = r.schema.names
    ragged = any(f.is_variable for f in r.schema)
    out = core_variants(r, B, names, padded=ragged)
    # Variable fields: the layout matching the core's Ragged, then padded (against core padded).
    torch_modes = ["ragged", "nested", "padded"] if ragged else ["-"]
    other_modes = ["ragged", "padded"] if ragged else ["-"]
    if any(a.startswith("torch") for a in adapters):
        out += torch_variants(r, B, names, torch_modes)
    if any(a.startswith("tf") for a in adapters):
        out += tf_variants(r, B, names, other_modes)
    if any(a.startswith("grain") for a in adapters):
        out += grain_variants(r, B, names, other_modes)
    return [
        v
        for v in out
        if v.name.startswith(("core", "tf floor", "torch floor"))
        or any(v.name.startswith(a) for a in adapters)
    ]


# -- measuring ----------------------------------------------------------------------------------
def check_order(vs: list[Variant], epoch: int = 1) -> None:
    """Every variant's epoch ``epoch``, batch by batch, against its baseline's."""
    ref = {v.name: v.check(epoch) for v in vs if v.name.startswith("core")}
    for v in vs:
        if v.name.startswith("core") or "floor" in v.name:
            continue
        got, want = v.check(epoch), ref[v.baseline]
        rows_ok = [g[0] for g in got] == [w[0] for w in want]
        sums_ok = rows_ok and np.allclose([g[1] for g in got], [w[1] for w in want], rtol=1e-9)
        if not (rows_ok and sums_ok):
            raise SystemExit(f"{v.name}: epoch {epoch} differs from {v.baseline}'s batches")


def measure(vs: list[Variant], passes: int, pass_seconds: float) -> tuple[int, dict]:
    core = vs[0]
    t = time.perf_counter()
    core.run(100, 1)  # warm-up, and the length of an epoch
    k = max(1, math.ceil(pass_seconds / (time.perf_counter() - t)))
    runs: dict[str, list[dict]] = {v.name: [] for v in vs}
    for p in range(passes + 1):  # pass 0: warm-up
        shift = p % len(vs)
        for v in vs[shift:] + vs[:shift]:
            e0 = 1000 + p * k  # the same epochs through every variant
            c, t = time.process_time(), time.perf_counter()
            n, ck = v.run(e0, k)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            if p:
                runs[v.name].append({"rows": n, "wall_s": wall, "cpu_s": cpu, "touched": ck})
    return k, runs


def summarize(vs: list[Variant], runs: dict) -> dict:
    out = {}
    for v in vs:
        rs, bs = runs[v.name], runs[v.baseline]
        rate = [x["rows"] / x["wall_s"] for x in rs]
        cpu_rate = [x["rows"] / max(x["cpu_s"], 1e-9) for x in rs]
        ratio = [a["rows"] / a["wall_s"] / (b["rows"] / b["wall_s"]) for a, b in zip(rs, bs)]
        cpu_ratio = [
            a["rows"] / max(a["cpu_s"], 1e-9) / (b["rows"] / max(b["cpu_s"], 1e-9))
            for a, b in zip(rs, bs)
        ]
        out[v.name] = {
            "baseline": v.baseline,
            "rows_per_s": statistics.median(rate),
            "rows_per_cpu_s": statistics.median(cpu_rate),
            "ratio": statistics.median(ratio),
            "cpu_ratio": statistics.median(cpu_ratio),
            "passes": rs,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="tiny,patch,speech")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--adapters", default=",".join(ADAPTERS), help="comma-separated names")
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--pass-seconds", type=float, default=2.0)
    for w, n in ROWS.items():
        p.add_argument(f"--{w}-rows", type=int, default=n)
    p.add_argument("--cache-dir", default=default_cache_dir())
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "adapter_bench.json"))
    args = p.parse_args(argv)
    adapters = [a.strip() for a in args.adapters.split(",") if a.strip()]
    unknown = set(adapters) - set(ADAPTERS)
    if unknown:
        raise SystemExit(f"unknown adapters {sorted(unknown)}; choose from {ADAPTERS}")

    doc: dict[str, Any] = {
        "benchmark": "adapter_bench",
        "rowstore": rowstore.__version__,
        "machine": machine_info(),
        "passes": args.passes,
        "pass_seconds": args.pass_seconds,
        "results": {},
    }
    t0 = time.perf_counter()
    table = []
    for w in args.workloads.split(","):
        path = ensure_demo(w, getattr(args, f"{w}_rows"), args.cache_dir, log=_log)
        warm_cache([path])
        r = rowstore.open(path)
        for B in (int(x) for x in args.batches.split(",")):
            vs = variants(r, B, adapters)
            check_order(vs)
            k, runs = measure(vs, args.passes, args.pass_seconds)
            res = summarize(vs, runs)
            doc["results"][f"{w} B={B}"] = {"rows": len(r), "epochs_per_pass": k, "variants": res}
            for name, x in res.items():
                line = (
                    f"{w:6s} B={B:<4d} {name:36s} {x['rows_per_s']:12,.0f} rows/s  "
                    f"{x['ratio']:5.2f}x {x['baseline']:11s}  cpu {x['cpu_ratio']:5.2f}x"
                )
                table.append(line)
                _log(line)
            doc["seconds"] = time.perf_counter() - t0
            doc["load_avg_end"] = list(os.getloadavg())
            _write(doc, args.out)  # after each workload and batch size: a partial run counts
    if args.out:
        _log(f"wrote {args.out}")
    return 0


def _write(doc: dict, out: str | None) -> None:
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
