"""PyTorch adapters: datasets for ``torch.utils.data.DataLoader`` and a fast batched loader.

This is the only rowstore module that imports torch. Use it as ``import rowstore.torch as rst``.

- :class:`Dataset`: map-style; ``__getitems__`` fetches a whole DataLoader batch with one
  :meth:`Reader.take <rowstore.reader.Reader.take>`; pass ``collate_fn=rowstore.torch.collate``.
- :class:`IterableDataset`: splits each epoch over DDP ranks and DataLoader workers with no
  overlap and no loss; yields rows, or whole batches with ``batch_size``.
- :class:`BatchedDataLoader`: the fast path, no ``DataLoader``: dicts of tensors built with
  ``torch.from_numpy`` on the reader's arrays; with a CUDA ``device``, pinned staging buffers and
  ``non_blocking`` copies on a side stream. Resumable mid-epoch (``state_dict``).
- :class:`InMemBatchedDataLoader`: reads its shard once, then shuffles and batches from memory.
- :class:`TransformSpec`: a per-row or per-batch transform that declares the fields it edits,
  removes or adds, so every loader knows its ``output_schema``.
- :func:`collate`: the ``collate_fn`` for :class:`Dataset` and row-mode :class:`IterableDataset`.

Variable-shape fields are collated per field (``varlen=``): ``"padded"`` (a zero-padded tensor
plus ``"<name>__shape"``, the variable dimensions of each row, int64 ``(n, k)``), ``"nested"``
(``torch.nested``: the jagged layout, a view of the batch values, when only the first dimension
varies; otherwise a strided nested tensor, a copy) or ``"list"`` (a list of tensors, views).
``str``/``bytes`` fields are Python lists; a nullable field adds ``"<name>__null"`` (bool).
See ``docs/torch.md``.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data as _tud

from rowstore.errors import SchemaError
from rowstore.reader import order as _order
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY, Ragged, pad_ragged
from rowstore.reader.dataset import Reader
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = [
    "Dataset", "IterableDataset", "BatchedDataLoader", "InMemBatchedDataLoader", "TransformSpec",
    "collate", "Row", "RowBatch", "torch_dtype", "VARLEN_MODES",
]  # fmt: skip

#: Collations of variable-shape fields.
VARLEN_MODES = ("padded", "nested", "list")
_STATE_VERSION = 1
_INMEM_STREAM = 0x1A3E  # key of the in-memory loader's permutations in order.seed64
_ROW_READ_BATCH = 512  # rows read at once by IterableDataset in row mode


# -- dtypes ------------------------------------------------------------------------------------
def torch_dtype(field: Field) -> torch.dtype:
    """The torch dtype of ``field``'s tensors.

    Raises :class:`~rowstore.errors.SchemaError` (naming the field) for ``str``/``bytes`` (they
    are returned as Python lists) and for unsigned dtypes this torch lacks (``uint16``/``32``/
    ``64`` need torch >= 2.3; they hold and move data, but most arithmetic is not implemented
    for them: cast with ``.to(torch.int64)`` before computing).
    """
    try:
        return field.torch_dtype()
    except AttributeError as exc:  # torch without torch.uint16/32/64
        raise SchemaError(
            f"field {field.name!r}: torch {torch.__version__} has no {field.dtype} tensors (torch >= 2.3 "
            f"has them); cast the field in a TransformSpec", field=field.name) from exc  # fmt: skip


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    """Casts a transform's output may get silently: same kind, int<->uint, ints/bools to floats."""
    if src == dst or np.can_cast(src, dst, "same_kind"):
        return True
    return (src.kind in "iu" and dst.kind in "iu") or (src.kind in "biu" and dst.kind in "fc")


