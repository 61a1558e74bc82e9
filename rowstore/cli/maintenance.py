"""``rowstore gc`` and ``repair``: what killed writers and old versions left, and a dataset
whose pointer is lost."""

from __future__ import annotations

import argparse
import errno
import os
from typing import Any

from rowstore import storage
from rowstore.cli._common import _add_outside_links, _positive, _seconds
from rowstore.errors import FormatError
from rowstore.format import manifest
from rowstore.global_shuffle._work import PREFIX, sweep
from rowstore.storage.atomic import remove_stale, temporaries
from rowstore.writer.gc import gc, restore_pointer


def register(sub: Any) -> None:
    """Add ``gc`` and ``repair`` to the subcommands ``sub``."""
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
    p.set_defaults(run=_gc)
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
        "--scan", action="store_true", help="also read every chunk of the chosen version's shards"
    )
    _add_outside_links(p)
    p.set_defaults(run=_repair)


def _gc(args: argparse.Namespace) -> int:
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
                allow_outside_links=args.allow_outside_links,
            )
        )
    else:
        print(gc_text(args.path, dry_run=args.dry_run))
    return 0


def _repair(args: argparse.Namespace) -> int:
    print(
        repair_text(
            args.path,
            dry_run=args.dry_run,
            scan=args.scan,
            allow_outside_links=args.allow_outside_links,
        )
    )
    return 0


def gc_text(path: str, *, dry_run: bool = False) -> str:
    """Remove (or with ``dry_run`` only list) the stale temporary files of a dataset file or of
    every dataset in a directory, and in a directory the work directories of killed shuffles
    (``.rowstore-shuffle-*``); those of live writers and runs are listed and kept.

    A directory holding none of those and no ``.h5`` file is no place of rowstore's (a typo,
    or a dataset's parent): :class:`FormatError`, rather than reporting nothing removed."""
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
        if not any(n.startswith(PREFIX) or storage.looks_like_file(n) for n in names):
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
    path: str, *, dry_run: bool = False, scan: bool = False, allow_outside_links: bool = False
) -> str:
    """Restore a dataset's lost or unreadable pointer (:func:`rowstore.restore_pointer`); a
    directory with neither a pointer nor manifests is no dataset: :class:`FormatError`, and
    nothing is created in it."""
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

    r = restore_pointer(path, dry_run=dry_run, scan=scan, allow_outside_links=allow_outside_links)
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
