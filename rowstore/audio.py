"""A speech corpus to a dataset in one call: :func:`from_audio`.

Two layouts, as corpora ship them:

* **A folder tree** (LibriSpeech, VCTK, most corpora): every ``.flac``/``.wav`` file under the
  source, in the tree's order (by directory, then by name). Transcripts come from
  LibriSpeech's ``*.trans.txt`` files (lines ``UTT-ID TEXT``, one file per chapter folder,
  the utterance id being the audio file's name without its extension). Speaker and chapter
  come from the folders: ``<speaker>/<chapter>/<speaker>-<chapter>-<n>.flac`` (LibriSpeech)
  gives both; otherwise the folder holding a file is its speaker (VCTK's ``<speaker>/...``).
* **A CSV/TSV manifest** (Common Voice's ``train.tsv``...): one row per utterance, a header
  row naming the columns. The path column (``path``) names the audio file, relative to the
  manifest's folder or to its ``clips/`` folder; the transcript column (``sentence``,
  ``transcript`` or ``text``) and speaker column (``client_id``, ``speaker`` or
  ``speaker_id``) are stored as ``transcript`` and ``speaker``; every other column is a
  ``str`` field of its (sanitized) name, each cell kept exactly as written.

FLAC and WAV bytes are stored as they are, byte for byte, in a ``flac`` or ``wav`` field (the
writer checks each file's header against the field: sample rate, channels); a file of the
other format than the field's is decoded and encoded in the field's format. Nothing else is
decoded, so the work is reading files: it runs in ``workers`` processes, each writing the
shard of a run of consecutive files (:mod:`rowstore.writer.parts`), committed in file order in
one version.

Damaged or unreadable files (not a regular file, larger than a value may be, empty, truncated,
a header that does not parse or does not fit the field) stop the ingest naming the file and
its row (``on_error="raise"``, nothing written), or are left out and reported with the reason
(``on_error="skip"``: returned, kept in the dataset's attributes, printed by the CLI). Paths
leading out of the source (symlinks; ``..`` or absolute manifest paths) are refused in both
modes unless ``allow_outside=True``.
"""

from __future__ import annotations

import csv
import io
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.codecs.abc import Payloads
from rowstore.codecs.audio import AudioHeader, audio_header, decode_windows, status_error
from rowstore.errors import (
    CodecError,
    InputError,
    RowValidationError,
    SchemaError,
)
from rowstore.format.spec import MAX_VALUE_BYTES
from rowstore.global_shuffle._progress import Progress
from rowstore.schema import STR, Field, Schema, field_name
from rowstore.storage.inputs import contained, read_input, read_text, walk
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES, write_shard
from rowstore.writer.parts import cut, n_parts, write_parts
from rowstore.writer.values import check_value

__all__ = ["from_audio", "AudioIngest", "AUDIO_EXTENSIONS", "META_KEY"]

#: File name endings taken as audio files in a folder tree (case-insensitive).
AUDIO_EXTENSIONS = (".flac", ".wav")
#: Key of the dataset attributes this module adds.
META_KEY = "audio"
#: LibriSpeech's transcript files: ``<speaker>-<chapter>.trans.txt``, lines ``UTT-ID TEXT``.
TRANSCRIPT_SUFFIX = ".trans.txt"
#: Column names taken for each role of a manifest, in order of preference.
MANIFEST_COLUMNS = {
    "path": ("path", "file", "filename", "file_name", "audio", "audio_path", "audio_filepath"),
    "transcript": ("sentence", "transcript", "text", "transcription", "normalized_text"),
    "speaker": ("client_id", "speaker", "speaker_id"),
}
#: Largest transcript file or manifest read (each is read whole).
_MAX_TEXT_BYTES = 1 << 30
#: A worker's batch: at most this many files, or this many bytes, per ``write_batch``.
_BATCH_FILES = 256
_BATCH_BYTES = 64 << 20
#: Fewest files a part (a worker's shard) is given.
_MIN_PART_FILES = 64
#: Bytes per worker process by default: a spawned worker costs about a second to start and
#: import; below this much audio a second process does not pay for itself.
_AUTO_BYTES_PER_WORKER = 512 << 20
#: Fewest files whose ingest shows its progress by default (at a terminal).
_PROGRESS_FILES = 2000
#: Skipped files kept in the dataset's attributes (all are returned).
_MAX_SKIPPED_ATTRS = 1000


