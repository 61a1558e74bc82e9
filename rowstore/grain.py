"""JAX and Grain: rowstore datasets as Grain pipelines, checkpointed with Grain's (and Orbax's)
iterator state, and per-process batches turned into global ``jax.Array``\\ s.

- :class:`EpochDataset`: a ``grain.IterDataset`` of whole batches, this process's dealt part
  of rowstore's epoch pipeline (``Reader.deal``, ``shard=(jax.process_index(),
  jax.process_count())`` by default). Its iterator's ``get_state()`` is rowstore's resumable
  epoch state (plain JSON, the one :class:`rowstore.torch.ResumableDataLoader` and
  :class:`rowstore.tf.Loader` save), the same on every process that took the same number of
  steps; ``set_state()`` resumes exactly, on any process count. This is the fast path.
- :class:`BatchSource`: a Grain ``RandomAccessDataSource`` whose items are whole batches of an
  epoch order (item ``g`` is global batch ``g``), each read by one ``Reader.take``: for
  ``grain.MapDataset`` pipelines (Grain's shuffling, slicing, ``mp_prefetch``).
- :class:`ReaderSource`: a ``RandomAccessDataSource`` of rows, as ``reader[i]`` gives them,
  with Grain's batched read (``_getitems``: one ``Reader.take`` for many rows).
- :class:`CheckpointHandler`: Grain's Orbax handler, which also restores a checkpoint written
  by another number of processes (for rowstore states, which are the same on every process).
- :func:`global_batch`: a per-process batch dict as global ``jax.Array``\\ s
  (``jax.make_array_from_process_local_data``).

This module is the only part of rowstore that imports ``grain``; ``jax`` is imported where it
is used (the default shard and :func:`global_batch`). Install with ``pip install
rowstore[grain]``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from grain.checkpoint import CheckpointHandler as _GrainHandler

from rowstore._check import positive_int
from rowstore.errors import StateError
from rowstore.reader.buffers import NULL_KEY, Ragged
from rowstore.reader.epochs import (
    EpochSpec,
    EpochStream,
    OnStream,
    as_pair,
    check_quality,
    no_decode,
)
from rowstore.reader.image_ops import decoded_schema
from rowstore.reader.make_reader import open_source
from rowstore.reader.plan import ID_KEY, EpochPlan
from rowstore.reader.state import MAX_STATE_BYTES, STATE_KIND, loads_state

__all__ = [
    "BatchSource",
    "CheckpointHandler",
    "EpochDataset",
    "EpochIterator",
    "ReaderSource",
    "global_batch",
    "process_shard",
]


def process_shard() -> tuple[int, int]:
    """``(jax.process_index(), jax.process_count())``; ``(0, 1)`` without jax. The same pair
    Grain's checkpoint handler names its files by."""
    try:
        import jax
    except ImportError:
        return 0, 1
    return int(jax.process_index()), int(jax.process_count())


