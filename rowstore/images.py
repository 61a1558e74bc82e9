"""A folder of image files to a dataset in one call: :func:`from_images`.

The files' PNG/JPEG bytes are stored as they are (the writer checks each header against the
field; nothing is decoded or encoded), so the work is reading files: it runs in ``workers``
processes, each writing its own shards of consecutive files (:func:`rowstore.write_shard`),
and one :func:`rowstore.commit` publishes them in file order.

Labels come from the folder names (torchvision's ``ImageFolder`` convention: ``src/<class>/...``,
classes sorted, label ``i`` the ``i``-th class, the names kept in the dataset's attributes), from
a CSV file of ``path,label`` rows, or nowhere.
"""

from __future__ import annotations

import csv
import errno
import io
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore.codecs.image import ImageHeader, image_header
from rowstore.errors import InputError, OutsideRootError, RowValidationError, SchemaError
from rowstore.format.spec import MAX_VALUE_BYTES
from rowstore.schema import Field, Schema
from rowstore.storage.inputs import contained, open_input, read_at, read_input, walk
from rowstore.writer.commit import commit
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES, discard, write_shard

__all__ = ["from_images", "IMAGE_EXTENSIONS"]

#: File name endings taken as images (case-insensitive).
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
#: Key of the dataset attributes this module adds.
META_KEY = "images"
#: Bytes read from each file to find its header (the whole file when the header goes on: a
#: JPEG's EXIF or ICC segments before its frame header).
_PROBE_BYTES = 4096
#: Files per ``write_batch`` in a worker.
_BATCH_FILES = 256
#: Fewest files a worker process is started for (fewer: written in this process).
_MIN_PART_FILES = 256
#: Files per worker process by default: a spawned worker costs about a second to start and
#: import, and writes ~5,000 files/s (bench/ingest_bench.py), so fewer files per worker than
#: this ran slower on two processes than on one.
_AUTO_FILES_PER_WORKER = 20_000
#: Largest label CSV read (it is read whole, before any image).
_MAX_CSV_BYTES = 1 << 30
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class _Part:
    """The files one worker writes as one shard: rows ``first .. first + len(files) - 1``."""

    first: int
    files: list[str]  # relative to the source directory
    labels: list[Any] | None


def _is_image(name: str, extensions: Sequence[str]) -> bool:
    return name.lower().endswith(tuple(e.lower() for e in extensions)) and not name.startswith(".")


def _walk(
    root: str, extensions: Sequence[str], *, under: str = "", allow_outside: bool = False
) -> list[str]:
    """Image files under ``root`` (or its subdirectory ``under``), relative to ``root``, in
    ``ImageFolder``'s order: by directory, then by name. Symlinks are followed while they stay
    inside ``root`` (one leading out of it is refused unless ``allow_outside``)."""
    return walk(
        root,
        lambda name: _is_image(name, extensions),
        under=under,
        what="image file or folder",
        follow_links=allow_outside,
    )


def _folder_labels(
    src: str, extensions: Sequence[str], allow_outside: bool
) -> tuple[list[str], list[int], list[str]]:
    """ImageFolder: ``(files, labels, classes)``; the classes are ``src``'s subdirectories,
    sorted, each holding image files at any depth (files directly in ``src`` are not taken)."""
    classes = sorted(e.name for e in os.scandir(src) if e.is_dir() and not e.name.startswith("."))
    files: list[str] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        found = _walk(src, extensions, under=c, allow_outside=allow_outside)
        files += found
        labels += [i] * len(found)
    if not classes:
        raise FileNotFoundError(
            f"{src!r} has no class folders (labels='folders' takes src/<class>/<image>; pass "
            "labels=None for unlabelled images, or a CSV file of path,label rows)"
        )
    return files, labels, classes


def _csv_text(table: str) -> str:
    """The text of a label CSV: UTF-8 (a leading byte order mark dropped), read whole within
    :data:`_MAX_CSV_BYTES`."""
    data = read_input(table, what="label CSV", max_bytes=_MAX_CSV_BYTES)
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = bom + exc.start
        line = data.count(b"\n", 0, at) + 1
        raise InputError(
            f"{table!r}, line {line}: byte {data[at]:#04x} (offset {at}) is not UTF-8; "
            "expected a UTF-8 CSV file (re-encode it, e.g. iconv -f latin1 -t utf-8)",
            path=table,
            line=line,
        ) from None


