"""rowstore.huggingface: Hugging Face datasets built locally (never from the Hub) written as
rowstore files and read back: every feature kind round trips exactly, splits, images and audio,
streaming memory, errors naming the feature."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import os

import numpy as np
import pytest
from helpers import peak_allocations, raised_without_blocking, stored_payloads

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
imagecodecs = pytest.importorskip("imagecodecs")

from datasets import (  # noqa: E402  (after the importorskip)
    Array2D,
    Array3D,
    Array4D,
    Array5D,
    Audio,
    ClassLabel,
    Dataset,
    DatasetDict,
    Features,
    Image,
    LargeList,
    List,
    Sequence,
    Value,
)

import rowstore  # noqa: E402
from rowstore import Field, RowValidationError, Schema, SchemaError  # noqa: E402
from rowstore.errors import InputError, OutsideRootError  # noqa: E402
from rowstore.huggingface import from_huggingface, infer_schema, to_huggingface  # noqa: E402

N = 13


def assert_same_dataset(got, want) -> None:
    """Same features, same Arrow storage (types and values), same rows in the same order."""
    assert got.features == want.features
    assert list(got.features) == list(want.features)
    g = got.with_format("arrow")[:]
    w = want.with_format("arrow")[:]
    assert g.schema.remove_metadata() == w.schema.remove_metadata()
    for name in w.column_names:
        assert _canon(_storage(g.column(name))) == _canon(_storage(w.column(name))), name


def _storage(col) -> list:
    """A column's values as Python objects; an extension column's (Array2D..) from its storage
    (datasets' own to_pylist fails on a null row)."""
    if isinstance(col.type, pa.ExtensionType):
        return [v for c in col.chunks for v in c.storage.to_pylist()]
    return col.to_pylist()


def _canon(v):
    """Values comparable with ``==``: NaN as a string (NaN != NaN)."""
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, dict):
        return {k: _canon(x) for k, x in v.items()}
    return v


def _values(n: int = N) -> Dataset:
    rng = np.random.default_rng(0)
    features = Features(
        {
            "flag": Value("bool"),
            "i8": Value("int8"),
            "i16": Value("int16"),
            "i32": Value("int32"),
            "i64": Value("int64"),
            "u8": Value("uint8"),
            "u16": Value("uint16"),
            "u32": Value("uint32"),
            "u64": Value("uint64"),
            "f16": Value("float16"),
            "f32": Value("float32"),
            "f64": Value("float64"),
            "text": Value("string"),
            "big_text": Value("large_string"),
            "blob": Value("binary"),
            "big_blob": Value("large_binary"),
            "day": Value("date32"),
            "ms_day": Value("date64"),
            "when": Value("timestamp[us]"),
            "when_tz": Value("timestamp[ms, tz=Europe/Paris]"),
            "took": Value("duration[ns]"),
            "speaker id": Value("int32"),
        }
    )
    ints = {k: rng.integers(0, 100, n).tolist() for k in features if k[0] in "iu"}
    ints["i64"] = [None if k % 4 == 1 else 2**62 + k for k in range(n)]
    ints["u64"] = [2**64 - 1 - k for k in range(n)]
    t0 = dt.datetime(2021, 3, 4, 5, 6, 7, 123456)
    data = {
        "flag": [None if k % 5 == 2 else bool(k % 2) for k in range(n)],
        **ints,
        "f16": rng.standard_normal(n).astype(np.float16).tolist(),
        "f32": [float("nan") if k == 3 else float(np.float32(k / 3)) for k in range(n)],
        "f64": rng.standard_normal(n).tolist(),
        "text": [None if k % 3 == 0 else f"t{k} é😀" for k in range(n)],
        "big_text": [f"l{k}" * k for k in range(n)],
        "blob": [bytes(range(k % 7)) for k in range(n)],
        "big_blob": [None if k == 5 else bytes([k]) * k for k in range(n)],
        "day": [dt.date(2000, 1, 1) + dt.timedelta(days=37 * k) for k in range(n)],
        "ms_day": [dt.date(1999, 12, 31) + dt.timedelta(days=k) for k in range(n)],
        "when": [t0 + dt.timedelta(seconds=3601 * k, microseconds=k) for k in range(n)],
        "when_tz": [
            dt.datetime(2020, 6, 1, 12, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=k)
            for k in range(n)
        ],
        "took": [dt.timedelta(microseconds=17 * k) for k in range(n)],
        "speaker id": list(range(n)),
    }
    return _from_storage(data, features)


