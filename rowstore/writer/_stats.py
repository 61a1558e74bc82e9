"""Statistics kept while rows are written: per block, vectorized over the packed rows.

:class:`StatsKeeper` takes the writer's pending rows (the packer's structured buffer, whatever
path packed them: ``write``'s compiled one, ``write_batch``, ``write_raw``) and the heap bytes
their payloads are in, a run of rows at a time (the writer hands each run over once, before its
block is written or its heap bytes are cut into chunks), and folds them into running statistics
in the stored form of :mod:`rowstore.format.stats` (Chan's merge of means and variances; the
power-of-two histograms; exact value counts). No second pass over the data, nothing per row in
Python for numeric fields.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.errors import FormatError
from rowstore.format import spec
from rowstore.format import stats as fs
from rowstore.schema import BYTES, STR, Field, Schema

__all__ = ["StatsKeeper", "numbers"]


def _empty(kind: str) -> dict[str, Any]:
    return {"kind": kind, "count": 0, "nulls": 0, "elements": 0, "nan": 0, "inf": 0, "finite": 0}


def _exp_for(lo: float, hi: float, integer: bool) -> int:
    """The smallest bin exponent whose aligned bins cover ``[lo, hi]`` in at most ``fs.BINS``
    (the smallest, so that the bins do not depend on how rows were grouped: merged histograms
    widen to exactly the exponent of all their values together)."""
    floor_e = 0 if integer else -1074
    span = hi / 2 - lo / 2  # no overflow for the widest float range
    if span > 0:
        e = math.frexp(span)[1] + 1 - int(math.log2(fs.BINS)) - 2
    else:  # one value: the exponent of its last bit (so bin numbers stay exact integers)
        e = math.frexp(hi)[1] - 53 if hi else floor_e
    e = max(e, floor_e)
    while math.floor(math.ldexp(hi, -e)) - math.floor(math.ldexp(lo, -e)) + 1 > fs.BINS:
        e += 1
    return e


def numbers(x: np.ndarray, kind: str, *, integer: bool, hist: bool = True) -> dict[str, Any]:
    """Stored statistics of the elements ``x`` (1-D; floats may hold NaN and inf, times NaT)."""
    out = _empty(kind)
    out["elements"] = n = int(x.size)
    if not n:
        return out
    if x.dtype.kind == "c":
        return out  # complex: counted, not summarized
    if x.dtype.kind == "f":
        fin = np.isfinite(x)
        nfin = int(np.count_nonzero(fin))
        if nfin != n:
            out["nan"] = int(np.count_nonzero(np.isnan(x)))
            out["inf"] = n - nfin - out["nan"]
            x = x[fin]
    elif x.dtype.kind in "mM":
        x = x.view(np.int64)
        nat = x == np.iinfo(np.int64).min
        out["nan"] = int(np.count_nonzero(nat))
        if out["nan"]:
            x = x[~nat]
    elif x.dtype.kind == "b":
        x = x.view(np.uint8)
    if not x.size:
        return out
    out["finite"] = int(x.size)
    lo, hi = x.min(), x.max()
    xf = x if x.dtype == np.float64 else x.astype(np.float64)
    mean = float(xf.mean()) if integer or x.dtype != np.float64 else float(x.mean())
    if not math.isfinite(mean):  # float64 values near the limit: sum overflowed
        mean = float(np.mean(xf / 2.0) * 2.0)
    d = xf - mean
    with np.errstate(over="ignore", invalid="ignore"):
        m2 = float(np.einsum("i,i->", d, d))
    if not math.isfinite(m2):  # the sum of squares overflows a float64: the largest one
        m2 = float(np.finfo(np.float64).max)
    if integer:
        out["min"], out["max"] = int(lo), int(hi)
    else:
        out["min"], out["max"] = float(lo), float(hi)
    out["mean"], out["m2"] = mean, m2
    if hist:
        flo, fhi = float(lo), float(hi)
        e = _exp_for(flo, fhi, integer)
        base = math.floor(math.ldexp(flo, -e))
        nb = math.floor(math.ldexp(fhi, -e)) - base + 1
        if nb == 1:
            out["hist"] = {"exp": e, "base": int(base), "counts": [int(x.size)]}
        elif e >= -1022 and -(1 << 62) < base < 1 << 62:
            idx = np.floor(xf * math.ldexp(1.0, -e)).astype(np.int64)
            idx -= base
            counts = np.bincount(np.clip(idx, 0, nb - 1), minlength=nb)[:nb]
            out["hist"] = {"exp": e, "base": int(base), "counts": counts.tolist()}
    return out


#: dtypes the compiled kernel reads (others: numpy, :func:`numbers`).
_KERNEL_DTYPES = frozenset(
    np.dtype(t) for t in ("f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")
)
_NO_SKIP = np.zeros(0, np.uint8)
_NO_COUNTS = np.zeros(0, np.int64)


def column(
    x: np.ndarray,
    kind: str,
    *,
    integer: bool,
    skip: np.ndarray | None = None,
    values: _Values | None = None,
) -> dict[str, Any]:
    """Stored statistics of the elements of ``x`` (``(rows, elements per row)``, any strides:
    a field of the packed rows, read where it lies) without the rows whose ``skip`` is set;
    counts the values of an integer column into ``values``. Two passes of the compiled kernel
    (``_ext/_stats.pyx``); dtypes it does not read go through numpy (:func:`numbers`)."""
    if x.dtype.kind == "b":
        x = x.view(np.uint8)
    is_time = x.dtype.kind in "mM"
    if is_time:
        x = x.view(np.int64)
    if x.dtype.newbyteorder("=") not in _KERNEL_DTYPES or not x.dtype.isnative:
        flat = (x if skip is None else x[~skip.view(np.bool_)]).reshape(-1)
        out = numbers(flat, kind, integer=integer)
        if values is not None:
            values.add_array(flat)
        return out
    has_skip = skip is not None
    sk = skip.view(np.uint8) if skip is not None else _NO_SKIP
    got = None if has_skip else _first_pass(x, is_time)
    if got is None:  # nulls to leave out, NaN/inf/NaT present: the kernel's checking pass
        got = kernels.column_moments1(x, sk, has_skip, is_time)
    nan, inf, fin, lo, hi, total = got
    out = _empty(kind)
    rows = x.shape[0] - (int(np.count_nonzero(sk)) if has_skip else 0)
    out["elements"], out["nan"], out["inf"], out["finite"] = rows * x.shape[1], nan, inf, fin
    if not fin:
        return out
    mean = total / fin
    if not math.isfinite(mean):  # float64 values near the limit: the sum overflowed
        flat = (x if skip is None else x[~skip.view(np.bool_)]).reshape(-1)
        return numbers(flat, kind, integer=integer)
    flo, fhi = float(lo), float(hi)
    e = _exp_for(flo, fhi, integer)
    base = math.floor(math.ldexp(flo, -e))
    nb = math.floor(math.ldexp(fhi, -e)) - base + 1
    one = nb == 1  # one bin: counted here, not by the kernel
    if not one and (e < -1022 or not -(1 << 62) < base < (1 << 62) - fs.BINS):
        nb = 0  # bins beyond what the kernel numbers exactly (subnormal widths, uint64s near 2**64)
    bins = np.zeros(nb, np.int64) if nb and not one else _NO_COUNTS
    count_values = values is not None and not values.dropped and integer
    from_bins = count_values and e == 0
    vals = (
        np.zeros(int(hi) - int(lo) + 1, np.int64)
        if count_values and not from_bins and int(hi) - int(lo) < 4 * fs.MAX_TRACK
        else _NO_COUNTS
    )
    m2 = kernels.column_moments2(
        x,
        sk,
        has_skip,
        is_time,
        mean,
        math.ldexp(1.0, -e) if len(bins) else 1.0,
        base if len(bins) else 0,
        bins,
        _as_int64(int(lo)) if len(vals) else 0,
        vals,
        not nan and not inf,  # no NaN, infinity or NaT: the kernel's unchecked loop
    )
    if not math.isfinite(m2):  # values near the float64 limit: squares overflowed
        flat = (x if skip is None else x[~skip.view(np.bool_)]).reshape(-1)
        m2 = numbers(flat, kind, integer=integer, hist=False)["m2"]
    out["min"], out["max"] = (int(lo), int(hi)) if integer else (flo, fhi)
    out["mean"], out["m2"] = mean, m2
    if nb:
        out["hist"] = {"exp": e, "base": int(base), "counts": [fin] if one else bins.tolist()}
    if count_values:
        assert values is not None
        if from_bins:
            values.add_counts(np.array([fin]) if one else bins, base)
        elif len(vals):
            values.add_counts(vals, int(lo))
        else:
            values.add_array((x if skip is None else x[~skip.view(np.bool_)]).reshape(-1))
    return out


def _as_int64(v: int) -> int:
    """``v`` (an int64 or uint64 value) as the int64 of the same bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _first_pass(x: np.ndarray, is_time: bool) -> tuple | None:
    """:func:`kernels.column_moments1`'s result by one unchecked pass of the kernel, for a column
    with no NaN, infinity or NaT (its sum is finite, its minimum no NaT); None otherwise."""
    if not x.size:
        return None
    lo, hi, total = kernels.column_moments1_quick(x)
    if not math.isfinite(total) or (is_time and lo == np.iinfo(np.int64).min):
        return None  # NaN, infinity, NaT, or a sum past the float64 range: the checking pass
    return 0, 0, x.size, lo, hi, total


