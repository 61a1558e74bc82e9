# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""PNG decoding of a batch of images into one output array, without the GIL and without a
Python call per image: the read path's fast path for ``png`` fields of fixed shape.

A PNG here is what the ``png`` codec writes: 8- or 16-bit grey, grey+alpha, RGB or RGBA, not
interlaced. The kernel reads the chunks (CRC-32 of each checked), inflates the concatenated
IDAT data with the zlib-ng inside ``libblosc2.a`` (``zng_uncompress2``: its Adler-32 checked)
and undoes the five PNG row filters straight into the image's slot of the output. Anything else
(another colour type or bit depth, a palette, ``tRNS``, interlacing, another size than the
field's, a damaged stream) is left undecoded with a status code: the caller decodes those
images with the reference decoder (imagecodecs), which also words the error of a corrupt one.
So this kernel only ever returns the bytes libpng returns, or nothing.
"""

from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from _common cimport _fits
from libblosc2 cimport zng_crc32, zng_uncompress2

#: status codes, one per image (0: decoded, or null and skipped)
PNG_OK = 0
PNG_UNSUPPORTED = 1  # a valid PNG of a kind this kernel leaves to the reference decoder
PNG_CORRUPT = 2      # the bytes are not a PNG of the expected size (the reference decoder words it)
PNG_NOMEM = 3        # a scratch buffer could not be allocated

cdef enum:
    S_OK = 0
    S_UNSUPPORTED = 1
    S_CORRUPT = 2
    S_NOMEM = 3

cdef const uint8_t* _SIG = b"\x89PNG\r\n\x1a\n"


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int _is(const uint8_t* t, const char* name) noexcept nogil:
    return (t[0] == <uint8_t>name[0] and t[1] == <uint8_t>name[1] and t[2] == <uint8_t>name[2]
            and t[3] == <uint8_t>name[3])


cdef inline int _paeth(int a, int b, int c) noexcept nogil:
    cdef int p = a + b - c
    cdef int pa = p - a if p >= a else a - p
    cdef int pb = p - b if p >= b else b - p
    cdef int pc = p - c if p >= c else c - p
    if pa <= pb and pa <= pc:
        return a
    if pb <= pc:
        return b
    return c


cdef int _unfilter(const uint8_t* raw, uint8_t* out, int64_t height, int64_t stride, int64_t bpp,
                   const uint8_t* zero) noexcept nogil:
    """Undo the row filters of ``height`` rows of ``1 + stride`` bytes (filter byte first) into
    ``height`` rows of ``stride`` bytes at ``out``; ``zero``: ``stride`` zero bytes (the row
    above the first). S_OK, or S_CORRUPT for a filter type above 4."""
    cdef int64_t r, i
    cdef const uint8_t* s
    cdef const uint8_t* up
    cdef uint8_t* d
    cdef uint8_t f
    for r in range(height):
        f = raw[r * (stride + 1)]
        s = raw + r * (stride + 1) + 1
        d = out + r * stride
        up = zero if r == 0 else d - stride
        if f == 0:
            memcpy(d, s, <size_t>stride)
        elif f == 1:
            for i in range(bpp):
                d[i] = s[i]
            for i in range(bpp, stride):
                d[i] = <uint8_t>(s[i] + d[i - bpp])
        elif f == 2:
            for i in range(stride):
                d[i] = <uint8_t>(s[i] + up[i])
        elif f == 3:
            for i in range(bpp):
                d[i] = <uint8_t>(s[i] + (up[i] >> 1))
            for i in range(bpp, stride):
                d[i] = <uint8_t>(s[i] + ((<int>d[i - bpp] + <int>up[i]) >> 1))
        elif f == 4:
            for i in range(bpp):
                d[i] = <uint8_t>(s[i] + up[i])  # paeth(0, up, 0) is up
            for i in range(bpp, stride):
                d[i] = <uint8_t>(s[i] + _paeth(d[i - bpp], up[i], up[i - bpp]))
        else:
            return S_CORRUPT
    return S_OK


cdef int _decode_one(const uint8_t* p, int64_t n, uint8_t* out, int64_t height, int64_t width,
                     int64_t channels, int64_t depth, uint8_t* zbuf, uint8_t* raw,
                     const uint8_t* zero) noexcept nogil:
    """One PNG of ``n`` bytes at ``p`` into ``out`` (``height * width * channels`` samples of
    ``depth`` bits, native byte order). ``zbuf`` holds at least ``n`` bytes (the IDAT data),
    ``raw`` ``height * (1 + stride)`` (the inflated rows). Returns a status code."""
    cdef int64_t pos = 8, zlen = 0, stride, bpp, i
    cdef uint32_t ln
    cdef const uint8_t* t
    cdef int ctype, seen_end = 0, seen_idat = 0, idat_done = 0
    cdef size_t dlen, slen
    cdef uint8_t tmp
    if n < 8 + 25 + 12:
        return S_CORRUPT
    for i in range(8):
        if p[i] != _SIG[i]:
            return S_CORRUPT
    # IHDR first: width, height, bit depth, colour type, compression, filter, interlace.
    if _be32(p + 8) != 13 or not _is(p + 12, b"IHDR") or _be32(p + 29) != zng_crc32(0, p + 12, 17):
        return S_CORRUPT
    t = p + 16
    ctype = t[9]
    if t[10] != 0 or t[11] != 0:
        return S_CORRUPT
    if t[12] != 0:
        return S_UNSUPPORTED  # Adam7 interlacing
    if <int64_t>_be32(t) != width or <int64_t>_be32(t + 4) != height or t[8] != depth:
        return S_UNSUPPORTED  # another size or depth: the reference decoder says what it is
    if not ((channels == 1 and ctype == 0) or (channels == 2 and ctype == 4)
            or (channels == 3 and ctype == 2) or (channels == 4 and ctype == 6)):
        return S_UNSUPPORTED
    pos = 33
    while pos + 12 <= n:
        ln = _be32(p + pos)
        t = p + pos + 4
        if ln > 0x7FFFFFFF or <int64_t>ln > n - pos - 12:
            return S_CORRUPT
        if _be32(p + pos + 8 + ln) != zng_crc32(0, t, ln + 4):
            return S_CORRUPT
        if _is(t, b"IDAT"):
            if idat_done:
                return S_CORRUPT  # the image data is one run of IDAT chunks
            seen_idat = 1
            memcpy(zbuf + zlen, t + 4, ln)  # zlen + ln <= n: each chunk lies inside the payload
            zlen += ln
        else:
            idat_done = seen_idat
            if _is(t, b"IEND"):
                seen_end = 1
                break
            if not (t[0] & 0x20) or _is(t, b"tRNS"):
                return S_UNSUPPORTED  # a critical chunk (PLTE) or transparency: libpng's business
        pos += 12 + ln
    if not seen_end or zlen == 0:
        return S_CORRUPT
    bpp = channels * (depth // 8)
    stride = width * bpp
    dlen = <size_t>(height * (stride + 1))
    slen = <size_t>zlen
    if zng_uncompress2(raw, &dlen, zbuf, &slen) != 0 or dlen != <size_t>(height * (stride + 1)):
        return S_CORRUPT
    if slen != <size_t>zlen:
        return S_CORRUPT  # bytes after the end of the zlib stream
    if _unfilter(raw, out, height, stride, bpp, zero) != S_OK:
        return S_CORRUPT
    if depth == 16:  # PNG samples are big-endian
        for i in range(0, height * stride, 2):
            tmp = out[i]
            out[i] = out[i + 1]
            out[i + 1] = tmp
    return S_OK


def png_decode_batch(const uint8_t[::1] data not None, const int64_t[::1] offsets not None,
                     const uint8_t[::1] nulls,
                     uint8_t[::1] out not None, int64_t height, int64_t width, int64_t channels,
                     int64_t depth, Py_ssize_t lo, Py_ssize_t hi, uint8_t[::1] status not None):
    """Decode images ``lo..hi`` of a batch: image i is ``data[offsets[i]:offsets[i + 1]]``
    and goes to ``out[i * value_bytes:]`` (``value_bytes = height * width * channels * depth /
    8``; ``out`` holds the whole batch). Null images (``nulls[i]`` nonzero; ``nulls`` the null
    flags as uint8, or None) are skipped. ``status[i]`` receives a code per image (``PNG_OK``
    ...); an image not decoded leaves its slot unspecified. Returns the number of images not decoded."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i
    cdef int64_t value_bytes, stride, rawsize, biggest = 0, a, b
    cdef int64_t data_len = data.shape[0]
    cdef const uint8_t* nul = NULL
    cdef uint8_t* zbuf = NULL
    cdef uint8_t* raw = NULL
    cdef uint8_t* zero = NULL
    cdef int s
    cdef Py_ssize_t failed = 0
    if depth != 8 and depth != 16:
        raise ValueError("png_decode_batch: depth must be 8 or 16")
    if channels < 1 or channels > 4 or height < 1 or width < 1 or height > 0x7FFFFFFF or width > 0x7FFFFFFF:
        raise ValueError("png_decode_batch: bad image geometry")
    if n < 0 or lo < 0 or hi < lo or hi > n or status.shape[0] < n:
        raise ValueError("png_decode_batch: bad range or status array")
    stride = width * channels * (depth // 8)
    if not _fits(height, stride, (<int64_t>1) << 40):
        raise ValueError("png_decode_batch: image too large")
    value_bytes = height * stride
    rawsize = height * (stride + 1)
    if not _fits(n, value_bytes, out.shape[0]):
        raise ValueError("png_decode_batch: out holds fewer bytes than the batch's images")
    if nulls is not None:
        if nulls.shape[0] < n:
            raise ValueError("png_decode_batch: nulls shorter than the batch")
        nul = &nulls[0] if n else NULL
    if hi == lo:
        return 0
    with nogil:
        for i in range(lo, hi):
            a, b = offsets[i], offsets[i + 1]
            if a < 0 or b < a or b > data_len:
                biggest = -1
                break
            if b - a > biggest:
                biggest = b - a
    if biggest < 0:
        raise ValueError("png_decode_batch: offsets outside the data")
    with nogil:
        zbuf = <uint8_t*>malloc(<size_t>(biggest + 1))
        raw = <uint8_t*>malloc(<size_t>rawsize)
        zero = <uint8_t*>malloc(<size_t>stride)
        if zbuf == NULL or raw == NULL or zero == NULL:
            for i in range(lo, hi):
                status[i] = S_NOMEM
            failed = hi - lo
        else:
            memset(zero, 0, <size_t>stride)
            for i in range(lo, hi):
                if nul != NULL and nul[i]:
                    status[i] = S_OK
                    continue
                a, b = offsets[i], offsets[i + 1]
                s = _decode_one(&data[0] + a if data_len else NULL, b - a, &out[0] + i * value_bytes, height,
                                width, channels, depth, zbuf, raw, zero)
                status[i] = <uint8_t>s
                if s != S_OK:
                    failed += 1
        free(zbuf)
        free(raw)
        free(zero)
    return failed
