"""Publishing a dataset version: one algorithm over a :class:`~rowstore.storage.base.Destination`
(a local directory or an object store prefix), :func:`commit`."""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.errors import (
    CommitConflictError,
    FormatError,
    MissingObjectError,
    ObjectChangedError,
    SchemaError,
)
from rowstore.format import attrs as attrs_json
from rowstore.format import manifest
from rowstore.format.index import Layout
from rowstore.format.open import open_file
from rowstore.format.stats import merge_stats
from rowstore.schema import Schema
from rowstore.storage import Destination, Location, destination, location_of, under
from rowstore.writer.gc import DEFAULT_ORPHAN_GRACE_S, _collect

__all__ = ["ShardInfo", "commit", "commit_to", "publish_unconditional", "next_version"]


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
        return cls(
            **{k: e[k] for k in manifest.SHARD_KEYS},
            schema=layout.schema.to_json_str(),
            compression=dict(layout.compression),
            heap_chunk_bytes=layout.heap_chunk_bytes,
        )

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
            out.append(
                cls(
                    path=str(cols["path"][i]),
                    **entry,
                    schema=m.schema.to_json_str(),
                    compression=dict(m.compression),
                    heap_chunk_bytes=int(m.heap_chunk_bytes),
                )
            )
        return out

    def entry(self) -> dict[str, Any]:
        """Its manifest entry (the keys of :data:`.manifest.SHARD_KEYS`)."""
        return {k: getattr(self, k) for k in manifest.SHARD_KEYS}

    def get_schema(self) -> Schema:
        return Schema.from_json(self.schema)


# -- commit ----------------------------------------------------------------------------------------
def _bad_shard(info: ShardInfo, msg: str) -> FormatError:
    return FormatError(f"shard {info.path!r}: {msg}", path=info.path)


def _check_info(dest: Destination, info: Any, storage_options: Mapping[str, Any] | None) -> Layout:
    """Check one shard file against its info; its layout."""
    if not isinstance(info, ShardInfo):
        raise TypeError(
            f"commit takes ShardInfo objects (from write_shard), got {type(info).__name__}"
        )
    manifest._safe_relpath("commit", info.path)
    full = under(dest.root, info.path)
    try:
        layout = open_file(full, storage_options)
    except MissingObjectError:
        raise MissingObjectError(
            f"shard {info.path!r} is missing: no file at {full!r} (was it written to another "
            "dataset, or removed by gc?)",
            path=info.path,
        ) from None
    except FormatError as exc:  # a file of another size is named as such, not by what broke in it
        size = dest.size(info.path)
        if size is not None and size != info.file_size:
            raise _bad_shard(
                info,
                f"file has {size} bytes, expected {info.file_size} (changed since it was written)",
            ) from exc
        raise
    if layout.file_size != info.file_size:
        raise _bad_shard(
            info,
            f"file has {layout.file_size} bytes, expected {info.file_size} "
            "(changed since it was written)",
        )
    got = ShardInfo.from_layout(info.path, layout)
    for k in manifest.SHARD_KEYS[1:]:
        if getattr(got, k) != getattr(info, k):
            what = "index CRC-32" if k == "index_crc32" else k
            raise _bad_shard(
                info,
                f"{what} of the file is {getattr(got, k)}, expected {getattr(info, k)} "
                "(the file is not the one written)",
            )
    if got.schema != info.schema:
        raise SchemaError(f"shard {info.path!r}: the file's schema differs from its ShardInfo's")
    if got.compression != info.compression or got.heap_chunk_bytes != info.heap_chunk_bytes:
        raise _bad_shard(
            info, "the file's compression or heap_chunk_bytes differ from its ShardInfo's"
        )
    return layout


