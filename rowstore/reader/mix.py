"""Weighted mixtures of datasets: :func:`mix` reads several datasets as one stream whose epoch
is dealt, resumed and checked like a single dataset's (:mod:`rowstore.reader.plan`).

An epoch of a mixture has ``L`` positions. Source ``k`` fills ``c_k = round(L * w_k)`` of them
(weights normalized); which positions is a permutation of that multiset, a pure function of
(seed, epoch), so every batch holds the weights' proportions on average (exactly
hypergeometric per batch). Source ``k``'s rows are its own epoch order, read in order: the
positions ``[lo, hi)`` of the mixture need one contiguous range of each source's order, so
reads keep each source's locality. Two explicit modes:

- ``replacement=False`` (exhaust the smallest): ``L`` is the largest length at which no source
  gives more rows than it has (the scarcest source, relative to its weight, is read whole);
  every row at most once per epoch.
- ``replacement=True``: ``L = epoch_rows`` (default: all sources' rows); a source that runs out
  starts another pass over itself in a new order (rows repeat; each pass holds each row once).

Source ``k``'s pass ``p`` of mixture epoch ``e`` uses source epoch ``e * 2**20 + p`` and seed
``seed64(seed, 0, MIX, k)``. A mixture can be written to a small JSON file (``kind:
"mixture"``, ``docs/format.md``) and opened again with :func:`mix`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from rowstore._check import nonneg_int, positive_int
from rowstore.errors import SchemaError
from rowstore.reader import order as _order
from rowstore.reader._segments import EpochRead, EpochReads, finish_varlen
from rowstore.reader.buffers import Ragged, concat_batches
from rowstore.reader.dataset import Reader, as_reader
from rowstore.reader.epochs import EpochSpec, no_decode, part_spec
from rowstore.reader.plan import ID_KEY, PAD_KEY, SOURCE_KEY
from rowstore.reader.view import mixture_html, mixture_text

__all__ = ["Mixture", "mix", "SOURCE_KEY"]

_MIX = 0x313  # key of the mixture's streams in order.seed64
_PASS = 1 << 20  # source epochs per mixture epoch (passes over a source in replacement mode)
_CKPT = 4096  # positions between stored prefix counts
_PIECE = 4096  # positions read at once


class _MixLayout:
    """What the loaders ask of a reader's layout: rows per block (the largest source's, for
    the default dealt unit) and heap bytes (the sources' bytes per row, for chunk sizes)."""

    def __init__(self, rows_per_block: int, heap_nbytes: int = 0):
        self.rows_per_block = rows_per_block
        self.heap_nbytes = heap_nbytes
        self.version = None


class _MixOrder:
    """One mixture epoch: each position's source, and prefix counts to map positions to rows."""

    def __init__(self, counts: np.ndarray, seed: int):
        src = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        from rowstore import kernels

        kernels.shuffle(src, seed)
        self.src = src.astype(np.int16)
        K = len(counts)
        ck = np.zeros((len(src) // _CKPT + 1, K), np.int64)
        for j in range(1, len(ck)):
            ck[j] = ck[j - 1] + np.bincount(self.src[(j - 1) * _CKPT : j * _CKPT], minlength=K)
        self._ck = ck

    def count(self, p: int) -> np.ndarray:
        """Positions before ``p`` taken by each source."""
        j = p // _CKPT
        return self._ck[j] + np.bincount(self.src[j * _CKPT : p], minlength=self._ck.shape[1])


class Mixture(EpochReads):
    """Several datasets read as one weighted stream (see the module). Made by :func:`mix`.

    It offers what the loaders use of a :class:`~rowstore.reader.Reader` (``deal``, ``plan``,
    ``schema``...), so ``rowstore.torch.BatchedDataLoader(mixture, ...)``,
    ``IterableDataset``, ``ElasticBatchSampler`` and ``rowstore.tf.Loader`` read it, with
    their resume, equal steps and shuffle guarantees. ``with_source=True`` adds ``"__source"``
    (int64, the source's index); ``with_ids`` gives ``"__id"`` as row numbers *within* each
    source.

    :meth:`batches` and :meth:`deal` take a reader's arguments and mean the same, but for
    three: ``seed`` is the sources' order seed (the mixture's own seed picks which source
    fills each position), ``window`` and ``pieces`` are each source's, and ``decode`` and
    ``keep`` are refused (ValueError): image ops and row subsets belong to the sources.
    """

    def __init__(
        self,
        sources: Sequence[Reader],
        weights: Sequence[float],
        *,
        seed: int = 0,
        replacement: bool = False,
        epoch_rows: int | None = None,
        with_source: bool = False,
        paths: Sequence[str] | None = None,
        owned: Sequence[bool] | None = None,
    ):
        if not sources:
            raise ValueError("a mixture needs at least one source")
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(sources),) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise ValueError(
                f"weights must be finite, >= 0 and not all 0, one per source; got {list(weights)}"
            )
        self.sources = list(sources)
        self.weights = w / w.sum()
        self.seed = nonneg_int("seed", seed)
        self.replacement = bool(replacement)
        self.with_source = bool(with_source)
        self._paths = list(paths) if paths is not None else [r.path for r in sources]
        self._owned = list(owned) if owned is not None else [False] * len(sources)
        first = self.sources[0].schema
        for i, r in enumerate(self.sources[1:], 1):
            if r.schema != first:
                raise SchemaError(
                    f"mixture source {i} ({r.path!r}) has schema {r.schema.names}, source 0 "
                    f"({self.sources[0].path!r}) {first.names}: sources must share one schema"
                )
        self.schema = first
        sizes = np.array([len(r) for r in self.sources], np.int64)
        self.sizes = sizes
        if self.replacement:
            L = positive_int("epoch_rows", epoch_rows, optional=True) or int(sizes.sum())
        else:
            if epoch_rows is not None:
                raise ValueError(
                    "epoch_rows is for replacement=True; without replacement the epoch ends when "
                    "the "
                    "scarcest source is read whole"
                )
            pos = self.weights > 0
            L = int(np.floor(np.min(sizes[pos] / self.weights[pos]) + 1e-9)) if pos.any() else 0
        self.counts = self._counts(L)
        if not self.replacement:
            while (self.counts > sizes).any():  # rounding up past a source's size
                L -= 1
                self.counts = self._counts(L)
        self.epoch_rows = int(self.counts.sum())
        heap = (
            sum(r.layout.heap_nbytes for r in self.sources)
            * self.epoch_rows
            // max(1, int(sizes.sum()))
        )
        self.layout = _MixLayout(max(r.layout.rows_per_block for r in self.sources), int(heap))
        self.num_threads = self.sources[0].num_threads
        self.varlen = self.sources[0].varlen
        self.path = f"mix({', '.join(self._paths)})"
        self._cache: tuple[int, int, _MixOrder] | None = None

    def _counts(self, L: int) -> np.ndarray:
        raw = self.weights * L
        c = np.floor(raw).astype(np.int64)
        short = L - int(c.sum())  # largest remainders first (ties by source index)
        if short > 0:
            c[np.argsort(-(raw - c), kind="stable")[:short]] += 1
        return c

    # -- what the loaders use of a Reader ----------------------------------------------------------
    def __len__(self) -> int:
        return self.epoch_rows

    @property
    def num_rows(self) -> int:
        return self.epoch_rows

    @property
    def fingerprint(self) -> str:
        """The mixture's identity, as a resume state names it (16 hex digits): a hash of its
        sources' :attr:`~rowstore.reader.Reader.fingerprint`\\ s, the rows each gives an epoch
        (the weights), its seed and replacement mode."""
        h = hashlib.blake2b(b"rowstore.mixture\0", digest_size=8)
        h.update(json.dumps([self.seed, self.replacement, self.counts.tolist()]).encode())
        for r in self.sources:
            h.update(r.fingerprint.encode())
        return h.hexdigest()

    def __repr__(self) -> str:
        return mixture_text(self)  # sources, weights and fields: one screen at most

    def _repr_html_(self) -> str:
        """The notebook view (:mod:`rowstore.reader.view`): sources, fields, each source's."""
        return mixture_html(self)

    def close(self) -> None:
        for r, own in zip(self.sources, self._owned):
            if own:
                r.close()

    def __enter__(self) -> Mixture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def keep_mask(self, rows: Any = None, predicate: Any = None, **_: Any) -> None:
        if rows is not None or predicate is not None:
            raise ValueError(
                "rows=/predicate= select rows of one dataset; subset each source of a mixture "
                "instead"
            )
        return None

    def _epoch_rows(self, keep: Any) -> int:
        if keep is not None:
            raise ValueError("row subsets of a mixture: subset each source instead")
        return self.epoch_rows

    def order_defaults(
        self, shuffle: str | bool = "block", window: int | None = None, pieces: int | None = None
    ) -> tuple[int, int]:
        """The ``(window, pieces)`` every source's order uses: as
        :meth:`Reader.order_defaults <rowstore.reader.Reader.order_defaults>`, with the
        pieces all sources take (the fewest of their defaults) and their fewest rows per
        block."""
        return self._order_defaults(_order.shuffle_mode(shuffle), window, pieces)

    def _order_defaults(
        self, shuffle: str, window: int | None, pieces: int | None
    ) -> tuple[int, int]:
        """:meth:`order_defaults` of a mode name."""
        own = [r._order_defaults(shuffle, None, None) for r in self.sources]
        auto = min((p for _, p in own), default=1)
        rpb = min((r.layout.rows_per_block for r in self.sources), default=1)
        return _order.resolve_order(shuffle, window, pieces, rpb, auto)

    def shuffle_quality(self, batch_size: int, **order_kwargs: Any) -> float:
        """The sources' shuffle qualities, weighted (a mixture batch draws from every source)."""
        spec = EpochSpec.make(**order_kwargs).resolve(self)
        order_kwargs = dict(order_kwargs, window=spec.window, pieces=spec.pieces)
        qs = [
            r.shuffle_quality(max(1, int(round(batch_size * w))), **order_kwargs) if w > 0 else 0.0
            for r, w in zip(self.sources, self.weights)
        ]
        return float(np.dot(qs, self.weights))

    def source_order(self, epoch: int) -> np.ndarray:
        """Each position's source in ``epoch`` (int16)."""
        return self._order(epoch).src

    def _order(self, epoch: int) -> _MixOrder:
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, 0, _MixOrder(self.counts, _order.seed64(self.seed, epoch, _MIX)))
        return self._cache[2]

    def _source_ids(self, k: int, a: int, b: int, orders: dict, spec: Any) -> np.ndarray:
        """Row ids of positions ``[a, b)`` of source ``k``'s stream (passes back to back);
        ``spec``: a resolved :class:`EpochSpec` or an :class:`EpochRead`."""
        n = int(self.sizes[k])
        out = []
        while a < b:
            p, off = divmod(a, n)
            key = (k, p)
            if key not in orders:
                orders[key] = self.sources[k].epoch(
                    shuffle=spec.shuffle,
                    seed=_order.seed64(spec.seed, 0, _MIX, k) >> 1,
                    epoch=spec.epoch * _PASS + p,
                    window=spec.window,
                    pieces=spec.pieces,
                )
            stop = min(b, (p + 1) * n)
            out.append(orders[key].ids(off, off + stop - a))
            a = stop
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def _cut(self, read: EpochRead) -> _MixCut:
        """How this mixture reads ``read`` (:class:`~rowstore.reader._segments.Cut`)."""
        return _MixCut(self, read)

    def epoch_order(
        self, *, part: tuple[int, int] | None = None, even: bool = False, **order: Any
    ) -> np.ndarray:
        """Each position's ``(source, row number within it)`` of :meth:`batches` with these
        arguments, as an ``(n, 2)`` int64 array."""
        spec, (rank, world) = part_spec("Mixture.epoch_order", None, part, order)
        spec = spec.resolve(self)
        lo, hi = _order.shard_bounds(self.epoch_rows, rank, world, even)
        mo, orders = self._order(spec.epoch), dict[Any, Any]()
        src = mo.src[lo:hi].astype(np.int64)
        first, last = mo.count(lo), mo.count(hi)
        out = np.zeros((hi - lo, 2), np.int64)
        out[:, 0] = src
        for k in range(len(self.sources)):
            if last[k] > first[k]:
                ids = self._source_ids(k, int(first[k]), int(last[k]), orders, spec)
                out[src == k, 1] = self.sources[k].layout.rows_of(ids)
        return out

    # -- a mixture file ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The mixture as a manifest (``kind: "mixture"``, see ``docs/format.md``)."""
        from rowstore.format import manifest

        return {
            "format": manifest.FORMAT_NAME,
            "format_version": manifest.FORMAT_VERSION,
            "kind": "mixture",
            "sources": [{"path": p, "weight": float(w)} for p, w in zip(self._paths, self.weights)],
            "seed": self.seed,
            "replacement": self.replacement,
            "epoch_rows": self.epoch_rows if self.replacement else None,
            "with_source": self.with_source,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_json` to ``path`` (source paths relative to its directory when they
        are inside it), atomically."""
        path = os.fspath(path)
        base = os.path.dirname(os.path.abspath(path))
        obj = self.to_json()
        for s in obj["sources"]:
            ap = os.path.abspath(s["path"])
            if ap.startswith(base + os.sep):
                s["path"] = os.path.relpath(ap, base)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)


class _MixCut:
    """A mixture's :class:`~rowstore.reader._segments.Cut` of one epoch read: pieces of at
    most ``_PIECE`` positions, each read from its sources (``Reader.read_ids``, on the
    sources' threads) and put back in the mixture's order."""

    threads = 1  # each piece is read on its sources' own threads

    def __init__(self, mix: Mixture, read: EpochRead):
        no_decode(read.where, read.spec)
        self.num_rows = mix._epoch_rows(read.keep)
        self._mix, self._read = mix, read
        self._mo = mix._order(read.epoch)
        self._plans = mix.sources[0]._select(read.fields)
        self._orders: dict = {}  # source orders, by (source, pass)

    def segments(self, lo: int, hi: int) -> Iterator[tuple[int, int, bool]]:
        return ((a, min(hi, a + _PIECE), False) for a in range(lo, hi, _PIECE))

    def padding(self, n: int) -> tuple[int, int, bool]:
        return 0, n, True

    def produce(self, item: tuple[int, int, bool]) -> dict:
        m, read, mo = self._mix, self._read, self._mo
        lo, hi, is_pad = item
        n = hi - lo
        if is_pad:  # padding repeats the epoch's first positions
            lo, hi = 0, min(n, m.epoch_rows)
        src = mo.src[lo:hi].astype(np.int64)
        first, last = mo.count(lo), mo.count(hi)
        got, got_src, got_ids = [], [], []
        for k in range(len(m.sources)):
            if last[k] > first[k]:
                ids = m._source_ids(k, int(first[k]), int(last[k]), self._orders, read)
                rk = m.sources[k]
                got.append(rk.read_ids(ids, fields=read.fields, num_threads=read.num_threads))
                got_src.append(np.full(len(ids), k, np.int64))
                got_ids.append(rk.layout.rows_of(ids))
        batch = concat_batches(got)
        # Concatenated source by source; position j is source s[j]'s next row.
        take = np.argsort(np.argsort(src, kind="stable"), kind="stable")
        take = take[np.arange(n) % len(src)] if is_pad else take
        out = {k: (v.take(take) if isinstance(v, Ragged) else v[take]) for k, v in batch.items()}
        if m.with_source:
            out[SOURCE_KEY] = np.concatenate(got_src)[take]
        if read.with_ids:
            out[ID_KEY] = np.concatenate(got_ids)[take]
        if read.pad:
            out[PAD_KEY] = np.full(n, is_pad, bool)
        return out

    def finish(self, batch: dict) -> dict:
        return finish_varlen(batch, self._plans, self._read.varlen)

    def fetch_ahead(self, segments: Any) -> Iterator[tuple[int, int, bool]]:
        return segments()


def _load(path: str) -> dict:
    from rowstore.errors import FormatError
    from rowstore.format import manifest

    try:
        with open(path) as f:
            obj = json.load(f)
    except ValueError as exc:
        raise FormatError(f"{path}: not a mixture manifest (JSON: {exc})", path=path) from None
    if (
        not isinstance(obj, dict)
        or obj.get("format") != manifest.FORMAT_NAME
        or obj.get("kind") != "mixture"
    ):
        raise FormatError(
            f"{path}: not a rowstore mixture manifest (format {manifest.FORMAT_NAME!r}, kind "
            f"'mixture')",
            path=path,
        )
    if obj.get("format_version") != manifest.FORMAT_VERSION:
        raise FormatError(
            f"{path}: mixture format_version {obj.get('format_version')!r}, this rowstore reads "
            f"{manifest.FORMAT_VERSION}",
            path=path,
        )
    srcs = obj.get("sources")
    if (
        not isinstance(srcs, list)
        or not srcs
        or not all(
            isinstance(s, dict)
            and isinstance(s.get("path"), str)
            and isinstance(s.get("weight"), (int, float))
            for s in srcs
        )
    ):
        raise FormatError(
            f"{path}: mixture sources must be a list of {{'path': str, 'weight': number}}",
            path=path,
        )
    base = os.path.dirname(os.path.abspath(path))
    obj["sources"] = [dict(s, path=os.path.join(base, s["path"])) for s in srcs]
    return obj


def _is_pair(entry: Any) -> bool:
    if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
        return False
    w = entry[1]
    return isinstance(w, (int, float, np.number)) and not isinstance(w, (bool, np.bool_))


def _pairs(sources: Any) -> list[tuple[Any, float]]:
    """A sequence of sources as (source, weight) pairs: every entry a (source, weight) pair,
    or every entry a bare source (equal weights)."""
    if not isinstance(sources, Sequence):
        raise TypeError(
            f"mix() takes a dict {{source: weight}}, a list of (source, weight) pairs, a list "
            f"of sources (equal weights) or a mixture manifest path; got {type(sources).__name__}"
        )
    entries = list(sources)
    paired = [_is_pair(e) for e in entries]
    if all(paired):
        return [(src, float(w)) for src, w in entries]
    if not any(paired):
        return [(src, 1.0) for src in entries]
    pair, bare = paired.index(True), paired.index(False)
    raise ValueError(
        f"mix() sources: entry {pair} is a (source, weight) pair but entry {bare} "
        f"({entries[bare]!r}) is a bare source; give every entry as (source, weight), or every "
        f"entry as a bare source (equal weights)"
    )


def mix(
    sources: Mapping[Any, float] | Sequence[tuple[Any, float]] | str | os.PathLike,
    *,
    seed: int = 0,
    replacement: bool = False,
    epoch_rows: int | None = None,
    with_source: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> Mixture:
    """A weighted :class:`Mixture` of datasets: ``rowstore.mix({"a": 0.7, "b": 0.3}, seed=0)``.

    Parameters
    ----------
    sources : dict {path_or_reader: weight}, list of (path_or_reader, weight), list of sources, or a
    path
        Datasets (paths, lists of paths, or open Readers) sharing one schema, with
        non-negative weights (normalized); a list of bare sources has equal weights, and a
        source listed twice is two sources (each with its own order, rows repeat); or a
        mixture manifest written by :meth:`Mixture.save`: the mixture as it was saved, its
        settings included (the other arguments must keep their defaults: ValueError).
    seed : int
        Which source fills each position (a pure function of seed and epoch; default 0).
    replacement : bool
        False (default): the epoch ends when the scarcest source (relative to its weight) is
        read whole, every row at most once. True: sources that run out start another pass.
    epoch_rows : int, optional
        With replacement: rows per epoch (default: all sources' rows).
    with_source : bool
        Add ``"__source"`` to batches (the source's index).
    storage_options : mapping, optional
        fsspec options for the sources given as URLs (as :func:`rowstore.open`'s; refused for
        local paths and for sources already open).
    """
    settings: dict[str, Any] = {
        "seed": seed,
        "replacement": replacement,
        "epoch_rows": epoch_rows,
        "with_source": with_source,
    }
    if isinstance(sources, (str, os.PathLike)):
        given = {k: v for k, v in settings.items() if v != _DEFAULTS[k]}
        if given:
            raise ValueError(
                f"mix(manifest): a mixture manifest holds its own settings; open it as saved, "
                f"without {sorted(given)}, or mix its sources with these settings"
            )
        saved = _load(os.fspath(sources))
        pairs: list[tuple[Any, float]] = [(s["path"], float(s["weight"])) for s in saved["sources"]]
        settings = {k: saved.get(k, v) for k, v in _DEFAULTS.items()}
    elif isinstance(sources, Mapping):
        pairs = list(sources.items())
    else:
        pairs = _pairs(sources)
    readers, owned, paths = [], [], []
    for src, _ in pairs:
        r, own = as_reader(src, storage_options)
        readers.append(r)
        owned.append(own)
        paths.append(r.path)
    return Mixture(readers, [float(w) for _, w in pairs], **settings, paths=paths, owned=owned)


#: The settings of :func:`mix` and :class:`Mixture` by default (a manifest saves all four).
_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "replacement": False,
    "epoch_rows": None,
    "with_source": False,
}
