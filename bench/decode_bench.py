"""Images and compressed blocks: the reader against the decoders alone
and tf.data, and LZ4 block reads against uncompressed ones, on the same data in the same run.

    python bench/decode_bench.py [--quick] [--rounds 3] [--out bench/results/decode_bench.json]
    [--doc docs/performance.md]

Images: the ``image`` demo (128x256x3 uint8, PNG level 1) and the same images stored as JPEG
(quality 90). Measured, each in a fresh process, in ``--rounds`` interleaved rounds (the order
reversed every other round) of ``repeats`` epochs after one warm-up epoch:

* the decoders alone, one thread, on the file's own PNG payloads (held in memory) into one
  preallocated array: imagecodecs ``png_decode`` (libpng), ``spng_decode``, PIL, rowstore's
  PNG kernel (``kernels.png_decode_batch``, one call for all images), and for JPEG imagecodecs
  ``jpeg8_decode`` (libjpeg-turbo) and PIL; the fastest PNG decoder also on 2 threads;
* the reader: ``Reader.batches`` (block shuffle, batch 64) on 1 and 2 threads, PNG through the
  kernel and (``codec path``) through imagecodecs image by image, as before the kernel;
* tf.data: ``from_tensor_slices(payloads).shuffle().map(tf.io.decode_png or decode_jpeg,
  num_parallel_calls=AUTOTUNE).batch(64).prefetch(AUTOTUNE)`` consumed in the graph
  (``Dataset.reduce``), and the same map on one thread (``private_threadpool_size=1``).

Conversion (``--parts convert``): the image demo's images saved by PIL as RGB (YCbCr 4:2:0),
greyscale and CMYK (Adobe) JPEGs (quality 90), each set in a file with one field of
``(128, 256, 3)``, read with ``Reader.batches`` (block shuffle, batch 64, 1 thread) whole
(``-whole``: the codec's kernel decode, grey and CMYK converted to RGB in it) and through
``decode=RandomResizedCrop(112)`` (``-rrc``): the read path with conversion against the one
without it.

Compressed blocks: the ``patch`` demo written uncompressed and with Blosc2 LZ4 (the default
``byte`` shuffle), read with ``Reader.batches`` (block shuffle, batch 128) on 1 and 2 threads.

Every figure: images (rows) per second of wall time, and per CPU-second of the process (which a
loaded machine distorts less); medians over all repeats of all rounds. The load average is
recorded before and after (``uptime``): on a 2-core machine shared with other jobs the wall
figures of 2 threads are only comparable within a round. ``--doc`` (re)writes the section
between ``<!-- decode_bench:begin -->`` and ``<!-- decode_bench:end -->``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

BATCH = 64
PATCH_BATCH = 128
BEGIN, END = "<!-- decode_bench:begin -->", "<!-- decode_bench:end -->"

IMAGE_KINDS = [
    "png:imagecodecs",
    "png:spng",
    "png:pil",
    "png:kernel",
    "png:kernel-2threads",
    "png:rowstore-t1",
    "png:rowstore-t2",
    "png:rowstore-codec-t1",
    "png:rowstore-codec-t2",
    "png:tf-1thread",
    "png:tf-parallel",
    "jpeg:jpeg8",
    "jpeg:pil",
    "jpeg:rowstore-t1",
    "jpeg:rowstore-t2",
    "jpeg:tf-1thread",
    "jpeg:tf-parallel",
]
PATCH_KINDS = ["patch:none-t1", "patch:lz4-t1", "patch:none-t2", "patch:lz4-t2"]
CONVERT_KINDS = [f"convert:{s}-{m}" for m in ("whole", "rrc") for s in ("rgb", "grey", "cmyk")]


def _log(msg: str) -> None:
    print(msg, flush=True)


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- data -------------------------------------------------------------------------------------
def image_files(rows: int, cache: str) -> dict[str, str]:
    """The image demo (PNG) and the same images as JPEG, written once into ``cache``."""
    import rowstore
    from rowstore.bench.cli import ensure_demo
    from rowstore.schema import Field, Schema

    png = ensure_demo("image", rows, cache, log=_log)
    jpg = os.path.join(cache, f"image-jpeg-{rows}.h5")
    if not os.path.exists(jpg):
        schema = Schema(
            [
                Field("image", "uint8", (128, 256, 3), codec={"id": "jpeg", "quality": 90}),
                Field("label", "int64"),
            ]
        )
        with rowstore.open(png) as r, rowstore.Writer(jpg + ".tmp", schema) as w:
            for b in r.batches(100, shuffle="none"):
                w.write_batch(b)
        os.replace(jpg + ".tmp", jpg)
    return {"png": png, "jpeg": jpg}


def convert_files(rows: int, cache: str) -> dict[str, str]:
    """The image demo's images as RGB, greyscale and CMYK JPEGs (PIL, quality 90), one file
    each, a field of (128, 256, 3): the files of the conversion part."""
    import io

    from PIL import Image

    import rowstore
    from rowstore.bench.cli import ensure_demo
    from rowstore.schema import Field, Schema

    src = ensure_demo("image", rows, cache, log=_log)
    out = {}
    for space, mode in (("rgb", "RGB"), ("grey", "L"), ("cmyk", "CMYK")):
        path = os.path.join(cache, f"image-jpeg-{space}-{rows}.h5")
        out[space] = path
        if os.path.exists(path):
            continue
        schema = Schema([Field("image", "uint8", (128, 256, 3), codec="jpeg")])
        with rowstore.open(src) as r, rowstore.Writer(path + ".tmp", schema) as w:
            for b in r.batches(100, shuffle="none", fields=["image"]):
                blobs = []
                for a in b["image"]:
                    f = io.BytesIO()
                    Image.fromarray(a).convert(mode).save(f, "JPEG", quality=90)
                    blobs.append(f.getvalue())
                w.write_batch({"image": blobs})
        os.replace(path + ".tmp", path)
    return out


def _child_convert(what: str, path: str, repeats: int) -> dict[str, Any]:
    import rowstore
    from rowstore.reader.image_ops import RandomResizedCrop

    decode = {"image": RandomResizedCrop(112)} if what.endswith("rrc") else None
    r = rowstore.open(path)
    epoch = [0]

    def read() -> None:
        epoch[0] += 1
        for b in r.batches(BATCH, shuffle="block", num_threads=1, epoch=epoch[0], decode=decode):
            b["image"][:, ::8].sum()

    return {"repeats": _timed(read, len(r), repeats)}


def patch_files(rows: int, cache: str) -> dict[str, str]:
    from rowstore.demo import make_demo

    out = {}
    for comp in ("none", "lz4"):
        p = os.path.join(cache, f"patch-{comp}-{rows}.h5")
        if not os.path.exists(p):
            make_demo("patch", p + ".tmp", rows, compression=None if comp == "none" else comp)
            os.replace(p + ".tmp", p)
        out[comp] = p
    return out


def payloads(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The stored image payloads of every row (bytes back to back, offsets), as the reader's
    gather hands them to the decoder."""
    import rowstore

    with rowstore.open(path) as r:
        plans = r._select(["image"])
        g = r._gatherer.gather(np.arange(len(r)), plans)
        col = g.columns["image"]
        return np.array(col.data), np.array(col.offsets)


