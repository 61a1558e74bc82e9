"""Presenting results: a terminal table (rich), the ratios, a markdown table, a PNG plot."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from rowstore.errors import RowstoreError

__all__ = [
    "fmt_rate",
    "fmt_bytes_rate",
    "table_rows",
    "COLUMNS",
    "render_table",
    "markdown_table",
    "plot",
    "PlotUnavailableError",
    "require_matplotlib",
]


class PlotUnavailableError(RowstoreError, ImportError):
    """``--plot`` without matplotlib installed."""


def require_matplotlib() -> None:
    """Raise :class:`PlotUnavailableError` (what to install) when matplotlib is not importable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotUnavailableError(
            f"--plot needs matplotlib, which is not installed here ({exc}); install it with "
            "pip install matplotlib (or pip install 'rowstore[bench]'), or leave out --plot"
        ) from None


#: (key, heading, meaning) of the table's columns; docs/bench.md explains them too.
COLUMNS = [
    ("label", "config", "what was measured (rowstore mode and options, or a baseline)"),
    (
        "checks",
        "checks",
        "rowstore's CRC checks: on (verify=True, the default), always, off (verify=False); - "
        "baselines",
    ),
    ("samples", "samples/s", "rows delivered per second in the measure phase (median of repeats)"),
    ("quality", "shuffle q", "shuffle quality 0..1 of the epoch order (1 = as mixed as uniform)"),
    (
        "first",
        "1st epoch/s",
        "rows per second in the first epoch of the fresh reader (fresh process per config)",
    ),
    ("mbps", "MB/s", "decoded bytes of the fields' values per second (1 MB = 1e6 bytes)"),
    ("vs_memcpy", "% memcpy", "MB/s as a share of np.copyto bandwidth measured in the same run"),
    ("ttfb", "1st batch", "time from creating the iterator to the first batch (median)"),
    ("cpu", "CPU%", "process CPU time / wall time in the measure phase; >100% = several cores"),
    ("rss", "peak RSS", "peak resident memory of the measuring process (fresh process per config)"),
]


def fmt_rate(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.3g}{unit}" if x / div < 100 else f"{x / div:.0f}{unit}"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def fmt_bytes_rate(x: float | None) -> str:
    if x is None:
        return "-"
    mb = x / 1e6
    return f"{mb:,.0f}" if mb >= 100 else f"{mb:.3g}"


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.0f} ms" if x >= 0.0995 else f"{x * 1e3:.3g} ms"


def table_rows(
    results: Sequence[dict[str, Any]], memcpy_gbps: float | None
) -> list[dict[str, str]]:
    """One dict of formatted cells per result (keys of :data:`COLUMNS`, plus ``note``)."""
    rows = []
    for r in results:
        if r.get("error"):
            rows.append({"label": r.get("label", "?"), "samples": "error", "note": r["error"]})
            continue
        bps = r.get("bytes_per_s")
        note = []
        if r.get("stopped_early"):
            note.append("partial epoch, extrapolated")
        rss = r.get("peak_rss_mb")
        rss_s = f"{rss:,.0f} MiB" if rss is not None else "-"
        if r.get("workers_rss_mb"):
            rss_s += f" +{r['workers_rss_mb']:,.0f} workers"
        rows.append(
            {
                "label": r["label"],
                "checks": (r.get("info") or {}).get("checks", "-"),
                "samples": fmt_rate(r.get("rows_per_s")),
                "first": fmt_rate(r.get("first_epoch_rows_per_s")),
                "mbps": fmt_bytes_rate(bps),
                "vs_memcpy": f"{100 * bps / (memcpy_gbps * 1e9):.1f}%"
                if bps and memcpy_gbps
                else "-",
                "ttfb": _ms(r.get("ttfb_s")),
                "cpu": f"{r['cpu_percent']:.0f}%" if r.get("cpu_percent") is not None else "-",
                "rss": rss_s,
                "quality": f"{r['shuffle_quality']:.3f}"
                if r.get("shuffle_quality") is not None
                else "-",
                "note": "; ".join(note),
            }
        )
    return rows