def _from_storage(data: dict, features: Features) -> Dataset:
    """A Dataset built from its Arrow storage (``Dataset.from_dict`` goes through Python ints of
    64 bits and, for Audio, torchcodec)."""
    return Dataset(pa.table(data, schema=features.arrow_schema))


def test_values_round_trip(tmp_path):
    ds = _values()
    path = str(tmp_path / "v.h5")
    schema = from_huggingface(ds, path, batch_rows=4)
    assert schema["i64"].nullable and not schema["u64"].nullable
    assert schema["text"].dtype == "str" and schema["blob"].dtype == "bytes"
    assert schema["when"].dtype == np.dtype("datetime64[us]")
    assert schema["took"].dtype == np.dtype("timedelta64[ns]")
    assert "speaker_id" in schema.names  # not an identifier: sanitized, restored below
    assert_same_dataset(to_huggingface(path, batch_rows=5), ds)
    with rowstore.open(path) as r:
        row = r[7]
        assert row["u64"] == 2**64 - 8 and row["i64"] == 2**62 + 7
        assert row["text"] == "t7 é😀" and row["blob"] == bytes(range(0))
        meta = r.layout.user_attrs["huggingface"]
        assert meta["columns"]["speaker_id"] == "speaker id"
        assert Features.from_dict(meta["features"]) == ds.features


def _arrays(n: int = N) -> Dataset:
    rng = np.random.default_rng(1)
    features = Features(
        {
            "wave": List(Value("float32")),
            "vec3": List(Value("int16"), length=3),
            "big": LargeList(Value("int8")),
            "seq": Sequence(Value("int64")),
            "grid": List(List(Value("int32"))),
            "pairs": List(List(Value("float64"), length=2)),
            "labels": List(ClassLabel(names=["a", "b", "c"])),
            "m2": Array2D((None, 2), "float32"),
            "m2f": Array2D((2, 3), "uint8"),
            "m3": Array3D((2, 1, 3), "int64"),
            "m4": Array4D((None, 2, 1, 2), "float16"),
            "m5": Array5D((1, 2, 1, 2, 1), "bool"),
        }
    )

    def ints(shape, dtype):
        return rng.integers(0, 3, shape).astype(dtype)

    data = {
        "wave": [rng.standard_normal(k % 4).astype(np.float32) for k in range(n)],
        "vec3": [None if k == 6 else ints(3, np.int16) for k in range(n)],
        "big": [None if k == 4 else ints(k, np.int8) for k in range(n)],
        "seq": [ints(k % 3, np.int64) for k in range(n)],
        "grid": [ints((k % 3, 1 + k % 2), np.int32).tolist() for k in range(n)],
        "pairs": [rng.standard_normal((k % 3, 2)).tolist() for k in range(n)],
        "labels": [ints(k % 4, np.int64).tolist() for k in range(n)],
        "m2": [
            None if k == 8 else rng.standard_normal((k % 3, 2)).astype(np.float32) for k in range(n)
        ],
        "m2f": [None if k in (0, 9) else ints((2, 3), np.uint8) for k in range(n)],
        "m3": [ints((2, 1, 3), np.int64) for _ in range(n)],
        "m4": [rng.standard_normal((1 + k % 2, 2, 1, 2)).astype(np.float16) for k in range(n)],
        "m5": [ints((1, 2, 1, 2, 1), bool) for _ in range(n)],
    }
    return Dataset.from_dict(data, features=features)


def test_arrays_round_trip(tmp_path):
    ds = _arrays()
    path = str(tmp_path / "a.h5")
    schema = from_huggingface(ds, path, batch_rows=3)
    shapes = {f.name: f.shape for f in schema}
    assert shapes == {
        "wave": (None,),
        "vec3": (3,),
        "big": (None,),
        "seq": (None,),
        "grid": (None, None),
        "pairs": (None, 2),
        "labels": (None,),
        "m2": (None, 2),
        "m2f": (2, 3),
        "m3": (2, 1, 3),
        "m4": (None, 2, 1, 2),
        "m5": (1, 2, 1, 2, 1),
    }
    assert schema["big"].nullable and schema["m2f"].nullable and not schema["wave"].nullable
    assert_same_dataset(to_huggingface(path, batch_rows=4), ds)
    # What rowstore readers see: the arrays themselves.
    with rowstore.open(path) as r:
        np.testing.assert_array_equal(r[5]["m2"], np.asarray(ds[5]["m2"], np.float32))
        assert r[0]["m2"].shape == (0, 2) and r[4]["big"] is None
        np.testing.assert_array_equal(r[2]["m4"], np.asarray(ds[2]["m4"], np.float16))


