"""``rowstore``: inspect datasets from the shell.

    rowstore info PATH        schema, rows, blocks, sizes, compression, format version
    rowstore head PATH -n N   the first N rows, arrays summarised
    rowstore verify PATH      read every block (of every shard) and check checksums
    rowstore gc PATH          remove killed writers' temporary files (and killed shuffles' work
                              directories); for a dataset directory, list (with --delete: remove)
                              old versions and unreferenced shards
    rowstore repair DIR       a dataset whose pointer is lost: make its newest sound version current
    rowstore shuffle IN OUT --memory 2GB --seed N   a globally shuffled copy (a new dataset)
    rowstore quality PATH     how ordered it is (rank correlation, batch spread, block mixing)
    rowstore import-petastorm URL OUT
                              convert a Petastorm dataset (petastorm not needed) to a dataset
    rowstore from-images SRC OUT [--labels folders|none|CSV] [--workers N]
                              a folder of PNG/JPEG files (class folders) to a dataset, the
                              images' bytes as they are

PATH is a ``.h5`` file or a dataset directory, local or at a URL (``s3://``, ``http(s)://``, any
fsspec protocol; ``--storage-options JSON`` passes credentials and endpoints). ``rowstore
--version`` prints the version; Ctrl-C stops any command with one line and exit status 130.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from typing import Any

import numpy as np

from rowstore.errors import FormatError, RowstoreError

__all__ = [
    "main",
    "info_text",
    "head_text",
    "verify_command",
    "gc_text",
    "gc_dataset_text",
    "repair_text",
]


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _n(n: int, noun: str, plural: str | None = None, *, commas: bool = False) -> str:
    """``n`` and ``noun`` in the number's form: ``1 shard file``, ``2 shard files``
    (``commas``: ``1,024``)."""
    number = f"{n:,}" if commas else str(n)
    return f"{number} {noun if n == 1 else plural or noun + 's'}"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def _open_layout(
    path: str,
    storage_options: dict | None = None,
    *,
    allow_outside_links: bool = False,
    allow_missing_footer: bool = False,
) -> tuple[Any, Any]:
    """The layout of the file or dataset at ``path`` (local, ``file://`` or any fsspec URL, as
    :func:`rowstore.open` takes it), and the object-storage client that reads its shards (None
    for local files)."""
    from rowstore import storage
    from rowstore.format.open import open_layout

    if storage_options is not None:
        try:
            storage.locate(path, storage_options=storage_options)
        except ValueError:
            raise ValueError(
                f"--storage-options applies to URLs (s3://, http://, file://...); got {path!r}"
            ) from None
    opened = open_layout(
        path,
        storage_options=storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
        pin=False,
    )
    return opened.layout, opened.client


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
        from rowstore.format import manifest

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
    from rowstore.reader import Reader

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


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of rows >= 0, got {n}")
    return n


def gc_text(path: str, *, dry_run: bool = False) -> str:
    """Remove (or with ``dry_run`` only list) the stale temporary files of a dataset file or of
    every dataset in a directory, and in a directory the work directories of killed shuffles
    (``.rowstore-shuffle-*``); those of live writers and runs are listed and kept.

    A directory holding none of those and no ``.h5`` file is no place of rowstore's (a typo,
    or a dataset's parent): :class:`FormatError`, rather than reporting nothing removed."""
    from rowstore.global_shuffle._work import PREFIX, sweep
    from rowstore.storage import looks_like_file
    from rowstore.storage.local import remove_stale, temporaries

    is_dir = os.path.isdir(path)
    directory = path if is_dir else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(errno.ENOENT, f"directory {directory!r} does not exist")
    if not is_dir and not os.path.lexists(path) and not temporaries(path):
        # (a file that does not exist may still have a killed first writer's temporaries)
        hint = ""
        if any(n.startswith(PREFIX) for n in os.listdir(directory)):
            hint = (
                f"; for the work directories of a killed shuffle there: `rowstore gc {directory}`"
            )
        raise FileNotFoundError(
            errno.ENOENT, f"{path!r} does not exist and has no temporary files{hint}"
        )
    if is_dir and not temporaries(path):
        names = os.listdir(directory)
        if not any(n.startswith(PREFIX) or looks_like_file(n) for n in names):
            raise FormatError(
                f"{path!r} is not a dataset directory (no rowstore.json or _manifests/) and "
                "holds no rowstore file (.h5), temporary file or shuffle work directory: "
                "nothing to collect",
                path=path,
            )
    verb = "would remove" if dry_run else "removed"
    stale, live = remove_stale(path, dry_run=dry_run)
    lines = [f"{'stale' if dry_run else 'removed'}: {p}" for p in stale]
    lines += [f"kept (a writer is active): {p}" for p in live]
    runs: list[str] = []
    running: list[str] = []
    sizes: dict[str, int] = {}
    if is_dir:
        runs, running = sweep(directory, dry_run=dry_run, sizes=sizes)
        lines += [
            f"{'stale' if dry_run else 'removed'}: {p} (a killed shuffle's, "
            f"{sizes[p] / 1e6:,.1f} MB)"
            for p in runs
        ]
        lines += [f"kept (a shuffle is running): {p}" for p in running]
    lines.append(
        f"{verb} {len(stale)} stale temporary file(s), kept {len(live)} in use"
        + (
            f"; {verb} {len(runs)} killed shuffle director(ies) "
            f"({sum(sizes.values()) / 1e6:,.1f} MB), kept {len(running)} running"
            if runs or running
            else ""
        )
    )
    return "\n".join(lines)


