"""One epoch pipeline: :class:`EpochSpec`, the order arguments checked once;
:class:`EpochSource`, what a :class:`~rowstore.reader.Reader` and a
:class:`~rowstore.reader.mix.Mixture` both offer the loaders; and :class:`EpochStream`, the
resumable run of epochs every loader is a thin converter over.

Every read entry point (``Reader.batches``/``deal``, ``Mixture.batches``/``deal``, the torch
datasets and loaders, ``rowstore.tf``, ``make_reader``) builds an :class:`EpochSpec` from its
keyword arguments, so the same words have the same meaning everywhere (``docs/order.md``):

- ``shuffle``: ``"block"``, ``"full"``, ``"none"``, or ``True`` (``"block"``) / ``False``
  (``"none"``);
- ``seed``, ``epoch``: the order is a pure function of them and the dataset's layout;
- ``window``, ``pieces``: the units (blocks, or pieces of blocks) mixed together in block mode;
- ``shard=(rank, world)``: this consumer's **dealt** part of the epoch (whole global batches in
  units, round-robin: :mod:`rowstore.reader.plan`);
- ``part=(index, count)``: a **contiguous** slice of the epoch order (``Reader.batches``,
  ``rowstore.tf.make_dataset``), with ``even=True`` making every slice the same size;
- ``drop_last`` / ``pad``: the equal-steps policy of a dealt epoch;
- ``decode``: decode-time image ops of ``jpeg`` fields (``{field: RandomResizedCrop(224)}``,
  :mod:`rowstore.reader.image_ops`), their random parameters a pure function of (seed, epoch,
  field, row).

The spec also gives what the resumable loaders share: the order key a saved state is checked
against, the state once every consumer took ``k`` steps, and the shuffle-quality report.
:class:`EpochStream` holds where a rank stands (epoch, steps, what remains) and hands its batches
out to lanes (torch's DataLoader workers) in an order a saved state reproduces.

Its states are :class:`rowstore.reader.state.StreamState`, the one resume-state codec.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Generator, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rowstore._check import nonneg_int, positive_int
from rowstore.errors import StateError
from rowstore.reader.image_ops import check_decode
from rowstore.reader.order import check_args, check_shard, shuffle_mode
from rowstore.reader.plan import EpochPlan, default_unit, rank_steps_taken
from rowstore.reader.state import (
    MAX_EPOCH,
    ORDER_DEFAULTS,
    STATE_KIND,
    StreamState,
    _int,
    subset_key,
)

__all__ = [
    "EpochSpec",
    "EpochSource",
    "EpochStream",
    "OnStream",
    "as_pair",
    "check_quality",
    "no_decode",
    "part_spec",
    "report_quality",
]

_log = logging.getLogger("rowstore")


def as_pair(name: str, value: Any) -> tuple[int, int]:
    """``(rank, world)`` of a ``shard``/``part`` argument: two ints (Python or NumPy, not bool)
    with ``0 <= rank < world``; otherwise ``ValueError`` naming the argument."""
    try:
        rank, world = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be (rank, world), got {value!r}") from None
    try:
        check_shard(rank, world)
    except ValueError:
        raise ValueError(
            f"{name} must be (rank, world) with ints 0 <= rank < world, got {value!r}"
        ) from None
    return int(rank), int(world)


#: The entry points that decode through image ops (``decode=``).
DECODE_ENTRY_POINTS = (
    "Reader.batches/deal, rowstore.torch.BatchedDataLoader (not cache='memory') and "
    "IterableDataset, rowstore.tf.Loader and make_dataset, rowstore.grain.EpochDataset"
)


def no_decode(where: str, spec: EpochSpec) -> None:
    """``ValueError`` if ``spec`` declares image ops that ``where`` does not apply (rather than
    ignoring them and handing out images of another shape)."""
    if spec.decode:
        raise ValueError(
            f"{where} does not apply decode= image ops; they are read by {DECODE_ENTRY_POINTS}"
        )


def check_quality(quality: Any) -> Any:
    """``quality`` if it is None, ``"log"`` or a callable ``(epoch, quality)``."""
    if quality is not None and quality != "log" and not callable(quality):
        raise ValueError(
            f"quality must be None, 'log' or a callable(epoch, quality), got {quality!r}"
        )
    return quality


@dataclasses.dataclass(frozen=True, eq=False)
class EpochSpec:
    """The order arguments of an epoch, checked when the spec is made.

    Parameters
    ----------
    shuffle : {"block", "full", "none"} or bool
        The order mode (:mod:`rowstore.reader.order`); ``True`` is ``"block"``, ``False``
        ``"none"``. Stored as the mode name.
    seed, epoch : int
        The order is a pure function of (seed, epoch, the dataset's block layout).
    window : int, optional
        Units (blocks, or pieces with ``pieces``) whose rows are mixed together in block mode.
        Default: :data:`~rowstore.reader.order.WINDOW_BLOCKS` blocks of rows
        (``WINDOW_BLOCKS * pieces`` units).
    pieces : int, optional
        Block mode: cut each block into this many pieces, the unit of the permutation and of
        ``window`` (1: whole blocks). Default: resolved from the file by :meth:`resolve`
        (8 for uncompressed blocks read directly, else 1; 1 when ``window`` is given).
    shard : (rank, world)
        The consumer's dealt part of the epoch (:mod:`rowstore.reader.plan`); None is (0, 1).
    drop_last, pad : bool
        The equal-steps policy of a dealt epoch (at most one).
    unit : int, optional
        Global batches dealt at a time (default: about four windows of rows).
    keep : bool array, optional
        A row subset (one bool per dataset row; :meth:`Reader.keep_mask`).
    decode : dict, optional
        ``{field: ImageOp}``: ``jpeg`` fields decoded through a crop/resize/flip
        (:mod:`rowstore.reader.image_ops`) into fixed-size uint8 batches; the op's random
        parameters are drawn from (seed, epoch, field, dataset row), so resuming is exact.
    """

    shuffle: Any = "block"
    seed: int = 0
    epoch: int = 0
    window: int | None = None
    pieces: int | None = None
    shard: tuple[int, int] = (0, 1)
    drop_last: bool = False
    pad: bool = False
    unit: int | None = None
    keep: np.ndarray | None = None
    decode: Any = None

    def __post_init__(self) -> None:
        self._check(None)

    def _check(self, changed: Any) -> None:
        """Check and normalize the fields ``changed`` (None: all), then what ties them together;
        a field not changed was checked when its spec was made (each value is checked once on
        its way to the reader)."""
        put = object.__setattr__
        every = changed is None

        def fresh(name: str) -> bool:
            return every or name in changed

        if fresh("decode"):
            put(self, "decode", check_decode(self.decode))
        if fresh("shuffle"):
            put(self, "shuffle", shuffle_mode(self.shuffle))
        if fresh("shard"):
            put(self, "shard", as_pair("shard", (0, 1) if self.shard is None else self.shard))
        if fresh("seed") or fresh("epoch") or fresh("window"):
            check_args(self.shuffle, self.seed, self.epoch, self.window or 1, *self.shard)
            put(self, "seed", int(self.seed))
            put(self, "epoch", int(self.epoch))
            if self.window is not None:
                put(self, "window", positive_int("window", self.window))
        if fresh("pieces"):
            put(self, "pieces", positive_int("pieces", self.pieces, optional=True))
        if fresh("unit"):
            put(self, "unit", positive_int("unit", self.unit, optional=True))
        put(self, "drop_last", bool(self.drop_last))
        put(self, "pad", bool(self.pad))
        if self.drop_last and self.pad:
            raise ValueError("drop_last and pad are two equal-steps policies: choose one")

    @classmethod
    def make(cls, spec: EpochSpec | None = None, **order: Any) -> EpochSpec:
        """``spec`` with the keywords ``order`` replaced (a new spec without ``spec``); an
        unknown keyword is a ``TypeError`` naming it. Only the replaced values are checked
        again."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(order) - names)
        if unknown:
            raise TypeError(
                f"unexpected order argument(s) {unknown}; the order arguments are {sorted(names)}"
            )
        if spec is None:
            return cls(**order)
        if not order:
            return spec
        new = copy.copy(spec)
        for k, v in order.items():
            object.__setattr__(new, k, v)
        new._check(order)
        return new

    def replace(self, **order: Any) -> EpochSpec:
        """A copy with these arguments changed (checked again)."""
        return EpochSpec.make(self, **order)

    # -- the defaults ----------------------------------------------------------------------------
    @property
    def resolved(self) -> bool:
        """True when ``window`` and ``pieces`` are both given (nothing left to resolve)."""
        return self.window is not None and self.pieces is not None

    def window_pieces(self) -> tuple[int, int]:
        """``(window, pieces)`` of a resolved spec (:meth:`resolve`)."""
        if self.window is None or self.pieces is None:
            raise RuntimeError("window/pieces are not resolved yet: call resolve(source) first")
        return self.window, self.pieces

    def resolve(self, source: Any) -> EpochSpec:
        """The spec with the default ``window``/``pieces`` decided for ``source`` (a reader or a
        mixture: ``source.order_defaults``, :func:`~rowstore.reader.order.resolve_order`);
        itself when both are given."""
        if self.resolved:
            return self
        window, pieces = source.order_defaults(self.shuffle, self.window, self.pieces)
        return EpochSpec.make(self, window=window, pieces=pieces)

    def adopt(self, state: Any) -> EpochSpec:
        """The spec a saved ``state`` (a :class:`StreamState`, or its order keys) resumes with:
        when this spec leaves both window and pieces to their defaults, the window and pieces
        the state was saved with (a state without ``pieces`` is a ``pieces=1`` order), so a
        state saved under other defaults resumes its own order; otherwise this spec (and
        :meth:`read_state` refuses a state saved with other values)."""
        order = state.order if isinstance(state, StreamState) else state
        if (
            self.window is not None
            or self.pieces is not None
            or not isinstance(order, Mapping)
            or "window" not in order
        ):
            return self
        try:
            return self.replace(
                window=order["window"], pieces=order.get("pieces", ORDER_DEFAULTS["pieces"])
            )
        except (TypeError, ValueError):
            return self  # not a valid order: read_state says what is wrong with the state

    # -- what the order depends on ---------------------------------------------------------------
    def order_kwargs(self, epoch: int | None = None) -> dict[str, Any]:
        """The keywords of ``Reader.epoch``/``shuffle_quality`` for ``epoch`` (default: the
        spec's)."""
        return {
            "shuffle": self.shuffle,
            "seed": self.seed,
            "epoch": self.epoch if epoch is None else int(epoch),
            "window": self.window,
            "pieces": self.pieces,
        }

    def unit_for(self, source: EpochSource, batch_size: int) -> int:
        """Global batches per dealt unit for ``batch_size``-row batches of ``source``."""
        if self.unit:
            return self.unit
        spec = self.resolve(source)
        window, pieces = spec.window_pieces()
        return default_unit(spec.shuffle, window, source.layout.rows_per_block, batch_size, pieces)

    def plan(
        self, source: EpochSource, batch_size: int, remaining: list | None = None
    ) -> EpochPlan:
        """The :class:`~rowstore.reader.plan.EpochPlan` of an epoch of ``source`` (or of what
        ``remaining`` says is left of it)."""
        return source.plan(
            batch_size, drop_last=self.drop_last, pad=self.pad, remaining=remaining, keep=self.keep
        )

    def order_key(self, source: EpochSource, batch_size: int) -> dict[str, Any]:
        """What a resumable state's order depends on (checked when a state is loaded): the
        dataset (its rows, manifest version and :attr:`~rowstore.reader.Reader.fingerprint`),
        the resolved window and pieces, the row subset, the batches."""
        plan = self.plan(source, batch_size)
        spec = self.resolve(source)
        return {
            "dataset_version": source.layout.version,
            "dataset_rows": len(source),
            "dataset": source.fingerprint,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "window": spec.window,
            "pieces": spec.pieces,
            "subset": subset_key(self.keep),
            "batch_size": batch_size,
            "num_rows": plan.num_rows,
            "drop_last": plan.drop_last,
            "pad": plan.pad,
        }

    def state(
        self,
        source: EpochSource,
        batch_size: int,
        epoch: int,
        remaining: list | None = None,
        *,
        consumer: tuple[int, int] | None = None,
        taken: int = 0,
        row: int = 0,
        hand_out: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The state (:meth:`StreamState.to_json`) of ``epoch`` with ``remaining`` global
        batches left (None: the epoch from its start); with ``consumer``, a DataLoader
        worker's own progress in it; with ``hand_out``, the epoch's hand-out
        (:class:`EpochStream`)."""
        plan = self.plan(source, batch_size, remaining)
        return StreamState(
            STATE_KIND,
            _int("epoch", epoch, 0, MAX_EPOCH),
            self.order_key(source, batch_size),
            remaining=None if plan.fresh else plan.remaining,
            consumer=consumer,
            taken=taken,
            row=row,
            hand_out=hand_out,
        ).to_json()

    def state_after(
        self,
        source: EpochSource,
        epoch: int,
        remaining: list | None,
        steps: int,
        batch_size: int,
        workers: int = 1,
    ) -> dict[str, Any]:
        """The state once every rank of ``shard``'s world handed out ``steps`` batches of
        ``epoch`` (dealt from ``remaining``) with ``workers`` DataLoader workers each."""
        plan = self.plan(source, batch_size, remaining)
        world = self.shard[1]
        unit = self.unit_for(source, batch_size)
        left = plan.after(rank_steps_taken(plan, int(steps), world, workers, unit), unit)
        if left is None:
            return self.state(source, batch_size, int(epoch) + 1)
        return self.state(source, batch_size, int(epoch), left.remaining)

    def read_state(
        self, source: EpochSource, state: Any, batch_size: int, *, worker: bool = False
    ) -> StreamState:
        """The checked :class:`StreamState` of a saved dealt-epoch state
        (:class:`~rowstore.errors.StateError` if a field is invalid or the state is for another
        dataset or order). Checked against :meth:`adopt`'s spec: a loader resumes with
        ``self.adopt(state)``. A DataLoader worker's own state (``consumer``) is refused unless
        ``worker``: only that worker resumes it."""
        st = StreamState.from_json(state)
        if st.kind != STATE_KIND:
            raise StateError(
                f"a {st.kind!r} state resumes only that loader; this one reads "
                f"{STATE_KIND!r} states",
                field="kind",
            )
        if st.consumer is not None and not worker:
            raise StateError(
                f"this state is DataLoader worker {st.consumer}'s own (saved inside a worker): "
                f"only an IterableDataset with the same workers resumes it; save the job's "
                f"state with ResumableDataLoader.state_dict() instead",
                field="consumer",
            )
        spec = self.adopt(st)
        st.check(
            spec.order_key(source, batch_size), batches=spec.plan(source, batch_size).num_batches
        )
        return st

    def steps(self, source: EpochSource, batch_size: int, remaining: list | None = None) -> int:
        """Steps (batches) this spec's consumer takes in an epoch (or what is left of it)."""
        rank, world = self.shard
        return int(
            self.plan(source, batch_size, remaining).steps(
                world, self.unit_for(source, batch_size)
            )[rank]
        )

    def quality(self, source: EpochSource, batch_size: int, epoch: int | None = None) -> float:
        """The shuffle quality of ``epoch``'s order for ``batch_size``-row batches."""
        return source.shuffle_quality(batch_size, **self.order_kwargs(epoch))


def report_quality(
    quality: Any, spec: EpochSpec, source: EpochSource, epoch: int, batch_size: int
) -> None:
    """Log (``quality="log"``, logger ``"rowstore"``, INFO) or pass to the callback
    ``quality(epoch, q)`` the shuffle quality of ``epoch``; nothing for None."""
    if quality is None:
        return
    q = spec.quality(source, batch_size, epoch)
    spec = spec.resolve(source)
    if quality == "log":
        _log.info(
            "rowstore epoch %d: shuffle quality %.3f "
            "(shuffle=%r, window=%d, pieces=%d, batch_size=%d)",
            epoch,
            q,
            spec.shuffle,
            spec.window,
            spec.pieces,
            batch_size,
        )
    else:
        quality(epoch, q)


class EpochStream:
    """The resumable epoch stream: one consumer's (a rank's) run of epochs of a
    :class:`EpochSource`, where it stands, and how its batches are handed out.

    Every resumable loader is a thin converter over one (torch's ``BatchedDataLoader``,
    ``IterableDataset`` and ``ResumableDataLoader``, ``rowstore.tf.Loader``, Grain's
    ``EpochDataset``): the stream owns the epoch, the steps taken in it, the epoch's global
    batches not yet delivered, ``num_epochs``, the shuffle-quality report and the state, in
    torchdata's ``Stateful`` spirit (:meth:`state_dict` / :meth:`load_state_dict`, one
    :class:`StreamState` as plain JSON).

    **Hand-out.** Each epoch's global batches are dealt to ``world`` ranks
    (``spec.shard``, :mod:`rowstore.reader.plan`), and a rank's part to ``lanes`` lanes:
    lane ``l`` of rank ``r`` is consumer ``r * lanes + l`` of ``world * lanes``, and the
    rank's batch sequence takes its lanes in turn (step ``i`` is lane ``i % lanes``'s step
    ``i // lanes``). A loader reading in one process has one lane; torch's ``DataLoader``
    with ``W`` workers has ``W``, one per worker (each reads its own units of the order, as
    contiguous as one lane's), and takes the workers' batches in turn, which is that
    sequence. The hand-out of the epoch in progress is part of the state, so any loader
    (any number of workers) resumes it with the identical batch sequence; a loader on
    another world size or ``unit`` deals the batches not yet delivered again (each row once).

    Parameters
    ----------
    source : EpochSource
        A :class:`~rowstore.reader.Reader` or a :class:`~rowstore.reader.mix.Mixture`.
    batch_size : int
    spec : EpochSpec
        The order arguments (``shard`` is this rank's ``(rank, world)``); ``unit`` is resolved
        here.
    num_epochs : int or None
        Epochs one :meth:`batches` run yields (the current one counts; None: endless).
    quality : None, "log" or callable
        Report each epoch's shuffle quality when a run starts it (:func:`report_quality`).

    Attributes
    ----------
    first : int
        The first epoch read (the spec's ``epoch``, 0 by default), until :meth:`set_epoch` or a
        loaded state says another.
    epoch, steps : int
        The epoch in progress and this rank's steps (batches) handed out in it; the loader
        sets them as it hands batches out (:meth:`batches` yields them beside each batch).
    """

    def __init__(
        self,
        source: EpochSource,
        batch_size: int,
        spec: EpochSpec,
        *,
        num_epochs: int | None = 1,
        quality: Any = None,
    ):
        self.source = source
        self.batch_size = positive_int("batch_size", batch_size)
        self.spec = spec.replace(unit=spec.unit_for(source, self.batch_size))
        self.num_epochs = positive_int("num_epochs", num_epochs, optional=True)
        self.quality = check_quality(quality)
        self.first = int(self.spec.epoch)  # the first epoch read: the spec's (``epoch=``)
        self.epoch = self.first
        self.steps = 0
        # (epoch, its global batches not yet delivered when dealt, lanes): what a loaded state
        # says of its epoch; the other epochs are whole, handed out in the reader's own lanes.
        self._base: tuple[int, list | None, int | None] | None = None
        self._pending = False  # a state was loaded and no run started since
        self._reported: int | None = None
        self.run_stop = 0  # the epoch the last run stops at (set by batches)

    @property
    def unit(self) -> int:
        return int(self.spec.unit)  # type: ignore[arg-type]

    @property
    def shard(self) -> tuple[int, int]:
        return self.spec.shard

    # -- where the stream stands -----------------------------------------------------------------
    def base(self, epoch: int) -> list | None:
        """``epoch``'s global batches not yet delivered when its hand-out began (None: all)."""
        b = self._base
        return b[1] if b is not None and b[0] == epoch else None

    def lanes(self, epoch: int, own: int = 1) -> int:
        """Lanes per rank of ``epoch``'s hand-out: a loaded state's for its epoch, else
        ``own`` (the reader's: its DataLoader workers, 1 in one process)."""
        b = self._base
        if b is not None and b[0] == epoch and b[2] is not None:
            return b[2]
        return max(1, int(own))

    def plan(self, epoch: int) -> EpochPlan:
        """The plan of ``epoch`` from its base."""
        return self.spec.plan(self.source, self.batch_size, self.base(epoch))

    def epoch_steps(self, epoch: int, own: int = 1) -> int:
        """This rank's steps in ``epoch`` (from its base), its lanes together."""
        rank, world = self.spec.shard
        lanes = self.lanes(epoch, own)
        per = self.plan(epoch).steps(world * lanes, self.unit)
        return int(per[rank * lanes : (rank + 1) * lanes].sum())

    def lane_steps(self, epoch: int, own: int = 1) -> np.ndarray:
        """Steps of each of this rank's lanes in ``epoch`` (from its base)."""
        rank, world = self.spec.shard
        lanes = self.lanes(epoch, own)
        per = self.plan(epoch).steps(world * lanes, self.unit)
        return per[rank * lanes : (rank + 1) * lanes]

    def rank_batches(self, epoch: int, own: int = 1) -> np.ndarray:
        """Global batch numbers of this rank's steps of ``epoch`` (from its base), in the order
        they are handed out (-1: a batch of padding)."""
        rank, world = self.spec.shard
        lanes = self.lanes(epoch, own)
        plan = self.plan(epoch)
        per = [plan.batches(rank * lanes + i, world * lanes, self.unit) for i in range(lanes)]
        out = np.empty(sum(len(p) for p in per), np.int64)
        for i, p in enumerate(per):
            out[i::lanes] = p  # lanes' steps differ by at most one, the first lanes' longer
        return out

    def steps_left(self, own: int = 1, epoch: int | None = None, steps: int | None = None) -> int:
        """Steps a run from ``(epoch, steps)`` (default: where the stream stands) yields."""
        if self.num_epochs is None:
            raise TypeError("an endless epoch stream (num_epochs=None) has no length")
        epoch = self.epoch if epoch is None else epoch
        steps = self.steps if steps is None else steps
        first = max(0, self.epoch_steps(epoch, own) - steps)
        return first + (self.num_epochs - 1) * self.epoch_steps(epoch + 1, own)

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` (the order of that epoch, as ``epoch=`` everywhere) from its start at
        the next run; right after :meth:`load_state_dict`, the loaded epoch keeps the loaded
        position."""
        epoch = nonneg_int("epoch", epoch)
        if self._pending and epoch == self.epoch:
            return
        self.seek(epoch)

    def seek(self, epoch: int, steps: int = 0) -> None:
        """Stand at ``steps`` of a whole ``epoch`` (handed out in the reader's own lanes)."""
        self.epoch, self.steps = int(epoch), int(steps)
        self._base, self._pending = None, False

    # -- Stateful ----------------------------------------------------------------------------------
    def state_dict(self, own: int = 1, *, epoch: int | None = None, steps: int | None = None):
        """The state once every rank handed out ``steps`` batches of ``epoch`` (default: where
        the stream stands), ``own`` lanes each unless a loaded state says otherwise for its
        epoch: the same on every rank, plain JSON values (:class:`StreamState`)."""
        epoch = self.epoch if epoch is None else int(epoch)
        steps = self.steps if steps is None else int(steps)
        rank, world = self.spec.shard
        lanes, unit = self.lanes(epoch, own), self.unit
        base = self.base(epoch)
        plan = self.spec.plan(self.source, self.batch_size, base)
        left = plan.after(rank_steps_taken(plan, steps, world, lanes, unit), unit)
        if left is None:
            epoch, steps, base, lanes = epoch + 1, 0, None, max(1, int(own))
            remaining = None
        else:
            remaining = left.remaining
        hand = None
        if lanes > 1 or (world > 1 and steps):
            hand = {"world": world, "lanes": lanes, "unit": unit, "steps": steps, "base": base}
        return self.spec.state(self.source, self.batch_size, epoch, remaining, hand_out=hand)

    def load_state_dict(self, state: Any) -> None:
        """Stand where ``state`` (any loader's, any rank's, any world's) says:
        :class:`~rowstore.errors.StateError` if a field is invalid, or the state is another
        dataset's or order's. The next run resumes the identical batch sequence where the
        state's hand-out applies (same world and unit), else deals the batches not yet
        delivered."""
        st = self.spec.read_state(self.source, state, self.batch_size)
        self.adopt(st)

    def adopt(self, st: StreamState, *, check: bool = True) -> None:
        """Stand where the checked state ``st`` says (:meth:`load_state_dict`); ``check``: that
        its hand-out leaves its remaining batches (a job's state, not a DataLoader worker's)."""
        self.spec = self.spec.adopt(st)
        h = st.hand_out
        if h is not None and h["world"] == self.spec.shard[1] and h["unit"] == self.unit:
            self._base = (st.epoch, h["base"], h["lanes"])
            self.epoch, self.steps = st.epoch, h["steps"]
            plan = self.plan(st.epoch)
            if self.steps > self.epoch_steps(st.epoch):
                raise StateError(
                    f"invalid resume state: hand_out.steps {self.steps} is more than the "
                    f"{self.epoch_steps(st.epoch)} steps of a rank's epoch",
                    field="hand_out",
                )
            taken = rank_steps_taken(plan, self.steps, h["world"], h["lanes"], self.unit)
            left = plan.after(taken, self.unit)
            ok = (left is None and not st.remaining) or (
                left is not None
                and (left.remaining == st.remaining or (left.fresh and st.remaining is None))
            )
            if check and not ok:
                raise StateError(
                    "invalid resume state: its hand_out does not leave its remaining batches",
                    field="hand_out",
                )
        else:  # one lane per rank from its remaining batches (what a state without one says)
            self._base = (st.epoch, st.remaining, 1)
            self.epoch, self.steps = st.epoch, 0
        self._pending = True

    # -- reading -----------------------------------------------------------------------------------
    def batches(
        self,
        *,
        own: int = 1,
        take: int = 0,
        cut: Any = None,
        lane: Any = None,
        **read: Any,
    ) -> Generator[tuple[Any, int, int], None, None]:
        """Run from where the stream stands: yield ``(batch, epoch, steps)``, ``steps`` being
        the rank's steps handed out in ``epoch`` once the batch is.

        ``own`` lanes (the reader's DataLoader workers; 1 in one process) of which this reader
        is lane ``take``: it yields the rank's steps ``start + take``, ``start + take + own``...
        (torch's DataLoader takes its workers' batches in turn). ``read`` are
        ``source.deal``'s keywords (``fields``, ``with_ids``, ``num_threads``, ``prefetch``,
        ``varlen``, ``parts``); ``cut`` turns a lane's reads into batches (with
        ``parts=True``); ``lane(spec, remaining, skip)``, if given, replaces ``source.deal``
        (an :class:`EpochSpec` of one lane: its ``shard``, ``epoch`` and ``unit``). The
        stream's position is the caller's to set as it hands the batches out; the run stops
        after ``num_epochs`` epochs (at :attr:`run_stop`)."""
        self._pending = False
        epoch, start = self.epoch, self.steps
        stop = None if self.num_epochs is None else epoch + self.num_epochs
        self.run_stop = stop if stop is not None else epoch
        if lane is None:

            def lane(spec: EpochSpec, remaining: Any, skip: int) -> Any:
                it = self.source.deal(
                    self.batch_size, spec=spec, remaining=remaining, skip=skip, **read
                )
                return it if cut is None else cut(it)

        own = max(1, int(own))
        rank, world = self.spec.shard
        while stop is None or epoch < stop:
            if take == 0 and self.quality is not None and self._reported != epoch:
                self._reported = epoch
                report_quality(self.quality, self.spec, self.source, epoch, self.batch_size)
            lanes, base = self.lanes(epoch, own), self.base(epoch)

            def open_lane(
                i: int, skip: int, epoch: int = epoch, lanes: int = lanes, base: Any = base
            ) -> Any:
                shard = (rank * lanes + i, world * lanes)
                return lane(self.spec.replace(epoch=epoch, shard=shard), base, skip)

            i = start + take
            # The reader's own hand-out (one lane per reader): its steps are one lane's, in
            # order; this loop is the per-batch cost of every loader.
            it = open_lane(i % lanes, i // lanes) if lanes == own else None
            if it is None:
                it = _interleave(open_lane, epoch, lanes, i, own)
            try:
                if lanes == own:
                    i += 1
                    for b in it:
                        yield b, epoch, i
                        i += own
                else:
                    yield from it
            finally:
                it.close()
            epoch, start = epoch + 1, 0


def _interleave(
    open_lane: Any, epoch: int, lanes: int, i: int, own: int
) -> Generator[tuple[Any, int, int], None, None]:
    """A rank's steps ``i``, ``i + own``... of ``epoch`` handed out in ``lanes`` lanes (another
    hand-out than the reader's: a state saved with other workers), each from the lane that holds
    it (``open_lane(lane, skip)``); a lane's steps this reader does not hand out are read and
    left."""
    gens: dict[int, Any] = {}
    pos: dict[int, int] = {}
    try:
        while True:
            lane, j = i % lanes, i // lanes
            g = gens.get(lane)
            if g is None:
                g = gens[lane] = open_lane(lane, j)
                pos[lane] = j
            b = _END
            for _ in range(j - pos[lane] + 1):
                b = next(g, _END)
            if b is _END:
                return
            pos[lane] = j + 1
            yield b, epoch, i + 1
            i += own
    finally:
        for g in gens.values():
            g.close()


class OnStream:
    """Mixin of the loaders that are thin converters over an :class:`EpochStream`
    (``self.stream``): where they stand is the stream's."""

    stream: EpochStream

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration reads."""
        return self.stream.epoch

    @property
    def steps(self) -> int:
        """Batches handed out (to this rank) in the epoch, or since the state it resumed from."""
        return self.stream.steps


_END = object()


@runtime_checkable
class EpochSource(Protocol):
    """What the loaders read: a :class:`~rowstore.reader.Reader` or a
    :class:`~rowstore.reader.mix.Mixture`.

    ``batches`` yields a contiguous ``part`` of an epoch, ``deal`` a consumer's dealt
    ``shard``; both take an :class:`EpochSpec` (or its keywords). ``plan`` gives the epoch's
    global batches, ``keep_mask`` a row subset, ``shuffle_quality`` the quality of an order,
    ``read_ids`` the rows of row ids (what a mixture reads of its sources), ``fingerprint``
    the identity a resume state names (:class:`StreamState`).
    """

    schema: Any
    layout: Any
    num_threads: int
    varlen: str

    @property
    def fingerprint(self) -> str: ...

    def __len__(self) -> int: ...

    @property
    def num_rows(self) -> int: ...

    def keep_mask(self, *args: Any, **kwargs: Any) -> Any: ...

    def order_defaults(self, shuffle: str, window: Any, pieces: Any) -> tuple[int, int]: ...

    def plan(self, *args: Any, **kwargs: Any) -> EpochPlan: ...

    def shuffle_quality(self, *args: Any, **kwargs: Any) -> float: ...

    # The calls' keywords are those of Reader.batches, Reader.deal and Reader.read_ids.
    def batches(self, *args: Any, **kwargs: Any) -> Any: ...

    def deal(self, *args: Any, **kwargs: Any) -> Any: ...

    def close(self) -> None: ...


def part_spec(
    where: str, spec: EpochSpec | None, part: Any, order: dict[str, Any]
) -> tuple[EpochSpec, tuple[int, int]]:
    """The spec and ``(index, count)`` of an entry point that reads a contiguous ``part`` of
    an epoch (``Reader.batches``, ``Mixture.batches``, ``rowstore.tf.make_dataset``): a dealt
    ``shard`` or ``pad`` there is a ``ValueError`` pointing to ``deal``."""
    pair = as_pair("part", (0, 1) if part is None else part)
    spec = EpochSpec.make(spec, **order)
    if spec.shard != (0, 1) or spec.pad:
        raise ValueError(
            f"{where} reads a contiguous part=(index, count) of the epoch; a dealt "
            f"shard=(rank, world) and pad= are deal()'s (got shard={spec.shard}, pad={spec.pad})"
        )
    return spec, pair
