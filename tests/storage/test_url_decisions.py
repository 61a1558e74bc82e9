"""Only the storage layer decides between local files and object stores: no module outside
``rowstore/storage/`` calls ``is_url``, imports ``rowstore.storage.url`` (where the scheme test
lives), or tests a string for ``://`` itself; and ``rowstore.format.spec`` imports without the
write path."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

import rowstore
from rowstore import storage

ROOT = os.path.dirname(rowstore.__file__)
STORAGE = os.path.join(ROOT, "storage")


def _modules():
    for dirpath, _, files in os.walk(ROOT):
        if dirpath == STORAGE or dirpath.startswith(STORAGE + os.sep):
            continue
        for fn in files:
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                yield os.path.relpath(path, os.path.dirname(ROOT)), ast.parse(open(path).read())


def _scheme_test(node: ast.Call) -> bool:
    """``s.startswith("s3://")``, ``s.split("://")``... on a literal holding ``://``."""
    if not isinstance(node.func, ast.Attribute) or node.func.attr not in (
        "startswith",
        "split",
        "partition",
    ):
        return False
    for arg in node.args:
        for c in ast.walk(arg):
            if isinstance(c, ast.Constant) and isinstance(c.value, str) and "://" in c.value:
                return True
    return False


def test_no_module_outside_storage_decides_local_or_remote():
    wrong = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = (
                    f.id
                    if isinstance(f, ast.Name)
                    else f.attr
                    if isinstance(f, ast.Attribute)
                    else None
                )
                if name == "is_url":
                    wrong.append(f"{rel}:{node.lineno}: calls is_url")
                elif _scheme_test(node):
                    wrong.append(f"{rel}:{node.lineno}: tests a string for a URL scheme")
            elif isinstance(node, ast.ImportFrom):
                if node.module == "rowstore.storage.url" or any(
                    a.name == "is_url" for a in node.names
                ):
                    wrong.append(f"{rel}:{node.lineno}: imports the URL test ({node.module})")
            elif isinstance(node, ast.Import):
                if any(a.name == "rowstore.storage.url" for a in node.names):
                    wrong.append(f"{rel}:{node.lineno}: imports rowstore.storage.url")
    assert not wrong, "\n".join(wrong)


def test_format_spec_imports_without_the_writer():
    """The format package (declarations, manifests, layouts, opening) loads no writer module
    and offers no writer name, and ``import rowstore`` loads none (its writer names load on
    first use)."""
    code = (
        "import sys\n"
        "import rowstore.format.spec, rowstore.format.manifest, rowstore.format.shards\n"
        "import rowstore.format.open\n"
        "print(sorted(m for m in sys.modules if m.startswith('rowstore') and 'writer' in m))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
    code = "import rowstore.format as f\nprint(hasattr(f, 'Writer'), 'Writer' in dir(f))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "False"]  # format serves no layer above it
    code = "import rowstore\nprint(rowstore.Writer.__module__, 'Writer' in rowstore.__all__)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["rowstore.writer.file", "True"]


BUCKETLESS = ["s3://", "s3:///data/ds", "gs://", "https://"]


def _no_client(monkeypatch) -> list:
    """Record every object-store client made (none should be)."""
    from rowstore.storage import objstore

    made: list = []
    real = objstore.Client.__init__

    def init(self, url, options):
        made.append(url)
        real(self, url, options)

    monkeypatch.setattr(objstore.Client, "__init__", init)
    return made


@pytest.mark.parametrize("url", BUCKETLESS)
def test_a_url_without_its_bucket_is_refused_before_any_client(url, monkeypatch, capsys):
    """``s3://`` (no bucket) reached botocore, whose parameter error was retried; every entry
    point (reading, writing, the CLI) now refuses it where URLs are located, before a client
    or a request exists."""
    from rowstore.cli import main

    made = _no_client(monkeypatch)
    schema = rowstore.Schema([rowstore.Field("x", "int64")])
    what = "host" if url.startswith("https") else "bucket"
    calls = [
        lambda: storage.locate(url),
        lambda: storage.locate([url], storage_options={"anon": True}),
        lambda: storage.destination(url),
        lambda: rowstore.Reader(url),
        lambda: rowstore.DatasetWriter(url, schema),
        lambda: rowstore.Writer(url + "/x.h5", schema),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=f"names no {what}"):
            call()
    assert main(["info", url]) == 1
    assert f"names no {what}" in capsys.readouterr().err
    assert made == []


def test_a_parameter_error_is_not_retried():
    """botocore's parameter errors are raised before any request: no retry can fix them, so
    the first one is the error (6 attempts with backoff before)."""
    exceptions = pytest.importorskip("botocore.exceptions")
    from rowstore.errors import RemoteError
    from rowstore.storage.objstore import Client, RemoteOptions

    client = Client("s3://bad bucket/x", RemoteOptions.make(None, None, {"retries": 5}))
    calls = []

    def call():
        calls.append(1)
        raise exceptions.ParamValidationError(report="Invalid bucket name 'bad bucket'")

    with pytest.raises(RemoteError, match="invalid, so it was not retried") as e:
        client._retrying("s3://bad bucket/x", None, None, call)
    assert len(calls) == 1 and e.value.attempts == 1
    assert storage.locate("s3://bucket/key").path == "s3://bucket/key"  # a bucket: located
