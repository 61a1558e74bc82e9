"""One headless Chromium for the whole test session (tests that look at pages take the
``browser`` fixture; they are skipped, saying why, where no chromium is installed)."""

from __future__ import annotations

import pytest
from _chromium import Browser, chromium_path


@pytest.fixture(scope="session")
def browser():
    exe = chromium_path()
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    b = Browser(exe)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def look(browser, tmp_path):
    """``look(html_text)`` writes a page and opens it: the Page (closed after the test)."""
    pages = []

    def _look(text: str, name: str = "page.html", **size):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        page = browser.open(str(path), **size)
        pages.append(page)
        return page

    yield _look
    for p in pages:
        p.close()
