# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Direct reads for uncompressed files: rows and heap payloads from the file into place.

``pread``/``preadv`` with the GIL released. Each kernel checks the destinations it writes to
itself (memory safety does not rest on ``rowstore/kernels.py``); failures are return codes in
``err`` (``_common``).
"""

from libc.errno cimport EINTR, errno
from libc.stdint cimport int32_t, int64_t, uint8_t

from _common cimport (
    E_BOUNDS, E_DEST, E_IO, E_OK, E_ROW, E_SIZE, _errbuf, _fail, _fits, _heap_payload, _hold, _pread_full,
    _release,
)


cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t preadv(int fd, const iovec* iov, int iovcnt, long offset)


cdef enum:
    MAX_SEGMENTS = 64  # segments of a row in preadv_rows (sizes its stack arrays)


cdef inline Py_ssize_t _fd_step(const int32_t[::1] fds, Py_ssize_t n) except -1:
    """Stride through ``fds``: 0 for one descriptor used by every item, 1 for one per item."""
    if fds.shape[0] == 1:
        return 0
    if fds.shape[0] != n:
        raise ValueError("fds must hold one descriptor, or one per item")
    return 1


def pread_rows(const int32_t[::1] fds not None, const int64_t[::1] file_offsets not None, int64_t row_size,
               uint8_t[::1] dst not None, int64_t[::1] err not None):
    """Read row i (``row_size`` bytes at ``file_offsets[i]`` of descriptor ``fds[i]``, or of
    ``fds[0]`` when it holds one) into ``dst[i*row_size:]``: the direct path for uncompressed
    files under uniform shuffling (no block read per row). The caller derives offsets from the
    validated block index. Returns 0 or -1 (``err``)."""
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = file_offsets.shape[0], i, step = _fd_step(fds, file_offsets.shape[0])
    cdef int rc = 0
    if row_size <= 0 or not _fits(n, row_size, dst.shape[0]):
        return _fail(e, E_DEST, 0, dst.shape[0])
    with nogil:
        for i in range(n):
            if file_offsets[i] < 0:
                rc = _fail(e, E_SIZE, i, file_offsets[i])
                break
            if _pread_full(fds[i * step], &dst[i * row_size], row_size, file_offsets[i], e, i) < 0:
                rc = -1
                break
    return rc


def pread_heap(const int32_t[::1] fds not None, const uint8_t[::1] src not None, int64_t row_size,
               int64_t ref_offset, const int64_t[::1] rows not None,
               const int64_t[::1] lo not None, const int64_t[::1] hi not None,
               const int64_t[::1] chunk_offsets not None, const int64_t[::1] chunk_base not None,
               int64_t chunk_bytes,
               uint8_t[::1] out not None, const int64_t[::1] dst_offsets not None,
               int64_t pad_stride, int64_t[::1] err not None):
    """Direct path for uncompressed heaps: for each row ``rows[i]`` of ``src``, read its payload
    straight from the file into ``out`` at ``dst_offsets[i]`` (one copy, no heap chunk loaded).

    The reference must lie in ``[lo[i], hi[i])`` (its block's heap range); logical heap offsets
    map to file offsets through ``chunk_offsets`` (one per heap chunk of ``chunk_bytes``; row i's
    heap starts at chunk ``chunk_base[i]``, or ``chunk_base[0]`` for every row when it holds one:
    several files' chunk tables concatenated), a payload may span chunks. Row i is read from
    descriptor ``fds[i]`` (or ``fds[0]``). ``pad_stride`` as in ``gather_heap``. Returns 0 or -1
    (``err``).
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = lo.shape[0], i, step, bstep
    cdef int64_t off, nb, d, k, within, take, r, nchunks = chunk_offsets.shape[0]
    cdef int64_t nrows_src, out_len = out.shape[0]
    cdef int rc = 0, code
    cdef uint8_t* op = &out[0] if out.shape[0] else NULL
    if row_size <= 0 or ref_offset < 0 or ref_offset > row_size - 16 or chunk_bytes <= 0:
        raise ValueError("pread_heap: bad geometry")
    if hi.shape[0] != n or rows.shape[0] != n or dst_offsets.shape[0] < n:
        raise ValueError("pread_heap: argument lengths differ")
    step = _fd_step(fds, n)
    if chunk_base.shape[0] != 1 and chunk_base.shape[0] != n:
        raise ValueError("pread_heap: chunk_base must hold one value, or one per row")
    bstep = 0 if chunk_base.shape[0] == 1 else 1
    nrows_src = src.shape[0] // row_size
    with nogil:
        for i in range(n):
            r = rows[i]
            if r < 0 or r >= nrows_src:
                rc = _fail(e, E_ROW, i, r)
                break
            d = dst_offsets[i]
            code = _heap_payload(&src[r * row_size + ref_offset], lo[i], hi[i], op, out_len, d, pad_stride,
                                 &off, &nb)
            if code != E_OK:
                rc = _fail(e, code, i, r if code == E_BOUNDS else nb)
                break
            while nb > 0:
                k = off // chunk_bytes
                within = off - k * chunk_bytes
                k += chunk_base[i * bstep]  # the file's chunks start there in chunk_offsets
                if k < 0 or k >= nchunks:
                    rc = _fail(e, E_BOUNDS, i, r)
                    break
                take = chunk_bytes - within
                if take > nb:
                    take = nb
                if _pread_full(fds[i * step], op + d, take, chunk_offsets[k] + within, e, i) < 0:
                    rc = -1
                    break
                off += take
                d += take
                nb -= take
            if rc != 0:
                break
    return rc


def preadv_rows(const int32_t[::1] fds not None, const int64_t[::1] file_offsets not None, int64_t row_size,
                const int64_t[::1] seg_sizes not None, outs, uint8_t[::1] sink not None,
                int64_t[::1] err not None):
    """Read rows straight from the file into per-field batch arrays, one ``preadv`` per row.

    The row is cut into consecutive segments of ``seg_sizes[j]`` bytes (1..64 of them, summing
    to ``row_size``); segment j of row i goes to row i of ``outs[j]``, a writeable C-contiguous
    buffer of at least ``len(file_offsets) * seg_sizes[j]`` bytes (checked here, held for the
    call), or to ``sink`` when ``outs[j]`` is None (columns not asked for). Row i is read from
    descriptor ``fds[i]`` (or ``fds[0]`` when it holds one). No intermediate copy: the direct
    path for large uncompressed rows. Returns 0 or -1 (``err``).
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = file_offsets.shape[0], nseg = seg_sizes.shape[0], j, held = 0
    cdef Py_ssize_t step = _fd_step(fds, file_offsets.shape[0])
    cdef int64_t total = 0
    cdef int rc
    cdef uint8_t* bases[MAX_SEGMENTS]
    cdef Py_buffer views[MAX_SEGMENTS]
    if nseg < 1 or nseg > MAX_SEGMENTS or len(outs) != nseg:
        raise ValueError(f"preadv_rows: 1..{MAX_SEGMENTS} segments expected, as many outs")
    for j in range(nseg):
        if seg_sizes[j] <= 0 or seg_sizes[j] > row_size:
            raise ValueError("preadv_rows: segment sizes must be positive, within the row")
        total += seg_sizes[j]
    if total != row_size:
        raise ValueError("preadv_rows: segments do not cover the row")
    if n == 0:
        return 0
    for j in range(nseg):
        if outs[j] is None and seg_sizes[j] > sink.shape[0]:
            return _fail(e, E_DEST, j, sink.shape[0])
    try:
        for j in range(nseg):
            bases[j] = NULL
            if outs[j] is not None:
                _hold(outs[j], &views[held])
                held += 1
                if not _fits(n, seg_sizes[j], views[held - 1].len):
                    return _fail(e, E_DEST, j, views[held - 1].len)
                bases[j] = <uint8_t*>views[held - 1].buf
        with nogil:
            rc = _preadv_rows(&fds[0], step, &file_offsets[0], n, row_size, &seg_sizes[0], bases, nseg,
                              &sink[0] if sink.shape[0] else NULL, e)
    finally:
        _release(views, held)
    return rc


cdef int _preadv_rows(const int32_t* fds, Py_ssize_t step, const int64_t* file_offsets, Py_ssize_t n,
                      int64_t row_size,
                      const int64_t* seg_sizes, uint8_t** bases, Py_ssize_t nseg, uint8_t* sink,
                      int64_t* e) noexcept nogil:
    """The loop of :func:`preadv_rows` (``bases[j]`` NULL: segment j goes to ``sink``)."""
    cdef Py_ssize_t i, j
    cdef int64_t done, want
    cdef ssize_t got
    cdef iovec iov[MAX_SEGMENTS]
    cdef int fd
    for i in range(n):
        fd = fds[i * step]
        if file_offsets[i] < 0:
            return _fail(e, E_SIZE, i, file_offsets[i])
        for j in range(nseg):
            iov[j].iov_len = <size_t>seg_sizes[j]
            iov[j].iov_base = <void*>(sink if bases[j] == NULL else bases[j] + i * seg_sizes[j])
        got = preadv(fd, iov, <int>nseg, <long>file_offsets[i])
        while got < 0 and errno == EINTR:
            got = preadv(fd, iov, <int>nseg, <long>file_offsets[i])
        if got < 0:
            return _fail(e, E_IO, i, errno)
        if got < row_size:
            # Short read: finish with plain preads (a truncated file ends in E_SHORT).
            done = got
            for j in range(nseg):
                want = seg_sizes[j]
                if done >= want:
                    done -= want
                    continue
                if _pread_full(fd, <uint8_t*>iov[j].iov_base + done, want - done,
                               file_offsets[i] + got, e, i) < 0:
                    return -1
                got += want - done
                done = 0
    return 0
