"""The notebook views: ``_repr_html_`` of a Reader, a Mixture, a Schema and a batch
(``rowstore.show``) drawn in headless Chromium as Jupyter would embed them (no console error,
thumbnails decoded, the schema's text present, data shown as text), and text reprs that stay
one screen."""

from __future__ import annotations

import numpy as np
import pytest
from _chromium import pixels

import rowstore
from rowstore import Field, Schema
from rowstore._html import MAX_LINES
from rowstore.demo import make_demo
from rowstore.reader.view import View

#: One worker runs every test that looks at a page (``-n 2 --dist loadgroup``): one Chromium.
pytestmark = pytest.mark.xdist_group("chromium")

IMAGES = "[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])"


def notebook(fragment: str) -> str:
    """An output cell as Jupyter embeds it: the fragment inside a page of its own."""
    return (
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>'
        f'<div class="output_html">{fragment}</div></body></html>'
    )


@pytest.fixture(scope="module")
def image_demo(tmp_path_factory):
    return make_demo("image", str(tmp_path_factory.mktemp("demo") / "image.h5"), 40)


def test_reader_view(image_demo, look):
    with rowstore.open(image_demo) as r:
        fragment = r._repr_html_()
        text = repr(r)
    assert "<script" not in fragment
    page = look(notebook(fragment), width=1000, height=700)
    assert page.problems() == []
    imgs = page.eval(IMAGES)
    assert len(imgs) == 8 and all(ok and w == 85 and h == 42 for ok, w, h in imgs)  # 1/3
    assert page.eval("document.querySelectorAll('details').length") >= 3
    body = page.eval("document.body.innerText")
    for words in ("rowstore.Reader", "40 rows", "(128, 256, 3)", "png(level=1)", "Samples (8 rows"):
        assert words in body
    shot = pixels(page.screenshot())
    assert shot.std() > 20
    assert text.splitlines()[0].startswith("<rowstore.Reader ") and "40 rows" in text
    assert "png(level=1)" in text and len(text.splitlines()) <= MAX_LINES


def test_statistics_in_the_view(tmp_path, look):
    """Where the file keeps statistics, the fields' table has their numbers and each field's
    card its histogram; the label's counts are drawn."""
    path = str(tmp_path / "s.h5")
    schema = Schema([Field("x", "float64"), Field("label", "int64"), Field("name", "str")])
    rng = np.random.default_rng(0)
    with rowstore.Writer(path, schema) as w:
        w.write_batch(
            {
                "x": rng.standard_normal(500),
                "label": rng.integers(0, 4, 500),
                "name": [f"n{i % 3}" for i in range(500)],
            }
        )
    with rowstore.open(path) as r:
        if r.stats() is None:
            pytest.skip("this build keeps no statistics")
        fragment = r._repr_html_()
        x = r.take(np.arange(500), fields=["x"])["x"]
    page = look(notebook(fragment))
    assert page.problems() == []
    page.eval("document.querySelectorAll('details').forEach(d => d.open = true)")
    body = page.eval("document.body.innerText")
    assert f"{x.min():.6g}" in body and f"{x.max():.6g}" in body
    assert page.eval("document.querySelectorAll('svg.rs-chart').length") >= 3
    assert "n0" in body and "most frequent values" in body


def test_schema_view_and_bounded_reprs(look):
    wide = Schema([Field(f"f{i}", "float32", (i % 4 + 1,)) for i in range(500)])
    text = repr(wide)
    assert len(text.splitlines()) <= MAX_LINES and "463 more fields" in text
    fragment = wide._repr_html_()
    assert len(fragment) < 40_000 and "436 more fields" in fragment
    page = look(notebook(fragment))
    assert page.problems() == []
    assert page.eval("document.querySelectorAll('tbody tr').length") == 64
    assert "rowstore.Schema: 500 fields" in page.eval("document.body.innerText")


def test_mixture_view(image_demo, tmp_path, look):
    other = make_demo("image", str(tmp_path / "b.h5"), 20, seed=1)
    with rowstore.mix({image_demo: 1.0, other: 3.0}) as m:
        text = repr(m)
        fragment = m._repr_html_()
    assert text.startswith("<rowstore.Mixture: 2 sources") and len(text.splitlines()) <= MAX_LINES
    page = look(notebook(fragment))
    assert page.problems() == []
    body = page.eval("document.body.innerText")
    assert "Sources (2)" in body and "0.75" in body and "source 1:" in body
    page.eval("document.querySelectorAll('details').forEach(d => d.open = true)")
    assert len(page.eval(IMAGES)) == 8  # four sample rows of each source


def test_show_a_batch(image_demo, look):
    with rowstore.open(image_demo) as r:
        batch = next(iter(r.batches(16, shuffle="none")))
    view = rowstore.show(batch)
    assert isinstance(view, View)
    assert repr(view).startswith("<rowstore batch: 2 columns>")
    page = look(notebook(view._repr_html_()))
    assert page.problems() == []
    assert len(page.eval(IMAGES)) == 8  # the first rows' images
    body = page.eval("document.body.innerText")
    assert "(16, 128, 256, 3)" in body and "First 8 rows" in body
    with pytest.raises(TypeError, match="show\\(\\) takes a batch"):
        rowstore.show(3)


def test_show_ragged_and_text_columns(tmp_path, look):
    path = make_demo("speech", str(tmp_path / "speech.h5"), 10)
    with rowstore.open(path) as r:
        batch = r.take(np.arange(10))
    page = look(notebook(rowstore.show(batch)._repr_html_()))
    assert page.problems() == []
    body = page.eval("document.body.innerText")
    assert "Ragged" in body and "speaker-" in body
    assert page.eval("document.querySelectorAll('svg.rs-chart').length") == 8  # waveforms


def test_hostile_view_runs_nothing(tmp_path, look):
    path = str(tmp_path / "h.h5")
    evil = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    schema = Schema([Field("s", "str"), Field("v", "float32", (3,))])
    with rowstore.Writer(path, schema, attrs={evil: evil}) as w:
        w.write_batch({"s": [evil] * 3, "v": np.full((3, 3), np.nan, np.float32)})
    with rowstore.open(path) as r:
        fragment = r._repr_html_()
        batch = r.take([0, 1])
    for html in (fragment, rowstore.show(batch)._repr_html_()):
        page = look(notebook(html))
        page.eval("document.querySelectorAll('details').forEach(d => d.open = true)")
        assert page.eval("window.__pwned === undefined")
        assert page.problems() == []
        assert evil[:30] in page.eval("document.body.innerText")
