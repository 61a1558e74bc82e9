"""Hugging Face ``datasets`` in and out of rowstore: a ``Dataset`` or ``DatasetDict`` written as
rowstore files, and read back with its features restored.

:func:`from_huggingface` reads a dataset's Arrow table one record batch at a time (memory stays
bounded by a batch, whatever the dataset's size; a memory-mapped dataset is never loaded whole)
and writes its columns through the Arrow mapping of :mod:`rowstore.arrow`. Nothing is fetched
from the Hub: the dataset is one already built or loaded. :func:`to_huggingface` reads a file or
dataset back as a ``datasets.Dataset`` (a ``DatasetDict`` for a directory of splits). This module
is the only one that imports ``datasets`` (``pip install rowstore[huggingface]``); ``import
rowstore`` does not.

How features are stored (``ds.features``, the dataset's Arrow storage as ``datasets`` keeps it):

=======================================  =========================================================
feature                                  rowstore field
=======================================  =========================================================
``Value`` (bool, ints, floats, string,   scalar of that dtype, ``str``, ``bytes``; dates,
binary, date, timestamp, duration)       timestamps and durations as ``datetime64``/``timedelta64``
``ClassLabel``                           ``int64`` (``-1``: no label); the names are in the
                                         attributes
``List`` / ``Sequence`` / ``LargeList``  variable dimension (``None``); ``List(length=n)`` a fixed
of numbers (nested: n-D)                 dimension ``n``
``Array2D`` .. ``Array5D``               array of the feature's shape (a ``None`` first dimension
                                         stays variable)
``Image``                                the encoded bytes as they are, in a ``png`` or ``jpeg``
                                         field (by the bytes' format), or decoded to ``uint8``
                                         arrays of shape ``(H, W)`` / ``(H, W, C)`` with
                                         ``decode_images=True``
``Audio``                                FLAC/WAV bytes as they are, in a ``flac`` or ``wav``
                                         field (by the bytes' format; read as ``float32``
                                         samples, decoded by the audio kernel); other formats'
                                         bytes in a ``bytes`` field; or decoded to ``float32``
                                         samples with ``decode_audio=True`` (needs
                                         ``soundfile``): ``(n,)`` mono, ``(channels, n)`` else
=======================================  =========================================================

A field is nullable when its column holds a null. Column names that are not identifiers are
stored under a sanitized field name. Other features (``dict`` structs, ``Translation``,
``Json``, ``Video``...) and ``Value`` types without a rowstore dtype (decimals, times of day,
``null``) are refused with a :class:`~rowstore.SchemaError` naming the feature; ``ds.flatten()``
turns structs into columns, ``ds.cast_column`` changes a type.

The dataset's features (``Features.to_dict()``), the column of each field, the class names of
``ClassLabel`` fields and the split are the ``"huggingface"`` entry of the user attributes
(:data:`META_KEY`): they are all :func:`to_huggingface` needs to restore the features.

Image and audio bytes are stored as they are and handed back as they are (the writer checks an
image's or a FLAC/WAV file's header against the field: nothing is decoded or re-encoded); an
image field's format, channels and bit depth are the column's first image's, an audio field's
format, sample rate and channels the column's first clip's, and a later value that differs
names its row. Images given by a local path are read from their files; the paths beside the
bytes (file names inside an archive) are not kept. Values decoded on request are encoded again by
:func:`to_huggingface` (images as ``datasets`` encodes arrays, audio as 32-bit float WAV):
pixels and samples unchanged, bytes not.

A ``DatasetDict`` is written as one dataset directory per split (``path/<split>/``), or, with
``split_field="split"``, as one output holding every split's rows in order and an ``int16``
field of split numbers (the names and the row range of each split are in the attributes).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.utils.file_utils import is_local_path

from rowstore.arrow import _Column, arrow_field, column_values
from rowstore.codecs.audio import audio_header, sniff_audio_format
from rowstore.codecs.image import (
    conversion,
    field_channels,
    jpeg_header,
    png_header,
    sniff_image_format,
)
from rowstore.errors import CodecError, RowValidationError, SchemaError
from rowstore.format import spec
from rowstore.format.manifest import POINTER
from rowstore.reader import Reader
from rowstore.reader.buffers import NULL_KEY, Ragged
from rowstore.reader.raw import RawSource
from rowstore.schema import BYTES, STR, Field, Schema, field_name
from rowstore.storage.inputs import contained, read_input
from rowstore.writer import DatasetWriter, Writer

__all__ = ["from_huggingface", "to_huggingface", "infer_schema", "META_KEY"]

#: Key of the user attributes this module writes (features, columns, class names, split).
META_KEY = "huggingface"
#: Version of the ``attrs["huggingface"]`` description.
_META_VERSION = 1
#: Rows per record batch read from the dataset (a batch is converted and written at once).
DEFAULT_BATCH_ROWS = 1024

#: Codecs of audio fields whose stored bytes are a file's (read back as they are).
_AUDIO_CODECS = ("flac", "wav")
_ARRAYS = (datasets.Array2D, datasets.Array3D, datasets.Array4D, datasets.Array5D)


# -- the plan of one column -------------------------------------------------------------------
@dataclass
class _Plan:
    """One column of the dataset: its feature, the field storing it, and how a batch's Arrow
    column becomes the values :meth:`Writer.write_batch` takes."""

    column: str
    feature: Any
    field: Field
    kind: str  # "arrow", "array", "image", "image_decoded", "audio", "audio_decoded"
    arrow: _Column | None = None
    codec: str | None = None  # "png" / "jpeg" / "flac" / "wav": the format of stored bytes
    rate: int | None = None  # decoded audio: the sampling rate of every row

    def values(self, arr: pa.ChunkedArray | pa.Array, first_row: int) -> Any:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if self.kind == "arrow":
            assert self.arrow is not None
            return column_values(self.arrow, arr, first_row)
        if self.kind == "array":
            assert self.arrow is not None
            vals = column_values(self.arrow, arr.storage, first_row)
            # An empty outer list has no sub-lists to tell the other dimensions: the feature's.
            empty = tuple(0 if s is None else s for s in self.field.shape)
            return [v if v is None or v.size else v.reshape(empty) for v in vals]
        payloads = _payloads(self, arr, first_row)
        if self.kind == "image":
            return [
                None if b is None else _checked_image(self, b, first_row + i)
                for i, b in enumerate(payloads)
            ]
        if self.kind == "audio":
            if self.codec is None:  # neither FLAC nor WAV: a bytes field
                return payloads
            return [
                None if b is None else _checked_audio(self, b, first_row + i)
                for i, b in enumerate(payloads)
            ]
        decode = _decode_image if self.kind == "image_decoded" else _decode_audio
        out = []
        for i, b in enumerate(payloads):
            row = first_row + i
            out.append(None if b is None else _checked(self, decode(self, b, row), row))
        return out


def _unsupported(column: str, feature: Any, why: str) -> SchemaError:
    return SchemaError(f"feature {column!r} ({feature!r}): {why}", field=column)


def _feature_kind(column: str, feature: Any, decode_images: bool, decode_audio: bool) -> str:
    if isinstance(feature, datasets.Image):
        return "image_decoded" if decode_images else "image"
    if isinstance(feature, datasets.Audio):
        return "audio_decoded" if decode_audio else "audio"
    if isinstance(feature, _ARRAYS):
        return "array"
    if isinstance(feature, (datasets.Value, datasets.ClassLabel)):
        return "arrow"
    if isinstance(feature, (datasets.List, datasets.LargeList)):
        inner = feature.feature
        while isinstance(inner, (datasets.List, datasets.LargeList)):
            inner = inner.feature
        if isinstance(inner, (datasets.Value, datasets.ClassLabel)):
            return "arrow"
        raise _unsupported(
            column, feature, f"lists of {type(inner).__name__} features are not supported"
        )
    if isinstance(feature, (dict, list, tuple)):
        raise _unsupported(
            column,
            feature,
            "nested structs are not supported; ds.flatten() makes one column of each member",
        )
    raise _unsupported(
        column, feature, f"{type(feature).__name__} features are not supported by rowstore"
    )


def _plan(
    ds: Any,
    *,
    decode_images: bool,
    decode_audio: bool,
    taken: set[str],
    first: pa.Table | None,
) -> list[_Plan]:
    """The plan of every column of ``ds`` (``first``: its first batch, for what a column's
    values decide: image formats and channels, audio channels)."""
    table = ds.data.table
    plans = []
    for column, feature in ds.features.items():
        kind = _feature_kind(column, feature, decode_images, decode_audio)
        name = field_name(column, taken)
        nullable = table.column(column).null_count > 0
        af = table.schema.field(column)
        if kind in ("arrow", "array"):
            storage = af.type.storage_type if kind == "array" else af.type
            try:
                f = arrow_field(pa.field(column, storage), name=name, nullable=nullable)
            except SchemaError as exc:
                raise _unsupported(column, feature, str(exc)) from None
            if kind == "array":
                shape = tuple(feature.shape)
                f = Field(name, f.dtype, shape, nullable=nullable)
            plans.append(
                _Plan(column, feature, f, kind, _Column(column, f, pa.field(name, storage)))
            )
            continue
        nullable = nullable or _struct_nulls(table.column(column))
        plan = _Plan(column, feature, Field(name, BYTES, nullable=nullable), kind)
        plan.field = _first_field(plan, first, nullable)  # what the first batch's values say
        plans.append(plan)
    if not plans:
        raise SchemaError("the dataset has no columns: nothing to store")
    return plans


def _struct_nulls(col: pa.ChunkedArray) -> bool:
    """Whether an image/audio column has a row without bytes nor path (stored as a null)."""
    for chunk in col.chunks:
        if chunk.null_count:
            return True
        b, p = chunk.field("bytes"), chunk.field("path")
        if b.null_count and pc.any(pc.and_(b.is_null(), p.is_null())).as_py():
            return True
    return False


def _payloads(plan: _Plan, arr: pa.Array | pa.ChunkedArray, first_row: int) -> list:
    """The encoded bytes of each row of an image/audio struct column (None for a null row).
    Rows holding a local path instead of bytes are read from their files as every ingest
    input is (:func:`rowstore.storage.inputs.read_input`: a regular file, at most a value's
    bytes, the size checked before reading); rows holding a remote URL are fetched by
    ``datasets`` (``embed_storage``)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    b = arr.field("bytes")
    valid = np.asarray(arr.is_valid()) if arr.null_count else None
    vals = b.to_pylist()
    if b.null_count and arr.field("path").null_count < len(arr):
        remote = False
        for i, p in enumerate(arr.field("path").to_pylist()):
            if vals[i] is not None or p is None or (valid is not None and not valid[i]):
                continue
            if is_local_path(p):
                what = f"feature {plan.column!r}, row {first_row + i}: file"
                vals[i] = read_input(p, what=what, max_bytes=spec.MAX_VALUE_BYTES)
            else:
                remote = True
        if remote:  # the local files' bytes in place: embed_storage fetches the URLs only
            filled = pa.StructArray.from_arrays(
                [pa.array(vals, b.type), arr.field("path")], ["bytes", "path"], mask=arr.is_null()
            )
            vals = plan.feature.embed_storage(filled).field("bytes").to_pylist()
    if valid is not None:
        vals = [v if ok else None for v, ok in zip(vals, valid)]
    return vals


