"""Garbage collection of a local dataset's old versions and leftovers, and restoring a lost
pointer: :func:`gc`, :func:`restore_pointer`."""

from __future__ import annotations

import errno
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from rowstore.errors import FormatError
from rowstore.format import manifest
from rowstore.format.shards import DatasetLayout
from rowstore.storage import Location, local_only
from rowstore.storage.atomic import remove_stale
from rowstore.storage.localdir import LocalDir
from rowstore.storage.location import LocalLocation

__all__ = ["gc", "GCReport", "restore_pointer", "PointerRepair", "DEFAULT_ORPHAN_GRACE_S"]

#: Default age (seconds, by mtime) below which a file that no manifest names is kept: it may be a
#: shard that a job still writing will commit.
DEFAULT_ORPHAN_GRACE_S = 3600.0


# -- garbage collection ----------------------------------------------------------------------------
@dataclass
class GCReport:
    """What :func:`gc` removed (or, for a dry run, would remove), as paths under the dataset.

    Attributes
    ----------
    root : str
    dry_run : bool
    current : int or None
        The current version.
    kept_versions : list of int
        The versions kept (their manifests, sidecars and shards).
    manifests : list of str
        Manifests and sidecars of the versions removed (and those no pointer ever named).
    shards : list of str
        Shard files removed: named only by removed versions, or by none and older than the grace.
    young : list of str
        Shard files named by no version but younger than the grace period (kept: a job may
        still commit them).
    temporaries : list of str
        Stale temporary files of killed writers.
    live : list of str
        Temporary files of live writers (kept).
    spared : int or None
        The newest version whose manifest loads, when it is newer than the kept ones and was
        kept with them (its manifest, sidecar and shards): a commit killed before its pointer
        moved, or a pointer put back to an older version.
    """

    root: str
    dry_run: bool
    current: int | None = None
    kept_versions: list[int] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    young: list[str] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    spared: int | None = None

    @property
    def removed(self) -> list[str]:
        """Everything removed (or that would be)."""
        return self.manifests + self.shards + self.temporaries


def _read_names(root: str | Location, name: str) -> tuple[list[str], str | None]:
    """The shard paths the manifest ``name`` (relative to ``root``, a directory or a
    :class:`~rowstore.storage.location.Location`) names and its parent's manifest name (read
    without its sidecar: cheap, for gc)."""
    where = _at(root)
    mpath = where.join(name)
    m = manifest._json_object(mpath, where.read_small(mpath, manifest.MAX_MANIFEST_BYTES))
    entries = m.get("shards")
    if not isinstance(entries, list):
        raise FormatError(f"{mpath!r}: 'shards' must be a list", path=mpath)
    entry = f"{mpath} shard entry"
    paths = [
        manifest._safe_relpath(entry, e.get("path") if isinstance(e, dict) else None)
        for e in entries
    ]
    return paths, manifest._parent_name(mpath, m)


def _shard_paths(root: str | Location, version: int | str) -> list[str]:
    """The shard paths of a version (its number, or its manifest's name)."""
    name = version if isinstance(version, str) else manifest.find_manifest(_at(root), version)
    return _read_names(root, name)[0]


def _at(root: str | Location) -> Location:
    return root if isinstance(root, Location) else LocalLocation(root)


def _own_dir(root: str, name: str, allow_outside_links: bool) -> str | None:
    """The real path of the directory ``root/name`` (None if there is none), refused with
    :class:`FormatError` when it resolves outside ``root`` (a symlink) unless allowed."""
    d = os.path.join(root, name)
    if not os.path.isdir(d):
        return None
    if not allow_outside_links:
        manifest.check_inside(root, [name], what="directory")
    return os.path.realpath(d)


def _open_dir(real: str | None) -> int | None:
    """A descriptor of the (checked, real) directory ``real``: what gc lists and unlinks in,
    so a directory swapped for a symlink after the check is not followed."""
    if real is None:
        return None
    return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))


def _newest_loading(root: str, have: Sequence[str], kept: Sequence[str]) -> str | None:
    """The newest manifest (by version) whose manifest and sidecar load, if newer than every
    kept one."""
    top = max((_version(n) for n in kept), default=0)
    for n in reversed(have):
        if kept and _version(n) <= top:
            return None
        try:
            manifest.load(root, at=manifest.Pointer(_version(n), n, _crc(root, n)))
        except FormatError:
            continue
        return n
    return None


