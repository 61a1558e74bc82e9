"""Dataset manifest v1, declared once: a directory of shard files named by versioned manifests.

``docs/format.md`` ("Dataset manifest v1") specifies it in prose; keep both in step.

::

    DATASET/
      rowstore.json                 the pointer: which manifest is current (replaced atomically)
      _manifests/v00000003.json     manifest of version 3 (immutable once written)
      _manifests/v00000003.index    its block-index sidecar (immutable)
      _manifests/.lock              held (flock) by a commit in progress
      shards/<name>.h5              shard files: ordinary format-v1 files, never rewritten

A commit writes the sidecar and the manifest of version k+1 (each atomically), then replaces the
pointer. On a store without conditional writes (no lock, no put-if-absent) a version's objects
carry a unique id as well, ``_manifests/v00000003-<32 hex>.json`` and ``.index``, so two commits
never write one name; the pointer names the manifest exactly, and such a manifest names its
parent's manifest (``parent_manifest``); ``_manifests/v00000003-<32 hex>.pending`` marks such a
commit while it may still move the pointer (``docs/format.md``, "Commit protocol").

A reader reads the pointer, the manifest it names and that manifest's sidecar (three small
reads, never a shard's HDF5 metadata): what it opened stays readable while later versions
are committed (shards are never modified; only ``gc`` removes what no kept version names).

Everything a reader trusts is checksummed: the pointer holds the manifest's CRC-32, the manifest
the sidecar's and, per shard, the CRC-32 of that shard's block and heap chunk index as the shard
file stores them (so a commit can check a shard file against its entry, and ``verify`` can check
a shard's own index against the manifest).

The sidecar is ``INDEX_MAGIC`` followed by every shard's block index (:data:`spec.BLOCK_DTYPE`
records, shards in manifest order, shard-local values exactly as in the shard file), then every
shard's heap chunk index (:data:`spec.HEAP_CHUNK_DTYPE`), in the same order.

This module reads and writes those objects and checks their structure; what the numbers mean
(block ranges within each file, and so on) is checked by :mod:`rowstore.format.shards`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rowstore._version import __version__
from rowstore.codecs.blocks import compression_config
from rowstore.errors import (
    FormatError,
    FormatVersionError,
    MissingObjectError,
    ObjectChangedError,
    RowstoreError,
)
from rowstore.format import attrs as attrs_json
from rowstore.format import spec
from rowstore.format import stats as stats_format
from rowstore.schema import Schema
from rowstore.storage import Location, inputs, locate
from rowstore.storage.base import Destination
from rowstore.storage.localdir import LocalDir

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "POINTER",
    "MANIFEST_DIR",
    "SHARD_DIR",
    "INDEX_MAGIC",
    "Manifest",
    "is_dataset",
    "index_crc32",
    "shard_entry",
    "Pointer",
    "pointer",
    "read_pointer",
    "load",
    "find_manifest",
    "parent_of",
    "manifest_names",
    "pending_path",
    "index_of",
    "version_of",
    "owner_of",
    "versions",
    "publish",
    "commit_lock",
    "manifest_path",
    "index_path",
    "next_version",
    "version_objects",
    "pointer_bytes",
    "outside_links",
    "check_inside",
]

FORMAT_NAME = "rowstore-dataset"
FORMAT_VERSION = 1
READABLE_VERSIONS = (1,)
#: Kinds of manifest. "shards": rows are the shards' rows, in shard order. (Room for later kinds,
#: e.g. weighted mixtures of datasets, which a reader of this version refuses by name.)
KINDS = ("shards",)

POINTER = "rowstore.json"
MANIFEST_DIR = "_manifests"
SHARD_DIR = "shards"
LOCK = ".lock"
INDEX_MAGIC = b"RSDXIDX1"
#: A manifest larger than this is refused before parsing (10,000 shards take about 2.5 MB).
MAX_MANIFEST_BYTES = 1 << 30
_POINTER_MAX = 1 << 16

#: Keys of a shard entry and their meaning (all ints but ``path``).
SHARD_KEYS = (
    "path",
    "rows",
    "blocks",
    "rows_per_block",
    "heap_nbytes",
    "heap_chunks",
    "file_size",
    "index_crc32",
)
#: The global row number of an entry's first row, written with every entry and checked against
#: the entries before it: it pins the shard order (optional on reading).
FIRST_ROW = "first_row"


def manifest_path(version: int, uid: str | None = None) -> str:
    """The manifest of ``version``, relative to the dataset directory (``uid``: the unique id a
    commit without conditional writes gives its objects)."""
    return f"{MANIFEST_DIR}/v{version:08d}{'-' + uid if uid else ''}.json"


def index_path(version: int, uid: str | None = None) -> str:
    """The block-index sidecar of ``version``, relative to the dataset directory."""
    return f"{MANIFEST_DIR}/v{version:08d}{'-' + uid if uid else ''}.index"


def pending_path(version: int, uid: str) -> str:
    """The object a commit without conditional writes keeps while it may still move the
    pointer (its content: the manifest its version is built on)."""
    return f"{MANIFEST_DIR}/v{version:08d}-{uid}{PENDING}"


def new_uid() -> str:
    """A unique id for one commit attempt's objects (no other commit can choose it)."""
    return uuid.uuid4().hex


