"""A few rows of a dataset to look at: a deterministic sample, read within bounds, and each value
as a small picture or a short text for the HTML views.

:func:`sample_rows` picks rows (a pure function of the row count, the sample size and the
seed) and :func:`read_sample` reads them through the reader (its kernels decode the images), but
first reads the rows' heap references alone (the row table, no payload): a value whose stored or
decoded size is over :data:`MAX_VALUE_BYTES` is not read at all and comes back as
:class:`Skipped`, saying why. So a view of a dataset with a hostile 30,000 x 30,000 PNG, or of a
one-hour waveform, reads and allocates a bounded amount.

:func:`field_kind` tells what a field holds (``image``, ``audio``, ``array`` drawn as a heatmap,
``text``, ``scalar``...), :func:`cell_html` draws one value for a grid or table, and
:func:`sample_rate` finds an audio field's rate in its codec or the dataset's attributes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore import _pictures
from rowstore._html import Html, clip, esc
from rowstore.errors import CodecError, FormatError
from rowstore.format.spec import heap_ref_dtype
from rowstore.reader._gather import FieldPlan
from rowstore.reader.buffers import NULL_KEY
from rowstore.reader.image_ops import Resize
from rowstore.schema import Field

__all__ = [
    "Skipped",
    "Reduced",
    "sample_rows",
    "read_sample",
    "field_kind",
    "sample_rate",
    "class_names",
    "value_text",
    "cell_html",
    "MAX_VALUE_BYTES",
]

#: Bytes one value may take, stored or decoded, to be read for a view (larger ones are skipped).
MAX_VALUE_BYTES = 32 << 20
#: Bytes of a text or binary value read for a view, at most.
MAX_TEXT_BYTES = 1 << 20

_IMAGE_CODECS = ("png", "jpeg")
_AUDIO_CODECS = ("flac", "wav")


@dataclass(frozen=True)
class Skipped:
    """A value a view did not read, and why (its size, over the bounds)."""

    reason: str

    def __str__(self) -> str:
        return f"<{self.reason}>"


def sample_rows(num_rows: int, k: int, seed: int = 0) -> np.ndarray:
    """``min(k, num_rows)`` distinct row numbers, sorted: a pure function of the arguments
    (NumPy's PCG64 seeded with ``seed``)."""
    n, k = int(num_rows), max(0, min(int(k), int(num_rows)))
    if k == 0:
        return np.zeros(0, np.int64)
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.sort(rng.choice(n, size=k, replace=False).astype(np.int64))


# -- what a field holds --------------------------------------------------------------------------
def _codec_id(f: Field) -> str:
    return str(f.codec.get("id", ""))


def field_kind(f: Field) -> str:
    """``"image"`` (a png/jpeg field, or uint8/uint16 ``H x W [x C]`` with C 1-4),
    ``"audio"`` (a flac/wav field, or a float field of shape ``(None,)``), ``"array"`` (another
    real array of 2 or more dimensions: drawn as a heatmap of its last two), ``"vector"``,
    ``"text"``, ``"bytes"``, ``"time"``, ``"label"`` (a scalar integer or bool) or ``"scalar"``."""
    cid = _codec_id(f)
    if cid in _IMAGE_CODECS:
        return "image"
    if cid in _AUDIO_CODECS:
        return "audio"
    if f.is_text:
        return "text"
    if f.is_bytes:
        return "bytes"
    if f.is_time:
        return "time"
    dt = np.dtype(f.dtype)
    shape = f.shape
    if dt in (np.uint8, np.uint16) and (
        len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 2, 3, 4))
    ):
        return "image"
    if dt.kind == "f" and shape == (None,):
        return "audio"
    if shape == ():
        return "label" if dt.kind in "biu" else "scalar"
    if len(shape) >= 2 and dt.kind in "biufc":
        return "array"
    return "vector"


