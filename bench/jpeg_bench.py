"""JPEG decode with a RandomResizedCrop to 224x224 + flip: rowstore's kernel against FFCV's
``RandomResizedCropRGBImageDecoder`` and the usual Python decoders, on the same images.

    bash bench/setup_ffcv.sh                  # once: FFCV in its own venv, .ffcv-venv
    python bench/jpeg_bench.py [--n 512] [--rounds 3] [--out bench/results/jpeg_bench.json]

Workload (ImageNet-like): ``--n`` synthetic photographs (smooth content + noise), widths
375..625 and heights 280..470 (about 500x375 on average, every size different), JPEG quality
90 (imagecodecs/libjpeg-turbo, 4:2:0). Each is decoded with a RandomResizedCrop (scale
(0.08, 1), ratio (3/4, 4/3)) to 224x224 and a random horizontal flip:

* ``kernel``: ``kernels.jpeg_decode_batch``, one call per thread over all images (the DCT scale
  and partial decode of the crop, bilinear resize, no GIL); on 1 and 2 threads;
* ``reader``: ``Reader.batches(256, decode={"image": RandomResizedCrop(224)})`` over a file of
  the images (the whole read path: gather, decode threads, batches), 1 and 2 threads;
* ``simplejpeg``: ``decode_jpeg`` with ``min_height/min_width`` (its libjpeg-turbo DCT scaling
  of the whole image, no partial decode), then crop + PIL bilinear resize, in threads;
* ``pil``: torchvision's path on PIL images: ``Image.open().convert("RGB")``, then crop +
  bilinear resize (``Image.resize(box=)``, what ``RandomResizedCrop`` does), in threads;
* ``ffcv``: FFCV 1.0's ``Loader`` over a ``.beton`` of the same images (``RGBImageField``,
  ``write_mode="jpg"``, quality 90: FFCV's own encoding of the same pixels), pipeline
  ``[RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip()]``, batch 256,
  ``num_workers`` 1 and 2 (its threads), run in ``.ffcv-venv`` in a child process.

Every figure is images per second of wall time (median of ``--repeats`` epochs in each of
``--rounds`` rounds after a warm-up epoch), its per-core rate (divided by the threads used),
and images per CPU-second of the process (less distorted by a loaded machine). The load
average is recorded: the machine is shared with other jobs.
"""

from __future__ import annotations

import argparse
import io as _io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

