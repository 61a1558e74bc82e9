"""Read benchmark of the four workloads of DESIGN.md: rowstore against the loaders a
user would write by hand, on the same data, in the same run, with memcpy as the ceiling.

    python bench/read_bench.py [--quick] [--out bench/results/read_bench.json] [--doc
    docs/performance.md]

For each workload (written once with ``rowstore.demo.make_demo`` into the cache directory) it
reads one shuffled epoch with warm page cache (the files are read once first) with rowstore
(``Reader.batches``, block shuffle, and full shuffle for ``patch``; 1 and 2 threads) and with
the baselines of :mod:`rowstore.bench.sources` (h5py per-row and sorted fancy reads, PyTables
``read_coordinates`` and block reads + gather, numpy memmap gathers). Every reader runs in a
fresh process: one warm-up epoch, then the median of 5 (rowstore) or 3 (baselines) epochs. Slow
baselines are
timed on part of the epoch (a fixed number of rows, or a time limit) and their rate extrapolated;
the output says so. Results: JSON (``--out``), a markdown section of ``docs/performance.md``
(between ``<!-- read_bench:begin -->`` and ``<!-- read_bench:end -->``), a plot, and PASS/MISS
lines for the targets of the issue.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

from rowstore.bench import measure, report, runner, sources  # noqa: E402
from rowstore.bench.cli import ensure_demo  # noqa: E402

#: name -> rows (full run), rows (--quick), batch size, rowstore shuffles
WORKLOADS: dict[str, dict[str, Any]] = {
    "tiny": {
        "rows": 2_000_000,
        "quick": 100_000,
        "batch": 1024,
        "shuffles": ["block"],
        "adapters": True,
    },
    "patch": {"rows": 20_000, "quick": 2_000, "batch": 128, "shuffles": ["block", "full"]},
    "image": {"rows": 2_000, "quick": 200, "batch": 64, "shuffles": ["block"]},
    "speech": {"rows": 20_000, "quick": 2_000, "batch": 64, "shuffles": ["block"]},
}
BASELINE_ORDER = ["h5py-row", "h5py-fancy", "tables-coords", "tables-block", "memmap"]
THREADS = (1, 2)
WINDOW = 16
BEGIN, END = "<!-- read_bench:begin -->", "<!-- read_bench:end -->"


def _settings(quick: bool) -> dict[str, Any]:
    return {
        # rowstore epochs take 0.1-2 s: more repeats make their medians steadier on a shared
        # machine.
        "repeats": 3,
        "rowstore_repeats": 5,
        "warmup_repeats": 1,
        # Baselines: a repeat stops after this many seconds (rate extrapolated to the epoch).
        "baseline_time_limit": 0.25 if quick else 2.0,
        # h5py per-row: rows timed per repeat (at a few thousand rows/s an epoch takes minutes).
        "per_row_rows": 500 if quick else 5_000,
        "memcpy_bytes": (256 if quick else 1024) << 20,
    }


def _log(msg: str) -> None:
    print(msg, flush=True)


def run_workload(
    name: str, rows: int, cfg: dict[str, Any], st: dict[str, Any], cache_dir: str
) -> dict[str, Any]:
    path = ensure_demo(name, rows, cache_dir, log=_log)
    npy_dir = os.path.join(cache_dir, "npy", os.path.splitext(os.path.basename(path))[0])
    sources.export_npy(path, npy_dir)
    t = time.perf_counter()
    warmed = measure.warm_cache([path, npy_dir])
    from rowstore.format.index import Layout

    L = Layout.open(path)
    B = cfg["batch"]
    common = {
        "path": path,
        "batch_size": B,
        "window": WINDOW,
        "seed": 0,
        "warmup": 0,
        "measure": None,
        "repeats": st["repeats"],
        "warmup_repeats": st["warmup_repeats"],
    }
    specs = []
    for shuffle in cfg["shuffles"]:
        for t_ in THREADS:
            specs.append(
                dict(
                    common,
                    kind="rowstore",
                    mode="numpy",
                    shuffle=shuffle,
                    threads=t_,
                    repeats=st["rowstore_repeats"],
                )
            )
    if cfg.get("adapters") and not quick_adapters_off():
        # The framework paths on raw rows, next to the core reader: torch's
        # BatchedDataLoader, a DataLoader over the map-style Dataset with 0 and 2 workers, and
        # rowstore.tf's tf.data pipeline.
        for mode, extra in (
            ("torch-batched", {}),
            ("torch", {"workers": 0}),
            ("torch", {"workers": 2}),
            ("tf", {}),
        ):
            specs.append(
                dict(common, kind="rowstore", mode=mode, shuffle="block", threads=2, **extra)
            )
    for kind in BASELINE_ORDER:
        s = dict(common, kind=kind, npy_dir=npy_dir, time_limit=st["baseline_time_limit"])
        if kind == "h5py-row":
            s.update(max_rows=st["per_row_rows"], time_limit=None)
        specs.append(s)
    results = []
    for s in specs:
        res = runner.run_spec(s)
        res.setdefault("kind", s["kind"])
        res["spec"] = {k: v for k, v in s.items() if k not in ("path", "npy_dir")}
        results.append(res)
        if res.get("error"):
            _log(f"  {name:6s} {res.get('label', s['kind']):34s} ERROR {res['error']}")
        else:
            _log(
                f"  {name:6s} {res['label']:34s} {report.fmt_rate(res['rows_per_s']):>7s} rows/s "
                f"{res['bytes_per_s'] / 1e9:6.3f} GB/s  q={res['shuffle_quality']:.3f}"
                + ("  (partial epoch)" if res.get("stopped_early") else "")
            )
    return {
        "name": name,
        "path": path,
        "rows": L.num_rows,
        "batch_size": B,
        "window": WINDOW,
        "row_bytes": L.row_dtype.itemsize,
        "rows_per_block": L.rows_per_block,
        "blocks": L.num_blocks,
        "heap_bytes": L.heap_nbytes,
        "raw_bytes": L.raw_nbytes,
        "file_bytes": L.file_size,
        "warm_cache_bytes": warmed,
        "warm_cache_s": time.perf_counter() - t,
        "results": results,
    }


def add_ratios(w: dict[str, Any], memcpy_gbps: float) -> None:
    """Per reader: ratio of its rows/s to each baseline's, and its decoded bandwidth to memcpy."""
    base = {
        r["kind"]: r for r in w["results"] if r["kind"] in sources.BASELINES and r.get("rows_per_s")
    }
    for r in w["results"]:
        if not r.get("rows_per_s"):
            continue
        r["vs"] = {k: r["rows_per_s"] / b["rows_per_s"] for k, b in base.items()}
        r["gb_per_s"] = r["bytes_per_s"] / 1e9
        r["fraction_of_memcpy"] = r["gb_per_s"] / memcpy_gbps


