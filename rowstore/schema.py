"""Schema: the named, typed fields of a dataset's rows.

A :class:`Schema` is an ordered, immutable collection of :class:`Field`\\ s. It validates itself on
construction, round-trips through JSON (it is stored in every file, so a file describes itself),
and renders to numpy dtypes, torch dtypes and ``tf.TensorSpec``\\ s (the frameworks are imported
lazily, only by those methods).
"""

from __future__ import annotations

import json
import keyword
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

# Codecs sit below the schema: a Field holds its codec instance (placement, validation,
# decoding), while codecs see fields only through their attributes (type hints, no import).
from rowstore import _html
from rowstore.codecs import Codec, get_codec
from rowstore.errors import SchemaError

__all__ = ["Field", "Schema", "STR", "BYTES"]

#: Marker dtype names for text and binary fields (stored in the heap, one value per row).
STR = "str"
BYTES = "bytes"

_NUMERIC_KINDS = {"b", "i", "u", "f", "c"}
#: Kinds of the time dtypes: ``datetime64[unit]`` ("M") and ``timedelta64[unit]`` ("m").
TIME_KINDS = {"M", "m"}
#: Units a time field may have (``D`` for datetimes only: a timedelta of days is ``"s"`` * 86400).
DATETIME_UNITS = ("D", "s", "ms", "us", "ns")
TIMEDELTA_UNITS = ("s", "ms", "us", "ns")


