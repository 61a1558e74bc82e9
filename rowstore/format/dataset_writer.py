"""Writing datasets of many files: shards, commits of manifest versions, and their garbage collection.

A dataset is a directory (:mod:`.manifest` declares it): ``rowstore.json`` names the current
manifest version, which names shard files under ``shards/``. Writing one takes two phases:

1. :func:`write_shard` writes one shard file (an ordinary format-v1 file, by :class:`.Writer`)
   under a unique name and returns a :class:`ShardInfo`. It takes no lock and needs nothing of the
   dataset, so it runs anywhere (Dask/Spark workers, other processes); nothing is visible to
   readers yet, since no manifest names the file.
2. :func:`commit` checks the files against their :class:`ShardInfo` and publishes the next
   manifest version naming them (under the dataset's commit lock), then removes leftovers.

:class:`DatasetWriter` does both in one process with the :class:`.Writer` API, rolling over to a
new shard every ``shard_bytes``. :func:`gc` removes old versions and the shards only they name.

Crash safety: a shard file appears only complete (its own atomic commit); the new version appears
only when the pointer is replaced, after its sidecar and manifest are complete. A process killed
at any moment leaves the previous version current, plus files no version names (shards not yet
committed, temporary files), which the next :func:`commit` or :func:`gc` removes once they are
older than the grace period (so that the shards of jobs still writing survive).
"""

from __future__ import annotations

import errno
import os
import re
import time
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.codecs.blocks import compression_config
from rowstore.errors import FormatError, RowValidationError, SchemaError, WriterClosedError
from rowstore.format import attrs as attrs_json
from rowstore.format import manifest, spec
from rowstore.format._commit import fsync_directory, remove_stale
from rowstore.format._url import is_url, join
from rowstore.format.index import Layout
from rowstore.format.shards import DatasetLayout
from rowstore.format.validate import as_columns
from rowstore.format.writer import DEFAULT_BLOCK_BYTES, DEFAULT_HEAP_CHUNK_BYTES, Closing, Writer
from rowstore.schema import Schema

__all__ = ["ShardInfo", "write_shard", "commit", "DatasetWriter", "gc", "GCReport",
           "restore_pointer", "PointerRepair", "DEFAULT_SHARD_BYTES"]

#: Default target size of one shard of a :class:`DatasetWriter` (raw bytes of rows and heap).
DEFAULT_SHARD_BYTES = 256 << 20
#: Default age (seconds, by mtime) below which a file that no manifest names is kept: it may be a
#: shard that a job still writing will commit.
DEFAULT_ORPHAN_GRACE_S = 3600.0

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


@dataclass(frozen=True)
class ShardInfo:
    """A shard file written but not necessarily committed: what :func:`commit` checks and records.

    Plain values only (picklable, small): send it back from a worker to the process that commits.

    Attributes
    ----------
    path : str
        The file, relative to the dataset directory (``shards/part-<32 hex>.h5``).
    rows, blocks, rows_per_block, heap_nbytes, heap_chunks, file_size, index_crc32 : int
        The values of its manifest entry (see :data:`.manifest.SHARD_KEYS`).
    schema : str
        The file's schema as canonical JSON (:meth:`Schema.to_json_str`).
    compression : dict
        Its block compression config (as stored).
    heap_chunk_bytes : int
        Its heap chunk size.
    """

    path: str
    rows: int
    blocks: int
    rows_per_block: int
    heap_nbytes: int
    heap_chunks: int
    file_size: int
    index_crc32: int
    schema: str
    compression: dict = field(hash=False)
    heap_chunk_bytes: int

    @classmethod
    def from_layout(cls, rel_path: str, layout: Layout) -> ShardInfo:
        """The info of the shard file at ``rel_path`` whose layout is given."""
        e = manifest.shard_entry(rel_path, layout)
        return cls(**{k: e[k] for k in manifest.SHARD_KEYS}, schema=layout.schema.to_json_str(),
                   compression=dict(layout.compression), heap_chunk_bytes=layout.heap_chunk_bytes)  # fmt: skip

    @classmethod
    def committed(cls, root: str | os.PathLike, version: int | None = None) -> list[ShardInfo]:
        """The infos of the shards of a committed version (default: the current one) of the
        dataset at ``root``, in order: to commit those files again elsewhere (moved into another
        dataset's directory, under the same relative paths)."""
        m = manifest.load(os.fspath(root), version)
        cols = m.shards
        out = []
        for i in range(m.num_shards):
            entry: dict[str, Any] = {k: int(cols[k][i]) for k in manifest.SHARD_KEYS[1:]}
            out.append(cls(path=str(cols["path"][i]), **entry, schema=m.schema.to_json_str(),
                           compression=dict(m.compression), heap_chunk_bytes=int(m.heap_chunk_bytes)))  # fmt: skip
        return out

    def entry(self) -> dict[str, Any]:
        """Its manifest entry (the keys of :data:`.manifest.SHARD_KEYS`)."""
        return {k: getattr(self, k) for k in manifest.SHARD_KEYS}

    def get_schema(self) -> Schema:
        return Schema.from_json(self.schema)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"shard name {name!r} must be a plain file name: letters, digits, '_', '.', '-' "
                         "(not starting with '.' or '-'), at most 200 characters, no directory")  # fmt: skip
    return name


