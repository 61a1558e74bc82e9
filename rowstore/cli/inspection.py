"""``rowstore info``, ``head`` and ``verify``: what a file or dataset holds, its first rows, and
whether every chunk's checksum matches."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from rowstore.cli._common import (
    _add_missing_footer,
    _add_outside_links,
    _count,
    _human,
    _n,
    _open_layout,
    _storage_options_argument,
    _table,
)
from rowstore.errors import FormatError
from rowstore.format import manifest
from rowstore.format._hdf5_check import hdf5_disagreement
from rowstore.reader import Reader


def register(sub: Any) -> None:
    """Add ``info``, ``head`` and ``verify`` to the subcommands ``sub``."""
    p = sub.add_parser("info", help="schema, rows, blocks, sizes, compression, format version")
    p.add_argument("path")
    _add_outside_links(p)
    _storage_options_argument(p)
    _add_missing_footer(p)
    p.set_defaults(run=_info)
    p = sub.add_parser("head", help="print the first rows")
    p.add_argument("path")
    _add_missing_footer(p)
    p.add_argument("-n", type=_count, default=5, help="rows to print (default 5)")
    p.add_argument("--fields", nargs="+", help="only these fields")
    _add_outside_links(p)
    _storage_options_argument(p)
    p.set_defaults(run=_head)
    p = sub.add_parser("verify", help="read every block and check its checksum")
    p.add_argument("path")
    _add_outside_links(p)
    p.add_argument(
        "--no-hdf5-check",
        action="store_true",
        help="a v2 file: do not check (with libhdf5, in a child process) that its HDF5 part agrees "
        "with its footer",
    )
    _storage_options_argument(p)
    _add_missing_footer(p)
    p.set_defaults(run=_verify)


def _info(args: argparse.Namespace) -> int:
    print(
        info_text(
            args.path,
            storage_options=args.storage_options,
            allow_outside_links=args.allow_outside_links,
            allow_missing_footer=args.allow_missing_footer,
        )
    )
    return 0


def _head(args: argparse.Namespace) -> int:
    print(
        head_text(
            args.path,
            args.n,
            args.fields,
            storage_options=args.storage_options,
            allow_outside_links=args.allow_outside_links,
            allow_missing_footer=args.allow_missing_footer,
        )
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    return verify_command(
        args.path,
        storage_options=args.storage_options,
        hdf5_check=not args.no_hdf5_check,
        allow_outside_links=args.allow_outside_links,
        allow_missing_footer=args.allow_missing_footer,
    )


def info_text(
    path: str,
    *,
    storage_options: dict | None = None,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> str:
    L, _ = _open_layout(
        path,
        storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
    )
    rows = []
    for f in L.schema:
        shape = (
            "("
            + ", ".join("None" if d is None else str(d) for d in f.shape)
            + ("," if len(f.shape) == 1 else "")
            + ")"
        )
        codec = ", ".join(f"{k}={v}" for k, v in f.codec.items() if k != "id")
        rows.append(
            [
                f.name,
                str(f.dtype),
                shape,
                f.codec["id"] + (f"({codec})" if codec else ""),
                "row" if f.inline else "heap",
                "yes" if f.nullable else "",
            ]
        )
    comp = L.compression
    comp_s = (
        "none"
        if comp["id"] == "none"
        else f"blosc2 {comp['cname']} level {comp['clevel']} shuffle={comp['shuffle']}"
    )
    raw, stored = L.raw_nbytes, L.stored_nbytes
    if L.shard_layouts is not None and L.num_shards == 1:
        F = L.shard_layouts[0]
        footer = (
            ""
            if F.version < 2
            else ", checksummed footer"
            if F.footer_offset
            else ", its footer missing (cut off or edited with h5py): read through libhdf5"
        )
        if F.page_bytes:
            footer += f", page CRCs every {F.page_bytes} bytes"
        head = [
            f"file            {path}",
            f"format          rowstore v{F.version} (written by {F.writer or 'unknown'}{footer})",
        ]
    else:
        head = [
            f"dataset         {path}",
            f"format          rowstore dataset manifest v{manifest.FORMAT_VERSION}, version "
            f"{L.version}, "
            f"{_n(L.num_shards, 'shard file', commas=True)}",
        ]
    lo, hi = (int(L.shard_rpb.min()), int(L.shard_rpb.max())) if L.num_shards else (0, 0)
    per = (
        f"{_n(hi, 'row', commas=True)} ({_human(L.block_raw_bytes)} of rows each)"
        if lo == hi
        else f"{lo:,}..{hi:,} rows (per shard)"
    )
    lines = head + [
        f"rows            {L.num_rows:,}",
        f"blocks          {L.num_blocks:,} x {per}",
        f"row size        {L.row_dtype.itemsize:,} bytes in the row table",
        f"heap            {_human(L.heap_nbytes)} in "
        f"{_n(len(L.heap_chunks), 'chunk', commas=True)} of {_human(L.heap_chunk_bytes)}"
        if len(L.heap_chunks)
        else "heap            none",
        f"compression     {comp_s}",
        f"decoded bytes   {_human(raw)} (rows + heap payloads)",
        f"stored bytes    {_human(stored)}" + (f" (ratio {raw / stored:.2f}x)" if stored else ""),
        f"file size       {_human(L.file_size)}"
        + (f" in {L.num_shards:,} shards" if L.num_shards > 1 else ""),
    ]
    if L.user_attrs:
        lines.append(f"attributes      {json.dumps(L.user_attrs, sort_keys=True, default=_plain)}")
    lines += ["", _table(rows, ["field", "dtype", "shape", "codec", "stored in", "nullable"])]
    return "\n".join(lines)


def _plain(v: Any) -> Any:
    """numpy attribute values (rowstore.format.attrs) as JSON lists/numbers for display."""
    return v.tolist() if hasattr(v, "tolist") else repr(v)


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


def head_text(
    path: str,
    n: int = 5,
    fields: list[str] | None = None,
    *,
    storage_options: dict | None = None,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> str:
    # closed also when reading fails (a kept traceback keeps r)
    with Reader(
        path,
        storage_options=storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
    ) as r:
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
    out.append(f"({k} of {_n(len(r), 'row', commas=True)})")
    return "\n".join(out)


def verify_command(
    path: str,
    *,
    storage_options: dict | None = None,
    hdf5_check: bool = True,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> int:
    """``rowstore verify``: print every damaged chunk or shard (stderr) or OK (stdout); the exit
    status (0 or 1)."""
    # a dataset's manifest and sidecar are checked here
    L, location = _open_layout(
        path,
        storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
    )
    damage = L.damage(shard_indexes=True, location=location)
    for err in damage:
        span = getattr(err, "rows", None)
        rows = f" (rows {span[0]}..{span[1] - 1})" if span else ""
        print(f"rowstore verify: damaged: {err}{rows}", file=sys.stderr)
    shards = f" in {L.num_shards} shards" if L.num_shards > 1 else ""
    one_v2 = L.shard_layouts is not None and L.num_shards == 1 and L.shard_layouts[0].footer_offset
    skipped = ""
    if one_v2 and hdf5_check and not location.local:
        skipped = (
            "; the HDF5 part was not compared with the footer (libhdf5 reads local files only)"
        )
    elif one_v2 and hdf5_check:  # a v2 file: what h5py users see must be what rowstore reads
        why = hdf5_disagreement(L.shard_layouts[0])
        if why:
            print(
                f"rowstore verify: {path}: the footer and the HDF5 part disagree: {why}",
                file=sys.stderr,
            )
            damage = [*damage, FormatError(why, path=path)]
    if damage:
        bad = len({e.path for e in damage})
        print(
            f"{path}: {len(damage)} damaged chunk(s) or shard(s) of "
            f"{L.num_blocks + len(L.heap_chunks)} "
            f"chunks{shards}; {bad} shard file(s) affected",
            file=sys.stderr,
        )
        return 1
    print(
        f"{path}: OK ({_n(L.num_blocks, 'block')}, {_n(len(L.heap_chunks), 'heap chunk')}{shards}, "
        "checksums "
        f"match{skipped})"
    )
    return 0
