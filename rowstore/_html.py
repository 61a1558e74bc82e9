"""HTML building blocks of rowstore's views: escaping, tables, collapsible sections, the schema
and the stored statistics as HTML and as bounded text.

The views of every layer use them: ``Schema._repr_html_`` (this module has no rowstore import,
so the schema layer may use it), the reader's notebook views (:mod:`rowstore.reader.view`) and
the report page (:mod:`rowstore.inspect`). Two rules hold everywhere:

* **Every text is escaped.** A value reaches the page only through :func:`esc` (which cuts it
  to a bounded length, then ``html.escape``\\ s it, quotes included) or as :class:`Html`, the
  marker of markup built here from escaped parts. :func:`table` escapes every cell that is not
  :class:`Html`. A string value of a dataset holding ``<script>`` shows as that text.
* **Everything is bounded.** Texts are cut (:data:`TEXT_LIMIT` characters), tables and lists
  are cut (:data:`MAX_FIELDS` fields, :data:`MAX_VALUES` values), so a view of a dataset with
  thousands of fields or megabyte strings stays small.

The statistics are read by attribute (``count``, ``nulls``, ``nan``, ``inf``, ``min``, ``max``,
``mean``, ``std`` or ``var``, ``histogram``, ``values``, ``lengths``, ``images``, ``audio``): any
object with them renders, and a missing one is left out.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rowstore import _pictures

__all__ = [
    "Html",
    "esc",
    "clip",
    "size_text",
    "details",
    "cut_rows",
    "table",
    "style",
    "shape_text",
    "codec_text",
    "schema_rows",
    "schema_html",
    "schema_text",
    "stats_numbers",
    "field_stats_html",
    "TEXT_LIMIT",
    "MAX_FIELDS",
    "MAX_VALUES",
]

#: Characters of one value's text shown at most (the rest cut, an ellipsis added).
TEXT_LIMIT = 120
#: Fields listed at most by one view (the rest counted).
MAX_FIELDS = 64
#: Distinct values (top-k counts) drawn at most per field.
MAX_VALUES = 20
#: Most frequent values drawn in a field's statistics card.
CARD_VALUES = 8
#: Lines of a plain-text repr at most: one screen.
MAX_LINES = 40


class Html(str):
    """A string of markup built from escaped parts: :func:`table` and :func:`esc` pass it as
    it is. Only this module and the views make one."""

    __slots__ = ()


def clip(text: Any, limit: int = TEXT_LIMIT) -> str:
    """``str(text)`` cut to ``limit`` characters (an ellipsis marks the cut); control
    characters other than tab and newline shown as ``\\xNN``."""
    s = text if isinstance(text, str) else str(text)
    if len(s) > limit:
        s = s[: max(limit - 1, 0)] + "\u2026"
    if any(ord(ch) < 32 and ch not in "\t\n" for ch in s):
        s = "".join(ch if ord(ch) >= 32 or ch in "\t\n" else f"\\x{ord(ch):02x}" for ch in s)
    return s


def esc(value: Any, limit: int = TEXT_LIMIT) -> Html:
    """``value`` as escaped text (cut to ``limit`` characters first); :class:`Html` as is."""
    if isinstance(value, Html):
        return value
    return Html(html.escape(clip(value, limit), quote=True))


def details(summary: Any, body: Any, *, open: bool = False, cls: str = "") -> Html:  # noqa: A002
    """A collapsible section (``<details>``): ``summary`` (text or :class:`Html`) always shown,
    ``body`` on a click."""
    o = " open" if open else ""
    c = f' class="{html.escape(cls)}"' if cls else ""
    return Html(f"<details{c}{o}><summary>{esc(summary)}</summary>{esc(body)}</details>")


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], *, cls: str = "rs-table") -> Html:
    """A table; each cell escaped unless it is :class:`Html`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return Html(
        f'<table class="{html.escape(cls)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table>"
    )


