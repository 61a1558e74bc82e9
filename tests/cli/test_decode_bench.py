"""bench/decode_bench.py on small files: every PNG decoder it compares (imagecodecs png and
spng, PIL, rowstore's kernel) gives the same images, so do the JPEG ones, the reader and patch
children run, and the document it writes holds the ratios (never timed: no assertion depends on
the machine's speed)."""

from __future__ import annotations

import importlib.util
import os

import pytest
from helpers import ROOT

pytest.importorskip("imagecodecs")
pytest.importorskip("PIL")


@pytest.fixture(scope="module")
def db():
    spec = importlib.util.spec_from_file_location(
        "decode_bench", os.path.join(ROOT, "bench", "decode_bench.py")
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_children_and_document(db, tmp_path):
    cache = str(tmp_path)
    files = db.image_files(12, cache)
    patches = db.patch_files(60, cache)
    res = {}
    for kind in (
        "png:imagecodecs",
        "png:kernel",
        "png:rowstore-t2",
        "png:rowstore-codec-t1",
        "jpeg:jpeg8",
        "jpeg:rowstore-t1",
    ):
        out = db.child(kind, files[kind.split(":")[0]], 1)
        assert not out.get("error"), (
            kind,
            out.get("error"),
        )  # png:imagecodecs / jpeg:jpeg8 compare decoders
        res[kind] = db.summarize(out["repeats"])
        assert res[kind]["per_s"] > 0
    for kind in ("patch:none-t1", "patch:lz4-t2"):
        out = db.child(kind, patches[kind.split(":")[1].split("-")[0]], 1)
        res[kind] = db.summarize(out["repeats"])
        assert out["row_bytes"] == 19448 and res[kind]["gb_per_s"] > 0
    ratios = db.ratios(res)
    assert "png rowstore t2 / (2 x kernel alone 1 thread) (wall)" in ratios
    assert "patch lz4 / uncompressed, 1 thread (wall)" not in ratios  # lz4-t1 not measured here
    doc = {
        "quick": True,
        "rounds": 1,
        "repeats": 1,
        "created": "now",
        "cpus": 2,
        "load_avg_start": [0.1, 0.1, 0.1],
        "load_avg_per_round": [[3.0, 1.0, 1.0]],
        "n_images": 12,
        "results": res,
        "ratios": ratios,
    }
    text = db.markdown(doc)
    assert text.startswith(db.BEGIN) and text.endswith(db.END)
    assert "load above its core count" in text and "PNG, rowstore kernel" in text
