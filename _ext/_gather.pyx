# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Row -> column gathers from loaded rows: fixed-size fields and heap payloads.

Each kernel checks every row index against the loaded rows, every heap reference against its
block's heap range and every destination against the bytes it will write, itself: memory safety
does not rest on ``rowstore/kernels.py``. Failures are return codes in ``err`` (``_common``).
"""

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from _common cimport (
    E_BOUNDS, E_DEST, E_NOMEM, E_OK, E_ROW, _errbuf, _fail, _fits, _heap_payload, _hold, _release,
)


cdef extern from *:
    void __builtin_prefetch(const void* p) nogil


ctypedef struct _Field:
    uint8_t* out     # row i of this field goes to out + i * size
    int64_t offset   # of the field in the row
    int64_t size


def gather_fixed(const uint8_t[::1] src not None, int64_t row_size, int64_t field_offset,
                 int64_t field_size, const int64_t[::1] rows not None, uint8_t[::1] out not None,
                 int64_t[::1] err not None):
    """``out[i*field_size : (i+1)*field_size] = src[rows[i]*row_size + field_offset : +field_size]``.

    Gathers one field of the given rows (indices into the loaded rows of ``src``) into a
    contiguous batch array of at least ``len(rows) * field_size`` bytes. Returns 0, or -1 with
    ``err = [E_ROW, i, rows[i]]`` (or ``E_DEST``).
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = rows.shape[0]
    cdef int64_t nrows_src
    cdef int rc
    cdef const uint8_t* s
    cdef uint8_t* o
    if row_size <= 0 or field_size < 0 or field_offset < 0 or field_offset > row_size - field_size:
        raise ValueError("gather_fixed: field outside the row")
    if not _fits(n, field_size, out.shape[0]):
        return _fail(e, E_DEST, 0, out.shape[0])
    if n == 0 or field_size == 0:
        return 0
    nrows_src = src.shape[0] // row_size
    s = &src[0] + field_offset if src.shape[0] else NULL
    o = &out[0]
    with nogil:
        # One loop per common size: a memcpy of constant size compiles to one load and store.
        if field_size == 8:
            rc = _gather_fixed(s, nrows_src, row_size, &rows[0], n, o, 8, e)
        elif field_size == 4:
            rc = _gather_fixed(s, nrows_src, row_size, &rows[0], n, o, 4, e)
        else:
            rc = _gather_fixed(s, nrows_src, row_size, &rows[0], n, o, <size_t>field_size, e)
    return rc


cdef inline int _gather_fixed(const uint8_t* s, int64_t nrows_src, int64_t row_size, const int64_t* rows,
                              Py_ssize_t n, uint8_t* o, size_t size, int64_t* err) noexcept nogil:
    """The loop of :func:`gather_fixed` (inlined once per constant ``size``)."""
    cdef Py_ssize_t i
    cdef int64_t r
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= nrows_src:
            return _fail(err, E_ROW, i, r)
        memcpy(o + i * size, s + r * row_size, size)
    return 0