def _csv_labels(
    src: str, table: str, allow_outside: bool
) -> tuple[list[str], list[Any], list[str] | None]:
    """``(files, labels, classes)`` of a CSV file of ``path,label`` rows (an optional header
    row ``path,label``); integer labels are kept, other labels are class names (sorted, then
    numbered, as folders are). Paths stay inside ``src`` unless ``allow_outside``."""
    files, raw, lines = [], [], []
    reader = csv.reader(io.StringIO(_csv_text(table), newline=""))
    for k, row in enumerate(reader):
        line = reader.line_num
        if not row or (k == 0 and [c.strip().lower() for c in row[:2]] == ["path", "label"]):
            continue
        if len(row) != 2:
            raise InputError(
                f"{table!r}, line {line}: expected path,label, got {row!r}", path=table, line=line
            )
        path, label = row[0].strip(), row[1].strip()
        if allow_outside:
            full = path if os.path.isabs(path) else os.path.join(src, path)
        else:
            try:
                full = contained(src, path, what=f"{table!r}, line {line}: image path")
            except OutsideRootError as exc:
                exc.line = line
                raise
        if not os.path.exists(full):
            raise FileNotFoundError(errno.ENOENT, f"{table!r}, line {line}: no file", full)
        files.append(os.path.relpath(full, src))
        raw.append(label)
        lines.append(line)
    try:
        ints = [int(v) for v in raw]
    except ValueError:
        classes = sorted(set(raw))
        index = {c: i for i, c in enumerate(classes)}
        return files, [index[v] for v in raw], classes
    for v, line in zip(ints, lines):
        if not _INT64[0] <= v <= _INT64[1]:
            raise InputError(
                f"{table!r}, line {line}: label {v} does not fit the int64 label field "
                f"(expected {_INT64[0]} .. {_INT64[1]})",
                path=table,
                line=line,
            )
    return files, ints, None


def _probe(src: str, rel: str) -> tuple[ImageHeader | str, int]:
    """``(header or an error message, file size)`` of one file, from its first bytes. A file
    that is not a regular file, or larger than a value may be, is refused before it is read
    (:class:`InputError`)."""
    path = os.path.join(src, rel)
    fd, st = open_input(path, what="image file", max_bytes=MAX_VALUE_BYTES)
    try:
        head = read_at(fd, _PROBE_BYTES)
        hdr = image_header(head, complete=len(head) >= st.st_size)
        if hdr is None:
            hdr = image_header(read_at(fd, st.st_size), complete=True)
    except InputError:
        raise
    except ValueError as exc:
        return str(exc), 0
    finally:
        os.close(fd)
    assert hdr is not None  # complete=True never returns None
    return hdr, st.st_size


def _schema(
    headers: list[ImageHeader],
    files: list[str],
    shape: Sequence[int | None] | None,
    image_field: str,
    label_field: str | None,
    path_field: str | None,
    codec: Any,
) -> Schema:
    """The fields: the image field's codec, dtype and shape from the headers (dimensions fixed
    where all files agree, else variable)."""

    def first_other(pred) -> str:
        return next(files[i] for i, h in enumerate(headers) if pred(h))

    h0 = headers[0]
    for attr, what in (("format", "format"), ("bits", "bit depth"), ("channels", "channels")):
        values = {getattr(h, attr) for h in headers}
        if len(values) > 1:
            other = first_other(lambda h, a=attr: getattr(h, a) != getattr(h0, a))
            raise SchemaError(
                f"the images differ in {what} ({sorted(values)}: {files[0]!r} has "
                f"{getattr(h0, attr)}, {other!r} {getattr(headers[files.index(other)], attr)}); "
                "one field stores one format, bit depth and channel count: convert the odd ones",
                field=image_field,
            )
    if shape is None:
        hs = {h.height for h in headers}
        ws = {h.width for h in headers}
        dims: list[int | None] = [
            h0.height if len(hs) == 1 else None,
            h0.width if len(ws) == 1 else None,
        ]
        shape = tuple(dims) if h0.channels == 1 else (*dims, h0.channels)
    spec = codec if codec is not None else h0.format
    fields = [Field(image_field, h0.dtype, tuple(shape), codec=spec)]
    if fields[0].codec["id"] != h0.format:
        raise SchemaError(
            f"codec {spec!r}: the files are {h0.format.upper()} (stored as they are, so the "
            f"field's "
            f"codec is {h0.format!r})",
            field=image_field,
        )
    if label_field is not None:
        fields.append(Field(label_field, "int64", ()))
    if path_field is not None:
        fields.append(Field(path_field, "str", ()))
    return Schema(fields)


