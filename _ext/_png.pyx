# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""PNG decoding of a batch of images into one output array, without the GIL and without a
Python call per image: the read path's fast path for ``png`` fields of fixed shape.

A PNG here is any non-interlaced PNG: grey (1-16 bits), grey+alpha, RGB, RGBA, palette (1-8
bits), with or without ``tRNS``. The kernel reads the chunks (CRC-32 of each checked),
inflates the concatenated IDAT data with the zlib-ng inside ``libblosc2.a``
(``zng_uncompress2``: its Adler-32 checked) and undoes the five PNG row filters: straight
into the image's slot of the output where the image has the output's channels and depth,
else in place, then each row converted to the output's channels as PIL's ``convert("L")`` /
``convert("RGB")`` does (palette looked up, alpha and ``tRNS`` dropped, grey repeated, RGB
to PIL's luma; a 16-bit image to 8-bit samples by its high bytes, under the png codec's
``depth="scale"`` rule). Anything else (interlacing, an alpha channel wanted from ``tRNS``,
another size than the field's, a damaged stream: a bad CRC, a zlib stream that does not
inflate to exactly the image, a palette index past the palette) is left undecoded with a
status code: the caller decodes those images with the reference decoder (imagecodecs, then
the same conversion in NumPy), which also words the error of a corrupt one.
"""

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t
from libc.stdlib cimport free, malloc, realloc
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


cdef struct _Bufs:
    uint8_t* zbuf   # the IDAT data, at least the payload's bytes
    uint8_t* raw    # the inflated rows
    size_t raw_cap
    uint8_t* zero   # a row of zeros (the row above the first)
    size_t zero_cap


cdef int _grow(uint8_t** buf, size_t* cap, size_t need, int zeroed) noexcept nogil:
    """``*buf`` of at least ``need`` bytes (zeroed with ``zeroed``): S_OK or S_NOMEM."""
    cdef uint8_t* b
    if need > cap[0]:
        b = <uint8_t*>realloc(buf[0], need)
        if b == NULL:
            return S_NOMEM
        buf[0] = b
        cap[0] = need
    if zeroed:
        memset(buf[0], 0, need)
    return S_OK


cdef inline int _sample(const uint8_t* row, int64_t i, int64_t sdepth) noexcept nogil:
    """Sample ``i`` of a row of ``sdepth``-bit samples (1, 2, 4, 8; 16: its high byte)."""
    if sdepth == 8:
        return row[i]
    if sdepth == 16:
        return row[2 * i]
    return (row[(i * sdepth) >> 3] >> (8 - sdepth - ((i * sdepth) & 7))) & ((1 << sdepth) - 1)


cdef inline int64_t _luma(int64_t r, int64_t g, int64_t b) noexcept nogil:
    """PIL's L of an RGB pixel (Convert.c: ``L24(rgb) >> 16``); 16-bit samples alike."""
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16


