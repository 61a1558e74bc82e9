"""Collation: conformed batches (numpy, Ragged, object arrays) into dicts of tensors, the
:class:`Row` and :class:`RowBatch` the datasets hand out, and :func:`collate`."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data as _tud

from rowstore.reader.buffers import NULL_KEY, SHAPE_KEY, Ragged, offsets_from_lengths, pad_ragged
from rowstore.reader.plan import EXTRA_KEYS
from rowstore.schema import BYTES, STR, Field, Schema
from rowstore.torch._convert import _columns_of, _resolve_varlen, _tensor, torch_dtype


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
            self.jag_offsets = torch.from_numpy(offsets_from_lengths(r.shapes[:, 0]))

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


_EXTRA_KEYS = EXTRA_KEYS

#: Key suffix of the row offsets of a variable-shape field in ``varlen="ragged"`` mode: int64
#: ``(n + 1,)``, row ``i``'s elements are ``values[offsets[i]:offsets[i + 1]]``.
OFFSETS_KEY = "__offsets"


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
        # The fast path hands the reader's arrays to from_numpy: time fields need their int64 view
        # first.
        self.dense_only = all(kind == "dense" for _, kind, _ in self._plan) and not any(
            f.is_time for f in schema
        )
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
                out[key] = _tensor(pad_ragged(v))
                out[key + SHAPE_KEY] = torch.from_numpy(
                    np.ascontiguousarray(v.shapes[:, list(f.variable_dims)])
                )
            elif kind == "ragged":
                # The reader's own layout, no copy and no per-row step: the flat values, the
                # row offsets and the rows' variable dimensions (as "padded" gives them).
                out[key] = _tensor(v.values)
                out[key + OFFSETS_KEY] = _tensor(v.offsets)
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
        out = self.to_torch(_columns_of(rows, self.schema))
        for k in _EXTRA_KEYS:  # "__id" / "__pad" of row-mode IterableDataset rows
            if rows and k in rows[0]:
                out[k] = torch.stack([r[k] for r in rows])
        return out


class Row(dict):
    """One row as a dict of tensors (``str``/``bytes`` as is, ``None`` for nulls), as
    :class:`Dataset` and row-mode :class:`IterableDataset` give it. It remembers how its dataset
    collates, so :func:`collate` turns a list of rows into the same batch layout as
    :meth:`Dataset.__getitems__` (``__null``/``__shape`` companions, varlen modes)."""

    __slots__ = ("collator",)
    collator: _Collator


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

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        return self.collator.row(self.columns, i)

    def collate(self) -> dict:
        out = self.collator.to_torch(self.columns)
        for k in _EXTRA_KEYS:  # "__id" / "__pad" from an ElasticBatchSampler's indices
            if k in self.columns:
                out[k] = torch.from_numpy(np.asarray(self.columns[k]))
        return out


#: A batch a DataLoader worker hands to the main process goes by value (numpy arrays pickled
#: into the worker's result pipe) up to this many tensor bytes; above it, as torch sends it (each
#: tensor's storage moved into its own shared-memory segment, whose descriptor the main process
#: receives over a socket: about a millisecond per tensor, whatever its size).
SHIP_BYTES = 4 << 20


def _plain(v: Any) -> bool:
    return (
        isinstance(v, torch.Tensor)
        and v.layout == torch.strided
        and v.device.type == "cpu"
        and not v.requires_grad
        and not v.is_nested
    )


def _unship(items: list) -> dict:
    """The main process's side of :class:`_Shipped`: numpy arrays back into tensors (views)."""
    return {k: (torch.from_numpy(v) if t else v) for k, v, t in items}


class _Shipped(dict):
    """A collated batch built inside a DataLoader worker: a plain dict there, and pickled by
    value on its way to the main process (which gets a plain ``dict`` of tensors), unless its
    tensors hold more than :data:`SHIP_BYTES`. torch's own way (a shared-memory segment and a
    descriptor passed over a socket per tensor) costs far more than copying small batches."""

    __slots__ = ()

    def __copy__(self) -> _Shipped:  # default_convert copies a batch of an IterableDataset
        return _Shipped(self)

    def __reduce_ex__(self, protocol):
        items, nbytes = [], 0
        for k, v in self.items():
            if _plain(v):
                try:
                    a = v.numpy()
                except (TypeError, RuntimeError):  # a dtype numpy lacks: torch's way
                    return dict, (dict(self),)
                nbytes += a.nbytes
                items.append((k, a, True))
            else:
                items.append((k, v, False))
        if nbytes > SHIP_BYTES:
            return dict, (dict(self),)
        return _unship, (items,)


def _for_worker(out: dict) -> dict:
    """``out``, shipped by value when this is a DataLoader worker (see :class:`_Shipped`)."""
    return _Shipped(out) if _tud.get_worker_info() is not None else out


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
        return _for_worker(batch.collate())
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], Row):
        collator = getattr(batch[0], "collator", None)  # unset on a Row rebuilt by torch
        if collator is not None:
            return _for_worker(collator.rows(batch))
    return _tud.default_collate(batch)


def _cut_tensors(
    parts: Iterator[dict], batch_size: int, drop_last: bool = False
) -> Generator[dict, None, None]:
    """Batches of tensors cut from the reader's reads (dicts of fixed-shape numeric arrays, any
    number of rows each) as ``cut_batches`` cuts arrays, with one ``from_numpy`` per array of a
    read and one ``Tensor.split`` for all its whole batches: a torch tensor costs about as much
    to create as the reader spends on a small batch, and per-batch numpy views plus their
    ``from_numpy`` would cost half as much again. A batch straddling two reads is
    concatenated (a copy), as the reader does."""
    from_numpy = torch.from_numpy
    carry: list[dict] = []
    carry_n = 0

    def joined() -> dict:
        if len(carry) == 1:
            return carry[0]
        return {k: torch.cat([c[k] for c in carry]) for k in carry[0]}

    try:
        for part in parts:
            keys = list(part)
            cols = [from_numpy(part[k]) for k in keys]
            m = len(cols[0]) if cols else 0
            pos = 0
            if carry_n and m:
                pos = min(batch_size - carry_n, m)
                carry.append(dict(zip(keys, (c[:pos] for c in cols))))
                carry_n += pos
                if carry_n == batch_size:
                    yield joined()
                    carry, carry_n = [], 0
            whole = (m - pos) // batch_size
            if whole:
                end = pos + whole * batch_size
                for vals in zip(*[c[pos:end].split(batch_size) for c in cols]):
                    yield dict(zip(keys, vals))
                pos = end
            if pos < m:
                carry.append(dict(zip(keys, (c[pos:] for c in cols))))
                carry_n += m - pos
        if carry_n and not drop_last:
            yield joined()
    finally:
        close = getattr(parts, "close", None)
        if close is not None:
            close()