def _version(name: str) -> int:
    return manifest.version_of(name) or 0


def _crc(root: str, name: str) -> int:
    """The CRC-32 of the manifest ``name`` (what a pointer to it records)."""
    path = os.path.join(root, name)
    return zlib.crc32(LocalLocation(root).read_small(path, manifest.MAX_MANIFEST_BYTES))


def _collect(
    root: str, *, keep: int | None, grace_s: float, dry_run: bool, allow_outside_links: bool = False
) -> GCReport:
    """The work of :func:`gc` and of a commit's clean-up (``keep=None``: keep every version);
    the caller holds the commit lock and has checked that the pointer reads.

    Versions are told apart by their manifests' names (two manifests of one version number,
    left by commits without conditional writes, are two versions; ``parent_manifest`` links
    them)."""
    report = GCReport(root=root, dry_run=dry_run)
    mreal = _own_dir(root, manifest.MANIFEST_DIR, allow_outside_links)
    sreal = _own_dir(root, manifest.SHARD_DIR, allow_outside_links)
    at = manifest.pointer(root)
    current = at.manifest
    report.current = at.version
    have = manifest.manifest_names(root)
    if current not in have:
        raise FormatError(
            f"{root!r}: the current version {at.version} has no manifest ({current}); not "
            "collecting",
            path=root,
        )
    names: dict[str, list[str]] = {}
    spared: str | None = None
    if keep is None:  # a commit's clean-up removes no version
        kept, chain = list(have), set(have)
    else:
        # The versions that were current once: the current one and its parents. A manifest
        # outside that chain was left by a commit killed before its pointer was written.
        order: list[str] = []
        n: str | None = current
        while n is not None and n in have and n not in order:
            try:
                names[n], parent = _read_names(root, n)
            except FormatError:
                if len(order) < keep:
                    raise  # a version to keep that cannot be read: remove nothing
                break  # its shards then stay under the grace rule
            order.append(n)
            n = parent
        kept, chain = order[:keep], set(order)
        spared = _newest_loading(root, have, kept)
        report.spared = _version(spared) if spared is not None else None
    spare = set(kept) | ({spared} if spared is not None else set())
    named_kept: set[str] = set()
    for n in spare:
        named_kept.update(names[n] if n in names else _shard_paths(root, n))  # unreadable: raise
    # Shards named only by versions that were current once go with them; those named only by a
    # never-current manifest stay under the grace rule (a killed commit of them may be retried).
    named_removed: set[str] = set()
    for n in chain.difference(spare):
        named_removed.update(names[n])
    report.kept_versions = sorted(_version(n) for n in kept)
    mfd, sfd = _open_dir(mreal), None
    try:
        sfd = _open_dir(sreal)
        side = sorted(os.listdir(mfd)) if mfd is not None else []
        # manifests, then sidecars and pending objects
        for n in sorted(side, key=lambda n: not n.endswith(".json")):
            owner = manifest.owner_of(n)
            if owner is None:
                continue
            mname, kind = owner
            if kind == "pending":  # (a commit without conditional writes; none runs here)
                gone = keep is not None or mname not in have
            else:  # (a sidecar without manifest: a killed commit's)
                gone = mname not in spare and (keep is not None or mname not in have)
            if gone:
                report.manifests.append(f"{manifest.MANIFEST_DIR}/{n}")
        files = sorted(os.listdir(sfd)) if sfd is not None else []
        now = time.time()
        for n in files:
            rel = f"{manifest.SHARD_DIR}/{n}"
            if n.startswith(".") or rel in named_kept or not n.endswith(".h5"):
                continue  # temporaries are remove_stale's; other files are not ours
            if rel in named_removed:
                report.shards.append(rel)
                continue
            try:
                age = now - os.stat(n, dir_fd=sfd, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            (report.shards if age >= grace_s else report.young).append(rel)
        if not dry_run:
            for rel in report.manifests + report.shards:
                d, _, n = rel.partition("/")
                try:
                    # a symlink: the link only
                    os.unlink(n, dir_fd=mfd if d == manifest.MANIFEST_DIR else sfd)
                except FileNotFoundError:
                    pass
    finally:
        for fd in (mfd, sfd):
            if fd is not None:
                os.close(fd)
    real_root = os.path.realpath(root)
    for where in (real_root, mreal, sreal):
        if where is not None:
            stale, live = remove_stale(where, dry_run=dry_run)
            report.temporaries += [os.path.relpath(p, real_root) for p in stale]
            report.live += [os.path.relpath(p, real_root) for p in live]
    return report


def _refuse_unreadable(root: str, doing: str) -> None:
    """:class:`FormatError` (or ``FileNotFoundError``) unless ``root`` is a directory with a
    pointer file, naming the versions a lost pointer could be restored from."""
    if not os.path.isdir(root):
        if not os.path.exists(root):
            raise FileNotFoundError(errno.ENOENT, f"{doing}: no dataset directory at {root!r}")
        raise NotADirectoryError(
            errno.ENOTDIR, f"{doing}: {root!r} is a file, not a dataset directory"
        )
    if manifest.is_dataset(root):
        return
    have = manifest.versions(root)
    hint = (
        f"; its {manifest.MANIFEST_DIR}/ holds version(s) {', '.join(map(str, have[-5:]))}: "
        f"if the pointer was lost, `rowstore repair {root}` (rowstore.restore_pointer) makes "
        "the newest sound one current again"
        if have
        else ""
    )
    raise FormatError(
        f"{doing}: {root!r} is not a readable rowstore dataset (no "
        f"{manifest.POINTER}){hint}; nothing was removed",
        path=root,
    )


def gc(
    path: str | os.PathLike,
    *,
    dry_run: bool = True,
    keep_versions: int = 1,
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
    allow_outside_links: bool = False,
) -> GCReport:
    """Remove what the dataset at ``path`` no longer needs (exported as ``rowstore.gc_dataset``).

    Keeps the current version and the ``keep_versions - 1`` versions before it (their manifests,
    sidecars and every shard they name; "before" follows the manifests' ``parent`` links), and
    the newest version whose manifest and sidecar load when it is newer than those (a commit
    killed before its pointer moved, or a pointer put back: :attr:`GCReport.spared`).
    Removes the manifests and sidecars of older versions and of manifests that were never current
    (left by a commit killed before its pointer moved), the shard files named only by removed
    versions that were current once, the other shard files no kept version names once not
    modified for ``orphan_grace_s`` seconds (younger ones may belong to a job still writing, or
    to a killed commit that will be retried), and the stale temporary files of killed writers.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory.
    dry_run : bool
        Default True: only report what would be removed.
    keep_versions : int
        Versions to keep, >= 1.
    orphan_grace_s : float
        See above.
    allow_outside_links : bool
        As for :class:`rowstore.Reader`: by default a ``shards/`` or ``_manifests/`` directory,
        or a current shard, that resolves outside ``path`` (a symlink) is refused with
        :class:`~rowstore.errors.FormatError` before anything is removed. Either way files are
        removed by name within the directories checked (a shard that is a symlink: the link).

    Returns
    -------
    GCReport

    Raises
    ------
    FormatError
        ``path`` is not a dataset that opens (no pointer, as :func:`rowstore.open` refuses it;
        its current version does not load; a link leads out of it); a kept manifest that cannot
        be read. Nothing is removed then. A lost pointer: see :func:`restore_pointer`.
    FileNotFoundError
        No directory at ``path``.

    Notes
    -----
    Readers of a removed version lose their shards: keep as many versions as may still be read.
    Runs under the commit lock (waits for a commit in progress).
    """
    root = os.fspath(path)
    if not isinstance(keep_versions, int) or isinstance(keep_versions, bool) or keep_versions < 1:
        raise ValueError(f"keep_versions must be an int >= 1, got {keep_versions!r}")
    _refuse_unreadable(root, "gc")
    _own_dir(root, manifest.MANIFEST_DIR, allow_outside_links)  # before the lock file is made in it
    with manifest.commit_lock(root):
        _refuse_unreadable(root, "gc")  # (again: what was checked may have changed meanwhile)
        # The current version must open as a reader opens it before anything goes.
        DatasetLayout.from_manifest(manifest.load(root), allow_outside_links=allow_outside_links)
        return _collect(
            root,
            keep=keep_versions,
            grace_s=orphan_grace_s,
            dry_run=dry_run,
            allow_outside_links=allow_outside_links,
        )


# -- restoring a lost pointer ----------------------------------------------------------------------
@dataclass
class PointerRepair:
    """What :func:`restore_pointer` found and did.

    Attributes
    ----------
    root : str
    dry_run : bool
    version : int or None
        The version the pointer names now (or, for a dry run, would name); None when the
        pointer already read and was left alone.
    current : int or None
        The version a pointer that already read names (then nothing was written).
    problem : str
        Why the pointer was replaced: it was missing, or what did not load.
    skipped : list of (int, str)
        Newer versions passed over, with the reason (manifest or sidecar does not load, a shard
        is missing, of the wrong size, or its own index disagrees with the manifest...).
    """

    root: str
    dry_run: bool
    version: int | None = None
    current: int | None = None
    problem: str = ""
    skipped: list[tuple[int, str]] = field(default_factory=list)


def restore_pointer(
    path: str | os.PathLike,
    *,
    dry_run: bool = False,
    scan: bool = False,
    allow_outside_links: bool = False,
) -> PointerRepair:
    """Make a dataset whose pointer (``rowstore.json``) is missing or does not load readable
    again: point it at the newest version that is sound (exported as ``rowstore.restore_pointer``;
    ``rowstore repair DIR``).

    A version is sound when its manifest and sidecar load (every checksum), its block index
    passes the reader's checks, and every shard it names exists inside the dataset (see
    ``allow_outside_links``), has its recorded size and its own index, schema and row count
    agree with the manifest (``scan``: also every block and heap chunk's checksum, read now,
    which reads all the data). The pointer is written atomically (temporary file, fsync,
    rename, directory fsync); nothing else is changed. A pointer that loads (with its manifest
    and sidecar) is left alone (:attr:`PointerRepair.current`): damage to its shards is for
    ``rowstore verify`` to report, not a reason to go back to an older version.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory (local).
    dry_run : bool
        Only report the version that would be made current.
    scan : bool
        Also read every chunk of the candidate version's shards and check it.
    allow_outside_links : bool
        As for :class:`rowstore.Reader`.

    Returns
    -------
    PointerRepair

    Raises
    ------
    FormatError
        No version is sound (each one's reason in the message); nothing is written.

    Notes
    -----
    Runs under the commit lock. Versions newer than the restored one stay (``gc`` removes them
    as never current once their shards' grace period passes, or keeps the newest one that loads).
    """
    root = local_only(path, "restore_pointer")
    if not os.path.isdir(root):
        _refuse_unreadable(root, "restore_pointer")
    report = PointerRepair(root=root, dry_run=dry_run)
    _own_dir(root, manifest.MANIFEST_DIR, allow_outside_links)
    with manifest.commit_lock(root):
        if manifest.is_dataset(root):
            try:
                m = manifest.load(root)
                DatasetLayout.from_manifest(m, allow_outside_links=allow_outside_links)
                report.current = m.version
                return report
            except FormatError as exc:
                report.problem = str(exc)
        else:
            report.problem = f"{os.path.join(root, manifest.POINTER)!r} is missing"
        for name in reversed(manifest.manifest_names(root)):
            v = _version(name)
            try:
                _sound(root, name, scan=scan, allow_outside_links=allow_outside_links)
            except FormatError as exc:
                report.skipped.append((v, str(exc)))
                continue
            report.version = v
            if not dry_run:
                if not allow_outside_links:  # (a symlinked pointer's target is what is replaced)
                    manifest.check_inside(root, [manifest.POINTER], what="pointer")
                mpath = os.path.join(root, name)
                text = LocalLocation(root).read_small(mpath, manifest.MAX_MANIFEST_BYTES)
                dest = LocalDir(root)
                dest.replace(manifest.POINTER, manifest.pointer_bytes(v, text, name))
                dest.sync()
                manifest.load(root)  # what a reader now sees: this version, checksums and all
            return report
    why = (
        "; ".join(f"version {v}: {msg}" for v, msg in report.skipped[:5])
        or f"no manifest in {manifest.MANIFEST_DIR}/"
    )
    raise FormatError(
        f"restore_pointer: no version of {root!r} is sound, nothing was written "
        f"({report.problem}; {why})",
        path=root,
    )


def _sound(root: str, name: str | None, *, scan: bool, allow_outside_links: bool) -> None:
    """Raise the first :class:`FormatError` that makes the version whose manifest is ``name``
    (None: the pointer's) unsound."""
    at = None if name is None else manifest.Pointer(_version(name), name, _crc(root, name))
    L = DatasetLayout.from_manifest(
        manifest.load(root, at=at), allow_outside_links=allow_outside_links
    )
    for err in L.damage(limit=1, shard_indexes=True, chunks=scan):
        raise err
