"""``rowstore stats``: the statistics the writer kept of a file or dataset version, as a table or
as JSON (``docs/stats.md``). Reads the footer or manifest only, never a row."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rowstore.cli._common import (
    _add_missing_footer,
    _add_outside_links,
    _storage_options_argument,
    _table,
)
from rowstore.format.open import open_layout
from rowstore.format.stats import DatasetStats, FieldStats

__all__ = ["register", "stats_text"]


def register(sub: Any) -> None:
    """Add ``stats`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "stats", help="statistics kept at write time: counts, NaN, min/max/mean/std, values"
    )
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print the stored statistics as JSON")
    p.add_argument("--version", type=int, default=None, help="a dataset version (default: current)")
    _add_outside_links(p)
    _storage_options_argument(p)
    _add_missing_footer(p)
    p.set_defaults(run=_stats)


def _stats(args: argparse.Namespace) -> int:
    text, found = stats_text(
        args.path,
        as_json=args.json,
        version=args.version,
        storage_options=args.storage_options,
        allow_outside_links=args.allow_outside_links,
        allow_missing_footer=args.allow_missing_footer,
    )
    print(text)
    return 0 if found else 1


def _num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, int):
        return f"{v:,}" if abs(v) < 10**15 else f"{v:.4g}"
    if v == 0 or (1e-3 <= abs(v) < 1e6):
        return f"{v:.4g}"
    return f"{v:.3e}"


def _values(f: FieldStats, k: int = 3) -> str:
    got = f.values
    if got is None:
        return ""
    top, other, complete = got
    n = max(1, f.count)
    parts = [f"{json.dumps(v)[:24]}: {100 * c / n:.0f}%" for v, c in top[:k]]
    rest = len(top) - k
    if rest > 0 or other:
        parts.append("..." if complete else "+ others")
    return ", ".join(parts)


def _extra(f: FieldStats) -> str:
    """Lengths and image sizes in a few words."""
    out = []
    lengths = f.lengths
    if lengths is not None and lengths.finite:
        unit = "bytes" if f.kind in ("str", "bytes", "encoded") else "elements"
        out.append(f"{unit} {_num(lengths.min)}..{_num(lengths.max)} (mean {_num(lengths.mean)})")
    images = f.images
    if images:
        h, w, c = images.get("height"), images.get("width"), images.get("channels")
        if h is not None and w is not None and h.finite:
            out.append(f"{_num(h.min)}-{_num(h.max)} x {_num(w.min)}-{_num(w.max)} px")
        if c is not None and c.values is not None:
            out.append("channels " + "/".join(str(v) for v, _ in c.values[0]))
    facts = f.raw.get("facts")
    if facts is not None and facts.get("kind") != "image":
        for name, sub in list(facts.items())[:4]:
            if name != "kind":
                s = FieldStats(sub)
                if s.finite:
                    out.append(f"{name} {_num(s.min)}..{_num(s.max)}")
    return "; ".join(out)


def table(stats: DatasetStats) -> str:
    """The statistics as a table: one line per field."""
    rows = []
    for name, f in stats.fields.items():
        std = f.std
        rows.append(
            [
                name,
                f.kind,
                f"{f.count:,}",
                f"{f.nulls:,}" if f.nulls else "",
                f"{f.nan:,}" if f.nan else "",
                f"{f.inf:,}" if f.inf else "",
                _num(f.min),
                _num(f.max),
                _num(f.mean),
                "" if std is None or not math.isfinite(std) else _num(std),
                _values(f) or _extra(f),
            ]
        )
    header = ["field", "kind", "count", "nulls", "nan", "inf", "min", "max", "mean", "std", ""]
    lines = _table(rows, header).splitlines()
    return f"{stats.rows:,} rows\n" + "\n".join(line.rstrip() for line in lines)


def stats_text(
    path: str,
    *,
    as_json: bool = False,
    version: int | None = None,
    storage_options: dict | None = None,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> tuple[str, bool]:
    """What ``rowstore stats`` prints, and whether the file or version has statistics."""
    opened = open_layout(
        path,
        version=version,
        storage_options=storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
        pin=False,
    )
    raw = opened.layout.stats
    if raw is None:
        msg = f"{path}: no statistics (written before rowstore kept them, or with stats=False)"
        return (json.dumps(None) if as_json else msg), False
    stats = DatasetStats.from_dict(raw, path, opened.layout.schema.names)
    if as_json:
        return json.dumps(stats.to_dict(), indent=1, sort_keys=True), True
    return table(stats), True
