# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Block kernels: read stored chunks, verify, decompress, and gather rows into batch arrays.

The boundary (see docs/architecture.md): kernels take typed memoryviews, integers and file
descriptors; they allocate nothing except a Blosc2 decompression context per call; they run
their loops with the GIL released and report failure through a return code plus an ``err``
array (``err[0]`` code, ``err[1]`` index of the failing item, ``err[2]`` detail). Every offset
and size that comes from a file is bounds-checked here. Python (``rowstore/kernels.py``) does
all allocation, validation of arguments and error wording.
"""

from libc.stdint cimport uint8_t, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset
from libc.errno cimport errno, EINTR

cdef extern from *:
    void __builtin_prefetch(const void* p) nogil
from posix.unistd cimport pread

cdef extern from "<stdbool.h>":
    ctypedef bint c_bool "bool"

cdef extern from "blosc2.h" nogil:
    ctypedef struct blosc2_context:
        pass
    ctypedef struct blosc2_schunk:
        pass
    ctypedef struct blosc2_cparams:
        uint8_t compcode
        uint8_t clevel
        int32_t typesize
        int16_t nthreads
        uint8_t filters[6]
    ctypedef struct blosc2_storage:
        bint contiguous
        blosc2_cparams* cparams
        void* dparams
    const blosc2_cparams BLOSC2_CPARAMS_DEFAULTS
    const blosc2_storage BLOSC2_STORAGE_DEFAULTS
    blosc2_schunk* blosc2_schunk_new(blosc2_storage* storage)
    int64_t blosc2_schunk_append_buffer(blosc2_schunk* schunk, const void* src, int32_t nbytes)
    int64_t blosc2_schunk_to_buffer(blosc2_schunk* schunk, uint8_t** cframe, c_bool* needs_free)
    int blosc2_schunk_free(blosc2_schunk* schunk)
    ctypedef struct blosc2_dparams:
        int16_t nthreads
        void* schunk
        void* postfilter
        void* postparams
        int32_t typesize
    const blosc2_dparams BLOSC2_DPARAMS_DEFAULTS
    void blosc2_init()
    blosc2_context* blosc2_create_dctx(blosc2_dparams dparams)
    void blosc2_free_ctx(blosc2_context* context)
    int blosc2_decompress_ctx(blosc2_context* context, const void* src, int32_t srcsize,
                              void* dest, int32_t destsize)
    int blosc2_cbuffer_sizes(const void* cbuffer, int32_t* nbytes, int32_t* cbytes,
                             int32_t* blocksize)

cdef extern from *:
    # zlib-ng's CRC-32 inside libblosc2.a: same polynomial and values as zlib.crc32, with the
    # (V)PCLMULQDQ kernels chosen at run time (measured 66 GB/s here, XXH64 9 GB/s).
    """
    unsigned int zng_crc32(unsigned int crc, const unsigned char* buf, size_t len);
    """
    unsigned int zng_crc32(unsigned int crc, const unsigned char* buf, size_t len) nogil

blosc2_init()

# Error codes (mirrored in rowstore/kernels.py).
DEF E_OK = 0
DEF E_IO = 1           # pread failed; err[2] = errno
DEF E_SHORT = 2        # file ended before the stored range; err[2] = bytes read
DEF E_CHECKSUM = 3     # stored bytes do not match the index checksum
DEF E_FRAME = 4        # Blosc2 frame or chunk header invalid
DEF E_DECOMPRESS = 5   # blosc2_decompress_ctx failed; err[2] = its code
DEF E_SIZE = 6         # a stored or decoded size is not the one expected
DEF E_BOUNDS = 7       # a row's payload reference points outside its block's heap range
DEF E_ROW = 8          # a row index outside the loaded buffer
DEF E_DEST = 9         # destination too small

BLOSC2_FRAME_MAGIC = b"b2frame\x00"

cdef inline int64_t _pread_full(int fd, uint8_t* dst, int64_t size, int64_t offset,
                                int64_t* err) noexcept nogil:
    cdef int64_t done = 0
    cdef ssize_t n
    while done < size:
        n = pread(fd, dst + done, <size_t>(size - done), <long>(offset + done))
        if n < 0:
            if errno == EINTR:
                continue
            err[0] = E_IO
            err[2] = errno
            return -1
        if n == 0:
            err[0] = E_SHORT
            err[2] = done
            return -1
        done += n
    return 0

cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]

cdef inline uint64_t _be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>_be32(p) << 32) | <uint64_t>_be32(p + 4)

cdef int _frame_decompress(blosc2_context* ctx, const uint8_t* src, int64_t size,
                           uint8_t* dst, int64_t raw_size, int64_t* err) noexcept nogil:
    """Decompress a single-chunk Blosc2 frame (HDF5 filter 32026) into exactly raw_size bytes."""
    cdef int64_t hlen, flen
    cdef int32_t nbytes = 0, cbytes = 0, blocksize = 0
    cdef int rc, i
    cdef const char* magic = b"b2frame\x00"
    # msgpack header: fixarray, fixstr(8) "b2frame\0", int32 header_len, uint64 frame_len.
    if size < 24 or src[0] & 0xF0 != 0x90 or src[1] != 0xA8 or src[10] != 0xD2 or src[15] != 0xCF:
        err[0] = E_FRAME
        return -1
    for i in range(8):
        if src[2 + i] != <uint8_t>magic[i]:
            err[0] = E_FRAME
            return -1
    hlen = _be32(src + 11)
    flen = <int64_t>_be64(src + 16)
    if hlen < 24 or hlen + 32 > size or flen > size or flen < hlen + 32:
        err[0] = E_FRAME
        return -1
    if blosc2_cbuffer_sizes(src + hlen, &nbytes, &cbytes, &blocksize) < 0:
        err[0] = E_FRAME
        return -1
    if nbytes != raw_size:
        err[0] = E_SIZE
        err[2] = nbytes
        return -1
    if cbytes < 0 or hlen + cbytes > flen:
        err[0] = E_FRAME
        return -1
    rc = blosc2_decompress_ctx(ctx, src + hlen, cbytes, dst, <int32_t>raw_size)
    if rc != raw_size:
        err[0] = E_DECOMPRESS
        err[2] = rc
        return -1
    return 0


def crc32(const uint8_t[::1] data not None, unsigned int value=0):
    """CRC-32 of ``data`` (the per-chunk checksum of format v1; equals ``zlib.crc32``).
    Releases the GIL."""
    cdef unsigned int h
    cdef const uint8_t* p = &data[0] if data.shape[0] else NULL
    with nogil:
        h = zng_crc32(value, p, <size_t>data.shape[0])
    return h


def load_chunks(int fd,
                const int64_t[::1] offsets not None,
                const int64_t[::1] stored not None,
                const uint64_t[::1] checksums not None,
                int compressed, int verify,
                uint8_t[::1] dst not None, int64_t raw_size,
                uint8_t[::1] scratch not None,
                int64_t[::1] err not None):
    """Read chunk i (``stored[i]`` bytes at file ``offsets[i]``) into ``dst[i*raw_size:]``.

    ``compressed``: chunks are single-chunk Blosc2 frames, staged in ``scratch`` and decompressed
    to exactly ``raw_size`` bytes; else a chunk's stored size must equal ``raw_size``.
    ``verify``: check the CRC-32 of the stored bytes against ``checksums[i]`` first.
    Returns 0, or -1 with ``err = [code, chunk index, detail]``.
    """
    cdef Py_ssize_t n = offsets.shape[0], i
    cdef int rc = 0
    cdef uint8_t* target
    cdef blosc2_context* ctx = NULL
    cdef blosc2_dparams dparams
    cdef int64_t* e = &err[0]
    if stored.shape[0] != n or checksums.shape[0] != n or err.shape[0] < 3:
        raise ValueError("load_chunks: argument lengths differ")
    if raw_size <= 0 or dst.shape[0] < n * raw_size:
        e[0] = E_DEST
        return -1
    with nogil:
        if compressed:
            dparams = BLOSC2_DPARAMS_DEFAULTS
            dparams.nthreads = 1
            ctx = blosc2_create_dctx(dparams)
        for i in range(n):
            e[1] = i
            if stored[i] <= 0 or offsets[i] < 0:
                e[0] = E_SIZE
                e[2] = stored[i]
                rc = -1
                break
            if compressed:
                if stored[i] > scratch.shape[0]:
                    e[0] = E_DEST
                    e[2] = stored[i]
                    rc = -1
                    break
                target = &scratch[0]
            else:
                if stored[i] != raw_size:
                    e[0] = E_SIZE
                    e[2] = stored[i]
                    rc = -1
                    break
                target = &dst[i * raw_size]
            if _pread_full(fd, target, stored[i], offsets[i], e) < 0:
                rc = -1
                break
            if verify and <uint64_t>zng_crc32(0, target, <size_t>stored[i]) != checksums[i]:
                e[0] = E_CHECKSUM
                rc = -1
                break
            if compressed and _frame_decompress(ctx, target, stored[i], &dst[i * raw_size], raw_size, e) < 0:
                rc = -1
                break
        if ctx != NULL:
            blosc2_free_ctx(ctx)
    if rc == 0:
        e[0] = E_OK
    return rc


def decompress_frame(const uint8_t[::1] src not None, uint8_t[::1] dst not None,
                     int64_t[::1] err not None):
    """Decompress one single-chunk Blosc2 frame into all of ``dst``. 0 or -1 (see ``err``)."""
    cdef int rc
    cdef blosc2_context* ctx
    cdef blosc2_dparams dparams
    if src.shape[0] == 0 or dst.shape[0] == 0:
        err[0] = E_SIZE
        return -1
    with nogil:
        dparams = BLOSC2_DPARAMS_DEFAULTS
        dparams.nthreads = 1
        ctx = blosc2_create_dctx(dparams)
        rc = _frame_decompress(ctx, &src[0], src.shape[0], &dst[0], dst.shape[0], &err[0])
        blosc2_free_ctx(ctx)
    return rc


def gather_fixed(const uint8_t[::1] src not None, int64_t row_size, int64_t field_offset,
                 int64_t field_size, const int64_t[::1] rows not None, uint8_t[::1] out not None,
                 int64_t[::1] err not None):
    """``out[i*field_size : (i+1)*field_size] = src[rows[i]*row_size + field_offset : +field_size]``.

    Gathers one field of the given rows (indices into the loaded rows of ``src``) into a
    contiguous batch array. Returns 0, or -1 with ``err = [E_ROW, i, rows[i]]``.
    """
    cdef Py_ssize_t n = rows.shape[0], i
    cdef int64_t nrows_src, r
    cdef int rc = 0
    cdef const uint8_t* s
    cdef uint8_t* o
    if row_size <= 0 or field_size < 0 or field_offset < 0 or field_offset + field_size > row_size:
        raise ValueError("gather_fixed: field outside the row")
    if out.shape[0] < n * field_size:
        err[0] = E_DEST
        return -1
    if n == 0 or field_size == 0:
        return 0
    nrows_src = src.shape[0] // row_size
    s = &src[0]
    o = &out[0]
    with nogil:
        if field_size == 8:
            for i in range(n):
                r = rows[i]
                if r < 0 or r >= nrows_src:
                    err[0] = E_ROW
                    err[1] = i
                    err[2] = r
                    rc = -1
                    break
                (<uint64_t*>(o + i * 8))[0] = (<const uint64_t*>(s + r * row_size + field_offset))[0]
        elif field_size == 4:
            for i in range(n):
                r = rows[i]
                if r < 0 or r >= nrows_src:
                    err[0] = E_ROW
                    err[1] = i
                    err[2] = r
                    rc = -1
                    break
                (<uint32_t*>(o + i * 4))[0] = (<const uint32_t*>(s + r * row_size + field_offset))[0]
        else:
            for i in range(n):
                r = rows[i]
                if r < 0 or r >= nrows_src:
                    err[0] = E_ROW
                    err[1] = i
                    err[2] = r
                    rc = -1
                    break
                memcpy(o + i * field_size, s + r * row_size + field_offset, <size_t>field_size)
    return rc


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
    the payload's bytes are at ``heap[slot_base[s] + offset]``. With ``pad_stride > 0`` each row's
    region ``[dst_offsets[i], dst_offsets[i] + pad_stride)`` is zero-filled past the payload
    (padded batches); the payload must fit the stride. Returns 0, or -1 with ``err``.
    """
    cdef Py_ssize_t n = rows.shape[0], i
    cdef int64_t nrows_src, r, s, off, nb, pos, d, nslots = slot_lo.shape[0]
    cdef int64_t heap_len = heap.shape[0], out_len = out.shape[0]
    cdef int rc = 0
    cdef const uint8_t* hp = &heap[0] if heap.shape[0] else NULL
    cdef uint8_t* op = &out[0] if out.shape[0] else NULL
    if ref_offset < 0 or ref_offset + 16 > row_size or rows_per_slot <= 0:
        raise ValueError("gather_heap: bad row geometry")
    if slot_hi.shape[0] != nslots or slot_base.shape[0] != nslots or dst_offsets.shape[0] < n:
        raise ValueError("gather_heap: argument lengths differ")
    if n == 0:
        return 0
    nrows_src = src.shape[0] // row_size
    with nogil:
        for i in range(n):
            r = rows[i]
            if r < 0 or r >= nrows_src:
                err[0] = E_ROW
                err[1] = i
                err[2] = r
                rc = -1
                break
            s = r // rows_per_slot
            if s >= nslots:
                err[0] = E_ROW
                err[1] = i
                err[2] = r
                rc = -1
                break
            memcpy(&off, &src[r * row_size + ref_offset], 8)
            memcpy(&nb, &src[r * row_size + ref_offset + 8], 8)
            # offset/nbytes are unsigned on disk: reject anything that does not fit the range.
            if off < slot_lo[s] or nb < 0 or off > slot_hi[s] or nb > slot_hi[s] - off:
                err[0] = E_BOUNDS
                err[1] = i
                err[2] = r
                rc = -1
                break
            pos = slot_base[s] + off
            if nb > 0 and (pos < 0 or pos + nb > heap_len):  # an empty payload reads nothing
                err[0] = E_BOUNDS
                err[1] = i
                err[2] = r
                rc = -1
                break
            d = dst_offsets[i]
            if d < 0 or d + nb > out_len or (
                    pad_stride > 0 and (nb > pad_stride or d + pad_stride > out_len)):
                err[0] = E_DEST
                err[1] = i
                err[2] = nb
                rc = -1
                break
            if nb > 0:
                memcpy(op + d, hp + pos, <size_t>nb)
            if pad_stride > nb:
                memset(op + d + nb, 0, <size_t>(pad_stride - nb))
    return rc


