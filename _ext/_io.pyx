# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Direct reads for uncompressed files: rows and heap payloads from the file into place.

``pread``/``preadv`` with the GIL released. Each kernel checks the destinations it writes to
itself (memory safety does not rest on ``rowstore/kernels.py``); failures are return codes in
``err`` (``_common``). The page checks of format v3 (CRC-32 of a row's or a page's bytes, in
the pass that reads them) use zlib-ng's CRC-32 inside libblosc2.a.
"""

from libc.errno cimport EINTR, errno
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc, qsort, realloc

from _common cimport (
    E_BOUNDS, E_CHECKSUM, E_DEST, E_IO, E_NOMEM, E_OK, E_ROW, E_SIZE, _errbuf, _fail, _fits, _heap_payload,
    _hold, _pread_full, _release,
)
from libblosc2 cimport zng_crc32


cdef extern from *:
    void __builtin_prefetch(const void* p) nogil


cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t preadv(int fd, const iovec* iov, int iovcnt, long offset)


cdef enum:
    MAX_SEGMENTS = 64  # segments of a row in preadv_rows (sizes its stack arrays)
    MAX_IOV = 256      # parts of one preadv of pread_heap's extents (its stack array)
    MAX_GAP = 4096     # bytes between two payloads read (into a sink) rather than a call each


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


cdef struct _Extent:
    int64_t file_off   # where the bytes lie in the file
    int64_t length
    uint8_t* dst       # where they go
    int32_t fd
    int32_t field      # which field, and which item (row), an error names
    int64_t item


cdef int _extent_order(const void* a, const void* b) noexcept nogil:
    """qsort order of extents: by descriptor, then file offset."""
    cdef const _Extent* x = <const _Extent*>a
    cdef const _Extent* y = <const _Extent*>b
    if x.fd != y.fd:
        return -1 if x.fd < y.fd else 1
    if x.file_off != y.file_off:
        return -1 if x.file_off < y.file_off else 1
    return 0


cdef int _preadv_full(int fd, iovec* iov, int nv, int64_t offset, int64_t want, int64_t* e,
                      int64_t i) noexcept nogil:
    """One ``preadv`` of ``want`` bytes at ``offset`` into ``iov[0..nv)`` (retrying EINTR); a
    short read is finished with plain preads, so a truncated file ends in ``E_SHORT``."""
    cdef ssize_t got
    cdef int64_t done, at, part
    cdef int j
    got = preadv(fd, iov, nv, <long>offset)
    while got < 0 and errno == EINTR:
        got = preadv(fd, iov, nv, <long>offset)
    if got < 0:
        return _fail(e, E_IO, i, errno)
    if got < want:
        done, at = got, offset + got
        for j in range(nv):
            part = <int64_t>iov[j].iov_len
            if done >= part:
                done -= part
                continue
            if _pread_full(fd, <uint8_t*>iov[j].iov_base + done, part - done, at, e, i) < 0:
                return -1
            at += part - done
            done = 0
    return 0


cdef int _read_extents(_Extent* ex, Py_ssize_t m, uint8_t* sink, int64_t* e, int64_t* field) noexcept nogil:
    """Read extents ``ex[0..m)`` (sorted here by descriptor and file offset): extents that follow
    each other in a file, apart by at most ``MAX_GAP`` bytes (read into ``sink``), go in one
    ``preadv`` of up to ``MAX_IOV`` parts; ``field`` names the failing extent's field."""
    cdef Py_ssize_t a = 0, b
    cdef int nv
    cdef int64_t end, gap
    cdef iovec iov[MAX_IOV]
    qsort(ex, <size_t>m, sizeof(_Extent), _extent_order)
    while a < m:
        iov[0].iov_base, iov[0].iov_len = <void*>ex[a].dst, <size_t>ex[a].length
        nv = 1
        end = ex[a].file_off + ex[a].length
        b = a + 1
        while b < m and nv + 2 <= MAX_IOV and ex[b].fd == ex[a].fd and ex[b].file_off >= end:
            gap = ex[b].file_off - end
            if gap > MAX_GAP:
                break
            if gap > 0:
                iov[nv].iov_base, iov[nv].iov_len = <void*>sink, <size_t>gap
                nv += 1
            iov[nv].iov_base, iov[nv].iov_len = <void*>ex[b].dst, <size_t>ex[b].length
            nv += 1
            end = ex[b].file_off + ex[b].length
            b += 1
        field[0] = ex[a].field
        if nv == 1:
            if _pread_full(ex[a].fd, ex[a].dst, ex[a].length, ex[a].file_off, e, ex[a].item) < 0:
                return -1
        elif _preadv_full(ex[a].fd, iov, nv, ex[a].file_off, end - ex[a].file_off, e, ex[a].item) < 0:
            return -1
        a = b
    return 0