def quick_adapters_off() -> bool:
    """ROWSTORE_BENCH_NO_ADAPTERS=1 skips the torch/tf rows (they import the frameworks)."""
    return os.environ.get("ROWSTORE_BENCH_NO_ADAPTERS") == "1"


def _best(w: dict, shuffle: str, threads: int | None = None, mode: str = "numpy") -> dict | None:
    """The fastest rowstore reader of that shuffle (and thread count) in that mode."""
    c = [
        r
        for r in w["results"]
        if r["kind"] == "rowstore"
        and r.get("rows_per_s")
        and r["spec"].get("mode", "numpy") == mode
        and r["spec"]["shuffle"] == shuffle
        and (threads is None or r["spec"]["threads"] == threads)
    ]
    return max(c, key=lambda r: r["rows_per_s"]) if c else None


def _baseline(w: dict, kind: str) -> dict | None:
    return next((r for r in w["results"] if r["kind"] == kind and r.get("rows_per_s")), None)


def _shared(machine: dict, ws: dict) -> bool:
    """Other jobs ran on the machine: a load average above 0.7 before we started, or a
    single-threaded rowstore reader that got less than 80% of a core (it never waits on I/O
    with a warm cache, so it was waiting for a CPU)."""
    if (machine.get("load_avg") or [0])[0] > 0.7:
        return True
    cpu = [
        r["cpu_percent"]
        for w in ws.values()
        for r in w["results"]
        if r["kind"] == "rowstore"
        and r.get("spec", {}).get("threads") == 1
        and r.get("cpu_percent")
    ]
    return bool(cpu) and min(cpu) < 80