#: The views' style sheet, scoped to ``.rs-view`` (a notebook's own styles are left alone);
#: Jupyter's theme colours when there are any.
CSS = """
.rs-view{--rs-fg:var(--jp-content-font-color0,#1f2328);--rs-dim:var(--jp-content-font-color2,#656d76);
--rs-bg:var(--jp-layout-color0,#fff);--rs-alt:var(--jp-layout-color2,#f6f8fa);
--rs-line:var(--jp-border-color2,#d0d7de);--rs-accent:#2f6fbf;
font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;font-size:13px;color:var(--rs-fg);
line-height:1.4;max-width:1200px}
.rs-view .rs-head{font-weight:600;font-size:14px;margin:2px 0 6px}
.rs-view .rs-dim{color:var(--rs-dim)}
.rs-view details{margin:4px 0;border-left:2px solid var(--rs-line);padding-left:8px}
.rs-view summary{cursor:pointer;font-weight:600;padding:2px 0}
.rs-view table.rs-table{border-collapse:collapse;margin:4px 0;font-size:12px}
.rs-view table.rs-table th{text-align:left;font-weight:600;border-bottom:1px solid var(--rs-line);
padding:2px 10px 2px 0}
.rs-view table.rs-table td{padding:2px 10px 2px 0;vertical-align:top;
font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;max-width:480px;
overflow-wrap:anywhere}
.rs-view table.rs-table tr:nth-child(even) td{background:var(--rs-alt)}
.rs-view .rs-grid{display:flex;flex-wrap:wrap;gap:8px;margin:4px 0}
.rs-view figure{margin:0;text-align:center;font-size:11px;max-width:300px}
.rs-view figure img{display:block;image-rendering:pixelated;border:1px solid var(--rs-line);
margin:0 auto}
.rs-view figcaption{overflow-wrap:anywhere}
.rs-view .rs-card{display:inline-block;vertical-align:top;border:1px solid var(--rs-line);
border-radius:4px;padding:6px 8px;margin:4px 8px 4px 0;min-width:260px}
.rs-view .rs-note{color:var(--rs-dim);font-style:italic}
.rs-view .rs-bad{color:#b42318;font-weight:600}
.rs-view .rs-good{color:#1a7f37;font-weight:600}
.rs-view svg.rs-chart{display:block;overflow:visible;margin:2px 0}
.rs-view svg .rs-bar{fill:var(--rs-accent)}
.rs-view svg .rs-dot{fill:var(--rs-accent);fill-opacity:.6}
.rs-view svg .rs-wave{fill:var(--rs-accent);stroke:var(--rs-accent);stroke-width:.5}
.rs-view svg .rs-axis{stroke:var(--rs-dim);stroke-width:1}
.rs-view svg .rs-tick{fill:var(--rs-dim);font-size:10px}
.rs-view audio{width:256px;height:28px;display:block;margin:2px auto}
"""


def style() -> Html:
    """The ``<style>`` element of :data:`CSS`."""
    return Html(f"<style>{CSS}</style>")