def test_class_label_names_are_kept_and_restored(tmp_path):
    features = Features({"label": ClassLabel(names=["cat", "dog", "bird"]), "x": Value("int8")})
    ds = Dataset.from_dict({"label": [0, 2, 1, -1, 2], "x": [1, 2, 3, 4, 5]}, features=features)
    path = str(tmp_path / "c.h5")
    schema = from_huggingface(ds, path)
    assert schema["label"].dtype == np.dtype("int64")
    with rowstore.open(path) as r:
        assert r.layout.user_attrs["huggingface"]["class_names"] == {
            "label": ["cat", "dog", "bird"]
        }
        assert r.take([0, 1, 2, 3])["label"].tolist() == [0, 2, 1, -1]
    back = to_huggingface(path)
    assert back.features["label"].names == ["cat", "dog", "bird"]
    assert back.features["label"].int2str(2) == "bird"
    assert_same_dataset(back, ds)


def test_row_order_of_a_shuffled_or_filtered_dataset(tmp_path):
    ds = _values(40).shuffle(seed=3).filter(lambda r: r["i32"] % 3 != 0)
    assert ds._indices is not None  # an indices mapping: the order is not the table's
    path = str(tmp_path / "s.h5")
    from_huggingface(ds, path, batch_rows=7)
    assert_same_dataset(to_huggingface(path), ds)


def test_dataset_dict_one_directory_per_split(tmp_path):
    dd = DatasetDict({"train": _values(9), "test": _values(4), "validation": _values(2)})
    path = str(tmp_path / "dd")
    schemas = from_huggingface(dd, path, shard_bytes=1 << 20)
    assert list(schemas) == ["train", "test", "validation"]
    assert sorted(os.listdir(path)) == ["test", "train", "validation"]
    with rowstore.open(os.path.join(path, "test")) as r:
        assert len(r) == 4 and r.layout.user_attrs["huggingface"]["split"] == "test"
    back = to_huggingface(path)
    assert list(back) == ["train", "test", "validation"]  # the DatasetDict's order
    for s in dd:
        assert_same_dataset(back[s], dd[s])
        assert str(back[s].split) == s


def test_dataset_dict_in_one_output_with_a_split_field(tmp_path):
    dd = DatasetDict({"train": _arrays(7), "test": _arrays(3)})
    path = str(tmp_path / "one.h5")
    schema = from_huggingface(dd, path, split_field="split")
    assert schema["split"].dtype == np.dtype("int16")
    with rowstore.open(path) as r:
        assert r.take(np.arange(10))["split"].tolist() == [0] * 7 + [1] * 3
        meta = r.layout.user_attrs["huggingface"]
        assert meta["splits"] == ["train", "test"]
        assert meta["split_rows"] == {"train": [0, 7], "test": [7, 10]}
    back = to_huggingface(path)
    assert list(back) == ["train", "test"]
    for s in dd:
        assert_same_dataset(back[s], dd[s])
    with pytest.raises(SchemaError, match="'wave' is a column"):
        from_huggingface(dd, str(tmp_path / "x.h5"), split_field="wave")
    other = DatasetDict({"train": _arrays(2), "test": _values(2)})
    with pytest.raises(SchemaError, match="split 'test' has other features"):
        from_huggingface(other, str(tmp_path / "y.h5"), split_field="split")


def test_memory_mapped_result_in_a_cache_dir(tmp_path):
    ds = _arrays()
    path = str(tmp_path / "a")
    from_huggingface(ds, path, dataset=True)
    back = to_huggingface(path, cache_dir=str(tmp_path / "cache"), batch_rows=2)
    assert back.cache_files and back.cache_files[0]["filename"].startswith(str(tmp_path))
    assert_same_dataset(back, ds)
    assert list(to_huggingface(path, fields=["m3", "wave"]).features) == ["m3", "wave"]


# -- images ------------------------------------------------------------------------------------
def _image(rng, h: int, w: int, c: int | None) -> np.ndarray:
    shape = (h, w) if c is None else (h, w, c)
    yy, xx = np.mgrid[:h, :w]
    base = ((yy * 7 + xx * 3) % 256).astype(np.uint8)
    img = base if c is None else np.repeat(base[..., None], c, axis=2)
    return (img + rng.integers(0, 3, shape)).astype(np.uint8)


