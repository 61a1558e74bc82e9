"""Only the storage layer decides between local files and object stores: no module outside
``rowstore/storage/`` calls ``is_url``, imports ``rowstore.storage.url`` (where the scheme test
lives), or tests a string for ``://`` itself; and ``rowstore.format.spec`` imports without the
write path."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import rowstore

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
    """The format package (declarations, manifests, layouts, opening) loads no writer module,
    and neither does ``import rowstore`` (its writer names load on first use)."""
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
    code = (
        "import rowstore.format as f\n"
        "print(f.Writer.__module__, f.gc_dataset.__module__, 'Writer' in dir(f))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["rowstore.writer.file", "rowstore.writer.gc", "True"]
    code = "import rowstore\nprint(rowstore.Writer.__module__, 'Writer' in rowstore.__all__)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["rowstore.writer.file", "True"]
