"""The audio kernel (``kernels.audio_decode``, ``_ext/_audio.pyx``): windows decoded by seeking
equal soundfile's samples sliced, for FLAC of several block sizes and WAV; its header parser
agrees with the Python one (``rowstore.codecs.audio.audio_header``) on mutated headers; hostile
bytes (fuzzed headers, truncations, bogus frame counts, huge declared sizes, the committed
corpus in tests/data/fuzz/audio) give a status per value (a ``CodecError`` through the codecs),
never a crash, a hang or an allocation a header sizes; threads decode what one thread does."""

from __future__ import annotations

import glob
import io
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import rowstore
from rowstore import kernels
from rowstore.codecs import Payloads
from rowstore.codecs.audio import audio_header, decode_windows
from rowstore.errors import CodecError, RowstoreError, RowValidationError
from rowstore.schema import Field, Schema

sf = pytest.importorskip("soundfile")
pytestmark = pytest.mark.skipif(not kernels.AUDIO_AVAILABLE, reason="built without libFLAC")

CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "fuzz", "audio")


def encode(x, fmt, subtype, rate=16000, level=None):
    """soundfile's file (libsndfile: 4096-frame FLAC blocks), or with ``level`` rowstore's
    libFLAC encoder (level 0: 1152-frame blocks)."""
    if level is not None:
        bits = int(subtype[4:])
        s = np.round(x * (2 ** (bits - 1) - 1)).astype(np.int32)
        return kernels.flac_encode(s, bits, rate, level)
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, x.shape[1], subtype=subtype, format=fmt) as f:
        f.write(x)
    return buf.getvalue()


def batch(values):
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    data = np.frombuffer(b"".join(values), np.uint8) if values else np.zeros(0, np.uint8)
    return Payloads(data, offsets, None, None)


def windows(values, starts, count, chans, dtype=np.float32, expect=None, mono=False, par=None):
    n = len(values)
    oc = 1 if mono else chans
    out = np.full((n, count, oc), 7, dtype)
    kw = {"parallel": par} if par else {}
    status = decode_windows(
        batch(values), out, np.asarray(starts), np.full(n, count), expect, np.full(n, chans),
        np.arange(n) * count * oc, mono=mono, **kw,
    )  # fmt: skip
    return out, status


