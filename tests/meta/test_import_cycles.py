"""No import circles among rowstore's modules.

The graph is read from the source with ``ast``: every ``rowstore`` import, at module level or
inside a function (a lazy import that dodges a circle is still one), type-checking imports
aside. Importing ``rowstore.a.b`` also runs the package ``rowstore.a``, so an edge to a module
is an edge to each of its packages too (except the importer's own packages, which are already
running). A circle is a strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
import os

import rowstore

ROOT = os.path.dirname(rowstore.__file__)


def modules(root: str) -> dict[str, str]:
    """Module name -> source path for every ``.py`` file of the package at ``root``."""
    top = os.path.dirname(root)
    out = {}
    for dirpath, _, files in os.walk(root):
        for fn in files:
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                rel = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def imported(path: str, module: str, package: str) -> set[str]:
    """The names ``module`` imports from ``package`` (``from a import b`` gives ``a.b``: a
    submodule or a name in ``a``; the caller keeps the longest module it names)."""
    tree = ast.parse(open(path).read())
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks
        test = node.test if isinstance(node, ast.If) else None
        if getattr(test, "id", getattr(test, "attr", None)) == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    here = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = up + ("." + base if base else "")
            names.update(f"{base}.{a.name}" for a in node.names)
            names.add(base)
    return {n for n in names if n == package or n.startswith(package + ".")}


def graph(root: str) -> dict[str, set[str]]:
    """Module -> the modules importing it runs (its targets and their packages)."""
    mods = modules(root)
    package = os.path.basename(root)
    out: dict[str, set[str]] = {}
    for module, path in mods.items():
        parts = module.split(".")
        running = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        edges = set()
        for name in imported(path, module, package):
            while name not in mods:
                name = name.rpartition(".")[0]
            bits = name.split(".")
            edges.update(
                p
                for p in (".".join(bits[:i]) for i in range(1, len(bits) + 1))
                if p in mods and p not in running
            )
        out[module] = edges
    return out


def circles(g: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(comp)
    return found


def test_no_import_circles():
    new = [sorted(c) for c in circles(graph(ROOT))]
    assert not new, "import circles:\n" + "\n".join(" <-> ".join(c) for c in new)


def _package(tmp_path, files: dict[str, str]) -> str:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_the_scan_sees_lazy_relative_and_package_circles(tmp_path):
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "b.py": "def f():\n    from . import a\n",  # a lazy, relative import closes a <-> b
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
            "d.py": "import pkg.c\n",  # c -> d only for type checkers: no circle
            "sub/__init__.py": "from pkg.sub.x import X\n",
            "sub/x.py": "from pkg.e import E\nX = 1\n",
            # importing pkg.sub.y runs pkg.sub, which imports e
            "e.py": "import pkg.sub.y\nE = 2\n",
            "sub/y.py": "",
        },
    )
    got = sorted(sorted(c) for c in circles(graph(root)))
    assert got == [["pkg.a", "pkg.b"], ["pkg.e", "pkg.sub", "pkg.sub.x"]]


def test_codecs_do_not_import_the_schema_even_for_type_checkers():
    """Codecs sit below the schema and see fields through ``codecs.abc.FieldLike``."""
    for module, path in modules(ROOT).items():
        if module.startswith("rowstore.codecs"):
            tree = ast.parse(open(path).read())
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {
                n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
            }
            assert not [n for n in names if n.startswith("rowstore.schema")], module
