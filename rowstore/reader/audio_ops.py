"""Decode-time audio ops: what a ``flac``/``wav`` field becomes as it is decoded (a window of
frames, mixed down to mono, as float32 or int16), declared once per read as
``decode={"audio": RandomSegment(seconds=4)}``, beside the image ops
(:mod:`rowstore.reader.image_ops`) and with their guarantees.

The same declaration means the same thing in every entry point (``Reader.batches``/``deal``,
``rowstore.torch.BatchedDataLoader``, ``rowstore.tf.DataLoader``: it is an
:class:`~rowstore.reader.epochs.EpochSpec` argument). A field read through an op comes out as a
fixed-shape batch, ``n x length`` (mono, or a 1-D field) or ``n x length x C``, whatever the
stored utterances' lengths; :func:`decoded_field` says so in the output schema. An utterance
shorter than the window is padded with zeros after its end (``short="pad"``, the only policy:
dropping rows at decode time would change batch sizes and the row counts a resumed or
re-sharded epoch is built on; select rows by length before the epoch instead). Without an op a
field comes out whole, ragged (its codec's decode).

A window's start is a pure function of (seed, epoch, field, dataset row, the utterance's
frames): :func:`segment_start` states it. So an epoch resumed from a saved state, on any world
size or number of loader workers, decodes every row exactly as the uninterrupted epoch would.

Decoding is done by ``kernels.audio_decode`` (without the GIL, a range of rows per call on the
reader's decode threads): a FLAC value is seeked to the window's first frame (libFLAC's
``seek_absolute``: a binary search over the bytes, then one frame decoded from the target
sample), so only the FLAC frames the window covers are decoded; a WAV value is read at the
window's offset. Without the kernel, soundfile decodes the window (same samples).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rowstore.codecs.abc import ParallelMap, Payloads, serial
from rowstore.codecs.audio import AUDIO_DTYPES, decode_windows
from rowstore.errors import SchemaError
from rowstore.schema import Field

__all__ = [
    "AudioOp",
    "Segment",
    "RandomSegment",
    "check_field",
    "decoded_field",
    "segment_start",
    "segment_starts",
    "decode_segments",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0xD1B54A32D192ED03  # the per-row key step (image_ops.row_key's)
#: The most frames one window may take.
MAX_WINDOW_FRAMES = 1 << 28


def _frames(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{what} must be an int, got {v!r}")
    return int(v)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AudioOp:
    """Base of the decode-time audio ops: ``mono`` (mix the channels down to one: their mean)
    and ``dtype`` (``"float32"``, samples in [-1, 1]; ``"int16"``; ``"int32"``)."""

    mono: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        dt = np.dtype(self.dtype).name if self.dtype in AUDIO_DTYPES else None
        if dt is None:
            raise ValueError(f"dtype must be one of {AUDIO_DTYPES}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "mono", bool(self.mono))

    def starts(self, frames: np.ndarray, length: int, keys: list[int]) -> np.ndarray:
        """Each row's first frame (``frames``: the rows' stored frames)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Segment(AudioOp):
    """The fixed window of ``length`` frames from frame ``start`` (zeros past an utterance's
    end; all zeros for an utterance shorter than ``start``)."""

    start: int
    length: int

    def __post_init__(self) -> None:
        super().__post_init__()
        s, n = _frames(self.start, "start"), _frames(self.length, "length")
        if s < 0 or not 1 <= n <= MAX_WINDOW_FRAMES:
            raise ValueError(f"Segment needs start >= 0 and 1 <= length <= {MAX_WINDOW_FRAMES}")

    def starts(self, frames: np.ndarray, length: int, keys: list[int]) -> np.ndarray:
        return np.minimum(np.int64(self.start), frames.astype(np.int64))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandomSegment(AudioOp):
    """A window of ``seconds`` (at the field's ``sample_rate``, from its codec) or ``samples``
    frames at a random position, uniform over the positions where it fits; an utterance
    shorter than the window starts at 0 and is padded with zeros (``short="pad"``)."""

    seconds: float | None = None
    samples: int | None = None
    short: str = "pad"

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.seconds is None) == (self.samples is None):
            raise ValueError("RandomSegment takes seconds= or samples=, one of them")
        if self.samples is not None:
            n = _frames(self.samples, "samples")
            if not 1 <= n <= MAX_WINDOW_FRAMES:
                raise ValueError(f"samples must be 1..{MAX_WINDOW_FRAMES}, got {n}")
        else:
            s = float(self.seconds)  # type: ignore[arg-type]
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"seconds must be positive, got {self.seconds!r}")
            object.__setattr__(self, "seconds", s)
        if self.short != "pad":
            raise ValueError(
                f"short must be 'pad', got {self.short!r}: dropping short utterances at decode "
                "time would change batch sizes and the row counts a resumed epoch relies on; "
                "select the rows long enough before the epoch instead"
            )

    def window(self, rate: int | None, field: str) -> int:
        if self.samples is not None:
            return int(self.samples)
        if rate is None:
            raise SchemaError(
                f"decode={{{field!r}: RandomSegment(seconds=...)}}: field {field!r}'s codec has "
                "no sample_rate; give samples= or declare the codec's sample_rate",
                field=field,
            )
        n = round(self.seconds * rate)  # type: ignore[operator]
        if not 1 <= n <= MAX_WINDOW_FRAMES:
            raise SchemaError(f"decode={{{field!r}: ...}}: a window of {n} frames", field=field)
        return n

    def starts(self, frames: np.ndarray, length: int, keys: list[int]) -> np.ndarray:
        return np.array([segment_start(int(f), length, k) for f, k in zip(frames, keys)], np.int64)


