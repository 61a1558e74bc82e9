"""Notebook views: what Jupyter shows for a :class:`~rowstore.reader.Reader`, a
:class:`~rowstore.reader.mix.Mixture` and a batch, as HTML (``_repr_html_``) and as text.

The HTML is collapsible like xarray's (``<details>``): the fields (dtype, shape, codec, and
their stored statistics when the file has some), each field's statistics with a histogram, a
few sample rows (images as thumbnails, arrays as heatmaps, audio as waveforms), the dataset's
attributes. It holds no script, escapes every text (:mod:`rowstore._html`) and is bounded: a
fixed number of sample rows, each read within :data:`~rowstore.reader.samples.MAX_VALUE_BYTES`
(:func:`~rowstore.reader.samples.read_sample`), thumbnails of at most 96 pixels a side, at most
:data:`~rowstore._html.MAX_FIELDS` fields. The text reprs are one screen at most
(:data:`~rowstore._html.MAX_LINES` lines) and read nothing but the schema.

Batches are plain dicts, so they have no repr of their own: :func:`show` wraps one (or a
reader, a mixture, a schema) in an object whose ``_repr_html_`` draws it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from rowstore import _html
from rowstore._html import Html, details, esc, style, table
from rowstore.reader.buffers import Ragged
from rowstore.reader.samples import (
    cell_html,
    class_names,
    field_kind,
    picture_html,
    read_sample,
    sample_rate,
    sample_rows,
    value_text,
)

__all__ = ["show", "View", "reader_html", "reader_text", "mixture_html", "mixture_text"]

#: Sample rows a notebook view reads and draws.
VIEW_ROWS = 8
#: Sample rows whose audio is drawn at most (a spectrogram is the largest picture).
AUDIO_PICTURES = 12


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def stats_of(reader: Any) -> tuple[Any, str | None]:
    """``(reader.stats(), None)``, or ``(None, why)``: the reader has no ``stats`` (a build
    without them), the file keeps none, or reading them failed (the error's text)."""
    get = getattr(reader, "stats", None)
    if not callable(get):
        return None, "no statistics stored"
    try:
        st = get()
    except Exception as exc:  # a view must show a damaged file, not fail: say what went wrong
        return None, f"statistics not readable: {type(exc).__name__}: {exc}"
    return (st, None) if st is not None else (None, "no statistics stored")


def _field_stats(st: Any, name: str) -> Any:
    fields = getattr(st, "fields", None)
    if isinstance(fields, Mapping):
        return fields.get(name)
    return None


# -- a reader ---------------------------------------------------------------------------------
def _where(reader: Any) -> str:
    L = reader.layout
    rows = f"{len(reader)} row{'' if len(reader) == 1 else 's'}"  # as the repr always said
    parts = [rows + (f" in {L.num_shards} shards" if L.num_shards != 1 else "")]
    if L.version is not None:
        parts.append(f"version {L.version}")
    elif L.shard_layouts and len(L.shard_layouts) == 1:
        parts.append(f"format v{L.shard_layouts[0].version}")
    return ", ".join(parts)


def reader_text(reader: Any) -> str:
    """``<rowstore.Reader PATH: N rows, ...>`` and one line per field (bounded)."""
    head = f"<rowstore.Reader {_html.clip(reader.path, 200)!r}: {_where(reader)}>"
    return head + "\n" + _html.schema_text(reader.schema)


def fields_table(schema: Any, st: Any) -> Html:
    """The schema's table, with each field's stored count, nulls, min, max and mean when
    ``st`` (the statistics) has them."""
    header = list(_html.SCHEMA_HEADER)
    rows = _html.schema_rows(schema)
    if st is not None:
        keys = ["count", "nulls", "min", "max", "mean"]
        header += keys
        for row, f in zip(rows, schema):
            nums = _html.stats_numbers(_field_stats(st, f.name) or {}, f.dtype)
            row += [nums.get(k, "") for k in keys]
    shown, more = _html.cut_rows(rows, _html.MAX_FIELDS, "fields")
    return Html(table(header, shown) + more)


def stats_cards(schema: Any, st: Any, attrs: Mapping | None) -> Html:
    """Each field's statistics as a card (:func:`rowstore._html.field_stats_html`)."""
    cards = []
    for f in list(schema)[: _html.MAX_FIELDS]:
        kind = f"{f.dtype}{_html.shape_text(f.shape) if f.shape else ''}"
        cards.append(
            _html.field_stats_html(
                f.name,
                _field_stats(st, f.name),
                kind=kind,
                class_names=class_names(f, attrs),
                dtype=f.dtype,
            )
        )
    return Html("".join(cards))


def _caption(schema: Any, values: dict, i: int, row: int, names: dict) -> str:
    """``row 17 · label 3 (cat)``: a sample's row and its first two label-like fields' values
    (integer labels with their class ``names``, by field)."""
    parts = [f"row {row:,}"]
    for kinds in (("label",), ("text",)):
        for f in schema:
            if field_kind(f) in kinds and len(parts) < 3:
                v = values[f.name][i]
                if isinstance(v, np.ndarray) and v.ndim == 0:
                    v = v.item()
                text = (
                    _html.value_label(v, names.get(f.name))
                    if isinstance(v, int) and not isinstance(v, bool)
                    else value_text(v, 32)
                )
                parts.append(f"{f.name} {_html.clip(text, 40)}")
    return " \u00b7 ".join(parts)


def samples_html(
    reader: Any,
    rows: np.ndarray,
    *,
    max_side: int = 96,
    players: int = 0,
    values: dict | None = None,
) -> Html:
    """The sample ``rows``: per image, array or audio field a grid of pictures captioned with
    the row and its label-like fields (audio: a waveform; with ``players`` > 0 also a
    spectrogram, and for the first ``players`` rows a player when the sample rate is known);
    then a table of every field's values. ``values``: what :func:`read_sample` gave for
    ``rows`` (default: read here)."""
    schema = reader.schema
    attrs = reader.layout.user_attrs
    if values is None:
        values = read_sample(reader, rows)
    names = {f.name: class_names(f, attrs) for f in schema if field_kind(f) == "label"}
    out = []
    for f in list(schema)[: _html.MAX_FIELDS]:
        kind = field_kind(f)
        if kind not in ("image", "array", "audio"):
            continue
        rate = sample_rate(f, attrs) if kind == "audio" else None
        figs = []
        shown = rows[:AUDIO_PICTURES] if kind == "audio" else rows
        for i, row in enumerate(shown):
            v = values[f.name][i]
            pic = picture_html(
                f.name,
                v,
                kind,
                rate=rate,
                max_side=max_side,
                player=i < players,
                spectrogram=players > 0,
            )
            if pic is None:
                pic = esc(value_text(v))
            cap = _caption(schema, values, i, int(row), names)
            figs.append(f"<figure>{pic}<figcaption>{esc(cap)}</figcaption></figure>")
        what = {"image": "images", "array": "first 2-D slice", "audio": "waveform, spectrogram"}
        note = (
            f" (sample rate {rate:,} Hz)"
            if rate
            else " (sample rate unknown)"
            if kind == "audio"
            else ""
        )
        out.append(
            f'<div class="rs-dim">{esc(f.name)}: {esc(what[kind])}{esc(note)}</div>'
            f'<div class="rs-grid" data-field="{esc(f.name)}">{"".join(figs)}</div>'
        )
    cols = [f.name for f in list(schema)[: _html.MAX_FIELDS]]
    body = [
        [f"{int(row):,}"] + [esc(value_text(values[n][i])) for n in cols]
        for i, row in enumerate(rows)
    ]
    out.append(table(["row"] + cols, body))
    return Html("".join(out))


def attrs_html(attrs: Mapping | None, limit: int = 4000) -> Html:
    """The dataset's attributes as JSON (cut to ``limit`` characters)."""
    text = json.dumps(attrs or {}, indent=1, sort_keys=True, default=str)
    return Html(f"<pre>{esc(text, limit)}</pre>")


def reader_body(reader: Any, *, rows: int = VIEW_ROWS, open_fields: bool = True) -> Html:
    """A reader's sections: fields, statistics, samples, attributes."""
    st, why = stats_of(reader)
    attrs = reader.layout.user_attrs
    n = len(reader.schema)
    parts: list[str] = [
        details(f"Fields ({n:,})", fields_table(reader.schema, st), open=open_fields)
    ]
    if st is not None:
        parts.append(details("Statistics", stats_cards(reader.schema, st, attrs)))
    else:
        parts.append(f'<div class="rs-note">{esc(why)}</div>')
    picked = sample_rows(len(reader), rows)
    if len(picked):
        try:
            sample = samples_html(reader, picked)
        except Exception as exc:  # a damaged file: the view says so instead of failing
            sample = Html(f'<div class="rs-bad">samples not readable: {esc(exc)}</div>')
        parts.append(details(f"Samples ({len(picked)} rows, seed 0)", sample, open=True))
    if attrs:
        parts.append(details("Attributes", attrs_html(attrs)))
    return Html("".join(parts))


def reader_html(reader: Any) -> Html:
    """A reader's notebook view."""
    head = (
        f'<div class="rs-head">rowstore.Reader <span class="rs-dim">{esc(reader.path, 200)}'
        f"</span></div><div>{esc(_where(reader))}</div>"
    )
    return Html(f'<div class="rs-view">{style()}{head}{reader_body(reader)}</div>')


# -- a mixture ---------------------------------------------------------------------------------
def mixture_text(mix: Any) -> str:
    """``<rowstore.Mixture ...>``, one line per source (bounded) and the fields."""
    n = len(mix.sources)
    lines = [
        f"<rowstore.Mixture: {_plural(n, 'source')}, {mix.epoch_rows:,} rows per epoch, "
        f"replacement={mix.replacement}>"
    ]
    shown = min(n, _html.MAX_LINES // 2)
    for p, w, c, s in list(zip(mix._paths, mix.weights, mix.counts, mix.sizes))[:shown]:
        lines.append(f"  {_html.clip(p, 80)!r}: weight {w:.3g}, {int(c):,} of {int(s):,} rows")
    if n > shown:
        lines.append(f"  ... and {n - shown:,} more sources")
    lines.append(_html.schema_text(mix.schema, limit=_html.MAX_LINES - shown - 4))
    return "\n".join(lines)


def mixture_html(mix: Any) -> Html:
    """A mixture's notebook view: its sources (weight, rows per epoch), fields, and each
    source's own view (collapsed)."""
    n = len(mix.sources)
    head = (
        f'<div class="rs-head">rowstore.Mixture</div><div>{esc(_plural(n, "source"))}, '
        f"{mix.epoch_rows:,} rows per epoch, replacement={esc(mix.replacement)}, "
        f"seed {mix.seed}</div>"
    )
    rows = [
        [k, p, f"{w:.3g}", f"{int(c):,}", f"{int(s):,}"]
        for k, (p, w, c, s) in enumerate(zip(mix._paths, mix.weights, mix.counts, mix.sizes))
    ]
    shown, more = _html.cut_rows(rows, _html.MAX_FIELDS, "sources")
    parts = [
        details(
            f"Sources ({n:,})",
            Html(table(["", "path", "weight", "rows per epoch", "rows"], shown) + more),
            open=True,
        ),
        details(f"Fields ({len(mix.schema):,})", fields_table(mix.schema, None), open=True),
    ]
    for k, r in list(enumerate(mix.sources))[:8]:
        parts.append(details(f"source {k}: {r.path}", reader_body(r, rows=4, open_fields=False)))
    return Html(f'<div class="rs-view">{style()}{head}{"".join(parts)}</div>')


# -- a batch -----------------------------------------------------------------------------------
def _column(v: Any) -> Any:
    """A batch column as an ndarray, a Ragged, or a list (str/bytes values)."""
    if isinstance(v, (np.ndarray, Ragged, list, tuple)):
        return v
    if hasattr(v, "numpy") and callable(v.numpy):  # a torch or tf tensor
        try:
            return np.asarray(v.numpy())
        except Exception:  # a tensor numpy cannot take (on a device): its text
            return [str(v)]
    return np.asarray(v)


def _array_kind(a: Any) -> str:
    """What one row's value looks like: image, array (a heatmap), audio (a long 1-D float), or
    empty (none drawn)."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return ""
    if a.dtype in (np.uint8, np.uint16) and (
        (a.ndim == 2 and min(a.shape) >= 8)
        or (a.ndim == 3 and a.shape[2] in (1, 2, 3, 4) and min(a.shape[:2]) >= 8)
    ):
        return "image"
    if a.ndim == 1 and a.dtype.kind == "f" and len(a) >= 1024:
        return "audio"
    if a.ndim >= 2 and a.dtype.kind in "biufc":
        return "array"
    return ""


def _describe(col: Any) -> tuple[str, str, str]:
    if isinstance(col, Ragged):
        shapes = col.shapes
        lo, hi = shapes.min(axis=0) if len(col) else (), shapes.max(axis=0) if len(col) else ()
        dims = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in zip(lo, hi))
        return "Ragged", str(col.dtype), f"({len(col)}; {dims})"
    if isinstance(col, np.ndarray):
        return "ndarray", str(col.dtype), _html.shape_text(col.shape)
    return type(col).__name__, "", f"({len(col)},)"


def _row(col: Any, i: int) -> Any:
    try:
        return col[i]
    except Exception:  # a column shorter than the batch
        return None


def batch_text(batch: Mapping[str, Any]) -> str:
    """One line per column (bounded): name, type, dtype, shape."""
    cols = {k: _column(v) for k, v in list(batch.items())[: _html.MAX_LINES - 2]}
    lines = [f"<rowstore batch: {_plural(len(batch), 'column')}>"]
    for k, col in cols.items():
        t, d, s = _describe(col)
        lines.append(f"  {_html.clip(k, 40)}  {t} {d} {s}".rstrip())
    if len(batch) > len(cols):
        lines.append(f"  ... and {len(batch) - len(cols):,} more columns")
    return "\n".join(lines)


def batch_html(batch: Mapping[str, Any], *, rows: int = VIEW_ROWS) -> Html:
    """A batch's view: its columns (type, dtype, shape), then its first ``rows`` rows, images
    and arrays drawn."""
    items = list(batch.items())[: _html.MAX_FIELDS]
    cols = {str(k): _column(v) for k, v in items}
    desc = [[k, *_describe(c)] for k, c in cols.items()]
    n = max((len(c) for c in cols.values()), default=0)
    k = min(n, rows)
    body = []
    for i in range(k):
        cells: list[Any] = [str(i)]
        for name, col in cols.items():
            v = _row(col, i)
            if isinstance(v, np.generic):
                v = np.asarray(v)
            cells.append(
                cell_html(name, v, _array_kind(v))
                if isinstance(v, np.ndarray)
                else esc(value_text(v))
            )
        body.append(cells)
    more = len(batch) - len(items)
    note = f'<div class="rs-note">... and {more:,} more columns</div>' if more > 0 else ""
    size = f"{_plural(n, 'row')}, {_plural(len(batch), 'column')}"
    head = f'<div class="rs-head">rowstore batch</div><div>{esc(size)}</div>'
    return Html(
        f'<div class="rs-view">{style()}{head}'
        + details(
            f"Columns ({len(batch):,})",
            Html(table(["column", "type", "dtype", "shape"], desc) + note),
            open=True,
        )
        + details(f"First {k} rows", table(["row", *cols], body), open=True)
        + "</div>"
    )


# -- show ----------------------------------------------------------------------------------------
class View:
    """What :func:`show` returns: ``_repr_html_`` and ``repr`` of the object it wraps."""

    def __init__(self, obj: Any):
        self.obj = obj

    def _repr_html_(self) -> str:
        obj = self.obj
        if isinstance(obj, Mapping):
            return batch_html(obj)
        html_of = getattr(obj, "_repr_html_", None)
        if callable(html_of):
            return html_of()
        raise TypeError(
            f"show() takes a batch (dict), a Reader, a Mixture or a Schema, got "
            f"{type(obj).__name__}"
        )

    def __repr__(self) -> str:
        obj = self.obj
        return batch_text(obj) if isinstance(obj, Mapping) else repr(obj)


def show(obj: Any) -> View:
    """Wrap a batch (a dict of arrays, :class:`~rowstore.reader.buffers.Ragged`, lists or
    tensors), a reader, a mixture or a schema so that a notebook draws it: the returned object's
    ``_repr_html_`` is the HTML view, its ``repr`` the bounded text.

    >>> rowstore.show(next(reader.batches(16)))  # doctest: +SKIP
    """
    if not isinstance(obj, Mapping) and not callable(getattr(obj, "_repr_html_", None)):
        raise TypeError(
            f"show() takes a batch (dict), a Reader, a Mixture or a Schema, got "
            f"{type(obj).__name__}"
        )
    return View(obj)
