"""The shared argument checks (rowstore._check): what each accepts, what it returns and the
ValueError that names the argument for anything else; and that the layers use these, not copies."""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest

import rowstore
from rowstore._check import nonneg_int, one_of, parse_bytes, positive_int


def test_positive_int():
    assert positive_int("batch_size", 3) == 3
    assert type(positive_int("batch_size", np.int64(3))) is int
    assert positive_int("unit", None, optional=True) is None
    for bad in (0, -1, 1.0, "2", True, None):
        with pytest.raises(ValueError, match=r"batch_size must be a positive int, got "):
            positive_int("batch_size", bad)
    with pytest.raises(ValueError, match=r"unit must be a positive int or None, got 0"):
        positive_int("unit", 0, optional=True)


def test_nonneg_int():
    assert nonneg_int("seed", 0) == 0 and nonneg_int("seed", np.uint8(7)) == 7
    for bad in (-1, 0.0, False, None):
        with pytest.raises(ValueError, match=r"seed must be a non-negative int, got "):
            nonneg_int("seed", bad)


def test_one_of():
    assert one_of("mode", "w", ("w", "x")) == "w"
    for bad in ("a", None, ["w"], 1):
        with pytest.raises(ValueError, match=r"mode must be one of \('w', 'x'\), got "):
            one_of("mode", bad, ("w", "x"))
    with pytest.raises(ValueError, match=r"n must be one of \(1, 2\), got True"):
        one_of("n", True, (1, 2))  # True == 1, but it is not the choice 1
    assert one_of("flag", True, (True, False)) is True


@pytest.mark.parametrize(
    ("given", "n"),
    [
        (1000, 1000),
        (np.int32(5), 5),
        ("2GB", 2 * 1000**3),
        ("512MiB", 512 << 20),
        ("1.5g", 1_500_000_000),
        (" 3 kb ", 3000),
        ("7", 7),
    ],
)
def test_parse_bytes(given, n):
    assert parse_bytes(given) == n


@pytest.mark.parametrize("bad", ["", "2 parsecs", "GB", "-1GB", 0, -5, True, 1.5, None, "0.1b"])
def test_parse_bytes_refuses(bad):
    with pytest.raises(ValueError, match=r"^shard_bytes must be"):
        parse_bytes(bad, "shard_bytes")


def test_the_global_shuffle_exports_the_shared_parser():
    from rowstore import global_shuffle

    assert global_shuffle.parse_bytes is parse_bytes


def test_no_copies_of_the_checks():
    """The count and size checks are defined once: no other module of rowstore defines them."""
    root = os.path.dirname(rowstore.__file__)
    names = {"positive_int", "nonneg_int", "one_of", "parse_bytes", "_int_at_least"}
    found = []
    for dirpath, _, files in os.walk(root):
        for fn in files:
            path = os.path.join(dirpath, fn)
            if not fn.endswith(".py") or path == os.path.join(root, "_check.py"):
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.FunctionDef) and node.name in names:
                    found.append(f"{os.path.relpath(path, root)}: {node.name}")
    assert not found, found