@dataclass(frozen=True)
class AudioIngest:
    """What :func:`from_audio` did.

    Attributes
    ----------
    schema : Schema
        The schema written.
    rows : int
        Utterances written (one row each).
    files : int
        Audio files found (rows plus the ones skipped).
    skipped : list of (path, reason)
        The files left out (``on_error="skip"``) and why: those found before the field was
        decided (a manifest's rows naming no file, unreadable first files) first, then the
        others in file order; paths relative to the source folder (for a manifest, the path
        as it is written).
    audio_bytes : int
        Bytes of audio files read.
    audio_seconds : float
        Duration of the audio written (frames / sample rate, from the headers).
    seconds : float
        Wall time of the ingest.
    speakers : int
        Distinct speakers written (0 without a speaker field).
    """

    schema: Schema
    rows: int
    files: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    audio_bytes: int = 0
    audio_seconds: float = 0.0
    seconds: float = 0.0
    speakers: int = 0

    def __str__(self) -> str:
        f = self.schema[self.schema.names[0]]
        lines = [
            f"{_count(self.rows, 'utterance')} ({f.codec['id']}, {f.dtype} {f.shape}, "
            f"{self.audio_seconds / 3600:,.2f} h of audio, {self.audio_bytes / 2**20:,.1f} MiB) "
            f"from {_count(self.files, 'file')} in {self.seconds:,.1f} s"
            + (f", {_count(self.speakers, 'speaker')}" if self.speakers else ""),
            f"fields: {', '.join(self.schema.names)}",
        ]
        if self.skipped:
            lines.append(f"skipped {_count(len(self.skipped), 'file')}:")
            lines += [f"  {p}: {why}" for p, why in self.skipped]
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


@dataclass
class _Source:
    """The files of a corpus (relative to ``root``) and their text columns, one value a file."""

    root: str
    files: list[str]
    columns: dict[str, list[str | None]]  # a role ("transcript"...) or "=<field>" -> values
    layout: str  # "librispeech", "folders", "files" or "manifest"
    lines: list[int] | None = None  # manifest line of each file
    written: list[str] | None = None  # a manifest's path of each file, as written


@dataclass(frozen=True)
class _Part:
    """The files one worker writes as one shard: rows ``first ..`` (before any skipped)."""

    first: int
    files: list[str]
    columns: dict[str, list[str | None]]


# -- a folder tree ------------------------------------------------------------------------------
def _is_audio(name: str, extensions: Sequence[str]) -> bool:
    return name.lower().endswith(tuple(e.lower() for e in extensions))


def _transcripts(root: str, allow_outside: bool) -> dict[tuple[str, str], str]:
    """``{(folder, utterance id): text}`` of every ``*.trans.txt`` file under ``root``."""
    found = walk(
        root,
        lambda n: n.endswith(TRANSCRIPT_SUFFIX),
        what="transcript file or folder",
        follow_links=allow_outside,
    )
    out: dict[tuple[str, str], str] = {}
    where: dict[tuple[str, str], tuple[str, int]] = {}
    for rel in found:
        folder = os.path.dirname(rel)
        path = os.path.join(root, rel)
        text = read_text(path, what="transcript file", max_bytes=_MAX_TEXT_BYTES)
        for k, line in enumerate(text.split("\n"), 1):  # (not splitlines: U+2028 is text)
            line = line[:-1] if line.endswith("\r") else line
            if not line.strip():
                continue
            utt, _, said = line.partition(" ")
            key = (folder, utt)
            if key in out:
                first = where[key]
                raise InputError(
                    f"{path!r}, line {k}: utterance {utt!r} again (first at {first[0]!r}, line "
                    f"{first[1]}); expected one line per utterance",
                    path=path,
                    line=k,
                )
            out[key], where[key] = said, (rel, k)
    return out