def _tensor(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy`` (a view), copying only what torch cannot view: read-only arrays,
    negative strides, non-native byte order."""
    if not a.flags.writeable:
        a = a.copy()
    try:
        return torch.from_numpy(a)
    except (ValueError, TypeError):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")))


# -- varlen modes ------------------------------------------------------------------------------
def _resolve_varlen(varlen: str | Mapping[str, str], schema: Schema) -> dict[str, str]:
    """Per variable-shape field of ``schema``: "padded", "jagged", "strided" or "list"."""
    if isinstance(varlen, str):
        default, per = varlen, {}
    elif isinstance(varlen, Mapping):
        default, per = "padded", dict(varlen)
        unknown = [k for k in per if k not in schema]
        if unknown:
            raise SchemaError(
                f"varlen names unknown field(s) {unknown}; the output fields are {schema.names}",
                field=unknown[0],
            )
    else:
        raise TypeError(
            f"varlen must be one of {VARLEN_MODES} or a dict of them per field, got {varlen!r}"
        )
    out = {}
    for mode in [default, *per.values()]:
        if mode not in VARLEN_MODES:
            raise ValueError(f"varlen modes are {VARLEN_MODES}, got {mode!r}")
    for f in schema:
        if not f.is_variable or f.dtype in (STR, BYTES):
            continue
        mode = per.get(f.name, default)
        if mode == "nested":
            if f.variable_dims == (0,):
                mode = "jagged"
            else:
                mode = "strided"
                if np.dtype(f.dtype).kind == "u" and f.dtype.itemsize > 1:
                    raise SchemaError(
                        f"field {f.name!r}: torch cannot build a strided nested tensor of {f.dtype} "
                        f"(shape {f.shape} varies beyond its first dimension, so the jagged layout does "
                        f"not apply); use varlen 'padded' or 'list' for it, or cast it in a TransformSpec",
                        field=f.name)  # fmt: skip
        out[f.name] = mode
    return out


# -- transforms --------------------------------------------------------------------------------
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


# -- conforming values to a schema -------------------------------------------------------------
def _np(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().numpy()
    return np.asarray(v)


def _cast(a: np.ndarray, f: Field, where: str) -> np.ndarray:
    if a.dtype == f.dtype:
        return a
    if a.dtype.kind not in "biufc" or not _castable(a.dtype, f.dtype):
        raise SchemaError(
            f"{where}: field {f.name!r} is {f.dtype} in the output schema, got {a.dtype}; "
            f"declare the new dtype in edit_fields or cast it",
            field=f.name,
        )
    return a.astype(f.dtype)


def _check_fixed_dims(shape: tuple, f: Field, where: str) -> None:
    if len(shape) != len(f.shape) or any(s is not None and s != d for s, d in zip(f.shape, shape)):
        raise SchemaError(
            f"{where}: field {f.name!r} must have shape {f.shape} per row, got {tuple(shape)}",
            field=f.name,
        )


def _ragged_from_arrays(vals: Sequence[Any], f: Field, where: str) -> Ragged:
    nd = len(f.shape)
    arrs = []
    for v in vals:
        if v is None:
            arrs.append(np.zeros(tuple(0 if d is None else d for d in f.shape), f.dtype))
            continue
        a = _cast(_np(v), f, where)
        _check_fixed_dims(a.shape, f, where)
        arrs.append(a)
    n = len(arrs)
    shapes = np.array([a.shape for a in arrs], np.int64).reshape(n, nd)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([a.size for a in arrs], out=offsets[1:])
    values = np.concatenate([a.reshape(-1) for a in arrs]) if n else np.zeros(0, f.dtype)
    return Ragged(values.astype(f.dtype, copy=False), offsets, shapes)


def _as_ragged(v: Any, f: Field, where: str) -> Ragged:
    if isinstance(v, Ragged):
        if v.shapes.shape[1:] != (len(f.shape),):
            raise SchemaError(
                f"{where}: field {f.name!r} must have {len(f.shape)} dimensions per row, "
                f"got {v.shapes.shape[1]}",
                field=f.name,
            )
        for d, s in enumerate(f.shape):
            if s is not None and len(v) and (v.shapes[:, d] != s).any():
                raise SchemaError(
                    f"{where}: field {f.name!r} must have shape {f.shape} per row", field=f.name
                )
        return (
            Ragged(_cast(v.values, f, where), v.offsets, v.shapes)
            if v.values.dtype != f.dtype
            else v
        )
    if (
        isinstance(v, (np.ndarray, torch.Tensor))
        and v.dtype != object
        and len(v.shape) == len(f.shape) + 1
    ):
        a = _cast(_np(v), f, where)  # a regular batch: every row the same shape
        _check_fixed_dims(a.shape[1:], f, where)
        n = a.shape[0]
        per = int(np.prod(a.shape[1:], dtype=np.int64))
        return Ragged(
            np.ascontiguousarray(a).reshape(-1),
            np.arange(n + 1, dtype=np.int64) * per,
            np.tile(np.array(a.shape[1:], np.int64), (n, 1)),
        )
    return _ragged_from_arrays(list(v), f, where)


def _as_fixed(v: Any, f: Field, where: str) -> np.ndarray:
    a = _cast(_np(v), f, where)
    if a.shape[1:] != f.shape:
        raise SchemaError(
            f"{where}: field {f.name!r} must be (n, {', '.join(map(str, f.shape))}) for shape "
            f"{f.shape}, got {a.shape}",
            field=f.name,
        )
    return a


def _as_objects(v: Any, f: Field, where: str) -> np.ndarray:
    if isinstance(v, np.ndarray) and v.dtype == object:
        col = v
    else:
        vals = list(v)
        col = np.empty(len(vals), object)
        col[:] = vals
    want = str if f.dtype == STR else bytes
    for x in col:
        if not (isinstance(x, want) or (x is None and f.nullable)):
            raise SchemaError(
                f"{where}: field {f.name!r} holds {f.dtype} values, got {type(x).__name__}",
                field=f.name,
            )
    return col


def _conform_batch(b: Mapping, schema: Schema, where: str) -> dict:
    """A batch dict with exactly ``schema``'s fields (plus ``__null``), dtypes and shapes checked."""
    out: dict[str, Any] = {}
    n = None
    for f in schema:
        if f.name not in b:
            raise SchemaError(
                f"{where}: output lacks field {f.name!r}; declare removed fields in "
                f"TransformSpec(removed_fields=[...])",
                field=f.name,
            )
        v = b[f.name]
        if f.dtype in (STR, BYTES):
            v = _as_objects(v, f, where)
        elif f.is_variable:
            v = _as_ragged(v, f, where)
        else:
            v = _as_fixed(v, f, where)
        if n is None:
            n = len(v)
        elif len(v) != n:
            raise SchemaError(
                f"{where}: field {f.name!r} has {len(v)} rows, others have {n}", field=f.name
            )
        out[f.name] = v
        if f.nullable:
            nulls = b.get(f.name + NULL_KEY)
            if nulls is None:
                nulls = (
                    np.array([x is None for x in v], np.bool_)
                    if f.dtype in (STR, BYTES)
                    else np.zeros(n, np.bool_)
                )
            nulls = np.asarray(_np(nulls), np.bool_)
            if nulls.shape != (n,):
                raise SchemaError(
                    f"{where}: {f.name + NULL_KEY!r} must be bool ({n},), got {nulls.shape}",
                    field=f.name,
                )
            out[f.name + NULL_KEY] = nulls
    return out


def _conform_row(r: Mapping, schema: Schema, where: str) -> dict:
    """A row dict with exactly ``schema``'s fields: numbers as arrays of the field's dtype."""
    out: dict[str, Any] = {}
    for f in schema:
        if f.name not in r:
            raise SchemaError(
                f"{where}: output lacks field {f.name!r}; declare removed fields in "
                f"TransformSpec(removed_fields=[...])",
                field=f.name,
            )
        v = r[f.name]
        if v is None:
            if not f.nullable:
                raise SchemaError(
                    f"{where}: field {f.name!r} is None but not nullable", field=f.name
                )
        elif f.dtype in (STR, BYTES):
            want = str if f.dtype == STR else bytes
            if not isinstance(v, want):
                raise SchemaError(
                    f"{where}: field {f.name!r} holds {f.dtype}, got {type(v).__name__}",
                    field=f.name,
                )
        else:
            v = _cast(_np(v), f, where)
            _check_fixed_dims(v.shape, f, where)
        out[f.name] = v
    return out


def _row_of(b: Mapping, schema: Schema, i: int) -> dict:
    """Row ``i`` of a conformed batch, reader style (``None`` for nulls; no companions)."""
    row = {}
    for f in schema:
        v = b[f.name][i]
        if f.nullable and b[f.name + NULL_KEY][i]:
            v = None
        row[f.name] = v
    return row


def _columns_of(rows: Sequence[Mapping], schema: Schema) -> dict:
    """Conformed rows (numpy or torch values, ``None`` for nulls) -> a conformed batch."""
    n = len(rows)
    out: dict[str, Any] = {}
    for f in schema:
        vals = [r[f.name] for r in rows]
        nulls = np.fromiter((v is None for v in vals), np.bool_, n) if f.nullable else None
        if f.dtype in (STR, BYTES):
            col = np.empty(n, object)
            col[:] = vals
        elif f.is_variable:
            col = _ragged_from_arrays(vals, f, "rows")
        else:
            zero = np.zeros(f.shape, f.dtype)
            col = (
                np.stack([zero if v is None else _np(v) for v in vals])
                if n
                else np.zeros((0,) + f.shape, f.dtype)
            )
            col = col.astype(f.dtype, copy=False)
        out[f.name] = col
        if nulls is not None:
            out[f.name + NULL_KEY] = nulls
    return out


# -- collation ---------------------------------------------------------------------------------
class _Var:
    """A variable-shape field on its way to torch: flat values (a tensor, on the host or already
    on the device) and the row shapes; :meth:`finish` builds the nested tensor or list."""

    __slots__ = ("values", "offsets", "shapes", "kind", "tail", "jag_offsets")

    def __init__(self, r: Ragged, kind: str, field: Field):
        self.values = _tensor(r.values)
        self.offsets = r.offsets
        self.shapes = r.shapes
        self.kind = kind
        self.tail = tuple(field.shape[1:])
        self.jag_offsets = None
        if kind == "jagged":
            off = np.zeros(len(r) + 1, np.int64)
            np.cumsum(r.shapes[:, 0], out=off[1:])
            self.jag_offsets = torch.from_numpy(off)

    def moved(self, values: torch.Tensor, jag_offsets: torch.Tensor | None) -> _Var:
        v = object.__new__(_Var)
        v.values, v.offsets, v.shapes, v.kind, v.tail, v.jag_offsets = (
            values,
            self.offsets,
            self.shapes,
            self.kind,
            self.tail,
            jag_offsets,
        )
        return v

    def finish(self) -> Any:
        n = len(self.shapes)
        if self.kind == "jagged":
            lens = self.shapes[:, 0]
            values = self.values.view((int(lens.sum()),) + self.tail)
            if n == 0:
                return torch.nested.nested_tensor(
                    [], dtype=values.dtype, device=values.device, layout=torch.jagged
                )
            return torch.nested.nested_tensor_from_jagged(
                values, self.jag_offsets, min_seqlen=int(lens.min()), max_seqlen=int(lens.max())
            )
        off = self.offsets.tolist()
        views = [
            self.values[off[i] : off[i + 1]].view(s)
            for i, s in enumerate(map(tuple, self.shapes.tolist()))
        ]
        if self.kind == "list":
            return views
        return torch.nested.nested_tensor(views, dtype=self.values.dtype, device=self.values.device)


class _Collator:
    """Turns conformed batches (numpy, Ragged, object arrays) into dicts of torch values."""

    def __init__(self, schema: Schema, varlen: str | Mapping[str, str]):
        self.schema = schema
        self.modes = _resolve_varlen(varlen, schema)
        self._plan: list[tuple[str, str, Any]] = []
        for f in schema:
            if f.dtype in (STR, BYTES):
                self._plan.append((f.name, "objects", None))
            else:
                torch_dtype(f)  # raise early for dtypes this torch lacks
                if f.is_variable:
                    self._plan.append((f.name, self.modes[f.name], f))
                else:
                    self._plan.append((f.name, "dense", None))
            if f.nullable:
                self._plan.append((f.name + NULL_KEY, "dense", None))
        self.dense_only = all(kind == "dense" for _, kind, _ in self._plan)
        self.has_var = any(kind in ("jagged", "strided", "list") for _, kind, _ in self._plan)

    def __getstate__(self):
        return {"schema": self.schema.to_json(), "modes": self.modes}

    def __setstate__(self, state):
        modes = {
            k: ("nested" if m in ("jagged", "strided") else m) for k, m in state["modes"].items()
        }
        self.__init__(Schema.from_json(state["schema"]), modes)

    @staticmethod
    def dense(b: dict) -> dict:
        """The fast path (fixed-shape numeric fields only): one ``from_numpy`` view per array."""
        return {k: torch.from_numpy(v) for k, v in b.items()}

    def host(self, b: Mapping) -> dict:
        """Host tensors; variable fields in nested/list modes stay :class:`_Var` until finished."""
        out: dict[str, Any] = {}
        for key, kind, f in self._plan:
            v = b[key]
            if kind == "dense":
                out[key] = _tensor(v)
            elif kind == "objects":
                out[key] = v.tolist() if isinstance(v, np.ndarray) else list(v)
            elif kind == "padded":
                out[key] = torch.from_numpy(pad_ragged(v))
                out[key + SHAPE_KEY] = torch.from_numpy(
                    np.ascontiguousarray(v.shapes[:, list(f.variable_dims)])
                )
            else:
                out[key] = _Var(v, kind, f)
        return out

    @staticmethod
    def finish(out: dict) -> dict:
        for k, v in out.items():
            if isinstance(v, _Var):
                out[k] = v.finish()
        return out

    def to_torch(self, b: Mapping) -> dict:
        """A conformed batch as a dict of CPU tensors (and lists)."""
        out = self.host(b)
        return self.finish(out) if self.has_var else out

    def row(self, b: Mapping, i: int) -> Row:
        """Row ``i`` of a conformed batch as a :class:`Row` of tensors (``None`` for nulls)."""
        r = Row()
        for f in self.schema:
            v = b[f.name][i]
            if f.nullable and b[f.name + NULL_KEY][i]:
                v = None
            elif f.dtype not in (STR, BYTES):
                v = _tensor(np.asarray(v))
            r[f.name] = v
        r.collator = self
        return r

    def rows(self, rows: Sequence[Mapping]) -> dict:
        """Collate a list of rows (tensors, arrays, str/bytes, ``None``) into a batch."""
        return self.to_torch(_columns_of(rows, self.schema))


class Row(dict):
    """One row as a dict of tensors (``str``/``bytes`` as is, ``None`` for nulls), as
    :class:`Dataset` and row-mode :class:`IterableDataset` give it. It remembers how its dataset
    collates, so :func:`collate` turns a list of rows into the same batch layout as
    :meth:`Dataset.__getitems__` (``__null``/``__shape`` companions, varlen modes)."""

    __slots__ = ("collator",)


class RowBatch(Sequence):
    """The rows :meth:`Dataset.__getitems__` fetched for one DataLoader batch, kept as columns
    (numpy, owned by this object) until :func:`collate` turns them into tensors in one step.
    Indexing gives :class:`Row`\\ s, so ``default_collate`` still works (slowly)."""

    __slots__ = ("columns", "collator")

    def __init__(self, columns: dict, collator: _Collator):
        self.columns = columns
        self.collator = collator

    def __len__(self) -> int:
        name = self.collator.schema.names[0]
        return len(self.columns[name])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        return self.collator.row(self.columns, i)

    def collate(self) -> dict:
        return self.collator.to_torch(self.columns)


def collate(batch: Any) -> Any:
    """``collate_fn`` for rowstore datasets: ``DataLoader(ds, collate_fn=rowstore.torch.collate)``.

    A :class:`RowBatch` (from :meth:`Dataset.__getitems__`) becomes a dict of tensors in one
    step: ``torch.from_numpy`` views for fixed-shape fields, variable shapes per the dataset's
    ``varlen``, lists for ``str``/``bytes``, ``"<name>__null"`` for nullable fields. A list of
    :class:`Row`\\ s (row-mode :class:`IterableDataset`, or datasets without ``__getitems__``
    such as ``ConcatDataset``) gives the same layout. Anything else goes to torch's
    ``default_collate``.
    """
    if isinstance(batch, RowBatch):
        return batch.collate()
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], Row):
        collator = getattr(batch[0], "collator", None)  # unset on a Row rebuilt by torch
        if collator is not None:
            return collator.rows(batch)
    return _tud.default_collate(batch)


