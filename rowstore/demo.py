"""Demo datasets shaped like the workloads rowstore is built for (DESIGN.md section 1).

``make_demo(name, path, rows=None)`` writes one; ``python -m rowstore.demo`` writes the ``tiny``
demo into ``.cache/`` and prints ``rowstore info`` of it.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from rowstore.cli import info_text
from rowstore.schema import BYTES, STR, Field, Schema
from rowstore.writer.file import Writer

__all__ = ["DEMOS", "demo_schema", "make_demo", "default_cache_dir"]

#: name -> (default rows, description)
DEMOS = {
    "tiny": (2_000_000, "small tabular rows: float32[16] + int64 label (72-byte rows)"),
    "patch": (
        20_000,
        "weather patches: foo float64[9,9,27], bar int64[9,27], baz float64 (~19 KB rows)",
    ),
    "image": (2_000, "images: uint8[128,256,3] PNG + int64 label"),
    "speech": (20_000, "speech clips: variable float32 waveform, speaker and transcript str, bool"),
    "hello": (1_000, "hello world: id, PNG image 128x256x3, variable 4-D array (like Petastorm's)"),
}


def default_cache_dir() -> str:
    return os.environ.get("ROWSTORE_CACHE", os.path.join(os.getcwd(), ".cache", "rowstore"))


def demo_schema(name: str) -> Schema:
    if name == "tiny":
        return Schema([Field("x", "float32", (16,)), Field("label", "int64")])
    if name == "patch":
        return Schema(
            [
                Field("foo", "float64", (9, 9, 27)),
                Field("bar", "int64", (9, 27)),
                Field("baz", "float64"),
            ]
        )
    if name == "image":
        return Schema(
            [
                Field("image", "uint8", (128, 256, 3), codec={"id": "png", "level": 1}),
                Field("label", "int64"),
            ]
        )
    if name == "speech":
        return Schema(
            [
                Field("waveform", "float32", (None,)),
                Field("speaker", STR),
                Field("transcript", STR),
                Field("is_clean", "bool"),
            ]
        )
    if name == "hello":
        return Schema(
            [
                Field("id", "int64"),
                Field("image1", "uint8", (128, 256, 3), codec={"id": "png", "level": 1}),
                Field("array_4d", "uint8", (None, 128, 30, None)),
                Field("note", BYTES, nullable=True),
            ]
        )
    raise ValueError(f"unknown demo {name!r}; choose from {sorted(DEMOS)}")


def _image(rng: np.random.Generator, h: int, w: int, i: int) -> np.ndarray:
    # Smooth gradients plus noise: compresses like photos rather than like pure noise.
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None, None]
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    base = (y * 0.5 + x * 0.5 + i * 7) % 256
    img = base + rng.normal(0, 12, (h, w, 3)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_demo(
    name: str,
    path: str,
    rows: int | None = None,
    *,
    seed: int = 0,
    compression=None,
    block_bytes: int = 1 << 20,
    progress: bool = False,
) -> str:
    """Write demo dataset ``name`` with ``rows`` rows (default: DEMOS[name][0]) to ``path``."""
    schema = demo_schema(name)
    n = DEMOS[name][0] if rows is None else int(rows)
    rng = np.random.default_rng(seed)
    step = {"tiny": 100_000, "patch": 1_000, "image": 100, "speech": 500, "hello": 50}[name]
    with Writer(
        path, schema, compression=compression, block_bytes=block_bytes, attrs={"demo": name}
    ) as w:
        for a in range(0, n, step):
            m = min(step, n - a)
            if name == "tiny":
                w.write_batch(
                    {
                        "x": rng.standard_normal((m, 16), dtype=np.float32),
                        "label": rng.integers(0, 10, m),
                    }
                )
            elif name == "patch":
                w.write_batch(
                    {
                        "foo": rng.standard_normal((m, 9, 9, 27)),
                        "bar": rng.integers(0, 1000, (m, 9, 27)),
                        "baz": rng.standard_normal(m),
                    }
                )
            elif name == "image":
                w.write_batch(
                    {
                        "image": np.stack([_image(rng, 128, 256, a + j) for j in range(m)]),
                        "label": rng.integers(0, 1000, m),
                    }
                )
            elif name == "speech":
                lens = rng.integers(1_600, 32_000, m)  # 0.1-2 s at 16 kHz
                w.write_batch(
                    {
                        "waveform": [rng.standard_normal(k, dtype=np.float32) * 0.1 for k in lens],
                        "speaker": [f"speaker-{int(s):04d}" for s in rng.integers(0, 500, m)],
                        "transcript": [
                            " ".join(
                                ["hello", "wörld", "données"][int(t) % 3]
                                for t in rng.integers(0, 9, 4 + int(k) % 12)
                            )
                            for k in lens
                        ],
                        "is_clean": rng.random(m) < 0.8,
                    }
                )
            else:
                ids = np.arange(a, a + m)
                w.write_batch(
                    {
                        "id": ids,
                        "image1": np.stack([_image(rng, 128, 256, int(i)) for i in ids]),
                        "array_4d": [
                            rng.integers(0, 255, (int(d0), 128, 30, int(d3)), dtype=np.uint8)
                            for d0, d3 in rng.integers(1, 4, (m, 2))
                        ],
                        "note": [None if i % 5 else f"row {i}".encode() for i in ids],
                    }
                )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rowstore.demo",
        description="Write a demo dataset to the cache (once) and print its summary.",
        epilog="datasets: " + "; ".join(f"{k}: {v[1]}" for k, v in DEMOS.items()),
    )
    parser.add_argument("name", nargs="?", default="tiny", choices=sorted(DEMOS))
    parser.add_argument("rows", nargs="?", type=int, help="rows (default: the dataset's own)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    name, rows = args.name, args.rows
    if rows is not None and rows < 1:
        parser.error(f"rows must be >= 1, got {rows}")
    os.makedirs(default_cache_dir(), exist_ok=True)
    path = os.path.join(default_cache_dir(), f"{name}-{rows or DEMOS[name][0]}.h5")
    if not os.path.exists(path):
        print(f"writing demo dataset {name!r} to {path} ...", flush=True)
        make_demo(name, path, rows)
    print(info_text(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