def size_text(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- the schema --------------------------------------------------------------------------------
def shape_text(shape: Sequence[int | None]) -> str:
    """``(None, 128, 3)``; ``(16,)``; ``()``."""
    dims = ", ".join("None" if d is None else str(d) for d in shape)
    return f"({dims}{',' if len(shape) == 1 else ''})"


def codec_text(codec: Mapping[str, Any]) -> str:
    """``png(level=1)``, ``raw``."""
    rest = ", ".join(f"{k}={v}" for k, v in codec.items() if k != "id")
    return str(codec.get("id", "?")) + (f"({rest})" if rest else "")


def _dtype_text(dtype: Any) -> str:
    return dtype if isinstance(dtype, str) else str(dtype)


def schema_rows(schema: Iterable[Any]) -> list[list[str]]:
    """Per field: name, dtype, shape, codec, where it is stored (row or heap), nullable."""
    return [
        [
            f.name,
            _dtype_text(f.dtype),
            shape_text(f.shape),
            codec_text(f.codec),
            "row" if f.inline else "heap",
            "yes" if f.nullable else "",
        ]
        for f in schema
    ]


SCHEMA_HEADER = ["field", "dtype", "shape", "codec", "stored in", "nullable"]


def cut_rows(rows: list, limit: int, what: str, *, total: int | None = None) -> tuple[list, Html]:
    """The first ``limit`` of ``rows``, and a note counting the rest (of ``total``, default
    ``len(rows)``; empty when none is left out)."""
    total = len(rows) if total is None else total
    if total <= limit:
        return rows, Html("")
    more = total - limit
    return rows[:limit], Html(f'<div class="rs-note">... and {more:,} more {esc(what)}</div>')


def schema_table(schema: Iterable[Any], *, limit: int = MAX_FIELDS) -> Html:
    """The schema as a table (at most ``limit`` fields, the rest counted)."""
    rows, more = cut_rows(schema_rows(schema), limit, "fields")
    return Html(table(SCHEMA_HEADER, rows) + more)


def schema_html(schema: Sequence[Any]) -> Html:
    """A schema's notebook view: its fields in a collapsible table."""
    n = len(schema)
    head = f"rowstore.Schema: {n} field{'s' if n != 1 else ''}"
    return Html(
        f'<div class="rs-view">{style()}'
        + details(head, schema_table(schema), open=True)
        + "</div>"
    )


def schema_text(schema: Sequence[Any], *, limit: int = MAX_LINES - 4) -> str:
    """A schema as text, one field a line, at most ``limit`` fields (then a count)."""
    rows = schema_rows(schema)
    shown = rows[:limit]
    width = [max(len(r[i]) for r in shown) for i in range(4)]
    lines = [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], width)) + ("  nullable" if r[5] else "")
        for r in shown
    ]
    if len(rows) > limit:
        lines.append(f"  ... and {len(rows) - limit:,} more fields")
    return "\n".join(lines)


# -- statistics --------------------------------------------------------------------------------
def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except (KeyError, TypeError, ValueError):  # a statistic this kind of field does not keep
        return None


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.6g}"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return clip(v, 40)
    return _fmt(int(f) if f.is_integer() and abs(f) < 2**53 and "int" in type(v).__name__ else f)


def _std(fs: Any) -> Any:
    std = _get(fs, "std")
    if std is None:
        var = _get(fs, "var")
        if isinstance(var, (int, float)) and var >= 0:
            std = math.sqrt(var)
    return std


#: The numbers of a field's statistics, in the order views show them.
STAT_KEYS = ("count", "nulls", "nan", "inf", "min", "max", "mean", "std")


def _time_text(v: Any, dtype: Any, key: str) -> str | None:
    """A datetime64/timedelta64 field's statistic (a count of its unit) as a time, or None
    for other fields."""
    dt = getattr(dtype, "kind", None)
    if dt not in ("M", "m") or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    unit = str(dtype)[str(dtype).index("[") + 1 : -1]
    if key == "std" or dt == "m":
        return f"{_fmt(v)} {unit}"
    return str(np.array(int(round(v)), np.int64).view(f"M8[{unit}]"))


def stats_numbers(fs: Any, dtype: Any = None) -> dict[str, str]:
    """The numbers of one field's statistics, formatted (only those it has); ``dtype`` a
    datetime64/timedelta64 dtype: min, max and mean as times, std in its unit."""
    out = {}
    for k in STAT_KEYS:
        v = _std(fs) if k == "std" else _get(fs, k)
        if v is not None and not (k in ("nan", "inf") and v == 0 and _get(fs, "count") is None):
            t = _time_text(v, dtype, k) if k in ("min", "max", "mean", "std") else None
            out[k] = _fmt(v) if t is None else t
    return out


def top_values(fs: Any) -> tuple[list[tuple[Any, int]], int] | None:
    """A field's most frequent values as ``([(value, count), ...], other)``, from its
    ``values`` statistic, ``(pairs, other, complete)``; None without."""
    v = _get(fs, "values")
    if v is None:
        return None
    pairs, other = v[0], v[1]
    return [(x, int(c)) for x, c in pairs], int(other or 0)


def _histogram(fs: Any) -> tuple[Sequence[float], Sequence[int]] | None:
    h = _get(fs, "histogram")
    return None if h is None else (h[0], h[1])