def _image_dataset(fmt: str = "png", n: int = 6, channels: int | None = 3):
    rng = np.random.default_rng(2)
    arrays = [_image(rng, 8 + k, 5 + 2 * k, channels) for k in range(n)]
    if fmt == "png":
        blobs = [imagecodecs.png_encode(a) for a in arrays]
    else:
        blobs = [imagecodecs.jpeg8_encode(a, level=92) for a in arrays]
    ds = Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in blobs], "label": list(range(n))},
        features=Features({"image": Image(), "label": ClassLabel(num_classes=n)}),
    )
    return ds, arrays, blobs


def test_decoded_images(tmp_path):
    ds, arrays, _ = _image_dataset("png")
    path = str(tmp_path / "d.h5")
    schema = from_huggingface(ds, path, decode_images=True, batch_rows=4)
    assert schema["image"] == Field("image", "uint8", (None, None, 3))
    with rowstore.open(path) as r:
        for k, a in enumerate(arrays):
            np.testing.assert_array_equal(r[k]["image"], a)
    back = to_huggingface(path)
    assert back.features == ds.features
    for k, a in enumerate(arrays):  # pixels identical (encoded again as PNG)
        np.testing.assert_array_equal(np.asarray(back[k]["image"]), a)


def test_decoded_images_follow_the_feature_mode(tmp_path):
    ds, arrays, _ = _image_dataset("png", channels=3)
    grey = ds.cast_column("image", Image(mode="L"))
    path = str(tmp_path / "g.h5")
    schema = from_huggingface(grey, path, decode_images=True)
    assert schema["image"].shape == (None, None)
    with rowstore.open(path) as r:
        np.testing.assert_array_equal(r[2]["image"], np.asarray(grey[2]["image"]))


def test_decoded_images_of_other_channels_name_the_row(tmp_path):
    rng = np.random.default_rng(3)
    blobs = [imagecodecs.png_encode(_image(rng, 4, 4, 3)) for _ in range(3)]
    blobs.append(imagecodecs.png_encode(_image(rng, 4, 4, 4)))  # RGBA in the next batch
    ds = Dataset.from_dict({"image": blobs}, features=Features({"image": Image()}))
    with pytest.raises(RowValidationError, match=r"feature 'image', row 3.*mode") as e:
        from_huggingface(ds, str(tmp_path / "x.h5"), decode_images=True, batch_rows=2)
    assert e.value.row == 3


# -- audio --------------------------------------------------------------------------------------
def _wav(samples: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "FLOAT") -> bytes:
    sf = pytest.importorskip("soundfile")
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _audio_dataset(rate: int = 16000, channels: int = 1, n: int = 5, fmt: str = "WAV"):
    rng = np.random.default_rng(4)
    clips = [rng.standard_normal((100 + 10 * k, channels)).astype(np.float32) for k in range(n)]
    if fmt == "FLAC":  # 16-bit samples (FLAC holds integers): exact as float32 / 32768
        clips = [np.round(np.clip(c, -1, 1) * 32767).astype(np.float32) / 32768 for c in clips]
    blobs = [_wav(c, rate, fmt, "FLOAT" if fmt == "WAV" else "PCM_16") for c in clips]
    features = Features({"audio": Audio(sampling_rate=rate), "text": Value("string")})
    data = {
        "audio": [{"bytes": b, "path": None} for b in blobs],
        "text": [str(k) for k in range(n)],
    }
    return _from_storage(data, features), clips, blobs


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
@pytest.mark.parametrize("channels", [1, 2])
def test_audio_bytes_round_trip(tmp_path, fmt, channels):
    """FLAC/WAV bytes stored as they are in a field of their codec, read as samples (the
    audio kernel's decode equals soundfile's), handed back to datasets as they are."""
    ds, clips, blobs = _audio_dataset(fmt=fmt, channels=channels)
    path = str(tmp_path / "a.h5")
    schema = from_huggingface(ds, path, batch_rows=2)
    f = schema["audio"]
    assert (f.codec["id"], str(f.dtype)) == (fmt.lower(), "float32")
    assert f.shape == ((None,) if channels == 1 else (None, channels))
    assert stored_payloads(path, "audio") == blobs
    with rowstore.open(path) as r:
        for k, c in enumerate(clips):
            np.testing.assert_array_equal(r[k]["audio"], c[:, 0] if channels == 1 else c)
        meta = r.layout.user_attrs["huggingface"]["audio"]["audio"]
        assert meta["sampling_rate"] == 16000 and meta["codec"] == fmt.lower()
    assert_same_dataset(to_huggingface(path), ds)