# -- one measurement (run in a child process) ---------------------------------------------------
def _timed(fn, n: int, repeats: int) -> list[dict[str, float]]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w, time.process_time() - c
        out.append({"per_s": n / w, "per_cpu_s": n / c if c > 0 else None, "seconds": w})
    return out


def child(kind: str, path: str, repeats: int) -> dict[str, Any]:
    fmt, what = kind.split(":")
    if fmt == "patch":
        return _child_patch(what, path, repeats)
    if fmt == "convert":
        return _child_convert(what, path, repeats)
    data, offs = payloads(path)
    n = len(offs) - 1
    out = np.empty((n, 128, 256, 3), np.uint8)
    blobs = [data[offs[i] : offs[i + 1]].tobytes() for i in range(n)]
    if what.startswith("rowstore"):
        import rowstore
        from rowstore.reader import _decode

        _decode.PNG_KERNEL = "codec" not in what
        threads = int(what[-1])
        r = rowstore.open(path)
        epoch = [0]

        def read() -> None:
            epoch[0] += 1
            for b in r.batches(BATCH, shuffle="block", num_threads=threads, epoch=epoch[0]):
                b["image"][:, ::8].sum()  # touch the batch

        return {"repeats": _timed(read, n, repeats)}
    if what.startswith("tf"):
        return {
            "repeats": _timed(_tf_epoch(fmt, blobs, parallel=what == "tf-parallel"), n, repeats)
        }
    fn = _decoder(fmt, what, blobs, data, offs, out)
    res = _timed(fn, n, repeats)
    if what in ("imagecodecs", "jpeg8"):  # every decoder gives these images
        ref = out.copy()
        for other in ("spng", "pil", "kernel") if fmt == "png" else ("pil",):
            _decoder(fmt, other, blobs, data, offs, out)()
            if not np.array_equal(out, ref):
                return {
                    "error": f"{other} decodes the images differently from {what}",
                    "repeats": res,
                }
    return {"repeats": res}