def pread_rows(int fd, const int64_t[::1] file_offsets not None, int64_t row_size,
               uint8_t[::1] dst not None, int64_t[::1] err not None):
    """Read row i (``row_size`` bytes at ``file_offsets[i]``) into ``dst[i*row_size:]``: the
    direct path for uncompressed files under uniform shuffling (no block read per row).
    The caller derives offsets from the validated block index. Returns 0 or -1 (``err``)."""
    cdef Py_ssize_t n = file_offsets.shape[0], i
    cdef int rc = 0
    cdef int64_t* e = &err[0]
    if row_size <= 0 or dst.shape[0] < n * row_size:
        e[0] = E_DEST
        return -1
    with nogil:
        for i in range(n):
            e[1] = i
            if file_offsets[i] < 0:
                e[0] = E_SIZE
                rc = -1
                break
            if _pread_full(fd, &dst[i * row_size], row_size, file_offsets[i], e) < 0:
                rc = -1
                break
    return rc


def pread_heap(int fd, const uint8_t[::1] src not None, int64_t row_size, int64_t ref_offset,
               const int64_t[::1] rows not None,
               const int64_t[::1] lo not None, const int64_t[::1] hi not None,
               const int64_t[::1] chunk_offsets not None, int64_t chunk_bytes,
               uint8_t[::1] out not None, const int64_t[::1] dst_offsets not None,
               int64_t pad_stride, int64_t[::1] err not None):
    """Direct path for uncompressed heaps: for each row ``rows[i]`` of ``src``, read its payload
    straight from the file into ``out`` at ``dst_offsets[i]`` (one copy, no heap chunk loaded).

    The reference must lie in ``[lo[i], hi[i])`` (its block's heap range); logical heap offsets
    map to file offsets through ``chunk_offsets`` (one per heap chunk of ``chunk_bytes``), a
    payload may span chunks. ``pad_stride`` as in :func:`gather_heap`. Returns 0 or -1.
    """
    cdef Py_ssize_t n = lo.shape[0], i
    cdef int64_t off, nb, d, k, within, take, r, nchunks = chunk_offsets.shape[0]
    cdef int64_t nrows_src = src.shape[0] // row_size if row_size > 0 else 0
    cdef int64_t out_len = out.shape[0]
    cdef int rc = 0
    cdef int64_t* e = &err[0]
    cdef uint8_t* op = &out[0] if out.shape[0] else NULL
    if ref_offset < 0 or ref_offset + 16 > row_size or chunk_bytes <= 0:
        raise ValueError("pread_heap: bad geometry")
    if hi.shape[0] != n or rows.shape[0] != n or dst_offsets.shape[0] < n:
        raise ValueError("pread_heap: argument lengths differ")
    with nogil:
        for i in range(n):
            e[1] = i
            r = rows[i]
            if r < 0 or r >= nrows_src:
                e[0] = E_ROW
                e[2] = r
                rc = -1
                break
            memcpy(&off, &src[r * row_size + ref_offset], 8)
            memcpy(&nb, &src[r * row_size + ref_offset + 8], 8)
            if off < lo[i] or nb < 0 or off > hi[i] or nb > hi[i] - off:
                e[0] = E_BOUNDS
                e[2] = i
                rc = -1
                break
            d = dst_offsets[i]
            if d < 0 or d + nb > out_len or (
                    pad_stride > 0 and (nb > pad_stride or d + pad_stride > out_len)):
                e[0] = E_DEST
                e[2] = nb
                rc = -1
                break
            if pad_stride > nb:
                memset(op + d + nb, 0, <size_t>(pad_stride - nb))
            while nb > 0:
                k = off // chunk_bytes
                if k >= nchunks:
                    e[0] = E_BOUNDS
                    e[2] = i
                    rc = -1
                    break
                within = off - k * chunk_bytes
                take = chunk_bytes - within
                if take > nb:
                    take = nb
                if _pread_full(fd, op + d, take, chunk_offsets[k] + within, e) < 0:
                    rc = -1
                    break
                off += take
                d += take
                nb -= take
            if rc != 0:
                break
    return rc


