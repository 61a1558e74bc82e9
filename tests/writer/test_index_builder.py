"""The block and heap chunk indexes (rowstore.writer._index_builder) built from per-chunk
records."""

from __future__ import annotations

import numpy as np
import pytest

from rowstore.format import spec
from rowstore.writer._index_builder import block_index, heap_chunk_index


def test_block_index():
    b = block_index(
        rows_per_block=4,
        num_rows=10,
        offsets=np.array([100, 300, 500]),
        stored=[200, 180, 90],
        checksums=[1, 2**32 - 1, 3],
        heap_ranges=[(0, 5), (5, 5), (5, 12)],
    )
    assert b.dtype == spec.BLOCK_DTYPE
    assert b["first_row"].tolist() == [0, 4, 8] and b["num_rows"].tolist() == [
        4,
        4,
        2,
    ]  # the last one partial
    assert b["offset"].tolist() == [100, 300, 500] and b["stored_nbytes"].tolist() == [200, 180, 90]
    assert b["checksum"].tolist() == [1, 2**32 - 1, 3]
    assert b["heap_start"].tolist() == [0, 5, 5] and b["heap_end"].tolist() == [5, 5, 12]


def test_empty_indexes():
    b = block_index(
        rows_per_block=7,
        num_rows=0,
        offsets=np.zeros(0, np.int64),
        stored=[],
        checksums=[],
        heap_ranges=[],
    )
    h = heap_chunk_index(offsets=np.zeros(0, np.int64), stored=[], checksums=[])
    assert b.dtype == spec.BLOCK_DTYPE and len(b) == 0
    assert h.dtype == spec.HEAP_CHUNK_DTYPE and len(h) == 0


def test_heap_chunk_index():
    h = heap_chunk_index(offsets=[10, 80], stored=[64, 30], checksums=[7, 8])
    assert h.dtype == spec.HEAP_CHUNK_DTYPE
    assert h.tolist() == [(10, 64, 7), (80, 30, 8)]


def test_records_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="2 offsets, 1 sizes"):
        block_index(
            rows_per_block=1,
            num_rows=2,
            offsets=[0, 1],
            stored=[1],
            checksums=[1, 2],
            heap_ranges=[(0, 0)] * 2,
        )
    with pytest.raises(ValueError, match="heap ranges"):
        block_index(
            rows_per_block=1,
            num_rows=2,
            offsets=[0, 1],
            stored=[1, 1],
            checksums=[1, 2],
            heap_ranges=[(0, 0)],
        )
    with pytest.raises(ValueError):
        heap_chunk_index(offsets=[0], stored=[1, 2], checksums=[1])
