"""The on-disk format, declared once. ``docs/format.md`` specifies it in prose; keep both in step.

Format v1 (one HDF5 file):

``/rowstore``                 group; attributes below
``/rowstore/rows``            compound dataset, one row per example, chunk = one block of rows
``/rowstore/heap``            1-D ``uint8`` dataset of variable-size payloads (absent if unused)
``/rowstore/blocks``          block index, :data:`BLOCK_DTYPE`, one entry per row chunk
``/rowstore/heap_chunks``     heap chunk index, :data:`HEAP_CHUNK_DTYPE` (absent if no heap)

Format v2 is the same HDF5 file (``format_version`` 2) followed by a footer: the attributes and
both indexes again, checksummed, which a reader opens the file from without libhdf5 (declared
in :mod:`rowstore.format.footer`).

Format v3 is v2 whose footer also holds a page index: a CRC-32 per page of every chunk's raw
bytes (:data:`PAGE_BYTES`, :func:`page_geometry`), so that a read of a few rows or payloads in
place (uncompressed chunks, memcpy'd heap chunks of compressed files) checks only the pages it
touches.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from rowstore.errors import SchemaError
from rowstore.schema import Field, Schema

FORMAT_NAME = "rowstore"
#: Format v2 = the v1 HDF5 file followed by a checksummed footer (:mod:`rowstore.format.footer`)
#: that readers open it from without libhdf5; v3 = v2 whose footer adds the page index (every
#: new file).
FORMAT_VERSION = 3
#: The version of files without a page index (appended to a v1 or v2 file).
FORMAT_VERSION_NO_PAGES = 2
#: Versions this code reads (v1 files, without a footer, through h5py).
READABLE_VERSIONS = (1, 2, 3)
#: The first version whose footer holds a page index.
PAGES_VERSION = 3

GROUP = "rowstore"
ROWS = "rows"
HEAP = "heap"
BLOCKS = "blocks"
HEAP_CHUNKS = "heap_chunks"

ATTR_FORMAT = "format"  # "rowstore"
ATTR_VERSION = "format_version"  # int
ATTR_SCHEMA = "schema"  # JSON text, see Schema.to_json
ATTR_USER = "user_attrs"  # JSON text (object), free for users
ATTR_NUM_ROWS = "num_rows"  # int
ATTR_ROWS_PER_BLOCK = "rows_per_block"  # int, = chunk length of /rows
ATTR_HEAP_CHUNK_BYTES = "heap_chunk_bytes"  # int, = chunk length of /heap
ATTR_HEAP_NBYTES = "heap_nbytes"  # int, logical heap size
ATTR_COMPRESSION = "compression"  # JSON text, see codecs.blocks.compression_config
ATTR_CHECKSUM = "checksum"  # "crc32": CRC-32 (zlib's) of each chunk's stored bytes
ATTR_WRITER = "writer"  # "rowstore <version>"
ATTR_PAGE_BYTES = "page_bytes"  # int (v3): the page size of the page index
ATTR_STATS = "stats"  # JSON text (optional): statistics of the rows, see format/stats.py

#: Page size of the page index of a v3 file: a heap chunk's pages are ``PAGE_BYTES`` bytes each
#: (its last one shorter), a block's pages ``max(1, PAGE_BYTES // row size)`` whole rows each.
#: 4 KiB: a checked read of a small row or payload moves at most a few KiB more than it asks
#: for; rows of 4 KiB or more get one CRC each; the index costs 1 KiB per MiB of data.
PAGE_BYTES = 4096
#: The writer places every HDF5 object of :data:`ALIGN_THRESHOLD` bytes or more (its heap
#: chunks and larger blocks) at a file offset that is a multiple of :data:`ALIGN_BYTES`, so that
#: their pages are the operating system's pages: a checked payload read, with the rest of its
#: first and last pages, then touches no page-cache page the payload itself does not (speech
#: rows, full shuffle, epoch 0, 3 paired runs of the same rows written both ways: verify=True
#: reads at 0.91-0.94 of verify=False aligned, 0.89-0.91 packed; docs/performance.md).
#: Padding costs at most 4 KiB per object (0.4% of a 1 MiB chunk).
#: Smaller blocks stay packed. Readers do not depend on it.
ALIGN_BYTES = 4096
ALIGN_THRESHOLD = 256 << 10
#: Largest page size a reader accepts (the writer uses :data:`PAGE_BYTES`).
MAX_PAGE_BYTES = 1 << 20
#: dtype of one page's CRC-32 (zlib.crc32 of the page's stored bytes).
PAGE_DTYPE = np.dtype("<u4")
#: int 1: the writer appended a v2 footer after the HDF5 part (a file without one lost it).
ATTR_HAS_FOOTER = "has_footer"

CHECKSUM = "crc32"

#: One entry per block (= chunk of /rows), in row order.
BLOCK_DTYPE = np.dtype(
    [
        ("first_row", "<u8"),  # index of the block's first row
        ("num_rows", "<u8"),  # valid rows in the block (the chunk holds rows_per_block rows)
        ("offset", "<u8"),  # file offset of the stored chunk
        ("stored_nbytes", "<u8"),  # size of the stored chunk (compressed or not)
        ("checksum", "<u8"),  # CRC-32 (zlib.crc32) of the stored chunk bytes
        ("heap_start", "<u8"),  # logical heap range of the block's payloads: [start, end)
        ("heap_end", "<u8"),
    ]
)

#: One entry per heap chunk, in logical order.
HEAP_CHUNK_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("stored_nbytes", "<u8"),
        ("checksum", "<u8"),
    ]
)

#: Suffix of the boolean column that marks a nullable field's null rows.
NULL_SUFFIX = "__null"


def page_geometry(page_bytes: int, chunk_bytes: int, unit: int = 1) -> tuple[int, int]:
    """``(bytes per page, pages per chunk)`` of a chunk of ``chunk_bytes`` raw bytes made of
    items of ``unit`` bytes (a block: rows of the row size; a heap chunk: 1): a page holds
    ``max(1, page_bytes // unit)`` whole items; the chunk's last page holds the rest."""
    plen = max(1, page_bytes // unit) * unit
    return plen, -(-chunk_bytes // plen)


#: Pieces a block is cut into by the reader's default block order (reader.order.AUTO_PIECES).
BLOCK_PIECES = 8


def page_rows_per_block(rows_per_block: int, row_size: int, page_bytes: int = PAGE_BYTES) -> int:
    """The writer's rows per block when it derives them from ``block_bytes``: rounded down to
    a multiple of :data:`BLOCK_PIECES` pages of rows where that loses at most an eighth of the
    block, so that each of its ``BLOCK_PIECES`` pieces (and halves, quarters) starts and ends
    on a page. A first-epoch checked read of a piece then reads no page it shares with a
    neighbour (tiny rows of 72 bytes, 64 KiB blocks: 896 rows rather than 910, for which the
    check costs 5% of an epoch's samples rather than 9%). Rows of a page or more, and blocks
    too small to round, keep
    ``rows_per_block``."""
    rpp = page_geometry(page_bytes, row_size, row_size)[0] // row_size  # rows per page
    unit = BLOCK_PIECES * rpp
    cut = rows_per_block - rows_per_block % unit
    if rpp == 1 or cut == 0 or rows_per_block - cut > rows_per_block // 8:
        return rows_per_block
    return cut


# -- compression ---------------------------------------------------------------------------
# Block compression (one HDF5 filter on /rows and /heap, applied per chunk; the ``compression``
# attribute holds its config) is declared in :mod:`rowstore.codecs.blocks`: the Blosc2 names,
# codes and filter id, and the objects that compress with them.


# -- allocation limits ---------------------------------------------------------------------
# What a valid file never exceeds. The writer refuses to go beyond them, so a reader may refuse a
# file that declares more before it allocates anything for it (a hostile or corrupt file).

#: Largest raw (uncompressed) chunk in bytes: a block of rows (``rows_per_block * row size``) or
#: a heap chunk (``heap_chunk_bytes``). Also keeps Blosc2 chunks below their 2 GiB limit.
MAX_CHUNK_BYTES = 1 << 30
#: Most bytes a stored (Blosc2-framed) chunk may hold beyond its raw size: frame header, chunk
#: header, offsets and trailer take about 200 bytes; incompressible data is stored as is. Bounds
#: what a reader allocates for a compressed chunk by its raw size, not by a size the index
#: claims (a dataset manifest's file sizes are only checked when a shard is first read).
MAX_FRAME_OVERHEAD = 1 << 16
#: Largest value of one field in one row, in bytes: the decoded value (array bytes, text as UTF-8,
#: bytes) and its stored payload (``nbytes`` of a heap reference). A reader may size one value's
#: buffer from a row's reference once it has checked it against this.
MAX_VALUE_BYTES = 1 << 31
#: Largest logical heap (``heap_nbytes``), in bytes: 256 TiB. No real file comes near it; it keeps
#: every heap offset and ``offset + nbytes`` far from ``uint64``/``int64`` overflow.
MAX_HEAP_BYTES = 1 << 48


# -- row layout ----------------------------------------------------------------------------
#: numpy sizes a structured dtype, and each of its fields, in a C int.
MAX_ROW_BYTES = (1 << 31) - 1


def heap_ref_dtype(field: Field) -> np.dtype:
    """The in-row reference of a heap field: payload offset and size in the logical heap,
    plus the variable dimensions of the value (``uint32`` each) when it has any."""
    parts: list[tuple] = [("offset", "<u8"), ("nbytes", "<u8")]
    k = len(field.variable_dims)
    if k:
        parts.append(("shape", "<u4", (k,)))
    return np.dtype(parts)


def row_dtype(schema: Schema) -> np.dtype:
    """The packed (unaligned), little-endian compound dtype of one stored row.

    Columns follow the schema's order: an inline field whose codec stores ``raw_bytes`` (``raw``) is
    stored as its value
    (``(name, dtype, shape)``; ``<i8`` for datetime64/timedelta64 fields), an inline field of
    another codec as its encoded bytes
    (``(name, "u1", (field.stored_nbytes,))``), a heap field as :func:`heap_ref_dtype`;
    every nullable field adds a ``<name>__null`` boolean column right after it.
    """
    parts: list[tuple] = []
    for f in schema:
        if not f.inline:
            parts.append((f.name, heap_ref_dtype(f)))
        elif f.codec_obj.raw_bytes:  # the value's own little-endian bytes
            dt = (
                f.storage_dtype
            )  # datetime64/timedelta64: their int64 counts (HDF5 has no such type)
            parts.append((f.name, dt, f.shape) if f.shape else (f.name, dt))
        else:  # an inline codec that is not raw: its encoded bytes, always the same number
            parts.append((f.name, "u1", (f.stored_nbytes,)))
        if f.nullable:
            parts.append((f.name + NULL_SUFFIX, "|b1"))

    def nbytes(p: tuple) -> int:
        return math.prod(p[2] if len(p) == 3 else ()) * np.dtype(p[1]).itemsize

    # numpy sizes a dtype (each field's, the row's) in a C int: it refuses some sizes past it and
    # wraps others around to a negative itemsize, so the row's size is counted here in Python ints
    try:
        dtype = np.dtype(parts)
    except (ValueError, OverflowError) as exc:
        why = str(exc)
    else:
        if 0 < dtype.itemsize <= MAX_ROW_BYTES and dtype.itemsize == sum(map(nbytes, parts)):
            return dtype
        why = f"the row has {sum(map(nbytes, parts))} bytes"
    big = max(parts, key=nbytes)
    raise SchemaError(
        f"field {big[0]!r}: a value of {nbytes(big)} bytes in the row; numpy limits a row, and "
        f"each value in it, to {MAX_ROW_BYTES} bytes ({why}); store large arrays as "
        f"variable-shape fields (on the heap) or split them over rows",
        field=big[0],
    )


def blosc_typesize(dtype: np.dtype) -> int:
    """Typesize for Blosc's byte shuffle: the itemsize that holds most of a row's bytes, when it
    divides the row size; 1 otherwise (shuffle then changes nothing)."""
    weights: Counter[int] = Counter()

    def walk(dt: np.dtype, count: int) -> None:
        if dt.fields:
            for sub, _off in (dt.fields[n][:2] for n in dt.names or ()):
                walk(sub, count)
        elif dt.subdtype is not None:
            base, shape = dt.subdtype
            walk(base, count * int(np.prod(shape)))
        else:
            weights[dt.itemsize] += dt.itemsize * count

    walk(dtype, 1)
    size, _ = weights.most_common(1)[0]
    return size if dtype.itemsize % size == 0 and size <= 255 else 1