def _decoder(
    fmt: str, what: str, blobs: list[bytes], data: np.ndarray, offs: np.ndarray, out: np.ndarray
):
    import io

    import imagecodecs

    n = len(blobs)
    if what == "imagecodecs":
        return lambda: [imagecodecs.png_decode(b, out=out[i]) for i, b in enumerate(blobs)]
    if what == "spng":
        return lambda: [imagecodecs.spng_decode(b, out=out[i]) for i, b in enumerate(blobs)]
    if what == "jpeg8":
        return lambda: [imagecodecs.jpeg8_decode(b, out=out[i]) for i, b in enumerate(blobs)]
    if what == "pil":
        from PIL import Image

        def pil() -> None:
            for i, b in enumerate(blobs):
                out[i] = np.asarray(Image.open(io.BytesIO(b)))

        return pil
    from rowstore import kernels

    status = np.zeros(n, np.uint8)
    if what == "kernel":
        return lambda: kernels.png_decode_batch(data, offs, None, out, 0, n, status)
    if what == "kernel-2threads":
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(2)
        h = n // 2

        def two() -> None:
            a = pool.submit(kernels.png_decode_batch, data, offs, None, out, 0, h, status)
            b = pool.submit(kernels.png_decode_batch, data, offs, None, out, h, n, status)
            a.result()
            b.result()

        return two
    raise ValueError(what)


def _tf_epoch(fmt: str, blobs: list[bytes], *, parallel: bool):
    import tensorflow as tf

    dec = tf.io.decode_png if fmt == "png" else tf.io.decode_jpeg
    ds = tf.data.Dataset.from_tensor_slices(tf.constant(blobs)).shuffle(
        1024, seed=0, reshuffle_each_iteration=True
    )
    ds = ds.map(
        lambda b: tf.ensure_shape(dec(b, channels=3), (128, 256, 3)),
        num_parallel_calls=tf.data.AUTOTUNE if parallel else None,
    )
    ds = ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)
    if not parallel:
        opts = tf.data.Options()
        opts.threading.private_threadpool_size = 1
        ds = ds.with_options(opts)

    @tf.function
    def consume():
        return ds.reduce(
            tf.constant(0, tf.int64),
            lambda acc, b: (
                acc + tf.cast(tf.shape(b)[0], tf.int64) + tf.cast(b[0, 0, 0, 0], tf.int64) * 0
            ),
        )

    return lambda: int(consume())


def _child_patch(what: str, path: str, repeats: int) -> dict[str, Any]:
    import rowstore

    threads = int(what[-1])
    r = rowstore.open(path)
    n = len(r)
    row_bytes = r.layout.row_dtype.itemsize
    epoch = [0]

    def read() -> None:
        epoch[0] += 1
        for b in r.batches(PATCH_BATCH, shuffle="block", num_threads=threads, epoch=epoch[0]):
            b["foo"][:, ::64].sum()

    res = _timed(read, n, repeats)
    for x in res:
        x["gb_per_s"] = x["per_s"] * row_bytes / 1e9
    return {"repeats": res, "row_bytes": row_bytes}


# -- the driver ---------------------------------------------------------------------------------
def run_child(kind: str, path: str, repeats: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        kind,
        "--path",
        path,
        "--repeats",
        str(repeats),
    ]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:] or ["failed"]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarize(reps: list[dict[str, float]]) -> dict[str, Any]:
    def med(k):
        v = [r[k] for r in reps if r.get(k)]
        return statistics.median(v) if v else None

    return {
        "per_s": med("per_s"),
        "per_cpu_s": med("per_cpu_s"),
        "gb_per_s": med("gb_per_s"),
        "n": len(reps),
    }