def _prepare_dir(root: str) -> str:
    """Create ``root`` and ``root/shards`` if missing; the shards directory."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(f"{root!r} is a file; a dataset is a directory")
    shards = os.path.join(root, manifest.SHARD_DIR)
    os.makedirs(shards, exist_ok=True)
    return shards


def write_shard(path: str | os.PathLike, schema: Schema, data: Mapping[str, Any] | Iterable[Mapping[str, Any]], *,
                block_bytes: int = DEFAULT_BLOCK_BYTES, rows_per_block: int | None = None, compression: Any = None,
                heap_chunk_bytes: int = DEFAULT_HEAP_CHUNK_BYTES, name: str | None = None,
                threads: int | None = None, storage_options: Mapping[str, Any] | None = None,
                batches: bool = False) -> ShardInfo:
    """Write one shard file of the dataset at ``path``; :func:`commit` makes it part of a version.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory; it and its ``shards/`` directory are created if missing. The
        dataset need not exist yet, and no lock is taken.
    schema : Schema
        The schema of the rows (every shard of a dataset has the same one).
    data : mapping or iterable of mappings
        Either columns, ``{name: array or sequence}``, as :meth:`.Writer.write_batch` takes (any
        mapping is taken as columns), or an iterable of rows, each as :meth:`.Writer.write` takes.
    block_bytes, rows_per_block, compression, heap_chunk_bytes, threads
        As for :class:`.Writer` (compression and heap_chunk_bytes must be the dataset's).
    name : str, optional
        File name without ``.h5`` (a plain name, unique in the dataset); default
        ``part-<uuid4 hex>``.
    batches : bool
        ``data`` is an iterable of column mappings, each written with ``write_batch`` (a stream
        of record batches, e.g. a Spark partition, held one batch at a time).

    Returns
    -------
    ShardInfo
        What :func:`commit` needs (send it to the committing process; it pickles).

    Notes
    -----
    A module-level function holding no state: pass it to ``multiprocessing``, Dask or Spark.
    A bad row raises :class:`~rowstore.errors.RowValidationError` (row numbers within ``data``)
    and leaves no file. The file appears complete or not at all; one never committed is removed
    by a later :func:`commit` or :func:`gc` once older than their grace period.
    """
    root = os.fspath(path)
    if is_url(root):  # written locally, then uploaded whole (one PUT) under the dataset's URL
        from rowstore.format import _remote_write

        tmp = _remote_write.local_temp()
        try:
            info = write_shard(tmp, schema, data, block_bytes=block_bytes, rows_per_block=rows_per_block,
                               compression=compression, heap_chunk_bytes=heap_chunk_bytes, name=name, threads=threads,
                               batches=batches)  # fmt: skip
            _remote_write.upload(_remote_write.client(root, storage_options), os.path.join(tmp, info.path),
                                 join(root, info.path))
        finally:
            _remote_write.remove_tree(tmp)
        return info
    shards = _prepare_dir(root)
    fname = (f"part-{uuid.uuid4().hex}" if name is None else _check_name(name)) + ".h5"
    target = os.path.join(shards, fname)
    with Writer(target, schema, mode="x", block_bytes=block_bytes, rows_per_block=rows_per_block,
                compression=compression, heap_chunk_bytes=heap_chunk_bytes, threads=threads) as w:  # fmt: skip
        if batches:
            for columns in data:
                w.write_batch(columns)  # type: ignore[arg-type]  # each item is a column mapping
        elif isinstance(data, Mapping) or hasattr(data, "columns"):  # columns, or a DataFrame-like object
            w.write_batch(data)  # type: ignore[arg-type]  # a DataFrame-like object is not a Mapping
        else:
            for row in data:
                w.write(row)
    return ShardInfo.from_layout(f"{manifest.SHARD_DIR}/{fname}", Layout.open(target))


def discard(path: str | os.PathLike, infos: Iterable[ShardInfo]) -> None:
    """Remove the (uncommitted) shard files of ``infos`` from the dataset directory ``path``:
    what a writer that fails part-way leaves behind (a later :func:`gc` would, after its grace
    period)."""
    for info in infos:
        try:
            os.remove(os.path.join(os.fspath(path), info.path))
        except OSError:
            pass


# -- commit ----------------------------------------------------------------------------------------
def _bad_shard(info: ShardInfo, msg: str) -> FormatError:
    return FormatError(f"shard {info.path!r}: {msg}", path=info.path)


def _check_info(root: str, info: Any) -> Layout:
    """Check one shard file against its info; its layout."""
    if not isinstance(info, ShardInfo):
        raise TypeError(f"commit takes ShardInfo objects (from write_shard), got {type(info).__name__}")
    manifest._safe_relpath("commit", info.path)
    full = os.path.join(root, info.path)
    try:
        size = os.stat(full).st_size
    except FileNotFoundError:
        raise FormatError(f"shard {info.path!r} is missing: no file at {full!r} (was it written to another "
                          "dataset directory, or removed by gc?)", path=info.path) from None  # fmt: skip
    if size != info.file_size:
        raise _bad_shard(info, f"file has {size} bytes, expected {info.file_size} (changed since it was written)")
    layout = Layout.open(full)
    got = ShardInfo.from_layout(info.path, layout)
    for k in manifest.SHARD_KEYS[1:]:
        if getattr(got, k) != getattr(info, k):
            what = "index CRC-32" if k == "index_crc32" else k
            raise _bad_shard(info, f"{what} of the file is {getattr(got, k)}, expected {getattr(info, k)} "
                                   "(the file is not the one written)")  # fmt: skip
    if got.schema != info.schema:
        raise SchemaError(f"shard {info.path!r}: the file's schema differs from its ShardInfo's")
    if got.compression != info.compression or got.heap_chunk_bytes != info.heap_chunk_bytes:
        raise _bad_shard(info, "the file's compression or heap_chunk_bytes differ from its ShardInfo's")
    return layout


def _check_same(first: tuple[str, Schema, dict, int], info: ShardInfo, layout: Layout) -> None:
    where, schema, compression, H = first
    if layout.schema != schema:
        raise SchemaError(f"shard {info.path!r}: its schema differs from {where}'s:\n{layout.schema}\nvs\n{schema}")
    if layout.compression != compression:
        raise ValueError(f"shard {info.path!r}: compression {layout.compression} differs from {where}'s {compression}")
    if layout.heap_chunk_bytes != H:
        raise ValueError(f"shard {info.path!r}: heap_chunk_bytes {layout.heap_chunk_bytes} differs from {where}'s {H}")


def _check_attrs(attrs: Any) -> dict:
    return attrs_json.check(attrs)


def commit(path: str | os.PathLike, shard_infos: Sequence[ShardInfo], *, mode: str = "w",
           attrs: Mapping[str, Any] | None = None, orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
           storage_options: Mapping[str, Any] | None = None) -> int:
    """Publish the next version of the dataset at ``path``, made of shards written by :func:`write_shard`.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory.
    shard_infos : sequence of ShardInfo
        The shards, in the order their rows take in the dataset.
    mode : {"w", "x", "a"}
        ``"w"``: the new version holds exactly these shards (the old version's files stay for its
        readers until :func:`gc`); ``"x"``: as ``"w"`` but :class:`FileExistsError` if a version
        exists; ``"a"``: the current version's shards followed by these (creates the dataset if
        there is none).
    attrs : mapping, optional
        User attributes (JSON-serialisable) of the new version; default ``{}``, or the current
        version's for ``"a"``.
    orphan_grace_s : float
        After publishing, shard files that no manifest version names and not modified for this
        many seconds are removed (younger ones may belong to a job that has not committed yet),
        and the stale temporary files of killed writers.

    Returns
    -------
    int
        The new version.

    Raises
    ------
    FormatError
        A shard file is missing, or differs from its info (size, index checksum, row counts...).
    SchemaError, ValueError
        The shards disagree with each other or (``"a"``) with the dataset on schema, compression
        or heap_chunk_bytes; a path is given twice or (``"a"``) is already in the dataset;
        nothing to describe (no shard and no dataset).

    Notes
    -----
    Runs under the dataset's commit lock (commits of one dataset, in any process, run one at a
    time; a waiting commit sees the one before it). Nothing is published when a check fails. Each
    shard's HDF5 metadata is read once (``Layout.open``).
    """
    root = os.fspath(path)
    if is_url(root):  # sidecar, manifest, then pointer uploaded (no lock: one committer at a time)
        from rowstore.format import _remote_write

        return _remote_write.commit_remote(root, shard_infos, mode=mode, attrs=attrs, storage_options=storage_options)
    if mode not in ("w", "x", "a"):
        raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
    infos = list(shard_infos)
    if attrs is not None:
        attrs = _check_attrs(attrs)
    seen: set[str] = set()
    for info in infos:
        if isinstance(info, ShardInfo):
            if info.path in seen:
                raise ValueError(f"shard {info.path!r} is given twice")
            seen.add(info.path)
    if not os.path.isdir(root):
        if os.path.exists(root):
            raise NotADirectoryError(f"{root!r} is a file; a dataset is a directory")
        if infos:
            raise FormatError(f"shard {infos[0].path!r} is missing: dataset directory {root!r} does not exist", path=root)
        raise ValueError(f"nothing to commit to {root!r}: no shards and no current version to append to")
    with manifest.commit_lock(root):
        exists = manifest.is_dataset(root)
        if mode == "x" and exists:
            raise FileExistsError(f"{root!r} already holds a dataset (mode='x')")
        base = manifest.load(root) if mode == "a" and exists else None
        parent = _current_version(root) if exists else None
        layouts = [_check_info(root, info) for info in infos]
        ref, entries, blocks, heap_chunks, attrs = next_version(root, base, infos, layouts, attrs)
        version = manifest.publish(root, schema=ref[1], attrs=attrs, compression=ref[2], heap_chunk_bytes=ref[3],
                                   shards=entries, blocks=blocks, heap_chunks=heap_chunks,
                                   parent=parent)  # fmt: skip
        # Published: from here on nothing may fail the commit (a caller would discard its shards).
        try:
            _collect(root, keep=None, grace_s=orphan_grace_s, dry_run=False)
        except (OSError, FormatError) as exc:
            warnings.warn(f"rowstore: version {version} of {root!r} is committed, but removing leftovers "
                          f"failed: {exc}", RuntimeWarning, stacklevel=2)  # fmt: skip
    return version


def next_version(where: str, base: manifest.Manifest | None, infos: Sequence[ShardInfo], layouts: Sequence[Layout],
                 attrs: Mapping[str, Any] | None) -> tuple[tuple, list[dict], list[np.ndarray], list[np.ndarray], dict]:
    """What a commit publishes, from its checked shards (``layouts``, one per info) and the
    version it appends to (``base``, None for a new dataset): ``(ref, entries, blocks,
    heap_chunks, attrs)``, ``ref`` being ``(what, schema, compression, heap_chunk_bytes)`` every
    shard agrees with. Shared by the local commit and the object-storage one."""
    if base is not None:
        ref: tuple = (f"dataset {where!r}", base.schema, base.compression, base.heap_chunk_bytes)
        have = set(base.shards["path"])
        for info in infos:
            if info.path in have:
                raise ValueError(f"shard {info.path!r} is already in version {base.version} of {where!r}")
    elif layouts:
        ref = (f"shard {infos[0].path!r}", layouts[0].schema, layouts[0].compression, layouts[0].heap_chunk_bytes)
    else:
        raise ValueError(f"nothing to commit to {where!r}: no shards and no current version to append to")
    for info, layout in zip(infos, layouts):
        _check_same(ref, info, layout)
    entries, blocks, heap_chunks = _base_shards(base)
    entries += [info.entry() for info in infos]
    blocks += [layout.blocks for layout in layouts]
    heap_chunks += [layout.heap_chunks for layout in layouts]
    if attrs is None:
        attrs = dict(base.attrs) if base is not None else {}
    return ref, entries, blocks, heap_chunks, dict(attrs)


def _current_version(root: str) -> int | None:
    """The current version, None if the pointer cannot be read (a "w" commit replaces it)."""
    try:
        return manifest.read_pointer(root)[0]
    except FormatError:
        return None


def _base_shards(m: manifest.Manifest | None) -> tuple[list[dict], list[np.ndarray], list[np.ndarray]]:
    """The entries and per-shard indexes of an existing version (copied out of its sidecar)."""
    if m is None:
        return [], [], []
    s = m.shards
    entries = [{"path": p, **{k: int(s[k][i]) for k in manifest.SHARD_KEYS[1:]}} for i, p in enumerate(s["path"])]
    b_end, h_end = np.cumsum(s["blocks"]), np.cumsum(s["heap_chunks"])
    blocks = [m.blocks[int(e - n) : int(e)] for e, n in zip(b_end, s["blocks"])]
    heap_chunks = [m.heap_chunks[int(e - n) : int(e)] for e, n in zip(h_end, s["heap_chunks"])]
    return entries, blocks, heap_chunks


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


def _read_names(root: str, version: int) -> tuple[list[str], int | None]:
    """The shard paths a manifest names and its parent version (read without its sidecar:
    cheap, for gc)."""
    mpath = os.path.join(root, manifest.manifest_path(version))
    m = manifest._json_object(mpath, manifest._read_small(mpath, manifest.MAX_MANIFEST_BYTES))
    entries = m.get("shards")
    if not isinstance(entries, list):
        raise FormatError(f"{mpath!r}: 'shards' must be a list", path=mpath)
    where = f"{mpath} shard entry"
    paths = [manifest._safe_relpath(where, e.get("path") if isinstance(e, dict) else None) for e in entries]
    parent = m.get("parent")
    return paths, parent if isinstance(parent, int) and not isinstance(parent, bool) else None


def _shard_paths(root: str, version: int) -> list[str]:
    return _read_names(root, version)[0]


_SIDE_FILE = re.compile(r"v(\d{8})\.(json|index)")


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


def _newest_loading(root: str, have: Sequence[int], kept: Sequence[int]) -> int | None:
    """The newest version whose manifest and sidecar load, if newer than every kept one."""
    for v in reversed(have):
        if kept and v <= max(kept):
            return None
        try:
            manifest.load(root, v)
        except FormatError:
            continue
        return v
    return None


def _collect(root: str, *, keep: int | None, grace_s: float, dry_run: bool,
             allow_outside_links: bool = False) -> GCReport:
    """The work of :func:`gc` and of a commit's clean-up (``keep=None``: keep every version);
    the caller holds the commit lock and has checked that the pointer reads."""
    report = GCReport(root=root, dry_run=dry_run)
    mreal = _own_dir(root, manifest.MANIFEST_DIR, allow_outside_links)
    sreal = _own_dir(root, manifest.SHARD_DIR, allow_outside_links)
    current = manifest.read_pointer(root)[0]
    report.current = current
    have = manifest.versions(root)
    if current not in have:
        raise FormatError(f"{root!r}: the current version {current} has no manifest; not collecting", path=root)
    names: dict[int, list[str]] = {}
    if keep is None:  # a commit's clean-up removes no version
        kept, chain = list(have), set(have)
    else:
        # The versions that were current once: the current one and its parents. A manifest
        # outside that chain was left by a commit killed before its pointer was written.
        order: list[int] = []
        v: int | None = current
        while v is not None and v in have and v not in order:
            try:
                names[v], parent = _read_names(root, v)
            except FormatError:
                if len(order) < keep:
                    raise  # a version to keep that cannot be read: remove nothing
                break  # its shards then stay under the grace rule
            order.append(v)
            v = parent
        kept, chain = sorted(order[:keep]), set(order)
        report.spared = _newest_loading(root, have, kept)
    spare = kept + ([report.spared] if report.spared is not None else [])
    named_kept: set[str] = set()
    for v in spare:
        named_kept.update(names[v] if v in names else _shard_paths(root, v))  # unreadable: raise
    # Shards named only by versions that were current once go with them; those named only by a
    # never-current manifest stay under the grace rule (a killed commit of them may be retried).
    named_removed: set[str] = set()
    for v in chain.difference(spare):
        named_removed.update(names[v])
    report.kept_versions = kept
    mfd, sfd = _open_dir(mreal), None
    try:
        sfd = _open_dir(sreal)
        side = sorted(os.listdir(mfd)) if mfd is not None else []
        for n in sorted(side, key=lambda n: n.endswith(".index")):  # manifests, then sidecars
            m = _SIDE_FILE.fullmatch(n)
            v = int(m.group(1)) if m else None
            if v is not None and v not in spare and (keep is not None or v not in have):
                # (a sidecar without manifest: a killed commit's)
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
        raise NotADirectoryError(errno.ENOTDIR,
                                 f"{doing}: {root!r} is a file, not a dataset directory")
    if manifest.is_dataset(root):
        return
    have = manifest.versions(root)
    hint = (f"; its {manifest.MANIFEST_DIR}/ holds version(s) {', '.join(map(str, have[-5:]))}: "
            f"if the pointer was lost, `rowstore repair {root}` (rowstore.restore_pointer) makes "
            "the newest sound one current again" if have else "")  # fmt: skip
    raise FormatError(f"{doing}: {root!r} is not a readable rowstore dataset (no "
                      f"{manifest.POINTER}){hint}; nothing was removed", path=root)  # fmt: skip


def gc(path: str | os.PathLike, *, dry_run: bool = True, keep_versions: int = 1,
       orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
       allow_outside_links: bool = False) -> GCReport:
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
        return _collect(root, keep=keep_versions, grace_s=orphan_grace_s, dry_run=dry_run,
                        allow_outside_links=allow_outside_links)


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


def restore_pointer(path: str | os.PathLike, *, dry_run: bool = False, verify: bool = False,
                    allow_outside_links: bool = False) -> PointerRepair:
    """Make a dataset whose pointer (``rowstore.json``) is missing or does not load readable
    again: point it at the newest version that is sound (exported as ``rowstore.restore_pointer``;
    ``rowstore repair DIR``).

    A version is sound when its manifest and sidecar load (every checksum), its block index
    passes the reader's checks, and every shard it names exists inside the dataset (see
    ``allow_outside_links``), has its recorded size and its own index, schema and row count
    agree with the manifest (``verify``: also every block and heap chunk's checksum, which reads
    all the data). The pointer is written atomically (temporary file, fsync, rename, directory
    fsync); nothing else is changed. A pointer that loads (with its manifest and sidecar) is
    left alone (:attr:`PointerRepair.current`): damage to its shards is for ``rowstore verify``
    to report, not a reason to go back to an older version.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory (local).
    dry_run : bool
        Only report the version that would be made current.
    verify : bool
        Also read every chunk of the candidate version's shards.
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
    root = os.fspath(path)
    if is_url(root):
        raise ValueError(f"restore_pointer works on local dataset directories, got {root!r}")
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
        have = manifest.versions(root)
        for v in reversed(have):
            try:
                _sound(root, v, verify=verify, allow_outside_links=allow_outside_links)
            except FormatError as exc:
                report.skipped.append((v, str(exc)))
                continue
            report.version = v
            if not dry_run:
                if not allow_outside_links:  # (a symlinked pointer's target is what is replaced)
                    manifest.check_inside(root, [manifest.POINTER], what="pointer")
                mpath = os.path.join(root, manifest.manifest_path(v))
                text = manifest._read_small(mpath, manifest.MAX_MANIFEST_BYTES)
                manifest._write_atomic(os.path.join(root, manifest.POINTER),
                                       manifest.pointer_bytes(v, text), exclusive=False)
                fsync_directory(root)
                manifest.load(root)  # what a reader now sees: this version, checksums and all
            return report
    why = ("; ".join(f"version {v}: {msg}" for v, msg in report.skipped[:5])
           or f"no manifest in {manifest.MANIFEST_DIR}/")
    raise FormatError(f"restore_pointer: no version of {root!r} is sound, nothing was written "
                      f"({report.problem}; {why})", path=root)