def _find_rate(obj: Any, name: str, depth: int = 0) -> int | None:
    """A ``sample_rate``/``sampling_rate`` for field ``name`` in a JSON-like attribute tree: under
    ``audio.<name>``, ``<name>``, or at its top."""
    if not isinstance(obj, Mapping) or depth > 3:
        return None
    for key in ("sample_rate", "sampling_rate"):
        v = obj.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 1 <= v <= 10_000_000:
            return int(v)
    for key in ("audio", name):
        sub = obj.get(key)
        if isinstance(sub, Mapping):
            found = _find_rate(sub.get(name, sub) if key == "audio" else sub, name, depth + 1)
            if found:
                return found
    for sub in obj.values():  # one level of namespaces: attrs["huggingface"]["audio"][name]
        if isinstance(sub, Mapping) and depth == 0 and isinstance(sub.get("audio"), Mapping):
            found = _find_rate(sub["audio"].get(name), name, depth + 1)
            if found:
                return found
    return None


def sample_rate(f: Field, attrs: Mapping[str, Any] | None) -> int | None:
    """An audio field's sample rate: its codec's ``sample_rate``, else the dataset attributes'
    (``attrs["audio"][name]["sample_rate"]``, ``attrs[name]["sample_rate"]``, the Hugging Face
    ingest's ``attrs["huggingface"]["audio"][name]["sampling_rate"]``, a top-level
    ``attrs["sample_rate"]``); None when none is found."""
    return _find_rate(dict(f.codec), f.name) or _find_rate(attrs or {}, f.name)


def class_names(f: Field, attrs: Mapping[str, Any] | None) -> list[str] | None:
    """The names of an integer label field's classes, from the attributes the ingests write:
    ``attrs["huggingface"]["class_names"][name]``, or ``attrs["images"]["classes"]`` for a field
    named ``label``; None otherwise. Names are cut to a bounded length."""
    attrs = attrs or {}
    found = None
    hf = attrs.get("huggingface")
    if isinstance(hf, Mapping) and isinstance(hf.get("class_names"), Mapping):
        found = hf["class_names"].get(f.name)
    images = attrs.get("images")
    if found is None and f.name == "label" and isinstance(images, Mapping):
        found = images.get("classes")
    if isinstance(found, list) and all(isinstance(x, str) for x in found[:100_000]):
        return [clip(x, 60) for x in found[:100_000]]
    return None