def gc_dataset_text(
    path: str,
    *,
    delete: bool = False,
    keep_versions: int = 1,
    grace_s: float = 3600.0,
    allow_outside_links: bool = False,
) -> str:
    """Garbage-collect the dataset directory ``path`` (:func:`rowstore.gc_dataset`): only list
    what would go unless ``delete``."""
    from rowstore.writer.gc import gc

    r = gc(
        path,
        dry_run=not delete,
        keep_versions=keep_versions,
        orphan_grace_s=grace_s,
        allow_outside_links=allow_outside_links,
    )
    verb = "removed" if delete else "would remove"
    lines = [
        f"current version {r.current}; keeping versions "
        f"{', '.join(map(str, r.kept_versions)) or 'none'}"
    ]
    if r.spared is not None:
        lines.append(
            f"keeping version {r.spared} too: the newest manifest that loads, never "
            "current (a commit killed before its pointer moved, or a pointer put back)"
        )
    lines += [f"{verb}: {p}" for p in r.manifests + r.shards + r.temporaries]
    lines += [f"kept (named by no version, younger than {grace_s:g} s): {p}" for p in r.young]
    lines += [f"kept (a writer is active): {p}" for p in r.live]
    lines.append(
        f"{verb} {len(r.manifests)} manifest file(s), {len(r.shards)} shard(s), "
        f"{len(r.temporaries)} stale temporary file(s)"
        + ("" if delete else " (dry run: pass --delete to remove)")
    )
    return "\n".join(lines)


def repair_text(
    path: str, *, dry_run: bool = False, verify: bool = False, allow_outside_links: bool = False
) -> str:
    """Restore a dataset's lost or unreadable pointer (:func:`rowstore.restore_pointer`); a
    directory with neither a pointer nor manifests is no dataset: :class:`FormatError`, and
    nothing is created in it."""
    from rowstore.format import manifest
    from rowstore.writer.gc import restore_pointer

    if (
        os.path.isdir(path)
        and not manifest.is_dataset(path)
        and not os.path.isdir(os.path.join(path, manifest.MANIFEST_DIR))
    ):
        raise FormatError(
            f"{path!r} is not a dataset directory (no {manifest.POINTER}, no "
            f"{manifest.MANIFEST_DIR}/): nothing to repair",
            path=path,
        )

    r = restore_pointer(
        path, dry_run=dry_run, verify=verify, allow_outside_links=allow_outside_links
    )
    if r.version is None:
        return (
            f"{path}: the pointer reads (version {r.current}); nothing to repair "
            "(rowstore verify checks the shards)"
        )
    lines = [f"{path}: {r.problem}"]
    lines += [f"skipped version {v}: {why}" for v, why in r.skipped]
    lines.append(
        f"{path}: {'would make' if dry_run else 'made'} version {r.version} current"
        + (" (dry run: nothing written)" if dry_run else "")
    )
    return "\n".join(lines)


def _add_outside_links(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-outside-links",
        action="store_true",
        help="follow symlinks (of shards, shards/, _manifests/) that lead out of the "
        "dataset directory (refused by default: a downloaded dataset could point "
        "at any file)",
    )


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


