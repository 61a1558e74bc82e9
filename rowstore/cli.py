"""``rowstore``: inspect datasets from the shell.

    rowstore info PATH        schema, rows, blocks, sizes, compression, format version
    rowstore head PATH -n N   the first N rows, arrays summarised
    rowstore verify PATH      read every block (of every shard) and check checksums
    rowstore gc PATH          remove killed writers' temporary files; for a dataset directory,
                              list (with --delete: remove) old versions and unreferenced shards
    rowstore import-petastorm URL OUT
                              convert a Petastorm dataset (petastorm not needed) to a dataset

PATH is a ``.h5`` file or a dataset directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from rowstore.errors import RowstoreError

__all__ = ["main", "info_text", "head_text", "gc_text", "gc_dataset_text"]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def info_text(path: str) -> str:
    from rowstore.format.shards import DatasetLayout

    L = DatasetLayout.open(path)
    rows = []
    for f in L.schema:
        shape = "(" + ", ".join("None" if d is None else str(d) for d in f.shape) + ("," if len(f.shape) == 1 else "") + ")"
        codec = ", ".join(f"{k}={v}" for k, v in f.codec.items() if k != "id")
        rows.append([
            f.name, str(f.dtype), shape, f.codec["id"] + (f"({codec})" if codec else ""),
            "row" if f.inline else "heap", "yes" if f.nullable else "",
        ])  # fmt: skip
    comp = L.compression
    comp_s = "none" if comp["id"] == "none" else f"blosc2 {comp['cname']} level {comp['clevel']} shuffle={comp['shuffle']}"
    raw, stored = L.raw_nbytes, L.stored_nbytes
    if L.shard_layouts is not None and L.num_shards == 1:
        F = L.shard_layouts[0]
        head = [f"file            {path}", f"format          rowstore v{F.version} (written by {F.writer or 'unknown'})"]
    else:
        from rowstore.format import manifest

        head = [f"dataset         {path}",
                f"format          rowstore dataset manifest v{manifest.FORMAT_VERSION}, version {L.version}, "
                f"{L.num_shards:,} shard files"]  # fmt: skip
    lo, hi = (int(L.shard_rpb.min()), int(L.shard_rpb.max())) if L.num_shards else (0, 0)
    per = f"{hi:,} rows ({_human(L.block_raw_bytes)} of rows each)" if lo == hi else f"{lo:,}..{hi:,} rows (per shard)"
    lines = head + [
        f"rows            {L.num_rows:,}",
        f"blocks          {L.num_blocks:,} x {per}",
        f"row size        {L.row_dtype.itemsize:,} bytes in the row table",
        f"heap            {_human(L.heap_nbytes)} in {len(L.heap_chunks):,} chunks of {_human(L.heap_chunk_bytes)}" if len(L.heap_chunks) else "heap            none",
        f"compression     {comp_s}",
        f"decoded bytes   {_human(raw)} (rows + heap payloads)",
        f"stored bytes    {_human(stored)}" + (f" (ratio {raw / stored:.2f}x)" if stored else ""),
        f"file size       {_human(L.file_size)}" + (f" in {L.num_shards:,} shards" if L.num_shards > 1 else ""),
    ]
    if L.user_attrs:
        lines.append(f"attributes      {json.dumps(L.user_attrs, sort_keys=True)}")
    lines += ["", _table(rows, ["field", "dtype", "shape", "codec", "stored in", "nullable"])]
    return "\n".join(lines)


def _summary(v: Any) -> str:
    if v is None:
        return "None"
    if isinstance(v, np.generic):
        return repr(v.item())
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return repr(v.item())
        if v.size <= 6 and v.ndim == 1:
            return np.array2string(v, separator=", ", threshold=6)
        desc = f"{v.dtype}{list(v.shape)}"
        if v.size and v.dtype.kind in "biuf":
            desc += f" min={v.min():.4g} max={v.max():.4g} mean={v.astype(np.float64).mean():.4g}"
        return desc
    if isinstance(v, (str, bytes)):
        return repr(v if len(v) <= 60 else v[:57]) + ("..." if len(v) > 60 else "")
    return repr(v)


def head_text(path: str, n: int = 5, fields: list[str] | None = None) -> str:
    from rowstore.reader import Reader

    with Reader(path) as r:  # closed also when reading fails (a kept traceback keeps r)
        names = r.schema.select(fields).names
        k = max(0, min(n, len(r)))
        batch = r.take(np.arange(k), fields=names) if k else {}
    out = []
    for i in range(k):
        out.append(f"row {i}")
        for name in names:
            v = batch[name][i]
            if r.schema[name].nullable and batch[name + "__null"][i]:
                v = None
            out.append(f"  {name}: {_summary(v)}")
    out.append(f"({k} of {len(r):,} rows)")
    return "\n".join(out)


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of rows >= 0, got {n}")
    return n


def gc_text(path: str, *, dry_run: bool = False) -> str:
    """Remove (or with ``dry_run`` only list) the stale temporary files of a dataset file or of
    every dataset in a directory; temporaries of live writers are listed and kept."""
    from rowstore.format._commit import remove_stale

    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):  # a dataset file need not exist: its first writer may have died
        raise FileNotFoundError(f"directory {directory!r} does not exist")
    stale, live = remove_stale(path, dry_run=dry_run)
    lines = [f"{'stale' if dry_run else 'removed'}: {p}" for p in stale]
    lines += [f"kept (a writer is active): {p}" for p in live]
    lines.append(f"{'would remove' if dry_run else 'removed'} {len(stale)} stale temporary file(s), kept {len(live)} in use")
    return "\n".join(lines)


def gc_dataset_text(path: str, *, delete: bool = False, keep_versions: int = 1, grace_s: float = 3600.0) -> str:
    """Garbage-collect the dataset directory ``path`` (:func:`rowstore.gc_dataset`): only list
    what would go unless ``delete``."""
    from rowstore.format.dataset_writer import gc

    r = gc(path, dry_run=not delete, keep_versions=keep_versions, orphan_grace_s=grace_s)
    verb = "removed" if delete else "would remove"
    lines = [f"current version {r.current}; keeping versions {', '.join(map(str, r.kept_versions)) or 'none'}"]
    lines += [f"{verb}: {p}" for p in r.manifests + r.shards + r.temporaries]
    lines += [f"kept (named by no version, younger than {grace_s:g} s): {p}" for p in r.young]
    lines += [f"kept (a writer is active): {p}" for p in r.live]
    lines.append(f"{verb} {len(r.manifests)} manifest file(s), {len(r.shards)} shard(s), "
                 f"{len(r.temporaries)} stale temporary file(s)" + ("" if delete else " (dry run: pass --delete to remove)"))
    return "\n".join(lines)


def _seconds(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return v


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rowstore", description="Inspect rowstore datasets.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="schema, rows, blocks, sizes, compression, format version")
    p.add_argument("path")
    p = sub.add_parser("head", help="print the first rows")
    p.add_argument("path")
    p.add_argument("-n", type=_count, default=5, help="rows to print (default 5)")
    p.add_argument("--fields", nargs="+", help="only these fields")
    p = sub.add_parser("verify", help="read every block and check its checksum")
    p.add_argument("path")
    p = sub.add_parser("gc", help="remove the temporary files that killed writers left (those no live writer holds); "
                                  "for a dataset directory, list old versions and unreferenced shards (--delete removes them)")
    p.add_argument("path", help="a file (its temporaries), a directory (all temporaries in it), or a dataset directory "
                                "(one with rowstore.json: old manifest versions, the shards only they name, orphan "
                                "shards, temporaries)")
    p.add_argument("--dry-run", action="store_true", help="only list them (the default for a dataset directory)")
    p.add_argument("--delete", action="store_true", help="dataset directory: remove what is listed (without it, "
                                                        "nothing is removed)")
    p.add_argument("--keep-versions", type=_positive, default=1, metavar="N",
                   help="dataset directory: keep the current version and the N-1 before it (default 1)")
    p.add_argument("--grace", type=_seconds, default=3600.0, metavar="SECONDS",
                   help="dataset directory: keep shards that no version names if modified within SECONDS "
                        "(a job may still commit them; default 3600)")
    # -- import-petastorm (rowstore.petastorm; needs pyarrow) --
    p = sub.add_parser("import-petastorm", help="convert a Petastorm dataset (a Parquet directory with a Unischema) "
                                                "to a rowstore dataset directory; petastorm need not be installed")
    p.add_argument("url", help="the Petastorm dataset: a directory or a file:// URL")
    p.add_argument("out", help="the rowstore dataset directory to write (or a .h5 file with --file)")
    p.add_argument("--file", action="store_true", help="write one .h5 file rather than a dataset directory")
    p.add_argument("--fields", nargs="+", help="only these fields, in this order")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "info":
            print(info_text(args.path))
        elif args.cmd == "head":
            print(head_text(args.path, args.n, args.fields))
        elif args.cmd == "verify":
            from rowstore.format.shards import DatasetLayout

            L = DatasetLayout.open(args.path)  # a dataset's manifest and sidecar are checked here
            damage = L.damage(shard_indexes=True)
            for err in damage:
                span = getattr(err, "rows", None)
                rows = f" (rows {span[0]}..{span[1] - 1})" if span else ""
                print(f"rowstore verify: damaged: {err}{rows}", file=sys.stderr)
            shards = f" in {L.num_shards} shards" if L.num_shards > 1 else ""
            if damage:
                bad = len({e.path for e in damage})
                print(f"{args.path}: {len(damage)} damaged chunk(s) or shard(s) of {L.num_blocks + len(L.heap_chunks)} "
                      f"chunks{shards}; {bad} shard file(s) affected", file=sys.stderr)
                return 1
            print(f"{args.path}: OK ({L.num_blocks} blocks, {len(L.heap_chunks)} heap chunks{shards}, checksums match)")
        elif args.cmd == "gc":
            from rowstore.format import manifest

            if manifest.is_dataset(args.path) or os.path.isdir(os.path.join(args.path, manifest.MANIFEST_DIR)):
                print(gc_dataset_text(args.path, delete=args.delete and not args.dry_run,
                                      keep_versions=args.keep_versions, grace_s=args.grace))  # fmt: skip
            else:
                print(gc_text(args.path, dry_run=args.dry_run))
        elif args.cmd == "import-petastorm":
            from rowstore.petastorm import import_petastorm

            schema = import_petastorm(args.url, args.out, dataset=not args.file, columns=args.fields)
            print(f"{args.out}: {len(schema)} fields written from {args.url}")
    except (RowstoreError, OSError, ValueError) as exc:
        print(f"rowstore {args.cmd}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
