"""What a reader works from: the validated block index of a dataset of one or more shard files.

A :class:`DatasetLayout` comes from a dataset directory (its manifest and block-index sidecar:
two small reads, no shard's HDF5 metadata is parsed), from one ``.h5`` file (its
:class:`~rowstore.format.index.Layout`: a file is a dataset of one shard), or from several of
those concatenated. Every number the kernels will trust is checked here, for all shards at once.

**Row ids.** Dataset rows are numbered ``0 .. num_rows - 1`` in shard order. Inside the reader,
a row is addressed by its *row id* ``block * rows_per_block + row_in_block``, where ``block``
counts the blocks of all shards in order and ``rows_per_block`` is the largest block of any
shard (shards may differ). Blocks that hold fewer rows (each shard's last block, the blocks of
shards with smaller blocks) leave ids unused, so ids are not dense: :meth:`ids` and
:meth:`rows_of` convert. For one file the two numberings are equal.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.errors import FormatError, MissingObjectError, RemoteError, RowstoreError, SchemaError
from rowstore.format import footer, spec
from rowstore.format import manifest as _manifest
from rowstore.format.index import (
    IndexSizes,
    Layout,
    check_indexes,
    scan_chunks,
    schema_row_dtype,
)
from rowstore.format.stats import merge_stats
from rowstore.schema import Schema
from rowstore.storage import Location, absolute, local_root, locate, under_all
from rowstore.storage.inputs import open_regular

__all__ = ["DatasetLayout"]


def _locate(path: Any, storage_options: Mapping[str, Any] | None) -> Location | list[Location]:
    if isinstance(path, (list, tuple)) and all(isinstance(p, Location) for p in path):
        return list(path)
    if isinstance(path, (list, tuple)):
        return locate(
            [os.fsdecode(p) if isinstance(p, bytes) else p for p in path], storage_options
        )
    return locate(os.fsdecode(path), storage_options)


@dataclass(frozen=True)
class DatasetLayout(IndexSizes):
    """The shards of a dataset and their concatenated, validated block index.

    Attributes are plain values and numpy arrays owned by the layout (do not modify). Per
    shard: ``shard_paths`` (absolute), ``shard_ids`` (what a descriptor opened later must
    match: ``(size,)`` from a manifest, :func:`~rowstore.storage.local.file_identity` for a file
    opened directly), ``shard_rows``, ``shard_rpb``. Per block (``num_blocks``, all shards):
    ``blocks`` (:data:`spec.BLOCK_DTYPE`, shard-local values as the shard stores them) and the
    columns of :meth:`arrays`. Per heap chunk: ``heap_chunks``.
    """

    path: str
    schema: Schema
    user_attrs: dict
    compression: dict
    heap_chunk_bytes: int
    row_dtype: np.dtype
    shard_paths: tuple[str, ...]
    shard_ids: tuple[tuple, ...]
    shard_rows: np.ndarray
    shard_rpb: np.ndarray
    shard_heap_nbytes: np.ndarray
    shard_file_size: np.ndarray
    blocks: np.ndarray
    heap_chunks: np.ndarray
    block_shard: np.ndarray  # int32, the shard of each block
    chunk_shard: np.ndarray  # int32, the shard of each heap chunk
    #: Manifest version read (None: opened from files).
    version: int | None = None
    #: Each shard's Layout when opened from files (None from a manifest: nothing was parsed).
    shard_layouts: tuple | None = None
    #: Where the dataset was opened (a :class:`~rowstore.storage.location.Location`: its
    #: shards are read through it); None: made from files or a manifest given, read where
    #: their paths say (see :meth:`shard_location`).
    location: Any = field(default=None, compare=False, repr=False)
    #: Statistics of the rows (stored form, :mod:`rowstore.format.stats`): the manifest's, or
    #: the merge of the files'; None when some part has none.
    stats: dict | None = field(default=None, compare=False, repr=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # -- sizes -----------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        return len(self.shard_paths)

    @property
    def num_rows(self) -> int:
        return int(self.shard_rows.sum())

    @property
    def rows_per_block(self) -> int:
        """The row-id stride: the largest block of any shard."""
        return int(self.shard_rpb.max()) if len(self.shard_rpb) else 1

    @property
    def uniform(self) -> bool:
        """Whether row ids are dense (== dataset row numbers): one shard, or every shard but the
        last holding only full blocks of the same size."""
        if "uniform" not in self._cache:
            rpb = self.rows_per_block
            full = self.blocks["num_rows"][:-1] == rpb if self.num_blocks else np.zeros(0, bool)
            self._cache["uniform"] = bool(full.all())
        return self._cache["uniform"]

    @property
    def uniform_blocks(self) -> bool:
        """Whether every shard has the same rows per block."""
        return bool((self.shard_rpb == self.shard_rpb[0]).all()) if len(self.shard_rpb) else True

    @property
    def block_raw_bytes(self) -> int:
        """Bytes of a block's slot in the reader's buffers (the largest block of any shard)."""
        return self.rows_per_block * self.row_dtype.itemsize

    @property
    def heap_nbytes(self) -> int:
        return int(self.shard_heap_nbytes.sum())

    @property
    def file_size(self) -> int:
        return int(self.shard_file_size.sum())

    def block_rows(self) -> np.ndarray:
        """Valid rows per block (int64)."""
        return self.arrays()["num_rows"]

    def arrays(self) -> dict[str, np.ndarray]:
        """Contiguous int64/uint64 index columns as the kernels take them (cached): per block
        ``offset, stored, checksum, heap_start, heap_end`` (shard-local), ``num_rows``,
        ``first`` (its first dataset row), ``raw`` (raw bytes of its chunk), ``chunk_base``
        (the index of its shard's first heap chunk among all heap chunks); per heap chunk
        ``hc_offset, hc_stored, hc_checksum``."""
        c = self._cache
        if "offset" not in c:
            b, h = self.blocks, self.heap_chunks
            i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
            num_rows = i64(b["num_rows"])
            shard_chunk0 = np.cumsum(
                np.bincount(self.chunk_shard, minlength=self.num_shards)
            ) - np.bincount(self.chunk_shard, minlength=self.num_shards)
            c.update(
                offset=i64(b["offset"]),
                stored=i64(b["stored_nbytes"]),
                checksum=np.ascontiguousarray(b["checksum"], dtype=np.uint64),
                heap_start=i64(b["heap_start"]),
                heap_end=i64(b["heap_end"]),
                num_rows=num_rows,
                first=np.cumsum(num_rows) - num_rows,
                raw=self.shard_rpb[self.block_shard] * self.row_dtype.itemsize,
                chunk_base=i64(shard_chunk0[self.block_shard])
                if self.num_shards
                else np.zeros(0, np.int64),
                hc_offset=i64(h["offset"]),
                hc_stored=i64(h["stored_nbytes"]),
                hc_checksum=np.ascontiguousarray(h["checksum"], dtype=np.uint64),
            )
        return c

    # -- row numbers <-> row ids -------------------------------------------------------------
    def ids(self, rows: np.ndarray) -> np.ndarray:
        """Row ids of dataset rows (int64, in range: checked by the caller)."""
        if self.uniform:
            return rows
        first = self.arrays()["first"]
        blk = np.searchsorted(first, rows, side="right") - 1
        return blk * self.rows_per_block + (rows - first[blk])

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Dataset rows of row ids."""
        if self.uniform:
            return ids
        blk = ids // self.rows_per_block
        return self.arrays()["first"][blk] + (ids - blk * self.rows_per_block)

    def where(self, row_id: int) -> tuple[str, int, int]:
        """``(shard path, block within the shard, dataset row)`` of a row id, for errors."""
        blk = int(row_id) // self.rows_per_block
        s = int(self.block_shard[blk]) if 0 <= blk < self.num_blocks else 0
        return (
            self.shard_paths[s],
            blk - self.shard_block0(s),
            int(self.rows_of(np.array([row_id]))[0]),
        )

    def shard_block0(self, s: int, what: str = "block") -> int:
        """The dataset-wide index of shard ``s``'s first block (or first heap chunk)."""
        key = "block0" if what == "block" else "chunk0"
        if key not in self._cache:
            counts = np.bincount(
                self.block_shard if what == "block" else self.chunk_shard, minlength=self.num_shards
            )
            self._cache[key] = np.cumsum(counts) - counts
        return int(self._cache[key][s]) if self.num_shards else 0

    def runs(self, which: np.ndarray, what: str) -> list[tuple[int, int, int]]:
        """Cut sorted blocks (``"block"``) or heap chunks ``which`` into runs of one shard:
        ``(shard, start, end)`` positions in ``which``."""
        owner = (self.block_shard if what == "block" else self.chunk_shard)[which]
        if self.num_shards == 1 or not len(owner):
            return [(int(owner[0]) if len(owner) else 0, 0, len(which))]
        cut = np.flatnonzero(owner[1:] != owner[:-1]) + 1
        starts = np.concatenate(([0], cut))
        ends = np.concatenate((cut, [len(which)]))
        return [(int(owner[a]), int(a), int(z)) for a, z in zip(starts, ends)]

    def shard_layout(self, s: int) -> Layout:
        """Shard ``s``'s own :class:`Layout`, opened from its file (for ``info``/``verify``)."""
        if self.shard_layouts is not None:
            return self.shard_layouts[s]
        return Layout.open(self.shard_paths[s])

    def shard_location(self) -> Location:
        """Where the shards are read: :attr:`location`, else the location of the first shard's
        path (a local file, or a URL without options)."""
        if self.location is not None:
            return self.location
        where = _locate(self.shard_paths[0] if self.shard_paths else self.path, None)
        return where[0] if isinstance(where, list) else where

    # -- checking ----------------------------------------------------------------------------
    def verify(self) -> None:
        """Read every block and heap chunk of every shard and check them; raises the first
        error :meth:`damage` finds."""
        for err in self.damage(limit=1):
            raise err

    def damage(
        self,
        *,
        limit: int | None = None,
        shard_indexes: bool = False,
        chunks: bool = True,
        location: Location | None = None,
    ) -> list[FormatError]:
        """Every damaged block and heap chunk of every shard (checksum, decompression, size),
        and every shard that is missing or of the wrong size, in shard order, as errors with
        ``path`` (the shard file), ``block`` (within it) and ``rows`` (the dataset rows whose
        values it holds). ``shard_indexes``: also parse each shard file's own index (libhdf5)
        and report a shard whose index disagrees with the manifest's. ``chunks=False``: read
        no chunk (only sizes and, with ``shard_indexes``, indexes). Stops after ``limit``.
        ``location``: where the shards are read from (the
        :class:`~rowstore.storage.location.Location` the dataset was opened from; default: its
        first shard's, without options); objects at URLs are read by ranged requests of at
        most 8 MiB. I/O failures other than a missing object are raised."""
        from rowstore.format.manifest import index_crc32

        found: list[FormatError] = []
        a = self.arrays()
        codec = self.frame_check()
        location = location or self.shard_location()
        for s in range(self.num_shards):
            path = self.shard_paths[s]
            try:
                # (a FIFO in a shard's place is reported, not waited on)
                f = location.at(path).open_file()
            except (OSError, FormatError) as exc:
                io_failure = not location.local and isinstance(exc, FormatError)
                if isinstance(exc, RemoteError) or (
                    io_failure and not isinstance(exc, MissingObjectError)
                ):
                    raise  # an I/O failure, not damage
                found.append(FormatError(f"{path!r}: shard {s} cannot be opened: {exc}", path=path))
                if limit is not None and len(found) >= limit:
                    return found
                continue
            try:
                if f.size != int(self.shard_file_size[s]):
                    found.append(
                        FormatError(
                            f"{path!r}: shard {s} has {f.size} bytes, expected "
                            f"{int(self.shard_file_size[s])}",
                            path=path,
                        )
                    )
                    continue
                if shard_indexes and self.shard_layouts is None:
                    err = self._check_shard_index(s, index_crc32, location)
                    if err is not None:
                        found.append(err)
                if not chunks:
                    continue
                b0, h0 = self.shard_block0(s), self.shard_block0(s, "heap chunk")
                nb, nh = int(np.sum(self.block_shard == s)), int(np.sum(self.chunk_shard == s))
                for what, lo, n, cols, raw in (
                    (
                        "block",
                        b0,
                        nb,
                        ("offset", "stored", "checksum"),
                        int(self.shard_rpb[s]) * self.row_dtype.itemsize,
                    ),
                    (
                        "heap chunk",
                        h0,
                        nh,
                        ("hc_offset", "hc_stored", "hc_checksum"),
                        self.heap_chunk_bytes,
                    ),
                ):
                    idx = [a[c][lo : lo + n] for c in cols]
                    for k, err in scan_chunks(f, *idx, raw_size=raw, codec=codec, what=what):
                        err.args = (f"{path!r}: {what} {k}: {err}",)
                        err.path, err.block = path, k if what == "block" else None
                        err.rows = self._rows_of(what, lo + k)
                        found.append(err)
                        if limit is not None and len(found) >= limit:
                            return found
            finally:
                f.close()
            if limit is not None and len(found) >= limit:
                return found
        return found

    def _check_shard_index(self, s: int, index_crc32, location: Location) -> FormatError | None:
        from rowstore.format._hdf5_check import shard_index  # libhdf5, if needed, in a child

        path = self.shard_paths[s]
        if location.local:  # a local file's HDF5 part is parsed by libhdf5 in a child process
            got: Any = shard_index(path)
        else:  # an object's, by h5py from an in-memory image of its metadata
            try:
                L = Layout.open(location.at(path))
            except FormatError as exc:
                return exc
            got = (index_crc32(L.blocks, L.heap_chunks), L.num_rows, L.schema.to_json_str())
        if isinstance(got, FormatError):
            return got
        crc, rows, schema = got
        b0, h0 = self.shard_block0(s), self.shard_block0(s, "heap chunk")
        nb, nh = int(np.sum(self.block_shard == s)), int(np.sum(self.chunk_shard == s))
        mine = index_crc32(self.blocks[b0 : b0 + nb], self.heap_chunks[h0 : h0 + nh])
        if rows != int(self.shard_rows[s]) or crc != mine:
            return FormatError(
                f"{path!r}: shard {s}'s own index disagrees with the dataset's manifest", path=path
            )
        try:
            same = Schema.from_json(schema) == self.schema if isinstance(schema, str) else False
        except (RowstoreError, ValueError):
            same = False
        if not same:
            return FormatError(
                f"{path!r}: shard {s}'s schema differs from the dataset's", path=path
            )
        return None

    def _rows_of(self, what: str, k: int) -> tuple[int, int]:
        """The dataset rows whose values block (or heap chunk) ``k`` holds."""
        a = self.arrays()
        if what == "block":
            return int(a["first"][k]), int(a["first"][k] + a["num_rows"][k])
        s = int(self.chunk_shard[k])
        H = self.heap_chunk_bytes
        local = k - self.shard_block0(s, what)
        lo, hi = local * H, (local + 1) * H
        mine = np.flatnonzero(
            (self.block_shard == s) & (a["heap_start"] < hi) & (a["heap_end"] > lo)
        )
        if not len(mine):
            return (0, 0)
        return int(a["first"][mine[0]]), int(a["first"][mine[-1]] + a["num_rows"][mine[-1]])

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike | Location | Sequence[str | os.PathLike],
        *,
        version: int | None = None,
        allow_outside_links: bool = False,
        allow_missing_footer: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> DatasetLayout:
        """The layout of a dataset (its current manifest, or ``version``), a ``.h5`` file, or a
        list of those read as one (same schema, compression and heap chunk size): paths, URLs
        (``storage_options`` as for :func:`rowstore.open`) or a
        :class:`~rowstore.storage.location.Location`. ``allow_outside_links``: see
        :meth:`from_manifest`; ``allow_missing_footer`` as for :meth:`Layout.open`.

        A dataset is read from its pointer, manifest and block-index sidecar (three small
        reads; no shard is opened); a file from its footer or HDF5 metadata
        (:meth:`Layout.open`). A URL that does not name a file (no ``.h5`` suffix) is tried as
        a dataset first: without a pointer there, as a file."""
        where = path if isinstance(path, Location) else _locate(path, storage_options)
        if isinstance(where, list):
            if not where:
                raise ValueError("no datasets given")
            if version is not None:
                raise ValueError("version= applies to one dataset, not a list")
            return cls.concat(
                [
                    cls.open(
                        w,
                        allow_outside_links=allow_outside_links,
                        allow_missing_footer=allow_missing_footer,
                    )
                    for w in where
                ]
            )
        is_dir = where.is_dir()  # None: an object store prefix, or an object
        if is_dir is not False:
            root = where if is_dir else where.at(where.path.rstrip("/"))
            try:
                m = _manifest.load(root, version)
            except MissingObjectError as exc:
                pointer = root.join(_manifest.POINTER)
                if is_dir and exc.path == pointer:
                    raise FormatError(
                        f"{root.path!r} is a directory but not a rowstore dataset (no "
                        f"{_manifest.POINTER}; an unfinished or uncommitted write leaves none)",
                        path=root.path,
                    ) from None
                if is_dir or version is not None or exc.path != pointer:
                    raise
            else:
                return cls.from_manifest(m, allow_outside_links=allow_outside_links, location=root)
        if version is not None:
            raise ValueError(f"{where.path!r} is a file: version= applies to datasets")
        layout = Layout.open(where, allow_missing_footer=allow_missing_footer)
        return cls.from_files([layout], path=where.path, location=where)

    @classmethod
    def from_files(
        cls,
        layouts: Sequence[Layout],
        *,
        path: str | None = None,
        location: Location | None = None,
    ) -> DatasetLayout:
        """A dataset of these files (already validated by :meth:`Layout.open`), in order;
        ``location``: where they were opened (default: their paths, without options)."""
        first = layouts[0]
        for L in layouts[1:]:
            _check_same(
                first.path,
                first.schema,
                first.compression,
                first.heap_chunk_bytes,
                L.path,
                L.schema,
                L.compression,
                L.heap_chunk_bytes,
            )
        i64 = lambda vals: np.array(vals, np.int64).reshape(-1)  # noqa: E731
        return cls(
            path=path or " + ".join(L.path for L in layouts),
            schema=first.schema,
            user_attrs=first.user_attrs,
            compression=first.compression,
            heap_chunk_bytes=first.heap_chunk_bytes,
            row_dtype=first.row_dtype,
            shard_paths=tuple(absolute(L.path) for L in layouts),
            shard_ids=tuple(L.file_id for L in layouts),
            shard_rows=i64([L.num_rows for L in layouts]),
            shard_rpb=i64([L.rows_per_block for L in layouts]),
            shard_heap_nbytes=i64([L.heap_nbytes for L in layouts]),
            shard_file_size=i64([L.file_size for L in layouts]),
            blocks=np.concatenate([L.blocks for L in layouts]),
            heap_chunks=np.concatenate([L.heap_chunks for L in layouts]),
            block_shard=np.repeat(
                np.arange(len(layouts), dtype=np.int32), [L.num_blocks for L in layouts]
            ),
            chunk_shard=np.repeat(
                np.arange(len(layouts), dtype=np.int32), [len(L.heap_chunks) for L in layouts]
            ),
            shard_layouts=tuple(layouts),
            location=location,
            stats=merge_stats([L.stats for L in layouts]),
        )

    @classmethod
    def from_manifest(
        cls,
        m: _manifest.Manifest,
        *,
        allow_outside_links: bool = False,
        location: Location | None = None,
    ) -> DatasetLayout:
        """A dataset from its manifest: every shard's index checked here, vectorized (no shard
        file is opened; each is checked against its recorded size when first read).

        A local dataset's manifest, sidecar and shard paths must resolve (symlinks followed)
        inside its directory: one that leads out of it raises :class:`FormatError`, unless
        ``allow_outside_links`` (a dataset is data that may come from elsewhere; a link out of
        it could make a reader return any file's bytes); so must a ``file://`` URL's. Other
        URLs' paths are plain relative keys under their prefix (checked by the manifest), so
        they stay inside it."""
        sh = m.shards
        local = local_root(m.root)
        if not allow_outside_links and local is not None:
            name = m.name or _manifest.manifest_path(m.version)  # unique names on some stores
            own = [name, _manifest.index_of(name)]
            _manifest.check_inside(local, own, what="manifest file")
            _manifest.check_inside(local, sh["path"], what="shard path")
        paths = under_all(absolute(m.root), sh["path"])  # plain relative paths (checked)

        def bad(s: int, msg: str) -> FormatError:
            where = paths[s] if paths else m.root
            return FormatError(
                f"{where!r} (shard {s} of dataset {m.root!r}, version {m.version}): {msg}",
                path=where,
            )

        row_dtype = schema_row_dtype(
            m.schema,
            lambda msg: FormatError(f"{m.root!r} (version {m.version}): {msg}", path=m.root),
        )
        rs = row_dtype.itemsize

        rpb = sh["rows_per_block"]
        H = m.heap_chunk_bytes
        big = np.flatnonzero(rpb * rs > spec.MAX_CHUNK_BYTES)
        if len(big):
            raise bad(
                int(big[0]),
                f"a block of {int(rpb[big[0]])} rows of {rs} bytes exceeds the format's limit of "
                f"{spec.MAX_CHUNK_BYTES} bytes per block",
            )
        if H > spec.MAX_CHUNK_BYTES:
            raise FormatError(
                f"{m.root!r}: heap_chunk_bytes {H} exceeds the format's limit of "
                f"{spec.MAX_CHUNK_BYTES}",
                path=m.root,
            )
        if (sh["heap_nbytes"] > spec.MAX_HEAP_BYTES).any():
            raise bad(
                int(np.argmax(sh["heap_nbytes"] > spec.MAX_HEAP_BYTES)),
                "heap_nbytes exceeds the format's limit",
            )
        if all(f.inline for f in m.schema) and (sh["heap_nbytes"] != 0).any():
            raise bad(
                int(np.argmax(sh["heap_nbytes"] != 0)),
                "heap_nbytes is not 0 for a schema without heap fields",
            )
        check_indexes(
            bad,
            blocks=m.blocks,
            heap_chunks=m.heap_chunks,
            rows=sh["rows"],
            rows_per_block=rpb,
            heap_nbytes=sh["heap_nbytes"],
            file_size=sh["file_size"],
            block_counts=sh["blocks"],
            heap_chunk_counts=sh["heap_chunks"],
            heap_chunk_bytes=H,
            row_size=rs,
            compressed=m.compression["id"] != "none",
        )
        S = m.num_shards
        return cls(
            path=m.root,
            schema=m.schema,
            user_attrs=m.attrs,
            compression=m.compression,
            heap_chunk_bytes=H,
            row_dtype=row_dtype,
            shard_paths=tuple(paths),
            shard_ids=tuple((int(n),) for n in sh["file_size"]),
            shard_rows=sh["rows"],
            shard_rpb=rpb,
            shard_heap_nbytes=sh["heap_nbytes"],
            shard_file_size=sh["file_size"],
            blocks=m.blocks,
            heap_chunks=m.heap_chunks,
            block_shard=np.repeat(np.arange(S, dtype=np.int32), sh["blocks"]),
            chunk_shard=np.repeat(np.arange(S, dtype=np.int32), sh["heap_chunks"]),
            version=m.version,
            location=location,
            stats=m.stats,
        )

    @classmethod
    def concat(cls, parts: Sequence[DatasetLayout]) -> DatasetLayout:
        """Datasets read one after the other as one (same schema, compression, heap chunk size)."""
        if len(parts) == 1:
            return parts[0]
        a = parts[0]
        for b in parts[1:]:
            _check_same(
                a.path,
                a.schema,
                a.compression,
                a.heap_chunk_bytes,
                b.path,
                b.schema,
                b.compression,
                b.heap_chunk_bytes,
            )
        shard0 = np.cumsum([p.num_shards for p in parts]) - np.array([p.num_shards for p in parts])
        cat = np.concatenate
        layouts = [p.shard_layouts for p in parts]
        return cls(
            path=" + ".join(p.path for p in parts),
            schema=a.schema,
            user_attrs=a.user_attrs,
            compression=a.compression,
            heap_chunk_bytes=a.heap_chunk_bytes,
            row_dtype=a.row_dtype,
            shard_paths=sum((p.shard_paths for p in parts), ()),
            shard_ids=sum((p.shard_ids for p in parts), ()),
            shard_rows=cat([p.shard_rows for p in parts]),
            shard_rpb=cat([p.shard_rpb for p in parts]),
            shard_heap_nbytes=cat([p.shard_heap_nbytes for p in parts]),
            shard_file_size=cat([p.shard_file_size for p in parts]),
            blocks=cat([p.blocks for p in parts]),
            heap_chunks=cat([p.heap_chunks for p in parts]),
            block_shard=cat([p.block_shard + k for p, k in zip(parts, shard0)]).astype(np.int32),
            chunk_shard=cat([p.chunk_shard + k for p, k in zip(parts, shard0)]).astype(np.int32),
            shard_layouts=sum((x for x in layouts if x is not None), ())
            if all(x is not None for x in layouts)
            else None,
            location=a.location,
            stats=merge_stats([p.stats for p in parts]),
        )

    def page_index(self) -> PageIndex | None:
        """The page index of the whole dataset (cached), or None unless every shard is a v3
        file with the same page size. A dataset opened from its manifest (whose sidecar holds
        chunk checksums only) reads each shard's footer for it, once, and uses it only where
        the footer's chunk index is the manifest's, checksum for checksum."""
        c = self._cache
        if "pages" not in c:
            parts: Sequence[ShardPages | None] | None = None
            if self.shard_layouts is not None:
                parts = [ShardPages.of_layout(x) for x in self.shard_layouts]
            else:
                parts = self._footer_pages()
            have = [x for x in parts or () if x is not None]
            c["pages"] = (
                PageIndex.of(self, have) if have and len(have) == len(parts or ()) else None
            )
        return c["pages"]

    def _footer_pages(self) -> tuple[ShardPages, ...] | None:
        """Each local shard's page CRC-32s from its own footer, if every shard has them and
        the footer's chunk index is the manifest's (else None: a reader then checks whole
        chunks, as without pages).

        Only what the pages need is read from a footer (its page size and its indexes, sized
        by the manifest's geometry): the manifest's index, already checked, is the one the
        reader trusts, and a footer whose index differs in any checksum, offset or size (a
        shard replaced by another file of the same size) is not used."""
        out = []
        nb = np.bincount(self.block_shard, minlength=self.num_shards)
        nh = np.bincount(self.chunk_shard, minlength=self.num_shards)
        b0, h0 = np.cumsum(nb) - nb, np.cumsum(nh) - nh
        rs = self.row_dtype.itemsize
        footers = None
        loc = self.location
        if isinstance(loc, Location) and not loc.local:
            # Shards in object storage: their footers fetched by ranged reads (in parallel),
            # so that remote reads check pages as local ones do.
            footers = self._remote_footers(loc)
            if footers is None:
                return None
        for s, path in enumerate(self.shard_paths):
            try:
                if footers is not None:
                    ft = footers[s]
                else:
                    fd, st = open_regular(path)
                    try:
                        if st.st_size != int(self.shard_file_size[s]):
                            return None
                        ft = footer.read_local(fd, st.st_size, path)
                    finally:
                        os.close(fd)
            except (OSError, RowstoreError):
                return None
            if ft is None:
                return None
            P = ft.header.get(spec.ATTR_PAGE_BYTES)
            if not isinstance(P, int) or isinstance(P, bool) or not 1 <= P <= spec.MAX_PAGE_BYTES:
                return None
            raw = int(self.shard_rpb[s]) * rs
            ppb = spec.page_geometry(P, raw, rs)[1]
            pph = spec.page_geometry(P, self.heap_chunk_bytes)[1]
            try:  # a footer that disagrees with the manifest is not used (a FormatError)
                blocks, heap, got = ft.indexes(
                    int(nb[s]), int(nh[s]), FormatError, (int(nb[s]) * ppb, int(nh[s]) * pph)
                )
            except FormatError:
                return None
            mine = self.blocks[b0[s] : b0[s] + nb[s]]
            theirs = self.heap_chunks[h0[s] : h0[s] + nh[s]]
            for a, b, cols in (
                (mine, blocks, _BLOCK_COLS),
                (theirs, heap, ("offset", "stored_nbytes", "checksum")),
            ):
                if any(not np.array_equal(a[k], b[k]) for k in cols):
                    return None
            if got is None:
                return None
            out.append(ShardPages(P, raw, rs, int(nb[s]), self.heap_chunk_bytes, int(nh[s]), *got))
        return tuple(out)

    def _remote_footers(self, loc: Location) -> list[Any] | None:
        """Each shard's footer (None: a shard without one) fetched from ``loc`` by ranged
        reads of the sizes the manifest records, 16 shards at a time; None on any failure."""
        from concurrent.futures import ThreadPoolExecutor

        def one(s: int) -> Any:
            path, size = self.shard_paths[s], int(self.shard_file_size[s])
            tail = loc.get(path, max(0, size - (64 << 10)), size)  # (a larger footer: one more)
            return footer.read(lambda a, b: loc.get(path, a, b), size, path, first=tail)

        try:
            with ThreadPoolExecutor(min(16, max(1, self.num_shards))) as pool:
                return list(pool.map(one, range(self.num_shards)))
        except (OSError, RowstoreError):
            return None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _check_same(
    pa: str, sa: Schema, ca: dict, ha: int, pb: str, sb: Schema, cb: dict, hb: int
) -> None:
    if sa != sb:
        raise SchemaError(
            f"{pb!r} cannot be read with {pa!r} as one dataset: their schemas "
            f"differ:\n{sa}\nvs\n{sb}"
        )
    if ca != cb:
        raise FormatError(
            f"{pb!r} cannot be read with {pa!r} as one dataset: compression {cb} differs from {ca}",
            path=pb,
        )
    if ha != hb:
        raise FormatError(
            f"{pb!r} cannot be read with {pa!r} as one dataset: heap_chunk_bytes {hb} differs from "
            f"{ha}",
            path=pb,
        )


#: The block index columns a shard's footer must share with the manifest for its pages to be used.
_BLOCK_COLS = ("offset", "stored_nbytes", "checksum", "num_rows", "heap_start", "heap_end")


@dataclass(frozen=True)
class ShardPages:
    """One shard's page CRC-32s (format v3) and the chunk geometry they describe."""

    page_bytes: int
    block_raw_bytes: int
    row_size: int
    num_blocks: int
    heap_chunk_bytes: int
    num_heap_chunks: int
    block_pages: np.ndarray  # uint32
    heap_pages: np.ndarray  # uint32

    @classmethod
    def of_layout(cls, x: Layout) -> ShardPages | None:
        """A file's pages (None: it has none)."""
        if not x.page_bytes or x.block_pages is None or x.heap_pages is None:
            return None
        return cls(
            x.page_bytes,
            x.block_raw_bytes,
            x.row_dtype.itemsize,
            x.num_blocks,
            x.heap_chunk_bytes,
            len(x.heap_chunks),
            x.block_pages,
            x.heap_pages,
        )


@dataclass(frozen=True)
class PageIndex:
    """The page CRC-32s of a dataset's chunks' raw bytes (format v3), dataset-wide.

    A block's pages are ``rows_per_page`` whole rows each (its last one the rest of its chunk):
    row ``j`` of block ``k`` lies in page ``block_page0[k] + j // rows_per_page`` of
    ``block_pages``, whose stored size is ``block_page_size``. A heap chunk's pages are
    ``page_bytes`` each (the last one the rest): byte ``x`` of heap chunk ``c`` lies in page
    ``c * heap_pages_per_chunk + x // page_bytes`` of ``heap_pages`` (the kernels derive a heap
    page's size from the chunk size: heaps hold most pages, no size array is kept for them).
    """

    page_bytes: int
    rows_per_page: int
    block_page0: np.ndarray  # int64, per block
    block_pages: np.ndarray  # uint32 CRC-32 per block page
    block_page_size: np.ndarray  # int64 bytes per block page
    heap_pages_per_chunk: int
    heap_pages: np.ndarray  # uint32 CRC-32 per heap page

    @classmethod
    def of(cls, L: DatasetLayout, parts: Sequence[ShardPages]) -> PageIndex | None:
        """The page index of ``L`` from its shards' pages (None unless they share a page size)."""
        P = parts[0].page_bytes
        if any(x.page_bytes != P for x in parts):
            return None
        rs = L.row_dtype.itemsize
        sizes, pers = [], []
        for x in parts:
            plen, per = spec.page_geometry(P, x.block_raw_bytes, x.row_size)
            one = np.full(per, plen, np.int64)
            one[-1] = x.block_raw_bytes - (per - 1) * plen
            sizes.append(np.tile(one, x.num_blocks))
            pers.append(per)
        per_block = np.repeat(pers, [x.num_blocks for x in parts])
        page0 = np.cumsum(per_block) - per_block
        i64 = lambda a: np.ascontiguousarray(np.concatenate(a) if a else np.zeros(0), np.int64)  # noqa: E731
        u32 = lambda a: np.ascontiguousarray(np.concatenate(a) if a else np.zeros(0), np.uint32)  # noqa: E731
        return cls(
            P,
            max(1, P // rs),
            np.ascontiguousarray(page0, np.int64),
            u32([x.block_pages for x in parts]),
            i64(sizes),
            spec.page_geometry(P, parts[0].heap_chunk_bytes)[1],
            u32([x.heap_pages for x in parts]),
        )