def test_audio_of_other_formats_stays_bytes(tmp_path):
    """Bytes that are neither FLAC nor WAV (an MP3's, here its ID3 tag and frame sync) are
    stored in a bytes field, as they are."""
    blobs = [b"ID3\x04\x00\x00\x00\x00\x00\x00\xff\xfb" + bytes([k]) * 40 for k in range(3)]
    ds = _from_storage(
        {"audio": [{"bytes": b, "path": None} for b in blobs]},
        Features({"audio": Audio(sampling_rate=16000)}),
    )
    path = str(tmp_path / "a.h5")
    assert from_huggingface(ds, path)["audio"].dtype == "bytes"
    with rowstore.open(path) as r:
        assert [r[k]["audio"] for k in range(3)] == blobs
    assert_same_dataset(to_huggingface(path), ds)


def test_audio_of_another_format_than_the_first_names_its_row(tmp_path):
    ds, clips, blobs = _audio_dataset(fmt="FLAC", n=3)
    rows = [{"bytes": b, "path": None} for b in blobs] + [
        {"bytes": _wav(clips[0], 16000), "path": None}
    ]
    ds = _from_storage({"audio": rows, "text": list("abcd")}, ds.features)
    with pytest.raises(RowValidationError, match="feature 'audio', row 3: wav bytes") as e:
        from_huggingface(ds, str(tmp_path / "x.h5"), batch_rows=2)
    assert e.value.row == 3


def test_audio_of_another_rate_than_the_first_names_its_row(tmp_path):
    ds, clips, blobs = _audio_dataset(n=3)
    rows = [{"bytes": b, "path": None} for b in blobs] + [
        {"bytes": _wav(clips[0], 8000), "path": None}
    ]
    ds = _from_storage({"audio": rows, "text": list("abcd")}, ds.features)
    with pytest.raises(RowValidationError, match="row 3") as e:
        from_huggingface(ds, str(tmp_path / "x.h5"), batch_rows=2)
    assert e.value.row == 3 and "8000" in str(e.value)


def test_damaged_audio_bytes_name_their_row(tmp_path):
    ds, _, blobs = _audio_dataset(fmt="FLAC", n=3)
    rows = [{"bytes": b, "path": None} for b in blobs[:2]] + [
        {"bytes": blobs[2][:30], "path": None}
    ]
    ds = _from_storage({"audio": rows, "text": list("abc")}, ds.features)
    with pytest.raises(RowValidationError, match="row 2") as e:
        from_huggingface(ds, str(tmp_path / "x.h5"))
    assert e.value.row == 2


@pytest.mark.parametrize("channels", [1, 2])
def test_decoded_audio(tmp_path, channels):
    ds, clips, _ = _audio_dataset(channels=channels)
    path = str(tmp_path / "a.h5")
    schema = from_huggingface(ds, path, decode_audio=True, batch_rows=2)
    assert schema["audio"].shape == ((None,) if channels == 1 else (channels, None))
    with rowstore.open(path) as r:
        for k, c in enumerate(clips):
            np.testing.assert_array_equal(r[k]["audio"], c[:, 0] if channels == 1 else c.T)
    back = to_huggingface(path)  # encoded again as 32-bit float WAV: samples kept exactly
    assert back.features == ds.features
    raw = back.cast_column("audio", Audio(decode=False))
    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(raw[1]["audio"]["bytes"]), dtype="float32")
    assert rate == 16000
    np.testing.assert_array_equal(samples.reshape(clips[1].shape), clips[1])


def test_decoded_audio_refuses_another_sampling_rate(tmp_path):
    ds, _, _ = _audio_dataset(rate=8000)
    ds = ds.cast_column("audio", Audio(sampling_rate=16000, decode=True))
    with pytest.raises(RowValidationError, match="feature 'audio', row 0: sampled at 8000"):
        from_huggingface(ds, str(tmp_path / "x.h5"), decode_audio=True)