cdef void _convert_row(const uint8_t* src, uint8_t* dst, int64_t width, int ctype,
                       int64_t sdepth, int64_t channels, int64_t depth,
                       const uint8_t* pal) noexcept nogil:
    """One unfiltered row of ``width`` pixels of colour type ``ctype`` and ``sdepth``-bit
    samples into ``channels`` samples of ``depth`` bits (native order) a pixel, as PIL's
    ``convert``: low-depth grey scaled to 8 bits, a palette looked up (``pal``: 256 RGB
    entries), alpha dropped, grey repeated for RGB, RGB to grey by PIL's luma; 16-bit samples
    kept for ``depth`` 16, their high byte for 8."""
    cdef int64_t x, sc, k, r, g, b, v
    cdef int scale = 1
    cdef uint16_t* d16 = <uint16_t*>dst
    sc = 1 if ctype == 0 or ctype == 3 else 2 if ctype == 4 else 3 if ctype == 2 else 4
    if ctype == 0 and sdepth < 8:
        scale = 255 // ((1 << sdepth) - 1)
    for x in range(width):
        if depth == 16:  # 16-bit samples to 16-bit samples: grey or colour, no palette
            r = (<int64_t>src[2 * x * sc] << 8) | src[2 * x * sc + 1]
            if sc >= 3:
                g = (<int64_t>src[2 * x * sc + 2] << 8) | src[2 * x * sc + 3]
                b = (<int64_t>src[2 * x * sc + 4] << 8) | src[2 * x * sc + 5]
            else:
                g = r
                b = r
            if channels == 1:
                d16[x] = <uint16_t>(r if sc < 3 else _luma(r, g, b))
            elif channels == 3:
                d16[3 * x] = <uint16_t>r
                d16[3 * x + 1] = <uint16_t>g
                d16[3 * x + 2] = <uint16_t>b
            else:  # as many channels as the image
                for k in range(sc):
                    d16[x * sc + k] = <uint16_t>(
                        (<int>src[2 * (x * sc + k)] << 8) | src[2 * (x * sc + k) + 1])
            continue
        if ctype == 3:
            v = _sample(src, x, sdepth)
            r = pal[3 * v]
            g = pal[3 * v + 1]
            b = pal[3 * v + 2]
        elif sc >= 3:
            r = _sample(src, x * sc, sdepth)
            g = _sample(src, x * sc + 1, sdepth)
            b = _sample(src, x * sc + 2, sdepth)
        else:
            r = _sample(src, x * sc, sdepth) * scale
            g = r
            b = r
        if channels == 1:
            dst[x] = <uint8_t>(r if (sc < 3 and ctype != 3) else _luma(r, g, b))
        elif channels == 3:
            dst[3 * x] = <uint8_t>r
            dst[3 * x + 1] = <uint8_t>g
            dst[3 * x + 2] = <uint8_t>b
        else:  # as many channels as the image (grey+alpha, RGBA)
            for k in range(sc):
                dst[x * sc + k] = <uint8_t>_sample(src, x * sc + k, sdepth)


