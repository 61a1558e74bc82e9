"""The torch path at ordinary batch sizes, against the core reader in the same run.

Two parts, on the ``tiny`` demo (float32[16] + int64 label, 72-byte rows, uncompressed, warm cache):

- ``BatchedDataLoader`` against ``Reader.batches`` (block shuffle, same seed and epochs) at each
  batch size, with no consumer and with a consumer touching every batch (summing ``x``: numpy
  for the reader, torch for the loader), and the floor ``Reader.batches`` + one
  ``torch.from_numpy`` per array (+ the same torch sum);
- the map-style ``Dataset`` under torch's ``DataLoader`` (uniform ``RandomSampler`` order,
  ``collate_fn=rowstore.torch.collate``, persistent workers) with 0 and 2 workers, and
  ``IterableDataset(batch_size=B)`` under ``DataLoader(batch_size=None)`` with 0 and 2 workers.

Wall seconds and CPU seconds (this process's threads plus its exited DataLoader workers) per
epoch; medians over rounds. Every round runs every variant once, in turn (A/B/A/B), so load
changes hit all of them alike. ``--base DIR`` measures another checkout too: rounds alternate
between child processes with ``PYTHONPATH=DIR`` (e.g. ``main``'s code before a change) and this
checkout, and the JSON holds both with their ratios.

    python bench/torch_path.py [--rows 400000] [--rounds 5] [--base /path/to/main] [--out
    bench/results/torch_path.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu() -> float:
    """CPU seconds of this process, its live children (persistent DataLoader workers) and the
    exited ones."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as fh:
                pids = fh.read().split()
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    f = fh.read().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / tick  # utime, stime
            except (OSError, IndexError, ValueError):
                pass
    return total


def _variants(path: str, batch_sizes: list[int], dl_batch: int, dl_rows: int) -> dict:
    """name -> callable(epoch) running one epoch and returning the rows it saw."""
    import torch
    from torch.utils.data import DataLoader

    import rowstore
    import rowstore.torch as rst

    r = rowstore.open(path)
    out = {}
    for bs in batch_sizes:
        loader = rst.BatchedDataLoader(r, batch_size=bs, seed=0)

        def reader(e, bs=bs, touch=False):
            n = 0
            for b in r.batches(bs, seed=0, epoch=e):
                n += len(b["label"])
                if touch:
                    b["x"].sum()
            return n

        def floor(e, bs=bs, touch=False):
            n = 0
            for b in r.batches(bs, seed=0, epoch=e):
                t = {k: torch.from_numpy(v) for k, v in b.items()}
                n += len(t["label"])
                if touch:
                    t["x"].sum()
            return n

        def batched(e, loader=loader, touch=False):
            n = 0
            loader.set_epoch(e)
            for b in loader:
                n += len(b["label"])
                if touch:
                    b["x"].sum()
            return n

        for touch in (False, True):
            sfx = "+sum" if touch else ""
            out[f"reader B={bs}{sfx}"] = lambda e, f=reader, t=touch: f(e, touch=t)
            out[f"reader+from_numpy B={bs}{sfx}"] = lambda e, f=floor, t=touch: f(e, touch=t)
            out[f"BatchedDataLoader B={bs}{sfx}"] = lambda e, f=batched, t=touch: f(e, touch=t)
    # The DataLoader parts read a smaller file of the same demo (they are 10-50x slower).
    rd = rowstore.open(_prefix_file(path, dl_rows))
    ds = rst.Dataset(rd)
    for w in (0, 2):
        g = torch.Generator()
        g.manual_seed(0)
        # Persistent workers (started by the warm-up epoch): what is measured is the steady state.
        dl = DataLoader(
            ds,
            batch_size=dl_batch,
            shuffle=True,
            num_workers=w,
            collate_fn=rst.collate,
            generator=g,
            persistent_workers=w > 0,
        )

        def mapstyle(e, dl=dl):
            n = 0
            for b in dl:
                n += len(b["label"])
                b["x"].sum()
            return n

        ids = rst.IterableDataset(rd, batch_size=dl_batch, seed=0)
        idl = DataLoader(ids, batch_size=None, num_workers=w, persistent_workers=w > 0)

        def iterable(e, ids=ids, idl=idl):
            ids.set_epoch(e)
            n = 0
            for b in idl:
                n += len(b["label"])
                b["x"].sum()
            return n

        out[f"Dataset+DataLoader B={dl_batch} workers={w}+sum"] = mapstyle
        out[f"IterableDataset+DataLoader B={dl_batch} workers={w}+sum"] = iterable
    return out


def _prefix_file(path: str, rows: int) -> str:
    """A tiny demo file of ``rows`` rows next to ``path`` (written once)."""
    from rowstore.demo import make_demo

    p = os.path.join(os.path.dirname(path), f"tiny_{rows}.h5")
    if not os.path.exists(p):
        make_demo("tiny", p, rows)
    return p


