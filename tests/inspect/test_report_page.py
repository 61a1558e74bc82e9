"""The report page, opened in a real headless Chromium: it loads without a console error, every
image decodes, the screenshot has content, the sections show what the data holds; hostile
values are shown as text and run nothing; a large dataset is reported by reading a bounded
number of rows."""

from __future__ import annotations

import ast
import os
import re

import numpy as np
import pytest
from _chromium import pixels

import rowstore
from rowstore import Field, Schema
from rowstore._pictures import png_bytes
from rowstore.cli import main
from rowstore.demo import make_demo
from rowstore.inspect import QUALITY_ROWS, report

#: One worker runs every test that looks at a page (``-n 2 --dist loadgroup``): one Chromium.
pytestmark = pytest.mark.xdist_group("chromium")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: What every <img> of a page says about itself once loaded.
IMAGES = "[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])"


def _check_loads(page, text: str) -> None:
    """No console error or blocked resource; every image decoded; the page is not blank."""
    assert page.problems() == []
    imgs = page.eval(IMAGES)
    assert imgs and all(ok and w > 0 and h > 0 for ok, w, h in imgs), imgs
    shot = pixels(page.screenshot())
    assert shot.shape[0] > 600 and shot.shape[1] >= 1000
    assert shot.std() > 20  # text, tables and pictures: far from one flat colour
    assert text.count("<img") == len(imgs)


def test_image_demo_report(tmp_path, look):
    path = make_demo("image", str(tmp_path / "image.h5"), 60)
    out = tmp_path / "report.html"
    text = report(path, out, scan=True, samples=24)
    assert out.read_text(encoding="utf-8") == text
    page = look(text)
    _check_loads(page, text)
    grid = page.eval(
        "[...document.querySelectorAll('#samples .rs-grid[data-field=image] img')]"
        ".map(i => [i.naturalWidth, i.naturalHeight])"
    )
    assert len(grid) == 24 and all(w == 128 and h == 64 for w, h in grid)  # 256x128 halved
    body = page.eval("document.body.innerText")
    for words in ("image", "uint8", "(128, 256, 3)", "png(level=1)", "label", "int64"):
        assert words in body
    assert re.search(r"row \d+ · label \d+", body)  # each thumbnail captioned with its label
    assert "checksums match" in body  # scan=True
    if rowstore.open(path).stats() is not None:  # a histogram of the label, its counts drawn
        assert page.eval("document.querySelectorAll('#statistics svg.rs-chart').length") >= 2
        assert page.eval("document.querySelectorAll('#balance svg.rs-chart').length") == 1
        assert "channels\t3" in body and "height\t128" in body and "width\t256" in body
    assert page.eval("document.querySelectorAll('#quality svg circle').length") >= 50
    assert len(text) < 600_000


def _weather_example():
    """``weather()`` of examples/xarray_patches.py (the pangeo patch example), taken from its
    source: the example itself also trains a torch model, which this test does not need."""
    import pandas as pd
    import xarray as xr

    src = open(os.path.join(ROOT, "examples", "xarray_patches.py"), encoding="utf-8").read()
    fn = next(
        n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "weather"
    )
    scope = {"np": np, "pd": pd, "xr": xr}
    exec(compile(ast.Module([fn], []), "examples/xarray_patches.py", "exec"), scope)
    return scope["weather"]()


def test_pangeo_patch_example_report(tmp_path, look):
    pytest.importorskip("xarray")
    pytest.importorskip("dask")
    import dask

    from rowstore.xarray import write_patches

    path = str(tmp_path / "patches")
    with dask.config.set(scheduler="synchronous"):
        write_patches(  # as the example writes them
            _weather_example(),
            path,
            patch={"lat": 9, "lon": 9},
            keep=["altitude"],
            stack=["temperature", "u", "v"],
            channels="first",
            dtype="float32",
            stack_name="x",
            seed=0,
            shard_bytes=1 << 20,
        )
    text = report(path, samples=12)
    page = look(text)
    _check_loads(page, text)
    with rowstore.open(path) as r:
        assert r.schema["x"].shape == (18, 9, 9)
        shards = r.layout.num_shards
    heat = page.eval("[...document.querySelectorAll('#samples .rs-grid[data-field=x] img')].length")
    assert heat == 12  # a heatmap of each sample's first channel
    body = page.eval("document.body.innerText")
    assert f"Shards ({shards})" in body and "1 (read)" in body  # the versions' table
    assert "(18, 9, 9)" in body and "float32" in body


