# cython: language_level=3
"""What every kernel module shares: the error codes, the one way a kernel reports a failure,
and small inline helpers (a full ``pread``, overflow-safe size checks, the heap reference check,
the destination buffers a kernel holds for a call).

A kernel reports failure by returning -1 after :func:`_fail` filled ``err`` with
``[code, index of the failing item, detail]``; :func:`_errbuf` is the single place that checks
an ``err`` array before a kernel writes to it. ``KernelCode`` is also a Python enum
(``rowstore._common.KernelCode``): ``rowstore/kernels.py`` keys its messages by it.
"""

from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport EINTR, errno
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy, memset
from posix.unistd cimport pread


cpdef enum KernelCode:
    E_OK = 0
    E_IO = 1           # pread failed; detail = errno
    E_SHORT = 2        # the file ended before the stored range; detail = bytes read
    E_CHECKSUM = 3     # stored bytes do not match the index checksum
    E_FRAME = 4        # Blosc2 frame or chunk header malformed
    E_DECOMPRESS = 5   # blosc2_decompress_ctx failed; detail = its code
    E_SIZE = 6         # a stored or decoded size is not the one expected; detail = that size
    E_BOUNDS = 7       # a row's payload reference points outside its block's heap range
    E_ROW = 8          # a row index outside the loaded rows; detail = the index
    E_DEST = 9         # destination too small; detail = bytes needed where known
    E_CODEC = 10       # chunk header asks for other than the declared compression; detail = header byte
    E_NOMEM = 11       # a C allocation (malloc, Blosc2 context) failed


cdef inline int _fail(int64_t* err, int code, int64_t index, int64_t detail) noexcept nogil:
    """Record a failure in ``err`` and return -1 (what every kernel returns on failure)."""
    err[0] = code
    err[1] = index
    err[2] = detail
    return -1


cdef inline int64_t* _errbuf(int64_t[::1] err) except NULL:
    """The checked ``err`` array of a kernel call, cleared: at least 3 ``int64``."""
    if err.shape[0] < 3:
        raise ValueError("err must hold at least 3 int64 (code, index, detail)")
    err[0] = E_OK
    err[1] = 0
    err[2] = 0
    return &err[0]


cdef inline bint _fits(int64_t n, int64_t size, int64_t capacity) noexcept nogil:
    """Whether ``n`` items of ``size`` bytes fit ``capacity`` bytes (no overflow for any input)."""
    if n < 0 or size < 0:
        return False
    return size == 0 or n <= capacity // size


cdef inline int _pread_full(int fd, uint8_t* dst, int64_t size, int64_t offset,
                            int64_t* err, int64_t index) noexcept nogil:
    """Read exactly ``size`` bytes at ``offset``, retrying short reads and EINTR; 0 or -1
    with ``E_IO`` (detail errno) or ``E_SHORT`` (detail bytes read) for item ``index``."""
    cdef int64_t done = 0
    cdef ssize_t n
    while done < size:
        n = pread(fd, dst + done, <size_t>(size - done), <long>(offset + done))
        if n < 0:
            if errno == EINTR:
                continue
            return _fail(err, E_IO, index, errno)
        if n == 0:
            return _fail(err, E_SHORT, index, done)
        done += n
    return 0


cdef inline int _heap_payload(const uint8_t* ref, int64_t lo, int64_t hi, uint8_t* out, int64_t out_len,
                              int64_t d, int64_t pad_stride, int64_t* off, int64_t* nb) noexcept nogil:
    """Read a row's heap reference (``<u8 offset, <u8 nbytes`` at ``ref``) into ``off``/``nb``
    and check it: inside the block's heap range ``[lo, hi)`` (both are unsigned on disk, so a top
    bit set reads negative and is refused), else ``E_BOUNDS``; the payload fits ``out`` at ``d``
    (and its stride when ``pad_stride > 0``), else ``E_DEST``. Zeroes the stride past the
    payload. Returns ``E_OK`` or the code."""
    memcpy(off, ref, 8)
    memcpy(nb, ref + 8, 8)
    if off[0] < lo or nb[0] < 0 or off[0] > hi or nb[0] > hi - off[0]:
        return E_BOUNDS
    if d < 0 or d > out_len or nb[0] > out_len - d:
        return E_DEST
    if pad_stride > 0:
        if nb[0] > pad_stride or pad_stride > out_len - d:
            return E_DEST
        if pad_stride > nb[0]:
            memset(out + d + nb[0], 0, <size_t>(pad_stride - nb[0]))
    return E_OK


cdef inline int _hold(object obj, Py_buffer* view) except -1:
    """Acquire ``obj``'s buffer (writeable, C-contiguous, any item type: kernels write bytes)
    into ``view`` until :func:`_release`: while held, its memory cannot move or be freed, even by
    another thread while a kernel runs without the GIL (a ``bytearray`` cannot be resized)."""
    PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
    return 0


cdef inline void _release(Py_buffer* views, Py_ssize_t n) noexcept:
    """Release the ``n`` buffers :func:`_hold` acquired into ``views[0..n)``."""
    cdef Py_ssize_t j
    for j in range(n):
        PyBuffer_Release(&views[j])