# -- shuffle and quality ------------------------------------------------------------
def _add_shuffle_commands(sub: Any) -> None:
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
    p = sub.add_parser(
        "quality",
        help="how ordered a dataset is: rank correlation of a field with position, "
        "batch spread, block-shuffle mixing",
    )
    p.add_argument("path")
    p.add_argument("--field", help="a scalar numeric field (default: the first one)")
    p.add_argument("--batch-size", type=_positive, default=64, help="batch size (default 64)")
    p.add_argument(
        "--window",
        type=_positive,
        help="block-shuffle window (default: the file's, see docs/order.md)",
    )
    p.add_argument(
        "--pieces",
        type=_positive,
        help="block shuffle of pieces: cut each block into this many (default: the file's, 8 "
        "for uncompressed blocks read directly, else 1: whole blocks)",
    )
    _storage_options_argument(p)


def _shuffle_command(args: argparse.Namespace) -> int:
    from rowstore.quality import order_quality

    if args.cmd == "quality":
        print(
            order_quality(
                args.path,
                field=args.field,
                batch_size=args.batch_size,
                window=args.window,
                pieces=args.pieces,
                storage_options=args.storage_options,
            ).text()
        )
        return 0
    from rowstore.global_shuffle import check_arguments

    comp = None if args.compression == "none" else args.compression
    check_arguments(
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
        from rowstore.global_shuffle import shuffle

        report = shuffle(args.input, args.output, **kwargs)
    print(report.summary())
    if not args.quiet:
        print(
            "after:  "
            + order_quality(args.output, field=args.field, batch_size=args.batch_size).text()
        )
    return 0


# -- rowstore order / check-order (epoch orders, without reading rows) ---------------------------
def _unit_frac(text: str) -> float:
    v = float(text)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text}")
    return v