# -- reading within bounds -----------------------------------------------------------------------
def _ref_columns(reader: Any, ids: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """The heap references (offset, nbytes, shape) of ``names`` in the rows ``ids``: read from
    the row table alone (each reference gathered as raw bytes), no payload read."""
    plans = []
    for name in names:
        p = reader._plans[name]
        ref = heap_ref_dtype(p.field)
        plans.append(
            FieldPlan(Field(name, "u1", (ref.itemsize,)), True, True, p.offset, ref.itemsize, 0, -1)
        )
    got = reader._gatherer.gather(ids, plans)
    return {
        name: np.ascontiguousarray(got.columns[name])
        .view(heap_ref_dtype(reader._plans[name].field))
        .reshape(-1)
        for name in names
    }


def _too_big(f: Field, nbytes: int, shape: Sequence[int] | None) -> str | None:
    """Why a value of stored size ``nbytes`` and shape ``shape`` is not read, or None."""
    if f.is_text or f.is_bytes:
        limit = MAX_TEXT_BYTES
        return f"{nbytes:,} bytes: not read (over {limit:,})" if nbytes > limit else None
    if nbytes > MAX_VALUE_BYTES:
        return f"{nbytes:,} stored bytes: not read (over {MAX_VALUE_BYTES:,})"
    if shape is not None:
        decoded = math.prod(int(d) for d in shape) * np.dtype(f.storage_dtype).itemsize
        if decoded > MAX_VALUE_BYTES:
            dims = "x".join(str(int(d)) for d in shape)
            return f"{dims} {f.dtype}: too large to show ({decoded:,} bytes)"
    return None


class Reduced(np.ndarray):
    """An image decoded smaller than it is stored, for a view: ``full_shape`` is its own."""

    full_shape: tuple = ()


def _reducible(f: Field) -> bool:
    """Whether the JPEG kernel decodes ``f`` at a reduced size (``decode=`` image ops)."""
    return _codec_id(f) == "jpeg" and (len(f.shape) == 2 or f.shape[2] in (1, 3))


def _reduced(reader: Any, f: Field, row: int, shape: Sequence[int], side: int = 128) -> Any:
    """Row ``row`` of the jpeg field ``f`` (stored ``shape``) decoded by the reader's JPEG kernel
    to at most ``side`` pixels a side (DCT scaling: a huge image never decoded whole), as a
    :class:`Reduced`; a :class:`Skipped` when it does not decode."""
    h, w = int(shape[0]), int(shape[1])
    k = max(h, w) / side
    op = Resize((max(1, round(h / k)), max(1, round(w / k))))
    try:
        batches = reader.batches(
            1,
            shuffle="none",
            keep=reader.keep_mask(rows=[row]),
            fields=[f.name],
            decode={f.name: op},
            num_threads=1,
        )
        a = np.asarray(next(iter(batches))[f.name][0]).view(Reduced)
    except (CodecError, FormatError) as exc:
        return Skipped(f"{'x'.join(map(str, shape))} jpeg: not decoded ({exc})")
    a.full_shape = tuple(int(d) for d in shape)
    return a


def read_sample(
    reader: Any, rows: Sequence[int] | np.ndarray, fields: Sequence[str] | None = None
) -> dict[str, list[Any]]:
    """The values of ``fields`` (default all) in ``rows`` (dataset row numbers), per field a list:
    arrays (images decoded by the reader), str/bytes, ``None`` for nulls, :class:`Skipped` for
    values over the bounds (see the module). Reads the row table of those rows, then only the
    values within bounds; a JPEG image over them is decoded smaller by the reader's kernel
    (``decode=`` :class:`~rowstore.reader.image_ops.Resize`, a :class:`Reduced`)."""
    schema = reader.schema.select(fields)
    rows = np.asarray(rows, np.int64).reshape(-1)
    n = len(rows)
    out: dict[str, list[Any]] = {f.name: [None] * n for f in schema}
    if n == 0:
        return out
    ok: dict[str, np.ndarray] = {}
    heap = [f.name for f in schema if not f.inline]
    refs = _ref_columns(reader, reader._global_rows(rows), heap) if heap else {}
    for f in schema:
        mask = np.ones(n, bool)
        if f.inline:
            why = _too_big(f, f.stored_nbytes or 0, f.shape)  # a fixed shape: known
            if why:
                mask[:] = False
                out[f.name] = [Skipped(why)] * n
        else:
            r = refs[f.name]
            var = iter(range(len(f.variable_dims)))
            where = [next(var) if d is None else None for d in f.shape]
            for i in range(n):
                shape = [
                    int(r["shape"][i][j]) if j is not None else d for j, d in zip(where, f.shape)
                ]
                why = _too_big(f, int(r["nbytes"][i]), None if f.is_text or f.is_bytes else shape)
                if why:
                    mask[i] = False
                    small = int(r["nbytes"][i]) <= MAX_VALUE_BYTES and _reducible(f)
                    out[f.name][i] = (
                        _reduced(reader, f, int(rows[i]), shape) if small else Skipped(why)
                    )
        ok[f.name] = mask
    groups: dict[bytes, list[str]] = {}
    for name, mask in ok.items():
        if mask.any():
            groups.setdefault(mask.tobytes(), []).append(name)
    for key, names in groups.items():
        mask = np.frombuffer(key, bool)
        idx = np.flatnonzero(mask)
        batch = reader.take(rows[idx], fields=names, varlen="ragged")
        for name in names:
            col = batch[name]
            nulls = batch.get(name + NULL_KEY)
            for j, k in enumerate(idx):
                out[name][k] = None if nulls is not None and nulls[j] else col[j]
    return out


# -- a value as text or a picture ----------------------------------------------------------------
def value_text(v: Any, limit: int = 80) -> str:
    """A short text of one value: scalars as they are, small arrays in full, larger ones as
    dtype, shape and range; strings cut to ``limit`` characters."""
    if v is None:
        return "None"
    if isinstance(v, Skipped):
        return str(v)
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, Reduced):
        dims = "x".join(map(str, v.full_shape))
        return f"{v.dtype}[{dims}], shown decoded at {v.shape[1]}x{v.shape[0]}"
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, np.ndarray):
        if v.size <= 8 and v.ndim == 1:
            return clip(np.array2string(v, separator=", ", threshold=8, precision=4), limit)
        desc = f"{v.dtype}{list(v.shape)}"
        if v.size and v.dtype.kind in "biuf":
            finite = v[np.isfinite(v)] if v.dtype.kind == "f" else v
            if finite.size:
                desc += (
                    f" min={finite.min():.4g} max={finite.max():.4g} "
                    f"mean={finite.astype(np.float64).mean():.4g}"
                )
            else:
                desc += " (no finite value)"
        return desc
    if isinstance(v, (str, bytes)):
        return clip(repr(v), limit)
    return clip(repr(v), limit)


