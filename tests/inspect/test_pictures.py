"""The pictures of the views against reference decoders: PNG files decoded by Pillow, WAV files
read by the standard library's ``wave``, SVG parsed as XML; bounds of thumbnails and previews;
sampling and bounded reads of values."""

from __future__ import annotations

import io
import wave
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema, _pictures
from rowstore._html import esc, table
from rowstore.reader.samples import (
    MAX_VALUE_BYTES,
    Reduced,
    Skipped,
    read_sample,
    sample_rows,
    value_text,
)

PIL = pytest.importorskip("PIL.Image")


@pytest.mark.parametrize("shape", [(7, 5), (7, 5, 1), (4, 9, 2), (3, 6, 3), (5, 5, 4), (1, 1, 3)])
def test_png_bytes_decode_as_written(shape):
    a = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    got = np.asarray(PIL.open(io.BytesIO(_pictures.png_bytes(a))))
    assert np.array_equal(got, a.reshape(got.shape))


def test_png_bytes_refuses_what_png_cannot_hold():
    for bad in (np.zeros((4, 4), np.uint16), np.zeros((4, 4, 5), np.uint8), np.zeros((0, 4))):
        with pytest.raises(ValueError, match="png_bytes takes"):
            _pictures.png_bytes(bad)


def test_thumbnail_bounds_and_box_average():
    img = np.random.default_rng(0).integers(0, 256, (1000, 300, 3), dtype=np.uint8)
    t = _pictures.thumbnail(img, max_side=128)
    assert t.shape == (125, 37, 3) and t.dtype == np.uint8  # box of 8: 1000 // 8, 300 // 8
    ref = img[:1000, :296].reshape(125, 8, 37, 8, 3).mean(axis=(1, 3))
    assert np.abs(t.astype(float) - ref).max() <= 0.5 + 1e-6
    sliver = _pictures.thumbnail(np.zeros((2, 100_000), np.uint8), max_side=64)
    assert max(sliver.shape) <= 64
    small = _pictures.thumbnail(np.arange(9 * 27, dtype=np.float64).reshape(9, 27))
    assert small.shape == (27, 81, 3)  # a heatmap, enlarged 3x without smoothing
    nan = _pictures.thumbnail(np.full((4, 4), np.nan))
    assert nan.shape[2] == 3 and not nan.any()  # drawn black, no warning, no error


def test_wav_preview_is_read_by_the_wave_module():
    rate = 44_100
    t = np.arange(rate * 6) / rate
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    data = _pictures.wav_bytes(x, rate)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 14_700)
        frames = w.getnframes()
        pcm = np.frombuffer(w.readframes(frames), "<i2")
    assert frames / 14_700 <= _pictures.MAX_PLAYER_SECONDS
    ref = x[: len(pcm) * 3].reshape(-1, 3).mean(axis=1)
    assert np.abs(pcm / 32767 - ref).max() < 1e-3
    loud = _pictures.wav_bytes(np.array([0.0, 4.0, -2.0]), 8000)
    with wave.open(io.BytesIO(loud)) as w:
        assert list(np.frombuffer(w.readframes(3), "<i2")) == [0, 32767, -16384]


def test_spectrogram_of_a_tone():
    rate = 16_000
    t = np.arange(rate) / rate
    s = _pictures.spectrogram(np.sin(2 * np.pi * 2000 * t), width=100, height=64)
    assert s.shape == (64, 100, 3)
    brightness = s.astype(int).sum(axis=(1, 2))
    # 2 kHz of 8 kHz: a quarter of the way up, row 64 - 16 = 48 from the top
    assert abs(int(np.argmax(brightness)) - 48) <= 1


def test_svg_is_well_formed_and_escapes_labels():
    evil = ["<script>alert(1)</script>", 'a"b', "x" * 300]
    for svg in (
        _pictures.svg_bars(evil, [3, 2, 1]),
        _pictures.svg_histogram([0, 1, 2, 3], [5, 0, 7]),
        _pictures.svg_histogram(np.linspace(0, 1, 1001), np.ones(1000)),
        _pictures.svg_scatter(np.arange(5000), np.arange(5000) % 7, xlabel="<x>"),
        _pictures.svg_waveform(np.sin(np.arange(10_000) / 50)),
    ):
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        assert "<script" not in svg and len(svg) < 300_000
    assert len(ET.fromstring(_pictures.svg_histogram(np.arange(1002), np.ones(1001)))) <= 260


