"""The resumable ``tf.data`` input: :class:`Loader`, a consumer's dealt part of each epoch
with a state that resumes on another number of workers."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from rowstore._check import nonneg_int, positive_int
from rowstore.errors import StateError
from rowstore.reader._args import varlen_modes
from rowstore.reader.epochs import EpochSpec, EpochStream
from rowstore.reader.image_ops import decoded_schema
from rowstore.reader.make_reader import open_source
from rowstore.reader.plan import EXTRA_KEYS, ID_KEY, PAD_KEY, SOURCE_KEY
from rowstore.reader.state import MAX_EPOCH, STATE_KIND, STATE_VERSION, StreamState, loads_state
from rowstore.tf._dataset import _Source
from rowstore.tf._signature import VARLEN_MODES, _BatchConverter, _pad_fn, output_signature

__all__ = ["Loader"]


# -- resumable input (rowstore.reader.plan) -----------------------------------------------------
class Loader(tf.Module):
    """A resumable ``tf.data`` input: this worker's part of each epoch's global batches, dealt
    as the torch loaders deal them (:mod:`rowstore.reader.plan`), with a state that resumes on
    another number of workers.

    ``loader = rowstore.tf.Loader(path, batch_size=64, seed=0, shard=(i, n))``; ``ds =
    loader.dataset(num_epochs=...)`` reads from where the loader stands. The loader is a
    ``tf.Module``: its progress lives in ``tf.Variable``\\ s, so ``tf.train.Checkpoint(model=m,
    data=loader)`` saves and restores it beside the model; :meth:`state_dict` /
    :meth:`load_state_dict` give the same state as plain Python (JSON), which
    :class:`rowstore.torch.BatchedDataLoader` reads too. The state is the same on every worker
    that took the same number of steps and resumes on any ``shard`` count.

    Progress counts the batches the dataset hands out: the dataset's last step records it, and
    tf.data's automatic prefetch at the end and its parallelizing of later maps are turned off
    (``inject_prefetch=False``, ``map_parallelization=False``), so a batch counts when your
    loop receives it. Keras ``fit`` (one step per execution, no distribution strategy) takes
    one batch per step, so a checkpoint written in a callback after step ``k`` resumes at batch
    ``k + 1``; give the transform to ``fit``'s ``(x, y)`` as :meth:`dataset`'s ``map_fn``
    (it may run in parallel there, before the count). Distribution strategies and
    ``steps_per_execution > 1`` read ahead of the step they train; there, save the state
    returned by :meth:`state_at` for the step you trained (``batch["__step"]``).

    Parameters
    ----------
    path_or_reader, batch_size, fields, varlen, num_threads, storage_options
        As in :func:`make_dataset`.
    spec : EpochSpec, optional
        The order arguments as one object; the keywords ``order`` replace its values.
    **order
        The order arguments of a dealt epoch, with the meanings of ``docs/order.md``:
        ``shuffle``, ``seed``, ``window``, ``pieces``, ``shard`` (this worker's dealt part,
        default (0, 1)), ``drop_last``/``pad`` (equal steps), ``unit``, ``decode`` (image ops
        of jpeg fields, ``{field: RandomResizedCrop(224)}``: fixed-size uint8 images,
        :mod:`rowstore.reader.image_ops`). All but ``unit`` are
        part of the order: a state (or a ``tf.train.Checkpoint``) resumes only with the same
        values (one saved before ``pieces`` existed is a ``pieces=1`` state).
    with_ids : bool
        Add ``"__id"`` (int64), each row's dataset row number.
    rows, predicate : optional
        A row subset (see :meth:`Reader.keep_mask <rowstore.reader.Reader.keep_mask>`).
    quality : None, "log" or callable
        Report each epoch's shuffle quality when its first batch is read.

    Elements also hold ``"__epoch"`` and ``"__step"`` (int64 scalars: the epoch and this
    worker's steps taken in it once the batch is handed out).
    """

    def __init__(
        self,
        path_or_reader: _Source,
        *,
        batch_size: int,
        spec: EpochSpec | None = None,
        with_ids: bool = False,
        rows: Any = None,
        predicate: Any = None,
        fields: Sequence[str] | None = None,
        varlen: str | Mapping[str, str] = "ragged",
        num_threads: int | None = None,
        quality: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        **order: Any,
    ):
        super().__init__(name="rowstore_loader")
        self.reader, _ = open_source(path_or_reader, storage_options)
        self.batch_size = positive_int("batch_size", batch_size)
        spec = EpochSpec.make(spec, **order)
        spec = spec.replace(keep=self.reader.keep_mask(rows, predicate))
        self.stream = EpochStream(self.reader, self.batch_size, spec, quality=quality)
        self.shard = spec.shard
        self.unit = self.stream.unit
        self.with_ids = bool(with_ids)
        self.fields = fields
        self.num_threads = positive_int("num_threads", num_threads, optional=True)
        self._schema = decoded_schema(self.reader.schema.select(fields), self.spec.decode)
        self._modes = varlen_modes(varlen, self._schema, modes=VARLEN_MODES, default="ragged")
        self._epoch = tf.Variable(self.stream.epoch, dtype=tf.int64, trainable=False, name="epoch")
        self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self._base_epoch = tf.Variable(-1, dtype=tf.int64, trainable=False, name="base_epoch")
        # JSON {"version", "order": what the order depends on, "remaining": the resumed epoch's
        # remaining batches}: a tf.train.Checkpoint holds the order key, so restoring one of
        # another dataset or order is refused as load_state_dict refuses it (both through
        # StreamState). Checkpoints saved before the order key was kept here hold "" or the bare
        # remaining list (taken as this loader's order); those saved before it named the
        # dataset, no "version" (a version-2 state).
        self._base = tf.Variable(
            self._base_json(None), dtype=tf.string, trainable=False, name="base"
        )

    # The order arguments, as the stream's spec holds them.
    spec = property(lambda self: self.stream.spec)
    quality = property(lambda self: self.stream.quality)
    shuffle = property(lambda self: self.spec.shuffle)
    seed = property(lambda self: self.spec.seed)
    # The window and pieces the reader resolved (the defaults decided for its file).
    window = property(lambda self: self.spec.resolve(self.reader).window)
    pieces = property(lambda self: self.spec.resolve(self.reader).pieces)
    drop_last = property(lambda self: self.spec.drop_last)
    pad = property(lambda self: self.spec.pad)
    _keep = property(lambda self: self.spec.keep)

    # -- state ---------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return int(self._epoch.numpy())

    @property
    def steps(self) -> int:
        """Batches handed out in the current epoch (since the state it resumed from)."""
        return int(self._steps.numpy())

    def _plan(self, remaining: list | None):
        return self.spec.plan(self.reader, self.batch_size, remaining)

    def _order_key(self) -> dict:
        return self.spec.order_key(self.reader, self.batch_size)

    def _base_json(self, remaining: list | None, lanes: int | None = None) -> str:
        base = {"version": STATE_VERSION, "order": self._order_key(), "remaining": remaining}
        if lanes is not None:
            base["lanes"] = lanes
        return json.dumps(base, sort_keys=True)

    def _restored(self) -> tuple[StreamState, int | None, bool]:
        """The state the variables hold (a restored ``tf.train.Checkpoint``'s too), through
        :class:`StreamState` (every field checked, ``StateError`` otherwise), and whether the
        variable holds the current format (else :meth:`_check_order` rewrites it)."""
        where = "the tf.train.Checkpoint of a rowstore.tf.Loader"
        text = self._base.numpy()
        v = loads_state(text, where) if text else None
        base_epoch = int(self._base_epoch.numpy())
        for name, var, low in (("epoch", self._epoch, 0), ("steps", self._steps, 0)):
            value = int(var.numpy())
            if not low <= value < MAX_EPOCH:
                raise StateError(
                    f"{where}: its {name} variable holds {value}, not in [{low}, {MAX_EPOCH})",
                    field=name,
                )
        if isinstance(v, dict):
            extra = sorted(set(v) - {"order", "remaining", "version", "lanes"})
            if "order" not in v or extra or not isinstance(v["order"], dict):
                raise StateError(
                    f"{where}: its base variable is not a rowstore state (keys {sorted(v)})",
                    field="base",
                )
            order, remaining, version = v["order"], v.get("remaining"), v.get("version", 2)
            lanes = v.get("lanes")
            if lanes is not None and not (
                isinstance(lanes, int) and not isinstance(lanes, bool) and 0 < lanes < MAX_EPOCH
            ):
                raise StateError(f"{where}: its lanes must be a positive int", field="lanes")
        else:  # saved before the order key was kept: "" or the remaining list
            order, remaining, version, lanes = self._order_key(), v, STATE_VERSION, None
        state = {
            **order,
            "kind": STATE_KIND,
            "version": version,
            "epoch": base_epoch if base_epoch != -1 else int(self._epoch.numpy()),
            "remaining": remaining,
        }
        st = StreamState.from_json(state)
        return st, lanes, isinstance(v, dict) and st.version == STATE_VERSION

    def _check_order(self) -> None:
        """Set the stream where the variables say (a restored ``tf.train.Checkpoint``'s too):
        ``StateError`` if they were saved for another dataset or order, or hold an invalid
        field; a checkpoint from before the order key was saved is taken as this loader's
        order."""
        st, lanes, current = self._restored()
        stream = self.stream
        stream.spec = stream.spec.adopt(st)
        st.check(self._order_key(), batches=self._plan(None).num_batches)
        base_epoch = int(self._base_epoch.numpy())
        stream.epoch, stream.steps = self.epoch, self.steps
        stream._base = None if base_epoch == -1 else (base_epoch, st.remaining, lanes)
        most = stream.epoch_steps(stream.epoch)
        if self.steps > most:
            raise StateError(
                f"the tf.train.Checkpoint of a rowstore.tf.Loader: its steps variable holds "
                f"{self.steps}, more than the {most} steps of this worker's epoch {self.epoch}",
                field="steps",
            )
        if not current:  # from now on the variable holds this loader's order key
            self._base.assign(self._base_json(st.remaining, lanes))

    def state_at(self, epoch: int, steps: int) -> dict:
        """The state once every worker took ``steps`` batches of ``epoch`` (plain Python)."""
        self._check_order()
        return self.stream.state_dict(epoch=int(epoch), steps=int(steps))

    def state_dict(self) -> dict:
        """Where the input stands (see the class): plain Python values, JSON friendly."""
        return self.state_at(self.epoch, self.steps)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state of any rowstore loader, any worker of any worker count: the next
        :meth:`dataset` deals exactly the batches not yet delivered (in the saved run's order
        on the same worker count). :class:`~rowstore.errors.StateError` if a field is invalid
        or the state is for another dataset or order."""
        stream = self.stream
        stream.load_state_dict(state)
        base = stream._base
        self._epoch.assign(stream.epoch)
        self._steps.assign(stream.steps)
        self._base_epoch.assign(-1 if base is None else base[0])
        self._base.assign(self._base_json(*(base[1:] if base is not None else (None, None))))

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning at the next :meth:`dataset`."""
        self._epoch.assign(nonneg_int("epoch", epoch))
        self._steps.assign(0)
        self._base_epoch.assign(-1)

    def __len__(self) -> int:
        """Steps of the current epoch still to take (this worker)."""
        self._check_order()
        return self.stream.epoch_steps(self.epoch) - self.steps

    # -- the dataset ---------------------------------------------------------------------------
    def dataset(
        self,
        num_epochs: int | None = 1,
        *,
        map_fn: Callable[[dict], Any] | None = None,
        num_parallel_calls: int | None = None,
    ) -> tf.data.Dataset:
        """Batches from where the loader stands, for ``num_epochs`` epochs (the current one
        counts; None: endless). Recording progress is the dataset's last step.

        Parameters
        ----------
        num_epochs : int or None
        map_fn : callable, optional
            Applied to each element (the dict of tensors) before its progress is recorded, so
            the elements are what it returns: ``lambda b: (b["x"], b["label"])`` for Keras
            ``fit``. A transform applied after the dataset instead runs sequentially (later
            maps are not parallelized) but an explicit ``prefetch`` or ``num_parallel_calls``
            there reads batches ahead of your loop and the state counts them as taken.
        num_parallel_calls : int, optional
            ``map_fn``'s parallelism (``tf.data.AUTOTUNE``...; None: sequential), in order.
        """
        positive_int("num_epochs", num_epochs, optional=True)
        if map_fn is not None and not callable(map_fn):
            raise TypeError(f"map_fn must be callable, got {type(map_fn).__name__}")
        if map_fn is None and num_parallel_calls is not None:
            raise ValueError("num_parallel_calls applies to map_fn; none was given")
        self._check_order()
        schema, modes = self._schema, self._modes
        variable = [f for f in schema if f.is_variable]
        padded = [f for f in variable if modes[f.name] == "padded"]
        sig = output_signature(schema, batch_size=self.batch_size, varlen=modes)
        for f in variable:
            sig[f.name] = f.tf_spec(-1, ragged=True)
        if self.with_ids:
            sig[ID_KEY] = tf.TensorSpec((None,), tf.int64)
        if self.pad:
            sig[PAD_KEY] = tf.TensorSpec((None,), tf.bool)
        if getattr(self.reader, "with_source", False):  # a rowstore.mix Mixture
            sig[SOURCE_KEY] = tf.TensorSpec((None,), tf.int64)
        sig["__epoch"] = tf.TensorSpec((), tf.int64)
        sig["__step"] = tf.TensorSpec((), tf.int64)
        convert = _BatchConverter(schema, modes, False)
        stream = self.stream
        e0, s0, base0 = stream.epoch, stream.steps, stream._base
        names = schema.names

        def generate():
            stream.epoch, stream.steps, stream._base = e0, s0, base0
            stream.num_epochs = num_epochs
            it = stream.batches(
                fields=names, with_ids=self.with_ids, num_threads=self.num_threads, varlen="ragged"
            )
            try:
                for b, epoch, step in it:
                    out = convert(b)
                    for k in EXTRA_KEYS:
                        if k in b:
                            out[k] = b[k]
                    out["__epoch"] = np.int64(epoch)
                    out["__step"] = np.int64(step)
                    yield out
            finally:
                it.close()

        ds = tf.data.Dataset.from_generator(generate, output_signature=sig)
        if padded:
            ds = ds.map(_pad_fn(padded))
        ds = ds.prefetch(2)
        epoch_v, steps_v = self._epoch, self._steps

        def record(epoch, step, el):
            epoch_v.assign(epoch)
            steps_v.assign(step)
            return el

        if map_fn is None:
            ds = ds.map(lambda el: record(el["__epoch"], el["__step"], el))
        else:
            par = {} if num_parallel_calls is None else {"deterministic": True}
            ds = ds.map(
                lambda el: (el["__epoch"], el["__step"], map_fn(el)),
                num_parallel_calls=num_parallel_calls,
                **par,
            ).map(record)
        # Nothing after the recording step may read ahead of the consumer unasked: no prefetch
        # injected at the end, and a stateless map after it (Keras' (x, y) split) stays
        # sequential rather than becoming a parallel map with a buffer of batches read ahead.
        opts = tf.data.Options()
        opts.experimental_optimization.inject_prefetch = False
        opts.experimental_optimization.map_parallelization = False
        return ds.with_options(opts)