# -- images -----------------------------------------------------------------------------------
def _decode_image(plan: _Plan, b: bytes, row: int) -> np.ndarray:
    """An image as ``datasets`` decodes it (Pillow; the feature's ``mode``, EXIF orientation),
    as the array ``numpy.asarray`` makes of it."""
    try:
        img = plan.feature.decode_example({"bytes": b, "path": None})
        return np.asarray(img)
    except Exception as exc:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: the image does not decode: {exc}",
            field=plan.column,
            row=row,
        ) from exc


def _decode_audio(plan: _Plan, b: bytes, row: int) -> np.ndarray:
    """Audio samples as ``float32``: ``(n,)`` mono, ``(channels, n)`` else; the sampling rate
    must be the feature's (when it sets one) and the same in every row."""
    try:
        import soundfile
    except ImportError as exc:
        raise ModuleNotFoundError(
            "decode_audio=True needs soundfile: pip install soundfile", name="soundfile"
        ) from exc
    try:
        samples, rate = soundfile.read(io.BytesIO(b), dtype="float32", always_2d=True)
    except Exception as exc:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: the audio does not decode: {exc}",
            field=plan.column,
            row=row,
        ) from exc
    want = plan.feature.sampling_rate or plan.rate
    if want is not None and rate != want:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: sampled at {rate} Hz, the "
            f"{'feature' if plan.feature.sampling_rate else 'first row'} at {want} Hz (rowstore "
            "does not resample; store the bytes, the default, or resample first)",
            field=plan.column,
            row=row,
        )
    plan.rate = rate
    want_ch = plan.feature.num_channels
    if want_ch is not None and samples.shape[1] != want_ch:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: {samples.shape[1]} channels, the feature "
            f"asks for {want_ch} (rowstore does not remix)",
            field=plan.column,
            row=row,
        )
    return samples[:, 0].copy() if samples.shape[1] == 1 else np.ascontiguousarray(samples.T)


