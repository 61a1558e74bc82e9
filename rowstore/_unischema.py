"""The Unischema of a Petastorm dataset, read without petastorm by a restricted unpickler.

A Petastorm dataset is a Parquet directory whose ``_common_metadata`` file holds the pickled
``Unischema`` (key ``dataset-toolkit.unischema.v1``): per field a name, a numpy dtype, a shape
(``None`` for variable dimensions), a codec and a nullable flag. Unpickling it with
:mod:`pickle` would run whatever the file says; :func:`load_unischema` instead uses an
unpickler that knows a short list of globals (Petastorm's ``Unischema``, ``UnischemaField`` and
codec classes, ``pyspark.sql.types`` type classes, numpy scalar types, ``collections.OrderedDict``)
and turns each into a plain description: no Petastorm, pyspark or arbitrary code is imported or
run. Any other global, or a malformed pickle, is a :class:`~rowstore.errors.FormatError`.

:func:`read_unischema` gives the :class:`Unischema`: the rowstore fields and the payload
decoders (:mod:`rowstore._payloads`) that :func:`rowstore.from_parquet` converts the dataset
with. This module imports no pyarrow at import time (only :func:`read_unischema` reads Parquet
metadata).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore._payloads import Decode
from rowstore.errors import FormatError, SchemaError
from rowstore.schema import BYTES, STR, Field, field_name
from rowstore.storage import local_path

__all__ = [
    "UNISCHEMA_KEY",
    "MAX_PICKLE_BYTES",
    "PetastormField",
    "Unischema",
    "load_unischema",
    "read_unischema",
]

#: The ``_common_metadata`` key of the pickled Unischema.
UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
#: Largest pickled Unischema accepted (bytes): a schema of thousands of fields is far smaller.
MAX_PICKLE_BYTES = 4 << 20

_PETASTORM = (
    "petastorm",
    "av.experimental.deepdrive.dataset_toolkit",
)  # the second: its old package name
_NUMPY_TYPES = {
    "bool_": "bool",
    "bool": "bool",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "double": "float64",
    "single": "float32",
    "half": "float16",
    "str_": "str",
    "unicode_": "str",
    "bytes_": "bytes",
    "string_": "bytes",
    "datetime64": "datetime64",
    "timedelta64": "timedelta64",
    "complex64": "complex64",
    "complex128": "complex128",
}
_CODECS = ("NdarrayCodec", "CompressedNdarrayCodec", "CompressedImageCodec", "ScalarCodec")


class _Described:
    """A stand-in for an allowed class: records the arguments and state it is built with."""

    qualname = ""
    args: tuple
    state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> _Described:
        obj = object.__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.qualname} {self.args!r} {self.state!r}>"


_STANDINS: dict[str, type] = {}


def _standin(qualname: str) -> type:
    cls = _STANDINS.get(qualname)
    if cls is None:
        cls = _STANDINS[qualname] = type(
            qualname.rsplit(".", 1)[-1], (_Described,), {"qualname": qualname}
        )
    return cls


def _reconstructor(
    cls: Any, base: Any, state: Any
) -> Any:  # copyreg._reconstructor of protocol 0/1 pickles
    if not (isinstance(cls, type) and issubclass(cls, _Described)):
        raise pickle.UnpicklingError(f"copyreg._reconstructor of {cls!r} is not allowed")
    return cls.__new__(cls)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        qual = f"{module}.{name}"
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if (module, name) in (("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor")):
            return _reconstructor
        if (module, name) == ("builtins", "object"):
            return object
        for p in _PETASTORM:
            if module == f"{p}.unischema" and name in ("Unischema", "UnischemaField"):
                return _standin("petastorm.unischema." + name)
            if module == f"{p}.codecs" and name in _CODECS:
                return _standin("petastorm.codecs." + name)
        if module == "pyspark.sql.types" and name.endswith("Type") and name.isidentifier():
            return _standin(qual)
        if (
            module in ("numpy", "numpy.core.numerictypes", "numpy._core.numerictypes")
            and name in _NUMPY_TYPES
        ):
            return _standin("numpy." + name)
        if module == "numpy" and name == "dtype":
            return _standin("numpy.dtype")
        if (module, name) in (("decimal", "Decimal"), ("builtins", "str"), ("builtins", "bytes")):
            return _standin(qual)
        raise pickle.UnpicklingError(f"global {qual!r} is not part of a Petastorm Unischema")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of a Petastorm Unischema")


# -- descriptions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class PetastormField:
    """One Unischema field, described: ``dtype`` a numpy dtype name, ``"str"``, ``"bytes"``,
    ``"decimal"``, ``"datetime64"`` or ``"timedelta64"`` (no unit); ``codec`` one of
    ``"ndarray"``, ``"compressed_ndarray"``, ``"image"``, ``"scalar"`` or None;
    ``image_format`` ``"png"``/``"jpeg"`` for images; ``spark_type`` the ScalarCodec's type
    name (``"IntegerType"``...)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    codec: str | None
    nullable: bool
    image_format: str | None = None
    spark_type: str | None = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "codec": self.codec,
            "nullable": self.nullable,
            "image_format": self.image_format,
            "spark_type": self.spark_type,
        }