#: What follows a manifest's name in its sidecar's and a pending commit's.
PENDING = ".pending"
#: Every object name in ``_manifests/`` a commit writes: version, unique id (or none), kind.
_SIDE_NAME = re.compile(r"v(\d{8})(?:-([0-9a-f]{32}))?\.(json|index|pending)")
_MANIFEST_NAME = re.compile(rf"{MANIFEST_DIR}/v(\d{{8}})(?:-[0-9a-f]{{32}})?\.json")


def version_of(rel: Any) -> int | None:
    """The version a manifest name (``_manifests/v00000003.json`` or
    ``_manifests/v00000003-<32 hex>.json``) holds; None for any other name."""
    m = _MANIFEST_NAME.fullmatch(rel) if isinstance(rel, str) else None
    return int(m.group(1)) if m else None


def owner_of(name: str) -> tuple[str, str] | None:
    """``(manifest name, kind)`` of an object in ``_manifests/`` (kind ``json``, ``index`` or
    ``pending``: the manifest's own, its sidecar or its pending commit's); None for other names."""
    m = _SIDE_NAME.fullmatch(name)
    if not m:
        return None
    uid = f"-{m.group(2)}" if m.group(2) else ""
    return f"{MANIFEST_DIR}/v{m.group(1)}{uid}.json", m.group(3)


def index_of(mrel: str) -> str:
    """The sidecar name of the manifest ``mrel``."""
    return mrel[: -len(".json")] + ".index"


def is_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a dataset directory (holds a pointer file)."""
    return os.path.isfile(os.path.join(os.fspath(path), POINTER))


def outside_links(root: str | os.PathLike, rels: Sequence[str]) -> list[tuple[str, str]]:
    """``(rel, real path)`` of each of ``rels`` (plain relative paths under the local directory
    ``root``) whose real path, symlinks resolved, is not inside the real path of ``root``: the
    containment check every surface uses (:func:`rowstore.storage.inputs.outside`)."""
    return inputs.outside(root, rels)


def check_inside(root: str | os.PathLike, rels: Sequence[str], *, what: str) -> None:
    """Raise :class:`FormatError` for the first of ``rels`` that :func:`outside_links` finds
    (``what``: the objects, for the message)."""
    bad = inputs.outside(root, rels)
    if bad:
        rel, real = bad[0]
        root = os.fspath(root)
        where = os.path.join(root, rel)
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise FormatError(
            f"{where!r}: {what} {rel!r} of dataset {root!r} resolves to {real!r}, "
            f"outside the dataset directory {os.path.realpath(root)!r} (a symlink)"
            f"{more}; refused: pass allow_outside_links=True (CLI: "
            "--allow-outside-links) to follow links out of it",
            path=where,
        )


def index_crc32(blocks: np.ndarray, heap_chunks: np.ndarray) -> int:
    """CRC-32 of a shard's block index followed by its heap chunk index (little-endian records)."""
    b = np.ascontiguousarray(blocks, dtype=spec.BLOCK_DTYPE)
    h = np.ascontiguousarray(heap_chunks, dtype=spec.HEAP_CHUNK_DTYPE)
    return zlib.crc32(h.tobytes(), zlib.crc32(b.tobytes()))


