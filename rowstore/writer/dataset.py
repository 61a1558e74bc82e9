"""Writing datasets of many files: shards, and :class:`DatasetWriter` (publishing a version is
:mod:`.commit`'s, garbage collection :mod:`.gc`'s).

A dataset is a directory or an object store prefix (:mod:`rowstore.format.manifest` declares
it): ``rowstore.json`` names the current
manifest version, which names shard files under ``shards/``. Writing one takes two phases:

1. :func:`write_shard` writes one shard file (an ordinary format-v1 file, by :class:`.Writer`)
   under a unique name and returns a :class:`ShardInfo`. It takes no lock and needs nothing of the
   dataset, so it runs anywhere (Dask/Spark workers, other processes); nothing is visible to
   readers yet, since no manifest names the file.
2. :func:`~rowstore.writer.commit.commit` checks the files against their :class:`ShardInfo`
   and publishes the next manifest version naming them, then removes leftovers.

:class:`DatasetWriter` does both in one process with the :class:`.Writer` API, rolling over to a
new shard every ``shard_bytes``. :func:`~rowstore.writer.gc.gc` removes old versions and the
shards only they name. At a URL, shards are made in a local staging directory
(:meth:`~rowstore.storage.base.Destination.staging`) and each is uploaded when complete.

Crash safety: a shard file appears only complete (its own atomic commit); the new version appears
only when the pointer is replaced, after its sidecar and manifest are complete. A process killed
at any moment leaves the previous version current, plus files no version names (shards not yet
committed, temporary files), which the next commit or gc removes once they are
older than the grace period (so that the shards of jobs still writing survive).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rowstore.codecs.blocks import compression_config
from rowstore.errors import (
    FormatError,
    MissingObjectError,
    RowValidationError,
    SchemaError,
    WriterClosedError,
)
from rowstore.format import manifest, spec
from rowstore.format.index import Layout
from rowstore.schema import Schema
from rowstore.storage import destination, location_of
from rowstore.storage.base import Staging
from rowstore.writer.commit import ShardInfo, _check_attrs, commit, commit_to
from rowstore.writer.file import DEFAULT_BLOCK_BYTES, DEFAULT_HEAP_CHUNK_BYTES, Closing, Writer
from rowstore.writer.gc import _shard_paths
from rowstore.writer.values import as_columns

__all__ = ["write_shard", "discard", "DatasetWriter", "DEFAULT_SHARD_BYTES"]

#: Default target size of one shard of a :class:`DatasetWriter` (raw bytes of rows and heap).
DEFAULT_SHARD_BYTES = 256 << 20

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"shard name {name!r} must be a plain file name: letters, digits, '_', '.', '-' "
            "(not starting with '.' or '-'), at most 200 characters, no directory"
        )
    return name


def _prepare_dir(root: str) -> str:
    """Create ``root`` and ``root/shards`` if missing; the shards directory."""
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(f"{root!r} is a file; a dataset is a directory")
    shards = os.path.join(root, manifest.SHARD_DIR)
    os.makedirs(shards, exist_ok=True)
    return shards


def write_shard(
    path: str | os.PathLike,
    schema: Schema,
    data: Mapping[str, Any] | Iterable[Mapping[str, Any]],
    *,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    rows_per_block: int | None = None,
    compression: Any = None,
    heap_chunk_bytes: int = DEFAULT_HEAP_CHUNK_BYTES,
    name: str | None = None,
    threads: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    batches: bool = False,
    verify_encoded: bool = False,
) -> ShardInfo:
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
    block_bytes, rows_per_block, compression, heap_chunk_bytes, threads, verify_encoded
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
    staging = destination(path, storage_options).staging()  # a URL: a local directory, uploaded
    try:
        info = _write_shard_file(
            staging.root,
            schema,
            data,
            block_bytes=block_bytes,
            rows_per_block=rows_per_block,
            compression=compression,
            heap_chunk_bytes=heap_chunk_bytes,
            name=name,
            threads=threads,
            batches=batches,
            verify_encoded=verify_encoded,
        )
        staging.publish(info.path)
    finally:
        staging.close()
    return info


def _write_shard_file(
    root: str,
    schema: Schema,
    data: Any,
    *,
    block_bytes: int,
    rows_per_block: int | None,
    compression: Any,
    heap_chunk_bytes: int,
    name: str | None,
    threads: int | None,
    batches: bool,
    verify_encoded: bool = False,
) -> ShardInfo:
    shards = _prepare_dir(root)
    fname = (f"part-{uuid.uuid4().hex}" if name is None else _check_name(name)) + ".h5"
    target = os.path.join(shards, fname)
    with Writer(
        target,
        schema,
        mode="x",
        block_bytes=block_bytes,
        rows_per_block=rows_per_block,
        compression=compression,
        heap_chunk_bytes=heap_chunk_bytes,
        threads=threads,
        verify_encoded=verify_encoded,
    ) as w:
        if batches:
            for columns in data:
                w.write_batch(columns)  # each item is a column mapping
        elif isinstance(data, Mapping) or hasattr(
            data, "columns"
        ):  # columns, or a DataFrame-like object
            w.write_batch(data)  # columns, or a DataFrame-like object
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


def _fetch_current(staging: Staging) -> bool:
    """Copy the destination's pointer and current manifest and sidecar into the staging
    directory (to append to it); False if there is no dataset there."""
    try:
        staging.fetch(manifest.POINTER, manifest.MAX_MANIFEST_BYTES)
    except MissingObjectError:
        return False
    name = manifest.pointer(staging.root).manifest
    for rel in (name, manifest.index_of(name)):
        staging.fetch(rel, manifest.MAX_MANIFEST_BYTES)
    return True


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
    block_bytes, rows_per_block, threads, verify_encoded, stats
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

    def __init__(
        self,
        path: str | os.PathLike,
        schema: Schema | None = None,
        *,
        mode: str = "w",
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        rows_per_block: int | None = None,
        compression: Any = None,
        heap_chunk_bytes: int | None = None,
        attrs: Mapping[str, Any] | None = None,
        threads: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        verify_encoded: bool = False,
        stats: bool = True,
    ):
        self._closed = True
        self.url: str | None = None  # a URL: shards written locally, each uploaded when complete
        self._writer: Writer | None = None
        self._infos: list[ShardInfo] = []
        self._created: list[
            str
        ] = []  # directories this writer made (removed again on abort if empty)
        if mode not in ("w", "x", "a"):
            raise ValueError(f"mode must be 'w', 'x' or 'a', got {mode!r}")
        if not isinstance(shard_bytes, int) or isinstance(shard_bytes, bool) or shard_bytes < 1:
            raise ValueError(f"shard_bytes must be a positive int, got {shard_bytes!r}")
        self.path = os.fspath(path)
        self._dest = destination(self.path, storage_options)
        self._staging: Staging = self._dest.staging()
        if not self._staging.in_place:  # shards made locally, each uploaded when complete
            self.url = self._dest.root
            self.path = self._staging.root
            exists = _fetch_current(self._staging) if mode in ("a", "x") else False
            if mode == "x" and exists:
                self._staging.close()
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
                raise SchemaError(
                    f"cannot append to {self.path!r}: its schema differs from the one given:\n"
                    f"{current.schema}\nvs\n{schema}"
                )
            if compression is not None and compression_config(compression) != current.compression:
                raise ValueError(
                    f"cannot append with compression {compression!r}: the dataset uses "
                    f"{current.compression}"
                )
            if heap_chunk_bytes is not None and heap_chunk_bytes != current.heap_chunk_bytes:
                raise ValueError(
                    f"cannot append with heap_chunk_bytes={heap_chunk_bytes}: the dataset uses "
                    f"{current.heap_chunk_bytes}"
                )
            schema, compression, heap_chunk_bytes = (
                current.schema,
                current.compression,
                current.heap_chunk_bytes,
            )
            rpbs = set(current.shards["rows_per_block"].tolist())
            if rows_per_block is None and len(rpbs) == 1:
                rows_per_block = rpbs.pop()
            self.attrs.update(current.attrs)
        if not isinstance(schema, Schema):
            raise SchemaError(
                f"DatasetWriter needs a Schema (got {type(schema).__name__}) unless appending to "
                "an existing dataset"
            )
        if attrs:
            self.attrs.update(_check_attrs(attrs))
        self.schema: Schema = schema
        self._options = dict(
            block_bytes=block_bytes,
            rows_per_block=rows_per_block,
            compression=compression,
            heap_chunk_bytes=DEFAULT_HEAP_CHUNK_BYTES
            if heap_chunk_bytes is None
            else heap_chunk_bytes,
            threads=threads,
            verify_encoded=verify_encoded,
            stats=stats,
        )
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
            # validates the options (the Writer's checks) now, not at the first row
            self._open_shard()
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
        columns = as_columns(
            columns, self.num_rows
        )  # a mapping, or a DataFrame-like object's columns
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
        if self._staging.in_place:
            return commit(self.path, self._infos, mode=self.mode, attrs=attrs)
        layouts = [Layout.open(self._staging.local(i.path)) for i in self._infos]
        version = commit_to(self._dest, self._infos, mode=self.mode, attrs=attrs, layouts=layouts)
        self._staging.close()
        return version

    def abort(self) -> None:
        """Discard everything written; ``path`` is left as it was (a URL: the uploaded shards are
        removed, the dataset's versions untouched)."""
        self._closed = True
        w, self._writer = self._writer, None
        if w is not None:
            w.abort()
        if not self._staging.in_place:
            for info in self._infos:
                try:
                    self._dest.remove(info.path)
                except (OSError, FormatError):
                    pass
            self._staging.close()
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
        return (
            f"DatasetWriter({self.path!r}, mode={self.mode!r}, rows={self.num_rows}, "
            f"shards={len(self._infos)})"
        )

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
        self._staging.publish(rel)  # complete: uploaded now for a URL (the commit names it later)
        self._infos.append(info)
        if self._options["rows_per_block"] is None:
            self._options["rows_per_block"] = info.rows_per_block  # later shards: the same blocks
        if (
            time.monotonic() - self._touched > 60
        ):  # keep the shards written so far young (see Notes)
            self._touched = time.monotonic()
            for i in self._infos:
                try:
                    os.utime(os.path.join(self.path, i.path))
                except FileNotFoundError:
                    pass

    def _estimate(self, columns: Mapping[str, Any]) -> float:
        """Raw bytes per row: measured on the rows written so far, else from the batch's first
        row."""
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
        if not self._infos:
            return False
        where = location_of(self._dest)
        try:
            if self._dest.token(manifest.POINTER) is None:
                return False
            current = manifest.read_pointer(where)[0]
            return bool(set(_shard_paths(where, current)) & {i.path for i in self._infos})
        except (OSError, FormatError):
            return True  # cannot tell: keep the files (gc removes them if they are orphans)