def _bad(where: str, msg: str) -> FormatError:
    return FormatError(f"{where}: the Petastorm Unischema is not valid: {msg}", path=where)


def _dtype_name(v: Any, where: str, field: str) -> str:
    if isinstance(v, type) and issubclass(v, _Described):
        q = v.qualname
        if q.startswith("numpy."):
            return _NUMPY_TYPES[q[len("numpy.") :]]
        if q == "decimal.Decimal":
            return "decimal"
        if q in ("builtins.str", "builtins.bytes"):
            return q[len("builtins.") :]
    if (
        isinstance(v, _Described)
        and v.qualname == "numpy.dtype"
        and v.args
        and isinstance(v.args[0], str)
    ):
        try:
            dt = np.dtype(v.args[0])  # a dtype string such as "i4", "f8", "U0"
        except (
            TypeError,
            ValueError,
            OverflowError,
            MemoryError,
        ):  # "(2**40,)f8": numpy's C-int limits
            raise _bad(where, f"field {field!r}: unknown dtype {v.args[0]!r}") from None
        if dt.fields is not None or dt.subdtype is not None or dt.kind not in "biufcUSMm":
            raise _bad(where, f"field {field!r}: dtype {v.args[0]!r} is not a scalar numpy type")
        return STR if dt.kind == "U" else BYTES if dt.kind == "S" else dt.name
    raise _bad(where, f"field {field!r}: numpy_dtype {v!r} is not a numpy type")


def _codec(v: Any, where: str, field: str) -> tuple[str | None, str | None, str | None]:
    if v is None:
        return None, None, None
    if not isinstance(v, _Described) or not v.qualname.startswith("petastorm.codecs."):
        raise _bad(where, f"field {field!r}: codec {v!r} is not a Petastorm codec")
    name = v.qualname.rsplit(".", 1)[1]
    state = v.state if isinstance(v.state, dict) else {}
    if name == "NdarrayCodec":
        return "ndarray", None, None
    if name == "CompressedNdarrayCodec":
        return "compressed_ndarray", None, None
    if name == "CompressedImageCodec":
        fmt = state.get("_image_codec", v.args[0] if v.args else ".png")
        fmt = fmt.lstrip(".").lower() if isinstance(fmt, str) else None
        fmt = {"jpg": "jpeg"}.get(fmt or "", fmt)
        if fmt not in ("png", "jpeg"):
            raise _bad(where, f"field {field!r}: image codec {fmt!r}; expected png or jpeg")
        return "image", fmt, None
    st = state.get("_spark_type", v.args[0] if v.args else None)
    return "scalar", None, st.qualname.rsplit(".", 1)[1] if isinstance(st, _Described) else None


def _shape(v: Any, where: str, field: str) -> tuple[int | None, ...]:
    if (
        not isinstance(v, tuple)
        or not all(d is None or (type(d) is int and 0 <= d < 1 << 31) for d in v)
        or len(v) > 32
    ):
        raise _bad(where, f"field {field!r}: shape {v!r} is not a tuple of ints and None")
    return v