class _Values:
    """Exact counts of a field's values, dropped (unknown) past ``fs.MAX_TRACK`` distinct."""

    __slots__ = ("counts", "other", "dropped")

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}
        self.other = 0
        self.dropped = False

    def add_array(self, x: np.ndarray) -> None:
        if self.dropped or not x.size:
            return
        if x.dtype.kind == "b":
            x = x.view(np.uint8)
        lo, hi = int(x.min()), int(x.max())
        if hi - lo < 4 * fs.MAX_TRACK:
            shifted = (
                (x - np.uint64(lo)).astype(np.intp)
                if x.dtype == np.uint64
                else x.astype(np.intp) - lo
            )
            self.add_counts(np.bincount(shifted), lo)
            return
        else:
            u, cu = np.unique(x, return_counts=True)
            keys, cnt = u.tolist(), cu.tolist()
        self._add(keys, cnt)

    def add_counts(self, counts: np.ndarray, lo: int) -> None:
        """Add ``counts[k]`` of the value ``lo + k``."""
        if self.dropped:
            return
        nz = np.flatnonzero(counts)
        self._add([lo + k for k in nz.tolist()], counts[nz].tolist())

    def add_payloads(self, heap: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray) -> None:
        """Count the payloads ``[offsets, offsets + nbytes)`` of ``heap`` (str values) by their
        bytes, in place (the compiled kernel; it stops once past ``fs.MAX_TRACK``)."""
        if self.dropped or not len(offsets):
            return
        if not kernels.stats_count_payloads(heap, offsets, nbytes, self.counts, fs.MAX_TRACK):
            self.dropped = True
            self.counts = {}

    def _add(self, keys: list, cnt: list) -> None:
        if len(keys) > fs.MAX_TRACK:
            self.dropped = True
            self.counts = {}
            return
        counts = self.counts
        for k, c in zip(keys, cnt):
            counts[k] = counts.get(k, 0) + c
        if len(counts) > fs.MAX_TRACK:
            self.dropped = True
            self.counts = {}

    def stored(self, as_bool: bool, decode: bool) -> dict | None:
        if self.dropped:
            return None
        items = []
        for k, c in self.counts.items():
            if decode:
                try:
                    k = k.decode("utf-8")
                except UnicodeDecodeError:
                    self.other += c
                    continue
                if len(k) > fs.MAX_VALUE_CHARS:
                    self.other += c
                    continue
            items.append((bool(k) if as_bool else k, c))
        items.sort(key=lambda kc: (-kc[1], repr(kc[0])))
        return {
            "top": [[k, c] for k, c in items[: fs.TOP]],
            "other": self.other + sum(c for _, c in items[fs.TOP :]),
            "complete": self.other == 0 and len(items) <= fs.TOP,
        }


