"""The screenshots of docs/inspect.md: the report and the notebook view of the image demo,
taken with headless Chromium (tests/inspect/_chromium.py) and shrunk to a 64-colour PNG.

    python docs/img/make_screenshots.py        (from the repository root)
"""

import io
import os
import sys
import tempfile

import numpy as np
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "inspect")]

from _chromium import Browser, chromium_path  # noqa: E402

import rowstore  # noqa: E402
from rowstore.demo import make_demo  # noqa: E402


def save(png: bytes, out: str) -> None:
    img = Image.open(io.BytesIO(png)).convert("RGB")
    ink = np.flatnonzero((np.asarray(img).min(axis=2) < 250).any(axis=1))
    img = img.crop((0, 0, img.width, min(img.height, int(ink[-1]) + 16)))  # no blank below
    img = img.resize((img.width * 3 // 4, img.height * 3 // 4), Image.LANCZOS)
    img.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, optimize=True
    )
    print(out, img.size, os.path.getsize(out), "bytes")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = make_demo("image", os.path.join(tmp, "images.h5"), 400)
        rowstore.report(path, os.path.join(tmp, "report.html"), samples=16)
        with rowstore.open(path) as r:
            fragment = r._repr_html_()
        with open(os.path.join(tmp, "view.html"), "w", encoding="utf-8") as f:
            f.write(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{fragment}')
        b = Browser(chromium_path())
        try:
            here = os.path.dirname(os.path.abspath(__file__))
            page = b.open(os.path.join(tmp, "report.html"), width=1100, height=900)
            save(page.screenshot(max_height=1400), os.path.join(here, "report.png"))
            page = b.open(os.path.join(tmp, "view.html"), width=900, height=600)
            save(page.screenshot(max_height=900), os.path.join(here, "notebook-view.png"))
        finally:
            b.close()


if __name__ == "__main__":
    main()