def child(args) -> int:
    """One round: every variant once, in turn; prints {name: [wall_s, cpu_s, rows]}."""
    fns = _variants(args.path, args.batch_sizes, args.dl_batch, args.dl_rows)
    res = {}
    for name, fn in fns.items():
        fn(args.epoch + 1)  # warm-up of this variant (and the start of its persistent workers)
        c0, t0 = _cpu(), time.perf_counter()
        n = fn(args.epoch)
        res[name] = [time.perf_counter() - t0, _cpu() - c0, n]
    print(json.dumps(res))
    return 0


def _summarize(rounds: list[dict]) -> dict:
    names = list(rounds[0])
    out = {}
    for name in names:
        wall = [r[name][0] for r in rounds]
        cpu = [r[name][1] for r in rounds]
        rows = rounds[0][name][2]
        out[name] = {
            "rows": rows,
            "wall_s": round(statistics.median(wall), 5),
            "cpu_s": round(statistics.median(cpu), 5),
            "rows_per_s": round(rows / statistics.median(wall)),
            "wall_all": [round(x, 4) for x in wall],
        }
    for name, v in out.items():  # ratios against the reader of the same batch size and consumer
        if " B=" not in name or name.startswith("reader B="):
            continue
        kind, rest = name.split(" B=", 1)
        ref = out.get("reader B=" + rest)
        if ref is not None:
            v["rate_over_reader"] = round(v["rows_per_s"] / ref["rows_per_s"], 3)
            v["cpu_over_reader"] = round(v["cpu_s"] / ref["cpu_s"], 3)
    for w in (2,):
        for kind in ("Dataset+DataLoader", "IterableDataset+DataLoader"):
            a = [k for k in out if k.startswith(kind) and f"workers={w}" in k]
            z = [k for k in out if k.startswith(kind) and "workers=0" in k]
            if a and z:
                out[a[0]]["rate_over_workers0"] = round(
                    out[a[0]]["rows_per_s"] / out[z[0]]["rows_per_s"], 3
                )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument(
        "--dl-rows", type=int, default=200_000, help="rows of the DataLoader parts' file"
    )
    ap.add_argument("--dl-batch", type=int, default=1024)
    ap.add_argument("--batch-sizes", default="256,1024")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--base", default=None, help="another checkout to measure in the same run (PYTHONPATH)"
    )
    ap.add_argument("--out", default=None, help="JSON output (default: print)")
    ap.add_argument(
        "--path",
        default=None,
        help="the tiny demo file (written there if missing; default: a temp dir)",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--epoch", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.batch_sizes = [int(x) for x in str(args.batch_sizes).split(",")]
    if args.child:
        return child(args)
    tmp = tempfile.mkdtemp(prefix="torch_path_")
    if args.path is None or not os.path.exists(args.path):
        sys.path.insert(0, ROOT)
        from rowstore.demo import make_demo

        args.path = make_demo("tiny", args.path or os.path.join(tmp, "tiny.h5"), args.rows)
    _prefix_file(args.path, args.dl_rows)
    sides = (
        {"this": ROOT} if args.base is None else {"base": os.path.abspath(args.base), "this": ROOT}
    )
    rounds: dict[str, list] = {k: [] for k in sides}
    load = [os.getloadavg()]
    t0 = time.perf_counter()
    for i in range(args.rounds):
        for side, pp in sides.items():
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                "--path",
                args.path,
                "--epoch",
                str(i % 3),
                "--batch-sizes",
                ",".join(map(str, args.batch_sizes)),
                "--dl-batch",
                str(args.dl_batch),
                "--dl-rows",
                str(args.dl_rows),
            ]
            env = dict(os.environ, PYTHONPATH=pp)
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if p.returncode:
                sys.stderr.write(p.stderr)
                return p.returncode
            rounds[side].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(
                f"round {i + 1}/{args.rounds} {side} done ({time.perf_counter() - t0:.0f} s, load "
                f"{os.getloadavg()[0]:.1f})",
                file=sys.stderr,
                flush=True,
            )
        load.append(os.getloadavg())
    doc = {
        "tool": "bench/torch_path.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "rows": args.rows,
        "dl_rows": args.dl_rows,
        "rounds": args.rounds,
        "load_avg": [list(x) for x in load],
        "seconds": round(time.perf_counter() - t0),
        "sides": {k: {"pythonpath": v} for k, v in sides.items()},
    }
    for side in sides:
        doc["sides"][side]["results"] = _summarize(rounds[side])
    if args.base is not None:
        a, b = doc["sides"]["base"]["results"], doc["sides"]["this"]["results"]
        doc["this_over_base"] = {
            k: round(b[k]["rows_per_s"] / a[k]["rows_per_s"], 3) for k in b if k in a
        }
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