def shard_entry(rel_path: str, layout: Any) -> dict[str, Any]:
    """The manifest entry of a shard file whose :class:`~rowstore.format.index.Layout` is given."""
    return {
        "path": rel_path,
        "rows": layout.num_rows,
        "blocks": layout.num_blocks,
        "rows_per_block": layout.rows_per_block,
        "heap_nbytes": layout.heap_nbytes,
        "heap_chunks": len(layout.heap_chunks),
        "file_size": layout.file_size,
        "index_crc32": index_crc32(layout.blocks, layout.heap_chunks),
    }


@dataclass(frozen=True)
class Manifest:
    """One version of a dataset, as read (and structurally checked) from its manifest and sidecar.

    ``shards`` holds one column per key of :data:`SHARD_KEYS` (``path``: a list of str, relative
    to ``root``; the others int64 arrays); ``blocks`` and ``heap_chunks`` are every shard's index,
    concatenated in shard order (views of the sidecar; do not modify). ``name``: its manifest,
    relative to ``root``.
    """

    root: str
    version: int
    schema: Schema
    attrs: dict
    compression: dict
    heap_chunk_bytes: int
    shards: dict[str, Any]
    blocks: np.ndarray
    heap_chunks: np.ndarray
    created: str = ""
    writer: str = ""
    name: str = ""
    #: Statistics of the version's rows (stored form, :mod:`rowstore.format.stats`): the merge
    #: of its shards'; None for a version without them.
    stats: dict | None = None

    @property
    def num_shards(self) -> int:
        return len(self.shards["path"])

    @property
    def num_rows(self) -> int:
        return int(self.shards["rows"].sum())


def _bad(path: str, msg: str) -> FormatError:
    return FormatError(f"{path!r}: {msg}", path=path)


