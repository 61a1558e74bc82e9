"""A user who changes nothing never gets a corrupted value without an error: on
uncompressed files the default reader reads single rows and payloads directly, and what such a
read touches is checksummed the first time (per reader and process): the pages of a v3 file's
page index (these files; test_page_index.py covers rows of a page or more), each chunk whole
in a v1/v2 file (test_v2_file_without_pages_is_checked_whole_at_first_touch)."""

from __future__ import annotations

import numpy as np
import pytest

import rowstore
from rowstore import ChecksumError, Field, Schema

SCHEMA = Schema(
    [
        Field("id", "int64"),
        Field("x", "float32", (64,)),
        Field("text", "str"),
        Field("wave", "float32", (None,)),
    ]
)


def _row(i):
    return {
        "id": i,
        "x": np.full(64, i, np.float32),
        "text": f"row {i} " * 20,
        "wave": np.arange(200 + i % 50, dtype=np.float32),
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("integrity") / "clean.h5")
    with rowstore.Writer(path, SCHEMA, rows_per_block=32, heap_chunk_bytes=1 << 14) as w:
        for i in range(400):
            w.write(_row(i))
    return path


def _flipped(clean, tmp_path, where):
    """A copy with one byte flipped: in row 100's x value ("row"), or in the heap payload of
    row 100's waveform ("heap")."""
    import shutil

    import h5py

    bad = str(tmp_path / f"flip-{where}.h5")
    shutil.copyfile(clean, bad)
    L = rowstore.Layout.open(clean)
    if where == "row":
        off = (
            int(L.blocks["offset"][100 // 32])
            + (100 % 32) * L.row_dtype.itemsize
            + L.row_dtype.fields["x"][1]
            + 5
        )
    else:
        with h5py.File(clean, "r") as f:
            ref = f["rowstore/rows"][100]["wave"]
        logical = int(ref["offset"]) + 9
        H = L.heap_chunk_bytes
        off = int(L.heap_chunks["offset"][logical // H]) + logical % H
    with open(bad, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x10]))
    return bad


@pytest.mark.parametrize("where", ["row", "heap"])
@pytest.mark.parametrize("how", ["take", "getitem", "full", "block", "take_many"])
def test_default_reader_refuses_a_flipped_byte(clean, tmp_path, where, how):
    bad = _flipped(clean, tmp_path, where)
    field = "x" if where == "row" else "wave"
    with rowstore.open(bad) as r, pytest.raises(ChecksumError) as ei:
        if how == "take":
            r.take([100], fields=[field])
        elif how == "getitem":
            r[100]
        elif how == "take_many":
            r.take(
                np.random.default_rng(0).permutation(400)[:40].tolist() + [100],
                fields=["id", field],
            )
        else:
            for _ in r.batches(16, shuffle=how, seed=1, fields=["id", field]):
                pass
    assert ei.value.path == bad


def test_clean_file_reads_the_same_after_first_touch_checks(clean):
    with rowstore.open(clean) as r:
        for _ in range(2):  # first epoch checks chunks, the second reads them directly
            ids = []
            for b in r.batches(25, shuffle="full", seed=4, fields=["id", "x", "wave"]):
                for j, i in enumerate(b["id"].tolist()):
                    assert b["x"][j][0] == i and len(b["wave"][j]) == 200 + i % 50
                ids.extend(b["id"].tolist())
            assert sorted(ids) == list(range(400))


def test_verify_false_still_reads_directly_without_checks(clean, tmp_path):
    bad = _flipped(clean, tmp_path, "row")
    with rowstore.open(bad, verify=False) as r:
        assert r.take([100], fields=["x"])["x"].shape == (1, 64)  # bounds hold; no checksum


def test_torch_dataset_under_a_dataloader_refuses_a_flipped_byte(clean, tmp_path):
    torch = pytest.importorskip("torch")
    rst = pytest.importorskip("rowstore.torch")
    bad = _flipped(clean, tmp_path, "row")
    ds = rst.Dataset(bad, fields=["id", "x"])
    loader = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, num_workers=0)
    with pytest.raises(ChecksumError):
        for _ in loader:
            pass
    ds.close()


@pytest.mark.parametrize("where", ["row", "heap"])
def test_v2_file_without_pages_is_checked_whole_at_first_touch(clean, tmp_path, where):
    """A file written before the page index (its footer cut: read as v1/v2, no pages) keeps
    the whole-chunk checks: a flipped byte is refused by direct reads too."""
    from rowstore.format import footer

    bad = _flipped(clean, tmp_path, where)
    footer.cut(bad, rowstore.Layout.open(clean).footer_offset)
    L = rowstore.Layout.open(bad, allow_missing_footer=True)
    assert L.page_bytes == 0 and L.block_pages is None
    field = "x" if where == "row" else "wave"
    for how in ("take", "full"):
        with rowstore.open(bad, allow_missing_footer=True) as r, pytest.raises(ChecksumError):
            if how == "take":
                r.take([100], fields=[field])
            else:
                for _ in r.batches(16, shuffle="full", seed=1, fields=["id", field]):
                    pass