def _epoch_arguments(p: argparse.ArgumentParser) -> None:
    """PATH and the arguments of an epoch order, shared by ``order`` and ``check-order``."""
    p.add_argument("path")
    p.add_argument("--batch-size", type=_positive, default=64)
    p.add_argument("--shuffle", choices=["block", "full", "none"], default="block")
    p.add_argument("--window", type=_positive, help="block-shuffle window (default: the file's)")
    p.add_argument(
        "--pieces",
        type=_positive,
        help="block shuffle of pieces: cut each block into this many (default: the file's, 8 "
        "for uncompressed blocks read directly, else 1: whole blocks)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    _storage_options_argument(p)


def _add_order_commands(sub: Any) -> None:
    p = sub.add_parser(
        "order",
        help="shuffle quality of an epoch order: distinct blocks per batch, a histogram, "
        "read cost per rank (reads no rows)",
    )
    _epoch_arguments(p)
    p.add_argument(
        "--world",
        type=_positive,
        default=1,
        help="consumers (ranks x workers) to deal the epoch to",
    )
    p.add_argument(
        "--plot", metavar="PNG", help="write the histogram and where batch rows come from to a PNG"
    )
    p = sub.add_parser(
        "check-order",
        help="simulate an epoch on a world, interrupted and resumed on another, and "
        "check exactly-once delivery, equal steps and determinism (reads no rows)",
    )
    _epoch_arguments(p)
    p.add_argument("--world", type=_positive, default=1)
    p.add_argument("--workers", type=_positive, default=1, help="DataLoader workers per rank")
    p.add_argument(
        "--unit", type=_positive, help="global batches dealt at a time (default: about a window)"
    )
    p.add_argument(
        "--resume-at",
        type=_unit_frac,
        help="stop after this fraction of the epoch's steps and resume",
    )
    p.add_argument("--resume-world", type=_positive)
    p.add_argument("--resume-workers", type=_positive)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--drop-last", action="store_true", help="equal steps by leaving rows out")
    g.add_argument(
        "--pad", action="store_true", help="equal steps by repeating rows (marked __pad)"
    )


def _order_defaults(
    path: str, storage_options: dict | None, shuffle: str, window: Any, pieces: Any
) -> tuple[int, int]:
    """The window and pieces a reader of ``path`` uses for these arguments (None: its
    defaults, :meth:`rowstore.reader.Reader.order_defaults`)."""
    if window is not None and pieces is not None:
        return window, pieces
    from rowstore.reader import Reader

    with Reader(path, storage_options=storage_options) as r:
        return r.order_defaults(shuffle, window, pieces)


def order_text(
    path: str,
    *,
    batch_size: int = 64,
    shuffle: str = "block",
    window: int | None = None,
    seed: int = 0,
    epoch: int = 0,
    world: int = 1,
    plot: str | None = None,
    pieces: int | None = None,
    storage_options: dict | None = None,
) -> str:
    """What ``rowstore order`` prints (see docs/order.md)."""
    import numpy as np

    from rowstore.reader.order import EpochOrder
    from rowstore.reader.proof import batch_blocks, read_cost

    L, _ = _open_layout(path, storage_options)
    br, rpb = L.block_rows(), L.rows_per_block
    window, pieces = _order_defaults(path, storage_options, shuffle, window, pieces)
    eo = EpochOrder(br, rpb, shuffle=shuffle, seed=seed, epoch=epoch, window=window, pieces=pieces)
    ids = eo.ids()
    bb = batch_blocks(ids, rpb, batch_size)
    nblocks = int((br > 0).sum())
    uniform = nblocks * (1.0 - (1.0 - 1.0 / max(nblocks, 1)) ** batch_size) if nblocks else 0.0
    quality = min(1.0, bb.mean() / uniform) if len(bb) and nblocks > 1 else 1.0
    lines = [
        f"{path}: {_n(eo.num_rows, 'row')} in {_n(nblocks, 'block')} of up to {_n(rpb, 'row')}; "
        f"shuffle={shuffle} "
        f"window={window} "
        + (f"pieces={pieces} " if pieces > 1 else "")
        + f"batch_size={batch_size} seed={seed} epoch={epoch}",
        f"shuffle quality: {quality:.3f} (1.0 = as mixed as a uniform shuffle)",
        f"distinct blocks per batch: mean {bb.mean() if len(bb) else 0:.2f}, expected for a "
        f"uniform shuffle "
        f"{uniform:.2f}, at most {min(batch_size, nblocks)}",
        "histogram of distinct blocks per batch:",
    ]
    if len(bb):
        counts = np.bincount(bb)
        top = max(counts.max(), 1)
        for k in np.flatnonzero(counts):
            lines.append(
                f"  {k:>5} blocks  {counts[k]:>7} batches  "
                f"{'#' * max(1, int(40 * counts[k] / top))}"
            )
    if world > 1:
        dealt = [read_cost(eo, batch_size, c, world) for c in range(world)]
        contig = [read_cost(eo, batch_size, c, world, dealt=False) for c in range(world)]
        per = lambda costs: sum(b for b, _ in costs) / max(1, sum(r for _, r in costs))  # noqa: E731
        lines.append(
            f"read cost over {world} consumers: {per(dealt) * rpb:.2f} block loads per block of "
            f"rows delivered "
            f"(dealt, elastic) vs {per(contig) * rpb:.2f} (contiguous slices)"
        )
    if plot:
        _order_plot(
            plot, bb, ids, rpb, batch_size, title=f"{path}: shuffle={shuffle} window={window}"
        )
        lines.append(f"wrote {plot}")
    return "\n".join(lines)


def _order_plot(path: str, bb: Any, ids: Any, rpb: int, batch_size: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    if len(bb):
        a.hist(bb, bins=np.arange(bb.min(), bb.max() + 2) - 0.5)
    a.set_xlabel("distinct blocks in a batch")
    a.set_ylabel("batches")
    n = min(len(ids) // batch_size, 200)
    if n:
        y = (ids[: n * batch_size] // rpb).reshape(n, batch_size)
        b.scatter(np.repeat(np.arange(n), batch_size), y.reshape(-1), s=1)
    b.set_xlabel("batch")
    b.set_ylabel("block of each row")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def check_order_text(
    path: str, *, storage_options: dict | None = None, **kwargs: Any
) -> tuple[str, bool]:
    """What ``rowstore check-order`` prints, and whether every check passed."""
    from rowstore.reader.proof import check_order

    L, _ = _open_layout(path, storage_options)
    kwargs["window"], kwargs["pieces"] = _order_defaults(
        path,
        storage_options,
        kwargs.get("shuffle", "block"),
        kwargs.get("window"),
        kwargs.get("pieces"),
    )
    r = check_order(L.block_rows(), L.rows_per_block, **kwargs)
    w, k = kwargs.get("world", 1), kwargs.get("workers", 1)
    lines = [
        f"{path}: {_n(r['rows'], 'row')}, "
        f"{_n(r['global_batches'], 'global batch', 'global batches')} of "
        f"{kwargs['batch_size']}, dealt in "
        f"units of {r['unit']} to {w} ranks x {k} workers"
    ]
    lines.append(f"steps per rank: {_span(r['steps_per_rank'])}")
    if kwargs.get("resume_at") is not None:
        rw, rk = kwargs.get("resume_world") or w, kwargs.get("resume_workers") or k
        lines.append(
            f"stopped after {r['resumed_after_steps']} steps per rank; resumed on {rw} ranks x "
            f"{rk} workers: "
            f"steps per rank {_span(r['resume_steps_per_rank'])}"
        )
    for name, ok in r["checks"].items():
        lines.append(f"  {'PASS' if ok else 'FAIL'}  {name}")
    lines.append(
        f"delivery digest {r['digest']}; mean distinct blocks per batch "
        f"{r['mean_blocks_per_batch']:.2f} "
        f"(uniform: {r['uniform_blocks_per_batch']:.2f})"
    )
    return "\n".join(lines), bool(r["ok"])


def _span(v: list[int]) -> str:
    if not v:
        return "-"
    return (
        f"{v[0]} each"
        if len(set(v)) == 1
        else f"{min(v)}..{max(v)} ({v[:8]}{'...' if len(v) > 8 else ''})"
    )


def _json_object(text: str) -> dict:
    try:
        v = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a JSON object, e.g. '{{\"anon\": true}}': {exc}"
        ) from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}")
    return v


def _storage_options_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-options",
        metavar="JSON",
        type=_json_object,
        default=None,
        help="fsspec options of a URL (credentials, endpoint), e.g. '{\"anon\": true}'",
    )


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
    L, client = _open_layout(
        path,
        storage_options,
        allow_outside_links=allow_outside_links,
        allow_missing_footer=allow_missing_footer,
    )
    damage = L.damage(shard_indexes=True, client=client)
    for err in damage:
        span = getattr(err, "rows", None)
        rows = f" (rows {span[0]}..{span[1] - 1})" if span else ""
        print(f"rowstore verify: damaged: {err}{rows}", file=sys.stderr)
    shards = f" in {L.num_shards} shards" if L.num_shards > 1 else ""
    one_v2 = L.shard_layouts is not None and L.num_shards == 1 and L.shard_layouts[0].footer_offset
    skipped = ""
    if one_v2 and hdf5_check and client is not None:
        skipped = (
            "; the HDF5 part was not compared with the footer (libhdf5 reads local files only)"
        )
    elif one_v2 and hdf5_check:  # a v2 file: what h5py users see must be what rowstore reads
        from rowstore.format._hdf5_check import hdf5_disagreement

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


def build_parser() -> argparse.ArgumentParser:
    from rowstore._version import __version__

    parser = argparse.ArgumentParser(prog="rowstore", description="Inspect rowstore datasets.")
    parser.add_argument("--version", action="version", version=f"rowstore {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    lost = (
        "read a v2 file whose footer is gone (edited with h5py) through libhdf5, "
        "with v1's guarantees only"
    )
    p = sub.add_parser("info", help="schema, rows, blocks, sizes, compression, format version")
    p.add_argument("path")
    _add_outside_links(p)
    _storage_options_argument(p)
    p.add_argument("--allow-missing-footer", action="store_true", help=lost)
    p = sub.add_parser("head", help="print the first rows")
    p.add_argument("path")
    p.add_argument("--allow-missing-footer", action="store_true", help=lost)
    p.add_argument("-n", type=_count, default=5, help="rows to print (default 5)")
    p.add_argument("--fields", nargs="+", help="only these fields")
    _add_outside_links(p)
    _storage_options_argument(p)
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
    p.add_argument("--allow-missing-footer", action="store_true", help=lost)
    p = sub.add_parser(
        "gc",
        help="remove the temporary files that killed writers left (those no live writer holds); "
        "for a dataset directory, list old versions and unreferenced shards "
        "(--delete removes them)",
    )
    p.add_argument(
        "path",
        help="a file (its temporaries), a directory (all temporaries in it), or a dataset "
        "directory "
        "(one with rowstore.json: old manifest versions, the shards only they name, orphan "
        "shards, temporaries); local only",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="only list them (the default for a dataset directory)",
    )
    p.add_argument(
        "--delete",
        action="store_true",
        help="dataset directory: remove what is listed (without it, nothing is removed)",
    )
    p.add_argument(
        "--keep-versions",
        type=_positive,
        default=1,
        metavar="N",
        help="dataset directory: keep the current version and the N-1 before it (default 1)",
    )
    p.add_argument(
        "--grace",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="dataset directory: keep shards that no version names if modified within SECONDS "
        "(a job may still commit them; default 3600)",
    )
    _add_outside_links(p)
    p = sub.add_parser(
        "repair",
        help="a dataset directory whose pointer (rowstore.json) is "
        "missing or does not load: make the newest version whose "
        "manifest, sidecar and shards check current again",
    )
    p.add_argument("path", help="the dataset directory")
    p.add_argument(
        "--dry-run", action="store_true", help="only say which version would be made current"
    )
    p.add_argument(
        "--verify", action="store_true", help="also read every chunk of the chosen version's shards"
    )
    _add_outside_links(p)
    _add_shuffle_commands(sub)
    _add_order_commands(sub)
    # -- import-petastorm (rowstore.petastorm; needs pyarrow) --
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
    # -- from-images (rowstore.images) --
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``rowstore`` console script; returns the exit status (130 after Ctrl-C)."""
    cmd = "rowstore"
    try:
        args = build_parser().parse_args(argv)
        cmd = f"rowstore {args.cmd}"
        return _run(args)
    except KeyboardInterrupt:
        print(f"{cmd}: interrupted", file=sys.stderr)
        return 130
    except (RowstoreError, OSError, ValueError) as exc:
        print(f"{cmd}: error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    so = getattr(args, "storage_options", None)
    if args.cmd in ("shuffle", "quality"):
        return _shuffle_command(args)
    links = getattr(args, "allow_outside_links", False)
    lost = getattr(args, "allow_missing_footer", False)
    if args.cmd == "info":
        print(
            info_text(
                args.path, storage_options=so, allow_outside_links=links, allow_missing_footer=lost
            )
        )
    elif args.cmd == "head":
        print(
            head_text(
                args.path,
                args.n,
                args.fields,
                storage_options=so,
                allow_outside_links=links,
                allow_missing_footer=lost,
            )
        )
    elif args.cmd == "repair":
        print(
            repair_text(
                args.path, dry_run=args.dry_run, verify=args.verify, allow_outside_links=links
            )
        )
    elif args.cmd == "verify":
        return verify_command(
            args.path,
            storage_options=so,
            hdf5_check=not args.no_hdf5_check,
            allow_outside_links=links,
            allow_missing_footer=lost,
        )
    elif args.cmd == "gc":
        from rowstore import storage
        from rowstore.format import manifest

        storage.local_only(args.path, "gc")
        if manifest.is_dataset(args.path) or os.path.isdir(
            os.path.join(args.path, manifest.MANIFEST_DIR)
        ):
            print(
                gc_dataset_text(
                    args.path,
                    delete=args.delete and not args.dry_run,
                    keep_versions=args.keep_versions,
                    grace_s=args.grace,
                    allow_outside_links=links,
                )
            )
        else:
            print(gc_text(args.path, dry_run=args.dry_run))
    elif args.cmd == "order":
        print(
            order_text(
                args.path,
                batch_size=args.batch_size,
                shuffle=args.shuffle,
                window=args.window,
                seed=args.seed,
                epoch=args.epoch,
                world=args.world,
                plot=args.plot,
                pieces=args.pieces,
                storage_options=so,
            )
        )
    elif args.cmd == "check-order":
        text, ok = check_order_text(
            args.path,
            batch_size=args.batch_size,
            shuffle=args.shuffle,
            window=args.window,
            seed=args.seed,
            epoch=args.epoch,
            world=args.world,
            workers=args.workers,
            unit=args.unit,
            drop_last=args.drop_last,
            pad=args.pad,
            resume_at=args.resume_at,
            resume_world=args.resume_world,
            resume_workers=args.resume_workers,
            pieces=args.pieces,
            storage_options=so,
        )
        print(text)
        if not ok:
            return 1
    elif args.cmd == "import-petastorm":
        from rowstore.petastorm import import_petastorm

        schema = import_petastorm(args.url, args.out, dataset=not args.file, columns=args.fields)
        print(f"{args.out}: {_n(len(schema), 'field')} written from {args.url}")
    elif args.cmd == "from-images":
        from rowstore.images import from_images

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
        from rowstore.format import manifest

        n = int(manifest.load(args.out).shards["rows"].sum())
        f = schema[schema.names[0]]
        print(
            f"{args.out}: {_n(n, 'image')} ({f.codec['id']}, {f.dtype} {f.shape}) from {args.src}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
