"""Small pictures of data for the HTML views: PNG thumbnails, SVG charts, audio previews.

Everything here is pure NumPy and the standard library (``zlib`` for PNG, ``struct`` for WAV),
so the notebook views of the lower layers (a :class:`~rowstore.schema.Schema`, a reader) can draw
without an optional package. Every output is bounded whatever the input: thumbnails are at most
``max_side`` pixels a side, charts have a fixed size, audio previews a bounded duration and rate.

* :func:`png_bytes` encodes an 8-bit grey, grey+alpha, RGB or RGBA array (filter *Sub*, zlib);
* :func:`thumbnail` turns an image or a 2-D array into such an array (box-averaged down,
  nearest-neighbour up to ``min_side``; non-uint8 values scaled by their finite range and
  coloured with :func:`colormap`);
* :func:`svg_histogram`, :func:`svg_bars`, :func:`svg_scatter`, :func:`svg_waveform` draw
  charts as inline SVG (every text in them escaped);
* :func:`spectrogram` (a log-magnitude STFT, as an RGB array) and :func:`wav_bytes` (16-bit PCM,
  at most :data:`MAX_PLAYER_SECONDS` at most :data:`MAX_PLAYER_RATE` Hz) preview audio.
"""

from __future__ import annotations

import base64
import html
import math
import struct
import zlib
from collections.abc import Sequence

import numpy as np

__all__ = [
    "png_bytes",
    "data_uri",
    "thumbnail",
    "colormap",
    "svg_histogram",
    "svg_bars",
    "svg_scatter",
    "svg_waveform",
    "spectrogram",
    "wav_bytes",
    "MAX_PLAYER_SECONDS",
    "MAX_PLAYER_RATE",
]

#: Longest audio preview (seconds) and its highest sample rate (longer clips are cut, faster
#: ones averaged down by an integer factor): a preview is at most 2 * 2.5 * 16000 = 80 kB.
MAX_PLAYER_SECONDS = 2.5
MAX_PLAYER_RATE = 16_000

_PNG_COLOUR = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type
# viridis at 9 evenly spaced points (matplotlib's values, rounded): low values dark blue.
_VIRIDIS = np.array(
    [
        [68, 1, 84],
        [71, 44, 122],
        [59, 81, 139],
        [44, 113, 142],
        [33, 144, 141],
        [39, 173, 129],
        [92, 200, 99],
        [170, 220, 50],
        [253, 231, 37],
    ],
    np.float64,
)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png_bytes(img: np.ndarray) -> bytes:
    """A PNG file of ``img``: ``uint8`` ``H x W`` (grey) or ``H x W x C`` with C = 1 (grey),
    2 (grey + alpha), 3 (RGB) or 4 (RGBA); H and W at least 1."""
    a = np.asarray(img)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] not in _PNG_COLOUR or 0 in a.shape:
        raise ValueError(f"png_bytes takes uint8 HxW or HxWxC (C 1-4), got {a.dtype}{a.shape}")
    h, w, c = a.shape
    # Filter type 1 (Sub): each byte minus the byte one pixel to its left, modulo 256.
    rows = a.reshape(h, w * c)
    sub = rows.copy()
    sub[:, c:] -= rows[:, :-c]
    raw = np.empty((h, 1 + w * c), np.uint8)
    raw[:, 0] = 1
    raw[:, 1:] = sub
    header = struct.pack(">IIBBBBB", w, h, 8, _PNG_COLOUR[c], 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )


