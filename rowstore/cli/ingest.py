"""``rowstore import-petastorm`` and ``from-images``: datasets written from a Petastorm dataset
and from a folder of image files."""

from __future__ import annotations

import argparse
from typing import Any

from rowstore.cli._common import _n, _positive
from rowstore.format import manifest
from rowstore.images import from_images
from rowstore.petastorm import import_petastorm


def register(sub: Any) -> None:
    """Add ``import-petastorm`` and ``from-images`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "import-petastorm",
        help="convert a Petastorm dataset (a Parquet directory with a Unischema) "
        "to a rowstore dataset directory; petastorm need not be installed",
    )
    p.add_argument("url", help="the Petastorm dataset: a directory or a file:// URL")
    p.add_argument(
        "out", help="the rowstore dataset directory to write (or a .h5 file with --file)"
    )
    p.add_argument(
        "--file", action="store_true", help="write one .h5 file rather than a dataset directory"
    )
    p.add_argument("--fields", nargs="+", help="only these fields, in this order")
    p.set_defaults(run=_import_petastorm)
    p = sub.add_parser(
        "from-images",
        help="write a folder of PNG/JPEG files as a dataset directory, the images' bytes as "
        "they are (labels from class folders or a CSV)",
    )
    p.add_argument("src", help="the directory of image files")
    p.add_argument("out", help="the dataset directory to write")
    p.add_argument(
        "--labels",
        default="folders",
        help="'folders' (SRC/<class>/..., default), 'none', or a CSV file of path,label rows",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        help="processes writing shards (default: one per 20,000 files, up to every core)",
    )
    p.add_argument("--no-path", action="store_true", help="do not store each file's path")
    p.add_argument(
        "--verify-images",
        action="store_true",
        help="decode every image in full (not only its header) before it is written",
    )
    p.add_argument(
        "--allow-outside",
        action="store_true",
        help="follow symlinks that lead out of SRC, and take CSV paths outside it (absolute or "
        "with '..'); by default both are refused",
    )
    p.set_defaults(run=_from_images)


def _import_petastorm(args: argparse.Namespace) -> int:
    schema = import_petastorm(args.url, args.out, dataset=not args.file, columns=args.fields)
    print(f"{args.out}: {_n(len(schema), 'field')} written from {args.url}")
    return 0


def _from_images(args: argparse.Namespace) -> int:
    labels = None if args.labels == "none" else args.labels
    schema = from_images(
        args.src,
        args.out,
        labels=labels,
        workers=args.workers,
        path_field=None if args.no_path else "path",
        verify_encoded=args.verify_images,
        allow_outside=args.allow_outside,
    )
    n = int(manifest.load(args.out).shards["rows"].sum())
    f = schema[schema.names[0]]
    print(f"{args.out}: {_n(n, 'image')} ({f.codec['id']}, {f.dtype} {f.shape}) from {args.src}")
    return 0