def _tree(
    root: str, extensions: Sequence[str], allow_outside: bool, names: dict[str, str | None]
) -> _Source:
    files = walk(
        root,
        lambda n: _is_audio(n, extensions),
        what="audio file or folder",
        follow_links=allow_outside,
    )
    dirs = [f.split("/")[:-1] for f in files]
    stems = [os.path.splitext(f.rsplit("/", 1)[-1])[0] for f in files]
    libri = bool(files) and all(
        len(d) >= 2 and s.startswith(f"{d[-2]}-{d[-1]}-") for d, s in zip(dirs, stems)
    )
    columns: dict[str, list[str | None]] = {}
    texts = _transcripts(root, allow_outside) if names["transcript"] else {}
    if texts:
        columns["transcript"] = [texts.get(("/".join(d), s)) for d, s in zip(dirs, stems)]
    if libri:
        columns["speaker"] = [d[-2] for d in dirs]
        columns["chapter"] = [d[-1] for d in dirs]
        layout = "librispeech"
    elif files and all(dirs):
        columns["speaker"] = [d[-1] for d in dirs]
        layout = "folders"
    else:
        layout = "files"
    columns["id"] = list(stems)
    return _Source(root, files, columns, layout)


# -- a manifest ---------------------------------------------------------------------------------
def _role_column(header: list[str], role: str, given: Mapping[str, str | None], table: str):
    if role in given:
        name = given[role]
        if name is not None and name not in header:
            raise InputError(
                f"{table!r}: no column {name!r} (given as the {role} column); its columns are "
                f"{header}",
                path=table,
            )
        return name
    return next((c for c in MANIFEST_COLUMNS[role] if c in header), None)


def _manifest(
    table: str, columns: Mapping[str, str | None] | None, allow_outside: bool
) -> tuple[_Source, list[tuple[str, str]]]:
    """The files a CSV/TSV manifest names, its columns, and the rows naming no file:
    ``(source, missing)``."""
    given = dict(columns or {})
    unknown = sorted(set(given) - set(MANIFEST_COLUMNS))
    if unknown:
        raise ValueError(f"columns: unknown roles {unknown}; expected {sorted(MANIFEST_COLUMNS)}")
    text = read_text(table, what="manifest", max_bytes=_MAX_TEXT_BYTES)
    first = text.split("\n", 1)[0]
    tsv = table.lower().endswith(".tsv") or ("\t" in first and "," not in first)
    # Common Voice's TSVs hold quotes inside sentences: taken as they are (no CSV quoting).
    opts: dict[str, Any] = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if tsv else {}
    reader = csv.reader(io.StringIO(text, newline=""), **opts)
    header = next(reader, None)
    if not header:
        raise InputError(f"{table!r}: no header row; expected column names first", path=table)
    if len(set(header)) != len(header):
        raise InputError(f"{table!r}: a column name appears twice in {header}", path=table)
    path_col = _role_column(header, "path", given, table)
    if path_col is None:
        raise InputError(
            f"{table!r}: no path column (one of {list(MANIFEST_COLUMNS['path'])}); its columns "
            f"are {header} (name it with columns={{'path': ...}})",
            path=table,
        )
    roles = {r: _role_column(header, r, given, table) for r in ("transcript", "speaker")}
    base = os.path.dirname(os.path.abspath(table))
    clips = os.path.join(base, "clips")
    taken = {"audio", "path", "transcript", "speaker"}
    others = {c: "=" + field_name(c, taken) for c in header if c not in (path_col, *roles.values())}
    index = {c: i for i, c in enumerate(header)}
    files: list[str] = []
    lines: list[int] = []
    written: list[str] = []
    cols: dict[str, list[str | None]] = {r: [] for r, c in roles.items() if c is not None}
    cols.update({f: [] for f in others.values()})
    missing: list[tuple[str, str]] = []
    for row in reader:
        line = reader.line_num
        if not row or row == [""]:
            continue
        if len(row) != len(header):
            raise InputError(
                f"{table!r}, line {line}: {len(row)} cells, the header has {len(header)}",
                path=table,
                line=line,
            )
        name = row[index[path_col]]
        full = _manifest_path(base, clips, name, table, line, allow_outside)
        if full is None:
            missing.append((name, f"{table!r}, line {line}: no such file"))
            continue
        files.append(os.path.relpath(full, base))
        lines.append(line)
        written.append(name)
        for r, c in roles.items():
            if c is not None:
                cols[r].append(row[index[c]])
        for c, f in others.items():
            cols[f].append(row[index[c]])
    return _Source(base, files, cols, "manifest", lines, written), missing


