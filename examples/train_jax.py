"""Train a small pure-JAX model from a rowstore dataset through Grain, checkpointed with Orbax.

1. ``rowstore.grain.EpochDataset``: this process's dealt batches of each epoch as a Grain
   ``IterDataset``; ``rowstore.grain.global_batch`` turns them into global ``jax.Array``\\ s on
   a mesh of all devices (``jax.make_array_from_process_local_data``).
2. Mid-epoch, Orbax saves the parameters and the Grain iterator's state (rowstore's
   arguments for Grain's handler: ``rg.CheckpointSave``, which also restores on another
   number of processes); a "restarted" job restores both and trains on exactly the batches
   that were left.
3. Evaluation reads whole batches through Grain's ``MapDataset`` over ``BatchSource``.

Run: python examples/train_jax.py [DIR]     (CPU; a few seconds. More CPU devices:
XLA_FLAGS=--xla_force_host_platform_device_count=2)
"""

import os
import sys
import tempfile

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import rowstore
import rowstore.grain as rg

BATCH = 64  # rows per process and step


def write_dataset(path: str, rows: int = 8192) -> None:
    """Rows of 16 features whose label (4 classes) is a fixed linear function of them."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((rows, 16)).astype(np.float32)
    schema = rowstore.Schema(
        [
            rowstore.Field("x", "float32", (16,)),
            rowstore.Field("label", "int32"),
            rowstore.Field("source", rowstore.STR),
        ]
    )
    with rowstore.Writer(path, schema, rows_per_block=256) as writer:
        writer.write_batch(
            {
                "x": x,
                "label": (x @ w).argmax(axis=1),
                "source": [f"sensor-{i % 7}" for i in range(rows)],
            }
        )


def init_params(key) -> dict:
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (16, 32)) * 0.25,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 4)) * 0.25,
        "b2": jnp.zeros(4),
    }


def logits(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    logp = jax.nn.log_softmax(logits(params, x))
    return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.2 * g, params, grads), loss


def make_data(path: str) -> rg.EpochDataset:
    # Equal steps on every process (drop_last) is what make_array_from_process_local_data and
    # the collectives of a multi-process job need; the shard is (process_index, process_count).
    return rg.EpochDataset(
        path,
        batch_size=BATCH,
        seed=0,
        window=8,
        num_epochs=2,
        drop_last=True,
        fields=["x", "label"],
    )


def train(params, it, mesh, steps=None) -> tuple[dict, list[float], int]:
    losses, n = [], 0
    for b in it:
        g = rg.global_batch(b, mesh)
        params, loss = train_step(params, g["x"], g["label"])
        losses.append(float(loss))
        n += len(b["x"])
        if steps is not None and len(losses) == steps:
            break
    return params, losses, n


def main(workdir: str) -> None:
    path = os.path.join(workdir, "train.h5")
    write_dataset(path)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    print(f"{jax.process_count()} process(es), {len(jax.devices())} device(s)")

    # 1. Train for 150 steps (epoch 0 has 8192 / 64 = 128), then checkpoint.
    params = jax.device_put(init_params(jax.random.key(0)), replicated)
    it = iter(make_data(path))
    params, first, n1 = train(params, it, mesh, steps=150)
    ckpt = os.path.join(workdir, "ckpt")
    with ocp.CheckpointManager(ckpt) as mngr:
        mngr.save(
            150,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), data=rg.CheckpointSave(it)
            ),
        )
        mngr.wait_until_finished()
    print(f"checkpoint at step 150: epoch {it.epoch}, {it.steps} steps into it")

    # 2. A new job: restore the parameters and the data iterator, train to the end.
    it2 = iter(make_data(path))
    with ocp.CheckpointManager(ckpt) as mngr:
        restored = mngr.restore(
            mngr.latest_step(),
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(
                    jax.device_put(init_params(jax.random.key(1)), replicated)
                ),
                data=rg.CheckpointRestore(it2),
            ),
        )
    params = restored["params"]
    left = make_data(path).steps(it2.epoch, it2.get_state()["remaining"])
    print(f"resumed at epoch {it2.epoch}: {left} batches left in it")
    params, rest, n2 = train(params, it2, mesh)
    losses = first + rest
    a, b = np.mean(losses[:10]), np.mean(losses[-10:])
    print(f"{n1 + n2} rows in 2 epochs, loss {a:.3f} -> {b:.3f}")

    # 3. Accuracy over whole batches read through Grain (one Reader.take per batch).
    source = rg.BatchSource(path, 512, shuffle="none", fields=["x", "label"])
    right = total = 0
    for b in grain.MapDataset.source(source).to_iter_dataset():
        pred = np.asarray(jnp.argmax(logits(params, b["x"]), axis=1))
        right += int((pred == b["label"]).sum())
        total += len(pred)
    print(f"accuracy {right / total:.3f} on {total} rows")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