def _first_field(plan: _Plan, first: pa.Table | None, nullable: bool) -> Field:
    """The field of an image or decoded audio column, learnt from its first value (in the first
    batch): the format, channels and bit depth of an image (its header), the dtype and channels
    of a decoded one or of audio. A later value that differs names its row."""
    payloads = [] if first is None else _payloads(plan, first.column(plan.column), 0)
    row, b = next(((i, v) for i, v in enumerate(payloads) if v is not None), (0, None))
    name, column = plan.field.name, plan.column
    if plan.kind == "audio":
        return _audio_field(plan, b, nullable)
    if b is None:
        if plan.kind != "image":
            raise _unsupported(
                column, plan.feature, "no value in the first batch to learn the array's shape from"
            )
        plan.codec = "png"  # a column of nulls only
        return Field(name, "uint8", (None, None, 3), codec="png", nullable=nullable)
    if plan.kind == "image":
        fmt = sniff_image_format(b)
        if fmt not in ("png", "jpeg"):
            raise _unsupported(
                column,
                plan.feature,
                f"row {row} holds {fmt or 'unknown'} bytes; rowstore stores PNG or JPEG bytes "
                "as they are: pass decode_images=True to store the images decoded",
            )
        plan.codec = fmt
        h = _header(plan, fmt, b, row)
        # The feature's mode decides the channels every image decodes to ("L": grey, "RGB"),
        # else the first image does.
        mode = getattr(plan.feature, "mode", None)
        c = {"L": 1, "RGB": 3}.get(mode or "", field_channels(h))
        dims = (None, None) if c == 1 else (None, None, c)
        return Field(name, h.dtype, dims, codec=fmt, nullable=nullable)
    a = (_decode_image if plan.kind == "image_decoded" else _decode_audio)(plan, b, row)
    shape: tuple[int | None, ...]
    if plan.kind == "image_decoded":
        shape = (None, None) + a.shape[2:]
    else:
        shape = (None,) if a.ndim == 1 else (a.shape[0], None)
    return Field(name, a.dtype, shape, nullable=nullable)


