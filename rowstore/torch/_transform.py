"""Transforms: :class:`TransformSpec` (a function plus the schema change it makes), bound to its
input schema, and applied to reader batches and rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rowstore.errors import SchemaError
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY
from rowstore.reader.dataset import Reader
from rowstore.schema import Field, Schema
from rowstore.torch._convert import _columns_of, _conform_batch, _conform_row, _row_of


def _as_field(spec: Any) -> Field:
    if isinstance(spec, Field):
        return spec
    if isinstance(spec, (tuple, list)) and 2 <= len(spec) <= 4:
        name, dtype, *rest = spec
        shape = rest[0] if rest else ()
        nullable = bool(rest[1]) if len(rest) > 1 else False
        return Field(name, dtype, shape, nullable=nullable)
    raise TypeError(
        f"edit_fields entries are rowstore.Field or (name, dtype, shape[, nullable]) tuples, got {spec!r}"
    )


class TransformSpec:
    """A transform and the schema change it makes (Petastorm's ``TransformSpec`` idea).

    Parameters
    ----------
    func : callable, optional
        ``func(x) -> dict``. On a batch it receives the reader's batch dict: ``ndarray`` for
        fixed-shape fields, :class:`~rowstore.reader.Ragged` for variable shapes, ``object``
        arrays for ``str``/``bytes``, ``"<name>__null"`` bool arrays for nullable fields. On a
        row it receives the row dict (arrays, numpy scalars, str/bytes, ``None`` for nulls). It
        may edit the dict in place or return a new one; values may be numpy arrays, torch CPU
        tensors or Python values (and lists of arrays for variable-shape batch fields).
    edit_fields : sequence of Field or (name, dtype, shape[, nullable]) tuples
        Fields the function adds or changes (dtype, shape or nullability).
    removed_fields : sequence of str
        Fields dropped from the output (their ``__null`` companions go too).
    selected_fields : sequence of str, optional
        Keep only these output fields, in this order.

    Notes
    -----
    Outputs are checked against the output schema: a missing field or an undeclared new key
    raises :class:`~rowstore.errors.SchemaError` naming the field; dtypes are cast when the cast
    is of the same kind (or int to float), otherwise rejected; fixed dimensions must match.
    """

    def __init__(
        self,
        func: Callable[[dict], dict] | None = None,
        *,
        edit_fields: Sequence[Any] | None = None,
        removed_fields: Sequence[str] | None = None,
        selected_fields: Sequence[str] | None = None,
    ):
        if func is not None and not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
        self.func = func
        self.edit_fields = tuple(_as_field(f) for f in (edit_fields or ()))
        self.removed_fields = tuple(removed_fields or ())
        self.selected_fields = None if selected_fields is None else tuple(selected_fields)

    def __repr__(self) -> str:
        return (
            f"TransformSpec({getattr(self.func, '__name__', self.func)!r}, edit_fields={[f.name for f in self.edit_fields]}, "
            f"removed_fields={list(self.removed_fields)}, selected_fields={self.selected_fields})"
        )

    def output_schema(self, schema: Schema) -> Schema:
        """The schema of this transform's output given its input ``schema``."""
        missing = [n for n in self.removed_fields if n not in schema]
        if missing:
            raise SchemaError(
                f"removed_fields {missing} are not input fields {schema.names}", field=missing[0]
            )
        fields = {f.name: f for f in schema if f.name not in self.removed_fields}
        for f in self.edit_fields:
            fields[f.name] = f
        if not fields:
            raise SchemaError("the transform removes every field")
        out = Schema(list(fields.values()))
        if self.selected_fields is not None:
            out = out.select(list(self.selected_fields))
        return out


def _as_spec(transform: Any) -> TransformSpec | None:
    if transform is None or isinstance(transform, TransformSpec):
        return transform
    if callable(transform):
        return TransformSpec(transform)
    raise TypeError(
        f"transform must be a callable or a TransformSpec, got {type(transform).__name__}"
    )


class _Transform:
    """A TransformSpec bound to its input and output schemas."""

    __slots__ = ("spec", "input", "output", "_drop", "_strict")

    def __init__(self, spec: TransformSpec, input_schema: Schema):
        self.spec = spec
        self.input = input_schema
        self.output = spec.output_schema(input_schema)
        self._drop = set(spec.removed_fields)
        self._drop |= {n + NULL_KEY for n in spec.removed_fields} | {
            n + SHAPE_KEY for n in spec.removed_fields
        }
        self._strict = spec.selected_fields is None

    def _call(self, x: dict, what: str) -> dict:
        if self.spec.func is None:
            return x
        y = self.spec.func(x)
        if y is None:
            y = x  # edited in place
        if not isinstance(y, Mapping):
            raise TypeError(f"the {what} transform must return a dict, got {type(y).__name__}")
        return y

    def _extras(self, y: Mapping, what: str) -> None:
        if not self._strict:
            return
        known = set(self.output.names) | self._drop
        for k in y:
            if k in known:
                continue
            base, sep, suffix = k.partition("__")
            if sep and base in self.output and "__" + suffix in (NULL_KEY, SHAPE_KEY):
                continue
            if base in self.input:  # a companion of an input field that was dropped or edited
                continue
            raise SchemaError(
                f"the {what} transform returned field {k!r}, which is not in its output schema "
                f"{self.output.names}; declare it in TransformSpec(edit_fields=[...])",
                field=k,
            )

    def batch(self, b: dict) -> dict:
        y = self._call(b, "batch")
        self._extras(y, "batch")
        return _conform_batch(y, self.output, "batch transform")

    def row(self, r: dict) -> dict:
        y = self._call(r, "row")
        self._extras(y, "row")
        return _conform_row(y, self.output, "row transform")


def _schemas(
    reader: Reader, fields, transforms: Sequence[TransformSpec | None]
) -> tuple[Schema, list[_Transform | None], Schema]:
    schema = reader.schema.select(fields)
    bound: list[_Transform | None] = []
    cur = schema
    for spec in transforms:
        t = _Transform(spec, cur) if spec is not None else None
        bound.append(t)
        if t is not None:
            cur = t.output
    return schema, bound, cur


def _process(
    b: dict, row_tf: _Transform | None, batch_tf: _Transform | None, out_schema: Schema
) -> dict:
    """A reader batch through the row and batch transforms, conformed to ``out_schema``."""
    if row_tf is not None:
        n = len(b[row_tf.input.names[0]])
        rows = [row_tf.row(_row_of(b, row_tf.input, i)) for i in range(n)]
        b = _columns_of(rows, row_tf.output)
    if batch_tf is not None:
        b = batch_tf.batch(b)
    return b
