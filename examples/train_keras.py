"""Train a small Keras model from a rowstore file through tf.data.

1. ``rowstore.tf.repeat_epochs``: one dataset covering N epochs, each in its own shuffled order,
   fed to ``model.fit(..., epochs=N, steps_per_epoch=...)`` (Keras re-iterating a one-epoch
   dataset would replay the same order every epoch).
2. ``make_dataset(..., epoch=e)`` per epoch, in a custom training loop.
3. A variable-length field, batched as a ``tf.RaggedTensor`` (or padded with its lengths).

Run: python examples/train_keras.py [DIR]     (CPU; a few seconds)
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # quiet TensorFlow's C++ logs
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import rowstore  # noqa: E402
import rowstore.tf as rtf  # noqa: E402


def write_dataset(path: str, rows: int = 8192) -> None:
    """Rows of 16 features whose label (4 classes) is a fixed linear function of them, plus a
    variable-length sequence whose mean is one of the features."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((rows, 16)).astype(np.float32)
    schema = rowstore.Schema(
        [
            rowstore.Field("x", "float32", (16,)),
            rowstore.Field("label", "int64"),
            rowstore.Field("seq", "float32", (None,)),
            rowstore.Field("source", rowstore.STR),
        ]
    )
    with rowstore.Writer(path, schema) as writer:
        writer.write_batch(
            {
                "x": x,
                "label": (x @ w).argmax(axis=1),
                "seq": [np.full(1 + i % 9, x[i, 0], np.float32) for i in range(rows)],
                "source": [f"sensor-{i % 7}" for i in range(rows)],
            }
        )


def make_model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((16,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.SGD(0.2),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def features_and_label(batch: dict) -> tuple[tf.Tensor, tf.Tensor]:
    return batch["x"], batch["label"]


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "train.h5")
    write_dataset(path)
    batch_size, epochs = 256, 3

    # The element spec comes from the file's schema: no FixedLenFeature boilerplate.
    one_epoch = rtf.make_dataset(path, batch_size=batch_size, seed=0)
    print(
        "element_spec:",
        {k: (v.shape.as_list(), v.dtype.name) for k, v in one_epoch.element_spec.items()},
    )
    steps = int(one_epoch.cardinality())

    # 1. Keras fit over several epochs, a new order each epoch (seed, epoch) -> order.
    model = make_model()
    train = rtf.repeat_epochs(path, epochs, batch_size=batch_size, seed=0, fields=["x", "label"])
    # With steps_per_epoch, Keras keeps one iterator across its epochs (epoch e of the fit reads
    # rowstore epoch e); shuffle=False: the order is rowstore's, Keras cannot shuffle a dataset.
    hist = model.fit(
        train.map(features_and_label),
        epochs=epochs,
        steps_per_epoch=steps,
        shuffle=False,
        verbose=0,
    )
    loss, acc = hist.history["loss"], hist.history["accuracy"]
    print(
        f"fit: {epochs} epochs x {steps} steps, loss {loss[0]:.3f} -> {loss[-1]:.3f}, accuracy "
        f"{acc[-1]:.3f}"
    )

    # 2. A custom loop, one make_dataset per epoch (epoch=e gives that epoch's order).
    model = make_model()
    first_labels = []
    for epoch in range(2):
        ds = rtf.make_dataset(
            path, batch_size=batch_size, seed=0, epoch=epoch, fields=["x", "label"]
        )
        for step, batch in enumerate(ds):
            logs = model.train_on_batch(batch["x"], batch["label"], return_dict=True)
            if step == 0:
                first_labels.append(batch["label"][:8].numpy().tolist())
        print(f"epoch {epoch}: loss {logs['loss']:.3f}, first labels {first_labels[-1]}")

    # 3. Variable-length data: ragged by default, or padded plus "<name>__shape".
    ragged = next(iter(rtf.make_dataset(path, batch_size=4, fields=["seq"], shuffle="none")))["seq"]
    padded = next(
        iter(rtf.make_dataset(path, batch_size=4, fields=["seq"], shuffle="none", varlen="padded"))
    )
    print("ragged seq lengths:", ragged.row_lengths().numpy().tolist())
    print(
        "padded seq shape:",
        padded["seq"].shape.as_list(),
        "lengths:",
        padded["seq__shape"][:, 0].numpy().tolist(),
    )
    print(
        "ragged mean == padded sum / length:",
        bool(
            np.allclose(
                tf.reduce_mean(ragged, axis=1),
                tf.reduce_sum(padded["seq"], axis=1)
                / tf.cast(padded["seq__shape"][:, 0], tf.float32),
            )
        ),
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