def test_html_escapes_everything():
    assert esc('<a href="x">') == "&lt;a href=&quot;x&quot;&gt;"
    assert len(esc("y" * 10_000)) == 120
    assert "<script>" not in table(["<script>"], [["<script>", "\x00"]])


def test_sample_rows_is_a_pure_function():
    a = sample_rows(1_000_000, 24, seed=3)
    assert np.array_equal(a, sample_rows(1_000_000, 24, seed=3))
    assert len(np.unique(a)) == 24 and (np.diff(a) > 0).all() and a.max() < 1_000_000
    assert not np.array_equal(a, sample_rows(1_000_000, 24, seed=4))
    assert np.array_equal(sample_rows(5, 24), np.arange(5))


def test_read_sample_skips_values_over_the_bounds(tmp_path):
    """A value whose decoded size is over MAX_VALUE_BYTES is neither read nor decoded; the
    others are, and nulls stay None."""
    side = int(np.sqrt(MAX_VALUE_BYTES)) + 1
    huge = _pictures.png_bytes(np.zeros((side, side), np.uint8))
    small = _pictures.png_bytes(np.full((3, 4), 7, np.uint8))
    schema = Schema(
        [
            Field("img", "uint8", (None, None), codec="png"),
            Field("wave", "float32", (None,), nullable=True),
        ]
    )
    path = str(tmp_path / "b.h5")
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"img": [small, huge, small], "wave": [np.ones(5, np.float32), None, None]})
    with rowstore.open(path) as r:
        got = read_sample(r, [0, 1, 2])
    assert isinstance(got["img"][1], Skipped) and f"{side}x{side} uint8" in str(got["img"][1])
    assert np.array_equal(got["img"][0], np.full((3, 4), 7, np.uint8))
    assert np.array_equal(got["img"][2], got["img"][0])
    assert np.array_equal(got["wave"][0], np.ones(5, np.float32)) and got["wave"][1:] == [
        None,
        None,
    ]


def test_read_sample_decodes_a_huge_jpeg_smaller(tmp_path):
    """A JPEG over the bounds is decoded by the reader's JPEG kernel to a thumbnail
    (``decode=Resize``, DCT scaling), never whole: a Reduced array that keeps its full shape."""
    imagecodecs = pytest.importorskip("imagecodecs")
    big = imagecodecs.jpeg8_encode(np.full((3000, 4200, 3), 120, np.uint8))  # 37.8 MB decoded
    small = imagecodecs.jpeg8_encode(np.full((30, 40, 3), 60, np.uint8))
    schema = Schema([Field("img", "uint8", (None, None, 3), codec="jpeg")])
    path = str(tmp_path / "j.h5")
    with rowstore.Writer(path, schema) as w:
        w.write_batch({"img": [small, big]})
    with rowstore.open(path) as r:
        got = read_sample(r, [0, 1])["img"]
    assert not isinstance(got[0], Reduced) and got[0].shape == (30, 40, 3)
    assert isinstance(got[1], Reduced) and got[1].full_shape == (3000, 4200, 3)
    assert got[1].shape == (91, 128, 3) and np.abs(got[1].astype(int) - 120).max() <= 2
    assert "uint8[3000x4200x3], shown decoded at 128x91" in value_text(got[1])


def test_time_statistics_read_as_times(tmp_path):
    """A datetime64 field's stored statistics (counts of its unit) are shown as times, a
    timedelta64 field's in its unit."""
    from rowstore.reader.view import fields_table

    schema = Schema([Field("t", "datetime64[ns]"), Field("dt", "timedelta64[s]")])
    path = str(tmp_path / "t.h5")
    with rowstore.Writer(path, schema) as w:
        w.write_batch(
            {
                "t": np.array(["2026-01-01T00:00", "2026-03-01T12:00"], "M8[ns]"),
                "dt": np.array([5, 65], "m8[s]"),
            }
        )
    with rowstore.open(path) as r:
        if r.stats() is None:
            pytest.skip("this build keeps no statistics")
        html = fields_table(r.schema, r.stats())
    assert "2026-01-01T00:00:00.000000000" in html and "2026-03-01T12:00:00.000000000" in html
    assert "<td>5 s</td><td>65 s</td><td>35 s</td>" in html