class _FieldKeeper:
    """Running statistics of one field."""

    def __init__(self, f: Field):
        self.f = f
        codec = f.codec_obj
        self.heap = not f.inline
        self.text = f.dtype in (STR, BYTES)
        if self.text:
            self.kind = "str" if f.dtype == STR else "bytes"
        elif not codec.raw_bytes:
            self.kind = "encoded"
        elif f.is_time:
            self.kind = "time"
        elif np.dtype(f.dtype).kind == "b":
            self.kind = "bool"
        else:
            self.kind = "number"
        self.facts_kind = codec.stats_kind
        dt = None if self.text else np.dtype(f.dtype)
        self.dtype = dt
        self.integer = dt is not None and (dt.kind in "iubmM")
        self.numeric = self.kind in ("number", "bool", "time")
        self.values = (
            _Values()
            if (f.dtype == STR or (self.numeric and self.kind != "time" and self.integer))
            and f.shape == ()
            else None
        )
        self.stats = _empty(self.kind)
        self.lengths: dict | None = _empty("number") if self.heap else None
        self.facts: dict[str, dict] = {}
        self.fact_values: dict[str, _Values] = {}

    def merge(self, part: dict) -> None:
        s = fs.merge_field(self.stats, part)
        assert s is not None
        self.stats = s

    def add(self, rows: np.ndarray, heap: np.ndarray | None, origin: int) -> None:
        f, n = self.f, len(rows)
        col = rows[f.name]
        nulls, null = 0, None
        if f.nullable:
            null = rows[f.name + spec.NULL_SUFFIX].view(np.bool_)
            nulls = int(np.count_nonzero(null))
            if nulls and self.heap:
                col = col[~null]
        count = n - nulls
        part = _empty(self.kind)
        if not self.heap:
            if self.numeric:
                part = column(
                    col.reshape(n, math.prod(f.shape)),
                    self.kind,
                    integer=self.integer,
                    skip=null if nulls else None,
                    values=self.values,
                )
            else:
                part["elements"] = count * max(1, math.prod(d or 1 for d in f.shape))
        else:
            part = self._heap(col, count, heap, origin)
        part["count"], part["nulls"] = count, nulls
        self.merge(part)

    def _shapes(self, col: np.ndarray) -> np.ndarray:
        """The full shape of each value (rows, ndim): the schema's with its variable dims."""
        f = self.f
        shape = np.array([d or 0 for d in f.shape], dtype=np.int64)
        out = np.broadcast_to(shape, (len(col), len(shape))).copy()
        if f.variable_dims:
            dims = col["shape"].reshape(len(col), len(f.variable_dims)).astype(np.int64)
            out[:, list(f.variable_dims)] = dims
        return out

    def _heap(self, col: np.ndarray, count: int, heap: np.ndarray | None, origin: int) -> dict:
        nbytes = col["nbytes"].astype(np.int64)
        offsets = col["offset"].astype(np.int64) - origin
        part = _empty(self.kind)
        shapes = self._shapes(col) if not self.text else None
        sizes = nbytes if shapes is None else shapes.prod(axis=1)
        part["elements"] = int(sizes.sum()) if self.numeric else count
        assert self.lengths is not None
        ln = column(sizes.reshape(-1, 1), "number", integer=True)
        ln["count"] = count
        self.lengths = fs.merge_field(self.lengths, ln)
        if self.numeric and heap is not None and count:
            data = _gather(heap, offsets, nbytes).view(self.dtype)
            part = column(data.reshape(-1, 1), self.kind, integer=self.integer)
        elif self.values is not None and heap is not None and count:
            short = nbytes <= 4 * fs.MAX_VALUE_CHARS
            self.values.other += int(count - np.count_nonzero(short))
            self.values.add_payloads(heap, offsets[short], nbytes[short])
        if self.facts_kind is not None and count:
            self._add_facts(col, shapes, heap, offsets, nbytes)
        return part

    def _add_facts(self, col, shapes, heap, offsets, nbytes) -> None:
        f, codec = self.f, self.f.codec_obj
        facts: dict[str, np.ndarray] = {}
        if self.facts_kind == "image":
            if shapes is None or shapes.shape[1] < 2:
                return
            facts["height"], facts["width"] = shapes[:, 0], shapes[:, 1]
            facts["channels"] = (
                shapes[:, 2] if shapes.shape[1] > 2 else np.ones(len(shapes), np.int64)
            )
        elif heap is not None:  # a codec's own facts (audio: sample rate, duration...)
            mv = memoryview(heap)
            try:
                rows = [
                    codec.value_facts(
                        mv[a : a + n], tuple(shapes[i]) if shapes is not None else (), f
                    )
                    or {}
                    for i, (a, n) in enumerate(zip(offsets.tolist(), nbytes.tolist()))
                ]
            finally:
                mv.release()
            for name in sorted({k for r in rows for k in r})[:16]:
                got = [r.get(name) for r in rows]
                integer = all(type(v) is int for v in got)
                facts[name] = np.array(
                    [np.nan if v is None else v for v in got],
                    dtype=np.int64 if integer else np.float64,
                )
        for name, x in facts.items():
            integer = x.dtype.kind in "iu"
            vals = self.fact_values.setdefault(name, _Values()) if integer else None
            part = column(x.reshape(-1, 1), "number", integer=integer, values=vals)
            part["count"] = len(x)
            prev = self.facts.get(name)
            merged = part if prev is None else fs.merge_field(prev, part)
            assert merged is not None  # (parts of one field always merge)
            self.facts[name] = merged

    def stored(self) -> dict:
        out = dict(self.stats)
        if self.values is not None:
            v = self.values.stored(self.kind == "bool", self.f.dtype == STR)
            if v is not None:
                out["values"] = v
        if self.lengths is not None:
            out["lengths"] = self.lengths
        if self.facts_kind is not None and (self.facts or not out["count"]):
            facts: dict[str, Any] = {"kind": self.facts_kind}
            for name, v in self.facts.items():
                vals = self.fact_values.get(name)
                got = vals.stored(False, False) if vals is not None else None
                facts[name] = v if got is None else {**v, "values": got}
            out["facts"] = facts
        return out