def data_uri(data: bytes, mime: str) -> str:
    """``data:<mime>;base64,...`` (safe in an HTML attribute: base64 has no quote or ``<``)."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def colormap(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """``values`` (any real array) as viridis RGB ``uint8`` (shape + (3,)), ``lo..hi`` (default:
    the finite range) mapped to dark..bright; NaN and infinities are drawn black."""
    v = np.asarray(values, np.float64)
    finite = np.isfinite(v)
    if lo is None or hi is None:
        lo, hi = (float(v[finite].min()), float(v[finite].max())) if finite.any() else (0.0, 1.0)
    t = np.zeros(v.shape) if hi <= lo else (np.where(finite, v, lo) - lo) / (hi - lo)
    t = np.clip(t, 0.0, 1.0) * (len(_VIRIDIS) - 1)
    i = np.minimum(t.astype(np.int64), len(_VIRIDIS) - 2)
    f = (t - i)[..., None]
    rgb = _VIRIDIS[i] * (1 - f) + _VIRIDIS[i + 1] * f
    rgb[~finite] = 0
    return np.rint(rgb).astype(np.uint8)


def _box_down(a: np.ndarray, k: int) -> np.ndarray:
    """Mean of each ``k x k`` box (the edge rows/columns that do not fill one are dropped)."""
    if k == 1:
        return a
    h, w = a.shape[0] // k * k, a.shape[1] // k * k
    if h == 0 or w == 0:  # a sliver thinner than one box: every k-th pixel
        return a[::k, ::k]
    b = a[:h, :w].reshape(h // k, k, w // k, k, *a.shape[2:])
    return b.mean(axis=(1, 3), dtype=np.float32)


def thumbnail(value: np.ndarray, max_side: int = 128, min_side: int = 64) -> np.ndarray:
    """An ``uint8`` picture (``h x w x C``, each side at most ``max_side``) of ``value``.

    ``uint8`` ``H x W`` or ``H x W x C`` (C 1-4) is an image and keeps its colours; ``uint16``
    images are shifted down to 8 bits; any other real 2-D array is drawn with :func:`colormap`
    over its finite range. Larger pictures are box-averaged down by an integer factor; smaller
    ones (a 9 x 9 patch) are enlarged without smoothing to about ``min_side`` pixels.
    """
    a = np.asarray(value)
    if a.ndim == 3 and a.shape[2] not in (1, 2, 3, 4):
        raise ValueError(f"thumbnail takes HxW or HxWxC (C 1-4), got shape {a.shape}")
    if a.ndim not in (2, 3) or 0 in a.shape:
        raise ValueError(f"thumbnail takes HxW or HxWxC (C 1-4), got shape {a.shape}")
    image = a.dtype in (np.uint8, np.uint16) and (a.ndim == 2 or a.shape[2] in (1, 2, 3, 4))
    if not image and a.ndim == 3:
        a = a[:, :, 0]
    k = max(1, math.ceil(max(a.shape[:2]) / max_side))
    if image:
        small = _box_down(a, k)
        if a.dtype == np.uint16:
            small = np.asarray(small, np.float32) / 257.0
        pic = np.clip(np.rint(small), 0, 255).astype(np.uint8)
    else:
        if a.dtype.kind == "c":
            a = np.abs(a)
        if a.dtype.kind not in "biuf":
            raise ValueError(f"thumbnail takes real numbers, got {a.dtype}")
        v = a.astype(np.float64)
        finite = np.isfinite(v)
        rng = (float(v[finite].min()), float(v[finite].max())) if finite.any() else (0.0, 1.0)
        pic = colormap(_box_down(np.where(finite, v, np.nan), k), *rng)
    up = max(1, math.ceil(min_side / max(pic.shape[:2])))
    if up > 1:
        pic = np.repeat(np.repeat(pic, up, axis=0), up, axis=1)
    return pic


# -- SVG charts --------------------------------------------------------------------------------
def _num(x: float) -> str:
    """A number for an axis label: 4 significant digits."""
    if x is None or not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


def _text(x: float, y: float, text: str, anchor: str = "start") -> str:
    return (
        f'<text x="{x}" y="{y}" class="rs-tick" text-anchor="{anchor}">{html.escape(text)}</text>'
    )


def _svg(width: int, height: int, body: str, label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="rs-chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(label)}">{body}</svg>'
    )


def svg_histogram(
    edges: Sequence[float], counts: Sequence[int], *, width: int = 240, height: int = 72
) -> str:
    """An SVG histogram: one bar per bin (``len(edges) == len(counts) + 1``), the first and last
    edge written under it, each bar's range and count in its tooltip. At most 256 bins are
    drawn (neighbours summed)."""
    e = np.asarray(edges, np.float64).reshape(-1)
    c = np.asarray(counts, np.float64).reshape(-1)
    if len(e) != len(c) + 1 or len(c) == 0:
        raise ValueError(
            f"a histogram needs len(edges) == len(counts) + 1 > 1, got {len(e)}, {len(c)}"
        )
    if len(c) > 256:
        k = math.ceil(len(c) / 256)
        pad = (-len(c)) % k
        c = np.concatenate([c, np.zeros(pad)]).reshape(-1, k).sum(axis=1)
        e = np.concatenate([e[::k], e[-1:]]) if (len(e) - 1) % k else e[::k]
        e = e[: len(c) + 1]
    plot_h = height - 14
    top = float(c.max()) or 1.0
    bw = width / len(c)
    bars = []
    for i, n in enumerate(c):
        h = 0.0 if n <= 0 else max(1.0, plot_h * n / top)
        tip = f"[{_num(e[i])}, {_num(e[i + 1])}): {int(n):,}"
        bars.append(
            f'<rect x="{i * bw:.2f}" y="{plot_h - h:.2f}" width="{max(bw - 0.5, 0.5):.2f}" '
            f'height="{h:.2f}" class="rs-bar"><title>{html.escape(tip)}</title></rect>'
        )
    axis = (
        f'<line x1="0" y1="{plot_h + 0.5}" x2="{width}" y2="{plot_h + 0.5}" class="rs-axis"/>'
        f'<text x="0" y="{height - 2}" class="rs-tick">{html.escape(_num(e[0]))}</text>'
        f'<text x="{width}" y="{height - 2}" class="rs-tick" text-anchor="end">'
        f"{html.escape(_num(e[-1]))}</text>"
    )
    return _svg(width, height, "".join(bars) + axis, "histogram")


def svg_bars(
    labels: Sequence[str], counts: Sequence[int], *, width: int = 320, total: int | None = None
) -> str:
    """Horizontal bars, one per label (at most 32 drawn), each with its count and share of
    ``total`` (default: the sum of ``counts``); labels are cut to 24 characters and escaped."""
    labels, counts = list(labels)[:32], [int(n) for n in list(counts)[:32]]
    total = total or sum(counts) or 1
    row, label_w = 16, 110
    height = row * len(labels) + 2
    top = max(counts, default=0) or 1
    out = []
    for i, (lab, n) in enumerate(zip(labels, counts)):
        y = i * row
        w = (width - label_w - 80) * n / top
        text = str(lab)
        text = text if len(text) <= 24 else text[:23] + "\u2026"
        out.append(
            f'<text x="{label_w - 4}" y="{y + 12}" class="rs-tick" text-anchor="end">'
            f"{html.escape(text)}</text>"
            f'<rect x="{label_w}" y="{y + 2}" width="{max(w, 0.5):.2f}" height="{row - 4}" '
            f'class="rs-bar"><title>{html.escape(f"{lab}: {n:,}")}</title></rect>'
            f'<text x="{label_w + w + 4:.2f}" y="{y + 12}" class="rs-tick">'
            f"{n:,} ({100 * n / total:.1f}%)</text>"
        )
    return _svg(width, height, "".join(out), "counts per value")


def svg_scatter(
    x: np.ndarray,
    y: np.ndarray,
    *,
    width: int = 320,
    height: int = 120,
    xlabel: str = "",
    ylabel: str = "",
) -> str:
    """A scatter plot of ``y`` against ``x`` (at most 2,048 points drawn, evenly picked; NaN and
    infinite points left out), with the axes' ranges written at their ends."""
    x = np.asarray(x, np.float64).reshape(-1)
    y = np.asarray(y, np.float64).reshape(-1)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) > 2048:
        pick = np.linspace(0, len(x) - 1, 2048).astype(np.int64)
        x, y = x[pick], y[pick]
    left, bottom = 44, 16
    pw, ph = width - left - 4, height - bottom - 4
    parts = [
        f'<line x1="{left}" y1="{ph + 4}" x2="{width}" y2="{ph + 4}" class="rs-axis"/>',
        f'<line x1="{left}" y1="4" x2="{left}" y2="{ph + 4}" class="rs-axis"/>',
    ]
    if len(x):
        x0, x1, y0, y1 = float(x.min()), float(x.max()), float(y.min()), float(y.max())
        px = left + (x - x0) / ((x1 - x0) or 1) * pw
        py = 4 + ph - (y - y0) / ((y1 - y0) or 1) * ph
        parts += [
            f'<circle cx="{a:.1f}" cy="{b:.1f}" r="1.6" class="rs-dot"/>' for a, b in zip(px, py)
        ]
        parts += [
            _text(left - 3, 12, _num(y1), "end"),
            _text(left - 3, ph + 4, _num(y0), "end"),
            _text(left, height - 2, _num(x0)),
            _text(width, height - 2, _num(x1), "end"),
        ]
    if xlabel:
        parts.append(
            f'<text x="{left + pw / 2:.0f}" y="{height - 2}" class="rs-tick" '
            f'text-anchor="middle">{html.escape(xlabel)}</text>'
        )
    if ylabel:
        parts.append(
            f'<text x="2" y="{4 + ph / 2:.0f}" class="rs-tick" '
            f'transform="rotate(-90 8 {4 + ph / 2:.0f})">{html.escape(ylabel)}</text>'
        )
    return _svg(width, height, "".join(parts), "scatter plot")


