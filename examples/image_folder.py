"""A folder of PNG files (one folder per class) to a dataset in one call, bytes as they are.

Run: python examples/image_folder.py [DIR]

Makes DIR/photos/<class>/<n>.png, writes DIR/photos_ds with rowstore.from_images (worker
processes write the shards, one commit publishes them), checks that the stored payloads are
the files' bytes, and reads a shuffled batch.
"""

import os
import sys
import tempfile

import imagecodecs
import numpy as np

import rowstore
from rowstore.reader.raw import RawSource


def make_folder(root: str, per_class: int = 200) -> None:
    y, x = np.mgrid[0:32, 0:32]
    for k, name in enumerate(["cat", "dog", "bird"]):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            img = np.stack([x * (k + 1), y * 4, (x + y + i) % 256], axis=-1).astype(np.uint8)
            with open(os.path.join(root, name, f"{i:04d}.png"), "wb") as f:
                f.write(imagecodecs.png_encode(img))


def main() -> None:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    src, dest = os.path.join(out_dir, "photos"), os.path.join(out_dir, "photos_ds")
    make_folder(src)

    report = rowstore.from_images(src, dest, workers=2)  # every file checked, then stored
    print(report.schema)
    print(report.summary())

    with rowstore.open(dest) as r:
        print(
            f"{len(r)} images in {r.layout.num_shards} shards, "
            f"classes {r.layout.user_attrs['images']['classes']}"
        )
        batch = next(r.batches(64, shuffle=True, seed=0))
        print("batch:", batch["image"].shape, batch["image"].dtype, np.bincount(batch["label"]))
        first = r[0]

    # the stored payload of row 0 is the file's bytes, unchanged
    with RawSource(dest) as raw:
        rows = raw.block(0)
        ref = rows.rows["image"][0]
        stored = rows.heap[ref["offset"] - rows.origin :][: ref["nbytes"]].tobytes()
    with open(os.path.join(src, first["path"]), "rb") as f:
        print("stored as they are:", stored == f.read())


if __name__ == "__main__":  # worker processes are spawned: they import this file
    main()