def _manifest_path(
    base: str, clips: str, name: str, table: str, line: int, allow_outside: bool
) -> str | None:
    """The file a manifest row names: under the manifest's folder, else under its ``clips/``
    (None where neither holds it)."""
    for root in (base, clips):
        if allow_outside:
            full = os.path.join(root, name)
        else:
            full = contained(root, name, what=f"{table!r}, line {line}: audio path", line=line)
        if os.path.lexists(full):
            return full
    return None


# -- the field ----------------------------------------------------------------------------------
def _probe(root: str, rel: str) -> Any:
    """The header of one file (an exception where it cannot be read or parsed)."""
    data = read_input(os.path.join(root, rel), what="audio file", max_bytes=MAX_VALUE_BYTES)
    return audio_header(data)


def _audio_field(
    name: str, header: AudioHeader, codec: Any, dtype: Any, files: list[str]
) -> tuple[Field, str]:
    """The audio field: ``codec`` (default: flac when any file is named ``.flac``, else the
    first file's format) at the first file's sample rate, its channels."""
    if codec is None:
        codec = "flac" if any(f.lower().endswith(".flac") for f in files) else header.format
    spec = dict(codec) if isinstance(codec, Mapping) else {"id": codec}
    if spec.get("id") not in ("flac", "wav"):
        raise SchemaError(f"codec {codec!r}: an audio field's codec is 'flac' or 'wav'", field=name)
    spec.setdefault("sample_rate", header.sample_rate)
    shape = (None,) if header.channels == 1 else (None, header.channels)
    f = Field(name, dtype, shape, codec=spec)
    return f, f.codec["id"]


# -- the workers --------------------------------------------------------------------------------
def _value(root: str, rel: str, f: Field, row: int, verify: bool) -> tuple[Any, int, float, int]:
    """``(value, bytes read, seconds, frames)`` of one file: its bytes as they are when they
    are the field's format (``frames``: the header's, for FLAC bytes, else -1), else its
    samples decoded (the writer encodes them). Checked as the writer checks it (so that a bad
    file is found before it fails a batch)."""
    data = read_input(os.path.join(root, rel), what="audio file", max_bytes=MAX_VALUE_BYTES)
    hdr = audio_header(data)
    value: Any = data
    if hdr.format != f.codec["id"]:
        value = _transcode(data, f)
    checked = check_value(f, value, row, verify_encoded=verify)
    size = int(np.prod(checked.shape, dtype=np.int64)) * f.numpy_dtype.itemsize
    if size > MAX_VALUE_BYTES:
        raise RowValidationError(
            f"row {row}: field {f.name!r}: decodes to {size} bytes, more than a value may hold "
            f"({MAX_VALUE_BYTES})",
            field=f.name,
            row=row,
        )
    frames = hdr.frames if value is data and hdr.format == "flac" and not verify else -1
    return value, len(data), hdr.frames / hdr.sample_rate, frames