def check_targets(ws: dict[str, dict], memcpy_gbps: float) -> list[dict[str, Any]]:
    """The targets of DESIGN.md, each with its figures and PASS/MISS."""
    out = []

    def add(
        name: str, value: float, threshold: float, figures: str, *, at_most: bool = False
    ) -> None:
        ok = value <= threshold if at_most else value >= threshold
        if at_most:
            margin = threshold / value - 1.0 if value > 0 else float("inf")
        else:
            margin = value / threshold - 1.0
        out.append(
            {
                "target": name,
                "status": "PASS" if ok else "MISS",
                "figures": figures,
                "value": value,
                "threshold": threshold,
                "margin": margin,
            }
        )

    if "tiny" in ws:
        b, pt = _best(ws["tiny"], "block"), _baseline(ws["tiny"], "tables-block")
        if b:
            add(
                "tiny: block shuffle >= 20 M rows/s",
                b["rows_per_s"],
                20e6,
                f"{b['rows_per_s'] / 1e6:.1f} M rows/s ({b['label']})",
            )
        if b and pt:
            ratio = b["rows_per_s"] / pt["rows_per_s"]
            add(
                "tiny: >= 5x PyTables block reads + gather",
                ratio,
                5,
                f"{ratio:.2f}x ({b['rows_per_s'] / 1e6:.1f} M vs {pt['rows_per_s'] / 1e6:.2f} M "
                f"rows/s)",
            )
        core2 = _best(ws["tiny"], "block", 2)
        tb = _best(ws["tiny"], "block", 2, mode="torch-batched")
        if core2 and tb:
            loss = 1 - tb["rows_per_s"] / core2["rows_per_s"]
            add(
                "tiny: torch BatchedDataLoader loses <= 10% to the core reader",
                loss,
                0.10,
                f"{loss:.1%} ({tb['rows_per_s'] / 1e6:.1f} M vs {core2['rows_per_s'] / 1e6:.1f} M "
                f"rows/s, 2 threads)",
                at_most=True,
            )
    for name, frac in (("patch", 0.40), ("speech", 0.30)):
        if name in ws:
            b = _best(ws[name], "block")
            if b:
                f = b["bytes_per_s"] / 1e9 / memcpy_gbps
                add(
                    f"{name}: >= {frac:.0%} of memcpy GB/s",
                    f,
                    frac,
                    f"{b['bytes_per_s'] / 1e9:.2f} GB/s = {f:.1%} of memcpy {memcpy_gbps:.1f} GB/s "
                    f"({b['label']})",
                )
    if "image" in ws:
        one, two = _best(ws["image"], "block", 1), _best(ws["image"], "block", 2)
        if one and two:
            s = two["rows_per_s"] / one["rows_per_s"]
            add(
                "image: 2 threads >= 1.7x one thread",
                s,
                1.7,
                f"{s:.2f}x ({two['rows_per_s']:,.0f} vs {one['rows_per_s']:,.0f} rows/s)",
            )
    if "patch" in ws:
        blk, full = _best(ws["patch"], "block"), _best(ws["patch"], "full")
        if blk and full:
            s = blk["rows_per_s"] / full["rows_per_s"]
            add(
                "patch: full shuffle within 2x of block",
                s,
                2,
                f"block/full = {s:.2f} ({blk['rows_per_s']:,.0f} vs {full['rows_per_s']:,.0f} "
                f"rows/s; "
                f"quality {blk['shuffle_quality']:.2f} vs {full['shuffle_quality']:.2f})",
                at_most=True,
            )
    return out


#: Within this relative margin of its threshold, a target's PASS/MISS on a shared machine is noise.
NOISE_MARGIN = 0.15


def _borderline(t: dict, shared: bool | None) -> str:
    if shared and abs(t["margin"]) < NOISE_MARGIN:
        return (
            f" (within {NOISE_MARGIN:.0%} of the threshold on a shared machine: "
            "not settled by this run)"
        )
    return ""


# -- markdown -----------------------------------------------------------------------------------
_SHORT = {
    "h5py-row": "x h5py row",
    "h5py-fancy": "x h5py fancy",
    "tables-coords": "x PT coords",
    "tables-block": "x PT block",
    "memmap": "x memmap",
}