SIZE = 224
BATCH = 256


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


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of ``repeats`` calls after a warm-up call."""
    fn(0)
    wall, cpu = [], []
    for r in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn(r + 1)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(wall), statistics.median(cpu)


# -- the rowstore side -------------------------------------------------------------------------
def rowstore_cases(payloads: list[bytes], path: str) -> dict:
    sys.path.insert(0, ROOT)
    import imagecodecs  # noqa: F401
    import simplejpeg
    from PIL import Image

    import rowstore
    from rowstore import kernels
    from rowstore.reader import image_ops as io

    op = io.RandomResizedCrop(SIZE)
    n = len(payloads)
    data = np.frombuffer(b"".join(payloads), np.uint8)
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([len(p) for p in payloads])
    out = np.empty((n, SIZE, SIZE, 3), np.uint8)
    status = np.zeros(n, np.uint8)
    sizes = [simplejpeg.decode_jpeg_header(p)[:2] for p in payloads]
    pools = {t: ThreadPoolExecutor(t) for t in (1, 2)}
    reader = rowstore.open(path)

    def kernel(threads):
        def run(epoch):
            rows = np.arange(n, dtype=np.int64) + epoch * n
            bounds = np.linspace(0, n, threads + 1).astype(int)
            futs = [
                pools[threads].submit(
                    kernels.jpeg_decode_batch,
                    data,
                    offsets,
                    None,
                    rows,
                    12345,
                    out,
                    int(a),
                    int(b),
                    status,
                    **op.kernel_args(),
                )
                for a, b in zip(bounds[:-1], bounds[1:])
            ]
            for f in futs:
                f.result()
            assert not status.any()

        return run

    def read(threads):
        def run(epoch):
            k = 0
            for b in reader.batches(
                BATCH, shuffle="block", epoch=epoch, num_threads=threads, decode={"image": op}
            ):
                k += len(b["image"])
            assert k == n

        return run

    def per_image(one):
        def cases(threads):
            def run(epoch):
                def chunk(lo, hi):
                    for i in range(lo, hi):
                        key = io.row_key(12345, i + epoch * n)
                        h, w = sizes[i]
                        out[i] = one(payloads[i], io.crop_params(op, h, w, key), h, w)

                bounds = np.linspace(0, n, threads + 1).astype(int)
                futs = [
                    pools[threads].submit(chunk, int(a), int(b))
                    for a, b in zip(bounds[:-1], bounds[1:])
                ]
                for f in futs:
                    f.result()

            return run

        return cases

    def simple(p, params, h, w):
        y0, x0, ch, cw, flip = params
        img = simplejpeg.decode_jpeg(
            p, colorspace="RGB", min_height=-(-SIZE * h // ch), min_width=-(-SIZE * w // cw)
        )
        sy, sx = img.shape[0] / h, img.shape[1] / w
        box = (x0 * sx, y0 * sy, (x0 + cw) * sx, (y0 + ch) * sy)
        im = Image.fromarray(img).resize((SIZE, SIZE), Image.BILINEAR, box=box)
        if flip:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(im)

    def pil(p, params, h, w):
        y0, x0, ch, cw, flip = params
        im = Image.open(_io.BytesIO(p)).convert("RGB")
        im = im.resize((SIZE, SIZE), Image.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
        if flip:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(im)

    cases = {
        "kernel": kernel,
        "reader": read,
        "simplejpeg": per_image(simple),
        "pil": per_image(pil),
    }
    return cases


# -- the FFCV side (in .ffcv-venv) -------------------------------------------------------------
def ffcv_child(blob: str, repeats: int, workers_list: list[int]) -> None:
    import cv2
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip
    from ffcv.writer import DatasetWriter

    z = np.load(blob)
    data, offsets = z["data"], z["offsets"]
    imgs = [
        cv2.cvtColor(cv2.imdecode(data[a:b], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        for a, b in zip(offsets[:-1], offsets[1:])
    ]

    class Images:
        def __len__(self):
            return len(imgs)

        def __getitem__(self, i):
            return imgs[i], i

    beton = blob + ".beton"
    DatasetWriter(
        beton,
        {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
        num_workers=1,
    ).from_indexed_dataset(Images())
    out = {}
    for workers in workers_list:
        loader = Loader(
            beton,
            batch_size=BATCH,
            num_workers=workers,
            order=OrderOption.RANDOM,
            os_cache=True,
            drop_last=False,
            pipelines={
                "image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip()],
                "label": [IntDecoder()],
            },
        )

        def run(_epoch, loader=loader):
            k = 0
            for im, _lab in loader:
                k += len(im)
            assert k == len(imgs), k

        out[workers] = timed(run, repeats)
    print("FFCV-RESULT " + json.dumps({str(k): v for k, v in out.items()}))


def load() -> list[float]:
    return list(os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=512, help="images (scale the workload)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "jpeg_bench.json"))
    ap.add_argument("--ffcv-python", default=os.path.join(ROOT, ".ffcv-venv", "bin", "python"))
    ap.add_argument("--ffcv-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ffcv_child:
        ffcv_child(args.ffcv_child, args.repeats, [1, 2])
        return

    import imagecodecs

    sys.path.insert(0, ROOT)
    import rowstore

    tmp = tempfile.mkdtemp(prefix="jpeg_bench_")
    imgs = synthesize(args.n)
    payloads = [imagecodecs.jpeg8_encode(a, level=90) for a in imgs]
    path = os.path.join(tmp, "images.h5")
    schema = rowstore.Schema(
        [
            rowstore.Field("image", "uint8", (None, None, 3), codec="jpeg"),
            rowstore.Field("label", "int64"),
        ]
    )
    with rowstore.Writer(path, schema, rows_per_block=64) as w:
        for i, a in enumerate(imgs):
            w.write({"image": a, "label": i})
    del imgs
    blob = os.path.join(tmp, "payloads.npz")
    data = np.frombuffer(b"".join(payloads), np.uint8)
    offsets = np.zeros(len(payloads) + 1, np.int64)
    offsets[1:] = np.cumsum([len(p) for p in payloads])
    np.savez(blob, data=data, offsets=offsets)
    sizes = [imagecodecs.jpeg8_decode(p).shape[:2] for p in payloads[:200]]
    meta = {
        "n": args.n,
        "mean_hw": [float(np.mean([s[0] for s in sizes])), float(np.mean([s[1] for s in sizes]))],
        "mean_jpeg_bytes": float(np.mean([len(p) for p in payloads])),
        "quality": 90,
        "cpus": os.cpu_count(),
        "load_before": load(),
    }

    cases = rowstore_cases(payloads, path)
    ffcv_ok = os.path.exists(args.ffcv_python)
    ffcv_why = None if ffcv_ok else f"{args.ffcv_python} missing: run bench/setup_ffcv.sh"
    results: dict[str, list] = {}
    for rnd in range(args.rounds):
        names = list(cases) if rnd % 2 == 0 else list(cases)[::-1]
        for name in names:
            for t in (1, 2):
                wall, cpu = timed(cases[name](t), args.repeats)
                results.setdefault(f"{name}-t{t}", []).append((wall, cpu))
        if ffcv_ok:
            proc = subprocess.run(
                [args.ffcv_python, __file__, "--ffcv-child", blob, "--repeats", str(args.repeats)],
                capture_output=True,
                text=True,
            )
            line = [x for x in proc.stdout.splitlines() if x.startswith("FFCV-RESULT ")]
            if proc.returncode != 0 or not line:
                ffcv_ok, ffcv_why = False, (proc.stderr or proc.stdout)[-2000:]
            else:
                for t, (wall, cpu) in json.loads(line[0][12:]).items():
                    results.setdefault(f"ffcv-t{t}", []).append((wall, cpu))
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    meta["load_after"] = load()
    table = {}
    for name, vals in results.items():
        threads = int(name.rsplit("-t", 1)[1])
        wall = statistics.median(v[0] for v in vals)
        cpu = statistics.median(v[1] for v in vals)
        rate = args.n / wall
        table[name] = {
            "threads": threads,
            "images_per_s": rate,
            "images_per_s_per_core": rate / threads,
            "images_per_cpu_s": args.n / cpu if cpu > 0 else None,
            "rounds_wall_s": [v[0] for v in vals],
        }
    for base in ("ffcv", "simplejpeg", "pil"):
        for t in (1, 2):
            k, b = table.get(f"kernel-t{t}"), table.get(f"{base}-t{t}")
            r = table.get(f"reader-t{t}")
            if k and b:
                table[f"kernel-t{t}"][f"vs_{base}"] = k["images_per_s"] / b["images_per_s"]
            if r and b:
                table[f"reader-t{t}"][f"vs_{base}"] = r["images_per_s"] / b["images_per_s"]
    report = {"meta": meta, "ffcv": ffcv_why or "ok", "results": table}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'case':<16}{'img/s':>9}{'per core':>10}{'per CPU-s':>11}")
    for name, v in sorted(table.items()):
        cpu = v["images_per_cpu_s"]
        print(
            f"{name:<16}{v['images_per_s']:>9.0f}{v['images_per_s_per_core']:>10.0f}"
            f"{cpu if cpu is None else round(cpu):>11}"
        )
    if ffcv_why:
        print("ffcv: not measured:", ffcv_why, file=sys.stderr)


if __name__ == "__main__":
    main()
