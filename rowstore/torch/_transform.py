"""Transforms: a :class:`~rowstore.reader.transform.TransformSpec` (a function plus the schema
change it makes) bound to its input schema, and applied to reader batches and rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rowstore.errors import SchemaError
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY
from rowstore.reader.dataset import Reader
from rowstore.reader.image_ops import decoded_schema
from rowstore.reader.transform import TransformSpec
from rowstore.schema import Schema
from rowstore.torch._convert import _columns_of, _conform_batch, _conform_row, _row_of


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
    reader: Reader, fields, transforms: Sequence[TransformSpec | None], decode=None
) -> tuple[Schema, list[_Transform | None], Schema]:
    """The input schema (the reader's batches: ``fields``, image ops ``decode`` applied), each
    transform bound to its input, the output schema."""
    schema = decoded_schema(reader.schema.select(fields), decode)
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
