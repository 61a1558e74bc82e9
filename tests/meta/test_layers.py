"""The layers of docs/architecture.md are the imports of the code: every ``rowstore`` import
(at module level or inside a function; type-checking imports aside) goes to the module's own
layer or one below it."""

from __future__ import annotations

import ast
import os

import rowstore

ROOT = os.path.dirname(rowstore.__file__)

#: Lowest first; a module may import its own layer and the ones before it.
LAYERS = [
    ("errors", ["rowstore.errors", "rowstore._version", "rowstore._check"]),
    ("kernels", ["rowstore.kernels", "rowstore._"]),  # the compiled modules rowstore._<name>
    ("codecs", ["rowstore.codecs"]),  # field codecs and block compressions (codecs.blocks)
    ("schema", ["rowstore.schema"]),
    ("storage", ["rowstore.storage"]),  # bytes in and out of files and object stores
    ("format", ["rowstore.format"]),
    ("writer", ["rowstore.writer"]),  # making files and dataset versions
    ("reader", ["rowstore.reader"]),
    (
        "transforms",
        ["rowstore.global_shuffle", "rowstore.quality"],
    ),  # whole-dataset jobs over format + reader
    ("adapters", ["rowstore.torch", "rowstore.tf", "rowstore.grain"]),
    (
        "integrations",
        [
            "rowstore.pandas",
            "rowstore.dask",
            "rowstore.xarray",
            "rowstore.arrow",
            "rowstore.petastorm",
            "rowstore.spark",  # Arrow/Parquet, Petastorm, Spark
            "rowstore.huggingface",
            "rowstore.images",  # folders of image files
            "rowstore.audio",  # speech corpora: folders and manifests of audio files
            "rowstore.ray",
            "rowstore._payloads",
            "rowstore._unischema",
        ],
    ),  # their payload decoders, the Unischema
    ("cli/bench", ["rowstore.cli", "rowstore.bench", "rowstore.demo", "rowstore"]),
]


_SUBMODULES = {fn.split(".")[0] for fn in os.listdir(ROOT) if not fn.startswith("__")}


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            hit = (
                module == p
                or module.startswith(p + ".")
                or (p.endswith("_") and module.startswith(p))
            )
            if hit and len(p) > best_len:
                best, best_len = i, len(p)
    assert best is not None, module
    return best


def _imports(path: str, module: str):
    tree = ast.parse(open(path).read())
    skip = set()
    for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks
        if (
            isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        ):
            skip.update(id(n) for n in ast.walk(node))
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("rowstore"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = base + ("." + node.module if node.module else "")
            else:
                name = node.module or ""
            if (
                name == "rowstore"
            ):  # `from rowstore import kernels` names a module, `__version__` does not
                yield from (
                    "rowstore." + a.name if a.name in _SUBMODULES else "rowstore"
                    for a in node.names
                )
            elif name.startswith("rowstore"):
                yield name


def test_imports_follow_the_layers():
    wrong = []
    for dirpath, _, files in os.walk(ROOT):
        for fn in files:
            if not fn.endswith(".py"):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
            module = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
            if module == "rowstore":
                continue  # the package facade re-exports every layer
            own = layer_of(module)
            for target in _imports(path, module):
                if target == "rowstore" and own < len(LAYERS) - 1:
                    wrong.append(f"{module} imports the package root (which imports every layer)")
                elif layer_of(target) > own:
                    wrong.append(
                        f"{module} ({LAYERS[own][0]}) imports {target} "
                        f"({LAYERS[layer_of(target)][0]})"
                    )
    assert not wrong, "\n".join(wrong)


def test_arrow_does_not_import_petastorm():
    """The payload decoders and the Unischema reader are modules of their own: rowstore.arrow
    imports them, not rowstore.petastorm (which converts through rowstore.arrow)."""
    path = os.path.join(ROOT, "arrow.py")
    got = [t for t in _imports(path, "rowstore.arrow") if t.startswith("rowstore.petastorm")]
    assert not got, got