cdef int _decode_one(const uint8_t* p, int64_t n, uint8_t* out, int64_t height, int64_t width,
                     int64_t channels, int64_t depth, int scale16, _Bufs* bufs) noexcept nogil:
    """One PNG of ``n`` bytes at ``p`` into ``out`` (``height * width * channels`` samples of
    ``depth`` bits, native byte order), converted from any colour type and bit depth as PIL's
    ``convert`` (:func:`_convert_row`); a 16-bit image into 8-bit samples only with
    ``scale16``. ``bufs``: scratch, grown as needed. Returns a status code."""
    cdef int64_t pos = 8, zlen = 0, stride, bpp, i, r, sdepth, sc, sstride, npal = 0
    cdef uint32_t ln
    cdef const uint8_t* t
    cdef int ctype, seen_end = 0, seen_idat = 0, idat_done = 0, direct
    cdef size_t dlen, slen, rawsize
    cdef uint8_t tmp
    cdef uint8_t pal[768]
    cdef uint8_t* row
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
    sdepth = t[8]
    if t[10] != 0 or t[11] != 0:
        return S_CORRUPT
    if not ((ctype == 0 and (sdepth == 1 or sdepth == 2 or sdepth == 4 or sdepth == 8
                             or sdepth == 16))
            or (ctype == 3 and (sdepth == 1 or sdepth == 2 or sdepth == 4 or sdepth == 8))
            or ((ctype == 2 or ctype == 4 or ctype == 6) and (sdepth == 8 or sdepth == 16))):
        return S_CORRUPT
    if t[12] != 0:
        return S_UNSUPPORTED  # Adam7 interlacing: the reference decoder's
    if <int64_t>_be32(t) != width or <int64_t>_be32(t + 4) != height:
        return S_UNSUPPORTED  # another size: the reference decoder says what it is
    sc = 1 if ctype == 0 or ctype == 3 else 2 if ctype == 4 else 3 if ctype == 2 else 4
    if (sdepth == 16) != (depth == 16) and not (sdepth == 16 and scale16):
        return S_UNSUPPORTED  # another sample size, without a rule
    if channels != 1 and channels != 3 and (channels != sc or ctype == 3):
        return S_UNSUPPORTED  # grey+alpha or RGBA from another colour type
    if depth == 16 and ctype == 3:
        return S_UNSUPPORTED
    memset(pal, 0, 768)
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
            memcpy(bufs.zbuf + zlen, t + 4, ln)  # zlen + ln <= n: each chunk lies in the payload
            zlen += ln
        else:
            idat_done = seen_idat
            if _is(t, b"IEND"):
                seen_end = 1
                break
            if _is(t, b"PLTE"):
                if seen_idat or npal or ln == 0 or ln > 768 or ln % 3:
                    return S_CORRUPT
                memcpy(pal, t + 4, ln)
                npal = ln // 3
            elif _is(t, b"tRNS"):
                if channels == 2 or channels == 4:
                    return S_UNSUPPORTED  # an alpha channel from tRNS: libpng's business
            elif not (t[0] & 0x20):
                return S_UNSUPPORTED  # an unknown critical chunk
        pos += 12 + ln
    if not seen_end or zlen == 0 or (ctype == 3 and npal == 0):
        return S_CORRUPT
    bpp = (sc * sdepth + 7) // 8
    sstride = (width * sc * sdepth + 7) // 8
    stride = width * channels * (depth // 8)
    rawsize = <size_t>(height * (sstride + 1))
    if _grow(&bufs.raw, &bufs.raw_cap, rawsize, 0) != S_OK:
        return S_NOMEM
    if _grow(&bufs.zero, &bufs.zero_cap, <size_t>sstride, 1) != S_OK:
        return S_NOMEM
    dlen = rawsize
    slen = <size_t>zlen
    if zng_uncompress2(bufs.raw, &dlen, bufs.zbuf, &slen) != 0 or dlen != rawsize:
        return S_CORRUPT
    if slen != <size_t>zlen:
        return S_CORRUPT  # bytes after the end of the zlib stream
    direct = ctype != 3 and sc == channels and sdepth == depth
    if direct:  # the image's own samples: unfiltered straight into out
        if _unfilter(bufs.raw, out, height, stride, bpp, bufs.zero) != S_OK:
            return S_CORRUPT
        if depth == 16:  # PNG samples are big-endian
            for i in range(0, height * stride, 2):
                tmp = out[i]
                out[i] = out[i + 1]
                out[i + 1] = tmp
        return S_OK
    if _unfilter_inplace(bufs.raw, height, sstride, bpp, bufs.zero) != S_OK:
        return S_CORRUPT
    if ctype == 3 and npal < (1 << sdepth):  # an index past the palette: damaged
        for r in range(height):
            row = bufs.raw + r * (sstride + 1) + 1
            for i in range(width):
                if _sample(row, i, sdepth) >= npal:
                    return S_CORRUPT
    for r in range(height):
        _convert_row(bufs.raw + r * (sstride + 1) + 1, out + r * stride, width, ctype, sdepth,
                     channels, depth, pal)
    return S_OK


cdef int _unfilter_inplace(uint8_t* raw, int64_t height, int64_t stride, int64_t bpp,
                           const uint8_t* zero) noexcept nogil:
    """Undo the row filters of ``height`` rows of ``1 + stride`` bytes (filter byte first) in
    place: each row's bytes become the image's; ``zero``: ``stride`` zero bytes. S_OK, or
    S_CORRUPT for a filter type above 4."""
    cdef int64_t r, i
    cdef uint8_t* d
    cdef const uint8_t* up
    cdef uint8_t f
    for r in range(height):
        f = raw[r * (stride + 1)]
        d = raw + r * (stride + 1) + 1
        up = zero if r == 0 else d - (stride + 1)
        if f == 0:
            pass
        elif f == 1:
            for i in range(bpp, stride):
                d[i] = <uint8_t>(d[i] + d[i - bpp])
        elif f == 2:
            for i in range(stride):
                d[i] = <uint8_t>(d[i] + up[i])
        elif f == 3:
            for i in range(bpp if bpp < stride else stride):
                d[i] = <uint8_t>(d[i] + (up[i] >> 1))
            for i in range(bpp, stride):
                d[i] = <uint8_t>(d[i] + ((<int>d[i - bpp] + <int>up[i]) >> 1))
        elif f == 4:
            for i in range(bpp if bpp < stride else stride):
                d[i] = <uint8_t>(d[i] + up[i])  # paeth(0, up, 0) is up
            for i in range(bpp, stride):
                d[i] = <uint8_t>(d[i] + _paeth(d[i - bpp], up[i], up[i - bpp]))
        else:
            return S_CORRUPT
    return S_OK


def png_decode_batch(const uint8_t[::1] data not None, const int64_t[::1] offsets not None,
                     const uint8_t[::1] nulls,
                     uint8_t[::1] out not None, int64_t height, int64_t width, int64_t channels,
                     int64_t depth, Py_ssize_t lo, Py_ssize_t hi, uint8_t[::1] status not None,
                     bint scale16=False):
    """Decode images ``lo..hi`` of a batch: image i is ``data[offsets[i]:offsets[i + 1]]``
    and goes to ``out[i * value_bytes:]`` (``value_bytes = height * width * channels * depth /
    8``; ``out`` holds the whole batch), converted from its own colour type and bit depth as
    PIL's ``convert`` does (any image to 1 or 3 channels; a 16-bit image to 8-bit samples, its
    high bytes, only with ``scale16``). Null images (``nulls[i]`` nonzero; ``nulls`` the null
    flags as uint8, or None) are skipped. ``status[i]`` receives a code per image (``PNG_OK``
    ...); an image not decoded leaves its slot unspecified. Returns the number of images not
    decoded."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i
    cdef int64_t value_bytes, stride, biggest = 0, a, b
    cdef int64_t data_len = data.shape[0]
    cdef const uint8_t* nul = NULL
    cdef _Bufs bufs
    cdef int s
    cdef Py_ssize_t failed = 0
    if depth != 8 and depth != 16:
        raise ValueError("png_decode_batch: depth must be 8 or 16")
    if channels < 1 or channels > 4 or height < 1 or width < 1 or height > 0x7FFFFFFF or width > 0x7FFFFFFF:
        raise ValueError("png_decode_batch: bad image geometry")
    if n < 0 or lo < 0 or hi < lo or hi > n or status.shape[0] < n:
        raise ValueError("png_decode_batch: bad range or status array")
    # the largest row of any PNG of this size (RGBA, 16-bit: 8 bytes a pixel) must fit too
    if not _fits(height, width * 8 + 1, (<int64_t>1) << 40):
        raise ValueError("png_decode_batch: image too large")
    stride = width * channels * (depth // 8)
    value_bytes = height * stride
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
    memset(&bufs, 0, sizeof(bufs))
    with nogil:
        bufs.zbuf = <uint8_t*>malloc(<size_t>(biggest + 1))
        if bufs.zbuf == NULL:
            for i in range(lo, hi):
                status[i] = S_NOMEM
            failed = hi - lo
        else:
            for i in range(lo, hi):
                if nul != NULL and nul[i]:
                    status[i] = S_OK
                    continue
                a, b = offsets[i], offsets[i + 1]
                s = _decode_one(&data[0] + a if data_len else NULL, b - a,
                                &out[0] + i * value_bytes, height, width, channels, depth,
                                scale16, &bufs)
                status[i] = <uint8_t>s
                if s != S_OK:
                    failed += 1
        free(bufs.zbuf)
        free(bufs.raw)
        free(bufs.zero)
    return failed
