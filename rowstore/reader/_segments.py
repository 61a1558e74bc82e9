"""The one read of an epoch: its arguments resolved once, the consumer's position ranges, and
the read→cut pipeline that :class:`~rowstore.reader.Reader` and
:class:`~rowstore.reader.mix.Mixture` both go through.

``batches`` (a contiguous ``part`` of the epoch) and ``deal`` (a consumer's dealt ``shard``)
differ only in which positions of the epoch order they read. Both are written once here, in
:class:`EpochReads`, which a reader and a mixture inherit:

1. :func:`resolve` turns the keywords into one :class:`EpochRead` (the order's mode, seed,
   window and pieces, the batch size, threads, fields...): each argument checked once, the
   defaults decided once.
2. The source makes a :class:`Cut` for it (``_cut``): its epoch order and how it reads a
   segment of it.
3. :func:`part_spans` or :func:`dealt_spans` give the position ranges the consumer reads.
4. :func:`read_epoch` cuts the ranges into the source's segments, reads them ahead on its
   threads and cuts the reads into batches (:mod:`rowstore.reader._stream`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from rowstore._check import nonneg_int, positive_int
from rowstore.reader._stream import cut_batches, prefetched
from rowstore.reader.buffers import SHAPE_KEY, Ragged, pad_ragged
from rowstore.reader.epochs import EpochSpec, part_spec
from rowstore.reader.order import shard_bounds
from rowstore.reader.plan import EpochPlan, default_unit

__all__ = [
    "VARLEN_MODES",
    "EpochRead",
    "EpochReads",
    "Cut",
    "check_varlen",
    "dealt_spans",
    "finish_varlen",
    "part_spans",
    "read_epoch",
    "resolve",
]

#: The ``varlen`` modes of the numpy batches (and of ``rowstore.tf``).
VARLEN_MODES = ("ragged", "padded")

#: A range of the epoch order a consumer reads: ``(lo, hi, False)`` the positions ``[lo, hi)``;
#: ``(0, n, True)`` ``n`` rows of padding (the order's first rows repeated, marked ``"__pad"``).
Span = tuple[int, int, bool]


def check_varlen(varlen: str) -> str:
    """``varlen`` if it is one of :data:`VARLEN_MODES`, else ``ValueError``."""
    if varlen not in VARLEN_MODES:
        raise ValueError(f"varlen must be one of {VARLEN_MODES}, got {varlen!r}")
    return varlen


def finish_varlen(batch: dict, plans: list[Any], varlen: str) -> dict:
    """``batch`` with its variable-shape fields zero-padded (plus ``"<name>__shape"``) for
    ``varlen="padded"``; as is for ``"ragged"``. ``plans``: the fields' gather plans."""
    if varlen != "padded":
        return batch
    for p in plans:
        v = batch.get(p.field.name)
        if isinstance(v, Ragged):
            batch[p.field.name + SHAPE_KEY] = v.shapes[:, list(p.field.variable_dims)]
            batch[p.field.name] = pad_ragged(v)
    return batch


@dataclasses.dataclass(frozen=True)
class EpochRead:
    """One epoch read, every argument resolved: what a source's :class:`Cut` and
    :func:`read_epoch` are given (nothing is checked or defaulted after :func:`resolve`).

    ``shuffle`` is a mode name, ``window``/``pieces`` the source's defaults where none were
    given, ``unit`` the dealt unit of ``batch_size``-row batches, ``decode`` the spec's image
    ops (checked as a spec checks them; the source checks them against its schema once).
    ``num_threads`` None is the source's own; ``where`` names the entry point in errors and
    ``spec`` is the spec the read was resolved from.
    """

    where: str
    spec: EpochSpec
    shuffle: str
    seed: int
    epoch: int
    window: int
    pieces: int
    keep: np.ndarray | None
    decode: dict | None
    shard: tuple[int, int]
    drop_last: bool
    pad: bool
    unit: int
    batch_size: int
    fields: Any
    with_ids: bool
    num_threads: int | None
    prefetch: int
    varlen: str
    parts: bool