def _audio_field(plan: _Plan, b: bytes | None, nullable: bool) -> Field:
    """An audio column's field: FLAC/WAV bytes in a field of their codec (sample rate and
    channels of the first clip, read as ``float32``), other bytes (or a column of nulls) in a
    ``bytes`` field."""
    name = plan.field.name
    if b is None or sniff_audio_format(b) is None:
        return Field(name, BYTES, nullable=nullable)
    h = _audio_header(plan, b, 0)
    if h is None:
        return Field(name, BYTES, nullable=nullable)
    plan.codec, plan.rate = h.format, h.sample_rate
    shape = (None,) if h.channels == 1 else (None, h.channels)
    codec = {"id": h.format, "sample_rate": h.sample_rate}
    return Field(name, "float32", shape, codec=codec, nullable=nullable)


def _audio_header(plan: _Plan, b: bytes, row: int) -> Any:
    """A FLAC/WAV clip's header (None for the first clip when it does not parse: the column
    is then stored as bytes, as other formats are)."""
    try:
        return audio_header(b)
    except CodecError as exc:
        if plan.codec is None:
            return None
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: {exc}", field=plan.column, row=row
        ) from None


def _checked_audio(plan: _Plan, b: bytes, row: int) -> bytes:
    """A clip's bytes, stored as they are (the writer checks the header against the field:
    sample rate, channels); one of another format than the first clip's names its row."""
    fmt = sniff_audio_format(b)
    if fmt != plan.codec:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: {fmt or 'unknown'} bytes in a column of "
            f"{plan.codec} audio (the first clip's); rowstore stores one format a column as it "
            "is: pass decode_audio=True to store the samples decoded",
            field=plan.column,
            row=row,
        )
    return b


def _header(plan: _Plan, fmt: str, b: bytes, row: int) -> Any:
    """What an image's header says (size, channels, bits), read without decoding."""
    got = sniff_image_format(b)
    if got != fmt:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: {got or 'unknown'} bytes in a column of "
            f"{fmt} images (the first batch's); rowstore stores one format a column as it is: "
            "pass decode_images=True to store them decoded",
            field=plan.column,
            row=row,
        )
    try:
        return (png_header if fmt == "png" else jpeg_header)(b)
    except ValueError as exc:
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: {exc}", field=plan.column, row=row
        ) from None


def _checked_image(plan: _Plan, b: bytes, row: int) -> bytes:
    """An image's bytes, stored as they are (the writer checks the header against the field and
    the reader converts them to its channels); one the field cannot hold, or a colour image for
    a grey field learnt from the first batch (that would drop its colour), names its row."""
    assert plan.codec is not None
    h = _header(plan, plan.codec, b, row)
    f = plan.field
    channels = f.shape[2] if len(f.shape) == 3 else 1
    why = conversion(h, channels, f.dtype)
    learnt = getattr(plan.feature, "mode", None) != "L"
    if why or (learnt and channels == 1 and field_channels(h) != 1):
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: a {h.dtype} image of {h.channels} channel(s) "
            f"({why or 'its colour would be dropped'}); the field holds {f.dtype} images of "
            f"{channels} (the feature's mode, else the first image's): give the feature a mode "
            "(ds.cast_column(name, Image(mode='RGB')))",
            field=plan.column,
            row=row,
        )
    return b


def _checked(plan: _Plan, a: np.ndarray, row: int) -> np.ndarray:
    f = plan.field
    ok = a.dtype == f.dtype and a.ndim == len(f.shape)
    ok = ok and all(s is None or s == t for s, t in zip(f.shape, a.shape))
    if not ok:
        hint = (
            "give the Image feature a mode (ds.cast_column(name, Image(mode='RGB')))"
            if plan.kind == "image_decoded"
            else "the channels differ between rows"
        )
        raise RowValidationError(
            f"feature {plan.column!r}, row {row}: decodes to {a.dtype} {a.shape}, the field "
            f"holds {f.dtype} {f.shape} (learnt from the first batch); {hint}",
            field=plan.column,
            row=row,
        )
    return a


# -- writing ----------------------------------------------------------------------------------
def _batches(ds: Any, batch_rows: int) -> Iterator[pa.Table]:
    """The dataset's rows in its order (an indices mapping from ``select``/``shuffle``
    respected) as Arrow tables of ``batch_rows`` rows, undecoded."""
    yield from ds.with_format("arrow").iter(batch_size=batch_rows)