# -- helpers shared by the datasets and loaders ------------------------------------------------
def _open(path_or_reader: Any) -> tuple[Reader, bool]:
    if isinstance(path_or_reader, Reader):
        return path_or_reader, False
    if isinstance(path_or_reader, (str, os.PathLike)):
        return Reader(path_or_reader), True
    raise TypeError(f"expected a path or a rowstore Reader, got {type(path_or_reader).__name__}")


def _resolve_shard(shard: tuple[int, int] | None) -> tuple[int, int]:
    """``shard`` if given, else (rank, world size) of torch.distributed when initialized, else (0, 1)."""
    if shard is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    try:
        rank, world = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (rank, world), got {shard!r}") from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, got {shard!r}")
    return rank, world


def _shuffle_mode(shuffle: Any) -> str:
    if shuffle is True:
        return "block"
    if shuffle is False or shuffle is None:
        return "none"
    if shuffle not in _order.MODES:
        raise ValueError(f"shuffle must be one of {_order.MODES} (or True/False), got {shuffle!r}")
    return shuffle


def _check_batch_size(batch_size: Any, *, optional: bool = False) -> int | None:
    if batch_size is None and optional:
        return None
    if (
        not isinstance(batch_size, (int, np.integer))
        or isinstance(batch_size, bool)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return int(batch_size)


def _check_epoch(epoch: Any) -> int:
    if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
    return int(epoch)


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


# -- map-style and iterable datasets -----------------------------------------------------------
class Dataset(_tud.Dataset):
    """A map-style torch dataset over a rowstore file.

    Parameters
    ----------
    path_or_reader : str, os.PathLike or rowstore.reader.Reader
        A path (opened here) or an open :class:`~rowstore.reader.Reader`. Readers pickle by path
        and open their file descriptor lazily in each process, so either works with any
        ``num_workers``, ``persistent_workers``, and the ``fork``/``spawn``/``forkserver``
        start methods (no HDF5 handle is held open).
    fields : sequence of str, optional
        Fields to read (default: all).
    transform : callable or TransformSpec, optional
        Applied to each row (numpy values); see :class:`TransformSpec`.
    batch_transform : callable or TransformSpec, optional
        Applied to each fetched batch (after ``transform``), before collation.
    varlen : {"padded", "nested", "list"} or dict
        Collation of variable-shape fields, one mode for all or a dict per field (unlisted
        fields: ``"padded"``).

    Notes
    -----
    ``ds[i]`` is a :class:`Row` of tensors. ``DataLoader`` calls ``__getitems__`` with a whole
    batch of indices, which reads them with one :meth:`~rowstore.reader.Reader.take` (the
    kernels release the GIL); pass ``collate_fn=rowstore.torch.collate`` (also
    ``ds.collate_fn``) to turn it into tensors without a per-row loop. Works with any sampler,
    including ``DistributedSampler``. Collated tensors are views of arrays owned by the batch.
    """

    collate_fn = staticmethod(collate)

    def __init__(
        self,
        path_or_reader: Any,
        *,
        fields: Sequence[str] | None = None,
        transform: Any = None,
        batch_transform: Any = None,
        varlen: str | Mapping[str, str] = "padded",
    ):
        self.reader, _ = _open(path_or_reader)
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._row_tf, self._batch_tf), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform), _as_spec(batch_transform)]
        )
        self._collator = _Collator(self.output_schema, varlen)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Row:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"Dataset indices are ints, got {type(index).__name__}")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> RowBatch:
        """The rows at ``indices`` as one :class:`RowBatch` (one ``Reader.take``)."""
        b = self.reader.take(indices, fields=self._fields, varlen="ragged")
        return RowBatch(
            _process(b, self._row_tf, self._batch_tf, self.output_schema), self._collator
        )


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