# -- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "feature, value, match",
    [
        ({"a": Value("int8"), "b": Value("string")}, {"a": 1, "b": "x"}, "ds.flatten()"),
        (datasets.Translation(languages=["en", "fr"]), {"en": "a", "fr": "b"}, "Translation"),
        (Value("decimal128(10, 2)"), decimal.Decimal("1.25"), "decimal"),
        (Value("time64[us]"), dt.time(1, 2), "time64"),
        (List(Value("string")), ["a"], "string"),
        (List({"x": Value("int8")}), [{"x": 1}], "lists of dict"),
        (Value("null"), None, "null"),
    ],
)
def test_unsupported_features_are_named(tmp_path, feature, value, match):
    features = Features({"ok": Value("int8"), "odd col": feature})
    ds = _from_storage({"ok": [1, 2], "odd col": [value, value]}, features)
    with pytest.raises(SchemaError, match=match) as e:
        from_huggingface(ds, str(tmp_path / "x.h5"))
    assert "feature 'odd col'" in str(e.value) and e.value.field == "odd col"
    assert not os.path.exists(tmp_path / "x.h5")


def test_bad_arguments(tmp_path):
    ds = _values(3)
    with pytest.raises(TypeError, match="datasets.Dataset or DatasetDict"):
        from_huggingface({"a": [1]}, str(tmp_path / "x.h5"))
    with pytest.raises(ValueError, match="split_field is for a DatasetDict"):
        from_huggingface(ds, str(tmp_path / "x.h5"), split_field="split")
    with pytest.raises(ValueError, match="batch_rows"):
        from_huggingface(ds, str(tmp_path / "x.h5"), batch_rows=0)
    with pytest.raises(FileNotFoundError, match="nor a directory of splits"):
        to_huggingface(str(tmp_path))


def test_a_dataset_written_by_rowstore_reads_as_a_huggingface_dataset(tmp_path):
    path = str(tmp_path / "plain.h5")
    schema = Schema(
        [
            Field("x", "float32"),
            Field("t", "str", nullable=True),
            Field("v", "int16", (None,)),
            Field("m", "float64", (None, 3)),
            Field("g", "uint8", (2, 2)),
        ]
    )
    rng = np.random.default_rng(5)
    rows = [
        {
            "x": np.float32(k),
            "t": None if k == 1 else str(k),
            "v": np.arange(k, dtype=np.int16),
            "m": rng.standard_normal((k, 3)),
            "g": np.full((2, 2), k, np.uint8),
        }
        for k in range(4)
    ]
    with rowstore.Writer(path, schema) as w:
        for row in rows:
            w.write(row)
    ds = to_huggingface(path)
    assert ds.features == Features(
        {
            "x": Value("float32"),
            "t": Value("string"),
            "v": List(Value("int16")),
            "m": Array2D((None, 3), "float64"),
            "g": Array2D((2, 2), "uint8"),
        }
    )
    for k, row in enumerate(rows):
        np.testing.assert_array_equal(np.array(ds[k]["m"]).reshape(-1, 3), row["m"])
        np.testing.assert_array_equal(np.array(ds[k]["g"]), row["g"])
        assert ds[k]["v"] == row["v"].tolist() and ds[k]["x"] == k
    assert ds["t"] == ["0", None, "2", "3"]


def test_infer_schema_and_lazy_names():
    ds = _arrays(3)
    assert infer_schema(ds)["m3"] == Field("m3", "int64", (2, 1, 3))
    assert rowstore.from_huggingface is from_huggingface
    assert rowstore.to_huggingface is to_huggingface


def test_memory_stays_bounded_by_a_batch(tmp_path):
    """A memory-mapped dataset of ~48 MiB streams through in batches: Python allocations peak
    at a small part of it."""
    n, width = 3000, 4096
    rng = np.random.default_rng(6)
    features = Features({"x": List(Value("float32"), length=width), "y": Value("int64")})
    src = Dataset.from_dict(
        {"x": rng.standard_normal((n, width), dtype=np.float32), "y": np.arange(n)},
        features=features,
    )
    src.save_to_disk(str(tmp_path / "hf"))
    del src
    ds = datasets.load_from_disk(str(tmp_path / "hf"))  # memory-mapped Arrow files
    nbytes = n * width * 4
    err, peak = peak_allocations(
        lambda: from_huggingface(ds, str(tmp_path / "big.h5"), batch_rows=100)
    )
    assert err is None, err
    assert peak < nbytes / 6, (peak, nbytes)
    with rowstore.open(str(tmp_path / "big.h5")) as r:
        assert len(r) == n
        np.testing.assert_array_equal(r[n - 1]["x"], np.asarray(ds[n - 1]["x"], np.float32))
    # Back through an Arrow file in cache_dir: batch by batch, the result memory-mapped (built
    # in memory instead, the same rows peak at about four times their size).
    out: list = []
    err, peak = peak_allocations(
        lambda: out.append(
            to_huggingface(str(tmp_path / "big.h5"), batch_rows=100, cache_dir=tmp_path / "c")
        )
    )
    assert err is None, err
    assert peak < nbytes / 6, (peak, nbytes)
    assert out[0].num_rows == n and out[0][n - 1]["x"] == ds[n - 1]["x"]


