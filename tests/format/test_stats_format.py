"""The stored form of statistics (docs/format.md, section 13): the golden file of the new form
reads exactly as its JSON says, files and datasets written before read as "no statistics", and
hostile statistics (in a file's footer, in a manifest) are refused with a FormatError, bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from helpers import DATA

import rowstore
from rowstore import Field, FormatError, Layout, Schema, Writer
from rowstore.format import footer, manifest, spec
from rowstore.format import stats as fs

OLD = ["golden_v1.h5", "golden_v2.h5", "golden_v3.h5", "golden_v3_lz4.h5"]
GOLDEN = os.path.join(DATA, "golden_v3_stats.h5")
GOLDEN_JSON = os.path.join(DATA, "golden_v3_stats.json")


@pytest.mark.parametrize("name", OLD)
def test_old_files_have_no_statistics(name):
    path = os.path.join(DATA, name)
    assert Layout.open(path).stats is None
    with rowstore.open(path) as r:
        assert r.stats() is None


def test_old_dataset_has_no_statistics():
    with rowstore.open(os.path.join(DATA, "golden_dataset_v1")) as r:
        assert r.stats() is None


def test_golden_statistics_read_as_stored():
    with open(GOLDEN_JSON) as f:
        expected = json.load(f)
    layout = Layout.open(GOLDEN, scan=True)
    assert layout.stats == expected["stats"]
    with open(GOLDEN, "rb") as f:
        f.seek(layout.footer_offset)
        import hashlib

        assert hashlib.sha256(f.read()).hexdigest() == expected["footer_and_trailer_sha256"]
    st = rowstore.open(GOLDEN).stats()
    # and they describe the rows: numpy's figures of the golden values
    with rowstore.open(GOLDEN) as r:
        rows = [r[i] for i in range(len(r))]
    score = np.array([row["score"] for row in rows], dtype=np.float64)
    fin = score[np.isfinite(score)]
    s = st["score"]
    assert (s.nan, s.inf) == (int(np.isnan(score).sum()), int(np.isinf(score).sum()))
    assert (s.min, s.max) == (float(fin.min()), float(fin.max()))
    assert s.mean == pytest.approx(fin.mean(), rel=1e-12)
    assert s.var == pytest.approx(fin.var(), rel=1e-9)
    maybe = [row["maybe"] for row in rows]
    assert st["maybe"].nulls == sum(m is None for m in maybe)
    labels = [row["label"] for row in rows]
    assert dict(st["label"].values[0]) == {v: labels.count(v) for v in set(labels)}
    assert st["image"].images["height"].min == 8 and st["image"].images["channels"].max == 3


def test_golden_script_refuses_to_overwrite():
    proc = subprocess.run(
        [sys.executable, os.path.join(DATA, "make_golden_v3_stats.py")],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(DATA)),
    )
    assert proc.returncode == 1 and "refusing to overwrite" in proc.stderr


def _small(tmp_path) -> str:
    path = str(tmp_path / "s.h5")
    schema = Schema([Field("x", "float32"), Field("k", "int16"), Field("s", "str")])
    with Writer(path, schema) as w:
        w.write_batch(
            {"x": np.arange(5, dtype=np.float32), "k": np.arange(5) % 2, "s": list("abcab")}
        )
    return path


def _with_stats(path: str, layout: Layout, stats_text: object) -> None:
    """Rewrite the file's footer with ``stats_text`` as its statistics attribute (CRCs
    recomputed: only the statistics are wrong)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        ft = footer.read_local(f.fileno(), size, path)
    assert ft is not None
    header = {k: v for k, v in ft.header.items() if k != footer.KEY_EOF}
    if stats_text is None:
        header.pop(spec.ATTR_STATS)
    else:
        header[spec.ATTR_STATS] = stats_text
    pages = (layout.block_pages, layout.heap_pages) if layout.page_bytes else None
    data = footer.encode(header, layout.blocks, layout.heap_chunks, ft.offset, pages)
    with open(path, "r+b") as f:
        f.truncate(ft.offset)
        f.seek(ft.offset)
        f.write(data)