def _x(v: float | None) -> str:
    if v is None:
        return "-"
    if v < 1:
        return f"{v:.2g}"
    return f"{v:,.0f}" if v >= 100 else (f"{v:.1f}" if v >= 10 else f"{v:.2f}")


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    st = doc["settings"]
    lines = [
        BEGIN,
        "## Read benchmark (`bench/read_bench.py`)",
        "",
        "_Generated by `python bench/read_bench.py"
        + (" --quick" if doc["quick"] else "")
        + "`; rerunning replaces this "
        "section. Figures from one run on one machine: compare ratios, not absolute numbers, "
        "across machines._",
        "",
        f"Run {doc['created']} on {m.get('cpus')} CPUs, {m.get('memory_gib', '?')} GiB RAM, "
        f"{m.get('platform')}, "
        f"Python {m.get('python')}, numpy {m.get('numpy')}; load average at start "
        f"{m.get('load_avg', '?')}"
        + (
            " (**the machine was shared with other jobs: expect noise of tens of percent**)."
            if doc.get("shared")
            else "."
        ),
        "",
        f"Method: each workload is written with `rowstore.demo.make_demo`; every file is read once "
        f"before measuring "
        f"(warm page cache). Each reader runs in a fresh process (so peak RSS is its own): "
        f"{st['warmup_repeats']} warm-up epoch, then the **median of {st['rowstore_repeats']} "
        f"(rowstore) or "
        f"{st['repeats']} (baselines) shuffled epochs**, every batch touched; `spread` = fastest / "
        f"slowest repeat. Rows/s count delivered rows; GB/s counts the decoded bytes of every "
        f"field's values (images "
        f"decoded, str as UTF-8 bytes), 1 GB = 1e9 bytes. Ceiling: `np.copyto` of "
        f"{st['memcpy_bytes'] >> 20} MiB, "
        f"measured at the start and at the end of the run, the higher one: "
        f"**{doc['memcpy_ceiling_gb_per_s']:.1f} GB/s** "
        f"({doc['memcpy']['gb_per_s']:.1f} and "
        f"{(doc['memcpy_end'] or {}).get('gb_per_s', float('nan')):.1f}). Baselines that would "
        f"take minutes per epoch are timed "
        f"on part of it (h5py per-row: {st['per_row_rows']:,} rows per repeat; the others stop "
        f"after "
        f"{st['baseline_time_limit']:g} s) and marked *; their rates are extrapolated. `x "
        f"<baseline>` = this "
        f"reader's rows/s divided by the baseline's. CPU%: process CPU time over wall time (200% = "
        f"both cores; "
        f"a single-threaded reader well under 100% was waiting for a CPU taken by other jobs). "
        f"Peak RSS includes "
        f"the interpreter and imports (about 60 MiB). Shuffle quality: 1 = batches as mixed as a "
        f"uniform shuffle.",
        "",
        "Baselines (what a user would otherwise write, on the same file or on `.npy` exports of "
        "it):",
        "",
    ]
    for kind in BASELINE_ORDER:
        label, desc = sources.BASELINES[kind]
        lines.append(f"- **{label}**: {desc}")
    lines.append("")
    lines.append("### Targets")
    lines.append("")
    for t in doc["targets"]:
        lines.append(
            f"- **{t['status']}** {t['target']}: {t['figures']}" + _borderline(t, doc.get("shared"))
        )
    lines.append("")
    for w in doc["workloads"].values():
        lines.append(f"### {w['name']}: {w['rows']:,} rows, batch {w['batch_size']}")
        lines.append("")
        lines.append(
            f"{w['row_bytes']} B rows, {w['blocks']:,} blocks of {w['rows_per_block']:,} rows, "
            f"{w['raw_bytes'] / 1e6:,.0f} MB stored uncompressed"
            + (
                f" (of which {w['heap_bytes'] / 1e6:,.0f} MB heap payloads)"
                if w["heap_bytes"]
                else ""
            )
            + "."
        )
        lines.append("")
        present = [
            k
            for k in BASELINE_ORDER
            if any(r["kind"] == k and r.get("rows_per_s") for r in w["results"])
        ]
        header = (
            ["reader", "rows/s", "GB/s", "% memcpy"]
            + [_SHORT[k] for k in present]
            + ["CPU%", "spread", "peak RSS", "shuffle q"]
        )
        rows = []
        for r in w["results"]:
            if r.get("error"):
                rows.append(
                    [r.get("label", r["kind"]), "error: " + r["error"]] + [""] * (len(header) - 2)
                )
                continue
            label = r["label"] + (" *" if r.get("stopped_early") else "")
            rows.append(
                [
                    label,
                    report.fmt_rate(r["rows_per_s"]),
                    f"{r['gb_per_s']:.3g}",
                    f"{100 * r['fraction_of_memcpy']:.1f}%",
                ]
                + [_x(r["vs"].get(k)) for k in present]
                + [
                    f"{r['cpu_percent']:.0f}%" if r.get("cpu_percent") is not None else "-",
                    f"{r['spread']:.2f}" if r.get("spread") else "-",
                    f"{r['peak_rss_mb']:,.0f} MiB",
                    f"{r['shuffle_quality']:.3f}",
                ]
            )
        lines.append(report.markdown_table(header, rows))
        lines.append("")
    if doc.get("plot"):
        lines.append(
            f"![read benchmark]({os.path.relpath(doc['plot'], os.path.join(ROOT, 'docs'))})"
        )
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_section(doc_path: str, section: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace the generated section of ``doc_path`` between ``begin`` and ``end`` (other
    sections kept), or append it."""
    text = ""
    if os.path.exists(doc_path):
        with open(doc_path) as fh:
            text = fh.read()
    if begin in text and end in text:
        a = text.index(begin)
        b = text.index(end) + len(end)
        text = text[:a] + section + text[b:]
    else:
        if not text:
            text = "# Performance\n\n"
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(doc_path)), exist_ok=True)
    tmp = doc_path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, doc_path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small datasets and short time limits (< 1 min smoke run)",
    )
    ap.add_argument(
        "--out",
        default=os.path.join(ROOT, "bench", "results", "read_bench.json"),
        help="JSON output",
    )
    ap.add_argument(
        "--doc",
        default=os.path.join(ROOT, "docs", "performance.md"),
        help="markdown file whose read_bench section is (re)generated ('' to skip)",
    )
    ap.add_argument("--plot", default=None, help="PNG plot (default: next to --out, same stem)")
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument(
        "--cache-dir",
        default=os.environ.get("ROWSTORE_CACHE", os.path.join(ROOT, ".cache", "rowstore")),
    )
    args = ap.parse_args(argv)
    st = _settings(args.quick)
    t0 = time.perf_counter()
    machine = measure.machine_info()
    _log(
        f"read_bench{' --quick' if args.quick else ''}: {machine.get('cpus')} CPUs, load "
        f"{machine.get('load_avg')}"
    )
    mc = runner.run_spec({"kind": "memcpy", "nbytes": st["memcpy_bytes"], "repeats": 5})
    if mc.get("error"):
        _log(f"memcpy failed: {mc['error']}")
        return 1
    _log(f"memcpy: {mc['gb_per_s']:.2f} GB/s")
    ws = {}
    for name in args.workloads:
        cfg = WORKLOADS[name]
        rows = cfg["quick"] if args.quick else cfg["rows"]
        _log(f"{name}: {rows:,} rows, batch {cfg['batch']}")
        ws[name] = run_workload(name, rows, cfg, st, args.cache_dir)
    mc_end = runner.run_spec({"kind": "memcpy", "nbytes": st["memcpy_bytes"], "repeats": 5})
    load_end = measure.machine_info().get("load_avg")
    # The ceiling: the higher of the two memcpy figures (start and end of the run), so that a
    # busy moment of the machine does not flatter the fractions of memcpy.
    ceiling = max(mc["gb_per_s"], mc_end.get("gb_per_s") or 0.0)
    for w in ws.values():
        add_ratios(w, ceiling)
    targets = check_targets(ws, ceiling)
    doc: dict[str, Any] = {
        "tool": "bench/read_bench.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "machine": machine,
        "load_avg_end": load_end,
        "settings": st,
        "memcpy": mc,
        "memcpy_end": mc_end if not mc_end.get("error") else None,
        "memcpy_ceiling_gb_per_s": ceiling,
        "shared": _shared(machine, ws),
        "cache": "warm: every file read once before measuring",
        "workloads": ws,
        "targets": targets,
        "seconds": None,
    }
    out = os.path.abspath(args.out)
    doc["plot"] = os.path.abspath(args.plot) if args.plot else os.path.splitext(out)[0] + ".png"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    os.makedirs(os.path.dirname(doc["plot"]), exist_ok=True)
    report.plot(
        [(w["name"], w["results"]) for w in ws.values()],
        doc["plot"],
        memcpy_gbps=ceiling,
        title="read_bench: one shuffled epoch per reader, warm page cache"
        + (" (--quick)" if args.quick else ""),
        subtitle=f"{machine.get('cpus')} CPUs; median of {st['rowstore_repeats']}/{st['repeats']} "
        f"epochs; blue = rowstore, grey = baselines; "
        "MB/s = decoded bytes of all fields",
    )
    doc["seconds"] = time.perf_counter() - t0
    with open(out + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(out + ".tmp", out)
    if args.doc:
        write_section(args.doc, markdown(doc))
    _log("")
    _log(
        f"memcpy ceiling {ceiling:.1f} GB/s (start {mc['gb_per_s']:.1f}, end "
        f"{mc_end.get('gb_per_s', float('nan')):.1f} GB/s)"
    )
    for t in targets:
        _log(f"{t['status']}: {t['target']}: {t['figures']}" + _borderline(t, doc["shared"]))
    _log(
        f"written: {out}, {doc['plot']}"
        + (f", {args.doc}" if args.doc else "")
        + f" ({doc['seconds']:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