def _parts(sizes: np.ndarray, labels: list | None, files: list[str], n_parts: int) -> list[_Part]:
    """Consecutive files in ``n_parts`` parts of about equal bytes (each one file at least)."""
    ends = np.cumsum(sizes, dtype=np.float64)
    total = float(ends[-1]) if len(ends) else 0.0
    cuts = [0]
    for k in range(1, n_parts):
        cut = int(np.searchsorted(ends, total * k / n_parts, side="left")) + 1
        if cuts[-1] < cut < len(files):
            cuts.append(cut)
    cuts.append(len(files))
    return [
        _Part(a, files[a:b], None if labels is None else labels[a:b])
        for a, b in zip(cuts, cuts[1:])
    ]


def _batches(src: str, part: _Part, names: tuple[str, str | None, str | None]) -> Iterator[dict]:
    image, label, path = names
    for lo in range(0, len(part.files), _BATCH_FILES):
        rel = part.files[lo : lo + _BATCH_FILES]
        cells = []
        for r in rel:
            cells.append(
                read_input(os.path.join(src, r), what="image file", max_bytes=MAX_VALUE_BYTES)
            )
        batch: dict[str, Any] = {image: cells}
        if label is not None:
            assert part.labels is not None
            batch[label] = np.asarray(part.labels[lo : lo + _BATCH_FILES], np.int64)
        if path is not None:
            batch[path] = [r.replace(os.sep, "/") for r in rel]
        yield batch


def _write_part(
    src: str,
    dest: str,
    schema_json: dict,
    part: _Part,
    names: tuple[str, str | None, str | None],
    name: str,
    options: dict,
) -> Any:
    """One worker's shard (a module-level function: it runs in another process)."""
    schema = Schema.from_json(schema_json)
    try:
        return write_shard(
            dest, schema, _batches(src, part, names), name=name, batches=True, **options
        )
    except RowValidationError as exc:
        if exc.row is None:
            raise
        row = part.first + exc.row
        msg = str(exc).replace(f"row {exc.row}:", f"row {row}:", 1)
        raise RowValidationError(
            f"image file {part.files[exc.row]!r}: {msg}", field=exc.field, row=row
        ) from None