def render_table(
    results: Sequence[dict[str, Any]], memcpy_gbps: float | None, *, title: str = "", console=None
) -> None:
    """Print the results table (rich when installed, else plain text)."""
    rows = table_rows(results, memcpy_gbps)
    cols = [c for c in COLUMNS if c[0] != "vs_memcpy" or memcpy_gbps]
    show_note = any(r.get("note") for r in rows)
    try:
        from rich.table import Table

        have_rich = True
    except ImportError:  # pragma: no cover - rich is a bench dependency
        have_rich = False
    if have_rich and console is not None:
        t = Table(title=title or None, title_justify="left", header_style="bold")
        for key, head, _ in cols:
            t.add_column(
                head, justify="left" if key == "label" else "right", no_wrap=key != "label"
            )
        if show_note:
            t.add_column("note")
        for r in rows:
            t.add_row(
                *[r.get(k, "") for k, _, _ in cols], *([r.get("note", "")] if show_note else [])
            )
        console.print(t)
        return
    heads = [h for _, h, _ in cols] + (["note"] if show_note else [])
    keys = [k for k, _, _ in cols] + (["note"] if show_note else [])
    body = [[r.get(k, "") for k in keys] for r in rows]
    widths = [max(len(str(x)) for x in [h] + [b[i] for b in body]) for i, h in enumerate(heads)]
    if title:
        print(title)
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(heads, widths))
        )
    )
    for b in body:
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(b, widths))
            )
        )


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None
) -> str:
    """A GitHub markdown table; ``align`` is a string of ``l``/``r`` per column."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(map(str, header)) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def plot(
    groups: Sequence[tuple[str, Sequence[dict[str, Any]]]],
    path: str,
    *,
    memcpy_gbps: float | None = None,
    title: str = "",
    subtitle: str = "",
) -> str:
    """Horizontal bars of samples/s (left) and decoded MB/s (right) per configuration.

    ``groups`` is a list of ``(group name, results)``; rowstore configurations are drawn in
    one colour and baselines in grey, each bar labelled with its value; the axes turn
    logarithmic when values span more than 30x. The memcpy bandwidth is a dashed line on the
    MB/s panel. Written with matplotlib's Agg backend (no display needed).
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    items = []  # (group, label, rows/s, bytes/s, is_rowstore, note)
    for gname, results in groups:
        for r in results:
            if r.get("error") or not r.get("rows_per_s"):
                continue
            items.append(
                (
                    gname,
                    r["label"],
                    r["rows_per_s"],
                    r.get("bytes_per_s") or 0.0,
                    r.get("kind", "rowstore") == "rowstore",
                    r.get("stopped_early", False),
                )
            )
    n = len(items)
    multi = len({g for g, *_ in items}) > 1
    labels = [
        (f"{g}: {lab}" if multi else lab) + (" *" if part else "")
        for g, lab, _, _, _, part in items
    ]
    height = 1.2 + 0.42 * max(n, 1)
    fig, axes = plt.subplots(1, 2, figsize=(14, height), sharey=True, layout="constrained")
    colors = ["#1f77b4" if rs else "#9a9a9a" for *_, rs, _ in items]
    ypos = list(range(n))[::-1]
    for ax, idx, name, fmt in (
        (axes[0], 2, "samples/s", fmt_rate),
        (axes[1], 3, "decoded MB/s", None),
    ):
        vals = [float(it[idx]) / (1e6 if idx == 3 else 1) for it in items]
        ax.barh(ypos, vals, color=colors, height=0.7)
        pos = [v for v in vals if v > 0]
        extra = [memcpy_gbps * 1e3] if (memcpy_gbps and idx == 3) else []
        log = bool(pos) and max(pos + extra) / min(pos) > 30
        if log:
            ax.set_xscale("log")
            lo, hi = min(pos) / 3, max(pos + extra) * 6
        else:
            lo, hi = 0, max(pos + extra + [1e-9]) * 1.35
        ax.set_xlim(lo, hi)
        for y, v in zip(ypos, vals):
            if v > 0:
                txt = fmt(v) if fmt else (f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
                if extra and idx == 3:
                    txt += (
                        f" ({100 * v / extra[0]:.2g}%)"
                        if v / extra[0] < 0.1
                        else f" ({100 * v / extra[0]:.0f}%)"
                    )
                ax.text(
                    v * (1.08 if log else 1) + (0 if log else hi * 0.01),
                    y,
                    txt,
                    va="center",
                    fontsize=9,
                )
        if extra:
            ax.axvline(extra[0], color="#d62728", linestyle="--", linewidth=1.2)
            ax.text(
                extra[0],
                n - 0.45,
                f"memcpy {memcpy_gbps:.1f} GB/s ",
                color="#d62728",
                fontsize=9,
                ha="right",
                va="bottom",
            )
        ax.set_xlabel(name + (" (log scale)" if log else ""))
        ax.grid(axis="x", alpha=0.3)
        ax.set_axisbelow(True)
        for s in ("top", "right"):
            ax.spines[s].set_visible(False)
    if multi:  # a thin line between groups (workloads)
        for i in range(1, n):
            if items[i][0] != items[i - 1][0]:
                for ax in axes:
                    ax.axhline(ypos[i] + 0.5, color="#444444", linewidth=0.6)
    axes[0].set_yticks(ypos)
    axes[0].set_yticklabels(labels, fontsize=9)
    axes[0].set_ylim(-0.6, n - 0.4 + (0.5 if memcpy_gbps else 0))
    handles = [Patch(color="#1f77b4", label="rowstore"), Patch(color="#9a9a9a", label="baseline")]
    fig.legend(handles=handles, loc="outside upper right", ncols=2, fontsize=9, frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=12, fontweight="bold")
    if subtitle or any(it[5] for it in items):
        note = subtitle + (
            "   * partial epoch, rate extrapolated" if any(it[5] for it in items) else ""
        )
        fig.supxlabel(note.strip(), x=0.01, ha="left", fontsize=8, color="#555555")
    os.makedirs(
        os.path.dirname(os.path.abspath(path)), exist_ok=True
    )  # e.g. make demo's .cache/rowstore/
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
