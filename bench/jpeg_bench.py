"""JPEG decode with a RandomResizedCrop to 224x224 + flip: rowstore's reader against tf.data,
FFCV and PIL in a process pool, on the same images, on ``--threads`` cores (2).

    bash bench/setup_ffcv.sh                  # once: FFCV in its own venv, .ffcv-venv
    python bench/jpeg_bench.py [--n 1024] [--threads 2] [--rounds 2] [--passes 3]
                               [--base-root DIR] [--out bench/results/jpeg_bench.json]

Workload (ImageNet-like): ``--n`` synthetic photographs (smooth content + noise), widths
375..625 and heights 280..470 (about 500x375 on average, every size different), JPEG quality
90 (imagecodecs/libjpeg-turbo, 4:2:0). Each is decoded with a RandomResizedCrop (scale
(0.08, 1), ratio (3/4, 4/3)) to 224x224 and a random horizontal flip, uint8 out:

* ``rowstore``: ``Reader.batches(256, decode={"image": RandomResizedCrop(224)},
  num_threads=T)`` over a file of the images (the whole read path: gather, the JPEG kernel on
  the reader's threads, batches); ``rowstore-t1`` the same on one thread (the scaling);
* ``kernel``: ``kernels.jpeg_decode_batch`` alone, one call per thread over all images;
* ``tfdata``: tf.data's usual ImageNet pipeline: ``decode_and_crop_jpeg`` (libjpeg-turbo,
  only the crop's rows and columns) of the same boxes as rowstore's, ``tf.image.resize``
  bilinear (no antialiasing), random ``flip_left_right``, cast to uint8, ``map`` with
  ``AUTOTUNE`` on a private pool of T threads, ``batch(256)``, ``prefetch(AUTOTUNE)``;
  ``tfdata-decode`` the same with ``decode_jpeg`` of the whole image, then
  ``crop_to_bounding_box``;
* ``ffcv``: FFCV 1.0's ``Loader`` over a ``.beton`` of the same pixels (``RGBImageField``,
  ``write_mode="jpg"``, quality 90), ``[RandomResizedCropRGBImageDecoder((224, 224)),
  RandomHorizontalFlip()]``, batch 256, ``num_workers=T`` (its threads), in ``.ffcv-venv``;
* ``pil``: torchvision's path on PIL images in a process pool of T workers (a torch
  DataLoader's layout): ``Image.open().convert("RGB")``, ``resize((224, 224), BILINEAR,
  box=...)`` of the same boxes, flip, 64 images per task returned as one array.

Every system runs in its own fresh process, in ``--rounds`` interleaved rounds (the order
reversed every other round); each child runs a warm-up epoch, then ``--passes`` passes of at
least ``--min-pass-s`` seconds (whole epochs). Figures: images per wall second and images per
CPU-second (the process's threads; for the pool, its workers' CPU as they measure it, plus the
parent's), medians over all passes; ratios to the best peer (tfdata, ffcv, pil) on each.
``--base-root DIR``: also run ``rowstore``/``kernel`` from another checkout (built), as
``base-rowstore``/``base-kernel``, interleaved in the same rounds (a before/after pair).

Pixel accuracy: for the first 128 images, rowstore's kernel output against PIL's
``resize((224, 224), BILINEAR, box=<the same box>, reducing_gap=None)`` of the image decoded
whole by PIL (flipped alike): mean and max absolute difference, and the share of values that
differ; the same for tf.data's pipeline. The load average is recorded: a shared machine's
wall figures say how much CPU the scheduler gave.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

SIZE = 224
BATCH = 256
EPOCH_BOXES = 4  # crop boxes precomputed for this many epochs (cycled) for tfdata and pil
ACCURACY_IMAGES = 128
PEERS = ("tfdata", "tfdata-decode", "ffcv", "pil")


def synthesize(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w, h = int(rng.integers(375, 626)), int(rng.integers(280, 471))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        f = rng.uniform(20, 90, 4)
        chans = [
            128
            + 70 * np.sin(x / f[0] + k) * np.cos(y / f[1] - k)
            + 30 * np.sin((x + 2 * y) / f[2] + 2 * k)
            + 15 * np.cos((x - y) / f[3])
            for k in range(3)
        ]
        a = np.stack(chans, -1) + rng.normal(0, 6, (h, w, 3)).astype(np.float32)
        out.append(np.clip(a, 0, 255).astype(np.uint8))
    return out


def passes(epoch, n: int, count: int, min_s: float, cpu=time.process_time) -> list[list[float]]:
    """``[images per wall second, images per CPU-second]`` of ``count`` passes of whole
    epochs (``epoch(e)`` reads one), each at least ``min_s`` seconds, after a warm-up epoch."""
    epoch(0)
    e, out = 1, []
    for _ in range(count):
        t, c, k = time.perf_counter(), cpu(), 0
        while True:
            epoch(e)
            e, k = e + 1, k + n
            wall = time.perf_counter() - t
            if wall >= min_s:
                break
        used = cpu() - c
        out.append([k / wall, k / used if used > 0 else float("nan")])
    return out


def load_blob(blob: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data, offsets, boxes: EPOCH_BOXES x n x 5 of y0, x0, h, w, flip) of the parent's file."""
    z = np.load(blob)
    return z["data"], z["offsets"], z["boxes"]