def _tails(values: list[bytes], frames: list[int]) -> list[str | None]:
    """Why each FLAC file's last frame does not decode (None where it does): a cut or damaged
    end, which its header cannot tell. The kernel (libFLAC) seeks to the last frame and checks
    its CRC: one call a file, on its bytes as read (not copied)."""
    whys: list[str | None] = []
    out = np.zeros(1, np.float32)
    one = np.ones(1, np.int64)
    offsets = np.zeros(2, np.int64)
    for v, n in zip(values, frames):
        offsets[1] = len(v)
        status = decode_windows(
            Payloads(np.frombuffer(v, np.uint8), offsets, None, None),
            out,
            np.array([max(n - 1, 0)], np.int64),
            one,
            np.array([n], np.int64),
            one,
            np.zeros(1, np.int64),
            mono=True,
        )
        s = int(status[0])
        whys.append(None if not s else f"its end does not decode ({status_error('flac', s)})")
    return whys


def _transcode(data: bytes, f: Field) -> np.ndarray:
    """The samples of a file of the other format, as the field's dtype (``soundfile``)."""
    import soundfile

    try:
        samples, _ = soundfile.read(io.BytesIO(data), dtype=f.numpy_dtype.name, always_2d=True)
    except Exception as exc:
        raise CodecError(f"does not decode: {exc}") from None
    return samples[:, 0].copy() if len(f.shape) == 1 else samples


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    msg = str(exc)
    return msg.split(": ", 1)[1] if msg.startswith("row ") and ": " in msg else msg


def _write_part(
    root: str,
    dest: str,
    schema_json: dict,
    part: _Part,
    audio: str,
    skip: bool,
    verify: bool,
    name: str,
    options: dict,
    *,
    report: Any,
) -> tuple[Any, dict]:
    """One worker's shard (a module-level function: it runs in another process):
    ``(ShardInfo, {"skipped": [(index in part, reason)], "seconds": audio seconds})``."""
    schema = Schema.from_json(schema_json)
    f = schema[audio]
    skipped: list[tuple[int, str]] = []
    total = [0.0]

    def refuse(i: int, exc: BaseException) -> None:
        """Skip file ``i`` of the part, or raise naming it."""
        if not skip:
            if isinstance(exc, (InputError, OSError)):
                raise exc
            row = part.first + i
            raise RowValidationError(
                f"audio file {part.files[i]!r}: row {row}: field {audio!r}: {_reason(exc)}",
                field=audio,
                row=row,
            ) from None
        skipped.append((i, _reason(exc)))

    def checked(pending: list[tuple[int, Any, int, float]]) -> list[tuple[int, Any, int, float]]:
        """``pending`` less the FLAC files whose end does not decode (refused, in order)."""
        flac = [(k, p) for k, p in enumerate(pending) if p[2] >= 0]
        bad = {}
        if flac:
            whys = _tails([p[1] for _, p in flac], [p[2] for _, p in flac])
            bad = {k: why for (k, _), why in zip(flac, whys) if why is not None}
        for k in sorted(bad):
            refuse(pending[k][0], CodecError(bad[k]))
        good = [p for k, p in enumerate(pending) if k not in bad]
        total[0] += sum(p[3] for p in good)
        return good

    def batches() -> Iterator[dict]:
        # (index in part, value, frames to check, seconds)
        pending: list[tuple[int, Any, int, float]] = []
        size = done = 0
        for i, rel in enumerate(part.files):
            row = part.first + i
            done += 1
            try:
                value, nbytes, secs, frames = _value(root, rel, f, row, verify)
            except (CodecError, RowValidationError, InputError, OSError) as exc:
                if not skip:  # a file before it in the batch may be bad too: that one first
                    checked(pending)
                refuse(i, exc)
                continue
            pending.append((i, value, frames, secs))
            size += nbytes
            if len(pending) >= _BATCH_FILES or size >= _BATCH_BYTES:
                good = checked(pending)
                if good:
                    yield _batch(part, audio, good)
                report(done, size)
                pending, size, done = [], 0, 0
        good = checked(pending)
        if good:
            yield _batch(part, audio, good)
        report(done, size)

    info = write_shard(dest, schema, batches(), name=name, batches=True, **options)
    return info, {"skipped": sorted(skipped), "seconds": total[0]}


