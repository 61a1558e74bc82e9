"""Every codec round-trips its edge cases through a written file, read back with ``r[i]`` and
``take`` (ragged and padded), uncompressed and compressed."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import rowstore
from rowstore import CodecError, Field, Schema
from rowstore.codecs import Codec, get_codec, register_codec, registered_codecs

COMPRESSIONS = [None, "lz4", "zstd", {"cname": "zstd", "clevel": 9, "shuffle": "bit"}]
COMPRESSION_IDS = ["none", "lz4", "zstd", "dict"]

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]


def roundtrip(rs, path, schema, rows, *, compression=None, **kw):
    """Write rows, then check them through r[i], take (all, reversed/repeated) and padded."""
    rs.write_file(path, schema, rows, compression=compression, **kw)
    rs.assert_rows_equal(schema, rows, rs.read_rows(path))
    r = rowstore.open(path)
    n = len(rows)
    assert len(r) == n
    idx = np.arange(n)
    rs.assert_batch_equal(schema, rows, r.take(idx))
    mixed = np.concatenate([idx[::-1], idx[: min(n, 3)]])
    rs.assert_batch_equal(schema, [rows[i] for i in mixed], r.take(mixed))
    check_padded(schema, rows, r.take(idx, varlen="padded"))
    r.close()
    return r


def check_padded(schema, rows, batch):
    for f in schema:
        if not f.is_variable:
            continue
        vals = [row.get(f.name) for row in rows]
        dense, shp = batch[f.name], batch[f.name + "__shape"]
        assert isinstance(dense, np.ndarray) and dense.dtype == f.dtype
        assert shp.dtype == np.int64 and shp.shape == (len(rows), len(f.variable_dims))
        for i, v in enumerate(vals):
            if v is None:
                assert batch[f.name + "__null"][i]
                continue
            v = np.asarray(v, f.dtype)
            assert tuple(shp[i]) == tuple(v.shape[d] for d in f.variable_dims)
            region = tuple(slice(0, s) for s in v.shape)
            if f.codec["id"] == "jpeg":
                assert np.abs(dense[i][region].astype(float) - v).mean() < 3
            else:
                assert dense[i][region].tobytes() == v.tobytes()
            rest = dense[i].copy()
            rest[region] = 0
            assert not rest.any(), f"row {i}: padding of {f.name!r} is not zero"


# -- numbers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_integer_extremes(rs, h5path, compression):
    fields, rows = [], [{} for _ in range(5)]
    for dt in INT_DTYPES:
        info = np.iinfo(dt)
        extremes = [info.min, info.max, 0, 1, info.max - 1]
        fields += [Field(f"s_{dt}", dt), Field(f"a_{dt}", dt, (5,)), Field(f"v_{dt}", dt, (None,))]
        for i, row in enumerate(rows):
            row[f"s_{dt}"] = np.array(extremes[i], dt)
            row[f"a_{dt}"] = np.roll(np.array(extremes, dt), i)
            row[f"v_{dt}"] = np.array(extremes[: i + 1] if i < 4 else [], dt)
    schema = Schema(fields)
    roundtrip(rs, h5path, schema, rows, compression=compression, rows_per_block=2)


def test_python_ints_at_the_limits(rs, h5path):
    schema = Schema([Field("u64", "uint64"), Field("i64", "int64"), Field("u8", "uint8", (2,))])
    rows = [
        {"u64": 2**64 - 1, "i64": -(2**63), "u8": [0, 255]},
        {"u64": 0, "i64": 2**63 - 1, "u8": [255, 0]},
    ]
    roundtrip(rs, h5path, schema, rows)


def special_floats(dt):
    info = np.finfo(dt)
    return np.array(
        [
            np.nan,
            np.inf,
            -np.inf,
            -0.0,
            0.0,
            info.max,
            info.min,
            info.tiny,
            info.smallest_subnormal,
            -info.smallest_subnormal,
            1.0,
            info.eps,
        ],
        dt,
    )


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_special_floats(rs, h5path, compression):
    fields, rows = [], [{} for _ in range(12)]
    for dt in FLOAT_DTYPES:
        sp = special_floats(dt)
        fields += [
            Field(f"s_{dt}", dt),
            Field(f"a_{dt}", dt, (12,)),
            Field(f"v_{dt}", dt, (None, 2)),
        ]
        for i, row in enumerate(rows):
            row[f"s_{dt}"] = sp[i]
            row[f"a_{dt}"] = np.roll(sp, i)
            row[f"v_{dt}"] = np.stack([sp[:i], sp[:i][::-1]], axis=-1)
    schema = Schema(fields)
    roundtrip(rs, h5path, schema, rows, compression=compression, rows_per_block=5)
    # -0.0 and NaN survive bit-exactly (assert_value_equal compares bytes); check once explicitly.
    r = rowstore.open(h5path)
    v = r[3]["s_float32"]
    assert v == 0 and np.signbit(v)
    assert np.isnan(r[0]["s_float16"]) and r[0]["s_float16"].dtype == np.float16


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_complex(rs, h5path, compression):
    schema = Schema(
        [
            Field("c8", "complex64"),
            Field("c16", "complex128", (3,)),
            Field("vc", "complex64", (None,)),
        ]
    )
    vals = np.array(
        [1 + 2j, -0.0 - 0.0j, complex(np.inf, -np.inf), complex(np.nan, 1), 0j], np.complex128
    )
    rows = [
        {"c8": vals[i], "c16": np.roll(vals, i)[:3], "vc": vals[:i].astype(np.complex64)}
        for i in range(5)
    ]
    roundtrip(rs, h5path, schema, rows, compression=compression, rows_per_block=2)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_bool(rs, h5path, compression):
    schema = Schema([Field("b", "bool"), Field("ba", "bool", (3, 2)), Field("bv", "bool", (None,))])
    rng = np.random.default_rng(1)
    rows = [
        {"b": bool(i % 2), "ba": rng.random((3, 2)) < 0.5, "bv": rng.random(i) < 0.5}
        for i in range(9)
    ]
    roundtrip(rs, h5path, schema, rows, compression=compression, rows_per_block=4)
    assert rowstore.open(h5path).take([0, 1])["b"].dtype == np.bool_


@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_variable_arrays_with_empty_and_multi_variable_shapes(rs, h5path, compression):
    schema = Schema(
        [
            Field("wave", "float32", (None,)),
            Field("a4d", "uint8", (None, 128, 30, None)),
            Field("m", "int32", (None, None)),
        ]
    )
    rng = np.random.default_rng(2)
    shapes_4d = [
        (0, 128, 30, 0),
        (1, 128, 30, 2),
        (2, 128, 30, 0),
        (0, 128, 30, 3),
        (1, 128, 30, 1),
        (3, 128, 30, 1),
    ]
    rows = []
    for i, s4 in enumerate(shapes_4d):
        rows.append(
            {
                "wave": rng.standard_normal(0 if i % 2 == 0 else 7 * i).astype(np.float32),
                "a4d": rng.integers(0, 256, s4, dtype=np.uint8),
                "m": rng.integers(-5, 5, ((i % 3), 4 - (i % 4)), dtype=np.int32),
            }
        )
    r = roundtrip(
        rs, h5path, schema, rows, compression=compression, rows_per_block=4, heap_chunk_bytes=4096
    )
    r = rowstore.open(h5path)
    b = r.take(np.arange(len(rows)))
    assert isinstance(b["wave"], rowstore.reader.Ragged)
    assert b["wave"].lengths.tolist() == [len(x["wave"]) for x in rows]
    assert b["a4d"].shapes.tolist() == [list(s) for s in shapes_4d]
    assert r[0]["wave"].shape == (0,) and r[0]["a4d"].shape == (0, 128, 30, 0)


def test_all_rows_empty_variable_arrays(rs, h5path):
    # A heap field whose payloads are all empty: the heap stays empty.
    schema = Schema([Field("v", "float64", (None,)), Field("k", "int8")])
    rows = [{"v": np.zeros(0), "k": i} for i in range(7)]
    roundtrip(rs, h5path, schema, rows, rows_per_block=3)
    assert rowstore.Layout.open(h5path).heap_nbytes == 0


# -- text and bytes --------------------------------------------------------------------------
@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_text_and_bytes(rs, h5path, compression):
    schema = Schema(
        [
            Field("t", "str"),
            Field("b", "bytes"),
            Field("tn", "str", nullable=True),
            Field("bn", "bytes", nullable=True),
        ]
    )
    texts = list(rs.TEXTS) + ["\U0010ffff", "\u200b", "a\nb\tc", "🏳️\u200d🌈" * 50]
    blobs = [b"", b"\x00", b"\xff" * 3, bytes(range(256)), b"\x00" * 1000, "é".encode()]
    rows = []
    for i, t in enumerate(texts):
        rows.append(
            {
                "t": t,
                "b": blobs[i % len(blobs)],
                "tn": None if i % 3 == 0 else t[::-1],
                "bn": None if i % 4 == 1 else blobs[(i + 1) % len(blobs)],
            }
        )
    roundtrip(
        rs, h5path, schema, rows, compression=compression, rows_per_block=4, heap_chunk_bytes=64
    )
    b = rowstore.open(h5path).take([0, 1, 2, 3])
    assert b["t"].dtype == object and b["t"][0] == "" and b["b"][0] == b""
    assert b["tn"][0] is None and b["tn__null"].tolist() == [True, False, False, True]
    assert b["bn"][1] is None and b["bn__null"][1]


def test_bytes_like_inputs(rs, h5path):
    schema = Schema([Field("b", "bytes")])
    with rowstore.Writer(h5path, schema) as w:
        w.write({"b": bytearray(b"abc")})
        w.write({"b": memoryview(b"de")})
        w.write({"b": np.frombuffer(b"fg", np.uint8).tobytes()})
    assert [r["b"] for r in rs.read_rows(h5path)] == [b"abc", b"de", b"fg"]


# -- images ----------------------------------------------------------------------------------
PNG_CASES = [
    ("uint8", (9, 7)),
    ("uint8", (9, 7, 1)),
    ("uint8", (9, 7, 2)),
    ("uint8", (9, 7, 3)),
    ("uint8", (9, 7, 4)),
    ("uint16", (9, 7)),
    ("uint16", (9, 7, 1)),
    ("uint16", (9, 7, 3)),
    ("uint16", (9, 7, 4)),
]


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_png_lossless(rs, h5path, compression):
    fields = [
        Field(f"p{i}", dt, shape, codec={"id": "png", "level": 1 + i % 9})
        for i, (dt, shape) in enumerate(PNG_CASES)
    ]
    schema = Schema(fields)
    rng = np.random.default_rng(3)
    rows = []
    for k in range(5):
        row = {}
        for f in schema:
            info = np.iinfo(f.dtype)
            img = rng.integers(
                0, info.max, f.shape, dtype=f.dtype, endpoint=True
            )  # noise: lossless or bust
            if k == 0:
                img[...] = info.max
            elif k == 1:
                img[...] = 0
            row[f.name] = img
        rows.append(row)
    roundtrip(
        rs, h5path, schema, rows, compression=compression, rows_per_block=2, heap_chunk_bytes=256
    )


def test_png_variable_shape(rs, h5path):
    schema = Schema(
        [
            Field("img", "uint8", (None, None, 3), codec="png"),
            Field("g", "uint16", (None, 5), codec="png"),
        ]
    )
    rng = np.random.default_rng(4)
    rows = [
        {
            "img": rng.integers(0, 256, (1 + i, 2 + 2 * i, 3), dtype=np.uint8),
            "g": rng.integers(0, 65536, (1 + 3 * i, 5), dtype=np.uint16),
        }
        for i in range(6)
    ]
    roundtrip(rs, h5path, schema, rows, rows_per_block=4)
    b = rowstore.open(h5path).take([5, 0])
    assert b["img"].shapes.tolist() == [[6, 12, 3], [1, 2, 3]]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_jpeg_lossy_within_tolerance(rs, h5path, compression):
    schema = Schema(
        [
            Field("rgb", "uint8", (32, 48, 3), codec="jpeg"),
            Field("gray", "uint8", (32, 48), codec={"id": "jpeg", "quality": 95}),
            Field("gray1", "uint8", (16, 16, 1), codec="jpeg"),
            Field("var", "uint8", (None, None, 3), codec="jpeg"),
        ]
    )
    rng = np.random.default_rng(5)
    rows = [
        {
            "rgb": rs.smooth_image(rng, (32, 48, 3)),
            "gray": rs.smooth_image(rng, (32, 48)),
            "gray1": rs.smooth_image(rng, (16, 16, 1)),
            "var": rs.smooth_image(rng, (8 + 8 * i, 16, 3)),
        }
        for i in range(5)
    ]
    roundtrip(rs, h5path, schema, rows, compression=compression, rows_per_block=2)
    got = rowstore.open(h5path)[2]
    assert got["rgb"].shape == (32, 48, 3) and got["rgb"].dtype == np.uint8
    assert got["gray1"].shape == (16, 16, 1)
    # lossy: not bit-exact in general, but close
    assert np.abs(got["rgb"].astype(int) - rows[2]["rgb"]).mean() < 3


def test_image_fields_inside_a_batch_take_with_out(rs, h5path):
    schema = Schema([Field("img", "uint8", (4, 5, 3), codec="png"), Field("x", "float32", (2,))])
    rows = rs.make_rows(schema, 6, seed=6)
    rs.write_file(h5path, schema, rows, rows_per_block=4)
    r = rowstore.open(h5path)
    out = {"img": np.zeros((3, 4, 5, 3), np.uint8), "x": np.zeros((3, 2), np.float32)}
    b = r.take([5, 0, 3], out=out)
    assert b["img"] is out["img"] or np.shares_memory(b["img"], out["img"])
    rs.assert_batch_equal(schema, [rows[5], rows[0], rows[3]], b)
    with pytest.raises(ValueError):
        r.take([0, 1], out={"x": np.zeros((2, 2), np.float64)})


# -- nulls -----------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "lz4"])
def test_nullable_every_kind(rs, h5path, schema_all_nullable, compression):
    schema = schema_all_nullable
    rows = rs.make_rows(schema, 20, seed=7, null_rate=0.4)
    rows[0] = dict.fromkeys(schema.names)  # a row of nothing but nulls
    rows[1] = {}  # missing nullable fields are null
    rows[-1] = dict.fromkeys(schema.names)
    roundtrip(
        rs, h5path, schema, rows, compression=compression, rows_per_block=6, heap_chunk_bytes=128
    )
    b = rowstore.open(h5path).take(np.arange(20))
    for f in schema:
        mask = b[f.name + "__null"]
        assert mask.tolist() == [rows[i].get(f.name) is None for i in range(20)], f.name
    # null fixed-size values read back as zeros (documented as unspecified but must not crash)
    assert b["fixed"][0].shape == (2, 3)


def test_all_rows_null_heap_fields(rs, h5path, schema_all_nullable):
    rows = [dict.fromkeys(schema_all_nullable.names) for _ in range(4)]
    roundtrip(rs, h5path, schema_all_nullable, rows, rows_per_block=3)


# -- all kinds x compressions ----------------------------------------------------------------
@pytest.mark.parametrize("compression", COMPRESSIONS, ids=COMPRESSION_IDS)
def test_all_kinds_random(rs, h5path, schema_all_kinds, compression):
    rows = rs.make_rows(schema_all_kinds, 30, seed=8)
    roundtrip(
        rs,
        h5path,
        schema_all_kinds,
        rows,
        compression=compression,
        rows_per_block=7,
        heap_chunk_bytes=200,
    )
    layout = rowstore.Layout.open(h5path, scan=True)
    assert layout.compressed == (compression is not None)


# -- codec objects ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        (Field("v", "float32", (None, 2)), np.arange(6, dtype=np.float32).reshape(3, 2)),
        (Field("v", "complex64", (None,)), np.array([1j, -1], np.complex64)),
        (Field("v", "int16", (None,)), np.zeros(0, np.int16)),
        (
            Field("v", "uint8", (4, 4, 3), codec="png"),
            np.arange(48, dtype=np.uint8).reshape(4, 4, 3),
        ),
        (Field("v", "uint16", (4, 4), codec="png"), np.arange(16, dtype=np.uint16) * 4000),
        (
            Field("v", "uint8", (4, 4, 1), codec="png"),
            np.arange(16, dtype=np.uint8).reshape(4, 4, 1),
        ),
    ],
)
def test_codec_encode_decode_direct(field, value):
    value = (
        np.asarray(value).reshape(tuple(s if s is not None else -1 for s in field.shape))
        if field.codec["id"] == "png"
        else value
    )
    codec = field.codec_obj
    payload = codec.encode(value, field)
    out = np.empty(value.shape, field.dtype)
    codec.decode_into(memoryview(bytes(payload)), out)
    assert out.tobytes() == value.tobytes()
    assert (
        codec.decode(np.frombuffer(bytes(payload), np.uint8), value.shape, field).tobytes()
        == value.tobytes()
    )


def test_text_codecs_direct():
    t = Field("t", "str").codec_obj
    assert t.decode(t.encode("日本😀", None), (), None) == "日本😀"
    b = Field("b", "bytes").codec_obj
    assert b.decode(b.encode(b"\x00x", None), (), None) == b"\x00x"


@pytest.mark.parametrize("codec", ["png", "jpeg"])
def test_corrupt_image_payload(codec):
    f = Field("v", "uint8", (4, 4, 3), codec=codec)
    out = np.empty((4, 4, 3), np.uint8)
    with pytest.raises(CodecError):
        f.codec_obj.decode_into(b"\x89PNG not really", out)
    payload = f.codec_obj.encode(np.zeros((8, 8, 3), np.uint8), f)
    with pytest.raises(CodecError):
        f.codec_obj.decode_into(payload, out)  # decodes to a different shape than out


def test_codec_config_round_trip_and_equality():
    for spec in ["raw", "utf8", "bytes", {"id": "png", "level": 3}, {"id": "jpeg", "quality": 50}]:
        c = get_codec(spec)
        assert get_codec(c.get_config()) == c
        assert hash(get_codec(c.get_config())) == hash(c)
        assert c.get_config()["id"] == (spec if isinstance(spec, str) else spec["id"])
    assert get_codec("png") != get_codec({"id": "png", "level": 1})
    assert set(registered_codecs()) >= {"raw", "utf8", "bytes", "png", "jpeg"}


class _ZlibArray(Codec):
    """A third-party heap codec for numbers (lossless zlib of the raw bytes)."""

    codec_id = "test_zlib_array"

    def __init__(self, level: int = 6):
        self.level = level
        self._freeze()

    def get_config(self):
        return {"id": self.codec_id, "level": self.level}

    def check_field(self, field):
        if field.dtype in ("str", "bytes"):
            raise rowstore.SchemaError("numbers only", field=field.name)

    def encode(self, value, field):
        return zlib.compress(np.ascontiguousarray(value).tobytes(), self.level)

    def decode_into(self, src, out):
        out[...] = np.frombuffer(zlib.decompress(bytes(src)), out.dtype).reshape(out.shape)


def test_third_party_codec_in_a_file(rs, h5path):
    register_codec(_ZlibArray, replace=True)
    with pytest.raises(CodecError, match="already registered"):

        class Other(_ZlibArray):
            pass

        register_codec(Other)
    schema = Schema(
        [
            Field("fixed", "float64", (3, 4), codec={"id": "test_zlib_array", "level": 9}),
            Field("var", "int32", (None, 2), codec="test_zlib_array"),
        ]
    )
    assert not schema["fixed"].inline
    rng = np.random.default_rng(9)
    rows = [
        {
            "fixed": rng.standard_normal((3, 4)),
            "var": rng.integers(-9, 9, (i + 1, 2), dtype=np.int32),
        }
        for i in range(5)
    ]
    roundtrip(rs, h5path, schema, rows, rows_per_block=2)
    assert rowstore.open(h5path).schema["fixed"].codec == {"id": "test_zlib_array", "level": 9}


def test_file_with_a_codec_not_installed_says_so(rs, h5path):
    """A file written with a third-party codec, opened where it is not registered: a CodecError
    naming the codec (not a 'corrupt file' FormatError)."""
    import subprocess
    import sys

    register_codec(_ZlibArray, replace=True)
    schema = Schema([Field("v", "float64", (None,), codec="test_zlib_array")])
    with rowstore.Writer(h5path, schema) as w:
        w.write({"v": np.arange(3.0)})
    code = (
        "import rowstore, sys\n"
        "try:\n    rowstore.open(sys.argv[1])\n"
        "except rowstore.CodecError as e:\n    print(type(e).__name__, e.codec, 'not installed' in "
        "str(e))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, h5path], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["CodecError", "test_zlib_array", "True"], out.stdout + out.stderr
