"""Petastorm's hello world, the rowstore way: a Spark DataFrame written on the executors, then
trained from in torch through a converter.

Petastorm's example makes rows of an id, a 128x256x3 PNG image and a variable-shape 4-D array
with ``dict_to_spark_row`` and writes them with ``materialize_dataset``; here
:func:`rowstore.spark.to_row` makes the Spark rows (arrays as ``.npy`` cells, the image as its
PNG bytes) and :func:`rowstore.spark.to_rowstore` writes each partition on its executor and
commits once. The dataset is read back with :func:`rowstore.make_reader` (Petastorm's idiom). Then
:func:`rowstore.spark.make_converter` caches a DataFrame of features for training and a small
torch model trains a few steps from ``converter.make_torch_dataloader``.

    python examples/spark_petastorm_hello.py [OUT_DIR]
"""

import os
import sys
import tempfile

import numpy as np

import rowstore
from rowstore import Field, Schema

ROWS = 24
HelloSchema = Schema(
    [
        Field("id", "int32"),
        Field("image1", "uint8", (128, 256, 3), codec="png"),
        Field("array_4d", "uint8", (None, 16, 8, None)),  # variable first and last dimensions
    ]
)


def row_generator(i: int) -> dict:
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:128, 0:256]
    image = np.stack([(x + i) % 256, (y * 2) % 256, np.full_like(x, i * 10 % 256)], axis=-1).astype(
        np.uint8
    )
    return {
        "id": i,
        "image1": image,
        "array_4d": rng.integers(0, 255, (1 + i % 3, 16, 8, 1 + i % 4), dtype=np.uint8),
    }


def main(out: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import rowstore.spark as rsp

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("rowstore-hello")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        # 1. Write: rows as Spark rows (to_row checks each value against the schema), then one
        #    shard per partition, written where the partition is.
        rows = spark.sparkContext.parallelize(range(ROWS), 2).map(
            lambda i: rsp.to_row(HelloSchema, row_generator(i))
        )
        df = spark.createDataFrame(rows, rsp.spark_schema(HelloSchema))
        path = os.path.join(out, "hello_world_dataset")
        version = rsp.to_rowstore(df, "file://" + path, schema=HelloSchema)
        with rowstore.open(path) as r:
            print(f"wrote version {version}: {len(r)} rows in {r.layout.num_shards} shards")

        # 2. Read as Petastorm does (rows as named tuples).
        with rowstore.make_reader("file://" + path, shuffle=False) as reader:
            for row in reader:
                assert (row.image1 == row_generator(row.id)["image1"]).all()
                assert (row.array_4d == row_generator(row.id)["array_4d"]).all()
        print(
            f"make_reader: every row equals what was written (image1 {row.image1.shape}, last "
            f"array_4d "
            f"{row.array_4d.shape})"
        )

        # 3. Train from a DataFrame through the converter: cached once, then torch batches.
        feats = spark.range(0, 256, numPartitions=2).selectExpr(
            "transform(sequence(0, 7), k -> cast(sin(id * (k + 1)) as float)) as features",
            "cast(id % 2 as long) as label",
        )
        converter = rsp.make_converter(feats, cache_dir="file://" + os.path.join(out, "cache"))
        print(f"converter: {len(converter)} rows cached")
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        with converter.make_torch_dataloader(batch_size=32, num_epochs=3) as loader:
            for batch in loader:
                x = batch["features"]
                loss = torch.nn.functional.cross_entropy(model(x), batch["label"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        print(f"trained {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        again = rsp.make_converter(feats, cache_dir="file://" + os.path.join(out, "cache"))
        print(f"converting again reuses the cache: {again.cached}")
        converter.delete()
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="rowstore-hello-"))