def _batch(part: _Part, audio: str, good: list[tuple[int, Any, int, float]]) -> dict:
    batch: dict[str, Any] = {audio: [p[1] for p in good]}
    for fname, values in part.columns.items():
        batch[fname] = [values[p[0]] for p in good]
    return batch


# -- the ingest ---------------------------------------------------------------------------------
def from_audio(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    columns: Mapping[str, str | None] | None = None,
    audio_field: str = "audio",
    transcript_field: str | None = "transcript",
    speaker_field: str | None = "speaker",
    chapter_field: str | None = "chapter",
    id_field: str | None = "id",
    path_field: str | None = "path",
    codec: Any = None,
    dtype: Any = "float32",
    extensions: Sequence[str] = AUDIO_EXTENSIONS,
    on_error: str = "raise",
    workers: int | None = None,
    progress: bool | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    mode: str = "w",
    attrs: Mapping[str, Any] | None = None,
    verify_encoded: bool = False,
    allow_outside: bool = False,
    **writer_kwargs: Any,
) -> AudioIngest:
    """Write a speech corpus (a folder tree of FLAC/WAV files, or a CSV/TSV manifest) as a
    dataset directory ``dest``, one row per utterance, the audio files' bytes as they are.

    Parameters
    ----------
    src : str or os.PathLike
        A directory (a folder tree: LibriSpeech's ``<speaker>/<chapter>/`` with
        ``*.trans.txt`` transcripts, or ``<speaker>/`` folders, or plain files), or a
        ``.csv``/``.tsv`` manifest file (Common Voice's ``train.tsv``): see the module's notes.
    dest : str or os.PathLike
        The dataset directory to write (a new version, published at the end, in one commit).
    columns : mapping, optional
        A manifest's column for each role: ``{"path": ..., "transcript": ..., "speaker": ...}``
        (a role mapped to None is not stored); default: the first of
        :data:`MANIFEST_COLUMNS` the header has.
    audio_field : str
        The audio field: codec ``flac`` or ``wav`` at the first readable file's sample rate
        (``{"id": ..., "sample_rate": ...}``), ``dtype`` samples of shape ``(None,)`` (mono)
        or ``(None, C)`` (the first file's channels): every file must have them.
    transcript_field, speaker_field, chapter_field, id_field, path_field : str or None
        Names of the ``str`` fields of the transcript (nullable when some utterance has none),
        the speaker, the chapter (LibriSpeech trees), the utterance id (a tree: the file name
        without its extension) and the file's path (relative to the source folder, ``/``
        separated; a manifest's path as written); None leaves a field out. A field is written
        only when the layout gives its values.
    codec : str or dict, optional
        The audio field's codec (``"flac"``, ``"wav"`` or a config dict such as ``{"id":
        "flac", "bits": 24}``; its sample rate defaults to the first file's); default
        ``flac`` when any file is named ``.flac``, else ``wav``. A file of the other format
        is decoded and encoded in this one (FLAC at the codec's ``bits``: a float WAV, or
        24-bit samples at 16 bits, are refused); the others' bytes are stored as they are.
    dtype : str
        The samples' dtype when read (``float32`` in [-1, 1], ``int16``...).
    extensions : sequence of str
        File name endings taken as audio in a folder tree (case-insensitive).
    on_error : {"raise", "skip"}
        A file that cannot be stored (not a regular file, larger than a value may be, empty,
        damaged, another sample rate or channel count than the field's; a manifest row naming
        no file): ``"raise"`` stops naming the file and its row, writing nothing; ``"skip"``
        leaves it out and reports it (:attr:`AudioIngest.skipped`, and the first 1,000 in
        ``attrs["audio"]["skipped"]``).
    workers : int, optional
        Processes writing shards (default: one per 512 MiB of audio, up to ``os.cpu_count()``);
        ``1`` writes in this process.
    progress : bool, optional
        Show a progress bar (bytes, files/s) on stderr (tqdm if installed); default: for
        2,000 files or more, when stderr is a terminal.
    allow_outside : bool
        Follow symlinks out of the source and take manifest paths that are absolute or climb
        out with ``..``; by default they are refused (:class:`~rowstore.errors.OutsideRootError`
        naming them), in both ``on_error`` modes.
    shard_bytes, mode, attrs, verify_encoded, **writer_kwargs
        As for :func:`rowstore.from_images` (``verify_encoded``: decode every file in full
        before it is written, not only its header).

    Returns
    -------
    AudioIngest
        The schema, rows, skipped files with reasons, bytes, audio duration and wall time.

    Raises
    ------
    RowValidationError
        (``on_error="raise"``) a file whose header does not parse or does not fit the field,
        naming the file and its row.
    InputError
        (``on_error="raise"``) a file that is not a regular file or is too large; a manifest
        or transcript file that is not UTF-8 or has a malformed row, naming file and line.
    OutsideRootError
        A symlink or manifest path leading out of the source (without ``allow_outside``).
    FileNotFoundError
        No audio file; (``on_error="raise"``) a manifest row naming no file.

    Notes
    -----
    Rows follow the files' order (a tree: by folder, then name; a manifest: its rows). The
    first readable file decides the field (sample rate, channels); it is read in this process,
    every other file once, by a worker. Nothing is published unless every shard is written.
    """
    t0 = time.perf_counter()
    src, dest = os.fspath(src), os.fspath(dest)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if not isinstance(allow_outside, bool):
        raise TypeError(f"allow_outside must be a bool, got {allow_outside!r}")
    skip = on_error == "skip"
    names = {
        "transcript": transcript_field,
        "speaker": speaker_field,
        "chapter": chapter_field,
        "id": id_field,
    }
    skipped: list[tuple[str, str]] = []
    if os.path.isdir(src):
        if columns is not None:
            raise ValueError("columns= names a manifest's columns; src is a folder")
        source = _tree(src, extensions, allow_outside, names)
    elif os.path.isfile(src):
        source, missing = _manifest(src, columns, allow_outside)
        if missing and not skip:
            name, why = missing[0]
            raise FileNotFoundError(2, f"{why} ({name!r}, under its folder or clips/)", name)
        skipped += missing
    else:
        raise FileNotFoundError(2, "no folder of audio files nor manifest", src)
    n_found = len(source.files) + len(skipped)
    # The first readable file decides the field.
    header = None
    while source.files and header is None:
        rel = source.files[0]
        try:
            header = _probe(source.root, rel)
        except (CodecError, InputError, OSError) as exc:
            if not skip:
                if isinstance(exc, CodecError):
                    raise RowValidationError(
                        f"audio file {rel!r}: row 0: field {audio_field!r}: {exc}",
                        field=audio_field,
                        row=0,
                    ) from None
                raise
            skipped.append((rel, _reason(exc)))
            _drop_first(source)
    if header is None:
        where = f"manifest {src!r}" if source.layout == "manifest" else repr(src)
        raise FileNotFoundError(
            2,
            f"no readable audio file ({', '.join(extensions)}) in {where}"
            + (f" ({len(skipped)} skipped)" if skipped else ""),
            src,
        )
    audio, codec_id = _audio_field(audio_field, header, codec, dtype, source.files)
    taken = {audio_field}
    fields = [audio]
    renamed: dict[str, str] = {}
    for key, values in source.columns.items():
        fname = key[1:] if key.startswith("=") else names[key]
        if fname is None:
            continue
        fname = field_name(fname, taken)
        renamed[key] = fname
        nullable = any(v is None for v in values)
        fields.append(Field(fname, STR, (), nullable=nullable))
    if path_field is not None:
        fields.append(Field(field_name(path_field, taken), STR, ()))
        renamed["__path__"] = fields[-1].name
    schema = Schema(fields)
    cols = {renamed[k]: v for k, v in source.columns.items() if k in renamed}
    if path_field is not None:
        paths = source.written or [f.replace(os.sep, "/") for f in source.files]
        cols[renamed["__path__"]] = list(paths)

    sizes = np.asarray([_size(source.root, f) for f in source.files], np.int64)
    total = int(sizes.sum())
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, total // _AUTO_BYTES_PER_WORKER))
    k = n_parts(
        len(source.files),
        total,
        workers=workers,
        min_items=_MIN_PART_FILES,
        max_bytes=max(1, shard_bytes),
    )
    parts = [
        _Part(a, source.files[a:b], {n: v[a:b] for n, v in cols.items()}) for a, b in cut(sizes, k)
    ]
    options = dict(writer_kwargs, verify_encoded=False)
    stamp = os.urandom(4).hex()
    jobs = [
        (
            source.root,
            dest,
            schema.to_json(),
            p,
            audio_field,
            skip,
            verify_encoded,
            f"audio-{stamp}-{j:05d}",
            options,
        )
        for j, p in enumerate(parts)
    ]
    meta: dict[str, Any] = {
        "source": os.path.abspath(src),
        "layout": source.layout,
        "files": n_found,
        "sample_rate": header.sample_rate,
        "channels": header.channels,
        "codec": codec_id,
    }

    def attrs_of(extras: list[dict]) -> dict:
        shown = source.written or source.files  # a manifest's paths as written
        for p, extra in zip(parts, extras):
            skipped.extend((shown[p.first + i], why) for i, why in extra["skipped"])
        meta["rows"] = n_found - len(skipped)
        meta["skipped_count"] = len(skipped)
        meta["skipped"] = [{"path": p, "reason": w} for p, w in skipped[:_MAX_SKIPPED_ATTRS]]
        user = dict(attrs or {})
        user[META_KEY] = meta
        return user

    if progress is None:  # long runs at a terminal
        progress = len(source.files) >= _PROGRESS_FILES and sys.stderr.isatty()
    desc = f"from-audio {os.path.basename(src.rstrip(os.sep)) or src}"
    with Progress(desc, total, enabled=progress, unit="files") as bar:
        extras = write_parts(
            _write_part,
            jobs,
            dest,
            workers=workers,
            mode=mode,
            attrs=attrs_of,
            progress=bar.update,
        )
    dropped = {(j, i) for j, extra in enumerate(extras) for i, _ in extra["skipped"]}
    speakers = 0
    if "speaker" in renamed:
        sp = renamed["speaker"]
        speakers = len(
            {
                v
                for j, p in enumerate(parts)
                for i, v in enumerate(p.columns[sp])
                if (j, i) not in dropped
            }
        )
    return AudioIngest(
        schema=schema,
        rows=n_found - len(skipped),
        files=n_found,
        skipped=skipped,
        audio_bytes=total,
        audio_seconds=float(sum(e["seconds"] for e in extras)),
        seconds=time.perf_counter() - t0,
        speakers=speakers,
    )


def _drop_first(source: _Source) -> None:
    del source.files[0]
    for values in source.columns.values():
        del values[0]
    for extra in (source.lines, source.written):
        if extra is not None:
            del extra[0]


def _size(root: str, rel: str) -> int:
    try:
        return os.stat(os.path.join(root, rel)).st_size
    except OSError:
        return 0  # (reported where it is read)