def _meta(ds: Any, plans: list[_Plan], extra: Mapping[str, Any]) -> dict:
    meta: dict[str, Any] = {
        "version": _META_VERSION,
        "datasets_version": datasets.__version__,
        "features": _jsonable(ds.features.to_dict()),
        "columns": {p.field.name: p.column for p in plans},
    }
    names = {
        p.field.name: list(p.feature.names)
        for p in plans
        if isinstance(p.feature, datasets.ClassLabel)
    }
    if names:
        meta["class_names"] = names
    images = {p.field.name: p.codec or "decoded" for p in plans if p.kind.startswith("image")}
    if images:
        meta["images"] = images
    audio = {
        p.field.name: {
            "decoded": p.kind == "audio_decoded",
            "sampling_rate": p.rate or p.feature.sampling_rate,
            "codec": p.codec if p.kind == "audio" else None,
        }
        for p in plans
        if p.kind.startswith("audio")
    }
    if audio:
        meta["audio"] = audio
    if ds.info.description:
        meta["description"] = ds.info.description
    meta.update(extra)
    return meta


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _check_dataset(ds: Any) -> None:
    if not isinstance(ds, datasets.Dataset):
        raise TypeError(
            "from_huggingface takes a datasets.Dataset or DatasetDict, got "
            f"{type(ds).__name__} (an IterableDataset: materialize it first, e.g. "
            "Dataset.from_generator)"
        )


def _first(ds: Any, batch_rows: int) -> pa.Table | None:
    return next(_batches(ds.select(range(min(len(ds), batch_rows))), batch_rows), None)


def _write_one(
    ds: Any,
    path: str | os.PathLike,
    *,
    dataset: bool,
    attrs: Mapping[str, Any] | None,
    batch_rows: int,
    decode_images: bool,
    decode_audio: bool,
    extra: Mapping[str, Any],
    split_field: tuple[str, list[int]] | None,
    writer_kwargs: dict,
) -> Schema:
    """Write one Dataset (or, with ``split_field`` (name, split numbers), the concatenated
    splits, the split number of each row given by the row ranges)."""
    taken: set[str] = set()
    if split_field is not None:
        taken.add(split_field[0])
    plans = _plan(
        ds,
        decode_images=decode_images,
        decode_audio=decode_audio,
        taken=taken,
        first=_first(ds, batch_rows),
    )
    fields = [p.field for p in plans]
    if split_field is not None:
        fields.append(Field(split_field[0], "int16"))
    schema = Schema(fields)
    user = dict(attrs or {})
    user[META_KEY] = _meta(ds, plans, extra)
    cls = DatasetWriter if dataset else Writer
    with cls(path, schema, attrs=user, **writer_kwargs) as w:
        row = 0
        for tbl in _batches(ds, batch_rows):
            if tbl.num_rows == 0:
                continue
            vals = {p.field.name: p.values(tbl.column(p.column), row) for p in plans}
            if split_field is not None:
                ends = np.asarray(split_field[1])
                rows = np.arange(row, row + tbl.num_rows)
                vals[split_field[0]] = np.searchsorted(ends, rows, side="right").astype("int16")
            w.write_batch(vals)
            row += tbl.num_rows
    return schema


def infer_schema(ds: Any, *, decode_images: bool = False, decode_audio: bool = False) -> Schema:
    """The schema :func:`from_huggingface` would write Dataset ``ds`` with."""
    _check_dataset(ds)
    plans = _plan(
        ds,
        decode_images=decode_images,
        decode_audio=decode_audio,
        taken=set(),
        first=_first(ds, DEFAULT_BATCH_ROWS),
    )
    return Schema([p.field for p in plans])


def from_huggingface(
    data: Any,
    path: str | os.PathLike,
    *,
    decode_images: bool = False,
    decode_audio: bool = False,
    split_field: str | None = None,
    dataset: bool = False,
    attrs: Mapping[str, Any] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    **writer_kwargs: Any,
) -> Schema | dict[str, Schema]:
    """Write a Hugging Face ``Dataset`` or ``DatasetDict`` to ``path``.

    Parameters
    ----------
    data : datasets.Dataset or datasets.DatasetDict
        Read in Arrow record batches of ``batch_rows`` rows, in the dataset's row order (a
        ``select``/``shuffle``/``filter`` mapping respected), undecoded.
    path : str or os.PathLike
        A Dataset: one ``.h5`` file, or a dataset directory with ``dataset=True``. A
        DatasetDict: a directory holding one dataset directory per split (``path/<split>``),
        or with ``split_field`` one output as for a Dataset.
    decode_images : bool
        Store ``Image`` columns decoded (``uint8`` ``(H, W)`` / ``(H, W, C)`` arrays, as
        ``datasets`` decodes them: the feature's ``mode`` applied) instead of their bytes. The
        channels (and dtype) are the first image's; a later image that differs names its row.
        By default the PNG/JPEG bytes are stored as they are (format, channels and bit depth
        of the first image; each image's header checked).
    decode_audio : bool
        Store ``Audio`` columns as ``float32`` samples (needs ``soundfile``); every row must be
        sampled at one rate (the feature's ``sampling_rate`` when it sets one; no resampling),
        which the attributes keep.
    split_field : str, optional
        For a DatasetDict: the name of an ``int16`` field of split numbers; every split's rows
        are written in order into one output (the splits must have the same features).
    dataset : bool
        Write dataset directories (:class:`~rowstore.DatasetWriter`, ``shard_bytes=``...);
        the splits of a DatasetDict always are.
    attrs : dict, optional
        User attributes; the ``"huggingface"`` entry (see the module's notes) is added.
    batch_rows : int
        Rows per batch read and written.
    **writer_kwargs
        For the writer: ``block_bytes``, ``compression``, ``rows_per_block``, ``mode``...

    Returns
    -------
    Schema, or dict of split name to Schema
        The schema written (of each split).

    Raises
    ------
    SchemaError
        A feature that cannot be stored, naming it.
    RowValidationError
        A value that does not fit (a null inside a list, an image that does not decode or
        differs from the first image in format or channels), naming the column and row.
    """
    if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows < 1:
        raise ValueError(f"batch_rows must be an int >= 1, got {batch_rows!r}")
    opts: dict[str, Any] = dict(
        attrs=attrs,
        batch_rows=batch_rows,
        decode_images=bool(decode_images),
        decode_audio=bool(decode_audio),
        writer_kwargs=writer_kwargs,
    )
    if isinstance(data, datasets.DatasetDict):
        splits = list(data)
        for s in splits:
            _check_dataset(data[s])
        if split_field is not None:
            return _write_split_field(data, path, split_field, dataset=dataset, **opts)
        root = os.fspath(path)
        dirs = {s: contained(root, s, what="split name", nested=False) for s in splits}
        os.makedirs(root, exist_ok=True)
        out = {}
        for s in splits:
            out[s] = _write_one(
                data[s],
                dirs[s],
                dataset=True,
                extra={"split": s, "splits": splits},
                split_field=None,
                **opts,
            )
        return out
    _check_dataset(data)
    if split_field is not None:
        raise ValueError("split_field is for a DatasetDict; this is a Dataset")
    extra = {"split": str(data.split)} if data.split is not None else {}
    return _write_one(data, path, dataset=dataset, extra=extra, split_field=None, **opts)


