"""``rowstore report``: write a dataset's report page, one self-contained HTML file
(:func:`rowstore.inspect.report`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from rowstore.cli._common import _add_outside_links, _count, _human, _storage_options_argument
from rowstore.inspect._report import report


def register(sub: Any) -> None:
    """Add ``report`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "report",
        help="write an HTML page of a dataset (schema, statistics, sample images and audio, "
        "label balance, order quality; no server, no network)",
    )
    p.add_argument("path")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument(
        "--scan",
        action="store_true",
        help="also read every chunk and check its checksum (as rowstore verify does)",
    )
    p.add_argument("--samples", type=_count, default=24, help="sample rows shown (default 24)")
    p.add_argument("--seed", type=_count, default=0, help="seed of the sample (default 0)")
    p.add_argument(
        "--quality-field", help="scalar numeric field of the order quality (default: the first)"
    )
    _add_outside_links(p)
    _storage_options_argument(p)
    p.set_defaults(run=_report)


def _report(args: argparse.Namespace) -> int:
    report(
        args.path,
        args.output,
        scan=args.scan,
        samples=args.samples,
        seed=args.seed,
        quality_field=args.quality_field,
        storage_options=args.storage_options,
        allow_outside_links=args.allow_outside_links,
    )
    print(f"wrote {args.output} ({_human(os.path.getsize(args.output))})")
    return 0