def pread_heap(const int32_t[::1] fds not None, const uint8_t[::1] src not None, int64_t row_size,
               const int64_t[::1] ref_offsets not None, const int64_t[::1] rows not None,
               const int64_t[::1] lo not None, const int64_t[::1] hi not None,
               const int64_t[::1] chunk_offsets not None, const int64_t[::1] chunk_base not None,
               int64_t chunk_bytes, outs, dst_offsets, int64_t pad_stride, int64_t[::1] err not None,
               int64_t page_len=0, const uint32_t[::1] page_crcs=None, uint8_t[::1] page_checked=None,
               uint8_t[::1] scratch=None, const uint32_t[::1] page_shift=None):
    """Direct path for uncompressed heaps: for each heap field j (its reference at byte
    ``ref_offsets[j]`` of a row) and each row ``rows[i]`` of ``src``, read the row's payload
    straight from the file into ``outs[j]`` at ``dst_offsets[j][i]`` (one copy, no heap chunk
    loaded; ``outs[j]`` a writeable C-contiguous buffer, ``dst_offsets[j]`` int64, at least one
    per row).

    The reference must lie in ``[lo[i], hi[i])`` (its block's heap range); logical heap offsets
    map to file offsets through ``chunk_offsets`` (one per heap chunk of ``chunk_bytes``; row i's
    heap starts at chunk ``chunk_base[i]``, or ``chunk_base[0]`` for every row when it holds one:
    several files' chunk tables concatenated), a payload may span chunks. Row i is read from
    descriptor ``fds[i]`` (or ``fds[0]``). ``pad_stride`` as in ``gather_heap``.

    The payloads of all fields and rows are read together in file order: those that follow
    each other in the file (a row's fields, the rows of a block's piece), apart by at most
    ``MAX_GAP`` bytes, go in one ``preadv``, so a row of several heap fields costs about one
    call instead of one per field.

    With ``page_len`` > 0 (format v3's heap pages: ``page_len`` bytes of a chunk, its last page
    the rest; ``page_crcs`` one CRC-32 per page, ``ceil(chunk_bytes / page_len)`` per chunk;
    ``page_checked`` one flag per page, set here; ``page_shift`` the :func:`crc_shift_table` of
    ``page_len``): a payload piece whose pages are all flagged is read as above; otherwise one
    ``preadv`` reads it into place and the rest of its first and last pages not checked yet
    into ``scratch`` (two pages), and its pages are checked against their CRCs in one pass
    right after (else ``E_CHECKSUM`` with detail the page) and flagged: one read, checked in
    its pass, no copy. Returns 0 or -1 (``err``: index the row; ``err[3]``, where ``err`` holds
    four values, the field).
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = lo.shape[0], nf = ref_offsets.shape[0], i, j, step, bstep, m = 0, cap = 0
    cdef Py_ssize_t nheld = 0, ndheld = 0
    cdef int64_t off, nb, d, k, within, take, r, nchunks = chunk_offsets.shape[0]
    cdef int64_t nrows_src, out_len, failed = 0
    cdef int rc = 0, code
    cdef uint8_t* op
    cdef const int64_t* dsts
    cdef _Extent* ex = NULL
    cdef _Extent* grown
    cdef uint8_t sink[MAX_GAP]
    cdef Py_buffer* views = NULL
    cdef Py_buffer* dviews = NULL
    if row_size <= 0 or chunk_bytes <= 0:
        raise ValueError("pread_heap: bad geometry")
    if len(outs) != nf or len(dst_offsets) != nf:
        raise ValueError("pread_heap: one out and one dst_offsets per field")
    for j in range(nf):
        if ref_offsets[j] < 0 or ref_offsets[j] > row_size - 16:
            raise ValueError("pread_heap: bad geometry")
    if hi.shape[0] != n or rows.shape[0] != n:
        raise ValueError("pread_heap: argument lengths differ")
    step = _fd_step(fds, n)
    if chunk_base.shape[0] != 1 and chunk_base.shape[0] != n:
        raise ValueError("pread_heap: chunk_base must hold one value, or one per row")
    bstep = 0 if chunk_base.shape[0] == 1 else 1
    nrows_src = src.shape[0] // row_size
    cdef int64_t per = 0
    cdef const uint32_t* crcs = NULL
    cdef uint8_t* flags = NULL
    cdef uint8_t* sp = NULL
    cdef const uint32_t* shift = NULL
    if page_len > 0:
        per = (chunk_bytes + page_len - 1) // page_len
        if page_crcs is None or page_checked is None or scratch is None or scratch.shape[0] < 2 * page_len:
            raise ValueError("pread_heap: pages need page_crcs, page_checked and a scratch of two pages")
        if page_crcs.shape[0] != nchunks * per or page_checked.shape[0] != page_crcs.shape[0]:
            raise ValueError("pread_heap: one page CRC and flag per page of every chunk")
        if page_shift is None or page_shift.shape[0] != 1024:
            raise ValueError("pread_heap: pages need page_shift, the crc_shift_table of page_len")
        shift = &page_shift[0]
        if per * nchunks:
            crcs, flags = &page_crcs[0], &page_checked[0]
        sp = &scratch[0]
    if n == 0 or nf == 0:
        return 0
    views = <Py_buffer*>malloc(nf * sizeof(Py_buffer))
    dviews = <Py_buffer*>malloc(nf * sizeof(Py_buffer))
    if views == NULL or dviews == NULL:
        free(views)
        free(dviews)
        return _fail(e, E_NOMEM, 0, 0)
    try:
        for j in range(nf):
            _hold(outs[j], &views[j])
            nheld += 1
            PyObject_GetBuffer(dst_offsets[j], &dviews[j], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            ndheld += 1
            if dviews[j].itemsize != 8 or dviews[j].format == NULL or \
                    dviews[j].format[0] not in b"ql" or dviews[j].len < n * 8:
                raise ValueError("pread_heap: dst_offsets must be int64, at least one per row")
        with nogil:
            for j in range(nf):
                op = <uint8_t*>views[j].buf
                out_len = views[j].len
                dsts = <const int64_t*>dviews[j].buf
                failed = j
                for i in range(n):
                    r = rows[i]
                    if r < 0 or r >= nrows_src:
                        rc = _fail(e, E_ROW, i, r)
                        break
                    d = dsts[i]
                    code = _heap_payload(&src[r * row_size + ref_offsets[j]], lo[i], hi[i], op, out_len, d,
                                         pad_stride, &off, &nb)
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
                        if per > 0 and not _all_checked(flags + k * per, within // page_len,
                                                        (within + take - 1) // page_len):
                            if _read_checked(fds[i * step], chunk_offsets[k], chunk_bytes, page_len,
                                             crcs + k * per, flags + k * per, shift, sp, within, take,
                                             op + d, e, i, k * per) < 0:
                                rc = -1
                                break
                        else:  # checked (or no pages): read below, in file order
                            if m == cap:
                                cap = 2 * cap if cap else 64
                                grown = <_Extent*>realloc(ex, cap * sizeof(_Extent))
                                if grown == NULL:
                                    rc = _fail(e, E_NOMEM, i, 0)
                                    break
                                ex = grown
                            ex[m].file_off = chunk_offsets[k] + within
                            ex[m].length = take
                            ex[m].dst = op + d
                            ex[m].fd = fds[i * step]
                            ex[m].field = <int32_t>j
                            ex[m].item = i
                            m += 1
                        off += take
                        d += take
                        nb -= take
                    if rc != 0:
                        break
                if rc != 0:
                    break
            if rc == 0 and m:
                rc = _read_extents(ex, m, sink, e, &failed)
    finally:
        free(ex)
        for j in range(ndheld):
            PyBuffer_Release(&dviews[j])
        _release(views, nheld)
        free(views)
        free(dviews)
    if rc != 0 and err.shape[0] > 3:
        err[3] = failed
    return rc


def pread_pages(const int32_t[::1] fds not None, const int64_t[::1] chunk_offsets not None,
                const int64_t[::1] chunk_bytes not None, const int64_t[::1] within not None,
                const int64_t[::1] take not None, const int64_t[::1] page_first not None,
                int64_t page_len, const uint32_t[::1] page_crcs not None,
                uint8_t[::1] page_checked not None, const uint32_t[::1] page_shift not None,
                uint8_t[::1] scratch not None, uint8_t[::1] out not None,
                const int64_t[::1] dst_offsets not None, int64_t[::1] err not None):
    """Read range i, bytes ``[within[i], within[i] + take[i])`` of the uncompressed chunk at
    ``chunk_offsets[i]`` of descriptor ``fds[i]`` (or ``fds[0]``), into ``out`` at
    ``dst_offsets[i]``, checked by the chunk's pages in the read's pass: the chunk holds
    ``chunk_bytes[i]`` raw bytes in pages of ``page_len`` (its last page the rest), whose
    CRC-32s and flags start at ``page_first[i]`` in ``page_crcs`` and ``page_checked``
    (``page_shift``: the :func:`crc_shift_table` of ``page_len``). A range whose pages are all
    flagged is read straight into place; otherwise as ``pread_heap`` reads a payload (one
    ``preadv`` with the rest of its first and last pages into ``scratch``, two pages; one CRC
    pass; pages flagged). The pieces of blocks of a window, checked without a second read.
    Returns 0 or -1 (``err``: ``E_CHECKSUM`` with detail the page's index in ``page_crcs``)."""
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = within.shape[0], i, step
    cdef int64_t npages = page_crcs.shape[0], per, first, w, t
    cdef int rc = 0
    if page_len <= 0 or page_checked.shape[0] != npages or page_shift.shape[0] != 1024:
        raise ValueError("pread_pages: a page length, one flag per page and the shift table")
    if scratch.shape[0] < 2 * page_len:
        raise ValueError("pread_pages: the scratch holds a head and a tail page")
    if chunk_offsets.shape[0] != n or chunk_bytes.shape[0] != n or take.shape[0] != n or \
            page_first.shape[0] != n or dst_offsets.shape[0] < n:
        raise ValueError("pread_pages: argument lengths differ")
    step = _fd_step(fds, n)
    with nogil:
        for i in range(n):
            w, t = within[i], take[i]
            if t == 0:
                continue
            per = (chunk_bytes[i] + page_len - 1) // page_len
            first = page_first[i]
            if chunk_bytes[i] <= 0 or w < 0 or t < 0 or w > chunk_bytes[i] - t or chunk_offsets[i] < 0 \
                    or first < 0 or first > npages - per:
                rc = _fail(e, E_BOUNDS, i, w)
                break
            if dst_offsets[i] < 0 or dst_offsets[i] > out.shape[0] - t:
                rc = _fail(e, E_DEST, i, out.shape[0])
                break
            if _all_checked(&page_checked[first], w // page_len, (w + t - 1) // page_len):
                if _pread_full(fds[i * step], &out[dst_offsets[i]], t, chunk_offsets[i] + w, e, i) < 0:
                    rc = -1
                    break
            elif _read_checked(fds[i * step], chunk_offsets[i], chunk_bytes[i], page_len,
                               &page_crcs[first], &page_checked[first], &page_shift[0], &scratch[0],
                               w, t, &out[dst_offsets[i]], e, i, first) < 0:
                rc = -1
                break
    return rc


cdef inline bint _all_checked(const uint8_t* flags, int64_t a, int64_t b) noexcept nogil:
    cdef int64_t p
    for p in range(a, b + 1):
        if not flags[p]:
            return False
    return True


cdef inline uint32_t _crc_parts(uint32_t crc, int64_t lo, int64_t hi, int64_t a, int64_t within,
                                int64_t end, const uint8_t* head, const uint8_t* dst,
                                const uint8_t* tail) noexcept nogil:
    """CRC-32 ``crc`` extended over chunk bytes ``[lo, hi)``, which lie in the head ``[a,
    within)`` (in ``head``), the payload ``[within, end)`` (in ``dst``) or the tail ``[end, ...)``
    (in ``tail``)."""
    cdef int64_t x, y
    x, y = lo, (hi if hi < within else within)
    if y > x:
        crc = zng_crc32(crc, head + (x - a), <size_t>(y - x))
    x, y = (lo if lo > within else within), (hi if hi < end else end)
    if y > x:
        crc = zng_crc32(crc, dst + (x - within), <size_t>(y - x))
    x = lo if lo > end else end
    if hi > x:
        crc = zng_crc32(crc, tail + (x - end), <size_t>(hi - x))
    return crc


cdef inline uint32_t _crc_shift(const uint32_t* t, uint32_t c) noexcept nogil:
    """``c`` moved past ``n`` more bytes by the table ``t`` of :func:`crc_shift_table`: with
    ``A`` and ``B`` byte strings, ``len(B) == n``, ``crc32(A + B) == _crc_shift(t, crc32(A)) ^
    crc32(B)`` (the CRC's shift is linear: four lookups, one per byte of ``c``)."""
    return t[c & 255] ^ t[256 + ((c >> 8) & 255)] ^ t[512 + ((c >> 16) & 255)] ^ t[768 + (c >> 24)]


def crc_shift_table(int64_t nbytes, uint32_t[::1] out not None):
    """Fill ``out`` (1,024 entries) with the table that moves a CRC-32 past ``nbytes`` bytes
    (see ``_crc_shift``): the combination of page CRCs into the CRC of a run of pages, so a run
    is checked in one CRC pass. The map is x^(8 * nbytes) mod P on zlib's reflected CRC: for
    each bit, ``nbytes`` steps of the byte-wise update with a zero byte."""
    cdef uint32_t byte_tab[256]
    cdef uint32_t basis[32]
    cdef uint32_t c
    cdef int64_t _k
    cdef int b, j, _j, bit
    if nbytes < 0 or out.shape[0] != 1024:
        raise ValueError("crc_shift_table: nbytes >= 0 and 1,024 entries expected")
    with nogil:
        for b in range(256):
            c = <uint32_t>b
            for _j in range(8):
                c = (c >> 1) ^ (<uint32_t>0xEDB88320 if c & 1 else <uint32_t>0)
            byte_tab[b] = c
        for bit in range(32):
            c = (<uint32_t>1) << bit
            for _k in range(nbytes):
                c = byte_tab[c & 255] ^ (c >> 8)
            basis[bit] = c
        for j in range(4):
            for b in range(256):
                c = 0
                for bit in range(8):
                    if b & (1 << bit):
                        c ^= basis[8 * j + bit]
                out[256 * j + b] = c
    return 0


cdef int _read_checked(int fd, int64_t chunk_offset, int64_t chunk_bytes, int64_t page_len,
                       const uint32_t* crcs, uint8_t* flags, const uint32_t* shift, uint8_t* scratch,
                       int64_t within, int64_t take, uint8_t* dst, int64_t* e, int64_t i,
                       int64_t page0) noexcept nogil:
    """Bytes ``[within, within + take)`` of one heap chunk into ``dst``, checked by the pages
    they touch (CRC-32s ``crcs``, flags ``flags``: pages of this chunk), in the read's pass.

    Pages ``[pa, pz]``: those touched, less the first and last ones already checked (by a
    neighbouring payload: not read again). One ``preadv`` reads the payload into ``dst`` and
    the rest of pages ``pa`` and ``pz`` (the head at ``scratch``, the tail at ``scratch +
    page_len``: two pages; a plain ``pread`` when the bytes are whole pages); then one CRC pass
    over the three parts, while they are in cache, is
    compared with the pages' CRCs combined (``shift``: :func:`crc_shift_table` of ``page_len``),
    the chunk's shorter last page on its own, and the pages are flagged. A mismatch is located
    page by page: -1 with ``E_CHECKSUM``, detail the page (``page0`` + its index); else 0."""
    cdef int64_t end = within + take, a, last, lo, full_end, ps, pe, p
    cdef int64_t pa = within // page_len, pz = (end - 1) // page_len
    cdef iovec iov[3]
    cdef int nv = 0
    cdef uint32_t crc, expect
    while pa <= pz and flags[pa]:
        pa += 1
    while pz >= pa and flags[pz]:
        pz -= 1
    if pa > pz:  # the pages between were checked by other payloads: a plain read
        return _pread_full(fd, dst, take, chunk_offset + within, e, i)
    # The pages' CRCs are needed right after the read: fetched into cache while it runs (in a
    # first epoch they are cold, and waiting for them cost as much as the CRC pass of a piece).
    __builtin_prefetch(crcs + pa)
    __builtin_prefetch(crcs + pz)
    a = pa * page_len
    last = (pz + 1) * page_len
    if last > chunk_bytes:
        last = chunk_bytes
    lo = a if a < within else within
    if within > a:
        iov[nv].iov_base, iov[nv].iov_len = <void*>scratch, <size_t>(within - a)
        nv += 1
    iov[nv].iov_base, iov[nv].iov_len = <void*>dst, <size_t>take
    nv += 1
    if last > end:
        iov[nv].iov_base, iov[nv].iov_len = <void*>(scratch + page_len), <size_t>(last - end)
        nv += 1
    if nv == 1:  # the range is whole pages: a plain read (preadv costs more per call)
        if _pread_full(fd, dst, take, chunk_offset + within, e, i) < 0:
            return -1
    elif _preadv_full(fd, iov, nv, chunk_offset + lo, (last if last > end else end) - lo, e, i) < 0:
        return -1
    # Whole pages [a, full_end) in one pass; the chunk's shorter last page, if touched, alone.
    full_end = (chunk_bytes // page_len) * page_len
    if full_end > last:
        full_end = last
    if full_end > a:
        crc = _crc_parts(0, a, full_end, a, within, end, scratch, dst, scratch + page_len)
        expect = crcs[pa]
        for p in range(pa + 1, full_end // page_len):
            expect = _crc_shift(shift, expect) ^ crcs[p]
        if crc != expect:
            ps = a
            while ps < full_end:  # which page: the error names it
                pe = ps + page_len
                crc = _crc_parts(0, ps, pe, a, within, end, scratch, dst, scratch + page_len)
                if crc != crcs[ps // page_len]:
                    return _fail(e, E_CHECKSUM, i, page0 + ps // page_len)
                ps = pe
            return _fail(e, E_CHECKSUM, i, page0 + pa)
    ps = full_end if full_end > a else a
    if last > ps:
        if _crc_parts(0, ps, last, a, within, end, scratch, dst, scratch + page_len) != crcs[ps // page_len]:
            return _fail(e, E_CHECKSUM, i, page0 + ps // page_len)
    for p in range(pa, pz + 1):
        flags[p] = 1
    return 0


def preadv_rows(const int32_t[::1] fds not None, const int64_t[::1] file_offsets not None, int64_t row_size,
                const int64_t[::1] seg_sizes not None, outs, uint8_t[::1] sink not None,
                int64_t[::1] err not None, const uint8_t[::1] check=None, const uint32_t[::1] expect=None,
                const int64_t[::1] order=None):
    """Read rows straight from the file into per-field batch arrays, one ``preadv`` per row.

    The row is cut into consecutive segments of ``seg_sizes[j]`` bytes (1..64 of them, summing
    to ``row_size``); segment j of row i goes to row i of ``outs[j]``, a writeable C-contiguous
    buffer of at least ``len(file_offsets) * seg_sizes[j]`` bytes (checked here, held for the
    call), or to ``sink`` (at the segment's offset in the row: ``sink`` holds at least a row)
    when ``outs[j]`` is None (columns not asked for). Row i is read from descriptor ``fds[i]``
    (or ``fds[0]`` when it holds one). No intermediate copy: the direct path for large
    uncompressed rows. With ``check`` and ``expect`` (one per row): the CRC-32 of each row whose
    ``check[i]`` is set, over its segments in row order right after they were read, must be
    ``expect[i]`` (else ``E_CHECKSUM`` for row i).

    ``order`` (a permutation of ``0..n-1``, each entry bounds-checked here): the rows are read
    in that order, and rows that follow each other in it and in one file (row ``order[k + 1]``
    starts where row ``order[k]`` ends) go in one ``preadv`` of up to ``MAX_IOV`` parts: a
    window's rows sorted by file offset make one call per run of consecutive rows, each row
    still landing in its own batch slot. Returns 0 or -1 (``err``).
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
    if (check is None) != (expect is None) or \
            check is not None and (check.shape[0] != n or expect.shape[0] != n):
        raise ValueError("preadv_rows: check and expect must both be given, one per row")
    if order is not None and order.shape[0] != n:
        raise ValueError("preadv_rows: order must hold one entry per row")
    if n == 0:
        return 0
    if order is not None:
        for j in range(n):
            if order[j] < 0 or order[j] >= n:
                return _fail(e, E_ROW, j, order[j])
    if sink.shape[0] < row_size and any(o is None for o in outs):
        return _fail(e, E_DEST, 0, sink.shape[0])
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
                              &sink[0] if sink.shape[0] else NULL, e,
                              &check[0] if check is not None else NULL,
                              &expect[0] if expect is not None else NULL,
                              &order[0] if order is not None else NULL)
    finally:
        _release(views, held)
    return rc


cdef int _preadv_rows(const int32_t* fds, Py_ssize_t step, const int64_t* file_offsets, Py_ssize_t n,
                      int64_t row_size,
                      const int64_t* seg_sizes, uint8_t** bases, Py_ssize_t nseg, uint8_t* sink,
                      int64_t* e, const uint8_t* check, const uint32_t* expect,
                      const int64_t* order) noexcept nogil:
    """The loop of :func:`preadv_rows` (``bases[j]`` NULL: segment j goes to ``sink``;
    ``check`` NULL: no CRC; ``order`` NULL: rows in index order, one call each)."""
    cdef Py_ssize_t k = 0, m, r, j, i, nsink = 0
    cdef int64_t at, off0, want
    cdef ssize_t got
    cdef iovec iov[MAX_IOV]
    cdef int fd
    cdef uint32_t crc
    if order == NULL:
        return _preadv_each(fds, step, file_offsets, 0, n, NULL, row_size, seg_sizes, bases, nseg, sink,
                            e, check, expect)
    for j in range(nseg):
        nsink += bases[j] == NULL
    while k < n:
        i = order[k]
        fd = fds[i * step]
        off0 = file_offsets[i]
        m = 1
        # Rows whose segments go to the one sink cannot be told apart by a CRC after the run.
        if check == NULL or nsink == 0:
            while k + m < n and (m + 1) * nseg <= MAX_IOV and fds[order[k + m] * step] == fd \
                    and file_offsets[order[k + m]] == off0 + m * row_size:
                m += 1
        if m == 1 or off0 < 0:
            if _preadv_each(fds, step, file_offsets, k, k + m, order, row_size, seg_sizes, bases, nseg,
                            sink, e, check, expect) < 0:
                return -1
            k += m
            continue
        for r in range(m):
            i = order[k + r]
            at = 0
            for j in range(nseg):
                iov[r * nseg + j].iov_len = <size_t>seg_sizes[j]
                iov[r * nseg + j].iov_base = <void*>(sink + at if bases[j] == NULL
                                                     else bases[j] + i * seg_sizes[j])
                at += seg_sizes[j]
        want = m * row_size
        got = preadv(fd, iov, <int>(m * nseg), <long>off0)
        while got < 0 and errno == EINTR:
            got = preadv(fd, iov, <int>(m * nseg), <long>off0)
        if got != want:
            # An error or a short read (a truncated file): row by row, which names the row.
            if _preadv_each(fds, step, file_offsets, k, k + m, order, row_size, seg_sizes, bases, nseg,
                            sink, e, check, expect) < 0:
                return -1
        elif check != NULL:
            for r in range(m):
                i = order[k + r]
                if check[i]:
                    crc = 0
                    for j in range(nseg):
                        crc = zng_crc32(crc, <const uint8_t*>iov[r * nseg + j].iov_base,
                                        iov[r * nseg + j].iov_len)
                    if crc != expect[i]:
                        return _fail(e, E_CHECKSUM, i, 0)
        k += m
    return 0


cdef int _preadv_each(const int32_t* fds, Py_ssize_t step, const int64_t* file_offsets, Py_ssize_t k0,
                      Py_ssize_t k1, const int64_t* order, int64_t row_size,
                      const int64_t* seg_sizes, uint8_t** bases, Py_ssize_t nseg, uint8_t* sink,
                      int64_t* e, const uint8_t* check, const uint32_t* expect) noexcept nogil:
    """Rows ``order[k0..k1)`` (``k0..k1`` where ``order`` is NULL), one ``preadv`` each."""
    cdef Py_ssize_t i, j, k
    cdef int64_t done, want, at
    cdef ssize_t got
    cdef iovec iov[MAX_SEGMENTS]
    cdef int fd
    cdef uint32_t crc
    for k in range(k0, k1):
        i = order[k] if order != NULL else k
        fd = fds[i * step]
        if file_offsets[i] < 0:
            return _fail(e, E_SIZE, i, file_offsets[i])
        at = 0
        for j in range(nseg):
            iov[j].iov_len = <size_t>seg_sizes[j]
            iov[j].iov_base = <void*>(sink + at if bases[j] == NULL else bases[j] + i * seg_sizes[j])
            at += seg_sizes[j]
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
        if check != NULL and check[i]:
            crc = 0
            for j in range(nseg):
                crc = zng_crc32(crc, <const uint8_t*>iov[j].iov_base, iov[j].iov_len)
            if crc != expect[i]:
                return _fail(e, E_CHECKSUM, i, 0)
    return 0


def check_ranges(const int32_t[::1] fds not None, const int64_t[::1] offsets not None,
                 const int64_t[::1] sizes not None, int64_t page_len, const uint32_t[::1] expect not None,
                 uint8_t[::1] scratch not None, int64_t[::1] err not None):
    """Read range i (``sizes[i]`` bytes at ``offsets[i]`` of ``fds[i]``, or of ``fds[0]``: a
    run of consecutive pages of one chunk) into ``scratch`` and check each of its pages
    (``page_len`` bytes, the last one the rest of the range) against the next entry of
    ``expect`` (one per page, ranges in order): the pages a direct read touches, checked before
    it reads them. Returns 0 or -1 (``err``: ``E_CHECKSUM`` with the page's index in
    ``expect``)."""
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = offsets.shape[0], i, step = _fd_step(fds, offsets.shape[0]), k = 0
    cdef int64_t at, size
    cdef int rc = 0
    if sizes.shape[0] != n or page_len <= 0:
        raise ValueError("check_ranges: argument lengths differ, or no page length")
    with nogil:
        for i in range(n):
            if sizes[i] <= 0 or offsets[i] < 0 or sizes[i] > scratch.shape[0]:
                rc = _fail(e, E_SIZE, i, sizes[i])
                break
            if _pread_full(fds[i * step], &scratch[0], sizes[i], offsets[i], e, i) < 0:
                rc = -1
                break
            at = 0
            while at < sizes[i]:
                size = sizes[i] - at if sizes[i] - at < page_len else page_len
                if k >= expect.shape[0]:
                    rc = _fail(e, E_DEST, k, expect.shape[0])
                    break
                if zng_crc32(0, &scratch[0] + at, <size_t>size) != expect[k]:
                    rc = _fail(e, E_CHECKSUM, k, 0)
                    break
                at += size
                k += 1
            if rc != 0:
                break
    return rc


def check_buffer(const uint8_t[::1] buf not None, const int64_t[::1] starts not None,
                 const int64_t[::1] sizes not None, const uint32_t[::1] expect not None,
                 int64_t[::1] err not None):
    """Check that the CRC-32 of ``buf[starts[i]:starts[i] + sizes[i]]`` is ``expect[i]`` for
    every i (pages a read has just loaded). Returns 0 or -1 (``err``: ``E_CHECKSUM`` for i,
    ``E_DEST`` for a range outside ``buf``)."""
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = starts.shape[0], i
    cdef int rc = 0
    if sizes.shape[0] != n or expect.shape[0] != n:
        raise ValueError("check_buffer: argument lengths differ")
    with nogil:
        for i in range(n):
            if starts[i] < 0 or sizes[i] < 0 or sizes[i] > buf.shape[0] - starts[i]:
                rc = _fail(e, E_DEST, i, buf.shape[0])
                break
            if zng_crc32(0, &buf[0] + starts[i], <size_t>sizes[i]) != expect[i]:
                rc = _fail(e, E_CHECKSUM, i, 0)
                break
    return rc


def page_crcs(const uint8_t[::1] buf not None, int64_t page_len, uint32_t[::1] out not None):
    """CRC-32 of each ``page_len``-byte page of ``buf`` (the last one shorter) into ``out``
    (exactly as many entries as pages): the page index the writer stores."""
    cdef Py_ssize_t n = buf.shape[0], k, npages
    cdef int64_t at, size
    if page_len <= 0:
        raise ValueError("page_crcs: page_len must be positive")
    npages = (n + page_len - 1) // page_len
    if out.shape[0] != npages:
        raise ValueError("page_crcs: out must hold one entry per page")
    with nogil:
        for k in range(npages):
            at = k * page_len
            size = n - at if n - at < page_len else page_len
            out[k] = zng_crc32(0, &buf[0] + at, <size_t>size)
    return 0