class IterableDataset(_tud.IterableDataset):
    """An iterable torch dataset that splits each epoch over DDP ranks and DataLoader workers.

    Parameters
    ----------
    path_or_reader : str, os.PathLike or rowstore.reader.Reader
    batch_size : int, optional
        Yield whole collated batches of this many rows (use ``DataLoader(ds, batch_size=None)``);
        ``None`` yields :class:`Row`\\ s (use ``collate_fn=rowstore.torch.collate``).
    shuffle : {"block", "full", "none"} or bool
        Epoch order mode, see :mod:`rowstore.reader.order`.
    seed : int
        The order is a pure function of (seed, epoch, layout, shard).
    fields : sequence of str, optional
    shard : (rank, world), optional
        This process's rank and the world size. Default: ``torch.distributed``'s when it is
        initialized *when the dataset is created*, else (0, 1).
    even : bool
        Every (rank, worker) gets exactly ``len // (world * num_workers)`` rows (the rest of the
        epoch order is left out that epoch), so ranks stay in step.
    drop_last : bool
        With ``batch_size``: drop each worker's last partial batch.
    window : int
        Blocks mixed together in ``block`` mode.
    transform, batch_transform : callable or TransformSpec, optional
        Per-row and per-batch transforms (in row mode ``batch_transform`` sees chunks of
        ``512`` rows as read).
    varlen : {"padded", "nested", "list"} or dict
    num_threads : int, optional
        Reader threads per process (default: 1 inside a DataLoader worker, else the reader's).
    prefetch : int
        Segments each reader thread reads ahead.

    Notes
    -----
    Worker ``w`` of ``W`` on rank ``r`` of ``R`` reads shard ``(r * W + w, R * W)`` of the epoch
    order: the parts are disjoint and together hold every row exactly once. The epoch set by
    :meth:`set_epoch` lives in shared memory, so persistent workers see it at their next epoch.
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int | None = None,
        shuffle: Any = "block",
        seed: int = 0,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] | None = None,
        even: bool = False,
        drop_last: bool = False,
        window: int = 16,
        transform: Any = None,
        batch_transform: Any = None,
        varlen: str | Mapping[str, str] = "padded",
        num_threads: int | None = None,
        prefetch: int = 2,
    ):
        self.reader, _ = _open(path_or_reader)
        self.batch_size = _check_batch_size(batch_size, optional=True)
        self.shuffle = _shuffle_mode(shuffle)
        self.seed = seed
        self.window = window
        self.even = bool(even)
        self.drop_last = bool(drop_last)
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.shard = _resolve_shard(shard)
        _order.check_args(self.shuffle, seed, 0, window, *self.shard)
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._row_tf, self._batch_tf), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform), _as_spec(batch_transform)]
        )
        self._collator = _Collator(self.output_schema, varlen)
        # Shared memory: persistent DataLoader workers (fork or spawn) see set_epoch.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next iteration on (call before ``iter(loader)``)."""
        self._epoch[0] = _check_epoch(epoch)

    def worker_shard(self) -> tuple[int, int]:
        """The (index, count) shard this process reads: rank x DataLoader worker."""
        rank, world = self.shard
        info = _tud.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * nw + wid, world * nw

    def num_items(self, num_workers: int = 0) -> int:
        """Rows (or batches with ``batch_size``) this rank yields per epoch with ``num_workers``."""
        rank, world = self.shard
        nw = max(1, num_workers)
        total = 0
        for w in range(nw):
            s = (rank * nw + w, world * nw)
            if self.batch_size is None:
                total += self.reader.shard_size(shard=s, even=self.even)
            else:
                total += self.reader.num_batches(
                    self.batch_size, shard=s, even=self.even, drop_last=self.drop_last
                )
        return total

    def __iter__(self) -> Iterator[Any]:
        shard = self.worker_shard()
        threads = self.num_threads or (1 if _tud.get_worker_info() is not None else None)
        bs = self.batch_size
        it = self.reader.batches(
            bs or _ROW_READ_BATCH, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch, window=self.window,
            fields=self._fields, shard=shard, even=self.even, drop_last=self.drop_last if bs else False,
            num_threads=threads, prefetch=self.prefetch, varlen="ragged",
        )  # fmt: skip
        col = self._collator
        try:
            for b in it:
                b = _process(b, self._row_tf, self._batch_tf, self.output_schema)
                if bs is not None:
                    yield col.to_torch(b)
                else:
                    for i in range(len(b[self.output_schema.names[0]])):
                        yield col.row(b, i)
        finally:
            it.close()


