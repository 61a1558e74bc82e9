"""The ``tf.data`` element signature of a rowstore schema, and the conversion of reader batches
to it (ragged and padded variable shapes, text, times as int64)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from rowstore.reader import Reader
from rowstore.reader._args import varlen_modes
from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY, Ragged, offsets_from_lengths, pad_ragged
from rowstore.reader.dataset import VARLEN_MODES
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = ["output_signature", "ragged_to_tf", "VARLEN_MODES"]

#: Key suffix of the per-row shapes that carry variable fields through unbatching (internal).
_ROWSHAPE_KEY = "__rowshape"


# -- signature --------------------------------------------------------------------------------
def _tensor_spec(spec) -> tf.TensorSpec:
    # Without a name: tf.data drops names in some transformations (unbatch), and an unnamed
    # spec compares equal to what the dataset reports in every mode.
    return tf.TensorSpec(spec.shape, spec.dtype)


def output_signature(
    schema: Schema | Reader,
    *,
    batch_size: int | None = None,
    drop_last: bool = False,
    fields: Sequence[str] | None = None,
    varlen: str | Mapping[str, str] = "ragged",
) -> dict[str, tf.TypeSpec]:
    """The ``element_spec`` of :func:`make_dataset` with these arguments.

    Parameters
    ----------
    schema : Schema or Reader
    batch_size : int, optional
        None: rows (no batch dimension). Otherwise a leading batch dimension, ``None`` unless
        ``drop_last`` (then ``batch_size``).
    fields : list of str, optional
        The selected fields (default: all).
    varlen : "ragged", "padded" or dict
        How batches hold variable-shape fields (ignored for rows, which are always dense).

    Returns
    -------
    dict
        Per field: a ``tf.TensorSpec`` (fixed shapes fully known; ``str``/``bytes`` as
        ``tf.string``), a ``tf.RaggedTensorSpec`` (variable shapes, batched, ``ragged``; ragged up
        to the last variable dimension, the fixed dimensions after it dense), or a padded
        ``tf.TensorSpec`` with ``None`` for variable dimensions plus ``"<name>__shape"`` (int64
        ``(batch, k)``, the k variable dimensions of each row). Each nullable field adds
        ``"<name>__null"`` (bool). ``datetime64``/``timedelta64`` fields are ``tf.int64`` (the
        count of the field's unit; NaT is the int64 minimum).
    """
    if isinstance(schema, Reader):
        schema = schema.schema
    schema = schema.select(fields)
    modes = varlen_modes(varlen, schema, modes=VARLEN_MODES, default="ragged")
    batch = None if batch_size is None else (batch_size if drop_last else -1)
    lead: tuple[int | None, ...] = () if batch is None else (None if batch < 0 else batch,)
    sig: dict[str, tf.TypeSpec] = {}
    for f in schema:
        if f.is_variable and batch is not None and modes[f.name] == "ragged":
            sig[f.name] = f.tf_spec(batch, ragged=True)
        else:
            sig[f.name] = _tensor_spec(f.tf_spec(batch, ragged=False))
            if f.is_variable and batch is not None:
                sig[f.name + SHAPE_KEY] = tf.TensorSpec(lead + (len(f.variable_dims),), tf.int64)
        if f.nullable:
            sig[f.name + NULL_KEY] = tf.TensorSpec(lead, tf.bool)
    return sig


# -- conversion of reader batches ------------------------------------------------------------
def ragged_to_tf(r: Ragged, field: Field) -> tf.RaggedTensor:
    """A rowstore :class:`~rowstore.reader.Ragged` batch of ``field`` as a ``tf.RaggedTensor``.

    Built from ``values`` and per-level row splits (vectorised numpy, no loop over rows): ragged
    up to the field's last variable dimension, fixed dimensions between variable ones as
    uniform row lengths, fixed dimensions after the last variable one dense in ``flat_values``.
    The result matches ``field.tf_spec(-1)``. The values buffer is handed to TensorFlow (the
    Ragged must not be modified afterwards).
    """
    flat, levels = _ragged_parts(r, field)
    return _ragged_from_parts(flat, levels, field)


def _ragged_parts(r: Ragged, field: Field) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The numpy parts of :func:`ragged_to_tf`: the flat values (``(-1, *inner)``: the fixed
    dimensions after the last variable one) and, per dimension up to the last variable one,
    its row splits (variable) or its number of rows (fixed, an int64 scalar)."""
    shape = field.shape
    last = max(field.variable_dims)
    inner = tuple(int(d) for d in shape[last + 1 :])
    n = len(r)
    shapes = r.shapes
    flat = r.values.reshape((-1,) + inner)
    levels: list[Any] = []  # row splits (ndarray), or a fixed dimension (np.int64)
    counts = np.ones(n, np.int64)
    for j in range(last + 1):
        nrows = int(counts.sum())
        if shape[j] is None:
            if j == 0 and not inner and last == 0:
                splits = r.offsets  # 1-D field: element offsets are the row splits
            else:
                splits = offsets_from_lengths(
                    np.repeat(shapes[:, j], counts) if j else shapes[:, 0]
                )
            levels.append(np.asarray(splits, np.int64))
        else:
            levels.append(np.int64(nrows))
        counts = counts * shapes[:, j]
    return flat, tuple(levels)


def _ragged_from_parts(flat: Any, levels: Sequence[Any], field: Field) -> tf.RaggedTensor:
    """The ``tf.RaggedTensor`` of :func:`_ragged_parts`' parts (numpy arrays, or tensors in a
    ``tf.data`` map function: the assembly then runs in the graph)."""
    rt: Any = flat
    for d, level in zip(reversed(field.shape[: len(levels)]), reversed(list(levels))):
        if d is None:
            rt = tf.RaggedTensor.from_row_splits(rt, level, validate=False)
        else:
            rt = tf.RaggedTensor.from_uniform_row_length(rt, int(d), nrows=level, validate=False)
    return rt


def _parts_signature(field: Field) -> tuple[tf.TensorSpec, tuple[tf.TensorSpec, ...]]:
    """The ``tf.data`` signature of :func:`_ragged_parts`' parts of ``field``."""
    last = max(field.variable_dims)
    inner = tuple(int(d) for d in field.shape[last + 1 :])
    dtype = field.tf_spec(-1, ragged=True).dtype
    flat = tf.TensorSpec((None,) + inner, dtype)
    levels = tuple(
        tf.TensorSpec((None,) if d is None else (), tf.int64) for d in field.shape[: last + 1]
    )
    return flat, levels


def _int64_view(v: Any) -> Any:
    """A datetime64/timedelta64 array (or Ragged of them) as int64 counts of its unit."""
    if isinstance(v, Ragged):
        return Ragged(
            v.values.view(np.dtype(np.int64).newbyteorder(v.values.dtype.byteorder)),
            v.offsets,
            v.shapes,
        )
    return v.view(np.dtype(np.int64).newbyteorder(v.dtype.byteorder))


class _BatchConverter:
    """Turns reader batch dicts into what the generators yield (see ``_Pipeline``).

    With ``parts``, a ragged (or padded) batch field is yielded as its numpy parts
    (:func:`_ragged_parts`, a tuple) rather than a ``tf.RaggedTensor`` made in Python:
    :meth:`signature` is then the generator's signature and :meth:`assemble` a ``tf.data``
    map function that builds the ragged tensors in the graph. A RaggedTensor made eagerly in
    the generator and handed to ``from_generator`` costs several times what the reader spends
    on the batch (eager ops, then its encoding into a variant and back); plain arrays cross
    as they are."""

    def __init__(
        self,
        schema: Schema,
        modes: dict[str, str],
        rows: bool,
        parts: bool = False,
        pad: bool = False,
    ):
        self.parts = parts
        self.plan = []
        for f in schema:
            if f.dtype in (STR, BYTES):
                kind = "text"
            elif f.is_variable:
                kind = "rows" if rows else modes[f.name]
                if kind == "padded" and pad:
                    kind = "pad"  # padded here (each yielded batch is a batch handed out)
            else:
                kind = "dense"
            self.plan.append((f, kind))
        #: Whether :meth:`assemble` has ragged fields to build.
        self.assembles = parts and any(k in ("ragged", "padded") for _, k in self.plan)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f, kind in self.plan:
            name = f.name
            v = batch[name]
            if f.is_time:  # tf has no datetime dtype: int64 counts of the field's unit (views)
                v = _int64_view(v)
            if kind == "text":
                if f.nullable:
                    # The reader gives None for nulls; "<name>__null" says which rows they were.
                    v[batch[name + NULL_KEY]] = "" if f.dtype == STR else b""
            elif kind == "ragged":
                v = _ragged_parts(v, f) if self.parts else ragged_to_tf(v, f)
            elif kind == "padded":
                # Ragged plus the variable dimensions; padded in the graph after rebatching.
                out[name + SHAPE_KEY] = v.shapes[:, list(f.variable_dims)]
                v = _ragged_parts(v, f) if self.parts else ragged_to_tf(v, f)
            elif kind == "pad":
                # Padded as Reader(varlen="padded") pads (numpy, the batch's largest shape).
                out[name + SHAPE_KEY] = v.shapes[:, list(f.variable_dims)]
                v = pad_ragged(v)
            elif kind == "rows":
                # Rows: each row's elements flat (one ragged level) plus its full shape; the
                # dataset reshapes each row after unbatching (exact even for empty rows).
                out[name + _ROWSHAPE_KEY] = v.shapes
                v = tf.RaggedTensor.from_row_splits(v.values, v.offsets, validate=False)
            out[name] = v
            if f.nullable:
                out[name + NULL_KEY] = batch[name + NULL_KEY]
        return out

    def signature(self, sig: dict[str, tf.TypeSpec]) -> dict[str, Any]:
        """``sig`` (the batches' signature) with the ragged fields as their parts' specs."""
        out: dict[str, Any] = dict(sig)
        for f, kind in self.plan:
            if kind in ("ragged", "padded"):
                out[f.name] = _parts_signature(f)
        return out

    def assemble(self, el: dict) -> dict:
        """A ``tf.data`` map function: the ragged fields built from their parts (graph ops)."""
        el = dict(el)
        for f, kind in self.plan:
            if kind in ("ragged", "padded"):
                flat, levels = el[f.name]
                el[f.name] = _ragged_from_parts(flat, levels, f)
        return el


def _pad_fn(fields: list[Field]) -> Callable[[dict], dict]:
    """A tf.data map function padding ragged ``fields`` to each batch's largest shape."""

    def pad(el: dict) -> dict:
        el = dict(el)
        for f in fields:
            var = el[f.name + SHAPE_KEY]
            # Largest variable dimensions of the batch (0 for an empty batch), as
            # Reader(varlen="padded") pads; fixed dimensions as declared.
            maxs = tf.maximum(tf.reduce_max(var, axis=0), 0)
            size = [tf.shape(var, out_type=tf.int64)[0]]
            vi = 0
            for d in f.shape:
                if d is None:
                    size.append(maxs[vi])
                    vi += 1
                else:
                    size.append(tf.constant(d, tf.int64))
            dense = el[f.name].to_tensor(shape=tf.stack(size))
            el[f.name] = tf.ensure_shape(dense, (None,) + tuple(f.shape))
        return el

    return pad


def _reshape_rows_fn(fields: list[Field]) -> Callable[[dict], dict]:
    """A tf.data map function giving unbatched rows of variable ``fields`` their own shape."""

    def reshape(el: dict) -> dict:
        el = dict(el)
        for f in fields:
            shape = el.pop(f.name + _ROWSHAPE_KEY)
            el[f.name] = tf.ensure_shape(tf.reshape(el[f.name], shape), f.shape)
        return el

    return reshape