def ratios(res: dict[str, dict[str, Any]]) -> dict[str, float]:
    def r(a: str, b: str, k: str = "per_s", scale: float = 1.0) -> float | None:
        x, y = res.get(a, {}).get(k), res.get(b, {}).get(k)
        return x / (scale * y) if x and y else None

    out = {
        # decoders, one thread, per CPU-second
        "png kernel / imagecodecs png (per CPU-s)": r("png:kernel", "png:imagecodecs", "per_cpu_s"),
        "png spng / imagecodecs png (per CPU-s)": r("png:spng", "png:imagecodecs", "per_cpu_s"),
        "png PIL / imagecodecs png (per CPU-s)": r("png:pil", "png:imagecodecs", "per_cpu_s"),
        "jpeg PIL / jpeg8 (per CPU-s)": r("jpeg:pil", "jpeg:jpeg8", "per_cpu_s"),
        # the reader against its decoder alone
        "png rowstore t1 / kernel alone (wall)": r("png:rowstore-t1", "png:kernel"),
        "png rowstore t1 / kernel alone (per CPU-s)": r(
            "png:rowstore-t1", "png:kernel", "per_cpu_s"
        ),
        "png rowstore t2 / (2 x kernel alone 1 thread) (wall)": r(
            "png:rowstore-t2", "png:kernel", scale=2
        ),
        "png rowstore t2 / kernel alone on 2 threads (wall)": r(
            "png:rowstore-t2", "png:kernel-2threads"
        ),
        "png rowstore t2 / (2 x imagecodecs png 1 thread) (wall)": r(
            "png:rowstore-t2", "png:imagecodecs", scale=2
        ),
        "png rowstore t2 / rowstore t1 (wall)": r("png:rowstore-t2", "png:rowstore-t1"),
        "png rowstore t2 / codec path t2 (wall)": r("png:rowstore-t2", "png:rowstore-codec-t2"),
        "png rowstore t1 / codec path t1 (per CPU-s)": r(
            "png:rowstore-t1", "png:rowstore-codec-t1", "per_cpu_s"
        ),
        "png rowstore t2 / tf.data parallel (wall)": r("png:rowstore-t2", "png:tf-parallel"),
        "png rowstore t1 / tf.data 1 thread (wall)": r("png:rowstore-t1", "png:tf-1thread"),
        "jpeg rowstore t1 / jpeg8 alone (per CPU-s)": r(
            "jpeg:rowstore-t1", "jpeg:jpeg8", "per_cpu_s"
        ),
        "jpeg rowstore t2 / (2 x jpeg8 1 thread) (wall)": r(
            "jpeg:rowstore-t2", "jpeg:jpeg8", scale=2
        ),
        "jpeg rowstore t2 / tf.data parallel (wall)": r("jpeg:rowstore-t2", "jpeg:tf-parallel"),
        # compressed blocks
        # conversion in the read path: grey and CMYK JPEGs into RGB against RGB JPEGs
        "convert grey / rgb JPEGs, whole (per CPU-s)": r(
            "convert:grey-whole", "convert:rgb-whole", "per_cpu_s"
        ),
        "convert cmyk / rgb JPEGs, whole (per CPU-s)": r(
            "convert:cmyk-whole", "convert:rgb-whole", "per_cpu_s"
        ),
        "convert grey / rgb JPEGs, RandomResizedCrop (per CPU-s)": r(
            "convert:grey-rrc", "convert:rgb-rrc", "per_cpu_s"
        ),
        "convert cmyk / rgb JPEGs, RandomResizedCrop (per CPU-s)": r(
            "convert:cmyk-rrc", "convert:rgb-rrc", "per_cpu_s"
        ),
        "patch lz4 / uncompressed, 1 thread (wall)": r("patch:lz4-t1", "patch:none-t1"),
        "patch lz4 / uncompressed, 2 threads (wall)": r("patch:lz4-t2", "patch:none-t2"),
        "patch lz4 / uncompressed, 1 thread (per CPU-s)": r(
            "patch:lz4-t1", "patch:none-t1", "per_cpu_s"
        ),
        "patch lz4 / uncompressed, 2 threads (per CPU-s)": r(
            "patch:lz4-t2", "patch:none-t2", "per_cpu_s"
        ),
    }
    return {k: v for k, v in out.items() if v is not None}


