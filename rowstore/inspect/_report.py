"""The report page: one self-contained HTML file that shows a dataset to a person.

Sections: an overview (rows, shards, blocks, sizes, compression), versions and shards, the
fields (with their stored statistics), a deterministic sample (a grid of images with their
labels, heatmaps of arrays, waveforms and spectrograms of audio with a short player, a table of
every field's values), each field's statistics with a histogram and its most frequent values,
label balance, the order quality of the file (:func:`rowstore.quality.order_quality` and a
plot of the field against the row position), the checksums of every chunk when asked
(``scan=True``), and the dataset's attributes.

What it reads is bounded whatever the dataset's size: the stored statistics, the sample rows
(read within bounds, :func:`rowstore.reader.samples.read_sample`) and :data:`QUALITY_ROWS`
values of one field (plus two spreads of :data:`QUALITY_BATCHES` batches). The page holds no
script, loads nothing (images, charts and audio are inline ``data:`` URIs and SVG), and its
Content-Security-Policy forbids scripts, so nothing in the data can run in it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from rowstore import _html, _pictures
from rowstore._html import Html, details, esc, table
from rowstore._version import __version__
from rowstore.errors import CodecError, FormatError
from rowstore.format import manifest
from rowstore.quality import default_field, order_quality
from rowstore.reader import Reader
from rowstore.reader.samples import class_names, field_kind, read_sample, sample_rows
from rowstore.reader.view import attrs_html, fields_table, samples_html, stats_cards, stats_of

__all__ = ["report", "report_html", "QUALITY_ROWS", "QUALITY_BATCHES"]

#: Values of the quality field read for the rank correlation and the plot.
QUALITY_ROWS = 256
#: Batches (of 64 rows) read for each batch spread of the quality section.
QUALITY_BATCHES = 2
#: Versions and shards listed at most.
MAX_VERSIONS = 12
MAX_SHARDS = 64
#: Sample rows drawn with audio players at most (each player holds a bounded WAV preview).
MAX_PLAYERS = 4

#: Scripts and every fetch forbidden; images, audio and styles only inline.
CSP = "default-src 'none'; img-src data:; media-src data:; style-src 'unsafe-inline'"

_PAGE_CSS = """
body{margin:16px 24px;background:#fff}
.rs-view{max-width:1280px}
.rs-view h1{font-size:20px;margin:0 0 4px}
.rs-view h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid var(--rs-line);
padding-bottom:2px}
.rs-view pre{font-size:12px;max-height:360px;overflow:auto;background:var(--rs-alt);padding:6px}
"""


def _section(title: str, anchor: str, make: Callable[[], Html]) -> str:
    """A section whose body ``make()`` draws; data too damaged for it (a checksum, a codec, an
    I/O error) gives the error's text in its place, and the other sections still show. A
    wrong argument (a SchemaError) is raised."""
    try:
        body = make()
    except (FormatError, CodecError, OSError) as exc:
        body = Html(
            f'<div class="rs-bad">not available: {esc(type(exc).__name__)}: {esc(exc)}</div>'
        )
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>{esc(body)}</section>'


def _overview(r: Reader) -> Html:
    L = r.layout
    comp = L.compression
    comp_s = (
        "none"
        if comp.get("id") == "none"
        else f"blosc2 {comp.get('cname')} level {comp.get('clevel')} shuffle={comp.get('shuffle')}"
    )
    raw, stored = L.raw_nbytes, L.stored_nbytes
    rows = [
        ["path", r.path],
        ["rows", f"{L.num_rows:,}"],
        ["shards", f"{L.num_shards:,}"],
        ["blocks", f"{L.num_blocks:,} (up to {L.rows_per_block:,} rows each)"],
        ["row size", f"{L.row_dtype.itemsize:,} bytes in the row table"],
        ["heap", f"{_html.size_text(L.heap_nbytes)}" if len(L.heap_chunks) else "none"],
        ["compression", comp_s],
        ["decoded bytes", _html.size_text(raw)],
        [
            "stored bytes",
            _html.size_text(stored) + (f" (ratio {raw / stored:.2f}x)" if stored else ""),
        ],
        ["file size", _html.size_text(int(L.shard_file_size.sum()))],
    ]
    if L.version is not None:
        rows.insert(1, ["version", str(L.version)])
    elif L.shard_layouts and len(L.shard_layouts) == 1:
        F = L.shard_layouts[0]
        rows.insert(1, ["format", f"rowstore v{F.version} (written by {F.writer or 'unknown'})"])
    return table(["", ""], rows)


def _versions(r: Reader) -> Html:
    """The dataset's versions (a local dataset directory's; newest first) and its shards."""
    L = r.layout
    parts = []
    root = r.path
    if L.version is not None and os.path.isdir(root):
        try:
            found = manifest.versions(root)
        except OSError as exc:
            found = []
            parts.append(f'<div class="rs-bad">versions not listed: {esc(exc)}</div>')
        rows = []
        for v in found[::-1][:MAX_VERSIONS]:
            try:
                m = manifest.load(root, v)
                rows.append(
                    [
                        f"{v}" + (" (read)" if v == L.version else ""),
                        f"{m.num_rows:,}",
                        f"{m.num_shards:,}",
                        m.created,
                        m.writer,
                    ]
                )
            except Exception as exc:  # a damaged old version: listed with what is wrong
                rows.append([str(v), "", "", "", Html(f'<span class="rs-bad">{esc(exc)}</span>')])
        more = len(found) - len(rows)
        parts.append(table(["version", "rows", "shards", "created", "writer"], rows))
        if more > 0:
            parts.append(f'<div class="rs-note">... and {more:,} older versions</div>')
    shard_rows = [
        [
            str(s),
            os.path.relpath(p, root) if os.path.isdir(root) else p,
            f"{int(L.shard_rows[s]):,}",
            _html.size_text(int(L.shard_file_size[s])),
        ]
        for s, p in enumerate(L.shard_paths[: MAX_SHARDS + 1])
    ]
    shown, cut = _html.cut_rows(shard_rows, MAX_SHARDS, "shards", total=L.num_shards)
    body = Html(table(["", "file", "rows", "size"], shown) + cut)
    parts.append(details(f"Shards ({L.num_shards:,})", body, open=L.num_shards <= 8))
    return Html("".join(parts))


def _balance(r: Reader, st: Any) -> Html:
    """Per label-like field (a scalar integer or bool, or a string) with stored value counts:
    the counts as bars, and how unbalanced they are (largest over smallest class shown)."""
    attrs = r.layout.user_attrs
    parts = []
    for f in r.schema:
        if field_kind(f) not in ("label", "text"):
            continue
        fs = st.fields.get(f.name) if st is not None else None
        top = _html.top_values(fs) if fs is not None else None
        if not top or not top[0]:
            continue
        pairs, other = top
        names = class_names(f, attrs)
        counts = [c for _, c in pairs]
        total = sum(counts) + other
        ratio = max(counts) / max(1, min(counts))
        drawn = pairs[: _html.MAX_VALUES]
        rest = total - sum(c for _, c in drawn)
        note = (
            f"{len(drawn):,} most frequent of {len(pairs):,} values counted; largest / smallest "
            f"count among them: {ratio:.2f}"
        )
        labels = [_html.value_label(v, names) for v, _ in drawn] + (["(other)"] if rest else [])
        parts.append(
            f'<div class="rs-card"><div class="rs-head">{esc(f.name)}</div>'
            f'<div class="rs-dim">{esc(note)}</div>'
            + _pictures.svg_bars(
                labels, [c for _, c in drawn] + ([rest] if rest else []), total=total
            )
            + "</div>"
        )
    if not parts:
        why = "no statistics stored" if st is None else "no label-like field with value counts"
        return Html(f'<div class="rs-note">{esc(why)}</div>')
    return Html("".join(parts))


def _quality(r: Reader, field: str | None) -> Html:
    """The order figures of :func:`~rowstore.quality.order_quality` and a plot of the field's
    values against their row position (the same evenly spaced rows)."""
    name = field if field is not None else default_field(r.schema)
    if name is None:
        return Html('<div class="rs-note">no scalar numeric field to measure the order by</div>')
    with warnings.catch_warnings():  # a NaN-only field: its spread is None, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        q = order_quality(r, field=name, max_rows=QUALITY_ROWS, max_batches=QUALITY_BATCHES)

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    rows = [
        [
            "rank correlation with position (Spearman)",
            num(q.spearman, "+.3f"),
            "|1|: sorted by it, ~0: no trend",
        ],
        *(
            [
                f"batch spread, batch {q.batch_size}, order {k}",
                num(v, ".3f"),
                "1: batches as varied as the data",
            ]
            for k, v in q.batch_spread.items()
        ),
        [
            f"block shuffle mixing, window {q.window}",
            num(q.block_mixing, ".3f"),
            "1: as mixed as a uniform shuffle",
        ],
    ]
    verdict = ""
    if q.spearman is not None and abs(q.spearman) > 0.5:
        verdict = (
            f'<div class="rs-bad">the file is ordered by {esc(name)} (rank correlation '
            f"{q.spearman:+.2f}): shuffle globally before training (rowstore shuffle)</div>"
        )
    parts = [
        f"<div>field {esc(name)}, {q.rows:,} rows</div>",
        verdict,
        table(["figure", "value", ""], rows),
    ]
    n = len(r)
    if n >= 2:
        pos = np.unique(np.linspace(0, n - 1, min(n, QUALITY_ROWS)).astype(np.int64))
        vals = np.asarray(r.take(pos, fields=[name])[name], np.float64)
        parts.append(
            _pictures.svg_scatter(pos, vals, width=520, height=160, xlabel="row", ylabel=name)
        )
    return Html("".join(parts))


def _scan(r: Reader) -> Html:
    """Every chunk read and its checksum compared (:meth:`DatasetLayout.damage`)."""
    L = r.layout
    damage = L.damage(shard_indexes=True)
    if not damage:
        return Html(
            f'<div class="rs-good">OK: {L.num_blocks:,} blocks and {len(L.heap_chunks):,} heap '
            f"chunks in {L.num_shards:,} shard(s), checksums match</div>"
        )
    rows = []
    for err in damage[:100]:
        span = getattr(err, "rows", None)
        rows.append([str(err), f"{span[0]:,}..{span[1] - 1:,}" if span else ""])
    return Html(
        f'<div class="rs-bad">{len(damage):,} damaged chunk(s) or shard(s)</div>'
        + table(["damage", "rows"], rows)
    )


def report_html(
    dataset: Any,
    *,
    scan: bool = False,
    samples: int = 24,
    seed: int = 0,
    quality_field: str | None = None,
    storage_options: dict | None = None,
    allow_outside_links: bool = False,
) -> str:
    """The report page of ``dataset`` (a path, a URL with ``storage_options``, or a
    :class:`~rowstore.reader.Reader`) as HTML text; see :func:`report`."""
    own = not isinstance(dataset, Reader)
    r = (
        Reader(dataset, storage_options=storage_options, allow_outside_links=allow_outside_links)
        if own
        else dataset
    )
    try:
        return _page(r, scan, samples, seed, quality_field)
    finally:
        if own:
            r.close()


def _page(r: Reader, scan: bool, samples: int, seed: int, quality_field: str | None) -> str:
    st, why = stats_of(r)
    attrs = r.layout.user_attrs
    picked = sample_rows(len(r), samples, seed)

    def stats() -> Html:
        if st is None:
            return Html(f'<div class="rs-note">{esc(why)}</div>')
        return stats_cards(r.schema, st, attrs)

    def sample() -> Html:
        if not len(picked):
            return Html('<div class="rs-note">no rows</div>')
        values = read_sample(r, picked)
        return samples_html(r, picked, max_side=128, players=MAX_PLAYERS, values=values)

    sections = [
        _section("Overview", "overview", lambda: _overview(r)),
        _section("Versions and shards", "versions", lambda: _versions(r)),
        _section("Fields", "fields", lambda: fields_table(r.schema, st)),
        _section(f"Samples ({len(picked):,} rows, seed {seed})", "samples", sample),
        _section("Statistics", "statistics", stats),
        _section("Label balance", "balance", lambda: _balance(r, st)),
        _section("Order quality", "quality", lambda: _quality(r, quality_field)),
    ]
    if scan:
        sections.append(_section("Checksums of every chunk", "scan", lambda: _scan(r)))
    if attrs:
        sections.append(
            _section("Attributes", "attributes", lambda: details("JSON", attrs_html(attrs, 20_000)))
        )
    title = f"rowstore report: {_html.clip(os.fspath(r.path), 200)}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        f"<style>{_html.CSS}{_PAGE_CSS}</style></head>\n"
        f'<body><div class="rs-view"><h1>{esc(title)}</h1>'
        f'<div class="rs-dim">written by rowstore {esc(__version__)}; '
        f"{len(r):,} rows</div>\n" + "\n".join(sections) + "</div></body></html>\n"
    )


def report(
    dataset: Any,
    path: str | os.PathLike | None = None,
    *,
    scan: bool = False,
    samples: int = 24,
    seed: int = 0,
    quality_field: str | None = None,
    storage_options: dict | None = None,
    allow_outside_links: bool = False,
) -> str:
    """Write the report page of ``dataset`` to ``path`` (one self-contained HTML file: no
    script, nothing fetched; open it in any browser) and return its HTML text (only return it
    when ``path`` is None).

    Parameters
    ----------
    dataset : str, os.PathLike or Reader
        A file, a dataset directory, a URL (with ``storage_options``) or an open reader (left
        open).
    path : str or os.PathLike, optional
        Where to write the page.
    scan : bool
        Also read every chunk and compare its checksum, as ``rowstore verify`` does (reads the
        whole dataset; the section lists what is damaged). The report's own reads are checked
        as a :class:`~rowstore.reader.Reader` checks them (``verify=True``).
    samples : int
        Rows in the sample (a pure function of the row count, ``samples`` and ``seed``).
    quality_field : str, optional
        The scalar numeric field the order quality is measured by (default: the first one).
    storage_options, allow_outside_links
        As :class:`~rowstore.reader.Reader` takes them.

    Reads the stored statistics, the sample rows (each value within
    :data:`~rowstore.reader.samples.MAX_VALUE_BYTES`) and :data:`QUALITY_ROWS` plus
    ``2 * QUALITY_BATCHES * 64`` values of the quality field, whatever the dataset's size.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be a non-negative int, got {samples!r}")
    text = report_html(
        dataset,
        scan=scan,
        samples=samples,
        seed=seed,
        quality_field=quality_field,
        storage_options=storage_options,
        allow_outside_links=allow_outside_links,
    )
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text