def from_images(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    labels: str | os.PathLike | None = "folders",
    image_field: str = "image",
    label_field: str = "label",
    path_field: str | None = "path",
    shape: Sequence[int | None] | None = None,
    codec: Any = None,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
    workers: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    mode: str = "w",
    attrs: Mapping[str, Any] | None = None,
    verify_encoded: bool = False,
    allow_outside: bool = False,
    **writer_kwargs: Any,
) -> Schema:
    """Write the image files under ``src`` as a dataset directory ``dest``, their PNG/JPEG bytes
    as they are, with labels.

    Parameters
    ----------
    src : str or os.PathLike
        The directory of image files (names ending in ``extensions``; hidden files and folders
        skipped).
    dest : str or os.PathLike
        The dataset directory to write (a new version, published at the end, in one commit).
    labels : "folders", a CSV path, or None
        ``"folders"``: ``src/<class>/**/<file>`` (``ImageFolder``): classes sorted, label ``i`` for
        the ``i``-th; the class names are ``attrs["images"]["classes"]``. A CSV file: rows
        ``path,label`` (paths relative to ``src``; an optional ``path,label`` header; rows in
        their order): integer labels as they are, other labels class names numbered in sorted
        order. None: every image file under ``src``, no label field.
    image_field, label_field, path_field : str
        Field names: the image, its ``int64`` label, its path relative to ``src`` (``str``;
        ``path_field=None`` leaves it out).
    shape : tuple, optional
        The image field's shape; default from the headers: ``(H, W, C)`` (``(H, W)`` for
        single-channel images), a dimension ``None`` where the files differ. Every file must
        have the same format, bit depth and channels.
    codec : str or dict, optional
        The image field's codec (its id must be the files' format: ``"png"`` or ``"jpeg"``; the
        config is what later arrays written to the dataset are encoded with).
    workers : int, optional
        Processes writing shards (default: one per 20,000 files, up to ``os.cpu_count()``: a
        worker process pays for its start-up only past that); ``1`` writes in this process.
        The files are split into at least ``workers`` runs of consecutive files of about equal
        bytes (more where a run would exceed ``shard_bytes``), one shard each.
    allow_outside : bool
        Read files outside ``src``: follow symlinks that lead out of it, and take CSV paths
        that are absolute or climb out with ``..``. By default such a link or path is refused
        (:class:`~rowstore.errors.OutsideRootError`, naming it); symlinks that stay inside
        ``src`` are always followed.
    shard_bytes, mode, attrs, verify_encoded, **writer_kwargs
        As for :class:`~rowstore.DatasetWriter` (``block_bytes``, ``rows_per_block``,
        ``compression``, ``heap_chunk_bytes``); ``mode`` as for :func:`rowstore.commit`.

    Returns
    -------
    Schema
        The schema written.

    Raises
    ------
    RowValidationError
        A file that is not a PNG/JPEG or does not fit the field (its header is read first, in
        this process, before anything is written), naming the file and its row.
    SchemaError
        Files of different formats, bit depths or channel counts.
    InputError
        A file that is not a regular file (a FIFO, socket or device named like an image:
        found without blocking) or is larger than a value may be (2 GiB, from its size before
        anything is read); a label CSV that is not UTF-8, has a row that is not ``path,label``
        or an integer label beyond ``int64``, naming the CSV file and line.
    OutsideRootError
        A symlink or CSV path leading outside ``src`` (without ``allow_outside``), naming it.

    Notes
    -----
    Rows follow the files' order (``ImageFolder``'s: class, then path). Nothing is published
    unless every shard is written; on an error the shards written are removed.
    """
    src, dest = os.fspath(src), os.fspath(dest)
    if not os.path.isdir(src):
        raise NotADirectoryError(f"{src!r} is not a directory of images")
    nworkers = 1 if workers is None else workers  # the default: once the files are listed
    if not isinstance(nworkers, int) or isinstance(nworkers, bool) or nworkers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    classes: list[str] | None = None
    lab: list | None
    if not isinstance(allow_outside, bool):
        raise TypeError(f"allow_outside must be a bool, got {allow_outside!r}")
    if labels is None:
        files, lab = _walk(src, extensions, allow_outside=allow_outside), None
    elif isinstance(labels, str) and labels == "folders":
        files, lab, classes = _folder_labels(src, extensions, allow_outside)
    else:
        files, lab, classes = _csv_labels(src, os.fspath(labels), allow_outside)
    if not files:
        raise FileNotFoundError(f"no image files ({', '.join(extensions)}) under {src!r}")
    if workers is None:
        nworkers = max(1, min(os.cpu_count() or 1, len(files) // _AUTO_FILES_PER_WORKER))
    step = 256
    # I/O: reads of each file's start
    with ThreadPoolExecutor(min(32, 4 * (os.cpu_count() or 1))) as pool:
        runs = pool.map(
            lambda a: [_probe(src, r) for r in files[a : a + step]], range(0, len(files), step)
        )
        probed = [p for run in runs for p in run]
    for i, (hdr, _) in enumerate(probed):
        if isinstance(hdr, str):
            raise RowValidationError(
                f"image file {files[i]!r}: row {i}: field {image_field!r}: {hdr}",
                field=image_field,
                row=i,
            )
    headers = [h for h, _ in probed if isinstance(h, ImageHeader)]  # all of them, by now
    label_name = label_field if lab is not None else None
    schema = _schema(headers, files, shape, image_field, label_name, path_field, codec)
    sizes = np.asarray([s for _, s in probed], np.int64)
    n_parts = min(nworkers, math.ceil(len(files) / _MIN_PART_FILES))
    n_parts = max(n_parts, math.ceil(float(sizes.sum()) / max(1, shard_bytes)))
    parts = _parts(sizes, lab, files, min(n_parts, len(files)))
    meta: dict[str, Any] = {"source": os.path.abspath(src), "files": len(files)}
    meta["labels"] = (
        None if labels is None else "folders" if labels == "folders" else os.fspath(labels)
    )
    if classes is not None:
        meta["classes"] = classes
    user = dict(attrs or {})
    user[META_KEY] = meta
    names = (image_field, label_name, path_field)
    options = dict(writer_kwargs, verify_encoded=verify_encoded)
    stamp = os.urandom(4).hex()
    jobs = [
        (src, dest, schema.to_json(), p, names, f"images-{stamp}-{k:05d}", options)
        for k, p in enumerate(parts)
    ]
    infos: list = []
    try:
        if nworkers == 1 or len(parts) == 1 or len(files) < 2 * _MIN_PART_FILES:
            for job in jobs:
                infos.append(_write_part(*job))
        else:
            import multiprocessing

            # spawn: blosc2's thread pool hangs forked children (docs/architecture.md)
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(min(nworkers, len(jobs)), mp_context=ctx) as ex:
                futures = [ex.submit(_write_part, *job) for job in jobs]
                try:
                    for f in futures:
                        infos.append(f.result())
                except BaseException:
                    for f in futures:
                        f.cancel()
                    for f in futures:  # shards of the parts that finished: removed below
                        if not f.cancelled() and f.exception() is None:
                            if f.result() not in infos:
                                infos.append(f.result())
                    raise
        commit(dest, infos, mode=mode, attrs=user)
    except BaseException:
        discard(dest, infos)
        raise
    return schema