def _hostile(tmp_path):
    schema = Schema(
        [
            Field("text", "str"),
            Field("note", "bytes", nullable=True),
            Field("nan_only", "float64"),
            Field("picture", "uint8", (None, None, 1), codec="png"),
            Field("label", "int64"),
        ]
    )
    evil = [
        "<script>window.__pwned = 1</script>",
        '"><img src=x onerror="window.__pwned = 2">',
        "</td></tr></table><iframe src=javascript:window.__pwned=3>",
        "x" * 100_000,
    ]
    small = png_bytes(np.full((8, 8, 1), 200, np.uint8))
    huge = png_bytes(np.zeros((6000, 6000, 1), np.uint8))  # 36 MB decoded, 35 kB stored
    name = str(tmp_path / "<img src=x onerror=window.__pwned=4>.h5")
    attrs = {"<script>window.__pwned=5</script>": "<b onmouseover=alert(1)>", "sample_rate": 8000}
    with rowstore.Writer(name, schema, attrs=attrs) as w:
        w.write_batch(
            {
                "text": evil,
                "note": [b"<script>", None, b"\x00\xff", b"ok"],
                "nan_only": np.full(4, np.nan),
                "picture": [small, huge, small, small],
                "label": np.arange(4),
            }
        )
    return name, evil


def test_hostile_report_runs_nothing(tmp_path, look):
    path, evil = _hostile(tmp_path)
    text = report(path, samples=4)
    assert len(text) < 300_000  # the 100,000-character string is cut
    assert "<script" not in text.lower().replace("&lt;script", "")
    page = look(text)
    assert page.eval("window.__pwned === undefined")
    assert page.problems() == []
    body = page.eval("document.body.innerText")
    for s in evil[:3]:
        assert s[:40] in body  # shown as text
    assert "6000x6000x1 uint8: too large to show" in body  # the huge PNG is not decoded
    if rowstore.open(path).stats() is not None:
        assert "every value is NaN" in body  # the NaN-only field's card says so
    assert page.eval(IMAGES) and all(ok and w > 0 for ok, w, _ in page.eval(IMAGES))


def test_report_without_statistics(tmp_path, look):
    """A file written before statistics were stored (the v3 golden file) is reported with
    every section, saying that no statistics are stored."""
    text = report(os.path.join(ROOT, "tests", "data", "golden_v3.h5"), samples=6)
    page = look(text)
    assert page.problems() == []
    body = page.eval("document.body.innerText")
    assert "no statistics stored" in body
    assert "Order quality" in body and "Samples (6 rows, seed 0)" in body


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(re.search(r"rchar: (\d+)", f.read()).group(1))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_report_reads_a_bounded_number_of_rows(tmp_path):
    """Bytes read (``rchar``: every read and pread, page cache hits included) to report a
    dataset of 4 KiB rows: about the same for 3,000 and 12,000 rows, and a small part of the
    larger file: the report reads its samples, QUALITY_ROWS rows and two spreads, not the data."""
    schema = Schema([Field("x", "float32", (1024,)), Field("label", "int64")])

    def write(n: int) -> str:
        path = str(tmp_path / f"rows{n}.h5")
        with rowstore.Writer(path, schema) as w:
            for a in range(0, n, 1000):
                m = min(1000, n - a)
                w.write_batch({"x": np.zeros((m, 1024), np.float32), "label": np.arange(a, a + m)})
        return path

    small, large = write(3000), write(12_000)
    reads = []
    for path in (small, large):
        before = _rchar()
        report(path, samples=16)
        reads.append(_rchar() - before)
    size = os.path.getsize(large)
    rows_read = reads[1] / 4096
    assert rows_read < QUALITY_ROWS * 4 + 16 * 2 + 200, (reads, size)
    assert reads[1] < size / 4 and reads[1] < reads[0] * 1.5, (reads, size)


