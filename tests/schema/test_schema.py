"""Schema and Field: validation, normalisation, JSON round trip, framework type rendering."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import rowstore
from rowstore import BYTES, STR, CodecError, Field, Schema, SchemaError

NUMERIC_DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def rich_schema() -> Schema:
    return Schema(
        [
            Field("x", "float32", (16,)),
            Field("label", np.int64),
            Field("big_endian", ">f8", (2, 2)),
            Field("flag", bool),
            Field("speaker", str),
            Field("note", bytes, nullable=True),
            Field("wave", "float32", (None,)),
            Field("array_4d", "uint8", (None, 128, 30, None)),
            Field("image", "uint8", (128, 256, 3), codec={"id": "png", "level": 1}),
            Field("photo", "uint8", (None, None, 3), codec="jpeg"),
            Field("depth", "uint16", (8, 8), codec="png", nullable=True),
            Field("z", "complex128", (3,), nullable=True),
        ]
    )


# -- fields ----------------------------------------------------------------------------------
def test_field_properties():
    fixed = Field("x", "float32", (2, 3))
    assert fixed.inline and not fixed.is_variable and fixed.variable_dims == ()
    assert fixed.numpy_dtype == np.float32 and fixed.fixed_nbytes == 24
    assert fixed.codec == {"id": "raw"}

    var = Field("a", "uint8", (None, 128, 30, None))
    assert not var.inline and var.is_variable and var.variable_dims == (0, 3)
    assert var.shape == (None, 128, 30, None) and var.fixed_nbytes == 0

    text = Field("t", "str")
    assert text.dtype == STR and not text.inline and text.numpy_dtype == np.dtype(object)
    assert text.codec == {"id": "utf8"}
    assert Field("b", "bytes").codec == {"id": "bytes"}

    img = Field("img", "uint8", (4, 4, 3), codec="png")
    assert not img.inline and img.codec == {"id": "png", "level": 6}
    assert Field("j", "uint8", (4, 4), codec={"id": "jpeg", "quality": 70}).codec == {
        "id": "jpeg",
        "quality": 70,
    }


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_numeric_dtypes_accepted_and_little_endian(dtype):
    f = Field("v", dtype, (3,))
    assert f.dtype == np.dtype(dtype)
    assert f.dtype.byteorder in ("<", "|", "=")
    assert f.dtype.str[0] in "<|"


def test_big_endian_is_normalised_to_little_endian():
    f = Field("v", ">i4")
    assert f.dtype.str == "<i4"
    assert f == Field("v", "<i4")


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (str, STR),
        ("str", STR),
        ("U10", STR),
        (np.str_, STR),
        (bytes, BYTES),
        ("bytes", BYTES),
        ("S4", BYTES),
    ],
)
def test_text_and_binary_dtype_spellings(dtype, expected):
    assert Field("v", dtype).dtype == expected


@pytest.mark.parametrize(
    "name", ["", "1abc", "a b", "a-b", "class", "def", "über ", "x.y", 5, None, b"name"]
)
def test_bad_field_names(name):
    with pytest.raises(SchemaError, match="identifier"):
        Field(name, "int64")


@pytest.mark.parametrize("name", ["__x", "a__b", "x__null", "y__shape", "z__"])
def test_double_underscore_is_reserved(name):
    with pytest.raises(SchemaError, match="__") as ei:
        Field(name, "int64")
    assert ei.value.field == name


@pytest.mark.parametrize("name", ["x", "_x", "x_", "Label2", "é", "日本"])
def test_good_field_names(name):
    assert Field(name, "int64").name == name


def test_duplicate_names():
    with pytest.raises(SchemaError, match="duplicate field name 'a'") as ei:
        Schema([Field("a", "int64"), Field("b", "str"), Field("a", "float32")])
    assert ei.value.field == "a"


@pytest.mark.parametrize(
    "dtype",
    [
        "notatype",
        "object",
        object,
        "datetime64",
        "datetime64[Y]",
        "datetime64[10s]",
        "timedelta64[D]",
        "timedelta64",
        "V8",
        np.dtype([("a", "<i4"), ("b", "<f4")]),
        np.dtype(("<f4", (3,))),
        3.5,
        np.longdouble,
    ],
)
def test_unknown_or_unsupported_dtypes(dtype):
    if dtype is np.longdouble and np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(SchemaError) as ei:
        Field("v", dtype)
    assert ei.value.field == "v"
    assert "'v'" in str(ei.value)


def test_missing_dtype_is_refused_not_float64():
    """``"dtype": null`` in a schema's JSON (or ``Field(name, None)``) names the field; numpy
    would read None as float64."""
    with pytest.raises(SchemaError, match="'x'.*no dtype") as ei:
        Schema.from_json({"fields": [{"name": "x", "dtype": None, "shape": [2]}]})
    assert ei.value.field == "x"
    with pytest.raises(SchemaError, match="'y'"):
        Field("y", None)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (None, ()),
        ((), ()),
        (5, (5,)),
        ([2, 3], (2, 3)),
        ((None,), (None,)),
        ((-1, 4), (None, 4)),
        ((np.int64(2), np.uint8(3)), (2, 3)),
        ((None, 128, 30, None), (None, 128, 30, None)),
    ],
)
def test_shape_normalisation(shape, expected):
    f = Field("v", "float32", shape)
    assert f.shape == expected
    assert all(type(d) is int or d is None for d in f.shape)


@pytest.mark.parametrize(
    "shape", [(-2,), (1.5,), ("a",), (True,), (2, False), "ab", object(), (3, -7)]
)
def test_bad_shapes(shape):
    with pytest.raises(SchemaError) as ei:
        Field("v", "float32", shape)
    assert ei.value.field == "v"


def test_zero_fixed_dimension_refused_inline_but_allowed_with_variable_dims():
    # HDF5 cannot store a zero-sized member in the row table: refuse it in the schema.
    with pytest.raises(SchemaError, match="dimension of 0"):
        Field("v", "float32", (0,))
    with pytest.raises(SchemaError, match="dimension of 0"):
        Field("v", "float32", (3, 0))
    assert not Field("v", "float32", (None, 0)).inline


@pytest.mark.parametrize("dtype", ["str", "bytes"])
@pytest.mark.parametrize("shape", [(3,), (None,), (2, 2)])
def test_str_and_bytes_are_scalars(dtype, shape):
    with pytest.raises(SchemaError, match="shape must be"):
        Field("v", dtype, shape)


@pytest.mark.parametrize(
    ("dtype", "shape", "codec", "match"),
    [
        ("float32", (8, 8, 3), "png", "png"),
        ("int16", (8, 8), "png", "png"),
        ("uint8", (2, 8, 8, 3), "png", r"\(H, W\)"),
        ("uint8", (8,), "png", r"\(H, W\)"),
        ("uint8", (), "png", r"\(H, W\)"),
        ("uint8", (8, 8, 5), "png", "channels"),
        ("uint8", (8, 8, None), "png", "channels"),
        ("uint16", (8, 8), "jpeg", "jpeg"),
        ("uint8", (8, 8, 4), "jpeg", "channels"),
        ("uint8", (8, 8, 2), "jpeg", "channels"),
        ("float32", (8, 8), "jpeg", "jpeg"),
        ("int64", (), "utf8", "utf8"),
        ("bytes", (), "utf8", "utf8"),
        ("str", (), "bytes", "bytes"),
        ("float32", (3,), "bytes", "bytes"),
        ("str", (), "raw", "raw"),
        ("bytes", (), "raw", "raw"),
        ("str", (), "png", "png"),
    ],
)
def test_codec_that_does_not_fit_the_field(dtype, shape, codec, match):
    with pytest.raises(SchemaError, match=match) as ei:
        Field("v", dtype, shape, codec=codec)
    assert ei.value.field == "v"


@pytest.mark.parametrize(
    "codec",
    [
        "nosuchcodec",
        {"id": "png", "level": 42},
        {"id": "png", "level": "1"},
        {"id": "jpeg", "quality": 0},
        {"id": "jpeg", "quality": 101},
        {"id": "png", "colour": 1},
        {"id": "raw", "x": 1},
        {"level": 1},
        42,
    ],
)
def test_bad_codec_specs(codec):
    with pytest.raises(CodecError):
        Field("v", "uint8", (8, 8), codec=codec)


@pytest.mark.parametrize(
    ("dtype", "shape", "codec"),
    [
        ("uint8", (8, 8), "png"),
        ("uint8", (8, 8, 1), "png"),
        ("uint8", (8, 8, 2), "png"),
        ("uint8", (8, 8, 3), "png"),
        ("uint8", (8, 8, 4), "png"),
        ("uint16", (8, 8, 3), "png"),
        ("uint8", (None, None, 3), "png"),
        ("uint8", (8, 8), "jpeg"),
        ("uint8", (8, 8, 1), "jpeg"),
        ("uint8", (8, 8, 3), "jpeg"),
    ],
)
def test_image_fields_that_fit(dtype, shape, codec):
    f = Field("img", dtype, shape, codec=codec)
    assert f.codec["id"] == codec and not f.inline


def test_field_is_frozen():
    f = Field("v", "int64")
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.name = "w"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        f.codec_obj.level = 3


# -- schema ----------------------------------------------------------------------------------
def test_schema_container_protocol():
    s = rich_schema()
    assert len(s) == 12
    assert s.names[:3] == ["x", "label", "big_endian"]
    assert s["label"].dtype == np.int64 and s[0].name == "x" and s[-1].name == "z"
    assert "wave" in s and "nope" not in s
    assert [f.name for f in s] == s.names
    with pytest.raises(KeyError, match="nope"):
        s["nope"]
    sub = s.select(["wave", "x"])
    assert sub.names == ["wave", "x"] and sub["wave"] == s["wave"]
    assert s.select(None) is s
    assert s.select("label").names == ["label"]
    with pytest.raises(SchemaError, match="unknown"):
        s.select(["x", "nope"])


def test_schema_rejects_empty_and_non_fields():
    with pytest.raises(SchemaError):
        Schema([])
    with pytest.raises(SchemaError, match="Field"):
        Schema([("x", "int64")])


def test_schema_from_mapping():
    s = Schema(
        {
            "x": ("float32", (3,)),
            "label": "int64",
            "img": Field("img", "uint8", (4, 4), codec="png"),
        }
    )
    assert s.names == ["x", "label", "img"]
    assert s["x"].shape == (3,) and s["label"].dtype == np.int64 and s["img"].codec["id"] == "png"


def test_json_round_trip():
    s = rich_schema()
    assert Schema.from_json(s.to_json()) == s
    assert Schema.from_json(s.to_json_str()) == s
    assert Schema.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert Schema.from_json(s.to_json_str().encode()) == s
    # field by field, not just schema equality (which compares JSON)
    back = Schema.from_json(s.to_json_str())
    for a, b in zip(s, back, strict=True):
        assert a == b
        assert (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.codec == b.codec
            and a.nullable == b.nullable
        )
    assert hash(back) == hash(s)
    # JSON is canonical: stable across round trips, sorted keys
    assert back.to_json_str() == s.to_json_str()
    j = s.to_json()
    assert j["fields"][2] == {
        "name": "big_endian",
        "dtype": "<f8",
        "shape": [2, 2],
        "codec": {"id": "raw"},
        "nullable": False,
    }
    assert j["fields"][7]["shape"] == [None, 128, 30, None]


def test_schema_inequality():
    a = Schema([Field("x", "float32", (3,))])
    assert a != Schema([Field("x", "float64", (3,))])
    assert a != Schema([Field("x", "float32", (4,))])
    assert a != Schema([Field("x", "float32", (3,), nullable=True)])
    assert a != Schema([Field("y", "float32", (3,))])
    assert Schema([Field("i", "uint8", (4, 4), codec="png")]) != Schema(
        [Field("i", "uint8", (4, 4), codec={"id": "png", "level": 1})]
    )
    assert a != "not a schema"


@pytest.mark.parametrize(
    "bad",
    [
        "{not json",
        "[]",
        '{"fields": 3}',
        '{"fields": [{"dtype": "int64"}]}',
        '{"fields": [{"name": "x"}]}',
        '{"fields": []}',
        '{"fields": [{"name": "x", "dtype": "int64", "shape": [-3]}]}',
        '{"fields": ["x"]}',
        '{"fields": [3]}',
        '{"fields": [{"name": "x", "dtype": "int64", "shape": "ab"}]}',
        "null",
        '"text"',
    ],
)
def test_from_json_errors(bad):
    with pytest.raises(SchemaError):
        Schema.from_json(bad)


def test_infer():
    s = Schema.infer(
        {
            "a": np.zeros((2, 3), np.float32),
            "b": 3,
            "c": 1.5,
            "d": True,
            "e": "txt",
            "f": b"x",
            "g": [1, 2],
        },
        nullable=["f"],
    )
    assert [(f.name, str(f.dtype), f.shape) for f in s] == [
        ("a", "float32", (2, 3)),
        ("b", "int64", ()),
        ("c", "float64", ()),
        ("d", "bool", ()),
        ("e", "str", ()),
        ("f", "bytes", ()),
        ("g", "int64", (2,)),
    ]
    assert s["f"].nullable and not s["e"].nullable
    with pytest.raises(SchemaError):
        Schema.infer({"a": None})
    with pytest.raises(SchemaError):
        Schema.infer({"a": ["x", "y"]})


def test_numpy_dtypes():
    s = rich_schema()
    nd = s.numpy_dtypes()
    assert nd["speaker"] == (np.dtype(object), ())
    assert nd["wave"] == (np.dtype(np.float32), (None,))


# -- framework rendering (frameworks imported only here) --------------------------------------
def test_torch_dtypes():
    torch = pytest.importorskip("torch")
    expected = {
        "bool": torch.bool,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "int16": torch.int16,
        "uint16": torch.uint16,
        "int32": torch.int32,
        "uint32": torch.uint32,
        "int64": torch.int64,
        "uint64": torch.uint64,
        "float16": torch.float16,
        "float32": torch.float32,
        "float64": torch.float64,
        "complex64": torch.complex64,
        "complex128": torch.complex128,
    }
    for name, tdt in expected.items():
        assert Field("v", name).torch_dtype() == tdt
        assert Field("v", name, (None, 3)).torch_dtype() == tdt
    assert Field("v", ">f4").torch_dtype() == torch.float32
    s = rich_schema()
    td = s.torch_dtypes()
    assert "speaker" not in td and "note" not in td
    assert td["image"] == torch.uint8 and td["z"] == torch.complex128 and td["flag"] == torch.bool
    with pytest.raises(SchemaError, match="torch"):
        Field("t", "str").torch_dtype()


def test_tf_specs():
    tf = pytest.importorskip("tensorflow")
    f = Field("x", "float32", (16,))
    assert f.tf_spec() == tf.TensorSpec((16,), tf.float32, name="x")
    assert f.tf_spec(batch=8).shape.as_list() == [8, 16]
    assert f.tf_spec(batch=-1).shape.as_list() == [None, 16]
    assert Field("b", ">f8").tf_spec().dtype == tf.float64
    assert Field("s", "str").tf_spec(4) == tf.TensorSpec((4,), tf.string, name="s")
    assert Field("n", "bytes", nullable=True).tf_spec().dtype == tf.string
    for name in NUMERIC_DTYPES:
        assert Field("v", name).tf_spec().dtype == tf.as_dtype(np.dtype(name))

    wave = Field("wave", "float32", (None,))
    spec = wave.tf_spec(batch=-1)
    assert isinstance(spec, tf.RaggedTensorSpec)
    assert spec.shape.as_list() == [None, None] and spec.dtype == tf.float32
    dense = wave.tf_spec(batch=-1, ragged=False)
    assert isinstance(dense, tf.TensorSpec) and dense.shape.as_list() == [None, None]

    a4 = Field("a", "uint8", (None, 128, 30, None)).tf_spec(batch=2)
    assert isinstance(a4, tf.RaggedTensorSpec)
    assert a4.shape.as_list() == [2, None, 128, 30, None] and a4.dtype == tf.uint8

    sig = rich_schema().tf_signature(batch=-1)
    assert set(sig) == set(rich_schema().names)
    assert isinstance(sig["wave"], tf.RaggedTensorSpec)
    assert sig["image"].shape.as_list() == [None, 128, 256, 3] and sig["image"].dtype == tf.uint8
    assert sig["speaker"].dtype == tf.string
    dense_sig = rich_schema().tf_signature(ragged=False)
    assert all(isinstance(v, tf.TensorSpec) for v in dense_sig.values())


def test_rowstore_exports():
    for name in rowstore.__all__:
        assert hasattr(rowstore, name), name