def svg_waveform(samples: np.ndarray, *, width: int = 240, height: int = 56) -> str:
    """The envelope (min and max per pixel column) of a 1-D waveform, scaled to its peak."""
    x = np.nan_to_num(np.asarray(samples, np.float64).reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    if len(x) == 0:
        return _svg(width, height, "", "empty waveform")
    cols = min(width, len(x))
    bounds = np.linspace(0, len(x), cols + 1).astype(np.int64)
    hi = np.maximum.reduceat(x, bounds[:-1])
    lo = np.minimum.reduceat(x, bounds[:-1])
    peak = float(max(np.abs(hi).max(), np.abs(lo).max())) or 1.0
    mid = height / 2
    xs = np.arange(cols) * (width / cols)
    top = " ".join(f"{a:.1f},{mid - (mid - 1) * b / peak:.1f}" for a, b in zip(xs, hi))
    bot = " ".join(f"{a:.1f},{mid - (mid - 1) * b / peak:.1f}" for a, b in zip(xs[::-1], lo[::-1]))
    body = (
        f'<line x1="0" y1="{mid}" x2="{width}" y2="{mid}" class="rs-axis"/>'
        f'<polygon points="{top} {bot}" class="rs-wave"/>'
    )
    return _svg(width, height, body, "waveform")


# -- audio -------------------------------------------------------------------------------------
def spectrogram(
    samples: np.ndarray,
    *,
    width: int = 240,
    height: int = 64,
    n_fft: int = 256,
    max_samples: int = 1 << 20,
) -> np.ndarray:
    """A log-magnitude spectrogram (Hann-windowed STFT, 80 dB range) of the first
    ``max_samples`` samples, as an RGB ``uint8`` array: time left to right (at most ``width``
    frames), frequency upwards (``height`` rows)."""
    x = np.nan_to_num(np.asarray(samples, np.float64).reshape(-1)[:max_samples])
    if len(x) < n_fft:
        x = np.concatenate([x, np.zeros(n_fft - len(x))])
    frames_n = min(width, len(x) - n_fft + 1)
    starts = np.rint(np.linspace(0, len(x) - n_fft, frames_n)).astype(np.int64)
    frames = x[starts[:, None] + np.arange(n_fft)[None, :]] * np.hanning(n_fft)[None, :]
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2  # frames x (n_fft/2 + 1)
    db = 10 * np.log10(power[:, 1:] + 1e-12)  # drop DC: n_fft/2 bins
    bins = db.shape[1]
    rows = min(height, bins)
    groups = np.linspace(0, bins, rows + 1).astype(np.int64)
    db = np.maximum.reduceat(db, groups[:-1], axis=1)  # frames x rows
    hi = float(db.max())
    return colormap(db.T[::-1], hi - 80.0, hi)


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit mono PCM WAV file of ``samples`` (1-D, floats in [-1, 1] or integers of their
    dtype's range; a louder float clip is scaled to its peak), at most
    :data:`MAX_PLAYER_SECONDS` long, averaged down by an integer factor to at most
    :data:`MAX_PLAYER_RATE` Hz."""
    rate = int(sample_rate)
    if rate < 1:
        raise ValueError(f"sample_rate must be a positive int, got {sample_rate!r}")
    x = np.asarray(samples).reshape(-1)
    if x.dtype.kind in "iu":
        x = x.astype(np.float64) / float(np.iinfo(x.dtype).max)
    x = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    x = x[: int(MAX_PLAYER_SECONDS * rate)]
    k = max(1, math.ceil(rate / MAX_PLAYER_RATE))
    if k > 1:
        x = x[: len(x) // k * k].reshape(-1, k).mean(axis=1)
        rate //= k
    peak = float(np.abs(x).max()) if len(x) else 0.0
    if peak > 1.0:
        x = x / peak
    pcm = np.rint(np.clip(x, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", len(body)) + body
