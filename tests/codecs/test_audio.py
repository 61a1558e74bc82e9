"""The flac and wav codecs: FLAC/WAV bytes stored as they are after a header check, arrays
encoded losslessly, and decoded samples equal to soundfile's (libsndfile's) for every bit depth
and channel count, through the kernel and through the soundfile fallback."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

import rowstore
from rowstore import CodecError, Field, Schema
from rowstore.codecs import audio
from rowstore.errors import RowValidationError, SchemaError

sf = pytest.importorskip("soundfile")

#: (format, subtype, bits) of the sources soundfile writes
SOURCES = [
    ("FLAC", "PCM_16", 16),
    ("FLAC", "PCM_24", 24),
    ("FLAC", "PCM_S8", 8),
    ("WAV", "PCM_16", 16),
    ("WAV", "PCM_24", 24),
    ("WAV", "PCM_32", 32),
    ("WAV", "PCM_U8", 8),
    ("WAV", "FLOAT", 32),
    ("WAVEX", "PCM_16", 16),
    ("WAVEX", "FLOAT", 32),
]


def make_audio(fmt, subtype, frames, channels, rate=16000, seed=0):
    """Random audio of full-scale noise and a quiet tone, encoded by soundfile."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames)[:, None] / rate
    x = 0.9 * rng.uniform(-1, 1, (frames, channels)) * (rng.uniform() > 0.3)
    x = x + 0.05 * np.sin(2 * np.pi * 440 * t * (1 + np.arange(channels)))
    x = np.clip(x, -1, 1).astype(np.float64)
    x[:3] = [[1.0] * channels, [-1.0] * channels, [0.0] * channels]
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", rate, channels, subtype=subtype, format=fmt) as f:
        f.write(x)
    return buf.getvalue()


def sf_read(data, dtype):
    return sf.read(io.BytesIO(data), dtype=dtype, always_2d=True)[0]


@pytest.fixture(params=[True, False], ids=["kernel", "soundfile"])
def kernel(request, monkeypatch):
    if request.param and not rowstore.kernels.AUDIO_AVAILABLE:
        pytest.skip("built without libFLAC")
    if not request.param:
        monkeypatch.setattr(rowstore.kernels, "AUDIO_AVAILABLE", False)
    return request.param


@pytest.mark.parametrize("fmt,subtype,bits", SOURCES)
@pytest.mark.parametrize("channels", [1, 2])
def test_header_and_decode_equal_soundfile(fmt, subtype, bits, channels, kernel):
    data = make_audio(fmt, subtype, 3001, channels, rate=22050, seed=bits + channels)
    hdr = audio.audio_header(data)
    kind = "flac" if fmt == "FLAC" else "wav"
    assert (hdr.format, hdr.sample_rate, hdr.channels, hdr.frames) == (kind, 22050, channels, 3001)
    assert hdr.bits_per_sample == bits
    assert hdr.sample_format == ("float" if subtype == "FLOAT" else "int")
    codec = rowstore.codecs.get_codec(kind)
    field = Field("a", "float32", (None, channels), codec=kind)
    dtypes = ["float32"] if subtype == "FLOAT" else ["float32", "int32"] + ["int16"] * (bits <= 16)
    for dt in dtypes:
        f = Field("a", dt, (None, channels), codec=kind)
        got = f.codec_obj.decode(data, (3001, channels), f)
        want = sf_read(data, dt)
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(got, want)
    if rowstore.kernels.AUDIO_AVAILABLE:
        c = rowstore.kernels.audio_header(data)
        assert c[0] == 0 and c[2:5] == (22050, channels, bits) and c[6] == 3001
    assert field.codec_obj == codec


@pytest.mark.parametrize("codec", ["flac", "wav"])
def test_bytes_stored_as_they_are_and_read_back(codec, h5path, kernel):
    fmt = "FLAC" if codec == "flac" else "WAV"
    files = [make_audio(fmt, "PCM_16", 800 + 137 * i, 1, seed=i) for i in range(7)]
    schema = Schema(
        [
            Field("a", "float32", (None,), codec={"id": codec, "sample_rate": 16000}),
            Field("i", "i4"),
        ]
    )
    with rowstore.Writer(h5path, schema, rows_per_block=3) as w:
        for i, data in enumerate(files):
            w.write({"a": data, "i": i})
    from helpers import stored_payloads

    assert stored_payloads(h5path, "a") == files
    r = rowstore.open(h5path)
    b = r.take([6, 0, 3])
    assert b["a"].shapes.tolist() == [[800 + 137 * 6], [800], [800 + 137 * 3]]
    for k, i in enumerate([6, 0, 3]):
        np.testing.assert_array_equal(b["a"][k], sf_read(files[i], "float32")[:, 0])
    for batch in r.batches(batch_size=4, num_threads=2):
        for k, i in enumerate(batch["i"]):
            np.testing.assert_array_equal(batch["a"][k], sf_read(files[i], "float32")[:, 0])