def _json_object(path: str, data: bytes) -> dict:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(path, f"not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(obj, dict):
        raise _bad(path, f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _check_format(path: str, obj: dict) -> None:
    if obj.get("format") != FORMAT_NAME:
        raise _bad(
            path, f"not a rowstore dataset (format {obj.get('format')!r}, expected {FORMAT_NAME!r})"
        )
    v = obj.get("format_version")
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(path, f"format_version is missing or not an int: {v!r}")
    if v not in READABLE_VERSIONS:
        raise FormatVersionError(
            f"{path!r} uses rowstore dataset manifest v{v}; this rowstore reads v"
            + ", v".join(map(str, READABLE_VERSIONS))
            + (" (upgrade rowstore to read it)" if v > max(READABLE_VERSIONS) else ""),
            path=path,
        )


def _int(path: str, obj: dict, key: str, lo: int = 0) -> int:
    v = obj.get(key)
    if not _int_ok(v, lo):
        raise _bad(path, f"{key!r} must be an int >= {lo}, got {v!r}")
    return int(v)  # type: ignore[arg-type]  # checked: an int


class Pointer(NamedTuple):
    """What the pointer says: the current ``version``, the name of its ``manifest`` (relative to
    the dataset directory) and that manifest's ``crc32``."""

    version: int
    manifest: str
    crc32: int


def _where(root: str | os.PathLike | Location) -> Location:
    where = root if isinstance(root, Location) else locate(os.fspath(root))
    if isinstance(where, list):
        raise TypeError(f"one dataset path or Location expected, got {root!r}")
    return where


def pointer(root: str | os.PathLike | Location) -> Pointer:
    """The pointer of the dataset at ``root`` (a path or a
    :class:`~rowstore.storage.location.Location`), checked."""
    where = _where(root)
    p = where.join(POINTER)
    obj = _json_object(p, where.read_small(p, _POINTER_MAX))
    _check_format(p, obj)
    version = _int(p, obj, "version", 1)
    name = obj.get("manifest")
    if version_of(name) != version or not isinstance(name, str):
        raise _bad(
            p,
            f"names manifest {name!r}, expected {manifest_path(version)!r} (or "
            f"{manifest_path(version, '<32 hex>')!r}) for version {version}",
        )
    return Pointer(version, name, _int(p, obj, "manifest_crc32"))


def read_pointer(root: str | os.PathLike | Location) -> tuple[int, int]:
    """``(version, manifest CRC-32)`` of the current version of the dataset at ``root`` (a
    path or a :class:`~rowstore.storage.location.Location`)."""
    p = pointer(root)
    return p.version, p.crc32


def manifest_names(root: str | os.PathLike) -> list[str]:
    """The manifests under the local directory ``root`` (relative names, both forms), by
    version then name."""
    try:
        names = os.listdir(os.path.join(os.fspath(root), MANIFEST_DIR))
    except FileNotFoundError:
        return []
    out = [f"{MANIFEST_DIR}/{n}" for n in names]
    return sorted((r for r in out if version_of(r) is not None), key=lambda r: (version_of(r), r))


def versions(root: str | os.PathLike) -> list[int]:
    """The versions whose manifest exists under ``root``, ascending."""
    return sorted({version_of(r) or 0 for r in manifest_names(root)})


def parent_of(root: str | os.PathLike | Location, name: str) -> str | None:
    """The name of the parent manifest of the manifest ``name`` (None for a first version):
    its ``parent_manifest``, else the fixed name of its ``parent`` version."""
    where = _where(root)
    mpath = where.join(name)
    m = _json_object(mpath, where.read_small(mpath, MAX_MANIFEST_BYTES))
    return _parent_name(mpath, m)


def _parent_name(mpath: str, m: dict) -> str | None:
    named = m.get("parent_manifest")
    if named is not None:
        if not isinstance(named, str) or version_of(named) is None:
            raise _bad(mpath, f"parent_manifest {named!r} is not a manifest name")
        return named
    parent = m.get("parent")
    return manifest_path(parent) if _int_ok(parent, 1) else None  # type: ignore[arg-type]


def find_manifest(root: str | os.PathLike | Location, version: int) -> str:
    """The name of ``version``'s manifest: ``_manifests/v%08d.json`` where it exists, else the
    manifest of that version on the current version's chain of parents (a version committed
    without conditional writes has a unique name). :class:`MissingObjectError` if none."""
    where = _where(root)
    fixed = manifest_path(version)
    if where.exists(where.join(fixed)):
        return fixed
    name: str | None = pointer(where).manifest
    while name is not None and (version_of(name) or 0) > version:
        name = parent_of(where, name)
    if name is None or version_of(name) != version:
        missing = where.join(fixed)
        raise MissingObjectError(
            f"{missing!r} is missing, and no manifest of version {version} is on the current "
            "version's chain",
            path=missing,
        )
    return name


def _safe_relpath(where: str, rel: Any) -> str:
    """A shard path inside the dataset: relative, normalised, no ``..``, no NUL (the escape
    check is every surface's, :func:`rowstore.storage.inputs.name_problem`; the format adds
    its normal form: no empty or ``.`` component, no backslash)."""
    why = inputs.name_problem(rel)
    if why is not None or "\\" in rel:
        why = why or "holds a backslash"
        raise _bad(where, f"shard path {rel!r} {why}: not a plain relative path inside the dataset")
    if any(p in ("", ".") for p in rel.split("/")):
        raise _bad(where, f"shard path {rel!r} must be a plain relative path inside the dataset")
    return rel


_PLAIN_PATH = re.compile(r"(?:(?!\.\.?/)[^/\\\x00]+/)*(?!\.\.?$)[^/\\\x00]+")


def _shard_columns(mpath: str, entries: list) -> dict[str, Any]:
    """The shard entries as columns, checked column by column (10,000 entries in a few ms); on
    a failure, the first bad entry is found and named."""
    if not all(type(e) is dict for e in entries):
        i = next(i for i, e in enumerate(entries) if type(e) is not dict)
        raise _bad(f"{mpath} shard {i}", "a shard entry must be a JSON object")
    paths = [e.get("path") for e in entries]
    if not all(type(p) is str and _PLAIN_PATH.fullmatch(p) for p in paths):
        i = next(
            i for i, p in enumerate(paths) if not (type(p) is str and _PLAIN_PATH.fullmatch(p))
        )
        _safe_relpath(f"{mpath} shard {i}", paths[i])  # raises, naming what is wrong
        raise _bad(
            f"{mpath} shard {i}",
            f"shard path {paths[i]!r} must be a plain relative path inside the dataset",
        )
    if len(set(paths)) != len(paths):
        raise _bad(mpath, "two shard entries name the same file")
    cols: dict[str, Any] = {"path": paths}
    for k in SHARD_KEYS[1:]:
        lo = 1 if k in ("rows_per_block", "file_size") else 0
        vals = [e.get(k) for e in entries]
        ok = all(type(v) is int for v in vals)
        arr = (
            np.array(vals, dtype=np.int64)
            if ok and (not vals or -(1 << 63) <= min(vals) and max(vals) < 1 << 63)
            else None
        )
        if arr is None or (arr < lo).any():
            i = next(i for i, e in enumerate(entries) if _int_ok(e.get(k), lo) is False)
            _int(f"{mpath} shard {i}", entries[i], k, lo)  # raises
        cols[k] = arr.reshape(-1) if arr is not None else arr
    return cols


def _int_ok(v: Any, lo: int) -> bool:
    return type(v) is int and lo <= v < 1 << 63


def load(
    root: str | os.PathLike | Location,
    version: int | None = None,
    *,
    at: Pointer | None = None,
) -> Manifest:
    """Read and structurally check a version (default: the current one) of the dataset at
    ``root``: pointer, manifest and sidecar, with their checksums. Raises :class:`FormatError`
    (:class:`FormatVersionError` for a newer format) naming the object and what was expected.

    ``root`` is a path or a :class:`~rowstore.storage.location.Location` (an object store's:
    one bounded request per object). ``at``: a :class:`Pointer` already read (the version it
    names is loaded, its CRC checked)."""
    where = _where(root)
    expected_crc = None
    if version is None:
        at = at or pointer(where)
        version, name, expected_crc = at
    else:
        name = find_manifest(where, version)
    mpath = where.join(name)
    data = where.read_small(mpath, MAX_MANIFEST_BYTES)
    if expected_crc is not None and zlib.crc32(data) != expected_crc:
        raise _bad(
            mpath,
            f"CRC-32 {zlib.crc32(data)} does not match the {expected_crc} recorded in {POINTER} "
            f"(corrupt manifest)",
        )
    m = _json_object(mpath, data)
    _check_format(mpath, m)
    if not _int_ok(m.get("version"), 1) or m["version"] != version:  # 1.0 == 1, but is no version
        raise _bad(mpath, f"holds version {m.get('version')!r}, expected {version}")
    if m.get("kind") not in KINDS:
        raise _bad(
            mpath,
            f"manifest kind {m.get('kind')!r} is not one this rowstore reads ({', '.join(KINDS)})",
        )
    if not isinstance(m.get("schema"), dict):
        raise _bad(mpath, "'schema' must be a JSON object")
    try:
        schema = Schema.from_json(m["schema"])
    except RowstoreError as exc:
        if type(exc).__name__ == "CodecError" and getattr(exc, "codec", None):
            raise
        raise _bad(mpath, f"invalid schema: {exc}") from exc
    attrs = m.get("attrs", {})
    if not isinstance(attrs, dict):
        raise _bad(mpath, f"attrs must be a JSON object, got {type(attrs).__name__}")
    try:
        attrs = attrs_json.decode(attrs)
    except FormatError as exc:
        raise _bad(mpath, str(exc)) from None
    try:
        compression = compression_config(m.get("compression"))
    except RowstoreError as exc:
        raise _bad(mpath, f"invalid compression: {exc}") from exc
    H = _int(mpath, m, "heap_chunk_bytes", 1)
    entries = m.get("shards")
    if not isinstance(entries, list):
        raise _bad(mpath, "'shards' must be a list")
    shards = _shard_columns(mpath, entries)
    _check_first_rows(mpath, entries, shards["rows"])
    _parent_name(mpath, m)  # a parent_manifest must be a manifest name
    blocks, heap_chunks = _read_index(where, m, name, shards, mpath)
    stats = m.get("stats")
    if stats is not None:
        if len(json.dumps(stats)) > stats_format.MAX_STATS_BYTES:
            raise _bad(mpath, f"its statistics exceed {stats_format.MAX_STATS_BYTES} bytes")
        stats = stats_format.check_stats(
            stats, repr(mpath), schema.names, int(shards["rows"].sum())
        )
    return Manifest(
        root=where.path,
        version=version,
        schema=schema,
        attrs=attrs,
        compression=compression,
        heap_chunk_bytes=H,
        shards=shards,
        blocks=blocks,
        heap_chunks=heap_chunks,
        created=str(m.get("created", "")),
        writer=str(m.get("writer", "")),
        name=name,
        stats=stats,
    )


def _check_first_rows(mpath: str, entries: list, rows: np.ndarray) -> None:
    """Each entry's ``first_row`` against its place: the rows of the entries before it. The
    entries and the sidecar can be reordered consistently, every CRC recomputed; the rows the
    entries pin for themselves then no longer add up. A manifest whose entries have no
    ``first_row`` (the key is optional) is not checked; one where only some have it is refused."""
    firsts = [e.get(FIRST_ROW) for e in entries]
    if all(f is None for f in firsts):
        return
    expected = np.concatenate(([0], np.cumsum(rows)[:-1])).tolist() if len(rows) else []
    for i, (f, want) in enumerate(zip(firsts, expected)):
        if type(f) is not int or f != want:
            raise _bad(
                f"{mpath} shard {i}",
                f"{FIRST_ROW} {f!r}, but the shards before it hold {want} rows "
                "(shards reordered, inserted or removed)",
            )


def _read_index(
    where: Location, m: dict, name: str, shards: dict, mpath: str
) -> tuple[np.ndarray, np.ndarray]:
    idx = m.get("index")
    if not isinstance(idx, dict) or idx.get("path") != index_of(name):
        raise _bad(mpath, f"'index' must name the sidecar {index_of(name)!r}")
    nbytes, crc = _int(mpath, idx, "nbytes"), _int(mpath, idx, "crc32")
    nb, nh = int(shards["blocks"].sum()), int(shards["heap_chunks"].sum())
    expect = len(INDEX_MAGIC) + nb * spec.BLOCK_DTYPE.itemsize + nh * spec.HEAP_CHUNK_DTYPE.itemsize
    ipath = where.join(idx["path"])
    if nbytes != expect:
        raise _bad(
            mpath,
            f"sidecar size {nbytes} disagrees with the {nb} blocks and {nh} heap chunks of its "
            f"shards ({expect} bytes)",
        )
    try:  # one read; a larger object is refused before it is read
        raw = where.read_small(ipath, expect)
    except MissingObjectError:
        raise MissingObjectError(
            f"{ipath!r} (block-index sidecar of {mpath!r}) is missing", path=ipath
        ) from None
    if len(raw) != expect:
        raise _bad(
            ipath,
            f"has {len(raw)} bytes, the manifest records {expect} (truncated or replaced sidecar)",
        )
    if len(raw) != expect or raw[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise _bad(ipath, "not a rowstore block-index sidecar (bad magic or short read)")
    if zlib.crc32(raw) != crc:
        raise _bad(
            ipath,
            f"CRC-32 {zlib.crc32(raw)} does not match the {crc} its manifest records (corrupt "
            f"sidecar)",
        )
    buf = memoryview(raw)[len(INDEX_MAGIC) :]
    split = nb * spec.BLOCK_DTYPE.itemsize
    blocks = np.frombuffer(buf[:split], dtype=spec.BLOCK_DTYPE)
    heap_chunks = np.frombuffer(buf[split:], dtype=spec.HEAP_CHUNK_DTYPE)
    # Each shard's slice against its entry's CRC (what commit checked against the shard file),
    # straight from the sidecar's bytes.
    B, Hs = spec.BLOCK_DTYPE.itemsize, spec.HEAP_CHUNK_DTYPE.itemsize
    b_at = (len(INDEX_MAGIC) + np.concatenate(([0], np.cumsum(shards["blocks"]))) * B).tolist()
    h_at = (
        len(INDEX_MAGIC) + split + np.concatenate(([0], np.cumsum(shards["heap_chunks"]))) * Hs
    ).tolist()
    whole = memoryview(raw)
    crc32 = zlib.crc32
    want = shards["index_crc32"].tolist()
    for i in range(len(want)):
        if crc32(whole[h_at[i] : h_at[i + 1]], crc32(whole[b_at[i] : b_at[i + 1]])) != want[i]:
            raise _bad(
                ipath,
                f"index of shard {shards['path'][i]!r} does not match its CRC-32 in the manifest",
            )
    return blocks, heap_chunks


def commit_lock(root: str | os.PathLike) -> contextlib.AbstractContextManager[None]:
    """Hold the local dataset's commit lock (``flock`` of ``_manifests/.lock``; waits for
    another commit, dropped by the OS when the process dies): commits of one dataset run one
    at a time."""
    return LocalDir(root).lock(f"{MANIFEST_DIR}/{LOCK}")


def publish(
    root: str | os.PathLike | Destination,
    *,
    schema: Schema,
    attrs: dict,
    compression: dict,
    heap_chunk_bytes: int,
    shards: Sequence[dict[str, Any]],
    blocks: Sequence[np.ndarray],
    heap_chunks: Sequence[np.ndarray],
    parent: int | None = None,
    expect: Any = ...,
    stats: dict | None = None,
) -> int:
    """Write the next version of the dataset at ``root`` (a directory, or any
    :class:`~rowstore.storage.base.Destination`) and make it current; returns it.

    ``shards`` are entries as :func:`shard_entry` makes them (checked by the caller against the
    files), ``blocks``/``heap_chunks`` each shard's index in the same order. A local caller holds
    :func:`commit_lock`. Sidecar and manifest are each written as new objects (never over an
    existing one: :class:`FileExistsError` if another commit took this version), then the
    pointer is replaced (only if it is still ``expect``, a
    :meth:`~rowstore.storage.base.Destination.token`, when given: else
    :class:`~rowstore.errors.ObjectChangedError`, and this version's sidecar and manifest are
    removed again). A crash leaves the previous version current (and at most an unreferenced
    sidecar and manifest behind).
    """
    dest = LocalDir(root) if isinstance(root, (str, os.PathLike)) else root
    version = next_version(dest.list(MANIFEST_DIR))
    sidecar, text, pointer = version_objects(
        version,
        schema=schema,
        attrs=attrs,
        compression=compression,
        heap_chunk_bytes=heap_chunk_bytes,
        shards=shards,
        blocks=blocks,
        heap_chunks=heap_chunks,
        parent=parent,
        stats=stats,
    )
    dest.write_new(index_path(version), sidecar)
    dest.write_new(manifest_path(version), text)
    try:
        dest.replace(POINTER, pointer, expect=expect)  # last: the new version appears whole
    except ObjectChangedError:  # another commit moved the pointer: this version is not current
        for rel in (manifest_path(version), index_path(version)):
            with contextlib.suppress(OSError, FormatError):
                dest.remove(rel)
        raise
    dest.sync()
    return version


def next_version(names: Sequence[str]) -> int:
    """The version a commit publishes, given the names in the ``_manifests`` directory: past
    every manifest, sidecar and pending commit (a commit killed between its sidecar and its
    manifest leaves a sidecar that an exclusive write would collide with)."""
    have = [int(m.group(1)) for m in map(_SIDE_NAME.fullmatch, names) if m]
    return (max(have) if have else 0) + 1


def _entries(shards: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's shard entries, each with its ``first_row``: its place in the row order."""
    out, first = [], 0
    for s in shards:
        out.append({**{k: s[k] for k in SHARD_KEYS}, FIRST_ROW: first})
        first += int(s["rows"])
    return out


def version_objects(
    version: int,
    *,
    schema: Schema,
    attrs: dict,
    compression: dict,
    heap_chunk_bytes: int,
    shards: Sequence[dict[str, Any]],
    blocks: Sequence[np.ndarray],
    heap_chunks: Sequence[np.ndarray],
    parent: int | None = None,
    uid: str | None = None,
    parent_manifest: str | None = None,
    stats: dict | None = None,
) -> tuple[bytes, bytes, bytes]:
    """The bytes of version ``version``'s sidecar, manifest and pointer (what :func:`publish`
    writes, in that order; a remote commit uploads them in that order too).

    ``uid``: the objects' unique id (:func:`manifest_path`), for a commit without conditional
    writes; its manifest then also records ``parent_manifest``, the name of the manifest it was
    built on (None: the first version). Without ``uid`` the bytes are those every earlier
    version of this format has. ``stats``: the version's statistics (stored form), recorded
    under ``"stats"`` when they fit :data:`~rowstore.format.stats.MAX_STATS_BYTES`."""
    parts = [INDEX_MAGIC]
    parts += [np.ascontiguousarray(b, dtype=spec.BLOCK_DTYPE).tobytes() for b in blocks]
    parts += [np.ascontiguousarray(h, dtype=spec.HEAP_CHUNK_DTYPE).tobytes() for h in heap_chunks]
    sidecar = b"".join(parts)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "version": version,
        "parent": parent,
        "kind": "shards",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "writer": f"rowstore {__version__}",
        "file_format_version": spec.FORMAT_VERSION,
        "schema": schema.to_json(),
        "attrs": attrs_json.encode(attrs),
        "compression": compression,
        "heap_chunk_bytes": heap_chunk_bytes,
        "num_rows": int(sum(s["rows"] for s in shards)),
        "index": {
            "path": index_path(version, uid),
            "nbytes": len(sidecar),
            "crc32": zlib.crc32(sidecar),
        },
        "shards": _entries(shards),
    }
    if uid is not None:
        manifest["parent_manifest"] = parent_manifest
    stats_text = stats_format.encode_stats(stats)
    if stats_text is not None:
        manifest["stats"] = json.loads(stats_text)
    text = json.dumps(manifest, indent=1).encode()
    return sidecar, text, pointer_bytes(version, text, manifest_path(version, uid))


def pointer_bytes(version: int, manifest_text: bytes, name: str | None = None) -> bytes:
    """The pointer that makes ``version`` current, its manifest's bytes being ``manifest_text``
    and its name ``name`` (default: the fixed name of ``version``)."""
    pointer = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "version": version,
        "manifest": name or manifest_path(version),
        "manifest_crc32": zlib.crc32(manifest_text),
    }
    return json.dumps(pointer, indent=1).encode() + b"\n"