def _check_same(first: tuple[str, Schema, dict, int], info: ShardInfo, layout: Layout) -> None:
    where, schema, compression, H = first
    if layout.schema != schema:
        raise SchemaError(
            f"shard {info.path!r}: its schema differs from {where}'s:\n"
            f"{layout.schema}\nvs\n{schema}"
        )
    if layout.compression != compression:
        raise ValueError(
            f"shard {info.path!r}: compression {layout.compression} differs from "
            f"{where}'s {compression}"
        )
    if layout.heap_chunk_bytes != H:
        raise ValueError(
            f"shard {info.path!r}: heap_chunk_bytes {layout.heap_chunk_bytes} differs from "
            f"{where}'s {H}"
        )


def _check_attrs(attrs: Any) -> dict:
    return attrs_json.check(attrs)


def commit(
    path: str | os.PathLike,
    shard_infos: Sequence[ShardInfo],
    *,
    mode: str = "w",
    attrs: Mapping[str, Any] | None = None,
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
    storage_options: Mapping[str, Any] | None = None,
) -> int:
    """Publish the next version of the dataset at ``path``, made of shards written by
    :func:`~rowstore.writer.dataset.write_shard`.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory, or its URL (``s3://bucket/data``).
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
        After publishing (local datasets), shard files that no manifest version names and not
        modified for this many seconds are removed (younger ones may belong to a job that has
        not committed yet), and the stale temporary files of killed writers.
    storage_options : mapping, optional
        fsspec options for a URL.

    Returns
    -------
    int
        The new version.

    Raises
    ------
    FormatError
        A shard file is missing (:class:`~rowstore.errors.MissingObjectError`), or differs from
        its info (size, index checksum, row counts...).
    SchemaError, ValueError
        The shards disagree with each other or (``"a"``) with the dataset on schema, compression
        or heap_chunk_bytes; a path is given twice or (``"a"``) is already in the dataset;
        nothing to describe (no shard and no dataset).
    CommitConflictError
        Other commits kept publishing versions while this one tried to (see Notes).

    Notes
    -----
    A local dataset's commits run under its commit lock (one at a time, in any process; a
    waiting commit sees the one before it). On an object store there is no lock. On S3 the
    version's objects are created only if absent and the pointer is replaced only if it is
    still the one read (conditional writes), so of two commits at once one wins and the other
    starts again on top of the new version (``"a"`` then appends to it). A store without
    conditional writes (GCS through gcsfs) gets objects under names no other commit chooses,
    and each commit, after writing the pointer, checks that its version stays on the current
    version's chain while other commits may still write the pointer (waiting for them), or
    starts again on top; see :func:`commit_to`. Either way every state of the store opens as
    some complete version, and a commit that returns is in the current version's history.
    Nothing is published when a check fails. Each shard's HDF5 metadata is read once.
    """
    root = os.fspath(path)
    if mode not in ("w", "x", "a"):
        raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
    dest = destination(root, storage_options)
    local = dest.local_root
    if local is not None and not os.path.isdir(local):
        if os.path.exists(local):
            raise NotADirectoryError(f"{root!r} is a file; a dataset is a directory")
        infos = list(shard_infos)
        if infos and isinstance(infos[0], ShardInfo):
            raise MissingObjectError(
                f"shard {infos[0].path!r} is missing: dataset directory {root!r} does not exist",
                path=root,
            )
        raise ValueError(
            f"nothing to commit to {root!r}: no shards and no current version to append to"
        )
    return commit_to(
        dest,
        shard_infos,
        mode=mode,
        attrs=attrs,
        orphan_grace_s=orphan_grace_s,
        storage_options=storage_options,
    )


#: How many times a commit starts again after another commit published first.
MAX_COMMIT_ATTEMPTS = 8
#: Seconds a commit without conditional writes waits for another commit's pending object to go
#: before it takes that commit for dead (killed between its pending object and its end) and
#: removes the object.
PENDING_STALE_S = 300.0