def field_name(name: Any, taken: set[str]) -> str:
    """A field name for a column name of a DataFrame or an Arrow table (or ``None``: ``"index"``):
    an identifier without ``__``, unique in ``taken`` (which it is added to)."""
    base = re.sub(r"\W", "_", str(name)) if name is not None else "index"
    base = re.sub(r"_{2,}", "_", base) or "_"
    if base[0].isdigit():
        base = "c" + base if base.startswith("_") else "c_" + base
    if keyword.iskeyword(base):
        base += "_"
    out, k = base, 1
    while out in taken:
        out = f"{base.rstrip('_')}_{k}"
        k += 1
    taken.add(out)
    return out


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a field's stored bytes: the field's own dtype, except for datetime64 and
    timedelta64 fields, which are stored as little-endian ``int64`` counts of their unit (HDF5
    has no datetime type; the unit is in the schema's dtype string, e.g. ``"<M8[ns]"``)."""
    return np.dtype("<i8") if dtype.kind in TIME_KINDS else dtype


def _normalize_dtype(dtype: Any, name: str) -> np.dtype | str:
    if dtype is None:  # np.dtype(None) is float64: a missing dtype must not become one
        raise SchemaError(
            f"field {name!r}: no dtype (got None); expected a numpy dtype name, 'str' or 'bytes'",
            field=name,
        )
    if dtype is str or dtype == STR:
        return STR
    if dtype is bytes or dtype == BYTES:
        return BYTES
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise SchemaError(f"field {name!r}: unknown dtype {dtype!r}", field=name) from exc
    if dt.kind == "U":
        return STR
    if dt.kind == "S":
        return BYTES
    if dt.kind in TIME_KINDS and dt.fields is None and dt.subdtype is None:
        unit, count = np.datetime_data(dt)
        units = DATETIME_UNITS if dt.kind == "M" else TIMEDELTA_UNITS
        if unit not in units or count != 1:
            what = "datetime64" if dt.kind == "M" else "timedelta64"
            raise SchemaError(
                f"field {name!r}: {dt} has no supported unit; expected {what}[unit] with unit one "
                f"of "
                f"{', '.join(units)}",
                field=name,
            )
        return dt.newbyteorder("<")
    if dt.kind not in _NUMERIC_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise SchemaError(
            f"field {name!r}: dtype {dt} is not supported; expected a bool, integer, float, "
            f"complex, datetime64[unit] or timedelta64[unit] scalar dtype, 'str' or 'bytes'",
            field=name,
        )
    if dt.kind == "f" and dt.itemsize > 8:
        raise SchemaError(f"field {name!r}: {dt} (extended precision) is not portable", field=name)
    # On disk everything is little-endian: normalise once here.
    return dt.newbyteorder("<") if dt.itemsize > 1 else dt


def _normalize_shape(shape: Any, name: str) -> tuple[int | None, ...]:
    if shape is None:
        return ()
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError as exc:
        raise SchemaError(
            f"field {name!r}: shape must be a tuple, got {shape!r}", field=name
        ) from exc
    out: list[int | None] = []
    for d in dims:
        if d is None or d == -1:
            out.append(None)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise SchemaError(
                f"field {name!r}: shape {dims!r} has an invalid dimension {d!r}; expected a "
                f"non-negative int or None (variable)",
                field=name,
            )
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Field:
    """One named column of a dataset.

    Parameters
    ----------
    name : str
        A Python identifier, unique in the schema, without a double underscore.
    dtype : numpy dtype-like, ``"str"`` or ``"bytes"``
        Element type. Multi-byte numbers are stored little-endian. ``datetime64[unit]`` (units
        ``D``, ``s``, ``ms``, ``us``, ``ns``) and ``timedelta64[unit]`` (``s``, ``ms``, ``us``,
        ``ns``) are stored as int64 counts of the unit; NaT is a value (not a null).
    shape : tuple of int or None
        Shape of one row's value; ``()`` for scalars, ``None`` marks a variable dimension,
        e.g. ``(None,)`` for a waveform or ``(None, 128, 30, None)``.
    codec : str, dict or Codec, optional
        How the value is stored: ``"raw"`` (default for numbers), ``"utf8"`` (default for
        ``str``), ``"bytes"``, ``"png"``, ``"jpeg"``, or a registered third-party codec; a dict
        ``{"id": "jpeg", "quality": 90}`` gives its configuration.
    nullable : bool
        Whether ``None`` is accepted for this field.
    """

    name: str
    dtype: Any
    shape: Any = ()
    codec: Any = None
    nullable: bool = False
    _codec_obj: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _stored_nbytes: Any = field(default=None, init=False, repr=False, compare=False, hash=False)
    _key: Any = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise SchemaError(f"field name {name!r} is not a Python identifier", field=str(name))
        if "__" in name:
            raise SchemaError(
                f"field name {name!r} contains '__', which rowstore reserves for its own columns",
                field=name,
            )
        dtype = _normalize_dtype(self.dtype, name)
        shape = _normalize_shape(self.shape, name)
        if dtype in (STR, BYTES) and shape != ():
            raise SchemaError(
                f"field {name!r}: {dtype} fields hold one value per row; shape must be (), got "
                f"{shape}",
                field=name,
            )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "shape", shape)
        if not isinstance(self.nullable, (bool, np.bool_)):
            raise SchemaError(
                f"field {name!r}: nullable must be a bool, got {self.nullable!r}", field=name
            )
        object.__setattr__(self, "nullable", bool(self.nullable))
        codec = get_codec(self.codec, dtype=dtype, field=name)
        codec.check_field(self)
        object.__setattr__(self, "_stored_nbytes", self._placement(codec))
        object.__setattr__(self, "_codec_obj", codec)
        config = json.loads(
            json.dumps(codec.get_config())
        )  # a private copy: nothing outside can change it
        object.__setattr__(self, "codec", MappingProxyType(config))
        object.__setattr__(self, "_key", json.dumps(self.to_json(), sort_keys=True))

    def _placement(self, codec: Codec) -> int | None:
        """Bytes of one value in the row, or None for heap payloads, as the codec says."""
        nbytes = codec.stored_nbytes(self)
        if nbytes is None:
            return None
        if (
            not isinstance(nbytes, int)
            or isinstance(nbytes, bool)
            or nbytes < 0
            or self.is_variable
        ):
            raise SchemaError(
                f"field {self.name!r}: codec {codec.codec_id!r} stores {nbytes!r} bytes per value "
                f"in the row; "
                f"expected a non-negative int, for a field of fixed shape",
                field=self.name,
            )
        if nbytes == 0:
            # HDF5 cannot store a zero-sized array member in the row table.
            raise SchemaError(
                f"field {self.name!r}: shape {self.shape} has a fixed dimension of 0, which cannot "
                f"be stored in "
                f"the row table (every value would be empty)",
                field=self.name,
            )
        return nbytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Field) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self):
        # By description (pickle cannot copy the read-only codec mapping; the codec is rebuilt).
        return (type(self).from_json, (self.to_json(),))

    # -- properties -------------------------------------------------------------------------
    @property
    def codec_obj(self) -> Codec:
        """The :class:`~rowstore.codecs.Codec` instance for this field."""
        return self._codec_obj

    @property
    def is_text(self) -> bool:
        return self.dtype == STR

    @property
    def is_bytes(self) -> bool:
        return self.dtype == BYTES

    @property
    def is_variable(self) -> bool:
        """True when some dimension is ``None``."""
        return any(d is None for d in self.shape)

    @property
    def inline(self) -> bool:
        """True when values live in the row itself (fixed-size), False when in the heap."""
        return self._stored_nbytes is not None

    @property
    def stored_nbytes(self) -> int | None:
        """Bytes of one value in the row (inline fields), None for heap payloads."""
        return self._stored_nbytes

    @property
    def variable_dims(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shape) if d is None)

    @property
    def numpy_dtype(self) -> np.dtype:
        """dtype of one element as returned by readers (``object`` for str/bytes)."""
        if self.dtype in (STR, BYTES):
            return np.dtype(object)
        return self.dtype

    @property
    def is_time(self) -> bool:
        """True for datetime64 and timedelta64 fields."""
        return not isinstance(self.dtype, str) and self.dtype.kind in TIME_KINDS

    @property
    def storage_dtype(self) -> np.dtype:
        """dtype of the stored elements (int64 for datetime64/timedelta64 fields)."""
        if self.dtype in (STR, BYTES):
            return np.dtype(object)
        return storage_dtype(self.dtype)

    @property
    def itemsize(self) -> int:
        return 0 if self.dtype in (STR, BYTES) else self.dtype.itemsize

    @property
    def fixed_nbytes(self) -> int:
        """Bytes of one value for fully fixed shapes (0 for str/bytes/variable)."""
        if self.dtype in (STR, BYTES) or self.is_variable:
            return 0
        return math.prod(self.shape) * self.itemsize  # Python ints: no wrap-around for huge shapes

    # -- rendering --------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype if isinstance(self.dtype, str) else self.dtype.str,
            "shape": list(self.shape),
            "codec": dict(self.codec),
            "nullable": self.nullable,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Field:
        if not isinstance(obj, Mapping):
            raise SchemaError(f"a field description must be a JSON object, got {obj!r}")
        try:
            return cls(
                name=obj["name"],
                dtype=obj["dtype"],
                shape=obj.get("shape", ()),  # validated (and normalised) by the constructor
                codec=obj.get("codec"),
                nullable=obj.get("nullable", False),
            )
        except KeyError as exc:
            raise SchemaError(f"field description {dict(obj)!r} lacks {exc.args[0]!r}") from exc

    def torch_dtype(self):
        """The torch dtype of this field's tensors (imports torch); ``torch.int64`` for
        datetime64/timedelta64 fields (the count of the field's unit)."""
        import torch

        if self.dtype in (STR, BYTES):
            raise SchemaError(
                f"field {self.name!r}: {self.dtype} values have no torch dtype; they are "
                f"returned as Python lists",
                field=self.name,
            )
        dt = (
            self.storage_dtype
        )  # datetime64/timedelta64: int64 counts of the unit (torch has no time dtype)
        mapping = {
            "b1": torch.bool,
            "i1": torch.int8,
            "u1": torch.uint8,
            "i2": torch.int16,
            "u2": torch.uint16,
            "i4": torch.int32,
            "u4": torch.uint32,
            "i8": torch.int64,
            "u8": torch.uint64,
            "f2": torch.float16,
            "f4": torch.float32,
            "f8": torch.float64,
            "c8": torch.complex64,
            "c16": torch.complex128,
        }
        return mapping[f"{dt.kind}{dt.itemsize}"]

    def tf_spec(self, batch: int | None = None, *, ragged: bool = True):
        """A ``tf.TensorSpec`` (or ``tf.RaggedTensorSpec`` for variable shapes when ``ragged``)
        for this field, with a leading batch dimension when ``batch`` is given or ``-1``."""
        import tensorflow as tf

        shape: tuple[int | None, ...] = self.shape
        if batch is not None:
            shape = (None if batch < 0 else batch,) + shape
        if self.dtype == STR or self.dtype == BYTES:
            dtype = tf.string
        else:
            # datetime64/timedelta64: int64 counts of the unit (tf has no time dtype)
            dtype = tf.as_dtype(self.storage_dtype.newbyteorder("="))
        if self.is_variable and ragged:
            # Ragged up to the last variable dimension; fixed dimensions after it stay dense in
            # ``flat_values`` (``(None, 80)`` batched: ragged_rank 1, flat_values ``(n, 80)``).
            ragged_rank = len(shape) - len(self.shape) + max(self.variable_dims)
            return tf.RaggedTensorSpec(shape=shape, dtype=dtype, ragged_rank=ragged_rank)
        return tf.TensorSpec(shape=shape, dtype=dtype, name=self.name)