def _sound(root: str, version: int | None, *, verify: bool, allow_outside_links: bool) -> None:
    """Raise the first :class:`FormatError` that makes ``version`` (None: the pointer's) unsound."""
    L = DatasetLayout.from_manifest(manifest.load(root, version),
                                    allow_outside_links=allow_outside_links)
    for err in L.damage(limit=1, shard_indexes=True, chunks=verify):
        raise err


# -- DatasetWriter ---------------------------------------------------------------------------------
_ROW_PREFIX = re.compile(r"^row (\d+)")


def _renumber(exc: RowValidationError, offset: int) -> RowValidationError:
    """``exc`` with its row (and the message's leading ``row N``) moved by ``offset``."""
    if exc.row is None or offset == 0:
        return exc
    row = exc.row + offset
    msg = _ROW_PREFIX.sub(f"row {row}", str(exc), count=1)
    new = type(exc)(msg, field=exc.field, row=row)
    new.__cause__ = exc.__cause__
    return new


class DatasetWriter(Closing):
    """Write rows into a dataset of shard files, with the :class:`.Writer` API.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory. The new version appears only when :meth:`close` succeeds.
    schema : Schema, optional
        Required unless appending to an existing dataset (whose schema a given one must equal).
    mode : {"w", "x", "a"}
        ``"w"`` replaces the dataset's content at close (a new version; the old one's files stay
        until :func:`gc`), ``"x"`` fails if a dataset exists, ``"a"`` adds shards to the current
        version (or creates the dataset).
    shard_bytes : int
        Start a new shard once the current one holds this many raw bytes (rows times the row
        size plus heap payloads); a large batch is split between shards by rows.
    block_bytes, rows_per_block, threads
        As for :class:`.Writer`. The first shard's ``rows_per_block`` is used by every later
        shard (when appending with ``rows_per_block=None``, that of the existing shards if they
        share one).
    compression : None, str or dict
        As for :class:`.Writer`; default the dataset's when appending (a given one must equal it).
    heap_chunk_bytes : int, optional
        As for :class:`.Writer`; default 1 MiB, or the dataset's when appending.
    attrs : mapping, optional
        User attributes of the new version (JSON-serialisable; also ``writer.attrs``). When
        appending they update the current version's.

    Notes
    -----
    Not thread-safe. Row numbers (``num_rows``, the ``row`` of a
    :class:`~rowstore.errors.RowValidationError`) count the rows written through this writer.
    A bad row or batch writes nothing of itself and leaves the writer usable. :meth:`abort`, an
    exception escaping the ``with`` block, or a failed :meth:`close` remove the shards written;
    a killed process leaves them for the next :func:`commit`/:func:`gc` (grace period). While
    writing, the shards already written are touched at each rollover so that a clean-up with
    a grace period longer than a shard's writing time spares them.
    """

    def __init__(self, path: str | os.PathLike, schema: Schema | None = None, *, mode: str = "w",
                 shard_bytes: int = DEFAULT_SHARD_BYTES, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 rows_per_block: int | None = None, compression: Any = None, heap_chunk_bytes: int | None = None,
                 attrs: Mapping[str, Any] | None = None, threads: int | None = None,
                 storage_options: Mapping[str, Any] | None = None):  # fmt: skip
        self._closed = True
        self.url: str | None = None  # a URL: shards written locally, each uploaded when complete
        self._client: Any = None
        self._writer: Writer | None = None
        self._infos: list[ShardInfo] = []
        self._created: list[str] = []  # directories this writer made (removed again on abort if empty)
        if mode not in ("w", "x", "a"):
            raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
        if not isinstance(shard_bytes, int) or isinstance(shard_bytes, bool) or shard_bytes < 1:
            raise ValueError(f"shard_bytes must be a positive int, got {shard_bytes!r}")
        self.path = os.fspath(path)
        if is_url(self.path):
            from rowstore.format import _remote_write

            self.url = self.path.rstrip("/")
            self._client = _remote_write.client(self.url, storage_options)
            self.path = _remote_write.local_temp()
            exists = _remote_write.download_manifests(self._client, self.url, self.path) if mode in ("a", "x") else False
            if mode == "x" and exists:
                _remote_write.remove_tree(self.path)
                raise FileExistsError(f"{self.url!r} already holds a dataset (mode='x')")
        self.mode = mode
        self.shard_bytes = shard_bytes
        self.attrs: dict[str, Any] = {}
        exists = manifest.is_dataset(self.path)
        current = manifest.load(self.path) if mode == "a" and exists else None
        if mode == "x" and exists:
            raise FileExistsError(f"{self.path!r} already holds a dataset (mode='x')")
        if mode == "a" and current is not None:
            if schema is not None and Schema.from_json(schema.to_json()) != current.schema:
                raise SchemaError(f"cannot append to {self.path!r}: its schema differs from the one given:\n"
                                  f"{current.schema}\nvs\n{schema}")  # fmt: skip
            if compression is not None and compression_config(compression) != current.compression:
                raise ValueError(f"cannot append with compression {compression!r}: the dataset uses {current.compression}")
            if heap_chunk_bytes is not None and heap_chunk_bytes != current.heap_chunk_bytes:
                raise ValueError(f"cannot append with heap_chunk_bytes={heap_chunk_bytes}: the dataset uses "
                                 f"{current.heap_chunk_bytes}")  # fmt: skip
            schema, compression, heap_chunk_bytes = current.schema, current.compression, current.heap_chunk_bytes
            rpbs = set(current.shards["rows_per_block"].tolist())
            if rows_per_block is None and len(rpbs) == 1:
                rows_per_block = rpbs.pop()
            self.attrs.update(current.attrs)
        if not isinstance(schema, Schema):
            raise SchemaError(f"DatasetWriter needs a Schema (got {type(schema).__name__}) unless appending to "
                              "an existing dataset")  # fmt: skip
        if attrs:
            self.attrs.update(_check_attrs(attrs))
        self.schema: Schema = schema
        self._options = dict(block_bytes=block_bytes, rows_per_block=rows_per_block, compression=compression,
                             heap_chunk_bytes=DEFAULT_HEAP_CHUNK_BYTES if heap_chunk_bytes is None else heap_chunk_bytes,
                             threads=threads)  # fmt: skip
        self._itemsize = spec.row_dtype(schema).itemsize
        self._heap_fields = [f.name for f in schema if not f.inline]
        self._rows = 0  # rows in the closed shards
        self._nbytes = 0  # their raw bytes
        self._touched = time.monotonic()
        probe_dir = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(probe_dir):
            raise FileNotFoundError(f"directory {probe_dir!r} does not exist")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise NotADirectoryError(f"{self.path!r} is a file; a dataset is a directory")
        self._closed = False
        try:
            self._open_shard()  # validates the options (the Writer's checks) now, not at the first row
        except BaseException:
            self.abort()
            raise

    # -- public API ------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        """Rows accepted so far by this writer (not counting an appended-to dataset's)."""
        return self._rows + (self._writer.num_rows if self._writer is not None else 0)

    @property
    def shards(self) -> list[ShardInfo]:
        """The shards closed so far (the current one is added at :meth:`close`)."""
        return list(self._infos)

    def write(self, row: Mapping[str, Any]) -> None:
        """Validate and add one row; see :meth:`.Writer.write`."""
        w = self._current()
        try:
            w.write(row)
        except RowValidationError as exc:
            raise _renumber(exc, self._rows) from None
        self._maybe_roll()

    def write_batch(self, columns: Mapping[str, Any]) -> None:
        """Validate and add many rows given as columns; see :meth:`.Writer.write_batch`.

        All-or-nothing like the :class:`.Writer`'s, also when the batch is split between shards
        (it is validated whole first, then written in slices that keep shards near ``shard_bytes``).
        """
        w = self._current()
        columns = as_columns(columns, self.num_rows)  # a mapping, or a DataFrame-like object's columns
        n = len(next(iter(columns.values()))) if columns else 0
        est = self._estimate(columns)
        if n == 0 or w.raw_nbytes + n * est < self.shard_bytes:
            try:
                w.write_batch(columns)
            except RowValidationError as exc:
                raise _renumber(exc, self._rows) from None
            self._maybe_roll()
            return
        try:
            w._check_columns(columns, w.num_rows)  # the whole batch, before any of it is written
        except RowValidationError as exc:
            raise _renumber(exc, self._rows) from None
        done = 0
        while done < n:  # validated: slices that fill the current shard to about shard_bytes
            w = self._current()
            take = max(1, min(n - done, int((self.shard_bytes - w.raw_nbytes) // est)))
            w.write_batch({k: v[done : done + take] for k, v in columns.items()})
            done += take
            self._maybe_roll()
            est = self._estimate(columns)  # measured on the rows written from now on

    def close(self) -> int | None:
        """Close the last shard and commit the new version; returns it (None if already closed).

        On an error nothing is published and the shards written are removed (the writer is then
        closed); ``path`` is left as it was.
        """
        if self._closed:
            return None
        # writer.attrs may have changed: a bad value is refused with the writer still open (fix
        # attrs and close again), not after its shards were discarded.
        attrs = _check_attrs(self.attrs)
        try:
            # One shard at least for a new dataset (an empty one carries the schema).
            need_one = not self._infos and (self.mode != "a" or not manifest.is_dataset(self.path))
            if self._writer is not None and (self._writer.num_rows or need_one):
                self._close_shard()
            elif self._writer is not None:
                self._writer.abort()  # an empty trailing shard: not worth a file
                self._writer = None
            version = self._commit(attrs)
        except BaseException:
            if not self._published():
                self.abort()
            self._closed = True
            raise
        self._closed = True
        return version

    def _commit(self, attrs: dict) -> int:
        if self.url is None:
            return commit(self.path, self._infos, mode=self.mode, attrs=attrs)
        from rowstore.format import _remote_write

        layouts = [Layout.open(os.path.join(self.path, i.path)) for i in self._infos]
        version = _remote_write.commit_remote(self.url, self._infos, mode=self.mode, attrs=attrs,
                                              storage_options=self._client.options.storage_options, layouts=layouts)
        _remote_write.remove_tree(self.path)
        return version

    def abort(self) -> None:
        """Discard everything written; ``path`` is left as it was (a URL: the uploaded shards are
        removed, the dataset's versions untouched)."""
        self._closed = True
        w, self._writer = self._writer, None
        if w is not None:
            w.abort()
        if self.url is not None:
            from rowstore.format import _remote_write

            for info in self._infos:
                try:
                    self._client.fs.rm_file(self._client.path(join(self.url, info.path)))
                except (OSError, FormatError):
                    pass
            _remote_write.remove_tree(self.path)
        for info in self._infos:
            try:
                os.unlink(os.path.join(self.path, info.path))
            except FileNotFoundError:
                pass
        self._infos = []
        for d in reversed(self._created):
            try:
                os.rmdir(d)
            except OSError:
                pass  # not empty (someone else's files) or gone
        self._created = []


    def __repr__(self) -> str:
        return f"DatasetWriter({self.path!r}, mode={self.mode!r}, rows={self.num_rows}, shards={len(self._infos)})"

    # -- shards ----------------------------------------------------------------------------
    def _current(self) -> Writer:
        if self._closed:
            raise WriterClosedError(f"dataset writer for {self.path!r} is closed")
        if self._writer is None:
            self._open_shard()
        assert self._writer is not None
        return self._writer

    def _open_shard(self) -> None:
        for d in (self.path, os.path.join(self.path, manifest.SHARD_DIR)):
            if not os.path.isdir(d):
                os.mkdir(d)
                self._created.append(d)
        target = os.path.join(self.path, manifest.SHARD_DIR, f"part-{uuid.uuid4().hex}.h5")
        self._writer = Writer(target, self.schema, mode="x", **self._options)

    def _raw_current(self) -> int:
        return self._writer.raw_nbytes if self._writer is not None else 0

    def _maybe_roll(self) -> None:
        if self._writer is not None and self._writer.raw_nbytes >= self.shard_bytes:
            self._close_shard()

    def _close_shard(self) -> None:
        w, self._writer = self._writer, None
        assert w is not None
        self._rows += w.num_rows
        self._nbytes += w.raw_nbytes
        w.close()
        rel = f"{manifest.SHARD_DIR}/{os.path.basename(w.path)}"
        info = ShardInfo.from_layout(rel, Layout.open(w.path))
        if self.url is not None:  # complete: uploaded now (the commit names it later)
            from rowstore.format import _remote_write

            _remote_write.upload(self._client, w.path, join(self.url, rel))
        self._infos.append(info)
        if self._options["rows_per_block"] is None:
            self._options["rows_per_block"] = info.rows_per_block  # later shards: the same blocks
        if time.monotonic() - self._touched > 60:  # keep the shards written so far young (see Notes)
            self._touched = time.monotonic()
            for i in self._infos:
                try:
                    os.utime(os.path.join(self.path, i.path))
                except FileNotFoundError:
                    pass

    def _estimate(self, columns: Mapping[str, Any]) -> float:
        """Raw bytes per row: measured on the rows written so far, else from the batch's first row."""
        if self.num_rows:
            return max(1.0, (self._nbytes + self._raw_current()) / self.num_rows)
        est = float(self._itemsize)
        for name in self._heap_fields:
            col = columns.get(name)
            try:
                v = col[0] if col is not None and len(col) else None
            except (TypeError, KeyError, IndexError):
                v = None
            if isinstance(v, (bytes, bytearray, memoryview, str, np.ndarray)):
                est += len(v) if not isinstance(v, np.ndarray) else v.nbytes
        return max(1.0, est)

    def _published(self) -> bool:
        """Whether the current version names one of this writer's shards (a commit that failed
        after publishing: its shards must stay)."""
        if not self._infos or not manifest.is_dataset(self.path):
            return False
        try:
            return bool(set(_shard_paths(self.path, manifest.read_pointer(self.path)[0])) & {i.path for i in self._infos})
        except (OSError, FormatError):
            return True  # cannot tell: keep the files (gc removes them if they are orphans)