def _summary_rows(obj: Any, limit: int = 12) -> list[list[str]]:
    """A small summary object (images', audio's) as (key, value) rows."""
    if obj is None:
        return []
    if not isinstance(obj, Mapping):
        to_dict = getattr(obj, "to_dict", None)
        obj = to_dict() if callable(to_dict) else getattr(obj, "__dict__", {"": obj})
    rows = []
    for k, v in list(obj.items())[:limit]:
        if _get(v, "max") is not None and not isinstance(v, (int, float, str)):
            lo, hi, mean = _fmt(_get(v, "min")), _fmt(_get(v, "max")), _get(v, "mean")
            v = (lo if lo == hi else f"{lo} .. {hi}") + (
                f" (mean {mean:.4g})" if isinstance(mean, float) and lo != hi else ""
            )
        elif isinstance(v, Mapping):
            v = ", ".join(f"{a}: {_fmt(b)}" for a, b in list(v.items())[:MAX_VALUES])
        elif isinstance(v, (list, tuple)):
            v = ", ".join(
                _fmt(x) if not isinstance(x, (list, tuple)) else "x".join(map(_fmt, x))
                for x in list(v)[:MAX_VALUES]
            )
        rows.append([clip(k, 40), clip(_fmt(v) if not isinstance(v, str) else v, TEXT_LIMIT)])
    return rows


def value_label(value: Any, names: Sequence[str] | None = None) -> str:
    """A value as a bar's label: ``3 (cat)`` with class names."""
    if names is not None and isinstance(value, int) and 0 <= value < len(names):
        return f"{value} ({names[value]})"
    if isinstance(value, bytes):
        return repr(value)
    return str(value)


def field_stats_html(
    name: str,
    fs: Any,
    *,
    kind: str = "",
    class_names: Sequence[str] | None = None,
    dtype: Any = None,
) -> Html:
    """One field's statistics as a card: its numbers, a histogram, the counts of its most
    frequent values (``class_names`` label integer values), lengths, image and audio
    summaries. ``fs`` None: the card says no statistics are stored."""
    parts = [f'<div class="rs-head">{esc(name)} <span class="rs-dim">{esc(kind)}</span></div>']
    if fs is None:
        parts.append('<div class="rs-note">no statistics stored</div>')
        return Html('<div class="rs-card">' + "".join(parts) + "</div>")
    nums = stats_numbers(fs, dtype)
    if nums:
        parts.append(table(list(nums), [list(nums.values())]))
    nan = _get(fs, "nan")
    elements = _get(fs, "elements")
    elements = _get(fs, "count") if elements is None else elements
    if isinstance(elements, int) and isinstance(nan, int) and elements and nan == elements:
        parts.append('<div class="rs-bad">every value is NaN</div>')
    hist = _histogram(fs)
    if hist is not None and len(hist[1]):
        try:
            parts.append(_pictures.svg_histogram(*hist))
        except ValueError as exc:
            parts.append(f'<div class="rs-note">histogram not drawn: {esc(exc)}</div>')
    top = top_values(fs)
    if top is not None and top[0]:
        pairs, other = top
        other += sum(c for _, c in pairs[CARD_VALUES:])  # the values not drawn count as other
        pairs = pairs[:CARD_VALUES]
        labels = [value_label(v, class_names) for v, _ in pairs]
        counts = [c for _, c in pairs]
        total = sum(counts) + other
        if other:
            labels.append("(other)")
            counts.append(other)
        parts.append('<div class="rs-dim">most frequent values</div>')
        parts.append(_pictures.svg_bars(labels, counts, total=total))
    lengths = _get(fs, "lengths")
    if lengths is not None:
        ln = stats_numbers(lengths)
        if ln:
            parts.append('<div class="rs-dim">lengths</div>' + table(list(ln), [list(ln.values())]))
    for what in ("images", "audio"):
        rows = _summary_rows(_get(fs, what))
        if rows:
            parts.append(f'<div class="rs-dim">{what}</div>' + table(["", ""], rows))
    return Html('<div class="rs-card">' + "".join(parts) + "</div>")