# -- images stored as they are -------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["png", "jpeg"])
@pytest.mark.parametrize("channels", [None, 3])
def test_image_bytes_are_stored_as_they_are(tmp_path, fmt, channels):
    ds, arrays, blobs = _image_dataset(fmt, channels=channels)
    path = str(tmp_path / "i.h5")
    schema = from_huggingface(ds, path, batch_rows=4, rows_per_block=2)
    shape = (None, None) if channels is None else (None, None, channels)
    assert schema["image"].shape == shape and schema["image"].codec["id"] == fmt
    with rowstore.open(path) as r:
        assert r.layout.user_attrs["huggingface"]["images"] == {"image": fmt}
        for k, blob in enumerate(blobs):  # the reader decodes the stored bytes
            want = imagecodecs.png_decode(blob) if fmt == "png" else imagecodecs.jpeg8_decode(blob)
            np.testing.assert_array_equal(r[k]["image"], want)
            if fmt == "png":
                np.testing.assert_array_equal(r[k]["image"], arrays[k])
    from rowstore.reader.raw import RawSource

    with RawSource(path) as src:  # the file holds the very bytes
        got = []
        for k in range(src.num_blocks):
            raw = src.block(k)
            for ref in raw.rows["image"]:
                o = int(ref["offset"]) - raw.origin
                got.append(raw.heap[o : o + int(ref["nbytes"])].tobytes())
    assert got == blobs
    back = to_huggingface(path, batch_rows=3)
    assert_same_dataset(back, ds)  # bytes identical, not re-encoded
    assert back.cast_column("image", Image(decode=False))[4]["image"]["bytes"] == blobs[4]


def test_image_bytes_with_nulls_and_split_field(tmp_path):
    ds, _, blobs = _image_dataset("png", n=7)
    rows = [{"bytes": None if k == 2 else b, "path": None} for k, b in enumerate(blobs)]
    table = pa.table({"image": rows, "label": list(range(7))}, schema=ds.features.arrow_schema)
    table = table.set_column(
        0,
        "image",
        pa.array([None if k == 2 else r for k, r in enumerate(rows)], table.schema[0].type),
    )
    holes = Dataset(table)
    dd = DatasetDict({"a": holes.select(range(4)), "b": holes.select(range(4, 7))})
    path = str(tmp_path / "one")
    schema = from_huggingface(dd, path, split_field="part", dataset=True, rows_per_block=3)
    assert schema["image"].nullable
    with rowstore.open(path) as r:
        assert r[2]["image"] is None
    back = to_huggingface(path)
    for s in dd:
        assert_same_dataset(back[s], dd[s])


def test_image_formats_and_channels_that_do_not_fit_name_the_feature_or_row(tmp_path):
    rng = np.random.default_rng(7)
    png = imagecodecs.png_encode(_image(rng, 4, 4, 3))
    jpeg = imagecodecs.jpeg8_encode(_image(rng, 4, 4, 3))
    rgba = imagecodecs.png_encode(_image(rng, 4, 4, 4))
    webp = imagecodecs.webp_encode(_image(rng, 4, 4, 3))

    def ds(blobs):
        return Dataset.from_dict({"pic": blobs}, features=Features({"pic": Image()}))

    with pytest.raises(RowValidationError, match=r"feature 'pic', row 1: jpeg bytes.*decode_"):
        from_huggingface(ds([png, jpeg]), str(tmp_path / "a.h5"))
    with pytest.raises(SchemaError, match=r"feature 'pic'.*row 0 holds webp bytes.*decode_images"):
        from_huggingface(ds([webp]), str(tmp_path / "b.h5"))
    with pytest.raises(RowValidationError, match="feature 'pic', row 2: jpeg bytes") as e:
        from_huggingface(ds([png, png, jpeg]), str(tmp_path / "c.h5"), batch_rows=2)
    assert e.value.row == 2
    # Any image converts to the field's channels as PIL's convert does (an RGBA one drops its
    # alpha), but a colour image for a grey field learnt from the first image would lose its
    # colour: refused, naming its row, unless the feature's mode says grey.
    grey = imagecodecs.png_encode(_image(rng, 4, 4, 1)[..., 0])
    schema = from_huggingface(ds([png, grey, rgba]), str(tmp_path / "d.h5"))
    assert schema["pic"].shape == (None, None, 3)
    with rowstore.open(str(tmp_path / "d.h5")) as r:
        assert r[2]["pic"].shape == (4, 4, 3)
        assert np.array_equal(r[2]["pic"], imagecodecs.png_decode(rgba)[..., :3])
    with pytest.raises(RowValidationError, match="feature 'pic', row 3: a uint8 image of 4.*col"):
        from_huggingface(ds([grey, grey, grey, rgba]), str(tmp_path / "f.h5"), batch_rows=2)
    as_grey = ds([grey, rgba]).cast_column("pic", Image(mode="L"))
    schema = from_huggingface(as_grey, str(tmp_path / "g.h5"))
    assert schema["pic"].shape == (None, None)
    # Decoded, they all fit (one mode for all).
    mixed = ds([png, jpeg, rgba, webp]).cast_column("pic", Image(mode="RGB"))
    schema = from_huggingface(mixed, str(tmp_path / "e.h5"), decode_images=True)
    assert schema["pic"].shape == (None, None, 3)