# -- the CUDA path -----------------------------------------------------------------------------
class _Slot:
    """One pinned staging slot of the ring: a growable pinned byte buffer per batch key, and the
    event recorded after the copies out of it were enqueued."""

    __slots__ = ("bufs", "event")

    def __init__(self):
        self.bufs: dict[str, torch.Tensor] = {}
        self.event = None


class _CudaStage:
    """Copies host batches to a CUDA device on a side stream.

    With ``pin``, tensors are first copied into a ring of pinned buffers (reused across steps;
    a slot is refilled only after the event recorded behind its previous copies completed), so
    the host-to-device copies are truly asynchronous. Device tensors are allocated on the side
    stream; the consumer makes its stream wait for the batch's event and calls
    ``record_stream`` so the caching allocator does not reuse their memory too early.
    """

    def __init__(self, device: torch.device, *, pin: bool, slots: int):
        self.device = device
        self.stream = self._new_stream()
        self.slots = [_Slot() for _ in range(max(2, slots))] if pin else []
        self._next = 0

    # The CUDA calls, one method each (tests drive the pipeline with a CPU stand-in).
    def _new_stream(self) -> Any:
        return torch.cuda.Stream(device=self.device)

    def _new_event(self) -> Any:
        return torch.cuda.Event()

    def _on_side_stream(self) -> Any:
        return torch.cuda.stream(self.stream)

    def _pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def context(self) -> Any:
        """Entered by the producer thread: makes ``device`` its current device."""
        return torch.cuda.device(self.device)

    def receive(self, event: Any, fresh: list[torch.Tensor]) -> None:
        """Consumer side: the current stream waits for the batch's copies (no host sync), and
        the caching allocator learns that the current stream uses the new tensors."""
        cur = torch.cuda.current_stream(self.device)
        cur.wait_event(event)
        for t in fresh:
            t.record_stream(cur)

    def _h2d(self, slot: _Slot | None, key: str, t: torch.Tensor, fresh: list) -> torch.Tensor:
        if slot is not None:
            nbytes = t.numel() * t.element_size()
            buf = slot.bufs.get(key)
            if buf is None or buf.numel() < nbytes:
                buf = self._pinned(max(64, nbytes + nbytes // 4))
                slot.bufs[key] = buf
            staged = buf[:nbytes].view(t.dtype).view(t.shape)
            staged.copy_(t)
            t = staged
        d = self._to_device(t)
        fresh.append(d)
        return d

    def put(self, host: dict) -> tuple[dict, Any, list]:
        """Enqueue the copies of one host batch; returns (device batch, event, new tensors)."""
        slot = None
        if self.slots:
            slot = self.slots[self._next]
            self._next = (self._next + 1) % len(self.slots)
            if slot.event is not None:
                slot.event.synchronize()  # the copies out of this slot (a ring ago) are done
        fresh: list[torch.Tensor] = []
        out: dict[str, Any] = {}
        with self._on_side_stream():
            for k, v in host.items():
                if isinstance(v, torch.Tensor):
                    out[k] = self._h2d(slot, k, v, fresh)
                elif isinstance(v, _Var):
                    values = self._h2d(slot, k, v.values, fresh)
                    offs = (
                        self._h2d(slot, k + "#offsets", v.jag_offsets, fresh)
                        if v.jag_offsets is not None
                        else None
                    )
                    out[k] = v.moved(values, offs)
                else:
                    out[k] = v
            event = self._new_event()
            event.record(self.stream)
        if slot is not None:
            slot.event = event
        return out, event, fresh


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


_END = object()


def _to_device(out: dict, device: torch.device | None, pin: bool) -> dict:
    """Host path: pin (when asked, for a later copy by the user) or move to a non-CUDA device."""

    def move(t):
        if isinstance(t, torch.Tensor):
            if device is None or device.type == "cpu":
                return t.pin_memory() if pin and not t.is_nested else t
            return t.to(device, non_blocking=pin)
        if isinstance(t, list) and t and isinstance(t[0], torch.Tensor):
            return [move(x) for x in t]
        return t

    return {k: move(v) for k, v in out.items()}


# -- batched loaders ---------------------------------------------------------------------------
class _Loader:
    """What BatchedDataLoader and InMemBatchedDataLoader share: transforms and collation,
    the device path, epoch/position state, and iteration."""

    def __init__(
        self,
        path_or_reader,
        *,
        batch_size,
        fields,
        shard,
        device,
        pin_memory,
        transform,
        varlen,
        prefetch,
        drop_last,
        even,
    ):
        self.reader, self._owns_reader = _open(path_or_reader)
        self.batch_size = _check_batch_size(batch_size)
        self.shard = _resolve_shard(shard)
        self.even = bool(even)
        self.drop_last = bool(drop_last)
        self.prefetch = max(1, int(prefetch))
        self._fields = None if fields is None else list(fields)
        self.input_schema, (self._tf,), self.output_schema = _schemas(
            self.reader, fields, [_as_spec(transform)]
        )
        self._collator = _Collator(self.output_schema, varlen)
        self.device = self._resolve_device(device)
        self._cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = self._resolve_pin(pin_memory)
        self._stage: _CudaStage | None = None
        self._epoch = 0
        self._position = 0
        self._resume_pending = False
        self._running: tuple[int, int] | None = None
        # A weak reference: a loop that breaks drops the iterator, which then closes at once
        # (stopping its threads) instead of living in a loader <-> generator cycle until GC.
        self._active: weakref.ref | None = None
        if self._tf is None and self._collator.dense_only:
            self._convert: Callable[[dict], dict] = _Collator.dense
        else:
            self._convert = self._convert_general
        self._post = None
        if not self._cuda and (
            self._collator.has_var
            or self.pin_memory
            or (self.device is not None and self.device.type != "cpu")
        ):
            self._post = self._post_host

    # -- configuration -------------------------------------------------------------------------
    @staticmethod
    def _resolve_device(device) -> torch.device | None:
        if device is None:
            return None
        dev = torch.device(device)
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"device {str(device)!r} was asked for but CUDA is not available; "
                    f"use device=None or 'cpu'"
                )
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def _resolve_pin(self, pin_memory) -> bool:
        if pin_memory is None:
            return self._cuda
        if pin_memory and not torch.cuda.is_available():
            warnings.warn(
                "pin_memory=True but CUDA is not available: batches are not pinned", stacklevel=4
            )
            return False
        return bool(pin_memory)

    def _convert_general(self, b: dict) -> dict:
        if self._tf is not None:
            b = self._tf.batch(b)
        return self._collator.host(b)

    def _post_host(self, out: dict) -> dict:
        if self._collator.has_var:
            out = _Collator.finish(out)
        if self.pin_memory or (self.device is not None and self.device.type != "cpu"):
            out = _to_device(out, self.device, self.pin_memory)
        return out

    # -- epochs and state ------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration reads."""
        return self._epoch

    @property
    def position(self) -> int:
        """Rows of this epoch already handed out (to this rank)."""
        return self._position

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` from its start at the next iteration.

        Right after :meth:`load_state_dict`, calling it with the loaded epoch keeps the loaded
        position (so the usual ``for epoch in ...: loader.set_epoch(epoch)`` loop resumes).
        """
        epoch = _check_epoch(epoch)
        if self._resume_pending and epoch == self._epoch:
            return
        self._epoch, self._position, self._resume_pending = epoch, 0, False
        self._reset_run()

    def _reset_run(self) -> None:
        pass

    def _order_state(self) -> dict:
        return {"shard": list(self.shard), "even": self.even, "num_rows": len(self.reader)}

    def state_dict(self) -> dict:
        """Where this loader stands: epoch, rows handed out in it, and what the order depends
        on. Plain Python values (``torch.save`` / ``json`` friendly). Call it between batches
        (inside the loop is fine): it counts only batches already handed out, not prefetched."""
        return {
            "version": _STATE_VERSION,
            "kind": type(self).__name__,
            "epoch": self._epoch,
            "position": self._position,
            "batch_size": self.batch_size,
            **self._order_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration yields exactly the remaining rows
        of that epoch in the same order. Raises ``ValueError`` if the order would differ."""
        if state.get("version") != _STATE_VERSION or state.get("kind") != type(self).__name__:
            raise ValueError(
                f"not a {type(self).__name__} state (version {_STATE_VERSION}): "
                f"kind={state.get('kind')!r} version={state.get('version')!r}"
            )
        mine = self._order_state()
        for k, v in mine.items():
            got = state.get(k)
            if (list(got) if isinstance(got, tuple) else got) != v:
                raise ValueError(
                    f"cannot resume: the saved state has {k}={got!r}, this loader {v!r} "
                    f"(the epoch order would differ)"
                )
        self._close_active()
        self._epoch = _check_epoch(state["epoch"])
        self._position = int(state["position"])
        self._load_extra(state)
        self._resume_pending = True

    def _load_extra(self, state: Mapping[str, Any]) -> None:
        pass

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        self._close_active()
        gen = self._run()
        self._active = weakref.ref(gen)
        return gen

    def _source(self) -> Iterator[tuple[dict, tuple[int, int]]]:
        raise NotImplementedError

    def _end_state(self) -> tuple[int, int]:
        raise NotImplementedError

    def _run(self) -> Iterator[dict]:
        self._resume_pending = False
        self._running = (self._epoch, self._position)
        source = self._source()
        deliver = self._deliver_cuda(source) if self._cuda else None
        try:
            if deliver is not None:
                for out, st in deliver:
                    self._epoch, self._position = st
                    yield out
            else:
                convert, post = self._convert, self._post
                for b, st in source:
                    out = convert(b)
                    if post is not None:
                        out = post(out)
                    self._epoch, self._position = st
                    yield out
        finally:
            self._running = None
            if deliver is not None:
                deliver.close()  # stops and joins the producer thread before its source closes
            source.close()
        self._epoch, self._position = self._end_state()

    def _get_stage(self) -> _CudaStage:
        if self._stage is None:
            self._stage = _CudaStage(self.device, pin=self.pin_memory, slots=self.prefetch + 1)
        return self._stage

    def _deliver_cuda(self, source) -> Iterator[tuple[dict, tuple[int, int]]]:
        """A producer thread reads, transforms, collates, stages into pinned memory and enqueues
        the copies on the side stream, ``prefetch`` batches ahead; this consumer makes the
        current stream wait for each batch's copies."""
        stage = self._get_stage()
        convert = self._convert
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    pass
            return False

        def produce() -> None:
            try:
                with stage.context():
                    for b, st in source:
                        out, event, fresh = stage.put(convert(b))
                        if not put((out, event, fresh, st)):
                            return
                put(_END)
            except BaseException as exc:  # handed to the consumer, raised there
                put(_Failure(exc))

        worker = threading.Thread(target=produce, name="rowstore-h2d", daemon=True)
        worker.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                out, event, fresh, st = item
                stage.receive(event, fresh)
                if self._collator.has_var:
                    out = _Collator.finish(out)  # views/nested built on the consumer's stream
                yield out, st
        finally:
            stop.set()
            worker.join()

    def _close_active(self) -> None:
        gen = self._active() if self._active is not None else None
        self._active = None
        if gen is not None:
            gen.close()

    def close(self) -> None:
        """Stop any running iteration (and its threads); close the reader if this loader opened it."""
        self._close_active()
        if self._owns_reader:
            self.reader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BatchedDataLoader(_Loader):
    """Batches of torch tensors straight from the reader: the fast path (no ``DataLoader``).

    Parameters
    ----------
    path_or_reader : str, os.PathLike or rowstore.reader.Reader
    batch_size : int
    shuffle : {"block", "full", "none"} or bool
        Epoch order mode (True is "block"); see :mod:`rowstore.reader.order`.
    seed : int
    fields : sequence of str, optional
    shard : (rank, world), optional
        Default: torch.distributed's rank and world size when initialized, else (0, 1).
    device : str or torch.device, optional
        Where batches go. ``None``/``"cpu"``: CPU tensors that are ``torch.from_numpy`` views of
        arrays the reader handed over (nothing is copied). A CUDA device: see Notes.
    pin_memory : bool, optional
        Default True for a CUDA device. With ``device=None`` and CUDA present, True returns
        pinned CPU tensors. Without CUDA it warns and is ignored.
    transform : callable or TransformSpec, optional
        Applied to each batch (numpy) before collation; see :class:`TransformSpec`.
    drop_last : bool
        Drop this rank's last partial batch.
    window : int
        Blocks mixed together in "block" mode.
    num_threads : int, optional
        Reader threads (kernels and image decoders run without the GIL).
    prefetch : int
        Segments each reader thread reads ahead, and batches the CUDA path stages ahead.
    even : bool
        Every rank gets exactly ``len // world`` rows, so DDP ranks stay in step.
    varlen : {"padded", "nested", "list"} or dict

    Notes
    -----
    The epoch order is the reader's (a pure function of seed, epoch, layout and shard). One
    iteration yields the rest of the current epoch; when it completes, the loader moves to the
    next epoch, so ``for _ in range(n): for b in loader`` sees ``n`` different epochs.
    :meth:`set_epoch` picks an epoch explicitly. Breaking out of a loop and iterating again
    continues where it stopped; :meth:`state_dict`/:meth:`load_state_dict` do the same across
    processes.

    CUDA path: a producer thread reads (the reader prefetches on its own threads), transforms and
    collates each batch, copies it into a small ring of pinned buffers (``prefetch + 1`` slots,
    reused; a slot is refilled only once its previous copy completed) and enqueues the
    ``non_blocking`` copies on a side stream, ``prefetch`` batches ahead. The consumer's current
    stream waits on each batch's event (no host sync) and the device tensors are
    ``record_stream``-ed to it. Device tensors are fresh for each batch and owned by the caller.

    Use it as a context manager (``with BatchedDataLoader(...) as dl:``) or call :meth:`close`
    to stop threads and close a reader it opened.
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int,
        shuffle: Any = "block",
        seed: int = 0,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] | None = None,
        device: Any = None,
        pin_memory: bool | None = None,
        transform: Any = None,
        drop_last: bool = False,
        window: int = 16,
        num_threads: int | None = None,
        prefetch: int = 2,
        even: bool = False,
        varlen: str | Mapping[str, str] = "padded",
    ):
        super().__init__(
            path_or_reader,
            batch_size=batch_size,
            fields=fields,
            shard=shard,
            device=device,
            pin_memory=pin_memory,
            transform=transform,
            varlen=varlen,
            prefetch=prefetch,
            drop_last=drop_last,
            even=even,
        )
        self.shuffle = _shuffle_mode(shuffle)
        self.seed = seed
        self.window = window
        self.num_threads = num_threads
        _order.check_args(self.shuffle, seed, 0, window, *self.shard)

    def _order_state(self) -> dict:
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "window": self.window,
            **super()._order_state(),
        }

    @property
    def shard_size(self) -> int:
        """Rows this rank reads per epoch."""
        return self.reader.shard_size(shard=self.shard, even=self.even)

    def __len__(self) -> int:
        """Batches this rank yields in the current (running or next) iteration of this epoch."""
        start = self._running[1] if self._running is not None else self._position
        return self.reader.num_batches(
            self.batch_size, shard=self.shard, even=self.even, drop_last=self.drop_last, start=start
        )

    def _reader_batches(self, epoch: int, pos: int) -> Iterator[dict]:
        return self.reader.batches(
            self.batch_size, shuffle=self.shuffle, seed=self.seed, epoch=epoch, window=self.window,
            fields=self._fields, shard=self.shard, even=self.even, drop_last=self.drop_last,
            num_threads=self.num_threads, prefetch=self.prefetch, varlen="ragged", start=pos,
        )  # fmt: skip

    def _source(self):
        epoch, pos = self._epoch, self._position
        end, bs = self.shard_size, self.batch_size
        it = self._reader_batches(epoch, pos)
        try:
            for b in it:
                pos = min(pos + bs, end)
                yield b, (epoch, pos)
        finally:
            it.close()

    def __iter__(self) -> Iterator[dict]:
        if self._cuda or self._convert is not _Collator.dense or self._post is not None:
            return super().__iter__()
        self._close_active()
        gen = self._run_dense()
        self._active = weakref.ref(gen)
        return gen

    def _run_dense(self) -> Iterator[dict]:
        """The raw fast path (fixed-shape numeric fields, no transform, CPU): what
        :meth:`_run` does, with the per-batch work cut to one ``from_numpy`` per array."""
        self._resume_pending = False
        epoch, pos = self._epoch, self._position
        self._running = (epoch, pos)
        end, bs = self.shard_size, self.batch_size
        it = self._reader_batches(epoch, pos)
        from_numpy = torch.from_numpy
        try:
            for b in it:
                out = {k: from_numpy(v) for k, v in b.items()}
                pos += bs
                self._position = pos if pos < end else end
                yield out
        finally:
            self._running = None
            it.close()
        self._epoch, self._position = epoch + 1, 0

    def _end_state(self) -> tuple[int, int]:
        return self._epoch + 1, 0


def _ragged_take(r: Ragged, idx: np.ndarray) -> Ragged:
    lens = r.offsets[idx + 1] - r.offsets[idx]
    off = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    src = np.repeat(r.offsets[idx] - off[:-1], lens) + np.arange(int(off[-1]), dtype=np.int64)
    return Ragged(r.values[src], off, r.shapes[idx])


class InMemBatchedDataLoader(_Loader):
    """Read this rank's shard once into memory, then shuffle and batch it for many epochs.

    Parameters
    ----------
    path_or_reader : str, os.PathLike or rowstore.reader.Reader
    batch_size : int
    num_epochs : int, optional
        Epochs one iteration yields (``None``: endless, as in Petastorm).
    shuffle : bool
        Shuffle each epoch: a permutation that is a pure function of (seed, epoch).
    seed : int
    fields : sequence of str, optional
    shard : (rank, world), optional
        This rank holds rows ``[rank * N // world, (rank + 1) * N // world)`` of the file (with
        ``even``: ``N // world`` rows each); default from torch.distributed.
    device, pin_memory, transform, drop_last, varlen, prefetch
        As in :class:`BatchedDataLoader`; ``transform`` runs on every batch (augmentations
        differ per epoch).

    Notes
    -----
    Memory: the shard's decoded columns. Each batch is a gather (a copy) from them, owned by
    the caller. State (:meth:`state_dict`) is the epoch, the rows handed out in it, and the
    epoch at which the current run of ``num_epochs`` ends.
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int,
        num_epochs: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        fields: Sequence[str] | None = None,
        shard: tuple[int, int] | None = None,
        device: Any = None,
        pin_memory: bool | None = None,
        transform: Any = None,
        drop_last: bool = False,
        even: bool = False,
        varlen: str | Mapping[str, str] = "padded",
        prefetch: int = 2,
    ):
        super().__init__(
            path_or_reader,
            batch_size=batch_size,
            fields=fields,
            shard=shard,
            device=device,
            pin_memory=pin_memory,
            transform=transform,
            varlen=varlen,
            prefetch=prefetch,
            drop_last=drop_last,
            even=even,
        )
        if num_epochs is not None and (
            not isinstance(num_epochs, (int, np.integer)) or num_epochs < 1
        ):
            raise ValueError(f"num_epochs must be a positive int or None, got {num_epochs!r}")
        self.num_epochs = num_epochs
        self.shuffle = bool(shuffle)
        _order.check_args("block", seed, 0, 1, *self.shard)
        self.seed = seed
        self._stop_epoch: int | None = None
        lo, hi = _order.shard_bounds(len(self.reader), *self.shard, self.even)
        self._lo, self._n = lo, hi - lo
        self._cache = self.reader.take(
            np.arange(lo, hi, dtype=np.int64), fields=self._fields, varlen="ragged"
        )
        self._perm: tuple[int, np.ndarray] | None = None

    def _order_state(self) -> dict:
        return {"seed": self.seed, "shuffle": self.shuffle, **super()._order_state()}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "stop_epoch": self._stop_epoch}

    def _load_extra(self, state: Mapping[str, Any]) -> None:
        stop = state.get("stop_epoch")
        self._stop_epoch = None if stop is None else int(stop)

    def _reset_run(self) -> None:
        self._stop_epoch = None

    @property
    def num_rows(self) -> int:
        """Rows held in memory (this rank's shard)."""
        return self._n

    def _per_epoch(self, start: int = 0) -> int:
        n = max(0, self._n - start)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        """Batches the current (running or next) iteration yields in all its epochs."""
        if self.num_epochs is None:
            raise TypeError("an endless InMemBatchedDataLoader (num_epochs=None) has no length")
        epoch, pos = self._running if self._running is not None else (self._epoch, self._position)
        stop = self._stop_epoch if self._stop_epoch is not None else epoch + self.num_epochs
        if epoch >= stop:
            return 0
        return self._per_epoch(pos) + (stop - epoch - 1) * self._per_epoch()

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Row numbers (in the file) of ``epoch``'s order on this rank."""
        return self._lo + self._order(epoch)

    def _order(self, epoch: int) -> np.ndarray:
        if self._perm is not None and self._perm[0] == epoch:
            return self._perm[1]
        if self.shuffle:
            perm = _order.permutation(self._n, _order.seed64(self.seed, epoch, _INMEM_STREAM))
        else:
            perm = np.arange(self._n, dtype=np.int64)
        self._perm = (epoch, perm)
        return perm

    def _gather(self, idx: np.ndarray) -> dict:
        return {
            k: (_ragged_take(v, idx) if isinstance(v, Ragged) else v[idx])
            for k, v in self._cache.items()
        }

    def _source(self):
        if self._stop_epoch is None and self.num_epochs is not None:
            self._stop_epoch = self._epoch + self.num_epochs
        stop = self._stop_epoch
        epoch, pos = self._epoch, self._position
        bs, n = self.batch_size, self._n
        end = n - n % bs if self.drop_last else n
        if end == 0:
            return
        while stop is None or epoch < stop:
            order = self._order(epoch)
            while pos < end:
                idx = order[pos : pos + bs]
                pos += len(idx)
                yield self._gather(idx), (epoch, pos)
            epoch, pos = epoch + 1, 0

    def _end_state(self) -> tuple[int, int]:
        stop = self._stop_epoch if self._stop_epoch is not None else self._epoch + 1
        self._stop_epoch = None
        return stop, 0
