"""Statistics of what was written, declared once: their stored form, how two of them merge, and
how a reader checks them (``docs/format.md``, "Statistics"; ``docs/stats.md`` for their use).

A writer keeps them while it packs rows (:mod:`rowstore.writer._stats`, no second pass); a file
stores them as the JSON attribute ``stats`` of ``/rowstore`` (so also in its v2/v3 footer's
header), and a dataset version as the key ``stats`` of its manifest: the merge of its shards'.
A file or version without them (written before, or whose statistics did not fit the bound) has
no statistics: ``Reader.stats()`` returns None.

The stored form (every number a JSON number; nothing here is NaN or infinite)::

    {"v": 1, "rows": 1000, "fields": {name: FIELD, ...}}

    FIELD = {
      "kind": "number" | "bool" | "time" | "str" | "bytes" | "encoded",
      "count": non-null values,            "nulls": null values,
      "elements": scalar elements counted (count times the elements of each value),
      "nan": NaN (NaT for times) elements, "inf": +-inf elements,
      "finite": elements in min/max/mean/m2,
      "min", "max": of those (ints as ints), "mean": their mean, "m2": sum of squared
        deviations from it (variance = m2 / finite; Chan et al.'s merge),
      "hist": {"exp": e, "base": b, "counts": [c0, c1, ...]}  bin i = [(b+i)*2**e, (b+i+1)*2**e),
      "values": {"top": [[value, count], ...], "other": n, "complete": bool},
      "lengths": FIELD  (bytes of str/bytes/encoded values, elements of variable arrays),
      "facts": {"kind": "image" | <a codec's stats_kind>, name: FIELD, ...},
    }

Absent keys are unknown (``hist``, ``values``, ``lengths``, ``facts``, and ``min`` through
``m2`` when nothing finite was seen).

Histograms use power-of-two bins aligned to multiples of their width, at most :data:`BINS` of
them: two histograms merge exactly (the finer one's bins fall whole into the coarser one's;
then the width doubles until the range fits :data:`BINS` bins), in any order, with the same
result. Integer fields never get bins narrower than 1.

``values`` lists the :data:`TOP` most frequent values of scalar integer, bool and str fields
(str values of at most :data:`MAX_VALUE_CHARS` characters); ``other`` counts the rest;
``complete`` says the list holds every value with its exact count. A writer counts exactly up
to :data:`MAX_TRACK` distinct values, then keeps the most frequent half; merged lists of
incomplete parts give lower bounds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rowstore.errors import FormatError

__all__ = [
    "STATS_VERSION",
    "BINS",
    "TOP",
    "MAX_TRACK",
    "MAX_VALUE_CHARS",
    "MAX_STATS_BYTES",
    "DatasetStats",
    "FieldStats",
    "merge_field",
    "merge_stats",
    "check_stats",
    "encode_stats",
    "decode_stats",
    "hist_merge",
    "close",
]

STATS_VERSION = 1
#: Most bins of a histogram.
BINS = 32
#: Values listed per field.
TOP = 24
#: Distinct values a writer counts exactly before it keeps only the most frequent half.
MAX_TRACK = 4096
#: Longest str value counted in ``values`` (longer ones count as ``other``).
MAX_VALUE_CHARS = 80
#: Largest stored statistics (JSON bytes): what one HDF5 attribute holds. Larger statistics are
#: shrunk (values lists, then histograms, then nested parts dropped) or, failing that, not
#: stored.
MAX_STATS_BYTES = 60 * 1024
#: Deepest nesting of FIELD objects (lengths, facts).
_MAX_DEPTH = 3
KINDS = ("number", "bool", "time", "str", "bytes", "encoded")
_NUM_KEYS = ("min", "max", "mean", "m2")


# -- merging -------------------------------------------------------------------------------------
def hist_merge(a: Mapping | None, b: Mapping | None) -> dict | None:
    """The merge of two stored histograms (None: unknown, or no finite values)."""
    if a is None:
        return None if b is None else dict(b)
    if b is None:
        return dict(a)
    e = max(a["exp"], b["exp"])
    bins: dict[int, int] = {}
    for h in (a, b):
        shift = e - h["exp"]
        for i, c in enumerate(h["counts"]):
            if c:
                k = (h["base"] + i) >> shift
                bins[k] = bins.get(k, 0) + c
    return _fit(bins, e)


def _fit(bins: dict[int, int], e: int) -> dict:
    """Bins (index -> count at width 2**e) widened until they span at most :data:`BINS`."""
    if not bins:
        return {"exp": e, "base": 0, "counts": []}
    lo, hi = min(bins), max(bins)
    while hi - lo + 1 > BINS:
        e += 1
        merged: dict[int, int] = {}
        for k, c in bins.items():
            merged[k >> 1] = merged.get(k >> 1, 0) + c
        bins, lo, hi = merged, lo >> 1, hi >> 1
    counts = [0] * (hi - lo + 1)
    for k, c in bins.items():
        counts[k - lo] += c
    return {"exp": e, "base": lo, "counts": counts}


def _values_merge(a: Mapping | None, b: Mapping | None) -> dict | None:
    if a is None or b is None:
        return None
    counts: dict[Any, int] = {}
    keyed: dict[Any, Any] = {}
    for part in (a, b):
        for v, c in part["top"]:
            k = (type(v) is bool, v)  # True and 1 are one dict key otherwise
            counts[k] = counts.get(k, 0) + c
            keyed[k] = v
    top = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0][1])))
    other = a["other"] + b["other"] + sum(c for _, c in top[TOP:])
    return {
        "top": [[keyed[k], c] for k, c in top[:TOP]],
        "other": other,
        "complete": bool(a["complete"] and b["complete"] and len(top) <= TOP),
    }


def merge_field(a: Mapping | None, b: Mapping | None) -> dict | None:
    """The statistics of two parts of one field together (stored form; None: unknown)."""
    if a is None or b is None:
        return None
    out: dict[str, Any] = {"kind": a["kind"]}
    for k in ("count", "nulls", "elements", "nan", "inf", "finite"):
        out[k] = a[k] + b[k]
    na, nb = a["finite"], b["finite"]
    if na and nb:
        n = na + nb
        d = b["mean"] - a["mean"]
        out["min"] = min(a["min"], b["min"])
        out["max"] = max(a["max"], b["max"])
        out["mean"] = a["mean"] + d * nb / n
        out["m2"] = a["m2"] + b["m2"] + d * d * na * nb / n
        if not math.isfinite(out["mean"]) or not math.isfinite(out["m2"]):
            out["mean"] = (a["mean"] * na + b["mean"] * nb) / n if math.isfinite(d) else 0.0
            out["m2"] = float(max(a["m2"], b["m2"]))
    elif na or nb:
        src = a if na else b
        out.update({k: src[k] for k in _NUM_KEYS})
    # a part without a histogram (values) but with finite elements (values) makes it unknown
    for k, fn, n in (("hist", hist_merge, "finite"), ("values", _values_merge, "count")):
        if k in a and k in b:
            out[k] = fn(a[k], b[k])
        elif k in a and not b[n]:
            out[k] = a[k]
        elif k in b and not a[n]:
            out[k] = b[k]
    if "lengths" in a and "lengths" in b:
        out["lengths"] = merge_field(a["lengths"], b["lengths"])
    elif "lengths" in a or "lengths" in b:
        only = a if "lengths" in a else b
        other = b if only is a else a
        if not other["count"]:
            out["lengths"] = only["lengths"]
    fa, fb = a.get("facts"), b.get("facts")
    if not a["count"] or not b["count"]:  # one side empty: the other's facts as they are
        if (fa if a["count"] else fb) is not None:
            out["facts"] = fa if a["count"] else fb
    elif fa is not None and fb is not None and fa.get("kind") == fb.get("kind"):
        facts: dict[str, Any] = {"kind": fa["kind"]}
        for name in fa.keys() & fb.keys() - {"kind"}:
            facts[name] = merge_field(fa[name], fb[name])
        out["facts"] = facts
    elif fa is not None or fb is not None:
        only, other = (a, b) if fa is not None else (b, a)
        if not other["count"]:
            out["facts"] = only["facts"]
    return out


def merge_stats(parts: Iterable[Mapping | None]) -> dict | None:
    """The statistics of several files or versions of one schema, rows in order (stored form);
    None if any part has none."""
    out: dict | None = None
    for p in parts:
        if p is None:
            return None
        if out is None:
            out = {"v": STATS_VERSION, "rows": p["rows"], "fields": dict(p["fields"])}
            continue
        if out["fields"].keys() != p["fields"].keys():
            return None
        out = {
            "v": STATS_VERSION,
            "rows": out["rows"] + p["rows"],
            "fields": {k: merge_field(v, p["fields"][k]) for k, v in out["fields"].items()},
        }
        if any(v is None for v in out["fields"].values()):
            return None
    return out


def close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    """Whether two stored statistics are equal up to the rounding of means and variances: what
    the same rows give when folded in other groups (written with ``write`` or ``write_batch``,
    in one go or appended). Everything else (counts, minima, maxima, bins, values) is exact."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        return all(
            math.isclose(a[k], b[k], rel_tol=rel, abs_tol=rel)
            if k in ("mean", "m2") and type(a[k]) is float and type(b[k]) is float
            else close(a[k], b[k], rel)
            for k in a
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


