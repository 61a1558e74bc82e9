"""A Hugging Face image-classification DatasetDict -> rowstore -> shuffled batches -> back.

The DatasetDict is built here (nothing comes from the Hub): PNG images of three classes with a
``ClassLabel``, a train and a test split. ``from_huggingface`` writes one dataset directory per
split, each image's PNG bytes stored as they are (no decode, no re-encode), the class names in
the attributes; rowstore's reader decodes the images into batches on its threads;
``to_huggingface`` gives the DatasetDict back, the very same bytes.

    python examples/huggingface_images.py [OUT_DIR]
"""

import os
import sys
import tempfile

import imagecodecs
import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value

import rowstore

CLASSES = ["stripes", "checks", "dots"]


def picture(label: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[:32, :32]
    pattern = [yy % 8 < 4, (yy // 4 + xx // 4) % 2 == 0, (yy % 8 - 4) ** 2 + (xx % 8 - 4) ** 2 < 6]
    img = np.where(pattern[label][..., None], 200, 40) + rng.integers(0, 30, (32, 32, 3))
    return img.astype(np.uint8)


def split(n: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASSES), n)
    images = [imagecodecs.png_encode(picture(int(k), rng)) for k in labels]
    features = Features(
        {"image": Image(), "label": ClassLabel(names=CLASSES), "caption": Value("string")}
    )
    data = {
        "image": [{"bytes": b, "path": None} for b in images],
        "label": labels.tolist(),
        "caption": [f"a picture of {CLASSES[k]}" for k in labels],
    }
    return Dataset.from_dict(data, features=features)


def main(out_dir: str) -> None:
    dd = DatasetDict({"train": split(600, 0), "test": split(120, 1)})
    root = os.path.join(out_dir, "pictures")
    schemas = rowstore.from_huggingface(dd, root, batch_rows=256)
    f = schemas["train"]["image"]
    print("splits:", sorted(os.listdir(root)), "image field:", f.dtype, f.shape, f.codec["id"])

    with rowstore.open(os.path.join(root, "train")) as r:
        names = r.layout.user_attrs["huggingface"]["class_names"]["label"]
        print("rows:", len(r), "class names:", names)
        counts = np.zeros(len(names), int)
        for i, batch in enumerate(
            r.batches(64, shuffle="full", seed=1, num_threads=2, varlen="padded")
        ):
            counts += np.bincount(batch["label"], minlength=len(names))
            if i == 0:
                print("batch:", batch["image"].shape, batch["image"].dtype)
        print("epoch labels:", dict(zip(names, counts.tolist())))

    back = rowstore.to_huggingface(root)

    def stored(ds: Dataset) -> list:
        return [v["bytes"] for v in ds.cast_column("image", Image(decode=False))["image"]]

    same = stored(back["test"]) == stored(dd["test"])
    equal = back["train"].features == dd["train"].features
    sizes = {s: len(back[s]) for s in back}
    print("back:", sizes, "features equal:", equal, "test bytes identical:", same)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