cdef inline uint64_t _splitmix64(uint64_t* state) noexcept nogil:
    cdef uint64_t z
    state[0] += 0x9E3779B97F4A7C15ULL
    z = state[0]
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef extern from *:
    """
    static inline unsigned long long rowstore_mulhi64(unsigned long long a, unsigned long long b) {
        return (unsigned long long)(((unsigned __int128)a * b) >> 64);
    }
    static inline unsigned long long rowstore_mullo64(unsigned long long a, unsigned long long b) {
        return a * b;
    }
    """
    unsigned long long rowstore_mulhi64(unsigned long long a, unsigned long long b) nogil
    unsigned long long rowstore_mullo64(unsigned long long a, unsigned long long b) nogil


cdef inline uint64_t _bounded(uint64_t* state, uint64_t bound) noexcept nogil:
    """Uniform integer in [0, bound) by Lemire's multiply-shift with rejection (unbiased)."""
    cdef uint64_t x = _splitmix64(state)
    cdef uint64_t lo = rowstore_mullo64(x, bound)
    cdef uint64_t threshold
    if lo < bound:
        threshold = (0 - bound) % bound
        while lo < threshold:
            x = _splitmix64(state)
            lo = rowstore_mullo64(x, bound)
    return rowstore_mulhi64(x, bound)


