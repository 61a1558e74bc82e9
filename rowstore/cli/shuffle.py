"""``rowstore shuffle``: a globally shuffled copy of a dataset, through bounded memory, on this
machine or a Dask cluster."""

from __future__ import annotations

import argparse
from typing import Any

from rowstore import global_shuffle
from rowstore.cli._common import _positive, _storage_options_argument
from rowstore.quality import order_quality


def register(sub: Any) -> None:
    """Add ``shuffle`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "shuffle",
        help="write a globally shuffled copy as a new dataset, through bounded memory "
        "(two passes over raw stored rows)",
    )
    p.add_argument("input", help="a .h5 file or a dataset directory")
    p.add_argument(
        "output",
        help="the dataset directory to create (must not exist; appears only when complete)",
    )
    p.add_argument("--memory", default="2GB", help="memory budget, e.g. 2GB, 512MiB (default 2GB)")
    p.add_argument("--seed", type=int, default=0, help="the permutation's seed (default 0)")
    p.add_argument("--tmp", help="directory for the piles (default: the output's directory)")
    p.add_argument(
        "--shard-bytes",
        default="256MiB",
        help="target raw bytes of an output shard (default 256MiB)",
    )
    p.add_argument(
        "--compression",
        default="same",
        help="output compression: same (the input's, default), none, lz4, zstd, ...",
    )
    p.add_argument(
        "--dask-scheduler",
        metavar="ADDR",
        help="run both passes on this dask.distributed scheduler",
    )
    _storage_options_argument(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars, no quality figures")
    p.add_argument(
        "--field",
        help="field for the before/after order figures (default: the first scalar numeric)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive,
        default=64,
        help="batch size of the order figures (default 64)",
    )
    p.set_defaults(run=_shuffle)


def _shuffle(args: argparse.Namespace) -> int:
    comp = None if args.compression == "none" else args.compression
    global_shuffle.check_arguments(
        args.input,
        args.output,
        memory=args.memory,
        seed=args.seed,
        tmp=args.tmp,
        shard_bytes=args.shard_bytes,
    )  # before the figures of the input: bad arguments fail at once
    opts = args.storage_options
    if not args.quiet:
        before = order_quality(
            args.input, field=args.field, batch_size=args.batch_size, storage_options=opts
        )
        print("before: " + before.text())
    kwargs = dict(
        memory=args.memory,
        seed=args.seed,
        tmp=args.tmp,
        shard_bytes=args.shard_bytes,
        compression=comp,
        progress=not args.quiet,
        storage_options=opts,
    )
    if args.dask_scheduler:
        import distributed

        from rowstore.dask import shuffle as dask_shuffle

        with distributed.Client(args.dask_scheduler) as client:
            report = dask_shuffle(args.input, args.output, client=client, **kwargs)
    else:
        report = global_shuffle.shuffle(args.input, args.output, **kwargs)
    print(report.summary())
    if not args.quiet:
        print(
            "after:  "
            + order_quality(args.output, field=args.field, batch_size=args.batch_size).text()
        )
    return 0