def _gather(heap: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """The bytes of the payloads ``[offsets, offsets + nbytes)`` of ``heap``, concatenated in
    row order (payloads of one field lie in row order, others' between them): one copy by the
    compiled kernel (bounds-checked)."""
    total = int(nbytes.sum())
    if not total:
        return heap[:0]
    out = np.empty(total, np.uint8)
    kernels.stats_gather(heap, offsets, nbytes, out)
    return out


class StatsKeeper:
    """Running statistics of the rows a writer stored (stored form: :meth:`stored`).

    ``start``: the stored statistics of rows already in the file (an append), None for a new
    file. An append to a file without statistics keeps none (:meth:`stored` is None)."""

    def __init__(self, schema: Schema, start: dict | None = None, *, known: bool = True):
        self.schema = schema
        self.rows = 0
        self.known = known
        self.start = start
        self.fields = [_FieldKeeper(f) for f in schema]

    def add(self, rows: np.ndarray, heap: Any, origin: int) -> None:
        """Fold in ``rows`` (packed, structured), whose heap payloads lie in ``heap`` (bytes
        from logical heap offset ``origin`` on)."""
        if not self.known or not len(rows):
            return
        h = np.frombuffer(heap, dtype=np.uint8) if heap is not None and len(heap) else None
        try:
            for k in self.fields:
                k.add(rows, h if h is not None else np.zeros(0, np.uint8), origin)
        finally:
            del h  # a bytearray cannot be resized while numpy views it
        self.rows += len(rows)

    def stored(self) -> dict | None:
        if not self.known:
            return None
        mine = {
            "v": fs.STATS_VERSION,
            "rows": self.rows,
            "fields": {k.f.name: k.stored() for k in self.fields},
        }
        out = mine if self.start is None else fs.merge_stats([self.start, mine])
        try:  # never write statistics a reader refuses: none instead
            rows = self.rows + (self.start["rows"] if self.start is not None else 0)
            return fs.check_stats(out, "written", [f.name for f in self.schema], rows)
        except FormatError:
            return None