def _good(path: str) -> dict:
    return json.loads(json.dumps(Layout.open(path).stats))


def _hostile(good: dict) -> list:
    big = dict(good)
    big["fields"] = {
        **good["fields"],
        "x": {**good["fields"]["x"], "pad": "x" * fs.MAX_STATS_BYTES},
    }
    deep: dict = dict(good["fields"]["x"])
    cur = deep
    for _ in range(6):
        cur["lengths"] = dict(good["fields"]["x"])
        cur = cur["lengths"]

    def field(**kw):
        return {**good, "fields": {**good["fields"], "x": {**good["fields"]["x"], **kw}}}

    return [
        "not json {",
        "[1, 2]",
        json.dumps(big),
        "\ud800",
        json.dumps({**good, "v": 2}),
        json.dumps({**good, "rows": 6}),
        json.dumps({**good, "fields": {"x": good["fields"]["x"]}}),
        json.dumps(field(count=-1)),
        json.dumps(field(count=4.0)),
        json.dumps(field(count=2**70)),
        json.dumps(field(nulls=1)),
        json.dumps(field(finite=99)),
        json.dumps(field(min=5.0, max=1.0)),
        json.dumps(field(m2=-1.0)),
        json.dumps(field(mean="1")),
        json.dumps(field(kind="evil")),
        json.dumps(field(hist={"exp": 0, "base": 0, "counts": [1] * 33})),
        json.dumps(field(hist={"exp": 10**9, "base": 0, "counts": [1]})),
        json.dumps(field(values={"top": [[{"a": 1}, 1]], "other": 0, "complete": True})),
        json.dumps(field(values={"top": [["x" * 81, 1]], "other": 0, "complete": True})),
        json.dumps(
            field(facts={"kind": "image", **{f"f{i}": good["fields"]["x"] for i in range(17)}})
        ),
        json.dumps({**good, "fields": {**good["fields"], "x": deep}}),
        json.dumps(field(lengths=[1])),
        "1e999",
        json.dumps({**good, "fields": {**good["fields"], "x": None}}),
        b"\xff\xfe",
    ]


def test_hostile_file_statistics_are_refused(tmp_path):
    path = _small(tmp_path)
    good = _good(path)
    layout = Layout.open(path)
    for bad in _hostile(good):
        if isinstance(bad, bytes):
            continue  # a footer header is JSON text: bytes cannot be put there
        _with_stats(path, layout, bad)
        with pytest.raises(FormatError, match="statistics"):
            Layout.open(path)
    _with_stats(path, layout, json.dumps(good))
    assert Layout.open(path).stats == good
    _with_stats(path, layout, None)
    assert rowstore.open(path).stats() is None


def test_hostile_manifest_statistics_are_refused(tmp_path):
    root = tmp_path / "ds"
    schema = Schema([Field("x", "float32"), Field("k", "int16"), Field("s", "str")])
    with rowstore.DatasetWriter(root, schema) as w:
        w.write_batch(
            {"x": np.arange(5, dtype=np.float32), "k": np.arange(5) % 2, "s": list("abcab")}
        )
    mpath = root / manifest.manifest_path(1)
    m = json.loads(mpath.read_text())
    good = m["stats"]
    for bad in _hostile(good):
        if isinstance(bad, bytes) or bad in ("\ud800",):
            continue
        try:
            value = json.loads(bad)
        except ValueError:
            continue  # a manifest is one JSON document: its stats key holds parsed JSON
        mpath.unlink()
        text = json.dumps({**m, "stats": value}, indent=1).encode()
        mpath.write_bytes(text)
        ptr = json.loads((root / manifest.POINTER).read_text())
        ptr["manifest_crc32"] = zlib.crc32(text)
        (root / manifest.POINTER).write_text(json.dumps(ptr))
        with pytest.raises(FormatError):
            rowstore.open(root)
