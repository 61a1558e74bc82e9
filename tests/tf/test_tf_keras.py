"""Keras ``model.fit`` through ``rowstore.tf.Loader``: a checkpoint written by a callback in the
middle of an epoch holds the model, the optimizer and the loader's position; restored into fresh
objects, the fit goes on with exactly the batches not yet trained and ends where an
uninterrupted fit ends."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = pytest.importorskip("tensorflow")

import rowstore  # noqa: E402
import rowstore.tf as rtf  # noqa: E402
from rowstore import Field, Schema  # noqa: E402

N, BATCH = 240, 16  # 15 steps an epoch
STEPS = N // BATCH
AT = 6  # the checkpoint is written once this many steps are trained


@pytest.fixture(scope="module")
def path(tmp_path_factory) -> str:
    p = str(tmp_path_factory.mktemp("keras") / "train.h5")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, 4)).astype(np.float32)
    schema = Schema([Field("id", "int64"), Field("x", "float32", (4,)), Field("y", "int64")])
    with rowstore.Writer(p, schema, rows_per_block=16) as w:
        w.write_batch(
            {"id": np.arange(N), "x": x, "y": (x @ rng.standard_normal((4, 3))).argmax(1)}
        )
    return p


def _loader(path: str) -> rtf.Loader:
    return rtf.Loader(path, batch_size=BATCH, seed=4, window=3, fields=["x", "y"], with_ids=True)


def _model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    m.compile(
        optimizer=tf.keras.optimizers.SGD(0.1),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    m.optimizer.build(m.trainable_variables)  # so that a restore finds its variables
    return m


def _xy(b):
    return b["x"], b["y"]


def _train(path: str, how: str, loader: rtf.Loader) -> tf.data.Dataset:
    if how == "map_fn":
        return loader.dataset(map_fn=_xy, num_parallel_calls=tf.data.AUTOTUNE)
    return loader.dataset().map(_xy)  # a map after the dataset: kept sequential


class _CheckpointAt(tf.keras.callbacks.Callback):
    """Writes ``ckpt`` once ``at`` steps are trained; records the loader's steps after each."""

    def __init__(self, ckpt, loader, at, where):
        super().__init__()
        self.ckpt, self.loader, self.at, self.where = ckpt, loader, at, where
        self.steps: list[int] = []
        self.written = None

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(self.loader.steps)
        if batch + 1 == self.at:
            self.written = self.ckpt.write(self.where)


@pytest.mark.parametrize("how", ["map_fn", "map_after"])
def test_fit_resumes_from_a_mid_epoch_checkpoint(path, tmp_path, how):
    order = [b["__id"].numpy().tolist() for b in _loader(path).dataset()]
    assert len(order) == STEPS

    # One epoch, uninterrupted, a checkpoint written after step AT by a callback.
    model, loader = _model(), _loader(path)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, data=loader)
    cb = _CheckpointAt(ckpt, loader, AT, str(tmp_path / "ck"))
    hist = model.fit(
        _train(path, how, loader),
        epochs=1,
        steps_per_epoch=STEPS,
        shuffle=False,
        verbose=0,
        callbacks=[cb],
    )
    assert len(hist.history["loss"]) == 1
    assert cb.steps == list(range(1, STEPS + 1))  # fit took one batch per step, none ahead
    assert loader.epoch == 0 and loader.steps == STEPS
    assert int(model.optimizer.iterations.numpy()) == STEPS
    whole = [w.numpy() for w in model.weights]

    # Restored into fresh objects: the model and optimizer as after step AT, the loader there.
    again, resumed = _model(), _loader(path)
    restored = tf.train.Checkpoint(model=again, optimizer=again.optimizer, data=resumed)
    restored.read(cb.written).assert_consumed()
    assert resumed.epoch == 0 and resumed.steps == AT and len(resumed) == STEPS - AT
    assert int(again.optimizer.iterations.numpy()) == AT
    peek = _loader(path)
    tf.train.Checkpoint(data=peek).read(cb.written)
    assert [b["__id"].numpy().tolist() for b in peek.dataset()] == order[AT:]  # not yet seen
    again.fit(
        _train(path, how, resumed), epochs=1, steps_per_epoch=len(resumed), shuffle=False, verbose=0
    )
    assert resumed.steps == STEPS and int(again.optimizer.iterations.numpy()) == STEPS
    for got, want in zip(again.weights, whole):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


class _SaveAtEpochEnd(tf.keras.callbacks.Callback):
    def __init__(self, ckpt, where, at):
        super().__init__()
        self.ckpt, self.where, self.at, self.written = ckpt, where, at, None

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            self.written = self.ckpt.write(self.where)


def test_endless_fit_in_chunks_resumes_across_an_epoch_boundary(path, tmp_path):
    """docs/tf.md's recipe: one endless dataset, Keras epochs of ``chunk`` steps as checkpoint
    intervals, ``initial_epoch`` from the optimizer's step count; the checkpoint falls one step
    into the loader's second epoch, and the resumed fit ends where the uninterrupted one did."""
    chunk, total = 4, 24

    def fit(model, loader, callbacks=()):
        done = int(model.optimizer.iterations.numpy())
        ds = loader.dataset(num_epochs=None, map_fn=_xy, num_parallel_calls=tf.data.AUTOTUNE)
        model.fit(
            ds,
            epochs=total // chunk,
            initial_epoch=done // chunk,
            steps_per_epoch=chunk,
            shuffle=False,
            verbose=0,
            callbacks=list(callbacks),
        )

    model, loader = _model(), _loader(path)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, data=loader)
    save = _SaveAtEpochEnd(ckpt, str(tmp_path / "ck"), at=3)  # after 16 steps: 15 + 1
    fit(model, loader, [save])
    assert (loader.epoch, loader.steps) == (1, total - STEPS)
    whole = [w.numpy() for w in model.weights]

    again, resumed = _model(), _loader(path)
    tf.train.Checkpoint(model=again, optimizer=again.optimizer, data=resumed).read(
        save.written
    ).assert_consumed()
    assert (resumed.epoch, resumed.steps) == (1, 1)
    assert int(again.optimizer.iterations.numpy()) == 16
    fit(again, resumed)
    assert (resumed.epoch, resumed.steps) == (1, total - STEPS)
    assert int(again.optimizer.iterations.numpy()) == total
    for got, want in zip(again.weights, whole):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_fit_trains_a_few_steps_and_learns(path):
    """A couple of Keras epochs over the loader (``num_epochs=None``: Keras' epoch e reads the
    loader's epoch e, a new order each); the loss goes down."""
    model, loader = _model(), _loader(path)
    ds = loader.dataset(num_epochs=None, map_fn=_xy)
    hist = model.fit(ds, epochs=3, steps_per_epoch=STEPS, shuffle=False, verbose=0)
    loss = hist.history["loss"]
    assert loss[-1] < loss[0]
    assert loader.epoch == 2 and loader.steps == STEPS  # the third epoch's last step


def test_map_fn_is_checked(path):
    loader = _loader(path)
    with pytest.raises(TypeError, match="map_fn"):
        loader.dataset(map_fn="x")
    with pytest.raises(ValueError, match="num_parallel_calls"):
        loader.dataset(num_parallel_calls=2)