class Schema(Sequence[Field]):
    """An ordered, immutable collection of uniquely named :class:`Field`\\ s.

    >>> schema = Schema([Field("image", "uint8", (128, 256, 3), codec="png"),
    ...                  Field("label", "int64")])
    >>> schema["label"].dtype
    dtype('int64')
    """

    __slots__ = ("_fields", "_by_name")

    def __init__(self, fields: Sequence[Field] | Mapping[str, Any]):
        if isinstance(fields, Mapping):
            fields = [
                f if isinstance(f, Field) else Field(name, *_as_tuple(f))
                for name, f in fields.items()
            ]
        fields = tuple(fields)
        if not fields:
            raise SchemaError("a schema needs at least one field")
        by_name: dict[str, Field] = {}
        for f in fields:
            if not isinstance(f, Field):
                raise SchemaError(f"schema entries must be Field, got {type(f).__name__}")
            if f.name in by_name:
                raise SchemaError(f"duplicate field name {f.name!r}", field=f.name)
            by_name[f.name] = f
        self._fields = fields
        self._by_name = by_name

    # Sequence protocol plus lookup by name
    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return self._by_name[key]
            except KeyError:
                raise KeyError(f"no field {key!r}; fields are {self.names}") from None
        return self._fields[key]

    def __len__(self) -> int:
        return len(self._fields)

    def __iter__(self) -> Iterator[Field]:
        return iter(self._fields)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json_str())

    def __repr__(self) -> str:
        shown = self._fields[: _html.MAX_LINES - 3]  # one screen at most
        inner = ",\n    ".join(repr(f) for f in shown)
        more = len(self._fields) - len(shown)
        tail = f"\n    # ... and {more:,} more fields" if more else ""
        return f"Schema([\n    {inner},{tail}\n])"

    def _repr_html_(self) -> str:
        """The notebook view: the fields in a collapsible table (:mod:`rowstore._html`)."""
        return _html.schema_html(self)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self._fields]

    def select(self, names: Sequence[str] | None) -> Schema:
        """The sub-schema of the named fields (names or :class:`Field` objects), in the given
        order (all fields for None)."""
        if names is None:
            return self
        if isinstance(names, (str, Field)):
            names = [names]
        names = [n.name if isinstance(n, Field) else n for n in names]
        unknown = [n for n in names if n not in self._by_name]
        if unknown:
            raise SchemaError(
                f"unknown field(s) {unknown}; the schema has {self.names}", field=unknown[0]
            )
        return Schema([self._by_name[n] for n in names])

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"fields": [f.to_json() for f in self._fields]}

    def to_json_str(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | str) -> Schema:
        if isinstance(obj, (str, bytes)):
            try:
                obj = json.loads(obj)
            except (
                json.JSONDecodeError,
                RecursionError,
            ) as exc:  # RecursionError: nesting too deep
                raise SchemaError(f"schema is not valid JSON: {exc}") from exc
        if not isinstance(obj, Mapping) or not isinstance(obj.get("fields"), list):
            raise SchemaError("schema JSON must be an object with a 'fields' list")
        return cls([Field.from_json(f) for f in obj["fields"]])

    # -- rendering -------------------------------------------------------------------------
    def numpy_dtypes(self) -> dict[str, tuple[np.dtype, tuple[int | None, ...]]]:
        """Per field: (element dtype as returned by readers, per-row shape)."""
        return {f.name: (f.numpy_dtype, f.shape) for f in self._fields}

    def torch_dtypes(self) -> dict:
        """Per field, its torch dtype (str/bytes fields are left out: they come as lists)."""
        return {f.name: f.torch_dtype() for f in self._fields if f.dtype not in (STR, BYTES)}

    def tf_signature(self, batch: int | None = None, *, ragged: bool = True) -> dict:
        """Per field, a ``tf.TensorSpec``/``tf.RaggedTensorSpec`` (imports tensorflow)."""
        return {f.name: f.tf_spec(batch, ragged=ragged) for f in self._fields}

    # -- inference -------------------------------------------------------------------------
    @classmethod
    def infer(cls, example: Mapping[str, Any], *, nullable: Sequence[str] = ()) -> Schema:
        """Build a schema from ONE example row: arrays keep their dtype and (fixed) shape,
        Python ints become int64, floats float64, bools bool, str and bytes stay so.

        One row cannot tell which dimensions vary (a waveform's length): every shape comes out
        fixed. Use :meth:`infer_rows` to look at many rows (variable dimensions and nulls found),
        or :func:`rowstore.pandas.infer_schema` for a DataFrame; or pass ``nullable=[...]`` and
        edit shapes to ``None`` for dimensions that vary between rows.
        """
        fields = []
        for name, value in example.items():
            if value is None:
                raise SchemaError(f"cannot infer the type of field {name!r} from None", field=name)
            if isinstance(value, str):
                fields.append(Field(name, STR, nullable=name in nullable))
            elif isinstance(value, (bytes, bytearray, memoryview)):
                fields.append(Field(name, BYTES, nullable=name in nullable))
            else:
                arr = np.asarray(value)
                if arr.dtype.kind in "US":
                    raise SchemaError(
                        f"field {name!r}: arrays of strings are not supported", field=name
                    )
                if arr.dtype == np.dtype(object):
                    raise SchemaError(
                        f"field {name!r}: cannot infer a dtype from {type(value).__name__}",
                        field=name,
                    )
                fields.append(Field(name, arr.dtype, arr.shape, nullable=name in nullable))
        return cls(fields)

    @classmethod
    def infer_rows(cls, rows: Any) -> Schema:
        """Build a schema from every row of ``rows`` (an iterable of mappings, e.g. a sample of
        a dataset): a dimension whose size differs between rows becomes variable (``None``), a
        field that is ``None`` (or missing) in some row nullable; values of one field must agree
        on their kind, dtype and rank (:class:`SchemaError` naming field and row otherwise).
        """
        seen: dict[str, tuple[Any, tuple]] = {}  # name -> (dtype, shape so far)
        nulls: set[str] = set()
        first: dict[str, int] = {}
        count = 0
        for i, row in enumerate(rows):
            count += 1
            for name in seen:
                if name not in row:
                    nulls.add(name)
            for name, value in row.items():
                if value is None or type(value).__name__ == "NAType":
                    nulls.add(name)
                    continue
                dt: Any
                shp: tuple
                if isinstance(value, str):
                    dt, shp = STR, ()
                elif isinstance(value, (bytes, bytearray, memoryview)):
                    dt, shp = BYTES, ()
                else:
                    arr = np.asarray(value)
                    if arr.dtype == np.dtype(object) or arr.dtype.kind in "US":
                        raise SchemaError(
                            f"field {name!r}, row {i}: cannot infer a dtype from "
                            f"{type(value).__name__}",
                            field=name,
                            row=i,
                        )
                    dt, shp = arr.dtype, arr.shape
                if name not in seen:
                    seen[name], first[name] = (dt, shp), i
                    if i:
                        nulls.add(name)  # missing from the rows before
                    continue
                gdt, gshape = seen[name]
                if gdt != dt or len(gshape) != len(shp):
                    raise SchemaError(
                        f"field {name!r}, row {i}: {dt} of shape {shp}, but row {first[name]} "
                        f"holds "
                        f"{gdt} of shape {gshape}",
                        field=name,
                        row=i,
                    )
                seen[name] = (gdt, tuple(a if a == b else None for a, b in zip(gshape, shp)))
        if not count:
            raise SchemaError("cannot infer a schema from no rows")
        untyped = [n for n in nulls if n not in seen]
        if untyped:
            raise SchemaError(
                f"cannot infer the type of field {untyped[0]!r}: it is None in every row",
                field=untyped[0],
            )
        return cls(
            [
                Field(name, dt, tuple(None if d == 0 else d for d in shape), nullable=name in nulls)
                for name, (dt, shape) in seen.items()
            ]
        )


def _as_tuple(spec: Any) -> tuple:
    if isinstance(spec, tuple):
        return spec
    return (spec,)
