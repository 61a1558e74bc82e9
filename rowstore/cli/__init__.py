"""``rowstore``: inspect datasets from the shell.

    rowstore info PATH        schema, rows, blocks, sizes, compression, format version
    rowstore head PATH -n N   the first N rows, arrays summarised
    rowstore verify PATH      read every block (of every shard) and check checksums
    rowstore stats PATH       statistics kept at write time (table; --json)
    rowstore gc PATH          remove killed writers' temporary files (and killed shuffles' work
                              directories); for a dataset directory, list (with --delete: remove)
                              old versions and unreferenced shards
    rowstore repair DIR       a dataset whose pointer is lost: make its newest sound version current
    rowstore shuffle IN OUT --memory 2GB --seed N   a globally shuffled copy (a new dataset)
    rowstore quality PATH     how ordered it is (rank correlation, batch spread, block mixing)
    rowstore report PATH -o report.html
                              one HTML page to look at it: schema, statistics, sample images
                              and audio, label balance, order quality (docs/inspect.md)
    rowstore order PATH       how mixed an epoch order is (reads no rows)
    rowstore check-order PATH an epoch dealt to a world, interrupted and resumed: every row once
    rowstore import-petastorm URL OUT
                              convert a Petastorm dataset (petastorm not needed) to a dataset
    rowstore from-images SRC OUT [--labels folders|none|CSV] [--workers N]
        [--shape H,W[,C]] [--channels C] [--on-error raise|skip] [--verify]
                              a folder of PNG/JPEG files (class folders) to a dataset, the
                              images' bytes as they are, every file checked
    rowstore from-audio SRC OUT [--on-error raise|skip] [--workers N]
                              a speech corpus (a FLAC/WAV folder tree or a CSV/TSV manifest)
                              to a dataset, the audio files' bytes as they are

PATH is a ``.h5`` file or a dataset directory, local or at a URL (``s3://``, ``http(s)://``, any
fsspec protocol; ``--storage-options JSON`` passes credentials and endpoints). ``rowstore
--version`` prints the version; Ctrl-C stops any command with one line and exit status 130.

One module per group of commands registers its subcommands and the function that runs each:
:mod:`.inspection` (info, head, verify), :mod:`.maintenance` (gc, repair), :mod:`.shuffle`,
:mod:`.order` (quality, order, check-order), :mod:`.ingest` (import-petastorm,
from-images), :mod:`.audio` (from-audio), :mod:`.stats` and :mod:`.report`; :mod:`._common`
holds what they share.
"""

from __future__ import annotations

import argparse
import sys

from rowstore._version import __version__
from rowstore.cli import audio, ingest, inspection, maintenance, order, report, shuffle, stats
from rowstore.cli.inspection import head_text, info_text, verify_command
from rowstore.cli.maintenance import gc_dataset_text, gc_text, repair_text
from rowstore.cli.order import check_order_text, order_text
from rowstore.errors import RowstoreError

__all__ = [
    "main",
    "build_parser",
    "info_text",
    "head_text",
    "verify_command",
    "gc_text",
    "gc_dataset_text",
    "repair_text",
    "order_text",
    "check_order_text",
]

#: The command groups, in the order ``rowstore --help`` lists their commands.
GROUPS = (inspection, stats, report, maintenance, shuffle, order, ingest, audio)


def build_parser() -> argparse.ArgumentParser:
    """The ``rowstore`` parser: each command group adds its subcommands, each of which sets
    ``run``, the function that runs it (it returns the exit status)."""
    parser = argparse.ArgumentParser(prog="rowstore", description="Inspect rowstore datasets.")
    parser.add_argument("--version", action="version", version=f"rowstore {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``rowstore`` console script; returns the exit status (130 after Ctrl-C)."""
    cmd = "rowstore"
    try:
        args = build_parser().parse_args(argv)
        cmd = f"rowstore {args.cmd}"
        return args.run(args)
    except KeyboardInterrupt:
        print(f"{cmd}: interrupted", file=sys.stderr)
        return 130
    except (RowstoreError, OSError, ValueError) as exc:
        print(f"{cmd}: error: {exc}", file=sys.stderr)
        return 1
