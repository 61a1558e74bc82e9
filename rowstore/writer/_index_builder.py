"""Building the block index and the heap chunk index from what the writer recorded per chunk.

Pure numpy: the inputs are the per-chunk records of the chunk streams (file offsets, stored
sizes, CRC-32 checksums) and the heap range of each block; the outputs are the arrays stored as
``/rowstore/blocks`` (:data:`spec.BLOCK_DTYPE`) and ``/rowstore/heap_chunks``
(:data:`spec.HEAP_CHUNK_DTYPE`), which :class:`rowstore.format.index.Layout` reads back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rowstore.format import spec

__all__ = ["block_index", "heap_chunk_index"]


def block_index(
    *,
    rows_per_block: int,
    num_rows: int,
    offsets: Sequence[int] | np.ndarray,
    stored: Sequence[int],
    checksums: Sequence[int],
    heap_ranges: Sequence[tuple[int, int]],
) -> np.ndarray:
    """The block index: block ``k`` holds rows ``[k * rows_per_block, ...)`` (the last one
    the rest of ``num_rows``), its chunk at ``offsets[k]`` of ``stored[k]`` bytes, and its
    payloads at ``heap_ranges[k]`` of the logical heap. All sequences have one entry per block."""
    nblocks = len(offsets)
    if not len(stored) == len(checksums) == len(heap_ranges) == nblocks:
        raise ValueError(
            f"block_index: {nblocks} offsets, {len(stored)} sizes, {len(checksums)} checksums, "
            f"{len(heap_ranges)} heap ranges"
        )
    blocks = np.zeros(nblocks, dtype=spec.BLOCK_DTYPE)
    blocks["first_row"] = np.arange(nblocks, dtype=np.uint64) * rows_per_block
    blocks["num_rows"] = np.minimum(rows_per_block, num_rows - blocks["first_row"].astype(np.int64))
    blocks["offset"] = offsets
    blocks["stored_nbytes"] = stored
    blocks["checksum"] = np.asarray(checksums, dtype=np.uint64)
    ranges = np.asarray(heap_ranges, dtype=np.uint64).reshape(-1, 2)
    blocks["heap_start"] = ranges[:, 0]
    blocks["heap_end"] = ranges[:, 1]
    return blocks


def heap_chunk_index(
    *, offsets: Sequence[int] | np.ndarray, stored: Sequence[int], checksums: Sequence[int]
) -> np.ndarray:
    """The heap chunk index: chunk ``k`` at ``offsets[k]``, ``stored[k]`` bytes, its CRC-32."""
    if not len(stored) == len(checksums) == len(offsets):
        raise ValueError(
            f"heap_chunk_index: {len(offsets)} offsets, {len(stored)} sizes, {len(checksums)} "
            f"checksums"
        )
    chunks = np.zeros(len(offsets), dtype=spec.HEAP_CHUNK_DTYPE)
    chunks["offset"] = offsets
    chunks["stored_nbytes"] = stored
    chunks["checksum"] = np.asarray(checksums, dtype=np.uint64)
    return chunks