def load_unischema(data: bytes, where: str = "<bytes>") -> list[PetastormField]:
    """The fields of a pickled Petastorm Unischema, in its order, without running the pickle.

    Raises :class:`~rowstore.errors.FormatError` for anything but a Unischema made of the
    allowed classes (a hostile or corrupt pickle included)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_PICKLE_BYTES:
        raise _bad(
            where,
            f"expected at most {MAX_PICKLE_BYTES} bytes of pickle, got "
            f"{len(data) if isinstance(data, (bytes, bytearray)) else type(data).__name__}",
        )
    try:
        obj = _Unpickler(io.BytesIO(bytes(data))).load()
    except FormatError:
        raise
    except RecursionError:
        raise _bad(where, "the pickle nests too deeply") from None
    except Exception as exc:  # UnpicklingError, EOFError, TypeError...: never trust the bytes
        raise _bad(where, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(obj, _Described) or obj.qualname != "petastorm.unischema.Unischema":
        raise _bad(where, f"the pickle holds {type(obj).__name__}, not a Unischema")
    state = obj.state if isinstance(obj.state, dict) else {}
    fields = state.get("_fields")
    if not isinstance(fields, dict) or not fields:
        raise _bad(where, "no _fields")
    out = []
    for key, f in fields.items():
        if (
            not isinstance(f, _Described)
            or f.qualname != "petastorm.unischema.UnischemaField"
            or not 4 <= len(f.args) <= 5
            or not isinstance(f.args[0], str)
        ):
            raise _bad(where, f"field {key!r} is not a UnischemaField")
        name = f.args[0]
        nullable = f.args[4] if len(f.args) == 5 else False
        if not isinstance(nullable, bool):
            raise _bad(where, f"field {name!r}: nullable {nullable!r} is not a bool")
        codec, fmt, spark = _codec(f.args[3], where, name)
        out.append(
            PetastormField(
                name,
                _dtype_name(f.args[1], where, name),
                _shape(f.args[2], where, name),
                codec,
                nullable,
                fmt,
                spark,
            )
        )
    return out


# -- the rowstore side ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Unischema:
    """A Petastorm dataset's fields and what :func:`rowstore.from_parquet` needs to convert it:
    ``partial`` (rowstore fields, in the Unischema's order; None where the Parquet column's
    Arrow type decides, which :mod:`rowstore.arrow` fills in), ``payloads`` (binary columns and
    how to decode them, as ``from_parquet``'s ``payloads=`` takes them) and ``columns`` (the
    Parquet columns, in that order)."""

    fields: tuple[PetastormField, ...]
    partial: tuple  # per field its rowstore Field, or None where the Parquet column's type decides
    payloads: dict
    columns: list

    def select(self, columns: Any = None) -> Unischema:
        """This Unischema restricted to ``columns`` (names, in the given order; None: all)."""
        if columns is None:
            return self
        by = {f.name: f for f in self.fields}
        missing = [c for c in columns if c not in by]
        if missing:
            raise SchemaError(
                f"columns {missing} are not in the Unischema ({list(by)})", field=missing[0]
            )
        return unischema([by[c] for c in columns])

    def describe(self) -> list[dict]:
        return [f.to_json() for f in self.fields]


def rowstore_field(pf: PetastormField, name: str) -> tuple[Field | None, Decode | None]:
    """The rowstore field (None: from the Parquet column's type) and decoder of one field."""
    if pf.codec in ("ndarray", "compressed_ndarray", "image"):
        if pf.dtype in (STR, BYTES, "decimal", "datetime64", "timedelta64"):
            raise SchemaError(
                f"Petastorm field {pf.name!r}: arrays of {pf.dtype} are not supported",
                field=pf.name,
            )
        if pf.codec == "image":  # the cells are stored as they are (rowstore.arrow.as_is)
            codec = {"id": "png", "level": 1} if pf.image_format == "png" else {"id": "jpeg"}
            field = Field(name, pf.dtype, pf.shape, codec=codec, nullable=pf.nullable)
            return field, Decode(pf.image_format or "png", field)
        field = Field(name, pf.dtype, pf.shape, nullable=pf.nullable)
        return field, Decode("npy" if pf.codec == "ndarray" else "npz", field)
    if pf.shape:  # a native list column (no codec): its Arrow type decides
        return None, None
    if pf.dtype == "decimal":
        raise SchemaError(
            f"Petastorm field {pf.name!r}: Decimal values are not supported (Petastorm reads "
            "them as str; convert the column)",
            field=pf.name,
        )
    if pf.dtype in ("datetime64", "timedelta64"):
        return None, None  # the unit comes from the Parquet column
    return Field(name, pf.dtype, (), nullable=pf.nullable), None


def unischema(fields: list[PetastormField]) -> Unischema:
    taken: set[str] = set()
    rs_fields, payloads = [], {}
    for pf in fields:
        f, d = rowstore_field(pf, field_name(pf.name, taken))
        rs_fields.append(f)
        if d is not None:
            payloads[pf.name] = d
    return Unischema(tuple(fields), tuple(rs_fields), payloads, [pf.name for pf in fields])


def read_unischema(path: str | os.PathLike, *, required: bool = True) -> Unischema | None:
    """The Unischema of the Petastorm dataset at ``path`` (a directory or ``file://`` URL), or
    None when it has none and not ``required``."""
    import pyarrow.parquet as pq

    root = os.fsdecode(local_path(path))
    meta = os.path.join(root, "_common_metadata")
    if not os.path.isfile(meta):
        if required:
            raise FormatError(
                f"{root!r} is not a Petastorm dataset: no _common_metadata file (written by "
                "petastorm.etl.dataset_metadata.materialize_dataset)",
                path=root,
            )
        return None
    try:
        kv = pq.read_metadata(meta).metadata or {}
    except Exception as exc:  # a corrupt metadata file
        raise FormatError(f"{meta!r}: cannot read the Parquet metadata: {exc}", path=meta) from None
    data = kv.get(UNISCHEMA_KEY)
    if data is None:
        if required:
            raise FormatError(f"{meta!r} holds no Unischema ({UNISCHEMA_KEY.decode()})", path=meta)
        return None
    return unischema(load_unischema(data, meta))