@pytest.mark.parametrize(
    "codec,dtype,shape,bits",
    [
        ("flac", "int16", (None,), None),
        ("flac", "float32", (None, 2), None),
        ("flac", "float32", (None,), 24),
        ("flac", "int32", (None, 3), None),
        ("wav", "int16", (None, 2), None),
        ("wav", "int32", (None,), None),
        ("wav", "float32", (None, None), None),
        ("flac", "int16", (500, 2), None),
    ],
)
def test_arrays_encoded_losslessly(codec, dtype, shape, bits, h5path, kernel):
    cfg = {"id": codec, "sample_rate": 8000} | ({"bits": bits} if bits else {})
    schema = Schema([Field("a", dtype, shape, codec=cfg)])
    rng = np.random.default_rng(5)
    b = bits or (24 if dtype == "int32" else 16)
    rows = []
    for i in range(5):
        frames = shape[0] or 300 + 50 * i
        chans = (shape[1] or 1 + i % 3) if len(shape) == 2 else None
        dims = (frames, chans) if chans else (frames,)
        if dtype == "float32" and codec == "flac":
            v = rng.integers(-(2 ** (b - 1)), 2 ** (b - 1), dims) / 2.0 ** (b - 1)
        elif dtype == "float32":
            v = rng.standard_normal(dims) * 3  # float WAV: any float32
        elif dtype == "int32" and codec == "flac":
            v = rng.integers(-(2**23), 2**23, dims) << 8
        else:
            info = np.iinfo(dtype)
            v = rng.integers(info.min, info.max, dims, endpoint=True)
        rows.append(v.astype(dtype))
    with rowstore.Writer(h5path, schema, threads=2) as w:
        w.write_batch({"a": rows})
    got = rowstore.open(h5path).take(np.arange(5))["a"]
    for i in range(5):
        np.testing.assert_array_equal(got[i], rows[i])
    from helpers import stored_payloads

    for i, data in enumerate(stored_payloads(h5path, "a")):
        want = sf_read(data, dtype)
        np.testing.assert_array_equal(want.reshape(rows[i].shape), rows[i])


def test_value_checks_name_field_and_row(h5path):
    schema = Schema([Field("a", "float32", (None,), codec={"id": "flac", "sample_rate": 16000})])
    stereo = make_audio("FLAC", "PCM_16", 100, 2)
    cases = [
        (make_audio("FLAC", "PCM_16", 100, 1, rate=8000), "8000 Hz"),
        (stereo, "2-channel audio for a mono field"),
        (make_audio("WAV", "PCM_16", 100, 1), "got WAV bytes, not FLAC"),
        (b"fLaC" + b"\0" * 10, "truncated"),
        (b"OggS" + b"\0" * 60, "not FLAC or WAV"),
        (np.float32([0.1, 0.2]), "not an exact 16-bit sample"),
        (np.zeros(0, np.float32), "empty waveform"),
    ]
    for value, why in cases:
        with rowstore.Writer(h5path, schema, mode="w") as w:
            w.write({"a": np.zeros(4, np.float32)})
            with pytest.raises(RowValidationError, match=why) as ei:
                w.write({"a": value})
            assert ei.value.field == "a" and ei.value.row == 1
    s16 = Schema([Field("a", "int16", (None, 2), codec="flac")])
    with rowstore.Writer(h5path, s16, mode="w") as w:
        with pytest.raises(RowValidationError, match="fit an int16 field"):
            w.write({"a": make_audio("FLAC", "PCM_24", 100, 2)})
        with pytest.raises(RowValidationError, match="needs the sample rate"):
            w.write({"a": np.zeros((5, 2), np.int16)})


def test_schema_and_config_checks():
    with pytest.raises(SchemaError, match="float32/int16/int32"):
        Field("a", "uint8", (None,), codec="flac")
    with pytest.raises(SchemaError, match="channels"):
        Field("a", "float32", (None, 9), codec="wav")
    with pytest.raises(SchemaError, match="needs shape"):
        Field("a", "float32", (None, 2, 2), codec="wav")
    with pytest.raises(CodecError, match="sample_rate"):
        Field("a", "float32", (None,), codec={"id": "flac", "sample_rate": 0})
    with pytest.raises(CodecError, match="bits"):
        Field("a", "float32", (None,), codec={"id": "flac", "bits": 12})
    f = Field("a", "float32", (None,), codec={"id": "flac", "sample_rate": 16000, "level": 8})
    assert f.codec == {"id": "flac", "sample_rate": 16000, "bits": None, "level": 8}
    assert Field.from_json(f.to_json()) == f


def _wav(fmt_chunk: bytes, data: bytes, extra: bytes = b"") -> bytes:
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk + extra
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_wav_chunks_before_data_and_odd_padding(kernel):
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    x = np.arange(-5, 6, dtype="<i2")
    data = _wav(fmt, x.tobytes(), extra=b"LIST" + struct.pack("<I", 3) + b"abc\0")
    f = Field("a", "int16", (None,), codec="wav")
    np.testing.assert_array_equal(f.codec_obj.decode(data, (11,), f), x)
    np.testing.assert_array_equal(sf_read(data, "int16")[:, 0], x)
    adpcm = _wav(struct.pack("<HHIIHH", 2, 1, 8000, 4000, 256, 4), b"\0" * 256)
    with pytest.raises(CodecError, match="compressed WAV"):
        audio.audio_header(adpcm)


def test_decoded_value_of_the_wrong_shape_is_refused(kernel):
    data = make_audio("FLAC", "PCM_16", 500, 2)
    f = Field("a", "float32", (None, 2), codec="flac")
    with pytest.raises(CodecError, match="frames or channels"):
        f.codec_obj.decode(data, (499, 2), f)
    with pytest.raises(CodecError, match="frames or channels"):
        f.codec_obj.decode(data, (500, 1), f)