def _write_split_field(data: Any, path: str | os.PathLike, split_field: str, **opts: Any) -> Schema:
    splits = list(data)
    if not split_field.isidentifier():
        raise ValueError(f"split_field must be a field name, got {split_field!r}")
    f0 = data[splits[0]].features
    for s in splits[1:]:
        if data[s].features != f0:
            raise SchemaError(
                f"split {s!r} has other features than split {splits[0]!r}; split_field needs "
                "the same features in every split (or write one directory per split)"
            )
    if split_field in f0:
        raise SchemaError(
            f"split_field {split_field!r} is a column of the dataset; choose another name",
            field=split_field,
        )
    ends = np.cumsum([len(data[s]) for s in splits]).tolist()
    starts = [0] + ends[:-1]
    both = datasets.concatenate_datasets([data[s] for s in splits])
    extra = {
        "split_field": split_field,
        "splits": splits,
        "split_rows": {s: [a, b] for s, a, b in zip(splits, starts, ends)},
    }
    return _write_one(both, path, extra=extra, split_field=(split_field, ends), **opts)


# -- reading back -----------------------------------------------------------------------------
def _default_feature(f: Field) -> Any:
    """The feature of a field written without ``"huggingface"`` attributes."""
    if f.dtype == STR:
        return datasets.Value("string")
    if f.dtype == BYTES:
        return datasets.Value("binary")
    if f.codec["id"] in ("png", "jpeg"):
        return datasets.Image()
    if f.codec["id"] in _AUDIO_CODECS:
        return datasets.Audio(sampling_rate=f.codec.get("sample_rate"))
    value = _value_dtype(f.dtype)
    if not f.shape:
        return datasets.Value(value)
    if len(f.shape) >= 2 and len(f.shape) <= 5 and None not in f.shape[1:]:
        return _ARRAYS[len(f.shape) - 2](shape=f.shape, dtype=value)
    feature: Any = datasets.Value(value)
    for s in reversed(f.shape):
        feature = datasets.List(feature, length=-1 if s is None else s)
    return feature


def _value_dtype(dtype: np.dtype) -> str:
    if dtype.kind == "M":
        unit = np.datetime_data(dtype)[0]
        return "date32" if unit == "D" else f"timestamp[{unit}]"
    if dtype.kind == "m":
        return f"duration[{np.datetime_data(dtype)[0]}]"
    return "bool" if dtype.kind == "b" else dtype.name


def _nested(vals: Any, f: Field, nulls: np.ndarray | None) -> pa.Array:
    """A batch of arrays (an ``(n, *shape)`` ndarray or a :class:`Ragged`) as nested Arrow
    lists, one level per dimension."""
    if isinstance(vals, Ragged):
        shapes = vals.shapes.astype(np.int64)
        if nulls is None:
            flat = vals.values
        else:  # the values of the rows that are not null
            o = vals.offsets
            flat = np.concatenate([vals.values[o[i] : o[i + 1]] for i in np.flatnonzero(~nulls)])
    else:
        n = len(vals)
        flat = np.ascontiguousarray(vals if nulls is None else vals[~nulls]).reshape(-1)
        shapes = np.broadcast_to(np.asarray(vals.shape[1:], np.int64), (n, len(vals.shape) - 1))
    if nulls is not None:
        shapes = np.where(nulls[:, None], 0, shapes)
    arr = pa.array(flat)
    d = shapes.shape[1]
    # Level k has prod(shape[:k]) lists per row, each of length shape[k].
    counts = np.ones(len(shapes), np.int64)
    lengths = []
    for k in range(d):
        lengths.append(np.repeat(shapes[:, k], counts))
        counts = counts * shapes[:, k]
    for k in reversed(range(d)):
        offsets = np.zeros(len(lengths[k]) + 1, np.int64)
        np.cumsum(lengths[k], out=offsets[1:])
        mask = pa.array(nulls) if k == 0 and nulls is not None else None
        big = offsets[-1] > np.iinfo(np.int32).max
        cls = pa.LargeListArray if big else pa.ListArray
        arr = cls.from_arrays(
            pa.array(offsets if big else offsets.astype(np.int32)), arr, mask=mask
        )
    return arr