@pytest.fixture(scope="module")
def sources():
    """FLAC of 16 and 24 bits with 4096- and 1152-frame blocks, WAV: 6000 frames, stereo."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (6000, 2))
    out = []
    for fmt, subtype, level in [
        ("FLAC", "PCM_16", None),
        ("FLAC", "PCM_24", 0),
        ("FLAC", "PCM_16", 8),
        ("WAV", "PCM_24", None),
        ("WAV", "FLOAT", None),
    ]:
        data = encode(x, fmt, subtype, level=level)
        out.append((data, sf.read(io.BytesIO(data), dtype="float32", always_2d=True)[0]))
    return out


def test_seeked_windows_equal_soundfile_slices(sources):
    rng = np.random.default_rng(2)
    for data, full in sources:
        starts = list(rng.integers(0, 6000, 40)) + [0, 5999, 6000, 4000, 1151, 1152, 1153]
        out, status = windows([data] * len(starts), starts, 1500, 2)
        assert not status.any()
        for k, s in enumerate(starts):
            want = np.zeros((1500, 2), np.float32)
            w = full[s : s + 1500]
            want[: len(w)] = w
            np.testing.assert_array_equal(out[k], want)


def test_mono_mixdown_and_integer_outputs(sources):
    data, full = sources[1]  # 24-bit FLAC
    out, status = windows([data, data], [0, 4321], 2000, 2, mono=True)
    assert not status.any()
    want = (full.astype(np.float64).sum(1) / 2).astype(np.float32)
    np.testing.assert_array_equal(out[0, :, 0], want[:2000])
    np.testing.assert_array_equal(out[1, :1679, 0], want[4321:])
    assert not out[1, 1679:].any()
    for dt in ("int16", "int32"):
        ints = sf.read(io.BytesIO(data), dtype=dt, always_2d=True)[0]
        got, status = windows([data], [100], 3000, 2, dtype=np.dtype(dt))
        assert not status.any()
        np.testing.assert_array_equal(got[0], ints[100:3100])
        got, _ = windows([data], [100], 3000, 2, dtype=np.dtype(dt), mono=True)
        want = np.floor_divide(ints[100:3100].astype(np.int64).sum(1), 2)
        np.testing.assert_array_equal(got[0, :, 0], want)
    _, status = windows([sources[4][0]], [0], 10, 2, dtype=np.dtype(np.int16))
    assert status[0] == kernels.AUDIO_UNSUPPORTED  # float WAV into int16: refused


def test_threads_decode_what_one_thread_does(sources):
    values = [d for d, _ in sources] * 6
    starts = np.random.default_rng(3).integers(0, 5000, len(values))
    one, s1 = windows(values, starts, 800, 2)
    pool = ThreadPoolExecutor(2)

    def par(fn, n):
        list(pool.map(lambda ab: fn(*ab), [(0, n // 2), (n // 2, n)]))

    two, s2 = windows(values, starts, 800, 2, par=par)
    pool.shutdown()
    assert not s1.any() and not s2.any() and np.array_equal(one, two)


def _mutations(data, rng, k):
    """``k`` mutated copies of ``data``: bit flips and byte sets in its first 200 bytes, a few
    anywhere, truncations."""
    out = []
    for _ in range(k):
        b = bytearray(data)
        kind = rng.integers(0, 4)
        if kind == 0:
            for _ in range(rng.integers(1, 4)):
                i = int(rng.integers(0, min(200, len(b))))
                b[i] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1:
            i = int(rng.integers(0, min(200, len(b))))
            b[i] = int(rng.choice([0, 0xFF, 0x7F, 0x80, int(rng.integers(0, 256))]))
        elif kind == 2:
            for _ in range(rng.integers(1, 20)):
                i = int(rng.integers(0, len(b)))
                b[i] = int(rng.integers(0, 256))
        else:
            b = b[: int(rng.integers(0, len(b)))]
        out.append(bytes(b))
    return out


def test_header_parsers_agree_on_mutated_headers(sources):
    rng = np.random.default_rng(4)
    for data, _ in sources:
        for m in _mutations(data, rng, 150):
            c = kernels.audio_header(m)
            try:
                h = audio_header(m)
            except CodecError:
                assert c[0] != 0, m[:64]
                continue
            assert c[0] == 0
            assert c[2:5] == (h.sample_rate, h.channels, h.bits_per_sample) and c[6] == h.frames
            assert bool(c[5]) == (h.sample_format == "float")


def test_fuzzed_values_never_crash_and_decode_or_refuse(sources):
    rng = np.random.default_rng(5)
    for data, _ in sources:
        muts = _mutations(data, rng, 60)
        for m in muts:
            try:
                h = audio_header(m)
                frames, chans = h.frames, h.channels
            except CodecError:
                frames, chans = 6000, 2
            if not 1 <= chans <= 8:
                continue
            count = min(frames, 7000)
            out, status = windows([m, m], [0, min(3000, frames)], count, chans, expect=None)
            assert status.tolist()[0] in range(7)
            f = Field("a", "float32", (None, chans), codec="flac" if m[:1] != b"R" else "wav")
            try:  # through the codec: decoded, or a CodecError
                f.codec_obj.decode(m, (frames, chans), f) if frames <= 10**6 else None
            except CodecError:
                pass


def test_bogus_frame_counts_and_huge_declared_sizes(sources, tmp_path):
    data, full = sources[0]
    pos = 4 + 4 + 13  # fLaC, the block header, STREAMINFO's 13 bytes before the frame count
    assert data[:4] == b"fLaC"

    def with_frames(n):
        b = bytearray(data)
        b[pos] = (b[pos] & 0xF0) | (n >> 32)
        b[pos + 1 : pos + 5] = (n & 0xFFFFFFFF).to_bytes(4, "big")
        return bytes(b)

    more, fewer, huge = with_frames(9000), with_frames(5000), with_frames(2**36 - 1)
    assert audio_header(huge).frames == 2**36 - 1
    _, s = windows([more], [0], 9000, 2, expect=np.array([9000]))
    assert s[0] == kernels.AUDIO_TRUNCATED
    _, s = windows([fewer], [0], 5000, 2, expect=np.array([5000]))
    assert s[0] == kernels.AUDIO_SIZE  # a frame beyond the declared end
    _, s = windows([huge], [2**35], 100, 2)  # a seek past the audio: nothing is allocated
    assert s[0] != 0
    cut = data[: len(data) * 2 // 3]  # inside a frame
    _, s = windows([cut, cut], [0, 5000], 6000, 2, expect=np.array([6000, 6000]))
    assert s[0] == kernels.AUDIO_TRUNCATED  # decoded up to the cut
    assert s[1] in (kernels.AUDIO_TRUNCATED, kernels.AUDIO_CORRUPT)  # a seek past it fails
    _, s = windows([data], [0], 6000, 2, expect=np.array([6001]))
    assert s[0] == kernels.AUDIO_SIZE
    # the writer refuses what a reader would have to allocate beyond the per-value limit
    schema = Schema([Field("a", "float32", (None, 2), codec="flac")])
    with rowstore.Writer(str(tmp_path / "x.h5"), schema) as w:
        with pytest.raises(RowValidationError, match="exceeds"):
            w.write({"a": huge})
    # WAV: a data chunk larger than the file, a block align of zero
    wav = sources[3][0]
    i = wav.index(b"data")
    bad = wav[: i + 4] + struct.pack("<I", 2**32 - 1) + wav[i + 8 :]
    with pytest.raises(CodecError, match="truncated WAV"):
        audio_header(bad)
    assert kernels.audio_header(bad)[0] == kernels.AUDIO_TRUNCATED


def test_the_committed_hostile_corpus():
    files = sorted(glob.glob(os.path.join(CORPUS, "*")))
    files = [f for f in files if not f.endswith(".md")]
    assert len(files) >= 10
    for path in files:
        data = open(path, "rb").read()
        kind = "wav" if data[:4] == b"RIFF" else "flac"
        f = Field("a", "float32", (None, None), codec=kind)
        try:
            h = audio_header(data)
        except RowstoreError:
            assert kernels.audio_header(data)[0] != 0, path
            continue
        if h.frames * h.channels <= 10**7:
            with pytest.raises(RowstoreError):
                f.codec_obj.decode(data, (h.frames, h.channels), f)
        _, s = windows([data], [h.frames // 2], 1000, h.channels)  # no crash, a status
        assert 0 <= s[0] <= 6


def test_flac_encode_round_trip_and_a_small_buffer():
    rng = np.random.default_rng(6)
    x = rng.integers(-(2**15), 2**15, (5000, 3), dtype=np.int32)
    data = kernels.flac_encode(x, 16, 44100, 5)
    h = audio_header(data)
    assert (h.frames, h.channels, h.bits_per_sample, h.sample_rate) == (5000, 3, 16, 44100)
    np.testing.assert_array_equal(sf.read(io.BytesIO(data), dtype="int16")[0], x)
    with pytest.raises(ValueError):
        kernels.flac_encode(np.full((10, 1), 2**20, np.int32), 16, 8000, 5)  # over 16 bits


def test_a_window_is_seeked_to_not_decoded_from_the_start(sources):
    """Damage in the first FLAC frame refuses a whole decode, but a window past it decodes
    exactly: the kernel seeks to the window and decodes only the frames it covers."""
    data, full = sources[0]  # 16-bit, 4096-frame blocks
    h = audio_header(data)
    first = bytearray(data)
    first[kernels.audio_header(data)[7] + 100] ^= 0xFF  # inside the first audio frame
    damaged = bytes(first)
    _, s = windows([damaged], [0], h.frames, 2, expect=np.array([h.frames]))
    assert s[0] != 0
    out, s = windows([damaged], [4500], 1000, 2)
    assert s[0] == 0
    np.testing.assert_array_equal(out[0], full[4500:5500])