def pil_crop(payload: bytes, box) -> np.ndarray:
    """torchvision's RandomResizedCrop + flip on a PIL image, for one image and its box."""
    import io

    from PIL import Image

    y0, x0, ch, cw, flip = (int(v) for v in box)
    im = Image.open(io.BytesIO(payload)).convert("RGB")
    im = im.resize((SIZE, SIZE), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch), reducing_gap=None)
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(im)


def difference(ours: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(ours.astype(np.int16) - ref.astype(np.int16))
    return {
        "mean_abs": float(d.mean()),
        "max_abs": int(d.max()),
        "p99_abs": float(np.percentile(d, 99)),
        "share_differing": float((d > 0).mean()),
    }


# -- the children: one system each -----------------------------------------------------------
def child_rowstore(a) -> dict:
    sys.path.insert(0, a.root)
    import rowstore
    from rowstore import kernels
    from rowstore.reader import image_ops as io

    assert os.path.dirname(os.path.dirname(os.path.abspath(rowstore.__file__))) == a.root
    op = io.RandomResizedCrop(SIZE)
    data, offsets, _ = load_blob(a.blob)
    n = len(offsets) - 1
    out: dict = {}
    if a.child in ("rowstore", "rowstore-t1"):
        threads = 1 if a.child == "rowstore-t1" else a.threads
        reader = rowstore.open(a.h5)

        def epoch(e):
            k = 0
            for b in reader.batches(BATCH, epoch=e, num_threads=threads, decode={"image": op}):
                k += len(b["image"])
            assert k == n, k

        out["passes"] = passes(epoch, n, a.passes, a.min_pass_s)
    else:  # the kernel alone, one call per thread
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(a.threads)
        dst = np.empty((n, SIZE, SIZE, 3), np.uint8)
        status = np.zeros(n, np.uint8)
        bounds = np.linspace(0, n, a.threads + 1).astype(int)

        def epoch(e):
            rows = np.arange(n, dtype=np.int64) + e * n
            futs = [
                pool.submit(
                    kernels.jpeg_decode_batch,
                    data,
                    offsets,
                    None,
                    rows,
                    12345,
                    dst,
                    int(lo),
                    int(hi),
                    status,
                    **op.kernel_args(),
                )
                for lo, hi in zip(bounds[:-1], bounds[1:])
            ]
            for f in futs:
                f.result()
            assert not status.any()

        out["passes"] = passes(epoch, n, a.passes, a.min_pass_s)
        # pixel accuracy against PIL's resize of the same box
        m = min(n, ACCURACY_IMAGES)
        info = np.zeros((m, kernels.JPEG_INFO), np.float64)  # the crop box: floats
        rows = np.arange(m, dtype=np.int64)
        got = np.empty((m, SIZE, SIZE, 3), np.uint8)
        kernels.jpeg_decode_batch(
            data, offsets[: m + 1], None, rows, 12345, got, 0, m, status, info=info,
            **op.kernel_args(),
        )  # fmt: skip
        ref = np.stack(
            [pil_crop(data[offsets[i] : offsets[i + 1]].tobytes(), info[i, 2:7]) for i in range(m)]
        )
        out["accuracy_vs_pil"] = difference(got, ref)
        out["dct_scale_share"] = {
            str(d): float((info[:, 7] == d).mean()) for d in (1, 2, 4, 8) if (info[:, 7] == d).any()
        }
    return out


def child_tfdata(a) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    data, offsets, boxes = load_blob(a.blob)
    n = len(offsets) - 1
    payloads = [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(n)]
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = a.threads

    def crop(p, box, flip):
        if a.child == "tfdata":
            img = tf.image.decode_and_crop_jpeg(p, box, channels=3)
        else:  # the whole image decoded, then cropped
            img = tf.io.decode_jpeg(p, channels=3)
            img = tf.image.crop_to_bounding_box(img, box[0], box[1], box[2], box[3])
        img = tf.image.resize(img, (SIZE, SIZE), method="bilinear")
        img = tf.cond(flip, lambda: tf.image.flip_left_right(img), lambda: img)
        return tf.cast(tf.round(img), tf.uint8)

    def dataset(e):
        b = boxes[e % EPOCH_BOXES]
        ds = tf.data.Dataset.from_tensor_slices(
            (payloads, b[:, :4].astype(np.int32), b[:, 4].astype(bool))
        )
        ds = ds.map(crop, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
        return ds.prefetch(tf.data.AUTOTUNE).with_options(opts)

    sets = [dataset(e) for e in range(EPOCH_BOXES)]

    def epoch(e):
        k = 0
        for x in sets[e % EPOCH_BOXES]:
            k += int(x.shape[0])
        assert k == n, k

    out = {"passes": passes(epoch, n, a.passes, a.min_pass_s)}
    m = min(n, ACCURACY_IMAGES)
    got = np.concatenate([x.numpy() for x in sets[0].take(-(-m // BATCH))])[:m]
    ref = np.stack([pil_crop(payloads[i], boxes[0, i]) for i in range(m)])
    out["accuracy_vs_pil"] = difference(got, ref)
    return out


_POOL: dict = {}


def _pil_init(blob: str) -> None:
    data, offsets, boxes = load_blob(blob)
    _POOL.update(data=data, offsets=offsets, boxes=boxes)


def _pil_task(lo: int, hi: int, e: int) -> tuple[np.ndarray, float]:
    c = time.process_time()
    data, offsets, boxes = _POOL["data"], _POOL["offsets"], _POOL["boxes"]
    out = np.stack(
        [
            pil_crop(data[offsets[i] : offsets[i + 1]].tobytes(), boxes[e % EPOCH_BOXES, i])
            for i in range(lo, hi)
        ]
    )
    return out, time.process_time() - c


def child_pil(a) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    _, offsets, _ = load_blob(a.blob)
    n = len(offsets) - 1
    worker_cpu = [0.0]
    pool = ProcessPoolExecutor(a.threads, initializer=_pil_init, initargs=(a.blob,))
    chunks = list(range(0, n, 64)) + [n]

    def epoch(e):
        futs = [pool.submit(_pil_task, lo, hi, e) for lo, hi in zip(chunks[:-1], chunks[1:])]
        k = 0
        for f in futs:
            arr, used = f.result()
            k += len(arr)
            worker_cpu[0] += used
        assert k == n, k

    out = {
        "passes": passes(
            epoch, n, a.passes, a.min_pass_s, lambda: time.process_time() + worker_cpu[0]
        )
    }
    pool.shutdown()
    return out


def child_ffcv(a) -> dict:
    import cv2
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip
    from ffcv.writer import DatasetWriter

    data, offsets, _ = load_blob(a.blob)
    n = len(offsets) - 1
    beton = a.blob + ".beton"
    if not os.path.exists(beton):  # written once per run, by the first ffcv child
        imgs = [
            cv2.cvtColor(cv2.imdecode(data[lo:hi], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            for lo, hi in zip(offsets[:-1], offsets[1:])
        ]

        class Images:
            def __len__(self):
                return len(imgs)

            def __getitem__(self, i):
                return imgs[i], i

        DatasetWriter(
            beton + ".tmp",
            {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
            num_workers=1,
        ).from_indexed_dataset(Images())
        os.replace(beton + ".tmp", beton)
    loader = Loader(
        beton,
        batch_size=BATCH,
        num_workers=a.threads,
        order=OrderOption.RANDOM,
        os_cache=True,
        drop_last=False,
        pipelines={
            "image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip()],
            "label": [IntDecoder()],
        },
    )

    def epoch(_e):
        k = 0
        for im, _lab in loader:
            k += len(im)
        assert k == n, k

    return {"passes": passes(epoch, n, a.passes, a.min_pass_s)}


CHILDREN = {
    "rowstore": child_rowstore,
    "rowstore-t1": child_rowstore,
    "kernel": child_rowstore,
    "tfdata": child_tfdata,
    "tfdata-decode": child_tfdata,
    "pil": child_pil,
    "ffcv": child_ffcv,
}


# -- the parent ----------------------------------------------------------------------------------
def prepare(n: int, tmp: str) -> tuple[str, str, dict]:
    import imagecodecs

    sys.path.insert(0, ROOT)
    import rowstore
    from rowstore.reader import image_ops as io

    imgs = synthesize(n)
    payloads = [imagecodecs.jpeg8_encode(a, level=90) for a in imgs]
    h5 = os.path.join(tmp, "images.h5")
    schema = rowstore.Schema(
        [
            rowstore.Field("image", "uint8", (None, None, 3), codec="jpeg"),
            rowstore.Field("label", "int64"),
        ]
    )
    with rowstore.Writer(h5, schema, rows_per_block=64) as w:
        for i, a in enumerate(imgs):
            w.write({"image": a, "label": i})
    # the boxes tfdata and pil use: rowstore's own crops of epochs 0..EPOCH_BOXES-1 (the
    # kernel's keys with base 12345), so the accuracy figures compare like with like
    op = io.RandomResizedCrop(SIZE)
    boxes = np.array(
        [
            [
                io.crop_params(op, *a.shape[:2], io.row_key(12345, i + e * n))
                for i, a in enumerate(imgs)
            ]
            for e in range(EPOCH_BOXES)
        ],
        np.int64,
    )
    blob = os.path.join(tmp, "payloads.npz")
    data = np.frombuffer(b"".join(payloads), np.uint8)
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([len(p) for p in payloads])
    np.savez(blob, data=data, offsets=offsets, boxes=boxes)
    area = boxes[0, :, 2] * boxes[0, :, 3] / np.array([a.shape[0] * a.shape[1] for a in imgs])
    meta = {
        "n": n,
        "mean_hw": [
            float(np.mean([a.shape[0] for a in imgs])),
            float(np.mean([a.shape[1] for a in imgs])),
        ],
        "mean_jpeg_bytes": float(np.mean([len(p) for p in payloads])),
        "mean_crop_area_share": float(area.mean()),
        "quality": 90,
    }
    return blob, h5, meta


def run_child(a, system: str, root: str, python: str, blob: str, h5: str) -> dict:
    cmd = [
        python, os.path.abspath(__file__), "--child", system, "--blob", blob, "--h5", h5,
        "--root", root, "--threads", str(a.threads), "--passes", str(a.passes),
        "--min-pass-s", str(a.min_pass_s),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        return {"error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(line[-1][len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1024, help="images (an epoch)")
    ap.add_argument("--threads", type=int, default=2, help="cores/threads/workers per system")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of fresh processes")
    ap.add_argument("--passes", type=int, default=3, help="timed passes per child")
    ap.add_argument("--min-pass-s", type=float, default=2.0)
    ap.add_argument(
        "--systems",
        default="rowstore,rowstore-t1,kernel,tfdata,tfdata-decode,ffcv,pil",
        help="comma-separated: " + ",".join(CHILDREN),
    )
    ap.add_argument("--base-root", help="another built checkout: base-rowstore, base-kernel too")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "jpeg_bench.json"))
    ap.add_argument("--ffcv-python", default=os.path.join(ROOT, ".ffcv-venv", "bin", "python"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--blob", help=argparse.SUPPRESS)
    ap.add_argument("--h5", help=argparse.SUPPRESS)
    ap.add_argument("--root", default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(CHILDREN[args.child](args)), flush=True)
        return

    tmp = tempfile.mkdtemp(prefix="jpeg_bench_")
    blob, h5, meta = prepare(args.n, tmp)
    meta.update(cpus=os.cpu_count(), threads=args.threads, load_before=list(os.getloadavg()))
    plan = []  # (label, system, root, python)
    for s in args.systems.split(","):
        python = args.ffcv_python if s == "ffcv" else sys.executable
        if s == "ffcv" and not os.path.exists(python):
            print(f"ffcv: {python} missing: run bench/setup_ffcv.sh", file=sys.stderr)
            continue
        plan.append((s, s, ROOT, python))
        if args.base_root and s in ("rowstore", "rowstore-t1", "kernel"):
            plan.append(("base-" + s, s, os.path.abspath(args.base_root), sys.executable))
    results: dict[str, dict] = {}
    loads = []
    for rnd in range(args.rounds):
        for label, system, root, python in plan if rnd % 2 == 0 else plan[::-1]:
            r = run_child(args, system, root, python, blob, h5)
            res = results.setdefault(label, {"passes": []})
            if "error" in r:
                res["error"] = r["error"]
                print(f"{label}: failed: {r['error'][-500:]}", file=sys.stderr)
                continue
            res["passes"] += r.pop("passes")
            res.update(r)
            print(f"round {rnd + 1}: {label} done", file=sys.stderr)
        loads.append(list(os.getloadavg()))
    meta["load_after_rounds"] = loads
    table = {}
    for label, res in results.items():
        if not res["passes"]:
            table[label] = {"error": res.get("error")}
            continue
        table[label] = {
            "images_per_s": statistics.median(p[0] for p in res["passes"]),
            "images_per_cpu_s": statistics.median(p[1] for p in res["passes"]),
            "passes": res["passes"],
            **{k: v for k, v in res.items() if k not in ("passes", "error")},
        }
    ok = [p for p in PEERS if "images_per_s" in table.get(p, {})]
    best_wall = max((table[p]["images_per_s"] for p in ok), default=None)
    best_cpu = max((table[p]["images_per_cpu_s"] for p in ok), default=None)
    for v in table.values():
        if "images_per_s" in v and best_wall:
            v["vs_best_peer_wall"] = v["images_per_s"] / best_wall
            v["vs_best_peer_cpu"] = v["images_per_cpu_s"] / best_cpu
    report = {"meta": meta, "results": table}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'system':<18}{'img/s':>8}{'img/CPU-s':>11}{'/best wall':>12}{'/best CPU':>11}")
    for label, v in table.items():
        if "images_per_s" not in v:
            print(f"{label:<18} failed")
            continue
        print(
            f"{label:<18}{v['images_per_s']:>8.0f}{v['images_per_cpu_s']:>11.0f}"
            f"{v.get('vs_best_peer_wall', float('nan')):>12.2f}"
            f"{v.get('vs_best_peer_cpu', float('nan')):>11.2f}"
        )
    for label, v in table.items():
        if "accuracy_vs_pil" in v:
            print(f"{label}: vs PIL's resize of the same box: {v['accuracy_vs_pil']}")
    print(f"load average: before {meta['load_before']}, after each round {loads}")


if __name__ == "__main__":
    main()