def window_frames(op: AudioOp, rate: int | None, field: str) -> int:
    """Frames of ``op``'s window for a field of sample rate ``rate``."""
    if isinstance(op, RandomSegment):
        return op.window(rate, field)
    if isinstance(op, Segment):
        return op.length
    raise TypeError(f"not an audio op: {op!r}")


# -- the window's position: a pure function of (key, frames, length) ------------------------------
def _splitmix(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def segment_start(frames: int, length: int, key: int) -> int:
    """The first frame of a ``length``-frame window of an utterance of ``frames`` frames under
    key ``key`` (``image_ops.row_key(base, row)``): 0 when it does not fit, else uniform in
    ``0 .. frames - length`` (SplitMix64 from the key, Lemire's unbiased bounded draw)."""
    if frames <= length:
        return 0
    b = frames - length + 1
    state, x = _splitmix(key)
    if (x * b) & _MASK64 < b:
        t = ((1 << 64) - b) % b
        while (x * b) & _MASK64 < t:
            state, x = _splitmix(state)
    return (x * b) >> 64


def segment_starts(
    op: AudioOp, frames: np.ndarray, length: int, base: int, rows: np.ndarray
) -> np.ndarray:
    """Each row's window start (``rows``: dataset rows, ``base``: the field's key base of the
    epoch, ``image_ops.image_base``)."""
    keys = [(base + int(r) * _GOLDEN) & _MASK64 for r in rows]
    return op.starts(np.asarray(frames, np.int64), length, keys)


# -- declarations checked against a schema ------------------------------------------------------
def _rate(f: Field) -> int | None:
    return getattr(f.codec_obj, "sample_rate", None)


def check_field(name: str, op: AudioOp, f: Field) -> None:
    """SchemaError unless ``f`` is a ``flac``/``wav`` field ``op`` can decode into a fixed
    shape."""
    if getattr(f.codec_obj, "codec_id", None) not in ("flac", "wav"):
        raise SchemaError(
            f"decode={{{name!r}: ...}}: audio ops decode flac or wav fields; field {name!r} is "
            f"{f.dtype} {f.shape} with codec {f.codec!r}",
            field=name,
        )
    if len(f.shape) == 2 and f.shape[1] is None and not op.mono:
        raise SchemaError(
            f"decode={{{name!r}: ...}}: field {name!r} has a variable number of channels "
            f"{f.shape}; a fixed-shape window needs mono=True or a fixed channel count",
            field=name,
        )
    window_frames(op, _rate(f), name)


def decoded_field(f: Field, op: AudioOp) -> Field:
    """``f`` as ``op`` outputs it: the op's dtype, ``(length,)`` or ``(length, C)``, fixed."""
    n = window_frames(op, _rate(f), f.name)
    shape = (n,) if op.mono or len(f.shape) == 1 else (n, f.shape[1])
    return Field(f.name, op.dtype, shape, nullable=f.nullable)


def decode_segments(
    op: AudioOp, base: int, f: Field, col: Payloads, rows: np.ndarray, par: ParallelMap = serial
) -> tuple[np.ndarray, np.ndarray]:
    """A batch of ``f``'s values through ``op``: the fixed-shape output and each row's status
    (``kernels.AUDIO_*``, 0 decoded)."""
    n = len(col)
    length = window_frames(op, _rate(f), f.name)
    if col.shapes is not None:
        frames = col.shapes[:, 0].astype(np.int64)
        chans = col.shapes[:, 1] if col.shapes.shape[1] == 2 else np.ones(n, np.int64)
    else:
        frames = np.full(n, f.shape[0], np.int64)
        chans = np.full(n, f.shape[1] if len(f.shape) == 2 else 1, np.int64)
    oc = 1 if op.mono or len(f.shape) == 1 else int(f.shape[1])
    dst = np.empty((n, length) + ((oc,) if not op.mono and len(f.shape) == 2 else ()), op.dtype)
    bad = (chans < 1) | (chans > 8) | (frames < 0)
    status = np.zeros(n, np.uint8)
    if bad.any():  # a stored shape the kernel would refuse to take: reported per row
        from rowstore import kernels

        status[bad] = kernels.AUDIO_SIZE
        chans = np.where(bad, 1, chans)
        frames = np.where(bad, 0, frames)
    starts = segment_starts(op, frames, length, base, rows)
    counts = np.full(n, length, np.int64)
    offs = np.arange(n, dtype=np.int64) * length * oc
    got = decode_windows(col, dst, starts, counts, frames, chans, offs, mono=op.mono, parallel=par)
    return dst, np.maximum(status, got)