def _img(pic: np.ndarray, alt: str, cls: str = "rs-thumb") -> Html:
    uri = _pictures.data_uri(_pictures.png_bytes(pic), "image/png")
    h, w = pic.shape[:2]
    return Html(f'<img class="{cls}" src="{uri}" width="{w}" height="{h}" alt="{esc(alt)}">')


def _slice2d(a: np.ndarray) -> np.ndarray:
    """The first 2-D slice over the last two dimensions."""
    while a.ndim > 2:
        a = a[0]
    return a


def picture_html(
    name: str,
    v: Any,
    kind: str,
    *,
    rate: int | None = None,
    max_side: int = 96,
    player: bool = False,
    spectrogram: bool = True,
) -> Html | None:
    """A picture of value ``v`` of field ``name`` whose :func:`field_kind` is ``kind`` (None when
    that kind has none, or the value is empty):
    an image thumbnail, a heatmap of an array's first 2-D slice, or an audio waveform (and its
    spectrogram with ``spectrogram``; and an ``<audio>`` player of a bounded preview with
    ``player`` when the sample ``rate`` is known)."""
    if not isinstance(v, np.ndarray) or v.size == 0:
        return None
    try:
        if kind == "image":
            a = v if v.ndim == 2 or (v.ndim == 3 and v.shape[2] in (1, 2, 3, 4)) else _slice2d(v)
            return _img(_pictures.thumbnail(a, max_side=max_side), f"{name} image")
        if kind == "array" and v.ndim >= 2 and v.dtype.kind in "biufc":
            return _img(_pictures.thumbnail(_slice2d(v), max_side=max_side), f"{name} heatmap")
        if kind == "audio" and v.ndim == 1 and v.dtype.kind in "iuf":
            parts = [_pictures.svg_waveform(v, width=2 * max_side, height=48)]
            if spectrogram:
                spec = _pictures.spectrogram(v, width=2 * max_side, height=48)
                parts.append(_img(spec, f"{name} spectrogram", "rs-spec"))
            if player and rate:
                uri = _pictures.data_uri(_pictures.wav_bytes(v, rate), "audio/wav")
                parts.append(f'<audio controls preload="none" src="{uri}"></audio>')
            return Html("".join(parts))
    except ValueError:
        return None
    return None


def cell_html(name: str, v: Any, kind: str, **picture: Any) -> Html:
    """One value for a table cell: its picture (:func:`picture_html`) over its text, or the
    text alone."""
    pic = picture_html(name, v, kind, **picture) if isinstance(v, np.ndarray) else None
    text = esc(value_text(v))
    if pic is None:
        return text
    return Html(f'{pic}<div class="rs-dim">{text}</div>')