def _column(f: Field, batch: dict, feature: Any, rate: int | None) -> pa.Array:
    """One field of a batch read back as the Arrow array ``datasets`` casts to ``feature``."""
    vals = batch[f.name]
    nulls = batch.get(f.name + NULL_KEY)
    if nulls is not None and not nulls.any():
        nulls = None
    if isinstance(feature, datasets.Audio):
        if f.dtype == BYTES or f.codec["id"] in _AUDIO_CODECS:  # the stored bytes
            data = pa.array(list(vals), pa.binary())
        else:
            wavs = [None if a is None else _wav(a, rate) for a in _rows(vals, nulls)]
            data = pa.array(wavs, pa.binary())
        paths = pa.nulls(len(data), pa.string())
        return pa.StructArray.from_arrays([data, paths], ["bytes", "path"], mask=data.is_null())
    if isinstance(feature, datasets.Image):
        if f.dtype == BYTES or f.codec["id"] in ("png", "jpeg"):  # the stored bytes
            data = pa.array(list(vals), pa.binary())
        else:  # decoded: encoded again as datasets encodes arrays (PNG, or TIFF for floats...)
            from datasets.features.image import encode_np_array

            data = pa.array(
                [None if a is None else encode_np_array(a)["bytes"] for a in _rows(vals, nulls)],
                pa.binary(),
            )
        paths = pa.nulls(len(data), pa.string())
        return pa.StructArray.from_arrays([data, paths], ["bytes", "path"], mask=data.is_null())
    if f.dtype in (STR, BYTES):
        return pa.array(list(vals), pa.string() if f.dtype == STR else pa.binary())
    if f.shape:
        return _nested(vals, f, nulls)
    return pa.array(vals, mask=nulls)


def _rows(vals: Any, nulls: np.ndarray | None) -> list:
    return [None if nulls is not None and nulls[i] else vals[i] for i in range(len(vals))]


def _wav(a: np.ndarray, rate: int | None) -> bytes:
    """Decoded samples (``(n,)`` or ``(channels, n)``) as the bytes of a 32-bit float WAV file
    (every sample kept exactly)."""
    import soundfile

    if rate is None:
        raise SchemaError("decoded audio without a sampling rate in the attributes")
    buf = io.BytesIO()
    soundfile.write(buf, a if a.ndim == 1 else a.T, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def to_huggingface(
    path: str | os.PathLike,
    *,
    fields: Sequence[str] | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    cache_dir: str | os.PathLike | None = None,
    **reader_kwargs: Any,
) -> Any:
    """Read a file or dataset as a ``datasets.Dataset`` with its features restored; a
    directory of splits (as :func:`from_huggingface` writes a DatasetDict), or one written
    with ``split_field``, as a ``DatasetDict``.

    ``fields``: the columns to read (field names), default all. Rows are read ``batch_rows`` at
    a time and written to an Arrow file in ``cache_dir`` (memory-mapped by the Dataset, so
    memory stays bounded), or, without ``cache_dir``, kept in memory. A dataset written without
    ``"huggingface"`` attributes reads too: ``Value`` scalars, ``List``/``Array2D``..
    arrays, ``Image`` for png/jpeg fields. ``reader_kwargs`` go to :class:`~rowstore.Reader`.
    """
    root = os.fspath(path)
    if os.path.isdir(root) and not os.path.exists(os.path.join(root, POINTER)):
        splits = _split_dirs(root)
        return datasets.DatasetDict(
            {
                s: _read_one(os.path.join(root, s), fields, batch_rows, cache_dir, s, reader_kwargs)
                for s in splits
            }
        )
    return _read_one(root, fields, batch_rows, cache_dir, None, reader_kwargs)


def _split_dirs(root: str) -> list[str]:
    found = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, POINTER)))
    if not found:
        raise FileNotFoundError(f"no rowstore dataset at {root!r}, nor a directory of splits")
    with Reader(os.path.join(root, found[0])) as r:
        meta = r.layout.user_attrs.get(META_KEY) or {}
    order = [s for s in meta.get("splits", []) if s in found]
    return order + [s for s in found if s not in order]