def resolve(
    source: Any,
    where: str,
    spec: EpochSpec,
    batch_size: int,
    fields: Any = None,
    with_ids: bool = False,
    num_threads: int | None = None,
    prefetch: int = 2,
    varlen: str | None = None,
    parts: bool = False,
) -> EpochRead:
    """The :class:`EpochRead` of ``spec`` (made and checked by the caller) on ``source``: the
    default window and pieces decided by ``source._order_defaults`` (the shuffle already a
    mode name), the dealt unit, the counts and ``varlen`` checked."""
    batch_size = positive_int("batch_size", batch_size)
    positive_int("prefetch", prefetch)
    positive_int("num_threads", num_threads, optional=True)
    if spec.window is not None and spec.pieces is not None:
        window, pieces = spec.window, spec.pieces
    else:
        window, pieces = source._order_defaults(spec.shuffle, spec.window, spec.pieces)
    unit = spec.unit or default_unit(
        spec.shuffle, window, source.layout.rows_per_block, batch_size, pieces
    )
    return EpochRead(
        where=where,
        spec=spec,
        shuffle=spec.shuffle,
        seed=spec.seed,
        epoch=spec.epoch,
        window=window,
        pieces=pieces,
        keep=spec.keep,
        decode=spec.decode,
        shard=spec.shard,
        drop_last=spec.drop_last,
        pad=spec.pad,
        unit=unit,
        batch_size=batch_size,
        fields=fields,
        with_ids=bool(with_ids),
        num_threads=num_threads,
        prefetch=prefetch,
        varlen=check_varlen(varlen or source.varlen),
        parts=bool(parts),
    )


class Cut(Protocol):
    """How a source reads one :class:`EpochRead`: its epoch order cut into segments, and
    each segment read into a batch dict."""

    #: Positions of the epoch order (its rows, or the kept rows of a subset).
    num_rows: int
    #: Threads reading segments ahead (1: inline).
    threads: int

    def segments(self, lo: int, hi: int) -> Iterable[Any]:
        """Positions ``[lo, hi)`` of the order as consecutive segments."""
        ...

    def padding(self, n: int) -> Any:
        """A segment of ``n`` rows of padding."""
        ...

    def produce(self, segment: Any) -> dict:
        """A segment read (thread-safe)."""
        ...

    def finish(self, batch: dict) -> dict:
        """A cut batch as it is handed out (``varlen``)."""
        ...

    def fetch_ahead(self, segments: Callable[[], Iterable[Any]]) -> Iterable[Any]:
        """``segments()``, with their chunks fetched ahead where the store gains by it
        (``segments`` may be called twice: it makes the same segments again)."""
        ...


def part_spans(num_rows: int, part: tuple[int, int], even: bool, start: int) -> list[Span]:
    """The range of the contiguous ``part=(index, count)`` of an order of ``num_rows``
    positions (``even``: every part ``num_rows // count`` rows), its first ``start`` rows
    skipped."""
    lo, hi = shard_bounds(num_rows, part[0], part[1], even)
    return [(min(lo + start, hi), hi, False)]


def dealt_spans(plan: EpochPlan, gids: np.ndarray) -> list[Span]:
    """The ranges of a consumer's global batches ``gids`` (:meth:`EpochPlan.batches`, -1 a
    batch of padding) in the order they are delivered: runs of consecutive batches merged
    into one range, a short last batch completed by padding under ``pad``."""
    B = plan.batch_size
    out: list[Span] = []
    real = gids[gids >= 0]
    if len(real):
        for run in np.split(real, np.flatnonzero(np.diff(real) != 1) + 1):
            lo, hi = plan.rows_of_batch(int(run[0]))[0], plan.rows_of_batch(int(run[-1]))[1]
            out.append((lo, hi, False))
            if plan.pad and hi - lo < len(run) * B:
                out.append((0, len(run) * B - (hi - lo), True))
    out += [(0, B, True)] * int((gids < 0).sum())
    return out