# -- random access sources --------------------------------------------------------------------
class ReaderSource:
    """A Grain ``RandomAccessDataSource`` of a reader's rows.

    ``source[i]`` is row ``i`` as ``reader[i]`` gives it (a dict of numpy values, ``None`` for
    nulls); ``source._getitems(indices)`` (Grain's batched read) reads all of them with one
    ``Reader.take`` and returns the same rows. ``grain.MapDataset.source(ReaderSource(r))``
    then works as any Grain source; Grain's ``MapDataset.batch`` asks for rows one at a time,
    so for throughput use :class:`BatchSource` or :class:`EpochDataset`.

    Parameters
    ----------
    path_or_reader : str, os.PathLike, list of them, or Reader
    fields : list of str, optional
        The fields of each row (default: all).
    storage_options : dict, optional
        For a URL, as :func:`rowstore.open` takes them (refused for a local path).

    The source pickles by path (the reader does), for Grain's worker processes, and is
    thread-safe (the reader is).
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        fields: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ):
        self.reader, _ = open_source(path_or_reader, storage_options)
        self.fields = None if fields is None else list(fields)
        self._schema = self.reader.schema.select(self.fields)

    def __len__(self) -> int:
        return len(self.reader)

    def __repr__(self) -> str:  # Grain's DataLoader checkpoints name the source by its repr
        return f"rowstore.grain.ReaderSource({self.reader.path!r}, fields={self.fields!r})"

    def _rows(self, batch: dict, n: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [{} for _ in range(n)]
        for f in self._schema:
            col = batch[f.name]
            nulls = batch[f.name + NULL_KEY] if f.nullable else None
            for i, row in enumerate(rows):
                row[f.name] = None if nulls is not None and nulls[i] else col[i]
        return rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"rows are indexed by int, got {type(index).__name__}")
        return self._rows(self.reader.take([index], fields=self.fields, varlen="ragged"), 1)[0]

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return self._rows(self.reader.take(idx, fields=self.fields, varlen="ragged"), len(idx))


class BatchSource:
    """A Grain ``RandomAccessDataSource`` whose items are whole batches.

    Item ``g`` is global batch ``g`` of an epoch order: positions ``[g * B, (g + 1) * B)`` of
    ``Reader.epoch(shuffle=..., seed=..., epoch=..., window=..., pieces=...)`` (the rows
    ``Reader.deal`` would give that batch), read by one ``Reader.take`` as a dict of batch
    arrays. ``grain.MapDataset.source(BatchSource(r, 64, seed=0)).shuffle(seed=1)`` reads
    whole batches in Grain's order; Grain's ``slice``/``mp_prefetch`` split the batches
    between processes and workers.

    Parameters
    ----------
    path_or_reader : str, os.PathLike, list of them, or Reader
    batch_size : int
    spec : EpochSpec, optional
        The order arguments as one object; the keywords ``order`` replace its values.
    **order
        ``shuffle``, ``seed``, ``epoch``, ``window``, ``pieces``, ``drop_last`` (leave out the
        last partial batch) as in ``docs/order.md``. Dealing (``shard``, ``pad``, ``unit``) is
        :class:`EpochDataset`'s; here Grain splits the items.
    fields : list of str, optional
    with_ids : bool
        Add ``"__id"`` (each row's dataset row number).
    varlen : {"padded", "ragged"}
        Variable-shape fields as zero-padded arrays plus ``"<name>__shape"`` (default: what JAX
        takes) or as :class:`~rowstore.reader.buffers.Ragged`.
    rows, predicate : optional
        A row subset (:meth:`Reader.keep_mask <rowstore.reader.Reader.keep_mask>`).
    storage_options : dict, optional
        For a URL, as :func:`rowstore.open` takes them (refused for a local path).

    Each item is read when Grain asks for it: in block mode a batch's rows come from a
    window of blocks, so compressed blocks are decoded once per batch that touches them
    (:class:`EpochDataset` decodes each once). Arrays handed out belong to the caller.
    """

    def __init__(
        self,
        path_or_reader: Any,
        batch_size: int,
        *,
        varlen: str = "padded",
        with_ids: bool = False,
        fields: Sequence[str] | None = None,
        spec: EpochSpec | None = None,
        rows: Any = None,
        predicate: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        **order: Any,
    ):
        self.reader, _ = open_source(path_or_reader, storage_options)
        self.batch_size = positive_int("batch_size", batch_size)
        spec = EpochSpec.make(spec, **order)
        no_decode("rowstore.grain.BatchSource", spec)
        if spec.shard != (0, 1) or spec.pad or spec.unit is not None:
            raise ValueError(
                "BatchSource items are the epoch's global batches: split them with Grain "
                "(slice, mp_prefetch) or deal them with EpochDataset(shard=..., pad=...)"
            )
        self.spec = spec.replace(keep=self.reader.keep_mask(rows, predicate))
        self.fields = None if fields is None else list(fields)
        self.reader.schema.select(self.fields)  # a field the file lacks: SchemaError now
        self.with_ids = bool(with_ids)
        if varlen not in ("padded", "ragged"):
            raise ValueError(f"varlen must be 'padded' or 'ragged', got {varlen!r}")
        self.varlen = varlen
        self._order: Any = None  # the EpochOrder, made on first use in each process

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_order": None}

    def _epoch_order(self) -> Any:
        if self._order is None:
            self._order = self.reader.epoch(keep=self.spec.keep, **self.spec.order_kwargs())
        return self._order

    def _plan(self) -> EpochPlan:
        return self.spec.plan(self.reader, self.batch_size)

    def __len__(self) -> int:
        return self._plan().num_batches

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"rowstore.grain.BatchSource({self.reader.path!r}, {self.batch_size}, "
            f"shuffle={s.shuffle!r}, seed={s.seed}, epoch={s.epoch}, window={s.window}, "
            f"pieces={s.pieces}, drop_last={s.drop_last}, fields={self.fields!r})"
        )

    def _read(self, g: int) -> dict[str, Any]:
        n = len(self)
        if not 0 <= g < n:
            raise IndexError(f"batch {g} out of range for {n} batches")
        lo, hi = self._plan().rows_of_batch(g)
        rows = self.reader.layout.rows_of(self._epoch_order().ids(lo, hi))
        b = self.reader.take(rows, fields=self.fields, varlen=self.varlen)
        if self.with_ids:
            b[ID_KEY] = rows
        return b

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"batches are indexed by int, got {type(index).__name__}")
        return self._read(int(index))

    def _getitems(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [self._read(int(g)) for g in indices]


# -- the dealt epoch pipeline -----------------------------------------------------------------
class EpochDataset(grain.IterDataset):
    """A ``grain.IterDataset`` of this process's batches of rowstore's epoch pipeline.

    Each epoch's global batches (``batch_size`` rows each, the per-process batch) are dealt to
    the ``shard=(rank, world)`` processes as ``Reader.deal`` deals them
    (:mod:`rowstore.reader.plan`); epochs ``epoch .. epoch + num_epochs - 1`` follow one
    another (``epoch=``, 0 by default; the order of epoch ``e`` is that of
    ``Reader.deal(epoch=e)``). Batches are dicts of numpy arrays, read and decoded by the
    reader's threads (the GIL released), ``prefetch`` segments ahead, so Grain's
    ``mp_prefetch`` is not needed; Grain transformations (``map``, ``filter``, thread
    prefetch...) may follow and keep the state.

    ``iter(ds)`` is an :class:`EpochIterator` at the start of epoch ``epoch``; its
    ``get_state()``/``set_state()`` save and restore where it stands (see there), with
    Grain's :class:`grain.checkpoint.CheckpointHandler` (Orbax) or :class:`CheckpointHandler`.

    Parameters
    ----------
    path_or_reader : str, os.PathLike, list of them, Reader or a ``rowstore.mix`` Mixture
    batch_size : int
        Rows per batch of this process (the global batch is ``world * batch_size``).
    spec : EpochSpec, optional
        The order arguments as one object; the keywords ``order`` replace its values.
    num_epochs : int or None
        Epochs of the pipeline (None: endless).
    **order
        The order arguments of a dealt epoch (``docs/order.md``): ``shuffle``, ``seed``,
        ``epoch`` (the first epoch read), ``window``, ``pieces``, ``shard`` (default:
        :func:`process_shard`), ``drop_last`` / ``pad`` (equal steps on every process, which
        ``jax.make_array_from_process_local_data`` and collectives need: pass one of them with
        more than one process), ``unit``. All but ``shard``, ``unit`` and ``epoch`` are part of
        the order a state is checked against; a state's epoch wins over ``epoch``.
    with_ids : bool
        Add ``"__id"`` (int64), each row's dataset row number.
    rows, predicate : optional
        A row subset (:meth:`Reader.keep_mask <rowstore.reader.Reader.keep_mask>`).
    storage_options : dict, optional
        For a URL, as :func:`rowstore.open` takes them (refused for a local path).
    fields : list of str, optional
    varlen : {"padded", "ragged"}
        Variable-shape fields as zero-padded arrays plus ``"<name>__shape"`` (default) or
        :class:`~rowstore.reader.buffers.Ragged`.
    num_threads, prefetch : int, optional
        Reader threads and segments read ahead (``Reader.deal``).
    quality : None, "log" or callable
        Report each epoch's shuffle quality when it starts.
    """

    def __init__(
        self,
        path_or_reader: Any,
        *,
        batch_size: int,
        spec: EpochSpec | None = None,
        num_epochs: int | None = 1,
        with_ids: bool = False,
        rows: Any = None,
        predicate: Any = None,
        fields: Sequence[str] | None = None,
        varlen: str = "padded",
        num_threads: int | None = None,
        prefetch: int = 2,
        quality: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        **order: Any,
    ):
        super().__init__()
        self.reader, _ = open_source(path_or_reader, storage_options)
        self.batch_size = positive_int("batch_size", batch_size)
        if "shard" in order and order["shard"] is not None:
            order["shard"] = as_pair("shard", order["shard"])
        elif spec is None or "shard" in order:
            order["shard"] = process_shard()
        spec = EpochSpec.make(spec, **order)
        spec = spec.replace(keep=self.reader.keep_mask(rows, predicate))
        self.spec = spec.replace(unit=spec.unit_for(self.reader, self.batch_size))
        self.num_epochs = positive_int("num_epochs", num_epochs, optional=True)
        self.with_ids = bool(with_ids)
        self.fields = None if fields is None else list(fields)
        # the fields and decode ops refused now, as the Reader refuses them (SchemaError)
        decoded_schema(self.reader.schema.select(self.fields), self.spec.decode)
        if varlen not in ("padded", "ragged"):
            raise ValueError(f"varlen must be 'padded' or 'ragged', got {varlen!r}")
        self.varlen = varlen
        self.num_threads = positive_int("num_threads", num_threads, optional=True)
        self.prefetch = positive_int("prefetch", prefetch)
        self.quality = check_quality(quality)

    @property
    def shard(self) -> tuple[int, int]:
        return self.spec.shard

    def __str__(self) -> str:
        s = self.spec
        return (
            f"rowstore.grain.EpochDataset({getattr(self.reader, 'path', self.reader)!r}, "
            f"batch_size={self.batch_size}, "
            f"shuffle={s.shuffle!r}, seed={s.seed}, shard={s.shard})"
        )

    def steps(self, epoch: int = 0, remaining: list | None = None) -> int:
        """This process's batches in ``epoch`` (or in what ``remaining`` leaves of it)."""
        return self.spec.replace(epoch=epoch).steps(self.reader, self.batch_size, remaining)

    def __iter__(self) -> EpochIterator:
        return EpochIterator(self)


class EpochIterator(OnStream, grain.DatasetIterator):
    """The iterator of an :class:`EpochDataset`: its batches in order, and where it stands.

    ``get_state()`` is rowstore's epoch state once every process took as many steps as this
    one (:class:`rowstore.reader.state.StreamState`: the epoch, the dataset's fingerprint
    and what the order depends on, and the epoch's global batches not yet delivered; plain
    JSON values). It is the same on every process, and ``set_state()`` on an iterator of an
    ``EpochDataset`` with *another* ``shard`` world (the same order arguments and
    ``batch_size``) deals exactly the batches not yet delivered: every row once across the
    interruption. A state of another dataset or order
    (seed, batch size...), or with an invalid field, is refused with
    :class:`~rowstore.errors.StateError` (a ``ValueError``) naming the field. States of
    ``rowstore.torch.ResumableDataLoader`` and ``rowstore.tf.Loader`` load here too.

    Not thread-safe (as Grain's iterators are not): one thread calls ``next`` and the state
    methods.
    """

    def __init__(self, dataset: EpochDataset):
        super().__init__()
        self._ds = dataset
        self.stream = EpochStream(
            dataset.reader, dataset.batch_size, dataset.spec, quality=dataset.quality
        )
        self._it: Iterator[Any] | None = None
        self._state: tuple[tuple[int, int], dict] | None = None

    def __str__(self) -> str:
        return f"EpochIterator({self._ds})"

    def __next__(self) -> dict[str, Any]:
        self._assert_not_closed()
        stream, ds = self.stream, self._ds
        if self._it is None:
            stop = None if ds.num_epochs is None else ds.spec.epoch + ds.num_epochs
            if stop is not None and stream.epoch >= stop:
                raise StopIteration
            stream.num_epochs = None if stop is None else stop - stream.epoch
            self._it = stream.batches(
                fields=ds.fields,
                with_ids=ds.with_ids,
                num_threads=ds.num_threads,
                prefetch=ds.prefetch,
                varlen=ds.varlen,
            )
        try:
            batch, stream.epoch, stream.steps = next(self._it)
        except StopIteration:
            self._it = None
            stream.seek(stream.run_stop)
            raise
        return batch

    def _drop(self) -> None:
        if self._it is not None:
            self._it.close()  # type: ignore[attr-defined]
            self._it = None

    def get_state(self) -> dict[str, Any]:
        """Where the iterator stands (see the class): a new dict of plain JSON values."""
        key = (self.stream.epoch, self.stream.steps)
        if self._state is None or self._state[0] != key:
            self._state = (key, self.stream.state_dict())
        return copy.deepcopy(self._state[1])

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a state of :meth:`get_state` (of any process, of any world), or of any
        other rowstore loader."""
        self._drop()
        self.stream.load_state_dict(state)
        self._state = None

    def close(self) -> None:
        """Stop the reader's threads of the epoch being read (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._drop()
        super().close()


# -- checkpoints ------------------------------------------------------------------------------
class CheckpointHandler(_GrainHandler):
    """Grain's checkpoint handler (``grain.checkpoint.CheckpointHandler``, the one Orbax's
    ``CheckpointManager`` uses for Grain iterators), restoring on another process count too.

    Saving is Grain's: process ``i`` of ``n`` writes ``process_{i}-of-{n}.json``. Restoring
    reads this process's file when there is one (the same process count); otherwise, for a
    rowstore epoch state (:class:`EpochIterator`'s, also through Grain transformations that
    pass their parent's state on), it reads the files of the saving run, checks that they hold
    one state (every process had taken the same steps) and loads it: the iterator then deals
    exactly the batches not yet delivered to the new process count. An iterator's files are
    read here, not by Grain: at most :data:`~rowstore.reader.state.MAX_STATE_BYTES` each and
    nested at most :data:`~rowstore.reader.state.MAX_STATE_DEPTH` levels deep
    (:func:`~rowstore.reader.state.loads_state`), so a hostile file is a
    :class:`~rowstore.errors.StateError`, not a ``RecursionError`` or an unbounded read.
    """

    def restore(self, directory: Any, item: Any = None, args: Any = None) -> Any:
        item = item or args.item
        from grain._src.core import sharding  # the pair Grain's save named the file by

        if not isinstance(item, grain.DatasetIterator):
            return super().restore(directory, item=item)  # Grain's DataLoader: its own bytes
        rank, world = sharding.get_process_index_and_count()
        mine = directory / f"process_{rank}-of-{world}.json"
        if mine.exists():
            item.set_state(_read_state(mine))
            item.start_prefetch()
            return item
        files = sorted(directory.glob("process_*-of-*.json"))
        if not files:
            raise StateError(f"no Grain iterator state (process_*-of-*.json) in {directory}")
        states = [_read_state(f) for f in files]
        state = states[0]
        if not isinstance(state, dict) or state.get("kind") != STATE_KIND:
            raise StateError(
                f"{directory} holds the states of another process count ({files[0].name}) "
                f"that are not rowstore epoch states: only those resume on {world} processes"
            )
        if any(s != state for s in states[1:]):
            raise StateError(
                f"the saved processes' states differ ({len(files)} files in {directory}): save "
                f"when every process took the same number of steps"
            )
        item.set_state(state)
        item.start_prefetch()
        return item


def _read_state(path: Any) -> Any:
    """A process's saved iterator state: at most ``MAX_STATE_BYTES`` of JSON, parsed with
    bounded nesting (:func:`~rowstore.reader.state.loads_state`)."""
    with path.open("rb") as f:
        data = f.read(MAX_STATE_BYTES + 1)
    return loads_state(data, str(path))


# Orbax's argument classes for the handler (as Grain registers its own): ``ocp.args.Composite(
# data=rowstore.grain.CheckpointSave(it))`` saves with it, ``CheckpointRestore(it)`` restores.
# Grain's module imports Orbax already when it is installed.
try:
    import orbax.checkpoint as _ocp
except ImportError:  # pragma: no cover - without Orbax the handler is used directly
    pass
else:

    @_ocp.args.register_with_handler(CheckpointHandler, for_save=True)
    @dataclasses.dataclass
    class CheckpointSave(_ocp.args.CheckpointArgs):
        """Orbax's save argument of a Grain iterator with :class:`CheckpointHandler`."""

        item: Any

    @_ocp.args.register_with_handler(CheckpointHandler, for_restore=True)
    @dataclasses.dataclass
    class CheckpointRestore(_ocp.args.CheckpointArgs):
        """Orbax's restore argument of a Grain iterator with :class:`CheckpointHandler` (any
        process count, for rowstore epoch states)."""

        item: Any

    __all__ += ["CheckpointSave", "CheckpointRestore"]


# -- JAX --------------------------------------------------------------------------------------
def global_batch(
    batch: Mapping[str, Any], sharding: Any, *, fields: Sequence[str] | None = None
) -> dict[str, Any]:
    """This process's batch as global ``jax.Array``\\ s: ``jax.make_array_from_process_local_data``
    of each field, split along the batch (first) dimension.

    Parameters
    ----------
    batch : dict of numpy arrays
        This process's rows (every process passes the same number of rows and the same keys:
        ``drop_last=True`` or ``pad=True`` in :class:`EpochDataset`).
    sharding : jax.sharding.Sharding or jax.sharding.Mesh
        The global arrays' sharding; a ``Mesh`` shards the batch dimension over all its axes
        (``NamedSharding(mesh, PartitionSpec(mesh.axis_names))``).
    fields : list of str, optional
        The keys to convert (default: all). A ``str``/``bytes`` (object) column or a ``Ragged``
        one (``varlen="ragged"``) is a ``TypeError`` naming it: leave it out with ``fields``.

    Returns
    -------
    dict of jax.Array
        Arrays of ``process_count * rows`` rows along the first dimension.
    """
    import jax

    if isinstance(sharding, jax.sharding.Mesh):
        spec = jax.sharding.PartitionSpec(tuple(sharding.axis_names))
        sharding = jax.sharding.NamedSharding(sharding, spec)
    out = {}
    for k in batch if fields is None else fields:
        v = batch[k]
        if isinstance(v, Ragged):
            raise TypeError(
                f"field {k!r} is Ragged (variable shape): read it with varlen='padded' or "
                f"leave it out with fields="
            )
        v = np.asarray(v)
        if v.dtype == object:
            raise TypeError(
                f"field {k!r} holds Python objects (str/bytes), which jax arrays cannot: leave "
                f"it out with fields="
            )
        out[k] = jax.make_array_from_process_local_data(sharding, v)
    return out