# -- storing and checking ------------------------------------------------------------------------
def _shrink(stats: dict, level: int) -> dict:
    def field(f: Mapping, depth: int) -> dict:
        g = dict(f)
        if level >= 1 and "values" in g:
            g["values"] = {
                "top": g["values"]["top"][:4],
                "other": g["values"]["other"] + sum(c for _, c in g["values"]["top"][4:]),
                "complete": g["values"]["complete"] and len(g["values"]["top"]) <= 4,
            }
        if level >= 2:
            g.pop("hist", None)
            g.pop("values", None)
        if level >= 3:
            g.pop("facts", None)
            g.pop("lengths", None)
        for k in ("lengths",):
            if k in g:
                g[k] = field(g[k], depth + 1)
        if "facts" in g:
            g["facts"] = {
                n: (v if n == "kind" else field(v, depth + 1)) for n, v in g["facts"].items()
            }
        return g

    return {**stats, "fields": {k: field(f, 0) for k, f in stats["fields"].items()}}


def encode_stats(stats: Mapping | None) -> str | None:
    """The JSON text stored for ``stats`` (stored form), shrunk to fit :data:`MAX_STATS_BYTES`;
    None when even the numbers alone do not fit (nothing is stored then)."""
    if stats is None:
        return None
    for level in range(4):
        text = json.dumps(_shrink(dict(stats), level) if level else stats, sort_keys=True)
        if len(text) <= MAX_STATS_BYTES:
            return text
    return None