def shuffle(int64_t[::1] a not None, uint64_t seed):
    """Fisher-Yates shuffle of ``a`` in place, driven by SplitMix64 from ``seed`` (GIL released).

    For i = n-1 down to 1: j = bounded(i + 1) (Lemire's method on SplitMix64 outputs); swap a[i],
    a[j]. ``rowstore.reader.order.shuffle_reference`` is the same algorithm in Python.
    """
    cdef Py_ssize_t i, n = a.shape[0]
    cdef uint64_t state = seed, j
    cdef int64_t t
    with nogil:
        i = n - 1
        while i > 0:
            j = _bounded(&state, <uint64_t>(i + 1))
            t = a[i]
            a[i] = a[j]
            a[j] = t
            i -= 1


def gather_rows(const uint8_t[::1] src not None, int64_t row_size, const int64_t[::1] rows not None,
                const int64_t[::1] field_offsets not None, const int64_t[::1] field_sizes not None,
                const uint64_t[::1] out_addrs not None, int64_t[::1] err not None):
    """Gather several fields of each row in one pass (one cache miss per row, not per field).

    For field j: ``field_sizes[j]`` bytes at ``field_offsets[j]`` in row ``rows[i]`` go to
    address ``out_addrs[j] + i * field_sizes[j]``. The caller (``kernels.gather_rows``) passes
    the addresses of C-contiguous arrays it checked to hold ``len(rows) * field_sizes[j]``
    bytes and keeps them alive. Returns 0, or -1 with ``err = [E_ROW, i, rows[i]]``.
    """
    cdef Py_ssize_t n = rows.shape[0], nf = field_offsets.shape[0], i, j
    cdef int64_t nrows_src, r, sz
    cdef int rc = 0
    cdef const uint8_t* s
    cdef const uint8_t* row
    cdef uint8_t* o
    if field_sizes.shape[0] != nf or out_addrs.shape[0] != nf:
        raise ValueError("gather_rows: argument lengths differ")
    for j in range(nf):
        if field_offsets[j] < 0 or field_sizes[j] < 0 or field_offsets[j] + field_sizes[j] > row_size:
            raise ValueError("gather_rows: field outside the row")
    if n == 0 or nf == 0:
        return 0
    if row_size <= 0:
        raise ValueError("gather_rows: bad row size")
    nrows_src = src.shape[0] // row_size
    s = &src[0]
    with nogil:
        for i in range(n):
            r = rows[i]
            if r < 0 or r >= nrows_src:
                err[0] = E_ROW
                err[1] = i
                err[2] = r
                rc = -1
                break
            if i + 16 < n and rows[i + 16] >= 0 and rows[i + 16] < nrows_src:
                __builtin_prefetch(s + rows[i + 16] * row_size)
            row = s + r * row_size
            for j in range(nf):
                sz = field_sizes[j]
                o = <uint8_t*><size_t>out_addrs[j] + i * sz
                if sz == 8:
                    memcpy(o, row + field_offsets[j], 8)
                elif sz == 4:
                    memcpy(o, row + field_offsets[j], 4)
                elif sz == 1:
                    o[0] = row[field_offsets[j]]
                else:
                    memcpy(o, row + field_offsets[j], <size_t>sz)
    return rc


cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t preadv(int fd, const iovec* iov, int iovcnt, long offset)


def preadv_rows(int fd, const int64_t[::1] file_offsets not None, int64_t row_size,
                const int64_t[::1] seg_sizes not None, const uint64_t[::1] seg_addrs not None,
                uint8_t[::1] sink not None, int64_t[::1] err not None):
    """Read rows straight from the file into per-field batch arrays, one ``preadv`` per row.

    The row is cut into consecutive segments of ``seg_sizes[j]`` bytes (summing to
    ``row_size``); segment j of row i goes to ``seg_addrs[j] + i * seg_sizes[j]``, or to
    ``sink`` when ``seg_addrs[j]`` is 0 (columns not asked for). No intermediate copy: the
    direct path for large uncompressed rows. The caller checks every destination holds
    ``len(file_offsets) * seg_sizes[j]`` bytes. Returns 0 or -1 (``err``).
    """
    cdef Py_ssize_t n = file_offsets.shape[0], nseg = seg_sizes.shape[0], i, j
    cdef int rc = 0
    cdef int64_t total = 0, done, want
    cdef ssize_t got
    cdef iovec iov[64]
    cdef int64_t* e = &err[0]
    if nseg < 1 or nseg > 64 or seg_addrs.shape[0] != nseg:
        raise ValueError("preadv_rows: 1..64 segments expected")
    for j in range(nseg):
        if seg_sizes[j] <= 0:
            raise ValueError("preadv_rows: segment sizes must be positive")
        if seg_addrs[j] == 0 and seg_sizes[j] > sink.shape[0]:
            raise ValueError("preadv_rows: sink too small")
        total += seg_sizes[j]
    if total != row_size:
        raise ValueError("preadv_rows: segments do not cover the row")
    with nogil:
        for i in range(n):
            e[1] = i
            if file_offsets[i] < 0:
                e[0] = E_SIZE
                rc = -1
                break
            for j in range(nseg):
                iov[j].iov_len = <size_t>seg_sizes[j]
                if seg_addrs[j] == 0:
                    iov[j].iov_base = <void*>&sink[0]
                else:
                    iov[j].iov_base = <void*>(<size_t>seg_addrs[j] + <size_t>(i * seg_sizes[j]))
            got = preadv(fd, iov, <int>nseg, <long>file_offsets[i])
            while got < 0 and errno == EINTR:
                got = preadv(fd, iov, <int>nseg, <long>file_offsets[i])
            if got < 0:
                e[0] = E_IO
                e[2] = errno
                rc = -1
                break
            if got < row_size:
                # Short read: finish with plain preads (a truncated file ends in E_SHORT).
                done = got
                for j in range(nseg):
                    want = seg_sizes[j]
                    if done >= want:
                        done -= want
                        continue
                    if _pread_full(fd, <uint8_t*>iov[j].iov_base + done, want - done,
                                   file_offsets[i] + got, e) < 0:
                        rc = -1
                        break
                    got += want - done
                    done = 0
                if rc != 0:
                    break
    return rc


