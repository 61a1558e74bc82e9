"""One epoch pipeline: :class:`EpochSpec`, the order arguments checked once, and
:class:`EpochSource`, what a :class:`~rowstore.reader.Reader` and a
:class:`~rowstore.reader.mix.Mixture` both offer the loaders.

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
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rowstore._check import positive_int
from rowstore.reader.image_ops import check_decode
from rowstore.reader.order import check_args, check_shard, shuffle_mode
from rowstore.reader.plan import (
    ORDER_DEFAULTS,
    EpochPlan,
    default_unit,
    make_state,
    rank_steps_taken,
    read_state,
    subset_key,
)

__all__ = [
    "EpochSpec",
    "EpochSource",
    "as_pair",
    "check_quality",
    "deprecated",
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
    "Reader.batches/deal, rowstore.torch.BatchedDataLoader and IterableDataset, "
    "rowstore.tf.Loader and make_dataset"
)


def no_decode(where: str, spec: EpochSpec) -> None:
    """``ValueError`` if ``spec`` declares image ops that ``where`` does not apply (rather than
    ignoring them and handing out images of another shape)."""
    if spec.decode:
        raise ValueError(
            f"{where} does not apply decode= image ops; they are read by {DECODE_ENTRY_POINTS}"
        )


def deprecated(where: str, old: str, new: str, stacklevel: int = 2) -> None:
    """Warn that ``old`` (an argument of ``where``) is deprecated: write ``new`` instead."""
    warnings.warn(
        f"{where}: {old} is deprecated; write {new}", DeprecationWarning, stacklevel=stacklevel + 1
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
        put = object.__setattr__
        put(self, "decode", check_decode(self.decode))
        put(self, "shuffle", shuffle_mode(self.shuffle))
        put(self, "shard", as_pair("shard", (0, 1) if self.shard is None else self.shard))
        check_args(self.shuffle, self.seed, self.epoch, self.window or 1, *self.shard)
        put(self, "seed", int(self.seed))
        put(self, "epoch", int(self.epoch))
        if self.window is not None:
            put(self, "window", positive_int("window", self.window))
        put(self, "pieces", positive_int("pieces", self.pieces, optional=True))
        put(self, "unit", positive_int("unit", self.unit, optional=True))
        put(self, "drop_last", bool(self.drop_last))
        put(self, "pad", bool(self.pad))
        if self.drop_last and self.pad:
            raise ValueError("drop_last and pad are two equal-steps policies: choose one")

    @classmethod
    def make(cls, spec: EpochSpec | None = None, **order: Any) -> EpochSpec:
        """``spec`` with the keywords ``order`` replaced (a new spec without ``spec``); an
        unknown keyword is a ``TypeError`` naming it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(order) - names)
        if unknown:
            raise TypeError(
                f"unexpected order argument(s) {unknown}; the order arguments are {sorted(names)}"
            )
        return cls(**order) if spec is None else dataclasses.replace(spec, **order)

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
        return dataclasses.replace(self, window=window, pieces=pieces)

    def adopt(self, state: Any) -> EpochSpec:
        """The spec a saved ``state`` resumes with: when this spec leaves both window and
        pieces to their defaults, the window and pieces the state was saved with (a state
        without ``pieces`` is a ``pieces=1`` order), so a state saved under other defaults
        resumes its own order; otherwise this spec (and :meth:`read_state` refuses a state
        saved with other values)."""
        if (
            self.window is not None
            or self.pieces is not None
            or not isinstance(state, dict)
            or "window" not in state
        ):
            return self
        try:
            return self.replace(
                window=state["window"], pieces=state.get("pieces", ORDER_DEFAULTS["pieces"])
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
        resolved window and pieces."""
        plan = self.plan(source, batch_size)
        spec = self.resolve(source)
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "window": spec.window,
            "pieces": spec.pieces,
            "dataset_rows": len(source),
            "dataset_version": source.layout.version,
            "subset": subset_key(self.keep),
            "batch_size": batch_size,
            "num_rows": plan.num_rows,
            "drop_last": plan.drop_last,
            "pad": plan.pad,
        }

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
            return make_state(int(epoch) + 1, self.order_key(source, batch_size), None)
        return make_state(int(epoch), self.order_key(source, batch_size), left)

    def read_state(
        self, source: EpochSource, state: Any, batch_size: int
    ) -> tuple[int, list | None]:
        """``(epoch, remaining)`` of a saved state; ``ValueError`` if it is for another order.
        Checked against :meth:`adopt`'s spec: a loader resumes with ``self.adopt(state)``."""
        return read_state(state, self.adopt(state).order_key(source, batch_size))

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


@runtime_checkable
class EpochSource(Protocol):
    """What the loaders read: a :class:`~rowstore.reader.Reader` or a
    :class:`~rowstore.reader.mix.Mixture`.

    ``batches`` yields a contiguous ``part`` of an epoch, ``deal`` a consumer's dealt
    ``shard``; both take an :class:`EpochSpec` (or its keywords). ``plan`` gives the epoch's
    global batches, ``keep_mask`` a row subset, ``shuffle_quality`` the quality of an order,
    ``read_ids`` the rows of row ids (what a mixture reads of its sources).
    """

    schema: Any
    layout: Any
    num_threads: int
    varlen: str

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
    where: str,
    spec: EpochSpec | None,
    part: Any,
    shard: Any,
    order: dict[str, Any],
    stacklevel: int = 3,
) -> tuple[EpochSpec, tuple[int, int]]:
    """The spec and ``(index, count)`` of an entry point that reads a contiguous ``part`` of
    an epoch (``Reader.batches``, ``Mixture.batches``, ``rowstore.tf.make_dataset``).

    ``shard=`` there is the deprecated spelling of ``part=`` (it was a contiguous slice, where
    every other entry point deals ``shard``); a dealt ``shard`` or ``pad`` in the spec is a
    ``ValueError`` pointing to ``deal``."""
    name = "part"
    if shard is not None:
        if part is not None:
            raise TypeError(f"{where}: pass part= only (shard= is its deprecated spelling)")
        name = "shard"
        deprecated(
            where,
            "shard=(i, n), a contiguous slice of the epoch,",
            "part=(i, n) (shard= deals the epoch everywhere else: use deal(shard=...) for that)",
            stacklevel=stacklevel,
        )
        part = shard
    pair = as_pair(name, (0, 1) if part is None else part)
    spec = EpochSpec.make(spec, **order)
    if spec.shard != (0, 1) or spec.pad:
        raise ValueError(
            f"{where} reads a contiguous part=(index, count) of the epoch; a dealt "
            f"shard=(rank, world) and pad= are deal()'s (got shard={spec.shard}, pad={spec.pad})"
        )
    return spec, pair