LABELS = {
    "png:imagecodecs": "PNG, imagecodecs `png_decode` (libpng + zlib), 1 thread",
    "png:spng": "PNG, imagecodecs `spng_decode`, 1 thread",
    "png:pil": "PNG, PIL, 1 thread",
    "png:kernel": "PNG, rowstore kernel `png_decode_batch` (zlib-ng), 1 thread",
    "png:kernel-2threads": "PNG, rowstore kernel, 2 threads (half the images each)",
    "png:rowstore-t1": "PNG, `Reader.batches`, 1 thread",
    "png:rowstore-t2": "PNG, `Reader.batches`, 2 threads",
    "png:rowstore-codec-t1": "PNG, `Reader.batches` through the codec (before), 1 thread",
    "png:rowstore-codec-t2": "PNG, `Reader.batches` through the codec (before), 2 threads",
    "png:tf-1thread": "PNG, tf.data `map(decode_png)`, private pool of 1 thread",
    "png:tf-parallel": "PNG, tf.data `map(decode_png, AUTOTUNE)` + prefetch",
    "jpeg:jpeg8": "JPEG, imagecodecs `jpeg8_decode` (libjpeg-turbo), 1 thread",
    "jpeg:pil": "JPEG, PIL, 1 thread",
    "jpeg:rowstore-t1": "JPEG, `Reader.batches`, 1 thread",
    "jpeg:rowstore-t2": "JPEG, `Reader.batches`, 2 threads",
    "jpeg:tf-1thread": "JPEG, tf.data `map(decode_jpeg)`, private pool of 1 thread",
    "jpeg:tf-parallel": "JPEG, tf.data `map(decode_jpeg, AUTOTUNE)` + prefetch",
    "convert:rgb-whole": "JPEG RGB (YCbCr), `Reader.batches` whole, 1 thread",
    "convert:grey-whole": "JPEG greyscale into RGB, `Reader.batches` whole, 1 thread",
    "convert:cmyk-whole": "JPEG CMYK into RGB, `Reader.batches` whole, 1 thread",
    "convert:rgb-rrc": "JPEG RGB (YCbCr), `RandomResizedCrop(112)`, 1 thread",
    "convert:grey-rrc": "JPEG greyscale into RGB, `RandomResizedCrop(112)`, 1 thread",
    "convert:cmyk-rrc": "JPEG CMYK into RGB, `RandomResizedCrop(112)`, 1 thread",
    "patch:none-t1": "patch, uncompressed, block shuffle, 1 thread",
    "patch:lz4-t1": "patch, Blosc2 LZ4 + byte shuffle, block shuffle, 1 thread",
    "patch:none-t2": "patch, uncompressed, block shuffle, 2 threads",
    "patch:lz4-t2": "patch, Blosc2 LZ4 + byte shuffle, block shuffle, 2 threads",
}