def gather_rows(const uint8_t[::1] src not None, int64_t row_size, const int64_t[::1] rows not None,
                const int64_t[::1] field_offsets not None, const int64_t[::1] field_sizes not None,
                outs, int64_t[::1] err not None):
    """Gather several fields of each row in one pass (one cache miss per row, not per field).

    For field j: ``field_sizes[j]`` bytes at ``field_offsets[j]`` in row ``rows[i]`` go to row
    i of ``outs[j]``, a writeable C-contiguous buffer of at least ``len(rows) * field_sizes[j]``
    bytes (checked here; each buffer is held for the call). Returns 0, or -1
    with ``err = [E_ROW, i, rows[i]]`` (or ``E_DEST``, ``E_NOMEM``).
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = rows.shape[0], nf = field_offsets.shape[0], j, held = 0
    cdef _Field* fields
    cdef Py_buffer* views
    cdef int rc
    if field_sizes.shape[0] != nf or len(outs) != nf:
        raise ValueError("gather_rows: argument lengths differ")
    if row_size <= 0:
        raise ValueError("gather_rows: bad row size")
    for j in range(nf):
        if field_offsets[j] < 0 or field_sizes[j] < 0 or field_offsets[j] > row_size - field_sizes[j]:
            raise ValueError("gather_rows: field outside the row")
    if n == 0 or nf == 0:
        return 0
    # One block: the fields the loop reads, then the buffers held for the call.
    fields = <_Field*>malloc(nf * (sizeof(_Field) + sizeof(Py_buffer)))
    if fields == NULL:
        return _fail(e, E_NOMEM, 0, nf)
    views = <Py_buffer*>(fields + nf)
    try:
        for j in range(nf):
            _hold(outs[j], &views[j])
            held += 1
            if not _fits(n, field_sizes[j], views[j].len):
                return _fail(e, E_DEST, j, views[j].len)
            fields[j].out = <uint8_t*>views[j].buf
            fields[j].offset = field_offsets[j]
            fields[j].size = field_sizes[j]
        with nogil:
            rc = _gather_rows(&src[0] if src.shape[0] else NULL, src.shape[0] // row_size, row_size,
                              &rows[0], n, fields, nf, e)
    finally:
        _release(views, held)
        free(fields)
    return rc


cdef int _gather_rows(const uint8_t* s, int64_t nrows_src, int64_t row_size, const int64_t* rows,
                      Py_ssize_t n, const _Field* fields, Py_ssize_t nf, int64_t* err) noexcept nogil:
    """The loop of :func:`gather_rows`: rows outer, fields inner, the row 16 ahead prefetched."""
    cdef Py_ssize_t i, j
    cdef int64_t r, sz, ahead
    cdef const uint8_t* row
    cdef uint8_t* o
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= nrows_src:
            return _fail(err, E_ROW, i, r)
        if i + 16 < n:
            ahead = rows[i + 16]
            if ahead >= 0 and ahead < nrows_src:
                __builtin_prefetch(s + ahead * row_size)
        row = s + r * row_size
        for j in range(nf):
            sz = fields[j].size
            o = fields[j].out + i * sz
            if sz == 8:
                memcpy(o, row + fields[j].offset, 8)
            elif sz == 4:
                memcpy(o, row + fields[j].offset, 4)
            elif sz == 1:
                o[0] = row[fields[j].offset]
            else:
                memcpy(o, row + fields[j].offset, <size_t>sz)
    return 0


def gather_heap(const uint8_t[::1] src not None, int64_t row_size, int64_t ref_offset,
                const int64_t[::1] rows not None, int64_t rows_per_slot,
                const int64_t[::1] slot_lo not None, const int64_t[::1] slot_hi not None,
                const int64_t[::1] slot_base not None,
                const uint8_t[::1] heap not None,
                uint8_t[::1] out not None, const int64_t[::1] dst_offsets not None,
                int64_t pad_stride, int64_t[::1] err not None):
    """Copy the heap payload of each row into ``out`` at ``dst_offsets[i]``.

    A row's reference (``<u8 offset, <u8 nbytes`` at ``ref_offset`` in the row) is checked to lie
    inside its block's heap range ``[slot_lo[s], slot_hi[s])``, ``s = rows[i] // rows_per_slot``;
    the payload's bytes are at ``heap[slot_base[s] + offset]``, checked to lie in ``heap``. With
    ``pad_stride > 0`` each row's region ``[dst_offsets[i], dst_offsets[i] + pad_stride)`` is
    zero-filled past the payload (padded batches); the payload must fit the stride. Returns 0,
    or -1 with ``err`` (``E_ROW``, ``E_BOUNDS``, ``E_DEST``).
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = rows.shape[0], i
    cdef int64_t nrows_src, r, s, off, nb, pos, d, nslots = slot_lo.shape[0]
    cdef int64_t heap_len = heap.shape[0], out_len = out.shape[0]
    cdef int rc = 0, code
    cdef const uint8_t* hp = &heap[0] if heap.shape[0] else NULL
    cdef uint8_t* op = &out[0] if out.shape[0] else NULL
    if row_size <= 0 or ref_offset < 0 or ref_offset > row_size - 16 or rows_per_slot <= 0:
        raise ValueError("gather_heap: bad row geometry")
    if slot_hi.shape[0] != nslots or slot_base.shape[0] != nslots or dst_offsets.shape[0] < n:
        raise ValueError("gather_heap: argument lengths differ")
    if n == 0:
        return 0
    nrows_src = src.shape[0] // row_size
    with nogil:
        for i in range(n):
            r = rows[i]
            if r < 0 or r >= nrows_src or r // rows_per_slot >= nslots:
                rc = _fail(e, E_ROW, i, r)
                break
            s = r // rows_per_slot
            d = dst_offsets[i]
            code = _heap_payload(&src[r * row_size + ref_offset], slot_lo[s], slot_hi[s], op, out_len, d,
                                 pad_stride, &off, &nb)
            if code != E_OK:
                rc = _fail(e, code, i, r if code == E_BOUNDS else nb)
                break
            pos = slot_base[s] + off
            # (an empty payload reads nothing: it may sit at the end of an empty heap range)
            if nb > 0 and (pos < 0 or pos > heap_len or nb > heap_len - pos):
                rc = _fail(e, E_BOUNDS, i, r)
                break
            if nb > 0:
                memcpy(op + d, hp + pos, <size_t>nb)
    return rc
