"""Hostile sizes in a file are refused against the limits of ``rowstore.format.spec`` before
they size an allocation: a FormatError naming what was declared, never a MemoryError or a
multi-terabyte allocation."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

import rowstore
from rowstore import Field, FormatError, Schema
from rowstore.format import spec

h5py = pytest.importorskip("h5py")


def _set_stored_shape(path, field, *, block, row_in_block, dims):
    """Overwrite the variable dimensions of one stored row, then fix up its block's CRC so
    only the size checks can stop the hostile shape."""
    with h5py.File(path, "r") as f:
        ds = f["rowstore/rows"]
        info = ds.id.get_chunk_info(block)
        dt = ds.dtype
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + row_in_block * dt.itemsize + dt.fields[field][1] + 16)
        fh.write(np.array(dims, "<u4").tobytes())
        fh.seek(info.byte_offset)
        crc = zlib.crc32(fh.read(info.size))
    with h5py.File(path, "r+") as f:
        b = f["rowstore/blocks"][()]
        b["checksum"][block] = crc
        f["rowstore/blocks"][...] = b


def _small(path, schema, rows):
    with rowstore.Writer(path, schema, rows_per_block=4) as w:
        for r in rows:
            w.write(r)
    return path


def test_terabyte_block_is_refused_at_open(tmp_path):
    path = _small(
        str(tmp_path / "t.h5"), Schema([Field("x", "float64", (16,))]), [{"x": np.zeros(16)}] * 8
    )
    rows = (1 << 40) // 128  # 1 TiB blocks of 128-byte rows
    with h5py.File(path, "r+") as f:
        f["rowstore"].attrs["rows_per_block"] = rows
    with pytest.raises(FormatError, match="exceeds the format's limit") as ei:
        rowstore.open(path)
    assert ei.value.path == path


@pytest.mark.parametrize(
    ("attr", "value"),
    [("heap_chunk_bytes", 1 << 40), ("num_rows", 1 << 50), ("heap_nbytes", 1 << 55)],
)
def test_huge_declared_sizes_are_refused_at_open(tmp_path, attr, value):
    schema = Schema([Field("i", "int64"), Field("s", "str")])
    path = _small(str(tmp_path / "h.h5"), schema, [{"i": i, "s": "x" * i} for i in range(8)])
    with h5py.File(path, "r+") as f:
        f["rowstore"].attrs[attr] = value
    with pytest.raises(FormatError):
        rowstore.open(path)


def test_index_longer_than_declared_is_refused_before_reading(tmp_path):
    """An index dataset declared (not stored) with 2**40 entries would be allocated by a read."""
    path = _small(
        str(tmp_path / "i.h5"), Schema([Field("i", "int64")]), [{"i": i} for i in range(8)]
    )
    with h5py.File(path, "r+") as f:
        g = f["rowstore"]
        del g["blocks"]
        g.create_dataset("blocks", shape=(1 << 40,), dtype=spec.BLOCK_DTYPE, chunks=(1024,))
    with pytest.raises(FormatError, match="blocks index has shape"):
        rowstore.open(path)


@pytest.mark.parametrize("codec", ["png", "raw"])
def test_image_of_two_to_the_forty_pixels_is_refused_before_decoding(tmp_path, codec):
    """A variable-shape value whose stored shape claims 2**40 pixels (CRC fixed up, so only
    the limit can stop it): the decoded codec must not allocate it; a raw payload's shape
    must match its byte count."""
    if codec == "png":
        pytest.importorskip("imagecodecs")
    schema = Schema([Field("i", "int64"), Field("img", "uint8", (None, None, 3), codec=codec)])
    rows = [{"i": i, "img": np.full((2, 3, 3), i, np.uint8)} for i in range(8)]
    path = _small(str(tmp_path / "img.h5"), schema, rows)
    _set_stored_shape(path, "img", block=1, row_in_block=1, dims=[1 << 20, 1 << 20])  # row 5
    with rowstore.open(path, allow_missing_footer=True) as r:  # h5py cut the footer
        assert r[4]["i"] == 4
        with pytest.raises(FormatError) as ei:
            r.take([5])
        with pytest.raises(FormatError):
            list(r.batches(8, shuffle="none"))
    e = ei.value
    assert e.field == "img" and e.row == 5 and e.block == 1 and e.path == path
    assert ("limit" in str(e)) if codec == "png" else ("disagrees" in str(e))


def test_stored_shape_whose_product_wraps_int64_is_refused(tmp_path):
    """Dimensions whose int64 product wraps around (2**22 * 2**21 * 2**21 * 8 bytes = 2**67)
    must not slip past the size checks as a small number."""
    schema = Schema([Field("i", "int64"), Field("v", "float64", (None, None, None))])
    rows = [{"i": i, "v": np.zeros((1, 1, 1))} for i in range(8)]
    path = _small(str(tmp_path / "wrap.h5"), schema, rows)
    _set_stored_shape(path, "v", block=0, row_in_block=2, dims=[1 << 22, 1 << 21, 1 << 21])
    with rowstore.open(path, allow_missing_footer=True) as r, pytest.raises(FormatError) as ei:
        r.take([2])
    assert ei.value.row == 2
    assert Field("big", "float64", (1 << 31, 1 << 31, 1 << 31)).fixed_nbytes == 8 << 93


def test_verify_reports_every_damaged_chunk_with_rows_and_fails(tmp_path, capsys):
    from rowstore.cli import main

    schema = Schema([Field("i", "int64"), Field("s", "str")])
    path = str(tmp_path / "d.h5")
    with rowstore.Writer(path, schema, rows_per_block=10, heap_chunk_bytes=64) as w:
        for i in range(50):
            w.write({"i": i, "s": f"value {i:04d}"})
    L = rowstore.Layout.open(path)
    with open(path, "r+b") as fh:
        for off in (
            int(L.blocks["offset"][1]) + 3,
            int(L.blocks["offset"][3]) + 3,
            int(L.heap_chunks["offset"][2]) + 1,
        ):
            fh.seek(off)
            b = fh.read(1)
            fh.seek(off)
            fh.write(bytes([b[0] ^ 1]))
    damage = rowstore.Layout.open(path).damage()
    assert [(e.block, e.rows) for e in damage[:2]] == [(1, (10, 20)), (3, (30, 40))]
    assert damage[2].block is None and damage[2].rows[0] <= 20 and len(damage) == 3
    assert main(["verify", path]) == 1
    err = capsys.readouterr().err
    assert "rows 10..19" in err and "rows 30..39" in err and "3 damaged chunk(s)" in err
    with pytest.raises(rowstore.ChecksumError):
        rowstore.Layout.open(path, scan=True)


def test_schema_of_a_huge_fixed_shape_decoded_field_is_refused_before_allocating(tmp_path):
    """The schema comes from the file: a PNG field edited to (2**20, 2**20, 3) must not size
    an allocation of n x 3 TiB."""
    pytest.importorskip("imagecodecs")
    schema = Schema([Field("i", "int64"), Field("img", "uint8", (2, 3, 3), codec="png")])
    path = _small(
        str(tmp_path / "s.h5"),
        schema,
        [{"i": i, "img": np.zeros((2, 3, 3), np.uint8)} for i in range(8)],
    )
    with h5py.File(path, "r+") as f:
        js = schema.to_json()
        js["fields"][1]["shape"] = [1 << 20, 1 << 20, 3]
        f["rowstore"].attrs["schema"] = json.dumps(js)
    with rowstore.open(path, allow_missing_footer=True) as r:  # h5py cut the footer
        with pytest.raises(FormatError, match="limit"):
            r.take([1])
        assert r.take([1], fields=["i"])["i"].tolist() == [1]
