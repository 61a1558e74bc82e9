"""Hostile metadata (attributes, schema JSON, index entries, dataset kinds) edited into valid
files: opening, reading and verifying raise a RowstoreError (or the system's OSError), never
another exception, a crash or an unbounded allocation.

The edits are made with h5py, which writes over a v2 file's footer: these files are read through
libhdf5, as v1 files are (the v1 path). The same attribute cases written into a v2 footer, with
its CRCs recomputed, are in tests/format/test_footer.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import rowstore
from rowstore import Field, RowstoreError, Schema

h5py = pytest.importorskip("h5py")

SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("x", "float32", (4,)),
        Field("s", "str", nullable=True),
        Field("v", "int16", (None, 2)),
    ]
)


@pytest.fixture(scope="module", params=[None, "lz4"])
def valid(tmp_path_factory, request):
    path = str(tmp_path_factory.mktemp("hostile") / f"v-{request.param}.h5")
    with rowstore.Writer(
        path, SCHEMA, compression=request.param, rows_per_block=8, heap_chunk_bytes=256
    ) as w:
        for i in range(50):
            w.write(
                {
                    "id": i,
                    "x": np.full(4, i, np.float32),
                    "s": None if i % 4 == 0 else f"s{i}",
                    "v": np.full((i % 3, 2), i, np.int16),
                }
            )
    return path


def _schema_with(**changes):
    js = SCHEMA.to_json()
    js["fields"][1].update(changes)
    return json.dumps(js)


DEEP = "[" * 100_000 + "]" * 100_000
ATTR_CASES = {
    "schema-deep-json": ("schema", '{"fields": ' + DEEP + "}"),
    "schema-deep-field": ("schema", '{"fields": [' + DEEP + "]}"),
    "schema-not-json": ("schema", "{fields"),
    "schema-huge-dims": ("schema", _schema_with(shape=[2**62, 2**62])),
    "schema-overflowing-dims": ("schema", _schema_with(shape=[2**31, 2**31, 2**31])),
    "schema-negative-dim": ("schema", _schema_with(shape=[-5])),
    "schema-float-dim": ("schema", _schema_with(shape=[1.5])),
    "schema-str-shape": ("schema", _schema_with(shape="abc")),
    "schema-object-dtype": ("schema", _schema_with(dtype="O")),
    "schema-void-dtype": ("schema", _schema_with(dtype="V8")),
    "schema-dtype-list": ("schema", _schema_with(dtype=["<f4"])),
    "schema-dtype-int-reinterpret": ("schema", _schema_with(dtype="<i4")),
    "schema-codec-unknown": ("schema", _schema_with(codec={"id": "nope"})),
    "schema-codec-bad-config": ("schema", _schema_with(codec={"id": "png", "level": "max"})),
    "schema-codec-not-dict": ("schema", _schema_with(codec=[1, 2])),
    "schema-name-not-str": ("schema", _schema_with(name=12)),
    "schema-nullable-str": ("schema", _schema_with(nullable="yes")),
    "schema-fields-dict": ("schema", '{"fields": {"a": 1}}'),
    "schema-fields-of-ints": ("schema", '{"fields": [1, 2]}'),
    "schema-empty": ("schema", '{"fields": []}'),
    "schema-null": ("schema", "null"),
    "num_rows-str": ("num_rows", "many"),
    "num_rows-float": ("num_rows", 1.5),
    "num_rows-array": ("num_rows", np.arange(3)),
    "num_rows-huge": ("num_rows", 2**62),
    "num_rows-negative": ("num_rows", -1),
    "rows_per_block-zero": ("rows_per_block", 0),
    "rows_per_block-huge": ("rows_per_block", 2**40),
    "heap_chunk_bytes-huge": ("heap_chunk_bytes", 2**62),
    "heap_nbytes-huge": ("heap_nbytes", 2**62),
    "compression-garbage": ("compression", "{{{"),
    "compression-unknown": ("compression", '{"id": "brotli"}'),
    "compression-not-object": ("compression", "[1]"),
    "compression-deep": ("compression", DEEP),
    "user_attrs-garbage": ("user_attrs", "{not json"),
    "user_attrs-deep": ("user_attrs", DEEP),
    "checksum-other": ("checksum", "md5"),
    "format_version-array": ("format_version", np.arange(2)),
    "format-bytes": ("format", b"rowstore\xff"),
}


def _exercise(path):
    """Everything a user does with a file; returns normally or raises."""
    r = rowstore.open(path)
    try:
        n = len(r)
        if n:
            r[0]
            r.take(np.arange(min(n, 50)) % n)
        for shuffle in ("block", "full", "none"):
            for _ in r.batches(7, shuffle=shuffle, num_threads=2):
                pass
        r.layout.verify()
    finally:
        r.close()


def _oracle(path):
    try:
        _exercise(path)
    except RowstoreError:
        pass
    except OSError as exc:
        assert exc.errno is not None, f"{type(exc).__name__} without errno: {exc!r}"


@pytest.mark.parametrize("case", sorted(ATTR_CASES))
def test_hostile_attribute(valid, tmp_path, case):
    name, value = ATTR_CASES[case]
    path = str(tmp_path / "m.h5")
    shutil.copyfile(valid, path)
    with h5py.File(path, "r+") as f:
        f["rowstore"].attrs[name] = value
    _oracle(path)


def _edit(valid, tmp_path, fn):
    path = str(tmp_path / "e.h5")
    shutil.copyfile(valid, path)
    with h5py.File(path, "r+") as f:
        fn(f["rowstore"])
    return path


def _set_index(g, name, column, fn):
    a = g[name][()]
    a[column] = fn(a[column])
    del g[name]
    g.create_dataset(name, data=a)


STRUCTURE_CASES = {
    "rows-is-a-group": lambda g: (g.__delitem__("rows"), g.create_group("rows")),
    "blocks-missing": lambda g: g.__delitem__("blocks"),
    "blocks-is-a-group": lambda g: (g.__delitem__("blocks"), g.create_group("blocks")),
    "blocks-2d": lambda g: (
        g.__delitem__("blocks"),
        g.create_dataset("blocks", data=np.zeros((7, 2))),
    ),
    "blocks-scalar": lambda g: (g.__delitem__("blocks"), g.create_dataset("blocks", data=3)),
    "heap-missing": lambda g: g.__delitem__("heap"),
    "heap_chunks-wrong-dtype": lambda g: (
        g.__delitem__("heap_chunks"),
        g.create_dataset("heap_chunks", data=np.zeros(8)),
    ),
    "group-is-a-dataset": lambda g: None,  # replaced below (needs the file)
    "blocks-all-at-one-chunk": lambda g: _set_index(
        g, "blocks", "offset", lambda c: np.full_like(c, c[0])
    ),
    "blocks-swapped": lambda g: _set_index(
        g, "blocks", "offset", lambda c: c[[1, 0, *range(2, len(c))]]
    ),
    "blocks-overlapping": lambda g: _set_index(
        g, "blocks", "offset", lambda c: np.concatenate([c[:1], c[:1] + 1, c[2:]])
    ),
    "blocks-offset-huge": lambda g: _set_index(
        g, "blocks", "offset", lambda c: c + np.uint64(2**63)
    ),
    "blocks-stored-huge": lambda g: _set_index(
        g, "blocks", "stored_nbytes", lambda c: c * np.uint64(2**40)
    ),
    "blocks-heap-end-huge": lambda g: _set_index(
        g, "blocks", "heap_end", lambda c: c + np.uint64(2**62)
    ),
    "heap-chunks-at-one-offset": lambda g: _set_index(
        g, "heap_chunks", "offset", lambda c: np.full_like(c, c[0])
    ),
    "heap-chunks-on-blocks": lambda g: _set_index(
        g, "heap_chunks", "offset", lambda c: np.full_like(c, g["blocks"][0]["offset"])
    ),
}


@pytest.mark.parametrize("case", sorted(STRUCTURE_CASES))
def test_hostile_structure(valid, tmp_path, case):
    if case == "group-is-a-dataset":
        path = str(tmp_path / "g.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("rowstore", data=np.zeros(3))
    else:
        path = _edit(valid, tmp_path, STRUCTURE_CASES[case])
    _oracle(path)


@pytest.mark.parametrize(
    "case",
    [
        "blocks-all-at-one-chunk",
        "heap-chunks-at-one-offset",
        "heap-chunks-on-blocks",
        "blocks-overlapping",
        "blocks-swapped",
    ],
)
def test_index_entries_that_share_or_overlap_bytes_are_refused_at_open(valid, tmp_path, case):
    """Chunks are disjoint byte ranges of the file: index entries that point several chunks at
    the same bytes (so a small file claims a huge dataset) or at each other's bytes are a
    FormatError at open, before a read allocates for them."""
    path = _edit(valid, tmp_path, STRUCTURE_CASES[case])
    if case == "blocks-swapped" and not rowstore.Layout.open(valid).compressed:
        # Chunks of equal size swapped whole stay disjoint (compressed ones, of different sizes,
        # overlap and are caught). The file edited here with h5py has lost its v2 footer (h5py
        # writes over it), so it is read as v1, whose HDF5 index carries no checksum: the known v1
        # limit. A v2 file's footer covers its index (tests/format/test_footer.py: swapped entries
        # refused).
        pytest.xfail("known v1 limit: a v1 index is not checksummed (docs/reliability.md)")
    with pytest.raises(rowstore.FormatError):
        rowstore.open(path)
