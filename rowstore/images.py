"""A folder of image files to a dataset in one call: :func:`from_images`.

The files' PNG/JPEG bytes are stored as they are (nothing is decoded or encoded again), so the
work is reading and checking files. First, in this process, every file's header is read (a
thread pool, the first 4 KiB of each): its real format (from its bytes, whatever its name),
size, channels and bit depth, from which the image field is decided (one codec; the channels
every image decodes to, ``channels=``); a file that does not fit is a bad file. Then
``workers`` processes each read their run of consecutive files whole, check each one's
structure (:mod:`rowstore.codecs.image_check`; a full decode with ``verify_encoded``) and write
the good ones as one shard (:func:`rowstore.write_shard`); one :func:`rowstore.commit`
publishes the shards in file order. A bad file stops the call (``on_error="raise"``, naming
the first) or is left out and reported (``"skip"``: in the returned :class:`ImageIngest` and
in the dataset's attributes).

Labels come from the folder names (torchvision's ``ImageFolder`` convention: ``src/<class>/...``,
classes sorted, label ``i`` the ``i``-th class, the names kept in the dataset's attributes), from
a CSV file of ``path,label`` rows, or nowhere.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from rowstore.codecs.image import ImageHeader, field_channels, image_header, verify_image
from rowstore.codecs.image_check import check_structure
from rowstore.errors import (
    CodecError,
    InputError,
    RowValidationError,
    SchemaError,
)
from rowstore.format.spec import MAX_VALUE_BYTES
from rowstore.global_shuffle._progress import Progress
from rowstore.schema import Field, Schema
from rowstore.storage.inputs import contained, open_input, read_at, read_input, read_text, walk
from rowstore.writer.commit import ShardInfo
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES, write_shard
from rowstore.writer.parts import Report, cut, n_parts, write_parts
from rowstore.writer.values import check_value

__all__ = ["from_images", "ImageIngest", "SkippedImage", "IMAGE_EXTENSIONS"]

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
_ON_ERROR = ("raise", "skip")
#: The structural check of every file's content (off only in bench/image_ingest_bench.py,
#: which measures what it costs, with ``workers=1``: in this process).
_CHECK_STRUCTURE = True
#: Fewest files whose ingest shows its progress by default (at a terminal)
_PROGRESS_FILES = 2000


@dataclass(frozen=True)
class _Part:
    """The files one worker writes as one shard: rows ``first .. first + len(files) - 1``."""

    first: int
    files: list[str]  # relative to the source directory
    labels: list[Any] | None
    sizes: list[int]  # of the files, from their headers' read


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


def _csv_labels(
    src: str, table: str, allow_outside: bool
) -> tuple[list[str], list[Any], list[str] | None]:
    """``(files, labels, classes)`` of a CSV file of ``path,label`` rows (an optional header
    row ``path,label``); integer labels are kept, other labels are class names (sorted, then
    numbered, as folders are). Paths stay inside ``src`` unless ``allow_outside``."""
    files, raw, lines = [], [], []
    text = read_text(
        table,
        what="label CSV",
        max_bytes=_MAX_CSV_BYTES,
        hint=" (re-encode it, e.g. iconv -f latin1 -t utf-8)",
    )
    reader = csv.reader(io.StringIO(text, newline=""))
    for k, row in enumerate(reader):
        line = reader.line_num
        if not row or (k == 0 and [c.strip().lower() for c in row[:2]] == ["path", "label"]):
            continue
        if len(row) != 2:
            raise InputError(
                f"{table!r}, line {line}: expected path,label, got {row!r}", path=table, line=line
            )
        path, label = row[0].strip(), row[1].strip()
        if allow_outside:  # an absolute path as it is
            full = os.path.join(src, path)
        else:
            full = contained(src, path, what=f"{table!r}, line {line}: image path", line=line)
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


@dataclass(frozen=True)
class SkippedImage:
    """A file :func:`from_images` did not store (``on_error="skip"``), and why."""

    path: str  # relative to the source directory, "/"-separated
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class ImageIngest:
    """What :func:`from_images` did: the schema written and the summary of the run.

    Attributes
    ----------
    dest : str
        The dataset directory written.
    schema : Schema
        The schema written.
    images : int
        Files stored (the rows written).
    classes : list of str or None
        The class names (``labels="folders"``, or a CSV of names), else None.
    skipped : tuple of SkippedImage
        The files not stored, in file order, each with its reason (``on_error="skip"``; also
        in the dataset's ``attrs["images"]["skipped"]``).
    payload_bytes : int
        Bytes of the files stored (as they are).
    stored_bytes : int
        Bytes of the shard files written.
    seconds : float
        Wall-clock time of the call.
    """

    dest: str
    schema: Schema
    images: int
    classes: list[str] | None
    skipped: tuple[SkippedImage, ...]
    payload_bytes: int
    stored_bytes: int
    seconds: float

    def summary(self) -> str:
        """Some lines for a person: what was stored, how fast, and every file skipped."""
        f = self.schema[self.schema.names[0]]
        rate = self.images / max(self.seconds, 1e-9)
        classes = "" if self.classes is None else f" in {len(self.classes):,} classes"
        lines = [
            f"{self.dest}: {self.images:,} images{classes} ({f.codec['id']}, {f.dtype} "
            f"{f.shape}), {_mib(self.payload_bytes)} of files in {_mib(self.stored_bytes)} of "
            f"shards, {self.seconds:.1f} s ({rate:,.0f} images/s); "
            f"{len(self.skipped):,} skipped"
        ]
        lines += [f"  skipped {s.path}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


class _Bad(Exception):
    """One file that cannot be stored: its index, and why (an exception to raise as it is
    with ``on_error="raise"``, or a reason)."""

    def __init__(self, index: int, reason: str, error: BaseException | None = None):
        super().__init__(reason)
        self.index, self.reason, self.error = index, reason, error


def _probe(src: str, rel: str) -> tuple[ImageHeader | str | BaseException, int]:
    """``(header, or why not, file size)`` of one file, from its first bytes. A file that is
    not a regular file, or is larger than a value may be, is refused before it is read (the
    :class:`InputError` is returned, as is the ``OSError`` of a file that cannot be opened)."""
    path = os.path.join(src, rel)
    try:
        fd, st = open_input(path, what="image file", max_bytes=MAX_VALUE_BYTES)
    except (InputError, OSError) as exc:
        return exc, 0
    try:
        if st.st_size == 0:
            return "an empty file (0 bytes)", 0
        head = read_at(fd, _PROBE_BYTES)
        hdr = image_header(head, complete=len(head) >= st.st_size)
        if hdr is None:
            hdr = image_header(read_at(fd, st.st_size), complete=True)
    except ValueError as exc:
        return str(exc), st.st_size
    except OSError as exc:
        return exc, 0
    finally:
        os.close(fd)
    assert hdr is not None  # complete=True never returns None
    return hdr, st.st_size


def _extension_format(rel: str) -> str | None:
    ext = os.path.splitext(rel)[1].lower()
    return {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg"}.get(ext)


def _codec_id(codec: Any) -> str | None:
    if codec is None:
        return None
    if isinstance(codec, str):
        return codec
    if isinstance(codec, Mapping):
        return str(codec.get("id"))
    return str(getattr(codec, "codec_id", codec))


def _majority(values: list, prefer: Any) -> Any:
    """The most common of ``values``; ``prefer`` (else the first seen) among equals."""
    counts = Counter(values)
    top = max(counts.values())
    if counts.get(prefer) == top:
        return prefer
    return next(v for v in values if counts[v] == top)


@dataclass(frozen=True)
class _Target:
    """What the image field stores, decided from the headers and the arguments."""

    format: str
    bits: int
    channels: int
    shape: tuple[int | None, ...] | None  # as given, or None: from the files


def _target(
    headers: dict[int, ImageHeader],
    shape: Sequence[int | None] | None,
    channels: int | None,
    codec: Any,
) -> tuple[_Target, str]:
    """The field's format, bit depth, channels and given shape, and why that format (for the
    messages of files of the other)."""
    hs = list(headers.values())
    fmt = _codec_id(codec)
    if fmt is not None:
        why = f"codec={fmt!r}"
    else:
        fmt = _majority([h.format for h in hs], hs[0].format)
        k = sum(h.format == fmt for h in hs)
        why = f"the format of {k:,} of the {len(hs):,} images"
    same = [h for h in hs if h.format == fmt] or hs
    bits = _majority([h.bits for h in same], 8)
    if shape is not None:
        shape = tuple(shape)
        if len(shape) not in (2, 3):
            raise ValueError(f"shape must be (H, W) or (H, W, C), got {shape!r}")
        given = 1 if len(shape) == 2 else shape[2]
        if channels is not None and channels != given:
            raise ValueError(f"shape {shape} has {given} channels, channels={channels}")
        channels = given
    if channels is None:
        kinds = {field_channels(h) for h in same}
        if len(kinds) == 1:  # one kind: kept (a CMYK JPEG's 4 components read as RGB)
            (channels,) = kinds
        else:  # colour if any image is (CMYK, palette, RGB, RGBA), else grey
            channels = 3 if max(kinds) >= 3 else 1
    if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
        raise ValueError(f"channels must be a positive int, got {channels!r}")
    return _Target(fmt, bits, channels, shape), why


def _misfit(rel: str, h: ImageHeader, t: _Target, why: str, field: str) -> str | None:
    """Why the file of header ``h`` does not go in the field ``t``, or None."""
    if h.format != t.format:
        named = ""
        if _extension_format(rel) not in (None, h.format):
            named = f" named {os.path.splitext(rel)[1]!r}"
        return (
            f"{h.format.upper()} bytes{named}; field {field!r} stores {t.format.upper()} "
            f"({why}), one codec per field"
        )
    if h.bits != t.bits:
        return (
            f"a {h.bits}-bit {h.format.upper()}; field {field!r} holds {t.bits}-bit samples "
            f"(uint{8 if t.bits == 8 else 16}) and no stated rule converts one to the other: "
            f"convert the file, or write the {h.bits}-bit images as a dataset of their own"
        )
    if t.shape is not None:
        for d, got, what in ((t.shape[0], h.height, "height"), (t.shape[1], h.width, "width")):
            if d is not None and d != got:
                return (
                    f"an image of {h.height}x{h.width}; field {field!r} has shape {t.shape} "
                    f"({what} {d})"
                )
    return None


def _schema(
    headers: list[ImageHeader],
    target: _Target,
    image_field: str,
    label_field: str | None,
    path_field: str | None,
    codec: Any,
) -> Schema:
    """The fields: the image field's codec, dtype and shape (dimensions fixed where all files
    agree, else variable, unless ``shape`` was given)."""
    shape = target.shape
    if shape is None:  # fixed where the files agree (no files: any size)
        hs = {h.height for h in headers}
        ws = {h.width for h in headers}
        dims: list[int | None] = [
            headers[0].height if len(hs) == 1 else None,
            headers[0].width if len(ws) == 1 else None,
        ]
        shape = tuple(dims) if target.channels == 1 else (*dims, target.channels)
    spec = codec if codec is not None else target.format
    dtype = "uint16" if target.bits == 16 else "uint8"
    fields = [Field(image_field, dtype, tuple(shape), codec=spec)]
    if label_field is not None:
        fields.append(Field(label_field, "int64", ()))
    if path_field is not None:
        fields.append(Field(path_field, "str", ()))
    return Schema(fields)


def _content_problem(data: bytes, fmt: str, verify: bool) -> str | None:
    """Why the whole file ``data`` (found to be ``fmt`` by its header) is not stored: damaged
    (:func:`check_structure`, and :func:`verify_image`'s full decode when ``verify``), or
    None."""
    try:
        got = check_structure(data) if _CHECK_STRUCTURE else fmt
        if got != fmt:  # it changed since its header was read
            return f"{got.upper()} bytes, where its header said {fmt.upper()}"
        if verify:
            verify_image(data)
    except CodecError as exc:
        return str(exc)
    return None


def _read_checked(
    src: str, rel: str, fmt: str, verify: bool, field: Field | None = None
) -> bytes | str | BaseException:
    """The bytes of one file, or why they are not stored (a reason, or the open's error).
    ``field``: also what the writer checks of a value for it (the codec's rules: which
    channels convert to which), so that a file it would refuse is found here."""
    try:
        data = read_input(os.path.join(src, rel), what="image file", max_bytes=MAX_VALUE_BYTES)
    except (InputError, OSError) as exc:
        return exc
    if _CHECK_STRUCTURE or verify:
        problem = _content_problem(data, fmt, verify)
        if problem is not None:
            return problem
    if field is not None:
        try:
            check_value(field, data, 0)
        except RowValidationError as exc:
            return str(exc).removeprefix("row 0: ")
    return data


@dataclass
class _PartResult:
    """What one part's worker did, besides its shard (the extra of
    :func:`~rowstore.writer.parts.write_parts`)."""

    skipped: list[tuple[int, str]]  # (index in the part, reason)
    images: int
    payload_bytes: int
    kept: list[int]  # index in the part of each row written
    stored_bytes: int = 0  # of its shard (0: no rows, the shard is removed)


def _batches(
    src: str,
    part: _Part,
    names: tuple[str, str | None, str | None],
    check: tuple[str, bool, bool],
    out: _PartResult,
    report: Report,
    writer_check: Field | None = None,
) -> Iterator[dict]:
    """The part's files as ``write_batch`` columns, each file checked first (``check``: the
    format, a full decode or not, skip the bad ones or raise); what was skipped and stored is
    counted in ``out``; ``writer_check``: the field whose writer checks each file also meets
    (when skipping). A thread reads and checks the next batch's files while the writer
    stores this one (reads, CRCs, the numpy scans and decodes release the GIL)."""
    image, label, path = names
    field, fmt, verify, skip = image, *check
    starts = range(0, len(part.files), _BATCH_FILES)

    def load(lo: int) -> list[bytes | str | BaseException]:
        rels = part.files[lo : lo + _BATCH_FILES]
        return [_read_checked(src, r, fmt, verify, writer_check) for r in rels]

    with ThreadPoolExecutor(1) as ahead:
        pending = ahead.submit(load, 0) if starts else None
        for j, lo in enumerate(starts):
            assert pending is not None
            loaded = pending.result()
            pending = ahead.submit(load, starts[j + 1]) if j + 1 < len(starts) else None
            rels = part.files[lo : lo + _BATCH_FILES]
            cells, keep, nbytes = [], [], 0
            for k, (rel, got) in enumerate(zip(rels, loaded), lo):
                if isinstance(got, bytes):
                    cells.append(got)
                    keep.append(k)
                    nbytes += len(got)
                    continue
                if skip:
                    out.skipped.append((k, str(got)))
                    continue
                if isinstance(got, BaseException):
                    raise got
                row = part.first + k
                raise RowValidationError(
                    f"image file {rel!r}: row {row}: field {field!r}: {got}", field=field, row=row
                )
            report(len(rels), sum(part.sizes[lo : lo + _BATCH_FILES]))
            if not cells:
                continue
            out.images += len(cells)
            out.payload_bytes += nbytes
            out.kept += keep
            batch: dict[str, Any] = {image: cells}
            if label is not None:
                assert part.labels is not None
                batch[label] = np.asarray([part.labels[k] for k in keep], np.int64)
            if path is not None:
                batch[path] = [part.files[k].replace(os.sep, "/") for k in keep]
            yield batch


def _write_part(
    src: str,
    dest: str,
    schema_json: dict,
    part: _Part,
    names: tuple[str, str | None, str | None],
    check: tuple[str, bool, bool],
    name: str,
    options: dict,
    *,
    report: Report,
) -> tuple[ShardInfo, _PartResult]:
    """One worker's shard (a module-level function: it runs in another process) and what it
    did; ``report(files, bytes)`` as the files are read."""
    schema = Schema.from_json(schema_json)
    out = _PartResult([], 0, 0, [])
    writer_check = schema[names[0]] if check[2] else None  # skipping: what it would refuse
    try:
        info = write_shard(
            dest,
            schema,
            _batches(src, part, names, check, out, report, writer_check),
            name=name,
            batches=True,
            **options,
        )
    except RowValidationError as exc:
        if exc.row is None or exc.args[0].startswith("image file ") or exc.row >= len(out.kept):
            raise
        k = out.kept[exc.row]  # a row the writer refused: the file it came from
        row = part.first + k
        msg = str(exc).replace(f"row {exc.row}:", f"row {row}:", 1)
        raise RowValidationError(
            f"image file {part.files[k]!r}: {msg}", field=exc.field, row=row
        ) from None
    out.stored_bytes = info.file_size if info.rows else 0
    return info, out


def _first_damaged(
    src: str, files: list[str], fmt: str, verify: bool, field: Field, pool: ThreadPoolExecutor
) -> tuple[int, str | BaseException] | None:
    """The first of ``files`` whose content is not stored (read and checked on ``pool``, in
    order, stopping at the first; ``field``: what the writer checks too), or None."""
    step = 64
    runs = [range(a, min(a + step, len(files))) for a in range(0, len(files), step)]

    def run(r: range) -> tuple[int, str | BaseException] | None:
        for i in r:
            got = _read_checked(src, files[i], fmt, verify, field)
            if not isinstance(got, bytes):
                return i, got
        return None

    futures = [pool.submit(run, r) for r in runs]
    try:
        for f in futures:
            hit = f.result()
            if hit is not None:
                return hit
    finally:
        for f in futures:
            f.cancel()
    return None


def _raise_bad(bad: _Bad, files: list[str], field: str) -> NoReturn:
    if bad.error is not None:
        raise bad.error
    i = bad.index
    raise RowValidationError(
        f"image file {files[i]!r}: row {i}: field {field!r}: {bad.reason}", field=field, row=i
    )


def from_images(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    labels: str | os.PathLike | None = "folders",
    image_field: str = "image",
    label_field: str = "label",
    path_field: str | None = "path",
    shape: Sequence[int | None] | None = None,
    channels: int | None = None,
    codec: Any = None,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
    workers: int | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    mode: str = "w",
    attrs: Mapping[str, Any] | None = None,
    verify_encoded: bool = False,
    on_error: str = "raise",
    progress: bool | None = None,
    allow_outside: bool = False,
    **writer_kwargs: Any,
) -> ImageIngest:
    """Write the image files under ``src`` as a dataset directory ``dest``, their PNG/JPEG bytes
    as they are, with labels; every file checked first.

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
        The image field's shape, ``(H, W)`` (one channel) or ``(H, W, C)``, ``None`` for a
        dimension that varies; a file whose size differs from a fixed dimension is a bad file.
        Default: from the headers, a dimension ``None`` where the files differ, and the
        channels below.
    channels : int, optional
        The channels the field decodes every image to, whatever the file holds (a grey JPEG
        read as RGB, a CMYK JPEG or a palette PNG as RGB, alpha dropped or added, as PIL's
        ``convert`` does). Default: the files' own when they all have the same (a CMYK JPEG's
        four components count as RGB), else 3 when any image is in colour and 1 when all are
        grey. Each file's bytes are stored as they are.
    codec : str or dict, optional
        The image field's codec, ``"png"`` or ``"jpeg"`` (a dict: with its config, what later
        arrays written to the dataset are encoded with). Default: the format most files have.
        A file of the other format, whatever its name (PNG bytes named ``.jpg``), is a bad
        file: a field has one codec, and no file is re-encoded.
    workers : int, optional
        Processes writing shards (default: one per 20,000 files, up to ``os.cpu_count()``: a
        worker process pays for its start-up only past that); ``1`` writes in this process.
        The files are split into at least ``workers`` runs of consecutive files of about equal
        bytes (more where a run would exceed ``shard_bytes``), one shard each.
    verify_encoded : bool
        Decode every file in full (:func:`rowstore.codecs.image.verify_image`, on the
        workers) besides the structural check, catching damage inside the compressed data
        (about one decode per image). Default False: the structural check only.
    on_error : "raise" or "skip"
        What a bad file does. ``"raise"`` (default): the call fails naming the first bad file
        in file order and what is wrong, and nothing is published (shards already written are
        removed). ``"skip"``: each file is also checked as the writer will (the codec's rules,
        e.g. which channels convert to which), the other files are written, and every bad
        file is reported, with its reason, in the result's ``skipped``, in the dataset's
        ``attrs["images"]["skipped"]`` (and by the command line).
    progress : bool, optional
        Show the progress on stderr: the headers read (files, rate, ETA), then the files
        written (bytes, files, rate, ETA); a tqdm bar when tqdm is installed, else a line a
        second. Default: shown for 2,000 files or more when stderr is a terminal.
    allow_outside : bool
        Read files outside ``src``: follow symlinks that lead out of it, and take CSV paths
        that are absolute or climb out with ``..``. By default such a link or path is refused
        (:class:`~rowstore.errors.OutsideRootError`, naming it, whatever ``on_error``);
        symlinks that stay inside ``src`` are always followed.
    shard_bytes, mode, attrs, **writer_kwargs
        As for :class:`~rowstore.DatasetWriter` (``block_bytes``, ``rows_per_block``,
        ``compression``, ``heap_chunk_bytes``); ``mode`` as for :func:`rowstore.commit`.

    Returns
    -------
    ImageIngest
        The schema written and the summary: images stored, classes, the files skipped and
        why, bytes, time (``.summary()`` gives it as text).

    Raises
    ------
    RowValidationError
        (``on_error="raise"``) A bad file, naming it and its row: not a PNG/JPEG (an empty
        file, other bytes), a header that is invalid or of a kind the codec does not store,
        bytes of the other format than the field's, a bit depth or size the field does not
        take, or damaged (the structural check: a JPEG's markers from SOI to EOI with scan
        data, a PNG's chunk CRCs to IEND; the full decode with ``verify_encoded``).
    InputError
        (``on_error="raise"``) A file that is not a regular file (a FIFO, socket or device
        named like an image: found without blocking) or is larger than a value may be (2
        GiB, from its size before anything is read). Whatever ``on_error``: a label CSV that
        is not UTF-8, has a row that is not ``path,label`` or an integer label beyond
        ``int64``, naming the CSV file and line; ``on_error="skip"`` with no file to store.
    OutsideRootError
        A symlink or CSV path leading outside ``src`` (without ``allow_outside``), naming it.

    Notes
    -----
    Rows follow the files' order (``ImageFolder``'s: class, then path). The headers are read
    first, in this process; the whole files are read, checked and written by the workers.
    Nothing is published unless every shard is written; on an error the shards written are
    removed.
    """
    t0 = time.perf_counter()
    src, dest = os.fspath(src), os.fspath(dest)
    if not os.path.isdir(src):
        raise NotADirectoryError(f"{src!r} is not a directory of images")
    nworkers = 1 if workers is None else workers  # the default: once the files are listed
    if not isinstance(nworkers, int) or isinstance(nworkers, bool) or nworkers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if on_error not in _ON_ERROR:
        raise ValueError(f"on_error must be one of {_ON_ERROR}, got {on_error!r}")
    for name, flag in (
        ("allow_outside", allow_outside),
        ("verify_encoded", verify_encoded),
        ("progress", False if progress is None else progress),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    skip = on_error == "skip"
    classes: list[str] | None = None
    lab: list | None
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
    if progress is None:  # long runs at a terminal
        progress = len(files) >= _PROGRESS_FILES and sys.stderr.isatty()
    step = 256
    with ThreadPoolExecutor(min(32, 4 * (os.cpu_count() or 1))) as pool:  # I/O, GIL released
        runs = pool.map(
            lambda a: [_probe(src, r) for r in files[a : a + step]], range(0, len(files), step)
        )
        probed = []
        with Progress("headers", 0, enabled=progress, unit="files", total_rows=len(files)) as bar:
            for run in runs:
                probed += run
                bar.update(len(run), sum(s for _, s in run))
        bad: list[_Bad] = []
        headers: dict[int, ImageHeader] = {}
        for i, (hdr, _) in enumerate(probed):
            if isinstance(hdr, ImageHeader):
                headers[i] = hdr
            else:
                exc = hdr if isinstance(hdr, BaseException) else None
                bad.append(_Bad(i, str(hdr), exc))
        target, why = _target(headers, shape, channels, codec) if headers else (None, "")
        for i, hdr in headers.items():
            assert target is not None
            misfit = _misfit(files[i], hdr, target, why, image_field)
            if misfit is not None:
                bad.append(_Bad(i, misfit))
        bad.sort(key=lambda b: b.index)
        if bad and not skip:  # the first bad file: is one before it damaged inside?
            first = bad[0]
            if target is not None and first.index:
                some = _schema([], target, image_field, None, None, codec)[image_field]
                hit = _first_damaged(
                    src, files[: first.index], target.format, verify_encoded, some, pool
                )
                if hit is not None:
                    i, got = hit
                    first = _Bad(i, str(got), got if isinstance(got, BaseException) else None)
            _raise_bad(first, files, image_field)
    dropped = {b.index for b in bad}
    keep = [i for i in range(len(files)) if i not in dropped]
    skipped = {b.index: b.reason for b in bad}
    if not keep or target is None:
        raise InputError(
            f"no image under {src!r} can be stored: all {len(files):,} files are bad (the "
            f"first, {files[bad[0].index]!r}: {bad[0].reason})",
            path=src,
        )
    kept_files = [files[i] for i in keep]
    kept_lab = None if lab is None else [lab[i] for i in keep]
    label_name = label_field if lab is not None else None
    schema = _schema([headers[i] for i in keep], target, image_field, label_name, path_field, codec)
    if schema[image_field].codec["id"] != target.format:
        raise SchemaError(
            f"codec {codec!r} is not PNG or JPEG (from_images stores files as they are)",
            field=image_field,
        )
    sizes = np.asarray([probed[i][1] for i in keep], np.int64)
    total = int(sizes.sum())
    k = n_parts(
        len(kept_files), total, workers=nworkers, min_items=_MIN_PART_FILES, max_bytes=shard_bytes
    )
    parts = [
        _Part(a, kept_files[a:b], None if kept_lab is None else kept_lab[a:b], sizes[a:b].tolist())
        for a, b in cut(sizes, k)
    ]
    if len(kept_files) < 2 * _MIN_PART_FILES:  # too few files to pay for a worker process
        nworkers = 1
    names = (image_field, label_name, path_field)
    check = (target.format, verify_encoded, skip)
    stamp = os.urandom(4).hex()
    jobs = [
        (src, dest, schema.to_json(), p, names, check, f"images-{stamp}-{j:05d}", writer_kwargs)
        for j, p in enumerate(parts)
    ]
    done: dict[str, Any] = {}

    def attrs_of(results: list[_PartResult]) -> dict[str, Any]:
        """The version's attributes, from what the parts did (no image stored: an error, and
        nothing is published)."""
        for part, res in zip(parts, results):
            for j, reason in res.skipped:
                skipped[keep[part.first + j]] = reason
        done["skipped"] = tuple(
            SkippedImage(files[i].replace(os.sep, "/"), skipped[i]) for i in sorted(skipped)
        )
        done["images"] = images = sum(r.images for r in results)
        if not images:
            first = done["skipped"][0]
            raise InputError(
                f"no image under {src!r} can be stored: all {len(files):,} files are bad (the "
                f"first, {first.path!r}: {first.reason})",
                path=src,
            )
        meta: dict[str, Any] = {"source": os.path.abspath(src), "files": images}
        meta["labels"] = (
            None if labels is None else "folders" if labels == "folders" else os.fspath(labels)
        )
        if classes is not None:
            meta["classes"] = classes
        meta["checked"] = "decoded" if verify_encoded else "structure"
        meta["skipped"] = [s.to_json() for s in done["skipped"]]
        user = dict(attrs or {})
        user[META_KEY] = meta
        return user

    with Progress("write", total, enabled=progress, unit="files") as bar:
        results = write_parts(
            _write_part,
            jobs,
            dest,
            workers=nworkers,
            mode=mode,
            attrs=attrs_of,
            progress=bar.update,
        )
    return ImageIngest(
        dest=dest,
        schema=schema,
        images=done["images"],
        classes=classes,
        skipped=done["skipped"],
        payload_bytes=sum(r.payload_bytes for r in results),
        stored_bytes=sum(r.stored_bytes for r in results),
        seconds=time.perf_counter() - t0,
    )