def read_epoch(
    read: EpochRead, cut: Cut, spans: Sequence[Span]
) -> Generator[dict[str, Any], None, None]:
    """The batches of ``spans`` (whole reads with ``read.parts``): ranges cut into ``cut``'s
    segments, read ``cut.threads * read.prefetch`` ahead, then cut into ``read.batch_size``-row
    batches (the last short unless ``read.drop_last``)."""

    def segments() -> Iterator[Any]:
        for lo, hi, pad in spans:
            if pad:
                yield cut.padding(hi - lo)
            else:
                yield from cut.segments(lo, hi)

    reads = prefetched(cut.fetch_ahead(segments), cut.produce, cut.threads, read.prefetch)
    if read.parts:
        return reads
    return cut_batches(reads, read.batch_size, read.drop_last, cut.finish)


class EpochReads:
    """``batches`` and ``deal``, written once for every epoch source (a
    :class:`~rowstore.reader.Reader`, a :class:`~rowstore.reader.mix.Mixture`).

    A source gives ``layout.rows_per_block``, ``varlen``, ``_order_defaults(mode, window,
    pieces)`` (the ``(window, pieces)`` of an order, the mode already a name) and
    ``_cut(read)`` (its :class:`Cut` of an :class:`EpochRead`).
    """

    layout: Any
    varlen: str

    def _order_defaults(
        self, shuffle: str, window: int | None, pieces: int | None
    ) -> tuple[int, int]:
        raise NotImplementedError

    def _cut(self, read: EpochRead) -> Cut:
        raise NotImplementedError

    def batches(
        self,
        batch_size: int,
        *,
        spec: EpochSpec | None = None,
        fields: Sequence[Any] | None = None,
        part: tuple[int, int] | None = None,
        even: bool = False,
        num_threads: int | None = None,
        prefetch: int = 2,
        varlen: str | None = None,
        start: int = 0,
        with_ids: bool = False,
        **order: Any,
    ) -> Generator[dict[str, Any], None, None]:
        """Yield one epoch of batches (dicts of per-field arrays with ``batch_size`` rows).

        Parameters
        ----------
        spec : EpochSpec, optional
            The order arguments as one object; the keywords ``order`` replace its values.
        **order
            The order arguments of :class:`~rowstore.reader.epochs.EpochSpec` (one meaning
            each, ``docs/order.md``): ``shuffle`` (``"block"``, ``"full"``, ``"none"``, or
            True/False), ``seed``, ``epoch``, ``window``, ``pieces``, ``drop_last`` (drop the
            last partial batch), ``keep`` (a row subset, :meth:`keep_mask`), ``decode`` (image
            ops of jpeg fields: ``{field: ImageOp}``, :mod:`rowstore.reader.image_ops`). A
            dealt ``shard`` and ``pad`` are :meth:`deal`'s.
        fields : sequence of str, optional
            Fields to read (default: all).
        part : (index, count)
            A contiguous slice of the epoch order: the order cut into ``count`` parts whose
            sizes differ by at most one row.
        even : bool
            Every part exactly ``len // count`` rows (drops up to ``count - 1`` rows).
        num_threads : int
            Threads reading ahead (kernels and image decoders release the GIL).
        prefetch : int
            Segments (windows) read ahead per thread; memory ~ ``num_threads * prefetch *
            window * block_bytes``. The output buffers of up to ``num_threads * prefetch + 3``
            segments are reused during the epoch, each once no batch cut from it is referred to.
        varlen : {"ragged", "padded"}, optional
            Variable-shape fields (default: the reader's).
        start : int
            Skip this many rows of the part (resume mid-epoch).
        with_ids : bool
            Add ``"__id"`` (each row's dataset row number).

        Yields
        ------
        dict
            Arrays owned by the caller (never overwritten by the reader).
        """
        where = f"{type(self).__name__}.batches"
        spec, part = part_spec(where, spec, part, order)
        args = (fields, with_ids, num_threads, prefetch, varlen, False)
        read = resolve(self, where, spec, batch_size, *args)
        start = nonneg_int("start", start)
        cut = self._cut(read)
        return read_epoch(read, cut, part_spans(cut.num_rows, part, bool(even), start))

    def deal(
        self,
        batch_size: int,
        *,
        spec: EpochSpec | None = None,
        remaining: Sequence[Sequence[int]] | None = None,
        skip: int = 0,
        fields: Sequence[str] | None = None,
        with_ids: bool = False,
        num_threads: int | None = None,
        prefetch: int = 2,
        varlen: str | None = None,
        parts: bool = False,
        **order: Any,
    ) -> Generator[dict[str, Any], None, None]:
        """Yield consumer ``rank``'s batches of an epoch dealt to ``world`` consumers
        (``shard=(rank, world)``).

        The epoch's global batches (``batch_size`` rows of the order each) are dealt in units
        of ``unit`` batches round-robin (see :mod:`rowstore.reader.plan`): every batch has
        ``batch_size`` rows (except the epoch's last without ``drop_last``/``pad``).

        Parameters
        ----------
        spec : EpochSpec, optional
            The order arguments as one object; the keywords ``order`` replace its values.
        **order
            The order arguments of :class:`~rowstore.reader.epochs.EpochSpec` (``docs/order.md``):
            ``shuffle``, ``seed``, ``epoch``, ``window``, ``pieces``, ``shard`` (this
            consumer's dealt part), ``drop_last``/``pad`` (equal steps; ``pad`` adds
            ``"__pad"``, True for rows repeated to even out steps), ``unit``, ``keep`` (a row
            subset, :meth:`keep_mask`), ``decode`` (image ops of jpeg fields).
        remaining : list of [a, b), optional
            From a saved state: deal only those global batches.
        skip : int
            Skip this consumer's first steps.
        with_ids : bool
            Add ``"__id"`` (each row's dataset row number).
        parts : bool
            Yield the reads as they come (whole segments, in order, any number of rows each,
            variable shapes as ``Ragged``) for the caller to cut into ``batch_size``-row batches
            (the torch loader cuts tensors).

        Other arguments as in :meth:`batches`.
        """
        if not isinstance(spec, EpochSpec) or order:
            spec = EpochSpec.make(spec, **order)
        args = (fields, with_ids, num_threads, prefetch, varlen, parts)
        read = resolve(self, f"{type(self).__name__}.deal", spec, batch_size, *args)
        skip = nonneg_int("skip", skip)
        cut = self._cut(read)
        plan = EpochPlan(
            cut.num_rows,
            read.batch_size,
            drop_last=read.drop_last,
            pad=read.pad,
            remaining=remaining,
        )
        gids = plan.batches(read.shard[0], read.shard[1], read.unit)[skip:]
        return read_epoch(read, cut, dealt_spans(plan, gids))

    def plan(
        self,
        batch_size: int,
        *,
        drop_last: bool = False,
        pad: bool = False,
        remaining: Sequence[Sequence[int]] | None = None,
        keep: np.ndarray | None = None,
    ) -> EpochPlan:
        """The :class:`~rowstore.reader.plan.EpochPlan` of an epoch (or what is left of it) of
        ``batch_size``-row batches; ``keep``: a row subset (:meth:`keep_mask`)."""
        return EpochPlan(
            self._epoch_rows(keep), batch_size, drop_last=drop_last, pad=pad, remaining=remaining
        )

    def _epoch_rows(self, keep: np.ndarray | None) -> int:
        """Positions of an epoch order of the row subset ``keep`` (None: all rows)."""
        raise NotImplementedError