def commit_to(
    dest: Destination,
    shard_infos: Sequence[ShardInfo],
    *,
    mode: str = "w",
    attrs: Mapping[str, Any] | None = None,
    layouts: Sequence[Layout] | None = None,
    orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
    storage_options: Mapping[str, Any] | None = None,
    max_attempts: int = MAX_COMMIT_ATTEMPTS,
    stale_s: float = PENDING_STALE_S,
) -> int:
    """Publish the next version of the dataset at ``dest``: :func:`commit`'s algorithm.

    1. Check the arguments and each shard against its info (``layouts``: the shards' layouts,
       already known to the caller that wrote them, instead of reading them again).
    2. Under the destination's commit lock (local: ``flock``; object stores have none), read
       the pointer and its :meth:`~rowstore.storage.base.Destination.token`, the base version
       (``"a"``), and build the new version.
    3. Where the destination's writes are conditional (a local directory under its lock, S3's
       conditional PUTs), :func:`rowstore.format.manifest.publish`: sidecar and manifest as
       new objects, then the pointer replaced only if its token is unchanged. Elsewhere
       (:attr:`~rowstore.storage.base.Destination.conditional` False: GCS through gcsfs),
       :func:`publish_unconditional`: objects under names only this attempt can choose, the
       pointer written, then checked until no other commit can still replace it.
    4. If another commit took the version number or moved the pointer meanwhile (possible only
       without a lock), start again at 2 on top of that commit's version, at most
       ``max_attempts`` times, then :class:`~rowstore.errors.CommitConflictError`. A version
       is never lost: the pointer moves only from the version this commit was built on, or
       (without conditional writes) a commit whose version was replaced finds out and starts
       again. ``stale_s``: see :func:`publish_unconditional`.
    """
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
    where = dest.root
    loc = location_of(dest)
    with dest.lock(f"{manifest.MANIFEST_DIR}/{manifest.LOCK}"):
        if layouts is None:
            layouts = [_check_info(dest, info, storage_options) for info in infos]
        conflict: Exception | None = None
        for _attempt in range(max_attempts):
            token = dest.token(manifest.POINTER)
            exists = token is not None
            if mode == "x" and exists:
                raise FileExistsError(f"{where!r} already holds a dataset (mode='x')")
            at = _current(loc) if exists else None
            base = manifest.load(loc, at=at) if mode == "a" and exists else None
            ref, entries, blocks, heap_chunks, new_attrs = next_version(
                where, base, infos, layouts, attrs
            )
            parts = ([base.stats] if base is not None else []) + [x.stats for x in layouts]
            stats = merge_stats(parts) if parts else None
            objects = dict(
                schema=ref[1],
                attrs=new_attrs,
                compression=ref[2],
                heap_chunk_bytes=ref[3],
                shards=entries,
                blocks=blocks,
                heap_chunks=heap_chunks,
                stats=stats,
            )
            try:
                if dest.conditional:
                    version = manifest.publish(
                        dest, **objects, parent=at.version if at else None, expect=token
                    )
                else:
                    version = publish_unconditional(dest, objects, at, stale_s=stale_s)
            except (FileExistsError, ObjectChangedError) as exc:  # another commit was first
                conflict = exc
                continue
            break
        else:
            raise CommitConflictError(
                f"{where!r}: other commits published {max_attempts} times while this one "
                f"tried to; nothing of this commit is current, commit again ({conflict})",
                path=where,
            )
        # Published: from here on nothing may fail the commit (a caller would discard its shards).
        if dest.local_root is not None:
            try:
                _collect(dest.local_root, keep=None, grace_s=orphan_grace_s, dry_run=False)
            except (OSError, FormatError) as exc:
                warnings.warn(
                    f"rowstore: version {version} of {where!r} is committed, but removing "
                    f"leftovers failed: {exc}",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return version


def publish_unconditional(
    dest: Destination,
    objects: Mapping[str, Any],
    at: manifest.Pointer | None,
    *,
    stale_s: float = PENDING_STALE_S,
) -> int:
    """Publish a version built on ``at`` (the pointer read, None if there was none) on a store
    without conditional writes; returns it. ``objects``: :func:`.manifest.version_objects`'
    keyword arguments.

    1. The version is one past every name in ``_manifests/`` (and past ``at``); its sidecar,
       manifest and pending object get a unique id (``v%08d-<32 hex>``), written in that
       order: no other commit writes these names, and no pointer names them yet.
    2. The pointer is read again; if it no longer names ``at``'s manifest, the sidecar and
       manifest are removed (nothing named them) and :class:`ObjectChangedError` is raised.
    3. The pointer is written (unconditionally): it names this manifest and its CRC-32.
    4. Settle: read the pointer and walk its chain of parents: is this version on it? Then
       list ``_manifests/``: another commit's pending object may still write the pointer, and
       if its base's chain holds this version and the pointer's does not (it would put this
       version back into the history), or the other way round (it would take it out), wait
       (backing off) and settle again. One that stays ``stale_s`` seconds is taken for a
       killed commit's and removed, with a warning. Not on the chain when settled:
       :class:`ObjectChangedError` (the objects stay: a reader may have opened them).
    5. The pending object is removed (also when anything above fails).

    Every commit that can still write the pointer has a pending object, written before it read
    the pointer a second time, and writes the pointer once; once one is seen gone, it will not
    write again. So the settled answer is final: a version on the chain stays in every later
    version's history, one off it never enters it (no commit builds on it again), so a commit
    that starts again adds its rows once. Steps 2 and 4 cost one GET of the pointer, one
    listing, one GET per pending object and per manifest walked.
    """
    where = dest.root
    loc = location_of(dest)
    names = dest.list(manifest.MANIFEST_DIR)
    version = max(manifest.next_version(names), at.version + 1 if at else 1)
    uid = manifest.new_uid()
    base = at.manifest if at else None
    sidecar, text, pointer = manifest.version_objects(
        version,
        **objects,
        parent=at.version if at else None,
        uid=uid,
        parent_manifest=base,
    )
    mine = manifest.manifest_path(version, uid)
    pending = manifest.pending_path(version, uid)
    dest.write_new(manifest.index_path(version, uid), sidecar)
    dest.write_new(mine, text)
    dest.write_new(pending, json.dumps({"base": base}).encode())
    try:
        if _pointed(dest, loc) != base:
            for rel in (mine, manifest.index_path(version, uid)):
                with contextlib.suppress(OSError, FormatError):
                    dest.remove(rel)
            raise ObjectChangedError(
                f"{where}/{manifest.POINTER}: another commit moved it while version {version} "
                "was written",
                path=f"{where}/{manifest.POINTER}",
            )
        dest.replace(manifest.POINTER, pointer)
        if not _settle(dest, loc, mine, pending, stale_s):
            raise ObjectChangedError(
                f"{where}/{manifest.POINTER}: another commit replaced version {version} "
                f"({mine}) after it was made current",
                path=f"{where}/{manifest.POINTER}",
            )
    finally:
        with contextlib.suppress(OSError, FormatError):
            dest.remove(pending)
    return version


def _pointed(dest: Destination, loc: Location) -> str | None:
    """The manifest the pointer names now (None: no pointer, or one that does not load)."""
    try:
        return manifest.pointer(loc).manifest
    except FormatError:
        return None


def _pending_base(dest: Destination, rel: str) -> str | None:
    """The manifest a pending commit is built on (None: none, or a pending object that does not
    say); :class:`MissingObjectError` if the object is gone."""
    data = dest.read_small(rel, 1 << 16)
    try:
        base = json.loads(data.decode("utf-8")).get("base")
    except (UnicodeDecodeError, ValueError, AttributeError):
        return None
    return base if manifest.version_of(base) is not None else None


def _settle(dest: Destination, loc: Location, mine: str, pending: str, stale_s: float) -> bool:
    """Step 4 of :func:`publish_unconditional`: whether ``mine`` is on the current version's
    chain, once no other pending commit's pointer can change that (put it on or take it off)."""
    where, version = dest.root, manifest.version_of(mine) or 0
    parents: dict[str, str | None] = {}

    def holds(name: str | None) -> bool:  # whether ``name``'s chain of parents has ``mine``
        try:
            while name is not None:
                if name == mine:
                    return True
                if (manifest.version_of(name) or 0) <= version:
                    return False
                if name not in parents:
                    parents[name] = manifest.parent_of(loc, name)
                name = parents[name]
        except FormatError:  # a manifest of the chain does not read: not known to hold it
            return False
        return False

    first_seen: dict[str, float] = {}
    delay = 0.005
    while True:
        held = holds(_pointed(dest, loc))  # the pointer first, then the pending commits
        live = []
        for n in dest.list(manifest.MANIFEST_DIR):
            rel = f"{manifest.MANIFEST_DIR}/{n}"
            owner = manifest.owner_of(n)
            if owner is None or owner[1] != "pending" or rel == pending:
                continue
            try:
                if holds(_pending_base(dest, rel)) == held:
                    continue  # its pointer, if it writes one, keeps the outcome
            except MissingObjectError:
                continue  # finished meanwhile
            now = time.monotonic()
            if now - first_seen.setdefault(rel, now) < stale_s:
                live.append(rel)
                continue
            warnings.warn(
                f"rowstore: {where}/{rel} stayed {stale_s:g} s: taken for a killed commit's "
                "and removed",
                RuntimeWarning,
                stacklevel=4,
            )
            with contextlib.suppress(OSError, FormatError):
                dest.remove(rel)
        if not live:
            return held
        time.sleep(delay)
        delay = min(2 * delay, 0.25)


def next_version(
    where: str,
    base: manifest.Manifest | None,
    infos: Sequence[ShardInfo],
    layouts: Sequence[Layout],
    attrs: Mapping[str, Any] | None,
) -> tuple[tuple, list[dict], list[np.ndarray], list[np.ndarray], dict]:
    """What a commit publishes, from its checked shards (``layouts``, one per info) and the
    version it appends to (``base``, None for a new dataset): ``(ref, entries, blocks,
    heap_chunks, attrs)``, ``ref`` being ``(what, schema, compression, heap_chunk_bytes)`` every
    shard agrees with. Shared by the local commit and the object-storage one."""
    if base is not None:
        ref: tuple = (f"dataset {where!r}", base.schema, base.compression, base.heap_chunk_bytes)
        have = set(base.shards["path"])
        for info in infos:
            if info.path in have:
                raise ValueError(
                    f"shard {info.path!r} is already in version {base.version} of {where!r}"
                )
    elif layouts:
        ref = (
            f"shard {infos[0].path!r}",
            layouts[0].schema,
            layouts[0].compression,
            layouts[0].heap_chunk_bytes,
        )
    else:
        raise ValueError(
            f"nothing to commit to {where!r}: no shards and no current version to append to"
        )
    for info, layout in zip(infos, layouts):
        _check_same(ref, info, layout)
    entries, blocks, heap_chunks = _base_shards(base)
    entries += [info.entry() for info in infos]
    blocks += [layout.blocks for layout in layouts]
    heap_chunks += [layout.heap_chunks for layout in layouts]
    if attrs is None:
        attrs = dict(base.attrs) if base is not None else {}
    return ref, entries, blocks, heap_chunks, dict(attrs)


def _current(where: Location) -> manifest.Pointer | None:
    """The pointer, None if it cannot be read (a "w" commit replaces it)."""
    try:
        return manifest.pointer(where)
    except FormatError:
        return None


def _base_shards(
    m: manifest.Manifest | None,
) -> tuple[list[dict], list[np.ndarray], list[np.ndarray]]:
    """The entries and per-shard indexes of an existing version (copied out of its sidecar)."""
    if m is None:
        return [], [], []
    s = m.shards
    entries = [
        {"path": p, **{k: int(s[k][i]) for k in manifest.SHARD_KEYS[1:]}}
        for i, p in enumerate(s["path"])
    ]
    b_end, h_end = np.cumsum(s["blocks"]), np.cumsum(s["heap_chunks"])
    blocks = [m.blocks[int(e - n) : int(e)] for e, n in zip(b_end, s["blocks"])]
    heap_chunks = [m.heap_chunks[int(e - n) : int(e)] for e, n in zip(h_end, s["heap_chunks"])]
    return entries, blocks, heap_chunks
