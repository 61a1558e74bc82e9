"""Ingest of an ImageNet-like folder: what checking every file costs, same files, same run.

    python bench/image_ingest_bench.py [--n 4000] [--repeats 3] [--quick]
        [--out bench/results/image_ingest_bench.json]

The source is ``n`` JPEG files of varied sizes (sides 160-500 px, quality 75-95, a tenth
progressive; smooth images with noise, 20 class folders): the *clean part*. A copy adds what a
real collection holds besides: 1.5% greyscale and CMYK JPEGs (when image fields take any
channels: branch h39d; else left out, and said so) and a few damaged files (truncated JPEGs,
PNG bytes named ``.jpg``, empty files): the *dirty folder*. Files are read from the page cache.

Cases, ``workers=1`` (one process: what each file costs, not how it spreads), interleaved and
rotated, the first round a warm-up, median of the timed rounds:

* ``unchecked``: ``from_images`` with the structural check off (``rowstore.images.
  _CHECK_STRUCTURE = False``): what ingest cost before issue 39 (headers only);
* ``checked``: ``from_images`` as shipped: every file's structure checked (JPEG markers to EOI
  with scan data, PNG CRCs to IEND);
* ``verify``: ``from_images(verify_encoded=True)``: every file also decoded in full;
* ``check_only``: :func:`rowstore.codecs.image_check.check_structure` over the files' bytes
  already in memory: the check's own cost;
* ``dirty_skip``: the dirty folder with ``on_error="skip"`` (its skipped count reported).

Reported: median seconds, images/s, and each case's time over ``unchecked`` (the issue's
target: ``checked`` <= 1.10).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
from PIL import Image

import rowstore
import rowstore.images
from rowstore.codecs.image import jpeg_header
from rowstore.codecs.image_check import check_structure

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ingest_rounds import emit, medians, rounded, timed_rounds  # noqa: E402

CLASSES = 20


def _picture(rng: np.random.Generator, h: int, w: int) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w]
    k = rng.uniform(3, 12, 3)
    base = np.stack(
        [np.sin(x / k[0]) * 70, np.cos(y / k[1]) * 70, np.sin((x + y) / k[2]) * 50], axis=-1
    )
    img = (base + 128 + rng.normal(0, 8, (h, w, 3))).clip(0, 255).astype(np.uint8)
    return Image.fromarray(img)


def _jpeg(img: Image.Image, rng: np.random.Generator, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, "JPEG", quality=int(rng.integers(75, 96)), **kw)
    return b.getvalue()


def _mixed_channels() -> bool:
    img = Image.new("CMYK", (8, 8))
    b = io.BytesIO()
    img.save(b, "JPEG")
    try:
        return jpeg_header(b.getvalue()).channels == 4
    except ValueError:
        return False


def make_source(clean: str, dirty: str, n: int, mixed: bool) -> dict:
    """The clean part under ``clean``, the same plus the odd and damaged files under ``dirty``
    (hard links); what each holds."""
    rng = np.random.default_rng(0)
    total, files = 0, []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(160, 501, 2))
        data = _jpeg(_picture(rng, h, w), rng, progressive=bool(i % 10 == 0))
        rel = os.path.join(f"n{i % CLASSES:08d}", f"img_{i:07d}.JPEG")
        os.makedirs(os.path.join(clean, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(clean, rel), "wb") as f:
            f.write(data)
        os.makedirs(os.path.join(dirty, os.path.dirname(rel)), exist_ok=True)
        os.link(os.path.join(clean, rel), os.path.join(dirty, rel))
        total += len(data)
        files.append(rel)
    odd = {"grey": 0, "cmyk": 0, "truncated": 0, "png_named_jpg": 0, "empty": 0}
    n_odd = max(2, int(n * 0.015))
    for j in range(n_odd if mixed else 0):
        img = _picture(rng, 300, 400).convert("L" if j % 2 else "CMYK")
        rel = os.path.join(f"n{j % CLASSES:08d}", f"odd_{j:05d}.JPEG")
        with open(os.path.join(dirty, rel), "wb") as f:
            f.write(_jpeg(img, rng))
        odd["grey" if j % 2 else "cmyk"] += 1
    for j in range(max(3, n // 1000)):
        img = _picture(rng, 200, 300)
        good = _jpeg(img, rng)
        png = io.BytesIO()
        img.save(png, "PNG")
        cases = {"truncated": good[: len(good) // 2], "png_named_jpg": png.getvalue(), "empty": b""}
        for kind, data in cases.items():
            rel = os.path.join(f"n{j % CLASSES:08d}", f"bad_{kind}_{j:03d}.JPEG")
            with open(os.path.join(dirty, rel), "wb") as f:
                f.write(data)
            odd[kind] += 1
    return {"files": files, "bytes": total, "odd": odd}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4000, help="JPEG files of the clean part")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up)")
    ap.add_argument("--quick", action="store_true", help="n=300, 1 repeat (a smoke test)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 300, 1
    mixed = _mixed_channels()
    tmp = tempfile.mkdtemp(prefix="image_ingest_bench_")
    try:
        clean, dirty = os.path.join(tmp, "clean"), os.path.join(tmp, "dirty")
        t0 = time.perf_counter()
        src = make_source(clean, dirty, args.n, mixed)
        print(
            f"{args.n} JPEGs: {src['bytes'] / 1e6:.1f} MB ({src['bytes'] / args.n / 1e3:.1f} kB "
            f"each); dirty folder adds {src['odd']}; made in {time.perf_counter() - t0:.1f} s"
            + ("" if mixed else " (grey/CMYK left out: image fields of one channel count)"),
            file=sys.stderr,
        )
        blobs = []
        for rel in src["files"]:
            with open(os.path.join(clean, rel), "rb") as f:
                blobs.append(f.read())

        def ingest(folder: str, dest: str, check: bool = True, **kw) -> None:
            rowstore.images._CHECK_STRUCTURE = check
            try:
                rowstore.from_images(folder, dest, workers=1, path_field=None, **kw)
            finally:
                rowstore.images._CHECK_STRUCTURE = True

        def check_only(dest: str) -> None:
            for b in blobs:
                check_structure(b)

        skipped: list[int] = []

        def dirty_skip(dest: str) -> None:
            r = rowstore.from_images(dirty, dest, workers=1, path_field=None, on_error="skip")
            skipped.append(len(r.skipped))

        cases = {
            "unchecked": lambda d: ingest(clean, d, check=False),
            "checked": lambda d: ingest(clean, d),
            "verify": lambda d: ingest(clean, d, verify_encoded=True),
            "check_only": check_only,
            "dirty_skip": dirty_skip,
        }
        times, _, loads = timed_rounds(cases, tmp, args.repeats)
        med = medians(times)
        result = {
            "bench": "image_ingest_bench",
            "n": args.n,
            "source_mb": round(src["bytes"] / 1e6, 1),
            "dirty_extra": src["odd"],
            "mixed_channels": mixed,
            "dirty_skipped": skipped[-1] if skipped else None,
            "workers": 1,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "load_avg_1m_per_round": loads,
            "python": platform.python_version(),
            "rowstore": rowstore.__version__,
            **rounded(times, med),
            "images_per_s": {k: round(args.n / v) for k, v in med.items()},
            "time_over_unchecked": {k: round(v / med["unchecked"], 3) for k, v in med.items()},
        }
        return emit(result, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
