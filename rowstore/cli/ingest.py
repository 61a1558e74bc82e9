"""``rowstore import-petastorm`` and ``from-images``: datasets written from a Petastorm dataset
and from a folder of image files."""

from __future__ import annotations

import argparse
from typing import Any

from rowstore.cli._common import _n, _positive
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
        "--shape",
        type=_shape,
        help="the image field's shape, H,W or H,W,C with 'none' for a size that varies "
        "(e.g. none,none,3); default: from the headers",
    )
    p.add_argument(
        "--channels",
        type=_positive,
        help="channels every image decodes to, whatever the file holds (1 grey, 3 RGB...); "
        "default: the files' own when all agree, else 3 if any is in colour",
    )
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a bad file (damaged, empty, of the other format...): 'raise' (default) stops "
        "naming the first and writes nothing; 'skip' writes the rest and lists each skipped "
        "file and why",
    )
    p.add_argument(
        "--verify",
        "--verify-images",
        dest="verify",
        action="store_true",
        help="decode every image in full (besides the structural check) before it is written",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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


def _shape(text: str) -> tuple[int | None, ...]:
    """``H,W`` or ``H,W,C``: positive ints, ``none`` (or ``*``) for a size that varies."""
    dims: list[int | None] = []
    for part in text.split(","):
        p = part.strip().lower()
        if p in ("none", "*", ""):
            dims.append(None)
            continue
        try:
            dims.append(_positive(p))
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(
                f"expected H,W or H,W,C (positive ints or 'none'), got {text!r}"
            ) from None
    if len(dims) not in (2, 3) or (len(dims) == 3 and dims[2] is None):
        raise argparse.ArgumentTypeError(
            f"expected H,W or H,W,C with C a number (e.g. none,none,3), got {text!r}"
        )
    return tuple(dims)


def _from_images(args: argparse.Namespace) -> int:
    labels = None if args.labels == "none" else args.labels
    report = from_images(
        args.src,
        args.out,
        labels=labels,
        workers=args.workers,
        path_field=None if args.no_path else "path",
        shape=args.shape,
        channels=args.channels,
        on_error=args.on_error,
        verify_encoded=args.verify,
        progress=not args.quiet,
        allow_outside=args.allow_outside,
    )
    print(report.summary())
    return 0