def compress_frame(const uint8_t[::1] src not None, uint8_t[::1] dst not None, int codec, int clevel,
                   int shuffle, int typesize, int64_t[::1] err not None):
    """Compress ``src`` into a single-chunk Blosc2 frame (what HDF5 filter 32026 stores) in
    ``dst``; returns the frame's length, or -1 (``err``). Runs without the GIL, so a writer
    compresses blocks on several threads. An all-zero ``src`` is stored memcpy'd (clevel 0):
    Blosc2 would make it a "special" chunk that a frame records only in its index."""
    cdef blosc2_cparams cparams = BLOSC2_CPARAMS_DEFAULTS
    cdef blosc2_dparams dparams = BLOSC2_DPARAMS_DEFAULTS
    cdef blosc2_storage storage = BLOSC2_STORAGE_DEFAULTS
    cdef blosc2_schunk* sc = NULL
    cdef uint8_t* frame = NULL
    cdef c_bool needs_free = False
    cdef int64_t n = src.shape[0], length = -1, i
    cdef bint zero = True
    if n <= 0 or n > 0x7FFF0000 or typesize < 1 or typesize > 255 or not 0 <= clevel <= 9:
        raise ValueError("compress_frame: bad arguments")
    with nogil:
        for i in range(n):
            if src[i] != 0:
                zero = False
                break
        cparams.compcode = <uint8_t>codec
        cparams.clevel = 0 if zero else <uint8_t>clevel
        cparams.typesize = typesize
        cparams.nthreads = 1
        cparams.filters[5] = <uint8_t>shuffle
        dparams.nthreads = 1
        storage.contiguous = True
        storage.cparams = &cparams
        storage.dparams = &dparams
        sc = blosc2_schunk_new(&storage)
        if sc == NULL:
            err[0] = E_FRAME
        elif blosc2_schunk_append_buffer(sc, &src[0], <int32_t>n) < 0:
            err[0] = E_FRAME
        else:
            length = blosc2_schunk_to_buffer(sc, &frame, &needs_free)
            if length < 0:
                err[0] = E_FRAME
            elif length > dst.shape[0]:
                err[0] = E_DEST
                err[2] = length
                length = -1
            else:
                memcpy(&dst[0], frame, <size_t>length)
            if needs_free:
                free(frame)
        if sc != NULL:
            blosc2_schunk_free(sc)
    return length