def markdown(doc: dict[str, Any]) -> str:
    from rowstore.bench.report import markdown_table

    rows = []
    for k, v in doc["results"].items():
        rate = f"{v['per_s']:,.0f}" + (f" ({v['gb_per_s']:.2f} GB/s)" if v.get("gb_per_s") else "")
        rows.append(
            [
                LABELS.get(k, k),
                rate,
                f"{v['per_cpu_s']:,.0f}" if v.get("per_cpu_s") else "-",
                str(v["n"]),
            ]
        )
    lines = [
        BEGIN,
        "## Images and compressed blocks",
        "",
        "_Generated by `python bench/decode_bench.py"
        + (" --quick" if doc["quick"] else "")
        + f" --rounds {doc['rounds']} --repeats {doc['repeats']}`; rerunning replaces this part._",
        "",
        f"Run {doc['created']} on {doc['cpus']} CPUs; load average (1, 5, 15 min) at the start "
        f"{doc['load_avg_start']}, after each round {doc['load_avg_per_round']}: **the machine was "
        f"shared with "
        "other jobs**"
        + (
            " (load above its core count: 2-thread wall figures say how much CPU the scheduler "
            "gave, "
            "compare them within this run only)"
            if max(doc["load_avg_start"][0], *(x[0] for x in doc["load_avg_per_round"]))
            > (doc["cpus"] or 1)
            else ""
        )
        + ". Each row: a fresh process, one warm-up epoch, then "
        f"{doc['repeats']} epochs per round, {doc['rounds']} interleaved rounds; medians of all "
        f"epochs. Images: "
        f"{doc.get('n_images', '?')} images 128x256x3 (the `image` demo, PNG level 1; the same "
        f"images as JPEG "
        "quality 90), batch 64; the decoders alone decode the file's own payloads from memory into "
        "one "
        "preallocated array. Per CPU-s: images (rows) per second of process CPU time.",
        "",
        markdown_table(["what", "per s (wall)", "per CPU-s", "epochs"], rows),
        "",
        "Ratios (same run):",
        "",
    ]
    for k, v in doc["ratios"].items():
        lines.append(f"- {k}: **{v:.2f}**")
    lines += ["", END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 images, 1,000 patches, 2 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--parts",
        nargs="+",
        choices=["images", "patch", "convert"],
        default=["images", "patch"],
        help="convert: the read path with conversion (grey/CMYK JPEGs) against RGB JPEGs",
    )
    ap.add_argument("--kinds", nargs="+", default=None, help="only these kinds (e.g. png:kernel)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "decode_bench.json"))
    ap.add_argument(
        "--doc",
        default=os.path.join(ROOT, "docs", "performance.md"),
        help="markdown file whose decode_bench section is (re)generated ('' to skip)",
    )
    ap.add_argument(
        "--cache-dir",
        default=os.environ.get("ROWSTORE_CACHE", os.path.join(ROOT, ".cache", "rowstore")),
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.path, args.repeats)))
        return 0
    rounds = args.rounds or (2 if args.quick else 3)
    t0 = time.perf_counter()
    doc: dict[str, Any] = {
        "tool": "bench/decode_bench.py",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "load_avg_start": _load(),
        "rounds": rounds,
        "repeats": args.repeats,
    }
    jobs: list[tuple[str, str]] = []
    if "images" in args.parts:
        doc["n_images"] = 200 if args.quick else 600
        files = image_files(doc["n_images"], args.cache_dir)
        doc["image_files"] = files
        jobs += [(k, files[k.split(":")[0]]) for k in IMAGE_KINDS]
    if "convert" in args.parts:
        cf = convert_files(200 if args.quick else 600, args.cache_dir)
        doc["convert_files"] = cf
        jobs += [(k, cf[k.split(":")[1].split("-")[0]]) for k in CONVERT_KINDS]
    if "patch" in args.parts:
        pf = patch_files(1_000 if args.quick else 4_000, args.cache_dir)
        doc["patch_files"] = {k: {"path": v, "bytes": os.path.getsize(v)} for k, v in pf.items()}
        jobs += [(k, pf[k.split(":")[1].split("-")[0]]) for k in PATCH_KINDS]
    if args.kinds:
        jobs = [j for j in jobs if j[0] in args.kinds]
    reps: dict[str, list[dict[str, float]]] = {k: [] for k, _ in jobs}
    errors: dict[str, Any] = {}
    loads = []
    for rnd in range(rounds):
        order = jobs if rnd % 2 == 0 else jobs[::-1]
        for kind, path in order:
            res = run_child(kind, path, args.repeats)
            if res.get("error"):
                errors[kind] = res["error"]
            reps[kind] += res.get("repeats", [])
            last = res.get("repeats", [{}])[-1:] or [{}]
            _log(
                f"round {rnd + 1} {kind:28s} "
                + (
                    f"{last[0].get('per_s', 0):9,.0f}/s wall "
                    f"{last[0].get('per_cpu_s') or 0:9,.0f}/CPU-s"
                    if not res.get("error")
                    else f"ERROR {res['error']}"
                )
            )
        loads.append(_load())
    results = {k: summarize(v) for k, v in reps.items() if v}
    doc.update(
        {
            "load_avg_per_round": loads,
            "load_avg_end": _load(),
            "results": results,
            "errors": errors,
            "raw": reps,
            "ratios": ratios(results),
            "seconds": time.perf_counter() - t0,
        }
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(args.out + ".tmp", args.out)
    if args.doc:
        from read_bench import write_section  # the one section writer of the benches

        write_section(args.doc, markdown(doc), BEGIN, END)
    _log("")
    for k, v in results.items():
        _log(
            f"{k:28s} {v['per_s'] or 0:9,.0f}/s wall  {v['per_cpu_s'] or 0:9,.0f}/CPU-s"
            + (f"  {v['gb_per_s']:.2f} GB/s" if v.get("gb_per_s") else "")
        )
    for k, v in doc["ratios"].items():
        _log(f"{k:60s} {v:.2f}")
    _log(
        f"load average: start {doc['load_avg_start']}, per round {loads}; written {args.out} "
        f"({doc['seconds']:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
