"""Petastorm's ``TransformSpec``: a function plus the schema change it makes, and the output
schema it gives an input schema. The loaders (``rowstore.torch``) and
:func:`rowstore.make_reader` apply it; this module only describes it (no torch here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rowstore.errors import SchemaError
from rowstore.schema import Field, Schema

__all__ = ["TransformSpec", "edit_field"]


def edit_field(name: str, numpy_dtype: Any, shape: tuple = (), nullable: bool = False) -> tuple:
    """Petastorm's helper: the ``(name, numpy_dtype, shape, nullable)`` tuple of an
    ``edit_fields`` entry."""
    return name, numpy_dtype, shape, nullable


def _as_field(spec: Any) -> Field:
    if isinstance(spec, Field):
        return spec
    if isinstance(spec, (tuple, list)) and 2 <= len(spec) <= 4:
        name, dtype, *rest = spec
        shape = rest[0] if rest else ()
        nullable = bool(rest[1]) if len(rest) > 1 else False
        return Field(name, dtype, () if shape is None else tuple(shape), nullable=nullable)
    raise TypeError(
        f"edit_fields entries are rowstore.Field or (name, dtype, shape[, nullable]) tuples, "
        f"got {spec!r}"
    )


def _names(arg: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError(f"{arg} is a list of field names, got the string {value!r}")
    names = tuple(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"{arg} holds field names (str), got {bad[0]!r}")
    return names


class TransformSpec:
    """A transform and the schema change it makes (Petastorm's ``TransformSpec``).

    Parameters
    ----------
    func : callable, optional
        ``func(x) -> dict``. Row transforms get a row dict (arrays, numpy scalars, str/bytes,
        ``None`` for nulls); batch transforms get the reader's batch dict (``ndarray`` for
        fixed-shape fields, :class:`~rowstore.reader.Ragged` for variable shapes, ``object``
        arrays for ``str``/``bytes``, ``"<name>__null"`` bool arrays for nullable fields). It
        may edit the dict in place (and return it or None) or return a new one; values may be
        numpy arrays, torch CPU tensors or Python values. Which of the two a consumer applies is
        its own: ``rowstore.make_reader`` and ``rowstore.torch.Dataset(transform=)`` per row
        (as Petastorm's ``make_reader``), ``rowstore.make_batch_reader`` and the batched
        loaders per batch (as Petastorm's ``make_batch_reader``).
    edit_fields : sequence of Field or (name, dtype, shape[, nullable]) tuples
        Fields the function adds or changes (dtype, shape or nullability); ``shape`` may hold
        ``None`` for a variable dimension (see :func:`edit_field`).
    removed_fields : sequence of str
        Input fields dropped from the output, whether or not the function dropped them (their
        ``__null`` companions go too). A name that is no input field is a
        :class:`~rowstore.errors.SchemaError` (Petastorm only warns).
    selected_fields : sequence of str, optional
        Keep only these output fields, in this order. Unlike Petastorm, it may be given
        together with ``removed_fields``.

    Notes
    -----
    The output schema (:meth:`output_schema`) is Petastorm's ``transform_schema``: the input
    fields less ``removed_fields``, each ``edit_fields`` entry replacing the field of its name
    (in place) or added after them, then ``selected_fields``. Batched loaders check outputs
    against it: a missing field or an undeclared new key raises
    :class:`~rowstore.errors.SchemaError` naming the field; dtypes are cast when the cast is of
    the same kind (or int to float), otherwise rejected; fixed dimensions must match.
    """

    def __init__(
        self,
        func: Callable[[dict], dict] | None = None,
        edit_fields: Sequence[Any] | None = None,
        removed_fields: Sequence[str] | None = None,
        selected_fields: Sequence[str] | None = None,
    ):
        if func is not None and not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
        self.func = func
        self.edit_fields = tuple(_as_field(f) for f in (edit_fields or ()))
        self.removed_fields = _names("removed_fields", removed_fields or ())
        self.selected_fields = (
            None if selected_fields is None else _names("selected_fields", selected_fields)
        )

    def __repr__(self) -> str:
        return (
            f"TransformSpec({getattr(self.func, '__name__', self.func)!r}, "
            f"edit_fields={[f.name for f in self.edit_fields]}, "
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


def as_spec(transform: Any, what: str = "transform") -> TransformSpec | None:
    """``transform`` as a :class:`TransformSpec`: None, a spec, a plain callable (a spec
    without schema change), or an object with Petastorm's attributes (``func``,
    ``edit_fields``, ``removed_fields``, ``selected_fields``: e.g. Petastorm's own class)."""
    if transform is None or isinstance(transform, TransformSpec):
        return transform
    if hasattr(transform, "func"):
        return TransformSpec(
            transform.func,
            edit_fields=getattr(transform, "edit_fields", None),
            removed_fields=getattr(transform, "removed_fields", None),
            selected_fields=getattr(transform, "selected_fields", None),
        )
    if callable(transform):
        return TransformSpec(transform)
    raise TypeError(f"{what} must be a callable or a TransformSpec, got {type(transform).__name__}")