def _read_one(
    path: str,
    fields: Sequence[str] | None,
    batch_rows: int,
    cache_dir: Any,
    split: str | None,
    reader_kwargs: dict,
) -> Any:
    with Reader(path, **reader_kwargs) as r:
        meta = r.layout.user_attrs.get(META_KEY) or {}
        schema = r.schema
        columns = meta.get("columns") or {f.name: f.name for f in schema}
        stored = datasets.Features.from_dict(meta["features"]) if "features" in meta else None
        names = [f.name for f in schema if f.name in columns]  # attrs JSON sorts its keys
        if fields is not None:
            unknown = [n for n in fields if n not in names]
            if unknown:
                raise KeyError(f"no field(s) {unknown}; the fields are {names}")
            names = list(fields)
        features = datasets.Features(
            {
                columns[n]: stored[columns[n]]
                if stored is not None and columns[n] in stored
                else _default_feature(schema[n])
                for n in names
            }
        )
        raw = None
        if _stored_as_is(schema, names, features, columns):
            raw = RawSource(
                path,
                verify=reader_kwargs.get("verify", True),
                storage_options=reader_kwargs.get("storage_options"),
            )
        try:
            if meta.get("split_field") is not None and split is None:
                return datasets.DatasetDict(
                    {
                        s: _read_rows(
                            r,
                            names,
                            columns,
                            features,
                            range(*meta["split_rows"][s]),
                            batch_rows,
                            cache_dir,
                            s,
                            raw,
                        )
                        for s in meta["splits"]
                    }
                )
            name = split or meta.get("split")
            rows = range(len(r))
            return _read_rows(r, names, columns, features, rows, batch_rows, cache_dir, name, raw)
        finally:
            if raw is not None:
                raw.close()


def _read_rows(
    r: Reader,
    names: list[str],
    columns: Mapping[str, str],
    features: Any,
    rows: range,
    batch_rows: int,
    cache_dir: Any,
    split: str | None,
    raw: RawSource | None,
) -> Any:
    from datasets.table import cast_table_to_features

    audio = (r.layout.user_attrs.get(META_KEY) or {}).get("audio", {})
    rates = {n: a.get("sampling_rate") for n, a in audio.items()}

    images = _stored_as_is(r.schema, names, features, columns)
    others = [n for n in names if n not in images]

    def tables() -> Iterator[pa.Table]:
        for a in range(rows.start, rows.stop, batch_rows):
            b = min(a + batch_rows, rows.stop)
            idx = np.arange(a, b, dtype=np.int64)
            batch = r.take(idx, fields=others, varlen="ragged") if others else {}
            if images:
                assert raw is not None
                for n, vals in _stored_bytes(raw, images, a, b).items():
                    batch[n] = vals
                    batch[n + NULL_KEY] = np.array([v is None for v in vals], bool)
            cols = {
                columns[n]: _column(r.schema[n], batch, features[columns[n]], rates.get(n))
                for n in names
            }
            yield cast_table_to_features(pa.table(cols), features)

    info = datasets.DatasetInfo(features=features)
    named = datasets.NamedSplit(split) if split else None
    if cache_dir is None:
        parts = list(tables())
        table = pa.concat_tables(parts) if parts else features.arrow_schema.empty_table()
        return datasets.Dataset(table, info=info, split=named)
    from datasets.arrow_writer import ArrowWriter

    os.makedirs(cache_dir, exist_ok=True)
    file = os.path.join(os.fspath(cache_dir), f"rowstore-{split or 'data'}.arrow")
    with ArrowWriter(features=features, path=file) as w:
        for t in tables():
            w.write_table(t)
        w.finalize()
    return datasets.Dataset.from_file(file, info=info, split=named)


def _stored_as_is(schema: Schema, names: list[str], features: Any, columns: Mapping) -> list:
    """The png/jpeg fields read as ``Image`` features and the flac/wav fields read as
    ``Audio`` features: their stored bytes go to ``datasets`` as they are (no decode, no
    re-encode)."""
    return [
        n
        for n in names
        if (
            schema[n].codec["id"] in ("png", "jpeg")
            and isinstance(features[columns[n]], datasets.Image)
        )
        or (
            schema[n].codec["id"] in _AUDIO_CODECS
            and isinstance(features[columns[n]], datasets.Audio)
        )
    ]


def _stored_bytes(src: RawSource, names: list[str], a: int, b: int) -> dict[str, list]:
    """The stored payloads of fields ``names`` in rows ``a:b`` (None for a null), read block by
    block (every chunk checksummed and decompressed as a read would, nothing decoded)."""
    out: dict[str, list] = {n: [] for n in names}
    if a >= b:
        return out
    first = np.array([src.block_rows(k)[0] for k in range(src.num_blocks)], np.int64)
    k = int(np.searchsorted(first, a, side="right")) - 1
    while a < b:
        start, count = src.block_rows(k)
        raw = src.block(k)
        lo, hi = a - start, min(b, start + count) - start
        rows = raw.rows[lo:hi]
        for n in names:
            ref = rows[n]
            null = n + spec.NULL_SUFFIX
            nulls = rows[null] if null in (rows.dtype.names or ()) else None
            for i in range(len(rows)):
                if nulls is not None and nulls[i]:
                    out[n].append(None)
                    continue
                o = int(ref["offset"][i]) - raw.origin
                out[n].append(raw.heap[o : o + int(ref["nbytes"][i])].tobytes())
        a = start + hi
        k += 1
    return out