def test_images_given_by_local_path_are_read_from_their_files(tmp_path):
    _, _, blobs = _image_dataset("jpeg", n=3)
    files = []
    for k, b in enumerate(blobs):
        files.append(str(tmp_path / f"{k}.jpg"))
        with open(files[-1], "wb") as f:
            f.write(b)
    ds = Dataset.from_dict({"image": files}, features=Features({"image": Image()}))
    assert ds.with_format("arrow")[:]["image"][0]["bytes"].as_py() is None  # a path only
    path = str(tmp_path / "p.h5")
    from_huggingface(ds, path)
    back = to_huggingface(path).cast_column("image", Image(decode=False))
    assert [v["bytes"] for v in back["image"]] == blobs


def test_audio_rows_without_bytes_are_nulls(tmp_path):
    ds, clips, blobs = _audio_dataset(n=4)
    rows = [None if k == 1 else {"bytes": b, "path": None} for k, b in enumerate(blobs)]
    ds = _from_storage({"audio": rows, "text": list("abcd")}, ds.features)
    path = str(tmp_path / "a.h5")
    assert from_huggingface(ds, path)["audio"].nullable
    with rowstore.open(path) as r:
        assert r[1]["audio"] is None
        np.testing.assert_array_equal(r[2]["audio"], clips[2][:, 0])
    assert stored_payloads(path, "audio")[2] == blobs[2]
    assert_same_dataset(to_huggingface(path), ds)
    dec = str(tmp_path / "d.h5")
    assert from_huggingface(ds, dec, decode_audio=True)["audio"].nullable
    with rowstore.open(dec) as r:
        assert r[1]["audio"] is None
        np.testing.assert_array_equal(r[3]["audio"], clips[3][:, 0])


def test_split_names_stay_inside_the_output(tmp_path):
    """A split name becomes a directory under the output: one that climbs out (``..``), is
    absolute, nested or empty is refused before anything is written; a symlinked split
    directory leading out of the output is refused too."""
    out = tmp_path / "out"
    victim = tmp_path / "victim"
    for name in ["../evil", str(victim), "a/b", "", ".."]:
        dd = DatasetDict({"train": _values(3), name: _values(2)})
        with pytest.raises(OutsideRootError, match="split name") as e:
            from_huggingface(dd, str(out), mode="w")
        assert e.value.name == name and e.value.root == str(out)
        assert not os.path.exists(tmp_path / "evil") and not os.path.exists(victim)
        assert not os.path.exists(out)  # nothing written, not even the output directory
    os.makedirs(out)
    os.makedirs(victim)
    os.symlink(victim, out / "train")
    with pytest.raises(OutsideRootError, match=r"split name 'train' resolves to .* symlink"):
        from_huggingface(DatasetDict({"train": _values(3)}), str(out))
    assert os.listdir(victim) == []


def test_images_given_by_a_path_to_a_fifo_are_refused_without_blocking(tmp_path):
    fifo = str(tmp_path / "x.png")
    os.mkfifo(fifo)
    ds = Dataset.from_dict({"image": [fifo]}, features=Features({"image": Image()}))
    exc = raised_without_blocking(lambda: from_huggingface(ds, str(tmp_path / "p.h5")), fifo)
    assert isinstance(exc, InputError), exc
    assert "FIFO" in str(exc) and "'image', row 0" in str(exc)