def test_report_cli(tmp_path, capsys):
    path = make_demo("patch", str(tmp_path / "patch.h5"), 50)
    out = tmp_path / "p.html"
    assert main(["report", path, "-o", str(out), "--samples", "3", "--quality-field", "baz"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    assert "field baz, 50 rows" in text and "Samples (3 rows, seed 0)" in text
    assert main(["report", path, "-o", str(out), "--quality-field", "nope"]) == 1
    assert "no field 'nope'" in capsys.readouterr().err


def test_report_scan_lists_damage(tmp_path):
    path = make_demo("patch", str(tmp_path / "patch.h5"), 200, block_bytes=64 << 10)
    with rowstore.open(path) as r:
        offset = int(r.layout.blocks["offset"][1])
    with open(path, "r+b") as f:  # one byte of block 1 flipped
        f.seek(offset + 100)
        b = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    with rowstore.open(path, verify=False) as r:
        text = report(r, scan=True, samples=0)
    assert "1 damaged chunk(s) or shard(s)" in text and "block 1" in text
    # Through its own reader (checked reads): the sections that read block 1 say why they are
    # empty, the others show.
    text = report(path, scan=True, samples=8)
    bad = re.findall(r'class="rs-bad">not available: (\w+)', text)
    assert bad == ["KernelChecksumError"] * 2  # the samples and the order quality
    assert "1 damaged chunk(s) or shard(s)" in text and "(9, 9, 27)" in text


def test_docs_python_blocks_run(tmp_path, monkeypatch):
    """docs/inspect.md's ```python blocks run as written, in order, in one directory."""
    text = open(os.path.join(ROOT, "docs", "inspect.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for code in blocks:
        exec(compile(code, "docs/inspect.md", "exec"), scope)
    assert (tmp_path / "report.html").stat().st_size > 10_000


def test_audio_players_play_in_chromium(tmp_path, look):
    """A float waveform field with a sample rate in the attributes: waveforms and spectrograms
    for the sample, and players (bounded WAV previews) that Chromium decodes."""
    rate = 16_000
    path = str(tmp_path / "speech.h5")
    schema = Schema([Field("wave", "float32", (None,)), Field("speaker", "str")])
    rng = np.random.default_rng(0)
    lengths = [8000, 40_000, 20_000, 12_000, 30_000, 16_000]  # 0.5 to 2.5 s
    with rowstore.Writer(path, schema, attrs={"sample_rate": rate}) as w:
        w.write_batch(
            {
                "wave": [
                    (0.3 * np.sin(np.arange(k) * 2 * np.pi * 300 / rate)).astype(np.float32)
                    + rng.normal(0, 0.01, k).astype(np.float32)
                    for k in lengths
                ],
                "speaker": [f"spk{i}" for i in range(6)],
            }
        )
    text = report(path, samples=6)
    assert "sample rate 16,000 Hz" in text
    page = look(text)
    assert page.problems() == []
    assert page.eval("document.querySelectorAll('#samples svg.rs-chart').length") == 6
    assert len(page.eval(IMAGES)) == 6  # the spectrograms
    durations = page.eval(
        "Promise.all([...document.querySelectorAll('audio')].map(a => new Promise(ok => {"
        "a.onloadedmetadata = () => ok(a.duration); a.onerror = () => ok(-1); a.load(); })))"
    )
    want = [min(k / rate, 2.5) for k in lengths[:4]]
    assert np.allclose(durations, want, atol=0.01), durations


def test_order_quality_of_an_open_reader(tmp_path):
    """The report measures the reader it shows: order_quality takes an open Reader (left
    open) and gives what it gives for the path."""
    from rowstore.quality import order_quality

    path = make_demo("tiny", str(tmp_path / "t.h5"), 3000)
    with rowstore.open(path) as r:
        a = order_quality(r, max_rows=500)
        assert len(r.take([0])["x"]) == 1  # still open
    b = order_quality(path, max_rows=500)
    assert (a.spearman, a.batch_spread, a.block_mixing, a.rows) == (
        b.spearman,
        b.batch_spread,
        b.block_mixing,
        b.rows,
    )
    assert a.path == r.path and b.path == path