def _bad(where: str, msg: str) -> FormatError:
    return FormatError(f"{where}: statistics: {msg}")


def _count(where: str, f: Mapping, key: str) -> int:
    v = f.get(key)
    if type(v) is not int or not 0 <= v < 1 << 63:
        raise _bad(where, f"{key!r} must be an int >= 0, got {v!r}")
    return v


def _number(where: str, v: Any, key: str) -> float | int:
    if type(v) not in (int, float) or (type(v) is float and not math.isfinite(v)):
        raise _bad(where, f"{key!r} must be a finite number, got {v!r}")
    if type(v) is int and not -(1 << 64) < v < 1 << 64:
        raise _bad(where, f"{key!r} = {v} is out of range")
    return v


def _check_field(where: str, f: Any, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise _bad(where, f"nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(f, dict):
        raise _bad(where, f"expected a JSON object, got {type(f).__name__}")
    if f.get("kind") not in KINDS:
        raise _bad(where, f"kind {f.get('kind')!r} is not one of {KINDS}")
    count, nulls = _count(where, f, "count"), _count(where, f, "nulls")
    elements, finite = _count(where, f, "elements"), _count(where, f, "finite")
    nan, inf = _count(where, f, "nan"), _count(where, f, "inf")
    del count, nulls
    if finite + nan + inf > elements:
        raise _bad(where, f"finite + nan + inf ({finite + nan + inf}) exceed elements ({elements})")
    present = [k for k in _NUM_KEYS if k in f]
    if finite and len(present) != len(_NUM_KEYS):
        raise _bad(where, f"{finite} finite elements but not all of {_NUM_KEYS}")
    for k in present:
        _number(where, f[k], k)
    if finite and not (f["min"] <= f["max"] and f["m2"] >= 0):
        raise _bad(where, "min > max or a negative m2")
    if "hist" in f:
        h = f["hist"]
        if not isinstance(h, dict) or set(h) != {"exp", "base", "counts"}:
            raise _bad(where, "'hist' must hold exactly exp, base and counts")
        if type(h["exp"]) is not int or not -1100 <= h["exp"] <= 1100:
            raise _bad(where, f"hist exp {h['exp']!r} is not an int in -1100..1100")
        if type(h["base"]) is not int or abs(h["base"]) >= 1 << 80:
            raise _bad(where, f"hist base {h['base']!r} is not a bounded int")
        c = h["counts"]
        if (
            not isinstance(c, list)
            or len(c) > BINS
            or not all(type(x) is int and 0 <= x < 1 << 63 for x in c)
        ):
            raise _bad(where, f"hist counts must be a list of at most {BINS} ints >= 0")
    if "values" in f:
        v = f["values"]
        if not isinstance(v, dict) or set(v) != {"top", "other", "complete"}:
            raise _bad(where, "'values' must hold exactly top, other and complete")
        _count(where, v, "other")
        if type(v["complete"]) is not bool:
            raise _bad(where, "values complete must be a bool")
        top = v["top"]
        if not isinstance(top, list) or len(top) > TOP:
            raise _bad(where, f"values top must be a list of at most {TOP} pairs")
        for pair in top:
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or type(pair[1]) is not int
                or pair[1] < 0
                or not (
                    type(pair[0]) in (int, bool)
                    or (type(pair[0]) is str and len(pair[0]) <= MAX_VALUE_CHARS)
                )
            ):
                raise _bad(where, f"values top entry {str(pair)[:80]!r} is not [value, count]")
    if "lengths" in f:
        _check_field(f"{where} lengths", f["lengths"], depth + 1)
    if "facts" in f:
        facts = f["facts"]
        if not isinstance(facts, dict) or not isinstance(facts.get("kind"), str):
            raise _bad(where, "'facts' must be an object with a str kind")
        if len(facts) > 17:
            raise _bad(where, "more than 16 facts")
        for name, sub in facts.items():
            if name != "kind":
                _check_field(f"{where} facts[{name[:40]!r}]", sub, depth + 1)


def check_stats(
    obj: Any, where: str, names: Iterable[str] | None = None, rows: int | None = None
) -> dict:
    """``obj`` (parsed JSON) checked as stored statistics of a file or version (``names``: its
    schema's fields, which the statistics must cover exactly; ``rows``: its rows, which they
    must count); :class:`FormatError` naming ``where`` and what is wrong."""
    if not isinstance(obj, dict):
        raise _bad(where, f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("v") != STATS_VERSION or type(obj.get("v")) is not int:
        raise _bad(where, f"version {obj.get('v')!r}, this rowstore reads {STATS_VERSION}")
    n = _count(where, obj, "rows")
    if rows is not None and n != rows:
        raise _bad(where, f"count {n} rows, the file or version has {rows}")
    fields = obj.get("fields")
    if not isinstance(fields, dict):
        raise _bad(where, "'fields' must be a JSON object")
    if names is not None and set(fields) != set(names):
        raise _bad(where, f"fields {sorted(fields)[:8]} do not match the schema's")
    for name, f in fields.items():
        _check_field(f"{where} field {name[:80]!r}", f, 0)
        if f["count"] + f["nulls"] != n:
            raise _bad(where, f"field {name[:80]!r} counts {f['count'] + f['nulls']} of {n} rows")
    return obj


def decode_stats(
    text: Any, where: str, names: Iterable[str] | None = None, rows: int | None = None
) -> dict:
    """Stored statistics from their JSON text (bounded by :data:`MAX_STATS_BYTES`), checked."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(where, "not UTF-8") from None
    if not isinstance(text, str):
        raise _bad(where, f"expected JSON text, got {type(text).__name__}")
    if len(text) > MAX_STATS_BYTES:
        raise _bad(where, f"{len(text)} bytes of JSON, more than {MAX_STATS_BYTES}")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _bad(where, f"not valid JSON ({type(exc).__name__})") from None
    return check_stats(obj, where, names, rows)


# -- the read-side view --------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldStats:
    """Statistics of one field (or of its values' lengths, or of one fact such as an image's
    height), as stored. Numbers over the *finite elements* of the non-null values: for an array
    field every element counts.

    Attributes
    ----------
    kind : str
        ``number``, ``bool``, ``time`` (counts of the field's unit since the epoch), ``str``,
        ``bytes`` or ``encoded`` (an image or audio codec's payloads).
    count, nulls : int
        Non-null and null values.
    elements, nan, inf : int
        Scalar elements of the non-null values; those NaN (NaT) and infinite.
    min, max, mean, var, std : float, int or None
        Over the finite elements (None when there are none or for str/bytes fields).
    histogram : (edges, counts) or None
        ``len(counts) + 1`` bin edges (power-of-two bins, ``docs/format.md``).
    values : (list of (value, count), other, complete) or None
        The most frequent values (integer, bool and str scalar fields).
    lengths : FieldStats or None
        Bytes of str/bytes/encoded values; elements of variable-shape arrays.
    images : dict or None
        ``{"height": FieldStats, "width": ..., "channels": ...}`` of an image field.
    audio : dict or None
        Facts of an audio codec (e.g. ``sample_rate``, ``duration``), as FieldStats.
    """

    raw: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:  # count, nulls, elements, nan, inf, finite
        if name in ("count", "nulls", "elements", "nan", "inf", "finite", "kind"):
            return self.raw[name]
        raise AttributeError(name)

    @property
    def min(self) -> Any:
        return self.raw.get("min")

    @property
    def max(self) -> Any:
        return self.raw.get("max")

    @property
    def mean(self) -> float | None:
        return self.raw.get("mean")

    @property
    def var(self) -> float | None:
        """Population variance (numpy's ``var``, ``ddof=0``) of the finite elements."""
        return self.raw["m2"] / self.raw["finite"] if self.raw.get("finite") else None

    @property
    def std(self) -> float | None:
        v = self.var
        return None if v is None else math.sqrt(v)

    @property
    def histogram(self) -> tuple[list[float], list[int]] | None:
        h = self.raw.get("hist")
        if h is None or not h["counts"]:
            return None
        e, b = h["exp"], h["base"]
        edges = [math.ldexp(float(b + i), e) for i in range(len(h["counts"]) + 1)]
        return edges, list(h["counts"])

    @property
    def values(self) -> tuple[list[tuple[Any, int]], int, bool] | None:
        v = self.raw.get("values")
        if v is None:
            return None
        return [(x, c) for x, c in v["top"]], v["other"], v["complete"]

    @property
    def lengths(self) -> FieldStats | None:
        sub = self.raw.get("lengths")
        return None if sub is None else FieldStats(sub)

    def _facts(self, kind: str) -> dict[str, FieldStats] | None:
        facts = self.raw.get("facts")
        if facts is None or facts["kind"] != kind:
            return None
        return {k: FieldStats(v) for k, v in facts.items() if k != "kind"}

    @property
    def images(self) -> dict[str, FieldStats] | None:
        return self._facts("image")

    @property
    def audio(self) -> dict[str, FieldStats] | None:
        return self._facts("audio")

    def to_dict(self) -> dict:
        """The stored form (JSON values)."""
        return json.loads(json.dumps(self.raw))


@dataclass(frozen=True)
class DatasetStats:
    """Statistics of a file or dataset version: ``rows`` and one :class:`FieldStats` per field
    (schema order)."""

    rows: int
    fields: dict[str, FieldStats]

    @classmethod
    def from_dict(
        cls, obj: Any, where: str = "statistics", names: Iterable[str] | None = None
    ) -> DatasetStats:
        """From the stored form (checked: :class:`FormatError` for a malformed one); ``names``:
        the schema's fields, in the order :attr:`fields` takes (stored: sorted by name)."""
        obj = check_stats(obj, where)
        fields = obj["fields"]
        order = [n for n in names if n in fields] if names is not None else list(fields)
        order += [n for n in fields if n not in order]
        return cls(obj["rows"], {k: FieldStats(fields[k]) for k in order})

    def to_dict(self) -> dict:
        """The stored form (JSON values; :meth:`from_dict` reads it back)."""
        return {
            "v": STATS_VERSION,
            "rows": self.rows,
            "fields": {k: f.to_dict() for k, f in self.fields.items()},
        }

    def __getitem__(self, name: str) -> FieldStats:
        return self.fields[name]
